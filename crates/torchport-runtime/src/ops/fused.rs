//! Single-pass CPU kernels for the hot ops of transformer graphs: layer norm and softmax over
//! the last dims, erf gelu, and a linear layer's bias added in place. candle composes the first
//! two from 5–10 full passes with broadcasting (each a new tensor); these read the input once
//! straight from its storage and write the output once, splitting rows across threads when
//! the tensor is large. Each returns `None` when its input is not a contiguous f32 CPU tensor,
//! and the caller falls back to the composed form.
//!
//! Numerics follow the composed forms they replace (same formulas, same order of operations
//! per element; layer norm accumulates its row sums in f64).

use candle_core::{CpuStorage, DType, InplaceOp2, Layout, Storage, Tensor};
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Tensors with at least this many elements are split across threads.
pub(crate) const PAR_MIN: usize = 1 << 15;

/// Run `f` on the data of `t` without copying it, if `t` is a contiguous f32 CPU tensor.
pub fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Option<R> {
    if t.dtype() != DType::F32 {
        return None;
    }
    let (storage, layout) = t.storage_and_layout();
    let (start, end) = layout.contiguous_offsets()?;
    match &*storage {
        Storage::Cpu(c) => c.as_slice::<f32>().ok()?.get(start..end).map(f),
        _ => None,
    }
}

/// Run `f` on the whole storage of an CPU tensor of element type `T` and its layout (any strides).
pub fn with_storage<T: candle_core::WithDType, R>(
    t: &Tensor,
    f: impl FnOnce(&[T], &candle_core::Layout) -> R,
) -> Option<R> {
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        candle_core::Storage::Cpu(c) => Some(f(c.as_slice::<T>().ok()?, layout)),
        _ => None,
    }
}

/// Buffers of at least this many values are zeroed by [`zeros`] (and filled with rows by
/// [`repeated_rows`]) on the pool's threads.
pub(crate) const PAR_ZERO_MIN: usize = 1 << 18;

/// A zeroed f32 buffer of `n` values for a kernel's output, cleared in parallel when large.
/// Freed buffers are reused (see `allocator.rs`), so the allocator must clear a reused one,
/// and it does so on the calling thread alone: on BERT-base at batch 8 and 2 threads,
/// `memset` was 3.0–3.3% of the samples of whole runs (`perf record`), serial time in a run
/// otherwise split across the threads. Kernels that compute each output element write it
/// once into new memory instead (`written`).
pub fn zeros(n: usize) -> Vec<f32> {
    if n < PAR_ZERO_MIN {
        return vec![0f32; n];
    }
    // In stretches of 256 KiB, each a `memset` (an element-by-element fill through rayon's
    // `par_extend` compiled to 16-byte stores, slower than the allocator's own clear).
    // SAFETY: the closure writes every element of its chunk.
    #[allow(unsafe_code)]
    unsafe {
        written(n, 1 << 16, |_, c| c.fill(MaybeUninit::new(0.0)))
    }
}

/// `rows` copies of `row` one after another (a Linear layer's bias under its product), in
/// parallel when large.
pub fn repeated_rows(rows: usize, row: &[f32]) -> Vec<f32> {
    let n = row.len();
    let total = rows * n;
    if n == 0 || total < PAR_ZERO_MIN {
        return row.repeat(rows);
    }
    // SAFETY: every chunk is whole rows (its length a multiple of `n`: the chunk size is, and
    // so is `total`), and each of its rows gets all of `row`.
    #[allow(unsafe_code)]
    unsafe {
        written(total, (1 << 16) / n.min(1 << 16) * n, |_, c| {
            for r in c.chunks_exact_mut(n) {
                put(r, row);
            }
        })
    }
}

/// `dst[i] = src[i]` for every element of `dst` (new memory) from `src` of the same length.
#[inline(always)]
pub(crate) fn put(dst: &mut [MaybeUninit<f32>], src: &[f32]) {
    assert_eq!(dst.len(), src.len(), "put: lengths differ");
    for (d, &v) in dst.iter_mut().zip(src) {
        d.write(v);
    }
}

/// `dst` as the `f32` values it holds (`[MaybeUninit<T>]::assume_init_mut`, which std has
/// only from Rust 1.93, above this workspace's 1.89).
///
/// # Safety
///
/// Every element of `dst` is initialised.
#[allow(unsafe_code)]
pub(crate) unsafe fn assume_written(dst: &mut [MaybeUninit<f32>]) -> &mut [f32] {
    // SAFETY: the caller's contract; `MaybeUninit<f32>` has `f32`'s layout.
    unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<f32>(), dst.len()) }
}

/// `dst` as memory to write f32 values into, for code that writes through
/// `MaybeUninit` (into new buffers elsewhere): writing through it leaves `dst` holding
/// initialised f32 values, so no write can break it.
pub(crate) fn as_uninit(dst: &mut [f32]) -> &mut [MaybeUninit<f32>] {
    // SAFETY: `MaybeUninit<f32>` has the layout of `f32`, and safe code can only write
    // initialised values through a `&mut [MaybeUninit<f32>]` (`write`, or assigning one made
    // by `MaybeUninit::new`), so `dst` holds f32 values throughout.
    #[allow(unsafe_code)]
    unsafe {
        &mut *(dst as *mut [f32] as *mut [MaybeUninit<f32>])
    }
}

/// `f` of each value of `xs`, into a new buffer (written once), in chunks of `chunk` values
/// on the pool's threads when large.
fn mapped(xs: &[f32], chunk: usize, f: impl Fn(f32) -> f32 + Copy + Sync) -> Vec<f32> {
    let chunk = if xs.len() >= PAR_MIN { chunk } else { xs.len() };
    // SAFETY: `simd_map` writes every element of its chunk (from as many values of `xs`).
    #[allow(unsafe_code)]
    unsafe {
        written(xs.len(), chunk, |at, c| simd_map(c, &xs[at..], f))
    }
}

/// A buffer of `n` values written by `write(start, chunk)` on the pool's threads, in chunks
/// of `chunk` values (the last one shorter), `start` the chunk's first index; one call on
/// this thread when `n <= chunk`.
///
/// # Safety
///
/// `write` must initialise every element of each chunk it is given.
#[allow(unsafe_code)]
pub(crate) unsafe fn written<T: Send>(
    n: usize,
    chunk: usize,
    write: impl Fn(usize, &mut [MaybeUninit<T>]) + Sync,
) -> Vec<T> {
    let mut v: Vec<T> = Vec::with_capacity(n);
    let spare = &mut v.spare_capacity_mut()[..n];
    let chunk = chunk.max(1);
    if n <= chunk {
        write(0, spare);
    } else {
        spare
            .par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| write(i * chunk, c));
    }
    // SAFETY: the chunks cover all `n` elements of the capacity, and the caller's `write`
    // initialised each.
    unsafe { v.set_len(n) };
    v
}

/// Spare buffers a thread keeps (see [`Spare`]), at most this many...
const SPARE_MAX: usize = 4;

/// ...each of at most this many values (larger ones are freed after use).
const SPARE_MAX_LEN: usize = 1 << 18;

thread_local! {
    /// This thread's spare scratch buffers (see [`Spare`]).
    static SPARE: std::cell::RefCell<Vec<Vec<f32>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A scratch buffer of the thread's own: one of the thread's spare buffers, or a new empty
/// one when it has none left (one taken while another is held), given back to the spares of
/// the thread that drops it. It holds whatever its last user left; the user sizes it.
///
/// For buffers a task needs for its own work inside a parallel loop. With
/// [`crate::retain_freed_memory`] every thread allocates from one heap under one lock, and
/// blocks larger than glibc's per-thread cache (1 KiB) are taken and freed under it: a
/// buffer allocated per task made the tasks of a loop wait on each other. Layer norm over
/// `[8, 197, 384]`, least of 50 calls at 2 threads: 0.32 ms with a row buffer allocated per
/// task, 0.14 ms with this (0.34 ms on 1 thread either way; BENCHMARKS.md, issue 14).
pub(crate) struct Spare(Vec<f32>);

impl Spare {
    /// One of this thread's spare buffers, or a new empty one.
    pub(crate) fn take() -> Spare {
        Spare(SPARE.with_borrow_mut(Vec::pop).unwrap_or_default())
    }
}

impl std::ops::Deref for Spare {
    type Target = Vec<f32>;
    fn deref(&self) -> &Vec<f32> {
        &self.0
    }
}

impl std::ops::DerefMut for Spare {
    fn deref_mut(&mut self) -> &mut Vec<f32> {
        &mut self.0
    }
}

impl Drop for Spare {
    fn drop(&mut self) {
        if self.0.capacity() <= SPARE_MAX_LEN {
            let buf = std::mem::take(&mut self.0);
            // A thread being torn down has no spares to give back to; the buffer is freed.
            let _ = SPARE.try_with(|spare| {
                if let Ok(mut spare) = spare.try_borrow_mut() {
                    if spare.len() < SPARE_MAX {
                        spare.push(buf);
                    }
                }
            });
        }
    }
}

/// `f` with a [`Spare`] buffer.
pub(crate) fn with_scratch<R>(f: impl FnOnce(&mut Vec<f32>) -> R) -> R {
    f(&mut Spare::take())
}

/// [`with_scratch`] holding at least `n` values, `f` given the first `n` (whatever they
/// hold).
pub(crate) fn with_scratch_len<R>(n: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    with_scratch(|buf| {
        if buf.len() < n {
            buf.resize(n, 0.0);
        }
        f(&mut buf[..n])
    })
}

/// Run `f` from a function compiled for AVX-512 (or AVX2 + FMA) when the CPU has it,
/// detected at run time, else as built (baseline x86-64 has only 4-wide SSE2). `f` gets the
/// wider instructions only where the compiler inlines it there, which it does not do for a
/// closure of any size unless told: callers mark the closure `#[inline(always)]` (without
/// it, `perf annotate` showed layer norm, softmax rows and binary ops running SSE code), and
/// mark closures it calls in turn the same way. [`simd_map`] and [`simd_map_mut`] hold
/// their loops in the feature-enabled functions themselves. Results are
/// the same either way: no fused multiply-add is introduced (Rust never contracts
/// `a * b + c`).
#[inline(always)]
pub fn simd<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: `avx512` only enables instructions the CPU was just found to support.
            #[allow(unsafe_code)]
            return unsafe { avx512(f) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: as above, for AVX2 and FMA.
            #[allow(unsafe_code)]
            return unsafe { avx2(f) };
        }
    }
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// `out[i] = f(inp[i])`, the loop compiled for AVX-512 (or AVX2 + FMA) when the CPU has it
/// (see [`simd`]); here the loop itself lives in the feature-enabled function, so only the
/// small per-element `f` has to be inlined into it.
pub fn simd_map(out: &mut [MaybeUninit<f32>], inp: &[f32], f: impl Fn(f32) -> f32 + Copy) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: only instructions the CPU was just found to support.
            #[allow(unsafe_code)]
            return unsafe { map_avx512(out, inp, f) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: as above.
            #[allow(unsafe_code)]
            return unsafe { map_avx2(out, inp, f) };
        }
    }
    out.iter_mut().zip(inp).for_each(|(o, &v)| {
        o.write(f(v));
    });
}

/// [`simd_map`] in place.
pub fn simd_map_mut(xs: &mut [f32], f: impl Fn(f32) -> f32 + Copy) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: only instructions the CPU was just found to support.
            #[allow(unsafe_code)]
            return unsafe { map_mut_avx512(xs, f) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: as above.
            #[allow(unsafe_code)]
            return unsafe { map_mut_avx2(xs, f) };
        }
    }
    xs.iter_mut().for_each(|v| *v = f(*v));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn map_avx512(out: &mut [MaybeUninit<f32>], inp: &[f32], f: impl Fn(f32) -> f32 + Copy) {
    out.iter_mut().zip(inp).for_each(|(o, &v)| {
        o.write(f(v));
    });
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn map_avx2(out: &mut [MaybeUninit<f32>], inp: &[f32], f: impl Fn(f32) -> f32 + Copy) {
    out.iter_mut().zip(inp).for_each(|(o, &v)| {
        o.write(f(v));
    });
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn map_mut_avx512(xs: &mut [f32], f: impl Fn(f32) -> f32 + Copy) {
    xs.iter_mut().for_each(|v| *v = f(*v));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn map_mut_avx2(xs: &mut [f32], f: impl Fn(f32) -> f32 + Copy) {
    xs.iter_mut().for_each(|v| *v = f(*v));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// A copy of the data of a small f32 tensor of exactly `n` elements (weights, biases).
fn small_vec(t: &Tensor, n: usize) -> Option<Vec<f32>> {
    if t.elem_count() != n || t.dtype() != DType::F32 {
        return None;
    }
    t.flatten_all().ok()?.to_vec1::<f32>().ok()
}

/// Apply `f(row_index, row_in, row_out)` to each row of `n` elements, in parallel for large
/// inputs. `f` writes a row of scratch memory (it may read back what it wrote), which is
/// then copied into the output: each output element is written once, with no zeroing first.
fn map_rows(x: &[f32], n: usize, f: impl Fn(usize, &[f32], &mut [f32]) + Sync) -> Vec<f32> {
    if n == 0 || x.is_empty() {
        return vec![0.0; x.len()];
    }
    // Whole rows per chunk, about 16 KiB of input each when large; else one chunk.
    let rows = if x.len() >= PAR_MIN {
        (4096 / n).max(1)
    } else {
        x.len().div_ceil(n)
    };
    let task = |at: usize, c: &mut [MaybeUninit<f32>]| {
        with_scratch_len(n, |scratch| {
            simd(
                #[inline(always)]
                || {
                    for (r, o) in c.chunks_mut(n).enumerate() {
                        let i = at / n + r;
                        let (xr, yr) = (&x[i * n..][..o.len()], &mut scratch[..o.len()]);
                        f(i, xr, yr);
                        put(o, yr);
                    }
                },
            )
        })
    };
    // SAFETY: each chunk starts at a row (its start a multiple of `n`) and every one of its
    // elements gets a value from the scratch row of the same length.
    #[allow(unsafe_code)]
    unsafe {
        written(x.len(), rows * n, task)
    }
}

/// Layer norm over the last dims (`n` elements per row): y shaped like `x`, and with `stats`
/// also mean and rstd, one value per row (shaped `[rows]`). Without `stats`, each row's
/// statistics are taken while the row is in cache and the row normalised at once: one pass
/// over memory instead of two (ViT-S at batch 8 on 2 threads: 10.8–11.3 → 8.7–10.0 ms of
/// layer norm per run; BENCHMARKS.md, issue 14).
#[allow(clippy::type_complexity)]
pub fn layer_norm(
    x: &Tensor,
    n: usize,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
    stats: bool,
) -> Option<(Tensor, Option<(Tensor, Tensor)>)> {
    if n == 0 || !x.elem_count().is_multiple_of(n) {
        return None;
    }
    let w = match weight {
        Some(w) => Some(small_vec(w, n)?),
        None => None,
    };
    let b = match bias {
        Some(b) => Some(small_vec(b, n)?),
        None => None,
    };
    let rows = x.elem_count() / n;
    let (w, b) = (w.as_deref(), b.as_deref());
    let (y, kept) = with_f32(x, |xs| {
        // The statistics first, for the callers that return them; otherwise each row's are
        // taken while the row is in cache, just before it is normalised.
        let kept: Option<Vec<(f32, f32)>> = stats.then(|| {
            xs.par_chunks(n)
                .map(|r| {
                    simd(
                        #[inline(always)]
                        || row_stats(r, eps),
                    )
                })
                .collect()
        });
        let y = map_rows(
            xs,
            n,
            #[inline(always)]
            |row, xr, yr| {
                let (mean, rstd) = match &kept {
                    Some(k) => k[row],
                    None => row_stats(xr, eps),
                };
                normalize_row(xr, yr, mean, rstd, w, b);
            },
        );
        (y, kept)
    })?;
    let dev = x.device();
    let y = Tensor::from_vec(y, x.shape(), dev).ok()?;
    let Some(kept) = kept else {
        return Some((y, None));
    };
    let (mean, rstd): (Vec<f32>, Vec<f32>) = kept.into_iter().unzip();
    let mean = Tensor::from_vec(mean, rows, dev).ok()?;
    let rstd = Tensor::from_vec(rstd, rows, dev).ok()?;
    Some((y, Some((mean, rstd))))
}

/// `yr = (xr - mean) * rstd`, then times `w` and plus `b` where given (elementwise, in that
/// order). One plain loop per case, so that each vectorises.
#[inline(always)]
fn normalize_row(
    xr: &[f32],
    yr: &mut [f32],
    mean: f32,
    rstd: f32,
    w: Option<&[f32]>,
    b: Option<&[f32]>,
) {
    let yx = yr.iter_mut().zip(xr);
    match (w, b) {
        (Some(w), Some(b)) => {
            for (((o, &v), &w), &b) in yx.zip(w).zip(b) {
                *o = (v - mean) * rstd * w + b;
            }
        }
        (Some(w), None) => {
            for ((o, &v), &w) in yx.zip(w) {
                *o = (v - mean) * rstd * w;
            }
        }
        (None, Some(b)) => {
            for ((o, &v), &b) in yx.zip(b) {
                *o = (v - mean) * rstd + b;
            }
        }
        (None, None) => {
            for (o, &v) in yx {
                *o = (v - mean) * rstd;
            }
        }
    }
}

/// Mean and 1/sqrt(var + eps) of one row (population variance, two passes, sums in f64).
#[inline(always)]
fn row_stats(r: &[f32], eps: f64) -> (f32, f32) {
    let len = r.len() as f64;
    let mean = (lane_sum(r, f64::from) / len) as f32;
    let var = lane_sum(r, |v| {
        let d = f64::from(v - mean);
        d * d
    }) / len;
    let rstd = 1.0 / ((var as f32) + eps as f32).sqrt();
    (mean, rstd)
}

/// Lanes of the vectorised row reductions below.
const LANES: usize = 16;

/// `combine` over `map` of every element of `r`, in [`LANES`] interleaved partial results
/// (which the compiler can vectorise; one running result is a chain of dependent steps),
/// starting from `init`.
#[inline(always)]
fn lane_fold<T: Copy>(
    r: &[f32],
    init: T,
    map: impl Fn(f32) -> T,
    combine: impl Fn(T, T) -> T,
) -> T {
    let mut acc = [init; LANES];
    let chunks = r.chunks_exact(LANES);
    let tail = chunks
        .remainder()
        .iter()
        .fold(init, |t, &v| combine(t, map(v)));
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = combine(*a, map(v));
        }
    }
    acc.iter().fold(tail, |t, &a| combine(t, a))
}

/// The f64 sum of `f` over `r` (see [`lane_fold`]).
#[inline(always)]
fn lane_sum(r: &[f32], f: impl Fn(f32) -> f64) -> f64 {
    lane_fold(r, 0.0, f, |a, b| a + b)
}

/// The mean of each row of `n` values of `x` (its trailing values), as a tensor of `shape`
/// (one value per row): sums in 16 f64 lanes, rounded to f32 once, rows split across threads
/// when large, read where they lie (`per_row`). Global average pooling used to copy its
/// input whole, then take candle's mean on one thread: EfficientNet-B0's squeeze-excitation
/// pools took 27 ms per run at batch 8 on 1 thread and 25 on 2 (BENCHMARKS.md, issue 14).
/// `None` where `per_row` declines.
pub fn mean_rows(x: &Tensor, n: usize, shape: &[usize]) -> Option<Tensor> {
    per_row(
        x,
        n,
        shape,
        #[inline(always)]
        |row| (lane_sum(row, f64::from) / row.len() as f64) as f32,
    )
}

/// The 2-norm of each row of `n` values of `x` (`squares` true: the square root of the sum of
/// squares) or its 1-norm (the sum of magnitudes), as [`mean_rows`] takes means: f64 lanes,
/// rounded to f32 once, rows read where they lie (`per_row`: Swin V2 normalizes the rows of
/// queries and keys that are views of the projection's output). candle's composed form
/// (magnitudes, squares, sum, root: four passes on one thread, the first a copy) took 1.9 ms
/// a run on 1 thread and 2.1 on 2 for torchvision Swin V2-T's 24 cosine-attention norms
/// (BENCHMARKS.md, issue 14). `None` where `per_row` declines.
pub fn norm_rows(x: &Tensor, n: usize, shape: &[usize], squares: bool) -> Option<Tensor> {
    per_row(
        x,
        n,
        shape,
        #[inline(always)]
        |row| match squares {
            true => lane_sum(row, |v| f64::from(v) * f64::from(v)).sqrt() as f32,
            false => lane_sum(row, |v| f64::from(v).abs()) as f32,
        },
    )
}

/// `f` of each row of `n` values of `x` (its trailing values), as a tensor of `shape` (one
/// value per row), rows split across threads when large; `f` runs in wide registers where
/// the CPU has them ([`simd`]: give it `#[inline(always)]`, or it may be compiled apart,
/// without them: the row means took 35% longer so). `x` is a float32 CPU tensor of any
/// layout whose rows each lie in one contiguous run, read where they lie (a contiguous
/// tensor, or a view with its trailing values together, as a permute of the leading dims
/// leaves them). `None` for any other tensor, for `n` = 0, or when `shape` does not hold one
/// value per row.
fn per_row(
    x: &Tensor,
    n: usize,
    shape: &[usize],
    f: impl Fn(&[f32]) -> f32 + Sync,
) -> Option<Tensor> {
    if x.dtype() != DType::F32
        || n == 0
        || shape.iter().product::<usize>().checked_mul(n) != Some(x.elem_count())
    {
        return None;
    }
    let values = with_storage::<f32, _>(x, |data, layout| {
        // Rows of `n` values in runs of stride 1: the merged layout's last dim, cut into rows.
        let (mut dims, strides) = super::strided::merge(layout.dims(), &[layout.stride()]);
        let mut strides = strides.into_iter().next()?;
        let (&last, &step) = (dims.last()?, strides.last()?);
        if (step != 1 && last > 1) || last % n != 0 {
            return None;
        }
        *dims.last_mut()? = last / n;
        *strides.last_mut()? = n;
        let rows = x.elem_count() / n;
        let per = (PAR_MIN / n).max(1);
        let strides = [strides];
        let base = [layout.start_offset()];
        let fill = |(c, o): (usize, &mut [f32])| {
            let mut walk = super::strided::RowWalk::at(&dims, &strides, &base, c * per);
            simd(
                #[inline(always)]
                || {
                    for m in o.iter_mut() {
                        let at = walk.starts()[0];
                        *m = f(&data[at..at + n]);
                        walk.next();
                    }
                },
            )
        };
        let mut out = vec![0f32; rows];
        if rows * n >= PAR_MIN {
            out.par_chunks_mut(per).enumerate().for_each(fill);
        } else {
            out.chunks_mut(per).enumerate().for_each(fill);
        }
        Some(out)
    })??;
    Tensor::from_vec(values, shape, x.device()).ok()
}

/// The largest element of `r` (NaNs ignored, as `f32::max` does), `-inf` when empty.
#[inline(always)]
pub fn row_max(r: &[f32]) -> f32 {
    lane_fold(r, f32::NEG_INFINITY, |v| v, f32::max)
}

/// `row` replaced by `exp(x - m) / Σ exp(x - m)` (softmax, with `m` the row's max) with
/// [`exp_fast`]; terms below `e^-87.3` count as 0. An all `-inf` row (`m = -inf`) becomes NaN,
/// as in torch's softmax. Inline into a [`simd`] call to get its vector instructions.
#[inline(always)]
pub fn softmax_row(row: &mut [f32], m: f32) {
    for x in row.iter_mut() {
        let d = *x - m;
        *x = if d < -87.3 { 0.0 } else { exp_fast(d) };
    }
    let sum = lane_fold(row, 0f32, |v| v, |a, b| a + b);
    for x in row.iter_mut() {
        *x /= sum;
    }
}

/// Softmax (or log-softmax) over the last dim of a contiguous f32 tensor.
pub fn softmax_last(x: &Tensor, log: bool) -> Option<Tensor> {
    let n = *x.dims().last()?;
    if n == 0 {
        return None;
    }
    let y = with_f32(x, |xs| {
        map_rows(
            xs,
            n,
            #[inline(always)]
            |_, xr, yr| {
                // Rows that are all -inf give NaN, as in torch.
                let m = row_max(xr);
                if log {
                    let s: f32 = xr.iter().map(|&v| (v - m).exp()).sum();
                    let lse = s.ln();
                    for (o, &v) in yr.iter_mut().zip(xr) {
                        *o = (v - m) - lse;
                    }
                } else {
                    yr.copy_from_slice(xr);
                    softmax_row(yr, m);
                }
            },
        )
    })?;
    Tensor::from_vec(y, x.shape(), x.device()).ok()
}

/// Softmax over dim `d` of a contiguous f32 tensor, `d` not the last: each of the
/// `[len, inner]` blocks (`len` the dim's size, `inner` the product of the dims after it) is
/// normalized down its columns, the rows read in order (a column's max, then `exp(x - max)`
/// with [`exp_fast`], terms below `e^-87.3` as 0, then each divided by its column's sum: what
/// [`softmax_row`] does to a row), the blocks in parallel. `None` for other tensors.
pub fn softmax_mid(x: &Tensor, d: usize) -> Option<Tensor> {
    let len = *x.dims().get(d)?;
    let inner: usize = x.dims()[d + 1..].iter().product();
    let block = len.checked_mul(inner)?;
    if block == 0 || d + 1 == x.rank() {
        return None;
    }
    let y = with_f32(x, |xs| {
        let task = |at: usize, c: &mut [MaybeUninit<f32>]| {
            with_scratch_len(block + 2 * inner, |scratch| {
                let (e, rest) = scratch.split_at_mut(block);
                let (m, s) = rest.split_at_mut(inner);
                simd(
                    #[inline(always)]
                    || {
                        for (b, o) in c.chunks_mut(block).enumerate() {
                            let src = &xs[at + b * block..][..block];
                            m.fill(f32::NEG_INFINITY);
                            for row in src.chunks_exact(inner) {
                                for (mj, &v) in m.iter_mut().zip(row) {
                                    *mj = mj.max(v);
                                }
                            }
                            s.fill(0.0);
                            for (er, row) in e.chunks_exact_mut(inner).zip(src.chunks_exact(inner))
                            {
                                for ((ej, &v), (&mj, sj)) in
                                    er.iter_mut().zip(row).zip(m.iter().zip(s.iter_mut()))
                                {
                                    let d = v - mj;
                                    *ej = if d < -87.3 { 0.0 } else { exp_fast(d) };
                                    *sj += *ej;
                                }
                            }
                            for er in e.chunks_exact_mut(inner) {
                                for (ej, &sj) in er.iter_mut().zip(s.iter()) {
                                    *ej /= sj;
                                }
                            }
                            put(o, e);
                        }
                    },
                )
            })
        };
        let blocks = ((1 << 14) / block).max(1);
        // SAFETY: each chunk holds whole blocks (its start a multiple of `block`), and `put`
        // writes every element of each.
        #[allow(unsafe_code)]
        unsafe {
            written(xs.len(), blocks * block, task)
        }
    })?;
    Tensor::from_vec(y, x.shape(), x.device()).ok()
}

/// erf for f32 as a branch-free rational function (Eigen's `generic_fast_erf_float`, also
/// used by XLA): odd degree-13 numerator over even degree-8 denominator on x clamped to
/// [-4, 4], within 1e-6 of libm's `erff` (checked in the tests below), and vectorizable,
/// unlike the libm call. (Plain multiply-adds: `mul_add` is a slow libm call on baseline x86-64.)
#[inline(always)]
pub fn erf_fast(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = x2 * -2.726_142_3e-10 + 2.770_681_4e-8;
    p = x2 * p + -2.101_024e-6;
    p = x2 * p + -5.692_506_4e-5;
    p = x2 * p + -7.349_906_3e-4;
    p = x2 * p + -2.954_6e-3;
    p = x2 * p + -1.609_603_3e-2;
    p *= x;
    let mut q = x2 * -1.456_607_2e-5 + -2.133_740_6e-4;
    q = x2 * q + -1.682_827e-3;
    q = x2 * q + -7.373_329e-3;
    q = x2 * q + -1.426_473_9e-2;
    p / q
}

/// exp for f32, branch-free and vectorizable (libm's `expf` is a call per element): `x` is
/// clamped to [-87.3, 88.3] (so the result stays a normal float), split as `n ln 2 + r` with
/// `|r| <= ln 2 / 2` (n rounded by the 1.5 * 2^23 trick, which needs no rounding instruction and leaves n in
/// the low bits),
/// `e^r` from its degree-7 Taylor polynomial and `2^n` built in the exponent bits. Within
/// 2e-7 relative of libm's `expf` on the clamped range (checked in the tests below). NaN
/// stays NaN. For the logistic functions only: below -87.3 it returns about 1e-38, not 0.
#[inline(always)]
pub fn exp_fast(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    let x = x.clamp(-87.3, 88.3);
    let t = x * std::f32::consts::LOG2_E + MAGIC;
    let n = t - MAGIC;
    // n as an integer, read from t's low mantissa bits (no float-to-int conversion, whose
    // saturating form does not vectorize).
    let ni = t.to_bits().wrapping_sub(MAGIC.to_bits());
    let r = x - n * 0.693_145_75 - n * 1.428_606_8e-6;
    let mut p = r * (1.0 / 5040.0) + 1.0 / 720.0;
    p = r * p + 1.0 / 120.0;
    p = r * p + 1.0 / 24.0;
    p = r * p + 1.0 / 6.0;
    p = r * p + 0.5;
    p = r * p + 1.0;
    p = r * p + 1.0;
    let bits = ni.wrapping_add(127) << 23;
    p * f32::from_bits(bits)
}

/// `1 / (1 + exp(-x))` with [`exp_fast`].
#[inline(always)]
pub fn sigmoid_fast(x: f32) -> f32 {
    1.0 / (1.0 + exp_fast(-x))
}

// The per-element functions of the f32 kernels that more than one kernel applies (the op's
// own kernel, a convolution's fused activation, a fused chain of `super::pointwise`): one
// definition each, so that they compute the same bits.

/// `x * sigmoid(x)` (silu), with [`sigmoid_fast`].
#[inline(always)]
pub fn silu_fast(x: f32) -> f32 {
    x * sigmoid_fast(x)
}

/// `x * sigmoid(x)` (silu) over a slice in place, the one definition every silu of the f32
/// kernels uses (a convolution's fused activation, the op's own kernel, a fused chain): by
/// an AVX-512 kernel (`silu_avx512`, `silu_m512` per register) where the CPU has AVX-512
/// and FMA, else [`silu_fast`] per element. The two differ in the last bits (each within
/// 5e-7 relative of f64's silu, checked in the tests below); a machine computes every silu
/// one way.
pub fn silu_slice(xs: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("fma")
    {
        // SAFETY: only instructions the CPU was just found to support.
        #[allow(unsafe_code)]
        unsafe {
            silu_avx512(xs)
        };
        return;
    }
    simd_map_mut(xs, silu_fast)
}

/// [`silu_slice`] by AVX-512, 16 values at a time (the last ones by masked loads and stores)
/// with [`silu_m512`]: `exp(-x)` by a range reduction and polynomial in fused multiply-adds,
/// and `1 / (1 + exp(-x))` by the reciprocal estimate (`rcp14`, 2^-14 relative) refined by
/// one Newton step instead of a division, which on the compiler's loop cost more than half
/// of the time (EfficientNet-B0: BENCHMARKS.md, issue 14). NaN stays NaN.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
fn silu_avx512(xs: &mut [f32]) {
    use std::arch::x86_64::*;
    for chunk in xs.chunks_mut(16) {
        let mask: __mmask16 = ((1u32 << chunk.len()) - 1) as u16;
        let p = chunk.as_mut_ptr();
        // SAFETY: the mask covers the chunk's `len <= 16` values only.
        #[allow(unsafe_code)]
        unsafe {
            _mm512_mask_storeu_ps(p, mask, silu_m512(_mm512_maskz_loadu_ps(mask, p)))
        };
    }
}

/// [`silu_slice`]'s AVX-512 silu of 16 values in a register (see `silu_avx512`), for kernels
/// that apply it before storing their sums.
///
/// `e^-x` is computed from `x` clamped to [-88.3, 87.3] (NaN stays NaN) and split as
/// `-x = n ln 2 + r`, `|r| <= ln 2 / 2` (n rounded by the 1.5 * 2^23 trick, as in
/// [`exp_fast`]): `e^r` by a degree-6 polynomial fitted to it on that interval (relative
/// least squares reweighted toward minimax, 1e-7 relative in f32 Horner; `tools/silu_poly.py`
/// prints the coefficients), evaluated in `x + n ln 2 = -r` with its odd
/// coefficients negated, and `2^n` built in the exponent bits; ln 2 is one f32, whose
/// rounding (2e-9) adds at most 3e-7 relative at the clamp and 6e-8 for |x| < 20. Then
/// `1 + e^-x` is one multiply-add, and its reciprocal the `rcp14` estimate refined by one
/// Newton step. The degree-7 Taylor polynomial of `exp_fast`, a negation and a second
/// reduction constant took four more vector operations (EfficientNet-B0 spends a seventh of
/// its time in silu; BENCHMARKS.md, issue 14).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
#[inline]
pub(crate) fn silu_m512(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23, as in `exp_fast`
                                     // e^r ~ sum c_k r^k on |r| <= ln 2 / 2, in powers of -r (odd coefficients negated).
    const EXP_NEG: [f32; 7] = [
        1.383_684_2e-3,
        -8.374_816e-3,
        4.166_822_5e-2,
        -1.666_642e-1,
        4.999_999e-1,
        -1.0,
        1.0,
    ];
    let (lo, hi) = (_mm512_set1_ps(-88.3), _mm512_set1_ps(87.3));
    let magic = _mm512_set1_ps(MAGIC);
    let neg_log2e = _mm512_set1_ps(-std::f32::consts::LOG2_E);
    let ln2 = _mm512_set1_ps(std::f32::consts::LN_2);
    let magic_bits = _mm512_set1_epi32(MAGIC.to_bits() as i32 - 127);
    let one = _mm512_set1_ps(1.0);
    // min and max return their second operand, here x, when it is NaN.
    let xc = _mm512_max_ps(lo, _mm512_min_ps(hi, x));
    let t = _mm512_fmadd_ps(xc, neg_log2e, magic);
    let n = _mm512_sub_ps(t, magic);
    let neg_r = _mm512_fmadd_ps(n, ln2, xc);
    let mut poly = _mm512_set1_ps(EXP_NEG[0]);
    for &c in &EXP_NEG[1..] {
        poly = _mm512_fmadd_ps(neg_r, poly, _mm512_set1_ps(c));
    }
    // 2^n from n in t's low mantissa bits: (bits(t) - bits(MAGIC) + 127) << 23.
    let scale = _mm512_slli_epi32::<23>(_mm512_sub_epi32(_mm512_castps_si512(t), magic_bits));
    let d = _mm512_fmadd_ps(poly, _mm512_castsi512_ps(scale), one);
    let y = _mm512_rcp14_ps(d);
    let y = _mm512_fmadd_ps(_mm512_fnmadd_ps(d, y, one), y, y);
    _mm512_mul_ps(x, y)
}

/// `max(x, 0)` (relu).
#[inline(always)]
pub fn relu_f32(x: f32) -> f32 {
    x.max(0.0)
}

/// `x * clamp(x + 3, 0, 6) / 6` (hardswish).
#[inline(always)]
pub fn hardswish_f32(x: f32) -> f32 {
    x * (x + 3.0).clamp(0.0, 6.0) / 6.0
}

/// `1 / sqrt(x)` (rsqrt).
#[inline(always)]
pub fn rsqrt_f32(x: f32) -> f32 {
    1.0 / x.sqrt()
}

/// `x * x` (`pow(x, 2)`, as torch computes it).
#[inline(always)]
pub fn square_f32(x: f32) -> f32 {
    x * x
}

/// `x * x * x` (`pow(x, 3)`, as torch computes it).
#[inline(always)]
pub fn cube_f32(x: f32) -> f32 {
    x * x * x
}

/// tanh for f32, vectorizable: `1 - 2 / (exp(2x) + 1)` with [`exp_fast`] on `x` clamped to
/// [-10, 10] (tanh is 1 to f32 precision beyond); that loses accuracy near 0, so `|x| < 1/8`
/// uses the odd Taylor series instead. Within 3e-7 absolute of libm's `tanhf` (checked below).
#[inline(always)]
pub fn tanh_fast(x: f32) -> f32 {
    let c = x.clamp(-10.0, 10.0);
    let big = 1.0 - 2.0 / (exp_fast(2.0 * c) + 1.0);
    let x2 = c * c;
    // x - x^3/3 + 2x^5/15 - 17x^7/315 + 62x^9/2835: error below 1e-8 for |x| < 0.125.
    let small = c
        * (1.0
            + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0 + x2 * (62.0 / 2835.0)))));
    let y = if c.abs() < 0.125 { small } else { big };
    if x.is_nan() {
        x
    } else {
        y
    }
}

/// `x * 0.5 * (1 + erf(x / sqrt 2))` (candle's formula, with [`erf_fast`]): the erf GELU of
/// one value, as the gelu kernel and a fused chain's `gelu` step compute it.
#[inline(always)]
pub fn gelu_erf_f32(v: f32) -> f32 {
    (erf_fast(v * std::f32::consts::FRAC_1_SQRT_2) + 1.) * 0.5 * v
}

/// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))` with [`tanh_fast`]: the tanh GELU of
/// one value, as the gelu kernel (`approximate='tanh'`) and a fused chain's `gelu_tanh` step
/// compute it.
#[inline(always)]
pub fn gelu_tanh_f32(v: f32) -> f32 {
    let k = (2.0f64 / std::f64::consts::PI).sqrt() as f32;
    0.5 * v * (1.0 + tanh_fast(k * (v + 0.044715 * v * v * v)))
}

/// In-place `y[.., j] += bias[j]` on a fresh contiguous f32 result (a matmul's output).
struct AddBiasRows;

impl InplaceOp2 for AddBiasRows {
    fn name(&self) -> &'static str {
        "add-bias-rows"
    }

    fn cpu_fwd(
        &self,
        y: &mut CpuStorage,
        yl: &Layout,
        b: &CpuStorage,
        bl: &Layout,
    ) -> candle_core::Result<()> {
        let (CpuStorage::F32(y), CpuStorage::F32(b)) = (y, b) else {
            candle_core::bail!("add-bias-rows: f32 only");
        };
        let (Some((ys, ye)), Some((bs, be))) = (yl.contiguous_offsets(), bl.contiguous_offsets())
        else {
            candle_core::bail!("add-bias-rows: contiguous operands only");
        };
        let (y, b) = (&mut y[ys..ye], &b[bs..be]);
        if b.is_empty() || y.len() % b.len() != 0 {
            candle_core::bail!("add-bias-rows: bias does not divide the rows");
        }
        for row in y.chunks_mut(b.len()) {
            for (o, &v) in row.iter_mut().zip(b) {
                *o += v;
            }
        }
        Ok(())
    }
}

/// Add `bias` (shape `[n]`) to every row of `y` in place, where `y` is a fresh contiguous f32
/// tensor owned by the caller (nothing else may share its storage) whose last dim is `n`.
/// Returns false (and leaves `y` alone) when the fast path does not apply.
pub fn add_bias_in_place(y: &Tensor, bias: &Tensor) -> bool {
    let n = y.dims().last().copied().unwrap_or(0);
    if y.dtype() != DType::F32
        || bias.dtype() != DType::F32
        || bias.rank() != 1
        || bias.elem_count() != n
        || !y.is_contiguous()
        || !bias.is_contiguous()
    {
        return false;
    }
    y.inplace_op2(bias, &AddBiasRows).is_ok()
}

/// An elementwise arithmetic op for [`binary`].
#[derive(Debug, Clone, Copy)]
pub enum BinOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
}

/// `a op b` for f32 tensors of any layout, with torch broadcasting, in one pass (see
/// [`super::strided::binary_f32`]); `None` for other dtypes or shapes that do not broadcast.
pub fn binary(a: &Tensor, b: &Tensor, op: BinOp) -> Option<Tensor> {
    use super::strided::binary_f32;
    if a.dtype() != DType::F32 || b.dtype() != DType::F32 {
        return None;
    }
    match op {
        BinOp::Add => binary_f32(a, b, |x, y| x + y),
        BinOp::Sub => binary_f32(a, b, |x, y| x - y),
        BinOp::Mul => binary_f32(a, b, |x, y| x * y),
        BinOp::Div => binary_f32(a, b, |x, y| x / y),
    }
}

/// `max(x, 0)` of a contiguous f32 tensor, split across threads when large.
pub fn relu(x: &Tensor) -> Option<Tensor> {
    unary(x, relu_f32)
}

/// `f` applied to each element of an f32 tensor in one pass, split across threads when large
/// (a strided view read through its strides, [`super::strided::map_f32`]; every layout gets
/// the same `f`, the one a fused chain of [`super::pointwise`] applies too); `None` for any
/// other tensor.
pub fn unary(x: &Tensor, f: impl Fn(f32) -> f32 + Sync) -> Option<Tensor> {
    if x.dtype() != DType::F32 {
        return None;
    }
    if !x.is_contiguous() {
        return super::strided::map_f32(x, f);
    }
    let y = with_f32(x, |xs| mapped(xs, 8192, &f))?;
    Tensor::from_vec(y, x.shape(), x.device()).ok()
}

/// A new f32 tensor of `x`'s shape holding `f` applied to chunks of a copy of its values
/// (each chunk copied, then `f` on it while it is in the cache; chunks over the pool's threads
/// from `PAR_MIN` values); a strided `x` is made contiguous first. `None` unless `x` is f32.
pub fn unary_slices(x: &Tensor, f: impl Fn(&mut [f32]) + Sync) -> Option<Tensor> {
    if x.dtype() != DType::F32 {
        return None;
    }
    let x = x.contiguous().ok()?;
    let y = with_f32(&x, |xs| {
        let chunk = if xs.len() >= PAR_MIN { 8192 } else { xs.len() };
        let write = |at: usize, c: &mut [MaybeUninit<f32>]| {
            put(c, &xs[at..][..c.len()]);
            // SAFETY: `put` just wrote every element of the chunk.
            #[allow(unsafe_code)]
            f(unsafe { assume_written(c) });
        };
        // SAFETY: `write` initialises every element of each chunk (a copy of as many values).
        #[allow(unsafe_code)]
        unsafe {
            written(xs.len(), chunk, write)
        }
    })?;
    Tensor::from_vec(y, x.shape(), x.device()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn close(a: &Tensor, b: &Tensor) -> bool {
        a.dims() == b.dims()
            && a.flatten_all().unwrap().to_vec1::<f32>().unwrap()
                == b.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }

    /// Row means against a direct f64 mean per row, rounded once: short rows and long ones,
    /// few and many (split across the pool's threads); declined for a transpose, empty
    /// rows and a shape that does not hold one value per row.
    #[test]
    fn row_means_are_the_rounded_exact_means() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .expect("pool");
        for (rows, n) in [(3, 5), (8 * 96, 49), (2 * PAR_MIN + 1, 7), (4, 3 * PAR_MIN)] {
            let data: Vec<f32> = (0..rows * n)
                .map(|i| ((i * 7919 % 1013) as f32 - 500.0) * 1e-3 + 1e4 * ((i % 3) as f32))
                .collect();
            let x = Tensor::from_vec(data.clone(), (rows, n), &Device::Cpu).unwrap();
            let got = pool
                .install(|| mean_rows(&x, n, &[rows, 1]))
                .expect("applies");
            assert_eq!(got.dims(), &[rows, 1]);
            let got = got.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for (r, &g) in got.iter().enumerate() {
                let row = &data[r * n..][..n];
                let want = (row.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64) as f32;
                assert!(
                    (g - want).abs() <= want.abs() * 1e-6,
                    "{rows} x {n}, row {r}: {g} vs {want}"
                );
            }
        }
        let x = Tensor::ones((4, 6), DType::F32, &Device::Cpu).unwrap();
        assert!(mean_rows(&x.t().unwrap(), 4, &[6]).is_none());
        assert!(mean_rows(&x, 0, &[4]).is_none());
        assert!(mean_rows(&x, 6, &[5]).is_none());
    }

    /// Row 2- and 1-norms against direct f64 sums per row, rounded once, as the means are
    /// held above; declined where the means are.
    #[test]
    fn row_norms_are_the_rounded_exact_norms() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .expect("pool");
        for (rows, n) in [(3, 5), (8 * 96, 32), (2 * PAR_MIN + 1, 7), (4, 3 * PAR_MIN)] {
            let data: Vec<f32> = (0..rows * n)
                .map(|i| ((i * 7919 % 1013) as f32 - 500.0) * 1e-3 + 1e2 * ((i % 3) as f32))
                .collect();
            let x = Tensor::from_vec(data.clone(), (rows, n), &Device::Cpu).unwrap();
            for squares in [true, false] {
                let got = pool
                    .install(|| norm_rows(&x, n, &[rows], squares))
                    .expect("applies");
                assert_eq!(got.dims(), &[rows]);
                let got = got.to_vec1::<f32>().unwrap();
                for (r, &g) in got.iter().enumerate() {
                    let row = data[r * n..][..n].iter().map(|&v| f64::from(v));
                    let want = match squares {
                        true => row.map(|v| v * v).sum::<f64>().sqrt() as f32,
                        false => row.map(f64::abs).sum::<f64>() as f32,
                    };
                    assert!(
                        (g - want).abs() <= want.abs() * 1e-6,
                        "{rows} x {n}, row {r}, squares {squares}: {g} vs {want}"
                    );
                }
            }
        }
        // A view whose rows each lie in one run (Swin V2's queries: heads and tokens
        // permuted, each head's values together) is read where it lies: the norms of its
        // contiguous copy's rows.
        let data: Vec<f32> = (0..2 * 3 * 4 * 5).map(|i| (i % 11) as f32 - 5.0).collect();
        let x = Tensor::from_vec(data, (2, 3, 4, 5), &Device::Cpu).unwrap();
        let view = x.permute((0, 2, 1, 3)).unwrap();
        assert!(!view.is_contiguous());
        let copy = view.contiguous().unwrap();
        for squares in [true, false] {
            let got = norm_rows(&view, 5, &[2, 4, 3], squares).expect("applies");
            let want = norm_rows(&copy, 5, &[2, 4, 3], squares).expect("applies");
            let (got, want) = (got.flatten_all().unwrap(), want.flatten_all().unwrap());
            assert_eq!(
                got.to_vec1::<f32>().unwrap(),
                want.to_vec1::<f32>().unwrap()
            );
        }
        // Declined: rows that do not lie in runs (a transpose), empty rows, a shape that
        // does not hold one value per row.
        let x = Tensor::ones((4, 6), DType::F32, &Device::Cpu).unwrap();
        assert!(norm_rows(&x.t().unwrap(), 4, &[6], true).is_none());
        assert!(norm_rows(&x, 0, &[4], true).is_none());
        assert!(norm_rows(&x, 6, &[5], false).is_none());
    }

    /// A thread's spare buffers go back for its next use, nested uses get their own, other
    /// threads have theirs, and large ones are not kept.
    #[test]
    fn scratch_buffers_are_reused_per_thread() {
        // A buffer given back is the next call's (no allocation per task)...
        let first = with_scratch_len(300, |b| {
            b.fill(7.0);
            b.as_ptr() as usize
        });
        let (again, kept) = with_scratch_len(200, |b| (b.as_ptr() as usize, b.to_vec()));
        assert_eq!(first, again);
        assert_eq!(
            kept,
            vec![7.0; 200],
            "a scratch row holds its last user's values"
        );
        // ...a call inside another's gets a buffer of its own...
        let (outer, inner) = with_scratch_len(64, |o| {
            let inner = with_scratch_len(64, |i| {
                i.fill(1.0);
                i.as_ptr() as usize
            });
            (o.as_ptr() as usize, inner)
        });
        assert_ne!(outer, inner);
        // ...both are kept for the next nested pair, and another thread has its own.
        let (outer2, inner2) = with_scratch_len(64, |o| {
            (
                o.as_ptr() as usize,
                with_scratch_len(64, |i| i.as_ptr() as usize),
            )
        });
        assert_eq!(
            [outer2, inner2].map(|p| [outer, inner].contains(&p)),
            [true, true]
        );
        let other = std::thread::spawn(|| with_scratch_len(64, |b| b.as_ptr() as usize))
            .join()
            .unwrap();
        assert!(![outer, inner].contains(&other));
        // A buffer beyond the size kept is freed after use, not kept.
        let big = with_scratch_len(SPARE_MAX_LEN + 1, |b| b.as_ptr() as usize);
        let after = with_scratch(|b| b.as_ptr() as usize);
        assert_ne!(big, after);
    }

    /// New buffers written in parallel chunks hold exactly what a serial build holds: zeros,
    /// rows repeated (rows that do not divide a chunk evenly, and rows longer than a chunk)
    /// and bias planes, below and above the parallel size.
    #[test]
    fn written_buffers_hold_their_values() {
        for n in [5, PAR_ZERO_MIN - 1, PAR_ZERO_MIN, 3 * PAR_ZERO_MIN + 7] {
            let z = zeros(n);
            assert!(z.len() == n && z.iter().all(|&v| v == 0.0));
        }
        for (rows, width) in [(3, 7), (1000, 300), (700, 777), (5, 70_000), (0, 9)] {
            let row: Vec<f32> = (0..width).map(|i| (i * 3) as f32).collect();
            assert_eq!(
                repeated_rows(rows, &row),
                row.repeat(rows),
                "{rows} x {width}"
            );
        }
    }

    /// The one-pass binary kernel gives exactly candle's broadcast result for operands of
    /// every layout, and declines shapes that do not broadcast.
    #[test]
    fn binary_matches_candle_broadcast() {
        let dev = Device::Cpu;
        let t = |s: &[usize]| Tensor::randn(0f32, 1., s.to_vec(), &dev).unwrap();
        let pairs = [
            (t(&[2, 3, 4]), t(&[2, 3, 4])),
            (t(&[2, 3, 4]), t(&[4])),
            (t(&[2, 3, 4]), t(&[1, 3, 4])),
            (t(&[4]), t(&[2, 3, 4])),
            (t(&[2, 3, 4]), t(&[])),
            (t(&[]), t(&[2, 3, 4])),
            (t(&[1, 1, 5]), t(&[2, 3, 5])),
            (t(&[2, 3, 4, 5]), t(&[2, 3, 1, 1])),
            (t(&[2, 3, 1, 1]), t(&[2, 3, 4, 5])),
            (t(&[1, 3, 4, 5]), t(&[3, 1, 1])),
            // A channel scale broadcast over the batch too; neither operand the output's
            // shape; a transposed view; a head-broadcast table over transposed heads (a
            // rotary embedding's `q * cos`).
            (t(&[2, 3, 4, 5]), t(&[1, 3, 1, 1])),
            (t(&[3, 1]), t(&[1, 4])),
            (t(&[4, 3]).t().unwrap(), t(&[3, 4])),
            (t(&[2, 5, 3, 4]).transpose(1, 2).unwrap(), t(&[2, 1, 5, 4])),
        ];
        for (a, b) in &pairs {
            for (op, want) in [
                (BinOp::Add, a.broadcast_add(b)),
                (BinOp::Sub, a.broadcast_sub(b)),
                (BinOp::Mul, a.broadcast_mul(b)),
                (BinOp::Div, a.broadcast_div(b)),
            ] {
                let got = binary(a, b, op).expect("fast path applies");
                assert!(
                    close(&got, &want.unwrap()),
                    "{op:?} {:?} {:?}",
                    a.dims(),
                    b.dims()
                );
            }
        }
        // Rows too short for runs of their own, in blocks of rows that chunk boundaries cut:
        // a broadcast and a transposed operand.
        let long = t(&[3, 6001, 3]);
        for short in [t(&[1, 6001, 1]), t(&[3, 3, 6001]).transpose(1, 2).unwrap()] {
            for (x, y) in [(&long, &short), (&short, &long)] {
                let got = binary(x, y, BinOp::Sub).expect("fast path applies");
                assert!(close(&got, &x.broadcast_sub(y).unwrap()), "{:?}", y.dims());
            }
        }
        // Large enough to run in chunks across threads, with rows and blocks (odd lengths)
        // that chunk boundaries cut: exactly candle's result, operands on either side.
        let big = t(&[3, 7, 61, 67]);
        for small in [
            t(&[67]),
            t(&[61, 67]),
            t(&[3, 7, 1, 1]),
            t(&[3, 7, 61, 1]),
            t(&[]),
        ] {
            for (x, y) in [(&big, &small), (&small, &big)] {
                let got = binary(x, y, BinOp::Div).expect("fast path applies");
                assert!(close(&got, &x.broadcast_div(y).unwrap()), "{:?}", y.dims());
            }
        }
        // Shapes that do not broadcast are declined.
        assert!(binary(&t(&[2, 3]), &t(&[4, 3, 2]), BinOp::Add).is_none());
    }

    /// The fast erf against libm's `erff` (what candle's `erf` calls) over [-6, 6].
    #[test]
    fn erf_fast_matches_libm() {
        let mut worst = 0f32;
        for i in -600_000..=600_000 {
            let x = i as f32 * 1e-5;
            let d = (erf_fast(x) - candle_core::cpu::erf::erf_f32(x)).abs();
            worst = worst.max(d);
        }
        assert!(worst < 1e-6, "{worst}");
    }

    /// The fast exp, logistic and tanh against libm over their useful ranges.
    #[test]
    fn exp_tanh_fast_match_libm() {
        let (mut e_rel, mut t_abs, mut s_abs) = (0f32, 0f32, 0f32);
        for i in -870_000..=880_000 {
            let x = i as f32 * 1e-4;
            let want = x.exp();
            e_rel = e_rel.max((exp_fast(x) - want).abs() / want);
            t_abs = t_abs.max((tanh_fast(x) - x.tanh()).abs());
            s_abs = s_abs.max((sigmoid_fast(x) - 1.0 / (1.0 + (-x).exp())).abs());
        }
        assert!(e_rel < 2e-7, "exp {e_rel}");
        assert!(t_abs < 3e-7, "tanh {t_abs}");
        assert!(s_abs < 2e-7, "sigmoid {s_abs}");
        assert!(tanh_fast(f32::NAN).is_nan() && exp_fast(f32::NAN).is_nan());
        assert_eq!(tanh_fast(f32::INFINITY), 1.0);
        assert_eq!(
            sigmoid_fast(f32::NEG_INFINITY),
            1.0 / (1.0 + exp_fast(f32::INFINITY))
        );
        assert!(sigmoid_fast(f32::NEG_INFINITY) < 1e-38);
        // Tiny arguments keep their relative accuracy.
        assert!((tanh_fast(1e-6) - 1e-6).abs() < 1e-12);
    }

    /// silu over slices (AVX-512 where the CPU has it, any length: whole and masked chunks)
    /// against f64's `x / (1 + e^-x)` within 5e-7 relative (plus 1e-30 absolute near 0),
    /// and against the per-element `silu_fast` within 1e-6; NaN stays NaN, +inf stays +inf, far negative
    /// inputs give at most 1e-38 in magnitude times x, as `silu_fast` does.
    #[test]
    fn silu_slice_matches_f64_and_silu_fast() {
        let xs: Vec<f32> = (-900_000..=900_000).map(|i| i as f32 * 1e-4).collect();
        for len in [xs.len(), 17, 16, 15, 1, 0] {
            let mut got = xs[..len].to_vec();
            silu_slice(&mut got);
            for (&x, &y) in xs.iter().zip(&got) {
                let want = (x as f64 / (1.0 + (-(x as f64)).exp())) as f32;
                let tol = 1e-6 * want.abs() + 1e-30;
                assert!(
                    (y - want).abs() <= 5e-7 * want.abs() + 1e-30,
                    "{x}: {y} vs {want}"
                );
                assert!(
                    (y - silu_fast(x)).abs() <= tol,
                    "{x}: {y} vs {}",
                    silu_fast(x)
                );
            }
        }
        let mut special = [f32::NAN, f32::INFINITY, 0.0, -0.0, -100.0, 100.0, f32::MAX];
        silu_slice(&mut special);
        assert!(special[0].is_nan());
        assert_eq!(special[1], f32::INFINITY);
        assert_eq!(special[2..4], [0.0, 0.0]);
        assert!(
            special[4].abs() < 1e-35 && special[4] <= 0.0,
            "{}",
            special[4]
        );
        assert_eq!(special[5], 100.0);
        assert_eq!(special[6], f32::MAX);
    }

    /// Large enough to split across threads: same result as the composed softmax.
    #[test]
    fn softmax_last_matches_composed_form() {
        let x = Tensor::randn(0f32, 3., (40, 1000), &Device::Cpu).unwrap();
        let got = softmax_last(&x, false).unwrap();
        let m = x.max_keepdim(1).unwrap();
        let e = x.broadcast_sub(&m).unwrap().exp().unwrap();
        let want = e.broadcast_div(&e.sum_keepdim(1).unwrap()).unwrap();
        let d = (got - want).unwrap().abs().unwrap().max_keepdim(1).unwrap();
        let d = d
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        // Outputs are at most 1; the two sum 1000 terms in different orders (f32).
        assert!(d < 1e-5, "{d}");
    }

    /// Softmax down a middle dim is softmax along the last dim of the transposed tensor:
    /// blocks large enough to split across threads, a single row per block, and a column
    /// that is all -inf (NaN, as in torch), holds a NaN, or whose exp would overflow.
    #[test]
    fn softmax_mid_is_softmax_last_of_the_transpose() {
        for (shape, d) in [
            (&[3, 700, 9][..], 1),
            (&[2, 1, 5], 1),
            (&[4, 6, 3, 2], 1),
            (&[5, 40, 3], 0),
        ] {
            let mut x = Tensor::randn(0f32, 3., shape, &Device::Cpu).unwrap();
            if shape == [4, 6, 3, 2] {
                let mut v: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
                for r in 0..6 {
                    v[r * 6] = f32::NEG_INFINITY; // column (0, *, 0, 0)
                }
                v[6 * 6 + 1] = f32::NAN; // column (1, *, 0, 1), row 0
                for r in 0..6 {
                    v[2 * 36 + r * 6 + 2] += 500.0; // column (2, *, 1, 0): exp would overflow
                }
                x = Tensor::from_vec(v, shape, &Device::Cpu).unwrap();
            }
            let got = softmax_mid(&x, d).unwrap();
            let last = x.rank() - 1;
            let t = x.transpose(d, last).unwrap().contiguous().unwrap();
            let want = softmax_last(&t, false).unwrap().transpose(d, last).unwrap();
            let flat = |t: &Tensor| -> Vec<f32> { t.flatten_all().unwrap().to_vec1().unwrap() };
            for (i, (g, w)) in flat(&got).iter().zip(flat(&want)).enumerate() {
                // The two sum a column in different orders: a few roundings of f32 apart.
                let same = (g.is_nan() && w.is_nan()) || (g - w).abs() < 4e-6;
                assert!(same, "{shape:?} dim {d}, element {i}: {g} against {w}");
            }
        }
        assert!(
            softmax_mid(&Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap(), 1).is_none()
        );
    }
}
