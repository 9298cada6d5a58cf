//! Scatters: `scatter` (`.src`, `.value`, `.reduce`, `.value_reduce`), `scatter_add`,
//! `scatter_reduce.two` (sum, prod, mean, amax, amin; `include_self` both ways) and
//! `index_add` (with `alpha`). One kernel walks the index tensor in row-major order (the
//! order ATen's CPU kernel applies repeated indices in) and combines each source element
//! into its slot, in the tensor's own type: f32, f64, i64 (exact), bool (sum as or, prod as and;
//! no mean).
//! An index outside the dim is an error. `one_hot` scatters ones into zeros.

use candle_core::{DType, Device, Tensor, WithDType};
use torchport::contiguous_strides;

use super::{dim, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs, Scalar};

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    r.add("aten.scatter.src", scatter);
    r.add("aten.scatter.value", scatter);
    r.add("aten.scatter.reduce", scatter);
    r.add("aten.scatter.value_reduce", scatter);
    r.add("aten.scatter_add.default", scatter);
    r.add("aten.scatter_reduce.two", scatter);
    r.add("aten.index_add.default", index_add);
    r.add("aten.one_hot.default", one_hot);
}

/// `one_hot(self, num_classes=-1)`: int64 `[*self.shape, num_classes]`, 1 at each class
/// index and 0 elsewhere; -1 classes means the largest index plus one. As in torch, indices
/// must be integers in `[0, num_classes)`, and -1 cannot be used on an empty tensor.
fn one_hot(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    if super::category(t.dtype()) != 1 {
        op_bail!(
            "one_hot needs an integer (int64) tensor, got {:?}",
            t.dtype()
        );
    }
    let idx = t.flatten_all()?.to_dtype(DType::I64)?.to_vec1::<i64>()?;
    let classes = match a.int_or("num_classes", -1)? {
        -1 if idx.is_empty() => {
            op_bail!("one_hot: cannot infer the number of classes from an empty tensor")
        }
        -1 => idx.iter().copied().max().unwrap_or(0).saturating_add(1),
        n if n < 0 => op_bail!("one_hot: num_classes must be -1 or at least 0, got {n}"),
        n => n,
    };
    if let Some(&bad) = idx.iter().find(|&&i| i < 0 || i >= classes) {
        op_bail!("one_hot: class value {bad} is outside [0, {classes})");
    }
    let classes = usize::try_from(classes)
        .map_err(|_| crate::error::OpError("one_hot: too many classes".into()))?;
    let mut shape = t.dims().to_vec();
    shape.push(classes);
    let n = super::result_numel(&shape, "one_hot")?;
    let mut out = vec![0i64; n];
    for (row, &i) in idx.iter().enumerate() {
        out[row * classes + i as usize] = 1;
    }
    one(Tensor::from_vec(out, shape, &Device::Cpu)?)
}

/// How a source element combines with its slot.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Reduce {
    Replace,
    Sum,
    Prod,
    Mean,
    Max,
    Min,
}

/// The element types the scatters compute in.
trait Elem: WithDType {
    /// `a + b` (logical or for bool).
    fn plus(a: Self, b: Self) -> Self;
    /// `a * b` (logical and for bool).
    fn times(a: Self, b: Self) -> Self;
    /// The larger, NaN winning (ATen's scatter maximum).
    fn most(a: Self, b: Self) -> Self;
    /// The smaller, NaN winning.
    fn least(a: Self, b: Self) -> Self;
    /// The identity of max and of min: (lowest, highest).
    fn bounds() -> (Self, Self);
    /// `sum / count` (floor division for ints).
    fn mean(sum: Self, count: usize) -> Self;
    /// Whether the type has arithmetic (bool has or, and, max, min but no mean).
    const ARITH: bool = true;
}

macro_rules! float_elem {
    ($t:ty) => {
        impl Elem for $t {
            fn plus(a: $t, b: $t) -> $t {
                a + b
            }
            fn times(a: $t, b: $t) -> $t {
                a * b
            }
            fn most(a: $t, b: $t) -> $t {
                if b.is_nan() || a < b {
                    b
                } else {
                    a
                }
            }
            fn least(a: $t, b: $t) -> $t {
                if b.is_nan() || b < a {
                    b
                } else {
                    a
                }
            }
            fn bounds() -> ($t, $t) {
                (<$t>::NEG_INFINITY, <$t>::INFINITY)
            }
            fn mean(sum: $t, count: usize) -> $t {
                sum / count as $t
            }
        }
    };
}
float_elem!(f32);
float_elem!(f64);

impl Elem for i64 {
    fn plus(a: i64, b: i64) -> i64 {
        a.wrapping_add(b)
    }
    fn times(a: i64, b: i64) -> i64 {
        a.wrapping_mul(b)
    }
    fn most(a: i64, b: i64) -> i64 {
        a.max(b)
    }
    fn least(a: i64, b: i64) -> i64 {
        a.min(b)
    }
    fn bounds() -> (i64, i64) {
        (i64::MIN, i64::MAX)
    }
    fn mean(sum: i64, count: usize) -> i64 {
        // Floor division (count is positive).
        sum.div_euclid(count as i64)
    }
}

impl Elem for u8 {
    fn plus(a: u8, b: u8) -> u8 {
        u8::from(a != 0 || b != 0)
    }
    fn times(a: u8, b: u8) -> u8 {
        u8::from(a != 0 && b != 0)
    }
    fn most(a: u8, b: u8) -> u8 {
        a.max(b)
    }
    fn least(a: u8, b: u8) -> u8 {
        a.min(b)
    }
    fn bounds() -> (u8, u8) {
        (0, 1)
    }
    fn mean(sum: u8, _: usize) -> u8 {
        sum
    }
    const ARITH: bool = false;
}

/// Combine `v` into `slot` by `r` (mean sums; it is divided at the end).
fn combine<T: Elem>(r: Reduce, slot: T, v: T) -> T {
    match r {
        Reduce::Replace => v,
        Reduce::Sum | Reduce::Mean => T::plus(slot, v),
        Reduce::Prod => T::times(slot, v),
        Reduce::Max => T::most(slot, v),
        Reduce::Min => T::least(slot, v),
    }
}

/// What a scatter writes: a tensor's elements or one value.
enum Source {
    Tensor(Tensor),
    Value(Scalar),
}

fn scatter(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let target = a.node().target.as_str();
    let (reduce, include_self) = if target.contains("scatter_add") {
        (Reduce::Sum, true)
    } else if target.contains("scatter_reduce") {
        let r = match a.str_or("reduce", "")? {
            "sum" => Reduce::Sum,
            "prod" => Reduce::Prod,
            "mean" => Reduce::Mean,
            "amax" => Reduce::Max,
            "amin" => Reduce::Min,
            other => op_bail!("scatter_reduce with reduce '{other}' is not supported"),
        };
        (r, a.bool_or("include_self", true)?)
    } else if a.has("reduce") {
        match a.str_or("reduce", "")? {
            "add" => (Reduce::Sum, true),
            "multiply" => (Reduce::Prod, true),
            other => op_bail!("scatter with reduce '{other}' is not supported"),
        }
    } else {
        (Reduce::Replace, true)
    };
    let src = if a.has("src") {
        Source::Tensor(a.tensor("src")?)
    } else {
        Source::Value(a.scalar("value")?)
    };
    let index = a.tensor("index")?;
    let d = a.int("dim")?;
    let y = match t.dtype() {
        DType::F32 => scatter_t::<f32>(&t, d, &index, &src, reduce, include_self)?,
        DType::F64 => scatter_t::<f64>(&t, d, &index, &src, reduce, include_self)?,
        DType::I64 => scatter_t::<i64>(&t, d, &index, &src, reduce, include_self)?,
        DType::U8 => scatter_t::<u8>(&t, d, &index, &src, reduce, include_self)?,
        dt => op_bail!("scatter on {dt:?} tensors is not supported"),
    };
    one(y)
}

/// Shape of `t` with a 0-d tensor read as `[1]` (ATen scatters into 0-d tensors that way).
fn dims1(t: &Tensor) -> Vec<usize> {
    if t.rank() == 0 {
        vec![1]
    } else {
        t.dims().to_vec()
    }
}

/// An index value checked against a dim of `len`.
fn checked(i: i64, d: usize, len: usize) -> OpResult<usize> {
    if i < 0 || i as u64 >= len as u64 {
        op_bail!("index {i} is out of bounds for dimension {d} with size {len}");
    }
    Ok(i as usize)
}

/// The scatter kernel in element type `T`.
fn scatter_t<T: Elem>(
    t: &Tensor,
    d: i64,
    index: &Tensor,
    src: &Source,
    reduce: Reduce,
    include_self: bool,
) -> OpResult<Tensor> {
    if !T::ARITH && reduce == Reduce::Mean {
        op_bail!("scatter_reduce 'mean' on bool tensors is not supported");
    }
    let sd = dims1(t);
    let d = dim(d, t.rank())?;
    let mut out = t.flatten_all()?.to_vec1::<T>()?;
    let idims = dims1(index);
    if index.elem_count() == 0 {
        return Ok(t.clone());
    }
    if index.dtype() != DType::I64 {
        op_bail!("scatter index must be int64, got {:?}", index.dtype());
    }
    if idims.len() != sd.len() {
        op_bail!(
            "scatter index of shape {:?} must have the rank of self {:?}",
            index.dims(),
            t.dims()
        );
    }
    let (src_vals, src_strides) = match src {
        Source::Tensor(s) => {
            let s_dims = dims1(s);
            if s_dims.len() != sd.len() || idims.iter().zip(&s_dims).any(|(i, s)| i > s) {
                op_bail!(
                    "scatter index of shape {:?} does not fit in src of shape {:?}",
                    index.dims(),
                    s.dims()
                );
            }
            let v = s.to_dtype(T::DTYPE)?.flatten_all()?.to_vec1::<T>()?;
            (v, contiguous_strides(&s_dims))
        }
        // An int value through candle's conversion (exact for int64 beyond 2^53).
        Source::Value(Scalar::Int(v)) => (
            vec![Tensor::new(*v, &Device::Cpu)?
                .to_dtype(T::DTYPE)?
                .to_vec0::<T>()?],
            vec![0; sd.len()],
        ),
        Source::Value(v) => (vec![T::from_f64(v.as_f64())], vec![0; sd.len()]),
    };
    if idims
        .iter()
        .zip(&sd)
        .enumerate()
        .any(|(k, (i, s))| k != d && i > s)
    {
        op_bail!(
            "scatter index of shape {:?} does not fit in self of shape {:?} outside dim {d}",
            index.dims(),
            t.dims()
        );
    }
    let idx = index.flatten_all()?.to_vec1::<i64>()?;
    let s_strides = contiguous_strides(&sd);
    // Every (slot, source offset) in index order; indices checked first so that an error
    // leaves nothing half done.
    let mut pairs = Vec::with_capacity(idx.len());
    let mut pos = vec![0usize; idims.len()];
    for &i in &idx {
        let at = checked(i, d, sd[d])?;
        let (mut slot, mut from) = (0usize, 0usize);
        for (k, &p) in pos.iter().enumerate() {
            slot += if k == d { at } else { p } * s_strides[k];
            from += p * src_strides[k];
        }
        pairs.push((slot, from));
        for k in (0..pos.len()).rev() {
            pos[k] += 1;
            if pos[k] < idims[k] {
                break;
            }
            pos[k] = 0;
        }
    }
    let mut count = if reduce == Reduce::Mean {
        vec![usize::from(include_self); out.len()]
    } else {
        Vec::new()
    };
    if !include_self {
        let (lo, hi) = T::bounds();
        let init = match reduce {
            Reduce::Prod => T::from_f64(1.0),
            Reduce::Max => lo,
            Reduce::Min => hi,
            _ => T::from_f64(0.0),
        };
        for &(slot, _) in &pairs {
            out[slot] = init;
        }
    }
    for &(slot, from) in &pairs {
        out[slot] = combine(reduce, out[slot], src_vals[from]);
        if reduce == Reduce::Mean {
            count[slot] += 1;
        }
    }
    if reduce == Reduce::Mean {
        for (o, &c) in out.iter_mut().zip(&count) {
            *o = T::mean(*o, c.max(1));
        }
    }
    Ok(Tensor::from_vec(out, t.dims(), &Device::Cpu)?)
}

/// `index_add(self, dim, index, source, alpha=1)`: `self.select(dim, index[i]) += alpha *
/// source.select(dim, i)`.
fn index_add(a: &Args) -> OpResult<Outputs> {
    let t = a.tensor("self")?;
    let alpha = a.scalar_or("alpha", Scalar::Int(1))?;
    let y = match t.dtype() {
        DType::F32 => index_add_t::<f32>(a, &t, alpha.as_f64() as f32)?,
        DType::F64 => index_add_t::<f64>(a, &t, alpha.as_f64())?,
        DType::I64 => match alpha {
            Scalar::Int(v) => index_add_t::<i64>(a, &t, v)?,
            Scalar::Bool(b) => index_add_t::<i64>(a, &t, i64::from(b))?,
            Scalar::Float(f) => op_bail!("index_add of an int64 tensor with alpha {f}"),
        },
        DType::U8 => index_add_t::<u8>(a, &t, u8::from(alpha.as_f64() != 0.0))?,
        dt => op_bail!("index_add on {dt:?} tensors is not supported"),
    };
    one(y)
}

fn index_add_t<T: Elem>(a: &Args, t: &Tensor, alpha: T) -> OpResult<Tensor> {
    let src = a.tensor("source")?.to_dtype(T::DTYPE)?;
    let index = a.tensor("index")?;
    let d = dim(a.int("dim")?, t.rank())?;
    let sd = dims1(t);
    let src_dims = dims1(&src);
    if index.rank() > 1 || index.dtype() != DType::I64 {
        op_bail!(
            "index_add index must be a 1-d int64 tensor, got {:?} of shape {:?}",
            index.dtype(),
            index.dims()
        );
    }
    let idx = index.flatten_all()?.to_vec1::<i64>()?;
    let mut want = sd.clone();
    want[d] = idx.len();
    if src_dims != want {
        op_bail!(
            "index_add source of shape {:?} does not match self {:?} with {} indices along dim {d}",
            src.dims(),
            t.dims(),
            idx.len()
        );
    }
    let at: Vec<usize> = idx
        .iter()
        .map(|&i| checked(i, d, sd[d]))
        .collect::<OpResult<_>>()?;
    let mut out = t.flatten_all()?.to_vec1::<T>()?;
    let vals = src.flatten_all()?.to_vec1::<T>()?;
    let outer: usize = sd[..d].iter().product();
    let inner: usize = sd[d + 1..].iter().product();
    for o in 0..outer {
        for (i, &slot) in at.iter().enumerate() {
            let dst = (o * sd[d] + slot) * inner;
            let from = (o * at.len() + i) * inner;
            for k in 0..inner {
                out[dst + k] = T::plus(out[dst + k], T::times(alpha, vals[from + k]));
            }
        }
    }
    Ok(Tensor::from_vec(out, t.dims(), &Device::Cpu)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// An index outside the dim is an error naming it, not a panic or a write elsewhere.
    #[test]
    fn out_of_range_index_is_an_error() {
        let x = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
        let idx = Tensor::new(&[[0i64, 5, 1]], &Device::Cpu).unwrap();
        let src = Tensor::ones((1, 3), DType::F32, &Device::Cpu).unwrap();
        let tensors = [("x", x), ("i", idx), ("s", src)];
        let t = |n: &str| json!({"as_tensor": {"name": n}});
        let err = super::super::run_node(
            register,
            "aten.scatter_add.default",
            &[
                ("self", t("x")),
                ("dim", json!({"as_int": 0})),
                ("index", t("i")),
                ("src", t("s")),
            ],
            &tensors,
        )
        .unwrap_err();
        assert!(
            err.0
                .contains("index 5 is out of bounds for dimension 0 with size 2"),
            "{}",
            err.0
        );
        let idx = Tensor::new(&[-1i64], &Device::Cpu).unwrap();
        let src = Tensor::ones((2, 1), DType::F32, &Device::Cpu).unwrap();
        let err = super::super::run_node(
            register,
            "aten.index_add.default",
            &[
                ("self", t("x")),
                ("dim", json!({"as_int": 1})),
                ("index", t("i")),
                ("source", t("s")),
            ],
            &[("x", tensors[0].1.clone()), ("i", idx), ("s", src)],
        )
        .unwrap_err();
        assert!(err.0.contains("index -1 is out of bounds"), "{}", err.0);
    }

    fn one_hot_of(labels: &[i64], classes: i64) -> OpResult<Vec<Vec<i64>>> {
        let t = Tensor::new(labels, &Device::Cpu).unwrap();
        let args = [
            ("self", json!({"as_tensor": {"name": "t"}})),
            ("num_classes", json!({"as_int": classes})),
        ];
        let out = super::super::run_node(register, "aten.one_hot.default", &args, &[("t", t)])?;
        match &out[0] {
            crate::value::Value::Tensor(r) => Ok(r.to_vec2::<i64>().unwrap()),
            _ => panic!("not a tensor"),
        }
    }

    /// `one_hot` without a class count (TorchScript may call it so; `torch.export` cannot
    /// trace it) takes the largest label plus one; labels outside the classes, an empty input
    /// with no count, and a count whose result would not fit are refused.
    #[test]
    fn one_hot_infers_its_classes_and_refuses_bad_labels() {
        assert_eq!(one_hot_of(&[2, 0], -1).unwrap(), [[0, 0, 1], [1, 0, 0]]);
        assert_eq!(one_hot_of(&[1], 3).unwrap(), [[0, 1, 0]]);
        let err = |r: OpResult<Vec<Vec<i64>>>| r.unwrap_err().0;
        assert!(err(one_hot_of(&[3], 3)).contains("outside [0, 3)"));
        assert!(err(one_hot_of(&[-1, 0], -1)).contains("class value -1"));
        assert!(err(one_hot_of(&[], -1)).contains("empty"));
        assert!(err(one_hot_of(&[0], -7)).contains("num_classes"));
        assert!(err(one_hot_of(&[0, 1], 1 << 40)).contains("too large"));
    }
}
