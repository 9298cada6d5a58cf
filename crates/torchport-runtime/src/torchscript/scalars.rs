//! Python number semantics for TorchScript's scalar code: int/float/bool arithmetic and
//! comparisons (Python's floor division and modulo signs, i64 wrapping as TorchScript's ints),
//! list and string concatenation and comparison, and `math.*`.

use super::eval::MAX_LIST;
use super::value::{num, py_eq, Num, Val};

type BResult<T> = Result<T, String>;

fn arg<'a>(args: &'a [Val], i: usize, f: &str) -> BResult<&'a Val> {
    args.get(i)
        .ok_or_else(|| format!("{f}() is missing argument {}", i + 1))
}

/// Arithmetic and comparisons of ints, floats, bools, strings and lists.
pub fn scalar_op(name: &str, args: &[Val]) -> BResult<Option<Val>> {
    let base = name.strip_suffix('_').unwrap_or(name);
    let unary = |f: fn(f64) -> f64| -> BResult<Option<Val>> {
        let x = num(arg(args, 0, name)?).ok_or_else(|| format!("{name}() of a non-number"))?;
        Ok(Some(Val::Float(f(x.f()))))
    };
    match (base, args) {
        ("eq" | "ne", [a, b]) => {
            let eq = py_eq(a, b).ok_or_else(|| {
                format!(
                    "cannot compare a {} with a {}",
                    a.type_name(),
                    b.type_name()
                )
            })?;
            return Ok(Some(Val::Bool(eq == (base == "eq"))));
        }
        ("add", [Val::Str(a), Val::Str(b)]) => {
            return Ok(Some(Val::Str(format!("{a}{b}").into())));
        }
        ("add", [a @ (Val::List(_) | Val::Tuple(_)), b @ (Val::List(_) | Val::Tuple(_))]) => {
            let mut v = a.items().unwrap_or_default();
            v.extend(b.items().unwrap_or_default());
            if v.len() > MAX_LIST {
                return Err(format!("a list grew past {MAX_LIST} items"));
            }
            return Ok(Some(match a {
                Val::Tuple(_) => Val::tuple(v),
                _ => Val::list(v),
            }));
        }
        ("mul", [Val::List(l), Val::Int(n)]) => {
            let items = l.borrow().clone();
            let n = (*n).max(0) as usize;
            if items.len().saturating_mul(n) > MAX_LIST {
                return Err(format!("a list grew past {MAX_LIST} items"));
            }
            let mut v = Vec::with_capacity(items.len() * n);
            for _ in 0..n {
                v.extend(items.iter().cloned());
            }
            return Ok(Some(Val::list(v)));
        }
        ("lt" | "le" | "gt" | "ge", [Val::Str(a), Val::Str(b)]) => {
            let o = a.cmp(b);
            return Ok(Some(Val::Bool(match base {
                "lt" => o.is_lt(),
                "le" => o.is_le(),
                "gt" => o.is_gt(),
                _ => o.is_ge(),
            })));
        }
        ("min" | "max", [l]) if l.items().is_some() => {
            let items = l.items().unwrap_or_default();
            let mut best: Option<Val> = None;
            for x in items {
                best = Some(match best {
                    None => x,
                    Some(b) => {
                        let (p, q) = (
                            num(&b).ok_or("min/max of non-numbers")?,
                            num(&x).ok_or("min/max of non-numbers")?,
                        );
                        let take = if base == "min" {
                            q.f() < p.f()
                        } else {
                            q.f() > p.f()
                        };
                        if take {
                            x
                        } else {
                            b
                        }
                    }
                });
            }
            return best
                .map(Some)
                .ok_or_else(|| format!("{base}() of an empty list"));
        }
        ("sum", [l]) if l.items().is_some() => {
            let (mut i, mut f, mut float) = (0i64, 0f64, false);
            for x in l.items().unwrap_or_default() {
                match num(&x).ok_or("sum() of non-numbers")? {
                    Num::I(v) => i = i.wrapping_add(v),
                    Num::F(v) => {
                        f += v;
                        float = true;
                    }
                }
            }
            return Ok(Some(if float {
                Val::Float(f + i as f64)
            } else {
                Val::Int(i)
            }));
        }
        ("neg", [a]) => {
            return Ok(Some(match num(a).ok_or("neg() of a non-number")? {
                Num::I(i) => Val::Int(i.wrapping_neg()),
                Num::F(f) => Val::Float(-f),
            }))
        }
        ("abs", [a]) => {
            return Ok(Some(match num(a).ok_or("abs() of a non-number")? {
                Num::I(i) => Val::Int(i.wrapping_abs()),
                Num::F(f) => Val::Float(f.abs()),
            }))
        }
        ("floor" | "ceil", [a]) => {
            let f = num(a).ok_or("floor() of a non-number")?.f();
            let r = if base == "floor" { f.floor() } else { f.ceil() };
            return Ok(Some(Val::Int(r as i64)));
        }
        ("sqrt", [_]) => return unary(f64::sqrt),
        ("exp", [_]) => return unary(f64::exp),
        ("log", [_]) => return unary(f64::ln),
        ("sin", [_]) => return unary(f64::sin),
        ("cos", [_]) => return unary(f64::cos),
        ("tanh", [_]) => return unary(f64::tanh),
        _ => {}
    }
    let [a, b] = args else { return Ok(None) };
    let (Some(x), Some(y)) = (num(a), num(b)) else {
        return Ok(None);
    };
    let zero = || format!("ZeroDivisionError in {base}()");
    Ok(Some(match (base, x, y) {
        ("add", Num::I(p), Num::I(q)) => Val::Int(p.wrapping_add(q)),
        ("sub", Num::I(p), Num::I(q)) => Val::Int(p.wrapping_sub(q)),
        ("mul", Num::I(p), Num::I(q)) => Val::Int(p.wrapping_mul(q)),
        ("add", ..) => Val::Float(x.f() + y.f()),
        ("sub", ..) => Val::Float(x.f() - y.f()),
        ("mul", ..) => Val::Float(x.f() * y.f()),
        ("div" | "true_divide", ..) => {
            if y.f() == 0.0 {
                return Err(zero());
            }
            Val::Float(x.f() / y.f())
        }
        ("floordiv" | "floor_divide", Num::I(p), Num::I(q)) => {
            if q == 0 {
                return Err(zero());
            }
            Val::Int(p.wrapping_div(q) - i64::from((p % q != 0) && ((p < 0) != (q < 0))))
        }
        ("floordiv" | "floor_divide", ..) => {
            if y.f() == 0.0 {
                return Err(zero());
            }
            Val::Float((x.f() / y.f()).floor())
        }
        ("remainder" | "fmod" | "mod", Num::I(p), Num::I(q)) => {
            if q == 0 {
                return Err(zero());
            }
            let r = p.wrapping_rem(q);
            Val::Int(if base != "fmod" && r != 0 && ((r < 0) != (q < 0)) {
                r + q
            } else {
                r
            })
        }
        ("remainder" | "fmod" | "mod", ..) => {
            if y.f() == 0.0 {
                return Err(zero());
            }
            let r = x.f() % y.f();
            Val::Float(
                if base != "fmod" && r != 0.0 && ((r < 0.0) != (y.f() < 0.0)) {
                    r + y.f()
                } else {
                    r
                },
            )
        }
        ("pow", Num::I(p), Num::I(q)) if q >= 0 => {
            Val::Int(p.wrapping_pow(u32::try_from(q).unwrap_or(u32::MAX)))
        }
        ("pow", ..) => Val::Float(x.f().powf(y.f())),
        ("lt", ..) => Val::Bool(x.f() < y.f()),
        ("le", ..) => Val::Bool(x.f() <= y.f()),
        ("gt", ..) => Val::Bool(x.f() > y.f()),
        ("ge", ..) => Val::Bool(x.f() >= y.f()),
        ("min", Num::I(p), Num::I(q)) => Val::Int(p.min(q)),
        ("max", Num::I(p), Num::I(q)) => Val::Int(p.max(q)),
        ("min", ..) => Val::Float(x.f().min(y.f())),
        ("max", ..) => Val::Float(x.f().max(y.f())),
        _ => return Ok(None),
    }))
}

/// `math.<name>(args)`.
pub fn call_math(name: &str, args: &[Val]) -> BResult<Val> {
    let x = num(arg(args, 0, name)?).ok_or_else(|| format!("math.{name}() of a non-number"))?;
    Ok(match name {
        "sqrt" => Val::Float(x.f().sqrt()),
        "exp" => Val::Float(x.f().exp()),
        "log" => Val::Float(x.f().ln()),
        "floor" => Val::Int(x.f().floor() as i64),
        "ceil" => Val::Int(x.f().ceil() as i64),
        "fabs" => Val::Float(x.f().abs()),
        "isnan" => Val::Bool(x.f().is_nan()),
        "isinf" => Val::Bool(x.f().is_infinite()),
        "pow" => {
            let y = num(arg(args, 1, name)?).ok_or("math.pow() of a non-number")?;
            Val::Float(x.f().powf(y.f()))
        }
        _ => return Err(format!("math.{name} is not supported")),
    })
}
