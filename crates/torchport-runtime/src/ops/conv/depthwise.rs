//! Depthwise convolutions (groups == input channels, any channel multiplier, stride, padding
//! and dilation) by direct kernels, one of three paths (`Path`): small output planes by
//! blocks of channels held innermost (`depthwise_block`); 3x3 and 5x5 kernels on AVX-512
//! CPUs read from the input planes in place with masked loads (`plane_avx512`); anything
//! else by the planes' stride phases (`PlaneGeometry`, `depthwise_plane`).

use std::mem::MaybeUninit;

use candle_core::Tensor;

use super::{out_len, small_f32, Params};
use crate::error::OpResult;
use crate::op_bail;
use crate::ops::fused::{with_f32, Spare};
use crate::ops::{f32_vec, from_f32};
use blocks::{depthwise_block, BlockPlan, CHANNEL_BLOCK, SMALL_OUTPUT};
use in_place::plane_in_place;
use phases::{depthwise_plane, PlaneGeometry};

mod blocks;
mod in_place;
mod phases;

/// Direct depthwise convolution: weight [C*m, 1, kh, kw], groups = C, by the path
/// [`Path::choose`] picks.
pub(super) fn depthwise(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    p: &Params,
) -> OpResult<Tensor> {
    depthwise_by(x, w, bias, p, None)
}

/// How [`depthwise`] computes its output planes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    /// Each plane from its input plane in place ([`plane_in_place`]): 3x3 and 5x5 kernels
    /// as [`Path::in_place_applies`] says, on CPUs with AVX-512.
    InPlace,
    /// Each plane by the phase planes of [`PlaneGeometry`] ([`depthwise_plane`]): any case.
    Phases,
    /// Blocks of channels innermost ([`depthwise_block`]): one output channel per input
    /// channel.
    Blocks,
    /// [`Path::Blocks`] without AVX-512 even where the CPU has it: never chosen, for tests
    /// of the path other CPUs take.
    #[cfg_attr(not(test), allow(dead_code))]
    PortableBlocks,
}

impl Path {
    /// The fastest path that applies (MobileNetV3-Large's convolutions, BENCHMARKS.md,
    /// issue 14): blocks of channels for output planes of at most [`SMALL_OUTPUT`] pixels,
    /// else in place where it applies, else blocks for strides above 1 (where the phase
    /// planes cost a pass of their own), else phase planes.
    fn choose(
        m: usize,
        stride: [usize; 2],
        k: [usize; 2],
        dilation: [usize; 2],
        out_pixels: usize,
    ) -> Path {
        if m == 1 && out_pixels <= SMALL_OUTPUT {
            Path::Blocks
        } else if Path::in_place_applies(stride, k, dilation) {
            Path::InPlace
        } else if m == 1 && stride != [1, 1] {
            Path::Blocks
        } else {
            Path::Phases
        }
    }

    /// Whether [`Path::InPlace`] can run: a 3x3 or 5x5 kernel at equal strides of 1 or 2,
    /// dilation 1, a CPU with AVX-512 and FMA.
    fn in_place_applies(stride: [usize; 2], k: [usize; 2], dilation: [usize; 2]) -> bool {
        let fits = dilation == [1, 1]
            && (stride == [1, 1] || stride == [2, 2])
            && (k == [3, 3] || k == [5, 5]);
        #[cfg(target_arch = "x86_64")]
        {
            fits && std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("fma")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = fits;
            false
        }
    }
}

/// [`depthwise`] by `path` (or the one [`Path::choose`] picks); errors if `path` does not
/// apply.
fn depthwise_by(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    p: &Params,
    path: Option<Path>,
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
    let stride = p.stride.map(|s| s.max(1));
    let path = path.unwrap_or_else(|| Path::choose(m, stride, [kh, kw], p.dilation, oh * ow));
    if (matches!(path, Path::Blocks | Path::PortableBlocks) && m != 1)
        || (path == Path::InPlace && !Path::in_place_applies(stride, [kh, kw], p.dilation))
    {
        op_bail!("the depthwise path {path:?} does not apply");
    }
    // Every path writes each output value once (its activation applied): new memory, not
    // zeroed first (a pass as long as the convolution's own on large planes).
    let len = n * co * oh * ow;
    let mut out: Vec<f32> = Vec::with_capacity(len);
    let mut compute = |ws: &[f32]| {
        if oh * ow == 0 {
            return Ok(());
        }
        let geo = PlaneGeometry::new([h, wd], [kh, kw], [oh, ow], p);
        let planes = |out: &mut [MaybeUninit<f32>], xs: &[f32]| {
            out.par_chunks_mut(oh * ow).enumerate().for_each_init(
                || match path {
                    Path::InPlace => (Spare::take(), Spare::take()),
                    _ => geo.scratch(),
                },
                |(phases, wide), (i, dst)| {
                    let (b, oc) = (i / co, i % co);
                    let src = &xs[(b * c + oc / m) * h * wd..][..h * wd];
                    let ker = &ws[oc * kh * kw..][..kh * kw];
                    let b0 = bias.as_ref().map_or(0., |bias| bias[oc]);
                    if path == Path::InPlace {
                        plane_in_place(dst, src, ker, b0, p.act, &geo);
                    } else {
                        depthwise_plane(dst, src, ker, b0, p.act, &geo, (phases, wide));
                    }
                },
            )
        };
        // Small output planes with one output channel per input channel: blocks of channels, each
        // computed with the channels innermost (see `depthwise_block`).
        let plan = matches!(path, Path::Blocks | Path::PortableBlocks)
            .then(|| BlockPlan::new(ws, &geo, p.act));
        let blocks = |out: &mut [MaybeUninit<f32>], xs: &[f32], plan: &BlockPlan| {
            let pix = oh * ow;
            out.par_chunks_mut(co * pix)
                .zip(xs.par_chunks(c * h * wd))
                .for_each(|(img_out, img)| {
                    img_out
                        .par_chunks_mut(CHANNEL_BLOCK * pix)
                        .enumerate()
                        .for_each(|(blk, dst)| {
                            let c0 = blk * CHANNEL_BLOCK;
                            let simd = path == Path::Blocks;
                            let b = bias.as_deref();
                            depthwise_block(img, plan, b, c0, &geo, dst, simd);
                        })
                });
        };
        let run = |out: &mut [MaybeUninit<f32>], xs: &[f32]| match &plan {
            Some(plan) => blocks(out, xs, plan),
            None => planes(out, xs),
        };
        // The input is read in place when it is contiguous f32, copied otherwise.
        let x = x.contiguous()?;
        let spare = &mut out.spare_capacity_mut()[..len];
        if with_f32(&x, |xs| run(spare, xs)).is_none() {
            run(spare, &f32_vec(&x)?);
        }
        // SAFETY: `run` wrote all `len` values of the capacity (every path writes each value
        // of each plane or block it is given, and the planes and blocks cover the output).
        #[allow(unsafe_code)]
        unsafe {
            out.set_len(len)
        };
        Ok::<(), crate::error::OpError>(())
    };
    // The weights are read in place when contiguous f32 (a parameter's), copied otherwise.
    let w = w.contiguous()?;
    match with_f32(&w, &mut compute) {
        Some(done) => done?,
        None => compute(&f32_vec(&w)?)?,
    }
    from_f32(out, &[n, co, oh, ow])
}

#[cfg(test)]
mod tests {
    use super::phases::{depthwise_taps, TAP_BLOCK};
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

    /// The depthwise kernels (`depthwise`, every path, each activation they apply as they
    /// write: none, relu, hardswish, silu) on uneven sizes against candle's grouped
    /// conv2d (im2col, a different algorithm) for one stride, padding and dilation per case,
    /// and against the dense gemm path (`conv_gemm`, one channel at a time) for different
    /// strides, paddings and dilations per dim: strides 1-3, multiplier 1 and 2, taps that
    /// fall wholly in the padding, kernels as wide as the padded input, a bias. Each case
    /// runs by every path that applies on the CPU: phase planes, channel blocks (`depthwise_
    /// block`, multiplier 1, with and without AVX-512; more channels than a block in the
    /// first cases), in place
    /// (3x3 and 5x5 at strides 1 and 2, with AVX-512: rows wider than one or two
    /// chunks of 16, padding beyond the plane, a plane of height 1).
    #[test]
    fn depthwise_paths_match_other_algorithms() {
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
        let cases: [Case; 25] = [
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
            // Stride 1 (in place where the CPU can): rows of several chunks of 16, output
            // heights of one, two and more groups of rows (four, or eight for 3x3), padding
            // wider than the taps reach into the plane, unequal paddings per dim.
            ([1, 3, 5, 37], 1, [3, 3], [1, 1], [1, 1], [1, 1]),
            ([1, 2, 19, 21], 1, [3, 3], [1, 1], [1, 1], [1, 1]),
            ([2, 2, 6, 33], 2, [5, 5], [1, 1], [2, 2], [1, 1]),
            ([1, 2, 4, 17], 1, [5, 5], [1, 1], [3, 3], [1, 1]),
            ([1, 2, 3, 20], 1, [3, 3], [1, 1], [0, 4], [1, 1]),
            ([1, 2, 1, 40], 1, [3, 3], [1, 1], [1, 1], [1, 1]),
            // Stride 2 on rows of several chunks (in place: two loads a chunk).
            ([1, 2, 7, 70], 1, [3, 3], [2, 2], [1, 1], [1, 1]),
            ([2, 2, 9, 40], 2, [3, 3], [2, 2], [0, 0], [1, 1]),
            ([1, 2, 9, 50], 1, [5, 5], [2, 2], [2, 2], [1, 1]),
            ([1, 2, 23, 40], 1, [5, 5], [2, 2], [2, 2], [1, 1]),
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
            // Every path that applies on this CPU.
            let paths = [
                Path::Phases,
                Path::Blocks,
                Path::PortableBlocks,
                Path::InPlace,
            ];
            let paths = paths.into_iter().filter(|&path| match path {
                Path::Phases => true,
                Path::Blocks | Path::PortableBlocks => m == 1,
                Path::InPlace => Path::in_place_applies(stride, [kh, kw], dilation),
            });
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
                            conv_gemm(&xc, super::super::Weight::Dense(&wc), None, None, &dense)
                                .unwrap()
                                .expect("gemm path applies")
                        })
                        .collect();
                    Tensor::cat(&per_channel, 1).unwrap()
                }
                .broadcast_add(&b.reshape((1, (), 1, 1)).unwrap())
                .unwrap();
            let acts = [Act::None, Act::Relu, Act::Hardswish, Act::Silu];
            let wants: Vec<Tensor> = acts.iter().map(|a| a.apply_to(&want).unwrap()).collect();
            for path in paths {
                for (&act, want) in acts.iter().zip(&wants) {
                    // The output is new memory each path writes once: a freed buffer of its
                    // size, full of NaN, is what the allocator hands out next, so a value
                    // left unwritten shows.
                    drop(std::hint::black_box(vec![f32::NAN; want.elem_count()]));
                    let p = Params { act, ..p };
                    let got = depthwise_by(&x, &w, Some(&b), &p, Some(path)).unwrap();
                    assert_eq!(got.dims(), want.dims(), "{xs:?} k {kh}x{kw}");
                    let diff = crate::ops::max_abs_diff(&got, want);
                    assert!(
                        diff < 1e-4,
                        "{path:?} {act:?}: {xs:?} m {m} k {kh}x{kw} stride {stride:?} pad {padding:?} dil {dilation:?}: {diff}"
                    );
                }
            }
        }
    }
}
