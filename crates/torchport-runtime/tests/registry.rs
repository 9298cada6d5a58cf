//! A program loaded with a caller's registry runs the caller's kernels: `aten.relu.default`
//! replaced by a kernel that counts its calls and then computes relu still gives PyTorch's
//! outputs (tests/fixtures/export/conv1d), and is called once per relu node of the graph;
//! a registry without an op reports it as unsupported.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use torchport_runtime::npy::read_npy;
use torchport_runtime::ops::Registry;
use torchport_runtime::value::{one, Args, Outputs};
use torchport_runtime::Program;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/export")
        .join(name)
}

static RELU_CALLS: AtomicUsize = AtomicUsize::new(0);

fn counting_relu(args: &Args) -> torchport_runtime::error::OpResult<Outputs> {
    RELU_CALLS.fetch_add(1, Ordering::SeqCst);
    one(args.tensor("self")?.relu()?)
}

#[test]
fn a_replaced_kernel_is_the_one_that_runs() {
    let mut registry = Registry::with_all_ops();
    registry.add("aten.relu.default", counting_relu);
    let program = Program::load_with_registry(fixture("conv1d.decomp.pt2"), &registry).unwrap();
    let relus = program
        .exported_program()
        .graph_module
        .graph
        .nodes
        .iter()
        .filter(|n| n.target.ends_with("aten.relu.default"))
        .count();
    assert!(relus > 0);

    let x = read_npy(&fixture("conv1d.input_0.npy")).unwrap();
    let want = read_npy(&fixture("conv1d.output_0.npy")).unwrap();
    let got = program.run(&[x]).unwrap();
    assert_eq!(RELU_CALLS.load(Ordering::SeqCst), relus);
    let diff = (&got[0] - &want)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(diff <= 1e-4, "max abs diff {diff}");
}

#[test]
fn a_registry_without_the_op_reports_it() {
    let mut registry = Registry::new();
    registry.add("aten.convolution.default", counting_relu);
    let program = Program::load_with_registry(fixture("conv1d.decomp.pt2"), &registry).unwrap();
    assert_eq!(program.unsupported_ops(), ["aten.relu.default"]);
}
