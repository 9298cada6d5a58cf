//! The safetensors writer.
//!
//! Layout (the safetensors spec): an 8-byte little-endian header length N, N bytes of JSON
//! (`{"__metadata__": {..strings..}, "<name>": {"dtype", "shape", "data_offsets": [begin,
//! end]}, ...}`, padded with spaces so the data starts 8-byte aligned), then the tensors'
//! bytes back to back with no holes. Tensors are laid out by element size, largest first
//! (stable: file order within a size), so every tensor starts aligned to its element size and
//! can be viewed in place from a memory map; the JSON lists them in that order.

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use crate::error::{Error, Remedy, Result};
use crate::format::safetensors::safetensors_dtype;
use crate::out::OutTensor;
use crate::write::{nbytes, put, tensor_bytes, Progress};

/// Tensors smaller than this are written through the output buffer even when they could be
/// copied file to file (a copy costs a flush and a few system calls).
const FILE_COPY_MIN: usize = 64 << 10;

/// The safetensors spec's largest header (the reference reader refuses larger ones).
const MAX_HEADER: usize = 100_000_000;

/// The header JSON (padded) and the order the tensors' data follows in.
pub(crate) fn header(
    path: &Path,
    tensors: &[OutTensor<'_>],
    metadata: &[(String, String)],
) -> Result<(Vec<u8>, Vec<usize>)> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(tensors[i].dtype.size()));

    let json = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let mut h = String::from("{");
    let mut first = true;
    let mut sep = |h: &mut String| {
        if !first {
            h.push(',');
        }
        first = false;
    };
    if !metadata.is_empty() {
        if tensors.iter().any(|t| t.name == "__metadata__") {
            return Err(Error::unwritable(
                path,
                "__metadata__",
                "a tensor is named __metadata__, which safetensors reserves; rename it or leave it out",
                Remedy::LeaveOut,
            ));
        }
        sep(&mut h);
        h.push_str("\"__metadata__\":{");
        for (i, (k, v)) in metadata.iter().enumerate() {
            if i > 0 {
                h.push(',');
            }
            h.push_str(&json(k));
            h.push(':');
            h.push_str(&json(v));
        }
        h.push('}');
    }
    let mut offset = 0u64;
    for &i in &order {
        let t = &tensors[i];
        let dtype = safetensors_dtype(t.dtype).ok_or_else(|| {
            Error::write(
                path,
                format!(
                    "tensor {} is {}, which safetensors cannot hold",
                    t.name, t.dtype
                ),
            )
        })?;
        let end = offset
            .checked_add(nbytes(path, t)?)
            .ok_or_else(|| Error::write(path, "the total size of the tensors overflows"))?;
        let shape: Vec<String> = t.shape.iter().map(usize::to_string).collect();
        sep(&mut h);
        h.push_str(&format!(
            "{}:{{\"dtype\":\"{dtype}\",\"shape\":[{}],\"data_offsets\":[{offset},{end}]}}",
            json(&t.name),
            shape.join(",")
        ));
        offset = end;
    }
    h.push('}');
    let mut bytes = h.into_bytes();
    bytes.resize(bytes.len().next_multiple_of(8), b' ');
    if bytes.len() > MAX_HEADER {
        return Err(Error::write(
            path,
            format!(
                "the safetensors header would be {} bytes, over the format's limit of {MAX_HEADER}; write fewer tensors or less metadata",
                bytes.len()
            ),
        ));
    }
    Ok((bytes, order))
}

/// Stream a safetensors file into `w`; returns the bytes of tensor data written. A tensor
/// whose bytes lie unchanged in an input file is copied file to file (no pass through this
/// process's memory); the others are written from [`OutTensor::data`].
pub(crate) fn write(
    w: &mut BufWriter<&mut File>,
    path: &Path,
    tensors: &[OutTensor<'_>],
    metadata: &[(String, String)],
    progress: Progress<'_>,
) -> Result<u64> {
    let (head, order) = header(path, tensors, metadata)?;
    put(w, path, &(head.len() as u64).to_le_bytes())?;
    put(w, path, &head)?;
    let mut total = 0u64;
    let writeback = crate::write::atomic::Writeback::start(w.get_ref());
    for i in order {
        let t = &tensors[i];
        let data_len = match t.file_range().filter(|r| r.len() >= FILE_COPY_MIN) {
            Some(range) => {
                let n = range.copy_to(w).map_err(|e| Error::write_io(path, e))?;
                if n != range.len() as u64 {
                    return Err(Error::Tensor {
                        path: path.to_path_buf(),
                        tensor: t.name.clone(),
                        what: format!(
                            "could not be copied: its input file ended after {n} of its {} bytes (was it changed while being read?)",
                            range.len()
                        ),
                    });
                }
                writeback.hint();
                n
            }
            None => {
                let data = tensor_bytes(path, t)?;
                put(w, path, &data)?;
                data.len() as u64
            }
        };
        total += data_len;
        t.release();
        progress(&t.name, data_len);
    }
    Ok(total)
}
