//! `torchport run` and `torchport ops` on TorchScript archives (`torch.jit.save`), through the
//! real binary, on the fixtures of tests/fixtures/gen/gen_torchscript.py.

use torchport_runtime::candle_core::{DType, Tensor};
use torchport_runtime::npy::read_npy;

use crate::util::{root, run_model, torchport};

const TS: &str = "tests/fixtures/torchscript";

/// The largest absolute difference of two float32 tensors of one shape.
fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    let d = (a - b).unwrap().abs().unwrap().max_all().unwrap();
    d.to_scalar::<f32>().unwrap()
}

/// The scripted LSTM tagger: float logits within tolerance, its int64 argmax exactly.
#[test]
fn run_torchscript_matches_torch() {
    let arrays = run_model(
        &format!("{TS}/scripted_lstm.pt"),
        &[format!("{TS}/scripted_lstm.input_0.npy")],
    );
    let names: Vec<&str> = arrays.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["output_0", "output_1"]);
    let want0 = read_npy(&root().join(format!("{TS}/scripted_lstm.output_0.npy"))).unwrap();
    assert!(max_diff(&arrays[0].1, &want0) < 1e-4);
    let want1 = read_npy(&root().join(format!("{TS}/scripted_lstm.output_1.npy"))).unwrap();
    assert_eq!(arrays[1].1.dtype(), DType::I64);
    assert_eq!(
        arrays[1].1.flatten_all().unwrap().to_vec1::<i64>().unwrap(),
        want1.flatten_all().unwrap().to_vec1::<i64>().unwrap()
    );
}

#[test]
fn ops_lists_the_operators_of_torchscript_code() {
    let o = torchport(&["ops", &format!("{TS}/scripted_lstm.pt"), "--json"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let ops = v["ops"].as_array().unwrap();
    let lstm = ops.iter().find(|o| o["op"] == "aten::lstm").unwrap();
    assert_eq!(lstm["supported"], true);
    assert!(ops.iter().any(|o| o["op"] == "prim::RaiseException"));
    assert_eq!(v["unsupported"].as_array().unwrap().len(), 0);
}

#[test]
fn run_torchscript_with_too_few_inputs_is_one_error() {
    let o = torchport(&[
        "run",
        &format!("{TS}/hf_bert.pt"),
        "--input",
        &format!("{TS}/hf_bert.input_0.npy"),
        "--output",
        "/nonexistent/out.npz",
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("takes 2 input(s) but 1 were given"), "{err}");
}

/// `--runs 3` on traced GPT-2: the last run's outputs (by the graph recorded from the first)
/// match torch's, and stderr gives the runs' times and says a graph ran them; `--runs 0` is
/// refused.
#[test]
fn run_torchscript_several_runs_by_the_recorded_graph() {
    let dir = std::env::temp_dir().join(format!("torchport-runs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("out.npz");
    let args = |runs: &str| {
        vec![
            "run".to_string(),
            format!("{TS}/hf_gpt2.pt"),
            "--input".into(),
            format!("{TS}/hf_gpt2.input_0.npy"),
            "--output".into(),
            out.to_str().unwrap().to_string(),
            "--runs".into(),
            runs.into(),
        ]
    };
    let o = torchport(&args("3"));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("3 runs: the first"), "{stderr}");
    assert!(
        stderr.contains("runs after the first: a recorded graph of"),
        "{stderr}"
    );
    let got = torchport_runtime::npy::read_arrays(&out).unwrap();
    let want = read_npy(&root().join(format!("{TS}/hf_gpt2.output_0.npy"))).unwrap();
    assert!(max_diff(&got[0].1, &want) < 1e-4);
    let o = torchport(&args("0"));
    assert_eq!(o.status.code(), Some(2));
    std::fs::remove_dir_all(&dir).ok();
}

/// torchvision's Faster R-CNN, scripted, takes a list of images: an `.npz` input is that list
/// (its arrays in order). Its six outputs (boxes, labels, scores for each image) match
/// torch's; `ops` lists torchvision's operators as supported.
#[test]
fn run_torchscript_on_a_list_of_images() {
    let arrays = run_model(
        &format!("{TS}/tv_fasterrcnn.pt"),
        &[format!("{TS}/tv_fasterrcnn.input_0.npz")],
    );
    assert_eq!(arrays.len(), 6);
    for (i, (name, got)) in arrays.iter().enumerate() {
        let want = read_npy(&root().join(format!("{TS}/tv_fasterrcnn.output_{i}.npy"))).unwrap();
        assert_eq!(got.dims(), want.dims(), "{name}");
        match want.dtype() {
            DType::I64 => assert_eq!(
                got.flatten_all().unwrap().to_vec1::<i64>().unwrap(),
                want.flatten_all().unwrap().to_vec1::<i64>().unwrap(),
                "{name}"
            ),
            // Boxes in pixels of images up to 128 wide, scores in [0, 1].
            _ => assert!(max_diff(got, &want) < 1e-2, "{name}"),
        }
    }
    let o = torchport(&["ops", &format!("{TS}/tv_fasterrcnn.pt"), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let ops = v["ops"].as_array().unwrap();
    for op in ["torchvision::nms", "torchvision::roi_align"] {
        let found = ops.iter().find(|o| o["op"] == op);
        assert_eq!(found.map(|o| &o["supported"]), Some(&true.into()), "{op}");
    }
}
