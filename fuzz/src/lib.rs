//! What every fuzz target does with its input, so that a target is a few lines: force the
//! format's leading bytes (or not), open the bytes, read every tensor's data, and run the
//! security scan. The properties checked beyond "no panic, no abort, no hang, no runaway
//! allocation" (libFuzzer's own limits) are the ones a caller relies on:
//! - a tensor's data is exactly `nbytes()` long;
//! - every real dtype's data decodes to exactly `numel()` numbers;
//! - every pickle arena is internally consistent (ids in range).
//!
//! The same functions run the committed regression inputs in
//! `crates/torchport/tests/regressions.rs`, so a crash found here stays fixed.

use torchport::{Checkpoint, Limits};

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

/// Open the bytes and read everything, then scan them; panics only on a broken invariant.
pub fn exercise(bytes: Vec<u8>) {
    let limits = Limits::default();
    if let Ok(c) = torchport::open_bytes("fuzz-input", bytes.clone(), &limits) {
        read_all(&c);
    }
    if let Ok(report) = torchport::security::scan_bytes("fuzz-input", bytes, &limits) {
        // A report lists each global once.
        let mut seen = std::collections::HashSet::new();
        assert!(report.globals.iter().all(|g| seen.insert((&g.module, &g.name))));
    }
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
    let _ = (c.parameter_count(), c.total_bytes(), c.globals(), c.modules());
}

/// Run the pickle machine on the bytes (whole and as a prefix) and check the arena.
pub fn pickle(data: &[u8]) {
    let limits = torchport_pickle::Limits::default();
    if let Ok(p) = torchport_pickle::parse(data, &limits) {
        check_arena(&p);
    }
    if let Ok((p, used)) = torchport_pickle::parse_prefix(data, &limits) {
        assert!(used <= data.len());
        check_arena(&p);
    }
}

/// Every id a node holds refers to a node of the arena.
fn check_arena(p: &torchport_pickle::Pickle) {
    use torchport_pickle::{NodeId, Value};
    let n = p.len();
    let ok = |id: &NodeId| (id.0 as usize) < n;
    assert!(ok(&p.root()));
    for v in p.nodes() {
        let fine = match v {
            Value::List(i) | Value::Tuple(i) | Value::Set(i) | Value::FrozenSet(i) => {
                i.iter().all(ok)
            }
            Value::Dict(items) => items.iter().all(|(k, v)| ok(k) && ok(v)),
            Value::PersistentId(id) => ok(id),
            Value::Object(o) => {
                ok(&o.callable)
                    && o.args.iter().all(ok)
                    && o.kwargs.iter().all(|(k, v)| ok(k) && ok(v))
                    && o.state.as_ref().is_none_or(ok)
                    && o.list_items.iter().all(ok)
                    && o.dict_items.iter().all(|(k, v)| ok(k) && ok(v))
            }
            _ => true,
        };
        assert!(fine, "a node refers outside the arena: {v:?}");
    }
}
