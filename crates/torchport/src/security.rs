//! Classification of the globals a file's pickles reference: known-safe (torch rebuild
//! functions, storage classes, dtypes, containers), dangerous (refused), or unknown but
//! inert (recorded as data, never imported); and [`scan`], which lists them for any file —
//! including one that [`crate::open`] refuses — without interpreting anything.
//!
//! ```no_run
//! let report = torchport::security::scan("model.pt")?;
//! for g in &report.globals {
//!     println!("{}.{} [{}]", g.module, g.name, g.class.name());
//! }
//! assert_eq!(report.verdict(), if report.is_refused() { "refused" } else { "ok" });
//! # Ok::<(), torchport::Error>(())
//! ```

use std::path::Path;

use crate::dtype::DType;
use crate::error::Result;
use crate::format::{self, Format};
use crate::limits::Limits;
use crate::storage::FileBytes;

/// One global a file's pickles reference, with its class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GlobalRef {
    /// The module, e.g. `torch._utils`.
    pub module: String,
    /// The (possibly dotted) name in the module, e.g. `_rebuild_tensor_v2`.
    pub name: String,
    /// How torchport treats it.
    pub class: GlobalClass,
}

/// What [`scan`] found in a file.
#[derive(Clone, Debug)]
pub struct SecurityReport {
    /// The detected format.
    pub format: Format,
    /// How many pickles the file holds (all of them were run).
    pub pickles: usize,
    /// Every global referenced by any of the file's pickles, first-seen order, no repeats.
    pub globals: Vec<GlobalRef>,
    /// Why the scan could not see everything: a pickle that fails partway (its globals up to
    /// the failure are listed), or a record that cannot be read. Empty for a sound file.
    pub problems: Vec<String>,
}

impl SecurityReport {
    /// True when a dangerous global is referenced: [`crate::open`] refuses such a file.
    pub fn is_refused(&self) -> bool {
        self.dangerous().next().is_some()
    }

    /// The dangerous globals.
    pub fn dangerous(&self) -> impl Iterator<Item = &GlobalRef> {
        self.globals
            .iter()
            .filter(|g| g.class == GlobalClass::Dangerous)
    }

    /// True when part of the file could not be scanned (see [`SecurityReport::problems`]).
    pub fn is_incomplete(&self) -> bool {
        !self.problems.is_empty()
    }

    /// `refused` when a dangerous global is referenced (even if the file is also corrupt);
    /// otherwise `incomplete` when part of the file could not be scanned, else `ok`.
    pub fn verdict(&self) -> &'static str {
        if self.is_refused() {
            "refused"
        } else if self.is_incomplete() {
            "incomplete"
        } else {
            "ok"
        }
    }
}

/// List every global the file's pickles reference, classified, with the default [`Limits`].
///
/// Every pickle the container holds is run (zip `*.pkl` records, the legacy stream's five
/// pickles, every tar record) with dangerous globals *recorded* instead of refused; nothing is
/// imported, called or interpreted, so a file [`crate::open`] refuses can still be reported.
/// A pickle that is corrupt or reaches a limit partway still gives the globals it referenced
/// before that point, and the failure is listed in [`SecurityReport::problems`]. Errors only
/// when the container itself cannot be read (no pickle can be found in it).
pub fn scan(path: impl AsRef<Path>) -> Result<SecurityReport> {
    scan_with(path, &Limits::default())
}

/// [`scan`] with explicit limits (`limits.pickle.refuse_dangerous` is ignored).
pub fn scan_with(path: impl AsRef<Path>, limits: &Limits) -> Result<SecurityReport> {
    let path = path.as_ref();
    scan_file(path, &FileBytes::open(path)?, limits)
}

/// [`scan`] of bytes already in memory; `name` only labels them in messages.
pub fn scan_bytes(name: &str, bytes: Vec<u8>, limits: &Limits) -> Result<SecurityReport> {
    let file = FileBytes::Owned(std::sync::Arc::new(bytes));
    scan_file(Path::new(name), &file, limits)
}

/// The problems a report lists one by one; more are counted in one last line.
const MAX_PROBLEMS: usize = 20;

fn scan_file(path: &Path, file: &FileBytes, limits: &Limits) -> Result<SecurityReport> {
    let mut limits = limits.clone();
    limits.pickle.refuse_dangerous = false;
    let (format, found) = format::pickle_globals(path, file, &limits)?;
    let pickles = found.count;
    let mut problems = found.problems;
    if problems.len() > MAX_PROBLEMS {
        let more = problems.len() - MAX_PROBLEMS;
        problems.truncate(MAX_PROBLEMS);
        problems.push(format!(
            "… and {more} more records or pickles that could not be scanned"
        ));
    }
    let globals = found
        .globals
        .into_iter()
        .map(|(module, name)| {
            let class = classify(&module, &name);
            GlobalRef {
                module,
                name,
                class,
            }
        })
        .collect();
    Ok(SecurityReport {
        format,
        pickles,
        globals,
        problems,
    })
}

/// How a referenced global is treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GlobalClass {
    /// Interpreted by torchport: tensor rebuild functions, storage classes, dtypes, containers.
    KnownSafe,
    /// Not interpreted; recorded as data (an object's class name), never imported or called.
    Inert,
    /// Could only mean code execution or I/O; files referencing it are refused.
    Dangerous,
}

impl GlobalClass {
    /// `known-safe`, `inert` or `dangerous`.
    pub fn name(self) -> &'static str {
        match self {
            GlobalClass::KnownSafe => "known-safe",
            GlobalClass::Inert => "inert",
            GlobalClass::Dangerous => "dangerous",
        }
    }
}

/// Classify one global.
pub fn classify(module: &str, name: &str) -> GlobalClass {
    if torchport_pickle::is_dangerous_global(module, name) {
        return GlobalClass::Dangerous;
    }
    let safe = crate::interpret::is_rebuild_function(module, name)
        || crate::interpret::is_array_function(module, name)
        || (module == "torch"
            && (DType::from_storage_class(name).is_some() || DType::from_name(name).is_some()))
        || (module == "torch" && name.starts_with("per_"))
        || (module == "torch"
            && matches!(
                name,
                "device"
                    | "Size"
                    | "sparse_coo"
                    | "sparse_csr"
                    | "sparse_csc"
                    | "sparse_bsr"
                    | "sparse_bsc"
            ))
        || matches!(
            (module, name),
            ("collections", "OrderedDict")
                | ("torch.nn.parameter", "Parameter")
                | ("torch.serialization", "_get_layout")
                | ("_codecs", "encode")
                | ("copyreg", "_reconstructor")
                | (
                    "builtins",
                    "set"
                        | "frozenset"
                        | "object"
                        | "list"
                        | "dict"
                        | "tuple"
                        | "int"
                        | "float"
                        | "str"
                        | "bytes"
                        | "bool"
                        | "complex"
                        | "slice"
                        | "range"
                        | "bytearray"
                )
                | ("__builtin__", "set" | "frozenset" | "object" | "bytes")
                | ("numpy.core.multiarray" | "numpy._core.multiarray", "scalar")
                | ("numpy", "dtype" | "ndarray")
        );
    if safe {
        GlobalClass::KnownSafe
    } else {
        GlobalClass::Inert
    }
}
