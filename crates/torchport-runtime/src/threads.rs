//! Keeping each of the pool's threads on a CPU of its own (opt-in).
//!
//! A program's parallel loops run on rayon's pool, and a pool thread that waits for a piece
//! of a loop another thread took goes to sleep within microseconds. When it is woken, the
//! kernel may place it on the CPU of the thread that woke it, if the other CPU is busy at that
//! moment (another process's few milliseconds suffice), and may leave both there for the rest
//! of the run: on a 2-core machine, MobileNetV3-Large at batch 1 on 2 threads then took 12.3
//! ms a run where its runs back to back took 6.6 (`perf sched` showed the two threads taking
//! turns on one CPU for 37 ms of a 45 ms ResNet-18 run while the other sat idle; BENCHMARKS.md,
//! issue 14). [`pin_pool_threads`] builds the pool with each thread bound to one CPU, so none
//! can be moved onto another's. It is opt-in because it fixes the process's threads to CPUs:
//! right for a process that has those CPUs to itself, wrong for several that share them
//! (each would bind its threads to the same first CPUs).

/// Builds rayon's global pool with its threads bound one to a CPU, in the order of the CPUs
/// this process may run on, so that the kernel cannot move one onto another's CPU. The pool
/// gets as many threads as rayon would give it (`RAYON_NUM_THREADS`, else one per CPU the
/// process may run on). Call it before anything uses the pool (the first parallel loop builds
/// it). Returns whether it bound them: false where it does not apply (not Linux with glibc;
/// more threads than the CPUs the process may run on, which cannot each have one), and then
/// leaves the pool alone. Fails if the pool was built already.
pub fn pin_pool_threads() -> Result<bool, rayon::ThreadPoolBuildError> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let cpus = allowed_cpus();
        let threads = std::env::var("RAYON_NUM_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or(cpus.len());
        if threads == 0 || threads > cpus.len() {
            return Ok(false);
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .start_handler(move |i| bind_to(cpus[i % cpus.len()]))
            .build_global()?;
        Ok(true)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    Ok(false)
}

/// The CPUs this thread may run on (the process's, before any binding), in order.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn allowed_cpus() -> Vec<usize> {
    // SAFETY: `cpu_set_t` is plain bits (all zeros is the empty set), and `sched_getaffinity`
    // writes at most `size_of::<cpu_set_t>()` bytes into it; `CPU_ISSET` reads one bit of it.
    #[allow(unsafe_code)]
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Binds the calling thread to `cpu` (a failure leaves it unbound: only slower).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn bind_to(cpu: usize) {
    // SAFETY: as in `allowed_cpus`; `CPU_SET` sets one bit below `CPU_SETSIZE` (`cpu` came
    // from `allowed_cpus`), and `sched_setaffinity` only reads the set.
    #[allow(unsafe_code)]
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
