//! Latency of `Program::run` for benches/run_bench.py: load once, warm up, time N runs.
//!
//! ```sh
//! cargo run --release -p torchport-runtime --example run_timing -- MODEL.pt2 X.npy [Y.npy ...] --runs 20
//! ```
//! Prints one JSON line: {"load_ms", "median_ms", "min_ms", "cpu_ms", "runs"}; cpu_ms is the
//! process's CPU time (all threads, from /proc/self/stat, 10 ms ticks) per timed run, which a
//! busy machine inflates less than wall time. Threads: RAYON_NUM_THREADS.
//! With TORCHPORT_PROFILE set, also prints the slowest operators (stderr).

use std::time::Instant;

use torchport_runtime::npy::read_npy;
use torchport_runtime::Program;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut runs = 10usize;
    if let Some(i) = args.iter().position(|a| a == "--runs") {
        runs = args.get(i + 1).ok_or("--runs needs a number")?.parse()?;
        args.drain(i..i + 2);
    }
    let model = args
        .first()
        .ok_or("usage: run_timing MODEL.pt2 INPUT.npy... [--runs N]")?;
    let t0 = Instant::now();
    let program = Program::load(model)?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let inputs = args[1..]
        .iter()
        .map(|p| read_npy(p.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    program.run(&inputs)?; // warm-up
    let mut times = Vec::with_capacity(runs);
    let cpu0 = cpu_ticks();
    for _ in 0..runs {
        let t = Instant::now();
        let out = program.run(&inputs)?;
        std::hint::black_box(out);
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let cpu_ms = match (cpu0, cpu_ticks()) {
        (Some(a), Some(b)) => (b - a) as f64 * 10.0 / runs.max(1) as f64,
        _ => f64::NAN,
    };
    times.sort_by(f64::total_cmp);
    if std::env::var_os("TORCHPORT_PROFILE").is_some() {
        let (_, ops) = program.profile(&inputs)?;
        for o in ops.iter().take(12) {
            eprintln!(
                "{:>9.2} ms {:>4}x {}",
                o.total.as_secs_f64() * 1e3,
                o.count,
                o.op
            );
        }
    }
    println!(
        "{{\"load_ms\": {load_ms:.2}, \"median_ms\": {:.3}, \"min_ms\": {:.3}, \"cpu_ms\": {cpu_ms:.1}, \"runs\": {runs}}}",
        times[times.len() / 2],
        times[0]
    );
    Ok(())
}

/// User + system CPU time of this process so far, in clock ticks (Linux; `None` elsewhere).
fn cpu_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}
