//! `torch.storage._load_from_bytes(b)`: how plain `pickle.dumps` (not `torch.save`) writes a
//! storage. `b` is a whole `torch.save` file (torch writes the legacy stream) held in the
//! pickle as a bytes object — at protocol 2, `_codecs.encode(text, 'latin1')`. This module
//! owns reading such a file's root storage with our own container readers (only a
//! `torch.save` legacy stream or zip archive, never interpreted beyond its root persistent
//! id, so nested files are read one level deep), and listing the globals of nested files for
//! the security scan (at most [`MAX_SCAN_DEPTH`] levels deep).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use torchport_pickle::{NodeId, Object, Pickle, Value as PValue};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::format::archive::is_zip;
use crate::format::kind::describe_head;
use crate::format::parts::{GlobalList, PickleGlobals};
use crate::format::torch::interpret::{Persistent, Resolver};
use crate::format::torch::{legacy as torch_legacy, zip as torch_zip};
use crate::limits::Limits;
use crate::storage::{FileBytes, Storage};

/// How many `torch.save` files nested in one another the security scan follows. torch
/// itself writes one level; `torch.load` would follow any number, so the scan looks further
/// than the reader reads, and says so when a file nests deeper still.
pub(crate) const MAX_SCAN_DEPTH: usize = 4;

/// True for `torch.storage._load_from_bytes`, however the pickle spells it (protocol 4's
/// `STACK_GLOBAL` may split the dotted path at any dot).
pub(crate) fn is_load_from_bytes(module: &str, name: &str) -> bool {
    matches!(
        (module, name),
        ("torch.storage", "_load_from_bytes") | ("torch", "storage._load_from_bytes")
    )
}

/// True when `obj` is a `torch.storage._load_from_bytes` call.
pub(crate) fn is_call(p: &Pickle, obj: &Object) -> bool {
    p.as_global(obj.callable)
        .is_some_and(|(m, n)| is_load_from_bytes(m, n))
}

/// The node holding a `_load_from_bytes` call's bytes: its argument (`bytes`), or the text
/// of protocol 2's `_codecs.encode(text, 'latin1')`.
pub(crate) fn bytes_node(p: &Pickle, obj: &Object) -> Result<NodeId, String> {
    let arg = match obj.args.as_slice() {
        [arg] => *arg,
        args => {
            return Err(format!(
                "the call has {} arguments, expected one bytes object",
                args.len()
            ))
        }
    };
    match p.get(arg) {
        PValue::Bytes(_) => Ok(arg),
        PValue::Object(o) if p.as_global(o.callable) == Some(("_codecs", "encode")) => {
            match o.args.as_slice() {
                [text, enc] if p.as_str(*enc) == Some("latin1") && p.as_str(*text).is_some() => {
                    Ok(*text)
                }
                _ => Err("its _codecs.encode argument is not (text, 'latin1')".into()),
            }
        }
        other => Err(format!(
            "its argument is a {}, not a bytes object",
            other.type_name()
        )),
    }
}

/// The bytes a node found by [`bytes_node`] holds (latin1 text: one byte per character).
pub(crate) fn decode(p: &Pickle, node: NodeId) -> Result<Vec<u8>, String> {
    match p.get(node) {
        PValue::Bytes(b) => Ok(b.clone()),
        PValue::Str(s) => s
            .chars()
            .map(|c| u8::try_from(u32::from(c)).ok())
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(|| "its latin1 text holds a character above U+00FF".into()),
        other => Err(format!("it is a {}, not bytes", other.type_name())),
    }
}

/// Read the storage at the root of the `torch.save` file `bytes` (a legacy stream or a zip
/// archive; anything else is an error); its dtype, and how many pickle nodes the file held.
/// `path` is the outer file, for messages.
pub(crate) fn read_storage(
    path: &Path,
    bytes: Vec<u8>,
    limits: &Limits,
) -> Result<(Storage, DType, usize)> {
    let file = FileBytes::Owned(Arc::new(bytes));
    let bytes = file.as_slice();
    if torch_legacy::looks_like(bytes) {
        torch_legacy::nested_storage(path, &file, limits)
    } else if is_zip(bytes) {
        torch_zip::nested_storage(path, &file, limits)
    } else {
        Err(Error::corrupt(
            path,
            format!(
                "the nested bytes are not a torch.save file ({})",
                describe_head(bytes)
            ),
        ))
    }
}

/// The storage a nested file's `main` pickle holds at its root. Nothing else in it is
/// interpreted: another `_load_from_bytes` there (a second level of nesting) is an error.
pub(crate) fn root_storage(
    path: &Path,
    main: &Pickle,
    resolver: &mut dyn Resolver,
) -> Result<(Storage, DType)> {
    let corrupt = |what: String| Error::corrupt(path, format!("the nested file's {what}"));
    match main.get(main.root()) {
        PValue::PersistentId(payload) => match resolver.persistent(main, *payload) {
            Ok(Persistent::Storage { index, dtype }) => resolver
                .storages()
                .get(index)
                .cloned()
                .map(|s| (s, dtype))
                .ok_or_else(|| corrupt("root storage is missing".into())),
            Ok(_) => Err(corrupt("root persistent id is not a storage".into())),
            Err(what) => Err(corrupt(format!("root storage cannot be read: {what}"))),
        },
        PValue::Object(o) if is_call(main, o) => Err(corrupt(
            "root is another torch.storage._load_from_bytes file; torchport reads nested \
             torch.save files one level deep"
                .into(),
        )),
        other => Err(corrupt(format!(
            "root is a {}, not a storage",
            other.type_name()
        ))),
    }
}

/// The security scan of the `torch.save` files nested through `_load_from_bytes` in one
/// pickle (`bytes`, whose scan found the globals `found`; `record` names it), `depth` levels
/// below the file itself. Nothing is interpreted. A pickle that does not reference
/// `_load_from_bytes` gives nothing; one that fails to run gives nothing either (its own
/// scan has listed that problem).
pub(crate) fn scan(
    path: &Path,
    record: &str,
    bytes: &[u8],
    found: &[(String, String)],
    limits: &Limits,
    depth: usize,
) -> PickleGlobals {
    let mut out = PickleGlobals::default();
    if !found.iter().any(|(m, n)| is_load_from_bytes(m, n)) {
        return out;
    }
    let Ok((p, _)) = torchport_pickle::parse_prefix(bytes, &limits.pickle) else {
        return out;
    };
    let mut globals = GlobalList::default();
    let mut seen = HashSet::new();
    let label = PathBuf::from(format!(
        "{} (the torch.save file nested in {record})",
        path.display()
    ));
    for node in p.nodes() {
        let PValue::Object(o) = node else { continue };
        if !is_call(&p, o) {
            continue;
        }
        let file = match bytes_node(&p, o).and_then(|b| {
            if seen.insert(b) {
                decode(&p, b).map(Some)
            } else {
                Ok(None)
            }
        }) {
            Ok(Some(b)) => FileBytes::Owned(Arc::new(b)),
            Ok(None) => continue,
            Err(what) => {
                out.problems.push(
                    Error::corrupt(&label, format!("torch.storage._load_from_bytes: {what}"))
                        .to_string(),
                );
                continue;
            }
        };
        if depth >= MAX_SCAN_DEPTH {
            out.problems.push(
                Error::corrupt(
                    &label,
                    format!(
                        "torch.save files nest more than {MAX_SCAN_DEPTH} deep through \
                         torch.storage._load_from_bytes; the deeper ones were not scanned"
                    ),
                )
                .to_string(),
            );
            break;
        }
        let bytes = file.as_slice();
        let nested = if torch_legacy::looks_like(bytes) {
            torch_legacy::pickle_globals(&label, &file, limits, depth + 1)
        } else if is_zip(bytes) {
            torch_zip::pickle_globals(&label, &file, limits, depth + 1)
        } else {
            Err(Error::corrupt(
                &label,
                format!("it is not a torch.save file ({})", describe_head(bytes)),
            ))
        };
        match nested {
            Ok(n) => {
                out.count += n.count;
                globals.extend(&n.globals);
                out.problems.extend(n.problems);
            }
            Err(e) => out.problems.push(e.to_string()),
        }
    }
    out.globals = globals.into_vec();
    out
}
