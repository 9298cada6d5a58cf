//! The fixed table of calls that rebuild tensors (`torch._utils._rebuild_tensor_v2` and its
//! relatives), each interpreted with checked arguments; every other call stays opaque.

use super::*;

/// The fixed table of calls that build tensors.
const REBUILD_FUNCTIONS: &[(&str, &str)] = &[
    ("torch._utils", "_rebuild_tensor"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_tensor_v3"),
    ("torch._utils", "_rebuild_parameter"),
    ("torch._utils", "_rebuild_parameter_with_state"),
    ("torch._utils", "_rebuild_qtensor"),
    ("torch._utils", "_rebuild_meta_tensor_no_storage"),
    ("torch._utils", "_rebuild_sparse_tensor"),
    ("torch._utils", "_rebuild_nested_tensor"),
    ("torch._utils", "_rebuild_device_tensor_from_numpy"),
    ("torch._utils", "_rebuild_device_tensor_from_cpu_tensor"),
    ("torch._utils", "_rebuild_xla_tensor"),
    ("torch._utils", "_rebuild_wrapper_subclass"),
    ("torch._tensor", "_rebuild_from_type"),
    ("torch._tensor", "_rebuild_from_type_v2"),
];

/// True for the globals torch.save uses to rebuild tensors (the known-safe table).
pub fn is_rebuild_function(module: &str, name: &str) -> bool {
    REBUILD_FUNCTIONS.contains(&(module, name))
}

impl<'a> Walker<'a> {
    /// Interpret one call of the rebuild table (these nest: a parameter wraps a tensor).
    pub(super) fn rebuild(
        &mut self,
        module: &str,
        func: &str,
        args: &[NodeId],
        name: &str,
    ) -> Result<TensorInfo> {
        if self.rebuilds >= MAX_CALL_NESTING {
            return Err(Error::tensor(
                self.path,
                name,
                format!("its rebuild calls nest more than {MAX_CALL_NESTING} deep"),
            ));
        }
        self.rebuilds += 1;
        let r = self.rebuild_call(module, func, args, name);
        self.rebuilds -= 1;
        r
    }

    fn rebuild_call(
        &mut self,
        module: &str,
        func: &str,
        args: &[NodeId],
        name: &str,
    ) -> Result<TensorInfo> {
        let bad = |what: String| Error::tensor(self.path, name, what);
        let arg = |i: usize| {
            args.get(i)
                .copied()
                .ok_or_else(|| bad(format!("{module}.{func} needs argument {i}")))
        };
        match func {
            "_rebuild_tensor" | "_rebuild_tensor_v2" | "_rebuild_tensor_v3"
            | "_rebuild_qtensor" => {
                let (index, storage_dtype) = self.storage_arg(arg(0)?, name)?;
                let offset = self.usize_arg(arg(1)?, name, "storage offset")?;
                let shape = self.usize_list(arg(2)?, name, "size")?;
                let strides = self.usize_list(arg(3)?, name, "stride")?;
                let mut dtype = storage_dtype;
                let mut quant = None;
                let mut requires_grad = false;
                match func {
                    "_rebuild_tensor_v2" => requires_grad = self.bool_arg(args.get(4)),
                    "_rebuild_tensor_v3" => {
                        requires_grad = self.bool_arg(args.get(4));
                        dtype = self.dtype_arg(arg(6)?, name)?;
                    }
                    "_rebuild_qtensor" => {
                        quant = Some(self.quant_arg(arg(4)?, name)?);
                        requires_grad = self.bool_arg(args.get(5));
                    }
                    _ => {}
                }
                self.strided(
                    name,
                    dtype,
                    shape,
                    strides,
                    offset,
                    index,
                    quant,
                    requires_grad,
                )
            }
            "_rebuild_parameter" | "_rebuild_parameter_with_state" => {
                let mut t = self.tensor_arg(arg(0)?, name)?;
                t.requires_grad = self.bool_arg(args.get(1));
                Ok(t)
            }
            "_rebuild_from_type" | "_rebuild_from_type_v2" => {
                // (func, new_type, args, state): func(*args), then a subclass cast.
                let inner = arg(0)?;
                let Some((m, f)) = self.callable(inner) else {
                    return Err(bad("the wrapped rebuild function is not a global".into()));
                };
                if !is_rebuild_function(m, f) {
                    return Err(bad(format!(
                        "the wrapped function {m}.{f} is not a tensor rebuild function"
                    )));
                }
                let p: &'a Pickle = self.p;
                let inner_args = p
                    .as_tuple_or_list(arg(2)?)
                    .ok_or_else(|| bad("the wrapped arguments are not a tuple".into()))?;
                self.rebuild(m, f, inner_args, name)
            }
            "_rebuild_meta_tensor_no_storage" => {
                let dtype = self.dtype_arg(arg(0)?, name)?;
                let shape = self.usize_list(arg(1)?, name, "size")?;
                let strides = self.usize_list(arg(2)?, name, "stride")?;
                check_view(dtype, &shape, &strides, 0, usize::MAX).map_err(bad)?;
                Ok(TensorInfo {
                    name: name.to_string(),
                    dtype,
                    shape,
                    strides,
                    offset: 0,
                    data: TensorData::Meta,
                    quant: None,
                    requires_grad: self.bool_arg(args.get(3)),
                })
            }
            "_rebuild_sparse_tensor" => {
                // The layout is `torch.serialization._get_layout('torch.sparse_coo')`.
                let layout = match args.first().map(|&l| self.p.get(l)) {
                    Some(PValue::Object(o)) => o.args.first().and_then(|&a| self.p.as_str(a)),
                    Some(PValue::Str(s)) => Some(s.as_str()),
                    _ => None,
                };
                let layout = layout
                    .unwrap_or("sparse")
                    .trim_start_matches("torch.")
                    .to_string();
                // data = (indices, values, size, …): take dtype and size from the values.
                let parts = args
                    .get(1)
                    .and_then(|&d| self.p.as_tuple_or_list(d))
                    .map(<[NodeId]>::to_vec)
                    .unwrap_or_default();
                // COO: (indices, values, size, …); compressed: (ci, pi, values, size).
                let values = parts.get(if layout == "sparse_coo" { 1 } else { 2 });
                let dtype = match values {
                    Some(&v) => self.tensor_arg(v, name)?.dtype,
                    None => DType::F32,
                };
                let shape = parts
                    .iter()
                    .find_map(|&s| self.usize_list(s, name, "size").ok())
                    .unwrap_or_default();
                self.unsupported(name, dtype, shape, format!("a {layout} tensor"))
            }
            other => self.unsupported(
                name,
                DType::F32,
                Vec::new(),
                format!("a tensor rebuilt by {module}.{other}"),
            ),
        }
    }

    /// A tensor whose data is not read; its shape must still describe a size that fits.
    fn unsupported(
        &self,
        name: &str,
        dtype: DType,
        shape: Vec<usize>,
        what: String,
    ) -> Result<TensorInfo> {
        let strides = contiguous_strides(&shape);
        check_view(dtype, &shape, &strides, 0, usize::MAX)
            .map_err(|e| Error::tensor(self.path, name, e))?;
        Ok(TensorInfo {
            name: name.to_string(),
            dtype,
            shape,
            strides,
            offset: 0,
            data: TensorData::Unsupported { what },
            quant: None,
            requires_grad: false,
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn strided(
        &self,
        name: &str,
        dtype: DType,
        shape: Vec<usize>,
        strides: Vec<usize>,
        offset: usize,
        storage: usize,
        quant: Option<Quant>,
        requires_grad: bool,
    ) -> Result<TensorInfo> {
        if shape.len() > self.limits.max_ndim {
            return Err(Error::tensor(
                self.path,
                name,
                format!(
                    "has {} dimensions, more than the limit of {} (Limits::max_ndim)",
                    shape.len(),
                    self.limits.max_ndim
                ),
            ));
        }
        check_view(dtype, &shape, &strides, offset, self.storage_len(storage))
            .map_err(|what| Error::tensor(self.path, name, what))?;
        Ok(TensorInfo {
            name: name.to_string(),
            dtype,
            shape,
            strides,
            offset,
            data: TensorData::Strided { storage },
            quant,
            requires_grad,
        })
    }

    fn storage_arg(&mut self, id: NodeId, name: &str) -> Result<(usize, DType)> {
        let payload = match self.p.get(id) {
            PValue::PersistentId(payload) => *payload,
            // A whole torch.save file nested in the pickle, as plain pickle.dumps writes it.
            PValue::Object(o) if crate::format::torch::nested::is_call(self.p, o) => {
                return self.nested_storage(o, name)
            }
            _ => {
                return Err(Error::tensor(
                    self.path,
                    name,
                    "its storage is not a persistent id",
                ))
            }
        };
        match self
            .r
            .persistent(self.p, payload)
            .map_err(|what| Error::tensor(self.path, name, what))?
        {
            Persistent::Storage { index, dtype } => Ok((index, dtype)),
            _ => Err(Error::tensor(
                self.path,
                name,
                "its storage id does not name a storage",
            )),
        }
    }

    pub(super) fn tensor_arg(&mut self, id: NodeId, name: &str) -> Result<TensorInfo> {
        let bad = |what: &str| Error::tensor(self.path, name, what.to_string());
        let p: &'a Pickle = self.p;
        match p.get(id) {
            PValue::Object(o) => {
                let (m, f) = self
                    .callable(o.callable)
                    .ok_or_else(|| bad("expected a tensor"))?;
                if !is_rebuild_function(m, f) {
                    return Err(bad(&format!("expected a tensor, found a {m}.{f} object")));
                }
                self.rebuild(m, f, &o.args, name)
            }
            PValue::PersistentId(payload) => {
                match self
                    .r
                    .persistent(self.p, *payload)
                    .map_err(|what| Error::tensor(self.path, name, what))?
                {
                    Persistent::Tensor(t) => Ok(*t),
                    _ => Err(bad("expected a tensor, found a storage")),
                }
            }
            _ => Err(bad("expected a tensor")),
        }
    }

    fn usize_arg(&self, id: NodeId, name: &str, what: &str) -> Result<usize> {
        self.p
            .as_int(id)
            .and_then(|i| usize::try_from(i).ok())
            .ok_or_else(|| {
                Error::tensor(
                    self.path,
                    name,
                    format!("its {what} is not a non-negative integer"),
                )
            })
    }

    pub(super) fn usize_list(&self, id: NodeId, name: &str, what: &str) -> Result<Vec<usize>> {
        // A `torch.Size` is recorded as a call on its tuple of sizes.
        let id = match self.p.get(id) {
            PValue::Object(o)
                if o.args.len() == 1 && self.p.as_global(o.callable) == Some(("torch", "Size")) =>
            {
                o.args[0]
            }
            _ => id,
        };
        let items = self
            .p
            .as_tuple_or_list(id)
            .ok_or_else(|| Error::tensor(self.path, name, format!("its {what} is not a tuple")))?;
        if items.len() > self.limits.max_ndim {
            return Err(Error::tensor(
                self.path,
                name,
                format!(
                    "its {what} has {} entries, more than Limits::max_ndim",
                    items.len()
                ),
            ));
        }
        items
            .iter()
            .map(|&i| self.usize_arg(i, name, what))
            .collect()
    }

    fn bool_arg(&self, id: Option<&NodeId>) -> bool {
        id.and_then(|&i| self.p.as_int(i)).is_some_and(|v| v != 0)
    }

    fn dtype_arg(&self, id: NodeId, name: &str) -> Result<DType> {
        let found = match self.p.get(id) {
            PValue::Global { module, name } if module == "torch" => DType::from_name(name),
            PValue::Str(s) => DType::from_name(s),
            _ => None,
        };
        found.ok_or_else(|| Error::tensor(self.path, name, "its dtype is not a known torch dtype"))
    }

    fn quant_arg(&mut self, id: NodeId, name: &str) -> Result<Quant> {
        let bad = |what: &str| Error::tensor(self.path, name, what.to_string());
        let p: &'a Pickle = self.p;
        let params = p
            .as_tuple_or_list(id)
            .ok_or_else(|| bad("its quantizer parameters are not a tuple"))?;
        let scheme: &str = match params.first().map(|&s| p.get(s)) {
            Some(PValue::Global { name, .. }) => name,
            Some(PValue::Str(s)) => s,
            _ => return Err(bad("its quantization scheme is missing")),
        };
        let float = |p: &Pickle, i: Option<&NodeId>| match i.map(|&i| p.get(i)) {
            Some(PValue::Float(f)) => Some(*f),
            Some(PValue::Int(v)) => Some(*v as f64),
            _ => None,
        };
        match (scheme, params.len()) {
            ("per_tensor_affine", 3) => Ok(Quant::PerTensor {
                scale: float(self.p, params.get(1))
                    .ok_or_else(|| bad("its scale is not a number"))?,
                zero_point: params
                    .get(2)
                    .and_then(|&z| self.p.as_int(z))
                    .ok_or_else(|| bad("its zero point is not an integer"))?,
            }),
            ("per_channel_affine" | "per_channel_affine_float_qparams", 4) => {
                let (scales, _) = self.f64_values(params[1], &format!("{name} (scales)"))?;
                let (zero_points, float_zero_points) =
                    self.f64_values(params[2], &format!("{name} (zero points)"))?;
                let axis = self.usize_arg(params[3], name, "quantization axis")?;
                // torch saves float_qparams tensors as `per_channel_affine` with float zero
                // points, and rebuilds them as float_qparams from that dtype.
                Ok(Quant::PerChannel {
                    scales,
                    zero_points,
                    axis,
                    float_qparams: scheme == "per_channel_affine_float_qparams"
                        || float_zero_points,
                })
            }
            _ => Err(bad(&format!(
                "its quantization scheme {scheme} is not supported"
            ))),
        }
    }

    /// Read a small tensor (or list of numbers) as f64 values, and whether they were stored
    /// as floating-point: per-channel quantization parameters are stored as tensors.
    /// Every decode is charged to the copy budget (a shared scales tensor is decoded once
    /// per quantized tensor that uses it).
    fn f64_values(&mut self, id: NodeId, name: &str) -> Result<(Vec<f64>, bool)> {
        if let Some(items) = self.p.as_tuple_or_list(id) {
            self.charge(items.len().saturating_mul(8)).map_err(|e| *e)?;
            let float = items
                .iter()
                .any(|&i| matches!(self.p.get(i), PValue::Float(_)));
            let values = items
                .iter()
                .filter_map(|&i| match self.p.get(i) {
                    PValue::Float(f) => Some(*f),
                    PValue::Int(v) => Some(*v as f64),
                    _ => None,
                })
                .collect();
            return Ok((values, float));
        }
        let t = self.tensor_arg(id, name)?;
        let TensorData::Strided { storage } = t.data else {
            return Err(Error::tensor(self.path, name, "has no data"));
        };
        self.charge(t.numel().saturating_mul(8)).map_err(|e| *e)?;
        let bytes = self
            .r
            .storages()
            .get(storage)
            .map(Storage::bytes)
            .unwrap_or_default();
        // The view was checked against its storage; only an overlapping one can be larger.
        if t.nbytes() > bytes.len() && t.nbytes() as u64 > self.limits.max_expanded_bytes {
            return Err(self.limit(
                &format!(
                    "tensor {name}'s data ({} bytes, an expanded view)",
                    t.nbytes()
                ),
                self.limits.max_expanded_bytes,
                "max_expanded_bytes",
            ));
        }
        let data = view_bytes(&t, bytes, self.order);
        let out = match t.dtype {
            DType::F64 => data
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect(),
            DType::F32 => data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap_or_default()) as f64)
                .collect(),
            DType::I64 => data
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or_default()) as f64)
                .collect(),
            DType::I32 => data
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap_or_default()) as f64)
                .collect(),
            other => {
                return Err(Error::tensor(
                    self.path,
                    name,
                    format!("is {other}, expected float or integer"),
                ))
            }
        };
        Ok((out, t.dtype.is_float()))
    }
}
