//! numpy arrays inside torch.save checkpoints (tests/fixtures/numpy_ckpt/, made by
//! tests/fixtures/gen/gen_numpy_ckpt.py): every numeric array is a tensor named by its key
//! path, with numpy's own bytes (big-endian and Fortran-order arrays included), in the zip,
//! legacy and protocol-5 files; object, record and string arrays are values that say why;
//! numpy scalars stay values; and converting to safetensors keeps every array byte for byte.

mod common;

use std::path::PathBuf;

use common::fixtures::{check_tensors, check_values, expected_files, fixture_dir, Expected};
use torchport::write::{write, OutputFormat, WriteOptions};
use torchport::{ByteOrder, OutTensor, Value};

fn fixtures() -> Vec<PathBuf> {
    let files = expected_files(&fixture_dir("numpy_ckpt"));
    assert_eq!(files.len(), 4, "the numpy_ckpt fixtures");
    files
}

/// Every fixture against numpy's answer: names in order, dtypes, shapes, numpy's strides,
/// bytes, each array's byte order, and the values.
#[test]
fn arrays_are_tensors_with_numpys_bytes() {
    let mut arrays = 0;
    for json in fixtures() {
        let exp = Expected::from_json(&json);
        let ckpt = exp.open();
        let ctx = exp.ctx();
        let n = check_tensors(&ckpt, &exp, &ctx, |t, w, _, tctx| {
            if let Some(order) = w.get("byte_order") {
                arrays += 1;
                let want = match order.as_str() {
                    Some("big") => ByteOrder::Big,
                    _ => ByteOrder::Little,
                };
                let got = ckpt.storage(t).unwrap().byte_order();
                // Single-byte elements have no byte order to speak of.
                if t.dtype.swap_width() > 1 {
                    assert_eq!(got, want, "{tctx}: byte order");
                }
            }
        });
        assert!(n >= 3, "{ctx}: {n} tensors");
        check_values(&ckpt, &exp, &ctx, true);
    }
    // 23 arrays in each of the three copies of the checkpoint, 2 in the big-endian file.
    assert_eq!(arrays, 3 * 23 + 2);
}

/// A big-endian torch file holding a little-endian numpy array does not say its data is
/// big-endian (`Checkpoint::byte_order` is `Big` only when all of it is); the torch tensor's
/// storage is big-endian and the array's keeps its own order.
#[test]
fn a_big_endian_file_with_a_little_endian_array_is_mixed() {
    let ckpt = torchport::open(fixture_dir("numpy_ckpt").join("numpy_bigfile.pt")).unwrap();
    let order = |name: &str| {
        ckpt.storage(ckpt.tensor(name).unwrap())
            .unwrap()
            .byte_order()
    };
    assert_eq!(order("w"), ByteOrder::Big);
    assert_eq!(order("little"), ByteOrder::Little);
    assert_eq!(ckpt.byte_order(), ByteOrder::Little);
}

#[test]
fn names_and_values_read_as_inspect_shows_them() {
    let ckpt = torchport::open(fixture_dir("numpy_ckpt").join("numpy_zip.pt")).unwrap();
    let anchors = ckpt.tensor("anchors").expect("anchors is a tensor");
    assert_eq!(
        (anchors.dtype.name(), &anchors.shape[..]),
        ("float32", &[3, 2][..])
    );
    let mean = ckpt.tensor("stats.mean").expect("stats.mean is a tensor");
    let floats: Vec<f32> = ckpt
        .data(mean)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(floats, [0.485, 0.456, 0.406]);
    assert_eq!(ckpt.tensor("more.7").unwrap().dtype.name(), "float64");
    // The same array reached twice shares one storage.
    let again = ckpt.tensor("anchors_again").unwrap();
    assert_eq!(ckpt.storage_of(anchors), ckpt.storage_of(again));
    let value = |k: &str| ckpt.values().iter().find(|(n, _)| n == k).map(|(_, v)| v);
    match value("objects") {
        Some(v @ Value::NumpyArray(a)) => {
            assert_eq!((a.dtype.as_str(), &a.shape[..]), ("|O8", &[3][..]));
            let shown = v.to_string();
            assert!(
                shown.contains("not a tensor") && shown.contains("Python objects"),
                "{shown}"
            );
            assert_eq!(v.to_json()["numpy_array"], "|O8");
        }
        other => panic!("objects: {other:?}"),
    }
    assert!(matches!(value("records"), Some(Value::NumpyArray(_))));
    assert_eq!(
        value("np_scalar").map(ToString::to_string).as_deref(),
        Some("numpy.float32(0.25)")
    );
    // Reading arrays refers to numpy's array functions, which the scan calls known-safe.
    let classes: Vec<_> = ckpt
        .globals()
        .iter()
        .map(|(m, n)| torchport::security::classify(m, n).name())
        .collect();
    assert!(
        classes.iter().all(|c| *c == "known-safe"),
        "{:?}",
        ckpt.globals()
    );
}

/// Acceptance: a checkpoint holding numpy arrays converts to safetensors with every array in
/// it, byte for byte as numpy holds it (read back with the reference safetensors crate).
#[test]
fn converts_to_safetensors_byte_exact() {
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for json in fixtures() {
        let exp = Expected::from_json(&json);
        let ckpt = exp.open();
        let out = dir.path().join("out.safetensors");
        let tensors: Vec<OutTensor<'_>> = ckpt
            .out_tensors()
            .into_iter()
            .filter(|t| OutputFormat::Safetensors.check_dtype(t.dtype).is_ok())
            .collect();
        write(
            &out,
            OutputFormat::Safetensors,
            &tensors,
            WriteOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let file = std::fs::read(&out).unwrap();
        let st = safetensors::SafeTensors::deserialize(&file).unwrap();
        for w in exp.tensors() {
            let name = w["name"].as_str().unwrap();
            let dtype = torchport::DType::from_name(w["dtype"].as_str().unwrap()).unwrap();
            if OutputFormat::Safetensors.check_dtype(dtype).is_err() {
                println!("{}: {name}: {dtype} has no safetensors type", exp.ctx());
                continue;
            }
            let v = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e:?}"));
            let shape: Vec<usize> = serde_json::from_value(w["shape"].clone()).unwrap();
            assert_eq!(v.shape(), &shape[..], "{name}");
            let off = w["offset"].as_u64().unwrap() as usize;
            let n = w["nbytes"].as_u64().unwrap() as usize;
            assert_eq!(v.data(), &exp.bin[off..off + n], "{}: {name}", exp.ctx());
            checked += 1;
        }
    }
    // Every tensor but the complex128 array (safetensors has no such type): 3 × 24 + 3.
    assert_eq!(checked, 75);
}
