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
//! twice); `requires_grad` is written as False.
//!
//! Quantized tensors (`qint8`, `quint8`, `qint32` with their [`Quant`]) are written as torch
//! writes them: `torch._utils._rebuild_qtensor(storage, 0, size, stride, qparams, False,
//! OrderedDict())` on a `torch.QInt8Storage` / `QUInt8Storage` / `QInt32Storage`, with
//! `qparams` = `(torch.per_tensor_affine, scale, zero_point)` or `(torch.per_channel_affine,
//! scales, zero_points, axis)` where `scales` is a float64 tensor and `zero_points` an int64
//! one (`per_channel_affine_float_qparams`: both float32, under the name
//! `per_channel_affine`, exactly as torch stores them), each in a
//! storage record of its own after the tensors' (keys `n`, `n+1`, …). They are written by
//! name, as plain quantized tensors: a quantized model's packed parameters
//! (`_packed_params._packed_params` tuples, `torch.ScriptObject` payloads) are not rebuilt.

use std::io::{Seek, Write};
use std::path::Path;

use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, DateTime, ZipWriter};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::out::OutTensor;
use crate::tensor::contiguous_strides;
use crate::tensor::Quant;
use crate::write::pickle::{Emitter, BATCH};
use crate::write::{nbytes, put, tensor_bytes, Progress};

/// `Ok` when the writer can hold `dtype`.
pub(crate) fn check_dtype(dtype: DType) -> std::result::Result<(), String> {
    if dtype.is_quantized() && crate::quant::int_dtype(dtype).is_none() {
        Err(format!("the .pt writer does not write {dtype}"))
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

/// Extra storage records (quantization parameters): key and bytes.
pub(crate) type Records = Vec<(String, Vec<u8>)>;

/// Push `_rebuild_tensor_v2(persistent storage, 0, shape, contiguous stride, False,
/// OrderedDict())` or its `_v3` form for dtypes without a legacy storage class.
fn plain_tensor(e: &mut Emitter, dtype: DType, shape: &[usize], key: &str, bytes: u64) {
    let class = dtype.storage_class();
    e.global(
        "torch._utils",
        if class.is_some() {
            "_rebuild_tensor_v2"
        } else {
            "_rebuild_tensor_v3"
        },
    );
    e.mark();
    persistent_storage(e, dtype, key, bytes);
    e.int(0);
    e.int_tuple(shape);
    e.int_tuple(&contiguous_strides(shape));
    e.false_();
    e.global("collections", "OrderedDict");
    e.empty_tuple();
    e.reduce();
    if class.is_none() {
        e.global("torch", dtype.name());
    }
    e.tuple_from_mark();
    e.reduce();
}

/// Push the persistent load of storage `key`: `('storage', torch.<X>Storage, key, 'cpu',
/// numel)`, or an untyped storage counted in bytes.
fn persistent_storage(e: &mut Emitter, dtype: DType, key: &str, bytes: u64) {
    let class = dtype.storage_class();
    e.mark();
    e.str("storage");
    match class {
        Some(c) => e.global("torch", c),
        None => e.global("torch.storage", "UntypedStorage"),
    }
    e.str(key);
    e.str("cpu");
    e.int(match class {
        Some(_) => bytes / dtype.size() as u64,
        None => bytes,
    });
    e.tuple_from_mark();
    e.persistent_id();
}

/// Push a 1-d parameter tensor of `values` (written as `dtype`: F64, F32 or I64) stored in a
/// new record.
fn param_tensor(e: &mut Emitter, records: &mut Records, key: usize, dtype: DType, values: &[f64]) {
    let bytes: Vec<u8> = match dtype {
        DType::F32 => values
            .iter()
            .flat_map(|&v| (v as f32).to_le_bytes())
            .collect(),
        DType::I64 => values
            .iter()
            .flat_map(|&v| (v as i64).to_le_bytes())
            .collect(),
        _ => values.iter().flat_map(|&v| v.to_le_bytes()).collect(),
    };
    let key = key.to_string();
    plain_tensor(e, dtype, &[values.len()], &key, bytes.len() as u64);
    records.push((key, bytes));
}

/// Push `_rebuild_qtensor(storage, 0, shape, stride, qparams, False, OrderedDict())`.
fn quantized_tensor(
    e: &mut Emitter,
    records: &mut Records,
    first_key: usize,
    t: &OutTensor<'_>,
    quant: &Quant,
    key: &str,
    bytes: u64,
) {
    e.global("torch._utils", "_rebuild_qtensor");
    e.mark();
    persistent_storage(e, t.dtype, key, bytes);
    e.int(0);
    e.int_tuple(&t.shape);
    e.int_tuple(&contiguous_strides(&t.shape));
    e.mark();
    // torch saves float_qparams as per_channel_affine with float zero points, too.
    e.global(
        "torch",
        match quant {
            Quant::PerTensor { .. } => "per_tensor_affine",
            Quant::PerChannel { .. } => "per_channel_affine",
        },
    );
    match quant {
        Quant::PerTensor { scale, zero_point } => {
            e.float(*scale);
            e.int_signed(*zero_point);
        }
        Quant::PerChannel {
            scales,
            zero_points,
            axis,
            float_qparams,
        } => {
            let (s, z) = if *float_qparams {
                (DType::F32, DType::F32)
            } else {
                (DType::F64, DType::I64)
            };
            param_tensor(e, records, first_key + records.len(), s, scales);
            param_tensor(e, records, first_key + records.len(), z, zero_points);
            e.int(*axis as u64);
        }
    }
    e.tuple_from_mark();
    e.false_();
    e.global("collections", "OrderedDict");
    e.empty_tuple();
    e.reduce();
    e.tuple_from_mark();
    e.reduce();
}

/// The data.pkl pickle for `tensors` (storage keys `0`, `1`, … in order), and the extra
/// records its quantization parameters need (keys from `tensors.len()` on).
pub(crate) fn data_pickle(path: &Path, tensors: &[OutTensor<'_>]) -> Result<(Vec<u8>, Records)> {
    let mut e = Emitter::new();
    let mut records = Records::new();
    e.global("collections", "OrderedDict");
    e.empty_tuple();
    e.reduce();
    for (batch_index, batch) in tensors.chunks(BATCH).enumerate() {
        e.mark();
        for (i, t) in batch.iter().enumerate() {
            let key = (batch_index * BATCH + i).to_string();
            let cannot = |why: String| {
                Error::write(path, format!("tensor {} cannot be written: {why}", t.name))
            };
            check_dtype(t.dtype).map_err(cannot)?;
            let n = nbytes(path, t)?;
            e.str(&t.name);
            match (t.dtype.is_quantized(), t.quant()) {
                (false, _) => plain_tensor(&mut e, t.dtype, &t.shape, &key, n),
                (true, Some(q)) => {
                    crate::quant::check(q, &t.shape).map_err(cannot)?;
                    quantized_tensor(&mut e, &mut records, tensors.len(), t, q, &key, n)
                }
                (true, None) => {
                    return Err(cannot(format!(
                        "it is {} but has no scale and zero point",
                        t.dtype
                    )))
                }
            }
        }
        e.setitems();
    }
    Ok((e.finish(), records))
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
    let (pickle, records) = data_pickle(path, tensors)?;
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
    for (key, bytes) in &records {
        record(&mut zip, &format!("data/{key}"), bytes)?;
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
