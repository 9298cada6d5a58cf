//! Writers: safetensors, numpy `.npz` and `torch.save` zip (`.pt`) files from a list of
//! [`OutTensor`]s.
//!
//! Every writer streams: it first works out the whole layout from names, dtypes and shapes,
//! checks that the format can hold every tensor (before anything is created), then asks each
//! tensor for its bytes in turn and writes them, so memory use is about one tensor, not the
//! file. (The safetensors writer copies large tensors that lie unchanged in a memory-mapped
//! input file to file instead, `copy_file_range` on Linux, and asks the OS to start writing
//! them to disk at once so the final sync has little left to do.) Output is atomic (see [`atomic`]): an unnamed file (Linux `O_TMPFILE`) or a
//! temporary file beside the destination, synced and put into place when complete; a failed,
//! interrupted or killed write leaves no partial file and, where the filesystem allows
//! unnamed files, no temporary file either. An input is never overwritten.
//! [`activations`] writes a model's recorded intermediate outputs for a layer-by-layer
//! comparison with PyTorch's.
//!
//! Quantized tensors (`qint8`, `quint8`, `qint32` with their [`crate::Quant`]): the `.pt`
//! writer keeps them quantized (`torch._utils._rebuild_qtensor`, loaded back by torch as the
//! same quantized tensor); safetensors and npz have no quantized types and store each as its
//! integer representation plus `NAME.scale`, `NAME.zero_point` and, per channel, `NAME.axis`
//! (see [`crate::quant`] and [`stored_tensors`]).
//!
//! ```no_run
//! use torchport::write::{write, OutputFormat, WriteOptions};
//! let ckpt = torchport::open("model.pt")?;
//! let opts = WriteOptions {
//!     metadata: torchport::write::metadata_from_values(ckpt.values()),
//!     inputs: vec![ckpt.path().to_path_buf()],
//!     ..WriteOptions::default()
//! };
//! write("model.safetensors", OutputFormat::Safetensors, &ckpt.out_tensors(), opts)?;
//! # Ok::<(), torchport::Error>(())
//! ```

use std::collections::HashSet;
use std::fmt;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::dtype::DType;
use crate::error::{Error, Remedy, Result};
use crate::out::OutTensor;
use crate::value::Value;

pub mod activations;
pub mod atomic;
mod npz;
mod pickle;
mod safetensors;
mod torch_zip;

pub use crate::format::numpy::npy_descr;
pub use crate::format::safetensors::safetensors_dtype;
pub use atomic::{check_not_input, AtomicFile};

/// Size of the output buffer: large enough to make small tensors cheap, small next to a
/// tensor (large slices bypass it and go straight to the file).
const BUFFER: usize = 4 << 20;

/// A format torchport writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OutputFormat {
    /// safetensors (`.safetensors`).
    Safetensors,
    /// numpy archive of `.npy` arrays (`.npz`).
    Npz,
    /// `torch.save` zip archive (`.pt`), loadable with `torch.load(weights_only=True)`.
    TorchZip,
}

impl OutputFormat {
    /// Every output format.
    pub const ALL: [OutputFormat; 3] = [
        OutputFormat::Safetensors,
        OutputFormat::Npz,
        OutputFormat::TorchZip,
    ];

    /// The format for a file name's extension (`.safetensors`, `.npz`, `.pt`; any case).
    pub fn from_path(path: &Path) -> Option<OutputFormat> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        OutputFormat::ALL.into_iter().find(|f| f.extension() == ext)
    }

    /// The file extension, without the dot.
    pub fn extension(self) -> &'static str {
        match self {
            OutputFormat::Safetensors => "safetensors",
            OutputFormat::Npz => "npz",
            OutputFormat::TorchZip => "pt",
        }
    }

    /// `Ok` when the format can hold tensors of `dtype`, otherwise why not.
    pub fn check_dtype(self, dtype: DType) -> std::result::Result<(), String> {
        match self {
            OutputFormat::Safetensors => safetensors_dtype(dtype)
                .map(|_| ())
                .ok_or_else(|| format!("safetensors has no {dtype} type")),
            OutputFormat::Npz => npy_descr(dtype)
                .map(|_| ())
                .ok_or_else(|| format!("numpy has no {dtype} type")),
            OutputFormat::TorchZip => torch_zip::check_dtype(dtype),
        }
    }
}

impl fmt::Display for OutputFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OutputFormat::Safetensors => "safetensors",
            OutputFormat::Npz => "npz",
            OutputFormat::TorchZip => "torch.save zip",
        })
    }
}

/// Called after each tensor is written, with its name and size in bytes.
pub type Progress<'p> = &'p mut dyn FnMut(&str, u64);

/// What to write besides the tensors, and how.
#[derive(Default)]
pub struct WriteOptions<'p> {
    /// String metadata (safetensors `__metadata__`; the other formats have no place for it
    /// and ignore it). See [`metadata_from_values`].
    pub metadata: Vec<(String, String)>,
    /// Files that must not be overwritten (the inputs); compared by resolved path and, on
    /// unix, by device and inode, so links are caught.
    pub inputs: Vec<PathBuf>,
    /// Called after each tensor is written.
    pub progress: Option<Progress<'p>>,
}

impl fmt::Debug for WriteOptions<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteOptions")
            .field("metadata", &self.metadata)
            .field("inputs", &self.inputs)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

/// What a write produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    /// Number of tensors written.
    pub tensors: usize,
    /// Bytes of tensor data written.
    pub data_bytes: u64,
    /// Size of the output file.
    pub file_bytes: u64,
    /// Temporary files of an earlier write to the same name that was killed (see
    /// [`atomic::stale_temp_files`]), removed once this write succeeded.
    pub removed_stale: Vec<PathBuf>,
}

/// Write `tensors` to `path` in `format`, atomically (see the module docs).
pub fn write(
    path: impl AsRef<Path>,
    format: OutputFormat,
    tensors: &[OutTensor<'_>],
    mut opts: WriteOptions<'_>,
) -> Result<Written> {
    let path = path.as_ref();
    let stored = stored_tensors(path, format, tensors)?;
    let tensors = stored.as_slice();
    check(path, format, tensors)?;
    let inputs: Vec<&Path> = opts.inputs.iter().map(PathBuf::as_path).collect();
    let mut file = AtomicFile::create(path, &inputs)?;
    let mut noop = |_: &str, _: u64| {};
    let progress: Progress<'_> = match opts.progress.take() {
        Some(p) => p,
        None => &mut noop,
    };
    let data_bytes = {
        let mut w = BufWriter::with_capacity(BUFFER, file.file());
        let n = match format {
            OutputFormat::Safetensors => {
                safetensors::write(&mut w, path, tensors, &opts.metadata, progress)?
            }
            OutputFormat::Npz => npz::write(&mut w, path, tensors, progress)?,
            OutputFormat::TorchZip => torch_zip::write(&mut w, path, tensors, progress)?,
        };
        w.flush().map_err(|e| Error::write_io(path, e))?;
        n
    };
    let file_bytes = file
        .file()
        .metadata()
        .map_err(|e| Error::write_io(path, e))?
        .len();
    file.commit()?;
    Ok(Written {
        tensors: tensors.len(),
        data_bytes,
        file_bytes,
        removed_stale: atomic::remove_stale(atomic::stale_temp_files(path)),
    })
}

/// The tensors `format` stores for `tensors`, in order: for safetensors and npz each quantized
/// tensor becomes its integer representation followed by its parameters (see
/// [`crate::quant::split`]; a parameter name that another tensor already has is an error);
/// everything else, and everything for `.pt`, is passed through unchanged. Nothing is read.
pub fn stored_tensors<'b>(
    path: &Path,
    format: OutputFormat,
    tensors: &'b [OutTensor<'_>],
) -> Result<Vec<OutTensor<'b>>> {
    let out = match format {
        OutputFormat::Safetensors | OutputFormat::Npz => crate::quant::split(tensors),
        OutputFormat::TorchZip => Ok(tensors.iter().map(OutTensor::borrowed).collect()),
    };
    out.map_err(|e| name_output(path, e))
}

/// Check, before anything is created, that every tensor can be written (as
/// [`stored_tensors`] stores it): unique names, a dtype the format holds, quantization
/// parameters for quantized tensors, a size that does not overflow.
pub fn validate(path: &Path, format: OutputFormat, tensors: &[OutTensor<'_>]) -> Result<()> {
    check(path, format, &stored_tensors(path, format, tensors)?)
}

/// [`validate`] for tensors [`stored_tensors`] has already expanded.
fn check(path: &Path, format: OutputFormat, tensors: &[OutTensor<'_>]) -> Result<()> {
    let mut seen = HashSet::with_capacity(tensors.len());
    for t in tensors {
        if !seen.insert(t.name.as_str()) {
            return Err(Error::unwritable(
                path,
                &t.name,
                format!(
                    "two tensors are named {:?}; rename one or leave one out",
                    t.name
                ),
                Remedy::LeaveOut,
            ));
        }
        if crate::quant::int_dtype(t.dtype).is_some() && t.quant().is_none() {
            return Err(Error::write(
                path,
                format!(
                    "tensor {} is {} but has no scale and zero point (a transformation rebuilt \
                     it); dequantize it before transforming it, or leave it out",
                    t.name, t.dtype
                ),
            ));
        }
        if let Err(why) = format.check_dtype(t.dtype) {
            let (hint, remedy) = if t.dtype.is_float() {
                (
                    "cast it to a floating-point type the format holds (e.g. float32) or leave it out",
                    Remedy::CastOrLeaveOut,
                )
            } else {
                ("leave it out", Remedy::LeaveOut)
            };
            return Err(Error::unwritable(
                path,
                &t.name,
                format!(
                    "tensor {} is {}, which a .{} file cannot hold ({why}); {hint}",
                    t.name,
                    t.dtype,
                    format.extension()
                ),
                remedy,
            ));
        }
        nbytes(path, t)?;
    }
    Ok(())
}

/// A tensor's size in bytes, with checked arithmetic.
pub(crate) fn nbytes(path: &Path, t: &OutTensor<'_>) -> Result<u64> {
    t.shape
        .iter()
        .try_fold(t.dtype.size() as u64, |acc, &d| acc.checked_mul(d as u64))
        .ok_or_else(|| {
            Error::write(
                path,
                format!("tensor {} has a size {:?} that overflows", t.name, t.shape),
            )
        })
}

/// The non-tensor values a format's string metadata can keep: ints, floats, strings, bools
/// and numpy scalars of those, as strings under their names (`True`/`False` for bools,
/// Python's spelling; floats as Python's `repr`). `None`, objects, globals and empty
/// containers are left out, and so are the `_metadata` entries (module versions) torch
/// attaches to state dicts.
pub fn metadata_from_values(values: &[(String, Value)]) -> Vec<(String, String)> {
    fn text(v: &Value) -> Option<String> {
        match v {
            Value::Bool(b) => Some(if *b { "True" } else { "False" }.to_string()),
            Value::Int(i) => Some(i.to_string()),
            Value::BigInt(s) => Some(s.clone()),
            Value::Float(x) => Some(float_text(*x)),
            Value::Str(s) => Some(s.clone()),
            Value::Numpy { value, .. } => text(value),
            _ => None,
        }
    }
    values
        .iter()
        .filter(|(k, _)| !k.split('.').any(|part| part == "_metadata"))
        .filter_map(|(k, v)| Some((k.clone(), text(v)?)))
        .collect()
}

/// A float as Python's `repr` writes it for the common cases (`0.5`, `1e-05`, `inf`, `nan`).
fn float_text(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    let s = format!("{x:?}");
    // Rust writes 1e-5 and 1e20; Python writes 1e-05 and 1e+20.
    match s.split_once('e') {
        Some((m, e)) => {
            let (sign, digits) = match e.strip_prefix('-') {
                Some(d) => ("-", d),
                None => ("+", e),
            };
            format!("{m}e{sign}{digits:0>2}")
        }
        None => s,
    }
}

/// Write `bytes` to `w`, naming `path` in the error.
pub(crate) fn put(w: &mut impl Write, path: &Path, bytes: &[u8]) -> Result<()> {
    w.write_all(bytes).map_err(|e| Error::write_io(path, e))
}

/// Ask a tensor for its bytes, naming the output and the tensor in the error.
pub(crate) fn tensor_bytes<'a>(
    path: &Path,
    t: &OutTensor<'a>,
) -> Result<std::borrow::Cow<'a, [u8]>> {
    t.data().map_err(|e| name_output(path, e))
}

/// Name the output file in a tensor error raised without one.
fn name_output(path: &Path, e: Error) -> Error {
    match e {
        Error::Tensor {
            path: p,
            tensor,
            what,
        } if p.as_os_str().is_empty() => Error::Tensor {
            path: path.to_path_buf(),
            tensor,
            what,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_by_extension() {
        let f = |p: &str| OutputFormat::from_path(Path::new(p));
        assert_eq!(f("a/b.safetensors"), Some(OutputFormat::Safetensors));
        assert_eq!(f("x.NPZ"), Some(OutputFormat::Npz));
        assert_eq!(f("m.pt"), Some(OutputFormat::TorchZip));
        assert_eq!(f("m.bin"), None);
        assert_eq!(f("m"), None);
    }

    #[test]
    fn metadata_text() {
        let values = vec![
            ("epoch".to_string(), Value::Int(3)),
            ("lr".to_string(), Value::Float(1e-5)),
            ("big".to_string(), Value::Float(1e20)),
            ("acc".to_string(), Value::Float(0.875)),
            ("name".to_string(), Value::Str("run-1".into())),
            ("flag".to_string(), Value::Bool(true)),
            ("none".to_string(), Value::None),
            (
                "np".to_string(),
                Value::Numpy {
                    dtype: "float64".into(),
                    value: Box::new(Value::Float(0.5)),
                },
            ),
            (
                "obj".to_string(),
                Value::Object("argparse.Namespace".into()),
            ),
            ("sd._metadata.fc.version".to_string(), Value::Int(1)),
        ];
        let m = metadata_from_values(&values);
        let get = |k: &str| m.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("epoch"), Some("3"));
        assert_eq!(get("lr"), Some("1e-05"));
        assert_eq!(get("big"), Some("1e+20"));
        assert_eq!(get("acc"), Some("0.875"));
        assert_eq!(get("name"), Some("run-1"));
        assert_eq!(get("flag"), Some("True"));
        assert_eq!(get("np"), Some("0.5"));
        assert_eq!(get("none"), None);
        assert_eq!(get("obj"), None);
        assert_eq!(m.len(), 7);
    }
}
