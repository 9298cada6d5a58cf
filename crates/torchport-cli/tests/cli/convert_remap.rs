//! `torchport convert --preset/--rules/--target` through the real binary: the Burn seed case
//! (LSTM(10, 20) + Linear(20, 30)) written to safetensors equals, byte for byte, the slices
//! PyTorch computed (tests/fixtures/remap/lstm_linear.pt.burn.expected.*), and a target that
//! is not matched exactly stops the conversion with exit 1 and no file.

use crate::util::{root, torchport};

#[test]
fn preset_burn_writes_what_pytorch_sliced() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("burn.safetensors");
    let o = torchport(&[
        "convert",
        "tests/fixtures/remap/lstm_linear.pt",
        out.to_str().unwrap(),
        "--preset",
        "burn",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let fix = root().join("tests/fixtures/remap/lstm_linear.pt.burn.expected");
    let want: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fix.with_extension("expected.json")).unwrap())
            .unwrap();
    let bin = std::fs::read(fix.with_extension("expected.bin")).unwrap();
    let got = torchport::open(&out).unwrap();
    let want_t = want["tensors"].as_array().unwrap();
    assert_eq!(got.tensors().len(), want_t.len());
    for w in want_t {
        let name = w["name"].as_str().unwrap();
        let t = got.tensor(name).unwrap_or_else(|| panic!("{name} missing"));
        let shape: Vec<usize> = serde_json::from_value(w["shape"].clone()).unwrap();
        assert_eq!(t.shape, shape, "{name}");
        let (off, n) = (
            w["offset"].as_u64().unwrap() as usize,
            w["nbytes"].as_u64().unwrap() as usize,
        );
        assert!(
            got.data(t).unwrap()[..] == bin[off..off + n],
            "{name}: bytes differ"
        );
    }
}

#[test]
fn target_mismatch_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target.json");
    // A model with only the Linear: the sixteen LSTM gate tensors are unused.
    std::fs::write(
        &target,
        r#"[{"name": "linear.weight", "shape": [20, 30]}, {"name": "linear.bias", "shape": [30]}]"#,
    )
    .unwrap();
    let out = dir.path().join("out.safetensors");
    let o = torchport(&[
        "convert",
        "tests/fixtures/remap/lstm_linear.pt",
        out.to_str().unwrap(),
        "--preset",
        "burn",
        "--target",
        target.to_str().unwrap(),
    ]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!out.exists());
    let report = String::from_utf8_lossy(&o.stdout);
    assert!(report.contains("matched: 2 of 2"), "{report}");
    assert!(
        report.contains("unused") && report.contains("lstm.input_gate.input_transform.weight"),
        "{report}"
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("nothing was written"));
}

/// `--preset weight-norm` folds both of torch's weight-norm forms into `weight`: every folded
/// weight is within 1 ulp of the `module.weight` torch computed
/// (tests/fixtures/weight_norm/, written by tests/fixtures/gen/gen_weight_norm.py), and no
/// `weight_g`/`weight_v`/`original0`/`original1` is left.
#[test]
fn preset_weight_norm_writes_what_torch_computed() {
    let expected =
        torchport::open(root().join("tests/fixtures/weight_norm/expected.safetensors")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for form in ["hooks", "parametrizations"] {
        let out = dir.path().join(format!("{form}.safetensors"));
        let o = torchport(&[
            "convert",
            &format!("tests/fixtures/weight_norm/{form}.pt"),
            out.to_str().unwrap(),
            "--preset",
            "weight-norm",
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let got = torchport::open(&out).unwrap();
        for t in got.tensors() {
            assert!(
                t.name.ends_with(".weight") || t.name.ends_with(".bias"),
                "{form}: {} left unfolded",
                t.name
            );
            if !t.name.ends_with(".weight") {
                continue;
            }
            let want = expected
                .tensor(&format!("{form}.{}", t.name))
                .unwrap_or_else(|| panic!("{form}.{} in expected", t.name));
            assert_eq!(t.shape, want.shape, "{form} {}", t.name);
            let (g, w) = (got.data(t).unwrap(), expected.data(want).unwrap());
            for (a, b) in g.chunks_exact(4).zip(w.chunks_exact(4)) {
                let a = u32::from_le_bytes(a.try_into().unwrap());
                let b = u32::from_le_bytes(b.try_into().unwrap());
                assert!(a.abs_diff(b) <= 1, "{form} {}: more than 1 ulp", t.name);
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 20, "folded weights checked");
}
