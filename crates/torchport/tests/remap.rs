//! Remapping against PyTorch: every preset on checkpoints written by torch gives exactly the
//! names, shapes and bytes torch computes for it (`tests/fixtures/gen/gen_remap.py` writes
//! `<file>.<presets>.expected.json/.bin` with `w.chunk(4, 0)[k].T` etc.); every rule kind
//! (tests/fixtures/remap/every_op.toml) against torch's result; every rule error names its
//! rule. Match reports: tests/remap_report.rs.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use torchport::remap::{
    apply, apply_with, plan, Context, Op, Plan, Rule, RuleSet, TargetTensor, TensorMeta,
};
use torchport::{DType, OutTensor};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/remap")
        .join(name)
}

/// What torch computed: (name, dtype, shape, bytes) in order.
fn expected(file: &str, presets: &str) -> Vec<(String, String, Vec<usize>, Vec<u8>)> {
    let base = fixture(&format!("{file}.{presets}"));
    let json: Json = serde_json::from_slice(
        &std::fs::read(format!("{}.expected.json", base.display())).unwrap(),
    )
    .unwrap();
    let bin = std::fs::read(format!("{}.expected.bin", base.display())).unwrap();
    json["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let off = t["offset"].as_u64().unwrap() as usize;
            let n = t["nbytes"].as_u64().unwrap() as usize;
            (
                t["name"].as_str().unwrap().to_string(),
                t["dtype"].as_str().unwrap().to_string(),
                serde_json::from_value(t["shape"].clone()).unwrap(),
                bin[off..off + n].to_vec(),
            )
        })
        .collect()
}

/// Assert that `out` is exactly what torch computed: names in order, dtypes, shapes, bytes.
fn assert_same(out: &[OutTensor<'_>], file: &str, presets: &str) {
    let want = expected(file, presets);
    let names: Vec<&str> = out.iter().map(|t| t.name.as_str()).collect();
    let want_names: Vec<&str> = want.iter().map(|w| w.0.as_str()).collect();
    assert_eq!(names, want_names, "{file} {presets}: names in order");
    for (t, (name, dtype, shape, bytes)) in out.iter().zip(&want) {
        assert_eq!(t.dtype.name(), dtype, "{file} {presets}: {name} dtype");
        assert_eq!(&t.shape, shape, "{file} {presets}: {name} shape");
        let data = t.data().unwrap_or_else(|e| panic!("{e}"));
        assert!(
            data[..] == bytes[..],
            "{file} {presets}: {name}: bytes differ from torch's"
        );
    }
}

/// Open `file`, apply `presets` (with the file's module classes), compare with torch.
fn check_presets(file: &str, presets: &[&str]) -> Plan {
    let ckpt = torchport::open(fixture(file)).unwrap();
    let mut rules = RuleSet::new();
    for p in presets {
        rules.preset(p).unwrap();
    }
    let ctx = Context {
        modules: ckpt.modules(),
        target: None,
    };
    let (out, plan) = apply_with(&rules, ckpt.out_tensors(), &ctx).unwrap();
    assert_same(&out, file, &presets.join("+"));
    plan
}

#[test]
fn burn_lstm_linear_seed_case() {
    let plan = check_presets("lstm_linear.pt", &["burn"]);
    assert!(plan.undecided.is_empty(), "{plan}");
    assert!(plan.warnings.is_empty(), "{plan}");
    // The plan says where each piece came from and how.
    let t = plan
        .targets
        .iter()
        .find(|t| t.name == "lstm.cell_gate.input_transform.weight")
        .unwrap();
    assert_eq!(t.sources, ["lstm.weight_ih_l0"]);
    assert_eq!(t.shape, [10, 20]);
    let ops: Vec<&str> = t.steps.iter().map(|s| s.op.as_str()).collect();
    assert_eq!(
        ops,
        ["split dim 0: piece 3 of 4 (40..60)", "transpose dims 0, 1"]
    );
    assert!(
        t.steps[0].rule.starts_with("preset burn, rule"),
        "{:?}",
        t.steps
    );
    let text = plan.to_string();
    assert!(
        text.contains("lstm.weight_ih_l0  float32 [80, 10]"),
        "{text}"
    );
    assert!(
        text.contains("6 source tensors -> 18 target tensors"),
        "{text}"
    );
}

#[test]
fn burn_bidirectional_two_layer_lstm() {
    let plan = check_presets("bilstm2.pt", &["burn"]);
    assert_eq!(plan.targets.len(), 2 * 2 * 4 * 4);
    assert!(plan
        .targets
        .iter()
        .any(|t| t.name == "lstm.1.reverse.output_gate.hidden_transform.bias"));
}

#[test]
fn burn_gru_rnn_and_attention() {
    check_presets("gru.pt", &["burn"]);
    check_presets("birnn.pt", &["burn"]);
    let plan = check_presets("mha.pt", &["burn"]);
    assert!(plan.undecided.is_empty());
}

#[test]
fn gate_and_qkv_presets() {
    check_presets("lstm_linear.pt", &["lstm-gates"]);
    check_presets("bilstm2.pt", &["lstm-gates"]);
    check_presets("gru.pt", &["gru-gates"]);
    check_presets("mha.pt", &["attention-qkv"]);
    // lstm-gates leaves a GRU alone (its 3 gates do not split in 4), and says so.
    let ckpt = torchport::open(fixture("gru.pt")).unwrap();
    let mut rules = RuleSet::new();
    rules.preset("lstm-gates").unwrap();
    let (_, plan) = apply(&rules, ckpt.out_tensors()).unwrap();
    assert!(plan.is_identity());
    assert_eq!(
        plan.warnings,
        ["rule 1 (preset lstm-gates): found nothing to change"]
    );
}

#[test]
fn split_pieces_along_dim0_are_borrowed_from_the_file() {
    let ckpt = torchport::open(fixture("lstm_linear.pt")).unwrap();
    let mut rules = RuleSet::new();
    rules.preset("lstm-gates").unwrap();
    let (out, _) = apply(&rules, ckpt.out_tensors()).unwrap();
    for t in &out {
        assert!(matches!(t.data().unwrap(), Cow::Borrowed(_)), "{}", t.name);
    }
}

#[test]
fn prefixes_stripped_then_burn_norms() {
    for file in ["module_prefix.pt", "orig_mod_prefix.pt"] {
        check_presets(file, &["strip-prefix"]);
        let plan = check_presets(file, &["strip-prefix", "burn"]);
        assert_eq!(plan.dropped.len(), 1);
        assert_eq!(plan.dropped[0].name, "bn.num_batches_tracked");
        assert!(plan.dropped[0].rule.starts_with("preset burn"));
    }
}

#[test]
fn embedding_or_linear_is_listed_not_guessed() {
    let plan = check_presets("embed_linear.pt", &["burn"]);
    let names: Vec<&str> = plan.undecided.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(names, ["emb.weight", "lin.weight"]);
    assert!(
        plan.undecided[0].why.contains("Linear without bias"),
        "{plan}"
    );
    assert!(plan.to_string().contains("undecided (left unchanged):"));
    // A whole pickled model: module classes decide.
    let plan = check_presets("embed_linear_module.pt", &["burn"]);
    assert!(plan.undecided.is_empty(), "{plan}");
}

#[test]
fn embedding_or_linear_decided_by_the_target() {
    let ckpt = torchport::open(fixture("embed_linear.pt")).unwrap();
    let target = [
        TargetTensor::new("emb.weight", &[10, 4]),
        TargetTensor::new("lin.weight", &[4, 10]),
    ];
    let ctx = Context {
        modules: &[],
        target: Some(&target),
    };
    let mut rules = RuleSet::new();
    rules.preset("burn").unwrap();
    let (out, plan) = apply_with(&rules, ckpt.out_tensors(), &ctx).unwrap();
    assert!(plan.undecided.is_empty(), "{plan}");
    // The same as module classes decide (torch's expected output for the whole model).
    assert_same(&out, "embed_linear_module.pt", "burn");
}

#[test]
fn every_rule_kind_against_torch() {
    let rules = RuleSet::from_toml_file(fixture("every_op.toml")).unwrap();
    assert_eq!(rules.len(), 11);
    let ckpt = torchport::open(fixture("lstm_linear.pt")).unwrap();
    let (out, plan) = apply(&rules, ckpt.out_tensors()).unwrap();
    assert_same(&out, "lstm_linear.pt", "every_op");
    // The unmatched drop rule is a warning naming the rule, not an error.
    assert_eq!(plan.warnings.len(), 1, "{plan}");
    let w = &plan.warnings[0];
    assert!(w.contains("every_op.toml:62: rule 11 (drop)"), "{w}");
    assert!(w.contains("matched no tensor"), "{w}");
    // A merge lists all of its sources.
    let both = plan
        .targets
        .iter()
        .find(|t| t.name == "lstm.bias_both")
        .unwrap();
    assert_eq!(both.sources, ["lstm.bias_ih_l0", "lstm.bias_hh_l0"]);
}

/// Small in-memory tensors with float32 values 0, 1, 2, …
fn seq(name: &str, shape: &[usize]) -> OutTensor<'static> {
    let n: usize = shape.iter().product();
    let bytes: Vec<u8> = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
    OutTensor::new(name, DType::F32, shape.to_vec(), move || {
        Ok(Cow::Owned(bytes.clone()))
    })
}

fn floats(t: &OutTensor<'_>) -> Vec<f32> {
    t.data()
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn keep_and_drop_filter_names() {
    let toml = r#"
        [[rule]]
        op = "keep"
        match = '^enc\.'
        [[rule]]
        op = "drop"
        match = 'num_batches_tracked$'
    "#;
    let rules = RuleSet::from_toml_str("f.toml", toml).unwrap();
    let input = vec![
        seq("enc.a", &[2]),
        seq("dec.b", &[2]),
        seq("enc.bn.num_batches_tracked", &[]),
    ];
    let (out, plan) = apply(&rules, input).unwrap();
    let names: Vec<&str> = out.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["enc.a"]);
    let dropped: Vec<(&str, &str)> = plan
        .dropped
        .iter()
        .map(|d| (d.name.as_str(), d.rule.as_str()))
        .collect();
    assert_eq!(
        dropped,
        [
            ("dec.b", "f.toml:2: rule 1 (keep)"),
            ("enc.bn.num_batches_tracked", "f.toml:5: rule 2 (drop)")
        ]
    );
}

#[test]
fn rust_api_rules_equal_split_and_transpose() {
    let mut rules = RuleSet::new();
    rules.push(
        Rule::new(
            r"^(.*)\.qkv$",
            Op::Split {
                dim: 0,
                sizes: None,
                to: vec!["${1}.q".into(), "${1}.k".into(), "${1}.v".into()],
            },
        )
        .unwrap(),
    );
    rules.push(
        Rule::new(
            r"\.k$",
            Op::Transpose {
                dims: None,
                to: None,
            },
        )
        .unwrap(),
    );
    let (out, plan) = apply(&rules, vec![seq("attn.qkv", &[6, 2])]).unwrap();
    let names: Vec<&str> = out.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["attn.q", "attn.k", "attn.v"]);
    assert_eq!(floats(&out[0]), [0.0, 1.0, 2.0, 3.0]);
    assert_eq!(out[1].shape, [2, 2]);
    assert_eq!(floats(&out[1]), [4.0, 6.0, 5.0, 7.0]);
    assert_eq!(plan.targets[1].steps[1].rule, "rule 2 (transpose)");
}

/// Apply a one-rule TOML file to `input`; return the error message.
fn rule_error(body: &str, input: Vec<OutTensor<'static>>) -> String {
    let toml = format!("# rules\n[[rule]]\n{body}\n");
    match RuleSet::from_toml_str("rules.toml", &toml) {
        Err(e) => e.to_string(),
        Ok(rules) => match apply(&rules, input) {
            Err(e) => e.to_string(),
            Ok((out, _)) => match out.iter().map(|t| t.data()).find_map(|d| d.err()) {
                Some(e) => e.to_string(),
                None => panic!("no error for {body}"),
            },
        },
    }
}

#[track_caller]
fn assert_error(body: &str, input: Vec<OutTensor<'static>>, prefix: &str, what: &str) {
    let e = rule_error(body, input);
    assert!(
        e.starts_with(prefix),
        "expected `{prefix}` at the start of: {e}"
    );
    assert!(e.contains(what), "expected `{what}` in: {e}");
    assert!(!e.contains('\n'), "one line: {e}");
}

#[test]
fn rule_errors_point_at_the_rule() {
    let w = || vec![seq("w", &[4, 3])];
    assert_error(
        "op = 'rename'\nmatch = '^(abc'\nto = 'x'",
        w(),
        "rules.toml:2: rule 1 (rename): ",
        "the pattern `^(abc` is not a valid regex: unclosed group",
    );
    assert_error(
        "op = 'split'\nmatch = '^w$'\ndim = 2\nto = ['a', 'b']",
        w(),
        "rules.toml:2: rule 1 (split): ",
        "dim 2 is out of range for `w` of shape [4, 3] (2 dims)",
    );
    assert_error(
        "op = 'split'\nmatch = '^w$'\nsizes = [1, 2]\nto = ['a', 'b']",
        w(),
        "rules.toml:2: rule 1 (split): ",
        "`sizes` [1, 2] add up to 3, but `w` (shape [4, 3]) has 4 along dim 0",
    );
    assert_error(
        "op = 'split'\nmatch = '^w$'\ndim = 1\nto = ['a', 'b']",
        w(),
        "rules.toml:2: rule 1 (split): ",
        "has 3 along dim 1, which does not split into 2 equal pieces",
    );
    assert_error(
        "op = 'merge'\nmatch = '^a$'\ninputs = ['a', 'b']\nto = 'ab'\ndim = 0",
        vec![seq("a", &[2, 3]), seq("b", &[2, 4])],
        "rules.toml:2: rule 1 (merge): ",
        "cannot merge `a` of shape [2, 3] with `b` of shape [2, 4]: shapes must be equal except along dim 0",
    );
    assert_error(
        "op = 'merge'\nmatch = '^a$'\ninputs = ['a', 'c']\nto = 'ac'",
        vec![seq("a", &[2]), seq("b", &[2])],
        "rules.toml:2: rule 1 (merge): ",
        "input `c` (from `c` for the matched `a`) is not among the tensors",
    );
    assert_error(
        "op = 'cast'\nmatch = '^w$'\ndtype = 'float17'",
        w(),
        "rules.toml:2: rule 1 (cast): ",
        "unknown dtype `float17`",
    );
    assert_error(
        "op = 'reshape'\nmatch = '^w$'\nshape = [5, 2]",
        w(),
        "rules.toml:2: rule 1 (reshape): ",
        "cannot reshape `w` (shape [4, 3], 12 elements) to [5, 2] (10 elements)",
    );
    assert_error(
        "op = 'reshape'\nmatch = '^w$'\nshape = [5, -1]",
        w(),
        "rules.toml:2: rule 1 (reshape): ",
        "the -1 cannot be inferred",
    );
    assert_error(
        "op = 'rename'\nmatch = '^(w)$'\nto = '${2}'",
        w(),
        "rules.toml:2: rule 1 (rename): ",
        "the template `${2}` refers to group 2, but the pattern has 1 group(s)",
    );
    assert_error(
        "op = 'rename'\nmatch = '^(w)$'\nto = '$1x'",
        w(),
        "rules.toml:2: rule 1 (rename): ",
        "refers to a group named `1x`",
    );
    assert_error(
        "op = 'rename'\nmatch = '^w|v$'\nto = 'x'",
        vec![seq("w", &[1]), seq("v", &[1])],
        "rules.toml:2: rule 1 (rename): ",
        "gives two tensors the name `x`",
    );
    assert_error(
        "op = 'transpose'\nmatch = '^w$'",
        vec![seq("w", &[3])],
        "rules.toml:2: rule 1 (transpose): ",
        "`w` has shape [3]; transpose needs at least 2 dims",
    );
    assert_error(
        "op = 'permute'\nmatch = '^w$'\ndims = [0, -2]",
        w(),
        "rules.toml:2: rule 1 (permute): ",
        "names dim 0 twice",
    );
    assert_error(
        "op = 'frobnicate'\nmatch = '^w$'",
        w(),
        "rules.toml:2: rule 1 (frobnicate): ",
        "unknown op `frobnicate`",
    );
    assert_error(
        "op = 'rename'\nmatch = '^w$'\nsizes = [1]\nto = 'x'",
        w(),
        "rules.toml:2: rule 1 (rename): ",
        "`sizes` has no meaning for rename",
    );
    assert_error(
        "op = 'rename'\nmatch = '^w$'\ntoo = 'x'",
        w(),
        "rules.toml:2: rule 1: ",
        "unknown field `too`",
    );
    assert_error(
        "preset = 'pytorch'",
        w(),
        "rules.toml:2: rule 1: ",
        "unknown preset `pytorch` (known: strip-prefix, lstm-gates, gru-gates, attention-qkv, burn, weight-norm)",
    );
    // A value that does not fit the target dtype fails when the data is produced.
    assert_error(
        "op = 'cast'\nmatch = '^w$'\ndtype = 'int8'",
        vec![seq("w", &[200])],
        "rules.toml:2: rule 1 (cast): ",
        "cannot cast `w` from float32 to int8: element 128 (128) does not fit in int8",
    );
    // Not a TOML file at all.
    let e = RuleSet::from_toml_str("rules.toml", "[[rule]\n")
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "rules.toml:1:8: not a valid rule file: unclosed array table, expected `]`"
    );
}

#[test]
fn rules_and_presets_compose_in_order() {
    // User rules after a preset see the preset's names.
    let toml = r#"
        [[rule]]
        preset = "strip-prefix"

        [[rule]]
        op = "rename"
        match = '^fc\.'
        to = 'head.'
    "#;
    let mut rules = RuleSet::new();
    rules.extend(RuleSet::from_toml_str("r.toml", toml).unwrap());
    let (out, plan) = apply(&rules, vec![seq("module.fc.weight", &[2, 2])]).unwrap();
    assert_eq!(out[0].name, "head.weight");
    assert!(plan.warnings.is_empty(), "{plan}");
    let steps: Vec<&str> = plan.targets[0]
        .steps
        .iter()
        .map(|s| s.rule.as_str())
        .collect();
    assert_eq!(
        steps,
        [
            "preset strip-prefix, rule 1 (rename)",
            "r.toml:5: rule 2 (rename)"
        ]
    );
}

fn meta(name: &str, shape: &[usize]) -> TensorMeta {
    TensorMeta {
        name: name.into(),
        dtype: DType::F32,
        shape: shape.to_vec(),
    }
}

/// The burn preset over metadata only: (output names, undecided names).
fn burn_plan(
    tensors: &[TensorMeta],
    ctx: &Context<'_>,
) -> (Vec<(String, Vec<usize>)>, Vec<String>) {
    let mut rules = RuleSet::new();
    rules.preset("burn").unwrap();
    let (out, plan) = plan(&rules, tensors, ctx).unwrap();
    (
        out.into_iter().map(|m| (m.name, m.shape)).collect(),
        plan.undecided.into_iter().map(|u| u.name).collect(),
    )
}

#[test]
fn burn_preset_evidence() {
    let modules = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    // Convolutions keep their layout; a lone 1-D weight is undecided without evidence.
    let tensors = [
        meta("conv.weight", &[8, 3, 3, 3]),
        meta("conv.bias", &[8]),
        meta("act.weight", &[8]),
    ];
    let (out, undecided) = burn_plan(&tensors, &Context::default());
    assert_eq!(out[0], ("conv.weight".to_string(), vec![8, 3, 3, 3]));
    assert_eq!(out[2].0, "act.weight");
    assert_eq!(undecided, ["act.weight"]);
    // ... which module classes (PReLU -> alpha) or the target (gamma) settle.
    let m = modules(&[("act", "torch.nn.modules.activation.PReLU")]);
    let ctx = Context {
        modules: &m,
        target: None,
    };
    let (out, undecided) = burn_plan(&tensors, &ctx);
    assert_eq!(out[2].0, "act.alpha");
    assert!(undecided.is_empty());
    let target = [TargetTensor::new("act.gamma", &[8])];
    let ctx = Context {
        modules: &[],
        target: Some(&target),
    };
    assert_eq!(burn_plan(&tensors, &ctx).0[2].0, "act.gamma");
    // DataParallel-wrapped module paths still name the classes after strip-prefix.
    let m = modules(&[("module.act", "torch.nn.modules.normalization.RMSNorm")]);
    let ctx = Context {
        modules: &m,
        target: None,
    };
    assert_eq!(burn_plan(&tensors, &ctx).0[2].0, "act.gamma");

    // A projected LSTM has no Burn counterpart; a class that contradicts the shapes is not
    // trusted; MHA's bias_k / bias_v have no Burn field.
    let tensors = [
        meta("lstm.weight_ih_l0", &[16, 3]),
        meta("lstm.weight_hh_l0", &[16, 2]),
        meta("lstm.weight_hr_l0", &[2, 4]),
        meta("gru.weight_ih_l0", &[16, 3]),
        meta("gru.weight_hh_l0", &[16, 4]),
        meta("attn.in_proj_weight", &[12, 4]),
        meta("attn.bias_k", &[1, 1, 4]),
    ];
    let m = modules(&[("gru", "torch.nn.modules.rnn.GRU")]);
    let ctx = Context {
        modules: &m,
        target: None,
    };
    let (out, undecided) = burn_plan(&tensors, &ctx);
    assert_eq!(
        undecided,
        [
            "lstm.weight_ih_l0",
            "lstm.weight_hh_l0",
            "lstm.weight_hr_l0",
            "gru.weight_ih_l0",
            "gru.weight_hh_l0",
            "attn.bias_k"
        ]
    );
    assert!(out
        .iter()
        .any(|(n, s)| n == "attn.query.weight" && s == &[4, 4]));
}

#[test]
fn lstm_without_bias_and_root_level_names() {
    // nn.LSTM(bias=False) saved on its own: names at the root.
    let tensors = [meta("weight_ih_l0", &[8, 3]), meta("weight_hh_l0", &[8, 2])];
    let (out, undecided) = burn_plan(&tensors, &Context::default());
    assert!(undecided.is_empty());
    assert_eq!(
        out[0],
        ("input_gate.input_transform.weight".to_string(), vec![3, 2])
    );
    assert_eq!(
        out[7],
        (
            "output_gate.hidden_transform.weight".to_string(),
            vec![2, 2]
        )
    );
}
