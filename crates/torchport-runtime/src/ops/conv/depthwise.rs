//! Depthwise convolutions (groups == input channels, any channel multiplier, stride, padding
//! and dilation) by direct kernels: large planes by their stride phases (`PlaneGeometry`),
//! small ones by blocks of channels (`depthwise_block`).

use candle_core::Tensor;

use super::{out_len, small_f32, strided_copy, Params};
use crate::error::OpResult;
use crate::op_bail;
use crate::ops::fused::{self, with_f32, Spare};
use crate::ops::{f32_vec, from_f32};

/// Direct depthwise convolution: weight [C*m, 1, kh, kw], groups = C; output planes in
/// parallel, each starting from its bias (when given), or for small planes with m = 1,
/// blocks of channels in parallel ([`depthwise_block`]).
pub(super) fn depthwise(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    p: &Params,
) -> OpResult<Tensor> {
    depthwise_by(x, w, bias, p, SMALL_OUTPUT)
}

/// [`depthwise`], with output planes of at most `small_output` pixels computed by
/// [`depthwise_block`] (when each input channel has one output channel).
fn depthwise_by(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    p: &Params,
    small_output: usize,
) -> OpResult<Tensor> {
    use rayon::prelude::*;
    let (n, c, h, wd) = x.dims4()?;
    let (co, _, kh, kw) = w.dims4()?;
    if co % c != 0 {
        op_bail!("depthwise weight has {co} output channels for {c} groups");
    }
    let m = co / c;
    let oh = out_len(h, kh, p.padding[0], p.stride[0], p.dilation[0])?;
    let ow = out_len(wd, kw, p.padding[1], p.stride[1], p.dilation[1])?;
    let ws = f32_vec(w)?;
    let bias = match bias {
        Some(b) => match small_f32(b, co) {
            Some(v) => Some(v),
            None => op_bail!(
                "depthwise bias has {} values for {co} channels",
                b.elem_count()
            ),
        },
        None => None,
    };
    let mut out = fused::zeros(n * co * oh * ow);
    if oh * ow > 0 {
        let geo = PlaneGeometry::new([h, wd], [kh, kw], [oh, ow], p);
        let planes = |out: &mut [f32], xs: &[f32]| {
            out.par_chunks_mut(oh * ow).enumerate().for_each_init(
                || (Spare::take(), Spare::take()),
                |(phases, wide), (i, dst)| {
                    let (b, oc) = (i / co, i % co);
                    let src = &xs[(b * c + oc / m) * h * wd..][..h * wd];
                    let ker = &ws[oc * kh * kw..][..kh * kw];
                    let b0 = bias.as_ref().map_or(0., |bias| bias[oc]);
                    depthwise_plane(dst, src, ker, b0, &geo, phases, wide);
                    p.act.apply(dst);
                },
            )
        };
        // Small output planes with one output channel per input channel: blocks of channels, each
        // computed with the channels innermost (see `depthwise_block`).
        let blocks = |out: &mut [f32], xs: &[f32]| {
            let pix = oh * ow;
            out.par_chunks_mut(co * pix)
                .zip(xs.par_chunks(c * h * wd))
                .for_each(|(img_out, img)| {
                    img_out
                        .par_chunks_mut(CHANNEL_BLOCK * pix)
                        .enumerate()
                        .for_each(|(blk, dst)| {
                            let c0 = blk * CHANNEL_BLOCK;
                            depthwise_block(img, &ws, bias.as_deref(), c0, &geo, dst);
                            p.act.apply(dst);
                        })
                });
        };
        let by_blocks = m == 1 && oh * ow <= small_output;
        let run = |out: &mut [f32], xs: &[f32]| {
            if by_blocks {
                blocks(out, xs)
            } else {
                planes(out, xs)
            }
        };
        // The input is read in place when it is contiguous f32, copied otherwise.
        let x = x.contiguous()?;
        if with_f32(&x, |xs| run(&mut out, xs)).is_none() {
            run(&mut out, &f32_vec(&x)?);
        }
    }
    from_f32(out, &[n, co, oh, ow])
}

/// Output planes of at most this many pixels are computed by [`depthwise_block`]: per plane,
/// the spatial path's fixed work (padding, phases, copies) outweighs its sums there. Single
/// convolutions at batch 1 and 1 thread, spatial path / blocks (medians of 50, two runs
/// each, with the spatial path's sums in AVX-512 registers): 960 channels 7x7 5x5 0.19 /
/// 0.11–0.12 ms, 672 channels 14x14 5x5 stride 2 (7x7 out) 0.25 / 0.15–0.21 ms, 480 channels
/// 14x14 3x3 0.12–0.19 / 0.15–0.16 ms (even); on 28x28 inputs the spatial path wins (120
/// channels 5x5 0.16–0.17 / 0.23–0.27 ms, 240 channels 3x3 stride 2 0.13 / 0.16–0.21 ms).
/// Once the spatial path ran its last, partial block of outputs in registers too, it won on
/// 14x14 outputs (MobileNetV3-Large at batch 8, 1 thread: 672 channels 3x3 1.58 against
/// 2.75 ms), so the line is drawn at 7x7 outputs (BENCHMARKS.md, issue 14).
const SMALL_OUTPUT: usize = 7 * 7;

/// Channels per task of [`depthwise_block`].
const CHANNEL_BLOCK: usize = 64;

/// Output planes `c0..c0 + dst.len() / (oh * ow)` of one image `img` (`[c, h, w]`) of a
/// depthwise convolution with one output channel per input channel (`ws`: `[c, kh * kw]`),
/// computed with the channels innermost: the block's input planes are transposed to
/// `[h * w, channels]`, each output pixel is its bias plus each tap in turn (taps that fall
/// in the padding skipped), a vector over the block's channels, and the result transposed
/// back into `dst`. On planes of a few pixels this vectorises over channels where the
/// spatial path works on a few pixels at a time (BENCHMARKS.md, issue 14).
fn depthwise_block(
    img: &[f32],
    ws: &[f32],
    bias: Option<&[f32]>,
    c0: usize,
    g: &PlaneGeometry,
    dst: &mut [f32],
) {
    let ([h, wd], [kh, kw], [oh, ow]) = ([g.h, g.wd], g.k, [g.oh, g.ow]);
    let (pix, kk) = (oh * ow, kh * kw);
    let cb = dst.len() / pix;
    // Rows of B values: the block's channels, then zeros up to B (a partial last block), so
    // that every sum is over a whole row, in registers.
    const B: usize = CHANNEL_BLOCK;
    let (mut xt, mut wt, mut yt) = (Spare::take(), Spare::take(), Spare::take());
    for (buf, len) in [(&mut xt, h * wd), (&mut wt, kk), (&mut yt, pix)] {
        buf.clear();
        buf.resize(len * B, 0.0);
    }
    // Transposes by tiles of T pixels, so that the rows written (or read) at once stay in
    // the L1 cache: whole planes at a time, rows B floats apart map to a quarter of its sets.
    const T: usize = 16;
    let planes = &img[c0 * h * wd..][..cb * h * wd];
    for (t, rows) in xt.chunks_mut(T * B).enumerate() {
        for (j, plane) in planes.chunks_exact(h * wd).enumerate() {
            for (row, &v) in rows.chunks_exact_mut(B).zip(&plane[t * T..]) {
                row[j] = v;
            }
        }
    }
    for (j, ker) in ws[c0 * kk..][..cb * kk].chunks_exact(kk).enumerate() {
        for (row, &v) in wt.chunks_exact_mut(B).zip(ker) {
            row[j] = v;
        }
    }
    let mut b0 = [0f32; B];
    if let Some(b) = bias {
        b0[..cb].copy_from_slice(&b[c0..c0 + cb]);
    }
    let ([sy, sx], [ph, pw], [dy, dx]) = (g.stride, g.pad, g.dilation);
    fused::simd(
        #[inline(always)]
        || {
            for (q, out) in yt.chunks_exact_mut(B).enumerate() {
                let (oy, ox) = (q / ow, q % ow);
                let mut acc = b0;
                for i in 0..kh {
                    let Some(iy) = (oy * sy + i * dy).checked_sub(ph).filter(|&y| y < h) else {
                        continue;
                    };
                    for j in 0..kw {
                        let Some(ix) = (ox * sx + j * dx).checked_sub(pw).filter(|&x| x < wd)
                        else {
                            continue;
                        };
                        let xs: &[f32; B] = xt[(iy * wd + ix) * B..][..B].try_into().unwrap();
                        let w: &[f32; B] = wt[(i * kw + j) * B..][..B].try_into().unwrap();
                        for l in 0..B {
                            acc[l] += w[l] * xs[l];
                        }
                    }
                }
                out.copy_from_slice(&acc);
            }
        },
    );
    for (t, rows) in yt.chunks(T * B).enumerate() {
        for (j, plane) in dst.chunks_exact_mut(pix).enumerate() {
            for (d, row) in plane[t * T..].iter_mut().zip(rows.chunks_exact(B)) {
                *d = row[j];
            }
        }
    }
}

/// The geometry of one depthwise convolution's planes (also read by [`depthwise_block`]),
/// and the layout [`depthwise_plane`] works in, the same for every plane.
///
/// The input plane, zero-padded to `[hp, wp]`, is split into `sy * sx` phase planes of
/// `[hq, wq] = [ceil(hp / sy), ceil(wp / sx)]`: phase `(ry, rx)` holds the padded elements
/// `(a * sy + ry, b * sx + rx)` at `(a, b)`. Output `(y, x)` reads, for tap `(i, j)`, the
/// padded element `(y * sy + i * dy, x * sx + j * dx)`; with `i * dy = qy * sy + ry` and
/// `j * dx = qx * sx + rx` that is element `(y + qy, x + qx)` of phase `(ry, rx)`. So, with
/// the output laid out at the phase width `wq`, each tap adds its weight times one
/// contiguous run of one phase plane (offset `qy * wq + qx`) to one contiguous run of the
/// output: a unit-stride multiply-add for any stride and dilation (stride 1 has a single
/// phase, the padded plane itself).
struct PlaneGeometry {
    h: usize,
    wd: usize,
    oh: usize,
    ow: usize,
    pad: [usize; 2],
    stride: [usize; 2],
    /// Kernel height and width, and dilation.
    k: [usize; 2],
    dilation: [usize; 2],
    /// Phase-plane height and width.
    hq: usize,
    wq: usize,
    /// Phases that some tap reads, as `(ry, rx)`, in slot order.
    used: Vec<[usize; 2]>,
    /// Per tap (row-major like the kernel): the start of its run in the phase buffer.
    tap_start: Vec<usize>,
}

impl PlaneGeometry {
    fn new([h, wd]: [usize; 2], [kh, kw]: [usize; 2], [oh, ow]: [usize; 2], p: &Params) -> Self {
        let [sy, sx] = p.stride.map(|s| s.max(1));
        let [dy, dx] = p.dilation;
        let (hp, wp) = (h + 2 * p.padding[0], wd + 2 * p.padding[1]);
        let (hq, wq) = (hp.div_ceil(sy), wp.div_ceil(sx));
        // For each phase `ry * sx + rx`, its slot in the phase buffer once a tap reads it.
        let mut slot = vec![None; sy * sx];
        let mut used = Vec::new();
        let mut tap_start = Vec::with_capacity(kh * kw);
        for i in 0..kh {
            for j in 0..kw {
                let (qy, ry) = ((i * dy) / sy, (i * dy) % sy);
                let (qx, rx) = ((j * dx) / sx, (j * dx) % sx);
                let s = *slot[ry * sx + rx].get_or_insert_with(|| {
                    used.push([ry, rx]);
                    used.len() - 1
                });
                tap_start.push(s * hq * wq + qy * wq + qx);
            }
        }
        PlaneGeometry {
            h,
            wd,
            oh,
            ow,
            pad: p.padding,
            stride: [sy, sx],
            k: [kh, kw],
            dilation: p.dilation,
            hq,
            wq,
            used,
            tap_start,
        }
    }
}

/// One depthwise plane (any stride, padding and dilation) as `kh * kw` long contiguous
/// multiply-adds over the phase planes of [`PlaneGeometry`], then the valid `ow` columns of
/// each `wq`-wide output row copied into `dst`. `phases` and `wide` are scratch buffers
/// reused across planes. The runs stay in bounds: a valid output `(y, x)` reads phase element
/// `(y + qy, x + qx)` with `x + qx < wq` and `y + qy < hq` (its padded coordinates are inside
/// the padded plane), so the run of a tap, `(oh - 1) * wq + ow` long from `qy * wq + qx`, ends
/// inside its phase; the columns `ow..wq` of a row are scratch that is never copied out. The
/// runs are computed rounded up to whole blocks of [`depthwise_taps`] (its AVX-512 path takes
/// whole blocks only), over as many zeros more at the end of `phases`: the outputs past the
/// last valid one are scratch too.
fn depthwise_plane(
    dst: &mut [f32],
    src: &[f32],
    ker: &[f32],
    bias: f32,
    g: &PlaneGeometry,
    phases: &mut Vec<f32>,
    wide: &mut Vec<f32>,
) {
    let ([sy, sx], [ph, pw]) = (g.stride, g.pad);
    let (hq, wq) = (g.hq, g.wq);
    // The output run, rounded up to whole blocks of `depthwise_taps` (its fast path takes
    // whole blocks only); the phases get as many zeros more, so every tap's run stays inside.
    let len = (g.oh - 1) * wq + g.ow;
    let run = len.next_multiple_of(TAP_BLOCK);
    phases.clear();
    phases.resize(g.used.len() * hq * wq + (run - len), 0.);
    for (s, &[ry, rx]) in g.used.iter().enumerate() {
        let phase = &mut phases[s * hq * wq..][..hq * wq];
        // Phase columns b whose padded column b * sx + rx is an input column (>= pw, < pw + wd).
        let b0 = pw.saturating_sub(rx).div_ceil(sx);
        let b1 = (pw + g.wd).saturating_sub(rx).div_ceil(sx).min(wq);
        if b1 <= b0 {
            continue;
        }
        let c0 = b0 * sx + rx - pw;
        for (a, prow) in phase.chunks_mut(wq).enumerate() {
            let r = a * sy + ry;
            if r < ph || r - ph >= g.h {
                continue;
            }
            let row = &src[(r - ph) * g.wd..][..g.wd];
            strided_copy(&mut prow[b0..b1], &row[c0..], sx);
        }
    }
    wide.clear();
    wide.resize(run, 0.0);
    depthwise_taps(wide, phases, ker, &g.tap_start, bias);
    for (y, row) in dst.chunks_mut(g.ow).enumerate().take(g.oh) {
        row.copy_from_slice(&wide[y * wq..][..g.ow]);
    }
}

/// `wide[i] = bias + Σ_t ker[t] * phases[starts[t] + i]`, the taps added in order (the
/// same sums as one pass over `wide` per tap), [`TAP_BLOCK`] outputs at a time summed over
/// every tap before the next block: one pass over the output instead of one per tap
/// (MobileNetV3-Large's 15 depthwise convolutions at batch 1, 1 thread: BENCHMARKS.md,
/// issue 14); whole blocks by [`taps_avx512`] where the CPU has AVX-512. Every
/// `starts[t] + wide.len()` must lie within `phases`.
fn depthwise_taps(wide: &mut [f32], phases: &[f32], ker: &[f32], starts: &[usize], bias: f32) {
    #[cfg(target_arch = "x86_64")]
    let done = if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: only instructions the CPU was just found to support.
        #[allow(unsafe_code)]
        unsafe {
            taps_avx512(wide, phases, ker, starts, bias)
        }
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    // The rest (all of it without AVX-512).
    fused::simd(
        #[inline(always)]
        || {
            let mut at = done;
            for out in wide[done..].chunks_mut(TAP_BLOCK) {
                let n = out.len();
                let mut acc = [bias; TAP_BLOCK];
                for (&k, &s) in ker.iter().zip(starts) {
                    let src = &phases[s + at..s + at + n];
                    for (a, &v) in acc[..n].iter_mut().zip(src) {
                        *a += k * v;
                    }
                }
                out.copy_from_slice(&acc[..n]);
                at += n;
            }
        },
    )
}

/// The whole [`TAP_BLOCK`]s of [`depthwise_taps`] with the four sums of a block held in
/// AVX-512 registers explicitly (the compiler kept the portable loop's sums on the stack, a
/// store and a reload per tap); the same operations in the same order (a multiply, then an
/// add: no fused multiply-add), so the same bits. Returns how many outputs it wrote (a
/// multiple of [`TAP_BLOCK`]); panics, as the portable loop does, if a tap's run leaves
/// `phases`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn taps_avx512(
    wide: &mut [f32],
    phases: &[f32],
    ker: &[f32],
    starts: &[usize],
    bias: f32,
) -> usize {
    use std::arch::x86_64::*;
    let b = _mm512_set1_ps(bias);
    let mut at = 0;
    for out in wide.chunks_exact_mut(TAP_BLOCK) {
        let mut acc = [b; 4];
        for (&k, &s) in ker.iter().zip(starts) {
            let src = &phases[s + at..s + at + TAP_BLOCK];
            let kv = _mm512_set1_ps(k);
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: `src` holds TAP_BLOCK = 4 * 16 values, and this reads 16 of them
                // from `16 * j`, j < 4 (an unaligned load).
                #[allow(unsafe_code)]
                let v = unsafe { _mm512_loadu_ps(src.as_ptr().add(16 * j)) };
                *a = _mm512_add_ps(*a, _mm512_mul_ps(kv, v));
            }
        }
        for (j, a) in acc.iter().enumerate() {
            // SAFETY: `out` holds TAP_BLOCK = 4 * 16 values, and this writes 16 of them from
            // `16 * j`, j < 4 (an unaligned store).
            #[allow(unsafe_code)]
            unsafe {
                _mm512_storeu_ps(out.as_mut_ptr().add(16 * j), *a)
            };
        }
        at += TAP_BLOCK;
    }
    at
}

/// Outputs of [`depthwise_taps`] computed together: four AVX-512 registers' worth, so that
/// four independent sums hide the latency of each addition.
const TAP_BLOCK: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::conv::{conv_gemm, Act};
    use candle_core::Device;

    /// The taps of the spatial depthwise path give, bit for bit, the bias plus each tap's
    /// product added in order (plain f32 operations): whole blocks (by AVX-512 where the CPU
    /// has it) and the last, shorter one.
    #[test]
    fn depthwise_taps_sum_in_order() {
        let len = 2 * TAP_BLOCK + 9;
        let starts = [0, 3, 17, 40, 41];
        let ker = [0.7f32, -1.3, 2.1, 0.05, -0.9];
        let phases: Vec<f32> = (0..len + 41)
            .map(|i| ((i * 37) % 101) as f32 / 7.0 - 6.0)
            .collect();
        let bias = 0.3f32;
        let mut wide = vec![f32::NAN; len];
        depthwise_taps(&mut wide, &phases, &ker, &starts, bias);
        let want: Vec<u32> = (0..len)
            .map(|i| {
                let mut a = bias;
                for (&k, &s) in ker.iter().zip(&starts) {
                    a += k * phases[s + i];
                }
                a.to_bits()
            })
            .collect();
        let got: Vec<u32> = wide.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want);
    }

    /// The phase-plane depthwise kernel (`depthwise`) on uneven sizes against candle's grouped
    /// conv2d (im2col, a different algorithm) for one stride, padding and dilation per case,
    /// and against the dense gemm path (`conv_gemm`, one channel at a time) for different
    /// strides, paddings and dilations per dim: strides 1-3, multiplier 1 and 2, taps that
    /// fall wholly in the padding, kernels as wide as the padded input, a bias. Each case
    /// runs by phase planes and (multiplier 1) by channel blocks (`depthwise_block`), with
    /// more channels than a block in the first cases.
    #[test]
    fn depthwise_phase_planes_match_other_paths() {
        let dev = Device::Cpu;
        // (input, multiplier, kernel, stride, padding, dilation)
        type Case = (
            [usize; 4],
            usize,
            [usize; 2],
            [usize; 2],
            [usize; 2],
            [usize; 2],
        );
        let cases: [Case; 15] = [
            // More channels than one block of `depthwise_block` (and a partial one).
            ([2, 70, 7, 7], 1, [5, 5], [1, 1], [2, 2], [1, 1]),
            ([1, 130, 14, 14], 1, [3, 3], [2, 2], [1, 1], [1, 1]),
            ([1, 64, 9, 8], 1, [3, 3], [1, 1], [1, 1], [1, 1]),
            ([2, 3, 11, 9], 1, [3, 3], [2, 2], [1, 1], [1, 1]),
            ([1, 4, 12, 13], 1, [5, 5], [2, 2], [2, 2], [1, 1]),
            ([1, 2, 10, 7], 2, [3, 3], [3, 3], [1, 1], [1, 1]),
            ([2, 3, 13, 14], 1, [5, 5], [3, 3], [2, 2], [2, 2]),
            ([1, 2, 9, 9], 1, [3, 3], [2, 2], [0, 0], [2, 2]),
            ([1, 3, 6, 5], 1, [3, 3], [2, 2], [4, 4], [3, 3]),
            ([1, 2, 4, 4], 1, [5, 5], [3, 3], [1, 1], [1, 1]),
            ([1, 2, 8, 8], 1, [1, 1], [2, 2], [0, 0], [1, 1]),
            // Per-dim strides, paddings and dilations (the gemm path is the reference).
            ([1, 3, 11, 10], 1, [3, 5], [2, 3], [1, 2], [1, 1]),
            ([2, 2, 9, 12], 2, [5, 3], [3, 1], [2, 0], [1, 2]),
            ([1, 2, 7, 15], 1, [3, 3], [1, 2], [0, 3], [2, 3]),
            ([1, 1, 5, 6], 1, [2, 4], [2, 3], [0, 1], [3, 1]),
        ];
        for (xs, m, [kh, kw], stride, padding, dilation) in cases {
            let c = xs[1];
            let x = Tensor::randn(0f32, 1., xs.to_vec(), &dev).unwrap();
            let w = Tensor::randn(0f32, 1., (c * m, 1, kh, kw), &dev).unwrap();
            let b = Tensor::randn(0f32, 1., c * m, &dev).unwrap();
            let p = Params {
                stride,
                padding,
                dilation,
                groups: c,
                act: Act::None,
            };
            // The spatial path for every plane, then (where it applies) channel blocks.
            let got = [0, usize::MAX].map(|small| depthwise_by(&x, &w, Some(&b), &p, small));
            let want =
                if stride[0] == stride[1] && padding[0] == padding[1] && dilation[0] == dilation[1]
                {
                    x.conv2d(&w, padding[0], stride[0], dilation[0], c).unwrap()
                } else {
                    let dense = Params { groups: 1, ..p };
                    let per_channel: Vec<Tensor> = (0..c)
                        .map(|ic| {
                            let xc = x.narrow(1, ic, 1).unwrap().contiguous().unwrap();
                            let wc = w.narrow(0, ic * m, m).unwrap().contiguous().unwrap();
                            conv_gemm(&xc, &wc, None, None, &dense)
                                .unwrap()
                                .expect("gemm path applies")
                        })
                        .collect();
                    Tensor::cat(&per_channel, 1).unwrap()
                }
                .broadcast_add(&b.reshape((1, (), 1, 1)).unwrap())
                .unwrap();
            for (got, path) in got.into_iter().zip(["planes", "blocks"]) {
                let got = got.unwrap();
                assert_eq!(got.dims(), want.dims(), "{xs:?} k {kh}x{kw}");
                let diff = crate::ops::max_abs_diff(&got, &want);
                assert!(
                    diff < 1e-4,
                    "{path}: {xs:?} m {m} k {kh}x{kw} stride {stride:?} pad {padding:?} dil {dilation:?}: {diff}"
                );
            }
        }
    }
}
