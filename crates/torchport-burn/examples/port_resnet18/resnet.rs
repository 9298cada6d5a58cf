//! torchvision's ResNet-18 (`torchvision.models.resnet18`) written in Burn, with the widths as
//! configuration so the same code builds the full model and the narrow copy the tests load.
//!
//! Fields are named like torchvision's attributes, so the state_dict's names line up except
//! for the shortcut (`downsample.0` / `downsample.1`), which `rules.toml` renames.

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{AdaptiveAvgPool2d, AdaptiveAvgPool2dConfig, MaxPool2d, MaxPool2dConfig};
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig, PaddingConfig2d};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor};
use torchport::remap::RuleSet;
use torchport_burn::Activations;

/// The rules that map torchvision's names onto this model (`rules.toml`).
pub fn rules() -> RuleSet {
    RuleSet::from_toml_str("rules.toml", include_str!("rules.toml")).expect("valid rules")
}

/// Channel widths and classes of a ResNet-18.
#[derive(Clone, Debug, PartialEq)]
pub struct ResNetConfig {
    /// Output channels of the 7x7 stem convolution.
    pub stem: usize,
    /// Channels of `layer1` … `layer4`.
    pub widths: [usize; 4],
    /// Outputs of `fc`.
    pub classes: usize,
}

impl ResNetConfig {
    /// torchvision's `resnet18()`: stem 64, stages 64, 128, 256, 512, 1000 classes.
    pub fn torchvision() -> Self {
        ResNetConfig {
            stem: 64,
            widths: [64, 128, 256, 512],
            classes: 1000,
        }
    }

    /// The widths a saved state_dict was made with, read from its shapes (`conv1.weight`,
    /// `layerN.0.conv1.weight`, `fc.weight`).
    pub fn from_checkpoint(ckpt: &torchport::Checkpoint) -> Result<Self, String> {
        let dim0 = |name: &str| {
            ckpt.tensor(name)
                .and_then(|t| t.shape.first().copied())
                .ok_or_else(|| format!("{}: no tensor {name}", ckpt.path().display()))
        };
        Ok(ResNetConfig {
            stem: dim0("conv1.weight")?,
            widths: [
                dim0("layer1.0.conv1.weight")?,
                dim0("layer2.0.conv1.weight")?,
                dim0("layer3.0.conv1.weight")?,
                dim0("layer4.0.conv1.weight")?,
            ],
            classes: dim0("fc.weight")?,
        })
    }

    /// Build the model (parameters are initialised lazily: loading replaces them before any
    /// random weight is made).
    pub fn init(&self, device: &Device) -> ResNet18 {
        let mut inputs = self.stem;
        let mut stage = |width: usize, stride: usize| {
            let blocks = vec![
                BasicBlock::new(inputs, width, stride, device),
                BasicBlock::new(width, width, 1, device),
            ];
            inputs = width;
            blocks
        };
        let [w1, w2, w3, w4] = self.widths;
        ResNet18 {
            conv1: Conv2dConfig::new([3, self.stem], [7, 7])
                .with_stride([2, 2])
                .with_padding(PaddingConfig2d::Explicit(3, 3, 3, 3))
                .with_bias(false)
                .init(device),
            bn1: BatchNormConfig::new(self.stem).init(device),
            maxpool: MaxPool2dConfig::new([3, 3])
                .with_strides([2, 2])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init(),
            layer1: stage(w1, 1),
            layer2: stage(w2, 2),
            layer3: stage(w3, 2),
            layer4: stage(w4, 2),
            avgpool: AdaptiveAvgPool2dConfig::new([1, 1]).init(),
            fc: LinearConfig::new(w4, self.classes).init(device),
        }
    }
}

/// torchvision's `nn.Sequential(conv1x1(stride), BatchNorm2d)` shortcut, with named fields.
#[derive(Module, Debug)]
pub struct Downsample {
    conv: Conv2d,
    bn: BatchNorm,
}

/// torchvision's `BasicBlock`: two 3x3 convolutions with batch norm, plus the shortcut.
#[derive(Module, Debug)]
pub struct BasicBlock {
    conv1: Conv2d,
    bn1: BatchNorm,
    conv2: Conv2d,
    bn2: BatchNorm,
    downsample: Option<Downsample>,
}

/// A 3x3 convolution with padding 1 and no bias (torchvision's `conv3x3`).
fn conv3x3(inputs: usize, outputs: usize, stride: usize, device: &Device) -> Conv2d {
    Conv2dConfig::new([inputs, outputs], [3, 3])
        .with_stride([stride, stride])
        .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
        .with_bias(false)
        .init(device)
}

impl BasicBlock {
    fn new(inputs: usize, outputs: usize, stride: usize, device: &Device) -> Self {
        // torchvision adds the shortcut projection when the shape changes.
        let downsample = (stride != 1 || inputs != outputs).then(|| Downsample {
            conv: Conv2dConfig::new([inputs, outputs], [1, 1])
                .with_stride([stride, stride])
                .with_bias(false)
                .init(device),
            bn: BatchNormConfig::new(outputs).init(device),
        });
        BasicBlock {
            conv1: conv3x3(inputs, outputs, stride, device),
            bn1: BatchNormConfig::new(outputs).init(device),
            conv2: conv3x3(outputs, outputs, 1, device),
            bn2: BatchNormConfig::new(outputs).init(device),
            downsample,
        }
    }

    /// The block at `name` (`layer2.0`); records under torchvision's module names.
    fn forward(&self, x: Tensor<4>, name: &str, acts: &mut Option<&mut Activations>) -> Tensor<4> {
        let y = self.conv1.forward(x.clone());
        record(acts, &format!("{name}.conv1"), &y);
        let y = self.bn1.forward(y);
        record(acts, &format!("{name}.bn1"), &y);
        let y = relu(y);
        record(acts, &format!("{name}.relu"), &y);
        let y = self.conv2.forward(y);
        record(acts, &format!("{name}.conv2"), &y);
        let y = self.bn2.forward(y);
        record(acts, &format!("{name}.bn2"), &y);
        let shortcut = match &self.downsample {
            Some(d) => {
                let s = d.conv.forward(x);
                record(acts, &format!("{name}.downsample.0"), &s);
                let s = d.bn.forward(s);
                record(acts, &format!("{name}.downsample.1"), &s);
                record(acts, &format!("{name}.downsample"), &s);
                s
            }
            None => x,
        };
        // torchvision calls the block's one `relu` twice: its second output is `relu#2`.
        let y = relu(y + shortcut);
        record(acts, &format!("{name}.relu#2"), &y);
        record(acts, name, &y);
        y
    }
}

/// torchvision's `ResNet` with `BasicBlock`s in `[2, 2, 2, 2]`.
#[derive(Module, Debug)]
pub struct ResNet18 {
    conv1: Conv2d,
    bn1: BatchNorm,
    maxpool: MaxPool2d,
    layer1: Vec<BasicBlock>,
    layer2: Vec<BasicBlock>,
    layer3: Vec<BasicBlock>,
    layer4: Vec<BasicBlock>,
    avgpool: AdaptiveAvgPool2d,
    fc: Linear,
}

impl ResNet18 {
    /// Images `[batch, 3, height, width]` to logits `[batch, classes]`. With `acts`, every
    /// layer's output is recorded under torchvision's module name (`layer1.0.bn2`,
    /// `layer2.0.downsample.0`…), as `tools/record_activations.py` names them, for
    /// `tools/compare_activations.py`.
    pub fn forward(&self, x: Tensor<4>, mut acts: Option<&mut Activations>) -> Tensor<2> {
        let acts = &mut acts;
        record(acts, "input", &x);
        let x = self.conv1.forward(x);
        record(acts, "conv1", &x);
        let x = self.bn1.forward(x);
        record(acts, "bn1", &x);
        let x = relu(x);
        record(acts, "relu", &x);
        let mut x = self.maxpool.forward(x);
        record(acts, "maxpool", &x);
        let stages = [&self.layer1, &self.layer2, &self.layer3, &self.layer4];
        for (i, blocks) in stages.into_iter().enumerate() {
            for (j, block) in blocks.iter().enumerate() {
                x = block.forward(x, &format!("layer{}.{j}", i + 1), acts);
            }
            record(acts, &format!("layer{}", i + 1), &x);
        }
        let x = self.avgpool.forward(x);
        record(acts, "avgpool", &x);
        let x = self.fc.forward(x.flatten(1, 3));
        record(acts, "fc", &x);
        record(acts, "output", &x);
        x
    }
}

fn record<const D: usize>(acts: &mut Option<&mut Activations>, name: &str, x: &Tensor<D>) {
    if let Some(acts) = acts.as_deref_mut() {
        acts.record(name, x);
    }
}
