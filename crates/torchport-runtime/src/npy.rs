//! numpy I/O for `torchport run` and the tests. Reading goes through torchport's own numpy
//! reader (`torchport::open`). TEMPORARY (replace at merge with the npz writer from branch
//! writers): a minimal `.npz` writer for little-endian C-order f32, f16, f64, i64, i32, u8
//! and bool arrays.

use std::io::Write;
use std::path::Path;

use candle_core::{DType, Tensor};

/// Read a `.npy` file (through torchport's numpy reader) into a runtime tensor: floats as f32,
/// integers as i64, bool as u8 0/1.
pub fn read_npy(path: &Path) -> Result<Tensor, String> {
    let mut all = read_arrays(path)?;
    if all.len() != 1 {
        return Err(format!(
            "{}: expected one array, found {}",
            path.display(),
            all.len()
        ));
    }
    Ok(all.remove(0).1)
}

/// Every array of a numpy file (`.npy` or `.npz`), by name, as runtime tensors.
pub fn read_arrays(path: &Path) -> Result<Vec<(String, Tensor)>, String> {
    let ckpt = torchport::open(path).map_err(|e| e.to_string())?;
    ckpt.tensors()
        .iter()
        .map(|t| {
            let bytes = ckpt.data(t).map_err(|e| e.to_string())?;
            let x = crate::archive::tensor_from_bytes(&bytes, t.dtype.name(), &t.shape)
                .map_err(|e| format!("{}: array '{}': {e}", path.display(), t.name))?;
            Ok((t.name.clone(), x))
        })
        .collect()
}

/// `.npy` bytes of a tensor; u8 tensors flagged `bool` are written as numpy bool.
pub fn npy_bytes(t: &Tensor, bool_: bool) -> Result<Vec<u8>, String> {
    let e = |e: candle_core::Error| e.to_string();
    let t = t.contiguous().map_err(e)?;
    let flat = t.flatten_all().map_err(e)?;
    let (descr, data): (&str, Vec<u8>) = match t.dtype() {
        DType::F32 => (
            "<f4",
            flat.to_vec1::<f32>()
                .map_err(e)?
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
        DType::F64 => (
            "<f8",
            flat.to_vec1::<f64>()
                .map_err(e)?
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
        DType::F16 => (
            "<f2",
            flat.to_vec1::<half::f16>()
                .map_err(e)?
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
        // numpy has no bfloat16: written as float32 (exact).
        DType::BF16 => (
            "<f4",
            flat.to_dtype(DType::F32)
                .map_err(e)?
                .to_vec1::<f32>()
                .map_err(e)?
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
        DType::I64 => (
            "<i8",
            flat.to_vec1::<i64>()
                .map_err(e)?
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
        DType::I32 => (
            "<i4",
            flat.to_vec1::<i32>()
                .map_err(e)?
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
        DType::U8 => (
            if bool_ { "|b1" } else { "|u1" },
            flat.to_vec1::<u8>().map_err(e)?,
        ),
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
        .large_file(
            arrays
                .iter()
                .any(|(_, b)| b.len() as u64 >= u32::MAX as u64),
        );
    for (name, bytes) in arrays {
        zw.start_file(format!("{name}.npy"), opts)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        zw.write_all(bytes).map_err(io)?;
    }
    zw.finish()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::rename(&tmp, path).map_err(io)
}
