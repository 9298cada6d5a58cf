//! Broken numpy arrays inside a torch.save pickle: each crafted file of
//! `tests/fixtures/hostile_numpy/` (made by `tests/fixtures/gen/gen_numpy_ckpt.py`) gets one
//! clear error naming the array's key path and what is wrong — never a panic, never an
//! allocation sized by a shape the data does not back; every truncation and byte mutation
//! of the real numpy checkpoints fails cleanly or reads back what the intact file holds.

mod common;

use common::sweep::{check_cases, mutations, read, truncations, Case};

/// (file, words the error must contain)
const CASES: &[Case] = &[
    (
        "np_short_bytes.pt",
        &["tensor stats.mean", "need 16 bytes", "holds 12"],
    ),
    (
        "np_long_bytes.pt",
        &["tensor stats.mean", "need 8 bytes", "holds 12"],
    ),
    (
        "np_negative_shape.pt",
        &["tensor stats.mean", "shape", "non-negative"],
    ),
    ("np_overflow_shape.pt", &["tensor stats.mean", "overflows"]),
    (
        "np_huge_shape.pt",
        &["tensor stats.mean", "need 4398046511104 bytes", "holds 16"],
    ),
    (
        "np_unknown_dtype.pt",
        &["tensor stats.mean", "\"z9\"", "not a numpy type"],
    ),
    (
        "np_bad_endian.pt",
        &["tensor stats.mean", "byte order \"?\""],
    ),
    ("np_bad_state.pt", &["tensor stats.mean", "BUILD state"]),
    (
        "np_data_not_bytes.pt",
        &["tensor stats.mean", "data is 7, not bytes"],
    ),
    (
        "np_dtype_not_dtype.pt",
        &["tensor stats.mean", "not a numpy.dtype"],
    ),
];

#[test]
fn each_broken_array_gets_one_clear_error() {
    check_cases("hostile_numpy", CASES, &[]);
}

const REAL: &[&str] = &["numpy_zip.pt", "numpy_legacy.pt", "numpy_proto5.pt"];

#[test]
fn every_truncation_fails_cleanly() {
    let (checked, _) = truncations(&read("numpy_ckpt", REAL), Some(1200));
    println!("checked {checked} truncations");
    assert!(checked > 3000, "{checked}");
}

#[test]
fn mutations_never_panic() {
    let (total, opened) = mutations(&read("numpy_ckpt", REAL), 800, 0x6e75_6d70_795f_636b);
    println!("{total} mutated files, {opened} still opened");
    assert_eq!(total, 2400);
}
