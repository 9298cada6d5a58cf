//! Data-dependent selection: `masked_select` (a 1-d result as long as the mask's count) and
//! its inverse `masked_scatter`,
//! `nonzero` and one-argument `where` (the indices of the true elements), and
//! the bucket searches `bucketize` and `searchsorted` (over one sorted sequence, or one per
//! row).

use candle_core::{DType, Tensor};

use super::elementwise::{broadcast2, to_mask};
use super::{promote_tensors, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs, TensorOrScalar};

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    r.add("aten.masked_select.default", masked_select);
    r.add("aten.masked_scatter.default", masked_scatter);
    r.add("aten.nonzero.default", |a| {
        let (rows, rank, idx) = nonzero(&a.tensor("self")?)?;
        one(Tensor::from_vec(
            idx,
            (rows, rank),
            &candle_core::Device::Cpu,
        )?)
    });
    // `where(condition)` (exported as `nonzero_numpy`): nonzero's columns, one 1-d tensor a
    // dim.
    r.add("aten.where.default", nonzero_columns);
    r.add("aten.nonzero_numpy.default", nonzero_columns);
    r.add("aten.bucketize.Tensor", |a| {
        let right = a.bool_or("right", false)?;
        buckets(a, &a.tensor("boundaries")?, "self", right)
    });
    r.add("aten.searchsorted.Tensor", |a| {
        let mut seq = a.tensor("sorted_sequence")?;
        if let Some(sorter) = a.opt_tensor("sorter")? {
            if sorter.dims() != seq.dims() || seq.rank() == 0 {
                op_bail!(
                    "searchsorted: sorter of shape {:?} for a sequence of shape {:?}",
                    sorter.dims(),
                    seq.dims()
                );
            }
            let m = seq.dims()[seq.rank() - 1] as i64;
            let s = sorter.to_dtype(DType::I64)?;
            if s.flatten_all()?
                .to_vec1::<i64>()?
                .iter()
                .any(|&i| i < 0 || i >= m)
            {
                op_bail!("searchsorted: sorter index out of range for a dim of size {m}");
            }
            seq = seq.contiguous()?.gather(&s.contiguous()?, seq.rank() - 1)?;
        }
        let right = a.bool_or("right", false)? || a.str_or("side", "left")? == "right";
        buckets(a, &seq, "self", right)
    });
}

/// The elements of `self` where the (broadcast) mask is true, in order, as a 1-d tensor.
fn masked_select(a: &Args) -> OpResult<Outputs> {
    let (t, m) = broadcast2(&a.tensor("self")?, &to_mask(&a.tensor("mask")?)?)?;
    let keep: Vec<u8> = m.flatten_all()?.to_vec1::<u8>()?;
    let idx: Vec<i64> = (0..keep.len() as i64)
        .filter(|&i| keep[i as usize] != 0)
        .collect();
    let n = idx.len();
    let idx = Tensor::from_vec(idx, n, &candle_core::Device::Cpu)?;
    one(t.flatten_all()?.index_select(&idx, 0)?)
}

/// `masked_scatter(self, mask, source)`: `self` (broadcast with the mask) with the positions
/// where the mask is true filled, in row-major order, by `source`'s first elements (any
/// shape, at least as many elements as the mask's count; cast to `self`'s dtype).
fn masked_scatter(a: &Args) -> OpResult<Outputs> {
    let (t, m) = broadcast2(&a.tensor("self")?, &to_mask(&a.tensor("mask")?)?)?;
    let source = a.tensor("source")?;
    let keep: Vec<u8> = m.flatten_all()?.to_vec1::<u8>()?;
    // Each true position's rank among the true ones: the source element it takes (the
    // false ones read element 0, which `where` then drops).
    let mut taken = 0i64;
    let idx: Vec<i64> = keep
        .iter()
        .map(|&k| {
            if k == 0 {
                return 0;
            }
            taken += 1;
            taken - 1
        })
        .collect();
    if taken == 0 {
        return one(t.contiguous()?);
    }
    if taken as usize > source.elem_count() {
        op_bail!(
            "masked_scatter: the mask selects {taken} elements, the source has {}",
            source.elem_count()
        );
    }
    let n = idx.len();
    let idx = Tensor::from_vec(idx, n, &candle_core::Device::Cpu)?;
    let picked = source
        .to_dtype(t.dtype())?
        .flatten_all()?
        .index_select(&idx, 0)?
        .reshape(t.shape())?;
    one(m.where_cond(&picked, &t)?)
}

/// `where(condition)`: the indices of the nonzero elements, a 1-d int64 tensor for each dim
/// (a 0-d condition counts as 1-d, as in torch).
fn nonzero_columns(a: &Args) -> OpResult<Outputs> {
    let name = if a.has("condition") {
        "condition"
    } else {
        "self"
    };
    let t = a.tensor(name)?;
    let t = if t.rank() == 0 { t.reshape(1)? } else { t };
    let (rows, rank, idx) = nonzero(&t)?;
    let cols = (0..rank)
        .map(|d| {
            let col: Vec<i64> = (0..rows).map(|r| idx[r * rank + d]).collect();
            Ok(Tensor::from_vec(col, rows, &candle_core::Device::Cpu)?)
        })
        .collect::<OpResult<Vec<_>>>()?;
    Ok(vec![crate::value::Value::Tensors(cols)])
}

/// The indices of `t`'s nonzero elements in row-major order: their count, the rank, and the
/// indices (`count * rank`, each row one element's index).
fn nonzero(t: &Tensor) -> OpResult<(usize, usize, Vec<i64>)> {
    let mask = to_mask(t)?.flatten_all()?.to_vec1::<u8>()?;
    let dims = t.dims();
    let (mut idx, mut rows) = (Vec::new(), 0);
    for (flat, _) in mask.iter().enumerate().filter(|(_, &m)| m != 0) {
        rows += 1;
        let mut rest = flat;
        let at = idx.len();
        idx.resize(at + dims.len(), 0);
        for (d, &size) in dims.iter().enumerate().rev() {
            idx[at + d] = (rest % size) as i64;
            rest /= size;
        }
    }
    Ok((rows, dims.len(), idx))
}

/// For each value of the argument `values`, the number of elements of its row of the sorted
/// `boundaries` below it (`right`: at or below it): the insertion point that keeps the row
/// sorted. A 1-d `boundaries` serves every value; otherwise its leading dims match the
/// values' and each row of values searches its own row. NaN sorts above every number, as in
/// torch. int64 results (int32 when `out_int32`, held as i64).
fn buckets(a: &Args, boundaries: &Tensor, values: &str, right: bool) -> OpResult<Outputs> {
    let v = match a.tensor_or_scalar(values)? {
        TensorOrScalar::Tensor(t) => t,
        TensorOrScalar::Scalar(s) => super::scalar_tensor(s, s.dtype())?,
    };
    let br = boundaries.rank();
    if br == 0 {
        op_bail!("the sorted sequence must have at least one dim");
    }
    let m = boundaries.dims()[br - 1];
    let (rows, per_row) = if br == 1 {
        (1, v.elem_count())
    } else if v.rank() == br && v.dims()[..br - 1] == boundaries.dims()[..br - 1] {
        let k = v.dims()[br - 1];
        (v.elem_count().checked_div(k).unwrap_or(0), k)
    } else {
        op_bail!(
            "sorted sequence of shape {:?} and values of shape {:?}: leading dims differ",
            boundaries.dims(),
            v.dims()
        );
    };
    let d = promote_tensors(&v, boundaries);
    let mut out = Vec::with_capacity(v.elem_count());
    if d == DType::I64 {
        // Integers compare exactly as i64 (f64 would merge values above 2^53).
        let ints = |t: &Tensor| -> OpResult<Vec<i64>> {
            Ok(t.to_dtype(DType::I64)?.flatten_all()?.to_vec1::<i64>()?)
        };
        let (b, x) = (ints(boundaries)?, ints(&v)?);
        for r in 0..rows {
            let row = &b[r * m..(r + 1) * m];
            for x in &x[r * per_row..(r + 1) * per_row] {
                out.push(row.partition_point(|b| if right { b <= x } else { b < x }) as i64);
            }
        }
    } else {
        let exact = |t: &Tensor| -> OpResult<Vec<f64>> {
            Ok(super::as_dtype(t, DType::F64)?
                .flatten_all()?
                .to_vec1::<f64>()?)
        };
        let (b, x) = (exact(boundaries)?, exact(&v)?);
        let below = |b: f64, x: f64| -> bool {
            match (b.is_nan(), x.is_nan()) {
                (true, _) => false,
                (false, true) => true,
                _ if right => b <= x,
                _ => b < x,
            }
        };
        for r in 0..rows {
            let row = &b[r * m..(r + 1) * m];
            for &x in &x[r * per_row..(r + 1) * per_row] {
                out.push(row.partition_point(|&b| below(b, x)) as i64);
            }
        }
    }
    finish(a, out, v.dims())
}

fn finish(a: &Args, r: Vec<i64>, dims: &[usize]) -> OpResult<Outputs> {
    let t = Tensor::from_vec(r, dims, &candle_core::Device::Cpu)?;
    if a.bool_or("out_int32", false)? {
        // int32 is held as i64 in the runtime, exact for these small counts.
        return one(crate::dtype::cast(&t, crate::dtype::INT)?);
    }
    one(t)
}
