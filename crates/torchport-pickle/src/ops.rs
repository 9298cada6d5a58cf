//! Owns the opcode dispatch: what each pickle opcode does to the machine. The match is split
//! into sections (control, stack, memo, numbers, strings, containers, calls, persistent ids).
//! Calls are recorded as [`Object`] nodes, never made.

use crate::error::ErrorKind;
use crate::opcodes::*;
use crate::reader::Reader;
use crate::text;
use crate::value::{int_from_twos_complement, CallKind, NodeId, Object, Value};
use crate::vm::{Flow, Machine};

fn utf8(bytes: &[u8]) -> Result<String, ErrorKind> {
    std::str::from_utf8(bytes)
        .map(str::to_owned)
        .map_err(|_| ErrorKind::InvalidUtf8)
}

/// A Python 2 str: [`Value::Str`] when its bytes are UTF-8, [`Value::Bytes`] otherwise.
fn py2_str(bytes: Vec<u8>) -> Value {
    match String::from_utf8(bytes) {
        Ok(s) => Value::Str(s),
        Err(e) => Value::Bytes(e.into_bytes()),
    }
}

/// A 4-byte signed length (BINSTRING, LONG4); negative lengths are malformed.
fn signed_len(r: &mut Reader<'_>) -> Result<u64, ErrorKind> {
    u64::try_from(r.i32_le()?).map_err(|_| ErrorKind::Malformed("the declared length is negative"))
}

fn pairs(items: Vec<NodeId>) -> Result<Vec<(NodeId, NodeId)>, ErrorKind> {
    let mut chunks = items.chunks_exact(2);
    let out: Vec<(NodeId, NodeId)> = chunks
        .by_ref()
        .filter_map(|c| match c {
            [k, v] => Some((*k, *v)),
            _ => None,
        })
        .collect();
    if !chunks.remainder().is_empty() {
        return Err(ErrorKind::Malformed(
            "a dict needs an even number of items (key, value, …)",
        ));
    }
    Ok(out)
}

impl Machine<'_> {
    /// Run one opcode whose byte `op` was just read.
    pub(crate) fn step(&mut self, op: u8, r: &mut Reader<'_>) -> Result<Flow, ErrorKind> {
        match op {
            // ---- control and framing ----
            PROTO => {
                let version = r.u8()?;
                if version > 5 {
                    return Err(ErrorKind::UnsupportedProtocol(version));
                }
                self.protocol.get_or_insert(version);
            }
            FRAME => {
                let len = r.u64_le()?;
                if len > r.remaining() as u64 {
                    return Err(ErrorKind::UnexpectedEof);
                }
            }
            STOP => return Ok(Flow::Stop(self.pop()?)),

            // ---- stack manipulation ----
            MARK => self.mark()?,
            POP => self.pop_item_or_mark()?,
            POP_MARK => {
                self.pop_mark()?;
            }
            DUP => {
                let top = self.top()?;
                self.push(top)?;
            }

            // ---- memo ----
            PUT => {
                let key = text::parse_memo_key(r.line()?).map_err(ErrorKind::BadText)?;
                self.memo_put(key)?;
            }
            BINPUT => {
                let key = r.u8()?;
                self.memo_put(u64::from(key))?;
            }
            LONG_BINPUT => {
                let key = r.u32_le()?;
                self.memo_put(u64::from(key))?;
            }
            MEMOIZE => self.memoize()?,
            GET => {
                let key = text::parse_memo_key(r.line()?).map_err(ErrorKind::BadText)?;
                self.memo_get(key)?;
            }
            BINGET => {
                let key = r.u8()?;
                self.memo_get(u64::from(key))?;
            }
            LONG_BINGET => {
                let key = r.u32_le()?;
                self.memo_get(u64::from(key))?;
            }

            // ---- constants and numbers ----
            NONE => self.push_new(Value::None)?,
            NEWTRUE => self.push_new(Value::Bool(true))?,
            NEWFALSE => self.push_new(Value::Bool(false))?,
            INT => {
                let line = r.line()?;
                let value = match line {
                    b"00" => Value::Bool(false),
                    b"01" => Value::Bool(true),
                    _ => text::parse_int(line).map_err(ErrorKind::BadText)?,
                };
                self.push_new(value)?;
            }
            BININT => {
                let v = r.i32_le()?;
                self.push_new(Value::Int(i64::from(v)))?;
            }
            BININT1 => {
                let v = r.u8()?;
                self.push_new(Value::Int(i64::from(v)))?;
            }
            BININT2 => {
                let v = r.u16_le()?;
                self.push_new(Value::Int(i64::from(v)))?;
            }
            LONG => {
                let line = r.line()?;
                self.charge_bytes(line.len())?;
                let value = text::parse_int(line).map_err(ErrorKind::BadText)?;
                self.push_new(value)?;
            }
            LONG1 => {
                let len = r.u8()?;
                let bytes = self.payload(r, u64::from(len))?;
                self.push_new(int_from_twos_complement(bytes.to_vec()))?;
            }
            LONG4 => {
                let len = signed_len(r)?;
                let bytes = self.payload(r, len)?;
                self.push_new(int_from_twos_complement(bytes.to_vec()))?;
            }
            FLOAT => {
                let v = text::parse_float(r.line()?).map_err(ErrorKind::BadText)?;
                self.push_new(Value::Float(v))?;
            }
            BINFLOAT => {
                let v = r.f64_be()?;
                self.push_new(Value::Float(v))?;
            }

            // ---- strings and bytes ----
            STRING => {
                let line = r.line()?;
                self.charge_bytes(line.len())?;
                let bytes = text::decode_string_literal(line).map_err(ErrorKind::BadText)?;
                self.push_new(py2_str(bytes))?;
            }
            BINSTRING => {
                let len = signed_len(r)?;
                let bytes = self.payload(r, len)?;
                self.push_new(py2_str(bytes.to_vec()))?;
            }
            SHORT_BINSTRING => {
                let len = r.u8()?;
                let bytes = self.payload(r, u64::from(len))?;
                self.push_new(py2_str(bytes.to_vec()))?;
            }
            UNICODE => {
                let line = r.line()?;
                self.charge_bytes(line.len())?;
                let s = text::decode_raw_unicode_escape(line).map_err(ErrorKind::BadText)?;
                self.push_new(Value::Str(s))?;
            }
            BINUNICODE | SHORT_BINUNICODE | BINUNICODE8 => {
                let len = match op {
                    SHORT_BINUNICODE => u64::from(r.u8()?),
                    BINUNICODE => u64::from(r.u32_le()?),
                    _ => r.u64_le()?,
                };
                let bytes = self.payload(r, len)?;
                self.push_new(Value::Str(utf8(bytes)?))?;
            }
            BINBYTES | SHORT_BINBYTES | BINBYTES8 | BYTEARRAY8 => {
                let len = match op {
                    SHORT_BINBYTES => u64::from(r.u8()?),
                    BINBYTES => u64::from(r.u32_le()?),
                    _ => r.u64_le()?,
                };
                let bytes = self.payload(r, len)?.to_vec();
                let value = if op == BYTEARRAY8 {
                    Value::ByteArray(bytes)
                } else {
                    Value::Bytes(bytes)
                };
                self.push_new(value)?;
            }
            NEXT_BUFFER | READONLY_BUFFER => {
                return Err(ErrorKind::Unsupported(
                    "out-of-band buffers (protocol 5 NEXT_BUFFER / READONLY_BUFFER)",
                ));
            }

            // ---- containers ----
            EMPTY_LIST => self.push_new(Value::List(Vec::new()))?,
            EMPTY_TUPLE => self.push_new(Value::Tuple(Vec::new()))?,
            EMPTY_DICT => self.push_new(Value::Dict(Vec::new()))?,
            EMPTY_SET => self.push_new(Value::Set(Vec::new()))?,
            LIST => {
                let items = self.pop_mark()?;
                self.push_new(Value::List(items))?;
            }
            TUPLE => {
                let items = self.pop_mark()?;
                self.push_new(Value::Tuple(items))?;
            }
            TUPLE1 | TUPLE2 | TUPLE3 => {
                let n = usize::from(op - TUPLE1) + 1;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.pop()?);
                }
                items.reverse();
                self.push_new(Value::Tuple(items))?;
            }
            DICT => {
                let items = pairs(self.pop_mark()?)?;
                self.push_new(Value::Dict(items))?;
            }
            FROZENSET => {
                let items = self.pop_mark()?;
                self.push_new(Value::FrozenSet(items))?;
            }
            APPEND => {
                let value = self.pop()?;
                self.extend_list(vec![value], "list")?;
            }
            APPENDS => {
                let items = self.pop_mark()?;
                self.extend_list(items, "list")?;
            }
            ADDITEMS => {
                let items = self.pop_mark()?;
                self.extend_list(items, "set")?;
            }
            SETITEM => {
                let value = self.pop()?;
                let key = self.pop()?;
                self.extend_dict(vec![(key, value)])?;
            }
            SETITEMS => {
                let items = pairs(self.pop_mark()?)?;
                self.extend_dict(items)?;
            }

            // ---- globals and calls ----
            GLOBAL => {
                let module = self.text_line(r)?;
                let name = self.text_line(r)?;
                let id = self.global(module, name)?;
                self.push(id)?;
            }
            STACK_GLOBAL => {
                let name = self.pop()?;
                let module = self.pop()?;
                let (Value::Str(module), Value::Str(name)) = (self.node(module), self.node(name))
                else {
                    let found = match self.node(module) {
                        Value::Str(_) => self.type_name(name),
                        other => other.type_name(),
                    };
                    return Err(ErrorKind::WrongType {
                        expected: "str",
                        found,
                    });
                };
                let (module, name) = (module.clone(), name.clone());
                // The names are copied out of memoizable strs: charge the copies.
                self.charge_bytes(module.len())?;
                self.charge_bytes(name.len())?;
                let id = self.global(module, name)?;
                self.push(id)?;
            }
            INST => {
                let module = self.text_line(r)?;
                let name = self.text_line(r)?;
                let args = self.pop_mark()?;
                let class = self.global(module, name)?;
                self.push_new(Value::Object(Box::new(Object::new(
                    CallKind::Inst,
                    class,
                    args,
                ))))?;
            }
            OBJ => {
                let mut items = self.pop_mark()?.into_iter();
                let class = items.next().ok_or(ErrorKind::StackUnderflow)?;
                let args = items.collect();
                self.push_new(Value::Object(Box::new(Object::new(
                    CallKind::Obj,
                    class,
                    args,
                ))))?;
            }
            REDUCE | NEWOBJ => {
                let args = self.pop()?;
                let callable = self.pop()?;
                // TorchScript's pickler writes an enum member as `GLOBAL __torch__.…Enum`,
                // its value, REDUCE: the one argument is not wrapped in a tuple.
                let enum_member = op == REDUCE
                    && !matches!(self.node(args), Value::Tuple(_))
                    && matches!(self.node(callable),
                        Value::Global { module, .. } if module == "__torch__" || module.starts_with("__torch__."));
                let args = if enum_member {
                    vec![args]
                } else {
                    self.copy_tuple(args)?
                };
                let kind = if op == REDUCE {
                    CallKind::Reduce
                } else {
                    CallKind::NewObj
                };
                self.push_new(Value::Object(Box::new(Object::new(kind, callable, args))))?;
            }
            NEWOBJ_EX => {
                let kwargs = self.pop()?;
                let args = self.pop()?;
                let class = self.pop()?;
                let args = self.copy_tuple(args)?;
                let kwargs = match self.node(kwargs) {
                    Value::Dict(items) => items.clone(),
                    other => {
                        return Err(ErrorKind::WrongType {
                            expected: "dict",
                            found: other.type_name(),
                        })
                    }
                };
                self.charge_copies(kwargs.len().saturating_mul(2))?;
                let mut object = Object::new(CallKind::NewObjEx, class, args);
                object.kwargs = kwargs;
                self.push_new(Value::Object(Box::new(object)))?;
            }
            BUILD => {
                let state = self.pop()?;
                let target = self.top()?;
                match self.node_mut(target)? {
                    Value::Object(object) => object.state = Some(state),
                    other => {
                        return Err(ErrorKind::WrongType {
                            expected: "object",
                            found: other.type_name(),
                        })
                    }
                }
            }

            // ---- persistent ids and the extension registry ----
            PERSID => {
                let line = self.text_line(r)?;
                let pid = self.new_node(Value::Str(line))?;
                self.push_new(Value::PersistentId(pid))?;
            }
            BINPERSID => {
                let pid = self.pop()?;
                self.push_new(Value::PersistentId(pid))?;
            }
            // The copyreg extension registry is empty: every code is unregistered, and
            // Python's own unpickler fails the same way.
            EXT1 => return Err(ErrorKind::UnregisteredExtension(u32::from(r.u8()?))),
            EXT2 => return Err(ErrorKind::UnregisteredExtension(u32::from(r.u16_le()?))),
            EXT4 => return Err(ErrorKind::UnregisteredExtension(r.u32_le()?)),

            _ => return Err(ErrorKind::UnknownOpcode(op)),
        }
        Ok(Flow::Continue)
    }

    /// A UTF-8 text line (GLOBAL / INST names), charged to the payload limits.
    fn text_line(&mut self, r: &mut Reader<'_>) -> Result<String, ErrorKind> {
        let line = r.line()?;
        self.charge_bytes(line.len())?;
        utf8(line)
    }

    /// The items of the argument tuple `id` (copied, and charged to `max_nodes`).
    fn copy_tuple(&mut self, id: NodeId) -> Result<Vec<NodeId>, ErrorKind> {
        let items = match self.node(id) {
            Value::Tuple(items) => items.clone(),
            other => {
                return Err(ErrorKind::WrongType {
                    expected: "tuple",
                    found: other.type_name(),
                })
            }
        };
        self.charge_copies(items.len())?;
        Ok(items)
    }

    /// APPEND / APPENDS (`expected` "list") or ADDITEMS ("set") on the item under the top:
    /// a list or set grows in place; an object records the items in `list_items`.
    fn extend_list(&mut self, items: Vec<NodeId>, expected: &'static str) -> Result<(), ErrorKind> {
        let target = self.top()?;
        match (self.node_mut(target)?, expected) {
            (Value::List(list), "list") | (Value::Set(list), "set") => list.extend(items),
            (Value::Object(object), _) => object.list_items.extend(items),
            (other, _) => {
                return Err(ErrorKind::WrongType {
                    expected,
                    found: other.type_name(),
                })
            }
        }
        Ok(())
    }

    /// SETITEM / SETITEMS on the item under the top: a dict grows in place; an object records
    /// the pairs in `dict_items`.
    fn extend_dict(&mut self, items: Vec<(NodeId, NodeId)>) -> Result<(), ErrorKind> {
        let target = self.top()?;
        match self.node_mut(target)? {
            Value::Dict(dict) => dict.extend(items),
            Value::Object(object) => object.dict_items.extend(items),
            other => {
                return Err(ErrorKind::WrongType {
                    expected: "dict",
                    found: other.type_name(),
                })
            }
        }
        Ok(())
    }
}
