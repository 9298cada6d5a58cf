//! Ordering along a dim: `topk`, `sort`, `argsort`. NaN orders above every number, as in
//! torch; equal values keep their original order (torch's CPU kernels are stable for these
//! sizes).

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
}

/// Total order with NaN greatest (for integers, their own order).
fn nan_last<T: PartialOrd>(a: &T, b: &T) -> Ordering {
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
