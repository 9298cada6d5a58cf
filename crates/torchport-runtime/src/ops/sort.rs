//! Ordering along a dim: `topk`, `sort`, `argsort`, `kthvalue`, `median`; and the distinct
//! values of a tensor (`_unique2`). NaN orders above every number, as in torch; equal values
//! keep their original order (torch's CPU kernels are stable for these sizes).

use std::cmp::Ordering;

use candle_core::{DType, Tensor};

use super::{dim, usize_of, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{Args, Outputs, Value};

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    r.add("aten.topk.default", topk);
    r.add("aten.sort.default", sort);
    r.add("aten.sort.stable", sort);
    r.add("aten.argsort.default", sort);
    r.add("aten.argsort.stable", sort);
    r.add("aten.kthvalue.default", |a| {
        let k = a.int("k")?;
        order_stat(a, a.int_or("dim", -1)?, |_| usize::try_from(k - 1).ok())
    });
    r.add("aten.median.dim", |a| {
        order_stat(a, a.int("dim")?, median_of)
    });
    r.add("aten._unique2.default", unique);
    r.add("aten.median.default", |a| {
        let t = a.tensor("self")?.flatten_all()?;
        let (v, _) = order_stat_of(&t, 0, median_of)?;
        Ok(vec![Value::Tensor(v.reshape(())?)])
    });
}

/// `_unique2(self, sorted, return_inverse, return_counts)`: the distinct values of `self`,
/// ascending (also where `sorted` is false: torch leaves that order unspecified), then for
/// each element the index of its value among them (`self`'s shape) and each value's count;
/// those two are empty unless asked for, as torch returns them. NaNs are distinct values,
/// as torch's are.
fn unique(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let inverse = a.bool_or("return_inverse", false)?;
    let counts = a.bool_or("return_counts", false)?;
    let flat = t.flatten_all()?;
    // Integers compared as integers, floats as float64 (both exact).
    let (first, of, count) = match t.dtype() {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => {
            distinct(&flat.to_dtype(DType::F64)?.to_vec1::<f64>()?)
        }
        _ => distinct(&flat.to_dtype(DType::I64)?.to_vec1::<i64>()?),
    };
    let m = first.len();
    let values = flat.index_select(&Tensor::from_vec(first, m, flat.device())?, 0)?;
    let empty = || Tensor::zeros(0, DType::I64, flat.device());
    let inv = match inverse {
        true => Tensor::from_vec(of, t.dims(), flat.device())?,
        false => empty()?,
    };
    let cnt = match counts {
        true => Tensor::from_vec(count, m, flat.device())?,
        false => empty()?,
    };
    Ok(vec![
        Value::Tensor(values),
        Value::Tensor(inv),
        Value::Tensor(cnt),
    ])
}

/// The distinct values of `v` in ascending order ([`nan_last`]; a NaN equals no value, so
/// each is its own): the position of each one's first element, each element's value's index
/// among them, and each value's count.
fn distinct<T: PartialOrd>(v: &[T]) -> (Vec<i64>, Vec<i64>, Vec<i64>) {
    let mut order: Vec<usize> = (0..v.len()).collect();
    order.sort_by(|&i, &j| nan_last(&v[i], &v[j]));
    let (mut first, mut of, mut count) = (Vec::new(), vec![0i64; v.len()], Vec::new());
    for (at, &i) in order.iter().enumerate() {
        if at == 0 || v[i] != v[order[at - 1]] {
            first.push(i as i64);
            count.push(0);
        }
        of[i] = first.len() as i64 - 1;
        if let Some(c) = count.last_mut() {
            *c += 1;
        }
    }
    (first, of, count)
}

/// The lower median's position in a sorted row, or its first NaN's (torch's median
/// propagates NaN).
fn median_of(row: &[f64]) -> Option<usize> {
    let first_nan = row.iter().position(|v| v.is_nan());
    Some(first_nan.unwrap_or(row.len().checked_sub(1)? / 2))
}

/// `(values, indices)` of the element at position `pos(sorted row)` of each row along `dim`
/// in ascending order (NaN last), the dim dropped unless `keepdim`.
fn order_stat(a: &Args, d: i64, pos: impl Fn(&[f64]) -> Option<usize>) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let d = dim(d, t.rank())?;
    let (v, i) = order_stat_of(&t, d, pos)?;
    let keep = a.bool_or("keepdim", false)? || t.rank() == 0;
    let (v, i) = if keep {
        (v, i)
    } else {
        (v.squeeze(d)?, i.squeeze(d)?)
    };
    Ok(vec![Value::Tensor(v), Value::Tensor(i)])
}

/// [`order_stat`] on a tensor, keeping the dim (size 1).
fn order_stat_of(
    t: &Tensor,
    d: usize,
    pos: impl Fn(&[f64]) -> Option<usize>,
) -> OpResult<(Tensor, Tensor)> {
    let rank = t.rank();
    let n = if rank == 0 { 1 } else { t.dims()[d] };
    let (v, i) = ordered(t, d, n, false)?;
    let (v, i) = if rank == 0 {
        (v.reshape(1)?, i.reshape(1)?)
    } else {
        (v, i)
    };
    let last = v.rank() - 1;
    let moved = v.transpose(d, last)?.contiguous()?;
    let vals = moved
        .to_dtype(DType::F64)?
        .flatten_all()?
        .to_vec1::<f64>()?;
    let mut picks = Vec::with_capacity(vals.len() / n.max(1));
    for row in vals.chunks(n.max(1)) {
        match pos(row) {
            Some(p) if p < row.len() => picks.push(p as i64),
            _ => op_bail!("the position asked for is out of range for a dim of size {n}"),
        }
    }
    let mut shape = moved.dims().to_vec();
    shape[last] = 1;
    let idx = Tensor::from_vec(picks, shape, &candle_core::Device::Cpu)?
        .transpose(d, last)?
        .contiguous()?;
    let (v, i) = (
        v.contiguous()?.gather(&idx, d)?,
        i.contiguous()?.gather(&idx, d)?,
    );
    if rank == 0 {
        return Ok((v.reshape(())?, i.reshape(())?));
    }
    Ok((v, i))
}

/// Total order with NaN greatest (for integers, their own order).
pub(super) fn nan_last<T: PartialOrd>(a: &T, b: &T) -> Ordering {
    #[allow(clippy::eq_op)]
    let nan = |x: &T| x != x;
    match (nan(a), nan(b)) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => a.partial_cmp(b).unwrap_or(Ordering::Equal),
    }
}

/// The first `k` of each row of `v` (`rows` rows of `n`) in sorted order, stable
/// (descending when `desc`): their values, and their positions appended to `idx_out`.
fn top_rows<T: candle_core::WithDType>(
    v: &[T],
    (rows, n, k): (usize, usize, usize),
    desc: bool,
    idx_out: &mut Vec<i64>,
) -> OpResult<Tensor> {
    let mut out = Vec::with_capacity(rows * k);
    for row in v.chunks(n.max(1)).take(rows) {
        let mut p: Vec<usize> = (0..n).collect();
        p.sort_by(|&i, &j| {
            let o = nan_last(&row[i], &row[j]);
            if desc {
                o.reverse()
            } else {
                o
            }
        });
        for &i in p.iter().take(k) {
            out.push(row[i]);
            idx_out.push(i as i64);
        }
    }
    Ok(Tensor::from_vec(out, (rows, k), &candle_core::Device::Cpu)?)
}

/// Per row of `t` along `d`, the first `k` positions in sorted order (descending when
/// `desc`); returns (values, indices) shaped like `t` with `d` of size `k`.
fn ordered(t: &Tensor, d: usize, k: usize, desc: bool) -> OpResult<(Tensor, Tensor)> {
    let rank = t.rank();
    // Work on [rows, n] with the dim last.
    let moved = if rank == 0 {
        t.reshape((1, 1))?
    } else {
        let tt = t.transpose(d, rank - 1)?.contiguous()?;
        let n = tt.dims()[rank - 1];
        let rows = tt.elem_count().checked_div(n).unwrap_or(0);
        tt.reshape((rows, n))?
    };
    let (rows, n) = moved.dims2()?;
    if k > n {
        op_bail!("k ({k}) is larger than the dim's size ({n})");
    }
    let mut idx_out: Vec<i64> = Vec::with_capacity(rows * k);
    let shape = (rows, n, k);
    let flat = moved.flatten_all()?;
    let values = match moved.dtype() {
        DType::F32 => top_rows(&flat.to_vec1::<f32>()?, shape, desc, &mut idx_out)?,
        DType::F64 => top_rows(&flat.to_vec1::<f64>()?, shape, desc, &mut idx_out)?,
        dt => {
            let v = flat.to_dtype(DType::I64)?.to_vec1::<i64>()?;
            top_rows(&v, shape, desc, &mut idx_out)?.to_dtype(dt)?
        }
    };
    let indices = Tensor::from_vec(idx_out, (rows, k), &candle_core::Device::Cpu)?;
    let back = |x: Tensor| -> OpResult<Tensor> {
        if rank == 0 {
            return Ok(x.reshape(())?);
        }
        let mut s = t.dims().to_vec();
        s.swap(d, rank - 1);
        s[rank - 1] = k;
        Ok(x.reshape(s)?.transpose(d, rank - 1)?.contiguous()?)
    };
    Ok((back(values)?, back(indices)?))
}

fn topk(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let d = dim(a.int_or("dim", -1)?, t.rank())?;
    let k = usize_of(a.int("k")?, "k")?;
    let largest = a.bool_or("largest", true)?;
    let (v, i) = ordered(&t, d, k, largest)?;
    Ok(vec![Value::Tensor(v), Value::Tensor(i)])
}

fn sort(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let d = dim(a.int_or("dim", -1)?, t.rank())?;
    let desc = a.bool_or("descending", false)?;
    let n = if t.rank() == 0 { 1 } else { t.dims()[d] };
    let (v, i) = ordered(&t, d, n, desc)?;
    if a.node().target.contains("argsort") {
        return Ok(vec![Value::Tensor(i)]);
    }
    Ok(vec![Value::Tensor(v), Value::Tensor(i)])
}
