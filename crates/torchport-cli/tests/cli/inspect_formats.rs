//! `torchport inspect` on safetensors, npy, npz and sharded fixtures, through the real
//! binary: the format name of the contract of docs/CONTRACTS.md, tensor names and dtypes as the peer
//! libraries report them, and exit code 2 with one `error:` line for a hostile file.

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(rel)
}

fn inspect_json(rel: &str) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_torchport"))
        .args(["inspect", "--json"])
        .arg(fixture(rel))
        .output()
        .expect("run torchport");
    assert!(
        out.status.success(),
        "{rel}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

fn tensor<'a>(doc: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    doc["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("no tensor {name}"))
}

#[test]
fn inspect_shows_each_format() {
    let st = inspect_json("formats/dtypes.safetensors");
    assert_eq!(st["format"], "safetensors");
    assert_eq!(tensor(&st, "bf16")["dtype"], "bfloat16");
    assert_eq!(tensor(&st, "f32")["shape"], serde_json::json!([3, 4]));
    assert_eq!(st["values"]["__metadata__.format"], "pt");

    let npy = inspect_json("formats/be_f4.npy");
    assert_eq!(npy["format"], "npy");
    assert_eq!(npy["byte_order"], "big");
    assert_eq!(tensor(&npy, "be_f4")["nbytes"], 40);

    let npz = inspect_json("formats/arrays.npz");
    assert_eq!(npz["format"], "npz");
    assert_eq!(tensor(&npz, "nested/name")["dtype"], "int16");

    let sh = inspect_json("formats/sharded_st/model.safetensors.index.json");
    assert_eq!(sh["format"], "sharded");
    assert_eq!(sh["totals"]["tensors"], 39);
    assert_eq!(sh["values"]["metadata.total_size"], 6048);
}

#[test]
fn hostile_file_exits_2_with_one_line() {
    let path = fixture("hostile_formats/sharded_escape.index.json");
    let out = Command::new(env!("CARGO_BIN_EXE_torchport"))
        .arg("inspect")
        .arg(&path)
        .output()
        .expect("run torchport");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains("../escape.safetensors"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}
