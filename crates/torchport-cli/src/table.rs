//! Plain-text tables for the commands' readable output.

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
