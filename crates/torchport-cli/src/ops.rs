//! `torchport ops MODEL [--json]`: every operator an exported program uses, how often, and
//! whether the runtime supports it. Exit 1 when any is unsupported ("answered no").

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::json;
use torchport_runtime::Program;

/// Arguments of `ops`.
#[derive(clap::Args)]
pub struct Args {
    /// The exported program (`.pt2` written by `torch.export.save`).
    model: PathBuf,
    /// Print JSON: {"ops": [{"op", "count", "supported"}], "unsupported": [...]}.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let program = Program::load(&args.model)?;
    let ops = program.ops();
    let mut out = std::io::stdout().lock();
    if args.json {
        let v = json!({
            "ops": ops.iter().map(|o| json!({"op": o.op, "count": o.count, "supported": o.supported})).collect::<Vec<_>>(),
            "unsupported": program.unsupported_ops(),
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
        let n = program.unsupported_ops().len();
        let nodes: usize = ops.iter().map(|o| o.count).sum();
        writeln!(
            out,
            "{} ops, {nodes} nodes; {}",
            ops.len(),
            if n == 0 {
                "all supported".to_string()
            } else {
                format!("{n} unsupported")
            }
        )?;
    }
    Ok(if program.unsupported_ops().is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
