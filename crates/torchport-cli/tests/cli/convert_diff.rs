//! `torchport convert` and `torchport diff` through the real binary: outputs read back with
//! torchport, the safetensors crate and the zip crate; selection flags; dry runs; refusing to
//! overwrite the input; exit codes (0 / 1 / 2) and the messages that go with them.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use crate::util::{assert_exit, text};

/// Run `torchport` with arguments of mixed types (strings and paths).
fn torchport(args: &[&dyn AsRef<std::ffi::OsStr>]) -> std::process::Output {
    crate::util::torchport(args)
}
use torchport::write::{write, OutputFormat, WriteOptions};
use torchport::OutTensor;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/torch_save")
        .join(name)
}

#[track_caller]
#[test]
fn convert_to_each_format_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("proto2.pt");
    let ckpt = torchport::open(&src).unwrap();

    // .pt: read back with torchport, identical bytes; diff against the source says close.
    let pt = dir.path().join("m.pt");
    let o = torchport(&[&"convert", &src, &pt]);
    assert_exit(&o, 0);
    assert!(
        text(&o.stderr).contains("wrote 9 tensors"),
        "{}",
        text(&o.stderr)
    );
    let back = torchport::open(&pt).unwrap();
    assert_eq!(back.tensors().len(), ckpt.tensors().len());
    for t in ckpt.tensors() {
        assert_eq!(back.data_by_name(&t.name).unwrap(), ckpt.data(t).unwrap());
    }
    assert_exit(&torchport(&[&"diff", &src, &pt]), 0);

    // .safetensors: the reference crate reads it.
    let st = dir.path().join("m.safetensors");
    assert_exit(&torchport(&[&"convert", &src, &st]), 0);
    let bytes = std::fs::read(&st).unwrap();
    let s = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(s.len(), 9);
    for t in ckpt.tensors() {
        assert_eq!(s.tensor(&t.name).unwrap().data(), &*ckpt.data(t).unwrap());
    }

    // .npz: a zip of <name>.npy entries in file order.
    let npz = dir.path().join("m.npz");
    assert_exit(&torchport(&[&"convert", &src, &npz]), 0);
    let zip = zip::ZipArchive::new(std::fs::File::open(&npz).unwrap()).unwrap();
    let names: Vec<String> = zip.file_names().map(|n| n.unwrap().into_owned()).collect();
    let want: Vec<String> = ckpt
        .tensors()
        .iter()
        .map(|t| format!("{}.npy", t.name))
        .collect();
    assert_eq!(names, want);
}

#[test]
fn key_include_exclude_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("training_ckpt.pt");
    let out = dir.path().join("sd.pt");
    let o = torchport(&[
        &"convert",
        &src,
        &out,
        &"--key",
        &"state_dict",
        &"--include",
        &r"^0\.",
        &"--exclude",
        &"bias$",
        &"--dtype",
        &"float16",
    ]);
    assert_exit(&o, 0);
    let back = torchport::open(&out).unwrap();
    let names: Vec<(&str, &str)> = back
        .tensors()
        .iter()
        .map(|t| (t.name.as_str(), t.dtype.name()))
        .collect();
    assert_eq!(names, [("0.weight", "float16")]);
    // The cast rounds like torch: compare with the float32 source rounded to float16.
    let ckpt = torchport::open(&src).unwrap();
    let f32s = ckpt.data_by_name("state_dict.0.weight").unwrap();
    let want = torchport::cast::cast(&f32s, torchport::DType::F32, torchport::DType::F16).unwrap();
    assert_eq!(&*back.data_by_name("0.weight").unwrap(), &want[..]);

    // Casting to a non-float dtype is refused with the list of choices.
    let o = torchport(&[&"convert", &src, &out, &"--dtype", &"int8"]);
    assert_exit(&o, 2);
    assert!(text(&o.stderr).contains("float16, bfloat16, float32, float64"));
    // A bad regex names the flag.
    let o = torchport(&[&"convert", &src, &out, &"--include", &"("]);
    assert_exit(&o, 2);
    assert!(text(&o.stderr).contains("--include \"(\" is not a valid regex"));
}

#[test]
fn wrong_key_lists_the_top_level_keys() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.safetensors");
    let o = torchport(&[
        &"convert",
        &fixture("training_ckpt.pt"),
        &out,
        &"--key",
        &"model",
    ]);
    assert_exit(&o, 2);
    let err = text(&o.stderr);
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains("key \"model\" does not exist"), "{err}");
    assert!(
        err.contains("state_dict, optimizer, epoch, step, best_acc, name, scheduler"),
        "{err}"
    );
    assert!(!out.exists());
    let o = torchport(&[
        &"convert",
        &fixture("training_ckpt.pt"),
        &out,
        &"--key",
        &"epoch",
    ]);
    assert_exit(&o, 2);
    assert!(text(&o.stderr).contains("key \"epoch\" is a single entry"));
}

#[test]
fn dry_run_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.safetensors");
    let o = torchport(&[
        &"convert",
        &fixture("training_ckpt.pt"),
        &out,
        &"--key",
        &"state_dict",
        &"--dtype",
        &"bfloat16",
        &"--dry-run",
    ]);
    assert_exit(&o, 0);
    let s = text(&o.stdout);
    assert!(s.contains("0.weight  float32 -> bfloat16  [3, 4]"), "{s}");
    assert!(s.contains("4 tensors, 46 B (46 bytes)"), "{s}");
    assert!(s.contains("metadata: format"), "{s}");
    assert!(s.contains("nothing was written"), "{s}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn refuses_to_overwrite_the_input() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.pt");
    std::fs::copy(fixture("proto2.pt"), &input).unwrap();
    let before = std::fs::read(&input).unwrap();
    let link = dir.path().join("link.pt");
    std::fs::hard_link(&input, &link).unwrap();
    for out in [&input, &link] {
        let o = torchport(&[&"convert", &input, out]);
        assert_exit(&o, 2);
        assert!(
            text(&o.stderr).contains("refusing to overwrite an input"),
            "{}",
            text(&o.stderr)
        );
    }
    assert_eq!(std::fs::read(&input).unwrap(), before);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
}

#[test]
fn unknown_extension_and_unwritable_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let o = torchport(&[&"convert", &fixture("proto2.pt"), &dir.path().join("x.bin")]);
    assert_exit(&o, 2);
    assert!(text(&o.stderr).contains("use .safetensors, .npz or .pt"));
    let out = dir.path().join("x.npz");
    let o = torchport(&[&"convert", &fixture("dtypes.pt"), &out]);
    assert_exit(&o, 2);
    let err = text(&o.stderr);
    assert!(
        err.contains("tensor bfloat16 is bfloat16, which a .npz file cannot hold")
            && err.contains("--dtype"),
        "{err}"
    );
    assert!(!out.exists());
}

/// Write `src`'s tensors to a .pt with one element of `name` changed by `delta`.
fn perturbed(src: &Path, out: &Path, name: &str, delta: f32) {
    let ckpt = torchport::open(src).unwrap();
    let ckpt = &ckpt;
    let tensors: Vec<OutTensor<'_>> = ckpt
        .tensors()
        .iter()
        .map(|t| {
            let bump = t.name == name;
            OutTensor::new(t.name.clone(), t.dtype, t.shape.clone(), move || {
                let mut d = ckpt.data(t)?.into_owned();
                if bump {
                    let v = f32::from_le_bytes(d[4..8].try_into().unwrap()) + delta;
                    d[4..8].copy_from_slice(&v.to_le_bytes());
                }
                Ok(Cow::Owned(d))
            })
        })
        .collect();
    write(
        out,
        OutputFormat::TorchZip,
        &tensors,
        WriteOptions::default(),
    )
    .unwrap();
}

#[test]
fn diff_exit_codes_and_reports() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("proto2.pt");
    assert_exit(&torchport(&[&"diff", &src, &src]), 0);

    let bad = dir.path().join("bad.pt");
    perturbed(&src, &bad, "2.weight", 0.01);
    let o = torchport(&[&"diff", &src, &bad]);
    assert_exit(&o, 1);
    let s = text(&o.stdout);
    assert!(s.contains("2.weight"), "{s}");
    assert!(s.contains("DIFFERENT"), "{s}");
    assert!(s.contains("1/54"), "{s}"); // one element of 54 not close
    assert!(s.contains("9 shared tensors, 1 not close"), "{s}");

    // Within tolerance: the same perturbation passes a loose --atol.
    assert_exit(&torchport(&[&"diff", &src, &bad, &"--atol", &"0.02"]), 0);

    let o = torchport(&[&"diff", &src, &bad, &"--json"]);
    assert_exit(&o, 1);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["close"], false);
    let t = j["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "2.weight")
        .unwrap();
    assert_eq!(t["close"], false);
    assert_eq!(t["mismatched"], 1);
    assert_eq!(t["worst_index"], 1);
    let max_abs = t["max_abs"].as_f64().unwrap();
    assert!((max_abs - 0.01).abs() < 1e-6, "{max_abs}");

    // Names missing on one side: exit 1, listed.
    let fewer = dir.path().join("fewer.pt");
    assert_exit(
        &torchport(&[&"convert", &src, &fewer, &"--exclude", &"^3\\."]),
        0,
    );
    let o = torchport(&[&"diff", &src, &fewer]);
    assert_exit(&o, 1);
    let s = text(&o.stdout);
    assert!(s.contains("only in A (5):\n  3.weight\n  3.bias"), "{s}");
}

#[test]
fn diff_errors_exit_2() {
    let o = torchport(&[&"diff", &fixture("proto2.pt"), &"/nonexistent/x.pt"]);
    assert_exit(&o, 2);
    let err = text(&o.stderr);
    assert!(
        err.starts_with("error: /nonexistent/x.pt: cannot read the file"),
        "{err}"
    );
    let o = torchport(&[
        &"diff",
        &fixture("proto2.pt"),
        &fixture("proto2.pt"),
        &"--rtol",
        &"-1",
    ]);
    assert_exit(&o, 2);
}
