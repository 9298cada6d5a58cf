//! The conversion pipeline, as `torchport convert` runs it and as build scripts call it:
//! select, merge a LoRA adapter ([`Lora`], before any cast, as PEFT merges), cast
//! ([`ConvertOptions`]), then remap (a [`RuleSet`]: presets in their order,
//! then a rules file), then check against a target (a [`MatchReport`]; any mismatch stops the
//! conversion before anything is written), then write (the format OUT's extension names).
//!
//! [`Conversion::prepare`] runs every step but the write and returns what would be written,
//! so a front end can show a plan, a dry run or a report first; [`convert`] does it all.
//!
//! ```no_run
//! use torchport::convert::{convert, Conversion};
//! use torchport::remap::RuleSet;
//! let conv = Conversion {
//!     rules: Some(RuleSet::from_presets_and_file(&["strip-prefix"], None)?),
//!     target: Some(torchport::remap::report::load_target("expected.json")?),
//!     ..Conversion::default()
//! };
//! convert("ckpt.pt", "model.safetensors", &conv)?;
//! # Ok::<(), torchport::Error>(())
//! ```

use std::path::Path;
use std::sync::Arc;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::lora::Lora;
use crate::remap::report::{report, MatchReport};
use crate::remap::{apply_with, Context, Plan, RuleSet, TargetTensor, TensorMeta};
use crate::select::{cast_out, ConvertOptions, Selection};
use crate::write::{self, OutputFormat, Progress, WriteOptions, Written};

/// Everything a conversion does besides choosing its files.
#[derive(Clone, Debug, Default)]
pub struct Conversion {
    /// What to keep and how to cast it (applied first; a cast comes after the LoRA merge).
    pub options: ConvertOptions,
    /// A LoRA adapter to merge into the selected weights (names as the base model's
    /// `state_dict`, so after `key` has stripped its prefix).
    pub lora: Option<Arc<Lora>>,
    /// Renames and reshapes (applied to the selection); `None` keeps the selection's names.
    pub rules: Option<RuleSet>,
    /// What the Rust model expects (see [`crate::remap::report::load_target`]); when given,
    /// the result must match it exactly, and presets also use it as evidence.
    pub target: Option<Vec<TargetTensor>>,
}

impl From<ConvertOptions> for Conversion {
    fn from(options: ConvertOptions) -> Self {
        Conversion {
            options,
            ..Conversion::default()
        }
    }
}

/// A conversion carried out up to the write: what will be written, and how it was decided.
pub struct Prepared<'a> {
    /// The tensors (renamed, reshaped, cast; data still lazy) and metadata to write.
    pub selection: Selection<'a>,
    /// The remapping plan, when rules were given.
    pub plan: Option<Plan>,
    /// The comparison with the target, when one was given.
    pub report: Option<MatchReport>,
}

impl Prepared<'_> {
    /// False when a target was given and the result does not match it exactly.
    pub fn matches_target(&self) -> bool {
        self.report.as_ref().is_none_or(MatchReport::all_matched)
    }

    /// Write the prepared tensors to `output` (in `format`), never over any of `inputs`.
    /// Refuses (writing nothing) when the result does not match the target.
    pub fn write(
        &self,
        output: &Path,
        format: OutputFormat,
        inputs: &[&Path],
        progress: Option<Progress<'_>>,
    ) -> Result<Written> {
        if let Some(r) = self.report.as_ref().filter(|r| !r.all_matched()) {
            return Err(Error::write(
                output,
                format!("the result does not match the target; nothing was written:\n{r}"),
            ));
        }
        write::write(
            output,
            format,
            &self.selection.tensors,
            WriteOptions {
                metadata: self.selection.metadata.clone(),
                inputs: inputs.iter().map(|p| p.to_path_buf()).collect(),
                progress,
            },
        )
    }
}

impl Conversion {
    /// Select, remap and check `ckpt`'s tensors; nothing is read but what the rules need to
    /// decide (shapes, module classes) and nothing is written.
    pub fn prepare<'a>(&self, ckpt: &'a Checkpoint) -> Result<Prepared<'a>> {
        let mut selection = match &self.lora {
            None => self.options.select(ckpt)?,
            Some(lora) => {
                // Merge in the source dtype, then cast, as PEFT merges before any cast.
                let uncast = ConvertOptions {
                    dtype: None,
                    ..self.options.clone()
                };
                let mut sel = uncast.select(ckpt)?;
                let merged = lora.merge(std::mem::take(&mut sel.tensors))?;
                sel.tensors = match self.options.dtype {
                    Some(to) => merged
                        .into_iter()
                        .map(|t| cast_out(t, to, ckpt.path()))
                        .collect(),
                    None => merged,
                };
                sel
            }
        };
        let ctx = Context {
            modules: ckpt.modules(),
            target: self.target.as_deref(),
        };
        let plan = match &self.rules {
            None => None,
            Some(rules) => {
                let (tensors, plan) =
                    apply_with(rules, std::mem::take(&mut selection.tensors), &ctx)?;
                selection.source_dtypes = tensors.iter().map(|t| t.dtype).collect();
                selection.tensors = tensors;
                Some(plan)
            }
        };
        let report = self.target.as_ref().map(|target| {
            let metas: Vec<TensorMeta> = selection.tensors.iter().map(TensorMeta::of).collect();
            report(&metas, target, &ctx)
        });
        Ok(Prepared {
            selection,
            plan,
            report,
        })
    }
}

/// The format `output`'s extension names, or an error saying which extensions work.
pub fn output_format(output: &Path) -> Result<OutputFormat> {
    OutputFormat::from_path(output).ok_or_else(|| {
        Error::write(
            output,
            "has an extension torchport cannot write; use .safetensors, .npz or .pt",
        )
    })
}

/// Open `input`, carry out `conv` and write the result to `output` in the format its
/// extension names (`.safetensors`, `.npz`, `.pt`). The input is never overwritten; when a
/// target is given and not matched, nothing is written.
pub fn convert(
    input: impl AsRef<Path>,
    output: impl AsRef<Path>,
    conv: &Conversion,
) -> Result<Written> {
    let (input, output) = (input.as_ref(), output.as_ref());
    let format = output_format(output)?;
    // Refuse before even opening (and mapping) the input.
    write::check_not_input(output, &[input])?;
    let ckpt = crate::open(input)?;
    let prepared = conv.prepare(&ckpt)?;
    prepared.write(output, format, &[input], None)
}
