//! Elementwise math without a candle kernel of its own: log1p, expm1, log2, log10, exp2,
//! trunc, frac, round (also to decimals), the inverse and hyperbolic trigonometric functions,
//! atan2, hypot, copysign, lerp, clamp by tensors, the float-class tests (isnan, isinf,
//! isfinite, isposinf, isneginf) and nan_to_num.
//!
//! Each computes element by element with Rust's `f64` functions and stores the result in the
//! input's float dtype (int and bool inputs become f32, as torch's float ops do), so a float32
//! result is the correctly rounded value of the f64 one.

use candle_core::{DType, Tensor};

use super::elementwise::broadcast2;
use super::{as_dtype, binary_operands, float, promote_tensors, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs, TensorOrScalar};

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    for n in [
        "aten.log1p.default",
        "aten.log1p_.default",
        "aten.expm1.default",
        "aten.expm1_.default",
        "aten.log2.default",
        "aten.log2_.default",
        "aten.log10.default",
        "aten.log10_.default",
        "aten.exp2.default",
        "aten.exp2_.default",
        "aten.tan.default",
        "aten.tan_.default",
        "aten.asin.default",
        "aten.asin_.default",
        "aten.acos.default",
        "aten.acos_.default",
        "aten.atan.default",
        "aten.atan_.default",
        "aten.sinh.default",
        "aten.sinh_.default",
        "aten.cosh.default",
        "aten.cosh_.default",
        "aten.asinh.default",
        "aten.asinh_.default",
        "aten.acosh.default",
        "aten.acosh_.default",
        "aten.atanh.default",
        "aten.atanh_.default",
    ] {
        r.add(n, unary);
    }
    // On integers, trunc and round are the identity (and keep the dtype).
    for n in [
        "aten.trunc.default",
        "aten.trunc_.default",
        "aten.fix.default",
    ] {
        r.add(n, |a| keep_int_or(a, f64::trunc));
    }
    for n in ["aten.round.default", "aten.round_.default"] {
        r.add(n, |a| keep_int_or(a, f64::round_ties_even));
    }
    r.add("aten.round.decimals", round_decimals);
    r.add("aten.round_.decimals", round_decimals);
    r.add("aten.frac.default", |a| {
        one(map(&float(&a.tensor("self")?)?, |v| v - v.trunc())?)
    });
    r.add("aten.atan2.default", |a| binary(a, f64::atan2));
    r.add("aten.arctan2.default", |a| binary(a, f64::atan2));
    r.add("aten.hypot.default", |a| binary(a, f64::hypot));
    r.add("aten.copysign.Tensor", |a| binary(a, f64::copysign));
    r.add("aten.copysign.Scalar", |a| binary(a, f64::copysign));
    r.add("aten.lerp.Scalar", lerp);
    r.add("aten.lerp.Tensor", lerp);
    r.add("aten.clamp.Tensor", clamp_tensor);
    r.add("aten.clamp_min.Tensor", clamp_tensor);
    r.add("aten.clamp_max.Tensor", clamp_tensor);
    r.add("aten.isnan.default", |a| class(a, f64::is_nan, false));
    r.add("aten.isinf.default", |a| class(a, f64::is_infinite, false));
    r.add("aten.isfinite.default", |a| class(a, f64::is_finite, true));
    r.add("aten.isposinf.default", |a| {
        class(a, |v| v == f64::INFINITY, false)
    });
    r.add("aten.isneginf.default", |a| {
        class(a, |v| v == f64::NEG_INFINITY, false)
    });
    r.add("aten.nan_to_num.default", nan_to_num);
}

/// A float map computed in f64.
type FloatMap = fn(f64) -> f64;

/// The float maps of [`unary`], by op name.
const UNARY: &[(&str, FloatMap)] = &[
    ("log1p", f64::ln_1p),
    ("expm1", f64::exp_m1),
    ("log2", f64::log2),
    ("log10", f64::log10),
    ("exp2", f64::exp2),
    ("tan", f64::tan),
    ("asin", f64::asin),
    ("acos", f64::acos),
    ("atan", f64::atan),
    ("sinh", f64::sinh),
    ("cosh", f64::cosh),
    ("asinh", f64::asinh),
    ("acosh", f64::acosh),
    ("atanh", f64::atanh),
];

/// A float map of [`UNARY`], chosen by the node's op name (`aten.log1p_.default` → log1p).
fn unary(a: &Args) -> OpResult<Outputs> {
    let key = super::op_key(&a.node().target);
    let name = key.split('.').nth(1).unwrap_or("");
    let name = name.strip_suffix('_').unwrap_or(name);
    let Some(&(_, f)) = UNARY.iter().find(|(n, _)| *n == name) else {
        op_bail!("no float map for {key}");
    };
    one(map(&float(&a.tensor("self")?)?, f)?)
}

/// `f` applied to every element of a float tensor (f32 or f64), computed in f64 and stored in
/// the tensor's dtype.
pub fn map(t: &Tensor, f: impl Fn(f64) -> f64 + Sync) -> OpResult<Tensor> {
    if t.elem_count() == 0 && super::category(t.dtype()) == 2 {
        return Ok(Tensor::zeros(t.dims(), t.dtype(), t.device())?);
    }
    match t.dtype() {
        DType::F64 => {
            let v: Vec<f64> = t.flatten_all()?.to_vec1::<f64>()?;
            Ok(Tensor::from_vec(
                v.into_iter().map(f).collect(),
                t.dims(),
                t.device(),
            )?)
        }
        DType::F32 => {
            let g = |v: f32| f(v as f64) as f32;
            if let Some(y) = super::fused::unary(t, g) {
                return Ok(y);
            }
            let v: Vec<f32> = t.flatten_all()?.to_vec1::<f32>()?;
            Ok(Tensor::from_vec(
                v.into_iter().map(g).collect(),
                t.dims(),
                t.device(),
            )?)
        }
        d => op_bail!("expected a float tensor, got {d:?}"),
    }
}

/// `f` of two float tensors of one shape, element by element in f64, stored as `a`'s dtype.
fn map2(a: &Tensor, b: &Tensor, f: impl Fn(f64, f64) -> f64) -> OpResult<Tensor> {
    let d = a.dtype();
    if a.elem_count() == 0 {
        return Ok(Tensor::zeros(a.dims(), d, a.device())?);
    }
    let (x, y) = (
        as_dtype(a, DType::F64)?.flatten_all()?.to_vec1::<f64>()?,
        as_dtype(b, DType::F64)?.flatten_all()?.to_vec1::<f64>()?,
    );
    let v: Vec<f64> = x.into_iter().zip(y).map(|(p, q)| f(p, q)).collect();
    Ok(Tensor::from_vec(v, a.dims(), a.device())?.to_dtype(d)?)
}

/// Two operands (tensors or scalars) promoted, made float and broadcast to one shape.
fn float_operands(a: &TensorOrScalar, b: &TensorOrScalar) -> OpResult<(Tensor, Tensor)> {
    let (x, y) = binary_operands(a, b)?;
    let (x, y) = (float(&x)?, float(&y)?);
    broadcast2(&x, &y)
}

/// A binary float op `f(self, other)` by torch's promotion (ints become f32).
fn binary(a: &Args, f: fn(f64, f64) -> f64) -> OpResult<Outputs> {
    let (x, y) = float_operands(&a.tensor_or_scalar("self")?, &a.tensor_or_scalar("other")?)?;
    one(map2(&x, &y, f)?)
}

/// trunc / round: the identity on integers and bools, the float map otherwise.
fn keep_int_or(a: &Args, f: fn(f64) -> f64) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    if super::category(t.dtype()) < 2 {
        return one(t);
    }
    one(map(&t, f)?)
}

/// `round(self, decimals)`: torch scales by 10^d, rounds half to even and scales back
/// (dividing by 10^-d for negative `d`).
fn round_decimals(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let d = a.int_or("decimals", 0)?;
    if super::category(t.dtype()) < 2 {
        if d != 0 {
            op_bail!("round with decimals is not supported for integer tensors");
        }
        return one(t);
    }
    let d = i32::try_from(d).map_err(|_| crate::error::OpError(format!("decimals {d}")))?;
    // torch computes in the tensor's dtype: x * 10^d rounded, then / 10^d.
    if t.dtype() == DType::F32 {
        let (ten, neg) = (10f32.powi(d.abs()), d < 0);
        return one(map(&t, move |v| {
            let v = v as f32;
            let r = if neg {
                (v / ten).round_ties_even() * ten
            } else {
                (v * ten).round_ties_even() / ten
            };
            r as f64
        })?);
    }
    let (ten, neg) = (10f64.powi(d.abs()), d < 0);
    one(map(&t, move |v| {
        if neg {
            (v / ten).round_ties_even() * ten
        } else {
            (v * ten).round_ties_even() / ten
        }
    })?)
}

/// `lerp(self, end, weight)` with torch's two-sided formula (exact at both ends):
/// `self + w (end - self)` for |w| < 0.5, else `end - (end - self)(1 - w)`.
fn lerp(a: &Args) -> OpResult<Outputs> {
    let s = a.tensor("self")?;
    let e = a.tensor("end")?;
    let w = match a.tensor_or_scalar("weight")? {
        TensorOrScalar::Tensor(w) => w,
        TensorOrScalar::Scalar(w) => super::scalar_tensor(w, s.dtype())?,
    };
    if super::category(s.dtype()) < 2 {
        op_bail!("lerp needs float tensors");
    }
    let d = s.dtype();
    let (s, e) = broadcast2(&s, &e)?;
    let (s, w) = broadcast2(&s, &as_dtype(&w, d)?)?;
    let (e, _) = broadcast2(&e, &s)?;
    let f = |x: f64, y: f64, w: f64| {
        if w.abs() < 0.5 {
            x + w * (y - x)
        } else {
            y - (y - x) * (1.0 - w)
        }
    };
    let vals = |t: &Tensor| -> OpResult<Vec<f64>> {
        Ok(as_dtype(t, DType::F64)?.flatten_all()?.to_vec1::<f64>()?)
    };
    let (xs, ys, ws) = (vals(&s)?, vals(&e)?, vals(&w)?);
    let out: Vec<f64> = if d == DType::F32 {
        // In f32 arithmetic, as torch's float kernel.
        (0..xs.len())
            .map(|i| {
                let (x, y, w) = (xs[i] as f32, ys[i] as f32, ws[i] as f32);
                let r = if w.abs() < 0.5 {
                    x + w * (y - x)
                } else {
                    y - (y - x) * (1.0 - w)
                };
                r as f64
            })
            .collect()
    } else {
        (0..xs.len()).map(|i| f(xs[i], ys[i], ws[i])).collect()
    };
    one(Tensor::from_vec(out, s.dims(), s.device())?.to_dtype(d)?)
}

/// `clamp(self, min: Tensor?, max: Tensor?)` (and `clamp_min/max.Tensor`): `min(max(self,
/// lo), hi)` with broadcasting and torch's promotion, NaN propagating.
fn clamp_tensor(a: &Args) -> OpResult<Outputs> {
    let target = a.node().target.as_str();
    let mut t = a.tensor("self")?;
    let (lo, hi) = if target.contains("clamp_min") {
        (a.opt_tensor("min")?, None)
    } else if target.contains("clamp_max") {
        (None, a.opt_tensor("max")?)
    } else {
        (a.opt_tensor("min")?, a.opt_tensor("max")?)
    };
    let mut d = t.dtype();
    for b in lo.iter().chain(hi.iter()) {
        d = super::promote(d, promote_tensors(&t, b));
    }
    t = as_dtype(&t, d)?;
    let nan = super::category(d) == 2;
    if let Some(lo) = lo {
        let (x, l) = broadcast2(&t, &as_dtype(&lo, d)?)?;
        t = if nan {
            map2(&x, &l, |v, m| {
                if v.is_nan() || m.is_nan() {
                    f64::NAN
                } else {
                    v.max(m)
                }
            })?
        } else {
            x.maximum(&l)?
        };
    }
    if let Some(hi) = hi {
        let (x, h) = broadcast2(&t, &as_dtype(&hi, d)?)?;
        t = if nan {
            map2(&x, &h, |v, m| {
                if v.is_nan() || m.is_nan() {
                    f64::NAN
                } else {
                    v.min(m)
                }
            })?
        } else {
            x.minimum(&h)?
        };
    }
    one(t)
}

/// A float-class test as a bool tensor; integers and bools are all `int_answer`.
fn class(a: &Args, f: fn(f64) -> bool, int_answer: bool) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let v: Vec<u8> = if super::category(t.dtype()) < 2 {
        vec![u8::from(int_answer); t.elem_count()]
    } else {
        as_dtype(&t, DType::F64)?
            .flatten_all()?
            .to_vec1::<f64>()?
            .into_iter()
            .map(|x| u8::from(f(x)))
            .collect()
    };
    one(Tensor::from_vec(v, t.dims(), t.device())?)
}

/// `nan_to_num(self, nan=0, posinf=None, neginf=None)`: infinities become the dtype's largest
/// and smallest finite values unless given; integers and bools are unchanged.
fn nan_to_num(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    if super::category(t.dtype()) < 2 {
        return one(t);
    }
    let (max, min) = if t.dtype() == DType::F32 {
        (f32::MAX as f64, f32::MIN as f64)
    } else {
        (f64::MAX, f64::MIN)
    };
    let nan = a.opt_float("nan")?.unwrap_or(0.0);
    let pos = a.opt_float("posinf")?.unwrap_or(max);
    let neg = a.opt_float("neginf")?.unwrap_or(min);
    one(map(&t, move |v| {
        if v.is_nan() {
            nan
        } else if v == f64::INFINITY {
            pos
        } else if v == f64::NEG_INFINITY {
            neg
        } else {
            v
        }
    })?)
}
