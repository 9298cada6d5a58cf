//! `Checkpoint`: one opened file — its tensors (described, data read on demand), its
//! non-tensor values, the globals its pickles reference, and the storages behind the views.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::format;
use crate::format::kind::Format;
use crate::format::parts::{Parts, ProgramRecord};
use crate::limits::Limits;
use crate::storage::Storage;
use crate::tensor::{view_bytes, ByteOrder, TensorData, TensorInfo};
use crate::value::Value;

/// An opened checkpoint. Opening reads only the container's directory and its pickles;
/// tensor data is read (from the memory map) when asked for.
#[derive(Debug)]
pub struct Checkpoint {
    pub(crate) path: PathBuf,
    pub(crate) format: Format,
    pub(crate) order: ByteOrder,
    pub(crate) tensors: Vec<TensorInfo>,
    pub(crate) values: Vec<(String, Value)>,
    pub(crate) globals: Vec<(String, String)>,
    pub(crate) modules: Vec<(String, String)>,
    pub(crate) graph_ops: Vec<(String, usize)>,
    /// Tensor constants of a program (`.pt2`); they view `storages` like tensors do.
    pub(crate) constants: Vec<TensorInfo>,
    /// How many storages, at the end of `storages`, only constants view.
    pub(crate) constant_storages: usize,
    /// Serialized programs of a `.pt2`.
    pub(crate) programs: Vec<ProgramRecord>,
    /// For a TorchScript archive: its module tree, code and constants.
    pub(crate) script: Option<std::sync::Arc<crate::script::Script>>,
    pub(crate) storages: Vec<Storage>,
    pub(crate) index: HashMap<String, usize>,
    /// `Limits::max_expanded_bytes` of the open that made this checkpoint.
    pub(crate) max_expanded_bytes: u64,
}

/// Open a checkpoint with the default [`Limits`]; the format is detected from the content.
///
/// ```no_run
/// let ckpt = torchport::open("model.pt")?;
/// for t in ckpt.tensors() {
///     println!("{} {} {:?}", t.name, t.dtype, t.shape);
/// }
/// # Ok::<(), torchport::Error>(())
/// ```
pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint> {
    open_with(path, &Limits::default())
}

/// Open a checkpoint with explicit resource limits.
pub fn open_with(path: impl AsRef<Path>, limits: &Limits) -> Result<Checkpoint> {
    open_path(path.as_ref(), limits, None)
}

/// [`open_with`] as the given format, skipping content detection: for a caller that reads
/// one format only (the runtime reads `.pt2` archives), which saves detection's pass over a
/// zip archive's directory. The reader of that format checks the file as it always does, so
/// a file of another format is refused, by that reader's error; [`crate::detect_file`] then
/// says what the file is.
pub fn open_as(path: impl AsRef<Path>, format: Format, limits: &Limits) -> Result<Checkpoint> {
    open_path(path.as_ref(), limits, Some(format))
}

/// [`open_as`] with [`Format::Pt2`], leaving the programs unparsed: for a caller that
/// parses the program itself ([`crate::pt2::parse_program`] on the bytes
/// [`Checkpoint::programs`] gives), later or beside other work. The records are read and
/// checked, and the tensors and constants listed, as [`open_as`] does; but the programs'
/// JSON is not looked at, so [`Checkpoint::take_program`] gives `None` and
/// [`Checkpoint::graph_ops`] is empty. The runtime opens archives so, and maps the archive's
/// pages in on another thread while it parses the program (EfficientNet-B0's program took
/// 0.96–0.98 ms of a 4.5–4.6 ms load on 2 threads; BENCHMARKS.md, issue 14).
pub fn open_pt2_unparsed(path: impl AsRef<Path>, limits: &Limits) -> Result<Checkpoint> {
    let path = path.as_ref();
    let mut c = Checkpoint::from_parts(path, format::open_pt2_unparsed(path, limits)?);
    c.max_expanded_bytes = limits.max_expanded_bytes;
    Ok(c)
}

fn open_path(path: &Path, limits: &Limits, format: Option<Format>) -> Result<Checkpoint> {
    let mut c = Checkpoint::from_parts(path, format::open(path, limits, format)?);
    c.max_expanded_bytes = limits.max_expanded_bytes;
    Ok(c)
}

/// Read a checkpoint from bytes already in memory; `name` only labels it in messages.
///
/// Nothing outside the bytes is read: a sharded index or an ONNX model with external data,
/// whose tensors live in other files, is refused (open those by path).
pub fn open_bytes(name: &str, bytes: Vec<u8>, limits: &Limits) -> Result<Checkpoint> {
    read_bytes(name, bytes, limits, None)
}

/// [`open_bytes`] as the given format, skipping content detection: for bytes whose format
/// the caller knows (an ONNX model, which has no magic number, that [`crate::detect`] does
/// not recognize). The reader of that format checks the bytes as it always does.
pub fn open_bytes_as(
    name: &str,
    bytes: Vec<u8>,
    format: Format,
    limits: &Limits,
) -> Result<Checkpoint> {
    read_bytes(name, bytes, limits, Some(format))
}

fn read_bytes(
    name: &str,
    bytes: Vec<u8>,
    limits: &Limits,
    format: Option<Format>,
) -> Result<Checkpoint> {
    let file = crate::storage::FileBytes::Owned(std::sync::Arc::new(bytes));
    let path = Path::new(name);
    let mut c = Checkpoint::from_parts(path, format::read(path, &file, limits, format)?);
    c.max_expanded_bytes = limits.max_expanded_bytes;
    Ok(c)
}

impl Checkpoint {
    /// Assemble a checkpoint from what a format reader found in the file at `path`.
    pub(crate) fn from_parts(path: &Path, parts: Parts) -> Checkpoint {
        let Parts {
            format,
            order,
            found,
            globals,
            storages,
            graph_ops,
            constants,
            constant_storages,
            programs,
            script,
        } = parts;
        let mut index = HashMap::with_capacity(found.tensors.len());
        for (i, t) in found.tensors.iter().enumerate() {
            index.entry(t.name.clone()).or_insert(i);
        }
        Checkpoint {
            path: path.to_path_buf(),
            format,
            order,
            tensors: found.tensors,
            values: found.values,
            globals,
            modules: found.modules,
            graph_ops,
            constants,
            constant_storages,
            programs,
            script,
            storages,
            index,
            max_expanded_bytes: Limits::default().max_expanded_bytes,
        }
    }

    /// The file this checkpoint was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The detected format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Byte order of the stored data (data is always handed out little-endian). Files that
    /// can mix orders (an npz of arrays saved on different machines, a sharded checkpoint)
    /// say `Big` only when all of their data is big-endian; [`Storage::byte_order`] gives
    /// each storage's own order.
    pub fn byte_order(&self) -> ByteOrder {
        self.order
    }

    /// Every tensor, in the order the file holds them (depth-first, dict insertion order).
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor of this name, if any.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).and_then(|&i| self.tensors.get(i))
    }

    /// Non-tensor leaves (`epoch`, `optimizer.param_groups.0.lr`, …) with their names.
    pub fn values(&self) -> &[(String, Value)] {
        &self.values
    }

    /// Every global (`module`, `name`) the file's pickles reference, first-seen order.
    pub fn globals(&self) -> &[(String, String)] {
        &self.globals
    }

    /// For a pickled `nn.Module` or a TorchScript archive: each module's path (`""` for the
    /// root) and qualified class (`__torch__.torch.nn.modules.linear.Linear` for TorchScript).
    pub fn modules(&self) -> &[(String, String)] {
        &self.modules
    }

    /// For a program (`.pt2`): each op target its top-level graph calls
    /// (`torch.ops.aten.conv2d.default`, `_operator.getitem`) and how many nodes call it,
    /// in order of first use. Empty for files that hold no program.
    pub fn graph_ops(&self) -> &[(String, usize)] {
        &self.graph_ops
    }

    /// For a program (`.pt2`): its tensor constants — lifted tensor constants
    /// (`lifted_tensor_0`) and non-persistent buffers — named by their FQNs, in the file's
    /// order. They are not in the program's `state_dict`, so [`Checkpoint::tensors`] does not
    /// list them (they are listed among [`Checkpoint::values`] too). Their data is read with
    /// [`Checkpoint::data`], from views checked against their records like tensors'. Script
    /// objects are not tensors and are only values. For a TorchScript archive: the tensors of
    /// its module tree that are not in `state_dict` (plain tensor attributes, tensors inside
    /// lists) and the code's constants (`CONSTANTS.c0`, …). Empty for other files.
    pub fn constants(&self) -> &[TensorInfo] {
        &self.constants
    }

    /// For a program (`.pt2`): each serialized program as (record name, JSON bytes), e.g.
    /// (`model/models/model.json`, …), or `serialized_exported_program.json` for the torch ≤
    /// 2.7 layout. The bytes are the record as stored. Empty for files that hold no program.
    pub fn programs(&self) -> impl ExactSizeIterator<Item = (&str, &[u8])> {
        self.programs
            .iter()
            .map(|p| (p.record.as_str(), p.bytes.bytes()))
    }

    /// For a program (`.pt2`): the program of record `record` (a name [`Checkpoint::programs`]
    /// lists) as the typed IR parsed it at open, handed over, so that a caller does not parse
    /// the JSON a second time. `None` where the IR could not parse the record (opening still
    /// counts its ops, [`Checkpoint::graph_ops`], from a lenient view of the targets alone;
    /// [`crate::pt2::parse_program`] on its bytes says why), where no record has that name,
    /// where the archive was opened unparsed ([`crate::open_pt2_unparsed`]), or once taken.
    pub fn take_program(&mut self, record: &str) -> Option<crate::pt2::ExportedProgram> {
        let p = self.programs.iter_mut().find(|p| p.record == record)?;
        p.parsed.take().map(|ep| *ep)
    }

    /// For a TorchScript archive (`torch.jit.save`): its module tree with every attribute,
    /// its code records and its constants, for a runtime that runs the code. `None` for other
    /// formats.
    pub fn script(&self) -> Option<&crate::script::Script> {
        self.script.as_deref()
    }

    /// Number of distinct storages behind the tensors (those behind constants only are not
    /// counted).
    pub fn storage_count(&self) -> usize {
        self.storages.len().saturating_sub(self.constant_storages)
    }

    /// The index of the storage a tensor views, if it has data (tensors that share an index
    /// share memory: views and tied weights).
    pub fn storage_of(&self, t: &TensorInfo) -> Option<usize> {
        match t.data {
            TensorData::Strided { storage } => Some(storage),
            _ => None,
        }
    }

    /// Tied tensors: for each of [`Checkpoint::tensors`], the index of the first earlier tensor
    /// that is the very same view of the same storage (dtype, shape, strides and offset), as
    /// `torch.save` writes a weight shared by two modules (`self.head.weight =
    /// self.embed.weight`): one storage under two names. `None` for the first (or only) name.
    pub fn tied(&self) -> Vec<Option<usize>> {
        type Key<'k> = (usize, crate::DType, &'k [usize], &'k [usize], usize);
        let mut first: HashMap<Key<'_>, usize> = HashMap::new();
        self.tensors
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let storage = self.storage_of(t)?;
                let key = (storage, t.dtype, &t.shape[..], &t.strides[..], t.offset);
                match first.entry(key) {
                    std::collections::hash_map::Entry::Occupied(e) => Some(*e.get()),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(i);
                        None
                    }
                }
            })
            .collect()
    }

    /// The storage a tensor views, if it has data.
    pub fn storage(&self, t: &TensorInfo) -> Option<&Storage> {
        self.storage_of(t).and_then(|i| self.storages.get(i))
    }

    /// The tensor's data as contiguous little-endian bytes in row-major order: borrowed from
    /// the memory map with no copy when the stored view already is, copied otherwise.
    /// Quantized tensors give their integer representation.
    pub fn data(&self, t: &TensorInfo) -> Result<Cow<'_, [u8]>> {
        match &t.data {
            TensorData::Strided { storage } => {
                let s = self.storages.get(*storage).ok_or_else(|| {
                    Error::tensor(
                        &self.path,
                        &t.name,
                        "refers to a storage that does not exist",
                    )
                })?;
                // Views were checked against their storage when the file was opened; check
                // again so that a hand-built TensorInfo cannot read out of bounds.
                let nbytes =
                    crate::tensor::check_view(t.dtype, &t.shape, &t.strides, t.offset, s.len())
                        .map_err(|what| Error::tensor(&self.path, &t.name, what))?;
                // Only overlapping views can be larger than their storage.
                if nbytes > s.len() && nbytes as u64 > self.max_expanded_bytes {
                    return Err(Error::Limit {
                        path: self.path.clone(),
                        what: format!(
                            "tensor {}'s data ({nbytes} bytes from a {}-byte storage: an expanded or overlapping view)",
                            t.name,
                            s.len()
                        ),
                        limit: self.max_expanded_bytes,
                        field: "max_expanded_bytes",
                    });
                }
                Ok(view_bytes(t, s.bytes(), s.byte_order()))
            }
            TensorData::Meta => Err(Error::Unsupported {
                path: self.path.clone(),
                tensor: t.name.clone(),
                what: "a meta tensor (it was saved without data)".into(),
            }),
            TensorData::Unsupported { what } => Err(Error::Unsupported {
                path: self.path.clone(),
                tensor: t.name.clone(),
                what: what.clone(),
            }),
        }
    }

    /// Where `t`'s bytes lie in the input file, when [`Checkpoint::data`] would borrow them
    /// unchanged from the memory map (a contiguous, little-endian, non-empty view of a
    /// mapped storage): writers then copy them file to file. `None` otherwise, and whenever
    /// `data` would fail (it then reports why).
    pub(crate) fn file_range(&self, t: &TensorInfo) -> Option<crate::storage::FileRange> {
        let TensorData::Strided { storage } = &t.data else {
            return None;
        };
        let s = self.storages.get(*storage)?;
        let nbytes =
            crate::tensor::check_view(t.dtype, &t.shape, &t.strides, t.offset, s.len()).ok()?;
        let little = s.byte_order() == ByteOrder::Little || t.dtype.swap_width() <= 1;
        if nbytes == 0 || !t.is_contiguous() || !little {
            return None;
        }
        let start = t.offset.checked_mul(t.dtype.size())?;
        s.file_range(start..start.checked_add(nbytes)?)
    }

    /// Map the pages of every storage (of tensors and constants) into the process ahead of
    /// reading them ([`Storage::populate`]): a reader that will copy every tensor out of a
    /// memory-mapped file can have another thread fault its pages in meanwhile. A no-op for
    /// data held in memory and off Linux. Returns whether every mapped storage's pages were
    /// mapped in.
    pub fn populate(&self) -> bool {
        let mut all = true;
        for s in &self.storages {
            all &= s.populate();
        }
        all
    }

    /// Hint that `t`'s bytes will not be read again soon: drops its storage's pages from this
    /// process's resident memory (they stay in the OS page cache and come back transparently
    /// when read). Writers call it after each tensor, so converting a file keeps about one
    /// tensor resident instead of the whole memory-mapped file.
    pub fn release(&self, t: &TensorInfo) {
        if let Some(s) = self.storage(t) {
            s.release();
        }
    }

    /// Hint that `bytes`, a part of this checkpoint's memory-mapped file (a slice borrowed
    /// from [`Checkpoint::data`], or any stretch of one), will not be read again soon: drops
    /// those pages from resident memory, as [`Checkpoint::release`] does for a whole storage.
    /// Lets a reader release a large tensor stretch by stretch while copying it. Bytes that
    /// are not part of the mapped file are left alone.
    pub fn release_bytes(&self, bytes: &[u8]) {
        if let Some(s) = self
            .storages
            .iter()
            .find(|s| s.mapped_offset(bytes).is_some())
        {
            s.release_bytes(bytes);
        }
    }

    /// The data of the tensor named `name`.
    pub fn data_by_name(&self, name: &str) -> Result<Cow<'_, [u8]>> {
        let t = self.tensor(name).ok_or_else(|| Error::NoSuchTensor {
            path: self.path.clone(),
            name: name.to_string(),
        })?;
        self.data(t)
    }

    /// Total number of elements over all tensors.
    pub fn parameter_count(&self) -> u64 {
        self.tensors
            .iter()
            .fold(0u64, |n, t| n.saturating_add(t.numel() as u64))
    }

    /// Total bytes over all tensors, counted per tensor (shared storage counted each time).
    pub fn total_bytes(&self) -> u64 {
        self.tensors
            .iter()
            .fold(0u64, |n, t| n.saturating_add(t.nbytes() as u64))
    }
}
