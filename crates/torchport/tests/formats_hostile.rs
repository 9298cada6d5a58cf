//! Hostile safetensors / numpy / sharded input: each crafted file in
//! `tests/fixtures/hostile_formats/` (made by `tests/fixtures/gen/gen_formats.py`) gets one
//! clear error naming the file and the problem; every truncation of the real fixtures and
//! thousands of byte mutations either fail cleanly or read back exactly what the intact
//! file holds — never a panic, never wrong numbers.

use std::path::{Path, PathBuf};
use std::time::Instant;

use torchport::{Checkpoint, Limits};

fn dir(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(sub)
}

/// Open `bytes` as the file `label`. A sharded index is opened by path, written into a
/// temporary copy of its folder (read from memory it would have no folder to find its shards
/// in); anything else is read from memory.
fn open_as(label: &Path, bytes: Vec<u8>) -> torchport::Result<Checkpoint> {
    if !label.to_string_lossy().ends_with(".index.json") {
        return torchport::open_bytes(&label.to_string_lossy(), bytes, &Limits::default());
    }
    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let p = e.unwrap().path();
            let dest = to.join(p.file_name().unwrap());
            if p.is_dir() {
                copy_dir(&p, &dest);
            } else {
                std::fs::copy(&p, &dest).unwrap();
            }
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(label.parent().unwrap(), tmp.path());
    let path = tmp.path().join(label.file_name().unwrap());
    std::fs::write(&path, bytes).unwrap();
    torchport::open(&path)
}

/// (file, words the error must contain)
const CASES: &[(&str, &[&str])] = &[
    (
        "st_header_too_long.safetensors",
        &["header length says 1088 bytes", "only 80", "truncated"],
    ),
    (
        "st_header_invalid_json.safetensors",
        &["safetensors header is not valid JSON"],
    ),
    (
        "st_offsets_out_of_range.safetensors",
        &["tensor w", "data_offsets end at byte", "holds only 8 bytes"],
    ),
    (
        "st_offsets_overlap.safetensors",
        &["tensor b", "[8, 24]", "overlap tensor a"],
    ),
    (
        "st_offsets_gap.safetensors",
        &["tensor b", "[20, 36]", "gap of 4 bytes after tensor a"],
    ),
    (
        "st_trailing_data.safetensors",
        &["holds 32 bytes", "cover only 16"],
    ),
    (
        "st_dtype_unknown.safetensors",
        &["tensor w", "\"F7\"", "not one safetensors defines"],
    ),
    (
        "st_span_mismatch.safetensors",
        &["tensor w", "needs 16 bytes", "[0, 12] span 12"],
    ),
    (
        "npy_huge_shape.npy",
        &["array npy_huge_shape", "4611686018427387904", "overflows"],
    ),
    (
        "npy_shape_past_data.npy",
        &["needs 80000000000 bytes", "only 16", "truncated"],
    ),
    ("npy_object.npy", &["Python objects", "\"|O\"", "refused"]),
    (
        "npy_truncated.npy",
        &["array npy_truncated", "needs 256 bytes", "only 100"],
    ),
    (
        "npz_deflate_bomb.npz",
        &["record a.npy", "larger than its declared uncompressed size"],
    ),
    (
        "npz_huge_declared.npz",
        &["record a.npy", "1099511627776", "max_decompressed"],
    ),
    (
        "sharded_missing_shard.index.json",
        &[
            "shard model-00001-of-00001.safetensors",
            "cannot read the file",
        ],
    ),
    (
        "sharded_escape.index.json",
        &[
            "tensor w",
            "\"../escape.safetensors\"",
            "not inside the index's folder",
        ],
    ),
    (
        "sharded_absolute.index.json",
        &[
            "tensor w",
            "\"/etc/passwd\"",
            "not inside the index's folder",
        ],
    ),
    (
        "sharded_missing_tensor.index.json",
        &[
            "tensor ghost",
            "shard shards/ok.safetensors",
            "holds no tensor",
        ],
    ),
    (
        "sharded_self.index.json",
        &["shard sharded_self.index.json", "is itself a sharded index"],
    ),
    (
        "sharded_bad_json.index.json",
        &["sharded index is not JSON", "EOF"],
    ),
];

#[test]
fn each_hostile_file_gets_one_clear_error() {
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir("hostile_formats/manifest.json")).unwrap())
            .unwrap();
    let listed = manifest.as_object().unwrap();
    assert_eq!(listed.len(), CASES.len(), "every hostile file has a case");
    // Every file in the folder (the helper shards/ folder aside) is in the manifest.
    for e in std::fs::read_dir(dir("hostile_formats")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if p.is_file() && name != "manifest.json" {
            assert!(listed.contains_key(&name), "{name} is not in the manifest");
        }
    }
    for (file, words) in CASES {
        assert!(listed.contains_key(*file), "{file} is not in the manifest");
        let path = dir("hostile_formats").join(file);
        let start = Instant::now();
        let err = torchport::open(&path).expect_err(file).to_string();
        println!("{file}: {:?}: {err}", start.elapsed());
        assert!(
            err.contains(file),
            "{file}: the error names the file: {err}"
        );
        for w in *words {
            assert!(err.contains(w), "{file}: expected {w:?} in: {err}");
        }
        assert!(!err.contains('\n'), "{file}: one line: {err}");
    }
}

#[test]
fn limits_apply() {
    let path = dir("formats/arrays.npz");
    let tight = Limits {
        max_tensors: 3,
        ..Limits::default()
    };
    let err = torchport::open_with(&path, &tight).unwrap_err().to_string();
    assert!(
        err.contains("7 arrays") && err.contains("max_tensors"),
        "{err}"
    );
    let tight = Limits {
        max_decompressed: 1000,
        ..Limits::default()
    };
    let err = torchport::open_with(dir("formats/compressed.npz"), &tight)
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_decompressed"), "{err}");
    let tight = Limits {
        max_ndim: 2,
        ..Limits::default()
    };
    for f in ["be_fortran_i8.npy", "dtypes.safetensors"] {
        let r = torchport::open_with(dir("formats").join(f), &tight);
        if f.ends_with(".npy") {
            assert!(r.unwrap_err().to_string().contains("max_ndim"), "{f}");
        } else {
            assert!(r.is_ok(), "{f}: every tensor has at most 2 dimensions");
        }
    }
}

/// All tensor data of a checkpoint, for comparing a damaged file with the intact one.
fn contents(c: &Checkpoint) -> Vec<(String, Option<Vec<u8>>)> {
    c.tensors()
        .iter()
        .map(|t| (t.name.clone(), c.data(t).ok().map(|d| d.into_owned())))
        .collect()
}

const SWEPT: &[&str] = &[
    "dtypes.safetensors",
    "be_fortran_i8.npy",
    "f32.npy",
    "scalar.npy",
    "arrays.npz",
    "compressed.npz",
    "sharded_st/model.safetensors.index.json",
    "sharded_bin/pytorch_model.bin.index.json",
];

/// Every prefix of a real file: an error, or (only where the cut removed nothing the
/// format needs) exactly the intact file's tensors. Never a panic, never different bytes.
/// The name given is the fixture's real path, so a sharded index finds its shards.
#[test]
fn every_truncation_fails_cleanly() {
    let mut checked = 0;
    let mut opened = 0;
    for name in SWEPT {
        let path = dir("formats").join(name);
        let full = std::fs::read(&path).unwrap();
        let intact = contents(&open_as(&path, full.clone()).unwrap());
        let step = (full.len() / 800).max(1);
        for cut in (0..full.len()).step_by(step) {
            let r = open_as(&path, full[..cut].to_vec());
            if let Ok(c) = r {
                assert_eq!(
                    contents(&c),
                    intact,
                    "{name} cut at {cut} read different data"
                );
                opened += 1;
            }
            checked += 1;
        }
    }
    println!("checked {checked} truncations, {opened} still opened");
    assert!(checked > 3000);
}

/// Deterministic byte mutations of real files: no panic, and reading every tensor of a
/// mutated file that still opens does not panic either.
#[test]
fn mutations_never_panic() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut rand = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut opened = 0;
    let mut total = 0;
    for name in SWEPT {
        let path = dir("formats").join(name);
        let full = std::fs::read(&path).unwrap();
        for _ in 0..400 {
            let mut m = full.clone();
            for _ in 0..(rand() % 4 + 1) {
                let at = (rand() as usize) % m.len();
                m[at] = rand() as u8;
            }
            if let Ok(c) = open_as(&path, m) {
                opened += 1;
                let _ = contents(&c);
            }
            total += 1;
        }
    }
    println!("{total} mutated files, {opened} still opened");
    assert_eq!(total, 400 * SWEPT.len());
}

/// Index rules that need no files: duplicates, non-string shard names, empty shard paths.
#[test]
fn sharded_index_rules() {
    let name = dir("hostile_formats/x.index.json");
    let open = |json: &str| {
        open_as(&name, json.as_bytes().to_vec())
            .map(|c| c.tensors().len())
            .map_err(|e| e.to_string())
    };
    let e = open(r#"{"weight_map": {"w": "shards/ok.safetensors", "w": "shards/ok.safetensors"}}"#);
    assert!(e.unwrap_err().contains("tensor w is listed twice"));
    let e = open(r#"{"weight_map": {"w": 7}}"#).unwrap_err();
    assert!(
        e.contains("weight_map entry for tensor w is not a file name"),
        "{e}"
    );
    let e = open(r#"{"weight_map": {"w": ""}}"#).unwrap_err();
    assert!(e.contains("not inside the index's folder"), "{e}");
    let e = open(r#"{"weight_map": []}"#).unwrap_err();
    assert!(e.contains("sharded index is not JSON of the form"), "{e}");
    assert_eq!(open(r#"{"weight_map": {}}"#), Ok(0));
    assert_eq!(
        open(
            r#" {"metadata": {"a": [1, {"b": null}]}, "weight_map": {"w": "./shards/ok.safetensors"}}"#
        ),
        Ok(1)
    );
}
