//! `torchport run MODEL --input X.npy [--input Y.npy ...] --output OUT.npz`: run an exported
//! program (`.pt2`) or a TorchScript archive (`torch.jit.save`) on `.npy` inputs (positional, in order) and write its outputs as
//! `output_0`, `output_1`, … to an `.npz`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use torchport::write::{write, OutputFormat, WriteOptions};
use torchport_runtime::candle_core::{DType, Tensor};
use torchport_runtime::dtype::ScalarType;
use torchport_runtime::npy::{out_tensor_as, read_arrays, read_npy};
use torchport_runtime::{Program, ScriptInput, ScriptProgram, Specialisation};

/// Arguments of `run`.
#[derive(clap::Args)]
pub struct Args {
    /// The exported program (`.pt2` written by `torch.export.save`) or TorchScript archive
    /// (`torch.jit.save`).
    model: PathBuf,
    /// An input array (`.npy`), once per user input, in the program's order. For a
    /// TorchScript archive an `.npz` is a list of tensors (`List[Tensor]`), its arrays in the
    /// order stored.
    #[arg(long = "input", value_name = "X.npy")]
    inputs: Vec<PathBuf>,
    /// Where to write the outputs (`.npz`, arrays `output_0`, `output_1`, …).
    #[arg(long, value_name = "OUT.npz")]
    output: PathBuf,
    /// Run this many times on the same inputs and write the last run's outputs; with more
    /// than one, the first run's time and the median of the others go to stderr. (A
    /// TorchScript archive's later runs of the same input sizes run as a graph recorded
    /// from the first: docs/RUNTIME.md; a single run is not recorded.)
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
}

/// Programs larger than this show a spinner while they load and run (when stderr is a
/// terminal; never into a pipe or a file).
const PROGRESS_MIN_BYTES: u64 = 32 << 20;

/// A spinner on stderr with the elapsed time, or `None` when stderr is not a terminal or the
/// model is small.
fn spinner(args: &Args) -> Option<ProgressBar> {
    let size = std::fs::metadata(&args.model).map_or(0, |m| m.len());
    if !std::io::stderr().is_terminal() || size < PROGRESS_MIN_BYTES {
        return None;
    }
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.set_message(format!(
        "loading {} ({})",
        args.model.display(),
        crate::table::human_bytes(size)
    ));
    bar.enable_steady_tick(Duration::from_millis(100));
    Some(bar)
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    // Freed intermediate buffers are recycled for later nodes instead of being returned to
    // the kernel and faulted in again (a one-shot process: keeping them costs nothing).
    torchport_runtime::retain_freed_memory();
    // Opt-in: each of the pool's threads bound to a CPU of its own (for a machine, or a
    // container's CPUs, that the process has to itself; docs/RUNTIME.md).
    if std::env::var_os("TORCHPORT_PIN_THREADS").is_some() {
        torchport_runtime::pin_pool_threads()?;
    }
    let bar = spinner(args);
    let result = load_and_run(args, bar.as_ref());
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    result
}

fn load_and_run(args: &Args, bar: Option<&ProgressBar>) -> anyhow::Result<ExitCode> {
    if ScriptProgram::is_torchscript(&args.model)? {
        return run_script(args, bar);
    }
    let program = Program::load(&args.model)?;
    if !program.unsupported_ops().is_empty() {
        anyhow::bail!(
            "{}: the program uses operators torchport cannot run yet: {} (see `torchport ops`)",
            args.model.display(),
            program.unsupported_ops().join(", ")
        );
    }
    let inputs = read_inputs(args, bar)?;
    let outputs = repeat(args, || program.run(&inputs))
        .map_err(|e| anyhow::anyhow!("running {}: {e}", args.model.display()))?;
    let dtypes = program.output_dtypes();
    write_outputs(args, &outputs, |i, _| dtypes.get(i).copied().flatten())
}

/// Run a TorchScript archive: its code is evaluated, so an unsupported operator is reported
/// where the run reaches it (file, record, line, operator; the error names the file).
fn run_script(args: &Args, bar: Option<&ProgressBar>) -> anyhow::Result<ExitCode> {
    let program = ScriptProgram::load(&args.model)?;
    let inputs = read_script_inputs(args, bar)?;
    // One run gains nothing from being recorded as a graph.
    let outputs = match args.runs {
        1 => program.interpret_inputs(&inputs)?,
        _ => repeat(args, || program.run_inputs(&inputs))?,
    };
    if args.runs > 1 {
        for (_, how) in program.specialisations() {
            match how {
                Specialisation::Graph { nodes } => {
                    eprintln!("runs after the first: a recorded graph of {nodes} nodes")
                }
                Specialisation::Interpreted(why) => eprintln!("every run interpreted: {why}"),
                Specialisation::Recorded => {}
            }
        }
    }
    // The code declares no output dtypes; the runtime holds bools, and only bools, as u8.
    write_outputs(args, &outputs, |_, t| {
        (t.dtype() == DType::U8).then_some(torchport_runtime::dtype::BOOL)
    })
}

/// `run` done `--runs` times; the last run's outputs. With more than one run, the first
/// run's time and the median of the others go to stderr.
fn repeat<T>(
    args: &Args,
    mut run: impl FnMut() -> torchport_runtime::Result<T>,
) -> torchport_runtime::Result<T> {
    let mut times = Vec::with_capacity(args.runs as usize);
    let mut last = None;
    for _ in 0..args.runs {
        let start = std::time::Instant::now();
        last = Some(run()?);
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    if times.len() > 1 {
        let first = times[0];
        let mut rest = times.split_off(1);
        rest.sort_by(f64::total_cmp);
        eprintln!(
            "{} runs: the first {first:.2} ms, the others' median {:.2} ms",
            args.runs,
            rest[rest.len() / 2]
        );
    }
    last.ok_or_else(|| torchport_runtime::Error::Program("no run".into()))
}

/// The `--input` arrays, in order.
fn read_inputs(args: &Args, bar: Option<&ProgressBar>) -> anyhow::Result<Vec<Tensor>> {
    let inputs = args
        .inputs
        .iter()
        .map(|p| read_npy(p).map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if let Some(b) = bar {
        b.set_message(format!("running {}", args.model.display()));
    }
    Ok(inputs)
}

/// The `--input` arguments of a TorchScript archive's `forward`: an `.npy` is a tensor, an
/// `.npz` a list of tensors (`List[Tensor]`), its arrays in the order stored.
fn read_script_inputs(args: &Args, bar: Option<&ProgressBar>) -> anyhow::Result<Vec<ScriptInput>> {
    let inputs = args
        .inputs
        .iter()
        .map(|p| {
            let npz = p.extension().is_some_and(|e| e.eq_ignore_ascii_case("npz"));
            match npz {
                true => read_arrays(p)
                    .map(|a| ScriptInput::Tensors(a.into_iter().map(|(_, t)| t).collect())),
                false => read_npy(p).map(ScriptInput::Tensor),
            }
            .map_err(anyhow::Error::msg)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    if let Some(b) = bar {
        b.set_message(format!("running {}", args.model.display()));
    }
    Ok(inputs)
}

/// Write the outputs as `output_0`, `output_1`, … into OUT.npz, each in the dtype `declared`
/// gives for it (index, tensor).
fn write_outputs(
    args: &Args,
    outputs: &[Tensor],
    declared: impl Fn(usize, &Tensor) -> Option<ScalarType>,
) -> anyhow::Result<ExitCode> {
    let arrays = outputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            out_tensor_as(format!("output_{i}"), t, declared(i, t)).map_err(anyhow::Error::msg)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut inputs = vec![args.model.clone()];
    inputs.extend(args.inputs.iter().cloned());
    write(
        &args.output,
        OutputFormat::Npz,
        &arrays,
        WriteOptions {
            inputs,
            ..WriteOptions::default()
        },
    )?;
    Ok(ExitCode::SUCCESS)
}
