//! Every torch.save fixture, compared with what torch itself loaded (written by
//! `tests/fixtures/gen/gen_torch_save.py` as `<file>.expected.json` + `.expected.bin`):
//! format, names in order, dtypes, shapes, strides, offsets, quantization parameters,
//! non-tensor values, storage sharing, and every tensor byte for byte.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use torchport::{Quant, TensorData, Value};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/torch_save")
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

/// Compare a value we decoded with the generator's JSON for it.
fn value_matches(ours: &Value, want: &Json) -> bool {
    match (ours, want) {
        (Value::None, Json::Null) => true,
        (Value::Bool(a), Json::Bool(b)) => a == b,
        (Value::Int(a), Json::Number(n)) => n.as_i64() == Some(*a),
        (Value::Float(a), Json::Number(n)) => n.as_f64() == Some(*a),
        (Value::Str(a), Json::String(b)) => a == b,
        (Value::Numpy { dtype, value }, Json::Object(o)) if o.contains_key("numpy") => {
            o["numpy"] == Json::String(dtype.clone()) && value_matches(value, &o["value"])
        }
        (Value::Object(class), Json::Object(o)) if o.contains_key("object") => {
            o["object"] == Json::String(class.clone())
        }
        _ => false,
    }
}

fn check_fixture(json_path: &Path) -> usize {
    let name = json_path.file_name().unwrap().to_string_lossy();
    let pt = json_path.with_file_name(name.trim_end_matches(".expected.json"));
    let bin = std::fs::read(json_path.with_file_name(name.replace(".json", ".bin"))).unwrap();
    let want: Json = serde_json::from_slice(&std::fs::read(json_path).unwrap()).unwrap();
    let ckpt = torchport::open(&pt).unwrap_or_else(|e| panic!("{e}"));
    let ctx = pt.display().to_string();

    assert_eq!(ckpt.format().name(), want["format"], "{ctx}: format");
    let want_tensors = want["tensors"].as_array().unwrap();
    let names: Vec<&str> = ckpt.tensors().iter().map(|t| t.name.as_str()).collect();
    let want_names: Vec<&str> = want_tensors
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, want_names, "{ctx}: tensor names in order");

    for (t, w) in ckpt.tensors().iter().zip(want_tensors) {
        let tctx = format!("{ctx}: {}", t.name);
        assert_eq!(t.dtype.name(), w["dtype"], "{tctx}: dtype");
        let shape: Vec<usize> = serde_json::from_value(w["shape"].clone()).unwrap();
        assert_eq!(t.shape, shape, "{tctx}: shape");
        if let Some(stride) = w.get("stride") {
            let stride: Vec<usize> = serde_json::from_value(stride.clone()).unwrap();
            assert_eq!(t.strides, stride, "{tctx}: strides");
        }
        if w.get("meta") == Some(&Json::Bool(true)) {
            assert_eq!(t.data, TensorData::Meta, "{tctx}");
            assert!(ckpt.data(t).is_err(), "{tctx}: meta data must not read");
            continue;
        }
        if w.get("sparse") == Some(&Json::Bool(true)) {
            assert!(matches!(t.data, TensorData::Unsupported { .. }), "{tctx}");
            let err = ckpt.data(t).unwrap_err().to_string();
            assert!(
                err.contains(&t.name) && err.contains("sparse"),
                "{tctx}: {err}"
            );
            continue;
        }
        if let Some(q) = w.get("quant") {
            match (&t.quant, q["scheme"].as_str().unwrap()) {
                (Some(Quant::PerTensor { scale, zero_point }), "per_tensor_affine") => {
                    assert_eq!(*scale, q["scale"].as_f64().unwrap(), "{tctx}: scale");
                    assert_eq!(*zero_point, q["zero_point"].as_i64().unwrap(), "{tctx}");
                }
                (
                    Some(Quant::PerChannel {
                        scales,
                        zero_points,
                        axis,
                    }),
                    "per_channel_affine",
                ) => {
                    let ws: Vec<f64> = serde_json::from_value(q["scales"].clone()).unwrap();
                    let wz: Vec<f64> = serde_json::from_value(q["zero_points"].clone()).unwrap();
                    assert_eq!(scales, &ws, "{tctx}: scales");
                    assert_eq!(zero_points, &wz, "{tctx}: zero points");
                    assert_eq!(*axis as u64, q["axis"].as_u64().unwrap(), "{tctx}: axis");
                }
                (ours, scheme) => panic!("{tctx}: quant {ours:?} vs {scheme}"),
            }
        }
        let off = w["offset"].as_u64().unwrap() as usize;
        let n = w["nbytes"].as_u64().unwrap() as usize;
        let data = ckpt.data(t).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(data.len(), n, "{tctx}: byte count");
        assert!(
            data[..] == bin[off..off + n],
            "{tctx}: bytes differ from torch's"
        );
        // A contiguous little-endian view is handed out without a copy.
        if t.is_contiguous() && ckpt.byte_order() == torchport::ByteOrder::Little && n > 0 {
            assert!(
                matches!(data, Cow::Borrowed(_)),
                "{tctx}: expected zero-copy"
            );
        }
    }
    // Tensors torch says share one storage must share memory here too.
    let mut groups: HashMap<&str, Vec<&torchport::TensorInfo>> = HashMap::new();
    for (t, w) in ckpt.tensors().iter().zip(want_tensors) {
        if let Some(sid) = w.get("storage_id").and_then(Json::as_str) {
            groups.entry(sid).or_default().push(t);
        }
    }
    for (sid, ts) in groups {
        // Every view's storage lies inside the largest one of its group (the root storage).
        let ranges: Vec<(usize, usize)> = ts
            .iter()
            .filter_map(|t| ckpt.storage(t))
            .map(|s| {
                (
                    s.bytes().as_ptr() as usize,
                    s.bytes().as_ptr() as usize + s.len(),
                )
            })
            .collect();
        let root = ranges.iter().max_by_key(|(a, b)| b - a).copied();
        if let Some((lo, hi)) = root {
            for &(a, b) in &ranges {
                assert!(a >= lo && b <= hi, "{ctx}: storage {sid} is not shared");
            }
        }
    }

    if let Some(values) = want.get("values").and_then(Json::as_object) {
        for (k, w) in values {
            let ours = ckpt.values().iter().find(|(n, _)| n == k);
            let (_, v) = ours
                .unwrap_or_else(|| panic!("{ctx}: value {k} missing; have {:?}", ckpt.values()));
            assert!(
                value_matches(v, w),
                "{ctx}: value {k}: ours {v:?}, torch {w}"
            );
        }
    }
    want_tensors.len()
}

#[test]
fn every_fixture_matches_torch() {
    let files = expected_files();
    let mut tensors = 0;
    for f in &files {
        tensors += check_fixture(f);
    }
    println!("checked {} fixtures, {tensors} tensors", files.len());
    assert!(files.len() >= 14, "only {} fixtures found", files.len());
    assert!(tensors >= 100, "only {tensors} tensors checked");
}
