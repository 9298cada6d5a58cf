//! Owns the protocol-0 text arguments: integer and long literals, float reprs, memo keys,
//! quoted and escaped Python 2 strings (STRING), and raw-unicode-escape lines (UNICODE).
//! Each function mirrors what CPython's unpickler accepts and returns a message on failure.

use crate::value::{int_from_twos_complement, twos_complement_from_magnitude, Value};

/// Most digits in one text integer, as CPython's `sys.int_info.default_max_str_digits`;
/// it also keeps the quadratic decimal conversion cheap.
const MAX_INT_DIGITS: usize = 4300;

/// A short, printable rendering of a text argument for error messages.
fn show(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(line);
    let mut out: String = text.chars().take(40).collect();
    if text.chars().count() > 40 {
        out.push('…');
    }
    format!("{out:?}")
}

fn is_py_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c')
}

/// Digit values of `digits` in `base`, allowing single underscores between digits (and,
/// with a base prefix, right after it) as Python's `int()` does.
fn digit_values(digits: &str, base: u32, underscore_first: bool) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut prev_underscore = !underscore_first;
    for c in digits.chars() {
        if c == '_' {
            if prev_underscore {
                return None;
            }
            prev_underscore = true;
            continue;
        }
        let d = c.to_digit(base)?;
        out.push(d as u8);
        prev_underscore = false;
    }
    if prev_underscore || out.is_empty() {
        return None;
    }
    Some(out)
}

/// Parse an INT / LONG text argument the way `int(text, 0)` does, also accepting Python 2's
/// `L` suffix. Returns [`Value::Int`] or [`Value::BigInt`].
pub(crate) fn parse_int(line: &[u8]) -> Result<Value, String> {
    let bad = || {
        format!(
            "integer text {} is not a Python integer literal",
            show(line)
        )
    };
    let s = std::str::from_utf8(line).map_err(|_| bad())?;
    let t = s.trim_matches(is_py_space);
    let t = t.strip_suffix(['L', 'l']).unwrap_or(t);
    let (negative, t) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let lower_prefix = t.get(..2).map(str::to_ascii_lowercase);
    let (base, body, prefixed) = match lower_prefix.as_deref() {
        Some("0x") => (16, t.get(2..).unwrap_or(""), true),
        Some("0o") => (8, t.get(2..).unwrap_or(""), true),
        Some("0b") => (2, t.get(2..).unwrap_or(""), true),
        _ => (10, t, false),
    };
    let digits = digit_values(body, base, prefixed).ok_or_else(bad)?;
    if digits.len() > MAX_INT_DIGITS {
        return Err(format!(
            "integer text has {} digits, more than the {MAX_INT_DIGITS} Python allows",
            digits.len()
        ));
    }
    // Fast path: fits in u128.
    let mut small: Option<u128> = Some(0);
    for &d in &digits {
        small = small
            .and_then(|v| v.checked_mul(u128::from(base)))
            .and_then(|v| v.checked_add(u128::from(d)));
    }
    if let Some(v) = small {
        let fits = if negative {
            v <= 1u128 << 63
        } else {
            v <= i64::MAX as u128
        };
        if fits {
            let i = if negative {
                (v as i128).wrapping_neg() as i64
            } else {
                v as i64
            };
            return Ok(Value::Int(i));
        }
    }
    // Big path: little-endian u32 limbs, multiply-add per digit.
    let mut limbs: Vec<u32> = vec![0];
    for &d in &digits {
        let mut carry = u64::from(d);
        for limb in limbs.iter_mut() {
            let cur = u64::from(*limb) * u64::from(base) + carry;
            *limb = cur as u32;
            carry = cur >> 32;
        }
        if carry != 0 {
            limbs.push(carry as u32);
        }
    }
    let magnitude: Vec<u8> = limbs.iter().flat_map(|l| l.to_le_bytes()).collect();
    Ok(int_from_twos_complement(twos_complement_from_magnitude(
        negative, magnitude,
    )))
}

/// Parse a GET / PUT text key the way `int(text)` does; negative keys are refused.
pub(crate) fn parse_memo_key(line: &[u8]) -> Result<u64, String> {
    let bad = || {
        format!(
            "memo key text {} is not a non-negative decimal integer",
            show(line)
        )
    };
    let s = std::str::from_utf8(line).map_err(|_| bad())?;
    let t = s.trim_matches(is_py_space);
    let t = t.strip_prefix('+').unwrap_or(t);
    let digits = digit_values(t, 10, false).ok_or_else(bad)?;
    let mut v: u64 = 0;
    for d in digits {
        v = v
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(d)))
            .ok_or_else(bad)?;
    }
    Ok(v)
}

/// Parse a FLOAT text argument (a Python float repr such as `1.5`, `-0.0`, `nan`, `inf`).
pub(crate) fn parse_float(line: &[u8]) -> Result<f64, String> {
    let bad = || format!("float text {} is not a Python float literal", show(line));
    let s = std::str::from_utf8(line).map_err(|_| bad())?;
    s.trim_matches(is_py_space)
        .parse::<f64>()
        .map_err(|_| bad())
}

/// Decode a STRING argument: strip the matching outer quotes, then undo Python's
/// `string_escape` (`codecs.escape_decode`). Returns the raw bytes.
pub(crate) fn decode_string_literal(line: &[u8]) -> Result<Vec<u8>, String> {
    let inner = match (line.first(), line.last()) {
        (Some(&a), Some(&b)) if line.len() >= 2 && a == b && (a == b'\'' || a == b'"') => {
            line.get(1..line.len() - 1).unwrap_or(&[])
        }
        _ => return Err("the STRING argument must be a quoted string".to_string()),
    };
    let mut out = Vec::with_capacity(inner.len());
    let mut i = 0;
    while let Some(&c) = inner.get(i) {
        i += 1;
        if c != b'\\' {
            out.push(c);
            continue;
        }
        let Some(&e) = inner.get(i) else {
            return Err("the STRING argument ends with a lone backslash".to_string());
        };
        i += 1;
        match e {
            b'\n' => {}
            b'\\' | b'\'' | b'"' => out.push(e),
            b'b' => out.push(0x08),
            b'f' => out.push(0x0c),
            b't' => out.push(b'\t'),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b'v' => out.push(0x0b),
            b'a' => out.push(0x07),
            b'0'..=b'7' => {
                let mut v = u32::from(e - b'0');
                for _ in 0..2 {
                    match inner.get(i) {
                        Some(&d @ b'0'..=b'7') => {
                            v = (v << 3) + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push((v & 0xff) as u8);
            }
            b'x' => {
                let hex = |k: usize| inner.get(k).and_then(|&h| (h as char).to_digit(16));
                match (hex(i), hex(i + 1)) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => {
                        return Err(format!(
                            "invalid \\x escape in STRING argument {}",
                            show(line)
                        ))
                    }
                }
            }
            other => {
                out.push(b'\\');
                out.push(other);
            }
        }
    }
    Ok(out)
}

/// Decode a UNICODE argument with Python's `raw-unicode-escape`: bytes are Latin-1 code
/// points except `\uXXXX` and `\UXXXXXXXX` escapes (a backslash escapes only `u` / `U`).
pub(crate) fn decode_raw_unicode_escape(line: &[u8]) -> Result<String, String> {
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while let Some(&c) = line.get(i) {
        i += 1;
        if c != b'\\' {
            out.push(char::from(c));
            continue;
        }
        let count = match line.get(i) {
            None => {
                out.push('\\');
                continue;
            }
            Some(b'u') => 4,
            Some(b'U') => 8,
            Some(&other) => {
                out.push('\\');
                out.push(char::from(other));
                i += 1;
                continue;
            }
        };
        i += 1;
        let mut code: u32 = 0;
        for _ in 0..count {
            let digit = line.get(i).and_then(|&h| char::from(h).to_digit(16));
            let Some(d) = digit else {
                return Err(format!(
                    "truncated \\u escape in UNICODE argument {}",
                    show(line)
                ));
            };
            code = (code << 4) | d;
            i += 1;
        }
        let ch = char::from_u32(code).ok_or_else(|| {
            format!(
                "\\u escape U+{code:X} in a UNICODE argument is a lone surrogate or out of range"
            )
        })?;
        out.push(ch);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints() {
        assert_eq!(parse_int(b"123"), Ok(Value::Int(123)));
        assert_eq!(parse_int(b"-5L"), Ok(Value::Int(-5)));
        assert_eq!(parse_int(b" 0x_ff "), Ok(Value::Int(255)));
        assert_eq!(parse_int(b"1_000"), Ok(Value::Int(1000)));
        assert_eq!(parse_int(b"-9223372036854775808"), Ok(Value::Int(i64::MIN)));
        assert_eq!(
            parse_int(b"9223372036854775808"),
            Ok(Value::BigInt(vec![0, 0, 0, 0, 0, 0, 0, 0x80, 0]))
        );
        assert_eq!(
            parse_int(b"-18446744073709551616L"),
            Ok(Value::BigInt(vec![0, 0, 0, 0, 0, 0, 0, 0, 0xff]))
        );
        for bad in [
            &b""[..],
            b"L",
            b"1__0",
            b"_1",
            b"1_",
            b"12x",
            b"--1",
            b"0x",
            b"\xff",
        ] {
            assert!(parse_int(bad).is_err(), "{bad:?}");
        }
        assert!(parse_int("9".repeat(4301).as_bytes()).is_err());
    }

    #[test]
    fn memo_keys_and_floats() {
        assert_eq!(parse_memo_key(b"42"), Ok(42));
        assert!(parse_memo_key(b"-1").is_err());
        assert!(parse_memo_key(b"99999999999999999999999").is_err());
        assert_eq!(parse_float(b"1.5"), Ok(1.5));
        assert!(parse_float(b"nan").is_ok_and(f64::is_nan));
        assert_eq!(parse_float(b"-inf"), Ok(f64::NEG_INFINITY));
        assert!(parse_float(b"1.5x").is_err());
    }

    #[test]
    fn strings() {
        assert_eq!(
            decode_string_literal(br"'a\n\x41\101\'q'"),
            Ok(b"a\nAA'q".to_vec())
        );
        assert_eq!(decode_string_literal(br#""it's""#), Ok(b"it's".to_vec()));
        assert_eq!(decode_string_literal(br"'\q'"), Ok(br"\q".to_vec()));
        assert!(decode_string_literal(b"'abc").is_err());
        assert!(decode_string_literal(br"'\'").is_err());
        assert!(decode_string_literal(br"'\x4'").is_err());
        assert_eq!(
            decode_raw_unicode_escape(b"\\u00e9\\U0001F600\xe9\\\\u0041\\x"),
            Ok("é😀é\\\\u0041\\x".to_string())
        );
        assert!(decode_raw_unicode_escape(b"\\u12").is_err());
        assert!(decode_raw_unicode_escape(b"\\ud800").is_err());
        assert!(decode_raw_unicode_escape(b"\\U00110000").is_err());
    }
}
