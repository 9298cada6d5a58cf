//! The `torchport` command: a thin layer over the torchport library.
//! Exit codes: 0 success, 1 "answered no", 2 error (one sentence on stderr), 130 interrupted
//! (Ctrl-C; an unfinished output is removed).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod convert;
mod diff;
mod inspect;
mod match_cmd;
mod ops;
mod run;
mod table;

/// Read PyTorch files in pure Rust: inspect, convert, compare and adapt checkpoints, and run
/// exported programs.
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
    /// Compare a checkpoint (after presets and rules) with what a Rust model expects:
    /// matched, missing, unused and mismatched tensors, with suggested rules.
    /// Exit 0 when all match, 1 when not, 2 on error.
    Match(match_cmd::Args),
    /// Run an exported program (.pt2 from torch.export.save) on .npy inputs; write an .npz.
    Run(run::Args),
    /// List every operator an exported program uses and whether `run` supports it
    /// (exit 1 if any is unsupported).
    Ops(ops::Args),
}

fn main() -> ExitCode {
    // Before any thread starts: candle's elementwise ops run on the calling thread rather
    // than on a pool of candle's own, whose spinning workers took CPUs from the runtime's
    // threads (docs/RUNTIME.md).
    torchport_runtime::candle_pool_without_workers();
    let cli = Cli::parse();
    on_interrupt_remove_unfinished_outputs();
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(&args),
        Command::Convert(args) => convert::run(&args),
        Command::Diff(args) => diff::run(&args),
        Command::Match(args) => match_cmd::run(&args),
        Command::Run(args) => run::run(&args),
        Command::Ops(args) => ops::run(&args),
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

/// On Ctrl-C (SIGINT; and SIGTERM, SIGHUP) remove the temporary file of any output being
/// written, then exit 130. Where outputs are written unnamed (Linux `O_TMPFILE`) there is
/// nothing to remove: the kernel frees them with the process. The handler runs on its own
/// thread (the `ctrlc` crate), so it may take locks and remove files.
fn on_interrupt_remove_unfinished_outputs() {
    let installed = ctrlc::set_handler(|| {
        let removed = torchport::write::atomic::remove_pending();
        if removed.is_empty() {
            eprintln!("interrupted");
        } else {
            eprintln!("interrupted; removed the unfinished output");
        }
        std::process::exit(130);
    });
    // Without the handler an interrupt still ends the process; only a named temporary file
    // (filesystems without O_TMPFILE) would then be left for the next run to clean up.
    drop(installed);
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
