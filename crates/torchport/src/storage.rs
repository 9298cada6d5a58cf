//! Byte storage shared by tensor views: a range of a memory-mapped file, or owned bytes
//! (for records that had to be decompressed). Cloning is cheap (reference counted).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::tensor::ByteOrder;

/// Bytes of a whole file: memory-mapped when possible.
#[derive(Clone, Debug)]
pub(crate) enum FileBytes {
    /// A read-only memory map of the file, and the file it maps.
    Mapped(Arc<Mapped>),
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
        Ok(FileBytes::Mapped(Arc::new(Mapped {
            map,
            file: Mutex::new(file),
        })))
    }

    /// The whole content.
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            FileBytes::Mapped(m) => &m.map,
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
            own_order: false,
        })
    }
}

/// A memory-mapped file: the map, and the open file it maps (kept to copy byte ranges
/// file to file inside the kernel, see [`FileRange`]).
#[derive(Debug)]
pub(crate) struct Mapped {
    map: memmap2::Mmap,
    /// Locked while its position is moved for a copy.
    file: Mutex<File>,
}

/// A byte range of a memory-mapped input file, to be copied to an output file without
/// passing through this process's memory (`copy_file_range` on Linux, through
/// [`std::io::copy`]'s file-to-file path; a plain read/write loop elsewhere).
#[derive(Clone, Debug)]
pub(crate) struct FileRange {
    file: Arc<Mapped>,
    range: Range<usize>,
}

impl FileRange {
    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.range.len()
    }

    /// Copy the range to the end of what `out` has written (its buffer is flushed first);
    /// returns the number of bytes copied, which is less than [`FileRange::len`] only when
    /// the input file was shortened since it was opened.
    pub(crate) fn copy_to(&self, out: &mut std::io::BufWriter<&mut File>) -> std::io::Result<u64> {
        out.flush()?;
        // A poisoned lock only means another copy panicked; the position is set below anyway.
        let guard = self.file.file.lock().unwrap_or_else(|e| e.into_inner());
        let mut src: &File = &guard;
        src.seek(SeekFrom::Start(self.range.start as u64))?;
        std::io::copy(&mut src.take(self.range.len() as u64), out)
    }
}

/// One storage: a contiguous run of bytes that tensor views index into, with the byte
/// order its elements are stored in (formats like npz mix orders within one file).
#[derive(Clone, Debug)]
pub struct Storage {
    file: FileBytes,
    range: Range<usize>,
    order: ByteOrder,
    /// The order is the storage's own (a numpy array's dtype says it), not the file's: the
    /// order a reader finds for the whole file leaves it alone.
    own_order: bool,
}

impl Storage {
    /// A storage over bytes held in memory.
    pub(crate) fn owned(bytes: Vec<u8>) -> Storage {
        let len = bytes.len();
        Storage {
            file: FileBytes::Owned(Arc::new(bytes)),
            range: 0..len,
            order: ByteOrder::Little,
            own_order: false,
        }
    }

    /// Bytes held in memory whose elements are in byte order `order` whatever the file's
    /// order is (a numpy array inside a pickle: its dtype names its order).
    pub(crate) fn owned_in(bytes: Vec<u8>, order: ByteOrder) -> Storage {
        Storage {
            own_order: true,
            ..Storage::owned(bytes).with_order(order)
        }
    }

    /// The same bytes, marked as holding elements in byte order `order`.
    pub(crate) fn with_order(mut self, order: ByteOrder) -> Storage {
        self.order = order;
        self
    }

    /// The same bytes in the byte order a reader found for the whole file, unless the
    /// storage has its own (see [`Storage::owned_in`]).
    pub(crate) fn in_file_order(self, order: ByteOrder) -> Storage {
        if self.own_order {
            self
        } else {
            self.with_order(order)
        }
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
            own_order: self.own_order,
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

    /// `range` of this storage's bytes as a range of its memory-mapped input file (none for
    /// bytes held in memory, or a range outside the storage).
    pub(crate) fn file_range(&self, range: Range<usize>) -> Option<FileRange> {
        let FileBytes::Mapped(file) = &self.file else {
            return None;
        };
        if range.start > range.end || range.end > self.len() {
            return None;
        }
        Some(FileRange {
            file: file.clone(),
            range: self.range.start + range.start..self.range.start + range.end,
        })
    }

    /// Drop this storage's pages from the process's resident memory (memory-mapped storages
    /// only; a no-op otherwise). The bytes stay in the OS page cache and are read back
    /// transparently if used again, so this is only a hint: writers call it after each
    /// tensor so that converting a large file keeps about one tensor resident.
    pub fn release(&self) {
        #[cfg(unix)]
        if let FileBytes::Mapped(map) = &self.file {
            if self.range.is_empty() {
                return;
            }
            // SAFETY: the map is a read-only, shared mapping of a file (`Mmap::map`).
            // MADV_DONTNEED on such a mapping only unmaps the pages from this process: a later
            // access faults them back in from the page cache / file with the same content, so
            // every outstanding `&[u8]` into the map stays valid and unchanged (the one
            // unsound case, private copy-on-write mappings losing writes, cannot arise).
            #[allow(unsafe_code)]
            let _ = unsafe {
                map.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    self.range.start,
                    self.range.len(),
                )
            };
        }
    }

    /// Map this storage's pages into the process now, from the OS page cache (reading the
    /// file where they are not cached), so that a later read of them takes no page faults
    /// (`MADV_POPULATE_READ`: memory-mapped storages on Linux 5.14 or later; a no-op
    /// otherwise, and where the kernel refuses it). Only a hint: the bytes are the same
    /// either way. The pages count towards the process's resident memory until released.
    /// Returns false where the storage is mapped but its pages were not mapped in (not Linux,
    /// or a kernel without the advice); true otherwise.
    pub fn populate(&self) -> bool {
        let FileBytes::Mapped(map) = &self.file else {
            return true;
        };
        if self.range.is_empty() {
            return true;
        }
        #[cfg(target_os = "linux")]
        {
            let (at, len) = (self.range.start, self.range.len());
            map.map
                .advise_range(memmap2::Advice::PopulateRead, at, len)
                .is_ok()
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = map;
            false
        }
    }

    /// Where `bytes` lie in this storage's memory-mapped file, if they are a part of it (as a
    /// slice borrowed from [`crate::Checkpoint::data`] is); `None` for bytes anywhere else.
    pub(crate) fn mapped_offset(&self, bytes: &[u8]) -> Option<usize> {
        let FileBytes::Mapped(map) = &self.file else {
            return None;
        };
        let base = map.map.as_ptr() as usize;
        let start = (bytes.as_ptr() as usize).checked_sub(base)?;
        (start.checked_add(bytes.len())? <= map.map.len()).then_some(start)
    }

    /// Like [`Storage::release`], for just the pages under `bytes` — a part of the data this
    /// storage's memory-mapped file holds, e.g. the rows a reader has finished copying out of
    /// a borrowed tensor, so a long copy keeps only its current stretch resident. Bytes that
    /// are not part of the mapped file (copies on the heap, other files) are left alone.
    pub fn release_bytes(&self, bytes: &[u8]) {
        #[cfg(not(unix))]
        let _ = bytes;
        #[cfg(unix)]
        if let (FileBytes::Mapped(map), Some(start)) = (&self.file, self.mapped_offset(bytes)) {
            if bytes.is_empty() {
                return;
            }
            // SAFETY: as in `release`: a read-only shared file mapping, whose pages fault back
            // in unchanged; the range was checked to lie inside the map.
            #[allow(unsafe_code)]
            let _ = unsafe {
                map.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    start,
                    bytes.len(),
                )
            };
        }
    }

    /// True when the bytes are read straight from a memory map (no copy was made).
    pub fn is_mapped(&self) -> bool {
        matches!(self.file, FileBytes::Mapped(_))
    }
}
