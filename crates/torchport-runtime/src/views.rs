//! In-place updates of views. The runtime runs an in-place op functionally and binds the
//! result to the mutated name; when the mutated tensor is a view (`x[:, :2] += 1`, a mask
//! filled slice by slice) whose base is read later, [`write_back_view_updates`] adds the
//! scatters that carry the update into the base, as `run_decompositions()` would have
//! written it; what it cannot express that way is refused by [`check_inplace_views`].

use crate::fast::{HashMap, HashSet};

use crate::error::{Error, Result};
use crate::ops::{functional_name, is_in_place, op_key};
use crate::program::used_names;
use crate::schema::{Argument, Graph, NamedArgument, Node, OptionalTensorArgument, TensorArgument};

/// Ops whose outputs share memory with their `self` input in torch.
pub(crate) fn is_view_op(key: &str) -> bool {
    let base = key.split('.').nth(1).unwrap_or("");
    matches!(
        base,
        "view"
            | "_unsafe_view"
            | "_reshape_alias"
            | "reshape"
            | "view_as"
            | "reshape_as"
            | "flatten"
            | "unflatten"
            | "slice"
            | "select"
            | "narrow"
            | "transpose"
            | "permute"
            | "t"
            | "numpy_T"
            | "unsqueeze"
            | "squeeze"
            | "expand"
            | "expand_as"
            | "as_strided"
            | "alias"
            | "detach"
            | "diagonal"
            | "split"
            | "split_with_sizes"
            | "chunk"
            | "unbind"
            | "unfold"
    )
}

/// In-place ops run functionally: the result is bound to the mutated name only. That is exact
/// unless the mutated tensor shares memory with another value read later (an in-place update
/// of a view, `x[:, :2] += 1`, or of a base whose views are used after). Such programs are
/// refused at load, naming the node, rather than computed wrong; `run_decompositions()`
/// writes them functionally.
pub(crate) fn check_inplace_views(g: &crate::schema::Graph, outputs: &[Argument]) -> Result<()> {
    let mut root: HashMap<&str, &str> = HashMap::default();
    let mut defined: HashMap<&str, usize> = HashMap::default();
    let mut last_read: HashMap<&str, usize> = HashMap::default();
    let mut names = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        for a in &node.inputs {
            used_names(&a.arg, &mut names);
        }
        for n in names.drain(..) {
            last_read.insert(n, i);
        }
    }
    let mut kept = Vec::new();
    for o in outputs {
        used_names(o, &mut kept);
    }
    for n in kept {
        last_read.insert(n, usize::MAX);
    }
    for (i, node) in g.nodes.iter().enumerate() {
        let key = op_key(&node.target);
        let self_name = node
            .inputs
            .iter()
            .find(|a| a.name == "self" || a.name == "input")
            .and_then(|a| match &a.arg {
                Argument::AsTensor(t) => Some(t.name.as_str()),
                _ => None,
            });
        if let (Some(s), true) = (self_name, is_in_place(key)) {
            let r = root.get(s).copied().unwrap_or(s);
            let shared = defined.iter().find(|(&n, &d)| {
                d < i
                    && n != s
                    && (n == r || root.get(n) == Some(&r))
                    && last_read.get(n).is_some_and(|&l| l > i)
            });
            let base_read_later = r != s && last_read.get(r).is_some_and(|&l| l > i);
            if let Some(other) = shared.map(|(n, _)| *n).or(base_read_later.then_some(r)) {
                return Err(Error::Program(format!(
                    "node '{}' ({key}) updates '{s}' in place, which shares memory with \
                     '{other}', read later; in-place updates of views are not supported \
                     (export with ep.run_decompositions() to write them functionally)",
                    node.name.as_deref().unwrap_or("?")
                )));
            }
        }
        for out in &node.outputs {
            let mut outs = Vec::new();
            used_names(out, &mut outs);
            for o in outs {
                let name: &str = match out {
                    Argument::AsTensor(t) if t.name == o => t.name.as_str(),
                    Argument::AsTensors(ts) => match ts.iter().find(|t| t.name == o) {
                        Some(t) => t.name.as_str(),
                        None => continue,
                    },
                    _ => continue,
                };
                defined.insert(name, i);
                // A view, or the result of an in-place op (the mutated tensor itself).
                let aliases = is_view_op(key) || is_in_place(key);
                if let (true, Some(s)) = (aliases, self_name) {
                    root.insert(name, root.get(s).copied().unwrap_or(s));
                }
            }
        }
    }
    Ok(())
}

/// The name of a node's `self` (or `input`) tensor argument.
pub(crate) fn self_name(node: &Node) -> Option<&str> {
    node.inputs
        .iter()
        .find(|a| a.name == "self" || a.name == "input")
        .and_then(|a| match &a.arg {
            Argument::AsTensor(t) => Some(t.name.as_str()),
            _ => None,
        })
}

/// The single tensor a node defines.
fn tensor_output(node: &Node) -> Option<&str> {
    match node.outputs.as_slice() {
        [Argument::AsTensor(t)] => Some(t.name.as_str()),
        _ => None,
    }
}

/// Rewrite each in-place op on a chain of `slice` / `select` views whose base (or any view
/// on the chain) is read afterwards: the op runs functionally, `slice_scatter` /
/// `select_scatter` nodes put its result back into each level of the chain up to the base,
/// and every later read of a level (and the graph's outputs) reads the updated value. A
/// base that is itself an alias (a view, or an in-place op's result) is left alone, so that
/// [`check_inplace_views`] refuses it.
///
/// Returns, for each value whose reads were renamed, the name that holds its final value
/// (how a buffer updated through a view gets its new value).
pub(crate) fn write_back_view_updates(g: &mut Graph) -> HashMap<String, String> {
    let mut latest: HashMap<String, String> = HashMap::default();
    let mut i = 0;
    while i < g.nodes.len() {
        if let Some((inserted, renames)) = write_back(g, i) {
            for (old, new) in &renames {
                let origin = latest
                    .iter()
                    .find(|(_, current)| *current == old)
                    .map(|(o, _)| o.clone())
                    .unwrap_or_else(|| old.clone());
                latest.insert(origin, new.clone());
            }
            let at = i + 1 + inserted.len();
            g.nodes.splice(i + 1..i + 1, inserted);
            for node in &mut g.nodes[at..] {
                for a in &mut node.inputs {
                    rename(&mut a.arg, &renames);
                }
            }
            for o in &mut g.outputs {
                rename(o, &renames);
            }
            for (old, new) in &renames {
                if let Some(meta) = g.tensor_values.get(old).cloned() {
                    g.tensor_values.entry(new.clone()).or_insert(meta);
                }
            }
            i = at;
        } else {
            i += 1;
        }
    }
    latest
}

/// For in-place node `i` that updates a view chain read later: make it functional and
/// return the scatter nodes to insert after it, and the renames for later reads.
fn write_back(g: &mut Graph, i: usize) -> Option<(Vec<Node>, HashMap<String, String>)> {
    let node = &g.nodes[i];
    let key = op_key(&node.target);
    let functional = functional_name(key)?;
    if is_view_op(key) {
        return None;
    }
    let out = tensor_output(node)?.to_string();
    // Most in-place ops (a `relu_` on a conv's output) update no view: leave those before
    // building the maps below, so that a graph of many in-place ops loads in linear time.
    let mutated = self_name(node)?;
    let made_by_view = g.nodes[..i]
        .iter()
        .rev()
        .find(|n| tensor_output(n) == Some(mutated))
        .is_some_and(|n| matches!(op_key(&n.target), "aten.slice.Tensor" | "aten.select.int"));
    if !made_by_view {
        return None;
    }
    let producers: HashMap<&str, usize> = g.nodes[..i]
        .iter()
        .enumerate()
        .filter_map(|(j, n)| tensor_output(n).map(|o| (o, j)))
        .collect();
    // The chain from the mutated view up to its base: (view, the node defining it).
    let mut chain: Vec<(String, usize)> = Vec::new();
    let mut cur = self_name(node)?.to_string();
    while let Some(&j) = producers.get(cur.as_str()) {
        // A crafted graph may define a name by reading itself: no chain then.
        if chain.iter().any(|(v, _)| *v == cur) || chain.len() > i {
            return None;
        }
        let def = &g.nodes[j];
        if !matches!(op_key(&def.target), "aten.slice.Tensor" | "aten.select.int") {
            break;
        }
        chain.push((cur, j));
        cur = self_name(def)?.to_string();
    }
    let base = cur;
    if chain.is_empty() {
        return None;
    }
    // The base must own its memory: not a view or an in-place result of something else.
    if let Some(&j) = producers.get(base.as_str()) {
        let k = op_key(&g.nodes[j].target);
        if is_view_op(k) || is_in_place(k) {
            return None;
        }
    }
    let mut later = HashSet::default();
    for n in &g.nodes[i + 1..] {
        let mut names = Vec::new();
        for a in &n.inputs {
            used_names(&a.arg, &mut names);
        }
        later.extend(names);
    }
    for o in &g.outputs {
        let mut names = Vec::new();
        used_names(o, &mut names);
        later.extend(names);
    }
    let levels: Vec<&str> = chain
        .iter()
        .map(|(v, _)| v.as_str())
        .chain([base.as_str()])
        .collect();
    if !levels.iter().any(|v| later.contains(*v)) {
        return None;
    }
    // Another view of the same base, made before the update and read after it, would keep
    // the old values: left to the check, which refuses it.
    let mut root: HashMap<String, String> = HashMap::default();
    for n in &g.nodes[..i] {
        let k = op_key(&n.target);
        let Some(s) = self_name(n) else { continue };
        if is_view_op(k) || is_in_place(k) {
            let r = root.get(s).cloned().unwrap_or_else(|| s.to_string());
            let mut outs = Vec::new();
            n.outputs.iter().for_each(|o| used_names(o, &mut outs));
            for o in outs {
                root.insert(o.to_string(), r.clone());
            }
        }
    }
    let stale = root
        .iter()
        .any(|(n, r)| *r == base && !levels.contains(&n.as_str()) && later.contains(n.as_str()));
    if stale {
        return None;
    }
    let mut renames = HashMap::default();
    renames.insert(chain[0].0.clone(), out.clone());
    let mut src = out;
    let mut inserted = Vec::new();
    for (level, (_, j)) in chain.iter().enumerate() {
        let def = &g.nodes[*j];
        let parent = levels[level + 1].to_string();
        let fresh = format!(
            "{parent}__updated_by_{}",
            g.nodes[i].name.as_deref().unwrap_or("node")
        );
        let scatter = if op_key(&def.target) == "aten.slice.Tensor" {
            "torch.ops.aten.slice_scatter.default"
        } else {
            "torch.ops.aten.select_scatter.default"
        };
        let mut inputs = vec![tensor_arg("self", &parent), tensor_arg("src", &src)];
        inputs.extend(
            def.inputs
                .iter()
                .filter(|a| matches!(&*a.name, "dim" | "start" | "end" | "step" | "index"))
                .cloned(),
        );
        inserted.push(Node {
            target: scatter.to_string(),
            inputs,
            outputs: vec![Argument::AsTensor(TensorArgument {
                name: fresh.clone(),
            })],
            name: Some(fresh.clone()),
        });
        renames.insert(parent, fresh.clone());
        src = fresh;
    }
    g.nodes[i].target = format!("torch.ops.{functional}");
    Some((inserted, renames))
}

fn tensor_arg(name: &'static str, value: &str) -> NamedArgument {
    NamedArgument {
        name: name.into(),
        arg: Argument::AsTensor(TensorArgument {
            name: value.to_string(),
        }),
        kind: None,
    }
}

/// Rename the tensors an argument reads.
pub(crate) fn rename(arg: &mut Argument, renames: &HashMap<String, String>) {
    let one = |t: &mut TensorArgument| {
        if let Some(n) = renames.get(&t.name) {
            t.name = n.clone();
        }
    };
    match arg {
        Argument::AsTensor(t) | Argument::AsOptionalTensor(OptionalTensorArgument::AsTensor(t)) => {
            one(t)
        }
        Argument::AsTensors(ts) => ts.iter_mut().for_each(one),
        Argument::AsOptionalTensors(ts) => ts.iter_mut().for_each(|t| {
            if let OptionalTensorArgument::AsTensor(t) = t {
                one(t)
            }
        }),
        _ => {}
    }
}
