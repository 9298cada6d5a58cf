//! The `torchport` command: a thin layer over the torchport library.
//! Exit codes: 0 success, 1 "answered no", 2 error (one sentence on stderr).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod inspect;
mod match_cmd;

/// Read PyTorch files in pure Rust: inspect what a checkpoint holds.
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
    /// Compare a checkpoint (after presets and rules) with what a Rust model expects:
    /// matched, missing, unused and mismatched tensors, with suggested rules.
    /// Exit 0 when all match, 1 when not, 2 on error.
    Match(match_cmd::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(&args),
        Command::Match(args) => match_cmd::run(&args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
