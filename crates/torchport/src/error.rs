//! The library's error type: every variant names the file and, where it applies, the
//! tensor, record or byte offset, and says what was expected.

use std::path::{Path, PathBuf};

/// Result alias for the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong reading a file. Display is one sentence a person can act on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file could not be opened or read.
    #[error("{}: cannot read the file: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The content matches none of the formats torchport reads.
    #[error("{}: not a file torchport recognizes ({detail}); expected a PyTorch checkpoint (zip, legacy stream or tar)", path.display())]
    UnknownFormat {
        /// The file.
        path: PathBuf,
        /// What was found instead.
        detail: String,
    },
    /// The format is recognized but this kind of file is not read yet.
    #[error("{}: {what} is not supported yet", path.display())]
    UnsupportedFormat {
        /// The file.
        path: PathBuf,
        /// What kind of file it is.
        what: String,
    },
    /// A pickle inside the file could not be decoded, or references a dangerous global.
    #[error("{}: in {record}: {source}", path.display())]
    Pickle {
        /// The file.
        path: PathBuf,
        /// The record holding the pickle (`archive/data.pkl`, `main pickle`, …).
        record: String,
        /// The pickle VM's error, with its byte offset and opcode.
        source: torchport_pickle::Error,
    },
    /// The zip container is corrupt or truncated.
    #[error("{}: the zip archive is corrupt or truncated: {source}", path.display())]
    Zip {
        /// The file.
        path: PathBuf,
        /// The zip reader's error.
        source: zip::result::ZipError,
    },
    /// A record the file refers to is not in it.
    #[error("{}: record {record} is missing from the archive", path.display())]
    MissingRecord {
        /// The file.
        path: PathBuf,
        /// The missing record.
        record: String,
    },
    /// The file's structure is not what its format requires.
    #[error("{}: {what}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong, and where.
        what: String,
    },
    /// One tensor's description is invalid (a view outside its storage, an overflowing size…).
    #[error("{}: tensor {tensor}: {what}", path.display())]
    Tensor {
        /// The file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// What is wrong.
        what: String,
    },
    /// The tensor is of a kind whose data torchport cannot read (sparse, nested, meta…).
    #[error("{}: tensor {tensor} is {what}; its data cannot be read", path.display())]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// What kind of tensor it is.
        what: String,
    },
    /// A resource limit was reached; the limit can be raised through [`crate::Limits`].
    #[error("{}: {what} exceeds the limit of {limit} (Limits::{field})", path.display())]
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
    /// No tensor of that name.
    #[error("{}: no tensor named {name}", path.display())]
    NoSuchTensor {
        /// The file.
        path: PathBuf,
        /// The name asked for.
        name: String,
    },
}

impl Error {
    pub(crate) fn corrupt(path: &Path, what: impl Into<String>) -> Self {
        Error::Corrupt {
            path: path.to_path_buf(),
            what: what.into(),
        }
    }

    /// The message without its leading `file: `, for nesting inside another message about
    /// the same file.
    pub(crate) fn detail(&self) -> String {
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
            | Error::NoSuchTensor { path, .. } => path,
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
