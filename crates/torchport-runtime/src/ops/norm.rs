//! Normalization: batch_norm (inference), layer_norm, group_norm, in both their composite and
//! `native_*` (core ATen) forms; instance_norm, rms_norm, and `_weight_norm`.

use candle_core::Tensor;

use super::{float, usize_of, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs, Value};

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    r.add("aten.batch_norm.default", batch_norm);
    r.add(
        "aten._native_batch_norm_legit_no_training.default",
        batch_norm,
    );
    r.add("aten.native_batch_norm.default", batch_norm);
    r.add("aten._native_batch_norm_legit.no_stats", batch_norm);
    r.add(
        "aten._native_batch_norm_legit_functional.default",
        batch_norm,
    );
    r.add("aten.layer_norm.default", layer_norm);
    r.add("aten._weight_norm.default", weight_norm);
    r.add("aten.native_layer_norm.default", layer_norm);
    r.add("aten.group_norm.default", group_norm);
    r.add("aten.native_group_norm.default", group_norm);
    r.add("aten.instance_norm.default", instance_norm);
    r.add("aten.rms_norm.default", rms_norm);
}

/// Reshape a per-channel vector [C] to broadcast over [N, C, ...] of rank `rank`.
fn per_channel(v: &Tensor, rank: usize) -> OpResult<Tensor> {
    let mut shape = vec![1usize; rank.max(2)];
    shape[1] = v.elem_count();
    Ok(float(v)?.reshape(shape)?)
}

fn batch_norm(a: &Args) -> OpResult<Outputs> {
    let x = float(&a.tensor("input")?)?;
    let target = a.node().target.as_str();
    let training = a.bool_or("training", false)? && !target.contains("no_training");
    let stats = (a.opt_tensor("running_mean")?, a.opt_tensor("running_var")?);
    let eps = a.float_or("eps", 1e-5)?;
    let (mean, var) = match stats {
        // Training mode would update the running statistics: a side effect not run here.
        _ if training && (stats.0.is_some() || stats.1.is_some()) => {
            op_bail!("batch_norm in training mode is not supported (export the model in eval mode)")
        }
        // Without running statistics, training mode normalizes by the batch's own (a pure
        // function: NFNet's weight standardization is written this way).
        (None, None) if training => batch_stats(&x)?,
        (Some(mean), Some(var)) => (mean, var),
        _ => op_bail!("batch_norm without running statistics is not supported"),
    };
    let r = x.rank();
    let inv = per_channel(&var, r)?.affine(1.0, eps)?.sqrt()?.recip()?;
    let mut scale = inv;
    if let Some(w) = a.opt_tensor("weight")? {
        scale = scale.broadcast_mul(&per_channel(&w, r)?)?;
    }
    let mut shift = per_channel(&mean, r)?.neg()?.broadcast_mul(&scale)?;
    if let Some(b) = a.opt_tensor("bias")? {
        shift = shift.broadcast_add(&per_channel(&b, r)?)?;
    }
    let y = scale_shift(&x, &scale, &shift)?;
    if target.contains("aten.batch_norm.") {
        return one(y);
    }
    // native forms also return (save_mean, save_invstd): the batch's in training mode,
    // empty in inference.
    let (save_mean, save_invstd) = if training {
        (mean.clone(), var.affine(1.0, eps)?.sqrt()?.recip()?)
    } else {
        let empty = Tensor::zeros(0, candle_core::DType::F32, &candle_core::Device::Cpu)?;
        (empty.clone(), empty)
    };
    Ok(vec![
        Value::Tensor(y),
        Value::Tensor(save_mean),
        Value::Tensor(save_invstd),
    ])
}

/// Per-channel mean and biased variance of `x` [N, C, ...] over every dim but 1. In f32,
/// the channels in parallel, each summed in f64 (two passes: the mean, then the squared
/// differences from it); other dtypes through candle's ops.
fn batch_stats(x: &Tensor) -> OpResult<(Tensor, Tensor)> {
    if x.rank() < 2 {
        op_bail!(
            "batch_norm needs an input of rank at least 2, got {:?}",
            x.dims()
        );
    }
    let (n, c) = (x.dims()[0], x.dims()[1]);
    let inner: usize = x.dims()[2..].iter().product();
    if n * inner == 0 {
        op_bail!("batch_norm over an empty batch");
    }
    let stats = super::strided::contiguous_f32(x)
        .and_then(|x| super::fused::with_f32(&x, |v| channel_stats(v, n, c, inner)));
    if let Some((mean, var)) = stats {
        return Ok((super::from_f32(mean, &[c])?, super::from_f32(var, &[c])?));
    }
    let per_channel = x.transpose(0, 1)?.contiguous()?.reshape((c, ()))?;
    let mean = per_channel.mean_keepdim(1)?;
    let var = per_channel.broadcast_sub(&mean)?.sqr()?.mean(1)?;
    Ok((mean.squeeze(1)?, var))
}

/// The mean and biased variance of each of the `c` channels of `v`, laid out `[n, c,
/// inner]`, as f32 (see [`batch_stats`]).
fn channel_stats(v: &[f32], n: usize, c: usize, inner: usize) -> (Vec<f32>, Vec<f32>) {
    use rayon::prelude::*;
    let count = (n * inner) as f64;
    let planes = |ch: usize| (0..n).map(move |i| &v[(i * c + ch) * inner..][..inner]);
    (0..c)
        .into_par_iter()
        .with_min_len((1 << 14) / (n * inner).max(1))
        .map(|ch| {
            let mean = planes(ch).map(|p| sum_f64(p, |x| x)).sum::<f64>() / count;
            let ss = planes(ch)
                .map(|p| sum_f64(p, |x| (x - mean) * (x - mean)))
                .sum::<f64>();
            (mean as f32, (ss / count) as f32)
        })
        .unzip()
}

/// The sum of `f` of each value of `v` (in f64), over eight running sums (one dependent add
/// chain would take the add's latency per value; eight let the compiler vectorise).
#[inline]
fn sum_f64(v: &[f32], f: impl Fn(f64) -> f64) -> f64 {
    let mut acc = [0f64; 8];
    let chunks = v.chunks_exact(8);
    let tail: f64 = chunks.remainder().iter().map(|&x| f(f64::from(x))).sum();
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += f(f64::from(x));
        }
    }
    acc.iter().sum::<f64>() + tail
}

/// `x * scale[c] + shift[c]` over channel dim 1, in one pass over contiguous data.
fn scale_shift(x: &Tensor, scale: &Tensor, shift: &Tensor) -> OpResult<Tensor> {
    let dims = x.dims().to_vec();
    let c = dims.get(1).copied().unwrap_or(1);
    let inner: usize = dims.iter().skip(2).product();
    if x.dtype() == candle_core::DType::F64 {
        // float64 through candle's generic ops, in f64.
        let f64_of = |t: &Tensor| super::as_dtype(t, candle_core::DType::F64);
        return Ok(x
            .broadcast_mul(&f64_of(scale)?)?
            .broadcast_add(&f64_of(shift)?)?);
    }
    let (sc, sh) = (super::f32_vec(scale)?, super::f32_vec(shift)?);
    if sc.len() != c || sh.len() != c || dims.len() < 2 {
        return Ok(x.broadcast_mul(scale)?.broadcast_add(shift)?);
    }
    let x = super::float(x)?;
    let x = super::strided::contiguous_f32(&x).unwrap_or(x);
    let inner = inner.max(1);
    let planes = ((1 << 14) / inner).max(1);
    let y = super::fused::with_f32(&x, |src| {
        // SAFETY: `simd_map` writes every element of each plane of each chunk.
        #[allow(unsafe_code)]
        unsafe {
            super::fused::written(src.len(), planes * inner, |at, out| {
                for (j, o) in out.chunks_mut(inner).enumerate() {
                    let plane = at / inner + j;
                    let (a, b) = (sc[plane % c], sh[plane % c]);
                    let s = &src[plane * inner..][..o.len()];
                    super::fused::simd_map(o, s, move |v| v * a + b);
                }
            })
        }
    });
    match y {
        Some(y) => super::from_f32(y, &dims),
        None => Ok(x.broadcast_mul(scale)?.broadcast_add(shift)?),
    }
}

/// Normalize `x` over its last `k` dims: returns (y, mean, rstd) with mean/rstd keeping dims.
fn normalize_last(x: &Tensor, k: usize, eps: f64) -> OpResult<(Tensor, Tensor, Tensor)> {
    let r = x.rank();
    if k > r {
        op_bail!("cannot normalize {k} dims of a rank-{r} tensor");
    }
    let lead: Vec<usize> = x.dims()[..r - k].to_vec();
    let mut flat = lead.clone();
    flat.push(x.dims()[r - k..].iter().product());
    let xf = x.reshape(flat)?;
    let mean = xf.mean_keepdim(candle_core::D::Minus1)?;
    let xc = xf.broadcast_sub(&mean)?;
    let var = xc.sqr()?.mean_keepdim(candle_core::D::Minus1)?;
    let rstd = var.affine(1.0, eps)?.sqrt()?.recip()?;
    let y = xc.broadcast_mul(&rstd)?.reshape(x.shape())?;
    Ok((y, mean, rstd))
}

fn layer_norm(a: &Args) -> OpResult<Outputs> {
    let x = float(&a.tensor("input")?)?;
    let shape = a.ints("normalized_shape")?;
    let eps = a.float_or("eps", 1e-5)?;
    let k = shape.len();
    let native = a.node().target.contains("native_layer_norm");
    // mean/rstd have the input's leading dims and size-1 normalized dims.
    let stat_shape = || -> Vec<usize> {
        let mut s: Vec<usize> = x.dims()[..x.rank().saturating_sub(k)].to_vec();
        s.extend(std::iter::repeat_n(1, k));
        s
    };
    if k <= x.rank() {
        let n: usize = x.dims()[x.rank() - k..].iter().product();
        let (w, b) = (a.opt_tensor("weight")?, a.opt_tensor("bias")?);
        let (w, b) = (
            w.map(|t| float(&t)).transpose()?,
            b.map(|t| float(&t)).transpose()?,
        );
        // A view (ConvNeXt's channels-last norm of a permuted map) copied first, on the
        // pool's threads: the fused pass reads contiguous rows.
        let xc = super::strided::contiguous_f32(&x).unwrap_or_else(|| x.clone());
        let fused = super::fused::layer_norm(&xc, n, w.as_ref(), b.as_ref(), eps, native);
        match fused {
            Some((y, Some((mean, rstd)))) => {
                return Ok(vec![
                    Value::Tensor(y),
                    Value::Tensor(mean.reshape(stat_shape())?),
                    Value::Tensor(rstd.reshape(stat_shape())?),
                ]);
            }
            Some((y, None)) => return one(y),
            None => {}
        }
    }
    let (mut y, mean, rstd) = normalize_last(&x, k, eps)?;
    if let Some(w) = a.opt_tensor("weight")? {
        y = y.broadcast_mul(&float(&w)?)?;
    }
    if let Some(b) = a.opt_tensor("bias")? {
        y = y.broadcast_add(&float(&b)?)?;
    }
    if native {
        return Ok(vec![
            Value::Tensor(y),
            Value::Tensor(mean.reshape(stat_shape())?),
            Value::Tensor(rstd.reshape(stat_shape())?),
        ]);
    }
    one(y)
}

fn group_norm(a: &Args) -> OpResult<Outputs> {
    let x = float(&a.tensor("input")?)?;
    let native = a.node().target.contains("native_group_norm");
    let groups = usize_of(
        if native {
            a.int("group")?
        } else {
            a.int("num_groups")?
        },
        "num_groups",
    )?;
    let eps = a.float_or("eps", 1e-5)?;
    let dims = x.dims().to_vec();
    if dims.len() < 2 || groups == 0 || dims[1] % groups != 0 {
        op_bail!("group_norm: {groups} groups do not divide the input of shape {dims:?}");
    }
    let n = dims[0];
    let xg = x.reshape((n, groups, ()))?;
    let (y, mean, rstd) = normalize_last(&xg, 1, eps)?;
    let mut y = y.reshape(dims.as_slice())?;
    let r = dims.len();
    if let Some(w) = a.opt_tensor("weight")? {
        y = y.broadcast_mul(&per_channel(&w, r)?)?;
    }
    if let Some(b) = a.opt_tensor("bias")? {
        y = y.broadcast_add(&per_channel(&b, r)?)?;
    }
    if native {
        return Ok(vec![
            Value::Tensor(y),
            Value::Tensor(mean.reshape((n, groups))?),
            Value::Tensor(rstd.reshape((n, groups))?),
        ]);
    }
    one(y)
}

/// `_weight_norm(v, g, dim=0)`: `v * g / ‖v‖`, the 2-norm taken over every dim but `dim`
/// (over the whole tensor when `dim` is -1, as torch's `norm_except_dim` does).
fn weight_norm(a: &Args) -> OpResult<Outputs> {
    let v = float(&a.tensor("v")?)?;
    let g = float(&a.tensor("g")?)?;
    let d = a.int_or("dim", 0)?;
    let sq = v.sqr()?;
    let norm = if d == -1 {
        sq.sum_all()?.sqrt()?
    } else {
        let keep = super::dim(d, v.rank())?;
        let mut n = sq;
        for other in (0..v.rank()).filter(|&i| i != keep) {
            n = n.sum_keepdim(other)?;
        }
        n.sqrt()?
    };
    one(v.broadcast_mul(&g.broadcast_div(&norm)?)?)
}

/// `instance_norm(input, weight, bias, running_mean, running_var, use_input_stats, momentum,
/// eps, cudnn_enabled)`: each (image, channel) plane normalized by its own statistics, then
/// the per-channel affine; with `use_input_stats` false, the running statistics as batch norm
/// in inference. Using the input's statistics while running ones are given would update
/// them (training mode), a side effect not run here.
fn instance_norm(a: &Args) -> OpResult<Outputs> {
    let x = float(&a.tensor("input")?)?;
    let eps = a.float_or("eps", 1e-5)?;
    let running = (a.opt_tensor("running_mean")?, a.opt_tensor("running_var")?);
    let dims = x.dims().to_vec();
    if dims.len() < 2 {
        op_bail!("instance_norm needs an input of rank at least 2, got {dims:?}");
    }
    let r = dims.len();
    let mut y = if a.bool_or("use_input_stats", true)? {
        if running.0.is_some() || running.1.is_some() {
            op_bail!("instance_norm with running statistics in training mode is not supported (export the model in eval mode)");
        }
        if dims[2..].iter().product::<usize>() == 0 {
            op_bail!("instance_norm over empty planes");
        }
        let planes = x.reshape((dims[0] * dims[1], ()))?;
        normalize_last(&planes, 1, eps)?
            .0
            .reshape(dims.as_slice())?
    } else {
        let (Some(mean), Some(var)) = running else {
            op_bail!("instance_norm without input statistics needs running_mean and running_var");
        };
        let inv = per_channel(&var, r)?.affine(1.0, eps)?.sqrt()?.recip()?;
        x.broadcast_sub(&per_channel(&mean, r)?)?
            .broadcast_mul(&inv)?
    };
    if let Some(w) = a.opt_tensor("weight")? {
        y = y.broadcast_mul(&per_channel(&w, r)?)?;
    }
    if let Some(b) = a.opt_tensor("bias")? {
        y = y.broadcast_add(&per_channel(&b, r)?)?;
    }
    one(y)
}

/// `rms_norm(input, normalized_shape, weight=None, eps=None)`: `x / sqrt(mean(x²) + eps)`
/// over the last dims, times `weight`; `eps` defaults to the dtype's machine epsilon, as in
/// torch.
fn rms_norm(a: &Args) -> OpResult<Outputs> {
    let x = float(&a.tensor("input")?)?;
    let shape = a.ints("normalized_shape")?;
    let (k, r) = (shape.len(), x.rank());
    if k > r
        || k == 0
        || !x.dims()[r - k..]
            .iter()
            .zip(&shape)
            .all(|(&d, &s)| d as i64 == s)
    {
        op_bail!(
            "rms_norm over the last dims {shape:?} of an input of shape {:?}",
            x.dims()
        );
    }
    let eps = match a.opt_float("eps")? {
        Some(e) => e,
        None if x.dtype() == candle_core::DType::F64 => f64::EPSILON,
        None => f32::EPSILON as f64,
    };
    let mut flat: Vec<usize> = x.dims()[..r - k].to_vec();
    flat.push(x.dims()[r - k..].iter().product());
    let xf = x.reshape(flat)?;
    let ms = xf.sqr()?.mean_keepdim(candle_core::D::Minus1)?;
    let inv = ms.affine(1.0, eps)?.sqrt()?.recip()?;
    let mut y = xf.broadcast_mul(&inv)?.reshape(x.shape())?;
    if let Some(w) = a.opt_tensor("weight")? {
        y = y.broadcast_mul(&super::as_dtype(&w, y.dtype())?)?;
    }
    one(y)
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::*;

    /// Values of every magnitude, some far from their channel's mean.
    fn input(shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|i| ((i * 7919 % 263) as f32 - 131.0) * 0.37 + (i % 5) as f32 * 100.0)
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1().unwrap()
    }

    /// The statistics in one pass per channel are those of candle's ops in f64 (the channel's
    /// values gathered, their mean, the mean of the squared differences from it), for a
    /// contiguous input, a transposed view, and channels of one value each.
    #[test]
    fn batch_stats_are_those_of_the_channels_values() {
        let x = input(&[3, 5, 7, 4]);
        for x in [
            x.clone(),
            input(&[5, 3, 7, 4]).transpose(0, 1).unwrap(),
            input(&[4, 6]),
        ] {
            let (mean, var) = batch_stats(&x).unwrap();
            let c = x.dims()[1];
            let x64 = x.to_dtype(candle_core::DType::F64).unwrap();
            let per = x64.transpose(0, 1).unwrap().contiguous().unwrap();
            let per = per.reshape((c, ())).unwrap();
            let m = per.mean_keepdim(1).unwrap();
            let v = per
                .broadcast_sub(&m)
                .unwrap()
                .sqr()
                .unwrap()
                .mean(1)
                .unwrap();
            let want = |t: Tensor| -> Vec<f32> {
                let t = t
                    .flatten_all()
                    .unwrap()
                    .to_dtype(candle_core::DType::F32)
                    .unwrap();
                t.to_vec1().unwrap()
            };
            assert_eq!(values(&mean), want(m), "{:?}", x.dims());
            assert_eq!(values(&var), want(v), "{:?}", x.dims());
        }
    }

    /// The per-channel `x * scale + shift` in one pass gives what candle's broadcast ops give,
    /// bit for bit (no fused multiply-add in either), planes of any size.
    #[test]
    fn scale_shift_is_the_broadcast_product_and_sum() {
        for shape in [&[2, 3, 5, 7][..], &[1, 4], &[3, 2, 9000]] {
            let x = input(shape);
            let c = shape[1];
            let per: Vec<f32> = (0..c).map(|i| 0.5 + i as f32 * 0.25).collect();
            let mut dims = vec![1; shape.len()];
            dims[1] = c;
            let scale = Tensor::from_vec(per.clone(), dims.as_slice(), &Device::Cpu).unwrap();
            let shift = (scale.clone() * -3.0).unwrap();
            let got = scale_shift(&x, &scale, &shift).unwrap();
            let want = x
                .broadcast_mul(&scale)
                .unwrap()
                .broadcast_add(&shift)
                .unwrap();
            assert_eq!(got.dims(), x.dims());
            assert_eq!(values(&got), values(&want), "{shape:?}");
        }
    }

    /// A layer norm of a permuted view (ConvNeXt's channels-last norm) is the norm of the
    /// same values laid out contiguously, and the mean and variance formula's result.
    #[test]
    fn layer_norm_of_a_view_is_that_of_its_values() {
        use crate::schema::Node;
        use crate::value::{Args, Env, Value};
        let x = input(&[2, 6, 5, 7]).permute((0, 2, 3, 1)).unwrap();
        assert!(!x.is_contiguous());
        let w = Tensor::from_vec(vec![0.5f32, 1.0, 1.5, 2.0, 2.5, 3.0], 6, &Device::Cpu).unwrap();
        let b = (w.clone() * -1.0).unwrap();
        let node: Node = serde_json::from_value(serde_json::json!({
            "target": "torch.ops.aten.layer_norm.default",
            "inputs": [
                {"name": "input", "arg": {"as_tensor": {"name": "x"}}},
                {"name": "normalized_shape", "arg": {"as_ints": [6]}},
                {"name": "weight", "arg": {"as_tensor": {"name": "w"}}},
                {"name": "bias", "arg": {"as_tensor": {"name": "b"}}},
                {"name": "eps", "arg": {"as_float": 1e-5}}],
            "outputs": [{"as_tensor": {"name": "y"}}]}))
        .unwrap();
        let run = |x: &Tensor| {
            let mut env = Env::default();
            env.insert("x".into(), Value::Tensor(x.clone()));
            env.insert("w".into(), Value::Tensor(w.clone()));
            env.insert("b".into(), Value::Tensor(b.clone()));
            let Value::Tensor(y) = layer_norm(&Args::new(&node, &env)).unwrap().remove(0) else {
                panic!("not a tensor")
            };
            y
        };
        let got = run(&x);
        assert_eq!(values(&got), values(&run(&x.contiguous().unwrap())));
        let (y, _, _) = normalize_last(&x, 1, 1e-5).unwrap();
        let want = y.broadcast_mul(&w).unwrap().broadcast_add(&b).unwrap();
        for (g, w) in values(&got).iter().zip(values(&want)) {
            assert!((g - w).abs() < 1e-4, "{g} against {w}");
        }
    }
}
