//! numpy I/O for `torchport run` and the tests, through torchport's own numpy reader
//! (`torchport::open`) and writers (`torchport::write`).

use std::borrow::Cow;
use std::path::Path;

use candle_core::{DType, Tensor};
use torchport::{DType as TDType, OutTensor};

/// Read a `.npy` file (through torchport's numpy reader) into a runtime tensor: floats as f32,
/// integers as i64, bool as u8 0/1.
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

/// A runtime output as an [`OutTensor`] for torchport's writers: the element type numpy can
/// hold (bfloat16 becomes float32, exactly; u8 tensors flagged `bool` become numpy bool).
pub fn out_tensor(name: String, t: &Tensor, bool_: bool) -> Result<OutTensor<'static>, String> {
    let e = |e: candle_core::Error| e.to_string();
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
