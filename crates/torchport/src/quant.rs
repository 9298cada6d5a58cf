//! Quantized tensors on their way out: how formats without quantized types (safetensors,
//! npz) store them, and dequantization to float32 as torch's `Tensor.dequantize()` computes it.
//!
//! A quantized tensor `NAME` (`qint8`, `quint8`, `qint32`) is stored as (docs/FORMATS.md,
//! "Quantized tensors"):
//! - `NAME`: its integer representation (torch's `int_repr()`): `int8`, `uint8` or `int32`;
//! - `NAME.scale`: `float64`, 0-d per tensor, `[C]` per channel;
//! - `NAME.zero_point`: `int64` (`float64` for `per_channel_affine_float_qparams`), 0-d per
//!   tensor, `[C]` per channel;
//! - `NAME.axis`: `int64`, 0-d, only per channel (its presence says "per channel").
//!
//! `real = (q - zero_point) * scale`, with the scale and zero point of `q`'s channel.

use std::borrow::Cow;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::out::OutTensor;
use crate::tensor::Quant;

/// Suffix of the tensor holding a quantized tensor's scale(s).
pub const SCALE_SUFFIX: &str = ".scale";
/// Suffix of the tensor holding a quantized tensor's zero point(s).
pub const ZERO_POINT_SUFFIX: &str = ".zero_point";
/// Suffix of the tensor holding a per-channel quantized tensor's channel axis.
pub const AXIS_SUFFIX: &str = ".axis";

/// The integer dtype holding a quantized dtype's values (`qint8` → `int8`, `quint8` →
/// `uint8`, `qint32` → `int32`); `None` for the packed sub-byte types and non-quantized ones.
pub fn int_dtype(dtype: DType) -> Option<DType> {
    match dtype {
        DType::QInt8 => Some(DType::I8),
        DType::QUInt8 => Some(DType::U8),
        DType::QInt32 => Some(DType::I32),
        _ => None,
    }
}

/// Check that `quant` fits a tensor of `shape`: the axis is a dimension and there is one
/// scale and one zero point per index along it.
pub fn check(quant: &Quant, shape: &[usize]) -> std::result::Result<(), String> {
    if let Quant::PerChannel {
        scales,
        zero_points,
        axis,
        ..
    } = quant
    {
        let Some(&channels) = shape.get(*axis) else {
            return Err(format!(
                "its quantization axis {axis} is not a dimension of its shape {shape:?}"
            ));
        };
        if scales.len() != channels || zero_points.len() != channels {
            return Err(format!(
                "it has {} scales and {} zero points for {channels} channels on axis {axis}",
                scales.len(),
                zero_points.len()
            ));
        }
    }
    Ok(())
}

/// Dequantize the contiguous little-endian integer representation `bytes` of a tensor of
/// `dtype` (`qint8`, `quint8`, `qint32`) and `shape` to float32 bytes, as torch 2.x on CPU:
/// per tensor `float(q - zero_point) * float(scale)`; per channel (integer zero points)
/// `float((q - zero_point) * scale)` computed in float64; `float_qparams`
/// `(float(q) - float(zero_point)) * float(scale)`. (`qint32` values beyond 2^24 may differ
/// from torch's by rounding.)
pub fn dequantize(
    bytes: &[u8],
    dtype: DType,
    shape: &[usize],
    quant: &Quant,
) -> std::result::Result<Vec<u8>, String> {
    check(quant, shape)?;
    let value = |i: usize| -> i64 {
        match dtype {
            DType::QInt8 => bytes[i] as i8 as i64,
            DType::QUInt8 => bytes[i] as i64,
            _ => {
                let b = &bytes[i * 4..i * 4 + 4];
                i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64
            }
        }
    };
    let size = match int_dtype(dtype) {
        Some(d) => d.size(),
        None => return Err(format!("torchport cannot dequantize {dtype}")),
    };
    let numel: usize = shape.iter().product();
    if bytes.len() != numel * size {
        return Err(format!(
            "its data has {} bytes, but {dtype} {shape:?} needs {}",
            bytes.len(),
            numel * size
        ));
    }
    let mut out = Vec::with_capacity(numel * 4);
    match quant {
        Quant::PerTensor { scale, zero_point } => {
            let s = *scale as f32;
            for i in 0..numel {
                let q = value(i).saturating_sub(*zero_point);
                out.extend_from_slice(&((q as f32) * s).to_le_bytes());
            }
        }
        Quant::PerChannel {
            scales,
            zero_points,
            axis,
            float_qparams,
        } => {
            let channels = shape[*axis];
            let inner: usize = shape[axis + 1..].iter().product();
            for i in 0..numel {
                let c = (i / inner.max(1)) % channels.max(1);
                let (s, z) = (scales[c], zero_points[c]);
                let x = if *float_qparams {
                    (value(i) as f32 - z as f32) * s as f32
                } else {
                    ((value(i) as f64 - z) * s) as f32
                };
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
    }
    Ok(out)
}

/// One little-endian tensor built from numbers.
fn param<'b>(name: String, dtype: DType, shape: Vec<usize>, bytes: Vec<u8>) -> OutTensor<'b> {
    OutTensor::new(name, dtype, shape, move || Ok(Cow::Owned(bytes.clone())))
}

/// The tensors that stand for `t` in a format without quantized types: `t` itself (its
/// bytes unchanged) when it is not quantized or carries no parameters; otherwise its integer
/// representation and its parameters, named as the module docs say.
fn split_one<'b>(t: &'b OutTensor<'_>) -> Result<Vec<OutTensor<'b>>> {
    let (Some(q), Some(int)) = (t.quant(), int_dtype(t.dtype)) else {
        return Ok(vec![t.borrowed()]);
    };
    check(q, &t.shape).map_err(|what| Error::Tensor {
        path: Default::default(),
        tensor: t.name.clone(),
        what,
    })?;
    let f64s = |v: &[f64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let i64s = |v: &[i64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let n = |suffix: &str| format!("{}{suffix}", t.name);
    let mut ints = t.borrowed().with_quant(None);
    ints.dtype = int;
    let mut out = vec![ints];
    match q {
        Quant::PerTensor { scale, zero_point } => {
            out.push(param(n(SCALE_SUFFIX), DType::F64, vec![], f64s(&[*scale])));
            out.push(param(
                n(ZERO_POINT_SUFFIX),
                DType::I64,
                vec![],
                i64s(&[*zero_point]),
            ));
        }
        Quant::PerChannel {
            scales,
            zero_points,
            axis,
            float_qparams,
        } => {
            let c = vec![scales.len()];
            out.push(param(n(SCALE_SUFFIX), DType::F64, c.clone(), f64s(scales)));
            out.push(if *float_qparams {
                param(n(ZERO_POINT_SUFFIX), DType::F64, c, f64s(zero_points))
            } else {
                let z: Vec<i64> = zero_points.iter().map(|&z| z as i64).collect();
                param(n(ZERO_POINT_SUFFIX), DType::I64, c, i64s(&z))
            });
            out.push(param(
                n(AXIS_SUFFIX),
                DType::I64,
                vec![],
                i64s(&[*axis as i64]),
            ));
        }
    }
    Ok(out)
}

/// The tensors a format without quantized types stores for `tensors`: each quantized tensor
/// with parameters becomes its integer representation plus `NAME.scale`, `NAME.zero_point`
/// and (per channel) `NAME.axis`; everything else is passed through. A parameter name that
/// is also the name of another tensor is an error (nothing is silently overwritten).
pub fn split<'b>(tensors: &'b [OutTensor<'_>]) -> Result<Vec<OutTensor<'b>>> {
    let names: std::collections::HashSet<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    let mut out = Vec::with_capacity(tensors.len());
    for t in tensors {
        let parts = split_one(t)?;
        for p in parts.iter().skip(1) {
            if names.contains(p.name.as_str()) {
                return Err(Error::Tensor {
                    path: Default::default(),
                    tensor: t.name.clone(),
                    what: format!(
                        "is quantized, and its parameter would be stored as {}, which is \
                         already the name of another tensor; rename one of them or \
                         dequantize it",
                        p.name
                    ),
                });
            }
        }
        out.extend(parts);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_channel_indexing_and_checks() {
        // shape [2, 3], axis 1: channel = column.
        let q = Quant::PerChannel {
            scales: vec![1.0, 0.5, 0.25],
            zero_points: vec![0.0, 1.0, -1.0],
            axis: 1,
            float_qparams: false,
        };
        let bytes = [1u8, 3, 3, 2, 1, 0xff];
        let out = dequantize(&bytes, DType::QInt8, &[2, 3], &q).unwrap();
        let f: Vec<f32> = out
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(f, [1.0, 1.0, 1.0, 2.0, 0.0, 0.0]);
        assert!(dequantize(&bytes, DType::QInt8, &[3, 2], &q)
            .unwrap_err()
            .contains("3 scales and 3 zero points for 2 channels"));
        let bad_axis = Quant::PerChannel {
            scales: vec![],
            zero_points: vec![],
            axis: 5,
            float_qparams: false,
        };
        assert!(check(&bad_axis, &[2, 3]).unwrap_err().contains("axis 5"));
        assert!(dequantize(&bytes[..5], DType::QInt8, &[2, 3], &q).is_err());
    }
}
