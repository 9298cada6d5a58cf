//! Matrix products: linear, addmm, mm, bmm, matmul (with torch's 1-d and broadcasting rules),
//! baddbmm, the grouped (mixture-of-experts) products (`_grouped_mm`, transformers' fallback),
//! and triangular solves (`linalg_solve_triangular`). Integer (int64) products are computed exactly, with int64's wrapping arithmetic
//! as torch does; floats go through the f32 GEMM.

use candle_core::{DType, Shape, Tensor};

use super::fused::with_storage;
use super::sgemm::{self, Mat};
use super::strided::offset;
use super::{float, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs};

/// `beta · input + alpha · (m1 @ m2)` exactly in int64 (wrapping), input broadcast.
fn int_addmm(input: &Tensor, m1: &Tensor, m2: &Tensor, alpha: i64, beta: i64) -> OpResult<Tensor> {
    let p = int_mm(m1, m2)?;
    super::integer::map_i64(&p, input, |x, b| {
        // torch ignores `input` when beta is 0.
        let b = if beta == 0 { 0 } else { b.wrapping_mul(beta) };
        Ok(x.wrapping_mul(alpha).wrapping_add(b))
    })
}

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
    // transformers' mixture-of-experts product (its CPU and float32 path): `torch.ops.
    // transformers.grouped_mm_fallback(input, weight, offs)`.
    r.add("transformers.grouped_mm_fallback.default", grouped_mm);
    r.add("aten._grouped_mm.default", aten_grouped_mm);
    r.add("aten.linalg_solve_triangular.default", solve_triangular);
}

/// `grouped_mm_fallback(input [S, K], weight [E, K, N], offs [E])`: transformers' name for
/// [`aten_grouped_mm`]'s 2-d × 3-d case.
fn grouped_mm(a: &Args) -> OpResult<Outputs> {
    let x = float(&a.tensor("input")?)?;
    let w = super::as_dtype(&a.tensor("weight")?, x.dtype())?;
    let offs = a.tensor("offs")?;
    one(grouped_rows(&x, &w, &offsets(&offs)?)?)
}

/// `_grouped_mm(self, mat2, offs=None, bias=None, out_dtype=None)` (mixture-of-experts
/// products, `torch._grouped_mm`), as torch's CPU kernel computes it. `offs` holds the ends
/// of the groups along the dim one operand splits:
/// - 2-d `[S, K]` × 3-d `[G, K, N]`: rows `offs[g-1]..offs[g]` times `mat2[g]`, `[S, N]`
///   (rows past the last offset zeros; torch leaves them unwritten);
/// - 3-d `[G, M, K]` × 2-d `[K, T]`: `self[g]` times columns `offs[g-1]..offs[g]`, `[M, T]`
///   (the rows case, transposed);
/// - 2-d `[M, T]` × 2-d `[T, N]`: the product over `offs[g-1]..offs[g]` of `T`, `[G, M, N]`
///   (an empty group gives zeros);
/// - 3-d × 3-d without offsets: `bmm`.
fn aten_grouped_mm(a: &Args) -> OpResult<Outputs> {
    if a.opt_tensor("bias")?.is_some() {
        op_bail!("_grouped_mm with a bias (torch's CPU kernel has none)");
    }
    let x = float(&a.tensor("self")?)?;
    let w = super::as_dtype(&a.tensor("mat2")?, x.dtype())?;
    let offs = a.opt_tensor("offs")?.map(|t| offsets(&t)).transpose()?;
    let out = match (x.rank(), w.rank(), offs) {
        (3, 3, None) if x.dim(0)? == w.dim(0)? => mm(&x, &w)?,
        (2, 3, Some(o)) => grouped_rows(&x, &w, &o)?,
        // Columns by group are the rows by group of the transposed product.
        (3, 2, Some(o)) => grouped_rows(&w.t()?, &x.transpose(1, 2)?, &o)?.t()?,
        (2, 2, Some(o)) if x.dim(1)? == w.dim(0)? => {
            let (m, n) = (x.dim(0)?, w.dim(1)?);
            let mut parts = Vec::new();
            for r in segments(&o, x.dim(1)?)? {
                parts.push(match r.is_empty() {
                    true => Tensor::zeros((m, n), x.dtype(), x.device())?,
                    false => mm(
                        &x.narrow(1, r.start, r.len())?,
                        &w.narrow(0, r.start, r.len())?,
                    )?,
                });
            }
            if parts.is_empty() {
                Tensor::zeros((0, m, n), x.dtype(), x.device())?
            } else {
                Tensor::stack(&parts, 0)?
            }
        }
        (_, _, o) => op_bail!(
            "_grouped_mm of {:?} and {:?} {} offsets",
            x.dims(),
            w.dims(),
            o.map_or("without".to_string(), |o| format!("with {}", o.len()))
        ),
    };
    match a.opt_scalar_type("out_dtype")? {
        Some(st) => one(crate::dtype::cast(&out, st)?),
        None => one(out),
    }
}

/// `linalg_solve_triangular(self, B, upper, left=True, unitriangular=False)`: `X` with
/// `self @ X = B` (`X @ self = B` when not `left`), `self` read as triangular (its upper or
/// lower triangle; a diagonal of ones where `unitriangular`), batch dims broadcast. Solved by
/// substitution in f64 and rounded to the inputs' dtype (transformers' gated delta rule
/// solves its chunks' unit lower-triangular systems so).
fn solve_triangular(a: &Args) -> OpResult<Outputs> {
    let m = float(&a.tensor("self")?)?;
    let b = super::as_dtype(&a.tensor("B")?, m.dtype())?;
    let (upper, left) = (a.bool_or("upper", false)?, a.bool_or("left", true)?);
    let unit = a.bool_or("unitriangular", false)?;
    let (rm, rb) = (m.rank(), b.rank());
    if rm < 2 || rb < 2 || m.dim(rm - 1)? != m.dim(rm - 2)? {
        op_bail!(
            "linalg_solve_triangular of {:?} and {:?} (a square matrix or batch of them, and a \
             matrix or batch)",
            m.dims(),
            b.dims()
        );
    }
    // `X @ A = B` is `A.T @ X.T = B.T`, the other triangle.
    let (m, b, upper) = match left {
        true => (m, b, upper),
        false => (
            m.transpose(rm - 2, rm - 1)?,
            b.transpose(rb - 2, rb - 1)?,
            !upper,
        ),
    };
    let n = m.dim(rm - 1)?;
    let k = b.dim(rb - 1)?;
    if b.dim(rb - 2)? != n {
        op_bail!(
            "linalg_solve_triangular: a {n}x{n} system and a right side of {:?}",
            b.dims()
        );
    }
    let batch = Shape::from(&m.dims()[..rm - 2])
        .broadcast_shape_binary_op(&Shape::from(&b.dims()[..rb - 2]), "solve_triangular")?;
    let values = |t: &Tensor, cols: usize| -> OpResult<Vec<f64>> {
        let mut dims = batch.dims().to_vec();
        dims.extend([n, cols]);
        Ok(t.broadcast_as(dims)?
            .to_dtype(DType::F64)?
            .flatten_all()?
            .to_vec1::<f64>()?)
    };
    let (mv, mut x) = (values(&m, n)?, values(&b, k)?);
    // Each row from those already solved: downwards for a lower triangle, up for an upper.
    let rows: Vec<usize> = match upper {
        true => (0..n).rev().collect(),
        false => (0..n).collect(),
    };
    for (sys, x) in mv.chunks_exact(n * n).zip(x.chunks_exact_mut(n * k)) {
        for &i in &rows {
            let known = match upper {
                true => i + 1..n,
                false => 0..i,
            };
            for c in 0..k {
                let mut v = x[i * k + c];
                for j in known.clone() {
                    v -= sys[i * n + j] * x[j * k + c];
                }
                x[i * k + c] = if unit { v } else { v / sys[i * n + i] };
            }
        }
    }
    let mut dims = batch.dims().to_vec();
    dims.extend([n, k]);
    let out = Tensor::from_vec(x, dims, m.device())?.to_dtype(m.dtype())?;
    match left {
        true => one(out),
        false => one(out
            .transpose(rb.max(rm) - 2, rb.max(rm) - 1)?
            .contiguous()?),
    }
}

/// The group ends an `offs` tensor holds.
fn offsets(offs: &Tensor) -> OpResult<Vec<i64>> {
    Ok(offs.to_dtype(DType::I64)?.flatten_all()?.to_vec1::<i64>()?)
}

/// The ranges `offs` (group ends) cut from `0..len`: an error unless they never decrease
/// and stay within `len`.
fn segments(offs: &[i64], len: usize) -> OpResult<Vec<std::ops::Range<usize>>> {
    let mut start = 0usize;
    let mut out = Vec::with_capacity(offs.len());
    for &end in offs {
        let Some(end) = usize::try_from(end)
            .ok()
            .filter(|&v| v >= start && v <= len)
        else {
            op_bail!("grouped product: offsets {offs:?} are not non-decreasing within 0..={len}");
        };
        out.push(start..end);
        start = end;
    }
    Ok(out)
}

/// Rows `offs[g-1]..offs[g]` of `x` (`[S, K]`) times `w[g]` (`[G, K, N]`); rows past the
/// last offset are zeros.
fn grouped_rows(x: &Tensor, w: &Tensor, offs: &[i64]) -> OpResult<Tensor> {
    let (s, k) = x.dims2()?;
    let (e, wk, n) = w.dims3()?;
    if wk != k || offs.len() != e {
        op_bail!(
            "grouped product of {:?} and {:?} with {} offsets",
            x.dims(),
            w.dims(),
            offs.len()
        );
    }
    let mut parts = Vec::new();
    for (g, r) in segments(offs, s)?.into_iter().enumerate() {
        if !r.is_empty() {
            parts.push(mm(&x.narrow(0, r.start, r.len())?, &w.get(g)?)?);
        }
    }
    let done = offs.last().map_or(0, |&e| e as usize);
    if s > done || parts.is_empty() {
        parts.push(Tensor::zeros((s - done, n), x.dtype(), x.device())?);
    }
    Ok(Tensor::cat(&parts, 0)?)
}

/// `a @ b` for operands of rank >= 2 with broadcast batch dims (floats; two int64 operands
/// are multiplied exactly in int64, wrapping as torch does).
pub fn mm(a: &Tensor, b: &Tensor) -> OpResult<Tensor> {
    if a.dtype() == DType::I64 && b.dtype() == DType::I64 {
        return int_mm(a, b);
    }
    let (a, b) = (float(a)?, float(b)?);
    if a.rank() < 2 || b.rank() < 2 {
        op_bail!("matrix product of shapes {:?} and {:?}", a.dims(), b.dims());
    }
    if let Some(r) = batched_f32(&a, &b) {
        return Ok(r);
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
        // candle's gemm takes only some stridings (e.g. not a transposed batch of heads, nor
        // some rank-5 batches with one row): retry on contiguous copies with the batch dims
        // broadcast and folded into one; a real shape error repeats and is reported.
        Err(_) => batched_3d(&a, &b),
    }
}

/// `a [.., n, k] @ b [.., k, p]` for f32 CPU tensors of any strides, batch dims broadcast,
/// each matrix read in place by the runtime's GEMM ([`sgemm`]). One product (a single
/// matrix, or a batch against one shared right-hand matrix whose left-hand rows stack) is
/// split over the pool's threads; a batch of at least as many products as threads runs one
/// product per thread, grouped so that a task holds at least [`TASK_MACS`] multiply-adds;
/// a smaller batch runs its products in turn, each split over the threads. candle's matmul
/// runs a batch's products in turn, each split only when large: attention inside Swin's
/// windows (192 products of 49 × 32 × 49) ran on one thread at any thread count.
/// `None` when an operand is not an f32 CPU tensor, the shapes do not multiply, or a view
/// reaches outside its storage (the caller then tries candle's product).
pub(crate) fn batched_f32(a: &Tensor, b: &Tensor) -> Option<Tensor> {
    use rayon::prelude::*;
    use sgemm::{product, sgemm};
    if a.dtype() != DType::F32 || b.dtype() != DType::F32 {
        return None;
    }
    let (ra, rb) = (a.rank(), b.rank());
    let (n, k, p) = (a.dims()[ra - 2], a.dims()[ra - 1], b.dims()[rb - 1]);
    if b.dims()[rb - 2] != k {
        return None;
    }
    let batch = Shape::from(&a.dims()[..ra - 2])
        .broadcast_shape_binary_op(&Shape::from(&b.dims()[..rb - 2]), "matmul")
        .ok()?;
    let full = |t: &Tensor, rows: usize, cols: usize| {
        let mut dims = batch.dims().to_vec();
        dims.extend([rows, cols]);
        t.broadcast_as(dims).ok()
    };
    let (a, b) = (full(a, n, k)?, full(b, k, p)?);
    let mut dims = batch.dims().to_vec();
    dims.extend([n, p]);
    let count = batch.elem_count();
    let size = n.checked_mul(p)?;
    let len = count.checked_mul(size)?;
    let threads = rayon::current_num_threads();
    let out = with_storage::<f32, _>(&a, |ad, al| {
        with_storage::<f32, _>(&b, |bd, bl| {
            let mat = |data, lay, i| matrix(data, lay, batch.dims(), i);
            if len == 0 {
                return Some(vec![0.0; len]);
            }
            let shared_rhs = bl.stride()[..batch.rank()].iter().all(|&s| s == 0);
            if count == 1 {
                return product(n, p, k, mat(ad, al, 0)?, mat(bd, bl, 0)?, 1.0, threads);
            }
            if shared_rhs && a.is_contiguous() {
                // The batch's rows stacked into one matrix.
                let a = Mat::rows(ad.get(al.start_offset()..)?, k);
                return product(count * n, p, k, a, mat(bd, bl, 0)?, 1.0, threads);
            }
            // Zeroed on the pool's threads (the products then write every value).
            let mut out = super::fused::zeros(len);
            // Product `i` of the batch into `o`, split for `threads`.
            let each =
                |i: usize, o: &mut [f32], threads: usize| match (mat(ad, al, i), mat(bd, bl, i)) {
                    (Some(x), Some(y)) => sgemm(n, p, k, x, y, o, p, false, 1.0, threads),
                    _ => false,
                };
            let ok = if count >= threads && threads > 1 {
                let per = (TASK_MACS / size.saturating_mul(k).max(1)).clamp(1, count);
                out.par_chunks_mut(per * size).enumerate().all(|(t, o)| {
                    o.chunks_mut(size)
                        .enumerate()
                        .all(|(j, o)| each(t * per + j, o, 1))
                })
            } else {
                (out.chunks_mut(size).enumerate()).all(|(i, o)| each(i, o, threads))
            };
            ok.then_some(out)
        })
    })???;
    Tensor::from_vec(out, dims, a.device()).ok()
}

/// Matrix `i` (row-major over the `batch` dims) of `data` laid out as `lay` (the batch dims,
/// then rows and columns); `None` when it starts outside `data`.
fn matrix<'d>(
    data: &'d [f32],
    lay: &candle_core::Layout,
    batch: &[usize],
    i: usize,
) -> Option<Mat<'d>> {
    let (st, nb) = (lay.stride(), batch.len());
    Some(Mat {
        data: data.get(lay.start_offset() + offset(i, batch, &st[..nb])..)?,
        rs: st[nb],
        cs: st[nb + 1],
    })
}

/// Multiply-adds per task of a batch of products spread over the threads ([`batched_f32`]).
const TASK_MACS: usize = 1 << 16;

/// `a [.., n, k] @ b [.., k, p]` with the batch dims broadcast, as one rank-3 product on
/// contiguous copies.
fn batched_3d(a: &Tensor, b: &Tensor) -> OpResult<Tensor> {
    let (ra, rb) = (a.rank(), b.rank());
    let (n, k, p) = (a.dims()[ra - 2], a.dims()[ra - 1], b.dims()[rb - 1]);
    if b.dims()[rb - 2] != k {
        op_bail!("matrix product of shapes {:?} and {:?}", a.dims(), b.dims());
    }
    let batch = candle_core::Shape::from(&a.dims()[..ra - 2])
        .broadcast_shape_binary_op(&candle_core::Shape::from(&b.dims()[..rb - 2]), "matmul")?;
    let mut sa = batch.dims().to_vec();
    sa.extend([n, k]);
    let mut sb = batch.dims().to_vec();
    sb.extend([k, p]);
    let count = batch.elem_count();
    let a3 = a.broadcast_as(sa)?.contiguous()?.reshape((count, n, k))?;
    let b3 = b.broadcast_as(sb)?.contiguous()?.reshape((count, k, p))?;
    let mut out = batch.dims().to_vec();
    out.extend([n, p]);
    Ok(a3.matmul(&b3)?.reshape(out)?)
}

/// The exact int64 product of `a` `[.., n, k]` and `b` `[.., k, p]` (batch dims broadcast),
/// with wrapping arithmetic as torch's int64 matmul.
fn int_mm(a: &Tensor, b: &Tensor) -> OpResult<Tensor> {
    let (ra, rb) = (a.rank(), b.rank());
    if ra < 2 || rb < 2 || a.dims()[ra - 1] != b.dims()[rb - 2] {
        op_bail!("matrix product of shapes {:?} and {:?}", a.dims(), b.dims());
    }
    let (n, k, p) = (a.dims()[ra - 2], a.dims()[ra - 1], b.dims()[rb - 1]);
    let batch = Shape::from(&a.dims()[..ra - 2])
        .broadcast_shape_binary_op(&Shape::from(&b.dims()[..rb - 2]), "matmul")?;
    let full = |t: &Tensor, rows: usize, cols: usize| -> OpResult<Vec<i64>> {
        let mut dims = batch.dims().to_vec();
        dims.extend([rows, cols]);
        Ok(t.broadcast_as(dims)?
            .contiguous()?
            .flatten_all()?
            .to_vec1::<i64>()?)
    };
    let (av, bv) = (full(a, n, k)?, full(b, k, p)?);
    let count = batch.elem_count();
    let mut out = vec![0i64; count * n * p];
    for bi in 0..count {
        let (x, y) = (&av[bi * n * k..][..n * k], &bv[bi * k * p..][..k * p]);
        let o = &mut out[bi * n * p..][..n * p];
        for i in 0..n {
            for kk in 0..k {
                let xv = x[i * k + kk];
                for j in 0..p {
                    o[i * p + j] = o[i * p + j].wrapping_add(xv.wrapping_mul(y[kk * p + j]));
                }
            }
        }
    }
    let mut dims = batch.dims().to_vec();
    dims.extend([n, p]);
    Ok(Tensor::from_vec(out, dims, &candle_core::Device::Cpu)?)
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

/// `beta * bias + alpha * x @ w` as one product accumulated onto the bias, for a contiguous
/// f32 `x` of any rank (its leading dims are rows) and a 2-d f32 `w [K, N]` of any strides
/// (a pre-transposed Linear weight, or GPT-2's `[in, out]` Conv1D weight, read in place). The
/// bias is `[N]` (any leading 1s) or a full `[rows, N]`. `None` when the layout does not apply.
pub fn gemm_bias(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    alpha: f64,
    beta: f64,
) -> OpResult<Option<Tensor>> {
    use super::fused::{repeated_rows, with_f32, with_storage};
    use super::sgemm::{product, sgemm, Mat};
    use candle_core::DType;
    if x.dtype() != DType::F32 || w.dtype() != DType::F32 || w.rank() != 2 || x.rank() < 1 {
        return Ok(None);
    }
    let (k, n) = w.dims2()?;
    if k == 0 || x.dims()[x.rank() - 1] != k {
        return Ok(None);
    }
    let rows = x.elem_count() / k.max(1);
    let bias = match bias.filter(|_| beta != 0.0) {
        None => None,
        // A row vector ([N] or [1, N], the caller checks) or the full [rows, N] matrix.
        Some(b)
            if b.dtype() == DType::F32 && (b.elem_count() == n || b.elem_count() == rows * n) =>
        {
            let mut b = b.flatten_all()?.to_vec1::<f32>()?;
            if beta != 1.0 {
                b.iter_mut().for_each(|v| *v *= beta as f32);
            }
            Some(b)
        }
        Some(_) => return Ok(None),
    };
    let multiply = |out: Option<Vec<f32>>| {
        with_f32(x, |xs| {
            with_storage::<f32, _>(w, |wd, wl| {
                let st = wl.stride();
                let b = Mat {
                    data: wd.get(wl.start_offset()..)?,
                    rs: st[0],
                    cs: st[1],
                };
                let a = Mat::rows(xs, k);
                match out {
                    // Onto the bias rows.
                    Some(mut out) => sgemm(
                        rows,
                        n,
                        k,
                        a,
                        b,
                        &mut out,
                        n,
                        true,
                        alpha as f32,
                        rayon::current_num_threads(),
                    )
                    .then_some(out),
                    None => product(rows, n, k, a, b, alpha as f32, rayon::current_num_threads()),
                }
            })
        })
        .flatten()
        .flatten()
    };
    let out = match bias {
        // The output starts as the bias rows (each written once: no zeroing first).
        Some(b) if b.len() == n => multiply(Some(repeated_rows(rows, &b))),
        b => multiply(b),
    };
    let Some(out) = out else {
        return Ok(None);
    };
    let mut shape = x.dims()[..x.rank() - 1].to_vec();
    shape.push(n);
    Ok(Some(Tensor::from_vec(out, shape, x.device())?))
}

fn linear(a: &Args) -> OpResult<Outputs> {
    let x = float(&a.tensor("input")?)?;
    let w = float(&a.tensor("weight")?)?;
    let bias = a.opt_tensor("bias")?.map(|b| float(&b)).transpose()?;
    if let Some(y) = linear_row(&x, &w, bias.as_ref())? {
        return one(y);
    }
    if w.rank() == 2 && bias.as_ref().is_none_or(|b| b.rank() == 1) {
        if let Some(y) = gemm_bias(&x, &w.t()?, bias.as_ref(), 1.0, 1.0)? {
            return one(y);
        }
    }
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

/// Outputs per task of [`linear_row`] when the weight is split over the pool's threads.
const ROW_BLOCK: usize = 64;

/// `x @ w.T + bias` for a single row `x` (all sizes 1 but the last, `k`) and a contiguous
/// float32 weight `[n, k]` as stored: one dot product ([`dot`]) of `x` with each of the
/// weight's rows, blocks of outputs on the pool's threads when the weight is large. A
/// batch-1 classifier's weight is read once per run whatever its layout, so the load leaves
/// such a Linear's weight as the archive stores it (`prepare::products::single_row`) instead
/// of packing or transposing it. `None` for any other shape or layout.
fn linear_row(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> OpResult<Option<Tensor>> {
    use super::fused::with_f32;
    use rayon::prelude::*;
    let (Ok((n, k)), true) = (w.dims2(), w.is_contiguous()) else {
        return Ok(None);
    };
    if x.rank() == 0 || x.dims()[x.rank() - 1] != k || x.elem_count() != k || k == 0 {
        return Ok(None);
    }
    let bias = match bias {
        Some(b) if b.dims() != [n] => return Ok(None),
        Some(b) => Some(super::strided::contiguous_f32(b).unwrap_or(b.clone())),
        None => None,
    };
    let x = super::strided::contiguous_f32(x).unwrap_or(x.clone());
    let out = with_f32(w, |w| {
        with_f32(&x, |x| {
            let b = bias.as_ref().and_then(|b| with_f32(b, <[f32]>::to_vec));
            let mut out = b.unwrap_or_else(|| vec![0.0; n]);
            let dots = |(i, block): (usize, &mut [f32])| {
                let rows = w[i * ROW_BLOCK * k..].chunks_exact(k);
                for (y, row) in block.iter_mut().zip(rows) {
                    *y += dot(row, x);
                }
            };
            if n * k >= super::fused::PAR_MIN && rayon::current_num_threads() > 1 {
                out.par_chunks_mut(ROW_BLOCK).enumerate().for_each(dots);
            } else {
                out.chunks_mut(ROW_BLOCK).enumerate().for_each(dots);
            }
            out
        })
    })
    .flatten();
    let Some(out) = out else {
        return Ok(None);
    };
    let mut shape = x.dims().to_vec();
    *shape.last_mut().expect("rank checked above") = n;
    Ok(Some(Tensor::from_vec(out, shape, x.device())?))
}

/// The dot product of `a` and `b` (as long as the shorter): by AVX-512 fused multiply-adds in
/// four registers where the CPU has them, else in 16 interleaved lanes (which the compiler
/// vectorises), then summed.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F (checked above).
        #[allow(unsafe_code)]
        return unsafe { dot_avx512(a, b) };
    }
    dot_lanes(a, b)
}

/// [`dot`] in 16 interleaved lanes (which the compiler vectorises for any CPU), then summed.
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut acc = [0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// [`dot`] by AVX-512: 64 values a step in four accumulators, then 16, then the last up to
/// 15 by masked loads. Reads only the first `min(a.len(), b.len())` values of each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(unsafe_code)]
unsafe fn dot_avx512(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY (every load below): `i + 64 <= n`, `i + 16 <= n`, and the mask covers
    // `n - i < 16` values, so each reads inside both slices.
    while i + 64 <= n {
        for (j, acc) in acc.iter_mut().enumerate() {
            let (x, y) = (
                _mm512_loadu_ps(pa.add(i + 16 * j)),
                _mm512_loadu_ps(pb.add(i + 16 * j)),
            );
            *acc = _mm512_fmadd_ps(x, y, *acc);
        }
        i += 64;
    }
    while i + 16 <= n {
        acc[0] = _mm512_fmadd_ps(
            _mm512_loadu_ps(pa.add(i)),
            _mm512_loadu_ps(pb.add(i)),
            acc[0],
        );
        i += 16;
    }
    if i < n {
        let m = ((1u32 << (n - i)) - 1) as __mmask16;
        let (x, y) = (
            _mm512_maskz_loadu_ps(m, pa.add(i)),
            _mm512_maskz_loadu_ps(m, pb.add(i)),
        );
        acc[1] = _mm512_fmadd_ps(x, y, acc[1]);
    }
    let sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    _mm512_reduce_add_ps(sum)
}

fn addmm(a: &Args) -> OpResult<Outputs> {
    let (m1, m2) = if a.has("mat1") {
        (a.tensor("mat1")?, a.tensor("mat2")?)
    } else {
        (a.tensor("batch1")?, a.tensor("batch2")?)
    };
    let input = a.tensor("self")?;
    if [&input, &m1, &m2].iter().all(|t| t.dtype() == DType::I64) {
        return one(int_addmm(
            &input,
            &m1,
            &m2,
            a.int_or("alpha", 1)?,
            a.int_or("beta", 1)?,
        )?);
    }
    let bias = float(&input)?;
    let beta = a.float_or("beta", 1.0)?;
    let alpha = a.float_or("alpha", 1.0)?;
    let (f1, f2) = (float(&m1)?, float(&m2)?);
    if f1.rank() == 2 && f2.rank() == 2 && bias.rank() <= 2 {
        let (rows, n) = (f1.dims()[0], f2.dims()[1]);
        // The bias must broadcast to [rows, n] as a row vector or be the full matrix.
        let b_ok = match bias.dims() {
            [] => false,
            [m] => *m == n,
            [r, c] => *c == n && (*r == 1 || *r == rows),
            _ => false,
        };
        if b_ok {
            if let Some(y) = gemm_bias(&f1, &f2, Some(&bias), alpha, beta)? {
                return one(y);
            }
        }
    }
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

#[cfg(test)]
mod int_tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn int64_products_are_exact_and_wrap() {
        let big = (1i64 << 40) + 1;
        let a = Tensor::from_vec(vec![big, 1, 2, 3], (2, 2), &Device::Cpu).unwrap();
        let b = Tensor::from_vec(vec![3i64, 0, 0, i64::MAX], (2, 2), &Device::Cpu).unwrap();
        let p = mm(&a, &b).unwrap();
        assert_eq!(p.dtype(), DType::I64);
        // [[3·big, i64::MAX], [2·3, 3·i64::MAX (wraps)]]
        assert_eq!(
            p.to_vec2::<i64>().unwrap(),
            [[3 * big, i64::MAX], [6, 3i64.wrapping_mul(i64::MAX)]]
        );
        // baddbmm: beta · input + alpha · (batch1 @ batch2), input broadcast over the batch.
        let x = Tensor::from_vec(vec![1i64, 2], (1, 1, 2), &Device::Cpu).unwrap();
        let b1 = Tensor::from_vec(vec![big, 5], (2, 1, 1), &Device::Cpu).unwrap();
        let b2 = Tensor::from_vec(vec![1i64, 1, 2, 2], (2, 1, 2), &Device::Cpu).unwrap();
        let y = int_addmm(&x, &b1, &b2, 2, 3).unwrap();
        assert_eq!(
            y.flatten_all().unwrap().to_vec1::<i64>().unwrap(),
            [2 * big + 3, 2 * big + 6, 20 + 3, 20 + 6]
        );
    }
}

#[cfg(test)]
mod batch_tests {
    use super::*;
    use candle_core::Device;

    /// A rank-5 batch of one-row products that candle's own matmul refuses (lambda
    /// networks' content lambdas) is computed, equal to a plain triple loop: in float32 by
    /// the runtime's batched product, in float64 through the rank-3 fallback.
    #[test]
    fn batches_candle_refuses_are_computed() {
        for dtype in [DType::F32, DType::F64] {
            batch_candle_refuses(dtype);
        }
    }

    fn batch_candle_refuses(dtype: DType) {
        let (bs, k, p) = ([1usize, 4, 256], 16, 64);
        let nb: usize = bs.iter().product();
        let av: Vec<f32> = (0..nb * k).map(|i| ((i * 7 % 13) as f32) - 6.0).collect();
        let bv: Vec<f32> = (0..nb * k * p)
            .map(|i| ((i * 5 % 11) as f32) - 5.0)
            .collect();
        let a = Tensor::from_vec(av.clone(), (1, 4, 256, 1, k), &Device::Cpu).unwrap();
        let b = Tensor::from_vec(bv.clone(), (1, 4, 256, k, p), &Device::Cpu).unwrap();
        let (a, b) = (a.to_dtype(dtype).unwrap(), b.to_dtype(dtype).unwrap());
        assert!(
            a.broadcast_matmul(&b).is_err(),
            "candle now takes this layout: the test no longer reaches the fallback"
        );
        let got = mm(&a, &b).unwrap();
        assert_eq!(got.dims(), &[1, 4, 256, 1, p]);
        let got = got.to_dtype(DType::F32).unwrap();
        let got = got.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for batch in 0..nb {
            for j in 0..p {
                let want: f32 = (0..k)
                    .map(|i| av[batch * k + i] * bv[(batch * k + i) * p + j])
                    .sum();
                assert_eq!(got[batch * p + j], want, "batch {batch}, column {j}");
            }
        }
    }

    /// The batched float32 product equals candle's product of contiguous copies, for
    /// operands of every layout: transposed, broadcast over the batch on either side, rows
    /// that repeat (stride 0), size-1 dims, a shared right-hand matrix (rows stacked), one
    /// matrix, empty dims; batches larger and smaller than the pool, on 1 and 2 threads.
    #[test]
    fn batched_products_match_candle() {
        let dev = Device::Cpu;
        let t = |s: &[usize]| Tensor::randn(0f32, 1., s.to_vec(), &dev).unwrap();
        let cases = [
            (t(&[6, 5, 7]), t(&[6, 7, 3])),
            (t(&[2, 3, 5, 7]), t(&[3, 7, 4])),
            (
                t(&[3, 7, 5]).transpose(1, 2).unwrap(),
                t(&[3, 4, 7]).transpose(1, 2).unwrap(),
            ),
            (t(&[1, 5, 7]), t(&[9, 7, 3])),
            (t(&[9, 5, 7]), t(&[1, 7, 3])),
            (t(&[9, 5, 7]), t(&[7, 3]).unsqueeze(0).unwrap()),
            (
                t(&[4, 1, 7]).broadcast_as((4, 5, 7)).unwrap(),
                t(&[4, 7, 2]),
            ),
            (t(&[4, 2, 1, 7]).transpose(1, 2).unwrap(), t(&[4, 1, 7, 3])),
            (t(&[5, 7]), t(&[7, 3])),
            (t(&[1, 1, 7]), t(&[1, 7, 1])),
            (
                t(&[2, 5, 6, 8]).permute((0, 2, 1, 3)).unwrap(),
                t(&[2, 6, 8, 5]),
            ),
            (t(&[200, 3, 4]), t(&[200, 4, 5])),
            (t(&[40, 16, 16]), t(&[40, 16, 16]).transpose(1, 2).unwrap()),
            (t(&[3, 0, 4]), t(&[3, 4, 5])),
            (t(&[3, 5, 0]), t(&[3, 0, 5])),
        ];
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for (a, b) in &cases {
                let got = pool.install(|| batched_f32(a, b)).expect("applies");
                let want = a
                    .contiguous()
                    .unwrap()
                    .broadcast_matmul(&b.contiguous().unwrap())
                    .unwrap();
                assert_eq!(got.dims(), want.dims(), "{:?} @ {:?}", a.dims(), b.dims());
                let diff = match got.elem_count() {
                    0 => 0.0,
                    _ => super::super::max_abs_diff(&got, &want),
                };
                assert!(diff < 1e-5, "{:?} @ {:?}: {diff}", a.dims(), b.dims());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `x @ w.T + b` in f64, rounded once.
    fn reference(x: &[f32], w: &[f32], b: Option<&[f32]>, n: usize, k: usize) -> Vec<f32> {
        (0..n)
            .map(|j| {
                let s: f64 = (0..k)
                    .map(|i| f64::from(w[j * k + i]) * f64::from(x[i]))
                    .sum();
                (s + b.map_or(0.0, |b| f64::from(b[j]))) as f32
            })
            .collect()
    }

    #[test]
    fn single_rows_take_a_dot_product_per_output() {
        // Inner sizes below, at and past 16 and 64 values, with tails; outputs past a block.
        for (n, k) in [
            (1, 1),
            (3, 15),
            (70, 16),
            (65, 17),
            (130, 64),
            (5, 100),
            (200, 960),
        ] {
            let x: Vec<f32> = (0..k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0).collect();
            let w: Vec<f32> = (0..n * k)
                .map(|i| ((i * 11 % 17) as f32 - 8.0) / 7.0)
                .collect();
            let b: Vec<f32> = (0..n).map(|j| j as f32 / 3.0 - 1.0).collect();
            let wt = Tensor::from_vec(w.clone(), (n, k), &candle_core::Device::Cpu).unwrap();
            let bt = Tensor::from_vec(b.clone(), n, &candle_core::Device::Cpu).unwrap();
            for dims in [vec![k], vec![1, k], vec![1, 1, k]] {
                let xt = Tensor::from_vec(x.clone(), dims.as_slice(), &candle_core::Device::Cpu)
                    .unwrap();
                for bias in [None, Some(&bt)] {
                    let got = linear_row(&xt, &wt, bias).unwrap().expect("a single row");
                    let mut want_dims = dims.clone();
                    *want_dims.last_mut().unwrap() = n;
                    assert_eq!(got.dims(), want_dims.as_slice(), "{n} x {k}");
                    let want = reference(&x, &w, bias.map(|_| b.as_slice()), n, k);
                    let got = got.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                    for (g, w) in got.iter().zip(&want) {
                        assert!(
                            (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                            "{n} x {k}: {g} {w}"
                        );
                    }
                }
            }
        }
        // The portable dot product too (what a CPU without AVX-512 runs).
        for k in [1, 15, 16, 17, 64, 100, 960] {
            let a: Vec<f32> = (0..k).map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0).collect();
            let b: Vec<f32> = (0..k).map(|i| ((i * 3 % 7) as f32 - 3.0) / 2.0).collect();
            let want: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| f64::from(*x) * f64::from(*y))
                .sum();
            for got in [dot_lanes(&a, &b), dot(&a, &b)] {
                assert!(
                    (f64::from(got) - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "{k}"
                );
            }
        }
        // Not a single row, or a weight that is a transposed view: declined.
        let w = Tensor::zeros((4, 8), DType::F32, &candle_core::Device::Cpu).unwrap();
        let two = Tensor::zeros((2, 8), DType::F32, &candle_core::Device::Cpu).unwrap();
        assert!(linear_row(&two, &w, None).unwrap().is_none());
        let one = Tensor::zeros(4, DType::F32, &candle_core::Device::Cpu).unwrap();
        let wt = Tensor::zeros((8, 4), DType::F32, &candle_core::Device::Cpu).unwrap();
        assert!(linear_row(&one, &wt.t().unwrap(), None).unwrap().is_none());
    }
}

#[cfg(test)]
mod triangular_tests {
    use super::*;
    use candle_core::Device;

    /// `linalg_solve_triangular(m, b, upper, left, unitriangular)` through its kernel.
    fn solve(m: &Tensor, b: &Tensor, upper: bool, left: bool, unit: bool) -> Tensor {
        let flag = |v| serde_json::json!({ "as_bool": v });
        let args = [
            ("self", serde_json::json!({"as_tensor": {"name": "m"}})),
            ("B", serde_json::json!({"as_tensor": {"name": "b"}})),
            ("upper", flag(upper)),
            ("left", flag(left)),
            ("unitriangular", flag(unit)),
        ];
        let out = super::super::run_node(
            register,
            "aten.linalg_solve_triangular.default",
            &args,
            &[("m", m.clone()), ("b", b.clone())],
        )
        .unwrap();
        let crate::value::Value::Tensor(x) = &out[0] else {
            panic!("not a tensor")
        };
        x.clone()
    }

    /// Each solution satisfies its system: the triangle the flags name (with a diagonal of
    /// ones where unitriangular), times the solution on the side `left` names, gives `b`;
    /// batch dims broadcast (systems for 2, right sides for 3 x 2).
    #[test]
    fn triangular_solutions_satisfy_their_systems() {
        let dev = Device::Cpu;
        let eye = Tensor::eye(4, DType::F64, &dev).unwrap();
        let m = Tensor::randn(0f64, 1.0, (2, 4, 4), &dev)
            .unwrap()
            .broadcast_add(&eye.affine(4.0, 0.0).unwrap())
            .unwrap();
        for (upper, left, unit) in [
            (false, true, true),
            (false, true, false),
            (true, true, false),
            (true, false, false),
            (false, false, true),
        ] {
            let b = match left {
                true => Tensor::randn(0f64, 1.0, (3, 2, 4, 5), &dev).unwrap(),
                false => Tensor::randn(0f64, 1.0, (3, 2, 5, 4), &dev).unwrap(),
            };
            let x = solve(&m, &b, upper, left, unit);
            let mask = match upper {
                true => Tensor::triu2(4, DType::F64, &dev).unwrap(),
                false => Tensor::tril2(4, DType::F64, &dev).unwrap(),
            };
            let mut tri = m.broadcast_mul(&mask).unwrap();
            if unit {
                let off = tri.broadcast_mul(&eye.affine(-1.0, 1.0).unwrap()).unwrap();
                tri = off.broadcast_add(&eye).unwrap();
            }
            let tri = tri
                .broadcast_as((3, 2, 4, 4))
                .unwrap()
                .contiguous()
                .unwrap();
            let back = match left {
                true => tri.matmul(&x).unwrap(),
                false => x.matmul(&tri).unwrap(),
            };
            let err = (back - &b).unwrap().abs().unwrap().flatten_all().unwrap();
            let err = err.max(0).unwrap().to_scalar::<f64>().unwrap();
            assert!(err < 1e-9, "upper {upper} left {left} unit {unit}: {err}");
        }
    }
}
