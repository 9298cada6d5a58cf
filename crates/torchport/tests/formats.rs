//! safetensors, npy, npz and sharded fixtures (`tests/fixtures/formats/`, made by
//! `tests/fixtures/gen/gen_formats.py`), compared with what the peer library itself loaded
//! (`safe_open`, `numpy.load`, `torch.load`): format, names in order, dtypes, shapes,
//! strides, byte order, metadata values, and every tensor byte for byte; plus zero-copy
//! checks (mapped storages, borrowed data).

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use torchport::{ByteOrder, Format, Value};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/formats")
}

/// Every `*.expected.json` under `dir`, sorted.
fn expected_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("fixture directory") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            out.extend(expected_files(&p));
        } else if p.to_string_lossy().ends_with(".expected.json") {
            out.push(p);
        }
    }
    out.sort();
    out
}

fn value_matches(ours: &Value, want: &Json) -> bool {
    match (ours, want) {
        (Value::Int(a), Json::Number(n)) => n.as_i64() == Some(*a),
        (Value::Str(a), Json::String(b)) => a == b,
        _ => false,
    }
}

/// Check one fixture; returns (format, tensors checked).
fn check_fixture(json_path: &Path) -> (Format, usize) {
    let name = json_path.file_name().unwrap().to_string_lossy();
    let stem = name.trim_end_matches(".expected.json");
    let file = json_path.with_file_name(stem);
    let bin = std::fs::read(json_path.with_file_name(format!("{stem}.expected.bin"))).unwrap();
    let want: Json = serde_json::from_slice(&std::fs::read(json_path).unwrap()).unwrap();
    let ckpt = torchport::open(&file).unwrap_or_else(|e| panic!("{e}"));
    let ctx = file.display().to_string();

    assert_eq!(ckpt.format().name(), want["format"], "{ctx}: format");
    let want_tensors = want["tensors"].as_array().unwrap();
    let names: Vec<&str> = ckpt.tensors().iter().map(|t| t.name.as_str()).collect();
    let want_names: Vec<&str> = want_tensors
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, want_names, "{ctx}: tensor names in order");
    // Deflated npz records are decompressed; everything else stays in the memory map.
    let mapped = !name.starts_with("compressed.npz");

    for (t, w) in ckpt.tensors().iter().zip(want_tensors) {
        let tctx = format!("{ctx}: {}", t.name);
        assert_eq!(t.dtype.name(), w["dtype"], "{tctx}: dtype");
        let shape: Vec<usize> = serde_json::from_value(w["shape"].clone()).unwrap();
        assert_eq!(t.shape, shape, "{tctx}: shape");
        let stride: Vec<usize> = serde_json::from_value(w["stride"].clone()).unwrap();
        assert_eq!(t.strides, stride, "{tctx}: strides");
        let storage = ckpt
            .storage(t)
            .unwrap_or_else(|| panic!("{tctx}: no storage"));
        assert_eq!(storage.is_mapped(), mapped, "{tctx}: storage mapped");
        if let Some(order) = w.get("byte_order").and_then(Json::as_str) {
            let ours = match storage.byte_order() {
                ByteOrder::Little => "little",
                ByteOrder::Big => "big",
            };
            if t.dtype.size() > 1 {
                assert_eq!(ours, order, "{tctx}: byte order");
            }
        }
        let off = w["offset"].as_u64().unwrap() as usize;
        let n = w["nbytes"].as_u64().unwrap() as usize;
        let data = ckpt.data(t).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(data.len(), n, "{tctx}: byte count");
        assert!(
            data[..] == bin[off..off + n],
            "{tctx}: bytes differ from the peer library's"
        );
        let swapped = storage.byte_order() == ByteOrder::Big && t.dtype.size() > 1;
        if t.is_contiguous() && !swapped {
            assert!(matches!(data, Cow::Borrowed(_)), "{tctx}: expected no copy");
        } else if n > 0 {
            assert!(matches!(data, Cow::Owned(_)), "{tctx}: gathered or swapped");
        }
    }
    let want_values = want["values"].as_object().unwrap();
    assert_eq!(
        ckpt.values().len(),
        want_values.len(),
        "{ctx}: values {:?}",
        ckpt.values()
    );
    for (k, w) in want_values {
        let (_, v) = ckpt
            .values()
            .iter()
            .find(|(n, _)| n == k)
            .unwrap_or_else(|| panic!("{ctx}: value {k} missing; have {:?}", ckpt.values()));
        assert!(
            value_matches(v, w),
            "{ctx}: value {k}: ours {v:?}, peer {w}"
        );
    }
    (ckpt.format(), want_tensors.len())
}

#[test]
fn every_fixture_matches_its_peer_library() {
    let files = expected_files(&fixtures());
    let mut tensors = 0;
    let mut formats = Vec::new();
    for f in &files {
        let (format, n) = check_fixture(f);
        tensors += n;
        formats.push(format);
    }
    println!("checked {} fixtures, {tensors} tensors", files.len());
    for f in [
        Format::Safetensors,
        Format::Npy,
        Format::Npz,
        Format::Sharded,
    ] {
        assert!(formats.contains(&f), "no {f} fixture");
    }
    assert!(files.len() >= 17, "only {} fixtures found", files.len());
    assert!(tensors >= 115, "only {tensors} tensors checked");
}

#[test]
fn detection_by_content_not_extension() {
    let cases = [
        ("dtypes.safetensors", Format::Safetensors),
        ("be_f4.npy", Format::Npy),
        ("arrays.npz", Format::Npz),
        ("compressed.npz", Format::Npz),
        ("sharded_st/model.safetensors.index.json", Format::Sharded),
    ];
    for (file, format) in cases {
        let bytes = std::fs::read(fixtures().join(file)).unwrap();
        assert_eq!(torchport::detect(&bytes), Some(format), "{file}");
        // The same bytes under a misleading name are read the same way.
        let c = torchport::open_bytes("renamed.pt", bytes, &Default::default());
        if format != Format::Sharded {
            assert_eq!(c.unwrap().format(), format, "{file}");
        }
    }
    assert_eq!(torchport::detect(b"{\"a\": 1}"), None);
    assert_eq!(torchport::detect(b"\x93NUMPX"), None);
}

#[test]
fn npy_names_follow_the_file_name() {
    let bytes = std::fs::read(fixtures().join("f32.npy")).unwrap();
    let l = torchport::Limits::default();
    for (name, tensor) in [
        ("weights.npy", "weights"),
        ("dir/x.v2.npy", "x.v2"),
        ("raw", "raw"),
        (".npy", "array"),
    ] {
        let c = torchport::open_bytes(name, bytes.clone(), &l).unwrap();
        assert_eq!(c.tensors()[0].name, tensor, "{name}");
    }
}

#[test]
fn sharded_tensors_come_from_both_shards() {
    for (dir, index) in [
        ("sharded_st", "model.safetensors.index.json"),
        ("sharded_bin", "pytorch_model.bin.index.json"),
    ] {
        let c = torchport::open(fixtures().join(dir).join(index)).unwrap();
        // Storages of tensors from different shards lie in different memory maps.
        let first = c.tensor("embed.weight").unwrap();
        let last = c.tensor("layers.11.mlp.weight").unwrap();
        let a = c.storage(first).unwrap().bytes().as_ptr() as usize;
        let b = c.storage(last).unwrap().bytes().as_ptr() as usize;
        assert_ne!(a / 4096, b / 4096, "{dir}: one shard only?");
        assert!(c.storage_count() >= 2, "{dir}");
        if dir == "sharded_bin" {
            assert!(
                c.globals()
                    .iter()
                    .any(|(m, n)| m == "torch._utils" && n.starts_with("_rebuild")),
                "{dir}: shard globals are kept: {:?}",
                c.globals()
            );
        }
    }
}
