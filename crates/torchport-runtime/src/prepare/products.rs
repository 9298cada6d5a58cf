//! Products with a weight as their right operand, in the forms exports write them: torch's
//! Linear (`linear(x, w, b)`, `w: [n, k]`), the same after `run_decompositions()`
//! (`addmm(b, x, t(w))` / `mm(x, t(w))`, the transpose a `t`, `permute([1, 0])` or
//! `transpose(0, 1)`), and a weight stored `[k, n]` and read as it is (`addmm(b, x, w)`,
//! `mm(x, w)`, `matmul(x, w)`: GPT-2's `Conv1D`). The first two become Linears
//! ([`linears_from_products`]); every form is a product whose weight the load may pack
//! ([`packable_read`]).

use crate::fast::HashSet;

use crate::ops::op_key;
use crate::ops::packed::Source;
use crate::schema::{Argument, Graph, NamedArgument, Node, TensorArgument};

use super::{input_float, input_tensor, readers_and_producers, rebinds_any, transposed_read};

/// How `node` reads its input `input` as the weight of a product the packed kernel computes
/// (`x @ w.T + b` or `x @ w + b`, with `b` absent or `[n]`), if it does.
pub(crate) fn packable_read(graph: &Graph, node: &Node, input: &str) -> Option<Source> {
    if single_row(graph, node) {
        return None;
    }
    match (op_key(&node.target), input) {
        ("aten.linear.default", "weight") => Some(Source::Rows),
        ("aten.mm.default", "mat2") | ("aten.matmul.default", "other") => Some(Source::Columns),
        ("aten.addmm.default", "mat2") => {
            let n = sizes(graph, input_tensor(node, "mat2")?)?.get(1).copied()?;
            plain_addmm(graph, node, n).then_some(Source::Columns)
        }
        _ => None,
    }
}

/// Whether `node` is a Linear of a single row: its input's static sizes all 1 but the last
/// (a batch-1 classifier). It reads each weight value once per run however the weight is laid
/// out, so its weight stays as stored, neither packed nor transposed: the load copies it
/// instead of rearranging it, and the kernel takes one dot product per output row
/// (`ops::linalg`).
pub(crate) fn single_row(graph: &Graph, node: &Node) -> bool {
    op_key(&node.target) == "aten.linear.default"
        && input_tensor(node, "input")
            .and_then(|x| sizes(graph, x))
            .is_some_and(|s| {
                s.split_last()
                    .is_some_and(|(_, rows)| rows.iter().all(|&d| d == 1))
            })
}

/// Whether the `addmm` `node` is `mat1 @ mat2 + self` with `self` a vector of `n`, the
/// output's width (`beta` and `alpha` 1): a Linear's form.
fn plain_addmm(graph: &Graph, node: &Node, n: i64) -> bool {
    input_float(node, "beta", 1.0) == Some(1.0)
        && input_float(node, "alpha", 1.0) == Some(1.0)
        && input_tensor(node, "self").and_then(|b| sizes(graph, b)) == Some(vec![n])
}

/// The inputs of the packed kernel (`input`, `weight`, `bias`) for a node that reads its
/// weight as [`packable_read`] says, from the node's own.
pub(crate) fn packed_inputs(node: &Node) -> Vec<NamedArgument> {
    let rename = |from: &str, to: &'static str| {
        node.inputs
            .iter()
            .find(|a| a.name == from)
            .map(|a| NamedArgument {
                name: to.into(),
                ..a.clone()
            })
    };
    let names: &[(&str, &str)] = match op_key(&node.target) {
        "aten.mm.default" => &[("self", "input"), ("mat2", "weight")],
        "aten.matmul.default" => &[("self", "input"), ("other", "weight")],
        "aten.addmm.default" => &[("mat1", "input"), ("mat2", "weight"), ("self", "bias")],
        _ => &[("input", "input"), ("weight", "weight"), ("bias", "bias")],
    };
    names.iter().filter_map(|(f, t)| rename(f, t)).collect()
}

/// The static sizes the graph's metadata gives tensor `name`.
fn sizes(graph: &Graph, name: &str) -> Option<Vec<i64>> {
    graph.tensor_values.get(name)?.static_sizes()
}

/// Rewrite each `mm(x, t(w))` and plain `addmm(b, x, t(w))` (`beta` and `alpha` 1, `b` of
/// `[n]`) whose `w` is a weight (`is_weight`: a graph input nothing updates in place) into
/// `linear(x, w, b)`, which computes the same for a 2-d `x`, and drop the transposes left
/// unread. Returns how many were rewritten. The decomposed export's Linears then load as a
/// plain export's do (packed, [`crate::ops::packed`]).
pub fn linears_from_products(graph: &mut Graph, is_weight: impl Fn(&str) -> bool) -> usize {
    let (_, producer) = readers_and_producers(graph);
    // The weight each 2-d transpose of a weight reads, by the transpose's output.
    let transposed_weight = |name: &str| -> Option<String> {
        let t = &graph.nodes[*producer.get(name)?];
        let w = input_tensor(t, "self")?;
        let plain = op_key(&t.target) != "aten.linear.default" && transposed_read(t, "self");
        (plain && is_weight(w) && !rebinds_any(&graph.nodes, |n| n == w)).then(|| w.to_string())
    };
    let mut rewrites = Vec::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        let (x, mat2, bias) = match op_key(&node.target) {
            "aten.mm.default" => (input_tensor(node, "self"), input_tensor(node, "mat2"), None),
            "aten.addmm.default" => (
                input_tensor(node, "mat1"),
                input_tensor(node, "mat2"),
                input_tensor(node, "self").map(Some),
            ),
            _ => continue,
        };
        let (Some(x), Some(mat2)) = (x, mat2) else {
            continue;
        };
        let Some(w) = transposed_weight(mat2) else {
            continue;
        };
        let n = sizes(graph, &w).and_then(|s| s.first().copied());
        if bias.is_some() && !n.is_some_and(|n| plain_addmm(graph, node, n)) {
            continue;
        }
        let tensor = |name: &'static str, t: &str| NamedArgument {
            name: name.into(),
            arg: Argument::AsTensor(TensorArgument {
                name: t.to_string(),
            }),
            kind: None,
        };
        let mut inputs = vec![tensor("input", x), tensor("weight", &w)];
        inputs.extend(bias.flatten().map(|b| tensor("bias", b)));
        rewrites.push((i, inputs, producer[mat2]));
    }
    let count = rewrites.len();
    let mut transposes = HashSet::default();
    for (i, inputs, t) in rewrites {
        let node = &mut graph.nodes[i];
        node.target = "aten.linear.default".to_string();
        node.inputs = inputs;
        transposes.insert(t);
    }
    // The transposes the rewrites left unread.
    let (readers, _) = readers_and_producers(graph);
    transposes.retain(|&t| match graph.nodes[t].outputs.as_slice() {
        [Argument::AsTensor(out)] => !readers.contains_key(out.name.as_str()),
        _ => false,
    });
    super::drop_nodes(graph, &transposes);
    count
}
