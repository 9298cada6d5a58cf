//! The blocks path of depthwise convolutions: channels held innermost, 16 at a time.

use std::mem::MaybeUninit;

use super::PlaneGeometry;
use crate::ops::conv::Act;
use crate::ops::fused::{self, Spare};
#[cfg(target_arch = "x86_64")]
use crate::ops::tile::transpose16;
use crate::ops::tile::{transpose, SIDE};

/// Output planes of at most this many pixels are computed by [`depthwise_block`]: per plane,
/// the spatial path's fixed work (padding, phases, copies) outweighs its sums there. Single
/// convolutions at batch 1 and 1 thread, spatial path / blocks (medians of 50, two runs
/// each, with the spatial path's sums in AVX-512 registers): 960 channels 7x7 5x5 0.19 /
/// 0.11–0.12 ms, 672 channels 14x14 5x5 stride 2 (7x7 out) 0.25 / 0.15–0.21 ms, 480 channels
/// 14x14 3x3 0.12–0.19 / 0.15–0.16 ms (even); on 28x28 inputs the spatial path wins (120
/// channels 5x5 0.16–0.17 / 0.23–0.27 ms, 240 channels 3x3 stride 2 0.13 / 0.16–0.21 ms).
/// Once the spatial path ran its last, partial block of outputs in registers too, it won on
/// 14x14 outputs (MobileNetV3-Large at batch 8, 1 thread: 672 channels 3x3 1.58 against
/// 2.75 ms), so the line is drawn at 7x7 outputs (BENCHMARKS.md, issue 14). Blocks still
/// match or beat the in-place path there (960 channels 7x7 5x5 at batch 8: 0.75–0.80 against
/// 0.81–0.83 ms), whose chunks of 16 pixels are less than half used on rows of 7. With the
/// work per call done once ([`BlockPlan`]), aligned rows and sums of eight pixels, at batch 8
/// (least of 100, 1 thread), blocks / in place: 960 channels 7x7 5x5 0.53 / 0.69 ms, 672
/// channels 14x14 5x5 stride 2 0.52 / 1.26, 1152 channels 7x7 3x3 0.45 / 0.72; on 14x14
/// outputs in place still wins (672 channels 3x3 0.80 / 0.54).
pub(super) const SMALL_OUTPUT: usize = 7 * 7;

/// Channels per task of [`depthwise_block`].
pub(super) const CHANNEL_BLOCK: usize = 64;

/// Channels [`depthwise_block`] computes together: one AVX-512 register of f32.
const LANES: usize = 16;

/// What every block of one convolution shares, worked out once per call: the kernel's
/// weights by groups of [`LANES`] channels, each input pixel's row in a block's padded input,
/// and the taps. Per block (16 channels of an image) these cost as much as the transposes:
/// the weights were regrouped and each pixel's row found by a division every time (960
/// channels 5x5 on 7x7 at batch 8, 1 thread: 0.87 ms, BENCHMARKS.md, issue 14).
pub(super) struct BlockPlan {
    /// `[groups][kh * kw][LANES]`: tap `t` of channel `g * LANES + l` at `[g][t][l]`, zero
    /// past the last channel.
    wt: Vec<f32>,
    /// Per input pixel, its row (a multiple of [`LANES`]) in the padded block, if some tap
    /// reads it.
    rows: Vec<Option<usize>>,
    /// The padded block's length in values (`hp * wp * LANES`).
    len: usize,
    taps: BlockTaps,
    /// The activation each block's sums get.
    act: Act,
}

impl BlockPlan {
    /// The plan for weights `ws` (`[c, kh * kw]`, one output channel per input channel) of
    /// geometry `g`, and activation `act`.
    pub(super) fn new(ws: &[f32], g: &PlaneGeometry, act: Act) -> BlockPlan {
        let ([h, wd], [kh, kw], [oh, ow]) = ([g.h, g.wd], g.k, [g.oh, g.ow]);
        let ([sy, sx], [ph, pw], [dy, dx]) = (g.stride, g.pad, g.dilation);
        let kk = kh * kw;
        // The padded rows and columns that some tap reads (at most the whole padded plane).
        let (hp, wp) = (
            (oh - 1) * sy + (kh - 1) * dy + 1,
            (ow - 1) * sx + (kw - 1) * dx + 1,
        );
        let c = ws.len() / kk.max(1);
        // Each group's `[LANES channels, kk taps]` of `ws` transposed into its `[kk][LANES]`,
        // in tiles of 16 taps. With a scatter of one value at a time the plan took 17 µs of
        // each of EfficientNet-B0's 1152-channel convolutions on 7 x 7 planes (0.095 ms in
        // all), on the thread running the program; 11 µs this way (BENCHMARKS.md, issue 14).
        let mut wt = vec![0f32; c.div_ceil(LANES) * kk * LANES];
        for (g, group) in wt.chunks_exact_mut(kk * LANES).enumerate() {
            let channels = LANES.min(c - g * LANES);
            for t0 in (0..kk).step_by(SIDE) {
                let taps = SIDE.min(kk - t0);
                let (from, to) = ((g * LANES) * kk + t0, t0 * LANES);
                transpose(ws, from, kk, channels, taps, group, to, LANES);
            }
        }
        let rows = (0..h * wd)
            .map(|q| {
                let (y, x) = (q / wd + ph, q % wd + pw);
                (y < hp && x < wp).then_some((y * wp + x) * LANES)
            })
            .collect();
        let taps = BlockTaps {
            offs: (0..kk)
                .map(|t| ((t / kw) * dy * wp + (t % kw) * dx) * LANES)
                .collect(),
            out: [oh, ow],
            stride: [sy, sx],
            kernel: [kh, kw],
            dilation: [dy, dx],
            wp,
        };
        BlockPlan {
            wt,
            rows,
            len: hp * wp * LANES,
            taps,
            act,
        }
    }
}

/// Output planes `c0..c0 + dst.len() / (oh * ow)` of one image `img` (`[c, h, w]`) of a
/// depthwise convolution with one output channel per input channel, by `plan` (made for
/// its weights and `g`), computed [`LANES`] channels at a time with the channels innermost:
/// their input planes transposed to `[hp, wp, LANES]`, zero-padded so that every tap of
/// every output pixel reads inside it ([`transpose_in`]); each output pixel its bias plus
/// each tap in turn, a vector over the channels ([`block_sums`]); the result transposed
/// back into `dst` ([`transpose_out`]). On planes of a few pixels this vectorises over
/// channels where the spatial path works on a few pixels at a time (BENCHMARKS.md, issue
/// 14). The sums get the plan's activation before they are transposed out; every value of
/// `dst` is written. `c0` is a multiple of [`LANES`].
pub(super) fn depthwise_block(
    img: &[f32],
    plan: &BlockPlan,
    bias: Option<&[f32]>,
    c0: usize,
    g: &PlaneGeometry,
    dst: &mut [MaybeUninit<f32>],
    simd: bool,
) {
    let ([h, wd], [kh, kw], [oh, ow]) = ([g.h, g.wd], g.k, [g.oh, g.ow]);
    let (pix, kk) = (oh * ow, kh * kw);
    assert!(
        c0.is_multiple_of(LANES),
        "a block starts at a multiple of {LANES} channels"
    );
    let (mut xt_buf, mut yt_buf) = (Spare::take(), Spare::take());
    // Each row of 16 values on a 64-byte line of its own: a row across two lines costs two
    // (960 channels 5x5 on 7x7 at batch 8, 1 thread: 0.57-0.61 ms unaligned, 0.51 aligned).
    let [xt, yt] = [(&mut xt_buf, plan.len), (&mut yt_buf, pix * LANES)].map(|(buf, len)| {
        buf.clear();
        buf.resize(len + LANES, 0.0);
        let skew = buf.as_ptr().align_offset(64).min(LANES);
        &mut buf[skew..][..len]
    });
    for (k, dst) in dst.chunks_mut(LANES * pix).enumerate() {
        let (j0, cn) = (c0 + k * LANES, dst.len() / pix);
        if cn < LANES {
            // The lanes past the last channel: zeros, not the last group's values.
            xt.fill(0.0);
        }
        transpose_in(
            &img[j0 * h * wd..][..cn * h * wd],
            h * wd,
            xt,
            &plan.rows,
            simd,
        );
        let wt = &plan.wt[(j0 / LANES) * kk * LANES..][..kk * LANES];
        let mut b0 = [0f32; LANES];
        if let Some(b) = bias {
            b0[..cn].copy_from_slice(&b[j0..j0 + cn]);
        }
        block_sums(xt, wt, &b0, yt, &plan.taps, simd);
        plan.act.apply(yt);
        transpose_out(yt, dst, simd);
    }
}

/// `xt[rows[q] + j] = planes[j][q]` for every channel `j` of `planes` (at most [`LANES`]
/// planes of `pix` values) and pixel `q` that has a row (a multiple of [`LANES`]) in `xt`:
/// 16 x 16 tiles by AVX-512 where the CPU has it (and `simd`), else one value at a time.
fn transpose_in(planes: &[f32], pix: usize, xt: &mut [f32], rows_of: &[Option<usize>], simd: bool) {
    let cn = planes.len() / pix;
    assert!(cn <= LANES && planes.len() == cn * pix && rows_of.len() == pix);
    for t0 in (0..pix).step_by(LANES) {
        let n = LANES.min(pix - t0);
        let mut rows = [None; LANES];
        for (i, r) in rows.iter_mut().enumerate().take(n) {
            *r = rows_of[t0 + i];
            assert!(
                r.is_none_or(|r| r + LANES <= xt.len()),
                "a row outside the block"
            );
        }
        #[cfg(target_arch = "x86_64")]
        if simd && std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F was just found; `planes` holds `cn` planes of `pix`, the
            // tile's `n` pixels from `t0` are inside each, and every row is inside `xt`.
            #[allow(unsafe_code)]
            unsafe {
                tile_in_avx512(planes, pix, cn, t0, n, &rows, xt)
            };
            continue;
        }
        for (j, plane) in planes.chunks_exact(pix).enumerate() {
            for (r, &v) in rows.iter().zip(&plane[t0..t0 + n]) {
                if let Some(r) = r {
                    xt[r + j] = v;
                }
            }
        }
    }
}

/// `dst[j][q] = yt[q][j]` for the channels `j` of `dst` (at most [`LANES`] planes of as many
/// pixels as `yt` has rows of [`LANES`]), as [`transpose_in`] does it: every value of `dst`
/// written.
fn transpose_out(yt: &[f32], dst: &mut [MaybeUninit<f32>], simd: bool) {
    let pix = yt.len() / LANES;
    let cn = dst.len() / pix;
    assert!(cn <= LANES && dst.len() == cn * pix && yt.len() == pix * LANES);
    for t0 in (0..pix).step_by(LANES) {
        let n = LANES.min(pix - t0);
        #[cfg(target_arch = "x86_64")]
        if simd && std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F was just found; the tile's rows are inside `yt`, its pixels
            // inside each of `dst`'s `cn` planes.
            #[allow(unsafe_code)]
            unsafe {
                tile_out_avx512(yt, dst, pix, cn, t0, n)
            };
            continue;
        }
        for (j, plane) in dst.chunks_exact_mut(pix).enumerate() {
            for (d, row) in plane[t0..t0 + n]
                .iter_mut()
                .zip(yt[t0 * LANES..].chunks_exact(LANES))
            {
                d.write(row[j]);
            }
        }
    }
}

/// Pixels `t0..t0 + n` of the `cn` planes of `planes` into their rows of `xt`.
///
/// # Safety
/// AVX-512F; `cn <= 16`, `n <= 16`, `t0 + n <= pix`, `cn * pix <= planes.len()`, and each
/// `Some` row `r` has `r + 16 <= xt.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(unsafe_code)]
unsafe fn tile_in_avx512(
    planes: &[f32],
    pix: usize,
    cn: usize,
    t0: usize,
    n: usize,
    rows: &[Option<usize>; LANES],
    xt: &mut [f32],
) {
    use std::arch::x86_64::*;
    let mask: __mmask16 = ((1u32 << n) - 1) as u16;
    // Loops of constant length (a condition inside), so that the rows stay in registers.
    let mut r = [_mm512_setzero_ps(); 16];
    for (j, r) in r.iter_mut().enumerate() {
        if j < cn {
            *r = _mm512_maskz_loadu_ps(mask, planes.as_ptr().add(j * pix + t0));
        }
    }
    transpose16(&mut r);
    for (q, row) in rows.iter().enumerate() {
        if let (true, Some(row)) = (q < n, row) {
            _mm512_storeu_ps(xt.as_mut_ptr().add(*row), r[q]);
        }
    }
}

/// Pixels `t0..t0 + n` of `yt`'s first `cn` channels into `dst`'s planes.
///
/// # Safety
/// AVX-512F; `cn <= 16`, `n <= 16`, `t0 + n <= pix`, `pix * 16 <= yt.len()`,
/// `cn * pix <= dst.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(unsafe_code)]
unsafe fn tile_out_avx512(
    yt: &[f32],
    dst: &mut [MaybeUninit<f32>],
    pix: usize,
    cn: usize,
    t0: usize,
    n: usize,
) {
    use std::arch::x86_64::*;
    let mask: __mmask16 = ((1u32 << n) - 1) as u16;
    // Loops of constant length (a condition inside), so that the rows stay in registers.
    let mut r = [_mm512_setzero_ps(); 16];
    for (q, r) in r.iter_mut().enumerate() {
        if q < n {
            *r = _mm512_loadu_ps(yt.as_ptr().add((t0 + q) * LANES));
        }
    }
    transpose16(&mut r);
    for (j, r) in r.iter().enumerate() {
        if j < cn {
            _mm512_mask_storeu_ps(dst.as_mut_ptr().cast::<f32>().add(j * pix + t0), mask, *r);
        }
    }
}

/// The sums [`block_sums`] computes: outputs `[oh, ow]` at `stride` over an input `wp`
/// pixels wide, each the sum of the taps at `offs` (in floats, kernel order) from its first
/// input.
struct BlockTaps {
    offs: Vec<usize>,
    out: [usize; 2],
    stride: [usize; 2],
    /// The kernel's height and width, and its dilation (which `offs` are made of).
    kernel: [usize; 2],
    dilation: [usize; 2],
    wp: usize,
}

impl BlockTaps {
    /// Where output pixel `(oy, ox)`'s taps start in the input.
    fn base(&self, oy: usize, ox: usize) -> usize {
        (oy * self.stride[0] * self.wp + ox * self.stride[1]) * LANES
    }
}

/// `yt[q][l] = b0[l] + Σ_t wt[t][l] * xt[base(q) + offs[t]][l]` for every output pixel `q`
/// and lane `l`, rows of [`LANES`] values: by AVX-512 where the CPU has it (only if `simd`;
/// fused multiply-adds: [`block_rows_avx512`] for 3- and 5-wide kernels at strides 1 and 2
/// without dilation, else [`block_sums_avx512`]), else in plain f32 operations (a multiply,
/// then an add). Panics if a tap would read outside `xt`.
fn block_sums(
    xt: &[f32],
    wt: &[f32],
    b0: &[f32; LANES],
    yt: &mut [f32],
    taps: &BlockTaps,
    simd: bool,
) {
    let [oh, ow] = taps.out;
    let last_tap = taps.offs.iter().copied().max().unwrap_or(0);
    assert!(
        oh * ow > 0 && taps.base(oh - 1, ow - 1) + last_tap + LANES <= xt.len(),
        "depthwise block: a tap reads past the input"
    );
    assert!(yt.len() == oh * ow * LANES && wt.len() == taps.offs.len() * LANES);
    #[cfg(target_arch = "x86_64")]
    if simd
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("fma")
    {
        // SAFETY: only instructions the CPU was just found to support; every read and write
        // is inside the slices, as asserted above (the last pixel's furthest tap is the
        // furthest read); `block_rows_avx512` only for the kernels and strides it takes.
        #[allow(unsafe_code)]
        unsafe {
            // A row of outputs at a time where a kernel takes it, else pixel by pixel.
            match (taps.dilation == [1, 1], taps.stride, taps.kernel[1]) {
                (true, [1, 1], 3) => block_rows_avx512::<3, 1>(xt, wt, b0, yt, taps),
                (true, [1, 1], 5) => block_rows_avx512::<5, 1>(xt, wt, b0, yt, taps),
                (true, [2, 2], 3) => block_rows_avx512::<3, 2>(xt, wt, b0, yt, taps),
                (true, [2, 2], 5) => block_rows_avx512::<5, 2>(xt, wt, b0, yt, taps),
                _ => block_sums_avx512(xt, wt, b0, yt, taps),
            }
        }
        return;
    }
    fused::simd(
        #[inline(always)]
        || {
            for (q, out) in yt.chunks_exact_mut(LANES).enumerate() {
                let base = taps.base(q / ow, q % ow);
                let mut acc = *b0;
                for (&off, w) in taps.offs.iter().zip(wt.chunks_exact(LANES)) {
                    let xs: &[f32; LANES] = xt[base + off..][..LANES].try_into().unwrap();
                    for l in 0..LANES {
                        acc[l] += w[l] * xs[l];
                    }
                }
                out.copy_from_slice(&acc);
            }
        },
    );
}

/// [`block_sums`] by AVX-512: eight output pixels summed together (eight independent fused
/// multiply-adds hide each one's latency), tap by tap, each tap's weights loaded once for
/// the eight. Every loop over the eight has a constant length, so that the sums stay in
/// registers: with the kernel's 25 weights held in registers as well, the compiler kept the
/// sums and weights on the stack (960 channels 5x5 on 7x7 at batch 8, 1 thread: the whole
/// convolution 0.63 ms, 0.61 this way; BENCHMARKS.md, issue 14). A last group of fewer than
/// eight pixels repeats its last pixel's sums and stores only its own.
///
/// # Safety
/// The CPU has AVX-512F and FMA, and the bounds [`block_sums`] asserts hold.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
#[allow(unsafe_code)]
unsafe fn block_sums_avx512(
    xt: &[f32],
    wt: &[f32],
    b0: &[f32; LANES],
    yt: &mut [f32],
    taps: &BlockTaps,
) {
    use std::arch::x86_64::*;
    const P: usize = 8;
    let [oh, ow] = taps.out;
    let (x, y, pix) = (xt.as_ptr(), yt.as_mut_ptr(), oh * ow);
    let bias = _mm512_loadu_ps(b0.as_ptr());
    let mut q = 0;
    while q < pix {
        let n = P.min(pix - q);
        let base: [usize; P] = std::array::from_fn(|i| {
            let at = q + i.min(n - 1);
            taps.base(at / ow, at % ow)
        });
        let mut acc = [bias; P];
        for (t, &off) in taps.offs.iter().enumerate() {
            let wv = _mm512_loadu_ps(wt.as_ptr().add(t * LANES));
            for (a, &b) in acc.iter_mut().zip(&base) {
                *a = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x.add(b + off)), *a);
            }
        }
        for (i, a) in acc.iter().enumerate() {
            if i < n {
                _mm512_storeu_ps(y.add((q + i) * LANES), *a);
            }
        }
        q += n;
    }
}

/// [`block_sums`] by AVX-512 for a kernel `KW` wide at stride `S` in both dims, dilation 1:
/// a row of up to eight output pixels at a time, kernel row by kernel row, each input pixel
/// of the row loaded once and added (times each tap column's weights, loaded once per kernel
/// row) into every output pixel of the eight it reaches. [`block_sums_avx512`] loads each
/// input pixel once per output pixel and tap: more loads than multiply-adds.
///
/// # Safety
/// The CPU has AVX-512F and FMA, `taps` is of a `KW`-wide kernel at strides `[S, S]` and
/// dilation 1, and the bounds [`block_sums`] asserts hold.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
#[allow(unsafe_code)]
unsafe fn block_rows_avx512<const KW: usize, const S: usize>(
    xt: &[f32],
    wt: &[f32],
    b0: &[f32; LANES],
    yt: &mut [f32],
    taps: &BlockTaps,
) {
    use std::arch::x86_64::*;
    const C: usize = 8;
    // The columns a chunk reads, each written out below.
    const { assert!(S * (C - 1) + KW <= 19) };
    let ([oh, ow], kh, wp) = (taps.out, taps.kernel[0], taps.wp);
    let (x, y, w) = (xt.as_ptr(), yt.as_mut_ptr(), wt.as_ptr());
    let bias = _mm512_loadu_ps(b0.as_ptr());
    for oy in 0..oh {
        for ox0 in (0..ow).step_by(C) {
            let n = C.min(ow - ox0);
            // Input columns (from the chunk's first) that its `n` outputs read.
            let cols = S * (n - 1) + KW;
            let mut acc = [bias; C];
            for i in 0..kh {
                let wv: [__m512; KW] =
                    std::array::from_fn(|j| _mm512_loadu_ps(w.add((i * KW + j) * LANES)));
                let row = x.add(((oy * S + i) * wp + ox0 * S) * LANES);
                // Constant bounds, so that the loops unroll and every index is a constant;
                // input column `q` feeds output `o` by tap column `j = q - S * o`.
                macro_rules! column {
                    ($($q:literal)*) => {$({
                        let q: usize = $q;
                        if q < S * (C - 1) + KW && q < cols {
                            let xv = _mm512_loadu_ps(row.add(q * LANES));
                            for (j, &wj) in wv.iter().enumerate() {
                                if q >= j && (q - j) % S == 0 && (q - j) / S < C {
                                    let o = (q - j) / S;
                                    acc[o] = _mm512_fmadd_ps(wj, xv, acc[o]);
                                }
                            }
                        }
                    })*};
                }
                // Columns 0 .. S * (C - 1) + KW: at most 2 * 7 + 5 = 19.
                column!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18);
            }
            for (o, a) in acc.iter().enumerate().take(n) {
                _mm512_storeu_ps(y.add((oy * ow + ox0 + o) * LANES), *a);
            }
        }
    }
}
