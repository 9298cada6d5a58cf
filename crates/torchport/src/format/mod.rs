//! One module per file format, and detection by content (never by extension).

use std::path::Path;

use crate::error::{Error, Result};
use crate::limits::Limits;
use crate::storage::FileBytes;
use kind::describe_head;
pub use kind::Format;
use parts::{Parts, PickleGlobals};

pub(crate) mod archive;
pub(crate) mod kind;
pub(crate) mod numpy;
mod onnx;
pub(crate) mod parts;
mod pt2;
mod pt2_json;
pub(crate) mod safetensors;
mod sharded;
pub(crate) mod torch;

/// Detect the format of a file from its bytes (zip archives are told apart by the records
/// they hold). `None` when no format matches.
///
/// safetensors: an 8-byte little-endian header length of at most 100 MB followed by `{`;
/// npy: the magic `\x93NUMPY`; sharded index: a JSON object (it starts with `{` after
/// whitespace) that mentions `"weight_map"`; npz: a zip archive whose records all end in
/// `.npy` (or an empty zip archive); pt2: a zip archive with an `archive_format` record (or
/// the older top-level `serialized_exported_program.json`); TorchScript: a zip archive with
/// `constants.pkl` or `code/__torch__*` records, or (torch 1.0 to 1.2) `model.json` and
/// `code/` records.
pub fn detect(bytes: &[u8]) -> Option<Format> {
    if archive::is_zip(bytes) {
        Some(zip_kind(bytes))
    } else if bytes.starts_with(numpy::MAGIC) {
        Some(Format::Npy)
    } else if torch::legacy::looks_like(bytes) {
        Some(Format::TorchLegacy)
    } else if bytes.get(257..262) == Some(b"ustar") {
        Some(Format::TorchTar)
    } else if safetensors::looks_like(bytes) {
        Some(Format::Safetensors)
    } else if sharded::looks_like(bytes) {
        Some(Format::Sharded)
    } else if onnx::looks_like(bytes) {
        // Last: ONNX has no magic number, only a structural check (see onnx/proto.rs).
        Some(Format::Onnx)
    } else {
        None
    }
}

/// Which kind of zip archive: decided from the record names in its central directory.
fn zip_kind(bytes: &[u8]) -> Format {
    let Ok(zip) = archive::open_zip(bytes) else {
        // A damaged zip: the torch zip reader reports what is wrong with it.
        return Format::TorchZip;
    };
    // Borrowed: a name is copied only where it is not UTF-8 as stored.
    let names: Vec<std::borrow::Cow<str>> = zip.file_names().filter_map(Result::ok).collect();
    // torch 1.0 to 1.2 wrote `model.json` and `code/<name>.py` instead.
    let torchscript = |n: &std::borrow::Cow<str>| {
        n == "constants.pkl"
            || n.ends_with("/constants.pkl")
            || n.starts_with("code/__torch__")
            || n.contains("/code/__torch__")
            || ((n == "model.json" || n.ends_with("/model.json"))
                && names
                    .iter()
                    .any(|c| c.starts_with("code/") || c.contains("/code/")))
    };
    if pt2::looks_like(&names) {
        Format::Pt2
    } else if names.iter().any(torchscript) {
        Format::TorchScript
    } else if names.iter().all(|n| n.ends_with(".npy")) {
        // `numpy.savez()` of no arrays is an empty archive: an npz with no tensors.
        Format::Npz
    } else {
        Format::TorchZip
    }
}

pub(crate) fn open(path: &Path, limits: &Limits, format: Option<Format>) -> Result<Parts> {
    let file = FileBytes::open(path)?;
    let format = match format {
        Some(f) => f,
        None => detect_or_fail(path, file.as_slice())?,
    };
    dispatch(path, &file, limits, true, format)
}

/// [`open`] of a `.pt2` archive (no detection) that keeps its programs' bytes unparsed
/// (`pt2::read_with`).
pub(crate) fn open_pt2_unparsed(path: &Path, limits: &Limits) -> Result<Parts> {
    let file = FileBytes::open(path)?;
    pt2::read_with(path, &file, limits, false)
}

/// Read a checkpoint held in memory; `path` only names it in messages. `format`: read it as
/// that format, or as the detected one when `None`.
pub(crate) fn read(
    path: &Path,
    file: &FileBytes,
    limits: &Limits,
    format: Option<Format>,
) -> Result<Parts> {
    let format = match format {
        Some(f) => f,
        None => detect_or_fail(path, file.as_slice())?,
    };
    dispatch(path, file, limits, false, format)
}

/// The format of the file at `path`, detected from its content as [`detect`] does, without
/// reading anything else: the file is memory-mapped and only its head (and, for a zip
/// archive, its directory) is looked at. An error when it cannot be read or matches no format.
pub fn detect_file(path: impl AsRef<Path>) -> Result<Format> {
    let path = path.as_ref();
    let file = FileBytes::open(path)?;
    detect_or_fail(path, file.as_slice())
}

/// The detected format, or the error naming what the file starts with.
fn detect_or_fail(path: &Path, bytes: &[u8]) -> Result<Format> {
    detect(bytes).ok_or_else(|| Error::UnknownFormat {
        path: path.to_path_buf(),
        detail: describe_head(bytes),
    })
}

/// Read with the reader of `format`. `on_disk`: the bytes are the file at `path` (formats
/// that refer to files beside the checkpoint, like ONNX external data and the shards of a
/// sharded index, may then look in its folder; from memory they never touch the disk).
fn dispatch(
    path: &Path,
    file: &FileBytes,
    limits: &Limits,
    on_disk: bool,
    format: Format,
) -> Result<Parts> {
    match format {
        Format::TorchZip => torch::zip::read(path, file, limits),
        Format::TorchLegacy => torch::legacy::read(path, file, limits),
        Format::TorchTar => torch::tar::read(path, file, limits),
        Format::TorchScript => torch::torchscript::read(path, file, limits),
        Format::Pt2 => pt2::read(path, file, limits),
        Format::Safetensors => safetensors::read(path, file, limits),
        Format::Npy => numpy::read_npy(path, file, limits),
        Format::Npz => numpy::read_npz(path, file, limits),
        Format::Sharded => {
            sharded::read(path, file, limits, on_disk, |p, f, l| read(p, f, l, None))
        }
        Format::Onnx => onnx::read(path, file, limits, on_disk),
    }
}

/// The security scan's view of a file: its format, how many pickles it holds, and every
/// global those pickles reference (first-seen order), with those of the `torch.save` files
/// nested in them through `torch.storage._load_from_bytes` (see `torch/nested.rs`). Pickles are
/// run, never interpreted; formats that hold no pickles give none.
pub(crate) fn pickle_globals(
    path: &Path,
    file: &FileBytes,
    limits: &Limits,
) -> Result<(Format, PickleGlobals)> {
    let format = detect_or_fail(path, file.as_slice())?;
    let found = match format {
        Format::TorchLegacy => torch::legacy::pickle_globals(path, file, limits, 0)?,
        Format::TorchTar => torch::tar::pickle_globals(path, file, limits)?,
        // Any zip: every `*.pkl` record (data.pkl, constants.pkl, …).
        Format::TorchZip | Format::TorchScript | Format::Pt2 | Format::Npz => {
            torch::zip::pickle_globals(path, file, limits, 0)?
        }
        _ => PickleGlobals::default(),
    };
    Ok((format, found))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn zip_of(names: &[&str]) -> Vec<u8> {
        let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        for n in names {
            w.start_file(*n, opts).unwrap();
            w.write_all(b"x").unwrap();
        }
        w.finish().unwrap().into_inner()
    }

    #[test]
    fn zip_kinds() {
        let kind = |names: &[&str]| detect(&zip_of(names));
        // A TorchScript model whose classes live in a `models` package.
        let ts = [
            "m/data.pkl",
            "m/code/__torch__/models/resnet.py",
            "m/constants.pkl",
        ];
        assert_eq!(kind(&ts), Some(Format::TorchScript));
        // torch 1.0 to 1.2's layout; a model.json without code is not one.
        let legacy = ["m/version", "m/model.json", "m/code/m.py", "m/tensors/0"];
        assert_eq!(kind(&legacy), Some(Format::TorchScript));
        assert_eq!(
            kind(&["m/model.json", "m/data.pkl"]),
            Some(Format::TorchZip)
        );
        let pt2 = [
            "p/archive_format",
            "p/models/model.json",
            "p/data/constants/x.pkl",
        ];
        assert_eq!(kind(&pt2), Some(Format::Pt2));
        let v0 = [
            "serialized_exported_program.json",
            "serialized_state_dict.pt",
        ];
        assert_eq!(kind(&v0), Some(Format::Pt2));
        assert_eq!(kind(&["a/data.pkl", "a/data/0"]), Some(Format::TorchZip));
    }
}
