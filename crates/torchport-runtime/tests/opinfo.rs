//! Operator conformance on PyTorch's own test inputs (tests/fixtures/opinfo/, written by
//! `benches/opinfo.py --fixtures`): for each registered overload that an OpInfo sample of
//! torch's `op_db` reaches, one single-op program exported by torch, run on the sample's
//! tensors and compared with torch's eager result: floats within 1e-4 × max(1, max |ref|)
//! (NaN where torch has NaN), integer and bool outputs equal. The full table, with the
//! samples that fail, is in docs/RUNTIME.md ("Operator conformance").

use std::path::PathBuf;

use torchport_runtime::Program;

#[path = "common/compare.rs"]
mod compare;
use compare::{numbered, output_mismatches};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/opinfo")
}

#[test]
fn every_fixture_matches_torch() {
    let mut stems: Vec<String> = std::fs::read_dir(dir())
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".pt2").map(str::to_string)
        })
        .collect();
    stems.sort();
    assert!(stems.len() >= 100, "only {} fixtures", stems.len());
    let mut failures = Vec::new();
    for stem in &stems {
        let program = Program::load(dir().join(format!("{stem}.pt2")))
            .unwrap_or_else(|e| panic!("{stem}: {e}"));
        let want = numbered(&dir(), stem, "output");
        let got = match program.run(&numbered(&dir(), stem, "input")) {
            Ok(g) => g,
            Err(e) => {
                failures.push(format!("{stem}: {e}"));
                continue;
            }
        };
        failures.extend(output_mismatches(stem, &got, &want, |_| 1e-4));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
