//! Owns the arena's node types: [`NodeId`], [`Value`], [`Object`], [`CallKind`], and the
//! helpers for big integers stored as two's-complement bytes.

/// Index of a node in the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

/// A decoded value. Containers refer to other nodes by id (the arena may contain
/// shared references and even cycles, exactly like the pickle's object graph).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Value {
    /// `None`.
    None,
    /// `True` / `False` (NEWTRUE, NEWFALSE, or protocol-0 `I01` / `I00`).
    Bool(bool),
    /// An integer that fits `i64`.
    Int(i64),
    /// An integer that does not fit i64: little-endian two's-complement bytes (as LONG1/LONG4
    /// store them), trimmed to the fewest bytes that keep the value and its sign.
    BigInt(Vec<u8>),
    /// A float (BINFLOAT, or protocol-0 FLOAT text).
    Float(f64),
    /// A str. Python 2 `str` (STRING, BINSTRING, SHORT_BINSTRING) lands here when its bytes
    /// are valid UTF-8 and in [`Value::Bytes`] otherwise.
    Str(String),
    /// A bytes object.
    Bytes(Vec<u8>),
    /// A bytearray object (BYTEARRAY8).
    ByteArray(Vec<u8>),
    /// A list.
    List(Vec<NodeId>),
    /// A tuple.
    Tuple(Vec<NodeId>),
    /// A dict; insertion order kept.
    Dict(Vec<(NodeId, NodeId)>),
    /// A set, in pickle order.
    Set(Vec<NodeId>),
    /// A frozenset, in pickle order.
    FrozenSet(Vec<NodeId>),
    /// GLOBAL / STACK_GLOBAL / INST class reference: recorded, never imported.
    Global {
        /// The module path, e.g. `collections`.
        module: String,
        /// The (possibly dotted) name inside the module, e.g. `OrderedDict`.
        name: String,
    },
    /// REDUCE / NEWOBJ / NEWOBJ_EX / INST / OBJ: a call, recorded, never made.
    /// Later BUILD / APPEND(S) / SETITEM(S) on it mutate this node in place. Boxed, so
    /// that every other node stays small (the arena holds one node per opcode at worst).
    Object(Box<Object>),
    /// PERSID / BINPERSID: the persistent id payload (for torch: a tuple like
    /// `('storage', <Global FloatStorage>, '0', 'cpu', 6)`).
    PersistentId(NodeId),
}

impl Value {
    /// The Python type name of this value, as used in error messages (`"list"`, `"object"`, …).
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::BigInt(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::ByteArray(_) => "bytearray",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Dict(_) => "dict",
            Value::Set(_) => "set",
            Value::FrozenSet(_) => "frozenset",
            Value::Global { .. } => "global",
            Value::Object(_) => "object",
            Value::PersistentId(_) => "persistent id",
        }
    }
}

/// A recorded call and everything later applied to its result.
#[derive(Clone, Debug, PartialEq)]
pub struct Object {
    /// Which opcode made the call.
    pub kind: CallKind,
    /// What was called; usually a [`Value::Global`].
    pub callable: NodeId,
    /// Positional args (the argument tuple's items).
    pub args: Vec<NodeId>,
    /// NEWOBJ_EX kwargs (empty otherwise).
    pub kwargs: Vec<(NodeId, NodeId)>,
    /// The state of the last BUILD applied to this object.
    pub state: Option<NodeId>,
    /// Items that APPEND / APPENDS / ADDITEMS applied to this object.
    pub list_items: Vec<NodeId>,
    /// Pairs that SETITEM / SETITEMS applied to this object (e.g. an OrderedDict's items).
    pub dict_items: Vec<(NodeId, NodeId)>,
}

impl Object {
    /// A call with nothing yet applied to its result.
    pub fn new(kind: CallKind, callable: NodeId, args: Vec<NodeId>) -> Self {
        Object {
            kind,
            callable,
            args,
            kwargs: Vec::new(),
            state: None,
            list_items: Vec::new(),
            dict_items: Vec::new(),
        }
    }
}

/// The opcode that recorded an [`Object`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallKind {
    /// REDUCE: `callable(*args)`.
    Reduce,
    /// NEWOBJ: `cls.__new__(cls, *args)`.
    NewObj,
    /// NEWOBJ_EX: `cls.__new__(cls, *args, **kwargs)`.
    NewObjEx,
    /// INST: a class named by text lines, called with the items above a mark.
    Inst,
    /// OBJ: the first item above a mark, called with the rest.
    Obj,
}

/// Trim little-endian two's-complement bytes to the fewest that keep the value.
pub(crate) fn trim_twos_complement(mut bytes: Vec<u8>) -> Vec<u8> {
    while bytes.len() > 1 {
        let n = bytes.len();
        let (Some(&last), Some(&prev)) = (bytes.get(n - 1), bytes.get(n - 2)) else {
            break;
        };
        let redundant = (last == 0x00 && prev & 0x80 == 0) || (last == 0xff && prev & 0x80 != 0);
        if !redundant {
            break;
        }
        bytes.pop();
    }
    bytes
}

/// Turn little-endian two's-complement bytes (LONG1/LONG4 payload) into a value:
/// [`Value::Int`] when it fits `i64`, otherwise a trimmed [`Value::BigInt`].
pub(crate) fn int_from_twos_complement(bytes: Vec<u8>) -> Value {
    let bytes = trim_twos_complement(bytes);
    if bytes.len() <= 8 {
        let negative = bytes.last().is_some_and(|b| b & 0x80 != 0);
        let mut buf = if negative { [0xffu8; 8] } else { [0u8; 8] };
        for (dst, src) in buf.iter_mut().zip(bytes.iter()) {
            *dst = *src;
        }
        Value::Int(i64::from_le_bytes(buf))
    } else {
        Value::BigInt(bytes)
    }
}

/// Little-endian two's-complement bytes of `negative ? -magnitude : magnitude`, where
/// `magnitude` is little-endian unsigned.
pub(crate) fn twos_complement_from_magnitude(negative: bool, mut magnitude: Vec<u8>) -> Vec<u8> {
    magnitude.push(0);
    if negative {
        let mut carry = true;
        for b in magnitude.iter_mut() {
            let (v, c) = (!*b).overflowing_add(u8::from(carry));
            *b = v;
            carry = c;
        }
    }
    trim_twos_complement(magnitude)
}

/// Format little-endian two's-complement bytes (a [`Value::BigInt`] payload) as a decimal
/// string such as `"-18446744073709551616"`. Empty input is zero. The cost grows with the
/// square of the length, so callers showing untrusted values may want to cap the length.
pub fn bigint_to_decimal(bytes: &[u8]) -> String {
    let negative = bytes.last().is_some_and(|b| b & 0x80 != 0);
    // Magnitude as little-endian bytes.
    let mut mag: Vec<u8> = bytes.to_vec();
    if negative {
        let mut carry = true;
        for b in mag.iter_mut() {
            let (v, c) = (!*b).overflowing_add(u8::from(carry));
            *b = v;
            carry = c;
        }
    }
    // Base 1e9 limbs, most significant first, by repeated division of a big-endian u32 number.
    let mut words: Vec<u32> = mag
        .chunks(4)
        .rev()
        .map(|c| {
            let mut w = [0u8; 4];
            for (dst, src) in w.iter_mut().zip(c.iter()) {
                *dst = *src;
            }
            u32::from_le_bytes(w)
        })
        .collect();
    let mut chunks: Vec<u32> = Vec::new();
    loop {
        while words.first() == Some(&0) {
            words.remove(0);
        }
        if words.is_empty() {
            break;
        }
        let mut rem: u64 = 0;
        for w in words.iter_mut() {
            let cur = (rem << 32) | u64::from(*w);
            *w = (cur / 1_000_000_000) as u32;
            rem = cur % 1_000_000_000;
        }
        chunks.push(rem as u32);
    }
    let mut out = String::new();
    if negative {
        out.push('-');
    }
    match chunks.split_last() {
        None => out.push('0'),
        Some((top, rest)) => {
            out.push_str(&top.to_string());
            for c in rest.iter().rev() {
                out.push_str(&format!("{c:09}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn nodes_stay_small() {
        // The arena holds up to one node per input byte: its size is the pickle VM's
        // memory per byte of hostile input (docs/SECURITY.md).
        assert!(std::mem::size_of::<super::Value>() <= 56);
    }

    use super::*;

    #[test]
    fn twos_complement_round_trips() {
        assert_eq!(int_from_twos_complement(vec![]), Value::Int(0));
        assert_eq!(int_from_twos_complement(vec![0xff]), Value::Int(-1));
        assert_eq!(int_from_twos_complement(vec![0x80, 0x00]), Value::Int(128));
        assert_eq!(
            int_from_twos_complement(vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0x00]),
            Value::Int(i64::MAX)
        );
        let big = vec![0, 0, 0, 0, 0, 0, 0, 0x80, 0];
        assert_eq!(
            int_from_twos_complement(big.clone()),
            Value::BigInt(big.clone())
        );
        assert_eq!(bigint_to_decimal(&big), "9223372036854775808");
        assert_eq!(
            bigint_to_decimal(&[0, 0, 0, 0, 0, 0, 0, 0, 0xff]),
            "-18446744073709551616"
        );
        assert_eq!(bigint_to_decimal(&[]), "0");
        assert_eq!(bigint_to_decimal(&[0xff]), "-1");
        assert_eq!(twos_complement_from_magnitude(true, vec![0x80]), vec![0x80]);
        assert_eq!(
            twos_complement_from_magnitude(false, vec![0x80]),
            vec![0x80, 0x00]
        );
        assert_eq!(
            twos_complement_from_magnitude(true, vec![0x81]),
            vec![0x7f, 0xff]
        );
    }
}
