//! Kernels that read their operands through any strides, one run along the last dim at a
//! time: an elementwise binary op with torch broadcasting (operands that are views, such as
//! the transposed heads a rotary embedding multiplies, or that broadcast in the middle dims),
//! `cat` along any dim, and a copy (or a unary map) of a view into a new contiguous tensor.
//! A run whose elements are adjacent in memory is read as one slice, so its loop vectorises;
//! candle's general forms index every element, on one thread.

use candle_core::{Shape, Tensor, WithDType};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};

use super::fused::{simd, with_scratch, with_scratch_len, with_storage};

/// Output elements per parallel task.
const TASK: usize = 1 << 14;

/// Dims of `shape` with adjacent dims merged where every layout in `strides` steps through
/// them as one (the outer dim's stride is the inner's times its size), and the merged
/// strides per layout. Size-1 dims are dropped; the result has at least one dim.
pub(crate) fn merge(dims: &[usize], strides: &[&[usize]]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let mut md: Vec<usize> = Vec::with_capacity(dims.len());
    let mut ms: Vec<Vec<usize>> = vec![Vec::with_capacity(dims.len()); strides.len()];
    for (d, &size) in dims.iter().enumerate() {
        if size == 1 {
            continue;
        }
        let joins = md.last().is_some_and(|_| {
            strides
                .iter()
                .zip(&ms)
                .all(|(s, m)| m.last() == Some(&(s[d] * size)))
        });
        if joins {
            *md.last_mut().expect("checked") *= size;
            for (s, m) in strides.iter().zip(ms.iter_mut()) {
                *m.last_mut().expect("checked") = s[d];
            }
        } else {
            md.push(size);
            for (s, m) in strides.iter().zip(ms.iter_mut()) {
                m.push(s[d]);
            }
        }
    }
    if md.is_empty() {
        md.push(1);
        ms.iter_mut().for_each(|m| m.push(0));
    }
    (md, ms)
}

/// The storage offset, relative to the layout's start, of element `i` (row-major over
/// `dims`) of a layout with `strides`.
#[inline(always)]
pub(crate) fn offset(mut i: usize, dims: &[usize], strides: &[usize]) -> usize {
    let mut off = 0;
    for d in (0..dims.len()).rev() {
        off += (i % dims[d]) * strides[d];
        i /= dims[d];
    }
    off
}

/// `f(a, b)` elementwise for f32 tensors of any layout, broadcast to each other as torch
/// does; the result is contiguous. `None` when the shapes do not broadcast or a tensor is
/// not an f32 CPU tensor.
pub fn binary_f32(a: &Tensor, b: &Tensor, f: impl Fn(f32, f32) -> f32 + Sync) -> Option<Tensor> {
    let shape: Shape = a
        .shape()
        .broadcast_shape_binary_op(b.shape(), "binary")
        .ok()?;
    let (a, b) = (a.broadcast_as(&shape).ok()?, b.broadcast_as(&shape).ok()?);
    let total = shape.elem_count();
    let out = with_storage::<f32, _>(&a, |ad, al| {
        with_storage::<f32, _>(&b, |bd, bl| {
            let (dims, st) = merge(shape.dims(), &[al.stride(), bl.stride()]);
            let last = dims.len() - 1;
            let (sa, sb) = (st[0][last], st[1][last]);
            let bases = [al.start_offset(), bl.start_offset()];
            if last == 0 || dims[last] >= SHORT_ROW {
                return by_runs(
                    total,
                    &dims,
                    &st,
                    &bases,
                    #[inline(always)]
                    |_, at, _, run| binary_run(run, (ad, at[0], sa), (bd, at[1], sb), &f),
                );
            }
            // Rows too short to be runs of their own: runs of whole blocks of rows (the
            // last two dims), each operand stepped through a block by additions.
            let (inner, block) = (dims[last], dims[last - 1] * dims[last]);
            let mut blocks = dims[..last].to_vec();
            blocks[last - 1] = block;
            let (ra, rb) = (st[0][last - 1], st[1][last - 1]);
            // Each block's start, whatever the run's first element in it.
            let starts: Vec<Vec<usize>> = (st.iter())
                .map(|s| [&s[..last - 1], &[0]].concat())
                .collect();
            by_runs(
                total,
                &blocks,
                &starts,
                &bases,
                #[inline(always)]
                |_, at, col, run| {
                    let (j, k) = (col / inner, col % inner);
                    let at = [at[0] + j * ra + k * sa, at[1] + j * rb + k * sb];
                    binary_rows(
                        run,
                        inner - k,
                        inner,
                        (ad, at[0], ra, sa),
                        (bd, at[1], rb, sb),
                        &f,
                    )
                },
            )
        })
    })???;
    Tensor::from_vec(out, shape, a.device()).ok()
}

/// A new row-major buffer of `total` elements (the product of `dims`, whose last is the
/// row length) of operands laid out with `strides` (one list per operand, one stride per
/// dim; `merge`d), operand `k`'s element 0 at offset `bases[k]`, computed one run at a time:
/// `f(scratch, at, col, run)` writes `run` with the next output elements, from element `col`
/// of a row and never past its end, operand `k`'s element for the row's element `col` at
/// offset `at[k]` (`run` and `scratch` are the thread's own buffers from [`with_scratch`],
/// holding whatever their last user left there). The runs are then copied into the output,
/// so each output element is written once, with no zeroing first. Tasks of whole rows, or
/// of pieces of one row when rows are long, in parallel from `2 * TASK` elements; each
/// task's loop is compiled for the CPU's vector width (see [`simd`]: mark `f`
/// `#[inline(always)]`), and steps from row to row by additions ([`RowWalk`]). `None` when
/// any `f` returns false.
pub(crate) fn by_runs(
    total: usize,
    dims: &[usize],
    strides: &[Vec<usize>],
    bases: &[usize],
    f: impl Fn(&mut Vec<f32>, &[usize], usize, &mut [f32]) -> bool + Sync,
) -> Option<Vec<f32>> {
    let Some((&inner, outer)) = dims.split_last() else {
        return Some(vec![0.0; total]);
    };
    if total == 0 || inner == 0 {
        return Some(vec![0.0; total]);
    }
    let last = outer.len();
    let chunk = if total < 2 * TASK {
        total
    } else if inner >= TASK {
        TASK
    } else {
        TASK / inner * inner
    };
    let failed = AtomicBool::new(false);
    let task = |start: usize, o: &mut [MaybeUninit<f32>]| {
        let ok = with_scratch(|scratch| {
            with_scratch_len(inner.min(o.len()), |run| {
                simd(
                    #[inline(always)]
                    || {
                        let mut col = start % inner;
                        let mut walk = RowWalk::at(outer, strides, bases, start / inner);
                        let mut at = vec![0; strides.len()];
                        let mut done = 0;
                        while done < o.len() {
                            let len = (inner - col).min(o.len() - done);
                            let starts = walk.starts().iter().zip(strides);
                            for (a, (&s, st)) in at.iter_mut().zip(starts) {
                                *a = s + col * st[last];
                            }
                            let r = &mut run[..len];
                            if !f(scratch, &at, col, r) {
                                return false;
                            }
                            super::fused::put(&mut o[done..done + len], r);
                            done += len;
                            col = 0;
                            walk.next();
                        }
                        true
                    },
                )
            })
        });
        if !ok {
            failed.store(true, Ordering::Relaxed);
            o.fill(MaybeUninit::new(0.0));
        }
    };
    // SAFETY: `task` writes every element of its chunk: each run's values, or (when a run
    // fails) zeros over the whole chunk.
    #[allow(unsafe_code)]
    let out = unsafe { super::fused::written(total, chunk, task) };
    (!failed.load(Ordering::Relaxed)).then_some(out)
}

/// Where one row (one index over the `outer` dims, row-major) of several layouts starts:
/// layout `k` at `bases[k]` plus the sum over the outer dims of index times `strides[k]`,
/// stepped from row to row by additions. Computing the offsets by division for each row cost
/// more than copying a short row (RAFT's adds of `[256, 1, 1, 2]` and `[1, 7, 7, 2]`, rows of
/// two values: BENCHMARKS.md, issue 14).
pub(crate) struct RowWalk<'a, S> {
    outer: &'a [usize],
    strides: &'a [S],
    index: Vec<usize>,
    starts: Vec<usize>,
}

impl<'a, S: AsRef<[usize]>> RowWalk<'a, S> {
    /// At row `row`, for layouts with `strides` (each with at least one stride per outer
    /// dim; any after those are not read).
    pub(crate) fn at(outer: &'a [usize], strides: &'a [S], bases: &[usize], row: usize) -> Self {
        let mut index = vec![0; outer.len()];
        let mut i = row;
        for (x, &n) in index.iter_mut().zip(outer).rev() {
            *x = i % n;
            i /= n;
        }
        let starts = strides
            .iter()
            .zip(bases)
            .map(|(s, &base)| {
                base + index
                    .iter()
                    .zip(s.as_ref())
                    .map(|(i, s)| i * s)
                    .sum::<usize>()
            })
            .collect();
        RowWalk {
            outer,
            strides,
            index,
            starts,
        }
    }

    /// Each layout's offset of the current row's first element.
    #[inline(always)]
    pub(crate) fn starts(&self) -> &[usize] {
        &self.starts
    }

    /// On to the next row (after the last, back to row 0).
    #[inline(always)]
    pub(crate) fn next(&mut self) {
        for d in (0..self.outer.len()).rev() {
            self.index[d] += 1;
            for (at, s) in self.starts.iter_mut().zip(self.strides) {
                *at += s.as_ref()[d];
            }
            if self.index[d] < self.outer[d] {
                return;
            }
            self.index[d] = 0;
            for (at, s) in self.starts.iter_mut().zip(self.strides) {
                *at -= self.outer[d] * s.as_ref()[d];
            }
        }
    }
}

/// Rows shorter than this many elements are computed by [`binary_f32`] a block of rows at a
/// time ([`binary_rows`]): a run's setup cost more than its values (RAFT's adds of
/// `[256, 1, 1, 2]` and `[1, 7, 7, 2]`, rows of two values: BENCHMARKS.md, issue 14).
const SHORT_ROW: usize = 8;

/// A run of [`binary_f32`] over rows of `inner` elements: `o[i] = f(a, b)` for consecutive
/// elements of a block of rows, the first `first` of them left in the first row; each
/// operand given as (data, offset of the first element, stride between rows, stride within
/// a row) and stepped by additions. False when a read falls outside its data.
#[inline(always)]
fn binary_rows(
    o: &mut [f32],
    first: usize,
    inner: usize,
    (ad, mut ia, ra, sa): (&[f32], usize, usize, usize),
    (bd, mut ib, rb, sb): (&[f32], usize, usize, usize),
    f: &impl Fn(f32, f32) -> f32,
) -> bool {
    let mut left = first;
    for v in o.iter_mut() {
        let (Some(&x), Some(&y)) = (ad.get(ia), bd.get(ib)) else {
            return false;
        };
        *v = f(x, y);
        left -= 1;
        if left == 0 {
            // To the next row's first element.
            left = inner;
            (ia, ib) = (ia + ra - (inner - 1) * sa, ib + rb - (inner - 1) * sb);
        } else {
            (ia, ib) = (ia + sa, ib + sb);
        }
    }
    true
}

/// One run of [`binary_f32`]: `o[j] = f(a[oa + j * sa], b[ob + j * sb])`, each operand given
/// as (data, offset, stride). False when a read falls outside its data.
#[inline(always)]
fn binary_run(
    o: &mut [f32],
    (ad, oa, sa): (&[f32], usize, usize),
    (bd, ob, sb): (&[f32], usize, usize),
    f: &impl Fn(f32, f32) -> f32,
) -> bool {
    let n = o.len();
    match (sa, sb) {
        (1, 1) => {
            let (Some(x), Some(y)) = (ad.get(oa..oa + n), bd.get(ob..ob + n)) else {
                return false;
            };
            for ((o, &x), &y) in o.iter_mut().zip(x).zip(y) {
                *o = f(x, y);
            }
        }
        (1, 0) => {
            let (Some(x), Some(&y)) = (ad.get(oa..oa + n), bd.get(ob)) else {
                return false;
            };
            for (o, &x) in o.iter_mut().zip(x) {
                *o = f(x, y);
            }
        }
        (0, 1) => {
            let (Some(&x), Some(y)) = (ad.get(oa), bd.get(ob..ob + n)) else {
                return false;
            };
            for (o, &y) in o.iter_mut().zip(y) {
                *o = f(x, y);
            }
        }
        _ => {
            for (j, o) in o.iter_mut().enumerate() {
                let (Some(&x), Some(&y)) = (ad.get(oa + j * sa), bd.get(ob + j * sb)) else {
                    return false;
                };
                *o = f(x, y);
            }
        }
    }
    true
}

/// `cat` of tensors of one dtype `T` along dim `d`, any layouts, in one pass over the
/// output: each output row (one index of the dims before `d`) gets every input's part in
/// turn, each run of a part copied as a slice where adjacent in memory; rows split across
/// threads when large, every element written once (no zeroing first). `None` when a tensor
/// is not a CPU tensor of `T` or reads outside its storage, the shapes disagree outside `d`,
/// or the list is empty.
pub fn cat<T: WithDType>(ts: &[Tensor], d: usize) -> Option<Tensor> {
    let first = ts.first()?;
    let rank = first.rank();
    if d >= rank
        || ts.iter().any(|t| {
            t.rank() != rank
                || (0..rank).any(|i| i != d && t.dims()[i] != first.dims()[i])
                || t.dtype() != first.dtype()
        })
    {
        return None;
    }
    let mut dims = first.dims().to_vec();
    dims[d] = ts.iter().map(|t| t.dims()[d]).sum();
    let outer = &dims[..d];
    let inner: usize = dims[d + 1..].iter().product();
    let row = dims[d] * inner;
    let total = outer.iter().product::<usize>() * row;
    if total == 0 {
        return Tensor::zeros(dims, first.dtype(), first.device()).ok();
    }
    let guards: Vec<_> = ts.iter().map(|t| t.storage_and_layout()).collect();
    let mut parts = Vec::with_capacity(ts.len());
    for (storage, lay) in &guards {
        let candle_core::Storage::Cpu(c) = &**storage else {
            return None;
        };
        let (ld, ls) = (lay.dims(), lay.stride());
        let len = ld[d] * inner;
        if len > 0 {
            // The part's own dims merged into runs; the outer dims indexed as they are.
            let (pd, ps) = merge(&ld[d..], &[&ls[d..]]);
            let ps = ps.into_iter().next().expect("one layout");
            parts.push(Part {
                data: c.as_slice::<T>().ok()?,
                start: lay.start_offset(),
                outer: &ls[..d],
                len,
                run: pd[pd.len() - 1],
                step: ps[ps.len() - 1],
                runs: (pd[..pd.len() - 1].to_vec(), ps[..ps.len() - 1].to_vec()),
            });
        }
    }
    // Whole rows per task: about TASK elements, or one row when longer.
    let chunk = if total < 2 * TASK {
        total
    } else {
        (TASK / row).max(1) * row
    };
    // Where every part steps through its rows by one stride (its outer dims merge into
    // one: a contiguous input), that stride per part.
    let row_strides: Option<Vec<usize>> = parts
        .iter()
        .map(|p| match merge(outer, &[p.outer]) {
            (md, ms) if md.len() == 1 => Some(ms[0][0]),
            _ => None,
        })
        .collect();
    let outer_strides: Vec<&[usize]> = parts.iter().map(|p| p.outer).collect();
    let starts: Vec<usize> = parts.iter().map(|p| p.start).collect();
    let failed = AtomicBool::new(false);
    let task = |at: usize, c: &mut [MaybeUninit<T>]| {
        let first_row = at / row;
        if let Some(strides) = &row_strides {
            let mut bases: Vec<usize> = (parts.iter().zip(strides))
                .map(|(p, s)| p.start + first_row * s)
                .collect();
            if row == parts.len() {
                // One value of each part per row (a stack along a new last dim, a grid's
                // coordinates): the values in turn.
                for orow in c.chunks_mut(row) {
                    for (((o, p), base), s) in
                        orow.iter_mut().zip(&parts).zip(&mut bases).zip(strides)
                    {
                        let Some(&v) = p.data.get(*base) else {
                            failed.store(true, Ordering::Relaxed);
                            c.fill(MaybeUninit::new(T::zero()));
                            return;
                        };
                        o.write(v);
                        *base += s;
                    }
                }
                return;
            }
            for orow in c.chunks_mut(row) {
                let mut col = 0;
                for ((p, base), s) in parts.iter().zip(bases.iter_mut()).zip(strides) {
                    if !p.copy_into(&mut orow[col..col + p.len], *base) {
                        failed.store(true, Ordering::Relaxed);
                        c.fill(MaybeUninit::new(T::zero()));
                        return;
                    }
                    col += p.len;
                    *base += s;
                }
            }
            return;
        }
        let mut walk = RowWalk::at(outer, &outer_strides, &starts, first_row);
        for orow in c.chunks_mut(row) {
            let mut col = 0;
            for (p, &base) in parts.iter().zip(walk.starts()) {
                if !p.copy_into(&mut orow[col..col + p.len], base) {
                    failed.store(true, Ordering::Relaxed);
                    orow.fill(MaybeUninit::new(T::zero()));
                    break;
                }
                col += p.len;
            }
            walk.next();
        }
    };
    // SAFETY: every chunk is whole rows (`chunk` and `total` are multiples of `row`), and
    // each row is written: every part's elements (the parts' lengths sum to `row`), or zeros
    // when a part fails.
    #[allow(unsafe_code)]
    let out = unsafe { super::fused::written(total, chunk, task) };
    if failed.load(Ordering::Relaxed) {
        return None;
    }
    Tensor::from_vec(out, dims, first.device()).ok()
}

/// One input of [`cat`]: its data, the start and outer-dim strides of its layout, and its
/// part of each output row (`len` elements, in runs of `run` elements `step` apart, the runs
/// placed by the part's other merged dims and strides, `runs`).
struct Part<'a, T> {
    data: &'a [T],
    start: usize,
    outer: &'a [usize],
    len: usize,
    run: usize,
    step: usize,
    runs: (Vec<usize>, Vec<usize>),
}

impl<T: WithDType> Part<'_, T> {
    /// This part of one output row, read from `base` (the row's offset in `data`); false
    /// when a read falls outside `data`.
    #[inline(always)]
    fn copy_into(&self, o: &mut [MaybeUninit<T>], base: usize) -> bool {
        if let [one] = o {
            // A part of one value per row (a stack along a new last dim, a coordinate
            // grid's x and y): the value, without a run's setup.
            return self.data.get(base).map(|&v| one.write(v)).is_some();
        }
        if self.runs.0.is_empty() {
            return gather(o, self.data, base, self.step, &|v| v);
        }
        o.chunks_mut(self.run).enumerate().all(|(k, r)| {
            gather(
                r,
                self.data,
                base + offset(k, &self.runs.0, &self.runs.1),
                self.step,
                &|v| v,
            )
        })
    }
}

/// `o[j] = f(data[off + j * s])` into new memory; false (nothing written) when a read would
/// fall outside `data`.
#[inline(always)]
fn gather<T: Copy>(
    o: &mut [MaybeUninit<T>],
    data: &[T],
    off: usize,
    s: usize,
    f: &impl Fn(T) -> T,
) -> bool {
    let Some(last) = o.len().checked_sub(1) else {
        return true;
    };
    let reach = last.checked_mul(s).and_then(|r| r.checked_add(off));
    let Some(src) = reach.and_then(|r| data.get(off..=r)) else {
        return false;
    };
    if s == 1 {
        for (d, &v) in o.iter_mut().zip(src) {
            d.write(f(v));
        }
    } else if s == 0 {
        // A broadcast run: one element repeated.
        o.fill(MaybeUninit::new(f(src[0])));
    } else {
        for (d, &v) in o.iter_mut().zip(src.iter().step_by(s)) {
            d.write(f(v));
        }
    }
    true
}

/// `t` as a new contiguous f32 tensor, for an f32 CPU tensor of any layout (see [`map_f32`]);
/// a contiguous `t` is returned as it is (its storage shared). candle's own copy
/// (`contiguous`, and `reshape` of a view) runs on one thread: inside the Llama-style model at
/// batch 8 its reshapes took 18–28 ms per run on 1 thread and 17–26 on 2 (BENCHMARKS.md,
/// issue 14). `None` for any other tensor.
pub fn contiguous_f32(t: &Tensor) -> Option<Tensor> {
    if t.dtype() == candle_core::DType::F32 && t.is_contiguous() {
        return Some(t.clone());
    }
    transposed_copy(t).or_else(|| map_f32(t, |v| v))
}

/// `t` as a contiguous tensor: copied on the pool's threads where f32 ([`contiguous_f32`]),
/// by candle otherwise.
pub(crate) fn contiguous(t: &Tensor) -> candle_core::Result<Tensor> {
    match contiguous_f32(t) {
        Some(c) => Ok(c),
        None => t.contiguous(),
    }
}

/// A contiguous copy of an f32 view whose last two merged dims are transposed (the one
/// before the last steps by one value, the last by more), by 16 x 16 tiles
/// ([`super::tile::transpose_into`]) written once into new memory, blocks of 16 output rows
/// in parallel. Read run by run, each output row gathers one value from every source row it
/// crosses, a cache line each: MViTv2-S's reshapes of `[2, 25088, 96]` maps transposed to
/// `[2, 96, 25088]` took 11–14 ms each on 2 threads (BENCHMARKS.md, issue 14). `None` for
/// any other tensor.
fn transposed_copy(t: &Tensor) -> Option<Tensor> {
    use super::tile::{transpose_into, SIDE};
    if t.dtype() != candle_core::DType::F32 || t.elem_count() == 0 {
        return None;
    }
    let out = with_storage::<f32, _>(t, |data, lay| {
        let (dims, strides) = merge(lay.dims(), &[lay.stride()]);
        let st = &strides[0];
        let n = dims.len();
        if n < 2 || st[n - 2] != 1 || st[n - 1] <= 1 || dims[n - 2] < SIDE {
            return None;
        }
        // Output rows `a` (source columns, adjacent) of `b` values (source rows, `s` apart).
        let (rows, cols, s) = (dims[n - 2], dims[n - 1], st[n - 1]);
        let reach = (dims.iter().zip(st.iter())).try_fold(lay.start_offset(), |at, (&d, &s)| {
            at.checked_add((d - 1).checked_mul(s)?)
        })?;
        if reach >= data.len() {
            return None;
        }
        let (outer, outer_st) = (&dims[..n - 2], &st[..n - 2]);
        // Blocks of up to 16 output rows, each inside one matrix `m` of the outer dims.
        let write = |at: usize, o: &mut [MaybeUninit<f32>]| {
            let (first, count) = (at / cols, o.len() / cols);
            let mut done = 0;
            while done < count {
                let (m, a0) = ((first + done) / rows, (first + done) % rows);
                let na = (rows - a0).min(count - done);
                let base = lay.start_offset() + offset(m, outer, outer_st);
                let block = &mut o[done * cols..(done + na) * cols];
                for b0 in (0..cols).step_by(SIDE) {
                    let nb = SIDE.min(cols - b0);
                    transpose_into(data, base + b0 * s + a0, s, nb, na, block, b0, cols);
                }
                done += na;
            }
        };
        // SAFETY: every output row of a chunk (the chunks are whole rows, SIDE of them) lies
        // in one block of its matrix, whose tiles write each of its `cols` values once.
        #[allow(unsafe_code)]
        Some(unsafe { super::fused::written(t.elem_count(), SIDE * cols, write) })
    })??;
    Tensor::from_vec(out, t.dims(), t.device()).ok()
}

/// `f` of each element of `t`, an f32 CPU tensor of any layout, as a new contiguous tensor in
/// one pass: each run along the last merged dim read as one slice where adjacent in memory,
/// runs split across threads when large, every element written once (no zeroing first).
/// `None` for any other tensor, or when a run reads outside the storage.
pub fn map_f32(t: &Tensor, f: impl Fn(f32) -> f32 + Sync) -> Option<Tensor> {
    if t.dtype() != candle_core::DType::F32 {
        return None;
    }
    let total = t.elem_count();
    let out = with_storage::<f32, _>(t, |data, lay| {
        let (dims, strides) = merge(lay.dims(), &[lay.stride()]);
        let last = dims.len() - 1;
        let (inner, s) = (dims[last], strides[0][last]);
        if total == 0 || inner == 0 {
            return Some(Vec::new());
        }
        let start = lay.start_offset();
        // Whole runs per task: about TASK elements, or one run when longer.
        let chunk = if total < 2 * TASK {
            total
        } else {
            (TASK / inner).max(1) * inner
        };
        let failed = AtomicBool::new(false);
        let outer = &dims[..last];
        let task = |at: usize, c: &mut [MaybeUninit<f32>]| {
            let mut walk = RowWalk::at(outer, &strides, &[start], at / inner);
            simd(
                #[inline(always)]
                || {
                    for o in c.chunks_mut(inner) {
                        if !gather(o, data, walk.starts()[0], s, &f) {
                            failed.store(true, Ordering::Relaxed);
                            o.fill(MaybeUninit::new(0.0));
                        }
                        walk.next();
                    }
                },
            )
        };
        // SAFETY: every chunk is whole runs (`chunk` and `total` are multiples of `inner`),
        // and each run's elements are written: mapped, or zeros when the run fails.
        #[allow(unsafe_code)]
        let out = unsafe { super::fused::written(total, chunk, task) };
        (!failed.load(Ordering::Relaxed)).then_some(out)
    })??;
    Tensor::from_vec(out, t.dims(), t.device()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Every output element comes from its run, in serial and parallel tasks, with short
    /// rows (several to a task) and long ones (pieces of one row to a task), each run given
    /// its operands' offsets (here an operand laid out as the output, from offset 3, and a
    /// broadcast one); a run that fails fails the whole buffer.
    #[test]
    fn runs_fill_every_element_once() {
        for dims in [
            vec![143, 7],
            vec![5 * TASK + 3, 100],
            vec![3, 2 * TASK + 1],
            vec![3, 5, 7, 2],
        ] {
            let total: usize = dims.iter().product();
            let mut strides = vec![vec![1; dims.len()], vec![0; dims.len()]];
            for d in (0..dims.len() - 1).rev() {
                strides[0][d] = strides[0][d + 1] * dims[d + 1];
            }
            let index = |_: &mut Vec<f32>, at: &[usize], col: usize, run: &mut [f32]| {
                assert_eq!((at[0] - 3) % dims[dims.len() - 1], col, "{dims:?}");
                assert_eq!(at[1], 5, "a broadcast operand stays put");
                for (j, v) in run.iter_mut().enumerate() {
                    *v = (at[0] + j - 3) as f32;
                }
                true
            };
            let want: Vec<f32> = (0..total).map(|i| i as f32).collect();
            let got = by_runs(total, &dims, &strides, &[3, 5], index);
            assert_eq!(got, Some(want), "{dims:?}");
            let fail_row_1 = |_: &mut Vec<f32>, at: &[usize], _: usize, _: &mut [f32]| {
                at[0] - 3 < dims[dims.len() - 1] || at[0] - 3 >= 2 * dims[dims.len() - 1]
            };
            let failed = by_runs(total, &dims, &strides, &[3, 5], fail_row_1);
            assert!(failed.is_none(), "{dims:?}");
        }
    }

    /// A walk over the rows of several layouts (transposed, broadcast in a middle dim, with
    /// size-1 dims) from any row gives each row's offsets as [`offset`] computes them, and
    /// comes back to row 0 after the last.
    #[test]
    fn row_walks_step_to_each_rows_offsets() {
        let outer = [3, 1, 4, 2];
        let strides = [vec![8, 8, 2, 1], vec![1, 3, 6, 24], vec![4, 0, 0, 1]];
        let bases = [0, 7, 100];
        let rows: usize = outer.iter().product();
        for first in 0..rows {
            let mut walk = RowWalk::at(&outer, &strides, &bases, first);
            for row in (first..rows).chain(0..2) {
                for ((s, base), &got) in strides.iter().zip(bases).zip(walk.starts()) {
                    assert_eq!(got, base + offset(row, &outer, s), "{first} {row} {s:?}");
                }
                walk.next();
            }
        }
        // No outer dims: one row, at the bases.
        let mut walk = RowWalk::at(&[], &strides, &bases, 0);
        walk.next();
        assert_eq!(walk.starts(), bases);
    }

    /// Transposed, narrowed, broadcast and offset views copied exactly as candle's
    /// `contiguous` copies them (and mapped as candle maps them), small (one task) and large
    /// (runs over the pool's threads, long runs and runs of one element; transposes by
    /// tiles, whole and cut at the edges); contiguous and empty tensors, and other dtypes.
    #[test]
    fn contiguous_copies_match_candle() {
        let dev = Device::Cpu;
        let t = |s: &[usize]| Tensor::randn(0f32, 1., s.to_vec(), &dev).unwrap();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .expect("pool");
        for [p, q, r] in [[2, 3, 5], [8, 128, 96], [3, 37, 53], [3, 5, 3 * TASK]] {
            let views = [
                t(&[p, r, q]).transpose(1, 2).unwrap(),
                t(&[p, q, 2 * r]).narrow(2, 5, r).unwrap(),
                t(&[1, q, r]).broadcast_as((p, q, r)).unwrap(),
                t(&[p, q, 1]).broadcast_as((p, q, r)).unwrap(),
                t(&[p + 1, q, r])
                    .narrow(0, 1, p)
                    .unwrap()
                    .permute((2, 0, 1))
                    .unwrap(),
            ];
            for v in &views {
                assert!(!v.is_contiguous());
                let got = pool.install(|| contiguous_f32(v)).expect("applies");
                assert!(got.is_contiguous());
                assert_eq!(got.dims(), v.dims());
                let want = v.contiguous().unwrap().flatten_all().unwrap();
                assert_eq!(
                    got.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                    want.to_vec1::<f32>().unwrap(),
                    "{:?} strides {:?}",
                    v.dims(),
                    v.stride()
                );
                // The same runs with a function applied on the way.
                let got = pool.install(|| map_f32(v, |x| -2.0 * x)).expect("applies");
                let want = v.affine(-2.0, 0.0).unwrap().flatten_all().unwrap();
                assert_eq!(
                    got.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                    want.to_vec1::<f32>().unwrap()
                );
            }
        }
        // A contiguous tensor comes back as it is: the same storage, not a copy.
        let x = t(&[4, 6]);
        let same = contiguous_f32(&x).unwrap();
        let at = |t: &Tensor| super::super::fused::with_f32(t, |s| s.as_ptr()).unwrap();
        assert_eq!(at(&same), at(&x));
        let empty = t(&[3, 4]).narrow(1, 1, 0).unwrap();
        assert_eq!(contiguous_f32(&empty).unwrap().dims(), &[3, 0]);
        let ints = Tensor::arange(0i64, 12, &dev)
            .unwrap()
            .reshape((3, 4))
            .unwrap();
        assert!(contiguous_f32(&ints.t().unwrap()).is_none());
    }

    /// `cat` of every pair of `views` and `x`, along every dim, against candle's.
    fn cat_views_match_candle(x: &Tensor, views: &[Tensor]) {
        for d in 0..3 {
            for a in views {
                for b in views {
                    let parts = [a.clone(), b.clone(), x.clone()];
                    let got = cat::<f32>(&parts, d).expect("applies");
                    let want = Tensor::cat(&parts, d).unwrap();
                    assert_eq!(got.dims(), want.dims());
                    let (g, w) = (
                        got.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                        want.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                    );
                    assert_eq!(g, w, "dim {d}");
                }
            }
        }
    }

    /// Along every dim, of contiguous tensors, transposed views, narrowed views (a rotary
    /// embedding's halves) and broadcast views: exactly candle's `cat`; small, and large
    /// enough for the rows to be copied in parallel.
    #[test]
    fn cat_matches_candle() {
        let dev = Device::Cpu;
        let t = |s: &[usize]| Tensor::randn(0f32, 1., s.to_vec(), &dev).unwrap();
        for [p, q, r] in [[2, 3, 8], [16, 24, 64]] {
            let x = t(&[p, q, r]);
            let views = [
                x.clone(),
                t(&[p, r, q]).transpose(1, 2).unwrap(),
                t(&[p, q, 2 * r]).narrow(2, 5, r).unwrap(),
                t(&[1, q, r]).broadcast_as((p, q, r)).unwrap(),
                t(&[p, q, 1]).broadcast_as((p, q, r)).unwrap(),
            ];
            cat_views_match_candle(&x, &views);
        }
        // Parts of one value per row (a stack along a new last dim): each stepping through
        // its rows by one stride (contiguous, or a transposed view), a broadcast view that
        // does not, and next to a part of two values per row.
        for [p, q] in [[2, 3], [64, 300]] {
            let (a, c) = (t(&[p, q, 1]), t(&[p, q, 1]));
            let b = t(&[p, 1, q]).transpose(1, 2).unwrap();
            let wide = t(&[p, q, 2]);
            let broadcast = t(&[1, q, 1]).broadcast_as((p, q, 1)).unwrap();
            for parts in [
                vec![a.clone(), c.clone()],
                vec![a.clone(), b, c],
                vec![a.clone(), broadcast],
                vec![wide, a],
            ] {
                let got = cat::<f32>(&parts, 2).expect("applies");
                let want = Tensor::cat(&parts, 2).unwrap();
                assert_eq!(got.dims(), want.dims());
                let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                assert_eq!(flat(&got), flat(&want), "{p} x {q}, {} parts", parts.len());
            }
        }
        let x = t(&[2, 3, 8]);
        // An empty part, and integer data.
        let e = Tensor::zeros((2, 0, 8), candle_core::DType::F32, &dev).unwrap();
        let got = cat::<f32>(&[x.clone(), e], 1).unwrap();
        assert_eq!(got.dims(), &[2, 3, 8]);
        let i = Tensor::arange(0i64, 12, &dev)
            .unwrap()
            .reshape((3, 4))
            .unwrap();
        let got = cat::<i64>(&[i.t().unwrap(), i.t().unwrap()], 1).unwrap();
        let want = Tensor::cat(&[i.t().unwrap(), i.t().unwrap()], 1).unwrap();
        assert_eq!(
            got.to_vec2::<i64>().unwrap(),
            want.to_vec2::<i64>().unwrap()
        );
        // Shapes that disagree outside the dim, a dim out of range, and no tensors: declined.
        assert!(cat::<f32>(&[x.clone(), t(&[2, 4, 8])], 2).is_none());
        assert!(cat::<f32>(std::slice::from_ref(&x), 3).is_none());
        assert!(cat::<f32>(&[], 0).is_none());
    }
}
