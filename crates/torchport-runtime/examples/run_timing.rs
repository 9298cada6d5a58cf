//! Latency of `Program::run` for benches/run_bench.py: load once, warm up, time N runs.
//!
//! ```sh
//! cargo run --release -p torchport-runtime --example run_timing -- MODEL.pt2 X.npy [Y.npy ...] --runs 20
//! ```
//! Prints one JSON line: {"load_ms", "median_ms", "min_ms", "runs"}. Threads: RAYON_NUM_THREADS.
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
    for _ in 0..runs {
        let t = Instant::now();
        let out = program.run(&inputs)?;
        std::hint::black_box(out);
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
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
        "{{\"load_ms\": {load_ms:.2}, \"median_ms\": {:.3}, \"min_ms\": {:.3}, \"runs\": {runs}}}",
        times[times.len() / 2],
        times[0]
    );
    Ok(())
}
