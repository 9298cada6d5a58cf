//! Element conversion: decode any real dtype to `f64` (for comparing and casting), and cast
//! little-endian bytes from one dtype to another.
//!
//! Rounding rules: casts to `float16` / `bfloat16` / `float32` round to nearest, ties to
//! even (as torch does; a `float64` value goes to `float16` / `bfloat16` through `float32`,
//! rounding twice, which is what torch's conversion does too); casts from floats to integers truncate toward zero like torch's
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

/// Decode one element of a real dtype (`c` holds at least its bytes, little-endian).
fn decode(dtype: DType, c: &[u8]) -> f64 {
    match dtype {
        DType::Bool | DType::U8 => c[0] as f64,
        DType::I8 => c[0] as i8 as f64,
        DType::I16 => i16::from_le_bytes(word(c)) as f64,
        DType::U16 => u16::from_le_bytes(word(c)) as f64,
        DType::I32 => i32::from_le_bytes(word(c)) as f64,
        DType::U32 => u32::from_le_bytes(word(c)) as f64,
        DType::I64 => i64::from_le_bytes(word(c)) as f64,
        DType::U64 => u64::from_le_bytes(word(c)) as f64,
        DType::F16 => half::f16::from_le_bytes(word(c)).to_f64(),
        DType::BF16 => half::bf16::from_le_bytes(word(c)).to_f64(),
        DType::F32 => f32::from_le_bytes(word(c)) as f64,
        DType::F64 => f64::from_le_bytes(word(c)),
        DType::F8E4M3Fn => f8(c[0], 4, 7, false, true),
        DType::F8E5M2 => f8(c[0], 5, 15, false, false),
        DType::F8E4M3Fnuz => f8(c[0], 4, 8, true, true),
        DType::F8E5M2Fnuz => f8(c[0], 5, 16, true, true),
        DType::F8E8M0Fnu => {
            if c[0] == 0xff {
                f64::NAN
            } else {
                2f64.powi(c[0] as i32 - 127)
            }
        }
        // `decodable` keeps every other dtype out.
        _ => f64::NAN,
    }
}

/// `Ok` when [`decode`] has a real value for every element of `dtype`.
fn decodable(dtype: DType) -> Result<(), CastError> {
    match dtype {
        DType::Bool
        | DType::U8
        | DType::I8
        | DType::I16
        | DType::U16
        | DType::I32
        | DType::U32
        | DType::I64
        | DType::U64
        | DType::F16
        | DType::BF16
        | DType::F32
        | DType::F64
        | DType::F8E4M3Fn
        | DType::F8E5M2
        | DType::F8E4M3Fnuz
        | DType::F8E5M2Fnuz
        | DType::F8E8M0Fnu => Ok(()),
        other => Err(CastError::NotReal(other)),
    }
}

/// `Ok` when [`encode`] can write `to`.
fn encodable(to: DType) -> Result<(), CastError> {
    match to {
        DType::F64
        | DType::F32
        | DType::F16
        | DType::BF16
        | DType::Bool
        | DType::U8
        | DType::I8
        | DType::I16
        | DType::U16
        | DType::I32
        | DType::U32
        | DType::I64
        | DType::U64 => Ok(()),
        other => Err(CastError::Target(other)),
    }
}

/// Encode `x` (element `index`) as `to` into `dst` (exactly `to.size()` bytes), with the
/// rounding rules of this module.
fn encode(x: f64, to: DType, index: usize, dst: &mut [u8]) -> Result<(), CastError> {
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
        DType::F64 => dst.copy_from_slice(&x.to_le_bytes()),
        DType::F32 => dst.copy_from_slice(&(x as f32).to_le_bytes()),
        // Through float32, as torch converts a double to half and bfloat16.
        DType::F16 => dst.copy_from_slice(&half::f16::from_f32(x as f32).to_le_bytes()),
        DType::BF16 => dst.copy_from_slice(&half::bf16::from_f32(x as f32).to_le_bytes()),
        DType::Bool => dst[0] = (x != 0.0) as u8,
        DType::U8 => dst[0] = int(0.0, u8::MAX as f64)? as u8,
        DType::I8 => dst[0] = int(i8::MIN as f64, i8::MAX as f64)? as i8 as u8,
        DType::I16 => {
            dst.copy_from_slice(&(int(i16::MIN as f64, i16::MAX as f64)? as i16).to_le_bytes())
        }
        DType::U16 => dst.copy_from_slice(&(int(0.0, u16::MAX as f64)? as u16).to_le_bytes()),
        DType::I32 => {
            dst.copy_from_slice(&(int(i32::MIN as f64, i32::MAX as f64)? as i32).to_le_bytes())
        }
        DType::U32 => dst.copy_from_slice(&(int(0.0, u32::MAX as f64)? as u32).to_le_bytes()),
        DType::I64 => dst.copy_from_slice(
            &(int(-(2f64.powi(63)), 2f64.powi(63) - 1024.0)? as i64).to_le_bytes(),
        ),
        DType::U64 => {
            dst.copy_from_slice(&(int(0.0, 2f64.powi(64) - 2048.0)? as u64).to_le_bytes())
        }
        other => return Err(CastError::Target(other)),
    }
    Ok(())
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
    decodable(dtype)?;
    Ok(bytes.chunks_exact(n).map(|c| decode(dtype, c)).collect())
}

/// Encode `f64` values as little-endian bytes of `to`, with the rounding rules of this module.
pub fn from_f64(values: &[f64], to: DType) -> Result<Vec<u8>, CastError> {
    let size = to.size();
    let mut out = vec![0u8; values.len() * size];
    for (index, (&x, dst)) in values.iter().zip(out.chunks_exact_mut(size)).enumerate() {
        encode(x, to, index, dst)?;
    }
    Ok(out)
}

/// Apply `f` to every `A`-byte element of `src`, writing `B`-byte elements to `dst` (which
/// holds exactly as many).
fn map<const A: usize, const B: usize>(src: &[u8], dst: &mut [u8], f: impl Fn([u8; A]) -> [u8; B]) {
    for (s, d) in src.chunks_exact(A).zip(dst.chunks_exact_mut(B)) {
        d.copy_from_slice(&f(word(s)));
    }
}

/// Elements per block of the block-wise casts (the blocks live on the stack).
const BLOCK: usize = 1024;

/// float32 → float16 a block at a time: loaded into an array of `f32`, converted as a slice
/// (with the CPU's conversion instructions where it has them, several at once), stored.
fn f32_to_f16(src: &[u8], dst: &mut [u8]) {
    use half::slice::HalfFloatSliceExt;
    let mut a = [0f32; BLOCK];
    let mut h = [half::f16::ZERO; BLOCK];
    for (s, d) in src.chunks(4 * BLOCK).zip(dst.chunks_mut(2 * BLOCK)) {
        let n = s.len() / 4;
        for (x, c) in a.iter_mut().zip(s.chunks_exact(4)) {
            *x = f32::from_le_bytes(word(c));
        }
        h[..n].convert_from_f32_slice(&a[..n]);
        for (y, c) in h[..n].iter().zip(d.chunks_exact_mut(2)) {
            c.copy_from_slice(&y.to_le_bytes());
        }
    }
}

/// float16 → float32 a block at a time (exact), like [`f32_to_f16`].
fn f16_to_f32(src: &[u8], dst: &mut [u8]) {
    use half::slice::HalfFloatSliceExt;
    let mut h = [half::f16::ZERO; BLOCK];
    let mut a = [0f32; BLOCK];
    for (s, d) in src.chunks(2 * BLOCK).zip(dst.chunks_mut(4 * BLOCK)) {
        let n = s.len() / 2;
        for (x, c) in h.iter_mut().zip(s.chunks_exact(2)) {
            *x = half::f16::from_le_bytes(word(c));
        }
        h[..n].convert_to_f32_slice(&mut a[..n]);
        for (y, c) in a[..n].iter().zip(d.chunks_exact_mut(4)) {
            c.copy_from_slice(&y.to_le_bytes());
        }
    }
}

/// float32 → bfloat16 a block at a time, round to nearest even on the bits (what
/// `half::bf16::from_f32` and torch do; NaNs stay NaN, quieted), in a form the compiler
/// vectorises.
fn f32_to_bf16(src: &[u8], dst: &mut [u8]) {
    let mut a = [0u32; BLOCK];
    let mut h = [0u16; BLOCK];
    for (s, d) in src.chunks(4 * BLOCK).zip(dst.chunks_mut(2 * BLOCK)) {
        let n = s.len() / 4;
        for (x, c) in a.iter_mut().zip(s.chunks_exact(4)) {
            *x = u32::from_le_bytes(word(c));
        }
        for (y, &x) in h[..n].iter_mut().zip(&a[..n]) {
            let nan = x & 0x7fff_ffff > 0x7f80_0000;
            // Adding 0x7fff plus the kept lowest bit carries into the kept bits exactly when
            // the dropped half is above the tie, or at it with an odd kept part. Finite
            // values cannot overflow u32 (the largest is below 0xff80_0000).
            let rounded = (x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16) as u16;
            *y = if nan {
                (x >> 16) as u16 | 0x0040
            } else {
                rounded
            };
        }
        for (y, c) in h[..n].iter().zip(d.chunks_exact_mut(2)) {
            c.copy_from_slice(&y.to_le_bytes());
        }
    }
}

/// The float-to-float casts done without going through `f64`, element by element; each
/// gives exactly what the `f64` route does (the value is rounded once, from its exact value).
/// Returns false for other pairs.
fn float_direct(from: DType, to: DType, src: &[u8], dst: &mut [u8]) -> bool {
    use half::{bf16, f16};
    match (from, to) {
        (DType::F32, DType::F16) => f32_to_f16(src, dst),
        (DType::F32, DType::BF16) => f32_to_bf16(src, dst),
        (DType::F32, DType::F64) => map(src, dst, |b| (f32::from_le_bytes(b) as f64).to_le_bytes()),
        (DType::F16, DType::F32) => f16_to_f32(src, dst),
        (DType::F16, DType::F64) => map(src, dst, |b| f16::from_le_bytes(b).to_f64().to_le_bytes()),
        (DType::F16, DType::BF16) => map(src, dst, |b| {
            bf16::from_f32(f16::from_le_bytes(b).to_f32()).to_le_bytes()
        }),
        (DType::BF16, DType::F32) => {
            map(src, dst, |b| bf16::from_le_bytes(b).to_f32().to_le_bytes())
        }
        (DType::BF16, DType::F64) => {
            map(src, dst, |b| bf16::from_le_bytes(b).to_f64().to_le_bytes())
        }
        (DType::BF16, DType::F16) => map(src, dst, |b| {
            f16::from_f32(bf16::from_le_bytes(b).to_f32()).to_le_bytes()
        }),
        (DType::F64, DType::F32) => map(src, dst, |b| (f64::from_le_bytes(b) as f32).to_le_bytes()),
        (DType::F64, DType::F16) => map(src, dst, |b| {
            f16::from_f32(f64::from_le_bytes(b) as f32).to_le_bytes()
        }),
        (DType::F64, DType::BF16) => map(src, dst, |b| {
            bf16::from_f32(f64::from_le_bytes(b) as f32).to_le_bytes()
        }),
        _ => return false,
    }
    true
}

/// Cast little-endian bytes of `from` into little-endian bytes of `to`.
///
/// Conversions between `float32`, `float16`, `bfloat16` and `float64` are done directly;
/// the others decode each element to `f64` and encode it at once. Either way the result is
/// written straight into the output, with no buffer of intermediate values.
///
/// Integer-to-integer casts of 64-bit values beyond 2^53 go through `f64` and may lose
/// precision; such casts are refused rather than silently rounded.
pub fn cast(bytes: &[u8], from: DType, to: DType) -> Result<Vec<u8>, CastError> {
    if from == to {
        return Ok(bytes.to_vec());
    }
    let n = from.size();
    if !bytes.len().is_multiple_of(n) {
        return Err(CastError::Length {
            len: bytes.len(),
            dtype: from,
        });
    }
    decodable(from)?;
    let count = bytes.len() / n;
    if count == 0 {
        return Ok(Vec::new());
    }
    if matches!(from, DType::I64 | DType::U64) {
        let big = |c: &[u8]| decode(from, c).abs() > 9_007_199_254_740_992.0;
        if let Some(index) = bytes.chunks_exact(n).position(big) {
            return Err(CastError::OutOfRange {
                index,
                value: decode(from, &bytes[index * n..]),
                to,
            });
        }
    }
    encodable(to)?;
    let size = to.size();
    let mut out = vec![0u8; count * size];
    if float_direct(from, to, bytes, &mut out) {
        return Ok(out);
    }
    for (index, (c, dst)) in bytes
        .chunks_exact(n)
        .zip(out.chunks_exact_mut(size))
        .enumerate()
    {
        encode(decode(from, c), to, index, dst)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cast as it was done before the direct paths: every value decoded into a buffer of
    /// `f64`, then encoded (to half types through `f32`: `half`'s own `f64` conversions
    /// drop the low 32 bits before rounding, which rounded some `float32` ties the wrong
    /// way; see tests/cast_torch.rs for torch's values).
    fn via_f64(bytes: &[u8], from: DType, to: DType) -> Result<Vec<u8>, CastError> {
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
        let mut out = Vec::new();
        for (index, &x) in values.iter().enumerate() {
            let mut b = vec![0u8; to.size()];
            match to {
                DType::F16 => b.copy_from_slice(&half::f16::from_f32(x as f32).to_le_bytes()),
                DType::BF16 => b.copy_from_slice(&half::bf16::from_f32(x as f32).to_le_bytes()),
                _ => encode(x, to, index, &mut b)?,
            }
            out.extend_from_slice(&b);
        }
        Ok(out)
    }

    const TARGETS: [DType; 13] = [
        DType::F64,
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::I16,
        DType::U16,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
    ];

    /// Compare the direct casts with the `f64` route, NaN for NaN (payload bits may differ).
    fn same_as_via_f64(bytes: &[u8], from: DType) {
        for to in TARGETS.into_iter().filter(|&to| to != from) {
            let (a, b) = (cast(bytes, from, to), via_f64(bytes, from, to));
            match (&a, &b) {
                (Ok(a), Ok(b)) => {
                    let w = to.size();
                    for (i, (x, y)) in a.chunks(w).zip(b.chunks(w)).enumerate() {
                        if x != y {
                            let (vx, vy) = (decode(to, x), decode(to, y));
                            assert!(
                                vx.is_nan() && vy.is_nan(),
                                "{from}->{to} element {i}: {x:?} != {y:?}"
                            );
                        }
                    }
                }
                _ => assert_eq!(a.is_ok(), b.is_ok(), "{from}->{to}: {a:?} vs {b:?}"),
            }
        }
    }

    #[test]
    fn direct_matches_f64_route_for_every_half_value() {
        let all: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
        same_as_via_f64(&all, DType::F16);
        same_as_via_f64(&all, DType::BF16);
    }

    #[test]
    fn direct_matches_f64_route_for_float32() {
        // Every 32749th bit pattern, plus the neighbourhood of each half/bfloat16 rounding
        // boundary in a few binades, and the special values.
        let mut bits: Vec<u32> = (0..1u32 << 17).map(|i| i.wrapping_mul(32749)).collect();
        for e in [
            0x3f80_0000u32,
            0x4780_0000,
            0x3880_0000,
            0x3300_0000,
            0x0080_0000,
        ] {
            bits.extend((0..1u32 << 12).map(|m| e + m));
            bits.extend((0..1u32 << 12).map(|m| e + 0x1000 - 8 + m));
            bits.extend((0..1u32 << 12).map(|m| e + 0x8000 - 8 + m));
        }
        bits.extend([
            0,
            0x8000_0000,
            0x7f80_0000,
            0xff80_0000,
            0x7fc0_0000,
            0x7f80_0001,
        ]);
        let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        same_as_via_f64(&bytes, DType::F32);
        // float64 → float32 (and to integers) is unchanged; to float16 only where float32
        // holds the value exactly (the f64 route rounded once more from there).
        let wide: Vec<u8> = bits
            .iter()
            .flat_map(|&b| (f32::from_bits(b) as f64).to_le_bytes())
            .collect();
        same_as_via_f64(&wide, DType::F64);
    }

    #[test]
    fn integers_stream_without_f64_buffer() {
        let ints: Vec<u8> = [0i64, -3, 1 << 40, 9_007_199_254_740_992]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        same_as_via_f64(&ints, DType::I64);
        let big: Vec<u8> = [1i64, (1 << 53) + 2]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert!(matches!(
            cast(&big, DType::I64, DType::F32),
            Err(CastError::OutOfRange { index: 1, .. })
        ));
        let bytes: Vec<u8> = (0..=255u8).collect();
        for from in [
            DType::U8,
            DType::I8,
            DType::Bool,
            DType::F8E4M3Fn,
            DType::F8E5M2,
        ] {
            same_as_via_f64(&bytes, from);
        }
        assert_eq!(cast(&[], DType::F32, DType::C64), Ok(vec![]));
        assert_eq!(
            cast(&[0; 4], DType::F32, DType::C64),
            Err(CastError::Target(DType::C64))
        );
    }

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
