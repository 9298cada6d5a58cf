//! The [`Plan`]: what applying the rules does to each source tensor — its target name(s),
//! dtype, shape and the steps that made them, the tensors dropped and by which rule, the
//! tensors a preset could not decide, and the rules that matched nothing. Printable (for
//! `--dry-run`) and serializable (for `--json`); nothing in it needs tensor data.

use std::fmt;

use serde::Serialize;

use super::{ser_dtype, TensorMeta};
use crate::dtype::DType;

/// One transformation applied to a tensor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Step {
    /// The rule that did it (`rules.toml:12: rule 3 (split)`, `preset burn, rule 4 (transpose)`).
    pub rule: String,
    /// What it did (`split dim 0: piece 2 of 4 (20..40)`, `transpose dims 0, 1`).
    pub op: String,
}

/// One output tensor of the plan.
#[derive(Clone, Debug, Serialize)]
pub struct PlanTarget {
    /// Output name.
    pub name: String,
    /// Output dtype.
    #[serde(serialize_with = "ser_dtype")]
    pub dtype: DType,
    /// Output shape.
    pub shape: Vec<usize>,
    /// The source tensors it is made from (more than one after a merge).
    pub sources: Vec<String>,
    /// The steps that made it, in order (empty: the source unchanged).
    pub steps: Vec<Step>,
}

/// A tensor a rule dropped.
#[derive(Clone, Debug, Serialize)]
pub struct Dropped {
    /// Its name when it was dropped.
    pub name: String,
    /// The source tensors it came from.
    pub sources: Vec<String>,
    /// The rule that dropped it.
    pub rule: String,
}

/// A tensor a preset left as it is because the evidence could not tell what it is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Undecided {
    /// The tensor's name.
    pub name: String,
    /// The preset.
    pub preset: String,
    /// Why it could not decide, and what would settle it.
    pub why: String,
}

/// What applying a [`RuleSet`](super::RuleSet) does, computed without reading tensor data.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Plan {
    /// The input tensors, in order.
    pub sources: Vec<TensorMeta>,
    /// The output tensors, in order.
    pub targets: Vec<PlanTarget>,
    /// Tensors dropped by `drop` / `keep` rules or presets.
    pub dropped: Vec<Dropped>,
    /// Tensors presets could not decide about (left unchanged).
    pub undecided: Vec<Undecided>,
    /// Rules that matched nothing, presets that found nothing to do.
    pub warnings: Vec<String>,
}

impl Plan {
    pub(crate) fn new(sources: Vec<TensorMeta>) -> Plan {
        Plan {
            sources,
            ..Plan::default()
        }
    }

    pub(crate) fn source_name(&self, i: usize) -> String {
        self.sources
            .get(i)
            .map(|s| s.name.clone())
            .unwrap_or_default()
    }

    /// The targets made from the source named `name`.
    pub fn targets_of<'p>(&'p self, name: &'p str) -> impl Iterator<Item = &'p PlanTarget> + 'p {
        self.targets
            .iter()
            .filter(move |t| t.sources.iter().any(|s| s == name))
    }

    /// True when the output is the input unchanged (same names, no steps, nothing dropped).
    pub fn is_identity(&self) -> bool {
        self.dropped.is_empty()
            && self.targets.len() == self.sources.len()
            && self.targets.iter().all(|t| t.steps.is_empty())
    }
}

fn shape_text(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    format!("[{}]", dims.join(", "))
}

impl fmt::Display for Plan {
    /// Source by source: each target it becomes (`->`, or `=` when unchanged) with its
    /// steps, or the rule that dropped it; then undecided tensors, warnings and totals.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for s in &self.sources {
            writeln!(f, "{}  {} {}", s.name, s.dtype, shape_text(&s.shape))?;
            for t in self
                .targets
                .iter()
                .filter(|t| t.sources.first() == Some(&s.name))
            {
                if t.steps.is_empty() && t.name == s.name {
                    writeln!(f, "  = unchanged")?;
                    continue;
                }
                writeln!(f, "  -> {}  {} {}", t.name, t.dtype, shape_text(&t.shape))?;
                if let Some(rest) = t.sources.get(1..).filter(|r| !r.is_empty()) {
                    writeln!(f, "       with {}", rest.join(", "))?;
                }
                for step in &t.steps {
                    writeln!(f, "       {}  [{}]", step.op, step.rule)?;
                }
            }
            for t in &self.targets {
                if let (Some(first), Some(rest)) = (t.sources.first(), t.sources.get(1..)) {
                    if rest.contains(&s.name) {
                        writeln!(f, "  -> merged into {} (listed under {first})", t.name)?;
                    }
                }
            }
            for d in self.dropped.iter().filter(|d| d.sources.contains(&s.name)) {
                if d.name == s.name {
                    writeln!(f, "  x dropped  [{}]", d.rule)?;
                } else {
                    writeln!(f, "  x {} dropped  [{}]", d.name, d.rule)?;
                }
            }
        }
        if !self.undecided.is_empty() {
            writeln!(f, "undecided (left unchanged):")?;
            for u in &self.undecided {
                writeln!(f, "  {} (preset {}): {}", u.name, u.preset, u.why)?;
            }
        }
        if !self.warnings.is_empty() {
            writeln!(f, "warnings:")?;
            for w in &self.warnings {
                writeln!(f, "  {w}")?;
            }
        }
        writeln!(
            f,
            "{} source tensors -> {} target tensors ({} dropped, {} undecided)",
            self.sources.len(),
            self.targets.len(),
            self.dropped.len(),
            self.undecided.len()
        )
    }
}
