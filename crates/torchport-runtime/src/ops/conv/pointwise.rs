//! 1x1 convolutions (stride 1, no padding, groups 1) with few input channels, computed
//! directly from the NCHW input on x86-64 CPUs with AVX-512: each output row (an output
//! channel's plane) written once, its bias and residual added in registers and its
//! activation applied while the row is in the cache.
//!
//! Such a convolution is the product `w [co, c] @ x [c, pixels]` per image. With few input
//! channels (MobileNet's and EfficientNet's expansions on large planes: 16 → 64 channels on
//! 112 x 112) the gemm crate's copy of `x` into panels and the passes over the output before
//! (its bias planes) and after (its activation) cost as much as the multiply-adds: the
//! output is larger than the cache, and each pass reads it back from memory. Here the
//! output is produced in blocks of [`PIXELS`] pixels by [`ROWS`] output channels, summed
//! in registers over the input channels, read in place (BENCHMARKS.md, issue 14).

use candle_core::{DType, Tensor};

use super::{Act, Params};
use crate::error::OpResult;
use crate::ops::fused::with_f32;
use crate::ops::sgemm::{new_block, Shared};

/// Output channels a block sums together (one register each per 16 pixels).
const ROWS: usize = 6;

/// Pixels a block sums together: four registers of 16.
const PIXELS: usize = 64;

/// The most input channels this path takes. Single convolutions, least of 400 runs, old path
/// (the gemm crate's) against this one, 1 thread: 16 → 64 channels on 112 x 112 0.386 / 0.315
/// ms at batch 1, 3.95 / 3.19 at batch 8; 96 → 24 on 56 x 56 at batch 8 1.26 / 1.12; 40 → 120
/// on 28 x 28 at batch 8 0.650 / 0.615. With 120 or 240 input channels the gemm crate was as
/// fast or faster (120 → 40 on 28 x 28 at batch 1: 0.069 / 0.075 ms): their input no longer
/// fits the L1 cache along a block (BENCHMARKS.md, issue 14).
const MAX_CHANNELS: usize = 96;

/// The fewest pixels per image this path takes: on smaller planes the pixel blocks, and so
/// the pieces of work for the threads, are too few.
const MIN_PIXELS: usize = 256;

/// Input values (input channels times pixels) of the stretch of pixels along which each
/// group of [`ROWS`] output channels is computed in turn: 128 KiB, in the L2 cache, where
/// the channel groups one pixel block after another had the output's rows written as
/// scattered pieces (16 → 64 channels on 112 x 112 at batch 8, 1 thread: 5.68 ms, against
/// 3.83 along stretches).
const STRETCH_VALUES: usize = 1 << 15;

/// How far ahead (values along an input plane) the first group of rows of a stretch asks
/// for its input: four blocks. Without it, products with few output channels on planes
/// larger than the cache were up to 15% slower than the gemm crate's (32 → 16 channels on
/// 112 x 112 at batch 8, 1 thread: 1.87 against 1.55 ms; 1.74 with it, in the same run).
const PREFETCH: usize = 4 * PIXELS;

/// Pieces of work per thread the images' pixels are cut into (at least one per image), so
/// that threads that finish early find more.
const PIECES_PER_THREAD: usize = 4;

/// Whether [`pointwise`] computes a convolution of `c` input channels over `pixels` pixels
/// per image with these parameters: a 1x1 kernel, stride 1, no padding (with 1x1 the
/// dilation does not matter), groups 1, a CPU with AVX-512 and FMA.
pub(super) fn applies(c: usize, kernel: [usize; 2], pixels: usize, p: &Params) -> bool {
    kernel == [1, 1]
        && p.stride == [1, 1]
        && p.padding == [0, 0]
        && p.groups == 1
        && (1..=MAX_CHANNELS).contains(&c)
        && pixels >= MIN_PIXELS
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("fma")
}

/// The convolution of `x` (`[n, c, h, w]`) by `w` (`[co, c, 1, 1]`), both contiguous f32,
/// plus `bias` and `residual` (each optional), activated: [`pointwise`] on the tensors'
/// values. `None` (left to the other paths) for a residual that is not f32 of the output's
/// shape.
pub(super) fn conv(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&[f32]>,
    residual: Option<&Tensor>,
    act: Act,
) -> OpResult<Option<Tensor>> {
    let (n, c, h, wd) = x.dims4()?;
    let co = w.dims4()?.0;
    let residual = match residual {
        Some(r) if r.dims() == [n, co, h, wd] && r.dtype() == DType::F32 => Some(r.contiguous()?),
        Some(_) => return Ok(None),
        None => None,
    };
    let sizes = [n, c, h * wd];
    let out = with_f32(w, |w| {
        with_f32(x, |x| match &residual {
            Some(r) => with_f32(r, |r| pointwise(x, sizes, w, bias, Some(r), act)),
            None => Some(pointwise(x, sizes, w, bias, None, act)),
        })
    });
    match out.flatten().flatten() {
        Some(out) => Ok(Some(Tensor::from_vec(out, (n, co, h, wd), x.device())?)),
        None => Ok(None),
    }
}

/// `act(w @ x + bias + residual)` per image for `x: [n, c, pixels]`, `w: [co, c]`, `bias:
/// [co]` and `residual: [n, co, pixels]` (each optional), as a new `[n, co, pixels]` buffer
/// written once; the images' bands of pixels over the pool's threads. The sum of an output
/// starts from its bias and adds the input channels in order, then the residual. Panics
/// unless [`applies`] said so for these sizes and the slices have them.
pub(super) fn pointwise(
    x: &[f32],
    [n, c, pixels]: [usize; 3],
    w: &[f32],
    bias: Option<&[f32]>,
    residual: Option<&[f32]>,
    act: Act,
) -> Vec<f32> {
    use rayon::prelude::*;
    let co = w.len() / c.max(1);
    let len = n * co * pixels;
    let p = Params {
        stride: [1, 1],
        padding: [0, 0],
        dilation: [1, 1],
        groups: 1,
        act,
    };
    assert!(
        applies(c, [1, 1], pixels, &p)
            && x.len() == n * c * pixels
            && w.len() == co * c
            && bias.is_none_or(|b| b.len() == co)
            && residual.is_none_or(|r| r.len() == len),
        "pointwise conv: sizes or a CPU it does not take"
    );
    // Bands of whole blocks of pixels, enough for every thread to have a few.
    let threads = rayon::current_num_threads();
    let per_image = (PIECES_PER_THREAD * threads).div_ceil(n.max(1)).max(1);
    let band = pixels.div_ceil(per_image).next_multiple_of(PIXELS);
    let bands = pixels.div_ceil(band);
    let zeros = vec![0f32; co];
    let bias = bias.unwrap_or(&zeros);
    let work = |out: Shared, task: usize| {
        let (img, b) = (task / bands, task % bands);
        let (p0, p1) = (b * band, ((b + 1) * band).min(pixels));
        let x = &x[img * c * pixels..][..c * pixels];
        let res = residual.map(|r| &r[img * co * pixels..][..co * pixels]);
        // Stretches of the band whose input (`c` planes) stays in the L2 cache while each
        // group of output rows is computed along it.
        let stretch = (STRETCH_VALUES / c).max(PIXELS) / PIXELS * PIXELS;
        for s0 in (p0..p1).step_by(stretch) {
            let s1 = (s0 + stretch).min(p1);
            for o in (0..co).step_by(ROWS) {
                let rows = ROWS.min(co - o);
                // SAFETY: `applies` found AVX-512 and FMA; the blocks' pixels `q..q + np`
                // lie inside every plane, their rows `o..o + rows` inside the output's
                // channels (both asserted above), and this task alone writes the image's
                // pixels `p0..p1`, so nothing else touches them.
                #[allow(unsafe_code)]
                unsafe {
                    let dst = out.0.add(img * co * pixels);
                    for q in (s0..s1).step_by(PIXELS) {
                        let np = PIXELS.min(s1 - q);
                        block_avx512(x, pixels, w, bias, res, [o, rows], [q, np], dst);
                    }
                    if act != Act::None {
                        for r in o..o + rows {
                            act.apply(std::slice::from_raw_parts_mut(
                                dst.add(r * pixels + s0),
                                s1 - s0,
                            ));
                        }
                    }
                }
            }
        }
    };
    // SAFETY: the tasks cover every image's pixels `0..pixels` (bands of `band`) for every
    // output channel (blocks of `ROWS`), and `block_avx512` writes each element of its block
    // before anything reads it.
    #[allow(unsafe_code)]
    let out = unsafe {
        new_block(len, |out| {
            (0..n * bands).into_par_iter().for_each(|t| work(out, t));
            true
        })
    };
    out.expect("the pointwise conv writes every element")
}

/// Output channels `o..o + rows` (`rows <= ROWS`) at pixels `q..q + np` (`np <= PIXELS`) of
/// one image: `bias[o + r]` plus `w[o + r, i] * x[i, pixel]` for each input channel `i` in
/// order, plus the residual's element, stored at `dst[(o + r) * pixels + pixel]`.
///
/// # Safety
/// AVX-512F and FMA; `x` holds `c = w.len() / bias.len()` planes of `pixels`, `w` is `[co,
/// c]` with `co = bias.len()`, `o + rows <= co`, `q + np <= pixels`, `res` (if any) holds
/// `co` planes of `pixels`, and `dst` points to `co` planes of `pixels` that nothing else
/// reads or writes at the block's elements meanwhile.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
#[allow(unsafe_code, clippy::too_many_arguments)]
unsafe fn block_avx512(
    x: &[f32],
    pixels: usize,
    w: &[f32],
    bias: &[f32],
    res: Option<&[f32]>,
    [o, rows]: [usize; 2],
    [q, np]: [usize; 2],
    dst: *mut f32,
) {
    use std::arch::x86_64::*;
    const V: usize = PIXELS / 16;
    let c = w.len() / bias.len();
    let mask = |i: usize| -> __mmask16 {
        let n = np.saturating_sub(16 * i).min(16);
        ((1u32 << n) - 1) as u16
    };
    let masks: [__mmask16; V] = std::array::from_fn(mask);
    // Rows past the last output channel repeat it: computed, never stored.
    let row = |r: usize| o + r.min(rows - 1);
    let mut acc = [[_mm512_setzero_ps(); V]; ROWS];
    for (r, a) in acc.iter_mut().enumerate() {
        *a = [_mm512_set1_ps(bias[row(r)]); V];
    }
    let wp = w.as_ptr();
    let xp = x.as_ptr().add(q);
    for i in 0..c {
        let at = xp.add(i * pixels);
        // The first group of rows reads the stretch's input from memory: ask for it ahead.
        if o == 0 {
            for v in 0..V {
                _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(PREFETCH + 16 * v).cast());
            }
        }
        let xs: [__m512; V] =
            std::array::from_fn(|v| _mm512_maskz_loadu_ps(masks[v], at.add(16 * v)));
        for (r, a) in acc.iter_mut().enumerate() {
            let wv = _mm512_set1_ps(*wp.add(row(r) * c + i));
            for (a, &xv) in a.iter_mut().zip(&xs) {
                *a = _mm512_fmadd_ps(wv, xv, *a);
            }
        }
    }
    for (r, a) in acc.iter().enumerate().take(rows) {
        let at = (o + r) * pixels + q;
        for (v, &s) in a.iter().enumerate() {
            let s = match res {
                Some(res) => _mm512_add_ps(
                    s,
                    _mm512_maskz_loadu_ps(masks[v], res.as_ptr().add(at + 16 * v)),
                ),
                None => s,
            };
            _mm512_mask_storeu_ps(dst.add(at + 16 * v), masks[v], s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.0) - 1.0)
            .collect()
    }

    /// Against sums in f64 (then the same activation): row counts that are not a multiple
    /// of a block's six (7, 13), planes that end inside a block (300, 257 pixels), one and
    /// 96 input channels, a batch, with and without bias and residual, each activation.
    #[test]
    fn pointwise_matches_f64_sums() {
        // (n, c, co, pixels, bias, residual, act)
        let cases = [
            (2, 3, 7, 300, true, true, Act::Relu),
            (1, 96, 13, 257, false, false, Act::Silu),
            (3, 1, 6, 256, true, false, Act::Hardswish),
            (1, 16, 64, 3136, true, false, Act::None),
            (2, 40, 20, 1000, false, true, Act::None),
        ];
        for (n, c, co, pixels, with_bias, with_res, act) in cases {
            let p = Params {
                stride: [1, 1],
                padding: [0, 0],
                dilation: [1, 1],
                groups: 1,
                act,
            };
            if !applies(
                16,
                [1, 1],
                256,
                &Params {
                    act: Act::None,
                    ..p
                },
            ) {
                return; // no AVX-512 here: the path is never taken
            }
            assert!(applies(c, [1, 1], pixels, &p));
            let x = values(n * c * pixels, 1);
            let w = values(co * c, 2);
            let bias = with_bias.then(|| values(co, 3));
            let res = with_res.then(|| values(n * co * pixels, 4));
            let got = pointwise(&x, [n, c, pixels], &w, bias.as_deref(), res.as_deref(), act);
            let mut want = vec![0f32; n * co * pixels];
            for img in 0..n {
                for o in 0..co {
                    for q in 0..pixels {
                        let mut s = bias.as_ref().map_or(0.0, |b| b[o] as f64);
                        for i in 0..c {
                            s += w[o * c + i] as f64 * x[(img * c + i) * pixels + q] as f64;
                        }
                        let at = (img * co + o) * pixels + q;
                        s += res.as_ref().map_or(0.0, |r| r[at] as f64);
                        want[at] = s as f32;
                    }
                }
            }
            act.apply(&mut want);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                    "n {n} c {c} co {co} pixels {pixels}: element {i}: {g} against {w}"
                );
            }
        }
    }

    /// The path takes 1x1, stride-1, unpadded, ungrouped convolutions of at most
    /// `MAX_CHANNELS` input channels on planes of at least `MIN_PIXELS`, and no other.
    #[test]
    fn pointwise_applies_only_where_it_computes() {
        let p = Params {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
            act: Act::None,
        };
        if !applies(16, [1, 1], 256, &p) {
            return; // no AVX-512 here
        }
        assert!(applies(MAX_CHANNELS, [1, 1], MIN_PIXELS, &p));
        assert!(!applies(MAX_CHANNELS + 1, [1, 1], 4096, &p));
        assert!(!applies(16, [1, 1], MIN_PIXELS - 1, &p));
        assert!(!applies(0, [1, 1], 4096, &p));
        assert!(!applies(16, [3, 3], 4096, &p));
        assert!(!applies(
            16,
            [1, 1],
            4096,
            &Params {
                stride: [2, 2],
                ..p
            }
        ));
        assert!(!applies(
            16,
            [1, 1],
            4096,
            &Params {
                padding: [0, 1],
                ..p
            }
        ));
        assert!(!applies(16, [1, 1], 4096, &Params { groups: 2, ..p }));
    }

    /// A convolution node that takes this path (through `conv`, with bias, a residual and
    /// an activation) gives candle's own conv2d plus the bias and residual, activated.
    #[test]
    fn conv_by_this_path_matches_candle() {
        let dev = Device::Cpu;
        let (n, c, co, h, wd) = (2, 24, 30, 20, 17);
        let p = Params {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
            act: Act::Relu,
        };
        if !applies(c, [1, 1], h * wd, &p) {
            return; // no AVX-512 here
        }
        let x = Tensor::randn(0f32, 1., (n, c, h, wd), &dev).unwrap();
        let w = Tensor::randn(0f32, 1., (co, c, 1, 1), &dev).unwrap();
        let b = Tensor::randn(0f32, 1., co, &dev).unwrap();
        let r = Tensor::randn(0f32, 1., (n, co, h, wd), &dev).unwrap();
        let got = super::super::conv(&x, &w, Some(&b), Some(&r), &p).unwrap();
        let want = x
            .conv2d(&w, 0, 1, 1, 1)
            .unwrap()
            .broadcast_add(&b.reshape((1, co, 1, 1)).unwrap())
            .unwrap()
            .add(&r)
            .unwrap()
            .relu()
            .unwrap();
        let diff = crate::ops::max_abs_diff(&got, &want);
        assert!(diff < 1e-4, "{diff}");
    }
}
