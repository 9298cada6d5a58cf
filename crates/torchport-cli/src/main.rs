//! The `torchport` command: a thin layer over the torchport library.
//! Exit codes: 0 success, 1 "answered no", 2 error (one sentence on stderr).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod inspect;

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(&args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
