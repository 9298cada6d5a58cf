//! Presets: rules generated from what the tensors look like when the preset's turn comes
//! (names, shapes, module classes, the target), so a preset only touches what it recognizes
//! and lists what it cannot decide. `strip-prefix`, `lstm-gates`, `gru-gates`,
//! `attention-qkv` and `weight-norm` live here; `burn` in burn.rs. docs/RULES.md lists every
//! name mapping.

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

use regex::Regex;

use super::burn;
use super::plan::Undecided;
use super::rules::{Op, Origin, Rule};
use super::{Context, TensorMeta};
use crate::error::Result;

/// A preset shipped with torchport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Preset {
    /// Remove leading `module.` (DataParallel) and `_orig_mod.` (torch.compile) prefixes.
    StripPrefix,
    /// Split each LSTM weight/bias into its i, f, g, o gates: `X` -> `X.i`, `X.f`, `X.g`, `X.o`.
    LstmGates,
    /// Split each GRU weight/bias into its r, z, n gates: `X` -> `X.r`, `X.z`, `X.n`.
    GruGates,
    /// Split `P.in_proj_weight` / `P.in_proj_bias` into `P.q_proj.weight` … `P.v_proj.bias`.
    AttentionQkv,
    /// Names and layouts of Burn 0.22's `nn` modules.
    Burn,
    /// Fold weight normalization into the weight: `P.weight_g` + `P.weight_v`
    /// (`torch.nn.utils.weight_norm`) and `P.parametrizations.weight.original0` +
    /// `original1` (`torch.nn.utils.parametrizations.weight_norm`) become `P.weight`, as torch
    /// computes it (any `dim`, inferred from `g`'s shape; `dim=None` included).
    WeightNorm,
}

impl Preset {
    /// Every preset.
    pub const ALL: &'static [Preset] = &[
        Preset::StripPrefix,
        Preset::LstmGates,
        Preset::GruGates,
        Preset::AttentionQkv,
        Preset::Burn,
        Preset::WeightNorm,
    ];

    /// The preset's name (`strip-prefix`, `lstm-gates`, `gru-gates`, `attention-qkv`, `burn`,
    /// `weight-norm`).
    pub fn name(self) -> &'static str {
        match self {
            Preset::StripPrefix => "strip-prefix",
            Preset::LstmGates => "lstm-gates",
            Preset::GruGates => "gru-gates",
            Preset::AttentionQkv => "attention-qkv",
            Preset::Burn => "burn",
            Preset::WeightNorm => "weight-norm",
        }
    }

    /// The preset of this name; the error lists the known names.
    pub fn from_name(name: &str) -> std::result::Result<Preset, String> {
        Preset::ALL
            .iter()
            .copied()
            .find(|p| p.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = Preset::ALL.iter().map(|p| p.name()).collect();
                format!("unknown preset `{name}` (known: {})", names.join(", "))
            })
    }
}

/// What a preset generated for the tensors at hand.
pub(crate) struct Expansion {
    pub rules: Vec<Rule>,
    pub undecided: Vec<Undecided>,
}

/// Collects a preset's rules, numbering them.
pub(crate) struct Gen {
    name: &'static str,
    pub rules: Vec<Rule>,
    pub undecided: Vec<Undecided>,
}

/// A literal output name as a template (`$` would start a group reference).
pub(crate) fn lit(name: &str) -> String {
    name.replace('$', "$$")
}

/// `prefix.leaf`, or `leaf` at the root.
pub(crate) fn join(prefix: &str, leaf: &str) -> String {
    if prefix.is_empty() {
        leaf.to_string()
    } else {
        format!("{prefix}.{leaf}")
    }
}

impl Gen {
    pub fn new(name: &'static str) -> Gen {
        Gen {
            name,
            rules: Vec::new(),
            undecided: Vec::new(),
        }
    }

    pub fn rule(&mut self, pattern: &str, op: Op) -> Result<()> {
        let rule = Rule::with_origin(pattern, op, self.origin())?;
        self.rules.push(rule);
        Ok(())
    }

    fn origin(&self) -> Origin {
        Origin::Preset {
            name: self.name,
            index: self.rules.len() + 1,
        }
    }

    /// A rule for exactly the tensor `name`.
    pub fn exact(&mut self, name: &str, op: Op) -> Result<()> {
        self.each(&[name.to_string()], op)
    }

    /// One rule applying `op` to exactly these names (templates: literal names).
    pub fn each(&mut self, names: &[String], op: Op) -> Result<()> {
        let names: HashSet<String> = names.iter().cloned().collect();
        let rule = Rule::for_names(names, "^.*$", op, self.origin())?;
        self.rules.push(rule);
        Ok(())
    }

    /// Rename `P.from` to `P.to` for every prefix `P` in `prefixes` (`""`: the root).
    pub fn rename_leaf(&mut self, prefixes: &[String], from: &str, to: &str) -> Result<()> {
        let names: HashSet<String> = prefixes.iter().map(|p| join(p, from)).collect();
        let pattern = format!(r"^(.*\.)?{}$", regex::escape(from));
        let op = Op::Rename {
            to: format!("${{1}}{}", lit(to)),
        };
        let rule = Rule::for_names(names, &pattern, op, self.origin())?;
        self.rules.push(rule);
        Ok(())
    }

    pub fn undecided(&mut self, name: &str, why: impl Into<String>) {
        self.undecided.push(Undecided {
            name: name.to_string(),
            preset: self.name.to_string(),
            why: why.into(),
        });
    }
}

/// Generate `preset`'s rules for `metas` (the tensors as they are at the preset's turn).
pub(crate) fn expand(preset: Preset, metas: &[TensorMeta], ctx: &Context<'_>) -> Result<Expansion> {
    let mut g = Gen::new(preset.name());
    match preset {
        Preset::StripPrefix => strip_prefix(&mut g, metas)?,
        Preset::LstmGates => gates(&mut g, metas, ctx, RnnKind::Lstm)?,
        Preset::GruGates => gates(&mut g, metas, ctx, RnnKind::Gru)?,
        Preset::AttentionQkv => qkv(&mut g, metas)?,
        Preset::Burn => burn::expand(&mut g, metas, ctx)?,
        Preset::WeightNorm => weight_norm(&mut g, metas)?,
    }
    Ok(Expansion {
        rules: g.rules,
        undecided: g.undecided,
    })
}

/// `P.X_g` + `P.X_v` and `P.parametrizations.X.original0` + `original1` -> `P.X`, for the
/// pairs whose shapes are a weight norm's (anything else is listed as undecided).
fn weight_norm(g: &mut Gen, metas: &[TensorMeta]) -> Result<()> {
    let by_name: HashMap<&str, &TensorMeta> = metas.iter().map(|m| (m.name.as_str(), m)).collect();
    let old = Regex::new(r"^(.*)_g$").expect("valid regex");
    let new = Regex::new(r"^(.*\.)?parametrizations\.([^.]+)\.original0$").expect("valid regex");
    for m in metas {
        let (v, out) = if let Some(c) = new.captures(&m.name) {
            let prefix = c.get(1).map_or("", |p| p.as_str());
            let param = &c[2];
            (
                format!("{prefix}parametrizations.{param}.original1"),
                format!("{prefix}{param}"),
            )
        } else if let Some(c) = old.captures(&m.name) {
            (format!("{}_v", &c[1]), c[1].to_string())
        } else {
            continue;
        };
        let Some(vm) = by_name.get(v.as_str()) else {
            continue;
        };
        if super::merge::weight_norm_dim(&m.shape, &vm.shape).is_err() {
            g.undecided(
                &m.name,
                format!(
                    "shape {:?} is not the weight-norm magnitude of `{v}` {:?}",
                    m.shape, vm.shape
                ),
            );
            continue;
        }
        if by_name.contains_key(out.as_str()) {
            g.undecided(&m.name, format!("`{out}` is already present"));
            continue;
        }
        g.exact(
            &m.name,
            Op::Merge {
                inputs: vec![lit(&m.name), lit(&v)],
                to: lit(&out),
                dim: 0,
                mode: super::rules::MergeMode::WeightNorm,
            },
        )?;
    }
    Ok(())
}

const WRAPPERS: &str = r"^(?:module\.|_orig_mod\.)+";

fn strip_prefix(g: &mut Gen, metas: &[TensorMeta]) -> Result<()> {
    let re = Regex::new(WRAPPERS).map_err(|e| crate::Error::Rule {
        rule: "preset strip-prefix".into(),
        what: e.to_string(),
    })?;
    if metas.iter().any(|m| re.is_match(&m.name)) {
        g.rule(WRAPPERS, Op::Rename { to: String::new() })?;
    }
    Ok(())
}

/// Module classes by path, reachable also without `module.` / `_orig_mod.` wrappers, by
/// their last name (`Linear` for `torch.nn.modules.linear.Linear`).
pub(crate) struct Classes<'c>(HashMap<String, &'c str>);

impl<'c> Classes<'c> {
    pub fn new(ctx: &Context<'c>) -> Classes<'c> {
        let mut map = HashMap::new();
        for (path, class) in ctx.modules {
            let short = class.rsplit(['.', ':']).next().unwrap_or(class);
            let mut p = path.as_str();
            while let Some(rest) = p
                .strip_prefix("module.")
                .or_else(|| p.strip_prefix("_orig_mod."))
            {
                p = rest;
            }
            if p == "module" || p == "_orig_mod" {
                p = "";
            }
            map.entry(p.to_string()).or_insert(short);
            map.insert(path.clone(), short);
        }
        Classes(map)
    }

    pub fn get(&self, path: &str) -> Option<&'c str> {
        self.0.get(path).copied()
    }
}

/// The recurrent modules: LSTM (4 gates), GRU (3), Elman RNN (1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RnnKind {
    Lstm,
    Gru,
    Rnn,
}

impl RnnKind {
    pub fn gates(self) -> usize {
        match self {
            RnnKind::Lstm => 4,
            RnnKind::Gru => 3,
            RnnKind::Rnn => 1,
        }
    }
}

/// One packed parameter of a recurrent module (`weight_ih_l1_reverse`).
pub(crate) struct RnnParam {
    pub name: String,
    pub weight: bool,
    pub ih: bool,
    pub layer: usize,
    pub reverse: bool,
}

/// One recurrent module: its prefix, packed parameters, projections, and what it is.
pub(crate) struct RnnGroup {
    pub prefix: String,
    pub params: Vec<RnnParam>,
    pub proj: Vec<String>,
    pub layers: usize,
    pub bidirectional: bool,
    pub kind: std::result::Result<RnnKind, String>,
}

fn rnn_regex() -> &'static (Regex, Regex) {
    static RE: OnceLock<(Regex, Regex)> = OnceLock::new();
    RE.get_or_init(|| {
        (
            Regex::new(r"^(?:(.*)\.)?(weight|bias)_(ih|hh)_l(\d+)(_reverse)?$").expect("valid"),
            Regex::new(r"^(?:(.*)\.)?weight_hr_l(\d+)(_reverse)?$").expect("valid"),
        )
    })
}

/// Find the recurrent modules among `metas`, in order of first appearance.
pub(crate) fn rnn_groups(metas: &[TensorMeta], classes: &Classes<'_>) -> Vec<RnnGroup> {
    let (re, re_proj) = rnn_regex();
    let mut groups: Vec<RnnGroup> = Vec::new();
    let mut at: HashMap<String, usize> = HashMap::new();
    let mut group = |prefix: &str, groups: &mut Vec<RnnGroup>| -> usize {
        *at.entry(prefix.to_string()).or_insert_with(|| {
            groups.push(RnnGroup {
                prefix: prefix.to_string(),
                params: Vec::new(),
                proj: Vec::new(),
                layers: 0,
                bidirectional: false,
                kind: Err(String::new()),
            });
            groups.len() - 1
        })
    };
    for m in metas {
        if let Some(c) = re.captures(&m.name) {
            let prefix = c.get(1).map_or("", |p| p.as_str());
            let Ok(layer) = c[4].parse::<usize>() else {
                continue;
            };
            let i = group(prefix, &mut groups);
            groups[i].params.push(RnnParam {
                name: m.name.clone(),
                weight: &c[2] == "weight",
                ih: &c[3] == "ih",
                layer,
                reverse: c.get(5).is_some(),
            });
        } else if let Some(c) = re_proj.captures(&m.name) {
            let i = group(c.get(1).map_or("", |p| p.as_str()), &mut groups);
            groups[i].proj.push(m.name.clone());
        }
    }
    let shapes: HashMap<&str, &[usize]> = metas
        .iter()
        .map(|m| (m.name.as_str(), m.shape.as_slice()))
        .collect();
    for g in &mut groups {
        g.layers = g.params.iter().map(|p| p.layer + 1).max().unwrap_or(0);
        g.bidirectional = g.params.iter().any(|p| p.reverse);
        g.kind = rnn_kind(g, classes.get(&g.prefix), &shapes);
    }
    groups
}

fn rnn_kind(
    g: &RnnGroup,
    class: Option<&str>,
    shapes: &HashMap<&str, &[usize]>,
) -> std::result::Result<RnnKind, String> {
    let by_class = match class {
        Some("LSTM") => Some(RnnKind::Lstm),
        Some("GRU") => Some(RnnKind::Gru),
        Some("RNN") => Some(RnnKind::Rnn),
        _ => None,
    };
    let hh = join(&g.prefix, "weight_hh_l0");
    let by_shape = match shapes.get(hh.as_str()).copied() {
        Some(&[rows, _]) if !g.proj.is_empty() && rows % 4 == 0 => Some(RnnKind::Lstm),
        Some(&[rows, cols]) if cols > 0 && rows == 4 * cols => Some(RnnKind::Lstm),
        Some(&[rows, cols]) if cols > 0 && rows == 3 * cols => Some(RnnKind::Gru),
        Some(&[rows, cols]) if cols > 0 && rows == cols => Some(RnnKind::Rnn),
        _ => None,
    };
    let kind = match (by_class, by_shape) {
        (Some(a), Some(b)) if a != b => {
            return Err(format!(
                "its module class is {} but {hh} has shape {:?}",
                class.unwrap_or("?"),
                shapes.get(hh.as_str()).copied().unwrap_or(&[])
            ))
        }
        (Some(a), _) | (None, Some(a)) => a,
        (None, None) => {
            return Err(format!(
            "cannot tell an LSTM from a GRU or RNN: {hh} is missing or is not [k*hidden, hidden]"
        ))
        }
    };
    for p in &g.params {
        let rows = shapes.get(p.name.as_str()).and_then(|s| s.first()).copied();
        if rows.is_none_or(|r| r % kind.gates() != 0) {
            return Err(format!(
                "{} does not divide into {} gates along dim 0",
                p.name,
                kind.gates()
            ));
        }
    }
    Ok(kind)
}

fn gates(g: &mut Gen, metas: &[TensorMeta], ctx: &Context<'_>, want: RnnKind) -> Result<()> {
    let short: &[&str] = match want {
        RnnKind::Lstm => &["i", "f", "g", "o"],
        _ => &["r", "z", "n"],
    };
    for group in rnn_groups(metas, &Classes::new(ctx)) {
        match group.kind {
            Ok(kind) if kind == want => {
                for p in &group.params {
                    let to = short
                        .iter()
                        .map(|s| format!("{}.{s}", lit(&p.name)))
                        .collect();
                    g.exact(
                        &p.name,
                        Op::Split {
                            dim: 0,
                            sizes: None,
                            to,
                        },
                    )?;
                }
            }
            Ok(_) => {}
            Err(why) => {
                for p in &group.params {
                    g.undecided(&p.name, why.clone());
                }
            }
        }
    }
    Ok(())
}

fn qkv(g: &mut Gen, metas: &[TensorMeta]) -> Result<()> {
    for m in metas {
        for (leaf, kind) in [("in_proj_weight", "weight"), ("in_proj_bias", "bias")] {
            let Some(prefix) = m.name.strip_suffix(leaf) else {
                continue;
            };
            if !(prefix.is_empty() || prefix.ends_with('.')) {
                continue;
            }
            let prefix = prefix.strip_suffix('.').unwrap_or(prefix);
            if m.shape.first().is_none_or(|r| r % 3 != 0) {
                g.undecided(
                    &m.name,
                    format!(
                        "shape {:?} does not divide into q, k, v along dim 0",
                        m.shape
                    ),
                );
                continue;
            }
            let to = ["q", "k", "v"]
                .iter()
                .map(|x| lit(&join(prefix, &format!("{x}_proj.{kind}"))))
                .collect();
            g.exact(
                &m.name,
                Op::Split {
                    dim: 0,
                    sizes: None,
                    to,
                },
            )?;
        }
        for x in ["q", "k", "v"] {
            let leaf = format!("{x}_proj_weight");
            if let Some(prefix) = m.name.strip_suffix(&leaf) {
                if prefix.is_empty() || prefix.ends_with('.') {
                    let to = lit(&format!("{prefix}{x}_proj.weight"));
                    g.exact(&m.name, Op::Rename { to })?;
                }
            }
        }
    }
    Ok(())
}
