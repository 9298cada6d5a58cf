//! Plain-pickled tensors: `pickle.dumps` writes a tensor's storage as
//! `torch.storage._load_from_bytes(b)`, `b` a whole nested `torch.save` file. torchport reads
//! the nested file with its own container readers, one level deep, and the security scan
//! lists the nested files' globals (several levels deep). Fixtures are in
//! `tests/fixtures/gadgets/load_from_bytes*.pt`, made by `tests/fixtures/gen/gen_gadgets.py`;
//! the benign ones carry what `torch.load` returned.

mod common;

use common::fixtures::{check_tensors, check_values, fixture_dir, Expected};
use torchport::security::{scan, scan_bytes, GlobalClass};
use torchport::Limits;

fn gadget(name: &str) -> std::path::PathBuf {
    fixture_dir("gadgets").join(name)
}

fn has_global(report: &torchport::security::SecurityReport, module: &str, name: &str) -> bool {
    report
        .globals
        .iter()
        .any(|g| g.module == module && g.name == name)
}

#[test]
fn plain_pickled_tensors_read_as_torch_loads_them() {
    let mut checked = 0;
    for (file, pickles, storages) in [
        ("load_from_bytes.pt", 6, ["FloatStorage"].as_slice()),
        (
            "load_from_bytes_views.pt",
            26,
            ["FloatStorage", "LongStorage", "HalfStorage", "BoolStorage"].as_slice(),
        ),
    ] {
        let exp = Expected::of(&gadget(file));
        let ctx = exp.ctx();
        let ckpt = exp.open();
        checked += check_tensors(&ckpt, &exp, &ctx, |_, _, _, _| {});
        check_values(&ckpt, &exp, &ctx, false);
        // From memory too (no file beside it to fall back on).
        let bytes = std::fs::read(gadget(file)).unwrap();
        let mem = torchport::open_bytes(file, bytes, &Limits::default()).unwrap();
        for t in ckpt.tensors() {
            let m = mem.tensor(&t.name).unwrap();
            assert_eq!(mem.data(m).unwrap(), ckpt.data(t).unwrap(), "{file}");
        }

        // Never `ok`: torch.load(weights_only=True) refuses _load_from_bytes.
        let report = scan(gadget(file)).unwrap();
        assert_eq!(report.verdict(), "unsafe-for-torch-load", "{file}");
        let unlisted: Vec<_> = report.unlisted().map(|g| g.name.as_str()).collect();
        assert_eq!(unlisted, ["_load_from_bytes"], "{file}");
        // The outer data.pkl and the five pickles of each nested legacy stream.
        assert_eq!(report.pickles, pickles, "{file}");
        for class in storages {
            assert!(has_global(&report, "torch", class), "{file}: {class}");
        }
        assert!(report.problems.is_empty(), "{file}: {:?}", report.problems);
    }
    assert_eq!(checked, 6);
}

#[test]
fn a_view_keeps_its_offset_and_strides_into_the_nested_storage() {
    let ckpt = torchport::open(gadget("load_from_bytes_views.pt")).unwrap();
    let view = ckpt.tensor("view").unwrap();
    assert_eq!(
        (view.offset, view.strides.as_slice()),
        (6, [6, 2].as_slice())
    );
    // base = arange(24).reshape(4, 6); view = base[1:, ::2]
    let data = ckpt.data(view).unwrap();
    let got: Vec<f32> = data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got, [6., 8., 10., 12., 14., 16., 18., 20., 22.]);
    // Each plain-pickled tensor brought its own nested file, hence its own storage.
    assert_eq!(ckpt.storage(view).unwrap().len(), 24 * 4);
}

/// (file, what the error must say besides the tensor and the global).
const HOSTILE: &[(&str, &str)] = &[
    ("load_from_bytes_dangerous.pt", "refusing global os.system"),
    ("load_from_bytes_twice.pt", "one level deep"),
    (
        "load_from_bytes_truncated.pt",
        "storage 0 at byte 217 declares 16 bytes but the file ends at byte 236",
    ),
    ("load_from_bytes_garbage.pt", "not a torch.save file"),
];

#[test]
fn a_hostile_nested_file_is_one_clear_error() {
    for (file, says) in HOSTILE {
        let bytes = std::fs::read(gadget(file)).unwrap();
        for err in [
            torchport::open(gadget(file)).err(),
            torchport::open_bytes(file, bytes, &Limits::default()).err(),
        ] {
            let err = err.unwrap_or_else(|| panic!("{file} opened")).to_string();
            assert!(err.contains("tensor x: "), "{file}: {err}");
            assert!(
                err.contains("torch.storage._load_from_bytes"),
                "{file}: {err}"
            );
            assert!(err.contains(says), "{file}: {err}");
            assert_eq!(err.lines().count(), 1, "{file}: {err}");
        }
    }
}

#[test]
fn the_scan_sees_inside_hostile_nested_files() {
    let report = scan(gadget("load_from_bytes_dangerous.pt")).unwrap();
    assert_eq!(report.verdict(), "refused");
    let dangerous: Vec<_> = report
        .dangerous()
        .map(|g| format!("{}.{}", g.module, g.name))
        .collect();
    assert_eq!(dangerous, ["os.system"]);

    // Two levels: the scan follows both (the reader refuses the second).
    let report = scan(gadget("load_from_bytes_twice.pt")).unwrap();
    assert_eq!(report.pickles, 1 + 5 + 5);
    assert!(has_global(&report, "torch", "FloatStorage"));
    assert!(report.problems.is_empty(), "{:?}", report.problems);

    let report = scan(gadget("load_from_bytes_garbage.pt")).unwrap();
    assert_eq!(report.verdict(), "unsafe-for-torch-load");
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert!(
        report.problems[0].contains("nested in archive/data.pkl")
            && report.problems[0].contains("not a torch.save file"),
        "{:?}",
        report.problems
    );
}

// --- legacy streams built here, nesting one another ------------------------------------

/// The legacy magic number, protocol version and an empty sys_info (little-endian).
const LEGACY_HEAD: &[u8] =
    b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.\x80\x02M\xe9\x03.\x80\x02}.";

/// A legacy stream whose object pickle is `main` and whose storage list is empty.
fn legacy(main: &[u8]) -> Vec<u8> {
    [LEGACY_HEAD, main, b"\x80\x02]."].concat()
}

/// An object pickle (protocol 3) whose root is `_load_from_bytes(inner)`.
fn load_from_bytes(inner: &[u8]) -> Vec<u8> {
    let mut m = b"\x80\x03ctorch.storage\n_load_from_bytes\nB".to_vec();
    m.extend((inner.len() as u32).to_le_bytes());
    m.extend(inner);
    m.extend(b"\x85R.");
    m
}

/// `levels` legacy streams nested in one another, the innermost calling `os.system`.
fn nested_chain(levels: usize) -> Vec<u8> {
    let mut file = legacy(b"\x80\x02cos\nsystem\n(X\x02\x00\x00\x00idtR.");
    for _ in 0..levels {
        file = legacy(&load_from_bytes(&file));
    }
    file
}

#[test]
fn the_scan_follows_nesting_to_a_bound() {
    // Four levels below the file: the gadget is seen.
    let report = scan_bytes("chain4.pt", nested_chain(4), &Limits::default()).unwrap();
    assert_eq!(report.verdict(), "refused");
    assert_eq!(report.pickles, 5 * 5);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    // Five levels: the deepest is not scanned, and the report says so.
    let report = scan_bytes("chain5.pt", nested_chain(5), &Limits::default()).unwrap();
    assert_eq!(report.verdict(), "unsafe-for-torch-load");
    assert!(report.dangerous().next().is_none());
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert!(
        report.problems[0].contains("nest more than 4 deep"),
        "{:?}",
        report.problems
    );
    // Reading refuses any of them: a nested file is never interpreted past its root.
    let err = torchport::open_bytes("chain2.pt", nested_chain(2), &Limits::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("one level deep"), "{err}");
    let err = torchport::open_bytes("chain1.pt", nested_chain(1), &Limits::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("refusing global os.system"), "{err}");
    assert!(scan_bytes("chain1.pt", nested_chain(1), &Limits::default())
        .unwrap()
        .globals
        .iter()
        .any(|g| g.class == GlobalClass::Dangerous));
}

#[test]
fn a_storage_pickled_on_its_own_is_a_1d_tensor() {
    // {"s": _load_from_bytes(<legacy stream holding a 2-element float32 storage>)}
    let nested = [
        LEGACY_HEAD,
        b"\x80\x02(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x02NtQ.",
        b"\x80\x02]X\x01\x00\x00\x000a.",
        &2i64.to_le_bytes(),
        &1.5f32.to_le_bytes(),
        &(-2f32).to_le_bytes(),
    ]
    .concat();
    let root = load_from_bytes(&nested);
    let main = [
        b"\x80\x03}X\x01\x00\x00\x00s".as_slice(),
        &root[2..root.len() - 1],
        b"s.",
    ]
    .concat();
    let ckpt = torchport::open_bytes("bare.pt", legacy(&main), &Limits::default()).unwrap();
    let t = ckpt.tensor("s").unwrap();
    assert_eq!(
        (t.dtype.name(), t.shape.as_slice()),
        ("float32", [2].as_slice())
    );
    assert_eq!(
        ckpt.data(t).unwrap().as_ref(),
        [1.5f32.to_le_bytes(), (-2f32).to_le_bytes()].concat()
    );
}

#[test]
fn nested_pickle_nodes_count_against_the_outer_limit() {
    let file = std::fs::read(gadget("load_from_bytes_views.pt")).unwrap();
    let pkl = zip_record(&file, "archive/data.pkl");
    let outer = torchport_pickle::parse(&pkl, &Default::default()).unwrap();
    let mut limits = Limits::default();
    // Enough for the outer pickle and each nested pickle alone, not for all of them.
    limits.pickle.max_nodes = outer.len() + 60;
    let err = torchport::open_bytes("views.pt", file.clone(), &limits)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("_load_from_bytes") && err.contains("max_nodes"),
        "{err}"
    );
    limits.pickle.max_nodes = outer.len() + 400;
    torchport::open_bytes("views.pt", file, &limits).unwrap();
}

/// One stored record of a zip archive.
fn zip_record(zip: &[u8], name: &str) -> Vec<u8> {
    use std::io::Read;
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(zip)).unwrap();
    let mut out = Vec::new();
    z.by_name(name).unwrap().read_to_end(&mut out).unwrap();
    out
}
