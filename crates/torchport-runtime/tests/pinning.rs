//! `pin_pool_threads`: rayon's global pool built with each thread bound to a CPU of its own,
//! the calling thread left as it was. Its own test binary without the test harness: the pool
//! is process-wide and the harness's threads would build it first.

/// The CPUs the calling thread may run on, from its `Cpus_allowed_list` ("0-3,6").
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn allowed() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim();
    list.split(',')
        .flat_map(|part| match part.split_once('-') {
            Some((a, b)) => a.parse::<usize>().unwrap()..=b.parse().unwrap(),
            None => {
                let c = part.parse::<usize>().unwrap();
                c..=c
            }
        })
        .collect()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn main() {
    use rayon::prelude::*;
    let before = allowed();
    let threads = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(before.len());
    let pinned = torchport_runtime::pin_pool_threads().unwrap();
    if threads > before.len() {
        // More threads than CPUs: left alone.
        assert!(!pinned);
        return;
    }
    assert!(pinned, "{threads} threads on CPUs {before:?}");
    assert_eq!(rayon::current_num_threads(), threads);
    // Each pool thread on one CPU of the process's, no two on the same one.
    let mut per_thread = rayon::broadcast(|_| allowed());
    assert!(
        per_thread.iter().all(|cpus| cpus.len() == 1),
        "{per_thread:?}"
    );
    per_thread.sort();
    per_thread.dedup();
    assert_eq!(per_thread.len(), threads, "{per_thread:?}");
    assert!(per_thread.iter().all(|c| before.contains(&c[0])));
    // The calling thread keeps all of them; the pool is built, once.
    assert_eq!(allowed(), before);
    assert!(torchport_runtime::pin_pool_threads().is_err());
    // And it computes.
    let sum: u64 = (0..100_000u64).into_par_iter().sum();
    assert_eq!(sum, 100_000 * 99_999 / 2);
    println!("{threads} pool threads bound one to a CPU of {before:?}");
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn main() {
    assert!(!torchport_runtime::pin_pool_threads().unwrap());
}
