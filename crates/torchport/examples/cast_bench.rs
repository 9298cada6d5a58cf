//! Timing of `torchport::cast::cast` for benches/cast_bench.py (which compares it with torch's
//! `.to(dtype)` in the same run): reads raw little-endian float32 from IN, casts it to float16
//! and bfloat16 RUNS times each, prints the median milliseconds per cast, and writes the
//! results to OUT.f16 / OUT.bf16 for the script to compare with torch's bytes. Also times the
//! old route (every value decoded into a `Vec<f64>`, then encoded), for before/after.
//!
//!     cargo run --release -p torchport --example cast_bench -- IN OUT RUNS

use std::time::Instant;

use torchport::cast::{cast, from_f64, to_f64};
use torchport::DType;

fn median_ms(runs: usize, mut f: impl FnMut() -> Vec<u8>) -> (f64, Vec<u8>) {
    let mut out = f(); // warm-up
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        out = std::hint::black_box(f());
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], out)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, input, out, runs] = &args[..] else {
        eprintln!("usage: cast_bench IN OUT RUNS");
        std::process::exit(2);
    };
    let runs: usize = runs.parse().expect("RUNS is a number");
    let bytes = std::fs::read(input).expect("read IN");
    let mib = bytes.len() as f64 / (1 << 20) as f64;
    for (to, ext) in [(DType::F16, "f16"), (DType::BF16, "bf16")] {
        let (ms, result) = median_ms(runs, || cast(&bytes, DType::F32, to).expect("cast"));
        std::fs::write(format!("{out}.{ext}"), &result).expect("write OUT");
        println!("float32->{to} direct {ms:.1} ms {mib:.0} MiB");
        let (ms, _) = median_ms(runs, || {
            from_f64(&to_f64(DType::F32, &bytes).expect("decode"), to).expect("encode")
        });
        println!("float32->{to} f64-route {ms:.1} ms {mib:.0} MiB");
    }
}
