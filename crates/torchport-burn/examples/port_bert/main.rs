//! Port transformers' BERT to Burn: a Hugging Face checkpoint folder (`config.json` +
//! `pytorch_model.bin`) loaded through torchport-burn with the renames of `rules.toml` into an
//! embeddings module and Burn's own `TransformerEncoder`, run on PyTorch's recorded input, and
//! compared with transformers' `last_hidden_state`.
//!
//!     cargo run -p torchport-burn --example port_bert -- [FOLDER IO.safetensors]
//!
//! Without paths it loads the tiny BERT of tests/fixtures/ports/ (tests/fixtures/gen/gen_ports.py).
//! IO.safetensors holds `input_ids`, `token_type_ids`, `attention_mask` (int64) and
//! transformers' `last_hidden_state`.

mod bert;

use std::path::PathBuf;

use burn::tensor::{Device, Int, Tensor, TensorData};
use torchport_burn::TorchportStore;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/ports");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (folder, io) = match args.as_slice() {
        [] => (
            fixtures.join("bert_tiny"),
            fixtures.join("bert_tiny.io.safetensors"),
        ),
        [f, io] => (PathBuf::from(f), PathBuf::from(io)),
        _ => return Err("give both FOLDER and IO.safetensors, or neither".into()),
    };

    let config =
        bert::BertConfig::from_json(&std::fs::read_to_string(folder.join("config.json"))?)?;
    println!("{config:?}");
    let device = Device::default();
    let (model, report) = TorchportStore::open(folder.join("pytorch_model.bin"))?
        .rules(bert::rules())
        .load(config.init(&device))?;
    println!("{report}");

    let bytes = std::fs::read(&io)?;
    let io = safetensors::SafeTensors::deserialize(&bytes)?;
    let ints = |name: &str| -> Result<Tensor<2, Int>, Box<dyn std::error::Error>> {
        let t = io.tensor(name)?;
        let v: Vec<i64> = t
            .data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        Ok(Tensor::from_data(
            TensorData::new(v, t.shape().to_vec()),
            &device,
        ))
    };
    let hidden = model.forward(
        ints("input_ids")?,
        ints("token_type_ids")?,
        ints("attention_mask")?,
    );

    let want = io.tensor("last_hidden_state")?;
    let want: Vec<f32> = want
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let got: Vec<f32> = hidden.to_data().iter::<f32>().collect();
    let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    let diff = got
        .iter()
        .zip(&want)
        .map(|(g, w)| (g - w).abs())
        .fold(0.0f32, f32::max);
    println!("last_hidden_state {:?}", hidden.dims());
    println!(
        "max abs diff {diff:.3e}, relative to max(1, max |ref|) {:.3e}",
        diff / scale
    );
    Ok(())
}
