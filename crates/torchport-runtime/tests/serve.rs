//! Serving: one loaded [`Program`] shared by many threads, each running it many times, as a
//! web service would. `Program` is `Send + Sync` (its graph, weights and kernel table are
//! read-only after loading; each run keeps its values in its own environment), so an
//! `Arc<Program>` — or a plain reference in scoped threads — is all a server needs.
//!
//! Checks: 8 threads × 200 runs give outputs bitwise identical to a single-threaded run, and
//! resident memory after all of them is within 10% of what it was after a first few runs
//! (nothing grows per run). The programs are real library models from `tests/fixtures/zoo/`
//! (torchvision's MobileNetV3-Small and transformers' BERT with an attention mask, small
//! configs, written by tests/fixtures/gen/gen_zoo.py).

use std::path::PathBuf;

use torchport_runtime::candle_core::{DType, Tensor};
use torchport_runtime::npy::read_npy;
use torchport_runtime::Program;

const THREADS: usize = 8;
const RUNS: usize = 200;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/zoo")
}

/// The zoo fixture `family`'s plain export and its inputs.
fn load(family: &str) -> (Program, Vec<Tensor>) {
    let program = Program::load(fixtures().join(format!("{family}.plain.pt2"))).unwrap();
    let inputs: Vec<Tensor> = (0..)
        .map(|i| fixtures().join(format!("{family}.input_{i}.npy")))
        .take_while(|p| p.exists())
        .map(|p| read_npy(&p).unwrap())
        .collect();
    (program, inputs)
}

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn program_is_send_and_sync() {
    // A compile-time check: this test exists to fail to build if a field stops being so.
    assert_send_sync::<Program>();
    assert_send_sync::<std::sync::Arc<Program>>();
}

/// Every output's values as bit patterns (f64 holds every f32/f16/int value exactly).
fn bits(outputs: &[Tensor]) -> Vec<Vec<u64>> {
    outputs
        .iter()
        .map(|t| {
            t.flatten_all()
                .unwrap()
                .to_dtype(DType::F64)
                .unwrap()
                .to_vec1::<f64>()
                .unwrap()
                .into_iter()
                .map(f64::to_bits)
                .collect()
        })
        .collect()
}

/// Resident memory of this process in bytes (`/proc/self/statm`), where there is one.
fn rss() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn serve(program: &Program, inputs: &[Tensor], want: &[Vec<u64>], runs: usize) -> usize {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    (0..runs)
                        .filter(|_| bits(&program.run(inputs).unwrap()) != want)
                        .count()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    })
}

#[test]
fn one_program_served_from_many_threads() {
    for family in ["tv_mobilenet_v3_small", "hf_bert_mask"] {
        let (program, inputs) = load(family);
        assert!(!inputs.is_empty());
        let want = bits(&program.run(&inputs).unwrap());
        assert!(want.iter().map(Vec::len).sum::<usize>() > 0);

        // A first few runs on every thread: allocator arenas and caches settle.
        assert_eq!(serve(&program, &inputs, &want, 5), 0, "{family}: warm-up");
        let before = rss();
        let differing = serve(&program, &inputs, &want, RUNS);
        let after = rss();
        assert_eq!(
            differing,
            0,
            "{family}: {differing} of {} concurrent runs differ from the single-threaded run",
            THREADS * RUNS
        );
        if let (Some(before), Some(after)) = (before, after) {
            eprintln!(
                "{family}: {} runs on {THREADS} threads; RSS {} -> {} KiB",
                THREADS * RUNS,
                before >> 10,
                after >> 10
            );
            assert!(
                after <= before + before / 10,
                "{family}: resident memory grew from {before} to {after} bytes over {} runs",
                THREADS * RUNS
            );
        }
    }
}

/// Runs started from inside a pool's own parallel loop (a caller that parallelises over
/// requests with rayon), on a pool of 4 threads and one of 2: each run's waiting threads
/// (`program.rs`, `wait_for_work`) are then jobs among the loop's own, and may be picked up
/// by a thread that is inside another run. Every run finishes, with the single-threaded
/// run's bits.
#[test]
fn runs_inside_the_pools_own_loops() {
    use rayon::prelude::*;
    let family = "hf_bert_mask";
    let (program, inputs) = load(family);
    let want = bits(&program.run(&inputs).unwrap());
    for threads in [4, 2] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let differing = pool.install(|| {
            (0..48)
                .into_par_iter()
                .filter(|_| bits(&program.run(&inputs).unwrap()) != want)
                .count()
        });
        assert_eq!(differing, 0, "{threads} threads");
    }
}
