//! transformers' BERT through candle-transformers' own `BertModel`, built from torchport-candle's
//! VarBuilder over the `torch.save` checkpoint of tests/fixtures/ports/bert_tiny
//! (tests/fixtures/gen/gen_ports.py), reproduces transformers' `last_hidden_state` within 1e-5
//! relative: max |got - ref| <= 1e-5 * max(1, max |ref|), with the second sequence padded.

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use candle_transformers::models::bert::{BertModel, Config, HiddenAct};
use torchport_candle::TorchportBackend;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/ports")
        .join(name)
}

fn max_abs(t: &Tensor) -> f32 {
    t.abs()
        .and_then(|d| d.flatten_all())
        .and_then(|d| d.max(0))
        .and_then(|d| d.to_scalar::<f32>())
        .expect("max")
}

#[test]
fn candle_transformers_bert_matches_transformers() {
    let device = Device::Cpu;
    let text = std::fs::read_to_string(fixture("bert_tiny/config.json")).unwrap();
    let config: Config = serde_json::from_str(&text).unwrap();
    // transformers' "gelu" is exact (erf) GELU, which is candle-transformers' `Gelu`.
    assert_eq!(config.hidden_act, HiddenAct::Gelu);
    assert_eq!(config.layer_norm_eps, 1e-12);
    let backend = TorchportBackend::open(fixture("bert_tiny/pytorch_model.bin")).unwrap();
    let model = BertModel::load(backend.into_var_builder(DType::F32, &device), &config).unwrap();

    let io = candle_core::safetensors::load(fixture("bert_tiny.io.safetensors"), &device).unwrap();
    let mask = &io["attention_mask"];
    // The second sequence is padded, so the mask matters.
    assert_eq!(mask.sum_all().unwrap().to_scalar::<i64>().unwrap(), 11);
    let hidden = model
        .forward(&io["input_ids"], &io["token_type_ids"], Some(mask))
        .unwrap();
    let want = &io["last_hidden_state"];
    assert_eq!(hidden.dims(), want.dims());
    let d = max_abs(&(&hidden - want).unwrap()) / max_abs(want).max(1.0);
    eprintln!("bert (candle-transformers): max relative diff {d:e}");
    assert!(d <= 1e-5, "max relative diff {d}");
}

#[test]
fn older_and_task_model_names_load_the_same_model() {
    // Google's original BERT checkpoints name LayerNorm tensors gamma/beta, and a task model
    // (BertForMaskedLM…) prefixes the encoder with `bert.`. Both are handled inside
    // candle-transformers / candle-nn, which ask our backend `contains_tensor` for the
    // alternatives: rename the fixture's tensors that way and the model is the same.
    let device = Device::Cpu;
    let backend = TorchportBackend::open(fixture("bert_tiny/pytorch_model.bin"))
        .unwrap()
        .rename(r"\.LayerNorm\.weight$", ".LayerNorm.gamma")
        .unwrap()
        .rename(r"\.LayerNorm\.bias$", ".LayerNorm.beta")
        .unwrap()
        .rename(r"^(embeddings|encoder)\.", "bert.${1}.")
        .unwrap();
    assert!(backend.names().contains(&"bert.embeddings.LayerNorm.gamma"));
    let text = std::fs::read_to_string(fixture("bert_tiny/config.json")).unwrap();
    let config: Config = serde_json::from_str(&text).unwrap();
    let model = BertModel::load(backend.into_var_builder(DType::F32, &device), &config).unwrap();
    let io = candle_core::safetensors::load(fixture("bert_tiny.io.safetensors"), &device).unwrap();
    let hidden = model
        .forward(
            &io["input_ids"],
            &io["token_type_ids"],
            Some(&io["attention_mask"]),
        )
        .unwrap();
    let want = &io["last_hidden_state"];
    let d = max_abs(&(&hidden - want).unwrap()) / max_abs(want).max(1.0);
    assert!(d <= 1e-5, "max relative diff {d}");
}
