//! Every resource limit of docs/SECURITY.md, proven with a crafted input: the default stops
//! the attack with one clear error naming the `Limits` field (or the tensor / record and
//! offset), and the field is adjustable through the API. Inputs are crafted here in Rust
//! (see `common/`), byte for byte what a hostile file would hold.
#![allow(clippy::result_large_err)] // helpers hand back the library's own `Error`

mod common;

use std::time::{Duration, Instant};

use common::*;
use torchport::{Checkpoint, Limits};

fn open(bytes: Vec<u8>) -> torchport::Result<Checkpoint> {
    torchport::open_bytes("crafted.pt", bytes, &Limits::default())
}

fn open_with(bytes: Vec<u8>, limits: &Limits) -> torchport::Result<Checkpoint> {
    torchport::open_bytes("crafted.pt", bytes, limits)
}

/// The error text, asserting it is one line naming the file and holding every word.
#[track_caller]
fn err_with(r: torchport::Result<Checkpoint>, words: &[&str]) -> String {
    let e = r.expect_err("expected an error").to_string();
    assert!(e.contains("crafted.pt"), "names the file: {e}");
    assert!(!e.contains('\n'), "one line: {e}");
    for w in words {
        assert!(e.contains(w), "expected {w:?} in: {e}");
    }
    e
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// A torch zip holding `pkl` and one 16-float storage under key 0.
fn zip16(pkl: Vec<u8>) -> Vec<u8> {
    torch_zip(&pkl, &[("0", &floats16())])
}

// ---- shared references and nesting ------------------------------------------------------

/// `l0 = []; l_{i+1} = [l_i, l_i]`, `levels` deep, via memo GET: 2^levels leaves if expanded.
fn memo_bomb(levels: usize) -> Vec<u8> {
    let mut p = P::new().op(b"]q\x00");
    for _ in 0..levels {
        p = p.op(b"](h\x00h\x00eq\x00");
    }
    p.stop()
}

#[test]
fn memo_bomb_stops_at_max_visits_and_max_copied_bytes() {
    // 2^60 leaves if expanded: the names of the leaves reached exhaust the copy budget
    // first under the defaults…
    let start = Instant::now();
    err_with(
        open(zip16(memo_bomb(60))),
        &["shared references", "max_copied_bytes"],
    );
    // …and the visit budget when copies are allowed.
    let visits_only = Limits {
        max_copied_bytes: usize::MAX,
        ..Limits::default()
    };
    err_with(
        open_with(zip16(memo_bomb(60)), &visits_only),
        &["shared references", "max_visits"],
    );
    assert!(start.elapsed() < Duration::from_secs(10));
    // 2^10 leaves is a legitimate amount of sharing under the defaults…
    let c = open(zip16(memo_bomb(10))).unwrap();
    assert_eq!(c.values().len(), 1 << 10);
    // …and over lowered limits (the walk allows at least 4 visits per pickle node, and
    // copies of 4 × the pickle's size).
    let limits = Limits {
        max_visits: 100,
        ..Limits::default()
    };
    err_with(open_with(zip16(memo_bomb(10)), &limits), &["max_visits"]);
    let limits = Limits {
        max_copied_bytes: 1000,
        ..Limits::default()
    };
    err_with(
        open_with(zip16(memo_bomb(10)), &limits),
        &["max_copied_bytes"],
    );
}

#[test]
fn shared_strings_and_long_keys_stop_at_max_copied_bytes() {
    // One 100 KB string referenced 10,000 times (memo GET): 1 GB if each reference copied it.
    let mut p = P::new()
        .str(&"s".repeat(100_000))
        .op(b"q\x00")
        .op(b"0]")
        .mark();
    for _ in 0..10_000 {
        p = p.op(b"h\x00");
    }
    let shared = zip16(p.op(b"e").stop());
    let start = Instant::now();
    err_with(
        open(shared),
        &["copied into names and values", "max_copied_bytes"],
    );
    // One 10 KB key used at each of 300 nested levels: names grow to 3 MB each, 450 MB on
    // the path if each level held its own.
    let mut p = P::new().str(&"k".repeat(10_000)).op(b"q\x00").op(b"0");
    for _ in 0..300 {
        p = p.op(b"}").op(b"h\x00");
    }
    p = p.op(b"N");
    for _ in 0..300 {
        p = p.op(b"s");
    }
    err_with(open(zip16(p.stop())), &["max_copied_bytes"]);
    assert!(start.elapsed() < Duration::from_secs(10));
    // Huge integers are described, not converted to decimal (quadratic in their length).
    let mut long = P::new().op(b"\x8b").op(&(1u32 << 20).to_le_bytes());
    long.0.extend(std::iter::repeat_n(0x5a, 1 << 20));
    let c = open(zip16(long.stop())).unwrap();
    assert_eq!(c.values()[0].1.to_string(), "<an integer of 1048576 bytes>");
}

/// `depth` lists nested inside each other (EMPTY_LIST × depth, APPEND × depth-1).
fn nested_lists(depth: usize) -> Vec<u8> {
    let mut p = P::new();
    p.0.extend(std::iter::repeat_n(b']', depth));
    p.0.extend(std::iter::repeat_n(b'a', depth - 1));
    p.stop()
}

#[test]
fn nesting_is_bounded_at_every_layer() {
    // The walk that names tensors: max_depth (default 512).
    err_with(open(zip16(nested_lists(600))), &["nesting", "max_depth"]);
    assert!(open(zip16(nested_lists(500))).is_ok());
    let shallow = Limits {
        max_depth: 10,
        ..Limits::default()
    };
    err_with(open_with(zip16(nested_lists(20)), &shallow), &["max_depth"]);
    // The pickle machine's stack: max_stack_depth (default 100,000).
    err_with(
        open(zip16(nested_lists(100_001))),
        &["data.pkl", "max_stack_depth"],
    );
    // MARKs open at once: max_nesting (default 1,000).
    let mut marks = P::new();
    marks.0.extend(std::iter::repeat_n(b'(', 1001));
    err_with(open(zip16(marks.stop())), &["max_nesting"]);
}

#[test]
fn nesting_at_the_limit_fits_a_small_thread_stack() {
    // The deepest walk the default limits allow, through objects and their state dicts
    // (the most stack per level), ending in nested rebuild calls, fits a default Rust
    // thread (2 MiB) even in a debug build (about 2.5 KiB a level in debug, under 400
    // bytes in release).
    let deepest = |rebuilds: usize| {
        let mut p = P::new();
        for _ in 0..511 {
            p = p.global("m", "C").op(b")").reduce().op(b"}").str("k");
        }
        // _rebuild_parameter(_rebuild_parameter(… _rebuild_tensor_v2(…)))
        for _ in 1..rebuilds {
            p = p.global("torch._utils", "_rebuild_parameter");
        }
        p = p.tensor_v2("FloatStorage", "0", 16, 0, &[4], &[1]);
        for _ in 1..rebuilds {
            p = p.op(b"\x85").reduce();
        }
        for _ in 0..511 {
            p = p.op(b"s").op(b"b");
        }
        zip16(p.stop())
    };
    let run = |bytes: Vec<u8>| {
        std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || open(bytes).map(|c| c.tensors()[0].name.len()))
            .unwrap()
            .join()
            .expect("no stack overflow")
    };
    assert_eq!(run(deepest(16)).unwrap(), 511 * 2 - 1);
    let e = run(deepest(17)).unwrap_err().to_string();
    assert!(e.contains("rebuild calls nest more than 16 deep"), "{e}");
}

// ---- tensor geometry ---------------------------------------------------------------------

#[test]
fn huge_declared_shapes_and_overflowing_geometry_are_errors() {
    let t = |numel, offset, size: &[i128], stride: &[i128]| {
        zip16(one_tensor_pickle(
            "w",
            "FloatStorage",
            numel,
            offset,
            size,
            stride,
        ))
    };
    // A shape far beyond the storage.
    err_with(
        open(t(16, 0, &[1 << 40], &[1])),
        &["tensor w", "storage holds only 64 bytes"],
    );
    // size × stride overflows; numel overflows; offset + extent overflows.
    err_with(open(t(16, 0, &[3], &[1 << 62])), &["tensor w", "overflows"]);
    err_with(
        open(t(16, 0, &[1 << 32, 1 << 32], &[0, 0])),
        &["tensor w", "overflows"],
    );
    err_with(
        open(t(16, (1 << 63) - 1, &[2], &[1])),
        &["tensor w", "overflows"],
    );
    // An empty view reads nothing, whatever its offset (found by the torch_tar fuzzer: the
    // offset was scaled to bytes before the view was known to be empty, and overflowed).
    let c = open(t(16, 1 << 62, &[0, 4], &[4, 1])).unwrap();
    assert!(c.data_by_name("w").unwrap().is_empty());
    // Negative sizes, strides, offsets.
    err_with(open(t(16, 0, &[-1], &[1])), &["tensor w", "size"]);
    err_with(open(t(16, -4, &[2], &[1])), &["tensor w", "offset"]);
    // The storage declares more elements than its record holds, or overflows.
    err_with(
        open(t(1 << 60, 0, &[2], &[1])),
        &["tensor w", "archive/data/0 holds 64 bytes"],
    );
    err_with(
        open(zip16(one_tensor_pickle(
            "w",
            "DoubleStorage",
            1 << 62,
            0,
            &[2],
            &[1],
        ))),
        &["tensor w", "overflows"],
    );
    // More dimensions than max_ndim (default 64).
    let dims = vec![1i128; 65];
    err_with(open(t(16, 0, &dims, &dims)), &["tensor w", "max_ndim"]);
    let few = Limits {
        max_ndim: 2,
        ..Limits::default()
    };
    err_with(
        open_with(t(16, 0, &[1, 1, 1], &[1, 1, 1]), &few),
        &["tensor w", "max_ndim"],
    );
    assert!(open(t(16, 0, &[1, 1, 1], &[1, 1, 1])).is_ok());
}

#[test]
fn expanded_views_are_bounded_by_max_expanded_bytes() {
    // stride 0: torch's `expand`. A 2^40-element view of one float is a valid description
    // (it opens, and inspect can show it) but its data is refused.
    let big = open(zip16(one_tensor_pickle(
        "w",
        "FloatStorage",
        16,
        3,
        &[1 << 40],
        &[0],
    )))
    .unwrap();
    let w = big.tensor("w").unwrap();
    assert_eq!(w.numel(), 1 << 40);
    let e = big.data(w).unwrap_err().to_string();
    assert!(
        e.contains("tensor w") && e.contains("max_expanded_bytes"),
        "{e}"
    );
    // A small expansion reads back: 1000 copies of element 3.
    let small = open(zip16(one_tensor_pickle(
        "w",
        "FloatStorage",
        16,
        3,
        &[1000],
        &[0],
    )))
    .unwrap();
    let data = small.data_by_name("w").unwrap();
    assert_eq!(f32s(&data), vec![3.0; 1000]);
    // Overlapping strides are expansions too; the limit is adjustable.
    let limits = Limits {
        max_expanded_bytes: 100,
        ..Limits::default()
    };
    let overlapping = zip16(one_tensor_pickle(
        "w",
        "FloatStorage",
        16,
        0,
        &[13, 4],
        &[1, 1],
    ));
    let c = open_with(overlapping.clone(), &limits).unwrap();
    let e = c.data_by_name("w").unwrap_err().to_string();
    assert!(
        e.contains("208 bytes") && e.contains("max_expanded_bytes"),
        "{e}"
    );
    let c = open(overlapping).unwrap();
    let got = f32s(&c.data_by_name("w").unwrap());
    assert_eq!(got[..9], [0.0, 1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 4.0, 2.0]);
    // Views that do not overlap are never affected, however the limit is set.
    let c = open_with(
        zip16(one_tensor_pickle(
            "w",
            "FloatStorage",
            16,
            0,
            &[4, 4],
            &[1, 4],
        )),
        &Limits {
            max_expanded_bytes: 0,
            ..Limits::default()
        },
    )
    .unwrap();
    let got = f32s(&c.data_by_name("w").unwrap());
    assert_eq!(got[..5], [0.0, 4.0, 8.0, 12.0, 1.0]);
}

#[test]
fn overlapping_and_out_of_range_storage_views() {
    // Legacy stream: views of a root storage by (offset, size) in elements.
    let main = |off: i128, size: i128| {
        let p = P::new().op(b"}").str("v");
        let p = p.global("torch._utils", "_rebuild_tensor_v2").mark();
        let p = legacy_storage(p, "FloatStorage", "r", 16, Some(("v1", off, size)));
        let p = p
            .int(0)
            .ints(&[size.min(4)])
            .ints(&[1])
            .op(b"\x89")
            .global("collections", "OrderedDict")
            .op(b")")
            .reduce()
            .tuple()
            .reduce()
            .op(b"s");
        p.stop()
    };
    let data = floats16();
    let ok = open(legacy(&main(10, 4), &["r"], &[(16, &data)])).unwrap();
    assert_eq!(
        f32s(&ok.data_by_name("v").unwrap()),
        [10.0, 11.0, 12.0, 13.0]
    );
    err_with(
        open(legacy(&main(14, 4), &["r"], &[(16, &data)])),
        &["tensor v", "storage view v1", "reaches outside storage r"],
    );
    err_with(
        open(legacy(&main(1 << 62, 4), &["r"], &[(16, &data)])),
        &["tensor v", "reaches outside"],
    );
    // A storage whose declared element count runs past the end of the file.
    err_with(
        open(legacy(&main(0, 4), &["r"], &[(17, &data)])),
        &["storage r", "the file ends at byte"],
    );
    err_with(
        open(legacy(&main(0, 4), &["r"], &[(i64::MAX, &data)])),
        &["storage r", "declares"],
    );

    // Two zip tensors over one storage, overlapping: both read their own window.
    let pkl = P::new()
        .op(b"}")
        .str("a")
        .tensor_v2("FloatStorage", "0", 16, 0, &[8], &[1])
        .op(b"s")
        .str("b")
        .tensor_v2("FloatStorage", "0", 16, 4, &[8], &[1])
        .op(b"s")
        .stop();
    let c = open(zip16(pkl)).unwrap();
    assert_eq!(c.storage_count(), 1);
    assert_eq!(
        f32s(&c.data_by_name("a").unwrap())[4..],
        [4.0, 5.0, 6.0, 7.0]
    );
    assert_eq!(
        f32s(&c.data_by_name("b").unwrap())[..4],
        [4.0, 5.0, 6.0, 7.0]
    );
}

// ---- compressed records ------------------------------------------------------------------

/// A torch zip whose data.pkl and storage are deflated.
fn deflated_zip(pkl: &[u8], storage: &[u8]) -> Vec<u8> {
    zip(&[
        ("archive/data.pkl", pkl, true),
        ("archive/data/0", storage, true),
    ])
}

#[test]
fn zip_bombs_are_stopped() {
    // 2 MiB of zeros deflates to a few KiB: a legitimate re-zipped archive opens…
    let n = 512 << 10;
    let zeros = vec![0u8; n * 4];
    let pkl = one_tensor_pickle("w", "FloatStorage", n as i128, 0, &[n as i128], &[1]);
    let bomb = deflated_zip(&pkl, &zeros);
    assert!(bomb.len() < 16 << 10, "{} bytes", bomb.len());
    let c = open(bomb.clone()).unwrap();
    assert!(c.data_by_name("w").unwrap().iter().all(|&b| b == 0));
    // …and max_decompressed stops it before anything is inflated.
    let limits = Limits {
        max_decompressed: 1 << 20,
        ..Limits::default()
    };
    err_with(
        open_with(bomb, &limits),
        &["archive/data/0", "max_decompressed", "2097152 bytes"],
    );

    // A record that inflates far past the size its archive declares: stopped one byte past
    // the declared size, never inflated further.
    let mut lying = deflated_zip(&pkl, &zeros);
    patch_sizes(&mut lying, "archive/data/0", None, Some(1000));
    // (The zip crate notices first and says so; torchport checks again after it.)
    let e = err_with(open(lying), &["tensor w", "archive/data/0"]);
    assert!(
        e.contains("inflates past the 1000 bytes") || e.contains("larger than its declared"),
        "{e}"
    );
    // A data.pkl that does the same.
    let mut padded = pkl.clone();
    padded.extend(std::iter::repeat_n(b'N', 1 << 20)); // NONE ×1M after STOP
    let mut lying = deflated_zip(&padded, &floats16());
    patch_sizes(&mut lying, "archive/data.pkl", None, Some(pkl.len() as u32));
    let e = err_with(open(lying), &["archive/data.pkl"]);
    assert!(
        e.contains("inflates past") || e.contains("larger than its declared"),
        "{e}"
    );
    // A record that declares far more than it holds: an error, with no allocation of the
    // declared size (see tests/memory.rs for the measurement).
    let mut short = deflated_zip(&pkl, &floats16());
    patch_sizes(&mut short, "archive/data/0", None, Some(u32::MAX - 1));
    err_with(open(short), &["archive/data/0", "decompresses to 64 bytes"]);
}

// ---- pickle machine limits (lowered to prove each is enforced) -----------------------------

#[test]
fn pickle_limits_are_enforced_and_adjustable() {
    let with = |f: &dyn Fn(&mut torchport::pickle::Limits)| {
        let mut l = Limits::default();
        f(&mut l.pickle);
        l
    };
    // max_nodes: 2,000 nodes against a limit of 1,000.
    let mut many = P::new().op(b"]");
    for _ in 0..2000 {
        many = many.op(b"N").op(b"a");
    }
    let many = zip16(many.stop());
    assert!(open(many.clone()).is_ok());
    err_with(
        open_with(many, &with(&|l| l.max_nodes = 1000)),
        &["max_nodes"],
    );
    // max_memo: 100 MEMOIZE against 50.
    let mut memo = P::new().op(b"N");
    for _ in 0..100 {
        memo = memo.op(b"\x94");
    }
    let memo = zip16(memo.stop());
    assert!(open(memo.clone()).is_ok());
    err_with(open_with(memo, &with(&|l| l.max_memo = 50)), &["max_memo"]);
    // max_string_len / max_total_bytes.
    let s = zip16(P::new().str(&"x".repeat(5000)).stop());
    err_with(
        open_with(s.clone(), &with(&|l| l.max_string_len = 4096)),
        &["max_string_len"],
    );
    let mut two = P::new().mark();
    for _ in 0..3 {
        two = two.str(&"y".repeat(3000));
    }
    let two = zip16(two.tuple().stop());
    err_with(
        open_with(two, &with(&|l| l.max_total_bytes = 8000)),
        &["max_total_bytes"],
    );
    // A declared length far beyond the input is never allocated (BINUNICODE8 of 2^40).
    let huge = P::new()
        .op(b"\x8d")
        .op(&(1u64 << 40).to_le_bytes())
        .op(b"abc")
        .stop();
    err_with(open(zip16(huge)), &["BINUNICODE8", "truncated"]);
    // max_stack_depth / max_nesting lowered.
    err_with(
        open_with(zip16(nested_lists(50)), &with(&|l| l.max_stack_depth = 20)),
        &["max_stack_depth"],
    );
    let mut marks = P::new();
    marks.0.extend(std::iter::repeat_n(b'(', 11));
    err_with(
        open_with(zip16(marks.stop()), &with(&|l| l.max_nesting = 10)),
        &["max_nesting"],
    );
    // refuse_dangerous: on by default; off, the call is recorded as data, never made.
    let evil = zip16(
        P::new()
            .global("posix", "system")
            .str("echo pwned")
            .op(b"\x85")
            .reduce()
            .stop(),
    );
    err_with(open(evil.clone()), &["posix.system", "refusing"]);
    let c = open_with(evil, &with(&|l| l.refuse_dangerous = false)).unwrap();
    assert_eq!(c.values()[0].1.to_string(), "<posix.system object>");
}

#[test]
fn max_tensors_is_enforced() {
    let mut p = P::new().op(b"]").mark();
    for _ in 0..3 {
        p = p.tensor_v2("FloatStorage", "0", 16, 0, &[2], &[1]);
    }
    let z = zip16(p.op(b"e").stop());
    assert_eq!(open(z.clone()).unwrap().tensors().len(), 3);
    let limits = Limits {
        max_tensors: 2,
        ..Limits::default()
    };
    err_with(open_with(z, &limits), &["max_tensors"]);
}

// ---- cycles that a walk could follow forever ---------------------------------------------

#[test]
fn self_referencing_rebuild_arguments_are_errors() {
    // _rebuild_from_type(f, type, args, state) whose args list contains itself with f =
    // _rebuild_from_type again: L = [rft, None, L, None] (APPENDS onto the memoized list).
    let rft = |p: P| p.global("torch._tensor", "_rebuild_from_type");
    let mut p = P::new().op(b"}").str("w");
    p = rft(p); // the callable of the REDUCE below
    p = p.op(b"]q\x00").mark(); // L (memo 0), MARK for APPENDS
    p = rft(p).op(b"N").op(b"h\x00").op(b"N").op(b"e"); // L = [rft, None, L, None]
    p = p.op(b"0").mark(); // drop L from the stack (it stays in the memo)
    p = rft(p).op(b"N").op(b"h\x00").op(b"N").tuple(); // args = (rft, None, L, None)
    p = p.reduce().op(b"s");
    let bytes = zip16(p.stop());
    let r = std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(move || open(bytes).map(|_| ()).map_err(|e| e.to_string()))
        .unwrap()
        .join()
        .expect("no stack overflow");
    let e = r.unwrap_err();
    assert!(e.contains("tensor w"), "{e}");
}
