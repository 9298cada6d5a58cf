//! The runtime's dtype policy over torch `ScalarType` numbers (whose table is the core's,
//! [`torchport::pt2::scalar_type`], re-exported here): float64 computes in f64, the other
//! floats (f16, bf16, f32) in f32, integers in i64, bools as u8 0/1, each mapped to its
//! candle dtype.

use candle_core::{DType, Tensor};

use crate::error::{OpError, OpResult};

pub use torchport::pt2::scalar_type::{
    name, ScalarType, BFLOAT16, BOOL, BYTE, CHAR, DOUBLE, FLOAT, HALF, INT, LONG, SHORT, UINT16,
    UINT32, UINT64,
};

/// Whether the dtype is a floating type the runtime computes (f16, bf16, f32, f64).
pub fn is_float(st: ScalarType) -> bool {
    matches!(st, HALF | FLOAT | DOUBLE | BFLOAT16)
}

/// Whether the dtype is an integer type the runtime holds as i64.
pub fn is_int(st: ScalarType) -> bool {
    matches!(
        st,
        BYTE | CHAR | SHORT | INT | LONG | UINT16 | UINT32 | UINT64
    )
}

/// The candle dtype values of torch dtype `st` are held in while the graph runs.
pub fn runtime(st: ScalarType) -> OpResult<DType> {
    if st == DOUBLE {
        Ok(DType::F64)
    } else if is_float(st) {
        Ok(DType::F32)
    } else if is_int(st) {
        Ok(DType::I64)
    } else if st == BOOL {
        Ok(DType::U8)
    } else {
        Err(OpError(format!("dtype {} is not supported", name(st))))
    }
}

/// Cast `t` to torch dtype `st` as torch would (rounding f16/bf16, truncating to ints,
/// `!= 0` for bool), returning it in the runtime representation.
pub fn cast(t: &Tensor, st: ScalarType) -> OpResult<Tensor> {
    Ok(match st {
        // From f64, round once (f64 -> f32 -> f16 could round twice).
        HALF if t.dtype() == DType::F64 => t.to_dtype(DType::F16)?.to_dtype(DType::F32)?,
        BFLOAT16 if t.dtype() == DType::F64 => t.to_dtype(DType::BF16)?.to_dtype(DType::F32)?,
        HALF => t
            .to_dtype(DType::F32)?
            .to_dtype(DType::F16)?
            .to_dtype(DType::F32)?,
        BFLOAT16 => t
            .to_dtype(DType::F32)?
            .to_dtype(DType::BF16)?
            .to_dtype(DType::F32)?,
        FLOAT => t.to_dtype(DType::F32)?,
        DOUBLE => t.to_dtype(DType::F64)?,
        BOOL => {
            if t.dtype() == DType::U8 {
                t.clone()
            } else {
                t.ne(&t.zeros_like()?)?
            }
        }
        s if is_int(s) => {
            if t.dtype() == DType::I64 {
                t.clone()
            } else {
                t.to_dtype(DType::I64)?
            }
        }
        s => return Err(OpError(format!("cast to {} is not supported", name(s)))),
    })
}

/// Convert a runtime tensor to the candle dtype closest to torch dtype `st`, for results
/// handed to the caller: f16/bf16/f64/i32 as such, other ints as i64, bool as u8.
pub fn to_declared(t: &Tensor, st: ScalarType) -> OpResult<Tensor> {
    let want = match st {
        HALF => DType::F16,
        BFLOAT16 => DType::BF16,
        DOUBLE => DType::F64,
        FLOAT => DType::F32,
        INT => DType::I32,
        BOOL | BYTE => DType::U8,
        s if is_int(s) => DType::I64,
        s => return Err(OpError(format!("dtype {} is not supported", name(s)))),
    };
    Ok(t.to_dtype(want)?)
}

/// The torch dtype a candle tensor's runtime representation stands for, when the program
/// gives no better answer.
pub fn of_runtime(d: DType) -> ScalarType {
    match d {
        DType::U8 => BOOL,
        DType::I64 | DType::U32 | DType::I32 | DType::I16 => LONG,
        DType::F64 => DOUBLE,
        _ => FLOAT,
    }
}
