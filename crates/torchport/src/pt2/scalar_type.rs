//! Torch's `ScalarType` numbers as serialized in programs and payload configs
//! (torch/_export/serde/schema.py `ScalarType`): the one table mapping them to [`DType`]s.

use crate::dtype::DType;

/// A serialized `ScalarType` number, as it appears in [`TensorMeta::dtype`](super::TensorMeta)
/// and `as_scalar_type` arguments.
pub type ScalarType = i64;

/// `torch.uint8`.
pub const BYTE: ScalarType = 1;
/// `torch.int8`.
pub const CHAR: ScalarType = 2;
/// `torch.int16`.
pub const SHORT: ScalarType = 3;
/// `torch.int32`.
pub const INT: ScalarType = 4;
/// `torch.int64`.
pub const LONG: ScalarType = 5;
/// `torch.float16`.
pub const HALF: ScalarType = 6;
/// `torch.float32`.
pub const FLOAT: ScalarType = 7;
/// `torch.float64`.
pub const DOUBLE: ScalarType = 8;
/// `torch.bool`.
pub const BOOL: ScalarType = 12;
/// `torch.bfloat16`.
pub const BFLOAT16: ScalarType = 13;
/// `torch.uint16`.
pub const UINT16: ScalarType = 28;
/// `torch.uint32`.
pub const UINT32: ScalarType = 34;
/// `torch.uint64`.
pub const UINT64: ScalarType = 35;

/// The dtype of a `ScalarType` number; `None` for a number the schema does not define.
pub fn dtype(st: ScalarType) -> Option<DType> {
    Some(match st {
        1 => DType::U8,
        2 => DType::I8,
        3 => DType::I16,
        4 => DType::I32,
        5 => DType::I64,
        6 => DType::F16,
        7 => DType::F32,
        8 => DType::F64,
        9 => DType::C32,
        10 => DType::C64,
        11 => DType::C128,
        12 => DType::Bool,
        13 => DType::BF16,
        28 => DType::U16,
        29 => DType::F8E4M3Fn,
        30 => DType::F8E5M2,
        31 => DType::F8E4M3Fnuz,
        32 => DType::F8E5M2Fnuz,
        33 => DType::F8E8M0Fnu,
        34 => DType::U32,
        35 => DType::U64,
        _ => return None,
    })
}

/// The torch name (without `torch.`) of a `ScalarType` number, e.g. `float32`; `unknown` for
/// a number the schema does not define.
pub fn name(st: ScalarType) -> &'static str {
    dtype(st).map_or("unknown", DType::name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtypes() {
        assert_eq!(dtype(FLOAT), Some(DType::F32));
        assert_eq!(dtype(LONG), Some(DType::I64));
        assert_eq!(dtype(BFLOAT16), Some(DType::BF16));
        assert_eq!(dtype(0), None);
        assert_eq!(name(UINT64), "uint64");
        assert_eq!(name(9), "complex32");
        assert_eq!(name(99), "unknown");
    }
}
