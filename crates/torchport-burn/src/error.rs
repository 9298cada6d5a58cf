//! Errors of the Burn integration: each one sentence naming the file and what went wrong.

use std::path::PathBuf;

use crate::report::LoadReport;

/// Why a load did not happen (or did not finish).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The checkpoint could not be opened or read.
    #[error(transparent)]
    Read(Box<torchport::Error>),
    /// A rule is invalid, or failed on a tensor (the message names the rule).
    #[error("{0}")]
    Rules(Box<torchport::Error>),
    /// Strict loading found missing, unused or mismatched tensors; nothing was loaded.
    #[error(
        "{path}: the checkpoint does not fit the module, so nothing was loaded \
         (allow_partial(true) loads what fits):\n{report}"
    )]
    Incomplete {
        /// The checkpoint.
        path: PathBuf,
        /// Everything that did and did not match.
        report: Box<LoadReport>,
    },
    /// Reading a tensor's data failed while it was being applied (the module may be partly
    /// loaded).
    #[error("{path}: {} tensor(s) could not be applied: {}", errors.len(), errors.join("; "))]
    Apply {
        /// The checkpoint.
        path: PathBuf,
        /// One message per failed tensor.
        errors: Vec<String>,
    },
    /// The store only loads; saving a module into a checkpoint is done by torchport's writers.
    #[error("TorchportStore only loads; save a Burn module with burn-store's own stores")]
    ReadOnly,
    /// Writing an activations file failed.
    #[error("{path}: {message}")]
    Write {
        /// The file.
        path: PathBuf,
        /// What failed.
        message: String,
    },
}

impl From<torchport::Error> for Error {
    fn from(e: torchport::Error) -> Self {
        Error::Read(Box::new(e))
    }
}

impl Error {
    /// A rule error.
    pub(crate) fn rules(e: torchport::Error) -> Self {
        Error::Rules(Box::new(e))
    }
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;
