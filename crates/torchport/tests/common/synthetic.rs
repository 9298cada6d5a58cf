//! Checkpoints of known values for the frameworks' memory tests (Burn, candle): what they
//! measure is the loading mechanics, so the files are written by torchport's own writer
//! (loading correctness is tested on torch-made files elsewhere).
#![allow(dead_code)]

use std::borrow::Cow;
use std::path::Path;

use torchport::write::{OutputFormat, WriteOptions};
use torchport::{DType, OutTensor};

/// Element `i` of tensor number `k`: distinct, exactly representable in float16.
pub fn value(k: usize, i: usize) -> f32 {
    ((k * 7919 + i * 31) % 2003) as f32 / 1024.0 - 1.0
}

/// Write `specs` (name, shape) filled with [`value`] as a torch.save zip of `dtype`.
pub fn write_checkpoint(path: &Path, dtype: DType, specs: Vec<(String, Vec<usize>)>) {
    let tensors: Vec<OutTensor<'static>> = specs
        .into_iter()
        .enumerate()
        .map(|(k, (name, shape))| {
            let n: usize = shape.iter().product();
            let values: Vec<f64> = (0..n).map(|i| f64::from(value(k, i))).collect();
            let bytes = torchport::cast::from_f64(&values, dtype).expect("encode");
            OutTensor::new(name, dtype, shape, move || Ok(Cow::Owned(bytes.clone())))
        })
        .collect();
    torchport::write::write(
        path,
        OutputFormat::TorchZip,
        &tensors,
        WriteOptions::default(),
    )
    .expect("write the checkpoint");
}

/// Bytes of `specs` as float32 in all, and of the largest one.
pub fn model_and_largest(specs: &[(String, Vec<usize>)]) -> (usize, usize) {
    let sizes: Vec<usize> = specs
        .iter()
        .map(|(_, s)| s.iter().product::<usize>() * 4)
        .collect();
    (sizes.iter().sum(), sizes.iter().copied().max().unwrap_or(0))
}
