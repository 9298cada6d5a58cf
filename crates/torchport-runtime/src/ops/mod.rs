//! The op registry: ATen overload name (`aten.conv2d.default`) → kernel. Each family file
//! registers its kernels in `register`; adding an op is one function plus one `r.add` line.
//!
//! A kernel reads its arguments by their ATen schema names through [`Args`] (defaults are
//! omitted by the serializer, so each kernel states the schema default it falls back to) and
//! returns one [`Value`](crate::value::Value) per schema output.

use std::collections::HashMap;

use candle_core::{DType, Tensor};

use crate::error::{OpError, OpResult};
use crate::value::{Args, Outputs, Scalar, TensorOrScalar};

pub mod activation;
pub mod activation_more;
pub mod attention;
pub mod conv;
pub mod detection;
pub mod distance;
mod dots;
pub mod einsum;
pub mod elementwise;
pub mod fused;
pub mod index;
pub mod integer;
pub mod interp;
pub mod linalg;
pub mod math;
pub mod norm;
pub mod packed;
pub mod pad;
pub mod pointwise;
pub mod pool;
pub mod pool3d;
pub mod rearrange;
pub mod reduce;
pub mod rnn;
pub mod sample;
pub mod scatter;
pub mod search;
pub mod sgemm;
pub mod shape;
pub mod sort;
pub mod stats;
pub(crate) mod stream;
pub mod strided;
pub mod sym;
mod tile;
pub mod unfold;
pub mod volume;
mod winograd;

/// An op kernel.
pub type OpFn = fn(&Args) -> OpResult<Outputs>;

/// Kernels by ATen overload name, without the `torch.ops.` prefix.
#[derive(Default)]
pub struct Registry {
    ops: HashMap<&'static str, OpFn>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// A registry with every kernel of this crate.
    pub fn with_all_ops() -> Self {
        let mut r = Registry::new();
        activation::register(&mut r);
        activation_more::register(&mut r);
        attention::register(&mut r);
        conv::register(&mut r);
        detection::register(&mut r);
        einsum::register(&mut r);
        elementwise::register(&mut r);
        integer::register(&mut r);
        interp::register(&mut r);
        linalg::register(&mut r);
        math::register(&mut r);
        norm::register(&mut r);
        packed::register(&mut r);
        pool::register(&mut r);
        rearrange::register(&mut r);
        sample::register(&mut r);
        scatter::register(&mut r);
        pool3d::register(&mut r);
        unfold::register(&mut r);
        distance::register(&mut r);
        reduce::register(&mut r);
        rnn::register(&mut r);
        search::register(&mut r);
        shape::register(&mut r);
        index::register(&mut r);
        pad::register(&mut r);
        pointwise::register(&mut r);
        sort::register(&mut r);
        stats::register(&mut r);
        sym::register(&mut r);
        volume::register(&mut r);
        r
    }

    /// [`Registry::with_all_ops`], built once per process and shared: a load looks its
    /// kernels up here rather than building the table again (0.7% of EfficientNet-B0's load
    /// samples at 1 thread; BENCHMARKS.md, issue 14).
    pub(crate) fn all_ops() -> &'static Registry {
        static ALL: std::sync::OnceLock<Registry> = std::sync::OnceLock::new();
        ALL.get_or_init(Registry::with_all_ops)
    }

    /// Register `f` for `name` (e.g. `aten.relu.default`), replacing any earlier kernel.
    pub fn add(&mut self, name: &'static str, f: OpFn) {
        self.ops.insert(name, f);
    }

    /// The kernel for a node target such as `torch.ops.aten.relu.default`. An in-place
    /// overload without a kernel of its own (`aten.add_.Tensor`) gets its functional one
    /// (`aten.add.Tensor`): the interpreter then rebinds the mutated input to the result
    /// (see [`functional_name`]).
    pub fn get(&self, target: &str) -> Option<OpFn> {
        let key = op_key(target);
        self.ops
            .get(key)
            .copied()
            .or_else(|| functional_name(key).and_then(|f| self.ops.get(f.as_str()).copied()))
    }

    /// Every registered overload name, sorted.
    pub fn names(&self) -> Vec<&'static str> {
        let mut v: Vec<_> = self.ops.keys().copied().collect();
        v.sort_unstable();
        v
    }
}

/// The functional overload of an in-place one, by ATen's naming convention: `add_` →
/// `add`, `_index_put_impl_` → `_index_put_impl`, `__iand__` → `__and__`; `None` for an op
/// that is not in place.
pub fn functional_name(key: &str) -> Option<String> {
    let (ns, base, overload) = in_place_parts(key)?;
    let overload = overload.map(|o| format!(".{o}")).unwrap_or_default();
    Some(match base {
        Functional::Dunder(d) => format!("{ns}.__{d}__{overload}"),
        Functional::Plain(f) => format!("{ns}.{f}{overload}"),
    })
}

/// Whether `key` names an in-place overload ([`functional_name`] is `Some`), without
/// building the name: the load's rewrites ask it of every node, several times.
pub fn is_in_place(key: &str) -> bool {
    in_place_parts(key).is_some()
}

/// The functional op's base name, as [`in_place_parts`] finds it.
enum Functional<'a> {
    /// `iand` of `__iand__`, without its `i`: `and`.
    Dunder(&'a str),
    /// `add` of `add_`.
    Plain(&'a str),
}

/// An in-place overload's namespace, functional base name and overload (`None` where the key
/// has none); `None` for an op that is not in place.
fn in_place_parts(key: &str) -> Option<(&str, Functional<'_>, Option<&str>)> {
    // Cut at the dots by a plain scan: keys are short, and the load's passes ask this of
    // every node several times (a `splitn` searcher was most of its cost).
    let dot = |s: &str| s.bytes().position(|b| b == b'.');
    let (ns, rest) = key.split_at(dot(key)?);
    let rest = &rest[1..];
    let (base, overload) = match dot(rest) {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let f = if let Some(dunder) = base.strip_prefix("__").and_then(|b| b.strip_suffix("__")) {
        Functional::Dunder(dunder.strip_prefix('i')?)
    } else {
        let f = base.strip_suffix('_')?;
        if f.is_empty() || f.ends_with('_') {
            return None;
        }
        Functional::Plain(f)
    };
    Some((ns, f, overload))
}

/// Run `kernel` on `args`, turning a panic inside it (a dependency's unimplemented case, a
/// missed shape check) into an error naming what it said, so that no program brings the
/// caller down.
pub fn call(kernel: OpFn, args: &Args) -> OpResult<Outputs> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| kernel(args))).unwrap_or_else(
        |payload| {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".into());
            Err(OpError(format!("the kernel failed: {what}")))
        },
    )
}

/// A node target without its `torch.ops.` prefix.
pub fn op_key(target: &str) -> &str {
    target.strip_prefix("torch.ops.").unwrap_or(target)
}

// ---------------------------------------------------------------------------------------------
// Helpers shared by the kernels
// ---------------------------------------------------------------------------------------------

/// A dim index (possibly negative) made absolute for a tensor of rank `rank`.
pub fn dim(d: i64, rank: usize) -> OpResult<usize> {
    let r = i64::try_from(rank).map_err(|_| OpError("rank too large".into()))?;
    let r1 = r.max(1);
    let a = if d < 0 { d + r1 } else { d };
    if a < 0 || a >= r1 {
        return Err(OpError(format!(
            "dim {d} is out of range for a tensor of rank {rank}"
        )));
    }
    Ok(a as usize)
}

/// A non-negative int argument as usize.
pub fn usize_of(v: i64, what: &str) -> OpResult<usize> {
    usize::try_from(v).map_err(|_| OpError(format!("{what} must be non-negative, got {v}")))
}

/// A window parameter (kernel size, stride, padding, dilation) as usize, refused when negative
/// or beyond 2³¹ so that the window arithmetic on it cannot overflow.
pub fn window_param(v: i64, what: &str) -> OpResult<usize> {
    if v > i64::from(i32::MAX) {
        return Err(OpError(format!("{what} {v} is too large")));
    }
    usize_of(v, what)
}

/// The category of a runtime dtype in the type-promotion lattice: bool (0) < int (1) <
/// float (2).
pub fn category(d: DType) -> u8 {
    match d {
        DType::U8 => 0,
        DType::I64 | DType::I32 | DType::U32 | DType::I16 => 1,
        _ => 2,
    }
}

/// The runtime dtype of the promotion of `a` and `b`: within the float category f64 wins
/// (f32 op f64 is f64, as in torch).
pub fn promote(a: DType, b: DType) -> DType {
    match category(a).max(category(b)) {
        0 => DType::U8,
        1 => DType::I64,
        _ if a == DType::F64 || b == DType::F64 => DType::F64,
        _ => DType::F32,
    }
}

/// The runtime dtype of the promotion of tensors `a` and `b` by torch's rules for
/// dimensioned and 0-d tensors: a 0-d tensor only decides the dtype when the other is 0-d
/// too or when its category is higher (`f32[3] + f64[]` is f32, `i64[3] + f64[]` is f64).
pub fn promote_tensors(a: &Tensor, b: &Tensor) -> DType {
    let (da, db) = (a.dtype(), b.dtype());
    if da == db {
        return promote(da, db);
    }
    let (ca, cb) = (category(da), category(db));
    match (a.rank() == 0, b.rank() == 0) {
        (true, false) if ca <= cb => promote(db, db),
        (false, true) if cb <= ca => promote(da, da),
        _ => promote(da, db),
    }
}

/// The runtime dtype of the promotion of a tensor of dtype `t` with a Python scalar `s`: a
/// scalar only decides the category when it is of a higher one (`i64 + 1.5` is the default
/// float dtype, f32), never the width (`f64 + 1.5` stays f64, `f32 + 1.5` stays f32).
pub fn promote_scalar(t: DType, s: Scalar) -> DType {
    if category(s.dtype()) > category(t) {
        s.dtype()
    } else {
        promote(t, t)
    }
}

/// Convert to `d` if needed.
pub fn as_dtype(t: &Tensor, d: DType) -> OpResult<Tensor> {
    if t.dtype() == d {
        Ok(t.clone())
    } else {
        Ok(t.to_dtype(d)?)
    }
}

/// A number a program returns, as the 0-d tensor the runtime hands back for it: an int as
/// int64 (exactly), a float as float64 (a Python float is a double), a bool as u8 0/1.
pub(crate) fn number_tensor(s: Scalar) -> OpResult<Tensor> {
    let dtype = match s {
        Scalar::Float(_) => DType::F64,
        s => s.dtype(),
    };
    scalar_tensor(s, dtype)
}

/// A 0-d tensor holding `s` in dtype `d`.
pub fn scalar_tensor(s: Scalar, d: DType) -> OpResult<Tensor> {
    let dev = candle_core::Device::Cpu;
    Ok(match d {
        DType::I64 => Tensor::new(
            match s {
                Scalar::Int(i) => i, // exact: past 2^53 an f64 would round it
                _ => s.as_f64() as i64,
            },
            &dev,
        )?,
        DType::U8 => Tensor::new(u8::from(s.as_f64() != 0.0), &dev)?,
        DType::F64 => Tensor::new(s.as_f64(), &dev)?,
        _ => Tensor::new(s.as_f64() as f32, &dev)?,
    })
}

/// Two operands promoted to a common dtype, scalars turned into 0-d tensors of that dtype
/// (a Python scalar does not raise a tensor's category unless it is of a higher one).
pub fn binary_operands(a: &TensorOrScalar, b: &TensorOrScalar) -> OpResult<(Tensor, Tensor)> {
    let d = match (a, b) {
        (TensorOrScalar::Tensor(x), TensorOrScalar::Tensor(y)) => promote_tensors(x, y),
        (TensorOrScalar::Tensor(t), TensorOrScalar::Scalar(s))
        | (TensorOrScalar::Scalar(s), TensorOrScalar::Tensor(t)) => promote_scalar(t.dtype(), *s),
        (TensorOrScalar::Scalar(x), TensorOrScalar::Scalar(y)) => promote(x.dtype(), y.dtype()),
    };
    let mk = |x: &TensorOrScalar| match x {
        TensorOrScalar::Tensor(t) => as_dtype(t, d),
        TensorOrScalar::Scalar(s) => scalar_tensor(*s, d),
    };
    Ok((mk(a)?, mk(b)?))
}

/// Ensure a tensor holds floats (int and bool inputs are converted to the default f32, as
/// torch's float ops do; f64 stays f64).
pub fn float(t: &Tensor) -> OpResult<Tensor> {
    match t.dtype() {
        DType::F32 | DType::F64 => Ok(t.clone()),
        _ => Ok(t.to_dtype(DType::F32)?),
    }
}

/// Refuse a float64 tensor in a kernel that only computes in f32 (`what` names it), rather
/// than round its values to f32.
pub fn no_f64(t: &Tensor, what: &str) -> OpResult<()> {
    if t.dtype() == DType::F64 {
        return Err(OpError(format!("{what} does not support float64 tensors")));
    }
    Ok(())
}

/// Sizes of `t` as i64.
pub fn sizes(t: &Tensor) -> Vec<i64> {
    t.dims().iter().map(|&d| d as i64).collect()
}

/// Contiguous f32 data of `t` as a Vec (ints and bools are converted; a float64 tensor is
/// refused rather than rounded: kernels built on this compute in f32 only).
pub fn f32_vec(t: &Tensor) -> OpResult<Vec<f32>> {
    no_f64(t, "this f32 kernel")?;
    Ok(float(t)?.flatten_all()?.to_vec1::<f32>()?)
}

/// A tensor from f32 data and a shape.
pub fn from_f32(data: Vec<f32>, shape: &[usize]) -> OpResult<Tensor> {
    Ok(Tensor::from_vec(data, shape, &candle_core::Device::Cpu)?)
}

/// The most elements a kernel allocates for one result (2³¹, 8 GiB of f32): a crafted size
/// beyond it is refused instead of attempted.
pub const MAX_RESULT_ELEMS: usize = 1 << 31;

/// The element count of a result of shape `shape` made by `what`, refused when it overflows
/// or exceeds [`MAX_RESULT_ELEMS`].
pub fn result_numel(shape: &[usize], what: &str) -> OpResult<usize> {
    match shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) {
        Some(n) if n <= MAX_RESULT_ELEMS => Ok(n),
        _ => Err(OpError(format!(
            "{what}: a result of shape {shape:?} is too large"
        ))),
    }
}

/// The float element types kernels compute in: f32, and f64 for float64 tensors.
pub trait Real: candle_core::WithDType + std::ops::Neg<Output = Self> {
    /// Positive infinity.
    const INF: Self;
    /// The largest integer not above `self`.
    fn floor(self) -> Self;
    /// The absolute value.
    fn abs(self) -> Self;
    /// The square root.
    fn sqrt(self) -> Self;
    /// `self` to the power `p`.
    fn powf(self, p: Self) -> Self;
    /// Whether `self` is NaN.
    fn is_nan(self) -> bool;
    /// The nearest integer, ties to even (C's `nearbyint`).
    fn round_even(self) -> Self;
}

macro_rules! real {
    ($t:ty) => {
        impl Real for $t {
            const INF: $t = <$t>::INFINITY;
            fn floor(self) -> $t {
                <$t>::floor(self)
            }
            fn abs(self) -> $t {
                <$t>::abs(self)
            }
            fn sqrt(self) -> $t {
                <$t>::sqrt(self)
            }
            fn powf(self, p: $t) -> $t {
                <$t>::powf(self, p)
            }
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            fn round_even(self) -> $t {
                <$t>::round_ties_even(self)
            }
        }
    };
}
real!(f32);
real!(f64);

/// Reject an argument that the runtime does not implement.
pub fn unsupported(what: &str) -> OpError {
    OpError(format!("{what} is not supported"))
}

/// Run the kernel registered for `target` by `register` on a node whose inputs are
/// `args` (`(schema name, JSON argument)`), tensors named in them read from `tensors`
/// (unit tests of kernels on crafted arguments).
#[cfg(test)]
pub(crate) fn run_node(
    register: fn(&mut Registry),
    target: &str,
    args: &[(&str, serde_json::Value)],
    tensors: &[(&str, Tensor)],
) -> OpResult<Outputs> {
    let inputs: Vec<serde_json::Value> = args
        .iter()
        .map(|(n, a)| serde_json::json!({"name": n, "arg": a, "kind": 1}))
        .collect();
    let node: crate::schema::Node = serde_json::from_value(serde_json::json!({
        "target": target, "inputs": inputs,
        "outputs": [{"as_tensor": {"name": "out"}}], "metadata": {}
    }))
    .unwrap();
    let env: crate::value::Env = tensors
        .iter()
        .map(|(n, t)| (n.to_string(), crate::value::Value::Tensor(t.clone())))
        .collect();
    let mut r = Registry::new();
    register(&mut r);
    let f = r.get(target).expect("registered");
    // Not through `call`: a kernel that panics fails the test instead of becoming an error.
    f(&crate::value::Args::new(&node, &env))
}

/// The largest absolute difference between `got` and `want` (f32, one shape) and the largest
/// magnitude in `want`, for checks relative to the output's size (unit tests).
#[cfg(test)]
pub(crate) fn diff_and_scale(got: &Tensor, want: &Tensor) -> (f32, f32) {
    let scale = want.abs().unwrap().max_all().unwrap();
    (max_abs_diff(got, want), scale.to_scalar::<f32>().unwrap())
}

/// The largest absolute difference between two f32 tensors of one shape (unit tests).
#[cfg(test)]
pub(crate) fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An int scalar becomes an int64 tensor exactly, past 2^53 too (through an f64 it was
    /// rounded: 2^53 + 1 became 2^53).
    #[test]
    fn int_scalars_are_exact_in_int64_tensors() {
        for v in [(1i64 << 53) + 1, -(1i64 << 60) - 7, i64::MAX - 1] {
            let t = scalar_tensor(Scalar::Int(v), DType::I64).unwrap();
            assert_eq!(t.to_scalar::<i64>().unwrap(), v);
        }
    }

    #[test]
    fn in_place_ops_are_named_by_their_functional_overload() {
        let cases = [
            ("aten.add_.Tensor", Some("aten.add.Tensor")),
            ("aten.relu_", Some("aten.relu")),
            (
                "aten._index_put_impl_.default",
                Some("aten._index_put_impl.default"),
            ),
            ("aten.__iand__.Tensor", Some("aten.__and__.Tensor")),
            ("aten.__and__.Tensor", None),
            ("aten.relu.default", None),
            ("aten._.default", None),
            ("aten.__foo___.x", None),
            ("aten", None),
        ];
        for (key, want) in cases {
            assert_eq!(functional_name(key).as_deref(), want, "{key}");
            assert_eq!(is_in_place(key), want.is_some(), "{key}");
        }
    }
}
