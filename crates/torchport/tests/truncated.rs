//! Truncated or corrupt tensor data is always an error naming the tensor (or the storage
//! record) and the byte offset — never zero-filled, never silently short. Every format.

mod common;

use std::path::Path;

use common::*;
use torchport::Limits;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/torch_save")
            .join(name),
    )
    .unwrap()
}

fn err(bytes: Vec<u8>) -> String {
    let e = torchport::open_bytes("cut.pt", bytes, &Limits::default())
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("cut.pt: ") && !e.contains('\n'), "{e}");
    e
}

#[test]
fn legacy_storage_cut_short_names_the_tensor_storage_and_offset() {
    let full = fixture("legacy.pt");
    // Cut inside the last storage's bytes: the storage header says more than remains.
    let cut = full.len() - 3;
    let e = err(full[..cut].to_vec());
    assert!(e.contains("tensor "), "{e}");
    assert!(e.contains("cannot be read: storage "), "{e}");
    assert!(
        e.contains(&format!("but the file ends at byte {cut}")),
        "{e}"
    );
    assert!(e.contains(" at byte "), "{e}");
    // Cut between storages: the next storage's size is missing.
    let keys_end = full.len() - 8; // not a boundary in general; find one by trying cuts
    let mut saw_size_missing = false;
    for cut in (keys_end.saturating_sub(400)..full.len()).rev() {
        let e = err(full[..cut].to_vec());
        if e.contains("before storage") {
            assert!(e.contains(&format!("the file ends at byte {cut}")), "{e}");
            saw_size_missing = true;
            break;
        }
    }
    assert!(saw_size_missing, "some cut falls between two storages");
}

#[test]
fn legacy_storage_lying_about_its_size_is_an_error() {
    // One float32 storage of 16 elements declared, 15 present.
    let main = {
        let p = P::new().op(b"}").str("w");
        let p = p.global("torch._utils", "_rebuild_tensor_v2").mark();
        let p = legacy_storage(p, "FloatStorage", "0", 16, None);
        p.int(0)
            .ints(&[16])
            .ints(&[1])
            .op(b"\x89")
            .global("collections", "OrderedDict")
            .op(b")")
            .reduce()
            .tuple()
            .reduce()
            .op(b"s")
            .stop()
    };
    let data = floats16();
    let ok = legacy(&main, &["0"], &[(16, &data)]);
    assert_eq!(
        torchport::open_bytes("ok.pt", ok, &Limits::default())
            .unwrap()
            .data_by_name("w")
            .unwrap()
            .len(),
        64
    );
    let short = legacy(&main, &["0"], &[(16, &data[..60])]);
    let e = err(short);
    assert!(
        e.contains("tensor w: its storage 0 cannot be read: storage 0 at byte")
            && e.contains("declares 64 bytes but the file ends"),
        "{e}"
    );
}

#[test]
fn tar_storage_cut_short_names_the_member_storage_and_offset() {
    let p2 = |p: P| p.stop();
    let count = p2(P::new().int(1));
    let record = p2(P::new()
        .mark()
        .int(1)
        .str("cpu")
        .global("torch", "FloatStorage")
        .tuple());
    let mut storages = count.clone();
    storages.extend(&record);
    storages.extend(16i64.to_le_bytes());
    storages.extend(&floats16()[..40]); // 10 of 16 floats
    storages.extend(p2(P::new().op(b"]")));
    let zero = p2(P::new().int(0));
    let t = tar(&[
        ("storages", &storages),
        ("tensors", &zero),
        ("pickle", &p2(P::new().op(b"N"))),
    ]);
    let e = err(t);
    assert!(
        e.contains("tar member storages: storage 1 declares 64 bytes but the member ends at byte")
            && e.contains("(at byte "),
        "{e}"
    );
}

#[test]
fn zip_record_past_the_end_of_the_file_names_record_and_offset() {
    let pkl = one_tensor_pickle("w", "FloatStorage", 16, 0, &[16], &[1]);
    let mut z = torch_zip(&pkl, &[("0", &floats16())]);
    patch_sizes(&mut z, "archive/data/0", Some(1 << 30), Some(1 << 30));
    let e = err(z);
    assert!(
        e.contains("tensor w")
            && e.contains("record archive/data/0 (1073741824 bytes at byte ")
            && e.contains("extends past the end of the file"),
        "{e}"
    );
    // A storage record holding fewer bytes than the pickle declares.
    let z = torch_zip(&pkl, &[("0", &floats16()[..60])]);
    let e = err(z);
    assert!(
        e.contains("tensor w: its storage record archive/data/0 holds 60 bytes, but the pickle declares 16 elements"),
        "{e}"
    );
}
