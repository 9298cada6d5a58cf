//! Loading speed and memory, measured by benches/burn_load_bench.py (run that, not this).
//!
//!     burn_load_bench read FILE            read the file once (std::fs::read)
//!     burn_load_bench load FILE LAYERS N [linear|embedding]
//!                                          load it with torchport_burn::load into LAYERS
//!                                          Linear(N, N) (every weight transposed on the
//!                                          way) or Embedding(N, N) (none)
//!     burn_load_bench burn-store FILE LAYERS N [linear|embedding]
//!                                          the same with burn-store's own reader:
//!                                          PytorchStore::from_file + load_from
//!
//! Prints one JSON line: seconds, and the process's peak resident memory (VmHWM) plus its
//! anonymous and file-backed resident memory at the end (from /proc/self/status), in bytes.

use std::time::Instant;

use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::tensor::Device;
use burn_store::ModuleSnapshot;

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
        _ => return Err("usage: burn_load_bench read|load|burn-store FILE [LAYERS N KIND]".into()),
    };
    let start = Instant::now();
    match mode {
        "read" => {
            let bytes = std::fs::read(file)?;
            assert!(!bytes.is_empty(), "{file} is empty");
            report_memory(mode, start);
        }
        "load" | "burn-store" => {
            let layers: usize = args.get(2).ok_or("LAYERS")?.parse()?;
            let n: usize = args.get(3).ok_or("N")?.parse()?;
            let device = Device::default();
            // Making the module is part of a user's load; Burn initializes parameters
            // lazily, so only the loaded tensors are ever allocated.
            if args.get(4).map(String::as_str) == Some("embedding") {
                let model = Embeddings {
                    layers: (0..layers)
                        .map(|_| EmbeddingConfig::new(n, n).init(&device))
                        .collect(),
                };
                let model = load(mode, file, model)?;
                assert_eq!(model.num_params(), layers * n * n);
                // Measured while the model is alive.
                report_memory(mode, start);
            } else {
                let model = Stack {
                    layers: (0..layers)
                        .map(|_| LinearConfig::new(n, n).init(&device))
                        .collect(),
                };
                let model = load(mode, file, model)?;
                assert_eq!(model.num_params(), layers * (n * n + n));
                report_memory(mode, start);
            }
        }
        other => return Err(format!("unknown mode {other}").into()),
    }
    Ok(())
}

/// Load `file` into `model` with torchport (`load`) or burn-store's `PytorchStore`, strictly.
fn load<M: Module>(mode: &str, file: &str, mut model: M) -> Result<M, Box<dyn std::error::Error>> {
    if mode == "load" {
        let (model, report) = torchport_burn::TorchportStore::open(file)?.load(model)?;
        assert!(report.is_complete(), "{report}");
        return Ok(model);
    }
    let mut store = burn_store::PytorchStore::from_file(file);
    let result = model.load_from(&mut store)?;
    assert!(result.is_success(), "{result}");
    Ok(model)
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
