//! Every input the `pt2_program` fuzz target ever crashed or hung on, committed under
//! `tests/fixtures/regressions/pt2_program/`, runs through exactly that target's code path
//! (`common/program_target.rs`, shared with the fuzz crate): never a panic. The folder must
//! exist (it holds a README until the fuzzer finds something); the seeds (each fixture's
//! program JSON) run too, so the test never passes having run nothing.

mod common {
    pub mod program_target;
}

use std::path::Path;

use common::program_target::pt2_program;

#[test]
fn every_regression_input_and_every_fixture_program_runs_cleanly() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let mut built = 0;
    let mut total = 0;
    let regressions = root.join("regressions/pt2_program");
    let dir = std::fs::read_dir(&regressions)
        .unwrap_or_else(|e| panic!("{}: {e}", regressions.display()));
    for e in dir {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            continue;
        }
        pt2_program(&std::fs::read(&p).unwrap());
        total += 1;
    }
    // The program JSON of every plain export fixture builds: the target is not vacuous.
    for e in std::fs::read_dir(root.join("export")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with(".plain.pt2") {
            continue;
        }
        let ckpt = torchport::open(&p).unwrap();
        let (_, json) = ckpt.programs().next().unwrap();
        assert!(pt2_program(json), "{name}: its program did not build");
        built += 1;
        total += 1;
    }
    println!("{total} inputs, {built} fixture programs built");
    assert!(built >= 16, "{built} fixture programs");
}
