//! `torchport match` through the real binary: exit codes 0 / 1 / 2, text and JSON output.

use crate::util::{text, torchport};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/remap")
        .join(name)
}

#[test]
fn burn_preset_matches_torch_layout() {
    let ckpt = fixture("lstm_linear.pt");
    let target = fixture("lstm_linear.pt.burn.expected.json");
    let (ckpt, target) = (ckpt.to_str().unwrap(), target.to_str().unwrap());

    // Without the preset: exit 1, the preset is suggested.
    let out = torchport(&["match", ckpt, "--target", target]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with("matched: 1 of 18 target tensors\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("  lstm.weight_ih_l0  float32 [80, 10]\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("  # --preset burn would match 18 of 18 target tensors (1 now)\n"),
        "{stdout}"
    );

    // With it: exit 0.
    let out = torchport(&["match", ckpt, "--target", target, "--preset", "burn"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert!(text(&out.stdout).ends_with("all 18 target tensors matched\n"));
}

#[test]
fn json_output_with_the_target_deciding_embedding_from_linear() {
    // Names alone cannot tell `emb` (Embedding) from `lin` (Linear without bias); the
    // target's shapes can.
    let ckpt = fixture("embed_linear.pt");
    let target = fixture("embed_linear_module.pt.burn.expected.json");
    let out = torchport(&[
        "match",
        ckpt.to_str().unwrap(),
        "--target",
        target.to_str().unwrap(),
        "--preset",
        "burn",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["all_matched"], true);
    assert_eq!(
        doc["report"]["matched"],
        serde_json::json!(["emb.weight", "lin.weight"])
    );
    assert_eq!(doc["undecided"], serde_json::json!([]));

    // Without the preset: exit 1, `lin.weight` is stored transposed, and the burn preset
    // (deciding by the target) fixes everything.
    let out = torchport(&[
        "match",
        ckpt.to_str().unwrap(),
        "--target",
        target.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let m = &doc["report"]["shape_mismatches"][0];
    assert_eq!(m["name"], "lin.weight");
    assert_eq!(m["have_shape"], serde_json::json!([10, 4]));
    assert_eq!(m["want_shape"], serde_json::json!([4, 10]));
    let toml = doc["report"]["suggestions"][0]["toml"].as_str().unwrap();
    assert_eq!(toml, "[[rule]]\npreset = \"burn\"\n");
}

#[test]
fn rule_file_errors_exit_2() {
    let dir = std::env::temp_dir().join(format!("torchport-match-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rules = dir.join("bad.toml");
    std::fs::write(
        &rules,
        "[[rule]]\nop = 'split'\nmatch = '^lstm\\.weight_ih_l0$'\nsizes = [1]\nto = ['a']\n",
    )
    .unwrap();
    let ckpt = fixture("lstm_linear.pt");
    let out = torchport(&[
        "match",
        ckpt.to_str().unwrap(),
        "--target",
        ckpt.to_str().unwrap(),
        "--rules",
        rules.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(
        stderr.contains("bad.toml:1: rule 1 (split): `sizes` [1] add up to 1, but `lstm.weight_ih_l0` (shape [80, 10]) has 80 along dim 0"),
        "{stderr}"
    );
    let out = torchport(&[
        "match",
        ckpt.to_str().unwrap(),
        "--target",
        "/nonexistent.json",
    ]);
    assert_eq!(out.status.code(), Some(2));
    std::fs::remove_dir_all(&dir).unwrap();
}
