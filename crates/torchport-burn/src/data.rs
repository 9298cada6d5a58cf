//! Turning one planned tensor into Burn `TensorData`: read the checkpoint bytes (borrowed from
//! the memory map), take the gate/projection block, transpose — in one copy — and label the
//! bytes with Burn's dtype. Dtypes Burn has no element for (float8) are decoded to f32.

use std::sync::Arc;

use burn::tensor::{BoolStore, DType as BurnDType, TensorData};
use torchport::{Checkpoint, DType};

use crate::plan::Planned;

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

/// Copy a row-major `rows x cols` matrix of `N`-byte elements into its transpose, in tiles so
/// both sides stay in cache.
fn transpose_n<const N: usize>(src: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    const TILE: usize = 32;
    let mut out = vec![0u8; src.len()];
    for r0 in (0..rows).step_by(TILE) {
        let r1 = (r0 + TILE).min(rows);
        for c0 in (0..cols).step_by(TILE) {
            let c1 = (c0 + TILE).min(cols);
            for r in r0..r1 {
                let row = &src[r * cols * N..(r + 1) * cols * N];
                for c in c0..c1 {
                    let d = (c * rows + r) * N;
                    out[d..d + N].copy_from_slice(&row[c * N..(c + 1) * N]);
                }
            }
        }
    }
    out
}

/// float32 values of little-endian bytes, transposed (`rows x cols` -> `cols x rows`) when
/// `dims` is given — one pass, straight into the vector Burn keeps.
fn f32s(src: &[u8], dims: Option<(usize, usize)>) -> Vec<f32> {
    let word = |c: &[u8]| f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    let Some((rows, cols)) = dims else {
        return src.chunks_exact(4).map(word).collect();
    };
    const TILE: usize = 32;
    let mut out = vec![0f32; rows * cols];
    for r0 in (0..rows).step_by(TILE) {
        let r1 = (r0 + TILE).min(rows);
        for c0 in (0..cols).step_by(TILE) {
            let c1 = (c0 + TILE).min(cols);
            for r in r0..r1 {
                let row = &src[r * cols * 4..(r + 1) * cols * 4];
                for c in c0..c1 {
                    out[c * rows + r] = word(&row[c * 4..c * 4 + 4]);
                }
            }
        }
    }
    out
}

/// The transpose of a row-major `rows x cols` matrix of `esize`-byte elements.
pub(crate) fn transpose(src: &[u8], rows: usize, cols: usize, esize: usize) -> Vec<u8> {
    match esize {
        1 => transpose_n::<1>(src, rows, cols),
        2 => transpose_n::<2>(src, rows, cols),
        4 => transpose_n::<4>(src, rows, cols),
        8 => transpose_n::<8>(src, rows, cols),
        16 => transpose_n::<16>(src, rows, cols),
        _ => src.to_vec(),
    }
}

/// Produce the data for one planned parameter. The plan already checked kind and shape.
pub(crate) fn produce(ckpt: &Arc<Checkpoint>, p: &Planned) -> Result<TensorData, String> {
    let info = ckpt
        .tensors()
        .get(p.tensor)
        .ok_or_else(|| format!("tensor #{} vanished from the checkpoint", p.tensor))?;
    let bytes = ckpt.data(info).map_err(|e| e.to_string())?;
    let esize = info.dtype.size();
    let mut shape = info.shape.clone();
    let mut range = 0..bytes.len();
    if let Some(part) = p.recipe.part {
        let rows = shape.first().copied().unwrap_or(0) / part.count.max(1);
        let row_bytes: usize = shape.iter().skip(1).product::<usize>() * esize;
        let start = part.index * rows * row_bytes;
        range = start..start + rows * row_bytes;
        if let Some(r) = shape.first_mut() {
            *r = rows;
        }
    }
    let block = bytes
        .get(range)
        .ok_or_else(|| format!("{} is shorter than its shape says", info.name))?;
    let flip = p.recipe.transpose && shape.len() == 2;
    if info.dtype == DType::F32 {
        let dims = flip.then(|| (shape[0], shape[1]));
        if flip {
            shape.swap(0, 1);
        }
        return Ok(TensorData::new(f32s(block, dims), shape));
    }
    let mut out = if flip {
        let v = transpose(block, shape[0], shape[1], esize);
        shape.swap(0, 1);
        v
    } else {
        block.to_vec()
    };
    let dtype = match burn_dtype(info.dtype) {
        Some(d) => d,
        None => {
            // float8 and friends: decode exactly to f64, then round to f32.
            let values = torchport::cast::to_f64(info.dtype, &out).map_err(|e| e.to_string())?;
            out = values
                .iter()
                .flat_map(|&v| (v as f32).to_le_bytes())
                .collect();
            BurnDType::F32
        }
    };
    TensorData::try_from_bytes_vec(out, shape, dtype).map_err(|e| format!("{e:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposes_every_width() {
        // 2x3 matrix 0..6 of u16 -> 3x2
        let src: Vec<u8> = (0u16..6).flat_map(|v| v.to_le_bytes()).collect();
        let t = transpose(&src, 2, 3, 2);
        let got: Vec<u16> = t
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(got, [0, 3, 1, 4, 2, 5]);
        // 40x70 f32 (several tiles, ragged edges)
        let (r, c) = (40, 70);
        let src: Vec<u8> = (0..r * c).flat_map(|v| (v as f32).to_le_bytes()).collect();
        let t = transpose(&src, r, c, 4);
        let at =
            |i: usize| f32::from_le_bytes([t[4 * i], t[4 * i + 1], t[4 * i + 2], t[4 * i + 3]]);
        assert_eq!(at(0), 0.0);
        assert_eq!(at(1), c as f32); // [0][1] of the transpose is [1][0] of the source
        assert_eq!(at(r * c - 1), (r * c - 1) as f32);
        assert_eq!(at(5 * r + 7), (7 * c + 5) as f32);
        // The typed f32 path agrees with the byte path.
        let typed = f32s(&src, Some((r, c)));
        assert!(typed.iter().enumerate().all(|(i, &v)| v == at(i)));
        assert_eq!(f32s(&src, None)[c + 1], (c + 1) as f32);
    }
}
