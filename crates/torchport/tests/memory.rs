//! No input makes torchport allocate more than a small multiple of its size: a counting
//! global allocator measures the peak heap bytes while opening a file, reading every
//! tensor's data and running the security scan, for every committed fixture (hostile ones
//! included) and a set of crafted attacks (see docs/SECURITY.md for the bound and why).
//! One test in its own binary, so nothing else allocates while it measures.

mod common;

use std::sync::atomic::Ordering::Relaxed;

use common::*;
use torchport::Limits;

#[path = "common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::{LIVE, PEAK};

/// Peak heap bytes above the starting level while opening `bytes`, reading all tensor data
/// (one tensor at a time, as a converter would) and scanning.
fn peak_of(bytes: Vec<u8>) -> usize {
    let limits = Limits::default();
    let copy = bytes.clone();
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    if let Ok(c) = torchport::open_bytes("measured.pt", bytes, &limits) {
        for t in c.tensors() {
            if let Ok(d) = c.data(t) {
                std::hint::black_box(&d);
            }
        }
        std::hint::black_box(c.values());
    }
    let _ = std::hint::black_box(torchport::security::scan_bytes(
        "measured.pt",
        copy,
        &limits,
    ));
    PEAK.load(Relaxed).saturating_sub(base)
}

/// Every fixture file under tests/fixtures (any directory), not generators or expectations.
fn fixture_files() -> Vec<(String, Vec<u8>)> {
    let root = fixtures::fixture_dir("");
    let mut out: Vec<(String, Vec<u8>)> = fixtures::all_fixture_files()
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(&root).unwrap().display().to_string();
            (rel, std::fs::read(&p).unwrap())
        })
        .collect();
    out.sort();
    out
}

/// Crafted attacks on the allocator (each is also a test in tests/limits.rs).
fn crafted() -> Vec<(String, Vec<u8>)> {
    let zip16 = |pkl: Vec<u8>| torch_zip(&pkl, &[("0", &floats16())]);
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    // Memo bomb: 2^60 leaves if shared references were copied.
    let mut p = P::new().op(b"]q\x00");
    for _ in 0..60 {
        p = p.op(b"](h\x00h\x00eq\x00");
    }
    out.push(("memo bomb, 60 levels".into(), zip16(p.stop())));
    // A 100 KB string referenced 10,000 times.
    let mut p = P::new()
        .str(&"s".repeat(100_000))
        .op(b"q\x00")
        .op(b"0]")
        .mark();
    for _ in 0..10_000 {
        p = p.op(b"h\x00");
    }
    out.push(("shared 100 KB string ×10k".into(), zip16(p.op(b"e").stop())));
    // A 10 KB key at each of 300 nested levels.
    let mut p = P::new().str(&"k".repeat(10_000)).op(b"q\x00").op(b"0");
    for _ in 0..300 {
        p = p.op(b"}").op(b"h\x00");
    }
    p = p.op(b"N");
    for _ in 0..300 {
        p = p.op(b"s");
    }
    out.push(("10 KB key nested 300 deep".into(), zip16(p.stop())));
    // Node bomb: empty lists (one byte each) gathered into a list; just past a power of two
    // nodes, where the arena has just doubled.
    let mut p = P::new().mark();
    p.0.extend(std::iter::repeat_n(b']', 65_600));
    out.push(("65,600 one-byte nodes".into(), zip16(p.op(b"l").stop())));
    // Memo bomb of entries: 60,000 MEMOIZE.
    let mut p = P::new().op(b"N");
    p.0.extend(std::iter::repeat_n(0x94u8, 60_000));
    out.push(("60k MEMOIZE".into(), zip16(p.stop())));
    // A string declared 2^40 bytes long.
    let huge = P::new()
        .op(b"\x8d")
        .op(&(1u64 << 40).to_le_bytes())
        .op(b"abc")
        .stop();
    out.push(("BINUNICODE8 of 2^40".into(), zip16(huge)));
    // A 2^40-element expanded view of one float (data refused), and a 2^20 one (read).
    out.push((
        "expanded view 2^40 × 4 B".into(),
        zip16(one_tensor_pickle(
            "w",
            "FloatStorage",
            16,
            0,
            &[1 << 40],
            &[0],
        )),
    ));
    // Geometry that overflows.
    out.push((
        "overflowing view".into(),
        zip16(one_tensor_pickle(
            "w",
            "FloatStorage",
            16,
            0,
            &[1 << 32, 1 << 32],
            &[0, 0],
        )),
    ));
    // Deflated records: one that inflates past its declared size, one declaring 4 GiB.
    let zeros = vec![0u8; 2 << 20];
    let pkl = one_tensor_pickle("w", "FloatStorage", 512 << 10, 0, &[512 << 10], &[1]);
    let mut lying = zip(&[
        ("archive/data.pkl", &pkl, true),
        ("archive/data/0", &zeros, true),
    ]);
    patch_sizes(&mut lying, "archive/data/0", None, Some(1000));
    out.push(("deflated: record inflating past 1000 B".into(), lying));
    out.push((
        "deflated: 2 MiB of zeros, sizes honest".into(),
        zip(&[
            ("archive/data.pkl", &pkl, true),
            ("archive/data/0", &zeros, true),
        ]),
    ));
    let mut short = zip(&[
        ("archive/data.pkl", &pkl, true),
        ("archive/data/0", &floats16(), true),
    ]);
    patch_sizes(&mut short, "archive/data/0", None, Some(u32::MAX - 1));
    out.push(("deflated: record declaring 4 GiB".into(), short));
    // A legacy storage declaring 2^60 elements.
    out.push((
        "legacy storage of 2^60 elements".into(),
        legacy(&P::new().op(b"N").stop(), &["0"], &[(1 << 60, &floats16())]),
    ));
    // A tar member declaring a huge record count.
    let count = P::new().int(1 << 40).stop();
    out.push((
        "tar with 2^40 storages declared".into(),
        tar(&[
            ("storages", &count),
            ("tensors", &count),
            ("pickle", &P::new().op(b"N").stop()),
        ]),
    ));
    out
}

#[test]
fn peak_heap_is_a_small_multiple_of_the_input() {
    let mut rows = Vec::new();
    for (name, bytes) in fixture_files().into_iter().chain(crafted()) {
        let size = bytes.len();
        let peak = peak_of(bytes);
        rows.push((name, size, peak));
    }
    println!(
        "{:<50} {:>9} {:>11} {:>7}",
        "input", "bytes", "peak heap", "ratio"
    );
    for (name, size, peak) in &rows {
        println!(
            "{name:<50} {size:>9} {peak:>11} {:>7.1}",
            *peak as f64 / (*size).max(1) as f64
        );
    }
    // The bound (docs/SECURITY.md, "Memory"): the pickle machine's arena holds up to one
    // 56-byte node per input byte, and the walk one named value per node, so a pickle made
    // only of one-byte opcodes that each create a node costs about 270 bytes per byte at
    // the moment the arena and value list have just doubled (measured: 271×). Tensor data
    // is never copied from a mapped file; shared references are bounded by the copy budget
    // (at least 1 MiB).
    for (name, size, peak) in rows.iter().filter(|r| !r.0.starts_with("deflated")) {
        let bound = 320 * size + (2 << 20);
        assert!(
            *peak <= bound,
            "{name}: peak {peak} bytes > 320 × {size} + 2 MiB"
        );
    }
    // Deflate legitimately expands up to 1032:1 (a record of zeros): deflated records
    // cost up to that much, capped in total by Limits::max_decompressed.
    for (name, size, peak) in rows.iter().filter(|r| r.0.starts_with("deflated")) {
        let bound = 1100 * size + (2 << 20);
        assert!(
            *peak <= bound,
            "{name}: peak {peak} bytes > 1100 × {size} + 2 MiB"
        );
    }
    // Files written by torch itself stay far below that.
    for (name, size, peak) in rows.iter().filter(|r| r.0.starts_with("torch_save/")) {
        let bound = 32 * size + (1 << 20);
        assert!(
            *peak <= bound,
            "{name}: peak {peak} bytes > 32 × {size} + 1 MiB"
        );
    }
    assert!(rows.len() >= 40, "{} inputs measured", rows.len());
}
