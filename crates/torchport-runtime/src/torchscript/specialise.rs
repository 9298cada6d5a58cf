//! TorchScript runs recorded as `.pt2` graphs specialised to their inputs' sizes, so that a
//! TorchScript archive gets the load-time rewrites and the run loop of a `.pt2` program
//! (batch norms folded into convolutions, activations and residual adds fused, Winograd and
//! packed convolution weights, buffers freed at their last use) instead of the evaluator's
//! operator-by-operator calls.
//!
//! While the evaluator runs, every kernel call it makes is recorded as a graph node
//! ([`call`], from `aten.rs`): its tensors named by where they came from (a user input, one
//! of the archive's tensors, an earlier call's output, or a tensor the evaluator made from
//! numbers: [`constant`]), its other arguments as the call gave them. The graph is the
//! run's computation for inputs of these sizes and dtypes, whatever their values, if nothing
//! the run decided depended on the values of the inputs:
//! - reading a value of a tensor computed from the inputs (`int(t)`, `bool(t)`, an `if` on
//!   a tensor, `t.item()`: [`read`]) or a kernel returning a number ends the recording, and
//!   so does a tensor the evaluator made out of recorded ones by itself (it would be a
//!   constant of the graph);
//! - the sizes the run saw are the only other thing its numbers can come from (`x.size(0)`),
//!   so the program checks, as it runs, that every node's outputs have the sizes recorded
//!   ([`crate::Program`]'s specialised mode): a kernel whose output's sizes depend on its
//!   input's values (`nonzero`, a boolean mask's `index`) can then only be caught out, not
//!   computed wrong, and the caller interprets that run instead.
//!
//! The recorder lives in a thread local of the evaluator's thread; kernels do not call back.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

use candle_core::{Tensor, TensorId};

use crate::fast::{HashMap as FastMap, HashSet as FastSet};
use crate::schema::{
    Argument, Device, ExportedProgram, Graph, GraphModule, GraphSignature, InputSpec,
    NamedArgument, Node, OptionalTensorArgument, OutputSpec, SchemaVersion, SymInt, TensorArgument,
    TensorMeta,
};
use crate::value::{Env, Value};

/// A recorded run: the graph and its weights by name, for [`crate::Program::from_parts`].
pub struct Recording {
    /// The graph, its weights first, then the user inputs, in order.
    pub program: ExportedProgram,
    /// The archive's tensors and the constants the graph reads, by their spec names.
    pub weights: HashMap<String, Tensor>,
}

/// What the recorder knows of a tensor it has seen.
#[derive(Clone)]
struct Known {
    /// Its name in the graph.
    name: String,
    /// Whether its values depend on the inputs' values.
    live: bool,
}

/// The most kernel calls a recording holds; a run that makes more is interpreted (a loop in
/// scripted code could otherwise make the recording as large as the run is long).
const MAX_NODES: usize = 1 << 17;

struct Recorder {
    /// At most this many nodes ([`MAX_NODES`]).
    max_nodes: usize,
    /// The archive's tensors, by tensor, with their names in the archive.
    archive: FastMap<TensorId, String>,
    known: FastMap<TensorId, Known>,
    /// Tensors the evaluator made from numbers (which depend on nothing recorded).
    constants: FastSet<TensorId>,
    nodes: Vec<Node>,
    tensor_values: BTreeMap<String, TensorMeta>,
    /// Graph inputs: the weights and constants (in the order first read), then the user's.
    weight_specs: Vec<InputSpec>,
    user_specs: Vec<InputSpec>,
    weights: HashMap<String, Tensor>,
    /// Why the run cannot be a graph, once known.
    failed: Option<String>,
}

thread_local! {
    static RECORDER: RefCell<Option<Recorder>> = const { RefCell::new(None) };
}

/// Apply `f` to this thread's recorder, if a run is being recorded and has not failed.
fn with(f: impl FnOnce(&mut Recorder) -> Result<(), String>) {
    RECORDER.with(|r| {
        if let Some(rec) = r.borrow_mut().as_mut() {
            if rec.failed.is_none() {
                if let Err(e) = f(rec) {
                    rec.failed = Some(e);
                    // Nothing recorded is needed any more.
                    rec.nodes = Vec::new();
                    rec.tensor_values = BTreeMap::new();
                    rec.weights = HashMap::new();
                }
            }
        }
    });
}

/// A kernel call of the evaluator: the registry's `target`, its named `inputs` (tensors as
/// names in `env`) and what it returned.
pub(crate) fn call(target: &str, inputs: &[NamedArgument], env: &Env, outs: &[Value]) {
    with(|r| r.call(target, inputs, env, outs));
}

/// A tensor the evaluator made from numbers (`ops.prim.NumToTensor(n)`, `torch.tensor([..])`):
/// a constant of the graph.
pub(crate) fn constant(t: &Tensor) {
    with(|r| {
        r.constants.insert(t.id());
        Ok(())
    });
}

/// `alias`, a tensor of the same values and memory as `t` under another identity (a cut of
/// all of `t`, [`super::view_writes::distinct`]): the recording knows it as it knows `t`.
pub(crate) fn alias(t: &Tensor, alias: &Tensor) {
    with(|r| {
        if let Some(k) = r.known.get(&t.id()).cloned() {
            r.known.insert(alias.id(), k);
        } else if let Some(stored) = r.archive.get(&t.id()).cloned() {
            r.archive.insert(alias.id(), stored);
        } else if r.constants.contains(&t.id()) {
            r.constants.insert(alias.id());
        }
        Ok(())
    });
}

/// The evaluator reads a value of `t` (as a Python number, or a condition).
pub(crate) fn read(t: &Tensor) {
    with(|r| match r.known.get(&t.id()) {
        Some(k) if k.live => Err(format!(
            "the code reads a value of a tensor computed from the inputs ({}), so what it \
             does depends on the inputs' values",
            k.name
        )),
        Some(_) => Ok(()),
        None if r.archive.contains_key(&t.id()) || r.constants.contains(&t.id()) => Ok(()),
        None => Err("the code reads a value of a tensor the evaluator made itself".into()),
    });
}

/// The recorder of the evaluator's run on this thread, for as long as the run lasts: a
/// recording ([`Guard::start`], until [`Guard::finish`] or, on an error, until dropped) or
/// none ([`Guard::idle`]). Whatever the thread's slot held before is put back when the guard
/// goes: the evaluator runs on a pool's thread, and a pool thread waiting for a kernel's
/// parallel loop takes other work meanwhile, another program's whole run included, which then
/// runs to its end on top of this one. Without the slot saved and restored, that run recorded
/// its calls into this run's recording (or this one's into nothing), and its end took this
/// run's recorder away.
pub(crate) struct Guard {
    /// The slot's content before this run.
    prev: Option<Recorder>,
}

impl Guard {
    /// Start recording on this thread; `archive`: the archive's tensors by tensor, with their
    /// names; `inputs`: the run's user inputs, in order.
    pub(crate) fn start(archive: FastMap<TensorId, String>, inputs: &[Tensor]) -> Guard {
        let mut r = Recorder {
            max_nodes: MAX_NODES,
            archive,
            known: FastMap::default(),
            constants: FastSet::default(),
            nodes: Vec::new(),
            tensor_values: BTreeMap::new(),
            weight_specs: Vec::new(),
            user_specs: Vec::new(),
            weights: HashMap::new(),
            failed: None,
        };
        for (i, t) in inputs.iter().enumerate() {
            let name = format!("input_{i}");
            r.meta(&name, t);
            r.user_specs.push(InputSpec::UserInput {
                arg: Argument::AsTensor(TensorArgument { name: name.clone() }),
            });
            r.known.insert(t.id(), Known { name, live: true });
        }
        Guard {
            prev: RECORDER.with(|c| c.replace(Some(r))),
        }
    }

    /// A run on this thread that records nothing (and into no other run's recording).
    pub(crate) fn idle() -> Guard {
        Guard {
            prev: RECORDER.with(|c| c.replace(None)),
        }
    }

    /// The recorded graph of a run that returned `outputs`, or why there is none.
    pub(crate) fn finish(self, outputs: &[Tensor]) -> Result<Recording, String> {
        let r = RECORDER
            .with(|c| c.borrow_mut().take())
            .ok_or("no run was recorded")?;
        r.finish(outputs)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let prev = self.prev.take();
        RECORDER.with(|c| *c.borrow_mut() = prev);
    }
}

impl Recorder {
    fn call(
        &mut self,
        target: &str,
        inputs: &[NamedArgument],
        env: &Env,
        outs: &[Value],
    ) -> Result<(), String> {
        if self.nodes.len() >= self.max_nodes {
            return Err(format!(
                "the run makes more than {} kernel calls",
                self.max_nodes
            ));
        }
        let mut live = false;
        let mut args = Vec::with_capacity(inputs.len());
        for a in inputs {
            let mut name = |t: &TensorArgument| self.tensor(env, &t.name, &mut live);
            let arg = match &a.arg {
                Argument::AsTensor(t) => Argument::AsTensor(name(t)?),
                Argument::AsTensors(ts) => {
                    Argument::AsTensors(ts.iter().map(name).collect::<Result<_, _>>()?)
                }
                Argument::AsOptionalTensors(ts) => Argument::AsOptionalTensors(
                    ts.iter()
                        .map(|t| match t {
                            OptionalTensorArgument::AsTensor(t) => {
                                Ok(OptionalTensorArgument::AsTensor(name(t)?))
                            }
                            none => Ok(none.clone()),
                        })
                        .collect::<Result<_, String>>()?,
                ),
                other => other.clone(),
            };
            args.push(NamedArgument {
                name: a.name.clone(),
                arg,
                kind: None,
            });
        }
        let key = functional(target, env, inputs)?;
        let mut outputs = Vec::with_capacity(outs.len());
        for v in outs {
            outputs.push(match v {
                Value::Tensor(t) => Argument::AsTensor(self.define(t, live)),
                Value::Tensors(ts) => {
                    Argument::AsTensors(ts.iter().map(|t| self.define(t, live)).collect())
                }
                Value::None => Argument::AsNone(serde_json::Value::Null),
                _ => return Err(format!("{target} returns a number, not a tensor")),
            });
        }
        let target = if key.starts_with("aten.") {
            format!("torch.ops.{key}")
        } else {
            key
        };
        self.nodes.push(Node {
            target,
            inputs: args,
            outputs,
            name: Some(format!("node_{}", self.nodes.len())),
        });
        Ok(())
    }

    /// The graph name of the tensor `env` holds as `name`, made a graph input where it is one
    /// of the archive's tensors or a constant seen for the first time; `live` set where its
    /// values depend on the inputs'.
    fn tensor(&mut self, env: &Env, name: &str, live: &mut bool) -> Result<TensorArgument, String> {
        let Some(Value::Tensor(t)) = env.get(name) else {
            return Err(format!("a kernel argument ({name}) is not a tensor"));
        };
        if let Some(k) = self.known.get(&t.id()) {
            *live |= k.live;
            return Ok(TensorArgument {
                name: k.name.clone(),
            });
        }
        let n = self.weight_specs.len();
        let name = format!("weight_{n}");
        let arg = TensorArgument { name: name.clone() };
        let (stored, spec) = if let Some(stored) = self.archive.get(&t.id()) {
            let spec = InputSpec::Parameter {
                arg: arg.clone(),
                parameter_name: stored.clone(),
            };
            (stored.clone(), spec)
        } else if self.constants.contains(&t.id()) {
            let stored = format!("constant_{n}");
            let spec = InputSpec::TensorConstant {
                arg: arg.clone(),
                tensor_constant_name: stored.clone(),
            };
            (stored, spec)
        } else {
            return Err("a kernel reads a tensor the evaluator made itself".into());
        };
        self.weights.insert(stored, t.clone());
        self.weight_specs.push(spec);
        self.meta(&name, t);
        self.known.insert(t.id(), Known { name, live: false });
        Ok(arg)
    }

    /// Name `t`, a kernel's output, in the graph.
    fn define(&mut self, t: &Tensor, live: bool) -> TensorArgument {
        let name = format!("value_{}", self.tensor_values.len());
        self.meta(&name, t);
        self.known.insert(
            t.id(),
            Known {
                name: name.clone(),
                live,
            },
        );
        TensorArgument { name }
    }

    fn meta(&mut self, name: &str, t: &Tensor) {
        let ints = |v: &[usize]| v.iter().map(|&d| SymInt::AsInt(d as i64)).collect();
        self.tensor_values.insert(
            name.to_string(),
            TensorMeta {
                dtype: crate::dtype::of_runtime(t.dtype()),
                sizes: ints(t.dims()),
                requires_grad: false,
                device: Device {
                    kind: "cpu".into(),
                    index: None,
                },
                // Kernels read every tensor in its elements' order, whatever its layout in
                // memory here; the evaluator has already made `as_strided`'s input the
                // memory torch would read (`layouts.rs`).
                strides: ints(&torchport::contiguous_strides(t.dims())),
                storage_offset: SymInt::AsInt(0),
                layout: 7,
            },
        );
    }

    fn finish(self, outputs: &[Tensor]) -> Result<Recording, String> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        let mut graph_outputs = Vec::with_capacity(outputs.len());
        for t in outputs {
            match self.known.get(&t.id()) {
                Some(k) if k.name.starts_with("value_") => {
                    graph_outputs.push(Argument::AsTensor(TensorArgument {
                        name: k.name.clone(),
                    }))
                }
                _ => {
                    return Err("the run returns a tensor no kernel computed (an input, a \
                                weight or a number)"
                        .into())
                }
            }
        }
        let specs: Vec<InputSpec> = self
            .weight_specs
            .into_iter()
            .chain(self.user_specs)
            .collect();
        // Each spec's graph input (every weight spec is a parameter or a constant).
        let inputs = specs
            .iter()
            .filter_map(|s| match s {
                InputSpec::UserInput { arg } => Some(arg.clone()),
                s => Some(Argument::AsTensor(s.weight()?.0.clone())),
            })
            .collect();
        let output_specs = graph_outputs
            .iter()
            .map(|arg| OutputSpec::UserOutput { arg: arg.clone() })
            .collect();
        let program = ExportedProgram {
            graph_module: GraphModule {
                graph: Graph {
                    inputs,
                    outputs: graph_outputs,
                    nodes: self.nodes,
                    tensor_values: self.tensor_values,
                    sym_int_values: BTreeMap::new(),
                    sym_bool_values: BTreeMap::new(),
                    is_single_tensor_return: false,
                },
                signature: GraphSignature {
                    input_specs: specs,
                    output_specs,
                },
            },
            opset_version: BTreeMap::new(),
            schema_version: SchemaVersion { major: 8, minor: 0 },
            torch_version: None,
            range_constraints: BTreeMap::new(),
        };
        Ok(Recording {
            program,
            weights: self.weights,
        })
    }
}

/// The registry key a recorded call runs as: an in-place op (`relu_`, `add_`) as its
/// functional form, which is how the evaluator treats it (the result is bound to the
/// mutated name; nothing else sees the change), where that form computes the same: every
/// tensor argument of `self`'s dtype, and no float argument to an integer `self` (else the
/// functional form would promote). `inputs`: the call's arguments (tensors by name in
/// `env`).
fn functional(target: &str, env: &Env, inputs: &[NamedArgument]) -> Result<String, String> {
    if !crate::ops::is_in_place(target) {
        return Ok(target.to_string());
    }
    let name = crate::ops::functional_name(target)
        .filter(|f| crate::ops::Registry::all_ops().get(f).is_some())
        .ok_or_else(|| format!("{target} updates a tensor in place"))?;
    let tensor = |n: &str| match env.get(n) {
        Some(Value::Tensor(t)) => Some(t.dtype()),
        _ => None,
    };
    let mut dtypes = inputs
        .iter()
        .flat_map(|a| crate::prepare::tensor_names(&a.arg))
        .map(tensor);
    let own = inputs
        .iter()
        .find(|a| a.name == "self")
        .and_then(|a| match &a.arg {
            Argument::AsTensor(t) => tensor(&t.name),
            _ => None,
        });
    let float = |d: candle_core::DType| crate::ops::category(d) == 2;
    let same = own.is_some_and(|own| {
        dtypes.all(|d| d == Some(own))
            && (float(own) || !inputs.iter().any(|a| matches!(a.arg, Argument::AsFloat(_))))
    });
    if same {
        Ok(name)
    } else {
        Err(format!(
            "{target} updates a tensor in place with values of another type"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    /// `aten.relu.default` of `x` (named `%0`), returning `out`, as the evaluator's call of
    /// it reports to the recorder.
    fn relu_call(x: &Tensor, out: &Tensor) {
        let mut env = Env::default();
        env.insert("%0".into(), Value::Tensor(x.clone()));
        let inputs = [NamedArgument {
            name: "self".into(),
            arg: Argument::AsTensor(TensorArgument { name: "%0".into() }),
            kind: None,
        }];
        call(
            "aten.relu.default",
            &inputs,
            &env,
            &[Value::Tensor(out.clone())],
        );
    }

    /// A run of more kernel calls than a recording holds is not recorded, and what was
    /// recorded is dropped at once.
    #[test]
    fn a_recording_holds_at_most_its_nodes() {
        let x = Tensor::zeros(4, DType::F32, &Device::Cpu).unwrap();
        let guard = Guard::start(FastMap::default(), std::slice::from_ref(&x));
        RECORDER.with(|r| r.borrow_mut().as_mut().unwrap().max_nodes = 2);
        let mut last = x.clone();
        for _ in 0..3 {
            last = last.relu().unwrap();
            relu_call(&x, &last);
        }
        RECORDER.with(|r| assert!(r.borrow().as_ref().unwrap().nodes.is_empty()));
        let e = guard.finish(&[last]).err().expect("not recorded");
        assert!(e.contains("more than 2 kernel calls"), "{e}");
    }

    /// A run that starts on a thread where another run is recording (a pool thread that took
    /// it up while that run waited for a parallel loop) records into its own recorder, or
    /// none, and leaves the other run's recording as it was.
    #[test]
    fn a_run_nested_on_the_thread_leaves_the_outer_recording_alone() {
        let x = Tensor::zeros(4, DType::F32, &Device::Cpu).unwrap();
        let outer = Guard::start(FastMap::default(), std::slice::from_ref(&x));
        let recorded = || RECORDER.with(|r| r.borrow().as_ref().map(|r| r.nodes.len()));
        let y = x.relu().unwrap();
        relu_call(&x, &y);
        assert_eq!(recorded(), Some(1));
        {
            // A run that does not record: its calls and reads go nowhere.
            let _idle = Guard::idle();
            let z = Tensor::ones(2, DType::F32, &Device::Cpu).unwrap();
            relu_call(&x, &z);
            read(&z);
            assert_eq!(recorded(), None);
            // A recording run inside it, to its end.
            let inner = Guard::start(FastMap::default(), std::slice::from_ref(&z));
            assert_eq!(recorded(), Some(0));
            // (It returns its input: a recording with nothing to run, refused; either way,
            // its end restores the slot as the idle run had it.)
            let _ = inner.finish(&[z]);
            assert_eq!(recorded(), None);
        }
        // The outer run's recording, as it was: one node, not failed.
        assert_eq!(recorded(), Some(1));
        let r = outer.finish(&[y]).expect("the outer run is recorded");
        assert_eq!(r.program.graph_module.graph.nodes.len(), 1);
        assert_eq!(recorded(), None);
    }

    /// In-place ops are recorded as their functional forms only where those compute the same
    /// dtype: every tensor argument of `self`'s dtype, no float argument to an integer `self`.
    #[test]
    fn in_place_ops_recorded_functionally_only_where_the_dtype_holds() {
        let t = |d: DType| Value::Tensor(Tensor::zeros(3, d, &Device::Cpu).unwrap());
        let mut env = Env::default();
        env.insert("f".into(), t(DType::F32));
        env.insert("i".into(), t(DType::I64));
        let arg = |name: &str, arg: Argument| NamedArgument {
            name: name.to_string().into(),
            arg,
            kind: None,
        };
        let tensor = |n: &str| Argument::AsTensor(TensorArgument { name: n.into() });
        let float = Argument::AsFloat(crate::schema::JsonFloat::Num(0.5));
        let key = |target: &str, args: &[NamedArgument]| functional(target, &env, args);
        assert_eq!(
            key("aten.relu_.default", &[arg("self", tensor("f"))]),
            Ok("aten.relu.default".to_string())
        );
        assert_eq!(
            key("aten.relu.default", &[arg("self", tensor("i"))]),
            Ok("aten.relu.default".to_string())
        );
        let add = [arg("self", tensor("f")), arg("other", tensor("f"))];
        assert_eq!(key("aten.add_.Tensor", &add), Ok("aten.add.Tensor".into()));
        let add = [arg("self", tensor("f")), arg("other", float.clone())];
        assert_eq!(key("aten.add_.Scalar", &add), Ok("aten.add.Scalar".into()));
        let add = [arg("self", tensor("i")), arg("other", Argument::AsInt(2))];
        assert_eq!(key("aten.add_.Scalar", &add), Ok("aten.add.Scalar".into()));
        for (target, other) in [
            ("aten.add_.Tensor", tensor("f")),
            ("aten.add_.Scalar", float.clone()),
        ] {
            let add = [arg("self", tensor("i")), arg("other", other)];
            let e = key(target, &add).unwrap_err();
            assert!(e.contains("values of another type"), "{e}");
        }
    }
}
