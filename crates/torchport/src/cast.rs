//! Element conversion: decode any real dtype to `f64` (for comparing and casting), and cast
//! little-endian bytes from one dtype to another.
//!
//! Rounding rules: casts to `float16` / `bfloat16` / `float32` round to nearest, ties to
//! even (as torch does); casts from floats to integers truncate toward zero like torch's
//! `.to(int)`, and are refused when a value is NaN, infinite or out of the target's range
//! (torch's result is undefined there); casts to `bool` give `true` for every non-zero value.
//! Complex and quantized types are not cast (their meaning needs more than one number).

use crate::dtype::DType;

/// Why a conversion cannot be done.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CastError {
    /// The source dtype has no single real value per element.
    #[error("{0} elements cannot be converted to real numbers")]
    NotReal(DType),
    /// Casting to this dtype is not supported.
    #[error("casting to {0} is not supported")]
    Target(DType),
    /// A value does not fit the target dtype.
    #[error("element {index} ({value}) does not fit in {to}")]
    OutOfRange {
        /// Element index.
        index: usize,
        /// The value.
        value: f64,
        /// The target dtype.
        to: DType,
    },
    /// The byte count is not a multiple of the element size.
    #[error("{len} bytes is not a whole number of {dtype} elements")]
    Length {
        /// Byte count.
        len: usize,
        /// The dtype.
        dtype: DType,
    },
}

fn word<const N: usize>(c: &[u8]) -> [u8; N] {
    let mut w = [0u8; N];
    w.copy_from_slice(&c[..N]);
    w
}

/// Decode an 8-bit float with `exp_bits` exponent bits. `fnuz` variants have no negative
/// zero and encode NaN as 0x80; `fn` (e4m3fn) has no infinities and NaN at S.1111.111.
fn f8(b: u8, exp_bits: u32, bias: i32, fnuz: bool, finite_only: bool) -> f64 {
    let man_bits = 7 - exp_bits;
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = ((b >> man_bits) & ((1 << exp_bits) - 1)) as i32;
    let man = (b & ((1 << man_bits) - 1)) as f64;
    let max_exp = (1 << exp_bits) - 1;
    if fnuz && b == 0x80 {
        return f64::NAN;
    }
    if !fnuz && exp == max_exp {
        if finite_only {
            if man as u32 == (1 << man_bits) - 1 {
                return f64::NAN;
            }
        } else {
            return if man == 0.0 {
                sign * f64::INFINITY
            } else {
                f64::NAN
            };
        }
    }
    let scale = (1u32 << man_bits) as f64;
    if exp == 0 {
        sign * (man / scale) * 2f64.powi(1 - bias)
    } else {
        sign * (1.0 + man / scale) * 2f64.powi(exp - bias)
    }
}

/// Decode little-endian bytes of a real dtype into `f64` values.
pub fn to_f64(dtype: DType, bytes: &[u8]) -> Result<Vec<f64>, CastError> {
    let n = dtype.size();
    if !bytes.len().is_multiple_of(n) {
        return Err(CastError::Length {
            len: bytes.len(),
            dtype,
        });
    }
    let it = bytes.chunks_exact(n);
    let v: Vec<f64> = match dtype {
        DType::Bool | DType::U8 => it.map(|c| c[0] as f64).collect(),
        DType::I8 => it.map(|c| c[0] as i8 as f64).collect(),
        DType::I16 => it.map(|c| i16::from_le_bytes(word(c)) as f64).collect(),
        DType::U16 => it.map(|c| u16::from_le_bytes(word(c)) as f64).collect(),
        DType::I32 => it.map(|c| i32::from_le_bytes(word(c)) as f64).collect(),
        DType::U32 => it.map(|c| u32::from_le_bytes(word(c)) as f64).collect(),
        DType::I64 => it.map(|c| i64::from_le_bytes(word(c)) as f64).collect(),
        DType::U64 => it.map(|c| u64::from_le_bytes(word(c)) as f64).collect(),
        DType::F16 => it
            .map(|c| half::f16::from_le_bytes(word(c)).to_f64())
            .collect(),
        DType::BF16 => it
            .map(|c| half::bf16::from_le_bytes(word(c)).to_f64())
            .collect(),
        DType::F32 => it.map(|c| f32::from_le_bytes(word(c)) as f64).collect(),
        DType::F64 => it.map(|c| f64::from_le_bytes(word(c))).collect(),
        DType::F8E4M3Fn => it.map(|c| f8(c[0], 4, 7, false, true)).collect(),
        DType::F8E5M2 => it.map(|c| f8(c[0], 5, 15, false, false)).collect(),
        DType::F8E4M3Fnuz => it.map(|c| f8(c[0], 4, 8, true, true)).collect(),
        DType::F8E5M2Fnuz => it.map(|c| f8(c[0], 5, 16, true, true)).collect(),
        DType::F8E8M0Fnu => it
            .map(|c| {
                if c[0] == 0xff {
                    f64::NAN
                } else {
                    2f64.powi(c[0] as i32 - 127)
                }
            })
            .collect(),
        other => return Err(CastError::NotReal(other)),
    };
    Ok(v)
}

/// Encode `f64` values as little-endian bytes of `to`, with the rounding rules of this module.
pub fn from_f64(values: &[f64], to: DType) -> Result<Vec<u8>, CastError> {
    let mut out = Vec::with_capacity(values.len() * to.size());
    for (index, &x) in values.iter().enumerate() {
        let int = |lo: f64, hi: f64| -> Result<f64, CastError> {
            let t = x.trunc();
            if !x.is_finite() || t < lo || t > hi {
                return Err(CastError::OutOfRange {
                    index,
                    value: x,
                    to,
                });
            }
            Ok(t)
        };
        match to {
            DType::F64 => out.extend_from_slice(&x.to_le_bytes()),
            DType::F32 => out.extend_from_slice(&(x as f32).to_le_bytes()),
            DType::F16 => out.extend_from_slice(&half::f16::from_f64(x).to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&half::bf16::from_f64(x).to_le_bytes()),
            DType::Bool => out.push((x != 0.0) as u8),
            DType::U8 => out.push(int(0.0, u8::MAX as f64)? as u8),
            DType::I8 => out.push(int(i8::MIN as f64, i8::MAX as f64)? as i8 as u8),
            DType::I16 => out
                .extend_from_slice(&(int(i16::MIN as f64, i16::MAX as f64)? as i16).to_le_bytes()),
            DType::U16 => out.extend_from_slice(&(int(0.0, u16::MAX as f64)? as u16).to_le_bytes()),
            DType::I32 => out
                .extend_from_slice(&(int(i32::MIN as f64, i32::MAX as f64)? as i32).to_le_bytes()),
            DType::U32 => out.extend_from_slice(&(int(0.0, u32::MAX as f64)? as u32).to_le_bytes()),
            DType::I64 => out.extend_from_slice(
                &(int(-(2f64.powi(63)), 2f64.powi(63) - 1024.0)? as i64).to_le_bytes(),
            ),
            DType::U64 => {
                out.extend_from_slice(&(int(0.0, 2f64.powi(64) - 2048.0)? as u64).to_le_bytes())
            }
            other => return Err(CastError::Target(other)),
        }
    }
    Ok(out)
}

/// Cast little-endian bytes of `from` into little-endian bytes of `to`.
///
/// Integer-to-integer casts of 64-bit values beyond 2^53 go through `f64` and may lose
/// precision; such casts are refused rather than silently rounded.
pub fn cast(bytes: &[u8], from: DType, to: DType) -> Result<Vec<u8>, CastError> {
    if from == to {
        return Ok(bytes.to_vec());
    }
    let values = to_f64(from, bytes)?;
    if matches!(from, DType::I64 | DType::U64) {
        if let Some(index) = values
            .iter()
            .position(|v| v.abs() > 9_007_199_254_740_992.0)
        {
            return Err(CastError::OutOfRange {
                index,
                value: values[index],
                to,
            });
        }
    }
    // f32 → f16/bf16 must round once, from the exact f32 value: f64 holds it exactly.
    from_f64(&values, to)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float8_known_values() {
        // Values from the OCP FP8 spec tables.
        assert_eq!(f8(0x7e, 4, 7, false, true), 448.0); // e4m3fn max
        assert!(f8(0x7f, 4, 7, false, true).is_nan());
        assert_eq!(f8(0x7b, 5, 15, false, false), 57344.0); // e5m2 max
        assert_eq!(f8(0x7c, 5, 15, false, false), f64::INFINITY);
        assert_eq!(f8(0x01, 4, 7, false, true), 2f64.powi(-9)); // smallest subnormal
        assert!(f8(0x80, 4, 8, true, true).is_nan());
        assert_eq!(f8(0x7f, 4, 8, true, true), 240.0); // e4m3fnuz max
    }

    #[test]
    fn casts() {
        let f: Vec<u8> = [1.5f32, -2.25, 65504.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let h = cast(&f, DType::F32, DType::F16).unwrap();
        assert_eq!(to_f64(DType::F16, &h).unwrap(), [1.5, -2.25, 65504.0]);
        let i = cast(&f, DType::F32, DType::I32).unwrap();
        assert_eq!(to_f64(DType::I32, &i).unwrap(), [1.0, -2.0, 65504.0]);
        assert!(matches!(
            cast(&f, DType::F32, DType::I8),
            Err(CastError::OutOfRange { index: 2, .. })
        ));
        assert!(cast(&[0, 0, 0], DType::F16, DType::F32).is_err());
        assert!(cast(&[0; 8], DType::C64, DType::F32).is_err());
    }
}
