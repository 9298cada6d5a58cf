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
    mut h: Tensor,
    mut c: Option<Tensor>,
    reverse: bool,
) -> OpResult<(Tensor, Tensor, Option<Tensor>)> {
    let (t_len, b, _) = x.dims3()?;
    let (w_ih, w_hh) = (&w[0], &w[1]);
    let hidden = w_hh.dims()[1];
    // Input projections for all steps: [T*B, G*H].
    let mut xi = x.reshape((t_len * b, ()))?.matmul(&w_ih.t()?)?;
    if has_biases {
        xi = xi.broadcast_add(&w[2])?;
    }
    let xi = xi.reshape((t_len, b, ()))?;
    let w_hh_t = w_hh.t()?.contiguous()?;
    let mut outs = vec![None; t_len];
    for step in 0..t_len {
        let t = if reverse { t_len - 1 - step } else { step };
        let gi = xi.get(t)?;
        let mut gh = h.matmul(&w_hh_t)?;
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
        let mut ys = Vec::new();
        for d in 0..cfg.dirs {
            let k = layer * cfg.dirs + d;
            let w = &params[k * per..(k + 1) * per];
            let h = h0.get(k)?;
            let c = c0.as_ref().map(|c| c.get(k)).transpose()?;
            let (y, h, c) = run_dir(cell, &x, w, cfg.has_biases, h, c, d == 1)?;
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
