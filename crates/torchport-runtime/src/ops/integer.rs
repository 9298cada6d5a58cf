//! Integer and bool semantics, computed exactly in i64 (never through f32, which loses
//! integers above 2^24): bitwise and/or/xor/not (logical on bool), division with a rounding
//! mode, `floor_divide`, `remainder` and `fmod` as torch defines them (also for floats), and
//! integer powers. Integer overflow wraps, as torch's CPU kernels do; integer division by zero
//! is an error, as in torch.

use candle_core::{DType, Tensor};

use super::elementwise::broadcast2;
use super::{binary_operands, float, Registry};
use crate::error::{OpError, OpResult};
use crate::op_bail;
use crate::value::{one, Args, Outputs, Scalar, TensorOrScalar};

/// Register the kernels of this family (after `elementwise`, whose float-only division
/// overloads these replace).
pub fn register(r: &mut Registry) {
    for n in [
        "aten.bitwise_and.Tensor",
        "aten.bitwise_and.Scalar",
        "aten.__and__.Tensor",
        "aten.__and__.Scalar",
    ] {
        r.add(n, |a| bitwise(a, Bit::And));
    }
    for n in [
        "aten.bitwise_or.Tensor",
        "aten.bitwise_or.Scalar",
        "aten.__or__.Tensor",
        "aten.__or__.Scalar",
    ] {
        r.add(n, |a| bitwise(a, Bit::Or));
    }
    for n in [
        "aten.bitwise_xor.Tensor",
        "aten.bitwise_xor.Scalar",
        "aten.__xor__.Tensor",
        "aten.__xor__.Scalar",
    ] {
        r.add(n, |a| bitwise(a, Bit::Xor));
    }
    r.add("aten.bitwise_not.default", bitwise_not);
    r.add("aten.div.Tensor_mode", div_mode);
    r.add("aten.div.Scalar_mode", div_mode);
    r.add("aten.floor_divide.default", div_mode);
    // The in-place `floor_divide_.Tensor`'s functional name (the functional op's own
    // overload is `default`).
    r.add("aten.floor_divide.Tensor", div_mode);
    r.add("aten.floor_divide.Scalar", div_mode);
    for n in [
        "aten.remainder.Tensor",
        "aten.remainder.Scalar",
        "aten.remainder.Scalar_Tensor",
    ] {
        r.add(n, remainder);
    }
    r.add("aten.fmod.Tensor", fmod);
    r.add("aten.fmod.Scalar", fmod);
    r.add("aten.pow.Tensor_Scalar", pow_tensor_scalar);
    r.add("aten.pow.Tensor_Tensor", pow_tensor_tensor);
    r.add("aten.pow.Scalar", pow_scalar_tensor);
}

/// `f` applied elementwise to two i64 tensors, broadcast.
pub(super) fn map_i64(
    l: &Tensor,
    r: &Tensor,
    f: impl Fn(i64, i64) -> OpResult<i64>,
) -> OpResult<Tensor> {
    let (l, r) = broadcast2(l, r)?;
    let shape = l.dims().to_vec();
    let lv = l.flatten_all()?.to_vec1::<i64>()?;
    let rv = r.flatten_all()?.to_vec1::<i64>()?;
    let v = lv
        .iter()
        .zip(&rv)
        .map(|(&x, &y)| f(x, y))
        .collect::<OpResult<Vec<i64>>>()?;
    Ok(Tensor::from_vec(v, shape, &candle_core::Device::Cpu)?)
}

/// Whether a runtime dtype is a float one (f32, or f64 for float64).
fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F64)
}

/// `f` applied elementwise to two float tensors, broadcast: in f64 (`g`) when either is f64,
/// else in f32 (`f`).
fn map_float(
    l: &Tensor,
    r: &Tensor,
    f: impl Fn(f32, f32) -> f32,
    g: impl Fn(f64, f64) -> f64,
) -> OpResult<Tensor> {
    if l.dtype() == DType::F64 || r.dtype() == DType::F64 {
        let f64_of = |t: &Tensor| super::as_dtype(t, DType::F64);
        let (l, r) = broadcast2(&f64_of(l)?, &f64_of(r)?)?;
        let shape = l.dims().to_vec();
        let lv = l.flatten_all()?.to_vec1::<f64>()?;
        let rv = r.flatten_all()?.to_vec1::<f64>()?;
        let v: Vec<f64> = lv.iter().zip(&rv).map(|(&x, &y)| g(x, y)).collect();
        return Ok(Tensor::from_vec(v, shape, &candle_core::Device::Cpu)?);
    }
    let (l, r) = broadcast2(&float(l)?, &float(r)?)?;
    let shape = l.dims().to_vec();
    let lv = l.flatten_all()?.to_vec1::<f32>()?;
    let rv = r.flatten_all()?.to_vec1::<f32>()?;
    let v: Vec<f32> = lv.iter().zip(&rv).map(|(&x, &y)| f(x, y)).collect();
    Ok(Tensor::from_vec(v, shape, &candle_core::Device::Cpu)?)
}

/// The two operands of a binary op (`self`/`other`, scalars allowed), promoted.
fn operands(a: &Args, x: &str, y: &str) -> OpResult<(Tensor, Tensor)> {
    binary_operands(&a.tensor_or_scalar(x)?, &a.tensor_or_scalar(y)?)
}

#[derive(Clone, Copy)]
enum Bit {
    And,
    Or,
    Xor,
}

fn bitwise(a: &Args, op: Bit) -> OpResult<Outputs> {
    let (l, r) = operands(a, "self", "other")?;
    match l.dtype() {
        // bool: 0/1 u8, where the bitwise ops are the logical ones.
        DType::U8 => {
            let (l, r) = broadcast2(&l, &r)?;
            one(match op {
                Bit::And => l.minimum(&r)?,
                Bit::Or => l.maximum(&r)?,
                Bit::Xor => l.ne(&r)?,
            })
        }
        DType::I64 => one(map_i64(&l, &r, |x, y| {
            Ok(match op {
                Bit::And => x & y,
                Bit::Or => x | y,
                Bit::Xor => x ^ y,
            })
        })?),
        _ => op_bail!("bitwise operations are only defined for integer and bool tensors"),
    }
}

fn bitwise_not(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    match t.dtype() {
        DType::U8 => one(t.eq(&t.zeros_like()?)?),
        DType::I64 => {
            let v: Vec<i64> = t
                .flatten_all()?
                .to_vec1::<i64>()?
                .iter()
                .map(|x| !x)
                .collect();
            one(Tensor::from_vec(v, t.dims(), &candle_core::Device::Cpu)?)
        }
        _ => op_bail!("bitwise_not is only defined for integer and bool tensors"),
    }
}

fn zero_division() -> OpError {
    OpError("integer division by zero".into())
}

/// Integer division rounded toward negative infinity.
fn floor_div_i64(x: i64, y: i64) -> OpResult<i64> {
    if y == 0 {
        return Err(zero_division());
    }
    let q = x.wrapping_div(y);
    Ok(if x.wrapping_rem(y) != 0 && ((x < 0) != (y < 0)) {
        q - 1
    } else {
        q
    })
}

/// torch's float floor division (`div_floor_floating`, exact where `floor(x / y)` is not) and
/// Python's float modulo (the sign of the divisor), for one float type.
macro_rules! float_division {
    ($t:ty, $floor_div:ident, $py_rem:ident) => {
        fn $floor_div(x: $t, y: $t) -> $t {
            if y == 0.0 {
                return x / y;
            }
            let m = x % y;
            let mut d = (x - m) / y;
            if m != 0.0 && ((y < 0.0) != (m < 0.0)) {
                d -= 1.0;
            }
            if d == 0.0 {
                return (0.0 as $t).copysign(x / y);
            }
            let f = d.floor();
            if d - f > 0.5 {
                f + 1.0
            } else {
                f
            }
        }

        fn $py_rem(x: $t, y: $t) -> $t {
            let m = x % y;
            if m != 0.0 && ((y < 0.0) != (m < 0.0)) {
                m + y
            } else {
                m
            }
        }
    };
}
float_division!(f32, floor_div_f32, py_rem_f32);
float_division!(f64, floor_div_f64, py_rem_f64);

/// `div` with `rounding_mode` (None / "trunc" / "floor") and `floor_divide`: integers in i64,
/// floats in f32.
fn div_mode(a: &Args) -> OpResult<Outputs> {
    let (l, r) = operands(a, "self", "other")?;
    let floor_divide = a.node().target.contains("floor_divide");
    let mode = if floor_divide {
        "floor"
    } else {
        a.str_or("rounding_mode", "")?
    };
    let int = !is_float(l.dtype()) && !is_float(r.dtype());
    match (mode, int) {
        ("", _) => one(float(&l)?.broadcast_div(&float(&r)?)?),
        ("floor", true) => one(map_i64(
            &l.to_dtype(DType::I64)?,
            &r.to_dtype(DType::I64)?,
            floor_div_i64,
        )?),
        ("floor", false) => one(map_float(&l, &r, floor_div_f32, floor_div_f64)?),
        ("trunc", true) => one(map_i64(
            &l.to_dtype(DType::I64)?,
            &r.to_dtype(DType::I64)?,
            |x, y| {
                if y == 0 {
                    Err(zero_division())
                } else {
                    Ok(x.wrapping_div(y))
                }
            },
        )?),
        ("trunc", false) => one(map_float(
            &l,
            &r,
            |x, y| (x / y).trunc(),
            |x, y| (x / y).trunc(),
        )?),
        (m, _) => {
            op_bail!("rounding_mode '{m}' is not supported (torch knows 'trunc' and 'floor')")
        }
    }
}

/// Python's modulo: the result has the sign of the divisor.
fn remainder(a: &Args) -> OpResult<Outputs> {
    let (l, r) = operands(a, "self", "other")?;
    if is_float(l.dtype()) {
        return one(map_float(&l, &r, py_rem_f32, py_rem_f64)?);
    }
    one(map_i64(
        &l.to_dtype(DType::I64)?,
        &r.to_dtype(DType::I64)?,
        |x, y| {
            if y == 0 {
                return Err(zero_division());
            }
            let m = x.wrapping_rem(y);
            Ok(if m != 0 && ((m < 0) != (y < 0)) {
                m + y
            } else {
                m
            })
        },
    )?)
}

/// C's fmod: the result has the sign of the dividend.
fn fmod(a: &Args) -> OpResult<Outputs> {
    let (l, r) = operands(a, "self", "other")?;
    if is_float(l.dtype()) {
        return one(map_float(&l, &r, |x, y| x % y, |x, y| x % y)?);
    }
    one(map_i64(
        &l.to_dtype(DType::I64)?,
        &r.to_dtype(DType::I64)?,
        |x, y| {
            if y == 0 {
                Err(zero_division())
            } else {
                Ok(x.wrapping_rem(y))
            }
        },
    )?)
}

/// `x ** e` for integers: exact, wrapping on overflow; negative exponents are refused, as in
/// torch ("Integers to negative integer powers are not allowed").
fn int_pow(x: i64, e: i64) -> OpResult<i64> {
    if e < 0 {
        // torch allows them only for bases 1 and -1.
        return match x {
            1 => Ok(1),
            -1 => Ok(if e % 2 == 0 { 1 } else { -1 }),
            _ => Err(OpError(
                "integers to negative integer powers are not allowed".into(),
            )),
        };
    }
    let mut acc: i64 = 1;
    let mut base = x;
    let mut n = e;
    while n > 0 {
        if n & 1 == 1 {
            acc = acc.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        n >>= 1;
    }
    Ok(acc)
}

/// Float `x ** e` with the fast paths of candle for the common exponents.
fn float_pow_scalar(t: &Tensor, e: f64) -> OpResult<Tensor> {
    let t = float(t)?;
    if t.dtype() == DType::F64 {
        // float64: C pow in f64 (as torch's `std::pow`).
        let v: Vec<f64> = t.flatten_all()?.to_vec1::<f64>()?;
        let v: Vec<f64> = v.iter().map(|x| x.powf(e)).collect();
        return Ok(Tensor::from_vec(v, t.dims(), &candle_core::Device::Cpu)?);
    }
    // One pass, split across threads; small integer powers as products, as torch computes them.
    let fast = match e {
        2.0 => super::fused::unary(&t, super::fused::square_f32),
        3.0 => super::fused::unary(&t, super::fused::cube_f32),
        0.5 => super::fused::unary(&t, f32::sqrt),
        1.0 => Some(t.clone()),
        _ => super::fused::unary(&t, |v| v.powf(e as f32)),
    };
    if let Some(y) = fast {
        return Ok(y);
    }
    Ok(if e == 2.0 {
        t.sqr()?
    } else if e == 0.5 {
        t.sqrt()?
    } else if e == 1.0 {
        t
    } else {
        // f32::powf follows C pow: negative bases with integral exponents are real.
        let shape = t.dims().to_vec();
        let v: Vec<f32> = t
            .flatten_all()?
            .to_vec1::<f32>()?
            .iter()
            .map(|x| x.powf(e as f32))
            .collect();
        Tensor::from_vec(v, shape, &candle_core::Device::Cpu)?
    })
}

fn pow_tensor_scalar(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let e = a.scalar("exponent")?;
    match (t.dtype(), e) {
        (DType::I64 | DType::U8, Scalar::Int(n)) => {
            let i = t.to_dtype(DType::I64)?;
            let r = map_i64(&i, &i, |x, _| int_pow(x, n))?;
            // bool ** int promotes to int64, as in torch.
            one(r)
        }
        (DType::I64 | DType::U8, Scalar::Bool(b)) => one(map_i64(
            &t.to_dtype(DType::I64)?,
            &t.to_dtype(DType::I64)?,
            |x, _| int_pow(x, i64::from(b)),
        )?),
        _ => one(float_pow_scalar(&t, e.as_f64())?),
    }
}

fn pow_tensor_tensor(a: &Args) -> OpResult<Outputs> {
    let (b, e) = operands(a, "self", "exponent")?;
    if !is_float(b.dtype()) {
        return one(map_i64(
            &b.to_dtype(DType::I64)?,
            &e.to_dtype(DType::I64)?,
            int_pow,
        )?);
    }
    one(map_float(&b, &e, f32::powf, f64::powf)?)
}

fn pow_scalar_tensor(a: &Args) -> OpResult<Outputs> {
    let base = a.scalar("self")?;
    let e = a.tensor("exponent")?;
    let (b, e) = binary_operands(&TensorOrScalar::Scalar(base), &TensorOrScalar::Tensor(e))?;
    if !is_float(b.dtype()) {
        return one(map_i64(
            &b.to_dtype(DType::I64)?,
            &e.to_dtype(DType::I64)?,
            int_pow,
        )?);
    }
    one(map_float(&b, &e, f32::powf, f64::powf)?)
}
