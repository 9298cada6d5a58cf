//! Every input a fuzz target ever crashed, hung or ran out of memory on, committed under
//! `tests/fixtures/regressions/<target>/`, runs through exactly that target's code path
//! (`common/targets.rs`, shared with the fuzz crate): it must come back as a clean `Err`
//! (or a clean `Ok` whose data reads back consistently) — never a panic. Inputs are only ever
//! added, so the test knows how many there are at least: a harness that found nothing to run
//! fails instead of passing.

mod common;

use std::path::Path;

use common::targets;

#[test]
fn every_regression_input_fails_cleanly() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/regressions");
    let mut count = 0;
    let mut targets_run = Vec::new();
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    for dir in dirs {
        let target = dir.file_name().unwrap().to_string_lossy().into_owned();
        if target == "pt2_program" {
            continue; // the runtime's target: crates/torchport-runtime/tests/regressions.rs
        }
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        assert!(
            !files.is_empty(),
            "{}: an empty target folder",
            dir.display()
        );
        targets_run.push(target.clone());
        for file in files {
            let bytes = std::fs::read(&file).unwrap();
            let opened = targets::run(&target, &bytes);
            println!(
                "{target}/{}: {}",
                file.file_name().unwrap().to_string_lossy(),
                if opened { "Ok" } else { "Err" }
            );
            count += 1;
        }
    }
    println!("{count} regression inputs");
    assert_eq!(
        targets_run,
        ["onnx", "open_bytes", "rules", "torch_tar"],
        "target folders run"
    );
    assert!(count >= 12, "only {count} regression inputs ran");
}
