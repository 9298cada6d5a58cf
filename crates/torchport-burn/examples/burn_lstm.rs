//! The model of Burn issue #1632 ("provide a method to chunk the weights before importing
//! them into Burn"): `Lstm(10, 20)` + `Linear(20, 30)` trained in PyTorch and saved with
//! `torch.save(model.state_dict())`, loaded into Burn and checked against PyTorch's output.
//!
//!     cargo run -p torchport-burn --example burn_lstm [MODEL.pt IO.safetensors]
//!
//! Defaults to tests/fixtures/frameworks/lstm_linear.pt (made by
//! tests/fixtures/gen/gen_frameworks.py). PyTorch side:
//!
//! ```python
//! class Model(nn.Module):
//!     def __init__(self):
//!         super().__init__()
//!         self.lstm = nn.LSTM(10, 20, batch_first=True)
//!         self.linear = nn.Linear(20, 30)
//!     def forward(self, x):
//!         out, _ = self.lstm(x)
//!         return self.linear(out)
//! torch.save(model.state_dict(), "lstm_linear.pt")
//! ```

use burn::module::Module;
use burn::nn::{Linear, LinearConfig, Lstm, LstmConfig};
use burn::tensor::{Device, Tensor, TensorData};

#[derive(Module, Debug)]
struct Model {
    lstm: Lstm,
    linear: Linear,
}

impl Model {
    fn new(device: &Device) -> Self {
        Model {
            // batch_first = true, as the PyTorch model was built.
            lstm: LstmConfig::new(10, 20, true).init(device),
            linear: LinearConfig::new(20, 30).init(device),
        }
    }

    fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let (out, _) = self.lstm.forward(x, None);
        self.linear.forward(out)
    }
}

/// A float32 tensor of a safetensors file, as (shape, values).
fn read(path: &str, name: &str) -> Result<(Vec<usize>, Vec<f32>), Box<dyn std::error::Error>> {
    let bytes = std::fs::read(path)?;
    let st = safetensors::SafeTensors::deserialize(&bytes)?;
    let t = st.tensor(name)?;
    let values = t
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok((t.shape().to_vec(), values))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/frameworks/"
    );
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model_path = args
        .first()
        .cloned()
        .unwrap_or(format!("{root}lstm_linear.pt"));
    let io_path = args
        .get(1)
        .cloned()
        .unwrap_or(format!("{root}lstm_linear.io.safetensors"));

    let device = Device::default();
    let store = torchport_burn::TorchportStore::open(&model_path)?;
    // Built lazily and loaded before use: no random weights are ever allocated.
    let (model, report) = store.load(Model::new(&device))?;
    println!("{report:#}");

    let (shape, x) = read(&io_path, "input")?;
    let (_, expected) = read(&io_path, "output")?;
    let y = model.forward(Tensor::from_data(TensorData::new(x, shape), &device));
    let got: Vec<f32> = y.to_data().iter::<f32>().collect();
    let diff = got
        .iter()
        .zip(&expected)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    println!("max abs diff against PyTorch: {diff:e}");
    if diff > 1e-5 {
        return Err(format!("output differs from PyTorch's by {diff}").into());
    }
    Ok(())
}
