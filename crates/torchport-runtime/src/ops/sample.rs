//! Sampling at given coordinates: `grid_sampler` / `grid_sampler_2d` / `grid_sampler_3d`
//! (F.grid_sample; on 4-d inputs bilinear, nearest and bicubic, on 5-d inputs trilinear and
//! nearest; zeros, border and reflection padding; align_corners both ways) and
//! `affine_grid_generator` (F.affine_grid, 2-d and 3-d), following ATen's CPU kernels'
//! coordinate arithmetic in the tensor's float type.

use candle_core::{DType, Device, Tensor};

use super::fused::{simd, with_storage};
use super::{result_numel, usize_of, Real, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs};

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    r.add("aten.grid_sampler.default", grid_sampler);
    r.add("aten.grid_sampler_2d.default", grid_sampler);
    r.add("aten.grid_sampler_3d.default", grid_sampler);
    r.add("aten.affine_grid_generator.default", affine_grid);
}

/// How samples outside the input are read.
#[derive(Clone, Copy, PartialEq)]
enum Padding {
    Zeros,
    Border,
    Reflection,
}

/// One axis of the input: its size and how its coordinates are mapped.
#[derive(Clone, Copy)]
struct Axis {
    size: usize,
    padding: Padding,
    align: bool,
}

impl Axis {
    /// A grid value in [-1, 1] to a pixel coordinate.
    fn unnormalize<T: Real>(&self, c: T) -> T {
        let one = T::one();
        let two = T::from_f64(2.0);
        let n = T::from_f64(self.size as f64);
        if self.align {
            (c + one) * ((n - one) / two)
        } else {
            (c + one) * (n / two) - T::from_f64(0.5)
        }
    }

    /// A pixel coordinate moved inside the input by the padding mode (zeros: unchanged).
    fn pad<T: Real>(&self, c: T) -> T {
        let clip = |c: T| {
            let hi = T::from_f64(self.size as f64 - 1.0);
            if c < T::zero() {
                T::zero()
            } else if c > hi {
                hi
            } else {
                c
            }
        };
        match self.padding {
            Padding::Zeros => c,
            Padding::Border => clip(c),
            Padding::Reflection => {
                let n = self.size as f64;
                let (lo2, hi2) = if self.align {
                    (0.0, 2.0 * (n - 1.0))
                } else {
                    (-1.0, 2.0 * n - 1.0)
                };
                if lo2 == hi2 {
                    return T::zero();
                }
                let min = T::from_f64(lo2 / 2.0);
                let span = T::from_f64((hi2 - lo2) / 2.0);
                let c = (c - min).abs();
                let extra = c % span;
                let flips = (c / span).floor();
                let r = if flips % T::from_f64(2.0) == T::zero() {
                    extra + min
                } else {
                    span - extra + min
                };
                clip(r)
            }
        }
    }

    /// An integer position if it lies inside the input.
    fn inside(&self, i: f64) -> Option<usize> {
        (i >= 0.0 && i < self.size as f64).then_some(i as usize)
    }
}

/// ATen's cubic convolution weights (A = -0.75) of the four taps around fraction `t`.
fn cubic<T: Real>(t: T) -> [T; 4] {
    let a = T::from_f64(-0.75);
    let f = T::from_f64;
    let near = |x: T| ((a + f(2.0)) * x - (a + f(3.0))) * x * x + T::one();
    let far = |x: T| ((a * x - f(5.0) * a) * x + f(8.0) * a) * x - f(4.0) * a;
    [
        far(t + T::one()),
        near(t),
        near(T::one() - t),
        far(f(2.0) - t),
    ]
}

/// `grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners)`.
fn grid_sampler(a: &Args) -> OpResult<Outputs> {
    let x = a.tensor("input")?;
    let g = a.tensor("grid")?;
    if x.rank() == 5 {
        return grid_sampler_3d(a, &x, &g);
    }
    if x.rank() != 4 || g.rank() != 4 || g.dims()[3] != 2 || g.dims()[0] != x.dims()[0] {
        op_bail!(
            "grid_sampler expects a 4-d input and an [N, H, W, 2] grid of the same batch, got {:?} and {:?}",
            x.dims(),
            g.dims()
        );
    }
    let mode = a.int("interpolation_mode")?;
    if !(0..=2).contains(&mode) {
        op_bail!("grid_sampler interpolation_mode {mode} is not supported");
    }
    let (padding, align) = padding_and_align(a, &x, &g)?;
    let (n, c, h, w) = x.dims4()?;
    let (oh, ow) = (g.dims()[1], g.dims()[2]);
    result_numel(&[n, c, oh, ow], "grid_sampler")?;
    let axes = [
        Axis {
            size: h,
            padding,
            align,
        },
        Axis {
            size: w,
            padding,
            align,
        },
    ];
    one(if x.dtype() == DType::F64 {
        sample::<f64>(&x, &g, mode, axes)?
    } else {
        sample::<f32>(&x, &g, mode, axes)?
    })
}

/// The volumetric form: `[N, C, D, H, W]` sampled at an `[N, D', H', W', 3]` grid
/// (trilinear or nearest; ATen has no bicubic here).
/// The padding mode and align_corners of a grid_sampler node, with its input and grid
/// checked to be floats of one dtype.
fn padding_and_align(a: &Args, x: &Tensor, g: &Tensor) -> OpResult<(Padding, bool)> {
    let padding = match a.int("padding_mode")? {
        0 => Padding::Zeros,
        1 => Padding::Border,
        2 => Padding::Reflection,
        p => op_bail!("grid_sampler padding_mode {p} is not supported"),
    };
    if x.dtype() != g.dtype() || !matches!(x.dtype(), DType::F32 | DType::F64) {
        op_bail!(
            "grid_sampler expects float input and grid of one dtype, got {:?} and {:?}",
            x.dtype(),
            g.dtype()
        );
    }
    Ok((padding, a.bool_or("align_corners", false)?))
}

fn grid_sampler_3d(a: &Args, x: &Tensor, g: &Tensor) -> OpResult<Outputs> {
    if g.rank() != 5 || g.dims()[4] != 3 || g.dims()[0] != x.dims()[0] {
        op_bail!(
            "3-d grid_sampler expects an [N, D, H, W, 3] grid of the input's batch, got {:?} and {:?}",
            x.dims(),
            g.dims()
        );
    }
    let mode = a.int("interpolation_mode")?;
    if !(0..=1).contains(&mode) {
        op_bail!("3-d grid_sampler interpolation_mode {mode} is not supported");
    }
    let (padding, align) = padding_and_align(a, x, g)?;
    let (n, c) = (x.dims()[0], x.dims()[1]);
    let mut shape = vec![n, c];
    shape.extend(&g.dims()[1..4]);
    result_numel(&shape, "grid_sampler")?;
    let axes = [2, 3, 4].map(|i| Axis {
        size: x.dims()[i],
        padding,
        align,
    });
    one(if x.dtype() == DType::F64 {
        sample3d::<f64>(x, g, mode, axes, &shape)?
    } else {
        sample3d::<f32>(x, g, mode, axes, &shape)?
    })
}

/// Sample every channel of each volume at its grid's points.
fn sample3d<T: Real>(
    x: &Tensor,
    g: &Tensor,
    mode: i64,
    [az, ay, ax]: [Axis; 3],
    shape: &[usize],
) -> OpResult<Tensor> {
    let (n, c) = (shape[0], shape[1]);
    let points = shape[2] * shape[3] * shape[4];
    let (d, h, w) = (az.size, ay.size, ax.size);
    let xs = x.contiguous()?.flatten_all()?.to_vec1::<T>()?;
    let gs = g.contiguous()?.flatten_all()?.to_vec1::<T>()?;
    let mut out = vec![T::zero(); n * c * points];
    let mut taps: Vec<(usize, T)> = Vec::with_capacity(8);
    for b in 0..n {
        for p in 0..points {
            let at = (b * points + p) * 3;
            let f = [
                az.pad(az.unnormalize(gs[at + 2])),
                ay.pad(ay.unnormalize(gs[at + 1])),
                ax.pad(ax.unnormalize(gs[at])),
            ];
            taps.clear();
            if mode == 1 {
                let r = f.map(|v| v.round_even().to_f64());
                if let (Some(z), Some(y), Some(xx)) =
                    (az.inside(r[0]), ay.inside(r[1]), ax.inside(r[2]))
                {
                    taps.push(((z * h + y) * w + xx, T::one()));
                }
            } else {
                let lo = f.map(|v| v.floor());
                let frac = [f[0] - lo[0], f[1] - lo[1], f[2] - lo[2]];
                let lo = lo.map(|v| v.to_f64());
                for dz in 0..2 {
                    for dy in 0..2 {
                        for dx in 0..2 {
                            let wt = |k: usize, up: usize| {
                                if up == 1 {
                                    frac[k]
                                } else {
                                    T::one() - frac[k]
                                }
                            };
                            let (z, y, xx) = (
                                az.inside(lo[0] + dz as f64),
                                ay.inside(lo[1] + dy as f64),
                                ax.inside(lo[2] + dx as f64),
                            );
                            if let (Some(z), Some(y), Some(xx)) = (z, y, xx) {
                                taps.push((
                                    (z * h + y) * w + xx,
                                    wt(0, dz) * wt(1, dy) * wt(2, dx),
                                ));
                            }
                        }
                    }
                }
            }
            for ch in 0..c {
                let src = &xs[(b * c + ch) * d * h * w..][..d * h * w];
                let mut acc = T::zero();
                for &(i, wt) in &taps {
                    acc += src[i] * wt;
                }
                out[(b * c + ch) * points + p] = acc;
            }
        }
    }
    Ok(Tensor::from_vec(out, shape, &Device::Cpu)?)
}

/// Sample every channel of each image at its grid's points: groups of images in parallel,
/// each group's loop compiled for the CPU's vector width ([`simd`]: there `floor` is one
/// instruction, a call to the C library's otherwise). RAFT samples its correlation pyramid
/// 48 times a run, `[256, 1, h, w]` at 7 × 7 points an image: one image a task would be
/// mostly the task's own cost, so a task holds at least [`TASK_WORK`] point-channels.
fn sample<T: Real>(x: &Tensor, g: &Tensor, mode: i64, axes: [Axis; 2]) -> OpResult<Tensor> {
    use rayon::prelude::*;
    let (n, c, h, w) = x.dims4()?;
    let points = g.dims()[1] * g.dims()[2];
    let (x, g) = (x.contiguous()?, g.contiguous()?);
    let image = c * h * w;
    let mut out = vec![T::zero(); n * c * points];
    if out.is_empty() || image == 0 {
        // No points, or every tap outside an empty plane.
        return Ok(Tensor::from_vec(
            out,
            (n, c, g.dims()[1], g.dims()[2]),
            &Device::Cpu,
        )?);
    }
    let per = (TASK_WORK / (points * (c + 4))).max(1);
    let done = with_storage::<T, _>(&x, |xs, xl| {
        with_storage::<T, _>(&g, |gs, gl| {
            let xs = xs.get(xl.start_offset()..)?.get(..n * image)?;
            let gs = gs.get(gl.start_offset()..)?.get(..n * points * 2)?;
            out.par_chunks_mut(per * c * points)
                .zip(
                    xs.par_chunks(per * image)
                        .zip(gs.par_chunks(per * points * 2)),
                )
                .for_each(|(o, (xs, gs))| {
                    simd(
                        #[inline(always)]
                        || {
                            let images = o.chunks_mut(c * points).zip(xs.chunks(image));
                            for ((o, xs), gs) in images.zip(gs.chunks(points * 2)) {
                                sample_image(o, xs, gs, (c, w), mode, axes);
                            }
                        },
                    )
                });
            Some(())
        })
    });
    if done.flatten().is_none() {
        op_bail!("grid_sampler reads a CPU tensor of its dtype");
    }
    Ok(Tensor::from_vec(
        out,
        (n, c, g.dims()[1], g.dims()[2]),
        &Device::Cpu,
    )?)
}

/// Point-channels (a point's taps, plus one per channel it is read for) per task of
/// [`sample`].
const TASK_WORK: usize = 1 << 13;

/// One image of [`sample`]: `xs` its `c` planes of width `w`, `gs` its grid's `(x, y)`
/// points, `o` its `c` output planes.
#[inline(always)]
fn sample_image<T: Real>(
    o: &mut [T],
    xs: &[T],
    gs: &[T],
    (c, w): (usize, usize),
    mode: i64,
    [ay, ax]: [Axis; 2],
) {
    let points = gs.len() / 2;
    let plane = xs.len() / c;
    // A point's taps (offset in a plane, weight), in ATen's order of summing them.
    let mut taps = [(0usize, T::zero()); 16];
    for (p, xy) in gs.chunks_exact(2).enumerate() {
        let (gx, gy) = (xy[0], xy[1]);
        let mut nt = 0;
        let mut tap = |at: usize, wt: T| {
            taps[nt] = (at, wt);
            nt += 1;
        };
        match mode {
            0 => {
                let (fx, fy) = (ax.pad(ax.unnormalize(gx)), ay.pad(ay.unnormalize(gy)));
                let (x0, y0) = (fx.floor(), fy.floor());
                let (we, wn) = (fx - x0, fy - y0);
                let (ww, ws) = (T::one() - we, T::one() - wn);
                let (x0, y0) = (x0.to_f64(), y0.to_f64());
                for (dy, wy) in [(0.0, ws), (1.0, wn)] {
                    for (dx, wx) in [(0.0, ww), (1.0, we)] {
                        if let (Some(yy), Some(xx)) = (ay.inside(y0 + dy), ax.inside(x0 + dx)) {
                            tap(yy * w + xx, wy * wx);
                        }
                    }
                }
            }
            1 => {
                let fx = ax.pad(ax.unnormalize(gx)).round_even().to_f64();
                let fy = ay.pad(ay.unnormalize(gy)).round_even().to_f64();
                if let (Some(yy), Some(xx)) = (ay.inside(fy), ax.inside(fx)) {
                    tap(yy * w + xx, T::one());
                }
            }
            _ => {
                let (fx, fy) = (ax.unnormalize(gx), ay.unnormalize(gy));
                let (x0, y0) = (fx.floor(), fy.floor());
                let (cx, cy) = (cubic(fx - x0), cubic(fy - y0));
                let (x0, y0) = (x0.to_f64(), y0.to_f64());
                for (i, wy) in cy.iter().enumerate() {
                    for (j, wx) in cx.iter().enumerate() {
                        let yy = ay.pad(T::from_f64(y0 - 1.0 + i as f64)).to_f64();
                        let xx = ax.pad(T::from_f64(x0 - 1.0 + j as f64)).to_f64();
                        if let (Some(yy), Some(xx)) = (ay.inside(yy), ax.inside(xx)) {
                            tap(yy * w + xx, *wy * *wx);
                        }
                    }
                }
            }
        }
        for (src, o) in xs.chunks_exact(plane).zip(o.chunks_exact_mut(points)) {
            let mut acc = T::zero();
            for &(i, wt) in &taps[..nt] {
                acc += src[i] * wt;
            }
            o[p] = acc;
        }
    }
}

/// ATen's `linspace_from_neg_one`: `steps` points over [-1, 1], pulled in by
/// `(steps - 1) / steps` without align_corners; one step is 0.
fn linspace<T: Real>(steps: usize, align: bool) -> Vec<T> {
    if steps <= 1 {
        return vec![T::zero(); steps];
    }
    let (start, end) = (T::from_f64(-1.0), T::one());
    let step = (end - start) / T::from_f64((steps - 1) as f64);
    (0..steps)
        .map(|i| {
            let v = if i < steps / 2 {
                start + step * T::from_f64(i as f64)
            } else {
                end - step * T::from_f64((steps - i - 1) as f64)
            };
            if align {
                v
            } else {
                v * T::from_f64((steps - 1) as f64) / T::from_f64(steps as f64)
            }
        })
        .collect()
}

/// `affine_grid_generator(theta, size, align_corners)`: the base grid of `size` (`[N, C, H,
/// W]` or `[N, C, D, H, W]`) transformed by each `theta` (`[N, 2, 3]` or `[N, 3, 4]`).
fn affine_grid(a: &Args) -> OpResult<Outputs> {
    let theta = a.tensor("theta")?;
    let size = a
        .ints("size")?
        .iter()
        .map(|&s| usize_of(s, "size"))
        .collect::<OpResult<Vec<_>>>()?;
    let align = a.bool_or("align_corners", false)?;
    let k = match size.len() {
        4 => 2,
        5 => 3,
        _ => op_bail!("affine_grid_generator expects a 4-d or 5-d size, got {size:?}"),
    };
    if theta.dims() != [size[0], k, k + 1] {
        op_bail!(
            "affine_grid_generator expects theta of shape [{}, {k}, {}], got {:?}",
            size[0],
            k + 1,
            theta.dims()
        );
    }
    let mut shape = vec![size[0]];
    shape.extend(&size[2..]);
    shape.push(k);
    result_numel(&shape, "affine_grid_generator")?;
    one(match theta.dtype() {
        DType::F64 => affine::<f64>(&theta, &shape, align)?,
        DType::F32 => affine::<f32>(&theta, &shape, align)?,
        dt => op_bail!("affine_grid_generator on {dt:?} is not supported"),
    })
}

/// The grid of `shape` (`[N, (D,) H, W, k]`): base coordinates (x, y, (z), 1) times θᵀ.
fn affine<T: Real>(theta: &Tensor, shape: &[usize], align: bool) -> OpResult<Tensor> {
    let k = shape[shape.len() - 1];
    let spatial = &shape[1..shape.len() - 1];
    let th = theta.flatten_all()?.to_vec1::<T>()?;
    // Per spatial dim (outermost first) its coordinates; x is the last dim.
    let coords: Vec<Vec<T>> = spatial.iter().map(|&s| linspace(s, align)).collect();
    let points: usize = spatial.iter().product();
    let mut out = Vec::with_capacity(shape[0] * points * k);
    for b in 0..shape[0] {
        let t = &th[b * k * (k + 1)..][..k * (k + 1)];
        for p in 0..points {
            // Base point (x, y, z): x from the last spatial dim.
            let mut base = vec![T::zero(); k];
            let mut rest = p;
            for (d, cs) in coords.iter().enumerate().rev() {
                base[k - 1 - d] = cs[rest % spatial[d]];
                rest /= spatial[d];
            }
            for r in 0..k {
                let row = &t[r * (k + 1)..][..k + 1];
                let mut acc = T::zero();
                for (j, &v) in base.iter().enumerate() {
                    acc += v * row[j];
                }
                out.push(acc + row[k]);
            }
        }
    }
    Ok(Tensor::from_vec(out, shape, &Device::Cpu)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A batch sampled in several parallel tasks (groups of images) gives each image what
    /// sampling it alone gives, in every mode and padding, with points outside the input, a
    /// transposed input and a transposed grid.
    #[test]
    fn a_batch_samples_each_image_as_alone() {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 1., (37, 3, 6, 5), &dev).unwrap();
        let x = x.transpose(2, 3).unwrap();
        let g = Tensor::rand(-1.2f32, 1.2, (37, 11, 9, 2), &dev).unwrap();
        let g = g.transpose(1, 2).unwrap();
        let points = 9 * 11;
        assert!(TASK_WORK / (points * (3 + 4)) < 37 / 2, "several tasks");
        for mode in 0..3 {
            for padding in [Padding::Zeros, Padding::Border, Padding::Reflection] {
                for align in [false, true] {
                    let axis = |size| Axis {
                        size,
                        padding,
                        align,
                    };
                    let axes = [axis(5), axis(6)];
                    let all = sample::<f32>(&x, &g, mode, axes).unwrap();
                    for b in [0, 10, 11, 36] {
                        let (xb, gb) = (x.narrow(0, b, 1).unwrap(), g.narrow(0, b, 1).unwrap());
                        let one = sample::<f32>(&xb, &gb, mode, axes).unwrap();
                        let got = all.narrow(0, b, 1).unwrap().flatten_all().unwrap();
                        assert_eq!(
                            got.to_vec1::<f32>().unwrap(),
                            one.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                            "mode {mode}, image {b}"
                        );
                    }
                }
            }
        }
    }

    /// A crafted grid size is refused before anything is allocated; a 5-d input needs a
    /// 3-d grid.
    #[test]
    fn crafted_sizes_are_refused() {
        let theta = Tensor::zeros((1, 2, 3), DType::F32, &Device::Cpu).unwrap();
        let err = super::super::run_node(
            register,
            "aten.affine_grid_generator.default",
            &[
                ("theta", json!({"as_tensor": {"name": "t"}})),
                ("size", json!({"as_ints": [1, 1, 1i64 << 40, 1i64 << 40]})),
                ("align_corners", json!({"as_bool": false})),
            ],
            &[("t", theta)],
        )
        .unwrap_err();
        assert!(err.0.contains("is too large"), "{}", err.0);
        let x = Tensor::zeros((1, 1, 2, 2, 2), DType::F32, &Device::Cpu).unwrap();
        let g = Tensor::zeros((1, 2, 2, 2, 2), DType::F32, &Device::Cpu).unwrap();
        let err = super::super::run_node(
            register,
            "aten.grid_sampler.default",
            &[
                ("input", json!({"as_tensor": {"name": "x"}})),
                ("grid", json!({"as_tensor": {"name": "g"}})),
                ("interpolation_mode", json!({"as_int": 0})),
                ("padding_mode", json!({"as_int": 0})),
                ("align_corners", json!({"as_bool": false})),
            ],
            &[("x", x), ("g", g)],
        )
        .unwrap_err();
        assert!(
            err.0.contains("expects an [N, D, H, W, 3] grid"),
            "{}",
            err.0
        );
    }
}
