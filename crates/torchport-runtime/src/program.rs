//! `Program`: a loaded exported program (graph + weights) and the interpreter that runs it.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use candle_core::{DType, Tensor};

use crate::dtype::{self, ScalarType};
use crate::dynamic_dims::{check_dynamic_dims, dim_ranges, DimRange};
use crate::error::{Error, Result};
use crate::fast::{HashMap as FastMap, HashSet as FastSet};
use crate::ops::packed::Source;
use crate::ops::{op_key, OpFn, Registry};
use crate::schema::{Argument, ExportedProgram, InputSpec, OutputSpec, TensorMeta};
use crate::value::{Args, Env, Value};

/// How often one operator is used by a program, and whether the runtime implements it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpUse {
    /// The overload, e.g. `aten.conv2d.default`.
    pub op: String,
    /// Number of nodes calling it.
    pub count: usize,
    /// Whether the registry has a kernel for it.
    pub supported: bool,
}

/// Time spent in one operator during [`Program::profile`].
#[derive(Debug, Clone)]
pub struct OpTime {
    /// The overload.
    pub op: String,
    /// Total time in its kernels.
    pub total: std::time::Duration,
    /// Nodes run.
    pub count: usize,
}

/// Time spent in one node of a run ([`Program::profile_nodes`]).
#[derive(Debug, Clone)]
pub struct NodeTime {
    /// The node's name in the graph (as the load left it: fused nodes keep the name of the
    /// node they replaced).
    pub node: String,
    /// Its overload (`aten.conv2d.default`, `torchport.linear_packed.default`).
    pub op: String,
    /// Time in its kernel.
    pub time: std::time::Duration,
    /// The shape of its first output, if that is a tensor (empty otherwise).
    pub shape: Vec<usize>,
}

/// What a user input of the program expects.
#[derive(Debug, Clone)]
pub struct InputInfo {
    /// The placeholder's name in the graph.
    pub name: String,
    /// Torch dtype (`ScalarType` int).
    pub dtype: ScalarType,
    /// Sizes; `None` for a symbolic (dynamic) dim.
    pub sizes: Vec<Option<i64>>,
}

/// A loaded program, ready to run.
pub struct Program {
    ep: ExportedProgram,
    /// Parameters, buffers and constants by placeholder name; buffers the program mutates
    /// are replaced by their new values after each run. A run reads them where they are
    /// (from the map as it was when the run started), without copying them into its own
    /// environment.
    weights: RwLock<Arc<Env>>,
    /// Buffer mutations, applied after each run.
    mutations: Vec<BufferUpdate>,
    kernels: Vec<Option<OpFn>>,
    unsupported: Vec<String>,
    inputs: Vec<InputInfo>,
    outputs: Vec<Argument>,
    /// Per node: values whose last use is this node (freed after it runs).
    frees: Vec<Vec<String>>,
    /// Per node: whether it is an in-place op (run as its functional form, the result
    /// bound to the mutated input's name too: [`bind_outputs`]).
    in_place: Vec<bool>,
    /// Per user input, per dim: the symbol of a dynamic dim and its allowed range.
    dim_ranges: Vec<Vec<Option<DimRange>>>,
    /// For a program recorded from a TorchScript run ([`Program::specialised`]): per node,
    /// the sizes each of its outputs must have (by output position: one tensor's, or those of
    /// each tensor of a list), checked as it runs; empty otherwise.
    recorded_sizes: Vec<Vec<(usize, Vec<Vec<usize>>)>>,
}

/// Every operator `ep` uses, with its count and whether `registry` has a kernel for it,
/// sorted by operator.
pub fn op_uses(ep: &ExportedProgram, registry: &Registry) -> Vec<OpUse> {
    // Wrapper calls count as the ops of the subgraphs they wrap (as the program runs them).
    let mut g = ep.graph_module.graph.clone();
    if crate::subgraphs::inline_wrappers(&mut g).is_err() {
        g = ep.graph_module.graph.clone();
    }
    tally(
        g.nodes
            .iter()
            .map(|n| (n.target.as_str(), registry.get(&n.target).is_some())),
    )
}

/// Count `(target, supported)` uses by operator key, sorted by operator.
pub(crate) fn tally<'a>(uses: impl Iterator<Item = (&'a str, bool)>) -> Vec<OpUse> {
    let mut m: BTreeMap<String, (usize, bool)> = BTreeMap::new();
    for (target, supported) in uses {
        m.entry(op_key(target).to_string())
            .or_insert((0, supported))
            .0 += 1;
    }
    m.into_iter()
        .map(|(op, (count, supported))| OpUse {
            op,
            count,
            supported,
        })
        .collect()
}

impl Program {
    /// Load a `.pt2` archive written by `torch.export.save`: the program and its weights.
    pub fn load(path: impl AsRef<Path>) -> Result<Program> {
        let (ep, payloads, decoded) = read_for_build(path.as_ref(), true)?;
        Program::build(ep, payloads, Registry::all_ops(), true, Some(decoded))
    }

    /// [`Program::load`] with the kernels of `registry` instead of this crate's own: start
    /// from [`Registry::with_all_ops`] and [`Registry::add`] a kernel to support an op the
    /// runtime lacks or to replace one.
    ///
    /// ```no_run
    /// use torchport_runtime::{ops::Registry, Program};
    /// let mut registry = Registry::with_all_ops();
    /// // A kernel reads its arguments by ATen schema name.
    /// registry.add("aten.my_op.default", |args| {
    ///     torchport_runtime::value::one(args.tensor("self")?)
    /// });
    /// let program = Program::load_with_registry("model.pt2", &registry)?;
    /// # Ok::<(), torchport_runtime::Error>(())
    /// ```
    pub fn load_with_registry(path: impl AsRef<Path>, registry: &Registry) -> Result<Program> {
        let (ep, payloads, decoded) = read_for_build(path.as_ref(), false)?;
        Program::build(ep, payloads, registry, false, Some(decoded))
    }

    /// Build a program from a parsed graph and its weights by state_dict name (parameters,
    /// buffers) or constant name, as held in the runtime representation (f32 / i64 / u8).
    pub fn from_parts(ep: ExportedProgram, payloads: HashMap<String, Tensor>) -> Result<Program> {
        Program::build(
            ep,
            payloads.into_iter().collect(),
            Registry::all_ops(),
            true,
            None,
        )
    }

    /// [`Program::from_parts`] with the kernels of `registry` (see
    /// [`Program::load_with_registry`]). Batch norms are still folded into the convolutions
    /// before them (the program computes the same with any correct kernels), but activations
    /// are not fused into convolutions: that hands the conv kernel an argument only this
    /// crate's own kernel reads. Nor are the nodes computed from weights alone run at load
    /// ([`crate::prepare::fold_constants`]): that would call the caller's kernels during the
    /// build.
    pub fn from_parts_with_registry(
        ep: ExportedProgram,
        payloads: HashMap<String, Tensor>,
        registry: &Registry,
    ) -> Result<Program> {
        Program::build(ep, payloads.into_iter().collect(), registry, false, None)
    }

    /// Bind the weights, rewrite the graph for speed, and look up every node's kernel.
    /// `own_kernels`: `registry` is this crate's, so kernel-specific fusions apply.
    /// `owned`: nothing outside `payloads` holds its tensors (they were decoded by the load),
    /// so a rewrite may change one in place; it says which conv weights the load already
    /// scaled for their batch norm's fold, which weights it packed, and the folds it planned
    /// (see `read_for_build`).
    fn build(
        mut ep: ExportedProgram,
        payloads: FastMap<String, Tensor>,
        registry: &Registry,
        own_kernels: bool,
        mut owned: Option<Decoded>,
    ) -> Result<Program> {
        let g = &ep.graph_module.graph;
        let specs = &ep.graph_module.signature.input_specs;
        if specs.len() != g.inputs.len() {
            return Err(Error::Program(format!(
                "the signature describes {} inputs but the graph has {}",
                specs.len(),
                g.inputs.len()
            )));
        }
        let mut weights =
            FastMap::with_capacity_and_hasher(specs.len(), foldhash::fast::RandomState::default());
        let mut prescaled = FastSet::default();
        // Packed weights by graph input: (n, k), output and input features.
        let mut packed = FastMap::default();
        // Of those, the convolutions' weights: their [co, ci, kh, kw] by tensor (the fold
        // renames them).
        let mut packed_convs: FastMap<candle_core::TensorId, Vec<usize>> = FastMap::default();
        let packing = crate::ops::packed::Packing::detect();
        let mut inputs = Vec::new();
        for spec in specs {
            let (arg, fqn) = match (spec.weight(), spec) {
                (Some(weight), _) => weight,
                (None, InputSpec::UserInput { arg }) => {
                    let Argument::AsTensor(t) = arg else {
                        return Err(Error::Program(format!(
                            "user input of kind {} is not supported (only tensors)",
                            arg.kind_name()
                        )));
                    };
                    let meta = g.tensor_values.get(&t.name).ok_or_else(|| {
                        Error::Program(format!("user input '{}' has no tensor metadata", t.name))
                    })?;
                    inputs.push(input_info(&t.name, meta));
                    continue;
                }
                (
                    None,
                    InputSpec::CustomObj {
                        custom_obj_name, ..
                    },
                ) => {
                    return Err(Error::Program(format!(
                        "custom object input '{custom_obj_name}' is not supported"
                    )))
                }
                (None, InputSpec::Token { .. }) => {
                    return Err(Error::Program(
                        "effect tokens (side-effecting ops) are not supported".into(),
                    ))
                }
                (None, InputSpec::ConstantInput { name, .. }) => {
                    return Err(Error::Program(format!(
                        "constant input '{name}' is not supported"
                    )))
                }
                (None, _) => {
                    return Err(Error::Program(
                        "an input of a kind the runtime does not know".into(),
                    ))
                }
            };
            let t = payloads.get(fqn).ok_or_else(|| Error::Weight {
                name: fqn.to_string(),
                what: "the program needs it but the archive does not hold it".into(),
            })?;
            let stored = owned.as_ref().and_then(|o| o.packed.get(fqn));
            let is_packed = stored.is_some();
            if let Some(meta) = g.tensor_values.get(&arg.name) {
                if let Some(s) = meta.static_sizes() {
                    let mut want: Vec<usize> = s.iter().map(|&v| v.max(0) as usize).collect();
                    if let (Some(&(source, (n, k))), Some(pk)) = (stored, packing) {
                        // Decoded packed (read_for_build): its values, 1-d, which hold the
                        // graph's shape only if the archive stored that one.
                        if source.features(&want) != Some((n, k)) {
                            return Err(Error::Weight {
                                name: fqn.to_string(),
                                what: format!(
                                    "stored with {n} outputs of {k} inputs ({source:?}) but the \
                                     graph expects shape {want:?}"
                                ),
                            });
                        }
                        packed.insert(arg.name.clone(), (n, k));
                        if want.len() == 4 {
                            packed_convs.insert(t.id(), want.clone());
                        }
                        want = pk.len(n, k).into_iter().collect();
                    }
                    if t.dims() != want.as_slice() {
                        return Err(Error::Weight {
                            name: fqn.to_string(),
                            what: format!("shape {:?} but the graph expects {want:?}", t.dims()),
                        });
                    }
                }
            }
            if owned.as_ref().is_some_and(|o| o.prescaled.contains(fqn)) {
                prescaled.insert(arg.name.clone());
            }
            if is_packed && !packed.contains_key(&arg.name) {
                return Err(Error::Weight {
                    name: fqn.to_string(),
                    what: "decoded packed, but the graph gives it no static [n, k] shape".into(),
                });
            }
            weights.insert(arg.name.clone(), t.clone());
        }
        // The weights now held only by `weights`: a rewrite that replaces one (a folded
        // convolution, a transposed Linear weight) frees the old copy at once.
        drop(payloads);
        // A loaded graph comes with these rewrites made (`read_for_build`).
        let final_names = match owned.as_mut() {
            Some(decoded) => std::mem::take(&mut decoded.final_names),
            None => {
                crate::subgraphs::inline_wrappers(&mut ep.graph_module.graph)?;
                crate::views::write_back_view_updates(&mut ep.graph_module.graph)
            }
        };
        if own_kernels {
            // Nodes computed from weights alone, computed now. Not constant: the buffers the
            // program updates. Not to be read as they are: weights decoded packed or scaled
            // for a batch norm fold.
            let mut keep = updated_buffers(&ep, &final_names);
            keep.extend(packed.keys().cloned());
            keep.extend(prescaled.iter().cloned());
            let folded = crate::prepare::fold_constants(
                &mut ep.graph_module.graph,
                &mut weights,
                registry,
                |n| keep.contains(n),
            );
            if folded > 0 {
                // The graph the load planned its folds on has changed: plan them again.
                if let Some(decoded) = owned.as_mut() {
                    decoded.bn_folds = None;
                }
            }
            // The decomposed export's Linears as Linears (a loaded graph has them already:
            // `read_for_build` made them before it chose the weights to pack).
            if owned.is_none() {
                crate::prepare::linears_from_products(&mut ep.graph_module.graph, |n| {
                    weights.contains_key(n)
                });
            }
        }
        crate::prepare::fold_batch_norms_with(
            &mut ep.graph_module.graph,
            &mut weights,
            owned.is_some(),
            &prescaled,
            &packed_convs,
            owned.and_then(|decoded| decoded.bn_folds),
        )
        .map_err(Error::Program)?;
        if own_kernels {
            crate::prepare::fuse_conv_activations(&mut ep.graph_module.graph);
            crate::prepare::fuse_conv_residuals(&mut ep.graph_module.graph);
            crate::prepare::drop_inference_dropouts(&mut ep.graph_module.graph);
            crate::prepare::fuse_pointwise_chains(&mut ep.graph_module.graph);
            crate::prepare::drop_unread_pool_indices(&mut ep.graph_module.graph);
            let g = &mut ep.graph_module.graph;
            crate::prepare::pack_small_convs(g, &mut weights, &packed_convs)
                .map_err(Error::Program)?;
            crate::prepare::transform_winograd_convs(g, &mut weights);
        }
        crate::prepare::pack_linears(&mut ep.graph_module.graph, &packed)
            .map_err(Error::Program)?;
        if own_kernels {
            crate::prepare::fuse_linear_epilogues(&mut ep.graph_module.graph);
        }
        let g = &ep.graph_module.graph;
        crate::prepare::pretranspose_linear_weights(g, &mut weights);
        let (outputs, mut mutations) = user_outputs(&ep)?;
        refuse_input_updates(&ep, &final_names)?;
        mutations.extend(inplace_buffer_updates(&ep, &final_names));
        // Values kept to the end of a run: what it returns and the buffers' new values.
        let mut kept = outputs.clone();
        kept.extend(mutations.iter().map(|(value, _)| {
            Argument::AsTensor(crate::schema::TensorArgument {
                name: value.clone(),
            })
        }));

        let dim_ranges = dim_ranges(&ep, &inputs);
        let mut kernels = Vec::with_capacity(g.nodes.len());
        let mut unsupported = BTreeMap::new();
        for node in &g.nodes {
            let k = registry.get(&node.target);
            if k.is_none() {
                unsupported.insert(op_key(&node.target).to_string(), ());
            }
            kernels.push(k);
        }
        check_as_strided(g)?;
        crate::views::check_inplace_views(g, &kept)?;
        let frees = last_uses(&ep, &kept);
        let in_place = g
            .nodes
            .iter()
            .map(|n| crate::ops::is_in_place(op_key(&n.target)))
            .collect();
        let weights = weights
            .into_iter()
            .map(|(name, t)| (name, Value::Tensor(t)))
            .collect();
        Ok(Program {
            ep,
            weights: RwLock::new(Arc::new(weights)),
            mutations,
            kernels,
            unsupported: unsupported.into_keys().collect(),
            inputs,
            outputs,
            frees,
            in_place,
            dim_ranges,
            recorded_sizes: Vec::new(),
        })
    }

    /// A program recorded from a TorchScript run (`torchscript::specialise`), built as
    /// [`Program::from_parts`] builds one, that checks as it runs that every node's tensor
    /// outputs have the sizes the recording saw (where its graph gives them) and fails where
    /// one does not: the recording holds for inputs of its sizes only while every size is
    /// the one seen.
    pub(crate) fn specialised(
        ep: ExportedProgram,
        payloads: HashMap<String, Tensor>,
    ) -> Result<Program> {
        let mut p = Program::from_parts(ep, payloads)?;
        let g = &p.ep.graph_module.graph;
        p.recorded_sizes = g
            .nodes
            .iter()
            .map(|node| {
                let sizes = |name: &str| -> Option<Vec<usize>> {
                    let s = g.tensor_values.get(name)?.static_sizes()?;
                    s.iter().map(|&d| usize::try_from(d).ok()).collect()
                };
                node.outputs
                    .iter()
                    .enumerate()
                    .filter_map(|(i, o)| match o {
                        Argument::AsTensor(t) => Some((i, vec![sizes(&t.name)?])),
                        Argument::AsTensors(ts) => {
                            Some((i, ts.iter().map(|t| sizes(&t.name)).collect::<Option<_>>()?))
                        }
                        _ => None,
                    })
                    .collect()
            })
            .collect();
        Ok(p)
    }

    /// The parsed program.
    pub fn exported_program(&self) -> &ExportedProgram {
        &self.ep
    }

    /// The user inputs, in order.
    pub fn inputs(&self) -> &[InputInfo] {
        &self.inputs
    }

    /// The torch dtype of each user output (`ScalarType` ints), where known.
    pub fn output_dtypes(&self) -> Vec<Option<ScalarType>> {
        let tv = &self.ep.graph_module.graph.tensor_values;
        self.outputs
            .iter()
            .map(|o| match o {
                Argument::AsTensor(t) => tv.get(&t.name).map(|m| m.dtype),
                _ => None,
            })
            .collect()
    }

    /// Every operator the program uses, with its count and whether it is supported, as run:
    /// after the load-time rewrites (batch norms and activations folded into convolutions are
    /// gone, elementwise chains are `torchport.pointwise.default`, Linears and other products
    /// whose weight is packed are `torchport.linear_packed.default`; see
    /// [`Program::ops_of`] for the archive's program as exported).
    pub fn ops(&self) -> Vec<OpUse> {
        let nodes = self.ep.graph_module.graph.nodes.iter();
        tally(
            nodes
                .zip(&self.kernels)
                .map(|(n, k)| (n.target.as_str(), k.is_some())),
        )
    }

    /// Every operator of the `.pt2` archive at `path`, as [`Program::ops`] lists them, read
    /// from its program alone: no weight is decoded and the program is not built.
    pub fn ops_of(path: impl AsRef<Path>) -> Result<Vec<OpUse>> {
        let ep = crate::archive::read_program(path.as_ref())?;
        Ok(op_uses(&ep, Registry::all_ops()))
    }

    /// Operators the runtime lacks (empty when the program can run).
    pub fn unsupported_ops(&self) -> &[String] {
        &self.unsupported
    }

    /// Run the program on `inputs` (one tensor per user input, in order). Float inputs may be
    /// any float dtype (they are rounded to the declared dtype, then computed in f32); integer
    /// inputs any integer dtype; bool inputs u8. Outputs come back in their declared dtype where
    /// candle has it (f32, f16, bf16, f64, i64, i32), bool as u8 0/1; a number the program
    /// returns as a 0-d tensor (int as i64, float as f64, bool as u8).
    ///
    /// The run happens on a thread of rayon's pool (the caller's own pool when called from
    /// one), so that each kernel's serial parts run on the same threads as its parallel loops
    /// and find the data in the same caches. So at most as many runs proceed at once as the
    /// pool has threads; [`Program::run_here`] runs on the calling thread instead.
    pub fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        in_pool(|| self.run_inner(inputs, None))
    }

    /// Run like [`Program::run`], but walk the graph on the calling thread (kernels' parallel
    /// loops still use rayon's pool): for a server whose own threads are meant to be the
    /// parallelism, e.g. many threads each running the program with `RAYON_NUM_THREADS=1`,
    /// where [`Program::run`] would queue every run behind the pool's one thread.
    pub fn run_here(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.run_inner(inputs, None)
    }

    /// Run like [`Program::run`] and also return the time spent in each operator (total,
    /// node count), slowest first: what to look at before optimizing.
    pub fn profile(&self, inputs: &[Tensor]) -> Result<(Vec<Tensor>, Vec<OpTime>)> {
        let (out, nodes) = self.profile_nodes(inputs)?;
        let mut times: HashMap<String, OpTime> = HashMap::new();
        for n in nodes {
            let e = times.entry(n.op).or_insert_with_key(|op| OpTime {
                op: op.clone(),
                total: std::time::Duration::ZERO,
                count: 0,
            });
            e.total += n.time;
            e.count += 1;
        }
        let mut v: Vec<OpTime> = times.into_values().collect();
        v.sort_by_key(|o| std::cmp::Reverse(o.total));
        Ok((out, v))
    }

    /// Run like [`Program::run`] and also return the time spent in each node, in the graph's
    /// order, with its operator and output shape: which layer to look at (a convolution that
    /// scales worse than the others with threads, say).
    pub fn profile_nodes(&self, inputs: &[Tensor]) -> Result<(Vec<Tensor>, Vec<NodeTime>)> {
        let mut nodes = Vec::with_capacity(self.ep.graph_module.graph.nodes.len());
        let out = in_pool(|| self.run_inner(inputs, Some(&mut nodes)))?;
        Ok((out, nodes))
    }

    /// The graph walk behind [`Program::run`], [`Program::run_here`] and the profiles, on the
    /// calling thread; each node's time recorded in `times` when given.
    fn run_inner(
        &self,
        inputs: &[Tensor],
        mut times: Option<&mut Vec<NodeTime>>,
    ) -> Result<Vec<Tensor>> {
        if !self.unsupported.is_empty() {
            return Err(Error::UnsupportedOps(self.unsupported.clone()));
        }
        if inputs.len() != self.inputs.len() {
            return Err(Error::InputCount {
                expected: self.inputs.len(),
                got: inputs.len(),
            });
        }
        let constants = Arc::clone(&self.weights.read().unwrap_or_else(|e| e.into_inner()));
        let mut env = Env::with_capacity_and_hasher(
            self.ep.graph_module.graph.nodes.len() * 2,
            Default::default(),
        );
        for (i, (info, t)) in self.inputs.iter().zip(inputs).enumerate() {
            env.insert(info.name.clone(), Value::Tensor(check_input(i, info, t)?));
        }
        check_dynamic_dims(inputs, &self.inputs, &self.dim_ranges)?;
        let g = &self.ep.graph_module.graph;
        for (i, node) in g.nodes.iter().enumerate() {
            let name = || node.name.clone().unwrap_or_else(|| format!("#{i}"));
            let op_err = |what: String| Error::Op {
                node: name(),
                target: op_key(&node.target).to_string(),
                what,
            };
            let Some(kernel) = self.kernels[i] else {
                return Err(Error::UnsupportedOps(vec![node.target.clone()]));
            };
            let start = times.as_ref().map(|_| std::time::Instant::now());
            let args = Args::with_constants(node, &env, &constants);
            let outs = crate::ops::call(kernel, &args).map_err(|e| op_err(e.0))?;
            if let Some(expected) = self.recorded_sizes.get(i) {
                check_recorded_sizes(&outs, expected).map_err(op_err)?;
            }
            if let (Some(t), Some(start)) = (times.as_deref_mut(), start) {
                let time = start.elapsed();
                let shape = match outs.first() {
                    Some(Value::Tensor(x)) => x.dims().to_vec(),
                    _ => Vec::new(),
                };
                t.push(NodeTime {
                    node: name(),
                    op: op_key(&node.target).to_string(),
                    time,
                    shape,
                });
            }
            bind_outputs(node, outs, &mut env, &constants, self.in_place[i]).map_err(op_err)?;
            for dead in &self.frees[i] {
                env.remove(dead);
            }
        }
        // A value by name: computed in this run, else one of the program's weights (which a
        // program may return as it is).
        let value = |name: &str| crate::value::lookup(&env, Some(&constants), name);
        let updates = self
            .mutations
            .iter()
            .map(|(new, buffer)| match value(new) {
                Some(Value::Tensor(t)) => Ok((buffer.clone(), Value::Tensor(t.clone()))),
                _ => Err(Error::Program(format!(
                    "the new value '{new}' of a buffer was never computed"
                ))),
            })
            .collect::<Result<Vec<_>>>()?;
        let tv = &g.tensor_values;
        let outputs = self
            .outputs
            .iter()
            .map(|o| match o {
                Argument::AsTensor(t) => {
                    let Some(Value::Tensor(v)) = value(&t.name) else {
                        return Err(Error::Program(format!(
                            "output '{}' was never computed",
                            t.name
                        )));
                    };
                    match tv.get(&t.name) {
                        Some(m) => dtype::to_declared(v, m.dtype)
                            .map_err(|e| Error::Program(format!("output '{}': {}", t.name, e.0))),
                        None => Ok(v.clone()),
                    }
                }
                other => number_output(other, &value).unwrap_or_else(|| {
                    Err(Error::Program(format!(
                        "non-tensor output ({}) is not supported",
                        other.kind_name()
                    )))
                }),
            })
            .collect();
        drop(constants);
        if !updates.is_empty() {
            let mut weights = self.weights.write().unwrap_or_else(|e| e.into_inner());
            // Runs still going keep the map they started with; this one's updates go into a
            // copy of it if so (the tensors shared, not copied).
            Arc::make_mut(&mut weights).extend(updates);
        }
        outputs
    }
}

/// A number a program returns (an int, float or bool, written in the program or computed
/// by it: a size a model reports), as the 0-d tensor `run` gives back for it (int64,
/// float64, bool); `None` for other non-tensor outputs.
fn number_output<'a>(
    arg: &Argument,
    value: &impl Fn(&str) -> Option<&'a Value>,
) -> Option<Result<Tensor>> {
    use crate::schema::{SymBoolArgument, SymFloatArgument, SymIntArgument};
    use crate::value::Scalar;
    let named = |n: &str| match value(n) {
        Some(Value::Int(v)) => Ok(Scalar::Int(*v)),
        Some(Value::Float(v)) => Ok(Scalar::Float(*v)),
        Some(Value::Bool(v)) => Ok(Scalar::Bool(*v)),
        _ => Err(Error::Program(format!(
            "output '{n}' was never computed as a number"
        ))),
    };
    let s = match arg {
        Argument::AsInt(v) | Argument::AsSymInt(SymIntArgument::AsInt(v)) => Ok(Scalar::Int(*v)),
        Argument::AsFloat(v) | Argument::AsSymFloat(SymFloatArgument::AsFloat(v)) => {
            Ok(Scalar::Float(v.get()))
        }
        Argument::AsBool(v) | Argument::AsSymBool(SymBoolArgument::AsBool(v)) => {
            Ok(Scalar::Bool(*v))
        }
        Argument::AsSymInt(SymIntArgument::AsName(n))
        | Argument::AsSymFloat(SymFloatArgument::AsName(n))
        | Argument::AsSymBool(SymBoolArgument::AsName(n)) => named(n),
        _ => return None,
    };
    Some(s.and_then(|s| {
        crate::ops::number_tensor(s)
            .map_err(|e| Error::Program(format!("a number output: {}", e.0)))
    }))
}

/// Whether a node's outputs `outs` have the sizes `expected` gives (by output position: a
/// tensor's, or each of a list's), as [`Program::specialised`] requires.
fn check_recorded_sizes(
    outs: &[Value],
    expected: &[(usize, Vec<Vec<usize>>)],
) -> std::result::Result<(), String> {
    for (at, want) in expected {
        let got: Vec<&[usize]> = match outs.get(*at) {
            Some(Value::Tensor(t)) => vec![t.dims()],
            Some(Value::Tensors(ts)) => ts.iter().map(|t| t.dims()).collect(),
            _ => continue,
        };
        if got.len() != want.len() || got.iter().zip(want).any(|(g, w)| g != w) {
            return Err(format!(
                "output {at} of shape {got:?} where the recorded run had {want:?}"
            ));
        }
    }
    Ok(())
}

/// The program of the archive at `path` and its weights, decoded for [`Program::build`]: the
/// weights its Linear layers read transposed (as [`crate::prepare::transposed_weights`]
/// finds them in the graph the build rewrites) are decoded straight into that layout, which
/// spares the build a second copy of them. The conv weights a batch norm folds into (as
/// [`crate::prepare::plan_bn_folds`] finds them in that graph, with the norms' values,
/// decoded first) are multiplied by the fold's scale as they are written, which spares the
/// build a pass over them. With `pack` (the build runs this crate's own kernels), the
/// parameters read only as the weight of products the packed kernel computes (Linears, and
/// `addmm` / `mm` / `matmul` of a weight stored `[in, out]`: [`crate::prepare::packable_weights`],
/// after the decomposed export's Linears are made Linears again) are decoded packed for the
/// microkernel ([`crate::ops::packed`]) instead of transposed, and so are the weights of
/// the convolutions on small planes that the build runs packed
/// ([`crate::prepare::small_conv_weights`]), each multiplied by its fold's scale as it is
/// packed. The third part of the result names both kinds.
fn read_for_build(
    path: &Path,
    pack: bool,
) -> Result<(ExportedProgram, FastMap<String, Tensor>, Decoded)> {
    let ckpt = crate::archive::open_pt2(path)?;
    // While the program is parsed and the graph planned, another thread of the pool maps a
    // small archive's pages into the process (`archive::populate`), which the decode would
    // otherwise fault in as it reads them.
    let threads = rayon::current_num_threads();
    let (decoded, ()) = rayon::join(
        || {
            let mut ep = crate::archive::program(path, &ckpt)?;
            plan_and_decode(&ckpt, &mut ep, pack).map(|(payloads, decoded)| (ep, payloads, decoded))
        },
        || {
            if threads > 1 {
                crate::archive::populate(&ckpt)
            }
        },
    );
    let (ep, payloads, decoded) = decoded?;
    // Closing the archive unmaps every page the decode mapped (all of a small archive's,
    // `archive::decode`): 8% of MobileNetV3-Large's load samples, on the thread that goes on
    // to build the program. Where the pool has a second thread, which sits idle during the
    // build, that thread closes it meanwhile (EfficientNet-B0's loads into reused memory at 2
    // threads 7.5% less; BENCHMARKS.md, issue 14). With one, the caller closes it, so that a
    // one-thread load keeps to one thread.
    if threads > 1 {
        rayon::spawn(move || drop(ckpt));
    }
    Ok((ep, payloads, decoded))
}

/// The plan of [`read_for_build`]: the graph rewritten as the build would before it reads
/// weights, the layout of each weight chosen (transposed, packed, scaled for a batch norm's
/// fold, decoded on its own), and the weights decoded so.
fn plan_and_decode(
    ckpt: &torchport::Checkpoint,
    ep: &mut ExportedProgram,
    pack: bool,
) -> Result<(FastMap<String, Tensor>, Decoded)> {
    // The graph's rewrites that need no weights, made here once for both the plan below and
    // the build (which skips them when handed a `Decoded`).
    let module = &mut ep.graph_module;
    crate::subgraphs::inline_wrappers(&mut module.graph)?;
    let final_names = crate::views::write_back_view_updates(&mut module.graph);
    if pack {
        // As the build would (it runs this crate's kernels).
        let weights: FastSet<&str> = module
            .signature
            .input_specs
            .iter()
            .filter_map(|s| Some(s.weight()?.0.name.as_str()))
            .collect();
        crate::prepare::linears_from_products(&mut module.graph, |n| weights.contains(n));
    }
    let g = &ep.graph_module.graph;
    let specs = &ep.graph_module.signature.input_specs;
    // The maps of names below, sized up front (grown one insert at a time, they hashed every
    // name again as they grew).
    fn sized<K, V>(n: usize) -> FastMap<K, V> {
        FastMap::with_capacity_and_hasher(n, Default::default())
    }
    let mut fqns: FastMap<&str, &str> = sized(specs.len());
    fqns.extend(
        specs
            .iter()
            .filter_map(|s| s.weight().map(|(arg, fqn)| (arg.name.as_str(), fqn))),
    );
    let wanted = crate::prepare::transposed_weights(g, |n| fqns.contains_key(n));
    // A weight bound to several placeholders is decoded transposed only if all of them
    // read it so (each would otherwise get a strided view where it expects a plain tensor).
    let mut votes: FastMap<&str, bool> = sized(specs.len());
    for (name, fqn) in &fqns {
        *votes.entry(fqn).or_insert(true) &= wanted.contains(name);
    }
    let transposed: FastSet<String> = votes
        .into_iter()
        .filter(|&(_, all)| all)
        .map(|(fqn, _)| fqn.to_string())
        .collect();
    // Packed: parameters (never updated by a run) read only as the weight of products the
    // packed kernel computes, in one layout under every name they are bound to.
    let mut products = crate::prepare::packable_weights(g, |n| fqns.contains_key(n));
    // The buffers a run updates (never computed from at load).
    let updated = updated_buffers(ep, &final_names);
    if pack {
        // The convolutions on small planes the build runs packed (`prepare::pack_small_convs`).
        let convs = crate::prepare::small_conv_weights(g);
        products.extend(convs.into_iter().map(|n| (n, Source::Rows)));
        // Not the weights that only nodes computed from weights alone read: the build
        // computes those nodes once (`prepare::fold_constants`), which it cannot do from a
        // packed weight (Swin V2's and timm's relative-position MLPs, run on every call).
        let folds =
            crate::prepare::folded_weights(g, |n| fqns.contains_key(n), |n| updated.contains(n));
        products.retain(|n, _| !folds.contains(n));
    }
    let mut votes: FastMap<&str, Option<Source>> = sized(specs.len());
    for spec in specs {
        if let Some((arg, fqn)) = spec.weight() {
            let parameter = matches!(spec, InputSpec::Parameter { .. });
            let source = products
                .get(arg.name.as_str())
                .filter(|_| pack && parameter);
            let vote = votes.entry(fqn).or_insert(source.copied());
            if *vote != source.copied() {
                *vote = None;
            }
        }
    }
    let packed: FastMap<String, Source> = votes
        .into_iter()
        .filter_map(|(fqn, source)| Some((fqn.to_string(), source?)))
        .collect();
    let transposed: FastSet<String> = transposed
        .into_iter()
        .filter(|fqn| !packed.contains_key(fqn))
        .collect();
    // The folds planned from the norms' values, decoded first; a weight read by its conv
    // alone, under one name, is multiplied as it is decoded (the build's fold would scale
    // it in place).
    let (readers, producer) = crate::prepare::readers_and_producers(g);
    let mut bound: FastMap<&str, usize> = sized(specs.len());
    for fqn in fqns.values() {
        *bound.entry(fqn).or_default() += 1;
    }
    let infos: FastMap<&str, &torchport::TensorInfo> = ckpt
        .tensors()
        .iter()
        .chain(ckpt.constants())
        .map(|t| (t.name.as_str(), t))
        .collect();
    // Every fold planned, for the build, where they are all the folds it could plan on this
    // graph: one per batch norm (a norm left unplanned here may still fold there, from
    // values the build reads that the load does not, such as float64 statistics).
    let norms = g
        .nodes
        .iter()
        .filter(|n| crate::prepare::is_batch_norm(n))
        .count();
    let mut bn_folds = None;
    let scales = |first: &FastMap<&str, &[f32]>| {
        let plans = crate::prepare::plan_bn_folds(
            g,
            (&readers, &producer),
            |n| {
                let t = infos.get(fqns.get(n)?)?;
                (t.dtype.name() == "float32").then(|| t.shape.clone())
            },
            |n, len| {
                let v = first.get(fqns.get(n)?)?;
                (v.len() == len).then(|| v.iter().map(|&x| f64::from(x)).collect())
            },
            |n| fqns.contains_key(n),
        );
        let scales = plans
            .iter()
            .filter(|p| readers.get(p.weight.as_str()) == Some(&1))
            .filter_map(|p| Some((*fqns.get(p.weight.as_str())?, &p.scale)))
            .filter(|(fqn, _)| bound.get(fqn) == Some(&1))
            .map(|(fqn, scale)| (fqn.to_string(), scale.clone()))
            .collect();
        bn_folds = (plans.len() == norms).then_some(plans);
        scales
    };
    // Weights the build replaces with their Winograd transform
    // (`prepare::transform_winograd_convs`): decoded on their own, not into the shared
    // buffer, so that the memory of each is given back when its transform replaces it.
    let mut separate: FastSet<String> = match pack {
        true => crate::prepare::winograd_conv_weights(g)
            .into_iter()
            .filter_map(|n| Some(fqns.get(n)?.to_string()))
            .collect(),
        false => FastSet::default(),
    };
    // And the weights only nodes the build computes from weights alone read
    // (`prepare::fold_constants`), under every name they are bound to.
    if pack {
        let keep =
            |n: &str| updated.contains(n) || fqns.get(n).is_some_and(|f| packed.contains_key(*f));
        let folded = crate::prepare::folded_weights(g, |n| fqns.contains_key(n), keep);
        let mut votes: FastMap<&str, bool> = FastMap::default();
        for (name, fqn) in &fqns {
            *votes.entry(fqn).or_insert(true) &= folded.contains(name);
        }
        separate.extend(votes.into_iter().filter(|v| v.1).map(|v| v.0.to_string()));
    }
    let (payloads, prescaled, packed) =
        crate::archive::decode(ckpt, &transposed, &packed, &separate, scales)?;
    let decoded = Decoded {
        prescaled,
        packed,
        final_names,
        bn_folds,
    };
    Ok((payloads, decoded))
}

/// What the load did to the weights it decoded for [`Program::build`] (by state_dict name).
#[derive(Clone)]
struct Decoded {
    /// Conv weights already scaled for their batch norm's fold.
    prescaled: FastSet<String>,
    /// Weights decoded packed ([`crate::ops::packed`]): the layout they were stored in and
    /// their `(n, k)` (output and input features) as the archive stores them.
    packed: FastMap<String, (Source, (usize, usize))>,
    /// The names holding the final values of values updated through views, from the
    /// rewrites already made to the graph ([`crate::views::write_back_view_updates`]).
    final_names: FastMap<String, String>,
    /// The batch norm folds [`crate::prepare::plan_bn_folds`] found on the graph as the load
    /// left it, with the archive's values, where they are every fold it could find there
    /// (one per norm); the build makes them without planning again, unless its own rewrites
    /// change the graph first. Planning again was a fifth of EfficientNet-B0's build
    /// (BENCHMARKS.md, issue 14).
    bn_folds: Option<Vec<crate::prepare::BnFold>>,
}

fn input_info(name: &str, meta: &TensorMeta) -> InputInfo {
    InputInfo {
        name: name.to_string(),
        dtype: meta.dtype,
        sizes: meta
            .sizes
            .iter()
            .map(|s| match s {
                crate::schema::SymInt::AsInt(v) => Some(*v),
                crate::schema::SymInt::AsExpr(_) => None,
            })
            .collect(),
    }
}

/// A buffer's update: (the value holding its new contents, the buffer's placeholder name).
type BufferUpdate = (String, String);

/// The graph outputs the program returns, and its buffer mutations.
fn user_outputs(ep: &ExportedProgram) -> Result<(Vec<Argument>, Vec<BufferUpdate>)> {
    let g = &ep.graph_module.graph;
    let specs = &ep.graph_module.signature.output_specs;
    if specs.len() != g.outputs.len() {
        return Err(Error::Program(format!(
            "the signature describes {} outputs but the graph has {}",
            specs.len(),
            g.outputs.len()
        )));
    }
    let mut out = Vec::new();
    let mut mutations = Vec::new();
    for (spec, arg) in specs.iter().zip(&g.outputs) {
        match spec {
            OutputSpec::UserOutput { .. } => out.push(arg.clone()),
            // A buffer's new value (a counter, a running average): it replaces the buffer
            // after the run, so that the next run reads it, as torch's module would.
            OutputSpec::BufferMutation { buffer_name, .. } => {
                let placeholder =
                    ep.graph_module
                        .signature
                        .input_specs
                        .iter()
                        .find_map(|i| match i {
                            InputSpec::Buffer {
                                arg,
                                buffer_name: b,
                                ..
                            } if b == buffer_name => Some(arg.name.clone()),
                            _ => None,
                        });
                let (Some(placeholder), Argument::AsTensor(value)) = (placeholder, arg) else {
                    return Err(Error::Program(format!(
                        "the program updates buffer '{buffer_name}', which it does not take"
                    )));
                };
                mutations.push((value.name.clone(), placeholder));
            }
            OutputSpec::UserInputMutation {
                user_input_name, ..
            } => {
                return Err(Error::Program(format!(
                    "the program updates its input '{user_input_name}' in place; programs \
                     that mutate their inputs are not supported (clone the input first)"
                )))
            }
            OutputSpec::Token { .. } => {
                return Err(Error::Program("effect tokens are not supported".into()))
            }
            _ => {
                return Err(Error::Program(
                    "training outputs (loss, gradients, parameter mutations) are not supported"
                        .into(),
                ))
            }
        }
    }
    Ok((out, mutations))
}

/// The values nodes of `g` update in place (in-place ops other than view ops, by their
/// `self`): one pass over the nodes, which every placeholder is then looked up in.
fn updated_in_place(g: &crate::schema::Graph) -> FastSet<&str> {
    g.nodes
        .iter()
        .filter(|n| {
            let key = op_key(&n.target);
            crate::ops::is_in_place(key) && !crate::views::is_view_op(key)
        })
        .filter_map(crate::views::self_name)
        .collect()
}

/// The placeholders of the buffers the program updates (by a declared mutation, in place, or
/// through a view: `final_names`, as [`crate::views::write_back_view_updates`] returned it)
/// and every other name whose reads that rewrite renamed: values that are not the same from
/// one run to the next.
fn updated_buffers(ep: &ExportedProgram, final_names: &FastMap<String, String>) -> FastSet<String> {
    let mut names: FastSet<String> = final_names.keys().cloned().collect();
    if let Ok((_, mutations)) = user_outputs(ep) {
        names.extend(mutations.into_iter().map(|(_, buffer)| buffer));
    }
    let updated = inplace_buffer_updates(ep, final_names);
    names.extend(updated.into_iter().map(|(_, buffer)| buffer));
    names
}

/// A plain export updates a user input with in-place ops on its placeholder (a decomposed
/// one declares it, see [`user_outputs`]): refused, as the caller's tensor is not changed.
fn refuse_input_updates(ep: &ExportedProgram, final_names: &FastMap<String, String>) -> Result<()> {
    let updated = updated_in_place(&ep.graph_module.graph);
    for spec in &ep.graph_module.signature.input_specs {
        let InputSpec::UserInput {
            arg: Argument::AsTensor(t),
        } = spec
        else {
            continue;
        };
        if updated.contains(t.name.as_str()) || final_names.contains_key(&t.name) {
            return Err(Error::Program(format!(
                "the program updates its input '{}' in place; programs that mutate their \
                 inputs are not supported (clone the input first)",
                t.name
            )));
        }
    }
    Ok(())
}

/// Buffers a plain (not decomposed) export updates in place — `self.count += 1` is an
/// `add_` on the buffer's placeholder, an update through a view is written back by
/// [`crate::views`] — as (the name holding the new value, the buffer's placeholder).
fn inplace_buffer_updates(
    ep: &ExportedProgram,
    final_names: &FastMap<String, String>,
) -> Vec<BufferUpdate> {
    let updated = updated_in_place(&ep.graph_module.graph);
    let mut updates = Vec::new();
    for spec in &ep.graph_module.signature.input_specs {
        let InputSpec::Buffer { arg, .. } = spec else {
            continue;
        };
        let name = &arg.name;
        if let Some(last) = final_names.get(name) {
            updates.push((last.clone(), name.clone()));
            continue;
        }
        if updated.contains(name.as_str()) {
            updates.push((name.clone(), name.clone()));
        }
    }
    updates
}

/// Check one user input against the program and convert it to the runtime representation.
fn check_input(i: usize, info: &InputInfo, t: &Tensor) -> Result<Tensor> {
    let err = |what: String| Error::Input { index: i, what };
    if t.rank() != info.sizes.len() {
        return Err(err(format!(
            "'{}' should have {} dims ({}), got shape {:?}",
            info.name,
            info.sizes.len(),
            fmt_sizes(&info.sizes),
            t.dims()
        )));
    }
    for (d, (&got, want)) in t.dims().iter().zip(&info.sizes).enumerate() {
        if let Some(w) = want {
            if got as i64 != *w {
                return Err(err(format!(
                    "'{}' should have shape {}, got {:?} (dim {d} differs)",
                    info.name,
                    fmt_sizes(&info.sizes),
                    t.dims()
                )));
            }
        }
    }
    let is_float = matches!(
        t.dtype(),
        DType::F16 | DType::BF16 | DType::F32 | DType::F64
    );
    let st = info.dtype;
    let ok = if dtype::is_float(st) {
        is_float
    } else if dtype::is_int(st) {
        !is_float
    } else if st == dtype::BOOL {
        t.dtype() == DType::U8
    } else {
        false
    };
    if !ok {
        return Err(err(format!(
            "'{}' should be {}, got a {:?} tensor",
            info.name,
            dtype::name(st),
            t.dtype()
        )));
    }
    dtype::cast(t, st).map_err(|e| err(e.0))
}

fn fmt_sizes(s: &[Option<i64>]) -> String {
    let parts: Vec<String> = s
        .iter()
        .map(|v| v.map_or("?".to_string(), |v| v.to_string()))
        .collect();
    format!("[{}]", parts.join(", "))
}

/// Bind a kernel's outputs to the node's output names; an in-place op (`relu_`) also rebinds
/// the tensor it mutated.
fn bind_outputs(
    node: &crate::schema::Node,
    outs: Vec<Value>,
    env: &mut Env,
    constants: &Env,
    in_place: bool,
) -> std::result::Result<(), String> {
    let mut outs = outs.into_iter();
    for arg in &node.outputs {
        let v = outs.next();
        match (arg, v) {
            (Argument::AsTensor(t), Some(Value::Tensor(x))) => {
                env.insert(t.name.clone(), Value::Tensor(x));
            }
            (Argument::AsTensors(ts), Some(Value::Tensors(xs))) => {
                if ts.len() != xs.len() {
                    return Err(format!(
                        "the op produced {} tensors, the graph names {}",
                        xs.len(),
                        ts.len()
                    ));
                }
                for (t, x) in ts.iter().zip(xs) {
                    env.insert(t.name.clone(), Value::Tensor(x));
                }
            }
            (Argument::AsSymInt(crate::schema::SymIntArgument::AsName(n)), Some(v))
            | (Argument::AsSymFloat(crate::schema::SymFloatArgument::AsName(n)), Some(v))
            | (Argument::AsSymBool(crate::schema::SymBoolArgument::AsName(n)), Some(v)) => {
                env.insert(n.clone(), v);
            }
            (Argument::AsNone(_), _) => {}
            (a, v) => {
                return Err(format!(
                    "the op's result ({}) does not match the graph's output ({})",
                    v.map_or("nothing", |v| match v {
                        Value::Tensor(_) => "a tensor",
                        Value::Tensors(_) => "a tensor list",
                        _ => "a scalar",
                    }),
                    a.kind_name()
                ))
            }
        }
    }
    // In-place ops (`add_`, `relu_`, `__iand__`) run as their functional form; the result
    // replaces the mutated input (a value of the run's or one of the program's `constants`),
    // which later nodes read by its old name. As in torch, the result keeps the input's
    // shape and dtype.
    if in_place {
        let op = op_key(&node.target);
        if let (Some(Argument::AsTensor(src)), Some(Argument::AsTensor(dst))) = (
            node.inputs
                .iter()
                .find(|a| a.name == "self" || a.name == "input")
                .map(|a| &a.arg),
            node.outputs.first(),
        ) {
            let old = crate::value::lookup(env, Some(constants), &src.name);
            let (Some(Value::Tensor(old)), Some(Value::Tensor(new))) = (old, env.get(&dst.name))
            else {
                return Ok(());
            };
            // In-place view ops (`unsqueeze_`, `t_`) change the shape; arithmetic never does.
            let reshapes = matches!(
                op.split('.').nth(1),
                Some("squeeze_" | "unsqueeze_" | "t_" | "transpose_" | "swapdims_" | "swapaxes_")
            );
            if !reshapes && old.dims() != new.dims() {
                return Err(format!(
                    "the in-place result has shape {:?} but '{}' has shape {:?}",
                    new.dims(),
                    src.name,
                    old.dims()
                ));
            }
            let new = if old.dtype() == new.dtype() {
                new.clone()
            } else if crate::ops::category(new.dtype()) > crate::ops::category(old.dtype()) {
                return Err(format!(
                    "the in-place result is {:?}, which cannot be stored in '{}' ({:?})",
                    new.dtype(),
                    src.name,
                    old.dtype()
                ));
            } else {
                new.to_dtype(old.dtype())
                    .map_err(|e| crate::error::candle_message(&e))?
            };
            env.insert(dst.name.clone(), Value::Tensor(new.clone()));
            env.insert(src.name.clone(), Value::Tensor(new));
        }
    }
    Ok(())
}

/// `as_strided` is computed on the contiguous layout of its input: refuse a program that
/// calls it on a tensor torch does not hold contiguously from offset 0 (by the graph's own
/// metadata), where the result would differ.
fn check_as_strided(g: &crate::schema::Graph) -> Result<()> {
    for node in &g.nodes {
        if op_key(&node.target) != "aten.as_strided.default" {
            continue;
        }
        let self_name = node
            .inputs
            .iter()
            .find(|a| a.name == "self")
            .and_then(|a| match &a.arg {
                Argument::AsTensor(t) => Some(t.name.as_str()),
                _ => None,
            });
        let contiguous = self_name
            .and_then(|n| g.tensor_values.get(n))
            .is_some_and(is_contiguous);
        if !contiguous {
            return Err(Error::Program(format!(
                "node '{}' (aten.as_strided.default) reads a tensor that is not contiguous; \
                 only as_strided on contiguous tensors is supported",
                node.name.as_deref().unwrap_or("?")
            )));
        }
    }
    Ok(())
}

/// Whether a tensor's metadata describes a row-major layout from offset 0 (strides of
/// size-1 dims do not matter).
fn is_contiguous(m: &TensorMeta) -> bool {
    use crate::schema::SymInt;
    let int = |s: &SymInt| match s {
        SymInt::AsInt(v) => Some(*v),
        SymInt::AsExpr(_) => None,
    };
    if int(&m.storage_offset) != Some(0) || m.sizes.len() != m.strides.len() {
        return false;
    }
    let mut expect: i64 = 1;
    for (i, (size, stride)) in m.sizes.iter().zip(&m.strides).enumerate().rev() {
        // A symbolic size is fine in the outermost dim (a dynamic batch): nothing outside it
        // depends on it, and its stride is the product of the (concrete) sizes inside.
        let size = match int(size) {
            Some(s) => s,
            None if i == 0 => 2,
            None => return false,
        };
        let Some(stride) = int(stride) else {
            return false;
        };
        if size != 1 && stride != expect {
            return false;
        }
        let Some(e) = expect.checked_mul(size) else {
            return false;
        };
        expect = e;
    }
    true
}

/// Names of the values each node uses, for `last_uses`: the tensors an argument reads
/// ([`crate::prepare::tensor_names`]) and the symbolic ints it names.
pub(crate) fn used_names<'a>(arg: &'a Argument, out: &mut Vec<&'a str>) {
    out.extend(crate::prepare::tensor_names(arg));
    match arg {
        Argument::AsSymInt(crate::schema::SymIntArgument::AsName(n)) => out.push(n),
        Argument::AsSymInts(v) => out.extend(v.iter().filter_map(|s| match s {
            crate::schema::SymIntArgument::AsName(n) => Some(n.as_str()),
            _ => None,
        })),
        _ => {}
    }
}

/// For each node, the values last read by it (never outputs of the program, never values read
/// by an in-place op, whose name lives on).
fn last_uses(ep: &ExportedProgram, outputs: &[Argument]) -> Vec<Vec<String>> {
    let g = &ep.graph_module.graph;
    let mut last: FastMap<&str, usize> =
        FastMap::with_capacity_and_hasher(g.tensor_values.len(), Default::default());
    let mut keep: Vec<&str> = Vec::new();
    for o in outputs {
        used_names(o, &mut keep);
    }
    let mut names = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        for a in &node.inputs {
            used_names(&a.arg, &mut names);
        }
        for n in names.drain(..) {
            last.insert(n, i);
        }
    }
    let mut frees = vec![Vec::new(); g.nodes.len()];
    for (name, i) in last {
        if !keep.contains(&name) {
            frees[i].push(name.to_string());
        }
    }
    frees
}

/// Run `f` on a thread of rayon's pool and wait for it: on the calling thread when that is
/// already one of the pool's, else on one of the global pool's.
///
/// Called from outside the pool, a kernel's parallel loops run on the pool's threads while
/// its serial parts (and every kernel without a parallel loop) run on the caller's: each
/// op's output is written on one core and read on another. With one rayon thread on a
/// 2-core machine that cost ResNet-18 batch 1 a quarter of its time (BENCHMARKS.md,
/// 2026-12-02).
///
/// While `f` runs, the pool's other threads wait for its next parallel loop by looking for
/// work ([`wait_for_work`]) instead of going to sleep between loops, and move off its CPU
/// when they find themselves on it (`threads::CpuWatch`; where the pool has no more threads
/// than the process has CPUs).
///
/// `TORCHPORT_WAIT_POLICY` ([`wait_policy`]) says how they wait: looking for work and
/// yielding their CPU between two looks (the default), spinning without yielding (`spin`),
/// or asleep (`passive`: as rayon's idle threads do, each loop waking them).
///
/// After the run, unless the policy is `passive`, the pool's threads keep looking for work a
/// while longer ([`linger`]), so that the next run finds them awake.
pub(crate) fn in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let policy = wait_policy();
    let r = in_pool_waiting(policy, f);
    if policy != WaitPolicy::Passive {
        linger(lingering(), policy == WaitPolicy::Active);
    }
    r
}

/// Runs [`in_pool`] has ended, so that the threads [`linger`] keeps after one stop when the
/// next one ends (which keeps them again).
static RUNS_ENDED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How long after a run the pool's threads keep looking for work ([`linger`]):
/// `TORCHPORT_LINGER_MS` milliseconds, else [`LINGER_MS`]. Read once.
fn lingering() -> std::time::Duration {
    static LINGER: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *LINGER.get_or_init(|| lingering_named(std::env::var("TORCHPORT_LINGER_MS").ok()))
}

/// The time a `TORCHPORT_LINGER_MS` value gives, in whole milliseconds (around blanks; `0`
/// turns lingering off), at most [`MAX_LINGER_MS`]; anything else (or nothing)
/// [`LINGER_MS`].
fn lingering_named(value: Option<String>) -> std::time::Duration {
    let ms = value.and_then(|v| v.trim().parse::<u64>().ok());
    std::time::Duration::from_millis(ms.map_or(LINGER_MS, |ms| ms.min(MAX_LINGER_MS)))
}

/// Whether a thread [`linger`] keeps after run `run` (the count of runs ended, with it)
/// should look for work again, `ended` runs having ended by now: no later run has ended, and
/// less than `time` has passed since `start`.
fn still_lingering(
    run: u64,
    ended: u64,
    start: std::time::Instant,
    time: std::time::Duration,
) -> bool {
    ended == run && start.elapsed() < time
}

/// How long the pool's threads keep looking for work after a run unless told otherwise, in
/// milliseconds: about as long as onnxruntime's threads spun after a run here (36–46 ms:
/// from waking to sleeping 41–51 ms, over runs of 4–5 ms).
const LINGER_MS: u64 = 50;

/// The longest lingering `TORCHPORT_LINGER_MS` may ask for, in milliseconds.
const MAX_LINGER_MS: u64 = 10_000;

/// Keeps each of the pool's threads (where it has more than one) looking for work, as
/// [`wait_for_work`] does, for up to `time` after a run or until the next run ends: the
/// next run's work (its loops, or the run itself) is then taken up by threads already
/// running, on their own CPUs, rather than by threads woken for it, which this machine's
/// kernel put on the CPU of the thread that woke them, busy running the program, while the
/// other CPU sat idle (`perf sched`; the idler the CPUs were, the more so). onnxruntime's
/// threads spin likewise after a run by default; without that (`allow_spinning` 0) its
/// MobileNetV3-Large at batch 1 on 2 threads took 8.4 ms a run 100 ms apart, against 4.1
/// with it. Here, runs 20 ms apart: 7.23 → 5.35 ms; 100 ms apart: 8.45 → 6.34; back to back
/// 5.64 → 5.09 (BENCHMARKS.md, issue 14). The cost: up to `time` of CPU time per thread
/// after each run, given up at each look to any other thread waiting for the CPU (with
/// `yields`, the default policy).
fn linger(time: std::time::Duration, yields: bool) {
    let threads = rayon::current_num_threads();
    if threads < 2 || time.is_zero() {
        return;
    }
    let run = RUNS_ENDED.fetch_add(1, Ordering::AcqRel) + 1;
    for _ in 0..threads {
        rayon::spawn(move || {
            let start = std::time::Instant::now();
            while still_lingering(run, RUNS_ENDED.load(Ordering::Acquire), start, time) {
                match rayon::yield_now() {
                    Some(rayon::Yield::Executed) => {}
                    _ if yields => std::thread::yield_now(),
                    _ => std::hint::spin_loop(),
                }
            }
        });
    }
}

/// How the pool's other threads wait for a run's next parallel loop ([`in_pool`]).
#[derive(Clone, Copy, Debug, PartialEq)]
enum WaitPolicy {
    /// Looking for work, and yielding their CPU between two looks ([`wait_for_work`]).
    Active,
    /// Looking for work without yielding: for a machine the process has to itself.
    Spin,
    /// Asleep, until a loop wakes them.
    Passive,
}

/// [`in_pool`], the pool's other threads waiting between loops as `policy` says.
fn in_pool_waiting<R: Send>(policy: WaitPolicy, f: impl FnOnce() -> R + Send) -> R {
    let done = AtomicBool::new(false);
    rayon::scope(|s| {
        let runner = rayon::current_thread_index();
        let done = &done;
        let threads = match policy {
            WaitPolicy::Passive => 1,
            _ => rayon::current_num_threads(),
        };
        let yields = policy == WaitPolicy::Active;
        // Only where each thread can have a CPU: with more threads than CPUs, moving off one
        // lands on another's.
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        let watch = (threads > 1 && threads <= crate::threads::allowed_cpus().len())
            .then(crate::threads::CpuWatch::of_this_thread);
        for _ in 1..threads {
            s.spawn(move |_| {
                wait_for_work(done, runner, yields, || {
                    #[cfg(all(target_os = "linux", target_env = "gnu"))]
                    if let Some(w) = watch {
                        w.step_aside();
                    }
                })
            });
        }
        let r = f();
        done.store(true, Ordering::Release);
        r
    })
}

/// Keeps a pool thread running the pool's pending work, and looking for more, until `done`
/// or until it has found none for [`WAIT_FOR_WORK`]: an idle rayon thread goes to sleep
/// within microseconds, and waking it for each of a program's parallel loops cost more than
/// the loop gained (layer norm over ViT-S's [8, 197, 384] activations: 0.15 ms at 2 threads
/// with the second thread awake, 0.37 ms when it had to be woken, 0.34 ms on one thread;
/// BENCHMARKS.md, issue 14). OpenMP runtimes, which torch uses, spin likewise between loops.
/// With `yields`, between two looks it yields its CPU (`sched_yield`): on a quiet machine
/// that returns at once, and on a busy one the other processes' threads run instead of its
/// spinning.
///
/// Every [`CHECK_CPU`] without work it calls `step_aside` (which moves it off the running
/// thread's CPU if it is on it).
///
/// It returns at once on the thread running the program (`runner`, which picks it up only
/// while waiting inside a loop of its own) and on a thread already inside one
/// (`WAITING`): there it would hold up the work it was called from. The time limit bounds
/// any other such case (a thread that took this up while inside a stolen piece of a loop).
fn wait_for_work(done: &AtomicBool, runner: Option<usize>, yields: bool, step_aside: impl Fn()) {
    thread_local! {
        static WAITING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if rayon::current_thread_index() == runner || WAITING.with(|w| w.replace(true)) {
        return;
    }
    let mut idle_since = std::time::Instant::now();
    let mut checked = idle_since;
    while !done.load(Ordering::Acquire) {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => idle_since = std::time::Instant::now(),
            _ if idle_since.elapsed() > WAIT_FOR_WORK => break,
            _ if checked.elapsed() > CHECK_CPU => {
                step_aside();
                checked = std::time::Instant::now();
            }
            // Between two looks, the CPU goes to any other thread ready to run on it. A
            // thread that only spun used up its share of a CPU that another process also
            // wanted; the scheduler then took the CPU from it while it held a piece of the
            // next loop, and the whole loop waited for that piece: with another process busy
            // on one of 2 CPUs, EfficientNet-B0 at batch 1 took 37-52 ms a run on 2 threads
            // (15 on 1); yielding, 14-15; on a quiet machine the same as spinning
            // (BENCHMARKS.md, issue 14).
            _ if yields => std::thread::yield_now(),
            _ => std::hint::spin_loop(),
        }
    }
    WAITING.with(|w| w.set(false));
}

/// How the pool's threads wait for a run's next parallel loop ([`in_pool`]), as
/// `TORCHPORT_WAIT_POLICY` says it (as OpenMP's `OMP_WAIT_POLICY` does for torch's threads).
/// Read once.
fn wait_policy() -> WaitPolicy {
    static POLICY: std::sync::OnceLock<WaitPolicy> = std::sync::OnceLock::new();
    *POLICY.get_or_init(|| wait_policy_named(std::env::var("TORCHPORT_WAIT_POLICY").ok()))
}

/// The policy a `TORCHPORT_WAIT_POLICY` value names, in any case and around blanks:
/// `passive`, `spin`, else (`active`, anything else, nothing) [`WaitPolicy::Active`].
fn wait_policy_named(value: Option<String>) -> WaitPolicy {
    match value
        .as_deref()
        .map(|v| v.trim().to_ascii_lowercase())
        .as_deref()
    {
        Some("passive") => WaitPolicy::Passive,
        Some("spin") => WaitPolicy::Spin,
        _ => WaitPolicy::Active,
    }
}

/// How often [`wait_for_work`] checks, while it finds no work, that it does not share the
/// running thread's CPU (`threads::CpuWatch`).
const CHECK_CPU: std::time::Duration = std::time::Duration::from_micros(200);

/// How long [`wait_for_work`] looks for work that does not come before it lets its thread
/// sleep.
const WAIT_FOR_WORK: std::time::Duration = std::time::Duration::from_millis(2);

#[cfg(test)]
mod tests {
    use super::*;

    /// A recorded program's check of its nodes' sizes: a tensor output's, each tensor of a
    /// list output's (a list of another length too), only at the positions recorded.
    #[test]
    fn recorded_sizes_are_checked_for_tensors_and_lists() {
        let t = |dims: &[usize]| {
            Tensor::zeros(dims, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap()
        };
        let outs = [
            Value::Tensor(t(&[2, 3])),
            Value::Tensors(vec![t(&[1]), t(&[4])]),
            Value::None,
        ];
        let ok = [(0, vec![vec![2, 3]]), (1, vec![vec![1], vec![4]])];
        assert_eq!(check_recorded_sizes(&outs, &ok), Ok(()));
        assert_eq!(
            check_recorded_sizes(&outs, &[(0, vec![vec![2, 3]])]),
            Ok(())
        );
        for bad in [
            vec![(0, vec![vec![3, 2]])],
            vec![(1, vec![vec![1], vec![3]])],
            vec![(1, vec![vec![1]])],
            vec![(1, vec![vec![1], vec![4], vec![0]])],
        ] {
            let e = check_recorded_sizes(&outs, &bad).unwrap_err();
            assert!(e.contains("where the recorded run had"), "{e}");
        }
    }

    /// The load multiplies each conv weight that a batch norm folds into by the norm's scale
    /// as it decodes it, and the build takes it as it is, folding as the load planned (no
    /// second plan): the folded weights and biases hold the same bits as those the build
    /// makes itself from plainly decoded weights (`Program::from_parts`), and the outputs
    /// agree (to rounding: the load's classifier reads its weight packed, `from_parts`'s
    /// through the gemm's own path, which for one row sums in another order). The weights of
    /// convolutions on small planes are packed in both: the load's as they are decoded and
    /// scaled, the build's after its fold. On timm's ResNet-18d and torchvision's
    /// MobileNetV3-Small as torch.export wrote them (`batch_norm` in one, the decomposed
    /// `_native_batch_norm_legit_no_training` in the other).
    #[test]
    fn conv_weights_scaled_as_decoded_are_those_the_build_folds() {
        let zoo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/zoo");
        for (name, model) in [
            ("timm_resnet18d.plain", "timm_resnet18d"),
            ("tv_mobilenet_v3_small.decomp", "tv_mobilenet_v3_small"),
        ] {
            let path = zoo.join(format!("{name}.pt2"));
            let (ep, _, decoded) = read_for_build(&path, true).unwrap();
            let norms = ep.graph_module.graph.nodes.iter();
            let norms = norms.filter(|n| crate::prepare::is_batch_norm(n)).count();
            // Every norm folds, so the build is handed the load's plans.
            let planned = decoded.bn_folds.map(|p| p.len());
            assert_eq!(planned, Some(norms), "{name}");
            let prescaled = decoded.prescaled;
            let loaded = Program::load(&path).unwrap();
            let (ep, payloads) = crate::archive::read(&path).unwrap();
            let built = Program::from_parts(ep, payloads).unwrap();
            let (lw, bw) = (
                loaded.weights.read().unwrap(),
                built.weights.read().unwrap(),
            );
            let folded: Vec<&String> = bw
                .keys()
                .filter(|k| k.ends_with("__folded_weight"))
                .collect();
            assert!(folded.len() >= 20, "{name}: {} folds", folded.len());
            assert_eq!(folded.len(), norms, "{name}");
            // Every folded conv's weight was scaled as it was decoded.
            assert_eq!(prescaled.len(), folded.len(), "{name}");
            let biases = bw.keys().filter(|k| k.ends_with("__folded_bias"));
            let folded: Vec<&String> = folded.into_iter().chain(biases).collect();
            assert_eq!(folded.len(), 2 * norms, "{name}");
            let bits = |v: &Value| -> Vec<u32> {
                let Value::Tensor(t) = v else {
                    panic!("{name}: a weight that is not a tensor")
                };
                let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
                v.iter().map(|x| x.to_bits()).collect()
            };
            for k in folded {
                assert_eq!(bits(&lw[k]), bits(&bw[k]), "{name}: {k}");
            }
            let x = crate::npy::read_npy(&zoo.join(format!("{model}.input_0.npy"))).unwrap();
            let x = [x];
            let (a, b) = (loaded.run(&x).unwrap(), built.run(&x).unwrap());
            let (a, b) = (
                a[0].flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                b[0].flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            );
            let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = a
                .iter()
                .zip(&b)
                .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(worst <= 1e-5 * scale, "{name}: outputs differ by {worst}");
        }
    }

    /// A packed weight whose shape in the archive is not the one the graph reads (here:
    /// GPT-2's `Conv1D` weight, `[in, out]`, recorded as stored `[out, in]`) is an error
    /// naming it, not panels of the wrong orientation, though their lengths agree.
    #[test]
    fn a_packed_weight_stored_in_another_shape_is_refused() {
        if crate::ops::packed::Packing::detect().is_none() {
            return;
        }
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/zoo/hf_gpt2.plain.pt2");
        let (ep, payloads, mut decoded) = read_for_build(&path, true).unwrap();
        let name = "h.0.attn.c_attn.weight";
        let (source, (n, k)) = decoded.packed[name];
        assert_eq!((source, n, k), (Source::Columns, 96, 32));
        let build = |ep, payloads, decoded: &Decoded| {
            Program::build(
                ep,
                payloads,
                &Registry::with_all_ops(),
                true,
                Some(decoded.clone()),
            )
        };
        assert!(build(ep.clone(), payloads.clone(), &decoded).is_ok());
        decoded
            .packed
            .insert(name.to_string(), (Source::Columns, (k, n)));
        let err = build(ep, payloads, &decoded).err().unwrap().to_string();
        assert!(err.contains(name) && err.contains("[32, 96]"), "{err}");
    }

    /// `TORCHPORT_LINGER_MS`: whole milliseconds around blanks, `0` for none, at most
    /// [`MAX_LINGER_MS`]; anything else the default. A lingering thread stops once another
    /// run has ended or its time is up. Runs taken up while the pool's threads linger after
    /// earlier ones (back to back, after pauses shorter and longer than the lingering, from
    /// two threads at once) give the bits of a run on one thread.
    #[test]
    fn lingering_is_named_bounded_and_runs_meanwhile_compute_the_same() {
        use std::time::{Duration, Instant};
        for (value, ms) in [
            (None, LINGER_MS),
            (Some("0"), 0),
            (Some(" 20\n"), 20),
            (Some("-5"), LINGER_MS),
            (Some("fast"), LINGER_MS),
            (Some("99999999"), MAX_LINGER_MS),
        ] {
            let want = Duration::from_millis(ms);
            assert_eq!(lingering_named(value.map(String::from)), want, "{value:?}");
        }
        let long = Duration::from_secs(3600);
        assert!(still_lingering(7, 7, Instant::now(), long));
        let old = Instant::now() - Duration::from_millis(30);
        assert!(!still_lingering(7, 7, old, Duration::from_millis(20)));
        assert!(!still_lingering(7, 8, Instant::now(), long));

        let zoo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/zoo");
        let p = Program::load(zoo.join("timm_resnet18d.plain.pt2")).unwrap();
        let x = crate::npy::read_npy(&zoo.join("timm_resnet18d.input_0.npy")).unwrap();
        let bits = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let pool = |n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .unwrap()
        };
        let want = bits(&pool(1).install(|| p.run(std::slice::from_ref(&x))).unwrap()[0]);
        let two = pool(2);
        let run = || bits(&two.install(|| p.run(std::slice::from_ref(&x))).unwrap()[0]);
        for pause in [0, 0, 5, 0, 80] {
            assert_eq!(run(), want, "after a pause of {pause} ms");
            std::thread::sleep(Duration::from_millis(pause));
        }
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..3 {
                        assert_eq!(run(), want, "two threads at once");
                    }
                });
            }
        });
    }

    /// `TORCHPORT_WAIT_POLICY`: `passive` and `spin` in any case (and around blanks) name
    /// their policies; nothing, `active` or anything else is the default, looking for work
    /// and yielding. A run gives the same bits with each (timm's ResNet-18d on a pool of 4
    /// threads, where 3 of them wait one way or another).
    #[test]
    fn wait_policies_name_their_waiting_and_compute_the_same() {
        use WaitPolicy::*;
        for (value, policy) in [
            (None, Active),
            (Some("active"), Active),
            (Some("yield"), Active),
            (Some("passive"), Passive),
            (Some(" PASSIVE\n"), Passive),
            (Some("spin"), Spin),
            (Some("Spin "), Spin),
        ] {
            assert_eq!(
                wait_policy_named(value.map(String::from)),
                policy,
                "{value:?}"
            );
        }
        let zoo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/zoo");
        let p = Program::load(zoo.join("timm_resnet18d.plain.pt2")).unwrap();
        let x = crate::npy::read_npy(&zoo.join("timm_resnet18d.input_0.npy")).unwrap();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap();
        let run = |policy: WaitPolicy| {
            let out = pool.install(|| {
                in_pool_waiting(policy, || p.run_inner(std::slice::from_ref(&x), None))
            });
            out.unwrap()[0]
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        };
        let active = run(Active);
        assert_eq!(active, run(Spin));
        assert_eq!(active, run(Passive));
    }

    /// timm's ResNet-18d (the zoo fixture, exported plain) and its weights, decoded plainly,
    /// by graph input name.
    fn resnet18d_weights() -> (ExportedProgram, HashMap<String, Tensor>) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/zoo/timm_resnet18d.plain.pt2");
        let (ep, payloads) = crate::archive::read(&path).unwrap();
        let weights = ep
            .graph_module
            .signature
            .input_specs
            .iter()
            .filter_map(|s| s.weight())
            .map(|(arg, fqn)| (arg.name.clone(), payloads[fqn].clone()))
            .collect();
        (ep, weights)
    }

    /// A weight the load decoded packed but did not scale (bound to two names) keeps its
    /// batch norm as a node: a fold would scale its panels as if they were rows.
    #[test]
    fn a_packed_weight_not_scaled_keeps_its_norm() {
        let (ep, weights) = resnet18d_weights();
        let fold = |packed_dims: &FastMap<candle_core::TensorId, Vec<usize>>| {
            let (mut g, mut w) = (ep.graph_module.graph.clone(), weights.clone());
            let none = FastSet::default();
            let n = crate::prepare::fold_batch_norms_with(
                &mut g,
                &mut w,
                false,
                &none,
                packed_dims,
                None,
            );
            (n.unwrap(), w)
        };
        let (all, folded) = fold(&FastMap::default());
        // A conv weight that folds (the fold drops its unscaled copy).
        let conv = weights
            .keys()
            .find(|n| weights[*n].rank() == 4 && !folded.contains_key(*n))
            .unwrap()
            .clone();
        let dims = weights[&conv].dims().to_vec();
        let (some, kept) = fold(&[(weights[&conv].id(), dims)].into_iter().collect());
        assert_eq!(some + 1, all, "{conv}");
        let bits = |t: &Tensor| -> Vec<u32> {
            let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
            v.iter().map(|x| x.to_bits()).collect()
        };
        assert_eq!(
            bits(&kept[&conv]),
            bits(&weights[&conv]),
            "{conv} was changed"
        );
    }

    /// A weight the load scaled for a fold the build does not make is an error, not a
    /// silently scaled weight.
    #[test]
    fn a_weight_scaled_for_no_fold_is_refused() {
        let (mut ep, mut weights) = resnet18d_weights();
        let g = &mut ep.graph_module.graph;
        let fc = "p_fc_weight".to_string();
        assert!(weights.contains_key(&fc));
        let err = crate::prepare::fold_batch_norms_with(
            g,
            &mut weights,
            true,
            &[fc].into_iter().collect(),
            &FastMap::default(),
            None,
        )
        .unwrap_err();
        assert!(err.contains("p_fc_weight"), "{err}");
    }
}
