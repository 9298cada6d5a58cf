//! `retain_freed_memory`: a buffer allocated after an equal one was freed reuses its memory
//! instead of faulting in fresh pages. Its own test binary: the setting is process-wide.

/// Minor page faults of this process so far (field 10 of /proc/self/stat).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    rest.split(' ').nth(7).unwrap().parse().unwrap()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn freed_buffers_are_reused_without_page_faults() {
    const LEN: usize = 16 << 20; // 4096 pages: mapped afresh per allocation by default
    assert!(torchport_runtime::retain_freed_memory());
    let first = vec![1u8; LEN];
    assert_eq!(std::hint::black_box(&first)[LEN - 1], 1);
    drop(first);
    let before = minor_faults();
    let second = vec![2u8; LEN];
    assert_eq!(std::hint::black_box(&second)[LEN / 2], 2);
    let faults = minor_faults() - before;
    assert!(
        faults < 512,
        "{faults} page faults for a reused 16 MiB buffer"
    );
}
