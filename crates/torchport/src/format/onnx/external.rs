//! ONNX external data: a tensor whose `data_location` is EXTERNAL names a file (`location`,
//! relative to the model's folder) and a byte range in it (`offset`, default 0; `length`,
//! default the tensor's size). The location must stay inside the model's folder: absolute
//! paths, drive prefixes and `..` are refused before anything is opened, and the resolved
//! file (symbolic links followed) must still lie inside the folder. Each file is
//! memory-mapped once and tensors are zero-copy ranges of it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::proto::StringStringEntryProto;
use crate::error::{Error, Result};
use crate::storage::{FileBytes, Storage};

/// Resolves and maps the external files of one model.
pub(super) struct External<'a> {
    /// The model file (for messages).
    model: &'a Path,
    /// The model's folder; `None` for a model read from memory.
    dir: Option<PathBuf>,
    /// Mapped files by canonical path.
    files: HashMap<PathBuf, FileBytes>,
}

/// What a tensor's `external_data` entries say.
struct Place {
    location: String,
    offset: u64,
    length: Option<u64>,
}

impl<'a> External<'a> {
    /// `dir`: the folder external locations are relative to (`None`: refuse external data).
    pub(super) fn new(model: &'a Path, dir: Option<PathBuf>) -> Self {
        External {
            model,
            dir,
            files: HashMap::new(),
        }
    }

    fn error(&self, tensor: &str, location: &str, what: impl Into<String>) -> Error {
        Error::ExternalData {
            path: self.model.to_path_buf(),
            tensor: tensor.to_string(),
            location: location.to_string(),
            what: what.into(),
        }
    }

    /// The storage holding `nbytes` bytes of tensor `tensor`'s external data.
    pub(super) fn storage(
        &mut self,
        tensor: &str,
        entries: &[StringStringEntryProto],
        nbytes: usize,
    ) -> Result<Storage> {
        let place = self.place(tensor, entries)?;
        let loc = place.location.as_str();
        let length = place.length.unwrap_or(nbytes as u64);
        if length != nbytes as u64 {
            return Err(self.error(
                tensor,
                loc,
                format!(
                    "its length {length} does not match the {nbytes} bytes \
                     the tensor's type and shape need"
                ),
            ));
        }
        let file = self.file(tensor, loc)?;
        let size = file.as_slice().len();
        let range = usize::try_from(place.offset)
            .ok()
            .and_then(|start| Some(start..start.checked_add(nbytes)?))
            .filter(|r| r.end <= size);
        range.and_then(|r| file.storage(r)).ok_or_else(|| {
            self.error(
                tensor,
                loc,
                format!(
                    "bytes {}..{} reach past the end of the file ({size} bytes)",
                    place.offset,
                    u128::from(place.offset) + u128::from(length),
                ),
            )
        })
    }

    /// Read the `external_data` entries (unknown keys are ignored, as onnx does).
    fn place(&self, tensor: &str, entries: &[StringStringEntryProto]) -> Result<Place> {
        let mut location = None;
        let mut offset = 0;
        let mut length = None;
        for e in entries {
            let number = || {
                e.value.parse::<u64>().map_err(|_| {
                    format!("its {} {:?} is not a non-negative integer", e.key, e.value)
                })
            };
            let parsed = match e.key.as_str() {
                "location" => {
                    location = Some(e.value.clone());
                    Ok(())
                }
                "offset" => number().map(|n| offset = n),
                "length" => number().map(|n| length = Some(n)),
                _ => Ok(()),
            };
            parsed.map_err(|what| self.error(tensor, location.as_deref().unwrap_or(""), what))?;
        }
        let location = location.ok_or_else(|| {
            Error::tensor(
                self.model,
                tensor,
                "it is stored externally but its external_data names no location",
            )
        })?;
        Ok(Place {
            location,
            offset,
            length,
        })
    }

    /// The mapped file at `location`, checked to lie inside the model's folder.
    fn file(&mut self, tensor: &str, location: &str) -> Result<FileBytes> {
        let rel = relative(location).map_err(|what| self.error(tensor, location, what))?;
        let Some(dir) = self.dir.as_deref() else {
            return Err(self.error(
                tensor,
                location,
                "a model read from memory has no folder to find it in; \
                 open the model from its file",
            ));
        };
        let joined = dir.join(&rel);
        let io = |e: std::io::Error| {
            self.error(
                tensor,
                location,
                format!("cannot open {}: {e}", joined.display()),
            )
        };
        let real = joined.canonicalize().map_err(io)?;
        let real_dir = dir.canonicalize().map_err(io)?;
        if !real.starts_with(&real_dir) {
            return Err(self.error(
                tensor,
                location,
                format!(
                    "it resolves to {} (through a symbolic link), outside the model's folder {}",
                    real.display(),
                    real_dir.display()
                ),
            ));
        }
        if let Some(f) = self.files.get(&real) {
            return Ok(f.clone());
        }
        if !real.metadata().map_err(io)?.is_file() {
            return Err(self.error(tensor, location, "it is not a regular file"));
        }
        let f = FileBytes::open(&real)?;
        self.files.insert(real, f.clone());
        Ok(f)
    }
}

/// The relative path a `location` names, or why it is refused: it must be a relative path
/// of plain names (`/` or `\` separated) with no `..`, no root and no drive.
fn relative(location: &str) -> Result<PathBuf, String> {
    const INSIDE: &str = "external data must lie inside the model's folder";
    if location.contains('\0') {
        return Err("the location contains a NUL byte".into());
    }
    let b = location.as_bytes();
    if b.first().is_some_and(|&c| c == b'/' || c == b'\\')
        || (b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b':')
    {
        return Err(format!("it is an absolute path; {INSIDE}"));
    }
    let mut rel = PathBuf::new();
    for part in location.split(['/', '\\']) {
        match part {
            ".." => return Err(format!("it contains `..`; {INSIDE}")),
            "" | "." => {}
            name => rel.push(name),
        }
    }
    if rel.as_os_str().is_empty() {
        return Err("the location names no file".into());
    }
    Ok(rel)
}

#[cfg(test)]
mod tests {
    use super::relative;

    #[test]
    fn locations() {
        assert_eq!(
            relative("weights.bin").unwrap().to_str(),
            Some("weights.bin")
        );
        assert_eq!(relative("./a/b.bin").unwrap().to_str(), Some("a/b.bin"));
        assert_eq!(relative("a\\b.bin").unwrap().to_str(), Some("a/b.bin"));
        for bad in [
            "../escape.bin",
            "a/../../b",
            "a\\..\\b",
            "/etc/passwd",
            "\\\\server\\share",
            "C:\\w.bin",
            "c:w.bin",
            "",
            ".",
            "a\0b",
        ] {
            assert!(relative(bad).is_err(), "{bad:?} must be refused");
        }
    }
}
