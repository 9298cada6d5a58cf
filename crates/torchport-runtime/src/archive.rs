//! Reading a `.pt2` archive: the serialized program (`<root>/models/model.json`) and its
//! weights by state_dict name.
//!
//! Parameters and persistent buffers come from torchport's own `.pt2` reader
//! ([`read_weights`], through `torchport::open`). Tensor constants (lifted tensors,
//! non-persistent buffers) are listed by that reader as values without data, so
//! [`Archive::read_constants`] reads `data/constants/` through its payload config.
//! TEMPORARY: drop it once `torchport::open` exposes constant tensors.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use crate::dtype;
use crate::error::{Error, Result};
use crate::schema::{self, ExportedProgram, PayloadConfig, SymInt};

/// Largest program JSON read (the JSON of a large LLM is well under this).
const MAX_JSON: u64 = 512 << 20;

/// An opened `.pt2` archive.
pub struct Archive {
    path: PathBuf,
    zip: zip::ZipArchive<std::fs::File>,
    root: String,
}

impl Archive {
    /// Open `path` and find the archive's root folder (the prefix of `archive_format`).
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let zip = zip::ZipArchive::new(file).map_err(|e| Error::Archive {
            path: path.to_path_buf(),
            what: format!("not a .pt2 archive (not a readable zip file: {e})"),
        })?;
        let names: Vec<String> = zip
            .file_names()
            .filter_map(|n| n.ok().map(|n| n.into_owned()))
            .collect();
        let root = names
            .iter()
            .find_map(|n| n.strip_suffix("models/model.json").map(str::to_string))
            .or_else(|| {
                names
                    .iter()
                    .find(|n| n.contains("models/") && n.ends_with(".json"))
                    .and_then(|n| n.split("models/").next().map(str::to_string))
            })
            .ok_or_else(|| Error::Archive {
                path: path.to_path_buf(),
                what: "the archive holds no exported program (no models/*.json record); \
                       was it written by torch.export.save?"
                    .into(),
            })?;
        Ok(Archive {
            path: path.to_path_buf(),
            zip,
            root,
        })
    }

    fn read(&mut self, record: &str, limit: u64) -> Result<Option<Vec<u8>>> {
        let name = format!("{}{}", self.root, record);
        let mut f = match self.zip.by_name(&name) {
            Ok(f) => f,
            Err(zip::result::ZipError::FileNotFound) => return Ok(None),
            Err(e) => {
                return Err(Error::Archive {
                    path: self.path.clone(),
                    what: format!("record {name}: {e}"),
                })
            }
        };
        if f.size() > limit {
            return Err(Error::Archive {
                path: self.path.clone(),
                what: format!(
                    "record {name} is {} bytes, over the limit of {limit}",
                    f.size()
                ),
            });
        }
        let mut buf = Vec::with_capacity(f.size() as usize);
        f.read_to_end(&mut buf).map_err(|e| Error::Archive {
            path: self.path.clone(),
            what: format!("record {name}: {e}"),
        })?;
        Ok(Some(buf))
    }

    /// Parse the program `models/model.json`.
    pub fn program(&mut self) -> Result<ExportedProgram> {
        let record = "models/model.json";
        let json = self.read(record, MAX_JSON)?.ok_or_else(|| Error::Archive {
            path: self.path.clone(),
            what: format!("the archive has no {}{record}", self.root),
        })?;
        schema::parse_program(&json).map_err(|what| Error::Schema {
            path: self.path.clone(),
            record: format!("{}{record}", self.root),
            what,
        })
    }

    /// TEMPORARY (until `torchport::open` gives constant tensors): every tensor constant by
    /// its constant name, from `data/constants/`.
    pub fn read_constants(&mut self) -> Result<HashMap<String, Tensor>> {
        let mut out = HashMap::new();
        {
            let (dir, cfg) = ("data/constants/", "model_constants_config.json");
            let Some(json) = self.read(&format!("{dir}{cfg}"), MAX_JSON)? else {
                return Ok(out);
            };
            let config: PayloadConfig =
                serde_json::from_slice(&json).map_err(|e| Error::Schema {
                    path: self.path.clone(),
                    record: format!("{}{dir}{cfg}", self.root),
                    what: e.to_string(),
                })?;
            for (fqn, meta) in config.config {
                let werr = |what: String| Error::Weight {
                    name: fqn.clone(),
                    what,
                };
                if meta.use_pickle {
                    return Err(werr(
                        "pickled payloads (custom objects, tensor subclasses) are not supported"
                            .into(),
                    ));
                }
                let tm = meta
                    .tensor_meta
                    .ok_or_else(|| werr("the payload has no tensor metadata".into()))?;
                let ints = |v: &[SymInt]| -> Result<Vec<usize>> {
                    v.iter()
                        .map(|s| match s {
                            SymInt::AsInt(i) if *i >= 0 => Ok(*i as usize),
                            _ => Err(werr("a size or stride is symbolic or negative".into())),
                        })
                        .collect()
                };
                let sizes = ints(&tm.sizes)?;
                let strides = ints(&tm.strides)?;
                let offset = ints(std::slice::from_ref(&tm.storage_offset))?[0];
                let bytes = self
                    .read(&format!("{dir}{}", meta.path_name), u64::MAX)?
                    .ok_or_else(|| werr(format!("record {dir}{} is missing", meta.path_name)))?;
                let name = dtype::name(tm.dtype);
                let size = elem_size(name)
                    .ok_or_else(|| werr(format!("dtype {name} is not supported")))?;
                let bytes = gather_strided(&bytes, size, &sizes, &strides, offset)
                    .ok_or_else(|| werr(format!(
                        "sizes {sizes:?}, strides {strides:?}, offset {offset} reach outside its {} bytes",
                        bytes.len()
                    )))?;
                let t = tensor_from_bytes(&bytes, name, &sizes).map_err(werr)?;
                out.insert(fqn, t);
            }
        }
        Ok(out)
    }
}

/// Parameters and persistent buffers by state_dict name, read by torchport's `.pt2` reader.
pub fn read_weights(path: &Path) -> Result<HashMap<String, Tensor>> {
    let ckpt = torchport::open(path).map_err(|e| Error::Archive {
        path: path.to_path_buf(),
        what: e.to_string(),
    })?;
    let mut out = HashMap::new();
    for t in ckpt.tensors() {
        let werr = |what: String| Error::Weight {
            name: t.name.clone(),
            what,
        };
        if let torchport::TensorData::Unsupported { what } = &t.data {
            return Err(werr(format!("{what} is not supported")));
        }
        let bytes = ckpt.data(t).map_err(|e| werr(e.to_string()))?;
        let tensor = tensor_from_bytes(&bytes, t.dtype.name(), &t.shape).map_err(werr)?;
        out.insert(t.name.clone(), tensor);
    }
    Ok(out)
}

/// Bytes per element of a torch dtype name the runtime reads.
pub fn elem_size(name: &str) -> Option<usize> {
    Some(match name {
        "bool" | "uint8" | "int8" => 1,
        "int16" | "float16" | "bfloat16" => 2,
        "int32" | "float32" => 4,
        "int64" | "float64" => 8,
        _ => return None,
    })
}

/// The elements of a strided view, contiguous, or `None` if the view reaches outside `data`.
pub fn gather_strided(
    data: &[u8],
    elem: usize,
    sizes: &[usize],
    strides: &[usize],
    offset: usize,
) -> Option<Vec<u8>> {
    let n = sizes.iter().try_fold(1usize, |a, &s| a.checked_mul(s))?;
    if n == 0 {
        return Some(Vec::new());
    }
    let last = sizes
        .iter()
        .zip(strides)
        .try_fold(offset, |acc, (&s, &st)| {
            acc.checked_add((s - 1).checked_mul(st)?)
        })?;
    if last.checked_add(1)?.checked_mul(elem)? > data.len() || sizes.len() != strides.len() {
        return None;
    }
    let contiguous = {
        let mut expect = 1;
        let mut ok = true;
        for (&s, &st) in sizes.iter().zip(strides).rev() {
            if s != 1 && st != expect {
                ok = false;
            }
            expect *= s;
        }
        ok
    };
    if contiguous {
        return Some(data[offset * elem..(offset + n) * elem].to_vec());
    }
    let mut out = Vec::with_capacity(n * elem);
    let mut idx = vec![0usize; sizes.len()];
    for _ in 0..n {
        let at = offset + idx.iter().zip(strides).map(|(i, s)| i * s).sum::<usize>();
        out.extend_from_slice(&data[at * elem..(at + 1) * elem]);
        for d in (0..sizes.len()).rev() {
            idx[d] += 1;
            if idx[d] < sizes[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Some(out)
}

/// A runtime tensor from contiguous little-endian bytes of torch dtype `name`
/// (floats become f32, ints i64, bool u8).
pub fn tensor_from_bytes(
    bytes: &[u8],
    name: &str,
    shape: &[usize],
) -> std::result::Result<Tensor, String> {
    let dev = Device::Cpu;
    let n: usize = shape.iter().product();
    let size = elem_size(name).ok_or_else(|| format!("dtype {name} is not supported"))?;
    if bytes.len() != n * size {
        return Err(format!(
            "{} bytes do not hold {n} elements of {name}",
            bytes.len()
        ));
    }
    let e = |e: candle_core::Error| e.to_string();
    let raw = |d: DType| Tensor::from_raw_buffer(bytes, d, shape, &dev).map_err(e);
    Ok(match name {
        "float32" => raw(DType::F32)?,
        "float16" => raw(DType::F16)?.to_dtype(DType::F32).map_err(e)?,
        "bfloat16" => raw(DType::BF16)?.to_dtype(DType::F32).map_err(e)?,
        "float64" => raw(DType::F64)?.to_dtype(DType::F32).map_err(e)?,
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
        other => return Err(format!("dtype {other} is not supported")),
    })
}
