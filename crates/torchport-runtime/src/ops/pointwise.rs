//! One pass for a chain of elementwise float32 ops (see
//! [`fuse_pointwise_chains`](crate::prepare::fuse_pointwise_chains)): a node of target
//! [`TARGET`] starts from its first tensor and applies each step in turn, each step an
//! elementwise op of the running value and, for a binary op, one more tensor (broadcast to the
//! first's shape) or a scalar. GPT-2's tanh GELU (eight ops), Llama's `silu(gate) * up` and
//! its RMSNorm's `x * rsqrt(...) * weight` each read and write the whole tensor once instead of
//! once per op. Each step computes exactly what the op's own kernel computes for float32
//! (the same per-element functions), so the result is the same.
//!
//! The node's arguments: `tensors` (the first is the start; the others the steps' operands),
//! `ops` (one name per step: a [`Binary`] or [`Unary`] name), `operands` (per step: the index
//! in `tensors` of its operand, -1 for its scalar, -2 for none) and `scalars` (per step; read
//! where `operands` says -1).

use candle_core::{DType, Storage, Tensor};

use super::fused::{
    cube_f32, gelu_erf_f32, gelu_tanh_f32, relu_f32, rsqrt_f32, sigmoid_fast, silu_slice,
    square_f32, tanh_fast,
};
use super::strided::{by_runs, merge};
use super::Registry;
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs};

/// The node target of a fused chain.
pub const TARGET: &str = "torchport.pointwise.default";

/// Register the kernel.
pub fn register(r: &mut Registry) {
    r.add(TARGET, pointwise);
}

/// A step of two operands: the running value `acc` and the step's operand `b`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binary {
    /// `acc + b`.
    Add,
    /// `acc - b`.
    Sub,
    /// `b - acc` (the running value was the op's right operand).
    RSub,
    /// `acc * b`.
    Mul,
    /// `acc / b`.
    Div,
    /// `b / acc`.
    RDiv,
}

/// A step of the running value alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unary {
    /// `-x`.
    Neg,
    /// `max(x, 0)`, as the relu kernel.
    Relu,
    /// `x * sigmoid(x)`, as the silu kernel.
    Silu,
    /// As the sigmoid kernel.
    Sigmoid,
    /// As the tanh kernel.
    Tanh,
    /// `exp(x)`.
    Exp,
    /// `1 / sqrt(x)`.
    Rsqrt,
    /// `sqrt(x)` (also `pow(x, 0.5)`).
    Sqrt,
    /// `x * x` (`pow(x, 2)`).
    Square,
    /// `x * x * x` (`pow(x, 3)`).
    Cube,
    /// The erf GELU, as the gelu kernel.
    Gelu,
    /// The tanh GELU (`approximate='tanh'`), as the gelu kernel.
    GeluTanh,
}

const BINARY: [(Binary, &str); 6] = [
    (Binary::Add, "add"),
    (Binary::Sub, "sub"),
    (Binary::RSub, "rsub"),
    (Binary::Mul, "mul"),
    (Binary::Div, "div"),
    (Binary::RDiv, "rdiv"),
];

const UNARY: [(Unary, &str); 12] = [
    (Unary::Neg, "neg"),
    (Unary::Relu, "relu"),
    (Unary::Silu, "silu"),
    (Unary::Sigmoid, "sigmoid"),
    (Unary::Tanh, "tanh"),
    (Unary::Exp, "exp"),
    (Unary::Rsqrt, "rsqrt"),
    (Unary::Sqrt, "sqrt"),
    (Unary::Square, "square"),
    (Unary::Cube, "cube"),
    (Unary::Gelu, "gelu"),
    (Unary::GeluTanh, "gelu_tanh"),
];

impl Binary {
    /// The name the fused node records.
    pub fn name(self) -> &'static str {
        BINARY
            .iter()
            .find(|(b, _)| *b == self)
            .map_or("", |(_, n)| n)
    }

    /// The same op with its operands swapped (`a - b` computed as `rsub` of `b` and `a`).
    pub fn swapped(self) -> Binary {
        match self {
            Binary::Sub => Binary::RSub,
            Binary::RSub => Binary::Sub,
            Binary::Div => Binary::RDiv,
            Binary::RDiv => Binary::Div,
            other => other,
        }
    }
}

impl Unary {
    /// The name the fused node records.
    pub fn name(self) -> &'static str {
        UNARY
            .iter()
            .find(|(u, _)| *u == self)
            .map_or("", |(_, n)| n)
    }
}

/// What a step applies to the running value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Step {
    /// A unary op.
    Unary(Unary),
    /// A binary op with the tensor of this index (into the node's `tensors`).
    Tensor(Binary, usize),
    /// A binary op with a scalar.
    Scalar(Binary, f32),
}

/// The steps a node describes, checked against `tensors` inputs.
fn steps(a: &Args, tensors: usize) -> OpResult<Vec<Step>> {
    steps_named(a, tensors, ["ops", "operands", "scalars"], 1)
}

/// The steps a node describes under the argument names `[ops, operands, scalars]`, checked
/// against `tensors` inputs (the start counted): a binary step's tensor is one of `first..`.
fn steps_named(
    a: &Args,
    tensors: usize,
    [ops, operands, scalars]: [&str; 3],
    first: i64,
) -> OpResult<Vec<Step>> {
    use crate::schema::Argument;
    let Some(Argument::AsStrings(ops)) = a.get(ops) else {
        op_bail!("argument '{ops}' should be a list of strings");
    };
    let operands = a.ints(operands)?;
    let scalars = a.opt_floats(scalars)?.unwrap_or_default();
    if operands.len() != ops.len() || scalars.len() != ops.len() {
        op_bail!(
            "{} ops, {} operands and {} scalars: one of each per step",
            ops.len(),
            operands.len(),
            scalars.len()
        );
    }
    ops.iter()
        .zip(operands)
        .zip(scalars)
        .map(|((op, k), s)| {
            let unary = UNARY.iter().find(|(_, n)| n == op).map(|(u, _)| *u);
            let binary = BINARY.iter().find(|(_, n)| n == op).map(|(b, _)| *b);
            Ok(match (unary, binary, k) {
                (Some(u), _, -2) => Step::Unary(u),
                (_, Some(b), -1) => Step::Scalar(b, s as f32),
                (_, Some(b), k) if k >= first && (k as u64) < tensors as u64 => {
                    Step::Tensor(b, k as usize)
                }
                _ => op_bail!("step '{op}' with operand {k} (of {tensors} tensors) is not valid"),
            })
        })
        .collect()
}

fn pointwise(a: &Args) -> OpResult<Outputs> {
    let ts = a.tensors("tensors")?;
    let steps = steps(a, ts.len())?;
    let Some(first) = ts.first() else {
        op_bail!("a fused chain needs its first tensor");
    };
    if ts.iter().any(|t| t.dtype() != DType::F32) {
        op_bail!("a fused chain computes float32 tensors only");
    }
    let shape = first.shape().clone();
    let ins = ts
        .iter()
        .map(|t| t.broadcast_as(&shape))
        .collect::<Result<Vec<_>, _>>()?;
    match run(&ins, &steps) {
        Some(data) => one(Tensor::from_vec(data, shape, first.device())?),
        None => op_bail!("a fused chain's tensors are not float32 CPU tensors of its shape"),
    }
}

/// The chain over tensors `ins` of one shape (any layouts); `None` when one is not a float32
/// CPU tensor or its layout reaches outside its storage.
fn run(ins: &[Tensor], steps: &[Step]) -> Option<Vec<f32>> {
    let guards: Vec<_> = ins.iter().map(|t| t.storage_and_layout()).collect();
    let mut data: Vec<&[f32]> = Vec::with_capacity(ins.len());
    for (s, _) in &guards {
        match &**s {
            Storage::Cpu(c) => data.push(c.as_slice::<f32>().ok()?),
            _ => return None,
        }
    }
    let strides: Vec<&[usize]> = guards.iter().map(|(_, l)| l.stride()).collect();
    let dims_all = ins.first()?.dims();
    let (dims, st) = merge(dims_all, &strides);
    let last = dims.len() - 1;
    let total: usize = dims_all.iter().product();
    let bases: Vec<usize> = guards.iter().map(|(_, l)| l.start_offset()).collect();
    by_runs(
        total,
        &dims,
        &st,
        &bases,
        #[inline(always)]
        |buf, at, _, acc| {
            load(acc, data[0], at[0], st[0][last])
                && apply(steps, acc, buf, |k| (data[k], at[k], st[k][last]))
        },
    )
}

/// `steps` applied to `acc` in turn; `operand(k)` gives tensor `k`'s values, the offset of
/// its element for `acc[0]` and its stride along `acc` (`buf` holds a strided or broadcast
/// one's values). False when a read falls outside an operand's values.
#[inline(always)]
fn apply<'a>(
    steps: &[Step],
    acc: &mut [f32],
    buf: &mut Vec<f32>,
    operand: impl Fn(usize) -> (&'a [f32], usize, usize),
) -> bool {
    for step in steps {
        match *step {
            Step::Unary(u) => unary(u, acc),
            Step::Scalar(b, s) => scalar(b, acc, s),
            Step::Tensor(b, k) => {
                let ((data, off, s), len) = (operand(k), acc.len());
                let src = if s == 1 {
                    match data.get(off..off + len) {
                        Some(x) => x,
                        None => return false,
                    }
                } else {
                    buf.resize(len, 0.0);
                    if !load(buf, data, off, s) {
                        return false;
                    }
                    &buf[..]
                };
                binary(b, acc, src);
            }
        }
    }
    true
}

/// The argument names under which a node carries a chain it applies to its own output as it
/// computes it ([`crate::prepare::fuse_linear_epilogues`]): the chain's tensors but its start
/// (the node's output: tensor 0 to the steps, which read it as it was before the first step,
/// as GPT-2's tanh GELU reads `x` three times), and its steps, named and numbered as a chain
/// node's `ops`, `operands` and `scalars`.
pub const EPILOGUE_ARGS: [&str; 4] = [
    "torchport_epilogue_tensors",
    "torchport_epilogue_ops",
    "torchport_epilogue_operands",
    "torchport_epilogue_scalars",
];

/// A chain a node applies to its own output ([`EPILOGUE_ARGS`]): its steps, and its other
/// tensors broadcast to the output's shape.
pub struct Epilogue {
    steps: Vec<Step>,
    operands: Vec<Tensor>,
}

impl Epilogue {
    /// The chain the node's arguments `a` carry for an output of dims `shape`; `None` where
    /// they carry none. An error where the steps do not parse, or an operand is not float32
    /// or does not broadcast to `shape`.
    pub fn of(a: &Args, shape: &[usize]) -> OpResult<Option<Epilogue>> {
        let [tensors, ops, operands, scalars] = EPILOGUE_ARGS;
        if a.get(ops).is_none() {
            return Ok(None);
        }
        let ts = match a.get(tensors) {
            Some(_) => a.tensors(tensors)?,
            None => Vec::new(),
        };
        let steps = steps_named(a, ts.len() + 1, [ops, operands, scalars], 0)?;
        if shape.is_empty() || ts.iter().any(|t| t.dtype() != DType::F32) {
            op_bail!("an epilogue computes float32 tensors of one or more dims only");
        }
        let operands = ts
            .iter()
            .map(|t| t.broadcast_as(shape))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(Epilogue { steps, operands }))
    }

    /// `f` given the chain as a function of `(r, c, values)`: `values` the output's row `r`
    /// (the output seen as `[rows, n]`, `n` its last dim) from column `c` on, computed in
    /// place; it returns false where an operand's view reaches outside its storage. `None`
    /// where an operand is not a CPU tensor.
    pub fn with<R>(
        &self,
        f: impl FnOnce(&(dyn Fn(usize, usize, &mut [f32]) -> bool + Sync)) -> R,
    ) -> Option<R> {
        let guards: Vec<_> = self
            .operands
            .iter()
            .map(|t| t.storage_and_layout())
            .collect();
        let mut data: Vec<&[f32]> = Vec::with_capacity(guards.len());
        for (s, _) in &guards {
            match &**s {
                Storage::Cpu(c) => data.push(c.as_slice::<f32>().ok()?),
                _ => return None,
            }
        }
        let layouts: Vec<_> = guards.iter().map(|(_, l)| *l).collect();
        let steps = &self.steps;
        let rereads = steps.iter().any(|s| matches!(s, Step::Tensor(_, 0)));
        // Operand `k`'s values, the offset of its element for row `r` and column `c`, and its
        // stride along the row (`k` > 0).
        let operand = |k: usize, r: usize, c: usize| {
            let (l, mut r) = (layouts[k - 1], r);
            let (dims, strides) = (l.dims(), l.stride());
            let last = dims.len() - 1;
            let mut at = l.start_offset() + c * strides[last];
            for d in (0..last).rev() {
                at += r % dims[d] * strides[d];
                r /= dims[d];
            }
            (data[k - 1], at, strides[last])
        };
        let chain = |r: usize, c: usize, values: &mut [f32]| {
            super::fused::with_scratch(|buf| {
                super::fused::with_scratch(|start| {
                    // The values as the product left them, for steps that read them again.
                    if rereads {
                        start.clear();
                        start.extend_from_slice(values);
                    }
                    super::fused::simd(
                        #[inline(always)]
                        || {
                            apply(steps, values, buf, |k| match k {
                                0 => (&start[..], 0, 1),
                                k => operand(k, r, c),
                            })
                        },
                    )
                })
            })
        };
        Some(f(&chain))
    }
}

/// `dst[j] = data[off + j * stride]`; false when a read falls outside `data`.
#[inline(always)]
fn load(dst: &mut [f32], data: &[f32], off: usize, stride: usize) -> bool {
    let n = dst.len();
    match stride {
        1 => match data.get(off..off + n) {
            Some(x) => dst.copy_from_slice(x),
            None => return false,
        },
        0 => match data.get(off) {
            Some(&v) => dst.fill(v),
            None => return false,
        },
        _ => {
            for (j, d) in dst.iter_mut().enumerate() {
                match data.get(off + j * stride) {
                    Some(&v) => *d = v,
                    None => return false,
                }
            }
        }
    }
    true
}

#[inline(always)]
fn map(acc: &mut [f32], f: impl Fn(f32) -> f32) {
    acc.iter_mut().for_each(|v| *v = f(*v));
}

#[inline(always)]
fn zip(acc: &mut [f32], b: &[f32], f: impl Fn(f32, f32) -> f32) {
    acc.iter_mut().zip(b).for_each(|(v, &y)| *v = f(*v, y));
}

#[inline(always)]
fn unary(u: Unary, acc: &mut [f32]) {
    match u {
        Unary::Neg => map(acc, |v| -v),
        Unary::Relu => map(acc, relu_f32),
        Unary::Silu => silu_slice(acc),
        Unary::Sigmoid => map(acc, sigmoid_fast),
        Unary::Tanh => map(acc, tanh_fast),
        Unary::Exp => map(acc, f32::exp),
        Unary::Rsqrt => map(acc, rsqrt_f32),
        Unary::Sqrt => map(acc, f32::sqrt),
        Unary::Square => map(acc, square_f32),
        Unary::Cube => map(acc, cube_f32),
        Unary::Gelu => map(acc, gelu_erf_f32),
        Unary::GeluTanh => map(acc, gelu_tanh_f32),
    }
}

#[inline(always)]
fn binary(op: Binary, acc: &mut [f32], b: &[f32]) {
    match op {
        Binary::Add => zip(acc, b, |x, y| x + y),
        Binary::Sub => zip(acc, b, |x, y| x - y),
        Binary::RSub => zip(acc, b, |x, y| y - x),
        Binary::Mul => zip(acc, b, |x, y| x * y),
        Binary::Div => zip(acc, b, |x, y| x / y),
        Binary::RDiv => zip(acc, b, |x, y| y / x),
    }
}

#[inline(always)]
fn scalar(op: Binary, acc: &mut [f32], s: f32) {
    match op {
        Binary::Add => map(acc, |x| x + s),
        Binary::Sub => map(acc, |x| x - s),
        Binary::RSub => map(acc, |x| s - x),
        Binary::Mul => map(acc, |x| x * s),
        Binary::Div => map(acc, |x| x / s),
        Binary::RDiv => map(acc, |x| s / x),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Value;
    use candle_core::Device;
    use serde_json::{json, Value as Json};

    fn kernels(r: &mut Registry) {
        super::super::elementwise::register(r);
        super::super::activation::register(r);
        super::super::integer::register(r);
        register(r);
    }

    fn tensor_of(out: Outputs) -> Tensor {
        match out.into_iter().next() {
            Some(Value::Tensor(t)) => t,
            _ => panic!("not a tensor"),
        }
    }

    /// An op's own kernel on tensors `a` (self) and `b` (other, if any) and extra arguments.
    fn op(target: &str, a: &Tensor, b: Option<&Tensor>, extra: &[(&str, Json)]) -> Tensor {
        let mut args = vec![("self", json!({"as_tensor": {"name": "a"}}))];
        let mut ts = vec![("a", a.clone())];
        if let Some(b) = b {
            args.push(("other", json!({"as_tensor": {"name": "b"}})));
            ts.push(("b", b.clone()));
        }
        args.extend(extra.iter().cloned());
        tensor_of(super::super::run_node(kernels, target, &args, &ts).unwrap())
    }

    /// The fused kernel: `ts[0]` through `steps` (name, operand, scalar).
    fn chain(ts: &[&Tensor], steps: &[(&str, i64, f64)]) -> OpResult<Outputs> {
        let names: Vec<String> = (0..ts.len()).map(|i| format!("t{i}")).collect();
        let list: Vec<Json> = names.iter().map(|n| json!({ "name": n })).collect();
        let args = [
            ("tensors", json!({ "as_tensors": list })),
            (
                "ops",
                json!({"as_strings": steps.iter().map(|s| s.0).collect::<Vec<_>>()}),
            ),
            (
                "operands",
                json!({"as_ints": steps.iter().map(|s| s.1).collect::<Vec<_>>()}),
            ),
            (
                "scalars",
                json!({"as_floats": steps.iter().map(|s| s.2).collect::<Vec<_>>()}),
            ),
        ];
        let env: Vec<(&str, Tensor)> = names
            .iter()
            .zip(ts)
            .map(|(n, t)| (n.as_str(), (*t).clone()))
            .collect();
        super::super::run_node(kernels, TARGET, &args, &env)
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Each step, alone, gives exactly what its op's own kernel gives: binary steps with a
    /// transposed operand, a row and a column that broadcast, and a scalar (both operand
    /// orders); unary steps on a strided start. Large enough to split across threads.
    #[test]
    fn each_step_computes_what_its_op_computes() {
        let dev = &Device::Cpu;
        let (m, n) = (300, 250);
        let x = Tensor::randn(0f32, 1.5, (m, n), dev).unwrap();
        let yt = Tensor::randn(0f32, 1.0, (n, m), dev).unwrap().t().unwrap();
        let row = Tensor::randn(0f32, 1.0, n, dev).unwrap();
        let col = Tensor::randn(0f32, 1.0, (m, 1), dev).unwrap();
        let s = 0.75;
        let full = Tensor::full(s as f32, (m, n), dev).unwrap();
        let targets = [
            ("add", "aten.add.Tensor", false),
            ("sub", "aten.sub.Tensor", false),
            ("rsub", "aten.sub.Tensor", true),
            ("mul", "aten.mul.Tensor", false),
            ("div", "aten.div.Tensor", false),
            ("rdiv", "aten.div.Tensor", true),
        ];
        for (name, target, swapped) in targets {
            for b in [&yt, &row, &col] {
                let got = tensor_of(chain(&[&x, b], &[(name, 1, 0.0)]).unwrap());
                let want = if swapped {
                    op(target, &b.broadcast_as((m, n)).unwrap(), Some(&x), &[])
                } else {
                    op(target, &x, Some(b), &[])
                };
                assert_eq!(bits(&got), bits(&want), "{name} {:?}", b.dims());
            }
            let got = tensor_of(chain(&[&x], &[(name, -1, s)]).unwrap());
            let want = if swapped {
                op(target, &full, Some(&x), &[])
            } else {
                op(target, &x, None, &[("other", json!({ "as_float": s }))])
            };
            assert_eq!(bits(&got), bits(&want), "{name} scalar");
        }
        let xt = Tensor::randn(0f32, 1.5, (n, m), dev).unwrap().t().unwrap();
        let pow = |e: f64| vec![("exponent", json!({ "as_float": e }))];
        let unary = [
            ("neg", "aten.neg.default", vec![]),
            ("relu", "aten.relu.default", vec![]),
            ("silu", "aten.silu.default", vec![]),
            ("sigmoid", "aten.sigmoid.default", vec![]),
            ("tanh", "aten.tanh.default", vec![]),
            ("exp", "aten.exp.default", vec![]),
            ("rsqrt", "aten.rsqrt.default", vec![]),
            ("sqrt", "aten.sqrt.default", vec![]),
            ("square", "aten.pow.Tensor_Scalar", pow(2.0)),
            ("cube", "aten.pow.Tensor_Scalar", pow(3.0)),
        ];
        for (name, target, extra) in unary {
            let got = tensor_of(chain(&[&xt], &[(name, -2, 0.0)]).unwrap());
            assert_eq!(bits(&got), bits(&op(target, &xt, None, &extra)), "{name}");
        }
    }

    /// Steps apply in order, each to the value before: GPT-2's tanh GELU as one chain gives
    /// the bits of its eight ops run one by one. The chain starts from a contiguous view
    /// that begins inside its storage (rows 10.. of a larger tensor).
    #[test]
    fn steps_apply_in_order() {
        let big = Tensor::randn(0f32, 2.0, (50, 30), &Device::Cpu).unwrap();
        let x = big.narrow(0, 10, 40).unwrap();
        assert!(x.is_contiguous() && x.layout().start_offset() == 300);
        let half = op(
            "aten.mul.Tensor",
            &x,
            None,
            &[("other", json!({"as_float": 0.5}))],
        );
        let steps = [
            ("cube", -2, 0.0),
            ("mul", -1, 0.044715),
            ("add", 1, 0.0),
            ("mul", -1, 0.7978845608028654),
            ("tanh", -2, 0.0),
            ("add", -1, 1.0),
            ("mul", 2, 0.0),
        ];
        let got = tensor_of(chain(&[&x, &x, &half], &steps).unwrap());
        let scalar = |v: f64| vec![("other", json!({ "as_float": v }))];
        let mut want = op(
            "aten.pow.Tensor_Scalar",
            &x,
            None,
            &[("exponent", json!({"as_float": 3.0}))],
        );
        want = op("aten.mul.Tensor", &want, None, &scalar(0.044715));
        want = op("aten.add.Tensor", &want, Some(&x), &[]);
        want = op("aten.mul.Tensor", &want, None, &scalar(0.7978845608028654));
        want = op("aten.tanh.default", &want, None, &[]);
        want = op("aten.add.Tensor", &want, None, &scalar(1.0));
        want = op("aten.mul.Tensor", &want, Some(&half), &[]);
        assert_eq!(bits(&got), bits(&want));
    }

    /// `(x * s) * g` computed as `(g * x) * s` (the order of the chain
    /// `prepare::fuse_pointwise_chains` makes of GPT-2's tanh GELU) gives the same bits for
    /// `s` a power of two (0.5, 4, -0.25), and not for 0.7: the test can tell.
    #[test]
    fn a_power_of_two_scale_applies_last_with_the_same_bits() {
        let x = Tensor::randn(0f32, 3.0, (40, 30), &Device::Cpu).unwrap();
        let g = Tensor::randn(1f32, 1.0, (40, 30), &Device::Cpu).unwrap();
        let same = |s: f64| {
            let scaled = op(
                "aten.mul.Tensor",
                &x,
                None,
                &[("other", json!({ "as_float": s }))],
            );
            let want = op("aten.mul.Tensor", &scaled, Some(&g), &[]);
            let steps = [("mul", 1, 0.0), ("mul", -1, s)];
            let got = tensor_of(chain(&[&g, &x], &steps).unwrap());
            bits(&got) == bits(&want)
        };
        assert!(same(0.5) && same(4.0) && same(-0.25));
        assert!(!same(0.7));
    }

    /// A node built by hand (a crafted archive may name this target) is checked: unknown
    /// steps, operands out of range or of the wrong kind, lists of unequal length, int
    /// tensors and operands that do not broadcast give an error, not a panic.
    #[test]
    fn malformed_chains_are_refused() {
        let dev = &Device::Cpu;
        let x = Tensor::ones((2, 3), DType::F32, dev).unwrap();
        let big = Tensor::ones((4, 3), DType::F32, dev).unwrap();
        let ints = Tensor::ones((2, 3), DType::I64, dev).unwrap();
        for (ts, steps) in [
            (vec![&x], vec![("frobnicate", -2, 0.0)]),
            (vec![&x], vec![("add", 1, 0.0)]),
            (vec![&x, &x], vec![("add", 2, 0.0)]),
            (vec![&x, &x], vec![("add", 0, 0.0)]),
            (vec![&x, &x], vec![("add", -2, 0.0)]),
            (vec![&x, &x], vec![("neg", 1, 0.0)]),
            (vec![&x, &x], vec![("neg", i64::MAX, 0.0)]),
            (vec![&ints], vec![("neg", -2, 0.0)]),
            (vec![&x, &big], vec![("mul", 1, 0.0)]),
            (vec![], vec![("neg", -2, 0.0)]),
        ] {
            assert!(chain(&ts, &steps).is_err(), "{steps:?}");
        }
        let uneven = [
            ("tensors", json!({"as_tensors": [{"name": "x"}]})),
            ("ops", json!({"as_strings": ["neg", "neg"]})),
            ("operands", json!({"as_ints": [-2]})),
            ("scalars", json!({"as_floats": [0.0, 0.0]})),
        ];
        let r = super::super::run_node(kernels, TARGET, &uneven, &[("x", x.clone())]);
        assert!(r.is_err());
    }
}
