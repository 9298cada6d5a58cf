//! `torchport convert` of a dynamic-quantized model through the real binary: safetensors equal
//! to the npz torch and numpy wrote (tests/fixtures/gen/gen_quantized.py), `--dequantize`
//! equal to torch's `dequantize()`, `.pt` keeping the quantization, and the dry run listing the
//! parameters that will be written.

use std::path::{Path, PathBuf};
use std::process::Output;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/quantized")
        .join(name)
}

fn torchport(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let o = crate::util::torchport(args);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// (name, dtype, shape, bytes) of every tensor, sorted by name.
fn contents(path: &Path) -> Vec<(String, String, Vec<usize>, Vec<u8>)> {
    let c = torchport::open(path).unwrap();
    let mut v: Vec<_> = c
        .tensors()
        .iter()
        .map(|t| {
            let d = c.data(t).unwrap().into_owned();
            (t.name.clone(), t.dtype.to_string(), t.shape.clone(), d)
        })
        .collect();
    v.sort();
    v
}

#[test]
fn dynamic_linear_converts_like_torch() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("dynamic_linear.pt");
    let st = dir.path().join("q.safetensors");
    torchport(&[&"convert", &src, &st]);
    let got = contents(&st);
    assert_eq!(got, contents(&fixture("dynamic_linear.pt.expected.npz")));
    let w = "0._packed_params._packed_params.0";
    let find = |n: &str| {
        got.iter()
            .find(|t| t.0 == n)
            .unwrap_or_else(|| panic!("{n}"))
    };
    assert_eq!(find(w).1, "int8");
    assert_eq!(find(&format!("{w}.scale")).1, "float64");
    assert_eq!(find(&format!("{w}.zero_point")).1, "int64");

    let deq = dir.path().join("d.safetensors");
    torchport(&[&"convert", &src, &deq, &"--dequantize"]);
    let got = contents(&deq);
    assert_eq!(got, contents(&fixture("dynamic_linear.pt.dequantized.npz")));
    assert!(got.iter().all(|t| t.1 == "float32" || t.1 == "int64"));

    let pt = dir.path().join("q.pt");
    torchport(&[&"convert", &src, &pt]);
    let (a, b) = (
        torchport::open(&src).unwrap(),
        torchport::open(&pt).unwrap(),
    );
    let qa: Vec<_> = a
        .tensors()
        .iter()
        .map(|t| (&t.name, t.dtype, &t.quant))
        .collect();
    let qb: Vec<_> = b
        .tensors()
        .iter()
        .map(|t| (&t.name, t.dtype, &t.quant))
        .collect();
    assert_eq!(qa, qb);
    assert_eq!(contents(&src), contents(&pt));

    let o = torchport(&[&"convert", &fixture("static_x86.pt"), &st, &"--dry-run"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("conv.weight.axis"), "{out}");
    assert!(out.contains("qint8 -> int8"), "{out}");
    assert!(out.contains("16 tensors"), "{out}");
}
