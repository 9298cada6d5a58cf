//! Plain-text tables and the cell formats (shapes, byte sizes) of the commands' readable
//! output.

use std::io::Write;

/// Write `rows` under `header`, columns padded to their widest cell, two spaces apart;
/// columns whose `right` flag is set are right-aligned (numbers).
pub fn write_table<const N: usize>(
    out: &mut impl Write,
    header: [&str; N],
    rows: &[[String; N]],
    right: [bool; N],
) -> std::io::Result<()> {
    let mut width = header.map(|h| h.chars().count());
    for r in rows {
        for (w, cell) in width.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let head = header.map(String::from);
    for r in std::iter::once(&head).chain(rows) {
        let mut line = String::new();
        for (i, cell) in r.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let pad = " ".repeat(width[i].saturating_sub(cell.chars().count()));
            if right[i] {
                line.push_str(&pad);
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.push_str(&pad);
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

/// A shape as `[2, 3]`.
pub fn shape_text(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    format!("[{}]", dims.join(", "))
}

/// Bytes in a short human form (1024-based).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}
