//! What each fuzz target does with its input — shared, byte for byte, by the fuzz crate
//! (`fuzz/src/lib.rs` includes this file) and by `tests/regressions.rs`, so a committed
//! crashing input runs through exactly the code path its target found it on.
//!
//! Beyond "no panic, no abort, no hang, no runaway allocation" (libFuzzer's limits), the
//! checks are the properties a caller relies on: a tensor's data is exactly `nbytes()` long
//! and decodes to `numel()` numbers; the security report lists each global once; every
//! pickle arena is internally consistent (ids in range).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use torchport::pickle::Pickle;
use torchport::{Checkpoint, Format, Limits};

/// Run `data` the way fuzz target `target` does; true when a checkpoint (or pickle) came
/// out. Targets without an entry here reach their format through content detection.
pub fn run(target: &str, data: &[u8]) -> bool {
    match target {
        "pickle" => pickle(data),
        "torch_zip" => exercise(as_zip(data)),
        "torch_legacy" => exercise(as_legacy(data)),
        "torch_tar" => exercise(as_tar(data)),
        "torchscript" => exercise_as(data.to_vec(), Format::TorchScript),
        "pt2" => exercise_as(data.to_vec(), Format::Pt2),
        "safetensors" => exercise_as(as_safetensors(data), Format::Safetensors),
        "npy" => exercise_as(force(data, 0, b"\x93NUMPY"), Format::Npy),
        "npz" => exercise_as(data.to_vec(), Format::Npz),
        "onnx" => exercise_as(data.to_vec(), Format::Onnx),
        "sharded" => sharded(data),
        "rules" => rules(data),
        _ => exercise(data.to_vec()),
    }
}

/// The target whose code path suits a fixture file, chosen by its name (the CI smoke run's
/// choice): the format's own target where there is one, `open_bytes` otherwise.
pub fn target_for(path: &Path) -> &'static str {
    let name = path
        .file_name()
        .map_or(String::new(), |n| n.to_string_lossy().into_owned());
    const BY_SUFFIX: [(&str, &str); 7] = [
        (".index.json", "sharded"),
        (".toml", "rules"),
        (".safetensors", "safetensors"),
        (".npy", "npy"),
        (".npz", "npz"),
        (".onnx", "onnx"),
        (".pt2", "pt2"),
    ];
    BY_SUFFIX
        .iter()
        .find(|(suffix, _)| name.ends_with(suffix))
        .map_or("open_bytes", |&(_, target)| target)
}

/// Input for the safetensors reader: the 8-byte header length made to fit the input (a
/// real file maps to itself), so the fuzzer spends its time in the JSON header and the data.
pub fn as_safetensors(data: &[u8]) -> Vec<u8> {
    let mut v = data.to_vec();
    if v.len() < 8 {
        v.resize(8, 0);
    }
    let room = (v.len() - 8) as u64;
    let declared = u64::from_le_bytes(v[..8].try_into().unwrap());
    let fitted = declared % (room + 1);
    v[..8].copy_from_slice(&fitted.to_le_bytes());
    v
}

/// Read the bytes as `format` (no detection) and read everything; then [`exercise`] them too
/// (detection and the security scan), so one input covers both paths.
pub fn exercise_as(bytes: Vec<u8>, format: Format) -> bool {
    let r = torchport::open_bytes_as("fuzz-input", bytes.clone(), format, &Limits::default());
    let opened = read_or_check(r);
    exercise(bytes);
    opened
}

/// What opened is read whole; an error must be one line. True when it opened.
pub fn read_or_check(opened: torchport::Result<Checkpoint>) -> bool {
    match opened {
        Ok(c) => {
            read_all(&c);
            true
        }
        Err(e) => {
            assert!(!e.to_string().contains('\n'), "one line: {e}");
            false
        }
    }
}

/// The committed shards of both sharded fixtures (safetensors and .bin), by file name.
const SHARDS: [(&str, &[u8]); 4] = [
    (
        "model-00001-of-00002.safetensors",
        include_bytes!(
            "../../../../tests/fixtures/formats/sharded_st/model-00001-of-00002.safetensors"
        ),
    ),
    (
        "model-00002-of-00002.safetensors",
        include_bytes!(
            "../../../../tests/fixtures/formats/sharded_st/model-00002-of-00002.safetensors"
        ),
    ),
    (
        "pytorch_model-00001-of-00002.bin",
        include_bytes!(
            "../../../../tests/fixtures/formats/sharded_bin/pytorch_model-00001-of-00002.bin"
        ),
    ),
    (
        "pytorch_model-00002-of-00002.bin",
        include_bytes!(
            "../../../../tests/fixtures/formats/sharded_bin/pytorch_model-00002-of-00002.bin"
        ),
    ),
];

/// A temporary folder holding [`SHARDS`], made once per process; the fuzzed index is
/// written beside them.
fn shard_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir =
            std::env::temp_dir().join(format!("torchport-fuzz-shards-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in SHARDS {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
        dir
    })
}

/// The input as a sharded index (`*.index.json`) beside real shards, opened by path.
pub fn sharded(data: &[u8]) -> bool {
    let path = shard_dir().join("fuzz.index.json");
    std::fs::write(&path, data).unwrap();
    read_or_check(torchport::open(&path))
}

/// The input as a rules file (TOML): parsed, then applied to a committed LSTM+Linear
/// checkpoint (with its module classes, so presets decide as they would for a real model)
/// and every output tensor read.
pub fn rules(data: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(data) else {
        return false;
    };
    let rules = match torchport::remap::RuleSet::from_toml_str("fuzz.toml", text) {
        Ok(r) => r,
        Err(e) => {
            assert!(!e.to_string().contains('\n'), "one line: {e}");
            return false;
        }
    };
    static MODEL: OnceLock<Checkpoint> = OnceLock::new();
    let model = MODEL.get_or_init(|| {
        let bytes = include_bytes!("../../../../tests/fixtures/remap/lstm_linear.pt");
        torchport::open_bytes("lstm_linear.pt", bytes.to_vec(), &Limits::default()).unwrap()
    });
    let ctx = torchport::remap::Context {
        modules: model.modules(),
        target: None,
    };
    let Ok((outs, _plan)) = torchport::remap::apply_with(&rules, model.out_tensors(), &ctx) else {
        return false;
    };
    for t in &outs {
        if let Ok(data) = t.data() {
            assert_eq!(data.len(), t.nbytes(), "output {} data length", t.name);
        }
    }
    true
}

/// The legacy stream's leading bytes: PROTO 2, LONG1 10, the magic number.
pub const LEGACY_HEAD: [u8; 14] = [
    0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19,
];

/// `data` with `head` written over its bytes at `at` (grown with zeros when shorter).
pub fn force(data: &[u8], at: usize, head: &[u8]) -> Vec<u8> {
    let mut v = data.to_vec();
    if v.len() < at + head.len() {
        v.resize(at + head.len(), 0);
    }
    v[at..at + head.len()].copy_from_slice(head);
    v
}

/// Input for the zip reader: starts with a local file header signature.
pub fn as_zip(data: &[u8]) -> Vec<u8> {
    force(data, 0, b"PK\x03\x04")
}

/// Input for the legacy reader: starts with the legacy magic number pickle.
pub fn as_legacy(data: &[u8]) -> Vec<u8> {
    force(data, 0, &LEGACY_HEAD)
}

/// Input for the tar reader: `ustar` at byte 257, and not taken for a zip or legacy stream.
pub fn as_tar(data: &[u8]) -> Vec<u8> {
    let mut v = force(data, 257, b"ustar");
    if v.starts_with(b"PK") || v.starts_with(&[0x80, 0x02]) {
        v[0] = b'x';
    }
    v
}

/// Open the bytes and read everything, then scan them; true when they opened.
pub fn exercise(bytes: Vec<u8>) -> bool {
    let limits = Limits::default();
    let opened = read_or_check(torchport::open_bytes("fuzz-input", bytes.clone(), &limits));
    if let Ok(report) = torchport::security::scan_bytes("fuzz-input", bytes, &limits) {
        let mut seen = std::collections::HashSet::new();
        assert!(
            report
                .globals
                .iter()
                .all(|g| seen.insert((&g.module, &g.name))),
            "a global listed twice"
        );
    }
    opened
}

/// Read every tensor's data and every value of an opened checkpoint.
pub fn read_all(c: &Checkpoint) {
    for t in c.tensors() {
        if let Ok(data) = c.data(t) {
            assert_eq!(data.len(), t.nbytes(), "tensor {} data length", t.name);
            if let Ok(values) = torchport::cast::to_f64(t.dtype, &data) {
                assert_eq!(values.len(), t.numel(), "tensor {} element count", t.name);
            }
        }
    }
    for (name, v) in c.values() {
        let _ = (name.len(), v.to_string(), v.to_json());
    }
    let _ = (
        c.parameter_count(),
        c.total_bytes(),
        c.globals(),
        c.modules(),
    );
}

/// Run the pickle machine on the bytes (whole, and as a prefix) and check the arena.
pub fn pickle(data: &[u8]) -> bool {
    let limits = torchport::pickle::Limits::default();
    let whole = torchport::pickle::parse(data, &limits);
    if let Ok(p) = &whole {
        check_arena(p);
    }
    if let Ok((p, used)) = torchport::pickle::parse_prefix(data, &limits) {
        assert!(used <= data.len());
        check_arena(&p);
    }
    whole.is_ok()
}

/// Every id stored in the arena refers to a node of the arena.
fn check_arena(p: &Pickle) {
    if let Some(v) = p.first_dangling() {
        panic!("a node refers outside the arena: {v:?}");
    }
}
