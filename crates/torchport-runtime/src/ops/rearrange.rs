//! Pure rearrangements of elements (any dtype): `pixel_shuffle`, `pixel_unshuffle`,
//! `channel_shuffle` (reshape, permute, reshape, as torch defines them) and `rot90`
//! (flips and a transpose).

use candle_core::{Device, Tensor};

use super::{dim, usize_of, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs};

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    r.add("aten.pixel_shuffle.default", pixel_shuffle);
    r.add("aten.pixel_unshuffle.default", pixel_unshuffle);
    r.add("aten.channel_shuffle.default", channel_shuffle);
    r.add("aten.native_channel_shuffle.default", channel_shuffle);
    r.add("aten.rot90.default", rot90);
}

/// The factor argument (`upscale_factor` / `downscale_factor`) and the input split into its
/// leading dims and `[C, H, W]`.
fn split(a: &Args, factor: &str) -> OpResult<(Tensor, usize, Vec<usize>, [usize; 3])> {
    let x = a.tensor("self")?;
    let f = usize_of(a.int(factor)?, factor)?;
    if f == 0 {
        op_bail!("{factor} must be positive");
    }
    if x.rank() < 3 {
        op_bail!(
            "pixel (un)shuffle expects at least 3 dims, got shape {:?}",
            x.dims()
        );
    }
    let r = x.rank();
    let lead = x.dims()[..r - 3].to_vec();
    let [c, h, w] = [x.dims()[r - 3], x.dims()[r - 2], x.dims()[r - 1]];
    Ok((x.contiguous()?, f, lead, [c, h, w]))
}

/// `[*, C·r², H, W]` → `[*, C, H·r, W·r]`.
fn pixel_shuffle(a: &Args) -> OpResult<Outputs> {
    let (x, r, lead, [c, h, w]) = split(a, "upscale_factor")?;
    let rr = r.saturating_mul(r);
    if c % rr != 0 {
        op_bail!("pixel_shuffle: {c} channels are not divisible by {r}²");
    }
    let b: usize = lead.iter().product();
    let y = x
        .reshape(vec![b, c / rr, r, r, h, w])?
        .permute(vec![0, 1, 4, 2, 5, 3])?
        .contiguous()?;
    let mut shape = lead;
    shape.extend([c / rr, h * r, w * r]);
    one(y.reshape(shape)?)
}

/// `[*, C, H·r, W·r]` → `[*, C·r², H, W]`.
fn pixel_unshuffle(a: &Args) -> OpResult<Outputs> {
    let (x, r, lead, [c, h, w]) = split(a, "downscale_factor")?;
    if h % r != 0 || w % r != 0 {
        op_bail!("pixel_unshuffle: height {h} and width {w} must be divisible by {r}");
    }
    let b: usize = lead.iter().product();
    let (oh, ow) = (h / r, w / r);
    let y = x
        .reshape(vec![b, c, oh, r, ow, r])?
        .permute(vec![0, 1, 3, 5, 2, 4])?
        .contiguous()?;
    let Some(cr) = c.checked_mul(r).and_then(|v| v.checked_mul(r)) else {
        op_bail!("pixel_unshuffle: {c} channels times {r}² overflows");
    };
    let mut shape = lead;
    shape.extend([cr, oh, ow]);
    one(y.reshape(shape)?)
}

/// `[N, C, *]` with the channels read as `[groups, C / groups]` and written transposed.
fn channel_shuffle(a: &Args) -> OpResult<Outputs> {
    let x = a.tensor("self")?;
    let g = usize_of(a.int("groups")?, "groups")?;
    if x.rank() < 3 {
        op_bail!(
            "channel_shuffle expects at least 3 dims, got shape {:?}",
            x.dims()
        );
    }
    let (n, c) = (x.dims()[0], x.dims()[1]);
    if g == 0 || c % g != 0 {
        op_bail!("channel_shuffle: {c} channels are not divisible into {g} groups");
    }
    let rest: usize = x.dims()[2..].iter().product();
    let y = x
        .contiguous()?
        .reshape((n, g, c / g, rest))?
        .transpose(1, 2)?
        .contiguous()?;
    one(y.reshape(x.dims())?)
}

/// `self` reversed along dim `d`.
fn flip(t: &Tensor, d: usize) -> OpResult<Tensor> {
    let n = t.dims()[d] as i64;
    let idx: Vec<i64> = (0..n).rev().collect();
    let ids = Tensor::new(idx.as_slice(), &Device::Cpu)?;
    Ok(t.contiguous()?.index_select(&ids, d)?)
}

/// `rot90(self, k=1, dims=[0, 1])`: `k` quarter turns from the first dim towards the second.
fn rot90(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let k = a.int_or("k", 1)?;
    let dims = a.ints_or("dims", &[0, 1])?;
    if dims.len() != 2 || t.rank() < 2 {
        op_bail!(
            "rot90 needs 2 dims and a tensor of rank at least 2, got dims {dims:?} and shape {:?}",
            t.dims()
        );
    }
    let (d0, d1) = (dim(dims[0], t.rank())?, dim(dims[1], t.rank())?);
    if d0 == d1 {
        op_bail!("rot90 dims must differ, got {dims:?}");
    }
    one(match k.rem_euclid(4) {
        1 => flip(&t, d1)?.transpose(d0, d1)?.contiguous()?,
        2 => flip(&flip(&t, d0)?, d1)?,
        3 => flip(&t, d0)?.transpose(d0, d1)?.contiguous()?,
        _ => t,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::DType;
    use serde_json::json;

    /// Factors that do not divide the tensor, and a zero factor, are errors.
    #[test]
    fn bad_factors_are_refused() {
        let x = Tensor::zeros((1, 6, 2, 2), DType::F32, &Device::Cpu).unwrap();
        let run = |target: &str, name: &str, f: i64| {
            super::super::run_node(
                register,
                target,
                &[
                    ("self", json!({"as_tensor": {"name": "x"}})),
                    (name, json!({ "as_int": f })),
                ],
                &[("x", x.clone())],
            )
            .unwrap_err()
            .0
        };
        let e = run("aten.pixel_shuffle.default", "upscale_factor", 2);
        assert!(e.contains("6 channels are not divisible by 2²"), "{e}");
        let e = run("aten.pixel_unshuffle.default", "downscale_factor", 0);
        assert!(e.contains("must be positive"), "{e}");
        let e = run("aten.channel_shuffle.default", "groups", 4);
        assert!(e.contains("not divisible into 4 groups"), "{e}");
    }
}
