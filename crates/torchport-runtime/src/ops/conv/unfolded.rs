//! A convolution's input unfolded into the columns of its product (im2col), written only
//! where a product asks for them: a whole matrix ([`im2col`]) where the product needs one,
//! else each panel as the product packs it ([`Unfolded`] as [`Columns`]); copied a stretch
//! of an output row at a time, or gathered 16 values at a time where the output rows are
//! narrow ([`Gathers`], [`Gathered`]).

use super::Params;
use crate::ops::packed::{panel_rows, Columns};

/// Unfold one image `[c, h, w]` into `cols`, `[c * kh * kw, oh * ow]` ([`Unfolded`]), by
/// gathers where [`Gathers`] applies, else by copies. Every element is written. Rows are
/// filled in parallel when asked.
pub(super) fn im2col(
    xs: &[f32],
    chw: [usize; 3],
    k: [usize; 2],
    [oh, ow]: [usize; 2],
    p: &Params,
    cols: &mut [f32],
    parallel: bool,
) {
    let pix = oh * ow;
    if pix == 0 {
        return;
    }
    let rows = chw[0] * k[0] * k[1];
    let cols = &mut cols[..rows * pix];
    match Gathers::new(chw, k, [oh, ow], p) {
        Some(gathers) => {
            let src = Gathered {
                xs,
                gathers: &gathers,
                first: 0,
            };
            matrix(&src, rows, pix, cols, parallel)
        }
        None => matrix(&Unfolded::new(xs, chw, k, ow, p), rows, pix, cols, parallel),
    }
}

/// `src`'s `rows` rows of `pix` columns into `cols` as a matrix: one panel as wide as the
/// output plane ([`Columns::pack`]); in parallel, blocks of its rows.
fn matrix(src: &impl Columns, rows: usize, pix: usize, cols: &mut [f32], parallel: bool) {
    use rayon::prelude::*;
    if parallel {
        let fill = |(b, block): (usize, &mut [f32])| {
            let r0 = b * ROWS_PER_TASK;
            src.pack(r0..r0 + block.len() / pix, 0..pix, pix, block);
        };
        cols.par_chunks_mut(ROWS_PER_TASK * pix)
            .enumerate()
            .for_each(fill);
    } else {
        src.pack(0..rows, 0..pix, pix, cols);
    }
}

/// Rows of the unfolded matrix a task writes where [`im2col`] runs in parallel.
const ROWS_PER_TASK: usize = 16;

/// Output rows narrower than this are unfolded by gathers ([`Gathers`]); wider ones by
/// copies, which were faster there: 3x3 convolutions of 32 channels with 112-pixel output
/// rows took 1.21x (stride 2) and 1.34x (stride 1, dilation 2) the time gathered, while
/// 56-pixel rows at stride 2 took 0.85x (BENCHMARKS.md, issue 14).
pub(super) const GATHER_MAX_WIDTH: usize = 64;

/// The widest column stride unfolded by gathers ([`Gathers`]): at strides 1 and 2 a gather's
/// 16 lanes read one output row's values from a cache line or two; at ViT's 16 (its patches)
/// each lane reads a line of its own, and its patch convolution took 0.91-1.04 ms gathered
/// against 0.93-0.94 copied (three alternations, 1 thread; BENCHMARKS.md, issue 14).
pub(super) const GATHER_MAX_STRIDE: usize = 2;

/// Where each row of an image's unfolded matrix reads its values, for output rows narrower
/// than [`GATHER_MAX_WIDTH`]. The copies of [`Unfolded`] are a stretch of one output row
/// each, its bounds worked out for it: seven values for a 7 x 7 output, and 12% of ResNet's
/// 512-channel 3x3 convolution on 7 x 7. Here 16 values of a row at a time (across output
/// rows) are one masked gather from the input plane: per kernel tap and output pixel, the
/// offset in the plane of the value it reads, or -1 where that is padding (a zero). That
/// convolution took 0.92x the time, the 3x3 stride-2 ones of ResNet-50 on 28- and 14-pixel
/// rows 0.90x and 0.88x (BENCHMARKS.md, issue 14).
pub(super) struct Gathers {
    /// `[taps, pix]`: the offsets.
    at: Vec<i32>,
    /// Output pixels per image.
    pix: usize,
    /// Kernel taps.
    taps: usize,
    /// Input values per channel.
    plane: usize,
}

impl Gathers {
    /// The offsets for a `kernel` convolution with parameters `p` of `[c, h, w]` images
    /// into `[oh, ow]` outputs; `None` where this CPU has no AVX-512, rows are
    /// [`GATHER_MAX_WIDTH`] or wider, the column stride is over [`GATHER_MAX_STRIDE`], or a
    /// plane has more values than an offset holds.
    pub(super) fn new(
        [_, h, w]: [usize; 3],
        [kh, kw]: [usize; 2],
        [oh, ow]: [usize; 2],
        p: &Params,
    ) -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        let avx512 = std::arch::is_x86_feature_detected!("avx512f");
        #[cfg(not(target_arch = "x86_64"))]
        let avx512 = false;
        let wide = ow >= GATHER_MAX_WIDTH || p.stride[1] > GATHER_MAX_STRIDE;
        if !avx512 || wide || i32::try_from(h * w).is_err() {
            return None;
        }
        let pix = oh * ow;
        let mut at = Vec::with_capacity(kh * kw * pix);
        let plane = h * w;
        // Tap (i, j) of output pixel (y, x) reads input (y * sy + i * dy - py, x * sx + j *
        // dx - px): row by row, no division per pixel (the table is built on every call).
        let [sy, sx] = p.stride.map(|s| s as isize);
        let (h, w) = (h as isize, w as isize);
        for t in 0..kh * kw {
            let di = ((t / kw) * p.dilation[0]) as isize - p.padding[0] as isize;
            let dj = ((t % kw) * p.dilation[1]) as isize - p.padding[1] as isize;
            for y in 0..oh as isize {
                let iy = y * sy + di;
                at.extend((0..ow as isize).map(|x| {
                    let ix = x * sx + dj;
                    match (0..h).contains(&iy) && (0..w).contains(&ix) {
                        true => (iy * w + ix) as i32,
                        false => -1,
                    }
                }));
            }
        }
        Some(Gathers {
            at,
            pix,
            taps: kh * kw,
            plane,
        })
    }

    /// Columns `cols` of row `r` of image `xs`'s unfolded matrix into `dst` (as long).
    /// Panics (reading nothing outside) where `xs` is shorter than the row's channel.
    fn row(&self, xs: &[f32], r: usize, cols: std::ops::Range<usize>, dst: &mut [f32]) {
        let plane = &xs[r / self.taps * self.plane..][..self.plane];
        let at = &self.at[r % self.taps * self.pix..][..self.pix][cols];
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `new` made a `Gathers` only where the CPU has AVX-512F.
        #[allow(unsafe_code)]
        unsafe {
            gather_avx512(plane, at, dst)
        };
        // Never reached: `new` makes none on other CPUs.
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (plane, at, dst);
    }
}

/// `dst[i] = plane[at[i]]`, 0 where `at[i]` is negative, 16 values a gather.
///
/// # Safety
///
/// The CPU has AVX-512F. Panics (reading nothing outside) where `dst` is shorter than `at`;
/// every offset is less than `plane.len()` (those of a [`Gathers`] are).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(unsafe_code)]
unsafe fn gather_avx512(plane: &[f32], at: &[i32], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let dst = &mut dst[..at.len()];
    for i in (0..at.len()).step_by(16) {
        let n = (at.len() - i).min(16);
        let lanes = (((1u32 << n) - 1) & 0xffff) as u16;
        // SAFETY: the `n` lanes from `i` lie inside `at` and `dst`; each gathered lane
        // reads `plane[at[l]]` for an offset `0 <= at[l] < plane.len()` (the caller's
        // contract; the others are masked off).
        unsafe {
            let idx = _mm512_maskz_loadu_epi32(lanes, at.as_ptr().add(i).cast());
            let inside = _mm512_mask_cmpge_epi32_mask(lanes, idx, _mm512_setzero_si512());
            let v = _mm512_mask_i32gather_ps::<4>(
                _mm512_setzero_ps(),
                inside,
                idx,
                plane.as_ptr().cast(),
            );
            _mm512_mask_storeu_ps(dst.as_mut_ptr().add(i), lanes, v);
        }
    }
}

/// An image's unfolded columns as [`Columns`], by [`Gathers`].
#[derive(Clone, Copy)]
pub(super) struct Gathered<'a> {
    /// The image, `[c, h, w]`.
    pub(super) xs: &'a [f32],
    pub(super) gathers: &'a Gathers,
    /// The output pixel of column 0.
    pub(super) first: usize,
}

impl Columns for Gathered<'_> {
    fn pack(
        &self,
        rows: std::ops::Range<usize>,
        cols: std::ops::Range<usize>,
        mr: usize,
        panels: &mut [f32],
    ) {
        panel_rows(rows, cols, mr, panels, |r, span, dst| {
            let span = self.first + span.start..self.first + span.end;
            self.gathers.row(self.xs, r, span, dst);
        });
    }

    fn skip(&self, cols: usize) -> Self {
        Gathered {
            first: self.first + cols,
            ..*self
        }
    }
}

/// One image's unfolded columns (`[c * kh * kw, oh * ow]`, im2col's matrix), written only
/// where asked ([`Columns`]): row `r = (ci, i, j)`, column `x` the input pixel that output
/// pixel `x` (row-major over the `ow`-wide output) sees through kernel tap `(i, j)` of
/// channel `ci`, zero where that falls in the padding. A product packs its panels straight
/// from the image so, without the matrix in between: a 3x3 stride-2 convolution of 128
/// channels on 56 x 56 has 3.6 MB of columns, which had been written out and read back by
/// the packing (2.02 → 1.79 ms on 1 thread; BENCHMARKS.md, issue 14).
#[derive(Clone, Copy)]
pub(super) struct Unfolded<'a> {
    /// The image, `[c, h, w]`.
    xs: &'a [f32],
    /// `[h, w]`.
    hw: [usize; 2],
    /// `[kh, kw]`.
    kernel: [usize; 2],
    /// The output's width.
    ow: usize,
    p: &'a Params,
    /// The output pixel of column 0.
    first: usize,
}

impl<'a> Unfolded<'a> {
    /// The columns of image `xs` (`[c, h, w]`) for a `kernel` convolution with parameters
    /// `p` and output width `ow`.
    pub(super) fn new(
        xs: &'a [f32],
        [_, h, w]: [usize; 3],
        kernel: [usize; 2],
        ow: usize,
        p: &'a Params,
    ) -> Self {
        Unfolded {
            xs,
            hw: [h, w],
            kernel,
            ow,
            p,
            first: 0,
        }
    }

    /// [`Columns::pack`], each stretch of an input row copied by `copy` (`dst[i] =
    /// src[i * step]`).
    #[inline(always)]
    fn pack_with(
        &self,
        rows: std::ops::Range<usize>,
        cols: std::ops::Range<usize>,
        mr: usize,
        panels: &mut [f32],
        copy: impl Fn(&mut [f32], &[f32], usize),
    ) {
        let ([h, wd], [kh, kw], ow, p) = (self.hw, self.kernel, self.ow, self.p);
        let (taps, kb) = (kh * kw, rows.len());
        if cols.is_empty() || ow == 0 || kb == 0 {
            return;
        }
        let (sy, sx) = (p.stride[0] as isize, p.stride[1] as isize);
        // Each tap's input row and column offsets from an output pixel's (times the stride),
        // and the output columns x0..x1 whose input column lies inside the image: 0 <= x *
        // stride + dj < wd. Empty when the tap lies wholly in the padding (dilation wider
        // than the image, e.g. DeepLab's ASPP).
        let tap: Vec<(isize, isize, usize, usize)> = (0..taps)
            .map(|t| {
                let di = ((t / kw) * p.dilation[0]) as isize - p.padding[0] as isize;
                let dj = ((t % kw) * p.dilation[1]) as isize - p.padding[1] as isize;
                let x0 = (((-dj).max(0) + sx - 1) / sx).min(ow as isize) as usize;
                let x1 = (((wd as isize - dj).max(0) + sx - 1) / sx).min(ow as isize) as usize;
                (di, dj, x0, x1.max(x0))
            })
            .collect();
        let (first, last) = (self.first + cols.start, self.first + cols.end);
        // A stretch of one output row inside one panel at a time (output pixel px: output row
        // y, column xa; panel q, its column `off`), then each row of the block for it: the
        // same length for every row, the copies' loops alike.
        let (mut px, mut y, mut xa) = (first, first / ow, first % ow);
        let (mut q, mut off) = (0, 0);
        while px < last {
            let n = (ow - xa).min(mr - off).min(last - px);
            let part = &mut panels[q * mr * kb + off..];
            let (mut ci, mut t) = (rows.start / taps, rows.start % taps);
            for c in 0..kb {
                let (di, dj, x0, x1) = tap[t];
                let seg = &mut part[c * mr..][..n];
                let iy = y as isize * sy + di;
                if iy < 0 || iy >= h as isize {
                    seg.fill(0.0);
                } else {
                    let srow = &self.xs[(ci * h + iy as usize) * wd..][..wd];
                    if x0 <= xa && xa + n <= x1 {
                        copy(seg, &srow[(xa as isize * sx + dj) as usize..], p.stride[1]);
                    } else {
                        let a = x0.clamp(xa, xa + n);
                        let b = x1.clamp(a, xa + n);
                        seg[..a - xa].fill(0.0);
                        if b > a {
                            let s0 = (a as isize * sx + dj) as usize;
                            copy(&mut seg[a - xa..b - xa], &srow[s0..], p.stride[1]);
                        }
                        seg[b - xa..].fill(0.0);
                    }
                }
                t += 1;
                if t == taps {
                    (ci, t) = (ci + 1, 0);
                }
            }
            px += n;
            xa += n;
            if xa == ow {
                (y, xa) = (y + 1, 0);
            }
            off += n;
            if off == mr {
                (q, off) = (q + 1, 0);
            }
        }
    }

    /// [`Columns::pack`] with AVX-512's masked loads and stores for the copies: a stretch
    /// is one output row's part of a panel (28 values on a 28 x 28 output), too short for
    /// the copies' scalar ends not to count.
    ///
    /// # Safety
    ///
    /// The CPU has AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    #[allow(unsafe_code)]
    unsafe fn pack_avx512(
        &self,
        rows: std::ops::Range<usize>,
        cols: std::ops::Range<usize>,
        mr: usize,
        panels: &mut [f32],
    ) {
        self.pack_with(rows, cols, mr, panels, |dst, src, step| {
            // SAFETY: this function's contract (AVX-512F).
            unsafe { copy_avx512(dst, src, step) }
        });
    }
}

impl Columns for Unfolded<'_> {
    fn pack(
        &self,
        rows: std::ops::Range<usize>,
        cols: std::ops::Range<usize>,
        mr: usize,
        panels: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F.
            #[allow(unsafe_code)]
            unsafe {
                self.pack_avx512(rows, cols, mr, panels)
            };
            return;
        }
        self.pack_with(rows, cols, mr, panels, strided_copy);
    }

    fn skip(&self, cols: usize) -> Self {
        Unfolded {
            first: self.first + cols,
            ..*self
        }
    }
}

/// `dst[i] = src[i * step]`, 16 values at a time for steps 1 and 2 (the last ones masked),
/// one at a time for others.
///
/// # Safety
///
/// The CPU has AVX-512F. Panics (reading nothing outside) where `src` is shorter than
/// `(dst.len() - 1) * step + 1`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(unsafe_code)]
unsafe fn copy_avx512(dst: &mut [f32], src: &[f32], step: usize) {
    use std::arch::x86_64::*;
    let n = dst.len();
    if n == 0 {
        return;
    }
    let src = &src[..(n - 1) * step + 1];
    // The lanes `0..count` (at most 16) of a mask.
    let lanes = |count: usize| -> __mmask16 { (((1u32 << count.min(16)) - 1) & 0xffff) as u16 };
    match step {
        1 => {
            for i in (0..n).step_by(16) {
                let m = lanes(n - i);
                // SAFETY: the masked lanes `i..i + 16` that are read and written lie inside
                // `src` and `dst` (both `n` long here).
                unsafe {
                    let v = _mm512_maskz_loadu_ps(m, src.as_ptr().add(i));
                    _mm512_mask_storeu_ps(dst.as_mut_ptr().add(i), m, v);
                }
            }
        }
        2 => {
            // The even lanes of two registers: 0, 2, ..., 30.
            let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
            for i in (0..n).step_by(16) {
                // Source values 2i.. of which `left` are inside `src`.
                let left = src.len() - 2 * i;
                // SAFETY: only lanes inside `src` (the first `left` from 2i) are read, and
                // the first `n - i` (at most 16) of `dst` from i are written.
                unsafe {
                    let a = _mm512_maskz_loadu_ps(lanes(left), src.as_ptr().add(2 * i));
                    let b = if left > 16 {
                        _mm512_maskz_loadu_ps(lanes(left - 16), src.as_ptr().add(2 * i + 16))
                    } else {
                        _mm512_setzero_ps()
                    };
                    let v = _mm512_permutex2var_ps(a, even, b);
                    _mm512_mask_storeu_ps(dst.as_mut_ptr().add(i), lanes(n - i), v);
                }
            }
        }
        _ => strided_copy(dst, src, step),
    }
}

/// `dst[i] = src[i * step]`. Steps 1 and 2 (the common strides) are loops the compiler
/// vectorises; a step known only at run time is read one element at a time (a 3x3 stride-2
/// conv on `[8, 64, 56, 56]` at 1 thread: 9.9–10.6 → 9.3 ms with the step-2 loop).
pub(crate) fn strided_copy(dst: &mut [f32], src: &[f32], step: usize) {
    match step {
        1 => dst.copy_from_slice(&src[..dst.len()]),
        2 => {
            let Some((last, body)) = dst.split_last_mut() else {
                return;
            };
            let src = &src[..2 * body.len() + 1];
            for (o, pair) in body.iter_mut().zip(src.chunks_exact(2)) {
                *o = pair[0];
            }
            *last = src[2 * body.len()];
        }
        _ => dst
            .iter_mut()
            .zip(src.iter().step_by(step))
            .for_each(|(d, &v)| *d = v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::conv::{out_len, Act};

    /// Every part of the unfolded columns a product may ask for equals im2col's matrix as
    /// written out here from its definition: strides 1, 2 and 3 (different per dim),
    /// padding, dilation (taps wholly in the padding too), blocks of rows starting inside a
    /// channel's taps, columns starting inside an output row and from a `skip`, panels of
    /// 16, 64 and 7 columns (a stretch ending where a panel ends), by the AVX-512 copies, the
    /// plain ones and (output rows narrower than 64) the gathers; and the whole matrix, in
    /// blocks of rows on the pool too (gathered where the rows are narrow, else copied). What
    /// lies past the last column of the last panel is left as it was.
    #[test]
    fn panels_hold_the_unfolded_columns() {
        // (c, h, w, kernel, stride, padding, dilation)
        type Case = (
            usize,
            usize,
            usize,
            [usize; 2],
            [usize; 2],
            [usize; 2],
            [usize; 2],
        );
        let cases: [Case; 10] = [
            (3, 9, 11, [3, 3], [1, 1], [1, 1], [1, 1]),
            (4, 14, 13, [3, 3], [2, 2], [1, 1], [1, 1]),
            (2, 17, 16, [7, 7], [2, 2], [3, 3], [1, 1]),
            (3, 10, 12, [3, 2], [3, 2], [0, 1], [1, 1]),
            (2, 9, 9, [1, 1], [2, 2], [0, 0], [1, 1]),
            // Output rows of 25 (stretches of more than 16 at stride 2).
            (2, 6, 50, [3, 3], [2, 2], [1, 1], [1, 1]),
            (2, 7, 40, [3, 3], [1, 2], [1, 1], [1, 1]),
            // Output rows of 70, and a column stride of 3 (copied, not gathered, into the
            // whole matrix).
            (1, 3, 70, [3, 3], [1, 1], [1, 1], [1, 1]),
            (2, 8, 20, [2, 2], [1, 3], [0, 0], [1, 1]),
            (2, 5, 5, [3, 3], [1, 1], [6, 6], [6, 6]),
        ];
        for (c, h, w, [kh, kw], stride, padding, dilation) in cases {
            let p = Params {
                stride,
                padding,
                dilation,
                groups: 1,
                act: Act::None,
            };
            let oh = out_len(h, kh, padding[0], stride[0], dilation[0]).unwrap();
            let ow = out_len(w, kw, padding[1], stride[1], dilation[1]).unwrap();
            let (k, pix) = (c * kh * kw, oh * ow);
            let xs: Vec<f32> = (0..c * h * w).map(|i| i as f32 + 1.0).collect();
            // Row (ci, i, j), column (y, x): the input at (y * sy + i * dy - py, x * sx + j *
            // dx - px), zero outside.
            let want = |r: usize, col: usize| -> f32 {
                let (ci, i, j) = (r / (kh * kw), (r / kw) % kh, r % kw);
                let (y, x) = (col / ow, col % ow);
                let iy = (y * stride[0] + i * dilation[0]) as isize - padding[0] as isize;
                let ix = (x * stride[1] + j * dilation[1]) as isize - padding[1] as isize;
                if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                    0.0
                } else {
                    xs[(ci * h + iy as usize) * w + ix as usize]
                }
            };
            let unfolded = Unfolded::new(&xs, [c, h, w], [kh, kw], ow, &p);
            for parallel in [false, true] {
                let mut all = vec![0.0; k * pix];
                im2col(&xs, [c, h, w], [kh, kw], [oh, ow], &p, &mut all, parallel);
                for (at, v) in all.iter().enumerate() {
                    let case = format!("im2col {c}x{h}x{w}, parallel {parallel}");
                    assert_eq!(*v, want(at / pix, at % pix), "{case} at {at}");
                }
            }
            let skip = ow + 3;
            let gathers = Gathers::new([c, h, w], [kh, kw], [oh, ow], &p);
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx512f") {
                let narrow = ow < GATHER_MAX_WIDTH && stride[1] <= GATHER_MAX_STRIDE;
                assert_eq!(gathers.is_some(), narrow, "{c}x{h}x{w}");
            }
            for mr in [16, 64, 7] {
                for (rows, cols) in [(0..k, 0..pix), (kh * kw / 2 + 1..k, 2..pix - skip)] {
                    for from in [0, skip] {
                        let cols = cols.start..cols.end.min(pix - from);
                        let len = cols.len().div_ceil(mr) * mr * rows.len();
                        // The copies (plain, AVX-512's masked ones), and the gathers.
                        let pack = |how: &str| {
                            let mut panels = vec![-7.0; len];
                            let (rows, cols) = (rows.clone(), cols.clone());
                            let src = unfolded.skip(from);
                            match (how, &gathers) {
                                ("plain", _) => {
                                    src.pack_with(rows, cols, mr, &mut panels, strided_copy)
                                }
                                ("masked", _) => src.pack(rows, cols, mr, &mut panels),
                                (_, Some(gathers)) => {
                                    let g = Gathered {
                                        xs: &xs,
                                        gathers,
                                        first: 0,
                                    };
                                    g.skip(from).pack(rows, cols, mr, &mut panels)
                                }
                                (_, None) => return None,
                            }
                            Some(panels)
                        };
                        for how in ["plain", "masked", "gathers"] {
                            let Some(panels) = pack(how) else {
                                continue;
                            };
                            for (at, v) in panels.iter().enumerate() {
                                let (q, rest) = (at / (mr * rows.len()), at % (mr * rows.len()));
                                let (r, j) =
                                    (rows.start + rest / mr, cols.start + q * mr + rest % mr);
                                let want = if j < cols.end {
                                    want(r, from + j)
                                } else {
                                    -7.0
                                };
                                let case = format!("{c}x{h}x{w} k{kh}x{kw} s{stride:?} mr {mr}");
                                assert_eq!(*v, want, "{case} rows {rows:?} cols {cols:?} + {from}, {how}: row {r} col {j}");
                            }
                        }
                    }
                }
            }
        }
    }
}
