//! The dynamic dimensions of a program's user inputs: the symbol and exported range of each
//! (read once at load from the graph's tensor metadata and `range_constraints`), and the check
//! made before every run that each input's size is within its range and that dims sharing a
//! symbol agree across inputs.

use std::collections::HashMap;

use candle_core::Tensor;

use crate::error::{Error, Result};
use crate::program::InputInfo;
use crate::schema::{ExportedProgram, SymInt};

/// A dynamic dim of a user input: its symbol and the values it was exported for.
#[derive(Debug, Clone)]
pub(crate) struct DimRange {
    symbol: String,
    min: Option<i64>,
    max: Option<i64>,
}

/// The symbol and range of every dynamic user-input dim that is a single symbol.
pub(crate) fn dim_ranges(ep: &ExportedProgram, inputs: &[InputInfo]) -> Vec<Vec<Option<DimRange>>> {
    let tv = &ep.graph_module.graph.tensor_values;
    inputs
        .iter()
        .map(|info| {
            let Some(meta) = tv.get(&info.name) else {
                return Vec::new();
            };
            meta.sizes
                .iter()
                .map(|s| match s {
                    SymInt::AsExpr(e) => e.symbol().map(|sym| {
                        let (min, max) = ep
                            .range_constraints
                            .get(sym)
                            .map_or((None, None), |r| r.bounds());
                        DimRange {
                            symbol: sym.to_string(),
                            min,
                            max,
                        }
                    }),
                    SymInt::AsInt(_) => None,
                })
                .collect()
        })
        .collect()
}

/// Check the dynamic dims of the inputs: each within the range it was exported for, and one
/// value per symbol across all inputs.
pub(crate) fn check_dynamic_dims(
    inputs: &[Tensor],
    infos: &[InputInfo],
    ranges: &[Vec<Option<DimRange>>],
) -> Result<()> {
    let mut seen: HashMap<&str, (usize, usize, usize)> = HashMap::new();
    for (i, ((t, info), dims)) in inputs.iter().zip(infos).zip(ranges).enumerate() {
        for (d, r) in dims.iter().enumerate() {
            let (Some(r), Some(&v)) = (r, t.dims().get(d)) else {
                continue;
            };
            let vi = i64::try_from(v).unwrap_or(i64::MAX);
            if r.min.is_some_and(|m| vi < m) || r.max.is_some_and(|m| vi > m) {
                let bound = |b: Option<i64>| b.map_or("any".to_string(), |b| b.to_string());
                return Err(Error::Input {
                    index: i,
                    what: format!(
                        "'{}' dim {d} is {v}, but the program was exported for {}..={} \
                         (dynamic dim {})",
                        info.name,
                        bound(r.min),
                        bound(r.max),
                        r.symbol
                    ),
                });
            }
            match seen.get(r.symbol.as_str()) {
                Some(&(j, dj, w)) if w != v => {
                    return Err(Error::Input {
                        index: i,
                        what: format!(
                            "'{}' dim {d} is {v}, but input {j} dim {dj} is {w}: the program \
                             needs them equal (dynamic dim {})",
                            info.name, r.symbol
                        ),
                    })
                }
                Some(_) => {}
                None => {
                    seen.insert(r.symbol.as_str(), (i, d, v));
                }
            }
        }
    }
    Ok(())
}
