//! Matching a checkpoint against a module before anything is read: user renames first, then
//! the target-aware adapters pick each parameter's source, then shapes and kinds are checked.
//! The result is the list of tensors to load and the full [`LoadReport`].

use std::collections::HashMap;

use torchport::{Checkpoint, TensorData, TensorInfo};

use crate::adapt::{self, Recipe};
use crate::report::{distance, Applied, LoadReport, Mismatched, Missing, Unused};
use crate::target::Target;

/// One parameter to fill, and how.
#[derive(Clone, Debug)]
pub(crate) struct Planned {
    /// The Burn parameter.
    pub target: Target,
    /// How to build it.
    pub recipe: Recipe,
    /// Index into the checkpoint's tensors.
    pub tensor: usize,
}

/// The outcome of matching, before any data is read.
#[derive(Clone, Debug)]
pub struct Plan {
    pub(crate) planned: Vec<Planned>,
    /// What loading would do.
    pub report: LoadReport,
}

/// Apply burn-store-style renames (every pattern in turn, `replace_all`) to a name.
pub(crate) fn rename(remapper: &burn_store::KeyRemapper, name: &str) -> String {
    let mut out = name.to_string();
    for (re, to) in &remapper.patterns {
        if re.is_match(&out) {
            out = re.replace_all(&out, to.as_str()).into_owned();
        }
    }
    out
}

/// Why `info` cannot fill `t` through `r`, if it cannot.
fn misfit(t: &Target, r: &Recipe, info: &TensorInfo) -> Option<String> {
    match &info.data {
        TensorData::Strided { .. } => {}
        TensorData::Meta => return Some("has no data (it is a meta tensor)".into()),
        TensorData::Unsupported { what } => {
            return Some(format!("is {what}, which torchport does not read"))
        }
    }
    if info.quant.is_some() {
        return Some(format!(
            "is quantized ({}); dequantize it before loading",
            info.dtype
        ));
    }
    if !t.kind.accepts(info.dtype) {
        return Some(format!(
            "is {}, which cannot fill a {} parameter",
            info.dtype,
            t.kind.name()
        ));
    }
    let mut s = info.shape.clone();
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
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn parent(name: &str) -> (&str, &str) {
    name.rsplit_once('.').unwrap_or(("", name))
}

/// Match `targets` against the checkpoint.
pub(crate) fn plan(
    ckpt: &Checkpoint,
    remapper: &burn_store::KeyRemapper,
    targets: Vec<Target>,
) -> Plan {
    let tensors = ckpt.tensors();
    let names: Vec<String> = tensors.iter().map(|t| rename(remapper, &t.name)).collect();
    let mut by_name: HashMap<&str, usize> = HashMap::with_capacity(names.len());
    for (i, n) in names.iter().enumerate() {
        by_name.entry(n.as_str()).or_insert(i);
    }
    let mut used = vec![false; tensors.len()];
    let mut report = LoadReport::default();
    let mut planned = Vec::new();
    for t in targets {
        let cands = adapt::candidates(&t);
        let found = cands
            .iter()
            .find_map(|r| by_name.get(r.source.as_str()).map(|&i| (r, i)));
        let Some((recipe, i)) = found else {
            let mut tried: Vec<String> = cands.into_iter().map(|r| r.source).collect();
            if tried.is_empty() {
                tried.push(t.path());
            }
            report.missing.push(Missing {
                target: t.path(),
                shape: t.shape.clone(),
                tried,
                suggestions: Vec::new(),
            });
            continue;
        };
        used[i] = true;
        let info = &tensors[i];
        if let Some(reason) = misfit(&t, recipe, info) {
            report.mismatched.push(Mismatched {
                target: t.path(),
                source: info.name.clone(),
                expected: t.shape.clone(),
                found: info.shape.clone(),
                dtype: info.dtype,
                reason,
            });
            continue;
        }
        report.applied.push(Applied {
            target: t.path(),
            source: info.name.clone(),
            note: recipe.note.clone(),
        });
        planned.push(Planned {
            target: t,
            recipe: recipe.clone(),
            tensor: i,
        });
    }
    let mut unused = Vec::new();
    for (i, info) in tensors.iter().enumerate() {
        if used[i] {
            continue;
        }
        if ignorable(&info.name) {
            report.ignored.push(info.name.clone());
            continue;
        }
        unused.push((names[i].clone(), info.numel()));
        report.unused.push(Unused {
            source: info.name.clone(),
            renamed: (names[i] != info.name).then(|| names[i].clone()),
            shape: info.shape.clone(),
            dtype: info.dtype,
            suggestion: None,
        });
    }
    suggest(&mut report, &unused);
    Plan { planned, report }
}

/// Fill in suggestions: for each missing parameter the closest unused names, for each unused
/// tensor the closest missing parameter, and prefix renames that would pair them.
/// `unused` holds each unused tensor's (renamed) name and element count.
fn suggest(report: &mut LoadReport, unused: &[(String, usize)]) {
    let close = |a: &str, b: &str| {
        let d = distance(a, b);
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
                let d = close(&want, n).or(same_leaf.then(|| distance(&want, n)))?;
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
                let d = close(name, m.tried.first()?)?;
                Some((d, &m.target))
            })
            .min()
            .map(|(_, t)| t.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_regex() {
        assert_eq!(escape("features.0"), "features\\.0");
    }

    #[test]
    fn renames_like_key_remapper() {
        let r = burn_store::KeyRemapper::new()
            .add_pattern(r"^features\.(\d+)\.", "layers.$1.")
            .and_then(|r| r.add_pattern(r"^layers\.0\.", "conv."))
            .unwrap_or_default();
        assert_eq!(rename(&r, "features.0.weight"), "conv.weight");
        assert_eq!(rename(&r, "features.3.bias"), "layers.3.bias");
    }
}
