//! Keeping freed tensor memory in the process for the next tensors.
//!
//! A program run allocates a new buffer for nearly every node's output and frees it after its
//! last use. With glibc's default settings large buffers are mapped from the kernel and
//! unmapped on free, and freed memory at the top of the heap is given back, so many outputs
//! are zero-filled page by page on first touch: on EfficientNet-B0 at batch 8 that was a
//! quarter of the run time (BENCHMARKS.md, issue 14). Threads other than the main one
//! (rayon's, which run the program) get arenas of their own, made of 64 MiB heaps that are
//! unmapped as soon as they empty, and a larger buffer is mapped on its own: on ViT-S at
//! batch 8 on 2 threads that meant ten times the page faults of the main thread's heap.
//! [`retain_freed_memory`] is opt-in because it changes the whole process's allocator, not
//! just this crate's: the `torchport` CLI calls it; a program embedding the runtime decides
//! for itself.
//!
//! The weights a load decodes are the other large allocation: [`weight_written`] (and
//! [`weight_buffer`]) ask the kernel to back them with 2 MiB pages, which a load faults in
//! 512 times less often.

/// Allocations below this many bytes come from the allocator's heap (and go back to it when
/// freed) instead of being mapped from the kernel each time.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: i32 = 1 << 30;

/// Asks the C allocator to keep freed memory for reuse instead of returning it to the kernel,
/// so that a run's buffers are recycled rather than faulted in anew, and to serve every
/// thread from the main heap, to which those settings apply. Call it before starting threads:
/// a thread keeps the arena of its first allocation. Returns whether it applied: true with
/// glibc (Linux), false elsewhere (where nothing changes).
///
/// The process's resident memory then stays near its peak after a run instead of dropping
/// back. The peak was not raised on the models measured (EfficientNet-B0, ResNet-18).
pub fn retain_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` only sets glibc's allocation parameters (two thresholds and the
        // arena count); it takes the allocator's own lock and may be called at any time from
        // any thread.
        #[allow(unsafe_code)]
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX) == 1
                && libc::mallopt(libc::M_ARENA_MAX, 1) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// The size of a transparent huge page on x86-64 (and on aarch64 with 4 KiB pages); the
/// advice covers a buffer's whole aligned stretches of this size only.
const HUGE_PAGE: usize = 2 << 20;

/// A zeroed buffer of `len` f32 for weights laid out at build (the small convolutions'
/// packed weights, `ops/conv/small.rs`; a load's decoded weights and the arrays `npy.rs`
/// reads are written once into [`weight_written`] buffers instead). On Linux, the buffer's
/// whole aligned 2 MiB stretches are advised to the kernel as transparent huge pages
/// (`MADV_HUGEPAGE`), so that filling fresh memory takes one page fault (and one page
/// clear) per 2 MiB instead of one per 4 KiB:
/// copying 400 MB into fresh memory took 310–400 ms in small pages and 150 ms advised on
/// the benchmark machine (BENCHMARKS.md, issue 14). Only advice, and only inside the
/// buffer: where the kernel's setting is `never` or no huge page is free, the buffer is the
/// same, in small pages; a buffer under 2 MiB (or one holding no whole aligned stretch)
/// is not advised.
pub(crate) fn weight_buffer(len: usize) -> Vec<f32> {
    let buf = vec![0f32; len];
    advise_huge_pages(buf.as_ptr(), len);
    buf
}

/// An empty vector with room for `len` f32, advised as [`weight_buffer`] is, for values
/// written once into its spare capacity (not zeroed first): the Winograd transforms a load
/// computes (`ops::conv::winograd_weight`).
pub(crate) fn weight_space(len: usize) -> Vec<f32> {
    let buf = Vec::with_capacity(len);
    advise_huge_pages(buf.as_ptr(), len);
    buf
}

/// A buffer of `len` f32 in [`weight_space`]'s memory, each value written once by `fill`
/// into the spare capacity (no zeroing pass first: on a reused buffer the allocator's clear
/// was 4.8% of MobileNetV3-Large's load samples; BENCHMARKS.md, issue 14). An error from
/// `fill` is handed back and the buffer freed.
///
/// # Safety
///
/// When `fill` returns `Ok`, it has written every one of the `len` values it was given.
#[allow(unsafe_code)]
pub(crate) unsafe fn weight_written<E>(
    len: usize,
    fill: impl FnOnce(&mut [std::mem::MaybeUninit<f32>]) -> Result<(), E>,
) -> Result<Vec<f32>, E> {
    let mut buf = weight_space(len);
    fill(&mut buf.spare_capacity_mut()[..len])?;
    // SAFETY: the caller's contract: `fill` wrote all `len` values of the capacity.
    unsafe { buf.set_len(len) };
    Ok(buf)
}

/// [`weight_written`] for a `fill` that cannot fail.
///
/// # Safety
///
/// `fill` writes every one of the `len` values it is given.
#[allow(unsafe_code)]
pub(crate) unsafe fn weight_filled(
    len: usize,
    fill: impl FnOnce(&mut [std::mem::MaybeUninit<f32>]),
) -> Vec<f32> {
    let filled = |buf: &mut [std::mem::MaybeUninit<f32>]| {
        fill(buf);
        Ok::<(), std::convert::Infallible>(())
    };
    // SAFETY: the caller's contract, which is `weight_written`'s for a `fill` always `Ok`.
    match unsafe { weight_written(len, filled) } {
        Ok(buf) => buf,
        Err(never) => match never {},
    }
}

/// Advise the whole aligned 2 MiB stretches of the `len` values allocated from `at` as
/// transparent huge pages.
#[cfg_attr(not(target_os = "linux"), allow(unused_variables))]
fn advise_huge_pages(at: *const f32, len: usize) {
    #[cfg(target_os = "linux")]
    if let Some((start, end)) = huge_stretches(at as usize, len * 4) {
        // SAFETY: [start, end) lies inside `buf`'s allocation and is page-aligned;
        // MADV_HUGEPAGE changes only how the kernel backs those pages, never their contents.
        #[allow(unsafe_code)]
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

/// The whole aligned [`HUGE_PAGE`] stretches of the `bytes` bytes from address `addr`, as
/// `(start, end)` addresses; `None` when there is none.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn huge_stretches(addr: usize, bytes: usize) -> Option<(usize, usize)> {
    let start = addr.checked_next_multiple_of(HUGE_PAGE)?;
    let end = addr.checked_add(bytes)? / HUGE_PAGE * HUGE_PAGE;
    (end > start).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_stretches_lie_inside_the_buffer() {
        const M: usize = HUGE_PAGE;
        // Aligned both ends: all of it.
        assert_eq!(huge_stretches(4 * M, 3 * M), Some((4 * M, 7 * M)));
        // Rounded inward at both ends.
        assert_eq!(huge_stretches(4 * M + 16, 3 * M), Some((5 * M, 7 * M)));
        assert_eq!(huge_stretches(4 * M - 16, 2 * M + 32), Some((4 * M, 6 * M)));
        // No whole stretch inside.
        assert_eq!(huge_stretches(4 * M + 16, 2 * M - 32), None);
        assert_eq!(huge_stretches(4 * M + 16, M), None);
        assert_eq!(huge_stretches(4 * M, M - 4), None);
        assert_eq!(huge_stretches(4 * M, 0), None);
        assert_eq!(huge_stretches(usize::MAX - 8, 4), None);
    }

    /// The kernel records the advice on the mapping (`hg` in /proc/self/smaps' VmFlags),
    /// whether or not it then finds huge pages to back it.
    #[cfg(target_os = "linux")]
    #[test]
    fn weight_buffers_are_advised_as_huge_pages() {
        let buf = weight_buffer(3 << 20); // 12 MiB: at least five whole stretches
        assert_eq!(buf.len(), 3 << 20);
        assert!(buf.iter().all(|&v| v == 0.0));
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
        if thp.is_err() || thp.is_ok_and(|s| s.contains("[never]")) {
            return; // a kernel without transparent huge pages refuses the advice
        }
        let (start, _) = huge_stretches(buf.as_ptr() as usize, buf.len() * 4).unwrap();
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        let mut flags = None;
        for line in smaps.lines() {
            let range = line.split(' ').next().and_then(|r| r.split_once('-'));
            let bounds = range.and_then(|(a, b)| {
                Some((
                    usize::from_str_radix(a, 16).ok()?,
                    usize::from_str_radix(b, 16).ok()?,
                ))
            });
            if let Some((a, b)) = bounds {
                inside = a <= start && start < b;
            } else if inside && line.starts_with("VmFlags:") {
                flags = Some(line.to_string());
            }
        }
        let flags = flags.expect("the buffer's mapping is in /proc/self/smaps");
        assert!(flags.split_whitespace().any(|f| f == "hg"), "{flags}");
    }
}
