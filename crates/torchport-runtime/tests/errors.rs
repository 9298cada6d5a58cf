//! Bad programs and bad inputs: one clear error each (fixtures from gen_export.py).

use std::collections::HashMap;
use std::path::PathBuf;

use torchport_runtime::candle_core::{DType, Device, Tensor};
use torchport_runtime::npy::read_npy;
use torchport_runtime::schema::parse_program;
use torchport_runtime::{Error, Program};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/export")
        .join(name)
}

fn tiny() -> Program {
    Program::load(fixture("tiny.plain.pt2")).unwrap()
}

#[test]
fn tiny_program_matches_torch() {
    let x = read_npy(&fixture("tiny.input_0.npy")).unwrap();
    let want = read_npy(&fixture("tiny.output_0.npy")).unwrap();
    let got = tiny().run(&[x]).unwrap();
    let diff = (&got[0] - &want).unwrap().abs().unwrap().max_all().unwrap();
    assert!(diff.to_scalar::<f32>().unwrap() <= 1e-6);
}

#[test]
fn unknown_op_is_listed_before_running() {
    let p = Program::load(fixture("bad_unknown_op.pt2")).unwrap();
    assert_eq!(p.unsupported_ops(), ["aten.frobnicate.default"]);
    let ops = p.ops();
    assert!(ops
        .iter()
        .any(|o| o.op == "aten.frobnicate.default" && !o.supported && o.count == 1));
    // The Linear, as run: rewritten to read its weight packed where the CPU has the gemm's
    // microkernels.
    assert!(ops.iter().any(|o| (o.op == "aten.linear.default"
        || o.op == "torchport.linear_packed.default")
        && o.supported));
    let x = Tensor::zeros((2, 4), DType::F32, &Device::Cpu).unwrap();
    let err = p.run(&[x]).unwrap_err();
    assert!(matches!(err, Error::UnsupportedOps(_)));
    assert_eq!(
        err.to_string(),
        "the program uses 1 unsupported operator(s): aten.frobnicate.default"
    );
}

#[test]
fn every_unsupported_op_is_reported_at_once() {
    // Rename both nodes of the tiny program to unknown ops: both are listed, sorted.
    let json = program_json(&fixture("tiny.plain.pt2"));
    let text = String::from_utf8(json)
        .unwrap()
        .replace(
            "torch.ops.aten.linear.default",
            "torch.ops.aten.zzz_two.default",
        )
        .replace(
            "torch.ops.aten.relu.default",
            "torch.ops.aten.aaa_one.default",
        );
    let ep = parse_program(text.as_bytes()).unwrap();
    let mut w = HashMap::new();
    w.insert(
        "0.weight".to_string(),
        Tensor::ones((3, 4), DType::F32, &Device::Cpu).unwrap(),
    );
    w.insert(
        "0.bias".to_string(),
        Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap(),
    );
    let p = Program::from_parts(ep, w).unwrap();
    assert_eq!(
        p.unsupported_ops(),
        ["aten.aaa_one.default", "aten.zzz_two.default"]
    );
}

#[test]
fn weights_built_in_memory_run() {
    // The same graph with weights we choose: relu(x @ w.T + b) computed by hand.
    let json = program_json(&fixture("tiny.plain.pt2"));
    let ep = parse_program(&json).unwrap();
    let dev = Device::Cpu;
    let mut w = HashMap::new();
    w.insert(
        "0.weight".to_string(),
        Tensor::new(
            &[[1f32, 0., 0., 0.], [0., -1., 0., 0.], [1., 1., 1., 1.]],
            &dev,
        )
        .unwrap(),
    );
    w.insert(
        "0.bias".to_string(),
        Tensor::new(&[0f32, 0., -10.], &dev).unwrap(),
    );
    let p = Program::from_parts(ep, w).unwrap();
    let x = Tensor::new(&[[1f32, 2., 3., 4.], [-1., -2., -3., -4.]], &dev).unwrap();
    let y = p.run(&[x]).unwrap()[0].to_vec2::<f32>().unwrap();
    assert_eq!(y, vec![vec![1., 0., 0.], vec![0., 2., 0.]]);
}

#[test]
fn missing_weight_is_named() {
    let json = program_json(&fixture("tiny.plain.pt2"));
    let ep = parse_program(&json).unwrap();
    let err = Program::from_parts(ep, HashMap::new()).err().unwrap();
    assert_eq!(
        err.to_string(),
        "weight '0.weight': the program needs it but the archive does not hold it"
    );
}

#[test]
fn unknown_schema_version_is_refused() {
    let err = Program::load(fixture("bad_version.pt2")).err().unwrap();
    assert!(matches!(err, Error::Schema { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("schema version 99.0 is not supported (this runtime reads 8.x"),
        "{msg}"
    );
    assert!(msg.contains("bad_version.pt2"), "{msg}");
}

#[test]
fn corrupt_json_is_refused() {
    // The load opens the archive leaving the program unparsed (torchport's reader checks the
    // records it reads) and parses it itself, naming the file and the record.
    let err = Program::load(fixture("bad_json.pt2")).err().unwrap();
    let msg = err.to_string();
    assert!(matches!(err, Error::Schema { .. }), "{msg}");
    assert!(msg.contains("bad_json.pt2: "), "{msg}");
    assert!(
        msg.contains("models/model.json is not a valid exported program: EOF while parsing"),
        "{msg}"
    );
}

#[test]
fn not_an_archive_is_refused() {
    let err = Program::load(fixture("tiny.input_0.npy")).err().unwrap();
    assert!(matches!(err, Error::Archive { .. }), "{err}");
}

#[test]
fn wrong_input_count() {
    let err = tiny().run(&[]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the program takes 1 input(s) but 0 were given"
    );
}

#[test]
fn wrong_input_shape() {
    let x = Tensor::zeros((2, 5), DType::F32, &Device::Cpu).unwrap();
    let err = tiny().run(&[x]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "input 0: 'input' should have shape [2, 4], got [2, 5] (dim 1 differs)"
    );
    let x = Tensor::zeros(8, DType::F32, &Device::Cpu).unwrap();
    let err = tiny().run(&[x]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "input 0: 'input' should have 2 dims ([2, 4]), got shape [8]"
    );
}

#[test]
fn wrong_input_dtype() {
    let x = Tensor::zeros((2, 4), DType::I64, &Device::Cpu).unwrap();
    let err = tiny().run(&[x]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "input 0: 'input' should be float32, got a I64 tensor"
    );
}

#[test]
fn f16_input_is_accepted_for_a_float32_program() {
    let x = read_npy(&fixture("tiny.input_0.npy")).unwrap();
    let y32 = tiny().run(std::slice::from_ref(&x)).unwrap();
    let y16 = tiny().run(&[x.to_dtype(DType::F16).unwrap()]).unwrap();
    let diff = (&y32[0] - &y16[0])
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap();
    assert!(diff.to_scalar::<f32>().unwrap() < 1e-2);
}

/// The program record's JSON, as torchport's reader hands it out.
fn program_json(path: &std::path::Path) -> Vec<u8> {
    let ckpt = torchport::open(path).unwrap();
    let (record, json) = ckpt.programs().next().unwrap();
    assert!(record.ends_with("models/model.json"), "{record}");
    json.to_vec()
}

/// The tiny program (linear → relu) with its relu node's target and inputs replaced, built
/// with unit weights: a crafted program for one op.
fn tiny_with_second_node(target: &str, inputs: &str) -> torchport_runtime::Result<Program> {
    let json = String::from_utf8(program_json(&fixture("tiny.plain.pt2"))).unwrap();
    let relu_inputs = r#"[{"arg": {"as_tensor": {"name": "linear"}}, "kind": 1, "name": "self"}]"#;
    assert!(
        json.contains(relu_inputs),
        "the tiny fixture's relu node changed"
    );
    let text = json
        .replace(relu_inputs, inputs)
        .replace("torch.ops.aten.relu.default", target);
    let ep = parse_program(text.as_bytes()).unwrap();
    let mut w = HashMap::new();
    w.insert(
        "0.weight".to_string(),
        Tensor::ones((3, 4), DType::F32, &Device::Cpu).unwrap(),
    );
    w.insert(
        "0.bias".to_string(),
        Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap(),
    );
    Program::from_parts(ep, w)
}

fn run_tiny_with(target: &str, inputs: &str) -> String {
    let p = tiny_with_second_node(target, inputs).unwrap();
    assert!(p.unsupported_ops().is_empty(), "{:?}", p.unsupported_ops());
    let x = Tensor::ones((2, 4), DType::F32, &Device::Cpu).unwrap();
    let err = p.run(&[x]).unwrap_err();
    assert!(matches!(err, Error::Op { .. }), "{err}");
    err.to_string()
}

#[test]
fn training_mode_dropout_is_refused() {
    let t = |train: bool| {
        format!(
            r#"[{{"arg": {{"as_tensor": {{"name": "linear"}}}}, "kind": 1, "name": "input"}}, {{"arg": {{"as_float": 0.5}}, "kind": 1, "name": "p"}}, {{"arg": {{"as_bool": {train}}}, "kind": 1, "name": "train"}}]"#
        )
    };
    let err = run_tiny_with("torch.ops.aten.dropout.default", &t(true));
    assert!(err.contains("dropout with train=True (p = 0.5)"), "{err}");
    // In eval mode it is the identity: linear of ones with unit weights is 4.
    let p = tiny_with_second_node("torch.ops.aten.dropout.default", &t(false)).unwrap();
    let x = Tensor::ones((2, 4), DType::F32, &Device::Cpu).unwrap();
    let y = p.run(&[x]).unwrap()[0].to_vec2::<f32>().unwrap();
    assert_eq!(y, vec![vec![4f32; 3]; 2]);
}

#[test]
fn crafted_programs_fail_cleanly_instead_of_panicking() {
    // Attention on a rank-1 value.
    let sel = r#"[{"arg": {"as_tensor": {"name": "linear"}}, "kind": 1, "name": "query"}, {"arg": {"as_tensor": {"name": "p_0_bias"}}, "kind": 1, "name": "key"}, {"arg": {"as_tensor": {"name": "p_0_bias"}}, "kind": 1, "name": "value"}]"#;
    let err = run_tiny_with("torch.ops.aten.scaled_dot_product_attention.default", sel);
    assert!(err.contains("rank at least 2"), "{err}");
    // topk with k larger than the dim.
    let topk = r#"[{"arg": {"as_tensor": {"name": "linear"}}, "kind": 1, "name": "self"}, {"arg": {"as_int": 7}, "kind": 1, "name": "k"}]"#;
    let err = run_tiny_with("torch.ops.aten.topk.default", topk);
    assert!(
        err.contains("k (7) is larger than the dim's size (3)"),
        "{err}"
    );
}

#[test]
fn crafted_arguments_of_reductions_and_activations_are_refused() {
    let arg =
        |name: &str, value: &str| format!(r#"{{"arg": {value}, "kind": 1, "name": "{name}"}}"#);
    let x = arg("self", r#"{"as_tensor": {"name": "linear"}}"#);
    let with = |extra: &[String]| {
        let mut v = vec![x.clone()];
        v.extend(extra.iter().cloned());
        format!("[{}]", v.join(", "))
    };
    // kthvalue with k outside 1..=3 (the linear layer's 3 outputs).
    for k in [0, 4] {
        let err = run_tiny_with(
            "torch.ops.aten.kthvalue.default",
            &with(&[arg("k", &format!(r#"{{"as_int": {k}}}"#))]),
        );
        assert!(err.contains("out of range for a dim of size 3"), "{err}");
    }
    // glu halves an odd dim.
    let err = run_tiny_with("torch.ops.aten.glu.default", &with(&[]));
    assert!(err.contains("its size 3 is odd"), "{err}");
    // rms_norm over a shape that is not the input's last dims.
    let err = run_tiny_with(
        "torch.ops.aten.rms_norm.default",
        &with(&[arg("normalized_shape", r#"{"as_ints": [5]}"#)])
            .replace(r#""name": "self""#, r#""name": "input""#),
    );
    assert!(
        err.contains("last dims [5] of an input of shape [2, 3]"),
        "{err}"
    );
    // prelu with a weight for 4 channels on 3.
    let err = run_tiny_with(
        "torch.ops.aten.prelu.default",
        &with(&[arg("weight", r#"{"as_tensor": {"name": "p_0_weight"}}"#)]),
    );
    assert!(
        err.contains("does not match input of shape [2, 3]"),
        "{err}"
    );
}

#[test]
fn inplace_update_of_a_view_is_written_back_or_refused() {
    // `y[:, :2] += 1` on `y = x * 2`: both flavours give torch's result.
    let x = read_npy(&fixture("inplace_view.input_0.npy")).unwrap();
    let want = read_npy(&fixture("inplace_view.output_0.npy")).unwrap();
    for flavour in ["plain", "decomp"] {
        let p = Program::load(fixture(&format!("inplace_view.{flavour}.pt2"))).unwrap();
        let got = p.run(std::slice::from_ref(&x)).unwrap();
        let diff = (&got[0] - &want).unwrap().abs().unwrap().max_all().unwrap();
        assert!(diff.to_scalar::<f32>().unwrap() <= 1e-6, "{flavour}");
    }
    // Through a `view` of a tensor read later, and with a view made before the update read
    // after it: refused, naming the node and what it shares memory with.
    for bad in ["bad_inplace_alias.pt2", "bad_inplace_stale.pt2"] {
        let err = Program::load(fixture(bad)).err().unwrap();
        assert!(matches!(err, Error::Program(_)), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("(aten.add_.Tensor) updates '") && msg.contains("shares memory with"),
            "{bad}: {msg}"
        );
    }
}

/// Both flavours of fixture `stem` (`<stem>.{plain,decomp}.pt2`), each loaded once and run
/// on `<stem>.input_{0,1}.npy` in turn, give torch's outputs of those two successive calls
/// (`<stem>.output_{0,1}.npy`) within `tol`: what the first call left in the buffers is what
/// the second reads.
fn successive_calls_match(stem: &str, tol: f32) {
    for flavour in ["plain", "decomp"] {
        let p = Program::load(fixture(&format!("{stem}.{flavour}.pt2"))).unwrap();
        for call in 0..2 {
            let x = read_npy(&fixture(&format!("{stem}.input_{call}.npy"))).unwrap();
            let want = read_npy(&fixture(&format!("{stem}.output_{call}.npy"))).unwrap();
            let got = p.run(&[x]).unwrap();
            let diff = (&got[0] - &want).unwrap().abs().unwrap().max_all().unwrap();
            assert!(
                diff.to_scalar::<f32>().unwrap() <= tol,
                "{stem}.{flavour}, call {call}"
            );
        }
    }
}

#[test]
fn buffers_updated_in_forward_keep_their_new_values_for_the_next_run() {
    // `self.calls += 1; self.total.add_(x.sum(0))`.
    successive_calls_match("buffer_mutation", 1e-5);
}

#[test]
fn a_buffer_updated_through_a_slice_keeps_its_new_values_for_the_next_run() {
    // `self.state[:, :2] += x[:, :2]; return self.state * 2 + x`. The plain export keeps the
    // update as `add_` on a slice and `copy_` into another slice of the buffer, which the
    // load writes back into the buffer.
    successive_calls_match("buffer_view_update", 1e-6);
    // The same update of an input (`x[:, :2] += 1`): refused, naming the input.
    let err = Program::load(fixture("bad_input_view_mutation.pt2"))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("updates its input 'x' in place"), "{err}");
}

#[test]
fn weights_returned_as_they_are_are_outputs() {
    // `return x * self.scale, self.table, self.scale`: two outputs name placeholders.
    for flavour in ["plain", "decomp"] {
        let p = Program::load(fixture(&format!("returns_weights.{flavour}.pt2"))).unwrap();
        let x = read_npy(&fixture("returns_weights.input_0.npy")).unwrap();
        let got = p.run(&[x]).unwrap();
        assert_eq!(got.len(), 3, "{flavour}");
        for (i, got) in got.iter().enumerate() {
            let want = read_npy(&fixture(&format!("returns_weights.output_{i}.npy"))).unwrap();
            assert_eq!(got.dims(), want.dims(), "{flavour}, output {i}");
            let diff = (got - &want).unwrap().abs().unwrap().max_all().unwrap();
            assert!(
                diff.to_scalar::<f32>().unwrap() <= 1e-6,
                "{flavour}, output {i}"
            );
        }
    }
}

#[test]
fn a_program_that_updates_its_input_is_refused_naming_it() {
    for file in ["bad_input_mutation.pt2", "bad_input_mutation.decomp.pt2"] {
        let err = Program::load(fixture(file)).err().unwrap().to_string();
        assert!(
            err.contains("updates its input 'x' in place"),
            "{file}: {err}"
        );
    }
}

#[test]
fn dynamic_dims_run_within_their_range_and_are_checked() {
    let p = Program::load(fixture("dynamic_batch.plain.pt2")).unwrap();
    let x = read_npy(&fixture("dynamic_batch.input_0.npy")).unwrap();
    let y = read_npy(&fixture("dynamic_batch.input_1.npy")).unwrap();
    let want = read_npy(&fixture("dynamic_batch.output_0.npy")).unwrap();
    let got = p.run(&[x, y]).unwrap();
    assert_eq!(got[0].dims(), [3, 3]);
    let diff = (&got[0] - &want).unwrap().abs().unwrap().max_all().unwrap();
    assert!(diff.to_scalar::<f32>().unwrap() <= 1e-5);

    let zeros = |b: usize, n: usize| Tensor::zeros((b, n), DType::F32, &Device::Cpu).unwrap();
    let err = p.run(&[zeros(9, 4), zeros(9, 5)]).unwrap_err();
    assert!(matches!(err, Error::Input { index: 0, .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("dim 0 is 9, but the program was exported for 2..=8"),
        "{msg}"
    );
    let err = p.run(&[zeros(3, 4), zeros(4, 5)]).unwrap_err();
    assert!(matches!(err, Error::Input { index: 1, .. }), "{err}");
    assert!(
        err.to_string()
            .contains("dim 0 is 4, but input 0 dim 0 is 3: the program needs them equal"),
        "{err}"
    );
}
