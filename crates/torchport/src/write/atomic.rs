//! Atomic output files: a file appears at its destination only complete, and a failed,
//! interrupted or killed write leaves nothing behind.
//!
//! How, on Linux: the file is created *unnamed* in the destination's folder (`open` with
//! `O_TMPFILE`), so it has no name while it is written and the kernel frees it if the process
//! dies for any reason (an error, a panic, Ctrl-C, `SIGKILL`, the OOM killer, a power cut).
//! When complete it is synced to disk and given a name: `linkat` of `/proc/self/fd/N` with
//! `AT_SYMLINK_FOLLOW`, straight to the destination when that does not exist yet (`linkat`
//! never replaces a file, so two writers cannot clobber each other), otherwise to a
//! temporary name `.NAME.tmp-<pid>-<n>` that is then renamed over the destination, so an
//! existing destination is replaced in one step and a reader sees the old file or the new
//! one, never a mixture. Only a crash in the instant between that link and the rename can
//! leave a temporary name behind. Finally the folder is synced so the new name is durable.
//!
//! Elsewhere, and where the filesystem refuses `O_TMPFILE` (`EOPNOTSUPP`, `EISDIR` on old
//! kernels, `EINVAL`) or `/proc` is not mounted, the file is written under the temporary
//! name from the start and renamed over the destination when complete. On any error or panic
//! it is removed; [`remove_pending`] removes those still open, for a signal handler (the CLI
//! calls it on Ctrl-C). A process killed outright leaves its temporary file: later runs find
//! it with [`stale_temp_files`] (a temporary name of ours whose process id is no running
//! process) and [`write`](crate::write::write) removes those of its destination once it
//! succeeds.
//!
//! An output that is one of the inputs (same path after resolving links, or the same file
//! through a hard link) is refused before anything is created.

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::error::{Error, Result};

/// Set (to anything) to make [`AtomicFile`] use the named temporary file even where
/// `O_TMPFILE` works; for tests of the fallback.
pub const FORCE_NAMED_ENV: &str = "TORCHPORT_TEST_NAMED_TEMP";

/// A file being written atomically; it appears at its destination only on [`commit`].
///
/// [`commit`]: AtomicFile::commit
#[derive(Debug)]
pub struct AtomicFile {
    dest: PathBuf,
    dir: PathBuf,
    /// The temporary name, empty while the file is unnamed (`O_TMPFILE`) or once committed.
    temp: PathBuf,
    unnamed: bool,
    file: Option<File>,
}

/// Makes temporary names unique within this process.
static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Named temporary files this process has open (for [`remove_pending`]).
static PENDING: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn pending() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    PENDING.lock().unwrap_or_else(|e| e.into_inner())
}

fn unregister(path: &Path) {
    pending().retain(|p| p != path);
}

/// Remove every named temporary file of an unfinished [`AtomicFile`] of this process (none
/// while files are written unnamed) and return their paths. For a signal handler that is
/// about to end the process: the files' writers may still be running, and their commits will
/// fail.
pub fn remove_pending() -> Vec<PathBuf> {
    let paths = std::mem::take(&mut *pending());
    paths
        .into_iter()
        .filter(|p| std::fs::remove_file(p).is_ok())
        .collect()
}

/// `.NAME.tmp-<pid>-<n>` beside `name`, with the next free `n`.
fn temp_name(dir: &Path, name: &std::ffi::OsStr) -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(".tmp-{}-{n}", std::process::id()));
    dir.join(temp_name)
}

impl AtomicFile {
    /// Create the file (unnamed where possible, see the module docs) in `dest`'s folder,
    /// after checking that `dest` is none of `inputs`.
    pub fn create(dest: &Path, inputs: &[&Path]) -> Result<AtomicFile> {
        AtomicFile::create_with(dest, inputs, std::env::var_os(FORCE_NAMED_ENV).is_none())
    }

    /// [`AtomicFile::create`], with unnamed files allowed or not.
    fn create_with(dest: &Path, inputs: &[&Path], allow_unnamed: bool) -> Result<AtomicFile> {
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
        if allow_unnamed {
            if let Some(file) = unnamed::create(&dir).map_err(|e| Error::write_io(dest, e))? {
                return Ok(AtomicFile {
                    dest: dest.to_path_buf(),
                    dir,
                    temp: PathBuf::new(),
                    unnamed: true,
                    file: Some(file),
                });
            }
        }
        loop {
            let temp = temp_name(&dir, name);
            // Registered before it exists, so an interrupt cannot fall between the two.
            pending().push(temp.clone());
            match OpenOptions::new().write(true).create_new(true).open(&temp) {
                Ok(file) => {
                    return Ok(AtomicFile {
                        dest: dest.to_path_buf(),
                        dir,
                        temp,
                        unnamed: false,
                        file: Some(file),
                    })
                }
                Err(e) => {
                    unregister(&temp);
                    if e.kind() != ErrorKind::AlreadyExists {
                        return Err(Error::write_io(dest, e));
                    }
                }
            }
        }
    }

    /// The file to write into.
    pub fn file(&mut self) -> &mut File {
        // `file` is only taken by `commit`, which consumes `self`.
        self.file.as_mut().expect("AtomicFile used after commit")
    }

    /// The destination path.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// The temporary path (removed on drop unless committed); `None` while the file is
    /// unnamed (`O_TMPFILE`: nothing to remove).
    pub fn temp_path(&self) -> Option<&Path> {
        (!self.temp.as_os_str().is_empty()).then_some(self.temp.as_path())
    }

    /// Whether the file is being written unnamed (`O_TMPFILE`).
    pub fn is_unnamed(&self) -> bool {
        self.unnamed
    }

    /// Sync the data to disk and put the file in place at the destination (see the module
    /// docs), replacing any file there.
    pub fn commit(mut self) -> Result<()> {
        let file = self.file.take().expect("AtomicFile committed twice");
        file.sync_all()
            .map_err(|e| Error::write_io(&self.dest, e))?;
        if self.unnamed {
            unnamed::link(&file, &self.dir, &self.dest)
                .map_err(|e| Error::write_io(&self.dest, e))?;
            drop(file);
        } else {
            drop(file);
            std::fs::rename(&self.temp, &self.dest).map_err(|e| Error::write_io(&self.dest, e))?;
            // The rename is done: from here on the temporary name no longer exists.
            unregister(&self.temp);
            self.temp = PathBuf::new();
        }
        sync_parent(&self.dest);
        Ok(())
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        self.file.take();
        if !self.temp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.temp);
            unregister(&self.temp);
        }
    }
}

/// Unnamed files: `O_TMPFILE` and `linkat` on Linux; nothing elsewhere.
#[cfg(target_os = "linux")]
mod unnamed {
    use std::ffi::CString;
    use std::fs::{File, OpenOptions};
    use std::io;
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::OpenOptionsExt;
    use std::path::Path;

    fn proc_path(file: &File) -> String {
        format!("/proc/self/fd/{}", file.as_raw_fd())
    }

    /// An unnamed file in `dir`, or `None` where the filesystem or kernel refuses them or
    /// `/proc` (needed to name it later) is missing.
    pub(super) fn create(dir: &Path) -> io::Result<Option<File>> {
        let file = match OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
            .mode(0o666)
            .open(dir)
        {
            Ok(f) => f,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
                ) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        if std::fs::symlink_metadata(proc_path(&file)).is_err() {
            return Ok(None);
        }
        Ok(Some(file))
    }

    /// `linkat(AT_FDCWD, "/proc/self/fd/N", AT_FDCWD, to, AT_SYMLINK_FOLLOW)`.
    fn link_to(file: &File, to: &Path) -> io::Result<()> {
        let from = CString::new(proc_path(file)).map_err(io::Error::other)?;
        let to = CString::new(to.as_os_str().as_bytes()).map_err(io::Error::other)?;
        // SAFETY: both pointers are NUL-terminated strings owned by this frame and alive for
        // the call; `file`'s descriptor (named by `from`) stays open during it.
        #[allow(unsafe_code)]
        let rc = unsafe {
            libc::linkat(
                libc::AT_FDCWD,
                from.as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Give the unnamed `file` the name `dest`, replacing any file there atomically.
    pub(super) fn link(file: &File, dir: &Path, dest: &Path) -> io::Result<()> {
        match link_to(file, dest) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let name = dest.file_name().unwrap_or(dest.as_os_str());
        loop {
            let temp = super::temp_name(dir, name);
            super::pending().push(temp.clone());
            match link_to(file, &temp) {
                Ok(()) => {}
                Err(e) => {
                    super::unregister(&temp);
                    if e.kind() == io::ErrorKind::AlreadyExists {
                        continue;
                    }
                    return Err(e);
                }
            }
            let renamed = std::fs::rename(&temp, dest);
            if renamed.is_err() {
                let _ = std::fs::remove_file(&temp);
            }
            super::unregister(&temp);
            return renamed;
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod unnamed {
    use std::fs::File;
    use std::io;
    use std::path::Path;

    /// No unnamed files here: always the named fallback.
    pub(super) fn create(_dir: &Path) -> io::Result<Option<File>> {
        Ok(None)
    }

    pub(super) fn link(_file: &File, _dir: &Path, _dest: &Path) -> io::Result<()> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

/// The temporary files of ours beside `dest` (`.NAME.tmp-<pid>-<n>` for `dest`'s NAME) left
/// by a process that is no longer running: debris of a write that was killed. Empty where
/// processes cannot be checked (outside unix). A process id since reused by an unrelated
/// process hides its files until that process ends.
pub fn stale_temp_files(dest: &Path) -> Vec<PathBuf> {
    let Some(name) = dest.file_name() else {
        return Vec::new();
    };
    let name = name.to_string_lossy().into_owned();
    stale_in(&parent_of(dest), |n| n == name)
}

/// [`stale_temp_files`] for every destination name in the folder `dir`.
pub fn stale_temp_files_in(dir: &Path) -> Vec<PathBuf> {
    stale_in(dir, |_| true)
}

/// Remove `paths` (as found by [`stale_temp_files`]); returns those removed.
pub fn remove_stale(paths: Vec<PathBuf>) -> Vec<PathBuf> {
    paths
        .into_iter()
        .filter(|p| std::fs::remove_file(p).is_ok())
        .collect()
}

fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn stale_in(dir: &Path, want: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| {
            let file_name = e.file_name();
            let Some((name, pid)) = file_name.to_str().and_then(parse_temp_name) else {
                return false;
            };
            want(name) && !process_running(pid)
        })
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// `.NAME.tmp-<pid>-<n>` -> (NAME, pid).
fn parse_temp_name(file_name: &str) -> Option<(&str, u32)> {
    let rest = file_name.strip_prefix('.')?;
    let (name, tail) = rest.rsplit_once(".tmp-")?;
    let (pid, n) = tail.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if name.is_empty() || !digits(pid) || !digits(n) {
        return None;
    }
    Some((name, pid.parse().ok()?))
}

/// Whether a process `pid` exists (unix: `kill(pid, 0)`); `true` where that cannot be told,
/// so nothing is ever taken for stale by mistake.
fn process_running(pid: u32) -> bool {
    #[cfg(unix)]
    {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return true;
        };
        if pid <= 0 {
            return true;
        }
        // SAFETY: signal 0 sends nothing; the call only checks that the process exists.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::kill(pid, 0) };
        rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
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

    /// Files in `dir`, sorted.
    fn listing(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn commit_and_drop() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out.bin");
        let mut f = AtomicFile::create(&dest, &[]).unwrap();
        f.file().write_all(b"hello").unwrap();
        assert!(!dest.exists());
        if f.is_unnamed() {
            // Nothing visible until the commit.
            assert!(f.temp_path().is_none());
            assert!(listing(dir.path()).is_empty());
        }
        f.commit().unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"hello");

        // Replacing an existing destination (the unnamed file is linked to a temporary name
        // and renamed over it).
        let mut f = AtomicFile::create(&dest, &[]).unwrap();
        f.file().write_all(b"second").unwrap();
        f.commit().unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"second");
        assert_eq!(listing(dir.path()), ["out.bin"]);

        let mut f = AtomicFile::create(&dest, &[]).unwrap();
        f.file().write_all(b"partial").unwrap();
        drop(f);
        assert_eq!(std::fs::read(&dest).unwrap(), b"second");
        assert_eq!(listing(dir.path()), ["out.bin"]);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn unnamed_on_linux() {
        // /tmp's filesystem (tmpfs, ext4, xfs, btrfs) supports O_TMPFILE.
        let dir = tempfile::tempdir().unwrap();
        let f = AtomicFile::create(&dir.path().join("x"), &[]).unwrap();
        assert!(f.is_unnamed());
        assert!(pending().iter().all(|p| !p.starts_with(dir.path())));
    }

    #[test]
    fn named_fallback_and_pending() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out.bin");
        let mut f = AtomicFile::create_with(&dest, &[], false).unwrap();
        let g = AtomicFile::create_with(&dir.path().join("other.bin"), &[], false).unwrap();
        assert!(!f.is_unnamed());
        f.file().write_all(b"partial").unwrap();
        let temp = f.temp_path().unwrap().to_path_buf();
        assert!(temp.exists());
        assert!(pending().contains(&temp));
        drop(g);
        assert_eq!(listing(dir.path()).len(), 1);
        // What a Ctrl-C handler does: the file goes, and the writer's commit then fails.
        let removed = remove_pending();
        assert!(removed.contains(&temp), "{removed:?}");
        assert!(listing(dir.path()).is_empty());
        assert!(f.commit().is_err());
        assert!(!dest.exists());
    }

    #[test]
    fn temp_names() {
        assert_eq!(
            parse_temp_name(".out.safetensors.tmp-123-0"),
            Some(("out.safetensors", 123))
        );
        assert_eq!(parse_temp_name(".a.tmp-b.tmp-7-12"), Some(("a.tmp-b", 7)));
        assert_eq!(parse_temp_name("out.safetensors.tmp-123-0"), None);
        assert_eq!(parse_temp_name(".out.tmp-12x-0"), None);
        assert_eq!(parse_temp_name(".out.tmp-12-"), None);
        assert_eq!(parse_temp_name("..tmp-1-0"), None);
    }

    #[cfg(unix)]
    #[test]
    fn stale_files_are_found_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out.pt");
        // A process id that is no running process: a child that has exited and been reaped.
        let dead = std::process::Command::new("true")
            .spawn()
            .map(|mut c| {
                let id = c.id();
                c.wait().unwrap();
                id
            })
            .unwrap();
        let stale = dir.path().join(format!(".out.pt.tmp-{dead}-0"));
        let other = dir.path().join(format!(".other.npz.tmp-{dead}-3"));
        let live = dir
            .path()
            .join(format!(".out.pt.tmp-{}-9", std::process::id()));
        let unrelated = dir.path().join(".out.pt.tmp-x");
        for p in [&stale, &other, &live, &unrelated] {
            std::fs::write(p, b"x").unwrap();
        }
        assert_eq!(stale_temp_files(&dest), vec![stale.clone()]);
        assert_eq!(
            stale_temp_files_in(dir.path()),
            [other.clone(), stale.clone()]
        );
        assert_eq!(remove_stale(stale_temp_files(&dest)), vec![stale.clone()]);
        assert!(!stale.exists() && other.exists() && live.exists() && unrelated.exists());
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
