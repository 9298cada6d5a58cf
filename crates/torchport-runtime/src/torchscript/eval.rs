//! The evaluator: runs the parsed code of a TorchScript archive statement by statement.
//! Operator calls (`torch.X`, `ops.aten.X`, Python operators on tensors) go to the op
//! registry through [`super::aten`]; Python-level work (ints, floats, lists, tuples, dicts,
//! strings, `None`, control flow, method calls on modules) is done here. Bounded: call depth,
//! statements executed, and sizes of `range`s and lists.

use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use super::ast::{BinOp, Expr, ExprKind, Func, Stmt, StmtKind, Target};
use super::aten::Ops;
use super::builtins;
use super::layouts::{Layout, Layouts};
use super::value::{Obj, Val};
use super::view_writes;
use super::Code;

/// Deepest chain of function and method calls.
pub const MAX_CALL_DEPTH: usize = 200;
/// Most statements one run may execute.
pub const MAX_STEPS: u64 = 200_000_000;
/// Most items a list built by the code may hold.
pub const MAX_LIST: usize = 1 << 24;

/// An error while running, located at the innermost statement.
#[derive(Debug)]
pub struct EvalError {
    /// The code record and line, once known.
    pub at: Option<(String, u32)>,
    /// What went wrong.
    pub what: String,
}

impl From<String> for EvalError {
    fn from(what: String) -> Self {
        EvalError { at: None, what }
    }
}

impl From<&str> for EvalError {
    fn from(what: &str) -> Self {
        EvalError {
            at: None,
            what: what.to_string(),
        }
    }
}

impl From<candle_core::Error> for EvalError {
    fn from(e: candle_core::Error) -> Self {
        EvalError {
            at: None,
            what: crate::error::candle_message(&e),
        }
    }
}

/// Result of evaluation.
pub type EResult<T> = Result<T, EvalError>;

enum Flow {
    Normal,
    Return(Val),
    Break,
    Continue,
}

/// One run of the code.
pub struct Interp<'a> {
    code: &'a Code,
    constants: Vec<Val>,
    ops: &'static Ops,
    /// The Linear weights the load stored packed.
    linears: &'a super::aten::PackedLinears,
    depth: usize,
    steps: u64,
    /// Tensors that are part of another tensor (results of `slice`, `select`, `narrow`,
    /// indexing…): an in-place update of one is written back into the tensor it was cut
    /// from, or refused ([`view_writes`]).
    parts: view_writes::Parts,
    /// How torch holds the tensors, where known (for `as_strided`).
    layouts: Layouts<'a>,
}

struct Frame {
    vars: HashMap<String, Val>,
    file: Rc<str>,
}

impl<'a> Interp<'a> {
    /// An evaluator over `code` whose `CONSTANTS.c<i>` are `constants`, whose Linear
    /// weights in `linears` are stored packed, and whose archive tensors torch holds as
    /// `stored` says.
    pub fn new(
        code: &'a Code,
        constants: Vec<Val>,
        linears: &'a super::aten::PackedLinears,
        stored: &'a crate::fast::HashMap<candle_core::TensorId, Layout>,
    ) -> Self {
        Interp {
            code,
            constants,
            ops: Ops::get(),
            linears,
            depth: 0,
            steps: 0,
            parts: view_writes::Parts::new(),
            layouts: Layouts::new(stored),
        }
    }

    /// The tensors in `args` (in lists too) are the run's inputs: torch holds them
    /// contiguously.
    pub fn inputs(&mut self, args: &[Val]) {
        for a in args {
            match a {
                Val::Tensor(t) => self.layouts.fresh(t),
                Val::List(_) | Val::Tuple(_) => self.inputs(&a.items().unwrap_or_default()),
                _ => {}
            }
        }
    }

    /// Call method `name` of `obj`.
    pub fn call_method(
        &mut self,
        obj: &Rc<Obj>,
        name: &str,
        args: Vec<Val>,
        kwargs: Vec<(String, Val)>,
    ) -> EResult<Val> {
        let (f, file) = self.code.method(&obj.class, name).ok_or_else(|| {
            EvalError::from(format!("class {} has no method '{name}'", obj.class))
        })?;
        let mut all = Vec::with_capacity(args.len() + 1);
        all.push(Val::Object(obj.clone()));
        all.extend(args);
        self.call_func(&f, file, all, kwargs)
    }

    fn call_func(
        &mut self,
        f: &Arc<Func>,
        file: Rc<str>,
        args: Vec<Val>,
        kwargs: Vec<(String, Val)>,
    ) -> EResult<Val> {
        if self.depth >= MAX_CALL_DEPTH {
            return Err(format!(
                "calls nested deeper than {MAX_CALL_DEPTH} levels (recursion through '{}')",
                f.name
            )
            .into());
        }
        if args.len() > f.params.len() {
            return Err(format!(
                "{}() takes {} arguments but {} were given",
                f.name,
                f.params.len(),
                args.len()
            )
            .into());
        }
        let mut frame = Frame {
            vars: HashMap::new(),
            file: file.clone(),
        };
        let mut args = args.into_iter();
        for p in &f.params {
            let v = if let Some(v) = args.next() {
                v
            } else if let Some((_, v)) = kwargs.iter().find(|(k, _)| k == &p.name) {
                v.clone()
            } else if let Some(d) = &p.default {
                self.eval(d, &mut frame)
                    .map_err(|e| self.locate(e, &file, f.line))?
            } else {
                return Err(format!("{}() is missing argument '{}'", f.name, p.name).into());
            };
            frame.vars.insert(p.name.clone(), v);
        }
        self.depth += 1;
        let r = self.block(&f.body, &mut frame);
        self.depth -= 1;
        match r? {
            Flow::Return(v) => Ok(v),
            _ => Ok(Val::None),
        }
    }

    fn locate(&self, mut e: EvalError, file: &str, line: u32) -> EvalError {
        if e.at.is_none() {
            e.at = Some((file.to_string(), line));
        }
        e
    }

    fn block(&mut self, stmts: &[Stmt], frame: &mut Frame) -> EResult<Flow> {
        for s in stmts {
            self.steps += 1;
            if self.steps > MAX_STEPS {
                return Err(self.locate(
                    format!("the code ran more than {MAX_STEPS} statements").into(),
                    &frame.file,
                    s.line,
                ));
            }
            let file = frame.file.clone();
            let flow = self
                .stmt(s, frame)
                .map_err(|e| self.locate(e, &file, s.line))?;
            if !matches!(flow, Flow::Normal) {
                return Ok(flow);
            }
        }
        Ok(Flow::Normal)
    }

    fn stmt(&mut self, s: &Stmt, frame: &mut Frame) -> EResult<Flow> {
        match &s.kind {
            StmtKind::Assign(targets, value) => {
                let v = self.eval(value, frame)?;
                for t in targets {
                    self.assign(t, v.clone(), frame)?;
                }
            }
            StmtKind::AugAssign(t, op, value) => {
                let Target::Name(n) = t else {
                    return Err("augmented assignment to anything but a name".into());
                };
                let cur = frame
                    .vars
                    .get(n)
                    .cloned()
                    .ok_or_else(|| format!("name '{n}' is not defined"))?;
                let v = self.eval(value, frame)?;
                let r = self.binary(*op, cur, v)?;
                frame.vars.insert(n.clone(), r);
            }
            StmtKind::Expr(e) => {
                self.eval(e, frame)?;
            }
            StmtKind::If(c, then, els) => {
                let v = self.eval(c, frame)?;
                return if truth(&v)? {
                    self.block(then, frame)
                } else {
                    self.block(els, frame)
                };
            }
            StmtKind::For(target, iter, body) => return self.for_loop(target, iter, body, frame),
            StmtKind::While(c, body) => loop {
                let v = self.eval(c, frame)?;
                if !truth(&v)? {
                    break;
                }
                self.steps += 1;
                if self.steps > MAX_STEPS {
                    return Err(format!("the code ran more than {MAX_STEPS} statements").into());
                }
                match self.block(body, frame)? {
                    Flow::Break => break,
                    Flow::Return(v) => return Ok(Flow::Return(v)),
                    _ => {}
                }
            },
            StmtKind::With(manager, body) => {
                // A manager of the code's classes (`torch.no_grad()` is one) is entered and
                // left by its own methods, also when the body returns; an error of the body
                // is the one reported.
                let m = self.eval(manager, frame)?;
                let Val::Object(o) = &m else {
                    return Err(format!("'with' on a {}", m.type_name()).into());
                };
                self.call_method(o, "__enter__", Vec::new(), Vec::new())?;
                let flow = self.block(body, frame)?;
                self.call_method(o, "__exit__", vec![Val::None; 3], Vec::new())?;
                return Ok(flow);
            }
            StmtKind::Return(e) => {
                let v = match e {
                    Some(e) => self.eval(e, frame)?,
                    None => Val::None,
                };
                return Ok(Flow::Return(v));
            }
            StmtKind::Raise(e) => {
                let msg = match e {
                    Some(e) => self.eval(e, frame)?.render(),
                    None => "an exception".into(),
                };
                return Err(format!("the model raised: {msg}").into());
            }
            StmtKind::Assert(c, msg) => {
                let v = self.eval(c, frame)?;
                if !truth(&v)? {
                    let m = match msg {
                        Some(m) => self.eval(m, frame)?.render(),
                        None => String::new(),
                    };
                    return Err(format!("the model raised: AssertionError {m}").into());
                }
            }
            StmtKind::Pass => {}
            StmtKind::Break => return Ok(Flow::Break),
            StmtKind::Continue => return Ok(Flow::Continue),
        }
        Ok(Flow::Normal)
    }

    fn for_loop(
        &mut self,
        target: &Target,
        iter: &Expr,
        body: &[Stmt],
        frame: &mut Frame,
    ) -> EResult<Flow> {
        // `range(...)` is iterated lazily.
        if let ExprKind::Call(f, args, kw) = &iter.kind {
            if matches!(&f.kind, ExprKind::Name(n) if n == "range" && !frame.vars.contains_key(n))
                && kw.is_empty()
            {
                let vals: Vec<i64> = args
                    .iter()
                    .map(|a| match self.eval(a, frame)? {
                        Val::Int(i) => Ok(i),
                        Val::Bool(b) => Ok(i64::from(b)),
                        v => Err(EvalError::from(format!(
                            "range() takes ints, got {}",
                            v.type_name()
                        ))),
                    })
                    .collect::<EResult<_>>()?;
                let (start, stop, step) = match vals[..] {
                    [n] => (0, n, 1),
                    [a, b] => (a, b, 1),
                    [a, b, c] => (a, b, c),
                    _ => return Err("range() takes 1 to 3 arguments".into()),
                };
                if step == 0 {
                    return Err("range() step must not be zero".into());
                }
                let mut i = start;
                while (step > 0 && i < stop) || (step < 0 && i > stop) {
                    self.assign(target, Val::Int(i), frame)?;
                    match self.block(body, frame)? {
                        Flow::Break => break,
                        Flow::Return(v) => return Ok(Flow::Return(v)),
                        _ => {}
                    }
                    i = match i.checked_add(step) {
                        Some(n) => n,
                        None => break,
                    };
                }
                return Ok(Flow::Normal);
            }
        }
        let v = self.eval(iter, frame)?;
        let items = match &v {
            Val::List(_) | Val::Tuple(_) => v.items().unwrap_or_default(),
            Val::Dict(d) => d.borrow().iter().map(|(k, _)| k.clone()).collect(),
            Val::Str(s) => s.chars().map(|c| Val::Str(c.to_string().into())).collect(),
            Val::Tensor(t) => {
                let n = t.dims().first().copied().unwrap_or(0);
                (0..n)
                    .map(|i| t.get(i).map(Val::Tensor))
                    .collect::<Result<_, _>>()?
            }
            other => return Err(format!("cannot iterate over a {}", other.type_name()).into()),
        };
        for item in items {
            self.assign(target, item, frame)?;
            match self.block(body, frame)? {
                Flow::Break => break,
                Flow::Return(v) => return Ok(Flow::Return(v)),
                _ => {}
            }
        }
        Ok(Flow::Normal)
    }

    fn assign(&mut self, t: &Target, v: Val, frame: &mut Frame) -> EResult<()> {
        match t {
            Target::Name(n) => {
                frame.vars.insert(n.clone(), v);
            }
            Target::Tuple(ts) => {
                let items = v.items().ok_or_else(|| {
                    format!("cannot unpack a {} into {} names", v.type_name(), ts.len())
                })?;
                if items.len() != ts.len() {
                    return Err(format!(
                        "cannot unpack {} values into {} names",
                        items.len(),
                        ts.len()
                    )
                    .into());
                }
                for (t, x) in ts.iter().zip(items) {
                    self.assign(t, x, frame)?;
                }
            }
            Target::Subscript(obj, idx) => {
                let o = self.eval(obj, frame)?;
                let i = self.eval(idx, frame)?;
                builtins::set_item(&o, i, v)?;
            }
            Target::Attr(obj, name) => match self.eval(obj, frame)? {
                Val::Object(o) => o.set(name, v),
                other => {
                    return Err(
                        format!("cannot set attribute '{name}' of a {}", other.type_name()).into(),
                    )
                }
            },
        }
        Ok(())
    }

    fn eval(&mut self, e: &Expr, frame: &mut Frame) -> EResult<Val> {
        Ok(match &e.kind {
            ExprKind::Int(i) => Val::Int(*i),
            ExprKind::Float(f) => Val::Float(*f),
            ExprKind::Str(s) => Val::Str(s.as_str().into()),
            ExprKind::Bool(b) => Val::Bool(*b),
            ExprKind::None => Val::None,
            ExprKind::Name(n) => match frame.vars.get(n) {
                Some(v) => v.clone(),
                None if builtins::is_global(n) || self.code.is_module_path(n) => {
                    Val::Path(n.as_str().into())
                }
                None => return Err(format!("name '{n}' is not defined").into()),
            },
            ExprKind::Attr(base, name) => {
                let b = self.eval(base, frame)?;
                self.attr(b, name)?
            }
            ExprKind::Call(f, args, kwargs) => return self.call(f, args, kwargs, frame),
            ExprKind::Subscript(obj, idx) => {
                let o = self.eval(obj, frame)?;
                if let ExprKind::Slice(a, b, c) = &idx.kind {
                    let mut part = |x: &Option<Box<Expr>>| -> EResult<Option<i64>> {
                        match x {
                            None => Ok(None),
                            Some(x) => match self.eval(x, frame)? {
                                Val::Int(i) => Ok(Some(i)),
                                Val::None => Ok(None),
                                v => Err(format!("slice bound is a {}", v.type_name()).into()),
                            },
                        }
                    };
                    let (a, b, c) = (part(a)?, part(b)?, part(c)?);
                    let mut r = builtins::slice(&o, a, b, c, self.ops)?;
                    if let Val::Tensor(t) = &o {
                        let int = |x: Option<i64>| x.map_or(Val::None, Val::Int);
                        let rest = [Val::Int(0), int(a), int(b), Val::Int(c.unwrap_or(1))];
                        let all = [std::slice::from_ref(&o), &rest[..]].concat();
                        r = self.layouts.after("slice", &all, &[], r, self.ops)?;
                        view_writes::mark(&mut self.parts, t, "slice", &rest, false, &r);
                    }
                    return Ok(r);
                }
                let i = self.eval(idx, frame)?;
                let mut r = builtins::get_item(&o, &i, self.ops)?;
                if let Val::Tensor(t) = &o {
                    // `x[i]` with an int is `select(x, 0, i)`; any other index is a part
                    // that is not written back, whose layout is not followed.
                    let (op, rest) = match i {
                        Val::Int(_) => ("select", vec![Val::Int(0), i]),
                        _ => ("__getitem__", Vec::new()),
                    };
                    if op == "select" {
                        let all = [std::slice::from_ref(&o), &rest[..]].concat();
                        r = self.layouts.after(op, &all, &[], r, self.ops)?;
                    }
                    view_writes::mark(&mut self.parts, t, op, &rest, false, &r);
                }
                r
            }
            ExprKind::Slice(..) => return Err("a slice outside a subscript".into()),
            ExprKind::List(items) => {
                let v = items
                    .iter()
                    .map(|x| self.eval(x, frame))
                    .collect::<EResult<_>>()?;
                Val::list(v)
            }
            ExprKind::Tuple(items) => {
                let v = items
                    .iter()
                    .map(|x| self.eval(x, frame))
                    .collect::<EResult<_>>()?;
                Val::tuple(v)
            }
            ExprKind::Dict(items) => {
                let mut v = Vec::with_capacity(items.len());
                for (k, x) in items {
                    v.push((self.eval(k, frame)?, self.eval(x, frame)?));
                }
                Val::Dict(Rc::new(std::cell::RefCell::new(v)))
            }
            ExprKind::Neg(x) => {
                let v = self.eval(x, frame)?;
                self.torch("neg", &[v], &[])?
            }
            ExprKind::Invert(x) => {
                let v = self.eval(x, frame)?;
                match v {
                    Val::Int(i) => Val::Int(!i),
                    v => self.torch("bitwise_not", &[v], &[])?,
                }
            }
            ExprKind::Not(x) => {
                let v = self.eval(x, frame)?;
                Val::Bool(!truth(&v)?)
            }
            ExprKind::Binary(op, a, b) => {
                let x = self.eval(a, frame)?;
                let y = self.eval(b, frame)?;
                self.binary(*op, x, y)?
            }
            ExprKind::And(a, b) => {
                let x = self.eval(a, frame)?;
                if truth(&x)? {
                    self.eval(b, frame)?
                } else {
                    x
                }
            }
            ExprKind::Or(a, b) => {
                let x = self.eval(a, frame)?;
                if truth(&x)? {
                    x
                } else {
                    self.eval(b, frame)?
                }
            }
            ExprKind::IfExp(c, a, b) => {
                let v = self.eval(c, frame)?;
                if truth(&v)? {
                    self.eval(a, frame)?
                } else {
                    self.eval(b, frame)?
                }
            }
        })
    }

    fn binary(&mut self, op: BinOp, x: Val, y: Val) -> EResult<Val> {
        let name = match op {
            BinOp::Add => "add",
            BinOp::Sub => "sub",
            BinOp::Mul => "mul",
            BinOp::Div => "div",
            BinOp::FloorDiv => "floordiv",
            BinOp::Mod => "remainder",
            BinOp::Pow => "pow",
            BinOp::BitAnd => "__and__",
            BinOp::BitOr => "__or__",
            BinOp::BitXor => "__xor__",
            BinOp::Shl => "__lshift__",
            BinOp::Shr => "__rshift__",
            BinOp::MatMul => "matmul",
            BinOp::Eq => "eq",
            BinOp::Ne => "ne",
            BinOp::Lt => "lt",
            BinOp::Le => "le",
            BinOp::Gt => "gt",
            BinOp::Ge => "ge",
            BinOp::Is => "__is__",
            BinOp::IsNot => "__isnot__",
            BinOp::In => "__contains__",
            BinOp::NotIn => {
                let v = builtins::call_torch("__contains__", &[y, x], &[], self.ops)?;
                return Ok(Val::Bool(!truth(&v)?));
            }
        };
        let args = if op == BinOp::In { [y, x] } else { [x, y] };
        self.torch(name, &args, &[])
    }

    /// `torch.<op>(args)` as the archive's code means it, its result's layout recorded.
    fn torch(&mut self, op: &str, args: &[Val], kwargs: &[(String, Val)]) -> EResult<Val> {
        let r = self.torch_call(op, args, kwargs)?;
        Ok(self.layouts.after(op, args, kwargs, r, self.ops)?)
    }

    /// `torch.<op>(args)` as the archive's code means it: through torch's upgrader where the
    /// code was written for an older meaning of the operator (`upgraders.rs`); `as_strided`
    /// over the memory torch holds its input in ([`Layouts::as_strided`]).
    fn torch_call(&self, op: &str, args: &[Val], kwargs: &[(String, Val)]) -> EResult<Val> {
        if op == "as_strided" {
            return Ok(self.layouts.as_strided(args, kwargs, self.ops)?);
        }
        Ok(
            match super::upgraders::upgrade(self.code.version, op, args, kwargs) {
                Some((args, kwargs)) => builtins::call_torch(op, &args, &kwargs, self.ops)?,
                None => builtins::call_torch(op, args, kwargs, self.ops)?,
            },
        )
    }

    fn attr(&mut self, b: Val, name: &str) -> EResult<Val> {
        Ok(match b {
            Val::Path(p) => {
                if &*p == "CONSTANTS" {
                    let i: usize = name
                        .strip_prefix('c')
                        .and_then(|n| n.parse().ok())
                        .ok_or_else(|| format!("unknown constant CONSTANTS.{name}"))?;
                    return self.constants.get(i).cloned().ok_or_else(|| {
                        format!("the archive has no constant CONSTANTS.{name}").into()
                    });
                }
                // A class constant or enum member (`__torch__.a.Format.NCHW`): its value.
                if let Some(e) = self.code.class_const(&p, name) {
                    let mut frame = Frame {
                        vars: HashMap::new(),
                        file: "".into(),
                    };
                    return self.eval(e, &mut frame);
                }
                Val::Path(format!("{p}.{name}").into())
            }
            Val::Object(o) => match o.get(name) {
                Some(v) => v,
                None => match self.code.class_const(&o.class, name) {
                    Some(e) => {
                        let mut frame = Frame {
                            vars: HashMap::new(),
                            file: "".into(),
                        };
                        self.eval(e, &mut frame)?
                    }
                    None => {
                        return Err(format!("{} object has no attribute '{name}'", o.class).into())
                    }
                },
            },
            Val::Tensor(t) => match name {
                "shape" => Val::list(t.dims().iter().map(|&d| Val::Int(d as i64)).collect()),
                "dtype" => Val::Int(super::value::dtype_to_c10(crate::dtype::of_runtime(
                    t.dtype(),
                ))),
                "device" => Val::Device,
                "is_cuda" | "requires_grad" | "is_quantized" => Val::Bool(false),
                "T" | "mT" => self.torch("numpy_T", &[Val::Tensor(t)], &[])?,
                _ => return Err(format!("tensor attribute '{name}' is not supported").into()),
            },
            other => {
                return Err(format!("a {} has no attribute '{name}'", other.type_name()).into())
            }
        })
    }

    fn call(
        &mut self,
        f: &Expr,
        args: &[Expr],
        kwargs: &[(String, Expr)],
        frame: &mut Frame,
    ) -> EResult<Val> {
        // Type-level helpers: the type argument is not evaluated.
        if let ExprKind::Name(n) = &f.kind {
            if !frame.vars.contains_key(n) {
                match n.as_str() {
                    "annotate" | "unchecked_cast" => {
                        let x = args.get(1).ok_or("annotate() takes a type and a value")?;
                        let v = self.eval(x, frame)?;
                        // Traced code reads a 0-d tensor as a Python number this way
                        // (`annotate(number, t)`).
                        let ty = args.first().and_then(super::parser::dotted);
                        return match (ty.as_deref(), v) {
                            (Some("number" | "int" | "float"), Val::Tensor(t)) => Ok(
                                builtins::call_torch("item", &[Val::Tensor(t)], &[], self.ops)?,
                            ),
                            (_, v) => Ok(v),
                        };
                    }
                    "uninitialized" => return Ok(Val::None),
                    "isinstance" => {
                        let [x, ty] = args else {
                            return Err("isinstance() takes a value and a type".into());
                        };
                        let v = self.eval(x, frame)?;
                        return Ok(Val::Bool(is_instance(&v, ty, 0)?));
                    }
                    _ => {}
                }
            }
        }
        let mut argv = Vec::with_capacity(args.len());
        for a in args {
            argv.push(self.eval(a, frame)?);
        }
        let mut kw = Vec::with_capacity(kwargs.len());
        for (k, a) in kwargs {
            kw.push((k.clone(), self.eval(a, frame)?));
        }
        // Method calls: `(obj).method(...)`.
        if let ExprKind::Attr(base, name) = &f.kind {
            let b = self.eval(base, frame)?;
            return match b {
                Val::Object(o) => {
                    if self.code.method(&o.class, name).is_some() {
                        self.call_method(&o, name, argv, kw)
                    } else {
                        match o.get(name) {
                            Some(Val::Path(p)) => self.call_path(&p, argv, kw, args, frame),
                            _ => Err(format!("{} has no method '{name}'", o.class).into()),
                        }
                    }
                }
                Val::Path(p) => {
                    let full = format!("{p}.{name}");
                    if &*p == "CONSTANTS" {
                        return Err("CONSTANTS are not callable".into());
                    }
                    self.call_path(&full, argv, kw, args, frame)
                }
                other => {
                    // A method of a value (`x.size(0)`, `"{}".format(x)`, `d.keys()`).
                    let mut all = vec![other];
                    all.extend(argv);
                    self.torch(name, &all, &kw)
                }
            };
        }
        match self.eval(f, frame)? {
            Val::Path(p) => self.call_path(&p, argv, kw, args, frame),
            other => Err(format!("a {} is not callable", other.type_name()).into()),
        }
    }

    /// `new`, the result of in-place op `op` on `part` (a part of another tensor), written
    /// back into the tensor it was cut from ([`view_writes::write_back`]); every variable of
    /// this call holding that tensor is bound to its new value, and every variable holding
    /// another part of it, made before the update, to that part cut again from the new value
    /// ([`view_writes::cut_again`]). Refused where no variable holds the tensor (an
    /// attribute, a list, a caller does): its update would be lost.
    fn write_back(
        &mut self,
        op: &str,
        part: &Tensor,
        new: &Tensor,
        frame: &mut Frame,
    ) -> EResult<()> {
        let (root, value) = view_writes::write_back(&mut self.parts, part, new.clone(), self.ops)
            .map_err(|e| format!("torch.{op} on part of another tensor: {e}"))?;
        self.layouts.inherit(root, &value);
        let mut held = false;
        for v in frame.vars.values_mut() {
            let Val::Tensor(t) = v else { continue };
            if t.id() == root {
                *v = Val::Tensor(value.clone());
                held = true;
            } else if let Some(again) =
                view_writes::cut_again(&mut self.parts, t, root, &value, self.ops)
            {
                let again = again.map_err(|e| format!("torch.{op} updates a tensor, but {e}"))?;
                *v = Val::Tensor(again);
            }
        }
        if held {
            Ok(())
        } else {
            Err(format!(
                "torch.{op} updates part of a tensor that no variable of this function holds \
                 (an attribute, a list item or a caller's): the update would be lost"
            )
            .into())
        }
    }

    fn call_path(
        &mut self,
        path: &str,
        args: Vec<Val>,
        kwargs: Vec<(String, Val)>,
        arg_exprs: &[Expr],
        frame: &mut Frame,
    ) -> EResult<Val> {
        if let Some(op) = path
            .strip_prefix("torch.")
            .or_else(|| path.strip_prefix("ops.aten."))
        {
            let inplace = builtins::is_inplace(op);
            // The part of another tensor this op updates in place, if any.
            let mut part = None;
            if let (true, Some(Val::Tensor(t))) = (inplace, args.first()) {
                if view_writes::writable(&self.parts, t)
                    .map_err(|why| format!("torch.{op} updates a tensor in place, but {why}"))?
                {
                    part = Some(t.clone());
                }
            }
            if let Some(r) = super::aten::packed_product(op, &args, &kwargs, self.linears)? {
                return Ok(self.layouts.after(op, &args, &kwargs, r, self.ops)?);
            }
            let mut r = self.torch_call(op, &args, &kwargs)?;
            if let (true, Some(Val::Tensor(t))) = (view_writes::cuts(op), args.first()) {
                if op == "slice" {
                    r = view_writes::distinct(t, r)?;
                }
            }
            r = self.layouts.after(op, &args, &kwargs, r, self.ops)?;
            if let (true, Some(Val::Tensor(t))) = (view_writes::cuts(op), args.first()) {
                view_writes::mark(&mut self.parts, t, op, &args[1..], !kwargs.is_empty(), &r);
            }
            if let (Some(part), Val::Tensor(new)) = (part, &r) {
                self.write_back(op, &part, new, frame)?;
            }
            // An in-place op: the name it mutated now holds the result.
            if inplace {
                if let (
                    Some(Expr {
                        kind: ExprKind::Name(n),
                        ..
                    }),
                    Val::Tensor(_),
                ) = (arg_exprs.first(), &r)
                {
                    if frame.vars.contains_key(n) {
                        frame.vars.insert(n.clone(), r.clone());
                    }
                }
            }
            return Ok(r);
        }
        if let Some(op) = path.strip_prefix("ops.prim.") {
            let r = builtins::call_prim(op, &args, &kwargs, self.ops)?;
            self.layouts.made(&args, &kwargs, &r);
            return Ok(r);
        }
        // Another library's operator (`ops.torchvision.nms`), by its schema.
        if let Some((ns, op)) = path.strip_prefix("ops.").and_then(|p| p.split_once('.')) {
            let r = self.ops.call(&format!("{ns}::{op}"), &args, &kwargs)?;
            self.layouts.made(&args, &kwargs, &r);
            return Ok(r);
        }
        if let Some(op) = path.strip_prefix("math.") {
            return Ok(super::scalars::call_math(op, &args)?);
        }
        if path.starts_with("__torch__.") {
            if let Some((f, file)) = self.code.function(path) {
                return self.call_func(&f, file, args, kwargs);
            }
            // A class's allocation (`C.__new__(C)`, then `__init__` on it): an object with no
            // attributes yet.
            if let Some(class) = path.strip_suffix(".__new__") {
                if self.code.is_class(class) {
                    return Ok(Val::Object(Rc::new(Obj {
                        class: class.into(),
                        attrs: Default::default(),
                    })));
                }
            }
            // A NamedTuple's constructor: its fields, positionally, as a tuple.
            if self.code.is_named_tuple(path) && kwargs.is_empty() {
                return Ok(Val::tuple(args));
            }
            return Err(format!("{path} is not a function the archive's code defines").into());
        }
        Ok(builtins::call_builtin(path, &args, &kwargs, self.ops)?)
    }
}

/// Whether `v` is of the type written `ty` (`Tensor`, `int`, `(list, tuple)`,
/// `List[Tensor]`, `Optional[int]`, a class of the code), as TorchScript's `isinstance`
/// decides it where a `Union` or `Optional` is narrowed. A list's items are checked against
/// its item type (an empty list is of every list type).
pub fn is_instance(v: &Val, ty: &Expr, depth: usize) -> EResult<bool> {
    if depth > 16 {
        return Err("isinstance() of a type nested too deeply".into());
    }
    let unknown = || -> EResult<bool> {
        let name = super::parser::dotted(ty).unwrap_or_else(|| "written so".into());
        Err(format!("isinstance() with the type {name} is not supported").into())
    };
    match &ty.kind {
        ExprKind::Tuple(alts) => {
            for t in alts {
                if is_instance(v, t, depth + 1)? {
                    return Ok(true);
                }
            }
            Ok(false)
        }
        ExprKind::Subscript(base, inner) => {
            let Some(name) = super::parser::dotted(base) else {
                return unknown();
            };
            let items: Vec<&Expr> = match &inner.kind {
                ExprKind::Tuple(ts) => ts.iter().collect(),
                _ => vec![&**inner],
            };
            match (name.as_str(), v, &items[..]) {
                ("List", Val::List(l), [item]) => {
                    for x in l.borrow().iter() {
                        if !is_instance(x, item, depth + 1)? {
                            return Ok(false);
                        }
                    }
                    Ok(true)
                }
                ("Tuple", Val::Tuple(xs), _) => {
                    if xs.len() != items.len() {
                        return Ok(false);
                    }
                    for (x, t) in xs.iter().zip(&items) {
                        if !is_instance(x, t, depth + 1)? {
                            return Ok(false);
                        }
                    }
                    Ok(true)
                }
                ("Dict", Val::Dict(_), [_, _]) => Ok(true),
                ("Optional", Val::None, [_]) => Ok(true),
                ("Optional" | "Union", _, _) => {
                    for t in &items {
                        if is_instance(v, t, depth + 1)? {
                            return Ok(true);
                        }
                    }
                    Ok(false)
                }
                ("List" | "Tuple" | "Dict", _, _) => Ok(false),
                _ => unknown(),
            }
        }
        _ => {
            let Some(name) = super::parser::dotted(ty) else {
                return unknown();
            };
            Ok(match name.as_str() {
                "Tensor" => matches!(v, Val::Tensor(_)),
                "int" => matches!(v, Val::Int(_)),
                "float" => matches!(v, Val::Float(_)),
                "bool" => matches!(v, Val::Bool(_)),
                "str" => matches!(v, Val::Str(_)),
                "list" | "List" => matches!(v, Val::List(_)),
                "tuple" | "Tuple" => matches!(v, Val::Tuple(_)),
                "dict" | "Dict" => matches!(v, Val::Dict(_)),
                "NoneType" | "None" => matches!(v, Val::None),
                "Device" => matches!(v, Val::Device),
                n if n.starts_with("__torch__.") => {
                    matches!(v, Val::Object(o) if &*o.class == n)
                }
                _ => return unknown(),
            })
        }
    }
}

/// Python truth of a condition; a tensor must hold one element (`bool(t)`).
pub fn truth(v: &Val) -> EResult<bool> {
    match v {
        Val::Tensor(t) => Ok(builtins::tensor_scalar(t)? != 0.0),
        other => other
            .truthy()
            .ok_or_else(|| format!("a {} used as a condition", other.type_name()).into()),
    }
}

/// A runtime tensor for an input (f64 as f64, other floats as f32, ints as i64, bool/u8 as
/// u8).
pub fn input_tensor(t: &Tensor) -> candle_core::Result<Tensor> {
    let t = t.to_device(&Device::Cpu)?;
    match t.dtype() {
        DType::F16 | DType::BF16 => t.to_dtype(DType::F32),
        DType::U32 | DType::I16 | DType::I32 => t.to_dtype(DType::I64),
        _ => Ok(t),
    }
}
