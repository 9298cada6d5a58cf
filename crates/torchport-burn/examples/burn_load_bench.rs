//! Loading speed and memory, measured by benches/burn_load_bench.py (run that, not this).
//!
//!     burn_load_bench read FILE            read the file once (std::fs::read)
//!     burn_load_bench load FILE LAYERS N [linear|embedding]
//!                                          load it into LAYERS Linear(N, N) (every weight
//!                                          transposed on the way) or Embedding(N, N) (none)
//!
//! Prints one JSON line: seconds, and the process's peak resident memory (VmHWM) plus its
//! anonymous and file-backed resident memory at the end (from /proc/self/status), in bytes.

use std::time::Instant;

use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::tensor::Device;

#[derive(Module, Debug)]
struct Stack {
    layers: Vec<Linear>,
}

#[derive(Module, Debug)]
struct Embeddings {
    layers: Vec<Embedding>,
}

fn status(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, file) = match (args.first(), args.get(1)) {
        (Some(m), Some(f)) => (m.as_str(), f.as_str()),
        _ => return Err("usage: burn_load_bench read|load FILE [LAYERS N]".into()),
    };
    let start = Instant::now();
    match mode {
        "read" => {
            let bytes = std::fs::read(file)?;
            assert!(!bytes.is_empty(), "{file} is empty");
            report_memory(mode, start);
        }
        "load" => {
            let layers: usize = args.get(2).ok_or("LAYERS")?.parse()?;
            let n: usize = args.get(3).ok_or("N")?.parse()?;
            let device = Device::default();
            // Making the module is part of a user's load; Burn initializes parameters
            // lazily, so only the loaded tensors are ever allocated.
            let store = torchport_burn::TorchportStore::open(file)?;
            if args.get(4).map(String::as_str) == Some("embedding") {
                let model = Embeddings {
                    layers: (0..layers)
                        .map(|_| EmbeddingConfig::new(n, n).init(&device))
                        .collect(),
                };
                let (model, report) = store.load(model)?;
                assert!(report.is_complete(), "{report}");
                assert_eq!(model.num_params(), layers * n * n);
                // Measured while the model is alive.
                report_memory(mode, start);
            } else {
                let model = Stack {
                    layers: (0..layers)
                        .map(|_| LinearConfig::new(n, n).init(&device))
                        .collect(),
                };
                let (model, report) = store.load(model)?;
                assert!(report.is_complete(), "{report}");
                assert_eq!(model.num_params(), layers * (n * n + n));
                report_memory(mode, start);
            }
        }
        other => return Err(format!("unknown mode {other}").into()),
    }
    Ok(())
}

/// One JSON line: elapsed seconds and memory now (the model, if any, still alive).
fn report_memory(mode: &str, start: Instant) {
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{{\"mode\": \"{mode}\", \"seconds\": {secs:.4}, \"peak_rss\": {}, \"rss_anon\": {}, \"rss_file\": {}}}",
        status("VmHWM:"),
        status("RssAnon:"),
        status("RssFile:")
    );
}
