//! Activation files: a model's intermediate outputs, recorded layer by layer, written as a
//! safetensors file to compare with what `tools/record_activations.py` recorded from the
//! PyTorch model (`tools/compare_activations.py`, see docs/PORTING.md).
//!
//! Every tensor is stored as float32 under the name it was recorded with. The recording
//! order goes into the file's metadata under [`ORDER_KEY`] (names joined by commas), so a
//! comparison walks the layers in the order the model ran them and can point at the first
//! one that diverges; the writer's name goes under `producer`. This is the part the
//! framework integrations (`torchport_burn::Activations`, `torchport_candle::Activations`)
//! share: they turn their framework's tensor into float32 values and record them here.
//!
//! ```no_run
//! let mut acts = torchport::write::activations::Activations::new();
//! acts.record_f32("conv1", vec![2, 2], [1.0, 2.0, 3.0, 4.0]);
//! acts.record_f32("fc", vec![1], [0.5]);
//! acts.save("rust_acts.safetensors", "my-model")?;
//! # Ok::<(), torchport::Error>(())
//! ```

use std::borrow::Cow;
use std::path::Path;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::out::OutTensor;
use crate::write::{write, OutputFormat, WriteOptions};

/// The metadata key holding the recording order (names joined by commas).
pub const ORDER_KEY: &str = "torchport.order";

/// Intermediate outputs as float32, in recording order.
#[derive(Clone, Debug, Default)]
pub struct Activations {
    /// (name, shape, little-endian float32 bytes)
    entries: Vec<(String, Vec<usize>, Vec<u8>)>,
}

impl Activations {
    /// No activations yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Record `values` (row-major) of a tensor of shape `shape` under `name`. A second
    /// record under the same name replaces the first but keeps its place in the order. The
    /// number of values must fill the shape; [`Activations::save`] refuses a tensor whose
    /// values do not.
    pub fn record_f32(
        &mut self,
        name: &str,
        shape: Vec<usize>,
        values: impl IntoIterator<Item = f32>,
    ) -> &mut Self {
        let bytes: Vec<u8> = values.into_iter().flat_map(f32::to_le_bytes).collect();
        let entry = (name.to_string(), shape, bytes);
        match self.entries.iter_mut().find(|(n, _, _)| n == name) {
            Some(e) => *e = entry,
            None => self.entries.push(entry),
        }
        self
    }

    /// Names in recording order.
    pub fn names(&self) -> Vec<&str> {
        self.entries.iter().map(|(n, _, _)| n.as_str()).collect()
    }

    /// Write a safetensors file at `path` (atomically, see [`crate::write::atomic`]), with
    /// the recording order under [`ORDER_KEY`] and `producer` under `producer` in its
    /// metadata. Fails, before anything is created, when a tensor's values do not fill its
    /// shape.
    pub fn save(&self, path: impl AsRef<Path>, producer: &str) -> Result<()> {
        let path = path.as_ref();
        let mut tensors = Vec::with_capacity(self.entries.len());
        for (name, shape, bytes) in &self.entries {
            let numel = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
            if numel.and_then(|n| n.checked_mul(4)) != Some(bytes.len()) {
                return Err(Error::write(
                    path,
                    format!(
                        "activation {name}: {} values do not fill shape {shape:?}",
                        bytes.len() / 4
                    ),
                ));
            }
            tensors.push(OutTensor::new(
                name.clone(),
                DType::F32,
                shape.clone(),
                || Ok(Cow::Borrowed(&bytes[..])),
            ));
        }
        let opts = WriteOptions {
            metadata: vec![
                (ORDER_KEY.to_string(), self.names().join(",")),
                ("producer".to_string(), producer.to_string()),
            ],
            ..WriteOptions::default()
        };
        write(path, OutputFormat::Safetensors, &tensors, opts).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Read back with the safetensors crate (the reference reader), not torchport's own.
    #[test]
    fn saved_file_keeps_order_values_and_producer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("acts.safetensors");
        let mut acts = Activations::new();
        acts.record_f32("z_first", vec![2, 2], [1.0, 2.0, 3.0, 4.0])
            .record_f32("a_second", vec![1], [9.0])
            .record_f32("a_second", vec![], [5.0]);
        assert_eq!(acts.names(), ["z_first", "a_second"]);
        acts.save(&path, "unit-test").unwrap();

        let bytes = std::fs::read(&path).unwrap();
        let (_, meta) = ::safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        let meta = meta.metadata().clone().unwrap();
        assert_eq!(meta[ORDER_KEY], "z_first,a_second");
        assert_eq!(meta["producer"], "unit-test");
        let st = ::safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let a = st.tensor("a_second").unwrap();
        assert_eq!(a.dtype(), ::safetensors::Dtype::F32);
        assert_eq!(a.shape(), [0usize; 0]);
        assert_eq!(a.data(), 5.0f32.to_le_bytes());
        let z = st.tensor("z_first").unwrap();
        assert_eq!(z.shape(), [2, 2]);
        let want: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(z.data(), &want[..]);
    }

    #[test]
    fn values_that_do_not_fill_the_shape_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("acts.safetensors");
        let mut acts = Activations::new();
        acts.record_f32("x", vec![2, 3], [1.0; 5]);
        let err = acts.save(&path, "unit-test").unwrap_err().to_string();
        assert!(
            err.contains("activation x: 5 values do not fill shape [2, 3]"),
            "{err}"
        );
        assert!(!path.exists(), "nothing is created");
    }
}
