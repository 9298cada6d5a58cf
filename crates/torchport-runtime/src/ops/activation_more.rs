//! The less common activations: softplus, mish, log_sigmoid, selu, celu, glu, prelu,
//! hardshrink, softshrink and threshold. The smooth ones compute each element in f64 (through
//! [`math::map`](super::math::map)) and store the input's float dtype.

use candle_core::Tensor;

use super::math::map;
use super::{dim, float, scalar_tensor, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs};

/// selu's constants (torch's `SELU_ALPHA`, `SELU_SCALE`).
const SELU_ALPHA: f64 = 1.673_263_242_354_377_3;
const SELU_SCALE: f64 = 1.050_700_987_355_480_5;

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    r.add("aten.softplus.default", softplus);
    for n in ["aten.mish.default", "aten.mish_.default"] {
        r.add(n, |a| {
            one(map(&float(&a.tensor("self")?)?, |x| {
                x * softplus_of(x, 1.0, 20.0).tanh()
            })?)
        });
    }
    r.add("aten.log_sigmoid.default", |a| {
        // log σ(x) = min(x, 0) - log1p(exp(-|x|)), stable for large |x|.
        one(map(&float(&a.tensor("self")?)?, |x| {
            x.min(0.0) - (-x.abs()).exp().ln_1p()
        })?)
    });
    for n in ["aten.selu.default", "aten.selu_.default"] {
        r.add(n, |a| {
            one(map(&float(&a.tensor("self")?)?, |x| {
                SELU_SCALE * if x > 0.0 { x } else { SELU_ALPHA * x.exp_m1() }
            })?)
        });
    }
    for n in ["aten.celu.default", "aten.celu_.default"] {
        r.add(n, |a| {
            let alpha = a.float_or("alpha", 1.0)?;
            if alpha == 0.0 {
                op_bail!("celu with alpha 0 is undefined");
            }
            one(map(&float(&a.tensor("self")?)?, move |x| {
                x.max(0.0) + (alpha * (x / alpha).exp_m1()).min(0.0)
            })?)
        });
    }
    r.add("aten.glu.default", glu);
    r.add("aten.prelu.default", prelu);
    r.add("aten._prelu_kernel.default", prelu);
    r.add("aten.hardshrink.default", |a| {
        let l = a.float_or("lambd", 0.5)?;
        one(map(&float(&a.tensor("self")?)?, move |x| {
            if x >= -l && x <= l {
                0.0
            } else {
                x
            }
        })?)
    });
    r.add("aten.softshrink.default", |a| {
        let l = a.float_or("lambd", 0.5)?;
        one(map(&float(&a.tensor("self")?)?, move |x| {
            if x > l {
                x - l
            } else if x < -l {
                x + l
            } else {
                // NaN stays NaN.
                x * 0.0
            }
        })?)
    });
    for n in ["aten.threshold.default", "aten.threshold_.default"] {
        r.add(n, threshold);
    }
}

/// torch's softplus: `x` where `beta · x > threshold`, else `log1p(exp(beta · x)) / beta`.
fn softplus_of(x: f64, beta: f64, threshold: f64) -> f64 {
    if x * beta > threshold {
        x
    } else {
        (x * beta).exp().ln_1p() / beta
    }
}

fn softplus(a: &Args) -> OpResult<Outputs> {
    let beta = a.float_or("beta", 1.0)?;
    let threshold = a.float_or("threshold", 20.0)?;
    if beta == 0.0 {
        op_bail!("softplus with beta 0 is undefined");
    }
    let x = float(&a.tensor("self")?)?;
    if x.dtype() == candle_core::DType::F32 {
        // The branch is taken on f32 values, as torch's f32 kernel does.
        let (b32, t32) = (beta as f32, threshold as f32);
        return one(map(&x, move |v| {
            if (v as f32) * b32 > t32 {
                v
            } else {
                (v * beta).exp().ln_1p() / beta
            }
        })?);
    }
    one(map(&x, move |v| softplus_of(v, beta, threshold))?)
}

/// `glu(self, dim=-1)`: the first half of `dim` times the sigmoid of the second.
fn glu(a: &Args) -> OpResult<Outputs> {
    let x = float(&a.tensor("self")?)?;
    if x.rank() == 0 {
        op_bail!("glu does not support 0-d tensors");
    }
    let d = dim(a.int_or("dim", -1)?, x.rank())?;
    let n = x.dims()[d];
    if n % 2 != 0 {
        op_bail!("glu halves dim {d}, but its size {n} is odd");
    }
    let (first, second) = (x.narrow(d, 0, n / 2)?, x.narrow(d, n / 2, n / 2)?);
    if first.elem_count() == 0 {
        return one(first.contiguous()?);
    }
    let gate = map(&second.contiguous()?, |v| 1.0 / (1.0 + (-v).exp()))?;
    one((first * gate)?)
}

/// `prelu(self, weight)`: `x` where positive, else `weight · x`, with one weight per channel
/// (dim 1) or one for all; `_prelu_kernel` gets the weight already shaped to broadcast.
fn prelu(a: &Args) -> OpResult<Outputs> {
    let x = float(&a.tensor("self")?)?;
    let w = super::as_dtype(&a.tensor("weight")?, x.dtype())?;
    let w = if w.elem_count() == 1 {
        w.flatten_all()?.reshape(vec![1usize; x.rank()])?
    } else if w.rank() == x.rank()
        && w.dims()
            .iter()
            .zip(x.dims())
            .all(|(&a, &b)| a == 1 || a == b)
    {
        w
    } else if x.rank() >= 2 && w.rank() == 1 && w.elem_count() == x.dims()[1] {
        let mut shape = vec![1usize; x.rank()];
        shape[1] = w.elem_count();
        w.reshape(shape)?
    } else {
        op_bail!(
            "prelu weight of shape {:?} does not match input of shape {:?} (one weight, or one per channel of dim 1)",
            w.dims(),
            x.dims()
        );
    };
    let scaled = x.broadcast_mul(&w)?;
    let pos = x.gt(&x.zeros_like()?)?;
    one(pos.where_cond(&x, &scaled)?)
}

/// `threshold(self, threshold, value)`: `value` where `x <= threshold`, else `x`.
fn threshold(a: &Args) -> OpResult<Outputs> {
    let x = a.tensor("self")?;
    let t = scalar_tensor(a.scalar("threshold")?, x.dtype())?;
    let v = scalar_tensor(a.scalar("value")?, x.dtype())?;
    // `x <= threshold` picks the value, so NaN stays NaN.
    let replace: Tensor = x.broadcast_le(&t)?;
    one(replace.where_cond(&v.broadcast_as(x.shape())?, &x)?)
}
