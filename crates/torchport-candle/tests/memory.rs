//! Building a candle model from `TorchportBackend`'s VarBuilder holds the model plus about one
//! tensor, never a second copy of the checkpoint: a counting global allocator measures the
//! peak heap while candle-nn layers are built from a torch.save file (tensors read as they
//! are, split by a rule, cast from float16), and /proc/self/smaps shows how much of the
//! memory-mapped file stays resident afterwards. Its own test binary (the allocator counts
//! everything the binary does), one test, so nothing else allocates while it measures.

use std::path::Path;

use candle_core::{DType as CDType, Device, Tensor};
use candle_nn::{Embedding, Linear};
use torchport::remap::{Op, Rule, RuleSet};
use torchport::DType;
use torchport_candle::TorchportBackend;

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
/// Heap the backend may use besides the model and one tensor: names, the index, candle's
/// bookkeeping.
const SLACK: usize = 512 << 10;

/// The model's tensors as torch.save writes them: an embedding, linears, and a fused
/// attention input projection `[3D, D]` that a rule splits into query/key/value.
fn pytorch_tensors() -> Vec<(String, Vec<usize>)> {
    let mut t = vec![("embed.weight".to_string(), vec![V, D])];
    for l in 0..LAYERS {
        t.push((format!("layers.{l}.weight"), vec![D, D]));
        t.push((format!("layers.{l}.bias"), vec![D]));
    }
    t.push(("attn.in_proj_weight".into(), vec![3 * D, D]));
    t
}

/// The candle model: what a user's model constructor would hold.
struct Net {
    embed: Embedding,
    layers: Vec<Linear>,
    qkv: Vec<Tensor>,
}

/// Build `Net` from `path` through the backend, the fused projection split by a rule.
fn build(path: &Path) -> (Net, Option<usize>) {
    let mut rules = RuleSet::new();
    rules.push(
        Rule::new(
            r"^attn\.in_proj_weight$",
            Op::Split {
                dim: 0,
                sizes: None,
                to: vec![
                    "attn.q.weight".into(),
                    "attn.k.weight".into(),
                    "attn.v.weight".into(),
                ],
            },
        )
        .unwrap(),
    );
    let vb = TorchportBackend::open(path)
        .unwrap()
        .rules(rules)
        .unwrap()
        .into_var_builder(CDType::F32, &Device::Cpu);
    let net = Net {
        embed: candle_nn::embedding(V, D, vb.pp("embed")).unwrap(),
        layers: (0..LAYERS)
            .map(|l| candle_nn::linear(D, D, vb.pp(format!("layers.{l}"))).unwrap())
            .collect(),
        qkv: ["q", "k", "v"]
            .iter()
            .map(|n| vb.get((D, D), &format!("attn.{n}.weight")).unwrap())
            .collect(),
    };
    // The backend (and its memory map) is still alive here.
    (net, mapped_resident(path))
}

/// The model holds the file's values.
fn check_values(net: &Net, tol: f32) {
    let names: Vec<String> = pytorch_tensors().into_iter().map(|(n, _)| n).collect();
    let k = |name: &str| names.iter().position(|n| n == name).unwrap();
    let at = |t: &Tensor, r: usize, c: usize| -> f32 {
        t.get(r)
            .unwrap()
            .get(c)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    };
    let close = |got: f32, want: f32, what: &str| {
        assert!((got - want).abs() <= tol, "{what}: {got} vs {want}");
    };
    close(
        at(net.embed.embeddings(), 3, 5),
        value(k("embed.weight"), 3 * D + 5),
        "embed[3][5]",
    );
    close(
        at(net.layers[2].weight(), 7, 11),
        value(k("layers.2.weight"), 7 * D + 11),
        "layers.2 w[7][11]",
    );
    // The key: the second block of rows of the fused projection.
    close(
        at(&net.qkv[1], 9, 5),
        value(k("attn.in_proj_weight"), (D + 9) * D + 5),
        "attn.k[9][5]",
    );
}

#[test]
fn building_a_model_holds_the_model_plus_one_tensor() {
    let dir = std::env::temp_dir().join(format!("torchport-candle-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f32_file = dir.join("net.pt");
    let f16_file = dir.join("net-f16.pt");
    write_checkpoint(&f32_file, DType::F32, pytorch_tensors());
    write_checkpoint(&f16_file, DType::F16, pytorch_tensors());
    let (model, largest) = model_and_largest(&pytorch_tensors());
    let bound = model + largest + SLACK;
    let mut rows = Vec::new();

    for (what, file, tol) in [("f32", &f32_file, 0.0), ("f16 -> f32", &f16_file, 1e-3)] {
        let (p, (net, resident)) = peak(|| build(file));
        check_values(&net, tol);
        drop(net);
        rows.push((what, p));
        // Every tensor's mapped pages were released once copied: the file is not resident.
        if let Some(r) = resident {
            assert!(
                r < largest,
                "{what}: {r} bytes of the mapped file stay resident (largest tensor {largest})"
            );
        }
    }
    for (what, p) in &rows {
        println!(
            "{what:<12} peak heap {p:>9} (model {model}, largest tensor {largest}, bound {bound})"
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
