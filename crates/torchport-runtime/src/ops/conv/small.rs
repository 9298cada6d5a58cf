//! Convolutions (groups 1, float32) on small output planes, with the weight packed at load
//! for the gemm's microkernel ([`crate::ops::packed`]), output channels along its registers.
//!
//! The general path computes each image's `w [co, k] @ cols [k, pixels]` through the gemm
//! crate, which puts the pixels along the microkernel's registers (16 lanes each, 64 to a
//! panel). A 7 x 7 plane has 49 pixels: a panel of 64 with 15 lanes idle, its results
//! written back element by element. Here the product is `cols.T [pixels, k] @ w.T`, the
//! packed weight's panels of 64 output channels along the registers (1152 channels fill 18
//! panels), in one band of output channels per thread into a `[pixels, band]` buffer of
//! that thread's, from which the same thread then writes each of its channels' planes with
//! the bias, the residual and the activation. Single convolutions on 7 x 7,
//! least of 200, 1 thread, the gemm crate's path against this one: 192 → 1152 channels 1x1
//! 0.279 / 0.249 ms, 2048 → 512 1.20 / 0.95, ResNet's 512-channel 3x3 3.09 / 2.75
//! (BENCHMARKS.md, issue 14). On 14 x 14 the pixels fill all but the last panel and the two
//! paths were within 0.90–1.04x of each other (1.13x the other way once, on 2 threads):
//! `prepare::pack_small_convs` packs only convolutions whose output plane has at most
//! [`MAX_PIXELS`] pixels.

use candle_core::{DType, Tensor};

use super::{fused_residual, im2col, out_len, reads_in_place, Act, Params, Shape};
use crate::error::OpResult;
use crate::op_bail;
use crate::ops::fused::{with_f32, Spare};
use crate::ops::packed::{product_bands, sgemm_packed, Packed, Packing};
use crate::ops::sgemm::{Mat, Shared};
use crate::ops::tile::{transpose, SIDE};
use crate::ops::{float, Registry};
use crate::value::{one, Args, Outputs};

/// The node target of a convolution whose weight is packed: the arguments of
/// `aten.conv2d.default` (`input`, `weight`, `bias`, `stride`, `padding`, `dilation`; groups
/// 1), the fused activation and residual if any, and `weight_shape`, the weight's
/// `[out_channels, in_channels, kh, kw]`; `weight` holds the `[out_channels, in_channels *
/// kh * kw]` matrix packed ([`Packing`]), 1-d.
pub const TARGET: &str = "torchport.conv2d_packed.default";

/// The most output pixels per image for which a convolution's weight is packed (7 x 7 and
/// smaller planes; see the module's docs).
pub const MAX_PIXELS: usize = 64;

/// Register the kernel.
pub fn register(r: &mut Registry) {
    r.add(TARGET, conv2d_packed);
}

/// `torchport.conv2d_packed`.
fn conv2d_packed(a: &Args) -> OpResult<Outputs> {
    let x = float(&a.tensor("input")?)?;
    let w = a.tensor("weight")?;
    let ([co, ci, kh, kw], p) = super::rewritten_conv(a)?;
    let (n, c, h, wd) = match x.dims() {
        &[n, c, h, wd] if x.dtype() == DType::F32 => (n, c, h, wd),
        d => op_bail!(
            "a packed convolution takes a float32 [N, C, H, W] input, got {:?} {d:?}",
            x.dtype()
        ),
    };
    if c != ci {
        op_bail!("input of {c} channels for a weight of {ci} input channels");
    }
    let oh = out_len(h, kh, p.padding[0], p.stride[0], p.dilation[0])?;
    let ow = out_len(wd, kw, p.padding[1], p.stride[1], p.dilation[1])?;
    let bias = a
        .opt_tensor("bias")?
        .map(|b| -> OpResult<Vec<f32>> { Ok(float(&b)?.flatten_all()?.to_vec1::<f32>()?) })
        .transpose()?;
    if bias.as_ref().is_some_and(|b| b.len() != co) {
        op_bail!(
            "bias of {} values for {co} output channels",
            bias.unwrap().len()
        );
    }
    let residual = fused_residual(a, false)?
        .map(|r| {
            if r.dims() != [n, co, oh, ow] || r.dtype() != DType::F32 {
                op_bail!(
                    "residual of shape {:?} for an output of shape {:?}",
                    r.dims(),
                    [n, co, oh, ow]
                );
            }
            Ok(r.contiguous()?)
        })
        .transpose()?;
    let Some(packing) = Packing::detect() else {
        op_bail!("this CPU has no microkernel for packed weights");
    };
    let Some(k) = ci.checked_mul(kh).and_then(|v| v.checked_mul(kw)) else {
        op_bail!("weight_shape {:?} is too large", [co, ci, kh, kw]);
    };
    if w.rank() != 1 || packing.len(co, k) != Some(w.elem_count()) || w.dtype() != DType::F32 {
        op_bail!(
            "packed weight of shape {:?} does not hold [{co}, {k}] for this CPU's microkernel",
            w.dims()
        );
    }
    let x = x.contiguous()?;
    let shape = Shape {
        input: [n, c, h, wd],
        kernel: [kh, kw],
        out: [oh, ow],
    };
    let run = |res: Option<&[f32]>| {
        with_f32(&w, |wd| {
            let w = Packed {
                packing,
                data: wd,
                n: co,
                k,
            };
            with_f32(&x, |xs| conv(xs, w, &shape, bias.as_deref(), res, &p))
        })
        .flatten()
        .flatten()
    };
    let out = match &residual {
        Some(r) => with_f32(r, |rs| run(Some(rs))).flatten(),
        None => run(None),
    };
    match out {
        Some(y) => one(Tensor::from_vec(y, (n, co, oh, ow), x.device())?),
        None => op_bail!("packed convolution: an operand does not fit its shape"),
    }
}

/// The convolution of the images in `xs` (`shape.input`) by the packed weight `w` (`[co,
/// k]`), as one `[n, co, oh, ow]` buffer: `act(conv + bias + residual)`. Images side by side
/// over the pool's threads, each image's product and planes split over its share of them
/// in bands of output channels (`super::share`: none where there are at least as many
/// images as threads). `None` when a view does not fit.
fn conv(
    xs: &[f32],
    w: Packed,
    shape: &Shape,
    bias: Option<&[f32]>,
    residual: Option<&[f32]>,
    p: &Params,
) -> Option<Vec<f32>> {
    use rayon::prelude::*;
    let [n, c, h, wd] = shape.input;
    let (co, pix) = (w.n, shape.out[0] * shape.out[1]);
    let (per_in, per_out) = (c * h * wd, co * pix);
    let mut out = vec![0f32; n * per_out];
    if per_out == 0 {
        return Some(out);
    }
    let direct = reads_in_place(shape.kernel, p);
    if direct && pix == 1 {
        // One pixel per image (a squeeze-and-excitation's convolutions): the output `[n,
        // co]` is the product's own layout, so all images are one product, a row each, onto
        // the bias rows and the residual.
        if let Some(r) = residual {
            out.copy_from_slice(&r[..n * per_out]);
        }
        if let Some(b) = bias {
            out.chunks_exact_mut(co)
                .for_each(|row| row.iter_mut().zip(b).for_each(|(d, &b)| *d += b));
        }
        let x = Mat::rows(&xs[..n * per_in], per_in);
        let ok = sgemm_packed(
            n,
            x,
            w,
            &mut out,
            co,
            true,
            1.0,
            rayon::current_num_threads(),
        );
        p.act.apply(&mut out);
        return ok.then_some(out);
    }
    // Image `i` into `dst`, its work split for `threads` threads.
    let image = |i: usize, dst: &mut [f32], threads: usize| -> bool {
        let parallel = threads > 1;
        let mut cols = Spare::take();
        let img = &xs[i * per_in..][..per_in];
        let cols: &[f32] = if direct {
            img
        } else {
            cols.resize(w.k * pix, 0.0);
            im2col(
                img,
                [c, h, wd],
                shape.kernel,
                shape.out,
                p,
                &mut cols,
                parallel,
            );
            &cols
        };
        // cols.T: pixel j's column kk at kk * pix + j.
        let x = Mat {
            data: cols,
            rs: 1,
            cs: pix,
        };
        let res = residual.map(|r| &r[i * per_out..][..per_out]);
        let planes = Shared(dst.as_mut_ptr());
        let done = |chans: std::ops::Range<usize>, prod: &[f32]| {
            // SAFETY: `dst` holds `co` planes of `pix` values, `product_bands` hands each
            // output channel to exactly one call, and `dst`'s borrow keeps anything else
            // from touching it until it returns.
            #[allow(unsafe_code)]
            let band = unsafe {
                std::slice::from_raw_parts_mut(
                    planes.ptr().add(chans.start * pix),
                    chans.len() * pix,
                )
            };
            finish_band(prod, pix, chans.start, bias, res, p.act, band);
        };
        product_bands(pix, x, w, threads, &done)
    };
    let share = super::share(n, rayon::current_num_threads());
    let ok = out
        .par_chunks_mut(per_out)
        .enumerate()
        .all(|(i, dst)| image(i, dst, share));
    ok.then_some(out)
}

/// Writes the planes of output channels `first..` (`dst`, `[channels, pixels]`) from their
/// band of the product (`prod`, `[pixels, channels]`): each plane, plus its bias and
/// residual, through the activation. The planes are transposed from the band in 16 x 16
/// tiles (`tile`), then finished a channel at a time. Reading a channel's plane straight down
/// the whole product instead went one row of `co` values at a time, with 512 or more channels
/// the same cache set each time: 1.4% of ResNet-50's time at batch 1 (`perf`). Written from
/// the whole product in a pass of its own after it, split over the threads apart from the
/// product's split, the planes of MobileNetV3's 160 → 960 convolutions on 7 x 7 took 25 µs
/// of their 0.18 ms on 1 thread and 32 µs on 2 (BENCHMARKS.md, issue 14).
fn finish_band(
    prod: &[f32],
    pix: usize,
    first: usize,
    bias: Option<&[f32]>,
    residual: Option<&[f32]>,
    act: Act,
    dst: &mut [f32],
) {
    let n = dst.len() / pix;
    for c0 in (0..n).step_by(SIDE) {
        for j0 in (0..pix).step_by(SIDE) {
            let (cn, jn) = (SIDE.min(n - c0), SIDE.min(pix - j0));
            transpose(prod, j0 * n + c0, n, jn, cn, dst, c0 * pix + j0, pix);
        }
    }
    for (r, row) in dst.chunks_exact_mut(pix).enumerate() {
        let o = first + r;
        if let Some(b) = bias {
            row.iter_mut().for_each(|d| *d += b[o]);
        }
        if let Some(res) = residual {
            let res = &res[o * pix..][..pix];
            row.iter_mut().zip(res).for_each(|(d, r)| *d += r);
        }
        act.apply(row);
    }
}

/// The `[co, ci, kh, kw]` f32 weight `w` packed for this CPU's microkernel as the `[co, ci *
/// kh * kw]` matrix it is, 1-d, in a new buffer (the weights `Program::load` decodes are
/// packed as they are decoded instead); `None` where there is no microkernel or `w`
/// is not so.
pub fn pack_weight(w: &Tensor) -> Option<Tensor> {
    let packing = Packing::detect()?;
    let (co, ci, kh, kw) = w.dims4().ok()?;
    let k = ci * kh * kw;
    let w = w.contiguous().ok()?;
    let packed = with_f32(&w, |src| {
        let mut dst = crate::allocator::weight_buffer(packing.len(co, k)?);
        packing.pack_f32_into(src, co, k, &mut dst).then_some(dst)
    })??;
    Tensor::from_vec(packed, packing.len(co, k)?, w.device()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// `act(conv2d(x, w) + bias + residual)` by candle's own convolution, for comparison.
    fn reference(x: &Tensor, w: &Tensor, b: &Tensor, r: &Tensor, p: &Params) -> Tensor {
        let y = x
            .conv2d(w, p.padding[0], p.stride[0], p.dilation[0], 1)
            .unwrap();
        let y = y.broadcast_add(&b.reshape((1, (), 1, 1)).unwrap()).unwrap();
        let y = (y + r).unwrap();
        match p.act {
            Act::Relu => y.relu().unwrap(),
            _ => y,
        }
    }

    /// The packed kernel against candle's convolution: 1x1 at stride 1 (the input read in
    /// place; on one pixel, the images as one product), strided, padded and dilated 3x3
    /// (unfolded), output channels that leave the last panel part-filled, more input
    /// columns than one block of the microkernel, batches over the pool's threads and
    /// within each product, planes written by several tasks, with bias, residual and relu.
    #[test]
    fn packed_convolutions_match_candles() {
        let dev = Device::Cpu;
        if Packing::detect().is_none() {
            return;
        }
        // (input [n, c, h, w], out channels, kernel, stride, padding, dilation)
        let cases: [([usize; 4], usize, usize, usize, usize, usize); 8] = [
            ([1, 24, 7, 7], 70, 1, 1, 0, 1),
            ([1, 8, 7, 7], 700, 1, 1, 0, 1),
            ([3, 24, 7, 7], 70, 1, 1, 0, 1),
            ([1, 40, 1, 1], 130, 1, 1, 0, 1),
            ([5, 40, 1, 1], 130, 1, 1, 0, 1),
            ([2, 16, 13, 11], 33, 3, 2, 1, 1),
            ([1, 300, 6, 6], 64, 3, 1, 2, 2),
            ([1, 8, 1, 1], 16, 3, 1, 1, 1),
        ];
        // Two threads (a batch image by image, a lone image split) and eight (fewer images
        // than threads: side by side, each split over its share).
        let pools = [2, 8].map(|t| rayon::ThreadPoolBuilder::new().num_threads(t).build());
        for ((dims, co, k, s, pd, d), pool) in cases
            .into_iter()
            .flat_map(|c| pools.iter().map(move |p| (c, p.as_ref().unwrap())))
        {
            for act in [Act::None, Act::Relu] {
                let x = Tensor::randn(0f32, 1., dims.to_vec(), &dev).unwrap();
                let w = Tensor::randn(0f32, 0.1, (co, dims[1], k, k), &dev).unwrap();
                let b = Tensor::randn(0f32, 1., co, &dev).unwrap();
                let p = Params {
                    stride: [s, s],
                    padding: [pd, pd],
                    dilation: [d, d],
                    groups: 1,
                    act,
                };
                let r0 = x.conv2d(&w, pd, s, d, 1).unwrap();
                let r = Tensor::randn(0f32, 1., r0.dims(), &dev).unwrap();
                let want = reference(&x, &w, &b, &r, &p);
                let packed = pack_weight(&w).unwrap();
                let (oh, ow) = (r0.dims()[2], r0.dims()[3]);
                let shape = Shape {
                    input: dims,
                    kernel: [k, k],
                    out: [oh, ow],
                };
                let w = Packed {
                    packing: Packing::detect().unwrap(),
                    data: &packed.to_vec1::<f32>().unwrap(),
                    n: co,
                    k: dims[1] * k * k,
                };
                let xs = x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                let bs = b.to_vec1::<f32>().unwrap();
                let rs = r.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                let got = pool
                    .install(|| conv(&xs, w, &shape, Some(&bs), Some(&rs), &p))
                    .unwrap();
                let want = want.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                assert_eq!(got.len(), want.len());
                let worst = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(
                    worst < 1e-4,
                    "{dims:?} -> {co} k{k} s{s} p{pd} d{d}, {} threads: {worst}",
                    pool.current_num_threads()
                );
            }
        }
    }

    /// The node as the load writes it runs; crafted ones are refused with an error each:
    /// a packed weight of the wrong length, a `weight_shape` that is not 4 sizes, an input
    /// of other channels, rank or dtype, a residual of another shape, groups other than 1.
    #[test]
    fn crafted_nodes_are_refused() {
        use serde_json::json;
        let Some(pk) = Packing::detect() else {
            return;
        };
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 1., (1, 8, 3, 3), &dev).unwrap();
        let w = Tensor::randn(0f32, 1., (4, 8, 1, 1), &dev).unwrap();
        let packed = pack_weight(&w).unwrap();
        assert_eq!(packed.elem_count(), pk.len(4, 8).unwrap());
        let short = packed.narrow(0, 1, packed.elem_count() - 1).unwrap();
        let run = |input: &Tensor, weight: &Tensor, extra: &[(&str, serde_json::Value)]| {
            let mut args = vec![
                ("input", json!({"as_tensor": {"name": "x"}})),
                ("weight", json!({"as_tensor": {"name": "w"}})),
                ("weight_shape", json!({"as_ints": [4, 8, 1, 1]})),
            ];
            for (name, v) in extra {
                args.retain(|(n, _)| n != name);
                args.push((name, v.clone()));
            }
            let r = Tensor::zeros((1, 5, 3, 3), DType::F32, &dev).unwrap();
            let tensors = [("x", input.clone()), ("w", weight.clone()), ("r", r)];
            crate::ops::run_node(register, TARGET, &args, &tensors)
        };
        let crate::value::Value::Tensor(y) = run(&x, &packed, &[]).unwrap().remove(0) else {
            panic!("not a tensor");
        };
        let want = x.conv2d(&w, 0, 1, 1, 1).unwrap();
        assert!(crate::ops::max_abs_diff(&y, &want) < 1e-5);
        // (what is wrong, input, weight, arguments replaced or added)
        type Case<'a> = (&'a str, Tensor, Tensor, Vec<(&'a str, serde_json::Value)>);
        let refused: Vec<Case> = vec![
            ("short weight", x.clone(), short, vec![]),
            ("plain weight", x.clone(), w.clone(), vec![]),
            (
                "shape",
                x.clone(),
                packed.clone(),
                vec![("weight_shape", json!({"as_ints": [4, 8, 1]}))],
            ),
            (
                "negative shape",
                x.clone(),
                packed.clone(),
                vec![("weight_shape", json!({"as_ints": [4, -8, 1, 1]}))],
            ),
            (
                "huge kernel",
                x.clone(),
                packed.clone(),
                vec![("weight_shape", json!({"as_ints": [4, 8, -1, -1]}))],
            ),
            (
                "channels",
                x.narrow(1, 0, 6).unwrap(),
                packed.clone(),
                vec![],
            ),
            ("rank", x.squeeze(0).unwrap(), packed.clone(), vec![]),
            (
                "dtype",
                x.to_dtype(DType::F64).unwrap(),
                packed.clone(),
                vec![],
            ),
            (
                "residual",
                x.clone(),
                packed.clone(),
                vec![(
                    super::super::FUSED_RESIDUAL_ARG,
                    json!({"as_tensor": {"name": "r"}}),
                )],
            ),
            (
                "groups",
                x.clone(),
                packed.clone(),
                vec![("groups", json!({"as_int": 2}))],
            ),
        ];
        for (what, input, weight, extra) in refused {
            assert!(run(&input, &weight, &extra).is_err(), "{what}");
        }
    }
}
