//! Classification of the globals a file's pickles reference against an allow-list:
//! known-safe (on torch's own `weights_only` allow-list or torchport's documented data-only
//! classes), dangerous (a known code-execution gadget: refused), or unlisted (on no list:
//! recorded as data and never imported by torchport, but unsafe for `torch.load`); and
//! [`scan`], which lists them for any file — including one that [`crate::open`] refuses —
//! without interpreting anything.
//!
//! ```no_run
//! let report = torchport::security::scan("model.pt")?;
//! for g in &report.globals {
//!     println!("{}.{} [{}]", g.module, g.name, g.class.name());
//! }
//! if report.verdict() == "ok" {
//!     assert!(report.globals.iter().all(|g| g.class == torchport::security::GlobalClass::KnownSafe));
//! }
//! # Ok::<(), torchport::Error>(())
//! ```

use std::path::Path;

#[cfg(test)]
use crate::dtype::{DType, ALL_DTYPES};
use crate::error::Result;
use crate::format::{self, Format};
use crate::limits::Limits;
use crate::storage::FileBytes;
pub use torchport_pickle::AllowList;

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

    /// The globals on no allow-list (not dangerous): `torch.load` would import them.
    pub fn unlisted(&self) -> impl Iterator<Item = &GlobalRef> {
        self.globals
            .iter()
            .filter(|g| g.class == GlobalClass::Unlisted)
    }

    /// True when a global on no allow-list is referenced: torchport still reads the file
    /// (it imports nothing), but `torch.load` of it would import and call that global.
    pub fn is_unsafe_for_torch_load(&self) -> bool {
        self.is_refused() || self.unlisted().next().is_some()
    }

    /// True when part of the file could not be scanned (see [`SecurityReport::problems`]).
    pub fn is_incomplete(&self) -> bool {
        !self.problems.is_empty()
    }

    /// The verdict, strongest finding first: `refused` when a dangerous global is referenced
    /// (even if the file is also corrupt); else `unsafe-for-torch-load` when a global on no
    /// allow-list is referenced (even if part of the file could not be scanned); else
    /// `incomplete` when part of the file could not be scanned; else `ok`: every global of
    /// every pickle is on the allow-list.
    pub fn verdict(&self) -> &'static str {
        if self.is_refused() {
            "refused"
        } else if self.is_unsafe_for_torch_load() {
            "unsafe-for-torch-load"
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
#[non_exhaustive]
pub enum GlobalClass {
    /// On the allow-list (see [`allow_list`]): torch's own `weights_only` allow-list or
    /// torchport's documented data-only classes. Safe for `torch.load`.
    KnownSafe,
    /// On no allow-list and not a known gadget. torchport records it as data (an object's
    /// class name) and never imports it, but `torch.load` would import and call it: the file
    /// is unsafe to hand to `torch.load`.
    Unlisted,
    /// A known code-execution gadget (system access, code evaluation, nested loads, threads,
    /// network, …); every command refuses the file.
    Dangerous,
}

impl GlobalClass {
    /// `known-safe`, `unlisted` or `dangerous`.
    pub fn name(self) -> &'static str {
        match self {
            GlobalClass::KnownSafe => "known-safe",
            GlobalClass::Unlisted => "unlisted",
            GlobalClass::Dangerous => "dangerous",
        }
    }
}

/// Classify one global: dangerous when it is a known gadget, known-safe when it is on an
/// allow-list, else unlisted.
pub fn classify(module: &str, name: &str) -> GlobalClass {
    if torchport_pickle::is_dangerous_global(module, name) {
        GlobalClass::Dangerous
    } else if allow_list(module, name).is_some() {
        GlobalClass::KnownSafe
    } else {
        GlobalClass::Unlisted
    }
}

/// The allow-list a global is on (`None` for unlisted and dangerous globals). The lists are
/// data in `crates/torchport-pickle/src/allowed.rs`.
pub fn allow_list(module: &str, name: &str) -> Option<AllowList> {
    torchport_pickle::allow_list(module, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every dtype and typed storage class the readers interpret is on the allow-list, so a
    /// checkpoint of any dtype torchport reads can be `ok`.
    #[test]
    fn every_dtype_the_readers_know_is_allowed() {
        let storages = [
            "DoubleStorage",
            "FloatStorage",
            "HalfStorage",
            "LongStorage",
            "IntStorage",
            "ShortStorage",
            "CharStorage",
            "ByteStorage",
            "BoolStorage",
            "BFloat16Storage",
            "ComplexDoubleStorage",
            "ComplexFloatStorage",
            "QInt8Storage",
            "QInt32Storage",
            "QUInt8Storage",
            "QUInt4x2Storage",
            "QUInt2x4Storage",
        ];
        let mut checked = 0;
        for name in ALL_DTYPES.iter().map(|d| d.name()).chain(storages) {
            assert!(
                name.ends_with("Storage") || DType::from_name(name).is_some(),
                "{name}"
            );
            assert!(
                !name.ends_with("Storage") || DType::from_storage_class(name).is_some(),
                "{name}"
            );
            assert_eq!(
                allow_list("torch", name),
                Some(AllowList::TorchWeightsOnly),
                "torch.{name}"
            );
            checked += 1;
        }
        assert_eq!(checked, ALL_DTYPES.len() + 17);
        assert_eq!(
            classify("torch.storage", "UntypedStorage"),
            GlobalClass::KnownSafe
        );
        assert_eq!(
            classify("torch.storage", "_load_from_bytes"),
            GlobalClass::Unlisted
        );
        assert_eq!(classify("tiny_models", "TinyNet"), GlobalClass::Unlisted);
        assert_eq!(classify("pydoc", "locate"), GlobalClass::Dangerous);
    }
}
