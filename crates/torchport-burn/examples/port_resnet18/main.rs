//! Port torchvision's ResNet-18 to Burn: load a `torch.save(model.state_dict())` file through
//! torchport-burn with the renames of `rules.toml`, run PyTorch's recorded input and compare
//! the logits with PyTorch's (docs/PORTING.md, "A complete port: ResNet-18").
//!
//!     cargo run -p torchport-burn --example port_resnet18 -- \
//!         [WEIGHTS.pth IO.safetensors] [--acts OUT.safetensors] [--target OUT.json]
//!
//! Without paths it loads the narrow test copy of tests/fixtures/ports/ (timm's resnet18 with
//! torchvision's names); `python tests/fixtures/gen/gen_ports.py --full DIR` writes the full
//! torchvision model (`DIR/resnet18.pth`, `DIR/resnet18.io.safetensors`). The widths are read
//! from the checkpoint. IO.safetensors holds `input` and PyTorch's `logits`.
//!
//! `--acts` writes every layer's output under torchvision's module names, for
//! `tools/compare_activations.py`; `--target` writes the parameters the Burn model expects
//! (names and shapes, JSON) for `torchport match`.

mod resnet;

use burn::tensor::{Device, Tensor, TensorData};
use resnet::ResNetConfig;
use torchport_burn::{Activations, TorchportStore};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/ports/");
    let mut paths = Vec::new();
    let (mut acts_out, mut target_out) = (None, None);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--acts" => acts_out = Some(args.next().ok_or("--acts needs a path")?),
            "--target" => target_out = Some(args.next().ok_or("--target needs a path")?),
            _ if a.starts_with("--") => return Err(format!("unknown option {a}").into()),
            _ => paths.push(a),
        }
    }
    let (weights, io) = match paths.as_slice() {
        [] => (
            format!("{fixtures}resnet18_small.pth"),
            format!("{fixtures}resnet18_small.io.safetensors"),
        ),
        [w, io] => (w.clone(), io.clone()),
        _ => return Err("give both WEIGHTS.pth and IO.safetensors, or neither".into()),
    };

    // 1. Build the Burn model with the checkpoint's widths.
    let device = Device::default();
    let store = TorchportStore::open(&weights)?.rules(resnet::rules());
    let config = ResNetConfig::from_checkpoint(store.checkpoint())?;
    let size = if config == ResNetConfig::torchvision() {
        "torchvision's resnet18"
    } else {
        "narrow"
    };
    println!("{weights}: {size}, {config:?}");
    let model = config.init(&device);
    if let Some(path) = &target_out {
        write_target(&model, path)?;
    }

    // 2. Load strictly: every parameter filled and every tensor used, or an error listing
    //    what does not fit.
    let (model, report) = store.load(model)?;
    println!("{report}");

    // 3. Run PyTorch's input and compare with PyTorch's logits.
    let bytes = std::fs::read(&io)?;
    let io = safetensors::SafeTensors::deserialize(&bytes)?;
    let (input, input_shape) = read_f32(&io, "input")?;
    let (want, _) = read_f32(&io, "logits")?;
    let x = Tensor::<4>::from_data(TensorData::new(input, input_shape), &device);
    let mut acts = Activations::new();
    let logits = model.forward(x, Some(&mut acts));
    let got: Vec<f32> = logits.to_data().iter::<f32>().collect();
    let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    let diff = got
        .iter()
        .zip(&want)
        .map(|(g, w)| (g - w).abs())
        .fold(0.0f32, f32::max);
    println!("logits[0][..5] burn    {:?}", &got[..5.min(got.len())]);
    println!("logits[0][..5] pytorch {:?}", &want[..5.min(want.len())]);
    println!(
        "max abs diff {diff:.3e}, relative to max(1, max |logit|) {:.3e}",
        diff / scale
    );
    if let Some(path) = &acts_out {
        acts.save(path)?;
        println!("wrote {} activations to {path}", acts.names().len());
    }
    Ok(())
}

/// The float32 tensor `name` of a safetensors file, with its shape.
fn read_f32(
    io: &safetensors::SafeTensors,
    name: &str,
) -> Result<(Vec<f32>, Vec<usize>), Box<dyn std::error::Error>> {
    let t = io.tensor(name)?;
    if t.dtype() != safetensors::Dtype::F32 {
        return Err(format!("{name} is {:?}, expected F32", t.dtype()).into());
    }
    let values = t
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok((values, t.shape().to_vec()))
}

/// The Burn model's parameters as `torchport match --target` reads them:
/// `[{"name": ..., "shape": [...]}, ...]`.
fn write_target(model: &resnet::ResNet18, path: &str) -> std::io::Result<()> {
    let entries: Vec<String> = TorchportStore::targets(model)
        .iter()
        .map(|t| format!(r#"  {{"name": "{}", "shape": {:?}}}"#, t.path(), t.shape))
        .collect();
    std::fs::write(path, format!("[\n{}\n]\n", entries.join(",\n")))?;
    println!(
        "wrote the {} parameters the model expects to {path}",
        entries.len()
    );
    Ok(())
}
