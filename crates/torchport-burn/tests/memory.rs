//! Loading into Burn holds the model plus about one tensor, never a second copy of the
//! checkpoint: a counting global allocator measures the peak heap while loading a torch.save
//! file through every adapter (transpose, LSTM gate split, as-is, f16 -> f32 cast), and
//! /proc/self/smaps shows how much of the memory-mapped file stays resident afterwards.
//! Its own test binary (the allocator counts everything the binary does), one test, so
//! nothing else allocates while it measures.

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, Lstm, LstmConfig};
use burn::tensor::{Device, Tensor};
use torchport::DType;
use torchport_burn::TorchportStore;

#[path = "../../torchport/tests/common/counting_alloc.rs"]
mod counting_alloc;
#[path = "../../torchport/tests/common/smaps.rs"]
mod smaps;
#[path = "../../torchport/tests/common/synthetic.rs"]
mod synthetic;
use counting_alloc::peak;
use smaps::mapped_resident;
use synthetic::{model_and_largest, value, write_checkpoint};

/// Width of every layer.
const D: usize = 256;
/// Embedding rows.
const V: usize = 1024;
/// Linear layers.
const LAYERS: usize = 8;
/// Heap the loader may use besides the model and one tensor: names, the plan, the report,
/// Burn's module bookkeeping.
const SLACK: usize = 512 << 10;

#[derive(Module, Debug)]
struct Net {
    embed: Embedding,
    layers: Vec<Linear>,
    lstm: Lstm,
}

impl Net {
    fn new(device: &Device) -> Self {
        Net {
            embed: EmbeddingConfig::new(V, D).init(device),
            layers: (0..LAYERS)
                .map(|_| LinearConfig::new(D, D).init(device))
                .collect(),
            lstm: LstmConfig::new(D, D, true).init(device),
        }
    }
}

/// PyTorch's tensors for `Net` (names and layouts as torch.save writes them), float32 values
/// that differ everywhere: `value(k, i)` is element `i` of tensor `k`.
fn pytorch_tensors() -> Vec<(String, Vec<usize>)> {
    let mut t = vec![("embed.weight".to_string(), vec![V, D])];
    for l in 0..LAYERS {
        t.push((format!("layers.{l}.weight"), vec![D, D]));
        t.push((format!("layers.{l}.bias"), vec![D]));
    }
    for (n, s) in [
        ("weight_ih_l0", vec![4 * D, D]),
        ("weight_hh_l0", vec![4 * D, D]),
        ("bias_ih_l0", vec![4 * D]),
        ("bias_hh_l0", vec![4 * D]),
    ] {
        t.push((format!("lstm.{n}"), s));
    }
    t
}

/// Calls `val()` on every parameter, so a lazily initialised module materialises its
/// random weights (as one that has been used would have).
struct Materialise;

impl ModuleVisitor for Materialise {
    fn visit_float<const N: usize>(&mut self, param: &Param<Tensor<N>>) {
        std::hint::black_box(param.val());
    }
}

/// The loaded module holds PyTorch's values, through each adapter.
fn check_values(net: &Net, scale_tol: f32) {
    let names: Vec<String> = pytorch_tensors().into_iter().map(|(n, _)| n).collect();
    let k = |name: &str| names.iter().position(|n| n == name).unwrap();
    let close = |got: f32, want: f32, what: &str| {
        assert!((got - want).abs() <= scale_tol, "{what}: {got} vs {want}");
    };
    // Embedding: as is.
    let e: Vec<f32> = net
        .embed
        .weight
        .val()
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    close(
        e[3 * D + 5],
        value(k("embed.weight"), 3 * D + 5),
        "embed[3][5]",
    );
    // Linear: Burn's [in, out] is PyTorch's [out, in] transposed.
    let w: Vec<f32> = net.layers[2]
        .weight
        .val()
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    close(
        w[7 * D + 11],
        value(k("layers.2.weight"), 11 * D + 7),
        "layers.2 w[7][11]",
    );
    // LSTM: the cell gate (PyTorch's third block of rows) of the input weights, transposed.
    let g: Vec<f32> = net
        .lstm
        .cell_gate
        .input_transform
        .weight
        .val()
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    close(
        g[5 * D + 9],
        value(k("lstm.weight_ih_l0"), (2 * D + 9) * D + 5),
        "lstm cell gate",
    );
}

#[test]
fn loading_holds_the_model_plus_one_tensor() {
    let dir = std::env::temp_dir().join(format!("torchport-burn-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f32_file = dir.join("net.pt");
    let f16_file = dir.join("net-f16.pt");
    let extra_file = dir.join("net-extra.pt");
    write_checkpoint(&f32_file, DType::F32, pytorch_tensors());
    write_checkpoint(&f16_file, DType::F16, pytorch_tensors());
    // `Net`'s tensors and one it does not use.
    let mut with_extra = pytorch_tensors();
    with_extra.push(("head.weight".into(), vec![16, D]));
    write_checkpoint(&extra_file, DType::F32, with_extra);
    let device = Device::default();
    let (model, largest) = model_and_largest(&pytorch_tensors());
    let bound = model + largest + SLACK;
    let mut rows = Vec::new();

    // torchport_burn::load, strict, into a lazily initialised module: only the loaded
    // tensors are ever allocated.
    let (p, net) = peak(|| torchport_burn::load(&f32_file, Net::new(&device)).unwrap());
    check_values(&net, 0.0);
    drop(net);
    rows.push(("load, f32", p));

    // TorchportStore with allow_partial (the file has a tensor the model lacks).
    let (p, (net, resident)) = peak(|| {
        let store = TorchportStore::open(&extra_file)
            .unwrap()
            .allow_partial(true);
        let (net, report) = store.load(Net::new(&device)).unwrap();
        assert_eq!(report.unused.len(), 1, "{report}");
        (net, mapped_resident(&extra_file))
    });
    check_values(&net, 0.0);
    drop(net);
    rows.push(("allow_partial, f32", p));
    // Every tensor's mapped pages were released once copied: the file is not resident.
    if let Some(r) = resident {
        assert!(
            r < largest,
            "{r} bytes of the mapped file stay resident after loading (largest tensor {largest})"
        );
    }

    // A float16 file into the float32 module: burn-store's cast adapter.
    let (p, net) = peak(|| torchport_burn::load(&f16_file, Net::new(&device)).unwrap());
    check_values(&net, 1e-3);
    drop(net);
    rows.push(("load, f16 -> f32", p));

    // A module whose random weights are already there: each parameter is replaced and its
    // old value dropped before the next is read (`batch_bytes(0)`), so the peak is still
    // the model plus one tensor, not two models.
    let net = Net::new(&device);
    net.visit(&mut Materialise);
    let (p, net) = peak(|| {
        let store = TorchportStore::open(&f32_file).unwrap().batch_bytes(0);
        store.load(net).unwrap().0
    });
    check_values(&net, 0.0);
    drop(net);
    // The materialised model was live before measuring began: only what loading adds counts.
    rows.push(("initialised module, batch 0", p + model));

    for (what, p) in &rows {
        println!(
            "{what:<30} peak heap {p:>9} (model {model}, largest tensor {largest}, bound {bound})"
        );
    }
    for (what, p) in &rows {
        assert!(
            *p <= bound,
            "{what}: peak heap {p} > model {model} + largest tensor {largest} + {SLACK}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}
