//! `torchport match CKPT --target T [--rules R] [--preset P]... [--json]`: apply the presets
//! (in the order given), then the rule file, and compare the result with the target.
//! Exit 0 when everything matches, 1 when something does not, 2 on error.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::json;
use torchport::remap::report::{load_target, report};
use torchport::remap::{plan, Context, RuleSet, TensorMeta};

/// Arguments of `match`.
#[derive(clap::Args)]
pub struct Args {
    /// The checkpoint (any file torchport opens).
    ckpt: PathBuf,
    /// What the Rust model expects: a JSON list [{"name", "shape", "dtype"?}], `torchport
    /// inspect --json` output, or any file torchport opens.
    #[arg(long)]
    target: PathBuf,
    /// A rule file (TOML), applied after the presets.
    #[arg(long)]
    rules: Option<PathBuf>,
    /// A preset (strip-prefix, lstm-gates, gru-gates, attention-qkv, burn, weight-norm);
    /// repeatable, applied in the order given.
    #[arg(long = "preset")]
    presets: Vec<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let ckpt = torchport::open(&args.ckpt)?;
    let target = load_target(&args.target)?;
    let rules = RuleSet::from_presets_and_file(&args.presets, args.rules.as_deref())?;
    let ctx = Context {
        modules: ckpt.modules(),
        target: Some(&target),
    };
    let sources: Vec<TensorMeta> = ckpt
        .tensors()
        .iter()
        .map(|t| TensorMeta {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
        })
        .collect();
    let (have, plan) = plan(&rules, &sources, &ctx)?;
    let r = report(&have, &target, &ctx);
    let mut out = std::io::stdout().lock();
    if args.json {
        let doc = json!({
            "all_matched": r.all_matched(),
            "report": r,
            "undecided": plan.undecided,
            "dropped": plan.dropped,
            "warnings": plan.warnings,
        });
        serde_json::to_writer_pretty(&mut out, &doc)?;
        writeln!(out)?;
    } else {
        write!(out, "{r}")?;
        if !plan.undecided.is_empty() {
            writeln!(out, "undecided by presets (left unchanged):")?;
            for u in &plan.undecided {
                writeln!(out, "  {} (preset {}): {}", u.name, u.preset, u.why)?;
            }
        }
        for w in &plan.warnings {
            writeln!(out, "warning: {w}")?;
        }
        if r.all_matched() {
            writeln!(out, "all {} target tensors matched", r.matched.len())?;
        }
    }
    Ok(if r.all_matched() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
