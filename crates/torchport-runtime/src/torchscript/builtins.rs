//! Python-level builtins of TorchScript's serialized code: `int()`, `len()`, list and dict
//! operations, `format`, int/float arithmetic, `ops.prim.*`, and the dispatch of `torch.X`
//! calls either to these (when no tensor is involved, or for list/str/dict operations) or to
//! the op registry.

use std::cell::RefCell;
use std::rc::Rc;

use candle_core::{DType, Device, Tensor};

use super::aten::Ops;
use super::eval::MAX_LIST;
use super::value::{num, py_eq, Num, Val};

type BResult<T> = Result<T, String>;

/// Names that resolve to themselves at the top level of the code.
pub fn is_global(n: &str) -> bool {
    matches!(
        n,
        "torch"
            | "ops"
            | "math"
            | "__torch__"
            | "CONSTANTS"
            | "int"
            | "float"
            | "bool"
            | "str"
            | "len"
            | "range"
            | "getattr"
            | "hasattr"
            | "print"
            | "min"
            | "max"
            | "abs"
            | "round"
            | "list"
            | "tuple"
            | "enumerate"
            | "zip"
            | "divmod"
            | "dict"
    )
}

/// Whether `torch.<op>` updates its first argument in place (`add_`, `relu_`, `__iand__`).
pub fn is_inplace(op: &str) -> bool {
    !matches!(op, "_set_item" | "__setitem__") && crate::ops::is_in_place(&format!("aten.{op}"))
}

/// The value of a one-element tensor as f64.
pub fn tensor_scalar(t: &Tensor) -> BResult<f64> {
    super::specialise::read(t);
    if t.elem_count() != 1 {
        return Err(format!(
            "a tensor of shape {:?} used as a Python scalar (it must hold one element)",
            t.dims()
        ));
    }
    let e = |e: candle_core::Error| e.to_string();
    let flat = t.flatten_all().map_err(e)?;
    Ok(match t.dtype() {
        DType::I64 => flat.to_vec1::<i64>().map_err(e)?[0] as f64,
        DType::U8 => f64::from(flat.to_vec1::<u8>().map_err(e)?[0]),
        DType::F64 => flat.to_vec1::<f64>().map_err(e)?[0],
        _ => f64::from(
            flat.to_dtype(DType::F32)
                .map_err(e)?
                .to_vec1::<f32>()
                .map_err(e)?[0],
        ),
    })
}

fn tensor_int(t: &Tensor) -> BResult<i64> {
    if t.dtype() == DType::I64 && t.elem_count() == 1 {
        super::specialise::read(t);
        let v = t
            .flatten_all()
            .and_then(|f| f.to_vec1::<i64>())
            .map_err(|e| e.to_string())?;
        return Ok(v[0]);
    }
    Ok(tensor_scalar(t)?.trunc() as i64)
}

fn arg<'a>(args: &'a [Val], i: usize, f: &str) -> BResult<&'a Val> {
    args.get(i)
        .ok_or_else(|| format!("{f}() is missing argument {}", i + 1))
}

fn int_of(v: &Val, what: &str) -> BResult<i64> {
    match v {
        Val::Int(i) => Ok(*i),
        Val::Bool(b) => Ok(i64::from(*b)),
        Val::Tensor(t) => tensor_int(t),
        o => Err(format!("{what} should be an int, got a {}", o.type_name())),
    }
}

fn has_tensor(args: &[Val], kwargs: &[(String, Val)]) -> bool {
    args.iter()
        .chain(kwargs.iter().map(|(_, v)| v))
        .any(|v| matches!(v, Val::Tensor(_)))
}

/// `torch.<name>(args)`: a builtin, or an operator of the registry.
pub fn call_torch(name: &str, args: &[Val], kwargs: &[(String, Val)], ops: &Ops) -> BResult<Val> {
    if let Some(v) = container_op(name, args, kwargs, ops)? {
        return Ok(v);
    }
    if !has_tensor(args, kwargs) {
        if let Some(v) = super::scalars::scalar_op(name, args)? {
            return Ok(v);
        }
    }
    if !ops.has(name) {
        return Err(format!("operator aten::{name} is not supported"));
    }
    ops.call(name, args, kwargs)
}

/// List, dict, str, size and conversion builtins.
fn container_op(
    name: &str,
    args: &[Val],
    kwargs: &[(String, Val)],
    ops: &Ops,
) -> BResult<Option<Val>> {
    let a0 = || arg(args, 0, name);
    Ok(Some(match name {
        "len" => len(a0()?)?,
        "size" => {
            let Val::Tensor(t) = a0()? else {
                return Ok(None);
            };
            match args.get(1).or(kwargs.first().map(|(_, v)| v)) {
                None => Val::list(t.dims().iter().map(|&d| Val::Int(d as i64)).collect()),
                Some(d) => {
                    let d = crate::ops::dim(int_of(d, "dim")?, t.rank()).map_err(|e| e.0)?;
                    Val::Int(t.dims()[d] as i64)
                }
            }
        }
        "dim" => match a0()? {
            Val::Tensor(t) => Val::Int(t.rank() as i64),
            _ => return Ok(None),
        },
        "numel" => match a0()? {
            Val::Tensor(t) => Val::Int(t.elem_count() as i64),
            _ => return Ok(None),
        },
        // `list_with_default(list, defaults)`: the list, where `defaults` is longer (what
        // torch 1.4's `F.adaptive_avg_pool2d` calls).
        "list_with_default" => {
            let (Some(list), Some(defaults)) = (a0()?.items(), arg(args, 1, name)?.items()) else {
                return Err("list_with_default() takes two lists".into());
            };
            if defaults.len() <= list.len() {
                return Err(format!(
                    "list_with_default(): input dimension should be at least {}",
                    list.len() + 1
                ));
            }
            Val::list(list)
        }
        // Of a list of bools, ints, floats or strings (ATen's `any.bool`, `all.int`, …).
        "any" | "all" => {
            let Val::List(l) = a0()? else {
                return Ok(None);
            };
            let truths = l
                .borrow()
                .iter()
                .map(|v| match v {
                    Val::Bool(_) | Val::Int(_) | Val::Float(_) | Val::Str(_) => {
                        Ok(v.truthy() == Some(true))
                    }
                    o => Err(format!("{name}() of a list holding a {}", o.type_name())),
                })
                .collect::<BResult<Vec<bool>>>()?;
            Val::Bool(if name == "any" {
                truths.iter().any(|&t| t)
            } else {
                truths.iter().all(|&t| t)
            })
        }
        "append" => {
            let Val::List(l) = a0()? else {
                return Err("append() on something that is not a list".into());
            };
            if l.borrow().len() >= MAX_LIST {
                return Err(format!("a list grew past {MAX_LIST} items"));
            }
            l.borrow_mut().push(arg(args, 1, name)?.clone());
            Val::None
        }
        "extend" => {
            let (Val::List(l), Some(more)) = (a0()?, arg(args, 1, name)?.items()) else {
                return Err("extend() takes a list and a list".into());
            };
            if l.borrow().len() + more.len() > MAX_LIST {
                return Err(format!("a list grew past {MAX_LIST} items"));
            }
            l.borrow_mut().extend(more);
            Val::None
        }
        "insert" => {
            let Val::List(l) = a0()? else {
                return Err("insert() on something that is not a list".into());
            };
            let n = l.borrow().len() as i64;
            let i = int_of(arg(args, 1, name)?, "index")?;
            let i = if i < 0 { (i + n).max(0) } else { i.min(n) } as usize;
            l.borrow_mut().insert(i, arg(args, 2, name)?.clone());
            Val::None
        }
        "pop" => {
            let Val::List(l) = a0()? else {
                return Err("pop() on something that is not a list".into());
            };
            let n = l.borrow().len() as i64;
            let i = match args.get(1) {
                Some(v) => int_of(v, "index")?,
                None => -1,
            };
            let j = if i < 0 { i + n } else { i };
            if j < 0 || j >= n {
                return Err("pop index out of range".into());
            }
            l.borrow_mut().remove(j as usize)
        }
        "_set_item" | "__setitem__" => {
            set_item(
                a0()?,
                arg(args, 1, name)?.clone(),
                arg(args, 2, name)?.clone(),
            )?;
            Val::None
        }
        "__getitem__" => get_item(a0()?, arg(args, 1, name)?, ops)?,
        "list" => match a0()? {
            Val::Tensor(_) => return Ok(None),
            v => Val::list(
                v.items()
                    .ok_or("list() of something that is not a sequence")?,
            ),
        },
        "keys" | "values" | "items" => {
            let Val::Dict(d) = a0()? else {
                return Ok(None);
            };
            let d = d.borrow();
            Val::list(
                d.iter()
                    .map(|(k, v)| match name {
                        "keys" => k.clone(),
                        "values" => v.clone(),
                        _ => Val::tuple(vec![k.clone(), v.clone()]),
                    })
                    .collect(),
            )
        }
        "update" => {
            let (d @ Val::Dict(_), Val::Dict(other)) = (a0()?, arg(args, 1, name)?) else {
                return Ok(None);
            };
            let pairs = other.borrow().clone();
            for (k, v) in pairs {
                set_item(d, k, v)?;
            }
            Val::None
        }
        "format" => format(args)?,
        "_native_multi_head_attention" => native_multi_head_attention(args, ops)?,
        "copy" if matches!(args.first(), Some(Val::List(_) | Val::Dict(_))) => match a0()? {
            Val::Dict(d) => Val::Dict(Rc::new(RefCell::new(d.borrow().clone()))),
            v => Val::list(v.items().unwrap_or_default()),
        },
        "slice" if !matches!(args.first(), Some(Val::Tensor(_))) => {
            let opt = |i: usize| -> BResult<Option<i64>> {
                match args.get(i) {
                    None | Some(Val::None) => Ok(None),
                    Some(v) => int_of(v, "slice bound").map(Some),
                }
            };
            slice(a0()?, opt(1)?, opt(2)?, opt(3)?, ops)?
        }
        "dict" => {
            let pairs = match args.first() {
                None => Vec::new(),
                Some(Val::Dict(d)) => d.borrow().clone(),
                Some(v) => v
                    .items()
                    .ok_or("dict() of something that is not a sequence")?
                    .iter()
                    .map(|p| match p.items().as_deref() {
                        Some([k, x]) => Ok((k.clone(), x.clone())),
                        _ => Err("dict() of items that are not pairs".to_string()),
                    })
                    .collect::<BResult<_>>()?,
            };
            Val::Dict(Rc::new(RefCell::new(pairs)))
        }
        "__is__" | "__isnot__" => {
            let same = match (a0()?, arg(args, 1, name)?) {
                (Val::None, Val::None) => true,
                (Val::None, _) | (_, Val::None) => false,
                (Val::Object(a), Val::Object(b)) => Rc::ptr_eq(a, b),
                (Val::List(a), Val::List(b)) => Rc::ptr_eq(a, b),
                (Val::Bool(a), Val::Bool(b)) => a == b,
                _ => false,
            };
            Val::Bool(same == (name == "__is__"))
        }
        "__not__" => match a0()? {
            Val::Tensor(t) => Val::Bool(tensor_scalar(t)? == 0.0),
            v => Val::Bool(!v.truthy().ok_or("not of a value with no truth")?),
        },
        "__contains__" => {
            let (c, x) = (a0()?, arg(args, 1, name)?);
            Val::Bool(match c {
                Val::List(_) | Val::Tuple(_) => c
                    .items()
                    .unwrap_or_default()
                    .iter()
                    .any(|y| py_eq(y, x) == Some(true)),
                Val::Dict(d) => d.borrow().iter().any(|(k, _)| py_eq(k, x) == Some(true)),
                Val::Str(s) => match x {
                    Val::Str(sub) => s.contains(&**sub),
                    _ => false,
                },
                _ => return Ok(None),
            })
        }
        "__range_length" => {
            let lo = int_of(a0()?, "lo")?;
            let hi = int_of(arg(args, 1, name)?, "hi")?;
            let step = int_of(arg(args, 2, name)?, "step")?;
            if step == 0 {
                return Err("range() step must not be zero".into());
            }
            let span = i128::from(hi) - i128::from(lo);
            let n = if step > 0 {
                (span + i128::from(step) - 1).div_euclid(i128::from(step))
            } else {
                (span + i128::from(step) + 1).div_euclid(i128::from(step))
            };
            Val::Int(n.clamp(0, i128::from(i64::MAX)) as i64)
        }
        "__derive_index" => {
            let idx = int_of(a0()?, "index")?;
            let start = int_of(arg(args, 1, name)?, "start")?;
            let step = int_of(arg(args, 2, name)?, "step")?;
            Val::Int(start.wrapping_add(idx.wrapping_mul(step)))
        }
        "warn" => Val::None,
        // No gradients are ever computed here: a `no_grad` block's switch is a no-op.
        "is_grad_enabled" => Val::Bool(false),
        "set_grad_enabled" => Val::None,
        "device" => Val::Device,
        "Int" | "IntImplicit" => Val::Int(int_of(a0()?, "value")?),
        "Float" | "FloatImplicit" => Val::Float(float_of(a0()?)?),
        "Bool" | "BoolImplicit" => Val::Bool(float_of(a0()?)? != 0.0),
        "ScalarImplicit" | "item" => match a0()? {
            Val::Tensor(t) if t.dtype() == DType::I64 => Val::Int(tensor_int(t)?),
            Val::Tensor(t) if t.dtype() == DType::U8 => Val::Bool(tensor_scalar(t)? != 0.0),
            Val::Tensor(t) => Val::Float(tensor_scalar(t)?),
            v => v.clone(),
        },
        "is_floating_point" => match a0()? {
            Val::Tensor(t) => Val::Bool(crate::ops::category(t.dtype()) == 2),
            _ => return Ok(None),
        },
        "tensor" | "as_tensor" => {
            let dtype = kwargs
                .iter()
                .find(|(k, _)| k == "dtype")
                .map(|(_, v)| v)
                .or(args.get(1));
            new_tensor(a0()?, dtype)?
        }
        "str" => Val::Str(a0()?.render().into()),
        "_unwrap_optional" => a0()?.clone(),
        "__and__" | "__or__" | "__xor__" if !has_tensor(args, kwargs) => {
            let (a, b) = (a0()?, arg(args, 1, name)?);
            match (a, b) {
                (Val::Bool(x), Val::Bool(y)) => Val::Bool(match name {
                    "__and__" => x & y,
                    "__or__" => x | y,
                    _ => x ^ y,
                }),
                _ => {
                    let (x, y) = (int_of(a, "operand")?, int_of(b, "operand")?);
                    Val::Int(match name {
                        "__and__" => x & y,
                        "__or__" => x | y,
                        _ => x ^ y,
                    })
                }
            }
        }
        _ => return Ok(None),
    }))
}

fn float_of(v: &Val) -> BResult<f64> {
    match v {
        Val::Tensor(t) => tensor_scalar(t),
        Val::Str(s) => s
            .trim()
            .parse()
            .map_err(|_| format!("float() of the string {s:?}")),
        v => num(v)
            .map(Num::f)
            .ok_or_else(|| format!("float() of a {}", v.type_name())),
    }
}

fn len(v: &Val) -> BResult<Val> {
    Ok(Val::Int(match v {
        Val::List(l) => l.borrow().len(),
        Val::Tuple(t) => t.len(),
        Val::Dict(d) => d.borrow().len(),
        Val::Str(s) => s.chars().count(),
        Val::Tensor(t) => *t.dims().first().ok_or("len() of a 0-d tensor")?,
        o => return Err(format!("len() of a {}", o.type_name())),
    } as i64))
}

/// `"{} and {}".format(a, b)` / `torch.format(s, a, b)`.
fn format(args: &[Val]) -> BResult<Val> {
    let Some(Val::Str(s)) = args.first() else {
        return Err("format() needs a string".into());
    };
    let mut out = String::new();
    let mut rest = &args[1..];
    let mut it = s.split("{}");
    if let Some(first) = it.next() {
        out.push_str(first);
    }
    for part in it {
        match rest.split_first() {
            Some((v, r)) => {
                out.push_str(&v.render());
                rest = r;
            }
            None => out.push_str("{}"),
        }
        out.push_str(part);
    }
    Ok(Val::Str(out.into()))
}

/// `torch.tensor(data, dtype=…)` from a scalar or nested list of numbers.
fn new_tensor(data: &Val, dtype: Option<&Val>) -> BResult<Val> {
    let mut shape = Vec::new();
    let mut flat = Vec::new();
    let mut kind = 0u8; // 0 bool, 1 int, 2 float
    fn walk(
        v: &Val,
        depth: usize,
        shape: &mut Vec<usize>,
        flat: &mut Vec<f64>,
        kind: &mut u8,
    ) -> BResult<()> {
        if depth > 32 {
            return Err("tensor() of a list nested deeper than 32 levels".into());
        }
        if let Some(items) = v.items() {
            if shape.len() == depth {
                shape.push(items.len());
            } else if shape.get(depth) != Some(&items.len()) {
                return Err("tensor() of a ragged list".into());
            }
            for x in &items {
                walk(x, depth + 1, shape, flat, kind)?;
            }
            return Ok(());
        }
        if flat.len() >= MAX_LIST {
            return Err(format!("tensor() of more than {MAX_LIST} numbers"));
        }
        match v {
            Val::Bool(b) => flat.push(f64::from(u8::from(*b))),
            Val::Int(i) => {
                *kind = (*kind).max(1);
                flat.push(*i as f64);
            }
            Val::Float(f) => {
                *kind = 2;
                flat.push(*f);
            }
            o => return Err(format!("tensor() of a {}", o.type_name())),
        }
        Ok(())
    }
    // Ints are kept exact: collect them separately when the data is all ints.
    walk(data, 0, &mut shape, &mut flat, &mut kind)?;
    let e = |e: candle_core::Error| e.to_string();
    let dev = Device::Cpu;
    let t = match kind {
        0 => Tensor::from_vec(
            flat.iter().map(|&x| x as u8).collect::<Vec<_>>(),
            shape,
            &dev,
        ),
        1 => {
            let mut ints = Vec::with_capacity(flat.len());
            collect_ints(data, &mut ints);
            Tensor::from_vec(ints, shape, &dev)
        }
        // Floats asked for as float64 are kept exact (not rounded through f32).
        _ if matches!(dtype, Some(Val::Int(st))
            if super::value::dtype_to_program(*st) == Some(crate::dtype::DOUBLE)) =>
        {
            Tensor::from_vec(flat.clone(), shape, &dev)
        }
        _ => Tensor::from_vec(
            flat.iter().map(|&x| x as f32).collect::<Vec<_>>(),
            shape,
            &dev,
        ),
    }
    .map_err(e)?;
    let t = match dtype {
        Some(Val::Int(st)) => {
            let st =
                super::value::dtype_to_program(*st).ok_or("tensor() of an unsupported dtype")?;
            crate::dtype::cast(&t, st).map_err(|e| e.0)?
        }
        _ => t,
    };
    super::specialise::constant(&t);
    Ok(Val::Tensor(t))
}

fn collect_ints(v: &Val, out: &mut Vec<i64>) {
    match v.items() {
        Some(items) => items.iter().for_each(|x| collect_ints(x, out)),
        None => out.push(match v {
            Val::Int(i) => *i,
            Val::Bool(b) => i64::from(*b),
            _ => 0,
        }),
    }
}

/// `ops.prim.<name>(args)`.
pub fn call_prim(name: &str, args: &[Val], kwargs: &[(String, Val)], ops: &Ops) -> BResult<Val> {
    let a0 = || arg(args, 0, name);
    Ok(match name {
        "NumToTensor" => {
            let t = match a0()? {
                Val::Int(i) => Tensor::new(*i, &Device::Cpu),
                Val::Bool(b) => Tensor::new(u8::from(*b), &Device::Cpu),
                // A 0-d float64 tensor, as torch's NumToTensor makes (not a wrapped number:
                // `int_tensor * it` is float64, `f32_tensor * it` stays f32).
                Val::Float(f) => Tensor::new(*f, &Device::Cpu),
                Val::Tensor(t) => return Ok(Val::Tensor(t.clone())),
                o => return Err(format!("NumToTensor of a {}", o.type_name())),
            }
            .map_err(|e| e.to_string())?;
            super::specialise::constant(&t);
            Val::Tensor(t)
        }
        "dtype" => match a0()? {
            Val::Tensor(t) => Val::Int(super::value::dtype_to_c10(crate::dtype::of_runtime(
                t.dtype(),
            ))),
            o => return Err(format!("dtype of a {}", o.type_name())),
        },
        "device" => Val::Device,
        // A device's type (`torch.device("cpu").type`): everything runs on the CPU.
        "type" => match a0()? {
            Val::Device => Val::Str("cpu".into()),
            o => return Err(format!("type of a {}", o.type_name())),
        },
        "layout" => Val::Int(0),
        "is_cuda" | "requires_grad" | "is_quantized" | "is_nested" | "is_sparse" | "is_mkldnn" => {
            Val::Bool(false)
        }
        "data" | "unchecked_unwrap_optional" | "Uninitialized" => {
            args.first().cloned().unwrap_or(Val::None)
        }
        "shape" => call_torch("size", &args[..1.min(args.len())], &[], ops)?,
        "RaiseException" => {
            let msg = a0()?.render();
            let class = match args.get(1) {
                Some(Val::Str(c)) => c.strip_prefix("builtins.").unwrap_or(c).to_string(),
                _ => "Exception".into(),
            };
            return Err(format!("the model raised {class}: {msg}"));
        }
        "min" | "max" | "abs" => call_torch(name, args, kwargs, ops)?,
        "TupleIndex" => get_item(a0()?, arg(args, 1, name)?, ops)?,
        _ => return Err(format!("ops.prim.{name} is not supported")),
    })
}

/// A builtin called by its bare name (`int(x)`, `len(l)`, `getattr(self, "0")`).
pub fn call_builtin(name: &str, args: &[Val], kwargs: &[(String, Val)], ops: &Ops) -> BResult<Val> {
    let a0 = || arg(args, 0, name);
    Ok(match name {
        "int" => match a0()? {
            Val::Float(f) => Val::Int(f.trunc() as i64),
            Val::Str(s) => Val::Int(
                s.trim()
                    .parse()
                    .map_err(|_| format!("int() of the string {s:?}"))?,
            ),
            v => Val::Int(int_of(v, "int()")?),
        },
        "float" => Val::Float(float_of(a0()?)?),
        "bool" => match a0()? {
            Val::Tensor(t) => Val::Bool(tensor_scalar(t)? != 0.0),
            v => Val::Bool(v.truthy().ok_or("bool() of a value with no truth")?),
        },
        "str" => Val::Str(a0()?.render().into()),
        "len" => len(a0()?)?,
        "print" => Val::None,
        "getattr" | "hasattr" => {
            let (Val::Object(o), Val::Str(attr)) = (a0()?, arg(args, 1, name)?) else {
                return Err(format!("{name}() takes an object and a string"));
            };
            match (name, o.get(attr)) {
                ("hasattr", v) => Val::Bool(v.is_some()),
                (_, Some(v)) => v,
                (_, None) => match args.get(2) {
                    Some(d) => d.clone(),
                    None => return Err(format!("{} has no attribute '{attr}'", o.class)),
                },
            }
        }
        "range" => {
            let vals: Vec<i64> = args
                .iter()
                .map(|v| int_of(v, "range()"))
                .collect::<BResult<_>>()?;
            let (a, b, s) = match vals[..] {
                [n] => (0, n, 1),
                [a, b] => (a, b, 1),
                [a, b, c] => (a, b, c),
                _ => return Err("range() takes 1 to 3 arguments".into()),
            };
            if s == 0 {
                return Err("range() step must not be zero".into());
            }
            let mut out = Vec::new();
            let mut i = a;
            while (s > 0 && i < b) || (s < 0 && i > b) {
                if out.len() >= MAX_LIST {
                    return Err(format!("range() of more than {MAX_LIST} items"));
                }
                out.push(Val::Int(i));
                i = match i.checked_add(s) {
                    Some(n) => n,
                    None => break,
                };
            }
            Val::list(out)
        }
        "min" | "max" | "abs" | "dict" => call_torch(name, args, kwargs, ops)?,
        "round" => Val::Float(
            num(a0()?)
                .ok_or("round() of a non-number")?
                .f()
                .round_ties_even(),
        ),
        "list" => Val::list(
            a0()?
                .items()
                .ok_or("list() of something that is not a sequence")?,
        ),
        "tuple" => Val::tuple(
            a0()?
                .items()
                .ok_or("tuple() of something that is not a sequence")?,
        ),
        "enumerate" => Val::list(
            a0()?
                .items()
                .ok_or("enumerate() of something that is not a sequence")?
                .into_iter()
                .enumerate()
                .map(|(i, v)| Val::tuple(vec![Val::Int(i as i64), v]))
                .collect(),
        ),
        "zip" => {
            let lists: Vec<Vec<Val>> = args
                .iter()
                .map(|a| a.items().ok_or("zip() of something that is not a sequence"))
                .collect::<Result<_, _>>()?;
            let n = lists.iter().map(Vec::len).min().unwrap_or(0);
            Val::list(
                (0..n)
                    .map(|i| Val::tuple(lists.iter().map(|l| l[i].clone()).collect()))
                    .collect(),
            )
        }
        "divmod" => {
            let q = call_torch("floordiv", args, &[], ops)?;
            let r = call_torch("remainder", args, &[], ops)?;
            Val::tuple(vec![q, r])
        }
        _ => return Err(format!("'{name}' is not supported")),
    })
}

fn index(i: i64, n: usize, what: &str) -> BResult<usize> {
    let n = n as i64;
    let j = if i < 0 { i + n } else { i };
    if j < 0 || j >= n {
        return Err(format!("{what} index {i} is out of range (length {n})"));
    }
    Ok(j as usize)
}

/// `o[i]`.
pub fn get_item(o: &Val, i: &Val, ops: &Ops) -> BResult<Val> {
    match o {
        Val::List(_) | Val::Tuple(_) => {
            let items = o.items().unwrap_or_default();
            let k = index(int_of(i, "list index")?, items.len(), "list")?;
            Ok(items[k].clone())
        }
        Val::Dict(d) => d
            .borrow()
            .iter()
            .find(|(k, _)| py_eq(k, i) == Some(true))
            .map(|(_, v)| v.clone())
            .ok_or_else(|| format!("KeyError: {}", i.render())),
        Val::Str(s) => {
            let chars: Vec<char> = s.chars().collect();
            let k = index(int_of(i, "string index")?, chars.len(), "string")?;
            Ok(Val::Str(chars[k].to_string().into()))
        }
        Val::Tensor(_) => match i {
            Val::Int(_) => ops.call("select", &[o.clone(), Val::Int(0), i.clone()], &[]),
            _ => Err(format!("indexing a tensor with a {}", i.type_name())),
        },
        other => Err(format!("a {} cannot be indexed", other.type_name())),
    }
}

/// `o[i] = v`.
pub fn set_item(o: &Val, i: Val, v: Val) -> BResult<()> {
    match o {
        Val::List(l) => {
            let n = l.borrow().len();
            let k = index(int_of(&i, "list index")?, n, "list")?;
            l.borrow_mut()[k] = v;
            Ok(())
        }
        Val::Dict(d) => {
            let mut d = d.borrow_mut();
            if let Some(slot) = d.iter_mut().find(|(k, _)| py_eq(k, &i) == Some(true)) {
                slot.1 = v;
            } else {
                if d.len() >= MAX_LIST {
                    return Err(format!("a dict grew past {MAX_LIST} items"));
                }
                d.push((i, v));
            }
            Ok(())
        }
        other => Err(format!("cannot assign items of a {}", other.type_name())),
    }
}

/// `o[a:b:c]`.
pub fn slice(o: &Val, a: Option<i64>, b: Option<i64>, c: Option<i64>, ops: &Ops) -> BResult<Val> {
    if let Val::Tensor(_) = o {
        let opt = |x: Option<i64>| x.map_or(Val::None, Val::Int);
        return ops.call(
            "slice",
            &[
                o.clone(),
                Val::Int(0),
                opt(a),
                opt(b),
                Val::Int(c.unwrap_or(1)),
            ],
            &[],
        );
    }
    let items: Vec<Val> = match o {
        Val::Str(s) => s
            .chars()
            .map(|ch| Val::Str(ch.to_string().into()))
            .collect(),
        _ => o
            .items()
            .ok_or_else(|| format!("a {} cannot be sliced", o.type_name()))?,
    };
    let n = items.len() as i64;
    let step = c.unwrap_or(1);
    if step != 1 {
        return Err("slices with a step are only supported on tensors".into());
    }
    let clamp = |x: i64| if x < 0 { (x + n).max(0) } else { x.min(n) };
    let lo = clamp(a.unwrap_or(0));
    let hi = clamp(b.unwrap_or(n)).max(lo);
    let part: Vec<Val> = items[lo as usize..hi as usize].to_vec();
    Ok(match o {
        Val::Tuple(_) => Val::tuple(part),
        Val::Str(_) => Val::Str(part.iter().map(Val::render).collect::<String>().into()),
        _ => Val::List(Rc::new(RefCell::new(part))),
    })
}

/// Whether the evaluator itself implements `torch.<op>` (list, dict, str, size and scalar
/// operations).
pub fn is_native(op: &str) -> bool {
    matches!(
        op,
        "len"
            | "list_with_default"
            | "size"
            | "dim"
            | "numel"
            | "append"
            | "extend"
            | "insert"
            | "pop"
            | "_set_item"
            | "__setitem__"
            | "__getitem__"
            | "list"
            | "keys"
            | "values"
            | "items"
            | "update"
            | "format"
            | "__is__"
            | "__isnot__"
            | "__not__"
            | "__contains__"
            | "__range_length"
            | "__derive_index"
            | "warn"
            | "is_grad_enabled"
            | "set_grad_enabled"
            | "device"
            | "Int"
            | "IntImplicit"
            | "Float"
            | "FloatImplicit"
            | "Bool"
            | "BoolImplicit"
            | "ScalarImplicit"
            | "item"
            | "is_floating_point"
            | "tensor"
            | "as_tensor"
            | "str"
            | "_unwrap_optional"
            | "floordiv"
            | "__and__"
            | "__or__"
            | "__xor__"
            | "dict"
            | "_native_multi_head_attention"
    )
}

/// Whether `ops.prim.<op>` is implemented.
pub fn is_prim(op: &str) -> bool {
    matches!(
        op,
        "NumToTensor"
            | "dtype"
            | "device"
            | "type"
            | "layout"
            | "is_cuda"
            | "requires_grad"
            | "is_quantized"
            | "is_nested"
            | "is_sparse"
            | "is_mkldnn"
            | "data"
            | "unchecked_unwrap_optional"
            | "Uninitialized"
            | "shape"
            | "RaiseException"
            | "min"
            | "max"
            | "abs"
            | "TupleIndex"
    )
}

/// `aten::_native_multi_head_attention` (nn.MultiheadAttention's inference fast path, which
/// traced code records): composed from the registry's `linear`, `view`, `transpose` and
/// `scaled_dot_product_attention` kernels. Inputs are batch-first `(B, L, E)`; attention
/// weights are not computed (`need_weights=True` is refused).
pub fn native_multi_head_attention(args: &[Val], ops: &Ops) -> BResult<Val> {
    let a = |i: usize| arg(args, i, "_native_multi_head_attention");
    let (q, k, v) = (a(0)?, a(1)?, a(2)?);
    let e = int_of(a(3)?, "embed_dim")?;
    let h = int_of(a(4)?, "num_head")?;
    let (w, b, pw, pb) = (a(5)?, a(6)?, a(7)?, a(8)?);
    if !matches!(args.get(9), None | Some(Val::None)) {
        return Err("_native_multi_head_attention with a mask is not supported".into());
    }
    if matches!(args.get(10), Some(Val::Bool(true))) {
        return Err("_native_multi_head_attention with need_weights=True is not supported".into());
    }
    if h <= 0 || e % h != 0 {
        return Err(format!("embed_dim {e} is not a multiple of num_head {h}"));
    }
    let part = |t: &Val, i: i64| -> BResult<Val> {
        if matches!(t, Val::None) {
            return Ok(Val::None);
        }
        ops.call(
            "slice",
            &[
                t.clone(),
                Val::Int(0),
                Val::Int(i * e),
                Val::Int((i + 1) * e),
            ],
            &[],
        )
    };
    let heads = |x: &Val, i: i64| -> BResult<Val> {
        let y = ops.call("linear", &[x.clone(), part(w, i)?, part(b, i)?], &[])?;
        let Val::Tensor(t) = &y else {
            return Err("linear did not give a tensor".into());
        };
        let (bsz, len) = match t.dims() {
            [bsz, len, _] => (*bsz as i64, *len as i64),
            d => {
                return Err(format!(
                    "_native_multi_head_attention of a {}-d input",
                    d.len()
                ))
            }
        };
        let y = ops.call(
            "view",
            &[
                y,
                Val::list(vec![
                    Val::Int(bsz),
                    Val::Int(len),
                    Val::Int(h),
                    Val::Int(e / h),
                ]),
            ],
            &[],
        )?;
        ops.call("transpose", &[y, Val::Int(1), Val::Int(2)], &[])
    };
    let o = ops.call(
        "scaled_dot_product_attention",
        &[heads(q, 0)?, heads(k, 1)?, heads(v, 2)?],
        &[],
    )?;
    let o = ops.call("transpose", &[o, Val::Int(1), Val::Int(2)], &[])?;
    let Val::Tensor(t) = &o else {
        return Err("attention did not give a tensor".into());
    };
    let (bsz, len) = (t.dims()[0] as i64, t.dims()[1] as i64);
    let o = ops.call(
        "reshape",
        &[
            o,
            Val::list(vec![Val::Int(bsz), Val::Int(len), Val::Int(e)]),
        ],
        &[],
    )?;
    let out = ops.call("linear", &[o, pw.clone(), pb.clone()], &[])?;
    let empty = Tensor::zeros(0, DType::F32, &Device::Cpu).map_err(|e| e.to_string())?;
    Ok(Val::tuple(vec![out, Val::Tensor(empty)]))
}
