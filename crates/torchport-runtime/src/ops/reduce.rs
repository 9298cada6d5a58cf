//! Reductions: mean, sum, amax/amin, aminmax, max/min along a dim, cumsum, argmax/argmin,
//! any/all, the vector norm (`linalg_vector_norm`, `norm`, `linalg_norm`).

use candle_core::{DType, Tensor};

use super::{dim, float, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs, Value};

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    r.add("aten.mean.dim", mean);
    r.add("aten.linalg_vector_norm.default", |a| {
        p_norm(a, a.float_or("ord", 2.0)?)
    });
    r.add("aten.linalg_norm.default", linalg_norm);
    // `torch.norm` / `Tensor.norm` with a number or None for `p` (TorchScript's code, and
    // `F.normalize`, call these); `p` None is the 2-norm.
    for n in [
        "aten.norm.Scalar",
        "aten.norm.ScalarOpt_dim",
        "aten.norm.ScalarOpt_dtype",
        "aten.norm.ScalarOpt_dim_dtype",
    ] {
        r.add(n, |a| p_norm(a, a.float_or("p", 2.0)?));
    }
    r.add("aten.mean.default", mean);
    r.add("aten.sum.dim_IntList", sum);
    r.add("aten.sum.default", sum);
    r.add("aten.amax.default", amax);
    r.add("aten.amin.default", amax);
    r.add("aten.max.default", amax);
    r.add("aten.min.default", amax);
    r.add("aten.max.dim", max_dim);
    r.add("aten.min.dim", max_dim);
    r.add("aten.cumsum.default", cumsum);
    r.add("aten.argmax.default", argmax);
    r.add("aten.argmin.default", argmax);
    r.add("aten.aminmax.default", aminmax);
    for n in ["aten.all.default", "aten.all.dim", "aten.all.dims"] {
        r.add(n, |a| truth(a, false));
    }
    for n in ["aten.any.default", "aten.any.dim", "aten.any.dims"] {
        r.add(n, |a| truth(a, true));
    }
    // What `torch._check` of a tensor condition reduces it with (then `item`): `all` / `any`
    // of every element, a 0-d bool.
    r.add("aten._is_all_true.default", |a| truth(a, false));
    r.add("aten._is_any_true.default", |a| truth(a, true));
}

/// Absolute dims from an optional `int[]?` (None or empty means all dims).
pub(super) fn dims_of(a: &Args, name: &str, rank: usize) -> OpResult<Vec<usize>> {
    let mut v = match a.opt_ints(name)? {
        Some(v) if !v.is_empty() => v
            .iter()
            .map(|&d| dim(d, rank))
            .collect::<OpResult<Vec<_>>>()?,
        _ => (0..rank).collect(),
    };
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

/// Reduce `t` over `dims` with `f` (a keepdim reduction over one dim), then drop the reduced
/// dims unless `keep`.
pub(super) fn reduce(
    t: &Tensor,
    dims: &[usize],
    keep: bool,
    f: impl Fn(&Tensor, usize) -> candle_core::Result<Tensor>,
) -> OpResult<Tensor> {
    if t.rank() == 0 {
        // A 0-d tensor reduced over its one implicit dim is itself.
        return Ok(t.clone());
    }
    let mut r = t.clone();
    for &d in dims {
        r = f(&r, d)?;
    }
    if keep {
        return Ok(r);
    }
    Ok(r.reshape(without(t.dims(), dims))?)
}

/// `shape` with the `dims` left out (a reduction's result shape without keepdim).
pub(super) fn without(shape: &[usize], dims: &[usize]) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .filter(|(i, _)| !dims.contains(i))
        .map(|(_, &s)| s)
        .collect()
}

/// `t` cast to f64 first when the op asks for `dtype=torch.float64` (torch reduces in the
/// requested dtype).
fn f64_if_asked(a: &Args, t: Tensor) -> OpResult<Tensor> {
    match a.opt_scalar_type("dtype")? {
        Some(crate::dtype::DOUBLE) => super::as_dtype(&t, DType::F64),
        _ => Ok(t),
    }
}

/// Where `dims` are the trailing dims of `t` (in order, at least one): the values per row
/// they hold and the result's shape, one value per row (the reduced dims kept as 1 with
/// `keep`).
fn trailing_rows(t: &Tensor, dims: &[usize], keep: bool) -> Option<(usize, Vec<usize>)> {
    let r = t.rank();
    if dims.is_empty() || !dims.iter().copied().eq(r - dims.len()..r) {
        return None;
    }
    let n = dims.iter().map(|&d| t.dims()[d]).product();
    let mut out = t.dims()[..r - dims.len()].to_vec();
    if keep {
        out.extend(std::iter::repeat_n(1, dims.len()));
    }
    Some((n, out))
}

fn mean(a: &Args) -> OpResult<Outputs> {
    let t = f64_if_asked(a, float(&a.tensor("self")?)?)?;
    let dims = dims_of(a, "dim", t.rank())?;
    let keep = a.bool_or("keepdim", false)?;
    // Contiguous trailing dims reduce as one flattened axis (one pass, better accuracy).
    if let Some((n, out)) = trailing_rows(&t, &dims, keep) {
        // An f32 tensor's rows, read where they lie over the pool's threads.
        if let Some(m) = super::fused::mean_rows(&t, n, &out) {
            return one(m);
        }
        if dims.len() > 1 {
            let lead = &t.dims()[..t.rank() - dims.len()];
            let mut s = lead.to_vec();
            s.push(n);
            let m = t.reshape(s)?.mean_keepdim(lead.len())?;
            return one(m.reshape(out)?);
        }
    }
    one(reduce(&t, &dims, keep, |x, d| x.mean_keepdim(d))?)
}

fn sum(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let t = if t.dtype() == DType::U8 {
        t.to_dtype(DType::I64)?
    } else {
        t
    };
    let t = f64_if_asked(a, t)?;
    let dims = dims_of(a, "dim", t.rank())?;
    let keep = a.bool_or("keepdim", false)?;
    let r = reduce(&t, &dims, keep, |x, d| x.sum_keepdim(d))?;
    match a.opt_scalar_type("dtype")? {
        Some(st) => one(crate::dtype::cast(&r, st)?),
        None => one(r),
    }
}

/// `amax`/`amin` over the given dims (all by default), and `max`/`min` of every element.
fn amax(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let dims = dims_of(a, "dim", t.rank())?;
    let keep = a.bool_or("keepdim", false)?;
    if t.elem_count() == 0 && dims.iter().any(|&d| t.dims()[d] == 0) {
        op_bail!(
            "{}: a reduction over an empty dim has no identity",
            a.node().target
        );
    }
    if a.node().target.contains("min") {
        one(reduce(&t, &dims, keep, |x, d| x.min_keepdim(d))?)
    } else {
        one(reduce(&t, &dims, keep, |x, d| x.max_keepdim(d))?)
    }
}

fn max_dim(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let d = dim(a.int("dim")?, t.rank())?;
    let keep = a.bool_or("keepdim", false)?;
    let is_min = a.node().target.contains("min");
    if t.rank() == 0 {
        return Ok(vec![Value::Tensor(t), Value::Tensor(zero_index()?)]);
    }
    let (v, i) = if is_min {
        (t.min_keepdim(d)?, t.argmin_keepdim(d)?)
    } else {
        (t.max_keepdim(d)?, t.argmax_keepdim(d)?)
    };
    let i = i.to_dtype(DType::I64)?;
    let (v, i) = if keep {
        (v, i)
    } else {
        (v.squeeze(d)?, i.squeeze(d)?)
    };
    Ok(vec![Value::Tensor(v), Value::Tensor(i)])
}

/// The index of a 0-d tensor's one element.
fn zero_index() -> OpResult<Tensor> {
    Ok(Tensor::new(0i64, &candle_core::Device::Cpu)?)
}

fn argmax(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let keep = a.bool_or("keepdim", false)?;
    if t.rank() == 0 {
        return one(zero_index()?);
    }
    let rank = t.rank();
    let (t, d) = match a.opt_int("dim")? {
        Some(d) => {
            let d = dim(d, t.rank())?;
            (t, d)
        }
        None => (t.flatten_all()?, 0),
    };
    let i = if a.node().target.contains("argmin") {
        t.argmin_keepdim(d)?
    } else {
        t.argmax_keepdim(d)?
    };
    let i = i.to_dtype(DType::I64)?;
    if a.opt_int("dim")?.is_none() {
        // Over everything: 0-d, or with keepdim every dim of size 1.
        return one(if keep {
            i.reshape(vec![1usize; rank])?
        } else {
            i.reshape(())?
        });
    }
    one(if keep { i } else { i.squeeze(d)? })
}

fn cumsum(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let d = dim(a.int("dim")?, t.rank())?;
    let t = match t.dtype() {
        DType::U8 => t.to_dtype(DType::I64)?,
        _ => t,
    };
    let t = f64_if_asked(a, t)?;
    let r = if t.rank() == 0 {
        // The prefix sum of one element is itself.
        t
    } else if super::category(t.dtype()) < 2 {
        // Exact integer prefix sums.
        super::stats::scan_rows(&t.to_dtype(DType::I64)?, d, i64::wrapping_add)?
    } else {
        // Floats accumulate in f64, each sum rounded to the dtype, as torch's CPU kernel
        // does (its accumulator type for float32 is double).
        super::stats::scan_in_f64(&t, d, |s, x| s + x)?
    };
    match a.opt_scalar_type("dtype")? {
        Some(st) => one(crate::dtype::cast(&r, st)?),
        None => one(r),
    }
}

/// `linalg_norm(self, ord=None, dim=None, keepdim=False, dtype=None)` (`torch.linalg.norm`
/// with a number or None for `ord`): a vector norm over one dim (or, `dim` None, over the
/// whole of a 1-d input, or with `ord` None over every element), and the Frobenius norm
/// (`ord` None) over two. The other matrix norms (1, 2, inf, their negatives) are refused.
fn linalg_norm(a: &Args) -> OpResult<Outputs> {
    let rank = a.tensor("self")?.rank();
    let ord = a.opt_float("ord")?;
    let dims = a.opt_ints("dim")?.map(|d| d.len());
    match (ord, dims) {
        (Some(ord), Some(1)) | (Some(ord), None) if dims.is_some() || rank == 1 => p_norm(a, ord),
        (None, Some(1 | 2)) | (None, None) => p_norm(a, 2.0),
        (Some(ord), Some(2)) | (Some(ord), None) if dims.is_some() || rank == 2 => op_bail!(
            "linalg_norm: the matrix {ord}-norm (only the Frobenius norm, ord None, of a matrix)"
        ),
        (_, d) => op_bail!(
            "linalg_norm of a {rank}-d tensor over {} dims with ord {ord:?} (torch takes one or \
             two dims, or with an ord and no dim a 1- or 2-d tensor)",
            d.map_or("all".to_string(), |d| d.to_string())
        ),
    }
}

/// The `ord`-norm of `self` over `dim` (every dim when absent), `keepdim`, as
/// `linalg_vector_norm` and `norm` compute it: `ord` inf / -inf give max / min |x|, 0 the
/// count of non-zeros. With `dtype` (a float type), the input is cast to it first, as torch
/// does, and the result rounded to it.
fn p_norm(a: &Args, ord: f64) -> OpResult<Outputs> {
    let t = float(&a.tensor("self")?)?;
    let dtype = a.opt_scalar_type("dtype")?;
    let t = match dtype {
        Some(st) if crate::dtype::is_float(st) => crate::dtype::cast(&t, st)?,
        Some(st) => op_bail!(
            "a norm in {} (it needs a float dtype)",
            crate::dtype::name(st)
        ),
        None => t,
    };
    let typed = |r: Tensor| match dtype {
        Some(st) => one(crate::dtype::cast(&r, st)?),
        None => one(r),
    };
    let dims = dims_of(a, "dim", t.rank())?;
    let keep = a.bool_or("keepdim", false)?;
    // The 2- and 1-norms over trailing dims of a float32 tensor (Swin V2's cosine attention
    // normalizes rows): each row in one pass, over the pool's threads.
    let rows = trailing_rows(&t, &dims, keep).filter(|_| ord == 2.0 || ord == 1.0);
    if let Some((n, out)) = rows {
        if let Some(r) = super::fused::norm_rows(&t, n, &out, ord == 2.0) {
            return typed(r);
        }
    }
    let abs = t.abs()?;
    let r = if ord == f64::INFINITY {
        reduce(&abs, &dims, keep, |x, d| x.max_keepdim(d))?
    } else if ord == f64::NEG_INFINITY {
        reduce(&abs, &dims, keep, |x, d| x.min_keepdim(d))?
    } else if ord == 0.0 {
        let nonzero = t.ne(0.0)?.to_dtype(t.dtype())?;
        reduce(&nonzero, &dims, keep, |x, d| x.sum_keepdim(d))?
    } else if ord == 2.0 {
        reduce(&abs.sqr()?, &dims, keep, |x, d| x.sum_keepdim(d))?.sqrt()?
    } else if ord == 1.0 {
        reduce(&abs, &dims, keep, |x, d| x.sum_keepdim(d))?
    } else {
        reduce(&abs.powf(ord)?, &dims, keep, |x, d| x.sum_keepdim(d))?.powf(1.0 / ord)?
    };
    typed(r)
}

/// `all` / `any` (`any` true) of `self` over `dim` (one dim for the `.dim` overloads, a list
/// for `.dims`, every dim for `.default`), a bool tensor. Over an empty dim every row is
/// vacuously true for `all` and false for `any`.
fn truth(a: &Args, any: bool) -> OpResult<Outputs> {
    let t = super::elementwise::to_mask(&a.tensor("self")?)?;
    let dims = if super::op_key(&a.node().target).ends_with(".dim") {
        vec![dim(a.int("dim")?, t.rank())?]
    } else {
        dims_of(a, "dim", t.rank())?
    };
    let keep = a.bool_or("keepdim", false)?;
    if t.rank() > 0 && t.elem_count() == 0 {
        // Every row reduced is empty (or there are no rows).
        let shape: Vec<usize> = (0..t.rank())
            .filter(|i| keep || !dims.contains(i))
            .map(|i| if dims.contains(&i) { 1 } else { t.dims()[i] })
            .collect();
        let filled = if any { Tensor::zeros } else { Tensor::ones };
        return one(filled(shape, DType::U8, t.device())?);
    }
    one(reduce(&t, &dims, keep, |x, d| {
        if any {
            x.max_keepdim(d)
        } else {
            x.min_keepdim(d)
        }
    })?)
}

/// `aminmax(self, dim=None, keepdim=False)`: (min, max) over `dim`, or over everything.
fn aminmax(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let keep = a.bool_or("keepdim", false)?;
    let (t, dims) = match a.opt_int("dim")? {
        Some(d) => {
            let d = dim(d, t.rank())?;
            (t, vec![d])
        }
        None if keep => {
            let r = t.rank();
            (t, (0..r).collect())
        }
        None => (t.flatten_all()?, vec![0]),
    };
    if t.elem_count() == 0 {
        op_bail!("aminmax of an empty tensor");
    }
    let lo = reduce(&t, &dims, keep, |x, d| x.min_keepdim(d))?;
    let hi = reduce(&t, &dims, keep, |x, d| x.max_keepdim(d))?;
    Ok(vec![Value::Tensor(lo), Value::Tensor(hi)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// `aten.norm.ScalarOpt_dim_dtype` of `[[3, 4]]` over dim 1, `p` None, with `dtype`.
    fn norm_in(dtype: i64) -> OpResult<Outputs> {
        let x = Tensor::new(&[[3f32, 4.0]], &Device::Cpu).unwrap();
        let args = [
            ("self", serde_json::json!({"as_tensor": {"name": "x"}})),
            ("p", serde_json::json!({"as_none": true})),
            ("dim", serde_json::json!({"as_ints": [1]})),
            ("keepdim", serde_json::json!({"as_bool": false})),
            ("dtype", serde_json::json!({"as_scalar_type": dtype})),
        ];
        super::super::run_node(
            register,
            "aten.norm.ScalarOpt_dim_dtype",
            &args,
            &[("x", x)],
        )
    }

    #[test]
    fn a_norm_needs_a_float_dtype() {
        // `p` None is the 2-norm; a float64 dtype computes in it.
        let Ok(out) = norm_in(crate::dtype::DOUBLE) else {
            panic!("a float64 norm")
        };
        let Value::Tensor(t) = &out[0] else {
            panic!("not a tensor")
        };
        assert_eq!(t.to_vec1::<f64>().unwrap(), [5.0]);
        // torch refuses int64, and so does the kernel.
        match norm_in(crate::dtype::LONG) {
            Err(e) => assert!(e.0.contains("needs a float dtype"), "{}", e.0),
            Ok(_) => panic!("an int64 norm was computed"),
        }
    }

    /// `op` of the float tensor `x` (shape `shape`), with `dim` when given: (shape, values).
    fn truth_of(op: &str, x: &[f32], shape: &[usize], dim: Option<i64>) -> (Vec<usize>, Vec<u8>) {
        let x = Tensor::from_slice(x, shape, &Device::Cpu).unwrap();
        let mut args = vec![("self", serde_json::json!({"as_tensor": {"name": "x"}}))];
        if let Some(d) = dim {
            args.push(("dim", serde_json::json!({"as_int": d})));
        }
        let out = super::super::run_node(register, op, &args, &[("x", x)]).unwrap();
        let Value::Tensor(t) = &out[0] else {
            panic!("not a tensor")
        };
        (
            t.dims().to_vec(),
            t.flatten_all().unwrap().to_vec1::<u8>().unwrap(),
        )
    }

    #[test]
    fn any_and_all_of_empty_tensors_are_false_and_true() {
        assert_eq!(
            truth_of("aten.any.default", &[], &[0, 3], None),
            (vec![], vec![0])
        );
        assert_eq!(
            truth_of("aten.all.default", &[], &[0, 3], None),
            (vec![], vec![1])
        );
        assert_eq!(
            truth_of("aten._is_any_true.default", &[], &[0], None),
            (vec![], vec![0])
        );
        assert_eq!(
            truth_of("aten.any.dim", &[], &[0, 3], Some(0)),
            (vec![3], vec![0; 3])
        );
        assert_eq!(
            truth_of("aten.all.dim", &[], &[0, 3], Some(0)),
            (vec![3], vec![1; 3])
        );
        assert_eq!(
            truth_of("aten.any.dim", &[], &[0, 3], Some(1)),
            (vec![0], vec![])
        );
        let x = [0.0, 2.0, 0.0, 0.0, 1.0, 1.0];
        assert_eq!(
            truth_of("aten.any.dim", &x, &[3, 2], Some(-1)),
            (vec![3], vec![1, 0, 1])
        );
        assert_eq!(
            truth_of("aten.all.dim", &x, &[3, 2], Some(-1)),
            (vec![3], vec![0, 0, 1])
        );
        assert_eq!(
            truth_of("aten.any.default", &x, &[3, 2], None),
            (vec![], vec![1])
        );
        assert_eq!(
            truth_of("aten.all.default", &x, &[3, 2], None),
            (vec![], vec![0])
        );
    }
}
