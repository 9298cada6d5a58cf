//! `torchport inspect FILE [--json] [--security]`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::json;
use torchport::security::{allow_list, classify, SecurityReport};
use torchport::{Checkpoint, Quant, TensorData, TensorInfo};

use crate::table::{human_bytes, shape_text};

/// Arguments of `inspect`.
#[derive(clap::Args)]
pub struct Args {
    /// The file to inspect (format detected from its content).
    file: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Add a security section: every global the file's pickles reference, classified
    /// known-safe (on the allow-list) / unlisted (unsafe for torch.load) / dangerous
    /// (refused). A refused file is still reported (exit 2).
    #[arg(long)]
    security: bool,
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    if args.security {
        return run_security(args);
    }
    let ckpt = torchport::open(&args.file)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &to_json(&ckpt))?;
        writeln!(out)?;
    } else {
        write_table(&mut out, &ckpt)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `inspect --security`: scan first (this never fails on a dangerous global), then open.
/// When the file cannot be opened — refused, or corrupt past its pickles — the report is
/// still printed, and the error goes to stderr with exit code 2.
fn run_security(args: &Args) -> anyhow::Result<ExitCode> {
    let report = torchport::security::scan(&args.file)?;
    let opened = torchport::open(&args.file);
    let mut out = std::io::stdout().lock();
    match &opened {
        Ok(ckpt) if args.json => {
            let mut v = to_json(ckpt);
            v["security"] = security_json(&report);
            serde_json::to_writer_pretty(&mut out, &v)?;
            writeln!(out)?;
        }
        Ok(ckpt) => {
            write_table(&mut out, ckpt)?;
            writeln!(out)?;
            write_security(&mut out, &report)?;
        }
        Err(_) if args.json => {
            let v = json!({
                "file": args.file.display().to_string(),
                "format": report.format.name(),
                "security": security_json(&report),
            });
            serde_json::to_writer_pretty(&mut out, &v)?;
            writeln!(out)?;
        }
        Err(_) => {
            writeln!(out, "file:    {}", args.file.display())?;
            writeln!(out, "format:  {}", report.format)?;
            writeln!(out)?;
            write_security(&mut out, &report)?;
        }
    }
    drop(out);
    opened?;
    Ok(ExitCode::SUCCESS)
}

fn write_security(out: &mut impl Write, r: &SecurityReport) -> std::io::Result<()> {
    let dangerous = r.dangerous().count();
    let unlisted = r.unlisted().count();
    let verdict = if r.is_refused() {
        format!("REFUSED: {dangerous} dangerous global(s); torchport will not load this file")
    } else if r.is_unsafe_for_torch_load() {
        format!(
            "UNSAFE FOR torch.load: {unlisted} global(s) on no allow-list, which torch.load \
             would import and call; torchport reads the file without importing them"
        )
    } else if r.is_incomplete() {
        "INCOMPLETE: every global seen is on the allow-list, but part of the file could not \
         be scanned"
            .to_string()
    } else {
        "ok: every global is on the allow-list".to_string()
    };
    writeln!(out, "security: {verdict}")?;
    writeln!(
        out,
        "  {} pickle(s) scanned, {} global(s) referenced",
        r.pickles,
        r.globals.len()
    )?;
    for g in &r.globals {
        writeln!(out, "  {}.{}  [{}]", g.module, g.name, g.class.name())?;
    }
    for p in &r.problems {
        writeln!(out, "  not scanned past: {p}")?;
    }
    Ok(())
}

/// One global as JSON: `module`, `name`, `class`, and for a known-safe one the allow-list
/// it is on (`allow_list`: `torch-weights-only` or `torchport-data`).
fn global_json(module: &str, name: &str) -> serde_json::Value {
    let mut g = json!({"module": module, "name": name, "class": classify(module, name).name()});
    if let Some(list) = allow_list(module, name) {
        g["allow_list"] = json!(list.name());
    }
    g
}

fn security_json(r: &SecurityReport) -> serde_json::Value {
    let globals: Vec<_> = r
        .globals
        .iter()
        .map(|g| global_json(&g.module, &g.name))
        .collect();
    json!({
        "globals": globals,
        "verdict": r.verdict(),
        "pickles": r.pickles,
        "problems": r.problems,
    })
}

/// A note for tensors that are not plain strided data.
fn note(t: &TensorInfo) -> String {
    let mut notes = Vec::new();
    match &t.data {
        TensorData::Strided { .. } if !t.is_contiguous() => notes.push("strided view".to_string()),
        TensorData::Strided { .. } => {}
        TensorData::Meta => notes.push("meta, no data".to_string()),
        TensorData::Unsupported { what } => notes.push(format!("{what}, data not readable")),
    }
    match &t.quant {
        Some(Quant::PerTensor { scale, zero_point }) => {
            notes.push(format!("scale {scale}, zero point {zero_point}"))
        }
        Some(Quant::PerChannel { axis, .. }) => notes.push(format!("per-channel on axis {axis}")),
        None => {}
    }
    notes.join("; ")
}

/// One aligned row per tensor: name, dtype, shape, size, notes (with a header row).
/// `tied[i]`: the tensor whose storage and view tensor `i` repeats (see `Checkpoint::tied`).
fn write_tensor_rows(
    out: &mut impl Write,
    tensors: &[TensorInfo],
    tied: &[Option<usize>],
) -> std::io::Result<()> {
    let rows: Vec<[String; 5]> = tensors
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let mut notes = note(t);
            if let Some(to) = tied.get(i).copied().flatten().and_then(|j| tensors.get(j)) {
                let tie = format!("tied to {}", to.name);
                notes = if notes.is_empty() {
                    tie
                } else {
                    format!("{tie}; {notes}")
                };
            }
            [
                t.name.clone(),
                t.dtype.to_string(),
                shape_text(&t.shape),
                human_bytes(t.nbytes() as u64),
                notes,
            ]
        })
        .collect();
    let header = ["name", "dtype", "shape", "size", ""];
    let mut w = header.map(str::len);
    for r in &rows {
        for (i, cell) in r.iter().enumerate() {
            w[i] = w[i].max(cell.chars().count());
        }
    }
    for r in std::iter::once(header.map(String::from)).chain(rows) {
        let line = format!(
            "{:<w0$}  {:<w1$}  {:<w2$}  {:>w3$}  {}",
            r[0],
            r[1],
            r[2],
            r[3],
            r[4],
            w0 = w[0],
            w1 = w[1],
            w2 = w[2],
            w3 = w[3]
        );
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

fn write_table(out: &mut impl Write, c: &Checkpoint) -> std::io::Result<()> {
    writeln!(out, "file:    {}", c.path().display())?;
    writeln!(
        out,
        "format:  {} ({}-endian data)",
        c.format(),
        c.byte_order().name()
    )?;
    writeln!(
        out,
        "totals:  {} tensors, {} parameters, {} ({} bytes), {} storages",
        c.tensors().len(),
        c.parameter_count(),
        human_bytes(c.total_bytes()),
        c.total_bytes(),
        c.storage_count()
    )?;
    if !c.tensors().is_empty() {
        writeln!(out)?;
        write_tensor_rows(out, c.tensors(), &c.tied())?;
    }
    if !c.constants().is_empty() {
        writeln!(
            out,
            "\nconstants ({}, not in the state_dict):",
            c.constants().len()
        )?;
        write_tensor_rows(out, c.constants(), &[])?;
    }
    if !c.modules().is_empty() {
        writeln!(out, "\nmodules ({}):", c.modules().len())?;
        for (path, class) in c.modules() {
            let path = if path.is_empty() { "(root)" } else { path };
            writeln!(out, "  {path}  {class}")?;
        }
    }
    if !c.graph_ops().is_empty() {
        let calls: usize = c.graph_ops().iter().map(|(_, n)| n).sum();
        writeln!(
            out,
            "\ngraph ops ({} distinct, {calls} calls):",
            c.graph_ops().len()
        )?;
        let w = c
            .graph_ops()
            .iter()
            .map(|(t, _)| t.len())
            .max()
            .unwrap_or(0);
        for (target, n) in c.graph_ops() {
            writeln!(out, "  {target:<w$}  {n}")?;
        }
    }
    if !c.values().is_empty() {
        writeln!(out, "\nvalues ({}):", c.values().len())?;
        for (name, v) in c.values() {
            let name = if name.is_empty() { "(root)" } else { name };
            writeln!(out, "  {name} = {v}")?;
        }
    }
    writeln!(out, "\nglobals ({}):", c.globals().len())?;
    for (m, n) in c.globals() {
        writeln!(out, "  {m}.{n}  [{}]", classify(m, n).name())?;
    }
    Ok(())
}

fn to_json(c: &Checkpoint) -> serde_json::Value {
    let mut v = json!({
        "file": c.path().display().to_string(),
        "format": c.format().name(),
        "byte_order": c.byte_order().name(),
        "tensors": tensors_json(c.tensors(), &c.tied()),
        "totals": {"tensors": c.tensors().len(), "parameters": c.parameter_count(), "bytes": c.total_bytes(), "storages": c.storage_count()},
        "values": values_json(c),
        "modules": c.modules().iter().map(|(p, cls)| json!({"path": p, "class": cls})).collect::<Vec<_>>(),
        "graph_ops": c.graph_ops().iter().map(|(t, n)| (t.clone(), json!(n))).collect::<serde_json::Map<_, _>>(),
        "globals": c.globals().iter().map(|(m, n)| global_json(m, n)).collect::<Vec<_>>(),
    });
    if !c.constants().is_empty() {
        v["constants"] = tensors_json(c.constants(), &[]);
    }
    v
}

fn values_json(c: &Checkpoint) -> serde_json::Map<String, serde_json::Value> {
    c.values()
        .iter()
        .map(|(k, v)| (k.clone(), v.to_json()))
        .collect()
}

fn tensors_json(tensors: &[TensorInfo], tied: &[Option<usize>]) -> serde_json::Value {
    let json: Vec<_> = tensors
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let mut o = json!({
                "name": t.name,
                "dtype": t.dtype.name(),
                "shape": t.shape,
                "nbytes": t.nbytes(),
                "strides": t.strides,
                "offset": t.offset,
            });
            match &t.data {
                TensorData::Strided { storage } => o["storage"] = json!(storage),
                TensorData::Meta => o["layout"] = json!("meta"),
                TensorData::Unsupported { what } => o["unsupported"] = json!(what),
            }
            match &t.quant {
                Some(q @ Quant::PerTensor { scale, zero_point }) => {
                    o["quant"] = json!({"scheme": q.scheme(), "scale": scale, "zero_point": zero_point})
                }
                Some(q @ Quant::PerChannel { scales, zero_points, axis, .. }) => {
                    o["quant"] = json!({"scheme": q.scheme(), "scales": scales, "zero_points": zero_points, "axis": axis})
                }
                None => {}
            }
            if let Some(to) = tied.get(i).copied().flatten().and_then(|j| tensors.get(j)) {
                o["tied_to"] = json!(to.name);
            }
            o
        })
        .collect();
    json!(json)
}
