//! The byte kernels behind the rules: take a piece along a dim, concatenate along a dim,
//! permute dims. They work on contiguous little-endian row-major bytes of any dtype (only
//! the element size matters) and never look at the values.
//!
//! Memory: a piece along dim 0 (or along any dim whose outer dims are all 1) is a sub-slice
//! of the source and is borrowed when the source is (zero copy from a memory-mapped file);
//! every other result is one new buffer the size of the output.

use std::borrow::Cow;

/// The element ranges of a row-major shape around `dim`: (outer count, dim length, inner
/// element count).
fn around(shape: &[usize], dim: usize) -> (usize, usize, usize) {
    let outer = shape[..dim].iter().product();
    let inner = shape[dim + 1..].iter().product();
    (outer, shape[dim], inner)
}

/// The piece `start..start + len` along `dim` of `data` (shape `shape`, `esize`-byte elements).
/// Callers have checked that the range lies inside the dim.
pub(crate) fn piece<'a>(
    data: Cow<'a, [u8]>,
    shape: &[usize],
    esize: usize,
    dim: usize,
    start: usize,
    len: usize,
) -> Cow<'a, [u8]> {
    let (outer, d, inner) = around(shape, dim);
    let row = inner * esize;
    if outer == 1 {
        let range = start * row..(start + len) * row;
        return match data {
            Cow::Borrowed(b) => Cow::Borrowed(&b[range]),
            Cow::Owned(v) => Cow::Owned(v[range].to_vec()),
        };
    }
    let mut out = Vec::with_capacity(outer * len * row);
    for o in 0..outer {
        let base = (o * d + start) * row;
        out.extend_from_slice(&data[base..base + len * row]);
    }
    Cow::Owned(out)
}

/// Concatenate `parts` (shapes `shapes`, equal except along `dim`) along `dim`.
pub(crate) fn concat(
    parts: &[Cow<'_, [u8]>],
    shapes: &[Vec<usize>],
    esize: usize,
    dim: usize,
) -> Vec<u8> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut out = Vec::with_capacity(total);
    let Some(first) = shapes.first() else {
        return out;
    };
    let (outer, _, inner) = around(first, dim);
    let row = inner * esize;
    for o in 0..outer {
        for (p, s) in parts.iter().zip(shapes) {
            let d = s[dim];
            out.extend_from_slice(&p[o * d * row..(o + 1) * d * row]);
        }
    }
    out
}

/// Transpose `batches` row-major `rows` x `cols` matrices of `N`-byte elements, in tiles
/// so that both the reads and the writes stay in cache.
fn transpose_tiled<const N: usize>(
    data: &[u8],
    batches: usize,
    rows: usize,
    cols: usize,
) -> Vec<u8> {
    const TILE: usize = 32;
    let mut out = vec![0u8; data.len()];
    let plane = rows * cols * N;
    for b in 0..batches {
        let (src, dst) = (
            &data[b * plane..(b + 1) * plane],
            &mut out[b * plane..(b + 1) * plane],
        );
        for r0 in (0..rows).step_by(TILE) {
            for c0 in (0..cols).step_by(TILE) {
                for r in r0..(r0 + TILE).min(rows) {
                    for c in c0..(c0 + TILE).min(cols) {
                        let (i, o) = ((r * cols + c) * N, (c * rows + r) * N);
                        dst[o..o + N].copy_from_slice(&src[i..i + N]);
                    }
                }
            }
        }
    }
    out
}

/// Permute the dims of `data`: output dim `i` is input dim `perm[i]`.
pub(crate) fn permute(data: &[u8], shape: &[usize], perm: &[usize], esize: usize) -> Vec<u8> {
    let n = shape.len();
    let numel: usize = shape.iter().product();
    // The common case, a (batched) matrix transpose: the last two dims swap.
    if n >= 2
        && numel > 0
        && perm[..n - 2].iter().enumerate().all(|(i, &p)| i == p)
        && perm[n - 2] == n - 1
    {
        let (rows, cols) = (shape[n - 2], shape[n - 1]);
        let batches = numel / (rows * cols);
        match esize {
            1 => return transpose_tiled::<1>(data, batches, rows, cols),
            2 => return transpose_tiled::<2>(data, batches, rows, cols),
            4 => return transpose_tiled::<4>(data, batches, rows, cols),
            8 => return transpose_tiled::<8>(data, batches, rows, cols),
            16 => return transpose_tiled::<16>(data, batches, rows, cols),
            _ => {}
        }
    }
    let mut out = Vec::with_capacity(numel * esize);
    if numel == 0 {
        return out;
    }
    if n == 0 {
        out.extend_from_slice(data);
        return out;
    }
    // Strides of the input, in elements, and the output shape.
    let mut in_strides = vec![1usize; n];
    for i in (0..n.saturating_sub(1)).rev() {
        in_strides[i] = in_strides[i + 1] * shape[i + 1];
    }
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let strides: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
    let last = n - 1;
    let (inner_len, inner_stride) = (out_shape[last], strides[last]);
    let mut index = vec![0usize; n];
    let mut offset = 0usize; // element offset in the input of `index` (with index[last] = 0)
    loop {
        if inner_stride == 1 {
            out.extend_from_slice(&data[offset * esize..(offset + inner_len) * esize]);
        } else {
            for k in 0..inner_len {
                let at = (offset + k * inner_stride) * esize;
                out.extend_from_slice(&data[at..at + esize]);
            }
        }
        // Advance the odometer over every dim but the last.
        let mut d = last;
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            index[d] += 1;
            offset += strides[d];
            if index[d] < out_shape[d] {
                break;
            }
            offset -= strides[d] * out_shape[d];
            index[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(v: &[u8]) -> Cow<'_, [u8]> {
        Cow::Borrowed(v)
    }

    #[test]
    fn pieces_borrow_along_dim0_and_copy_inside() {
        let data: Vec<u8> = (0..12).collect(); // shape [4, 3], 1-byte elements
        let p = piece(bytes(&data), &[4, 3], 1, 0, 1, 2);
        assert!(matches!(p, Cow::Borrowed(_)));
        assert_eq!(&p[..], &[3, 4, 5, 6, 7, 8]);
        let p = piece(bytes(&data), &[4, 3], 1, 1, 1, 2);
        assert_eq!(&p[..], &[1, 2, 4, 5, 7, 8, 10, 11]);
    }

    #[test]
    fn concat_inner_dim() {
        let a: Vec<u8> = vec![0, 1, 2, 3]; // [2, 2]
        let b: Vec<u8> = vec![9, 8]; // [2, 1]
        let out = concat(&[bytes(&a), bytes(&b)], &[vec![2, 2], vec![2, 1]], 1, 1);
        assert_eq!(out, [0, 1, 9, 2, 3, 8]);
    }

    #[test]
    fn permute_3d() {
        let data: Vec<u8> = (0..24).collect(); // [2, 3, 4]
        let out = permute(&data, &[2, 3, 4], &[2, 0, 1], 1); // -> [4, 2, 3]
                                                             // out[k][i][j] = in[i][j][k] = 12 i + 4 j + k
        for k in 0..4 {
            for i in 0..2 {
                for j in 0..3 {
                    assert_eq!(out[k * 6 + i * 3 + j] as usize, 12 * i + 4 * j + k);
                }
            }
        }
        assert_eq!(permute(&data, &[24], &[0], 1), data);
        // Batched transpose (tiled path) of 2-byte elements: [2, 6, 2] -> [2, 2, 6].
        let data: Vec<u8> = (0..48).collect();
        let out = permute(&data, &[2, 6, 2], &[0, 2, 1], 2);
        for b in 0..2 {
            for r in 0..6 {
                for c in 0..2 {
                    let i = ((b * 6 + r) * 2 + c) * 2;
                    let o = ((b * 2 + c) * 6 + r) * 2;
                    assert_eq!(out[o..o + 2], data[i..i + 2]);
                }
            }
        }
    }

    #[test]
    fn tiled_transpose_matches_the_odometer() {
        let (rows, cols) = (37, 70);
        let data: Vec<u8> = (0..rows * cols * 4).map(|i| (i * 7 % 251) as u8).collect();
        let tiled = permute(&data, &[rows, cols], &[1, 0], 4);
        let mut slow = Vec::new();
        for c in 0..cols {
            for r in 0..rows {
                let i = (r * cols + c) * 4;
                slow.extend_from_slice(&data[i..i + 4]);
            }
        }
        assert_eq!(tiled, slow);
    }
}
