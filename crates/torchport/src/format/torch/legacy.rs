//! The legacy `torch.save` stream (before PyTorch 1.6, and `_use_new_zipfile_serialization=False`):
//! five pickles back to back — magic number, protocol version (1001), sys_info, the object,
//! the list of storage keys — then, for each key in that order, an int64 element count and
//! the storage's raw bytes. Persistent ids are
//! `('storage', <StorageClass>, root_key, location, numel, view_metadata)` where
//! `view_metadata` is `None` or `(view_key, offset, size)` in elements, and
//! `('module', <class>, source_file, source)` for pickled module classes.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use torchport_pickle::{NodeId, Pickle, Value as PValue};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::format::kind::Format;
use crate::format::parts::{GlobalList, Parts, PickleGlobals};
use crate::format::torch::interpret::{interpret, Persistent, Resolver};
use crate::limits::Limits;
use crate::storage::{FileBytes, Storage};
use crate::tensor::ByteOrder;

/// The magic number 0x1950a86a20f9469cfc6c as pickle's LONG1 payload (little-endian).
const MAGIC: [u8; 10] = [0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19];
const PROTOCOL_VERSION: i64 = 1001;

/// True when the bytes start with the legacy magic number pickle (protocol 2, LONG1).
pub(crate) fn looks_like(bytes: &[u8]) -> bool {
    // PROTO 2, LONG1 10, magic — the only way torch ever wrote it.
    bytes.len() >= 14 && bytes[..4] == [0x80, 0x02, 0x8a, 0x0a] && bytes[4..14] == MAGIC
}

/// The pickles at the head of the stream, in order.
const PICKLES: [&str; 5] = [
    "magic number",
    "protocol version",
    "sys_info",
    "main",
    "storage keys",
];

/// Run the pickles named `names` back to back from byte `pos`; the pickles and the offset
/// just past the last.
fn run_pickles(
    path: &Path,
    bytes: &[u8],
    limits: &Limits,
    mut pos: usize,
    names: &[&str],
) -> Result<(Vec<Pickle>, usize)> {
    let mut out = Vec::with_capacity(names.len());
    for what in names {
        let rest = bytes.get(pos..).unwrap_or_default();
        let (p, used) =
            torchport_pickle::parse_prefix(rest, &limits.pickle).map_err(|mut source| {
                source.offset += pos as u64;
                Error::Pickle {
                    path: path.to_path_buf(),
                    record: format!("the {what} pickle"),
                    source,
                }
            })?;
        pos += used;
        out.push(p);
    }
    Ok((out, pos))
}

/// Every global the stream's five pickles reference, in first-seen order, and how many
/// pickles were read (the security scan's view; nothing is interpreted). A pickle that fails
/// partway ends the scan (the next one's start is unknown), noted as a problem, with the
/// globals it referenced up to the failure. The files nested in the pickles through
/// `torch.storage._load_from_bytes` are scanned too; `depth` is this stream's own nesting.
pub(crate) fn pickle_globals(
    path: &Path,
    file: &FileBytes,
    limits: &Limits,
    depth: usize,
) -> Result<PickleGlobals> {
    let bytes = file.as_slice();
    let mut globals = GlobalList::default();
    let mut problems = Vec::new();
    let mut count = 0;
    let mut pos = 0;
    for what in PICKLES {
        let rest = bytes.get(pos..).unwrap_or_default();
        let (found, ended) = torchport_pickle::scan_globals(rest, &limits.pickle);
        globals.extend(&found);
        count += 1;
        match ended {
            Ok(used) => {
                let pickle = rest.get(..used).unwrap_or_default();
                let record = format!("the {what} pickle");
                let nested = crate::format::torch::nested::scan(
                    path, &record, pickle, &found, limits, depth,
                );
                count += nested.count;
                globals.extend(&nested.globals);
                problems.extend(nested.problems);
                pos += used;
            }
            Err(mut source) => {
                source.offset += pos as u64;
                let e = Error::Pickle {
                    path: path.to_path_buf(),
                    record: format!("the {what} pickle"),
                    source,
                };
                problems.push(e.to_string());
                break;
            }
        }
    }
    Ok(PickleGlobals {
        count,
        globals: globals.into_vec(),
        problems,
    })
}

pub(crate) fn read(path: &Path, file: &FileBytes, limits: &Limits) -> Result<Parts> {
    let mut stream = Stream::parse(path, file, limits)?;
    let found = interpret(
        path,
        &stream.main,
        &mut stream.resolver,
        stream.order,
        limits,
    )?;
    if let Some((_, what)) = stream.resolver.unread {
        return Err(Error::corrupt(path, what));
    }
    let mut globals = GlobalList::default();
    globals.extend(stream.main.globals());
    globals.extend(stream.sys_info.globals());
    Ok(Parts::new(
        Format::TorchLegacy,
        stream.order,
        found,
        globals.into_vec(),
        stream.resolver.storages,
    ))
}

/// The storage at the root of a legacy stream nested in another file's pickle (what
/// `torch.storage._load_from_bytes` reads), its dtype, and how many pickle nodes the
/// stream's pickles hold. Nothing in the stream is interpreted but its root persistent id:
/// a root that is anything else (another nested stream included) is an error.
pub(crate) fn nested_storage(
    path: &Path,
    file: &FileBytes,
    limits: &Limits,
) -> Result<(Storage, DType, usize)> {
    let mut stream = Stream::parse(path, file, limits)?;
    if let Some((_, what)) = stream.resolver.unread {
        return Err(Error::corrupt(path, what));
    }
    let nodes = stream.nodes;
    let (storage, dtype) =
        crate::format::torch::nested::root_storage(path, &stream.main, &mut stream.resolver)?;
    Ok((storage.with_order(stream.order), dtype, nodes))
}

/// A legacy stream with its pickles run and its storages located, not yet interpreted.
struct Stream {
    /// How many nodes the five pickles hold together.
    nodes: usize,
    sys_info: Pickle,
    main: Pickle,
    order: ByteOrder,
    resolver: LegacyResolver,
}

impl Stream {
    fn parse(path: &Path, file: &FileBytes, limits: &Limits) -> Result<Stream> {
        let bytes = file.as_slice();
        // The magic number and version are checked before the rest of the stream is run.
        let (head, pos) = run_pickles(path, bytes, limits, 0, &PICKLES[..2])?;
        let (Some(magic), Some(version)) = (head.first(), head.get(1)) else {
            return Err(Error::corrupt(path, "the legacy stream has no header"));
        };
        if !matches!(magic.get(magic.root()), PValue::BigInt(b) if b[..] == MAGIC) {
            return Err(Error::corrupt(path, "the legacy magic number is wrong"));
        }
        if version.as_int(version.root()) != Some(PROTOCOL_VERSION) {
            return Err(Error::corrupt(
                path,
                format!("the legacy protocol version is not {PROTOCOL_VERSION}"),
            ));
        }
        let (rest, mut pos) = run_pickles(path, bytes, limits, pos, &PICKLES[2..])?;
        let nodes = head.iter().chain(&rest).map(Pickle::len).sum();
        let Ok([sys_info, main, keys_pickle]) = <[Pickle; 3]>::try_from(rest) else {
            return Err(Error::corrupt(
                path,
                "the legacy stream has no storage key list",
            ));
        };
        let order = sys_info_order(&sys_info);
        let keys: Vec<String> = keys_pickle
            .as_tuple_or_list(keys_pickle.root())
            .ok_or_else(|| Error::corrupt(path, "the storage key list is not a list"))?
            .iter()
            .map(|&k| key_string(&keys_pickle, k))
            .collect::<Option<_>>()
            .ok_or_else(|| Error::corrupt(path, "a storage key is not a string"))?;

        // Which dtype each root storage holds comes from the persistent ids in the main pickle.
        let mut dtypes: HashMap<String, DType> = HashMap::new();
        for i in 0..main.len() {
            if let PValue::PersistentId(payload) = main.get(NodeId(i as u32)) {
                if let Ok(Id::Storage { dtype, root, .. }) = parse_id(&main, *payload) {
                    dtypes.entry(root).or_insert(dtype);
                }
            }
        }
        let mut storages = Vec::with_capacity(keys.len().min(1 << 16));
        let mut by_root = HashMap::new();
        // A storage the file cuts short (and every one after it) is not read; the tensors
        // that use it fail by name when they are reached, and the file fails in any case.
        let mut unread: Option<(HashSet<String>, String)> = None;
        for (i, key) in keys.iter().enumerate() {
            let dtype = *dtypes.get(key).ok_or_else(|| {
                Error::corrupt(
                    path,
                    format!(
                        "storage {key} is listed but no tensor uses it, so its element size is unknown"
                    ),
                )
            })?;
            match read_storage(file, pos, key, dtype, order) {
                Ok((storage, next)) => {
                    by_root.insert(key.clone(), storages.len());
                    storages.push(storage);
                    pos = next;
                }
                Err(what) => {
                    let rest = keys.get(i..).unwrap_or_default().iter().cloned().collect();
                    unread = Some((rest, what));
                    break;
                }
            }
        }
        let resolver = LegacyResolver {
            storages,
            by_root,
            views: HashMap::new(),
            unread,
            file_len: bytes.len(),
        };
        Ok(Stream {
            nodes,
            sys_info,
            main,
            order,
            resolver,
        })
    }
}

/// One storage record at byte `pos`: an int64 element count, then the bytes. The storage
/// and the offset after it, or what is wrong, naming the storage and the byte offset.
fn read_storage(
    file: &FileBytes,
    pos: usize,
    key: &str,
    dtype: DType,
    order: ByteOrder,
) -> Result<(Storage, usize), String> {
    let len = file.as_slice().len();
    let header = file
        .as_slice()
        .get(pos..pos.saturating_add(8))
        .ok_or_else(|| {
            format!("the file ends at byte {len} before storage {key}'s size (at byte {pos})")
        })?;
    let raw: [u8; 8] = header.try_into().unwrap_or_default();
    let numel = match order {
        ByteOrder::Little => i64::from_le_bytes(raw),
        ByteOrder::Big => i64::from_be_bytes(raw),
    };
    let nbytes = usize::try_from(numel)
        .ok()
        .and_then(|n| n.checked_mul(dtype.size()))
        .ok_or_else(|| format!("storage {key} at byte {pos} declares {numel} elements"))?;
    let start = pos + 8;
    let end = start.checked_add(nbytes);
    let storage = end.and_then(|end| file.storage(start..end)).ok_or_else(|| {
        format!("storage {key} at byte {pos} declares {nbytes} bytes but the file ends at byte {len}")
    })?;
    Ok((storage, start + nbytes))
}

/// `sys_info["little_endian"]`: the byte order the file was written in.
fn sys_info_order(p: &Pickle) -> ByteOrder {
    if let PValue::Dict(items) = p.get(p.root()) {
        for &(k, v) in items {
            if p.as_str(k) == Some("little_endian") && p.as_int(v) == Some(0) {
                return ByteOrder::Big;
            }
        }
    }
    ByteOrder::Little
}

fn key_string(p: &Pickle, id: NodeId) -> Option<String> {
    match p.get(id) {
        PValue::Str(s) => Some(s.clone()),
        PValue::Bytes(b) => String::from_utf8(b.clone()).ok(),
        PValue::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

enum Id {
    Storage {
        dtype: DType,
        root: String,
        view: Option<(String, usize, usize)>,
    },
    Module(NodeId),
}

fn parse_id(p: &Pickle, payload: NodeId) -> Result<Id, String> {
    let parts = p
        .as_tuple_or_list(payload)
        .ok_or("its persistent id is not a tuple")?;
    match parts.first().and_then(|&k| key_string(p, k)).as_deref() {
        Some("module") => Ok(Id::Module(
            *parts.get(1).ok_or("its module id names no class")?,
        )),
        Some("storage") if parts.len() >= 6 => {
            let dtype = match p.get(parts[1]) {
                PValue::Global { name, .. } => {
                    DType::from_storage_class(name).ok_or_else(|| {
                        format!("its storage type {name} is not a torch storage class")
                    })?
                }
                _ => return Err("its storage type is not a class".into()),
            };
            let root = key_string(p, parts[2]).ok_or("its storage key is not a string")?;
            let view = match p.as_tuple_or_list(parts[5]) {
                Some([k, off, size]) => {
                    let num = |i: NodeId| p.as_int(i).and_then(|v| usize::try_from(v).ok());
                    Some((
                        key_string(p, *k).ok_or("its view key is not a string")?,
                        num(*off).ok_or("its view offset is not a non-negative integer")?,
                        num(*size).ok_or("its view size is not a non-negative integer")?,
                    ))
                }
                _ => None,
            };
            Ok(Id::Storage { dtype, root, view })
        }
        _ => Err("its persistent id is neither a storage nor a module".into()),
    }
}

struct LegacyResolver {
    storages: Vec<Storage>,
    by_root: HashMap<String, usize>,
    views: HashMap<String, usize>,
    /// The storages the file cuts short, and why.
    unread: Option<(HashSet<String>, String)>,
    file_len: usize,
}

impl Resolver for LegacyResolver {
    fn persistent(&mut self, p: &Pickle, payload: NodeId) -> Result<Persistent, String> {
        let (dtype, root, view) = match parse_id(p, payload)? {
            Id::Module(n) => return Ok(Persistent::Node(n)),
            Id::Storage { dtype, root, view } => (dtype, root, view),
        };
        let index = match (self.by_root.get(&root), &self.unread) {
            (Some(&i), _) => i,
            (None, Some((keys, what))) if keys.contains(&root) => {
                return Err(format!("its storage {root} cannot be read: {what}"))
            }
            (None, _) => {
                return Err(format!(
                    "its storage {root} is not among the file's storages"
                ))
            }
        };
        let Some((view_key, offset, size)) = view else {
            return Ok(Persistent::Storage { index, dtype });
        };
        if let Some(&v) = self.views.get(&view_key) {
            return Ok(Persistent::Storage { index: v, dtype });
        }
        let base = &self.storages[index];
        let es = dtype.size();
        let sub = offset
            .checked_mul(es)
            .zip(size.checked_mul(es))
            .and_then(|(s, n)| Some((s, s.checked_add(n)?)))
            .filter(|&(_, end)| end <= base.len())
            .and_then(|(s, end)| base.slice(s..end))
            .ok_or_else(|| format!("its storage view {view_key} (offset {offset}, {size} elements) reaches outside storage {root} ({} bytes)", base.len()))?;
        let v = self.storages.len();
        self.storages.push(sub);
        self.views.insert(view_key, v);
        Ok(Persistent::Storage { index: v, dtype })
    }

    fn storages(&self) -> &[Storage] {
        &self.storages
    }

    fn add_storage(&mut self, storage: Storage) -> usize {
        self.storages.push(storage);
        self.storages.len() - 1
    }

    fn file_len(&self) -> usize {
        self.file_len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_detection() {
        let mut head = vec![0x80, 0x02, 0x8a, 0x0a];
        head.extend_from_slice(&MAGIC);
        assert!(looks_like(&head));
        head[5] ^= 1;
        assert!(!looks_like(&head));
        assert!(!looks_like(b"\x80\x02"));
    }
}
