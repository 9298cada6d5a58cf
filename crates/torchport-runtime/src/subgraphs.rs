//! Higher-order ops that only wrap a subgraph in a context with no effect on inference —
//! `wrap_with_autocast` with autocast disabled (an `autocast(enabled=False)` block) and
//! `wrap_with_set_grad_enabled` — are inlined at load: the subgraph's nodes replace the
//! call, reading the call's operands and defining its outputs. Its own value names get the
//! call's name as a prefix, so they cannot collide with the outer graph's. An enabled
//! autocast region (its ops computed in a lower precision) is refused.

use crate::fast::HashMap;

use crate::error::{Error, Result};
use crate::ops::op_key;
use crate::schema::{
    Argument, Graph, OptionalTensorArgument, SymBoolArgument, SymFloatArgument, SymIntArgument,
};

/// Inline every wrapper call of `g`, nested ones included.
pub(crate) fn inline_wrappers(g: &mut Graph) -> Result<()> {
    let mut i = 0;
    while i < g.nodes.len() {
        let key = op_key(&g.nodes[i].target).to_string();
        let operands_from = match key.as_str() {
            "higher_order.wrap_with_autocast" => {
                // (device_type, dtype, enabled, cache_enabled, subgraph, *operands)
                if matches!(
                    g.nodes[i].inputs.get(2).map(|a| &a.arg),
                    Some(Argument::AsBool(true))
                ) {
                    return Err(Error::Program(format!(
                        "node '{}' runs a subgraph under autocast (its ops in a lower \
                         precision); autocast regions are not supported",
                        g.nodes[i].name.as_deref().unwrap_or("?")
                    )));
                }
                4
            }
            // (enabled, subgraph, *operands)
            "higher_order.wrap_with_set_grad_enabled" => 1,
            _ => {
                i += 1;
                continue;
            }
        };
        let node = g.nodes.remove(i);
        let prefix = format!("{}::", node.name.as_deref().unwrap_or("wrap"));
        let bad = |what: &str| {
            Error::Program(format!(
                "node '{}' ({key}): {what}",
                node.name.as_deref().unwrap_or("?")
            ))
        };
        let Some(Argument::AsGraph(sub)) = node.inputs.get(operands_from).map(|a| &a.arg) else {
            return Err(bad("no subgraph argument"));
        };
        let mut sub: Graph = serde_json::from_value(sub.get("graph").cloned().unwrap_or_default())
            .map_err(|e| bad(&format!("unreadable subgraph: {e}")))?;
        let operands = &node.inputs[operands_from + 1..];
        if operands.len() != sub.inputs.len() || node.outputs.len() != sub.outputs.len() {
            return Err(bad(&format!(
                "{} operands and {} outputs for a subgraph of {} inputs and {} outputs",
                operands.len(),
                node.outputs.len(),
                sub.inputs.len(),
                sub.outputs.len()
            )));
        }
        // Subgraph inputs read the operands; its outputs define the call's outputs.
        let mut map: HashMap<String, String> = HashMap::default();
        for (param, operand) in sub.inputs.iter().zip(operands) {
            bind(param, &operand.arg, &mut map);
        }
        let mut outputs = HashMap::default();
        for (inner, outer) in sub.outputs.iter().zip(&node.outputs) {
            bind(inner, outer, &mut outputs);
        }
        let mut rename = |n: &mut String| {
            *n = match map.get(n.as_str()) {
                Some(outer) => outer.clone(),
                None => outputs
                    .get(n.as_str())
                    .cloned()
                    .unwrap_or_else(|| format!("{prefix}{n}")),
            };
        };
        for n in &mut sub.nodes {
            for a in &mut n.inputs {
                names(&mut a.arg, &mut rename);
            }
            for o in &mut n.outputs {
                names(o, &mut rename);
            }
            if let Some(name) = &mut n.name {
                *name = format!("{prefix}{name}");
            }
        }
        for (name, meta) in std::mem::take(&mut sub.tensor_values) {
            let mut name = name;
            rename(&mut name);
            g.tensor_values.entry(name).or_insert(meta);
        }
        // The inlined nodes are looked at again: they may hold wrappers of their own.
        g.nodes.splice(i..i, sub.nodes);
    }
    Ok(())
}

/// Record that value `inner` (a subgraph placeholder or output) is `outer`.
fn bind(inner: &Argument, outer: &Argument, map: &mut HashMap<String, String>) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    names(&mut inner.clone(), &mut |n: &mut String| a.push(n.clone()));
    names(&mut outer.clone(), &mut |n: &mut String| b.push(n.clone()));
    map.extend(a.into_iter().zip(b));
}

/// Apply `f` to every value name an argument holds.
fn names(arg: &mut Argument, f: &mut dyn FnMut(&mut String)) {
    use OptionalTensorArgument as O;
    match arg {
        Argument::AsTensor(t) | Argument::AsOptionalTensor(O::AsTensor(t)) => f(&mut t.name),
        Argument::AsTensors(ts) => ts.iter_mut().for_each(|t| f(&mut t.name)),
        Argument::AsOptionalTensors(ts) => {
            for t in ts {
                if let O::AsTensor(t) = t {
                    f(&mut t.name)
                }
            }
        }
        Argument::AsSymInt(SymIntArgument::AsName(n))
        | Argument::AsSymFloat(SymFloatArgument::AsName(n))
        | Argument::AsSymBool(SymBoolArgument::AsName(n)) => f(n),
        Argument::AsSymInts(v) => {
            for s in v {
                if let SymIntArgument::AsName(n) = s {
                    f(n)
                }
            }
        }
        Argument::AsSymFloats(v) => {
            for s in v {
                if let SymFloatArgument::AsName(n) = s {
                    f(n)
                }
            }
        }
        Argument::AsSymBools(v) => {
            for s in v {
                if let SymBoolArgument::AsName(n) = s {
                    f(n)
                }
            }
        }
        _ => {}
    }
}
