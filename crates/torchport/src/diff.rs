//! Comparing two checkpoints tensor by tensor — the library side of `torchport diff`, and
//! what the porting tools use to check a port.
//!
//! For every name both files hold: dtype and shape differences, the largest absolute error
//! `|a - b|`, the largest relative error `|a - b| / |b|`, and how many elements are not close.
//! An element is close when `|a - b| <= atol + rtol * |b|` (numpy's `allclose` rule, with `b`
//! the second file); two NaNs count as equal, as do two infinities of the same sign. Elements
//! are decoded to `f64` ([`crate::cast::to_f64`]), so tensors of different real dtypes are
//! compared by value (a float16 copy of a float32 tensor is close when its rounding is within
//! tolerance; the dtypes are reported, not judged) and 64-bit integers beyond 2^53 are compared approximately. Complex and
//! quantized tensors (no single real value per element) are compared byte for byte.
//! Defaults: `atol = 1e-6`, `rtol = 1e-5` (numpy's rtol; an atol that forgives float32
//! round-off near zero).

use std::borrow::Cow;

use serde_json::{json, Value as Json};

use crate::cast::to_f64;
use crate::checkpoint::Checkpoint;
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::TensorData;

/// Tolerances.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DiffOptions {
    /// Absolute tolerance. Default `1e-6`.
    pub atol: f64,
    /// Relative tolerance (times `|b|`). Default `1e-5`.
    pub rtol: f64,
}

impl Default for DiffOptions {
    fn default() -> Self {
        DiffOptions {
            atol: 1e-6,
            rtol: 1e-5,
        }
    }
}

/// One side of a comparison: dtype, shape and (when it has any) contiguous LE bytes.
#[derive(Clone, Debug)]
pub struct Side<'a> {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Contiguous little-endian bytes; `None` for a tensor without data (meta, sparse…).
    pub data: Option<Cow<'a, [u8]>>,
}

/// The comparison of one tensor present in both files.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorDiff {
    /// The name.
    pub name: String,
    /// dtype in the first file.
    pub dtype_a: DType,
    /// dtype in the second file.
    pub dtype_b: DType,
    /// Shape in the first file.
    pub shape_a: Vec<usize>,
    /// Shape in the second file.
    pub shape_b: Vec<usize>,
    /// Largest `|a - b|` (infinite where one side is NaN or infinite and the other is not);
    /// `None` when the values were not compared numerically.
    pub max_abs: Option<f64>,
    /// Largest `|a - b| / |b|` (infinite where `b` is 0 and `a` is not).
    pub max_rel: Option<f64>,
    /// Index (row-major) of the element with the largest absolute error, if any differ.
    pub worst_index: Option<usize>,
    /// Elements that are not close (for byte-compared tensors: elements that differ).
    pub mismatched: u64,
    /// Elements compared.
    pub numel: u64,
    /// True when the shapes match and every element is close.
    pub close: bool,
    /// How it was compared, when not simply by value (bytewise, shapes differ, no data…).
    pub note: Option<String>,
}

/// The comparison of two files.
#[derive(Clone, Debug, PartialEq)]
pub struct Diff {
    /// Tolerances used.
    pub options: DiffOptions,
    /// Names (with data or not) only the first file has.
    pub only_a: Vec<String>,
    /// Names only the second file has.
    pub only_b: Vec<String>,
    /// Every name both have, in the first file's order.
    pub tensors: Vec<TensorDiff>,
}

impl Diff {
    /// True when no name is missing on either side and every shared tensor is close.
    pub fn is_close(&self) -> bool {
        self.only_a.is_empty() && self.only_b.is_empty() && self.tensors.iter().all(|t| t.close)
    }

    /// Machine-readable form: `{"close", "atol", "rtol", "only_in_a", "only_in_b",
    /// "tensors": [{"name", "dtype_a", "dtype_b", "shape_a", "shape_b", "max_abs",
    /// "max_rel", "worst_index", "mismatched", "numel", "close", "note"}]}`. Errors are
    /// numbers, the string `"inf"` when infinite, or null when not computed.
    pub fn to_json(&self) -> Json {
        let num = |x: Option<f64>| match x {
            Some(v) if v.is_finite() => json!(v),
            Some(_) => json!("inf"),
            None => Json::Null,
        };
        let tensors: Vec<Json> = self
            .tensors
            .iter()
            .map(|t| {
                json!({
                    "name": t.name,
                    "dtype_a": t.dtype_a.name(),
                    "dtype_b": t.dtype_b.name(),
                    "shape_a": t.shape_a,
                    "shape_b": t.shape_b,
                    "max_abs": num(t.max_abs),
                    "max_rel": num(t.max_rel),
                    "worst_index": t.worst_index,
                    "mismatched": t.mismatched,
                    "numel": t.numel,
                    "close": t.close,
                    "note": t.note,
                })
            })
            .collect();
        json!({
            "close": self.is_close(),
            "atol": self.options.atol,
            "rtol": self.options.rtol,
            "only_in_a": self.only_a,
            "only_in_b": self.only_b,
            "tensors": tensors,
        })
    }
}

fn side<'a>(ckpt: &'a Checkpoint, name: &str) -> Result<Side<'a>> {
    // Callers only ask for names the checkpoint has.
    let t = ckpt
        .tensor(name)
        .ok_or_else(|| crate::error::Error::NoSuchTensor {
            path: ckpt.path().to_path_buf(),
            name: name.to_string(),
        })?;
    let data = match t.data {
        TensorData::Strided { .. } => Some(ckpt.data(t)?),
        _ => None,
    };
    Ok(Side {
        dtype: t.dtype,
        shape: t.shape.clone(),
        data,
    })
}

/// Compare two checkpoints (reading each shared tensor once, one pair at a time).
pub fn diff(a: &Checkpoint, b: &Checkpoint, opts: &DiffOptions) -> Result<Diff> {
    let only_a = a
        .tensors()
        .iter()
        .filter(|t| b.tensor(&t.name).is_none())
        .map(|t| t.name.clone())
        .collect();
    let only_b = b
        .tensors()
        .iter()
        .filter(|t| a.tensor(&t.name).is_none())
        .map(|t| t.name.clone())
        .collect();
    let mut tensors = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for t in a.tensors() {
        if b.tensor(&t.name).is_none() || !seen.insert(t.name.as_str()) {
            continue;
        }
        let sa = side(a, &t.name)?;
        let sb = side(b, &t.name)?;
        tensors.push(compare(&t.name, &sa, &sb, opts));
    }
    Ok(Diff {
        options: *opts,
        only_a,
        only_b,
        tensors,
    })
}

/// True for dtypes [`to_f64`] decodes.
fn is_real(d: DType) -> bool {
    to_f64(d, &[]).is_ok()
}

/// Compare one pair of tensors.
pub fn compare(name: &str, a: &Side<'_>, b: &Side<'_>, opts: &DiffOptions) -> TensorDiff {
    let mut d = TensorDiff {
        name: name.to_string(),
        dtype_a: a.dtype,
        dtype_b: b.dtype,
        shape_a: a.shape.clone(),
        shape_b: b.shape.clone(),
        max_abs: None,
        max_rel: None,
        worst_index: None,
        mismatched: 0,
        numel: 0,
        close: false,
        note: None,
    };
    if a.shape != b.shape {
        d.note = Some("shapes differ".into());
        return d;
    }
    let (da, db) = match (&a.data, &b.data) {
        (Some(x), Some(y)) => (x.as_ref(), y.as_ref()),
        (None, None) => {
            d.close = a.dtype == b.dtype;
            d.note =
                Some("neither has data (meta or sparse); compared dtype and shape only".into());
            return d;
        }
        _ => {
            d.note = Some("only one side has data".into());
            return d;
        }
    };
    let numel: usize = a.shape.iter().product();
    d.numel = numel as u64;
    if a.dtype == b.dtype && da == db {
        d.max_abs = Some(0.0);
        d.max_rel = Some(0.0);
        d.close = true;
        return d;
    }
    if !(is_real(a.dtype) && is_real(b.dtype)) {
        if a.dtype != b.dtype {
            d.note = Some(format!(
                "dtypes differ ({} vs {}) and cannot be compared by value",
                a.dtype, b.dtype
            ));
            return d;
        }
        let size = a.dtype.size().max(1);
        d.mismatched = da
            .chunks(size)
            .zip(db.chunks(size))
            .filter(|(x, y)| x != y)
            .count() as u64;
        d.close = d.mismatched == 0 && da.len() == db.len();
        d.note = Some(format!("{} compared bytewise", a.dtype));
        return d;
    }
    values(&mut d, a.dtype, da, b.dtype, db, opts);
    d
}

/// Compare element values, a chunk at a time.
fn values(d: &mut TensorDiff, ta: DType, da: &[u8], tb: DType, db: &[u8], opts: &DiffOptions) {
    const CHUNK: usize = 1 << 16;
    let (sa, sb) = (ta.size(), tb.size());
    let (mut max_abs, mut max_rel) = (0.0f64, 0.0f64);
    let mut worst: Option<(usize, f64)> = None;
    for (ci, (ca, cb)) in da.chunks(CHUNK * sa).zip(db.chunks(CHUNK * sb)).enumerate() {
        let (Ok(va), Ok(vb)) = (to_f64(ta, ca), to_f64(tb, cb)) else {
            d.note = Some("the data has a length that is not a whole number of elements".into());
            return;
        };
        for (i, (&x, &y)) in va.iter().zip(&vb).enumerate() {
            let same = x == y || (x.is_nan() && y.is_nan());
            let abs = if same {
                0.0
            } else {
                let e = (x - y).abs();
                if e.is_nan() {
                    f64::INFINITY
                } else {
                    e
                }
            };
            let rel = if abs == 0.0 {
                0.0
            } else if y == 0.0 || !y.is_finite() {
                f64::INFINITY
            } else {
                abs / y.abs()
            };
            if abs > opts.atol + opts.rtol * y.abs() || (abs > 0.0 && !abs.is_finite()) {
                d.mismatched += 1;
            }
            if abs > 0.0 && worst.is_none_or(|(_, w)| abs > w) {
                worst = Some((ci * CHUNK + i, abs));
            }
            max_abs = max_abs.max(abs);
            max_rel = max_rel.max(rel);
        }
    }
    d.max_abs = Some(max_abs);
    d.max_rel = Some(max_rel);
    d.worst_index = worst.map(|(i, _)| i);
    d.close = d.mismatched == 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_side(v: &[f32]) -> Side<'static> {
        Side {
            dtype: DType::F32,
            shape: vec![v.len()],
            data: Some(Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect())),
        }
    }

    #[test]
    fn allclose_rule() {
        let o = DiffOptions::default();
        let a = f32_side(&[1.0, 2.0, f32::NAN, f32::INFINITY, 0.0]);
        let same = compare("t", &a, &a.clone(), &o);
        assert!(same.close);
        assert_eq!(same.max_abs, Some(0.0));
        // NaN payloads differ bytewise but count as equal.
        let mut nan2 = a.clone();
        if let Some(Cow::Owned(bytes)) = &mut nan2.data {
            bytes[8..12].copy_from_slice(&0x7fc0_0001u32.to_le_bytes());
        }
        assert!(compare("t", &a, &nan2, &o).close);

        let b = f32_side(&[1.0, 2.00001, f32::NAN, f32::INFINITY, 0.0]);
        let d = compare("t", &b, &a, &o);
        // |2.00001 - 2| ~ 1e-5 <= 1e-6 + 1e-5 * 2
        assert!(d.close, "{d:?}");
        let c = f32_side(&[1.0, 2.001, 0.0, f32::INFINITY, 0.5]);
        let d = compare("t", &c, &a, &o);
        assert!(!d.close);
        assert_eq!(d.mismatched, 3); // 2.001, NaN vs 0, 0.5 vs 0
        assert_eq!(d.max_abs, Some(f64::INFINITY));
        assert_eq!(d.max_rel, Some(f64::INFINITY));
        assert_eq!(d.worst_index, Some(2));
    }

    #[test]
    fn shapes_and_bytewise() {
        let o = DiffOptions::default();
        let a = f32_side(&[1.0, 2.0]);
        let mut b = a.clone();
        b.shape = vec![2, 1];
        let d = compare("t", &a, &b, &o);
        assert!(!d.close);
        assert_eq!(d.note.as_deref(), Some("shapes differ"));
        let c = |v: &[u8]| Side {
            dtype: DType::C64,
            shape: vec![v.len() / 8],
            data: Some(Cow::Owned(v.to_vec())),
        };
        let d = compare("z", &c(&[0; 16]), &c(&[[0; 8], [1; 8]].concat()), &o);
        assert!(!d.close);
        assert_eq!(d.mismatched, 1);
        assert!(d.note.unwrap().contains("bytewise"));
    }

    #[test]
    fn different_dtypes_by_value() {
        let a = f32_side(&[0.5, -2.0]);
        let h = Side {
            dtype: DType::F16,
            shape: vec![2],
            data: Some(Cow::Owned(
                [half::f16::from_f32(0.5), half::f16::from_f32(-2.0)]
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect(),
            )),
        };
        let d = compare("t", &a, &h, &DiffOptions::default());
        assert!(d.close);
        assert_eq!((d.dtype_a, d.dtype_b), (DType::F32, DType::F16));
        assert_eq!(d.note, None);
    }
}
