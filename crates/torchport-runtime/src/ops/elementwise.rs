//! Elementwise arithmetic, comparisons, unary math, `where`/`masked_fill`, casts and copies.

use candle_core::{DType, Shape, Tensor};

use super::fused::{self, BinOp};
use super::{as_dtype, binary_operands, float, scalar_tensor, Registry};
use crate::dtype;
use crate::error::{OpError, OpResult};
use crate::op_bail;
use crate::value::{one, Args, Outputs, Scalar, TensorOrScalar};

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    for n in ["aten.add.Tensor", "aten.add.Scalar"] {
        r.add(n, add);
    }
    for n in [
        "aten.sub.Tensor",
        "aten.sub.Scalar",
        "aten.subtract.Tensor",
        "aten.subtract.Scalar",
        "aten.rsub.Scalar",
        "aten.rsub.Tensor",
    ] {
        r.add(n, sub);
    }
    r.add("aten.mul.Tensor", mul);
    r.add("aten.mul.Scalar", mul);
    r.add("aten.multiply.Tensor", mul);
    r.add("aten.multiply.Scalar", mul);
    r.add("aten.outer.default", outer);
    r.add("aten.ger.default", outer);
    r.add("aten.div.Tensor", div);
    r.add("aten.div.Scalar", div);
    r.add("aten.maximum.default", maximum);
    r.add("aten.minimum.default", minimum);
    r.add("aten.max.other", maximum);
    r.add("aten.min.other", minimum);
    for (n, f) in [
        ("aten.eq.Tensor", cmp_eq as crate::ops::OpFn),
        ("aten.eq.Scalar", cmp_eq),
        ("aten.ne.Tensor", cmp_ne),
        ("aten.ne.Scalar", cmp_ne),
        ("aten.lt.Tensor", cmp_lt),
        ("aten.lt.Scalar", cmp_lt),
        ("aten.le.Tensor", cmp_le),
        ("aten.le.Scalar", cmp_le),
        ("aten.gt.Tensor", cmp_gt),
        ("aten.gt.Scalar", cmp_gt),
        ("aten.ge.Tensor", cmp_ge),
        ("aten.ge.Scalar", cmp_ge),
        // torch's longer names (`torch.greater`, `Tensor.not_equal`), which TorchScript
        // keeps (export writes the short ones).
        ("aten.not_equal.Tensor", cmp_ne),
        ("aten.not_equal.Scalar", cmp_ne),
        ("aten.less.Tensor", cmp_lt),
        ("aten.less.Scalar", cmp_lt),
        ("aten.less_equal.Tensor", cmp_le),
        ("aten.less_equal.Scalar", cmp_le),
        ("aten.greater.Tensor", cmp_gt),
        ("aten.greater.Scalar", cmp_gt),
        ("aten.greater_equal.Tensor", cmp_ge),
        ("aten.greater_equal.Scalar", cmp_ge),
    ] {
        r.add(n, f);
    }
    r.add("aten.logical_not.default", logical_not);
    r.add("aten.logical_and.default", logical_and);
    r.add("aten.logical_or.default", logical_or);
    r.add("aten.logical_xor.default", |a| {
        let (l, r) = operands(a, "self", "other")?;
        one(to_mask(&l)?.broadcast_ne(&to_mask(&r)?)?)
    });
    // Integers stay exact and wrap as torch's do (candle has no integer unary kernels).
    r.add("aten.neg.default", |a| {
        int_or(a, i64::wrapping_neg, |t| match fused::unary(t, |v| -v) {
            Some(y) => Ok(y),
            None => Ok(t.neg()?),
        })
    });
    r.add("aten.sign.default", |a| {
        // -1, 0 or 1 in the input's dtype (NaN gives 0, as in torch); bool is its own sign.
        let t = a.tensor("self")?;
        if t.dtype() == DType::U8 {
            return one(t);
        }
        let pos = t.gt(0.0)?.to_dtype(t.dtype())?;
        one(pos.sub(&t.lt(0.0)?.to_dtype(t.dtype())?)?)
    });
    r.add("aten.square.default", |a| {
        let t = a.tensor("self")?;
        // bool squares to int64 in torch; other dtypes keep theirs.
        let t = if t.dtype() == DType::U8 {
            t.to_dtype(DType::I64)?
        } else {
            t
        };
        one(t.mul(&t)?)
    });
    r.add("aten.addcmul.default", |a| {
        // self + value * tensor1 * tensor2, broadcast.
        let x = float(&a.tensor("self")?)?;
        let (t1, t2) = (float(&a.tensor("tensor1")?)?, float(&a.tensor("tensor2")?)?);
        let value = a.scalar_or("value", Scalar::Int(1))?.as_f64();
        let prod = t1.broadcast_mul(&t2)?.affine(value, 0.0)?;
        one(x.broadcast_add(&prod)?)
    });
    r.add("aten.abs.default", |a| {
        int_or(a, i64::wrapping_abs, |t| Ok(t.abs()?))
    });
    r.add("aten.exp.default", |a| {
        unary_f32(a, f32::exp, |x| Ok(x.exp()?))
    });
    r.add("aten.log.default", |a| {
        unary_f32(a, f32::ln, |x| Ok(x.log()?))
    });
    r.add("aten.sqrt.default", |a| {
        unary_f32(a, f32::sqrt, |x| Ok(x.sqrt()?))
    });
    r.add("aten.rsqrt.default", |a| {
        unary_f32(a, fused::rsqrt_f32, |x| Ok(x.sqrt()?.recip()?))
    });
    r.add("aten.reciprocal.default", |a| {
        one(float(&a.tensor("self")?)?.recip()?)
    });
    r.add("aten.sin.default", |a| {
        unary_f32(a, f32::sin, |x| Ok(x.sin()?))
    });
    r.add("aten.cos.default", |a| {
        unary_f32(a, f32::cos, |x| Ok(x.cos()?))
    });
    r.add("aten.tanh.default", |a| {
        unary_f32(a, fused::tanh_fast, |x| Ok(x.tanh()?))
    });
    r.add("aten.erf.default", |a| {
        one(float(&a.tensor("self")?)?.erf()?)
    });
    // On integers, floor and ceil are the identity (and keep the dtype).
    r.add("aten.floor.default", |a| {
        int_or(a, |v| v, |t| Ok(float(t)?.floor()?))
    });
    r.add("aten.ceil.default", |a| {
        int_or(a, |v| v, |t| Ok(float(t)?.ceil()?))
    });
    r.add("aten.where.self", where_self);
    r.add("aten.where.ScalarOther", where_self);
    r.add("aten.where.ScalarSelf", where_self);
    r.add("aten.where.Scalar", where_self);
    r.add("aten.masked_fill.Scalar", masked_fill);
    r.add("aten.masked_fill.Tensor", masked_fill);
    r.add("aten.clamp.default", clamp);
    r.add("aten.clamp_min.default", clamp);
    r.add("aten.clamp_max.default", clamp);
    for n in [
        "aten._to_copy.default",
        "aten.to.dtype",
        "aten.to.dtype_layout",
        "aten.to.device",
        // TorchScript's `to(device)`, `to(dtype)`, `to()`.
        "aten.to.prim_Device",
        "aten.to.prim_dtype",
        "aten.to.prim_other",
        "aten._assert_tensor_metadata.default",
    ] {
        r.add(n, to_copy);
    }
    // `to(other)`: other's dtype (its device is the CPU, as everything is).
    r.add("aten.to.other", |a| {
        let t = a.tensor("self")?;
        one(as_dtype(&t, a.tensor("other")?.dtype())?)
    });
    r.add("aten.type_as.default", |a| {
        let t = a.tensor("self")?;
        one(as_dtype(&t, a.tensor("other")?.dtype())?)
    });
    for n in [
        "aten.clone.default",
        "aten.alias.default",
        "aten.contiguous.default",
        "aten.detach.default",
        // In place, on the fresh copy of a lifted constant: no autograd here, so self.
        "aten.detach_.default",
        "aten.lift_fresh_copy.default",
    ] {
        r.add(n, identity);
    }
    for n in [
        "aten.dropout.default",
        "aten.native_dropout.default",
        "aten.feature_dropout.default",
        "aten.alpha_dropout.default",
        "aten.feature_alpha_dropout.default",
    ] {
        r.add(n, dropout);
    }
}

/// A unary op that maps int64 tensors element by element with `int` and gives others to
/// `other`.
fn int_or(
    a: &Args,
    int: fn(i64) -> i64,
    other: impl Fn(&Tensor) -> OpResult<Tensor>,
) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    if t.dtype() != DType::I64 {
        return one(other(&t)?);
    }
    let v: Vec<i64> = t
        .flatten_all()?
        .to_vec1::<i64>()?
        .into_iter()
        .map(int)
        .collect();
    one(Tensor::from_vec(v, t.dims(), t.device())?)
}

/// A float unary op: one pass over a contiguous f32 input (split across threads when large)
/// with `fast`, else candle's composed `slow` form.
fn unary_f32(
    a: &Args,
    fast: impl Fn(f32) -> f32 + Sync,
    slow: impl Fn(&Tensor) -> OpResult<Tensor>,
) -> OpResult<Outputs> {
    let x = float(&a.tensor("self")?)?;
    match fused::unary(&x, fast) {
        Some(y) => one(y),
        None => one(slow(&x)?),
    }
}

fn identity(a: &Args) -> OpResult<Outputs> {
    one(a.tensor(if a.has("self") { "self" } else { "input" })?)
}

/// Dropout in eval mode (`train=False`, or `p = 0`) is the identity; a training-mode dropout
/// is random, and refused.
fn dropout(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor(if a.has("self") { "self" } else { "input" })?;
    let p = a.float_or("p", 0.5)?;
    // native_dropout's `train` is `bool?` (None means training); dropout's is a plain bool.
    let train = match a.get("train") {
        None | Some(crate::schema::Argument::AsNone(_)) => {
            a.node().target.contains("native_dropout")
        }
        Some(_) => a.bool_or("train", true)?,
    };
    if train && p != 0.0 {
        op_bail!(
            "dropout with train=True (p = {p}) is random and not supported: export the model \
             after model.eval()"
        );
    }
    if a.node().target.contains("native_dropout") {
        let mask = t.ones_like()?.to_dtype(DType::U8)?;
        return Ok(vec![
            crate::value::Value::Tensor(t),
            crate::value::Value::Tensor(mask),
        ]);
    }
    one(t)
}

/// Broadcast two tensors of one dtype to their common shape.
pub fn broadcast2(a: &Tensor, b: &Tensor) -> OpResult<(Tensor, Tensor)> {
    let s = a
        .shape()
        .broadcast_shape_binary_op(b.shape(), "broadcast")?;
    Ok((a.broadcast_as(&s)?, b.broadcast_as(&s)?))
}

fn operands(a: &Args, x: &str, y: &str) -> OpResult<(Tensor, Tensor)> {
    let l = a.tensor_or_scalar(x)?;
    let r = a.tensor_or_scalar(y)?;
    binary_operands(&l, &r)
}

fn alpha_scaled(a: &Args, t: Tensor) -> OpResult<Tensor> {
    match a.scalar_or("alpha", Scalar::Int(1))? {
        Scalar::Int(1) => Ok(t),
        s => {
            let k = scalar_tensor(s, t.dtype())?;
            match wrapping_i64(&t, &k, i64::wrapping_mul)? {
                Some(y) => Ok(y),
                None => Ok(t.broadcast_mul(&k)?),
            }
        }
    }
}

/// `f` of two int64 tensors, broadcast, with wrapping overflow as torch's int64 kernels
/// (candle's own int64 arithmetic panics on overflow where overflow checks are on); `None`
/// unless both are int64.
fn wrapping_i64(l: &Tensor, r: &Tensor, f: fn(i64, i64) -> i64) -> OpResult<Option<Tensor>> {
    if l.dtype() != DType::I64 || r.dtype() != DType::I64 {
        return Ok(None);
    }
    let (l, r) = broadcast2(l, r)?;
    let x = l.flatten_all()?.to_vec1::<i64>()?;
    let y = r.flatten_all()?.to_vec1::<i64>()?;
    let v: Vec<i64> = x.iter().zip(&y).map(|(&p, &q)| f(p, q)).collect();
    Ok(Some(Tensor::from_vec(v, l.dims(), l.device())?))
}

fn add(a: &Args) -> OpResult<Outputs> {
    let (l, r) = operands(a, "self", "other")?;
    let r = alpha_scaled(a, r)?;
    if let Some(y) = fused::binary(&l, &r, BinOp::Add) {
        return one(y);
    }
    if let Some(y) = wrapping_i64(&l, &r, i64::wrapping_add)? {
        return one(y);
    }
    one(l.broadcast_add(&r)?)
}

fn sub(a: &Args) -> OpResult<Outputs> {
    let (l, r) = operands(a, "self", "other")?;
    // sub: self - alpha * other; rsub: other - alpha * self.
    let (x, y) = if a.node().target.contains("rsub") {
        (r, alpha_scaled(a, l)?)
    } else {
        (l, alpha_scaled(a, r)?)
    };
    if let Some(t) = fused::binary(&x, &y, BinOp::Sub) {
        return one(t);
    }
    if let Some(t) = wrapping_i64(&x, &y, i64::wrapping_sub)? {
        return one(t);
    }
    one(x.broadcast_sub(&y)?)
}

fn mul(a: &Args) -> OpResult<Outputs> {
    let (l, r) = operands(a, "self", "other")?;
    one(product(&l, &r)?)
}

/// The broadcast product of two operands of one dtype (int64 wrapping as torch's).
fn product(l: &Tensor, r: &Tensor) -> OpResult<Tensor> {
    if let Some(y) = fused::binary(l, r, BinOp::Mul) {
        return Ok(y);
    }
    if let Some(y) = wrapping_i64(l, r, i64::wrapping_mul)? {
        return Ok(y);
    }
    Ok(l.broadcast_mul(r)?)
}

/// `outer(self, vec2)` (and its old name `ger`): the `[n, m]` products of two 1-d tensors,
/// in their promoted dtype.
fn outer(a: &Args) -> OpResult<Outputs> {
    let (x, y) = (a.tensor("self")?, a.tensor("vec2")?);
    if x.rank() != 1 || y.rank() != 1 {
        op_bail!(
            "outer needs two 1-d tensors, got shapes {:?} and {:?}",
            x.dims(),
            y.dims()
        );
    }
    let (l, r) = binary_operands(
        &TensorOrScalar::Tensor(x.unsqueeze(1)?),
        &TensorOrScalar::Tensor(y.unsqueeze(0)?),
    )?;
    one(product(&l, &r)?)
}

/// True division (always float; the rounding modes are in `integer`).
fn div(a: &Args) -> OpResult<Outputs> {
    let (l, r) = operands(a, "self", "other")?;
    let (lf, rf) = (float(&l)?, float(&r)?);
    match fused::binary(&lf, &rf, BinOp::Div) {
        Some(q) => one(q),
        None => one(lf.broadcast_div(&rf)?),
    }
}

fn maximum(a: &Args) -> OpResult<Outputs> {
    let (l, r) = operands(a, "self", "other")?;
    one(l.broadcast_maximum(&r)?)
}

fn minimum(a: &Args) -> OpResult<Outputs> {
    let (l, r) = operands(a, "self", "other")?;
    one(l.broadcast_minimum(&r)?)
}

macro_rules! cmp_op {
    ($name:ident, $method:ident) => {
        fn $name(a: &Args) -> OpResult<Outputs> {
            let (l, r) = operands(a, "self", "other")?;
            one(l.$method(&r)?)
        }
    };
}
cmp_op!(cmp_eq, broadcast_eq);
cmp_op!(cmp_ne, broadcast_ne);
cmp_op!(cmp_lt, broadcast_lt);
cmp_op!(cmp_le, broadcast_le);
cmp_op!(cmp_gt, broadcast_gt);
cmp_op!(cmp_ge, broadcast_ge);

/// A tensor as a 0/1 u8 mask (`!= 0`).
pub fn to_mask(t: &Tensor) -> OpResult<Tensor> {
    if t.dtype() == DType::U8 {
        Ok(t.clone())
    } else {
        Ok(t.ne(&t.zeros_like()?)?)
    }
}

fn logical_not(a: &Args) -> OpResult<Outputs> {
    let t = to_mask(&a.tensor("self")?)?;
    one(t.eq(&t.zeros_like()?)?)
}

fn logical_and(a: &Args) -> OpResult<Outputs> {
    let (l, r) = operands(a, "self", "other")?;
    one(to_mask(&l)?.broadcast_mul(&to_mask(&r)?)?)
}

fn logical_or(a: &Args) -> OpResult<Outputs> {
    let (l, r) = operands(a, "self", "other")?;
    one(to_mask(&l)?.broadcast_maximum(&to_mask(&r)?)?)
}

/// `torch.where(cond, x, y)` with broadcasting and promotion.
pub fn where_t(cond: &Tensor, x: &TensorOrScalar, y: &TensorOrScalar) -> OpResult<Tensor> {
    let (x, y) = binary_operands(x, y)?;
    let cond = to_mask(cond)?;
    let s = Shape::from(cond.dims())
        .broadcast_shape_binary_op(x.shape(), "where")?
        .broadcast_shape_binary_op(y.shape(), "where")?;
    let c = cond.broadcast_as(&s)?;
    Ok(c.where_cond(&x.broadcast_as(&s)?, &y.broadcast_as(&s)?)?)
}

fn where_self(a: &Args) -> OpResult<Outputs> {
    let cond = a.tensor("condition")?;
    one(where_t(
        &cond,
        &a.tensor_or_scalar("self")?,
        &a.tensor_or_scalar("other")?,
    )?)
}

fn masked_fill(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let mask = a.tensor("mask")?;
    let v = match a.tensor_or_scalar("value")? {
        TensorOrScalar::Tensor(v) => TensorOrScalar::Tensor(as_dtype(&v, t.dtype())?),
        TensorOrScalar::Scalar(s) => TensorOrScalar::Tensor(scalar_tensor(s, t.dtype())?),
    };
    let r = where_t(&mask, &v, &TensorOrScalar::Tensor(t.clone()))?;
    // masked_fill keeps self's shape (the mask broadcasts to it).
    one(r.broadcast_as(t.shape())?.contiguous()?)
}

fn clamp(a: &Args) -> OpResult<Outputs> {
    let mut t = a.tensor("self")?;
    let target = &a.node().target;
    let (lo, hi) = if target.contains("clamp_min") {
        (a.opt_float("min")?, None)
    } else if target.contains("clamp_max") {
        (None, a.opt_float("max")?)
    } else {
        (a.opt_float("min")?, a.opt_float("max")?)
    };
    if let Some(lo) = lo {
        t = t.broadcast_maximum(&scalar_tensor(Scalar::Float(lo), t.dtype())?)?;
    }
    if let Some(hi) = hi {
        t = t.broadcast_minimum(&scalar_tensor(Scalar::Float(hi), t.dtype())?)?;
    }
    one(t)
}

fn to_copy(a: &Args) -> OpResult<Outputs> {
    if a.node().target.contains("_assert_tensor_metadata") {
        return Ok(vec![]);
    }
    let t = a.tensor(if a.has("self") { "self" } else { "input" })?;
    match a.opt_scalar_type("dtype")? {
        Some(st) => one(dtype::cast(&t, st)?),
        None => one(t),
    }
}

/// Make an error for a tensor of the wrong dtype.
pub fn want_float(t: &Tensor, what: &str) -> OpResult<()> {
    if t.dtype() != DType::F32 {
        return Err(OpError(format!("{what} must be a float tensor")));
    }
    Ok(())
}

#[cfg(test)]
mod wrap_tests {
    use super::*;
    use serde_json::json;

    /// int64 add, sub, mul (and add's alpha) wrap on overflow as torch's int64 kernels do
    /// (`torch.tensor([2**63 - 1]) + 1` is `-2**63`), never panic.
    #[test]
    fn int64_arithmetic_wraps() {
        let t = |v: Vec<i64>| Tensor::new(v.as_slice(), &candle_core::Device::Cpu).unwrap();
        let x = t(vec![i64::MAX, i64::MIN, 5]);
        let y = t(vec![1, 1, 3]);
        let run = |target: &str, extra: Vec<(&str, serde_json::Value)>| {
            let mut args = vec![
                ("self", json!({"as_tensor": {"name": "x"}})),
                ("other", json!({"as_tensor": {"name": "y"}})),
            ];
            args.extend(extra);
            let out = super::super::run_node(
                register,
                target,
                &args,
                &[("x", x.clone()), ("y", y.clone())],
            )
            .unwrap();
            match &out[0] {
                crate::value::Value::Tensor(t) => t.to_vec1::<i64>().unwrap(),
                _ => panic!("not a tensor"),
            }
        };
        assert_eq!(run("aten.add.Tensor", vec![]), [i64::MIN, i64::MIN + 1, 8]);
        assert_eq!(run("aten.sub.Tensor", vec![]), [i64::MAX - 1, i64::MAX, 2]);
        assert_eq!(run("aten.mul.Tensor", vec![]), [i64::MAX, i64::MIN, 15]);
        assert_eq!(
            run("aten.add.Tensor", vec![("alpha", json!({"as_int": 2}))]),
            [i64::MAX.wrapping_add(2), i64::MIN + 2, 11]
        );
    }
}
