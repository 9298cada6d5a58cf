//! Statistics and products along dims: var/std (and their `_mean` pairs), logsumexp, prod,
//! cumprod, histc. Integer products are exact in i64 and wrap as torch's do; bool products are i64.

use candle_core::{DType, Tensor};

use super::reduce::{dims_of, reduce};
use super::{dim, float, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs, Value};

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    for n in [
        "aten.var.correction",
        "aten.var.dim",
        "aten.var.default",
        "aten.std.correction",
        "aten.std.dim",
        "aten.std.default",
        "aten.var_mean.correction",
        "aten.var_mean.dim",
        "aten.var_mean.default",
        "aten.std_mean.correction",
        "aten.std_mean.dim",
        "aten.std_mean.default",
    ] {
        r.add(n, var_family);
    }
    r.add("aten.logsumexp.default", logsumexp);
    r.add("aten.prod.default", prod);
    r.add("aten.prod.dim_int", prod);
    r.add("aten.cumprod.default", cumprod);
    r.add("aten.cumprod_.default", cumprod);
    r.add("aten.histc.default", histc);
}

/// var, std, var_mean and std_mean over `dim` (all dims when absent) with `correction`
/// (or `unbiased`, default 1); a non-positive denominator gives NaN or inf as in torch.
fn var_family(a: &Args) -> OpResult<Outputs> {
    let target = super::op_key(&a.node().target);
    let t = float(&a.tensor("self")?)?;
    let dims = dims_of(a, "dim", t.rank())?;
    let keep = a.bool_or("keepdim", false)?;
    let correction = match a.opt_float("correction")? {
        Some(c) => c,
        None if a.bool_or("unbiased", true)? => 1.0,
        None => 0.0,
    };
    let n: usize = dims.iter().map(|&d| t.dims()[d]).product();
    let m = reduce(&t, &dims, true, |x, d| x.mean_keepdim(d))?;
    let sq = t.broadcast_sub(&m)?.sqr()?;
    let s = reduce(&sq, &dims, keep, |x, d| x.sum_keepdim(d))?;
    let denom = (n as f64 - correction).max(0.0);
    // torch divides by max(0, n - correction): 0/0 is NaN, x/0 inf.
    let mut v = s.broadcast_div(&super::scalar_tensor(
        crate::value::Scalar::Float(denom),
        s.dtype(),
    )?)?;
    if target.starts_with("aten.std") {
        v = v.sqrt()?;
    }
    if !target.contains("_mean") {
        return one(v);
    }
    let m = m.reshape(v.shape())?;
    Ok(vec![Value::Tensor(v), Value::Tensor(m)])
}

/// `logsumexp(self, dim, keepdim)`: `log(sum(exp(x - m))) + m` with `m` the max over `dim`
/// (0 where the max is infinite, so all -inf gives -inf and +inf gives +inf, as torch).
fn logsumexp(a: &Args) -> OpResult<Outputs> {
    let t = float(&a.tensor("self")?)?;
    let dims = dims_of(a, "dim", t.rank())?;
    let keep = a.bool_or("keepdim", false)?;
    if t.elem_count() == 0 {
        op_bail!("logsumexp of an empty tensor is not supported");
    }
    let m = reduce(&t, &dims, true, |x, d| x.max_keepdim(d))?;
    let m = super::math::map(&m, |v| if v.is_infinite() { 0.0 } else { v })?;
    let e = t.broadcast_sub(&m)?.exp()?;
    let s = reduce(&e, &dims, true, |x, d| x.sum_keepdim(d))?.log()?;
    let r = (s + m)?;
    if keep {
        return one(r);
    }
    one(r.reshape(super::reduce::without(t.dims(), &dims))?)
}

/// `t` with `d` moved last, contiguous, as its values, the moved shape and the row length.
fn rows<T: candle_core::WithDType>(t: &Tensor, d: usize) -> OpResult<(Vec<T>, Vec<usize>)> {
    let moved = if t.rank() == 0 {
        t.reshape(1)?
    } else {
        t.transpose(d, t.rank() - 1)?.contiguous()?
    };
    Ok((moved.flatten_all()?.to_vec1::<T>()?, moved.dims().to_vec()))
}

/// The dtype a product is computed in: i64 for ints and bools (unless `dtype` asks), else the
/// input's float dtype (or the requested one).
fn product_input(a: &Args) -> OpResult<Tensor> {
    let t = a.tensor("self")?;
    let t = match a.opt_scalar_type("dtype")? {
        Some(st) => crate::dtype::cast(&t, st)?,
        None if super::category(t.dtype()) < 2 => t.to_dtype(DType::I64)?,
        None => t,
    };
    if !matches!(t.dtype(), DType::F32 | DType::F64 | DType::I64) {
        op_bail!("products in {:?} are not supported", t.dtype());
    }
    Ok(t)
}

/// Apply `row` (an in-place scan or fold per row) to every row of `t` along `d`, for each
/// supported element type; returns the moved values and shape.
macro_rules! per_dtype {
    ($t:expr, $d:expr, $f:ident) => {
        match $t.dtype() {
            DType::F32 => $f::<f32>(&$t, $d, |a, b| a * b, 1.0),
            DType::F64 => $f::<f64>(&$t, $d, |a, b| a * b, 1.0),
            _ => $f::<i64>(&$t, $d, i64::wrapping_mul, 1),
        }
    };
}

/// The product of each row along `d` (keepdim: the dim stays with size 1).
fn fold_rows<T: candle_core::WithDType>(
    t: &Tensor,
    d: usize,
    f: fn(T, T) -> T,
    unit: T,
) -> OpResult<Tensor> {
    let (v, mut shape) = rows::<T>(t, d)?;
    let n = *shape.last().unwrap_or(&1);
    let out: Vec<T> = if n == 0 {
        vec![unit; shape[..shape.len() - 1].iter().product()]
    } else {
        v.chunks(n)
            .map(|r| r.iter().fold(unit, |p, &x| f(p, x)))
            .collect()
    };
    if let Some(l) = shape.last_mut() {
        *l = 1;
    }
    let r = Tensor::from_vec(out, shape, &candle_core::Device::Cpu)?;
    Ok(if t.rank() == 0 {
        r.reshape(())?
    } else {
        r.transpose(d, t.rank() - 1)?
    })
}

/// The running `f` (product, sum, …) of each row along `d`.
pub(super) fn scan_rows<T: candle_core::WithDType>(
    t: &Tensor,
    d: usize,
    f: fn(T, T) -> T,
) -> OpResult<Tensor> {
    let (mut v, shape) = rows::<T>(t, d)?;
    let n = *shape.last().unwrap_or(&1);
    if n > 0 {
        for r in v.chunks_mut(n) {
            for i in 1..r.len() {
                r[i] = f(r[i - 1], r[i]);
            }
        }
    }
    let r = Tensor::from_vec(v, shape, &candle_core::Device::Cpu)?;
    Ok(if t.rank() == 0 {
        r.reshape(())?
    } else {
        r.transpose(d, t.rank() - 1)?.contiguous()?
    })
}

/// `prod(self, dtype)` over everything, or `prod(self, dim, keepdim, dtype)`.
fn prod(a: &Args) -> OpResult<Outputs> {
    let t = product_input(a)?;
    match a.opt_int("dim")? {
        None => {
            let flat = t.flatten_all()?;
            one(per_dtype!(flat, 0, fold_rows)?.reshape(())?)
        }
        Some(d) => {
            let d = dim(d, t.rank())?;
            let r = per_dtype!(t, d, fold_rows)?;
            if a.bool_or("keepdim", false)? || t.rank() == 0 {
                one(r.contiguous()?)
            } else {
                one(r.squeeze(d)?.contiguous()?)
            }
        }
    }
}

/// `cumprod(self, dim, dtype)`: float products accumulate in f64 ([`scan_in_f64`]).
fn cumprod(a: &Args) -> OpResult<Outputs> {
    let t = product_input(a)?;
    let d = dim(a.int("dim")?, t.rank())?;
    if t.dtype() == DType::I64 {
        one(scan_rows::<i64>(&t, d, i64::wrapping_mul)?)
    } else {
        one(scan_in_f64(&t, d, |p, x| p * x)?)
    }
}

/// The running `f` of each row of float tensor `t` along `d`, accumulated in f64 and each
/// step rounded to `t`'s dtype: torch's CPU scans (`cumsum`, `cumprod`) accumulate float32
/// in double, so a sum past 2^24 keeps counting where an f32 accumulator would stall.
pub(super) fn scan_in_f64(t: &Tensor, d: usize, f: fn(f64, f64) -> f64) -> OpResult<Tensor> {
    let wide = scan_rows::<f64>(&t.to_dtype(DType::F64)?, d, f)?;
    Ok(wide.to_dtype(t.dtype())?)
}

/// `histc(self, bins=100, min=0, max=0)`: counts of the elements in `bins` equal bins over
/// `[min, max]` (the data's range when both are equal, widened by 1 each way if that is
/// empty), elements outside ignored, `max` itself in the last bin; in the input's dtype.
fn histc(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    if super::category(t.dtype()) < 2 {
        op_bail!("histc needs a float tensor");
    }
    let bins = a.int_or("bins", 100)?;
    if !(1..=1 << 24).contains(&bins) {
        op_bail!("histc: bins must be in 1..=2^24, got {bins}");
    }
    let bins = bins as usize;
    let v = super::as_dtype(&t, DType::F64)?
        .flatten_all()?
        .to_vec1::<f64>()?;
    let (mut lo, mut hi) = (a.float_or("min", 0.0)?, a.float_or("max", 0.0)?);
    if lo == hi && !v.is_empty() {
        lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    }
    if lo == hi {
        (lo, hi) = (lo - 1.0, hi + 1.0);
    }
    if lo >= hi || !lo.is_finite() || !hi.is_finite() {
        op_bail!("histc: range [{lo}, {hi}] is not finite or empty");
    }
    let mut counts = vec![0f64; bins];
    for x in v {
        if x >= lo && x <= hi {
            let b = (((x - lo) * bins as f64) / (hi - lo)) as usize;
            counts[b.min(bins - 1)] += 1.0;
        }
    }
    one(Tensor::from_vec(counts, bins, &candle_core::Device::Cpu)?.to_dtype(t.dtype())?)
}
