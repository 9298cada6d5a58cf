//! Calling the op registry from TorchScript code. The serialized code calls operators without
//! overload names, positionally (`torch.add(x, 1)`, `torch._convolution(x, w, None, [1, 1],
//! …)`); the registry's kernels read their arguments by ATen schema name, as `.pt2` nodes pass
//! them. This module holds the schemas of the overloads the registry implements
//! (`schemas.txt`, written by `tools/gen_ts_schemas.py`), picks the overload whose argument
//! types match the values (as TorchScript's own resolution does), names the arguments, and runs
//! the kernel through the same [`Args`] as the `.pt2` interpreter.

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

use candle_core::Tensor;

use super::value::Val;
use crate::ops::{OpFn, Registry};
use crate::schema::{
    Argument, JsonFloat, NamedArgument, Node, OptionalTensorArgument, TensorArgument,
};
use crate::value::{Args, Env, Value};

/// Overloads TorchScript emits that run on another overload's kernel: the schema binds the
/// arguments, the kernel reads the ones it knows by name.
const ALIASES: [(&str, &str); 3] = [
    ("aten._convolution.default", "aten.convolution.default"),
    // Without `allow_tf32`: how torch 1.4's archives call it.
    ("aten._convolution.deprecated", "aten.convolution.default"),
    ("aten.instance_norm.default", "aten.group_norm.default"),
];

/// An argument type, as far as binding needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    Tensor,
    TensorList,
    OptTensorList,
    Int,
    IntList,
    Float,
    FloatList,
    Bool,
    BoolList,
    Scalar,
    Str,
    ScalarType,
    MemoryFormat,
    /// Device, Layout, Generator…: accepted and not passed (everything runs on the CPU).
    Ignored,
}

#[derive(Debug, Clone)]
struct SchemaArg {
    name: String,
    ty: Ty,
    optional: bool,
    kwarg_only: bool,
    has_default: bool,
}

/// One overload's schema.
#[derive(Debug, Clone)]
pub struct Schema {
    /// The registry key (`aten.add.Tensor`, `aten.relu.default`).
    pub key: String,
    args: Vec<SchemaArg>,
    returns: usize,
}

fn parse_type(t: &str) -> (Ty, bool) {
    let t = t.trim();
    let (t, optional) = match t.strip_suffix('?') {
        Some(inner) => (inner, true),
        None => (t, false),
    };
    // `Tensor(a!)`, `Tensor(a)`: alias annotations.
    let base = t.split('(').next().unwrap_or(t);
    let list = base.ends_with(']');
    let elem = base.split('[').next().unwrap_or(base);
    let ty = match (elem, list) {
        ("Tensor", false) => Ty::Tensor,
        ("Tensor", true) => Ty::TensorList,
        ("Tensor?", true) => Ty::OptTensorList,
        ("int" | "SymInt", false) => Ty::Int,
        ("int" | "SymInt", true) => Ty::IntList,
        ("float", false) => Ty::Float,
        ("float", true) => Ty::FloatList,
        ("bool", false) => Ty::Bool,
        ("bool", true) => Ty::BoolList,
        ("Scalar", _) => Ty::Scalar,
        ("str", _) => Ty::Str,
        ("ScalarType", _) => Ty::ScalarType,
        ("MemoryFormat", _) => Ty::MemoryFormat,
        _ => Ty::Ignored,
    };
    (ty, optional)
}

/// Parse `ns::name.overload(args) -> returns` (ATen's, or another library's such as
/// `torchvision::nms`, whose operators are keyed `ns::name`).
fn parse_schema(line: &str) -> Option<(String, Schema)> {
    let (ns, rest) = line.split_once("::")?;
    if !ns.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return None;
    }
    let open = rest.find('(')?;
    let (name, overload) = match rest[..open].split_once('.') {
        Some((n, o)) => (n, o),
        None => (&rest[..open], "default"),
    };
    let close = rest.rfind(") -> ")?;
    let args_text = &rest[open + 1..close];
    let ret = rest[close + 5..].trim();
    let returns = if ret == "()" {
        0
    } else if ret.starts_with('(') {
        split_top(&ret[1..ret.len() - 1]).len()
    } else {
        1
    };
    let mut args = Vec::new();
    let mut kwarg_only = false;
    for a in split_top(args_text) {
        let a = a.trim();
        if a == "*" {
            kwarg_only = true;
            continue;
        }
        if a.is_empty() {
            continue;
        }
        let (decl, has_default) = match a.split_once('=') {
            Some((d, _)) => (d, true),
            None => (a, false),
        };
        let sp = decl.rfind(' ')?;
        let (ty, optional) = parse_type(&decl[..sp]);
        let name = decl[sp + 1..].to_string();
        // TorchScript's own overloads (`to.prim_dtype`) take a dtype as `int? dtype`: c10's
        // number, bound as any dtype argument is.
        let ty = match (ty, name.as_str()) {
            (Ty::Int, "dtype") => Ty::ScalarType,
            _ => ty,
        };
        args.push(SchemaArg {
            name,
            ty,
            optional,
            kwarg_only,
            has_default,
        });
    }
    Some((
        match ns {
            "aten" => name.to_string(),
            _ => format!("{ns}::{name}"),
        },
        Schema {
            key: format!("{ns}.{name}.{overload}"),
            args,
            returns,
        },
    ))
}

/// Split on commas outside brackets.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < s.len() {
        out.push(&s[start..]);
    }
    out
}

/// Schemas by operator name (`add`, `add_`), in the file's order, with their kernels.
pub struct Ops {
    by_name: HashMap<String, Vec<(Schema, OpFn, String)>>,
    /// Operators of which an overload returns a view of its input (`-> Tensor(a)`).
    views: HashSet<String>,
}

impl Ops {
    /// The shared table (schemas of every registered overload).
    pub fn get() -> &'static Ops {
        static OPS: OnceLock<Ops> = OnceLock::new();
        OPS.get_or_init(|| {
            let registry = Registry::all_ops();
            let mut by_name: HashMap<String, Vec<(Schema, OpFn, String)>> = HashMap::new();
            let mut views = HashSet::new();
            for line in include_str!("schemas.txt").lines() {
                let Some((name, s)) = parse_schema(line) else {
                    continue;
                };
                let returns = line.rsplit_once(") -> ").map_or("", |(_, r)| r);
                if returns.contains("Tensor(a") && !returns.contains('!') {
                    views.insert(name.clone());
                }
                let target = ALIASES
                    .iter()
                    .find(|(from, _)| *from == s.key)
                    .map_or(s.key.clone(), |(_, to)| to.to_string());
                if let Some(k) = registry.get(&target) {
                    by_name.entry(name).or_default().push((s, k, target));
                }
            }
            Ops { by_name, views }
        })
    }

    /// Whether an overload of `name` returns a view of its input (its schema's return is
    /// `Tensor(a)`): `view`, `transpose`, `to` (which may return its input), `split`, ….
    pub fn is_view(&self, name: &str) -> bool {
        self.views.contains(name)
    }

    /// Whether any overload of `name` runs.
    pub fn has(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// Call operator `name` (e.g. `add`, `relu_`) on positional and keyword values.
    pub fn call(&self, name: &str, args: &[Val], kwargs: &[(String, Val)]) -> Result<Val, String> {
        let cands = self
            .by_name
            .get(name)
            .ok_or_else(|| format!("operator {} is not supported", qualified(name)))?;
        for strict in [true, false] {
            for (schema, kernel, target) in cands {
                let Some(bound) = bind(schema, args, kwargs, strict) else {
                    continue;
                };
                return run(schema, *kernel, target, bound);
            }
        }
        let got: Vec<&str> = args.iter().map(Val::type_name).collect();
        let kw: Vec<String> = kwargs
            .iter()
            .map(|(k, v)| format!("{k}={}", v.type_name()))
            .collect();
        let have: Vec<&str> = cands.iter().map(|c| c.0.key.as_str()).collect();
        Err(format!(
            "no supported overload of {} takes ({}{}{}) (the runtime has {})",
            qualified(name),
            got.join(", "),
            if kw.is_empty() { "" } else { ", " },
            kw.join(", "),
            have.join(", ")
        ))
    }
}

/// An operator's name as torch writes it (`aten::add`, `torchvision::nms`) from its key in
/// [`Ops`] (`add`, `torchvision::nms`).
fn qualified(name: &str) -> String {
    match name.contains("::") {
        true => name.to_string(),
        false => format!("aten::{name}"),
    }
}

/// Named arguments (tensors as env entries).
struct Bound {
    inputs: Vec<NamedArgument>,
    env: Env,
}

fn bind(schema: &Schema, args: &[Val], kwargs: &[(String, Val)], strict: bool) -> Option<Bound> {
    let positional: Vec<&SchemaArg> = schema.args.iter().filter(|a| !a.kwarg_only).collect();
    if args.len() > positional.len() {
        return None;
    }
    let mut b = Bound {
        inputs: Vec::new(),
        env: Env::default(),
    };
    let mut given = vec![false; schema.args.len()];
    for (v, sa) in args.iter().zip(&positional) {
        let idx = schema.args.iter().position(|a| a.name == sa.name)?;
        given[idx] = true;
        convert(&mut b, sa, v, strict)?;
    }
    for (k, v) in kwargs {
        let idx = schema.args.iter().position(|a| &a.name == k)?;
        if given[idx] {
            return None;
        }
        given[idx] = true;
        convert(&mut b, &schema.args[idx], v, strict)?;
    }
    for (sa, g) in schema.args.iter().zip(&given) {
        if !g && !sa.has_default && !sa.optional {
            return None;
        }
    }
    Some(b)
}

fn push(b: &mut Bound, name: &str, arg: Argument) {
    b.inputs.push(NamedArgument {
        name: name.to_string().into(),
        arg,
        kind: None,
    });
}

fn tensor_arg(b: &mut Bound, t: &Tensor) -> TensorArgument {
    let name = format!("%{}", b.env.len());
    b.env.insert(name.clone(), Value::Tensor(t.clone()));
    TensorArgument { name }
}

fn none() -> Argument {
    Argument::AsNone(serde_json::Value::Null)
}

/// Convert one value to the argument form of its schema type; `None` if it does not fit.
fn convert(b: &mut Bound, sa: &SchemaArg, v: &Val, strict: bool) -> Option<()> {
    if matches!(v, Val::None) {
        if sa.optional || sa.ty == Ty::Ignored || (sa.has_default && !strict) {
            push(b, &sa.name, none());
            return Some(());
        }
        return None;
    }
    let arg = match (sa.ty, v) {
        (Ty::Ignored, _) => return Some(()),
        (Ty::Tensor, Val::Tensor(t)) => Argument::AsTensor(tensor_arg(b, t)),
        (Ty::Tensor, Val::Int(i)) if !strict => Argument::AsInt(*i),
        (Ty::Tensor, Val::Float(f)) if !strict => Argument::AsFloat(JsonFloat::Num(*f)),
        (Ty::Tensor, Val::Bool(x)) if !strict => Argument::AsBool(*x),
        // A 0-d tensor where a number is expected (traced code's implicit conversions).
        (Ty::Int | Ty::Float | Ty::Scalar, Val::Tensor(t)) if !strict && t.rank() == 0 => {
            let item =
                super::builtins::call_torch("item", std::slice::from_ref(v), &[], Ops::get())
                    .ok()?;
            return convert(b, sa, &item, strict);
        }
        (Ty::Int, Val::Int(i)) => Argument::AsInt(*i),
        (Ty::Int, Val::Bool(x)) if !strict => Argument::AsInt(i64::from(*x)),
        (Ty::Float, Val::Float(f)) => Argument::AsFloat(JsonFloat::Num(*f)),
        (Ty::Float, Val::Int(i)) => Argument::AsFloat(JsonFloat::Num(*i as f64)),
        (Ty::Bool, Val::Bool(x)) => Argument::AsBool(*x),
        (Ty::Scalar, Val::Int(i)) => Argument::AsInt(*i),
        (Ty::Scalar, Val::Float(f)) => Argument::AsFloat(JsonFloat::Num(*f)),
        (Ty::Scalar, Val::Bool(x)) => Argument::AsBool(*x),
        (Ty::Str, Val::Str(s)) => Argument::AsString(s.to_string()),
        (Ty::ScalarType, Val::Int(i)) => {
            Argument::AsScalarType(super::value::dtype_to_program(*i)?)
        }
        (Ty::MemoryFormat, Val::Int(i)) => Argument::AsMemoryFormat(*i),
        (Ty::IntList, Val::Int(i)) => Argument::AsInts(vec![*i]),
        (Ty::IntList | Ty::FloatList | Ty::BoolList | Ty::TensorList | Ty::OptTensorList, _) => {
            let items = v.items()?;
            list_arg(b, sa.ty, &items)?
        }
        _ => return None,
    };
    push(b, &sa.name, arg);
    Some(())
}

fn list_arg(b: &mut Bound, ty: Ty, items: &[Val]) -> Option<Argument> {
    Some(match ty {
        Ty::IntList => Argument::AsInts(
            items
                .iter()
                .map(|x| match x {
                    Val::Int(i) => Some(*i),
                    _ => None,
                })
                .collect::<Option<_>>()?,
        ),
        Ty::FloatList => Argument::AsFloats(
            items
                .iter()
                .map(|x| match x {
                    Val::Float(f) => Some(JsonFloat::Num(*f)),
                    Val::Int(i) => Some(JsonFloat::Num(*i as f64)),
                    _ => None,
                })
                .collect::<Option<_>>()?,
        ),
        Ty::BoolList => Argument::AsBools(
            items
                .iter()
                .map(|x| match x {
                    Val::Bool(v) => Some(*v),
                    _ => None,
                })
                .collect::<Option<_>>()?,
        ),
        Ty::TensorList => {
            let mut out = Vec::with_capacity(items.len());
            for x in items {
                let Val::Tensor(t) = x else { return None };
                out.push(tensor_arg(b, t));
            }
            Argument::AsTensors(out)
        }
        _ => {
            let mut out = Vec::with_capacity(items.len());
            for x in items {
                out.push(match x {
                    Val::Tensor(t) => OptionalTensorArgument::AsTensor(tensor_arg(b, t)),
                    Val::None => OptionalTensorArgument::AsNone(serde_json::Value::Null),
                    _ => return None,
                });
            }
            Argument::AsOptionalTensors(out)
        }
    })
}

fn run(schema: &Schema, kernel: OpFn, target: &str, b: Bound) -> Result<Val, String> {
    let mut vals = invoke(kernel, target, b, &schema.key)?;
    match schema.returns {
        0 => Ok(Val::None),
        1 => Ok(vals.pop().unwrap_or(Val::None)),
        _ => Ok(Val::tuple(vals)),
    }
}

/// Kernel `kernel` (registry target `target`) on the arguments `b`, as a `.pt2` node of that
/// target would call it; its outputs as evaluator values, errors prefixed by `what`.
fn invoke(kernel: OpFn, target: &str, b: Bound, what: &str) -> Result<Vec<Val>, String> {
    let node = Node {
        target: format!("torch.ops.{target}"),
        inputs: b.inputs,
        outputs: Vec::new(),
        name: None,
    };
    let outs = crate::ops::call(kernel, &Args::new(&node, &b.env))
        .map_err(|e| format!("{what}: {}", e.0))?;
    super::specialise::call(target, &node.inputs, &b.env, &outs);
    Ok(outs.into_iter().map(from_value).collect())
}

/// The Linear weights the load stored packed ([`crate::ops::packed`]; see `linears.rs`), by
/// tensor: their `(out_features, in_features)`.
pub type PackedLinears = HashMap<candle_core::TensorId, (usize, usize)>;

/// `torch.linear(input, weight, bias)` or `torch.addmm(bias, input, weight, beta=, alpha=)`
/// (`op`) by the packed Linear kernel, where `weight` is one of `packed`: the bias added and
/// the factors applied by the kernel where it can (a bias of `n` values, factors of 1), else
/// by the registry's `mul` and `add` after it. `Ok(None)` where `weight` is not packed (the
/// call goes to the registry as any other).
pub fn packed_product(
    op: &str,
    args: &[Val],
    kwargs: &[(String, Val)],
    packed: &PackedLinears,
) -> Result<Option<Val>, String> {
    // Positions and names of the input, the weight and the bias.
    let [x_at, w_at, b_at] = match op {
        "linear" => [(0, "input"), (1, "weight"), (2, "bias")],
        "addmm" => [(1, "mat1"), (2, "mat2"), (0, "self")],
        _ => return Ok(None),
    };
    let arg = |(i, name): (usize, &str)| {
        args.get(i)
            .or_else(|| kwargs.iter().find(|(k, _)| k == name).map(|(_, v)| v))
    };
    let Some(Val::Tensor(w)) = arg(w_at) else {
        return Ok(None);
    };
    let Some(&(n, k)) = packed.get(&w.id()) else {
        return Ok(None);
    };
    let Some(Val::Tensor(x)) = arg(x_at) else {
        return Err(format!("{op}() takes a tensor input"));
    };
    let bias = match arg(b_at) {
        Some(Val::Tensor(t)) => Some(t),
        None | Some(Val::None) => None,
        Some(v) => {
            return Err(format!(
                "{op}() takes a tensor bias, not a {}",
                v.type_name()
            ))
        }
    };
    // addmm's factors: `beta * bias + alpha * (input @ weight)`.
    let factor = |at: (usize, &str)| match arg(at) {
        None => Ok(None),
        Some(Val::Int(1)) if op == "addmm" => Ok(None),
        Some(Val::Float(f)) if op == "addmm" && *f == 1.0 => Ok(None),
        Some(v @ (Val::Int(_) | Val::Float(_))) if op == "addmm" => Ok(Some(v.clone())),
        Some(v) => Err(format!(
            "{op}() takes a number {}, not a {}",
            at.1,
            v.type_name()
        )),
    };
    let (beta, alpha) = (factor((3, "beta"))?, factor((4, "alpha"))?);
    let fused = bias.filter(|b| b.dims() == [n] && beta.is_none() && alpha.is_none());
    let mut b = Bound {
        inputs: Vec::new(),
        env: Env::default(),
    };
    let x = Argument::AsTensor(tensor_arg(&mut b, x));
    push(&mut b, "input", x);
    let w = Argument::AsTensor(tensor_arg(&mut b, w));
    push(&mut b, "weight", w);
    match fused {
        Some(t) => {
            let t = Argument::AsTensor(tensor_arg(&mut b, t));
            push(&mut b, "bias", t);
        }
        None => push(&mut b, "bias", none()),
    }
    push(&mut b, "out_features", Argument::AsInt(n as i64));
    push(&mut b, "in_features", Argument::AsInt(k as i64));
    static KERNEL: OnceLock<Option<OpFn>> = OnceLock::new();
    let kernel = KERNEL
        .get_or_init(|| Registry::all_ops().get(crate::ops::packed::TARGET))
        .ok_or("the runtime has no packed Linear kernel")?;
    let mut outs = invoke(kernel, crate::ops::packed::TARGET, b, &format!("aten.{op}"))?;
    let mut y = outs.pop().unwrap_or(Val::None);
    if fused.is_some() {
        return Ok(Some(y));
    }
    let ops = Ops::get();
    if let Some(a) = alpha {
        y = ops.call("mul", &[y, a], &[])?;
    }
    // With `beta` 0 torch ignores the bias, NaN and infinity in it included.
    let ignored =
        matches!(beta, Some(Val::Int(0))) || matches!(beta, Some(Val::Float(f)) if f == 0.0);
    if let (Some(t), false) = (bias, ignored) {
        let beta = beta
            .map(|v| vec![("alpha".to_string(), v)])
            .unwrap_or_default();
        y = ops.call("add", &[y, Val::Tensor(t.clone())], &beta)?;
    }
    Ok(Some(y))
}

/// A kernel's output as an evaluator value.
pub fn from_value(v: Value) -> Val {
    match v {
        Value::Tensor(t) => Val::Tensor(t),
        Value::Tensors(ts) => Val::list(ts.into_iter().map(Val::Tensor).collect()),
        Value::Int(i) => Val::Int(i),
        Value::Float(f) => Val::Float(f),
        Value::Bool(x) => Val::Bool(x),
        Value::None => Val::None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_parse() {
        let (n, s) = parse_schema(
            "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
        )
        .unwrap();
        assert_eq!(n, "add");
        assert_eq!(s.key, "aten.add.Tensor");
        assert!(s.args[2].kwarg_only && s.args[2].has_default);
        let (_, s) = parse_schema("aten::relu_(Tensor(a!) self) -> Tensor(a!)").unwrap();
        assert_eq!(s.key, "aten.relu_.default");
        assert_eq!(s.args[0].ty, Ty::Tensor);
        let (_, s) = parse_schema("aten::lstm.input(Tensor input, Tensor[] hx, Tensor[] params, bool has_biases, int num_layers, float dropout, bool train, bool bidirectional, bool batch_first) -> (Tensor, Tensor, Tensor)").unwrap();
        assert_eq!(s.returns, 3);
        assert_eq!(s.args[1].ty, Ty::TensorList);
        // Every line of the table parses.
        for line in include_str!("schemas.txt").lines() {
            assert!(parse_schema(line).is_some(), "{line}");
        }
    }
}
