//! Values of the TorchScript evaluator: Python-like scalars, strings, lists (shared and
//! mutable, as in Python), tuples, dicts, tensors and scripted objects (modules).

use std::cell::RefCell;
use std::rc::Rc;

use candle_core::Tensor;

/// A value while the code runs.
#[derive(Debug, Clone)]
pub enum Val {
    /// `None`.
    None,
    /// A bool.
    Bool(bool),
    /// An int.
    Int(i64),
    /// A float.
    Float(f64),
    /// A str.
    Str(Rc<str>),
    /// A tensor (runtime representation: f32, i64 or u8 for bool).
    Tensor(Tensor),
    /// A list (shared: `append` is seen by every holder).
    List(Rc<RefCell<Vec<Val>>>),
    /// A tuple.
    Tuple(Rc<[Val]>),
    /// A dict, insertion-ordered.
    Dict(Rc<RefCell<Vec<(Val, Val)>>>),
    /// A scripted object (a module, or an instance of another `__torch__` class).
    Object(Rc<Obj>),
    /// A device (`torch.device("cpu")`); everything runs on the CPU.
    Device,
    /// A name that is not a value by itself: `torch`, `ops.aten`, `__torch__.a.b`, a builtin
    /// such as `int`, or a free function's qualified name. Calling it resolves the name.
    Path(Rc<str>),
}

/// A scripted object.
#[derive(Debug)]
pub struct Obj {
    /// Its qualified class name (`__torch__.torch.nn.modules.linear.___torch_mangle_3.Linear`).
    pub class: Rc<str>,
    /// Its attributes.
    pub attrs: RefCell<Vec<(String, Val)>>,
}

impl Obj {
    /// The attribute `name`, if set.
    pub fn get(&self, name: &str) -> Option<Val> {
        self.attrs
            .borrow()
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }

    /// Set (or add) the attribute `name`.
    pub fn set(&self, name: &str, v: Val) {
        let mut a = self.attrs.borrow_mut();
        match a.iter_mut().find(|(k, _)| k == name) {
            Some(slot) => slot.1 = v,
            None => a.push((name.to_string(), v)),
        }
    }
}

impl Val {
    /// A short name of the value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Val::None => "None",
            Val::Bool(_) => "bool",
            Val::Int(_) => "int",
            Val::Float(_) => "float",
            Val::Str(_) => "str",
            Val::Tensor(_) => "Tensor",
            Val::List(_) => "list",
            Val::Tuple(_) => "tuple",
            Val::Dict(_) => "dict",
            Val::Object(_) => "object",
            Val::Device => "device",
            Val::Path(_) => "name",
        }
    }

    /// A new list value.
    pub fn list(items: Vec<Val>) -> Val {
        Val::List(Rc::new(RefCell::new(items)))
    }

    /// A new tuple value.
    pub fn tuple(items: Vec<Val>) -> Val {
        Val::Tuple(items.into())
    }

    /// The items of a list or tuple.
    pub fn items(&self) -> Option<Vec<Val>> {
        match self {
            Val::List(l) => Some(l.borrow().clone()),
            Val::Tuple(t) => Some(t.to_vec()),
            _ => None,
        }
    }

    /// Python truthiness of a scalar, str, list, tuple, dict or None (tensors need `bool()`).
    pub fn truthy(&self) -> Option<bool> {
        Some(match self {
            Val::None => false,
            Val::Bool(b) => *b,
            Val::Int(i) => *i != 0,
            Val::Float(f) => *f != 0.0,
            Val::Str(s) => !s.is_empty(),
            Val::List(l) => !l.borrow().is_empty(),
            Val::Tuple(t) => !t.is_empty(),
            Val::Dict(d) => !d.borrow().is_empty(),
            _ => return None,
        })
    }

    /// A Python-like rendering, for `str()` and `format`.
    pub fn render(&self) -> String {
        match self {
            Val::None => "None".into(),
            Val::Bool(b) => if *b { "True" } else { "False" }.into(),
            Val::Int(i) => i.to_string(),
            Val::Float(f) => {
                if f.fract() == 0.0 && f.is_finite() && f.abs() < 1e16 {
                    format!("{f:.1}")
                } else {
                    f.to_string()
                }
            }
            Val::Str(s) => s.to_string(),
            Val::Tensor(t) => format!("tensor of shape {:?}", t.dims()),
            Val::List(l) => {
                let parts: Vec<String> = l.borrow().iter().map(Val::render).collect();
                format!("[{}]", parts.join(", "))
            }
            Val::Tuple(t) => {
                let parts: Vec<String> = t.iter().map(Val::render).collect();
                if parts.len() == 1 {
                    format!("({},)", parts[0])
                } else {
                    format!("({})", parts.join(", "))
                }
            }
            Val::Dict(d) => {
                let parts: Vec<String> = d
                    .borrow()
                    .iter()
                    .map(|(k, v)| format!("{}: {}", k.render(), v.render()))
                    .collect();
                format!("{{{}}}", parts.join(", "))
            }
            Val::Object(o) => format!("<{} object>", o.class),
            Val::Device => "cpu".into(),
            Val::Path(p) => p.to_string(),
        }
    }
}

/// Python equality of two non-tensor values (`None`, scalars, strings, lists, tuples);
/// `None` when they cannot be compared without tensors.
pub fn py_eq(a: &Val, b: &Val) -> Option<bool> {
    Some(match (a, b) {
        (Val::None, Val::None) => true,
        (Val::None, _) | (_, Val::None) => false,
        (Val::Str(x), Val::Str(y)) => x == y,
        (
            Val::Int(_) | Val::Bool(_) | Val::Float(_),
            Val::Int(_) | Val::Bool(_) | Val::Float(_),
        ) => match (num(a)?, num(b)?) {
            (Num::I(x), Num::I(y)) => x == y,
            (x, y) => x.f() == y.f(),
        },
        (Val::List(_) | Val::Tuple(_), Val::List(_) | Val::Tuple(_)) => {
            let (x, y) = (a.items()?, b.items()?);
            if x.len() != y.len() {
                return Some(false);
            }
            for (p, q) in x.iter().zip(&y) {
                if !py_eq(p, q)? {
                    return Some(false);
                }
            }
            true
        }
        (Val::Device, Val::Device) => true,
        _ => return None,
    })
}

/// A Python number.
#[derive(Debug, Clone, Copy)]
pub enum Num {
    /// An int (bools count as ints).
    I(i64),
    /// A float.
    F(f64),
}

impl Num {
    /// As f64.
    pub fn f(self) -> f64 {
        match self {
            Num::I(i) => i as f64,
            Num::F(f) => f,
        }
    }
}

/// The number a scalar value holds.
pub fn num(v: &Val) -> Option<Num> {
    match v {
        Val::Int(i) => Some(Num::I(*i)),
        Val::Bool(b) => Some(Num::I(i64::from(*b))),
        Val::Float(f) => Some(Num::F(*f)),
        _ => None,
    }
}

/// A dtype as TorchScript code holds it (c10's `ScalarType` number: 6 float32, 4 int64,
/// 11 bool, …) as the serialized-program number the kernels take; `None` for dtypes the
/// runtime has no form for.
pub fn dtype_to_program(c10: i64) -> Option<i64> {
    match c10 {
        0..=11 => Some(c10 + 1),
        15 => Some(13),
        _ => None,
    }
}

/// The c10 `ScalarType` number of a serialized-program dtype number.
pub fn dtype_to_c10(st: i64) -> i64 {
    match st {
        1..=12 => st - 1,
        13 => 15,
        other => other,
    }
}
