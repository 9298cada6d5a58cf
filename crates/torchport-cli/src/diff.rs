//! `torchport diff A B [--atol X] [--rtol Y] [--json]`: compare two files tensor by tensor
//! with `torchport::diff`. Exit 0 when every shared tensor is close and no name is missing
//! on either side, 1 otherwise, 2 on error.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use torchport::diff::{diff, Diff, DiffOptions, TensorDiff};

use crate::table::{shape_text, write_table};

/// Arguments of `diff`.
#[derive(clap::Args)]
pub struct Args {
    /// The first file (any format torchport opens).
    a: PathBuf,
    /// The second file; relative errors are taken against its values.
    b: PathBuf,
    /// Absolute tolerance: elements are close when |a - b| <= atol + rtol * |b|.
    #[arg(long, value_name = "X", default_value_t = DiffOptions::default().atol)]
    atol: f64,
    /// Relative tolerance (see --atol). NaN equals NaN.
    #[arg(long, value_name = "Y", default_value_t = DiffOptions::default().rtol)]
    rtol: f64,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    for (flag, v) in [("--atol", args.atol), ("--rtol", args.rtol)] {
        if !(v.is_finite() && v >= 0.0) {
            bail!("{flag} must be a finite number >= 0, not {v}");
        }
    }
    let a = torchport::open(&args.a)?;
    let b = torchport::open(&args.b)?;
    let opts = DiffOptions {
        atol: args.atol,
        rtol: args.rtol,
    };
    let d = diff(&a, &b, &opts)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        let mut j = d.to_json();
        j["a"] = args.a.display().to_string().into();
        j["b"] = args.b.display().to_string().into();
        serde_json::to_writer_pretty(&mut out, &j)?;
        writeln!(out)?;
    } else {
        report(&mut out, &d, args)?;
    }
    Ok(if d.is_close() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn err_text(x: Option<f64>) -> String {
    match x {
        None => "-".into(),
        Some(0.0) => "0".into(),
        Some(v) if v.is_infinite() => "inf".into(),
        Some(v) => format!("{v:.3e}"),
    }
}

fn dtype_text(t: &TensorDiff) -> String {
    if t.dtype_a == t.dtype_b {
        t.dtype_a.to_string()
    } else {
        format!("{} / {}", t.dtype_a, t.dtype_b)
    }
}

fn shape_cell(t: &TensorDiff) -> String {
    if t.shape_a == t.shape_b {
        shape_text(&t.shape_a)
    } else {
        format!("{} / {}", shape_text(&t.shape_a), shape_text(&t.shape_b))
    }
}

fn report(out: &mut impl Write, d: &Diff, args: &Args) -> std::io::Result<()> {
    writeln!(out, "A: {}", args.a.display())?;
    writeln!(out, "B: {}", args.b.display())?;
    // Rows for every tensor that is not close or whose dtype differs.
    let rows: Vec<[String; 7]> = d
        .tensors
        .iter()
        .filter(|t| !t.close || t.dtype_a != t.dtype_b)
        .map(|t| {
            [
                t.name.clone(),
                dtype_text(t),
                shape_cell(t),
                err_text(t.max_abs),
                err_text(t.max_rel),
                format!("{}/{}", t.mismatched, t.numel),
                match (&t.note, t.close) {
                    (Some(n), true) => format!("close; {n}"),
                    (Some(n), false) => format!("DIFFERENT; {n}"),
                    (None, true) => "close".into(),
                    (None, false) => "DIFFERENT".into(),
                },
            ]
        })
        .collect();
    if !rows.is_empty() {
        writeln!(out)?;
        write_table(
            out,
            [
                "name",
                "dtype",
                "shape",
                "max abs",
                "max rel",
                "not close",
                "",
            ],
            &rows,
            [false, false, false, true, true, true, false],
        )?;
    }
    for (label, names) in [("only in A", &d.only_a), ("only in B", &d.only_b)] {
        if !names.is_empty() {
            writeln!(out, "\n{label} ({}):", names.len())?;
            for n in names {
                writeln!(out, "  {n}")?;
            }
        }
    }
    let differ = d.tensors.iter().filter(|t| !t.close).count();
    let max = |f: fn(&TensorDiff) -> Option<f64>| {
        d.tensors
            .iter()
            .filter_map(f)
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
    };
    writeln!(
        out,
        "\n{} shared tensors, {} not close (max abs error {}, max rel error {}); {} only in A, {} only in B; atol {:e}, rtol {:e}",
        d.tensors.len(),
        differ,
        err_text(max(|t| t.max_abs)),
        err_text(max(|t| t.max_rel)),
        d.only_a.len(),
        d.only_b.len(),
        d.options.atol,
        d.options.rtol
    )?;
    writeln!(
        out,
        "{}",
        if d.is_close() {
            "result: close"
        } else {
            "result: DIFFERENT"
        }
    )
}
