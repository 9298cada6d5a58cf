//! The `torch.save` tar format (PyTorch ≤ 0.1.x). Members:
//! - `storages`: pickle(count), then per storage pickle((key, location, StorageClass)),
//!   int64 element count (little-endian) and the raw bytes; then pickle(list of
//!   (view_key, root_key, offset, numel)) storage views.
//! - `tensors`: pickle(count), then per tensor pickle((key, storage_key, tensor_type)),
//!   int32 ndim, 4 padding bytes, ndim int64 sizes, ndim int64 strides, int64 storage offset.
//! - `pickle`: the object, whose persistent ids are tensor/storage keys (or tuples whose
//!   first item is a module class).
//! - `sys_info`: ignored.

use std::collections::HashMap;
use std::io::Cursor;
use std::ops::Range;
use std::path::Path;

use torchport_pickle::{NodeId, Pickle, Value as PValue};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::format::kind::Format;
use crate::format::parts::{GlobalList, Parts, PickleGlobals};
use crate::format::torch::interpret::{interpret, Persistent, Resolver};
use crate::limits::Limits;
use crate::storage::{FileBytes, Storage};
use crate::tensor::{check_view, ByteOrder, TensorData, TensorInfo};

/// Everything the tar's members hold, before the object pickle is interpreted.
struct Parsed {
    storages: Vec<Storage>,
    by_key: HashMap<String, (usize, DType)>,
    tensors: HashMap<String, TensorInfo>,
    main: Pickle,
    /// Every global of every pickle in the archive, first-seen order.
    globals: Vec<(String, String)>,
    /// How many pickles were run.
    pickles: usize,
}

pub(crate) fn read(path: &Path, file: &FileBytes, limits: &Limits) -> Result<Parts> {
    let parsed = parse(path, file, limits)?;
    let mut resolver = TarResolver {
        file_len: file.as_slice().len(),
        storages: parsed.storages,
        by_key: parsed.by_key,
        tensors: parsed.tensors,
    };
    let found = interpret(path, &parsed.main, &mut resolver, ByteOrder::Little, limits)?;
    Ok(Parts::new(
        Format::TorchTar,
        ByteOrder::Little,
        found,
        parsed.globals,
        resolver.storages,
    ))
}

/// Every global referenced by every pickle in the archive (storage and tensor records, the
/// object), first-seen order, and how many pickles were run: the security scan's view.
pub(crate) fn pickle_globals(
    path: &Path,
    file: &FileBytes,
    limits: &Limits,
) -> Result<PickleGlobals> {
    match parse(path, file, limits) {
        Ok(parsed) => Ok(PickleGlobals {
            count: parsed.pickles,
            globals: parsed.globals,
            problems: Vec::new(),
        }),
        Err(error) => {
            // Corrupt past the tar directory: the problem is noted, and the `pickle` member
            // (the saved object, where any code would be referenced) is scanned on its own.
            let bytes = file.as_slice();
            let mut problems = vec![error.to_string()];
            let main = members(path, bytes)?.get("pickle").cloned();
            let Some((start, main)) = main.and_then(|r| Some((r.start, bytes.get(r)?))) else {
                return Ok(PickleGlobals {
                    problems,
                    ..Default::default()
                });
            };
            let (globals, ended) = torchport_pickle::scan_globals(main, &limits.pickle);
            if let Err(mut source) = ended {
                source.offset += start as u64;
                let e = Error::Pickle {
                    path: path.to_path_buf(),
                    record: "tar member pickle".into(),
                    source,
                }
                .to_string();
                if !problems.contains(&e) {
                    problems.push(e);
                }
            }
            Ok(PickleGlobals {
                count: 1,
                globals,
                problems,
            })
        }
    }
}

fn parse(path: &Path, file: &FileBytes, limits: &Limits) -> Result<Parsed> {
    let bytes = file.as_slice();
    let members = members(path, bytes)?;
    let member = |name: &str| {
        members
            .get(name)
            .cloned()
            .ok_or_else(|| Error::MissingRecord {
                path: path.to_path_buf(),
                record: name.to_string(),
            })
    };
    let mut r = Reader {
        path,
        file,
        limits,
        pos: 0,
        end: 0,
        member: "",
        globals: GlobalList::default(),
        pickles: 0,
    };

    // storages
    r.enter("storages", member("storages")?);
    let count = r.count()?;
    let mut storages: Vec<Storage> = Vec::new();
    let mut by_key: HashMap<String, (usize, DType)> = HashMap::new();
    for _ in 0..count {
        let p = r.pickle()?;
        let parts = p.as_tuple_or_list(p.root()).unwrap_or_default();
        let (Some(&key), Some(&class)) = (parts.first(), parts.get(2)) else {
            return Err(r.corrupt("a storage record is not a (key, location, type) tuple"));
        };
        let key = key_string(&p, key)
            .ok_or_else(|| r.corrupt("a storage key is not a string or integer"))?;
        let dtype = match p.get(class) {
            PValue::Global { name, .. } => DType::from_storage_class(name),
            _ => None,
        }
        .ok_or_else(|| r.corrupt(&format!("storage {key} has no known storage type")))?;
        let numel = r.i64()?;
        let nbytes = usize::try_from(numel)
            .ok()
            .and_then(|n| n.checked_mul(dtype.size()))
            .ok_or_else(|| r.corrupt(&format!("storage {key} declares {numel} elements")))?;
        let range = r.take(nbytes).map_err(|_| {
            r.corrupt(&format!(
                "storage {key} declares {nbytes} bytes but the member ends at byte {}",
                r.end
            ))
        })?;
        let s = file
            .storage(range)
            .ok_or_else(|| r.corrupt("a storage lies outside the file"))?;
        by_key.insert(key, (storages.len(), dtype));
        storages.push(s);
    }
    let views = r.pickle()?;
    for &v in views.as_tuple_or_list(views.root()).unwrap_or_default() {
        let item = views.as_tuple_or_list(v).unwrap_or_default();
        let [target, root, offset, numel] = item else {
            return Err(r.corrupt("a storage view is not a (key, root, offset, size) tuple"));
        };
        let num = |i: &NodeId| views.as_int(*i).and_then(|x| usize::try_from(x).ok());
        let (Some(target), Some(root), Some(offset), Some(numel)) = (
            key_string(&views, *target),
            key_string(&views, *root),
            num(offset),
            num(numel),
        ) else {
            return Err(r.corrupt("a storage view has invalid fields"));
        };
        let &(base, dtype) = by_key.get(&root).ok_or_else(|| {
            r.corrupt(&format!(
                "storage view {target} names unknown storage {root}"
            ))
        })?;
        let es = dtype.size();
        let sub = offset
            .checked_mul(es)
            .zip(numel.checked_mul(es))
            .and_then(|(s, n)| Some(s..s.checked_add(n)?))
            .and_then(|range| storages[base].slice(range))
            .ok_or_else(|| {
                r.corrupt(&format!(
                    "storage view {target} reaches outside storage {root}"
                ))
            })?;
        by_key.insert(target, (storages.len(), dtype));
        storages.push(sub);
    }

    // tensors
    r.enter("tensors", member("tensors")?);
    let count = r.count()?;
    let mut tensors: HashMap<String, TensorInfo> = HashMap::new();
    for _ in 0..count {
        let p = r.pickle()?;
        let parts = p.as_tuple_or_list(p.root()).unwrap_or_default();
        let (Some(key), Some(skey)) = (
            parts.first().and_then(|&k| key_string(&p, k)),
            parts.get(1).and_then(|&k| key_string(&p, k)),
        ) else {
            return Err(r.corrupt("a tensor record is not a (key, storage, type) tuple"));
        };
        let &(storage, dtype) = by_key
            .get(&skey)
            .ok_or_else(|| r.corrupt(&format!("tensor {key} names unknown storage {skey}")))?;
        let ndim = r.i32()?;
        r.take(4)?;
        let ndim = usize::try_from(ndim)
            .ok()
            .filter(|&n| n <= limits.max_ndim)
            .ok_or_else(|| r.corrupt(&format!("tensor {key} declares {ndim} dimensions")))?;
        let mut dims = Vec::with_capacity(2 * ndim + 1);
        for _ in 0..2 * ndim + 1 {
            let v = r.i64()?;
            dims.push(usize::try_from(v).map_err(|_| {
                r.corrupt(&format!(
                    "tensor {key} has a negative size, stride or offset"
                ))
            })?);
        }
        let offset = dims.pop().unwrap_or_default();
        let strides = dims.split_off(ndim);
        check_view(dtype, &dims, &strides, offset, storages[storage].len())
            .map_err(|what| Error::tensor(path, &key, what))?;
        let info = TensorInfo {
            name: key.clone(),
            dtype,
            shape: dims,
            strides,
            offset,
            data: TensorData::Strided { storage },
            quant: None,
            requires_grad: false,
        };
        tensors.insert(key, info);
    }

    // the object
    r.enter("pickle", member("pickle")?);
    let main = r.pickle()?;
    Ok(Parsed {
        storages,
        by_key,
        tensors,
        main,
        globals: r.globals.into_vec(),
        pickles: r.pickles,
    })
}

/// Byte ranges of the tar's regular members, by name.
fn members(path: &Path, bytes: &[u8]) -> Result<HashMap<String, Range<usize>>> {
    let bad = |e: std::io::Error| Error::corrupt(path, format!("the tar archive is corrupt: {e}"));
    let mut ar = tar::Archive::new(Cursor::new(bytes));
    let mut out = HashMap::new();
    for entry in ar.entries().map_err(bad)? {
        let entry = entry.map_err(bad)?;
        let name = entry.path().map_err(bad)?.to_string_lossy().into_owned();
        let start = usize::try_from(entry.raw_file_position()).unwrap_or(usize::MAX);
        let len = usize::try_from(entry.size()).unwrap_or(usize::MAX);
        let end = start
            .checked_add(len)
            .filter(|&e| e <= bytes.len())
            .ok_or_else(|| {
                Error::corrupt(
                    path,
                    format!("tar member {name} ({len} bytes) extends past the end of the file"),
                )
            })?;
        out.insert(name, start..end);
    }
    Ok(out)
}

fn key_string(p: &Pickle, id: NodeId) -> Option<String> {
    match p.get(id) {
        PValue::Str(s) => Some(s.clone()),
        PValue::Int(i) => Some(i.to_string()),
        PValue::Bytes(b) => String::from_utf8(b.clone()).ok(),
        _ => None,
    }
}

/// A cursor over one tar member.
struct Reader<'a> {
    path: &'a Path,
    file: &'a FileBytes,
    limits: &'a Limits,
    pos: usize,
    end: usize,
    member: &'static str,
    /// Globals of every pickle run so far, first-seen order.
    globals: GlobalList,
    /// Pickles run so far.
    pickles: usize,
}

impl Reader<'_> {
    fn enter(&mut self, member: &'static str, range: Range<usize>) {
        self.member = member;
        self.pos = range.start;
        self.end = range.end;
    }

    fn corrupt(&self, what: &str) -> Error {
        Error::corrupt(
            self.path,
            format!("tar member {}: {what} (at byte {})", self.member, self.pos),
        )
    }

    fn take(&mut self, n: usize) -> Result<Range<usize>> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.end)
            .ok_or_else(|| {
                self.corrupt(&format!(
                    "{n} more bytes are needed but the member ends at byte {}",
                    self.end
                ))
            })?;
        let r = self.pos..end;
        self.pos = end;
        Ok(r)
    }

    fn i64(&mut self) -> Result<i64> {
        let r = self.take(8)?;
        Ok(i64::from_le_bytes(
            self.file.as_slice()[r].try_into().unwrap_or_default(),
        ))
    }

    fn i32(&mut self) -> Result<i32> {
        let r = self.take(4)?;
        Ok(i32::from_le_bytes(
            self.file.as_slice()[r].try_into().unwrap_or_default(),
        ))
    }

    fn pickle(&mut self) -> Result<Pickle> {
        let rest = &self.file.as_slice()[self.pos..self.end];
        let (p, used) =
            torchport_pickle::parse_prefix(rest, &self.limits.pickle).map_err(|mut source| {
                source.offset += self.pos as u64;
                Error::Pickle {
                    path: self.path.to_path_buf(),
                    record: format!("tar member {}", self.member),
                    source,
                }
            })?;
        self.pos += used;
        self.pickles += 1;
        self.globals.extend(p.globals());
        Ok(p)
    }

    fn count(&mut self) -> Result<usize> {
        let p = self.pickle()?;
        p.as_int(p.root())
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| self.corrupt("the record count is not a non-negative integer"))
    }
}

struct TarResolver {
    file_len: usize,
    storages: Vec<Storage>,
    by_key: HashMap<String, (usize, DType)>,
    tensors: HashMap<String, TensorInfo>,
}

impl Resolver for TarResolver {
    fn persistent(&mut self, p: &Pickle, payload: NodeId) -> Result<Persistent, String> {
        if let Some(parts) = p.as_tuple_or_list(payload) {
            let first = parts.first().ok_or("its persistent id is an empty tuple")?;
            return Ok(Persistent::Node(*first));
        }
        let key = key_string(p, payload).ok_or("its persistent id is not a key")?;
        if let Some(t) = self.tensors.get(&key) {
            return Ok(Persistent::Tensor(Box::new(t.clone())));
        }
        if let Some(&(index, dtype)) = self.by_key.get(&key) {
            return Ok(Persistent::Storage { index, dtype });
        }
        Err(format!(
            "its persistent id {key} names no tensor or storage in the archive"
        ))
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
