//! Merging a PEFT LoRA adapter into the base model's weights, as PEFT's `merge_and_unload()`
//! does: for each adapted module `M`, `M.weight += scaling · (B·A)` (transposed first when
//! the adapter says `fan_in_fan_out`, as for transformers' `Conv1D`), with `scaling =
//! lora_alpha / r`, or `lora_alpha / √r` under `use_rslora`; `rank_pattern` and
//! `alpha_pattern` give some modules their own `r` and `lora_alpha`.
//!
//! An adapter is a folder holding `adapter_config.json` and `adapter_model.safetensors` (or
//! `adapter_model.bin`), as `PeftModel.save_pretrained` writes it. Its tensors are named
//! `base_model.model.<module>.lora_A.weight` / `.lora_B.weight`; `<module>` is the base
//! model's module path. The arithmetic follows PEFT on the CPU for float32, float16 and
//! bfloat16 bases: the product and the scaling in float32, then the sum in the base weight's
//! dtype. A float64 base gets the same float32 delta added in float64 (PEFT would compute the
//! delta in float64; not checked against it).
//!
//! Supported: LoRA (`peft_type` `LORA`) on 2-D weights (`nn.Linear`, `Conv1D`). Refused, with
//! an error naming what: DoRA, LoRA on embeddings or convolutions, trained biases and
//! `modules_to_save` copies in the adapter, and adapter weights for modules the base does not
//! have.
//!
//! ```no_run
//! use std::sync::Arc;
//! use torchport::convert::{convert, Conversion};
//! use torchport::lora::Lora;
//! let conv = Conversion {
//!     lora: Some(Arc::new(Lora::open("adapter/")?)),
//!     ..Conversion::default()
//! };
//! convert("base.bin", "merged.safetensors", &conv)?;
//! # Ok::<(), torchport::Error>(())
//! ```

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use half::{bf16, f16};
use regex::Regex;
use serde::Deserialize;

use crate::checkpoint::Checkpoint;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::out::OutTensor;
use crate::tensor::TensorInfo;

/// The prefix PEFT gives every adapter tensor: the wrapped model's own names follow it.
const PEFT_PREFIX: &str = "base_model.model.";

/// The parts of `adapter_config.json` a merge needs.
#[derive(Clone, Debug, Deserialize)]
pub struct LoraConfig {
    /// `LORA` for a LoRA adapter.
    pub peft_type: String,
    /// The rank (inner dimension of `B·A`).
    pub r: usize,
    /// The numerator of the scaling.
    pub lora_alpha: f64,
    /// The base weights are stored `[in, out]` (transformers' `Conv1D`): `B·A` is transposed.
    #[serde(default)]
    pub fan_in_fan_out: bool,
    /// Rank-stabilised scaling: `lora_alpha / √r`.
    #[serde(default)]
    pub use_rslora: bool,
    /// Weight-decomposed LoRA, which this merge does not support.
    #[serde(default)]
    pub use_dora: bool,
    /// Per-module ranks, by module-name pattern.
    #[serde(default)]
    pub rank_pattern: BTreeMap<String, usize>,
    /// Per-module alphas, by module-name pattern.
    #[serde(default)]
    pub alpha_pattern: BTreeMap<String, f64>,
}

/// One adapted module: its `A` and `B` tensors in the adapter.
#[derive(Debug)]
struct Pair {
    a: Option<usize>,
    b: Option<usize>,
}

/// An opened LoRA adapter.
#[derive(Debug)]
pub struct Lora {
    path: PathBuf,
    config: LoraConfig,
    adapter: Checkpoint,
    /// Base module path → the indices of its `A` and `B` in `adapter.tensors()`.
    pairs: BTreeMap<String, Pair>,
}

impl Lora {
    /// Open an adapter: a folder with `adapter_config.json` and `adapter_model.safetensors`
    /// (or `adapter_model.bin`), or the weights file itself with the config beside it.
    pub fn open(path: impl AsRef<Path>) -> Result<Lora> {
        let path = path.as_ref();
        let (dir, weights) = if path.is_dir() {
            let w = ["adapter_model.safetensors", "adapter_model.bin"]
                .iter()
                .map(|n| path.join(n))
                .find(|p| p.is_file())
                .ok_or_else(|| {
                    Error::lora(
                        path,
                        "holds neither adapter_model.safetensors nor adapter_model.bin; is it a PEFT adapter folder?",
                    )
                })?;
            (path.to_path_buf(), w)
        } else {
            let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
            (dir, path.to_path_buf())
        };
        let config_path = dir.join("adapter_config.json");
        let text = std::fs::read(&config_path).map_err(|source| Error::Io {
            path: config_path.clone(),
            source,
        })?;
        let config: LoraConfig = serde_json::from_slice(&text).map_err(|e| {
            Error::lora(
                &config_path,
                format!("is not a PEFT LoRA config (r, lora_alpha, peft_type): {e}"),
            )
        })?;
        if config.peft_type != "LORA" {
            return Err(Error::lora(
                &config_path,
                format!(
                    "is a {} adapter; torchport merges LoRA adapters only",
                    config.peft_type
                ),
            ));
        }
        if config.use_dora {
            return Err(Error::lora(
                &config_path,
                "is a DoRA adapter (use_dora); torchport merges plain LoRA only",
            ));
        }
        if config.r == 0 {
            return Err(Error::lora(&config_path, "has r = 0"));
        }
        let adapter = crate::open(&weights)?;
        let pairs = pairs(&weights, &adapter)?;
        Ok(Lora {
            path: weights,
            config,
            adapter,
            pairs,
        })
    }

    /// The adapter's configuration.
    pub fn config(&self) -> &LoraConfig {
        &self.config
    }

    /// The base modules the adapter changes (`model.layers.0.self_attn.q_proj`), sorted.
    pub fn modules(&self) -> Vec<&str> {
        self.pairs.keys().map(String::as_str).collect()
    }

    /// The rank and scaling of `module`: `rank_pattern` / `alpha_pattern` when one of their
    /// keys matches the module name (PEFT's rule: the key matches the end of the name at a
    /// `.` boundary, as a regex), else `r` / `lora_alpha`.
    pub fn rank_and_scaling(&self, module: &str) -> (usize, f64) {
        let r = pattern(&self.config.rank_pattern, module).unwrap_or(self.config.r);
        let alpha = pattern(&self.config.alpha_pattern, module).unwrap_or(self.config.lora_alpha);
        let scaling = if self.config.use_rslora {
            alpha / (r as f64).sqrt()
        } else {
            alpha / r as f64
        };
        (r, scaling)
    }

    /// Replace the weight of every adapted module among `tensors` with its merged value
    /// (computed when read). Every adapted module must be found, as `<module>.weight` with
    /// a floating-point dtype and the shape `B·A` gives.
    pub fn merge<'a>(self: &Arc<Self>, tensors: Vec<OutTensor<'a>>) -> Result<Vec<OutTensor<'a>>> {
        let mut by_name: HashMap<String, usize> = HashMap::new();
        for (i, t) in tensors.iter().enumerate() {
            by_name.entry(t.name.clone()).or_insert(i);
        }
        let mut missing = Vec::new();
        let mut plan = Vec::new();
        for (module, pair) in &self.pairs {
            let name = format!("{module}.weight");
            match by_name.get(&name) {
                Some(&i) => plan.push((i, module.clone(), pair)),
                None => missing.push(name),
            }
        }
        if !missing.is_empty() {
            return Err(Error::lora(
                &self.path,
                format!(
                    "adapts {} weight(s) the base does not have: {}",
                    missing.len(),
                    missing.join(", ")
                ),
            ));
        }
        let mut slots: Vec<Option<OutTensor<'a>>> = tensors.into_iter().map(Some).collect();
        for (i, module, pair) in plan {
            let base = slots[i].take().expect("each index once");
            slots[i] = Some(self.merged(base, &module, pair)?);
        }
        Ok(slots.into_iter().flatten().collect())
    }

    /// `base` with the adapter's `scaling · B·A` added when it is read.
    fn merged<'a>(
        self: &Arc<Self>,
        base: OutTensor<'a>,
        module: &str,
        pair: &Pair,
    ) -> Result<OutTensor<'a>> {
        let (a, b) = match (pair.a, pair.b) {
            (Some(a), Some(b)) => (&self.adapter.tensors()[a], &self.adapter.tensors()[b]),
            _ => {
                let which = if pair.a.is_none() { "lora_A" } else { "lora_B" };
                return Err(Error::lora(
                    &self.path,
                    format!("{module} has no {which} weight"),
                ));
            }
        };
        let (r, scaling) = self.rank_and_scaling(module);
        let bad = |what: String| Error::lora(&self.path, format!("{module}: {what}"));
        if a.shape.len() != 2 || b.shape.len() != 2 {
            return Err(bad(format!(
                "lora_A {:?} and lora_B {:?} are not matrices; torchport merges LoRA on Linear and Conv1D weights",
                a.shape, b.shape
            )));
        }
        if a.shape[0] != r || b.shape[1] != r {
            return Err(bad(format!(
                "lora_A {:?} and lora_B {:?} do not have rank {r}, which the config gives",
                a.shape, b.shape
            )));
        }
        let (out, inp) = (b.shape[0], a.shape[1]);
        let want = if self.config.fan_in_fan_out {
            [inp, out]
        } else {
            [out, inp]
        };
        if base.shape != want {
            return Err(bad(format!(
                "the base weight is {:?} but B·A{} is {want:?}",
                base.shape,
                if self.config.fan_in_fan_out {
                    " transposed (fan_in_fan_out)"
                } else {
                    ""
                }
            )));
        }
        let dtype = base.dtype;
        if !matches!(dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16) {
            return Err(bad(format!(
                "the base weight is {dtype}; LoRA merges into float32, float64, float16 or bfloat16"
            )));
        }
        for t in [a, b] {
            if !matches!(t.dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16) {
                return Err(bad(format!("{} is {}, not a float", t.name, t.dtype)));
            }
        }
        let lora = Arc::clone(self);
        let (ai, bi) = (
            pair.a.expect("checked above"),
            pair.b.expect("checked above"),
        );
        let name = base.name.clone();
        let shape = base.shape.clone();
        let transpose = self.config.fan_in_fan_out;
        let base = Rc::new(base);
        let release = Rc::clone(&base);
        Ok(OutTensor::new(name, dtype, shape, move || {
            let a = &lora.adapter.tensors()[ai];
            let b = &lora.adapter.tensors()[bi];
            let w = base.data()?;
            let av = floats(&lora.adapter, a)?;
            let bv = floats(&lora.adapter, b)?;
            let delta = product(&bv, &av, out, r, inp, scaling, transpose);
            Ok(Cow::Owned(add(&w, dtype, &delta)))
        })
        .with_release(move || release.release()))
    }
}

/// The adapter's `A`/`B` pairs by base module path; any other tensor is an error.
fn pairs(path: &Path, adapter: &Checkpoint) -> Result<BTreeMap<String, Pair>> {
    let mut pairs: BTreeMap<String, Pair> = BTreeMap::new();
    let mut other = Vec::new();
    for (i, t) in adapter.tensors().iter().enumerate() {
        let name = t.name.strip_prefix(PEFT_PREFIX).unwrap_or(&t.name);
        let (module, is_a) = if let Some(m) = name.strip_suffix(".lora_A.weight") {
            (m, true)
        } else if let Some(m) = name.strip_suffix(".lora_B.weight") {
            (m, false)
        } else {
            other.push(t.name.clone());
            continue;
        };
        let p = pairs
            .entry(module.to_string())
            .or_insert(Pair { a: None, b: None });
        if is_a {
            p.a = Some(i);
        } else {
            p.b = Some(i);
        }
    }
    if !other.is_empty() {
        return Err(Error::lora(
            path,
            format!(
                "holds tensors that are not LoRA A/B weights of a Linear or Conv1D (embedding or convolution LoRA, DoRA magnitudes, trained biases or modules_to_save), which torchport does not merge: {}",
                other.join(", ")
            ),
        ));
    }
    if pairs.is_empty() {
        return Err(Error::lora(path, "holds no LoRA weights"));
    }
    Ok(pairs)
}

/// The value of the first key of `patterns` that matches `module` (PEFT: the key, as a
/// regex, matches the whole name or its end after a `.`).
fn pattern<T: Copy>(patterns: &BTreeMap<String, T>, module: &str) -> Option<T> {
    patterns.iter().find_map(|(key, v)| {
        let re = Regex::new(&format!(r"^(.*\.)?(?:{key})$")).ok()?;
        re.is_match(module).then_some(*v)
    })
}

/// A float tensor's values as f32 (through [`crate::cast`]; float64 adapters are rounded).
fn floats(ckpt: &Checkpoint, t: &TensorInfo) -> Result<Vec<f32>> {
    let bytes = ckpt.data(t)?;
    let f = crate::cast::cast(&bytes, t.dtype, DType::F32).map_err(|e| Error::Tensor {
        path: ckpt.path().to_path_buf(),
        tensor: t.name.clone(),
        what: format!("cannot be read as float32: {e}"),
    })?;
    Ok(f.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// The merge's delta, `scaling · (B·A)` (transposed when `transpose`), as PEFT computes it on
/// the CPU: each element a float32 sum over `k` of fused multiply-adds, in order, then one
/// float32 multiplication by the scaling.
fn product(
    b: &[f32],
    a: &[f32],
    out: usize,
    r: usize,
    inp: usize,
    scaling: f64,
    transpose: bool,
) -> Vec<f32> {
    let s = scaling as f32;
    let mut delta = vec![0f32; out * inp];
    for i in 0..out {
        for j in 0..inp {
            let mut acc = 0f32;
            for k in 0..r {
                acc = b[i * r + k].mul_add(a[k * inp + j], acc);
            }
            let at = if transpose { j * out + i } else { i * inp + j };
            delta[at] = acc * s;
        }
    }
    delta
}

/// `w + delta` in `w`'s dtype (half types: the delta rounded to the dtype, the sum computed
/// in float32 and rounded, as torch adds half tensors on the CPU).
fn add(w: &[u8], dtype: DType, delta: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(w.len());
    match dtype {
        DType::F32 => {
            for (c, d) in w.chunks_exact(4).zip(delta) {
                let v = f32::from_le_bytes(c.try_into().expect("4 bytes")) + d;
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        DType::F64 => {
            for (c, d) in w.chunks_exact(8).zip(delta) {
                let v = f64::from_le_bytes(c.try_into().expect("8 bytes")) + *d as f64;
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        DType::F16 => {
            for (c, d) in w.chunks_exact(2).zip(delta) {
                let x = f16::from_le_bytes([c[0], c[1]]).to_f32();
                let d = f16::from_f32(*d).to_f32();
                out.extend_from_slice(&f16::from_f32(x + d).to_le_bytes());
            }
        }
        DType::BF16 => {
            for (c, d) in w.chunks_exact(2).zip(delta) {
                let x = bf16::from_le_bytes([c[0], c[1]]).to_f32();
                let d = bf16::from_f32(*d).to_f32();
                out.extend_from_slice(&bf16::from_f32(x + d).to_le_bytes());
            }
        }
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_at_a_dot_boundary() {
        let p: BTreeMap<String, usize> = [("down_proj".to_string(), 2)].into();
        assert_eq!(pattern(&p, "model.layers.0.mlp.down_proj"), Some(2));
        assert_eq!(pattern(&p, "down_proj"), Some(2));
        assert_eq!(pattern(&p, "model.layers.0.mlp.xdown_proj"), None);
        assert_eq!(pattern(&p, "model.down_proj.inner"), None);
    }

    #[test]
    fn product_transposes_for_fan_in_fan_out() {
        // B [2, 1] · A [1, 3] = [[1, 2, 3], [2, 4, 6]]
        let (b, a) = (vec![1.0, 2.0], vec![1.0, 2.0, 3.0]);
        assert_eq!(
            product(&b, &a, 2, 1, 3, 0.5, false),
            [0.5, 1.0, 1.5, 1.0, 2.0, 3.0]
        );
        assert_eq!(
            product(&b, &a, 2, 1, 3, 1.0, true),
            [1.0, 2.0, 2.0, 4.0, 3.0, 6.0]
        );
    }
}
