//! Keeping the pool's threads off each other's CPUs: by default a waiting thread that finds
//! itself on the running thread's CPU moves itself off it ([`CpuWatch`]); opt-in, each thread
//! bound to a CPU of its own ([`pin_pool_threads`]).
//!
//! A program's parallel loops run on rayon's pool, and a pool thread that waits for a piece
//! of a loop another thread took goes to sleep within microseconds. When it is woken, the
//! kernel may place it on the CPU of the thread that woke it, if the other CPU is busy at that
//! moment (another process's few milliseconds suffice), and may leave both there for the rest
//! of the run: on a 2-core machine, MobileNetV3-Large at batch 1 on 2 threads then took 12.3
//! ms a run where its runs back to back took 6.6 (`perf sched` showed the two threads taking
//! turns on one CPU for 37 ms of a 45 ms ResNet-18 run while the other sat idle; BENCHMARKS.md,
//! issue 14). While a program runs, the pool's other threads wait for its next parallel loop
//! by looking for work (`program::wait_for_work`), and every 200 µs without any each checks
//! the CPU the running thread last ran on; if it is its own, it moves itself to another
//! (with 100 ms between runs, MobileNetV3-Large's 2-thread runs went from 10.5–11.2 to 6.7–7.1
//! ms). [`pin_pool_threads`] instead builds the pool with each thread bound to one CPU, so none
//! can be moved onto another's. It is opt-in because it fixes the process's threads to CPUs:
//! right for a process that has those CPUs to itself, wrong for several that share them
//! (each would bind its threads to the same first CPUs).

/// Leaves candle's own pool for elementwise ops without worker threads, unless the process
/// chose otherwise: sets `CANDLE_NUM_THREADS=1` when it is unset, and returns whether it did.
///
/// candle runs its binary and unary ops on 64 Ki values or more (the ops this crate leaves to
/// candle: broadcast or strided operands, for one) on a pool of its own, one worker per
/// thread beyond the first, and each worker spins a while after every op before it sleeps.
/// There it takes a CPU from the rayon threads that run the program's next kernels, and the
/// whole parallel loop waits for the piece on the shared CPU. With no workers those ops run
/// on the calling thread. At 2 threads, with workers / without (`run_timing` medians,
/// alternated): timm's gMLP-Ti 34.5-39.2 / 21.6-21.7 ms (one run 40.1), ResMLP-12 60.3 /
/// 42.7 ms, torchvision's Swin V2-T 91.0 / 72.6 ms; the eight models level
/// (BENCHMARKS.md, issue 14). `torchport run` calls it first thing.
///
/// Call it at the start of `main`, before any thread starts (it sets an environment
/// variable, which another thread reading the environment at the same time could see half
/// written) and before any tensor op (candle reads the variable once, when its pool starts).
pub fn candle_pool_without_workers() -> bool {
    if std::env::var_os("CANDLE_NUM_THREADS").is_some() {
        return false;
    }
    std::env::set_var("CANDLE_NUM_THREADS", "1");
    true
}

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
        let bound = cpus.clone();
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .start_handler(move |i| bind_to(bound[i % bound.len()]))
            .build_global()?;
        // The TorchScript evaluator's pool, if built later, binds its threads the same way.
        let _ = PINNED_CPUS.set(cpus);
        Ok(true)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    Ok(false)
}

/// The CPUs [`pin_pool_threads`] bound the global pool's threads to, in order.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
static PINNED_CPUS: std::sync::OnceLock<Vec<usize>> = std::sync::OnceLock::new();

/// The pool the TorchScript evaluator runs on (`ScriptProgram::run`): as many threads as the
/// pool of the first caller (rayon's global pool, unless called from inside another), each
/// with a stack of `stack` bytes (the evaluator's recursion needs more than a default thread
/// has), bound to CPUs as the global pool's if [`pin_pool_threads`] bound those. Built on
/// first use and kept; `None` where it could not be built (the threads' stacks refused,
/// say), for the caller to run the evaluator some other way.
pub(crate) fn script_pool(stack: usize) -> Option<&'static rayon::ThreadPool> {
    static POOL: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        let builder = rayon::ThreadPoolBuilder::new()
            .num_threads(rayon::current_num_threads())
            .stack_size(stack)
            .thread_name(|i| format!("torchport-script-{i}"));
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        let builder = match PINNED_CPUS.get() {
            Some(cpus) => builder.start_handler(move |i| bind_to(cpus[i % cpus.len()])),
            None => builder,
        };
        builder.build().ok()
    })
    .as_ref()
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

/// Where a waiting pool thread checks that it is not sharing a CPU with the thread running
/// the program (see [`CpuWatch`]).
///
/// Unbound, a pool thread woken while the other CPU was busy can be left on the running
/// thread's CPU for the rest of a run, the two taking turns (the module's notes). A waiting
/// thread that finds itself there moves itself off it once: its CPU set without that CPU,
/// then its own set back (the kernel moves a thread at once when its CPU leaves its set, and
/// does not move it back when the set grows again).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[derive(Clone, Copy)]
pub(crate) struct CpuWatch {
    /// The running thread's kernel thread id.
    runner: libc::pid_t,
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
impl CpuWatch {
    /// A watch on the calling thread (the one about to run the program).
    pub(crate) fn of_this_thread() -> CpuWatch {
        // SAFETY: `gettid` takes no arguments and cannot fail.
        #[allow(unsafe_code)]
        let runner = unsafe { libc::gettid() };
        CpuWatch { runner }
    }

    /// If the calling thread is on the running thread's CPU and may run on another, moves
    /// it to another; returns whether it did.
    pub(crate) fn step_aside(&self) -> bool {
        let Some(theirs) = cpu_of(self.runner) else {
            return false;
        };
        // SAFETY: `sched_getcpu` takes no arguments.
        #[allow(unsafe_code)]
        let mine = unsafe { libc::sched_getcpu() };
        if usize::try_from(mine).ok() != Some(theirs) {
            return false;
        }
        move_off(theirs)
    }
}

/// The CPU a thread of this process last ran on (field 39 of its `/proc` stat).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn cpu_of(tid: libc::pid_t) -> Option<usize> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(36)?.parse().ok()
}

/// Moves the calling thread off `cpu` (its CPU set without it, then the set back); false,
/// leaving it where it is, if `cpu` is the only one it may run on or a call fails.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn move_off(cpu: usize) -> bool {
    // SAFETY: as in `allowed_cpus`: plain bit sets, each call given their size.
    #[allow(unsafe_code)]
    unsafe {
        let size = std::mem::size_of::<libc::cpu_set_t>();
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu >= libc::CPU_SETSIZE as usize || libc::sched_getaffinity(0, size, &mut set) != 0 {
            return false;
        }
        let mut others = set;
        libc::CPU_CLR(cpu, &mut others);
        if libc::CPU_COUNT(&others) == 0 || libc::sched_setaffinity(0, size, &others) != 0 {
            return false;
        }
        libc::sched_setaffinity(0, size, &set);
        true
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    /// The CPU the calling thread is on.
    fn here() -> usize {
        // SAFETY: `sched_getcpu` takes no arguments.
        #[allow(unsafe_code)]
        let cpu = unsafe { libc::sched_getcpu() };
        usize::try_from(cpu).expect("sched_getcpu")
    }

    /// A thread that waits on the running thread's CPU moves to another and keeps its own
    /// CPU set; one on another CPU stays; one bound to a single CPU cannot move.
    #[test]
    fn a_waiting_thread_leaves_the_running_threads_cpu() {
        let cpus = allowed_cpus();
        if cpus.len() < 2 {
            return;
        }
        let a = cpus[0];
        // The running thread: bound to `a`, then asleep (its last CPU stays `a`).
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let runner = std::thread::spawn(move || {
            bind_to(a);
            assert_eq!(here(), a);
            ready_tx.send(CpuWatch::of_this_thread()).unwrap();
            rx.recv().unwrap();
        });
        let watch = ready_rx.recv().unwrap();
        std::thread::spawn(move || {
            // Onto `a`, then free to run anywhere again (the kernel leaves it on `a`).
            bind_to(a);
            assert!(!move_off(a), "a thread bound to one CPU cannot leave it");
            restore(&cpus);
            assert_eq!(here(), a);
            assert!(watch.step_aside());
            assert_ne!(here(), a);
            assert_eq!(allowed_cpus(), cpus, "its own CPU set back");
            assert!(!watch.step_aside(), "already elsewhere");
        })
        .join()
        .unwrap();
        tx.send(()).unwrap();
        runner.join().unwrap();
    }

    /// Lets the calling thread run on all of `cpus` again.
    fn restore(cpus: &[usize]) {
        // SAFETY: as in `bind_to`, with every CPU of `cpus` set.
        #[allow(unsafe_code)]
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &c in cpus {
                libc::CPU_SET(c, &mut set);
            }
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
}
