//! Phase two of reading a torch.save pickle: walk the recorded value tree and turn it into
//! named tensors and values. Only a fixed table of torch rebuild functions is interpreted;
//! every other call stays an opaque object. Names follow docs/CONTRACTS.md: key paths joined with
//! `.`, and `state_dict()` names for pickled `nn.Module`s.
//!
//! The walk over containers, objects and modules is here; the rebuild table (the calls
//! that make tensors, and their argument checks) is in `rebuild.rs`; numpy arrays (tensors
//! too) are in `ndarray.rs`; numpy scalars and other leaves that need decoding are in
//! `leaves.rs`.

mod leaves;
mod ndarray;
mod nested;
mod rebuild;

pub use rebuild::is_rebuild_function;

use std::collections::HashSet;
use std::path::Path;

use torchport_pickle::{NodeId, Object, Pickle, Value as PValue};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::format::parts::Found;
use crate::limits::Limits;
use crate::storage::Storage;
use crate::tensor::{
    check_view, contiguous_strides, view_bytes, ByteOrder, Quant, TensorData, TensorInfo,
};
use crate::value::Value;

/// What a persistent id stands for, as the container format resolves it.
pub(crate) enum Persistent {
    /// A storage (index into the reader's storage list) holding elements of `dtype`.
    Storage { index: usize, dtype: DType },
    /// A whole tensor (the tar format stores tensor records outside the pickle).
    Tensor(Box<TensorInfo>),
    /// Another pickle node stands in its place (the legacy format's `module` ids).
    Node(NodeId),
}

/// The container format's side of the walk: resolves persistent ids to storages.
pub(crate) trait Resolver {
    /// Resolve the payload of a `PERSID`/`BINPERSID`; errors are plain descriptions.
    fn persistent(&mut self, pickle: &Pickle, payload: NodeId) -> Result<Persistent, String>;
    /// Every storage resolved so far.
    fn storages(&self) -> &[Storage];
    /// Add a storage that is not one of the container's own (a numpy array's bytes, or
    /// one read from a `torch.save` file nested in the pickle, see `nested.rs`); its index
    /// among [`Resolver::storages`].
    fn add_storage(&mut self, storage: Storage) -> usize;
    /// Size of the whole file in bytes: the copy budget (`Limits::max_copied_bytes`) is at
    /// least 4 × this, so that legitimate names and values of any file fit.
    fn file_len(&self) -> usize {
        0
    }
}

/// Walk `pickle` from its root and name every tensor and value in it.
pub(crate) fn interpret(
    path: &Path,
    pickle: &Pickle,
    resolver: &mut dyn Resolver,
    order: ByteOrder,
    limits: &Limits,
) -> Result<Found> {
    let mut w = Walker::new(path, pickle, resolver, order, limits);
    w.walk(pickle.root(), "", 0).map_err(|e| *e)?;
    Ok(w.found)
}

/// Rebuild the one tensor at `node` (a call to a rebuild function from the fixed table),
/// naming it `name`; TorchScript archives name their tensors from the module tree.
pub(crate) fn tensor_at(
    path: &Path,
    pickle: &Pickle,
    resolver: &mut dyn Resolver,
    order: ByteOrder,
    limits: &Limits,
    node: NodeId,
    name: &str,
) -> Result<TensorInfo> {
    let mut w = Walker::new(path, pickle, resolver, order, limits);
    w.tensor_arg(node, name)
}

/// True when `node` is a call to one of the tensor rebuild functions.
pub(crate) fn is_tensor(pickle: &Pickle, node: NodeId) -> bool {
    pickle
        .as_object(node)
        .and_then(|o| pickle.as_global(o.callable))
        .is_some_and(|(m, f)| is_rebuild_function(m, f))
}

/// A measure of a pickle's size: 16 bytes per node plus every string, bytes and integer
/// payload. The copy budget scales with it, as the visit budget scales with the node count.
fn arena_bytes(p: &Pickle) -> usize {
    p.nodes().iter().fold(0usize, |n, v| {
        let payload = match v {
            PValue::Str(s) => s.len(),
            PValue::Bytes(b) | PValue::ByteArray(b) | PValue::BigInt(b) => b.len(),
            PValue::Global { module, name } => module.len() + name.len(),
            _ => 0,
        };
        n.saturating_add(16).saturating_add(payload)
    })
}

pub(crate) fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        // Exactly sized: names are charged to the copy budget by their length.
        let mut name = String::with_capacity(prefix.len() + 1 + key.len());
        name.push_str(prefix);
        name.push('.');
        name.push_str(key);
        name
    }
}

/// How deep the helpers that follow one node to another (a rebuild call's tensor argument,
/// a legacy `module` id, `_codecs.encode`'s text) may nest. Torch itself nests at most three
/// deep (`_rebuild_parameter` of `_rebuild_from_type_v2` of `_rebuild_tensor_v2`); the
/// bound keeps a hostile chain or cycle from recursing without end.
pub(crate) const MAX_CALL_NESTING: usize = 16;

/// Integers longer than this (about 150 digits) are shown by size, not in decimal.
const MAX_DECIMAL_BYTES: usize = 64;

/// The result of the functions on the walk's recursion path. The error is boxed so that
/// each `?` moves a pointer, not the whole error: this keeps every level's stack frame small.
type WalkResult = Boxed<()>;
type Boxed<T> = std::result::Result<T, Box<Error>>;

/// How a child's name is made from its parent's.
enum ChildKey {
    /// A list / tuple / argument index.
    Index(usize),
    /// A dict key node.
    Node(NodeId),
    /// Fixed text.
    Text(&'static str),
}

/// What [`Walker::object_kind`] decided an object is.
enum ObjectKind {
    /// Fully handled (a tensor, a numpy array or scalar, an unnamed call).
    Done,
    /// A pickled `nn.Module` with its class and BUILD state.
    Module(String, NodeId),
    /// A dict-like object: walk its SETITEMS entries.
    DictLike,
    /// Anything else, with its class name.
    Opaque(String),
}

struct Walker<'a> {
    path: &'a Path,
    p: &'a Pickle,
    r: &'a mut dyn Resolver,
    order: ByteOrder,
    limits: &'a Limits,
    visits: usize,
    max_visits: usize,
    /// The nodes on the path from the root to the one being walked (cycle detection).
    on_path: HashSet<NodeId>,
    /// Bytes copied into names and values so far, and the budget for them.
    copied: usize,
    max_copied: usize,
    /// Current nesting of `rebuild` calls (bounded by [`MAX_CALL_NESTING`]).
    rebuilds: usize,
    /// The storages made for numpy arrays, by their data node.
    arrays: ndarray::ArrayStorages,
    /// The `torch.save` files nested in the pickle read so far.
    nested: nested::Nested,
    found: Found,
}

impl<'a> Walker<'a> {
    /// A walker with budgets scaled to the pickle: visits to 4 × its nodes, copies to 4 ×
    /// its payload or the file (each at least the configured limit).
    fn new(
        path: &'a Path,
        pickle: &'a Pickle,
        resolver: &'a mut dyn Resolver,
        order: ByteOrder,
        limits: &'a Limits,
    ) -> Self {
        let file_len = resolver.file_len();
        Walker {
            path,
            p: pickle,
            r: resolver,
            order,
            limits,
            visits: 0,
            max_visits: limits.max_visits.max(pickle.len().saturating_mul(4)),
            on_path: HashSet::new(),
            copied: 0,
            max_copied: limits
                .max_copied_bytes
                .max(arena_bytes(pickle).max(file_len).saturating_mul(4)),
            rebuilds: 0,
            arrays: ndarray::ArrayStorages::default(),
            nested: nested::Nested::default(),
            found: Found::default(),
        }
    }

    // The walk recurses once per level of nesting (bounded by `Limits::max_depth`). The
    // functions on that recursion path — walk, walk_node, walk_seq, walk_items, object,
    // opaque, walk_state, module — only dispatch and loop; everything else is done in
    // helpers that return before the walk goes deeper, so each level's stack frames stay
    // small (tests/limits.rs measures the deepest walk on a small thread stack).

    fn walk(&mut self, id: NodeId, name: &str, depth: usize) -> WalkResult {
        self.enter(depth)?;
        if !self.on_path.insert(id) {
            return self.push_value(name, Value::Recursive);
        }
        let r = self.walk_node(id, name, depth);
        self.on_path.remove(&id);
        r
    }

    /// Count a visit and check the depth.
    #[inline(never)] // keeps its locals off the recursion path (see above)
    fn enter(&mut self, depth: usize) -> WalkResult {
        self.visits += 1;
        if self.visits > self.max_visits {
            return Err(Box::new(self.limit(
                "the object graph, counting shared references each time they are reached,",
                self.max_visits as u64,
                "max_visits",
            )));
        }
        self.check_depth(depth)
    }

    fn check_depth(&self, depth: usize) -> WalkResult {
        if depth > self.limits.max_depth {
            return Err(Box::new(self.limit(
                "nesting of containers",
                self.limits.max_depth as u64,
                "max_depth",
            )));
        }
        Ok(())
    }

    fn walk_node(&mut self, id: NodeId, name: &str, depth: usize) -> WalkResult {
        let p = self.p;
        match p.get(id) {
            PValue::List(items)
            | PValue::Tuple(items)
            | PValue::Set(items)
            | PValue::FrozenSet(items) => {
                if items.is_empty() {
                    self.push_empty(id, name)?;
                }
                self.walk_seq(items, name, "", depth)
            }
            PValue::Dict(items) => {
                if items.is_empty() {
                    self.push_value(name, Value::Empty("{}"))?;
                }
                self.walk_items(items, name, depth)
            }
            PValue::PersistentId(payload) => match self.persistent_leaf(*payload, name)? {
                Some(n) => self.walk(n, name, depth + 1),
                None => Ok(()),
            },
            PValue::Object(obj) => self.object(obj, name, depth),
            leaf => self.push_leaf(leaf, name),
        }
    }

    /// Items named by their index (with `prefix`: `arg0`, `arg1`, … for call arguments).
    fn walk_seq(&mut self, items: &[NodeId], name: &str, prefix: &str, depth: usize) -> WalkResult {
        for (i, &item) in items.iter().enumerate() {
            let child = self.child_name(name, prefix, ChildKey::Index(i))?;
            self.walk(item, &child, depth + 1)?;
        }
        Ok(())
    }

    fn walk_items(&mut self, items: &[(NodeId, NodeId)], name: &str, depth: usize) -> WalkResult {
        for &(k, v) in items {
            let child = self.child_name(name, "", ChildKey::Node(k))?;
            self.walk(v, &child, depth + 1)?;
        }
        Ok(())
    }

    /// `name.key`, charged to the copy budget.
    #[inline(never)] // keeps its locals off the recursion path (see above)
    fn child_name(&mut self, name: &str, prefix: &str, key: ChildKey) -> Boxed<String> {
        let key = match key {
            ChildKey::Index(i) => format!("{prefix}{i}"),
            ChildKey::Node(k) => self.key_string(k),
            ChildKey::Text(t) => t.to_string(),
        };
        let child = join(name, &key);
        self.charge(child.len())?;
        Ok(child)
    }

    #[inline(never)] // keeps its locals off the recursion path (see above)
    fn push_empty(&mut self, id: NodeId, name: &str) -> WalkResult {
        let kind = match self.p.get(id) {
            PValue::List(_) => "[]",
            PValue::Tuple(_) => "()",
            _ => "set()",
        };
        self.push_value(name, Value::Empty(kind))
    }

    #[inline(never)] // keeps its locals off the recursion path (see above)
    fn push_leaf(&mut self, leaf: &PValue, name: &str) -> WalkResult {
        let v = leaf_value(leaf);
        self.push_value(name, v)
    }

    /// Record a non-tensor value, charging its name and text to the copy budget.
    #[inline(never)] // keeps its locals off the recursion path (see above)
    fn push_value(&mut self, name: &str, v: Value) -> WalkResult {
        let text = match &v {
            Value::Str(s) | Value::BigInt(s) | Value::Global(s) | Value::Object(s) => s.len(),
            _ => 0,
        };
        self.charge(name.len().saturating_add(text))?;
        self.found.values.push((name.to_string(), v));
        Ok(())
    }

    /// Count bytes copied out of the pickle into names and values against the budget.
    fn charge(&mut self, n: usize) -> WalkResult {
        self.copied = self.copied.saturating_add(n);
        if self.copied > self.max_copied {
            return Err(Box::new(self.limit(
                "the text copied into names and values, counting shared references each time they are reached,",
                self.max_copied as u64,
                "max_copied_bytes",
            )));
        }
        Ok(())
    }

    /// A persistent id reached as a value: a bare storage becomes a 1-d tensor, a tar tensor
    /// record a tensor; a legacy `module` id stands for another node, returned to walk.
    #[inline(never)] // keeps its locals off the recursion path (see above)
    fn persistent_leaf(&mut self, payload: NodeId, name: &str) -> Boxed<Option<NodeId>> {
        let resolved = self
            .r
            .persistent(self.p, payload)
            .map_err(|what| Error::tensor(self.path, name, what))?;
        match resolved {
            Persistent::Storage { index, dtype } => {
                self.push_tensor(self.storage_tensor(index, dtype, name))?;
                Ok(None)
            }
            Persistent::Tensor(mut t) => {
                t.name = name.to_string();
                self.push_tensor(*t)?;
                Ok(None)
            }
            Persistent::Node(n) => Ok(Some(n)),
        }
    }

    /// A storage reached as a value: a 1-d tensor over all of it.
    fn storage_tensor(&self, index: usize, dtype: DType, name: &str) -> TensorInfo {
        TensorInfo {
            name: name.to_string(),
            dtype,
            shape: vec![self.storage_len(index) / dtype.size()],
            strides: vec![1],
            offset: 0,
            data: TensorData::Strided { storage: index },
            quant: None,
            requires_grad: false,
        }
    }

    fn key_string(&self, k: NodeId) -> String {
        match self.p.get(k) {
            PValue::Str(s) => s.clone(),
            PValue::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
            other => leaf_value(other).to_string(),
        }
    }

    /// The `(module, name)` a call refers to, following the legacy format's `module` ids.
    /// Borrowed from the pickle: a long name reached many times is never copied.
    fn callable(&mut self, id: NodeId) -> Option<(&'a str, &'a str)> {
        let p: &'a Pickle = self.p;
        let mut id = id;
        for _ in 0..MAX_CALL_NESTING {
            match p.get(id) {
                PValue::Global { module, name } => return Some((module, name)),
                PValue::PersistentId(payload) => match self.r.persistent(p, *payload) {
                    Ok(Persistent::Node(n)) => id = n,
                    _ => return None,
                },
                _ => return None,
            }
        }
        None
    }

    fn object(&mut self, obj: &'a Object, name: &str, depth: usize) -> WalkResult {
        match self.object_kind(obj, name)? {
            ObjectKind::Done => Ok(()),
            ObjectKind::Module(class, state) => self.module(&class, state, name, depth),
            ObjectKind::DictLike => self.walk_items(&obj.dict_items, name, depth),
            ObjectKind::Opaque(class) => self.opaque(obj, class, name, depth),
        }
    }

    /// What an object is: a tensor, numpy array or numpy scalar (recorded here), a pickled module, a
    /// dict-like object, or something to keep opaque.
    #[inline(never)] // keeps its locals off the recursion path (see above)
    fn object_kind(&mut self, obj: &Object, name: &str) -> Boxed<ObjectKind> {
        let Some((module, qual)) = self.callable(obj.callable) else {
            self.push_value(name, Value::Object("<unnamed callable>".into()))?;
            return Ok(ObjectKind::Done);
        };
        if is_rebuild_function(module, qual) {
            let t = self.rebuild(module, qual, &obj.args, name)?;
            self.push_tensor(t)?;
            return Ok(ObjectKind::Done);
        }
        if crate::format::torch::nested::is_load_from_bytes(module, qual) {
            // A storage pickled on its own (a nested torch.save file), like a bare storage id.
            let (index, dtype) = self.nested_storage(obj, name)?;
            self.push_tensor(self.storage_tensor(index, dtype, name))?;
            return Ok(ObjectKind::Done);
        }
        if let Some(v) = self.numpy_scalar(module, qual, &obj.args) {
            self.push_value(name, v)?;
            return Ok(ObjectKind::Done);
        }
        if self
            .numpy_array(module, qual, obj, name)
            .map_err(Box::new)?
        {
            return Ok(ObjectKind::Done);
        }
        // copyreg._reconstructor(cls, base, state) is how protocols 0 and 1 spell NEWOBJ.
        self.charge(module.len() + qual.len() + 1)?;
        let class = if module == "copyreg" && qual == "_reconstructor" {
            obj.args
                .first()
                .and_then(|&c| self.callable(c))
                .map(|(m, n)| format!("{m}.{n}"))
                .unwrap_or_else(|| "copyreg._reconstructor".into())
        } else {
            format!("{module}.{qual}")
        };
        if let Some(state) = obj.state {
            if self.is_module_state(state)? {
                return Ok(ObjectKind::Module(class, state));
            }
        }
        // Dict-like objects (OrderedDict, defaultdict) hold their entries as SETITEMS. The
        // BUILD state torch attaches to a state_dict (`_metadata`: module versions) is
        // bookkeeping for `load_state_dict`, not content, and is not shown.
        let dict_like = !obj.dict_items.is_empty() || class == "collections.OrderedDict";
        if dict_like && obj.list_items.is_empty() {
            if obj.dict_items.is_empty() {
                self.push_value(name, Value::Empty("{}"))?;
            }
            return Ok(ObjectKind::DictLike);
        }
        Ok(ObjectKind::Opaque(class))
    }

    /// An object torchport does not interpret: kept as a value, unless tensors live inside
    /// it, in which case its contents are named (attribute by attribute) so none is lost.
    fn opaque(&mut self, obj: &'a Object, class: String, name: &str, depth: usize) -> WalkResult {
        let mark = (
            self.found.tensors.len(),
            self.found.values.len(),
            self.found.modules.len(),
        );
        if let Some(state) = obj.state {
            self.walk_state(state, name, depth)?;
        }
        self.walk_seq(&obj.list_items, name, "", depth)?;
        self.walk_items(&obj.dict_items, name, depth)?;
        self.walk_seq(&obj.args, name, "arg", depth)?;
        if self.found.tensors.len() == mark.0 {
            self.found.values.truncate(mark.1);
            self.found.modules.truncate(mark.2);
            self.push_value(name, Value::Object(class))?;
        }
        Ok(())
    }

    /// A BUILD state: a dict of attributes, or `(dict, slots)` (whose parts may nest; each
    /// a dict or None, as pickle's BUILD reads a pair). Any other state (a
    /// `torch.ScriptObject`'s `(payload, class name)`, a custom `__getstate__` value) is
    /// named as a whole under `state`, so its items stay distinct: `OBJ.state.0.…`.
    fn walk_state(&mut self, state: NodeId, name: &str, depth: usize) -> WalkResult {
        self.check_depth(depth)?;
        let p = self.p;
        let dict_or_none = |id: &NodeId| matches!(p.get(*id), PValue::Dict(_) | PValue::None);
        match p.get(state) {
            PValue::Dict(items) => self.walk_items(items, name, depth),
            PValue::Tuple(parts) if parts.len() == 2 && parts.iter().all(dict_or_none) => {
                for &part in parts {
                    if !matches!(p.get(part), PValue::None) {
                        self.walk_state(part, name, depth + 1)?;
                    }
                }
                Ok(())
            }
            _ => {
                let child = self.child_name(name, "", ChildKey::Text("state"))?;
                self.walk(state, &child, depth + 1)
            }
        }
    }

    fn dict_entries(&self, id: NodeId) -> Option<&'a [(NodeId, NodeId)]> {
        let p: &'a Pickle = self.p;
        match p.get(id) {
            PValue::Dict(items) => Some(items),
            PValue::Object(o) => Some(&o.dict_items),
            _ => None,
        }
    }

    /// The value of `key` in a dict, the entries scanned charged to the visit count (a
    /// state dict shared by many objects is scanned once per object).
    fn dict_get(&mut self, id: NodeId, key: &str) -> Boxed<Option<NodeId>> {
        let Some(entries) = self.dict_entries(id) else {
            return Ok(None);
        };
        let found = entries
            .iter()
            .position(|(k, _)| self.p.as_str(*k) == Some(key));
        self.visits = self
            .visits
            .saturating_add(found.map_or(entries.len(), |i| i + 1));
        if self.visits > self.max_visits {
            return Err(Box::new(self.limit(
                "the object graph, counting shared references each time they are reached,",
                self.max_visits as u64,
                "max_visits",
            )));
        }
        Ok(found.and_then(|i| entries.get(i)).map(|&(_, v)| v))
    }

    fn is_module_state(&mut self, state: NodeId) -> Boxed<bool> {
        Ok(self.dict_get(state, "_parameters")?.is_some()
            && self.dict_get(state, "_modules")?.is_some())
    }

    /// A pickled `nn.Module`: name its tensors exactly as `state_dict()` would.
    fn module(&mut self, class: &str, state: NodeId, name: &str, depth: usize) -> WalkResult {
        for (key, v) in self.module_entries(class, state, name)? {
            let child = self.child_name(name, "", ChildKey::Node(key))?;
            self.walk(v, &child, depth + 1)?;
        }
        Ok(())
    }

    /// Record a module, and list what `state_dict()` would hold directly under it:
    /// parameters, persistent buffers, then child modules (`None` entries skipped).
    #[inline(never)] // keeps its locals off the recursion path (see above)
    fn module_entries(
        &mut self,
        class: &str,
        state: NodeId,
        name: &str,
    ) -> Boxed<Vec<(NodeId, NodeId)>> {
        self.charge(name.len().saturating_add(class.len()))?;
        self.found
            .modules
            .push((name.to_string(), class.to_string()));
        let p = self.p;
        let not_none = |v: &NodeId| !matches!(p.get(*v), PValue::None);
        let mut out = Vec::new();
        if let Some(params) = self.dict_get(state, "_parameters")? {
            let entries = self.dict_entries(params).unwrap_or_default();
            out.extend(entries.iter().filter(|(_, v)| not_none(v)));
        }
        let non_persistent: HashSet<String> =
            match self.dict_get(state, "_non_persistent_buffers_set")? {
                Some(s) => {
                    let names = self.strings(s, 0);
                    self.charge(names.iter().map(String::len).sum())?;
                    names.into_iter().collect()
                }
                None => HashSet::new(),
            };
        if let Some(buffers) = self.dict_get(state, "_buffers")? {
            let entries = self.dict_entries(buffers).unwrap_or_default();
            for &(k, v) in entries {
                if not_none(&v) && !non_persistent.contains(&self.key_string(k)) {
                    out.push((k, v));
                }
            }
        }
        if let Some(children) = self.dict_get(state, "_modules")? {
            let entries = self.dict_entries(children).unwrap_or_default();
            out.extend(entries.iter().filter(|(_, v)| not_none(v)));
        }
        Ok(out)
    }

    fn push_tensor(&mut self, t: TensorInfo) -> Result<()> {
        self.charge(t.name.len()).map_err(|e| *e)?;
        if self.found.tensors.len() >= self.limits.max_tensors {
            return Err(self.limit(
                "the number of tensors",
                self.limits.max_tensors as u64,
                "max_tensors",
            ));
        }
        self.found.tensors.push(t);
        Ok(())
    }

    fn limit(&self, what: &str, limit: u64, field: &'static str) -> Error {
        Error::Limit {
            path: self.path.to_path_buf(),
            what: what.to_string(),
            limit,
            field,
        }
    }

    fn storage_len(&self, index: usize) -> usize {
        self.r.storages().get(index).map_or(0, Storage::len)
    }
}

/// A pickle leaf as a value.
fn leaf_value(v: &PValue) -> Value {
    match v {
        PValue::None => Value::None,
        PValue::Bool(b) => Value::Bool(*b),
        PValue::Int(i) => Value::Int(*i),
        // Decimal conversion is quadratic in the length: huge integers are described.
        PValue::BigInt(bytes) if bytes.len() > MAX_DECIMAL_BYTES => {
            Value::BigInt(format!("<an integer of {} bytes>", bytes.len()))
        }
        PValue::BigInt(bytes) => Value::BigInt(torchport_pickle::bigint_to_decimal(bytes)),
        PValue::Float(f) => Value::Float(*f),
        PValue::Str(s) => Value::Str(s.clone()),
        PValue::Bytes(b) | PValue::ByteArray(b) => Value::Bytes(b.len()),
        PValue::Global { module, name } => Value::Global(format!("{module}.{name}")),
        _ => Value::Object("<unknown>".into()),
    }
}
