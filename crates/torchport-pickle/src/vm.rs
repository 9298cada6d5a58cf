//! Owns the pickle machine's state (arena, stack, marks, memo, globals seen) and the checked
//! helpers every opcode uses; the opcode dispatch itself lives in `ops.rs`.
//!
//! The stack is one `Vec<NodeId>` plus a list of mark positions. Items below the topmost mark
//! are out of reach (as in CPython's `_pickle`), so `pop` and `top` fail rather than reach them.

use std::collections::{HashMap, HashSet};

use crate::error::{Error, ErrorKind};
use crate::limits::Limits;
use crate::opcodes;
use crate::reader::Reader;
use crate::value::{NodeId, Value};
use crate::{globals::is_dangerous_global, Pickle};

/// Returned by one step of the machine.
pub(crate) enum Flow {
    /// Keep going.
    Continue,
    /// STOP was reached; this is the result.
    Stop(NodeId),
}

/// A [`Value`] to hand out for ids that are not in the arena (never for ids the arena made).
pub(crate) static MISSING: Value = Value::None;

/// The machine's state for one pickle.
pub(crate) struct Machine<'l> {
    pub(crate) limits: &'l Limits,
    pub(crate) nodes: Vec<Value>,
    pub(crate) stack: Vec<NodeId>,
    pub(crate) marks: Vec<usize>,
    memo: HashMap<u64, NodeId>,
    globals: Vec<(String, String)>,
    seen_globals: HashSet<(String, String)>,
    /// Ids copied out of an existing tuple / dict into a recorded call; charged to `max_nodes`.
    copied_ids: usize,
    total_bytes: usize,
    pub(crate) protocol: Option<u8>,
}

/// Run one pickle from the start of `bytes`: the result and the bytes consumed through STOP.
pub(crate) fn run(bytes: &[u8], limits: &Limits) -> Result<(Pickle, usize), Error> {
    let mut machine = Machine::new(limits);
    let (root, used) = drive(&mut machine, bytes)?;
    Ok((machine.finish(root), used))
}

/// Run one pickle only for the globals it references: every global met before the pickle
/// ended (at STOP, or at the error that stopped it), and how it ended.
pub(crate) fn globals_until_error(
    bytes: &[u8],
    limits: &Limits,
) -> (Vec<(String, String)>, Result<usize, Error>) {
    let mut machine = Machine::new(limits);
    let ended = drive(&mut machine, bytes).map(|(_, used)| used);
    (machine.globals, ended)
}

/// Step the machine through `bytes` until STOP (the root and the bytes consumed) or an error.
fn drive(machine: &mut Machine<'_>, bytes: &[u8]) -> Result<(NodeId, usize), Error> {
    let mut reader = Reader::new(bytes);
    loop {
        let at = reader.pos() as u64;
        let Some(op) = reader.next_byte() else {
            return Err(Error {
                offset: at,
                opcode: None,
                kind: ErrorKind::NoStop,
            });
        };
        let Some(name) = opcodes::name(op) else {
            return Err(Error {
                offset: at,
                opcode: None,
                kind: ErrorKind::UnknownOpcode(op),
            });
        };
        match machine.step(op, &mut reader) {
            Ok(Flow::Continue) => {}
            Ok(Flow::Stop(root)) => return Ok((root, reader.pos())),
            Err(kind) => {
                return Err(Error {
                    offset: at,
                    opcode: Some(name),
                    kind,
                })
            }
        }
    }
}

impl<'l> Machine<'l> {
    fn new(limits: &'l Limits) -> Self {
        Machine {
            limits,
            nodes: Vec::new(),
            stack: Vec::new(),
            marks: Vec::new(),
            memo: HashMap::new(),
            globals: Vec::new(),
            seen_globals: HashSet::new(),
            copied_ids: 0,
            total_bytes: 0,
            protocol: None,
        }
    }

    fn finish(self, root: NodeId) -> Pickle {
        Pickle {
            nodes: self.nodes,
            root,
            globals: self.globals,
            protocol: self.protocol,
        }
    }

    fn limit(what: &'static str, limit: usize) -> ErrorKind {
        ErrorKind::Limit { what, limit }
    }

    // ---- arena ----

    /// Add a node to the arena.
    pub(crate) fn new_node(&mut self, value: Value) -> Result<NodeId, ErrorKind> {
        let max = self.limits.max_nodes;
        let used = self
            .nodes
            .len()
            .checked_add(self.copied_ids)
            .ok_or(Self::limit("max_nodes", max))?;
        if used >= max {
            return Err(Self::limit("max_nodes", max));
        }
        let id = u32::try_from(self.nodes.len()).map_err(|_| Self::limit("max_nodes", max))?;
        self.nodes.push(value);
        Ok(NodeId(id))
    }

    /// Charge `n` ids copied out of an existing container against `max_nodes`.
    pub(crate) fn charge_copies(&mut self, n: usize) -> Result<(), ErrorKind> {
        let max = self.limits.max_nodes;
        self.copied_ids = self
            .copied_ids
            .checked_add(n)
            .ok_or(Self::limit("max_nodes", max))?;
        if self.nodes.len().saturating_add(self.copied_ids) > max {
            return Err(Self::limit("max_nodes", max));
        }
        Ok(())
    }

    pub(crate) fn node(&self, id: NodeId) -> &Value {
        self.nodes.get(id.0 as usize).unwrap_or(&MISSING)
    }

    pub(crate) fn node_mut(&mut self, id: NodeId) -> Result<&mut Value, ErrorKind> {
        self.nodes
            .get_mut(id.0 as usize)
            .ok_or(ErrorKind::Malformed(
                "internal error: a stack item refers to no node",
            ))
    }

    pub(crate) fn type_name(&self, id: NodeId) -> &'static str {
        self.node(id).type_name()
    }

    // ---- stack and marks ----

    fn fence(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn check_depth(&self) -> Result<(), ErrorKind> {
        let max = self.limits.max_stack_depth;
        if self.stack.len().saturating_add(self.marks.len()) >= max {
            return Err(Self::limit("max_stack_depth", max));
        }
        Ok(())
    }

    pub(crate) fn push(&mut self, id: NodeId) -> Result<(), ErrorKind> {
        self.check_depth()?;
        self.stack.push(id);
        Ok(())
    }

    /// Add a node and push it.
    pub(crate) fn push_new(&mut self, value: Value) -> Result<(), ErrorKind> {
        self.check_depth()?;
        let id = self.new_node(value)?;
        self.stack.push(id);
        Ok(())
    }

    pub(crate) fn pop(&mut self) -> Result<NodeId, ErrorKind> {
        if self.stack.len() <= self.fence() {
            return Err(ErrorKind::StackUnderflow);
        }
        self.stack.pop().ok_or(ErrorKind::StackUnderflow)
    }

    pub(crate) fn top(&self) -> Result<NodeId, ErrorKind> {
        if self.stack.len() <= self.fence() {
            return Err(ErrorKind::StackUnderflow);
        }
        self.stack.last().copied().ok_or(ErrorKind::StackUnderflow)
    }

    pub(crate) fn mark(&mut self) -> Result<(), ErrorKind> {
        let max = self.limits.max_nesting;
        if self.marks.len() >= max {
            return Err(Self::limit("max_nesting", max));
        }
        self.check_depth()?;
        self.marks.push(self.stack.len());
        Ok(())
    }

    /// Remove the topmost mark and return the items above it, oldest first.
    pub(crate) fn pop_mark(&mut self) -> Result<Vec<NodeId>, ErrorKind> {
        let mark = self.marks.pop().ok_or(ErrorKind::NoMark)?;
        if mark > self.stack.len() {
            return Err(ErrorKind::StackUnderflow);
        }
        Ok(self.stack.split_off(mark))
    }

    /// POP: the top item, or the topmost mark when it has no items above it.
    pub(crate) fn pop_item_or_mark(&mut self) -> Result<(), ErrorKind> {
        if self.stack.len() > self.fence() {
            self.stack.pop();
            Ok(())
        } else if self.marks.last() == Some(&self.stack.len()) {
            self.marks.pop();
            Ok(())
        } else {
            Err(ErrorKind::StackUnderflow)
        }
    }

    // ---- payloads ----

    /// Charge a str / bytes / long payload of `len` bytes against the limits.
    pub(crate) fn charge_bytes(&mut self, len: usize) -> Result<(), ErrorKind> {
        if len > self.limits.max_string_len {
            return Err(Self::limit("max_string_len", self.limits.max_string_len));
        }
        let max = self.limits.max_total_bytes;
        self.total_bytes = self
            .total_bytes
            .checked_add(len)
            .ok_or(Self::limit("max_total_bytes", max))?;
        if self.total_bytes > max {
            return Err(Self::limit("max_total_bytes", max));
        }
        Ok(())
    }

    /// A length-prefixed payload: the declared length is checked against the remaining input
    /// (UnexpectedEof) and then the limits, before anything is copied.
    pub(crate) fn payload<'a>(
        &mut self,
        r: &mut Reader<'a>,
        len: u64,
    ) -> Result<&'a [u8], ErrorKind> {
        let len = usize::try_from(len).map_err(|_| ErrorKind::UnexpectedEof)?;
        if len > r.remaining() {
            return Err(ErrorKind::UnexpectedEof);
        }
        self.charge_bytes(len)?;
        r.take(len)
    }

    // ---- memo ----

    pub(crate) fn memo_put(&mut self, key: u64) -> Result<(), ErrorKind> {
        let id = self.top()?;
        if !self.memo.contains_key(&key) && self.memo.len() >= self.limits.max_memo {
            return Err(Self::limit("max_memo", self.limits.max_memo));
        }
        self.memo.insert(key, id);
        Ok(())
    }

    pub(crate) fn memoize(&mut self) -> Result<(), ErrorKind> {
        self.memo_put(self.memo.len() as u64)
    }

    pub(crate) fn memo_get(&mut self, key: u64) -> Result<(), ErrorKind> {
        let id = *self.memo.get(&key).ok_or(ErrorKind::BadMemoKey(key))?;
        self.push(id)
    }

    // ---- globals ----

    /// Record a global reference (refusing dangerous ones) and add its node.
    pub(crate) fn global(&mut self, module: String, name: String) -> Result<NodeId, ErrorKind> {
        if self.limits.refuse_dangerous && is_dangerous_global(&module, &name) {
            return Err(ErrorKind::DangerousGlobal { module, name });
        }
        let key = (module, name);
        if !self.seen_globals.contains(&key) {
            self.seen_globals.insert(key.clone());
            self.globals.push(key.clone());
        }
        let (module, name) = key;
        self.new_node(Value::Global { module, name })
    }
}
