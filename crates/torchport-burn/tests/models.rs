//! End to end: models trained in PyTorch and saved with `torch.save(model.state_dict())`
//! load into the equivalent Burn models (strictly: every parameter filled, every tensor used),
//! and Burn's forward pass reproduces PyTorch's recorded output.

mod common;

use burn::module::Module;
use burn::nn::attention::{generate_autoregressive_mask, CrossAttention, CrossAttentionConfig};
use burn::nn::conv::{
    Conv1d, Conv1dConfig, Conv2d, Conv2dConfig, Conv3d, Conv3dConfig, ConvTranspose1d,
    ConvTranspose1dConfig, ConvTranspose2d, ConvTranspose2dConfig, ConvTranspose3d,
    ConvTranspose3dConfig,
};
use burn::nn::pool::{AvgPool2d, AvgPool2dConfig, MaxPool2d, MaxPool2dConfig};
use burn::nn::transformer::{
    TransformerDecoder, TransformerDecoderConfig, TransformerDecoderInput, TransformerEncoder,
    TransformerEncoderConfig, TransformerEncoderInput,
};
use burn::nn::{
    BatchNorm, BatchNormConfig, BiGru, BiGruConfig, BiLstm, BiLstmConfig, Embedding,
    EmbeddingConfig, GroupNorm, GroupNormConfig, Gru, GruConfig, InstanceNorm, InstanceNormConfig,
    LayerNorm, LayerNormConfig, Linear, LinearConfig, LinearLayout, Lstm, LstmConfig, PRelu,
    PReluConfig, PaddingConfig1d, PaddingConfig2d, PaddingConfig3d, RmsNorm, RmsNormConfig, SwiGlu,
    SwiGluConfig,
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

// One Burn module per file of tests/fixtures/gen/gen_burn_modules.py: each saved by torch as
// the attribute `m` of a wrapper, loaded strictly, once through the target-aware adapters and
// once through remap's `burn` preset, and compared with PyTorch's output within 1e-5 relative.

/// A Burn module under the field `m`, as the generator's wrapper holds the torch module.
macro_rules! wrapper {
    ($name:ident, $ty:ty) => {
        #[derive(Module, Debug)]
        struct $name {
            m: $ty,
        }
    };
}

/// `max|got - ref| / max(1, max|ref|)` for PyTorch's `out.<name>`.
fn rel_diff<const D: usize>(io: &common::Io, name: &str, got: &Tensor<D>) -> f64 {
    let want = &io[&format!("out.{name}")];
    let scale = want.values.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    want.max_abs_diff(got) / scale
}

/// Load `burn_<name>.pt` into `make()` both ways (adapters, `burn` preset), strictly, with
/// `renames` (file name pattern, Burn name) applied first.
fn load_both<M: Module>(
    name: &str,
    renames: &[(&str, &str)],
    make: impl Fn() -> M,
) -> Vec<(&'static str, M)> {
    let mut out = Vec::new();
    for (how, preset) in [("adapters", false), ("burn preset", true)] {
        let mut store =
            torchport_burn::TorchportStore::open(common::fixture(&format!("burn_{name}.pt")))
                .unwrap();
        for (from, to) in renames {
            store = store.rename(from, to).unwrap();
        }
        if preset {
            store = store.preset("burn").unwrap();
        }
        let (model, report) = store
            .load(make())
            .unwrap_or_else(|e| panic!("{name} ({how}): {e}"));
        assert!(report.is_complete(), "{name} ({how}): {report:#}");
        out.push((how, model));
    }
    out
}

fn assert_close<const D: usize>(io: &common::Io, name: &str, how: &str, got: &Tensor<D>) {
    let d = rel_diff(io, name, got);
    eprintln!("{name} ({how}): max relative diff {d:e}");
    assert!(d <= TOL, "{name} ({how}): max relative diff {d}");
}

wrapper!(Conv3dM, Conv3d);

#[test]
fn conv3d_matches_pytorch() {
    let device = Device::default();
    let io = io("burn_modules");
    let x = io["in.conv3d"].float::<5>(&device);
    for (how, model) in load_both("conv3d", &[], || Conv3dM {
        m: Conv3dConfig::new([3, 4], [2, 3, 3])
            .with_stride([1, 2, 1])
            .with_padding(PaddingConfig3d::Explicit(1, 1, 1))
            .init(&device),
    }) {
        assert_close(&io, "conv3d", how, &model.m.forward(x.clone()));
    }
}

wrapper!(ConvT1dM, ConvTranspose1d);

#[test]
fn conv_transpose1d_matches_pytorch() {
    let device = Device::default();
    let io = io("burn_modules");
    let x = io["in.convt1d"].float::<3>(&device);
    for (how, model) in load_both("convt1d", &[], || ConvT1dM {
        m: ConvTranspose1dConfig::new([4, 6], 3)
            .with_stride(2)
            .with_padding(1)
            .with_padding_out(1)
            .with_groups(2)
            .init(&device),
    }) {
        assert_close(&io, "convt1d", how, &model.m.forward(x.clone()));
    }
}

wrapper!(InstanceNormM, InstanceNorm);

#[test]
fn instance_norm_matches_pytorch() {
    let device = Device::default();
    let io = io("burn_modules");
    let x = io["in.inorm"].float::<4>(&device);
    for (how, model) in load_both("inorm", &[], || InstanceNormM {
        m: InstanceNormConfig::new(4).init(&device),
    }) {
        assert_close(&io, "inorm", how, &model.m.forward(x.clone()));
    }
}

wrapper!(RmsNormM, RmsNorm);

#[test]
fn rms_norm_matches_pytorch() {
    let device = Device::default();
    let io = io("burn_modules");
    // torch's RMSNorm(eps=None) uses float32's machine epsilon; Burn's default is 1e-5.
    for (name, eps) in [("rms", 1e-6), ("rms_default", f32::EPSILON as f64)] {
        let x = io[&format!("in.{name}")].float::<3>(&device);
        for (how, model) in load_both(name, &[], || RmsNormM {
            m: RmsNormConfig::new(6).with_epsilon(eps).init(&device),
        }) {
            assert_close(&io, name, how, &model.m.forward(x.clone()));
        }
    }
    // The eps is part of the port: Burn's default on the eps=None file is far off.
    let x = io["in.rms_default"].float::<3>(&device);
    let (_, model) = &load_both("rms_default", &[], || RmsNormM {
        m: RmsNormConfig::new(6).init(&device),
    })[0];
    let d = rel_diff(&io, "rms_default", &model.m.forward(x));
    eprintln!("rms_default with Burn's default eps 1e-5: max relative diff {d:e}");
    assert!(
        d > 1e-2,
        "Burn's default eps should not match torch's eps=None ({d})"
    );
}

wrapper!(BiGruM, Vec<BiGru>);

#[test]
fn bidirectional_two_layer_gru_matches_pytorch() {
    // One nn.GRU(num_layers=2, bidirectional=True) into a Vec of two BiGru: PyTorch's packed
    // r, z, n gate rows split into Burn's reset/update/new gates, `_reverse` into `reverse`.
    let device = Device::default();
    let io = io("burn_modules");
    let x = io["in.bigru"].float::<3>(&device);
    for (how, model) in load_both("bigru", &[], || BiGruM {
        m: vec![
            BiGruConfig::new(5, 7, true).init(&device),
            BiGruConfig::new(14, 7, true).init(&device),
        ],
    }) {
        let mut y = x.clone();
        for layer in &model.m {
            y = layer.forward(y, None).0;
        }
        assert_close(&io, "bigru", how, &y);
    }
}

#[derive(Module, Debug)]
struct LlamaMlp {
    gate_up: SwiGlu,
    down_proj: Linear,
}

wrapper!(LlamaMlpM, LlamaMlp);

#[test]
fn swiglu_matches_transformers_llama_mlp() {
    // torch has no SwiGLU module; transformers' LlamaMLP is the common one:
    // down_proj(silu(gate_proj(x)) * up_proj(x)). Burn's SwiGlu is silu(linear_inner(x)) *
    // linear_outer(x), so gate_proj is linear_inner and up_proj is linear_outer.
    let device = Device::default();
    let io = io("burn_modules");
    let x = io["in.swiglu"].float::<3>(&device);
    let renames = [
        (r"^m\.gate_proj\.", "m.gate_up.linear_inner."),
        (r"^m\.up_proj\.", "m.gate_up.linear_outer."),
    ];
    for (how, model) in load_both("swiglu", &renames, || LlamaMlpM {
        m: LlamaMlp {
            gate_up: SwiGluConfig::new(8, 12).init(&device),
            down_proj: LinearConfig::new(12, 8).with_bias(false).init(&device),
        },
    }) {
        let y = model
            .m
            .down_proj
            .forward(model.m.gate_up.forward(x.clone()));
        assert_close(&io, "swiglu", how, &y);
    }
}

wrapper!(ConvT3dM, ConvTranspose3d);

#[test]
fn conv_transpose3d_matches_pytorch() {
    let device = Device::default();
    let io = io("burn_modules");
    let x = io["in.convt3d"].float::<5>(&device);
    for (how, model) in load_both("convt3d", &[], || ConvT3dM {
        m: ConvTranspose3dConfig::new([3, 4], [2, 3, 3])
            .with_stride([1, 2, 2])
            .with_padding([0, 1, 1])
            .with_padding_out([0, 1, 1])
            .init(&device),
    }) {
        assert_close(&io, "convt3d", how, &model.m.forward(x.clone()));
    }
}

wrapper!(DecoderM, TransformerDecoder);

#[test]
fn transformer_decoder_with_cross_attention_matches_pytorch() {
    // nn.TransformerDecoder (post-norm, ReLU, dropout 0) with a causal target mask: Burn's
    // `self_attn` / `cross_attn` ← `self_attn` / `multihead_attn`, `norm_k` ← `normk`,
    // `pwff.linear_inner/outer` ← `linear1/2`, by the adapters.
    let device = Device::default();
    let io = io("burn_modules");
    let config = TransformerDecoderConfig::new(16, 32, 4, 2)
        .with_dropout(0.0)
        .with_activation(burn::nn::activation::ActivationConfig::Relu);
    let (model, report) = torchport_burn::TorchportStore::open(common::fixture("burn_decoder.pt"))
        .unwrap()
        .load(DecoderM {
            m: config.init(&device),
        })
        .unwrap();
    assert!(report.is_complete(), "{report:#}");
    // Per layer: 2 attentions x 4 Linears x (weight, bias) + 2 Linears x 2 + 3 norms x 2.
    assert_eq!(report.applied.len(), 2 * 26, "{report:#}");
    let target = io["in.decoder"].float::<3>(&device);
    let memory = io["in.decoder.1"].float::<3>(&device);
    let [batch, seq, _] = target.shape().dims();
    let mask = generate_autoregressive_mask(batch, seq, &device);
    let input = TransformerDecoderInput::new(target.clone(), memory.clone());
    let y = model.m.forward(input.target_mask_attn(mask));
    assert_close(&io, "decoder", "adapters", &y);
    // The mask matters: without it the decoder sees later positions.
    let unmasked = model
        .m
        .forward(TransformerDecoderInput::new(target, memory));
    let d = rel_diff(&io, "decoder", &unmasked);
    assert!(d > 1e-3, "the causal mask should change the output ({d})");
}

wrapper!(CrossAttentionM, CrossAttention);

#[test]
fn cross_attention_matches_pytorch_multihead_attention() {
    // nn.MultiheadAttention(16, 4, kdim=12, vdim=12) saves separate q/k/v_proj_weight and one
    // packed in_proj_bias; Burn's CrossAttention (d_context 12, 4 heads of 4) takes them as
    // query/key/value. Torch's key_padding_mask (true = padding) is Burn's mask.
    let device = Device::default();
    let io = io("burn_modules");
    let query = io["in.xattn"].float::<3>(&device);
    let context = io["in.xattn.1"].float::<3>(&device);
    let pad = io["xattn.pad"].float::<2>(&device).greater_elem(0.5);
    for (how, model) in load_both("xattn", &[], || CrossAttentionM {
        m: CrossAttentionConfig::new(16, 12, 4, 4, 4)
            .with_dropout(0.0)
            .init(&device),
    }) {
        let y = model
            .m
            .forward(query.clone(), context.clone(), Some(pad.clone()));
        assert_close(&io, "xattn", how, &y);
        let unmasked = model.m.forward(query.clone(), context.clone(), None);
        let d = rel_diff(&io, "xattn", &unmasked);
        assert!(d > 1e-3, "the padding mask should change the output ({d})");
    }
}

/// One layer of a stage: Burn enums of modules have no level in PyTorch's names.
#[derive(Module, Debug)]
enum Layer {
    Linear(Linear),
    Norm(LayerNorm),
}

#[derive(Module, Debug)]
struct Nested {
    stages: Vec<Vec<Layer>>,
    head: Option<Linear>,
    /// Not in the file: a `None` module has no parameters to fill.
    extra: Option<Linear>,
}

wrapper!(NestedM, Nested);

#[test]
fn nested_vecs_enums_and_options_match_pytorch() {
    // stages.<i>.<j> of nested nn.ModuleLists, mixing Linear and LayerNorm, into
    // Vec<Vec<Layer>> with an enum Layer; `head` into an Option<Linear>.
    let device = Device::default();
    let io = io("burn_modules");
    let x = io["in.nested"].float::<3>(&device);
    let make = || NestedM {
        m: Nested {
            stages: [6, 8]
                .into_iter()
                .map(|d_in| {
                    vec![
                        Layer::Linear(LinearConfig::new(d_in, 8).init(&device)),
                        Layer::Norm(LayerNormConfig::new(8).init(&device)),
                    ]
                })
                .collect(),
            head: Some(LinearConfig::new(8, 3).init(&device)),
            extra: None,
        },
    };
    for (how, model) in load_both("nested", &[], make) {
        let mut y = x.clone();
        for stage in &model.m.stages {
            for layer in stage {
                y = match layer {
                    Layer::Linear(l) => l.forward(y),
                    Layer::Norm(n) => n.forward(y),
                };
            }
            y = relu(y);
        }
        let y = model.m.head.as_ref().expect("head").forward(y);
        assert_close(&io, "nested", how, &y);
    }
}
