//! Each candle-nn layer that reads weights, built through `TorchportBackend` from a real
//! `torch.nn` module's `torch.save(state_dict)`, reproduces PyTorch's recorded output within
//! 1e-5 relative: max |got - ref| <= 1e-5 * max(1, max |ref|).
//!
//! Fixture: tests/fixtures/gen/gen_candle_modules.py (`candle_modules.pt`, one prefix per
//! module, and `candle_modules.io.safetensors` with `in.<name>` / `out.<name>`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::rnn::{Direction, GRUConfig, LSTMConfig, RNN};
use candle_nn::{ConvTranspose1dConfig, ConvTranspose2dConfig, VarBuilder};
use torchport_candle::TorchportBackend;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/frameworks")
}

fn io() -> &'static HashMap<String, Tensor> {
    static IO: OnceLock<HashMap<String, Tensor>> = OnceLock::new();
    IO.get_or_init(|| {
        candle_core::safetensors::load(dir().join("candle_modules.io.safetensors"), &Device::Cpu)
            .expect("io file")
    })
}

fn backend() -> TorchportBackend {
    TorchportBackend::open(dir().join("candle_modules.pt")).expect("candle_modules.pt")
}

fn vb() -> VarBuilder<'static> {
    backend().into_var_builder(DType::F32, &Device::Cpu)
}

fn input(name: &str) -> &'static Tensor {
    &io()[&format!("in.{name}")]
}

fn max_abs(t: &Tensor) -> f32 {
    t.abs()
        .and_then(|d| d.flatten_all())
        .and_then(|d| d.max(0))
        .and_then(|d| d.to_scalar::<f32>())
        .expect("max")
}

/// max |got - ref| / max(1, max |ref|) against PyTorch's `out.<name>`.
fn rel_diff(name: &str, got: &Tensor) -> f32 {
    let want = &io()[&format!("out.{name}")];
    assert_eq!(got.dims(), want.dims(), "{name}: shape");
    let d = max_abs(&(got - want).expect("sub"));
    d / max_abs(want).max(1.0)
}

fn assert_matches(name: &str, got: &Tensor) {
    let d = rel_diff(name, got);
    eprintln!("{name}: max relative diff {d:e}");
    assert!(d <= 1e-5, "{name}: max relative diff {d}");
}

#[test]
fn embedding_matches_pytorch() {
    let emb = candle_nn::embedding(12, 6, vb().pp("emb")).unwrap();
    // The ids as torch saved them (int64), used as they are.
    let ids = input("emb");
    assert_eq!(ids.dtype(), DType::I64);
    assert_matches("emb", &emb.forward(ids).unwrap());
}

#[test]
fn layer_norm_matches_pytorch() {
    let ln = candle_nn::layer_norm(6, 1e-5, vb().pp("ln")).unwrap();
    assert!(ln.bias().is_some());
    assert_matches("ln", &ln.forward(input("ln")).unwrap());
}

#[test]
fn layer_norm_without_bias_matches_pytorch() {
    // nn.LayerNorm(6, bias=False) saves only `weight`: candle's layer_norm_no_bias.
    let ln = candle_nn::layer_norm_no_bias(6, 1e-5, vb().pp("ln_nobias")).unwrap();
    assert!(ln.bias().is_none());
    assert_matches("ln_nobias", &ln.forward(input("ln_nobias")).unwrap());
}

#[test]
fn layer_norm_without_affine_has_no_tensor_and_is_built_by_hand() {
    // nn.LayerNorm(elementwise_affine=False) saves nothing, while every candle-nn LayerNorm
    // constructor reads a `weight`: the VarBuilder says it is missing (it never invents one).
    let err = candle_nn::layer_norm_no_bias(6, 1e-3, vb().pp("ln_noaffine")).expect_err("none");
    let msg = err.to_string();
    assert!(msg.contains("no tensor named ln_noaffine.weight"), "{msg}");
    // Built from a weight of ones (what torch's normalization applies), with torch's eps.
    let ones = Tensor::ones(6, DType::F32, &Device::Cpu).unwrap();
    let ln = candle_nn::LayerNorm::new_no_bias(ones, 1e-3);
    assert_matches("ln_noaffine", &ln.forward(input("ln_noaffine")).unwrap());
}

#[test]
fn layer_norm_over_two_dims_with_a_reshape_rule_matches_pytorch() {
    // nn.LayerNorm((5, 6)) saves [5, 6] weights; candle's LayerNorm normalizes the last dim
    // only. A reshape rule flattens the weights to [30]; the input is flattened the same way.
    let rules = torchport::remap::RuleSet::from_toml_str(
        "rules.toml",
        r#"
        [[rule]]
        op = "reshape"
        match = '^ln2d\.(weight|bias)$'
        shape = [-1]
        "#,
    )
    .unwrap();
    let vb = backend()
        .rules(rules)
        .unwrap()
        .into_var_builder(DType::F32, &Device::Cpu);
    let ln = candle_nn::layer_norm(30, 1e-5, vb.pp("ln2d")).unwrap();
    let x = input("ln2d");
    let y = ln.forward(&x.flatten_from(1).unwrap()).unwrap();
    assert_matches("ln2d", &y.reshape(x.dims()).unwrap());
}

#[test]
fn group_norm_matches_pytorch() {
    let gn = candle_nn::group_norm(3, 6, 1e-5, vb().pp("gn")).unwrap();
    assert_matches("gn", &gn.forward(input("gn")).unwrap());
}

#[test]
fn rms_norm_matches_pytorch() {
    let rms = candle_nn::rms_norm(6, 1e-6, vb().pp("rms")).unwrap();
    assert_matches("rms", &rms.forward(input("rms")).unwrap());
}

#[test]
fn rms_norm_with_torch_default_eps_needs_machine_epsilon() {
    // nn.RMSNorm(6) has eps=None: torch uses finfo(float32).eps. The fixture's input is small
    // (scaled by 1e-3), so the eps matters: candle needs f32::EPSILON, not 1e-5 or 1e-6.
    let x = input("rms_default");
    let rms = candle_nn::rms_norm(6, f64::from(f32::EPSILON), vb().pp("rms_default")).unwrap();
    assert_matches("rms_default", &rms.forward(x).unwrap());
    let guessed = candle_nn::rms_norm(6, 1e-5, vb().pp("rms_default")).unwrap();
    let d = rel_diff("rms_default", &guessed.forward(x).unwrap());
    eprintln!("rms_default with eps 1e-5: max relative diff {d:e}");
    assert!(d > 1e-3, "eps 1e-5 should visibly differ, got {d}");
}

#[test]
fn conv_transpose1d_with_stride_padding_output_padding_groups_matches_pytorch() {
    let cfg = ConvTranspose1dConfig {
        padding: 1,
        output_padding: 1,
        stride: 2,
        dilation: 1,
        groups: 2,
    };
    let conv = candle_nn::conv_transpose1d(4, 6, 3, cfg, vb().pp("convt1d")).unwrap();
    assert_matches("convt1d", &conv.forward(input("convt1d")).unwrap());
}

#[test]
fn conv_transpose2d_with_stride_padding_output_padding_matches_pytorch() {
    let cfg = ConvTranspose2dConfig {
        padding: 1,
        output_padding: 1,
        stride: 2,
        dilation: 1,
    };
    let conv = candle_nn::conv_transpose2d(4, 3, 3, cfg, vb().pp("convt2d")).unwrap();
    assert_matches("convt2d", &conv.forward(input("convt2d")).unwrap());
}

#[test]
fn conv_transpose2d_dilated_without_bias_matches_pytorch() {
    let cfg = ConvTranspose2dConfig {
        dilation: 2,
        ..Default::default()
    };
    let conv = candle_nn::conv_transpose2d_no_bias(3, 2, 3, cfg, vb().pp("convt2d_dil")).unwrap();
    assert_matches("convt2d_dil", &conv.forward(input("convt2d_dil")).unwrap());
}

#[test]
fn conv_transpose2d_with_a_rectangular_kernel_matches_pytorch() {
    // candle-nn's conv_transpose2d constructors take one kernel size; a [2, 3] kernel is read
    // with its own shape and wrapped in ConvTranspose2d::new.
    let vb = vb().pp("convt2d_rect");
    let weight = vb.get((3, 4, 2, 3), "weight").unwrap();
    let bias = vb.get(4, "bias").unwrap();
    let cfg = ConvTranspose2dConfig {
        padding: 1,
        output_padding: 1,
        stride: 2,
        dilation: 1,
    };
    let conv = candle_nn::ConvTranspose2d::new(weight, Some(bias), cfg);
    assert_matches(
        "convt2d_rect",
        &conv.forward(input("convt2d_rect")).unwrap(),
    );
}

/// `x` [batch, seq, features] with the sequence reversed.
fn flip_seq(x: &Tensor) -> Tensor {
    let n = x.dim(1).unwrap() as u32;
    let idx = Tensor::new((0..n).rev().collect::<Vec<u32>>(), x.device()).unwrap();
    x.index_select(&idx, 1).unwrap()
}

/// A bidirectional layer as torch runs it: the forward direction over `x`, the reverse one
/// over `x` reversed (its outputs reversed back), concatenated on the feature dim.
fn bidirectional(
    x: &Tensor,
    fwd: impl Fn(&Tensor) -> Tensor,
    bwd: impl Fn(&Tensor) -> Tensor,
) -> Tensor {
    let f = fwd(x);
    let b = flip_seq(&bwd(&flip_seq(x)));
    Tensor::cat(&[f, b], 2).unwrap()
}

#[test]
fn two_layer_bidirectional_lstm_matches_pytorch() {
    // candle's LSTM reads torch's own names (`weight_ih_l{layer}{_reverse}`) and gate order
    // (i, f, g, o), so no rule is needed: one candle LSTM per layer and direction.
    let vb = vb().pp("lstm");
    let mut x = input("lstm").clone();
    for (layer, in_dim) in [(0, 5), (1, 14)] {
        let make = |direction| {
            let cfg = LSTMConfig {
                layer_idx: layer,
                direction,
                ..Default::default()
            };
            candle_nn::lstm(in_dim, 7, cfg, vb.clone()).unwrap()
        };
        let (fwd, bwd) = (make(Direction::Forward), make(Direction::Backward));
        let run = |m: &candle_nn::LSTM, x: &Tensor| m.states_to_tensor(&m.seq(x).unwrap()).unwrap();
        x = bidirectional(&x, |x| run(&fwd, x), |x| run(&bwd, x));
    }
    assert_matches("lstm", &x);
}

#[test]
fn two_layer_bidirectional_gru_with_a_rename_matches_pytorch() {
    // candle's GRU uses torch's gate order (r, z, n) and bias placement (b_hn inside r * ...),
    // but reads only `weight_ih_l0` etc.: one rename gives every layer and direction its own
    // prefix, `gru.l1_reverse.weight_ih_l0`.
    let vb = backend()
        .rename(
            r"^gru\.(weight|bias)_(ih|hh)_l(\d+)(_reverse)?$",
            "gru.l${3}${4}.${1}_${2}_l0",
        )
        .unwrap()
        .into_var_builder(DType::F32, &Device::Cpu)
        .pp("gru");
    let mut x = input("gru").clone();
    for (layer, in_dim) in [(0, 5), (1, 14)] {
        let make = |suffix: &str| {
            let cfg = GRUConfig::default();
            candle_nn::gru(in_dim, 7, cfg, vb.pp(format!("l{layer}{suffix}"))).unwrap()
        };
        let (fwd, bwd) = (make(""), make("_reverse"));
        // candle's GRU::states_to_tensor concatenates the steps into [batch, seq * hidden];
        // stacking the hidden states keeps torch's [batch, seq, hidden].
        let run = |m: &candle_nn::GRU, x: &Tensor| {
            let hs: Vec<Tensor> = m.seq(x).unwrap().into_iter().map(|s| s.h).collect();
            Tensor::stack(&hs, 1).unwrap()
        };
        x = bidirectional(&x, |x| run(&fwd, x), |x| run(&bwd, x));
    }
    assert_matches("gru", &x);
}
