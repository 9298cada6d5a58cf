//! Volumetric (3-d) ops of video models: `conv3d` (and `convolution` with a 5-d weight) as a
//! sum over the kernel's depth of 2-d convolutions of depth slices, `conv_transpose3d` (and
//! transposed `convolution` with a 5-d weight; groups, per-dim stride, padding, output
//! padding, dilation) as a direct scatter of each input voxel through the kernel, and
//! `adaptive_avg_pool3d` (f32, f64 for float64).

use candle_core::{DType, Tensor};

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
    // Height and width padding applied here; depth padding by skipping slices below.
    let x = x
        .pad_with_zeros(3, pads[1].0, pads[1].1)?
        .pad_with_zeros(4, pads[2].0, pads[2].1)?;
    let (d, kd) = (x.dims()[2], k[0]);
    let span = dilation[0] * (kd.max(1) - 1) + 1;
    let padded = d + pads[0].0 + pads[0].1;
    if padded < span {
        op_bail!("conv3d kernel depth {kd} is larger than the padded input depth");
    }
    let out_d = (padded - span) / stride[0] + 1;
    let padding = [pads[0].0, 0, 0];
    let mut slices = Vec::with_capacity(out_d);
    for od in 0..out_d {
        let mut acc: Option<Tensor> = None;
        for k in 0..kd {
            // The input depth this kernel slice reads (outside the input: zero padding).
            let Some(id) = (od * stride[0] + k * dilation[0]).checked_sub(padding[0]) else {
                continue;
            };
            if id >= d {
                continue;
            }
            let y = super::conv::conv2d_plain(
                &x.narrow(2, id, 1)?.squeeze(2)?,
                &w.narrow(2, k, 1)?.squeeze(2)?,
                [stride[1], stride[2]],
                [padding[1], padding[2]],
                [dilation[1], dilation[2]],
                groups,
            )?;
            acc = Some(match acc {
                Some(s) => (s + y)?,
                None => y,
            });
        }
        let Some(slice) = acc else {
            op_bail!("conv3d output depth {od} reads only padding");
        };
        slices.push(slice);
    }
    let mut y = Tensor::stack(&slices, 2)?;
    if let Some(b) = b {
        y = y.broadcast_add(&float(&b)?.reshape((1, (), 1, 1, 1))?)?;
    }
    // A residual and an activation the load-time rewrites fused onto this node.
    let y = super::conv::add_fused_residual(a, y, unbatched)?;
    let y = super::conv::fused_act(a)?.apply_to(&y)?;
    one(if unbatched { y.squeeze(0)? } else { y })
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
}
