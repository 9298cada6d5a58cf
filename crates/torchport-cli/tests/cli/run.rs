//! `torchport run` and `torchport ops` through the real binary, on the export fixtures.

use crate::util::{root, run_model, torchport};
use torchport_runtime::npy::read_npy;

const EXPORT: &str = "tests/fixtures/export";

#[test]
fn run_writes_outputs_that_match_torch() {
    let arrays = run_model(
        &format!("{EXPORT}/bert.decomp.pt2"),
        &[
            format!("{EXPORT}/bert.input_0.npy"),
            format!("{EXPORT}/bert.input_1.npy"),
        ],
    );
    let names: Vec<&str> = arrays.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["output_0", "output_1"]);
    for (i, (_, got)) in arrays.iter().enumerate() {
        let want = read_npy(&root().join(format!("{EXPORT}/bert.output_{i}.npy"))).unwrap();
        assert_eq!(got.dims(), want.dims());
        let diff = (got - &want).unwrap().abs().unwrap().max_all().unwrap();
        assert!(diff.to_scalar::<f32>().unwrap() < 1e-4, "output_{i}");
    }
}

#[test]
fn run_with_a_missing_input_is_one_error_line() {
    let o = torchport(&[
        "run",
        &format!("{EXPORT}/bert.plain.pt2"),
        "--input",
        &format!("{EXPORT}/bert.input_0.npy"),
        "--output",
        "/nonexistent/out.npz",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.starts_with("error: running tests/fixtures/export/bert.plain.pt2: "),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("the program takes 2 input(s) but 1 were given"),
        "{err}"
    );
}

#[test]
fn ops_lists_every_op_and_support() {
    let o = torchport(&["ops", &format!("{EXPORT}/resnet.decomp.pt2")]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let text = String::from_utf8_lossy(&o.stdout);
    let conv = text
        .lines()
        .find(|l| l.starts_with("aten.convolution.default"))
        .unwrap();
    let cols: Vec<&str> = conv.split_whitespace().collect();
    assert_eq!(cols, ["aten.convolution.default", "14", "yes"]);
    assert!(text.trim_end().ends_with("all supported"), "{text}");
}

#[test]
fn ops_exits_1_on_unsupported() {
    let o = torchport(&["ops", &format!("{EXPORT}/bad_unknown_op.pt2"), "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["unsupported"],
        serde_json::json!(["aten.frobnicate.default"])
    );
    let op = v["ops"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["op"] == "aten.frobnicate.default")
        .unwrap();
    assert_eq!(op["supported"], false);
    assert_eq!(op["count"], 1);
}

#[test]
fn run_refuses_a_program_with_unsupported_ops() {
    let o = torchport(&[
        "run",
        &format!("{EXPORT}/bad_unknown_op.pt2"),
        "--input",
        &format!("{EXPORT}/tiny.input_0.npy"),
        "--output",
        "/tmp/never.npz",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("aten.frobnicate.default (see `torchport ops`)"),
        "{err}"
    );
}
