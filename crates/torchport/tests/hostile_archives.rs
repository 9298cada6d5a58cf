//! Hostile TorchScript and `.pt2` archives: each crafted file in
//! `tests/fixtures/hostile_archives/` (made by `tests/fixtures/gen/gen_archives.py`) gets one
//! clear error naming the file and the problem; every truncation of the real archives and
//! thousands of byte mutations either fail cleanly or read back exactly what the intact file
//! holds — never a panic, never different numbers.

use std::path::{Path, PathBuf};

use torchport::{Checkpoint, Limits};

fn dir(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(sub)
}

/// (file, words the error must contain)
const CASES: &[(&str, &[&str])] = &[
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
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir("hostile_archives/manifest.json")).unwrap())
            .unwrap();
    let listed = manifest.as_object().unwrap();
    assert_eq!(
        listed.len(),
        CASES.len(),
        "every hostile file has a case here"
    );
    for (file, words) in CASES {
        assert!(listed.contains_key(*file), "{file} is not in the manifest");
        let err = torchport::open(dir("hostile_archives").join(file))
            .expect_err(file)
            .to_string();
        println!("{file}: {err}");
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

fn contents(c: &Checkpoint) -> Vec<(String, Option<Vec<u8>>)> {
    c.tensors()
        .iter()
        .map(|t| (t.name.clone(), c.data(t).ok().map(|d| d.into_owned())))
        .collect()
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
    let mut checked = 0;
    for name in REAL {
        let full = std::fs::read(dir("archives").join(name)).unwrap();
        let intact =
            contents(&torchport::open_bytes(name, full.clone(), &Limits::default()).unwrap());
        let step = (full.len() / 600).max(1);
        for cut in (0..full.len()).step_by(step) {
            if let Ok(c) = torchport::open_bytes(name, full[..cut].to_vec(), &Limits::default()) {
                assert_eq!(
                    contents(&c),
                    intact,
                    "{name} cut at {cut} read different data"
                );
            }
            checked += 1;
        }
    }
    println!("checked {checked} truncations");
    assert!(checked >= 3000);
}

/// Deterministic byte mutations: no panic, and every tensor of a file that still opens reads
/// (or fails) cleanly.
#[test]
fn mutations_never_panic() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut rand = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut opened, mut total) = (0, 0);
    for name in REAL {
        let full = std::fs::read(dir("archives").join(name)).unwrap();
        for _ in 0..500 {
            let mut m = full.clone();
            for _ in 0..(rand() % 4 + 1) {
                let at = (rand() as usize) % m.len();
                m[at] = rand() as u8;
            }
            if let Ok(c) = torchport::open_bytes(name, m, &Limits::default()) {
                opened += 1;
                let _ = contents(&c);
            }
            total += 1;
        }
    }
    println!("{total} mutated archives, {opened} still opened");
    assert_eq!(total, 2500);
}
