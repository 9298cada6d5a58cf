//! The serialized `ExportedProgram` (torch/_export/serde/schema.py, schema 8.x) as serde types:
//! the graph IR that front ends hand to the runtime.
//!
//! Unions (`Argument`, `SymInt`, `InputSpec`, …) are serialized by torch as one-key objects
//! (`{"as_tensor": {"name": "x"}}`), which is serde's externally tagged enum: an unknown union
//! member is refused with its key named. Structs tolerate unknown fields, because the schema's
//! minor version grows by adding fields; the major version is checked by
//! [`check_version`](super::check_version). Fields never read (node metadata, module call
//! graph) are not declared and so are skipped while parsing.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

use super::scalar_type::ScalarType;

/// A name drawn from a small vocabulary (an operator argument's schema name, a device type):
/// the common ones are shared static strings, any other is owned. A program names an
/// argument once per argument of every node, and a device once per tensor value: owned, they
/// were a third of the allocations of parsing MobileNetV3-Large's program.
pub type Name = Cow<'static, str>;

/// The shared static string equal to `s`, where it is a common name.
fn common(s: &str) -> Option<&'static str> {
    Some(match s {
        "self" => "self",
        "input" => "input",
        "weight" => "weight",
        "bias" => "bias",
        "other" => "other",
        "eps" => "eps",
        "size" => "size",
        "dim" => "dim",
        "running_mean" => "running_mean",
        "running_var" => "running_var",
        "training" => "training",
        "momentum" => "momentum",
        "cudnn_enabled" => "cudnn_enabled",
        "dim0" => "dim0",
        "dim1" => "dim1",
        "dtype" => "dtype",
        "shape" => "shape",
        "p" => "p",
        "train" => "train",
        "device" => "device",
        "stride" => "stride",
        "padding" => "padding",
        "dilation" => "dilation",
        "groups" => "groups",
        "normalized_shape" => "normalized_shape",
        "layout" => "layout",
        "start" => "start",
        "end" => "end",
        "query" => "query",
        "key" => "key",
        "value" => "value",
        "mat1" => "mat1",
        "mat2" => "mat2",
        "exponent" => "exponent",
        "attn_mask" => "attn_mask",
        "scale" => "scale",
        "output_size" => "output_size",
        "tensors" => "tensors",
        "keepdim" => "keepdim",
        "indices" => "indices",
        "index" => "index",
        "dims" => "dims",
        "start_dim" => "start_dim",
        "end_dim" => "end_dim",
        "kernel_size" => "kernel_size",
        "approximate" => "approximate",
        "cpu" => "cpu",
        "cuda" => "cuda",
        "meta" => "meta",
        _ => return None,
    })
}

/// Deserializes a [`Name`].
fn common_name<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Name, D::Error> {
    struct V;
    impl serde::de::Visitor<'_> for V {
        type Value = Name;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Name, E> {
            Ok(common(s).map_or_else(|| Cow::Owned(s.to_string()), Cow::Borrowed))
        }
        fn visit_string<E: serde::de::Error>(self, s: String) -> Result<Name, E> {
            Ok(common(&s).map_or(Cow::Owned(s), Cow::Borrowed))
        }
    }
    d.deserialize_str(V)
}

/// The schema major version torchport reads (torch 2.5 … 2.15 write 8.x).
pub const SUPPORTED_MAJOR: i64 = 8;

/// The top-level serialized program (`models/<name>.json`).
#[derive(Debug, Clone, Deserialize)]
pub struct ExportedProgram {
    /// The graph and its signature.
    pub graph_module: GraphModule,
    /// Opset versions by namespace, e.g. `{"aten": 10}`.
    #[serde(default)]
    pub opset_version: BTreeMap<String, i64>,
    /// Schema version that wrote this program.
    pub schema_version: SchemaVersion,
    /// The torch version that wrote the program, when recorded.
    #[serde(default)]
    pub torch_version: Option<String>,
    /// Allowed values of each symbolic dim (`s0` → its range), from `dynamic_shapes`.
    #[serde(default)]
    pub range_constraints: BTreeMap<String, RangeConstraint>,
}

/// The range a symbolic dim was exported for. A bound that is not a (64-bit) integer, such as
/// torch's infinity, means unbounded.
#[derive(Debug, Clone, Deserialize)]
pub struct RangeConstraint {
    /// Smallest allowed value.
    #[serde(default)]
    pub min_val: Option<serde_json::Value>,
    /// Largest allowed value.
    #[serde(default)]
    pub max_val: Option<serde_json::Value>,
}

impl RangeConstraint {
    /// The bounds as integers (`None` for an unbounded side).
    pub fn bounds(&self) -> (Option<i64>, Option<i64>) {
        let int = |v: &Option<serde_json::Value>| v.as_ref().and_then(serde_json::Value::as_i64);
        (int(&self.min_val), int(&self.max_val))
    }
}

impl SymExpr {
    /// The symbol's name when the expression is a single symbol (`s0`, or sympy's
    /// `Symbol('s0', positive=True, integer=True)`); `None` for a compound expression.
    pub fn symbol(&self) -> Option<&str> {
        let e = self.expr_str.trim();
        let name = match e.strip_prefix("Symbol('") {
            Some(rest) => rest.split('\'').next()?,
            None => e,
        };
        let ok = !name.is_empty()
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with(|c: char| c.is_ascii_digit());
        ok.then_some(name)
    }
}

/// `SchemaVersion { major, minor }`.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct SchemaVersion {
    /// Bumped on breaking changes.
    pub major: i64,
    /// Bumped on compatible changes (new optional fields).
    pub minor: i64,
}

/// A graph plus the signature that says which inputs are weights and which are user inputs.
#[derive(Debug, Clone, Deserialize)]
pub struct GraphModule {
    /// The graph.
    pub graph: Graph,
    /// Parameters, buffers, constants, user inputs and outputs.
    pub signature: GraphSignature,
}

/// A flat list of ATen calls over named values.
#[derive(Debug, Clone, Deserialize)]
pub struct Graph {
    /// Placeholders, in order (weights first, then user inputs).
    pub inputs: Vec<Argument>,
    /// Returned values, in order.
    pub outputs: Vec<Argument>,
    /// The calls, in execution order.
    pub nodes: Vec<Node>,
    /// Metadata of every tensor value by name.
    #[serde(default)]
    pub tensor_values: BTreeMap<String, TensorMeta>,
    /// Symbolic ints by name.
    #[serde(default)]
    pub sym_int_values: BTreeMap<String, SymInt>,
    /// Symbolic bools by name.
    #[serde(default)]
    pub sym_bool_values: BTreeMap<String, SymBool>,
    /// Whether a subgraph returns a single tensor rather than a list.
    #[serde(default)]
    pub is_single_tensor_return: bool,
}

/// One operator call.
#[derive(Debug, Clone, Deserialize)]
pub struct Node {
    /// The operator, e.g. `torch.ops.aten.conv2d.default`.
    pub target: String,
    /// Arguments named by the operator schema; defaults are omitted.
    pub inputs: Vec<NamedArgument>,
    /// The values the call defines.
    pub outputs: Vec<Argument>,
    /// The node's own name (schema 8.x writes it; older programs may not).
    #[serde(default)]
    pub name: Option<String>,
}

/// An argument with its schema name.
#[derive(Debug, Clone, Deserialize)]
pub struct NamedArgument {
    /// The argument's name in the operator schema (the common ones shared, not allocated
    /// for each argument: see [`Name`]).
    #[serde(deserialize_with = "common_name")]
    pub name: Name,
    /// Its value.
    pub arg: Argument,
    /// 1 positional, 2 keyword (0 or absent: unknown).
    #[serde(default)]
    pub kind: Option<i64>,
}

/// Every kind of argument value (`Argument` union).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum Argument {
    AsNone(serde_json::Value),
    AsTensor(TensorArgument),
    AsTensors(Vec<TensorArgument>),
    AsInt(i64),
    AsInts(Vec<i64>),
    AsFloat(JsonFloat),
    AsFloats(Vec<JsonFloat>),
    AsString(String),
    AsStrings(Vec<String>),
    AsSymInt(SymIntArgument),
    AsSymInts(Vec<SymIntArgument>),
    AsScalarType(ScalarType),
    AsMemoryFormat(i64),
    AsLayout(i64),
    AsDevice(Device),
    AsBool(bool),
    AsBools(Vec<bool>),
    AsSymBool(SymBoolArgument),
    AsSymBools(Vec<SymBoolArgument>),
    AsGraph(serde_json::Value),
    AsOptionalTensors(Vec<OptionalTensorArgument>),
    AsCustomObj(CustomObjArgument),
    AsOperator(String),
    AsSymFloat(SymFloatArgument),
    AsSymFloats(Vec<SymFloatArgument>),
    AsOptionalTensor(OptionalTensorArgument),
    AsComplex(ComplexValue),
    AsNestedTensors(Vec<Vec<TensorArgument>>),
    AsIntLists(Vec<Vec<i64>>),
    AsStringToArgument(BTreeMap<String, Argument>),
    AsFloatLists(Vec<Vec<JsonFloat>>),
}

impl Argument {
    /// The schema's name for this union member (`as_tensor`, …), for error messages.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Argument::AsNone(_) => "as_none",
            Argument::AsTensor(_) => "as_tensor",
            Argument::AsTensors(_) => "as_tensors",
            Argument::AsInt(_) => "as_int",
            Argument::AsInts(_) => "as_ints",
            Argument::AsFloat(_) => "as_float",
            Argument::AsFloats(_) => "as_floats",
            Argument::AsString(_) => "as_string",
            Argument::AsStrings(_) => "as_strings",
            Argument::AsSymInt(_) => "as_sym_int",
            Argument::AsSymInts(_) => "as_sym_ints",
            Argument::AsScalarType(_) => "as_scalar_type",
            Argument::AsMemoryFormat(_) => "as_memory_format",
            Argument::AsLayout(_) => "as_layout",
            Argument::AsDevice(_) => "as_device",
            Argument::AsBool(_) => "as_bool",
            Argument::AsBools(_) => "as_bools",
            Argument::AsSymBool(_) => "as_sym_bool",
            Argument::AsSymBools(_) => "as_sym_bools",
            Argument::AsGraph(_) => "as_graph",
            Argument::AsOptionalTensors(_) => "as_optional_tensors",
            Argument::AsCustomObj(_) => "as_custom_obj",
            Argument::AsOperator(_) => "as_operator",
            Argument::AsSymFloat(_) => "as_sym_float",
            Argument::AsSymFloats(_) => "as_sym_floats",
            Argument::AsOptionalTensor(_) => "as_optional_tensor",
            Argument::AsComplex(_) => "as_complex",
            Argument::AsNestedTensors(_) => "as_nested_tensors",
            Argument::AsIntLists(_) => "as_int_lists",
            Argument::AsStringToArgument(_) => "as_string_to_argument",
            Argument::AsFloatLists(_) => "as_float_lists",
        }
    }
}

/// A float as torch's serializer writes it: a JSON number, or the strings `"Infinity"`,
/// `"-Infinity"`, `"NaN"` for non-finite values.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(untagged)]
pub enum JsonFloat {
    /// A finite number.
    Num(f64),
    /// A non-finite value spelled as a string.
    Text(NonFinite),
}

/// The spellings torch uses for non-finite floats.
#[derive(Debug, Clone, Copy, Deserialize)]
#[allow(missing_docs)]
pub enum NonFinite {
    Infinity,
    #[serde(rename = "-Infinity")]
    NegInfinity,
    NaN,
}

impl JsonFloat {
    /// The value as an f64.
    pub fn get(self) -> f64 {
        match self {
            JsonFloat::Num(v) => v,
            JsonFloat::Text(NonFinite::Infinity) => f64::INFINITY,
            JsonFloat::Text(NonFinite::NegInfinity) => f64::NEG_INFINITY,
            JsonFloat::Text(NonFinite::NaN) => f64::NAN,
        }
    }
}

/// A reference to a tensor value by name.
#[derive(Debug, Clone, Deserialize)]
pub struct TensorArgument {
    /// The value's name.
    pub name: String,
}

/// An element of a `Tensor?[]` list.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum OptionalTensorArgument {
    AsTensor(TensorArgument),
    AsNone(serde_json::Value),
}

/// A SymInt argument: a named symbolic value or a plain int.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum SymIntArgument {
    AsName(String),
    AsInt(i64),
}

/// A SymFloat argument.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum SymFloatArgument {
    AsName(String),
    AsFloat(JsonFloat),
}

/// A SymBool argument.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum SymBoolArgument {
    AsName(String),
    AsBool(bool),
}

/// A custom (TorchBind) object reference; the runtime refuses programs that use them.
#[derive(Debug, Clone, Deserialize)]
pub struct CustomObjArgument {
    /// The value's name.
    pub name: String,
    /// The object's class.
    pub class_fqn: String,
}

/// A complex scalar.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct ComplexValue {
    /// Real part.
    pub real: JsonFloat,
    /// Imaginary part.
    pub imag: JsonFloat,
}

/// A device such as `{"type": "cpu", "index": null}`.
#[derive(Debug, Clone, Deserialize)]
pub struct Device {
    /// `cpu`, `cuda`, …
    #[serde(rename = "type", deserialize_with = "common_name")]
    pub kind: Name,
    /// Device index.
    #[serde(default)]
    pub index: Option<i64>,
}

/// A symbolic int: an expression with an optional hint, or a concrete int.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum SymInt {
    AsExpr(SymExpr),
    AsInt(i64),
}

/// A symbolic bool.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum SymBool {
    AsExpr(SymExpr),
    AsBool(bool),
}

/// A symbolic expression such as `s0 + 1`.
#[derive(Debug, Clone, Deserialize)]
pub struct SymExpr {
    /// The expression text.
    pub expr_str: String,
    /// The value seen while tracing, if recorded.
    #[serde(default)]
    pub hint: Option<serde_json::Value>,
}

/// A tensor's dtype, shape, strides and device.
#[derive(Debug, Clone, Deserialize)]
pub struct TensorMeta {
    /// `ScalarType` enum int.
    pub dtype: ScalarType,
    /// Sizes (concrete or symbolic).
    pub sizes: Vec<SymInt>,
    /// Whether autograd tracked it.
    #[serde(default)]
    pub requires_grad: bool,
    /// Device.
    pub device: Device,
    /// Strides.
    pub strides: Vec<SymInt>,
    /// Storage offset.
    pub storage_offset: SymInt,
    /// `Layout` enum int (7 = strided).
    pub layout: i64,
}

impl TensorMeta {
    /// Concrete sizes, or `None` when any size is symbolic.
    pub fn static_sizes(&self) -> Option<Vec<i64>> {
        self.sizes
            .iter()
            .map(|s| match s {
                SymInt::AsInt(v) => Some(*v),
                SymInt::AsExpr(_) => None,
            })
            .collect()
    }
}

/// Which graph inputs are weights and which are user inputs; which outputs are user outputs.
#[derive(Debug, Clone, Deserialize)]
pub struct GraphSignature {
    /// One per graph input, in order.
    pub input_specs: Vec<InputSpec>,
    /// One per graph output, in order.
    pub output_specs: Vec<OutputSpec>,
}

/// The role of one graph input.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum InputSpec {
    UserInput {
        arg: Argument,
    },
    Parameter {
        arg: TensorArgument,
        parameter_name: String,
    },
    Buffer {
        arg: TensorArgument,
        buffer_name: String,
        #[serde(default)]
        persistent: Option<bool>,
    },
    TensorConstant {
        arg: TensorArgument,
        tensor_constant_name: String,
    },
    CustomObj {
        arg: CustomObjArgument,
        custom_obj_name: String,
    },
    Token {
        arg: serde_json::Value,
    },
    ConstantInput {
        name: String,
        value: serde_json::Value,
    },
}

impl InputSpec {
    /// For a parameter, buffer or tensor constant: its graph input and the state_dict or
    /// constant name its tensor is stored under.
    pub fn weight(&self) -> Option<(&TensorArgument, &str)> {
        match self {
            InputSpec::Parameter {
                arg,
                parameter_name,
            } => Some((arg, parameter_name)),
            InputSpec::Buffer {
                arg, buffer_name, ..
            } => Some((arg, buffer_name)),
            InputSpec::TensorConstant {
                arg,
                tensor_constant_name,
            } => Some((arg, tensor_constant_name)),
            _ => None,
        }
    }
}

/// The role of one graph output.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum OutputSpec {
    UserOutput {
        arg: Argument,
    },
    LossOutput {
        arg: TensorArgument,
    },
    BufferMutation {
        arg: TensorArgument,
        buffer_name: String,
    },
    GradientToParameter {
        arg: TensorArgument,
        parameter_name: String,
    },
    GradientToUserInput {
        arg: TensorArgument,
        user_input_name: String,
    },
    UserInputMutation {
        arg: TensorArgument,
        user_input_name: String,
    },
    Token {
        arg: serde_json::Value,
    },
    ParameterMutation {
        arg: TensorArgument,
        parameter_name: String,
    },
}
