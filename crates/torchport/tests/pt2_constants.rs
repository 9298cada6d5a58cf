//! `.pt2` tensor constants and program records, compared with what torch itself holds
//! (`tests/fixtures/gen/gen_archives.py` writes `<file>.constants.json` + `.constants.bin`
//! from `torch.export.load(f).constants`): names in order, dtypes, shapes, every byte, in
//! the packaged, pickled-weight, legacy (`data/constants/model.pt`) and v0
//! (`serialized_constants.pt`) layouts; constants stay out of `tensors()`; a constant whose
//! view runs past its record, or whose record is missing, is refused with one clear error.

use std::io::{Cursor, Read, Write};
use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use torchport::{Checkpoint, Limits, Value};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/archives")
}

const VARIANTS: [&str; 4] = ["cnn.pt2", "cnn_pickled.pt2", "cnn_legacy.pt2", "cnn_v0.pt2"];

fn json(path: &Path) -> Json {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Compare the constants of `ckpt` with torch's; returns how many were checked.
fn check_constants(ckpt: &Checkpoint, file: &str) -> usize {
    let want = json(&fixtures().join(format!("{file}.constants.json")));
    let bin = std::fs::read(fixtures().join(format!("{file}.constants.bin"))).unwrap();
    let want = want["constants"].as_array().unwrap();
    let names: Vec<&str> = ckpt.constants().iter().map(|t| t.name.as_str()).collect();
    let want_names: Vec<&str> = want.iter().map(|w| w["name"].as_str().unwrap()).collect();
    assert_eq!(names, want_names, "{file}: constant names in torch's order");
    for (t, w) in ckpt.constants().iter().zip(want) {
        let ctx = format!("{file}: {}", t.name);
        assert_eq!(t.dtype.name(), w["dtype"], "{ctx}: dtype");
        let shape: Vec<usize> = serde_json::from_value(w["shape"].clone()).unwrap();
        assert_eq!(t.shape, shape, "{ctx}: shape");
        let (off, n) = (
            w["offset"].as_u64().unwrap() as usize,
            w["nbytes"].as_u64().unwrap() as usize,
        );
        let data = ckpt.data(t).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        assert!(
            data[..] == bin[off..off + n],
            "{ctx}: bytes differ from torch's"
        );
        assert!(ckpt.storage(t).is_some(), "{ctx}: has a storage");
    }
    want.len()
}

/// Constants are read in every layout, from a file and from memory, and the state_dict
/// tensors, values and storage count are what they were without them.
#[test]
fn constants_match_torch_in_every_layout() {
    let mut checked = 0;
    for file in VARIANTS {
        let path = fixtures().join(file);
        let expected = json(&fixtures().join(format!("{file}.expected.json")));
        let bytes = std::fs::read(&path).unwrap();
        let from_memory = torchport::open_bytes(file, bytes, &Limits::default()).unwrap();
        for ckpt in [torchport::open(&path).unwrap(), from_memory] {
            checked += check_constants(&ckpt, file);
            // tensors() is the state_dict only.
            let names: Vec<&str> = ckpt.tensors().iter().map(|t| t.name.as_str()).collect();
            let want: Vec<&str> = expected["tensors"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["name"].as_str().unwrap())
                .collect();
            assert_eq!(names, want, "{file}: tensors are the state_dict");
            for c in ckpt.constants() {
                assert!(ckpt.tensor(&c.name).is_none(), "{file}: {}", c.name);
                let v = ckpt.values().iter().find(|(n, _)| n == &c.name);
                assert_eq!(
                    v.map(|(_, v)| v),
                    Some(&Value::Object("torch.Tensor".into())),
                    "{file}: {} is still listed among the values",
                    c.name
                );
            }
            if file != "cnn_pickled.pt2" {
                // One raw record (or nested storage) per state_dict tensor; constants' own
                // storages are not counted.
                assert_eq!(ckpt.storage_count(), ckpt.tensors().len(), "{file}");
            }
        }
    }
    assert_eq!(checked, 16, "2 constants x 4 layouts x (file, memory)");
}

/// The constant values torch computed: `torch.tensor([1.0, 2.0, 3.0])` lifted, and the
/// non-persistent buffer `torch.full((3,), 0.25)`.
#[test]
fn constant_values() {
    let ckpt = torchport::open(fixtures().join("cnn.pt2")).unwrap();
    let f32s = |name: &str| -> Vec<f32> {
        let t = ckpt.constants().iter().find(|t| t.name == name).unwrap();
        ckpt.data(t)
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    };
    assert_eq!(f32s("lifted_tensor_0"), [1.0, 2.0, 3.0]);
    assert_eq!(f32s("shift"), [0.25, 0.25, 0.25]);
}

/// The record bytes of an archive, in order.
fn records(path: &Path) -> Vec<(String, Vec<u8>)> {
    let mut z = zip::ZipArchive::new(std::fs::File::open(path).unwrap()).unwrap();
    (0..z.len())
        .map(|i| {
            let mut f = z.by_index(i).unwrap();
            let name = f.name().unwrap().into_owned();
            let mut data = Vec::new();
            f.read_to_end(&mut data).unwrap();
            (name, data)
        })
        .collect()
}

/// `programs()` hands out each program record exactly as stored.
#[test]
fn program_json_is_the_record() {
    for (file, record) in [
        ("cnn.pt2", "cnn/models/model.json"),
        ("cnn_legacy.pt2", "cnn_legacy/models/model.json"),
        ("cnn_v0.pt2", "serialized_exported_program.json"),
    ] {
        let path = fixtures().join(file);
        let ckpt = torchport::open(&path).unwrap();
        let programs: Vec<(&str, &[u8])> = ckpt.programs().collect();
        let stored = records(&path)
            .into_iter()
            .find(|(n, _)| n == record)
            .unwrap()
            .1;
        assert_eq!(programs.len(), 1, "{file}");
        assert_eq!(programs[0].0, record, "{file}");
        assert!(programs[0].1 == stored.as_slice(), "{file}: JSON bytes");
        let program: Json = serde_json::from_slice(programs[0].1).unwrap();
        assert!(
            program["graph_module"]["graph"]["nodes"].is_array(),
            "{file}"
        );
    }
    let npy =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/export/tiny.input_0.npy");
    assert_eq!(torchport::open(npy).unwrap().programs().len(), 0);
}

/// cnn.pt2 with its records rewritten by `edit` (name, bytes) → bytes, or dropped.
fn edited(edit: impl Fn(&str, Vec<u8>) -> Option<Vec<u8>>) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, data) in records(&fixtures().join("cnn.pt2")) {
        if let Some(data) = edit(&name, data) {
            w.start_file(name, opts).unwrap();
            w.write_all(&data).unwrap();
        }
    }
    w.finish().unwrap().into_inner()
}

const CONFIG: &str = "cnn/data/constants/model_constants_config.json";

fn open_err(bytes: Vec<u8>) -> String {
    torchport::open_bytes("bad.pt2", bytes, &Limits::default())
        .expect_err("refused")
        .to_string()
}

/// A constant whose declared view (storage offset 1 + 3 floats) runs past its 12-byte record.
#[test]
fn constant_view_past_its_record_is_refused() {
    let bytes = edited(|name, data| {
        if name != CONFIG {
            return Some(data);
        }
        let mut config: Json = serde_json::from_slice(&data).unwrap();
        config["config"]["shift"]["tensor_meta"]["storage_offset"]["as_int"] = 1.into();
        Some(serde_json::to_vec(&config).unwrap())
    });
    assert_eq!(
        open_err(bytes),
        "bad.pt2: tensor shift: view (offset 1, size [3], stride [1]) reaches byte 16 but its \
         storage holds only 12 bytes (record cnn/data/constants/tensor_1, as its config declares)"
    );
}

/// A constant whose record is not in the archive.
#[test]
fn missing_constant_record_is_refused() {
    let bytes = edited(|name, data| (name != "cnn/data/constants/tensor_0").then_some(data));
    assert_eq!(
        open_err(bytes),
        "bad.pt2: tensor lifted_tensor_0: its constant record cnn/data/constants/tensor_0 is \
         missing from the archive"
    );
}
