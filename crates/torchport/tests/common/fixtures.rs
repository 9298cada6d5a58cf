//! Comparing what torchport reads with what the real peer library loaded. Each generator in
//! `tests/fixtures/gen/` writes, beside a fixture `<file>`, `<file>.expected.json` (format,
//! tensors in order with dtype, shape, strides, offset and byte count into
//! `<file>.expected.bin`, non-tensor values, …) and `<file>.expected.bin` (every tensor's
//! bytes as the peer holds them); [`check_tensors`] and [`check_values`] hold a checkpoint
//! against them, byte for byte. What only one format has (quantization, storage sharing,
//! zero-copy rules, module trees) stays in its test, in the closure given to
//! [`check_tensors`] or after it.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use torchport::{Checkpoint, TensorData, TensorInfo, Value};

/// `tests/fixtures/<sub>` of the workspace.
pub fn fixture_dir(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(sub)
}

/// Every `*.expected.json` below `dir` (subfolders included), sorted.
pub fn expected_files(dir: &Path) -> Vec<PathBuf> {
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

/// Every fixture file below `tests/fixtures` (any folder but the generators' `gen/` and
/// `stems/`, whose 192 archives differ only in their names and have a test of their own; so
/// formats added later are covered without touching a test): not expectations
/// (`.expected.*`), JSON, Python or Markdown files. Sorted.
pub fn all_fixture_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![fixture_dir("")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if p.is_dir() {
                if name != "gen" && name != "stems" {
                    dirs.push(p);
                }
            } else if !name.contains(".expected.")
                && ![".json", ".py", ".md"].iter().any(|x| name.ends_with(x))
            {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// One fixture and what its peer library loaded from it.
pub struct Expected {
    /// The fixture file itself.
    pub file: PathBuf,
    /// `<file>.expected.json`.
    pub json: Json,
    /// `<file>.expected.bin`: the tensors' bytes, at the offsets the JSON gives.
    pub bin: Vec<u8>,
}

impl Expected {
    /// The expectations for fixture `file`.
    pub fn of(file: &Path) -> Expected {
        let json = std::fs::read(format!("{}.expected.json", file.display())).unwrap();
        let bin = std::fs::read(format!("{}.expected.bin", file.display())).unwrap();
        Expected {
            file: file.to_path_buf(),
            json: serde_json::from_slice(&json).unwrap(),
            bin,
        }
    }

    /// The expectations whose JSON is `json_path` (`<file>.expected.json`).
    pub fn from_json(json_path: &Path) -> Expected {
        let name = json_path.file_name().unwrap().to_string_lossy();
        Expected::of(&json_path.with_file_name(name.trim_end_matches(".expected.json")))
    }

    /// The fixture's path, for messages.
    pub fn ctx(&self) -> String {
        self.file.display().to_string()
    }

    /// The peer's tensors, in its order.
    pub fn tensors(&self) -> &[Json] {
        self.json["tensors"].as_array().unwrap()
    }

    /// Open the fixture from its path (panicking with torchport's message on error).
    pub fn open(&self) -> Checkpoint {
        torchport::open(&self.file).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// Compare `ckpt` with the peer's answer `exp`: the format's name, the tensor names in
/// order, and per tensor its dtype, shape and strides (where the peer gives them). A tensor
/// the peer marks `meta` or `sparse` must refuse its data (a sparse one naming itself and
/// "sparse"); every other one hands out exactly the peer's bytes, after which `each` runs
/// with the tensor, the peer's JSON for it, the data and a context for messages (for the
/// format's own checks: zero-copy, mapping, byte order, quantization). Returns the number of
/// tensors checked.
pub fn check_tensors(
    ckpt: &Checkpoint,
    exp: &Expected,
    ctx: &str,
    mut each: impl FnMut(&TensorInfo, &Json, &Cow<[u8]>, &str),
) -> usize {
    assert_eq!(ckpt.format().name(), exp.json["format"], "{ctx}: format");
    let want_tensors = exp.tensors();
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
        let off = w["offset"].as_u64().unwrap() as usize;
        let n = w["nbytes"].as_u64().unwrap() as usize;
        let data = ckpt.data(t).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(data.len(), n, "{tctx}: byte count");
        assert!(
            data[..] == exp.bin[off..off + n],
            "{tctx}: bytes differ from the peer library's"
        );
        each(t, w, &data, &tctx);
    }
    want_tensors.len()
}

/// Compare the checkpoint's non-tensor values with the peer's `values`: each one the peer
/// lists is there and equal. With `exact`, the peer must list values and the checkpoint
/// holds exactly those (no more); without, a fixture may leave values out.
pub fn check_values(ckpt: &Checkpoint, exp: &Expected, ctx: &str, exact: bool) {
    let Some(want) = exp.json.get("values").and_then(Json::as_object) else {
        assert!(!exact, "{ctx}: the expectations list no values");
        return;
    };
    if exact {
        let mut ours: Vec<&str> = ckpt.values().iter().map(|(k, _)| k.as_str()).collect();
        let mut theirs: Vec<&str> = want.keys().map(String::as_str).collect();
        ours.sort_unstable();
        theirs.sort_unstable();
        assert_eq!(ours, theirs, "{ctx}: values");
    }
    for (k, w) in want {
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
}

/// Whether a value we decoded is the one the generator wrote as JSON: `null`, booleans,
/// numbers, strings, `{"numpy": dtype, "value": …}` scalars, `{"numpy_array": dtype,
/// "shape": […]}` arrays that are not tensors and `{"object": class}`.
pub fn value_matches(ours: &Value, want: &Json) -> bool {
    match (ours, want) {
        (Value::None, Json::Null) => true,
        (Value::Bool(a), Json::Bool(b)) => a == b,
        (Value::Int(a), Json::Number(n)) => n.as_i64() == Some(*a),
        (Value::Float(a), Json::Number(n)) => n.as_f64() == Some(*a),
        (Value::Str(a), Json::String(b)) => a == b,
        (Value::Numpy { dtype, value }, Json::Object(o)) if o.contains_key("numpy") => {
            o["numpy"] == Json::String(dtype.clone()) && value_matches(value, &o["value"])
        }
        (Value::NumpyArray(a), Json::Object(o)) if o.contains_key("numpy_array") => {
            o["numpy_array"] == Json::String(a.dtype.clone())
                && serde_json::from_value::<Vec<usize>>(o["shape"].clone()).ok()
                    == Some(a.shape.clone())
        }
        (Value::Object(class), Json::Object(o)) if o.contains_key("object") => {
            o["object"] == Json::String(class.clone())
        }
        _ => false,
    }
}
