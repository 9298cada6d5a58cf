//! Chains of elementwise float32 ops fused into one node of
//! [`crate::ops::pointwise::TARGET`], computed in one pass.

use crate::fast::{HashMap, HashSet};

use super::{
    drop_nodes, input_arg, input_float, input_tensor, readers_and_producers, rebinds_any,
    same_meta, tensor_names,
};
use crate::dtype::FLOAT;
use crate::ops::op_key;
use crate::ops::pointwise::{Binary, Unary, EPILOGUE_ARGS, TARGET};
use crate::schema::{Argument, Graph, JsonFloat, NamedArgument, Node, TensorArgument};

/// An operand of an elementwise node.
#[derive(Clone)]
enum Arg {
    Tensor(String),
    Scalar(f32),
}

/// An elementwise node: its op, and the tensor (or operands) it reads.
enum Op {
    Unary(Unary, String),
    Binary(Binary, Arg, Arg),
    /// `to(float32)` of a float32 tensor: the same values.
    Identity(String),
}

/// A chain being built: the tensors it reads (the start first), its steps (name; operand:
/// an index into `tensors`, -1 for the scalar, -2 for none; scalar) and its nodes in graph
/// order.
struct Chain {
    tensors: Vec<String>,
    steps: Vec<(&'static str, i64, f32)>,
    nodes: Vec<usize>,
}

impl Chain {
    /// The index of `t` among the tensors the steps read (added if new; never 0, the
    /// start, which the steps see as it was before the first).
    fn operand(&mut self, t: String) -> i64 {
        let k = match self.tensors.iter().skip(1).position(|x| *x == t) {
            Some(k) => k + 1,
            None => {
                self.tensors.push(t);
                self.tensors.len() - 1
            }
        };
        k as i64
    }
}

/// Fuse each chain of two or more elementwise float32 nodes, where every value inside the
/// chain is read only by the next node (an `_assert_tensor_metadata` of it aside, which is
/// dropped with it) and has the chain's sizes, into one node of
/// [`crate::ops::pointwise::TARGET`] at the last node's place: add, sub (alpha 1), mul, div of
/// tensors or scalars, neg, relu, silu, sigmoid, tanh, exp, rsqrt, sqrt, gelu (erf or tanh),
/// `pow` by 2, 3 or 0.5, and `to(float32)` of a float32 tensor. The other operands may
/// broadcast. `(x * s) * b`, `s` a power of two and `b` the end of a chain, joins that chain
/// as `* x` then `* s` (the same bits while the values stay normal numbers). A chain is left
/// alone when an in-place op between its first and last node rebinds a tensor it reads (the
/// fused node reads them at the last node's place). The graph's metadata decides dtypes and
/// sizes: every tensor involved must be float32. Returns how many chains were fused.
pub fn fuse_pointwise_chains(graph: &mut Graph) -> usize {
    let (readers, _) = readers_and_producers(graph);
    let mut asserts: HashMap<String, Vec<usize>> = HashMap::default();
    for (i, node) in graph.nodes.iter().enumerate() {
        if op_key(&node.target) == "aten._assert_tensor_metadata.default" {
            for a in &node.inputs {
                for n in tensor_names(&a.arg) {
                    asserts.entry(n.to_string()).or_default().push(i);
                }
            }
        }
    }
    let readers_of = |v: &str| {
        let checks = asserts.get(v).map_or(0, Vec::len);
        readers.get(v).copied().unwrap_or(0).saturating_sub(checks)
    };
    let is_f32 = |v: &str| graph.tensor_values.get(v).is_some_and(|m| m.dtype == FLOAT);
    let mut chains: Vec<Chain> = Vec::new();
    // Chains whose last value may take another step, by that value.
    let mut open: HashMap<String, usize> = HashMap::default();
    for (i, node) in graph.nodes.iter().enumerate() {
        let Some((op, y)) = parse(node) else {
            continue;
        };
        let all_f32 = match &op {
            Op::Unary(_, x) | Op::Identity(x) => is_f32(x),
            Op::Binary(_, l, r) => [l, r]
                .iter()
                .all(|a| matches!(a, Arg::Scalar(_)) || matches!(a, Arg::Tensor(t) if is_f32(t))),
        };
        if !all_f32 || !is_f32(&y) {
            continue;
        }
        let continues = |v: &str| open.contains_key(v) && readers_of(v) == 1;
        // `(x * s) * b` with `s` a power of two, `x * s` a chain of that one step and `b` the
        // end of another chain, both read only here: `b`'s chain takes `* x` and then `* s`
        // (the same values: a product scaled by a power of two rounds as its factor scaled
        // would, while both stay normal numbers), so that GPT-2's tanh GELU, `0.5 * x * (1 +
        // tanh(...))`, is one chain rather than two.
        if let Op::Binary(Binary::Mul, Arg::Tensor(l), Arg::Tensor(r)) = &op {
            let scaled = |a: &str| -> Option<(usize, String, f32)> {
                let c = *open.get(a)?;
                let chain = &chains[c];
                match chain.steps.as_slice() {
                    [("mul", -1, s)] if chain.nodes.len() == 1 && readers_of(a) == 1 => {
                        let power_of_two = s.is_normal() && s.to_bits() & 0x007f_ffff == 0;
                        power_of_two.then(|| (c, chain.tensors[0].clone(), *s))
                    }
                    _ => None,
                }
            };
            let merge = [(l, r), (r, l)].into_iter().find_map(|(a, b)| {
                let (from, x, s) = scaled(a)?;
                let into = *open.get(b.as_str())?;
                let fits = into != from
                    && readers_of(b) == 1
                    && same_meta(graph, b, &y)
                    && same_meta(graph, &x, &y);
                fits.then(|| (from, into, x, s, [a.clone(), b.clone()]))
            });
            if let Some((from, into, x, s, values)) = merge {
                for v in &values {
                    open.remove(v);
                }
                let nodes = std::mem::take(&mut chains[from].nodes);
                chains[from].steps.clear();
                let chain = &mut chains[into];
                let k = chain.operand(x);
                chain.steps.push(("mul", k, 0.0));
                chain.steps.push(("mul", -1, s));
                chain.nodes.extend(nodes);
                chain.nodes.push(i);
                chain.nodes.sort_unstable();
                open.insert(y, into);
                continue;
            }
        }
        // The value the step maps, and the step (its name and operand, if any).
        let (acc, step): (String, Option<(&'static str, Option<Arg>)>) = match op {
            Op::Unary(u, x) => (x, Some((u.name(), None))),
            Op::Identity(x) => (x, None),
            Op::Binary(b, l, r) => {
                let options = [(l.clone(), b, r.clone()), (r, b.swapped(), l)];
                let fits =
                    |a: &Arg, ok: &dyn Fn(&str) -> bool| matches!(a, Arg::Tensor(t) if ok(t));
                let pick = options
                    .iter()
                    .find(|(a, ..)| fits(a, &|t| continues(t) && same_meta(graph, t, &y)))
                    .or_else(|| {
                        options
                            .iter()
                            .find(|(a, ..)| fits(a, &|t| same_meta(graph, t, &y)))
                    });
                let Some((Arg::Tensor(acc), b, other)) = pick else {
                    continue;
                };
                (acc.clone(), Some((b.name(), Some(other.clone()))))
            }
        };
        if !same_meta(graph, &acc, &y) {
            continue;
        }
        let c = match open.remove(&acc) {
            Some(c) if readers_of(&acc) == 1 => c,
            _ => {
                chains.push(Chain {
                    tensors: vec![acc],
                    steps: Vec::new(),
                    nodes: Vec::new(),
                });
                chains.len() - 1
            }
        };
        let chain = &mut chains[c];
        match step {
            None => {}
            Some((name, None)) => chain.steps.push((name, -2, 0.0)),
            Some((name, Some(Arg::Scalar(s)))) => chain.steps.push((name, -1, s)),
            Some((name, Some(Arg::Tensor(t)))) => {
                let k = chain.operand(t);
                chain.steps.push((name, k, 0.0));
            }
        }
        chain.nodes.push(i);
        open.insert(y, c);
    }
    let mut dropped: HashSet<usize> = HashSet::default();
    let mut fused = 0;
    for chain in chains {
        let (Some(&first), Some(&last)) = (chain.nodes.first(), chain.nodes.last()) else {
            continue;
        };
        if chain.nodes.len() < 2 || chain.steps.is_empty() {
            continue;
        }
        // The fused node reads its tensors at the last node's place: nothing between may
        // rebind one (the chain's own nodes are not in place).
        if rebinds_any(&graph.nodes[first + 1..last], |s| {
            chain.tensors.iter().any(|t| t == s)
        }) {
            continue;
        }
        for &k in &chain.nodes[..chain.nodes.len() - 1] {
            dropped.insert(k);
            if let [Argument::AsTensor(v)] = graph.nodes[k].outputs.as_slice() {
                dropped.extend(asserts.get(&v.name).into_iter().flatten());
            }
        }
        let named = |name: &'static str, arg: Argument| NamedArgument {
            name: name.into(),
            arg,
            kind: None,
        };
        let tensors = chain
            .tensors
            .into_iter()
            .map(|name| TensorArgument { name })
            .collect();
        let [ops, operands, scalars] = step_args(&chain.steps);
        let node = &mut graph.nodes[last];
        *node = Node {
            target: TARGET.into(),
            inputs: vec![
                named("tensors", Argument::AsTensors(tensors)),
                named("ops", ops),
                named("operands", operands),
                named("scalars", scalars),
            ],
            outputs: node.outputs.clone(),
            name: node.name.clone(),
        };
        fused += 1;
    }
    drop_nodes(graph, &dropped);
    fused
}

/// A chain's steps (name; operand: an index into its tensors, -1 for the scalar, -2 for none;
/// scalar) as the `ops`, `operands` and `scalars` arguments of a node that carries them.
fn step_args(steps: &[(&str, i64, f32)]) -> [Argument; 3] {
    [
        Argument::AsStrings(steps.iter().map(|s| s.0.to_string()).collect()),
        Argument::AsInts(steps.iter().map(|s| s.1).collect()),
        Argument::AsFloats(
            steps
                .iter()
                .map(|s| JsonFloat::Num(f64::from(s.2)))
                .collect(),
        ),
    ]
}

/// Fold the elementwise work that follows a packed Linear ([`crate::ops::packed::TARGET`])
/// into it: where the Linear's output is read by one node only, a fused chain
/// ([`fuse_pointwise_chains`]) that starts from it (and may read it again: the epilogue's
/// tensor 0, the values the product left), or one elementwise float32 op that such a chain
/// could start with (a gelu; an add of a residual of the same sizes), the Linear node takes
/// that chain's steps and other tensors as its epilogue ([`EPILOGUE_ARGS`]), applied to each
/// stretch of its output as its product finishes it, while it is in cache. A `view` or `reshape` between the two that keeps the
/// last dim (GPT-2's `Conv1D` products, computed on `[rows, n]` and viewed back to `[batch,
/// seq, n]`) is looked through: the Linear then gives its output that shape
/// ([`OUTPUT_SHAPE_ARG`](crate::ops::packed::OUTPUT_SHAPE_ARG)) and the view goes too. The
/// Linear node takes the chain's place (the chain's other tensors may be computed after the
/// Linear, as Llama's `up` projection is after its `gate`) and defines its output; it is left
/// alone where a node between the two rebinds a tensor the Linear reads. Run after
/// `pack_linears`. Returns how many.
pub fn fuse_linear_epilogues(graph: &mut Graph) -> usize {
    use crate::ops::packed::{OUTPUT_SHAPE_ARG, TARGET as LINEAR};
    let (readers, producer) = readers_and_producers(graph);
    let is_f32 = |v: &str| graph.tensor_values.get(v).is_some_and(|m| m.dtype == FLOAT);
    let one_reader = |v: &str| readers.get(v) == Some(&1);
    let sizes = |v: &str| graph.tensor_values.get(v)?.static_sizes();
    // The Linear node producing `v` (directly, or through a view that keeps the last dim:
    // then the view's node and sizes), read `uses` times by the chain, when what it produces
    // has no other reader and it has no epilogue yet.
    let linear_of = |v: &str, uses: usize| -> Option<Source> {
        let mut at = *producer.get(v)?;
        let mut view = None;
        let node = &graph.nodes[at];
        if matches!(
            op_key(&node.target),
            "aten.view.default" | "aten.reshape.default" | "aten._unsafe_view.default"
        ) {
            let u = input_tensor(node, "self")?;
            let (from, to) = (sizes(u)?, sizes(v)?);
            let same = from.last() == to.last()
                && from.iter().product::<i64>() == to.iter().product::<i64>();
            if !(same && one_reader(u) && is_f32(u)) {
                return None;
            }
            view = Some((at, to));
            at = *producer.get(u)?;
        }
        let linear = &graph.nodes[at];
        let free = linear.target == LINEAR
            && readers.get(v) == Some(&uses)
            && !linear.inputs.iter().any(|a| a.name == EPILOGUE_ARGS[1]);
        free.then_some((at, view))
    };
    // (chain node, Linear node, the view looked through, the chain's other tensors, its steps)
    type Plan = (usize, usize, Option<View>, Vec<String>, Vec<Argument>);
    let mut plans: Vec<Plan> = Vec::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        let Some(((j, view), others, steps)) = epilogue_chain(graph, node, &linear_of, &is_f32)
        else {
            continue;
        };
        let reads: Vec<&str> = graph.nodes[j]
            .inputs
            .iter()
            .flat_map(|a| tensor_names(&a.arg))
            .collect();
        if j < i && !rebinds_any(&graph.nodes[j + 1..i], |s| reads.contains(&s)) {
            plans.push((i, j, view, others, steps));
        }
    }
    let mut dropped: HashSet<usize> = HashSet::default();
    for (i, j, view, others, steps) in &plans {
        let mut linear = graph.nodes[*j].clone();
        if let Some((v, shape)) = view {
            linear.inputs.push(NamedArgument {
                name: OUTPUT_SHAPE_ARG.into(),
                arg: Argument::AsInts(shape.clone()),
                kind: None,
            });
            dropped.insert(*v);
        }
        let tensors = others
            .iter()
            .map(|name| TensorArgument { name: name.clone() })
            .collect();
        let args = std::iter::once(Argument::AsTensors(tensors)).chain(steps.iter().cloned());
        for (name, arg) in EPILOGUE_ARGS.iter().zip(args) {
            linear.inputs.push(NamedArgument {
                name: (*name).into(),
                arg,
                kind: None,
            });
        }
        linear.outputs = graph.nodes[*i].outputs.clone();
        graph.nodes[*i] = linear;
        dropped.insert(*j);
    }
    drop_nodes(graph, &dropped);
    plans.len()
}

/// What [`epilogue_chain`] finds a chain's start produced by: a Linear node, and the view
/// between them if any.
type Source = (usize, Option<View>);

/// A view between a Linear and its epilogue: its node, and the sizes it gives.
type View = (usize, Vec<i64>);

/// The chain `node` computes from a free Linear's output (`linear_of` gives the Linear node
/// and the view between): those, the chain's other tensors, and its `ops`, `operands` and
/// `scalars` arguments, numbered as an epilogue numbers them (the Linear's output read again
/// is tensor 0). `None` where `node` is no such chain.
fn epilogue_chain(
    graph: &Graph,
    node: &Node,
    linear_of: &dyn Fn(&str, usize) -> Option<Source>,
    is_f32: &dyn Fn(&str) -> bool,
) -> Option<(Source, Vec<String>, Vec<Argument>)> {
    let arg = |name: &str| input_arg(node, name);
    if node.target == TARGET {
        let Some(Argument::AsTensors(ts)) = arg("tensors") else {
            return None;
        };
        let start = &ts.first()?.name;
        let uses = ts.iter().filter(|t| t.name == *start).count();
        let j = linear_of(start, uses)?;
        let (Some(ops), Some(scalars), Some(Argument::AsInts(operands))) =
            (arg("ops"), arg("scalars"), arg("operands"))
        else {
            return None;
        };
        // The start read again is tensor 0 to the epilogue (the values before its steps);
        // the other tensors are numbered from 1 without it.
        let mut others = Vec::new();
        let mut renumbered = vec![0i64; ts.len()];
        for (k, t) in ts.iter().enumerate().skip(1) {
            if t.name != *start {
                others.push(t.name.clone());
                renumbered[k] = others.len() as i64;
            }
        }
        let operands = operands
            .iter()
            .map(|&k| match usize::try_from(k) {
                Ok(k) => renumbered.get(k).copied(),
                Err(_) => Some(k),
            })
            .collect::<Option<Vec<i64>>>()?;
        let steps = vec![ops.clone(), Argument::AsInts(operands), scalars.clone()];
        return Some((j, others, steps));
    }
    // One op: the Linear (its output the running value) and the step's operand if any.
    let (op, y) = parse(node)?;
    let ((j, acc), name, other) = match op {
        Op::Unary(u, x) => ((linear_of(&x, 1)?, x), u.name(), None),
        Op::Binary(b, l, r) => [(l.clone(), b, r.clone()), (r, b.swapped(), l)]
            .into_iter()
            .find_map(|(a, b, other)| match a {
                Arg::Tensor(t) => Some(((linear_of(&t, 1)?, t), b.name(), Some(other))),
                Arg::Scalar(_) => None,
            })?,
        Op::Identity(_) => return None,
    };
    if !is_f32(&acc) || !same_meta(graph, &acc, &y) {
        return None;
    }
    let (others, step) = match other {
        None => (Vec::new(), (name, -2, 0.0)),
        Some(Arg::Scalar(s)) => (Vec::new(), (name, -1, s)),
        Some(Arg::Tensor(t)) if t != acc && is_f32(&t) => (vec![t], (name, 1, 0.0)),
        Some(Arg::Tensor(_)) => return None,
    };
    Some((j, others, step_args(&[step]).into()))
}

/// `node` as an elementwise op and its one tensor output, or `None`.
fn parse(node: &Node) -> Option<(Op, String)> {
    let [Argument::AsTensor(y)] = node.outputs.as_slice() else {
        return None;
    };
    let operand = |name: &str| match &node.inputs.iter().find(|a| a.name == name)?.arg {
        Argument::AsTensor(t) => Some(Arg::Tensor(t.name.clone())),
        Argument::AsFloat(f) => Some(f.get())
            .filter(|v| v.is_finite())
            .map(|v| Arg::Scalar(v as f32)),
        // Through f64, as the op's own kernel converts a scalar.
        Argument::AsInt(i) => Some(Arg::Scalar(*i as f64 as f32)),
        _ => None,
    };
    let x = || input_tensor(node, "self").map(str::to_string);
    let unary = |u: Unary| Some(Op::Unary(u, x()?));
    let binary = |b: Binary| Some(Op::Binary(b, operand("self")?, operand("other")?));
    let op = match op_key(&node.target) {
        "aten.add.Tensor" | "aten.add.Scalar" if input_float(node, "alpha", 1.0) == Some(1.0) => {
            binary(Binary::Add)?
        }
        "aten.sub.Tensor" | "aten.sub.Scalar" if input_float(node, "alpha", 1.0) == Some(1.0) => {
            binary(Binary::Sub)?
        }
        "aten.mul.Tensor" | "aten.mul.Scalar" => binary(Binary::Mul)?,
        "aten.div.Tensor" | "aten.div.Scalar" => binary(Binary::Div)?,
        "aten.neg.default" => unary(Unary::Neg)?,
        "aten.relu.default" => unary(Unary::Relu)?,
        "aten.silu.default" => unary(Unary::Silu)?,
        "aten.sigmoid.default" => unary(Unary::Sigmoid)?,
        "aten.tanh.default" => unary(Unary::Tanh)?,
        "aten.exp.default" => unary(Unary::Exp)?,
        "aten.rsqrt.default" => unary(Unary::Rsqrt)?,
        "aten.sqrt.default" => unary(Unary::Sqrt)?,
        "aten.pow.Tensor_Scalar" => match input_float(node, "exponent", f64::NAN)? {
            2.0 => unary(Unary::Square)?,
            3.0 => unary(Unary::Cube)?,
            0.5 => unary(Unary::Sqrt)?,
            _ => return None,
        },
        "aten.to.dtype" => match input_arg(node, "dtype")? {
            Argument::AsScalarType(FLOAT) => Op::Identity(x()?),
            _ => return None,
        },
        "aten.gelu.default" => match input_arg(node, "approximate") {
            None => unary(Unary::Gelu)?,
            Some(Argument::AsString(m)) if m == "none" => unary(Unary::Gelu)?,
            Some(Argument::AsString(m)) if m == "tanh" => unary(Unary::GeluTanh)?,
            _ => return None,
        },
        _ => return None,
    };
    Some((op, y.name.clone()))
}
