//! `torchport ops MODEL [--json]`: every operator an exported program (or a TorchScript
//! archive's code) uses, how often, and whether the runtime supports it. Exit 1 when any is unsupported ("answered no").

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::json;
use torchport_runtime::{Program, ScriptProgram};

/// Arguments of `ops`.
#[derive(clap::Args)]
pub struct Args {
    /// The exported program (`.pt2` written by `torch.export.save`) or TorchScript archive
    /// (`torch.jit.save`).
    model: PathBuf,
    /// Print JSON: {"ops": [{"op", "count", "supported"}], "unsupported": [...]}.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    // Only the program JSON is read: weights are never decoded to count operators.
    // A TorchScript archive lists the operators its code calls, all of it (code a given run
    // never reaches included).
    let ops = if ScriptProgram::is_torchscript(&args.model)? {
        ScriptProgram::ops_of(&args.model)?
    } else {
        Program::ops_of(&args.model)?
    };
    let unsupported: Vec<&str> = ops
        .iter()
        .filter(|o| !o.supported)
        .map(|o| o.op.as_str())
        .collect();
    let mut out = std::io::stdout().lock();
    if args.json {
        let v = json!({
            "ops": ops.iter().map(|o| json!({"op": o.op, "count": o.count, "supported": o.supported})).collect::<Vec<_>>(),
            "unsupported": unsupported,
        });
        serde_json::to_writer_pretty(&mut out, &v)?;
        writeln!(out)?;
    } else {
        let width = ops.iter().map(|o| o.op.len()).max().unwrap_or(2).max(2);
        writeln!(out, "{:<width$}  {:>5}  supported", "op", "count")?;
        for o in &ops {
            let s = if o.supported { "yes" } else { "no" };
            writeln!(out, "{:<width$}  {:>5}  {s}", o.op, o.count)?;
        }
        let n = unsupported.len();
        let nodes: usize = ops.iter().map(|o| o.count).sum();
        writeln!(
            out,
            "{} ops, {nodes} uses; {}",
            ops.len(),
            if n == 0 {
                "all supported".to_string()
            } else {
                format!("{n} unsupported")
            }
        )?;
    }
    Ok(if unsupported.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
