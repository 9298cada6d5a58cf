//! Choosing and casting what a conversion writes — the library side of `torchport convert`
//! (`--key`, `--include`, `--exclude`, `--dtype`), so build scripts get the same behaviour.
//!
//! Order of operations: `key` picks a sub-tree and strips its prefix; `include` / `exclude`
//! then match the remaining names (a regex matching anywhere in the name; anchor it with
//! `^…$` for whole names); `dequantize` turns quantized tensors into float32 (as torch's
//! `dequantize()`); `dtype` casts the floating-point tensors that remain, dequantized ones
//! included (integer, bool, complex and quantized tensors keep their dtype). Quantized
//! tensors that are not dequantized keep their scale and zero point; see [`crate::quant`]
//! for how safetensors and npz store them. Non-tensor values go through the same `key` /
//! `include` / `exclude` filters and become string metadata.
//!
//! [`crate::convert`] runs a selection, then rules, a target check and the write:
//!
//! ```no_run
//! use torchport::convert::convert;
//! use torchport::select::ConvertOptions;
//! let opts = ConvertOptions {
//!     key: Some("state_dict".into()),
//!     dtype: Some(torchport::DType::F16),
//!     ..ConvertOptions::default()
//! };
//! convert("ckpt.pt", "model.safetensors", &opts.into())?;
//! # Ok::<(), torchport::Error>(())
//! ```

use std::borrow::Cow;
use std::path::Path;

use regex::Regex;

use crate::cast;
use crate::checkpoint::Checkpoint;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::out::OutTensor;
use crate::tensor::{TensorData, TensorInfo};
use crate::write::metadata_from_values;

/// The dtypes a selection can cast to: the floating-point types [`cast::cast`] writes.
pub const CAST_TARGETS: [DType; 4] = [DType::F16, DType::BF16, DType::F32, DType::F64];

/// What to take from a checkpoint, and how to cast it.
#[derive(Clone, Debug, Default)]
pub struct ConvertOptions {
    /// Keep only names under this key (`state_dict` keeps `state_dict.*`) and strip the
    /// `key.` prefix.
    pub key: Option<String>,
    /// Keep only names this regex matches (after `key`).
    pub include: Option<Regex>,
    /// Leave out names this regex matches (after `key`).
    pub exclude: Option<Regex>,
    /// Cast floating-point tensors to this dtype (one of [`CAST_TARGETS`]); rounding as in
    /// [`cast`]: to nearest, ties to even; values beyond float16's range become infinities,
    /// as in torch.
    pub dtype: Option<DType>,
    /// Write quantized tensors (`qint8`, `quint8`, `qint32`) as float32, equal to torch's
    /// `Tensor.dequantize()` (see [`crate::quant::dequantize`]), instead of as integers plus
    /// their quantization parameters.
    pub dequantize: bool,
}

/// What a conversion will write.
pub struct Selection<'a> {
    /// The tensors, renamed and cast; their data is read when written.
    pub tensors: Vec<OutTensor<'a>>,
    /// The dtype each tensor had in the source (parallel to `tensors`).
    pub source_dtypes: Vec<DType>,
    /// String metadata: `format` = `pt` (the safetensors convention that transformers
    /// checks) and then the selected non-tensor values (see
    /// [`crate::write::metadata_from_values`]).
    pub metadata: Vec<(String, String)>,
    /// Selected tensors that have no data to write (meta, sparse…), with why; left out.
    pub without_data: Vec<(String, String)>,
}

impl std::fmt::Debug for Selection<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Selection")
            .field("tensors", &self.tensors)
            .field("metadata", &self.metadata)
            .field("without_data", &self.without_data)
            .finish()
    }
}

impl Selection<'_> {
    /// Total bytes of tensor data that will be written.
    pub fn total_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.nbytes() as u64).sum()
    }
}

/// The first component (before the first `.`) of every name, in first-seen order.
pub fn top_level_keys(ckpt: &Checkpoint) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    let names = ckpt
        .tensors()
        .iter()
        .map(|t| t.name.as_str())
        .chain(ckpt.values().iter().map(|(n, _)| n.as_str()));
    for name in names {
        let first = name.split('.').next().unwrap_or(name);
        if !keys.iter().any(|k| k == first) {
            keys.push(first.to_string());
        }
    }
    keys
}

impl ConvertOptions {
    /// The output name for `name`, or `None` when the options leave it out.
    pub fn rename(&self, name: &str) -> Option<String> {
        let name = match &self.key {
            Some(k) => name.strip_prefix(k.as_str())?.strip_prefix('.')?,
            None => name,
        };
        if let Some(re) = &self.include {
            if !re.is_match(name) {
                return None;
            }
        }
        if let Some(re) = &self.exclude {
            if re.is_match(name) {
                return None;
            }
        }
        Some(name.to_string())
    }

    /// Apply the options to a checkpoint.
    pub fn select<'a>(&self, ckpt: &'a Checkpoint) -> Result<Selection<'a>> {
        if let Some(to) = self.dtype {
            if !CAST_TARGETS.contains(&to) {
                return Err(Error::Select {
                    path: ckpt.path().to_path_buf(),
                    what: format!(
                        "cannot cast to {to}; casts go to a floating-point type: float16, bfloat16, float32 or float64"
                    ),
                });
            }
        }
        if let Some(k) = &self.key {
            let prefix = format!("{k}.");
            let found = ckpt.tensors().iter().any(|t| t.name.starts_with(&prefix))
                || ckpt.values().iter().any(|(n, _)| n.starts_with(&prefix));
            if !found {
                let leaf = ckpt.tensor(k).is_some() || ckpt.values().iter().any(|(n, _)| n == k);
                let what = if leaf {
                    "is a single entry, not a sub-tree of tensors"
                } else {
                    "does not exist"
                };
                return Err(Error::Select {
                    path: ckpt.path().to_path_buf(),
                    what: format!(
                        "key {k:?} {what}; its top-level keys are: {}",
                        top_level_keys(ckpt).join(", ")
                    ),
                });
            }
        }
        let mut sel = Selection {
            tensors: Vec::new(),
            source_dtypes: Vec::new(),
            metadata: vec![("format".to_string(), "pt".to_string())],
            without_data: Vec::new(),
        };
        for t in ckpt.tensors() {
            let Some(name) = self.rename(&t.name) else {
                continue;
            };
            match &t.data {
                TensorData::Strided { .. } => {}
                TensorData::Meta => {
                    sel.without_data
                        .push((name, "a meta tensor (saved without data)".into()));
                    continue;
                }
                TensorData::Unsupported { what } => {
                    sel.without_data.push((name, what.clone()));
                    continue;
                }
            }
            let out = if self.dequantize && t.dtype.is_quantized() {
                dequantized_tensor(ckpt, t, name)?
            } else {
                let mut out = OutTensor::from_checkpoint(ckpt, t);
                out.name = name;
                out
            };
            sel.source_dtypes.push(t.dtype);
            sel.tensors.push(match self.dtype {
                Some(to) => cast_out(out, to, ckpt.path()),
                None => out,
            });
        }
        let values: Vec<_> = ckpt
            .values()
            .iter()
            .filter_map(|(n, v)| Some((self.rename(n)?, v.clone())))
            .collect();
        for (k, v) in metadata_from_values(&values) {
            match sel.metadata.iter_mut().find(|(n, _)| *n == k) {
                Some(slot) => slot.1 = v,
                None => sel.metadata.push((k, v)),
            }
        }
        Ok(sel)
    }
}

/// `t` cast to `to` when it is read, if it is a floating-point tensor of another dtype (the
/// rule of [`ConvertOptions::dtype`]); other tensors are returned as they are, file range and
/// quantization parameters included. `path` names the input file in errors.
pub fn cast_out<'a>(t: OutTensor<'a>, to: DType, path: &Path) -> OutTensor<'a> {
    let from = t.dtype;
    if !from.is_float() || from == to {
        return t;
    }
    let (name, shape, path) = (t.name.clone(), t.shape.clone(), path.to_path_buf());
    let t = std::rc::Rc::new(t);
    let release = std::rc::Rc::clone(&t);
    OutTensor::new(name.clone(), to, shape, move || {
        let bytes = t.data()?;
        cast::cast(&bytes, from, to)
            .map(Cow::Owned)
            .map_err(|e| Error::Tensor {
                path: path.clone(),
                tensor: name.clone(),
                what: format!("cannot be cast from {from} to {to}: {e}"),
            })
    })
    .with_release(move || release.release())
}

/// A quantized checkpoint tensor under a new name, dequantized to float32 when it is read.
fn dequantized_tensor<'a>(
    ckpt: &'a Checkpoint,
    t: &'a TensorInfo,
    name: String,
) -> Result<OutTensor<'a>> {
    let bad = |what: String| Error::Select {
        path: ckpt.path().to_path_buf(),
        what: format!("tensor {} cannot be dequantized: {what}", t.name),
    };
    let Some(quant) = &t.quant else {
        return Err(bad("it has no scale and zero point".into()));
    };
    if crate::quant::int_dtype(t.dtype).is_none() {
        return Err(bad(format!(
            "torchport dequantizes qint8, quint8 and qint32, not {}",
            t.dtype
        )));
    }
    crate::quant::check(quant, &t.shape).map_err(bad)?;
    Ok(OutTensor::new(name, DType::F32, t.shape.clone(), move || {
        let fail = |what: String| Error::Tensor {
            path: ckpt.path().to_path_buf(),
            tensor: t.name.clone(),
            what,
        };
        let bytes = ckpt.data(t)?;
        let f = crate::quant::dequantize(&bytes, t.dtype, &t.shape, quant)
            .map_err(|e| fail(format!("cannot be dequantized: {e}")))?;
        Ok(Cow::Owned(f))
    })
    .with_release(move || ckpt.release(t)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renames() {
        let o = ConvertOptions {
            key: Some("state_dict".into()),
            include: Some(Regex::new(r"^fc\.").unwrap()),
            exclude: Some(Regex::new(r"bias$").unwrap()),
            dtype: None,
            dequantize: false,
        };
        assert_eq!(
            o.rename("state_dict.fc.weight").as_deref(),
            Some("fc.weight")
        );
        assert_eq!(o.rename("state_dict.fc.bias"), None);
        assert_eq!(o.rename("state_dict.conv.weight"), None);
        assert_eq!(o.rename("state_dictx.fc.weight"), None);
        assert_eq!(o.rename("fc.weight"), None);
        assert_eq!(
            ConvertOptions::default().rename("a.b").as_deref(),
            Some("a.b")
        );
    }

    #[test]
    fn cast_reports_the_element_index() {
        let n = (1 << 16) + 5;
        let mut vals = vec![1.0f32; n];
        vals[n - 1] = 1e10;
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let h = cast::cast(&bytes, DType::F32, DType::F16).unwrap();
        assert_eq!(h.len(), n * 2);
        // 1e10 overflows float16 to +inf, as in torch.
        assert_eq!(&h[h.len() - 2..], &half::f16::INFINITY.to_le_bytes());
        match cast::cast(&bytes, DType::F32, DType::I16) {
            Err(cast::CastError::OutOfRange { index, .. }) => assert_eq!(index, n - 1),
            other => panic!("{other:?}"),
        }
    }
}
