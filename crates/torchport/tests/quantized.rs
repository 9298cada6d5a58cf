//! Quantized models through `convert::convert`: every fixture of tests/fixtures/quantized/
//! (state dicts of dynamic- and static-quantized models, written by
//! tests/fixtures/gen/gen_quantized.py) converted to safetensors and npz must equal, name for
//! name and byte for byte, the npz files torch and numpy wrote: `FILE.expected.npz` (int_repr
//! plus `NAME.scale` / `NAME.zero_point` / `NAME.axis`) and, with `dequantize`,
//! `FILE.dequantized.npz` (torch's own `dequantize()`). `.pt` keeps them quantized (read
//! back here with the same parameters; torch.load checks: tests/fixtures/gen/check_writers.py).
//! Also: a parameter name that collides with another tensor is refused, naming both.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use torchport::convert::convert;
use torchport::select::ConvertOptions;
use torchport::write::{write, OutputFormat, WriteOptions};
use torchport::{DType, OutTensor, Quant};

fn fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/quantized");
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pt"))
        .collect();
    v.sort();
    assert_eq!(v.len(), 4, "{v:?}");
    v
}

/// Every tensor of a file: (name, dtype, shape, bytes), sorted by name.
fn contents(path: &Path) -> Vec<(String, DType, Vec<usize>, Vec<u8>)> {
    let c = torchport::open(path).unwrap_or_else(|e| panic!("{e}"));
    let mut v: Vec<_> = c
        .tensors()
        .iter()
        .map(|t| {
            let data = c.data(t).unwrap().into_owned();
            (t.name.clone(), t.dtype, t.shape.clone(), data)
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn with(path: &Path, suffix: &str) -> PathBuf {
    PathBuf::from(format!("{}{suffix}", path.display()))
}

#[test]
fn safetensors_and_npz_equal_torchs_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    let mut params = 0;
    for fx in fixtures() {
        for (dequantize, expected) in [(false, ".expected.npz"), (true, ".dequantized.npz")] {
            let want = contents(&with(&fx, expected));
            for ext in ["safetensors", "npz"] {
                let out = dir.path().join(format!("out.{ext}"));
                let opts = ConvertOptions {
                    dequantize,
                    ..ConvertOptions::default()
                };
                convert(&fx, &out, &opts.clone().into()).unwrap_or_else(|e| panic!("{e}"));
                let got = contents(&out);
                let names = |v: &[(String, DType, Vec<usize>, Vec<u8>)]| {
                    v.iter().map(|t| t.0.clone()).collect::<Vec<_>>()
                };
                assert_eq!(names(&got), names(&want), "{} -> .{ext}", fx.display());
                for (g, w) in got.iter().zip(&want) {
                    assert_eq!(g, w, "{} -> .{ext} {dequantize}: {}", fx.display(), g.0);
                    checked += 1;
                    params += usize::from(g.0.ends_with(".axis"));
                }
                if dequantize {
                    assert!(got.iter().all(|t| !t.1.is_quantized()));
                }
            }
        }
    }
    // 4 per-channel tensors in the four fixtures, each with an axis, in two formats.
    assert_eq!(params, 8);
    assert!(checked >= 150, "only {checked} tensors checked");
}

#[test]
fn torch_zip_keeps_them_quantized() {
    let dir = tempfile::tempdir().unwrap();
    let mut quantized = 0;
    for fx in fixtures() {
        let out = dir.path().join("out.pt");
        convert(&fx, &out, &ConvertOptions::default().into()).unwrap();
        let (src, back) = (
            torchport::open(&fx).unwrap(),
            torchport::open(&out).unwrap(),
        );
        assert_eq!(src.tensors().len(), back.tensors().len());
        for (s, b) in src.tensors().iter().zip(back.tensors()) {
            assert_eq!((&s.name, s.dtype, &s.shape), (&b.name, b.dtype, &b.shape));
            assert_eq!(s.quant, b.quant, "{}", s.name);
            assert_eq!(src.data(s).unwrap(), back.data(b).unwrap(), "{}", s.name);
            quantized += usize::from(b.quant.is_some());
        }
    }
    assert_eq!(quantized, 11);
    // The float_qparams tensor keeps its scheme (float zero points).
    let q = torchport::open(&fixtures()[2]).unwrap();
    let emb = q.tensor("emb_float_qparams").unwrap();
    assert_eq!(
        emb.quant.as_ref().unwrap().scheme(),
        "per_channel_affine_float_qparams"
    );
}

#[test]
fn parameter_names_never_overwrite_a_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let q = OutTensor::new("w", DType::QInt8, vec![2], || Ok(Cow::Owned(vec![1, 2]))).with_quant(
        Some(Quant::PerTensor {
            scale: 0.5,
            zero_point: 0,
        }),
    );
    let other = OutTensor::new("w.scale", DType::F32, vec![], || {
        Ok(Cow::Owned(1f32.to_le_bytes().to_vec()))
    });
    let tensors = [q, other];
    for format in [OutputFormat::Safetensors, OutputFormat::Npz] {
        let out = dir.path().join(format!("x.{}", format.extension()));
        let err = write(&out, format, &tensors, WriteOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("tensor w:") && err.contains("w.scale"),
            "{err}"
        );
        assert!(!out.exists());
    }
    // .pt has a place for the scale: both are written.
    let out = dir.path().join("x.pt");
    write(
        &out,
        OutputFormat::TorchZip,
        &tensors,
        WriteOptions::default(),
    )
    .unwrap();
    assert_eq!(torchport::open(&out).unwrap().tensors().len(), 2);
    // A per-channel tensor whose parameters do not fit its shape is refused.
    let bad = [OutTensor::new("b", DType::QUInt8, vec![2, 2], || {
        Ok(Cow::Owned(vec![0; 4]))
    })
    .with_quant(Some(Quant::PerChannel {
        scales: vec![1.0; 3],
        zero_points: vec![0.0; 3],
        axis: 0,
        float_qparams: false,
    }))];
    for format in OutputFormat::ALL {
        let out = dir.path().join(format!("b.{}", format.extension()));
        let err = write(&out, format, &bad, WriteOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("3 scales and 3 zero points for 2 channels"),
            "{format}: {err}"
        );
        assert!(!out.exists());
    }
}
