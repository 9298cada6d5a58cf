//! `torch.export.save` archives (`.pt2`). Two layouts:
//!
//! - **packaged** (torch ≥ 2.8): `<root>/archive_format` = `pt2`, the program in
//!   `<root>/models/<name>.json`, weights in `<root>/data/weights/` described by
//!   `<name>_weights_config.json` (FQN → record, dtype, sizes, strides, offset; records are
//!   raw storage bytes shared by aliasing tensors, or a `torch.save` archive of the tensor
//!   when `use_pickle` is set), constants likewise in `<root>/data/constants/`. An archive
//!   may instead keep a model's weights as one `torch.save` state dict,
//!   `data/weights/<name>.pt` (and `data/constants/<name>.pt`), which torch still reads.
//! - **v0** (torch ≤ 2.7): records at the top level: `serialized_exported_program.json`,
//!   `serialized_state_dict.pt` and `serialized_constants.pt` (`torch.save` archives).
//!
//! Tensors are the program's `state_dict` (parameters and persistent buffers) named by their
//! FQNs in the file's order. Tensor constants (lifted tensors, non-persistent buffers) are
//! read the same way into `Checkpoint::constants`; they and script objects are also listed
//! among the values. The program JSON records are kept for `Checkpoint::programs`; the graph
//! is summarized as op target → count over the top-level nodes. Pickled script objects
//! (`custom_obj_*`, `opaque_obj_*`) and sample inputs are never read.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use crate::error::{Error, Result};
use crate::format::archive::Archive;
use crate::format::kind::Format;
use crate::format::parts::Found;
use crate::format::parts::{Parts, ProgramRecord};
use crate::format::pt2_json::{layout_name, PayloadConfig, PayloadMeta, Program};
use crate::format::torch::zip::{read_byteorder, read_parts};
use crate::limits::Limits;
use crate::storage::{FileBytes, Storage};
use crate::tensor::{check_view, contiguous_strides, ByteOrder, TensorData, TensorInfo};
use crate::value::Value;

/// The root folder of a packaged archive: the folder holding `archive_format`.
fn find_root<S: AsRef<str>>(names: &[S]) -> Option<String> {
    names
        .iter()
        .filter_map(|n| n.as_ref().strip_suffix("archive_format"))
        .filter(|r| r.is_empty() || (r.ends_with('/') && r.matches('/').count() == 1))
        .min_by_key(|r| r.len())
        .map(str::to_string)
}

/// True when record names look like a `.pt2` archive (either layout).
pub(crate) fn looks_like<S: AsRef<str>>(names: &[S]) -> bool {
    find_root(names).is_some() || names.iter().any(|n| n.as_ref() == V0_PROGRAM)
}

const V0_PROGRAM: &str = "serialized_exported_program.json";

pub(crate) fn read(path: &Path, file: &FileBytes, limits: &Limits) -> Result<Parts> {
    read_with(path, file, limits, true)
}

/// [`read`]; `parse`: whether each program is parsed (into the typed IR, its ops counted)
/// or only its bytes kept, for a caller that parses it itself (`open_pt2_unparsed`).
pub(crate) fn read_with(
    path: &Path,
    file: &FileBytes,
    limits: &Limits,
    parse: bool,
) -> Result<Parts> {
    let ar = Archive::new(path, file, limits)?;
    let names = ar.names();
    let mut b = Builder {
        path,
        ar,
        limits,
        parse,
        order: None,
        weights: Group::default(),
        constants: Group::default(),
        values: Vec::new(),
        globals: Vec::new(),
        programs: Vec::new(),
        ops: Vec::new(),
        op_index: HashMap::new(),
    };
    match find_root(&names) {
        Some(root) => b.packaged(&root, &names)?,
        None if names.iter().any(|n| n == V0_PROGRAM) => b.v0()?,
        None => {
            return Err(Error::corrupt(
                path,
                "the zip archive has neither an archive_format record nor serialized_exported_program.json; it is not a torch.export archive",
            ))
        }
    }
    let order = b.order.unwrap_or(ByteOrder::Little);
    // Constants view storages placed after the tensors' ones.
    let mut storages = b.weights.storages;
    let base = storages.len();
    let constant_storages = b.constants.storages.len();
    storages.extend(b.constants.storages);
    let mut constants = b.constants.tensors;
    for t in &mut constants {
        if let TensorData::Strided { storage } = &mut t.data {
            *storage += base;
        }
    }
    let found = Found {
        tensors: b.weights.tensors,
        values: b.values,
        modules: Vec::new(),
    };
    let mut parts = Parts::new(Format::Pt2, order, found, b.globals, storages);
    parts.graph_ops = b.ops;
    parts.constants = constants;
    parts.constant_storages = constant_storages;
    parts.programs = b.programs;
    Ok(parts)
}

/// Which list a tensor of the archive goes to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A `state_dict` entry (parameter or persistent buffer): `Checkpoint::tensors`.
    Weight,
    /// A tensor constant: `Checkpoint::constants`.
    Constant,
}

impl Kind {
    fn word(self) -> &'static str {
        match self {
            Kind::Weight => "weight",
            Kind::Constant => "constant",
        }
    }
}

/// The tensors of one kind and the storages they view.
#[derive(Default)]
struct Group {
    tensors: Vec<TensorInfo>,
    storages: Vec<Storage>,
    /// Raw payload record → storage index (aliasing tensors share one record).
    by_record: HashMap<String, usize>,
}

struct Builder<'a> {
    path: &'a Path,
    ar: Archive<'a>,
    limits: &'a Limits,
    /// Whether programs are parsed ([`read_with`]).
    parse: bool,
    order: Option<ByteOrder>,
    weights: Group,
    constants: Group,
    values: Vec<(String, Value)>,
    globals: Vec<(String, String)>,
    programs: Vec<ProgramRecord>,
    ops: Vec<(String, usize)>,
    op_index: HashMap<String, usize>,
}

impl Builder<'_> {
    fn packaged(&mut self, root: &str, names: &[String]) -> Result<()> {
        let format_record = format!("{root}archive_format");
        let kind = self.ar.record(&format_record)?;
        if kind.bytes().trim_ascii() != b"pt2" {
            return Err(Error::corrupt(
                self.path,
                format!(
                    "record {format_record} says {:?}; expected \"pt2\"",
                    String::from_utf8_lossy(kind.bytes().get(..64).unwrap_or(kind.bytes()))
                ),
            ));
        }
        self.order = Some(read_byteorder(self.path, &mut self.ar, root)?);
        let models: Vec<String> = names
            .iter()
            .filter_map(|n| {
                n.strip_prefix(root)?
                    .strip_prefix("models/")?
                    .strip_suffix(".json")
            })
            .filter(|m| !m.is_empty() && !m.contains('/'))
            .map(str::to_string)
            .collect();
        if models.is_empty() {
            return Err(Error::corrupt(
                self.path,
                format!("the archive holds no exported program (no {root}models/<name>.json record); AOTInductor packages are not read"),
            ));
        }
        for model in &models {
            // One program: plain FQNs. Several: each program's names under `<model>.`.
            let prefix = if models.len() == 1 {
                String::new()
            } else {
                format!("{model}.")
            };
            self.program(&format!("{root}models/{model}.json"))?;
            let legacy = format!("{root}data/weights/{model}.pt");
            if self.ar.has(&legacy) {
                self.nested_state_dict(&legacy, &prefix, Kind::Weight)?;
            } else {
                let record = format!("{root}data/weights/{model}_weights_config.json");
                let config: PayloadConfig = self.json(&record, "weights config")?;
                let dir = format!("{root}data/weights/");
                // One record per tensor, most of them seen once.
                self.weights.by_record.reserve(config.config.0.len());
                for (fqn, meta) in &config.config.0 {
                    let fqn: std::borrow::Cow<str> = if prefix.is_empty() {
                        fqn.into()
                    } else {
                        format!("{prefix}{fqn}").into()
                    };
                    self.payload(Kind::Weight, &dir, &fqn, meta)?;
                }
            }
            let legacy = format!("{root}data/constants/{model}.pt");
            let record = format!("{root}data/constants/{model}_constants_config.json");
            if self.ar.has(&legacy) {
                self.nested_state_dict(&legacy, &prefix, Kind::Constant)?;
            } else if self.ar.has(&record) {
                let config: PayloadConfig = self.json(&record, "constants config")?;
                let dir = format!("{root}data/constants/");
                for (fqn, meta) in &config.config.0 {
                    let fqn = format!("{prefix}{fqn}");
                    let class = match (&meta.tensor_meta, meta.path_name.as_str()) {
                        (Some(_), _) => "torch.Tensor",
                        (None, p) if p.starts_with("custom_obj_") => "torch.ScriptObject",
                        (None, _) => "pickled object",
                    };
                    if meta.tensor_meta.is_some() {
                        self.payload(Kind::Constant, &dir, &fqn, meta)?;
                    }
                    self.values.push((fqn, Value::Object(class.into())));
                }
            }
        }
        Ok(())
    }

    /// The torch ≤ 2.7 layout: top-level records, weights as one `torch.save` state dict.
    fn v0(&mut self) -> Result<()> {
        self.program(V0_PROGRAM)?;
        if !self.ar.has("serialized_state_dict.pt") && self.ar.has("serialized_state_dict.json") {
            return Err(Error::UnsupportedFormat {
                path: self.path.to_path_buf(),
                what: "a .pt2 archive whose weights are in serialized_state_dict.json (torch 2.1)"
                    .into(),
            });
        }
        self.nested_state_dict("serialized_state_dict.pt", "", Kind::Weight)?;
        if self.ar.has("serialized_constants.pt") {
            self.nested_state_dict("serialized_constants.pt", "", Kind::Constant)?;
        }
        Ok(())
    }

    /// Parse a JSON record into `T`; `what` names it in errors.
    fn json<T: DeserializeOwned>(&mut self, record: &str, what: &str) -> Result<T> {
        let bytes = self.ar.record(record)?;
        self.parse(record, &bytes, what)
    }

    fn parse<T: DeserializeOwned>(&self, record: &str, bytes: &Storage, what: &str) -> Result<T> {
        crate::pt2::from_json(bytes.bytes()).map_err(|e| {
            Error::corrupt(
                self.path,
                format!("record {record} is not a valid {what}: {e}"),
            )
        })
    }

    /// Read a program record: parse it with the typed IR, kept for a caller that takes it
    /// ([`crate::Checkpoint::take_program`]; torchport's runtime opens archives unparsed and
    /// parses the program itself, beside other work), and count its ops; where the IR
    /// refuses it (another schema major version, a union member added by a newer torch),
    /// count them from the lenient view of the targets alone. Keep its bytes (only them,
    /// where the builder does not parse programs).
    fn program(&mut self, record: &str) -> Result<()> {
        let bytes = self.ar.record(record)?;
        if !self.parse {
            self.programs.push(ProgramRecord {
                record: record.to_string(),
                bytes,
                parsed: None,
            });
            return Ok(());
        }
        let parsed = crate::pt2::parse_program(bytes.bytes()).ok().map(Box::new);
        match &parsed {
            Some(ep) => {
                let nodes = &ep.graph_module.graph.nodes;
                self.count_ops(nodes.iter().map(|n| n.target.as_str()))
            }
            None => {
                let program: Program = self.parse(record, &bytes, "program")?;
                let nodes = &program.graph_module.graph.nodes;
                self.count_ops(nodes.iter().map(|n| n.target.as_str()))
            }
        }
        let record = record.to_string();
        self.programs.push(ProgramRecord {
            record,
            bytes,
            parsed,
        });
        Ok(())
    }

    fn count_ops<'t>(&mut self, targets: impl Iterator<Item = &'t str>) {
        for target in targets {
            match self.op_index.get(target) {
                Some(&i) => self.ops[i].1 += 1,
                None => {
                    self.op_index.insert(target.to_string(), self.ops.len());
                    self.ops.push((target.to_string(), 1));
                }
            }
        }
    }

    /// Set the checkpoint's byte order, or check that `order` agrees with it.
    fn agree(&mut self, order: ByteOrder, record: &str) -> Result<()> {
        match self.order {
            Some(o) if o != order => Err(Error::corrupt(
                self.path,
                format!("record {record} is {order:?}-endian, but the archive is {o:?}-endian"),
            )),
            _ => {
                self.order = Some(order);
                Ok(())
            }
        }
    }

    fn group(&mut self, kind: Kind) -> &mut Group {
        match kind {
            Kind::Weight => &mut self.weights,
            Kind::Constant => &mut self.constants,
        }
    }

    /// Read a `torch.save` archive held in `record`: its tensors become state-dict entries
    /// or constants under `prefix` (constants are listed among the values too; other values
    /// of a constants archive are not kept).
    fn nested_state_dict(&mut self, record: &str, prefix: &str, kind: Kind) -> Result<()> {
        let parts = self.nested(record)?;
        self.agree(parts.order, record)?;
        let base = self.group(kind).storages.len();
        for mut t in parts.found.tensors {
            t.name = format!("{prefix}{}", t.name);
            if kind == Kind::Constant {
                let v = Value::Object("torch.Tensor".into());
                self.values.push((t.name.clone(), v));
            }
            if let TensorData::Strided { storage } = &mut t.data {
                *storage += base;
            }
            self.push(kind, t)?;
        }
        self.group(kind).storages.extend(parts.storages);
        if kind == Kind::Weight {
            for (name, v) in parts.found.values {
                self.values.push((format!("{prefix}{name}"), v));
            }
        }
        Ok(())
    }

    /// The parts of the `torch.save` archive stored in `record`; messages name the record.
    fn nested(&mut self, record: &str) -> Result<crate::format::torch::zip::SaveParts> {
        let storage = self.ar.record(record)?;
        let label = PathBuf::from(format!("{}/{record}", self.path.display()));
        let (file, range) = storage.parts();
        let parts = read_parts(
            &label,
            Archive::within(&label, file, range, self.limits)?,
            self.limits,
        )?;
        for g in &parts.globals {
            if !self.globals.contains(g) {
                self.globals.push(g.clone());
            }
        }
        Ok(parts)
    }

    /// Add a tensor or constant (both count against `max_tensors`).
    fn push(&mut self, kind: Kind, t: TensorInfo) -> Result<()> {
        if self.weights.tensors.len() + self.constants.tensors.len() >= self.limits.max_tensors {
            return Err(Error::Limit {
                path: self.path.to_path_buf(),
                what: "the number of tensors".into(),
                limit: self.limits.max_tensors as u64,
                field: "max_tensors",
            });
        }
        self.group(kind).tensors.push(t);
        Ok(())
    }

    /// One tensor entry of a weights or constants config: a view into a raw payload record,
    /// or a pickled tensor.
    fn payload(&mut self, kind: Kind, dir: &str, fqn: &str, meta: &PayloadMeta) -> Result<()> {
        let record = format!("{dir}{}", meta.path_name);
        let path = self.path;
        let bad = |what: String| Error::tensor(path, fqn, what);
        if meta.use_pickle {
            let mut parts = self.nested(&record)?;
            self.agree(parts.order, &record)?;
            if parts.found.tensors.len() != 1 || !parts.found.tensors[0].name.is_empty() {
                return Err(bad(format!(
                    "its pickled record {record} does not hold exactly one tensor"
                )));
            }
            let mut t = parts.found.tensors.remove(0);
            t.name = fqn.to_string();
            let group = self.group(kind);
            if let TensorData::Strided { storage } = &mut t.data {
                *storage += group.storages.len();
            }
            group.storages.extend(parts.storages);
            return self.push(kind, t);
        }
        let tm = meta
            .tensor_meta
            .as_ref()
            .ok_or_else(|| bad("its config entry has no tensor_meta".into()))?;
        let dtype = crate::pt2::scalar_type::dtype(tm.dtype).ok_or_else(|| {
            bad(format!(
                "its dtype number {} is not a known ScalarType",
                tm.dtype
            ))
        })?;
        if tm.sizes.len() > self.limits.max_ndim || tm.strides.len() != tm.sizes.len() {
            return Err(bad(format!(
                "its config declares {} sizes and {} strides (at most Limits::max_ndim = {}, and as many strides as sizes)",
                tm.sizes.len(),
                tm.strides.len(),
                self.limits.max_ndim
            )));
        }
        let ints = |v: &[crate::format::pt2_json::SymInt], what: &str| {
            v.iter()
                .map(|s| s.as_int.and_then(|i| usize::try_from(i).ok()))
                .collect::<Option<Vec<usize>>>()
                .ok_or_else(|| bad(format!("its {what} are not all non-negative integers (symbolic sizes are not read)")))
        };
        let shape = ints(&tm.sizes, "sizes")?;
        let strides = ints(&tm.strides, "strides")?;
        let offset = match tm.storage_offset.as_int.map(usize::try_from) {
            Some(Ok(offset)) => offset,
            _ => return Err(bad(
                "its storage offset is not a non-negative integer (symbolic sizes are not read)"
                    .into(),
            )),
        };
        let mut t = TensorInfo {
            name: fqn.to_string(),
            dtype,
            strides,
            shape,
            offset,
            data: TensorData::Meta,
            quant: None,
            requires_grad: tm.requires_grad,
        };
        if tm.layout != 7 {
            t.strides = contiguous_strides(&t.shape);
            t.data = TensorData::Unsupported {
                what: format!("a {} tensor", layout_name(tm.layout)),
            };
            return self.push(kind, t);
        }
        let index = match self.group(kind).by_record.get(&record) {
            Some(&i) => i,
            None => {
                let storage = self.ar.record(&record).map_err(|e| match e {
                    Error::MissingRecord { .. } => bad(format!(
                        "its {} record {record} is missing from the archive",
                        kind.word()
                    )),
                    other => other,
                })?;
                let group = self.group(kind);
                let i = group.storages.len();
                group.storages.push(storage);
                group.by_record.insert(record.clone(), i);
                i
            }
        };
        let len = self.group(kind).storages.get(index).map_or(0, Storage::len);
        if len == 0 && t.shape.iter().all(|&d| d > 0) {
            // torch writes no bytes for fake tensors (and loads zeros): no data was saved.
            check_view(dtype, &t.shape, &t.strides, offset, usize::MAX).map_err(bad)?;
            return self.push(kind, t);
        }
        check_view(dtype, &t.shape, &t.strides, offset, len)
            .map_err(|what| bad(format!("{what} (record {record}, as its config declares)")))?;
        t.data = TensorData::Strided { storage: index };
        self.push(kind, t)
    }
}
