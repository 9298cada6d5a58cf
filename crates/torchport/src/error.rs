//! The library's error type: every variant names the file and, where it applies, the
//! tensor, record or byte offset, and says what was expected.

use std::path::{Path, PathBuf};

/// Text from the file (names, records, a container library's message) as it goes into an
/// error: control characters escaped, so every message stays one line whatever the file
/// holds (a key containing a newline cannot forge a second message), and at most 300
/// characters of any one part.
pub(crate) fn shown(text: impl std::fmt::Display) -> String {
    escaped(text, 300)
}

/// A message of torchport's own that quotes text from the file (a rule's op, a list of
/// names): control characters escaped, no length cap beyond 64 KiB characters.
pub(crate) fn one_line(text: impl std::fmt::Display) -> String {
    escaped(text, 1 << 16)
}

fn escaped(text: impl std::fmt::Display, max: usize) -> String {
    let text = text.to_string();
    let mut out = String::with_capacity(text.len().min(max + 8));
    for (i, c) in text.chars().enumerate() {
        if i == max {
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

/// Result alias for the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What would let an [`Error::Unwritable`] tensor be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Remedy {
    /// Leave the tensor out (or rename it).
    LeaveOut,
    /// Cast it to a floating-point type the format holds (float32 always is), or leave it
    /// out.
    CastOrLeaveOut,
}

/// Everything that can go wrong reading a file. Display is one sentence a person can act on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file could not be opened or read.
    #[error("{}: cannot read the file: {source}", shown(path.display()))]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The content matches none of the formats torchport reads.
    #[error("{}: not a file torchport recognizes ({detail}); expected a PyTorch checkpoint (zip, legacy stream or tar), safetensors, numpy .npy/.npz or a sharded *.index.json", shown(path.display()))]
    UnknownFormat {
        /// The file.
        path: PathBuf,
        /// What was found instead.
        detail: String,
    },
    /// The format is recognized but this kind of file is not read yet.
    #[error("{}: {} is not supported yet", shown(path.display()), shown(what))]
    UnsupportedFormat {
        /// The file.
        path: PathBuf,
        /// What kind of file it is.
        what: String,
    },
    /// A pickle inside the file could not be decoded, or references a dangerous global.
    #[error("{}: in {}: {}", shown(path.display()), shown(record), shown(source))]
    Pickle {
        /// The file.
        path: PathBuf,
        /// The record holding the pickle (`archive/data.pkl`, `main pickle`, …).
        record: String,
        /// The pickle VM's error, with its byte offset and opcode.
        source: torchport_pickle::Error,
    },
    /// The zip container is corrupt or truncated.
    #[error("{}: the zip archive is corrupt or truncated: {}", shown(path.display()), shown(source))]
    Zip {
        /// The file.
        path: PathBuf,
        /// The zip reader's error.
        source: zip::result::ZipError,
    },
    /// A record the file refers to is not in it.
    #[error("{}: record {} is missing from the archive", shown(path.display()), shown(record))]
    MissingRecord {
        /// The file.
        path: PathBuf,
        /// The missing record.
        record: String,
    },
    /// The file's structure is not what its format requires.
    #[error("{}: {}", shown(path.display()), shown(what))]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong, and where.
        what: String,
    },
    /// One tensor's description is invalid (a view outside its storage, an overflowing size…).
    #[error("{}: tensor {}: {}", shown(path.display()), shown(tensor), shown(what))]
    Tensor {
        /// The file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// What is wrong.
        what: String,
    },
    /// The tensor is of a kind whose data torchport cannot read (sparse, nested, meta…).
    #[error("{}: tensor {} is {}; its data cannot be read", shown(path.display()), shown(tensor), shown(what))]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// What kind of tensor it is.
        what: String,
    },
    /// A resource limit was reached; the limit can be raised through [`crate::Limits`].
    #[error("{}: {} exceeds the limit of {limit} (Limits::{field})", shown(path.display()), shown(what))]
    Limit {
        /// The file.
        path: PathBuf,
        /// What grew too large.
        what: String,
        /// The limit in force.
        limit: u64,
        /// The `Limits` field that sets it.
        field: &'static str,
    },
    /// A shard named by a sharded checkpoint's index could not be read.
    #[error("{}: shard {}: {}", shown(path.display()), shown(shard), one_line(source))]
    Shard {
        /// The index file.
        path: PathBuf,
        /// The shard, as the index names it.
        shard: String,
        /// What went wrong reading the shard (its message names the shard's own path).
        source: Box<Error>,
    },
    /// A tensor's external data (ONNX) cannot be used: its location leaves the model's
    /// folder, its file cannot be opened, or its byte range does not fit.
    #[error("{}: tensor {}: external data {}: {}", shown(path.display()), shown(tensor), shown(format!("{location:?}")), one_line(what))]
    ExternalData {
        /// The model file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// The `location` it names.
        location: String,
        /// What is wrong.
        what: String,
    },
    /// A remapping rule is invalid, or cannot be applied to the tensors it matched.
    #[error("{}: {}", one_line(rule), one_line(what))]
    Rule {
        /// Where the rule comes from: file and line, or preset, with its index and kind.
        rule: String,
        /// What is wrong.
        what: String,
    },
    /// No tensor of that name.
    #[error("{}: no tensor named {}", shown(path.display()), shown(name))]
    NoSuchTensor {
        /// The file.
        path: PathBuf,
        /// The name asked for.
        name: String,
    },
    /// The output file could not be created, written, synced or renamed into place.
    #[error("{}: cannot write the file: {source}", shown(path.display()))]
    WriteIo {
        /// The output file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// An output file cannot be written: a tensor the format cannot hold, an output that
    /// would replace an input, a name used twice…
    #[error("{}: {}", shown(path.display()), one_line(what))]
    Write {
        /// The output file.
        path: PathBuf,
        /// What is wrong, and what to do about it.
        what: String,
    },
    /// A tensor cannot be written as it is: the format cannot hold its dtype, or its name is
    /// taken or reserved. The message says what to do; `remedy` says it as data, so a front
    /// end can name its own options for it.
    #[error("{}: {}", shown(path.display()), one_line(what))]
    Unwritable {
        /// The output file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// What is wrong, and what to do about it.
        what: String,
        /// What would let the write go through.
        remedy: Remedy,
    },
    /// A LoRA adapter cannot be read or merged (see [`crate::lora`]).
    #[error("{}: {}", shown(path.display()), one_line(what))]
    Lora {
        /// The adapter's file (or folder, or config).
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// A selection (`--key`, `--include`, `--exclude`, `--dtype`) cannot be applied.
    #[error("{}: {}", shown(path.display()), one_line(what))]
    Select {
        /// The input file.
        path: PathBuf,
        /// What is wrong, and what is available instead.
        what: String,
    },
}

impl Error {
    pub(crate) fn corrupt(path: &Path, what: impl Into<String>) -> Self {
        Error::Corrupt {
            path: path.to_path_buf(),
            what: what.into(),
        }
    }

    pub(crate) fn lora(path: &Path, what: impl Into<String>) -> Self {
        Error::Lora {
            path: path.to_path_buf(),
            what: what.into(),
        }
    }

    pub(crate) fn write(path: &Path, what: impl Into<String>) -> Self {
        Error::Write {
            path: path.to_path_buf(),
            what: what.into(),
        }
    }

    pub(crate) fn unwritable(
        path: &Path,
        tensor: &str,
        what: impl Into<String>,
        remedy: Remedy,
    ) -> Self {
        Error::Unwritable {
            path: path.to_path_buf(),
            tensor: tensor.to_string(),
            what: what.into(),
            remedy,
        }
    }

    pub(crate) fn write_io(path: &Path, source: std::io::Error) -> Self {
        Error::WriteIo {
            path: path.to_path_buf(),
            source,
        }
    }

    /// The message without its leading `file: `, for nesting inside another message about
    /// the same file (or in an error type that names the file itself).
    pub fn detail(&self) -> String {
        let full = self.to_string();
        let path = match self {
            Error::Io { path, .. }
            | Error::UnknownFormat { path, .. }
            | Error::UnsupportedFormat { path, .. }
            | Error::Pickle { path, .. }
            | Error::Zip { path, .. }
            | Error::MissingRecord { path, .. }
            | Error::Corrupt { path, .. }
            | Error::Tensor { path, .. }
            | Error::Unsupported { path, .. }
            | Error::Limit { path, .. }
            | Error::NoSuchTensor { path, .. }
            | Error::WriteIo { path, .. }
            | Error::Write { path, .. }
            | Error::Unwritable { path, .. }
            | Error::Lora { path, .. }
            | Error::Select { path, .. } => path,
            _ => return full,
        };
        let prefix = format!("{}: ", path.display());
        full.strip_prefix(&prefix)
            .map_or(full.clone(), str::to_string)
    }

    pub(crate) fn tensor(path: &Path, tensor: &str, what: impl Into<String>) -> Self {
        Error::Tensor {
            path: path.to_path_buf(),
            tensor: tensor.to_string(),
            what: what.into(),
        }
    }
}
