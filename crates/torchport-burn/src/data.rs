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

/// Told about each stretch of the source once it has been copied (so its memory-mapped pages
/// can be released while the rest is still being copied).
pub(crate) type Done<'r> = &'r dyn Fn(&[u8]);

/// Bytes copied between two calls of [`Done`] (rounded to whole rows for a transpose).
const STRETCH: usize = 4 << 20;

/// float32 values of little-endian bytes; with `transpose`, the `rows x cols` matrix comes
/// out as `cols x rows`. One pass, straight into the vector Burn keeps (the one copy out of
/// the memory map), a stretch of source rows at a time, `done` told about each. Large
/// transposes are shared among the machine's cores, each writing its own band of output rows.
fn f32s(src: &[u8], transpose: Option<(usize, usize)>, done: Done<'_>) -> Vec<f32> {
    let Some((rows, cols)) = transpose else {
        let mut out = Vec::with_capacity(src.len() / 4);
        for part in src.chunks(STRETCH) {
            out.extend(part.chunks_exact(4).map(word));
            done(part);
        }
        return out;
    };
    let mut out = vec![0f32; rows * cols];
    if rows == 0 || cols == 0 {
        return out;
    }
    let threads = if rows * cols >= PARALLEL_ELEMS {
        std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
    } else {
        1
    };
    // Output rows (source columns) per thread, a whole number of bands.
    let per = cols.div_ceil(threads).div_ceil(BAND) * BAND;
    // Source rows per stretch, a whole number of tiles.
    let stretch = (STRETCH / (cols * 4)).div_ceil(BAND).max(1) * BAND;
    for r0 in (0..rows).step_by(stretch) {
        let rs = r0..(r0 + stretch).min(rows);
        std::thread::scope(|s| {
            for (i, chunk) in out.chunks_mut(per * rows).enumerate() {
                let (c0, rs) = (i * per, rs.clone());
                if i + 1 == threads || chunk.len() < per * rows {
                    transpose_into(src, rows, cols, c0, rs, chunk);
                } else {
                    s.spawn(move || transpose_into(src, rows, cols, c0, rs, chunk));
                }
            }
        });
        done(&src[rs.start * cols * 4..rs.end * cols * 4]);
    }
    out
}

/// `src` as an owned vector, copied a stretch at a time, `done` told about each.
fn copied(src: &[u8], done: Done<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(src.len());
    for part in src.chunks(STRETCH) {
        out.extend_from_slice(part);
        done(part);
    }
    out
}

/// Matrices this large (in elements) are transposed on several threads.
const PARALLEL_ELEMS: usize = 1 << 20;
/// Output rows per thread are a multiple of this (whole tiles).
const BAND: usize = 64;
/// The register tile: 8 x 8 elements read as 8 row pieces, written as 8 row pieces.
const B: usize = 8;

fn word(c: &[u8]) -> f32 {
    f32::from_le_bytes([c[0], c[1], c[2], c[3]])
}

/// Fill columns `rs` of `out` — output rows `c0..c0 + out.len() / rows` of the transpose of
/// the row-major `rows x cols` float32 matrix `src`, from its rows `rs` — in 64 x 64 cache
/// tiles of 8 x 8 register tiles (`rs.start` is a multiple of 64).
fn transpose_into(
    src: &[u8],
    rows: usize,
    cols: usize,
    c0: usize,
    rs: std::ops::Range<usize>,
    out: &mut [f32],
) {
    let n = out.len() / rows;
    for r0 in rs.clone().step_by(BAND) {
        let r1 = (r0 + BAND).min(rs.end);
        for k0 in (0..n).step_by(BAND) {
            let k1 = (k0 + BAND).min(n);
            for rb in (r0..r1).step_by(B) {
                for kb in (k0..k1).step_by(B) {
                    if rb + B <= r1 && kb + B <= k1 {
                        let mut t = [[0f32; B]; B];
                        for (i, ti) in (rb..rb + B).zip(0..B) {
                            let at = (i * cols + c0 + kb) * 4;
                            for (j, w) in src[at..at + 4 * B].chunks_exact(4).enumerate() {
                                t[j][ti] = word(w);
                            }
                        }
                        for (j, tj) in t.iter().enumerate() {
                            let at = (kb + j) * rows + rb;
                            out[at..at + B].copy_from_slice(tj);
                        }
                    } else {
                        for i in rb..(rb + B).min(r1) {
                            for k in kb..(kb + B).min(k1) {
                                let at = (i * cols + c0 + k) * 4;
                                out[k * rows + i] = word(&src[at..at + 4]);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `bytes` (little-endian, row-major, `dtype` elements of `shape`) as Burn data; with
/// `transpose` (float32 2-D only) the matrix is transposed in the same copy. Borrowed bytes
/// are copied a stretch at a time, and `done` is told about each stretch once copied.
pub(crate) fn tensor_data(
    dtype: DType,
    mut shape: Vec<usize>,
    bytes: Cow<'_, [u8]>,
    transpose: bool,
    done: Done<'_>,
) -> Result<TensorData, String> {
    if dtype == DType::F32 {
        let dims = match (transpose, shape.as_slice()) {
            (false, _) => None,
            (true, &[r, c]) => Some((r, c)),
            (true, _) => return Err(format!("cannot transpose a tensor of shape {shape:?}")),
        };
        let v = f32s(&bytes, dims, done);
        if transpose {
            shape.swap(0, 1);
        }
        return Ok(TensorData::new(v, shape));
    }
    if transpose {
        return Err(format!(
            "{dtype} tensors are transposed by remap rules, not here"
        ));
    }
    match burn_dtype(dtype) {
        Some(d) => {
            let owned = match bytes {
                Cow::Borrowed(b) => copied(b, done),
                Cow::Owned(v) => v,
            };
            TensorData::try_from_bytes_vec(owned, shape, d).map_err(|e| format!("{e:?}"))
        }
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
        let d = tensor_data(DType::F32, vec![2], Cow::Borrowed(&bytes), false, &|_| {}).unwrap();
        assert_eq!(d.iter::<f32>().collect::<Vec<_>>(), [1.5, -2.0]);
        let h = half::f16::from_f32(0.25).to_le_bytes().to_vec();
        let d = tensor_data(DType::F16, vec![1], Cow::Owned(h), false, &|_| {}).unwrap();
        assert_eq!(d.dtype(), BurnDType::F16);
        // float8 e4m3fn 0x38 = 1.0, 0xc0 = -2.0
        let d = tensor_data(
            DType::F8E4M3Fn,
            vec![2],
            Cow::Owned(vec![0x38, 0xc0]),
            false,
            &|_| {},
        )
        .unwrap();
        assert_eq!(d.iter::<f32>().collect::<Vec<_>>(), [1.0, -2.0]);
    }

    #[test]
    fn large_transposes_use_threads_and_agree() {
        // Above the threshold, odd sizes so bands and thread chunks have ragged ends.
        let (r, c) = (1031, 1029);
        let src: Vec<u8> = (0..r * c).flat_map(|v| (v as f32).to_le_bytes()).collect();
        let seen = std::cell::Cell::new(0);
        let v = f32s(&src, Some((r, c)), &|b| seen.set(seen.get() + b.len()));
        // Two stretches of rows (1024 and 7), each reported once copied.
        assert_eq!(seen.get(), src.len());
        for (ci, ri) in [(0, 0), (1028, 1030), (517, 3), (16, 1000), (1000, 16)] {
            assert_eq!(v[ci * r + ri], (ri * c + ci) as f32, "[{ci}][{ri}]");
        }
        assert!(v
            .iter()
            .enumerate()
            .all(|(i, &x)| x == ((i % r) * c + i / r) as f32));
    }

    #[test]
    fn transposes_in_the_copy() {
        // 40 x 70 (several tiles, ragged edges): out[c][r] = in[r][c] = r * 70 + c.
        let (r, c) = (40, 70);
        let src: Vec<u8> = (0..r * c).flat_map(|v| (v as f32).to_le_bytes()).collect();
        let d = tensor_data(DType::F32, vec![r, c], Cow::Borrowed(&src), true, &|_| {}).unwrap();
        assert_eq!(d.shape().iter().copied().collect::<Vec<_>>(), [c, r]);
        let v: Vec<f32> = d.iter::<f32>().collect();
        for (ci, ri) in [(0, 0), (1, 0), (0, 1), (69, 39), (5, 7), (33, 32)] {
            assert_eq!(v[ci * r + ri], (ri * c + ci) as f32, "[{ci}][{ri}]");
        }
        assert!(tensor_data(
            DType::F32,
            vec![2, 2, 2],
            Cow::Borrowed(&src[..32]),
            true,
            &|_| {}
        )
        .is_err());
    }
}
