//! The syntax tree of one code record: classes, functions, statements, expressions.

use std::sync::Arc;

/// A parse error: the line and what is wrong.
#[derive(Debug, Clone)]
pub struct SyntaxError {
    /// 1-based line.
    pub line: u32,
    /// What is wrong.
    pub what: String,
}

/// One parsed code record (`code/__torch__/….py`).
#[derive(Debug, Default)]
pub struct CodeFile {
    /// Its classes.
    pub classes: Vec<Class>,
    /// Its free functions.
    pub functions: Vec<Arc<Func>>,
    /// Top-level assignments (e.g. `op_version_set = 8`), by name.
    pub globals: Vec<(String, Expr)>,
}

/// A class.
#[derive(Debug)]
pub struct Class {
    /// Its name (the last component of its qualified name).
    pub name: String,
    /// Its bases as written (`Module`, `NamedTuple`, …).
    pub bases: Vec<String>,
    /// Class-level constants (`out_features : Final[int] = 8`).
    pub consts: Vec<(String, Expr)>,
    /// Methods.
    pub methods: Vec<Arc<Func>>,
    /// Line of `class`.
    pub line: u32,
}

/// A function or method.
#[derive(Debug)]
pub struct Func {
    /// Its name.
    pub name: String,
    /// Parameters (a method's first is `self`).
    pub params: Vec<Param>,
    /// Body.
    pub body: Vec<Stmt>,
    /// Line of `def`.
    pub line: u32,
}

/// A parameter.
#[derive(Debug)]
pub struct Param {
    /// Name.
    pub name: String,
    /// Default value, if any.
    pub default: Option<Expr>,
}

/// A statement with its line.
#[derive(Debug)]
pub struct Stmt {
    /// 1-based line.
    pub line: u32,
    /// The statement.
    pub kind: StmtKind,
}

/// Statement kinds.
#[derive(Debug)]
pub enum StmtKind {
    /// `a = b = value` (one or more targets).
    Assign(Vec<Target>, Expr),
    /// `a += value` (the operator without `=`).
    AugAssign(Target, BinOp, Expr),
    /// An expression evaluated for its effect.
    Expr(Expr),
    /// `if` / `elif` / `else`.
    If(Expr, Vec<Stmt>, Vec<Stmt>),
    /// `for target in iter:`.
    For(Target, Expr, Vec<Stmt>),
    /// `while cond:`.
    While(Expr, Vec<Stmt>),
    /// `with manager:` (TorchScript writes the manager as a name bound before, no `as`).
    With(Expr, Vec<Stmt>),
    /// `return` / `return value`.
    Return(Option<Expr>),
    /// `raise` / `raise value`.
    Raise(Option<Expr>),
    /// `assert cond, msg`.
    Assert(Expr, Option<Expr>),
    /// `pass`.
    Pass,
    /// `break`.
    Break,
    /// `continue`.
    Continue,
}

/// An assignment target.
#[derive(Debug)]
pub enum Target {
    /// A name.
    Name(String),
    /// `a, b` (unpacking).
    Tuple(Vec<Target>),
    /// `x[i]`.
    Subscript(Expr, Expr),
    /// `x.attr`.
    Attr(Expr, String),
}

/// An expression with its line.
#[derive(Debug)]
pub struct Expr {
    /// 1-based line.
    pub line: u32,
    /// The expression.
    pub kind: ExprKind,
}

/// Binary operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/`
    Div,
    /// `//`
    FloorDiv,
    /// `%`
    Mod,
    /// `**`
    Pow,
    /// `&`
    BitAnd,
    /// `|`
    BitOr,
    /// `^`
    BitXor,
    /// `<<`
    Shl,
    /// `>>`
    Shr,
    /// `@`
    MatMul,
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `is`
    Is,
    /// `is not`
    IsNot,
    /// `in`
    In,
    /// `not in`
    NotIn,
}

/// Expression kinds.
#[derive(Debug)]
pub enum ExprKind {
    /// A name.
    Name(String),
    /// An int literal.
    Int(i64),
    /// A float literal.
    Float(f64),
    /// A string literal.
    Str(String),
    /// `True` / `False`.
    Bool(bool),
    /// `None`.
    None,
    /// `value.attr`.
    Attr(Box<Expr>, String),
    /// `f(args, name=value)`.
    Call(Box<Expr>, Vec<Expr>, Vec<(String, Expr)>),
    /// `value[index]`.
    Subscript(Box<Expr>, Box<Expr>),
    /// `a:b:c` inside a subscript.
    Slice(Option<Box<Expr>>, Option<Box<Expr>>, Option<Box<Expr>>),
    /// `[a, b]`.
    List(Vec<Expr>),
    /// `(a, b)`.
    Tuple(Vec<Expr>),
    /// `{k: v}`.
    Dict(Vec<(Expr, Expr)>),
    /// `-x`.
    Neg(Box<Expr>),
    /// `~x`.
    Invert(Box<Expr>),
    /// `not x`.
    Not(Box<Expr>),
    /// `a op b`.
    Binary(BinOp, Box<Expr>, Box<Expr>),
    /// `a and b`.
    And(Box<Expr>, Box<Expr>),
    /// `a or b`.
    Or(Box<Expr>, Box<Expr>),
    /// `a if cond else b`.
    IfExp(Box<Expr>, Box<Expr>, Box<Expr>),
}
