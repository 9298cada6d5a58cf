//! A safe reader for Python pickles (protocols 0 to 5) that never imports or calls anything.
//!
//! Reading a pickle happens in two phases:
//!
//! 1. **Run the pickle machine** ([`parse`] / [`parse_prefix`]). Every opcode is executed
//!    against an arena of [`Value`] nodes. Calls the pickle asks for (`GLOBAL`, `REDUCE`,
//!    `NEWOBJ`, `BUILD`, `INST`, `OBJ`, …) are *recorded* as [`Value::Global`] and
//!    [`Value::Object`] nodes instead of being made; later `BUILD`, `APPEND(S)`, `SETITEM(S)`
//!    on such an object mutate its node in place, so every shared reference sees them.
//!    Shared references and cycles stay shared: a memo `GET` pushes the id of an existing
//!    node. Every size is checked against [`Limits`] before anything is allocated, and
//!    globals that could only mean code execution (`os.system`, `builtins.eval`, …) make the
//!    pickle refused (see [`is_dangerous_global`]). [`allow_list`] says which globals are on
//!    the allow-list (torch's own `weights_only` list and documented data-only classes).
//! 2. **Interpret the tree** (the caller's job). The resulting [`Pickle`] is plain data: the
//!    caller walks it from [`Pickle::root`] and gives meaning to the recorded calls it knows
//!    (for torch: `torch._utils._rebuild_tensor_v2`, storages as persistent ids, …), keeping
//!    everything else as opaque objects.
//!
//! ```
//! use torchport_pickle::{parse, Limits, Value};
//!
//! // pickle.dumps({"a": [1, 2]}, protocol=2)
//! let bytes = b"\x80\x02}q\x00X\x01\x00\x00\x00aq\x01]q\x02(K\x01K\x02es.";
//! let pickle = parse(bytes, &Limits::default())?;
//! let Value::Dict(items) = pickle.get(pickle.root()) else { panic!("expected a dict") };
//! let (key, value) = items[0];
//! assert_eq!(pickle.as_str(key), Some("a"));
//! let list = pickle.as_tuple_or_list(value).unwrap();
//! assert_eq!(pickle.as_int(list[1]), Some(2));
//! # Ok::<(), torchport_pickle::Error>(())
//! ```
//!
//! Errors carry the byte offset and `pickletools` name of the failing opcode. No input makes
//! this crate panic, allocate beyond what the input holds (within [`Limits`]), or recurse.

#![deny(missing_docs)]
#![forbid(unsafe_code)]
// Hostile input: no indexing, unwrap or panic outside tests.
#![cfg_attr(
    not(test),
    deny(
        clippy::indexing_slicing,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable
    )
)]

mod allowed;
mod error;
mod globals;
mod limits;
pub mod opcodes;
mod ops;
mod reader;
mod text;
mod value;
mod vm;

pub use allowed::{allow_list, AllowList, TORCHPORT_DATA, TORCH_WEIGHTS_ONLY};
pub use error::{Error, ErrorKind};
pub use globals::is_dangerous_global;
pub use limits::Limits;
pub use value::{bigint_to_decimal, CallKind, NodeId, Object, Value};

/// The result of running one pickle: an arena of nodes and the id of the root.
#[derive(Clone, Debug)]
pub struct Pickle {
    nodes: Vec<Value>,
    root: NodeId,
    globals: Vec<(String, String)>,
    protocol: Option<u8>,
}

impl Pickle {
    /// The id of the value the pickle returns (the top of the stack at STOP).
    pub fn root(&self) -> NodeId {
        self.root
    }

    /// The node `id`. Ids handed out by this `Pickle` are always valid; an id from elsewhere
    /// that is out of range reads as [`Value::None`].
    pub fn get(&self, id: NodeId) -> &Value {
        self.nodes.get(id.0 as usize).unwrap_or(&vm::MISSING)
    }

    /// Number of nodes in the arena.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when the arena has no nodes (never the case for a parsed pickle).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Every node, indexed by [`NodeId`].
    pub fn nodes(&self) -> &[Value] {
        &self.nodes
    }

    /// The first node holding an id outside the arena (or the root, if it is outside); `None`
    /// for every pickle this crate makes. The arena's invariant, for tests and fuzzers.
    pub fn first_dangling(&self) -> Option<&Value> {
        let ok = |id: &NodeId| (id.0 as usize) < self.nodes.len();
        if !ok(&self.root) {
            return Some(&vm::MISSING);
        }
        self.nodes.iter().find(|v| {
            let fine = match v {
                Value::List(i) | Value::Tuple(i) | Value::Set(i) | Value::FrozenSet(i) => {
                    i.iter().all(ok)
                }
                Value::Dict(items) => items.iter().all(|(k, v)| ok(k) && ok(v)),
                Value::PersistentId(id) => ok(id),
                Value::Object(o) => {
                    ok(&o.callable)
                        && o.args.iter().all(ok)
                        && o.kwargs.iter().all(|(k, v)| ok(k) && ok(v))
                        && o.state.as_ref().is_none_or(ok)
                        && o.list_items.iter().all(ok)
                        && o.dict_items.iter().all(|(k, v)| ok(k) && ok(v))
                }
                _ => true,
            };
            !fine
        })
    }

    /// Every distinct (module, name) global referenced, in first-seen order.
    pub fn globals(&self) -> &[(String, String)] {
        &self.globals
    }

    /// The protocol from the first PROTO opcode; `None` for protocol 0/1 streams.
    pub fn protocol(&self) -> Option<u8> {
        self.protocol
    }

    /// The str at `id`, if it is a [`Value::Str`].
    pub fn as_str(&self, id: NodeId) -> Option<&str> {
        match self.get(id) {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The integer at `id`: a [`Value::Int`], or a [`Value::Bool`] as 0 / 1.
    pub fn as_int(&self, id: NodeId) -> Option<i64> {
        match self.get(id) {
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(i64::from(*b)),
            _ => None,
        }
    }

    /// The float at `id`, if it is a [`Value::Float`].
    pub fn as_float(&self, id: NodeId) -> Option<f64> {
        match self.get(id) {
            Value::Float(f) => Some(*f),
            _ => None,
        }
    }

    /// The bool at `id`, if it is a [`Value::Bool`].
    pub fn as_bool(&self, id: NodeId) -> Option<bool> {
        match self.get(id) {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The bytes at `id`, if it is a [`Value::Bytes`] or [`Value::ByteArray`].
    pub fn as_bytes(&self, id: NodeId) -> Option<&[u8]> {
        match self.get(id) {
            Value::Bytes(b) | Value::ByteArray(b) => Some(b),
            _ => None,
        }
    }

    /// The items at `id`, if it is a [`Value::Tuple`] or [`Value::List`].
    pub fn as_tuple_or_list(&self, id: NodeId) -> Option<&[NodeId]> {
        match self.get(id) {
            Value::Tuple(items) | Value::List(items) => Some(items),
            _ => None,
        }
    }

    /// The pairs at `id`, if it is a [`Value::Dict`].
    pub fn as_dict(&self, id: NodeId) -> Option<&[(NodeId, NodeId)]> {
        match self.get(id) {
            Value::Dict(items) => Some(items),
            _ => None,
        }
    }

    /// The recorded call at `id`, if it is a [`Value::Object`].
    pub fn as_object(&self, id: NodeId) -> Option<&Object> {
        match self.get(id) {
            Value::Object(object) => Some(&**object),
            _ => None,
        }
    }

    /// `(module, name)` at `id`, if it is a [`Value::Global`].
    pub fn as_global(&self, id: NodeId) -> Option<(&str, &str)> {
        match self.get(id) {
            Value::Global { module, name } => Some((module, name)),
            _ => None,
        }
    }
}

/// Run a whole pickle: it must end with STOP, and bytes after STOP are an
/// [`ErrorKind::TrailingBytes`] error.
pub fn parse(bytes: &[u8], limits: &Limits) -> Result<Pickle, Error> {
    let (pickle, consumed) = vm::run(bytes, limits)?;
    let trailing = bytes.len().saturating_sub(consumed);
    if trailing > 0 {
        return Err(Error {
            offset: consumed as u64,
            opcode: None,
            kind: ErrorKind::TrailingBytes(trailing),
        });
    }
    Ok(pickle)
}

/// Run one pickle only to list the globals it references, for a security report: unlike
/// [`parse`], a pickle that fails partway still gives every global met before the failure.
///
/// Returns those globals (first-seen order, no repeats) and how the pickle ended: the bytes
/// consumed through STOP, or the error that stopped it. With `limits.refuse_dangerous` set, a
/// dangerous global stops the pickle without being listed, so a scan leaves it unset.
pub fn scan_globals(
    bytes: &[u8],
    limits: &Limits,
) -> (Vec<(String, String)>, Result<usize, Error>) {
    vm::globals_until_error(bytes, limits)
}

/// Run one pickle from the start of `bytes`; returns it and the number of bytes consumed
/// (through STOP). Used for streams with several pickles back to back (torch's legacy format).
pub fn parse_prefix(bytes: &[u8], limits: &Limits) -> Result<(Pickle, usize), Error> {
    vm::run(bytes, limits)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arena(nodes: Vec<Value>, root: u32) -> Pickle {
        Pickle {
            nodes,
            root: NodeId(root),
            globals: Vec::new(),
            protocol: None,
        }
    }

    #[test]
    fn first_dangling_finds_ids_outside_the_arena() {
        let good = arena(vec![Value::Int(1), Value::List(vec![NodeId(0)])], 1);
        assert!(good.first_dangling().is_none());
        let bad_item = arena(vec![Value::Int(1), Value::List(vec![NodeId(2)])], 1);
        assert!(matches!(bad_item.first_dangling(), Some(Value::List(_))));
        let bad_root = arena(vec![Value::Int(1)], 1);
        assert!(bad_root.first_dangling().is_some());
        let parsed = parse(b"\x80\x02]q\x00(K\x01h\x00e.", &Limits::default()).unwrap();
        assert!(parsed.first_dangling().is_none());
    }
}
