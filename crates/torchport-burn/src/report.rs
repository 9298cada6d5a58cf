//! The account of a load: what was applied (and how), what the module wanted but the file
//! lacks, what the file has but nothing took, what was found but did not fit — each with
//! suggestions a person can act on.

use std::fmt;

use torchport::DType;

/// One parameter that received a checkpoint tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The Burn parameter path (`lstm.input_gate.input_transform.weight`).
    pub target: String,
    /// The checkpoint tensor it came from, as the file names it.
    pub source: String,
    /// What the adapter did (`Lstm: gate 0 of 4, transposed`); empty when taken as is.
    pub note: String,
}

/// A parameter of the module that no checkpoint tensor fills.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing {
    /// The Burn parameter path.
    pub target: String,
    /// The shape Burn expects.
    pub shape: Vec<usize>,
    /// The checkpoint names that were looked for, most likely first.
    pub tried: Vec<String>,
    /// Unused checkpoint tensors that look like it, closest first.
    pub suggestions: Vec<String>,
}

/// A checkpoint tensor that nothing in the module took.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unused {
    /// The name in the file.
    pub source: String,
    /// The name after the user's renames, when they changed it.
    pub renamed: Option<String>,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its dtype.
    pub dtype: DType,
    /// The name a missing parameter looks for that this tensor's name most resembles.
    pub suggestion: Option<String>,
}

/// A checkpoint tensor found for a parameter that does not fit it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatched {
    /// The Burn parameter path.
    pub target: String,
    /// The checkpoint tensor, as the file names it.
    pub source: String,
    /// The shape Burn expects.
    pub expected: Vec<usize>,
    /// The checkpoint tensor's shape.
    pub found: Vec<usize>,
    /// The checkpoint tensor's dtype.
    pub dtype: DType,
    /// Why it does not fit, as one sentence fragment.
    pub reason: String,
}

/// Everything a load did and did not do. A load is complete when nothing is missing,
/// unused or mismatched; [`ignored`](Self::ignored) tensors never count against it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Parameters filled from the checkpoint.
    pub applied: Vec<Applied>,
    /// Parameters the checkpoint does not fill (they keep their initial values).
    pub missing: Vec<Missing>,
    /// Checkpoint tensors nothing took.
    pub unused: Vec<Unused>,
    /// Checkpoint tensors found for a parameter that do not fit it (the parameter keeps its
    /// initial value).
    pub mismatched: Vec<Mismatched>,
    /// Checkpoint tensors that Burn has no place for by design (`num_batches_tracked`).
    pub ignored: Vec<String>,
    /// Renames that would fix the missing/unused pairs, as `(regex, replacement)`.
    pub rename_hints: Vec<(String, String)>,
    /// Tensors your rules dropped (with the rule), for the record.
    pub dropped: Vec<String>,
    /// What your rules' presets could not decide, and rules that matched nothing.
    pub warnings: Vec<String>,
}

impl LoadReport {
    /// True when every parameter was filled and every checkpoint tensor was used.
    pub fn is_complete(&self) -> bool {
        self.missing.is_empty() && self.unused.is_empty() && self.mismatched.is_empty()
    }

    /// One line: counts of each kind.
    pub fn summary(&self) -> String {
        format!(
            "{} applied, {} missing, {} unused, {} mismatched, {} ignored",
            self.applied.len(),
            self.missing.len(),
            self.unused.len(),
            self.mismatched.len(),
            self.ignored.len()
        )
    }
}

fn shape(s: &[usize]) -> String {
    let parts: Vec<String> = s.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

impl fmt::Display for LoadReport {
    /// Every problem, one per line, then hints; applied tensors only with `{:#}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.summary())?;
        for m in &self.missing {
            write!(
                f,
                "  missing    {} {}: the checkpoint has no {}",
                m.target,
                shape(&m.shape),
                m.tried.join(" or ")
            )?;
            if !m.suggestions.is_empty() {
                write!(f, " (closest unused: {})", m.suggestions.join(", "))?;
            }
            writeln!(f)?;
        }
        for m in &self.mismatched {
            writeln!(
                f,
                "  mismatched {} {}: {} ({} {}) {}",
                m.target,
                shape(&m.expected),
                m.source,
                m.dtype,
                shape(&m.found),
                m.reason
            )?;
        }
        for u in &self.unused {
            write!(
                f,
                "  unused     {} ({} {})",
                u.source,
                u.dtype,
                shape(&u.shape)
            )?;
            if let Some(r) = &u.renamed {
                write!(f, " renamed to {r}")?;
            }
            if let Some(s) = &u.suggestion {
                write!(f, ", perhaps it should be {s}")?;
            }
            writeln!(f)?;
        }
        for (from, to) in &self.rename_hints {
            writeln!(f, "  hint: add the rename rule {from} -> {to}")?;
        }
        for w in &self.warnings {
            writeln!(f, "  warning: {w}")?;
        }
        if f.alternate() {
            for a in &self.applied {
                if a.note.is_empty() {
                    writeln!(f, "  applied    {} <- {}", a.target, a.source)?;
                } else {
                    writeln!(f, "  applied    {} <- {} ({})", a.target, a.source, a.note)?;
                }
            }
            for i in &self.ignored {
                writeln!(f, "  ignored    {i}")?;
            }
            for d in &self.dropped {
                writeln!(f, "  dropped    {d}")?;
            }
        }
        Ok(())
    }
}
