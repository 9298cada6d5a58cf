//! `torchport inspect` through the real binary: the table, the JSON contract of docs/CONTRACTS.md,
//! and exit code 2 with one sentence on stderr for hostile files.

use crate::util::{root, torchport};

#[test]
fn json_lists_what_torch_loaded() {
    let out = torchport(&["inspect", "examples/data/lstm_linear.pt", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let want: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root().join("tests/fixtures/torch_save/lstm_linear.pt.expected.json"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(got["format"], "torch-zip");
    let got_t = got["tensors"].as_array().unwrap();
    let want_t = want["tensors"].as_array().unwrap();
    assert_eq!(got_t.len(), want_t.len());
    for (g, w) in got_t.iter().zip(want_t) {
        for key in ["name", "dtype", "shape", "nbytes"] {
            assert_eq!(g[key], w[key], "{key} of {}", w["name"]);
        }
    }
    let params: u64 = want_t
        .iter()
        .map(|t| {
            t["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .product::<u64>()
        })
        .sum();
    assert_eq!(got["totals"]["parameters"], params);
    let globals: Vec<String> = got["globals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            format!(
                "{}.{} {}",
                g["module"].as_str().unwrap(),
                g["name"].as_str().unwrap(),
                g["class"].as_str().unwrap()
            )
        })
        .collect();
    assert!(
        globals.contains(&"torch._utils._rebuild_tensor_v2 known-safe".to_string()),
        "{globals:?}"
    );
}

#[test]
fn table_shows_names_values_and_modules() {
    let out = torchport(&["inspect", "tests/fixtures/torch_save/training_ckpt.pt"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("format:  torch-zip"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("state_dict.fc.weight ") || l.starts_with("state_dict.")),
        "{text}"
    );
    assert!(text.contains("epoch = 3"), "{text}");
    assert!(text.contains("np_scalar = numpy.float64(0.5)"), "{text}");
    assert!(
        text.contains("args = <argparse.Namespace object>"),
        "{text}"
    );

    let out = torchport(&["inspect", "tests/fixtures/torch_save/whole_module.pt"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("(root)  tiny_models.TinyNet"), "{text}");
    assert!(text.contains("tiny_models.TinyNet  [unlisted]"), "{text}");
}

#[test]
fn hostile_files_exit_2_with_one_sentence() {
    for (file, word) in [
        ("tests/fixtures/hostile/os_system.pt", "posix.system"),
        ("tests/fixtures/hostile/memo_bomb.pt", "shared references"),
        ("tests/fixtures/hostile/oob_view.pt", "storage holds only"),
        (
            "tests/fixtures/hostile/random.bin",
            "not a file torchport recognizes",
        ),
        ("no/such/file.pt", "cannot read the file"),
    ] {
        let out = torchport(&["inspect", file]);
        assert_eq!(out.status.code(), Some(2), "{file}");
        assert!(out.stdout.is_empty(), "{file}: nothing on stdout");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "{file}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(file) && err.contains(word),
            "{file}: {err}"
        );
    }
}

#[test]
fn tied_weights_are_reported() {
    // gen_frameworks.py `tied`: torch saved `head.weight` and `embed.weight` as one storage.
    let out = torchport(&["inspect", "tests/fixtures/frameworks/tied.pt", "--json"]);
    assert!(out.status.success());
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = got["tensors"].as_array().unwrap();
    assert_eq!(t[0]["name"], "embed.weight");
    assert!(t[0].get("tied_to").is_none(), "{}", t[0]);
    assert_eq!(t[1]["name"], "head.weight");
    assert_eq!(t[1]["tied_to"], "embed.weight");
    let out = torchport(&["inspect", "tests/fixtures/frameworks/tied.pt"]);
    let text = String::from_utf8(out.stdout).unwrap();
    let row = text.lines().find(|l| l.starts_with("head.weight")).unwrap();
    assert!(row.ends_with("tied to embed.weight"), "{row}");
    // Distinct tensors are not tied, even when they share a storage size and shape.
    let out = torchport(&["inspect", "tests/fixtures/frameworks/mlp.pt", "--json"]);
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(got["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t.get("tied_to").is_none()));
}

/// A real tied model: transformers' GPT2LMHeadModel (tiny config) saved as a
/// `pytorch_model.bin` is, where `lm_head.weight` is `transformer.wte.weight`
/// (tests/fixtures/gen/gen_tied_hf.py). `inspect` reports exactly the ties torch holds
/// (gpt2_tiny.bin.tied.json, from the loaded tensors' storages), and no others.
#[test]
fn a_transformers_tied_lm_head_is_reported() {
    let fixture = "tests/fixtures/frameworks/gpt2_tiny.bin";
    let want: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(
        &std::fs::read(root().join(format!("{fixture}.tied.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(want["lm_head.weight"], "transformer.wte.weight");
    let out = torchport(&["inspect", fixture, "--json"]);
    assert!(out.status.success());
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tensors = got["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 17);
    let ours: serde_json::Map<String, serde_json::Value> = tensors
        .iter()
        .filter_map(|t| Some((t["name"].as_str()?.to_string(), t.get("tied_to")?.clone())))
        .collect();
    assert_eq!(ours, want);
}
