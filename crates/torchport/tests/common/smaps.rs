//! Resident bytes of this process's memory mappings of a file, from /proc/self/smaps, for the
//! tests that check pages of a mapped checkpoint are released (core, Burn, candle). Include it
//! with `#[path = ".../torchport/tests/common/smaps.rs"] mod smaps;`.

use std::path::{Path, PathBuf};

/// Resident bytes of this process's mappings of `path` (Linux; `None` elsewhere).
pub fn mapped_resident(path: &Path) -> Option<usize> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let want = std::fs::canonicalize(path).ok()?;
    let mut total = 0;
    let mut inside = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            // A mapping's header: address range, perms, offset, dev, inode, path.
            inside = line.split_whitespace().nth(5).map(PathBuf::from) == Some(want.clone());
        } else if inside && first == "Rss:" {
            let kb: usize = line
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            total += kb * 1024;
        }
    }
    Some(total)
}
