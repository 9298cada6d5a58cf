//! Adapting a checkpoint's tensors to a target model: ordered rules (rename, keep, drop,
//! split, merge, transpose, permute, reshape, cast) written in TOML or built in Rust,
//! presets that generate rules from what the tensors look like (`strip-prefix`, `lstm-gates`,
//! `gru-gates`, `attention-qkv`, `burn`, `weight-norm`), a [`Plan`] that says what will
//! happen before any data is read, and a match report against a target ([`report`]).
//!
//! Rules run in order, each over every tensor the rules before it produced: a tensor whose
//! name the rule's pattern matches is transformed, the others pass through. Outputs stay in
//! source order; a split's pieces take the place of their source, a merge takes the place of
//! its first input.
//!
//! Data stays lazy: [`apply`] only builds new [`OutTensor`]s whose closures read their
//! sources when a writer asks. A split piece reads its source each time it is produced and
//! keeps nothing (a piece along dim 0 of a memory-mapped tensor is even borrowed with no
//! copy); a merge reads each input once per production. Memory in use is therefore about one
//! output tensor (plus its sources when they must be copied out of a strided file), never
//! the whole model.
//!
//! ```
//! use torchport::remap::{apply, Op, Rule, RuleSet};
//! let mut rules = RuleSet::new();
//! rules.preset("strip-prefix")?;
//! rules.push(Rule::new(r"^fc\.weight$", Op::Transpose { dims: None, to: None })?);
//! let rules = RuleSet::from_toml_str("rules.toml", r#"
//!     [[rule]]
//!     op = "rename"
//!     match = '^encoder\.(.*)$'
//!     to = 'enc.${1}'
//! "#)?;
//! # Ok::<(), torchport::Error>(())
//! ```

mod burn;
mod dym;
mod engine;
mod file;
mod merge;
mod ops;
mod plan;
mod presets;
pub mod report;
mod rules;
mod suggest;

use std::fmt;
use std::path::Path;

use serde::Serialize;

use crate::dtype::DType;
use crate::error::Result;
use crate::out::OutTensor;

pub use dym::edit_distance;
pub use plan::{Dropped, Plan, PlanTarget, Step, Undecided};
pub use presets::Preset;
pub use report::TargetTensor;
pub use rules::{MergeMode, Op, Origin, Rule};

/// A tensor's name, dtype and shape, without its data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TensorMeta {
    /// Name.
    pub name: String,
    /// Element type.
    #[serde(serialize_with = "ser_dtype")]
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
}

impl TensorMeta {
    /// The metadata of an [`OutTensor`].
    pub fn of(t: &OutTensor<'_>) -> TensorMeta {
        TensorMeta {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
        }
    }
}

pub(crate) fn ser_dtype<S: serde::Serializer>(
    d: &DType,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(d.name())
}

/// One step of a [`RuleSet`]: a rule, or a preset expanded against the tensors as they are
/// when the preset's turn comes.
#[derive(Clone, Debug)]
pub(crate) enum Stage {
    Rule(Rule),
    Preset { preset: Preset, origin: Origin },
}

/// An ordered list of rules and presets.
#[derive(Clone, Debug, Default)]
pub struct RuleSet {
    pub(crate) stages: Vec<Stage>,
}

impl RuleSet {
    /// No rules.
    pub fn new() -> RuleSet {
        RuleSet::default()
    }

    /// Append a rule; a rule built with [`Rule::new`] takes its position as its index.
    pub fn push(&mut self, mut rule: Rule) -> &mut Self {
        if let Origin::Api { index } = &mut rule.origin {
            *index = self.stages.len() + 1;
        }
        self.stages.push(Stage::Rule(rule));
        self
    }

    /// Append a preset by name (`strip-prefix`, `lstm-gates`, `gru-gates`, `attention-qkv`,
    /// `burn`, `weight-norm`).
    pub fn preset(&mut self, name: &str) -> Result<&mut Self> {
        let preset = Preset::from_name(name).map_err(|what| crate::Error::Rule {
            rule: format!("rule {}", self.stages.len() + 1),
            what,
        })?;
        let origin = Origin::Api {
            index: self.stages.len() + 1,
        };
        self.stages.push(Stage::Preset { preset, origin });
        Ok(self)
    }

    /// The presets named in `presets`, in the order given, then the rules of the TOML file
    /// `rules_file` (see docs/RULES.md), if any — what `torchport convert` and `torchport
    /// match` apply.
    pub fn from_presets_and_file<S: AsRef<str>>(
        presets: &[S],
        rules_file: Option<&Path>,
    ) -> Result<RuleSet> {
        let mut rules = RuleSet::new();
        for p in presets {
            rules.preset(p.as_ref())?;
        }
        if let Some(path) = rules_file {
            rules.extend(RuleSet::from_toml_file(path)?);
        }
        Ok(rules)
    }

    /// Append every stage of `other` after this set's stages.
    pub fn extend(&mut self, other: RuleSet) -> &mut Self {
        for stage in other.stages {
            match stage {
                Stage::Rule(rule) => {
                    self.push(rule);
                }
                Stage::Preset { preset, origin } => self.stages.push(Stage::Preset {
                    preset,
                    origin: match origin {
                        Origin::Api { .. } => Origin::Api {
                            index: self.stages.len() + 1,
                        },
                        o => o,
                    },
                }),
            }
        }
        self
    }

    /// Number of rules and presets.
    pub fn len(&self) -> usize {
        self.stages.len()
    }

    /// True when there is nothing to apply.
    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }
}

impl fmt::Display for RuleSet {
    /// One line per stage: `origin: op match` or `origin: preset name`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for stage in &self.stages {
            match stage {
                Stage::Rule(r) => writeln!(f, "{}: `{}`", r.label(), r.pattern())?,
                Stage::Preset { preset, origin } => {
                    writeln!(f, "{origin}: preset {}", preset.name())?
                }
            }
        }
        Ok(())
    }
}

/// What presets may use besides tensor names and shapes to decide what a tensor is.
#[derive(Clone, Copy, Debug, Default)]
pub struct Context<'c> {
    /// Module paths and classes, as [`Checkpoint::modules`](crate::Checkpoint::modules) gives
    /// them for a whole pickled model (`("lin", "torch.nn.modules.linear.Linear")`).
    pub modules: &'c [(String, String)],
    /// The tensors the target model expects, when known.
    pub target: Option<&'c [TargetTensor]>,
}

/// Apply `rules` to `tensors`: the renamed, reshaped tensors (data still lazy) and the
/// [`Plan`] saying what happened to each. Errors name the rule at fault.
pub fn apply<'a>(
    rules: &RuleSet,
    tensors: Vec<OutTensor<'a>>,
) -> Result<(Vec<OutTensor<'a>>, Plan)> {
    apply_with(rules, tensors, &Context::default())
}

/// [`apply`] with evidence for the presets: module classes and the target's tensors.
pub fn apply_with<'a>(
    rules: &RuleSet,
    tensors: Vec<OutTensor<'a>>,
    ctx: &Context<'_>,
) -> Result<(Vec<OutTensor<'a>>, Plan)> {
    engine::run(rules, tensors, ctx)
}

/// The [`Plan`] of `rules` over tensors known only by their metadata (nothing is read).
pub fn plan(
    rules: &RuleSet,
    tensors: &[TensorMeta],
    ctx: &Context<'_>,
) -> Result<(Vec<TensorMeta>, Plan)> {
    let (out, plan, _) = plan_resolved(rules, tensors, ctx)?;
    Ok((out, plan))
}

/// [`plan`], and the rules resolved for these tensors: every preset replaced by the rules it
/// generated at its turn (which name the tensors they touch). Presets decide from all the
/// tensors present; the resolved rules do not, so running them over only the
/// [`PlanTarget::sources`] of one output makes that output exactly as the
/// full run does — without going over every other tensor.
pub fn plan_resolved(
    rules: &RuleSet,
    tensors: &[TensorMeta],
    ctx: &Context<'_>,
) -> Result<(Vec<TensorMeta>, Plan, RuleSet)> {
    let outs = tensors
        .iter()
        .map(|m| {
            let name = m.name.clone();
            OutTensor::new(m.name.clone(), m.dtype, m.shape.clone(), move || {
                Err(crate::Error::Rule {
                    rule: "plan".into(),
                    what: format!("`{name}` has no data in a dry run"),
                })
            })
        })
        .collect();
    let mut resolved = Vec::new();
    let (out, plan) = engine::run_resolving(rules, outs, ctx, Some(&mut resolved))?;
    let resolved = RuleSet {
        stages: resolved.into_iter().map(Stage::Rule).collect(),
    };
    Ok((out.iter().map(TensorMeta::of).collect(), plan, resolved))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_then_rule_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("rules.toml");
        std::fs::write(
            &file,
            "[[rule]]\nop = \"rename\"\nmatch = '^a$'\nto = 'b'\n",
        )
        .unwrap();
        let rules = RuleSet::from_presets_and_file(&["strip-prefix", "burn"], Some(&file)).unwrap();
        assert_eq!(rules.stages.len(), 3);
        assert!(matches!(rules.stages[0], Stage::Preset { .. }));
        assert!(matches!(rules.stages[2], Stage::Rule(_)));
        assert!(RuleSet::from_presets_and_file::<&str>(&[], None)
            .unwrap()
            .stages
            .is_empty());
        let err = RuleSet::from_presets_and_file(&["no-such-preset"], None).unwrap_err();
        assert!(err.to_string().contains("no-such-preset"), "{err}");
    }
}
