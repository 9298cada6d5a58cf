//! Hostile TorchScript and `.pt2` archives: each crafted file in
//! `tests/fixtures/hostile_archives/` (made by `tests/fixtures/gen/gen_archives.py`) gets one
//! clear error naming the file and the problem; every truncation of the real archives and
//! thousands of byte mutations either fail cleanly or read back exactly what the intact file
//! holds — never a panic, never different numbers.

mod common;

use common::fixtures::fixture_dir as dir;
use common::sweep::{check_cases, mutations, read, truncations, Case};
use torchport::Limits;

/// (file, words the error must contain)
const CASES: &[Case] = &[
    ("ts_os_system.pt", &["os.system", "refusing", "data.pkl"]),
    (
        "ts_huge_parameters.pt",
        &["__parameters__", "code/__torch__.py", "max_code_line"],
    ),
    (
        "ts_param_not_tensor.pt",
        &[
            "(root)",
            "declares parameter training",
            "its value is a bool",
        ],
    ),
    ("ts_self_cycle.pt", &["module self", "contains itself"]),
    (
        "ts_rebuild_cycle.pt",
        &["tensor w", "nest more than 16 deep"],
    ),
    (
        "ts_missing_code.pt",
        &["BatchNorm2d", "no code record", "batchnorm.py"],
    ),
    (
        "ts_missing_storage.pt",
        &["tensor bn.bias", "data/3", "missing"],
    ),
    (
        "pt2_corrupt_json.pt2",
        &[
            "model_weights_config.json",
            "not a valid weights config",
            "line 1",
        ],
    ),
    (
        "pt2_corrupt_model.pt2",
        &["models/model.json", "not a valid program"],
    ),
    (
        "pt2_missing_weight.pt2",
        &["tensor fc.weight", "data/weights/weight_4", "missing"],
    ),
    (
        "pt2_shape_too_large.pt2",
        &[
            "tensor fc.weight",
            "[30, 8]",
            "holds only 96 bytes",
            "weight_4",
        ],
    ),
    (
        "pt2_huge_shape.pt2",
        &["tensor fc.weight", "4611686018427387904", "overflows"],
    ),
    ("pt2_truncated.pt2", &["truncated", "starting at byte"]),
    (
        "pt2_v0_no_state_dict.pt2",
        &["serialized_state_dict.pt", "missing"],
    ),
];

#[test]
fn each_hostile_archive_gets_one_clear_error() {
    check_cases("hostile_archives", CASES, &[]);
}

/// A higher `max_code_line` reads past the long line; the made-up names then have no
/// attribute, which is its own clear error.
#[test]
fn huge_declaration_within_a_raised_limit() {
    let limits = Limits {
        max_code_line: 4 << 20,
        ..Limits::default()
    };
    let err = torchport::open_with(dir("hostile_archives/ts_huge_parameters.pt"), &limits)
        .expect_err("made-up parameters")
        .to_string();
    assert!(
        err.contains("declares parameter p, but data.pkl gives it no value"),
        "{err}"
    );
}

const REAL: &[&str] = &[
    "traced_cnn.pt",
    "scripted_lstm.pt",
    "cnn.pt2",
    "cnn_v0.pt2",
    "cnn_pickled.pt2",
];

/// Every prefix of a real archive: an error, or exactly the intact file's tensors.
#[test]
fn every_truncation_fails_cleanly() {
    let (checked, _) = truncations(&read("archives", REAL), Some(600));
    println!("checked {checked} truncations");
    assert!(checked >= 3000);
}

/// Deterministic byte mutations: no panic, and every tensor of a file that still opens reads
/// (or fails) cleanly.
#[test]
fn mutations_never_panic() {
    let (total, opened) = mutations(&read("archives", REAL), 500, 0x9e37_79b9_7f4a_7c15);
    println!("{total} mutated archives, {opened} still opened");
    assert_eq!(total, 2500);
}
