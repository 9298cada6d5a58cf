//! Rule files (TOML): an ordered list of `[[rule]]` tables, each either a rule
//! (`op`, `match` and the op's fields) or a preset (`preset = "burn"`), turned into a
//! [`RuleSet`]. Every error names the file, the line of the rule's `[[rule]]` header and the
//! rule's position; docs/RULES.md describes the language.

use std::path::Path;

use serde::Deserialize;
use toml::Spanned;

use super::presets::Preset;
use super::rules::{MergeMode, Op, Origin, Rule};
use super::{RuleSet, Stage};
use crate::dtype::DType;
use crate::error::{Error, Result};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    rule: Vec<Spanned<toml::Value>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawRule {
    op: Option<String>,
    #[serde(rename = "match")]
    pattern: Option<String>,
    to: Option<OneOrMany>,
    dim: Option<i64>,
    dims: Option<Vec<i64>>,
    sizes: Option<Vec<usize>>,
    inputs: Option<Vec<String>>,
    mode: Option<String>,
    shape: Option<Vec<i64>>,
    dtype: Option<String>,
    preset: Option<String>,
}

impl RawRule {
    /// The names of the fields that are set, for "has no meaning here" messages.
    fn set_fields(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        let mut add = |set: bool, name| {
            if set {
                v.push(name)
            }
        };
        add(self.to.is_some(), "to");
        add(self.dim.is_some(), "dim");
        add(self.dims.is_some(), "dims");
        add(self.sizes.is_some(), "sizes");
        add(self.inputs.is_some(), "inputs");
        add(self.mode.is_some(), "mode");
        add(self.shape.is_some(), "shape");
        add(self.dtype.is_some(), "dtype");
        v
    }
}

impl RuleSet {
    /// Read a rule file.
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<RuleSet> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        RuleSet::from_toml_str(&path.display().to_string(), &text)
    }

    /// Parse rules from TOML text; `label` names the text in messages (usually its path).
    pub fn from_toml_str(label: &str, text: &str) -> Result<RuleSet> {
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            let at = e
                .span()
                .and_then(|s| text.get(..s.start))
                .map(|before| {
                    let line = before.matches('\n').count() + 1;
                    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
                    format!(":{line}:{col}")
                })
                .unwrap_or_default();
            Error::Rule {
                rule: format!("{label}{at}"),
                what: format!("not a valid rule file: {}", e.message().trim()),
            }
        })?;
        let mut set = RuleSet::new();
        for (i, spanned) in raw.rule.into_iter().enumerate() {
            let line = text
                .get(..spanned.span().start)
                .map(|before| before.matches('\n').count() + 1);
            // The span of a table in an array of tables starts at its first key; the
            // `[[rule]]` header is the line above.
            let line = line.map(|l| header_line(text, l));
            let origin = Origin::File {
                path: label.to_string(),
                line,
                index: i + 1,
            };
            set.stages.push(parse_rule(spanned.into_inner(), origin)?);
        }
        Ok(set)
    }
}

/// The line of the `[[rule]]` header at or above 1-based line `line`.
fn header_line(text: &str, line: usize) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    let mut l = line.min(lines.len());
    while l > 1 && !lines[l - 1].trim_start().starts_with("[[") {
        l -= 1;
    }
    l
}

fn parse_rule(value: toml::Value, origin: Origin) -> Result<Stage> {
    let fail = |what: String| Error::Rule {
        rule: origin.to_string(),
        what,
    };
    let raw: RawRule = value
        .try_into()
        .map_err(|e: toml::de::Error| fail(e.message().trim().to_string()))?;
    if let Some(name) = &raw.preset {
        let preset = Preset::from_name(name).map_err(&fail)?;
        if raw.op.is_some() || raw.pattern.is_some() || !raw.set_fields().is_empty() {
            return Err(fail(
                "a `preset` rule takes no other field (write the preset and the rules as separate [[rule]] tables)".into(),
            ));
        }
        return Ok(Stage::Preset { preset, origin });
    }
    let op_name = raw
        .op
        .clone()
        .ok_or_else(|| fail("the rule has no `op` (rename, keep, drop, split, merge, transpose, permute, reshape, cast) and no `preset`".into()))?;
    let pattern = raw
        .pattern
        .clone()
        .ok_or_else(|| fail(format!("the {op_name} rule has no `match` pattern")))?;
    let op = build_op(&op_name, raw).map_err(|what| Error::Rule {
        rule: format!("{origin} ({op_name})"),
        what,
    })?;
    Ok(Stage::Rule(Rule::with_origin(&pattern, op, origin)?))
}

/// Turn the fields of one rule into an [`Op`], refusing fields the op does not use.
fn build_op(op: &str, mut r: RawRule) -> std::result::Result<Op, String> {
    let allowed: &[&str] = match op {
        "rename" => &["to"],
        "keep" | "drop" => &[],
        "split" => &["to", "dim", "sizes"],
        "merge" => &["to", "dim", "inputs", "mode"],
        "transpose" => &["to", "dims"],
        "permute" => &["to", "dims"],
        "reshape" => &["to", "shape"],
        "cast" => &["to", "dtype"],
        other => {
            return Err(format!(
                "unknown op `{other}` (expected rename, keep, drop, split, merge, transpose, permute, reshape or cast)"
            ))
        }
    };
    if let Some(extra) = r.set_fields().into_iter().find(|f| !allowed.contains(f)) {
        return Err(format!("`{extra}` has no meaning for {op}"));
    }
    let one_to = |to: Option<OneOrMany>| -> std::result::Result<Option<String>, String> {
        match to {
            None => Ok(None),
            Some(OneOrMany::One(s)) => Ok(Some(s)),
            Some(OneOrMany::Many(_)) => Err(format!("`to` of {op} is one name, not a list")),
        }
    };
    let need = |what: &str| format!("{op} needs `{what}`");
    Ok(match op {
        "rename" => Op::Rename {
            to: one_to(r.to)?.ok_or_else(|| need("to"))?,
        },
        "keep" => Op::Keep,
        "drop" => Op::Drop,
        "split" => Op::Split {
            dim: r.dim.unwrap_or(0),
            sizes: r.sizes,
            to: match r.to {
                Some(OneOrMany::Many(v)) => v,
                Some(OneOrMany::One(_)) => {
                    return Err("`to` of split is a list of names, one per piece".into())
                }
                None => return Err(need("to")),
            },
        },
        "merge" => Op::Merge {
            inputs: r.inputs.take().ok_or_else(|| need("inputs"))?,
            to: one_to(r.to)?.ok_or_else(|| need("to"))?,
            dim: r.dim.unwrap_or(0),
            mode: match r.mode.as_deref() {
                None | Some("concat") => MergeMode::Concat,
                Some("stack") => MergeMode::Stack,
                Some("weight-norm") => MergeMode::WeightNorm,
                Some(other) => {
                    return Err(format!(
                        "unknown merge mode `{other}` (expected concat, stack or weight-norm)"
                    ))
                }
            },
        },
        "transpose" => Op::Transpose {
            dims: match r.dims {
                None => None,
                Some(d) if d.len() == 2 => Some([d[0], d[1]]),
                Some(d) => return Err(format!("`dims` of transpose is two dims, not {d:?}")),
            },
            to: one_to(r.to)?,
        },
        "permute" => Op::Permute {
            dims: r.dims.take().ok_or_else(|| need("dims"))?,
            to: one_to(r.to)?,
        },
        "reshape" => Op::Reshape {
            shape: r.shape.take().ok_or_else(|| need("shape"))?,
            to: one_to(r.to)?,
        },
        _ => {
            let name = r.dtype.clone().ok_or_else(|| need("dtype"))?;
            Op::Cast {
                dtype: DType::from_name(&name).ok_or_else(|| {
                    format!("unknown dtype `{name}` (expected a torch dtype name such as float16, bfloat16, float32)")
                })?,
                to: one_to(r.to)?,
            }
        }
    })
}
