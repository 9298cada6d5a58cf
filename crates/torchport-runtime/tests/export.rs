//! End-to-end: run each family's exported program (plain and run_decompositions()) on the
//! input PyTorch used and compare with PyTorch's own outputs (tests/fixtures/gen/gen_export.py):
//! max abs diff <= 1e-4 * max(1, max |ref|), in f32; integer and bool outputs exactly.

use std::path::PathBuf;

use torchport_runtime::candle_core::{DType, Tensor};
use torchport_runtime::npy::read_npy;
use torchport_runtime::Program;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/export")
}

fn numbered(family: &str, kind: &str) -> Vec<Tensor> {
    (0..)
        .map(|i| fixtures().join(format!("{family}.{kind}_{i}.npy")))
        .take_while(|p| p.exists())
        .map(|p| read_npy(&p).unwrap())
        .collect()
}

/// Max abs difference and the tolerance for one output.
/// Integer and bool outputs must match exactly (compared in i64: tolerance 0).
fn compare(got: &Tensor, want: &Tensor) -> (f32, f32) {
    assert_eq!(got.dims(), want.dims(), "shape");
    if matches!(want.dtype(), DType::I64 | DType::U8 | DType::U32) {
        let i = |t: &Tensor| {
            t.to_dtype(DType::I64)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<i64>()
                .unwrap()
        };
        let same = i(got) == i(want);
        return (if same { 0.0 } else { f32::INFINITY }, 0.0);
    }
    let g = got
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let w = want
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let maxref = w.iter().fold(0f32, |m, v| m.max(v.abs()));
    let diff = g
        .iter()
        .zip(&w)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    (diff, 1e-4 * maxref.max(1.0))
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
        assert_eq!(got.len(), want.len(), "{family}.{flavour}: output count");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let (diff, tol) = compare(g, w);
            eprintln!("{family}.{flavour} output {i}: max abs diff {diff:e} (tolerance {tol:e})");
            assert!(
                diff <= tol,
                "{family}.{flavour} output {i}: max abs diff {diff} > {tol}"
            );
        }
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

family!(bnfold, norms, spatial, softmax_edges, strided_binary, tvops);

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
