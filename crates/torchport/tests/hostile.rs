//! Hostile input: each crafted file in `tests/fixtures/hostile/` (made by
//! `tests/fixtures/gen/gen_hostile.py`) gets one clear error naming the file and the
//! problem; every truncation of real fixtures and thousands of byte mutations either fail
//! cleanly or read back exactly what the intact file holds — never a panic, never wrong
//! numbers.

mod common;

use std::path::PathBuf;

use common::fixtures;
use common::sweep::{check_cases, mutations, read, truncations, Case, Rng};
use common::targets;

use torchport::Limits;

/// (file, words the error must contain)
const CASES: &[Case] = &[
    ("os_system.pt", &["posix.system", "refusing", "byte"]),
    ("builtins_eval.pt", &["builtins.eval", "refusing"]),
    (
        "os_system_legacy.pt",
        &["posix.system", "refusing", "main pickle"],
    ),
    (
        "os_system_tar.pt",
        &["os.system", "refusing", "tar member pickle"],
    ),
    // Stopped by whichever budget for shared references runs out first.
    ("memo_bomb.pt", &["shared references", "(Limits::max_"]),
    ("deep_nesting.pt", &["max_stack_depth"]),
    ("oob_view.pt", &["tensor w", "storage holds only 64 bytes"]),
    ("overflow_view.pt", &["tensor w", "overflows"]),
    ("truncated_zip.pt", &["zip archive is corrupt or truncated"]),
    ("truncated_legacy.pt", &["truncated"]),
    (
        "missing_storage.pt",
        &["tensor w", "archive/data/7", "missing"],
    ),
    ("random.bin", &["not a file torchport recognizes"]),
    ("empty.pt", &["empty"]),
    ("huge_string.pt", &["BINUNICODE8", "truncated"]),
];

#[test]
fn each_hostile_file_gets_one_clear_error() {
    check_cases("hostile", CASES, &[]);
}

/// Every prefix of a real file: an error, or (only where the cut removed nothing the
/// format needs) exactly the intact file's tensors. Never a panic, never different bytes.
#[test]
fn every_truncation_fails_cleanly() {
    let names = [
        "proto2.pt",
        "legacy.pt",
        "tar.pt",
        "views.pt",
        "bigendian.pt",
    ];
    let (checked, _) = truncations(&read("torch_save", &names), Some(1500));
    println!("checked {checked} truncations");
    assert!(checked > 3000);
}

/// Deterministic byte mutations of real files: no panic; a mutated file that still opens
/// may hold other numbers (the bytes changed), but reading every tensor must not panic.
#[test]
fn mutations_never_panic() {
    let names = [
        "proto2.pt",
        "legacy.pt",
        "tar.pt",
        "whole_module.pt",
        "dtypes.pt",
    ];
    let (total, opened) = mutations(&read("torch_save", &names), 600, 0x2545_f491_4f6c_dd1d);
    println!("{total} mutated files, {opened} still opened");
    assert_eq!(total, 3000);
}

/// Every fixture file of every folder but the ops listings (`.txt`).
fn all_fixture_files() -> Vec<PathBuf> {
    let mut files = fixtures::all_fixture_files();
    files.retain(|p| !p.to_string_lossy().ends_with(".txt"));
    files
}

/// The CI smoke run of the fuzz targets: every fixture of every directory (and the sharded
/// indexes), mutated (bytes replaced, inserted, removed, runs duplicated), through its
/// format's fuzz target (`targets::target_for`): open, data and the security scan; rules
/// files are parsed and applied.
#[test]
fn every_fixture_survives_mutation() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut rand = move || rng.draw();
    let mut files = all_fixture_files();
    files.extend(
        [
            "formats/sharded_st/model.safetensors.index.json",
            "formats/sharded_bin/pytorch_model.bin.index.json",
        ]
        .map(fixtures::fixture_dir),
    );
    let (mut total, mut opened) = (0, 0);
    for path in &files {
        let full = std::fs::read(path).unwrap();
        let target = targets::target_for(path);
        targets::run(target, &full);
        // Fewer mutations of the large files, so the whole run stays around a second.
        let n = (400_000 / full.len().max(1)).clamp(4, 120);
        for _ in 0..n {
            let mut m = full.clone();
            for _ in 0..(rand() % 4 + 1) {
                let len = m.len();
                let at = (rand() as usize) % len.max(1);
                match rand() % 4 {
                    0 if len > 0 => m[at] = rand() as u8,
                    1 => m.insert(at.min(len), rand() as u8),
                    2 if len > 0 => {
                        m.remove(at);
                    }
                    _ if len > 0 => {
                        let end = (at + (rand() % 64) as usize).min(len);
                        let piece = m[at..end].to_vec();
                        let to = (rand() as usize) % (len + 1);
                        m.splice(to..to, piece);
                    }
                    _ => m.push(rand() as u8),
                }
            }
            opened += usize::from(targets::run(target, &m));
            total += 1;
        }
    }
    println!(
        "{} files, {total} mutated inputs, {opened} still opened",
        files.len()
    );
    assert!(files.len() >= 27, "{} fixture files", files.len());
    assert!(total >= 2500, "{total} mutated inputs");
}

/// Names, record names and container messages come from the file: a newline in them is
/// escaped, so an error stays one line and a file cannot forge a second message.
#[test]
fn messages_stay_one_line_whatever_the_file_holds() {
    use common::*;
    let forged = "w\nerror: everything is fine";
    let pkl = one_tensor_pickle(forged, "FloatStorage", 16, 8, &[16], &[1]);
    let z = torch_zip(&pkl, &[("0", &floats16())]);
    let e = torchport::open_bytes("x.pt", z, &Limits::default())
        .unwrap_err()
        .to_string();
    assert!(!e.contains('\n'), "{e}");
    assert!(
        e.contains("tensor w\\nerror: everything is fine: view"),
        "{e}"
    );
    // A dangerous global spelled with a newline (STACK_GLOBAL takes any string).
    let evil = P::new().str("os").str("system\nok").op(b"\x93").stop();
    let z = torch_zip(&evil, &[("0", &floats16())]);
    let e = torchport::open_bytes("x.pt", z, &Limits::default())
        .unwrap_err()
        .to_string();
    assert!(
        !e.contains('\n') && e.contains("refusing global os.system\\nok"),
        "{e}"
    );
}
