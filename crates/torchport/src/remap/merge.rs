//! The `merge` rule: find each group of inputs (named by templates from a matched name),
//! check that they fit together, and build one lazy tensor that concatenates or stacks them
//! when its data is asked for (each input read once per production).

use std::borrow::Cow;
use std::collections::HashMap;

use super::engine::{check_unique, Live};
use super::ops;
use super::plan::Step;
use super::rules::{resolve_dim, MergeMode, Rule};
use crate::error::Result;
use crate::out::OutTensor;

/// One merge: the positions of its inputs (in `inputs` order) and its output name.
struct Group {
    inputs: Vec<usize>,
    name: String,
}

pub(super) fn merge<'a>(
    rule: &Rule,
    live: Vec<Live<'a>>,
    inputs: &[String],
    to: &str,
    d: i64,
    mode: MergeMode,
) -> Result<(Vec<Live<'a>>, usize)> {
    let index: HashMap<&str, usize> = live
        .iter()
        .enumerate()
        .map(|(i, l)| (l.t.name.as_str(), i))
        .collect();
    let mut taken: Vec<Option<usize>> = vec![None; live.len()];
    let mut groups: Vec<Group> = Vec::new();
    let mut matched = 0;
    for (i, l) in live.iter().enumerate() {
        if taken[i].is_some() || !rule.is_match(&l.t.name) {
            continue;
        }
        matched += 1;
        let mut members = Vec::with_capacity(inputs.len());
        for template in inputs {
            let want = rule.expand(&l.t.name, template);
            let &j = index.get(want.as_str()).ok_or_else(|| {
                rule.error(format!(
                    "input `{want}` (from `{template}` for the matched `{}`) is not among the tensors at this point",
                    l.t.name
                ))
            })?;
            if let Some(g) = taken[j] {
                let other: &Group = &groups[g];
                return Err(rule.error(format!(
                    "input `{want}` is already merged into `{}`",
                    other.name
                )));
            }
            if members.contains(&j) {
                return Err(rule.error(format!("input `{want}` is listed twice")));
            }
            members.push(j);
        }
        for &j in &members {
            taken[j] = Some(groups.len());
        }
        groups.push(Group {
            inputs: members,
            name: rule.expand(&l.t.name, to),
        });
    }
    // Check every group before building anything.
    for g in &groups {
        check_merge(rule, &live, g, d, mode)?;
    }
    let first: HashMap<usize, usize> = groups
        .iter()
        .enumerate()
        .map(|(gi, g)| (g.inputs.iter().copied().min().unwrap_or(0), gi))
        .collect();
    let mut slots: Vec<Option<Live<'a>>> = live.into_iter().map(Some).collect();
    let mut out = Vec::with_capacity(slots.len());
    for i in 0..slots.len() {
        if let Some(&gi) = first.get(&i) {
            let g = &groups[gi];
            let parts: Vec<Live<'a>> = g.inputs.iter().filter_map(|&j| slots[j].take()).collect();
            out.push(build_merge(rule, parts, &g.name, d, mode));
        } else if taken[i].is_none() {
            if let Some(l) = slots[i].take() {
                out.push(l);
            }
        }
    }
    check_unique(rule, &out)?;
    Ok((out, matched))
}

/// The dim of a merge, resolved against the inputs' rank (one more when stacking).
fn merge_dim(d: i64, rank: usize, mode: MergeMode) -> Option<usize> {
    match mode {
        MergeMode::Concat => resolve_dim(d, rank),
        MergeMode::Stack => resolve_dim(d, rank + 1),
    }
}

fn check_merge(rule: &Rule, live: &[Live<'_>], g: &Group, d: i64, mode: MergeMode) -> Result<()> {
    let first = &live[g.inputs[0]].t;
    let dd = merge_dim(d, first.shape.len(), mode).ok_or_else(|| {
        rule.error(format!(
            "dim {d} is out of range to {} `{}` of shape {:?}",
            if mode == MergeMode::Stack {
                "stack"
            } else {
                "concatenate"
            },
            first.name,
            first.shape
        ))
    })?;
    for &j in &g.inputs[1..] {
        let t = &live[j].t;
        if t.dtype != first.dtype {
            return Err(rule.error(format!(
                "cannot merge `{}` ({}) with `{}` ({}): the dtypes differ",
                first.name, first.dtype, t.name, t.dtype
            )));
        }
        let fits = t.shape.len() == first.shape.len()
            && t.shape
                .iter()
                .zip(&first.shape)
                .enumerate()
                .all(|(k, (a, b))| a == b || (mode == MergeMode::Concat && k == dd));
        if !fits {
            return Err(rule.error(format!(
                "cannot merge `{}` of shape {:?} with `{}` of shape {:?}: {}",
                first.name,
                first.shape,
                t.name,
                t.shape,
                if mode == MergeMode::Stack {
                    "stacking needs equal shapes".to_string()
                } else {
                    format!("shapes must be equal except along dim {dd}")
                }
            )));
        }
    }
    Ok(())
}

fn build_merge<'a>(
    rule: &Rule,
    parts: Vec<Live<'a>>,
    name: &str,
    d: i64,
    mode: MergeMode,
) -> Live<'a> {
    let rank = parts[0].t.shape.len();
    let dtype = parts[0].t.dtype;
    // Checked by check_merge.
    let dd = merge_dim(d, rank, mode).unwrap_or(0);
    // Stacking is concatenation of the inputs seen with a length-1 dim inserted at `dd`.
    let shapes: Vec<Vec<usize>> = parts
        .iter()
        .map(|p| {
            let mut s = p.t.shape.clone();
            if mode == MergeMode::Stack {
                s.insert(dd, 1);
            }
            s
        })
        .collect();
    let mut out_shape = shapes[0].clone();
    out_shape[dd] = shapes.iter().map(|s| s[dd]).sum();
    let input_names: Vec<String> = parts.iter().map(|p| format!("`{}`", p.t.name)).collect();
    let mut sources = Vec::new();
    let mut steps = Vec::new();
    let mut tensors = Vec::with_capacity(parts.len());
    for p in parts {
        for s in p.sources {
            if !sources.contains(&s) {
                sources.push(s);
            }
        }
        for s in p.steps {
            if !steps.contains(&s) {
                steps.push(s);
            }
        }
        tensors.push(p.t);
    }
    let esize = dtype.size();
    let t = OutTensor::new(name.to_string(), dtype, out_shape, move || {
        let data = tensors
            .iter()
            .map(|t| t.data())
            .collect::<Result<Vec<_>>>()?;
        Ok(Cow::Owned(ops::concat(&data, &shapes, esize, dd)))
    });
    steps.push(Step {
        rule: rule.label(),
        op: format!(
            "{} {} along dim {dd}",
            if mode == MergeMode::Stack {
                "stack"
            } else {
                "concat"
            },
            input_names.join(", ")
        ),
    });
    Live { t, sources, steps }
}
