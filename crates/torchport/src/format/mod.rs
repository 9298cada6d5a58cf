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

/// The format of a file, named as in DESIGN.md (`inspect --json`'s `format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Format {
    /// `torch.save` zip archive (PyTorch ≥ 1.6).
    TorchZip,
    /// `torch.save` legacy stream (pre-1.6, or `_use_new_zipfile_serialization=False`).
    TorchLegacy,
    /// `torch.save` tar archive (PyTorch ≤ 0.1.x).
    TorchTar,
    /// `torch.jit.save` TorchScript archive.
    TorchScript,
    /// `torch.export.save` archive.
    Pt2,
    /// safetensors.
    Safetensors,
    /// numpy `.npz` archive.
    Npz,
    /// numpy `.npy` array.
    Npy,
    /// ONNX model (initializers).
    Onnx,
    /// Sharded checkpoint index (`*.index.json`).
    Sharded,
}

impl Format {
    /// The contract name: `torch-zip`, `torch-legacy`, `torch-tar`, `torchscript`, `pt2`,
    /// `safetensors`, `npz`, `npy`, `onnx`, `sharded`.
    pub fn name(self) -> &'static str {
        match self {
            Format::TorchZip => "torch-zip",
            Format::TorchLegacy => "torch-legacy",
            Format::TorchTar => "torch-tar",
            Format::TorchScript => "torchscript",
            Format::Pt2 => "pt2",
            Format::Safetensors => "safetensors",
            Format::Npz => "npz",
            Format::Npy => "npy",
            Format::Onnx => "onnx",
            Format::Sharded => "sharded",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Detect the format of a file from its bytes (zip archives are told apart by the records
/// they hold). `None` when no format matches.
pub fn detect(bytes: &[u8]) -> Option<Format> {
    if bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06") {
        Some(zip_kind(bytes))
    } else if torch_legacy::looks_like(bytes) {
        Some(Format::TorchLegacy)
    } else if bytes.get(257..262) == Some(b"ustar") {
        Some(Format::TorchTar)
    } else {
        None
    }
}

/// Which kind of zip archive: decided from the record names in its central directory.
fn zip_kind(bytes: &[u8]) -> Format {
    let Ok(zip) = zip::ZipArchive::new(std::io::Cursor::new(bytes)) else {
        // A damaged zip: the torch zip reader reports what is wrong with it.
        return Format::TorchZip;
    };
    let names: Vec<String> = zip
        .file_names()
        .filter_map(|n| n.ok().map(|n| n.into_owned()))
        .collect();
    let has = |suffix: &str| names.iter().any(|n| n.ends_with(suffix));
    if has("/constants.pkl") || names.iter().any(|n| n.contains("/code/__torch__")) {
        Format::TorchScript
    } else if has("archive_format") || names.iter().any(|n| n.contains("/models/")) {
        Format::Pt2
    } else if !names.is_empty() && names.iter().all(|n| n.ends_with(".npy")) {
        Format::Npz
    } else {
        Format::TorchZip
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
        Some(other) => Err(Error::UnsupportedFormat {
            path: path.to_path_buf(),
            what: format!("a {other} file"),
        }),
        None => Err(Error::UnknownFormat {
            path: path.to_path_buf(),
            detail: describe_head(bytes),
        }),
    }
}

/// The security scan's view of a file: its format, how many pickles it holds, and every
/// global those pickles reference (first-seen order). Pickles are run, never interpreted;
/// formats that hold no pickles give none.
pub(crate) fn pickle_globals(
    path: &Path,
    file: &FileBytes,
    limits: &Limits,
) -> Result<(Format, PickleGlobals)> {
    let bytes = file.as_slice();
    let format = detect(bytes).ok_or_else(|| Error::UnknownFormat {
        path: path.to_path_buf(),
        detail: describe_head(bytes),
    })?;
    let found = match format {
        Format::TorchLegacy => torch_legacy::pickle_globals(path, file, limits)?,
        Format::TorchTar => torch_tar::pickle_globals(path, file, limits)?,
        // Any zip: every `*.pkl` record (data.pkl, constants.pkl, …).
        Format::TorchZip | Format::TorchScript | Format::Pt2 | Format::Npz => {
            torch_zip::pickle_globals(path, file, limits)?
        }
        _ => PickleGlobals::default(),
    };
    Ok((format, found))
}

/// What the security scan saw in a container: how many pickles it ran, and every global
/// they reference (first-seen order, no repeats).
#[derive(Default)]
pub(crate) struct PickleGlobals {
    pub(crate) count: usize,
    pub(crate) globals: Vec<(String, String)>,
}

/// A list of globals without repeats, in first-seen order (a set beside it keeps merging
/// linear however many pickles and globals a hostile file holds).
#[derive(Default)]
pub(crate) struct GlobalList {
    list: Vec<(String, String)>,
    seen: std::collections::HashSet<(String, String)>,
}

impl GlobalList {
    /// Append the globals not seen yet.
    pub(crate) fn extend(&mut self, from: &[(String, String)]) {
        for g in from {
            if self.seen.insert(g.clone()) {
                self.list.push(g.clone());
            }
        }
    }

    /// The globals, first-seen order.
    pub(crate) fn into_vec(self) -> Vec<(String, String)> {
        self.list
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
