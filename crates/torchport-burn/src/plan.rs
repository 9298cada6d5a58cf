//! Matching a checkpoint against a module before anything is read. The user's rules
//! (torchport's remap language: renames, splits, presets…) run first, over the checkpoint's
//! names and shapes; then the target-aware adapters pick each parameter's source among the
//! results, and shapes and kinds are checked. The outcome is the full [`LoadReport`] and the
//! list of tensors to load — whose block splits and transposes are then done by remap rules
//! ([`adapter_rules`]), so every layout change goes through the same kernels.

use std::collections::{HashMap, HashSet};

use torchport::remap::{self, edit_distance, Op, Rule, RuleSet, TargetTensor, TensorMeta};
use torchport::{Checkpoint, DType, TensorData};

use crate::adapt::{self, Recipe};
use crate::error::{Error, Result};
use crate::report::{Applied, LoadReport, Mismatched, Missing, Unused};
use crate::target::Target;

/// One parameter to fill, and how.
#[derive(Clone, Debug)]
pub(crate) struct Planned {
    /// The Burn parameter.
    pub target: Target,
    /// How to build it (its `source` names a tensor after the user's rules).
    pub recipe: Recipe,
    /// The dtype of that tensor.
    pub dtype: DType,
}

impl Planned {
    /// Whether the transpose is done while copying into Burn's buffer (float32: one pass
    /// from the memory map) rather than by a remap rule.
    pub(crate) fn fused_transpose(&self) -> bool {
        self.recipe.transpose && self.dtype == DType::F32
    }
}

/// The outcome of matching, before any data is read.
#[derive(Clone, Debug)]
pub struct Plan {
    pub(crate) planned: Vec<Planned>,
    /// What loading would do.
    pub report: LoadReport,
}

/// Why a tensor of `dtype` and `shape` cannot fill `t` through `r`, if it cannot.
fn misfit(t: &Target, r: &Recipe, dtype: DType, shape: &[usize]) -> Option<String> {
    if !t.kind.accepts(dtype) {
        return Some(format!(
            "is {dtype}, which cannot fill a {} parameter",
            t.kind.name()
        ));
    }
    let mut s = shape.to_vec();
    if let Some(p) = r.part {
        match s.first_mut() {
            Some(rows) if *rows % p.count == 0 => *rows /= p.count,
            _ => {
                return Some(format!(
                    "does not split into {} equal blocks along its first dimension",
                    p.count
                ))
            }
        }
    }
    if r.transpose {
        if s.len() != 2 {
            return Some("is not 2-D, so it cannot be transposed".into());
        }
        s.swap(0, 1);
    }
    if s == t.shape {
        return None;
    }
    let mut need = t.shape.clone();
    if r.transpose && need.len() == 2 {
        need.swap(0, 1);
    }
    if let (Some(p), Some(rows)) = (r.part, need.first_mut()) {
        *rows = rows.saturating_mul(p.count);
    }
    let parts: Vec<String> = need.iter().map(|d| d.to_string()).collect();
    Some(format!(
        "has the wrong shape: expected [{}]",
        parts.join(", ")
    ))
}

/// Names that Burn has no place for by design.
fn ignorable(name: &str) -> bool {
    name.ends_with("num_batches_tracked")
}

/// Escape regex metacharacters.
pub(crate) fn escape(s: &str) -> String {
    regex::escape(s)
}

/// A literal rule template (no group references).
fn lit(name: &str) -> String {
    name.replace('$', "$$")
}

fn parent(name: &str) -> (&str, &str) {
    name.rsplit_once('.').unwrap_or(("", name))
}

/// The tensors the target expects, as remap's presets take them for evidence.
pub(crate) fn target_tensors(targets: &[Target]) -> Vec<TargetTensor> {
    targets
        .iter()
        .map(|t| TargetTensor::new(t.path(), &t.shape))
        .collect()
}

/// Match `targets` against the checkpoint after `rules`.
pub(crate) fn plan(
    ckpt: &Checkpoint,
    rules: &RuleSet,
    targets: Vec<Target>,
    target_aware: bool,
) -> Result<Plan> {
    let metas: Vec<TensorMeta> = ckpt.out_tensors().iter().map(TensorMeta::of).collect();
    let wanted = target_tensors(&targets);
    let ctx = remap::Context {
        modules: ckpt.modules(),
        target: Some(&wanted),
    };
    let (outs, rplan) = remap::plan(rules, &metas, &ctx).map_err(Error::rules)?;
    // Where each tensor after the rules came from, as the file names it.
    let origin: HashMap<&str, String> = rplan
        .targets
        .iter()
        .map(|t| (t.name.as_str(), t.sources.join(" + ")))
        .collect();
    let from = |name: &str| {
        origin
            .get(name)
            .cloned()
            .unwrap_or_else(|| name.to_string())
    };
    let mut by_name: HashMap<&str, usize> = HashMap::with_capacity(outs.len());
    for (i, m) in outs.iter().enumerate() {
        by_name.entry(m.name.as_str()).or_insert(i);
    }
    // Tensors the file holds without data (meta, sparse…): found, but unreadable.
    let dataless: HashMap<&str, String> = ckpt
        .tensors()
        .iter()
        .filter_map(|t| match &t.data {
            TensorData::Strided { .. } => None,
            TensorData::Meta => Some((t.name.as_str(), "has no data (a meta tensor)".into())),
            TensorData::Unsupported { what } => Some((
                t.name.as_str(),
                format!("is {what}, which torchport does not read"),
            )),
        })
        .collect();

    let mut used = vec![false; outs.len()];
    let mut taken: HashMap<(String, Option<usize>), String> = HashMap::new();
    let mut report = LoadReport::default();
    let mut planned = Vec::new();
    for t in targets {
        let mut cands = if target_aware {
            adapt::candidates(&t)
        } else {
            Vec::new()
        };
        // Last resort: a tensor already named and laid out for Burn (by the user's rules, or
        // a file written from Burn).
        let path = t.path();
        if !cands.iter().any(|r| r.source == path) {
            let mut exact = Recipe::plain(path.clone());
            if target_aware {
                exact.note = "already in Burn's name and layout".into();
            }
            cands.push(exact);
        }
        // Without the adapters (the `burn` preset), enum variants still have no PyTorch level.
        let plain = t.path_without_variants();
        if !cands.iter().any(|r| r.source == plain) {
            let mut r = Recipe::plain(plain);
            r.note = "enum variant left out of the name".into();
            cands.push(r);
        }
        let found = cands
            .iter()
            .find_map(|r| by_name.get(r.source.as_str()).map(|&i| (r, i)));
        let Some((recipe, i)) = found else {
            let tried: Vec<String> = cands.into_iter().map(|r| r.source).collect();
            if let Some((name, why)) = tried
                .iter()
                .find_map(|n| dataless.get_key_value(n.as_str()))
            {
                let info = ckpt.tensor(name);
                report.mismatched.push(Mismatched {
                    target: path,
                    source: name.to_string(),
                    expected: t.shape.clone(),
                    found: info.map(|i| i.shape.clone()).unwrap_or_default(),
                    dtype: info.map(|i| i.dtype).unwrap_or(DType::F32),
                    reason: why.clone(),
                });
                continue;
            }
            report.missing.push(Missing {
                target: path,
                shape: t.shape.clone(),
                tried,
                suggestions: Vec::new(),
            });
            continue;
        };
        used[i] = true;
        let meta = &outs[i];
        let key = (meta.name.clone(), recipe.part.map(|p| p.index));
        let reason = match taken.get(&key) {
            Some(other) => Some(format!("is already loaded into {other}")),
            None => misfit(&t, recipe, meta.dtype, &meta.shape),
        };
        if let Some(reason) = reason {
            report.mismatched.push(Mismatched {
                target: path,
                source: from(&meta.name),
                expected: t.shape.clone(),
                found: meta.shape.clone(),
                dtype: meta.dtype,
                reason,
            });
            continue;
        }
        taken.insert(key, path.clone());
        let mut note = recipe.note.clone();
        let source = from(&meta.name);
        if source != meta.name {
            note = [format!("your rules: {source} -> {}", meta.name), note]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join("; ");
        }
        report.applied.push(Applied {
            target: path,
            source,
            note,
        });
        planned.push(Planned {
            target: t,
            recipe: recipe.clone(),
            dtype: meta.dtype,
        });
    }
    let mut unused = Vec::new();
    for (i, m) in outs.iter().enumerate() {
        if used[i] {
            continue;
        }
        if ignorable(&m.name) {
            report.ignored.push(m.name.clone());
            continue;
        }
        unused.push((m.name.clone(), m.shape.iter().product::<usize>()));
        let source = from(&m.name);
        report.unused.push(Unused {
            renamed: (source != m.name).then(|| m.name.clone()),
            source,
            shape: m.shape.clone(),
            dtype: m.dtype,
            suggestion: None,
        });
    }
    report.dropped = rplan
        .dropped
        .iter()
        .map(|d| format!("{} ({})", d.name, d.rule))
        .collect();
    report.warnings = rplan
        .undecided
        .iter()
        .map(|u| format!("{}: {} left it as it is: {}", u.name, u.preset, u.why))
        .chain(rplan.warnings.iter().cloned())
        .collect();
    suggest(&mut report, &unused);
    Ok(Plan { planned, report })
}

/// Fill in suggestions: for each missing parameter the closest unused names, for each unused
/// tensor the closest missing parameter, and prefix renames that would pair them.
/// `unused` holds each unused tensor's name (after rules) and element count.
fn suggest(report: &mut LoadReport, unused: &[(String, usize)]) {
    let close = |a: &str, b: &str| {
        let d = edit_distance(a, b);
        (d <= a.len().max(b.len()) / 2).then_some(d)
    };
    for m in &mut report.missing {
        let want = m.tried.first().cloned().unwrap_or_default();
        let numel: usize = m.shape.iter().product();
        let (_, leaf) = parent(&want);
        let mut scored: Vec<(bool, usize, &String)> = unused
            .iter()
            .filter_map(|(n, e)| {
                let same_leaf = parent(n).1 == leaf;
                let d = close(&want, n).or(same_leaf.then(|| edit_distance(&want, n)))?;
                // Same element count (or a whole multiple, for packed tensors) first.
                let fits = *e == numel || (numel > 0 && *e % numel == 0);
                Some((!(fits && same_leaf), d, n))
            })
            .collect();
        scored.sort();
        m.suggestions = scored
            .iter()
            .take(3)
            .map(|(_, _, n)| (*n).clone())
            .collect();
        if let Some((false, _, best)) = scored.first() {
            let (from, _) = parent(best);
            let (to, _) = parent(&want);
            if !from.is_empty() && !to.is_empty() && from != to {
                let hint = (format!("^{}\\.", escape(from)), format!("{to}."));
                if !report.rename_hints.contains(&hint) {
                    report.rename_hints.push(hint);
                }
            }
        }
    }
    for u in &mut report.unused {
        let name = u.renamed.as_deref().unwrap_or(&u.source);
        u.suggestion = report
            .missing
            .iter()
            .filter_map(|m| {
                let want = m.tried.first()?;
                Some((close(name, want)?, want))
            })
            .min()
            .map(|(_, n)| n.clone());
    }
}

/// The remap rules that carry out the adapters' block splits (and the transposes of
/// non-float32 tensors; float32 ones are transposed while being copied into Burn's buffer, see
/// [`Planned::fused_transpose`]), and for each planned parameter the name its tensor has after
/// them.
pub(crate) fn adapter_rules(planned: &[Planned]) -> Result<(RuleSet, Vec<String>)> {
    let mut rules = RuleSet::new();
    let mut produced = Vec::with_capacity(planned.len());
    // Split sources: one split rule each, naming every block (blocks nothing takes get a
    // placeholder name and are simply never read).
    let mut splits: Vec<(&str, Vec<String>)> = Vec::new();
    for p in planned {
        let Some(part) = p.recipe.part else {
            produced.push(p.recipe.source.clone());
            continue;
        };
        let src = p.recipe.source.as_str();
        let at = match splits.iter().position(|(s, _)| *s == src) {
            Some(at) => at,
            None => {
                let names = (0..part.count).map(|k| format!("{src}#block{k}")).collect();
                splits.push((src, names));
                splits.len() - 1
            }
        };
        let name = p.target.path();
        if let Some(slot) = splits[at].1.get_mut(part.index) {
            *slot = name.clone();
        }
        produced.push(name);
    }
    let rule = |pattern: String, op: Op| Rule::new(&pattern, op).map_err(Error::rules);
    for (src, names) in &splits {
        rules.push(rule(
            format!("^{}$", escape(src)),
            Op::Split {
                dim: 0,
                sizes: None,
                to: names.iter().map(|n| lit(n)).collect(),
            },
        )?);
    }
    let flips: HashSet<&str> = planned
        .iter()
        .zip(&produced)
        .filter(|(p, _)| p.recipe.transpose && !p.fused_transpose())
        .map(|(_, n)| n.as_str())
        .collect();
    if !flips.is_empty() {
        let mut names: Vec<&str> = flips.into_iter().collect();
        names.sort_unstable();
        let alt: Vec<String> = names.iter().map(|n| escape(n)).collect();
        rules.push(rule(
            format!("^(?:{})$", alt.join("|")),
            Op::Transpose {
                dims: None,
                to: None,
            },
        )?);
    }
    Ok((rules, produced))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_regex() {
        assert_eq!(escape("features.0"), "features\\.0");
        let re = regex::Regex::new(&format!("^{}$", escape("a.b[0]$x"))).unwrap();
        assert!(re.is_match("a.b[0]$x") && !re.is_match("aXb[0]$x"));
    }
}
