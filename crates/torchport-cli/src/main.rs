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
        // A closed pipe (`torchport inspect big.pt | head`) is the reader's choice, not an error.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    use std::io::ErrorKind::BrokenPipe;
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == BrokenPipe)
            || c.downcast_ref::<serde_json::Error>()
                .is_some_and(|j| j.io_error_kind() == Some(BrokenPipe))
    })
}
