//! Nodes computed from weights alone, computed once at load (constant folding).
//!
//! Exported programs compute some values from parameters and buffers only: timm's
//! weight-standardized convolutions (NF-Nets, BiT) normalize their weight with a batch norm
//! on every call, Swin and its kin gather a relative position bias from a table with a
//! constant index, a class token is expanded to the batch. The run would compute each of them
//! again every time. [`fold_constants`] runs such a node once, with the kernel the run would
//! use, and binds its result as a weight of the program: the values are those the run
//! computed, and the later rewrites (a batch norm folded into its convolution, a weight packed
//! or transformed for its kernel) apply to it as to any weight.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::ops::Range;

use candle_core::Tensor;

use super::{drop_nodes, tensor_names};
use crate::fast::HashSet as FastSet;
use crate::ops::{op_key, Registry};
use crate::schema::{Argument, Graph, Node, SymBoolArgument, SymFloatArgument, SymIntArgument};
use crate::value::{Args, Env, Value};

/// A folded result may hold this many values more than the node's inputs together (4 MiB of
/// f32): a result is kept for the program's life, where the run would have freed it after
/// its last use, so an op that makes much from little (`expand`, `full`) stays a node.
pub const MAX_GROWTH: usize = 1 << 20;

/// Run each node of `graph` whose every input is a weight (a name in `weights`, or the result
/// of a node folded before it) or a plain value (no symbolic size, nothing computed from a
/// user input), with its kernel in `registry`, and bind its outputs as weights; the node is
/// dropped, and each weight it read is dropped too once nothing else reads it. `keep(name)`:
/// a weight that is not constant (a buffer the program updates) or that must not be read by
/// a folded node (decoded in a layout only its own kernel reads, or scaled for a batch norm
/// fold planned before this runs); nodes that read one stay.
///
/// A node stays as well when it is an in-place op or its output is updated in place by a
/// later node, when it defines anything but tensors, when its kernel fails (the run then
/// reports the failure, naming the node, as it would have), or when its results hold more
/// than [`MAX_GROWTH`] values more than its inputs. A folded result that shares memory with
/// a weight still bound (a view of it) is copied, so that no two weights share values (the
/// batch norm fold may scale a weight in place). Returns how many nodes were folded.
pub fn fold_constants<S: BuildHasher>(
    graph: &mut Graph,
    weights: &mut HashMap<String, Tensor, S>,
    registry: &Registry,
    keep: impl Fn(&str) -> bool,
) -> usize {
    let rebound = rebound(graph);
    // Reads left of each value: a weight nothing will read is dropped as soon as it is not
    // (the next fold's result can then reuse its memory).
    let (mut readers, _) = super::readers_and_producers(graph);
    let mut folded: FastSet<usize> = FastSet::default();
    let mut made: Vec<String> = Vec::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        let constant = |name: &str| weights.contains_key(name) && !keep(name);
        let Some((inputs, outputs)) = candidate(node, &rebound, constant) else {
            continue;
        };
        let Some(kernel) = registry.get(&node.target) else {
            continue;
        };
        let env: Env = inputs
            .iter()
            .map(|n| (n.to_string(), Value::Tensor(weights[*n].clone())))
            .collect();
        let Ok(outs) = crate::ops::call(kernel, &Args::new(node, &env)) else {
            continue;
        };
        drop(env);
        let Some(results) = tensors_of(outs, outputs.len()) else {
            continue;
        };
        let held: usize = inputs.iter().map(|n| weights[*n].elem_count()).sum();
        let new: usize = results.iter().map(Tensor::elem_count).sum();
        if new > held.saturating_add(MAX_GROWTH) {
            continue;
        }
        for (name, t) in outputs.iter().zip(results) {
            weights.insert(name.to_string(), t);
            made.push(name.to_string());
        }
        for name in node.inputs.iter().flat_map(|a| tensor_names(&a.arg)) {
            let left = readers.entry(name).or_default();
            *left = left.saturating_sub(1);
            if *left == 0 && !keep(name) {
                weights.remove(name);
            }
        }
        folded.insert(i);
    }
    if folded.is_empty() {
        return 0;
    }
    // Results nothing reads (dead code in the export).
    for name in &made {
        if !readers.contains_key(name.as_str()) && !keep(name) {
            weights.remove(name);
        }
    }
    drop_nodes(graph, &folded);
    unshare(weights, &made);
    folded.len()
}

/// The weights (names for which `is_weight` holds and `keep` does not) that only nodes
/// [`fold_constants`] folds read, if every kernel succeeds: the load decodes them on their
/// own, so that their memory is given back once their folds have read them.
pub fn folded_weights(
    graph: &Graph,
    is_weight: impl Fn(&str) -> bool,
    keep: impl Fn(&str) -> bool,
) -> HashSet<&str> {
    let rebound = rebound(graph);
    let mut constant: HashSet<&str> = HashSet::new();
    let mut read_by_folds: HashSet<&str> = HashSet::new();
    let mut read_by_others: HashSet<&str> = HashSet::new();
    for node in &graph.nodes {
        let is_constant = |n: &str| (is_weight(n) || constant.contains(n)) && !keep(n);
        let reads = node.inputs.iter().flat_map(|a| tensor_names(&a.arg));
        match candidate(node, &rebound, is_constant) {
            Some((inputs, outputs)) => {
                read_by_folds.extend(inputs);
                constant.extend(outputs);
            }
            None => read_by_others.extend(reads),
        }
    }
    read_by_others.extend(graph.outputs.iter().flat_map(tensor_names));
    read_by_folds
        .into_iter()
        .filter(|n| is_weight(n) && !read_by_others.contains(n))
        .collect()
}

/// The values an in-place op of `graph` rebinds (its `self` or `input`).
fn rebound(graph: &Graph) -> FastSet<&str> {
    graph
        .nodes
        .iter()
        .filter(|n| crate::ops::is_in_place(op_key(&n.target)))
        .flat_map(|n| {
            n.inputs
                .iter()
                .filter(|a| a.name == "self" || a.name == "input")
        })
        .flat_map(|a| tensor_names(&a.arg))
        .collect()
}

/// The tensors `node` reads and those it defines, if it is a node to fold: not an in-place
/// op, defining tensors only, none of them updated in place later (`rebound`), and reading
/// only tensors for which `constant` holds and plain values ([`constant_inputs`]).
fn candidate<'n>(
    node: &'n Node,
    rebound: &FastSet<&str>,
    constant: impl Fn(&str) -> bool,
) -> Option<(Vec<&'n str>, Vec<&'n str>)> {
    let in_place = crate::ops::is_in_place(op_key(&node.target));
    let outputs = output_names(node);
    if in_place || outputs.is_empty() || outputs.iter().any(|o| rebound.contains(o)) {
        return None;
    }
    Some((constant_inputs(node, &constant)?, outputs))
}

/// The tensors `node` reads, if every input is a tensor (or an optional one given as none)
/// for which `constant` holds, or a plain value (ints, floats, bools, strings, dtypes; never
/// a symbolic value, which a run computes from its inputs' sizes); `None` otherwise.
fn constant_inputs<'n>(node: &'n Node, constant: &impl Fn(&str) -> bool) -> Option<Vec<&'n str>> {
    let mut names = Vec::new();
    for a in &node.inputs {
        let plain = match &a.arg {
            Argument::AsTensor(_)
            | Argument::AsTensors(_)
            | Argument::AsOptionalTensor(_)
            | Argument::AsOptionalTensors(_) => {
                let tensors = tensor_names(&a.arg);
                if !tensors.clone().all(constant) {
                    return None;
                }
                names.extend(tensors);
                true
            }
            Argument::AsSymInt(s) => matches!(s, SymIntArgument::AsInt(_)),
            Argument::AsSymInts(v) => v.iter().all(|s| matches!(s, SymIntArgument::AsInt(_))),
            Argument::AsSymFloat(s) => matches!(s, SymFloatArgument::AsFloat(_)),
            Argument::AsSymFloats(v) => v.iter().all(|s| matches!(s, SymFloatArgument::AsFloat(_))),
            Argument::AsSymBool(s) => matches!(s, SymBoolArgument::AsBool(_)),
            Argument::AsSymBools(v) => v.iter().all(|s| matches!(s, SymBoolArgument::AsBool(_))),
            Argument::AsNone(_)
            | Argument::AsInt(_)
            | Argument::AsInts(_)
            | Argument::AsFloat(_)
            | Argument::AsFloats(_)
            | Argument::AsString(_)
            | Argument::AsStrings(_)
            | Argument::AsScalarType(_)
            | Argument::AsMemoryFormat(_)
            | Argument::AsLayout(_)
            | Argument::AsDevice(_)
            | Argument::AsBool(_)
            | Argument::AsBools(_)
            | Argument::AsComplex(_)
            | Argument::AsIntLists(_)
            | Argument::AsFloatLists(_) => true,
            // Subgraphs, objects, operators, nested or keyed arguments: left to the run.
            _ => false,
        };
        if !plain {
            return None;
        }
    }
    Some(names)
}

/// The tensor names `node` defines, in order, if it defines tensors only (a list counts as
/// its tensors); empty otherwise.
fn output_names(node: &Node) -> Vec<&str> {
    let mut names = Vec::new();
    for o in &node.outputs {
        match o {
            Argument::AsTensor(t) => names.push(t.name.as_str()),
            Argument::AsTensors(ts) if !ts.is_empty() => {
                names.extend(ts.iter().map(|t| t.name.as_str()))
            }
            _ => return Vec::new(),
        }
    }
    names
}

/// A kernel's outputs as `count` tensors (a tensor list spread out), or `None` if they are
/// anything else.
fn tensors_of(outs: Vec<Value>, count: usize) -> Option<Vec<Tensor>> {
    let mut tensors = Vec::with_capacity(count);
    for v in outs {
        match v {
            Value::Tensor(t) => tensors.push(t),
            Value::Tensors(ts) => tensors.extend(ts),
            _ => return None,
        }
    }
    (tensors.len() == count).then_some(tensors)
}

/// Copy each weight named in `made` whose values share memory with another weight's (a view
/// that a node folded: `reshape`, `expand`, `t`, an op that hands back its input), into a
/// tensor of its own.
fn unshare<S: BuildHasher>(weights: &mut HashMap<String, Tensor, S>, made: &[String]) {
    let spans: Vec<(&str, (usize, Range<usize>))> = weights
        .iter()
        .filter_map(|(n, t)| Some((n.as_str(), span(t)?)))
        .collect();
    let shared: Vec<String> = made
        .iter()
        .filter(|m| {
            let Some(mine) = weights.get(*m).and_then(span) else {
                return false;
            };
            spans.iter().any(|(n, s)| {
                n != m && s.0 == mine.0 && s.1.start < mine.1.end && mine.1.start < s.1.end
            })
        })
        .cloned()
        .collect();
    for name in shared {
        if let Some(copy) = weights.get(&name).and_then(|t| t.force_contiguous().ok()) {
            weights.insert(name, copy);
        }
    }
}

/// Where a tensor's values lie: its storage (by address) and the elements of it the tensor
/// can reach, from its start offset to its last element (`None` for an empty tensor).
fn span(t: &Tensor) -> Option<(usize, Range<usize>)> {
    let (storage, layout) = t.storage_and_layout();
    let at = std::ptr::from_ref(&*storage) as usize;
    let last = layout
        .dims()
        .iter()
        .zip(layout.stride())
        .try_fold(0usize, |acc, (&d, &s)| Some(acc + d.checked_sub(1)? * s))?;
    let start = layout.start_offset();
    Some((at, start..start + last + 1))
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value as Json};

    use super::*;
    use crate::prepare::test_graph::graph;

    fn t(name: &str) -> Json {
        json!({"as_tensor": {"name": name}})
    }

    /// A node of `target` reading `inputs` (schema name, argument) into tensor `out`.
    fn node(target: &str, inputs: &[(&str, Json)], out: &str) -> Json {
        let inputs: Vec<Json> = inputs
            .iter()
            .map(|(n, a)| json!({"name": n, "arg": a}))
            .collect();
        json!({"target": format!("torch.ops.aten.{target}"), "inputs": inputs,
               "outputs": [t(out)]})
    }

    fn weights(pairs: &[(&str, &[f32], &[usize])]) -> HashMap<String, Tensor> {
        pairs
            .iter()
            .map(|(n, v, s)| {
                let x = Tensor::from_slice(v, *s, &candle_core::Device::Cpu).unwrap();
                (n.to_string(), x)
            })
            .collect()
    }

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1().unwrap()
    }

    fn targets(g: &Graph) -> Vec<&str> {
        g.nodes.iter().map(|n| op_key(&n.target)).collect()
    }

    /// `y = x + (w * w + 1)`, `x` a user input: the two nodes on `w` alone are computed, the
    /// add of `x` stays, and `w` (read by nothing now) and the intermediate are dropped.
    #[test]
    fn weight_only_chains_become_weights() {
        let nodes = vec![
            node("mul.Tensor", &[("self", t("w")), ("other", t("w"))], "sq"),
            node(
                "add.Scalar",
                &[("self", t("sq")), ("other", json!({"as_float": 1.0}))],
                "c",
            ),
            node("add.Tensor", &[("self", t("x")), ("other", t("c"))], "y"),
        ];
        let mut g = graph(nodes, "y", &[]);
        let mut w = weights(&[("w", &[1.0, -2.0, 3.0], &[3])]);
        let n = fold_constants(&mut g, &mut w, &Registry::with_all_ops(), |_| false);
        assert_eq!(n, 2);
        assert_eq!(targets(&g), ["aten.add.Tensor"]);
        let mut names: Vec<&String> = w.keys().collect();
        names.sort();
        assert_eq!(names, ["c"]);
        assert_eq!(values(&w["c"]), [2.0, 5.0, 10.0]);
    }

    /// Nodes that must stay: on a weight `keep` names, with a symbolic size, updated in place
    /// later, making far more values than they read, or failing in their kernel.
    #[test]
    fn what_is_not_constant_stays() {
        let registry = Registry::with_all_ops();
        let fold = |nodes: Vec<Json>, keep: &dyn Fn(&str) -> bool| {
            let mut g = graph(nodes, "y", &[]);
            let mut w = weights(&[("w", &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])]);
            let n = fold_constants(&mut g, &mut w, &registry, keep);
            (
                n,
                targets(&g)
                    .into_iter()
                    .map(str::to_string)
                    .collect::<Vec<_>>(),
            )
        };
        let neg = || node("neg.default", &[("self", t("w"))], "y");
        assert_eq!(fold(vec![neg()], &|_| false).0, 1);
        assert_eq!(fold(vec![neg()], &|n| n == "w").0, 0);
        let sym = json!({"as_sym_ints": [{"as_name": "s0"}, {"as_int": 3}]});
        let reshape = node("reshape.default", &[("self", t("w")), ("shape", sym)], "y");
        assert_eq!(fold(vec![reshape], &|_| false).0, 0);
        let updated = vec![
            neg(),
            node("add_.Tensor", &[("self", t("y")), ("other", t("x"))], "y2"),
        ];
        assert_eq!(fold(updated, &|_| false).0, 0);
        let big = json!({"as_ints": [1 << 18, 2, 3]});
        let wide = node("expand.default", &[("self", t("w")), ("size", big)], "y");
        assert_eq!(fold(vec![wide], &|_| false).0, 0);
        let small = json!({"as_ints": [4, 2, 3]});
        let wide = node("expand.default", &[("self", t("w")), ("size", small)], "y");
        assert_eq!(fold(vec![wide], &|_| false).0, 1);
        let bad = json!({"as_ints": [7]});
        let reshape = node("reshape.default", &[("self", t("w")), ("shape", bad)], "y");
        let (n, left) = fold(vec![reshape], &|_| false);
        assert_eq!((n, left), (0, vec!["aten.reshape.default".to_string()]));
    }

    /// A folded view of a weight that stays bound gets values of its own: scaling one in
    /// place (the batch norm fold does) must not change the other.
    #[test]
    fn folded_views_of_bound_weights_are_copied() {
        let nodes = vec![
            node(
                "reshape.default",
                &[("self", t("w")), ("shape", json!({"as_ints": [3, 2]}))],
                "v",
            ),
            node("mm.default", &[("self", t("x")), ("mat2", t("v"))], "a"),
            node("mm.default", &[("self", t("w")), ("mat2", t("a"))], "y"),
        ];
        let mut g = graph(nodes, "y", &[]);
        let data = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut w = weights(&[("w", &data, &[2, 3])]);
        assert_eq!(
            fold_constants(&mut g, &mut w, &Registry::with_all_ops(), |_| false),
            1
        );
        let (vs, ws) = (span(&w["v"]).unwrap(), span(&w["w"]).unwrap());
        assert_ne!(vs.0, ws.0, "the view still shares the weight's storage");
        assert_eq!(
            (values(&w["v"]), w["v"].dims()),
            (data.to_vec(), &[3, 2][..])
        );
        // A view of a weight nothing else reads keeps its storage (the weight is dropped).
        let nodes = vec![
            node(
                "reshape.default",
                &[("self", t("w")), ("shape", json!({"as_ints": [3, 2]}))],
                "v",
            ),
            node("mm.default", &[("self", t("x")), ("mat2", t("v"))], "y"),
        ];
        let mut g = graph(nodes, "y", &[]);
        let mut w = weights(&[("w", &data, &[2, 3])]);
        let before = span(&w["w"]).unwrap().0;
        assert_eq!(
            fold_constants(&mut g, &mut w, &Registry::with_all_ops(), |_| false),
            1
        );
        assert!(!w.contains_key("w"));
        assert_eq!(span(&w["v"]).unwrap().0, before);
    }

    /// The weights the load decodes on their own: those only folded nodes read, not one also
    /// read by a node that stays, nor one `keep` names, nor a user input.
    #[test]
    fn weights_only_folds_read_are_found_before_the_load() {
        let nodes = vec![
            node("mul.Tensor", &[("self", t("a")), ("other", t("b"))], "ab"),
            node("neg.default", &[("self", t("ab"))], "n"),
            node("add.Tensor", &[("self", t("x")), ("other", t("n"))], "y1"),
            node("add.Tensor", &[("self", t("x")), ("other", t("b"))], "y2"),
            node("neg.default", &[("self", t("k"))], "kn"),
            node("add.Tensor", &[("self", t("y2")), ("other", t("kn"))], "y3"),
            node("add.Tensor", &[("self", t("y3")), ("other", t("y1"))], "y"),
        ];
        let g = graph(nodes, "y", &[]);
        let is_weight = |n: &str| ["a", "b", "k"].contains(&n);
        let mut found: Vec<&str> = folded_weights(&g, is_weight, |n| n == "k")
            .into_iter()
            .collect();
        found.sort();
        assert_eq!(found, ["a"]);
    }
}
