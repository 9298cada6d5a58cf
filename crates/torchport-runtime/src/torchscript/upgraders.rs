//! torch's operator upgraders: the code of an archive written for an older file format
//! version (`Script::version`) means by some operators what they computed then, and torch
//! runs such calls through an upgrader that computes it with today's operator. These are the
//! upgraders of torch's version map, as rewrites of the call's arguments:
//!
//! - before version 4 (torch 1.4 wrote version 1), `div` / `div_` of an integer tensor by an
//!   integer tensor or number (bool counting as integer) truncates: today's
//!   `div(.., rounding_mode="trunc")`;
//! - before version 5, `full` without a dtype and with an integer fill made a float tensor:
//!   the fill as a float;
//! - before versions 8 and 9, `linspace` and `logspace` with `steps` left out or None took
//!   100 steps.
//!
//! (`gelu`'s upgrader, before version 10, adds `approximate="none"`, today's default.)

use candle_core::DType;

use super::value::Val;

/// A call's positional and keyword arguments.
pub type Call = (Vec<Val>, Vec<(String, Val)>);

/// The arguments a call of `torch.<op>` written for file format `version` has today, or
/// `None` where they are the same.
pub fn upgrade(
    version: Option<u64>,
    op: &str,
    args: &[Val],
    kwargs: &[(String, Val)],
) -> Option<Call> {
    let version = version?;
    let given = |name: &str| {
        kwargs
            .iter()
            .any(|(k, v)| k == name && !matches!(v, Val::None))
    };
    // The call with keyword argument `name` set to `v` (in place of a None one).
    let with = |name: &str, v: Val| {
        let mut kw: Vec<(String, Val)> =
            kwargs.iter().filter(|(k, _)| k != name).cloned().collect();
        kw.push((name.to_string(), v));
        Some((args.to_vec(), kw))
    };
    match op {
        // Of a tensor (`div.Tensor`, `div.Scalar`): Python's `/` of two numbers is `div.int`,
        // a true division in every version.
        "div" | "div_"
            if version < 4 && matches!(args, [Val::Tensor(_), _]) && !given("rounding_mode") =>
        {
            if args.iter().any(is_float) {
                None
            } else {
                with("rounding_mode", Val::Str("trunc".into()))
            }
        }
        "full" if version < 5 && !given("dtype") => {
            let mut args = args.to_vec();
            let mut kwargs = kwargs.to_vec();
            let fill = match args.get_mut(1) {
                Some(v) => v,
                None => &mut kwargs.iter_mut().find(|(k, _)| k == "fill_value")?.1,
            };
            *fill = match fill {
                Val::Int(i) => Val::Float(*i as f64),
                Val::Bool(b) => Val::Float(f64::from(u8::from(*b))),
                _ => return None,
            };
            Some((args, kwargs))
        }
        // `steps` left out, or None (as torch 1.8 wrote it, positionally).
        "linspace" | "logspace" if version < if op == "linspace" { 8 } else { 9 } => {
            match args.get(2) {
                Some(Val::None) => {
                    let mut args = args.to_vec();
                    args[2] = Val::Int(100);
                    Some((args, kwargs.to_vec()))
                }
                None if !given("steps") => with("steps", Val::Int(100)),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Whether an operand is a floating-point tensor or a float.
fn is_float(v: &Val) -> bool {
    match v {
        Val::Float(_) => true,
        Val::Tensor(t) => matches!(
            t.dtype(),
            DType::F32 | DType::F64 | DType::F16 | DType::BF16
        ),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    fn tensor(dtype: DType) -> Val {
        Val::Tensor(Tensor::zeros(2, dtype, &Device::Cpu).unwrap())
    }

    fn kw(call: &Call, name: &str) -> Vec<String> {
        call.1
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.render())
            .collect()
    }

    #[test]
    fn div_truncates_integers_before_version_4_only() {
        let ints = [tensor(DType::I64), Val::Int(3)];
        let none = [("rounding_mode".to_string(), Val::None)];
        // A `rounding_mode=None` written out is replaced, not doubled.
        let call = upgrade(Some(1), "div", &ints, &none).expect("upgraded");
        assert_eq!(kw(&call, "rounding_mode"), ["trunc"]);
        assert!(upgrade(Some(3), "div_", &ints, &[]).is_some());
        // Not from version 4, not without a version, not with a float operand, not for
        // Python's `/` of two numbers, not where a rounding mode is given.
        assert!(upgrade(Some(4), "div", &ints, &[]).is_none());
        assert!(upgrade(None, "div", &ints, &[]).is_none());
        assert!(upgrade(Some(1), "div", &[tensor(DType::I64), Val::Float(2.0)], &[]).is_none());
        assert!(upgrade(Some(1), "div", &[tensor(DType::F32), Val::Int(2)], &[]).is_none());
        assert!(upgrade(Some(1), "div", &[Val::Int(7), Val::Int(2)], &[]).is_none());
        let floor = [("rounding_mode".to_string(), Val::Str("floor".into()))];
        assert!(upgrade(Some(1), "div", &ints, &floor).is_none());
    }

    #[test]
    fn full_and_steps() {
        let call = upgrade(Some(4), "full", &[Val::list(vec![]), Val::Int(7)], &[]).unwrap();
        assert!(matches!(call.0[1], Val::Float(f) if f == 7.0));
        assert!(upgrade(Some(5), "full", &[Val::list(vec![]), Val::Int(7)], &[]).is_none());
        let call = upgrade(
            Some(5),
            "linspace",
            &[Val::Float(0.0), Val::Float(1.0), Val::None],
            &[],
        )
        .unwrap();
        assert!(matches!(call.0[2], Val::Int(100)));
        let steps = [("steps".to_string(), Val::None)];
        let call = upgrade(
            Some(8),
            "logspace",
            &[Val::Float(0.0), Val::Float(1.0)],
            &steps,
        )
        .unwrap();
        assert_eq!(kw(&call, "steps"), ["100"]);
        assert!(upgrade(
            Some(8),
            "linspace",
            &[Val::Float(0.0), Val::Float(1.0)],
            &steps
        )
        .is_none());
    }
}
