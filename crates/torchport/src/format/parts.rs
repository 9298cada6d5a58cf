//! What a format reader hands back: the parts [`crate::Checkpoint`] is assembled from. Readers
//! depend on this file, never on the checkpoint itself.

use crate::format::kind::Format;
use crate::storage::Storage;
use crate::tensor::{ByteOrder, TensorInfo};
use crate::value::Value;

/// The named leaves a reader found: tensors, non-tensor values, and modules.
#[derive(Default)]
pub(crate) struct Found {
    pub tensors: Vec<TensorInfo>,
    pub values: Vec<(String, Value)>,
    /// `(path, qualified class)` of each pickled `nn.Module`.
    pub modules: Vec<(String, String)>,
}

/// Everything a reader found in one file.
pub(crate) struct Parts {
    pub format: Format,
    /// `Big` only when all of the data is big-endian.
    pub order: ByteOrder,
    pub found: Found,
    /// Every global the file's pickles reference, first-seen order.
    pub globals: Vec<(String, String)>,
    pub storages: Vec<Storage>,
    /// A program's op targets and how many nodes call each (`.pt2`).
    pub graph_ops: Vec<(String, usize)>,
    /// A program's tensor constants (`.pt2`); they view `storages` like tensors do.
    pub constants: Vec<TensorInfo>,
    /// How many storages, at the end of `storages`, only constants view.
    pub constant_storages: usize,
    /// Serialized programs (`.pt2`).
    pub programs: Vec<ProgramRecord>,
    /// A TorchScript archive's module tree, code and constants.
    pub script: Option<std::sync::Arc<crate::script::Script>>,
}

/// A serialized program of a `.pt2` archive.
pub(crate) struct ProgramRecord {
    /// The record's name in the archive.
    pub record: String,
    /// Its JSON bytes, as stored.
    pub bytes: Storage,
    /// The typed IR, where it parsed the record at open ([`crate::Checkpoint::take_program`]
    /// hands it over; `None` for an archive opened unparsed).
    pub parsed: Option<Box<crate::pt2::ExportedProgram>>,
}

impl std::fmt::Debug for ProgramRecord {
    /// The record and its size, not the whole program.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgramRecord")
            .field("record", &self.record)
            .field("bytes", &self.bytes.bytes().len())
            .field("parsed", &self.parsed.is_some())
            .finish()
    }
}

impl Parts {
    /// The parts of a file read in byte order `order` (a reader that found one order for the
    /// whole file gives it here; numpy arrays in a pickle keep the order of their dtype).
    pub fn new(
        format: Format,
        order: ByteOrder,
        found: Found,
        globals: Vec<(String, String)>,
        storages: Vec<Storage>,
    ) -> Parts {
        // Every storage records its own byte order.
        let storages = match order {
            ByteOrder::Little => storages,
            ByteOrder::Big => storages
                .into_iter()
                .map(|s| s.in_file_order(ByteOrder::Big))
                .collect(),
        };
        // `Big` only when all the data is: a big-endian file can hold little-endian arrays.
        let order = match order {
            ByteOrder::Big if storages.iter().any(|s| s.byte_order() == ByteOrder::Little) => {
                ByteOrder::Little
            }
            other => other,
        };
        Parts {
            format,
            order,
            found,
            globals,
            storages,
            graph_ops: Vec::new(),
            constants: Vec::new(),
            constant_storages: 0,
            programs: Vec::new(),
            script: None,
        }
    }
}

/// What the security scan saw in a container: how many pickles it ran, every global they
/// reference (first-seen order, no repeats), and why any pickle stopped before its end (its
/// globals up to there are listed; the rest of it was not seen).
#[derive(Default)]
pub(crate) struct PickleGlobals {
    pub(crate) count: usize,
    pub(crate) globals: Vec<(String, String)>,
    pub(crate) problems: Vec<String>,
}

/// A list of globals without repeats, in first-seen order (a set beside it keeps merging
/// linear however many pickles and globals a hostile file holds).
#[derive(Default)]
pub(crate) struct GlobalList {
    list: Vec<(String, String)>,
    seen: std::collections::HashSet<(String, String)>,
}

impl GlobalList {
    /// Append the globals not seen yet.
    pub(crate) fn extend(&mut self, from: &[(String, String)]) {
        for g in from {
            if self.seen.insert(g.clone()) {
                self.list.push(g.clone());
            }
        }
    }

    /// The globals, first-seen order.
    pub(crate) fn into_vec(self) -> Vec<(String, String)> {
        self.list
    }
}
