//! What the `pt2_program` fuzz target does with its input — shared by the fuzz crate
//! (`fuzz/src/lib.rs` includes this file) and `tests/regressions.rs`, so a committed crashing
//! input runs through exactly the code path its target found it on.
//!
//! The input is a program's JSON (`<root>/models/model.json`): it is parsed with the runtime's
//! schema, given a zero tensor for every weight its signature names (shape and dtype from the
//! graph's own metadata), and built into a [`Program`] — every check a program gets before it
//! runs. Running is left out: a program may legitimately ask for any amount of memory.
#![allow(dead_code)]

use std::collections::HashMap;

use torchport_runtime::candle_core::{Device, Tensor};
use torchport_runtime::schema;
use torchport_runtime::{dtype, Program};

/// Largest weight the target makes (elements); a larger one is left out, which the program
/// then reports as missing.
const MAX_WEIGHT: usize = 1 << 16;

/// Parse and build the program; true when it built.
pub fn pt2_program(json: &[u8]) -> bool {
    let Ok(ep) = schema::parse_program(json) else {
        return false;
    };
    let g = &ep.graph_module.graph;
    let mut payloads = HashMap::new();
    for spec in &ep.graph_module.signature.input_specs {
        let Some((arg, fqn)) = spec.weight() else {
            continue;
        };
        let Some(meta) = g.tensor_values.get(&arg.name) else {
            continue;
        };
        let Some(sizes) = meta.static_sizes() else {
            continue;
        };
        let Ok(shape) = sizes
            .iter()
            .map(|&s| usize::try_from(s))
            .collect::<Result<Vec<usize>, _>>()
        else {
            continue;
        };
        let numel = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if numel.is_none_or(|n| n > MAX_WEIGHT) {
            continue;
        }
        let Ok(dt) = dtype::runtime(meta.dtype) else {
            continue;
        };
        let t = Tensor::zeros(shape, dt, &Device::Cpu).unwrap();
        payloads.insert(fqn.to_string(), t);
    }
    match Program::from_parts(ep, payloads) {
        Ok(p) => {
            let _ = (p.inputs().len(), p.ops().len(), p.unsupported_ops().len());
            let _ = p.output_dtypes();
            true
        }
        Err(e) => {
            assert!(!e.to_string().contains('\n'), "one line: {e}");
            false
        }
    }
}
