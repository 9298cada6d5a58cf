//! Throughput of one [`Program`] served from several threads at once (for
//! benches/serve_bench.py): load once, then for each thread count N run it from N threads
//! for a fixed time and count runs.
//!
//! ```sh
//! cargo run --release -p torchport-runtime --example serve_throughput -- \
//!     MODEL.pt2 X.npy [Y.npy ...] [--threads 1,2,16] [--seconds 3]
//! ```
//! Prints one JSON line per thread count: {"threads", "runs", "seconds", "runs_per_s"}.
//! Kernel-internal parallelism follows RAYON_NUM_THREADS (the bench sets it to 1, so the
//! serving threads are the only parallelism); each run uses `Program::run_here`, so that it
//! stays on its serving thread instead of queueing for the pool's.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use torchport_runtime::npy::read_npy;
use torchport_runtime::Program;

fn take_flag(args: &mut Vec<String>, flag: &str) -> Option<String> {
    let i = args.iter().position(|a| a == flag)?;
    let value = args.get(i + 1).cloned();
    args.drain(i..(i + 2).min(args.len()));
    value
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let threads: Vec<usize> = take_flag(&mut args, "--threads")
        .unwrap_or_else(|| "1,2".into())
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let seconds: f64 = take_flag(&mut args, "--seconds")
        .unwrap_or_else(|| "3".into())
        .parse()?;
    let model = args
        .first()
        .ok_or("usage: serve_throughput MODEL.pt2 INPUT.npy... [--threads 1,2] [--seconds 3]")?;
    let program = Program::load(model)?;
    let inputs = args[1..]
        .iter()
        .map(|p| read_npy(p.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    program.run_here(&inputs)?; // warm-up
    for &n in &threads {
        let stop = AtomicBool::new(false);
        let runs = AtomicUsize::new(0);
        let start = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..n {
                s.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::black_box(program.run_here(&inputs).expect("run"));
                        runs.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
            std::thread::sleep(Duration::from_secs_f64(seconds));
            stop.store(true, Ordering::Relaxed);
        });
        let elapsed = start.elapsed().as_secs_f64();
        let runs = runs.load(Ordering::Relaxed);
        println!(
            "{{\"threads\": {n}, \"runs\": {runs}, \"seconds\": {elapsed:.3}, \"runs_per_s\": {:.1}}}",
            runs as f64 / elapsed
        );
    }
    Ok(())
}
