//! Suggested rules for a [`MatchReport`], only where the evidence is clear:
//!
//! - a name on both sides whose 2-D shape is reversed → `transpose`;
//! - equal shapes, other dtype → `cast`;
//! - unused and missing names that differ only by a constant leading part (with compatible
//!   shapes) → `rename`;
//! - an unused tensor whose dim 0 is 3× or 4× that of missing tensors beside it named like
//!   q/k/v or LSTM/GRU gates → `split` (in PyTorch's order: q,k,v; i,f,g,o; r,z,n), plus a
//!   `transpose` when the pieces are wanted transposed;
//! - a preset that would make more names match ([`suggest_presets`]).

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use super::report::{match_tensors, MatchReport, TargetTensor, Unmatched};
use super::{plan, Context, RuleSet, TensorMeta};

/// A rule (or preset) that would fix part of a mismatch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Suggestion {
    /// The evidence, in one sentence.
    pub why: String,
    /// The rule(s) as rule-file TOML.
    pub toml: String,
}

/// A TOML string: literal (`'…'`) when possible, so regexes need no doubled backslashes.
pub(crate) fn toml_str(s: &str) -> String {
    if !s.contains('\'') && !s.contains('\n') {
        return format!("'{s}'");
    }
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `^(?:a|b|c)$` over escaped names.
fn names_pattern(names: &[&str]) -> String {
    let alts: Vec<String> = names.iter().map(|n| regex::escape(n)).collect();
    if alts.len() == 1 {
        format!("^{}$", alts[0])
    } else {
        format!("^(?:{})$", alts.join("|"))
    }
}

fn examples(names: &[&str]) -> String {
    let shown: Vec<String> = names.iter().take(3).map(|n| format!("`{n}`")).collect();
    if names.len() > 3 {
        format!("{}, …", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

pub(crate) fn suggest_rules(r: &MatchReport) -> Vec<Suggestion> {
    let mut out = Vec::new();
    // Transposed.
    let transposed: Vec<&str> = r
        .shape_mismatches
        .iter()
        .filter(|m| {
            m.have_shape.len() == 2
                && m.have_shape[0] == m.want_shape[1]
                && m.have_shape[1] == m.want_shape[0]
        })
        .map(|m| m.name.as_str())
        .collect();
    if !transposed.is_empty() {
        out.push(Suggestion {
            why: format!(
                "{} tensor(s) are stored transposed ({})",
                transposed.len(),
                examples(&transposed)
            ),
            toml: format!(
                "[[rule]]\nop = \"transpose\"\nmatch = {}\n",
                toml_str(&names_pattern(&transposed))
            ),
        });
    }
    // Dtype.
    let mut by_dtype: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for m in &r.dtype_mismatches {
        if let Some(d) = m.want_dtype {
            by_dtype.entry(d.name()).or_default().push(m.name.as_str());
        }
    }
    for (dtype, names) in by_dtype {
        out.push(Suggestion {
            why: format!(
                "{} tensor(s) are wanted as {dtype} ({})",
                names.len(),
                examples(&names)
            ),
            toml: format!(
                "[[rule]]\nop = \"cast\"\nmatch = {}\ndtype = \"{dtype}\"\n",
                toml_str(&names_pattern(&names))
            ),
        });
    }
    let mut used_u = HashSet::new();
    let mut used_m = HashSet::new();
    out.extend(splits(&r.unused, &r.missing, &mut used_u, &mut used_m));
    out.extend(prefixes(&r.unused, &r.missing, &used_u, &used_m));
    out
}

fn compatible(a: &[usize], b: &[usize]) -> bool {
    a == b || (a.len() == 2 && b.len() == 2 && a[0] == b[1] && a[1] == b[0])
}

/// (prefix in the checkpoint, prefix in the target).
type Prefixes = (String, String);
/// (unused index, missing index) pairs.
type Pairs = Vec<(usize, usize)>;

/// Suggest `rename` rules for constant prefix differences.
fn prefixes(
    unused: &[Unmatched],
    missing: &[Unmatched],
    used_u: &HashSet<usize>,
    used_m: &HashSet<usize>,
) -> Vec<Suggestion> {
    // Every dotted suffix of every missing name (the whole name included).
    let mut by_suffix: HashMap<&str, Vec<usize>> = HashMap::new();
    for (mi, m) in missing
        .iter()
        .enumerate()
        .filter(|(i, _)| !used_m.contains(i))
    {
        for pos in suffix_starts(&m.name) {
            by_suffix.entry(&m.name[pos..]).or_default().push(mi);
        }
    }
    // For each unused name, the missing names sharing the longest dotted suffix with it
    // (and a compatible shape): the parts before that suffix are the two prefixes.
    let mut groups: BTreeMap<Prefixes, Pairs> = BTreeMap::new();
    for (ui, u) in unused
        .iter()
        .enumerate()
        .filter(|(i, _)| !used_u.contains(i))
    {
        for pos in suffix_starts(&u.name) {
            let suffix = &u.name[pos..];
            let found: Vec<usize> = by_suffix
                .get(suffix)
                .into_iter()
                .flatten()
                .copied()
                .filter(|&mi| compatible(&u.shape, &missing[mi].shape))
                .collect();
            if found.is_empty() {
                continue;
            }
            for mi in found {
                let m = &missing[mi].name;
                let key = (
                    u.name[..pos].to_string(),
                    m[..m.len() - suffix.len()].to_string(),
                );
                groups.entry(key).or_default().push((ui, mi));
            }
            break;
        }
    }
    let mut ranked: Vec<(Prefixes, Pairs)> = groups.into_iter().collect();
    ranked.sort_by(|x, y| y.1.len().cmp(&x.1.len()).then_with(|| x.0.cmp(&y.0)));
    let (mut taken_u, mut taken_m) = (HashSet::new(), HashSet::new());
    let mut out = Vec::new();
    for ((a, b), pairs) in ranked {
        let fresh: Vec<(usize, usize)> = pairs
            .into_iter()
            .filter(|(u, m)| !taken_u.contains(u) && !taken_m.contains(m))
            .collect();
        if fresh.is_empty() {
            continue;
        }
        for &(u, m) in &fresh {
            taken_u.insert(u);
            taken_m.insert(m);
        }
        let (u0, m0) = fresh[0];
        out.push(Suggestion {
            why: format!(
                "{} name(s) differ only by a leading `{a}` where the target has `{b}` (`{}` -> `{}`)",
                fresh.len(),
                unused[u0].name,
                missing[m0].name
            ),
            toml: format!(
                "[[rule]]\nop = \"rename\"\nmatch = {}\nto = {}\n",
                toml_str(&format!("^{}", regex::escape(&a))),
                toml_str(&super::presets::lit(&b))
            ),
        });
        if out.len() == 5 {
            break;
        }
    }
    out
}

/// Where the dotted suffixes of `name` start, longest first: 0 and after every `.`.
fn suffix_starts(name: &str) -> impl Iterator<Item = usize> + '_ {
    std::iter::once(0).chain(name.match_indices('.').map(|(i, _)| i + 1))
}

/// Role words of the packed layouts, in PyTorch's order.
const SCHEMES: &[(&str, &[&[&str]])] = &[
    (
        "q, k, v",
        &[&["q", "query"], &["k", "key"], &["v", "value"]],
    ),
    (
        "LSTM gates i, f, g, o",
        &[
            &["i", "input"],
            &["f", "forget"],
            &["g", "cell"],
            &["o", "output"],
        ],
    ),
    (
        "GRU gates r, z, n",
        &[&["r", "reset"], &["z", "update"], &["n", "new"]],
    ),
];

fn tokens(s: &str) -> Vec<&str> {
    s.split(['.', '_']).filter(|t| !t.is_empty()).collect()
}

/// Suggest `split` rules for packed tensors.
fn splits(
    unused: &[Unmatched],
    missing: &[Unmatched],
    used_u: &mut HashSet<usize>,
    used_m: &mut HashSet<usize>,
) -> Vec<Suggestion> {
    let mut out = Vec::new();
    let mut by_shape: HashMap<&[usize], Vec<usize>> = HashMap::new();
    for (mi, m) in missing.iter().enumerate() {
        by_shape.entry(&m.shape).or_default().push(mi);
    }
    for (ui, u) in unused.iter().enumerate() {
        let Some(&rows) = u.shape.first() else {
            continue;
        };
        let (parent, leaf) = u.name.rsplit_once('.').unwrap_or(("", u.name.as_str()));
        let leaf_tokens = tokens(leaf);
        let kind = ["weight", "bias"]
            .into_iter()
            .find(|k| leaf_tokens.contains(k));
        let side = if leaf_tokens.contains(&"ih") {
            Some("input")
        } else if leaf_tokens.contains(&"hh") {
            Some("hidden")
        } else {
            None
        };
        for (scheme, roles) in SCHEMES {
            let n = roles.len();
            if rows == 0 || rows % n != 0 {
                continue;
            }
            let mut piece = u.shape.clone();
            piece[0] = rows / n;
            let mut per_role: Vec<Vec<(usize, bool)>> = vec![Vec::new(); n];
            let flipped_piece: Vec<usize> = piece.iter().rev().copied().collect();
            let mut candidates: Vec<usize> =
                by_shape.get(piece.as_slice()).cloned().unwrap_or_default();
            if piece.len() == 2 && piece[0] != piece[1] {
                candidates.extend(by_shape.get(flipped_piece.as_slice()).into_iter().flatten());
            }
            for mi in candidates {
                let m = &missing[mi];
                if used_m.contains(&mi) {
                    continue;
                }
                let rest = if parent.is_empty() {
                    Some(m.name.as_str())
                } else {
                    m.name
                        .strip_prefix(parent)
                        .and_then(|r| r.strip_prefix('.'))
                };
                let Some(rest) = rest else { continue };
                let same = m.shape == piece;
                let transposed = !same && compatible(&m.shape, &piece);
                if !same && !transposed {
                    continue;
                }
                let toks = tokens(rest);
                let last = rest.rsplit('.').next().unwrap_or(rest);
                if let Some(k) = kind {
                    if (last == "weight" || last == "bias") && last != k {
                        continue;
                    }
                }
                let Some((pos, role)) = toks
                    .iter()
                    .enumerate()
                    .find_map(|(p, t)| roles.iter().position(|r| r.contains(t)).map(|r| (p, r)))
                else {
                    continue;
                };
                // With a side hint (weight_ih / weight_hh), skip names naming the other side.
                if let Some(side) = side {
                    let other = if side == "input" { "hidden" } else { "input" };
                    if toks[pos + 1..].contains(&other) {
                        continue;
                    }
                }
                per_role[role].push((mi, transposed));
            }
            if per_role.iter().any(|c| c.len() != 1) {
                continue;
            }
            let chosen: Vec<(usize, bool)> = per_role.iter().map(|c| c[0]).collect();
            let names: Vec<&str> = chosen
                .iter()
                .map(|&(mi, _)| missing[mi].name.as_str())
                .collect();
            let to: Vec<String> = names
                .iter()
                .map(|n| toml_str(&super::presets::lit(n)))
                .collect();
            let mut toml = format!(
                "[[rule]]\nop = \"split\"\nmatch = {}\ndim = 0\nto = [{}]\n",
                toml_str(&names_pattern(&[u.name.as_str()])),
                to.join(", ")
            );
            let flipped: Vec<&str> = chosen
                .iter()
                .filter(|c| c.1)
                .map(|&(mi, _)| missing[mi].name.as_str())
                .collect();
            if !flipped.is_empty() {
                toml.push_str(&format!(
                    "\n[[rule]]\nop = \"transpose\"\nmatch = {}\n",
                    toml_str(&names_pattern(&flipped))
                ));
            }
            out.push(Suggestion {
                why: format!(
                    "`{}` {:?} packs {n} pieces of {:?} ({scheme}) that the target wants as {}",
                    u.name,
                    u.shape,
                    piece,
                    examples(&names)
                ),
                toml,
            });
            used_u.insert(ui);
            used_m.extend(chosen.iter().map(|c| c.0));
            break;
        }
    }
    out
}

/// Try the presets (and `strip-prefix` before each) on `have`; suggest the one that makes
/// the most target tensors match, if it beats `matched_now`.
pub fn suggest_presets(
    have: &[TensorMeta],
    want: &[TargetTensor],
    ctx: &Context<'_>,
    matched_now: usize,
) -> Vec<Suggestion> {
    best_preset(have, want, ctx, matched_now)
        .map(|(_, s)| s)
        .into_iter()
        .collect()
}

/// The best preset combination and how many target tensors it matches.
pub(crate) fn best_preset(
    have: &[TensorMeta],
    want: &[TargetTensor],
    ctx: &Context<'_>,
    matched_now: usize,
) -> Option<(usize, Suggestion)> {
    let candidates: &[&[&str]] = &[
        &["strip-prefix"],
        &["burn"],
        &["strip-prefix", "burn"],
        &["lstm-gates"],
        &["gru-gates"],
        &["attention-qkv"],
        &["strip-prefix", "lstm-gates"],
        &["strip-prefix", "gru-gates"],
        &["strip-prefix", "attention-qkv"],
    ];
    let mut best: Option<(usize, &[&str])> = None;
    for &presets in candidates {
        let mut rules = RuleSet::new();
        for p in presets {
            // The names are the shipped presets' own.
            let _ = rules.preset(p);
        }
        let Ok((out, plan)) = plan(&rules, have, ctx) else {
            continue;
        };
        if plan.is_identity() {
            continue;
        }
        let n = match_tensors(&out, want).matched.len();
        if n > matched_now && best.map_or(true, |(b, _)| n > b) {
            best = Some((n, presets));
        }
    }
    let (n, presets) = best?;
    let flags: Vec<String> = presets.iter().map(|p| format!("--preset {p}")).collect();
    let toml: String = presets
        .iter()
        .map(|p| format!("[[rule]]\npreset = \"{p}\"\n"))
        .collect::<Vec<_>>()
        .join("\n");
    let why = format!(
        "{} would match {n} of {} target tensors ({matched_now} now)",
        flags.join(" "),
        want.len()
    );
    Some((n, Suggestion { why, toml }))
}
