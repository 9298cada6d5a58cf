//! Recurrent layers: `aten.lstm.input` and `aten.gru.input` (multi-layer, bidirectional,
//! batch_first, with or without biases; no projections). The input projection of every step is
//! one matrix product; the recurrence loops over time.

use candle_core::{Tensor, D};

use super::activation::sigmoid;
use super::{float, usize_of, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{Args, Outputs, Value};

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    r.add("aten.lstm.input", lstm);
    r.add("aten.gru.input", gru);
}

#[derive(Clone, Copy, PartialEq)]
enum Cell {
    Lstm,
    Gru,
}

struct Config {
    layers: usize,
    dirs: usize,
    has_biases: bool,
    batch_first: bool,
}

fn config(a: &Args) -> OpResult<Config> {
    if a.bool_or("train", false)? && a.float_or("dropout", 0.0)? != 0.0 {
        op_bail!("recurrent dropout in training mode is not supported");
    }
    Ok(Config {
        layers: usize_of(a.int("num_layers")?, "num_layers")?,
        dirs: if a.bool_or("bidirectional", false)? {
            2
        } else {
            1
        },
        has_biases: a.bool_or("has_biases", true)?,
        batch_first: a.bool_or("batch_first", false)?,
    })
}

/// One direction of one layer over the whole sequence `x` [T, B, I], from state h (and c).
#[allow(clippy::too_many_arguments)]
fn run_dir(
    cell: Cell,
    x: &Tensor,
    w: &[Tensor],
    has_biases: bool,
    h: Tensor,
    c: Option<Tensor>,
    reverse: bool,
) -> OpResult<(Tensor, Tensor, Option<Tensor>)> {
    let (t_len, b, _) = x.dims3()?;
    let (w_ih, w_hh) = (&w[0], &w[1]);
    // Input projections for all steps: [T*B, G*H].
    let mut xi = x.reshape((t_len * b, ()))?.matmul(&w_ih.t()?)?;
    if has_biases {
        xi = xi.broadcast_add(&w[2])?;
    }
    let xi = xi.reshape((t_len, b, ()))?;
    let w_hh_t = w_hh.t()?.contiguous()?;
    if cell == Cell::Lstm && xi.dtype() == candle_core::DType::F32 {
        let b_hh = if has_biases { Some(&w[3]) } else { None };
        let c = c.ok_or("LSTM state c is missing")?;
        if let Some(out) = lstm_f32(&xi, &w_hh_t, b_hh, &h, &c, reverse)? {
            return Ok(out);
        }
        return run_steps(cell, &xi, &w_hh_t, w, has_biases, h, Some(c), reverse);
    }
    run_steps(cell, &xi, &w_hh_t, w, has_biases, h, c, reverse)
}

/// The recurrence of [`run_dir`] by candle's ops, step by step: `xi` the input projections
/// `[T, B, G*H]` (input biases added), `w_hh_t` the recurrent weight transposed.
#[allow(clippy::too_many_arguments)]
fn run_steps(
    cell: Cell,
    xi: &Tensor,
    w_hh_t: &Tensor,
    w: &[Tensor],
    has_biases: bool,
    mut h: Tensor,
    mut c: Option<Tensor>,
    reverse: bool,
) -> OpResult<(Tensor, Tensor, Option<Tensor>)> {
    let t_len = xi.dims()[0];
    let hidden = w_hh_t.dims()[0];
    let mut outs = vec![None; t_len];
    for step in 0..t_len {
        let t = if reverse { t_len - 1 - step } else { step };
        let gi = xi.get(t)?;
        let mut gh = h.matmul(w_hh_t)?;
        if has_biases {
            gh = gh.broadcast_add(&w[3])?;
        }
        match cell {
            Cell::Lstm => {
                let g = (gi + gh)?;
                let i = sigmoid(&g.narrow(D::Minus1, 0, hidden)?)?;
                let f = sigmoid(&g.narrow(D::Minus1, hidden, hidden)?)?;
                let gg = g.narrow(D::Minus1, 2 * hidden, hidden)?.tanh()?;
                let o = sigmoid(&g.narrow(D::Minus1, 3 * hidden, hidden)?)?;
                let cprev = c.take().ok_or("LSTM state c is missing")?;
                let cn = ((f * cprev)? + (i * gg)?)?;
                h = (o * cn.tanh()?)?;
                c = Some(cn);
            }
            Cell::Gru => {
                let part = |g: &Tensor, k: usize| g.narrow(D::Minus1, k * hidden, hidden);
                let r = sigmoid(&(part(&gi, 0)? + part(&gh, 0)?)?)?;
                let z = sigmoid(&(part(&gi, 1)? + part(&gh, 1)?)?)?;
                let n = (part(&gi, 2)? + (r * part(&gh, 2)?)?)?.tanh()?;
                // h = (1 - z) * n + z * h = n + z * (h - n)
                h = (&n + (z * (&h - &n)?)?)?;
            }
        }
        outs[t] = Some(h.clone());
    }
    let outs: Vec<Tensor> = outs.into_iter().flatten().collect();
    let y = Tensor::stack(&outs, 0)?;
    Ok((y, h, c))
}

/// An LSTM direction in float32 with each step's gates in one pass: the recurrent product
/// `h @ w_hh_t` added onto the step's input projections (`xi`, `[T, B, 4H]`, plus the
/// recurrent bias), then per unit `c = σ(f) c + σ(i) tanh(g)`, `h = σ(o) tanh(c)`, written
/// into the output and the next step's state. As candle ops, a step was a dozen small
/// tensors (timm's Sequencer2d-S: 16 steps of 16 rows by 48 units, 3.9 ms a bidirectional
/// LSTM on 1 thread; BENCHMARKS.md, issue 14). Returns `(y [T, B, H], h [B, H], c [B, H])`;
/// `None` where a view does not fit or there are no hidden units (candle's ops then take
/// it).
fn lstm_f32(
    xi: &Tensor,
    w_hh_t: &Tensor,
    b_hh: Option<&Tensor>,
    h0: &Tensor,
    c0: &Tensor,
    reverse: bool,
) -> OpResult<Option<(Tensor, Tensor, Option<Tensor>)>> {
    use super::sgemm::{sgemm, Mat};
    let (t_len, b, g4) = xi.dims3()?;
    let hidden = g4 / 4;
    let vec = |t: &Tensor| -> OpResult<Vec<f32>> { Ok(t.flatten_all()?.to_vec1::<f32>()?) };
    let (xi, w) = (vec(xi)?, vec(w_hh_t)?);
    let (mut h, mut c) = (vec(h0)?, vec(c0)?);
    let b_hh = b_hh.map(vec).transpose()?;
    let fits = hidden > 0
        && g4 == 4 * hidden
        && w.len() == hidden * g4
        && h.len() == b * hidden
        && c.len() == b * hidden
        && b_hh.as_ref().is_none_or(|v| v.len() == g4);
    if !fits {
        return Ok(None);
    }
    let mut y = vec![0f32; t_len * b * hidden];
    let mut gates = vec![0f32; b * g4];
    for step in 0..t_len {
        let t = if reverse { t_len - 1 - step } else { step };
        gates.copy_from_slice(&xi[t * b * g4..][..b * g4]);
        if let Some(bias) = &b_hh {
            for row in gates.chunks_exact_mut(g4) {
                row.iter_mut().zip(bias).for_each(|(g, &v)| *g += v);
            }
        }
        let (hm, wm) = (Mat::rows(&h, hidden), Mat::rows(&w, g4));
        if !sgemm(b, g4, hidden, hm, wm, &mut gates, g4, true, 1.0, 1) {
            return Ok(None);
        }
        let out = &mut y[t * b * hidden..][..b * hidden];
        // In wide registers where the CPU has them (`fused::simd`).
        super::fused::simd(
            #[inline(always)]
            || {
                use super::fused::{sigmoid_fast as sig, tanh_fast as tanh};
                for (r, g) in gates.chunks_exact(g4).enumerate() {
                    let (i, rest) = g.split_at(hidden);
                    let (f, rest) = rest.split_at(hidden);
                    let (gg, o) = rest.split_at(hidden);
                    let hr = &mut h[r * hidden..][..hidden];
                    let cr = &mut c[r * hidden..][..hidden];
                    for j in 0..hidden {
                        let cn = sig(f[j]) * cr[j] + sig(i[j]) * tanh(gg[j]);
                        cr[j] = cn;
                        hr[j] = sig(o[j]) * tanh(cn);
                    }
                    out[r * hidden..][..hidden].copy_from_slice(hr);
                }
            },
        );
    }
    let dev = candle_core::Device::Cpu;
    Ok(Some((
        Tensor::from_vec(y, (t_len, b, hidden), &dev)?,
        Tensor::from_vec(h, (b, hidden), &dev)?,
        Some(Tensor::from_vec(c, (b, hidden), &dev)?),
    )))
}

fn rnn(a: &Args, cell: Cell) -> OpResult<Outputs> {
    let cfg = config(a)?;
    let mut x = float(&a.tensor("input")?)?;
    if x.rank() != 3 {
        op_bail!(
            "unbatched recurrent input (shape {:?}) is not supported",
            x.dims()
        );
    }
    if cfg.batch_first {
        x = x.transpose(0, 1)?.contiguous()?;
    }
    let params = a
        .tensors("params")?
        .iter()
        .map(float)
        .collect::<OpResult<Vec<_>>>()?;
    let per = if cfg.has_biases { 4 } else { 2 };
    if params.len() != per * cfg.layers * cfg.dirs {
        op_bail!(
            "expected {} weight tensors for {} layer(s) x {} direction(s), got {} (projections are not supported)",
            per * cfg.layers * cfg.dirs,
            cfg.layers,
            cfg.dirs,
            params.len()
        );
    }
    let (h0, c0) = match cell {
        Cell::Lstm => {
            let hx = a.tensors("hx")?;
            let [h, c] = hx.as_slice() else {
                op_bail!("LSTM hx must hold (h0, c0)");
            };
            (float(h)?, Some(float(c)?))
        }
        Cell::Gru => (float(&a.tensor("hx")?)?, None),
    };
    let mut hs = Vec::new();
    let mut cs = Vec::new();
    for layer in 0..cfg.layers {
        // Direction `d` of this layer over the layer's input.
        let dir = |d: usize| {
            let k = layer * cfg.dirs + d;
            let w = &params[k * per..(k + 1) * per];
            let h = h0.get(k)?;
            let c = c0.as_ref().map(|c| c.get(k)).transpose()?;
            run_dir(cell, &x, w, cfg.has_biases, h, c, d == 1)
        };
        // The two directions of a bidirectional layer are independent: one on each of two
        // threads. Each step's ops are too small to split, so one after the other the layer
        // had gained nothing from a second thread (timm's Sequencer2d-S, 32 bidirectional
        // LSTMs: 3.9 ms each on 1 thread, 4.4 on 2; BENCHMARKS.md, issue 14).
        let runs = if cfg.dirs == 2 {
            let (fwd, bwd) = rayon::join(|| dir(0), || dir(1));
            vec![fwd?, bwd?]
        } else {
            vec![dir(0)?]
        };
        let mut ys = Vec::new();
        for (y, h, c) in runs {
            ys.push(y);
            hs.push(h);
            cs.extend(c);
        }
        x = Tensor::cat(&ys, 2)?;
    }
    let mut y = x;
    if cfg.batch_first {
        y = y.transpose(0, 1)?.contiguous()?;
    }
    let mut out = vec![Value::Tensor(y), Value::Tensor(Tensor::stack(&hs, 0)?)];
    if cell == Cell::Lstm {
        out.push(Value::Tensor(Tensor::stack(&cs, 0)?));
    }
    Ok(out)
}

fn lstm(a: &Args) -> OpResult<Outputs> {
    rnn(a, Cell::Lstm)
}

fn gru(a: &Args) -> OpResult<Outputs> {
    rnn(a, Cell::Gru)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// The float32 LSTM with each step's gates in one pass gives what candle's ops step by
    /// step give (the path the export fixtures and the GRU still take), forward and reversed,
    /// with and without biases; with no hidden units it leaves the layer to them.
    #[test]
    fn lstm_in_one_pass_matches_candle_ops() {
        let dev = Device::Cpu;
        let r = |s: &[usize]| Tensor::randn(0f32, 1., s.to_vec(), &dev).unwrap();
        let (t_len, b, hidden) = (5, 3, 7);
        let xi = r(&[t_len, b, 4 * hidden]);
        let w_hh = r(&[4 * hidden, hidden]);
        let w_hh_t = w_hh.t().unwrap().contiguous().unwrap();
        let (h0, c0) = (r(&[b, hidden]), r(&[b, hidden]));
        // `run_steps` reads the recurrent bias as `w[3]`.
        let w = [r(&[1]), w_hh.clone(), r(&[1]), r(&[4 * hidden])];
        for (reverse, biases) in [(false, true), (true, true), (false, false)] {
            let b_hh = biases.then_some(&w[3]);
            let (y, h, c) = lstm_f32(&xi, &w_hh_t, b_hh, &h0, &c0, reverse)
                .unwrap()
                .expect("the one-pass path applies");
            let (wy, wh, wc) = run_steps(
                Cell::Lstm,
                &xi,
                &w_hh_t,
                &w,
                biases,
                h0.clone(),
                Some(c0.clone()),
                reverse,
            )
            .unwrap();
            let pairs = [
                (&y, &wy),
                (&h, &wh),
                (c.as_ref().unwrap(), wc.as_ref().unwrap()),
            ];
            for (got, want) in pairs {
                let d = crate::ops::max_abs_diff(got, want);
                assert!(d < 1e-5, "reverse {reverse} biases {biases}: {d}");
            }
        }
        let empty = Tensor::zeros((t_len, b, 0), candle_core::DType::F32, &dev).unwrap();
        let none = Tensor::zeros((0, 0), candle_core::DType::F32, &dev).unwrap();
        let h = Tensor::zeros((b, 0), candle_core::DType::F32, &dev).unwrap();
        assert!(lstm_f32(&empty, &none, None, &h, &h, false)
            .unwrap()
            .is_none());
    }
}
