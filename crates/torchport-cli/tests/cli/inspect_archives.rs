//! `torchport inspect` on TorchScript and `.pt2` archives, through the real binary: the
//! module tree and the graph's op counts reach the table and the JSON.

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/archives")
        .join(name)
}

fn inspect(args: &[&str], file: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_torchport"))
        .arg("inspect")
        .args(args)
        .arg(file)
        .output()
        .expect("run torchport");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

#[test]
fn pt2_graph_ops_in_json_and_table() {
    let file = fixture("cnn.pt2");
    let want: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("cnn.pt2.expected.json")).unwrap()).unwrap();
    let json: serde_json::Value = serde_json::from_str(&inspect(&["--json"], &file)).unwrap();
    assert_eq!(json["format"], "pt2");
    assert_eq!(
        json["graph_ops"], want["graph_ops"],
        "op counts as torch counts them"
    );
    assert_eq!(json["tensors"].as_array().unwrap().len(), 9);

    let table = inspect(&[], &file);
    assert!(
        table.contains("graph ops (8 distinct, 9 calls):"),
        "{table}"
    );
    let add = table
        .lines()
        .find(|l| l.trim_start().starts_with("torch.ops.aten.add.Tensor "))
        .expect("an add line");
    assert_eq!(add.split_whitespace().nth(1), Some("2"), "{table}");
}

#[test]
fn torchscript_modules_in_json_and_table() {
    let file = fixture("traced_cnn.pt");
    let json: serde_json::Value = serde_json::from_str(&inspect(&["--json"], &file)).unwrap();
    assert_eq!(json["format"], "torchscript");
    assert_eq!(json["modules"][5]["path"], "head");
    assert_eq!(
        json["modules"][5]["class"],
        "__torch__.torch.nn.modules.container.Sequential"
    );
    assert_eq!(json["graph_ops"], serde_json::json!({}));
    let table = inspect(&[], &file);
    assert!(table.contains("modules (9):"), "{table}");
    assert!(!table.contains("graph ops"), "{table}");
}

#[test]
fn pt2_constants_listed_apart_from_the_state_dict() {
    // What torch.export.load(f).constants holds, as the generator recorded it.
    for name in ["cnn.pt2", "cnn_legacy.pt2", "cnn_pickled.pt2", "cnn_v0.pt2"] {
        let file = fixture(name);
        let want: serde_json::Value = serde_json::from_slice(
            &std::fs::read(fixture(&format!("{name}.constants.json"))).unwrap(),
        )
        .unwrap();
        let json: serde_json::Value = serde_json::from_str(&inspect(&["--json"], &file)).unwrap();
        let got = json["constants"].as_array().unwrap();
        let want = want["constants"].as_array().unwrap();
        assert_eq!(got.len(), want.len(), "{name}");
        for (g, w) in got.iter().zip(want) {
            for key in ["name", "dtype", "shape", "nbytes"] {
                assert_eq!(g[key], w[key], "{name}: {key}");
            }
        }
        let tensors = json["tensors"].as_array().unwrap();
        assert!(
            tensors.iter().all(|t| t["name"] != want[0]["name"]),
            "{name}: constants are not state_dict tensors"
        );
        let table = inspect(&[], &file);
        assert!(
            table.contains(&format!(
                "\nconstants ({}, not in the state_dict):\n",
                want.len()
            )),
            "{name}: {table}"
        );
    }
    // A file without constants has no such key.
    let json: serde_json::Value =
        serde_json::from_str(&inspect(&["--json"], &fixture("traced_cnn.pt"))).unwrap();
    assert!(json.get("constants").is_none());
}
