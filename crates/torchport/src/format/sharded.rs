//! Sharded checkpoints: an index file (`model.safetensors.index.json`,
//! `pytorch_model.bin.index.json`, as transformers' `save_pretrained` writes them)
//! `{"metadata": {...}, "weight_map": {"tensor name": "shard file", ...}}` next to its shards.
//!
//! Every shard is opened through torchport's own readers (any format but another index),
//! one after the other: each is memory-mapped and only its header or pickles are read;
//! tensor data stays in the maps until asked for. Tensors are those the weight_map lists:
//! shards in the order they first appear in the weight_map, and within a shard in
//! weight_map order; tensors a shard holds but the weight_map does not list are left out.
//! Each listed tensor must be in its shard. Shard paths must be relative and stay inside
//! the index's folder (no `..`, no absolute paths; symbolic links inside the folder are
//! followed, as in a Hugging Face cache). Index `metadata` entries become values named
//! `metadata.<key>`.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Component, Path};

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::Value as Json;

use crate::error::{Error, Result};
use crate::format::kind::Format;
use crate::format::parts::Found;
use crate::format::parts::Parts;
use crate::limits::Limits;
use crate::storage::FileBytes;
use crate::tensor::{ByteOrder, TensorData};
use crate::value::Value;

/// True when the bytes look like a sharded index: a JSON object (after leading whitespace)
/// that mentions `"weight_map"`.
pub(crate) fn looks_like(bytes: &[u8]) -> bool {
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    let start = bytes.iter().position(|b| !b.is_ascii_whitespace());
    start.and_then(|i| bytes.get(i)) == Some(&b'{')
        && bytes.windows(12).any(|w| w == b"\"weight_map\"")
}

/// The index file's content.
#[derive(Deserialize)]
struct Index {
    #[serde(default)]
    metadata: Option<Json>,
    weight_map: Ordered,
}

/// A JSON object's entries in file order (serde_json's own map sorts its keys).
struct Ordered(Vec<(String, Json)>);

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Ordered;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object mapping tensor names to shard files")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<Ordered, A::Error> {
                let mut v = Vec::new();
                while let Some(entry) = m.next_entry::<String, Json>()? {
                    v.push(entry);
                }
                Ok(Ordered(v))
            }
        }
        d.deserialize_map(V)
    }
}

/// True when a shard path stays inside the index's folder.
fn inside(shard: &str) -> bool {
    let p = Path::new(shard);
    p.components().any(|c| matches!(c, Component::Normal(_)))
        && p.components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

/// How a shard is read: its path and bytes, with the limits, into its parts (detection and
/// every other format's reader are the caller's, so this file does not depend on them).
pub(crate) type ReadShard = fn(&Path, &FileBytes, &Limits) -> Result<Parts>;

/// Read the index at `path`; `on_disk`: the bytes are that file, so its shards are looked
/// for in its folder. An index read from memory has no folder, and is refused rather than
/// resolved against the working directory. Each shard is read with `read_shard`, after a
/// check that it is not an index itself.
pub(crate) fn read(
    path: &Path,
    file: &FileBytes,
    limits: &Limits,
    on_disk: bool,
    read_shard: ReadShard,
) -> Result<Parts> {
    let bytes = file.as_slice();
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    let index: Index = serde_json::from_slice(bytes).map_err(|e| {
        Error::corrupt(
            path,
            format!(
                "the sharded index is not JSON of the form {{\"metadata\": {{...}}, \
                 \"weight_map\": {{\"tensor\": \"shard file\"}}}}: {e}"
            ),
        )
    })?;
    let listed = index.weight_map.0;
    if listed.len() > limits.max_tensors {
        return Err(Error::Limit {
            path: path.to_path_buf(),
            what: format!("{} tensors in the weight_map", listed.len()),
            limit: limits.max_tensors as u64,
            field: "max_tensors",
        });
    }
    // Group the names by shard, shards in first-appearance order.
    let mut shards: Vec<(String, Vec<String>)> = Vec::new();
    let mut shard_index: HashMap<String, usize> = HashMap::new();
    let mut seen: HashSet<String> = HashSet::with_capacity(listed.len());
    for (name, shard) in listed {
        let Json::String(shard) = shard else {
            return Err(Error::corrupt(
                path,
                format!("the weight_map entry for tensor {name} is not a file name"),
            ));
        };
        if !seen.insert(name.clone()) {
            return Err(Error::corrupt(
                path,
                format!("tensor {name} is listed twice in the weight_map"),
            ));
        }
        if !inside(&shard) {
            return Err(Error::corrupt(
                path,
                format!(
                    "tensor {name} is mapped to shard {shard:?}, which is not inside the \
                     index's folder; only relative paths without `..` are followed"
                ),
            ));
        }
        let i = *shard_index.entry(shard.clone()).or_insert_with(|| {
            shards.push((shard, Vec::new()));
            shards.len() - 1
        });
        shards[i].1.push(name);
    }

    if !on_disk && !shards.is_empty() {
        return Err(Error::corrupt(
            path,
            "is a sharded index read from memory: its shards are files beside the index, \
             so open the index by its path instead",
        ));
    }
    let dir = path.parent().unwrap_or(Path::new(""));
    let mut found = Found::default();
    if let Some(meta) = &index.metadata {
        json_values("metadata", meta, &mut found.values);
    }
    let mut storages = Vec::new();
    let mut globals: Vec<(String, String)> = Vec::new();
    let mut all_big = !shards.is_empty();
    for (shard, names) in shards {
        let shard_err = |source: Error| Error::Shard {
            path: path.to_path_buf(),
            shard: shard.clone(),
            source: Box::new(source),
        };
        let shard_path = dir.join(&shard);
        let shard_file = FileBytes::open(&shard_path).map_err(shard_err)?;
        // Refused before it is read: an index listing itself (or another index) as a shard
        // would otherwise be opened again and again.
        if looks_like(shard_file.as_slice()) {
            return Err(shard_err(Error::corrupt(
                &shard_path,
                "is itself a sharded index; shards must hold tensors",
            )));
        }
        let ck = read_shard(&shard_path, &shard_file, limits).map_err(shard_err)?;
        all_big &= ck.order == ByteOrder::Big;
        let base = storages.len();
        // The first tensor of each name, as `Checkpoint::tensor` finds it.
        let mut by_name = std::collections::HashMap::with_capacity(ck.found.tensors.len());
        for t in &ck.found.tensors {
            by_name.entry(t.name.as_str()).or_insert(t);
        }
        for name in names {
            let mut t = by_name
                .get(name.as_str())
                .map(|t| (*t).clone())
                .ok_or_else(|| {
                    Error::corrupt(
                        path,
                        format!(
                            "tensor {name} is listed in shard {shard}, but that shard holds no \
                         tensor of that name"
                        ),
                    )
                })?;
            if let TensorData::Strided { storage } = &mut t.data {
                *storage += base;
            }
            found.tensors.push(t);
        }
        for g in ck.globals {
            if !globals.contains(&g) {
                globals.push(g);
            }
        }
        storages.extend(ck.storages);
    }
    let order = if all_big {
        ByteOrder::Big
    } else {
        ByteOrder::Little
    };
    Ok(Parts::new(Format::Sharded, order, found, globals, storages))
}

/// Flatten a JSON value into named values (key paths joined with `.`, list items by index).
fn json_values(name: &str, v: &Json, out: &mut Vec<(String, Value)>) {
    let join = |k: &str| format!("{name}.{k}");
    let leaf = match v {
        Json::Null => Value::None,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Value::Int(i),
            (None, _) if n.is_u64() => Value::BigInt(n.to_string()),
            (None, Some(f)) => Value::Float(f),
            (None, None) => Value::BigInt(n.to_string()),
        },
        Json::String(s) => Value::Str(s.clone()),
        Json::Array(items) if items.is_empty() => Value::Empty("[]"),
        Json::Object(map) if map.is_empty() => Value::Empty("{}"),
        Json::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                json_values(&join(&i.to_string()), item, out);
            }
            return;
        }
        Json::Object(map) => {
            for (k, item) in map {
                json_values(&join(k), item, out);
            }
            return;
        }
    };
    out.push((name.to_string(), leaf));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_in_memory_never_reads_the_disk() {
        // The shard exists relative to the working directory of `cargo test` (the crate
        // folder): it must not be opened all the same.
        let index = br#"{"weight_map": {"a": "Cargo.toml"}}"#.to_vec();
        let err = crate::open_bytes("index.json", index, &Limits::default()).unwrap_err();
        assert!(err.to_string().contains("read from memory"), "{err}");
        let empty = br#"{"metadata": {"total_size": 0}, "weight_map": {}}"#.to_vec();
        let ck = crate::open_bytes("index.json", empty, &Limits::default()).unwrap();
        assert!(ck.tensors().is_empty());
        assert_eq!(ck.values().len(), 1);
    }

    #[test]
    fn shard_paths() {
        assert!(inside("model-00001-of-00002.safetensors"));
        assert!(inside("sub/dir/shard.bin"));
        assert!(inside("./shard.bin"));
        assert!(!inside("../escape.safetensors"));
        assert!(!inside("sub/../../x"));
        assert!(!inside("/etc/passwd"));
        assert!(!inside(""));
        assert!(!inside("."));
    }

    #[test]
    fn detection() {
        assert!(looks_like(b"  {\"metadata\": {}, \"weight_map\": {}}"));
        assert!(!looks_like(b"[\"weight_map\"]"));
        assert!(!looks_like(b"{\"a\": 1}"));
    }

    #[test]
    fn weight_map_keeps_file_order() {
        let idx: Index =
            serde_json::from_str(r#"{"weight_map": {"z": "a", "b": "c", "m": "a"}}"#).unwrap();
        let names: Vec<&str> = idx.weight_map.0.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["z", "b", "m"]);
    }
}
