//! Opening a `.pt2` archive for the runtime, through torchport's reader (`torchport::open`,
//! refusing any other format): its one serialized program (`Checkpoint::programs`, parsed into
//! the core's IR), the parameters and persistent buffers (`Checkpoint::tensors`) and the tensor
//! constants (`Checkpoint::constants`: lifted tensors, non-persistent buffers), converted to the
//! runtime's tensors for `Program::from_parts` (each copied once out of the memory map, in
//! parallel, releasing the map's pages as it goes). The conversion of contiguous little-endian
//! bytes to a runtime tensor ([`tensor_from_bytes`]) is also what `npy.rs` reads arrays with.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use torchport::{Checkpoint, Format, TensorInfo};

use crate::error::{Error, Result};
use crate::schema::{self, ExportedProgram};

/// The program of the `.pt2` archive at `path`, and its weights and constants by state_dict
/// or constant name.
pub fn read(path: &Path) -> Result<(ExportedProgram, HashMap<String, Tensor>)> {
    let (ckpt, ep) = open(path)?;
    let payloads = decode(&ckpt, &HashSet::new())?;
    Ok((ep, payloads))
}

/// The opened archive and its program; the weights are decoded later by [`decode`], once
/// the caller knows the layout each should have.
pub(crate) fn open(path: &Path) -> Result<(Checkpoint, ExportedProgram)> {
    let ckpt = open_pt2(path)?;
    let ep = program(path, &ckpt)?;
    Ok((ckpt, ep))
}

/// Every weight and constant of `ckpt` by state_dict or constant name, decoded in parallel,
/// each copied once out of the memory-mapped archive, whose pages are then released (so that
/// the load does not hold the archive and the decoded weights in memory at once). A 2-d
/// float32 tensor named in `transposed` is stored as its contiguous transpose and handed
/// back as the transpose (`.t()`) of that: the same logical values, laid out as a matmul
/// reading it transposed wants them (see [`crate::prepare`]).
pub(crate) fn decode(
    ckpt: &Checkpoint,
    transposed: &HashSet<String>,
) -> Result<HashMap<String, Tensor>> {
    use rayon::prelude::*;
    let infos: Vec<&TensorInfo> = ckpt.tensors().iter().chain(ckpt.constants()).collect();
    let decoded = infos
        .par_iter()
        .map(|t| {
            let x = tensor(ckpt, t, transposed.contains(&t.name))?;
            ckpt.release(t);
            Ok((t.name.clone(), x))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(decoded.into_iter().collect())
}

/// The program of the `.pt2` archive at `path`, without decoding its weights or constants.
pub fn read_program(path: &Path) -> Result<ExportedProgram> {
    program(path, &open_pt2(path)?)
}

/// Open `path` with torchport's reader, refusing anything but a `.pt2` archive.
fn open_pt2(path: &Path) -> Result<Checkpoint> {
    let ckpt = torchport::open(path).map_err(Error::Read)?;
    if ckpt.format() != Format::Pt2 {
        return Err(Error::Archive {
            path: path.to_path_buf(),
            what: format!(
                "not a .pt2 archive (it is a {} file); expected one written by torch.export.save",
                ckpt.format().name()
            ),
        });
    }
    Ok(ckpt)
}

/// The one program of an opened archive, parsed into the core's IR.
fn program(path: &Path, ckpt: &Checkpoint) -> Result<ExportedProgram> {
    let programs: Vec<(&str, &[u8])> = ckpt.programs().collect();
    let [(record, json)] = programs[..] else {
        let records: Vec<&str> = programs.iter().map(|p| p.0).collect();
        return Err(Error::Archive {
            path: path.to_path_buf(),
            what: format!(
                "the archive holds {} programs ({}); the runtime runs archives holding one",
                programs.len(),
                records.join(", ")
            ),
        });
    };
    schema::parse_program(json).map_err(|e| Error::Schema {
        path: path.to_path_buf(),
        record: record.to_string(),
        what: e.to_string(),
    })
}

/// One tensor of the checkpoint as a runtime tensor; `transpose`: a 2-d float32 tensor is
/// stored transposed (see [`decode`]).
fn tensor(ckpt: &Checkpoint, t: &TensorInfo, transpose: bool) -> Result<Tensor> {
    let werr = |what: String| Error::Weight {
        name: t.name.clone(),
        what,
    };
    let bytes = ckpt.data(t).map_err(|e| werr(e.to_string()))?;
    let name = t.dtype.name();
    if transpose && name == "float32" {
        if let [n, k] = t.shape[..] {
            if n.checked_mul(k).and_then(|e| e.checked_mul(4)) == Some(bytes.len()) {
                let data = crate::prepare::transpose_le_f32(&bytes, n, k);
                return Tensor::from_vec(data, (k, n), &Device::Cpu)
                    .and_then(|x| x.t())
                    .map_err(|e| werr(crate::error::candle_message(&e)));
            }
        }
    }
    tensor_from_bytes(&bytes, name, &t.shape).map_err(werr)
}

/// A runtime tensor from contiguous little-endian bytes of torch dtype `name`
/// (floats become f32, ints i64, bool u8).
pub fn tensor_from_bytes(
    bytes: &[u8],
    name: &str,
    shape: &[usize],
) -> std::result::Result<Tensor, String> {
    let dev = Device::Cpu;
    let unsupported = || format!("dtype {name} is not supported");
    let size = match name {
        "bool" | "uint8" | "int8" => 1,
        "int16" | "float16" | "bfloat16" => 2,
        "int32" | "float32" => 4,
        "int64" | "float64" => 8,
        _ => return Err(unsupported()),
    };
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .and_then(|n| n.checked_mul(size));
    if n != Some(bytes.len()) {
        return Err(format!(
            "{} bytes do not hold a {name} tensor of shape {shape:?}",
            bytes.len()
        ));
    }
    let e = |e: candle_core::Error| crate::error::candle_message(&e);
    let raw = |d: DType| Tensor::from_raw_buffer(bytes, d, shape, &dev).map_err(e);
    Ok(match name {
        "float32" => Tensor::from_vec(le_f32s(bytes), shape, &dev).map_err(e)?,
        "float16" => raw(DType::F16)?.to_dtype(DType::F32).map_err(e)?,
        "bfloat16" => raw(DType::BF16)?.to_dtype(DType::F32).map_err(e)?,
        "float64" => raw(DType::F64)?,
        "int64" => raw(DType::I64)?,
        "int32" => raw(DType::I32)?.to_dtype(DType::I64).map_err(e)?,
        "int16" => raw(DType::I16)?.to_dtype(DType::I64).map_err(e)?,
        "int8" => {
            let v: Vec<i64> = bytes.iter().map(|&b| i64::from(b as i8)).collect();
            Tensor::from_vec(v, shape, &dev).map_err(e)?
        }
        "uint8" => raw(DType::U8)?.to_dtype(DType::I64).map_err(e)?,
        "bool" => {
            let v: Vec<u8> = bytes.iter().map(|&b| u8::from(b != 0)).collect();
            Tensor::from_vec(v, shape, &dev).map_err(e)?
        }
        _ => return Err(unsupported()),
    })
}

/// Little-endian f32 bytes as f32 values, converted in parallel in 1 MiB stretches: one pass
/// over the bytes into a [`crate::allocator::weight_buffer`] (a large one comes as fresh,
/// already zero pages from the kernel, so its values are written once, here).
fn le_f32s(bytes: &[u8]) -> Vec<f32> {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 18;
    let mut out = crate::allocator::weight_buffer(bytes.len() / 4);
    out.par_chunks_mut(CHUNK)
        .zip(bytes.par_chunks(CHUNK * 4))
        .for_each(|(d, s)| {
            for (o, c) in d.iter_mut().zip(s.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        });
    out
}
