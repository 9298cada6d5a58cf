//! Volumetric (3-d) ops of video models: `conv3d` (and `convolution` with a 5-d weight) as a
//! sum over the kernel's depth of 2-d convolutions of depth slices, and
//! `adaptive_avg_pool3d`.

use candle_core::Tensor;

use super::{f32_vec, float, usize_of, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs};

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    r.add("aten.conv3d.default", conv3d);
    r.add("aten.conv3d.padding", conv3d);
    r.add("aten.adaptive_avg_pool3d.default", adaptive_avg_pool3d);
    r.add("aten._adaptive_avg_pool3d.default", adaptive_avg_pool3d);
}

/// A `[d, h, w]` parameter given as one int or three.
fn triple(v: &[i64], what: &str) -> OpResult<[usize; 3]> {
    Ok(match v {
        [x] => [usize_of(*x, what)?; 3],
        [d, h, w] => [
            usize_of(*d, what)?,
            usize_of(*h, what)?,
            usize_of(*w, what)?,
        ],
        _ => op_bail!("{what} {v:?} has the wrong length for a 3-d convolution"),
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
    // An activation the load-time rewrite fused onto this node.
    let y = super::conv::fused_act(a)?.apply_to(&y)?;
    one(if unbatched { y.squeeze(0)? } else { y })
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
    let r = x.rank();
    let (lead, [d, h, w]) = (
        &x.dims()[..r - 3],
        [x.dims()[r - 3], x.dims()[r - 2], x.dims()[r - 1]],
    );
    let planes: usize = lead.iter().product();
    let xs = f32_vec(&x.contiguous()?)?;
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
                    let mut sum = 0f32;
                    for z in d0..d1 {
                        for y in h0..h1 {
                            sum += src[(z * h + y) * w + w0..][..w1 - w0].iter().sum::<f32>();
                        }
                    }
                    out.push(sum / ((d1 - d0) * (h1 - h0) * (w1 - w0)).max(1) as f32);
                }
            }
        }
    }
    let mut shape = lead.to_vec();
    shape.extend(o);
    one(Tensor::from_vec(out, shape, x.device())?)
}
