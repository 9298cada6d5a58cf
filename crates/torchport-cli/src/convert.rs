//! `torchport convert IN OUT [--key K] [--include RE] [--exclude RE] [--dtype D]
//! [--dequantize] [--lora ADAPTER] [--preset P]... [--rules FILE] [--target T] [--dry-run]
//! [--clean]`: parse the arguments into a `torchport::convert::Conversion`, prepare it, then
//! print (warnings, plan, report, dry run) or write with a progress bar. The pipeline (select,
//! LoRA merge, cast, presets in the order given, the rule file, the target check, the write)
//! is the library's.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::anyhow;
use indicatif::{ProgressBar, ProgressStyle};
use regex::Regex;
use torchport::convert::{output_format, Conversion, Prepared};
use torchport::remap::report::load_target;
use torchport::remap::RuleSet;
use torchport::select::{ConvertOptions, CAST_TARGETS};
use torchport::write::{self, atomic, OutputFormat};
use torchport::{DType, Remedy};

use crate::table::{human_bytes, shape_text, write_table};

/// Inputs larger than this get a progress bar (when stderr is a terminal).
const PROGRESS_MIN_BYTES: u64 = 64 << 20;

/// Arguments of `convert`.
#[derive(clap::Args)]
pub struct Args {
    /// The file to read (any format torchport opens).
    input: PathBuf,
    /// The file to write; its extension picks the format: .safetensors, .npz or .pt.
    output: PathBuf,
    /// Keep only the tensors under this top-level key and strip its prefix
    /// (`--key state_dict` turns `state_dict.fc.weight` into `fc.weight`).
    #[arg(long, value_name = "K")]
    key: Option<String>,
    /// Keep only names this regex matches (anywhere in the name; after --key).
    #[arg(long, value_name = "RE")]
    include: Option<String>,
    /// Leave out names this regex matches (anywhere in the name; after --key).
    #[arg(long, value_name = "RE")]
    exclude: Option<String>,
    /// Cast floating-point tensors to this dtype (float16, bfloat16, float32, float64);
    /// integer, bool, complex and quantized tensors keep their dtype.
    #[arg(long, value_name = "D")]
    dtype: Option<String>,
    /// Write quantized tensors (qint8, quint8, qint32) as float32 equal to torch's
    /// dequantize() (then cast by --dtype, if given). Without it, .pt keeps them quantized and
    /// .safetensors / .npz store the integers plus NAME.scale, NAME.zero_point and, per
    /// channel, NAME.axis.
    #[arg(long)]
    dequantize: bool,
    /// Merge this PEFT LoRA adapter (a folder with adapter_config.json and
    /// adapter_model.safetensors or .bin) into the selected weights, as PEFT's
    /// merge_and_unload() does; before --dtype casts, and before presets and rules rename.
    #[arg(long, value_name = "ADAPTER")]
    lora: Option<PathBuf>,
    /// Apply a preset after selecting (strip-prefix, lstm-gates, gru-gates, attention-qkv,
    /// weight-norm, burn); repeatable, applied in the order given.
    #[arg(long = "preset", value_name = "P")]
    presets: Vec<String>,
    /// Apply the rules of this TOML file after the presets (see docs/RULES.md).
    #[arg(long, value_name = "FILE")]
    rules: Option<PathBuf>,
    /// Check the result against what the Rust model expects (a JSON list of names and
    /// shapes, or any file torchport opens) before writing; on any mismatch print the
    /// match report, write nothing and exit 1. Presets also use it as evidence.
    #[arg(long, value_name = "T")]
    target: Option<PathBuf>,
    /// Print what would be written (the remapping plan, then name, dtype -> dtype, shape,
    /// bytes) and write nothing.
    #[arg(long)]
    dry_run: bool,
    /// First remove the temporary files that killed writes left in OUT's folder
    /// (`.NAME.tmp-<pid>-<n>` of a process that is no longer running). Without it, those of
    /// OUT's own name are removed once the write succeeds.
    #[arg(long)]
    clean: bool,
}

fn regex(flag: &str, re: &Option<String>) -> anyhow::Result<Option<Regex>> {
    re.as_deref()
        .map(|r| Regex::new(r).map_err(|e| anyhow!("{flag} {r:?} is not a valid regex: {e}")))
        .transpose()
}

fn options(args: &Args) -> anyhow::Result<ConvertOptions> {
    let dtype = match &args.dtype {
        None => None,
        Some(d) => {
            let names: Vec<&str> = CAST_TARGETS.iter().map(|t| t.name()).collect();
            let dt = DType::from_name(d).filter(|t| CAST_TARGETS.contains(t));
            Some(dt.ok_or_else(|| {
                anyhow!(
                    "--dtype {d:?} is not a dtype convert casts to; use one of {}",
                    names.join(", ")
                )
            })?)
        }
    };
    Ok(ConvertOptions {
        key: args.key.clone(),
        include: regex("--include", &args.include)?,
        exclude: regex("--exclude", &args.exclude)?,
        dtype,
        dequantize: args.dequantize,
    })
}

/// The conversion the arguments ask for.
fn conversion(args: &Args) -> anyhow::Result<Conversion> {
    let rules = if args.presets.is_empty() && args.rules.is_none() {
        None
    } else {
        Some(RuleSet::from_presets_and_file(
            &args.presets,
            args.rules.as_deref(),
        )?)
    };
    Ok(Conversion {
        options: options(args)?,
        lora: args
            .lora
            .as_ref()
            .map(|p| torchport::lora::Lora::open(p).map(std::sync::Arc::new))
            .transpose()?,
        rules,
        target: args.target.as_ref().map(load_target).transpose()?,
    })
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let format = output_format(&args.output)?;
    let conv = conversion(args)?;
    // Refuse before opening (and memory-mapping) the input.
    write::check_not_input(&args.output, &[&args.input])?;
    leftovers(args);
    let ckpt = torchport::open(&args.input)?;
    let prepared = conv.prepare(&ckpt)?;
    warn(&prepared);
    if let Some(r) = prepared.report.as_ref().filter(|r| !r.all_matched()) {
        print!("{r}");
        eprintln!(
            "error: the result does not match {}; nothing was written",
            args.target
                .as_ref()
                .map_or_else(String::new, |t| t.display().to_string())
        );
        return Ok(ExitCode::from(1));
    }
    if args.dry_run {
        write::validate(&args.output, format, &prepared.selection.tensors).map_err(with_flags)?;
        if let Some(plan) = &prepared.plan {
            print!("{plan}");
            println!();
        }
        dry_run(&prepared, format, args)?;
        return Ok(ExitCode::SUCCESS);
    }
    let total = prepared.selection.total_bytes();
    let bar = (std::io::stderr().is_terminal() && total > PROGRESS_MIN_BYTES).then(|| {
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template(
                "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    });
    let mut tick = |name: &str, n: u64| {
        if let Some(b) = &bar {
            b.inc(n);
            b.set_message(name.to_string());
        }
    };
    let start = Instant::now();
    let written = prepared.write(&args.output, format, &[&args.input], Some(&mut tick));
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let written = written.map_err(with_flags)?;
    if !written.removed_stale.is_empty() {
        eprintln!(
            "note: removed {} left over from an earlier write to {} that was killed",
            names(&written.removed_stale),
            args.output.display()
        );
    }
    eprintln!(
        "wrote {} tensors ({}) to {} in {:.2} s",
        written.tensors,
        human_bytes(written.file_bytes),
        args.output.display(),
        start.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

/// The warnings of a prepared conversion: tensors without data, tensors presets left alone.
fn warn(prepared: &Prepared<'_>) {
    for (name, why) in &prepared.selection.without_data {
        eprintln!("warning: leaving out {name}: it is {why}");
    }
    if let Some(plan) = &prepared.plan {
        for u in &plan.undecided {
            eprintln!(
                "warning: {} left unchanged by preset {}: {}",
                u.name, u.preset, u.why
            );
        }
        for w in &plan.warnings {
            eprintln!("warning: {w}");
        }
    }
}

/// The library's error; for a tensor that cannot be written, followed by the flags of
/// `convert` that carry out the remedy the library names.
fn with_flags(e: torchport::Error) -> anyhow::Error {
    let flags = match &e {
        torchport::Error::Unwritable { remedy, .. } => match remedy {
            Remedy::CastOrLeaveOut => "--dtype float32 casts it, --exclude RE leaves it out",
            Remedy::LeaveOut => "--exclude RE leaves it out",
            _ => return e.into(),
        },
        _ => return e.into(),
    };
    anyhow!("{e} ({flags})")
}

/// Say which temporary files of killed writes lie in OUT's folder; with --clean (and not
/// --dry-run) remove them.
fn leftovers(args: &Args) {
    let dir = match args.output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    if args.clean {
        let stale = atomic::stale_temp_files_in(dir);
        if args.dry_run {
            if !stale.is_empty() {
                eprintln!("note: --clean would remove {}", names(&stale));
            }
            return;
        }
        let removed = atomic::remove_stale(stale);
        if !removed.is_empty() {
            eprintln!(
                "note: removed {}, left by writes that were killed",
                names(&removed)
            );
        }
        return;
    }
    let stale = atomic::stale_temp_files(&args.output);
    if !stale.is_empty() {
        eprintln!(
            "note: {} left over from an earlier write to {} that was killed; {} removed once \
             this write succeeds, or now with --clean",
            names(&stale),
            args.output.display(),
            if stale.len() == 1 {
                "it is"
            } else {
                "they are"
            }
        );
    }
}

/// `N temporary file(s) (a, b, …)` for a note.
fn names(paths: &[PathBuf]) -> String {
    let list: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    let what = if paths.len() == 1 {
        "1 temporary file".to_string()
    } else {
        format!("{} temporary files", paths.len())
    };
    format!("{what} ({})", list.join(", "))
}

fn dry_run(prepared: &Prepared<'_>, format: OutputFormat, args: &Args) -> anyhow::Result<()> {
    let sel = &prepared.selection;
    let mut out = std::io::stdout().lock();
    // What the format stores: quantized tensors split into integers and parameters for
    // safetensors and npz.
    let stored = write::stored_tensors(&args.output, format, &sel.tensors)?;
    let sources: std::collections::HashMap<&str, DType> = sel
        .tensors
        .iter()
        .zip(&sel.source_dtypes)
        .map(|(t, d)| (t.name.as_str(), *d))
        .collect();
    let rows: Vec<[String; 4]> = stored
        .iter()
        .map(|t| {
            let from = sources.get(t.name.as_str()).unwrap_or(&t.dtype);
            let dtype = if *from == t.dtype {
                t.dtype.to_string()
            } else {
                format!("{from} -> {}", t.dtype)
            };
            [
                t.name.clone(),
                dtype,
                shape_text(&t.shape),
                t.nbytes().to_string(),
            ]
        })
        .collect();
    write_table(
        &mut out,
        ["name", "dtype", "shape", "bytes"],
        &rows,
        [false, false, false, true],
    )?;
    let total: u64 = stored.iter().map(|t| t.nbytes() as u64).sum();
    writeln!(
        out,
        "\n{} tensors, {} ({total} bytes) of data would be written to {} ({format})",
        stored.len(),
        human_bytes(total),
        args.output.display()
    )?;
    if format == OutputFormat::Safetensors {
        let keys: Vec<&str> = sel.metadata.iter().map(|(k, _)| k.as_str()).collect();
        writeln!(out, "metadata: {}", keys.join(", "))?;
    }
    writeln!(out, "dry run: nothing was written")?;
    Ok(())
}
