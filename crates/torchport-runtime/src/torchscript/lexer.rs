//! Tokens of TorchScript's serialized Python subset. Indentation becomes `Indent` / `Dedent`
//! tokens; newlines inside brackets are ignored, as in Python.

use super::ast::SyntaxError;

/// One token.
#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    /// A name or keyword.
    Name(String),
    /// An integer literal.
    Int(i64),
    /// A float literal.
    Float(f64),
    /// A string literal (escapes decoded).
    Str(String),
    /// An operator or punctuation.
    Op(&'static str),
    /// End of a logical line.
    Newline,
    /// The next line is indented more.
    Indent,
    /// The next line is indented less (one per closed level).
    Dedent,
    /// End of input.
    Eof,
}

/// A token and the 1-based line it starts on.
#[derive(Debug, Clone)]
pub struct Token {
    /// The token.
    pub tok: Tok,
    /// Its line.
    pub line: u32,
}

/// Most nested indentation levels a file may open.
const MAX_INDENT_LEVELS: usize = 100;

const OPS: [&str; 39] = [
    "**=", "//=", "->", "**", "//", "==", "!=", "<=", ">=", "+=", "-=", "*=", "/=", "%=", "<<",
    ">>", "(", ")", "[", "]", "{", "}", ",", ":", ".", "+", "-", "*", "/", "%", "<", ">", "=", "&",
    "|", "^", "~", "@", ";",
];

/// Split `src` into tokens.
pub fn lex(src: &str) -> Result<Vec<Token>, SyntaxError> {
    let b = src.as_bytes();
    let mut out: Vec<Token> = Vec::new();
    let mut indents: Vec<usize> = vec![0];
    let mut i = 0;
    let mut line: u32 = 1;
    let mut open: Vec<(u32, &'static str)> = Vec::new(); // open brackets
    let mut at_line_start = true;
    let err = |line: u32, what: String| SyntaxError { line, what };
    while i < b.len() {
        if at_line_start && open.is_empty() {
            // Measure indentation; skip blank and comment-only lines.
            let mut col = 0;
            let mut j = i;
            while j < b.len() && (b[j] == b' ' || b[j] == b'\t') {
                col += if b[j] == b'\t' { 8 - col % 8 } else { 1 };
                j += 1;
            }
            if j >= b.len() {
                break;
            }
            if b[j] == b'\n' || b[j] == b'\r' || b[j] == b'#' {
                while j < b.len() && b[j] != b'\n' {
                    j += 1;
                }
                // A last line without a newline ends the input on this line.
                if j < b.len() {
                    line += 1;
                }
                i = j + 1;
                continue;
            }
            let cur = *indents.last().unwrap_or(&0);
            if col > cur {
                if indents.len() >= MAX_INDENT_LEVELS {
                    return Err(err(
                        line,
                        format!("indentation nested deeper than {MAX_INDENT_LEVELS} levels"),
                    ));
                }
                indents.push(col);
                out.push(Token {
                    tok: Tok::Indent,
                    line,
                });
            } else {
                while col < *indents.last().unwrap_or(&0) {
                    indents.pop();
                    out.push(Token {
                        tok: Tok::Dedent,
                        line,
                    });
                }
                if col != *indents.last().unwrap_or(&0) {
                    return Err(err(line, "inconsistent indentation".into()));
                }
            }
            i = j;
            at_line_start = false;
            continue;
        }
        let c = b[i];
        match c {
            b'\n' => {
                if open.is_empty() {
                    out.push(Token {
                        tok: Tok::Newline,
                        line,
                    });
                    at_line_start = true;
                }
                line += 1;
                i += 1;
            }
            b' ' | b'\t' | b'\r' => i += 1,
            b'#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'\\' if b.get(i + 1) == Some(&b'\n') => {
                i += 2;
                line += 1;
            }
            b'"' | b'\'' => {
                let (s, next, lines) = string(b, i).map_err(|w| err(line, w))?;
                out.push(Token {
                    tok: Tok::Str(s),
                    line,
                });
                line += lines;
                i = next;
            }
            b'0'..=b'9' => {
                let (tok, next) = number(b, i).map_err(|w| err(line, w))?;
                out.push(Token { tok, line });
                i = next;
            }
            b'.' if b.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                let (tok, next) = number(b, i).map_err(|w| err(line, w))?;
                out.push(Token { tok, line });
                i = next;
            }
            c if c == b'_' || c.is_ascii_alphabetic() => {
                let start = i;
                while i < b.len() && (b[i] == b'_' || b[i].is_ascii_alphanumeric()) {
                    i += 1;
                }
                out.push(Token {
                    tok: Tok::Name(src[start..i].to_string()),
                    line,
                });
            }
            _ => {
                let op = OPS
                    .iter()
                    .find(|op| b[i..].starts_with(op.as_bytes()))
                    .ok_or_else(|| {
                        let ch = src[i..].chars().next().unwrap_or('?');
                        err(line, format!("unexpected character {ch:?}"))
                    })?;
                match *op {
                    "(" | "[" | "{" => open.push((line, op)),
                    ")" | "]" | "}" => {
                        open.pop()
                            .ok_or_else(|| err(line, format!("unmatched '{op}'")))?;
                    }
                    _ => {}
                }
                out.push(Token {
                    tok: Tok::Op(op),
                    line,
                });
                i += op.len();
            }
        }
    }
    if let Some(&(l, op)) = open.first() {
        return Err(err(l, format!("'{op}' is never closed")));
    }
    out.push(Token {
        tok: Tok::Newline,
        line,
    });
    for _ in 1..indents.len() {
        out.push(Token {
            tok: Tok::Dedent,
            line,
        });
    }
    out.push(Token {
        tok: Tok::Eof,
        line,
    });
    Ok(out)
}

/// A string literal starting at `i` (its quote): the decoded text, the index after it, and
/// the newlines it spans.
fn string(b: &[u8], i: usize) -> Result<(String, usize, u32), String> {
    let q = b[i];
    let triple = b.len() >= i + 3 && b[i + 1] == q && b[i + 2] == q;
    let mut j = if triple { i + 3 } else { i + 1 };
    let mut out: Vec<u8> = Vec::new();
    let mut lines = 0;
    loop {
        let Some(&c) = b.get(j) else {
            return Err("unterminated string literal".into());
        };
        if c == q && (!triple || (b.get(j + 1) == Some(&q) && b.get(j + 2) == Some(&q))) {
            j += if triple { 3 } else { 1 };
            break;
        }
        match c {
            b'\n' if !triple => return Err("unterminated string literal".into()),
            b'\n' => {
                lines += 1;
                out.push(c);
                j += 1;
            }
            b'\\' => {
                let e = *b.get(j + 1).ok_or("unterminated string literal")?;
                j += 2;
                match e {
                    b'n' => out.push(b'\n'),
                    b't' => out.push(b'\t'),
                    b'r' => out.push(b'\r'),
                    b'0' => out.push(0),
                    b'\\' | b'\'' | b'"' => out.push(e),
                    b'\n' => lines += 1,
                    b'x' => {
                        let hex = b.get(j..j + 2).ok_or("bad \\x escape")?;
                        let v = u8::from_str_radix(std::str::from_utf8(hex).unwrap_or("zz"), 16)
                            .map_err(|_| "bad \\x escape")?;
                        out.extend(char::from(v).to_string().as_bytes());
                        j += 2;
                    }
                    b'u' => {
                        let hex = b.get(j..j + 4).ok_or("bad \\u escape")?;
                        let v = u32::from_str_radix(std::str::from_utf8(hex).unwrap_or("zz"), 16)
                            .map_err(|_| "bad \\u escape")?;
                        let ch = char::from_u32(v).ok_or("bad \\u escape")?;
                        out.extend(ch.to_string().as_bytes());
                        j += 4;
                    }
                    other => {
                        out.push(b'\\');
                        out.push(other);
                    }
                }
            }
            _ => {
                out.push(c);
                j += 1;
            }
        }
    }
    let s = String::from_utf8(out).map_err(|_| "string literal is not valid UTF-8")?;
    Ok((s, j, lines))
}

/// A number literal at `i`.
fn number(b: &[u8], i: usize) -> Result<(Tok, usize), String> {
    let mut j = i;
    let mut is_float = false;
    if b[j..].starts_with(b"0x") || b[j..].starts_with(b"0X") {
        j += 2;
        let start = j;
        while j < b.len() && b[j].is_ascii_hexdigit() {
            j += 1;
        }
        let text = std::str::from_utf8(&b[start..j]).unwrap_or("");
        let v = i64::from_str_radix(text, 16)
            .map_err(|_| format!("integer literal 0x{text} does not fit in 64 bits"))?;
        return Ok((Tok::Int(v), j));
    }
    while j < b.len() && b[j].is_ascii_digit() {
        j += 1;
    }
    if j < b.len() && b[j] == b'.' {
        is_float = true;
        j += 1;
        while j < b.len() && b[j].is_ascii_digit() {
            j += 1;
        }
    }
    if j < b.len() && (b[j] == b'e' || b[j] == b'E') {
        let mut k = j + 1;
        if k < b.len() && (b[k] == b'+' || b[k] == b'-') {
            k += 1;
        }
        if k < b.len() && b[k].is_ascii_digit() {
            is_float = true;
            j = k;
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
        }
    }
    let text = std::str::from_utf8(&b[i..j]).unwrap_or("");
    if text.len() > 400 {
        return Err(format!(
            "a number literal of {} characters (at most 400)",
            text.len()
        ));
    }
    if is_float {
        let v: f64 = text
            .parse()
            .map_err(|_| format!("bad float literal {text}"))?;
        Ok((Tok::Float(v), j))
    } else {
        // 9223372036854775808 is written as its own literal only after a minus sign; torch
        // prints i64::MIN as `-9223372036854775808`.
        let v: i64 = match text.parse::<i64>() {
            Ok(v) => v,
            Err(_) if text == "9223372036854775808" => i64::MIN,
            Err(_) => return Err(format!("integer literal {text} does not fit in 64 bits")),
        };
        Ok((Tok::Int(v), j))
    }
}
