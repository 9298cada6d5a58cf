//! The few parts of a `.pt2` archive's JSON records that torchport reads, as typed serde
//! structs (everything else in the records is skipped while parsing, never kept): the
//! payload configs of `data/weights` / `data/constants` (in file order) and the targets of
//! the top-level graph's nodes in `models/<name>.json`.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;

/// `data/weights/<model>_weights_config.json` and `data/constants/<model>_constants_config.json`.
#[derive(Deserialize)]
pub(crate) struct PayloadConfig {
    /// FQN → where and how its payload is stored, in the file's order.
    pub config: Ordered<PayloadMeta>,
}

/// One entry of a payload config.
#[derive(Deserialize)]
pub(crate) struct PayloadMeta {
    /// The record's name inside the payload directory (`weight_0`, `tensor_0`, `custom_obj_0`).
    pub path_name: String,
    /// The record is a `torch.save` archive of the tensor (tensor subclasses), not raw bytes.
    #[serde(default)]
    pub use_pickle: bool,
    /// dtype, sizes, strides, offset; absent for script objects.
    pub tensor_meta: Option<TensorMeta>,
}

/// `torch._export.serde.schema.TensorMeta`.
#[derive(Deserialize)]
pub(crate) struct TensorMeta {
    /// A `ScalarType` number.
    pub dtype: i64,
    pub sizes: Vec<SymInt>,
    #[serde(default)]
    pub requires_grad: bool,
    pub strides: Vec<SymInt>,
    pub storage_offset: SymInt,
    /// A `Layout` number; 7 is strided.
    pub layout: i64,
}

/// A size that is a plain integer (`{"as_int": 4}`) or a symbolic expression.
#[derive(Deserialize)]
pub(crate) struct SymInt {
    pub as_int: Option<i64>,
}

/// `models/<name>.json` (and the older `serialized_exported_program.json`), reduced to the
/// targets of the top-level graph's nodes. This is a lenient view of the typed IR
/// ([`crate::pt2::ExportedProgram`]): it reads no version and no arguments, so that `inspect`
/// still counts the operators of programs the IR refuses (another schema major version, a
/// union member added by a newer torch).
#[derive(Deserialize)]
pub(crate) struct Program {
    pub graph_module: GraphModule,
}

/// The graph module of an exported program.
#[derive(Deserialize)]
pub(crate) struct GraphModule {
    pub graph: Graph,
}

/// A graph: only its nodes' targets are kept.
#[derive(Deserialize)]
pub(crate) struct Graph {
    #[serde(default)]
    pub nodes: Vec<Node>,
}

/// A node: only its target is kept (`torch.ops.aten.conv2d.default`, `_operator.getitem`).
#[derive(Deserialize)]
pub(crate) struct Node {
    pub target: String,
}

/// A JSON object read as `(key, value)` pairs in the file's order; a repeated key keeps its
/// first position and its last value, as Python's `json` module does.
pub(crate) struct Ordered<T>(pub Vec<(String, T)>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Ordered<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Ordered<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out: Vec<(String, T)> = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some(entry) = map.next_entry::<String, T>()? {
                    out.push(entry);
                }
                Ok(Ordered(first_places(out)))
            }
        }
        d.deserialize_map(V(PhantomData))
    }
}

/// `entries` with each repeated key kept once, at its first position, with its last value.
/// Repeated keys are found by sorting the positions by key (no map of copied keys: a weights
/// config has one entry per tensor, hundreds of them).
fn first_places<T>(entries: Vec<(String, T)>) -> Vec<(String, T)> {
    let mut order: Vec<usize> = (0..entries.len()).collect();
    // Stable: equal keys stay in file order, the first of each run its first position.
    order.sort_by(|&a, &b| entries[a].0.cmp(&entries[b].0));
    let mut place = vec![0; entries.len()];
    for run in order.chunk_by(|&a, &b| entries[a].0 == entries[b].0) {
        for &i in run {
            place[i] = run[0];
        }
    }
    // In file order, so that a later entry of a key replaces an earlier one.
    let mut out: Vec<Option<(String, T)>> = (0..entries.len()).map(|_| None).collect();
    for (entry, &at) in entries.into_iter().zip(&place) {
        out[at] = Some(entry);
    }
    out.into_iter().flatten().collect()
}

/// The name of a `Layout` number other than strided (7).
pub(crate) fn layout_name(n: i64) -> &'static str {
    match n {
        1 => "sparse_coo",
        2 => "sparse_csr",
        3 => "sparse_csc",
        4 => "sparse_bsr",
        5 => "sparse_bsc",
        6 => "mkldnn",
        _ => "unknown-layout",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order() {
        let c: PayloadConfig = serde_json::from_str(
            r#"{"config": {"z": {"path_name": "weight_1", "tensor_meta": null},
                           "a": {"path_name": "weight_0", "use_pickle": true, "tensor_meta": null},
                           "z": {"path_name": "weight_2", "tensor_meta": null}}}"#,
        )
        .unwrap();
        let names: Vec<_> = c
            .config
            .0
            .iter()
            .map(|(k, m)| (k.as_str(), m.path_name.as_str()))
            .collect();
        assert_eq!(names, [("z", "weight_2"), ("a", "weight_0")]);
        assert!(c.config.0[1].1.use_pickle);
    }

    #[test]
    fn repeated_keys_keep_their_first_place_and_last_value() {
        type Pairs = &'static [(&'static str, i32)];
        let entries = |pairs: Pairs| -> Vec<(String, i32)> {
            pairs.iter().map(|&(k, v)| (k.to_string(), v)).collect()
        };
        // As Python's json.loads builds its dict.
        let cases: [(Pairs, Pairs); 4] = [
            (
                &[("b", 1), ("a", 2), ("c", 3)],
                &[("b", 1), ("a", 2), ("c", 3)],
            ),
            (&[("b", 1), ("a", 2), ("b", 3)], &[("b", 3), ("a", 2)]),
            (
                &[("a", 1), ("a", 2), ("a", 3), ("c", 4)],
                &[("a", 3), ("c", 4)],
            ),
            (
                &[("x", 1), ("y", 2), ("y", 3), ("x", 4), ("z", 5)],
                &[("x", 4), ("y", 3), ("z", 5)],
            ),
        ];
        for (given, want) in cases {
            assert_eq!(first_places(entries(given)), entries(want), "{given:?}");
        }
    }
}
