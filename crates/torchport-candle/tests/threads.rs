//! One candle `VarBuilder` over a torchport checkpoint, shared by many threads that each
//! build the model from it and run it (as a service with a model per worker would): the
//! builder is `Send + Sync`, and every thread gets PyTorch's output, bitwise the same as a
//! single-threaded build.

use std::path::PathBuf;

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Linear, VarBuilder};
use torchport_candle::TorchportBackend;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/frameworks")
        .join(name)
}

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn the_builder_is_send_and_sync() {
    assert_send_sync::<VarBuilder<'static>>();
    assert_send_sync::<TorchportBackend>();
}

/// Build the `nn.Sequential(Linear(6, 16), ReLU, Linear(16, 4))` of mlp.pt and run it.
fn run(vb: &VarBuilder, x: &Tensor) -> Vec<u32> {
    let fc1: Linear = candle_nn::linear(6, 16, vb.pp("fc1")).unwrap();
    let fc2: Linear = candle_nn::linear(16, 4, vb.pp("fc2")).unwrap();
    let y = fc2
        .forward(&fc1.forward(x).unwrap().relu().unwrap())
        .unwrap();
    y.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

#[test]
fn one_builder_serves_many_threads() {
    let vb = TorchportBackend::open(fixture("mlp.pt"))
        .unwrap()
        .rename(r"^0\.", "fc1.")
        .unwrap()
        .rename(r"^2\.", "fc2.")
        .unwrap()
        .into_var_builder(DType::F32, &Device::Cpu);
    let io = candle_core::safetensors::load(fixture("mlp.io.safetensors"), &Device::Cpu).unwrap();
    let (x, torch) = (&io["input"], &io["output"]);
    let want = run(&vb, x);
    // The single-threaded result is PyTorch's (within float32 rounding of the matmuls).
    let torch: Vec<f32> = torch.flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(want.len(), torch.len());
    for (a, b) in want.iter().zip(&torch) {
        assert!(
            (f32::from_bits(*a) - b).abs() <= 1e-5,
            "{} vs {b}",
            f32::from_bits(*a)
        );
    }
    let same: usize = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| s.spawn(|| (0..50).filter(|_| run(&vb, x) == want).count()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(same, 8 * 50, "builds identical to the single-threaded one");
}
