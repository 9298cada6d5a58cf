//! What the Burn module expects: every parameter's path, the module type that holds each
//! path segment, its shape and its kind — collected by walking the module once, without
//! initializing any lazy parameter.

use burn::module::{ModuleVisitor, Param};
use burn::tensor::{Bool, Int, Tensor};

/// The element kind a parameter holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A float tensor (weights, biases, running statistics).
    Float,
    /// An integer tensor.
    Int,
    /// A boolean tensor.
    Bool,
}

impl Kind {
    /// Whether a checkpoint tensor of `dtype` can be loaded into a parameter of this kind.
    pub(crate) fn accepts(self, dtype: torchport::DType) -> bool {
        use torchport::DType as D;
        match self {
            Kind::Float => matches!(
                dtype,
                D::F16
                    | D::BF16
                    | D::F32
                    | D::F64
                    | D::F8E4M3Fn
                    | D::F8E5M2
                    | D::F8E4M3Fnuz
                    | D::F8E5M2Fnuz
                    | D::F8E8M0Fnu
            ),
            Kind::Int => matches!(
                dtype,
                D::I8 | D::I16 | D::I32 | D::I64 | D::U8 | D::U16 | D::U32 | D::U64
            ),
            Kind::Bool => matches!(dtype, D::Bool | D::U8),
        }
    }

    /// The word used in messages.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Float => "float",
            Kind::Int => "integer",
            Kind::Bool => "bool",
        }
    }
}

/// One parameter of the target module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Path segments from the root (`["lstm", "input_gate", "input_transform", "weight"]`).
    pub segments: Vec<String>,
    /// For each segment, the type of the module that holds it, as Burn's derive names it
    /// (`"Struct:Lstm"`, `"Vec"`, `"Enum:Activation"`, …): `types[i]` is the type of the
    /// module at path `segments[..i]`.
    pub types: Vec<String>,
    /// The shape Burn expects.
    pub shape: Vec<usize>,
    /// The element kind.
    pub kind: Kind,
    /// Whether the parameter has a load mapper: Burn then validates a loaded tensor against
    /// the parameter's *saved* form and converts it on load. A `Linear` built with
    /// `LinearLayout::Col` has one: its saved form is PyTorch's `[out, in]`, so the adapter
    /// must not transpose it.
    pub load_mapped: bool,
}

impl Target {
    /// The dotted path, as burn-store names the parameter.
    pub fn path(&self) -> String {
        self.segments.join(".")
    }

    /// The dotted path without enum variant segments, as PyTorch (which has no such level)
    /// names the parameter.
    pub fn path_without_variants(&self) -> String {
        let n = self.segments.len();
        if self.types.len() != n {
            return self.path();
        }
        let kept: Vec<&str> = (0..n)
            .filter(|&i| !(self.types[i].starts_with("Enum:") && i + 1 < n))
            .map(|i| self.segments[i].as_str())
            .collect();
        kept.join(".")
    }

    /// The type of the module that directly holds the parameter (`"Struct:Linear"`).
    pub fn holder(&self) -> &str {
        self.types.last().map(String::as_str).unwrap_or("")
    }
}

/// Collects [`Target`]s in visiting order.
#[derive(Default)]
pub(crate) struct Collector {
    segments: Vec<String>,
    types: Vec<String>,
    pub(crate) targets: Vec<Target>,
}

impl Collector {
    fn push<T: burn::module::Parameter>(&mut self, param: &Param<T>, kind: Kind) {
        self.targets.push(Target {
            segments: self.segments.clone(),
            types: self.types.clone(),
            shape: param.lazy_shape().iter().copied().collect(),
            kind,
            load_mapped: has_load_mapper(param),
        });
    }
}

impl ModuleVisitor for Collector {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.segments.push(name.to_string());
        self.types.push(container_type.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.segments.pop();
        self.types.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        self.push(param, Kind::Float);
    }

    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<D, Int>>) {
        self.push(param, Kind::Int);
    }

    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<D, Bool>>) {
        self.push(param, Kind::Bool);
    }
}

/// Whether `param` converts what it loads (`Param::load_mapper`). Burn 0.22 keeps the mapper
/// private; its `Debug` output (`Param: <id> - ParamMapper { load: true, save: true }`) is the
/// only public view of it, and `load_mapped_is_seen` below pins that format.
fn has_load_mapper<T: burn::module::Parameter>(param: &Param<T>) -> bool {
    format!("{param:?}").contains("load: true")
}

/// Every parameter the module holds, in visiting order.
pub fn targets<M: burn::module::Module>(module: &M) -> Vec<Target> {
    let mut c = Collector::default();
    module.visit(&mut c);
    c.targets
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::{LinearConfig, LinearLayout};

    #[test]
    fn load_mapped_is_seen() {
        let device = Default::default();
        let row = targets(&LinearConfig::new(8, 16).init(&device));
        let col = targets(
            &LinearConfig::new(8, 16)
                .with_layout(LinearLayout::Col)
                .init(&device),
        );
        // Row: [in, out], no mapper. Col: the saved form [out, in], behind a load mapper.
        assert_eq!(
            (row[0].shape.as_slice(), row[0].load_mapped),
            (&[8, 16][..], false)
        );
        assert_eq!(
            (col[0].shape.as_slice(), col[0].load_mapped),
            (&[16, 8][..], true)
        );
        assert!(!col[1].load_mapped, "the bias has no mapper");
    }
}
