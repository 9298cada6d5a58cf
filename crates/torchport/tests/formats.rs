//! safetensors, npy, npz and sharded fixtures (`tests/fixtures/formats/`, made by
//! `tests/fixtures/gen/gen_formats.py`), compared with what the peer library itself loaded
//! (`safe_open`, `numpy.load`, `torch.load`): format, names in order, dtypes, shapes,
//! strides, byte order, metadata values, and every tensor byte for byte; plus zero-copy
//! checks (mapped storages, borrowed data).

mod common;

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use common::fixtures::{check_tensors, check_values, expected_files, fixture_dir, Expected};
use serde_json::Value as Json;
use torchport::{ByteOrder, Format};

fn fixtures() -> PathBuf {
    fixture_dir("formats")
}

/// Check one fixture; returns (format, tensors checked).
fn check_fixture(json_path: &Path) -> (Format, usize) {
    let exp = Expected::from_json(json_path);
    let ckpt = exp.open();
    let ctx = exp.ctx();
    // Deflated npz records are decompressed; everything else stays in the memory map.
    let name = json_path.file_name().unwrap().to_string_lossy();
    let mapped = !name.starts_with("compressed.npz");
    let checked = check_tensors(&ckpt, &exp, &ctx, |t, w, data, tctx| {
        assert!(w.get("stride").is_some(), "{tctx}: the peer gives strides");
        let storage = ckpt
            .storage(t)
            .unwrap_or_else(|| panic!("{tctx}: no storage"));
        assert_eq!(storage.is_mapped(), mapped, "{tctx}: storage mapped");
        if let Some(order) = w.get("byte_order").and_then(Json::as_str) {
            let ours = match storage.byte_order() {
                ByteOrder::Little => "little",
                ByteOrder::Big => "big",
            };
            if t.dtype.size() > 1 {
                assert_eq!(ours, order, "{tctx}: byte order");
            }
        }
        let swapped = storage.byte_order() == ByteOrder::Big && t.dtype.size() > 1;
        if t.is_contiguous() && !swapped {
            assert!(matches!(data, Cow::Borrowed(_)), "{tctx}: expected no copy");
        } else if !data.is_empty() {
            assert!(matches!(data, Cow::Owned(_)), "{tctx}: gathered or swapped");
        }
    });
    check_values(&ckpt, &exp, &ctx, true);
    (ckpt.format(), checked)
}

#[test]
fn every_fixture_matches_its_peer_library() {
    let files = expected_files(&fixtures());
    let mut tensors = 0;
    let mut formats = Vec::new();
    for f in &files {
        let (format, n) = check_fixture(f);
        tensors += n;
        formats.push(format);
    }
    println!("checked {} fixtures, {tensors} tensors", files.len());
    for f in [
        Format::Safetensors,
        Format::Npy,
        Format::Npz,
        Format::Sharded,
    ] {
        assert!(formats.contains(&f), "no {f} fixture");
    }
    assert!(files.len() >= 17, "only {} fixtures found", files.len());
    assert!(tensors >= 115, "only {tensors} tensors checked");
}

#[test]
fn detection_by_content_not_extension() {
    let cases = [
        ("dtypes.safetensors", Format::Safetensors),
        ("be_f4.npy", Format::Npy),
        ("arrays.npz", Format::Npz),
        ("compressed.npz", Format::Npz),
        ("sharded_st/model.safetensors.index.json", Format::Sharded),
    ];
    for (file, format) in cases {
        let bytes = std::fs::read(fixtures().join(file)).unwrap();
        assert_eq!(torchport::detect(&bytes), Some(format), "{file}");
        // The same bytes under a misleading name are read the same way.
        let c = torchport::open_bytes("renamed.pt", bytes, &Default::default());
        if format != Format::Sharded {
            assert_eq!(c.unwrap().format(), format, "{file}");
        }
    }
    assert_eq!(torchport::detect(b"{\"a\": 1}"), None);
    assert_eq!(torchport::detect(b"\x93NUMPX"), None);
}

#[test]
fn npy_names_follow_the_file_name() {
    let bytes = std::fs::read(fixtures().join("f32.npy")).unwrap();
    let l = torchport::Limits::default();
    for (name, tensor) in [
        ("weights.npy", "weights"),
        ("dir/x.v2.npy", "x.v2"),
        ("raw", "raw"),
        (".npy", "array"),
    ] {
        let c = torchport::open_bytes(name, bytes.clone(), &l).unwrap();
        assert_eq!(c.tensors()[0].name, tensor, "{name}");
    }
}

#[test]
fn sharded_tensors_come_from_both_shards() {
    for (dir, index) in [
        ("sharded_st", "model.safetensors.index.json"),
        ("sharded_bin", "pytorch_model.bin.index.json"),
    ] {
        let c = torchport::open(fixtures().join(dir).join(index)).unwrap();
        // Storages of tensors from different shards lie in different memory maps.
        let first = c.tensor("embed.weight").unwrap();
        let last = c.tensor("layers.11.mlp.weight").unwrap();
        let a = c.storage(first).unwrap().bytes().as_ptr() as usize;
        let b = c.storage(last).unwrap().bytes().as_ptr() as usize;
        assert_ne!(a / 4096, b / 4096, "{dir}: one shard only?");
        assert!(c.storage_count() >= 2, "{dir}");
        if dir == "sharded_bin" {
            assert!(
                c.globals()
                    .iter()
                    .any(|(m, n)| m == "torch._utils" && n.starts_with("_rebuild")),
                "{dir}: shard globals are kept: {:?}",
                c.globals()
            );
        }
    }
}

/// `detect_file` (head and zip directory only) names the same format as opening the file,
/// for every fixture that opens; files that match no format are an error from both.
#[test]
fn detect_file_agrees_with_open() {
    let mut checked = std::collections::BTreeSet::new();
    for path in common::fixtures::all_fixture_files() {
        match (torchport::open(&path), torchport::detect_file(&path)) {
            (Ok(ckpt), Ok(format)) => {
                assert_eq!(format, ckpt.format(), "{}", path.display());
                checked.insert(format.name());
            }
            (Err(torchport::Error::UnknownFormat { .. }), detected) => {
                assert!(detected.is_err(), "{}: {detected:?}", path.display());
            }
            _ => {}
        }
    }
    // Every format torchport reads is among the fixtures.
    assert!(checked.len() >= 9, "{checked:?}");
}

/// `open_as` a `.pt2` archive (no detection) reads what `open` reads from the archives it
/// detects as one, and refuses every other fixture.
#[test]
fn open_as_pt2_reads_pt2_archives_only() {
    let limits = torchport::Limits::default();
    let summary = |c: &torchport::Checkpoint| -> Vec<(String, String, Vec<usize>)> {
        let tensors = c.tensors().iter().chain(c.constants());
        let named = tensors.map(|t| (t.name.clone(), t.dtype.name().to_string(), t.shape.clone()));
        named.collect()
    };
    let (mut read, mut refused) = (0, 0);
    for path in common::fixtures::all_fixture_files() {
        let detected = torchport::open(&path)
            .ok()
            .map(|c| (c.format(), summary(&c)));
        match (detected, torchport::open_as(&path, Format::Pt2, &limits)) {
            (Some((Format::Pt2, want)), Ok(c)) => {
                assert_eq!(c.format(), Format::Pt2, "{}", path.display());
                assert_eq!(summary(&c), want, "{}", path.display());
                read += 1;
            }
            (Some((Format::Pt2, _)), Err(e)) => panic!("{}: {e}", path.display()),
            (_, Ok(_)) => panic!("{}: read as a .pt2 archive", path.display()),
            (_, Err(_)) => refused += 1,
        }
    }
    assert!(
        read >= 10 && refused >= 10,
        "{read} read, {refused} refused"
    );
}

/// `Checkpoint::populate` maps a `.pt2` archive's tensor pages into the process: with
/// every tensor's pages released first (`Checkpoint::release`), the resident part of the
/// file's mapping (`/proc/self/smaps`) grows by at least the tensors' bytes. On
/// torchvision's video ResNet stem as torch.export wrote it (the zoo fixture).
#[cfg(target_os = "linux")]
#[test]
fn populate_maps_the_tensors_pages_in() {
    let path = fixture_dir("zoo").join("tv_video_resnet_stem.plain.pt2");
    let c = torchport::open(&path).unwrap();
    let data: Vec<&[u8]> = c
        .tensors()
        .iter()
        .chain(c.constants())
        .map(|t| match c.data(t).unwrap() {
            Cow::Borrowed(b) => b,
            Cow::Owned(_) => panic!("{}: copied, not mapped", t.name),
        })
        .collect();
    let bytes: usize = data.iter().map(|b| b.len()).sum();
    let at = data.iter().find(|b| !b.is_empty()).unwrap().as_ptr() as usize;
    // The resident kilobytes of the mapping holding `at`.
    let resident_kb = || -> usize {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if let Some((lo, hi)) = first.split_once('-') {
                if let (Ok(lo), Ok(hi)) =
                    (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                {
                    inside = (lo..hi).contains(&at);
                    continue;
                }
            }
            if inside {
                if let Some(kb) = line.strip_prefix("Rss:") {
                    return kb.trim().trim_end_matches("kB").trim().parse().unwrap();
                }
            }
        }
        panic!("no mapping holds the tensor data")
    };
    for t in c.tensors().iter().chain(c.constants()) {
        c.release(t);
    }
    let before = resident_kb();
    if !c.populate() {
        // A kernel without MADV_POPULATE_READ (before 5.14): nothing to check.
        return;
    }
    let grew = resident_kb() - before;
    assert!(
        grew * 1024 >= bytes,
        "{grew} kB mapped in, {bytes} tensor bytes"
    );
}
