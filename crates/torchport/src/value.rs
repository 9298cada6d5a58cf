//! Non-tensor values found in a checkpoint (epoch numbers, learning rates, names, numpy
//! scalars, numpy arrays that hold no numbers, unknown objects), kept so `inspect` can show them and writers can keep them.

use std::fmt;

/// A non-tensor leaf of a checkpoint.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Value {
    /// Python `None`.
    None,
    /// A bool.
    Bool(bool),
    /// An integer that fits in i64.
    Int(i64),
    /// A larger integer, in decimal.
    BigInt(String),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
    /// A bytes object (its length; the content is not kept).
    Bytes(usize),
    /// A numpy scalar such as `numpy.float64(0.5)`.
    Numpy {
        /// numpy dtype name (`float64`, `int32`, …).
        dtype: String,
        /// The decoded value.
        value: Box<Value>,
    },
    /// A numpy array that is not a tensor: its elements are Python objects, records,
    /// strings or dates, which torch has no dtype for (numeric arrays are tensors). Boxed,
    /// so that every value stays small (a checkpoint can hold one value per pickle node).
    NumpyArray(Box<NumpyArray>),
    /// A reference to a class or function (`torch.float32`, `argparse.Namespace`).
    Global(String),
    /// An object of a class torchport does not interpret, recorded, never constructed.
    Object(String),
    /// An empty list, tuple, dict or set.
    Empty(&'static str),
    /// A container that contains itself (a cycle in the pickle's object graph).
    Recursive,
}

/// What [`Value::NumpyArray`] says about a numpy array that is not a tensor.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct NumpyArray {
    /// The dtype as the pickle spells it: byte order and type code (`|O8`, `<U2`, `|V12`).
    pub dtype: String,
    /// Sizes, outermost first.
    pub shape: Vec<usize>,
    /// Why it is kept as a value, e.g. `object arrays hold Python objects`.
    pub note: &'static str,
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::None => f.write_str("None"),
            Value::Bool(b) => f.write_str(if *b { "True" } else { "False" }),
            Value::Int(i) => write!(f, "{i}"),
            Value::BigInt(s) => f.write_str(s),
            Value::Float(x) => write!(f, "{x:?}"),
            Value::Str(s) => write!(f, "{s:?}"),
            Value::Bytes(n) => write!(f, "<{n} bytes>"),
            Value::Numpy { dtype, value } => write!(f, "numpy.{dtype}({value})"),
            Value::NumpyArray(a) => write!(
                f,
                "numpy.ndarray(dtype {}, shape {:?}): not a tensor, {}",
                a.dtype, a.shape, a.note
            ),
            Value::Global(g) => f.write_str(g),
            Value::Object(c) => write!(f, "<{c} object>"),
            Value::Empty(kind) => f.write_str(kind),
            Value::Recursive => f.write_str("<recursive reference>"),
        }
    }
}

impl Value {
    /// The value as JSON: numbers, strings, bools and null as themselves; numpy scalars as
    /// `{"numpy": dtype, "value": v}`; numpy arrays that are not tensors as
    /// `{"numpy_array": dtype, "shape": [..], "note": why}`; globals and objects as `{"global": name}` /
    /// `{"object": class}`.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        match self {
            Value::None => serde_json::Value::Null,
            Value::Bool(b) => json!(b),
            Value::Int(i) => json!(i),
            Value::BigInt(s) => json!({ "bigint": s }),
            Value::Float(x) if x.is_finite() => json!(x),
            Value::Float(x) => json!({ "float": x.to_string() }),
            Value::Str(s) => json!(s),
            Value::Bytes(n) => json!({ "bytes": n }),
            Value::Numpy { dtype, value } => json!({ "numpy": dtype, "value": value.to_json() }),
            Value::NumpyArray(a) => {
                json!({ "numpy_array": a.dtype, "shape": a.shape, "note": a.note })
            }
            Value::Global(g) => json!({ "global": g }),
            Value::Object(c) => json!({ "object": c }),
            Value::Empty(kind) => json!({ "empty": kind }),
            Value::Recursive => json!({ "recursive": true }),
        }
    }
}
