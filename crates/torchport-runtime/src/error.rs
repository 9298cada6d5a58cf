//! The runtime's error type: one variant per kind of failure, each naming what it concerns.

use std::path::PathBuf;

/// Everything that can go wrong loading or running a program.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// torchport could not read the file (its message names the file and the record or
    /// tensor): unreadable, not a format it knows, or a damaged archive.
    #[error(transparent)]
    Read(torchport::Error),
    /// The file is not a `.pt2` archive holding one serialized program.
    #[error("{}: {}", path.display(), one_line(what))]
    Archive {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// The program's JSON is invalid or from an unsupported schema version.
    #[error("{}: {} is not a valid exported program: {}", path.display(), one_line(record), one_line(what))]
    Schema {
        /// The file.
        path: PathBuf,
        /// The archive record (e.g. `model/models/model.json`).
        record: String,
        /// What is wrong.
        what: String,
    },
    /// The program is well-formed but refers to something it does not define.
    #[error("invalid program: {}", one_line(.0))]
    Program(String),
    /// The program uses operators this runtime does not implement.
    #[error("the program uses {} unsupported operator(s): {}", .0.len(), one_line(&.0.join(", ")))]
    UnsupportedOps(Vec<String>),
    /// A weight named by the signature is missing or unusable.
    #[error("weight '{}': {}", one_line(name), one_line(what))]
    Weight {
        /// The weight's state_dict name.
        name: String,
        /// What is wrong.
        what: String,
    },
    /// The inputs given to `run` do not match the program.
    #[error("input {index}: {}", one_line(what))]
    Input {
        /// Position of the user input.
        index: usize,
        /// What is wrong.
        what: String,
    },
    /// `run` was given the wrong number of inputs.
    #[error("the program takes {expected} input(s) but {got} were given")]
    InputCount {
        /// Inputs the program takes.
        expected: usize,
        /// Inputs given.
        got: usize,
    },
    /// A TorchScript archive's code could not be parsed or run: the record and line of the
    /// serialized code, and the construct or failure.
    #[error("{}: {}, line {line}: {}", path.display(), one_line(record), one_line(what))]
    Script {
        /// The archive.
        path: PathBuf,
        /// The code record (`code/__torch__/….py`).
        record: String,
        /// 1-based line in that record.
        line: u32,
        /// What is wrong.
        what: String,
    },
    /// An operator failed.
    #[error("node '{}' ({}): {}", one_line(node), one_line(target), one_line(what))]
    Op {
        /// The node's name.
        node: String,
        /// The operator.
        target: String,
        /// What went wrong.
        what: String,
    },
}

/// `s` with control characters (a newline in a crafted program's name) escaped, so that every
/// error is one line.
fn one_line(s: &str) -> std::borrow::Cow<'_, str> {
    if s.chars().any(char::is_control) {
        s.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect::<String>()
            .into()
    } else {
        s.into()
    }
}

/// Result with the runtime's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// An error inside one op, before the interpreter adds the node's name and target.
#[derive(Debug)]
pub struct OpError(pub String);

impl From<candle_core::Error> for OpError {
    fn from(e: candle_core::Error) -> Self {
        OpError(candle_message(&e))
    }
}

/// A candle error's message without the backtrace candle attaches when `RUST_BACKTRACE` is
/// set (errors stay one line).
pub fn candle_message(e: &candle_core::Error) -> String {
    match e {
        candle_core::Error::WithBacktrace { inner, .. } => candle_message(inner),
        e => e.to_string(),
    }
}

impl From<String> for OpError {
    fn from(s: String) -> Self {
        OpError(s)
    }
}

impl From<&str> for OpError {
    fn from(s: &str) -> Self {
        OpError(s.to_string())
    }
}

/// Result of an op kernel.
pub type OpResult<T> = std::result::Result<T, OpError>;

/// Return early from an op with a formatted message.
#[macro_export]
macro_rules! op_bail {
    ($($arg:tt)*) => { return Err($crate::error::OpError(format!($($arg)*))) };
}
