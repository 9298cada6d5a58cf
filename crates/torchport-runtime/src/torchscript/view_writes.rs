//! In-place updates of part of another tensor, written back into it. The evaluator runs
//! in-place ops functionally (the result is bound to the name the op was called on); where
//! that tensor is a part of another, cut by `slice` or `select` (`mask[:, a:b]`,
//! `torch.slice(torch.slice(mask, 0, 0, -7), 1, 0, -7)`), torch's update would also change
//! the tensor it was cut from, so the evaluator writes the new part back into its base by
//! `slice_scatter` / `select_scatter`, and that base into its own, up to a tensor cut from
//! none (torchvision's Swin builds its attention mask so). Parts cut otherwise (`narrow`,
//! `diagonal`, `as_strided`, `split`, `chunk`, `unbind`, indexing by tensors or tuples) are
//! not written back: an in-place update of one is refused.

use std::collections::HashMap;

use candle_core::{Tensor, TensorId};

use super::aten::Ops;
use super::value::Val;

/// How a part was cut from its base, as the arguments after `self` of the op that cut it.
#[derive(Clone, Debug)]
enum Cut {
    /// `slice(base, dim, start, end, step)`: written back by `slice_scatter`.
    Slice(Vec<Val>),
    /// `select(base, dim, index)`: written back by `select_scatter`.
    Select(Vec<Val>),
}

/// A tensor that is part of another.
#[derive(Clone, Debug)]
pub struct Part {
    base: Tensor,
    /// `None`: cut in a way that is not written back.
    cut: Option<Cut>,
}

/// The parts of tensors a run has cut, by tensor.
pub type Parts = HashMap<TensorId, Part>;

/// Ops whose result is a part of their input's memory.
pub fn cuts(op: &str) -> bool {
    matches!(
        op,
        "slice"
            | "select"
            | "narrow"
            | "diagonal"
            | "as_strided"
            | "split"
            | "split_with_sizes"
            | "chunk"
            | "unbind"
            | "__getitem__"
    )
}

/// `result` of a `slice` of `base`, as a tensor of its own where the kernel returned `base`
/// itself (`slice(mask, 0, 0, n)` of a dim of size `n`): the same values and memory under
/// another identity, so that [`mark`] records it as a part and an in-place update of it is
/// written back into `base` (`mask[:n, :n] = 0` updates `mask`, which a later read sees).
/// Other cuts that return their base stay their base (an update of one is not written back,
/// and would be refused as a part).
pub fn distinct(base: &Tensor, result: Val) -> Result<Val, String> {
    match result {
        Val::Tensor(t) if t.id() == base.id() => Ok(Val::Tensor(new_identity(&t)?)),
        other => Ok(other),
    }
}

/// `t`'s values and memory under another identity, which the recording knows as it knows
/// `t`.
pub fn new_identity(t: &Tensor) -> Result<Tensor, String> {
    let alias = t.unsqueeze(0).and_then(|u| u.squeeze(0));
    let alias = alias.map_err(|e| e.to_string())?;
    super::specialise::alias(t, &alias);
    Ok(alias)
}

/// Record the parts in `result`, cut from `base` by `op` with the arguments after `self`
/// (positional; `kwargs` given means the cut is not written back). A `slice` (dim, start,
/// end, step, the last three optional) or `select` (dim, index) of one tensor can be
/// written back; any other part cannot.
pub fn mark(parts: &mut Parts, base: &Tensor, op: &str, rest: &[Val], kwargs: bool, result: &Val) {
    let scalar = |v: &Val| matches!(v, Val::Int(_) | Val::None);
    let cut = match (op, rest.len(), kwargs) {
        ("slice", 0..=4, false) if rest.iter().all(scalar) => Some(Cut::Slice(rest.to_vec())),
        ("select", 2, false) if rest.iter().all(|v| matches!(v, Val::Int(_))) => {
            Some(Cut::Select(rest.to_vec()))
        }
        _ => None,
    };
    match result {
        // A cut that returned its base is no part ([`distinct`] gives it an identity first).
        Val::Tensor(t) if t.id() == base.id() => {}
        Val::Tensor(t) => {
            let part = Part {
                base: base.clone(),
                cut,
            };
            parts.insert(t.id(), part);
        }
        Val::List(_) | Val::Tuple(_) => {
            for x in result.items().unwrap_or_default() {
                if let Val::Tensor(t) = x {
                    let part = Part {
                        base: base.clone(),
                        cut: None,
                    };
                    parts.insert(t.id(), part);
                }
            }
        }
        _ => {}
    }
}

/// Whether `t` is a part of another tensor that an in-place update cannot be written back
/// into (`Err` with the reason), is one it can (`Ok(true)`), or is no part (`Ok(false)`).
pub fn writable(parts: &Parts, t: &Tensor) -> Result<bool, String> {
    match parts.get(&t.id()) {
        None => Ok(false),
        Some(Part { cut: Some(_), .. }) => Ok(true),
        Some(Part { cut: None, .. }) => Err(
            "it is part of another tensor, cut by an op whose parts are not written back \
             (only slice and select are)"
                .into(),
        ),
    }
}

/// Write `value`, the new value of the part `part`, back into its base, and that base into
/// its own, up to a tensor that is no part: that tensor's id and its new value. The new
/// values along the way are recorded as parts of the new bases, so that a later in-place
/// update of them is written back too.
pub fn write_back(
    parts: &mut Parts,
    part: &Tensor,
    value: Tensor,
    ops: &Ops,
) -> Result<(TensorId, Tensor), String> {
    let (mut id, mut value) = (part.id(), value);
    // Each level's new value, with its cut, for recording against the next level's.
    let mut chain: Vec<(Tensor, Option<Cut>)> = Vec::new();
    // Bounded by the parts recorded: each level's base was recorded before its part.
    for _ in 0..=parts.len() {
        let Some(p) = parts.get(&id).cloned() else {
            // A tensor cut from none: the new values of its parts are parts of its new value.
            let mut base = value.clone();
            for (v, cut) in chain.into_iter().rev() {
                // A scatter over all of its base returns the part itself: no part of itself.
                if v.id() != base.id() {
                    let part = Part {
                        base: base.clone(),
                        cut,
                    };
                    parts.insert(v.id(), part);
                }
                base = v;
            }
            return Ok((id, value));
        };
        let cut = p.cut.clone().ok_or("a part that is not written back")?;
        let (op, rest) = match &cut {
            Cut::Slice(rest) => ("slice_scatter", rest),
            Cut::Select(rest) => ("select_scatter", rest),
        };
        let mut args = vec![Val::Tensor(p.base.clone()), Val::Tensor(value.clone())];
        args.extend(rest.iter().cloned());
        let Val::Tensor(new_base) = ops.call(op, &args, &[])? else {
            return Err(format!("{op} did not return a tensor"));
        };
        chain.push((value, Some(cut)));
        id = p.base.id();
        value = new_base;
    }
    Err("parts of parts nested deeper than the parts recorded".into())
}

/// `t` cut again from `new_root`, the new value of the tensor `root`, where `t` is a part of
/// `root` (through parts of parts) made before its update: `None` where `t` is no part of
/// `root`, an error where a cut on the way is not a slice or select (its old values would be
/// read). The new value is recorded as a part of the new root's parts, as the old one was.
pub fn cut_again(
    parts: &mut Parts,
    t: &Tensor,
    root: TensorId,
    new_root: &Tensor,
    ops: &Ops,
) -> Option<Result<Tensor, String>> {
    // The cuts from `t` up to `root`, `t`'s first.
    let mut cuts = Vec::new();
    let mut id = t.id();
    while id != root {
        let p = parts.get(&id)?;
        cuts.push(p.cut.clone());
        id = p.base.id();
        if cuts.len() > parts.len() {
            return None;
        }
    }
    let mut value = new_root.clone();
    for cut in cuts.into_iter().rev() {
        let Some(cut) = cut else {
            let what = "a part of it cut before the update, by an op whose parts are not \
                        written back, would keep its old values";
            return Some(Err(what.into()));
        };
        let (op, rest) = match &cut {
            Cut::Slice(rest) => ("slice", rest),
            Cut::Select(rest) => ("select", rest),
        };
        let mut args = vec![Val::Tensor(value.clone())];
        args.extend(rest.iter().cloned());
        let part = match ops.call(op, &args, &[]) {
            Ok(Val::Tensor(part)) => part,
            Ok(_) => return Some(Err(format!("{op} did not return a tensor"))),
            Err(e) => return Some(Err(e)),
        };
        let base = std::mem::replace(&mut value, part);
        if value.id() != base.id() {
            parts.insert(
                value.id(),
                Part {
                    base,
                    cut: Some(cut),
                },
            );
        }
    }
    Some(Ok(value))
}
