//! Recording a candle model's intermediate outputs into a safetensors file, to compare layer
//! by layer with what `tools/record_activations.py` recorded from the PyTorch model (see
//! docs/PORTING.md). Stored as float32; the recording order goes into the metadata
//! (`torchport.order`, comma-separated). The file format and writing are
//! [`torchport::write::activations`]'s; this wrapper takes candle tensors.

use std::path::Path;

use candle_core::{DType, Tensor};
use torchport::write::activations;

use crate::Error;

/// Intermediate outputs, in recording order.
#[derive(Clone, Debug, Default)]
pub struct Activations {
    inner: activations::Activations,
}

impl Activations {
    /// No activations yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Record `tensor` under `name` (converted to float32). A second record under the same
    /// name replaces the first but keeps its place.
    pub fn record(&mut self, name: &str, tensor: &Tensor) -> candle_core::Result<&mut Self> {
        let values = tensor
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        self.inner.record_f32(name, tensor.dims().to_vec(), values);
        Ok(self)
    }

    /// Names in recording order.
    pub fn names(&self) -> Vec<&str> {
        self.inner.names()
    }

    /// Write a safetensors file (atomically: a temporary file renamed into place).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        let path = path.as_ref();
        self.inner
            .save(path, "torchport-candle")
            .map_err(|e| Error::Write {
                path: path.to_path_buf(),
                message: e.detail(),
            })
    }
}
