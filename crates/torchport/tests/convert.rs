//! The conversion pipeline as a build script calls it (`torchport::convert`): the Burn seed
//! case (LSTM(10, 20) + Linear(20, 30), tests/fixtures/remap/lstm_linear.pt) with the `burn`
//! preset and a target gives exactly the tensors PyTorch sliced
//! (lstm_linear.pt.burn.expected.*); a target it does not match stops it before the write.

use std::path::{Path, PathBuf};

use torchport::convert::{convert, Conversion};
use torchport::remap::report::load_target;
use torchport::remap::RuleSet;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/remap")
        .join(name)
}

fn burn() -> Option<RuleSet> {
    Some(RuleSet::from_presets_and_file(&["burn"], None).unwrap())
}

#[test]
fn preset_and_target_write_what_pytorch_sliced() {
    let dir = tempfile::tempdir().unwrap();
    // The target: the names and shapes PyTorch's slices have (any file torchport opens).
    let expected = fixture("lstm_linear.pt.burn.expected.json");
    let want: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&expected).unwrap()).unwrap();
    let target_file = dir.path().join("target.json");
    let target: Vec<serde_json::Value> = want["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| serde_json::json!({"name": t["name"], "shape": t["shape"]}))
        .collect();
    std::fs::write(&target_file, serde_json::to_vec(&target).unwrap()).unwrap();
    let conv = Conversion {
        rules: burn(),
        target: Some(load_target(&target_file).unwrap()),
        ..Conversion::default()
    };
    let out = dir.path().join("burn.safetensors");
    let written = convert(fixture("lstm_linear.pt"), &out, &conv).unwrap();
    assert_eq!(written.tensors, target.len());

    let bin = std::fs::read(fixture("lstm_linear.pt.burn.expected.bin")).unwrap();
    let got = torchport::open(&out).unwrap();
    assert_eq!(got.tensors().len(), target.len());
    for w in want["tensors"].as_array().unwrap() {
        let name = w["name"].as_str().unwrap();
        let t = got.tensor(name).unwrap_or_else(|| panic!("{name} missing"));
        let (off, n) = (
            w["offset"].as_u64().unwrap() as usize,
            w["nbytes"].as_u64().unwrap() as usize,
        );
        assert!(got.data(t).unwrap()[..] == bin[off..off + n], "{name}");
    }
}

#[test]
fn unmatched_target_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let target_file = dir.path().join("target.json");
    std::fs::write(
        &target_file,
        r#"[{"name": "linear.weight", "shape": [20, 30]}, {"name": "linear.bias", "shape": [30]}]"#,
    )
    .unwrap();
    let conv = Conversion {
        rules: burn(),
        target: Some(load_target(&target_file).unwrap()),
        ..Conversion::default()
    };
    let ckpt = torchport::open(fixture("lstm_linear.pt")).unwrap();
    let prepared = conv.prepare(&ckpt).unwrap();
    assert!(!prepared.matches_target());
    let report = prepared.report.as_ref().unwrap();
    assert_eq!(report.matched.len(), 2);
    assert_eq!(report.unused.len(), 16, "the LSTM's gate tensors");

    let out = dir.path().join("out.safetensors");
    let err = convert(fixture("lstm_linear.pt"), &out, &conv).unwrap_err();
    assert!(
        err.to_string().contains("does not match the target"),
        "{err}"
    );
    assert!(!out.exists());
}
