//! `Format`: the kinds of file torchport reads, with their contract names.

use std::fmt;

/// The format of a file, named as in docs/CONTRACTS.md (`inspect --json`'s `format`).
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

/// A short description of a file's first bytes for error messages.
pub(crate) fn describe_head(bytes: &[u8]) -> String {
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
