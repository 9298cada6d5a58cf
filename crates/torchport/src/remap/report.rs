//! The match report: compare the tensors a checkpoint gives (after rules) with the tensors a
//! target model expects — matched, missing, unused, shape and dtype mismatches — with "did
//! you mean" names (edit distance) and suggested rules where the evidence is clear
//! (suggest.rs). A target comes from Rust (a list of [`TargetTensor`]), from a JSON list
//! `[{"name", "shape", "dtype"?}]`, or from any file torchport opens.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{Context, TensorMeta};
use crate::dtype::DType;
use crate::error::{Error, Result};

pub use super::suggest::{suggest_presets, Suggestion};

/// A tensor the target model expects: its name, shape and, optionally, dtype.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TargetTensor {
    /// Name.
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Element type, when the target cares.
    #[serde(serialize_with = "ser_opt_dtype")]
    pub dtype: Option<DType>,
}

impl TargetTensor {
    /// A target tensor with any dtype.
    pub fn new(name: impl Into<String>, shape: &[usize]) -> TargetTensor {
        TargetTensor {
            name: name.into(),
            shape: shape.to_vec(),
            dtype: None,
        }
    }
}

fn ser_opt_dtype<S: serde::Serializer>(
    d: &Option<DType>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_str(d.name()),
        None => s.serialize_none(),
    }
}

#[derive(Deserialize)]
struct RawTarget {
    name: String,
    shape: Vec<usize>,
    #[serde(default)]
    dtype: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawTargets {
    List(Vec<RawTarget>),
    /// `torchport inspect --json` output.
    Inspect {
        tensors: Vec<RawTarget>,
    },
}

/// Read a target: a JSON list `[{"name", "shape", "dtype"?}]` (or `torchport inspect --json`
/// output), or any checkpoint torchport opens (its tensors' names, shapes and dtypes; meta
/// tensors count, so a `torch.device("meta")` model's state_dict is a good target).
pub fn load_target(path: impl AsRef<Path>) -> Result<Vec<TargetTensor>> {
    let path = path.as_ref();
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut head = [0u8; 256];
    let n = {
        use std::io::Read;
        std::fs::File::open(path)
            .and_then(|mut f| f.read(&mut head))
            .map_err(io)?
    };
    let first = head[..n].iter().find(|b| !b.is_ascii_whitespace());
    if matches!(first, Some(b'[' | b'{')) {
        let bytes = std::fs::read(path).map_err(io)?;
        return parse_target_json(path, &bytes);
    }
    let ckpt = crate::open(path)?;
    Ok(ckpt
        .tensors()
        .iter()
        .map(|t| TargetTensor {
            name: t.name.clone(),
            shape: t.shape.clone(),
            dtype: Some(t.dtype),
        })
        .collect())
}

/// Parse a JSON target (see [`load_target`]); `path` names it in messages.
pub fn parse_target_json(path: &Path, bytes: &[u8]) -> Result<Vec<TargetTensor>> {
    let corrupt = |what: String| Error::Corrupt {
        path: path.to_path_buf(),
        what,
    };
    let raw: RawTargets = serde_json::from_slice(bytes).map_err(|e| {
        corrupt(format!(
            "not a target list ([{{\"name\", \"shape\", \"dtype\"?}}, ...]): {e}"
        ))
    })?;
    let (RawTargets::List(list) | RawTargets::Inspect { tensors: list }) = raw;
    list.into_iter()
        .map(|r| {
            let dtype = match r.dtype {
                None => None,
                Some(d) => Some(DType::from_name(&d).ok_or_else(|| {
                    corrupt(format!(
                        "target tensor {} has an unknown dtype `{d}`",
                        r.name
                    ))
                })?),
            };
            Ok(TargetTensor {
                name: r.name,
                shape: r.shape,
                dtype,
            })
        })
        .collect()
}

/// A target tensor the checkpoint does not give, or a checkpoint tensor the target does not
/// want.
#[derive(Clone, Debug, Serialize)]
pub struct Unmatched {
    /// Name.
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Dtype (always known for checkpoint tensors).
    #[serde(serialize_with = "ser_opt_dtype")]
    pub dtype: Option<DType>,
    /// The closest names on the other side (edit distance), best first.
    pub did_you_mean: Vec<String>,
}

/// A name both sides have, with a different shape or dtype.
#[derive(Clone, Debug, Serialize)]
pub struct Mismatch {
    /// Name.
    pub name: String,
    /// Shape in the checkpoint.
    pub have_shape: Vec<usize>,
    /// Shape the target wants.
    pub want_shape: Vec<usize>,
    /// Dtype in the checkpoint.
    #[serde(serialize_with = "super::ser_dtype")]
    pub have_dtype: DType,
    /// Dtype the target wants, if it says.
    #[serde(serialize_with = "ser_opt_dtype")]
    pub want_dtype: Option<DType>,
}

/// The comparison of a checkpoint's tensors with a target.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MatchReport {
    /// Names present on both sides with equal shape (and dtype, where the target says).
    pub matched: Vec<String>,
    /// Target tensors the checkpoint does not give.
    pub missing: Vec<Unmatched>,
    /// Checkpoint tensors the target does not want.
    pub unused: Vec<Unmatched>,
    /// Names on both sides whose shapes differ.
    pub shape_mismatches: Vec<Mismatch>,
    /// Names on both sides with equal shapes whose dtypes differ.
    pub dtype_mismatches: Vec<Mismatch>,
    /// Rules that would fix part of the difference.
    pub suggestions: Vec<Suggestion>,
}

impl MatchReport {
    /// True when every target tensor is matched and every checkpoint tensor is used.
    pub fn all_matched(&self) -> bool {
        self.missing.is_empty()
            && self.unused.is_empty()
            && self.shape_mismatches.is_empty()
            && self.dtype_mismatches.is_empty()
    }
}

/// Compare `have` (the checkpoint's tensors, after rules) with `want` (the target), with
/// "did you mean" names and suggested rules (not presets: see [`suggest_presets`]).
pub fn match_tensors(have: &[TensorMeta], want: &[TargetTensor]) -> MatchReport {
    let have_at: HashMap<&str, &TensorMeta> = have.iter().map(|h| (h.name.as_str(), h)).collect();
    let want_at: HashMap<&str, &TargetTensor> = want.iter().map(|w| (w.name.as_str(), w)).collect();
    let mut r = MatchReport::default();
    for w in want {
        let Some(h) = have_at.get(w.name.as_str()) else {
            r.missing.push(Unmatched {
                name: w.name.clone(),
                shape: w.shape.clone(),
                dtype: w.dtype,
                did_you_mean: Vec::new(),
            });
            continue;
        };
        let m = Mismatch {
            name: w.name.clone(),
            have_shape: h.shape.clone(),
            want_shape: w.shape.clone(),
            have_dtype: h.dtype,
            want_dtype: w.dtype,
        };
        if h.shape != w.shape {
            r.shape_mismatches.push(m);
        } else if w.dtype.is_some_and(|d| d != h.dtype) {
            r.dtype_mismatches.push(m);
        } else {
            r.matched.push(w.name.clone());
        }
    }
    for h in have
        .iter()
        .filter(|h| !want_at.contains_key(h.name.as_str()))
    {
        r.unused.push(Unmatched {
            name: h.name.clone(),
            shape: h.shape.clone(),
            dtype: Some(h.dtype),
            did_you_mean: Vec::new(),
        });
    }
    super::dym::did_you_mean(&mut r);
    r.suggestions = super::suggest::suggest_rules(&r);
    r
}

/// [`match_tensors`], plus the best preset suggestion when not everything matches (alone,
/// when it would make everything match).
pub fn report(have: &[TensorMeta], want: &[TargetTensor], ctx: &Context<'_>) -> MatchReport {
    let mut r = match_tensors(have, want);
    if !r.all_matched() {
        match super::suggest::best_preset(have, want, ctx, r.matched.len()) {
            // A preset that matches everything says all there is to say.
            Some((n, s)) if n == want.len() => r.suggestions = vec![s],
            Some((_, s)) => r.suggestions.insert(0, s),
            None => {}
        }
    }
    r
}

fn shape_text(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    format!("[{}]", dims.join(", "))
}

fn dtype_text(d: Option<DType>) -> &'static str {
    d.map_or("any dtype", DType::name)
}

impl fmt::Display for MatchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let targets = self.matched.len()
            + self.missing.len()
            + self.shape_mismatches.len()
            + self.dtype_mismatches.len();
        writeln!(
            f,
            "matched: {} of {targets} target tensors",
            self.matched.len()
        )?;
        let list = |f: &mut fmt::Formatter<'_>, title: &str, v: &[Unmatched]| -> fmt::Result {
            if v.is_empty() {
                return Ok(());
            }
            writeln!(f, "{title} ({}):", v.len())?;
            for u in v {
                write!(
                    f,
                    "  {}  {} {}",
                    u.name,
                    dtype_text(u.dtype),
                    shape_text(&u.shape)
                )?;
                if !u.did_you_mean.is_empty() {
                    write!(f, "  (did you mean {}?)", u.did_you_mean.join(", "))?;
                }
                writeln!(f)?;
            }
            Ok(())
        };
        list(
            f,
            "missing: the target wants, the checkpoint lacks",
            &self.missing,
        )?;
        list(
            f,
            "unused: the checkpoint has, the target does not want",
            &self.unused,
        )?;
        for (title, v) in [
            ("shape mismatches", &self.shape_mismatches),
            ("dtype mismatches", &self.dtype_mismatches),
        ] {
            if v.is_empty() {
                continue;
            }
            writeln!(f, "{title} ({}):", v.len())?;
            for m in v {
                writeln!(
                    f,
                    "  {}: checkpoint {} {}, target {} {}",
                    m.name,
                    m.have_dtype,
                    shape_text(&m.have_shape),
                    dtype_text(m.want_dtype),
                    shape_text(&m.want_shape)
                )?;
            }
        }
        if !self.suggestions.is_empty() {
            writeln!(f, "suggested rules:")?;
            for s in &self.suggestions {
                writeln!(f, "  # {}", s.why)?;
                for line in s.toml.lines() {
                    if line.is_empty() {
                        writeln!(f)?;
                    } else {
                        writeln!(f, "  {line}")?;
                    }
                }
            }
        }
        Ok(())
    }
}
