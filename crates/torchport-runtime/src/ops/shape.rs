//! Views and layout: view/reshape/flatten, permute/transpose, (un)squeeze, expand, slice,
//! select, cat/stack, split/tensor_split/chunk/unbind, repeat/tile, indexing (index, index_select, embedding,
//! gather), and tensor factories (arange, linspace, logspace, meshgrid, full, zeros/ones, triu/tril, sym_size).

use candle_core::{DType, Device, Tensor, D};

use super::{as_dtype, dim, scalar_tensor, usize_of, Registry};
use crate::dtype;
use crate::error::{OpError, OpResult};
use crate::op_bail;
use crate::value::{one, Args, Outputs, Scalar, Value};

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    for n in [
        "aten.view.default",
        "aten.reshape.default",
        "aten._unsafe_view.default",
    ] {
        r.add(n, view);
    }
    r.add("aten.flatten.using_ints", flatten);
    r.add("aten.permute.default", permute);
    r.add("aten.transpose.int", transpose);
    r.add("aten.swapaxes.default", transpose);
    r.add("aten.swapdims.default", transpose);
    r.add("aten.zero.default", |a| {
        one(a.tensor("self")?.zeros_like()?)
    });
    r.add("aten.t.default", |a| one(a.tensor("self")?.t()?));
    r.add("aten.numpy_T.default", |a| {
        let t = a.tensor("self")?;
        let dims: Vec<usize> = (0..t.rank()).rev().collect();
        one(t.permute(dims)?)
    });
    r.add("aten.unsqueeze.default", unsqueeze);
    r.add("aten.squeeze.dim", squeeze);
    r.add("aten.squeeze.dims", squeeze);
    r.add("aten.squeeze.default", squeeze);
    r.add("aten.expand.default", expand);
    r.add("aten.broadcast_to.default", expand);
    r.add("aten.expand_as.default", |a| {
        let other = a.tensor("other")?;
        one(a.tensor("self")?.broadcast_as(other.dims())?)
    });
    r.add("aten.slice.Tensor", slice);
    r.add("aten.select.int", select);
    r.add("aten.cat.default", cat);
    r.add("aten.concat.default", cat);
    r.add("aten.stack.default", stack);
    r.add("aten.split.Tensor", split);
    r.add("aten.split_with_sizes.default", split);
    r.add("aten.split.sizes", split);
    r.add("aten.tensor_split.indices", tensor_split);
    r.add("aten.tensor_split.sections", tensor_split);
    r.add("aten.tensor_split.tensor_indices_or_sections", tensor_split);
    // `.item()`: a one-element tensor's value as a SymInt / SymFloat / SymBool (`item` in
    // a plain export, `_local_scalar_dense` once decomposed).
    r.add("aten._local_scalar_dense.default", local_scalar);
    r.add("aten.item.default", local_scalar);
    // Every tensor the runtime holds starts at its storage's beginning, as torch's fresh ones.
    r.add("aten.sym_storage_offset.default", |_| {
        Ok(vec![Value::Int(0)])
    });
    r.add("aten.chunk.default", chunk);
    r.add("aten.unbind.int", unbind);
    r.add("aten.repeat.default", repeat);
    r.add("aten.tile.default", tile);
    r.add("aten.repeat_interleave.self_int", repeat_interleave);
    r.add("aten.repeat_interleave.self_Tensor", repeat_interleave);
    r.add("aten.repeat_interleave.Tensor", repeat_interleave);
    r.add("aten.unfold.default", unfold);
    r.add("aten.eye.default", eye);
    r.add("aten.eye.m", eye);
    r.add("aten.flip.default", flip);
    r.add("aten.index_select.default", index_select);
    r.add("aten.embedding.default", embedding);
    r.add("aten.gather.default", gather);
    r.add("aten.arange.default", arange);
    r.add("aten.arange.start", arange);
    r.add("aten.arange.start_step", arange);
    r.add("aten.linspace.default", linspace);
    r.add("aten.logspace.default", logspace);
    r.add("aten.meshgrid.default", meshgrid);
    r.add("aten.meshgrid.indexing", meshgrid);
    r.add("aten.full.default", full);
    r.add("aten.zeros.default", full);
    r.add("aten.ones.default", full);
    r.add("aten.scalar_tensor.default", full);
    r.add("aten.new_zeros.default", full);
    r.add("aten.new_ones.default", full);
    r.add("aten.new_full.default", full);
    r.add("aten.full_like.default", full_like);
    r.add("aten.zeros_like.default", full_like);
    r.add("aten.ones_like.default", full_like);
    // Uninitialized memory in torch; programs overwrite it, so zeros are as good.
    for n in [
        "aten.empty.memory_format",
        "aten.empty_permuted.default",
        "aten.empty_strided.default",
        "aten.new_empty.default",
        "aten.new_empty_strided.default",
    ] {
        r.add(n, full);
    }
    r.add("aten.empty_like.default", full_like);
    r.add("aten.triu.default", triu_tril);
    r.add("aten.tril.default", triu_tril);
    r.add("aten.sym_size.int", |a| {
        let t = a.tensor("self")?;
        let d = dim(a.int("dim")?, t.rank())?;
        Ok(vec![Value::Int(t.dims()[d] as i64)])
    });
}

/// Resolve a torch shape with at most one -1 against `numel` elements.
pub fn infer_shape(shape: &[i64], numel: usize) -> OpResult<Vec<usize>> {
    let mut known: usize = 1;
    let mut hole = None;
    for (i, &s) in shape.iter().enumerate() {
        if s == -1 {
            if hole.replace(i).is_some() {
                op_bail!("shape {shape:?} has more than one -1");
            }
        } else {
            known = known
                .checked_mul(usize_of(s, "a size")?)
                .ok_or_else(|| OpError(format!("shape {shape:?} is too large")))?;
        }
    }
    let mut out: Vec<usize> = shape.iter().map(|&s| s.max(0) as usize).collect();
    if let Some(i) = hole {
        if known == 0 || numel / known * known != numel {
            op_bail!("shape {shape:?} is invalid for {numel} elements");
        }
        out[i] = numel / known;
    } else if known != numel {
        op_bail!("shape {shape:?} is invalid for {numel} elements");
    }
    Ok(out)
}

fn view(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    // A view of a strided tensor is a copy here (as candle's `reshape` makes it): made on the
    // pool's threads where it can be.
    let t = if t.is_contiguous() {
        t
    } else {
        super::strided::contiguous_f32(&t).unwrap_or(t)
    };
    let shape = infer_shape(
        &a.ints(if a.has("size") { "size" } else { "shape" })?,
        t.elem_count(),
    )?;
    one(t.reshape(shape)?)
}

fn flatten(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    if t.rank() == 0 {
        return one(t.reshape(1)?);
    }
    let s = dim(a.int_or("start_dim", 0)?, t.rank())?;
    let e = dim(a.int_or("end_dim", -1)?, t.rank())?;
    one(t.flatten(s, e)?)
}

fn permute(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let dims = a
        .ints("dims")?
        .iter()
        .map(|&d| dim(d, t.rank()))
        .collect::<OpResult<Vec<_>>>()?;
    one(t.permute(dims)?)
}

fn transpose(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    // `swapaxes` names its dims axis0 / axis1; `transpose` and `swapdims` dim0 / dim1.
    let (n0, n1) = if a.has("axis0") {
        ("axis0", "axis1")
    } else {
        ("dim0", "dim1")
    };
    let d0 = dim(a.int(n0)?, t.rank())?;
    let d1 = dim(a.int(n1)?, t.rank())?;
    one(t.transpose(d0, d1)?)
}

fn unsqueeze(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let d = dim(a.int("dim")?, t.rank() + 1)?;
    one(t.unsqueeze(d)?)
}

fn squeeze(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let dims: Vec<usize> = if a.has("dim") {
        a.ints("dim")?
            .iter()
            .map(|&d| dim(d, t.rank()))
            .collect::<OpResult<_>>()?
    } else {
        (0..t.rank()).collect()
    };
    let shape: Vec<usize> = t
        .dims()
        .iter()
        .enumerate()
        .filter(|(i, &s)| !(s == 1 && dims.contains(i)))
        .map(|(_, &s)| s)
        .collect();
    one(t.reshape(shape)?)
}

/// `_local_scalar_dense(self)` / `item(self)`: the value of a one-element tensor, a bool, int
/// or float by its dtype.
fn local_scalar(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    if t.elem_count() != 1 {
        op_bail!("item() of a tensor of {} elements", t.elem_count());
    }
    let t = t.flatten_all()?;
    Ok(vec![match t.dtype() {
        DType::U8 => Value::Bool(t.to_vec1::<u8>()?[0] != 0),
        DType::I64 => Value::Int(t.to_vec1::<i64>()?[0]),
        _ => Value::Float(t.to_dtype(DType::F64)?.to_vec1::<f64>()?[0]),
    }])
}

fn expand(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let size = a.ints("size")?;
    if size.len() < t.rank() {
        op_bail!(
            "expand to {size:?} has fewer dims than the tensor ({:?})",
            t.dims()
        );
    }
    let lead = size.len() - t.rank();
    let shape = size
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            if s == -1 {
                if i < lead {
                    op_bail!("expand size -1 is not allowed for a new leading dim");
                }
                Ok(t.dims()[i - lead])
            } else {
                usize_of(s, "an expand size")
            }
        })
        .collect::<OpResult<Vec<_>>>()?;
    one(t.broadcast_as(shape)?)
}

/// Clamp a Python-style slice bound to `[0, len]`.
fn bound(v: i64, len: usize) -> usize {
    let l = len as i64;
    let v = if v < 0 { v + l } else { v };
    v.clamp(0, l) as usize
}

fn slice(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let d = dim(a.int_or("dim", 0)?, t.rank())?;
    let len = t.dims()[d];
    let start = bound(a.opt_int("start")?.unwrap_or(0), len);
    let end = bound(a.opt_int("end")?.unwrap_or(i64::MAX).min(len as i64), len).max(start);
    let step = usize_of(a.int_or("step", 1)?, "slice step")?;
    if step == 0 {
        op_bail!("slice step must be positive");
    }
    let n = end - start;
    let s = t.narrow(d, start, n)?;
    if step == 1 {
        return one(s);
    }
    if let Some(y) = stepped_f32(&t, d, start, step, n.div_ceil(step)) {
        return one(y);
    }
    let idx: Vec<i64> = (0..n).step_by(step).map(|i| i as i64).collect();
    let ids = Tensor::new(idx.as_slice(), &Device::Cpu)?;
    one(s.contiguous()?.index_select(&ids, d)?)
}

/// `t[.., start::step, ..]` (`count` positions along dim `d`) of an f32 tensor as a new
/// contiguous tensor, the rows copied in parallel (a rotary embedding's `x[..., ::2]` is one
/// per attention): the input laid out `[outer, len, inner]` (copied so first if a view).
/// `None` for other dtypes.
fn stepped_f32(t: &Tensor, d: usize, start: usize, step: usize, count: usize) -> Option<Tensor> {
    let t = super::strided::contiguous_f32(t)?;
    let len = t.dims()[d];
    let inner: usize = t.dims()[d + 1..].iter().product();
    let outer: usize = t.dims()[..d].iter().product();
    if count == 0 || inner == 0 || start + (count - 1) * step >= len {
        return None;
    }
    let mut shape = t.dims().to_vec();
    shape[d] = count;
    let row = count * inner;
    let y = super::fused::with_f32(&t, |src| {
        let task = |at: usize, out: &mut [std::mem::MaybeUninit<f32>]| {
            for (r, o) in out.chunks_mut(row).enumerate() {
                let base = &src[(at / row + r) * len * inner..][..len * inner];
                if inner == 1 {
                    // Along the last dim: one value per position.
                    for (i, oi) in o.iter_mut().enumerate() {
                        oi.write(base[start + i * step]);
                    }
                    continue;
                }
                for (i, oi) in o.chunks_mut(inner).enumerate() {
                    let from = &base[(start + i * step) * inner..][..inner];
                    super::fused::put(oi, from);
                }
            }
        };
        let rows = ((1 << 14) / row).max(1);
        // SAFETY: each chunk holds whole rows of `count * inner` values, and `put` writes
        // every value of each.
        #[allow(unsafe_code)]
        unsafe {
            super::fused::written(outer * row, rows * row, task)
        }
    })?;
    Tensor::from_vec(y, shape, t.device()).ok()
}

fn select(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let d = dim(a.int("dim")?, t.rank())?;
    let len = t.dims()[d];
    let i = a.int("index")?;
    let i = if i < 0 { i + len as i64 } else { i };
    if i < 0 || i as usize >= len {
        op_bail!("index {i} is out of range for dim {d} of size {len}");
    }
    one(t.narrow(d, i as usize, 1)?.squeeze(d)?)
}

fn cat(a: &Args) -> OpResult<Outputs> {
    let ts = a.tensors("tensors")?;
    // torch skips legacy empty 1-d tensors in cat.
    let ts: Vec<Tensor> = ts
        .into_iter()
        .filter(|t| !(t.rank() == 1 && t.dims()[0] == 0))
        .collect();
    let Some(first) = ts.first() else {
        op_bail!("cat of no tensors");
    };
    let d = dim(a.int_or("dim", 0)?, first.rank())?;
    let dt = ts
        .iter()
        .fold(first.dtype(), |acc, t| super::promote(acc, t.dtype()));
    let ts = ts
        .iter()
        .map(|t| as_dtype(t, dt))
        .collect::<OpResult<Vec<_>>>()?;
    match strided_cat(&ts, d) {
        Some(t) => one(t),
        None => one(Tensor::cat(&ts, d)?),
    }
}

/// [`super::strided::cat`] for the dtypes it is compiled for (by the first tensor's; `None`
/// for others, and where it declines).
pub(super) fn strided_cat(ts: &[Tensor], d: usize) -> Option<Tensor> {
    match ts.first()?.dtype() {
        DType::F32 => super::strided::cat::<f32>(ts, d),
        DType::F64 => super::strided::cat::<f64>(ts, d),
        DType::I64 => super::strided::cat::<i64>(ts, d),
        DType::U8 => super::strided::cat::<u8>(ts, d),
        _ => None,
    }
}

fn stack(a: &Args) -> OpResult<Outputs> {
    let ts = a.tensors("tensors")?;
    let Some(first) = ts.first() else {
        op_bail!("stack of no tensors");
    };
    let d = dim(a.int_or("dim", 0)?, first.rank() + 1)?;
    // As a cat of each tensor with a new dim of one: `cat`'s kernel reads any layout, on
    // the pool's threads (candle's stack copies on one).
    let parts = ts
        .iter()
        .map(|t| t.unsqueeze(d))
        .collect::<Result<Vec<_>, _>>()?;
    match strided_cat(&parts, d) {
        Some(t) => one(t),
        None => one(Tensor::stack(&ts, d)?),
    }
}

fn split(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let d = dim(a.int_or("dim", 0)?, t.rank())?;
    let len = t.dims()[d];
    let target = a.node().target.as_str();
    // The sizes given as a list: `split_with_sizes`, and TorchScript's `split.sizes`.
    let listed = if target.contains("split_with_sizes") {
        Some("split_sizes")
    } else if target.ends_with("split.sizes") {
        Some("split_size")
    } else {
        None
    };
    let sizes: Vec<usize> = if let Some(name) = listed {
        a.ints(name)?
            .iter()
            .map(|&s| usize_of(s, "a split size"))
            .collect::<OpResult<_>>()?
    } else {
        let s = usize_of(a.int("split_size")?, "split size")?.max(1);
        let mut v = vec![s; len / s];
        if len % s != 0 {
            v.push(len % s);
        }
        v
    };
    split_into(&t, d, &sizes)
}

/// `tensor_split(self, indices | sections, dim=0)`: pieces between the indices (as Python
/// slices: negative ones count from the end, all clamped to the dim), or `sections` pieces
/// whose sizes differ by at most one, the larger first.
fn tensor_split(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let d = dim(a.int_or("dim", 0)?, t.rank())?;
    let len = t.dims().get(d).copied().unwrap_or(1);
    // The tensor form: a 0-d tensor of sections or a 1-d tensor of indices.
    let given = if a.has("tensor_indices_or_sections") {
        let v = a.tensor("tensor_indices_or_sections")?;
        let ints = v.to_dtype(DType::I64)?.flatten_all()?.to_vec1::<i64>()?;
        Some((v.rank() == 0, ints))
    } else {
        None
    };
    let sizes: Vec<usize> = if a.has("sections") || given.as_ref().is_some_and(|g| g.0) {
        let n = match &given {
            Some((_, v)) => usize_of(v[0], "sections")?,
            None => usize_of(a.int("sections")?, "sections")?,
        };
        if n == 0 || n > 1 << 24 {
            op_bail!("tensor_split into {n} sections");
        }
        (0..n).map(|i| len / n + usize::from(i < len % n)).collect()
    } else {
        let mut sizes = Vec::new();
        let mut prev = 0usize;
        let indices = match given {
            Some((_, v)) => v,
            None => a.ints("indices")?,
        };
        for i in indices {
            let i = if i < 0 { i + len as i64 } else { i };
            let i = (i.clamp(0, len as i64) as usize).max(prev);
            sizes.push(i - prev);
            prev = i;
        }
        sizes.push(len - prev);
        sizes
    };
    split_into(&t, d, &sizes)
}

fn split_into(t: &Tensor, d: usize, sizes: &[usize]) -> OpResult<Outputs> {
    let mut out = Vec::with_capacity(sizes.len());
    let mut start = 0;
    for &s in sizes {
        out.push(t.narrow(d, start, s)?);
        start += s;
    }
    if start != t.dims()[d] {
        op_bail!("split sizes {sizes:?} do not add up to {}", t.dims()[d]);
    }
    Ok(vec![Value::Tensors(out)])
}

fn chunk(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let d = dim(a.int_or("dim", 0)?, t.rank())?;
    let n = usize_of(a.int("chunks")?, "chunks")?.max(1);
    let len = t.dims()[d];
    let each = len.div_ceil(n).max(1);
    let mut sizes = Vec::new();
    let mut left = len;
    while left > 0 {
        let s = each.min(left);
        sizes.push(s);
        left -= s;
    }
    split_into(&t, d, &sizes)
}

fn unbind(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let d = dim(a.int_or("dim", 0)?, t.rank())?;
    let out = (0..t.dims()[d])
        .map(|i| Ok(t.narrow(d, i, 1)?.squeeze(d)?))
        .collect::<OpResult<Vec<_>>>()?;
    Ok(vec![Value::Tensors(out)])
}

fn repeat(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let reps = a.ints("repeats")?;
    if reps.len() < t.rank() {
        op_bail!("repeat needs at least {} counts", t.rank());
    }
    one(repeated(&t, &reps)?)
}

/// `tile(self, dims)`: `repeat` with `dims` led by ones up to `self`'s rank (what TorchScript
/// calls; an export writes `repeat`).
fn tile(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let dims = a.ints("dims")?;
    let mut reps = vec![1; t.rank().saturating_sub(dims.len())];
    reps.extend(dims);
    one(repeated(&t, &reps)?)
}

/// `t` (of at most `reps.len()` dims, led by ones up to that) repeated `reps[d]` times along
/// each dim `d`.
fn repeated(t: &Tensor, reps: &[i64]) -> OpResult<Tensor> {
    let mut shape = vec![1usize; reps.len() - t.rank()];
    shape.extend_from_slice(t.dims());
    let counts = reps
        .iter()
        .map(|&r| usize_of(r, "a repeat count"))
        .collect::<OpResult<Vec<usize>>>()?;
    let out: Vec<usize> = shape
        .iter()
        .zip(&counts)
        .map(|(&d, &r)| d.saturating_mul(r))
        .collect();
    super::result_numel(&out, "repeat")?;
    let mut t = t.reshape(shape)?;
    for (d, &r) in counts.iter().enumerate() {
        if r != 1 {
            let copies = vec![t.clone(); r];
            t = Tensor::cat(&copies, d)?;
        }
    }
    Ok(t)
}

/// Indices as i64, negative ones wrapped by `len`.
fn wrap_indices(idx: &Tensor, len: usize) -> OpResult<Tensor> {
    if idx.dtype() == DType::U8 {
        op_bail!("boolean mask indexing is not supported");
    }
    let idx = as_dtype(idx, DType::I64)?;
    let neg = idx.lt(&idx.zeros_like()?)?;
    let wrapped = idx.broadcast_add(&scalar_tensor(Scalar::Int(len as i64), DType::I64)?)?;
    let idx = neg.where_cond(&wrapped, &idx)?;
    let v = idx.flatten_all()?.to_vec1::<i64>()?;
    if let Some(bad) = v.iter().find(|&&i| i < 0 || i as usize >= len) {
        op_bail!("index {bad} is out of range for a dim of size {len}");
    }
    Ok(idx)
}

/// `x[..., idx, ...]` along one dim with an index tensor of any shape.
pub fn take(t: &Tensor, idx: &Tensor, d: usize) -> OpResult<Tensor> {
    if t.rank() == 0 {
        // A 0-d tensor indexed along "dim 0" (as torch allows) gives itself, 0-d.
        wrap_indices(idx, 1)?;
        return Ok(t.clone());
    }
    let idx = wrap_indices(idx, t.dims()[d])?;
    let flat = idx.flatten_all()?;
    let picked = t.contiguous()?.index_select(&flat, d)?;
    let mut shape: Vec<usize> = t.dims()[..d].to_vec();
    shape.extend_from_slice(idx.dims());
    shape.extend_from_slice(&t.dims()[d + 1..]);
    Ok(picked.reshape(shape)?)
}

fn index_select(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let d = dim(a.int("dim")?, t.rank())?;
    one(take(&t, &a.tensor("index")?, d)?)
}

fn embedding(a: &Args) -> OpResult<Outputs> {
    let w = a.tensor("weight")?;
    one(take(&w, &a.tensor("indices")?, 0)?)
}

fn gather(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let d = dim(a.int("dim")?, t.rank())?;
    if t.rank() == 0 {
        wrap_indices(&a.tensor("index")?, 1)?;
        return one(t);
    }
    let idx = wrap_indices(&a.tensor("index")?, t.dims()[d])?;
    one(t.contiguous()?.gather(&idx.contiguous()?, d)?)
}

/// `linspace(start, end, steps, dtype)`: `steps` evenly spaced values, filled from both ends
/// as torch does (the first half `start + i·step`, the second `end - (steps-1-i)·step`).
fn linspace(a: &Args) -> OpResult<Outputs> {
    spaced(a, None)
}

/// `logspace(start, end, steps, base=10.0, dtype=None)`: `base` to the powers of
/// `linspace(start, end, steps)`.
fn logspace(a: &Args) -> OpResult<Outputs> {
    spaced(a, Some(a.float_or("base", 10.0)?))
}

/// `steps` evenly spaced values from `start` to `end` (the first half counted from `start`,
/// the rest back from `end`, as torch does), each `base` to that power where there is one.
fn spaced(a: &Args, base: Option<f64>) -> OpResult<Outputs> {
    let (s, e) = (a.scalar("start")?.as_f64(), a.scalar("end")?.as_f64());
    let n = a.int("steps")?;
    if !(0..=1 << 30).contains(&n) {
        op_bail!(
            "{}space of {n} steps",
            if base.is_some() { "log" } else { "lin" }
        );
    }
    let n = n as usize;
    let st = a.opt_scalar_type("dtype")?.unwrap_or(dtype::FLOAT);
    let step = if n > 1 { (e - s) / (n - 1) as f64 } else { 0.0 };
    let v: Vec<f64> = (0..n)
        .map(|i| {
            if i < n / 2 {
                s + i as f64 * step
            } else {
                e - (n - 1 - i) as f64 * step
            }
        })
        .map(|x| base.map_or(x, |b| b.powf(x)))
        .collect();
    let t = Tensor::from_vec(v, n, &Device::Cpu)?;
    one(dtype::cast(&t, st)?)
}

/// `meshgrid(tensors, indexing="ij")`: the 0-d or 1-d inputs expanded over the grid of all
/// their sizes ("xy" swaps the first two dims).
fn meshgrid(a: &Args) -> OpResult<Outputs> {
    let ts = a.tensors("tensors")?;
    let xy = match a.str_or("indexing", "ij")? {
        "ij" => false,
        "xy" => true,
        m => op_bail!("meshgrid indexing '{m}'"),
    };
    if ts.iter().any(|t| t.rank() > 1) {
        op_bail!("meshgrid takes 0-d or 1-d tensors");
    }
    let mut sizes: Vec<usize> = ts.iter().map(|t| t.elem_count()).collect();
    if xy && sizes.len() >= 2 {
        sizes.swap(0, 1);
    }
    let out = ts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let mut at = i;
            if xy && sizes.len() >= 2 && i < 2 {
                at = 1 - i;
            }
            let mut shape = vec![1usize; sizes.len()];
            shape[at] = t.elem_count();
            Ok(t.reshape(shape)?
                .broadcast_as(sizes.as_slice())?
                .contiguous()?)
        })
        .collect::<OpResult<Vec<_>>>()?;
    Ok(vec![Value::Tensors(out)])
}

fn arange(a: &Args) -> OpResult<Outputs> {
    let (start, end) = if a.has("start") {
        (a.scalar("start")?, a.scalar("end")?)
    } else {
        (Scalar::Int(0), a.scalar("end")?)
    };
    let step = a.scalar_or("step", Scalar::Int(1))?;
    let is_int = |s: Scalar| matches!(s, Scalar::Int(_));
    let st =
        a.opt_scalar_type("dtype")?
            .unwrap_or(if is_int(start) && is_int(end) && is_int(step) {
                dtype::LONG
            } else {
                dtype::FLOAT
            });
    let (s, e, k) = (start.as_f64(), end.as_f64(), step.as_f64());
    if k == 0.0 {
        op_bail!("arange step must be non-zero");
    }
    let n = ((e - s) / k).ceil().max(0.0);
    if n > 1e9 {
        op_bail!("arange of {n} elements is too large");
    }
    let n = n as usize;
    let t = if st == dtype::DOUBLE {
        let v: Vec<f64> = (0..n).map(|i| s + i as f64 * k).collect();
        Tensor::from_vec(v, n, &Device::Cpu)?
    } else if dtype::is_float(st) {
        let v: Vec<f32> = (0..n).map(|i| (s + i as f64 * k) as f32).collect();
        Tensor::from_vec(v, n, &Device::Cpu)?
    } else {
        let v: Vec<i64> = (0..n).map(|i| (s + i as f64 * k) as i64).collect();
        Tensor::from_vec(v, n, &Device::Cpu)?
    };
    one(dtype::cast(&t, st)?)
}

fn fill(shape: &[usize], v: Scalar, st: Option<i64>) -> OpResult<Tensor> {
    let st = st.unwrap_or(match v {
        Scalar::Int(_) => dtype::LONG,
        Scalar::Float(_) => dtype::FLOAT,
        Scalar::Bool(_) => dtype::BOOL,
    });
    let d = dtype::runtime(st)?;
    let t = scalar_tensor(v, d)?.broadcast_as(shape)?.contiguous()?;
    dtype::cast(&t, st)
}

fn full(a: &Args) -> OpResult<Outputs> {
    let target = a.node().target.as_str();
    let shape: Vec<usize> = if target.contains("scalar_tensor") {
        vec![]
    } else {
        a.ints("size")?
            .iter()
            .map(|&s| usize_of(s, "a size"))
            .collect::<OpResult<_>>()?
    };
    let v = if target.contains("zeros") || target.contains("empty") {
        Scalar::Int(0)
    } else if target.contains("ones") {
        Scalar::Int(1)
    } else if target.contains("scalar_tensor") {
        a.scalar("s")?
    } else {
        a.scalar("fill_value")?
    };
    let mut st = a.opt_scalar_type("dtype")?;
    if st.is_none() && target.contains("new_") {
        st = Some(dtype::of_runtime(a.tensor("self")?.dtype()));
    }
    if st.is_none()
        && (target.contains("zeros") || target.contains("ones") || target.contains("empty"))
    {
        st = Some(dtype::FLOAT);
    }
    if st.is_none() && target.contains("scalar_tensor") {
        st = Some(dtype::FLOAT);
    }
    one(fill(&shape, v, st)?)
}

fn full_like(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let target = a.node().target.as_str();
    let v = if target.contains("zeros") || target.contains("empty") {
        Scalar::Int(0)
    } else if target.contains("ones") {
        Scalar::Int(1)
    } else {
        a.scalar("fill_value")?
    };
    let st = a
        .opt_scalar_type("dtype")?
        .unwrap_or(dtype::of_runtime(t.dtype()));
    one(fill(t.dims(), v, Some(st))?)
}

fn triu_tril(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    if t.rank() < 2 {
        op_bail!("triu/tril needs a tensor of rank >= 2");
    }
    let k = a.int_or("diagonal", 0)?;
    let (r, c) = (t.dim(D::Minus2)?, t.dim(D::Minus1)?);
    let rows = Tensor::arange(0i64, r as i64, &Device::Cpu)?.reshape((r, 1))?;
    let cols = Tensor::arange(0i64, c as i64, &Device::Cpu)?.reshape((1, c))?;
    let diff = cols.broadcast_sub(&rows)?; // j - i
    let kk = Tensor::new(k, &Device::Cpu)?;
    let keep = if a.node().target.contains("triu") {
        diff.broadcast_ge(&kk)?
    } else {
        diff.broadcast_le(&kk)?
    };
    let zero = t.zeros_like()?;
    let keep = keep.broadcast_as(t.shape())?;
    one(keep.where_cond(&t, &zero)?)
}

fn flip(a: &Args) -> OpResult<Outputs> {
    let mut t = a.tensor("self")?;
    for d in a.ints("dims")? {
        let d = dim(d, t.rank())?;
        let n = t.dims()[d] as i64;
        let idx: Vec<i64> = (0..n).rev().collect();
        let ids = Tensor::new(idx.as_slice(), &Device::Cpu)?;
        t = t.contiguous()?.index_select(&ids, d)?;
    }
    one(t)
}

/// `repeat_interleave(self, repeats, dim=None, output_size=None)`: each element (of `dim`,
/// or of the flattened tensor) repeated `repeats` times — one count for all, or one each.
fn repeat_interleave(a: &Args) -> OpResult<Outputs> {
    // `repeat_interleave(repeats)` alone repeats the positions 0, 1, …
    let t = if a.has("self") {
        a.tensor("self")?
    } else {
        let n = a.tensor("repeats")?.elem_count();
        Tensor::arange(0i64, n as i64, &a.device())?
    };
    let (t, d) = match a.opt_int("dim")? {
        Some(d) => {
            let d = dim(d, t.rank())?;
            (t, d)
        }
        None => (t.flatten_all()?, 0),
    };
    let n = t.dims().get(d).copied().unwrap_or(1);
    let counts: Vec<i64> = match a.tensor_or_scalar("repeats")? {
        crate::value::TensorOrScalar::Tensor(r) => {
            let v = r.to_dtype(DType::I64)?.flatten_all()?.to_vec1::<i64>()?;
            if v.len() == 1 {
                vec![v[0]; n]
            } else {
                v
            }
        }
        crate::value::TensorOrScalar::Scalar(crate::value::Scalar::Int(c)) => vec![c; n],
        crate::value::TensorOrScalar::Scalar(s) => {
            op_bail!("repeat_interleave: repeats {s:?} is not an int")
        }
    };
    if counts.len() != n || counts.iter().any(|&c| c < 0) {
        op_bail!(
            "repeat_interleave: {} non-negative repeats needed for a dim of size {n}",
            n
        );
    }
    let total = counts
        .iter()
        .try_fold(0usize, |s, &c| s.checked_add(c as usize));
    if total.is_none_or(|t| t > (1 << 40)) {
        op_bail!("repeat_interleave result is too large");
    }
    let idx: Vec<i64> = counts
        .iter()
        .enumerate()
        .flat_map(|(i, &c)| std::iter::repeat_n(i as i64, c as usize))
        .collect();
    let len = idx.len();
    one(t
        .contiguous()?
        .index_select(&Tensor::from_vec(idx, len, t.device())?, d)?)
}

/// `unfold(self, dimension, size, step)`: windows of `size` along `dimension`, every `step`,
/// as a new last dim (the dim becomes the window count).
fn unfold(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let d = dim(a.int("dimension")?, t.rank())?;
    let size = usize_of(a.int("size")?, "size")?;
    let step = usize_of(a.int("step")?, "step")?;
    let n = t.dims().get(d).copied().unwrap_or(1);
    if step == 0 || size > n {
        op_bail!("unfold: size {size} and step {step} do not fit a dim of size {n}");
    }
    let windows = (n - size) / step + 1;
    let idx: Vec<i64> = (0..windows)
        .flat_map(|w| (0..size).map(move |j| (w * step + j) as i64))
        .collect();
    let len = idx.len();
    if t.rank() == 0 {
        // A 0-d tensor is one window of its one element.
        return one(t.reshape(1)?);
    }
    let g = t
        .contiguous()?
        .index_select(&Tensor::from_vec(idx, len, t.device())?, d)?;
    // [.., windows * size, ..] -> [.., windows, size, ..] -> size moved last.
    let mut shape = g.dims().to_vec();
    shape.splice(d..=d, [windows, size]);
    let g = g.reshape(shape)?;
    let mut perm: Vec<usize> = (0..g.rank()).filter(|&i| i != d + 1).collect();
    perm.push(d + 1);
    one(g.permute(perm)?.contiguous()?)
}

/// `eye(n, m=n, dtype)`: ones on the diagonal.
fn eye(a: &Args) -> OpResult<Outputs> {
    let n = usize_of(a.int("n")?, "n")?;
    let m = match a.opt_int("m")? {
        Some(m) => usize_of(m, "m")?,
        None => n,
    };
    if n.checked_mul(m).is_none_or(|e| e > (1 << 32)) {
        op_bail!("eye({n}, {m}) is too large");
    }
    let v: Vec<f32> = (0..n * m)
        .map(|i| f32::from(u8::from(i / m == i % m)))
        .collect();
    let t = Tensor::from_vec(v, (n, m), &a.device())?;
    one(match a.opt_scalar_type("dtype")? {
        Some(st) => crate::dtype::cast(&t, st)?,
        None => t,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1().unwrap()
    }

    /// Repeat counts whose result would not fit (a hostile program's) are one error, before
    /// any copy is made.
    #[test]
    fn repeat_and_tile_refuse_results_too_large() {
        let x = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
        for (op, name) in [
            ("aten.repeat.default", "repeats"),
            ("aten.tile.default", "dims"),
        ] {
            let args = [
                ("self", serde_json::json!({"as_tensor": {"name": "x"}})),
                (
                    name,
                    serde_json::json!({"as_ints": [1i64 << 40, 1i64 << 40]}),
                ),
            ];
            match super::super::run_node(register, op, &args, &[("x", x.clone())]) {
                Err(e) => assert!(e.0.contains("too large"), "{op}: {}", e.0),
                Ok(_) => panic!("{op}: computed"),
            }
        }
    }

    /// Every `step`-th position from `start`, along the last dim and a middle one, of a
    /// tensor and of a transposed view, large enough to be split across threads: candle's
    /// `index_select` of the same positions.
    #[test]
    fn stepped_slices_are_the_positions_they_name() {
        let x = Tensor::randn(0f32, 1., (6, 40, 64), &Device::Cpu).unwrap();
        for t in [x.clone(), x.transpose(1, 2).unwrap()] {
            for (d, start, step) in [(2, 0, 2), (2, 1, 2), (1, 3, 5), (2, 5, 7)] {
                let len = t.dims()[d];
                let count = (len - start).div_ceil(step);
                let got = stepped_f32(&t, d, start, step, count).unwrap();
                let idx: Vec<i64> = (0..count).map(|i| (start + i * step) as i64).collect();
                let ids = Tensor::new(idx.as_slice(), &Device::Cpu).unwrap();
                let want = t.contiguous().unwrap().index_select(&ids, d).unwrap();
                assert_eq!(got.dims(), want.dims());
                assert_eq!(values(&got), values(&want), "dim {d}, {start}::{step}");
            }
        }
    }
}
