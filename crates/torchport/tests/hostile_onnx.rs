//! Hostile ONNX input: each crafted model in `tests/fixtures/hostile_onnx/` (made by
//! `tests/fixtures/gen/gen_onnx.py`, listed in its manifest.json) gets one clear error naming
//! the file and the problem; every truncation of the real ONNX fixtures (and of the external
//! weights file) and thousands of byte mutations either fail cleanly or read back exactly
//! what the intact model holds — never a panic, never wrong numbers.

mod common;

use std::path::Path;

use common::fixtures::fixture_dir as dir;
use common::sweep::{check_cases, contents, mutations, read, truncations, Case};
use torchport::{Format, Limits};

/// (file, words the error must contain)
const CASES: &[Case] = &[
    ("truncated.onnx", &["not valid protobuf", "truncated"]),
    (
        "varint_overflow.onnx",
        &["initializer 0", "at byte", "invalid varint"],
    ),
    (
        "huge_length.onnx",
        &["initializer 0", "at byte", "buffer underflow"],
    ),
    (
        "deep_groups.onnx",
        &["initializer 0", "at byte", "recursion limit"],
    ),
    ("no_graph.onnx", &["no graph"]),
    (
        "raw_length_mismatch.onnx",
        &["tensor w", "raw_data holds 10 bytes", "needs 16"],
    ),
    ("dims_overflow.onnx", &["tensor w", "overflows"]),
    ("negative_dims.onnx", &["tensor w", "negative size"]),
    ("string_tensor.onnx", &["tensor names", "STRING"]),
    ("int4_tensor.onnx", &["tensor w", "INT4"]),
    (
        "typed_count_mismatch.onnx",
        &["tensor w", "float_data holds 3 values", "needs 6"],
    ),
    (
        "escape.onnx",
        &[
            "tensor w",
            "../escape.bin",
            "`..`",
            "inside the model's folder",
        ],
    ),
    (
        "absolute.onnx",
        &["tensor w", "/etc/passwd", "absolute path"],
    ),
    (
        "ext_past_end.onnx",
        &["tensor w", "ext_past_end.bin", "bytes 8..24", "16 bytes"],
    ),
    (
        "ext_huge_length.onnx",
        &["tensor w", "length 4611686018427387904", "16 bytes"],
    ),
    (
        "missing_external.onnx",
        &["tensor w", "nowhere.bin", "cannot open"],
    ),
];

#[test]
fn each_hostile_model_gets_one_clear_error() {
    for (file, _) in CASES {
        let bytes = std::fs::read(dir("hostile_onnx").join(file)).unwrap();
        assert_eq!(
            torchport::detect(&bytes),
            Some(Format::Onnx),
            "{file} is detected as ONNX"
        );
    }
    // ext_past_end.bin is the (too short) external data of ext_past_end.onnx.
    check_cases("hostile_onnx", CASES, &["ext_past_end.bin"]);
}

/// Every prefix of each ONNX fixture: an error, or (where the cut removed only fields after
/// the graph, like `opset_import`) exactly the intact model's tensors. Never a panic.
#[test]
fn every_truncation_fails_cleanly() {
    let names = ["raw_dtypes.onnx", "typed_fields.onnx", "torch_export.onnx"];
    let (checked, _) = truncations(&read("onnx", &names), None);
    println!("checked {checked} truncations");
    assert!(checked > 3000);
}

/// The externally stored model on disk: every prefix of the model, and every prefix of
/// weights.bin, fails cleanly (a short weights file is never read past its end).
#[test]
fn external_truncations_fail_cleanly() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("onnx_external_cuts");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let model = std::fs::read(dir("onnx/external.onnx")).unwrap();
    let weights = std::fs::read(dir("onnx/weights.bin")).unwrap();
    let path = root.join("external.onnx");
    let wpath = root.join("weights.bin");
    std::fs::write(&path, &model).unwrap();
    std::fs::write(&wpath, &weights).unwrap();
    let intact = contents(&torchport::open(&path).unwrap());
    let (mut failed, mut opened) = (0, 0);
    for cut in 0..weights.len() {
        std::fs::write(&wpath, &weights[..cut]).unwrap();
        let err = torchport::open(&path).expect_err("a cut weights file");
        assert!(
            err.to_string().contains("reach past the end of the file"),
            "{err}"
        );
        failed += 1;
    }
    std::fs::write(&wpath, &weights).unwrap();
    for cut in 0..model.len() {
        std::fs::write(&path, &model[..cut]).unwrap();
        match torchport::open(&path) {
            Ok(c) => {
                assert_eq!(contents(&c), intact, "external.onnx cut at {cut}");
                opened += 1;
            }
            Err(_) => failed += 1,
        }
    }
    println!("{failed} cuts refused, {opened} kept every tensor");
    assert_eq!(failed + opened, weights.len() + model.len());
    assert!(failed > 550, "only {failed} cuts refused");
}

/// Deterministic byte mutations of real models: no panic; reading every tensor of a
/// mutated model that still opens must not panic either.
#[test]
fn mutations_never_panic() {
    let names = [
        "raw_dtypes.onnx",
        "typed_fields.onnx",
        "torch_export.onnx",
        "external.onnx",
    ];
    let (total, opened) = mutations(&read("onnx", &names), 750, 0x9e37_79b9_7f4a_7c15);
    println!("{total} mutated models, {opened} still opened");
    assert_eq!(total, 3000);
    assert!(opened > 100, "mutations of data bytes still open: {opened}");
}

/// The tensor count and dimension limits apply to ONNX initializers.
#[test]
fn limits_apply() {
    let bytes = std::fs::read(dir("onnx/raw_dtypes.onnx")).unwrap();
    let few = Limits {
        max_tensors: 3,
        ..Limits::default()
    };
    let err = torchport::open_bytes("m.onnx", bytes.clone(), &few)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("24 initializers") && err.contains("max_tensors"),
        "{err}"
    );
    let flat = Limits {
        max_ndim: 2,
        ..Limits::default()
    };
    let err = torchport::open_bytes("m.onnx", bytes, &flat)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("float32.weight") && err.contains("max_ndim"),
        "{err}"
    );
}
