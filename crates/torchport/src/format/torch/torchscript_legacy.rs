//! TorchScript archives of torch's first format (torch 1.0 to 1.2, `torch.jit.save` before
//! the module tree moved to `data.pkl`): `<root>/model.json` describes the module tree and a
//! table of tensors, each stored raw in a `<root>/tensors/<n>` record as its dims, strides
//! and element offset in that record describe; the code is in `<root>/code/*.py`. Modules
//! list their parameters by index into the table (`isBuffer` marks torch 1.0's buffers);
//! torch 1.2 keeps buffers as attributes of type `Tensor` instead, whose values are in
//! `<root>/attributes.pkl` (a tuple; a tensor there is `torch.jit._pickle.
//! build_tensor_from_id(<index into the table>)`).
//!
//! Only the weights are read (names as the loaded module's `state_dict()`: each module's
//! parameters, then its buffers, then its submodules); the code of this format is not run.
//! torch 2.15 no longer loads these archives.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value as Json;
use torchport_pickle::{Pickle, Value as PValue};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::format::archive::Archive;
use crate::format::kind::Format;
use crate::format::parts::{Found, Parts};
use crate::format::torch::zip::parse_record;
use crate::limits::Limits;
use crate::storage::Storage;
use crate::tensor::{check_view, ByteOrder, TensorData, TensorInfo};

/// The root folder of a first-format archive: the one holding `model.json`.
pub(crate) fn find_root(names: &[String]) -> Option<String> {
    super::zip::root_holding(names, "model.json")
}

/// Read the weights of the archive whose `model.json` is under `root`.
pub(crate) fn read(path: &Path, mut ar: Archive<'_>, root: &str, limits: &Limits) -> Result<Parts> {
    let bad = |what: String| Error::corrupt(path, format!("model.json: {what}"));
    let json = ar.record(&format!("{root}model.json"))?;
    // serde_json refuses nesting deeper than 128 levels with an error.
    let model: Json =
        serde_json::from_slice(json.bytes()).map_err(|e| bad(format!("not valid JSON ({e})")))?;
    let table = match model.get("tensors") {
        Some(Json::Array(t)) => t.as_slice(),
        None => &[],
        Some(_) => return Err(bad("'tensors' is not a list".into())),
    };
    let attributes_record = format!("{root}attributes.pkl");
    let attributes = match ar.has(&attributes_record) {
        true => Some(parse_record(path, &mut ar, &attributes_record, limits)?),
        false => None,
    };
    let main = model
        .get("mainModule")
        .ok_or_else(|| bad("no mainModule".into()))?;
    let mut reader = Reader {
        path,
        ar,
        root,
        limits,
        table,
        attributes: attributes.as_ref(),
        found: Found::default(),
        storages: Vec::new(),
        by_record: HashMap::new(),
    };
    reader.module(main, "", 0)?;
    let globals = attributes
        .as_ref()
        .map(|p| p.globals().to_vec())
        .unwrap_or_default();
    Ok(Parts::new(
        Format::TorchScript,
        ByteOrder::Little,
        reader.found,
        globals,
        reader.storages,
    ))
}

struct Reader<'a, 'f> {
    path: &'a Path,
    ar: Archive<'f>,
    root: &'a str,
    limits: &'a Limits,
    /// model.json's table of tensors.
    table: &'a [Json],
    attributes: Option<&'a Pickle>,
    found: Found,
    storages: Vec<Storage>,
    /// Storage index by record name (tensors that share a record share its storage).
    by_record: HashMap<String, usize>,
}

impl Reader<'_, '_> {
    fn bad(&self, what: String) -> Error {
        Error::corrupt(self.path, format!("model.json: {what}"))
    }

    /// One module (at `prefix`): its parameters, its buffers, then its submodules.
    fn module(&mut self, m: &Json, prefix: &str, depth: usize) -> Result<()> {
        if depth > self.limits.max_depth {
            return Err(Error::Limit {
                path: self.path.to_path_buf(),
                what: "the nesting of modules in model.json".into(),
                limit: self.limits.max_depth as u64,
                field: "max_depth",
            });
        }
        let list = |key: &str| match m.get(key) {
            Some(Json::Array(a)) => Ok(a.as_slice()),
            None => Ok(&[][..]),
            Some(_) => Err(self.bad(format!("'{key}' of module '{prefix}' is not a list"))),
        };
        let (params, attrs, subs) = (
            list("parameters")?,
            list("attributes")?,
            list("submodules")?,
        );
        let join = |name: &str| match prefix {
            "" => name.to_string(),
            p => format!("{p}.{name}"),
        };
        // Parameters, then buffers (torch 1.0's `isBuffer` parameters, torch 1.2's tensor
        // attributes), as `state_dict()` orders them.
        for buffers in [false, true] {
            for p in params {
                if p.get("isBuffer").and_then(Json::as_bool).unwrap_or(false) != buffers {
                    continue;
                }
                let name = self.string(p, "name")?;
                let id = self.index(p, "tensorId")?;
                self.tensor(&join(name), id)?;
            }
        }
        for a in attrs {
            if a.get("type").and_then(Json::as_str) != Some("Tensor") {
                continue;
            }
            let name = self.string(a, "name")?;
            let id = self.attribute_tensor(self.index(a, "id")?, name)?;
            self.tensor(&join(name), id)?;
        }
        for s in subs {
            let name = self.string(s, "name")?;
            self.module(s, &join(name), depth + 1)?;
        }
        Ok(())
    }

    fn string<'j>(&self, j: &'j Json, key: &str) -> Result<&'j str> {
        j.get(key)
            .and_then(Json::as_str)
            .ok_or_else(|| self.bad(format!("an entry without a string '{key}'")))
    }

    /// A non-negative integer written as a JSON string (protobuf's int64), or absent: 0.
    fn index(&self, j: &Json, key: &str) -> Result<usize> {
        j.get(key)
            .map_or(Some(0), size_of)
            .ok_or_else(|| self.bad(format!("'{key}' is not a non-negative integer")))
    }

    fn indices(&self, j: &Json, key: &str) -> Result<Vec<usize>> {
        let items = match j.get(key) {
            None => return Ok(Vec::new()),
            Some(Json::Array(a)) if a.len() <= self.limits.max_ndim => a,
            Some(_) => {
                return Err(self.bad(format!(
                    "'{key}' is not a list of at most {} numbers",
                    self.limits.max_ndim
                )))
            }
        };
        items
            .iter()
            .map(size_of)
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| self.bad(format!("'{key}' holds a value that is not a size")))
    }

    /// The table index of tensor attribute `id` (an item of `attributes.pkl`).
    fn attribute_tensor(&self, id: usize, name: &str) -> Result<usize> {
        let not = |what: &str| self.bad(format!("tensor attribute '{name}' {what}"));
        let p = self
            .attributes
            .ok_or_else(|| not("has no attributes.pkl"))?;
        let item = *p
            .as_tuple_or_list(p.root())
            .and_then(|items| items.get(id))
            .ok_or_else(|| not("is past the end of attributes.pkl"))?;
        let PValue::Object(call) = p.get(item) else {
            return Err(not("is not a tensor in attributes.pkl"));
        };
        let is_build = matches!(p.get(call.callable), PValue::Global { module, name }
            if module == "torch.jit._pickle" && name == "build_tensor_from_id");
        match (is_build, call.args.as_slice()) {
            (true, [arg]) => match p.get(*arg) {
                PValue::Int(i) => usize::try_from(*i).map_err(|_| not("has a negative index")),
                _ => Err(not("has an index that is not an int")),
            },
            _ => Err(not(
                "is not build_tensor_from_id(<index>) in attributes.pkl",
            )),
        }
    }

    /// Entry `id` of the table, named `name`.
    fn tensor(&mut self, name: &str, id: usize) -> Result<()> {
        let path = self.path;
        let bad = |what: String| Error::tensor(path, name, what);
        if self.found.tensors.len() >= self.limits.max_tensors {
            return Err(Error::Limit {
                path: path.to_path_buf(),
                what: "the number of tensors".into(),
                limit: self.limits.max_tensors as u64,
                field: "max_tensors",
            });
        }
        let entry = self
            .table
            .get(id)
            .ok_or_else(|| bad(format!("tensor {id} is past the end of model.json's table")))?;
        let dtype_name = entry.get("dataType").and_then(Json::as_str).unwrap_or("");
        let dtype = dtype_of(dtype_name).ok_or_else(|| {
            bad(format!(
                "its dataType '{dtype_name}' is not one torch writes"
            ))
        })?;
        let shape = self.indices(entry, "dims")?;
        let strides = self.indices(entry, "strides")?;
        if strides.len() != shape.len() {
            return Err(bad(format!(
                "{} dims but {} strides",
                shape.len(),
                strides.len()
            )));
        }
        let offset = self.index(entry, "offset")?;
        let key = entry
            .get("data")
            .and_then(|d| d.get("key"))
            .and_then(Json::as_str)
            .ok_or_else(|| bad("its entry names no data record".into()))?;
        let mut t = TensorInfo {
            name: name.to_string(),
            dtype,
            shape,
            strides,
            offset,
            data: TensorData::Meta,
            quant: None,
            requires_grad: entry
                .get("requiresGrad")
                .and_then(Json::as_bool)
                .unwrap_or(false),
        };
        if entry.get("isQuantized").and_then(Json::as_bool) == Some(true) {
            t.data = TensorData::Unsupported {
                what: "a quantized tensor of this format".into(),
            };
            self.found.tensors.push(t);
            return Ok(());
        }
        let record = format!("{}{key}", self.root);
        let index = match self.by_record.get(&record) {
            Some(&i) => i,
            None => {
                let storage = self.ar.record(&record).map_err(|e| match e {
                    Error::MissingRecord { .. } => {
                        bad(format!("its data record {record} is missing"))
                    }
                    other => other,
                })?;
                self.storages.push(storage);
                self.by_record
                    .insert(record.clone(), self.storages.len() - 1);
                self.storages.len() - 1
            }
        };
        let len = self.storages[index].len();
        check_view(dtype, &t.shape, &t.strides, offset, len)
            .map_err(|what| bad(format!("{what} (record {record})")))?;
        t.data = TensorData::Strided { storage: index };
        self.found.tensors.push(t);
        Ok(())
    }
}

/// A non-negative integer as protobuf's JSON writes an int64 (a string), or as a number.
fn size_of(v: &Json) -> Option<usize> {
    match v {
        Json::String(s) => s.parse().ok(),
        Json::Number(n) => n.as_u64().and_then(|n| usize::try_from(n).ok()),
        _ => None,
    }
}

/// The element type of a table entry's `dataType` (caffe2's `TensorProto` names).
fn dtype_of(name: &str) -> Option<DType> {
    Some(match name {
        "FLOAT" => DType::F32,
        "DOUBLE" => DType::F64,
        "FLOAT16" => DType::F16,
        "INT64" => DType::I64,
        "INT32" => DType::I32,
        "INT16" => DType::I16,
        "INT8" => DType::I8,
        "UINT8" => DType::U8,
        "BOOL" => DType::Bool,
        _ => return None,
    })
}
