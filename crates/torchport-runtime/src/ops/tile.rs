//! Transposing tiles of at most 16 x 16 f32 values between two strided matrices: by AVX-512
//! registers where the CPU has it (16 masked row loads, the tile transposed in registers, 16
//! masked row stores), else one value at a time. Used where a kernel or a load changes a
//! matrix's layout: the panels a packed weight is stored in, the planes of a convolution
//! computed channels-last, a depthwise convolution's channels-innermost blocks.

use std::mem::MaybeUninit;

/// The side of a tile.
pub(crate) const SIDE: usize = 16;

/// `dst[dst_at + c * dst_stride + r] = src[src_at + r * src_stride + c]` for `r < rows`
/// and `c < cols` (each at most [`SIDE`]). Panics if a value lies outside its slice.
#[allow(clippy::too_many_arguments)]
pub(crate) fn transpose(
    src: &[f32],
    src_at: usize,
    src_stride: usize,
    rows: usize,
    cols: usize,
    dst: &mut [f32],
    dst_at: usize,
    dst_stride: usize,
) {
    let dst = super::fused::as_uninit(dst);
    transpose_into(src, src_at, src_stride, rows, cols, dst, dst_at, dst_stride);
}

/// [`transpose`] into memory not yet initialised (a new buffer each of whose values some
/// tile writes once: no zeroing pass first).
#[allow(clippy::too_many_arguments)]
pub(crate) fn transpose_into(
    src: &[f32],
    src_at: usize,
    src_stride: usize,
    rows: usize,
    cols: usize,
    dst: &mut [MaybeUninit<f32>],
    dst_at: usize,
    dst_stride: usize,
) {
    let (src, dst) = ((src, src_at, src_stride), (dst, dst_at, dst_stride));
    transpose_tile::<false>(src, rows, cols, dst);
}

/// A source tile: values, the first value's index, the row stride.
pub(super) type Strided<'a> = (&'a [f32], usize, usize);
/// A destination tile: values, the first value's index, the row stride.
pub(super) type StridedMut<'a> = (&'a mut [MaybeUninit<f32>], usize, usize);

/// [`transpose_into`]; with `STREAM`, where the AVX-512 path writes a whole tile row
/// (16 values) to a 64-byte aligned address, by a non-temporal store (past the caches:
/// `super::stream`, whose caller fences them).
pub(super) fn transpose_tile<const STREAM: bool>(
    (src, src_at, src_stride): Strided,
    rows: usize,
    cols: usize,
    (dst, dst_at, dst_stride): StridedMut,
) {
    assert!(rows <= SIDE && cols <= SIDE, "a tile of {rows} x {cols}");
    if rows == 0 || cols == 0 {
        return;
    }
    let last = |at: usize, stride: usize, lines: usize, len: usize| {
        (lines - 1)
            .checked_mul(stride)
            .and_then(|v| v.checked_add(at))
            .and_then(|v| v.checked_add(len))
    };
    assert!(
        last(src_at, src_stride, rows, cols).is_some_and(|e| e <= src.len()),
        "the tile's source lies outside its slice"
    );
    assert!(
        last(dst_at, dst_stride, cols, rows).is_some_and(|e| e <= dst.len()),
        "the tile's destination lies outside its slice"
    );
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F was just found; the asserts above put every row of the source
        // (`cols` values from `src_at + r * src_stride`) and of the destination (`rows`
        // values from `dst_at + c * dst_stride`) inside its slice, and the masks touch no
        // more than those.
        #[allow(unsafe_code)]
        unsafe {
            transpose_avx512::<STREAM>(
                src.as_ptr().add(src_at),
                src_stride,
                rows,
                cols,
                dst.as_mut_ptr().add(dst_at).cast::<f32>(),
                dst_stride,
            )
        };
        return;
    }
    for r in 0..rows {
        for c in 0..cols {
            dst[dst_at + c * dst_stride + r].write(src[src_at + r * src_stride + c]);
        }
    }
}

/// [`transpose`] from raw pointers to the tile's first value in each matrix.
///
/// # Safety
/// AVX-512F; `rows, cols <= 16`; `src + r * src_stride` holds `cols` readable values for
/// every `r < rows`, `dst + c * dst_stride` holds `rows` writable ones for every `c < cols`,
/// and the two do not overlap. With `STREAM`, the caller fences before the values are read
/// (`_mm_sfence`, on this thread).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(unsafe_code)]
unsafe fn transpose_avx512<const STREAM: bool>(
    src: *const f32,
    src_stride: usize,
    rows: usize,
    cols: usize,
    dst: *mut f32,
    dst_stride: usize,
) {
    use std::arch::x86_64::*;
    let load: __mmask16 = ((1u32 << cols) - 1) as u16;
    let store: __mmask16 = ((1u32 << rows) - 1) as u16;
    // Loops of constant length (a condition inside), so that the rows stay in registers.
    let mut t = [_mm512_setzero_ps(); SIDE];
    for (r, t) in t.iter_mut().enumerate() {
        if r < rows {
            *t = _mm512_maskz_loadu_ps(load, src.add(r * src_stride));
        }
    }
    transpose16(&mut t);
    // Streamed where every row of the tile is a whole aligned line.
    let aligned = (dst as usize).is_multiple_of(64) && dst_stride.is_multiple_of(SIDE);
    let stream = STREAM && rows == SIDE && aligned;
    for (c, t) in t.iter().enumerate() {
        if c < cols {
            if stream {
                _mm512_stream_ps(dst.add(c * dst_stride), *t);
            } else {
                _mm512_mask_storeu_ps(dst.add(c * dst_stride), store, *t);
            }
        }
    }
}

/// Transposes a 16 x 16 matrix of floats held as 16 rows: pairs of rows interleaved, then
/// pairs of pairs, then 128-bit lanes exchanged twice.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) fn transpose16(r: &mut [std::arch::x86_64::__m512; 16]) {
    use std::arch::x86_64::*;
    let mut t = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    let pd = _mm512_castps_pd;
    for i in 0..4 {
        let (a, b, c, d) = (t[4 * i], t[4 * i + 1], t[4 * i + 2], t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(a), pd(c)));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(a), pd(c)));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(b), pd(d)));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(b), pd(d)));
    }
    for h in 0..2 {
        for i in 0..4 {
            let (a, b) = (r[8 * h + i], r[8 * h + 4 + i]);
            t[8 * h + i] = _mm512_shuffle_f32x4::<0x88>(a, b);
            t[8 * h + 4 + i] = _mm512_shuffle_f32x4::<0xdd>(a, b);
        }
    }
    for i in 0..8 {
        r[i] = _mm512_shuffle_f32x4::<0x88>(t[i], t[8 + i]);
        r[8 + i] = _mm512_shuffle_f32x4::<0xdd>(t[i], t[8 + i]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tile shape from 1 x 1 to 16 x 16, at offsets and strides inside larger
    /// matrices, against the definition; the values around each tile are left alone.
    #[test]
    fn tiles_are_transposed_in_place_of_their_matrices() {
        let src: Vec<f32> = (0..40 * 37).map(|v| v as f32).collect();
        for rows in 1..=SIDE {
            for cols in 1..=SIDE {
                let (src_at, src_stride, dst_at, dst_stride) = (3 * 37 + 5, 37, 7, 29);
                let mut dst = vec![-1f32; 29 * 20];
                transpose(
                    &src, src_at, src_stride, rows, cols, &mut dst, dst_at, dst_stride,
                );
                let mut want = vec![-1f32; 29 * 20];
                for r in 0..rows {
                    for c in 0..cols {
                        want[dst_at + c * dst_stride + r] = src[src_at + r * src_stride + c];
                    }
                }
                assert_eq!(dst, want, "{rows} x {cols}");
            }
        }
    }

    /// A tile reaching past either slice is refused before anything is read or written.
    #[test]
    fn tiles_outside_their_slices_panic() {
        let src = vec![0f32; 16 * 16];
        let mut dst = vec![0f32; 16 * 16];
        let outside = |f: &dyn Fn(&mut [f32])| {
            let mut d = dst.clone();
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut d))).is_err()
        };
        assert!(outside(&|d| transpose(&src, 1, 16, 16, 16, d, 0, 16)));
        assert!(outside(&|d| transpose(&src, 0, 16, 16, 16, d, 1, 16)));
        assert!(outside(&|d| transpose(&src, 0, 17, 16, 16, d, 0, 16)));
        assert!(outside(&|d| transpose(&src, 0, usize::MAX, 2, 1, d, 0, 16)));
        assert!(outside(&|d| transpose(&src, 0, 16, 17, 1, d, 0, 16)));
        transpose(&src, 0, 16, 16, 16, &mut dst, 0, 16);
    }
}
