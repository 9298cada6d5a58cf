//! Matrix products: linear, addmm, mm, bmm, matmul (with torch's 1-d and broadcasting rules),
//! baddbmm.

use candle_core::Tensor;

use super::{float, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs};

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    r.add("aten.linear.default", linear);
    r.add("aten.addmm.default", addmm);
    r.add("aten.mm.default", |a| {
        one(mm(&a.tensor("self")?, &a.tensor("mat2")?)?)
    });
    r.add("aten.bmm.default", |a| {
        one(mm(&a.tensor("self")?, &a.tensor("mat2")?)?)
    });
    r.add("aten.matmul.default", |a| {
        one(matmul(&a.tensor("self")?, &a.tensor("other")?)?)
    });
    r.add("aten.baddbmm.default", addmm);
}

/// `a @ b` for operands of rank >= 2 with broadcast batch dims (floats).
pub fn mm(a: &Tensor, b: &Tensor) -> OpResult<Tensor> {
    let (a, b) = (float(a)?, float(b)?);
    if a.rank() < 2 || b.rank() < 2 {
        op_bail!("matrix product of shapes {:?} and {:?}", a.dims(), b.dims());
    }
    let prod = |a: &Tensor, b: &Tensor| {
        if a.rank() == 2 && b.rank() == 2 {
            a.matmul(b)
        } else {
            a.broadcast_matmul(b)
        }
    };
    match prod(&a, &b) {
        Ok(r) => Ok(r),
        // candle's gemm takes only some stridings (e.g. not a transposed batch of heads):
        // retry on contiguous copies; a real shape error repeats and is reported.
        Err(_) => Ok(prod(&a.contiguous()?, &b.contiguous()?)?),
    }
}

/// `torch.matmul` semantics, including 1-d operands.
pub fn matmul(a: &Tensor, b: &Tensor) -> OpResult<Tensor> {
    match (a.rank(), b.rank()) {
        (1, 1) => Ok(mm(&a.unsqueeze(0)?, &b.unsqueeze(1)?)?.reshape(())?),
        (1, _) => {
            let r = mm(&a.unsqueeze(0)?, b)?;
            Ok(r.squeeze(r.rank() - 2)?)
        }
        (_, 1) => {
            let r = mm(a, &b.unsqueeze(1)?)?;
            Ok(r.squeeze(r.rank() - 1)?)
        }
        _ => {
            // Fold a's batch dims into rows when b is a plain matrix (one big gemm).
            if b.rank() == 2 && a.rank() > 2 {
                let dims = a.dims().to_vec();
                let k = dims[dims.len() - 1];
                let rows: usize = dims[..dims.len() - 1].iter().product();
                let r = mm(&a.reshape((rows, k))?, b)?;
                let mut out = dims[..dims.len() - 1].to_vec();
                out.push(b.dims()[1]);
                return Ok(r.reshape(out)?);
            }
            mm(a, b)
        }
    }
}

fn linear(a: &Args) -> OpResult<Outputs> {
    let x = float(&a.tensor("input")?)?;
    let w = float(&a.tensor("weight")?)?;
    let y = matmul(&x, &w.t()?)?;
    match a.opt_tensor("bias")? {
        // `y` is the matmul's fresh result, shared with nothing: add the bias in place.
        Some(b) => {
            let b = float(&b)?;
            if super::fused::add_bias_in_place(&y, &b) {
                one(y)
            } else {
                one(y.broadcast_add(&b)?)
            }
        }
        None => one(y),
    }
}

fn addmm(a: &Args) -> OpResult<Outputs> {
    let bias = float(&a.tensor("self")?)?;
    let (m1, m2) = if a.has("mat1") {
        (a.tensor("mat1")?, a.tensor("mat2")?)
    } else {
        (a.tensor("batch1")?, a.tensor("batch2")?)
    };
    let beta = a.float_or("beta", 1.0)?;
    let alpha = a.float_or("alpha", 1.0)?;
    let mut p = mm(&m1, &m2)?;
    if alpha != 1.0 {
        p = p.affine(alpha, 0.0)?;
    }
    if beta == 0.0 {
        return one(p);
    }
    let b = if beta == 1.0 {
        bias
    } else {
        bias.affine(beta, 0.0)?
    };
    one(p.broadcast_add(&b)?)
}
