//! Attention: `scaled_dot_product_attention` and the CPU flash-attention op that
//! `run_decompositions()` leaves in its place (bool or additive masks, causal, scale, GQA).

use candle_core::{DType, Tensor};

use super::activation::softmax_dim;
use super::linalg::mm;
use super::{float, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs, Value};

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    r.add("aten.scaled_dot_product_attention.default", sdpa);
    r.add(
        "aten._scaled_dot_product_flash_attention_for_cpu.default",
        sdpa,
    );
}

/// softmax(q kᵀ · scale + mask) v over the last two dims; q: [..., L, E], k/v: [..., S, E].
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    scale: Option<f64>,
    gqa: bool,
) -> OpResult<Tensor> {
    let (q, mut k, mut v) = (float(q)?, float(k)?, float(v)?);
    if q.rank() < 2 || k.rank() < 2 || v.rank() < 2 {
        op_bail!(
            "attention needs query, key and value of rank at least 2, got shapes {:?}, {:?}, {:?}",
            q.dims(),
            k.dims(),
            v.dims()
        );
    }
    let e = q.dims()[q.rank() - 1];
    let l = q.dims()[q.rank() - 2];
    let s = k.dims()[k.rank() - 2];
    if gqa && q.rank() >= 3 {
        let hq = q.dims()[q.rank() - 3];
        let hk = k.dims()[k.rank() - 3];
        if hk == 0 || hq % hk != 0 {
            op_bail!("enable_gqa: {hq} query heads are not a multiple of {hk} key heads");
        }
        let rep = hq / hk;
        if rep > 1 {
            let d = k.rank() - 3;
            let idx: Vec<i64> = (0..hq as i64).map(|i| i / rep as i64).collect();
            let idx = Tensor::new(idx.as_slice(), &candle_core::Device::Cpu)?;
            k = k.contiguous()?.index_select(&idx, d)?;
            v = v.contiguous()?.index_select(&idx, d)?;
        }
    }
    let scale = scale.unwrap_or(1.0 / (e as f64).sqrt());
    let mut scores = mm(&q, &k.transpose(k.rank() - 2, k.rank() - 1)?)?.affine(scale, 0.0)?;
    let neg_inf = |shape: &[usize]| -> OpResult<Tensor> {
        Ok(Tensor::new(f32::NEG_INFINITY, &candle_core::Device::Cpu)?.broadcast_as(shape)?)
    };
    if causal {
        let rows = Tensor::arange(0i64, l as i64, &candle_core::Device::Cpu)?.reshape((l, 1))?;
        let cols = Tensor::arange(0i64, s as i64, &candle_core::Device::Cpu)?.reshape((1, s))?;
        let keep = cols.broadcast_le(&rows)?.broadcast_as(scores.shape())?;
        scores = keep.where_cond(&scores, &neg_inf(scores.dims())?)?;
    }
    if let Some(m) = mask {
        if m.dtype() == DType::U8 {
            let keep = m.broadcast_as(scores.shape())?;
            scores = keep.where_cond(&scores, &neg_inf(scores.dims())?)?;
        } else {
            scores = scores.broadcast_add(&float(m)?)?;
        }
    }
    let p = softmax_dim(&scores, scores.rank() - 1)?;
    mm(&p, &v)
}

fn sdpa(a: &Args) -> OpResult<Outputs> {
    let q = a.tensor("query")?;
    let k = a.tensor("key")?;
    let v = a.tensor("value")?;
    let mask = a.opt_tensor("attn_mask")?;
    let dropout = a.float_or("dropout_p", 0.0)?;
    if dropout != 0.0 {
        op_bail!("attention dropout_p = {dropout} is not supported (export in eval mode)");
    }
    let causal = a.bool_or("is_causal", false)?;
    let scale = a.opt_float("scale")?;
    let gqa = a.bool_or("enable_gqa", false)?;
    let out = attention(&q, &k, &v, mask.as_ref(), causal, scale, gqa)?;
    if a.node().target.contains("flash_attention") {
        // (output, logsumexp): the logsumexp is unused in inference graphs.
        let empty = Tensor::zeros(0, DType::F32, &candle_core::Device::Cpu)?;
        return Ok(vec![Value::Tensor(out), Value::Tensor(empty)]);
    }
    one(out)
}
