//! Fixture helpers: the .pt files and PyTorch's recorded inputs/outputs from
//! tests/fixtures/gen/gen_frameworks.py.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use burn::tensor::{Device, Int, Tensor, TensorData};

/// Path of a file in tests/fixtures/frameworks/.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/frameworks")
        .join(name)
}

/// A recorded tensor: shape and values (float32 as f32, int64 as f64).
pub struct Recorded {
    pub shape: Vec<usize>,
    pub values: Vec<f64>,
}

/// The recorded tensors of one io file, by name.
pub type Io = HashMap<String, Recorded>;

/// Every tensor of NAME.io.safetensors.
pub fn io(name: &str) -> Io {
    io_file(&fixture(&format!("{name}.io.safetensors")))
}

/// Every tensor of a safetensors file of recorded tensors.
pub fn io_file(path: &std::path::Path) -> Io {
    let bytes = std::fs::read(path).expect("io file");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let mut out = HashMap::new();
    for (n, v) in st.tensors() {
        let values = match v.dtype() {
            safetensors::Dtype::F32 => v
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
                .collect(),
            safetensors::Dtype::I64 => v
                .data()
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")) as f64)
                .collect(),
            other => panic!("unexpected dtype {other:?}"),
        };
        out.insert(
            n.clone(),
            Recorded {
                shape: v.shape().to_vec(),
                values,
            },
        );
    }
    out
}

impl Recorded {
    /// As a float tensor.
    pub fn float<const D: usize>(&self, device: &Device) -> Tensor<D> {
        let v: Vec<f32> = self.values.iter().map(|&x| x as f32).collect();
        Tensor::from_data(TensorData::new(v, self.shape.clone()), device)
    }

    /// As an int tensor.
    pub fn int<const D: usize>(&self, device: &Device) -> Tensor<D, Int> {
        let v: Vec<i64> = self.values.iter().map(|&x| x as i64).collect();
        Tensor::from_data(TensorData::new(v, self.shape.clone()), device)
    }

    /// Largest |got - recorded|; panics when the shapes differ.
    pub fn max_abs_diff<const D: usize>(&self, got: &Tensor<D>) -> f64 {
        let data = got.to_data();
        let shape: Vec<usize> = data.shape().iter().copied().collect();
        assert_eq!(shape, self.shape, "shape of the Rust output");
        let got: Vec<f32> = data.iter::<f32>().collect();
        got.iter()
            .zip(&self.values)
            .map(|(&g, &e)| (g as f64 - e).abs())
            .fold(0.0, f64::max)
    }
}
