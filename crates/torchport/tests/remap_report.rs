//! Match reports: matched / missing / unused / shape and dtype mismatches, "did you mean",
//! and suggested rules — each suggestion is parsed back as a rule file and applied, and must
//! make the names it is about match.

use std::path::{Path, PathBuf};

use torchport::remap::report::{load_target, match_tensors, report, MatchReport};
use torchport::remap::{plan, Context, RuleSet, TargetTensor, TensorMeta};
use torchport::DType;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/remap")
        .join(name)
}

fn meta(name: &str, shape: &[usize]) -> TensorMeta {
    TensorMeta {
        name: name.into(),
        dtype: DType::F32,
        shape: shape.to_vec(),
    }
}

fn target(name: &str, shape: &[usize]) -> TargetTensor {
    TargetTensor::new(name, shape)
}

/// Apply every suggestion of `r` (as rule-file TOML) to `have`, and match again.
fn apply_suggestions(r: &MatchReport, have: &[TensorMeta], want: &[TargetTensor]) -> MatchReport {
    let toml: Vec<&str> = r.suggestions.iter().map(|s| s.toml.as_str()).collect();
    let rules = RuleSet::from_toml_str("suggested.toml", &toml.join("\n"))
        .unwrap_or_else(|e| panic!("{e}\n{}", toml.join("\n")));
    let (out, _) = plan(&rules, have, &Context::default()).unwrap();
    match_tensors(&out, want)
}

#[test]
fn missing_unused_and_did_you_mean() {
    let have = [
        meta("fc.weight", &[3, 4]),
        meta("fc.biases", &[3]),
        meta("extra.scale", &[1]),
    ];
    let want = [target("fc.weight", &[3, 4]), target("fc.bias", &[3])];
    let r = match_tensors(&have, &want);
    assert!(!r.all_matched());
    assert_eq!(r.matched, ["fc.weight"]);
    assert_eq!(r.missing.len(), 1);
    assert_eq!(r.missing[0].name, "fc.bias");
    assert_eq!(r.missing[0].did_you_mean, ["fc.biases"]);
    let unused: Vec<&str> = r.unused.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(unused, ["fc.biases", "extra.scale"]);
    assert_eq!(r.unused[0].did_you_mean, ["fc.bias"]);
    assert!(r.unused[1].did_you_mean.is_empty());
    let text = r.to_string();
    assert!(text.contains("matched: 1 of 2 target tensors"), "{text}");
    assert!(
        text.contains("fc.bias  any dtype [3]  (did you mean fc.biases?)"),
        "{text}"
    );
    // All matched.
    let r = match_tensors(&have[..1], &want[..1]);
    assert!(r.all_matched());
    assert!(r.suggestions.is_empty());
}

#[test]
fn transposed_shape_suggests_transpose() {
    let have = [meta("fc.weight", &[3, 4]), meta("fc.bias", &[3])];
    let want = [target("fc.weight", &[4, 3]), target("fc.bias", &[3])];
    let r = match_tensors(&have, &want);
    assert_eq!(r.shape_mismatches.len(), 1);
    assert_eq!(r.shape_mismatches[0].have_shape, [3, 4]);
    assert_eq!(r.suggestions.len(), 1, "{r}");
    let s = &r.suggestions[0];
    assert_eq!(
        s.toml,
        "[[rule]]\nop = \"transpose\"\nmatch = '^fc\\.weight$'\n"
    );
    assert!(s.why.contains("stored transposed"), "{}", s.why);
    assert!(apply_suggestions(&r, &have, &want).all_matched());
}

#[test]
fn dtype_mismatch_suggests_cast() {
    let have = [meta("w", &[2])];
    let want = [TargetTensor {
        name: "w".into(),
        shape: vec![2],
        dtype: Some(DType::F16),
    }];
    let r = match_tensors(&have, &want);
    assert_eq!(r.dtype_mismatches.len(), 1);
    assert!(r.suggestions[0].toml.contains("dtype = \"float16\""));
    assert!(apply_suggestions(&r, &have, &want).all_matched());
}

#[test]
fn constant_prefix_suggests_rename() {
    let have = [
        meta("module.enc.0.weight", &[2, 2]),
        meta("module.enc.1.weight", &[2, 2]),
        meta("module.head.bias", &[2]),
    ];
    let want = [
        target("enc.0.weight", &[2, 2]),
        target("enc.1.weight", &[2, 2]),
        target("head.bias", &[2]),
    ];
    let r = match_tensors(&have, &want);
    assert_eq!(r.suggestions.len(), 1, "{r}");
    assert_eq!(
        r.suggestions[0].toml,
        "[[rule]]\nop = \"rename\"\nmatch = '^module\\.'\nto = ''\n"
    );
    assert!(r.suggestions[0]
        .why
        .starts_with("3 name(s) differ only by a leading `module.`"));
    assert!(apply_suggestions(&r, &have, &want).all_matched());

    // A prefix replaced by another.
    let have = [
        meta("encoder.layers.0.w", &[2]),
        meta("encoder.layers.1.w", &[2]),
    ];
    let want = [
        target("enc.blocks.0.w", &[2]),
        target("enc.blocks.1.w", &[2]),
    ];
    let r = match_tensors(&have, &want);
    assert_eq!(r.suggestions.len(), 1, "{r}");
    assert!(r.suggestions[0]
        .toml
        .contains("match = '^encoder\\.layers\\.'\nto = 'enc.blocks.'"));
    assert!(apply_suggestions(&r, &have, &want).all_matched());
}

#[test]
fn packed_gates_suggest_split() {
    // 4x: LSTM gates, in torch's order i, f, g, o whatever order the target lists them in.
    let have = [meta("rnn.weight_ih_l0", &[8, 3])];
    let want = [
        target("rnn.w_o", &[2, 3]),
        target("rnn.w_i", &[2, 3]),
        target("rnn.w_f", &[2, 3]),
        target("rnn.w_g", &[2, 3]),
    ];
    let r = match_tensors(&have, &want);
    assert_eq!(r.suggestions.len(), 1, "{r}");
    let s = &r.suggestions[0];
    assert_eq!(
        s.toml,
        "[[rule]]\nop = \"split\"\nmatch = '^rnn\\.weight_ih_l0$'\ndim = 0\nto = ['rnn.w_i', 'rnn.w_f', 'rnn.w_g', 'rnn.w_o']\n"
    );
    assert!(
        s.why
            .contains("packs 4 pieces of [2, 3] (LSTM gates i, f, g, o)"),
        "{}",
        s.why
    );
    assert!(apply_suggestions(&r, &have, &want).all_matched());

    // 3x: q, k, v wanted transposed -> split, then transpose.
    let have = [
        meta("attn.in_proj_weight", &[12, 2]),
        meta("attn.in_proj_bias", &[12]),
    ];
    let want = [
        target("attn.query.weight", &[2, 4]),
        target("attn.key.weight", &[2, 4]),
        target("attn.value.weight", &[2, 4]),
        target("attn.query.bias", &[4]),
        target("attn.key.bias", &[4]),
        target("attn.value.bias", &[4]),
    ];
    let r = match_tensors(&have, &want);
    assert_eq!(r.suggestions.len(), 2, "{r}");
    assert!(r.suggestions[0].toml.contains("op = \"transpose\""), "{r}");
    assert!(r.suggestions[1]
        .toml
        .contains("to = ['attn.query.bias', 'attn.key.bias', 'attn.value.bias']"));
    assert!(apply_suggestions(&r, &have, &want).all_matched());
}

#[test]
fn burn_target_suggests_the_burn_preset() {
    let ckpt = torchport::open(fixture("lstm_linear.pt")).unwrap();
    let have: Vec<TensorMeta> = ckpt.out_tensors().iter().map(TensorMeta::of).collect();
    // torch's own burn-layout tensors, as `torchport inspect --json`-like JSON.
    let want = load_target(fixture("lstm_linear.pt.burn.expected.json")).unwrap();
    assert_eq!(want.len(), 18);
    assert_eq!(want[0].dtype, Some(DType::F32));
    let ctx = Context {
        modules: ckpt.modules(),
        target: Some(&want),
    };
    let r = report(&have, &want, &ctx);
    assert_eq!(r.matched, ["linear.bias"]);
    assert_eq!(
        r.suggestions[0].why,
        "--preset burn would match 18 of 18 target tensors (1 now)"
    );
    assert_eq!(r.suggestions[0].toml, "[[rule]]\npreset = \"burn\"\n");
    let rules = RuleSet::from_toml_str("s.toml", &r.suggestions[0].toml).unwrap();
    let (out, _) = plan(&rules, &have, &ctx).unwrap();
    assert!(match_tensors(&out, &want).all_matched());
}

#[test]
fn targets_from_files() {
    // Any checkpoint torchport opens.
    let t = load_target(fixture("lstm_linear.pt")).unwrap();
    assert_eq!(t.len(), 6);
    assert_eq!(t[0].name, "lstm.weight_ih_l0");
    assert_eq!(t[0].shape, [80, 10]);
    // A JSON list, dtype optional.
    let dir = std::env::temp_dir().join(format!("torchport-remap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("t.json");
    std::fs::write(
        &p,
        r#" [{"name": "a", "shape": [2, 3]}, {"name": "b", "shape": [], "dtype": "half"}]"#,
    )
    .unwrap();
    let t = load_target(&p).unwrap();
    assert_eq!(
        t,
        [
            target("a", &[2, 3]),
            TargetTensor {
                name: "b".into(),
                shape: vec![],
                dtype: Some(DType::F16)
            }
        ]
    );
    std::fs::write(&p, r#"[{"name": "a", "shape": [2], "dtype": "float17"}]"#).unwrap();
    let e = load_target(&p).unwrap_err().to_string();
    assert!(
        e.ends_with("t.json: target tensor a has an unknown dtype `float17`"),
        "{e}"
    );
    std::fs::write(&p, r#"[{"name": "a"}]"#).unwrap();
    let e = load_target(&p).unwrap_err().to_string();
    assert!(e.contains("not a target list"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
