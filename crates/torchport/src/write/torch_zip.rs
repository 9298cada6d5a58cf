//! The `torch.save` zip writer (`.pt`), laid out as torch 2.x writes it, so that
//! `torch.load(path, weights_only=True)` returns an `OrderedDict` of the tensors.
//!
//! Records, in order, all stored (not compressed) and 64-byte aligned, under a root folder
//! named after the output file's stem (torch does the same; any name loads):
//! - `<root>/data.pkl`: a protocol-2 pickle of `OrderedDict([(name, tensor), ...])` where each
//!   tensor is `torch._utils._rebuild_tensor_v2(storage, 0, size, stride, False,
//!   OrderedDict())` and `storage` is the persistent id `('storage', torch.<X>Storage, key,
//!   'cpu', numel)`; dtypes that have no legacy storage class (uint16/32/64, float8, complex32,
//!   bits) use `torch.storage.UntypedStorage` with numel counted in bytes and
//!   `_rebuild_tensor_v3(..., dtype)`, exactly as torch writes them;
//! - `<root>/.format_version` (`1`), `<root>/.storage_alignment` (`64`), `<root>/byteorder`
//!   (`little`);
//! - `<root>/data/<key>`: one record per tensor, keys `0`, `1`, … in file order, holding its
//!   contiguous little-endian bytes;
//! - `<root>/version` (`3\n`) and `<root>/.data/serialization_id` (40 digits; here derived from
//!   the pickle, so the same input gives the same file).
//!
//! Each tensor gets its own storage (tensors that shared memory in the source are written
//! twice); `requires_grad` is written as False. Quantized tensors are refused: an
//! [`OutTensor`] carries no scale or zero point.

use std::io::{Seek, Write};
use std::path::Path;

use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, DateTime, ZipWriter};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::out::OutTensor;
use crate::write::pickle::{Emitter, BATCH};
use crate::write::{contiguous_strides, nbytes, put, tensor_bytes, Progress};

/// The legacy typed storage class torch pickles for `dtype`, or `None` for dtypes torch
/// writes as an untyped storage plus a dtype (`_rebuild_tensor_v3`).
fn storage_class(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::F64 => "DoubleStorage",
        DType::F32 => "FloatStorage",
        DType::F16 => "HalfStorage",
        DType::I64 => "LongStorage",
        DType::I32 => "IntStorage",
        DType::I16 => "ShortStorage",
        DType::I8 => "CharStorage",
        DType::U8 => "ByteStorage",
        DType::Bool => "BoolStorage",
        DType::BF16 => "BFloat16Storage",
        DType::C128 => "ComplexDoubleStorage",
        DType::C64 => "ComplexFloatStorage",
        _ => return None,
    })
}

/// `Ok` when the writer can hold `dtype`.
pub(crate) fn check_dtype(dtype: DType) -> std::result::Result<(), String> {
    if dtype.is_quantized() {
        Err("quantized tensors need their scale and zero point, which are not carried over".into())
    } else {
        Ok(())
    }
}

/// The root folder name: the output file's stem when it is plain ASCII, else `archive`.
fn root_name(path: &Path) -> String {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let plain = !stem.is_empty()
        && stem.len() <= 100
        && stem
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    if plain {
        stem.to_string()
    } else {
        "archive".to_string()
    }
}

/// The data.pkl pickle for `tensors` (storage keys `0`, `1`, … in order).
pub(crate) fn data_pickle(path: &Path, tensors: &[OutTensor<'_>]) -> Result<Vec<u8>> {
    let mut e = Emitter::new();
    e.global("collections", "OrderedDict");
    e.empty_tuple();
    e.reduce();
    for (batch_index, batch) in tensors.chunks(BATCH).enumerate() {
        e.mark();
        for (i, t) in batch.iter().enumerate() {
            let key = batch_index * BATCH + i;
            check_dtype(t.dtype).map_err(|why| {
                Error::write(path, format!("tensor {} cannot be written: {why}", t.name))
            })?;
            let n = nbytes(path, t)?;
            e.str(&t.name);
            let class = storage_class(t.dtype);
            e.global(
                "torch._utils",
                if class.is_some() {
                    "_rebuild_tensor_v2"
                } else {
                    "_rebuild_tensor_v3"
                },
            );
            e.mark();
            // The persistent id tuple.
            e.mark();
            e.str("storage");
            match class {
                Some(c) => e.global("torch", c),
                None => e.global("torch.storage", "UntypedStorage"),
            }
            e.str(&key.to_string());
            e.str("cpu");
            e.int(match class {
                Some(_) => n / t.dtype.size() as u64,
                None => n,
            });
            e.tuple_from_mark();
            e.persistent_id();
            e.int(0);
            e.int_tuple(&t.shape);
            e.int_tuple(&contiguous_strides(&t.shape));
            e.false_();
            e.global("collections", "OrderedDict");
            e.empty_tuple();
            e.reduce();
            if class.is_none() {
                e.global("torch", t.dtype.name());
            }
            e.tuple_from_mark();
            e.reduce();
        }
        e.setitems();
    }
    Ok(e.finish())
}

/// A deterministic 40-digit serialization id from the pickle's bytes (two FNV-1a hashes).
fn serialization_id(pickle: &[u8]) -> String {
    let fnv = |seed: u64| {
        pickle.iter().fold(seed, |h, &b| {
            (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    let a = fnv(0xcbf2_9ce4_8422_2325) % 10u64.pow(19);
    let b = fnv(0x6c62_272e_07bb_0142) % 10u64.pow(19);
    format!("{a:020}{b:020}")
}

/// Stream a `.pt` zip archive into `w`; returns the bytes of tensor data written.
pub(crate) fn write<W: Write + Seek>(
    w: &mut W,
    path: &Path,
    tensors: &[OutTensor<'_>],
    progress: Progress<'_>,
) -> Result<u64> {
    let zip_err = |e: zip::result::ZipError| Error::write(path, format!("zip writer: {e}"));
    let root = root_name(path);
    let pickle = data_pickle(path, tensors)?;
    let opts = |size: u64| {
        SimpleFileOptions::default()
            .compression_method(CompressionMethod::Stored)
            .last_modified_time(DateTime::default())
            .with_alignment(64)
            .large_file(size >= u32::MAX as u64)
    };
    let mut zip = ZipWriter::new(w);
    let record = |zip: &mut ZipWriter<&mut W>, name: &str, bytes: &[u8]| -> Result<()> {
        zip.start_file(format!("{root}/{name}"), opts(bytes.len() as u64))
            .map_err(zip_err)?;
        put(zip, path, bytes)
    };
    record(&mut zip, "data.pkl", &pickle)?;
    record(&mut zip, ".format_version", b"1")?;
    record(&mut zip, ".storage_alignment", b"64")?;
    record(&mut zip, "byteorder", b"little")?;
    let mut total = 0u64;
    for (key, t) in tensors.iter().enumerate() {
        zip.start_file(format!("{root}/data/{key}"), opts(nbytes(path, t)?))
            .map_err(zip_err)?;
        let data = tensor_bytes(path, t)?;
        put(&mut zip, path, &data)?;
        let data_len = data.len() as u64;
        total += data_len;
        drop(data);
        t.release();
        progress(&t.name, data_len);
    }
    record(&mut zip, "version", b"3\n")?;
    record(
        &mut zip,
        ".data/serialization_id",
        serialization_id(&pickle).as_bytes(),
    )?;
    zip.finish().map_err(zip_err)?;
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots() {
        assert_eq!(root_name(Path::new("out/model.pt")), "model");
        assert_eq!(root_name(Path::new("my model.pt")), "archive");
        assert_eq!(root_name(Path::new("ckpt-1.0_b.pt")), "ckpt-1.0_b");
        assert_eq!(root_name(Path::new("wé.pt")), "archive");
    }

    #[test]
    fn ids_are_40_digits() {
        let id = serialization_id(b"abc");
        assert_eq!(id.len(), 40);
        assert!(id.bytes().all(|b| b.is_ascii_digit()));
        assert_eq!(id, serialization_id(b"abc"));
        assert_ne!(id, serialization_id(b"abd"));
    }
}
