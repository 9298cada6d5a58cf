//! Acceptance for numpy arrays inside checkpoints, through the real binary: `torchport
//! inspect` lists them as tensors (and the arrays that stay values, with why), `torchport
//! convert` writes them to safetensors byte for byte as numpy holds them (the expectations
//! tests/fixtures/gen/gen_numpy_ckpt.py wrote from numpy), and `torchport diff` finds the
//! output equal to the input.

use std::path::{Path, PathBuf};

use crate::util::assert_exit;

/// Run `torchport` with arguments of mixed types (strings and paths).
fn torchport(args: &[&dyn AsRef<std::ffi::OsStr>]) -> std::process::Output {
    crate::util::torchport(args)
}
use serde_json::Value as Json;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/numpy_ckpt")
        .join(name)
}

#[track_caller]
#[test]
fn inspect_lists_arrays_as_tensors() {
    let o = torchport(&[&"inspect", &fixture("numpy_zip.pt"), &"--json"]);
    assert_exit(&o, 0);
    let j: Json = serde_json::from_slice(&o.stdout).unwrap();
    let tensor = |n: &str| {
        j["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == n)
            .cloned()
    };
    let mean = tensor("stats.mean").expect("stats.mean listed");
    assert_eq!(
        (&mean["dtype"], &mean["shape"]),
        (&Json::from("float32"), &serde_json::json!([3]))
    );
    assert_eq!(
        tensor("fortran").unwrap()["shape"],
        serde_json::json!([3, 4])
    );
    assert!(tensor("objects").is_none());
    let plain = torchport(&[&"inspect", &fixture("numpy_zip.pt")]);
    assert_exit(&plain, 0);
    let out = String::from_utf8_lossy(&plain.stdout);
    assert!(
        out.contains("anchors") && out.contains("stats.mean"),
        "{out}"
    );
    assert!(
        out.contains("not a tensor, object arrays hold Python objects"),
        "{out}"
    );
}

#[test]
fn convert_writes_numpys_bytes() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["numpy_zip.pt", "numpy_legacy.pt", "numpy_proto5.pt"] {
        let src = fixture(name);
        let out = dir.path().join(format!("{name}.safetensors"));
        // safetensors has no complex128: that one array is left out by name.
        let o = torchport(&[&"convert", &src, &out, &"--exclude", &"^more\\.6$"]);
        assert_exit(&o, 0);
        let exp: Json = serde_json::from_slice(
            &std::fs::read(format!("{}.expected.json", src.display())).unwrap(),
        )
        .unwrap();
        let bin = std::fs::read(format!("{}.expected.bin", src.display())).unwrap();
        let file = std::fs::read(&out).unwrap();
        let st = safetensors::SafeTensors::deserialize(&file).unwrap();
        let mut checked = 0;
        for w in exp["tensors"].as_array().unwrap() {
            let n = w["name"].as_str().unwrap();
            if n == "more.6" {
                assert!(st.tensor(n).is_err(), "{name}: {n} was excluded");
                continue;
            }
            let v = st
                .tensor(n)
                .unwrap_or_else(|e| panic!("{name}: {n}: {e:?}"));
            let shape: Vec<usize> = serde_json::from_value(w["shape"].clone()).unwrap();
            assert_eq!(v.shape(), &shape[..], "{name}: {n}");
            let off = w["offset"].as_u64().unwrap() as usize;
            let len = w["nbytes"].as_u64().unwrap() as usize;
            assert_eq!(v.data(), &bin[off..off + len], "{name}: {n}: numpy's bytes");
            checked += 1;
        }
        assert_eq!(checked, 24, "{name}");
        assert_eq!(st.len(), 24, "{name}");
        // diff: all 24 shared tensors equal; the excluded one is the only name missing.
        let d = torchport(&[&"diff", &src, &out]);
        assert_exit(&d, 1);
        let report = String::from_utf8_lossy(&d.stdout);
        assert!(
            report.contains("only in A (1):\n  more.6")
                && report.contains("24 shared tensors, 0 not close"),
            "{report}"
        );
    }
}
