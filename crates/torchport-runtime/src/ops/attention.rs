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
    if q.rank() > 4 && !gqa {
        return attention_flattened(&q, &k, &v, mask, causal, scale);
    }
    let e = q.dims()[q.rank() - 1];
    let l = q.dims()[q.rank() - 2];
    let s = k.dims()[k.rank() - 2];
    let scale_or_default = scale.unwrap_or(1.0 / (e as f64).sqrt());
    if let Some(out) = fused_attention(&q, &k, &v, mask, causal, scale_or_default, gqa)? {
        return Ok(out);
    }
    if gqa && q.rank() >= 3 {
        let hq = q.dims()[q.rank() - 3];
        k = repeat_heads(&k, hq)?;
        v = repeat_heads(&v, hq)?;
    }
    let scores = masked_scores(&q, &k, mask, causal, scale_or_default, l, s)?;
    mm(&safe_softmax(&scores)?, &v)
}

/// Softmax over the last dim, with rows that are all -inf (attending to nothing) giving
/// zeros instead of NaN, as torch's attention does.
fn safe_softmax(scores: &Tensor) -> OpResult<Tensor> {
    let last = scores.rank() - 1;
    let p = softmax_dim(scores, last)?;
    let dead = scores
        .max_keepdim(last)?
        .eq(f64::NEG_INFINITY)?
        .broadcast_as(p.shape())?;
    Ok(dead.where_cond(&p.zeros_like()?, &p)?)
}

/// Attention over more than one batch dim (`[B1, B2, H, L, E]`, as Hiera's mask-unit
/// attention has): the batch dims (broadcast between q, k, v and the mask) flattened into
/// one, run as 4-d, the result shaped back.
fn attention_flattened(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    scale: Option<f64>,
) -> OpResult<Tensor> {
    let r = q.rank();
    if k.rank() != r || v.rank() != r {
        op_bail!(
            "attention with query of rank {r} needs key and value of the same rank, got shapes {:?} and {:?}",
            k.dims(),
            v.dims()
        );
    }
    let lead = &q.dims()[..r - 2];
    let batch: usize = q.dims()[..r - 3].iter().product();
    let heads = q.dims()[r - 3];
    let four = |t: &Tensor| -> OpResult<Tensor> {
        let mut shape = lead.to_vec();
        shape.extend(&t.dims()[t.rank() - 2..]);
        let tail = &t.dims()[t.rank() - 2..];
        Ok(t.broadcast_as(shape)?
            .contiguous()?
            .reshape((batch, heads, tail[0], tail[1]))?)
    };
    let mask = match mask {
        Some(m) => {
            let (l, s) = (q.dims()[r - 2], k.dims()[r - 2]);
            let mut shape = lead.to_vec();
            shape.extend([l, s]);
            Some(
                m.broadcast_as(shape)?
                    .contiguous()?
                    .reshape((batch, heads, l, s))?,
            )
        }
        None => None,
    };
    let out = attention(
        &four(q)?,
        &four(k)?,
        &four(v)?,
        mask.as_ref(),
        causal,
        scale,
        false,
    )?;
    let mut shape = q.dims()[..r - 1].to_vec();
    shape.push(out.dims()[3]);
    Ok(out.reshape(shape)?)
}

/// `t [..., Hk, S, E]` with its heads repeated to `hq` (grouped-query attention).
fn repeat_heads(t: &Tensor, hq: usize) -> OpResult<Tensor> {
    let hk = t.dims()[t.rank() - 3];
    if hk == 0 || !hq.is_multiple_of(hk) {
        op_bail!("enable_gqa: {hq} query heads are not a multiple of {hk} key heads");
    }
    let rep = hq / hk;
    if rep == 1 {
        return Ok(t.clone());
    }
    let idx: Vec<i64> = (0..hq as i64).map(|i| i / rep as i64).collect();
    let idx = Tensor::new(idx.as_slice(), &candle_core::Device::Cpu)?;
    Ok(t.contiguous()?.index_select(&idx, t.rank() - 3)?)
}

/// `scale · q kᵀ` `[..., L, S]` with the causal limit and the mask applied (bool: `false`
/// gives -inf; float: added).
fn masked_scores(
    q: &Tensor,
    k: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    scale: f64,
    l: usize,
    s: usize,
) -> OpResult<Tensor> {
    let mut scores = mm(q, &k.transpose(k.rank() - 2, k.rank() - 1)?)?.affine(scale, 0.0)?;
    let dt = scores.dtype();
    let neg_inf = |shape: &[usize]| -> OpResult<Tensor> {
        Ok(Tensor::new(f32::NEG_INFINITY, &candle_core::Device::Cpu)?
            .to_dtype(dt)?
            .broadcast_as(shape)?)
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
    Ok(scores)
}

/// The log-sum-exp of each query row's masked scores, `[..., L]`: the second output of the
/// CPU flash-attention op.
fn scores_logsumexp(
    q: &Tensor,
    k: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    scale: Option<f64>,
    gqa: bool,
) -> OpResult<Tensor> {
    let (q, mut k) = (float(q)?, float(k)?);
    if q.rank() < 2 || k.rank() < 2 {
        op_bail!("attention needs query and key of rank at least 2");
    }
    let e = q.dims()[q.rank() - 1];
    let (l, s) = (q.dims()[q.rank() - 2], k.dims()[k.rank() - 2]);
    if gqa && q.rank() >= 3 {
        k = repeat_heads(&k, q.dims()[q.rank() - 3])?;
    }
    let scale = scale.unwrap_or(1.0 / (e as f64).sqrt());
    let scores = masked_scores(&q, &k, mask, causal, scale, l, s)?;
    let last = scores.rank() - 1;
    let max = scores.max_keepdim(last)?;
    let sum = scores.broadcast_sub(&max)?.exp()?.sum_keepdim(last)?;
    Ok(sum.log()?.add(&max)?.squeeze(last)?)
}

/// Attention for rank-4 f32 `q [B, Hq, L, E]`, `k [B, Hk, S, E]`, `v [B, Hk, S, Ev]` (any
/// strides; `Hk` divides `Hq` under `enable_gqa`, else equal) with an optional float or bool
/// mask broadcastable to `[B, Hq, L, S]`: per head and block of query rows, in parallel, the
/// scores `scale * q kᵀ` go into one `[rows, S]` buffer, get the mask (and the causal limit),
/// a softmax per row (as `fused::softmax_last` computes it) and one product with `v`, written
/// straight into the output. No score tensor for all heads, no copies of transposed heads.
/// `None` when the shapes or dtypes are not these (the composed form takes them).
fn fused_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    scale: f64,
    gqa: bool,
) -> OpResult<Option<Tensor>> {
    use super::sgemm::{sgemm, Mat};
    use rayon::prelude::*;
    if q.rank() != 4 || k.rank() != 4 || v.rank() != 4 {
        return Ok(None);
    }
    if [q.dtype(), k.dtype(), v.dtype()] != [DType::F32; 3] {
        return Ok(None);
    }
    let (b, hq, l, e) = q.dims4()?;
    let (kb, hk, s, ke) = k.dims4()?;
    let (vb, vh, vs, ev) = v.dims4()?;
    if kb != b || vb != b || vh != hk || vs != s || ke != e || hk == 0 || hq % hk != 0 {
        return Ok(None);
    }
    if hk != hq && !gqa {
        return Ok(None);
    }
    let rep = hq / hk;
    let mask = match mask {
        Some(m) => match m.broadcast_as((b, hq, l, s)) {
            Ok(m) if matches!(m.dtype(), DType::F32 | DType::U8) => Some(m),
            _ => return Ok(None),
        },
        None => None,
    };
    let mut out = super::fused::zeros(b * hq * l * ev);
    if out.is_empty() || s == 0 {
        return Ok(None);
    }
    let threads = rayon::current_num_threads();
    // Enough row blocks for every thread to have work, at least 16 rows each.
    let blocks = (2 * threads).div_ceil(b * hq).max(1);
    let mut rb = l.div_ceil(blocks).max(16).min(l);
    if causal {
        // A causal block reads only the keys up to its last row, so smaller blocks skip more
        // of the products (but run them less efficiently): of 32, 48, 64 and 128 rows, 64
        // were the fastest in a scratch timing of the Llama-style model's attention shape,
        // 8 x 12 heads of 128 x 64, at 1 thread (BENCHMARKS.md, issue 14).
        rb = rb.min(64);
    }
    let scale = scale as f32;
    let ok = super::fused::with_storage::<f32, _>(q, |qd, ql| {
        super::fused::with_storage::<f32, _>(k, |kd, kl| {
            super::fused::with_storage::<f32, _>(v, |vd, vl| {
                let (qs, ks, vs) = (ql.stride(), kl.stride(), vl.stride());
                let (qo, ko, vo) = (ql.start_offset(), kl.start_offset(), vl.start_offset());
                let fmask = mask
                    .as_ref()
                    .filter(|m| m.dtype() == DType::F32)
                    .and_then(|m| super::fused::with_storage::<f32, _>(m, MaskView::of))
                    .flatten();
                let bmask = mask
                    .as_ref()
                    .filter(|m| m.dtype() == DType::U8)
                    .and_then(|m| super::fused::with_storage::<u8, _>(m, MaskView::of))
                    .flatten();
                if mask.is_some() && fmask.is_none() && bmask.is_none() {
                    return false;
                }
                let task = |bh: usize, r0: usize, o: &mut [f32]| -> bool {
                    let (bi, h) = (bh / hq, bh % hq);
                    let kh = h / rep;
                    let rows = o.len() / ev;
                    let qb = qo + bi * qs[0] + h * qs[1] + r0 * qs[2];
                    let kbase = ko + bi * ks[0] + kh * ks[1];
                    let vbase = vo + bi * vs[0] + kh * vs[1];
                    let (Some(qsl), Some(ksl), Some(vsl)) =
                        (qd.get(qb..), kd.get(kbase..), vd.get(vbase..))
                    else {
                        return false;
                    };
                    // Causal: the keys a row of this block may attend to.
                    let s = if causal { (r0 + rows).min(s) } else { s };
                    super::fused::with_scratch_len(rows * s, |sc| {
                        let ok = sgemm(
                            rows,
                            s,
                            e,
                            Mat {
                                data: qsl,
                                rs: qs[2],
                                cs: qs[3],
                            },
                            Mat {
                                data: ksl,
                                rs: ks[3],
                                cs: ks[2],
                            },
                            sc,
                            s,
                            false,
                            scale,
                            1,
                        );
                        if !ok {
                            return false;
                        }
                        // Masks, the causal limit and the softmax, in one pass over the rows
                        // compiled for the wider vector instructions.
                        let rows_ok = super::fused::simd(
                            #[inline(always)]
                            || {
                                for (ri, row) in sc.chunks_mut(s).enumerate() {
                                    let i = r0 + ri;
                                    if let Some(fm) = &fmask {
                                        fm.row(row, [bi, h, i], |x, m| *x += m);
                                    }
                                    if let Some(bm) = &bmask {
                                        let keep = |x: &mut f32, m: u8| {
                                            if m == 0 {
                                                *x = f32::NEG_INFINITY
                                            }
                                        };
                                        bm.row(row, [bi, h, i], keep);
                                    }
                                    // Causal: the keys past the query's position get no
                                    // weight, and the softmax runs over those before it.
                                    let live = if causal { (i + 1).min(s) } else { s };
                                    let (row, masked) = row.split_at_mut(live);
                                    masked.fill(0.0);
                                    let m = super::fused::row_max(row);
                                    if m == f32::NEG_INFINITY {
                                        // A row that attends to nothing gives zeros (torch's safe
                                        // softmax), not NaN.
                                        row.fill(0.0);
                                    } else {
                                        super::fused::softmax_row(row, m);
                                    }
                                }
                                true
                            },
                        );
                        if !rows_ok {
                            return false;
                        }
                        sgemm(
                            rows,
                            ev,
                            s,
                            Mat::rows(sc, s),
                            Mat {
                                data: vsl,
                                rs: vs[2],
                                cs: vs[3],
                            },
                            o,
                            ev,
                            false,
                            1.0,
                            1,
                        )
                    })
                };
                out.par_chunks_mut(l * ev).enumerate().all(|(bh, o)| {
                    o.par_chunks_mut(rb * ev)
                        .enumerate()
                        .all(|(blk, ob)| task(bh, blk * rb, ob))
                })
            })
        })
    });
    if ok.flatten().flatten() != Some(true) {
        return Ok(None);
    }
    Ok(Some(Tensor::from_vec(out, (b, hq, l, ev), q.device())?))
}

/// The values of a rank-4 attention mask (broadcast to `[B, H, L, S]`) that its view reads,
/// copied out of its storage, and the view's strides into them. Only the view's own span is
/// copied: a mask that is a constant of the program shares its storage with all of the
/// program's weights, and copying that whole storage on every call had cost TinyViT-5M 5 ms
/// per attention (the weights' 57 MB; BENCHMARKS.md, issue 14).
struct MaskView<T> {
    values: Vec<T>,
    stride: [usize; 4],
}

impl<T: Copy> MaskView<T> {
    /// The span of `data` that the rank-4 `layout` reads; `None` if it is not rank 4 or
    /// reaches past `data`.
    fn of(data: &[T], layout: &candle_core::Layout) -> Option<MaskView<T>> {
        let (dims, st) = (layout.dims(), layout.stride());
        let (&[d0, d1, d2, d3], &[s0, s1, s2, s3]) = (dims, st) else {
            return None;
        };
        if d0 * d1 * d2 * d3 == 0 {
            return None;
        }
        let last = (d0 - 1) * s0 + (d1 - 1) * s1 + (d2 - 1) * s2 + (d3 - 1) * s3;
        let start = layout.start_offset();
        let values = data.get(start..=start.checked_add(last)?)?.to_vec();
        Some(MaskView {
            values,
            stride: [s0, s1, s2, s3],
        })
    }

    /// `f(score, mask value)` over one row of scores: row `i` of head `h` of batch `bi`
    /// (`at`). A unit-stride row is read as one slice, so the loop vectorises. The row is
    /// as long as the mask's last dim (`S`), which `of` checked lies inside.
    #[inline(always)]
    fn row(&self, row: &mut [f32], at: [usize; 3], f: impl Fn(&mut f32, T)) {
        let st = self.stride;
        let base = at[0] * st[0] + at[1] * st[1] + at[2] * st[2];
        let n = row.len();
        if st[3] == 1 {
            for (x, &v) in row.iter_mut().zip(&self.values[base..base + n]) {
                f(x, v);
            }
        } else {
            for (j, x) in row.iter_mut().enumerate() {
                f(x, self.values[base + j * st[3]]);
            }
        }
    }
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
        // (output, logsumexp of each query row's scores)
        let lse = scores_logsumexp(&q, &k, mask.as_ref(), causal, scale, gqa)?;
        return Ok(vec![Value::Tensor(out), Value::Tensor(lse)]);
    }
    one(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn flash_attention_logsumexp_is_torchs() {
        let q = Tensor::new(&[0.5f32, -1.0, 2.0, 0.25, 1.0, 1.0], &Device::Cpu)
            .unwrap()
            .reshape((1, 1, 3, 2))
            .unwrap();
        let k = Tensor::new(&[1.0f32, 0.0, 0.0, 1.0, -1.0, 2.0, 0.5, 0.5], &Device::Cpu)
            .unwrap()
            .reshape((1, 1, 4, 2))
            .unwrap();
        // torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v,
        // is_causal=True)[1] (torch 2.15.0).
        let want = [0.35355338f32, 1.6689541, 1.8057191];
        let got = scores_logsumexp(&q, &k, None, true, None, false)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= 1e-6, "{got:?}");
        }
    }

    /// softmax(scale q kᵀ + mask) v by candle's own ops, heads repeated for GQA.
    fn reference(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
        causal: bool,
        scale: f64,
    ) -> Tensor {
        let rep = q.dims()[1] / k.dims()[1];
        let (k, v) = if rep > 1 {
            let idx: Vec<u32> = (0..q.dims()[1] as u32).map(|h| h / rep as u32).collect();
            let idx = Tensor::new(idx.as_slice(), &Device::Cpu).unwrap();
            (
                k.contiguous().unwrap().index_select(&idx, 1).unwrap(),
                v.contiguous().unwrap().index_select(&idx, 1).unwrap(),
            )
        } else {
            (k.clone(), v.clone())
        };
        let (l, s) = (q.dims()[2], k.dims()[2]);
        let mut sc = (q
            .contiguous()
            .unwrap()
            .matmul(&k.t().unwrap().contiguous().unwrap())
            .unwrap()
            * scale)
            .unwrap();
        let ninf = Tensor::new(f32::NEG_INFINITY, &Device::Cpu)
            .unwrap()
            .broadcast_as(sc.shape())
            .unwrap();
        if causal {
            let keep: Vec<u8> = (0..l * s).map(|x| u8::from(x % s <= x / s)).collect();
            let keep = Tensor::from_vec(keep, (l, s), &Device::Cpu).unwrap();
            let keep = keep.broadcast_as(sc.shape()).unwrap();
            sc = keep.where_cond(&sc, &ninf).unwrap();
        }
        if let Some(m) = mask {
            if m.dtype() == DType::U8 {
                sc = m
                    .broadcast_as(sc.shape())
                    .unwrap()
                    .where_cond(&sc, &ninf)
                    .unwrap();
            } else {
                sc = sc.broadcast_add(m).unwrap();
            }
        }
        let p = candle_core::D::Minus1;
        let e = sc
            .broadcast_sub(&sc.max_keepdim(p).unwrap())
            .unwrap()
            .exp()
            .unwrap();
        let p = e.broadcast_div(&e.sum_keepdim(p).unwrap()).unwrap();
        p.matmul(&v.contiguous().unwrap()).unwrap()
    }

    /// The fused kernel against candle's composed ops: transposed (strided) heads, GQA,
    /// causal with L != S, float and bool masks that broadcast, rows split into blocks.
    #[test]
    fn fused_attention_matches_composed_ops() {
        let dev = Device::Cpu;
        let r = |s: &[usize]| Tensor::randn(0f32, 1., s.to_vec(), &dev).unwrap();
        // q as a transposed view of [B, L, H, E], as models write it.
        // One image and two query heads, so that the rows split into blocks (on 2+ threads).
        let q = r(&[1, 37, 2, 8]).transpose(1, 2).unwrap();
        let k = r(&[1, 1, 41, 8]);
        let v = r(&[1, 41, 1, 5]).transpose(1, 2).unwrap();
        let fmask = r(&[1, 1, 1, 41]);
        let keep: Vec<u8> = (0..37 * 41).map(|i| u8::from(i % 7 != 3)).collect();
        let bmask = Tensor::from_vec(keep, (37, 41), &dev).unwrap();
        // A mask whose rows are not unit-stride (read element by element).
        let tmask = r(&[41, 37]).t().unwrap();
        // A mask inside a larger storage, from an offset (a constant among the program's
        // weights, which share one buffer).
        let shared = r(&[4000]);
        let vmask = shared.narrow(0, 123, 37 * 41).unwrap();
        let vmask = vmask.reshape((37, 41)).unwrap();
        for (mask, causal) in [
            (None, false),
            (None, true),
            (Some(&fmask), false),
            (Some(&fmask), true),
            (Some(&bmask), true),
            (Some(&tmask), false),
            (Some(&vmask), false),
        ] {
            let got = fused_attention(&q, &k, &v, mask, causal, 0.3, true)
                .unwrap()
                .expect("fast path applies");
            let want = reference(&q, &k, &v, mask, causal, 0.3);
            let d = crate::ops::max_abs_diff(&got, &want);
            assert!(
                d < 1e-5,
                "mask {:?} causal {causal}: {d}",
                mask.map(|m| m.dtype())
            );
        }
        // Causal over more rows than one block holds (64), so that later blocks read only
        // the keys up to their last row, on any number of threads; more keys than rows.
        let q = r(&[1, 150, 2, 8]).transpose(1, 2).unwrap();
        let (k, v) = (r(&[1, 1, 157, 8]), r(&[1, 1, 157, 5]));
        let keep: Vec<u8> = (0..150 * 157).map(|i| u8::from(i % 5 != 2)).collect();
        let bmask = Tensor::from_vec(keep, (150, 157), &dev).unwrap();
        for mask in [None, Some(&bmask)] {
            let got = fused_attention(&q, &k, &v, mask, true, 0.3, true)
                .unwrap()
                .expect("fast path applies");
            let d = crate::ops::max_abs_diff(&got, &reference(&q, &k, &v, mask, true, 0.3));
            assert!(d < 1e-5, "150 causal rows, mask {}: {d}", mask.is_some());
        }
        // Without enable_gqa, unequal head counts are left to the composed form.
        assert!(fused_attention(&q, &k, &v, None, false, 0.3, false)
            .unwrap()
            .is_none());
    }

    /// A mask's values are copied only as far as its view reads them, from its offset: not
    /// the whole storage it shares (the program's weights), and none past the storage.
    #[test]
    fn mask_view_copies_only_its_span() {
        let shared = Tensor::arange(0f32, 4000., &Device::Cpu).unwrap();
        let m = shared.narrow(0, 123, 6).unwrap().reshape((2, 3)).unwrap();
        let m = m.broadcast_as((2, 4, 2, 3)).unwrap();
        let view = crate::ops::fused::with_storage::<f32, _>(&m, MaskView::of)
            .flatten()
            .unwrap();
        assert_eq!(view.values, [123., 124., 125., 126., 127., 128.]);
        let mut row = [0f32; 3];
        view.row(&mut row, [1, 3, 1], |x, v| *x += v);
        assert_eq!(row, [126., 127., 128.]);
        // A layout that reaches past its storage is refused, not read.
        let lay = candle_core::Layout::contiguous_with_offset((1, 1, 2, 3), 3998);
        assert!(MaskView::of(&[0f32; 4000], &lay).is_none());
    }
}
