//! Resampling: upsample_nearest2d and upsample_bilinear2d (align_corners both ways, sizes or
//! scale factors), following ATen's source-index arithmetic. Bilinear is separable, so it runs
//! as two small matrix products with the interpolation matrices.

use candle_core::{Device, Tensor};

use super::{float, usize_of, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs};

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    r.add("aten.upsample_bilinear2d.vec", bilinear);
    r.add("aten.upsample_bilinear2d.default", bilinear);
    r.add("aten.upsample_nearest2d.vec", nearest);
    r.add("aten.upsample_nearest2d.default", nearest);
}

/// Output sizes and the optional user scale factors of an upsample call.
fn sizes(a: &Args, x: &Tensor) -> OpResult<([usize; 2], [Option<f64>; 2])> {
    if x.rank() != 4 {
        op_bail!(
            "2-d upsampling expects a 4-d input, got shape {:?}",
            x.dims()
        );
    }
    let (h, w) = (x.dims()[2], x.dims()[3]);
    let input_name = if a.has("input") { "input" } else { "self" };
    let _ = input_name;
    let scales = match a.opt_floats("scale_factors")? {
        Some(s) if s.len() == 2 => [Some(s[0]), Some(s[1])],
        Some(s) => op_bail!("scale_factors {s:?} must have 2 values"),
        None => [a.opt_float("scales_h")?, a.opt_float("scales_w")?],
    };
    let out = match a.opt_ints("output_size")? {
        Some(v) if v.len() == 2 => [
            usize_of(v[0], "output size")?,
            usize_of(v[1], "output size")?,
        ],
        Some(v) => op_bail!("output_size {v:?} must have 2 values"),
        None => match scales {
            [Some(sh), Some(sw)] => [
                (h as f64 * sh).floor() as usize,
                (w as f64 * sw).floor() as usize,
            ],
            _ => op_bail!("upsample needs output_size or scale_factors"),
        },
    };
    Ok((out, scales))
}

/// ATen's `area_pixel_compute_scale`.
fn area_scale(inp: usize, out: usize, align: bool, scale: Option<f64>) -> f64 {
    if align {
        if out > 1 {
            (inp as f64 - 1.0) / (out as f64 - 1.0)
        } else {
            0.0
        }
    } else {
        match scale {
            Some(s) if s > 0.0 => 1.0 / s,
            _ => inp as f64 / out as f64,
        }
    }
}

/// Interpolation matrix [out, inp] for linear resampling along one dim, in f64 (as torch
/// computes the weights for float64 input).
fn linear_matrix_f64(inp: usize, out: usize, align: bool, scale: Option<f64>) -> OpResult<Tensor> {
    let s = area_scale(inp, out, align, scale);
    let mut m = vec![0f64; out * inp];
    for o in 0..out {
        let src = if align {
            s * o as f64
        } else {
            (s * (o as f64 + 0.5) - 0.5).max(0.0)
        };
        let i0 = (src.floor() as usize).min(inp - 1);
        let i1 = if i0 < inp - 1 { i0 + 1 } else { i0 };
        let l1 = src - i0 as f64;
        let l0 = 1.0 - l1;
        m[o * inp + i0] += l0;
        m[o * inp + i1] += l1;
    }
    Ok(Tensor::from_vec(m, (out, inp), &Device::Cpu)?)
}

/// Interpolation matrix [out, inp] for linear resampling along one dim.
fn linear_matrix(inp: usize, out: usize, align: bool, scale: Option<f64>) -> OpResult<Tensor> {
    let s = area_scale(inp, out, align, scale) as f32;
    let mut m = vec![0f32; out * inp];
    for o in 0..out {
        let src = if align {
            s * o as f32
        } else {
            (s * (o as f32 + 0.5) - 0.5).max(0.0)
        };
        let i0 = (src.floor() as usize).min(inp - 1);
        let i1 = if i0 < inp - 1 { i0 + 1 } else { i0 };
        let l1 = src - i0 as f32;
        let l0 = 1.0 - l1;
        m[o * inp + i0] += l0;
        m[o * inp + i1] += l1;
    }
    Ok(Tensor::from_vec(m, (out, inp), &Device::Cpu)?)
}

fn bilinear(a: &Args) -> OpResult<Outputs> {
    let x = float(&a.tensor(if a.has("input") { "input" } else { "self" })?)?;
    let align = a.bool_or("align_corners", false)?;
    let ([oh, ow], [sh, sw]) = sizes(a, &x)?;
    let (h, w) = (x.dims()[2], x.dims()[3]);
    if h == 0 || w == 0 || oh == 0 || ow == 0 {
        op_bail!("upsample of an empty tensor");
    }
    let matrix = if x.dtype() == candle_core::DType::F64 {
        linear_matrix_f64
    } else {
        linear_matrix
    };
    let mh = matrix(h, oh, align, sh)?;
    let mw = matrix(w, ow, align, sw)?;
    // [N,C,H,W] @ mwᵀ -> [N,C,H,ow]; mh @ that -> [N,C,oh,ow].
    let (n, c) = (x.dims()[0], x.dims()[1]);
    let y = x.contiguous()?.reshape((n * c * h, w))?.matmul(&mw.t()?)?;
    let y = y.reshape((n * c, h, ow))?;
    let y = mh.broadcast_left(n * c)?.matmul(&y)?;
    one(y.reshape((n, c, oh, ow))?)
}

fn nearest(a: &Args) -> OpResult<Outputs> {
    let x = a.tensor(if a.has("input") { "input" } else { "self" })?;
    let ([oh, ow], [sh, sw]) = sizes(a, &x)?;
    let (h, w) = (x.dims()[2], x.dims()[3]);
    let idx = |inp: usize, out: usize, scale: Option<f64>| -> OpResult<Tensor> {
        let s = area_scale(inp, out, false, scale) as f32;
        let v: Vec<i64> = (0..out)
            .map(|o| ((o as f32 * s).floor() as i64).min(inp as i64 - 1))
            .collect();
        Ok(Tensor::from_vec(v, out, &Device::Cpu)?)
    };
    let y = x
        .contiguous()?
        .index_select(&idx(h, oh, sh)?, 2)?
        .index_select(&idx(w, ow, sw)?, 3)?;
    one(y)
}
