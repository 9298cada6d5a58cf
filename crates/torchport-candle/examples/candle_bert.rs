//! Run transformers' BERT in candle: candle-transformers' own `BertModel`, built from
//! torchport-candle's VarBuilder over a Hugging Face checkpoint folder (`config.json` +
//! `pytorch_model.bin`, a `torch.save` file that candle cannot read itself), compared with
//! transformers' `last_hidden_state`.
//!
//!     cargo run -p torchport-candle --example candle_bert -- [FOLDER IO.safetensors]
//!
//! Without paths it loads the tiny BERT of tests/fixtures/ports/ (tests/fixtures/gen/gen_ports.py).
//! IO.safetensors holds `input_ids`, `token_type_ids`, `attention_mask` (int64) and
//! transformers' `last_hidden_state`.
//!
//! No rules are needed: `BertModel.state_dict()` names (`embeddings.LayerNorm.weight`,
//! `encoder.layer.0.attention.self.query.weight`…) are the names candle-transformers asks for,
//! for a task model (`BertForMaskedLM`: `bert.embeddings…`) candle-transformers itself
//! retries under the config's `model_type` prefix, and for older checkpoints' LayerNorm
//! `gamma`/`beta` candle-nn's `layer_norm` asks for both names (tests/bert.rs checks both).
//! The pooler's tensors are simply not asked for.

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use candle_transformers::models::bert::{BertModel, Config};
use torchport_candle::TorchportBackend;

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
    let device = Device::Cpu;

    // candle-transformers reads transformers' config.json with serde.
    let config: Config =
        serde_json::from_str(&std::fs::read_to_string(folder.join("config.json"))?)?;
    let vb = TorchportBackend::open(folder.join("pytorch_model.bin"))?
        .into_var_builder(DType::F32, &device);
    let model = BertModel::load(vb, &config)?;

    let io = candle_core::safetensors::load(&io, &device)?;
    let hidden = model.forward(
        &io["input_ids"],
        &io["token_type_ids"],
        Some(&io["attention_mask"]),
    )?;
    let want = &io["last_hidden_state"];
    let max = |t: &Tensor| -> candle_core::Result<f32> {
        t.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()
    };
    let diff = max(&(&hidden - want)?)?;
    println!("last_hidden_state {:?}", hidden.dims());
    println!(
        "max abs diff {diff:.3e}, relative to max(1, max |ref|) {:.3e}",
        diff / max(want)?.max(1.0)
    );
    Ok(())
}
