//! Comparing runtime outputs with torch's, for the tests that run real models and programs
//! (zoo, TorchScript, OpInfo): fixtures are `STEM.input_<i>.npy` / `STEM.output_<i>.npy`.
//! Include with `#[path = "common/compare.rs"] mod compare;`.

use std::path::Path;

use torchport_runtime::candle_core::{DType, Tensor};
use torchport_runtime::npy::read_npy;

/// `dir/STEM.KIND_0.npy`, `_1`, … for as long as they exist.
pub fn numbered(dir: &Path, stem: &str, kind: &str) -> Vec<Tensor> {
    (0..)
        .map(|i| dir.join(format!("{stem}.{kind}_{i}.npy")))
        .take_while(|p| p.exists())
        .map(|p| read_npy(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect()
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

/// Every way a run's outputs `got` differ from torch's `want`, each led by `name`: a different
/// count, else each output's [`mismatch_within`] at the tolerance `rel(want)` gives it.
pub fn output_mismatches(
    name: &str,
    got: &[Tensor],
    want: &[Tensor],
    rel: impl Fn(&Tensor) -> f64,
) -> Vec<String> {
    if got.len() != want.len() {
        return vec![format!(
            "{name}: {} outputs, torch {}",
            got.len(),
            want.len()
        )];
    }
    got.iter()
        .zip(want)
        .enumerate()
        .filter_map(|(i, (g, w))| {
            mismatch_within(g, w, rel(w)).map(|why| format!("{name} output {i}: {why}"))
        })
        .collect()
}

/// Why `got` differs from torch's `want`, if it does: shapes must be equal, and both float or
/// both not; integer and bool values equal; floats within `rel` × max(1, max |ref|) (1e-4 in
/// most tests), NaN where torch has NaN and the same infinities.
pub fn mismatch_within(got: &Tensor, want: &Tensor, rel: f64) -> Option<String> {
    if got.dims() != want.dims() {
        return Some(format!("shape {:?}, torch {:?}", got.dims(), want.dims()));
    }
    if got.dtype().is_float() != want.dtype().is_float() {
        return Some(format!("dtype {:?}, torch {:?}", got.dtype(), want.dtype()));
    }
    let (g, w) = (values(got), values(want));
    if !matches!(want.dtype(), DType::F32 | DType::F64) {
        let bad = g.iter().zip(&w).filter(|(a, b)| a != b).count();
        return (bad > 0).then(|| format!("{bad} of {} integer values differ", w.len()));
    }
    let scale = w
        .iter()
        .filter(|v| v.is_finite())
        .fold(1f64, |m, v| m.max(v.abs()));
    let tol = rel * scale;
    let mut diff = 0f64;
    for (a, b) in g.iter().zip(&w) {
        if b.is_nan() || b.is_infinite() {
            if !(a.is_nan() && b.is_nan() || a == b) {
                return Some(format!("{a} where torch has {b}"));
            }
            continue;
        }
        let d = (a - b).abs();
        if d.is_nan() {
            return Some(format!("{a} where torch has {b}"));
        }
        diff = diff.max(d);
    }
    eprintln!("  max abs diff {diff:e} (tolerance {tol:e})");
    (diff > tol).then(|| format!("max abs diff {diff} > {tol}"))
}
