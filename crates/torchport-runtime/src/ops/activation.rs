//! Activations: relu, relu6/hardtanh, hardswish, hardsigmoid, sigmoid, silu, gelu (erf and
//! tanh), leaky_relu, elu, softmax/log_softmax. In-place variants (`relu_`) share the kernel;
//! the interpreter rebinds the mutated input.

use candle_core::Tensor;

use super::{dim, float, Registry};
use crate::dtype;
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs};

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    for n in ["aten.relu.default", "aten.relu_.default"] {
        r.add(n, |a| {
            let x = a.tensor("self")?;
            match super::fused::relu(&x) {
                Some(y) => one(y),
                None => one(x.relu()?),
            }
        });
    }
    for n in ["aten.hardtanh.default", "aten.hardtanh_.default"] {
        r.add(n, hardtanh);
    }
    r.add("aten.relu6.default", |a| {
        let x = float(&a.tensor("self")?)?;
        match super::fused::unary(&x, |v| v.clamp(0.0, 6.0)) {
            Some(y) => one(y),
            None => one(x.clamp(0f32, 6f32)?),
        }
    });
    for n in ["aten.hardswish.default", "aten.hardswish_.default"] {
        r.add(n, |a| {
            let x = float(&a.tensor("self")?)?;
            if let Some(y) = super::fused::unary(&x, super::fused::hardswish_f32) {
                return one(y);
            }
            one((&x * x.affine(1.0, 3.0)?.clamp(0f32, 6f32)?)?.affine(1.0 / 6.0, 0.0)?)
        });
    }
    for n in ["aten.hardsigmoid.default", "aten.hardsigmoid_.default"] {
        r.add(n, |a| {
            let x = float(&a.tensor("self")?)?;
            if let Some(y) = super::fused::unary(&x, |v| (v + 3.0).clamp(0.0, 6.0) / 6.0) {
                return one(y);
            }
            one(x
                .affine(1.0, 3.0)?
                .clamp(0f32, 6f32)?
                .affine(1.0 / 6.0, 0.0)?)
        });
    }
    for n in ["aten.sigmoid.default", "aten.sigmoid_.default"] {
        r.add(n, |a| one(sigmoid(&float(&a.tensor("self")?)?)?));
    }
    for n in ["aten.silu.default", "aten.silu_.default"] {
        r.add(n, |a| {
            let x = float(&a.tensor("self")?)?;
            if let Some(y) = super::fused::unary_slices(&x, super::fused::silu_slice) {
                return one(y);
            }
            one((&x * sigmoid(&x)?)?)
        });
    }
    r.add("aten.gelu.default", gelu);
    r.add("aten.gelu_.default", gelu);
    r.add("aten.leaky_relu.default", leaky_relu);
    r.add("aten.leaky_relu_.default", leaky_relu);
    r.add("aten.elu.default", elu);
    r.add("aten.softmax.int", softmax);
    r.add("aten._softmax.default", softmax);
    r.add("aten.log_softmax.int", softmax);
    r.add("aten._log_softmax.default", softmax);
}

/// Logistic sigmoid, computed as torch does for f32 (1 / (1 + exp(-x))).
pub fn sigmoid(x: &Tensor) -> OpResult<Tensor> {
    if let Some(y) = super::fused::unary(x, super::fused::sigmoid_fast) {
        return Ok(y);
    }
    Ok(x.neg()?.exp()?.affine(1.0, 1.0)?.recip()?)
}

/// `elu(x, alpha, scale, input_scale)`: `scale · x` for `x > 0`, else
/// `scale · alpha · (exp(input_scale · x) - 1)` (selu decomposes to it with its constants).
fn elu(a: &Args) -> OpResult<Outputs> {
    let x = float(&a.tensor("self")?)?;
    one(elu_of(
        &x,
        a.float_or("alpha", 1.0)?,
        a.float_or("scale", 1.0)?,
        a.float_or("input_scale", 1.0)?,
    )?)
}

fn elu_of(x: &Tensor, alpha: f64, scale: f64, input_scale: f64) -> OpResult<Tensor> {
    if scale == 1.0 && input_scale == 1.0 {
        return Ok(x.elu(alpha)?);
    }
    let neg = x
        .minimum(0f32)?
        .affine(input_scale, 0.0)?
        .exp()?
        .affine(alpha, -alpha)?;
    Ok(x.relu()?.add(&neg)?.affine(scale, 0.0)?)
}

fn hardtanh(a: &Args) -> OpResult<Outputs> {
    let x = a.tensor("self")?;
    let (lo64, hi64) = (a.float_or("min_val", -1.0)?, a.float_or("max_val", 1.0)?);
    let (lo, hi) = (lo64 as f32, hi64 as f32);
    let x = float(&x)?;
    if let Some(y) = super::fused::unary(&x, |v| v.max(lo).min(hi)) {
        return one(y);
    }
    // Bounds in f64 (candle converts them to x's dtype: the same f32 values for f32 input).
    one(x.clamp(lo64, hi64)?)
}

fn gelu(a: &Args) -> OpResult<Outputs> {
    let x = float(&a.tensor("self")?)?;
    match a.str_or("approximate", "none")? {
        // Strided inputs too (ModernBERT's GeGLU halves), so that a fused chain's `gelu`
        // step gives the same bits.
        "none" => match super::fused::unary(&x, super::fused::gelu_erf_f32) {
            Some(y) => one(y),
            None => one(x.gelu_erf()?),
        },
        "tanh" => {
            // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
            if let Some(y) = super::fused::unary(&x, super::fused::gelu_tanh_f32) {
                return one(y);
            }
            let k = (2.0f64 / std::f64::consts::PI).sqrt();
            let inner = (&x + x.powf(3.0)?.affine(0.044715, 0.0)?)?.affine(k, 0.0)?;
            one((&x * inner.tanh()?.affine(0.5, 0.5)?)?)
        }
        m => op_bail!("gelu approximate='{m}' is not supported"),
    }
}

fn leaky_relu(a: &Args) -> OpResult<Outputs> {
    let x = float(&a.tensor("self")?)?;
    let s = a.float_or("negative_slope", 0.01)?;
    let neg = x.affine(s, 0.0)?;
    let pos = x.ge(&x.zeros_like()?)?;
    one(pos.where_cond(&x, &neg)?)
}

/// Softmax over `d` with the max subtracted first.
pub fn softmax_dim(x: &Tensor, d: usize) -> OpResult<Tensor> {
    // A view copied first, on the pool's threads: the fused passes read contiguous data.
    let xc = super::strided::contiguous_f32(x).unwrap_or_else(|| x.clone());
    let fast = match d + 1 == x.rank() {
        true => super::fused::softmax_last(&xc, false),
        false => super::fused::softmax_mid(&xc, d),
    };
    if let Some(y) = fast {
        return Ok(y);
    }
    let m = x.max_keepdim(d)?;
    // Rows that are all -inf give NaN in torch too; keep the max finite to match its output.
    let e = x.broadcast_sub(&m)?.exp()?;
    let s = e.sum_keepdim(d)?;
    Ok(e.broadcast_div(&s)?)
}

fn softmax(a: &Args) -> OpResult<Outputs> {
    let mut x = float(&a.tensor("self")?)?;
    // A 0-d tensor is its own single row (softmax 1, log-softmax 0).
    let scalar = x.rank() == 0;
    if scalar {
        x = x.reshape(1)?;
    }
    let d = dim(a.int("dim")?, x.rank())?;
    let y = softmax_of(a, x, d)?;
    one(if scalar { y.reshape(())? } else { y })
}

/// `softmax` (or `log_softmax`, by the node's target) of `x` along `d`, in its dtype
/// argument's dtype.
fn softmax_of(a: &Args, mut x: Tensor, d: usize) -> OpResult<Tensor> {
    let target = a.node().target.as_str();
    if let Some(st) = a.opt_scalar_type("dtype")? {
        if !dtype::is_float(st) {
            op_bail!("softmax to dtype {} is not supported", dtype::name(st));
        }
        // `dtype=torch.float64` computes in f64 (the input is cast first, as torch does).
        if st == dtype::DOUBLE {
            x = super::as_dtype(&x, candle_core::DType::F64)?;
        }
    }
    if x.elem_count() == 0 {
        return Ok(x);
    }
    if !target.contains("log_softmax") {
        return softmax_dim(&x, d);
    }
    let x = super::strided::contiguous_f32(&x).unwrap_or(x);
    if d + 1 == x.rank() {
        if let Some(y) = super::fused::softmax_last(&x, true) {
            return Ok(y);
        }
    }
    let m = x.max_keepdim(d)?;
    let xc = x.broadcast_sub(&m)?;
    let lse = xc.exp()?.sum_keepdim(d)?.log()?;
    Ok(xc.broadcast_sub(&lse)?)
}

#[cfg(test)]
mod elu_tests {
    use super::*;

    #[test]
    fn selu_constants_give_torchs_selu() {
        let x = Tensor::new(
            &[-3.0f32, -1.0, -0.25, 0.0, 0.5, 2.0],
            &candle_core::Device::Cpu,
        )
        .unwrap();
        // torch.nn.functional.selu of the same values (torch 2.15.0).
        let want = [
            -1.6705687,
            -1.1113307,
            -0.38889018,
            0.0,
            0.5253505,
            2.101402,
        ];
        let got = elu_of(&x, 1.6732632423543772, 1.0507009873554805, 1.0)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= 1e-6, "{got:?}");
        }
    }
}
