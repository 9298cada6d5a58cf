//! What the `pt2_program` fuzz target does with its input — shared by the fuzz crate
//! (`fuzz/src/lib.rs` includes this file) and `tests/regressions.rs`, so a committed crashing
//! input runs through exactly the code path its target found it on.
//!
//! The input is a program's JSON (`<root>/models/model.json`): it is parsed with the runtime's
//! schema, given a zero tensor for every weight its signature names (shape and dtype from the
//! graph's own metadata), and built into a [`Program`] — every check a program gets before it
//! runs. A program that built is then run on zero inputs when it stays within a memory
//! budget: every tensor its metadata declares, every int argument and every int literal in
//! a size list at most [`MAX_RUN`] (dynamic dims get size 2). A program may legitimately ask
//! for any amount of memory, so those beyond the budget are only built.
#![allow(dead_code)]

use std::collections::HashMap;

use torchport_runtime::candle_core::{Device, Tensor};
use torchport_runtime::schema::{self, Argument, SymInt};
use torchport_runtime::{dtype, Program};

/// Largest weight the target makes (elements); a larger one is left out, which the program
/// then reports as missing.
const MAX_WEIGHT: usize = 1 << 16;

/// Largest element count of a value (and largest int argument) of a program the target runs.
const MAX_RUN: i64 = 1 << 12;

/// Parse and build the program, then run it when within budget; true when it built.
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
            if within_budget(p.exported_program()) {
                if let Some(inputs) = zero_inputs(&p) {
                    if let Err(e) = p.run(&inputs) {
                        assert!(!e.to_string().contains('\n'), "one line: {e}");
                    }
                }
            }
            true
        }
        Err(e) => {
            assert!(!e.to_string().contains('\n'), "one line: {e}");
            false
        }
    }
}

/// Whether every tensor the graph declares and every int it passes is at most [`MAX_RUN`].
fn within_budget(ep: &schema::ExportedProgram) -> bool {
    let g = &ep.graph_module.graph;
    let small = |v: i64| (0..=MAX_RUN).contains(&v.abs());
    let declared = g.tensor_values.values().all(|m| {
        m.sizes
            .iter()
            .try_fold(1i64, |n, s| match s {
                SymInt::AsInt(v) if small(*v) => n.checked_mul((*v).max(1)).filter(|&n| small(n)),
                SymInt::AsInt(_) => None,
                SymInt::AsExpr(_) => n.checked_mul(2).filter(|&n| small(n)),
            })
            .is_some()
    });
    let args = g
        .nodes
        .iter()
        .flat_map(|n| &n.inputs)
        .all(|a| match &a.arg {
            Argument::AsInt(v) => small(*v) || *v == i64::MAX || *v == i64::MIN,
            Argument::AsInts(v) => v.iter().all(|&v| small(v)),
            Argument::AsSymInts(v) => v.iter().all(|s| match s {
                schema::SymIntArgument::AsInt(v) => small(*v),
                schema::SymIntArgument::AsName(_) => true,
            }),
            _ => true,
        });
    declared && args
}

/// A zero tensor per user input, dynamic dims of size 2.
fn zero_inputs(p: &Program) -> Option<Vec<Tensor>> {
    p.inputs()
        .iter()
        .map(|info| {
            let shape: Vec<usize> = info
                .sizes
                .iter()
                .map(|s| usize::try_from(s.unwrap_or(2)).ok())
                .collect::<Option<_>>()?;
            let dt = dtype::runtime(info.dtype).ok()?;
            Tensor::zeros(shape, dt, &Device::Cpu).ok()
        })
        .collect()
}
