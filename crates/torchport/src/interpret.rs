//! Phase two of reading a torch.save pickle: walk the recorded value tree and turn it into
//! named tensors and values. Only a fixed table of torch rebuild functions is interpreted;
//! every other call stays an opaque object. Names follow DESIGN.md: key paths joined with
//! `.`, and `state_dict()` names for pickled `nn.Module`s.

use std::collections::HashSet;
use std::path::Path;

use torchport_pickle::{NodeId, Object, Pickle, Value as PValue};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::limits::Limits;
use crate::storage::Storage;
use crate::tensor::{check_view, view_bytes, ByteOrder, Quant, TensorData, TensorInfo};
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
    /// Size of the whole file in bytes: the copy budget (`Limits::max_copied_bytes`) is at
    /// least 4 × this, so that legitimate names and values of any file fit.
    fn file_len(&self) -> usize {
        0
    }
}

/// What the walk found.
#[derive(Default)]
pub(crate) struct Found {
    pub tensors: Vec<TensorInfo>,
    pub values: Vec<(String, Value)>,
    /// `(path, qualified class)` of each pickled `nn.Module`.
    pub modules: Vec<(String, String)>,
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

/// The fixed table of calls that build tensors.
const REBUILD_FUNCTIONS: &[(&str, &str)] = &[
    ("torch._utils", "_rebuild_tensor"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_tensor_v3"),
    ("torch._utils", "_rebuild_parameter"),
    ("torch._utils", "_rebuild_parameter_with_state"),
    ("torch._utils", "_rebuild_qtensor"),
    ("torch._utils", "_rebuild_meta_tensor_no_storage"),
    ("torch._utils", "_rebuild_sparse_tensor"),
    ("torch._utils", "_rebuild_nested_tensor"),
    ("torch._utils", "_rebuild_device_tensor_from_numpy"),
    ("torch._utils", "_rebuild_device_tensor_from_cpu_tensor"),
    ("torch._utils", "_rebuild_xla_tensor"),
    ("torch._utils", "_rebuild_wrapper_subclass"),
    ("torch._tensor", "_rebuild_from_type"),
    ("torch._tensor", "_rebuild_from_type_v2"),
];

/// True for the globals torch.save uses to rebuild tensors (the known-safe table).
pub fn is_rebuild_function(module: &str, name: &str) -> bool {
    REBUILD_FUNCTIONS.contains(&(module, name))
}

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
    /// Fully handled (a tensor, a numpy scalar, an unnamed call).
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
                let n = self.storage_len(index) / dtype.size();
                self.push_tensor(TensorInfo {
                    name: name.to_string(),
                    dtype,
                    shape: vec![n],
                    strides: vec![1],
                    offset: 0,
                    data: TensorData::Strided { storage: index },
                    quant: None,
                    requires_grad: false,
                })?;
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

    /// What an object is: a tensor or numpy scalar (recorded here), a pickled module, a
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
        if let Some(v) = self.numpy_scalar(module, qual, &obj.args) {
            self.push_value(name, v)?;
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

    /// A BUILD state: a dict of attributes, or `(dict, slots)` (whose parts may nest).
    fn walk_state(&mut self, state: NodeId, name: &str, depth: usize) -> WalkResult {
        self.check_depth(depth)?;
        let p = self.p;
        match p.get(state) {
            PValue::Dict(items) => self.walk_items(items, name, depth),
            PValue::Tuple(parts) if parts.len() == 2 => {
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

    // ----- the rebuild table -----

    /// Interpret one call of the rebuild table (these nest: a parameter wraps a tensor).
    fn rebuild(
        &mut self,
        module: &str,
        func: &str,
        args: &[NodeId],
        name: &str,
    ) -> Result<TensorInfo> {
        if self.rebuilds >= MAX_CALL_NESTING {
            return Err(Error::tensor(
                self.path,
                name,
                format!("its rebuild calls nest more than {MAX_CALL_NESTING} deep"),
            ));
        }
        self.rebuilds += 1;
        let r = self.rebuild_call(module, func, args, name);
        self.rebuilds -= 1;
        r
    }

    fn rebuild_call(
        &mut self,
        module: &str,
        func: &str,
        args: &[NodeId],
        name: &str,
    ) -> Result<TensorInfo> {
        let bad = |what: String| Error::tensor(self.path, name, what);
        let arg = |i: usize| {
            args.get(i)
                .copied()
                .ok_or_else(|| bad(format!("{module}.{func} needs argument {i}")))
        };
        match func {
            "_rebuild_tensor" | "_rebuild_tensor_v2" | "_rebuild_tensor_v3"
            | "_rebuild_qtensor" => {
                let (index, storage_dtype) = self.storage_arg(arg(0)?, name)?;
                let offset = self.usize_arg(arg(1)?, name, "storage offset")?;
                let shape = self.usize_list(arg(2)?, name, "size")?;
                let strides = self.usize_list(arg(3)?, name, "stride")?;
                let mut dtype = storage_dtype;
                let mut quant = None;
                let mut requires_grad = false;
                match func {
                    "_rebuild_tensor_v2" => requires_grad = self.bool_arg(args.get(4)),
                    "_rebuild_tensor_v3" => {
                        requires_grad = self.bool_arg(args.get(4));
                        dtype = self.dtype_arg(arg(6)?, name)?;
                    }
                    "_rebuild_qtensor" => {
                        quant = Some(self.quant_arg(arg(4)?, name)?);
                        requires_grad = self.bool_arg(args.get(5));
                    }
                    _ => {}
                }
                self.strided(
                    name,
                    dtype,
                    shape,
                    strides,
                    offset,
                    index,
                    quant,
                    requires_grad,
                )
            }
            "_rebuild_parameter" | "_rebuild_parameter_with_state" => {
                let mut t = self.tensor_arg(arg(0)?, name)?;
                t.requires_grad = self.bool_arg(args.get(1));
                Ok(t)
            }
            "_rebuild_from_type" | "_rebuild_from_type_v2" => {
                // (func, new_type, args, state): func(*args), then a subclass cast.
                let inner = arg(0)?;
                let Some((m, f)) = self.callable(inner) else {
                    return Err(bad("the wrapped rebuild function is not a global".into()));
                };
                if !is_rebuild_function(m, f) {
                    return Err(bad(format!(
                        "the wrapped function {m}.{f} is not a tensor rebuild function"
                    )));
                }
                let p: &'a Pickle = self.p;
                let inner_args = p
                    .as_tuple_or_list(arg(2)?)
                    .ok_or_else(|| bad("the wrapped arguments are not a tuple".into()))?;
                self.rebuild(m, f, inner_args, name)
            }
            "_rebuild_meta_tensor_no_storage" => {
                let dtype = self.dtype_arg(arg(0)?, name)?;
                let shape = self.usize_list(arg(1)?, name, "size")?;
                let strides = self.usize_list(arg(2)?, name, "stride")?;
                check_view(dtype, &shape, &strides, 0, usize::MAX).map_err(bad)?;
                Ok(TensorInfo {
                    name: name.to_string(),
                    dtype,
                    shape,
                    strides,
                    offset: 0,
                    data: TensorData::Meta,
                    quant: None,
                    requires_grad: self.bool_arg(args.get(3)),
                })
            }
            "_rebuild_sparse_tensor" => {
                // The layout is `torch.serialization._get_layout('torch.sparse_coo')`.
                let layout = match args.first().map(|&l| self.p.get(l)) {
                    Some(PValue::Object(o)) => o.args.first().and_then(|&a| self.p.as_str(a)),
                    Some(PValue::Str(s)) => Some(s.as_str()),
                    _ => None,
                };
                let layout = layout
                    .unwrap_or("sparse")
                    .trim_start_matches("torch.")
                    .to_string();
                // data = (indices, values, size, …): take dtype and size from the values.
                let parts = args
                    .get(1)
                    .and_then(|&d| self.p.as_tuple_or_list(d))
                    .map(<[NodeId]>::to_vec)
                    .unwrap_or_default();
                // COO: (indices, values, size, …); compressed: (ci, pi, values, size).
                let values = parts.get(if layout == "sparse_coo" { 1 } else { 2 });
                let dtype = match values {
                    Some(&v) => self.tensor_arg(v, name)?.dtype,
                    None => DType::F32,
                };
                let shape = parts
                    .iter()
                    .find_map(|&s| self.usize_list(s, name, "size").ok())
                    .unwrap_or_default();
                self.unsupported(name, dtype, shape, format!("a {layout} tensor"))
            }
            other => self.unsupported(
                name,
                DType::F32,
                Vec::new(),
                format!("a tensor rebuilt by {module}.{other}"),
            ),
        }
    }

    /// A tensor whose data is not read; its shape must still describe a size that fits.
    fn unsupported(
        &self,
        name: &str,
        dtype: DType,
        shape: Vec<usize>,
        what: String,
    ) -> Result<TensorInfo> {
        let strides = contiguous_strides(&shape);
        check_view(dtype, &shape, &strides, 0, usize::MAX)
            .map_err(|e| Error::tensor(self.path, name, e))?;
        Ok(TensorInfo {
            name: name.to_string(),
            dtype,
            shape,
            strides,
            offset: 0,
            data: TensorData::Unsupported { what },
            quant: None,
            requires_grad: false,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn strided(
        &self,
        name: &str,
        dtype: DType,
        shape: Vec<usize>,
        strides: Vec<usize>,
        offset: usize,
        storage: usize,
        quant: Option<Quant>,
        requires_grad: bool,
    ) -> Result<TensorInfo> {
        if shape.len() > self.limits.max_ndim {
            return Err(Error::tensor(
                self.path,
                name,
                format!(
                    "has {} dimensions, more than the limit of {} (Limits::max_ndim)",
                    shape.len(),
                    self.limits.max_ndim
                ),
            ));
        }
        check_view(dtype, &shape, &strides, offset, self.storage_len(storage))
            .map_err(|what| Error::tensor(self.path, name, what))?;
        Ok(TensorInfo {
            name: name.to_string(),
            dtype,
            shape,
            strides,
            offset,
            data: TensorData::Strided { storage },
            quant,
            requires_grad,
        })
    }

    fn storage_arg(&mut self, id: NodeId, name: &str) -> Result<(usize, DType)> {
        let payload = match self.p.get(id) {
            PValue::PersistentId(payload) => *payload,
            _ => {
                return Err(Error::tensor(
                    self.path,
                    name,
                    "its storage is not a persistent id",
                ))
            }
        };
        match self
            .r
            .persistent(self.p, payload)
            .map_err(|what| Error::tensor(self.path, name, what))?
        {
            Persistent::Storage { index, dtype } => Ok((index, dtype)),
            _ => Err(Error::tensor(
                self.path,
                name,
                "its storage id does not name a storage",
            )),
        }
    }

    fn tensor_arg(&mut self, id: NodeId, name: &str) -> Result<TensorInfo> {
        let bad = |what: &str| Error::tensor(self.path, name, what.to_string());
        let p: &'a Pickle = self.p;
        match p.get(id) {
            PValue::Object(o) => {
                let (m, f) = self
                    .callable(o.callable)
                    .ok_or_else(|| bad("expected a tensor"))?;
                if !is_rebuild_function(m, f) {
                    return Err(bad(&format!("expected a tensor, found a {m}.{f} object")));
                }
                self.rebuild(m, f, &o.args, name)
            }
            PValue::PersistentId(payload) => {
                match self
                    .r
                    .persistent(self.p, *payload)
                    .map_err(|what| Error::tensor(self.path, name, what))?
                {
                    Persistent::Tensor(t) => Ok(*t),
                    _ => Err(bad("expected a tensor, found a storage")),
                }
            }
            _ => Err(bad("expected a tensor")),
        }
    }

    fn usize_arg(&self, id: NodeId, name: &str, what: &str) -> Result<usize> {
        self.p
            .as_int(id)
            .and_then(|i| usize::try_from(i).ok())
            .ok_or_else(|| {
                Error::tensor(
                    self.path,
                    name,
                    format!("its {what} is not a non-negative integer"),
                )
            })
    }

    fn usize_list(&self, id: NodeId, name: &str, what: &str) -> Result<Vec<usize>> {
        // A `torch.Size` is recorded as a call on its tuple of sizes.
        let id = match self.p.get(id) {
            PValue::Object(o)
                if o.args.len() == 1 && self.p.as_global(o.callable) == Some(("torch", "Size")) =>
            {
                o.args[0]
            }
            _ => id,
        };
        let items = self
            .p
            .as_tuple_or_list(id)
            .ok_or_else(|| Error::tensor(self.path, name, format!("its {what} is not a tuple")))?;
        if items.len() > self.limits.max_ndim {
            return Err(Error::tensor(
                self.path,
                name,
                format!(
                    "its {what} has {} entries, more than Limits::max_ndim",
                    items.len()
                ),
            ));
        }
        items
            .iter()
            .map(|&i| self.usize_arg(i, name, what))
            .collect()
    }

    fn bool_arg(&self, id: Option<&NodeId>) -> bool {
        id.and_then(|&i| self.p.as_int(i)).is_some_and(|v| v != 0)
    }

    fn dtype_arg(&self, id: NodeId, name: &str) -> Result<DType> {
        let found = match self.p.get(id) {
            PValue::Global { module, name } if module == "torch" => DType::from_name(name),
            PValue::Str(s) => DType::from_name(s),
            _ => None,
        };
        found.ok_or_else(|| Error::tensor(self.path, name, "its dtype is not a known torch dtype"))
    }

    fn quant_arg(&mut self, id: NodeId, name: &str) -> Result<Quant> {
        let bad = |what: &str| Error::tensor(self.path, name, what.to_string());
        let p: &'a Pickle = self.p;
        let params = p
            .as_tuple_or_list(id)
            .ok_or_else(|| bad("its quantizer parameters are not a tuple"))?;
        let scheme: &str = match params.first().map(|&s| p.get(s)) {
            Some(PValue::Global { name, .. }) => name,
            Some(PValue::Str(s)) => s,
            _ => return Err(bad("its quantization scheme is missing")),
        };
        let float = |p: &Pickle, i: Option<&NodeId>| match i.map(|&i| p.get(i)) {
            Some(PValue::Float(f)) => Some(*f),
            Some(PValue::Int(v)) => Some(*v as f64),
            _ => None,
        };
        match (scheme, params.len()) {
            ("per_tensor_affine", 3) => Ok(Quant::PerTensor {
                scale: float(self.p, params.get(1))
                    .ok_or_else(|| bad("its scale is not a number"))?,
                zero_point: params
                    .get(2)
                    .and_then(|&z| self.p.as_int(z))
                    .ok_or_else(|| bad("its zero point is not an integer"))?,
            }),
            ("per_channel_affine" | "per_channel_affine_float_qparams", 4) => {
                let scales = self.f64_values(params[1], &format!("{name} (scales)"))?;
                let zero_points = self.f64_values(params[2], &format!("{name} (zero points)"))?;
                let axis = self.usize_arg(params[3], name, "quantization axis")?;
                Ok(Quant::PerChannel {
                    scales,
                    zero_points,
                    axis,
                })
            }
            _ => Err(bad(&format!(
                "its quantization scheme {scheme} is not supported"
            ))),
        }
    }

    /// Read a small tensor (or list of numbers) as f64 values: per-channel quantization
    /// parameters are stored as tensors.
    /// Every decode is charged to the copy budget (a shared scales tensor is decoded once
    /// per quantized tensor that uses it).
    fn f64_values(&mut self, id: NodeId, name: &str) -> Result<Vec<f64>> {
        if let Some(items) = self.p.as_tuple_or_list(id) {
            self.charge(items.len().saturating_mul(8)).map_err(|e| *e)?;
            return Ok(items
                .iter()
                .filter_map(|&i| match self.p.get(i) {
                    PValue::Float(f) => Some(*f),
                    PValue::Int(v) => Some(*v as f64),
                    _ => None,
                })
                .collect());
        }
        let t = self.tensor_arg(id, name)?;
        let TensorData::Strided { storage } = t.data else {
            return Err(Error::tensor(self.path, name, "has no data"));
        };
        self.charge(t.numel().saturating_mul(8)).map_err(|e| *e)?;
        let bytes = self
            .r
            .storages()
            .get(storage)
            .map(Storage::bytes)
            .unwrap_or_default();
        // The view was checked against its storage; only an overlapping one can be larger.
        if t.nbytes() > bytes.len() && t.nbytes() as u64 > self.limits.max_expanded_bytes {
            return Err(self.limit(
                &format!(
                    "tensor {name}'s data ({} bytes, an expanded view)",
                    t.nbytes()
                ),
                self.limits.max_expanded_bytes,
                "max_expanded_bytes",
            ));
        }
        let data = view_bytes(&t, bytes, self.order);
        let out = match t.dtype {
            DType::F64 => data
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect(),
            DType::F32 => data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap_or_default()) as f64)
                .collect(),
            DType::I64 => data
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or_default()) as f64)
                .collect(),
            DType::I32 => data
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap_or_default()) as f64)
                .collect(),
            other => {
                return Err(Error::tensor(
                    self.path,
                    name,
                    format!("is {other}, expected float or integer"),
                ))
            }
        };
        Ok(out)
    }

    /// `numpy.core.multiarray.scalar(dtype, bytes)`: decode the common numeric kinds.
    fn numpy_scalar(&mut self, module: &str, func: &str, args: &[NodeId]) -> Option<Value> {
        if func != "scalar" || !matches!(module, "numpy.core.multiarray" | "numpy._core.multiarray")
        {
            return None;
        }
        let dtype_obj = match self.p.get(*args.first()?) {
            PValue::Object(o) => o,
            _ => return None,
        };
        let code = self.p.as_str(*dtype_obj.args.first()?)?.to_string();
        let big = dtype_obj
            .state
            .and_then(|s| self.p.as_tuple_or_list(s))
            .and_then(|s| s.get(1).copied())
            .and_then(|e| self.p.as_str(e))
            == Some(">");
        let mut raw = self.bytes_value(*args.get(1)?, 0)?;
        if big {
            raw.reverse();
        }
        let (dtype, value) = decode_numpy(&code, &raw)?;
        Some(Value::Numpy {
            dtype: dtype.to_string(),
            value: Box::new(value),
        })
    }
}

impl Walker<'_> {
    /// The strings in a set, list or tuple, including protocol 2's `set([...])` call.
    fn strings(&self, id: NodeId, nest: usize) -> Vec<String> {
        if nest >= MAX_CALL_NESTING {
            return Vec::new();
        }
        let items: &[NodeId] = match self.p.get(id) {
            PValue::Set(items)
            | PValue::FrozenSet(items)
            | PValue::List(items)
            | PValue::Tuple(items) => items,
            PValue::Object(o) => match o.args.first() {
                Some(&a) if o.list_items.is_empty() => return self.strings(a, nest + 1),
                _ => &o.list_items,
            },
            _ => &[],
        };
        items
            .iter()
            .filter_map(|&i| self.p.as_str(i).map(str::to_string))
            .collect()
    }

    /// A bytes object: BINBYTES, or protocol 2's `_codecs.encode(text, 'latin1')`.
    fn bytes_value(&self, id: NodeId, nest: usize) -> Option<Vec<u8>> {
        if nest >= MAX_CALL_NESTING {
            return None;
        }
        match self.p.get(id) {
            // A numpy scalar is at most 16 bytes: anything longer is not one (and is never
            // copied, however often it is reached).
            PValue::Bytes(b) if b.len() <= 16 => Some(b.clone()),
            PValue::Str(s) if s.len() <= 64 => Some(s.chars().map(|c| c as u32 as u8).collect()),
            PValue::Object(o) if self.p.as_global(o.callable) == Some(("_codecs", "encode")) => {
                self.bytes_value(*o.args.first()?, nest + 1)
            }
            _ => None,
        }
    }
}

fn decode_numpy(code: &str, raw: &[u8]) -> Option<(&'static str, Value)> {
    let b = |n: usize| raw.get(..n);
    Some(match code {
        "f8" => (
            "float64",
            Value::Float(f64::from_le_bytes(b(8)?.try_into().ok()?)),
        ),
        "f4" => (
            "float32",
            Value::Float(f32::from_le_bytes(b(4)?.try_into().ok()?) as f64),
        ),
        "f2" => (
            "float16",
            Value::Float(half::f16::from_le_bytes(b(2)?.try_into().ok()?).to_f64()),
        ),
        "i8" => (
            "int64",
            Value::Int(i64::from_le_bytes(b(8)?.try_into().ok()?)),
        ),
        "i4" => (
            "int32",
            Value::Int(i32::from_le_bytes(b(4)?.try_into().ok()?) as i64),
        ),
        "i2" => (
            "int16",
            Value::Int(i16::from_le_bytes(b(2)?.try_into().ok()?) as i64),
        ),
        "i1" => ("int8", Value::Int(*b(1)?.first()? as i8 as i64)),
        "u8" => (
            "uint64",
            u64::from_le_bytes(b(8)?.try_into().ok()?)
                .try_into()
                .map_or_else(
                    |_| {
                        Value::BigInt(
                            u64::from_le_bytes(raw[..8].try_into().unwrap_or_default()).to_string(),
                        )
                    },
                    Value::Int,
                ),
        ),
        "u4" => (
            "uint32",
            Value::Int(u32::from_le_bytes(b(4)?.try_into().ok()?) as i64),
        ),
        "u2" => (
            "uint16",
            Value::Int(u16::from_le_bytes(b(2)?.try_into().ok()?) as i64),
        ),
        "u1" => ("uint8", Value::Int(*b(1)?.first()? as i64)),
        "b1" => ("bool", Value::Bool(*b(1)?.first()? != 0)),
        _ => return None,
    })
}

/// Row-major strides for `shape`.
pub(crate) fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1].saturating_mul(shape[i + 1]);
    }
    strides
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides() {
        assert_eq!(contiguous_strides(&[2, 3, 4]), [12, 4, 1]);
        assert!(contiguous_strides(&[]).is_empty());
    }
}
