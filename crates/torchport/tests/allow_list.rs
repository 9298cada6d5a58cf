//! The security verdict is an allow-list: every file torch wrote from plain state_dicts and
//! training checkpoints scans `ok`; every code-execution gadget in `tests/fixtures/gadgets/`
//! (made by `tests/fixtures/gen/gen_gadgets.py`) is not `ok`, and the dangerous ones are
//! refused by `open` and `open_bytes`.

use std::path::{Path, PathBuf};

use torchport::security::{scan, GlobalClass};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// Fixtures that hold globals on no allow-list, with the reason; everything else torch
/// wrote must be `ok`.
const NOT_OK: &[(&str, &str)] = &[
    (
        "torch_save/whole_module.pt",
        "torch.save(model): the model's own classes",
    ),
    (
        "torch_save/param_state.pt",
        "a tensor subclass of the test's own code",
    ),
    (
        "remap/embed_linear_module.pt",
        "torch.save(model): the model's own classes",
    ),
    (
        "archives/scripted_lstm.pt",
        "TorchScript: __torch__ classes, run by torch.jit.load",
    ),
    (
        "archives/scripted_nonpersistent.pt",
        "TorchScript: __torch__ classes",
    ),
    ("archives/traced_cnn.pt", "TorchScript: __torch__ classes"),
    (
        "quantized/dynamic_lstm.pt",
        "torch.ScriptObject (a dynamic-quantized LSTM's packed weights): torch.load(weights_only=True) refuses it too",
    ),
];

/// Sidecar files the generators write next to fixtures (expected values, inputs, notes).
fn is_sidecar(path: &Path) -> bool {
    let name = path.file_name().unwrap().to_str().unwrap();
    name.contains(".expected.")
        || name.contains(".constants.")
        || name.contains(".input_")
        || name.contains(".output_")
        || name.ends_with(".txt")
        || name.ends_with(".toml")
        || name.ends_with(".md")
        // ONNX external data; the sharded checkpoints' shards are `pytorch_model-*.bin`
        || (name.ends_with(".bin") && !name.starts_with("pytorch_model"))
        || (name.ends_with(".json") && !name.ends_with(".index.json"))
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            walk(&p, out);
        } else if !is_sidecar(&p) {
            out.push(p);
        }
    }
}

#[test]
fn every_file_torch_wrote_from_state_dicts_is_ok() {
    let mut files = Vec::new();
    for dir in [
        "torch_save",
        "formats",
        "archives",
        "frameworks",
        "remap",
        "cast",
        "onnx",
        "export",
        "numpy_ckpt",
        "quantized",
    ] {
        walk(&fixtures().join(dir), &mut files);
    }
    let (mut ok, mut not_ok, mut with_globals) = (0, 0, 0);
    for path in &files {
        let rel = path.strip_prefix(fixtures()).unwrap().to_str().unwrap();
        // export/bad_*.pt2 are broken on purpose (the runtime's error tests); they still scan.
        let report = scan(path).unwrap_or_else(|e| panic!("{rel}: {e}"));
        let unlisted: Vec<_> = report
            .globals
            .iter()
            .filter(|g| g.class != GlobalClass::KnownSafe)
            .map(|g| format!("{}.{} [{}]", g.module, g.name, g.class.name()))
            .collect();
        if NOT_OK.iter().any(|(f, _)| *f == rel) {
            assert_eq!(
                report.verdict(),
                "unsafe-for-torch-load",
                "{rel}: {unlisted:?}"
            );
            assert!(report.dangerous().next().is_none(), "{rel}");
            not_ok += 1;
        } else {
            assert_eq!(
                report.verdict(),
                "ok",
                "{rel}: {unlisted:?} {:?}",
                report.problems
            );
            ok += 1;
        }
        if !report.globals.is_empty() {
            with_globals += 1;
        }
    }
    assert_eq!(not_ok, NOT_OK.len());
    // The walk found the fixtures (a harness that checks nothing must fail).
    assert!(ok >= 100, "only {ok} files checked");
    assert!(with_globals >= 35, "only {with_globals} files with pickles");
    eprintln!("{ok} files ok, {not_ok} unsafe for torch.load, {with_globals} with pickles");
}

/// (file, global, class) for each gadget fixture.
const GADGETS: &[(&str, &str, GlobalClass)] = &[
    ("torch_load.pt", "torch.load", GlobalClass::Dangerous),
    (
        "torch_serialization_load.pt",
        "torch.serialization.load",
        GlobalClass::Dangerous,
    ),
    (
        "torch_hub_load.pt",
        "torch.hub.load",
        GlobalClass::Dangerous,
    ),
    ("numpy_load.pt", "numpy.load", GlobalClass::Dangerous),
    ("cprofile_run.pt", "cProfile.run", GlobalClass::Dangerous),
    ("profile_run.pt", "profile.run", GlobalClass::Dangerous),
    ("pydoc_locate.pt", "pydoc.locate", GlobalClass::Dangerous),
    (
        "exec_wrapper.pt",
        "torch.jit.unsupported_tensor_ops.execWrapper",
        GlobalClass::Dangerous,
    ),
    ("pip_main.pt", "pip.main", GlobalClass::Dangerous),
    (
        "start_new_thread.pt",
        "_thread.start_new_thread",
        GlobalClass::Dangerous,
    ),
    (
        "threading_thread.pt",
        "threading.Thread",
        GlobalClass::Dangerous,
    ),
    (
        "urlopen.pt",
        "urllib.request.urlopen",
        GlobalClass::Dangerous,
    ),
    ("own_class.pt", "mymodel.Exploit", GlobalClass::Unlisted),
    (
        "load_from_bytes.pt",
        "torch.storage._load_from_bytes",
        GlobalClass::Unlisted,
    ),
    // Plain-pickled tensors: each storage is a whole nested torch.save file, whose own
    // globals the scan lists (tests/load_from_bytes.rs reads them).
    (
        "load_from_bytes_views.pt",
        "torch.storage._load_from_bytes",
        GlobalClass::Unlisted,
    ),
    (
        "load_from_bytes_dangerous.pt",
        "os.system",
        GlobalClass::Dangerous,
    ),
    (
        "load_from_bytes_twice.pt",
        "torch.storage._load_from_bytes",
        GlobalClass::Unlisted,
    ),
    (
        "load_from_bytes_truncated.pt",
        "torch.storage._load_from_bytes",
        GlobalClass::Unlisted,
    ),
    (
        "load_from_bytes_garbage.pt",
        "torch.storage._load_from_bytes",
        GlobalClass::Unlisted,
    ),
];

#[test]
fn every_gadget_is_not_ok_and_dangerous_ones_are_refused() {
    let dir = fixtures().join("gadgets");
    let mut on_disk = Vec::new();
    walk(&dir, &mut on_disk);
    assert_eq!(on_disk.len(), GADGETS.len(), "{on_disk:?}");
    for (file, global, class) in GADGETS {
        let path = dir.join(file);
        let report = scan(&path).unwrap();
        assert_ne!(report.verdict(), "ok", "{file}");
        let found = report
            .globals
            .iter()
            .find(|g| format!("{}.{}", g.module, g.name) == *global)
            .unwrap_or_else(|| panic!("{file}: {global} not listed in {:?}", report.globals));
        assert_eq!(found.class, *class, "{file}");
        if *class == GlobalClass::Dangerous {
            assert_eq!(report.verdict(), "refused", "{file}");
            for err in [
                torchport::open(&path).err(),
                torchport::open_bytes(file, std::fs::read(&path).unwrap(), &Default::default())
                    .err(),
            ] {
                let err = err.unwrap_or_else(|| panic!("{file} opened")).to_string();
                assert!(err.contains("refusing global"), "{file}: {err}");
            }
        } else {
            assert_eq!(report.verdict(), "unsafe-for-torch-load", "{file}");
        }
    }
}

#[test]
fn a_file_own_class_is_read_as_data() {
    let ckpt = torchport::open(fixtures().join("gadgets/own_class.pt")).unwrap();
    let values: Vec<String> = ckpt
        .values()
        .iter()
        .map(|(k, v)| format!("{k} = {v}"))
        .collect();
    assert_eq!(values, ["x = <mymodel.Exploit object>"]);
}
