//! numpy files: `.npy` (one array) and `.npz` (a zip archive of `.npy` records).
//!
//! An `.npy` file is the magic `\x93NUMPY`, a version (1.0, 2.0 or 3.0), a header length
//! (2 bytes for 1.0, 4 otherwise), a Python dict literal
//! `{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }`, then the raw elements.
//! The header is parsed by a small literal parser that accepts only strings, integers,
//! `True`/`False`/`None`, tuples, lists and dicts (nothing is evaluated). Every numeric and
//! bool dtype is read in either byte order (big-endian data is swapped when read, through
//! the storage's byte order); Fortran-order arrays keep their layout and get column-major
//! strides; object, string, void (structured) and datetime arrays are refused.
//!
//! Names: an `.npy` file's one array is named after the file: its file name without a
//! trailing `.npy` (`weights.npy` → `weights`, `x.v2.npy` → `x.v2`, `data` → `data`), or
//! `array` when that leaves nothing. In an `.npz` each record `name.npy` becomes tensor
//! `name`, in the archive's order — the names `numpy.load(...).files` gives.

use std::path::Path;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::format::archive::Archive;
use crate::format::kind::Format;
use crate::format::parts::Found;
use crate::format::parts::Parts;
use crate::limits::Limits;
use crate::storage::{FileBytes, Storage};
use crate::tensor::{check_view, contiguous_strides, ByteOrder, TensorData, TensorInfo};

/// The first bytes of every `.npy` file.
pub(crate) const MAGIC: &[u8] = b"\x93NUMPY";

/// Deepest nesting of brackets accepted in a header.
const MAX_LITERAL_DEPTH: usize = 32;

/// Read a `.npy` file: one tensor named after the file.
pub(crate) fn read_npy(path: &Path, file: &FileBytes, limits: &Limits) -> Result<Parts> {
    let whole = file
        .storage(0..file.as_slice().len())
        .ok_or_else(|| Error::corrupt(path, "the file cannot be mapped"))?;
    let name = npy_name(path);
    let (tensor, storage) = array(path, None, &name, &whole, 0, limits)?;
    let order = storage.byte_order();
    let found = Found {
        tensors: vec![tensor],
        ..Found::default()
    };
    Ok(Parts::new(
        Format::Npy,
        order,
        found,
        Vec::new(),
        vec![storage],
    ))
}

/// Read an `.npz` archive: one tensor per `.npy` record; stored records stay in the map,
/// deflated ones are decompressed under `Limits::max_decompressed`.
pub(crate) fn read_npz(path: &Path, file: &FileBytes, limits: &Limits) -> Result<Parts> {
    let mut ar = Archive::new(path, file, limits)?;
    let names = ar.names();
    if names.len() > limits.max_tensors {
        return Err(Error::Limit {
            path: path.to_path_buf(),
            what: format!("{} arrays", names.len()),
            limit: limits.max_tensors as u64,
            field: "max_tensors",
        });
    }
    let mut found = Found::default();
    let mut storages = Vec::with_capacity(names.len());
    for record in &names {
        let name = record.strip_suffix(".npy").unwrap_or(record);
        let bytes = ar.record(record)?;
        let ctx = format!("record {record}");
        let (tensor, storage) = array(path, Some(&ctx), name, &bytes, storages.len(), limits)?;
        found.tensors.push(tensor);
        storages.push(storage);
    }
    // The whole file is big-endian only when every multi-byte array is.
    let mut wide = found
        .tensors
        .iter()
        .zip(&storages)
        .filter(|(t, _)| t.dtype.size() > 1)
        .peekable();
    let order = if wide.peek().is_some() && wide.all(|(_, s)| s.byte_order() == ByteOrder::Big) {
        ByteOrder::Big
    } else {
        ByteOrder::Little
    };
    Ok(Parts::new(Format::Npz, order, found, Vec::new(), storages))
}

/// The tensor name of a `.npy` file (see the module docs).
fn npy_name(path: &Path) -> String {
    let file = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = file.strip_suffix(".npy").unwrap_or(&file);
    if stem.is_empty() {
        "array".to_string()
    } else {
        stem.to_string()
    }
}

/// What an `.npy` header says.
#[derive(Debug, PartialEq)]
struct Header {
    dtype: DType,
    order: ByteOrder,
    fortran: bool,
    shape: Vec<usize>,
    /// Offset of the first element from the start of the `.npy` bytes.
    data_start: usize,
}

/// Describe the array held in `npy` (a whole `.npy` file or record) as tensor `name` over
/// storage number `index`; returns the tensor and the storage holding exactly its bytes.
/// `record` names the npz record in messages.
fn array(
    path: &Path,
    record: Option<&str>,
    name: &str,
    npy: &Storage,
    index: usize,
    limits: &Limits,
) -> Result<(TensorInfo, Storage)> {
    let corrupt = |what: String| match record {
        Some(r) => Error::corrupt(path, format!("{r}: {what}")),
        None => Error::corrupt(path, what),
    };
    let h = parse_header(npy.bytes()).map_err(corrupt)?;
    if h.shape.len() > limits.max_ndim {
        return Err(Error::Limit {
            path: path.to_path_buf(),
            what: format!("array {name} with {} dimensions", h.shape.len()),
            limit: limits.max_ndim as u64,
            field: "max_ndim",
        });
    }
    let nbytes = h
        .shape
        .iter()
        .try_fold(h.dtype.size(), |acc, &s| acc.checked_mul(s))
        .ok_or_else(|| {
            corrupt(format!(
                "array {name}: shape {:?} of {} overflows",
                h.shape, h.dtype
            ))
        })?;
    let available = npy.len().saturating_sub(h.data_start);
    let storage = h
        .data_start
        .checked_add(nbytes)
        .and_then(|end| npy.slice(h.data_start..end))
        .ok_or_else(|| {
            corrupt(format!(
                "array {name}: shape {:?} of {} needs {nbytes} bytes of data, but only \
                 {available} follow the header; the file is truncated",
                h.shape, h.dtype
            ))
        })?
        .with_order(h.order);
    let strides = if h.fortran {
        // Column-major: the first index varies fastest (C strides of the reversed shape).
        let mut rev = h.shape.clone();
        rev.reverse();
        let mut s = contiguous_strides(&rev);
        s.reverse();
        s
    } else {
        contiguous_strides(&h.shape)
    };
    check_view(h.dtype, &h.shape, &strides, 0, storage.len())
        .map_err(|what| Error::tensor(path, name, what))?;
    let tensor = TensorInfo {
        name: name.to_string(),
        dtype: h.dtype,
        shape: h.shape,
        strides,
        offset: 0,
        data: TensorData::Strided { storage: index },
        quant: None,
        requires_grad: false,
    };
    Ok((tensor, storage))
}

/// Parse the magic, version and header dict of an `.npy`.
fn parse_header(bytes: &[u8]) -> Result<Header, String> {
    if !bytes.starts_with(MAGIC) {
        return Err("it does not start with the numpy magic \\x93NUMPY".into());
    }
    let (major, minor) = match bytes.get(6..8) {
        Some(&[a, b]) => (a, b),
        _ => return Err("it is truncated inside the numpy preamble".into()),
    };
    let len_size = match major {
        1 => 2,
        2 | 3 => 4,
        _ => {
            return Err(format!(
                "format version {major}.{minor} is not one numpy writes (1.0, 2.0 or 3.0)"
            ))
        }
    };
    let start = 8 + len_size;
    let hlen = match bytes.get(8..start) {
        Some(&[a, b]) => u16::from_le_bytes([a, b]) as usize,
        Some(&[a, b, c, d]) => u32::from_le_bytes([a, b, c, d]) as usize,
        _ => return Err("it is truncated inside the numpy preamble".into()),
    };
    let header = start
        .checked_add(hlen)
        .and_then(|end| bytes.get(start..end))
        .ok_or_else(|| {
            format!(
                "the header length says {hlen} bytes, but only {} follow",
                bytes.len().saturating_sub(start)
            )
        })?;
    let text = std::str::from_utf8(header).map_err(|e| format!("the header is not text: {e}"))?;
    let dict = match Parser::new(text).literal_document()? {
        Lit::Dict(d) => d,
        _ => return Err("the header is not a Python dict literal".into()),
    };
    let get = |key: &str| {
        dict.iter()
            .find(|(k, _)| matches!(k, Lit::Str(s) if s == key))
            .map(|(_, v)| v)
            .ok_or_else(|| format!("the header has no '{key}' entry"))
    };
    let (dtype, order) = match get("descr")? {
        Lit::Str(d) => descr(d)?,
        Lit::Seq(..) => {
            return Err(
                "the array has a structured dtype (a list of fields); only plain numeric and \
                 bool arrays are read"
                    .into(),
            )
        }
        _ => return Err("the header's 'descr' is not a dtype string".into()),
    };
    let fortran = match get("fortran_order")? {
        Lit::Bool(b) => *b,
        _ => return Err("the header's 'fortran_order' is not True or False".into()),
    };
    let shape = match get("shape")? {
        Lit::Seq(items, _) => items
            .iter()
            .map(|d| match d {
                Lit::Int(n) => usize::try_from(*n).ok(),
                _ => None,
            })
            .collect::<Option<Vec<usize>>>()
            .ok_or("the header's 'shape' holds something other than sizes")?,
        _ => return Err("the header's 'shape' is not a tuple".into()),
    };
    Ok(Header {
        dtype,
        order,
        fortran,
        shape,
        data_start: start + hlen,
    })
}

/// What a numpy type code (a dtype string without its byte-order character: `f4`, `b1`,
/// `O8`, `U3`, …) holds: a torch dtype, or the reason it is no tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NpKind {
    /// Numbers (or bools) torch has a dtype for.
    Numeric(DType),
    /// Python objects (`O`).
    Objects,
    /// Strings (`U`, `S`, `a`, `T`).
    Strings,
    /// Raw records (`V`: structured and void dtypes).
    Records,
    /// Dates or durations (`M`, `m`).
    Dates,
    /// Extended-precision floats (`f12`, `f16`, `c24`, `c32`, `g`, `G`).
    Extended,
    /// Not a numpy type code.
    Unknown,
}

/// Classify a numpy type code (see [`NpKind`]); the one table the `.npy` reader and the
/// pickled arrays of `torch.save` files share.
pub(crate) fn np_kind(kind: &str) -> NpKind {
    if let Some((dtype, _, _)) = NUMERIC
        .iter()
        .find(|(_, descr, code)| &descr[1..] == kind || *code == kind)
    {
        return NpKind::Numeric(*dtype);
    }
    match kind {
        k if k.starts_with('O') => NpKind::Objects,
        k if k.starts_with(['U', 'S', 'a', 'T']) => NpKind::Strings,
        k if k.starts_with('V') => NpKind::Records,
        k if k.starts_with(['M', 'm']) => NpKind::Dates,
        "f12" | "f16" | "c24" | "c32" | "g" | "G" => NpKind::Extended,
        _ => NpKind::Unknown,
    }
}

/// The numeric numpy types torch has a dtype for: the dtype, numpy's little-endian type
/// string (`descr`, `|` for one-byte types), and its one-character code. The reader
/// ([`np_kind`]) and the writer ([`npy_descr`]) both use it.
const NUMERIC: [(DType, &str, &str); 14] = [
    (DType::Bool, "|b1", "?"),
    (DType::I8, "|i1", "b"),
    (DType::U8, "|u1", "B"),
    (DType::I16, "<i2", "h"),
    (DType::U16, "<u2", "H"),
    (DType::I32, "<i4", "i"),
    (DType::U32, "<u4", "I"),
    (DType::I64, "<i8", "q"),
    (DType::U64, "<u8", "Q"),
    (DType::F16, "<f2", "e"),
    (DType::F32, "<f4", "f"),
    (DType::F64, "<f8", "d"),
    (DType::C64, "<c8", "F"),
    (DType::C128, "<c16", "D"),
];

/// The numpy type string (`descr`) for a torch dtype, if numpy has that type.
pub fn npy_descr(dtype: DType) -> Option<&'static str> {
    NUMERIC
        .iter()
        .find(|(d, _, _)| *d == dtype)
        .map(|(_, descr, _)| *descr)
}

/// A numpy dtype string (`<f4`, `>i8`, `|b1`, …) as a torch dtype and a byte order.
fn descr(d: &str) -> Result<(DType, ByteOrder), String> {
    let (order, kind) = match d.as_bytes().first() {
        Some(b'<') | Some(b'|') | Some(b'=') => (ByteOrder::Little, &d[1..]),
        Some(b'>') => (ByteOrder::Big, &d[1..]),
        _ => (ByteOrder::Little, d),
    };
    let why = match np_kind(kind) {
        NpKind::Numeric(dtype) => return Ok((dtype, order)),
        NpKind::Objects => {
            "holds Python objects (dtype {d}); object arrays are pickles and are refused"
        }
        NpKind::Strings => "holds strings (dtype {d}), not numbers",
        NpKind::Records => "holds raw records (void dtype {d}), not numbers",
        NpKind::Dates => "holds dates or durations (dtype {d}), not plain numbers",
        NpKind::Extended => {
            "holds extended-precision floats (dtype {d}), which torch has no dtype for"
        }
        NpKind::Unknown => return Err(format!("dtype {d:?} is not a numpy dtype torchport reads")),
    };
    Err(format!(
        "the array {}",
        why.replace("{d}", &format!("{d:?}"))
    ))
}

/// A Python literal in an `.npy` header.
#[derive(Debug, PartialEq)]
enum Lit {
    Str(String),
    Int(i128),
    Bool(bool),
    None,
    /// A tuple (`(`) or list (`[`).
    Seq(Vec<Lit>, char),
    Dict(Vec<(Lit, Lit)>),
}

/// A recursive-descent parser for the literals numpy writes; it evaluates nothing.
struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Self {
        Parser { text, pos: 0 }
    }

    fn rest(&self) -> &'a str {
        self.text.get(self.pos..).unwrap_or_default()
    }

    fn skip_ws(&mut self) {
        let rest = self.rest();
        self.pos += rest.len() - rest.trim_start().len();
    }

    fn peek(&mut self) -> Option<char> {
        self.skip_ws();
        self.rest().chars().next()
    }

    fn err(&self, what: &str) -> String {
        format!(
            "the header is not a literal numpy writes ({what} at character {})",
            self.pos
        )
    }

    /// One literal followed only by whitespace.
    fn literal_document(&mut self) -> Result<Lit, String> {
        let lit = self.literal(0)?;
        if self.peek().is_some() {
            return Err(self.err("unexpected text after the dict"));
        }
        Ok(lit)
    }

    fn literal(&mut self, depth: usize) -> Result<Lit, String> {
        if depth > MAX_LITERAL_DEPTH {
            return Err(self.err("too deeply nested"));
        }
        match self.peek() {
            Some(open @ ('(' | '[')) => {
                self.pos += 1;
                let close = if open == '(' { ')' } else { ']' };
                let mut items = Vec::new();
                loop {
                    if self.peek() == Some(close) {
                        self.pos += 1;
                        return Ok(Lit::Seq(items, open));
                    }
                    items.push(self.literal(depth + 1)?);
                    match self.peek() {
                        Some(',') => self.pos += 1,
                        Some(c) if c == close => {}
                        _ => return Err(self.err("expected ',' or a closing bracket")),
                    }
                }
            }
            Some('{') => {
                self.pos += 1;
                let mut items = Vec::new();
                loop {
                    if self.peek() == Some('}') {
                        self.pos += 1;
                        return Ok(Lit::Dict(items));
                    }
                    let k = self.literal(depth + 1)?;
                    if self.peek() != Some(':') {
                        return Err(self.err("expected ':'"));
                    }
                    self.pos += 1;
                    let v = self.literal(depth + 1)?;
                    items.push((k, v));
                    match self.peek() {
                        Some(',') => self.pos += 1,
                        Some('}') => {}
                        _ => return Err(self.err("expected ',' or '}'")),
                    }
                }
            }
            Some(q @ ('\'' | '"')) => self.string(q),
            Some(c) if c.is_ascii_digit() || c == '-' => self.int(),
            Some(c) if c.is_ascii_alphabetic() => {
                let word: String = self
                    .rest()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let lit = match word.as_str() {
                    "True" => Lit::Bool(true),
                    "False" => Lit::Bool(false),
                    "None" => Lit::None,
                    _ => return Err(self.err(&format!("unexpected name {word:?}"))),
                };
                self.pos += word.len();
                Ok(lit)
            }
            Some(_) => Err(self.err("unexpected character")),
            None => Err(self.err("it ends too early")),
        }
    }

    fn string(&mut self, quote: char) -> Result<Lit, String> {
        self.pos += 1;
        let mut out = String::new();
        let mut chars = self.rest().char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, e)) => out.push(e),
                    None => break,
                },
                c if c == quote => {
                    self.pos += i + c.len_utf8();
                    return Ok(Lit::Str(out));
                }
                c => out.push(c),
            }
        }
        Err(self.err("unterminated string"))
    }

    fn int(&mut self) -> Result<Lit, String> {
        let rest = self.rest();
        let neg = rest.starts_with('-');
        let digits: &str = {
            let body = &rest[usize::from(neg)..];
            let n = body.bytes().take_while(u8::is_ascii_digit).count();
            &body[..n]
        };
        if digits.is_empty() {
            return Err(self.err("expected a number"));
        }
        let mut n: i128 = digits.parse().map_err(|_| self.err("number too large"))?;
        if neg {
            n = -n;
        }
        self.pos += usize::from(neg) + digits.len();
        // Python 2 wrote long integers with an `L` suffix.
        if self.rest().starts_with('L') {
            self.pos += 1;
        }
        Ok(Lit::Int(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(header: &str) -> Vec<u8> {
        let mut v = MAGIC.to_vec();
        v.extend_from_slice(&[1, 0]);
        v.extend_from_slice(&(header.len() as u16).to_le_bytes());
        v.extend_from_slice(header.as_bytes());
        v
    }

    #[test]
    fn headers() {
        let h = parse_header(&npy(
            "{'descr': '>f4', 'fortran_order': True, 'shape': (2, 3), }  \n",
        ))
        .unwrap();
        assert_eq!(h.dtype, DType::F32);
        assert_eq!(h.order, ByteOrder::Big);
        assert!(h.fortran);
        assert_eq!(h.shape, [2, 3]);
        let h = parse_header(&npy(
            "{'descr': '|b1', 'fortran_order': False, 'shape': (), }",
        ))
        .unwrap();
        assert_eq!((h.dtype, h.shape.len()), (DType::Bool, 0));
        let h = parse_header(&npy("{'descr':'<i8','fortran_order':False,'shape':(3L,)}")).unwrap();
        assert_eq!(h.shape, [3]);
    }

    #[test]
    fn refusals() {
        let e = |h: &str| parse_header(&npy(h)).unwrap_err();
        assert!(e("{'descr': '|O', 'fortran_order': False, 'shape': (2,), }").contains("objects"));
        assert!(
            e("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}")
                .contains("structured")
        );
        assert!(e("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}").contains("shape"));
        assert!(e("{'descr': '<f4', 'shape': (1,)}").contains("fortran_order"));
        assert!(e("{'descr': '<f4', 'fortran_order': __import__('os')}").contains("unexpected"));
        let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert!(e(&deep).contains("nested"));
        let mut short = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}");
        short.truncate(20);
        assert!(parse_header(&short).unwrap_err().contains("only"));
    }

    #[test]
    fn names() {
        assert_eq!(npy_name(Path::new("dir/w.npy")), "w");
        assert_eq!(npy_name(Path::new("x.v2.npy")), "x.v2");
        assert_eq!(npy_name(Path::new("data")), "data");
        assert_eq!(npy_name(Path::new(".npy")), "array");
    }
}
