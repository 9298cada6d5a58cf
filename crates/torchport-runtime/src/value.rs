//! Runtime values and the argument accessor handed to op kernels.
//!
//! Representation (the runtime's dtype policy): float64 tensors are computed in f64; the other
//! floating tensors in f32 (f16 and bf16 values are rounded to their declared dtype where the
//! graph casts, then held as f32);
//! integer tensors are i64; bool tensors are u8 holding 0/1. [`crate::dtype::ScalarType`] keeps the
//! torch dtype for outputs.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};

use crate::error::{OpError, OpResult};
use crate::schema::{Argument, Node, OptionalTensorArgument, SymBoolArgument, SymIntArgument};

/// A value bound to a name while the graph runs.
#[derive(Debug, Clone)]
pub enum Value {
    /// A tensor.
    Tensor(Tensor),
    /// A list of tensors (e.g. the result of `split`).
    Tensors(Vec<Tensor>),
    /// An int (a SymInt's value).
    Int(i64),
    /// A float.
    Float(f64),
    /// A bool.
    Bool(bool),
    /// No value.
    None,
}

/// A Python scalar argument (`Scalar` in ATen schemas).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// An int.
    Int(i64),
    /// A float.
    Float(f64),
    /// A bool.
    Bool(bool),
}

impl Scalar {
    /// The value as f64.
    pub fn as_f64(self) -> f64 {
        match self {
            Scalar::Int(v) => v as f64,
            Scalar::Float(v) => v,
            Scalar::Bool(b) => f64::from(u8::from(b)),
        }
    }

    /// The runtime dtype a tensor made from this scalar gets.
    pub fn dtype(self) -> DType {
        match self {
            Scalar::Int(_) => DType::I64,
            Scalar::Float(_) => DType::F32,
            Scalar::Bool(_) => DType::U8,
        }
    }
}

/// A tensor or a scalar (for `Tensor other` arguments that export writes as numbers).
#[derive(Debug, Clone)]
pub enum TensorOrScalar {
    /// A tensor.
    Tensor(Tensor),
    /// A scalar.
    Scalar(Scalar),
}

/// The environment: every value defined so far, by name (hashed with foldhash's fast hash:
/// the names are the program's own, and a run looks several up per node).
pub type Env = HashMap<String, Value, foldhash::fast::RandomState>;

/// The value named `name`: the one in `env`, else the one in `constants` (a program's
/// weights, which a run reads where they are instead of copying them into its environment).
pub(crate) fn lookup<'a>(
    env: &'a Env,
    constants: Option<&'a Env>,
    name: &str,
) -> Option<&'a Value> {
    env.get(name).or_else(|| constants?.get(name))
}

/// The arguments of one node, resolved against the environment on request.
pub struct Args<'a> {
    node: &'a Node,
    env: &'a Env,
    constants: Option<&'a Env>,
}

impl<'a> Args<'a> {
    /// Arguments of `node`, read from `env`.
    pub fn new(node: &'a Node, env: &'a Env) -> Self {
        Args {
            node,
            env,
            constants: None,
        }
    }

    /// Arguments of `node`, read from `env`, then from `constants` for a name `env` lacks (a
    /// program's weights, which a run reads where they are instead of copying them into its
    /// environment).
    pub fn with_constants(node: &'a Node, env: &'a Env, constants: &'a Env) -> Self {
        Args {
            node,
            env,
            constants: Some(constants),
        }
    }

    /// The node being run.
    pub fn node(&self) -> &'a Node {
        self.node
    }

    /// The device tensors are made on.
    pub fn device(&self) -> Device {
        Device::Cpu
    }

    /// The raw argument named `name`, if the node passes it.
    pub fn get(&self, name: &str) -> Option<&'a Argument> {
        self.node
            .inputs
            .iter()
            .find(|a| a.name == name)
            .map(|a| &a.arg)
    }

    /// Whether the argument is passed and not None.
    pub fn has(&self, name: &str) -> bool {
        !matches!(self.get(name), None | Some(Argument::AsNone(_)))
    }

    fn need(&self, name: &str) -> OpResult<&'a Argument> {
        self.get(name)
            .ok_or_else(|| OpError(format!("argument '{name}' is missing")))
    }

    fn lookup(&self, name: &str) -> OpResult<&'a Value> {
        self.env
            .get(name)
            .or_else(|| self.constants.and_then(|c| c.get(name)))
            .ok_or_else(|| OpError(format!("value '{name}' is used before it is defined")))
    }

    fn wrong(&self, name: &str, want: &str, arg: &Argument) -> OpError {
        OpError(format!(
            "argument '{name}' should be {want}, found {}",
            arg.kind_name()
        ))
    }

    fn tensor_by_name(&self, value: &str) -> OpResult<Tensor> {
        match self.lookup(value)? {
            Value::Tensor(t) => Ok(t.clone()),
            _ => Err(OpError(format!("value '{value}' is not a tensor"))),
        }
    }

    /// A required tensor argument.
    pub fn tensor(&self, name: &str) -> OpResult<Tensor> {
        match self.need(name)? {
            Argument::AsTensor(t) => self.tensor_by_name(&t.name),
            Argument::AsOptionalTensor(OptionalTensorArgument::AsTensor(t)) => {
                self.tensor_by_name(&t.name)
            }
            other => Err(self.wrong(name, "a tensor", other)),
        }
    }

    /// An optional tensor argument (absent or None gives `None`).
    pub fn opt_tensor(&self, name: &str) -> OpResult<Option<Tensor>> {
        match self.get(name) {
            None | Some(Argument::AsNone(_)) => Ok(None),
            Some(Argument::AsOptionalTensor(OptionalTensorArgument::AsNone(_))) => Ok(None),
            Some(_) => self.tensor(name).map(Some),
        }
    }

    /// A `Tensor[]` argument.
    pub fn tensors(&self, name: &str) -> OpResult<Vec<Tensor>> {
        match self.need(name)? {
            Argument::AsTensors(ts) => ts.iter().map(|t| self.tensor_by_name(&t.name)).collect(),
            other => Err(self.wrong(name, "a list of tensors", other)),
        }
    }

    /// A `Tensor?[]` argument.
    pub fn opt_tensors(&self, name: &str) -> OpResult<Vec<Option<Tensor>>> {
        match self.need(name)? {
            Argument::AsOptionalTensors(ts) => ts
                .iter()
                .map(|t| match t {
                    OptionalTensorArgument::AsTensor(t) => self.tensor_by_name(&t.name).map(Some),
                    OptionalTensorArgument::AsNone(_) => Ok(None),
                })
                .collect(),
            Argument::AsTensors(ts) => ts
                .iter()
                .map(|t| self.tensor_by_name(&t.name).map(Some))
                .collect(),
            other => Err(self.wrong(name, "a list of optional tensors", other)),
        }
    }

    fn sym_int(&self, s: &SymIntArgument) -> OpResult<i64> {
        match s {
            SymIntArgument::AsInt(v) => Ok(*v),
            SymIntArgument::AsName(n) => match self.lookup(n)? {
                Value::Int(v) => Ok(*v),
                _ => Err(OpError(format!("value '{n}' is not an int"))),
            },
        }
    }

    /// A required int (or SymInt) argument.
    pub fn int(&self, name: &str) -> OpResult<i64> {
        match self.need(name)? {
            Argument::AsInt(v) => Ok(*v),
            Argument::AsSymInt(s) => self.sym_int(s),
            other => Err(self.wrong(name, "an int", other)),
        }
    }

    /// An int argument with the schema default `default`.
    pub fn int_or(&self, name: &str, default: i64) -> OpResult<i64> {
        if self.has(name) {
            self.int(name)
        } else {
            Ok(default)
        }
    }

    /// An optional int (absent or None gives `None`).
    pub fn opt_int(&self, name: &str) -> OpResult<Option<i64>> {
        if self.has(name) {
            self.int(name).map(Some)
        } else {
            Ok(None)
        }
    }

    /// A required `int[]` / `SymInt[]` argument.
    pub fn ints(&self, name: &str) -> OpResult<Vec<i64>> {
        match self.need(name)? {
            Argument::AsInts(v) => Ok(v.clone()),
            Argument::AsSymInts(v) => v.iter().map(|s| self.sym_int(s)).collect(),
            // `int[1]` arguments may be written as a single int.
            Argument::AsInt(v) => Ok(vec![*v]),
            Argument::AsSymInt(s) => Ok(vec![self.sym_int(s)?]),
            other => Err(self.wrong(name, "a list of ints", other)),
        }
    }

    /// An `int[]` argument with a default.
    pub fn ints_or(&self, name: &str, default: &[i64]) -> OpResult<Vec<i64>> {
        if self.has(name) {
            self.ints(name)
        } else {
            Ok(default.to_vec())
        }
    }

    /// An optional `int[]?` argument.
    pub fn opt_ints(&self, name: &str) -> OpResult<Option<Vec<i64>>> {
        if self.has(name) {
            self.ints(name).map(Some)
        } else {
            Ok(None)
        }
    }

    /// A required float argument (ints are accepted, as Python does).
    pub fn float(&self, name: &str) -> OpResult<f64> {
        self.scalar(name).map(Scalar::as_f64)
    }

    /// A float argument with a default.
    pub fn float_or(&self, name: &str, default: f64) -> OpResult<f64> {
        if self.has(name) {
            self.float(name)
        } else {
            Ok(default)
        }
    }

    /// An optional float argument.
    pub fn opt_float(&self, name: &str) -> OpResult<Option<f64>> {
        if self.has(name) {
            self.float(name).map(Some)
        } else {
            Ok(None)
        }
    }

    /// An optional `float[]?` argument.
    pub fn opt_floats(&self, name: &str) -> OpResult<Option<Vec<f64>>> {
        match self.get(name) {
            None | Some(Argument::AsNone(_)) => Ok(None),
            Some(Argument::AsFloats(v)) => Ok(Some(v.iter().map(|f| f.get()).collect())),
            Some(other) => Err(self.wrong(name, "a list of floats", other)),
        }
    }

    /// A `Scalar` argument.
    pub fn scalar(&self, name: &str) -> OpResult<Scalar> {
        self.scalar_of(name, self.need(name)?)
    }

    /// The scalar passed as the node's `index`-th input, whatever its name (the inputs of
    /// symbolic arithmetic such as `_operator.mul` are positional).
    pub fn scalar_at(&self, index: usize) -> OpResult<Scalar> {
        let input = self.node.inputs.get(index).ok_or_else(|| {
            OpError(format!(
                "the node has {} inputs, input {index} is read",
                self.node.inputs.len()
            ))
        })?;
        self.scalar_of(&input.name, &input.arg)
    }

    fn scalar_of(&self, name: &str, arg: &Argument) -> OpResult<Scalar> {
        use crate::schema::SymFloatArgument;
        let named = |n: &str| match self.lookup(n)? {
            Value::Float(v) => Ok(Scalar::Float(*v)),
            Value::Int(v) => Ok(Scalar::Int(*v)),
            Value::Bool(v) => Ok(Scalar::Bool(*v)),
            _ => Err(OpError(format!("value '{n}' is not a number"))),
        };
        match arg {
            Argument::AsInt(v) => Ok(Scalar::Int(*v)),
            Argument::AsFloat(v) => Ok(Scalar::Float(v.get())),
            Argument::AsBool(v) => Ok(Scalar::Bool(*v)),
            Argument::AsSymInt(s) => Ok(Scalar::Int(self.sym_int(s)?)),
            Argument::AsSymFloat(SymFloatArgument::AsFloat(v)) => Ok(Scalar::Float(v.get())),
            Argument::AsSymFloat(SymFloatArgument::AsName(n)) => named(n),
            Argument::AsSymBool(SymBoolArgument::AsBool(v)) => Ok(Scalar::Bool(*v)),
            Argument::AsSymBool(SymBoolArgument::AsName(n)) => named(n),
            other => Err(self.wrong(name, "a scalar", other)),
        }
    }

    /// A `Scalar` argument with a default.
    pub fn scalar_or(&self, name: &str, default: Scalar) -> OpResult<Scalar> {
        if self.has(name) {
            self.scalar(name)
        } else {
            Ok(default)
        }
    }

    /// A tensor, or a number where export wrote one.
    pub fn tensor_or_scalar(&self, name: &str) -> OpResult<TensorOrScalar> {
        match self.need(name)? {
            Argument::AsTensor(_) | Argument::AsOptionalTensor(_) => {
                self.tensor(name).map(TensorOrScalar::Tensor)
            }
            _ => self.scalar(name).map(TensorOrScalar::Scalar),
        }
    }

    /// A bool argument with a default.
    pub fn bool_or(&self, name: &str, default: bool) -> OpResult<bool> {
        match self.get(name) {
            None | Some(Argument::AsNone(_)) => Ok(default),
            Some(Argument::AsBool(b)) => Ok(*b),
            Some(Argument::AsSymBool(SymBoolArgument::AsBool(b))) => Ok(*b),
            Some(Argument::AsSymBool(SymBoolArgument::AsName(n))) => match self.lookup(n)? {
                Value::Bool(b) => Ok(*b),
                _ => Err(OpError(format!("value '{n}' is not a bool"))),
            },
            Some(other) => Err(self.wrong(name, "a bool", other)),
        }
    }

    /// A `str` argument with a default.
    pub fn str_or(&self, name: &str, default: &'a str) -> OpResult<&'a str> {
        match self.get(name) {
            None | Some(Argument::AsNone(_)) => Ok(default),
            Some(Argument::AsString(s)) => Ok(s),
            Some(other) => Err(self.wrong(name, "a string", other)),
        }
    }

    /// An optional `ScalarType` argument, as the torch enum int.
    pub fn opt_scalar_type(&self, name: &str) -> OpResult<Option<i64>> {
        match self.get(name) {
            None | Some(Argument::AsNone(_)) => Ok(None),
            Some(Argument::AsScalarType(v)) => Ok(Some(*v)),
            Some(other) => Err(self.wrong(name, "a dtype", other)),
        }
    }
}

/// Output of an op kernel: one value per schema output.
pub type Outputs = Vec<Value>;

/// Wrap a single tensor as an op's outputs.
pub fn one(t: Tensor) -> OpResult<Outputs> {
    Ok(vec![Value::Tensor(t)])
}
