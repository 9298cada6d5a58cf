//! Recording a Burn model's intermediate outputs into a safetensors file, to compare layer by
//! layer with what `tools/record_activations.py` recorded from the PyTorch model (see
//! docs/PORTING.md). Tensors are stored as float32 under the names you give them; the
//! recording order goes into the file's metadata (`torchport.order`, comma-separated), so a
//! comparison can point at the first layer that diverges. The file format and writing are
//! [`torchport::write::activations`]'s; this wrapper takes Burn tensors.

use std::path::Path;

use burn::tensor::Tensor;
use torchport::write::activations;

use crate::error::{Error, Result};

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

    /// Record `tensor` under `name` (as float32). A second record under the same name
    /// replaces the first but keeps its place in the order.
    pub fn record<const D: usize>(&mut self, name: &str, tensor: &Tensor<D>) -> &mut Self {
        let data = tensor.to_data().convert_dtype(burn::tensor::DType::F32);
        let shape: Vec<usize> = data.shape().iter().copied().collect();
        self.inner.record_f32(name, shape, data.iter::<f32>());
        self
    }

    /// Names in recording order.
    pub fn names(&self) -> Vec<&str> {
        self.inner.names()
    }

    /// Write a safetensors file (atomically: a temporary file renamed into place).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        self.inner
            .save(path, "torchport-burn")
            .map_err(|e| Error::Write {
                path: path.to_path_buf(),
                message: e.detail(),
            })
    }
}
