//! Weight preparation done once at load: compute each node that reads weights alone
//! ([`fold_constants`]), fold each inference batch norm into the
//! convolution before it ([`fold_batch_norms`]), then the relu / silu / hardswish after a
//! convolution into it ([`fuse_conv_activations`]), residual adds (and the activation after)
//! into the convolution before them ([`fuse_conv_residuals`]), drop the dropouts outside
//! training ([`drop_inference_dropouts`]), chains of elementwise ops into one pass
//! ([`fuse_pointwise_chains`]), run max pools whose indices nothing reads without them
//! ([`drop_unread_pool_indices`]), store the weights of convolutions on small planes packed
//! for the microkernel ([`pack_small_convs`]), those of convolutions run by Winograd's
//! algorithm transformed for it ([`transform_winograd_convs`]), store each Linear weight in
//! the layout its matmul reads, so that no run pays for a transposed operand, and fold the
//! elementwise work after a packed Linear into it ([`fuse_linear_epilogues`]).
//!
//! torch keeps a Linear weight as `[out, in]` and computes `x @ w.T`; the runtime's matmul
//! (candle's gemm) is given `w.T`, a strided view. A weight that is only ever read through a
//! 2-d transpose (`linear`'s `weight`, or `t` / `permute([1, 0])` / `transpose(0, 1)` as the
//! decomposed form writes it) is stored transposed and contiguous, and handed to the graph as
//! the transpose of that: the same logical `[out, in]` values, whose `.T` is now contiguous.
//! Weights with any other use are left as they are.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::mem::MaybeUninit;

use candle_core::{DType, Tensor};

use crate::fast::{HashMap as FastMap, HashSet as FastSet};
use crate::ops::op_key;
use crate::schema::{Argument, Graph, Node};

mod constants;
mod pointwise;
mod products;
mod small_convs;
mod winograd_convs;
pub use constants::{fold_constants, folded_weights, MAX_GROWTH};
pub use pointwise::{fuse_linear_epilogues, fuse_pointwise_chains};
pub use products::linears_from_products;
pub use small_convs::{pack_small_convs, small_conv_weights};
pub use winograd_convs::{transform_winograd_convs, winograd_conv_weights};

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

/// The weights (graph input names for which `is_weight` holds) that every reader of `graph`
/// reads transposed: those [`pretranspose_linear_weights`] re-lays out when they are 2-d
/// f32. `Program::load` asks before decoding the weights, to decode these transposed at once.
/// Not the weight of a Linear of a single row, which reads it as stored.
pub fn transposed_weights(graph: &Graph, is_weight: impl Fn(&str) -> bool) -> HashSet<&str> {
    weights_read_only(graph, is_weight, |node, input| {
        transposed_read(node, input) && !products::single_row(graph, node)
    })
}

/// The weights (graph input names for which `is_weight` holds) read only as the weight of
/// products the packed kernel computes (Linears, and `mm` / `addmm` / `matmul` with the
/// weight as their right operand as it is; `addmm` only as `x @ w + b`), all in one layout (by
/// name): those `Program::load` decodes packed for the microkernel ([`crate::ops::packed`]),
/// rewriting their products with [`pack_linears`].
pub fn packable_weights(
    graph: &Graph,
    is_weight: impl Fn(&str) -> bool,
) -> HashMap<&str, crate::ops::packed::Source> {
    use crate::ops::packed::Source;
    let mut all = HashMap::new();
    for source in [Source::Rows, Source::Columns] {
        let read = weights_read_only(graph, &is_weight, |node, input| {
            products::packable_read(graph, node, input) == Some(source)
        });
        all.extend(read.into_iter().map(|n| (n, source)));
    }
    all
}

/// The weights every reader of `graph` reads as `accept` says (and that the graph does not
/// return).
fn weights_read_only(
    graph: &Graph,
    is_weight: impl Fn(&str) -> bool,
    accept: impl Fn(&Node, &str) -> bool,
) -> HashSet<&str> {
    let mut ok: HashSet<&str> = HashSet::new();
    let mut bad: HashSet<&str> = HashSet::new();
    for node in &graph.nodes {
        for a in &node.inputs {
            for n in tensor_names(&a.arg) {
                if !is_weight(n) {
                    continue;
                }
                if matches!(&a.arg, Argument::AsTensor(_)) && accept(node, &a.name) {
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
    ok.retain(|n| !bad.contains(n));
    ok
}

/// Rewrite each product (as [`packable_weights`] finds them) whose weight is a graph input in
/// `packed` (name to `[n, k]`: output and input features) to
/// [`crate::ops::packed::TARGET`], which reads the packed values. Returns how many were
/// rewritten, or why not, when anything else reads a packed weight (or the graph returns
/// one): it would get the packed values.
pub fn pack_linears<S: BuildHasher>(
    graph: &mut Graph,
    packed: &HashMap<String, (usize, usize), S>,
) -> Result<usize, String> {
    let mut rewrites = Vec::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        let weight = node.inputs.iter().find_map(|a| match &a.arg {
            Argument::AsTensor(t) if products::packable_read(graph, node, &a.name).is_some() => {
                packed.get(&t.name)
            }
            _ => None,
        });
        if let Some(&(n, k)) = weight {
            let mut inputs = products::packed_inputs(node);
            for (name, v) in [("out_features", n), ("in_features", k)] {
                inputs.push(crate::schema::NamedArgument {
                    name: name.into(),
                    arg: Argument::AsInt(v as i64),
                    kind: None,
                });
            }
            rewrites.push((i, inputs));
        }
    }
    let count = rewrites.len();
    for (i, inputs) in rewrites {
        graph.nodes[i].target = crate::ops::packed::TARGET.to_string();
        graph.nodes[i].inputs = inputs;
    }
    let refuse = |name: &str, reader: &str| {
        Err(format!(
            "the weight '{name}' was packed at load, but {reader} also reads it"
        ))
    };
    for node in &graph.nodes {
        for a in &node.inputs {
            let read = tensor_names(&a.arg).find(|n| packed.contains_key(*n));
            if let Some(n) = read {
                let packed_read = node.target == crate::ops::packed::TARGET
                    || node.target == crate::ops::conv::small::TARGET;
                if !packed_read || a.name != "weight" {
                    return refuse(n, &node.target);
                }
            }
        }
    }
    for o in &graph.outputs {
        if let Argument::AsTensor(t) = o {
            if packed.contains_key(&t.name) {
                return refuse(&t.name, "the graph's output");
            }
        }
    }
    Ok(count)
}

/// Re-lay out, in place, the 2-d f32 weights (by graph input name) that every reader of
/// `graph` reads transposed. Returns how many are so laid out, counting those that already
/// were (decoded transposed by `Program::load`, see [`transposed_weights`]).
pub fn pretranspose_linear_weights<S: BuildHasher>(
    graph: &Graph,
    weights: &mut HashMap<String, Tensor, S>,
) -> usize {
    let names = transposed_weights(graph, |n| weights.contains_key(n));
    let mut changed = 0;
    for name in names {
        let Some(w) = weights.get(name) else {
            continue;
        };
        if w.rank() != 2 || w.dtype() != DType::F32 {
            continue;
        }
        if !w.is_contiguous() && w.t().is_ok_and(|t| t.is_contiguous()) {
            changed += 1;
            continue;
        }
        let relaid = match transpose_f32(w) {
            Some(t) => t.t(),
            None => w.t().and_then(|t| t.contiguous()).and_then(|t| t.t()),
        };
        if let Ok(r) = relaid {
            weights.insert(name.to_string(), r);
            changed += 1;
        }
    }
    changed
}

/// The contiguous transpose `[k, n]` of a contiguous 2-d f32 tensor `[n, k]`.
fn transpose_f32(w: &Tensor) -> Option<Tensor> {
    let (n, k) = w.dims2().ok()?;
    let out = crate::ops::fused::with_f32(w, |src| {
        // SAFETY: `transpose_into` writes every value of its `n * k`.
        #[allow(unsafe_code)]
        unsafe {
            crate::allocator::weight_filled(n * k, |dst| {
                transpose_into(n, k, dst, |start, row| {
                    row.copy_from_slice(&src[start..start + row.len()]);
                })
            })
        }
    })?;
    Tensor::from_vec(out, (k, n), w.device()).ok()
}

/// The transpose `[k, n]` (row-major) of the row-major `[n, k]` f32 matrix held in `bytes`
/// as little-endian values (`n * k * 4` bytes, as the caller checked): a weight decoded
/// straight from the archive into the layout [`pretranspose_linear_weights`] would give it.
pub fn transpose_le_f32(bytes: &[u8], n: usize, k: usize) -> Vec<f32> {
    // SAFETY: `transpose_le_f32_into` writes every value of its `n * k`.
    #[allow(unsafe_code)]
    unsafe {
        crate::allocator::weight_filled(n * k, |dst| transpose_le_f32_into(bytes, n, k, dst))
    }
}

/// [`transpose_le_f32`] into `dst` (`n * k` values, each written) instead of a new buffer.
pub(crate) fn transpose_le_f32_into(
    bytes: &[u8],
    n: usize,
    k: usize,
    dst: &mut [MaybeUninit<f32>],
) {
    transpose_into(n, k, dst, |start, row| {
        let src = &bytes[start * 4..(start + row.len()) * 4];
        for (o, c) in row.iter_mut().zip(src.chunks_exact(4)) {
            *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
    })
}

/// Writes into `dst` (`n * k` values, each written once) the transpose `[k, n]` of a
/// row-major `[n, k]` f32 matrix, whose elements from flat index `start` on `load(start,
/// row)` writes into `row`. Bands of 256 output rows in parallel; in each, 64 x 64 tiles: 64
/// stretches of source rows are loaded into a small buffer (reads along the rows), then
/// written out transposed (writes along the output rows).
fn transpose_into(
    n: usize,
    k: usize,
    dst: &mut [MaybeUninit<f32>],
    load: impl Fn(usize, &mut [f32]) + Sync,
) {
    use rayon::prelude::*;
    const T: usize = 64;
    const BAND: usize = 4 * T;
    debug_assert_eq!(dst.len(), n * k);
    if n == 0 || k == 0 {
        return;
    }
    // Each task owns BAND rows of dst (BAND columns of src).
    dst.par_chunks_mut(BAND * n)
        .enumerate()
        .for_each(|(band, d)| {
            let j0 = band * BAND;
            let rows = d.len() / n;
            let mut tile = vec![0f32; T * T];
            for i0 in (0..n).step_by(T) {
                let iw = T.min(n - i0);
                for jb in (0..rows).step_by(T) {
                    let jw = T.min(rows - jb);
                    for ii in 0..iw {
                        load((i0 + ii) * k + j0 + jb, &mut tile[ii * T..ii * T + jw]);
                    }
                    for jj in 0..jw {
                        let drow = &mut d[(jb + jj) * n + i0..][..iw];
                        for (ii, o) in drow.iter_mut().enumerate() {
                            o.write(tile[ii * T + jj]);
                        }
                    }
                }
            }
        });
}

/// Names of the tensors `arg` reads, in order (none for an argument that holds no tensor).
/// An iterator rather than a list: the load's passes ask this of every argument of every
/// node, and a list per argument was 8,383 of the 28,549 allocations of a MobileNetV3-Large
/// load (counted by valgrind's DHAT).
pub(crate) fn tensor_names(arg: &Argument) -> TensorNames<'_> {
    use crate::schema::OptionalTensorArgument as O;
    match arg {
        Argument::AsTensor(t) | Argument::AsOptionalTensor(O::AsTensor(t)) => {
            TensorNames::One(Some(t.name.as_str()))
        }
        Argument::AsTensors(ts) => TensorNames::Many(ts.iter()),
        Argument::AsOptionalTensors(ts) => TensorNames::Optional(ts.iter()),
        _ => TensorNames::One(None),
    }
}

/// What [`tensor_names`] returns.
#[derive(Clone)]
pub(crate) enum TensorNames<'a> {
    /// One tensor, or none.
    One(Option<&'a str>),
    /// A list of tensors.
    Many(std::slice::Iter<'a, crate::schema::TensorArgument>),
    /// A list of optional tensors, whose absent ones are skipped.
    Optional(std::slice::Iter<'a, crate::schema::OptionalTensorArgument>),
}

impl<'a> Iterator for TensorNames<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        use crate::schema::OptionalTensorArgument as O;
        match self {
            TensorNames::One(name) => name.take(),
            TensorNames::Many(ts) => ts.next().map(|t| t.name.as_str()),
            TensorNames::Optional(ts) => ts.find_map(|t| match t {
                O::AsTensor(t) => Some(t.name.as_str()),
                O::AsNone(_) => None,
            }),
        }
    }
}

/// Input `name` of `node`, if the serializer wrote it.
fn input_arg<'a>(node: &'a Node, name: &str) -> Option<&'a Argument> {
    node.inputs.iter().find(|a| a.name == name).map(|a| &a.arg)
}

/// The tensor named by input `name` of `node`, if it is one.
fn input_tensor<'a>(node: &'a Node, name: &str) -> Option<&'a str> {
    use crate::schema::OptionalTensorArgument as O;
    match input_arg(node, name)? {
        Argument::AsTensor(t) | Argument::AsOptionalTensor(O::AsTensor(t)) => Some(&t.name),
        _ => None,
    }
}

/// A float input of `node` (`default` when the serializer omitted it).
fn input_float(node: &Node, name: &str, default: f64) -> Option<f64> {
    match input_arg(node, name) {
        None => Some(default),
        Some(Argument::AsFloat(f)) => Some(f.get()),
        Some(Argument::AsInt(i)) => Some(*i as f64),
        Some(_) => None,
    }
}

/// A small f32/f64 weight's values as f64 (exactly `len` of them), or `None`.
fn values<S: BuildHasher>(
    weights: &HashMap<String, Tensor, S>,
    name: Option<&str>,
    len: usize,
) -> Option<Vec<f64>> {
    let t = weights.get(name?)?;
    if t.elem_count() != len || !matches!(t.dtype(), DType::F32 | DType::F64) {
        return None;
    }
    // A contiguous f32 tensor (every decoded weight) read in place, without a f64 copy.
    if let Some(v) = crate::ops::fused::with_f32(t, |v| v.iter().map(|&x| f64::from(x)).collect()) {
        return Some(v);
    }
    t.to_dtype(DType::F64)
        .ok()?
        .flatten_all()
        .ok()?
        .to_vec1()
        .ok()
}

/// Whether `node` is a (not transposed) convolution: `conv1d`, `conv2d`, `conv3d`, or
/// `convolution` with `transposed=False`.
fn is_forward_conv(node: &crate::schema::Node) -> bool {
    match op_key(&node.target) {
        "aten.conv2d.default" | "aten.conv1d.default" | "aten.conv3d.default" => true,
        "aten.convolution.default" => {
            matches!(input_arg(node, "transposed"), Some(Argument::AsBool(false)))
        }
        _ => false,
    }
}

/// A forward 2-d convolution with groups 1 whose input and output the graph's metadata
/// gives as static float32 `[N, C, H, W]`: its weight's name, and those sizes.
fn dense_conv<'g>(graph: &'g Graph, node: &'g Node) -> Option<(&'g str, [usize; 4], [usize; 4])> {
    let target = op_key(&node.target);
    if !matches!(target, "aten.conv2d.default" | "aten.convolution.default")
        || !is_forward_conv(node)
    {
        return None;
    }
    let groups = node.inputs.iter().find(|a| a.name == "groups");
    if groups.is_some_and(|g| !matches!(g.arg, Argument::AsInt(1))) {
        return None;
    }
    let (Some(x), Some(w), [Argument::AsTensor(y)]) = (
        input_tensor(node, "input"),
        input_tensor(node, "weight"),
        node.outputs.as_slice(),
    ) else {
        return None;
    };
    let sizes = |name: &str| -> Option<[usize; 4]> {
        let m = graph.tensor_values.get(name)?;
        let s: Vec<usize> = m
            .static_sizes()?
            .iter()
            .map(|&d| usize::try_from(d).ok())
            .collect::<Option<_>>()?;
        (m.dtype == crate::dtype::FLOAT).then(|| s.try_into().ok())?
    };
    Some((w, sizes(x)?, sizes(&y.name)?))
}

/// Run a convolution `node` as `target`, whose weight is stored in another layout: the
/// node keeps its arguments and gains `weight_shape`, the weight's sizes as the graph gave
/// them (`[out_channels, in_channels, kh, kw]`).
fn run_conv_as(node: &mut Node, target: &str, weight_shape: &[usize]) {
    node.target = target.to_string();
    node.inputs.push(crate::schema::NamedArgument {
        name: "weight_shape".into(),
        arg: Argument::AsInts(weight_shape.iter().map(|&d| d as i64).collect()),
        kind: None,
    });
}

/// Remove the nodes at the indices in `dropped` from `graph`, keeping the others' order.
fn drop_nodes<S: BuildHasher>(graph: &mut Graph, dropped: &HashSet<usize, S>) {
    let mut at = 0;
    graph.nodes.retain(|_| {
        at += 1;
        !dropped.contains(&(at - 1))
    });
}

/// A number by value name (borrowed from the graph), hashed with foldhash's fast hash: the
/// load builds these maps for every rewrite, which took 6.9% of MobileNetV3's load samples
/// with std's SipHash and tables grown as they filled, and 5% with a key of its own per name
/// (`perf`; BENCHMARKS.md, issue 14). A rewrite that changes the graph's nodes decides what
/// to change first, then changes it.
pub(crate) type Counts<'g> = crate::fast::HashMap<&'g str, usize>;

/// For each tensor value of `graph`: how many node inputs read it (a graph output counts as
/// a great many readers, so it is never rewritten away), and which node produces it (nodes
/// with one tensor output only).
pub(crate) fn readers_and_producers(graph: &Graph) -> (Counts<'_>, Counts<'_>) {
    // Every value is read at least once, most by one node: the nodes' outputs and the
    // placeholders.
    let values = graph.nodes.len() + graph.inputs.len();
    let mut readers = Counts::with_capacity_and_hasher(values, Default::default());
    for node in &graph.nodes {
        for a in &node.inputs {
            for n in tensor_names(&a.arg) {
                *readers.entry(n).or_default() += 1;
            }
        }
    }
    for o in &graph.outputs {
        for n in tensor_names(o) {
            *readers.entry(n).or_default() += usize::MAX / 4;
        }
    }
    let mut producer = Counts::with_capacity_and_hasher(graph.nodes.len(), Default::default());
    for (i, node) in graph.nodes.iter().enumerate() {
        if let [Argument::AsTensor(t)] = node.outputs.as_slice() {
            producer.insert(t.name.as_str(), i);
        }
    }
    (readers, producer)
}

/// Whether one of `nodes` is an in-place op whose `self` (or `input`), which it rebinds, is a
/// tensor `read` accepts: a rewrite that moves a read of that tensor past such a node would
/// read the new value.
fn rebinds_any(nodes: &[Node], read: impl Fn(&str) -> bool) -> bool {
    nodes.iter().any(|n| {
        crate::ops::is_in_place(op_key(&n.target))
            && (input_tensor(n, "self").or(input_tensor(n, "input"))).is_some_and(&read)
    })
}

/// Whether the graph's metadata gives tensors `a` and `b` the same dtype and sizes (symbolic
/// sizes by their expressions).
fn same_meta(graph: &Graph, a: &str, b: &str) -> bool {
    use crate::schema::SymInt;
    let (Some(ma), Some(mb)) = (graph.tensor_values.get(a), graph.tensor_values.get(b)) else {
        return false;
    };
    let same_size = |x: &SymInt, y: &SymInt| match (x, y) {
        (SymInt::AsInt(x), SymInt::AsInt(y)) => x == y,
        (SymInt::AsExpr(x), SymInt::AsExpr(y)) => x.expr_str == y.expr_str,
        _ => false,
    };
    ma.dtype == mb.dtype
        && ma.sizes.len() == mb.sizes.len()
        && ma.sizes.iter().zip(&mb.sizes).all(|(x, y)| same_size(x, y))
}

/// Fold each inference batch norm into the convolution that feeds it, when that convolution's
/// output is read by nothing else: the conv's weight is scaled per output channel by
/// `gamma / sqrt(var + eps)` and its bias becomes `(bias - mean) * that + beta` (computed in
/// f64, stored as f32, as new weights), the conv then defines the norm's output and the norm
/// node is dropped. Handles `aten.batch_norm` with `training=False` and
/// `_native_batch_norm_legit_no_training` (whose saved statistics must be unread), convs with
/// or without a bias, norms with or without affine parameters. Returns how many were folded;
/// weights nothing reads any more are dropped.
pub fn fold_batch_norms<S: BuildHasher>(
    graph: &mut Graph,
    weights: &mut HashMap<String, Tensor, S>,
) -> usize {
    let none = (FastSet::default(), FastMap::default());
    fold_batch_norms_with(graph, weights, false, &none.0, &none.1, None).unwrap_or(0)
}

/// [`fold_batch_norms`]; `in_place`: the caller owns every tensor of `weights` (nothing
/// outside it holds one, as for the weights `Program::load` decodes), so a conv weight that
/// only the folded conv reads, under one name, is scaled in place instead of copied.
/// `prescaled`: conv weights (by name in `graph`) whose values the load already multiplied
/// by their fold's scale as it decoded them ([`plan_bn_folds`] decided that fold on the same
/// graph and values); they are used as they are. One of them whose norm does not fold is an
/// error, never a silently scaled weight. `packed_dims`: the shapes of weights the load
/// decoded packed (1-d tensors), by tensor. `planned`: the folds [`plan_bn_folds`] finds on
/// this graph with these weights' values, where the caller has them already (the load
/// planned them: [`plan_bn_folds`] then does not run again).
pub(crate) fn fold_batch_norms_with<S: BuildHasher>(
    graph: &mut Graph,
    weights: &mut HashMap<String, Tensor, S>,
    in_place: bool,
    prescaled: &FastSet<String>,
    packed_dims: &FastMap<candle_core::TensorId, Vec<usize>>,
    planned: Option<Vec<BnFold>>,
) -> Result<usize, String> {
    use crate::schema::{NamedArgument, TensorArgument};
    let (readers, producer) = readers_and_producers(graph);
    let plans = match planned {
        Some(plans) => plans,
        None => plan_bn_folds(
            graph,
            (&readers, &producer),
            |n| {
                let w = weights.get(n)?;
                let dims = packed_dims.get(&w.id()).cloned();
                (w.dtype() == DType::F32).then(|| dims.unwrap_or_else(|| w.dims().to_vec()))
            },
            |n, len| values(weights, Some(n), len),
            |n| weights.contains_key(n),
        ),
    };
    // The weights their conv alone reads (decided before the convs change).
    let sole_reader: FastSet<String> = plans
        .iter()
        .filter(|p| readers.get(p.weight.as_str()) == Some(&1))
        .map(|p| p.weight.clone())
        .collect();
    if let Some(w) = prescaled
        .iter()
        .find(|w| !plans.iter().any(|p| &p.weight == *w))
    {
        return Err(format!(
            "weight '{w}' was scaled for a batch norm fold that the build does not make"
        ));
    }
    // How many names each tensor is bound to (a tensor under two names is shared).
    let mut names_of: FastMap<candle_core::TensorId, usize> = FastMap::default();
    for t in weights.values() {
        *names_of.entry(t.id()).or_default() += 1;
    }
    let mut dropped: FastSet<usize> = FastSet::default();
    let mut folded = 0;
    for plan in plans {
        let scaled = prescaled.contains(&plan.weight);
        let unfolded = || format!("weight '{}' was scaled but its fold failed", plan.weight);
        let Some(w) = weights.get(&plan.weight) else {
            if scaled {
                return Err(unfolded());
            }
            continue;
        };
        if packed_dims.contains_key(&w.id()) && !scaled {
            // Decoded packed but not scaled (a weight bound to two names): its values are
            // not in the layout a fold scales, so its norm stays a node of its own.
            continue;
        }
        let co = plan.scale.len();
        let (wn, bname) = (
            format!("{}__folded_weight", plan.out),
            format!("{}__folded_bias", plan.out),
        );
        let Ok(new_b) = Tensor::from_vec(plan.bias, co, w.device()) else {
            if scaled {
                return Err(unfolded());
            }
            continue;
        };
        let sole = in_place
            && sole_reader.contains(&plan.weight)
            && names_of.get(&w.id()) == Some(&1)
            && w.is_contiguous();
        let new_w = if scaled || (sole && w.inplace_op1(&ScaleChannels(&plan.scale)).is_ok()) {
            w.clone()
        } else {
            let Some(wv) = scale_channels(w, &plan.scale) else {
                continue;
            };
            let Ok(t) = Tensor::from_vec(wv, w.shape(), w.device()) else {
                continue;
            };
            t
        };
        weights.insert(wn.clone(), new_w);
        weights.insert(bname.clone(), new_b);
        // Free the old weight now if this conv was its only reader (rather than at the end,
        // which would hold every folded convolution's weight twice).
        if sole_reader.contains(&plan.weight) {
            weights.remove(&plan.weight);
        }
        let conv = &mut graph.nodes[plan.conv];
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
        conv.outputs = vec![tensor(plan.out)];
        dropped.insert(plan.norm);
        folded += 1;
    }
    if folded > 0 {
        drop_nodes(graph, &dropped);
        let mut read: FastSet<&str> = FastSet::default();
        for node in &graph.nodes {
            for a in &node.inputs {
                read.extend(tensor_names(&a.arg));
            }
        }
        for o in &graph.outputs {
            read.extend(tensor_names(o));
        }
        weights.retain(|name, _| read.contains(name.as_str()));
    }
    Ok(folded)
}

/// One batch norm that [`fold_batch_norms`] folds into the convolution before it.
#[derive(Clone, Debug)]
pub(crate) struct BnFold {
    /// The norm's node index.
    pub norm: usize,
    /// The convolution's node index.
    pub conv: usize,
    /// The norm's output: the folded convolution's.
    pub out: String,
    /// The convolution's weight.
    pub weight: String,
    /// Per output channel, `gamma / sqrt(var + eps)`: what the weight is multiplied by.
    pub scale: Vec<f64>,
    /// The folded convolution's bias, `(bias - mean) * scale + beta`.
    pub bias: Vec<f32>,
}

/// The batch norms of `graph` that fold, in graph order. What is known of a tensor by name
/// comes from `f32_dims` (the sizes of a float32 tensor), `values` (exactly `len` values of a
/// small float tensor, as f64) and `taken` (whether the name is bound already); `links` is
/// [`readers_and_producers`] of `graph`. The one decision behind both the fold at build and
/// the load's scaling of conv weights as it decodes them (`archive::decode`): given the same
/// graph and values, both fold the same norms with the same scales.
pub(crate) fn plan_bn_folds(
    graph: &Graph,
    links: (&Counts, &Counts),
    f32_dims: impl Fn(&str) -> Option<Vec<usize>>,
    values: impl Fn(&str, usize) -> Option<Vec<f64>>,
    taken: impl Fn(&str) -> bool,
) -> Vec<BnFold> {
    let (readers, producer) = links;
    let mut plans = Vec::new();
    for (i, bn) in graph.nodes.iter().enumerate() {
        let out = match (op_key(&bn.target), bn.outputs.as_slice()) {
            ("aten.batch_norm.default", [Argument::AsTensor(y)]) => {
                if !matches!(input_arg(bn, "training"), Some(Argument::AsBool(false))) {
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
        let Some(w_name) = input_tensor(conv, "weight") else {
            continue;
        };
        let Some(dims) = f32_dims(w_name) else {
            continue;
        };
        if !is_forward_conv(conv) || dims.len() < 3 {
            continue;
        }
        let co = dims[0];
        let get = |n: Option<&str>| values(n?, co);
        let (Some(mean), Some(var), Some(eps)) = (
            get(input_tensor(bn, "running_mean")),
            get(input_tensor(bn, "running_var")),
            input_float(bn, "eps", 1e-5),
        ) else {
            continue;
        };
        let affine = |name: &str, fill: f64| match input_tensor(bn, name) {
            None => Some(vec![fill; co]),
            n => get(n),
        };
        let conv_bias = match input_tensor(conv, "bias") {
            None => Some(vec![0.0; co]),
            n => get(n),
        };
        let (Some(gamma), Some(beta), Some(cb)) =
            (affine("weight", 1.0), affine("bias", 0.0), conv_bias)
        else {
            continue;
        };
        if taken(&format!("{out}__folded_weight")) || taken(&format!("{out}__folded_bias")) {
            continue;
        }
        let (scale, bias) = bn_fold_terms([&gamma, &beta, &mean, &var, &cb], eps);
        plans.push(BnFold {
            norm: i,
            conv: j,
            out,
            weight: w_name.to_string(),
            scale,
            bias,
        });
    }
    plans
}

/// A batch norm's fold, per channel `c` of `[gamma, beta, mean, var, conv_bias]` (equally
/// long): the scale `gamma / sqrt(var + eps)` and the folded bias
/// `(conv_bias - mean) * scale + beta` (as f32). In wide registers where the CPU has them
/// (a square root and a division per channel, one at a time, were most of the time a plan
/// of EfficientNet-B0's 21,008 channels took: its plans took a quarter less time so,
/// BENCHMARKS.md). Square root, division and the rest are correctly rounded in every width,
/// so the values are the same either way.
fn bn_fold_terms(terms: [&[f64]; 5], eps: f64) -> (Vec<f64>, Vec<f32>) {
    let [gamma, beta, mean, var, conv_bias] = terms;
    let co = gamma.len();
    let (mut scale, mut bias) = (vec![0f64; co], vec![0f32; co]);
    crate::ops::fused::simd(
        #[inline(always)]
        || {
            for (s, (g, v)) in scale.iter_mut().zip(gamma.iter().zip(var)) {
                *s = g / (v + eps).sqrt();
            }
            let terms = conv_bias.iter().zip(mean).zip(scale.iter().zip(beta));
            for (b, ((cb, m), (s, beta))) in bias.iter_mut().zip(terms) {
                *b = ((cb - m) * s + beta) as f32;
            }
        },
    );
    (scale, bias)
}

/// Whether `node` is an inference batch norm of the two forms [`plan_bn_folds`] folds
/// (`aten.batch_norm`, `_native_batch_norm_legit_no_training`), foldable or not.
pub(crate) fn is_batch_norm(node: &crate::schema::Node) -> bool {
    matches!(
        op_key(&node.target),
        "aten.batch_norm.default" | "aten._native_batch_norm_legit_no_training.default"
    )
}

/// `w` (f32, `[co, ...]`, `scale.len() == co`) with each output channel `c` multiplied by
/// `scale[c]` (in f64, rounded to f32), as a new vector: one pass over a contiguous weight,
/// channels in parallel.
fn scale_channels(w: &Tensor, scale: &[f64]) -> Option<Vec<f32>> {
    use rayon::prelude::*;
    let per = w.elem_count() / scale.len().max(1);
    let mul = |src: &[f32]| {
        let mut out = vec![0f32; src.len()];
        if per > 0 {
            out.par_chunks_mut(per)
                .zip(src.par_chunks(per))
                .zip(scale.par_iter())
                .for_each(|((o, x), &s)| {
                    for (o, &v) in o.iter_mut().zip(x) {
                        *o = bn_scaled(v, s);
                    }
                });
        }
        out
    };
    match crate::ops::fused::with_f32(w, mul) {
        Some(v) => Some(v),
        None => w
            .flatten_all()
            .ok()
            .and_then(|t| t.to_vec1::<f32>().ok())
            .map(|v| mul(&v)),
    }
}

/// A conv weight's value `v` multiplied by its channel's batch-norm scale `s`: in f64,
/// rounded to f32. The one product behind [`scale_channels`], [`ScaleChannels`] and the
/// load's scaled decode (`archive::decode`), so that the three give the same bits.
#[inline(always)]
pub(crate) fn bn_scaled(v: f32, s: f64) -> f32 {
    (f64::from(v) * s) as f32
}

/// Multiplies each output channel `c` of a contiguous f32 weight by `scale[c]` in place, as
/// [`scale_channels`] computes it.
struct ScaleChannels<'a>(&'a [f64]);

impl candle_core::InplaceOp1 for ScaleChannels<'_> {
    fn name(&self) -> &'static str {
        "scale-channels"
    }

    fn cpu_fwd(
        &self,
        storage: &mut candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> candle_core::Result<()> {
        use rayon::prelude::*;
        let (candle_core::CpuStorage::F32(v), Some((start, end))) =
            (storage, layout.contiguous_offsets())
        else {
            return Err(candle_core::Error::Msg(
                "not a contiguous f32 tensor".into(),
            ));
        };
        let w = &mut v[start..end];
        let per = w.len() / self.0.len().max(1);
        if per > 0 {
            w.par_chunks_mut(per)
                .zip(self.0.par_iter())
                .for_each(|(o, &s)| {
                    // In wide registers where the CPU has them. `Program::load` now scales
                    // most folded weights as it decodes them (`archive::decode`); this pass,
                    // bound by memory, is left for the weights it does not.
                    crate::ops::fused::simd_map_mut(o, move |v| bn_scaled(v, s));
                });
        }
        Ok(())
    }
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
    // (activation node, conv node, activation, the activation's output): a conv's output
    // has one reader, so no conv is chosen twice.
    let mut fusions = Vec::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        let Some(act) = Act::of_op(op_key(&node.target)) else {
            continue;
        };
        let (Some(x), [Argument::AsTensor(y)]) =
            (input_tensor(node, "self"), node.outputs.as_slice())
        else {
            continue;
        };
        let (Some(&j), Some(1)) = (producer.get(x), readers.get(x).copied()) else {
            continue;
        };
        let conv = &graph.nodes[j];
        let conv_ok = is_forward_conv(conv);
        if !conv_ok || conv.inputs.iter().any(|a| a.name == FUSED_ACT_ARG) {
            continue;
        }
        fusions.push((i, j, act, y.name.clone()));
    }
    let mut dropped: HashSet<usize> = HashSet::new();
    let mut fused = 0;
    for (i, j, act, y) in fusions {
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
    drop_nodes(graph, &dropped);
    fused
}

/// Fold a residual add into the convolution that produces one of its operands, with the
/// relu / silu / hardswish that may follow it: `act(conv(x) + r)` becomes one conv node that
/// starts its output from `r` (under [`FUSED_RESIDUAL_ARG`](crate::ops::conv::FUSED_RESIDUAL_ARG))
/// and accumulates the product onto it, as ResNet's blocks and MobileNet's inverted residuals
/// end. The add is `add.Tensor` or `add_.Tensor` with alpha 1 whose `self` (either operand for
/// `add`) is the output of a forward conv that nothing else reads, and the graph's metadata
/// gives both operands the same sizes and dtype. The conv node takes the add's place (the
/// residual may be computed after the conv, as a downsampling branch is), defines the add's (or
/// the activation's) output, and the other nodes are dropped. Run after
/// [`fuse_conv_activations`]. Returns how many.
pub fn fuse_conv_residuals(graph: &mut Graph) -> usize {
    use crate::ops::conv::{Act, FUSED_ACT_ARG, FUSED_RESIDUAL_ARG};
    use crate::schema::{NamedArgument, TensorArgument};
    let (readers, producer) = readers_and_producers(graph);
    let same_meta = |a: &str, b: &str| same_meta(graph, a, b);
    // (add node, conv node, residual, activation node if any)
    type Plan = (usize, usize, String, Option<(usize, Act)>);
    let mut plans: Vec<Plan> = Vec::new();
    let mut taken: HashSet<usize> = HashSet::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        let key = op_key(&node.target);
        let in_place = key == "aten.add_.Tensor";
        if !(in_place || key == "aten.add.Tensor") || input_float(node, "alpha", 1.0) != Some(1.0) {
            continue;
        }
        let (Some(a), Some(b), [Argument::AsTensor(y)]) = (
            input_tensor(node, "self"),
            input_tensor(node, "other"),
            node.outputs.as_slice(),
        ) else {
            continue;
        };
        // `add_` rebinds its `self`: only a conv output that nothing else reads may be it.
        let pairs = if in_place {
            vec![(a, b)]
        } else {
            vec![(a, b), (b, a)]
        };
        let Some((j, r)) = pairs.into_iter().find_map(|(c, r)| {
            let j = *producer.get(c).filter(|&&j| j < i)?;
            let conv = &graph.nodes[j];
            // The conv moves down to the add: nothing between may rebind what it reads (an
            // in-place op's `self`).
            let reads: Vec<&str> = conv
                .inputs
                .iter()
                .flat_map(|a| tensor_names(&a.arg))
                .collect();
            let rebinds = rebinds_any(&graph.nodes[j + 1..i], |s| reads.contains(&s));
            let free = readers.get(c) == Some(&1)
                && c != r
                && !rebinds
                && is_forward_conv(conv)
                && !taken.contains(&j)
                && !conv.inputs.iter().any(|a| a.name == FUSED_ACT_ARG)
                && same_meta(c, r);
            free.then_some((j, r))
        }) else {
            continue;
        };
        // The activation after, when it is the add's only reader.
        let act = (readers.get(y.name.as_str()) == Some(&1))
            .then(|| {
                graph
                    .nodes
                    .iter()
                    .enumerate()
                    .skip(i + 1)
                    .find_map(|(k, n)| {
                        let act = Act::of_op(op_key(&n.target))?;
                        let one_out = matches!(n.outputs.as_slice(), [Argument::AsTensor(_)]);
                        (input_tensor(n, "self") == Some(y.name.as_str()) && one_out)
                            .then_some((k, act))
                    })
            })
            .flatten();
        taken.insert(j);
        plans.push((i, j, r.to_string(), act));
    }
    let mut dropped: HashSet<usize> = HashSet::new();
    for (i, j, r, act) in &plans {
        let mut conv = graph.nodes[*j].clone();
        conv.inputs.push(NamedArgument {
            name: FUSED_RESIDUAL_ARG.into(),
            arg: Argument::AsTensor(TensorArgument { name: r.clone() }),
            kind: None,
        });
        let mut out = graph.nodes[*i].outputs.clone();
        if let Some((k, act)) = act {
            conv.inputs.push(NamedArgument {
                name: FUSED_ACT_ARG.into(),
                arg: Argument::AsString(act.name().into()),
                kind: None,
            });
            out = graph.nodes[*k].outputs.clone();
            dropped.insert(*k);
        }
        conv.outputs = out;
        graph.nodes[*i] = conv;
        dropped.insert(*j);
    }
    drop_nodes(graph, &dropped);
    plans.len()
}

/// Drop each dropout outside training (`aten.dropout.default` with `train=False`), which
/// returns its input itself, and let its readers read that input: a residual add after a
/// Linear's dropout then reads the Linear's output, which [`fuse_linear_epilogues`] can fold
/// into the Linear. Left alone: a dropout whose output the graph returns, and one where an
/// in-place op rebinds its input or output. Returns how many.
pub fn drop_inference_dropouts(graph: &mut Graph) -> usize {
    let mut renames: FastMap<String, String> = FastMap::default();
    let mut dropped: HashSet<usize> = HashSet::new();
    let returned: FastSet<&str> = graph.outputs.iter().flat_map(tensor_names).collect();
    // What in-place ops rebind (as `rebinds_any` reads them).
    let rebound: FastSet<&str> = graph
        .nodes
        .iter()
        .filter(|n| crate::ops::is_in_place(op_key(&n.target)))
        .filter_map(|n| input_tensor(n, "self").or(input_tensor(n, "input")))
        .collect();
    for (i, node) in graph.nodes.iter().enumerate() {
        if op_key(&node.target) != "aten.dropout.default" {
            continue;
        }
        let (Some(x), [Argument::AsTensor(y)], Some(Argument::AsBool(false))) = (
            input_tensor(node, "input"),
            node.outputs.as_slice(),
            input_arg(node, "train"),
        ) else {
            continue;
        };
        // A dropout of a dropped dropout reads what that one read.
        let x = renames.get(x).map_or(x, String::as_str);
        let y = y.name.as_str();
        if returned.contains(y) || rebound.contains(x) || rebound.contains(y) {
            continue;
        }
        renames.insert(y.to_string(), x.to_string());
        dropped.insert(i);
    }
    drop_nodes(graph, &dropped);
    for node in &mut graph.nodes {
        for a in &mut node.inputs {
            crate::views::rename(&mut a.arg, &renames);
        }
    }
    dropped.len()
}

/// Run each max pool whose indices nothing reads as the pool without indices: the decomposed
/// export writes `max_pool2d` as `max_pool2d_with_indices` (and `max_pool1d` and `max_pool3d`
/// likewise), whose general kernel computes both outputs one value at a time, while the pool
/// without indices has a vectorised kernel giving the same values. The node's target changes
/// and its unread indices output becomes `None`. Returns how many.
pub fn drop_unread_pool_indices(graph: &mut Graph) -> usize {
    let (readers, _) = readers_and_producers(graph);
    let pools: Vec<(usize, &str)> = graph
        .nodes
        .iter()
        .enumerate()
        .filter_map(|(i, node)| {
            let plain = match op_key(&node.target) {
                "aten.max_pool2d_with_indices.default" => "aten.max_pool2d.default",
                "aten.max_pool1d_with_indices.default" => "aten.max_pool1d.default",
                "aten.max_pool3d_with_indices.default" => "aten.max_pool3d.default",
                _ => return None,
            };
            let [Argument::AsTensor(_), Argument::AsTensor(indices)] = node.outputs.as_slice()
            else {
                return None;
            };
            (!readers.contains_key(indices.name.as_str())).then_some((i, plain))
        })
        .collect();
    for &(i, plain) in &pools {
        let node = &mut graph.nodes[i];
        node.target = format!("torch.ops.{plain}");
        node.outputs[1] = Argument::AsNone(serde_json::Value::Null);
    }
    pools.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call: `(target, [(arg name, tensor name)], output)`.
    type Call<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);

    /// A graph of calls over float32 tensors of the given sizes, returning `out`.
    fn graph(calls: &[Call], sizes: &[(&str, &[i64])], out: &str) -> Graph {
        use serde_json::json;
        let nodes: Vec<_> = calls
            .iter()
            .map(|(target, args, y)| {
                let inputs: Vec<_> = args
                    .iter()
                    .map(|(n, t)| json!({"name": n, "arg": {"as_tensor": {"name": t}}}))
                    .collect();
                json!({"target": format!("torch.ops.aten.{target}"), "inputs": inputs,
                       "outputs": [{"as_tensor": {"name": y}}]})
            })
            .collect();
        let meta: serde_json::Map<_, _> = sizes
            .iter()
            .map(|(n, s)| {
                let sizes: Vec<_> = s.iter().map(|v| json!({ "as_int": v })).collect();
                let m = json!({"dtype": 7, "sizes": sizes, "device": {"type": "cpu"},
                               "strides": [], "storage_offset": {"as_int": 0}, "layout": 7});
                (n.to_string(), m)
            })
            .collect();
        serde_json::from_value(json!({
            "inputs": [], "outputs": [{"as_tensor": {"name": out}}], "nodes": nodes,
            "tensor_values": meta,
        }))
        .unwrap()
    }

    /// A max pool's indices output that nothing reads is dropped and the node runs as the
    /// pool without indices; indices that a node reads, or the graph returns, are kept.
    #[test]
    fn unread_pool_indices_are_dropped() {
        let calls: [Call; 4] = [
            ("max_pool2d_with_indices.default", &[("self", "x")], "y"),
            ("max_pool1d_with_indices.default", &[("self", "x")], "z"),
            ("max_pool2d_with_indices.default", &[("self", "x")], "u"),
            ("max_pool3d_with_indices.default", &[("self", "x")], "v"),
        ];
        let mut g = graph(&calls, &[], "u_idx");
        for (node, idx) in g.nodes.iter_mut().zip(["y_idx", "z_idx", "u_idx", "v_idx"]) {
            node.outputs
                .push(Argument::AsTensor(crate::schema::TensorArgument {
                    name: idx.into(),
                }));
        }
        // The second pool's indices are read by a node.
        let mut g2 = graph(&[("neg.default", &[("self", "z_idx")], "w")], &[], "w");
        g.nodes.push(g2.nodes.remove(0));
        assert_eq!(drop_unread_pool_indices(&mut g), 2);
        assert_eq!(op_key(&g.nodes[0].target), "aten.max_pool2d.default");
        assert!(matches!(g.nodes[0].outputs[1], Argument::AsNone(_)));
        assert!(matches!(&g.nodes[0].outputs[0], Argument::AsTensor(t) if t.name == "y"));
        assert_eq!(op_key(&g.nodes[3].target), "aten.max_pool3d.default");
        assert!(matches!(g.nodes[3].outputs[1], Argument::AsNone(_)));
        for node in &g.nodes[1..3] {
            assert!(op_key(&node.target).ends_with("_with_indices.default"));
            assert!(matches!(node.outputs[1], Argument::AsTensor(_)));
        }
    }

    /// An activation that alone reads a convolution's output is folded into it (in place or
    /// not); one whose conv output is read elsewhere too, or that reads no conv, stays.
    #[test]
    fn conv_activations_fold_into_their_sole_conv() {
        let calls: [Call; 8] = [
            ("conv2d.default", &[("input", "x"), ("weight", "w")], "c1"),
            ("relu.default", &[("self", "c1")], "y1"),
            ("conv2d.default", &[("input", "y1"), ("weight", "w")], "c2"),
            ("silu.default", &[("self", "c2")], "y2"),
            ("add.Tensor", &[("self", "c2"), ("other", "y2")], "z"),
            ("conv2d.default", &[("input", "z"), ("weight", "w")], "c3"),
            ("hardswish_.default", &[("self", "c3")], "y3"),
            ("relu.default", &[("self", "y3")], "out"),
        ];
        let mut g = graph(&calls, &[], "out");
        assert_eq!(fuse_conv_activations(&mut g), 2);
        let targets: Vec<&str> = g.nodes.iter().map(|n| op_key(&n.target)).collect();
        let want = [
            "aten.conv2d.default",
            "aten.conv2d.default",
            "aten.silu.default",
            "aten.add.Tensor",
            "aten.conv2d.default",
            "aten.relu.default",
        ];
        assert_eq!(targets, want);
        let fused = |i: usize| {
            let act = g.nodes[i]
                .inputs
                .iter()
                .find(|a| a.name == crate::ops::conv::FUSED_ACT_ARG);
            let out = match g.nodes[i].outputs.as_slice() {
                [Argument::AsTensor(t)] => t.name.as_str(),
                _ => "",
            };
            (act.map(|a| a.arg.clone()), out)
        };
        assert!(matches!(fused(0), (Some(Argument::AsString(a)), "y1") if a == "relu"));
        assert!(matches!(fused(1), (None, "c2")));
        assert!(matches!(fused(4), (Some(Argument::AsString(a)), "y3") if a == "hardswish"));
    }

    /// Only the Linears reading a packed weight are rewritten, with its shape; a
    /// packed weight that anything else reads (or the graph returns) is refused, not handed
    /// over in its packed layout.
    #[test]
    fn linears_with_packed_weights_are_rewritten_and_other_readers_refused() {
        let calls: [Call; 2] = [
            ("linear.default", &[("input", "x"), ("weight", "w")], "y"),
            ("linear.default", &[("input", "y"), ("weight", "v")], "z"),
        ];
        let packed: HashMap<String, (usize, usize)> = [("w".to_string(), (8, 4))].into();
        let mut g = graph(&calls, &[], "z");
        assert_eq!(pack_linears(&mut g, &packed), Ok(1));
        assert_eq!(g.nodes[0].target, crate::ops::packed::TARGET);
        assert_eq!(op_key(&g.nodes[1].target), "aten.linear.default");
        let ints: Vec<(&str, i64)> = g.nodes[0]
            .inputs
            .iter()
            .filter_map(|a| match a.arg {
                Argument::AsInt(v) => Some((&*a.name, v)),
                _ => None,
            })
            .collect();
        assert_eq!(ints, [("out_features", 8), ("in_features", 4)]);
        // Read by something else too.
        let calls: [Call; 2] = [
            ("linear.default", &[("input", "x"), ("weight", "w")], "y"),
            ("mul.Tensor", &[("self", "y"), ("other", "w")], "z"),
        ];
        let err = pack_linears(&mut graph(&calls, &[], "z"), &packed).unwrap_err();
        assert!(err.contains("'w'") && err.contains("mul.Tensor"), "{err}");
        // Returned by the graph.
        let calls: [Call; 1] = [("linear.default", &[("input", "x"), ("weight", "w")], "y")];
        let err = pack_linears(&mut graph(&calls, &[], "w"), &packed).unwrap_err();
        assert!(err.contains("output"), "{err}");
    }

    /// The decomposed export's Linears (`mm(x, t(w))`, `addmm(b, x, t(w))`) become Linears,
    /// the transposes left unread dropped; not where the result would differ (`beta` not 1,
    /// a bias that is not `[n]`) or the operand is not a weight; a transpose read elsewhere
    /// too is kept.
    #[test]
    fn decomposed_linears_become_linears() {
        let sizes: [(&str, &[i64]); 5] = [
            ("w", &[8, 4]),
            ("v", &[6, 8]),
            ("b", &[6]),
            ("b2", &[1, 6]),
            ("x", &[3, 4]),
        ];
        let weight = |n: &str| ["w", "v", "b", "b2"].contains(&n);
        let calls: [Call; 4] = [
            ("t.default", &[("self", "w")], "wt"),
            ("mm.default", &[("self", "x"), ("mat2", "wt")], "y"),
            ("t.default", &[("self", "v")], "vt"),
            (
                "addmm.default",
                &[("self", "b"), ("mat1", "y"), ("mat2", "vt")],
                "z",
            ),
        ];
        let mut g = graph(&calls, &sizes, "z");
        assert_eq!(linears_from_products(&mut g, weight), 2);
        let summary = |g: &Graph| -> Vec<(String, Vec<(String, String)>)> {
            g.nodes
                .iter()
                .map(|n| {
                    let args = n.inputs.iter().filter_map(|a| match &a.arg {
                        Argument::AsTensor(t) => Some((a.name.to_string(), t.name.clone())),
                        _ => None,
                    });
                    (op_key(&n.target).to_string(), args.collect())
                })
                .collect()
        };
        let s = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(
            summary(&g),
            [
                (
                    "aten.linear.default".to_string(),
                    vec![s("input", "x"), s("weight", "w")]
                ),
                (
                    "aten.linear.default".to_string(),
                    vec![s("input", "y"), s("weight", "v"), s("bias", "b")]
                ),
            ]
        );
        // beta 2; a [1, 6] bias; not a weight: left as they are.
        let mut g = graph(&calls, &sizes, "z");
        g.nodes[3].inputs.push(
            serde_json::from_value(serde_json::json!({"name": "beta", "arg": {"as_float": 2.0}}))
                .unwrap(),
        );
        assert_eq!(linears_from_products(&mut g, weight), 1);
        assert_eq!(op_key(&g.nodes[1].target), "aten.t.default");
        assert_eq!(op_key(&g.nodes[2].target), "aten.addmm.default");
        let mut calls2 = calls;
        calls2[3].1 = &[("self", "b2"), ("mat1", "y"), ("mat2", "vt")];
        let mut g = graph(&calls2, &sizes, "z");
        assert_eq!(linears_from_products(&mut g, weight), 1);
        assert_eq!(op_key(&g.nodes[2].target), "aten.addmm.default");
        let mut g = graph(&calls, &sizes, "z");
        assert_eq!(linears_from_products(&mut g, |n| n != "w" && weight(n)), 1);
        assert_eq!(op_key(&g.nodes[1].target), "aten.mm.default");
        // The transpose read by something else too: kept, the mm rewritten.
        let mut calls3 = calls.to_vec();
        calls3.push(("mul.Tensor", &[("self", "wt"), ("other", "wt")], "m"));
        let mut g = graph(&calls3, &sizes, "z");
        assert_eq!(linears_from_products(&mut g, weight), 2);
        assert_eq!(op_key(&g.nodes[0].target), "aten.t.default");
        assert_eq!(op_key(&g.nodes[1].target), "aten.linear.default");
        assert_eq!(g.nodes.len(), 4);
    }

    /// Weights read as a product's right operand as they are (`[k, n]`: GPT-2's `Conv1D`)
    /// are packable from their columns, a Linear's from its rows; one read both ways, or by
    /// an `addmm` that is not `x @ w + b` (a `[1, n]` bias), is not. The products are
    /// rewritten to the packed kernel with its inputs' names.
    #[test]
    fn products_with_a_weight_are_packed_in_their_layout() {
        use crate::ops::packed::Source;
        let sizes: [(&str, &[i64]); 5] = [
            ("w", &[4, 8]),
            ("b", &[8]),
            ("v", &[6, 8]),
            ("u", &[8, 5]),
            ("b2", &[1, 5]),
        ];
        let calls: [Call; 4] = [
            (
                "addmm.default",
                &[("self", "b"), ("mat1", "x"), ("mat2", "w")],
                "y",
            ),
            ("linear.default", &[("input", "y"), ("weight", "v")], "z"),
            (
                "addmm.default",
                &[("self", "b2"), ("mat1", "y"), ("mat2", "u")],
                "o",
            ),
            ("mm.default", &[("self", "y"), ("mat2", "u")], "p"),
        ];
        let g = graph(&calls, &sizes, "z");
        let found = packable_weights(&g, |n| ["w", "v", "u", "b", "b2"].contains(&n));
        let want: HashMap<&str, Source> = [("w", Source::Columns), ("v", Source::Rows)].into();
        assert_eq!(found, want);
        let mut g = graph(&calls[..2], &sizes, "z");
        let packed: HashMap<String, (usize, usize)> =
            [("w".to_string(), (8, 4)), ("v".to_string(), (6, 8))].into();
        assert_eq!(pack_linears(&mut g, &packed), Ok(2));
        let names: Vec<Vec<&str>> = g
            .nodes
            .iter()
            .map(|n| n.inputs.iter().map(|a| &*a.name).collect())
            .collect();
        assert_eq!(
            names,
            [
                vec!["input", "weight", "bias", "out_features", "in_features"],
                vec!["input", "weight", "out_features", "in_features"],
            ]
        );
        assert!(g
            .nodes
            .iter()
            .all(|n| n.target == crate::ops::packed::TARGET));
    }

    /// The residual fold on small graphs: folded (with the relu after) when the conv's output
    /// only feeds the add; declined when an in-place op between the conv and the add rebinds
    /// the conv's input, when the graph lists the producer after the add (no panic), when the
    /// operands' sizes differ, and for `add_` whose `self` is the residual.
    #[test]
    fn residual_fold_applies_only_where_it_is_exact() {
        let conv: Call = ("conv2d.default", &[("input", "x"), ("weight", "w")], "c");
        let add: Call = ("add.Tensor", &[("self", "c"), ("other", "r")], "y");
        let relu: Call = ("relu_.default", &[("self", "y")], "z");
        let same: &[(&str, &[i64])] = &[("c", &[1, 4, 5, 5]), ("r", &[1, 4, 5, 5])];
        let folds = |calls: &[Call], sizes, out| {
            let mut g = graph(calls, sizes, out);
            let n = fuse_conv_residuals(&mut g);
            (n, g.nodes.len())
        };
        assert_eq!(folds(&[conv, add], same, "y"), (1, 1));
        assert_eq!(folds(&[conv, add, relu], same, "z"), (1, 1));
        let rebind: Call = ("relu_.default", &[("self", "x")], "x2");
        assert_eq!(folds(&[conv, rebind, add], same, "y"), (0, 3));
        assert_eq!(folds(&[add, conv], same, "y"), (0, 2));
        let other: &[(&str, &[i64])] = &[("c", &[1, 4, 5, 5]), ("r", &[1, 4, 1, 1])];
        assert_eq!(folds(&[conv, add], other, "y"), (0, 2));
        let into_r: Call = ("add_.Tensor", &[("self", "r"), ("other", "c")], "y");
        assert_eq!(folds(&[conv, into_r], same, "y"), (0, 2));
        // The folded node defines the relu's output, reads the residual, and sits at the add.
        let mut g = graph(&[conv, add, relu], same, "z");
        fuse_conv_residuals(&mut g);
        let node = &g.nodes[0];
        assert!(matches!(&node.outputs[..], [Argument::AsTensor(t)] if t.name == "z"));
        assert_eq!(
            input_tensor(node, crate::ops::conv::FUSED_RESIDUAL_ARG),
            Some("r")
        );
    }

    /// Elementwise chains on small graphs: `silu(g) * u` becomes one node at the mul's place
    /// (reading g, then u); an op whose running value is its right operand records the
    /// swapped op; an `_assert_tensor_metadata` of a fused value goes with it. Left alone:
    /// a value inside the chain read twice, an in-place op between the chain's nodes that
    /// rebinds a tensor the chain reads, a running value of other sizes than the output, and
    /// a tensor that is not float32.
    #[test]
    fn pointwise_chains_fuse_only_where_they_are_exact() {
        use crate::ops::pointwise::TARGET;
        let silu: Call = ("silu.default", &[("self", "g")], "a");
        let mul: Call = ("mul.Tensor", &[("self", "a"), ("other", "u")], "y");
        let sizes: &[(&str, &[i64])] = &[
            ("g", &[2, 3]),
            ("a", &[2, 3]),
            ("u", &[2, 3]),
            ("y", &[2, 3]),
        ];
        let fuses = |calls: &[Call], sizes, out| {
            let mut g = graph(calls, sizes, out);
            let n = fuse_pointwise_chains(&mut g);
            (n, g.nodes.len(), g)
        };
        let (n, len, g) = fuses(&[silu, mul], sizes, "y");
        assert_eq!((n, len), (1, 1));
        let node = &g.nodes[0];
        assert_eq!(node.target, TARGET);
        assert!(matches!(&node.outputs[..], [Argument::AsTensor(t)] if t.name == "y"));
        let arg = |name: &str| &node.inputs.iter().find(|a| a.name == name).unwrap().arg;
        assert!(matches!(arg("tensors"), Argument::AsTensors(t)
            if t.iter().map(|t| t.name.as_str()).collect::<Vec<_>>() == ["g", "u"]));
        assert!(matches!(arg("ops"), Argument::AsStrings(o) if o == &["silu", "mul"]));
        assert!(matches!(arg("operands"), Argument::AsInts(k) if k == &[-2, 1]));
        // u - silu(g): the running value is the right operand.
        let sub: Call = ("sub.Tensor", &[("self", "u"), ("other", "a")], "y");
        let (_, _, g) = fuses(&[silu, sub], sizes, "y");
        let ops = g.nodes[0].inputs.iter().find(|a| a.name == "ops").unwrap();
        assert!(matches!(&ops.arg, Argument::AsStrings(o) if o == &["silu", "rsub"]));
        // An assertion on the fused value is dropped with it.
        let check: Call = ("_assert_tensor_metadata.default", &[("a", "a")], "unused");
        assert_eq!(fuses(&[silu, check, mul], sizes, "y").0, 1);
        assert_eq!(fuses(&[silu, check, mul], sizes, "y").1, 1);
        // `a` read twice (by the mul and by another op).
        let other: Call = ("neg.default", &[("self", "a")], "z");
        assert_eq!(fuses(&[silu, other, mul], sizes, "y").0, 0);
        // An in-place op between rebinds g, which the fused node would read too late.
        let rebind: Call = ("relu_.default", &[("self", "g")], "g2");
        assert_eq!(fuses(&[silu, rebind, mul], sizes, "y").0, 0);
        // The running value broadcasts up to the output's sizes: not a chain of one shape.
        let small: &[(&str, &[i64])] = &[
            ("g", &[2, 1]),
            ("a", &[2, 1]),
            ("u", &[2, 3]),
            ("y", &[2, 3]),
        ];
        assert_eq!(fuses(&[silu, mul], small, "y").0, 0);
        // Not float32.
        let mut g = graph(&[silu, mul], sizes, "y");
        g.tensor_values.get_mut("u").unwrap().dtype = crate::dtype::DOUBLE;
        assert_eq!(fuse_pointwise_chains(&mut g), 0);
    }

    /// GPT-2's tanh GELU, `0.5 * x * (1 + tanh(0.79788 * (x + 0.044715 * x^3)))`, as torch
    /// exports it (`x * 0.5` first, multiplied in last) is one chain: the scale by a power of
    /// two moves to the chain's end, after `* x`. With another scale (0.7), which would round
    /// differently there, the two chains stay two.
    #[test]
    fn a_scale_by_a_power_of_two_joins_the_chain_it_multiplies() {
        use crate::ops::pointwise::TARGET;
        use crate::schema::JsonFloat;
        let calls: [Call; 8] = [
            ("mul.Tensor", &[("self", "x"), ("other", "#s")], "half"),
            (
                "pow.Tensor_Scalar",
                &[("self", "x"), ("exponent", "#3")],
                "p",
            ),
            ("mul.Tensor", &[("self", "p"), ("other", "#0.044715")], "m1"),
            ("add.Tensor", &[("self", "x"), ("other", "m1")], "a1"),
            (
                "mul.Tensor",
                &[("self", "a1"), ("other", "#0.7978845608028654")],
                "m2",
            ),
            ("tanh.default", &[("self", "m2")], "t"),
            ("add.Tensor", &[("self", "t"), ("other", "#1")], "g"),
            ("mul.Tensor", &[("self", "half"), ("other", "g")], "y"),
        ];
        let names = ["x", "half", "p", "m1", "a1", "m2", "t", "g", "y"];
        let sizes: Vec<(&str, &[i64])> = names.iter().map(|&n| (n, &[4, 6][..])).collect();
        let fused = |scale: f64| {
            let mut g = graph(&calls, &sizes, "y");
            // The `#` operands are scalars.
            for a in g.nodes.iter_mut().flat_map(|n| n.inputs.iter_mut()) {
                if let Argument::AsTensor(t) = &a.arg {
                    if let Some(v) = t.name.strip_prefix('#') {
                        let v = v.parse().unwrap_or(scale);
                        a.arg = Argument::AsFloat(JsonFloat::Num(v));
                    }
                }
            }
            let n = fuse_pointwise_chains(&mut g);
            (n, g)
        };
        let (n, g) = fused(0.5);
        assert_eq!((n, g.nodes.len()), (1, 1));
        let node = &g.nodes[0];
        assert_eq!(node.target, TARGET);
        assert!(matches!(&node.outputs[..], [Argument::AsTensor(t)] if t.name == "y"));
        let arg = |name: &str| &node.inputs.iter().find(|a| a.name == name).unwrap().arg;
        assert!(matches!(arg("tensors"), Argument::AsTensors(t)
            if t.iter().map(|t| t.name.as_str()).collect::<Vec<_>>() == ["x", "x"]));
        let ops = ["cube", "mul", "add", "mul", "tanh", "add", "mul", "mul"];
        assert!(matches!(arg("ops"), Argument::AsStrings(o) if o == &ops));
        assert!(matches!(arg("operands"), Argument::AsInts(k)
            if k == &[-2, -1, 1, -1, -2, -1, 1, -1]));
        assert!(matches!(arg("scalars"), Argument::AsFloats(s)
            if matches!(s.last(), Some(JsonFloat::Num(v)) if *v == 0.5)));
        let (n, g) = fused(0.7);
        assert_eq!((n, g.nodes.len()), (2, 2));
    }

    /// Dropouts outside training are dropped, their readers reading their input; then an
    /// add of a residual after a packed Linear becomes the Linear's epilogue, the Linear
    /// taking the add's place when the residual is computed after it. Left alone: a
    /// dropout in training, or whose output the graph returns; a Linear output read twice; an
    /// in-place op between the Linear and the add that rebinds what the Linear reads.
    #[test]
    fn epilogues_fold_what_follows_a_packed_linear() {
        use crate::ops::packed::{OUTPUT_SHAPE_ARG, TARGET as LINEAR};
        use crate::ops::pointwise::EPILOGUE_ARGS;
        let lin: Call = ("linear.default", &[("input", "x"), ("weight", "w")], "h");
        let drop: Call = ("dropout.default", &[("input", "h")], "d");
        let add: Call = ("add.Tensor", &[("self", "d"), ("other", "r")], "y");
        let sizes: &[(&str, &[i64])] = &[
            ("x", &[4, 8]),
            ("h", &[4, 6]),
            ("d", &[4, 6]),
            ("r", &[4, 6]),
            ("y", &[4, 6]),
            ("s", &[4, 6]),
            ("v", &[2, 2, 6]),
            ("rv", &[2, 2, 6]),
        ];
        let build = |calls: &[Call], out: &str, train: bool| {
            let mut g = graph(calls, sizes, out);
            for node in &mut g.nodes {
                if node.target.ends_with("linear.default") {
                    node.target = LINEAR.into();
                }
                if node.target.ends_with("dropout.default") {
                    node.inputs.push(crate::schema::NamedArgument {
                        name: "train".into(),
                        arg: Argument::AsBool(train),
                        kind: None,
                    });
                }
            }
            g
        };
        let fold = |g: &mut Graph| (drop_inference_dropouts(g), fuse_linear_epilogues(g));
        let mut g = build(&[lin, drop, add], "y", false);
        assert_eq!(fold(&mut g), (1, 1));
        assert_eq!(g.nodes.len(), 1);
        let node = &g.nodes[0];
        assert_eq!(node.target, LINEAR);
        assert!(matches!(&node.outputs[..], [Argument::AsTensor(t)] if t.name == "y"));
        let arg = |name: &str| &node.inputs.iter().find(|a| a.name == name).unwrap().arg;
        assert!(matches!(arg(EPILOGUE_ARGS[0]), Argument::AsTensors(t)
            if t.len() == 1 && t[0].name == "r"));
        assert!(matches!(arg(EPILOGUE_ARGS[1]), Argument::AsStrings(o) if o == &["add"]));
        assert!(matches!(arg(EPILOGUE_ARGS[2]), Argument::AsInts(k) if k == &[1]));
        // The residual computed after the Linear: the Linear moves down to the add.
        let late: Call = ("neg.default", &[("self", "x")], "r");
        let mut g = build(&[lin, late, drop, add], "y", false);
        assert_eq!(fold(&mut g), (1, 1));
        let targets: Vec<&str> = g.nodes.iter().map(|n| n.target.as_str()).collect();
        assert_eq!(targets, ["torch.ops.aten.neg.default", LINEAR]);
        // A dropout in training stays, and so does the add after it.
        let mut g = build(&[lin, drop, add], "y", true);
        assert_eq!(fold(&mut g), (0, 0));
        // The dropout's output returned.
        let mut g = build(&[lin, drop], "d", false);
        assert_eq!(fold(&mut g), (0, 0));
        // The Linear's output read twice.
        let twice: Call = ("mul.Tensor", &[("self", "h"), ("other", "y")], "z");
        let mut g = build(&[lin, drop, add, twice], "z", false);
        assert_eq!(fold(&mut g).1, 0);
        // An in-place op rebinds x between the Linear and the add.
        let rebind: Call = ("relu_.default", &[("self", "x")], "x2");
        let mut g = build(&[lin, rebind, drop, add], "y", false);
        assert_eq!(fold(&mut g), (1, 0));
        // A chain that reads the Linear's output again (`silu(h) * h`): tensor 0 to the
        // epilogue, which reads it as the product left it.
        let silu: Call = ("silu.default", &[("self", "h")], "s");
        let gate: Call = ("mul.Tensor", &[("self", "s"), ("other", "h")], "y");
        let mut g = build(&[lin, silu, gate], "y", false);
        assert_eq!(fuse_pointwise_chains(&mut g), 1);
        assert_eq!(fold(&mut g), (0, 1));
        let node = &g.nodes[0];
        let arg = |name: &str| &node.inputs.iter().find(|a| a.name == name).unwrap().arg;
        assert!(matches!(arg(EPILOGUE_ARGS[0]), Argument::AsTensors(t) if t.is_empty()));
        assert!(matches!(arg(EPILOGUE_ARGS[2]), Argument::AsInts(k) if k == &[-2, 0]));
        // A view between that keeps the last dim (GPT-2's `Conv1D`): the Linear gives its
        // output the view's sizes, and the view goes; one that changes the last dim stays.
        let view = |to: &'static str| -> Call { ("view.default", &[("self", "h")], to) };
        let add_v: Call = ("add.Tensor", &[("self", "v"), ("other", "rv")], "y");
        let viewed = |last: i64| {
            let mut g = build(&[lin, view("v"), add_v], "y", false);
            for (name, dims) in [("v", [2, 2, 6]), ("rv", [2, 2, 6]), ("y", [2, 2, 6])] {
                let meta = g.tensor_values.get_mut(name).unwrap();
                let mut sizes = dims.to_vec();
                if name != "rv" || last == 6 {
                    sizes[2] = last;
                    sizes[1] = 12 / last;
                }
                meta.sizes = sizes
                    .into_iter()
                    .map(crate::schema::SymInt::AsInt)
                    .collect();
            }
            g
        };
        let mut g = viewed(6);
        assert_eq!(fold(&mut g), (0, 1));
        assert_eq!(g.nodes.len(), 1);
        let shape = g.nodes[0]
            .inputs
            .iter()
            .find(|a| a.name == OUTPUT_SHAPE_ARG);
        assert!(matches!(shape.map(|a| &a.arg), Some(Argument::AsInts(s)) if s == &[2, 2, 6]));
        let mut g = viewed(3);
        assert_eq!(fold(&mut g), (0, 0));
    }

    /// The tiled transposes (from a tensor and from little-endian bytes) against candle's own
    /// strided copy, on sizes that cross the 64-element tiles and the 256-row bands unevenly.
    #[test]
    fn tiled_transposes_match_candles_copy() {
        for (n, k) in [(1, 1), (3, 300), (300, 70), (257, 129), (64, 256)] {
            let v: Vec<f32> = (0..n * k).map(|i| i as f32 * 0.5 - 7.0).collect();
            let w = Tensor::from_vec(v.clone(), (n, k), &candle_core::Device::Cpu).unwrap();
            let want: Vec<f32> = w
                .t()
                .unwrap()
                .contiguous()
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let from_tensor = transpose_f32(&w).unwrap();
            assert_eq!(from_tensor.dims(), &[k, n]);
            assert_eq!(
                from_tensor.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                want,
                "{n}x{k}"
            );
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            assert_eq!(transpose_le_f32(&bytes, n, k), want, "{n}x{k} from bytes");
        }
    }
}

/// Graphs for the rewrites' tests, written as an export writes them.
#[cfg(test)]
pub(crate) mod test_graph {
    use serde_json::{json, Value};

    use crate::schema::Graph;

    /// The metadata of a float32 tensor of `sizes`, its dim `dynamic` (if any) symbolic.
    pub(crate) fn meta(sizes: &[i64], dynamic: Option<usize>) -> Value {
        let mut s: Vec<Value> = sizes.iter().map(|v| json!({ "as_int": v })).collect();
        if let Some(d) = dynamic {
            s[d] = json!({"as_expr": {"expr_str": "s0"}});
        }
        json!({"dtype": 7, "sizes": s, "device": {"type": "cpu"}, "strides": [],
               "storage_offset": {"as_int": 0}, "layout": 7})
    }

    /// A forward `aten.convolution` node of `input` by `weight` into `output`, with `extra`
    /// arguments.
    pub(crate) fn conv(input: &str, weight: &str, output: &str, extra: &[Value]) -> Value {
        let mut inputs = vec![
            json!({"name": "input", "arg": {"as_tensor": {"name": input}}}),
            json!({"name": "weight", "arg": {"as_tensor": {"name": weight}}}),
            json!({"name": "transposed", "arg": {"as_bool": false}}),
        ];
        inputs.extend(extra.iter().cloned());
        json!({"target": "torch.ops.aten.convolution.default", "inputs": inputs,
               "outputs": [{"as_tensor": {"name": output}}]})
    }

    /// A graph of `nodes` returning `output`, with the metadata of `tensors` (name, sizes,
    /// symbolic dim).
    pub(crate) fn graph(
        nodes: Vec<Value>,
        output: &str,
        tensors: &[(&str, &[i64], Option<usize>)],
    ) -> Graph {
        let meta: serde_json::Map<String, Value> = tensors
            .iter()
            .map(|&(name, sizes, dynamic)| (name.to_string(), meta(sizes, dynamic)))
            .collect();
        serde_json::from_value(json!({
            "inputs": [], "outputs": [{"as_tensor": {"name": output}}], "nodes": nodes,
            "tensor_values": meta,
        }))
        .unwrap()
    }
}
