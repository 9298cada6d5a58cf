//! Latency of `Program::run` for benches/run_bench.py: load once, warm up, time N runs.
//!
//! ```sh
//! cargo run --release -p torchport-runtime --example run_timing -- MODEL.pt2 X.npy [Y.npy ...] --runs 20
//! ```
//! MODEL may also be a TorchScript archive (`torch.jit.save`), run by `ScriptProgram` (no
//! per-node profile there; how each signature of inputs ran, as a graph or interpreted, goes to
//! stderr); with TORCHPORT_INTERPRET set (to any value), by `ScriptProgram::interpret`, never
//! as a graph (for comparison).
//! With `--serve` instead of `--runs`, it prints `ready` after the warm-up, then runs once for
//! each line it reads on stdin and prints that run's milliseconds, until stdin closes; then
//! the JSON line below over those runs (how benches/run_bench.py --paired alternates engines
//! run by run).
//! Prints one JSON line: {"load_ms", "load_again_ms", "load_cpu_ms", "read_ms", "read_fresh_ms", "file_mb", "load_rss_mb",
//! "peak_rss_mb", "median_ms", "min_ms", "cpu_ms", "runs"}; cpu_ms is the process's CPU time
//! (all threads, from /proc/self/stat, 10 ms ticks) per timed run, which a busy machine
//! inflates less than wall time; load_cpu_ms is that of `Program::load`. read_ms is the time to
//! read the whole archive (`cat FILE > /dev/null`: 1 MiB chunks into one reused buffer) from
//! a warm page cache, measured before the load (after one read that warms the cache): the
//! baseline the load time is compared with; read_fresh_ms that of `std::fs::read` (the whole
//! file into newly allocated memory, which the kernel must map page by page, as a load must
//! for the weights it keeps), measured at the end. load_rss_mb is the process's resident memory
//! right after the load, peak_rss_mb its peak (VmHWM) at the end: load and all runs
//! (Linux; NaN elsewhere). Threads: RAYON_NUM_THREADS. Calls `retain_freed_memory` first, as
//! the CLI does (with TORCHPORT_RETURN_FREED set, to any value, it does not: for comparison).
//! With TORCHPORT_PIN_THREADS set (to any value), calls `pin_pool_threads` first, as the CLI
//! does: each pool thread bound to a CPU of its own. Calls `candle_pool_without_workers`
//! first, as the CLI does (set CANDLE_NUM_THREADS to keep candle's own pool: for comparison).
//! With `--loads N` (N > 1), the program is dropped at the end and loaded N - 1 more times:
//! load_again_ms is the least of those loads (NaN without), which write the memory the first
//! load's weights freed instead of fresh pages (on the benchmark machine, a VM, a fresh page
//! cost up to ten times more to touch than a recycled one: BENCHMARKS.md, issue 14).
//! With TORCHPORT_PROFILE set, also prints the slowest operators (stderr); set to a number N,
//! each node's time is its least over N profiled runs (a busy machine only adds time), an
//! operator's the sum of its nodes'. With TORCHPORT_PROFILE_NODES=K too, then the K slowest
//! nodes, each with its operator and output shape. Then one line of the profiled runs' medians
//! (over runs 2..=N): the run's wall time and its nodes' times summed, whose difference is
//! the time between nodes. With TORCHPORT_PROFILE_TABLE=FILE too, every node in the graph's
//! order goes into FILE, a line each: its median and least milliseconds over the N runs, its
//! name, operator and output shape (for matching layers across builds or engines).

use std::time::Instant;

use torchport_runtime::candle_core::Tensor;
use torchport_runtime::npy::read_npy;
use torchport_runtime::{Program, ScriptProgram};

/// What `run_timing` times: an exported program, or a TorchScript archive (run by the
/// TorchScript front end; no per-node profile there).
#[allow(clippy::large_enum_variant)] // one value, held for the whole run
enum Model {
    Program(Program),
    /// The archive, and whether to interpret every run.
    Script(ScriptProgram, bool),
}

impl Model {
    fn load(path: &str, script: bool) -> torchport_runtime::Result<Model> {
        Ok(match script {
            true => Model::Script(
                ScriptProgram::load(path)?,
                std::env::var_os("TORCHPORT_INTERPRET").is_some(),
            ),
            false => Model::Program(Program::load(path)?),
        })
    }

    fn run(&self, inputs: &[Tensor]) -> torchport_runtime::Result<Vec<Tensor>> {
        match self {
            Model::Program(p) => p.run(inputs),
            Model::Script(p, false) => p.run(inputs),
            Model::Script(p, true) => p.interpret(inputs),
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // As the CLI does, unless CANDLE_NUM_THREADS is set (for comparison).
    torchport_runtime::candle_pool_without_workers();
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut runs = 10usize;
    if let Some(i) = args.iter().position(|a| a == "--runs") {
        runs = args.get(i + 1).ok_or("--runs needs a number")?.parse()?;
        args.drain(i..i + 2);
    }
    let mut loads = 1usize;
    if let Some(i) = args.iter().position(|a| a == "--loads") {
        loads = args.get(i + 1).ok_or("--loads needs a number")?.parse()?;
        args.drain(i..i + 2);
    }
    if std::env::var_os("TORCHPORT_PIN_THREADS").is_some() {
        torchport_runtime::pin_pool_threads()?;
    }
    let serve = args.iter().any(|a| a == "--serve");
    args.retain(|a| a != "--serve");
    let model = args
        .first()
        .ok_or("usage: run_timing MODEL.pt2 INPUT.npy... [--runs N | --serve] [--loads N]")?;
    let (read_ms, file_bytes) = {
        read_all(model.as_ref())?; // warm the page cache
        let t = Instant::now();
        let n = read_all(model.as_ref())?;
        (t.elapsed().as_secs_f64() * 1e3, n)
    };
    // As the `torchport run` CLI does: freed buffers are recycled, not faulted in anew.
    if std::env::var_os("TORCHPORT_RETURN_FREED").is_none() {
        torchport_runtime::retain_freed_memory();
    }
    let script = ScriptProgram::is_torchscript(model)?;
    let cpu_load0 = cpu_ticks();
    let t0 = Instant::now();
    let program = Model::load(model, script)?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let load_cpu_ms = match (cpu_load0, cpu_ticks()) {
        (Some(a), Some(b)) => (b - a) as f64 * 10.0,
        _ => f64::NAN,
    };
    let load_rss_mb = proc_status_mb("VmRSS:");
    let inputs = args[1..]
        .iter()
        .map(|p| read_npy(p.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    program.run(&inputs)?; // warm-up
    let mut times = Vec::with_capacity(runs);
    let mut timed_run = || -> Result<f64, Box<dyn std::error::Error>> {
        let t = Instant::now();
        let out = program.run(&inputs)?;
        std::hint::black_box(out);
        let ms = t.elapsed().as_secs_f64() * 1e3;
        times.push(ms);
        Ok(ms)
    };
    let cpu0 = cpu_ticks();
    if serve {
        // One run per line read, its time printed at once: the caller interleaves these runs
        // with other engines' (benches/run_bench.py --paired).
        use std::io::{BufRead, Write};
        let mut stdout = std::io::stdout();
        writeln!(stdout, "ready")?;
        stdout.flush()?;
        for line in std::io::stdin().lock().lines() {
            line?;
            let ms = timed_run()?;
            writeln!(stdout, "{ms:.4}")?;
            stdout.flush()?;
        }
    } else {
        for _ in 0..runs {
            timed_run()?;
        }
    }
    let runs = times.len();
    let cpu_ms = match (cpu0, cpu_ticks()) {
        (Some(a), Some(b)) => (b - a) as f64 * 10.0 / runs.max(1) as f64,
        _ => f64::NAN,
    };
    times.sort_by(f64::total_cmp);
    let profile = std::env::var_os("TORCHPORT_PROFILE");
    if let (Some(_), Model::Script(..)) = (&profile, &program) {
        eprintln!("TORCHPORT_PROFILE: no per-node profile for a TorchScript archive");
    }
    if let Model::Script(p, _) = &program {
        for (sizes, how) in p.specialisations() {
            eprintln!("inputs {sizes:?}: {how:?}");
        }
    }
    if let (Some(p), Model::Program(program)) = (profile, &program) {
        let n: usize = p.to_str().and_then(|s| s.parse().ok()).unwrap_or(1).max(1);
        let ms = |t: std::time::Duration| t.as_secs_f64() * 1e3;
        // Every node's time in each of the n runs (in graph order), and each run's wall time
        // but the first's.
        let mut nodes = program.profile_nodes(&inputs)?.1;
        let node_times = |run: &[torchport_runtime::NodeTime]| -> Vec<std::time::Duration> {
            run.iter().map(|t| t.time).collect()
        };
        let mut per_run = vec![node_times(&nodes)];
        let mut walls = Vec::with_capacity(n);
        for _ in 1..n {
            let t0 = Instant::now();
            let run = program.profile_nodes(&inputs)?.1;
            walls.push(t0.elapsed());
            per_run.push(node_times(&run));
        }
        let median = |mut v: Vec<std::time::Duration>| {
            v.sort();
            v.get(v.len() / 2).map_or(f64::NAN, |&t| ms(t))
        };
        // Each node's time is its least over the runs; its median goes into the table.
        let medians: Vec<f64> = (0..nodes.len())
            .map(|i| median(per_run.iter().map(|r| r[i]).collect()))
            .collect();
        for (i, node) in nodes.iter_mut().enumerate() {
            node.time = per_run.iter().map(|r| r[i]).min().unwrap_or(node.time);
        }
        if let Some(path) = std::env::var_os("TORCHPORT_PROFILE_TABLE") {
            let mut table = String::new();
            for (node, m) in nodes.iter().zip(&medians) {
                let (name, op, shape) = (&node.node, &node.op, &node.shape);
                let least = ms(node.time);
                table += &format!("{m:.4} {least:.4} {name} {op} {shape:?}\n");
            }
            std::fs::write(path, table)?;
        }
        let in_nodes = median(per_run.iter().skip(1).map(|r| r.iter().sum()).collect());
        let mut ops: std::collections::HashMap<&str, (std::time::Duration, usize)> =
            std::collections::HashMap::new();
        for node in &nodes {
            let e = ops.entry(&node.op).or_default();
            *e = (e.0 + node.time, e.1 + 1);
        }
        let mut ops: Vec<_> = ops.into_iter().collect();
        ops.sort_by_key(|(_, (t, _))| std::cmp::Reverse(*t));
        for (op, (total, count)) in ops.iter().take(12) {
            eprintln!("{:>9.2} ms {count:>4}x {op}", ms(*total));
        }
        let shown: usize = std::env::var("TORCHPORT_PROFILE_NODES")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        nodes.sort_by_key(|node| std::cmp::Reverse(node.time));
        for node in nodes.iter().take(shown) {
            let (name, op, shape) = (&node.node, &node.op, &node.shape);
            eprintln!("{:>9.3} ms  {name} {op} {shape:?}", ms(node.time));
        }
        if n > 1 {
            eprintln!(
                "profiled runs, medians: {:.3} ms a run, {in_nodes:.3} ms in its nodes",
                median(walls)
            );
        }
    }
    let peak_rss_mb = proc_status_mb("VmHWM:");
    // After the peak is taken: this read holds the whole file in memory at once.
    let read_fresh_ms = {
        let t = Instant::now();
        let bytes = std::fs::read(model)?;
        std::hint::black_box(&bytes);
        t.elapsed().as_secs_f64() * 1e3
    };
    drop(program);
    let mut load_again_ms = f64::NAN;
    for _ in 1..loads {
        let t = Instant::now();
        let again = Model::load(model, script)?;
        load_again_ms = load_again_ms.min(t.elapsed().as_secs_f64() * 1e3);
        drop(again);
    }
    let file_mb = file_bytes as f64 / 1e6;
    println!(
        "{{\"load_ms\": {load_ms:.2}, \"load_again_ms\": {load_again_ms:.2}, \"load_cpu_ms\": {load_cpu_ms:.1}, \"read_ms\": {read_ms:.2}, \"read_fresh_ms\": {read_fresh_ms:.2}, \"file_mb\": {file_mb:.1}, \"load_rss_mb\": {load_rss_mb:.1}, \"peak_rss_mb\": {peak_rss_mb:.1}, \"median_ms\": {:.3}, \"min_ms\": {:.3}, \"cpu_ms\": {cpu_ms:.1}, \"runs\": {runs}}}",
        times.get(times.len() / 2).copied().unwrap_or(f64::NAN),
        times.first().copied().unwrap_or(f64::NAN)
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

/// Read the whole file in 1 MiB chunks into one reused buffer (what `cat FILE > /dev/null`
/// does); returns the number of bytes read.
fn read_all(path: &std::path::Path) -> std::io::Result<u64> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        match f.read(&mut buf)? {
            0 => return Ok(n),
            k => n += k as u64,
        }
    }
}

/// A `kB` field of /proc/self/status (`VmRSS:`, `VmHWM:`) in MB; NaN where there is none.
fn proc_status_mb(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb * 1024.0 / 1e6)
}
