//! Recording a candle model's intermediate outputs into a safetensors file, to compare layer
//! by layer with what `tools/record_activations.py` recorded from the PyTorch model (see
//! docs/PORTING.md). Stored as float32; the recording order goes into the metadata
//! (`torchport.order`, comma-separated).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Tensor};

use crate::Error;

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

    /// Record `tensor` under `name` (converted to float32). A second record under the same
    /// name replaces the first but keeps its place.
    pub fn record(&mut self, name: &str, tensor: &Tensor) -> candle_core::Result<&mut Self> {
        let t = tensor.to_dtype(DType::F32)?.flatten_all()?;
        let bytes: Vec<u8> = t
            .to_vec1::<f32>()?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let entry = (name.to_string(), tensor.dims().to_vec(), bytes);
        match self.entries.iter_mut().find(|(n, _, _)| n == name) {
            Some(e) => *e = entry,
            None => self.entries.push(entry),
        }
        Ok(self)
    }

    /// Names in recording order.
    pub fn names(&self) -> Vec<&str> {
        self.entries.iter().map(|(n, _, _)| n.as_str()).collect()
    }

    /// Write a safetensors file (atomically: a temporary file renamed into place).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), Error> {
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
        meta.insert("producer".to_string(), "torchport-candle".to_string());
        let tmp = path.with_extension("safetensors.tmp");
        safetensors::tensor::serialize_to_file(views, Some(meta), &tmp)
            .map_err(|e| fail(format!("cannot write activations: {e}")))?;
        std::fs::rename(&tmp, path).map_err(|e| fail(format!("cannot move into place: {e}")))
    }
}
