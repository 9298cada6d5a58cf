//! The `torchport` command: a thin layer over the torchport library.
//! Exit codes: 0 success, 1 "answered no", 2 error (one sentence on stderr).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod convert;
mod diff;
mod inspect;
mod table;

/// Read PyTorch files in pure Rust: inspect, convert and compare checkpoints.
#[derive(Parser)]
#[command(name = "torchport", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show a file's format, tensors (name, dtype, shape, size), totals, non-tensor values
    /// and the globals its pickles reference.
    Inspect(inspect::Args),
    /// Convert a checkpoint to safetensors, npz or a torch.save .pt file (format from OUT's
    /// extension), optionally selecting (--key, --include, --exclude) and casting (--dtype).
    Convert(convert::Args),
    /// Compare two files tensor by tensor; exit 0 when all shared tensors are close and no
    /// name is missing, 1 when they differ, 2 on error.
    Diff(diff::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(&args),
        Command::Convert(args) => convert::run(&args),
        Command::Diff(args) => diff::run(&args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
