//! TorchScript and torch.export fixtures, compared with what torch itself holds (written by
//! `tests/fixtures/gen/gen_archives.py` as `<file>.expected.json` + `.expected.bin`): format,
//! tensor names in state_dict order, dtypes, shapes, every byte, the tensors kept out of
//! state_dict (values), the TorchScript module tree and the `.pt2` graph's op counts.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use torchport::{Checkpoint, Limits, Value};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/archives")
}

fn expected_files() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(fixtures())
        .expect("fixture directory")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.to_string_lossy().ends_with(".expected.json"))
        .collect();
    v.sort();
    v
}

/// (archive path, expected JSON, expected bytes)
fn load_expected(json_path: &Path) -> (PathBuf, Json, Vec<u8>) {
    let name = json_path.file_name().unwrap().to_string_lossy();
    let archive = json_path.with_file_name(name.trim_end_matches(".expected.json"));
    let bin = std::fs::read(json_path.with_file_name(name.replace(".json", ".bin"))).unwrap();
    let want = serde_json::from_slice(&std::fs::read(json_path).unwrap()).unwrap();
    (archive, want, bin)
}

/// Compare one opened archive with torch's answer; returns the number of tensors checked.
fn check(ckpt: &Checkpoint, want: &Json, bin: &[u8], ctx: &str) -> usize {
    assert_eq!(ckpt.format().name(), want["format"], "{ctx}: format");
    let want_tensors = want["tensors"].as_array().unwrap();
    let names: Vec<&str> = ckpt.tensors().iter().map(|t| t.name.as_str()).collect();
    let want_names: Vec<&str> = want_tensors
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, want_names, "{ctx}: tensor names in state_dict order");

    for (t, w) in ckpt.tensors().iter().zip(want_tensors) {
        let tctx = format!("{ctx}: {}", t.name);
        assert_eq!(t.dtype.name(), w["dtype"], "{tctx}: dtype");
        let shape: Vec<usize> = serde_json::from_value(w["shape"].clone()).unwrap();
        assert_eq!(t.shape, shape, "{tctx}: shape");
        let off = w["offset"].as_u64().unwrap() as usize;
        let n = w["nbytes"].as_u64().unwrap() as usize;
        let data = ckpt.data(t).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(data.len(), n, "{tctx}: byte count");
        assert!(
            data[..] == bin[off..off + n],
            "{tctx}: bytes differ from torch's"
        );
        if t.is_contiguous() && n > 0 {
            assert!(
                matches!(data, Cow::Borrowed(_)),
                "{tctx}: expected zero-copy"
            );
        }
    }

    // Tensors outside state_dict: listed as values, exactly those torch has.
    let want_values = want["values"].as_object().unwrap();
    let values: BTreeMap<&str, &Value> =
        ckpt.values().iter().map(|(k, v)| (k.as_str(), v)).collect();
    assert_eq!(
        values.keys().copied().collect::<Vec<_>>(),
        want_values.keys().map(String::as_str).collect::<Vec<_>>(),
        "{ctx}: values"
    );
    for (k, w) in want_values {
        let class = w["object"].as_str().unwrap();
        assert_eq!(
            values[k.as_str()],
            &Value::Object(class.into()),
            "{ctx}: value {k}"
        );
    }

    match want.get("modules") {
        Some(modules) => {
            let want_modules: Vec<(String, String)> =
                serde_json::from_value(modules.clone()).unwrap();
            assert_eq!(ckpt.modules(), &want_modules[..], "{ctx}: module tree");
        }
        None => assert!(ckpt.modules().is_empty(), "{ctx}: no module tree"),
    }
    match want.get("graph_ops") {
        Some(ops) => {
            let want_ops: BTreeMap<String, usize> = serde_json::from_value(ops.clone()).unwrap();
            let ours: BTreeMap<String, usize> = ckpt.graph_ops().iter().cloned().collect();
            assert_eq!(
                ours.len(),
                ckpt.graph_ops().len(),
                "{ctx}: targets listed once"
            );
            assert_eq!(ours, want_ops, "{ctx}: graph op counts");
        }
        None => assert!(ckpt.graph_ops().is_empty(), "{ctx}: no graph"),
    }
    want_tensors.len()
}

#[test]
fn every_archive_matches_torch() {
    let files = expected_files();
    let mut tensors = 0;
    let mut formats = BTreeMap::new();
    for f in &files {
        let (archive, want, bin) = load_expected(f);
        let ckpt = torchport::open(&archive).unwrap_or_else(|e| panic!("{e}"));
        tensors += check(&ckpt, &want, &bin, &archive.display().to_string());
        *formats.entry(ckpt.format().name()).or_insert(0) += 1;
    }
    println!(
        "checked {} archives ({formats:?}), {tensors} tensors",
        files.len()
    );
    assert_eq!(formats.get("torchscript"), Some(&3), "{formats:?}");
    assert_eq!(formats.get("pt2"), Some(&4), "{formats:?}");
    assert!(tensors >= 65, "only {tensors} tensors checked");
}

/// The same bytes read from memory give the same answer (owned, not mapped, storages).
#[test]
fn archives_read_from_memory() {
    for f in expected_files() {
        let (archive, want, bin) = load_expected(&f);
        let bytes = std::fs::read(&archive).unwrap();
        let name = archive.display().to_string();
        let ckpt = torchport::open_bytes(&name, bytes, &Limits::default()).unwrap();
        check(&ckpt, &want, &bin, &name);
    }
}

/// The scripted LSTM's weights are named as `nn.LSTM` names them, and its plain tensor
/// attribute is kept out of the tensors.
#[test]
fn scripted_lstm_names() {
    let ckpt = torchport::open(fixtures().join("scripted_lstm.pt")).unwrap();
    let w = ckpt.tensor("lstm.weight_ih_l0").expect("lstm.weight_ih_l0");
    assert_eq!(w.shape, [20, 4]);
    assert!(w.requires_grad);
    assert!(ckpt.tensor("lstm.weight_hh_l1").is_some());
    assert!(ckpt.tensor("offset").is_none());
    assert!(
        ckpt.tensor("proj.bias").is_none(),
        "bias=False is not in state_dict"
    );
    assert!(!ckpt.tensor("scale").unwrap().requires_grad);
}

/// Tensors that alias one raw record in a `.pt2` share its storage.
#[test]
fn pt2_records_are_storages() {
    let ckpt = torchport::open(fixtures().join("cnn.pt2")).unwrap();
    assert_eq!(ckpt.storage_count(), ckpt.tensors().len());
    let fc = ckpt.tensor("fc.weight").unwrap();
    assert!(fc.requires_grad);
    assert!(ckpt.storage(fc).unwrap().is_mapped());
}
