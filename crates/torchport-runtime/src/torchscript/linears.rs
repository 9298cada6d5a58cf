//! Which of a TorchScript archive's tensors its code reads only as the weight of a Linear
//! (`torch.linear(x, weight, bias)`, the weight `[n, k]`; or `torch.addmm(bias, x, weight)`,
//! the weight `[k, n]`, as GPT-2's `Conv1D` is traced), so that the load can store them packed
//! for the gemm's microkernel ([`crate::ops::packed`]), as a `.pt2` load stores such weights,
//! instead of every call copying the weight into panels: that copy was 35% of a traced
//! BERT-base's run (BENCHMARKS.md, issue 14).
//!
//! Packed, a weight has another shape, so the analysis must be sure nothing else reads it. It
//! is by the code alone, conservative, and per class: an attribute `a` of class `C` qualifies
//! when every read of it in `C`'s methods is `self.a` (or a local bound once to `self.a`)
//! passed as the weight of one of the two, the same one each time, and no code anywhere
//! reads or assigns an attribute `a` of any other object, or names `a` in a string
//! (`getattr(m, "a")`). A tensor then qualifies when every reference to it in the module tree
//! is such an attribute (tied weights, tensors in lists or among the code's constants do
//! not).

use std::collections::{HashMap, HashSet};

use torchport::script::{ScriptObject, ScriptValue};

use super::ast::{Expr, ExprKind, Func, Stmt, StmtKind, Target};
use super::Code;
use crate::ops::packed::Source;

/// How the code reads attributes: per (class, attribute) read on `self`, the layout every
/// read takes it in as a product's weight (`None` once any read is not such, or another);
/// and the attribute names read or written some other way.
#[derive(Default)]
struct Reads {
    on_self: HashMap<(String, String), Option<Source>>,
    elsewhere: HashSet<String>,
}

impl Reads {
    fn on_self(&mut self, class: &str, attr: &str, as_weight: Option<Source>) {
        let seen = self
            .on_self
            .entry((class.to_string(), attr.to_string()))
            .or_insert(as_weight);
        if *seen != as_weight {
            *seen = None;
        }
    }
}

/// The tensors of `root`'s module tree that `code` reads only as a product's weight (see the
/// module's notes), by name, with the layout they are read in; `constants` are the code's
/// `CONSTANTS` (a tensor among them never qualifies).
pub(super) fn weights_read_only_by_linears(
    code: &Code,
    root: &ScriptObject,
    constants: &[ScriptValue],
) -> HashMap<String, Source> {
    let mut reads = Reads::default();
    for (module, (_, file)) in &code.files {
        for class in &file.classes {
            let qual = format!("{module}.{}", class.name);
            for m in &class.methods {
                method(&mut reads, Some(&qual), m);
            }
            // Constants (`Final` attributes), but not the lists of the class's parameter and
            // buffer names (`__parameters__ = ["weight", "bias", ]`).
            for (_, e) in class.consts.iter().filter(|(n, _)| !n.starts_with("__")) {
                expr(&mut reads, &Scope::none(), e);
            }
        }
        for f in &file.functions {
            method(&mut reads, None, f);
        }
        for (_, e) in &file.globals {
            expr(&mut reads, &Scope::none(), e);
        }
    }
    let qualifies = |class: &str, attr: &str| match reads.elsewhere.contains(attr) {
        true => None,
        false => *reads.on_self.get(&(class.to_string(), attr.to_string()))?,
    };
    let (mut weights, mut other) = (HashMap::new(), HashSet::new());
    tree(root, &qualifies, &mut weights, &mut other);
    for c in constants {
        value_tensors(c, &mut other);
    }
    weights.retain(|n, _| !other.contains(n));
    weights
}

/// A qualifying attribute's layout, by class and attribute name (see [`tree`]).
type Qualifies<'a> = dyn Fn(&str, &str) -> Option<Source> + 'a;

/// Sort the tensors of `obj`'s tree into `weights` (referenced as a qualifying attribute,
/// with its layout; a tensor referenced in two layouts goes to `other`) and `other`
/// (referenced any other way).
fn tree(
    obj: &ScriptObject,
    qualifies: &Qualifies,
    weights: &mut HashMap<String, Source>,
    other: &mut HashSet<String>,
) {
    for (attr, v) in &obj.attrs {
        match (v, qualifies(&obj.class, attr)) {
            (ScriptValue::Tensor(name), Some(source)) => {
                if *weights.entry(name.clone()).or_insert(source) != source {
                    other.insert(name.clone());
                }
            }
            (ScriptValue::Object(o), _) => tree(o, qualifies, weights, other),
            (v, _) => value_tensors_in(v, qualifies, weights, other),
        }
    }
}

/// The tensors of a value that is not itself a qualifying attribute: all `other`, except in
/// the objects it holds (sorted as [`tree`] sorts them).
fn value_tensors_in(
    v: &ScriptValue,
    qualifies: &Qualifies,
    weights: &mut HashMap<String, Source>,
    other: &mut HashSet<String>,
) {
    match v {
        ScriptValue::Tensor(name) => {
            other.insert(name.clone());
        }
        ScriptValue::List(items) | ScriptValue::Tuple(items) => {
            for x in items {
                value_tensors_in(x, qualifies, weights, other);
            }
        }
        ScriptValue::Dict(items) => {
            for (k, x) in items {
                value_tensors_in(k, qualifies, weights, other);
                value_tensors_in(x, qualifies, weights, other);
            }
        }
        ScriptValue::Object(o) => tree(o, qualifies, weights, other),
        _ => {}
    }
}

/// Every tensor a value holds, at any depth, into `out` (no attribute qualifies there).
fn value_tensors(v: &ScriptValue, out: &mut HashSet<String>) {
    value_tensors_in(v, &|_: &str, _: &str| None, &mut HashMap::new(), out);
}

/// What names mean inside one function: its class (for `self`, where `self` is never
/// assigned), and the locals bound once to `self.<attr>`.
struct Scope<'a> {
    class: Option<&'a str>,
    aliases: HashMap<&'a str, &'a str>,
}

impl Scope<'_> {
    fn none() -> Scope<'static> {
        Scope {
            class: None,
            aliases: HashMap::new(),
        }
    }
}

/// The attribute `e` reads from `self` (`self.a`), if it is one.
fn self_attr(e: &Expr) -> Option<&str> {
    match &e.kind {
        ExprKind::Attr(base, a) if matches!(&base.kind, ExprKind::Name(n) if n == "self") => {
            Some(a)
        }
        _ => None,
    }
}

fn method(reads: &mut Reads, class: Option<&str>, f: &Func) {
    // How often each local name is assigned (parameters once each).
    let mut assigned: HashMap<&str, usize> = HashMap::new();
    for p in &f.params {
        *assigned.entry(p.name.as_str()).or_default() += 1;
    }
    count_assignments(&f.body, &mut assigned);
    // `self` stands for the class's instance only where it is the first parameter and never
    // assigned; else every read through it counts as another object's.
    let is_method = f.params.first().is_some_and(|p| p.name == "self");
    let class = class.filter(|_| is_method && assigned.get("self") == Some(&1));
    let mut aliases = HashMap::new();
    if class.is_some() {
        alias_assignments(&f.body, &assigned, &mut aliases);
    }
    let scope = Scope { class, aliases };
    stmts(reads, &scope, &f.body);
}

fn count_assignments<'a>(body: &'a [Stmt], out: &mut HashMap<&'a str, usize>) {
    fn target<'a>(t: &'a Target, out: &mut HashMap<&'a str, usize>) {
        match t {
            Target::Name(n) => *out.entry(n.as_str()).or_default() += 1,
            Target::Tuple(ts) => ts.iter().for_each(|t| target(t, out)),
            Target::Subscript(..) | Target::Attr(..) => {}
        }
    }
    for s in body {
        match &s.kind {
            StmtKind::Assign(ts, _) => ts.iter().for_each(|t| target(t, out)),
            StmtKind::AugAssign(t, ..) => target(t, out),
            StmtKind::For(t, _, b) => {
                target(t, out);
                count_assignments(b, out);
            }
            StmtKind::If(_, a, b) => {
                count_assignments(a, out);
                count_assignments(b, out);
            }
            StmtKind::While(_, b) | StmtKind::With(_, b) => count_assignments(b, out),
            _ => {}
        }
    }
}

/// Locals assigned exactly once, by `name = self.attr`.
fn alias_assignments<'a>(
    body: &'a [Stmt],
    assigned: &HashMap<&str, usize>,
    out: &mut HashMap<&'a str, &'a str>,
) {
    for s in body {
        match &s.kind {
            StmtKind::Assign(ts, e) => {
                if let ([Target::Name(n)], Some(a)) = (&ts[..], self_attr(e)) {
                    if assigned.get(n.as_str()) == Some(&1) {
                        out.insert(n, a);
                    }
                }
            }
            StmtKind::For(_, _, b) | StmtKind::While(_, b) | StmtKind::With(_, b) => {
                alias_assignments(b, assigned, out)
            }
            StmtKind::If(_, a, b) => {
                alias_assignments(a, assigned, out);
                alias_assignments(b, assigned, out);
            }
            _ => {}
        }
    }
}

fn stmts(reads: &mut Reads, scope: &Scope, body: &[Stmt]) {
    for s in body {
        match &s.kind {
            StmtKind::Assign(ts, e) => {
                ts.iter().for_each(|t| target(reads, scope, t));
                // `name = self.a` binding an alias is not itself a read.
                let binds =
                    matches!(&ts[..], [Target::Name(n)] if scope.aliases.contains_key(n.as_str()));
                if !binds {
                    expr(reads, scope, e);
                }
            }
            StmtKind::AugAssign(t, _, e) => {
                target(reads, scope, t);
                expr(reads, scope, e);
            }
            StmtKind::Expr(e) | StmtKind::Return(Some(e)) | StmtKind::Raise(Some(e)) => {
                expr(reads, scope, e)
            }
            StmtKind::If(c, a, b) => {
                expr(reads, scope, c);
                stmts(reads, scope, a);
                stmts(reads, scope, b);
            }
            StmtKind::For(t, e, b) => {
                target(reads, scope, t);
                expr(reads, scope, e);
                stmts(reads, scope, b);
            }
            StmtKind::While(c, b) | StmtKind::With(c, b) => {
                expr(reads, scope, c);
                stmts(reads, scope, b);
            }
            StmtKind::Assert(c, m) => {
                expr(reads, scope, c);
                if let Some(m) = m {
                    expr(reads, scope, m);
                }
            }
            _ => {}
        }
    }
}

fn target(reads: &mut Reads, scope: &Scope, t: &Target) {
    match t {
        Target::Name(_) => {}
        Target::Tuple(ts) => ts.iter().for_each(|t| target(reads, scope, t)),
        Target::Subscript(a, b) => {
            expr(reads, scope, a);
            expr(reads, scope, b);
        }
        // Any attribute assigned, on any object: never a packed weight.
        Target::Attr(a, name) => {
            reads.elsewhere.insert(name.clone());
            expr(reads, scope, a);
        }
    }
}

/// Where a call to `f` takes a product's weight, if `f` is `torch.linear` or `torch.addmm`:
/// the argument's position and keyword, and its layout.
fn weight_argument(f: &Expr) -> Option<(usize, &'static str, Source)> {
    match super::parser::dotted(f)?.as_str() {
        "torch.linear" | "ops.aten.linear" => Some((1, "weight", Source::Rows)),
        "torch.addmm" | "ops.aten.addmm" => Some((2, "mat2", Source::Columns)),
        _ => None,
    }
}

/// Record a read of `e` as a product's weight (`as_weight`, its layout) or as anything else.
fn read(reads: &mut Reads, scope: &Scope, e: &Expr, as_weight: Option<Source>) {
    if let Some(class) = scope.class {
        if let Some(a) = self_attr(e) {
            reads.on_self(class, a, as_weight);
            return;
        }
        if let ExprKind::Name(n) = &e.kind {
            if let Some(a) = scope.aliases.get(n.as_str()) {
                reads.on_self(class, a, as_weight);
                return;
            }
        }
    }
    expr(reads, scope, e);
}

fn expr(reads: &mut Reads, scope: &Scope, e: &Expr) {
    match &e.kind {
        ExprKind::Name(n) => {
            if let (Some(class), Some(a)) = (scope.class, scope.aliases.get(n.as_str())) {
                reads.on_self(class, a, None);
            }
        }
        ExprKind::Str(s) => {
            reads.elsewhere.insert(s.clone());
        }
        ExprKind::Attr(base, a) => match (scope.class, &base.kind) {
            (Some(class), ExprKind::Name(n)) if n == "self" => reads.on_self(class, a, None),
            _ => {
                reads.elsewhere.insert(a.clone());
                expr(reads, scope, base);
            }
        },
        ExprKind::Call(f, args, kw) => {
            let weight = weight_argument(f);
            // A method call (`x.size()`) reads attribute `size` of `x`: as any attribute.
            expr(reads, scope, f);
            let at = |i: usize, k: &str| {
                weight.and_then(|(at, key, source)| (i == at || k == key).then_some(source))
            };
            for (i, a) in args.iter().enumerate() {
                read(reads, scope, a, at(i, ""));
            }
            for (k, a) in kw {
                read(reads, scope, a, at(usize::MAX, k));
            }
        }
        ExprKind::Subscript(a, b)
        | ExprKind::Binary(_, a, b)
        | ExprKind::And(a, b)
        | ExprKind::Or(a, b) => {
            expr(reads, scope, a);
            expr(reads, scope, b);
        }
        ExprKind::Slice(a, b, c) => {
            for x in [a, b, c].into_iter().flatten() {
                expr(reads, scope, x);
            }
        }
        ExprKind::List(items) | ExprKind::Tuple(items) => {
            items.iter().for_each(|x| expr(reads, scope, x))
        }
        ExprKind::Dict(items) => {
            for (k, v) in items {
                expr(reads, scope, k);
                expr(reads, scope, v);
            }
        }
        ExprKind::Neg(a) | ExprKind::Invert(a) | ExprKind::Not(a) => expr(reads, scope, a),
        ExprKind::IfExp(a, b, c) => {
            expr(reads, scope, a);
            expr(reads, scope, b);
            expr(reads, scope, c);
        }
        ExprKind::Int(_) | ExprKind::Float(_) | ExprKind::Bool(_) | ExprKind::None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Linear as `torch.jit.trace` writes it, and a module holding it as `fc`.
    const LINEAR: &str = "class L(Module):
  __parameters__ = [\"weight\", \"bias\", ]
  weight : Tensor
  bias : Tensor
  def forward(self: __torch__.m.L, x: Tensor) -> Tensor:
    bias = self.bias
    weight = self.weight
    return torch.linear(x, weight, bias)
class Root(Module):
  def forward(self: __torch__.m.Root, x: Tensor) -> Tensor:
    return (self.fc).forward(x, )
";

    fn packed(src: &str, root: &[(&str, &str, &str)], constants: &[&str]) -> Vec<String> {
        let code = Code::parse(
            &[("code/__torch__/m.py".into(), src.as_bytes().to_vec())],
            std::path::Path::new("t.pt"),
        )
        .unwrap();
        // Each (attribute of the root, its class, the tensor its `weight` names).
        let attrs = root
            .iter()
            .map(|&(attr, class, tensor)| {
                let obj = ScriptObject {
                    class: format!("__torch__.m.{class}"),
                    attrs: vec![
                        ("weight".into(), ScriptValue::Tensor(tensor.into())),
                        ("bias".into(), ScriptValue::Tensor(format!("{tensor}.b"))),
                    ],
                };
                (attr.to_string(), ScriptValue::Object(Box::new(obj)))
            })
            .collect();
        let root = ScriptObject {
            class: "__torch__.m.Root".into(),
            attrs,
        };
        let constants: Vec<ScriptValue> = constants
            .iter()
            .map(|c| ScriptValue::Tensor(c.to_string()))
            .collect();
        let mut names: Vec<String> = weights_read_only_by_linears(&code, &root, &constants)
            .into_iter()
            .map(|(name, source)| format!("{name} {source:?}"))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_weight_read_only_by_linears_is_packed() {
        assert_eq!(packed(LINEAR, &[("fc", "L", "w")], &[]), ["w Rows"]);
        // As a keyword argument, read directly.
        let kw = LINEAR.replace(
            "return torch.linear(x, weight, bias)",
            "return torch.linear(x, weight=self.weight, bias=bias)",
        );
        assert_eq!(packed(&kw, &[("fc", "L", "w")], &[]), ["w Rows"]);
        // Another class's `weight`, read otherwise, does not matter to this one's.
        let emb = format!(
            "{LINEAR}class E(Module):
  def forward(self: __torch__.m.E, i: Tensor) -> Tensor:
    return torch.embedding(self.weight, i)
"
        );
        assert_eq!(
            packed(&emb, &[("fc", "L", "w"), ("e", "E", "e")], &[]),
            ["w Rows"]
        );
        // ... unless it is the same tensor (tied weights).
        assert!(packed(&emb, &[("fc", "L", "w"), ("e", "E", "w")], &[]).is_empty());
        // `addmm`'s `[k, n]` weight, as GPT-2's `Conv1D` is traced.
        let conv1d = format!(
            "{LINEAR}class C(Module):
  def forward(self: __torch__.m.C, x: Tensor) -> Tensor:
    weight = self.weight
    return torch.addmm(self.bias, x, weight)
"
        );
        assert_eq!(
            packed(&conv1d, &[("fc", "L", "w"), ("c", "C", "c")], &[]),
            ["c Columns", "w Rows"]
        );
        // One tensor read in both layouts.
        assert!(packed(&conv1d, &[("fc", "L", "w"), ("c", "C", "w")], &[]).is_empty());
    }

    #[test]
    fn any_other_read_keeps_a_weight_as_stored() {
        let cases = [
            // Read otherwise in the same class.
            (
                "return torch.linear(x, weight, bias)",
                "return torch.linear(torch.t(self.weight), weight, bias)",
            ),
            // Its alias read otherwise.
            (
                "return torch.linear(x, weight, bias)",
                "return torch.add(torch.linear(x, weight, bias), weight)",
            ),
            // Its name assigned again (the Linear then reads something else).
            (
                "weight = self.weight\n",
                "weight = self.weight\n    weight = x\n",
            ),
            // As a Linear's input.
            (
                "return torch.linear(x, weight, bias)",
                "return torch.linear(weight, weight, bias)",
            ),
            // Assigned.
            (
                "bias = self.bias\n",
                "self.weight = x\n    bias = self.bias\n",
            ),
        ];
        for (from, to) in cases {
            let src = LINEAR.replace(from, to);
            assert_ne!(src, LINEAR);
            assert!(packed(&src, &[("fc", "L", "w")], &[]).is_empty(), "{to}");
        }
        // Read through another object, or named in a string, anywhere.
        for line in [
            "return (self.fc).weight",
            "return getattr(self.fc, \"weight\")",
        ] {
            let src = LINEAR.replace("return (self.fc).forward(x, )", line);
            assert!(packed(&src, &[("fc", "L", "w")], &[]).is_empty(), "{line}");
        }
        // Among the code's constants.
        assert!(packed(LINEAR, &[("fc", "L", "w")], &["w"]).is_empty());
    }
}
