//! Symbolic-shape arithmetic: the Python operators (`_operator.mul`, `_operator.floordiv`,
//! `_operator.eq`, …), `math.trunc` and torch's `sym_*` functions that exports with dynamic
//! dimensions compute sizes with. Their inputs are positional ints, floats and bools (or
//! names of earlier such results); each follows Python's semantics: ints stay exact (an
//! overflow is an error, Python's ints being unbounded), `//` and `%` floor as Python does,
//! `/` gives a float. Also the checks export records on such values (`_assert_scalar`,
//! `_assert_async`, `sym_constrain_range[_for_size]`), enforced at run time.

use crate::error::{OpError, OpResult};
use crate::ops::Registry;
use crate::value::{Args, Outputs, Scalar, Value};

/// Register the symbolic operators.
pub fn register(r: &mut Registry) {
    r.add("_operator.add", |a| arith(a, Op::Add));
    r.add("_operator.sub", |a| arith(a, Op::Sub));
    r.add("_operator.mul", |a| arith(a, Op::Mul));
    r.add("_operator.floordiv", |a| arith(a, Op::FloorDiv));
    r.add("_operator.mod", |a| arith(a, Op::Mod));
    r.add("_operator.pow", |a| arith(a, Op::Pow));
    r.add("_operator.truediv", |a| {
        let (x, y) = (a.scalar_at(0)?.as_f64(), a.scalar_at(1)?.as_f64());
        if y == 0.0 {
            return Err(OpError("division by zero".into()));
        }
        out(Scalar::Float(x / y))
    });
    r.add("_operator.lshift", |a| shift(a, true));
    r.add("_operator.rshift", |a| shift(a, false));
    r.add("_operator.and_", |a| logic(a, true));
    r.add("_operator.or_", |a| logic(a, false));
    r.add("_operator.eq", |a| compare(a, |o| o.is_eq()));
    r.add("_operator.ne", |a| compare(a, |o| o.is_ne()));
    r.add("_operator.lt", |a| compare(a, |o| o.is_lt()));
    r.add("_operator.le", |a| compare(a, |o| o.is_le()));
    r.add("_operator.gt", |a| compare(a, |o| o.is_gt()));
    r.add("_operator.ge", |a| compare(a, |o| o.is_ge()));
    r.add("_operator.neg", |a| {
        out(match a.scalar_at(0)? {
            Scalar::Float(v) => Scalar::Float(-v),
            s => Scalar::Int(int(s)?.checked_neg().ok_or_else(overflow)?),
        })
    });
    r.add("_operator.pos", |a| {
        out(match a.scalar_at(0)? {
            Scalar::Bool(b) => Scalar::Int(i64::from(b)),
            s => s,
        })
    });
    r.add("math.trunc", |a| out(Scalar::Int(to_int(a.scalar_at(0)?)?)));
    r.add("torch.sym_int", |a| {
        out(Scalar::Int(to_int(a.scalar_at(0)?)?))
    });
    r.add("torch.sym_float", |a| {
        out(Scalar::Float(a.scalar_at(0)?.as_f64()))
    });
    r.add("torch.sym_not", |a| {
        out(Scalar::Bool(a.scalar_at(0)?.as_f64() == 0.0))
    });
    r.add("torch._sym_sqrt", |a| {
        out(Scalar::Float(a.scalar_at(0)?.as_f64().sqrt()))
    });
    r.add("torch.sym_ite", |a| {
        let pick = a.scalar_at(0)?.as_f64() != 0.0;
        out(a.scalar_at(if pick { 1 } else { 2 })?)
    });
    // Checks export records on data-dependent sizes: enforced, a failure is an error.
    r.add("aten._assert_scalar.default", |a| {
        if a.scalar("self")?.as_f64() == 0.0 {
            return Err(OpError(format!(
                "assertion failed: {}",
                a.str_or("assert_msg", "")?
            )));
        }
        Ok(vec![])
    });
    r.add("aten._assert_async.msg", |a| {
        let t = a.tensor("self")?;
        let v = t
            .flatten_all()?
            .to_dtype(candle_core::DType::F64)?
            .to_vec1::<f64>()?;
        if v.len() != 1 || v[0] == 0.0 {
            return Err(OpError(format!(
                "assertion failed: {}",
                a.str_or("assert_msg", "")?
            )));
        }
        Ok(vec![])
    });
    for name in [
        "aten.sym_constrain_range.default",
        "aten.sym_constrain_range_for_size.default",
    ] {
        r.add(name, |a| {
            let v = a.scalar("size")?.as_f64();
            let (lo, hi) = (a.opt_int("min")?, a.opt_int("max")?);
            if lo.is_some_and(|m| v < m as f64) || hi.is_some_and(|m| v > m as f64) {
                return Err(OpError(format!(
                    "value {v} is outside the range [{}, {}] the program was exported for",
                    lo.map_or("-inf".into(), |m| m.to_string()),
                    hi.map_or("inf".into(), |m| m.to_string())
                )));
            }
            Ok(vec![])
        });
    }
    r.add("torch.sym_max", |a| extreme(a, true));
    r.add("torch.sym_min", |a| extreme(a, false));
}

#[derive(Clone, Copy)]
enum Op {
    Add,
    Sub,
    Mul,
    FloorDiv,
    Mod,
    Pow,
}

fn out(s: Scalar) -> OpResult<Outputs> {
    Ok(vec![match s {
        Scalar::Int(v) => Value::Int(v),
        Scalar::Float(v) => Value::Float(v),
        Scalar::Bool(v) => Value::Bool(v),
    }])
}

fn overflow() -> OpError {
    OpError("integer overflow in a symbolic size computation".into())
}

/// An int operand (a bool counts as 0 or 1, as in Python).
fn int(s: Scalar) -> OpResult<i64> {
    match s {
        Scalar::Int(v) => Ok(v),
        Scalar::Bool(b) => Ok(i64::from(b)),
        Scalar::Float(v) => Err(OpError(format!("expected an int, found the float {v}"))),
    }
}

/// Python's `int(x)`: floats truncate toward zero.
fn to_int(s: Scalar) -> OpResult<i64> {
    match s {
        Scalar::Float(v) if v.is_finite() && v.abs() < 9.2e18 => Ok(v.trunc() as i64),
        Scalar::Float(v) => Err(OpError(format!("cannot convert {v} to an int"))),
        s => int(s),
    }
}

fn arith(a: &Args, op: Op) -> OpResult<Outputs> {
    let (x, y) = (a.scalar_at(0)?, a.scalar_at(1)?);
    if matches!(x, Scalar::Float(_)) || matches!(y, Scalar::Float(_)) {
        let (x, y) = (x.as_f64(), y.as_f64());
        if matches!(op, Op::FloorDiv | Op::Mod) && y == 0.0 {
            return Err(OpError("division by zero".into()));
        }
        return out(Scalar::Float(match op {
            Op::Add => x + y,
            Op::Sub => x - y,
            Op::Mul => x * y,
            Op::FloorDiv => (x / y).floor(),
            // Python's float modulo takes the divisor's sign.
            Op::Mod => x - (x / y).floor() * y,
            Op::Pow => x.powf(y),
        }));
    }
    let (x, y) = (int(x)?, int(y)?);
    let v = match op {
        Op::Add => x.checked_add(y),
        Op::Sub => x.checked_sub(y),
        Op::Mul => x.checked_mul(y),
        Op::FloorDiv | Op::Mod if y == 0 => return Err(OpError("integer division by zero".into())),
        // Python floors; Rust's `/` truncates toward zero.
        Op::FloorDiv => x.checked_div(y).map(|q| {
            if x % y != 0 && (x < 0) != (y < 0) {
                q - 1
            } else {
                q
            }
        }),
        Op::Mod => x.checked_rem(y).map(|r| {
            if r != 0 && (r < 0) != (y < 0) {
                r + y
            } else {
                r
            }
        }),
        Op::Pow if y < 0 => return out(Scalar::Float((x as f64).powf(y as f64))),
        Op::Pow => u32::try_from(y).ok().and_then(|e| x.checked_pow(e)),
    };
    out(Scalar::Int(v.ok_or_else(overflow)?))
}

fn shift(a: &Args, left: bool) -> OpResult<Outputs> {
    let (x, y) = (int(a.scalar_at(0)?)?, int(a.scalar_at(1)?)?);
    let y = u32::try_from(y).map_err(|_| OpError(format!("negative shift count {y}")))?;
    let v = if left {
        x.checked_shl(y).filter(|v| v >> y == x)
    } else {
        Some(if y >= 64 { x >> 63 } else { x >> y })
    };
    out(Scalar::Int(v.ok_or_else(overflow)?))
}

/// `and_` / `or_`: logical on bools, bitwise on ints.
fn logic(a: &Args, and: bool) -> OpResult<Outputs> {
    match (a.scalar_at(0)?, a.scalar_at(1)?) {
        (Scalar::Bool(x), Scalar::Bool(y)) => out(Scalar::Bool(if and { x && y } else { x || y })),
        (x, y) => {
            let (x, y) = (int(x)?, int(y)?);
            out(Scalar::Int(if and { x & y } else { x | y }))
        }
    }
}

fn compare(a: &Args, holds: fn(std::cmp::Ordering) -> bool) -> OpResult<Outputs> {
    let (x, y) = (a.scalar_at(0)?, a.scalar_at(1)?);
    let order = match (x, y) {
        (Scalar::Float(_), _) | (_, Scalar::Float(_)) => x.as_f64().partial_cmp(&y.as_f64()),
        _ => Some(int(x)?.cmp(&int(y)?)),
    };
    // NaN compares unequal to everything (only `!=` holds).
    out(Scalar::Bool(order.map_or(
        holds(std::cmp::Ordering::Less) && holds(std::cmp::Ordering::Greater),
        holds,
    )))
}

fn extreme(a: &Args, max: bool) -> OpResult<Outputs> {
    let (x, y) = (a.scalar_at(0)?, a.scalar_at(1)?);
    if matches!(x, Scalar::Float(_)) || matches!(y, Scalar::Float(_)) {
        let (x, y) = (x.as_f64(), y.as_f64());
        return out(Scalar::Float(if max { x.max(y) } else { x.min(y) }));
    }
    let (x, y) = (int(x)?, int(y)?);
    out(Scalar::Int(if max { x.max(y) } else { x.min(y) }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Node;

    /// Run `target` on literal arguments, as a program node would.
    fn run(target: &str, args: &[Scalar]) -> OpResult<Value> {
        let inputs: Vec<serde_json::Value> = args
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let arg = match s {
                    Scalar::Int(v) => serde_json::json!({"as_int": v}),
                    Scalar::Float(v) => serde_json::json!({"as_float": v}),
                    Scalar::Bool(v) => serde_json::json!({"as_bool": v}),
                };
                serde_json::json!({"name": format!("a{i}"), "arg": arg, "kind": 1})
            })
            .collect();
        let node: Node = serde_json::from_value(serde_json::json!({
            "target": target, "inputs": inputs,
            "outputs": [{"as_sym_int": {"as_name": "out"}}], "metadata": {}
        }))
        .unwrap();
        let env = Default::default();
        let mut r = Registry::new();
        register(&mut r);
        let f = r.get(target).expect("registered");
        Ok(f(&Args::new(&node, &env))?.remove(0))
    }

    fn int_of(v: Value) -> i64 {
        match v {
            Value::Int(v) => v,
            other => panic!("expected an int, got {other:?}"),
        }
    }

    #[test]
    fn floor_division_and_modulo_follow_python() {
        // Python: 7 // -2 == -4, -7 // 2 == -4, 7 % -2 == -1, -7 % 2 == 1.
        for (x, y, q, m) in [
            (7, -2, -4, -1),
            (-7, 2, -4, 1),
            (7, 2, 3, 1),
            (-7, -2, 3, -1),
        ] {
            let s = |v| Scalar::Int(v);
            assert_eq!(int_of(run("_operator.floordiv", &[s(x), s(y)]).unwrap()), q);
            assert_eq!(int_of(run("_operator.mod", &[s(x), s(y)]).unwrap()), m);
        }
        assert!(run("_operator.floordiv", &[Scalar::Int(1), Scalar::Int(0)]).is_err());
    }

    #[test]
    fn ints_stay_exact_and_overflow_is_an_error() {
        let big = Scalar::Int(1 << 40);
        assert_eq!(
            int_of(run("_operator.mul", &[big, Scalar::Int(3)]).unwrap()),
            3 << 40
        );
        assert!(run("_operator.mul", &[big, big]).is_err());
        assert!(matches!(
            run("_operator.truediv", &[Scalar::Int(7), Scalar::Int(2)]).unwrap(),
            Value::Float(v) if v == 3.5
        ));
        assert!(matches!(
            run("_operator.lt", &[Scalar::Int(2), Scalar::Float(2.5)]).unwrap(),
            Value::Bool(true)
        ));
        assert!(matches!(
            run(
                "torch.sym_ite",
                &[Scalar::Bool(false), Scalar::Int(1), Scalar::Int(2)]
            )
            .unwrap(),
            Value::Int(2)
        ));
    }
}
