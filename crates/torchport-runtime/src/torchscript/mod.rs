//! Run TorchScript archives (`torch.jit.save` of traced or scripted modules) in pure Rust.
//!
//! The archive is read by torchport's reader ([`torchport::open`]): the module tree with every
//! attribute, the code records and the constants ([`torchport::Checkpoint::script`]), and the
//! tensors. The code is parsed by a bounded parser ([`parser`]) and run by an evaluator
//! ([`eval`]) that calls the same op kernels as `.pt2` programs for every operator
//! ([`aten`]); ints, floats, lists, tuples, dicts, strings, `None`, control flow and method
//! calls are handled by the evaluator itself. Nothing in the archive is executed as Python.
//!
//! ```no_run
//! use torchport_runtime::ScriptProgram;
//! let program = ScriptProgram::load("model.pt")?;
//! let x = candle_core::Tensor::zeros((1, 3, 32, 32), candle_core::DType::F32, &candle_core::Device::Cpu)?;
//! let outputs = program.run(&[x])?; // tensors of the result, tuples/lists/dicts flattened
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod ast;
pub mod aten;
pub mod builtins;
pub mod eval;
mod layouts;
pub mod lexer;
mod linears;
pub mod parser;
pub mod scalars;
mod specialise;
mod upgraders;
pub mod value;
mod view_writes;

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use candle_core::Tensor;
use torchport::script::{ScriptObject, ScriptValue};
use torchport::Format;

use crate::error::{Error, Result};
use crate::program::OpUse;
use ast::{CodeFile, Expr, ExprKind, Func, Stmt, StmtKind, Target};
use eval::{EvalError, Interp};
use value::{Obj, Val};

/// The parsed code of an archive, by module path (`__torch__.torch.nn.modules.linear`).
pub struct Code {
    files: HashMap<String, (String, CodeFile)>,
    /// The archive's file format version, for torch's operator upgraders (`upgraders.rs`).
    pub(crate) version: Option<u64>,
}

/// The module path of a code record (`code/__torch__/a/b.py` → `__torch__.a.b`).
fn module_path(record: &str) -> Option<String> {
    let p = record.strip_prefix("code/")?.strip_suffix(".py")?;
    Some(p.replace('/', "."))
}

impl Code {
    /// Parse every code record; the first syntax error is reported with its record and line.
    pub fn parse(records: &[(String, Vec<u8>)], path: &Path) -> Result<Code> {
        let mut files = HashMap::new();
        for (record, bytes) in records {
            let Some(m) = module_path(record) else {
                continue;
            };
            let f = parser::parse(bytes).map_err(|e| Error::Script {
                path: path.to_path_buf(),
                record: record.clone(),
                line: e.line,
                what: e.what,
            })?;
            files.insert(m, (record.clone(), f));
        }
        Ok(Code {
            files,
            version: None,
        })
    }

    fn split(qual: &str) -> Option<(&str, &str)> {
        qual.rsplit_once('.')
    }

    fn class(&self, qual: &str) -> Option<(&ast::Class, &str)> {
        let (m, c) = Self::split(qual)?;
        let (record, f) = self.files.get(m)?;
        f.classes
            .iter()
            .find(|k| k.name == c)
            .map(|k| (k, record.as_str()))
    }

    /// Method `name` of class `qual`, and the record defining it.
    pub fn method(&self, qual: &str, name: &str) -> Option<(Arc<Func>, Rc<str>)> {
        let (c, record) = self.class(qual)?;
        c.methods
            .iter()
            .find(|f| f.name == name)
            .map(|f| (f.clone(), Rc::from(record)))
    }

    /// Class-level constant `name` of class `qual`.
    pub fn class_const(&self, qual: &str, name: &str) -> Option<&Expr> {
        let (c, _) = self.class(qual)?;
        c.consts.iter().find(|(n, _)| n == name).map(|(_, e)| e)
    }

    /// Free function `qual` (`__torch__.torch.nn.functional.embedding`).
    pub fn function(&self, qual: &str) -> Option<(Arc<Func>, Rc<str>)> {
        let (m, name) = Self::split(qual)?;
        let (record, f) = self.files.get(m)?;
        f.functions
            .iter()
            .find(|f| f.name == name)
            .map(|f| (f.clone(), Rc::from(record.as_str())))
    }

    /// Whether `qual` is a class of the code.
    pub fn is_class(&self, qual: &str) -> bool {
        self.class(qual).is_some()
    }

    /// Whether `qual` is a `NamedTuple` class of the code.
    pub fn is_named_tuple(&self, qual: &str) -> bool {
        self.class(qual)
            .is_some_and(|(c, _)| c.bases.iter().any(|b| b == "NamedTuple"))
    }

    /// Whether `n` names a code module.
    pub fn is_module_path(&self, n: &str) -> bool {
        self.files.contains_key(n)
    }

    /// Every function and method body.
    fn bodies(&self) -> impl Iterator<Item = &Arc<Func>> {
        self.files.values().flat_map(|(_, f)| {
            f.functions
                .iter()
                .chain(f.classes.iter().flat_map(|c| c.methods.iter()))
        })
    }
}

/// The stack of the thread the evaluator runs on: 512 MiB (address space; pages are used as
/// the recursion reaches them).
const EVAL_STACK: usize = 512 << 20;

/// A loaded TorchScript archive, ready to run.
pub struct ScriptProgram {
    path: PathBuf,
    code: Code,
    root: ScriptObject,
    constants: Vec<ScriptValue>,
    tensors: crate::fast::HashMap<String, Tensor>,
    /// Those of `tensors` stored packed, being read only as Linear weights (`linears.rs`).
    linears: aten::PackedLinears,
    /// How torch holds `tensors` (as the archive stores them), for `as_strided`.
    layouts: crate::fast::HashMap<candle_core::TensorId, layouts::Layout>,
    params: Vec<(String, bool)>,
    /// What runs the code for each signature of inputs seen (`specialise.rs`), at most
    /// [`MAX_SPECIALISED`] of them.
    plans: Mutex<Vec<(Signature, Plan)>>,
}

/// A run's outputs, and where it was recorded, the recording (or why there is none).
type Evaluated = (
    Vec<Tensor>,
    Option<std::result::Result<specialise::Recording, String>>,
);

/// The dtype and sizes of each input of a run.
type Signature = Vec<(candle_core::DType, Vec<usize>)>;

/// One argument of a TorchScript `forward` (see [`ScriptProgram::run_inputs`]).
#[derive(Debug, Clone)]
pub enum ScriptInput {
    /// A tensor.
    Tensor(Tensor),
    /// A list of tensors (`List[Tensor]`).
    Tensors(Vec<Tensor>),
}

/// How many input signatures a [`ScriptProgram`] keeps a graph for (each holds its own
/// prepared weights: folded, transformed for Winograd's algorithm); runs of others are
/// interpreted.
pub const MAX_SPECIALISED: usize = 4;

/// How runs of one signature of inputs are done.
enum Plan {
    /// The first run's recording, built into a program at the second run.
    Recorded(Box<specialise::Recording>),
    /// Runs as this program.
    Graph(Arc<crate::Program>),
    /// Interpreted, for this reason.
    Interpreted(String),
}

/// What one run does.
enum Next {
    /// Interpret and record (the signature's first run).
    Record,
    /// Run this program.
    Graph(Arc<crate::Program>),
    /// Interpret.
    Interpret,
}

/// How [`ScriptProgram::run`] runs inputs of one signature (see
/// [`ScriptProgram::specialisations`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Specialisation {
    /// The first run was interpreted and recorded; the next builds the graph.
    Recorded,
    /// Runs as a `.pt2` graph of this many nodes (after the load's rewrites).
    Graph {
        /// Its nodes.
        nodes: usize,
    },
    /// Interpreted, for the reason given.
    Interpreted(String),
}

impl ScriptProgram {
    /// Load a TorchScript archive written by `torch.jit.save`.
    pub fn load(path: impl AsRef<Path>) -> Result<ScriptProgram> {
        Self::open(path.as_ref(), true)
    }

    /// Every operator of the TorchScript archive at `path`, as [`ScriptProgram::ops`] lists
    /// them, from its code alone (no tensor is decoded).
    pub fn ops_of(path: impl AsRef<Path>) -> Result<Vec<OpUse>> {
        Ok(Self::open(path.as_ref(), false)?.ops())
    }

    /// Whether the file at `path` is a TorchScript archive (by torchport's format detection,
    /// which reads only the file's head and zip directory, never its pickles).
    pub fn is_torchscript(path: impl AsRef<Path>) -> Result<bool> {
        let format = torchport::detect_file(path.as_ref()).map_err(Error::Read)?;
        Ok(format == Format::TorchScript)
    }

    fn open(path: &Path, with_tensors: bool) -> Result<ScriptProgram> {
        let ckpt = torchport::open(path).map_err(Error::Read)?;
        if ckpt.format() != Format::TorchScript {
            return Err(Error::Archive {
                path: path.to_path_buf(),
                what: format!(
                    "not a TorchScript archive (it is a {} file); expected one written by torch.jit.save",
                    ckpt.format().name()
                ),
            });
        }
        // torch 1.0 to 1.2's format (model.json) is read for its weights only.
        let script = ckpt.script().ok_or_else(|| Error::Archive {
            path: path.to_path_buf(),
            what: "a TorchScript archive of torch 1.0 to 1.2 (model.json): its weights can be \
                   read (torchport inspect, convert), its code is not run; save the model again \
                   with a newer torch"
                .into(),
        })?;
        let mut code = Code::parse(&script.code, path)?;
        code.version = script.version;
        // The weights only Linears read are decoded packed, where this CPU has the kernels
        // (`linears.rs`).
        let (tensors, linears) = match with_tensors {
            true => {
                let packing = crate::ops::packed::Packing::detect();
                let weights = packing.map_or_else(Default::default, |_| {
                    linears::weights_read_only_by_linears(&code, &script.root, &script.constants)
                });
                decode(&ckpt, packing, &weights)?
            }
            false => Default::default(),
        };
        let layouts = ckpt
            .tensors()
            .iter()
            .chain(ckpt.constants())
            .filter_map(|info| Some((tensors.get(&info.name)?.id(), layouts::Layout::stored(info))))
            .collect();
        let (forward, _) = code.method(&script.root.class, "forward").ok_or_else(|| {
            Error::Program(format!(
                "{}: the root module ({}) has no forward method in the archive's code",
                path.display(),
                script.root.class
            ))
        })?;
        let params = forward
            .params
            .iter()
            .skip(1)
            .map(|p| (p.name.clone(), p.default.is_some()))
            .collect();
        Ok(ScriptProgram {
            path: path.to_path_buf(),
            code,
            root: script.root.clone(),
            constants: script.constants.clone(),
            tensors,
            linears,
            layouts,
            params,
            plans: Mutex::new(Vec::new()),
        })
    }

    /// The parameters of the root module's `forward` (after `self`), and whether each has a
    /// default (those may be left out of [`ScriptProgram::run`]'s inputs).
    pub fn inputs(&self) -> &[(String, bool)] {
        &self.params
    }

    /// Every operator the code calls (`aten::conv2d`, `prim::NumToTensor`, `torchvision::nms`;
    /// builtins of the evaluator count as supported), with its number of call sites and
    /// support. The whole code is scanned, including methods a given run may never reach (e.g. an LSTM's
    /// `PackedSequence` path).
    pub fn ops(&self) -> Vec<OpUse> {
        let ops = aten::Ops::get();
        let mut uses: Vec<(String, bool)> = Vec::new();
        let mut visit = |name: &str| {
            let (key, ok) = if let Some(op) = name
                .strip_prefix("torch.")
                .or_else(|| name.strip_prefix("ops.aten."))
            {
                (
                    format!("aten::{op}"),
                    ops.has(op) || builtins::is_native(op),
                )
            } else if let Some(op) = name.strip_prefix("ops.prim.") {
                (format!("prim::{op}"), builtins::is_prim(op))
            } else if let Some((ns, op)) = name.strip_prefix("ops.").and_then(|p| p.split_once('.'))
            {
                let key = format!("{ns}::{op}");
                let ok = ops.has(&key);
                (key, ok)
            } else {
                return;
            };
            uses.push((key, ok));
        };
        for f in self.code.bodies() {
            walk_stmts(&f.body, &mut visit);
        }
        crate::program::tally(uses.iter().map(|(k, ok)| (k.as_str(), *ok)))
    }

    /// How many of the archive's tensors the load stored packed for the gemm's microkernel,
    /// being read by the code only as the weight of a Linear (`torch.linear`, or
    /// `torch.addmm` as GPT-2's `Conv1D` is traced): what the load did, for checking it.
    pub fn packed_linear_weights(&self) -> usize {
        self.linears.len()
    }

    /// Operators the code calls that the runtime lacks (see [`ScriptProgram::ops`]); `run`
    /// does not refuse them up front, since code that calls them may never run, but fails
    /// where one is reached.
    pub fn unsupported_ops(&self) -> Vec<String> {
        self.ops()
            .into_iter()
            .filter(|o| !o.supported)
            .map(|o| o.op)
            .collect()
    }

    /// Run the root module's `forward` on `inputs` (positional; trailing parameters with
    /// defaults may be left out). Floats are computed in f32, ints in i64, bools as u8 0/1.
    /// The result's tensors come back in order, tuples, lists and dicts (by value) flattened;
    /// int, float and bool results come back as 0-d tensors (i64, f64 — a Python float is a
    /// double — and u8), as a `.pt2` program's numbers do; `None` is skipped.
    ///
    /// The first run of each signature of inputs (their dtypes and sizes) is interpreted and
    /// recorded as a `.pt2` graph specialised to that signature; later runs of the signature
    /// run that graph, with the load-time rewrites of a `.pt2` program (batch norms folded,
    /// activations fused, Winograd and packed weights), where the recording shows that
    /// nothing the code decided depended on the inputs' values, and while every size is the
    /// one recorded (checked as the graph runs; a run that differs is interpreted, and so is
    /// every later run of its signature). Results of the graph and of the interpreter may
    /// differ in the last bits (a folded batch norm rounds differently).
    /// [`ScriptProgram::specialisations`] says what each signature got;
    /// [`ScriptProgram::interpret`] never uses a graph.
    pub fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.check_count(inputs.len())?;
        let inputs = inputs
            .iter()
            .enumerate()
            .map(|(i, t)| input_tensor(i, t))
            .collect::<Result<Vec<_>>>()?;
        let signature: Signature = inputs
            .iter()
            .map(|t| (t.dtype(), t.dims().to_vec()))
            .collect();
        match self.next_run(&signature) {
            Next::Record => {
                let (out, recording) = self.evaluate(&inputs, true)?;
                let plan = match recording {
                    Some(Ok(r)) => Plan::Recorded(Box::new(r)),
                    Some(Err(why)) => Plan::Interpreted(why),
                    None => Plan::Interpreted("not recorded".into()),
                };
                let mut plans = self.plans();
                if plans.len() < MAX_SPECIALISED && !plans.iter().any(|(s, _)| *s == signature) {
                    plans.push((signature, plan));
                }
                Ok(out)
            }
            Next::Graph(program) => match program.run(&inputs) {
                Ok(out) => Ok(out),
                Err(e) => {
                    if let Some((_, plan)) = self.plans().iter_mut().find(|(s, _)| *s == signature)
                    {
                        *plan = Plan::Interpreted(format!("the graph failed: {e}"));
                    }
                    Ok(self.evaluate(&inputs, false)?.0)
                }
            },
            Next::Interpret => Ok(self.evaluate(&inputs, false)?.0),
        }
    }

    fn plans(&self) -> std::sync::MutexGuard<'_, Vec<(Signature, Plan)>> {
        self.plans.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the next run of inputs of `signature` does; a recording of them waiting for its
    /// second run is built into its program now.
    fn next_run(&self, signature: &Signature) -> Next {
        let mut plans = self.plans();
        let room = plans.len() < MAX_SPECIALISED;
        let Some((_, plan)) = plans.iter_mut().find(|(s, _)| s == signature) else {
            return if room { Next::Record } else { Next::Interpret };
        };
        *plan = match std::mem::replace(plan, Plan::Interpreted(String::new())) {
            Plan::Recorded(r) => match crate::Program::specialised(r.program, r.weights) {
                Ok(p) => Plan::Graph(Arc::new(p)),
                Err(e) => Plan::Interpreted(format!("the graph does not build: {e}")),
            },
            other => other,
        };
        match plan {
            Plan::Graph(p) => Next::Graph(Arc::clone(p)),
            _ => Next::Interpret,
        }
    }

    /// Run like [`ScriptProgram::run`], always by the evaluator (no graph is recorded or run).
    pub fn interpret(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let inputs: Vec<ScriptInput> = inputs.iter().cloned().map(ScriptInput::Tensor).collect();
        self.interpret_inputs(&inputs)
    }

    /// Run the root module's `forward` on arguments that may be lists of tensors (a
    /// `List[Tensor]` parameter, as torchvision's detection models take their images). Runs
    /// whose arguments are all tensors go through [`ScriptProgram::run`]; the others are
    /// interpreted (no graph is recorded for them).
    pub fn run_inputs(&self, inputs: &[ScriptInput]) -> Result<Vec<Tensor>> {
        let tensors: Option<Vec<Tensor>> = inputs
            .iter()
            .map(|x| match x {
                ScriptInput::Tensor(t) => Some(t.clone()),
                ScriptInput::Tensors(_) => None,
            })
            .collect();
        match tensors {
            Some(t) => self.run(&t),
            None => self.interpret_inputs(inputs),
        }
    }

    /// [`ScriptProgram::run_inputs`] by the evaluator alone.
    pub fn interpret_inputs(&self, inputs: &[ScriptInput]) -> Result<Vec<Tensor>> {
        self.check_count(inputs.len())?;
        let inputs = inputs
            .iter()
            .enumerate()
            .map(|(i, x)| {
                Ok(match x {
                    ScriptInput::Tensor(t) => ScriptInput::Tensor(input_tensor(i, t)?),
                    ScriptInput::Tensors(ts) => ScriptInput::Tensors(
                        ts.iter()
                            .map(|t| input_tensor(i, t))
                            .collect::<Result<_>>()?,
                    ),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(self.evaluate_inputs(&inputs, false)?.0)
    }

    /// For each signature of inputs run so far (their sizes, in order), how
    /// [`ScriptProgram::run`] runs it.
    pub fn specialisations(&self) -> Vec<(Vec<Vec<usize>>, Specialisation)> {
        self.plans()
            .iter()
            .map(|(s, plan)| {
                let sizes = s.iter().map(|(_, d)| d.clone()).collect();
                let how = match plan {
                    Plan::Recorded(_) => Specialisation::Recorded,
                    Plan::Graph(p) => Specialisation::Graph {
                        nodes: p.exported_program().graph_module.graph.nodes.len(),
                    },
                    Plan::Interpreted(why) => Specialisation::Interpreted(why.clone()),
                };
                (sizes, how)
            })
            .collect()
    }

    /// Whether `got` arguments fit `forward`'s parameters.
    fn check_count(&self, got: usize) -> Result<()> {
        let required = self.params.iter().filter(|(_, d)| !d).count();
        if got < required || got > self.params.len() {
            return Err(Error::InputCount {
                expected: self.params.len(),
                got,
            });
        }
        Ok(())
    }

    /// Run the evaluator on `inputs`, recording the run where `record` (the recording, or why
    /// there is none).
    fn evaluate(&self, inputs: &[Tensor], record: bool) -> Result<Evaluated> {
        let inputs: Vec<ScriptInput> = inputs.iter().cloned().map(ScriptInput::Tensor).collect();
        self.evaluate_inputs(&inputs, record)
    }

    /// Run the evaluator on `inputs` (in its representation); with `record`, recording the
    /// run (inputs that are all tensors).
    fn evaluate_inputs(&self, inputs: &[ScriptInput], record: bool) -> Result<Evaluated> {
        // The evaluator needs a large stack: its recursion is bounded (call depth, nesting of
        // the parsed code) but deeper than a default thread allows. It runs on a thread of a
        // pool whose threads have one (`threads::script_pool`), the others waiting for its
        // kernels' parallel loops as a `.pt2` program's run has them wait: on a thread outside
        // the pool, every loop was handed to the pool's threads and back, and MobileNetV3-Large
        // spent a quarter of its run in the scheduler (BENCHMARKS.md, issue 14). Where that
        // pool cannot be built, a thread of its own.
        let evaluate = || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.run_here(inputs, record)
            }))
            .map_err(|_| Error::Program("the evaluator panicked".into()))?
        };
        if let Some(pool) = crate::threads::script_pool(EVAL_STACK) {
            return pool.install(|| crate::program::in_pool(evaluate));
        }
        std::thread::scope(|s| {
            std::thread::Builder::new()
                .stack_size(EVAL_STACK)
                .spawn_scoped(s, evaluate)
                .map_err(|e| Error::Program(format!("cannot start the evaluator: {e}")))?
                .join()
                .map_err(|_| Error::Program("the evaluator panicked".into()))?
        })
    }

    /// The evaluator's run on this thread; with `record`, its recording as well.
    fn run_here(&self, inputs: &[ScriptInput], record: bool) -> Result<Evaluated> {
        let mut given = Vec::new();
        let args: Vec<Val> = inputs
            .iter()
            .map(|x| match x {
                ScriptInput::Tensor(t) => {
                    given.push(t.clone());
                    Val::Tensor(t.clone())
                }
                ScriptInput::Tensors(ts) => {
                    Val::list(ts.iter().map(|t| Val::Tensor(t.clone())).collect())
                }
            })
            .collect();
        let record = record && given.len() == inputs.len();
        let root = match self.value(&ScriptValue::Object(Box::new(self.root.clone())))? {
            Val::Object(o) => o,
            _ => return Err(Error::Program("the root is not a module".into())),
        };
        let constants = self
            .constants
            .iter()
            .map(|c| self.value(c).and_then(wrapped_number))
            .collect::<Result<_>>()?;
        // Every run holds the thread's recorder slot, recording or not (`specialise::Guard`).
        let guard = match record {
            true => {
                let archive = self
                    .tensors
                    .iter()
                    .map(|(name, t)| (t.id(), name.clone()))
                    .collect();
                specialise::Guard::start(archive, &given)
            }
            false => specialise::Guard::idle(),
        };
        let mut interp = Interp::new(&self.code, constants, &self.linears, &self.layouts);
        interp.inputs(&args);
        let out = interp
            .call_method(&root, "forward", args, Vec::new())
            .map_err(|e| self.error(e))?;
        let mut tensors = Vec::new();
        flatten(&out, &mut tensors, 0)?;
        let recording = record.then(|| guard.finish(&tensors));
        Ok((tensors, recording))
    }

    fn error(&self, e: EvalError) -> Error {
        let (record, line) = e.at.unwrap_or_default();
        Error::Script {
            path: self.path.clone(),
            record,
            line,
            what: e.what,
        }
    }

    /// An attribute value as an evaluator value.
    fn value(&self, v: &ScriptValue) -> Result<Val> {
        Ok(match v {
            ScriptValue::None | ScriptValue::Other(_) => Val::None,
            ScriptValue::Bool(b) => Val::Bool(*b),
            ScriptValue::Int(i) => Val::Int(*i),
            ScriptValue::Float(f) => Val::Float(*f),
            ScriptValue::Str(s) => Val::Str(s.as_str().into()),
            ScriptValue::Tensor(name) => Val::Tensor(self.tensors.get(name).cloned().ok_or_else(
                || Error::Weight {
                    name: name.clone(),
                    what: "the module tree names it but its data was not read".into(),
                },
            )?),
            ScriptValue::List(items) => {
                Val::list(items.iter().map(|x| self.value(x)).collect::<Result<_>>()?)
            }
            ScriptValue::Tuple(items) => {
                Val::tuple(items.iter().map(|x| self.value(x)).collect::<Result<_>>()?)
            }
            ScriptValue::Dict(items) => Val::Dict(Rc::new(RefCell::new(
                items
                    .iter()
                    .map(|(k, x)| Ok((self.value(k)?, self.value(x)?)))
                    .collect::<Result<_>>()?,
            ))),
            ScriptValue::Object(o) => {
                let attrs = o
                    .attrs
                    .iter()
                    .map(|(k, x)| Ok((k.clone(), self.value(x)?)))
                    .collect::<Result<_>>()?;
                Val::Object(Rc::new(Obj {
                    class: o.class.as_str().into(),
                    attrs: RefCell::new(attrs),
                }))
            }
        })
    }
}

/// An input tensor in the evaluator's representation.
fn input_tensor(index: usize, t: &Tensor) -> Result<Tensor> {
    eval::input_tensor(t).map_err(|e| Error::Input {
        index,
        what: e.to_string(),
    })
}

/// Every tensor of `ckpt` (parameters, buffers, constants) by name, decoded as a `.pt2`
/// load decodes its weights (`archive::decode`: in parallel, the float32 ones into one
/// shared buffer, each archive page released once copied), those of `linear_weights`
/// packed as the layout there says (where `packing` is given): the packed ones also by
/// tensor, with their `(out, in)` features. Not packed: a weight with fewer outputs than
/// half a panel, whose panels' padding would more than double it (a `[1, k]` weight would
/// take 64 times its bytes with AVX-512, and an archive must not make the load allocate many
/// times what it holds).
fn decode(
    ckpt: &torchport::Checkpoint,
    packing: Option<crate::ops::packed::Packing>,
    linear_weights: &HashMap<String, crate::ops::packed::Source>,
) -> Result<(crate::fast::HashMap<String, Tensor>, aten::PackedLinears)> {
    let packed: crate::fast::HashMap<String, crate::ops::packed::Source> = ckpt
        .tensors()
        .iter()
        .chain(ckpt.constants())
        .filter_map(|t| {
            let source = *linear_weights.get(&t.name)?;
            let (n, k) = source.features(&t.shape)?;
            let fits = packing?.len(n, k).is_some_and(|len| len / 2 <= n * k);
            let plain = t.dtype.name() == "float32" && t.quant.is_none() && t.shape.len() == 2;
            (fits && plain).then(|| (t.name.clone(), source))
        })
        .collect();
    // Small archives mapped at once, as a `.pt2` load maps them.
    crate::archive::populate(ckpt);
    let none = crate::fast::HashSet::default();
    let (tensors, _, was_packed) =
        crate::archive::decode(ckpt, &none, &packed, &none, |_| Default::default())?;
    let mut linears = aten::PackedLinears::new();
    for (name, (_, features)) in &was_packed {
        if let Some(t) = tensors.get(name) {
            linears.insert(t.id(), *features);
        }
    }
    Ok((tensors, linears))
}

/// The tensors of a result, in order.
fn flatten(v: &Val, out: &mut Vec<Tensor>, depth: usize) -> Result<()> {
    if depth > 64 {
        return Err(Error::Program("the result is nested too deeply".into()));
    }
    use crate::value::Scalar;
    let number = |s| crate::ops::number_tensor(s).map_err(|e| Error::Program(e.0));
    match v {
        Val::Tensor(t) => out.push(t.clone()),
        Val::List(_) | Val::Tuple(_) => {
            for x in v.items().unwrap_or_default() {
                flatten(&x, out, depth + 1)?;
            }
        }
        Val::Dict(d) => {
            for (_, x) in d.borrow().iter() {
                flatten(x, out, depth + 1)?;
            }
        }
        Val::Int(i) => out.push(number(Scalar::Int(*i))?),
        Val::Float(f) => out.push(number(Scalar::Float(*f))?),
        Val::Bool(b) => out.push(number(Scalar::Bool(*b))?),
        Val::None => {}
        other => {
            return Err(Error::Program(format!(
                "the model returned a {}, which has no tensor form",
                other.type_name()
            )))
        }
    }
    Ok(())
}

fn walk_stmts(stmts: &[Stmt], visit: &mut impl FnMut(&str)) {
    for s in stmts {
        match &s.kind {
            StmtKind::Assign(ts, e) => {
                for t in ts {
                    walk_target(t, visit);
                }
                walk_expr(e, visit);
            }
            StmtKind::AugAssign(t, _, e) => {
                walk_target(t, visit);
                walk_expr(e, visit);
            }
            StmtKind::Expr(e) | StmtKind::Return(Some(e)) | StmtKind::Raise(Some(e)) => {
                walk_expr(e, visit)
            }
            StmtKind::If(c, a, b) => {
                walk_expr(c, visit);
                walk_stmts(a, visit);
                walk_stmts(b, visit);
            }
            StmtKind::For(t, e, b) => {
                walk_target(t, visit);
                walk_expr(e, visit);
                walk_stmts(b, visit);
            }
            StmtKind::While(c, b) | StmtKind::With(c, b) => {
                walk_expr(c, visit);
                walk_stmts(b, visit);
            }
            StmtKind::Assert(c, m) => {
                walk_expr(c, visit);
                if let Some(m) = m {
                    walk_expr(m, visit);
                }
            }
            _ => {}
        }
    }
}

fn walk_target(t: &Target, visit: &mut impl FnMut(&str)) {
    match t {
        Target::Tuple(ts) => ts.iter().for_each(|t| walk_target(t, visit)),
        Target::Subscript(a, b) => {
            walk_expr(a, visit);
            walk_expr(b, visit);
        }
        Target::Attr(a, _) => walk_expr(a, visit),
        Target::Name(_) => {}
    }
}

fn walk_expr(e: &Expr, visit: &mut impl FnMut(&str)) {
    let mut go = |x: &Expr| walk_expr(x, visit);
    match &e.kind {
        ExprKind::Call(f, args, kw) => {
            if let Some(name) = parser::dotted(f) {
                visit(&name);
            } else {
                walk_expr(f, visit);
            }
            for a in args {
                walk_expr(a, visit);
            }
            for (_, a) in kw {
                walk_expr(a, visit);
            }
        }
        ExprKind::Attr(a, _) | ExprKind::Neg(a) | ExprKind::Invert(a) | ExprKind::Not(a) => go(a),
        ExprKind::Subscript(a, b)
        | ExprKind::Binary(_, a, b)
        | ExprKind::And(a, b)
        | ExprKind::Or(a, b) => {
            go(a);
            go(b);
        }
        ExprKind::IfExp(a, b, c) => {
            go(a);
            go(b);
            go(c);
        }
        ExprKind::Slice(a, b, c) => {
            for x in [a, b, c].into_iter().flatten() {
                go(x);
            }
        }
        ExprKind::List(items) | ExprKind::Tuple(items) => items.iter().for_each(go),
        ExprKind::Dict(items) => {
            for (k, v) in items {
                go(k);
                go(v);
            }
        }
        _ => {}
    }
}

/// A 0-d float64 tensor among the code's constants is a Python float the tracer recorded (a
/// wrapped number: torch promotes `int_tensor + CONSTANTS.c0` to float32 and keeps
/// `f64_tensor * CONSTANTS.c0` exact in float64), so it is handed to the ops as that float.
fn wrapped_number(v: Val) -> Result<Val> {
    match v {
        Val::Tensor(t) if t.rank() == 0 && t.dtype() == candle_core::DType::F64 => t
            .to_scalar::<f64>()
            .map(Val::Float)
            .map_err(|e| Error::Program(format!("a float64 constant: {e}"))),
        v => Ok(v),
    }
}
