//! Resampling over 1, 2 or 3 trailing dims, following ATen's source-index arithmetic:
//! `upsample_nearest{1,2,3}d`, `_upsample_nearest_exact{1,2,3}d` (any dtype, a gather per
//! axis), `upsample_linear1d`, `upsample_bilinear2d`, `upsample_trilinear3d` and
//! `upsample_bicubic2d` (A = -0.75, clamped taps), the antialiased
//! `_upsample_bilinear2d_aa` / `_upsample_bicubic2d_aa` (A = -0.5, the filter widened by the
//! downscaling factor, weights normalized), align_corners both ways, given sizes or scale
//! factors (`.vec` and `.default` overloads).
//!
//! Linear and cubic resampling are separable: each axis gets, per output index, its taps
//! (input index, weight) as ATen computes them in the tensor's float type, and the axes are
//! applied one after another, last first (the order of ATen's nested interpolation).

use candle_core::{DType, Device, Tensor};

use super::{float, result_numel, usize_of, Real, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs};

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    for name in [
        "aten.upsample_nearest1d.vec",
        "aten.upsample_nearest1d.default",
        "aten.upsample_nearest2d.vec",
        "aten.upsample_nearest2d.default",
        "aten.upsample_nearest3d.vec",
        "aten.upsample_nearest3d.default",
        "aten._upsample_nearest_exact1d.vec",
        "aten._upsample_nearest_exact1d.default",
        "aten._upsample_nearest_exact2d.vec",
        "aten._upsample_nearest_exact2d.default",
        "aten._upsample_nearest_exact3d.vec",
        "aten._upsample_nearest_exact3d.default",
        "aten.upsample_linear1d.vec",
        "aten.upsample_linear1d.default",
        "aten.upsample_bilinear2d.vec",
        "aten.upsample_bilinear2d.default",
        "aten.upsample_trilinear3d.vec",
        "aten.upsample_trilinear3d.default",
        "aten.upsample_bicubic2d.vec",
        "aten.upsample_bicubic2d.default",
        "aten._upsample_bilinear2d_aa.vec",
        "aten._upsample_bilinear2d_aa.default",
        "aten._upsample_bicubic2d_aa.vec",
        "aten._upsample_bicubic2d_aa.default",
    ] {
        r.add(name, upsample);
    }
}

/// How one axis maps output indices to input positions.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Nearest,
    NearestExact,
    Linear,
    Cubic,
    /// Antialiased (`_aa`): the linear (2) or cubic (4) filter over `support` taps.
    Antialias(usize),
}

/// The scale-factor argument names of a `.default` overload with `nd` resampled dims.
fn scale_names(nd: usize) -> &'static [&'static str] {
    match nd {
        1 => &["scales"],
        2 => &["scales_h", "scales_w"],
        _ => &["scales_d", "scales_h", "scales_w"],
    }
}

/// `upsample_*` for the mode and rank its name gives.
fn upsample(a: &Args) -> OpResult<Outputs> {
    let target = a.node().target.as_str();
    let mode = if target.contains("_aa.") {
        Mode::Antialias(if target.contains("bicubic") { 4 } else { 2 })
    } else if target.contains("nearest_exact") {
        Mode::NearestExact
    } else if target.contains("nearest") {
        Mode::Nearest
    } else if target.contains("bicubic") {
        Mode::Cubic
    } else {
        Mode::Linear
    };
    let nd = if target.contains("1d") {
        1
    } else if target.contains("2d") {
        2
    } else {
        3
    };
    let x = a.tensor(if a.has("input") { "input" } else { "self" })?;
    if x.rank() != nd + 2 {
        op_bail!(
            "{nd}-d upsampling expects a {}-d input, got shape {:?}",
            nd + 2,
            x.dims()
        );
    }
    let inp = x.dims()[2..].to_vec();
    let scales: Vec<Option<f64>> = match a.opt_floats("scale_factors")? {
        Some(s) if s.len() == nd => s.into_iter().map(Some).collect(),
        Some(s) => op_bail!("scale_factors {s:?} must have {nd} values"),
        None => scale_names(nd)
            .iter()
            .map(|n| a.opt_float(n))
            .collect::<OpResult<_>>()?,
    };
    let out: Vec<usize> = match a.opt_ints("output_size")? {
        Some(v) if v.len() == nd => v
            .iter()
            .map(|&o| usize_of(o, "output size"))
            .collect::<OpResult<_>>()?,
        Some(v) => op_bail!("output_size {v:?} must have {nd} values"),
        None => inp
            .iter()
            .zip(&scales)
            .map(|(&n, s)| match s {
                Some(s) if s.is_finite() && *s > 0.0 && n as f64 * s < 1e15 => {
                    Ok((n as f64 * s) as usize)
                }
                _ => {
                    op_bail!("upsample needs output_size or positive scale_factors, got {scales:?}")
                }
            })
            .collect::<OpResult<_>>()?,
    };
    if inp.contains(&0) || out.contains(&0) {
        op_bail!("upsample needs non-empty input and output sizes, got {inp:?} and {out:?}");
    }
    let mut shape = x.dims()[..2].to_vec();
    shape.extend(&out);
    result_numel(&shape, "upsample")?;
    let align = a.bool_or("align_corners", false)?;
    if matches!(mode, Mode::Nearest | Mode::NearestExact) {
        let mut y = x.contiguous()?;
        for (k, ((&i, &o), &s)) in inp.iter().zip(&out).zip(&scales).enumerate() {
            let idx: Vec<i64> = (0..o).map(|j| nearest(mode, j, i, o, s)).collect();
            y = y.index_select(&Tensor::from_vec(idx, o, &Device::Cpu)?, k + 2)?;
        }
        return one(y);
    }
    let x = float(&x)?;
    let y = if x.dtype() == DType::F64 {
        separable::<f64>(&x, mode, align, &out, &scales)?
    } else {
        separable::<f32>(&x, mode, align, &out, &scales)?
    };
    one(y)
}

/// ATen's `nearest_idx` / `nearest_exact_idx`: the scale in f32 whatever the dtype.
fn nearest(mode: Mode, o: usize, inp: usize, out: usize, scale: Option<f64>) -> i64 {
    let s = match scale {
        Some(s) if s > 0.0 => (1.0 / s) as f32,
        _ => inp as f32 / out as f32,
    };
    let last = inp as i64 - 1;
    if mode == Mode::NearestExact {
        return (((o as f64 + 0.5) * s as f64) as f32)
            .floor()
            .min(last as f32) as i64;
    }
    if out == inp {
        o as i64
    } else if out == 2 * inp {
        (o >> 1) as i64
    } else {
        ((o as f32 * s).floor() as i64).min(last)
    }
}

/// Per output index of one axis: `n` taps of (input index, weight).
struct Taps<T> {
    n: usize,
    idx: Vec<usize>,
    w: Vec<T>,
}

/// ATen's `area_pixel_compute_scale` in the tensor's float type.
fn area_scale<T: Real>(inp: usize, out: usize, align: bool, scale: Option<f64>) -> T {
    if align {
        if out > 1 {
            T::from_f64((inp - 1) as f64) / T::from_f64((out - 1) as f64)
        } else {
            T::zero()
        }
    } else {
        match scale {
            Some(s) if s > 0.0 => T::from_f64(1.0 / s),
            _ => T::from_f64(inp as f64) / T::from_f64(out as f64),
        }
    }
}

/// ATen's `guard_index_and_lambda`: the floor index (at most `inp - 1`) and the fraction,
/// clamped to [0, 1].
fn guard<T: Real>(src: T, inp: usize) -> (i64, T) {
    let i = (src.floor().to_f64() as i64).min(inp as i64 - 1);
    let mut l = src - T::from_f64(i as f64);
    if l < T::zero() {
        l = T::zero();
    }
    if l > T::one() {
        l = T::one();
    }
    (i, l)
}

/// ATen's antialiasing filters: the triangle (`size` 2) or Keys' cubic with A = -0.5.
fn aa_filter<T: Real>(size: usize, x: T) -> T {
    let x = if x < T::zero() { T::zero() - x } else { x };
    let (one, two) = (T::one(), T::from_f64(2.0));
    if size == 2 {
        return if x < one { one - x } else { T::zero() };
    }
    let a = T::from_f64(-0.5);
    if x < one {
        ((a + two) * x - (a + T::from_f64(3.0))) * x * x + one
    } else if x < two {
        ((a * x - T::from_f64(5.0) * a) * x + T::from_f64(8.0) * a) * x - T::from_f64(4.0) * a
    } else {
        T::zero()
    }
}

/// The taps of one axis for antialiased resampling as ATen computes them: each output's
/// window centred at `scale (o + 0.5)`, `size / 2 · max(scale, 1)` wide each way, its filter
/// weights (the filter stretched by the scale when downsampling) normalized to sum to 1;
/// windows shorter than the widest are padded with zero weights.
fn aa_taps<T: Real>(
    size: usize,
    inp: usize,
    out: usize,
    align: bool,
    scale: Option<f64>,
) -> Taps<T> {
    let s: T = area_scale(inp, out, align, scale);
    let one = T::one();
    let half = T::from_f64(0.5);
    let wide = s >= one;
    let support = T::from_f64(size as f64 * 0.5) * if wide { s } else { one };
    let inv = if wide { one / s } else { one };
    let n = (support.to_f64().ceil() as usize) * 2 + 1;
    let (mut idx, mut w) = (vec![0usize; out * n], vec![T::zero(); out * n]);
    for o in 0..out {
        let center = s * (T::from_f64(o as f64) + half);
        let lo = ((center - support + half).to_f64() as i64).max(0);
        let hi = ((center + support + half).to_f64() as i64).min(inp as i64);
        let len = (hi - lo).clamp(0, n as i64) as usize;
        let mut total = T::zero();
        for j in 0..len {
            let x = (T::from_f64((j as i64 + lo) as f64) - center + half) * inv;
            let v = aa_filter(size, x);
            idx[o * n + j] = lo as usize + j;
            w[o * n + j] = v;
            total += v;
        }
        if total != T::zero() {
            for v in &mut w[o * n..o * n + len] {
                *v /= total;
            }
        }
    }
    Taps { n, idx, w }
}

/// The taps of one axis for linear (2) or cubic (4) resampling.
fn taps<T: Real>(mode: Mode, inp: usize, out: usize, align: bool, scale: Option<f64>) -> Taps<T> {
    if let Mode::Antialias(size) = mode {
        return aa_taps(size, inp, out, align, scale);
    }
    let s: T = area_scale(inp, out, align, scale);
    let half = T::from_f64(0.5);
    let n = if mode == Mode::Cubic { 4 } else { 2 };
    let (mut idx, mut w) = (Vec::with_capacity(out * n), Vec::with_capacity(out * n));
    for o in 0..out {
        let of = T::from_f64(o as f64);
        let src = if align {
            s * of
        } else {
            s * (of + half) - half
        };
        if mode == Mode::Linear {
            if inp == out && !align {
                idx.extend([o, o]);
                w.extend([T::one(), T::zero()]);
                continue;
            }
            let src = if src < T::zero() { T::zero() } else { src };
            let (i0, l1) = guard(src, inp);
            let i0 = i0.max(0) as usize;
            let i1 = if i0 < inp - 1 { i0 + 1 } else { i0 };
            idx.extend([i0, i1]);
            w.extend([T::one() - l1, l1]);
        } else {
            let (i, t) = guard(src, inp);
            let a = T::from_f64(-0.75);
            let (two, three, four, five, eight) = (
                T::from_f64(2.0),
                T::from_f64(3.0),
                T::from_f64(4.0),
                T::from_f64(5.0),
                T::from_f64(8.0),
            );
            let near = |x: T| ((a + two) * x - (a + three)) * x * x + T::one();
            let far = |x: T| ((a * x - five * a) * x + eight * a) * x - four * a;
            let one = T::one();
            w.extend([far(t + one), near(t), near(one - t), far(two - t)]);
            for j in 0..4 {
                idx.push((i - 1 + j).clamp(0, inp as i64 - 1) as usize);
            }
        }
    }
    Taps { n, idx, w }
}

/// Linear or cubic resampling of the trailing dims of `x` to `out`, one axis at a time.
fn separable<T: Real>(
    x: &Tensor,
    mode: Mode,
    align: bool,
    out: &[usize],
    scales: &[Option<f64>],
) -> OpResult<Tensor> {
    use rayon::prelude::*;
    let mut shape = x.dims().to_vec();
    let mut data = x.flatten_all()?.to_vec1::<T>()?;
    let nd = out.len();
    for k in (0..nd).rev() {
        let ax = k + 2;
        let (inp, o) = (shape[ax], out[k]);
        let t: Taps<T> = taps(mode, inp, o, align, scales[k]);
        let outer: usize = shape[..ax].iter().product();
        let inner: usize = shape[ax + 1..].iter().product();
        let mut next = vec![T::zero(); outer * o * inner];
        if inner > 0 {
            next.par_chunks_mut(o * inner)
                .zip(data.par_chunks(inp * inner))
                .for_each(|(dst, src)| {
                    for j in 0..o {
                        let row = &mut dst[j * inner..][..inner];
                        for q in 0..t.n {
                            let (i, w) = (t.idx[j * t.n + q], t.w[j * t.n + q]);
                            for (d, &s) in row.iter_mut().zip(&src[i * inner..][..inner]) {
                                *d += w * s;
                            }
                        }
                    }
                });
        }
        data = next;
        shape[ax] = o;
    }
    Ok(Tensor::from_vec(data, shape, &Device::Cpu)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A crafted output size is refused before anything is allocated.
    #[test]
    fn huge_output_size_is_refused() {
        let x = Tensor::zeros((1, 1, 2, 2), DType::F32, &Device::Cpu).unwrap();
        let err = super::super::run_node(
            register,
            "aten.upsample_bicubic2d.vec",
            &[
                ("input", json!({"as_tensor": {"name": "x"}})),
                ("output_size", json!({"as_ints": [1 << 30, 1 << 30]})),
                ("align_corners", json!({"as_bool": false})),
            ],
            &[("x", x)],
        )
        .unwrap_err();
        assert!(err.0.contains("is too large"), "{}", err.0);
    }
}
