//! Padding and neighbourhood ops: `constant_pad_nd`, `pad` (constant, reflect, replicate,
//! circular), `roll`, `diff`; and the small shape helpers real exports use: `unflatten`,
//! `reshape_as`, `fill`, `copy`.

use candle_core::Tensor;

use super::{dim, scalar_tensor, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs, Scalar};

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    r.add("aten.constant_pad_nd.default", pad);
    r.add("aten.pad.default", pad);
    r.add("aten.roll.default", roll);
    r.add("aten.diff.default", diff);
    r.add("aten.unflatten.int", unflatten);
    r.add("aten.reshape_as.default", |a| {
        one(a.tensor("self")?.reshape(a.tensor("other")?.shape())?)
    });
    r.add("aten.view_as.default", |a| {
        one(a.tensor("self")?.reshape(a.tensor("other")?.shape())?)
    });
    r.add("aten.fill.Scalar", fill);
    r.add("aten.fill.Tensor", fill);
    r.add("aten.copy.default", copy);
}

/// Index positions of a padded dim of size `n` (`lo`/`hi` ≥ 0) for a non-constant mode.
fn padded_positions(n: usize, lo: usize, hi: usize, mode: &str) -> OpResult<Vec<u32>> {
    if n == 0 {
        op_bail!("cannot pad an empty dim in '{mode}' mode");
    }
    let n_i = n as i64;
    let (lo_i, hi_i) = (lo as i64, hi as i64);
    if mode == "reflect" && (lo_i >= n_i || hi_i >= n_i) {
        op_bail!("reflect padding ({lo}, {hi}) must be smaller than the dim's size {n}");
    }
    if mode == "circular" && (lo_i > n_i || hi_i > n_i) {
        op_bail!("circular padding ({lo}, {hi}) must not exceed the dim's size {n}");
    }
    Ok((-lo_i..n_i + hi_i)
        .map(|i| {
            let j = match mode {
                "reflect" => {
                    let j = i.abs();
                    if j >= n_i {
                        2 * (n_i - 1) - j
                    } else {
                        j
                    }
                }
                "replicate" => i.clamp(0, n_i - 1),
                _ => i.rem_euclid(n_i),
            };
            j as u32
        })
        .collect())
}

fn pad(a: &Args) -> OpResult<Outputs> {
    let mut t = a.tensor("self")?;
    let p = a.ints("pad")?;
    let mode = a.str_or("mode", "constant")?;
    if p.len() % 2 != 0 || p.len() / 2 > t.rank() {
        op_bail!(
            "padding of length {} does not fit a tensor of rank {}",
            p.len(),
            t.rank()
        );
    }
    let value = match a.get("value") {
        Some(_) if a.has("value") => a.scalar("value")?,
        _ => Scalar::Int(0),
    };
    for (k, pair) in p.chunks(2).enumerate() {
        let d = t.rank() - 1 - k;
        let (lo, hi) = (pair[0], pair[1]);
        if mode != "constant" {
            if lo < 0 || hi < 0 {
                op_bail!("negative padding is only supported in constant mode");
            }
            if !matches!(mode, "reflect" | "replicate" | "circular") {
                op_bail!("padding mode '{mode}' is not supported");
            }
            let pos = padded_positions(t.dims()[d], lo as usize, hi as usize, mode)?;
            let n = pos.len();
            let idx = Tensor::from_vec(pos, n, &candle_core::Device::Cpu)?;
            t = t.contiguous()?.index_select(&idx, d)?;
            continue;
        }
        // Negative pads crop.
        let n = t.dims()[d] as i64;
        let start = (-lo).max(0);
        let stop = n - (-hi).max(0);
        if stop < start {
            op_bail!("padding ({lo}, {hi}) leaves a negative size for dim {d} of size {n}");
        }
        t = t.narrow(d, start as usize, (stop - start) as usize)?;
        let side = |w: i64| -> OpResult<Option<Tensor>> {
            if w <= 0 {
                return Ok(None);
            }
            let mut s = t.dims().to_vec();
            s[d] = w as usize;
            Ok(Some(
                scalar_tensor(value, t.dtype())?
                    .to_dtype(t.dtype())?
                    .broadcast_as(s)?
                    .contiguous()?,
            ))
        };
        let mut parts = Vec::new();
        if let Some(l) = side(lo)? {
            parts.push(l);
        }
        parts.push(t.clone());
        if let Some(h) = side(hi)? {
            parts.push(h);
        }
        if parts.len() > 1 {
            t = Tensor::cat(&parts, d)?;
        }
    }
    one(t)
}

fn roll(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let shifts = a.ints("shifts")?;
    let dims = a.ints_or("dims", &[])?;
    if dims.is_empty() {
        // Roll the flattened tensor, then restore the shape.
        let [s] = shifts.as_slice() else {
            op_bail!("roll without dims takes one shift, got {}", shifts.len());
        };
        let flat = t.flatten_all()?;
        return one(roll_dim(&flat, *s, 0)?.reshape(t.shape())?);
    }
    if dims.len() != shifts.len() {
        op_bail!("roll: {} shifts but {} dims", shifts.len(), dims.len());
    }
    let mut r = t;
    for (&s, &d) in shifts.iter().zip(&dims) {
        let d = dim(d, r.rank())?;
        r = roll_dim(&r, s, d)?;
    }
    one(r)
}

fn roll_dim(t: &Tensor, shift: i64, d: usize) -> OpResult<Tensor> {
    let n = t.dims().get(d).copied().unwrap_or(1);
    if n == 0 {
        return Ok(t.clone());
    }
    let s = shift.rem_euclid(n as i64) as usize;
    if s == 0 {
        return Ok(t.clone());
    }
    Ok(Tensor::cat(
        &[t.narrow(d, n - s, s)?, t.narrow(d, 0, n - s)?],
        d,
    )?)
}

fn diff(a: &Args) -> OpResult<Outputs> {
    let mut t = a.tensor("self")?;
    if t.rank() == 0 {
        op_bail!("diff needs a tensor of rank at least 1");
    }
    let d = dim(a.int_or("dim", -1)?, t.rank())?;
    let n = a.int_or("n", 1)?;
    if n < 0 {
        op_bail!("diff order n must be non-negative, got {n}");
    }
    let mut parts = Vec::new();
    if let Some(p) = a.opt_tensor("prepend")? {
        parts.push(p.to_dtype(t.dtype())?);
    }
    parts.push(t.clone());
    if let Some(p) = a.opt_tensor("append")? {
        parts.push(p.to_dtype(t.dtype())?);
    }
    if parts.len() > 1 {
        t = Tensor::cat(&parts, d)?;
    }
    let is_bool = t.dtype() == candle_core::DType::U8;
    for _ in 0..n {
        let len = t.dims()[d];
        if len == 0 {
            break;
        }
        let (hi, lo) = (t.narrow(d, 1, len - 1)?, t.narrow(d, 0, len - 1)?);
        // bool diff is xor (torch: `!=`).
        t = if is_bool { hi.ne(&lo)? } else { hi.sub(&lo)? };
    }
    one(t)
}

fn unflatten(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let d = dim(a.int("dim")?, t.rank())?;
    let sizes = a.ints("sizes")?;
    let n = t.dims()[d];
    let inferred = super::shape::infer_shape(&sizes, n)?;
    let mut shape = t.dims()[..d].to_vec();
    shape.extend(inferred);
    shape.extend_from_slice(&t.dims()[d + 1..]);
    one(t.reshape(shape)?)
}

fn fill(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let v = match a.tensor_or_scalar("value")? {
        crate::value::TensorOrScalar::Tensor(v) => {
            if v.rank() != 0 {
                op_bail!("fill takes a 0-d value tensor, got shape {:?}", v.dims());
            }
            v.to_dtype(t.dtype())?
        }
        crate::value::TensorOrScalar::Scalar(s) => {
            scalar_tensor(s, t.dtype())?.to_dtype(t.dtype())?
        }
    };
    one(v.broadcast_as(t.shape())?.contiguous()?)
}

/// `copy(self, src)`: `src` broadcast to `self`'s shape, in `self`'s dtype.
fn copy(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let src = a.tensor("src")?;
    one(src
        .to_dtype(t.dtype())?
        .broadcast_as(t.shape())?
        .contiguous()?)
}
