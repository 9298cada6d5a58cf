//! Every torch dtype: its name (the contract of docs/CONTRACTS.md), its element size, and how it is
//! spelled in pickles (`torch.float32`, `torch.FloatStorage`).

use std::fmt;

/// A tensor element type, named as torch names it (without the `torch.` prefix).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DType {
    /// `bool`, one byte per element.
    Bool,
    /// `uint8`.
    U8,
    /// `int8`.
    I8,
    /// `int16`.
    I16,
    /// `uint16`.
    U16,
    /// `int32`.
    I32,
    /// `uint32`.
    U32,
    /// `int64`.
    I64,
    /// `uint64`.
    U64,
    /// `float16` (IEEE half).
    F16,
    /// `bfloat16`.
    BF16,
    /// `float32`.
    F32,
    /// `float64`.
    F64,
    /// `complex32` (two float16).
    C32,
    /// `complex64` (two float32).
    C64,
    /// `complex128` (two float64).
    C128,
    /// `float8_e4m3fn`.
    F8E4M3Fn,
    /// `float8_e5m2`.
    F8E5M2,
    /// `float8_e4m3fnuz`.
    F8E4M3Fnuz,
    /// `float8_e5m2fnuz`.
    F8E5M2Fnuz,
    /// `float8_e8m0fnu`.
    F8E8M0Fnu,
    /// `float4_e2m1fn_x2`: two 4-bit floats packed in one byte.
    F4E2M1FnX2,
    /// `qint8`: quantized, stored as int8.
    QInt8,
    /// `quint8`: quantized, stored as uint8.
    QUInt8,
    /// `qint32`: quantized, stored as int32.
    QInt32,
    /// `quint4x2`: two 4-bit quantized values per byte.
    QUInt4x2,
    /// `quint2x4`: four 2-bit quantized values per byte.
    QUInt2x4,
    /// `bits8`: opaque byte.
    Bits8,
    /// `bits16`: opaque 16-bit word.
    Bits16,
}

/// Every dtype, in the order of the enum.
pub const ALL_DTYPES: &[DType] = &[
    DType::Bool,
    DType::U8,
    DType::I8,
    DType::I16,
    DType::U16,
    DType::I32,
    DType::U32,
    DType::I64,
    DType::U64,
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
    DType::C32,
    DType::C64,
    DType::C128,
    DType::F8E4M3Fn,
    DType::F8E5M2,
    DType::F8E4M3Fnuz,
    DType::F8E5M2Fnuz,
    DType::F8E8M0Fnu,
    DType::F4E2M1FnX2,
    DType::QInt8,
    DType::QUInt8,
    DType::QInt32,
    DType::QUInt4x2,
    DType::QUInt2x4,
    DType::Bits8,
    DType::Bits16,
];

impl DType {
    /// The torch name, e.g. `float32`.
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "uint8",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::U16 => "uint16",
            DType::I32 => "int32",
            DType::U32 => "uint32",
            DType::I64 => "int64",
            DType::U64 => "uint64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::C32 => "complex32",
            DType::C64 => "complex64",
            DType::C128 => "complex128",
            DType::F8E4M3Fn => "float8_e4m3fn",
            DType::F8E5M2 => "float8_e5m2",
            DType::F8E4M3Fnuz => "float8_e4m3fnuz",
            DType::F8E5M2Fnuz => "float8_e5m2fnuz",
            DType::F8E8M0Fnu => "float8_e8m0fnu",
            DType::F4E2M1FnX2 => "float4_e2m1fn_x2",
            DType::QInt8 => "qint8",
            DType::QUInt8 => "quint8",
            DType::QInt32 => "qint32",
            DType::QUInt4x2 => "quint4x2",
            DType::QUInt2x4 => "quint2x4",
            DType::Bits8 => "bits8",
            DType::Bits16 => "bits16",
        }
    }

    /// Parse a torch dtype name, accepting torch's aliases (`float`, `half`, `long`, `cfloat`…)
    /// and an optional `torch.` prefix.
    pub fn from_name(name: &str) -> Option<DType> {
        let name = name.strip_prefix("torch.").unwrap_or(name);
        let alias = match name {
            "float" => Some(DType::F32),
            "double" => Some(DType::F64),
            "half" => Some(DType::F16),
            "long" => Some(DType::I64),
            "int" => Some(DType::I32),
            "short" => Some(DType::I16),
            "cfloat" => Some(DType::C64),
            "cdouble" => Some(DType::C128),
            "chalf" => Some(DType::C32),
            _ => None,
        };
        alias.or_else(|| ALL_DTYPES.iter().copied().find(|d| d.name() == name))
    }

    /// The dtype of a legacy typed storage class such as `FloatStorage`.
    pub fn from_storage_class(class: &str) -> Option<DType> {
        // Untyped storage counts bytes; the tensor carries its own dtype (`_rebuild_tensor_v3`).
        if class == "UntypedStorage" {
            return Some(DType::U8);
        }
        STORAGE_CLASSES
            .iter()
            .find(|(_, c)| *c == class)
            .map(|(d, _)| *d)
    }

    /// The legacy typed storage class that holds this dtype (`FloatStorage`), if torch has
    /// one; the `.pt` writer uses it as `torch.save` does.
    pub(crate) fn storage_class(self) -> Option<&'static str> {
        STORAGE_CLASSES
            .iter()
            .find(|(d, _)| *d == self)
            .map(|(_, c)| *c)
    }

    /// Bytes per element (for packed sub-byte types, bytes per packed element).
    pub fn size(self) -> usize {
        match self {
            DType::Bool
            | DType::U8
            | DType::I8
            | DType::F8E4M3Fn
            | DType::F8E5M2
            | DType::F8E4M3Fnuz
            | DType::F8E5M2Fnuz
            | DType::F8E8M0Fnu
            | DType::F4E2M1FnX2
            | DType::QInt8
            | DType::QUInt8
            | DType::QUInt4x2
            | DType::QUInt2x4
            | DType::Bits8 => 1,
            DType::I16 | DType::U16 | DType::F16 | DType::BF16 | DType::Bits16 => 2,
            DType::I32 | DType::U32 | DType::F32 | DType::C32 | DType::QInt32 => 4,
            DType::I64 | DType::U64 | DType::F64 | DType::C64 => 8,
            DType::C128 => 16,
        }
    }

    /// The width of one scalar for byte-order swapping: complex numbers swap each half on its
    /// own, everything else swaps the whole element.
    pub fn swap_width(self) -> usize {
        match self {
            DType::C32 | DType::C64 | DType::C128 => self.size() / 2,
            _ => self.size(),
        }
    }

    /// True for floating-point (real) types.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DType::F16
                | DType::BF16
                | DType::F32
                | DType::F64
                | DType::F8E4M3Fn
                | DType::F8E5M2
                | DType::F8E4M3Fnuz
                | DType::F8E5M2Fnuz
                | DType::F8E8M0Fnu
                | DType::F4E2M1FnX2
        )
    }

    /// True for the quantized types (`qint8`, `quint8`, …).
    pub fn is_quantized(self) -> bool {
        matches!(
            self,
            DType::QInt8 | DType::QUInt8 | DType::QInt32 | DType::QUInt4x2 | DType::QUInt2x4
        )
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// torch's typed storage classes and the dtype of their elements: the one table the readers
/// ([`DType::from_storage_class`]) and the `.pt` writer ([`DType::storage_class`]) share.
const STORAGE_CLASSES: [(DType, &str); 17] = [
    (DType::F64, "DoubleStorage"),
    (DType::F32, "FloatStorage"),
    (DType::F16, "HalfStorage"),
    (DType::I64, "LongStorage"),
    (DType::I32, "IntStorage"),
    (DType::I16, "ShortStorage"),
    (DType::I8, "CharStorage"),
    (DType::U8, "ByteStorage"),
    (DType::Bool, "BoolStorage"),
    (DType::BF16, "BFloat16Storage"),
    (DType::C128, "ComplexDoubleStorage"),
    (DType::C64, "ComplexFloatStorage"),
    (DType::QInt8, "QInt8Storage"),
    (DType::QInt32, "QInt32Storage"),
    (DType::QUInt8, "QUInt8Storage"),
    (DType::QUInt4x2, "QUInt4x2Storage"),
    (DType::QUInt2x4, "QUInt2x4Storage"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for &d in ALL_DTYPES {
            assert_eq!(DType::from_name(d.name()), Some(d), "{d}");
            assert_eq!(DType::from_name(&format!("torch.{}", d.name())), Some(d));
        }
        assert_eq!(DType::from_name("half"), Some(DType::F16));
        assert_eq!(DType::from_name("float33"), None);
    }

    #[test]
    fn storage_classes() {
        assert_eq!(DType::from_storage_class("FloatStorage"), Some(DType::F32));
        assert_eq!(
            DType::from_storage_class("QUInt8Storage"),
            Some(DType::QUInt8)
        );
        assert_eq!(DType::from_storage_class("EvilStorage"), None);
    }

    #[test]
    fn sizes() {
        assert_eq!(DType::C128.size(), 16);
        assert_eq!(DType::C128.swap_width(), 8);
        assert_eq!(DType::BF16.size(), 2);
        assert_eq!(DType::F8E5M2.size(), 1);
    }
}
