//! End-to-end: run each family's exported program (plain and run_decompositions()) on the
//! input PyTorch used and compare with PyTorch's own outputs (tests/fixtures/gen/gen_export.py):
//! `common/compare.rs`'s `mismatch_within` at 1e-4 (floats within 1e-4 × max(1, max |finite
//! ref|), torch's infinities and NaNs where torch has them; integer and bool outputs exactly).

use std::path::PathBuf;

use torchport_runtime::candle_core::{DType, Tensor};
use torchport_runtime::Program;

#[path = "common/compare.rs"]
mod compare;
use compare::output_mismatches;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/export")
}

fn numbered(family: &str, kind: &str) -> Vec<Tensor> {
    compare::numbered(&fixtures(), family, kind)
}

fn check(family: &str) {
    let inputs = numbered(family, "input");
    let want = numbered(family, "output");
    assert!(
        !inputs.is_empty() && !want.is_empty(),
        "{family}: fixtures missing"
    );
    for flavour in ["plain", "decomp"] {
        let path = fixtures().join(format!("{family}.{flavour}.pt2"));
        let p = Program::load(&path).unwrap_or_else(|e| panic!("{family}.{flavour}: {e}"));
        assert!(
            p.unsupported_ops().is_empty(),
            "{family}.{flavour}: {:?}",
            p.unsupported_ops()
        );
        let got = p
            .run(&inputs)
            .unwrap_or_else(|e| panic!("{family}.{flavour}: {e}"));
        let bad = output_mismatches(&format!("{family}.{flavour}"), &got, &want, |_| 1e-4);
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }
}

macro_rules! family {
    ($($name:ident),*) => { $( #[test] fn $name() { check(stringify!($name)); } )* };
}

family!(
    resnet,
    mobilenet,
    vgg,
    squeezenet,
    shufflenet,
    densenet,
    efficientnet,
    regnet,
    convnext
);
family!(vit, bert, gpt2, lstm, gru, unet, half, conv1d, intops);

family!(
    bnfold,
    norms,
    spatial,
    softmax_edges,
    strided_binary,
    tvops,
    scans,
    hf_ops
);

/// Load-time batch-norm folding fires exactly where it may: of `bnfold`'s six norms, the four
/// right after a convolution read by nothing else (conv without bias, conv with bias and a
/// norm without affine parameters, depthwise, conv1d) are folded, in both the plain and the
/// decomposed program; the norm whose conv output is also read by an add, and the one after
/// an add, stay; the relu after the first conv + norm joins that conv. (The outputs against
/// torch's are checked by the `bnfold` test above.)
#[test]
fn bnfold_folds_only_foldable_norms() {
    for (flavour, op) in [
        ("plain", "aten.batch_norm.default"),
        (
            "decomp",
            "aten._native_batch_norm_legit_no_training.default",
        ),
    ] {
        let p = Program::load(fixtures().join(format!("bnfold.{flavour}.pt2"))).unwrap();
        let left = p.ops().iter().find(|o| o.op == op).map_or(0, |o| o.count);
        assert_eq!(left, 2, "{flavour}: norms left after folding");
        let before = Program::ops_of(fixtures().join(format!("bnfold.{flavour}.pt2"))).unwrap();
        let all = before.iter().find(|o| o.op == op).map_or(0, |o| o.count);
        assert_eq!(all, 6, "{flavour}: norms in the program as exported");
        // The relu after the first conv + norm is folded into that conv too.
        let relus = |ops: &[torchport_runtime::OpUse]| {
            ops.iter()
                .filter(|o| o.op.starts_with("aten.relu"))
                .map(|o| o.count)
                .sum::<usize>()
        };
        assert_eq!(relus(&before), 1, "{flavour}: relus as exported");
        assert_eq!(relus(&p.ops()), 0, "{flavour}: relus left after fusing");
    }
}

/// `Program::from_parts` folds batch norms into copies: the tensors its caller handed over
/// (and still holds) keep their values, while `Program::load`, which owns the weights it
/// decodes, may scale them in place. Both programs give torch's outputs (the `bnfold` test).
#[test]
fn from_parts_leaves_callers_weights_alone() {
    let path = fixtures().join("bnfold.plain.pt2");
    let (ep, payloads) = torchport_runtime::archive::read(&path).unwrap();
    let kept: Vec<(String, Tensor)> = payloads
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let before: Vec<Vec<f32>> = kept
        .iter()
        .map(|(_, t)| {
            t.to_dtype(DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap()
        })
        .collect();
    let p = Program::from_parts(ep, payloads).unwrap();
    assert!(p
        .ops()
        .iter()
        .all(|o| o.op != "aten.batch_norm.default" || o.count == 2));
    for ((name, t), want) in kept.iter().zip(&before) {
        let got: Vec<f32> = t
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(&got, want, "{name} changed by from_parts");
    }
}

/// The tensor condition `hf_ops` was exported with (`torch._check_tensor_all`: its feature
/// maps' sizes sum to the sequence length) is enforced at run time: sizes that break it are
/// an error naming the failed assertion, in both programs.
#[test]
fn checked_tensor_conditions_are_enforced() {
    let mut inputs = numbered("hf_ops", "input");
    inputs[1] = Tensor::new(
        &[[1i64, 3], [2, 3]],
        &torchport_runtime::candle_core::Device::Cpu,
    )
    .unwrap();
    for flavour in ["plain", "decomp"] {
        let p = Program::load(fixtures().join(format!("hf_ops.{flavour}.pt2"))).unwrap();
        let err = p.run(&inputs).unwrap_err().to_string();
        assert!(err.contains("assertion failed"), "{flavour}: {err}");
    }
}

/// The numbers `hf_ops` returns (a constant int, an `.item()` int and float) come back as
/// 0-d int64, int64 and float64 tensors (the `hf_ops` test checks their values).
#[test]
fn number_outputs_are_0d_tensors() {
    let inputs = numbered("hf_ops", "input");
    for flavour in ["plain", "decomp"] {
        let p = Program::load(fixtures().join(format!("hf_ops.{flavour}.pt2"))).unwrap();
        let out = p.run(&inputs).unwrap();
        let kinds: Vec<_> = out[5..].iter().map(|t| (t.dtype(), t.rank())).collect();
        assert_eq!(
            kinds,
            [(DType::I64, 0), (DType::I64, 0), (DType::F64, 0)],
            "{flavour}"
        );
    }
}
