//! 3-d pooling on `[N, C, D, H, W]` or `[C, D, H, W]`: `max_pool3d` and
//! `max_pool3d_with_indices` (padding, dilation, ceil_mode; indices into each D·H·W volume)
//! `avg_pool3d` (padding, ceil_mode, count_include_pad, divisor_override) and
//! `adaptive_max_pool3d` (values and indices), direct kernels with ATen's window arithmetic, in
//! f32 (f64 for float64).

use candle_core::{DType, Device, Tensor};

use super::fused::with_f32;
use super::pool::pool_len;
use super::volume::triple;
use super::{float, result_numel, Real, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs, Value};

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    r.add("aten.max_pool3d.default", max_pool3d);
    r.add("aten.max_pool3d_with_indices.default", max_pool3d);
    r.add("aten.avg_pool3d.default", avg_pool3d);
    r.add("aten.adaptive_max_pool3d.default", adaptive_max_pool3d);
}

/// The window parameters of a 3-d pool.
struct Window {
    k: [usize; 3],
    s: [usize; 3],
    p: [usize; 3],
    d: [usize; 3],
    /// `ceil_mode`: output sizes rounded up.
    ceil: bool,
}

/// Input and geometry: the tensor, its leading dims, input and output sizes.
type Geometry = (Tensor, Vec<usize>, [usize; 3], [usize; 3]);

/// Read `self`, kernel, stride, padding, dilation (when `dilated`) and the output size.
fn window(a: &Args, dilated: bool) -> OpResult<(Geometry, Window)> {
    let x = float(&a.tensor("self")?)?;
    if x.rank() != 4 && x.rank() != 5 {
        op_bail!(
            "3-d pooling expects a 4-d or 5-d input, got shape {:?}",
            x.dims()
        );
    }
    let k = triple(&a.ints("kernel_size")?, "kernel_size")?;
    let s = match a.ints_or("stride", &[])? {
        v if v.is_empty() => k,
        v => triple(&v, "stride")?,
    };
    let p = triple(&a.ints_or("padding", &[0])?, "padding")?;
    let d = if dilated {
        triple(&a.ints_or("dilation", &[1])?, "dilation")?
    } else {
        [1; 3]
    };
    if d.contains(&0) {
        op_bail!("pooling dilation must be positive");
    }
    let ceil = a.bool_or("ceil_mode", false)?;
    let r = x.rank();
    let inp = [x.dims()[r - 3], x.dims()[r - 2], x.dims()[r - 1]];
    if inp.contains(&0) {
        op_bail!("3-d pooling of an empty input {:?}", x.dims());
    }
    let mut out = [0; 3];
    for i in 0..3 {
        out[i] = pool_len(inp[i], k[i], p[i], s[i], d[i], ceil)?;
    }
    let lead = x.dims()[..r - 3].to_vec();
    let mut shape = lead.clone();
    shape.extend(out);
    result_numel(&shape, "3-d pooling")?;
    Ok((
        (x.contiguous()?, lead, inp, out),
        Window { k, s, p, d, ceil },
    ))
}

/// The input positions of output index `o` along one dim: start (may be negative) and the
/// in-range taps.
fn taps(o: usize, i: usize, w: &Window, len: usize) -> impl Iterator<Item = usize> {
    let (k, s, p, d) = (w.k[i], w.s[i], w.p[i], w.d[i]);
    (0..k).filter_map(move |j| {
        let at = (o * s + j * d) as isize - p as isize;
        (at >= 0 && (at as usize) < len).then_some(at as usize)
    })
}

fn max_pool3d(a: &Args) -> OpResult<Outputs> {
    let ((x, lead, inp, out), w) = window(a, true)?;
    let with_indices = a.node().target.contains("with_indices");
    if !with_indices {
        if let Some(y) = max_values(&x, &lead, inp, out, &w)? {
            return one(y);
        }
    }
    let (y, idx) = if x.dtype() == DType::F64 {
        max_t::<f64>(&x, &lead, inp, out, &w)?
    } else {
        max_t::<f32>(&x, &lead, inp, out, &w)?
    };
    if with_indices {
        return Ok(vec![Value::Tensor(y), Value::Tensor(idx)]);
    }
    one(y)
}

/// Max pooling without indices of a contiguous f32 input: the max over a window is the max
/// over its depth taps of the max over its height and width, so each depth slice is pooled
/// by the 2-d kernel (`pool::max_pool_values`, vectorised, its planes in parallel) and the
/// depth taps' planes reduced elementwise (`pool::rows_max`), output planes in parallel.
/// NaN wins as in [`max_t`]; a window with no taps gives `-inf`. `None` for another dtype.
/// Element by element (`max_t`), S3D's max pools took 703 ms of its 1.2 s run at 1 thread
/// (BENCHMARKS.md, issue 14).
fn max_values(
    x: &Tensor,
    lead: &[usize],
    [id, ih, iw]: [usize; 3],
    [od, oh, ow]: [usize; 3],
    w: &Window,
) -> OpResult<Option<Tensor>> {
    use super::pool::{avx512, max_pool_values, rows_max, RowSet};
    use rayon::prelude::*;
    if x.dtype() != DType::F32 {
        return Ok(None);
    }
    let np: usize = lead.iter().product();
    let last2 = |v: [usize; 3]| [v[1], v[2]];
    let slices = x.reshape((np * id, ih, iw))?;
    let Some(pooled) = max_pool_values(
        &slices,
        last2(w.k),
        last2(w.s),
        last2(w.p),
        last2(w.d),
        w.ceil,
    )?
    else {
        return Ok(None);
    };
    let plane = oh * ow;
    if pooled.dims() != [np * id, oh, ow] {
        op_bail!(
            "3-d max pooling: planes of {:?}, expected {oh} x {ow}",
            pooled.dims()
        );
    }
    let (k, s, p, d) = (w.k[0], w.s[0], w.p[0], w.d[0]);
    let mut out = vec![f32::NEG_INFINITY; np * od * plane];
    let wide = avx512();
    // The pooled planes read where they are (the 2-d kernel's new f32 buffer).
    let done = with_f32(&pooled, |ys| {
        if plane == 0 {
            return;
        }
        out.par_chunks_mut(plane).enumerate().for_each(|(q, dst)| {
            let (pl, zo) = (q / od, q % od);
            // The depth taps of output `zo`: `zo * s - p + j * d` inside the input, in order.
            let mut taps = (0..k)
                .map(|j| (zo * s + j * d) as isize - p as isize)
                .filter(|&t| t >= 0 && (t as usize) < id);
            if let Some(first) = taps.next() {
                let rows = RowSet {
                    first: first as usize * plane,
                    count: 1 + taps.count(),
                    step: d * plane,
                };
                rows_max(dst, &ys[pl * id * plane..][..id * plane], rows, wide);
            }
        });
    });
    if done.is_none() {
        return Ok(None);
    }
    let mut shape = lead.to_vec();
    shape.extend([od, oh, ow]);
    Ok(Some(Tensor::from_vec(out, shape, &Device::Cpu)?))
}

/// Max over each window: the first maximum, or the last NaN (as ATen's CPU kernel).
fn max_t<T: Real>(
    x: &Tensor,
    lead: &[usize],
    [id, ih, iw]: [usize; 3],
    [od, oh, ow]: [usize; 3],
    w: &Window,
) -> OpResult<(Tensor, Tensor)> {
    let xs = x.flatten_all()?.to_vec1::<T>()?;
    let np: usize = lead.iter().product();
    let vol = id * ih * iw;
    let mut vals = Vec::with_capacity(np * od * oh * ow);
    let mut idxs = Vec::with_capacity(np * od * oh * ow);
    for pl in 0..np {
        let src = &xs[pl * vol..][..vol];
        for z in 0..od {
            for y in 0..oh {
                for xo in 0..ow {
                    let mut best = (-T::INF, None::<usize>);
                    for tz in taps(z, 0, w, id) {
                        for ty in taps(y, 1, w, ih) {
                            for tx in taps(xo, 2, w, iw) {
                                let at = (tz * ih + ty) * iw + tx;
                                let v = src[at];
                                if best.1.is_none() || v > best.0 || v.is_nan() {
                                    best = (v, Some(at));
                                }
                            }
                        }
                    }
                    vals.push(best.0);
                    idxs.push(best.1.map_or(-1, |i| i as i64));
                }
            }
        }
    }
    let mut shape = lead.to_vec();
    shape.extend([od, oh, ow]);
    Ok((
        Tensor::from_vec(vals, shape.as_slice(), &Device::Cpu)?,
        Tensor::from_vec(idxs, shape, &Device::Cpu)?,
    ))
}

fn avg_pool3d(a: &Args) -> OpResult<Outputs> {
    let ((x, lead, inp, out), w) = window(a, false)?;
    let include_pad = a.bool_or("count_include_pad", true)?;
    let divisor = a.opt_int("divisor_override")?;
    if divisor == Some(0) {
        op_bail!("divisor_override must be non-zero");
    }
    one(if x.dtype() == DType::F64 {
        avg_t::<f64>(&x, &lead, inp, out, &w, include_pad, divisor)?
    } else {
        avg_t::<f32>(&x, &lead, inp, out, &w, include_pad, divisor)?
    })
}

/// Mean over each window, divided as ATen divides (the window clipped to the padded input,
/// or to the input without `count_include_pad`, or the override).
fn avg_t<T: Real>(
    x: &Tensor,
    lead: &[usize],
    inp: [usize; 3],
    [od, oh, ow]: [usize; 3],
    w: &Window,
    include_pad: bool,
    divisor: Option<i64>,
) -> OpResult<Tensor> {
    let xs = x.flatten_all()?.to_vec1::<T>()?;
    let np: usize = lead.iter().product();
    let [id, ih, iw] = inp;
    let vol = id * ih * iw;
    // (start, end) clipped to the padded input, and to the input, along dim `i`.
    let span = |o: usize, i: usize| {
        let start = (o * w.s[i]) as isize - w.p[i] as isize;
        let end = (start + w.k[i] as isize).min((inp[i] + w.p[i]) as isize);
        let padded = (end - start) as usize;
        let (s, e) = (start.max(0) as usize, end.min(inp[i] as isize) as usize);
        (padded, s, e.max(s))
    };
    let mut out = Vec::with_capacity(np * od * oh * ow);
    for pl in 0..np {
        let src = &xs[pl * vol..][..vol];
        for z in 0..od {
            let (pz, z0, z1) = span(z, 0);
            for y in 0..oh {
                let (py, y0, y1) = span(y, 1);
                for xo in 0..ow {
                    let (px, x0, x1) = span(xo, 2);
                    let mut sum = T::zero();
                    for tz in z0..z1 {
                        for ty in y0..y1 {
                            for v in &src[(tz * ih + ty) * iw + x0..][..x1 - x0] {
                                sum += *v;
                            }
                        }
                    }
                    let div = match divisor {
                        Some(d) => d as f64,
                        None if include_pad => (pz * py * px) as f64,
                        None => ((z1 - z0) * (y1 - y0) * (x1 - x0)) as f64,
                    };
                    out.push(sum / T::from_f64(div));
                }
            }
        }
    }
    let mut shape = lead.to_vec();
    shape.extend([od, oh, ow]);
    Ok(Tensor::from_vec(out, shape, &Device::Cpu)?)
}

/// `adaptive_max_pool3d(self, output_size)` -> (values, indices into each D·H·W volume):
/// cell `i` of a dim of `n` covers `floor(i·n/o) .. ceil((i+1)·n/o)`; the first maximum wins,
/// or the last NaN.
fn adaptive_max_pool3d(a: &Args) -> OpResult<Outputs> {
    let x = float(&a.tensor("self")?)?.contiguous()?;
    let o = triple(&a.ints("output_size")?, "output_size")?;
    if !(4..=5).contains(&x.rank()) {
        op_bail!(
            "adaptive_max_pool3d expects a 4-d or 5-d input, got shape {:?}",
            x.dims()
        );
    }
    let r = x.rank();
    let inp = [x.dims()[r - 3], x.dims()[r - 2], x.dims()[r - 1]];
    let lead = x.dims()[..r - 3].to_vec();
    if inp.contains(&0) || o.contains(&0) {
        op_bail!(
            "adaptive_max_pool3d needs non-empty input and output sizes, got {inp:?} and {o:?}"
        );
    }
    let mut shape = lead.clone();
    shape.extend(o);
    result_numel(&shape, "adaptive_max_pool3d")?;
    let (y, i) = if x.dtype() == DType::F64 {
        adaptive_max_t::<f64>(&x, inp, o, &shape)?
    } else {
        adaptive_max_t::<f32>(&x, inp, o, &shape)?
    };
    Ok(vec![Value::Tensor(y), Value::Tensor(i)])
}

fn adaptive_max_t<T: Real>(
    x: &Tensor,
    [id, ih, iw]: [usize; 3],
    [od, oh, ow]: [usize; 3],
    shape: &[usize],
) -> OpResult<(Tensor, Tensor)> {
    let xs = x.flatten_all()?.to_vec1::<T>()?;
    let vol = id * ih * iw;
    let np = xs.len() / vol;
    let range = |i: usize, n: usize, m: usize| (i * n / m, ((i + 1) * n).div_ceil(m));
    let mut vals = Vec::with_capacity(np * od * oh * ow);
    let mut idxs = Vec::with_capacity(np * od * oh * ow);
    for pl in 0..np {
        let src = &xs[pl * vol..][..vol];
        for z in 0..od {
            let (z0, z1) = range(z, id, od);
            for y in 0..oh {
                let (y0, y1) = range(y, ih, oh);
                for xo in 0..ow {
                    let (x0, x1) = range(xo, iw, ow);
                    let mut best = (-T::INF, (z0 * ih + y0) * iw + x0);
                    for tz in z0..z1 {
                        for ty in y0..y1 {
                            for tx in x0..x1 {
                                let at = (tz * ih + ty) * iw + tx;
                                let v = src[at];
                                if v > best.0 || v.is_nan() {
                                    best = (v, at);
                                }
                            }
                        }
                    }
                    vals.push(best.0);
                    idxs.push(best.1 as i64);
                }
            }
        }
    }
    Ok((
        Tensor::from_vec(vals, shape, &Device::Cpu)?,
        Tensor::from_vec(idxs, shape, &Device::Cpu)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A crafted kernel size, a window larger than the padded input, and too much padding
    /// are errors.
    #[test]
    fn bad_windows_are_refused() {
        let x = Tensor::zeros((1, 1, 2, 2, 2), DType::F32, &Device::Cpu).unwrap();
        let run = |k: i64, p: i64| {
            super::super::run_node(
                register,
                "aten.max_pool3d_with_indices.default",
                &[
                    ("self", json!({"as_tensor": {"name": "x"}})),
                    ("kernel_size", json!({ "as_ints": [k] })),
                    ("padding", json!({ "as_ints": [p] })),
                ],
                &[("x", x.clone())],
            )
            .unwrap_err()
            .0
        };
        let e = run(1 << 40, 0);
        assert!(e.contains("kernel_size 1099511627776 is too large"), "{e}");
        let e = run(5, 0);
        assert!(e.contains("larger than the padded input"), "{e}");
        let e = run(2, 2);
        assert!(e.contains("at most half of the kernel"), "{e}");
    }
}
