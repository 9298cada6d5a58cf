//! One module per file format, and detection by content (never by extension).

use std::fmt;
use std::path::Path;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::limits::Limits;
use crate::storage::FileBytes;

mod torch_legacy;
mod torch_tar;
mod torch_zip;

/// The container format of a file, named as in DESIGN.md (`inspect --json`'s `format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Format {
    /// `torch.save` zip archive (PyTorch ≥ 1.6).
    TorchZip,
    /// `torch.save` legacy stream (pre-1.6, or `_use_new_zipfile_serialization=False`).
    TorchLegacy,
    /// `torch.save` tar archive (PyTorch ≤ 0.1.x).
    TorchTar,
}

impl Format {
    /// The contract name: `torch-zip`, `torch-legacy`, `torch-tar`.
    pub fn name(self) -> &'static str {
        match self {
            Format::TorchZip => "torch-zip",
            Format::TorchLegacy => "torch-legacy",
            Format::TorchTar => "torch-tar",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Detect the format of `bytes` from its first bytes.
pub fn detect(bytes: &[u8]) -> Option<Format> {
    if bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06") {
        Some(Format::TorchZip)
    } else if torch_legacy::looks_like(bytes) {
        Some(Format::TorchLegacy)
    } else if bytes.get(257..262) == Some(b"ustar") {
        Some(Format::TorchTar)
    } else {
        None
    }
}

pub(crate) fn open(path: &Path, limits: &Limits) -> Result<Checkpoint> {
    read(path, &FileBytes::open(path)?, limits)
}

/// Read a checkpoint held in memory; `path` only names it in messages.
pub(crate) fn read(path: &Path, file: &FileBytes, limits: &Limits) -> Result<Checkpoint> {
    let bytes = file.as_slice();
    match detect(bytes) {
        Some(Format::TorchZip) => torch_zip::read(path, file, limits),
        Some(Format::TorchLegacy) => torch_legacy::read(path, file, limits),
        Some(Format::TorchTar) => torch_tar::read(path, file, limits),
        None => Err(Error::UnknownFormat {
            path: path.to_path_buf(),
            detail: describe_head(bytes),
        }),
    }
}

/// A short description of a file's first bytes for error messages.
fn describe_head(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "the file is empty".into();
    }
    let head: String = bytes
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ");
    format!("it starts with bytes {head}")
}
