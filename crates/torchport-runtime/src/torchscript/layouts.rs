//! How torch holds the evaluator's tensors in memory (sizes, strides, storage offset), where
//! the evaluator can tell. Only `as_strided` needs it: it reads its input's storage, not its
//! elements in order, and a traced archive records the strides torch saw as numbers
//! (Longformer's chunks: `as_strided(x, size, [16, 32768, 128, 1])` over a view of a
//! transposed tensor). The runtime's kernels hold every tensor row-major, so the evaluator
//! follows torch's layouts beside them:
//! - the inputs are contiguous, the archive's tensors are as the archive stores them;
//! - a view op (`transpose`, `permute`, `slice`, `select`, `view`, `reshape`, `expand`,
//!   `split`, …) gives its result the strides torch gives it (`view` and `reshape` by torch's
//!   rule for when a new shape can share the memory, else `reshape` copies);
//! - an in-place op keeps its input's layout, and so does dropout (traced not training);
//! - Linear and matrix products make contiguous results;
//! - torch's elementwise ops (those it tags `pointwise`, listed in `pointwise.txt` by
//!   `tools/gen_ts_schemas.py`) lay their result out as its elementwise machinery does: the
//!   dims in the order of the inputs' strides ([`elementwise`]);
//! - reductions, norms, factories and the others of [`ROW_ORDER`] give contiguous results
//!   where every tensor input's strides fall from dim to dim (contiguous, row-major with
//!   gaps, broadcast), and convolutions, pooling and padding ([`SUGGESTED`]) where no input
//!   can be channels-last;
//! - anything else is not known: `einsum` may return a permuted product, LAPACK-backed ops
//!   return column-major matrices, a reduction of a transposed tensor follows torch's rules.
//!
//! `as_strided` of a tensor whose layout is known reads the storage torch would: where torch
//! holds the tensor without gaps or overlaps, the storage is the tensor's elements permuted
//! into stride order. Of any other tensor it is refused, never computed as if contiguous.

use candle_core::{Tensor, TensorId};

use super::aten::Ops;
use super::value::Val;
use crate::fast::HashMap as FastMap;

/// Operators beside torch's `pointwise` ones whose results torch lays out in the order of
/// their tensor inputs' strides (reductions and scans by torch's elementwise machinery;
/// norms, softmax and `clone` by `empty_like`; the rest write fresh row-major results). An
/// operator not here, nor in `pointwise.txt` or [`SUGGESTED`], gives results of unknown
/// layout.
const ROW_ORDER: &[&str] = &[
    "__and__",
    "__or__",
    "__xor__",
    "zeros",
    "ones",
    "full",
    "empty",
    "arange",
    "linspace",
    "scalar_tensor",
    "tensor",
    "zeros_like",
    "ones_like",
    "full_like",
    "empty_like",
    "eye",
    "sum",
    "mean",
    "amax",
    "amin",
    "max",
    "min",
    "argmax",
    "argmin",
    "prod",
    "cumsum",
    "cumprod",
    "logsumexp",
    "var",
    "std",
    "var_mean",
    "std_mean",
    "norm",
    "all",
    "any",
    "softmax",
    "log_softmax",
    "_softmax",
    "_log_softmax",
    "layer_norm",
    "native_layer_norm",
    "group_norm",
    "batch_norm",
    "instance_norm",
    "rms_norm",
    "embedding",
    "index",
    "index_select",
    "gather",
    "cat",
    "stack",
    "tril",
    "triu",
    "flip",
    "roll",
    "repeat",
    "tile",
    "clone",
];

/// Operators whose results torch lays out by their inputs' suggested memory format:
/// contiguous, unless a 4-d or 5-d input is held channels-last.
const SUGGESTED: &[&str] = &[
    "constant_pad_nd",
    "pad",
    "conv1d",
    "conv2d",
    "conv3d",
    "_convolution",
    "convolution",
    "max_pool1d",
    "max_pool2d",
    "avg_pool1d",
    "avg_pool2d",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "upsample_nearest2d",
    "upsample_bilinear2d",
];

/// Whether torch tags `op` `pointwise` (`pointwise.txt`).
fn is_pointwise(op: &str) -> bool {
    static POINTWISE: std::sync::OnceLock<std::collections::HashSet<&'static str>> =
        std::sync::OnceLock::new();
    let pointwise = POINTWISE.get_or_init(|| include_str!("pointwise.txt").lines().collect());
    pointwise.contains(op)
}

/// Whether torch lays `op`'s results out in the order of its tensor inputs' strides.
fn keeps_row_order(op: &str) -> bool {
    is_pointwise(op) || ROW_ORDER.contains(&op)
}

/// The layout torch's elementwise machinery gives the result (of sizes `out`) of inputs laid
/// out as `inputs`, in order: the dims sorted by the strides of the first input that tells
/// two apart (broadcast dims tell none; equal strides put the smaller dim inside), starting
/// from row-major, and the result made dense in that order.
fn elementwise(inputs: &[Layout], out: &[usize]) -> Option<Layout> {
    let n = out.len();
    // Each input's strides against the result's dims: 0 where broadcast.
    let mut aligned = Vec::with_capacity(inputs.len());
    for l in inputs {
        let lead = n.checked_sub(l.sizes.len())?;
        let strides: Vec<i64> = (0..n)
            .map(|i| match i.checked_sub(lead) {
                Some(j) if !(l.sizes[j] == 1 && out[i] != 1) => l.strides[j],
                _ => 0,
            })
            .collect();
        aligned.push(strides);
    }
    // Whether dim `a`, now inside dim `b`, goes outside it (1), stays (-1), or either (0).
    let swap = |a: usize, b: usize| {
        for s in &aligned {
            let (sa, sb) = (s[a], s[b]);
            if sa == 0 || sb == 0 {
                continue;
            }
            if sa != sb {
                return if sa < sb { -1 } else { 1 };
            }
            if out[a] > out[b] {
                return 1;
            }
        }
        0
    };
    // `perm[0]` the innermost dim.
    let mut perm: Vec<usize> = (0..n).rev().collect();
    for i in 1..n {
        let mut moving = i;
        for inner in (0..i).rev() {
            match swap(perm[inner], perm[moving]) {
                1 => {
                    perm.swap(inner, moving);
                    moving = inner;
                }
                -1 => break,
                _ => {}
            }
        }
    }
    let mut strides = vec![0i64; n];
    let mut step = 1i64;
    for &d in &perm {
        strides[d] = step;
        step = step.checked_mul(out[d].max(1) as i64)?;
    }
    Some(Layout {
        sizes: out.to_vec(),
        strides,
        offset: 0,
    })
}

/// Sizes, strides (in elements) and storage offset of a tensor, as torch holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    sizes: Vec<usize>,
    strides: Vec<i64>,
    offset: i64,
}

impl Layout {
    /// Row-major from offset 0.
    pub fn contiguous(sizes: &[usize]) -> Layout {
        let strides = torchport::contiguous_strides(sizes);
        Layout {
            sizes: sizes.to_vec(),
            strides: strides.iter().map(|&s| s as i64).collect(),
            offset: 0,
        }
    }

    /// As the archive stores a tensor.
    pub fn stored(info: &torchport::TensorInfo) -> Layout {
        Layout {
            sizes: info.shape.clone(),
            strides: info.strides.iter().map(|&s| s as i64).collect(),
            offset: info.offset as i64,
        }
    }

    /// Whether the elements are row-major without gaps (strides of size-1 dims aside), from
    /// any offset: torch's `is_contiguous`.
    fn is_contiguous(&self) -> bool {
        let mut expected = 1i64;
        for (&n, &s) in self.sizes.iter().zip(&self.strides).rev() {
            if n != 1 && s != expected {
                return false;
            }
            expected = expected.saturating_mul(n as i64);
        }
        true
    }

    /// Whether the strides fall strictly from dim to dim, those of size-1 and broadcast
    /// (stride 0) dims aside: torch's elementwise machinery then keeps the dims in order,
    /// and lays a result of such inputs out row-major.
    fn in_row_order(&self) -> bool {
        let mut strides = self
            .sizes
            .iter()
            .zip(&self.strides)
            .filter(|&(&n, &s)| n != 1 && s != 0)
            .map(|(_, &s)| s);
        let Some(mut last) = strides.next() else {
            return true;
        };
        strides.all(|s| {
            let falls = s < last;
            last = s;
            falls
        })
    }

    /// The dims in the order of decreasing stride, where the tensor covers a block of
    /// storage without gaps or overlaps (its elements permuted so are the block in order);
    /// `None` where it does not.
    fn storage_order(&self) -> Option<Vec<usize>> {
        let mut order: Vec<usize> = (0..self.sizes.len()).collect();
        order.sort_by_key(|&d| std::cmp::Reverse(self.strides[d]));
        let mut expected = 1i64;
        for &d in order.iter().rev() {
            let n = self.sizes[d];
            if n == 0 {
                return Some(order);
            }
            if n != 1 {
                if self.strides[d] != expected {
                    return None;
                }
                expected = expected.checked_mul(n as i64)?;
            }
        }
        Some(order)
    }

    /// Whether `self` and `other` place every element alike (the strides of size-1 dims
    /// aside).
    fn same_places(&self, other: &Layout) -> bool {
        let used = |l: &Layout| {
            l.sizes
                .iter()
                .zip(&l.strides)
                .map(|(&n, &s)| if n == 1 { 0 } else { s })
                .collect::<Vec<_>>()
        };
        self.sizes == other.sizes && self.offset == other.offset && used(self) == used(other)
    }

    /// This layout with dims `a` and `b` swapped.
    fn swapped(&self, a: usize, b: usize) -> Layout {
        let mut l = self.clone();
        l.sizes.swap(a, b);
        l.strides.swap(a, b);
        l
    }
}

/// The strides torch gives a tensor of `sizes` and `strides` viewed as `new` (ATen's rule
/// for `view`: the old dims fall into runs that are contiguous among themselves, and the new
/// shape must split into runs of the same element counts), or `None` where it cannot be a
/// view (`reshape` then copies).
pub fn view_strides(sizes: &[usize], strides: &[i64], new: &[usize]) -> Option<Vec<i64>> {
    let Some(&last) = strides.last() else {
        return Some(vec![1; new.len()]);
    };
    if sizes.contains(&0) {
        return Some(match sizes == new {
            true => strides.to_vec(),
            false => Layout::contiguous(new).strides,
        });
    }
    let mut out = vec![0i64; new.len()];
    // The new dims not yet given a stride: `new[..left]`.
    let mut left = new.len();
    let mut base = last;
    let (mut run, mut viewed) = (1usize, 1usize);
    for d in (0..sizes.len()).rev() {
        run = run.checked_mul(sizes[d])?;
        let run_ends =
            d == 0 || (sizes[d - 1] != 1 && strides[d - 1] != (run as i64).saturating_mul(base));
        if !run_ends {
            continue;
        }
        while left > 0 && (viewed < run || new[left - 1] == 1) {
            left -= 1;
            out[left] = (viewed as i64).checked_mul(base)?;
            viewed = viewed.checked_mul(new[left])?;
        }
        if viewed != run {
            return None;
        }
        if d > 0 {
            base = strides[d - 1];
            run = 1;
            viewed = 1;
        }
    }
    (left == 0).then_some(out)
}

/// The layouts known in one run, by tensor. A tensor not here has a layout the evaluator
/// does not know.
pub struct Layouts<'a> {
    /// The archive's tensors.
    stored: &'a FastMap<TensorId, Layout>,
    known: FastMap<TensorId, Known>,
}

/// A known layout, small where it is the usual one (every tensor made in a run has one).
enum Known {
    /// Contiguous from offset 0 (the strides of size-1 dims aside).
    Contiguous,
    Other(Box<Layout>),
}

/// `v` (absent: 0) as an index into `n` dims, by the kernels' rule ([`crate::ops::dim`]);
/// `None` where the tensor has no such dim.
fn dim(v: Option<&Val>, n: usize) -> Option<usize> {
    let d = match v {
        Some(Val::Int(d)) => *d,
        None => 0,
        _ => return None,
    };
    crate::ops::dim(d, n).ok().filter(|&d| d < n)
}

/// Whether `pred` holds for every tensor among `args` and `kwargs` (in lists and tuples
/// too, to a depth of 4).
fn every_tensor(args: &[Val], kwargs: &[(String, Val)], pred: &dyn Fn(&Tensor) -> bool) -> bool {
    fn each(v: &Val, depth: usize, pred: &dyn Fn(&Tensor) -> bool) -> bool {
        match v {
            Val::Tensor(t) => pred(t),
            Val::List(_) | Val::Tuple(_) if depth < 4 => v
                .items()
                .unwrap_or_default()
                .iter()
                .all(|x| each(x, depth + 1, pred)),
            _ => true,
        }
    }
    args.iter()
        .chain(kwargs.iter().map(|(_, v)| v))
        .all(|v| each(v, 0, pred))
}

/// `v` as a list of ints.
fn ints(v: Option<&Val>) -> Option<Vec<i64>> {
    v?.items()?
        .iter()
        .map(|x| match x {
            Val::Int(i) => Some(*i),
            _ => None,
        })
        .collect()
}

/// Argument `i` of a call, positional or by keyword `name`.
fn arg<'v>(args: &'v [Val], kwargs: &'v [(String, Val)], i: usize, name: &str) -> Option<&'v Val> {
    args.get(i)
        .or_else(|| kwargs.iter().find(|(k, _)| k == name).map(|(_, v)| v))
}

impl<'a> Layouts<'a> {
    /// No layouts known beyond the archive's tensors `stored`.
    pub fn new(stored: &'a FastMap<TensorId, Layout>) -> Self {
        Layouts {
            stored,
            known: FastMap::default(),
        }
    }

    /// `t`'s layout, if known.
    pub fn get(&self, t: &Tensor) -> Option<Layout> {
        match self.known.get(&t.id()) {
            Some(Known::Contiguous) => Some(Layout::contiguous(t.dims())),
            Some(Known::Other(l)) => Some((**l).clone()),
            None => self.stored.get(&t.id()).cloned(),
        }
    }

    /// Record `t`'s layout: `None`, not known.
    fn set(&mut self, t: &Tensor, layout: Option<Layout>) {
        match layout {
            None => self.known.remove(&t.id()),
            Some(l) if l.offset == 0 && l.is_contiguous() => {
                self.known.insert(t.id(), Known::Contiguous)
            }
            Some(l) => self.known.insert(t.id(), Known::Other(Box::new(l))),
        };
    }

    /// `t` is contiguous from offset 0 (an input of the run).
    pub fn fresh(&mut self, t: &Tensor) {
        self.known.insert(t.id(), Known::Contiguous);
    }

    /// `new` is the new value of `old`, a tensor of the same sizes (an in-place update
    /// written back): the same memory.
    pub fn inherit(&mut self, old: TensorId, new: &Tensor) {
        match self.known.get(&old) {
            Some(Known::Contiguous) => self.fresh(new),
            Some(Known::Other(l)) => self.set(new, Some((**l).clone())),
            None => self.set(new, self.stored.get(&old).cloned()),
        }
    }

    /// Record the layout of `result`, what op `op` returned for `args` and `kwargs`. Where
    /// the runtime returned an input itself but torch would hold the result otherwise
    /// (`contiguous` of a transposed tensor, whose kernel returns it as it is), the result
    /// is given an identity of its own first.
    pub fn after(
        &mut self,
        op: &str,
        args: &[Val],
        kwargs: &[(String, Val)],
        result: Val,
        ops: &Ops,
    ) -> Result<Val, String> {
        match result {
            Val::Tensor(t) => {
                let layout = self.infer(op, args, kwargs, &t, ops);
                let same = args
                    .iter()
                    .any(|a| matches!(a, Val::Tensor(x) if x.id() == t.id()));
                let alike = match (&layout, self.get(&t)) {
                    (Some(a), Some(b)) => a.same_places(&b),
                    (a, b) => a.is_none() && b.is_none(),
                };
                let t = match same && !alike {
                    true => super::view_writes::new_identity(&t)?,
                    false => t,
                };
                self.set(&t, layout);
                Ok(Val::Tensor(t))
            }
            Val::List(_) | Val::Tuple(_) => {
                let items = result.items().unwrap_or_default();
                let input = match args.first() {
                    Some(Val::Tensor(x)) => self.get(x),
                    _ => None,
                };
                // The start of each part along the dim split.
                let mut start = 0usize;
                for (i, x) in items.iter().enumerate() {
                    let Val::Tensor(t) = x else { continue };
                    let layout = match (op, &input) {
                        ("unbind", Some(l)) => {
                            let d = dim(arg(args, kwargs, 1, "dim"), l.sizes.len());
                            d.and_then(|d| select(l, d, i as i64))
                        }
                        ("split" | "split_with_sizes" | "chunk", Some(l)) => {
                            let d = dim(arg(args, kwargs, 2, "dim"), l.sizes.len());
                            d.and_then(|d| {
                                let part = slice(l, d, start as i64, t.dims().get(d)?, 1);
                                start += t.dims()[d];
                                part
                            })
                        }
                        _ => None,
                    };
                    if layout.is_some() {
                        self.set(t, layout);
                    }
                }
                if keeps_row_order(op) && self.all_in_row_order(args, kwargs) {
                    for x in items {
                        if let Val::Tensor(t) = x {
                            self.fresh(&t);
                        }
                    }
                }
                Ok(result)
            }
            other => Ok(other),
        }
    }

    /// Record the tensors of `result` (one, or a list or tuple of them) that an op of the
    /// evaluator's own or another library's returned for `args` and `kwargs`: contiguous
    /// where it read no tensor (`ops.prim.NumToTensor(n)`), else not known.
    pub fn made(&mut self, args: &[Val], kwargs: &[(String, Val)], result: &Val) {
        if !every_tensor(args, kwargs, &|_| false) {
            return;
        }
        let items = match result {
            Val::Tensor(_) => vec![result.clone()],
            Val::List(_) | Val::Tuple(_) => result.items().unwrap_or_default(),
            _ => return,
        };
        for x in items {
            if let Val::Tensor(t) = x {
                self.fresh(&t);
            }
        }
    }

    /// Whether every tensor among `args` and `kwargs` (in lists too) is known to be in row
    /// order ([`Layout::in_row_order`]).
    fn all_in_row_order(&self, args: &[Val], kwargs: &[(String, Val)]) -> bool {
        every_tensor(args, kwargs, &|t| match self.known.get(&t.id()) {
            // The usual case, without building its layout.
            Some(Known::Contiguous) => true,
            _ => self.get(t).is_some_and(|l| l.in_row_order()),
        })
    }

    /// The layout torch gives `result` of op `op`, if the evaluator can tell.
    fn infer(
        &self,
        op: &str,
        args: &[Val],
        kwargs: &[(String, Val)],
        result: &Tensor,
        ops: &Ops,
    ) -> Option<Layout> {
        let dims = result.dims();
        // A memory format other than contiguous or preserve (channels-last).
        if kwargs
            .iter()
            .any(|(k, v)| k == "memory_format" && matches!(v, Val::Int(2 | 3)))
        {
            return None;
        }
        // Products, and new tensors of the sizes given, whatever their inputs' layouts.
        if matches!(
            op,
            "linear"
                | "addmm"
                | "mm"
                | "bmm"
                | "baddbmm"
                | "matmul"
                | "new_ones"
                | "new_zeros"
                | "new_full"
                | "new_empty"
                | "new_tensor"
        ) {
            return Some(Layout::contiguous(dims));
        }
        // `other` gives only its dtype.
        if op == "type_as" {
            return self
                .all_in_row_order(&args[..args.len().min(1)], &[])
                .then(|| Layout::contiguous(dims));
        }
        let input = match args.first() {
            Some(Val::Tensor(x)) => Some((x, self.get(x))),
            _ => None,
        };
        // In place, or the input itself (dropout when not training, as traced).
        if super::builtins::is_inplace(op) || op.ends_with("dropout") {
            return input?.1;
        }
        if is_pointwise(op) {
            // Inputs without gaps, or in row order (where torch's ops that copy their first
            // input first agree with its elementwise machinery).
            let mut inputs = Vec::new();
            for v in args.iter().chain(kwargs.iter().map(|(_, v)| v)) {
                if let Val::Tensor(t) = v {
                    let l = self.get(t)?;
                    if l.storage_order().is_none() && !l.in_row_order() {
                        return None;
                    }
                    inputs.push(l);
                }
            }
            return elementwise(&inputs, dims);
        }
        if ROW_ORDER.contains(&op) {
            return self
                .all_in_row_order(args, kwargs)
                .then(|| Layout::contiguous(dims));
        }
        if SUGGESTED.contains(&op) {
            // Not channels-last: of another rank, or in row order.
            let plain = |v: &Val| match v {
                Val::Tensor(t) => self
                    .get(t)
                    .is_some_and(|l| !matches!(l.sizes.len(), 4 | 5) || l.in_row_order()),
                _ => true,
            };
            let all = args.iter().chain(kwargs.iter().map(|(_, v)| v)).all(plain);
            return all.then(|| Layout::contiguous(dims));
        }
        if !ops.is_view(op) && !matches!(op, "narrow" | "_unsafe_view") {
            return None;
        }
        let (x, l) = input?;
        let l = &l?;
        let n = l.sizes.len();
        let a = |i: usize, name: &str| arg(args, kwargs, i, name);
        let int = |i: usize, name: &str, default: i64| match a(i, name) {
            None | Some(Val::None) => Some(default),
            Some(Val::Int(v)) => Some(*v),
            _ => None,
        };
        match op {
            "transpose" | "swapaxes" | "swapdims" => {
                Some(l.swapped(dim(a(1, "dim0"), n)?, dim(a(2, "dim1"), n)?))
            }
            "t" | "numpy_T" if n == 2 => Some(l.swapped(0, 1)),
            "t" => Some(l.clone()),
            "permute" => {
                let order = ints(a(1, "dims"))?;
                let mut p = Layout {
                    sizes: Vec::new(),
                    strides: Vec::new(),
                    offset: l.offset,
                };
                for d in order {
                    let d = dim(Some(&Val::Int(d)), n)?;
                    p.sizes.push(l.sizes[d]);
                    p.strides.push(l.strides[d]);
                }
                (p.sizes.len() == n).then_some(p)
            }
            "select" => select(l, dim(a(1, "dim"), n)?, int(2, "index", 0)?),
            "slice" => {
                let d = dim(a(1, "dim"), n)?;
                let size = l.sizes[d] as i64;
                let start = int(2, "start", 0)?;
                let start = if start < 0 { start + size } else { start };
                slice(l, d, start.clamp(0, size), dims.get(d)?, int(4, "step", 1)?)
            }
            "narrow" => {
                let d = dim(a(1, "dim"), n)?;
                let start = int(2, "start", 0)?;
                let start = if start < 0 {
                    start + l.sizes[d] as i64
                } else {
                    start
                };
                slice(l, d, start, dims.get(d)?, 1)
            }
            "expand" | "expand_as" | "broadcast_to" => {
                let lead = dims.len().checked_sub(n)?;
                let mut strides = vec![0i64; lead];
                for (d, (&size, &stride)) in l.sizes.iter().zip(&l.strides).enumerate() {
                    strides.push(if size == dims[lead + d] { stride } else { 0 });
                }
                Some(Layout {
                    sizes: dims.to_vec(),
                    strides,
                    offset: l.offset,
                })
            }
            "as_strided" => Some(Layout {
                sizes: dims.to_vec(),
                strides: ints(a(2, "stride"))?,
                offset: int(3, "storage_offset", l.offset)?,
            }),
            "contiguous" => Some(match l.is_contiguous() {
                true => l.clone(),
                false => Layout::contiguous(dims),
            }),
            "alias" | "detach" => Some(l.clone()),
            // Of the same dtype: the input itself; else a copy in the input's order, where
            // that has no gaps or overlaps, else row-major where the input is in row order.
            "to" if result.dtype() == x.dtype() => Some(l.clone()),
            "to" => match (l.storage_order(), l.in_row_order()) {
                (Some(_), _) => Some(Layout {
                    offset: 0,
                    ..l.clone()
                }),
                (None, true) => Some(Layout::contiguous(dims)),
                (None, false) => None,
            },
            "view" | "_unsafe_view" | "view_as" | "reshape" | "reshape_as" | "flatten"
            | "unflatten" | "squeeze" | "unsqueeze"
                if result.dtype() == x.dtype() =>
            {
                match view_strides(&l.sizes, &l.strides, dims) {
                    Some(strides) => Some(Layout {
                        sizes: dims.to_vec(),
                        strides,
                        offset: l.offset,
                    }),
                    None if matches!(op, "reshape" | "reshape_as" | "flatten") => {
                        Some(Layout::contiguous(dims))
                    }
                    None => None,
                }
            }
            _ => None,
        }
    }

    /// `torch.as_strided(self, size, stride, storage_offset)` over the storage torch would
    /// hold `self` in: refused where `self`'s layout is not known, or torch holds it with
    /// gaps or overlaps, or the result reads before its first element.
    pub fn as_strided(
        &self,
        args: &[Val],
        kwargs: &[(String, Val)],
        ops: &Ops,
    ) -> Result<Val, String> {
        let why = |what: &str| {
            format!("torch.as_strided reads the memory torch holds its input in, and {what}")
        };
        let Some(Val::Tensor(x)) = args.first() else {
            return ops.call("as_strided", args, kwargs);
        };
        let l = self.get(x).ok_or_else(|| {
            why(
                "the evaluator cannot tell how torch lays that input out (an op of torch's \
                 that follows its input's order made it from a tensor not held contiguously)",
            )
        })?;
        let offset = match arg(args, kwargs, 3, "storage_offset") {
            None | Some(Val::None) => l.offset,
            Some(Val::Int(o)) => *o,
            Some(v) => {
                return Err(format!(
                    "as_strided's storage_offset is a {}",
                    v.type_name()
                ))
            }
        };
        let relative = offset - l.offset;
        if relative < 0 {
            return Err(why("it would read before the input's first element"));
        }
        let size = arg(args, kwargs, 1, "size").cloned().unwrap_or(Val::None);
        let stride = arg(args, kwargs, 2, "stride").cloned().unwrap_or(Val::None);
        let block = match l.is_contiguous() {
            true => x.clone(),
            false => {
                let order = l.storage_order().ok_or_else(|| {
                    why("torch holds that input with gaps or overlapping elements")
                })?;
                let order = order.into_iter().map(|d| Val::Int(d as i64)).collect();
                match ops.call("permute", &[Val::Tensor(x.clone()), Val::list(order)], &[])? {
                    Val::Tensor(t) => t,
                    _ => return Err("permute did not return a tensor".into()),
                }
            }
        };
        let args = [Val::Tensor(block), size, stride, Val::Int(relative)];
        ops.call("as_strided", &args, &[])
    }
}

/// `l` with index `i` of dim `d` selected.
fn select(l: &Layout, d: usize, i: i64) -> Option<Layout> {
    let n = l.sizes[d] as i64;
    let i = if i < 0 { i + n } else { i };
    let mut s = l.clone();
    s.offset = l.offset.checked_add(i.checked_mul(l.strides[d])?)?;
    s.sizes.remove(d);
    s.strides.remove(d);
    Some(s)
}

/// `l`'s dim `d` cut to `len` elements from `start`, every `step`-th.
fn slice(l: &Layout, d: usize, start: i64, len: &usize, step: i64) -> Option<Layout> {
    let mut s = l.clone();
    s.offset = l.offset.checked_add(start.checked_mul(l.strides[d])?)?;
    s.sizes[d] = *len;
    s.strides[d] = l.strides[d].checked_mul(step)?;
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// The cases of `tests/fixtures/torchscript/<name>`, made by
    /// `tests/fixtures/gen/gen_torchscript.py`.
    fn cases(name: &str) -> Vec<Value> {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/torchscript"
        );
        let text = std::fs::read_to_string(format!("{dir}/{name}")).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    fn ints(v: &Value) -> Vec<i64> {
        let items = v.as_array().unwrap().iter();
        items.map(|x| x.as_i64().unwrap()).collect()
    }

    fn sizes(v: &Value) -> Vec<usize> {
        ints(v).iter().map(|&d| d as usize).collect()
    }

    /// `view` strides as torch gives them, or refuses the view, for 400 layouts.
    #[test]
    fn view_strides_are_torchs() {
        let cases = cases("view_strides.json");
        let (mut views, mut refused) = (0, 0);
        for c in &cases {
            let new = sizes(&c["new"]);
            let want = (!c["torch"].is_null()).then(|| ints(&c["torch"]));
            let got = view_strides(&sizes(&c["sizes"]), &ints(&c["strides"]), &new);
            match &want {
                Some(_) => views += 1,
                None => refused += 1,
            }
            assert_eq!(got, want, "{c}");
        }
        assert!(
            views > 100 && refused > 50,
            "{views} views, {refused} refused"
        );
    }

    /// The layouts of elementwise results as torch gives them, for 300 sets of permuted and
    /// broadcast inputs.
    #[test]
    fn elementwise_layouts_are_torchs() {
        let cases = cases("elementwise_strides.json");
        let mut permuted = 0;
        for c in &cases {
            let inputs: Vec<Layout> = c["inputs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| Layout {
                    sizes: sizes(&i["sizes"]),
                    strides: ints(&i["strides"]),
                    offset: 0,
                })
                .collect();
            let out = sizes(&c["sizes"]);
            let got = elementwise(&inputs, &out).unwrap();
            let want = Layout {
                sizes: out.clone(),
                strides: ints(&c["torch"]),
                offset: 0,
            };
            permuted += usize::from(!want.is_contiguous());
            // Strides of size-1 dims are never read.
            let used = |l: &Layout| -> Vec<i64> {
                l.strides
                    .iter()
                    .zip(&out)
                    .filter(|&(_, &n)| n != 1)
                    .map(|(&s, _)| s)
                    .collect()
            };
            assert_eq!(used(&got), used(&want), "{c}");
        }
        assert!(permuted > 100, "{permuted} permuted results");
    }

    #[test]
    fn dense_orders_and_gaps() {
        let l = |sizes: &[usize], strides: &[i64]| Layout {
            sizes: sizes.to_vec(),
            strides: strides.to_vec(),
            offset: 0,
        };
        assert_eq!(l(&[4, 3], &[1, 4]).storage_order(), Some(vec![1, 0]));
        assert_eq!(l(&[4, 3], &[1, 8]).storage_order(), None, "a gap");
        assert_eq!(l(&[4, 3], &[0, 1]).storage_order(), None, "an overlap");
        assert!(l(&[2, 1, 3], &[3, 99, 1]).is_contiguous());
        assert!(!l(&[2, 3], &[1, 2]).is_contiguous());
    }
}
