//! Advanced indexing and strided access: `index.Tensor` with any number of index tensors
//! (broadcast together, torch's placement rules for adjacent and separated indexed dims,
//! bool masks), `as_strided` over a contiguous tensor, `slice_scatter`, `select_scatter`.
//!
//! Every gather is written as "flat offsets into the contiguous input" followed by one
//! `index_select`, so it works for every dtype; offsets and sizes use checked arithmetic.

use candle_core::{DType, Shape, Tensor};
use torchport::contiguous_strides;

use super::{dim, result_numel, usize_of, Registry};
use crate::error::{OpError, OpResult};
use crate::op_bail;
use crate::value::{one, Args, Outputs};

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    r.add("aten.index.Tensor", index);
    r.add("aten.index_put.default", index_put);
    r.add("aten._index_put_impl.default", index_put);
    r.add("aten.as_strided.default", as_strided);
    r.add("aten.slice_scatter.default", slice_scatter);
    r.add("aten.select_scatter.default", select_scatter);
}

fn overflow() -> OpError {
    OpError("the result's size overflows".into())
}

/// Gather `flat[offsets]` into `shape` (offsets already checked to be in range).
fn gather_flat(t: &Tensor, offsets: Vec<i64>, shape: Vec<usize>) -> OpResult<Tensor> {
    let flat = t.contiguous()?.flatten_all()?;
    let n = offsets.len();
    let idx = Tensor::from_vec(offsets, n, &candle_core::Device::Cpu)?;
    Ok(flat.index_select(&idx, 0)?.reshape(shape)?)
}

/// One axis of an indexing result: a dim of the input (size, stride) or the broadcast block
/// of the index tensors (one offset per position).
enum Axis<'a> {
    Dim(usize, usize),
    Block(&'a [usize]),
}

/// Offsets of every element of a result made of `axes`, in row-major order.
fn offsets_of(axes: &[Axis<'_>], total: usize) -> OpResult<Vec<i64>> {
    let mut out = Vec::with_capacity(total);
    let sizes: Vec<usize> = axes
        .iter()
        .map(|a| match a {
            Axis::Dim(n, _) => *n,
            Axis::Block(v) => v.len(),
        })
        .collect();
    if total == 0 {
        return Ok(out);
    }
    let mut pos = vec![0usize; axes.len()];
    loop {
        let mut off = 0usize;
        for (a, &p) in axes.iter().zip(&pos) {
            off += match a {
                Axis::Dim(_, s) => p * s,
                Axis::Block(v) => v[p],
            };
        }
        out.push(i64::try_from(off).map_err(|_| overflow())?);
        // Odometer increment, last axis fastest.
        let mut k = axes.len();
        loop {
            if k == 0 {
                return Ok(out);
            }
            k -= 1;
            pos[k] += 1;
            if pos[k] < sizes[k] {
                break;
            }
            pos[k] = 0;
        }
    }
}

/// `self[indices]` with `None` entries for the dims taken whole. Indexed dims next to each
/// other (a table's rows by an index tensor, as relative position biases are read) gather
/// whole runs of the dims after them, `[outer, rows, inner]` by rows; others element by
/// element. Element by element, GCViT-xxtiny's bias tables (`[729, 8]` by 38,416 rows)
/// took 2.5 ms each, a sixth of the model at 1 thread (BENCHMARKS.md, issue 14).
fn index(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    match locate(t.dims(), a.opt_tensors("indices")?)? {
        Some(at) => one(gather(&t, &at)?),
        None => one(t),
    }
}

/// What `t` holds where `at` says (see [`index`]).
fn gather(t: &Tensor, at: &Located) -> OpResult<Tensor> {
    let shape = at.shape();
    let total = result_numel(&shape, "index")?;
    match at.rows() {
        Some(([outer, mid, inner], rows)) => {
            let n = rows.len();
            let rows = Tensor::from_vec(rows, n, &candle_core::Device::Cpu)?;
            let t = t.contiguous()?.reshape((outer, mid, inner))?;
            Ok(t.index_select(&rows, 1)?.reshape(shape)?)
        }
        None => gather_flat(t, at.offsets(total)?, shape),
    }
}

/// `index_put(self, indices, values, accumulate=False)`: `self[indices] = values` (or `+=`,
/// adding every repeated position), values broadcast to the indexed shape; a new tensor.
fn index_put(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let values = a.tensor("values")?;
    let accumulate = a.bool_or("accumulate", false)?;
    let Some(at) = locate(t.dims(), a.opt_tensors("indices")?)? else {
        // No index: every element.
        let v = values.to_dtype(t.dtype())?.broadcast_as(t.dims())?;
        return one(if accumulate {
            (t + v)?
        } else {
            v.contiguous()?
        });
    };
    let shape = at.shape();
    let offsets = at.offsets(result_numel(&shape, "index_put")?)?;
    let values = values
        .to_dtype(t.dtype())?
        .broadcast_as(shape)?
        .contiguous()?;
    fn put<T: candle_core::WithDType + std::ops::Add<Output = T>>(
        t: &Tensor,
        values: &Tensor,
        offsets: &[i64],
        accumulate: bool,
    ) -> OpResult<Tensor> {
        let mut out = t.flatten_all()?.to_vec1::<T>()?;
        let vals = values.flatten_all()?.to_vec1::<T>()?;
        for (&o, v) in offsets.iter().zip(vals) {
            let slot = &mut out[o as usize];
            *slot = if accumulate { *slot + v } else { v };
        }
        Ok(Tensor::from_vec(out, t.dims(), t.device())?)
    }
    let t = t.contiguous()?;
    one(match t.dtype() {
        DType::F32 => put::<f32>(&t, &values, &offsets, accumulate)?,
        DType::F64 => put::<f64>(&t, &values, &offsets, accumulate)?,
        DType::I64 => put::<i64>(&t, &values, &offsets, accumulate)?,
        DType::U8 if !accumulate => put::<u8>(&t, &values, &offsets, false)?,
        dt => op_bail!("index_put on {dt:?} is not supported"),
    })
}

/// Where `self[indices]` reads (see [`Located`]); `None` when no dim is indexed.
fn locate(dims: &[usize], given: Vec<Option<Tensor>>) -> OpResult<Option<Located>> {
    // Expand bool masks into one long index per dim they cover (their nonzero positions).
    let mut idx: Vec<Option<Tensor>> = Vec::new();
    for g in given {
        match g {
            Some(m) if m.dtype() == DType::U8 => {
                let dims = m.dims().to_vec();
                let v = m.flatten_all()?.to_vec1::<u8>()?;
                let strides = contiguous_strides(&dims);
                let mut cols: Vec<Vec<i64>> = vec![Vec::new(); dims.len().max(1)];
                for (flat, _) in v.iter().enumerate().filter(|(_, &b)| b != 0) {
                    for (d, s) in strides.iter().enumerate() {
                        cols[d].push(((flat / s) % dims[d]) as i64);
                    }
                }
                if dims.is_empty() {
                    op_bail!("indexing with a 0-d bool mask is not supported");
                }
                for c in cols {
                    let n = c.len();
                    idx.push(Some(Tensor::from_vec(c, n, &candle_core::Device::Cpu)?));
                }
            }
            other => idx.push(other),
        }
    }
    let dims = dims.to_vec();
    if idx.len() > dims.len() {
        op_bail!("{} indices for a tensor of rank {}", idx.len(), dims.len());
    }
    let strides = contiguous_strides(&dims);
    let indexed: Vec<usize> = (0..idx.len()).filter(|&i| idx[i].is_some()).collect();
    if indexed.is_empty() {
        return Ok(None);
    }
    // Broadcast the index tensors together.
    let mut bshape = Shape::from(());
    for &i in &indexed {
        if let Some(x) = &idx[i] {
            bshape = bshape.broadcast_shape_binary_op(x.shape(), "index")?;
        }
    }
    let nb = bshape.elem_count();
    let mut block = vec![0usize; nb];
    for &i in &indexed {
        let Some(x) = &idx[i] else { continue };
        let len = dims[i];
        let v = x
            .to_dtype(DType::I64)?
            .broadcast_as(&bshape)?
            .flatten_all()?
            .to_vec1::<i64>()?;
        for (b, &j) in block.iter_mut().zip(&v) {
            let j = if j < 0 { j + len as i64 } else { j };
            if j < 0 || j as usize >= len {
                op_bail!("index {j} is out of range for dim {i} of size {len}");
            }
            *b += j as usize * strides[i];
        }
    }
    Ok(Some(Located {
        dims,
        strides,
        indexed,
        block,
        bshape,
    }))
}

/// Where `self[indices]` reads, for a tensor of sizes `dims` (contiguous `strides`): the
/// indexed dims, and for each position of the index tensors broadcast together (`bshape`)
/// the flat offset their indices add up to (`block`).
struct Located {
    dims: Vec<usize>,
    strides: Vec<usize>,
    indexed: Vec<usize>,
    block: Vec<usize>,
    bshape: Shape,
}

impl Located {
    /// Whether the indexed dims are next to each other: their block then takes their place
    /// in the result, else it comes first (torch's rule).
    fn adjacent(&self) -> bool {
        let (first, last) = (self.indexed[0], self.indexed[self.indexed.len() - 1]);
        self.indexed.len() == last - first + 1
    }

    /// The dims not indexed, of `r`, as axes of the result.
    fn rest(&self, r: std::ops::Range<usize>) -> impl Iterator<Item = Axis<'_>> {
        r.filter(|d| !self.indexed.contains(d))
            .map(|d| Axis::Dim(self.dims[d], self.strides[d]))
    }

    /// The result's axes, in order.
    fn axes(&self) -> Vec<Axis<'_>> {
        let (first, last) = (self.indexed[0], self.indexed[self.indexed.len() - 1]);
        let block = Axis::Block(&self.block);
        if self.adjacent() {
            let mut axes: Vec<Axis> = self.rest(0..first).collect();
            axes.push(block);
            axes.extend(self.rest(last + 1..self.dims.len()));
            axes
        } else {
            let mut axes = vec![block];
            axes.extend(self.rest(0..self.dims.len()));
            axes
        }
    }

    /// The result's shape: the block's dims where the block is.
    fn shape(&self) -> Vec<usize> {
        let mut shape = Vec::new();
        for a in self.axes() {
            match a {
                Axis::Dim(n, _) => shape.push(n),
                Axis::Block(_) => shape.extend_from_slice(self.bshape.dims()),
            }
        }
        shape
    }

    /// The flat offset of each of the result's `total` elements, in order.
    fn offsets(&self, total: usize) -> OpResult<Vec<i64>> {
        offsets_of(&self.axes(), total)
    }

    /// Adjacent indexed dims as rows: the tensor seen as `[outer, rows, inner]` (the dims
    /// before, at and after the indexed ones), and the row each position of the block reads.
    fn rows(&self) -> Option<([usize; 3], Vec<i64>)> {
        if !self.adjacent() {
            return None;
        }
        let (first, last) = (self.indexed[0], self.indexed[self.indexed.len() - 1]);
        let size = |r: &[usize]| r.iter().product::<usize>();
        let (outer, mid) = (size(&self.dims[..first]), size(&self.dims[first..=last]));
        let inner = self.strides[last];
        let rows = self.block.iter().map(|&b| i64::try_from(b / inner.max(1)));
        let rows = rows.collect::<Result<Vec<_>, _>>().ok()?;
        Some(([outer, mid, inner], rows))
    }
}

/// `as_strided(self, size, stride, storage_offset)` read from `self`'s contiguous layout
/// (the program is checked at load to call it only on tensors torch holds contiguously).
fn as_strided(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let size = a.ints("size")?;
    let stride = a.ints("stride")?;
    if size.len() != stride.len() {
        op_bail!("{} sizes but {} strides", size.len(), stride.len());
    }
    let base = usize_of(a.int_or("storage_offset", 0)?, "storage_offset")?;
    let mut axes = Vec::new();
    let mut shape = Vec::new();
    let mut reach = base;
    for (&n, &s) in size.iter().zip(&stride) {
        let n = usize_of(n, "size")?;
        let s = usize_of(s, "stride")?;
        if n > 0 {
            reach = (n - 1)
                .checked_mul(s)
                .and_then(|x| x.checked_add(reach))
                .ok_or_else(overflow)?;
        }
        axes.push(Axis::Dim(n, s));
        shape.push(n);
    }
    let total = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(overflow)?;
    if total > 0 && reach >= t.elem_count() {
        op_bail!(
            "as_strided reaches element {reach} of a tensor of {} elements",
            t.elem_count()
        );
    }
    let mut offsets = offsets_of(&axes, total)?;
    for o in &mut offsets {
        *o += base as i64;
    }
    one(gather_flat(&t, offsets, shape)?)
}

/// `self` with `src` written into `self[start:end:step]` along `dim`.
fn slice_scatter(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let src = a.tensor("src")?.to_dtype(t.dtype())?;
    let d = dim(a.int_or("dim", 0)?, t.rank())?;
    let len = t.dims().get(d).copied().unwrap_or(1) as i64;
    let clamp = |v: i64| if v < 0 { (v + len).max(0) } else { v.min(len) };
    let start = clamp(a.opt_int("start")?.unwrap_or(0));
    let end = clamp(a.opt_int("end")?.unwrap_or(len)).max(start);
    let step = a.int_or("step", 1)?;
    if step < 1 {
        op_bail!("slice step must be positive, got {step}");
    }
    let positions: Vec<usize> = (start..end)
        .step_by(step as usize)
        .map(|p| p as usize)
        .collect();
    scatter_along(&t, &src, d, &positions)
}

/// `self` with `src` written into `self.select(dim, index)`.
fn select_scatter(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let d = dim(a.int("dim")?, t.rank())?;
    let len = t.dims().get(d).copied().unwrap_or(1) as i64;
    let i = a.int("index")?;
    let i = if i < 0 { i + len } else { i };
    if i < 0 || i >= len {
        op_bail!("index {i} is out of range for a dim of size {len}");
    }
    let src = a.tensor("src")?.to_dtype(t.dtype())?.unsqueeze(d)?;
    scatter_along(&t, &src, d, &[i as usize])
}

/// Replace positions `pos` (increasing) of dim `d` of `t` by the slices of `src` (same rank,
/// `pos.len()` along `d`), as a new tensor (never `t`'s storage, which others may read):
/// `t` rebuilt from pieces, each run of `t`'s positions or `src`'s one piece, concatenated by
/// the runtime's `cat` (any layout, each output element written once, on the pool's
/// threads). One piece per position had taken MViTv2-S's 96 `slice_scatter`s over its `[1,
/// 2, 6273, 1569]` attention maps 1.3 s of a 3.8 s run at 1 thread; a copy of all of `t`
/// with `src` then written over the slice (candle's, on one thread), 178 ms of 2.09 s
/// (BENCHMARKS.md, issue 14).
fn scatter_along(t: &Tensor, src: &Tensor, d: usize, pos: &[usize]) -> OpResult<Outputs> {
    if t.rank() == 0 {
        op_bail!("cannot scatter into a 0-d tensor along a dim");
    }
    let mut want = t.dims().to_vec();
    want[d] = pos.len();
    if src.dims() != want.as_slice() {
        op_bail!(
            "the source has shape {:?} but the slice it replaces has shape {want:?}",
            src.dims()
        );
    }
    let n = t.dims()[d];
    // Runs of `t`'s own slices and of `src`'s, as (from src, start, length).
    let mut runs: Vec<(bool, usize, usize)> = Vec::new();
    let mut k = 0;
    for p in 0..n {
        let (from_src, at) = if pos.get(k) == Some(&p) {
            k += 1;
            (true, k - 1)
        } else {
            (false, p)
        };
        match runs.last_mut() {
            Some((s, start, len)) if *s == from_src && *start + *len == at => *len += 1,
            _ => runs.push((from_src, at, 1)),
        }
    }
    let pieces = runs
        .iter()
        .map(|&(from_src, start, len)| match from_src {
            true => src.narrow(d, start, len),
            false => t.narrow(d, start, len),
        })
        .collect::<candle_core::Result<Vec<_>>>()?;
    if pieces.is_empty() {
        return one(t.clone());
    }
    match super::shape::strided_cat(&pieces, d) {
        Some(out) => one(out),
        None => one(Tensor::cat(&pieces, d)?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Indexed dims next to each other are gathered as whole rows, and give what the element
    /// by element gather (the path torch's OpInfo samples check) gives: at the start, in the
    /// middle and at the end, with broadcast and negative indices; indexed dims apart are
    /// left to it.
    #[test]
    fn rows_gather_what_elements_gather() {
        let dev = Device::Cpu;
        let t = Tensor::arange(0f32, 3. * 4. * 5., &dev)
            .unwrap()
            .reshape((3, 4, 5))
            .unwrap();
        let ix = |v: &[i64], s: &[usize]| Tensor::new(v, &dev).unwrap().reshape(s).unwrap();
        let cases: Vec<(Vec<Option<Tensor>>, bool)> = vec![
            (vec![Some(ix(&[2, 0, 2, 1], &[2, 2]))], true),
            (vec![None, Some(ix(&[3, -1, 0], &[3])), None], true),
            (
                vec![
                    None,
                    Some(ix(&[1, 2], &[2, 1])),
                    Some(ix(&[4, 0, -2], &[3])),
                ],
                true,
            ),
            (vec![None, None, Some(ix(&[-5, 4], &[2]))], true),
            (
                vec![Some(ix(&[1, 2], &[2])), None, Some(ix(&[0, 3], &[2]))],
                false,
            ),
        ];
        for (given, adjacent) in cases {
            let at = locate(t.dims(), given).unwrap().unwrap();
            let shape = at.shape();
            let total = shape.iter().product();
            let want = gather_flat(&t, at.offsets(total).unwrap(), shape.clone()).unwrap();
            assert_eq!(at.rows().is_some(), adjacent, "{shape:?}");
            let got = gather(&t, &at).unwrap();
            assert_eq!(got.dims(), shape.as_slice());
            let (got, want) = (got.flatten_all().unwrap(), want.flatten_all().unwrap());
            assert_eq!(
                got.to_vec1::<f32>().unwrap(),
                want.to_vec1::<f32>().unwrap()
            );
        }
    }

    /// `src` over positions of a dim, consecutive or not (`t` rebuilt from runs either way),
    /// on every dim: each element is `src`'s at the positions and `t`'s elsewhere, the
    /// result's storage is its own size (`t` is a view into a larger one, as weights are),
    /// and `t` itself is left as it was.
    #[test]
    fn scatter_along_writes_src_and_leaves_self() {
        let dev = Device::Cpu;
        let dims = [3usize, 4, 5];
        let shared = (Tensor::arange(0f32, 1000., &dev).unwrap() - 100.).unwrap();
        let t = shared.narrow(0, 100, 60).unwrap().reshape(&dims).unwrap();
        let cases: [(usize, &[usize]); 5] = [
            (0, &[1, 2]),
            (1, &[1, 2, 3]),
            (2, &[0]),
            (2, &[1, 3]),
            (1, &[0, 1, 3]),
        ];
        for (d, pos) in cases {
            let mut sd = dims;
            sd[d] = pos.len();
            let count = sd.iter().product::<usize>();
            let src = (Tensor::arange(0f32, count as f32, &dev).unwrap() + 1000.)
                .unwrap()
                .reshape(&sd)
                .unwrap();
            let crate::value::Value::Tensor(got) =
                scatter_along(&t, &src, d, pos).unwrap().remove(0)
            else {
                panic!("scatter_along gives a tensor");
            };
            let storage = crate::ops::fused::with_storage::<f32, _>(&got, |v, _| v.len());
            assert_eq!(storage, Some(60), "dim {d} positions {pos:?}");
            let got = got.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let (tv, sv) = (
                t.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                src.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            );
            for (flat, &g) in got.iter().enumerate() {
                let mut at = [flat / 20, flat / 5 % 4, flat % 5];
                let want = match pos.iter().position(|&p| p == at[d]) {
                    Some(k) => {
                        at[d] = k;
                        sv[(at[0] * sd[1] + at[1]) * sd[2] + at[2]]
                    }
                    None => tv[flat],
                };
                assert_eq!(g, want, "dim {d} positions {pos:?} element {flat}");
            }
            assert_eq!(tv, (0..60).map(|v| v as f32).collect::<Vec<_>>());
        }
    }
}
