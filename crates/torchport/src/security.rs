//! Classification of the globals a file's pickles reference: known-safe (torch rebuild
//! functions, storage classes, dtypes, containers), dangerous (refused), or unknown but
//! inert (recorded as data, never imported).

use crate::dtype::DType;

/// How a referenced global is treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GlobalClass {
    /// Interpreted by torchport: tensor rebuild functions, storage classes, dtypes, containers.
    KnownSafe,
    /// Not interpreted; recorded as data (an object's class name), never imported or called.
    Inert,
    /// Could only mean code execution or I/O; files referencing it are refused.
    Dangerous,
}

impl GlobalClass {
    /// `known-safe`, `inert` or `dangerous`.
    pub fn name(self) -> &'static str {
        match self {
            GlobalClass::KnownSafe => "known-safe",
            GlobalClass::Inert => "inert",
            GlobalClass::Dangerous => "dangerous",
        }
    }
}

/// Classify one global.
pub fn classify(module: &str, name: &str) -> GlobalClass {
    if torchport_pickle::is_dangerous_global(module, name) {
        return GlobalClass::Dangerous;
    }
    let safe = crate::interpret::is_rebuild_function(module, name)
        || (module == "torch"
            && (DType::from_storage_class(name).is_some() || DType::from_name(name).is_some()))
        || (module == "torch" && name.starts_with("per_"))
        || (module == "torch"
            && matches!(
                name,
                "device"
                    | "Size"
                    | "sparse_coo"
                    | "sparse_csr"
                    | "sparse_csc"
                    | "sparse_bsr"
                    | "sparse_bsc"
            ))
        || matches!(
            (module, name),
            ("collections", "OrderedDict")
                | ("torch.nn.parameter", "Parameter")
                | ("torch.serialization", "_get_layout")
                | ("_codecs", "encode")
                | ("copyreg", "_reconstructor")
                | (
                    "builtins",
                    "set"
                        | "frozenset"
                        | "object"
                        | "list"
                        | "dict"
                        | "tuple"
                        | "int"
                        | "float"
                        | "str"
                        | "bytes"
                        | "bool"
                        | "complex"
                        | "slice"
                        | "range"
                        | "bytearray"
                )
                | ("__builtin__", "set" | "frozenset" | "object")
                | ("numpy.core.multiarray" | "numpy._core.multiarray", "scalar")
                | ("numpy", "dtype")
        );
    if safe {
        GlobalClass::KnownSafe
    } else {
        GlobalClass::Inert
    }
}
