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
