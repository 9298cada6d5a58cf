//! The numpy `.npz` writer: a zip archive (entries stored, not compressed, as `np.savez`
//! writes them) with one `<name>.npy` entry per tensor, in file order.
//!
//! Each entry is an `.npy` file, version 1.0 (2.0 only when the header would exceed 65535
//! bytes): the magic `\x93NUMPY`, the version, the header length, then the header — the
//! Python literal `{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }` padded with
//! spaces and ended with `\n` so the data starts 64-byte aligned — then the data, row-major,
//! little-endian. Entries are 64-byte aligned in the archive too. Zip64 records are used
//! where sizes or offsets need them.

use std::io::{Seek, Write};
use std::path::Path;

use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, DateTime, ZipWriter};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::format::numpy::npy_descr;
use crate::out::OutTensor;
use crate::write::{nbytes, put, tensor_bytes, Progress};

/// The `.npy` header (magic through the newline) for an array of `dtype` and `shape`.
pub(crate) fn npy_header(dtype: DType, shape: &[usize]) -> Option<Vec<u8>> {
    let descr = npy_descr(dtype)?;
    let shape_text = match shape {
        [] => "()".to_string(),
        [n] => format!("({n},)"),
        dims => {
            let d: Vec<String> = dims.iter().map(usize::to_string).collect();
            format!("({})", d.join(", "))
        }
    };
    let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_text}, }}");
    // Version 1.0 has a 2-byte header length, 2.0 a 4-byte one (used only when needed, as
    // numpy does). Pad so that magic (6) + version (2) + length field + header is a multiple
    // of 64.
    let padded = |len_size: usize| (6 + 2 + len_size + dict.len() + 1).next_multiple_of(64);
    let (version, len_size) = if padded(2) - 10 <= u16::MAX as usize {
        (1u8, 2usize)
    } else {
        (2u8, 4usize)
    };
    let total = padded(len_size);
    let header_len = total - 6 - 2 - len_size;
    let pad = header_len - dict.len() - 1;
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(b"\x93NUMPY");
    out.extend_from_slice(&[version, 0]);
    if version == 1 {
        out.extend_from_slice(&u16::try_from(header_len).ok()?.to_le_bytes());
    } else {
        out.extend_from_slice(&u32::try_from(header_len).ok()?.to_le_bytes());
    }
    out.extend_from_slice(dict.as_bytes());
    out.resize(out.len() + pad, b' ');
    out.push(b'\n');
    Some(out)
}

/// Stream an `.npz` archive into `w`; returns the bytes of tensor data written.
pub(crate) fn write<W: Write + Seek>(
    w: &mut W,
    path: &Path,
    tensors: &[OutTensor<'_>],
    progress: Progress<'_>,
) -> Result<u64> {
    let zip_err = |e: zip::result::ZipError| Error::write(path, format!("zip writer: {e}"));
    let mut zip = ZipWriter::new(w);
    let mut total = 0u64;
    for t in tensors {
        let head = npy_header(t.dtype, &t.shape).ok_or_else(|| {
            Error::write(
                path,
                format!("tensor {} is {}, which numpy cannot hold", t.name, t.dtype),
            )
        })?;
        let size = nbytes(path, t)?.saturating_add(head.len() as u64);
        let options = SimpleFileOptions::default()
            .compression_method(CompressionMethod::Stored)
            .last_modified_time(DateTime::default())
            .with_alignment(64)
            .large_file(size >= u32::MAX as u64);
        zip.start_file(format!("{}.npy", t.name), options)
            .map_err(zip_err)?;
        put(&mut zip, path, &head)?;
        let data = tensor_bytes(path, t)?;
        put(&mut zip, path, &data)?;
        let data_len = data.len() as u64;
        total += data_len;
        drop(data);
        t.release();
        progress(&t.name, data_len);
    }
    zip.finish().map_err(zip_err)?;
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_like_numpy() {
        // np.save of np.zeros((2, 3), '<f4'): header length 118, 64-byte aligned data.
        let h = npy_header(DType::F32, &[2, 3]).unwrap();
        assert_eq!(h.len(), 128);
        assert_eq!(&h[..8], b"\x93NUMPY\x01\x00");
        assert_eq!(u16::from_le_bytes([h[8], h[9]]), 118);
        let text = std::str::from_utf8(&h[10..]).unwrap();
        assert!(text.starts_with("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"));
        assert!(text.ends_with(" \n"));
        let text = |h: Vec<u8>| String::from_utf8(h[10..].to_vec()).unwrap();
        let s = text(npy_header(DType::Bool, &[5]).unwrap());
        assert!(s.contains("'|b1'") && s.contains("(5,)"), "{s}");
        let z = text(npy_header(DType::I64, &[]).unwrap());
        assert!(z.contains("'shape': ()"), "{z}");
        assert!(npy_header(DType::BF16, &[1]).is_none());
        // A header too long for version 1.0 switches to 2.0.
        let big = npy_header(DType::U8, &vec![1; 30_000]).unwrap();
        assert_eq!(&big[6..8], &[2, 0]);
        assert_eq!(big.len() % 64, 0);
    }
}
