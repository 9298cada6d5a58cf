//! `torchport inspect --security` through the real binary: every global of every pickle is
//! listed and classified; a refused file is still reported (stdout) and exits 2 with the
//! refusal on stderr; `--json` carries `security: {globals, verdict}`.

use std::path::{Path, PathBuf};

use crate::util::{root, text, torchport};
use serde_json::Value;

/// `module.name class` for each global of a `security` JSON object.
fn listed(security: &Value) -> Vec<String> {
    security["globals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            format!(
                "{}.{} {}",
                g["module"].as_str().unwrap(),
                g["name"].as_str().unwrap(),
                g["class"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn refused_files_are_reported_then_exit_2() {
    for (file, global) in [
        ("tests/fixtures/hostile/os_system.pt", "posix.system"),
        ("tests/fixtures/hostile/builtins_eval.pt", "builtins.eval"),
        ("tests/fixtures/hostile/os_system_legacy.pt", "posix.system"),
        ("tests/fixtures/hostile/os_system_tar.pt", "os.system"),
    ] {
        let out = torchport(&["inspect", file, "--security"]);
        assert_eq!(out.status.code(), Some(2), "{file}");
        let stdout = text(&out.stdout);
        assert!(
            stdout.contains(&format!("{global}  [dangerous]")),
            "{file}: {stdout}"
        );
        assert!(
            stdout.contains("security: REFUSED: 1 dangerous"),
            "{file}: {stdout}"
        );
        let err = text(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{file}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(global) && err.contains("refusing"),
            "{file}: {err}"
        );

        let out = torchport(&["inspect", file, "--security", "--json"]);
        assert_eq!(out.status.code(), Some(2), "{file}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["security"]["verdict"], "refused", "{file}");
        assert!(
            listed(&v["security"]).contains(&format!("{global} dangerous")),
            "{file}: {v}"
        );
        assert!(
            v.get("tensors").is_none(),
            "a refused file lists no tensors"
        );
        assert!(text(&out.stderr).contains("refusing"), "{file}");
    }
}

#[test]
fn clean_files_pass_with_every_global_classified() {
    // (file, globals that must be listed with their class)
    let cases: &[(&str, &[&str])] = &[
        (
            "tests/fixtures/torch_save/lstm_linear.pt",
            &[
                "torch._utils._rebuild_tensor_v2 known-safe",
                "collections.OrderedDict known-safe",
                "torch.FloatStorage known-safe",
            ],
        ),
        (
            "tests/fixtures/torch_save/legacy.pt",
            &["torch._utils._rebuild_tensor_v2 known-safe"],
        ),
        (
            "tests/fixtures/torch_save/tar.pt",
            &["torch.FloatStorage known-safe"],
        ),
    ];
    for (file, want) in cases {
        let out = torchport(&["inspect", file, "--security", "--json"]);
        assert!(out.status.success(), "{file}: {}", text(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let sec = &v["security"];
        assert_eq!(sec["verdict"], "ok", "{file}");
        let got = listed(sec);
        for w in *want {
            assert!(got.contains(&w.to_string()), "{file}: {w} not in {got:?}");
        }
        assert!(got.iter().all(|g| !g.ends_with(" dangerous")), "{file}");
        // The usual inspect output is still there, and every global inspect lists is in
        // the security section too (the scan covers every pickle, not only the main one).
        assert!(!v["tensors"].as_array().unwrap().is_empty(), "{file}");
        for g in v["globals"].as_array().unwrap() {
            let g = format!(
                "{}.{} {}",
                g["module"].as_str().unwrap(),
                g["name"].as_str().unwrap(),
                g["class"].as_str().unwrap()
            );
            assert!(
                got.contains(&g),
                "{file}: {g} missing from the security section"
            );
        }
    }

    let out = torchport(&[
        "inspect",
        "tests/fixtures/torch_save/lstm_linear.pt",
        "--security",
    ]);
    assert!(out.status.success());
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("security: ok: every global is on the allow-list"),
        "{stdout}"
    );
}

#[test]
fn a_whole_pickled_module_is_read_but_unsafe_for_torch_load() {
    // torch.save(model) names the model's own classes: torchport reads the tensors without
    // importing them, but torch.load would import and run that code.
    let file = "tests/fixtures/torch_save/whole_module.pt";
    let out = torchport(&["inspect", file, "--security", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["security"]["verdict"], "unsafe-for-torch-load");
    let got = listed(&v["security"]);
    for w in [
        "tiny_models.TinyNet unlisted",
        "torch.nn.modules.linear.Linear unlisted",
        "collections.OrderedDict known-safe",
        "__builtin__.set known-safe",
    ] {
        assert!(got.contains(&w.to_string()), "{w} not in {got:?}");
    }
    let allow: Vec<_> = v["security"]["globals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.get("allow_list").and_then(Value::as_str).unwrap_or("-"))
        .collect();
    assert!(
        allow.contains(&"torch-weights-only") && allow.contains(&"-"),
        "{allow:?}"
    );
    assert_eq!(v["tensors"].as_array().unwrap().len(), 12, "{v}");

    let out = torchport(&["inspect", file, "--security"]);
    assert!(out.status.success());
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("security: UNSAFE FOR torch.load: 5 global(s) on no allow-list"),
        "{stdout}"
    );
    assert!(
        stdout.contains("  tiny_models.TinyNet  [unlisted]"),
        "{stdout}"
    );
    assert!(
        stdout.contains("(root)  tiny_models.TinyNet"),
        "the normal table too: {stdout}"
    );
}

#[test]
fn unreadable_files_exit_2_without_a_report() {
    for (file, word) in [
        (
            "tests/fixtures/hostile/random.bin",
            "not a file torchport recognizes",
        ),
        (
            "tests/fixtures/hostile/truncated_zip.pt",
            "zip archive is corrupt",
        ),
        ("no/such/file.pt", "cannot read the file"),
    ] {
        let out = torchport(&["inspect", file, "--security"]);
        assert_eq!(out.status.code(), Some(2), "{file}");
        assert!(out.stdout.is_empty(), "{file}: nothing on stdout");
        let err = text(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{file}: {err}");
        assert!(err.contains(word), "{file}: {err}");
    }
}

#[test]
fn a_file_that_scans_but_does_not_open_is_reported_then_exit_2() {
    // oob_view.pt: its pickle is harmless, its tensor view is out of bounds.
    let out = torchport(&[
        "inspect",
        "tests/fixtures/hostile/oob_view.pt",
        "--security",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stdout).contains("security: ok"));
    assert!(text(&out.stderr).contains("storage holds only 64 bytes"));
}

/// A copy of fixture `file` in a temporary folder with the byte just after `after` (the
/// first occurrence) replaced by 0xff, which is not a pickle opcode.
fn corrupt_after(dir: &Path, file: &str, after: &[u8]) -> PathBuf {
    let mut bytes = std::fs::read(root().join(file)).unwrap();
    let at = bytes
        .windows(after.len())
        .position(|w| w == after)
        .unwrap_or_else(|| panic!("{file} holds no {after:?}"))
        + after.len();
    bytes[at] = 0xff;
    let out = dir.join(Path::new(file).file_name().unwrap());
    std::fs::write(&out, bytes).unwrap();
    out
}

#[test]
fn a_dangerous_file_that_is_also_corrupt_is_still_reported_refused() {
    // Each file's pickle names the dangerous global, then breaks on the next byte: the scan
    // lists the global it saw and says where it stopped; the verdict is still `refused`.
    let dir = tempfile::tempdir().unwrap();
    for (file, global) in [
        ("tests/fixtures/hostile/os_system.pt", "posix.system"),
        ("tests/fixtures/hostile/os_system_legacy.pt", "posix.system"),
        ("tests/fixtures/hostile/os_system_tar.pt", "os.system"),
    ] {
        let name = global.split('.').nth(1).unwrap();
        let path = corrupt_after(dir.path(), file, format!("{name}\n").as_bytes());
        let path = path.to_str().unwrap();
        let out = torchport(&["inspect", path, "--security", "--json"]);
        assert_eq!(out.status.code(), Some(2), "{file}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let sec = &v["security"];
        assert_eq!(sec["verdict"], "refused", "{file}: {v}");
        assert!(
            listed(sec).contains(&format!("{global} dangerous")),
            "{file}: {v}"
        );
        let problems = sec["problems"].as_array().unwrap();
        assert_eq!(problems.len(), 1, "{file}: {v}");
        assert!(
            problems[0]
                .as_str()
                .unwrap()
                .contains("0xff is not a pickle opcode"),
            "{file}: {v}"
        );

        let out = torchport(&["inspect", path, "--security"]);
        let stdout = text(&out.stdout);
        assert!(
            stdout.contains("security: REFUSED: 1 dangerous"),
            "{stdout}"
        );
        assert!(stdout.contains("  not scanned past: "), "{stdout}");
    }
}

#[test]
fn a_harmless_file_with_a_corrupt_pickle_is_incomplete_not_ok() {
    // The pickle breaks right after its first global: what was seen is listed, the verdict
    // says the scan is incomplete, and the open error still exits 2.
    let dir = tempfile::tempdir().unwrap();
    let file = "tests/fixtures/torch_save/lstm_linear.pt";
    let path = corrupt_after(dir.path(), file, b"OrderedDict\n");
    let out = torchport(&["inspect", path.to_str().unwrap(), "--security", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let sec = &v["security"];
    assert_eq!(sec["verdict"], "incomplete", "{v}");
    assert_eq!(listed(sec), ["collections.OrderedDict known-safe"], "{v}");
    assert_eq!(sec["problems"].as_array().unwrap().len(), 1, "{v}");
    let err = text(&out.stderr);
    assert!(err.contains("0xff is not a pickle opcode"), "{err}");
}

#[test]
fn gadget_fixtures_are_never_ok_and_dangerous_ones_are_refused_by_every_command() {
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(root().join("tests/fixtures/gadgets/manifest.json")).unwrap(),
    )
    .unwrap();
    let manifest = manifest.as_object().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (mut dangerous, mut unlisted) = (0, 0);
    for (name, entry) in manifest {
        let file = format!("tests/fixtures/gadgets/{name}");
        let global = entry["global"].as_str().unwrap();
        let class = entry["class"].as_str().unwrap();
        let out = torchport(&["inspect", &file, "--security", "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let sec = &v["security"];
        assert!(
            listed(sec).contains(&format!("{global} {class}")),
            "{file}: {v}"
        );
        let converted = dir.path().join(format!("{name}.safetensors"));
        let convert = torchport(&["convert", &file, converted.to_str().unwrap()]);
        match class {
            "dangerous" => {
                assert_eq!(sec["verdict"], "refused", "{file}");
                for out in [&out, &convert] {
                    assert_eq!(out.status.code(), Some(2), "{file}");
                    let err = text(&out.stderr);
                    assert!(
                        err.contains("refusing global")
                            && err.contains(global.rsplit('.').next().unwrap()),
                        "{file}: {err}"
                    );
                }
                assert!(!converted.exists(), "{file}");
                dangerous += 1;
            }
            "unlisted" => {
                assert_eq!(sec["verdict"], "unsafe-for-torch-load", "{file}");
                let out = torchport(&["inspect", &file, "--security"]);
                assert!(
                    text(&out.stdout).contains("security: UNSAFE FOR torch.load: 1 global(s)"),
                    "{file}: {}",
                    text(&out.stdout)
                );
                unlisted += 1;
            }
            other => panic!("{file}: class {other}"),
        }
    }
    // 12 gadgets of the outer pickle, and one hidden in a nested torch.save file
    // (load_from_bytes_dangerous.pt); own_class.pt and five load_from_bytes*.pt.
    assert_eq!((dangerous, unlisted), (13, 6));
}
