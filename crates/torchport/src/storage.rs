//! Byte storage shared by tensor views: a range of a memory-mapped file, or owned bytes
//! (for records that had to be decompressed). Cloning is cheap (reference counted).

use std::fs::File;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::tensor::ByteOrder;

/// Bytes of a whole file: memory-mapped when possible.
#[derive(Clone, Debug)]
pub(crate) enum FileBytes {
    /// A read-only memory map of the file.
    Mapped(Arc<memmap2::Mmap>),
    /// Bytes held in memory.
    Owned(Arc<Vec<u8>>),
}

impl FileBytes {
    /// Map a file read-only. Empty files are held as an empty buffer (they cannot be mapped).
    pub(crate) fn open(path: &Path) -> Result<FileBytes> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len == 0 {
            return Ok(FileBytes::Owned(Arc::new(Vec::new())));
        }
        // SAFETY: the map is read-only. As with every memory-mapped reader, a file truncated
        // by another process while mapped can fault; the file is treated as immutable input.
        #[allow(unsafe_code)]
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Ok(FileBytes::Mapped(Arc::new(map)))
    }

    /// The whole content.
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            FileBytes::Mapped(m) => m,
            FileBytes::Owned(v) => v,
        }
    }

    /// A storage over `range` of these bytes; the range must lie inside them.
    pub(crate) fn storage(&self, range: Range<usize>) -> Option<Storage> {
        if range.start > range.end || range.end > self.as_slice().len() {
            return None;
        }
        Some(Storage {
            file: self.clone(),
            range,
            order: ByteOrder::Little,
        })
    }
}

/// One storage: a contiguous run of bytes that tensor views index into, with the byte
/// order its elements are stored in (formats like npz mix orders within one file).
#[derive(Clone, Debug)]
pub struct Storage {
    file: FileBytes,
    range: Range<usize>,
    order: ByteOrder,
}

impl Storage {
    /// A storage over bytes held in memory.
    pub(crate) fn owned(bytes: Vec<u8>) -> Storage {
        let len = bytes.len();
        Storage {
            file: FileBytes::Owned(Arc::new(bytes)),
            range: 0..len,
            order: ByteOrder::Little,
        }
    }

    /// The same bytes, marked as holding elements in byte order `order`.
    pub(crate) fn with_order(mut self, order: ByteOrder) -> Storage {
        self.order = order;
        self
    }

    /// Byte order of the elements stored here (data is always handed out little-endian).
    pub fn byte_order(&self) -> ByteOrder {
        self.order
    }

    /// A storage over `range` of this one's bytes (a legacy storage view), if it lies inside.
    pub(crate) fn slice(&self, range: Range<usize>) -> Option<Storage> {
        if range.start > range.end || range.end > self.len() {
            return None;
        }
        Some(Storage {
            file: self.file.clone(),
            range: self.range.start + range.start..self.range.start + range.end,
            order: self.order,
        })
    }

    /// The storage's bytes.
    pub fn bytes(&self) -> &[u8] {
        // The range was checked against the file when the storage was made.
        self.file
            .as_slice()
            .get(self.range.clone())
            .unwrap_or_default()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.range.len()
    }

    /// True when the storage holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    /// The file bytes this storage is a range of, and the range (to open an archive nested
    /// in a record without copying it).
    pub(crate) fn parts(&self) -> (&FileBytes, Range<usize>) {
        (&self.file, self.range.clone())
    }

    /// True when the bytes are read straight from a memory map (no copy was made).
    pub fn is_mapped(&self) -> bool {
        matches!(self.file, FileBytes::Mapped(_))
    }
}
