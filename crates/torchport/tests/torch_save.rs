//! Every torch.save fixture, compared with what torch itself loaded (written by
//! `tests/fixtures/gen/gen_torch_save.py` as `<file>.expected.json` + `.expected.bin`):
//! format, names in order, dtypes, shapes, strides, offsets, quantization parameters,
//! non-tensor values, storage sharing, and every tensor byte for byte.

mod common;

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use common::fixtures::{check_tensors, check_values, expected_files, fixture_dir, Expected};
use serde_json::Value as Json;
use torchport::Quant;

fn check_fixture(json_path: &Path) -> usize {
    let exp = Expected::from_json(json_path);
    let ckpt = exp.open();
    let ctx = exp.ctx();
    let checked = check_tensors(&ckpt, &exp, &ctx, |t, w, data, tctx| {
        if let Some(q) = w.get("quant") {
            match (&t.quant, q["scheme"].as_str().unwrap()) {
                (Some(Quant::PerTensor { scale, zero_point }), "per_tensor_affine") => {
                    assert_eq!(*scale, q["scale"].as_f64().unwrap(), "{tctx}: scale");
                    assert_eq!(*zero_point, q["zero_point"].as_i64().unwrap(), "{tctx}");
                }
                (
                    Some(Quant::PerChannel {
                        scales,
                        zero_points,
                        axis,
                        float_qparams: false,
                    }),
                    "per_channel_affine",
                ) => {
                    let ws: Vec<f64> = serde_json::from_value(q["scales"].clone()).unwrap();
                    let wz: Vec<f64> = serde_json::from_value(q["zero_points"].clone()).unwrap();
                    assert_eq!(scales, &ws, "{tctx}: scales");
                    assert_eq!(zero_points, &wz, "{tctx}: zero points");
                    assert_eq!(*axis as u64, q["axis"].as_u64().unwrap(), "{tctx}: axis");
                }
                (ours, scheme) => panic!("{tctx}: quant {ours:?} vs {scheme}"),
            }
        }
        // A contiguous little-endian view is handed out without a copy.
        let little = ckpt.byte_order() == torchport::ByteOrder::Little;
        if t.is_contiguous() && little && !data.is_empty() {
            assert!(
                matches!(data, Cow::Borrowed(_)),
                "{tctx}: expected zero-copy"
            );
        }
    });
    let want_tensors = exp.tensors();
    // Tensors torch says share one storage must share memory here too.
    let mut groups: HashMap<&str, Vec<&torchport::TensorInfo>> = HashMap::new();
    for (t, w) in ckpt.tensors().iter().zip(want_tensors) {
        if let Some(sid) = w.get("storage_id").and_then(Json::as_str) {
            groups.entry(sid).or_default().push(t);
        }
    }
    for (sid, ts) in groups {
        // Every view's storage lies inside the largest one of its group (the root storage).
        let ranges: Vec<(usize, usize)> = ts
            .iter()
            .filter_map(|t| ckpt.storage(t))
            .map(|s| {
                (
                    s.bytes().as_ptr() as usize,
                    s.bytes().as_ptr() as usize + s.len(),
                )
            })
            .collect();
        let root = ranges.iter().max_by_key(|(a, b)| b - a).copied();
        if let Some((lo, hi)) = root {
            for &(a, b) in &ranges {
                assert!(a >= lo && b <= hi, "{ctx}: storage {sid} is not shared");
            }
        }
    }

    check_values(&ckpt, &exp, &ctx, false);
    checked
}

#[test]
fn every_fixture_matches_torch() {
    let files = expected_files(&fixture_dir("torch_save"));
    let mut tensors = 0;
    for f in &files {
        tensors += check_fixture(f);
    }
    println!("checked {} fixtures, {tensors} tensors", files.len());
    assert!(files.len() >= 14, "only {} fixtures found", files.len());
    assert!(tensors >= 100, "only {tensors} tensors checked");
}
