//! float64 programs computed in float64: real library models converted with `.double()`
//! (torchvision's MobileNetV3-Small, transformers' BERT; tests/fixtures/gen/gen_f64.py), and
//! torch's type promotion over mixed float32 / float64 / int64 / 0-d operands (`promotion`),
//! exported plain and after run_decompositions() and traced to TorchScript, run here on the
//! inputs PyTorch used. Every output must come back in torch's dtype (F64 for float64), float64
//! ones within 1e-10 × max(1, max |ref|) of PyTorch's own outputs, a bound that a computation
//! in f32 (about 1e-7 relative per operation) does not meet; float32 ones within 1e-6.

use std::path::PathBuf;

use torchport_runtime::candle_core::{DType, Tensor};
use torchport_runtime::{Program, ScriptProgram};

#[path = "common/compare.rs"]
#[allow(dead_code)]
mod compare;
use compare::{numbered, output_mismatches};

/// Every model gen_f64.py writes; the test fails if one is missing.
const MODELS: [&str; 3] = ["tv_mobilenet_v3_small", "hf_bert_mask", "promotion"];

/// The tolerance for float64 outputs, relative to max(1, max |ref|).
const REL: f64 = 1e-10;

/// The tolerance for float32 outputs (the promotion rules that give float32).
const REL_F32: f64 = 1e-6;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/f64")
}

/// Compare one run's outputs with torch's, dtypes first; a failure description per problem.
fn check(name: &str, got: &[Tensor], want: &[Tensor], failures: &mut Vec<String>) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if g.dtype() != w.dtype() {
            failures.push(format!(
                "{name}: output {i} is {:?}, torch {:?}",
                g.dtype(),
                w.dtype()
            ));
        }
    }
    failures.extend(output_mismatches(name, got, want, |w| {
        if w.dtype() == DType::F64 {
            REL
        } else {
            REL_F32
        }
    }));
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
