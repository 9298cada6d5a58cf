//! Owns the error types: [`Error`] (where it happened) and [`ErrorKind`] (what happened).

use std::fmt;

/// A pickle that could not be read: the byte offset of the opcode that failed, its
/// `pickletools` name, and what went wrong.
///
/// Displays as one sentence, e.g. `pickle byte 1234 (BINUNICODE): the input ends inside
/// this opcode's argument, so the file is truncated or corrupt`.
#[derive(Debug, thiserror::Error)]
pub struct Error {
    /// Byte offset of the failing opcode in the input (for [`ErrorKind::NoStop`] and
    /// [`ErrorKind::TrailingBytes`], the offset where the input ended or the extra bytes start).
    pub offset: u64,
    /// The `pickletools` name of the failing opcode, when there is one.
    pub opcode: Option<&'static str>,
    /// What went wrong.
    pub kind: ErrorKind,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.opcode {
            Some(op) => write!(f, "pickle byte {} ({}): {}", self.offset, op, self.kind),
            None => write!(f, "pickle byte {}: {}", self.offset, self.kind),
        }
    }
}

/// Text from the pickle as it goes into a message: control characters escaped (one line,
/// whatever the pickle holds) and at most 200 characters.
fn one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(208));
    for (i, c) in text.chars().enumerate() {
        if i == 200 {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// What went wrong while running a pickle.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The input ends inside an opcode's argument, or a declared length is larger than the
    /// rest of the input.
    #[error("the input ends inside this opcode's argument, so the file is truncated or corrupt")]
    UnexpectedEof,
    /// A byte that is not a pickle opcode.
    #[error("byte 0x{0:02x} is not a pickle opcode, so this is not a pickle or it is corrupt")]
    UnknownOpcode(u8),
    /// The opcode needs more stack items (above the topmost mark) than there are.
    #[error("the opcode needs more values than the stack holds above its topmost mark")]
    StackUnderflow,
    /// The opcode needs a MARK and there is none.
    #[error("the opcode needs a MARK on the stack and there is none")]
    NoMark,
    /// GET of a memo key that was never PUT.
    #[error("memo key {0} is read before anything was stored under it")]
    BadMemoKey(u64),
    /// A str (or a GLOBAL / PERSID text line) is not valid UTF-8.
    #[error("the string is not valid UTF-8")]
    InvalidUtf8,
    /// A protocol-0 text argument that does not parse; the text says what was expected.
    #[error("{}", one_line(.0))]
    BadText(String),
    /// A stack item has the wrong type for the opcode.
    #[error("the opcode expects a {expected} on the stack but found a {found}")]
    WrongType {
        /// The type the opcode needs.
        expected: &'static str,
        /// The type that was there.
        found: &'static str,
    },
    /// A [`Limits`](crate::Limits) field was exceeded; `what` names the field.
    #[error("the pickle exceeds the limit of {limit} ({what}); raise Limits::{what} if the file is trusted")]
    Limit {
        /// The [`Limits`](crate::Limits) field, e.g. `"max_string_len"`.
        what: &'static str,
        /// The value of that field.
        limit: usize,
    },
    /// A global that could only mean code execution or system access.
    #[error(
        "refusing global {}.{} because loading it could run code or touch the system",
        one_line(module),
        one_line(name)
    )]
    DangerousGlobal {
        /// The module of the refused global.
        module: String,
        /// The name of the refused global.
        name: String,
    },
    /// Bytes follow the STOP opcode (only [`parse`](crate::parse) checks this).
    #[error("{0} bytes follow the STOP opcode where the pickle should end")]
    TrailingBytes(usize),
    /// The input ended without a STOP opcode.
    #[error("the input ends before the STOP opcode, so the file is truncated")]
    NoStop,
    /// PROTO names a protocol newer than 5.
    #[error("protocol {0} is newer than 5, the highest protocol this reader knows")]
    UnsupportedProtocol(u8),
    /// EXT1 / EXT2 / EXT4 name an extension code; the registry they look it up in is empty
    /// here, as in a Python process that never called `copyreg.add_extension`.
    #[error("extension code {0} is not registered (this reader's extension registry is empty, as in a plain Python)")]
    UnregisteredExtension(u32),
    /// A feature this reader deliberately does not provide (out-of-band buffers); the text
    /// names it.
    #[error("{0} are not supported")]
    Unsupported(&'static str),
    /// A structurally invalid argument (negative length, odd number of dict items, …); the
    /// text says which.
    #[error("{0}")]
    Malformed(&'static str),
}
