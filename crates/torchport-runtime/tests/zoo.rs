//! The CI subset of the real-model zoo: models built by transformers, torchvision and timm
//! themselves (small configurations, random weights; tests/fixtures/gen/gen_zoo.py), each
//! exported plain and after run_decompositions(), run here on the inputs PyTorch used and
//! compared with PyTorch's own outputs: floats within 1e-4 * max(1, max |ref|), integers and
//! bools exactly. The full zoo (larger models, not committed) is benches/zoo.py.

use std::path::PathBuf;

use torchport_runtime::candle_core::{DType, Tensor};
use torchport_runtime::npy::read_npy;
use torchport_runtime::Program;

/// Every model gen_zoo.py writes; the test fails if one is missing.
const MODELS: [&str; 7] = [
    "hf_bert_mask",
    "hf_llama_mask",
    "hf_t5_encoder_mask",
    "tv_mobilenet_v3_small",
    "timm_resnet18d",
    "timm_convnext",
    "timm_vit",
];

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/zoo")
}

fn numbered(model: &str, kind: &str) -> Vec<Tensor> {
    (0..)
        .map(|i| fixtures().join(format!("{model}.{kind}_{i}.npy")))
        .take_while(|p| p.exists())
        .map(|p| read_npy(&p).unwrap())
        .collect()
}

/// Why `got` differs from torch's `want`, if it does.
fn mismatch(got: &Tensor, want: &Tensor) -> Option<String> {
    if got.dims() != want.dims() {
        return Some(format!("shape {:?}, torch {:?}", got.dims(), want.dims()));
    }
    if want.dtype() != DType::F32 {
        let g = got.to_dtype(DType::I64).unwrap().flatten_all().unwrap();
        let w = want.to_dtype(DType::I64).unwrap().flatten_all().unwrap();
        let (g, w) = (g.to_vec1::<i64>().unwrap(), w.to_vec1::<i64>().unwrap());
        return (g != w).then(|| "integer values differ".to_string());
    }
    let f = |t: &Tensor| {
        t.to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    };
    let (g, w) = (f(got), f(want));
    let maxref = w.iter().fold(0f32, |m, v| m.max(v.abs()));
    let tol = 1e-4 * maxref.max(1.0);
    let diff = g
        .iter()
        .zip(&w)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    eprintln!("  max abs diff {diff:e} (tolerance {tol:e})");
    (diff > tol || diff.is_nan()).then(|| format!("max abs diff {diff} > {tol}"))
}

#[test]
fn zoo_models_match_pytorch() {
    let mut ran = 0;
    let mut failures = Vec::new();
    for model in MODELS {
        let inputs = numbered(model, "input");
        let want = numbered(model, "output");
        assert!(
            !inputs.is_empty() && !want.is_empty(),
            "{model}: fixtures missing"
        );
        for flavour in ["plain", "decomp"] {
            let name = format!("{model}.{flavour}");
            eprintln!("{name}");
            let result =
                Program::load(fixtures().join(format!("{name}.pt2"))).and_then(|p| p.run(&inputs));
            let got = match result {
                Ok(got) => got,
                Err(e) => {
                    failures.push(format!("{name}: {e}"));
                    continue;
                }
            };
            ran += 1;
            if got.len() != want.len() {
                failures.push(format!(
                    "{name}: {} outputs, torch {}",
                    got.len(),
                    want.len()
                ));
                continue;
            }
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                if let Some(why) = mismatch(g, w) {
                    failures.push(format!("{name} output {i}: {why}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    assert_eq!(ran, 2 * MODELS.len(), "programs run");
}
