//! TorchScript archives of torch's first format (torch 1.0 to 1.2: `model.json` and raw
//! `tensors/<n>` records; torch 1.2's buffers in `attributes.pkl`), written by those torch
//! versions (tests/fixtures/gen/gen_torchscript_legacy.py): every tensor is read with the
//! name, order, dtype, shape and bytes of the `state_dict()` torch 1.8 loads from the same
//! archive (`<archive>.state.npz`; torch 2.15 no longer loads the format). Crafted hostile
//! variants of the format each give one clear error; truncations and mutations never panic.

mod common;

use common::fixtures::fixture_dir;
use common::sweep::{mutations, open_as, read, truncations};
use common::zip;
use torchport::Format;

const ARCHIVES: &[&str] = &["t10_traced.pt", "t12_traced.pt", "t12_scripted.pt"];

#[test]
fn weights_are_torchs_state_dict() {
    let dir = fixture_dir("torchscript_legacy");
    for name in ARCHIVES {
        let ckpt = torchport::open(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(ckpt.format(), Format::TorchScript, "{name}");
        let want = torchport::open(dir.join(format!("{name}.state.npz"))).unwrap();
        let names = |c: &torchport::Checkpoint| -> Vec<String> {
            c.tensors().iter().map(|t| t.name.clone()).collect()
        };
        assert_eq!(
            names(&ckpt),
            names(&want),
            "{name}: names in state_dict order"
        );
        for (t, w) in ckpt.tensors().iter().zip(want.tensors()) {
            assert_eq!(
                (t.dtype, &t.shape),
                (w.dtype, &w.shape),
                "{name}: {}",
                t.name
            );
            assert_eq!(
                ckpt.data(t).unwrap(),
                want.data(w).unwrap(),
                "{name}: {} bytes",
                t.name
            );
        }
        // The transposed buffer is a strided view of its record, read in place.
        let table = ckpt.tensor("table").unwrap();
        assert_eq!(table.strides, [1, 2], "{name}");
    }
}

/// A first-format archive of `model` (model.json's text), its tensors stored in
/// `m/tensors/<n>` (`records`), and `attributes` as `m/attributes.pkl` if given.
fn legacy(model: &str, records: &[(&str, &[u8])], attributes: Option<&[u8]>) -> Vec<u8> {
    let mut all: Vec<(String, Vec<u8>)> = vec![
        ("m/version".into(), b"1".to_vec()),
        ("m/model.json".into(), model.as_bytes().to_vec()),
        ("m/code/m.py".into(), b"op_version_set = 0\n".to_vec()),
    ];
    for (k, v) in records {
        all.push((format!("m/{k}"), v.to_vec()));
    }
    if let Some(a) = attributes {
        all.push(("m/attributes.pkl".into(), a.to_vec()));
    }
    let refs: Vec<(&str, &[u8], bool)> = all
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_slice(), false))
        .collect();
    zip(&refs)
}

/// A module with one parameter `w`, tensor 0 of `table` (model.json's tensor list).
fn one_param(table: &str) -> String {
    format!(
        r#"{{"mainModule":{{"name":"m","parameters":[{{"isBuffer":false,"tensorId":"0","name":"w"}}]}},"tensors":[{table}]}}"#
    )
}

#[test]
fn hostile_archives_give_one_clear_error() {
    let f32x4 = r#"{"dims":["4"],"strides":["1"],"offset":"0","dataType":"FLOAT","data":{"key":"tensors/0"}}"#;
    let bytes16 = [0u8; 16];
    let cases: Vec<(&str, Vec<u8>, &[&str])> = vec![
        (
            "not JSON",
            legacy("{", &[], None),
            &["model.json", "not valid JSON"],
        ),
        (
            "no main module",
            legacy(r#"{"tensors":[]}"#, &[], None),
            &["model.json", "no mainModule"],
        ),
        (
            "a tensor past the table",
            legacy(&one_param(""), &[], None),
            &["tensor w", "past the end of model.json's table"],
        ),
        (
            "an unknown dtype",
            legacy(
                &one_param(&f32x4.replace("FLOAT", "COMPLEX")),
                &[("tensors/0", &bytes16)],
                None,
            ),
            &["tensor w", "dataType 'COMPLEX'"],
        ),
        (
            "a missing record",
            legacy(&one_param(f32x4), &[], None),
            &["tensor w", "m/tensors/0 is missing"],
        ),
        (
            "a view past its record",
            legacy(
                &one_param(&f32x4.replace("\"4\"", "\"5\"")),
                &[("tensors/0", &bytes16)],
                None,
            ),
            &["tensor w", "m/tensors/0"],
        ),
        (
            "an offset past its record",
            legacy(
                &one_param(&f32x4.replace("\"offset\":\"0\"", "\"offset\":\"99999999999999\"")),
                &[("tensors/0", &bytes16)],
                None,
            ),
            &["tensor w", "m/tensors/0"],
        ),
        (
            "more strides than dims",
            legacy(
                &one_param(&f32x4.replace("[\"1\"]", "[\"1\",\"1\"]")),
                &[("tensors/0", &bytes16)],
                None,
            ),
            &["tensor w", "1 dims but 2 strides"],
        ),
        (
            "a negative size",
            legacy(
                &one_param(&f32x4.replace("\"4\"", "\"-4\"")),
                &[("tensors/0", &bytes16)],
                None,
            ),
            &["'dims'", "not a size"],
        ),
        (
            "too many dims",
            legacy(
                &one_param(&format!(
                    r#"{{"dims":[{}],"dataType":"FLOAT","data":{{"key":"tensors/0"}}}}"#,
                    vec!["\"1\""; 65].join(",")
                )),
                &[("tensors/0", &bytes16)],
                None,
            ),
            &["'dims'", "at most 64"],
        ),
        (
            "JSON nested past serde_json's limit",
            legacy(&format!(r#"{{"mainModule":{}}}"#, nested(600)), &[], None),
            &["model.json", "recursion limit"],
        ),
        (
            "a tensor attribute with no attributes.pkl",
            legacy(
                r#"{"mainModule":{"attributes":[{"type":"Tensor","name":"b","id":"0"}]},"tensors":[]}"#,
                &[],
                None,
            ),
            &["'b'", "no attributes.pkl"],
        ),
        (
            "a tensor attribute that is no tensor",
            // attributes.pkl: (7,)
            legacy(
                r#"{"mainModule":{"attributes":[{"type":"Tensor","name":"b","id":"0"}]},"tensors":[]}"#,
                &[],
                Some(b"\x80\x02K\x07\x85q\x00."),
            ),
            &["'b'", "not a tensor in attributes.pkl"],
        ),
    ];
    for (what, bytes, words) in cases {
        let err = open_as("legacy.pt", bytes)
            .map(|_| ())
            .expect_err(what)
            .to_string();
        for w in words {
            assert!(err.contains(w), "{what}: {err:?} lacks {w:?}");
        }
    }
}

/// Modules nested deeper than `Limits::max_depth` (here 10; serde_json's own limit stops JSON
/// text nested past 128 levels, as above) are one error naming the limit.
#[test]
fn module_nesting_is_bounded() {
    let bytes = legacy(&format!(r#"{{"mainModule":{}}}"#, nested(30)), &[], None);
    let limits = torchport::Limits {
        max_depth: 10,
        ..Default::default()
    };
    let err = torchport::open_bytes("legacy.pt", bytes.clone(), &limits)
        .map(|_| ())
        .expect_err("nested past max_depth")
        .to_string();
    assert!(
        err.contains("nesting of modules") && err.contains("max_depth"),
        "{err}"
    );
    // Within the default limit, the same archive opens (with no tensors).
    let ckpt = torchport::open_bytes("legacy.pt", bytes, &Default::default()).unwrap();
    assert!(ckpt.tensors().is_empty());
}

/// `depth` modules, each the only submodule of the one before (serde_json's own nesting
/// limit of 128 stops a deeper JSON text first: modules nest two levels a module).
fn nested(depth: usize) -> String {
    let mut s = String::from(r#"{"name":"x"}"#);
    for _ in 0..depth {
        s = format!(r#"{{"name":"x","submodules":[{s}]}}"#);
    }
    s
}

/// Every prefix of each archive: an error, or exactly the intact file's tensors.
#[test]
fn every_truncation_fails_cleanly() {
    let (checked, _) = truncations(&read("torchscript_legacy", ARCHIVES), Some(400));
    assert!(checked >= 1000, "{checked}");
}

/// Deterministic byte mutations: no panic, and every tensor of a file that still opens reads
/// (or fails) cleanly.
#[test]
fn mutations_never_panic() {
    let (total, _) = mutations(
        &read("torchscript_legacy", ARCHIVES),
        300,
        0x5eed_1e9a_c701_0001,
    );
    assert_eq!(total, 900);
}
