//! Owns the allow-list of globals: the only `module.name` references with which a pickle is
//! safe to hand to `torch.load`. Two tables, both plain data:
//!
//! - [`TORCH_WEIGHTS_ONLY`]: what torch 2.15's own `weights_only` unpickler accepts by
//!   default (`_get_allowed_globals` in `torch/_weights_only_unpickler.py`: tensor rebuild
//!   functions, storage and tensor classes, dtypes, quantization schemes, `torch.Size`,
//!   `torch.device`, `OrderedDict`, `Counter`, `set`, `complex`, `bytearray`,
//!   `_codecs.encode`). `tests/fixtures/gen/check_allow_list.py` compares it with the
//!   installed torch.
//! - [`TORCHPORT_DATA`]: data-only classes torchport reads as data that torch's default list
//!   leaves out (numpy arrays, dtypes and scalars, `argparse.Namespace`, `defaultdict`,
//!   plain builtin containers, torch's other rebuild functions and layouts). Each builds a
//!   value from its arguments and calls nothing it was given.
//!
//! A global on neither list is not imported by torchport, but `torch.load` would import and
//! call it: such a file is unsafe to `torch.load` even when torchport reads it.

use crate::globals::python3_module;

/// Which allow-list a global is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AllowList {
    /// Torch's own `weights_only` unpickler allow-list (torch 2.15).
    TorchWeightsOnly,
    /// torchport's documented data-only classes, outside torch's default list.
    TorchportData,
}

impl AllowList {
    /// `torch-weights-only` or `torchport-data`.
    pub fn name(self) -> &'static str {
        match self {
            AllowList::TorchWeightsOnly => "torch-weights-only",
            AllowList::TorchportData => "torchport-data",
        }
    }
}

/// Torch 2.15's `weights_only` allow-list, as the full paths it matches (`module.name`,
/// joined as torch joins them). 144 entries.
#[rustfmt::skip]
pub const TORCH_WEIGHTS_ONLY: &[&str] = &[
    "_codecs.encode",
    "builtins.bytearray", "builtins.complex", "builtins.set",
    "collections.Counter", "collections.OrderedDict",
    "torch.BFloat16Storage", "torch.BFloat16Tensor", "torch.BoolStorage", "torch.BoolTensor",
    "torch.ByteStorage", "torch.ByteTensor", "torch.CharStorage", "torch.CharTensor",
    "torch.ComplexDoubleStorage", "torch.ComplexFloatStorage", "torch.DoubleStorage",
    "torch.DoubleTensor", "torch.FloatStorage", "torch.FloatTensor", "torch.HalfStorage",
    "torch.HalfTensor", "torch.IntStorage", "torch.IntTensor", "torch.LongStorage",
    "torch.LongTensor", "torch.QInt32Storage", "torch.QInt8Storage", "torch.QUInt2x4Storage",
    "torch.QUInt4x2Storage", "torch.QUInt8Storage", "torch.ShortStorage", "torch.ShortTensor",
    "torch.Size", "torch.Tensor",
    "torch._tensor._rebuild_from_type_v2",
    "torch._utils._rebuild_device_tensor_from_cpu_tensor",
    "torch._utils._rebuild_device_tensor_from_numpy",
    "torch._utils._rebuild_meta_tensor_no_storage", "torch._utils._rebuild_parameter",
    "torch._utils._rebuild_parameter_with_state", "torch._utils._rebuild_qtensor",
    "torch._utils._rebuild_sparse_tensor", "torch._utils._rebuild_tensor",
    "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor_v3",
    "torch._utils._rebuild_wrapper_subclass",
    "torch.bcomplex32", "torch.bfloat16", "torch.bits16", "torch.bits1x8", "torch.bits2x4",
    "torch.bits4x2", "torch.bits8", "torch.bool", "torch.complex128", "torch.complex32",
    "torch.complex64",
    "torch.cuda.BFloat16Storage", "torch.cuda.BFloat16Tensor", "torch.cuda.BoolStorage",
    "torch.cuda.BoolTensor", "torch.cuda.ByteStorage", "torch.cuda.ByteTensor",
    "torch.cuda.CharStorage", "torch.cuda.CharTensor", "torch.cuda.ComplexDoubleStorage",
    "torch.cuda.ComplexFloatStorage", "torch.cuda.DoubleStorage", "torch.cuda.DoubleTensor",
    "torch.cuda.FloatStorage", "torch.cuda.FloatTensor", "torch.cuda.HalfStorage",
    "torch.cuda.HalfTensor", "torch.cuda.IntStorage", "torch.cuda.IntTensor",
    "torch.cuda.LongStorage", "torch.cuda.LongTensor", "torch.cuda.ShortStorage",
    "torch.cuda.ShortTensor",
    "torch.cuda.sparse.BFloat16Tensor", "torch.cuda.sparse.ByteTensor",
    "torch.cuda.sparse.CharTensor", "torch.cuda.sparse.DoubleTensor",
    "torch.cuda.sparse.FloatTensor", "torch.cuda.sparse.HalfTensor",
    "torch.cuda.sparse.IntTensor", "torch.cuda.sparse.LongTensor",
    "torch.cuda.sparse.ShortTensor",
    "torch.device", "torch.float16", "torch.float32", "torch.float4_e2m1fn_x2", "torch.float64",
    "torch.float8_e4m3fn", "torch.float8_e4m3fnuz", "torch.float8_e5m2", "torch.float8_e5m2fnuz",
    "torch.float8_e8m0fnu", "torch.int1", "torch.int16", "torch.int2", "torch.int3",
    "torch.int32", "torch.int4", "torch.int5", "torch.int6", "torch.int64", "torch.int7",
    "torch.int8",
    "torch.nn.parameter.Parameter",
    "torch.per_channel_affine", "torch.per_channel_affine_float_qparams",
    "torch.per_channel_symmetric", "torch.per_tensor_affine", "torch.per_tensor_symmetric",
    "torch.qint32", "torch.qint8", "torch.quint2x4", "torch.quint4x2", "torch.quint8",
    "torch.serialization._get_layout",
    "torch.sparse.BFloat16Tensor", "torch.sparse.ByteTensor", "torch.sparse.CharTensor",
    "torch.sparse.DoubleTensor", "torch.sparse.FloatTensor", "torch.sparse.HalfTensor",
    "torch.sparse.IntTensor", "torch.sparse.LongTensor", "torch.sparse.ShortTensor",
    "torch.storage.TypedStorage", "torch.storage.UntypedStorage",
    "torch.uint1", "torch.uint16", "torch.uint2", "torch.uint3", "torch.uint32", "torch.uint4",
    "torch.uint5", "torch.uint6", "torch.uint64", "torch.uint7", "torch.uint8",
];

/// Data-only globals outside torch's default list that torchport reads as data.
#[rustfmt::skip]
pub const TORCHPORT_DATA: &[&str] = &[
    // containers and scalars: a value from its arguments
    "collections.defaultdict",
    "builtins.list", "builtins.dict", "builtins.tuple", "builtins.frozenset",
    "builtins.int", "builtins.float", "builtins.str", "builtins.bytes", "builtins.bool",
    "builtins.slice", "builtins.range", "builtins.object",
    // protocols 0 and 1 spell NEWOBJ as a call of this; the class it names is checked itself
    "copyreg._reconstructor",
    // training scripts' hyper-parameters
    "argparse.Namespace",
    // numpy arrays, dtypes and scalars (numpy 1 and numpy 2 module names)
    "numpy.ndarray", "numpy.dtype",
    "numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct",
    "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar",
    "numpy.core.numeric._frombuffer", "numpy._core.numeric._frombuffer",
    // torch rebuild functions torchport interprets that torch's default list leaves out
    "torch._tensor._rebuild_from_type",
    "torch._utils._rebuild_nested_tensor",
    "torch._utils._rebuild_xla_tensor",
    // torch 1.2 TorchScript archives: a tensor of the archive's own table, by index
    "torch.jit._pickle.build_tensor_from_id",
    // layouts, pickled by name
    "torch.strided", "torch.sparse_coo", "torch.sparse_csr", "torch.sparse_csc",
    "torch.sparse_bsr", "torch.sparse_bsc",
];

/// The allow-list `module.name` is on, if any. `name` may be dotted (protocol 4 qualified
/// names); the check is on the joined path, as torch makes it, after reading Python 2 module
/// names (`__builtin__`, `copy_reg`) as their Python 3 names, as torch does.
pub fn allow_list(module: &str, name: &str) -> Option<AllowList> {
    let full = format!("{}.{name}", python3_module(module));
    if TORCH_WEIGHTS_ONLY.contains(&full.as_str()) {
        Some(AllowList::TorchWeightsOnly)
    } else if TORCHPORT_DATA.contains(&full.as_str()) {
        Some(AllowList::TorchportData)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::is_dangerous_global;

    #[test]
    fn sizes_and_lookups() {
        assert_eq!(TORCH_WEIGHTS_ONLY.len(), 144);
        let mut all: Vec<_> = TORCH_WEIGHTS_ONLY.iter().chain(TORCHPORT_DATA).collect();
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "an entry is on both lists or twice on one");
        for g in all {
            let (m, n) = g.rsplit_once('.').unwrap();
            assert!(!is_dangerous_global(m, n), "{g} is allowed and dangerous");
        }
        let torch = Some(AllowList::TorchWeightsOnly);
        let ours = Some(AllowList::TorchportData);
        assert_eq!(allow_list("torch._utils", "_rebuild_tensor_v2"), torch);
        assert_eq!(allow_list("torch", "nn.parameter.Parameter"), torch);
        assert_eq!(allow_list("__builtin__", "set"), torch);
        assert_eq!(allow_list("torch", "FloatStorage"), torch);
        assert_eq!(allow_list("numpy._core.multiarray", "scalar"), ours);
        assert_eq!(allow_list("argparse", "Namespace"), ours);
        assert_eq!(allow_list("copy_reg", "_reconstructor"), ours);
        for (m, n) in [
            ("torch.storage", "_load_from_bytes"),
            ("tiny_models", "TinyNet"),
            ("torch.nn.modules.linear", "Linear"),
            ("builtins", "setattr"),
            ("collections", "OrderedDict.__init__"),
            ("torch", "_utils"),
        ] {
            assert_eq!(allow_list(m, n), None, "{m}.{n}");
        }
    }
}
