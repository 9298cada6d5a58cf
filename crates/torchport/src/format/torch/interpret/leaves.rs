//! Leaves of the pickle tree that need decoding: numpy scalars, the strings of a set, and
//! bytes behind `_codecs.encode`.

use super::*;

impl<'a> Walker<'a> {
    /// `numpy.core.multiarray.scalar(dtype, bytes)`: decode the common numeric kinds.
    pub(super) fn numpy_scalar(
        &mut self,
        module: &str,
        func: &str,
        args: &[NodeId],
    ) -> Option<Value> {
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

impl<'a> Walker<'a> {
    /// The strings in a set, list or tuple, including protocol 2's `set([...])` call.
    pub(super) fn strings(&self, id: NodeId, nest: usize) -> Vec<String> {
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
