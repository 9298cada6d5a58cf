//! End to end: models trained in PyTorch and saved with `torch.save(model.state_dict())`
//! load into the equivalent Burn models (strictly: every parameter filled, every tensor used),
//! and Burn's forward pass reproduces PyTorch's recorded output.

mod common;

use burn::module::Module;
use burn::nn::conv::{
    Conv1d, Conv1dConfig, Conv2d, Conv2dConfig, ConvTranspose2d, ConvTranspose2dConfig,
};
use burn::nn::pool::{AvgPool2d, AvgPool2dConfig, MaxPool2d, MaxPool2dConfig};
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput,
};
use burn::nn::{
    BatchNorm, BatchNormConfig, BiLstm, BiLstmConfig, Embedding, EmbeddingConfig, GroupNorm,
    GroupNormConfig, Gru, GruConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig,
    LinearLayout, Lstm, LstmConfig, PRelu, PReluConfig, PaddingConfig1d, PaddingConfig2d,
};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Int, Tensor};

use common::io;

const TOL: f64 = 1e-5;

#[derive(Module, Debug)]
struct LstmLinear {
    lstm: Lstm,
    linear: Linear,
}

impl LstmLinear {
    fn new(device: &Device) -> Self {
        LstmLinear {
            lstm: LstmConfig::new(10, 20, true).init(device),
            linear: LinearConfig::new(20, 30).init(device),
        }
    }

    fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let (out, _) = self.lstm.forward(x, None);
        self.linear.forward(out)
    }
}

#[test]
fn lstm_linear_matches_pytorch() {
    let device = Device::default();
    let io = io("lstm_linear");
    let x = io["input"].float::<3>(&device);
    let before = io["output"].max_abs_diff(&LstmLinear::new(&device).forward(x.clone()));
    assert!(
        before > 0.01,
        "an untrained model should not already match ({before})"
    );

    let store = torchport_burn::TorchportStore::open(common::fixture("lstm_linear.pt")).unwrap();
    let (model, report) = store.load(LstmLinear::new(&device)).unwrap();
    // 4 gates x 2 transforms x (weight, bias) + the Linear's weight and bias.
    assert_eq!(report.applied.len(), 18, "{report:#}");
    assert!(report.is_complete(), "{report:#}");
    let diff = io["output"].max_abs_diff(&model.forward(x));
    assert!(diff <= TOL, "max abs diff {diff}");
}

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
    fn new(device: &Device) -> Self {
        let pad = PaddingConfig2d::Explicit(1, 1, 1, 1);
        Cnn {
            conv1: Conv2dConfig::new([3, 8], [3, 3])
                .with_padding(pad.clone())
                .init(device),
            bn1: BatchNormConfig::new(8).init(device),
            conv2: Conv2dConfig::new([8, 16], [3, 3])
                .with_padding(pad)
                .init(device),
            bn2: BatchNormConfig::new(16).init(device),
            pool: MaxPool2dConfig::new([2, 2]).init(),
            avg: AvgPool2dConfig::new([2, 2]).init(),
            fc: LinearConfig::new(64, 10).init(device),
        }
    }

    fn forward(&self, x: Tensor<4>) -> Tensor<2> {
        let x = self
            .pool
            .forward(relu(self.bn1.forward(self.conv1.forward(x))));
        let x = self
            .avg
            .forward(relu(self.bn2.forward(self.conv2.forward(x))));
        self.fc.forward(x.flatten(1, 3))
    }
}

#[test]
fn cnn_with_batch_norm_matches_pytorch() {
    let device = Device::default();
    let io = io("cnn");
    let model = torchport_burn::load(common::fixture("cnn.pt"), Cnn::new(&device)).unwrap();
    let diff = io["output"].max_abs_diff(&model.forward(io["input"].float::<4>(&device)));
    assert!(diff <= TOL, "max abs diff {diff}");
    // num_batches_tracked has no place in Burn: ignored, not unused.
    let report = torchport_burn::TorchportStore::open(common::fixture("cnn.pt"))
        .unwrap()
        .plan(&Cnn::new(&device))
        .unwrap()
        .report;
    assert_eq!(
        report.ignored,
        ["bn1.num_batches_tracked", "bn2.num_batches_tracked"]
    );
    assert_eq!(report.applied.len(), 14);
}

#[test]
fn transformer_encoder_matches_pytorch() {
    let device = Device::default();
    let io = io("transformer");
    // PyTorch's defaults: ReLU (Burn's default is GELU), post-norm, eps 1e-5, no dropout.
    let config = TransformerEncoderConfig::new(16, 32, 4, 2)
        .with_dropout(0.0)
        .with_activation(burn::nn::activation::ActivationConfig::Relu);

    #[derive(Module, Debug)]
    struct Model {
        encoder: TransformerEncoder,
    }
    let model = Model {
        encoder: config.init(&device),
    };
    let (model, report) = torchport_burn::TorchportStore::open(common::fixture("transformer.pt"))
        .unwrap()
        .load(model)
        .unwrap();
    // Per layer: q, k, v, output, linear_inner, linear_outer (weight + bias) + 2 norms x 2.
    assert_eq!(report.applied.len(), 2 * 16, "{report:#}");
    let x = io["input"].float::<3>(&device);
    let y = model.encoder.forward(TransformerEncoderInput::new(x));
    let diff = io["output"].max_abs_diff(&y);
    assert!(diff <= TOL, "max abs diff {diff}");
}

#[derive(Module, Debug)]
struct Zoo {
    emb: Embedding,
    conv1d: Conv1d,
    gn: GroupNorm,
    convt: ConvTranspose2d,
    bilstm: Vec<BiLstm>,
    gru: Gru,
    ln: LayerNorm,
    prelu: PRelu,
}

impl Zoo {
    fn new(device: &Device) -> Self {
        Zoo {
            emb: EmbeddingConfig::new(12, 6).init(device),
            conv1d: Conv1dConfig::new(6, 8, 3)
                .with_padding(PaddingConfig1d::Explicit(1, 1))
                .init(device),
            gn: GroupNormConfig::new(2, 8).init(device),
            convt: ConvTranspose2dConfig::new([4, 3], [3, 3])
                .with_stride([2, 2])
                .init(device),
            bilstm: vec![
                BiLstmConfig::new(8, 6, true).init(device),
                BiLstmConfig::new(12, 6, true).init(device),
            ],
            gru: GruConfig::new(12, 5, true).init(device),
            ln: LayerNormConfig::new(5).init(device),
            prelu: PReluConfig::new().with_num_parameters(5).init(device),
        }
    }
}

#[test]
fn every_adapter_family_matches_pytorch() {
    let device = Device::default();
    let io = io("zoo");
    let (zoo, report) = torchport_burn::TorchportStore::open(common::fixture("zoo.pt"))
        .unwrap()
        .load(Zoo::new(&device))
        .unwrap();
    assert!(report.is_complete(), "{report:#}");
    let check = |part: &str, got: &dyn Fn() -> f64| {
        let d = got();
        assert!(d <= TOL, "{part}: max abs diff {d}");
    };
    let ids: Tensor<2, Int> = io["input"].int(&device);
    let e = zoo.emb.forward(ids);
    check("emb", &|| io["out.emb"].max_abs_diff(&e));
    let c = zoo.conv1d.forward(e.clone().swap_dims(1, 2));
    check("conv1d", &|| io["out.conv1d"].max_abs_diff(&c));
    let g = zoo.gn.forward(c.clone());
    check("gn", &|| io["out.gn"].max_abs_diff(&g));
    let t = zoo.convt.forward(io["input.img"].float::<4>(&device));
    check("convt", &|| io["out.convt"].max_abs_diff(&t));
    let mut l = g.clone().swap_dims(1, 2);
    for layer in &zoo.bilstm {
        l = layer.forward(l, None).0;
    }
    check("bilstm", &|| io["out.bilstm"].max_abs_diff(&l));
    let r = zoo.gru.forward(l.clone(), None);
    check("gru", &|| io["out.gru"].max_abs_diff(&r));
    let n = zoo.ln.forward(r.clone());
    check("ln", &|| io["out.ln"].max_abs_diff(&n));
    // Burn's PRelu takes channels on dim 1, as PyTorch's does.
    let p = zoo.prelu.forward(n.clone().swap_dims(1, 2)).swap_dims(1, 2);
    check("prelu", &|| io["out.prelu"].max_abs_diff(&p));
}

#[test]
fn legacy_format_and_the_burn_preset_give_the_same_model() {
    // Any format torchport reads: the same weights saved in torch's legacy (non-zip) format.
    let device = Device::default();
    let io = io("lstm_linear");
    let x = io["input"].float::<3>(&device);
    let legacy = torchport_burn::load(
        common::fixture("lstm_linear_legacy.pt"),
        LstmLinear::new(&device),
    )
    .unwrap();
    let diff = io["output"].max_abs_diff(&legacy.forward(x.clone()));
    assert!(diff <= TOL, "legacy format: max abs diff {diff}");
    // remap's name-driven `burn` preset (written independently of the target-aware adapters)
    // produces Burn's names and layouts itself; loading through it must agree.
    let (preset, report) = torchport_burn::TorchportStore::open(common::fixture("lstm_linear.pt"))
        .unwrap()
        .preset("burn")
        .unwrap()
        .load(LstmLinear::new(&device))
        .unwrap();
    assert!(report.is_complete(), "{report:#}");
    let renamed = report
        .applied
        .iter()
        .filter(|a| a.note.contains("your rules"));
    assert_eq!(renamed.count(), 16, "{report:#}");
    let diff = io["output"].max_abs_diff(&preset.forward(x));
    assert!(diff <= TOL, "burn preset: max abs diff {diff}");
}

#[derive(Module, Debug)]
struct ColLinear {
    square: Linear,
    wide: Linear,
}

impl ColLinear {
    fn new(device: &Device, layout: LinearLayout) -> Self {
        ColLinear {
            square: LinearConfig::new(8, 8).with_layout(layout).init(device),
            wide: LinearConfig::new(8, 16).with_layout(layout).init(device),
        }
    }

    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.wide.forward(relu(self.square.forward(x)))
    }
}

#[test]
fn col_layout_linears_are_not_transposed() {
    // `LinearLayout::Col` keeps PyTorch's [out, in] and transposes on load itself: transposing
    // it again failed for the non-square layer and, worse, silently broke the square one.
    let device = Device::default();
    let io = io("col_linear");
    let x = io["input"].float::<2>(&device);
    for layout in [LinearLayout::Col, LinearLayout::Row] {
        let (model, report) =
            torchport_burn::TorchportStore::open(common::fixture("col_linear.pt"))
                .unwrap()
                .load(ColLinear::new(&device, layout))
                .unwrap();
        assert!(report.is_complete(), "{layout:?}: {report:#}");
        let col_notes = report
            .applied
            .iter()
            .filter(|a| a.note.contains("Col layout"))
            .count();
        let expected = if matches!(layout, LinearLayout::Col) {
            2
        } else {
            0
        };
        assert_eq!(col_notes, expected, "{layout:?}: {report:#}");
        let diff = io["output"].max_abs_diff(&model.forward(x.clone()));
        assert!(diff <= TOL, "{layout:?}: max abs diff {diff}");
    }
}

#[derive(Module, Debug)]
struct WnConv {
    conv: Conv1d,
}

#[test]
fn weight_normed_conv1d_matches_pytorch() {
    // tests/fixtures/gen/gen_weight_norm.py: Conv1d(4, 6, 3) under weight_norm(dim=0), in
    // both of torch's forms. The preset folds g and v into `weight`; the other layers of the
    // file are dropped by a keep rule so the load stays strict.
    let device = Device::default();
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/weight_norm");
    let bytes = std::fs::read(dir.join("expected.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let get = |name: &str| {
        let v = st.tensor(name).unwrap();
        let data: Vec<f32> = v
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Tensor::<3>::from_data(
            burn::tensor::TensorData::new(data, v.shape().to_vec()),
            &device,
        )
    };
    for form in ["hooks", "parametrizations"] {
        let mut keep = torchport::remap::RuleSet::new();
        keep.push(
            torchport::remap::Rule::new(r"^conv1d_d0\.", torchport::remap::Op::Keep).unwrap(),
        );
        let (model, report) = torchport_burn::TorchportStore::open(dir.join(format!("{form}.pt")))
            .unwrap()
            .preset("weight-norm")
            .unwrap()
            .rules(keep)
            .rename(r"^conv1d_d0\.", "conv.")
            .unwrap()
            .load(WnConv {
                conv: Conv1dConfig::new(4, 6, 3).init(&device),
            })
            .unwrap();
        assert!(report.is_complete(), "{form}: {report:#}");
        let y = model.conv.forward(get("input"));
        let want = get(&format!("{form}.conv1d_d0.out"));
        let d: f32 = (y - want).abs().max().into_scalar();
        assert!(d <= 1e-5, "{form}: max abs diff {d}");
    }
}

#[derive(Module, Debug)]
struct Tied {
    embed: Embedding,
    head: Linear,
}

#[test]
fn tied_weights_fill_both_parameters() {
    // gen_frameworks.py `tied`: `head.weight` is `embed.weight`, saved once under two names.
    // Burn has no shared parameters: each is filled from the one storage (the Linear's
    // transposed), and the load is strict (neither name unused).
    let device = Device::default();
    let io = io("tied");
    let (model, report) = torchport_burn::TorchportStore::open(common::fixture("tied.pt"))
        .unwrap()
        .load(Tied {
            embed: EmbeddingConfig::new(10, 8).init(&device),
            head: LinearConfig::new(8, 10).with_bias(false).init(&device),
        })
        .unwrap();
    assert!(report.is_complete(), "{report:#}");
    assert_eq!(report.applied.len(), 2, "{report:#}");
    let ids: Tensor<2, Int> = io["input"].int(&device);
    let y = model.head.forward(model.embed.forward(ids));
    let diff = io["output"].max_abs_diff(&y);
    assert!(diff <= TOL, "max abs diff {diff}");
}
