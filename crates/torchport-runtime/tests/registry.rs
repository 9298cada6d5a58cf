//! A program loaded with a caller's registry runs the caller's kernels: `aten.relu.default`
//! replaced by a kernel that counts its calls and then computes relu still gives PyTorch's
//! outputs on torchvision's MobileNetV3-Small (the zoo fixture, decomposed), and is called
//! once per relu node of the graph; a registry without an op reports it as unsupported; a
//! kernel that panics makes the run fail with an error, not the caller; kernels run on a
//! thread of rayon's pool, the caller's own pool when it has one.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use torchport_runtime::ops::{OpFn, Registry};
use torchport_runtime::value::{one, Args, Outputs};
use torchport_runtime::Program;

#[path = "common/compare.rs"]
mod compare;
use compare::{numbered, output_mismatches};

fn zoo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/zoo")
}

const MODEL: &str = "tv_mobilenet_v3_small";

/// The zoo model, decomposed, loaded with every kernel of the crate but `relu`'s, which is
/// `kernel`.
fn with_relu(kernel: OpFn) -> Program {
    let mut registry = Registry::with_all_ops();
    registry.add("aten.relu.default", kernel);
    Program::load_with_registry(zoo().join(format!("{MODEL}.decomp.pt2")), &registry).unwrap()
}

static RELU_CALLS: AtomicUsize = AtomicUsize::new(0);

fn counting_relu(args: &Args) -> torchport_runtime::error::OpResult<Outputs> {
    RELU_CALLS.fetch_add(1, Ordering::SeqCst);
    one(args.tensor("self")?.relu()?)
}

#[test]
fn a_replaced_kernel_is_the_one_that_runs() {
    let program = with_relu(counting_relu);
    let relus = program
        .exported_program()
        .graph_module
        .graph
        .nodes
        .iter()
        .filter(|n| n.target.ends_with("aten.relu.default"))
        .count();
    assert!(relus > 0);

    let want = numbered(&zoo(), MODEL, "output");
    let got = program.run(&numbered(&zoo(), MODEL, "input")).unwrap();
    assert_eq!(RELU_CALLS.load(Ordering::SeqCst), relus);
    assert_eq!(
        output_mismatches(MODEL, &got, &want, |_| 1e-4),
        Vec::<String>::new()
    );
}

#[test]
fn a_registry_without_the_op_reports_it() {
    // Every kernel but relu's.
    let mut registry = Registry::new();
    for name in Registry::with_all_ops().names() {
        if name != "aten.relu.default" {
            registry.add(name, counting_relu);
        }
    }
    let program =
        Program::load_with_registry(zoo().join(format!("{MODEL}.decomp.pt2")), &registry).unwrap();
    assert_eq!(program.unsupported_ops(), ["aten.relu.default"]);
}

fn panicking_relu(_: &Args) -> torchport_runtime::error::OpResult<Outputs> {
    panic!("relu exploded")
}

#[test]
fn a_kernel_that_panics_gives_an_error_naming_the_node() {
    let program = with_relu(panicking_relu);
    let err = program
        .run(&numbered(&zoo(), MODEL, "input"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("aten.relu.default") && err.contains("the kernel failed: relu exploded"),
        "{err}"
    );
}

/// Set when a relu kernel ran on a thread outside rayon's pools.
static RELU_OFF_POOL: AtomicBool = AtomicBool::new(false);
/// The largest pool size a relu kernel saw.
static RELU_POOL_SIZE: AtomicUsize = AtomicUsize::new(0);

fn pool_noting_relu(args: &Args) -> torchport_runtime::error::OpResult<Outputs> {
    if rayon::current_thread_index().is_none() {
        RELU_OFF_POOL.store(true, Ordering::SeqCst);
    }
    RELU_POOL_SIZE.fetch_max(rayon::current_num_threads(), Ordering::SeqCst);
    one(args.tensor("self")?.relu()?)
}

#[test]
fn kernels_run_on_a_thread_of_the_callers_pool() {
    let program = with_relu(pool_noting_relu);
    let inputs = numbered(&zoo(), MODEL, "input");
    // Called from the test's own thread: the kernels still run in rayon's global pool.
    assert!(rayon::current_thread_index().is_none());
    program.run(&inputs).unwrap();
    assert!(!RELU_OFF_POOL.load(Ordering::SeqCst));
    // Called from inside a one-thread pool: they run there.
    RELU_POOL_SIZE.store(0, Ordering::SeqCst);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let got = pool.install(|| program.run(&inputs)).unwrap();
    assert!(!RELU_OFF_POOL.load(Ordering::SeqCst));
    assert_eq!(RELU_POOL_SIZE.load(Ordering::SeqCst), 1);
    let want = numbered(&zoo(), MODEL, "output");
    assert_eq!(
        output_mismatches(MODEL, &got, &want, |_| 1e-4),
        Vec::<String>::new()
    );
}
