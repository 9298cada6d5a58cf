//! Bytes to Burn `TensorData`: little-endian bytes of a torch dtype, labelled with Burn's
//! dtype — float32 straight into the `Vec<f32>` Burn keeps (no realignment copy later), dtypes
//! Burn has no element for (float8) decoded to f32.

use std::borrow::Cow;

use burn::tensor::{BoolStore, DType as BurnDType, TensorData};
use torchport::DType;

/// Burn's dtype for a torch dtype, when Burn has one.
pub(crate) fn burn_dtype(d: DType) -> Option<BurnDType> {
    Some(match d {
        DType::F64 => BurnDType::F64,
        DType::F32 => BurnDType::F32,
        DType::F16 => BurnDType::F16,
        DType::BF16 => BurnDType::BF16,
        DType::I64 => BurnDType::I64,
        DType::I32 => BurnDType::I32,
        DType::I16 => BurnDType::I16,
        DType::I8 => BurnDType::I8,
        DType::U64 => BurnDType::U64,
        DType::U32 => BurnDType::U32,
        DType::U16 => BurnDType::U16,
        DType::U8 => BurnDType::U8,
        DType::Bool => BurnDType::Bool(BoolStore::Native),
        _ => return None,
    })
}

/// The dtype the produced data will have.
pub(crate) fn produced_dtype(d: DType) -> BurnDType {
    burn_dtype(d).unwrap_or(BurnDType::F32)
}

/// `bytes` (little-endian, row-major, `dtype` elements of `shape`) as Burn data.
pub(crate) fn tensor_data(
    dtype: DType,
    shape: Vec<usize>,
    bytes: Cow<'_, [u8]>,
) -> Result<TensorData, String> {
    if dtype == DType::F32 {
        let v: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        return Ok(TensorData::new(v, shape));
    }
    match burn_dtype(dtype) {
        Some(d) => TensorData::try_from_bytes_vec(bytes.into_owned(), shape, d)
            .map_err(|e| format!("{e:?}")),
        None => {
            // float8 and friends: decode exactly to f64, then round to f32.
            let v: Vec<f32> = torchport::cast::to_f64(dtype, &bytes)
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(|x| x as f32)
                .collect();
            Ok(TensorData::new(v, shape))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_f32_f16_and_float8() {
        let bytes: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let d = tensor_data(DType::F32, vec![2], Cow::Borrowed(&bytes)).unwrap();
        assert_eq!(d.iter::<f32>().collect::<Vec<_>>(), [1.5, -2.0]);
        let h = half::f16::from_f32(0.25).to_le_bytes().to_vec();
        let d = tensor_data(DType::F16, vec![1], Cow::Owned(h)).unwrap();
        assert_eq!(d.dtype(), BurnDType::F16);
        // float8 e4m3fn 0x38 = 1.0, 0xc0 = -2.0
        let d = tensor_data(DType::F8E4M3Fn, vec![2], Cow::Owned(vec![0x38, 0xc0])).unwrap();
        assert_eq!(d.iter::<f32>().collect::<Vec<_>>(), [1.0, -2.0]);
    }
}
