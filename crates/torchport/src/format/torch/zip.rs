//! The `torch.save` zip format (PyTorch ≥ 1.6): `<root>/data.pkl` plus one record
//! `<root>/data/<key>` per storage, an optional `<root>/byteorder`, any root folder name,
//! ZIP64 allowed. Records are read through the shared zip container (`format::archive`).

use std::collections::HashMap;
use std::path::Path;

use torchport_pickle::{NodeId, Pickle, Value as PValue};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::format::archive::Archive;
use crate::format::kind::Format;
use crate::format::parts::Found;
use crate::format::parts::{GlobalList, Parts, PickleGlobals};
use crate::format::torch::interpret::{interpret, Persistent, Resolver};
use crate::limits::Limits;
use crate::storage::{FileBytes, Storage};
use crate::tensor::ByteOrder;

/// The root folder of a torch zip: the folder holding `data.pkl` (any name).
pub(crate) fn find_root(names: &[String]) -> Option<String> {
    root_holding(names, "data.pkl")
}

/// The folder holding record `record`: the archive's top level or one folder (any name), the
/// shallowest where several do.
pub(crate) fn root_holding(names: &[String], record: &str) -> Option<String> {
    names
        .iter()
        .filter_map(|n| n.strip_suffix(record))
        .filter(|r| r.is_empty() || (r.ends_with('/') && r.matches('/').count() == 1))
        .min_by_key(|r| r.len())
        .map(str::to_string)
}

pub(crate) fn read(path: &Path, file: &FileBytes, limits: &Limits) -> Result<Parts> {
    let parts = read_parts(path, Archive::new(path, file, limits)?, limits)?;
    Ok(Parts::new(
        Format::TorchZip,
        parts.order,
        parts.found,
        parts.globals,
        parts.storages,
    ))
}

/// What one `torch.save` archive holds, before it becomes [`Parts`] (the `.pt2` reader
/// merges those of archives nested in its own).
pub(crate) struct SaveParts {
    pub order: ByteOrder,
    pub found: Found,
    pub globals: Vec<(String, String)>,
    pub storages: Vec<Storage>,
}

/// Read the `torch.save` archive `ar`: its `data.pkl` and the storages it names.
pub(crate) fn read_parts(path: &Path, mut ar: Archive<'_>, limits: &Limits) -> Result<SaveParts> {
    let names = ar.names();
    let Some(root) = find_root(&names) else {
        return Err(Error::corrupt(
            path,
            "the zip archive has no data.pkl record; it is not a torch.save file",
        ));
    };
    let order = read_byteorder(path, &mut ar, &root)?;
    let record = format!("{root}data.pkl");
    let pickle = parse_record(path, &mut ar, &record, limits)?;
    let mut resolver = ZipResolver::new(ar, root);
    let found = interpret(path, &pickle, &mut resolver, order, limits)?;
    Ok(SaveParts {
        order,
        found,
        globals: pickle.globals().to_vec(),
        storages: resolver.storages,
    })
}

/// The storage at the root of a `torch.save` archive nested in another file's pickle (what
/// `torch.storage._load_from_bytes` reads), its dtype, and how many nodes its pickle holds.
/// Nothing in the archive is interpreted but its root persistent id.
pub(crate) fn nested_storage(
    path: &Path,
    file: &FileBytes,
    limits: &Limits,
) -> Result<(Storage, DType, usize)> {
    let mut ar = Archive::new(path, file, limits)?;
    let Some(root) = find_root(&ar.names()) else {
        return Err(Error::corrupt(
            path,
            "the nested zip archive has no data.pkl record; it is not a torch.save file",
        ));
    };
    let order = read_byteorder(path, &mut ar, &root)?;
    let record = format!("{root}data.pkl");
    let pickle = parse_record(path, &mut ar, &record, limits)?;
    let mut resolver = ZipResolver::new(ar, root);
    let (storage, dtype) =
        crate::format::torch::nested::root_storage(path, &pickle, &mut resolver)?;
    Ok((storage.with_order(order), dtype, pickle.len()))
}

/// The byte order a zip archive declares in `<root>byteorder` (little when absent).
pub(crate) fn read_byteorder(path: &Path, ar: &mut Archive<'_>, root: &str) -> Result<ByteOrder> {
    let name = format!("{root}byteorder");
    if !ar.has(&name) {
        return Ok(ByteOrder::Little);
    }
    match ar.record(&name)?.bytes() {
        b"little" => Ok(ByteOrder::Little),
        b"big" => Ok(ByteOrder::Big),
        other => Err(Error::corrupt(
            path,
            format!(
                "the byteorder record says {:?}; expected \"little\" or \"big\"",
                String::from_utf8_lossy(other)
            ),
        )),
    }
}

/// Parse the pickle held in one record of the archive.
pub(crate) fn parse_record(
    path: &Path,
    ar: &mut Archive<'_>,
    record: &str,
    limits: &Limits,
) -> Result<Pickle> {
    let pkl = ar.record(record)?;
    torchport_pickle::parse(pkl.bytes(), &limits.pickle).map_err(|source| Error::Pickle {
        path: path.to_path_buf(),
        record: record.to_string(),
        source,
    })
}

/// Every global referenced by every pickle record (`*.pkl`) of a zip archive, whatever kind
/// of zip it is, in first-seen order; and how many pickles were read. Nothing is
/// interpreted: this is the security scan's view of the archive. A record that cannot be
/// read, or a pickle that fails partway, is noted as a problem (with the globals seen up to
/// the failure) and the scan goes on with the next record. The files nested in the pickles
/// through `torch.storage._load_from_bytes` are scanned too; `depth` is this archive's own
/// nesting.
pub(crate) fn pickle_globals(
    path: &Path,
    file: &FileBytes,
    limits: &Limits,
    depth: usize,
) -> Result<PickleGlobals> {
    let mut ar = Archive::new(path, file, limits)?;
    let mut globals = GlobalList::default();
    let mut problems = Vec::new();
    let mut count = 0;
    for record in ar.names().into_iter().filter(|n| n.ends_with(".pkl")) {
        let bytes = match ar.record(&record) {
            Ok(bytes) => bytes,
            Err(e) => {
                problems.push(e.to_string());
                continue;
            }
        };
        let (found, ended) = torchport_pickle::scan_globals(bytes.bytes(), &limits.pickle);
        globals.extend(&found);
        count += 1;
        let ended = ended.and_then(|used| trailing_check(used, bytes.bytes().len()));
        if ended.is_ok() {
            let nested = crate::format::torch::nested::scan(
                path,
                &record,
                bytes.bytes(),
                &found,
                limits,
                depth,
            );
            count += nested.count;
            globals.extend(&nested.globals);
            problems.extend(nested.problems);
        }
        if let Err(source) = ended {
            let e = Error::Pickle {
                path: path.to_path_buf(),
                record: record.clone(),
                source,
            };
            problems.push(e.to_string());
        }
    }
    Ok(PickleGlobals {
        count,
        globals: globals.into_vec(),
        problems,
    })
}

/// A whole-record pickle must end at its record's end (as [`torchport_pickle::parse`] checks).
fn trailing_check(used: usize, len: usize) -> std::result::Result<(), torchport_pickle::Error> {
    match len.saturating_sub(used) {
        0 => Ok(()),
        extra => Err(torchport_pickle::Error {
            offset: used as u64,
            opcode: None,
            kind: torchport_pickle::ErrorKind::TrailingBytes(extra),
        }),
    }
}

/// Resolves `('storage', type, key, location, numel)` persistent ids to the records
/// `<root>data/<key>`, each loaded once.
pub(crate) struct ZipResolver<'a> {
    pub ar: Archive<'a>,
    root: String,
    /// The folder under the root holding the storages (`data/`; `constants/` for a
    /// TorchScript archive's `constants.pkl`).
    folder: &'static str,
    pub storages: Vec<Storage>,
    by_key: HashMap<String, (usize, DType)>,
}

impl<'a> ZipResolver<'a> {
    /// A resolver for the archive whose root folder is `root` (with its trailing `/`).
    pub(crate) fn new(ar: Archive<'a>, root: String) -> Self {
        ZipResolver {
            ar,
            root,
            folder: "data/",
            storages: Vec::new(),
            by_key: HashMap::new(),
        }
    }

    /// Resolve later storage keys in `<root><folder>` (e.g. `constants/`) instead.
    pub(crate) fn set_folder(&mut self, folder: &'static str) {
        if self.folder != folder {
            self.folder = folder;
            self.by_key.clear();
        }
    }
}

/// Parse a zip persistent id: `('storage', <StorageClass>, key, location, numel)`.
pub(crate) fn storage_id(p: &Pickle, payload: NodeId) -> Result<(DType, String, u64), String> {
    let parts = p
        .as_tuple_or_list(payload)
        .ok_or("its persistent id is not a tuple")?;
    let kind = parts.first().and_then(|&k| p.as_str(k));
    if kind != Some("storage") || parts.len() < 5 {
        return Err(
            "its persistent id is not a ('storage', type, key, location, size) tuple".into(),
        );
    }
    let dtype = match p.get(parts[1]) {
        PValue::Global { name, .. } => DType::from_storage_class(name)
            .ok_or_else(|| format!("its storage type {name} is not a torch storage class"))?,
        _ => return Err("its storage type is not a class".into()),
    };
    let key = match p.get(parts[2]) {
        PValue::Str(s) => s.clone(),
        PValue::Int(i) => i.to_string(),
        _ => return Err("its storage key is not a string".into()),
    };
    let numel = p
        .as_int(parts[4])
        .and_then(|n| u64::try_from(n).ok())
        .ok_or("its storage size is not a non-negative integer")?;
    Ok((dtype, key, numel))
}

impl Resolver for ZipResolver<'_> {
    fn persistent(&mut self, p: &Pickle, payload: NodeId) -> Result<Persistent, String> {
        let (dtype, key, numel) = storage_id(p, payload)?;
        if let Some(&(index, dtype)) = self.by_key.get(&key) {
            return Ok(Persistent::Storage { index, dtype });
        }
        let name = format!("{}{}{key}", self.root, self.folder);
        let storage = self.ar.record(&name).map_err(|e| match e {
            Error::MissingRecord { .. } => {
                format!("its storage record {name} is missing from the archive")
            }
            other => other.detail(),
        })?;
        let declared = numel
            .checked_mul(dtype.size() as u64)
            .ok_or("its storage size overflows")?;
        if (storage.len() as u64) < declared {
            return Err(format!(
                "its storage record {name} holds {} bytes, but the pickle declares {numel} elements of {dtype} ({declared} bytes)",
                storage.len()
            ));
        }
        let index = self.storages.len();
        self.storages.push(storage);
        self.by_key.insert(key, (index, dtype));
        Ok(Persistent::Storage { index, dtype })
    }

    fn storages(&self) -> &[Storage] {
        &self.storages
    }

    fn add_storage(&mut self, storage: Storage) -> usize {
        self.storages.push(storage);
        self.storages.len() - 1
    }

    fn file_len(&self) -> usize {
        self.ar.file_len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots() {
        let n = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            find_root(&n(&["archive/data.pkl", "archive/data/0"])),
            Some("archive/".into())
        );
        assert_eq!(find_root(&n(&["x y/data.pkl"])), Some("x y/".into()));
        assert_eq!(find_root(&n(&["a/b/data.pkl"])), None);
        assert_eq!(find_root(&n(&["data.pkl"])), Some(String::new()));
    }
}
