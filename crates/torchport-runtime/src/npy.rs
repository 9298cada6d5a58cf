//! numpy I/O for `torchport run` and the tests, through torchport's own numpy reader
//! (`torchport::open`) and writers (`torchport::write`).

use std::borrow::Cow;
use std::path::Path;

use candle_core::{DType, Tensor};
use torchport::{DType as TDType, OutTensor};

/// Read a `.npy` file (through torchport's numpy reader) into a runtime tensor: float64 as f64,
/// other floats as f32, integers as i64, bool as u8 0/1.
pub fn read_npy(path: &Path) -> Result<Tensor, String> {
    let mut all = read_arrays(path)?;
    if all.len() != 1 {
        return Err(format!(
            "{}: expected one array, found {}",
            path.display(),
            all.len()
        ));
    }
    Ok(all.remove(0).1)
}

/// Every array of a numpy file (`.npy` or `.npz`), by name, as runtime tensors.
pub fn read_arrays(path: &Path) -> Result<Vec<(String, Tensor)>, String> {
    let ckpt = torchport::open(path).map_err(|e| e.to_string())?;
    ckpt.tensors()
        .iter()
        .map(|t| {
            let bytes = ckpt.data(t).map_err(|e| e.to_string())?;
            let x = crate::archive::tensor_from_bytes(&bytes, t.dtype.name(), &t.shape)
                .map_err(|e| format!("{}: array '{}': {e}", path.display(), t.name))?;
            Ok((t.name.clone(), x))
        })
        .collect()
}

/// Little-endian bytes of an int64 value narrowed to a smaller integer type.
type Narrow = fn(i64) -> Vec<u8>;

/// A program output as an [`OutTensor`] in the dtype the program declares for it (`declared`,
/// a torch `ScalarType`): integers the runtime holds as int64 are narrowed to int8, int16,
/// int32, uint8, uint16, uint32 or uint64 as torch would hold them (two's-complement
/// wrapping, as torch converts), bool stays bool; otherwise as [`out_tensor`].
pub fn out_tensor_as(
    name: String,
    t: &Tensor,
    declared: Option<crate::dtype::ScalarType>,
) -> Result<OutTensor<'static>, String> {
    use crate::dtype::{BOOL, BYTE, CHAR, INT, SHORT, UINT16, UINT32, UINT64};
    let narrow: Option<(TDType, Narrow)> = match declared {
        Some(CHAR) => Some((TDType::I8, |v| (v as i8).to_le_bytes().to_vec())),
        Some(SHORT) => Some((TDType::I16, |v| (v as i16).to_le_bytes().to_vec())),
        Some(INT) => Some((TDType::I32, |v| (v as i32).to_le_bytes().to_vec())),
        Some(BYTE) => Some((TDType::U8, |v| vec![v as u8])),
        Some(UINT16) => Some((TDType::U16, |v| (v as u16).to_le_bytes().to_vec())),
        Some(UINT32) => Some((TDType::U32, |v| (v as u32).to_le_bytes().to_vec())),
        Some(UINT64) => Some((TDType::U64, |v| (v as u64).to_le_bytes().to_vec())),
        _ => None,
    };
    match narrow {
        Some((dtype, bytes)) if t.dtype() == DType::I64 => {
            let e = |e: candle_core::Error| crate::error::candle_message(&e);
            let v = t
                .contiguous()
                .map_err(e)?
                .flatten_all()
                .map_err(e)?
                .to_vec1::<i64>()
                .map_err(e)?;
            let data: Vec<u8> = v.into_iter().flat_map(bytes).collect();
            Ok(OutTensor::new(name, dtype, t.dims().to_vec(), move || {
                Ok(Cow::Owned(data.clone()))
            }))
        }
        _ => out_tensor(name, t, declared == Some(BOOL)),
    }
}

/// A runtime output as an [`OutTensor`] for torchport's writers: the element type numpy can
/// hold (bfloat16 becomes float32, exactly; u8 tensors flagged `bool` become numpy bool).
pub fn out_tensor(name: String, t: &Tensor, bool_: bool) -> Result<OutTensor<'static>, String> {
    let e = |e: candle_core::Error| crate::error::candle_message(&e);
    let flat = t.contiguous().map_err(e)?.flatten_all().map_err(e)?;
    fn le<T: Copy, const N: usize>(v: Vec<T>, f: fn(T) -> [u8; N]) -> Vec<u8> {
        v.into_iter().flat_map(f).collect()
    }
    let (dtype, data) = match t.dtype() {
        DType::F32 => (
            TDType::F32,
            le(flat.to_vec1::<f32>().map_err(e)?, f32::to_le_bytes),
        ),
        DType::F64 => (
            TDType::F64,
            le(flat.to_vec1::<f64>().map_err(e)?, f64::to_le_bytes),
        ),
        DType::F16 => (
            TDType::F16,
            le(
                flat.to_vec1::<half::f16>().map_err(e)?,
                half::f16::to_le_bytes,
            ),
        ),
        DType::BF16 => {
            let f = flat
                .to_dtype(DType::F32)
                .map_err(e)?
                .to_vec1::<f32>()
                .map_err(e)?;
            (TDType::F32, le(f, f32::to_le_bytes))
        }
        DType::I64 => (
            TDType::I64,
            le(flat.to_vec1::<i64>().map_err(e)?, i64::to_le_bytes),
        ),
        DType::I32 => (
            TDType::I32,
            le(flat.to_vec1::<i32>().map_err(e)?, i32::to_le_bytes),
        ),
        DType::U8 => (
            if bool_ { TDType::Bool } else { TDType::U8 },
            flat.to_vec1::<u8>().map_err(e)?,
        ),
        d => return Err(format!("cannot write a {d:?} tensor to .npz")),
    };
    let data = std::sync::Arc::new(data);
    Ok(OutTensor::new(name, dtype, t.dims().to_vec(), move || {
        Ok(Cow::Owned(data.as_ref().clone()))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_are_narrowed_to_their_declared_integer_dtype() {
        let t = Tensor::from_vec(vec![300i64, -1, 127], 3, &candle_core::Device::Cpu).unwrap();
        let o = out_tensor_as("x".into(), &t, Some(crate::dtype::CHAR)).unwrap();
        assert_eq!(o.dtype, TDType::I8);
        // As torch converts int64 to int8: two's-complement wrapping.
        assert_eq!(&o.data().unwrap()[..], &[44u8, 255, 127]);
        let o = out_tensor_as("x".into(), &t, Some(crate::dtype::SHORT)).unwrap();
        assert_eq!(o.dtype, TDType::I16);
        assert_eq!(&o.data().unwrap()[..], &[44u8, 1, 255, 255, 127, 0]);
        let o = out_tensor_as("x".into(), &t, Some(crate::dtype::LONG)).unwrap();
        assert_eq!(o.dtype, TDType::I64);
    }
}
