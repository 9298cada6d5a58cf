//! The zip container shared by the formats that use it (`torch.save`, TorchScript, `.pt2`,
//! npz): opening an archive with its offset fixed at 0, and reading records — stored ones in
//! place from the memory map, deflated ones (archives re-zipped by other tools) decompressed
//! under a size limit.

use std::io::{Cursor, Read};
use std::path::Path;

use zip::{CompressionMethod, ZipArchive};

use crate::error::{Error, Result};
use crate::limits::Limits;
use crate::storage::{FileBytes, Storage};

/// Deflate's largest possible expansion (a 258-byte match per 2 bits, rounded up).
const MAX_DEFLATE_RATIO: u64 = 1032;

/// An opened zip archive over the file's bytes, or over a range of them (an archive nested
/// as a stored record of another one, as `.pt2` files hold `torch.save` archives).
pub(crate) struct Archive<'a> {
    path: &'a Path,
    file: &'a FileBytes,
    /// Where the archive starts in `file`, and its length.
    base: usize,
    len: usize,
    zip: ZipArchive<Cursor<&'a [u8]>>,
    max_decompressed: u64,
    /// Bytes decompressed so far (the limit is on the total).
    decompressed: u64,
}

impl<'a> Archive<'a> {
    pub(crate) fn new(path: &'a Path, file: &'a FileBytes, limits: &Limits) -> Result<Self> {
        Self::within(path, file, 0..file.as_slice().len(), limits)
    }

    /// The archive held in `range` of `file` (a range that lies outside reads as empty).
    pub(crate) fn within(
        path: &'a Path,
        file: &'a FileBytes,
        range: std::ops::Range<usize>,
        limits: &Limits,
    ) -> Result<Self> {
        let bytes = file.as_slice().get(range.clone()).unwrap_or_default();
        let zip = open_zip(bytes).map_err(|source| {
            // Say why when the directory found belongs to an archive that starts inside the
            // file: a cut-off file whose own directory is gone, ending with a zip stored in it.
            match ZipArchive::new(Cursor::new(bytes)).map(|z| z.offset()) {
                Ok(offset) if offset != 0 => Error::corrupt(
                    path,
                    format!(
                        "the zip directory at the end of the file describes an archive starting at byte {offset}, not at the start; the file is truncated or has data in front"
                    ),
                ),
                _ => Error::Zip {
                    path: path.to_path_buf(),
                    source,
                },
            }
        })?;
        Ok(Archive {
            path,
            file,
            base: range.start,
            len: bytes.len(),
            zip,
            max_decompressed: limits.max_decompressed,
            decompressed: 0,
        })
    }

    /// The length of the whole file the archive is read from.
    pub(crate) fn file_len(&self) -> usize {
        self.file.as_slice().len()
    }

    /// Every record name in the archive.
    pub(crate) fn names(&self) -> Vec<String> {
        self.zip
            .file_names()
            .filter_map(|n| n.ok().map(|n| n.into_owned()))
            .collect()
    }

    /// True when a record of this name exists.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.zip.index_for_name(name).is_some()
    }

    /// The bytes of one record: a view of the map when stored, decompressed otherwise.
    pub(crate) fn record(&mut self, name: &str) -> Result<Storage> {
        let missing = || Error::MissingRecord {
            path: self.path.to_path_buf(),
            record: name.to_string(),
        };
        let index = self.zip.index_for_name(name).ok_or_else(missing)?;
        let zip_err = |source| Error::Zip {
            path: self.path.to_path_buf(),
            source,
        };
        let raw = self.zip.by_index_raw(index).map_err(zip_err)?;
        let size = raw.size();
        if raw.compression() == CompressionMethod::Stored {
            let start = raw.data_start().unwrap_or(u64::MAX);
            let range = usize::try_from(start)
                .ok()
                .zip(usize::try_from(size).ok())
                .and_then(|(s, n)| Some(s..s.checked_add(n)?))
                .filter(|r| r.end <= self.len)
                .map(|r| r.start + self.base..r.end + self.base);
            return range.and_then(|r| self.file.storage(r)).ok_or_else(|| {
                Error::corrupt(
                    self.path,
                    format!(
                        "record {name} ({size} bytes at byte {start}) extends past the end of the file ({} bytes)",
                        self.file.as_slice().len()
                    ),
                )
            });
        }
        let compressed = raw.compressed_size();
        drop(raw);
        if size > self.max_decompressed.saturating_sub(self.decompressed) {
            let what = match self.decompressed {
                0 => format!("record {name} decompressed ({size} bytes)"),
                before => format!(
                    "record {name} decompressed ({size} bytes, after {before} bytes of other records)"
                ),
            };
            return Err(Error::Limit {
                path: self.path.to_path_buf(),
                what,
                limit: self.max_decompressed,
                field: "max_decompressed",
            });
        }
        self.decompressed += size;
        let entry = self.zip.by_index(index).map_err(zip_err)?;
        // Never trust the declared size for the allocation: deflate expands at most about
        // 1032:1, so reserve no more than the compressed bytes could produce (and at most
        // 64 MiB up front); stop one byte past the declared size to notice an entry that
        // inflates further.
        let reserve = size
            .min(
                compressed
                    .saturating_mul(MAX_DEFLATE_RATIO)
                    .saturating_add(1024),
            )
            .min(1 << 26);
        let mut out = Vec::with_capacity(reserve as usize);
        entry
            .take(size.saturating_add(1))
            .read_to_end(&mut out)
            .map_err(|e| {
                Error::corrupt(
                    self.path,
                    format!("record {name} cannot be decompressed: {e}"),
                )
            })?;
        if out.len() as u64 > size {
            return Err(Error::corrupt(
                self.path,
                format!("record {name} inflates past the {size} bytes the archive declares"),
            ));
        }
        if out.len() as u64 != size {
            return Err(Error::corrupt(
                self.path,
                format!(
                    "record {name} decompresses to {} bytes, but the archive declares {size}",
                    out.len()
                ),
            ));
        }
        Ok(Storage::owned(out))
    }
}

/// True when `bytes` start like a zip archive (a local file header, or the end record of an
/// empty archive).
pub(crate) fn is_zip(bytes: &[u8]) -> bool {
    bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06")
}

/// Open the zip archive that starts at the first byte of `bytes`, as every reader of ours does.
///
/// The archive offset is fixed at 0, never detected: a torch archive has nothing in front of
/// it, and the zip crate's detection misreads valid archives. It takes the directory to end
/// where the end-of-directory record starts, but torch (miniz) always writes a ZIP64 end
/// record and locator (76 bytes) between them; when the first directory entry is itself 76
/// bytes long (a 30-byte record name: `torch.save` to a 21-character stem, `torch.jit.save`
/// to a 23-character one, `torch.export.save` to an 8-character one) a second entry sits
/// exactly where the directory "should" start, the archive is taken to start 76 bytes in,
/// and the directory walk runs into the ZIP64 record ("Invalid Central Directory header").
pub(crate) fn open_zip(bytes: &[u8]) -> zip::result::ZipResult<ZipArchive<Cursor<&[u8]>>> {
    let config = zip::read::Config {
        archive_offset: zip::read::ArchiveOffset::Known(0),
    };
    ZipArchive::with_config(config, Cursor::new(bytes))
}
