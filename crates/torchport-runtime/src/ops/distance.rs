//! Pairwise distances: `cdist` / `_cdist_forward` (`[*, P, M]` and `[*, R, M]` → `[*, P,
//! R]`, batch dims broadcast) for any p ≥ 0 (0: count of differing coordinates, inf: the
//! largest difference). For p = 2 ATen's choice of algorithm is followed: the matrix-product
//! form `sqrt(max(|a|² + |b|² - 2 a·b, 0))` when compute_mode asks for it or (by default)
//! when P or R exceeds 25, the direct sum otherwise.

use candle_core::{DType, Device, Tensor, D};

use super::{result_numel, Real, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs};

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    r.add("aten.cdist.default", cdist);
    r.add("aten._cdist_forward.default", cdist);
}

fn cdist(a: &Args) -> OpResult<Outputs> {
    let x1 = a.tensor("x1")?;
    let x2 = a.tensor("x2")?;
    let p = a.float_or("p", 2.0)?;
    let mode = a.opt_int("compute_mode")?.unwrap_or(0);
    if p.is_nan() || p < 0.0 {
        op_bail!("cdist only supports non-negative p values, got {p}");
    }
    if !(0..=2).contains(&mode) {
        op_bail!("cdist compute_mode {mode} is not supported");
    }
    if x1.rank() < 2 || x2.rank() < 2 || x1.dims()[x1.rank() - 1] != x2.dims()[x2.rank() - 1] {
        op_bail!(
            "cdist expects [*, P, M] and [*, R, M] tensors, got {:?} and {:?}",
            x1.dims(),
            x2.dims()
        );
    }
    if x1.dtype() != x2.dtype() || !matches!(x1.dtype(), DType::F32 | DType::F64) {
        op_bail!(
            "cdist expects float tensors of one dtype, got {:?} and {:?}",
            x1.dtype(),
            x2.dtype()
        );
    }
    let (r1, r2) = (x1.rank(), x2.rank());
    let (pr, m) = (x1.dims()[r1 - 2], x1.dims()[r1 - 1]);
    let rr = x2.dims()[r2 - 2];
    let batch = candle_core::Shape::from(&x1.dims()[..r1 - 2])
        .broadcast_shape_binary_op(&candle_core::Shape::from(&x2.dims()[..r2 - 2]), "cdist")?;
    let mut shape = batch.dims().to_vec();
    let nb = batch.elem_count();
    shape.extend([pr, rr]);
    result_numel(&shape, "cdist")?;
    let expand = |x: &Tensor, rows: usize| -> OpResult<Tensor> {
        let mut s = batch.dims().to_vec();
        s.extend([rows, m]);
        Ok(x.broadcast_as(s)?.contiguous()?.reshape((nb, rows, m))?)
    };
    let (x1, x2) = (expand(&x1, pr)?, expand(&x2, rr)?);
    let y = if p == 2.0 && (mode == 1 || (mode == 0 && (pr > 25 || rr > 25))) && m > 0 {
        euclidean_mm(&x1, &x2)?
    } else if x1.dtype() == DType::F64 {
        direct::<f64>(&x1, &x2, p)?
    } else {
        direct::<f32>(&x1, &x2, p)?
    };
    one(y.reshape(shape)?)
}

/// ATen's `_euclidean_dist`: `[-2a, |a|², 1] · [b, 1, |b|²]ᵀ`, clamped at 0, square root.
fn euclidean_mm(x1: &Tensor, x2: &Tensor) -> OpResult<Tensor> {
    let n1 = x1.sqr()?.sum_keepdim(D::Minus1)?;
    let n2 = x2.sqr()?.sum_keepdim(D::Minus1)?;
    let a = Tensor::cat(&[&x1.affine(-2.0, 0.0)?, &n1, &n1.ones_like()?], D::Minus1)?;
    let b = Tensor::cat(&[x2, &n2.ones_like()?, &n2], D::Minus1)?;
    let r = a.matmul(&b.t()?.contiguous()?)?;
    Ok(r.relu()?.sqrt()?)
}

/// The direct p-norm of every pair of rows, `[B, P, M]` × `[B, R, M]` → `[B, P, R]`.
fn direct<T: Real>(x1: &Tensor, x2: &Tensor, p: f64) -> OpResult<Tensor> {
    let (nb, pr, m) = x1.dims3()?;
    let rr = x2.dims()[1];
    let a = x1.flatten_all()?.to_vec1::<T>()?;
    let b = x2.flatten_all()?.to_vec1::<T>()?;
    let pt = T::from_f64(p);
    let mut out = Vec::with_capacity(nb * pr * rr);
    for k in 0..nb {
        for i in 0..pr {
            let u = &a[(k * pr + i) * m..][..m];
            for j in 0..rr {
                let v = &b[(k * rr + j) * m..][..m];
                let diffs = u.iter().zip(v).map(|(&x, &y)| (x - y).abs());
                let d = if p == 0.0 {
                    diffs.fold(T::zero(), |s, d| {
                        s + if d == T::zero() { T::zero() } else { T::one() }
                    })
                } else if p == 1.0 {
                    diffs.fold(T::zero(), |s, d| s + d)
                } else if p == 2.0 {
                    diffs.fold(T::zero(), |s, d| s + d * d).sqrt()
                } else if p.is_infinite() {
                    diffs.fold(T::zero(), |s, d| if d > s || d.is_nan() { d } else { s })
                } else {
                    diffs
                        .fold(T::zero(), |s, d| s + d.powf(pt))
                        .powf(T::one() / pt)
                };
                out.push(d);
            }
        }
    }
    Ok(Tensor::from_vec(out, (nb, pr, rr), &Device::Cpu)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A negative p, and mismatched row lengths, are errors.
    #[test]
    fn bad_arguments_are_refused() {
        let a = Tensor::zeros((3, 2), DType::F32, &Device::Cpu).unwrap();
        let b = Tensor::zeros((4, 5), DType::F32, &Device::Cpu).unwrap();
        let run = |p: f64| {
            super::super::run_node(
                register,
                "aten.cdist.default",
                &[
                    ("x1", json!({"as_tensor": {"name": "a"}})),
                    ("x2", json!({"as_tensor": {"name": "b"}})),
                    ("p", json!({ "as_float": p })),
                ],
                &[("a", a.clone()), ("b", b.clone())],
            )
            .unwrap_err()
        };
        assert!(run(-1.0).0.contains("non-negative p"), "{}", run(-1.0).0);
        assert!(
            run(2.0).0.contains("[*, P, M] and [*, R, M]"),
            "{}",
            run(2.0).0
        );
    }
}
