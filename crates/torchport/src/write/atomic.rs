//! Atomic output files: everything is written to a temporary file in the destination's
//! folder, synced to disk, and renamed over the destination only when complete. On any error
//! (or a panic) the temporary file is removed, so a failed write never leaves a partial file.
//! An output that is one of the inputs (same path after resolving links, or the same file
//! through a hard link) is refused before anything is created.

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// A file being written atomically; it appears at its destination only on [`commit`].
///
/// [`commit`]: AtomicFile::commit
#[derive(Debug)]
pub struct AtomicFile {
    dest: PathBuf,
    temp: PathBuf,
    file: Option<File>,
}

/// Makes temporary names unique within this process.
static COUNTER: AtomicU64 = AtomicU64::new(0);

impl AtomicFile {
    /// Create a temporary file beside `dest`, after checking that `dest` is none of `inputs`.
    pub fn create(dest: &Path, inputs: &[&Path]) -> Result<AtomicFile> {
        check_not_input(dest, inputs)?;
        if dest.is_dir() {
            return Err(Error::write(dest, "is a folder; give a file name to write"));
        }
        let name = dest
            .file_name()
            .ok_or_else(|| Error::write(dest, "has no file name; give a file name to write"))?;
        let dir = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        loop {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let mut temp_name = std::ffi::OsString::from(".");
            temp_name.push(name);
            temp_name.push(format!(".tmp-{}-{n}", std::process::id()));
            let temp = dir.join(temp_name);
            match OpenOptions::new().write(true).create_new(true).open(&temp) {
                Ok(file) => {
                    return Ok(AtomicFile {
                        dest: dest.to_path_buf(),
                        temp,
                        file: Some(file),
                    })
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::write_io(dest, e)),
            }
        }
    }

    /// The temporary file to write into.
    pub fn file(&mut self) -> &mut File {
        // `file` is only taken by `commit`, which consumes `self`.
        self.file.as_mut().expect("AtomicFile used after commit")
    }

    /// The destination path.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// The temporary path (removed on drop unless committed).
    pub fn temp_path(&self) -> &Path {
        &self.temp
    }

    /// Sync the data to disk and rename the temporary file over the destination.
    pub fn commit(mut self) -> Result<()> {
        let file = self.file.take().expect("AtomicFile committed twice");
        file.sync_all()
            .map_err(|e| Error::write_io(&self.dest, e))?;
        drop(file);
        std::fs::rename(&self.temp, &self.dest).map_err(|e| Error::write_io(&self.dest, e))?;
        // The rename is done: from here on the temporary name no longer exists.
        self.temp = PathBuf::new();
        sync_parent(&self.dest);
        Ok(())
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.temp.as_os_str().is_empty() {
            self.file.take();
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

/// Ask the OS to start writing `file`'s dirty pages to disk now, without waiting for them
/// (Linux: `sync_file_range(SYNC_FILE_RANGE_WRITE)`; nothing elsewhere). Only a hint: the
/// disk then works while the rest of the file is produced, so the `fsync` in
/// [`AtomicFile::commit`] has less left to wait for. Durability still comes from that fsync.
fn start_writeback(file: &File) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: a system call on a descriptor `file` owns and keeps open during the call;
        // no memory is passed. Its result is ignored (a hint; errors show up in the fsync).
        #[allow(unsafe_code)]
        unsafe {
            libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = file;
}

/// A helper thread that issues [`start_writeback`] hints for a file, so the writer never
/// waits on them (the hint itself can block on a full disk queue). Hints sent while one is
/// in progress are merged. Dropping it waits for the thread.
#[derive(Debug)]
pub(crate) struct Writeback {
    tx: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writeback {
    /// Start the thread for `file` (on Linux; elsewhere, and if the file handle cannot be
    /// duplicated or the thread cannot start, hints are dropped).
    pub(crate) fn start(file: &File) -> Writeback {
        let none = Writeback {
            tx: None,
            thread: None,
        };
        if !cfg!(target_os = "linux") {
            return none;
        }
        let Ok(file) = file.try_clone() else {
            return none;
        };
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("torchport-writeback".into())
            .spawn(move || {
                while rx.recv().is_ok() {
                    while rx.try_recv().is_ok() {}
                    start_writeback(&file);
                }
            });
        match thread {
            Ok(t) => Writeback {
                tx: Some(tx),
                thread: Some(t),
            },
            Err(_) => none,
        }
    }

    /// Ask for the file's dirty pages to be sent to disk soon.
    pub(crate) fn hint(&self) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(());
        }
    }
}

impl Drop for Writeback {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Make the rename durable by syncing the folder (best effort; not possible everywhere).
fn sync_parent(dest: &Path) {
    #[cfg(unix)]
    {
        let dir = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    #[cfg(not(unix))]
    let _ = dest;
}

/// The identity of an existing file: its resolved path and, on unix, (device, inode).
#[derive(Debug, PartialEq, Eq)]
struct Identity {
    path: Option<PathBuf>,
    #[cfg(unix)]
    inode: Option<(u64, u64)>,
}

fn identity(path: &Path) -> Identity {
    // A destination that does not exist yet is named by its resolved folder plus its name.
    let resolved = std::fs::canonicalize(path).ok().or_else(|| {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        Some(std::fs::canonicalize(dir).ok()?.join(path.file_name()?))
    });
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let inode = std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()));
        Identity {
            path: resolved,
            inode,
        }
    }
    #[cfg(not(unix))]
    Identity { path: resolved }
}

/// Refuse `dest` when it is one of `inputs`: the same path once links are resolved, or (on
/// unix) the same file through a hard link (same device and inode).
pub fn check_not_input(dest: &Path, inputs: &[&Path]) -> Result<()> {
    let out = identity(dest);
    for input in inputs {
        let inp = identity(input);
        let same_path = out.path.is_some() && out.path == inp.path;
        #[cfg(unix)]
        let same_file = out.inode.is_some() && out.inode == inp.inode;
        #[cfg(not(unix))]
        let same_file = false;
        if same_path || same_file {
            return Err(Error::write(
                dest,
                format!(
                    "is the input file {}; refusing to overwrite an input, choose another output path",
                    input.display()
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn commit_and_drop() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out.bin");
        let mut f = AtomicFile::create(&dest, &[]).unwrap();
        f.file().write_all(b"hello").unwrap();
        assert!(!dest.exists());
        f.commit().unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"hello");

        let mut f = AtomicFile::create(&dest, &[]).unwrap();
        f.file().write_all(b"partial").unwrap();
        let temp = f.temp_path().to_path_buf();
        assert!(temp.exists());
        drop(f);
        assert!(!temp.exists());
        assert_eq!(std::fs::read(&dest).unwrap(), b"hello");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn refuses_inputs() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.pt");
        std::fs::write(&input, b"x").unwrap();
        let err = check_not_input(&input, &[&input]).unwrap_err().to_string();
        assert!(err.contains("refusing to overwrite an input"), "{err}");
        // Same file through another spelling of the path.
        let other = dir.path().join(".").join("in.pt");
        assert!(check_not_input(&other, &[&input]).is_err());
        // A hard link has another path but the same inode.
        let link = dir.path().join("link.pt");
        std::fs::hard_link(&input, &link).unwrap();
        #[cfg(unix)]
        assert!(check_not_input(&link, &[&input]).is_err());
        // A new file, or another file, is fine.
        assert!(check_not_input(&dir.path().join("new.pt"), &[&input]).is_ok());
        std::fs::write(dir.path().join("b.pt"), b"y").unwrap();
        assert!(check_not_input(&dir.path().join("b.pt"), &[&input]).is_ok());
        assert!(AtomicFile::create(&input, &[&input]).is_err());
        assert!(AtomicFile::create(dir.path(), &[]).is_err());
    }

    #[cfg(unix)]
    #[test]
    fn refuses_symlinked_input() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.pt");
        std::fs::write(&input, b"x").unwrap();
        let link = dir.path().join("sym.pt");
        std::os::unix::fs::symlink(&input, &link).unwrap();
        assert!(check_not_input(&link, &[&input]).is_err());
        assert!(check_not_input(&input, &[&link]).is_err());
    }
}
