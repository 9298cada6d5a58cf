//! float64 programs computed in float64: real library models converted with `.double()`
//! (torchvision's MobileNetV3-Small, transformers' BERT; tests/fixtures/gen/gen_f64.py),
//! exported plain and after run_decompositions() and traced to TorchScript, run here on the
//! inputs PyTorch used. Every output must come back as F64 and within
//! 1e-10 × max(1, max |ref|) of PyTorch's own float64 outputs, a bound that a computation in
//! f32 (about 1e-7 relative per operation) does not meet.

use std::path::PathBuf;

use torchport_runtime::candle_core::{DType, Tensor};
use torchport_runtime::{Program, ScriptProgram};

#[path = "common/compare.rs"]
#[allow(dead_code)]
mod compare;
use compare::{mismatch_within, numbered};

/// Every model gen_f64.py writes; the test fails if one is missing.
const MODELS: [&str; 2] = ["tv_mobilenet_v3_small", "hf_bert_mask"];

/// The tolerance relative to max(1, max |ref|).
const REL: f64 = 1e-10;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/f64")
}

/// Compare one run's outputs with torch's; a failure description per problem.
fn check(name: &str, got: &[Tensor], want: &[Tensor], failures: &mut Vec<String>) {
    if got.len() != want.len() {
        failures.push(format!(
            "{name}: {} outputs, torch {}",
            got.len(),
            want.len()
        ));
        return;
    }
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            w.dtype(),
            DType::F64,
            "{name}: reference {i} is not float64"
        );
        if g.dtype() != DType::F64 {
            failures.push(format!("{name}: output {i} is {:?}, not F64", g.dtype()));
            continue;
        }
        if let Some(m) = mismatch_within(g, w, REL) {
            failures.push(format!("{name}: output {i}: {m}"));
        }
    }
}

#[test]
fn float64_models_match_pytorch_in_float64() {
    let mut failures = Vec::new();
    let mut ran = 0;
    for model in MODELS {
        let inputs = numbered(&fixtures(), model, "input");
        let want = numbered(&fixtures(), model, "output");
        assert!(
            !inputs.is_empty() && !want.is_empty(),
            "{model}: fixtures missing"
        );
        for flavour in ["plain", "decomp"] {
            let name = format!("{model}.{flavour}");
            eprintln!("{name}");
            match Program::load(fixtures().join(format!("{name}.pt2"))).and_then(|p| p.run(&inputs))
            {
                Ok(got) => {
                    ran += 1;
                    check(&name, &got, &want, &mut failures);
                }
                Err(e) => failures.push(format!("{name}: {e}")),
            }
        }
        let name = format!("{model}.ts");
        eprintln!("{name}");
        match ScriptProgram::load(fixtures().join(format!("{name}.pt")))
            .and_then(|p| p.run(&inputs))
        {
            Ok(got) => {
                ran += 1;
                check(&name, &got, &want, &mut failures);
            }
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(ran, 3 * MODELS.len());
}
