//! Every file name reads. torch names an archive's root folder after the file's stem, so a
//! file's record names, header lengths and alignment padding all change with its name; one
//! stem length per torch writer once made a valid archive unreadable (see
//! `format::torch_zip::open_zip`). `tests/fixtures/stems/` holds, for `torch.save`,
//! `torch.export.save` and `torch.jit.save`, one archive per stem length 1 to 64, written by
//! tests/fixtures/gen/gen_stems.py, and what torch loaded from them (the same for every stem
//! of a writer). Our own `.pt` and `.npz` writers get the same sweep.

mod common;

use std::path::{Path, PathBuf};

use common::fixtures::{check_tensors, fixture_dir, Expected};
use torchport::write::{write, OutputFormat, WriteOptions};
use torchport::OutTensor;

/// The expectations shared by every file of one writer's folder.
fn expected_for(writer: &str) -> Expected {
    let folder = fixture_dir("stems").join(writer);
    let mut exp = Expected::of(&folder);
    exp.file = folder;
    exp
}

/// The files of one writer's folder, by stem length; asserts there is one for each of 1..=64.
fn files(writer: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(fixture_dir("stems").join(writer))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort_by_key(|p| stem_len(p));
    let lengths: Vec<usize> = files.iter().map(|p| stem_len(p)).collect();
    assert_eq!(
        lengths,
        (1..=64).collect::<Vec<_>>(),
        "{writer}: stem lengths"
    );
    files
}

fn stem_len(p: &Path) -> usize {
    p.file_stem().unwrap().len()
}

/// Open every file of `writer`'s folder and compare it with what torch loaded.
fn every_stem_reads(writer: &str, format: &str, verdict: &str) {
    let exp = expected_for(writer);
    assert_eq!(exp.json["format"], format);
    let mut tensors = 0;
    for f in files(writer) {
        let ctx = f.display().to_string();
        let ckpt = torchport::open(&f).unwrap_or_else(|e| panic!("{e}"));
        tensors += check_tensors(&ckpt, &exp, &ctx, |_, _, _, _| {});
        // The same bytes from memory, and the security scan, read it too.
        let bytes = std::fs::read(&f).unwrap();
        let mem = torchport::open_bytes(&ctx, bytes, &Default::default()).unwrap();
        check_tensors(&mem, &exp, &ctx, |_, _, _, _| {});
        let report = torchport::security::scan(&f).unwrap_or_else(|e| panic!("{e}"));
        assert!(report.problems.is_empty(), "{ctx}: {:?}", report.problems);
        assert_eq!(report.verdict(), verdict, "{ctx}");
    }
    assert_eq!(tensors, 64 * 2, "{writer}: tensors checked");
}

#[test]
fn every_torch_save_stem_reads() {
    every_stem_reads("save", "torch-zip", "ok");
}

#[test]
fn every_torch_export_save_stem_reads() {
    every_stem_reads("export", "pt2", "ok");
}

#[test]
fn every_torch_jit_save_stem_reads() {
    // TorchScript archives name `__torch__` classes, which `torch.jit.load` compiles and runs.
    every_stem_reads("jit", "torchscript", "unsafe-for-torch-load");
}

/// What our writers write reads back under any name: `.pt` (root folder named after the
/// stem, like torch's) and `.npz`, for every stem length 1 to 64 and a long one (over 100
/// characters the `.pt` root falls back to `archive`).
#[test]
fn our_writers_read_back_under_every_stem() {
    let exp = expected_for("save");
    let source = torchport::open(fixture_dir("stems/save/a.pt")).unwrap();
    let tensors: Vec<OutTensor<'_>> = source
        .tensors()
        .iter()
        .map(|t| OutTensor::from_checkpoint(&source, t))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let letters = "abcdefghijklmnopqrstuvwxyz".repeat(5);
    let mut checked = 0;
    for n in (1..=64).chain([101]) {
        for (format, ext, name) in [
            (OutputFormat::TorchZip, "pt", "torch-zip"),
            (OutputFormat::Npz, "npz", "npz"),
        ] {
            let out = dir.path().join(format!("{}.{ext}", &letters[..n]));
            write(&out, format, &tensors, WriteOptions::default())
                .unwrap_or_else(|e| panic!("{e}"));
            let back = torchport::open(&out).unwrap_or_else(|e| panic!("{e}"));
            let ctx = out.display().to_string();
            let mut want = Expected {
                file: out.clone(),
                json: exp.json.clone(),
                bin: exp.bin.clone(),
            };
            want.json["format"] = name.into();
            if format == OutputFormat::Npz {
                // npz carries no strides: compare names, dtypes, shapes and bytes only.
                for t in want.json["tensors"].as_array_mut().unwrap() {
                    t.as_object_mut().unwrap().remove("stride");
                }
            }
            checked += check_tensors(&back, &want, &ctx, |_, _, _, _| {});
            std::fs::remove_file(&out).unwrap();
        }
    }
    assert_eq!(checked, 65 * 2 * 2);
}
