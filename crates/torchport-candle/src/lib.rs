//! # torchport-candle
//!
//! A candle-nn [`VarBuilder`] over any checkpoint torchport reads (`torch.save` files and every
//! other format the `torchport` crate opens).
//!
//! ```no_run
//! use candle_core::{DType, Device};
//!
//! let vb = torchport_candle::TorchportBackend::open("mlp.pt")?
//!     .rename(r"^0\.", "fc1.")?
//!     .rename(r"^2\.", "fc2.")?
//!     .into_var_builder(DType::F32, &Device::Cpu);
//! let fc1 = candle_nn::linear(6, 16, vb.pp("fc1"))?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! - Lazy: opening reads only the file's directory; each tensor is read when the model asks
//!   for it.
//! - One copy: a tensor's bytes are borrowed from the memory-mapped file and copied once, into
//!   the candle tensor (a strided or big-endian tensor is gathered first). Dtypes candle has
//!   no element for (float8 variants other than e4m3fn) are decoded to f32.
//! - Bounded memory: once copied, a tensor's memory-mapped pages are released
//!   ([`Checkpoint::release`]), so building a model holds the model plus the tensor being
//!   read, never the whole mapped file.
//! - Rules: torchport's remap language (renames, splits, transposes, presets, TOML rule
//!   files) runs over the checkpoint's names before lookup, so a PyTorch `nn.Sequential`
//!   (`0.weight`) can feed a candle model that names its layers (`fc1.weight`). A tensor the
//!   rules only renamed is read straight from the file.
//! - Tied weights (one storage saved under two names, `Checkpoint::tied`) are read once: every
//!   name of the group gets the same candle tensor.
//! - Errors name the tensor that is missing and the closest names present, or the shape the
//!   model wanted and the shape the file has.
#![deny(missing_docs)]

mod activations;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::{SimpleBackend, VarBuilder};
use torchport::remap::{self, Op, Rule, RuleSet, TensorMeta};
use torchport::{Checkpoint, OutTensor};

pub use activations::Activations;

/// Errors of this crate's own API (candle's `VarBuilder` calls return `candle_core::Error`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The checkpoint could not be opened.
    #[error(transparent)]
    Read(Box<torchport::Error>),
    /// A rule is invalid or failed (the message names the rule).
    #[error("{0}")]
    Rules(Box<torchport::Error>),
    /// Writing an activations file failed.
    #[error("{path}: {message}")]
    Write {
        /// The file.
        path: std::path::PathBuf,
        /// What failed.
        message: String,
    },
}

impl From<torchport::Error> for Error {
    fn from(e: torchport::Error) -> Self {
        Error::Read(Box::new(e))
    }
}

fn rules_error(e: torchport::Error) -> Error {
    Error::Rules(Box::new(e))
}

/// One tensor a model can ask for: where it comes from.
#[derive(Clone, Debug)]
struct Entry {
    /// The checkpoint tensor, when the rules at most renamed it.
    direct: Option<usize>,
    /// The checkpoint tensors it is made from (indices into `ckpt.tensors()`).
    sources: Vec<usize>,
}

/// A candle-nn [`SimpleBackend`] serving tensors from a torchport [`Checkpoint`].
#[derive(Clone, Debug)]
pub struct TorchportBackend {
    ckpt: Arc<Checkpoint>,
    rules: RuleSet,
    /// `rules` with every preset replaced by the rules it generated for this checkpoint, so a
    /// derived tensor is made by running them over its own sources only.
    resolved: RuleSet,
    /// Name after the rules -> where it comes from.
    index: HashMap<String, Entry>,
    /// For each checkpoint tensor in a tied group (the same storage and view under several
    /// names, see [`Checkpoint::tied`]), the group's first tensor.
    tied: Vec<Option<usize>>,
    /// Tensors read for a tied group, by (first tensor of the group, dtype): the other names
    /// get the same candle tensor (one copy in memory).
    shared: Arc<Mutex<HashMap<(usize, DType), Tensor>>>,
}

impl TorchportBackend {
    /// Open a checkpoint of any format torchport reads.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        Ok(Self::new(torchport::open(path)?))
    }

    /// Serve an already opened checkpoint.
    pub fn new(ckpt: impl Into<Arc<Checkpoint>>) -> Self {
        let ckpt = ckpt.into();
        let index = ckpt
            .tensors()
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let entry = Entry {
                    direct: Some(i),
                    sources: vec![i],
                };
                (t.name.clone(), entry)
            })
            .collect();
        let mut tied = ckpt.tied();
        for i in 0..tied.len() {
            if let Some(head) = tied[i] {
                tied[head] = Some(head);
            }
        }
        TorchportBackend {
            ckpt,
            rules: RuleSet::new(),
            resolved: RuleSet::new(),
            index,
            tied,
            shared: Arc::default(),
        }
    }

    /// Rename checkpoint tensors before lookup: the part of a name the regular expression
    /// `pattern` matches is replaced by `to` (`$1` names a capture group) — a remap `rename`
    /// rule. Rules apply in order.
    pub fn rename(self, pattern: &str, to: &str) -> Result<Self, Error> {
        let rule = Rule::new(pattern, Op::Rename { to: to.into() }).map_err(rules_error)?;
        let mut rules = RuleSet::new();
        rules.push(rule);
        self.rules(rules)
    }

    /// Append remap rules (built in Rust, or read with `RuleSet::from_toml_file`); fails
    /// when a rule does not apply to this checkpoint's names and shapes.
    pub fn rules(mut self, rules: RuleSet) -> Result<Self, Error> {
        self.rules.extend(rules);
        self.reindex()?;
        Ok(self)
    }

    /// Append a remap preset (`strip-prefix`, `lstm-gates`, `gru-gates`, `attention-qkv`,
    /// `burn`, `weight-norm`).
    pub fn preset(mut self, name: &str) -> Result<Self, Error> {
        self.rules.preset(name).map_err(rules_error)?;
        self.reindex()?;
        Ok(self)
    }

    /// Work out, from names and shapes alone, what the rules make of every tensor.
    fn reindex(&mut self) -> Result<(), Error> {
        let metas: Vec<TensorMeta> = self.ckpt.out_tensors().iter().map(TensorMeta::of).collect();
        let ctx = remap::Context {
            modules: self.ckpt.modules(),
            target: None,
        };
        let (_, plan, resolved) =
            remap::plan_resolved(&self.rules, &metas, &ctx).map_err(rules_error)?;
        let position: HashMap<&str, usize> = self
            .ckpt
            .tensors()
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.as_str(), i))
            .collect();
        let mut index = HashMap::with_capacity(plan.targets.len());
        for t in &plan.targets {
            let sources: Vec<usize> = t
                .sources
                .iter()
                .filter_map(|s| position.get(s.as_str()).copied())
                .collect();
            let renamed_only = t.steps.iter().all(|s| s.op.starts_with("rename"));
            let direct = match (renamed_only, sources.as_slice()) {
                (true, [one]) => Some(*one),
                _ => None,
            };
            index
                .entry(t.name.clone())
                .or_insert(Entry { direct, sources });
        }
        self.index = index;
        self.resolved = resolved;
        Ok(())
    }

    /// The checkpoint.
    pub fn checkpoint(&self) -> &Checkpoint {
        &self.ckpt
    }

    /// Every name a model can ask for (after renames), sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.index.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }

    /// A `VarBuilder` over this backend, producing tensors of `dtype` on `device`.
    pub fn into_var_builder(self, dtype: DType, device: &Device) -> VarBuilder<'static> {
        VarBuilder::from_backend(Box::new(self), dtype, device.clone())
    }

    /// The closest names present to `name`, closest first (at most 3).
    pub fn closest(&self, name: &str) -> Vec<&str> {
        let mut scored: Vec<(usize, &str)> = self
            .index
            .keys()
            .map(|k| (remap::edit_distance(name, k), k.as_str()))
            .filter(|(d, k)| *d <= name.len().max(k.len()) / 2)
            .collect();
        scored.sort_unstable();
        scored.into_iter().take(3).map(|(_, k)| k).collect()
    }

    fn missing(&self, name: &str) -> candle_core::Error {
        let close = self.closest(name);
        let hint = if close.is_empty() {
            format!("it holds {} tensors", self.index.len())
        } else {
            format!("closest names present: {}", close.join(", "))
        };
        candle_core::Error::Msg(format!(
            "{}: no tensor named {name}{}; {hint}",
            self.ckpt.path().display(),
            if self.rules.is_empty() {
                ""
            } else {
                " (after renames)"
            },
        ))
    }

    /// Read one tensor as candle's `dtype` on `dev`.
    fn read(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        let entry = self.index.get(name).ok_or_else(|| self.missing(name))?;
        let msg = |what: String| candle_core::Error::Msg(what);
        let path = self.ckpt.path().display();
        // A tied tensor is read once for all its names.
        let group = entry
            .direct
            .and_then(|i| self.tied.get(i).copied().flatten());
        if let Some(g) = group {
            let shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(t) = shared.get(&(g, dtype)) {
                if t.device().same_device(dev) {
                    return Ok(t.clone());
                }
            }
        }
        let t = match entry.direct.and_then(|i| self.ckpt.tensors().get(i)) {
            Some(info) => {
                if info.quant.is_some() {
                    return Err(msg(format!(
                        "{path}: tensor {} is quantized ({}); dequantize it before loading",
                        info.name, info.dtype
                    )));
                }
                let bytes = self.ckpt.data(info).map_err(|e| msg(e.to_string()))?;
                let t = to_tensor(&bytes, info.dtype, &info.shape, dev)
                    .map_err(|e| msg(format!("{path}: tensor {}: {e}", info.name)))?;
                // Copied into candle's storage: the mapped pages are not needed any more.
                self.ckpt.release(info);
                t
            }
            None => {
                // Made by splits, merges, transposes…: run the resolved rules over this
                // tensor's sources only (the presets already decided, over every name, when
                // the backend was built).
                let ctx = remap::Context {
                    modules: self.ckpt.modules(),
                    target: None,
                };
                let tensors = self.ckpt.tensors();
                let inputs = entry
                    .sources
                    .iter()
                    .filter_map(|&i| tensors.get(i))
                    .map(|t| OutTensor::from_checkpoint(&self.ckpt, t))
                    .collect();
                let (outs, _) = remap::apply_with(&self.resolved, inputs, &ctx)
                    .map_err(|e| msg(e.to_string()))?;
                let out = outs
                    .iter()
                    .find(|o| o.name == name)
                    .ok_or_else(|| self.missing(name))?;
                let bytes = out.data().map_err(|e| msg(e.to_string()))?;
                let t = to_tensor(&bytes, out.dtype, &out.shape, dev)
                    .map_err(|e| msg(format!("{path}: tensor {name}: {e}")))?;
                for &i in &entry.sources {
                    if let Some(info) = tensors.get(i) {
                        self.ckpt.release(info);
                    }
                }
                t
            }
        };
        let t = if t.dtype() == dtype {
            t
        } else {
            t.to_dtype(dtype)?
        };
        if let Some(g) = group {
            let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
            shared.insert((g, dtype), t.clone());
        }
        Ok(t)
    }
}

/// Little-endian bytes of `dtype` as a candle tensor: one copy, from the borrowed bytes into
/// candle's storage; dtypes candle lacks are decoded to f32.
fn to_tensor(
    bytes: &[u8],
    dtype: torchport::DType,
    shape: &[usize],
    dev: &Device,
) -> Result<Tensor, String> {
    match candle_dtype(dtype) {
        Some(d) => Tensor::from_raw_buffer(bytes, d, shape, dev).map_err(|e| e.to_string()),
        None => {
            let v = torchport::cast::to_f64(dtype, bytes).map_err(|e| e.to_string())?;
            let v: Vec<f32> = v.into_iter().map(|x| x as f32).collect();
            Tensor::from_vec(v, shape.to_vec(), dev).map_err(|e| e.to_string())
        }
    }
}

/// candle's dtype for a torch dtype, when candle has one.
fn candle_dtype(d: torchport::DType) -> Option<DType> {
    use torchport::DType as T;
    Some(match d {
        T::U8 | T::Bool => DType::U8,
        T::U32 => DType::U32,
        T::I16 => DType::I16,
        T::I32 => DType::I32,
        T::I64 => DType::I64,
        T::BF16 => DType::BF16,
        T::F16 => DType::F16,
        T::F32 => DType::F32,
        T::F64 => DType::F64,
        T::F8E4M3Fn => DType::F8E4M3,
        _ => return None,
    })
}

impl SimpleBackend for TorchportBackend {
    fn get(
        &self,
        s: Shape,
        name: &str,
        _h: candle_nn::Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let t = self.read(name, dtype, dev)?;
        if t.shape() != &s {
            return Err(candle_core::Error::UnexpectedShape {
                msg: format!(
                    "{}: tensor {name} does not have the shape the model expects",
                    self.ckpt.path().display()
                ),
                expected: s,
                got: t.shape().clone(),
            }
            .bt());
        }
        Ok(t)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        self.read(name, dtype, dev)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }
}
