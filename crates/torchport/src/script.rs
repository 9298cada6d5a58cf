//! What a TorchScript archive holds besides its `state_dict`, for a runtime that runs its code:
//! the module object tree of `data.pkl` with every attribute (not only tensors), the code
//! records (`code/**.py`, as stored), and the constants of `constants.pkl`. Read by
//! [`Checkpoint::script`](crate::Checkpoint::script); nothing here is run.

/// The code, module tree and constants of a TorchScript archive.
#[derive(Debug, Clone)]
pub struct Script {
    /// The root module.
    pub root: ScriptObject,
    /// Every code record as (record name under the archive's root, e.g.
    /// `code/__torch__/torch/nn/modules/linear.py`, bytes). `.debug_pkl` records are not
    /// included.
    pub code: Vec<(String, Vec<u8>)>,
    /// The tuple of `constants.pkl`: what the code reads as `CONSTANTS.c0`, `CONSTANTS.c1`, ….
    pub constants: Vec<ScriptValue>,
    /// The archive's file format version (its `version` record): which operator semantics
    /// its code was written for. torch writes the least version its code needs (torch 1.8
    /// and later 3 where no operator's meaning changed since; torch 1.4 wrote 1), and a
    /// loader runs the code of an older version through "upgraders" (before version 4, `div`
    /// of two integer operands truncates). `None` where the record is missing or not a
    /// number.
    pub version: Option<u64>,
}

/// An object of a `__torch__.*` class: a module or another scripted class instance.
#[derive(Debug, Clone)]
pub struct ScriptObject {
    /// The qualified class name as stored, mangling included
    /// (`__torch__.torch.nn.modules.linear.___torch_mangle_3.Linear`): the key to its code.
    pub class: String,
    /// Its attributes, in data.pkl's order.
    pub attrs: Vec<(String, ScriptValue)>,
}

/// One attribute value.
#[derive(Debug, Clone)]
pub enum ScriptValue {
    /// `None`.
    None,
    /// A bool.
    Bool(bool),
    /// An int.
    Int(i64),
    /// A float.
    Float(f64),
    /// A str.
    Str(String),
    /// A tensor, by its name among [`Checkpoint::tensors`](crate::Checkpoint::tensors) (a
    /// parameter or buffer) or [`Checkpoint::constants`](crate::Checkpoint::constants) (any
    /// other tensor: plain tensor attributes, tensors in lists, the code's constants).
    Tensor(String),
    /// A list.
    List(Vec<ScriptValue>),
    /// A tuple.
    Tuple(Vec<ScriptValue>),
    /// A dict, in order.
    Dict(Vec<(ScriptValue, ScriptValue)>),
    /// A scripted object (a submodule, or an instance of another `__torch__` class).
    Object(Box<ScriptObject>),
    /// Something else the pickle holds (its type, for error messages).
    Other(String),
}
