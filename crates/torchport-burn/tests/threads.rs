//! One [`TorchportStore`] shared by many threads, each loading its own model from it (as a
//! service that builds a model per worker would): the store is `Send + Sync`, loading takes
//! `&self`, and every thread's model gets exactly the weights a single-threaded load gives.

mod common;

use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig, Lstm, LstmConfig};
use burn::tensor::{Device, Tensor};
use torchport_burn::TorchportStore;

#[derive(Module, Debug)]
struct Model {
    lstm: Lstm,
    linear: Linear,
}

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn the_store_is_send_and_sync() {
    assert_send_sync::<TorchportStore>();
}

fn bits<const D: usize>(p: &Param<Tensor<D>>) -> Vec<u32> {
    p.val().to_data().iter::<f32>().map(f32::to_bits).collect()
}

/// Every parameter of a freshly initialised model loaded through `store`, as bits.
fn loaded(store: &TorchportStore) -> Vec<Vec<u32>> {
    let device = Device::default();
    let model = Model {
        lstm: LstmConfig::new(10, 20, true).init(&device),
        linear: LinearConfig::new(20, 30).init(&device),
    };
    let (model, report) = store.load(model).unwrap();
    assert_eq!(report.applied.len(), 18, "{report}");
    assert!(model.lstm.forget_gate.is_some());
    let l = &model.lstm;
    let mut out = vec![
        bits(&model.linear.weight),
        bits(model.linear.bias.as_ref().unwrap()),
    ];
    let gates = [
        Some(&l.input_gate),
        l.forget_gate.as_ref(),
        Some(&l.output_gate),
        Some(&l.cell_gate),
    ];
    for gate in gates.into_iter().flatten() {
        for t in [&gate.input_transform, &gate.hidden_transform] {
            out.push(bits(&t.weight));
            out.push(bits(t.bias.as_ref().unwrap()));
        }
    }
    out
}

#[test]
fn one_store_loads_models_on_many_threads() {
    let store = TorchportStore::open(common::fixture("lstm_linear.pt")).unwrap();
    let want = loaded(&store);
    assert_eq!(want.len(), 18, "parameters compared");
    let loads: usize = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    (0..5)
                        .map(|_| usize::from(loaded(&store) == want))
                        .sum::<usize>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(loads, 20, "loads identical to the single-threaded one");
}
