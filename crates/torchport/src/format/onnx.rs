//! ONNX models (`.onnx`): the main graph's initializers, as tensors named by their
//! initializer names.
//!
//! The protobuf is decoded with `prost` through hand-written structs for just the fields
//! used (see `proto`), from a `bytes::Bytes` over the memory-mapped file, so each
//! initializer and its `raw_data` come out as zero-copy slices of the map: `raw_data`
//! tensors are storages over their range of the file. Tensors given in the typed fields
//! (`float_data`, `int32_data`, `int64_data`, `double_data`, `uint64_data`) are converted to
//! little-endian bytes, as `onnx.numpy_helper.to_array` does (narrow types in `int32_data`
//! keep the low bytes of each entry). External data (`data_location` EXTERNAL) is read from
//! a file inside the model's folder, memory-mapped, zero-copy (see `external`).
//!
//! Out of scope: initializers of subgraphs (`If`/`Loop`/`Scan` bodies, functions, training
//! info) are not listed; sparse initializers are listed but their data cannot be read;
//! STRING, 4-bit, 2-bit and 6-bit tensors and segmented tensors are refused with an error
//! naming the tensor.

mod external;
mod proto;

use std::ops::Range;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use prost::Message;

use self::external::External;
use self::proto::{ModelProto, SparseTensorProto, TensorProto};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::format::kind::Format;
use crate::format::parts::Found;
use crate::format::parts::Parts;
use crate::limits::Limits;
use crate::storage::{FileBytes, Storage};
use crate::tensor::{check_view, contiguous_strides, ByteOrder, TensorData, TensorInfo};

pub(crate) use self::proto::looks_like;

/// `TensorProto.DataLocation`.
const DEFAULT: i32 = 0;
const EXTERNAL: i32 = 1;

/// The whole file as the owner of a `Bytes`, so that decoding slices it without copying.
struct Whole(FileBytes);

impl AsRef<[u8]> for Whole {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// Read an ONNX model's initializers. `on_disk`: the model was opened from `path` (external
/// data is then looked up in its folder); otherwise external data is refused.
pub(crate) fn read(path: &Path, file: &FileBytes, limits: &Limits, on_disk: bool) -> Result<Parts> {
    let whole = Bytes::from_owner(Whole(file.clone()));
    let base = whole.as_ptr() as usize;
    // Where a slice of `whole` lies in the file.
    let range_of = |b: &Bytes| -> Option<Range<usize>> {
        let start = (b.as_ptr() as usize).checked_sub(base)?;
        let end = start.checked_add(b.len())?;
        (end <= whole.len()).then_some(start..end)
    };

    let mut buf = whole.clone();
    let mut model = ModelProto::default();
    model.merge(&mut buf).map_err(|e| {
        let at = whole.len() - buf.len();
        Error::corrupt(
            path,
            format!(
                "the ONNX model is not valid protobuf near byte {at} ({e}); \
                 the file may be truncated"
            ),
        )
    })?;
    let graph = model.graph.ok_or_else(|| {
        Error::corrupt(
            path,
            "the ONNX model has no graph (ModelProto field 7); the file may be truncated",
        )
    })?;
    let count = graph.initializer.len() + graph.sparse_initializer.len();
    if count > limits.max_tensors {
        return Err(Error::Limit {
            path: path.to_path_buf(),
            what: format!("{count} initializers"),
            limit: limits.max_tensors as u64,
            field: "max_tensors",
        });
    }

    let dir = on_disk.then(|| match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    });
    let mut r = Reader {
        path,
        file,
        limits,
        external: External::new(path, dir),
        storages: Vec::new(),
        tensors: Vec::with_capacity(count),
    };
    for (i, init) in graph.initializer.iter().enumerate() {
        let at = range_of(init).map_or(0, |r| r.start);
        let t = decode::<TensorProto>(path, init, at, ("initializer", i, "TensorProto"))?;
        r.tensor(t, at, &range_of)?;
    }
    for (i, init) in graph.sparse_initializer.iter().enumerate() {
        let at = range_of(init).map_or(0, |r| r.start);
        let s = decode::<SparseTensorProto>(
            path,
            init,
            at,
            ("sparse initializer", i, "SparseTensorProto"),
        )?;
        r.sparse(s, at)?;
    }
    let found = Found {
        tensors: r.tensors,
        ..Found::default()
    };
    Ok(Parts::new(
        Format::Onnx,
        ByteOrder::Little,
        found,
        Vec::new(),
        r.storages,
    ))
}

/// Decode one message held in `bytes` (which starts at byte `at` of the file); `what` is
/// (its role, its index, its message type) for messages.
fn decode<M: Message + Default>(
    path: &Path,
    bytes: &Bytes,
    at: usize,
    (role, index, kind): (&str, usize, &str),
) -> Result<M> {
    let mut buf = bytes.clone();
    let mut m = M::default();
    m.merge(&mut buf).map_err(|e| {
        let near = at + (bytes.len() - buf.len());
        Error::corrupt(
            path,
            format!("{role} {index} (at byte {at}) is not a valid {kind} near byte {near}: {e}"),
        )
    })?;
    Ok(m)
}

struct Reader<'a> {
    path: &'a Path,
    file: &'a FileBytes,
    limits: &'a Limits,
    external: External<'a>,
    storages: Vec<Storage>,
    tensors: Vec<TensorInfo>,
}

impl Reader<'_> {
    /// Name, dtype and shape of a TensorProto; errors name the tensor.
    fn header(
        &self,
        t: &TensorProto,
        dims: &[i64],
        at: usize,
    ) -> Result<(String, DType, Vec<usize>)> {
        let name = String::from_utf8(t.name.to_vec()).map_err(|_| {
            Error::corrupt(
                self.path,
                format!("the initializer at byte {at} has a name that is not valid UTF-8"),
            )
        })?;
        let dtype = dtype_of(t.data_type).map_err(|what| Error::tensor(self.path, &name, what))?;
        if dims.len() > self.limits.max_ndim {
            return Err(Error::Limit {
                path: self.path.to_path_buf(),
                what: format!("tensor {name}'s {} dimensions", dims.len()),
                limit: self.limits.max_ndim as u64,
                field: "max_ndim",
            });
        }
        let shape = dims
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<Result<Vec<usize>, _>>()
            .map_err(|_| {
                Error::tensor(
                    self.path,
                    &name,
                    format!("dims {dims:?} hold a negative size"),
                )
            })?;
        Ok((name, dtype, shape))
    }

    /// One dense initializer.
    fn tensor(
        &mut self,
        t: TensorProto,
        at: usize,
        range_of: &dyn Fn(&Bytes) -> Option<Range<usize>>,
    ) -> Result<()> {
        let (name, dtype, shape) = self.header(&t, &t.dims, at)?;
        let bad = |what: String| Error::tensor(self.path, &name, what);
        if t.segment.is_some() {
            return Err(bad(
                "it is one segment of a larger tensor (TensorProto.segment), \
                 which torchport does not read"
                    .into(),
            ));
        }
        let nbytes = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .and_then(|n| n.checked_mul(dtype.size()))
            .ok_or_else(|| bad(format!("its size {shape:?} of {dtype} overflows")))?;
        let storage = match t.data_location {
            EXTERNAL => self.external.storage(&name, &t.external_data, nbytes)?,
            DEFAULT if !t.raw_data.is_empty() => {
                if t.raw_data.len() != nbytes {
                    return Err(bad(format!(
                        "its raw_data holds {} bytes but {dtype} {shape:?} needs {nbytes}",
                        t.raw_data.len()
                    )));
                }
                // Zero-copy when the bytes are a slice of the file, as they are when decoded
                // from it.
                match range_of(&t.raw_data).and_then(|r| self.file.storage(r)) {
                    Some(s) => s,
                    None => Storage::owned(t.raw_data.to_vec()),
                }
            }
            DEFAULT => Storage::owned(typed_bytes(&t, dtype, nbytes / dtype.size()).map_err(bad)?),
            other => {
                return Err(bad(format!(
                    "unknown data_location {other} (expected 0 DEFAULT or 1 EXTERNAL)"
                )))
            }
        };
        let strides = contiguous_strides(&shape);
        check_view(dtype, &shape, &strides, 0, storage.len()).map_err(bad)?;
        self.storages.push(storage);
        self.tensors.push(TensorInfo {
            name,
            dtype,
            shape,
            strides,
            offset: 0,
            data: TensorData::Strided {
                storage: self.storages.len() - 1,
            },
            quant: None,
            requires_grad: false,
        });
        Ok(())
    }

    /// One sparse initializer: listed (name, dtype, dense shape); its data is not read.
    fn sparse(&mut self, s: SparseTensorProto, at: usize) -> Result<()> {
        let values = s.values.unwrap_or_default();
        let (name, dtype, shape) = self.header(&values, &s.dims, at)?;
        self.tensors.push(TensorInfo {
            name,
            dtype,
            strides: contiguous_strides(&shape),
            shape,
            offset: 0,
            data: TensorData::Unsupported {
                what: "a sparse initializer (SparseTensorProto)".into(),
            },
            quant: None,
            requires_grad: false,
        });
        Ok(())
    }
}

/// The torch dtype of an ONNX `TensorProto.DataType`, or why it is refused.
fn dtype_of(data_type: i32) -> Result<DType, String> {
    Ok(match data_type {
        1 => DType::F32,
        2 => DType::U8,
        3 => DType::I8,
        4 => DType::U16,
        5 => DType::I16,
        6 => DType::I32,
        7 => DType::I64,
        9 => DType::Bool,
        10 => DType::F16,
        11 => DType::F64,
        12 => DType::U32,
        13 => DType::U64,
        14 => DType::C64,
        15 => DType::C128,
        16 => DType::BF16,
        17 => DType::F8E4M3Fn,
        18 => DType::F8E4M3Fnuz,
        19 => DType::F8E5M2,
        20 => DType::F8E5M2Fnuz,
        24 => DType::F8E8M0Fnu,
        _ => {
            let what = match data_type {
                0 => "UNDEFINED",
                8 => "STRING",
                21 => "UINT4",
                22 => "INT4",
                23 => "FLOAT4E2M1",
                25 => "UINT2",
                26 => "INT2",
                27 => "FLOAT6E2M3",
                28 => "FLOAT6E3M2",
                _ => return Err(format!("unknown ONNX data type {data_type}")),
            };
            return Err(format!(
                "torchport does not read ONNX data type {what} ({data_type})"
            ));
        }
    })
}

/// Little-endian bytes of a tensor given in its typed field, `numel` elements of `dtype`.
fn typed_bytes(t: &TensorProto, dtype: DType, numel: usize) -> Result<Vec<u8>, String> {
    // Complex numbers take two entries (real, imaginary) each.
    let per = if matches!(dtype, DType::C64 | DType::C128) {
        2
    } else {
        1
    };
    let (field, len) = match dtype {
        DType::F32 | DType::C64 => ("float_data", t.float_data.len()),
        DType::F64 | DType::C128 => ("double_data", t.double_data.len()),
        DType::I64 => ("int64_data", t.int64_data.len()),
        DType::U32 | DType::U64 => ("uint64_data", t.uint64_data.len()),
        _ => ("int32_data", t.int32_data.len()),
    };
    let want = numel.saturating_mul(per);
    if len != want {
        let what = if len == 0 && numel > 0 {
            format!("it has no raw_data and no {field} but its shape needs {numel} elements")
        } else {
            format!("{field} holds {len} values but its shape needs {want}")
        };
        return Err(what);
    }
    let size = dtype.size() / per;
    let mut out = Vec::with_capacity(numel.saturating_mul(dtype.size()));
    // Each entry's low `size` bytes, little-endian (numpy's wrapping `astype`).
    match field {
        "float_data" => t
            .float_data
            .iter()
            .for_each(|v| out.extend(v.to_le_bytes())),
        "double_data" => t
            .double_data
            .iter()
            .for_each(|v| out.extend(v.to_le_bytes())),
        "int64_data" => t
            .int64_data
            .iter()
            .for_each(|v| out.extend(v.to_le_bytes())),
        "uint64_data" => t
            .uint64_data
            .iter()
            .for_each(|v| out.extend(&v.to_le_bytes()[..size])),
        _ => t
            .int32_data
            .iter()
            .for_each(|v| out.extend(&v.to_le_bytes()[..size])),
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtypes() {
        assert_eq!(dtype_of(1), Ok(DType::F32));
        assert_eq!(dtype_of(16), Ok(DType::BF16));
        assert!(dtype_of(8).unwrap_err().contains("STRING"));
        assert!(dtype_of(99).unwrap_err().contains("unknown"));
    }

    #[test]
    fn typed_low_bytes() {
        let t = TensorProto {
            int32_data: vec![-5, 300, 0x3c00],
            ..TensorProto::default()
        };
        assert_eq!(typed_bytes(&t, DType::I8, 3).unwrap(), [0xfb, 0x2c, 0x00]);
        assert_eq!(
            typed_bytes(&t, DType::F16, 3).unwrap(),
            [0xfb, 0xff, 0x2c, 0x01, 0x00, 0x3c]
        );
        assert!(typed_bytes(&t, DType::I8, 4)
            .unwrap_err()
            .contains("holds 3 values"));
        assert!(typed_bytes(&t, DType::F32, 3)
            .unwrap_err()
            .contains("no raw_data and no float_data"));
    }
}
