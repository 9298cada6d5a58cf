//! Kernels that read their operands through any strides, one run along the last dim at a
//! time: an elementwise binary op with torch broadcasting (operands that are views, such as
//! the transposed heads a rotary embedding multiplies, or that broadcast in the middle dims)
//! and `cat` along any dim. A run whose elements are adjacent in memory is read as one
//! slice, so its loop vectorises; candle's general forms index every element.

use candle_core::{Layout, Shape, Tensor, WithDType};
use rayon::prelude::*;
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
            let inner = dims[last];
            let (sa, sb) = (st[0][last], st[1][last]);
            // Row `row` of the output starts at these offsets of the operands.
            let starts = |row: usize| {
                (
                    al.start_offset() + offset(row, &dims[..last], &st[0][..last]),
                    bl.start_offset() + offset(row, &dims[..last], &st[1][..last]),
                )
            };
            by_runs(
                total,
                inner,
                #[inline(always)]
                |_, row, col, run| {
                    let (oa, ob) = starts(row);
                    binary_run(run, (ad, oa + col * sa, sa), (bd, ob + col * sb, sb), &f)
                },
            )
        })
    })???;
    Tensor::from_vec(out, shape, a.device()).ok()
}

/// A new row-major buffer of `total` elements in rows of `inner`, computed one run at a time:
/// `f(scratch, row, col, run)` writes `run` with output elements `col..col + run.len()` of row
/// `row` (a run never crosses a row's end; `run` and `scratch` are the thread's own buffers
/// from [`with_scratch`], holding whatever their last user left there), which are then
/// copied into the output, so each output element is written once, with no zeroing first.
/// Tasks of whole rows, or of pieces of one row when rows are long, in parallel from
/// `2 * TASK` elements; each task's loop is compiled for the CPU's vector width (see
/// [`simd`]: mark `f` `#[inline(always)]`). `None` when any `f` returns false.
pub(crate) fn by_runs(
    total: usize,
    inner: usize,
    f: impl Fn(&mut Vec<f32>, usize, usize, &mut [f32]) -> bool + Sync,
) -> Option<Vec<f32>> {
    if total == 0 || inner == 0 {
        return Some(vec![0.0; total]);
    }
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
                        let mut done = 0;
                        while done < o.len() {
                            let at = start + done;
                            let (row, col) = (at / inner, at % inner);
                            let len = (inner - col).min(o.len() - done);
                            let r = &mut run[..len];
                            if !f(scratch, row, col, r) {
                                return false;
                            }
                            super::fused::put(&mut o[done..done + len], r);
                            done += len;
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

/// `cat` of tensors of one dtype `T` along dim `d`, any layouts: per input, each run of its
/// part of an output row is copied as a slice where adjacent in memory. `None` when a
/// tensor is not a CPU tensor of `T`, the shapes disagree outside `d`, or the list is empty.
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
    let outer: usize = dims[..d].iter().product();
    let inner: usize = dims[d + 1..].iter().product();
    let row = dims[d] * inner;
    let total = outer * row;
    let mut out = vec![T::zero(); total];
    let mut at = 0;
    for t in ts {
        let part = t.dims()[d] * inner;
        if part > 0 && outer > 0 {
            let ok = with_storage::<T, _>(t, |data, lay| {
                copy_part(&mut out, (row, at, part), d, data, lay)
            })?;
            if !ok {
                return None;
            }
        }
        at += part;
    }
    Tensor::from_vec(out, dims, first.device()).ok()
}

/// Write the elements of the tensor viewed by `lay` over `data`, whose dims before `d` are
/// the output's outer dims, into `out[r * row + at..][..part]` for each outer index `r`.
fn copy_part<T: WithDType>(
    out: &mut [T],
    (row, at, part): (usize, usize, usize),
    d: usize,
    data: &[T],
    lay: &Layout,
) -> bool {
    let (dims, strides) = (lay.dims(), lay.stride());
    // The part's own dims merged into runs; the outer dims indexed as they are.
    let (pd, ps) = merge(&dims[d..], &[&strides[d..]]);
    let last = pd.len() - 1;
    let (inner, s) = (pd[last], ps[0][last]);
    let start = lay.start_offset();
    let fill = |(r, orow): (usize, &mut [T])| {
        let base = start + offset(r, &dims[..d], &strides[..d]);
        orow[at..at + part]
            .chunks_mut(inner)
            .enumerate()
            .all(|(k, o)| copy_run(o, data, base + offset(k, &pd[..last], &ps[0][..last]), s))
    };
    // Rows in parallel once the output is large enough to pay for the split.
    if out.len() >= PARALLEL_MIN_ELEMENTS {
        out.par_chunks_mut(row).enumerate().all(fill)
    } else {
        out.chunks_mut(row).enumerate().all(fill)
    }
}

/// Output elements from which `cat` copies its rows in parallel.
const PARALLEL_MIN_ELEMENTS: usize = 1 << 16;

/// `o[j] = data[off + j * s]` (one slice copy when `s` is 1); false when a read falls outside
/// `data`.
fn copy_run<T: WithDType>(o: &mut [T], data: &[T], off: usize, s: usize) -> bool {
    if s == 1 {
        let Some(src) = data.get(off..off + o.len()) else {
            return false;
        };
        o.copy_from_slice(src);
        return true;
    }
    for (j, o) in o.iter_mut().enumerate() {
        let Some(&v) = data.get(off + j * s) else {
            return false;
        };
        *o = v;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Every output element comes from its run, in serial and parallel tasks, with short
    /// rows (several to a task) and long ones (pieces of one row to a task); a run that fails
    /// fails the whole buffer.
    #[test]
    fn runs_fill_every_element_once() {
        for (total, inner) in [(1000, 7), (5 * TASK + 3, 100), (3 * TASK, 2 * TASK + 1)] {
            let index = |_: &mut Vec<f32>, row: usize, col: usize, run: &mut [f32]| {
                for (j, v) in run.iter_mut().enumerate() {
                    *v = (row * inner + col + j) as f32;
                }
                true
            };
            let want: Vec<f32> = (0..total).map(|i| i as f32).collect();
            assert_eq!(
                by_runs(total, inner, index),
                Some(want),
                "{total} / {inner}"
            );
            let fail_row_1 = |_: &mut Vec<f32>, row: usize, _: usize, _: &mut [f32]| row != 1;
            assert!(
                by_runs(total, inner, fail_row_1).is_none(),
                "{total} / {inner}"
            );
        }
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
            ];
            cat_views_match_candle(&x, &views);
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
