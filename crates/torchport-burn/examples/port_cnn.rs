//! The CNN walked through in docs/PORTING.md: load `cnn.pt` (a PyTorch state_dict) into the
//! equivalent Burn model, run PyTorch's recorded input through it, and write every layer's
//! output to a safetensors file for `tools/compare_activations.py` / `torchport diff`.
//!
//!     cargo run -p torchport-burn --example port_cnn -- OUT.safetensors [--bn-eps 1e-3]
//!
//! `--bn-eps` builds the batch norms with a different epsilon than PyTorch's 1e-5, to see
//! what a divergence looks like in the comparison.

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{AvgPool2d, AvgPool2dConfig, MaxPool2d, MaxPool2dConfig};
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig, PaddingConfig2d};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor, TensorData};
use torchport_burn::Activations;

#[derive(Module, Debug)]
struct Cnn {
    conv1: Conv2d,
    bn1: BatchNorm,
    conv2: Conv2d,
    bn2: BatchNorm,
    pool: MaxPool2d,
    avg: AvgPool2d,
    fc: Linear,
}

impl Cnn {
    fn new(device: &Device, bn_eps: f64) -> Self {
        // nn.Conv2d(3, 8, kernel_size=3, padding=1): Burn's default padding is Valid (0).
        let pad = PaddingConfig2d::Explicit(1, 1, 1, 1);
        Cnn {
            conv1: Conv2dConfig::new([3, 8], [3, 3])
                .with_padding(pad.clone())
                .init(device),
            bn1: BatchNormConfig::new(8).with_epsilon(bn_eps).init(device),
            conv2: Conv2dConfig::new([8, 16], [3, 3])
                .with_padding(pad)
                .init(device),
            bn2: BatchNormConfig::new(16).with_epsilon(bn_eps).init(device),
            pool: MaxPool2dConfig::new([2, 2]).init(),
            avg: AvgPool2dConfig::new([2, 2]).init(),
            fc: LinearConfig::new(16 * 2 * 2, 10).init(device),
        }
    }

    /// The forward pass, recording each module's output under its PyTorch name.
    fn forward(&self, x: Tensor<4>, acts: &mut Activations) -> Tensor<2> {
        acts.record("input", &x);
        let x = self.conv1.forward(x);
        acts.record("conv1", &x);
        let x = self.bn1.forward(x);
        acts.record("bn1", &x);
        let x = self.pool.forward(relu(x));
        acts.record("pool", &x);
        let x = self.conv2.forward(x);
        acts.record("conv2", &x);
        let x = self.bn2.forward(x);
        acts.record("bn2", &x);
        let x = self.avg.forward(relu(x));
        acts.record("avg", &x);
        let x = self.fc.forward(x.flatten(1, 3));
        acts.record("fc", &x);
        acts.record("output", &x);
        x
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/frameworks/"
    );
    let mut args = std::env::args().skip(1);
    let out = args
        .next()
        .unwrap_or_else(|| "rust_acts.safetensors".into());
    let mut bn_eps = 1e-5;
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--bn-eps", Some(v)) => bn_eps = v.parse()?,
            _ => return Err(format!("unknown argument {a}").into()),
        }
    }
    let device = Device::default();
    // The configs' `init` only records shapes and initializers (Burn initialises lazily), and
    // loading fills every parameter without asking for its value: no random weights are ever
    // allocated, so loading holds the model once (docs/PORTING.md).
    let model = torchport_burn::load(format!("{root}cnn.pt"), Cnn::new(&device, bn_eps))?;

    let bytes = std::fs::read(format!("{root}cnn.io.safetensors"))?;
    let io = safetensors::SafeTensors::deserialize(&bytes)?;
    let input = io.tensor("input")?;
    let x: Vec<f32> = input
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let x = Tensor::from_data(TensorData::new(x, input.shape().to_vec()), &device);

    let mut acts = Activations::new();
    model.forward(x, &mut acts);
    acts.save(&out)?;
    println!(
        "wrote {} activations to {out}: {}",
        acts.names().len(),
        acts.names().join(", ")
    );
    Ok(())
}
