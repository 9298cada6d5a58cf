//! Pooling: max_pool1d/2d (with indices, padding, dilation, ceil_mode), avg_pool1d/2d
//! (padding, ceil_mode, count_include_pad, divisor_override), adaptive_avg_pool1d/2d,
//! adaptive_max_pool1d/2d; direct f32 (f64 for float64) kernels that follow ATen's window
//! arithmetic exactly. A 1-d pool runs as the 2-d one over a height of 1 (kernel, stride 1,
//! no padding there), which gives the same windows, values and indices.

use candle_core::Tensor;

use candle_core::{DType, WithDType};

use super::fused::{put, simd, with_f32, written, Spare};
use super::{float, from_f32, usize_of, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs, Value};
use std::mem::MaybeUninit;

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    r.add("aten.max_pool2d.default", max_pool);
    r.add("aten.max_pool2d_with_indices.default", max_pool);
    r.add("aten.max_pool1d.default", max_pool);
    r.add("aten.max_pool1d_with_indices.default", max_pool);
    r.add("aten.avg_pool2d.default", avg_pool);
    r.add("aten.avg_pool1d.default", avg_pool);
    r.add("aten.adaptive_max_pool2d.default", adaptive_max);
    r.add("aten.adaptive_max_pool1d.default", adaptive_max);
    r.add("aten.adaptive_avg_pool1d.default", adaptive_avg);
    r.add("aten.adaptive_avg_pool2d.default", adaptive_avg);
    r.add("aten._adaptive_avg_pool2d.default", adaptive_avg);
}

/// A `[h, w]` parameter of a 2-d pool, or of a 1-d pool run as 2-d over a height of 1
/// (`one_d`: one value for the width, `flat` for the height).
fn pair(one_d: bool, v: &[i64], what: &str, flat: usize) -> OpResult<[usize; 2]> {
    match (one_d, v) {
        (true, [l]) => Ok([flat, usize_of(*l, what)?]),
        (true, _) => op_bail!("{what} {v:?} must have 1 value"),
        (false, v) => two(v, what),
    }
}

/// The input of a 1-d pool (`[N, C, L]` or `[C, L]`) as 2-d over a height of 1; a 2-d pool's
/// as it is.
fn input_2d(a: &Args, one_d: bool) -> OpResult<Tensor> {
    let x = float(&a.tensor("self")?)?;
    if !one_d {
        return Ok(x);
    }
    if x.rank() != 2 && x.rank() != 3 {
        op_bail!(
            "1-d pooling expects a 2-d or 3-d input, got shape {:?}",
            x.dims()
        );
    }
    Ok(x.unsqueeze(x.rank() - 1)?)
}

/// A 2-d pool's result back to 1-d (the unit height dropped) for a 1-d pool.
fn output_1d(y: Tensor, one_d: bool) -> OpResult<Tensor> {
    Ok(if one_d { y.squeeze(y.rank() - 2)? } else { y })
}

fn two(v: &[i64], what: &str) -> OpResult<[usize; 2]> {
    match v {
        [x] => Ok([usize_of(*x, what)?, usize_of(*x, what)?]),
        [y, x] => Ok([usize_of(*y, what)?, usize_of(*x, what)?]),
        _ => op_bail!("{what} {v:?} must have 1 or 2 values"),
    }
}

/// Output length of a pooling window along one dim (ATen's `pooling_output_shape`).
pub(super) fn pool_len(
    len: usize,
    k: usize,
    pad: usize,
    stride: usize,
    dil: usize,
    ceil: bool,
) -> OpResult<usize> {
    if stride == 0 || k == 0 {
        op_bail!("pooling kernel and stride must be positive");
    }
    if pad * 2 > k {
        op_bail!("pad should be at most half of the kernel size, got pad={pad}, kernel={k}");
    }
    let num = (len + 2 * pad) as i64 - (dil * (k - 1)) as i64 - 1;
    if num < 0 {
        op_bail!("the pooling window is larger than the padded input");
    }
    let s = stride as i64;
    let mut out = if ceil {
        (num + s - 1) / s + 1
    } else {
        num / s + 1
    };
    if ceil && (out - 1) * s >= (len + pad) as i64 {
        out -= 1;
    }
    Ok(out as usize)
}

/// The element types the direct kernels compute in: f32, and f64 for float64 tensors.
trait Elem: WithDType {
    const NEG_INF: Self;
    fn nan(self) -> bool;
}

impl Elem for f32 {
    const NEG_INF: f32 = f32::NEG_INFINITY;
    fn nan(self) -> bool {
        self.is_nan()
    }
}

impl Elem for f64 {
    const NEG_INF: f64 = f64::NEG_INFINITY;
    fn nan(self) -> bool {
        self.is_nan()
    }
}

/// Input as [planes, H, W] data of type `T` (f32 for ints and bools too) plus its leading
/// dims (N, C or just C).
fn planes<T: Elem>(x: &Tensor) -> OpResult<(Vec<T>, Vec<usize>, usize, usize)> {
    if x.rank() != 3 && x.rank() != 4 {
        op_bail!(
            "2-d pooling expects a 3-d or 4-d input, got shape {:?}",
            x.dims()
        );
    }
    let r = x.rank();
    let (h, w) = (x.dims()[r - 2], x.dims()[r - 1]);
    let data = x.to_dtype(T::DTYPE)?.flatten_all()?.to_vec1::<T>()?;
    Ok((data, x.dims()[..r - 2].to_vec(), h, w))
}

/// A tensor of shape `shape` from kernel output data.
fn from_vec<T: Elem>(data: Vec<T>, shape: &[usize]) -> OpResult<Tensor> {
    Ok(Tensor::from_vec(data, shape, &candle_core::Device::Cpu)?)
}

fn max_pool(a: &Args) -> OpResult<Outputs> {
    // max_pool1d runs as 2-d over a height of 1: [N, C, L] -> [N, C, 1, L].
    let one_d = a.node().target.contains("pool1d");
    let x = input_2d(a, one_d)?;
    let k = pair(one_d, &a.ints("kernel_size")?, "kernel_size", 1)?;
    let s = match a.ints_or("stride", &[])? {
        v if v.is_empty() => k,
        v => pair(one_d, &v, "stride", 1)?,
    };
    let p = pair(one_d, &a.ints_or("padding", &[0])?, "padding", 0)?;
    let d = pair(one_d, &a.ints_or("dilation", &[1])?, "dilation", 1)?;
    let ceil = a.bool_or("ceil_mode", false)?;
    let with_indices = a.node().target.contains("with_indices");
    if !with_indices {
        if let Some(y) = max_pool_values(&x, k, s, p, d, ceil)? {
            return one(output_1d(y, one_d)?);
        }
    }
    let (y, it) = if x.dtype() == DType::F64 {
        max_pool_t::<f64>(&x, k, s, p, d, ceil)?
    } else {
        max_pool_t::<f32>(&x, k, s, p, d, ceil)?
    };
    let (y, it) = (output_1d(y, one_d)?, output_1d(it, one_d)?);
    if with_indices {
        return Ok(vec![Value::Tensor(y), Value::Tensor(it)]);
    }
    one(y)
}

/// The general max pooling kernel: values and indices.
fn max_pool_t<T: Elem>(
    x: &Tensor,
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 2],
    d: [usize; 2],
    ceil: bool,
) -> OpResult<(Tensor, Tensor)> {
    let (xs, lead, h, w) = planes::<T>(x)?;
    let oh = pool_len(h, k[0], p[0], s[0], d[0], ceil)?;
    let ow = pool_len(w, k[1], p[1], s[1], d[1], ceil)?;
    let np: usize = lead.iter().product();
    let mut out = vec![T::from_f64(0.0); np * oh * ow];
    let mut idx = vec![0i64; np * oh * ow];
    // One plane (image, channel) per task.
    let plane = |pl: usize, out: &mut [T], idx: &mut [i64]| {
        let src = &xs[pl * h * w..][..h * w];
        for y in 0..oh {
            for xo in 0..ow {
                let mut best = T::NEG_INF;
                let mut bi = -1i64;
                for i in 0..k[0] {
                    let iy = (y * s[0] + i * d[0]) as isize - p[0] as isize;
                    if iy < 0 || iy >= h as isize {
                        continue;
                    }
                    for j in 0..k[1] {
                        let ix = (xo * s[1] + j * d[1]) as isize - p[1] as isize;
                        if ix < 0 || ix >= w as isize {
                            continue;
                        }
                        let at = iy as usize * w + ix as usize;
                        let v = src[at];
                        if v > best || v.nan() || bi < 0 {
                            best = v;
                            bi = at as i64;
                            if v.nan() {
                                break;
                            }
                        }
                    }
                }
                out[y * ow + xo] = best;
                idx[y * ow + xo] = bi;
            }
        }
    };
    let per = oh * ow;
    if per > 0 {
        use rayon::prelude::*;
        out.par_chunks_mut(per)
            .zip(idx.par_chunks_mut(per))
            .enumerate()
            .for_each(|(pl, (o, ix))| plane(pl, o, ix));
    }
    let mut shape = lead;
    shape.extend([oh, ow]);
    let y = from_vec(out, &shape)?;
    let it = Tensor::from_vec(idx, shape.as_slice(), &candle_core::Device::Cpu)?;
    Ok((y, it))
}

/// The larger of `acc` and `v` as ATen's max pooling takes it: `v` wins when greater or NaN,
/// so a NaN in the window is the result.
#[inline(always)]
fn nan_max(acc: f32, v: f32) -> f32 {
    if v > acc || v.is_nan() {
        v
    } else {
        acc
    }
}

/// Max pooling without indices, for a contiguous f32 input: per output row, the window's rows
/// are first reduced into one row (an elementwise max), written between `-inf` paddings, and
/// then each output column takes the max over its window of that row, with no bounds to check.
/// Both loops run in [`simd`] (AVX-512 where the CPU has it). Groups of planes in parallel,
/// each output value written once. `None` when the input is not a contiguous f32 tensor or
/// has no values (the general kernel takes it).
pub(super) fn max_pool_values(
    x: &Tensor,
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 2],
    d: [usize; 2],
    ceil: bool,
) -> OpResult<Option<Tensor>> {
    max_pool_values_on(x, [k, s, p, d], ceil, avx512())
}

/// [`max_pool_values`] with its window (kernel, stride, padding, dilation), on AVX-512 when
/// `avx512` (the CPU has it).
fn max_pool_values_on(
    x: &Tensor,
    [k, s, p, d]: [[usize; 2]; 4],
    ceil: bool,
    avx512: bool,
) -> OpResult<Option<Tensor>> {
    if x.rank() != 3 && x.rank() != 4 {
        return Ok(None);
    }
    let r = x.rank();
    let (h, w) = (x.dims()[r - 2], x.dims()[r - 1]);
    let oh = pool_len(h, k[0], p[0], s[0], d[0], ceil)?;
    let ow = pool_len(w, k[1], p[1], s[1], d[1], ceil)?;
    let lead = x.dims()[..r - 2].to_vec();
    let np: usize = lead.iter().product();
    let per = oh * ow;
    if per == 0 || h * w == 0 {
        return Ok(None);
    }
    let win = Window {
        k,
        s,
        p,
        d,
        h,
        w,
        ow,
        wide: avx512,
    };
    // The horizontal pass computes `ow` rounded up to 16 outputs, and the padded row holds
    // every column their windows read.
    let outs = ow.next_multiple_of(16);
    let padded = (outs * s[1] + (k[1] - 1) * d[1]).max(p[1] + w);
    let planes_per_task = POOL_TASK_VALUES.div_ceil(per);
    let out = with_f32(x, |xs| {
        // SAFETY: every plane of every chunk is written whole by `pool_plane`.
        #[allow(unsafe_code)]
        unsafe {
            written(np * per, planes_per_task * per, |at, c| {
                let mut buf = Spare::take();
                buf.clear();
                buf.resize(padded + outs, f32::NEG_INFINITY);
                let (row, best) = buf.split_at_mut(padded);
                for (i, dst) in c.chunks_mut(per).enumerate() {
                    let src = &xs[(at / per + i) * h * w..][..h * w];
                    simd(
                        #[inline(always)]
                        || pool_plane(src, dst, row, best, &win),
                    );
                }
            })
        }
    });
    let Some(out) = out else {
        return Ok(None);
    };
    let mut shape = lead;
    shape.extend([oh, ow]);
    Ok(Some(from_f32(out, &shape)?))
}

/// Rows of a plane for [`rows_max`]: `count` rows starting at offset `first`, `step` apart.
#[derive(Clone, Copy)]
pub(super) struct RowSet {
    pub(super) first: usize,
    pub(super) count: usize,
    pub(super) step: usize,
}

/// The vertical pass of [`max_pool_values`]: `out[x]` the [`nan_max`] of column `x` over
/// `rows` of `src` in order (`-inf` for no rows), on AVX-512 when `wide`.
#[inline(always)]
pub(super) fn rows_max(out: &mut [f32], src: &[f32], rows: RowSet, wide: bool) {
    let w = out.len();
    let row = |r: usize| &src[rows.first + r * rows.step..][..w];
    if rows.count == 0 {
        out.fill(f32::NEG_INFINITY);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if wide {
        // SAFETY: `wide` is set only when the CPU has AVX-512.
        #[allow(unsafe_code)]
        unsafe {
            return rows_max_avx512(out, src, rows);
        }
    }
    out.copy_from_slice(row(0));
    for r in 1..rows.count {
        for (a, &v) in out.iter_mut().zip(row(r)) {
            *a = nan_max(*a, v);
        }
    }
}

/// [`rows_max`] on AVX-512 for at least one row: 16 columns at a time (the last ones under a
/// mask), each row read once and `out` written once.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn rows_max_avx512(out: &mut [f32], src: &[f32], rows: RowSet) {
    use std::arch::x86_64::*;
    let n = out.len();
    // The rows lie in `src` in increasing order: the last one's end bounds them all.
    assert!(
        rows.count > 0 && rows.first + (rows.count - 1) * rows.step + n <= src.len(),
        "rows_max_avx512: rows outside the plane"
    );
    let mut i = 0;
    while i < n {
        let mask: __mmask16 = if n - i >= 16 {
            !0
        } else {
            (1u16 << (n - i)) - 1
        };
        // SAFETY: the mask covers only columns `i..n` of each row, inside `src` (asserted).
        #[allow(unsafe_code)]
        unsafe {
            let at = |r: usize| src.as_ptr().add(rows.first + r * rows.step + i);
            let mut acc = _mm512_maskz_loadu_ps(mask, at(0));
            for r in 1..rows.count {
                acc = nan_max_m512(acc, _mm512_maskz_loadu_ps(mask, at(r)));
            }
            _mm512_mask_storeu_ps(out.as_mut_ptr().add(i), mask, acc);
        }
        i += 16;
    }
}

/// The horizontal pass of [`max_pool_values`]: `best[xo] = max_j row[xo * s + j * d]` over
/// the padded row, for all of `best` (`ow` rounded up to a multiple of 16; the padded row is
/// long enough for every window of it). On AVX-512 for strides 1 and 2, 16 outputs at a time.
#[inline(always)]
fn window_max(row: &[f32], best: &mut [f32], g: &Window) {
    let (s, k, d) = (g.s[1], g.k[1], g.d[1]);
    #[cfg(target_arch = "x86_64")]
    if g.wide && s <= 2 {
        // SAFETY: `wide` is set only when the CPU has AVX-512, and the stride is 1 or 2.
        #[allow(unsafe_code)]
        unsafe {
            return window_max_avx512(row, best, s, k, d);
        }
    }
    for (b, &v) in best.iter_mut().zip(row.iter().step_by(s)) {
        *b = v;
    }
    for j in 1..k {
        for (b, &v) in best.iter_mut().zip(row[j * d..].iter().step_by(s)) {
            *b = nan_max(*b, v);
        }
    }
}

/// [`window_max`] on AVX-512 for a stride `s` of 1 or 2: each tap's 16 values are one load
/// (stride 1) or the even lanes of two (stride 2).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn window_max_avx512(row: &[f32], best: &mut [f32], s: usize, k: usize, d: usize) {
    use std::arch::x86_64::*;
    assert!(s == 1 || s == 2, "window_max_avx512: stride {s}");
    assert!(
        best.len().is_multiple_of(16),
        "window_max_avx512: {} outputs",
        best.len()
    );
    // The last block's last tap reads up to here.
    assert!(
        row.len() >= best.len() * s + (k - 1) * d,
        "window_max_avx512: padded row too short"
    );
    let evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let at = |i: usize| -> __m512 {
        // SAFETY: `i + 16 * s <= row.len()` for every tap of every block (asserted above).
        #[allow(unsafe_code)]
        unsafe {
            if s == 1 {
                _mm512_loadu_ps(row.as_ptr().add(i))
            } else {
                let (lo, hi) = (row.as_ptr().add(i), row.as_ptr().add(i + 16));
                _mm512_permutex2var_ps(_mm512_loadu_ps(lo), evens, _mm512_loadu_ps(hi))
            }
        }
    };
    for (o, out) in best.chunks_exact_mut(16).enumerate() {
        let base = o * 16 * s;
        let mut acc = at(base);
        for j in 1..k {
            acc = nan_max_m512(acc, at(base + j * d));
        }
        // SAFETY: `out` holds 16 values.
        #[allow(unsafe_code)]
        unsafe {
            _mm512_storeu_ps(out.as_mut_ptr(), acc)
        };
    }
}

/// [`nan_max`] on 16 lanes: `v` where it is greater or NaN, else `acc`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn nan_max_m512(
    acc: std::arch::x86_64::__m512,
    v: std::arch::x86_64::__m512,
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let take = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(v, acc) | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
    _mm512_mask_blend_ps(take, acc, v)
}

/// Whether this CPU has AVX-512 (detected at run time).
pub(super) fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// About this many output values per parallel task of [`max_pool_values`] (whole planes).
const POOL_TASK_VALUES: usize = 1 << 14;

/// A max pool's window geometry over one `h` x `w` plane, `ow` output columns.
struct Window {
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 2],
    d: [usize; 2],
    h: usize,
    w: usize,
    ow: usize,
    /// Both passes run on AVX-512 (the horizontal one for strides 1 and 2: see
    /// [`window_max`]).
    wide: bool,
}

/// One plane of [`max_pool_values`] into `dst`: `row` is the padded row (its paddings
/// `-inf`, kept so), `best` a row of `ow` values to reduce into.
#[inline(always)]
fn pool_plane(
    src: &[f32],
    dst: &mut [MaybeUninit<f32>],
    row: &mut [f32],
    best: &mut [f32],
    g: &Window,
) {
    let (w, left) = (g.w, g.p[1]);
    for (y, drow) in dst.chunks_mut(g.ow).enumerate() {
        // The window's rows inside the plane: `i` in `lo..hi`, at `y * s - p + i * d`.
        let top = (y * g.s[0]) as isize - g.p[0] as isize;
        let d = g.d[0] as isize;
        let lo = if top < 0 { (-top + d - 1) / d } else { 0 }.min(g.k[0] as isize);
        let hi = ((g.h as isize - top + d - 1) / d).clamp(lo, g.k[0] as isize);
        let rows = RowSet {
            first: (top + lo * d) as usize * w,
            count: (hi - lo) as usize,
            step: g.d[0] * w,
        };
        // No row (not possible while pad <= kernel / 2) leaves -inf, as the general kernel.
        rows_max(&mut row[left..left + w], src, rows, g.wide);
        window_max(row, best, g);
        put(drow, &best[..g.ow]);
    }
}

fn avg_pool(a: &Args) -> OpResult<Outputs> {
    // avg_pool1d runs as 2-d over a height of 1: [N, C, L] -> [N, C, 1, L].
    let one_d = a.node().target.contains("avg_pool1d");
    let x = input_2d(a, one_d)?;
    let k = pair(one_d, &a.ints("kernel_size")?, "kernel_size", 1)?;
    let s = match a.ints_or("stride", &[])? {
        v if v.is_empty() => k,
        v => pair(one_d, &v, "stride", 1)?,
    };
    let p = pair(one_d, &a.ints_or("padding", &[0])?, "padding", 0)?;
    let ceil = a.bool_or("ceil_mode", false)?;
    let include_pad = a.bool_or("count_include_pad", true)?;
    let divisor = a.opt_int("divisor_override")?;
    let y = if x.dtype() == DType::F64 {
        avg_pool_t::<f64>(&x, k, s, p, ceil, include_pad, divisor)?
    } else {
        avg_pool_t::<f32>(&x, k, s, p, ceil, include_pad, divisor)?
    };
    one(output_1d(y, one_d)?)
}

/// The average pooling kernel.
fn avg_pool_t<T: Elem>(
    x: &Tensor,
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 2],
    ceil: bool,
    include_pad: bool,
    divisor: Option<i64>,
) -> OpResult<Tensor> {
    let (xs, lead, h, w) = planes::<T>(x)?;
    let oh = pool_len(h, k[0], p[0], s[0], 1, ceil)?;
    let ow = pool_len(w, k[1], p[1], s[1], 1, ceil)?;
    use rayon::prelude::*;
    let np: usize = lead.iter().product();
    let mut out = vec![T::from_f64(0.0); np * oh * ow];
    // The planes in parallel, a task about 16 Ki windows' worth of them.
    let plane = |(pl, out): (usize, &mut [T])| {
        let src = &xs[pl * h * w..][..h * w];
        for y in 0..oh {
            let hs = (y * s[0]) as isize - p[0] as isize;
            let he = (hs + k[0] as isize).min((h + p[0]) as isize);
            let pool_h = he - hs;
            let (hs, he) = (hs.max(0) as usize, he.min(h as isize) as usize);
            for xo in 0..ow {
                let ws = (xo * s[1]) as isize - p[1] as isize;
                let we = (ws + k[1] as isize).min((w + p[1]) as isize);
                let pool_w = we - ws;
                let (ws, we) = (ws.max(0) as usize, we.min(w as isize) as usize);
                let mut sum = T::from_f64(0.0);
                for iy in hs..he {
                    for ix in ws..we {
                        sum += src[iy * w + ix];
                    }
                }
                let div = T::from_f64(match divisor {
                    Some(d) if d != 0 => d as f64,
                    _ if include_pad => (pool_h * pool_w) as f64,
                    _ => ((he.saturating_sub(hs)) * (we.saturating_sub(ws))) as f64,
                });
                out[y * ow + xo] = sum / div;
            }
        }
    };
    if oh * ow > 0 {
        let per = (oh * ow * k[0] * k[1]).max(1);
        out.par_chunks_mut(oh * ow)
            .enumerate()
            .with_min_len(((1 << 14) / per).max(1))
            .for_each(plane);
    }
    let mut shape = lead;
    shape.extend([oh, ow]);
    from_vec(out, &shape)
}

/// `adaptive_max_pool2d(self, output_size)` -> (values, indices into each h x w plane),
/// windows as adaptive_avg_pool2d's; the first maximum wins, or the last NaN, as in ATen.
fn adaptive_max(a: &Args) -> OpResult<Outputs> {
    let one_d = a.node().target.contains("pool1d");
    let x = input_2d(a, one_d)?;
    let o = pair(one_d, &a.ints("output_size")?, "output_size", 1)?;
    let (vals, idxs) = if x.dtype() == DType::F64 {
        adaptive_max_t::<f64>(&x, o)?
    } else {
        adaptive_max_t::<f32>(&x, o)?
    };
    Ok(vec![
        Value::Tensor(output_1d(vals, one_d)?),
        Value::Tensor(output_1d(idxs, one_d)?),
    ])
}

/// The adaptive max pooling kernel: (values, indices).
fn adaptive_max_t<T: Elem>(x: &Tensor, o: [usize; 2]) -> OpResult<(Tensor, Tensor)> {
    let (xs, lead, h, w) = planes::<T>(x)?;
    let (oh, ow) = (o[0], o[1]);
    let np: usize = lead.iter().product();
    if np > 0 && (oh == 0 || ow == 0 || h == 0 || w == 0) {
        op_bail!("adaptive_max_pool2d needs a non-empty input and output size");
    }
    let mut vals = Vec::with_capacity(np * oh * ow);
    let mut idxs = Vec::with_capacity(np * oh * ow);
    for pl in 0..np {
        let src = &xs[pl * h * w..][..h * w];
        for y in 0..oh {
            let (hs, he) = (y * h / oh, ((y + 1) * h).div_ceil(oh));
            for xo in 0..ow {
                let (ws, we) = (xo * w / ow, ((xo + 1) * w).div_ceil(ow));
                let mut best = (T::NEG_INF, hs * w + ws);
                for iy in hs..he {
                    for ix in ws..we {
                        let v = src[iy * w + ix];
                        if v > best.0 || v.nan() {
                            best = (v, iy * w + ix);
                        }
                    }
                }
                vals.push(best.0);
                idxs.push(best.1 as i64);
            }
        }
    }
    let mut shape = lead;
    shape.extend([oh, ow]);
    let indices = Tensor::from_vec(idxs, shape.as_slice(), x.device())?;
    Ok((from_vec(vals, &shape)?, indices))
}

fn adaptive_avg(a: &Args) -> OpResult<Outputs> {
    let one_d = a.node().target.contains("pool1d");
    let x = input_2d(a, one_d)?;
    let o = pair(one_d, &a.ints("output_size")?, "output_size", 1)?;
    one(output_1d(
        if x.dtype() == DType::F64 {
            adaptive_avg_t::<f64>(&x, o)?
        } else {
            adaptive_avg_t::<f32>(&x, o)?
        },
        one_d,
    )?)
}

/// The adaptive average pooling kernel.
fn adaptive_avg_t<T: Elem>(x: &Tensor, o: [usize; 2]) -> OpResult<Tensor> {
    let (oh, ow) = (o[0], o[1]);
    // Fast path: global pooling is a mean over the plane, read in place.
    if oh == 1 && ow == 1 && (x.rank() == 3 || x.rank() == 4) {
        let r = x.rank();
        let (lead, plane) = (&x.dims()[..r - 2], x.dims()[r - 2] * x.dims()[r - 1]);
        let mut shape = lead.to_vec();
        shape.extend([1, 1]);
        if let Some(y) = super::fused::mean_rows(x, plane, &shape) {
            return Ok(y);
        }
        let np: usize = lead.iter().product();
        let y = x.reshape((np, plane))?.mean_keepdim(1)?;
        return Ok(y.reshape(shape)?);
    }
    let (xs, lead, h, w) = planes::<T>(x)?;
    let np: usize = lead.iter().product();
    let mut out = vec![T::from_f64(0.0); np * oh * ow];
    for pl in 0..np {
        let src = &xs[pl * h * w..][..h * w];
        for y in 0..oh {
            let (hs, he) = (y * h / oh, ((y + 1) * h).div_ceil(oh));
            for xo in 0..ow {
                let (ws, we) = (xo * w / ow, ((xo + 1) * w).div_ceil(ow));
                let mut sum = T::from_f64(0.0);
                for iy in hs..he {
                    for ix in ws..we {
                        sum += src[iy * w + ix];
                    }
                }
                out[(pl * oh + y) * ow + xo] = sum / T::from_f64(((he - hs) * (we - ws)) as f64);
            }
        }
    }
    let mut shape = lead;
    shape.extend([oh, ow]);
    from_vec(out, &shape)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// The value-only max pool against a direct window scan (every tap, row-major, ATen's
    /// NaN rule) over paddings, strides, dilations and ceil mode, with NaNs in the input: on
    /// the portable loops and on AVX-512 where this CPU has it, over rows shorter than one
    /// vector and rows of two vectors and a part.
    #[test]
    fn max_pool_values_matches_window_scan() {
        // (kernel, stride, padding, dilation, ceil)
        let cases = [
            ([3, 3], [2, 2], [1, 1], [1, 1], false),
            ([2, 2], [2, 2], [0, 0], [1, 1], true),
            ([3, 2], [1, 2], [1, 0], [2, 1], false),
            ([3, 3], [2, 3], [1, 1], [1, 2], true),
            ([3, 3], [1, 1], [1, 1], [1, 2], false),
            ([5, 5], [1, 1], [2, 2], [1, 1], false),
        ];
        let engines = if avx512() {
            vec![false, true]
        } else {
            vec![false]
        };
        for (h, w) in [(9, 11), (6, 37)] {
            let mut data: Vec<f32> = (0..2 * 3 * h * w)
                .map(|i| ((i * 7919) % 101) as f32 - 50.0)
                .collect();
            data[17] = f32::NAN;
            data[200] = f32::NAN;
            let x = Tensor::from_vec(data.clone(), (2, 3, h, w), &Device::Cpu).unwrap();
            for ((k, s, p, d, ceil), &wide) in cases
                .iter()
                .flat_map(|c| engines.iter().map(move |e| (*c, e)))
            {
                let got = max_pool_values_on(&x, [k, s, p, d], ceil, wide)
                    .unwrap()
                    .unwrap();
                let oh = pool_len(h, k[0], p[0], s[0], d[0], ceil).unwrap();
                let ow = pool_len(w, k[1], p[1], s[1], d[1], ceil).unwrap();
                assert_eq!(got.dims(), &[2, 3, oh, ow]);
                let got = got.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                for pl in 0..6 {
                    for y in 0..oh {
                        for xo in 0..ow {
                            let mut best = f32::NEG_INFINITY;
                            for i in 0..k[0] {
                                for j in 0..k[1] {
                                    let iy = (y * s[0] + i * d[0]) as isize - p[0] as isize;
                                    let ix = (xo * s[1] + j * d[1]) as isize - p[1] as isize;
                                    if iy >= 0 && iy < h as isize && ix >= 0 && ix < w as isize {
                                        let v = data[pl * h * w + iy as usize * w + ix as usize];
                                        if v > best || v.is_nan() {
                                            best = v;
                                        }
                                    }
                                }
                            }
                            let g = got[(pl * oh + y) * ow + xo];
                            assert!(
                                g == best || (g.is_nan() && best.is_nan()),
                                "{h}x{w} {k:?} {s:?} {p:?} {d:?} {ceil} avx512 {wide}: plane {pl} ({y}, {xo}): {g} vs {best}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Average pooling over many planes (split across threads) gives candle's own average
    /// pool, plane by plane in place (no padding, so the two average the same windows).
    #[test]
    fn avg_pool_over_many_planes_is_candles() {
        let x = Tensor::randn(0f32, 1., (3, 24, 30, 30), &Device::Cpu).unwrap();
        for (k, s) in [(3, 1), (2, 2), (3, 2)] {
            let got = avg_pool_t::<f32>(&x, [k, k], [s, s], [0, 0], false, true, None).unwrap();
            let want = x.avg_pool2d_with_stride((k, k), (s, s)).unwrap();
            assert_eq!(got.dims(), want.dims());
            let d = (got - want).unwrap().abs().unwrap().flatten_all().unwrap();
            let d = d.max(0).unwrap().to_scalar::<f32>().unwrap();
            assert!(d < 1e-6, "kernel {k}, stride {s}: {d}");
        }
    }
}
