//! Running a [`RuleSet`] over tensors: each stage maps the list of live tensors to the next,
//! recording in the [`Plan`] what every output came from and which steps made it.

use std::borrow::Cow;
use std::collections::HashMap;
use std::rc::Rc;

use super::ops;
use super::plan::{Dropped, Plan, PlanTarget, Step};
use super::presets;
use super::rules::{resolve_dim, Op, Rule};
use super::{Context, RuleSet, Stage, TensorMeta};
use crate::cast;
use crate::error::{Error, Result};
use crate::out::OutTensor;

/// A tensor between stages, with its lineage.
pub(super) struct Live<'a> {
    pub t: OutTensor<'a>,
    pub sources: Vec<usize>,
    pub steps: Vec<Step>,
}

impl Live<'_> {
    fn step(&mut self, rule: &Rule, op: String) {
        self.steps.push(Step {
            rule: rule.label(),
            op,
        });
    }
}

pub(super) fn run<'a>(
    rules: &RuleSet,
    tensors: Vec<OutTensor<'a>>,
    ctx: &Context<'_>,
) -> Result<(Vec<OutTensor<'a>>, Plan)> {
    run_resolving(rules, tensors, ctx, None)
}

/// [`run`], also collecting into `resolved` every rule that ran: the rule set's own rules and,
/// in place of each preset, the rules the preset generated at its turn.
pub(super) fn run_resolving<'a>(
    rules: &RuleSet,
    tensors: Vec<OutTensor<'a>>,
    ctx: &Context<'_>,
    mut resolved: Option<&mut Vec<Rule>>,
) -> Result<(Vec<OutTensor<'a>>, Plan)> {
    let sources: Vec<TensorMeta> = tensors.iter().map(TensorMeta::of).collect();
    let mut seen = HashMap::new();
    for s in &sources {
        if seen.insert(s.name.as_str(), ()).is_some() {
            return Err(Error::Rule {
                rule: "input".into(),
                what: format!("two input tensors are named `{}`", s.name),
            });
        }
    }
    let mut plan = Plan::new(sources);
    let mut live: Vec<Live<'a>> = tensors
        .into_iter()
        .enumerate()
        .map(|(i, t)| Live {
            t,
            sources: vec![i],
            steps: Vec::new(),
        })
        .collect();
    for stage in &rules.stages {
        match stage {
            Stage::Rule(rule) => {
                if let Some(r) = resolved.as_deref_mut() {
                    r.push(rule.clone());
                }
                let (next, matched) = apply_rule(rule, live, &mut plan)?;
                live = next;
                if matched == 0 {
                    plan.warnings.push(format!(
                        "{}: the pattern `{}` matched no tensor",
                        rule.label(),
                        rule.pattern()
                    ));
                }
            }
            Stage::Preset { preset, origin } => {
                let metas: Vec<TensorMeta> = live.iter().map(|l| TensorMeta::of(&l.t)).collect();
                let expansion = presets::expand(*preset, &metas, ctx)?;
                if expansion.rules.is_empty() {
                    plan.warnings.push(format!(
                        "{origin} (preset {}): found nothing to change",
                        preset.name()
                    ));
                }
                plan.undecided.extend(expansion.undecided);
                if let Some(r) = resolved.as_deref_mut() {
                    r.extend(expansion.rules.iter().cloned());
                }
                for rule in &expansion.rules {
                    live = apply_rule(rule, live, &mut plan)?.0;
                }
            }
        }
    }
    plan.targets = live
        .iter()
        .map(|l| PlanTarget {
            name: l.t.name.clone(),
            dtype: l.t.dtype,
            shape: l.t.shape.clone(),
            sources: l.sources.iter().map(|&i| plan.source_name(i)).collect(),
            steps: l.steps.clone(),
        })
        .collect();
    Ok((live.into_iter().map(|l| l.t).collect(), plan))
}

fn drop_live(plan: &mut Plan, l: Live<'_>, rule: &Rule) {
    plan.dropped.push(Dropped {
        name: l.t.name.clone(),
        sources: l.sources.iter().map(|&i| plan.source_name(i)).collect(),
        rule: rule.label(),
    });
}

/// Apply one rule; returns the new list and how many tensors the pattern matched.
fn apply_rule<'a>(
    rule: &Rule,
    live: Vec<Live<'a>>,
    plan: &mut Plan,
) -> Result<(Vec<Live<'a>>, usize)> {
    if let Op::Merge {
        inputs,
        to,
        dim,
        mode,
    } = rule.op()
    {
        return super::merge::merge(rule, live, inputs, to, *dim, *mode);
    }
    let mut matched = 0;
    let mut out = Vec::with_capacity(live.len());
    for mut l in live {
        if !rule.is_match(&l.t.name) {
            if let Op::Keep = rule.op() {
                drop_live(plan, l, rule);
            } else {
                out.push(l);
            }
            continue;
        }
        matched += 1;
        match rule.op() {
            Op::Keep => out.push(l),
            Op::Drop => drop_live(plan, l, rule),
            Op::Rename { to } => {
                let old = l.t.name.clone();
                rename(rule, &mut l, to)?;
                l.step(rule, format!("rename (was `{old}`)"));
                out.push(l);
            }
            Op::Split { dim, sizes, to } => out.extend(split(rule, l, *dim, sizes.as_deref(), to)?),
            Op::Transpose { dims, to } => {
                let rank = l.t.shape.len();
                let (a, b) = match dims {
                    None if rank >= 2 => (rank - 2, rank - 1),
                    None => {
                        return Err(rule.error(format!(
                            "`{}` has shape {:?}; transpose needs at least 2 dims",
                            l.t.name, l.t.shape
                        )))
                    }
                    Some([a, b]) => (dim(rule, &l, *a)?, dim(rule, &l, *b)?),
                };
                let mut perm: Vec<usize> = (0..rank).collect();
                perm.swap(a, b);
                out.push(permute(
                    rule,
                    l,
                    perm,
                    format!("transpose dims {a}, {b}"),
                    to,
                )?);
            }
            Op::Permute { dims, to } => {
                if dims.len() != l.t.shape.len() {
                    return Err(rule.error(format!(
                        "`dims` {dims:?} has {} entries but `{}` has {} dims (shape {:?})",
                        dims.len(),
                        l.t.name,
                        l.t.shape.len(),
                        l.t.shape
                    )));
                }
                let perm = dims
                    .iter()
                    .map(|&d| dim(rule, &l, d))
                    .collect::<Result<Vec<_>>>()?;
                let mut seen = vec![false; perm.len()];
                for &p in &perm {
                    if std::mem::replace(&mut seen[p], true) {
                        return Err(rule.error(format!(
                            "`dims` {dims:?} names dim {p} twice for `{}`",
                            l.t.name
                        )));
                    }
                }
                out.push(permute(rule, l, perm, format!("permute {dims:?}"), to)?);
            }
            Op::Reshape { shape, to } => out.push(reshape(rule, l, shape, to)?),
            Op::Cast { dtype, to } => out.push(cast_live(rule, l, *dtype, to)?),
            Op::Merge { .. } => out.push(l), // handled above
        }
    }
    check_unique(rule, &out)?;
    Ok((out, matched))
}

fn dim(rule: &Rule, l: &Live<'_>, d: i64) -> Result<usize> {
    resolve_dim(d, l.t.shape.len()).ok_or_else(|| {
        rule.error(format!(
            "dim {d} is out of range for `{}` of shape {:?} ({} dims)",
            l.t.name,
            l.t.shape,
            l.t.shape.len()
        ))
    })
}

fn rename(rule: &Rule, l: &mut Live<'_>, to: &str) -> Result<()> {
    let new = rule.expand(&l.t.name, to);
    if new.is_empty() {
        return Err(rule.error(format!("renames `{}` to an empty name", l.t.name)));
    }
    l.t.name = new;
    Ok(())
}

pub(super) fn check_unique(rule: &Rule, out: &[Live<'_>]) -> Result<()> {
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(out.len());
    for (i, l) in out.iter().enumerate() {
        if let Some(j) = seen.insert(l.t.name.as_str(), i) {
            return Err(rule.error(format!(
                "gives two tensors the name `{}` ({} and {} before this rule)",
                l.t.name,
                describe(&out[j]),
                describe(l)
            )));
        }
    }
    Ok(())
}

fn describe(l: &Live<'_>) -> String {
    format!("{} {:?}", l.t.dtype, l.t.shape)
}

fn split<'a>(
    rule: &Rule,
    l: Live<'a>,
    d: i64,
    sizes: Option<&[usize]>,
    to: &[String],
) -> Result<Vec<Live<'a>>> {
    let d = dim(rule, &l, d)?;
    let (name, shape, dtype) = (l.t.name.clone(), l.t.shape.clone(), l.t.dtype);
    let len = shape[d];
    let sizes: Vec<usize> = match sizes {
        Some(s) => {
            let sum = s.iter().try_fold(0usize, |a, &b| a.checked_add(b));
            if sum != Some(len) {
                return Err(rule.error(format!(
                    "`sizes` {s:?} add up to {}, but `{name}` (shape {shape:?}) has {len} along dim {d}",
                    sum.map_or("more than fits".to_string(), |s| s.to_string())
                )));
            }
            s.to_vec()
        }
        None => {
            let n = to.len();
            if len % n != 0 {
                return Err(rule.error(format!(
                    "`{name}` (shape {shape:?}) has {len} along dim {d}, which does not split into {n} equal pieces"
                )));
            }
            vec![len / n; n]
        }
    };
    let esize = dtype.size();
    let n = sizes.len();
    let Live { t, sources, steps } = l;
    let src = Rc::new(t);
    let mut start = 0;
    let mut out = Vec::with_capacity(n);
    for (k, (template, &size)) in to.iter().zip(&sizes).enumerate() {
        let mut piece_shape = shape.clone();
        piece_shape[d] = size;
        let (src, shape, s0) = (Rc::clone(&src), shape.clone(), start);
        let t = OutTensor::new(
            rule.expand(&name, template),
            dtype,
            piece_shape,
            move || Ok(ops::piece(src.data()?, &shape, esize, d, s0, size)),
        );
        let mut piece = Live {
            t,
            sources: sources.clone(),
            steps: steps.clone(),
        };
        piece.step(
            rule,
            format!(
                "split dim {d}: piece {} of {n} ({s0}..{})",
                k + 1,
                s0 + size
            ),
        );
        out.push(piece);
        start += size;
    }
    Ok(out)
}

fn permute<'a>(
    rule: &Rule,
    mut l: Live<'a>,
    perm: Vec<usize>,
    what: String,
    to: &Option<String>,
) -> Result<Live<'a>> {
    if let Some(to) = to {
        rename(rule, &mut l, to)?;
    }
    let Live {
        t,
        sources,
        mut steps,
    } = l;
    let shape = t.shape.clone();
    let new_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let moves_data = perm
        .iter()
        .enumerate()
        .filter(|&(i, &p)| i != p && shape[p] != 1)
        .count()
        > 1;
    let (name, dtype) = (t.name.clone(), t.dtype);
    let t = if moves_data {
        let esize = dtype.size();
        OutTensor::new(name, dtype, new_shape, move || {
            let d = t.data()?;
            Ok(Cow::Owned(ops::permute(&d, &shape, &perm, esize)))
        })
    } else {
        // Only dims of length 1 move: the row-major bytes are the same.
        let mut t = t;
        t.shape = new_shape;
        t
    };
    steps.push(Step {
        rule: rule.label(),
        op: what,
    });
    Ok(Live { t, sources, steps })
}

fn reshape<'a>(
    rule: &Rule,
    mut l: Live<'a>,
    shape: &[i64],
    to: &Option<String>,
) -> Result<Live<'a>> {
    let numel = l.t.shape.iter().try_fold(1usize, |a, &b| a.checked_mul(b));
    let known = shape
        .iter()
        .filter(|&&d| d != -1)
        .try_fold(1usize, |a, &b| a.checked_mul(usize::try_from(b).ok()?));
    let (Some(numel), Some(known)) = (numel, known) else {
        return Err(rule.error(format!("the shape {shape:?} is too large")));
    };
    let infer = if shape.contains(&-1) {
        if known == 0 || numel % known != 0 {
            return Err(rule.error(format!(
                "cannot reshape `{}` ({numel} elements, shape {:?}) to {shape:?}: the -1 cannot be inferred",
                l.t.name, l.t.shape
            )));
        }
        numel / known
    } else {
        if known != numel {
            return Err(rule.error(format!(
                "cannot reshape `{}` (shape {:?}, {numel} elements) to {shape:?} ({known} elements)",
                l.t.name, l.t.shape
            )));
        }
        0
    };
    let new_shape: Vec<usize> = shape
        .iter()
        .map(|&d| if d == -1 { infer } else { d as usize })
        .collect();
    if let Some(to) = to {
        rename(rule, &mut l, to)?;
    }
    let what = format!("reshape {:?} -> {new_shape:?}", l.t.shape);
    l.t.shape = new_shape;
    l.step(rule, what);
    Ok(l)
}

fn cast_live<'a>(
    rule: &Rule,
    mut l: Live<'a>,
    to_dtype: crate::DType,
    to: &Option<String>,
) -> Result<Live<'a>> {
    if let Some(to) = to {
        rename(rule, &mut l, to)?;
    }
    let from = l.t.dtype;
    if from == to_dtype {
        return Ok(l);
    }
    if let Err(e) = cast::to_f64(from, &[]) {
        return Err(rule.error(format!("cannot cast `{}`: {e}", l.t.name)));
    }
    if let Err(e) = cast::from_f64(&[0.0], to_dtype) {
        return Err(rule.error(format!("cannot cast `{}`: {e}", l.t.name)));
    }
    let Live {
        t,
        sources,
        mut steps,
    } = l;
    let (name, shape, label) = (t.name.clone(), t.shape.clone(), rule.label());
    let t = OutTensor::new(name.clone(), to_dtype, shape, move || {
        let d = t.data()?;
        cast::cast(&d, from, to_dtype)
            .map(Cow::Owned)
            .map_err(|e| Error::Rule {
                rule: label.clone(),
                what: format!("cannot cast `{name}` from {from} to {to_dtype}: {e}"),
            })
    });
    steps.push(Step {
        rule: rule.label(),
        op: format!("cast {from} -> {to_dtype}"),
    });
    Ok(Live { t, sources, steps })
}
