//! A recursive-descent parser for the Python subset `torch.jit.save` writes. Recursion is
//! bounded: blocks and expressions may nest at most [`MAX_DEPTH`] levels, and a file may hold
//! at most [`MAX_SOURCE`] bytes.

use std::sync::Arc;

use super::ast::*;
use super::lexer::{lex, Tok, Token};

/// Deepest nesting of expressions and blocks together.
pub const MAX_DEPTH: usize = 96;
/// Largest code record parsed.
pub const MAX_SOURCE: usize = 64 << 20;

/// Parse one code record.
pub fn parse(src: &[u8]) -> Result<CodeFile, SyntaxError> {
    if src.len() > MAX_SOURCE {
        return Err(SyntaxError {
            line: 1,
            what: format!(
                "the record is {} bytes, more than the {MAX_SOURCE} a code record may hold",
                src.len()
            ),
        });
    }
    let text = std::str::from_utf8(src).map_err(|e| SyntaxError {
        line: 1 + src[..e.valid_up_to()]
            .iter()
            .filter(|&&c| c == b'\n')
            .count() as u32,
        what: "the code is not valid UTF-8".into(),
    })?;
    let toks = lex(text)?;
    let mut p = Parser {
        toks,
        pos: 0,
        depth: 0,
    };
    p.file()
}

struct Parser {
    toks: Vec<Token>,
    pos: usize,
    depth: usize,
}

type PResult<T> = Result<T, SyntaxError>;

/// Positional and keyword arguments of a call.
type CallArgs = (Vec<Expr>, Vec<(String, Expr)>);

fn bin_op(op: &str) -> Option<(BinOp, u8)> {
    // Precedence: higher binds tighter.
    Some(match op {
        "|" => (BinOp::BitOr, 1),
        "^" => (BinOp::BitXor, 2),
        "&" => (BinOp::BitAnd, 3),
        "<<" => (BinOp::Shl, 4),
        ">>" => (BinOp::Shr, 4),
        "+" => (BinOp::Add, 5),
        "-" => (BinOp::Sub, 5),
        "*" => (BinOp::Mul, 6),
        "/" => (BinOp::Div, 6),
        "//" => (BinOp::FloorDiv, 6),
        "%" => (BinOp::Mod, 6),
        "@" => (BinOp::MatMul, 6),
        _ => return None,
    })
}

impl Parser {
    fn peek(&self) -> &Tok {
        &self.toks[self.pos.min(self.toks.len() - 1)].tok
    }

    fn peek_at(&self, k: usize) -> &Tok {
        &self.toks[(self.pos + k).min(self.toks.len() - 1)].tok
    }

    fn line(&self) -> u32 {
        self.toks[self.pos.min(self.toks.len() - 1)].line
    }

    fn next(&mut self) -> Tok {
        let t = self.peek().clone();
        if self.pos < self.toks.len() - 1 {
            self.pos += 1;
        }
        t
    }

    fn err<T>(&self, what: impl Into<String>) -> PResult<T> {
        Err(SyntaxError {
            line: self.line(),
            what: what.into(),
        })
    }

    fn describe(t: &Tok) -> String {
        match t {
            Tok::Name(n) => format!("'{n}'"),
            Tok::Int(v) => format!("number {v}"),
            Tok::Float(v) => format!("number {v}"),
            Tok::Str(_) => "a string".into(),
            Tok::Op(o) => format!("'{o}'"),
            Tok::Newline => "end of line".into(),
            Tok::Indent => "an indented block".into(),
            Tok::Dedent => "the end of a block".into(),
            Tok::Eof => "end of file".into(),
        }
    }

    fn is_op(&self, op: &str) -> bool {
        matches!(self.peek(), Tok::Op(o) if *o == op)
    }

    fn is_name(&self, n: &str) -> bool {
        matches!(self.peek(), Tok::Name(x) if x == n)
    }

    fn eat_op(&mut self, op: &str) -> bool {
        if self.is_op(op) {
            self.next();
            true
        } else {
            false
        }
    }

    fn expect_op(&mut self, op: &str) -> PResult<()> {
        if self.eat_op(op) {
            Ok(())
        } else {
            self.err(format!(
                "expected '{op}', found {}",
                Self::describe(self.peek())
            ))
        }
    }

    fn name(&mut self) -> PResult<String> {
        match self.next() {
            Tok::Name(n) => Ok(n),
            t => {
                self.pos = self.pos.saturating_sub(1);
                self.err(format!("expected a name, found {}", Self::describe(&t)))
            }
        }
    }

    fn enter(&mut self) -> PResult<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return self.err(format!(
                "code nested deeper than {MAX_DEPTH} levels (expressions and blocks)"
            ));
        }
        Ok(())
    }

    fn leave(&mut self) {
        self.depth -= 1;
    }

    fn file(&mut self) -> PResult<CodeFile> {
        let mut f = CodeFile::default();
        loop {
            match self.peek().clone() {
                Tok::Eof => return Ok(f),
                Tok::Newline => {
                    self.next();
                }
                Tok::Name(n) if n == "class" => f.classes.push(self.class()?),
                Tok::Name(n) if n == "def" => f.functions.push(Arc::new(self.func()?)),
                Tok::Name(n) if n == "import" || n == "from" => {
                    while !matches!(self.peek(), Tok::Newline | Tok::Eof) {
                        self.next();
                    }
                }
                Tok::Name(n) => {
                    self.next();
                    if self.eat_op("=") {
                        let e = self.expr()?;
                        f.globals.push((n, e));
                        self.end_line()?;
                    } else {
                        return self.err(format!("unexpected '{n}' at the top level"));
                    }
                }
                t => {
                    return self.err(format!(
                        "unexpected {} at the top level",
                        Self::describe(&t)
                    ))
                }
            }
        }
    }

    fn end_line(&mut self) -> PResult<()> {
        match self.peek() {
            Tok::Newline => {
                self.next();
                Ok(())
            }
            Tok::Eof | Tok::Dedent => Ok(()),
            t => self.err(format!("expected end of line, found {}", Self::describe(t))),
        }
    }

    fn class(&mut self) -> PResult<Class> {
        let line = self.line();
        self.next(); // class
        let name = self.name()?;
        let mut bases = Vec::new();
        if self.eat_op("(") {
            while !self.eat_op(")") {
                let e = self.expr()?;
                bases.push(dotted(&e).unwrap_or_default());
                if !self.eat_op(",") {
                    self.expect_op(")")?;
                    break;
                }
            }
        }
        self.expect_op(":")?;
        let mut c = Class {
            name,
            bases,
            consts: Vec::new(),
            methods: Vec::new(),
            line,
        };
        if !matches!(self.peek(), Tok::Newline) {
            // `class X(NamedTuple): pass` style one-liners.
            self.simple_stmt()?;
            return Ok(c);
        }
        self.next();
        if !matches!(self.peek(), Tok::Indent) {
            return self.err("expected an indented class body");
        }
        self.next();
        loop {
            match self.peek().clone() {
                Tok::Dedent => {
                    self.next();
                    break;
                }
                Tok::Eof => break,
                Tok::Newline => {
                    self.next();
                }
                Tok::Name(n) if n == "def" => c.methods.push(Arc::new(self.func()?)),
                Tok::Name(n) if n == "pass" => {
                    self.next();
                    self.end_line()?;
                }
                _ => {
                    // `name : Type [= value]`, `__annotations__["k"] = T`, `__parameters__ = [..]`.
                    let target = self.expr()?;
                    let mut value = None;
                    if self.eat_op(":") {
                        let _type = self.expr()?;
                    }
                    if self.eat_op("=") {
                        value = Some(self.expr()?);
                    }
                    self.end_line()?;
                    if let (ExprKind::Name(n), Some(v)) = (&target.kind, value) {
                        c.consts.push((n.clone(), v));
                    }
                }
            }
        }
        Ok(c)
    }

    fn func(&mut self) -> PResult<Func> {
        let line = self.line();
        self.next(); // def
        let name = self.name()?;
        self.expect_op("(")?;
        let mut params = Vec::new();
        while !self.eat_op(")") {
            if self.eat_op("*") {
                if !self.eat_op(",") {
                    self.expect_op(")")?;
                    break;
                }
                continue;
            }
            let pname = self.name()?;
            if self.eat_op(":") {
                let _type = self.expr()?;
            }
            let default = if self.eat_op("=") {
                Some(self.expr()?)
            } else {
                None
            };
            params.push(Param {
                name: pname,
                default,
            });
            if !self.eat_op(",") {
                self.expect_op(")")?;
                break;
            }
        }
        if self.eat_op("->") {
            let _ret = self.expr()?;
        }
        self.expect_op(":")?;
        let body = self.block()?;
        Ok(Func {
            name,
            params,
            body,
            line,
        })
    }

    /// `NEWLINE INDENT stmt+ DEDENT`, or a simple statement on the same line.
    fn block(&mut self) -> PResult<Vec<Stmt>> {
        self.enter()?;
        let r = self.block_inner();
        self.leave();
        r
    }

    fn block_inner(&mut self) -> PResult<Vec<Stmt>> {
        if !matches!(self.peek(), Tok::Newline) {
            return Ok(vec![self.simple_stmt()?]);
        }
        self.next();
        if !matches!(self.peek(), Tok::Indent) {
            return self.err("expected an indented block");
        }
        self.next();
        let mut out = Vec::new();
        loop {
            match self.peek() {
                Tok::Dedent => {
                    self.next();
                    return Ok(out);
                }
                Tok::Eof => return Ok(out),
                Tok::Newline => {
                    self.next();
                }
                _ => out.push(self.stmt()?),
            }
        }
    }

    fn stmt(&mut self) -> PResult<Stmt> {
        let line = self.line();
        let kw = match self.peek() {
            Tok::Name(n) => n.clone(),
            _ => String::new(),
        };
        let kind = match kw.as_str() {
            "if" => {
                self.next();
                return self.if_rest(line);
            }
            "for" => {
                self.next();
                let target = self.target_list()?;
                if !self.is_name("in") {
                    return self.err("expected 'in' in a for statement");
                }
                self.next();
                let iter = self.expr_list()?;
                self.expect_op(":")?;
                StmtKind::For(target, iter, self.block()?)
            }
            "while" => {
                self.next();
                let cond = self.expr()?;
                self.expect_op(":")?;
                StmtKind::While(cond, self.block()?)
            }
            "with" => {
                self.next();
                let manager = self.expr()?;
                if self.is_name("as") {
                    return self.err("'with ... as' is not part of TorchScript's serialized code");
                }
                self.expect_op(":")?;
                StmtKind::With(manager, self.block()?)
            }
            "def" | "class" => {
                return self.err(format!("nested '{kw}' is not supported"));
            }
            "try" | "lambda" | "yield" | "global" | "nonlocal" | "del" | "async" | "await" => {
                return self.err(format!(
                    "'{kw}' is not part of TorchScript's serialized code"
                ));
            }
            _ => return self.simple_stmt(),
        };
        Ok(Stmt { line, kind })
    }

    fn if_rest(&mut self, line: u32) -> PResult<Stmt> {
        let cond = self.expr()?;
        self.expect_op(":")?;
        let then = self.block()?;
        let els = if self.is_name("elif") {
            let l = self.line();
            self.next();
            self.enter()?;
            let s = self.if_rest(l);
            self.leave();
            vec![s?]
        } else if self.is_name("else") {
            self.next();
            self.expect_op(":")?;
            self.block()?
        } else {
            Vec::new()
        };
        Ok(Stmt {
            line,
            kind: StmtKind::If(cond, then, els),
        })
    }

    fn simple_stmt(&mut self) -> PResult<Stmt> {
        let line = self.line();
        let kw = match self.peek() {
            Tok::Name(n) => n.clone(),
            _ => String::new(),
        };
        let at_end = |p: &Self| matches!(p.peek_at(1), Tok::Newline | Tok::Eof | Tok::Dedent);
        let kind = match kw.as_str() {
            "pass" => {
                self.next();
                StmtKind::Pass
            }
            "break" => {
                self.next();
                StmtKind::Break
            }
            "continue" => {
                self.next();
                StmtKind::Continue
            }
            "return" => {
                let empty = at_end(self);
                self.next();
                StmtKind::Return(if empty { None } else { Some(self.expr_list()?) })
            }
            "raise" => {
                let empty = at_end(self);
                self.next();
                let e = if empty { None } else { Some(self.expr()?) };
                if self.is_name("from") {
                    self.next();
                    self.expr()?;
                }
                StmtKind::Raise(e)
            }
            "assert" => {
                self.next();
                let c = self.expr()?;
                let msg = if self.eat_op(",") {
                    Some(self.expr()?)
                } else {
                    None
                };
                StmtKind::Assert(c, msg)
            }
            _ => {
                let first = self.expr_list()?;
                if self.is_op(":") && matches!(first.kind, ExprKind::Name(_)) {
                    // `name : Type = value` (an annotated assignment).
                    self.next();
                    let _type = self.expr()?;
                    if !self.is_op("=") {
                        return self.err("an annotation without a value");
                    }
                }
                if self.is_op("=") {
                    let mut targets = vec![to_target(first)?];
                    let mut value;
                    loop {
                        self.expect_op("=")?;
                        value = self.expr_list()?;
                        if self.is_op("=") {
                            targets.push(to_target(value)?);
                        } else {
                            break;
                        }
                    }
                    StmtKind::Assign(targets, value)
                } else if let Some(op) = self.aug_op() {
                    self.next();
                    let value = self.expr()?;
                    StmtKind::AugAssign(to_target(first)?, op, value)
                } else {
                    StmtKind::Expr(first)
                }
            }
        };
        self.end_line()?;
        Ok(Stmt { line, kind })
    }

    fn aug_op(&self) -> Option<BinOp> {
        let Tok::Op(o) = self.peek() else { return None };
        Some(match *o {
            "+=" => BinOp::Add,
            "-=" => BinOp::Sub,
            "*=" => BinOp::Mul,
            "/=" => BinOp::Div,
            "//=" => BinOp::FloorDiv,
            "%=" => BinOp::Mod,
            "**=" => BinOp::Pow,
            _ => return None,
        })
    }

    /// `a, b, c` (a tuple when there is a comma) as one expression.
    fn expr_list(&mut self) -> PResult<Expr> {
        let line = self.line();
        let first = self.expr()?;
        if !self.is_op(",") {
            return Ok(first);
        }
        let mut items = vec![first];
        while self.eat_op(",") {
            if matches!(self.peek(), Tok::Newline | Tok::Eof | Tok::Dedent)
                || self.is_op("=")
                || self.is_op(":")
            {
                break;
            }
            items.push(self.expr()?);
        }
        Ok(Expr {
            line,
            kind: ExprKind::Tuple(items),
        })
    }

    /// The target list of a `for` (stops before `in`).
    fn target_list(&mut self) -> PResult<Target> {
        let mut items = Vec::new();
        loop {
            let e = self.binary(0)?;
            items.push(to_target(e)?);
            if !self.eat_op(",") || self.is_name("in") {
                break;
            }
        }
        if items.len() == 1 {
            Ok(items.pop().unwrap_or(Target::Tuple(Vec::new())))
        } else {
            Ok(Target::Tuple(items))
        }
    }

    fn expr(&mut self) -> PResult<Expr> {
        self.enter()?;
        let r = self.ternary();
        self.leave();
        r
    }

    fn ternary(&mut self) -> PResult<Expr> {
        let line = self.line();
        let a = self.or_expr()?;
        if self.is_name("if") {
            self.next();
            let c = self.or_expr()?;
            if !self.is_name("else") {
                return self.err("expected 'else' in a conditional expression");
            }
            self.next();
            let b = self.expr()?;
            return Ok(Expr {
                line,
                kind: ExprKind::IfExp(Box::new(c), Box::new(a), Box::new(b)),
            });
        }
        Ok(a)
    }

    fn or_expr(&mut self) -> PResult<Expr> {
        let mut a = self.and_expr()?;
        let mut chain = 0;
        while self.is_name("or") {
            let line = self.line();
            self.next();
            chain += 1;
            self.check_chain(chain)?;
            let b = self.and_expr()?;
            a = Expr {
                line,
                kind: ExprKind::Or(Box::new(a), Box::new(b)),
            };
        }
        Ok(a)
    }

    fn and_expr(&mut self) -> PResult<Expr> {
        let mut a = self.not_expr()?;
        let mut chain = 0;
        while self.is_name("and") {
            let line = self.line();
            self.next();
            chain += 1;
            self.check_chain(chain)?;
            let b = self.not_expr()?;
            a = Expr {
                line,
                kind: ExprKind::And(Box::new(a), Box::new(b)),
            };
        }
        Ok(a)
    }

    fn check_chain(&self, chain: usize) -> PResult<()> {
        if self.depth + chain > MAX_DEPTH {
            return self.err(format!(
                "an expression nested deeper than {MAX_DEPTH} levels"
            ));
        }
        Ok(())
    }

    fn not_expr(&mut self) -> PResult<Expr> {
        if self.is_name("not") {
            let line = self.line();
            self.next();
            self.enter()?;
            let e = self.not_expr();
            self.leave();
            return Ok(Expr {
                line,
                kind: ExprKind::Not(Box::new(e?)),
            });
        }
        self.comparison()
    }

    fn comparison(&mut self) -> PResult<Expr> {
        let a = self.binary(0)?;
        let line = self.line();
        let op = match self.peek() {
            Tok::Op("==") => BinOp::Eq,
            Tok::Op("!=") => BinOp::Ne,
            Tok::Op("<") => BinOp::Lt,
            Tok::Op("<=") => BinOp::Le,
            Tok::Op(">") => BinOp::Gt,
            Tok::Op(">=") => BinOp::Ge,
            Tok::Name(n) if n == "in" => BinOp::In,
            Tok::Name(n) if n == "is" => {
                if matches!(self.peek_at(1), Tok::Name(m) if m == "not") {
                    self.next();
                    BinOp::IsNot
                } else {
                    BinOp::Is
                }
            }
            Tok::Name(n) if n == "not" && matches!(self.peek_at(1), Tok::Name(m) if m == "in") => {
                self.next();
                BinOp::NotIn
            }
            _ => return Ok(a),
        };
        self.next();
        let b = self.binary(0)?;
        if matches!(self.peek(), Tok::Op("==" | "!=" | "<" | "<=" | ">" | ">=")) {
            return self.err("chained comparisons are not supported");
        }
        Ok(Expr {
            line,
            kind: ExprKind::Binary(op, Box::new(a), Box::new(b)),
        })
    }

    /// Binary operators by precedence climbing (all left-associative).
    fn binary(&mut self, min_prec: u8) -> PResult<Expr> {
        let mut a = self.unary()?;
        let mut chain = 0;
        while let Tok::Op(o) = self.peek() {
            let Some((op, prec)) = bin_op(o) else { break };
            if prec < min_prec {
                break;
            }
            let line = self.line();
            self.next();
            chain += 1;
            self.check_chain(chain)?;
            self.enter()?;
            let b = self.binary(prec + 1);
            self.leave();
            a = Expr {
                line,
                kind: ExprKind::Binary(op, Box::new(a), Box::new(b?)),
            };
        }
        Ok(a)
    }

    fn unary(&mut self) -> PResult<Expr> {
        let line = self.line();
        let make = |k: fn(Box<Expr>) -> ExprKind, p: &mut Self| -> PResult<Expr> {
            p.next();
            p.enter()?;
            let e = p.unary();
            p.leave();
            Ok(Expr {
                line,
                kind: k(Box::new(e?)),
            })
        };
        match self.peek() {
            Tok::Op("-") => {
                // Fold `-<number>` into a literal (so `-9223372036854775808` is an int).
                match self.peek_at(1).clone() {
                    Tok::Int(v) if !matches!(self.peek_at(2), Tok::Op("**" | "." | "[" | "(")) => {
                        self.next();
                        self.next();
                        Ok(Expr {
                            line,
                            kind: ExprKind::Int(v.wrapping_neg()),
                        })
                    }
                    Tok::Float(v)
                        if !matches!(self.peek_at(2), Tok::Op("**" | "." | "[" | "(")) =>
                    {
                        self.next();
                        self.next();
                        Ok(Expr {
                            line,
                            kind: ExprKind::Float(-v),
                        })
                    }
                    _ => make(ExprKind::Neg, self),
                }
            }
            Tok::Op("+") => {
                self.next();
                self.unary()
            }
            Tok::Op("~") => make(ExprKind::Invert, self),
            _ => self.power(),
        }
    }

    fn power(&mut self) -> PResult<Expr> {
        let a = self.postfix()?;
        if self.is_op("**") {
            let line = self.line();
            self.next();
            self.enter()?;
            let b = self.unary();
            self.leave();
            return Ok(Expr {
                line,
                kind: ExprKind::Binary(BinOp::Pow, Box::new(a), Box::new(b?)),
            });
        }
        Ok(a)
    }

    fn postfix(&mut self) -> PResult<Expr> {
        let mut e = self.atom()?;
        let mut chain = 0;
        loop {
            let line = self.line();
            if self.eat_op(".") {
                let n = self.name()?;
                e = Expr {
                    line,
                    kind: ExprKind::Attr(Box::new(e), n),
                };
            } else if self.is_op("(") {
                self.next();
                self.enter()?;
                let r = self.call_args();
                self.leave();
                let (args, kwargs) = r?;
                e = Expr {
                    line,
                    kind: ExprKind::Call(Box::new(e), args, kwargs),
                };
            } else if self.is_op("[") {
                self.next();
                self.enter()?;
                let r = self.subscript();
                self.leave();
                e = Expr {
                    line,
                    kind: ExprKind::Subscript(Box::new(e), Box::new(r?)),
                };
            } else {
                break;
            }
            chain += 1;
            self.check_chain(chain)?;
        }
        Ok(e)
    }

    fn call_args(&mut self) -> PResult<CallArgs> {
        let mut args = Vec::new();
        let mut kwargs = Vec::new();
        while !self.eat_op(")") {
            if let (Tok::Name(n), Tok::Op("=")) = (self.peek().clone(), self.peek_at(1)) {
                self.next();
                self.next();
                kwargs.push((n, self.expr()?));
            } else if kwargs.is_empty() {
                args.push(self.expr()?);
            } else {
                return self.err("a positional argument after keyword arguments");
            }
            if !self.eat_op(",") {
                self.expect_op(")")?;
                break;
            }
        }
        Ok((args, kwargs))
    }

    fn subscript(&mut self) -> PResult<Expr> {
        let line = self.line();
        let mut items = Vec::new();
        loop {
            items.push(self.slice_item()?);
            if !self.eat_op(",") || self.is_op("]") {
                break;
            }
        }
        self.expect_op("]")?;
        if items.len() == 1 {
            Ok(items.pop().unwrap_or(Expr {
                line,
                kind: ExprKind::None,
            }))
        } else {
            Ok(Expr {
                line,
                kind: ExprKind::Tuple(items),
            })
        }
    }

    fn slice_item(&mut self) -> PResult<Expr> {
        let line = self.line();
        let part = |p: &mut Self| -> PResult<Option<Box<Expr>>> {
            if p.is_op(":") || p.is_op("]") || p.is_op(",") {
                Ok(None)
            } else {
                Ok(Some(Box::new(p.expr()?)))
            }
        };
        let a = part(self)?;
        if !self.eat_op(":") {
            return a
                .map(|b| *b)
                .map_or_else(|| self.err("empty subscript"), Ok);
        }
        let b = part(self)?;
        let c = if self.eat_op(":") { part(self)? } else { None };
        Ok(Expr {
            line,
            kind: ExprKind::Slice(a, b, c),
        })
    }

    fn atom(&mut self) -> PResult<Expr> {
        let line = self.line();
        let kind = match self.next() {
            Tok::Int(v) => ExprKind::Int(v),
            Tok::Float(v) => ExprKind::Float(v),
            Tok::Str(s) => {
                let mut s = s;
                // Adjacent string literals concatenate.
                while let Tok::Str(more) = self.peek().clone() {
                    self.next();
                    s.push_str(&more);
                }
                ExprKind::Str(s)
            }
            Tok::Name(n) => match n.as_str() {
                "True" => ExprKind::Bool(true),
                "False" => ExprKind::Bool(false),
                "None" => ExprKind::None,
                "inf" => ExprKind::Float(f64::INFINITY),
                "nan" => ExprKind::Float(f64::NAN),
                "lambda" | "yield" | "await" => {
                    self.pos -= 1;
                    return self.err(format!(
                        "'{n}' is not part of TorchScript's serialized code"
                    ));
                }
                _ => ExprKind::Name(n),
            },
            Tok::Op("(") => {
                self.enter()?;
                let r = self.paren();
                self.leave();
                return r.map(|k| Expr { line, kind: k });
            }
            Tok::Op("[") => {
                self.enter()?;
                let r = self.items("]");
                self.leave();
                ExprKind::List(r?)
            }
            Tok::Op("{") => {
                self.enter()?;
                let r = self.dict();
                self.leave();
                ExprKind::Dict(r?)
            }
            t => {
                self.pos = self.pos.saturating_sub(1);
                return self.err(format!(
                    "expected an expression, found {}",
                    Self::describe(&t)
                ));
            }
        };
        Ok(Expr { line, kind })
    }

    fn paren(&mut self) -> PResult<ExprKind> {
        if self.eat_op(")") {
            return Ok(ExprKind::Tuple(Vec::new()));
        }
        let first = self.expr()?;
        if self.eat_op(")") {
            return Ok(first.kind);
        }
        self.expect_op(",")?;
        let mut items = vec![first];
        items.extend(self.items(")")?);
        Ok(ExprKind::Tuple(items))
    }

    fn items(&mut self, close: &str) -> PResult<Vec<Expr>> {
        let mut items = Vec::new();
        while !self.eat_op(close) {
            items.push(self.expr()?);
            if !self.eat_op(",") {
                self.expect_op(close)?;
                break;
            }
        }
        Ok(items)
    }

    fn dict(&mut self) -> PResult<Vec<(Expr, Expr)>> {
        let mut items = Vec::new();
        while !self.eat_op("}") {
            let k = self.expr()?;
            self.expect_op(":")?;
            let v = self.expr()?;
            items.push((k, v));
            if !self.eat_op(",") {
                self.expect_op("}")?;
                break;
            }
        }
        Ok(items)
    }
}

/// `a.b.c` as a dotted name.
pub fn dotted(e: &Expr) -> Option<String> {
    match &e.kind {
        ExprKind::Name(n) => Some(n.clone()),
        ExprKind::Attr(base, n) => Some(format!("{}.{n}", dotted(base)?)),
        _ => None,
    }
}

fn to_target(e: Expr) -> PResult<Target> {
    let line = e.line;
    Ok(match e.kind {
        ExprKind::Name(n) => Target::Name(n),
        ExprKind::Tuple(items) | ExprKind::List(items) => {
            Target::Tuple(items.into_iter().map(to_target).collect::<PResult<_>>()?)
        }
        ExprKind::Subscript(a, i) => Target::Subscript(*a, *i),
        ExprKind::Attr(a, n) => Target::Attr(*a, n),
        _ => {
            return Err(SyntaxError {
                line,
                what: "cannot assign to this expression".into(),
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_module() {
        let src = b"class L(Module):\n  __parameters__ = [\"weight\", ]\n  training : bool\n  n : Final[int] = 3\n  def forward(self: __torch__.L,\n    x: Tensor) -> Tensor:\n    a, b, = (self).f(x, )\n    if torch.eq(a, 0):\n      return x\n    else:\n      pass\n    for i in range(3):\n      x = torch.add(x, -1.5e-3, alpha=2)\n    return x[0:2, -1]\ndef g(x: int=2) -> int:\n  return x\n";
        let f = parse(src).unwrap();
        assert_eq!(f.classes.len(), 1);
        assert_eq!(f.classes[0].methods[0].params.len(), 2);
        assert_eq!(f.classes[0].consts.len(), 2);
        assert_eq!(f.functions[0].name, "g");
    }

    #[test]
    fn refuses_deep_nesting_and_huge_literals() {
        let deep = format!("x = {}1{}\n", "(".repeat(500), ")".repeat(500));
        let e = parse(deep.as_bytes()).unwrap_err();
        assert!(e.what.contains("nested deeper"), "{}", e.what);
        let chain = format!("x = 1{}\n", " + 1".repeat(500));
        assert!(parse(chain.as_bytes())
            .unwrap_err()
            .what
            .contains("nested deeper"));
        let big = b"x = 123456789012345678901234567890\n";
        let e = parse(big).unwrap_err();
        assert!(e.what.contains("does not fit"), "{}", e.what);
        assert_eq!(parse(b"def f(:\n").unwrap_err().line, 1);
    }
}
