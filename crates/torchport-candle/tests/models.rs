//! candle-nn models built from `torch.save(model.state_dict())` files through
//! `TorchportBackend` reproduce PyTorch's recorded outputs; missing and misshapen tensors give
//! errors naming them.

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{BatchNorm, Conv2d, Linear, ModuleT, VarBuilder};
use torchport_candle::TorchportBackend;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/frameworks")
        .join(name)
}

/// NAME.io.safetensors, as candle tensors.
fn io(name: &str) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(fixture(&format!("{name}.io.safetensors")), &Device::Cpu)
        .expect("io file")
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    (a - b)
        .and_then(|d| d.abs())
        .and_then(|d| d.flatten_all())
        .and_then(|d| d.max(0))
        .and_then(|d| d.to_scalar::<f32>())
        .expect("diff")
}

struct Mlp {
    fc1: Linear,
    fc2: Linear,
}

impl Mlp {
    fn new(vb: VarBuilder) -> candle_core::Result<Self> {
        Ok(Mlp {
            fc1: candle_nn::linear(6, 16, vb.pp("fc1"))?,
            fc2: candle_nn::linear(16, 4, vb.pp("fc2"))?,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.fc2.forward(&self.fc1.forward(x)?.relu()?)
    }
}

#[test]
fn sequential_mlp_with_renames_matches_pytorch() {
    // nn.Sequential names its layers 0, 1, 2: rename them to the candle model's fields.
    let vb = TorchportBackend::open(fixture("mlp.pt"))
        .unwrap()
        .rename(r"^0\.", "fc1.")
        .unwrap()
        .rename(r"^2\.", "fc2.")
        .unwrap()
        .into_var_builder(DType::F32, &Device::Cpu);
    let mlp = Mlp::new(vb).unwrap();
    let io = io("mlp");
    let y = mlp.forward(&io["input"]).unwrap();
    let d = max_abs_diff(&y, &io["output"]);
    assert!(d <= 1e-5, "max abs diff {d}");
}

#[test]
fn missing_tensor_names_the_closest() {
    let vb = TorchportBackend::open(fixture("mlp.pt"))
        .unwrap()
        .into_var_builder(DType::F32, &Device::Cpu);
    let Err(err) = Mlp::new(vb) else {
        panic!("fc1.weight is not in the file")
    };
    let msg = err.to_string();
    assert!(msg.contains("no tensor named fc1.weight"), "{msg}");
    assert!(msg.contains("closest names present: 0.weight"), "{msg}");
}

#[test]
fn wrong_shape_says_both_shapes() {
    let vb = TorchportBackend::open(fixture("mlp.pt"))
        .unwrap()
        .into_var_builder(DType::F32, &Device::Cpu);
    let err = candle_nn::linear(6, 17, vb.pp("0")).expect_err("shape");
    let msg = err.to_string();
    assert!(msg.contains("0.weight"), "{msg}");
    assert!(msg.contains("[17, 6]") && msg.contains("[16, 6]"), "{msg}");
}

struct Cnn {
    conv1: Conv2d,
    bn1: BatchNorm,
    conv2: Conv2d,
    bn2: BatchNorm,
    fc: Linear,
}

impl Cnn {
    fn new(vb: VarBuilder) -> candle_core::Result<Self> {
        let pad = candle_nn::Conv2dConfig {
            padding: 1,
            ..Default::default()
        };
        Ok(Cnn {
            conv1: candle_nn::conv2d(3, 8, 3, pad, vb.pp("conv1"))?,
            bn1: candle_nn::batch_norm(8, 1e-5, vb.pp("bn1"))?,
            conv2: candle_nn::conv2d(8, 16, 3, pad, vb.pp("conv2"))?,
            bn2: candle_nn::batch_norm(16, 1e-5, vb.pp("bn2"))?,
            fc: candle_nn::linear(64, 10, vb.pp("fc"))?,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let x = self.bn1.forward_t(&self.conv1.forward(x)?, false)?;
        let x = x.relu()?.max_pool2d(2)?;
        let x = self.bn2.forward_t(&self.conv2.forward(&x)?, false)?;
        let x = x.relu()?.avg_pool2d(2)?;
        self.fc.forward(&x.flatten_from(1)?)
    }
}

#[test]
fn cnn_with_batch_norm_matches_pytorch() {
    let vb = TorchportBackend::open(fixture("cnn.pt"))
        .unwrap()
        .into_var_builder(DType::F32, &Device::Cpu);
    let cnn = Cnn::new(vb).unwrap();
    let io = io("cnn");
    let y = cnn.forward(&io["input"]).unwrap();
    let d = max_abs_diff(&y, &io["output"]);
    assert!(d <= 1e-5, "max abs diff {d}");
}

#[test]
fn activations_round_trip_with_order() {
    let dir = std::env::temp_dir().join(format!("torchport-candle-acts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("acts.safetensors");
    let a = Tensor::new(&[[1f32, 2.], [3., 4.]], &Device::Cpu).unwrap();
    let b = Tensor::new(&[5f64], &Device::Cpu).unwrap();
    let mut acts = torchport_candle::Activations::new();
    acts.record("z_first", &a)
        .unwrap()
        .record("a_second", &b)
        .unwrap();
    acts.save(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let order = meta
        .metadata()
        .as_ref()
        .and_then(|m| m.get("torchport.order"))
        .cloned();
    assert_eq!(order.as_deref(), Some("z_first,a_second"));
    let back = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
    assert_eq!(back["a_second"].to_vec1::<f32>().unwrap(), [5.0]);
    assert_eq!(back["z_first"].dims(), [2, 2]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn rules_that_split_are_applied_on_read() {
    // A TOML rule file cutting fc1's weight [16, 6] into two [8, 6] halves.
    let rules = torchport::remap::RuleSet::from_toml_str(
        "rules.toml",
        r#"
        [[rule]]
        op = "split"
        match = '^0\.weight$'
        dim = 0
        to = ["top", "bottom"]
        "#,
    )
    .unwrap();
    let backend = TorchportBackend::open(fixture("mlp.pt"))
        .unwrap()
        .rules(rules)
        .unwrap();
    assert!(backend.names().contains(&"bottom") && !backend.names().contains(&"0.weight"));
    let vb = backend.into_var_builder(DType::F32, &Device::Cpu);
    let bottom = vb.get((8, 6), "bottom").unwrap();
    // The same rows, read from the file with no rules.
    let whole = TorchportBackend::open(fixture("mlp.pt"))
        .unwrap()
        .into_var_builder(DType::F32, &Device::Cpu)
        .get((16, 6), "0.weight")
        .unwrap();
    let rows = whole.narrow(0, 8, 8).unwrap();
    assert_eq!(max_abs_diff(&bottom, &rows), 0.0);
    // Asking for a dtype converts.
    let half = vb
        .get_with_hints_dtype((8, 6), "top", Default::default(), DType::F16)
        .unwrap();
    assert_eq!(half.dtype(), DType::F16);
}

#[test]
fn weight_normed_conv1d_matches_pytorch() {
    // tests/fixtures/gen/gen_weight_norm.py: Conv1d(4, 6, 3) under weight_norm(dim=0), in
    // both of torch's forms; the preset folds g and v into the weight candle's conv1d reads.
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/weight_norm");
    let io = candle_core::safetensors::load(dir.join("expected.safetensors"), &Device::Cpu)
        .expect("expected file");
    for form in ["hooks", "parametrizations"] {
        let vb = TorchportBackend::open(dir.join(format!("{form}.pt")))
            .unwrap()
            .preset("weight-norm")
            .unwrap()
            .into_var_builder(DType::F32, &Device::Cpu);
        let cfg = candle_nn::Conv1dConfig::default();
        let conv = candle_nn::conv1d(4, 6, 3, cfg, vb.pp("conv1d_d0")).unwrap();
        let y = conv.forward(&io["input"]).unwrap();
        let d = max_abs_diff(&y, &io[&format!("{form}.conv1d_d0.out")]);
        assert!(d <= 1e-5, "{form}: max abs diff {d}");
    }
}

#[test]
fn tied_weights_are_read_once_and_match_pytorch() {
    // gen_frameworks.py `tied`: `head.weight` is `embed.weight` (one storage, two names).
    let io = io("tied");
    let backend = TorchportBackend::open(fixture("tied.pt")).unwrap();
    let ckpt = backend.checkpoint();
    assert_eq!(ckpt.tied(), [None, Some(0)]);
    let vb = backend.into_var_builder(DType::F32, &Device::Cpu);
    let emb = candle_nn::embedding(10, 8, vb.pp("embed")).unwrap();
    let head = candle_nn::linear_no_bias(8, 10, vb.pp("head")).unwrap();
    // The same candle tensor (one storage) behind both names.
    let (a, b) = (emb.embeddings(), head.weight());
    assert_eq!(a.id(), b.id(), "tied weights were read twice");
    let ids = io["input"].to_dtype(DType::U32).unwrap();
    let y = head.forward(&emb.forward(&ids).unwrap()).unwrap();
    let d = max_abs_diff(&y, &io["output"]);
    assert!(d <= 1e-5, "max abs diff {d}");
}
