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
    transpose_tile::<false>(src, rows, cols, dst, Lanes::plain(rows));
}

/// A source tile: values, the first value's index, the row stride.
pub(super) type Strided<'a> = (&'a [f32], usize, usize);
/// A destination tile: values, the first value's index, the row stride.
pub(super) type StridedMut<'a> = (&'a mut [MaybeUninit<f32>], usize, usize);

/// What a tile's destination rows hold besides the transposed values: each written
/// `wide` values wide (at least the tile's `rows`, at most [`SIDE`]), those past `rows` zero
/// (a packed panel's padding rows); with `scale`, the value from source row `r` multiplied
/// by `scale[r]` in f64 and rounded to f32, as [`crate::prepare::bn_scaled`] computes it (a
/// batch norm's fold into the weight it is packed from).
#[derive(Clone, Copy)]
pub(super) struct Lanes<'a> {
    pub wide: usize,
    pub scale: Option<&'a [f64]>,
}

impl Lanes<'_> {
    /// The tile's values as they are, nothing written past its `rows`.
    pub fn plain(rows: usize) -> Lanes<'static> {
        Lanes {
            wide: rows,
            scale: None,
        }
    }
}

/// [`transpose_into`], each destination row written as `lanes` says; with `STREAM`, where
/// the AVX-512 path writes a whole destination row (16 values) to a 64-byte aligned address,
/// by a non-temporal store (past the caches: `super::stream`, whose caller fences them).
/// A tile of no rows writes zeros.
pub(super) fn transpose_tile<const STREAM: bool>(
    (src, src_at, src_stride): Strided,
    rows: usize,
    cols: usize,
    (dst, dst_at, dst_stride): StridedMut,
    lanes: Lanes,
) {
    let wide = lanes.wide;
    assert!(
        rows <= wide && wide <= SIDE && cols <= SIDE,
        "a tile of {rows} x {cols} written {wide} wide"
    );
    assert!(
        lanes.scale.is_none_or(|s| s.len() >= rows),
        "a tile of {rows} rows with fewer scales"
    );
    if wide == 0 || cols == 0 {
        return;
    }
    let last = |at: usize, stride: usize, lines: usize, len: usize| {
        (lines - 1)
            .checked_mul(stride)
            .and_then(|v| v.checked_add(at))
            .and_then(|v| v.checked_add(len))
    };
    assert!(
        rows == 0 || last(src_at, src_stride, rows, cols).is_some_and(|e| e <= src.len()),
        "the tile's source lies outside its slice"
    );
    assert!(
        last(dst_at, dst_stride, cols, wide).is_some_and(|e| e <= dst.len()),
        "the tile's destination lies outside its slice"
    );
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F was just found; the asserts above put every row of the source
        // (`cols` values from `src_at + r * src_stride`, none read when `rows` is 0) and of
        // the destination (`wide` values from `dst_at + c * dst_stride`) inside its slice,
        // `scale` holds `rows` values, and the masks touch no more than those.
        #[allow(unsafe_code)]
        unsafe {
            let src = match rows {
                0 => src.as_ptr(),
                _ => src.as_ptr().add(src_at),
            };
            let scale = lanes.scale.map_or(std::ptr::null(), <[f64]>::as_ptr);
            transpose_avx512::<STREAM>(
                (src, src_stride, rows, cols),
                (dst.as_mut_ptr().add(dst_at).cast::<f32>(), dst_stride, wide),
                scale,
            )
        };
        return;
    }
    for r in 0..wide {
        for c in 0..cols {
            let v = match (r < rows, lanes.scale) {
                (false, _) => 0.0,
                (true, None) => src[src_at + r * src_stride + c],
                (true, Some(s)) => {
                    crate::prepare::bn_scaled(src[src_at + r * src_stride + c], s[r])
                }
            };
            dst[dst_at + c * dst_stride + r].write(v);
        }
    }
}

/// [`transpose_tile`] from raw pointers: the source's first value, row stride, rows and
/// columns; the destination's first value, row stride and width; the rows' scales or null.
///
/// # Safety
/// AVX-512F; `rows <= wide <= 16`, `cols <= 16`; `src + r * src_stride` holds `cols`
/// readable values for every `r < rows`, `dst + c * dst_stride` holds `wide` writable ones
/// for every `c < cols`, `scale` is null or holds `rows` readable values, and the source
/// and destination do not overlap. With `STREAM`, the caller fences before the values are
/// read (`_mm_sfence`, on this thread).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(unsafe_code)]
unsafe fn transpose_avx512<const STREAM: bool>(
    (src, src_stride, rows, cols): (*const f32, usize, usize, usize),
    (dst, dst_stride, wide): (*mut f32, usize, usize),
    scale: *const f64,
) {
    use std::arch::x86_64::*;
    align_frame();
    let load: __mmask16 = ((1u32 << cols) - 1) as u16;
    let store: __mmask16 = ((1u32 << wide) - 1) as u16;
    // Loops of constant length (a condition inside), so that the rows stay in registers.
    // The rows past `rows` stay zero: after the transpose, the lanes past `rows`.
    let mut t = [_mm512_setzero_ps(); SIDE];
    for (r, t) in t.iter_mut().enumerate() {
        if r < rows {
            *t = _mm512_maskz_loadu_ps(load, src.add(r * src_stride));
        }
    }
    transpose16(&mut t);
    if !scale.is_null() {
        // Lane `r` times `scale[r]`: widened to f64 in two halves, multiplied, rounded back
        // (to nearest, as `as f32` rounds). The lanes past `rows` are 0 times 0.
        let m = (1u32 << rows) - 1;
        let lo = _mm512_maskz_loadu_pd(m as u8, scale);
        let hi = _mm512_maskz_loadu_pd((m >> 8) as u8, scale.add(8.min(rows)));
        for (c, t) in t.iter_mut().enumerate() {
            if c < cols {
                let v = _mm512_castps_pd(*t);
                let (a, b) = (
                    _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_castpd512_pd256(v))),
                    _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(v))),
                );
                let (a, b) = (
                    _mm512_cvtpd_ps(_mm512_mul_pd(a, lo)),
                    _mm512_cvtpd_ps(_mm512_mul_pd(b, hi)),
                );
                let ab = _mm512_insertf64x4::<1>(
                    _mm512_castpd256_pd512(_mm256_castps_pd(a)),
                    _mm256_castps_pd(b),
                );
                *t = _mm512_castpd_ps(ab);
            }
        }
    }
    // Streamed where every row of the tile is a whole aligned line.
    let aligned = (dst as usize).is_multiple_of(64) && dst_stride.is_multiple_of(SIDE);
    let stream = STREAM && wide == SIDE && aligned;
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

/// Gives the function it is inlined into a stack frame aligned to 64 bytes, so that the
/// AVX-512 registers it spills there each fill one cache line. Without it, such a function's
/// spill slots were only as aligned as its callers' frames left them (16 bytes): a 64-byte
/// spill then straddled two lines, and which callers did that changed from build to build:
/// a change that only moved the program's parse to another thread made ResNet-50's loads on
/// one thread 30.2–32.4 ms against 25.1–27.9 (`transpose_avx512`, packing the weights, 1.8x
/// the samples), and 26.1–27.0 with this (BENCHMARKS.md, issue 14).
#[inline(always)]
pub(crate) fn align_frame() {
    /// One cache line's worth of bytes, aligned as one.
    #[repr(align(64))]
    struct Line(#[allow(dead_code)] [u8; 64]);
    // A local (not a promoted constant), opaque to the optimiser: it stays in the frame,
    // which is then aligned for it.
    let line = Line([0; 64]);
    std::hint::black_box(&line);
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

    /// Tiles written wider than their rows (zeros past them) and scaled by row, plain and
    /// streamed, against the definition; a tile of no rows writes only zeros.
    #[test]
    fn tiles_written_wide_and_scaled_by_row() {
        let src: Vec<f32> = (0..40 * 37).map(|v| v as f32 * 0.37 - 9.0).collect();
        let scale: Vec<f64> = (0..SIDE).map(|r| 0.1 + r as f64 / 3.0).collect();
        for rows in 0..=SIDE {
            for cols in [1, 5, 16] {
                for wide in [rows, rows.next_multiple_of(4).min(SIDE), SIDE] {
                    for scale in [None, Some(&scale[..rows])] {
                        let (src_at, src_stride, dst_at, dst_stride) = (2 * 37 + 3, 37, 16, 32);
                        let mut want = vec![-1f32; 32 * 18];
                        for r in 0..wide {
                            for c in 0..cols {
                                want[dst_at + c * dst_stride + r] = match (r < rows, scale) {
                                    (false, _) => 0.0,
                                    (true, s) => {
                                        let v = src[src_at + r * src_stride + c];
                                        s.map_or(v, |s| crate::prepare::bn_scaled(v, s[r]))
                                    }
                                };
                            }
                        }
                        let lanes = Lanes { wide, scale };
                        let tile = (&src[..], src_at, src_stride);
                        let mut plain = vec![-1f32; want.len()];
                        let dst = (
                            super::super::fused::as_uninit(&mut plain),
                            dst_at,
                            dst_stride,
                        );
                        transpose_tile::<false>(tile, rows, cols, dst, lanes);
                        // From a 64-byte boundary, so that whole rows are streamed.
                        let mut buf = vec![-1f32; want.len() + 16];
                        let lead = (buf.as_ptr() as usize).wrapping_neg() % 64 / 4;
                        let streamed = &mut buf[lead..lead + want.len()];
                        let dst = super::super::fused::as_uninit(streamed);
                        super::super::stream::streamed(|s| {
                            s.transpose_into(tile, rows, cols, (dst, dst_at, dst_stride), lanes)
                        });
                        for got in [&plain[..], &*streamed] {
                            let same = got
                                .iter()
                                .zip(&want)
                                .all(|(a, b)| a.to_bits() == b.to_bits());
                            assert!(same, "{rows} x {cols} written {wide} wide, {scale:?}");
                        }
                    }
                }
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
