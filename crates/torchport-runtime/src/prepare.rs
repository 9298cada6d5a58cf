//! Weight preparation done once at load: store each Linear weight in the layout its matmul
//! reads, so that no run pays for a transposed operand.
//!
//! torch keeps a Linear weight as `[out, in]` and computes `x @ w.T`; the runtime's matmul
//! (candle's gemm) is given `w.T`, a strided view. A weight that is only ever read through a
//! 2-d transpose (`linear`'s `weight`, or `t` / `permute([1, 0])` / `transpose(0, 1)` as the
//! decomposed form writes it) is stored transposed and contiguous, and handed to the graph as
//! the transpose of that: the same logical `[out, in]` values, whose `.T` is now contiguous.
//! Weights with any other use are left as they are.

use std::collections::{HashMap, HashSet};

use candle_core::{DType, Tensor};

use crate::ops::op_key;
use crate::schema::{Argument, Graph, Node};

/// How a node reads a value: through a 2-d transpose (or as `linear`'s weight), or otherwise.
fn transposed_read(node: &Node, input: &str) -> bool {
    match (op_key(&node.target), input) {
        ("aten.linear.default", "weight") => true,
        ("aten.t.default" | "aten.numpy_T.default", "self") => true,
        ("aten.permute.default", "self") => node
            .inputs
            .iter()
            .any(|a| a.name == "dims" && matches!(&a.arg, Argument::AsInts(d) if d == &[1, 0])),
        ("aten.transpose.int", "self") => {
            let int = |n: &str| {
                node.inputs
                    .iter()
                    .find(|a| a.name == n)
                    .and_then(|a| match a.arg {
                        Argument::AsInt(v) => Some(v),
                        _ => None,
                    })
            };
            matches!(
                (int("dim0"), int("dim1")),
                (Some(0 | -2), Some(1 | -1)) | (Some(1 | -1), Some(0 | -2))
            )
        }
        _ => false,
    }
}

/// Re-lay out, in place, the 2-d f32 weights (by graph input name) that every reader of
/// `graph` reads transposed. Returns how many were changed.
pub fn pretranspose_linear_weights(graph: &Graph, weights: &mut HashMap<String, Tensor>) -> usize {
    let mut ok: HashSet<&str> = HashSet::new();
    let mut bad: HashSet<&str> = HashSet::new();
    for node in &graph.nodes {
        for a in &node.inputs {
            let names: Vec<&str> = match &a.arg {
                Argument::AsTensor(t) => vec![t.name.as_str()],
                Argument::AsTensors(ts) => ts.iter().map(|t| t.name.as_str()).collect(),
                Argument::AsOptionalTensors(ts) => ts
                    .iter()
                    .filter_map(|t| match t {
                        crate::schema::OptionalTensorArgument::AsTensor(t) => Some(t.name.as_str()),
                        crate::schema::OptionalTensorArgument::AsNone(_) => None,
                    })
                    .collect(),
                Argument::AsOptionalTensor(crate::schema::OptionalTensorArgument::AsTensor(t)) => {
                    vec![t.name.as_str()]
                }
                _ => continue,
            };
            for n in names {
                if !weights.contains_key(n) {
                    continue;
                }
                if matches!(&a.arg, Argument::AsTensor(_)) && transposed_read(node, &a.name) {
                    ok.insert(n);
                } else {
                    bad.insert(n);
                }
            }
        }
    }
    // A weight returned by the graph keeps its layout too (harmless, but keep it simple).
    for o in &graph.outputs {
        if let Argument::AsTensor(t) = o {
            bad.insert(t.name.as_str());
        }
    }
    let mut changed = 0;
    for name in ok.difference(&bad) {
        let Some(w) = weights.get(*name) else {
            continue;
        };
        if w.rank() != 2 || w.dtype() != DType::F32 {
            continue;
        }
        let relaid = match transpose_f32(w) {
            Some(t) => t.t(),
            None => w.t().and_then(|t| t.contiguous()).and_then(|t| t.t()),
        };
        if let Ok(r) = relaid {
            weights.insert((*name).to_string(), r);
            changed += 1;
        }
    }
    changed
}

/// The contiguous transpose `[k, n]` of a contiguous 2-d f32 tensor `[n, k]`, copied in 64 x 64
/// tiles (candle's strided copy goes element by element), bands of output rows in parallel.
fn transpose_f32(w: &Tensor) -> Option<Tensor> {
    use rayon::prelude::*;
    const T: usize = 64;
    let (n, k) = w.dims2().ok()?;
    let out = crate::ops::fused::with_f32(w, |src| {
        let mut dst = vec![0f32; n * k];
        if n == 0 || k == 0 {
            return dst;
        }
        // dst[j, i] = src[i, j]; each task owns T rows of dst (T columns of src).
        dst.par_chunks_mut(T * n).enumerate().for_each(|(band, d)| {
            let j0 = band * T;
            let rows = d.len() / n;
            for i0 in (0..n).step_by(T) {
                let i1 = (i0 + T).min(n);
                for jj in 0..rows {
                    let drow = &mut d[jj * n..][i0..i1];
                    for (o, i) in drow.iter_mut().zip(i0..i1) {
                        *o = src[i * k + j0 + jj];
                    }
                }
            }
        });
        dst
    })?;
    Tensor::from_vec(out, (k, n), w.device()).ok()
}
