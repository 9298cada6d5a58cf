//! `retain_freed_memory`: a buffer allocated after an equal one was freed reuses its memory
//! instead of faulting in fresh pages, on the main thread and on others (rayon's workers run
//! the program). Its own test binary without the test harness: the setting is process-wide
//! and applies to threads started after it, so `main` makes it before any thread exists and
//! then runs the checks one after another (page faults are counted for the whole process).

/// Minor page faults of this process so far (field 10 of /proc/self/stat).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    rest.split(' ').nth(7).unwrap().parse().unwrap()
}

/// Page faults while allocating and touching a `len`-byte buffer.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn faults_of_allocating(len: usize) -> u64 {
    let before = minor_faults();
    let v = vec![2u8; len];
    assert_eq!(std::hint::black_box(&v)[len / 2], 2);
    minor_faults() - before
}

/// Allocate and touch a `len`-byte buffer, then free it.
fn allocate_and_free(len: usize) {
    let v = vec![1u8; len];
    assert_eq!(std::hint::black_box(&v)[len - 1], 1);
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn main() {
    assert!(torchport_runtime::retain_freed_memory());

    // 4096 pages: mapped afresh per allocation by default.
    const SMALL: usize = 16 << 20;
    allocate_and_free(SMALL);
    let faults = faults_of_allocating(SMALL);
    assert!(
        faults < 512,
        "{faults} page faults for a reused 16 MiB buffer"
    );

    // Larger than a per-thread arena's 64 MiB heap, freed on one thread and allocated again
    // on another.
    const LARGE: usize = 96 << 20;
    std::thread::spawn(|| allocate_and_free(LARGE))
        .join()
        .unwrap();
    let faults = std::thread::spawn(|| faults_of_allocating(LARGE))
        .join()
        .unwrap();
    assert!(
        faults < 1024,
        "{faults} page faults for a reused 96 MiB buffer"
    );
    println!("freed buffers are reused on the main thread and across threads");
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn main() {
    assert!(!torchport_runtime::retain_freed_memory());
}
