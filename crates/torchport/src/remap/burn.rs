//! The `burn` preset: PyTorch `state_dict` names and layouts to the record names and layouts
//! of Burn 0.22's `nn` modules (field names read from burn-nn 0.22.1's source):
//!
//! - `Linear { weight: [d_input, d_output], bias }` (default `LinearLayout::Row`): weights
//!   transposed.
//! - `Lstm { input_gate, forget_gate, cell_gate, output_gate }`, `Gru { update_gate,
//!   reset_gate, new_gate }`, `Rnn { gate }`, each gate a `GateController { input_transform,
//!   hidden_transform }` of two Linears; `BiLstm` / `BiGru` / `BiRnn { forward, reverse }`.
//!   Several layers become a `Vec`: `prefix.<layer>.…`.
//! - `MultiHeadAttention { query, key, value, output }` (Linears).
//! - `BatchNorm { gamma, beta, running_mean, running_var }` (no batch counter);
//!   `LayerNorm` / `GroupNorm` / `InstanceNorm` / `RmsNorm { gamma, beta }`; `PRelu { alpha }`.
//! - `Embedding { weight: [n_embedding, d_model] }` and convolutions: unchanged.
//!
//! A lone 2-D `weight` (Linear without bias, or Embedding) or a lone 1-D `weight` (norm
//! without bias, or PReLU) is decided by the module's class when the file is a whole pickled
//! model, or by the target's shape for that name; otherwise it is left as it is and listed.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::presets::{join, lit, rnn_groups, Classes, Gen, RnnKind};
use super::{Context, TensorMeta};
use crate::error::Result;

/// What a module is, for the burn preset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Linear,
    BatchNorm,
    Norm,
    PRelu,
    Keep,
}

/// The class-name evidence (`Linear`, `BatchNorm2d`, …).
fn kind_of_class(class: &str) -> Option<Kind> {
    Some(match class {
        "Linear" | "NonDynamicallyQuantizableLinear" | "LazyLinear" => Kind::Linear,
        c if c.starts_with("BatchNorm") || c == "SyncBatchNorm" => Kind::BatchNorm,
        "LayerNorm" | "GroupNorm" | "RMSNorm" | "InstanceNorm1d" | "InstanceNorm2d"
        | "InstanceNorm3d" => Kind::Norm,
        "PReLU" => Kind::PRelu,
        c if c.starts_with("Embedding") || c.starts_with("Conv") => Kind::Keep,
        _ => return None,
    })
}

const LSTM_GATES: [&str; 4] = ["input_gate", "forget_gate", "cell_gate", "output_gate"];
const GRU_GATES: [&str; 3] = ["reset_gate", "update_gate", "new_gate"];
const RNN_GATES: [&str; 1] = ["gate"];

pub(super) fn expand(g: &mut Gen, metas: &[TensorMeta], ctx: &Context<'_>) -> Result<()> {
    let classes = Classes::new(ctx);
    let by_name: HashMap<&str, &TensorMeta> = metas.iter().map(|m| (m.name.as_str(), m)).collect();
    let target: Option<HashMap<&str, &[usize]>> = ctx.target.map(|t| {
        t.iter()
            .map(|t| (t.name.as_str(), t.shape.as_slice()))
            .collect()
    });
    let mut handled: HashSet<String> = HashSet::new();
    let mut transpose: Vec<String> = Vec::new();

    // 1. LSTM / GRU / RNN.
    for group in rnn_groups(metas, &classes) {
        handled.extend(group.params.iter().map(|p| p.name.clone()));
        handled.extend(group.proj.iter().cloned());
        let kind = match (&group.kind, group.proj.is_empty()) {
            (Err(why), _) => {
                for p in &group.params {
                    g.undecided(&p.name, why.clone());
                }
                continue;
            }
            (Ok(_), false) => {
                for n in group.params.iter().map(|p| &p.name).chain(&group.proj) {
                    g.undecided(n, "an LSTM with proj_size: Burn's Lstm has no projection");
                }
                continue;
            }
            (Ok(kind), true) => *kind,
        };
        let gates: &[&str] = match kind {
            RnnKind::Lstm => &LSTM_GATES,
            RnnKind::Gru => &GRU_GATES,
            RnnKind::Rnn => &RNN_GATES,
        };
        for p in &group.params {
            let mut base = group.prefix.clone();
            if group.layers > 1 {
                base = join(&base, &p.layer.to_string());
            }
            if group.bidirectional {
                base = join(&base, if p.reverse { "reverse" } else { "forward" });
            }
            let side = if p.ih {
                "input_transform"
            } else {
                "hidden_transform"
            };
            let leaf = if p.weight { "weight" } else { "bias" };
            let names: Vec<String> = gates
                .iter()
                .map(|gate| join(&base, &format!("{gate}.{side}.{leaf}")))
                .collect();
            let to = names.iter().map(|n| lit(n)).collect();
            g.exact(
                &p.name,
                super::Op::Split {
                    dim: 0,
                    sizes: None,
                    to,
                },
            )?;
            if p.weight {
                transpose.extend(names);
            }
        }
    }

    // 2. MultiheadAttention.
    for m in metas {
        let Some(prefix) = leaf_prefix(&m.name, "in_proj_weight")
            .or_else(|| leaf_prefix(&m.name, "q_proj_weight"))
        else {
            continue;
        };
        if handled.contains(&m.name) {
            continue;
        }
        mha(g, prefix, &by_name, &mut handled, &mut transpose)?;
    }

    // 3. Everything else, module by module.
    let mut modules: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    for m in metas.iter().filter(|m| !handled.contains(&m.name)) {
        let (prefix, leaf) = m.name.rsplit_once('.').unwrap_or(("", m.name.as_str()));
        let leaves = modules.entry(prefix).or_default();
        if leaves.is_empty() {
            order.push(prefix);
        }
        leaves.push(leaf);
    }
    let mut renames: BTreeMap<(&str, &str), Vec<String>> = BTreeMap::new();
    let mut drops: Vec<String> = Vec::new();
    for prefix in order {
        let leaves = &modules[prefix];
        let get = |leaf: &str| {
            leaves
                .contains(&leaf)
                .then(|| by_name.get(join(prefix, leaf).as_str()).copied())
                .flatten()
        };
        let (w, b) = (get("weight"), get("bias"));
        let Some(w) = w else { continue };
        let want = |name: &str| target.as_ref().and_then(|t| t.get(name).copied());
        let kind = match classes.get(prefix).and_then(kind_of_class) {
            Some(k) => k,
            None => match decide(prefix, w, b, &leaves[..], &want) {
                Ok(k) => k,
                Err(why) => {
                    g.undecided(&w.name, why);
                    continue;
                }
            },
        };
        match kind {
            Kind::Linear => {
                // A target that wants the PyTorch layout ([out, in], LinearLayout::Col) wins.
                let keeps = w.shape.len() == 2
                    && w.shape[0] != w.shape[1]
                    && want(&w.name) == Some(&w.shape[..]);
                if w.shape.len() == 2 && !keeps {
                    transpose.push(w.name.clone());
                }
            }
            Kind::BatchNorm => {
                renames
                    .entry(("weight", "gamma"))
                    .or_default()
                    .push(prefix.to_string());
                if b.is_some() {
                    renames
                        .entry(("bias", "beta"))
                        .or_default()
                        .push(prefix.to_string());
                }
                if leaves.contains(&"num_batches_tracked") {
                    drops.push(join(prefix, "num_batches_tracked"));
                }
            }
            Kind::Norm => {
                renames
                    .entry(("weight", "gamma"))
                    .or_default()
                    .push(prefix.to_string());
                if b.is_some() {
                    renames
                        .entry(("bias", "beta"))
                        .or_default()
                        .push(prefix.to_string());
                }
            }
            Kind::PRelu => renames
                .entry(("weight", "alpha"))
                .or_default()
                .push(prefix.to_string()),
            Kind::Keep => {}
        }
    }
    for ((from, to), prefixes) in &renames {
        g.rename_leaf(prefixes, from, to)?;
    }
    if !transpose.is_empty() {
        g.each(
            &transpose,
            super::Op::Transpose {
                dims: None,
                to: None,
            },
        )?;
    }
    if !drops.is_empty() {
        g.each(&drops, super::Op::Drop)?;
    }
    Ok(())
}

/// `P` when `name` is `P.leaf` (or `""` when it is `leaf`).
fn leaf_prefix<'n>(name: &'n str, leaf: &str) -> Option<&'n str> {
    let p = name.strip_suffix(leaf)?;
    if p.is_empty() {
        Some("")
    } else {
        p.strip_suffix('.')
    }
}

/// What a module with these tensors is, from names, shapes and the target.
fn decide<'t>(
    prefix: &str,
    w: &TensorMeta,
    b: Option<&TensorMeta>,
    leaves: &[&str],
    want: &dyn Fn(&str) -> Option<&'t [usize]>,
) -> std::result::Result<Kind, String> {
    if leaves.contains(&"running_mean") || leaves.contains(&"running_var") {
        return Ok(Kind::BatchNorm);
    }
    match (w.shape.len(), b.map(|b| b.shape.as_slice())) {
        (1, Some(bs)) if bs == w.shape.as_slice() => Ok(Kind::Norm),
        (1, _) => {
            if want(&join(prefix, "gamma")).is_some() {
                Ok(Kind::Norm)
            } else if want(&join(prefix, "alpha")).is_some() {
                Ok(Kind::PRelu)
            } else {
                Err("a 1-D weight with no bias beside it: a norm without bias (Burn: gamma) or a PReLU (Burn: alpha); a whole saved model (module classes) or a target would tell".into())
            }
        }
        (2, Some(&[n])) if n == w.shape[0] => Ok(Kind::Linear),
        (2, _) => {
            let (r, c) = (w.shape[0], w.shape[1]);
            match want(&w.name) {
                Some(&[a, b]) if r != c && [a, b] == [c, r] => Ok(Kind::Linear),
                Some(&[a, b]) if r != c && [a, b] == [r, c] => Ok(Kind::Keep),
                _ => Err(format!(
                    "a 2-D weight [{r}, {c}] with no bias beside it: a Linear without bias (Burn stores it transposed, [in, out]) or an Embedding (kept as [num, dim]); a whole saved model (module classes) or a target would tell, or add a transpose rule"
                )),
            }
        }
        _ => Ok(Kind::Keep), // convolutions and anything else with a >2-D weight
    }
}

/// One `nn.MultiheadAttention` at `p`: its projections become Burn's query/key/value/output.
fn mha(
    g: &mut Gen,
    p: &str,
    by_name: &HashMap<&str, &TensorMeta>,
    handled: &mut HashSet<String>,
    transpose: &mut Vec<String>,
) -> Result<()> {
    let names = ["query", "key", "value"];
    let out = |n: &str, leaf: &str| join(p, &format!("{n}.{leaf}"));
    for (leaf, kind) in [("in_proj_weight", "weight"), ("in_proj_bias", "bias")] {
        let full = join(p, leaf);
        let Some(m) = by_name.get(full.as_str()) else {
            continue;
        };
        handled.insert(full.clone());
        if m.shape.first().map_or(true, |r| r % 3 != 0) {
            g.undecided(
                &full,
                format!("shape {:?} does not divide into query, key, value", m.shape),
            );
            continue;
        }
        let outs: Vec<String> = names.iter().map(|n| out(n, kind)).collect();
        let to = outs.iter().map(|n| lit(n)).collect();
        g.exact(
            &full,
            super::Op::Split {
                dim: 0,
                sizes: None,
                to,
            },
        )?;
        if kind == "weight" {
            transpose.extend(outs);
        }
    }
    for (x, n) in ["q", "k", "v"].iter().zip(names) {
        let full = join(p, &format!("{x}_proj_weight"));
        if by_name.contains_key(full.as_str()) {
            handled.insert(full.clone());
            g.exact(
                &full,
                super::Op::Rename {
                    to: lit(&out(n, "weight")),
                },
            )?;
            transpose.push(out(n, "weight"));
        }
    }
    for leaf in ["weight", "bias"] {
        let full = join(p, &format!("out_proj.{leaf}"));
        if by_name.contains_key(full.as_str()) {
            handled.insert(full.clone());
            g.exact(
                &full,
                super::Op::Rename {
                    to: lit(&out("output", leaf)),
                },
            )?;
            if leaf == "weight" {
                transpose.push(out("output", leaf));
            }
        }
    }
    for leaf in ["bias_k", "bias_v"] {
        let full = join(p, leaf);
        if by_name.contains_key(full.as_str()) {
            handled.insert(full.clone());
            g.undecided(
                &full,
                "add_bias_kv: Burn's MultiHeadAttention has no such bias",
            );
        }
    }
    Ok(())
}
