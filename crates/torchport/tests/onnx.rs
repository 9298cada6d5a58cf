//! Every ONNX fixture, compared with what onnx itself read (written by
//! `tests/fixtures/gen/gen_onnx.py` as `<file>.expected.json` + `.expected.bin` from
//! `onnx.numpy_helper.to_array`): format, initializer names in order, dtypes, shapes, every
//! byte; raw_data and external data handed out zero-copy from the memory maps; detection
//! never claims another format's file; external data stays inside the model's folder.

mod common;

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use common::fixtures::{check_tensors, check_values, fixture_dir as fixtures, Expected};
use torchport::{Format, Limits};

fn onnx_files() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(fixtures("onnx"))
        .expect("fixture directory")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    v.sort();
    v
}

/// Compare one model with onnx's answer; returns the number of tensors checked.
fn check_fixture(model: &Path) -> usize {
    let exp = Expected::of(model);
    let ckpt = exp.open();
    let ctx = exp.ctx();
    // Tensors given in typed fields are converted (owned); all others are mapped.
    let typed = model.ends_with("typed_fields.onnx");
    assert_eq!(ckpt.format(), Format::Onnx, "{ctx}");
    let checked = check_tensors(&ckpt, &exp, &ctx, |t, _, data, tctx| {
        assert!(t.is_contiguous(), "{tctx}: contiguous");
        assert!(matches!(data, Cow::Borrowed(_)), "{tctx}: borrowed");
        if !data.is_empty() {
            let mapped = ckpt.storage(t).unwrap().is_mapped();
            assert_eq!(mapped, !typed, "{tctx}: zero-copy from the map");
        }
    });
    check_values(&ckpt, &exp, &ctx, true);
    checked
}

#[test]
fn every_fixture_matches_onnx() {
    let files = onnx_files();
    let mut tensors = 0;
    for f in &files {
        tensors += check_fixture(f);
    }
    println!("checked {} models, {tensors} tensors", files.len());
    assert!(files.len() >= 4, "only {} models found", files.len());
    assert!(tensors >= 55, "only {tensors} tensors checked");
}

/// A model holding raw_data: its tensors are ranges of the model file itself.
#[test]
fn raw_data_is_a_range_of_the_model_file() {
    let path = fixtures("onnx/raw_dtypes.onnx");
    let file = std::fs::read(&path).unwrap();
    let ckpt = torchport::open(&path).unwrap();
    let t = ckpt.tensor("float32.weight").unwrap();
    let bytes = ckpt.storage(t).unwrap().bytes();
    assert_eq!(bytes.len(), 96);
    let at = file
        .windows(bytes.len())
        .position(|w| w == bytes)
        .expect("raw_data bytes are in the file");
    assert!(at > 0);
}

/// External tensors are ranges of weights.bin (not copies), in the order onnx wrote them.
#[test]
fn external_data_is_mapped_from_weights_bin() {
    let weights = std::fs::read(fixtures("onnx/weights.bin")).unwrap();
    let ckpt = torchport::open(fixtures("onnx/external.onnx")).unwrap();
    let mut total = 0;
    for t in ckpt.tensors() {
        let s = ckpt.storage(t).unwrap();
        assert!(s.is_mapped(), "{}", t.name);
        assert!(
            weights.windows(s.len()).any(|w| w == s.bytes()),
            "{}",
            t.name
        );
        total += s.len();
    }
    assert_eq!(
        total,
        weights.len(),
        "every byte of weights.bin is one tensor's"
    );
    // In memory there is no folder to look in: refused, naming the tensor and the reason.
    let bytes = std::fs::read(fixtures("onnx/external.onnx")).unwrap();
    let err = torchport::open_bytes("external.onnx", bytes, &Limits::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("enc.weight") && err.contains("weights.bin"),
        "{err}"
    );
    assert!(err.contains("from memory"), "{err}");
}

/// `detect` recognizes every ONNX fixture and no file of another format.
#[test]
fn detection_is_by_content_and_never_claims_other_formats() {
    for f in onnx_files() {
        let bytes = std::fs::read(&f).unwrap();
        assert_eq!(torchport::detect(&bytes), Some(Format::Onnx), "{f:?}");
    }
    let mut others = 0;
    for dir in std::fs::read_dir(fixtures("")).unwrap() {
        let dir = dir.unwrap().path();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        if !dir.is_dir() || name.contains("onnx") || name == "gen" {
            continue;
        }
        for f in std::fs::read_dir(&dir).unwrap() {
            let f = f.unwrap().path();
            let fname = f.file_name().unwrap().to_string_lossy().into_owned();
            if fname.contains(".expected.") || fname.ends_with(".json") || !f.is_file() {
                continue;
            }
            let bytes = std::fs::read(&f).unwrap();
            assert_ne!(torchport::detect(&bytes), Some(Format::Onnx), "{f:?}");
            others += 1;
        }
    }
    println!("{others} files of other formats are not taken for ONNX");
    assert!(others >= 20, "only {others} other files");
}

/// A symbolic link inside the model's folder is followed while its target stays inside;
/// one that leads out of the folder is refused.
#[cfg(unix)]
#[test]
fn symlinks_must_stay_inside_the_folder() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("onnx_symlinks");
    let _ = std::fs::remove_dir_all(&root);
    let model_dir = root.join("model");
    std::fs::create_dir_all(model_dir.join("sub")).unwrap();
    std::fs::copy(
        fixtures("onnx/external.onnx"),
        model_dir.join("external.onnx"),
    )
    .unwrap();
    let weights = fixtures("onnx/weights.bin");
    let want = torchport::open(fixtures("onnx/external.onnx")).unwrap();
    let want: Vec<Vec<u8>> = want
        .tensors()
        .iter()
        .map(|t| want.data(t).unwrap().into_owned())
        .collect();

    // Inside: model/weights.bin -> sub/real.bin.
    std::fs::copy(&weights, model_dir.join("sub/real.bin")).unwrap();
    std::os::unix::fs::symlink("sub/real.bin", model_dir.join("weights.bin")).unwrap();
    let ckpt = torchport::open(model_dir.join("external.onnx")).unwrap();
    let got: Vec<Vec<u8>> = ckpt
        .tensors()
        .iter()
        .map(|t| ckpt.data(t).unwrap().into_owned())
        .collect();
    assert_eq!(got, want);

    // Outside: model/weights.bin -> ../outside.bin.
    std::fs::copy(&weights, root.join("outside.bin")).unwrap();
    std::fs::remove_file(model_dir.join("weights.bin")).unwrap();
    std::os::unix::fs::symlink("../outside.bin", model_dir.join("weights.bin")).unwrap();
    let err = torchport::open(model_dir.join("external.onnx"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("outside the model's folder") && err.contains("enc.weight"),
        "{err}"
    );
}
