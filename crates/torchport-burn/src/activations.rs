//! Recording a Burn model's intermediate outputs into a safetensors file, to compare layer by
//! layer with what `tools/record_activations.py` recorded from the PyTorch model (see
//! docs/PORTING.md). Tensors are stored as float32 under the names you give them; the
//! recording order goes into the file's metadata (`torchport.order`, comma-separated), so a
//! comparison can point at the first layer that diverges.

use std::collections::HashMap;
use std::path::Path;

use burn::tensor::Tensor;

use crate::error::{Error, Result};

/// Intermediate outputs, in recording order.
#[derive(Clone, Debug, Default)]
pub struct Activations {
    entries: Vec<(String, Vec<usize>, Vec<u8>)>,
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
        let bytes: Vec<u8> = data.iter::<f32>().flat_map(|v| v.to_le_bytes()).collect();
        match self.entries.iter_mut().find(|(n, _, _)| n == name) {
            Some(e) => *e = (name.to_string(), shape, bytes),
            None => self.entries.push((name.to_string(), shape, bytes)),
        }
        self
    }

    /// Names in recording order.
    pub fn names(&self) -> Vec<&str> {
        self.entries.iter().map(|(n, _, _)| n.as_str()).collect()
    }

    /// Write a safetensors file (atomically: a temporary file renamed into place).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let fail = |message: String| Error::Write {
            path: path.to_path_buf(),
            message,
        };
        let mut views = Vec::with_capacity(self.entries.len());
        for (name, shape, bytes) in &self.entries {
            let v =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                    .map_err(|e| fail(format!("tensor {name}: {e}")))?;
            views.push((name.as_str(), v));
        }
        let mut meta = HashMap::new();
        meta.insert("torchport.order".to_string(), self.names().join(","));
        meta.insert("producer".to_string(), "torchport-burn".to_string());
        let tmp = path.with_extension("safetensors.tmp");
        safetensors::tensor::serialize_to_file(views, Some(meta), &tmp)
            .map_err(|e| fail(format!("cannot write activations: {e}")))?;
        std::fs::rename(&tmp, path).map_err(|e| fail(format!("cannot move into place: {e}")))
    }
}
