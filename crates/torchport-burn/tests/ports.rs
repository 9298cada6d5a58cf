//! The port examples on small copies of real library models (tests/fixtures/ports/, written by
//! tests/fixtures/gen/gen_ports.py): the examples' own model code and rules, loaded strictly,
//! compared with PyTorch's recorded outputs within 1e-5 relative:
//! max |got - ref| <= 1e-5 * max(1, max |ref|).

mod common;

#[path = "../examples/port_bert/bert.rs"]
mod bert;
#[path = "../examples/port_resnet18/resnet.rs"]
mod resnet;

use std::path::PathBuf;

use burn::tensor::Device;
use torchport::remap::report::{report, TargetTensor};
use torchport::remap::{self, Context, RuleSet, TensorMeta};
use torchport_burn::TorchportStore;

const TOL: f64 = 1e-5;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/ports")
        .join(name)
}

/// max |got - ref| / max(1, max |ref|).
fn rel_diff<const D: usize>(want: &common::Recorded, got: &burn::tensor::Tensor<D>) -> f64 {
    let scale = want.values.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    want.max_abs_diff(got) / scale
}

#[test]
fn resnet18_matches_timm_with_torchvision_names() {
    let device = Device::default();
    let io = common::io_file(&fixture("resnet18_small.io.safetensors"));
    let store = TorchportStore::open(fixture("resnet18_small.pth"))
        .unwrap()
        .rules(resnet::rules());
    let config = resnet::ResNetConfig {
        stem: 64,
        widths: [64, 8, 16, 24],
        classes: 10,
    };
    assert_eq!(
        resnet::ResNetConfig::from_checkpoint(store.checkpoint()).unwrap(),
        config
    );
    // Without the rules, the shortcut's `downsample.0/1` names do not fit.
    let plain = TorchportStore::open(fixture("resnet18_small.pth")).unwrap();
    let report = plain.plan(&config.init(&device)).unwrap().report;
    assert!(!report.is_complete());
    // 3 shortcuts x (conv weight + BatchNorm gamma, beta, running mean and variance).
    assert_eq!(report.missing.len(), 3 * 5, "{report:#}");

    let (model, report) = store.load(config.init(&device)).unwrap();
    assert!(report.is_complete(), "{report:#}");
    // 20 BatchNorms x 4 + 20 convolutions + fc weight and bias; 20 num_batches_tracked.
    assert_eq!(report.applied.len(), 102, "{report:#}");
    assert_eq!(report.ignored.len(), 20, "{report:#}");
    let logits = model.forward(io["input"].float::<4>(&device), None);
    let d = rel_diff(&io["logits"], &logits);
    eprintln!("resnet18: max relative diff {d:e}");
    assert!(d <= TOL, "max relative diff {d}");
}

#[test]
fn full_size_resnet18_fits_torchvisions_state_dict() {
    // torchvision's resnet18 saved from the meta device: every name, dtype and shape of the
    // full model, no data. Matched as `torchport match --preset burn --rules rules.toml` does
    // (the example's rules, then the `burn` preset's layouts), the full-size Burn model's
    // parameters are exactly what the file holds.
    let ckpt = torchport::open(fixture("resnet18_torchvision_meta.pth")).unwrap();
    let config = resnet::ResNetConfig::from_checkpoint(&ckpt).unwrap();
    assert_eq!(config, resnet::ResNetConfig::torchvision());
    let model = config.init(&Device::default());
    let want: Vec<TargetTensor> = TorchportStore::targets(&model)
        .iter()
        .map(|t| TargetTensor::new(t.path(), &t.shape))
        .collect();
    let have: Vec<TensorMeta> = ckpt
        .tensors()
        .iter()
        .map(|t| TensorMeta {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
        })
        .collect();
    let mut rules = RuleSet::new();
    rules.preset("burn").unwrap();
    rules.extend(resnet::rules());
    let ctx = Context {
        modules: ckpt.modules(),
        target: Some(&want),
    };
    let (after, _) = remap::plan(&rules, &have, &ctx).unwrap();
    let r = report(&after, &want, &ctx);
    assert!(r.all_matched(), "{r}");
    assert_eq!(want.len(), 102);
}

#[test]
fn bert_matches_transformers_last_hidden_state() {
    let device = Device::default();
    let io = common::io_file(&fixture("bert_tiny.io.safetensors"));
    let text = std::fs::read_to_string(fixture("bert_tiny/config.json")).unwrap();
    let config = bert::BertConfig::from_json(&text).unwrap();
    assert_eq!(config.layer_norm_eps, 1e-12);
    let (model, report) = TorchportStore::open(fixture("bert_tiny/pytorch_model.bin"))
        .unwrap()
        .rules(bert::rules())
        .load(config.init(&device))
        .unwrap();
    assert!(report.is_complete(), "{report:#}");
    // 4 embeddings tensors + LayerNorm (2) + per layer 6 Linears x 2 + 2 LayerNorms x 2.
    assert_eq!(report.applied.len(), 5 + 2 * 16, "{report:#}");
    let hidden = model.forward(
        io["input_ids"].int(&device),
        io["token_type_ids"].int(&device),
        io["attention_mask"].int(&device),
    );
    let d = rel_diff(&io["last_hidden_state"], &hidden);
    eprintln!("bert: max relative diff {d:e}");
    assert!(d <= TOL, "max relative diff {d}");

    // The epsilon matters: with Burn's default LayerNorm epsilon (1e-5) instead of BERT's
    // 1e-12 the same weights fail the tolerance above (5.2e-5 relative on this input).
    let burn_default = bert::BertConfig {
        layer_norm_eps: 1e-5,
        ..config
    };
    let (model, _) = TorchportStore::open(fixture("bert_tiny/pytorch_model.bin"))
        .unwrap()
        .rules(bert::rules())
        .load(burn_default.init(&device))
        .unwrap();
    let hidden = model.forward(
        io["input_ids"].int(&device),
        io["token_type_ids"].int(&device),
        io["attention_mask"].int(&device),
    );
    let d = rel_diff(&io["last_hidden_state"], &hidden);
    eprintln!("bert with layer_norm_eps 1e-5: max relative diff {d:e}");
    assert!(d > 2.0 * TOL, "eps 1e-5 should be off by more: {d}");
}
