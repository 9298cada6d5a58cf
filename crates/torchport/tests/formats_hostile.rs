//! Hostile safetensors / numpy / sharded input: each crafted file in
//! `tests/fixtures/hostile_formats/` (made by `tests/fixtures/gen/gen_formats.py`) gets one
//! clear error naming the file and the problem; every truncation of the real fixtures and
//! thousands of byte mutations either fail cleanly or read back exactly what the intact
//! file holds — never a panic, never wrong numbers.

mod common;

use common::fixtures::fixture_dir as dir;
use common::sweep::{check_cases, mutations, open_as, truncations, Case};
use torchport::Limits;

/// (file, words the error must contain)
const CASES: &[Case] = &[
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

/// Every file of the folder (the helper shards/ folder aside) is in the manifest.
#[test]
fn each_hostile_file_gets_one_clear_error() {
    check_cases("hostile_formats", CASES, &[]);
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

/// The swept files, each labelled with its real path, so a sharded index finds its shards.
fn swept() -> Vec<(String, Vec<u8>)> {
    SWEPT
        .iter()
        .map(|name| {
            let path = dir("formats").join(name);
            (
                path.to_string_lossy().into_owned(),
                std::fs::read(&path).unwrap(),
            )
        })
        .collect()
}

/// Every prefix of a real file: an error, or (only where the cut removed nothing the
/// format needs) exactly the intact file's tensors. Never a panic, never different bytes.
#[test]
fn every_truncation_fails_cleanly() {
    let (checked, opened) = truncations(&swept(), Some(800));
    println!("checked {checked} truncations, {opened} still opened");
    assert!(checked > 3000);
}

/// Deterministic byte mutations of real files: no panic, and reading every tensor of a
/// mutated file that still opens does not panic either.
#[test]
fn mutations_never_panic() {
    let (total, opened) = mutations(&swept(), 400, 0x9e37_79b9_7f4a_7c15);
    println!("{total} mutated files, {opened} still opened");
    assert_eq!(total, 400 * SWEPT.len());
}

/// Index rules that need no files: duplicates, non-string shard names, empty shard paths.
#[test]
fn sharded_index_rules() {
    let name = dir("hostile_formats/x.index.json");
    let name = name.to_string_lossy();
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
