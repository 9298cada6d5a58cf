//! Strict and partial loading: what the report and the error say when a checkpoint does not
//! fit, and that a strict failure leaves the module untouched.

mod common;

use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig, Lstm, LstmConfig};
use burn::tensor::{Device, Tensor};
use burn_store::ModuleSnapshot;
use torchport_burn::{Error, TorchportStore};

#[derive(Module, Debug)]
struct Model {
    lstm: Lstm,
    linear: Linear,
}

#[derive(Module, Debug)]
struct Renamed {
    rnn: Lstm,
    linear: Linear,
}

fn store() -> TorchportStore {
    TorchportStore::open(common::fixture("lstm_linear.pt")).unwrap()
}

fn values<const D: usize>(p: &Param<Tensor<D>>) -> Vec<f32> {
    p.val().to_data().iter::<f32>().collect()
}

/// Element values of a checkpoint tensor, as float32.
fn checkpoint_values(name: &str) -> (Vec<usize>, Vec<f32>) {
    let ckpt = torchport::open(common::fixture("lstm_linear.pt")).unwrap();
    let t = ckpt.tensor(name).unwrap();
    let bytes = ckpt.data(t).unwrap();
    let v = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (t.shape.clone(), v)
}

#[test]
fn strict_failure_lists_everything_and_loads_nothing() {
    let device = Device::default();
    let mut model = Model {
        lstm: LstmConfig::new(10, 20, true).init(&device),
        linear: LinearConfig::new(20, 31).init(&device),
    };
    let before = values(&model.lstm.input_gate.input_transform.weight);
    let err = store().load_into(&mut model).unwrap_err();
    let Error::Incomplete { report, .. } = &err else {
        panic!("expected Incomplete, got {err}");
    };
    assert_eq!(report.mismatched.len(), 2, "{report:#}");
    assert_eq!(report.applied.len(), 16);
    let w = &report.mismatched[0];
    assert_eq!(
        (w.target.as_str(), w.source.as_str()),
        ("linear.weight", "linear.weight")
    );
    assert_eq!(
        (w.expected.clone(), w.found.clone()),
        (vec![20, 31], vec![30, 20])
    );
    assert!(w.reason.contains("expected [31, 20]"), "{}", w.reason);
    let msg = err.to_string();
    assert!(msg.contains("nothing was loaded"), "{msg}");
    assert!(msg.contains("mismatched linear.bias [31]"), "{msg}");
    // Nothing was loaded.
    assert_eq!(
        values(&model.lstm.input_gate.input_transform.weight),
        before
    );
}

#[test]
fn partial_load_applies_what_fits() {
    let device = Device::default();
    let model = Model {
        lstm: LstmConfig::new(10, 20, true).init(&device),
        linear: LinearConfig::new(20, 31).init(&device),
    };
    let linear_before = values(&model.linear.weight);
    let (model, report) = store().allow_partial(true).load(model).unwrap();
    assert_eq!((report.applied.len(), report.mismatched.len()), (16, 2));
    assert_eq!(values(&model.linear.weight), linear_before);
    // The forget gate of the input transform is rows 20..40 of weight_ih_l0, transposed.
    let (shape, w) = checkpoint_values("lstm.weight_ih_l0");
    assert_eq!(shape, [80, 10]);
    let got = values(
        &model
            .lstm
            .forget_gate
            .as_ref()
            .unwrap()
            .input_transform
            .weight,
    );
    assert_eq!(got.len(), 200);
    for i in 0..10 {
        for o in 0..20 {
            assert_eq!(got[i * 20 + o], w[(20 + o) * 10 + i], "[{i}, {o}]");
        }
    }
    // The output gate's hidden bias is elements 60..80 of bias_hh_l0.
    let (_, b) = checkpoint_values("lstm.bias_hh_l0");
    assert_eq!(
        values(
            model
                .lstm
                .output_gate
                .hidden_transform
                .bias
                .as_ref()
                .unwrap()
        ),
        b[60..80]
    );
}

#[test]
fn renamed_field_is_missing_with_suggestions_and_a_rename_hint() {
    let device = Device::default();
    let model = Renamed {
        rnn: LstmConfig::new(10, 20, true).init(&device),
        linear: LinearConfig::new(20, 30).init(&device),
    };
    let report = store().plan(&model).unwrap().report;
    assert_eq!(
        (report.missing.len(), report.unused.len()),
        (16, 4),
        "{report:#}"
    );
    let m = report
        .missing
        .iter()
        .find(|m| m.target == "rnn.input_gate.input_transform.weight")
        .unwrap();
    // The PyTorch name, then the Burn name itself (a tensor already laid out for Burn).
    assert_eq!(
        m.tried,
        ["rnn.weight_ih_l0", "rnn.input_gate.input_transform.weight"]
    );
    assert_eq!(
        m.suggestions.first().map(String::as_str),
        Some("lstm.weight_ih_l0")
    );
    assert_eq!(
        report.rename_hints,
        [("^lstm\\.".to_string(), "rnn.".to_string())]
    );
    let u = report
        .unused
        .iter()
        .find(|u| u.source == "lstm.bias_hh_l0")
        .unwrap();
    assert_eq!(u.suggestion.as_deref(), Some("rnn.bias_hh_l0"));
    let text = report.to_string();
    assert!(
        text.contains("hint: add the rename rule ^lstm\\. -> rnn."),
        "{text}"
    );
    // A strict load says all of it in one error.
    let err = store().load(model.clone()).unwrap_err().to_string();
    for line in [
        "lstm_linear.pt: the checkpoint does not fit the module, so nothing was loaded \
         (allow_partial(true) loads what fits):",
        "2 applied, 16 missing, 4 unused, 0 mismatched, 0 ignored",
        "  missing    rnn.input_gate.input_transform.weight [10, 20]: the checkpoint has no \
         rnn.weight_ih_l0 or rnn.input_gate.input_transform.weight (closest unused: \
         lstm.weight_ih_l0",
        "  unused     lstm.weight_ih_l0 (float32 [80, 10]), perhaps it should be rnn.weight_ih_l0",
        "  hint: add the rename rule ^lstm\\. -> rnn.",
    ] {
        assert!(err.contains(line), "{line:?} not in:\n{err}");
    }
    // Following the hint makes the load complete.
    let (_, report) = store()
        .rename("^lstm\\.", "rnn.")
        .unwrap()
        .load(model)
        .unwrap();
    assert!(report.is_complete(), "{report:#}");
}

#[test]
fn wrong_kind_is_a_mismatch_and_the_shadowed_tensor_is_unused() {
    // Move the real bias aside and rename an int64 buffer onto its name.
    let device = Device::default();
    #[derive(Module, Debug)]
    struct Cnn {
        fc: Linear,
    }
    let report = TorchportStore::open(common::fixture("cnn.pt"))
        .unwrap()
        .rename(r"^fc\.bias$", "fc.old_bias")
        .unwrap()
        .rename(r"^bn1\.num_batches_tracked$", "fc.bias")
        .unwrap()
        .plan(&Cnn {
            fc: LinearConfig::new(64, 10).init(&device),
        })
        .unwrap()
        .report;
    let m = &report.mismatched[0];
    assert_eq!(m.target, "fc.bias");
    assert_eq!(m.source, "bn1.num_batches_tracked");
    assert!(
        m.reason
            .contains("is int64, which cannot fill a float parameter"),
        "{}",
        m.reason
    );
    let u = report
        .unused
        .iter()
        .find(|u| u.source == "fc.bias")
        .unwrap();
    assert_eq!(u.renamed.as_deref(), Some("fc.old_bias"));
}

#[test]
fn works_as_a_burn_store_module_store() {
    let device = Device::default();
    let mut model = Model {
        lstm: LstmConfig::new(10, 20, true).init(&device),
        linear: LinearConfig::new(20, 30).init(&device),
    };
    let mut store = store();
    let result = model.load_from(&mut store).unwrap();
    assert_eq!(result.applied.len(), 18);
    assert!(result.errors.is_empty() && result.missing.is_empty() && result.unused.is_empty());
    assert!(store.last_report().is_some_and(|r| r.is_complete()));
    let (_, b) = checkpoint_values("linear.bias");
    assert_eq!(values(model.linear.bias.as_ref().unwrap()), b);
    // Raw access goes through the same store, in PyTorch layout.
    use burn_store::ModuleStore;
    let keys = store.keys().unwrap();
    assert_eq!(keys.len(), 6);
    let t = store.get_tensor("lstm.weight_ih_l0").unwrap().unwrap();
    assert_eq!(t.shape.iter().copied().collect::<Vec<_>>(), [80, 10]);
}

#[test]
fn activations_file_keeps_the_recording_order() {
    let device = Device::default();
    let dir = std::env::temp_dir().join(format!("torchport-burn-acts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("acts.safetensors");
    let a = Tensor::<2>::from_data([[1.0f32, 2.0], [3.0, 4.0]], &device);
    let b = Tensor::<1>::from_data([5.0f32], &device);
    let mut acts = torchport_burn::Activations::new();
    acts.record("z_first", &a).record("a_second", &b);
    acts.save(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let order = meta
        .metadata()
        .as_ref()
        .and_then(|m| m.get("torchport.order"))
        .cloned();
    assert_eq!(order.as_deref(), Some("z_first,a_second"));
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.tensor("z_first").unwrap().shape(), [2, 2]);
    assert_eq!(st.tensor("a_second").unwrap().data(), 5.0f32.to_le_bytes());
    std::fs::remove_dir_all(&dir).unwrap();
}
