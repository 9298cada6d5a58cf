//! numpy arrays inside a pickle, read as tensors without running numpy:
//! `numpy._core.multiarray._reconstruct(numpy.ndarray, (0,), b'b')` with the BUILD state
//! `(version, shape, dtype, is_fortran, data)` (pickle protocols 0-4), and protocol 5's
//! `numpy._core.numeric._frombuffer(data, dtype, shape, order)`; `numpy.core` (numpy 1) is
//! read the same. The dtype is a recorded `numpy.dtype(code, False, True)` call whose BUILD
//! state `(3, byte_order, …)` gives the byte order.
//!
//! Arrays of numbers become tensors over a storage holding the array's bytes (copied out of
//! the pickle once per array however often it is reached; in the array's own byte order);
//! arrays of objects, records, strings or dates stay values ([`Value::NumpyArray`]). An
//! array whose description is broken is an error naming its key path, as a broken tensor is.

use std::collections::HashMap;

use super::*;
use crate::format::numpy::{np_kind, NpKind};

/// The numpy modules whose `_reconstruct` / `_frombuffer` build arrays (numpy 1 and 2).
fn is_numpy_module(module: &str, sub: &str) -> bool {
    module
        .strip_prefix("numpy.")
        .and_then(|m| m.strip_prefix("core.").or_else(|| m.strip_prefix("_core.")))
        == Some(sub)
}

/// The parts of a pickled array, before they are checked against each other.
struct Parts {
    shape: NodeId,
    dtype: NodeId,
    fortran: bool,
    data: NodeId,
}

/// Storages made for arrays so far, by the node of their data (an array reached twice
/// shares one storage).
#[derive(Default)]
pub(super) struct ArrayStorages(HashMap<NodeId, usize>);

impl<'a> Walker<'a> {
    /// If `obj` is a numpy array, record it (a tensor, or a value for arrays of non-numbers)
    /// and return true; false for anything else (an ndarray subclass stays opaque).
    pub(super) fn numpy_array(
        &mut self,
        module: &str,
        func: &str,
        obj: &Object,
        name: &str,
    ) -> Result<bool> {
        let parts = match func {
            "_reconstruct" if is_numpy_module(module, "multiarray") => {
                let class = obj.args.first().and_then(|&c| self.callable(c));
                if class != Some(("numpy", "ndarray")) {
                    return Ok(false);
                }
                self.reconstruct_parts(obj, name)?
            }
            "_frombuffer" if is_numpy_module(module, "numeric") => {
                self.frombuffer_parts(obj, name)?
            }
            _ => return Ok(false),
        };
        self.array(&parts, name)?;
        Ok(true)
    }

    fn bad(&self, name: &str, what: impl Into<String>) -> Error {
        Error::tensor(self.path, name, format!("numpy array: {}", what.into()))
    }

    /// The BUILD state of `_reconstruct`: `(version, shape, dtype, is_fortran, data)`, or
    /// the older `(shape, dtype, is_fortran, data)`.
    fn reconstruct_parts(&self, obj: &Object, name: &str) -> Result<Parts> {
        let Some(state) = obj.state else {
            return Err(self.bad(name, "the ndarray has no BUILD state"));
        };
        let items = self.p.as_tuple_or_list(state).unwrap_or_default();
        let rest = match items.len() {
            5 => items.get(1..),
            4 => items.get(..),
            _ => None,
        };
        let Some(&[shape, dtype, fortran, data]) = rest else {
            return Err(self.bad(
                name,
                "its BUILD state is not a (version, shape, dtype, is_fortran, data) tuple",
            ));
        };
        let fortran = match self.p.get(fortran) {
            PValue::Bool(b) => *b,
            PValue::Int(i @ (0 | 1)) => *i == 1,
            _ => return Err(self.bad(name, "its is_fortran flag is not a bool")),
        };
        Ok(Parts {
            shape,
            dtype,
            fortran,
            data,
        })
    }

    /// The arguments of `_frombuffer(data, dtype, shape, order)`, `order` `'C'` or `'F'`.
    fn frombuffer_parts(&self, obj: &Object, name: &str) -> Result<Parts> {
        let &[data, dtype, shape, order] = obj.args.as_slice() else {
            return Err(self.bad(
                name,
                "_frombuffer's arguments are not (data, dtype, shape, order)",
            ));
        };
        let fortran = match self.p.as_str(order) {
            Some("C") => false,
            Some("F") => true,
            _ => return Err(self.bad(name, "its order is neither 'C' nor 'F'")),
        };
        Ok(Parts {
            shape,
            dtype,
            fortran,
            data,
        })
    }

    /// Check the parts against each other and record the array.
    fn array(&mut self, parts: &Parts, name: &str) -> Result<()> {
        let (code, order) = self.np_dtype(parts.dtype, name)?;
        let shape = self.usize_list(parts.shape, name, "shape")?;
        let kind = np_kind(&code);
        let dtype = match kind {
            NpKind::Numeric(d) => d,
            NpKind::Unknown => {
                return Err(self.bad(name, format!("its dtype {code:?} is not a numpy type")))
            }
            other => {
                let note = match other {
                    NpKind::Objects => "object arrays hold Python objects",
                    NpKind::Strings => "it holds strings",
                    NpKind::Records => "it holds records (a structured or void dtype)",
                    NpKind::Dates => "it holds dates or durations",
                    _ => "torch has no dtype for extended-precision floats",
                };
                let endian = match order {
                    Some(ByteOrder::Big) => '>',
                    Some(ByteOrder::Little) => '<',
                    None => '|',
                };
                self.push_value(
                    name,
                    Value::NumpyArray(Box::new(crate::value::NumpyArray {
                        dtype: format!("{endian}{code}"),
                        shape,
                        note,
                    })),
                )
                .map_err(|e| *e)?;
                return Ok(());
            }
        };
        if shape.len() > self.limits.max_ndim {
            return Err(self.bad(
                name,
                format!(
                    "it has {} dimensions, more than the limit of {} (Limits::max_ndim)",
                    shape.len(),
                    self.limits.max_ndim
                ),
            ));
        }
        let nbytes = shape
            .iter()
            .try_fold(dtype.size(), |n, &s| n.checked_mul(s))
            .ok_or_else(|| self.bad(name, format!("its shape {shape:?} overflows")))?;
        let index = self.array_storage(parts.data, nbytes, order, name)?;
        let strides = numpy_strides(&shape, parts.fortran);
        let t = self.strided(name, dtype, shape, strides, 0, index, None, false)?;
        self.push_tensor(t)
    }

    /// The type code (`f4`, `O8`, …) and byte order (`None` where it does not apply, `|`)
    /// of a recorded `numpy.dtype(code, False, True)` call and its BUILD state.
    fn np_dtype(&self, id: NodeId, name: &str) -> Result<(String, Option<ByteOrder>)> {
        let obj = match self.p.get(id) {
            PValue::Object(o) if self.p.as_global(o.callable) == Some(("numpy", "dtype")) => o,
            _ => return Err(self.bad(name, "its dtype is not a numpy.dtype")),
        };
        let code = obj
            .args
            .first()
            .and_then(|&c| self.p.as_str(c))
            .filter(|c| c.len() <= 32)
            .ok_or_else(|| self.bad(name, "its dtype has no type code"))?;
        let state = obj.state.and_then(|s| self.p.as_tuple_or_list(s));
        let endian = match state {
            // No state: numpy's default, the native order of the machine that wrote it.
            None => "=",
            Some(items) => items
                .get(1)
                .and_then(|&e| self.p.as_str(e))
                .ok_or_else(|| self.bad(name, "its dtype's state has no byte order"))?,
        };
        let order = match endian {
            "<" => Some(ByteOrder::Little),
            ">" => Some(ByteOrder::Big),
            "|" => None,
            // Native: the order the file says its writer had.
            "=" => Some(self.order),
            other => {
                return Err(self.bad(
                    name,
                    format!("its dtype's byte order {other:?} is none of < > | ="),
                ))
            }
        };
        // Structured dtypes (field names in the state) hold records whatever their code.
        let fields = state.and_then(|s| s.get(3)).map(|&f| self.p.get(f));
        let code = match fields {
            Some(PValue::None) | None => code.to_string(),
            Some(_) => format!("V{}", code.trim_start_matches('V')),
        };
        Ok((code, order))
    }

    /// The storage holding an array's `nbytes` bytes of data (made once per data node).
    fn array_storage(
        &mut self,
        data: NodeId,
        nbytes: usize,
        order: Option<ByteOrder>,
        name: &str,
    ) -> Result<usize> {
        if let Some(&index) = self.arrays.0.get(&data) {
            let held = self.storage_len(index);
            if held != nbytes {
                return Err(self.size_mismatch(name, nbytes, held));
            }
            return Ok(index);
        }
        let bytes = self.array_bytes(data, nbytes, name, 0)?;
        let storage = Storage::owned_in(bytes, order.unwrap_or(ByteOrder::Little));
        let index = self.r.add_storage(storage);
        self.arrays.0.insert(data, index);
        Ok(index)
    }

    fn size_mismatch(&self, name: &str, need: usize, held: usize) -> Error {
        self.bad(
            name,
            format!("its shape and dtype need {need} bytes of data, but it holds {held}"),
        )
    }

    /// An array's data: bytes or a bytearray, protocol 2's `_codecs.encode(text, 'latin1')`,
    /// or `bytes()` (how protocol 2 spells empty bytes). Its length must be `nbytes`; it is
    /// checked before anything is copied.
    fn array_bytes(&self, id: NodeId, nbytes: usize, name: &str, nest: usize) -> Result<Vec<u8>> {
        if nest >= MAX_CALL_NESTING {
            return Err(self.bad(name, "its data is nested too deep"));
        }
        match self.p.get(id) {
            PValue::Bytes(b) | PValue::ByteArray(b) => {
                if b.len() != nbytes {
                    return Err(self.size_mismatch(name, nbytes, b.len()));
                }
                Ok(b.clone())
            }
            PValue::Str(s) => {
                let chars = s.chars().count();
                if chars != nbytes {
                    return Err(self.size_mismatch(name, nbytes, chars));
                }
                s.chars()
                    .map(|c| u8::try_from(u32::from(c)).ok())
                    .collect::<Option<Vec<u8>>>()
                    .ok_or_else(|| self.bad(name, "its latin-1 data holds a character past U+00FF"))
            }
            PValue::Object(o) => match self.p.as_global(o.callable) {
                Some(("_codecs", "encode")) => {
                    let codec = o.args.get(1).and_then(|&c| self.p.as_str(c));
                    if !matches!(codec, Some("latin1" | "latin-1")) {
                        return Err(self.bad(name, "its data is encoded other than as latin-1"));
                    }
                    let text = o
                        .args
                        .first()
                        .ok_or_else(|| self.bad(name, "its encoded data has no text"))?;
                    self.array_bytes(*text, nbytes, name, nest + 1)
                }
                Some(("__builtin__" | "builtins", "bytes")) if o.args.is_empty() => {
                    if nbytes != 0 {
                        return Err(self.size_mismatch(name, nbytes, 0));
                    }
                    Ok(Vec::new())
                }
                _ => Err(self.bad(name, "its data is not bytes")),
            },
            other => Err(self.bad(
                name,
                format!("its data is {}, not bytes", leaf_value(other)),
            )),
        }
    }
}

/// numpy's strides (in elements) for a contiguous array: row-major, or column-major for a
/// Fortran-order one; a zero-size dimension counts as one, as numpy counts it.
fn numpy_strides(shape: &[usize], fortran: bool) -> Vec<usize> {
    let mut strides = vec![0usize; shape.len()];
    let mut acc = 1usize;
    let mut fill = |i: usize| {
        if let (Some(s), Some(&d)) = (strides.get_mut(i), shape.get(i)) {
            *s = acc;
            acc = acc.saturating_mul(d.max(1));
        }
    };
    if fortran {
        (0..shape.len()).for_each(&mut fill);
    } else {
        (0..shape.len()).rev().for_each(&mut fill);
    }
    strides
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides() {
        assert_eq!(numpy_strides(&[2, 3, 4], false), [12, 4, 1]);
        assert_eq!(numpy_strides(&[2, 3, 4], true), [1, 2, 6]);
        assert_eq!(numpy_strides(&[2, 0, 3], false), [3, 3, 1]);
        assert!(numpy_strides(&[], true).is_empty());
    }

    /// The modules whose array calls are interpreted, and every such call is on the
    /// allow-list (so a checkpoint holding arrays can be `ok`).
    #[test]
    fn modules() {
        assert!(is_numpy_module("numpy.core.multiarray", "multiarray"));
        assert!(is_numpy_module("numpy._core.numeric", "numeric"));
        assert!(!is_numpy_module("numpy._core.numeric", "multiarray"));
        assert!(!is_numpy_module("numpy.multiarray", "multiarray"));
        assert!(!is_numpy_module("numpyx._core.multiarray", "multiarray"));
        for core in ["numpy.core", "numpy._core"] {
            for (sub, name) in [("multiarray", "_reconstruct"), ("numeric", "_frombuffer")] {
                let module = format!("{core}.{sub}");
                assert!(
                    torchport_pickle::allow_list(&module, name).is_some(),
                    "{module}.{name}"
                );
            }
        }
    }
}
