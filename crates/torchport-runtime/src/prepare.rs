//! Weight preparation done once at load: fold each inference batch norm into the
//! convolution before it ([`fold_batch_norms`]), then the relu / silu / hardswish after a
//! convolution into it ([`fuse_conv_activations`]), and store each Linear weight in the layout its
//! matmul reads, so that no run pays for a transposed operand.
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

/// Names of the tensors `arg` reads.
fn tensor_names(arg: &Argument) -> Vec<&str> {
    use crate::schema::OptionalTensorArgument as O;
    match arg {
        Argument::AsTensor(t) => vec![t.name.as_str()],
        Argument::AsTensors(ts) => ts.iter().map(|t| t.name.as_str()).collect(),
        Argument::AsOptionalTensors(ts) => ts
            .iter()
            .filter_map(|t| match t {
                O::AsTensor(t) => Some(t.name.as_str()),
                O::AsNone(_) => None,
            })
            .collect(),
        Argument::AsOptionalTensor(O::AsTensor(t)) => vec![t.name.as_str()],
        _ => Vec::new(),
    }
}

/// The tensor named by input `name` of `node`, if it is one.
fn input_tensor<'a>(node: &'a Node, name: &str) -> Option<&'a str> {
    use crate::schema::OptionalTensorArgument as O;
    match node
        .inputs
        .iter()
        .find(|a| a.name == name)
        .map(|a| &a.arg)?
    {
        Argument::AsTensor(t) | Argument::AsOptionalTensor(O::AsTensor(t)) => Some(&t.name),
        _ => None,
    }
}

/// A float input of `node` (`default` when the serializer omitted it).
fn input_float(node: &Node, name: &str, default: f64) -> Option<f64> {
    match node.inputs.iter().find(|a| a.name == name).map(|a| &a.arg) {
        None => Some(default),
        Some(Argument::AsFloat(f)) => Some(f.get()),
        Some(Argument::AsInt(i)) => Some(*i as f64),
        Some(_) => None,
    }
}

/// A small f32/f64 weight's values as f64 (exactly `len` of them), or `None`.
fn values(weights: &HashMap<String, Tensor>, name: Option<&str>, len: usize) -> Option<Vec<f64>> {
    let t = weights.get(name?)?;
    if t.elem_count() != len || !matches!(t.dtype(), DType::F32 | DType::F64) {
        return None;
    }
    t.to_dtype(DType::F64)
        .ok()?
        .flatten_all()
        .ok()?
        .to_vec1()
        .ok()
}

/// Whether `node` is a (not transposed) convolution: `conv1d`, `conv2d`, or `convolution`
/// with `transposed=False`.
fn is_forward_conv(node: &crate::schema::Node) -> bool {
    match op_key(&node.target) {
        "aten.conv2d.default" | "aten.conv1d.default" => true,
        "aten.convolution.default" => matches!(
            node.inputs
                .iter()
                .find(|a| a.name == "transposed")
                .map(|a| &a.arg),
            Some(Argument::AsBool(false))
        ),
        _ => false,
    }
}

/// For each tensor value of `graph`: how many node inputs read it (a graph output counts as
/// a great many readers, so it is never rewritten away), and which node produces it (nodes
/// with one tensor output only).
fn readers_and_producers(graph: &Graph) -> (HashMap<String, usize>, HashMap<String, usize>) {
    let mut readers: HashMap<String, usize> = HashMap::new();
    for node in &graph.nodes {
        for a in &node.inputs {
            for n in tensor_names(&a.arg) {
                *readers.entry(n.to_string()).or_default() += 1;
            }
        }
    }
    for o in &graph.outputs {
        for n in tensor_names(o) {
            *readers.entry(n.to_string()).or_default() += usize::MAX / 4;
        }
    }
    let mut producer: HashMap<String, usize> = HashMap::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        if let [Argument::AsTensor(t)] = node.outputs.as_slice() {
            producer.insert(t.name.clone(), i);
        }
    }
    (readers, producer)
}

/// Fold each inference batch norm into the convolution that feeds it, when that convolution's
/// output is read by nothing else: the conv's weight is scaled per output channel by
/// `gamma / sqrt(var + eps)` and its bias becomes `(bias - mean) * that + beta` (computed in
/// f64, stored as f32, as new weights), the conv then defines the norm's output and the norm
/// node is dropped. Handles `aten.batch_norm` with `training=False` and
/// `_native_batch_norm_legit_no_training` (whose saved statistics must be unread), convs with
/// or without a bias, norms with or without affine parameters. Returns how many were folded;
/// weights nothing reads any more are dropped.
pub fn fold_batch_norms(graph: &mut Graph, weights: &mut HashMap<String, Tensor>) -> usize {
    use crate::schema::{NamedArgument, TensorArgument};
    let (readers, producer) = readers_and_producers(graph);
    let mut dropped: HashSet<usize> = HashSet::new();
    let mut folded = 0;
    for i in 0..graph.nodes.len() {
        let bn = &graph.nodes[i];
        let key = op_key(&bn.target);
        let out = match (key, bn.outputs.as_slice()) {
            ("aten.batch_norm.default", [Argument::AsTensor(y)]) => {
                if !matches!(
                    bn.inputs
                        .iter()
                        .find(|a| a.name == "training")
                        .map(|a| &a.arg),
                    Some(Argument::AsBool(false))
                ) {
                    continue;
                }
                y.name.clone()
            }
            ("aten._native_batch_norm_legit_no_training.default", outs) => {
                let mut names = outs.iter().flat_map(tensor_names);
                let Some(y) = names.next() else { continue };
                if names.any(|n| readers.get(n).copied().unwrap_or(0) > 0) {
                    continue;
                }
                y.to_string()
            }
            _ => continue,
        };
        let Some(x) = input_tensor(bn, "input") else {
            continue;
        };
        let Some(&j) = producer.get(x) else { continue };
        if readers.get(x) != Some(&1) {
            continue;
        }
        let conv = &graph.nodes[j];
        let conv_ok = is_forward_conv(conv);
        let Some(w_name) = input_tensor(conv, "weight") else {
            continue;
        };
        let Some(w) = weights.get(w_name) else {
            continue;
        };
        if !conv_ok || w.dtype() != DType::F32 || w.rank() < 3 {
            continue;
        }
        let co = w.dims()[0];
        let (Some(mean), Some(var), Some(eps)) = (
            values(weights, input_tensor(bn, "running_mean"), co),
            values(weights, input_tensor(bn, "running_var"), co),
            input_float(bn, "eps", 1e-5),
        ) else {
            continue;
        };
        let affine = |name: &str, fill: f64| match input_tensor(bn, name) {
            None => Some(vec![fill; co]),
            n => values(weights, n, co),
        };
        let conv_bias = match input_tensor(conv, "bias") {
            None => Some(vec![0.0; co]),
            n => values(weights, n, co),
        };
        let (Some(gamma), Some(beta), Some(cb)) =
            (affine("weight", 1.0), affine("bias", 0.0), conv_bias)
        else {
            continue;
        };
        let scale: Vec<f64> = (0..co).map(|c| gamma[c] / (var[c] + eps).sqrt()).collect();
        let bias: Vec<f32> = (0..co)
            .map(|c| ((cb[c] - mean[c]) * scale[c] + beta[c]) as f32)
            .collect();
        let Some(wv) = w.flatten_all().ok().and_then(|t| t.to_vec1::<f32>().ok()) else {
            continue;
        };
        let per = wv.len() / co.max(1);
        let wv: Vec<f32> = wv
            .iter()
            .enumerate()
            .map(|(e, &v)| (f64::from(v) * scale[e / per.max(1)]) as f32)
            .collect();
        let (Ok(new_w), Ok(new_b)) = (
            Tensor::from_vec(wv, w.shape(), w.device()),
            Tensor::from_vec(bias, co, w.device()),
        ) else {
            continue;
        };
        let (wn, bname) = (
            format!("{out}__folded_weight"),
            format!("{out}__folded_bias"),
        );
        if weights.contains_key(&wn) || weights.contains_key(&bname) {
            continue;
        }
        weights.insert(wn.clone(), new_w);
        weights.insert(bname.clone(), new_b);
        let conv = &mut graph.nodes[j];
        let tensor = |name: String| Argument::AsTensor(TensorArgument { name });
        for a in conv.inputs.iter_mut() {
            if a.name == "weight" {
                a.arg = tensor(wn.clone());
            }
        }
        match conv.inputs.iter_mut().find(|a| a.name == "bias") {
            Some(a) => a.arg = tensor(bname),
            None => conv.inputs.push(NamedArgument {
                name: "bias".into(),
                arg: tensor(bname),
                kind: None,
            }),
        }
        conv.outputs = vec![tensor(out)];
        dropped.insert(i);
        folded += 1;
    }
    if folded > 0 {
        let mut at = 0;
        graph.nodes.retain(|_| {
            at += 1;
            !dropped.contains(&(at - 1))
        });
        let mut read: HashSet<String> = HashSet::new();
        for node in &graph.nodes {
            for a in &node.inputs {
                read.extend(tensor_names(&a.arg).into_iter().map(str::to_string));
            }
        }
        for o in &graph.outputs {
            read.extend(tensor_names(o).into_iter().map(str::to_string));
        }
        weights.retain(|name, _| read.contains(name));
    }
    folded
}

/// Fold a relu, silu or hardswish (or its in-place form) that is the only reader of a
/// convolution's output into that convolution: the conv node records the activation under
/// [`FUSED_ACT_ARG`](crate::ops::conv::FUSED_ACT_ARG), applies it to each image's output as it
/// is produced, defines the activation's output, and the activation node is dropped. Run
/// after [`fold_batch_norms`] (conv, norm, relu becomes one node). Returns how many.
pub fn fuse_conv_activations(graph: &mut Graph) -> usize {
    use crate::ops::conv::{Act, FUSED_ACT_ARG};
    use crate::schema::NamedArgument;
    let (readers, producer) = readers_and_producers(graph);
    let mut dropped: HashSet<usize> = HashSet::new();
    let mut fused = 0;
    for i in 0..graph.nodes.len() {
        let node = &graph.nodes[i];
        let Some(act) = Act::of_op(op_key(&node.target)) else {
            continue;
        };
        let (Some(x), [Argument::AsTensor(y)]) =
            (input_tensor(node, "self"), node.outputs.as_slice())
        else {
            continue;
        };
        let y = y.name.clone();
        let (Some(&j), Some(1)) = (producer.get(x), readers.get(x).copied()) else {
            continue;
        };
        let conv = &graph.nodes[j];
        let conv_ok = is_forward_conv(conv);
        if !conv_ok || conv.inputs.iter().any(|a| a.name == FUSED_ACT_ARG) {
            continue;
        }
        let conv = &mut graph.nodes[j];
        conv.inputs.push(NamedArgument {
            name: FUSED_ACT_ARG.into(),
            arg: Argument::AsString(act.name().into()),
            kind: None,
        });
        conv.outputs = vec![Argument::AsTensor(crate::schema::TensorArgument {
            name: y,
        })];
        dropped.insert(i);
        fused += 1;
    }
    let mut at = 0;
    graph.nodes.retain(|_| {
        at += 1;
        !dropped.contains(&(at - 1))
    });
    fused
}
