//! TEMPORARY (replace at merge with torchport's npy/npz reader and writer from branches
//! readers-a and writers): a minimal `.npy` reader and `.npz` writer for little-endian C-order
//! arrays of f32, f16, f64, i64, i32, u8 and bool, enough for `torchport run` and the tests.

use std::io::Write;
use std::path::Path;

use candle_core::{DType, Device, Tensor};

/// Largest header accepted.
const MAX_HEADER: usize = 1 << 16;

/// Read a `.npy` file into a tensor (bool arrays become u8 0/1).
pub fn read_npy(path: &Path) -> Result<Tensor, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    parse_npy(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// Parse `.npy` bytes.
pub fn parse_npy(b: &[u8]) -> Result<Tensor, String> {
    if b.len() < 10 || &b[..6] != b"\x93NUMPY" {
        return Err("not a .npy file (bad magic)".into());
    }
    let (hlen, start) = match b[6] {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10),
        2 | 3 if b.len() >= 12 => (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12),
        v => return Err(format!(".npy version {v} is not supported")),
    };
    if hlen > MAX_HEADER || start + hlen > b.len() {
        return Err("the .npy header is truncated or too long".into());
    }
    let header = std::str::from_utf8(&b[start..start + hlen]).map_err(|_| "the .npy header is not text")?;
    let field = |key: &str| -> Result<&str, String> {
        let at = header
            .find(&format!("'{key}':"))
            .ok_or_else(|| format!("the .npy header has no '{key}'"))?;
        Ok(header[at + key.len() + 3..].trim_start())
    };
    let descr = field("descr")?;
    let descr = descr
        .strip_prefix('\'')
        .and_then(|s| s.split('\'').next())
        .ok_or("bad descr in the .npy header")?;
    if field("fortran_order")?.starts_with("True") {
        return Err("Fortran-order arrays are not supported".into());
    }
    let shape_txt = field("shape")?;
    let shape_txt = shape_txt
        .strip_prefix('(')
        .and_then(|s| s.split(')').next())
        .ok_or("bad shape in the .npy header")?;
    let shape = shape_txt
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| format!("bad dim '{s}' in the .npy shape")))
        .collect::<Result<Vec<_>, _>>()?;
    let data = &b[start + hlen..];
    let n = shape
        .iter()
        .try_fold(1usize, |a, &s| a.checked_mul(s))
        .ok_or("the .npy shape is too large")?;
    let (dt, size) = match descr {
        "<f4" => (DType::F32, 4),
        "<f2" => (DType::F16, 2),
        "<f8" => (DType::F64, 8),
        "<i8" => (DType::I64, 8),
        "<i4" => (DType::I32, 4),
        "|u1" => (DType::U8, 1),
        "|b1" => (DType::U8, 1),
        d => return Err(format!("dtype '{d}' is not supported (f32, f16, f64, i64, i32, u8, bool)")),
    };
    let need = n.checked_mul(size).ok_or("the .npy shape is too large")?;
    if data.len() != need {
        return Err(format!("the .npy data has {} bytes, the header says {need}", data.len()));
    }
    let t = Tensor::from_raw_buffer(data, dt, &shape, &Device::Cpu).map_err(|e| e.to_string())?;
    if descr == "|b1" {
        return t.ne(&t.zeros_like().map_err(|e| e.to_string())?).map_err(|e| e.to_string());
    }
    Ok(t)
}

/// `.npy` bytes of a tensor; u8 tensors flagged `bool` are written as numpy bool.
pub fn npy_bytes(t: &Tensor, bool_: bool) -> Result<Vec<u8>, String> {
    let e = |e: candle_core::Error| e.to_string();
    let t = t.contiguous().map_err(e)?;
    let flat = t.flatten_all().map_err(e)?;
    let (descr, data): (&str, Vec<u8>) = match t.dtype() {
        DType::F32 => ("<f4", flat.to_vec1::<f32>().map_err(e)?.iter().flat_map(|v| v.to_le_bytes()).collect()),
        DType::F64 => ("<f8", flat.to_vec1::<f64>().map_err(e)?.iter().flat_map(|v| v.to_le_bytes()).collect()),
        DType::F16 => ("<f2", flat.to_vec1::<half::f16>().map_err(e)?.iter().flat_map(|v| v.to_le_bytes()).collect()),
        // numpy has no bfloat16: written as float32 (exact).
        DType::BF16 => ("<f4", flat.to_dtype(DType::F32).map_err(e)?.to_vec1::<f32>().map_err(e)?.iter().flat_map(|v| v.to_le_bytes()).collect()),
        DType::I64 => ("<i8", flat.to_vec1::<i64>().map_err(e)?.iter().flat_map(|v| v.to_le_bytes()).collect()),
        DType::I32 => ("<i4", flat.to_vec1::<i32>().map_err(e)?.iter().flat_map(|v| v.to_le_bytes()).collect()),
        DType::U8 => (if bool_ { "|b1" } else { "|u1" }, flat.to_vec1::<u8>().map_err(e)?),
        d => return Err(format!("cannot write a {d:?} tensor to .npy")),
    };
    let shape: Vec<String> = t.dims().iter().map(|d| d.to_string()).collect();
    let shape = match shape.len() {
        1 => format!("({},)", shape[0]),
        _ => format!("({})", shape.join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    out.extend(data);
    Ok(out)
}

/// Write named arrays to an `.npz` (stored zip), atomically (temp file + rename).
pub fn write_npz(path: &Path, arrays: &[(String, Vec<u8>)]) -> Result<(), String> {
    let tmp = path.with_extension("npz.tmp");
    let io = |e: std::io::Error| format!("{}: {e}", path.display());
    let file = std::fs::File::create(&tmp).map_err(io)?;
    let mut zw = zip::ZipWriter::new(file);
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .large_file(arrays.iter().any(|(_, b)| b.len() as u64 >= u32::MAX as u64));
    for (name, bytes) in arrays {
        zw.start_file(format!("{name}.npy"), opts)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        zw.write_all(bytes).map_err(io)?;
    }
    zw.finish().map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::rename(&tmp, path).map_err(io)
}
