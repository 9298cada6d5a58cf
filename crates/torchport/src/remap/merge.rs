//! The `merge` rule: find each group of inputs (named by templates from a matched name),
//! check that they fit together, and build one lazy tensor that concatenates or stacks them
//! when its data is asked for (each input read once per production).

use std::borrow::Cow;
use std::collections::HashMap;

use super::engine::{check_unique, Live};
use super::ops;
use super::plan::Step;
use super::rules::{resolve_dim, MergeMode, Rule};
use crate::dtype::DType;
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
        MergeMode::Concat | MergeMode::WeightNorm => resolve_dim(d, rank),
        MergeMode::Stack => resolve_dim(d, rank + 1),
    }
}

fn check_merge(rule: &Rule, live: &[Live<'_>], g: &Group, d: i64, mode: MergeMode) -> Result<()> {
    if mode == MergeMode::WeightNorm {
        return check_weight_norm(rule, live, g);
    }
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

/// The dim along which weight norm's `g` (shape `gs`) varies for a `v` of shape `vs`:
/// `Ok(None)` for the whole-tensor norm (one element), `Err` when `g` does not fit `v`.
pub(crate) fn weight_norm_dim(
    gs: &[usize],
    vs: &[usize],
) -> std::result::Result<Option<usize>, ()> {
    if gs.iter().product::<usize>() == 1 && (gs.is_empty() || gs.len() == vs.len()) {
        return Ok(None);
    }
    if gs.len() != vs.len() {
        return Err(());
    }
    let mut found = None;
    for (k, (&a, &b)) in gs.iter().zip(vs).enumerate() {
        if a == 1 {
            continue;
        }
        if a != b || found.is_some() {
            return Err(());
        }
        found = Some(k);
    }
    Ok(found)
}

fn check_weight_norm(rule: &Rule, live: &[Live<'_>], grp: &Group) -> Result<()> {
    let [gi, vi] = grp.inputs[..] else {
        return Err(rule.error(format!(
            "weight-norm takes two inputs (g, then v); `{}` has {}",
            grp.name,
            grp.inputs.len()
        )));
    };
    let (g, v) = (&live[gi].t, &live[vi].t);
    if g.dtype != v.dtype || !matches!(v.dtype, DType::F32 | DType::F64) {
        return Err(rule.error(format!(
            "weight-norm of `{}` ({}) and `{}` ({}): both must be float32 or float64 (cast them first)",
            g.name, g.dtype, v.name, v.dtype
        )));
    }
    if weight_norm_dim(&g.shape, &v.shape).is_err() {
        return Err(rule.error(format!(
            "`{}` of shape {:?} is not the weight-norm magnitude of `{}` of shape {:?}: it must have one element, or the shape of `{}` with every dim but one of length 1",
            g.name, g.shape, v.name, v.shape, v.name
        )));
    }
    Ok(())
}

/// `v * (g / norm(v))`, computed in float64 and rounded once to the dtype: within 1 ulp of
/// torch, whose fused kernels round the norm, the scale and the product to float32 each, the
/// norm summed in a vectorized order that depends on the CPU.
fn weight_norm_bytes(g: &[u8], v: &[u8], gs: &[usize], vs: &[usize], dtype: DType) -> Vec<u8> {
    let to_f64 = |b: &[u8]| -> Vec<f64> {
        match dtype {
            DType::F64 => b
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect(),
            _ => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap_or([0; 4])) as f64)
                .collect(),
        }
    };
    let (gv, vv) = (to_f64(g), to_f64(v));
    let d = weight_norm_dim(gs, vs).ok().flatten();
    let (outer, len, inner) = match d {
        Some(d) => (
            vs[..d].iter().product::<usize>(),
            vs[d],
            vs[d + 1..].iter().product::<usize>(),
        ),
        None => (1, 1, vv.len()),
    };
    let mut sums = vec![0f64; len];
    for o in 0..outer {
        for (i, sum) in sums.iter_mut().enumerate() {
            let start = (o * len + i) * inner;
            *sum += vv[start..start + inner].iter().map(|x| x * x).sum::<f64>();
        }
    }
    let mut out = Vec::with_capacity(v.len());
    for o in 0..outer {
        for (i, sum) in sums.iter().enumerate() {
            let start = (o * len + i) * inner;
            let gi = if d.is_some() { gv[i] } else { gv[0] };
            for &x in &vv[start..start + inner] {
                let w = x * (gi / sum.sqrt());
                match dtype {
                    DType::F64 => out.extend_from_slice(&w.to_le_bytes()),
                    _ => out.extend_from_slice(&(w as f32).to_le_bytes()),
                }
            }
        }
    }
    out
}

/// The merged parts' tensors, and the union of their sources and steps (first-seen order).
fn gather(parts: Vec<Live<'_>>) -> (Vec<OutTensor<'_>>, Vec<usize>, Vec<Step>) {
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
    (tensors, sources, steps)
}

fn build_weight_norm<'a>(rule: &Rule, parts: Vec<Live<'a>>, name: &str) -> Live<'a> {
    let (tensors, sources, mut steps) = gather(parts);
    let (gs, vs) = (tensors[0].shape.clone(), tensors[1].shape.clone());
    let over = match weight_norm_dim(&gs, &vs).ok().flatten() {
        Some(d) => format!("over every dim but {d}"),
        None => "over the whole tensor".to_string(),
    };
    let op = format!(
        "weight norm v * (g / norm(v)) of g `{}`, v `{}`, {over}",
        tensors[0].name, tensors[1].name
    );
    let dtype = tensors[1].dtype;
    let t = OutTensor::new(name.to_string(), dtype, vs.clone(), move || {
        let g = tensors[0].data()?;
        let v = tensors[1].data()?;
        Ok(Cow::Owned(weight_norm_bytes(&g, &v, &gs, &vs, dtype)))
    });
    steps.push(Step {
        rule: rule.label(),
        op,
    });
    Live { t, sources, steps }
}

fn build_merge<'a>(
    rule: &Rule,
    parts: Vec<Live<'a>>,
    name: &str,
    d: i64,
    mode: MergeMode,
) -> Live<'a> {
    if mode == MergeMode::WeightNorm {
        return build_weight_norm(rule, parts, name);
    }
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
    let (tensors, sources, mut steps) = gather(parts);
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
