//! safetensors: an 8-byte little-endian header length `N`, `N` bytes of JSON header
//! (`{"name": {"dtype", "shape", "data_offsets": [begin, end]}, …, "__metadata__": {…}}`),
//! then the data section. The header is parsed and validated by the `safetensors` crate
//! straight from the memory-mapped bytes; every tensor is a zero-copy range of the map.
//! Tensors come in data order (by `data_offsets`, what `safe_open(...).offset_keys()`
//! gives); `__metadata__` entries become string values named `__metadata__.<key>`.
//! When the crate rejects a header, the header is parsed once more here, only to say which
//! tensor is wrong and how.

use std::path::Path;

use safetensors::{Dtype, SafeTensorError, SafeTensors};
use serde_json::Value as Json;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::format::kind::Format;
use crate::format::parts::Found;
use crate::format::parts::Parts;
use crate::limits::Limits;
use crate::storage::FileBytes;
use crate::tensor::{check_view, contiguous_strides, ByteOrder, TensorData, TensorInfo};
use crate::value::Value;

/// The largest header the safetensors crate accepts (100 MB).
const MAX_HEADER: u64 = 100_000_000;

/// The header length in the first 8 bytes.
fn header_len(bytes: &[u8]) -> Option<u64> {
    let head: [u8; 8] = bytes.get(..8)?.try_into().ok()?;
    Some(u64::from_le_bytes(head))
}

/// True when the bytes start like a safetensors file: a plausible header length (at most the
/// 100 MB safetensors allows) followed by `{`. Whether the header fits in the file is left to
/// the reader, so a truncated file is reported as such rather than as an unknown format.
pub(crate) fn looks_like(bytes: &[u8]) -> bool {
    bytes.get(8) == Some(&b'{') && header_len(bytes).is_some_and(|n| (2..=MAX_HEADER).contains(&n))
}

/// The one table between torch dtypes and safetensors dtypes, with their names in the
/// header; the reader ([`dtype`]) and the writer ([`safetensors_dtype`]) both use it.
const DTYPES: [(DType, Dtype, &str); 19] = [
    (DType::Bool, Dtype::BOOL, "BOOL"),
    (DType::U8, Dtype::U8, "U8"),
    (DType::I8, Dtype::I8, "I8"),
    (DType::I16, Dtype::I16, "I16"),
    (DType::U16, Dtype::U16, "U16"),
    (DType::I32, Dtype::I32, "I32"),
    (DType::U32, Dtype::U32, "U32"),
    (DType::I64, Dtype::I64, "I64"),
    (DType::U64, Dtype::U64, "U64"),
    (DType::F16, Dtype::F16, "F16"),
    (DType::BF16, Dtype::BF16, "BF16"),
    (DType::F32, Dtype::F32, "F32"),
    (DType::F64, Dtype::F64, "F64"),
    (DType::C64, Dtype::C64, "C64"),
    (DType::F8E4M3Fn, Dtype::F8_E4M3, "F8_E4M3"),
    (DType::F8E5M2, Dtype::F8_E5M2, "F8_E5M2"),
    (DType::F8E4M3Fnuz, Dtype::F8_E4M3FNUZ, "F8_E4M3FNUZ"),
    (DType::F8E5M2Fnuz, Dtype::F8_E5M2FNUZ, "F8_E5M2FNUZ"),
    (DType::F8E8M0Fnu, Dtype::F8_E8M0, "F8_E8M0"),
];

/// The torch dtype of a safetensors dtype; `None` for the sub-byte formats torch has no
/// unpacked dtype for (F4, F6_*).
fn dtype(d: Dtype) -> Option<DType> {
    DTYPES.iter().find(|(_, s, _)| *s == d).map(|(t, _, _)| *t)
}

/// The safetensors dtype name for a torch dtype, if safetensors has one.
pub fn safetensors_dtype(dtype: DType) -> Option<&'static str> {
    DTYPES
        .iter()
        .find(|(t, _, _)| *t == dtype)
        .map(|(_, _, name)| *name)
}

pub(crate) fn read(path: &Path, file: &FileBytes, limits: &Limits) -> Result<Parts> {
    let bytes = file.as_slice();
    let n = header_len(bytes).ok_or_else(|| {
        Error::corrupt(
            path,
            "the file is shorter than the 8-byte safetensors header length",
        )
    })?;
    let after = bytes.len().saturating_sub(8) as u64;
    if n > after {
        return Err(Error::corrupt(
            path,
            format!(
                "the safetensors header length says {n} bytes, but only {after} bytes follow it; \
                 the file is truncated"
            ),
        ));
    }
    let (n, meta) = SafeTensors::read_metadata(bytes).map_err(|e| explain(path, bytes, e))?;
    let data_start = n
        .checked_add(8)
        .ok_or_else(|| Error::corrupt(path, "the safetensors header length overflows"))?;
    let names = meta.offset_keys();
    if names.len() > limits.max_tensors {
        return Err(Error::Limit {
            path: path.to_path_buf(),
            what: format!("{} tensors", names.len()),
            limit: limits.max_tensors as u64,
            field: "max_tensors",
        });
    }
    let mut found = Found::default();
    let mut storages = Vec::with_capacity(names.len());
    for name in names {
        let info = meta
            .info(&name)
            .ok_or_else(|| Error::tensor(path, &name, "its header entry is missing"))?;
        let dt = dtype(info.dtype).ok_or_else(|| {
            Error::tensor(
                path,
                &name,
                format!(
                    "its safetensors dtype {} is a packed sub-byte format torchport does not read",
                    info.dtype
                ),
            )
        })?;
        if info.shape.len() > limits.max_ndim {
            return Err(Error::Limit {
                path: path.to_path_buf(),
                what: format!("tensor {name} with {} dimensions", info.shape.len()),
                limit: limits.max_ndim as u64,
                field: "max_ndim",
            });
        }
        let (begin, end) = info.data_offsets;
        let range = data_start
            .checked_add(begin)
            .zip(data_start.checked_add(end))
            .map(|(b, e)| b..e);
        let storage = range.and_then(|r| file.storage(r)).ok_or_else(|| {
            Error::tensor(
                path,
                &name,
                format!("data_offsets [{begin}, {end}] lie outside the file"),
            )
        })?;
        let strides = contiguous_strides(&info.shape);
        check_view(dt, &info.shape, &strides, 0, storage.len())
            .map_err(|what| Error::tensor(path, &name, what))?;
        found.tensors.push(TensorInfo {
            name,
            dtype: dt,
            shape: info.shape.clone(),
            strides,
            offset: 0,
            data: TensorData::Strided {
                storage: storages.len(),
            },
            quant: None,
            requires_grad: false,
        });
        storages.push(storage);
    }
    if let Some(m) = meta.metadata() {
        let mut entries: Vec<(&String, &String)> = m.iter().collect();
        entries.sort();
        found.values = entries
            .into_iter()
            .map(|(k, v)| (format!("__metadata__.{k}"), Value::Str(v.clone())))
            .collect();
    }
    Ok(Parts::new(
        Format::Safetensors,
        ByteOrder::Little,
        found,
        Vec::new(),
        storages,
    ))
}

/// Turn the crate's error into one sentence that names the tensor at fault where possible.
fn explain(path: &Path, bytes: &[u8], e: SafeTensorError) -> Error {
    let header = header_len(bytes)
        .and_then(|n| usize::try_from(n).ok())
        .and_then(|n| Some((n, bytes.get(8..8usize.checked_add(n)?)?)));
    let plain = |what: String| Error::corrupt(path, what);
    match e {
        SafeTensorError::HeaderTooLarge => plain(format!(
            "the safetensors header length exceeds the {MAX_HEADER} bytes safetensors allows"
        )),
        SafeTensorError::InvalidHeader(u) => {
            plain(format!("the safetensors header is not valid UTF-8: {u}"))
        }
        other => {
            if let Some((n, h)) = header {
                let data_len = bytes.len().saturating_sub(8).saturating_sub(n);
                if let Some(err) = diagnose(path, h, data_len) {
                    return err;
                }
            }
            let what = match other {
                SafeTensorError::InvalidHeaderDeserialization(j) => {
                    format!("the safetensors header is invalid: {j}")
                }
                other => format!("the safetensors header is invalid: {other}"),
            };
            plain(what)
        }
    }
}

/// One header entry, as far as it could be read.
struct Entry {
    name: String,
    dtype: Dtype,
    shape: Vec<u64>,
    begin: u64,
    end: u64,
}

/// Find the first problem in a header the crate rejected; `None` when none is found here.
fn diagnose(path: &Path, header: &[u8], data_len: usize) -> Option<Error> {
    let corrupt = |what: String| Some(Error::corrupt(path, what));
    let json: Json = match serde_json::from_slice(header) {
        Ok(j) => j,
        Err(e) => return corrupt(format!("the safetensors header is not valid JSON: {e}")),
    };
    let Json::Object(map) = json else {
        return corrupt("the safetensors header is not a JSON object".into());
    };
    let mut entries = Vec::with_capacity(map.len());
    for (name, v) in map {
        let bad = |what: String| Some(Error::tensor(path, &name, what));
        if name == "__metadata__" {
            let strings = v
                .as_object()
                .is_some_and(|m| m.values().all(Json::is_string));
            if !strings {
                return corrupt("the __metadata__ entry must map strings to strings".into());
            }
            continue;
        }
        let Some(o) = v.as_object() else {
            return bad("its header entry is not an object".into());
        };
        let dtype = match o.get("dtype") {
            Some(Json::String(d)) => match serde_json::from_value::<Dtype>(Json::String(d.clone()))
            {
                Ok(dt) => dt,
                Err(_) => return bad(format!("its dtype {d:?} is not one safetensors defines")),
            },
            _ => return bad("its header entry has no dtype string".into()),
        };
        let shape: Option<Vec<u64>> = o
            .get("shape")
            .and_then(Json::as_array)
            .and_then(|a| a.iter().map(Json::as_u64).collect());
        let Some(shape) = shape else {
            return bad("its header entry has no shape list of non-negative integers".into());
        };
        let offsets: Option<Vec<u64>> = o
            .get("data_offsets")
            .and_then(Json::as_array)
            .and_then(|a| a.iter().map(Json::as_u64).collect());
        let Some(&[begin, end]) = offsets.as_deref() else {
            return bad("its header entry has no data_offsets pair [begin, end]".into());
        };
        entries.push(Entry {
            name,
            dtype,
            shape,
            begin,
            end,
        });
    }
    entries.sort_by_key(|e| (e.begin, e.end));
    let mut covered = 0u64;
    let mut prev: Option<&str> = None;
    for e in &entries {
        let bad = |what: String| Some(Error::tensor(path, &e.name, what));
        let (b, en) = (e.begin, e.end);
        if en < b {
            return bad(format!("data_offsets [{b}, {en}] end before they begin"));
        }
        if b < covered {
            let p = prev.unwrap_or("before it");
            return bad(format!(
                "data_offsets [{b}, {en}] overlap tensor {p}, which ends at byte {covered}"
            ));
        }
        if b > covered {
            let after = prev.map_or("the start of the data section".to_string(), |p| {
                format!("tensor {p}, which ends at byte {covered}")
            });
            return bad(format!(
                "data_offsets [{b}, {en}] leave a gap of {} bytes after {after}",
                b - covered
            ));
        }
        let bits = e
            .shape
            .iter()
            .try_fold(1u64, |acc, &s| acc.checked_mul(s))
            .and_then(|n| n.checked_mul(e.dtype.bitsize() as u64));
        let Some(bits) = bits else {
            return bad(format!("shape {:?} of {} overflows", e.shape, e.dtype));
        };
        if bits % 8 != 0 {
            return bad(format!(
                "shape {:?} of {} is {bits} bits, not a whole number of bytes",
                e.shape, e.dtype
            ));
        }
        if bits / 8 != en - b {
            return bad(format!(
                "shape {:?} of {} needs {} bytes, but data_offsets [{b}, {en}] span {}",
                e.shape,
                e.dtype,
                bits / 8,
                en - b
            ));
        }
        covered = en;
        prev = Some(&e.name);
    }
    let data_len = data_len as u64;
    if covered > data_len {
        let last = prev.unwrap_or("?");
        return Some(Error::tensor(
            path,
            last,
            format!(
                "data_offsets end at byte {covered}, but the data section holds only {data_len} bytes"
            ),
        ));
    }
    if covered < data_len {
        return corrupt(format!(
            "the data section holds {data_len} bytes but the tensors cover only {covered}; \
             the header does not describe the whole file"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: usize) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.resize(v.len() + data, 0);
        v
    }

    #[test]
    fn detection() {
        assert!(looks_like(&file("{}", 0)));
        assert!(!looks_like(b"{\"weight_map\": {}}"));
        assert!(!looks_like(&[0xff; 16]));
    }

    #[test]
    fn diagnosis_names_the_tensor() {
        let h = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
        let e = diagnose(Path::new("f"), h.as_bytes(), 12)
            .unwrap()
            .to_string();
        assert!(
            e.contains("tensor b") && e.contains("overlap tensor a"),
            "{e}"
        );
        let h = r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#;
        let e = diagnose(Path::new("f"), h.as_bytes(), 8)
            .unwrap()
            .to_string();
        assert!(
            e.contains("tensor a") && e.contains("needs 12 bytes"),
            "{e}"
        );
        let h = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
        assert!(diagnose(Path::new("f"), h.as_bytes(), 8).is_none());
    }
}
