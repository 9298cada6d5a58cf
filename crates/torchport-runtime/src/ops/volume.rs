//! Volumetric (3-d) ops of video models: `conv3d` (and `convolution` with a 5-d weight) as
//! 2-d convolutions whose images are the output's depth slices (see [`conv3d`]),
//! `conv_transpose3d` (and
//! transposed `convolution` with a 5-d weight; groups, per-dim stride, padding, output
//! padding, dilation) as a direct scatter of each input voxel through the kernel, and
//! `adaptive_avg_pool3d` (f32, f64 for float64).

use candle_core::{DType, Tensor};

use super::conv::Act;
use super::{float, result_numel, usize_of, window_param, Real, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs};

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    r.add("aten.conv3d.default", conv3d);
    r.add("aten.conv3d.padding", conv3d);
    r.add("aten.conv_transpose3d.input", conv_transpose3d);
    r.add("aten.adaptive_avg_pool3d.default", adaptive_avg_pool3d);
    r.add("aten._adaptive_avg_pool3d.default", adaptive_avg_pool3d);
}

/// A `[d, h, w]` parameter given as one int or three.
pub(super) fn triple(v: &[i64], what: &str) -> OpResult<[usize; 3]> {
    Ok(match v {
        [x] => [window_param(*x, what)?; 3],
        [d, h, w] => [
            window_param(*d, what)?,
            window_param(*h, what)?,
            window_param(*w, what)?,
        ],
        _ => op_bail!("{what} {v:?} must have 1 or 3 values"),
    })
}

/// `conv3d(input, weight, bias, stride, padding, dilation, groups)` on `[N, C, D, H, W]`.
///
/// Each output depth slice of each image is one image of a 2-d convolution (the runtime's
/// own, on the pool's threads) whose channels are the input's, each with the `kd` depth slices
/// its kernel's taps read: the weight `[co, ci / groups, kd, kh, kw]` read as `[co, ci /
/// groups * kd, kh, kw]`. Slices next to the depth padding, which read fewer taps, run apart
/// with the weight's taps they read (the others would multiply zeros). Summing one 2-d
/// convolution per tap and output slice instead, each on one image, left threads idle:
/// R3D-18 took 34.1 ms on 2 threads for 46.5 on 1 (BENCHMARKS.md, issue 14).
pub fn conv3d(a: &Args) -> OpResult<Outputs> {
    let x = float(&a.tensor("input")?)?;
    let w = float(&a.tensor("weight")?)?;
    let b = a.opt_tensor("bias")?;
    // An unbatched [C, D, H, W] input runs as a batch of one.
    let unbatched = x.rank() == 4;
    let x = if unbatched { x.unsqueeze(0)? } else { x };
    if x.rank() != 5 || w.rank() != 5 {
        op_bail!(
            "conv3d expects a 5-d input (or 4-d unbatched) and a 5-d weight, got {:?} and {:?}",
            x.dims(),
            w.dims()
        );
    }
    let stride = triple(&a.ints_or("stride", &[1])?, "stride")?;
    let dilation = triple(&a.ints_or("dilation", &[1])?, "dilation")?;
    if stride.contains(&0) || dilation.contains(&0) {
        op_bail!("conv3d stride and dilation must be positive");
    }
    let k = [w.dims()[2], w.dims()[3], w.dims()[4]];
    // Padding before and after, per dim.
    let pads: [(usize, usize); 3] = match a.get("padding") {
        Some(crate::schema::Argument::AsString(s)) if s == "valid" => [(0, 0); 3],
        Some(crate::schema::Argument::AsString(s)) if s == "same" => {
            if stride != [1, 1, 1] {
                op_bail!("padding='same' needs stride 1");
            }
            // torch puts the odd element of an even total after.
            std::array::from_fn(|i| {
                let total = dilation[i] * (k[i].max(1) - 1);
                (total / 2, total - total / 2)
            })
        }
        Some(crate::schema::Argument::AsString(s)) => {
            op_bail!("padding '{s}' is not supported for conv3d")
        }
        _ => triple(&a.ints_or("padding", &[0])?, "padding")?.map(|p| (p, p)),
    };
    let groups = usize_of(a.int_or("groups", 1)?, "groups")?;
    let (ci, [co, wci, kd]) = (x.dims()[1], [w.dims()[0], w.dims()[1], k[0]]);
    if groups == 0 || wci.checked_mul(groups) != Some(ci) || co % groups != 0 {
        op_bail!(
            "conv3d weight {:?} does not fit input {:?} with {groups} groups",
            w.dims(),
            x.dims()
        );
    }
    // Height and width padding by the 2-d kernel where even, else applied here.
    let (x, hw_pad) = if pads[1].0 == pads[1].1 && pads[2].0 == pads[2].1 {
        (x, [pads[1].0, pads[2].0])
    } else {
        let x = x
            .pad_with_zeros(3, pads[1].0, pads[1].1)?
            .pad_with_zeros(4, pads[2].0, pads[2].1)?;
        (x, [0, 0])
    };
    let d = x.dims()[2];
    let span = dilation[0] * (kd.max(1) - 1) + 1;
    let padded = d + pads[0].0 + pads[0].1;
    if padded < span || kd == 0 {
        op_bail!("conv3d kernel depth {kd} is larger than the padded input depth");
    }
    let out_d = (padded - span) / stride[0] + 1;
    let depth = Depth {
        d,
        stride: stride[0],
        dilation: dilation[0],
        pad: pads[0].0,
    };
    // The activation waits for a fused residual, which is laid out as the output.
    let residual = a.opt_tensor(super::conv::FUSED_RESIDUAL_ARG)?.is_some();
    let act = super::conv::fused_act(a)?;
    // Depthwise: one 2-d convolution per tap (the depthwise kernel), summed, where the
    // channels with their taps would make groups of kd channels.
    let depthwise = groups == ci && wci == 1 && groups > 1;
    let mut parts = Vec::new();
    let mut od = 0;
    while od < out_d {
        let taps = depth.taps(od, kd);
        let end = (od..out_d)
            .find(|&o| depth.taps(o, kd) != taps)
            .unwrap_or(out_d);
        if taps.is_empty() {
            op_bail!("conv3d output depth {od} reads only padding");
        }
        let y = if depthwise {
            // Tap by tap, each a depthwise 2-d convolution of all the slices, summed.
            let mut sum: Option<Tensor> = None;
            for t in taps {
                let planes = depth_taps(&x, &depth, od..end, t..t + 1)?;
                let wt = w.narrow(2, t, 1)?.squeeze(2)?.contiguous()?;
                let y = super::conv::conv2d_with(
                    &planes,
                    &wt,
                    b.as_ref().filter(|_| sum.is_none()),
                    [stride[1], stride[2]],
                    hw_pad,
                    [dilation[1], dilation[2]],
                    groups,
                    Act::None,
                )?;
                sum = Some(match sum {
                    Some(s) => match super::strided::binary_f32(&s, &y, |a, b| a + b) {
                        Some(v) => v,
                        None => (s + y)?,
                    },
                    None => y,
                });
            }
            let Some(y) = sum else {
                op_bail!("conv3d output depth {od} reads only padding");
            };
            match residual {
                true => y,
                false => act.apply_to(&y)?,
            }
        } else {
            let planes = depth_taps(&x, &depth, od..end, taps.clone())?;
            let w2 = match taps.len() == kd {
                true => w.reshape((co, wci * kd, k[1], k[2]))?,
                false => w
                    .narrow(2, taps.start, taps.len())?
                    .contiguous()?
                    .reshape((co, wci * taps.len(), k[1], k[2]))?,
            };
            super::conv::conv2d_with(
                &planes,
                &w2,
                b.as_ref(),
                [stride[1], stride[2]],
                hw_pad,
                [dilation[1], dilation[2]],
                groups,
                if residual { Act::None } else { act },
            )?
        };
        // [N * slices, co, oh, ow] -> [N, co, slices, oh, ow].
        let (oh, ow) = (y.dims()[2], y.dims()[3]);
        let y = y.reshape((x.dims()[0], end - od, co, oh, ow))?;
        parts.push(y.permute((0, 2, 1, 3, 4))?);
        od = end;
    }
    let y = match parts.as_slice() {
        [y] => super::strided::contiguous(y)?,
        _ => match super::shape::strided_cat(&parts, 2) {
            Some(y) => y,
            None => Tensor::cat(&parts, 2)?,
        },
    };
    let y = if residual {
        let y = super::conv::add_fused_residual(a, y, unbatched)?;
        act.apply_to(&y)?
    } else {
        y
    };
    one(if unbatched { y.squeeze(0)? } else { y })
}

/// How a 3-d convolution's kernel steps through the input's `d` depth slices: output slices
/// `stride` apart, taps `dilation` apart, `pad` slices of zeros before the input's.
struct Depth {
    d: usize,
    stride: usize,
    dilation: usize,
    pad: usize,
}

impl Depth {
    /// The input slice tap `t` of output slice `od` reads, `None` in the padding.
    fn slice(&self, od: usize, t: usize) -> Option<usize> {
        (od * self.stride + t * self.dilation)
            .checked_sub(self.pad)
            .filter(|&s| s < self.d)
    }

    /// The taps of `kd` that output slice `od` reads inside the input (consecutive).
    fn taps(&self, od: usize, kd: usize) -> std::ops::Range<usize> {
        let first = (0..kd).find(|&t| self.slice(od, t).is_some());
        let Some(first) = first else { return 0..0 };
        let end = (first..kd)
            .find(|&t| self.slice(od, t).is_none())
            .unwrap_or(kd);
        first..end
    }
}

/// `[N, C, D, H, W]` as `[N * S, C * T, H, W]` for output slices `slices` (S of them) and
/// taps `taps` (T): image `n * S + o`, channel `c * T + t` is the input's depth slice read
/// by tap `taps.start + t` of output slice `slices.start + o` (zeros in the padding), image
/// `n`, channel `c`; each plane copied once, planes in parallel.
fn depth_taps(
    x: &Tensor,
    g: &Depth,
    slices: std::ops::Range<usize>,
    taps: std::ops::Range<usize>,
) -> OpResult<Tensor> {
    let x = super::strided::contiguous(x)?;
    let &[n, c, d, h, w] = x.dims() else {
        op_bail!("conv3d input {:?} is not 5-d", x.dims());
    };
    let shape = [n * slices.len(), c * taps.len(), h, w];
    result_numel(&shape, "conv3d")?;
    let at = Taps {
        sizes: [n, c, d, h * w],
        slices,
        taps,
    };
    let y = match x.dtype() {
        DType::F64 => taps_of::<f64>(&x, &at, g).map(|v| Tensor::from_vec(v, &shape, x.device())),
        DType::F32 => taps_of::<f32>(&x, &at, g).map(|v| Tensor::from_vec(v, &shape, x.device())),
        other => op_bail!("conv3d of {other:?} values"),
    };
    let Some(y) = y else {
        op_bail!("conv3d input {:?} does not hold its values", x.dims());
    };
    Ok(y?)
}

/// What [`taps_of`] gathers: from a contiguous `[n, c, d, plane]` input, the planes of
/// output slices `slices` and kernel taps `taps`.
struct Taps {
    sizes: [usize; 4],
    slices: std::ops::Range<usize>,
    taps: std::ops::Range<usize>,
}

/// [`depth_taps`] of a contiguous tensor of `T`.
fn taps_of<T: candle_core::WithDType>(x: &Tensor, at: &Taps, g: &Depth) -> Option<Vec<T>> {
    let [n, c, d, plane] = at.sizes;
    let (ns, nt) = (at.slices.len(), at.taps.len());
    let total = n * ns * c * nt * plane;
    super::fused::with_storage::<T, _>(x, |data, lay| {
        let data = data.get(lay.start_offset()..lay.start_offset() + n * c * d * plane)?;
        if total == 0 {
            return Some(Vec::new());
        }
        // Whole planes per task, about 32 K values each.
        let per = (1 << 15) / plane + 1;
        let write = |first: usize, out: &mut [std::mem::MaybeUninit<T>]| {
            for (i, o) in out.chunks_mut(plane).enumerate() {
                let q = first / plane + i;
                let (t, q) = (q % nt, q / nt);
                let (ch, q) = (q % c, q / c);
                let (o_s, img) = (q % ns, q / ns);
                match g.slice(at.slices.start + o_s, at.taps.start + t) {
                    Some(s) => {
                        let from = ((img * c + ch) * d + s) * plane;
                        for (o, &v) in o.iter_mut().zip(&data[from..from + plane]) {
                            o.write(v);
                        }
                    }
                    None => o.fill(std::mem::MaybeUninit::new(T::zero())),
                }
            }
        };
        // SAFETY: `write` initialises every value of each chunk it is handed: one plane
        // (copied or zeros) per `plane` values, and every chunk is whole planes.
        #[allow(unsafe_code)]
        Some(unsafe { super::fused::written(total, per * plane, write) })
    })?
}

/// `conv_transpose3d(input, weight, bias, stride, padding, output_padding, groups,
/// dilation)` on `[N, C, D, H, W]` or `[C, D, H, W]`, weight `[C, C_out / groups, kd, kh,
/// kw]`.
pub fn conv_transpose3d(a: &Args) -> OpResult<Outputs> {
    let x = float(&a.tensor("input")?)?;
    let w = float(&a.tensor("weight")?)?;
    let unbatched = x.rank() == 4;
    let x = if unbatched { x.unsqueeze(0)? } else { x };
    if x.rank() != 5 || w.rank() != 5 {
        op_bail!(
            "conv_transpose3d expects a 5-d input (or 4-d unbatched) and a 5-d weight, got {:?} and {:?}",
            x.dims(),
            w.dims()
        );
    }
    let stride = triple(&a.ints_or("stride", &[1])?, "stride")?;
    let padding = triple(&a.ints_or("padding", &[0])?, "padding")?;
    let out_pad = triple(&a.ints_or("output_padding", &[0])?, "output_padding")?;
    let dil = triple(&a.ints_or("dilation", &[1])?, "dilation")?;
    let groups = usize_of(a.int_or("groups", 1)?, "groups")?;
    let (n, ci) = (x.dims()[0], x.dims()[1]);
    let (wci, cog) = (w.dims()[0], w.dims()[1]);
    if groups == 0 || ci % groups != 0 || wci != ci {
        op_bail!(
            "conv_transpose3d weight {:?} does not fit input {:?} with {groups} groups",
            w.dims(),
            x.dims()
        );
    }
    if stride.contains(&0) || dil.contains(&0) {
        op_bail!("conv_transpose3d stride and dilation must be positive");
    }
    let mut out = [0usize; 3];
    for i in 0..3 {
        if out_pad[i] >= stride[i] && out_pad[i] >= dil[i] {
            op_bail!("output padding must be smaller than either stride or dilation");
        }
        let (len, k) = (x.dims()[i + 2], w.dims()[i + 2]);
        if len == 0 || k == 0 {
            op_bail!("conv_transpose3d of an empty input or kernel");
        }
        let full = (len - 1)
            .checked_mul(stride[i])
            .and_then(|v| v.checked_add(dil[i].checked_mul(k - 1)?))
            .and_then(|v| v.checked_add(out_pad[i] + 1));
        match full.and_then(|f| f.checked_sub(2 * padding[i])) {
            Some(o) if o > 0 => out[i] = o,
            _ => op_bail!("conv_transpose3d output size is not positive or overflows"),
        }
    }
    let co = cog * groups;
    result_numel(&[n, co, out[0], out[1], out[2]], "conv_transpose3d")?;
    let geo = Transposed {
        stride,
        padding,
        dil,
        groups,
        out,
    };
    let mut y = if x.dtype() == DType::F64 || w.dtype() == DType::F64 {
        transposed_t::<f64>(&x.to_dtype(DType::F64)?, &w.to_dtype(DType::F64)?, &geo)?
    } else {
        transposed_t::<f32>(&x, &w, &geo)?
    };
    if let Some(b) = a.opt_tensor("bias")? {
        y = y.broadcast_add(&b.to_dtype(y.dtype())?.reshape((1, (), 1, 1, 1))?)?;
    }
    one(if unbatched { y.squeeze(0)? } else { y })
}

/// The geometry of a transposed 3-d convolution.
struct Transposed {
    stride: [usize; 3],
    padding: [usize; 3],
    dil: [usize; 3],
    groups: usize,
    out: [usize; 3],
}

/// Every input voxel times the kernel, added into the output volume of each output channel
/// (output channels in parallel).
fn transposed_t<T: Real>(x: &Tensor, w: &Tensor, g: &Transposed) -> OpResult<Tensor> {
    use rayon::prelude::*;
    let (n, ci) = (x.dims()[0], x.dims()[1]);
    let [id, ih, iw] = [x.dims()[2], x.dims()[3], x.dims()[4]];
    let (cog, [kd, kh, kw]) = (w.dims()[1], [w.dims()[2], w.dims()[3], w.dims()[4]]);
    let cig = ci / g.groups;
    let co = cog * g.groups;
    let [od, oh, ow] = g.out;
    let xs = x.contiguous()?.flatten_all()?.to_vec1::<T>()?;
    let ws = w.contiguous()?.flatten_all()?.to_vec1::<T>()?;
    let vol = od * oh * ow;
    let mut out = vec![T::zero(); n * co * vol];
    // Output position along one dim of input index `i` and tap `k`, if inside.
    let at = |i: usize, k: usize, d: usize, len: usize| {
        let o = (i * g.stride[d] + k * g.dil[d]) as isize - g.padding[d] as isize;
        (o >= 0 && (o as usize) < len).then_some(o as usize)
    };
    out.par_chunks_mut(vol.max(1))
        .enumerate()
        .for_each(|(plane, dst)| {
            let (b, c) = (plane / co, plane % co);
            let (grp, oc) = (c / cog, c % cog);
            for icg in 0..cig {
                let ic = grp * cig + icg;
                let src = &xs[(b * ci + ic) * id * ih * iw..][..id * ih * iw];
                let ker = &ws[(ic * cog + oc) * kd * kh * kw..][..kd * kh * kw];
                for z in 0..id {
                    for y in 0..ih {
                        for xx in 0..iw {
                            let v = src[(z * ih + y) * iw + xx];
                            for i in 0..kd {
                                let Some(oz) = at(z, i, 0, od) else { continue };
                                for j in 0..kh {
                                    let Some(oy) = at(y, j, 1, oh) else { continue };
                                    for l in 0..kw {
                                        let Some(ox) = at(xx, l, 2, ow) else { continue };
                                        dst[(oz * oh + oy) * ow + ox] +=
                                            v * ker[(i * kh + j) * kw + l];
                                    }
                                }
                            }
                        }
                    }
                }
            }
        });
    Ok(Tensor::from_vec(
        out,
        (n, co, od, oh, ow),
        &candle_core::Device::Cpu,
    )?)
}

/// `adaptive_avg_pool3d(self, output_size)` on `[N, C, D, H, W]` or `[C, D, H, W]`: each
/// output cell is the mean of input cells `floor(i * in / out) .. ceil((i + 1) * in / out)`
/// along each dim, as torch computes it.
fn adaptive_avg_pool3d(a: &Args) -> OpResult<Outputs> {
    let x = float(&a.tensor("self")?)?;
    let o = triple(&a.ints("output_size")?, "output_size")?;
    if !(4..=5).contains(&x.rank()) || o.contains(&0) {
        op_bail!(
            "adaptive_avg_pool3d expects a 4-d or 5-d input and a positive output size, got {:?} and {o:?}",
            x.dims()
        );
    }
    let mut shape = x.dims()[..x.rank() - 3].to_vec();
    shape.extend(o);
    result_numel(&shape, "adaptive_avg_pool3d")?;
    one(if x.dtype() == DType::F64 {
        adaptive_avg_t::<f64>(&x, o)?
    } else {
        adaptive_avg_t::<f32>(&x, o)?
    })
}

/// The adaptive average pooling kernel in `T` (f32, or f64 for float64).
fn adaptive_avg_t<T: Real>(x: &Tensor, o: [usize; 3]) -> OpResult<Tensor> {
    let r = x.rank();
    let (lead, [d, h, w]) = (
        &x.dims()[..r - 3],
        [x.dims()[r - 3], x.dims()[r - 2], x.dims()[r - 1]],
    );
    let planes: usize = lead.iter().product();
    let xs = x.contiguous()?.flatten_all()?.to_vec1::<T>()?;
    let range = |i: usize, n: usize, m: usize| (i * n / m, ((i + 1) * n).div_ceil(m));
    let mut out = Vec::with_capacity(planes * o[0] * o[1] * o[2]);
    for p in 0..planes {
        let src = &xs[p * d * h * w..][..d * h * w];
        for od in 0..o[0] {
            let (d0, d1) = range(od, d, o[0]);
            for oh in 0..o[1] {
                let (h0, h1) = range(oh, h, o[1]);
                for ow in 0..o[2] {
                    let (w0, w1) = range(ow, w, o[2]);
                    let mut sum = T::zero();
                    for z in d0..d1 {
                        for y in h0..h1 {
                            for v in &src[(z * h + y) * w + w0..][..w1 - w0] {
                                sum += *v;
                            }
                        }
                    }
                    out.push(sum / T::from_f64(((d1 - d0) * (h1 - h0) * (w1 - w0)).max(1) as f64));
                }
            }
        }
    }
    let mut shape = lead.to_vec();
    shape.extend(o);
    Ok(Tensor::from_vec(out, shape, x.device())?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use serde_json::json;

    /// A crafted stride that would make a huge output is refused before allocating it.
    #[test]
    fn huge_transposed_output_is_refused() {
        let x = Tensor::zeros((1, 1, 2, 2, 2), DType::F32, &Device::Cpu).unwrap();
        let w = Tensor::zeros((1, 1, 1, 1, 1), DType::F32, &Device::Cpu).unwrap();
        let e = super::super::run_node(
            register,
            "aten.conv_transpose3d.input",
            &[
                ("input", json!({"as_tensor": {"name": "x"}})),
                ("weight", json!({"as_tensor": {"name": "w"}})),
                ("stride", json!({ "as_ints": [1 << 20] })),
                ("output_padding", json!({ "as_ints": [0] })),
            ],
            &[("x", x), ("w", w)],
        )
        .unwrap_err()
        .0;
        assert!(e.contains("is too large"), "{e}");
    }

    /// conv3d from its definition, in f64: `y[n, o, z, i, j] = b[o] + sum over the group's
    /// channels and the kernel of x * w`, zeros outside the input.
    #[allow(clippy::too_many_arguments)]
    fn conv3d_by_definition(
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        stride: [usize; 3],
        pad: [usize; 3],
        dil: [usize; 3],
        groups: usize,
    ) -> Vec<f64> {
        let f = |t: &Tensor| t.to_dtype(DType::F64).unwrap().flatten_all().unwrap();
        let (xv, wv, bv) = (
            f(x).to_vec1::<f64>().unwrap(),
            f(w).to_vec1::<f64>().unwrap(),
            f(b).to_vec1::<f64>().unwrap(),
        );
        let &[n, c, d, h, wd] = x.dims() else {
            panic!()
        };
        let &[co, cg, kd, kh, kw] = w.dims() else {
            panic!()
        };
        let size =
            |i: usize, l: usize, k: usize| (l + 2 * pad[i] - dil[i] * (k - 1) - 1) / stride[i] + 1;
        let o = [size(0, d, kd), size(1, h, kh), size(2, wd, kw)];
        let mut y = Vec::new();
        for img in 0..n {
            for oc in 0..co {
                let g = oc / (co / groups);
                for z in 0..o[0] {
                    for i in 0..o[1] {
                        for j in 0..o[2] {
                            let mut acc = bv[oc];
                            for cl in 0..cg {
                                for t in 0..kd {
                                    for u in 0..kh {
                                        for v in 0..kw {
                                            let at =
                                                |p: usize, k: usize, dim: usize, len: usize| {
                                                    (p * stride[dim] + k * dil[dim])
                                                        .checked_sub(pad[dim])
                                                        .filter(|&q| q < len)
                                                };
                                            let (Some(zz), Some(ii), Some(jj)) =
                                                (at(z, t, 0, d), at(i, u, 1, h), at(j, v, 2, wd))
                                            else {
                                                continue;
                                            };
                                            let ch = g * cg + cl;
                                            acc += xv
                                                [(((img * c + ch) * d + zz) * h + ii) * wd + jj]
                                                * wv[(((oc * cg + cl) * kd + t) * kh + u) * kw + v];
                                        }
                                    }
                                }
                            }
                            y.push(acc);
                        }
                    }
                }
            }
        }
        y
    }

    /// The 3-d convolution (output slices as images of 2-d convolutions, the slices next to
    /// the depth padding apart, depthwise tap by tap) computes the definition: depth
    /// padding, stride and dilation, groups, depthwise, bias, a fused activation, float64.
    #[test]
    fn conv3d_matches_its_definition() {
        let dev = Device::Cpu;
        // (input, weight, stride, padding, dilation, groups)
        type Case = (
            [usize; 5],
            [usize; 5],
            [usize; 3],
            [usize; 3],
            [usize; 3],
            usize,
        );
        #[rustfmt::skip]
        let cases: [Case; 7] = [
            ([1, 3, 4, 6, 5], [4, 3, 3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1], 1),
            ([2, 4, 5, 5, 6], [6, 2, 3, 1, 3], [2, 1, 2], [2, 0, 1], [1, 1, 1], 2),
            ([1, 2, 7, 4, 4], [3, 2, 2, 3, 3], [1, 1, 1], [1, 1, 0], [2, 1, 1], 1),
            ([1, 5, 4, 6, 6], [5, 1, 3, 3, 3], [1, 2, 2], [1, 1, 1], [1, 1, 1], 5),
            ([2, 3, 1, 5, 5], [2, 3, 3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1], 1),
            ([1, 2, 3, 4, 4], [4, 2, 1, 3, 3], [1, 1, 1], [0, 1, 1], [1, 1, 1], 1),
            ([0, 2, 3, 4, 4], [4, 2, 3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1], 1),
        ];
        let run = |args: &[(&str, serde_json::Value)], tensors: &[(&str, Tensor)]| {
            match &super::super::run_node(register, "aten.conv3d.default", args, tensors).unwrap()
                [0]
            {
                crate::value::Value::Tensor(t) => t.clone(),
                _ => panic!("not a tensor"),
            }
        };
        for (xs, ws, stride, pad, dil, groups) in cases {
            for dtype in [DType::F32, DType::F64] {
                // No activation, a fused relu, a fused residual and relu.
                for fused in 0..3 {
                    let r = |s: &[usize]| {
                        Tensor::randn(0f32, 1., s, &dev)
                            .unwrap()
                            .to_dtype(dtype)
                            .unwrap()
                    };
                    let (x, w, b) = (r(&xs), r(&ws), r(&[ws[0]]));
                    let mut args = vec![
                        ("input", json!({"as_tensor": {"name": "x"}})),
                        ("weight", json!({"as_tensor": {"name": "w"}})),
                        ("bias", json!({"as_tensor": {"name": "b"}})),
                        ("stride", json!({ "as_ints": stride })),
                        ("padding", json!({ "as_ints": pad })),
                        ("dilation", json!({ "as_ints": dil })),
                        ("groups", json!({ "as_int": groups })),
                    ];
                    let mut tensors = vec![("x", x.clone()), ("w", w.clone()), ("b", b.clone())];
                    let mut want = conv3d_by_definition(&x, &w, &b, stride, pad, dil, groups);
                    if fused > 0 {
                        args.push((
                            super::super::conv::FUSED_ACT_ARG,
                            json!({"as_string": "relu"}),
                        ));
                    }
                    if fused == 2 {
                        let plain = run(&args, &tensors);
                        let res = r(plain.dims());
                        let rv = res.to_dtype(DType::F64).unwrap().flatten_all().unwrap();
                        for (v, r) in want.iter_mut().zip(rv.to_vec1::<f64>().unwrap()) {
                            *v += r;
                        }
                        args.push((
                            super::super::conv::FUSED_RESIDUAL_ARG,
                            json!({"as_tensor": {"name": "r"}}),
                        ));
                        tensors.push(("r", res));
                    }
                    if fused > 0 {
                        want.iter_mut().for_each(|v| *v = v.max(0.0));
                    }
                    let y = run(&args, &tensors).to_dtype(DType::F64).unwrap();
                    let y = y.flatten_all().unwrap().to_vec1::<f64>().unwrap();
                    assert_eq!(y.len(), want.len(), "{xs:?} {ws:?}");
                    let err = y
                        .iter()
                        .zip(&want)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0.0, f64::max);
                    assert!(err < 1e-4, "{xs:?} {ws:?} {dtype:?}: {err}");
                }
            }
        }
    }
}
