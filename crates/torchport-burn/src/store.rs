//! `TorchportStore`: burn-store's [`ModuleStore`] over any checkpoint torchport reads.
//!
//! Loading plans first (no data is read) and fails as a whole in strict mode. Then the
//! checkpoint's tensors go through the user's rules and the adapters' rules (torchport's remap
//! engine: lazy, a block along dim 0 of a memory-mapped tensor is borrowed, not copied), are
//! copied once into the buffers Burn keeps (a float32 transpose happens in that copy), and
//! are handed to burn-store's [`ModuleSnapshot::apply`] a batch at a time, with burn-store's
//! [`FloatCastAdapter`] casting floats to the module's float dtype.
//!
//! Memory stays bounded by the model plus one batch: a batch holds at most
//! [`BATCH_BYTES`] of new data (or one tensor, if larger) and is applied before the next
//! tensor is read, so a parameter's old value (if the module had initialised it) is dropped
//! before more than one batch of new ones exists. The memory-mapped file's pages are released
//! ([`Checkpoint::release_bytes`]) a few MiB at a time as they are copied, and once a checkpoint
//! tensor has been copied into every parameter it feeds ([`Checkpoint::release`]), so the
//! mapped file never stays resident beyond the stretch being copied.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use burn::module::Module;
use burn_store::burn_pack::{Error as PackError, Tensor as PackTensor};
use burn_store::{bridge, ApplyError, ApplyResult, FloatCastAdapter, ModuleSnapshot, ModuleStore};
use torchport::remap::{self, Op, Rule, RuleSet, TensorMeta};
use torchport::Checkpoint;

use crate::data::{produced_dtype, tensor_data};
use crate::error::{Error, Result};
use crate::plan::{self, Plan};
use crate::report::LoadReport;
use crate::target::{self, Target};

/// Most bytes of tensor data read ahead of one `apply` pass over the module, by default (see
/// [`TorchportStore::batch_bytes`]).
pub const BATCH_BYTES: usize = 64 << 20;

/// Loads any checkpoint torchport reads into any Burn [`Module`]; also a burn-store
/// [`ModuleStore`], so `model.load_from(&mut store)` works too.
///
/// Strict by default: unless every parameter is filled and every tensor used, nothing is
/// loaded and the error lists all of it. [`allow_partial`](Self::allow_partial) loads what fits.
/// Rules (torchport's remap language) run before the target-aware adapters.
///
/// ```no_run
/// # use burn::module::Module;
/// # fn demo<M: Module>(model: M) -> Result<(), torchport_burn::Error> {
/// let store = torchport_burn::TorchportStore::open("model.pt")?
///     .rename(r"^features\.0\.", "conv1.")?
///     .allow_partial(true);
/// let (model, report) = store.load(model)?;
/// println!("{report}");
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct TorchportStore {
    ckpt: Arc<Checkpoint>,
    rules: RuleSet,
    partial: bool,
    target_aware: bool,
    report: Option<LoadReport>,
    cache: Option<BTreeMap<String, PackTensor>>,
    batch: usize,
}

impl TorchportStore {
    /// Open a checkpoint of any format torchport reads.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Ok(Self::new(torchport::open(path)?))
    }

    /// Use an already opened checkpoint.
    pub fn new(ckpt: impl Into<Arc<Checkpoint>>) -> Self {
        TorchportStore {
            ckpt: ckpt.into(),
            rules: RuleSet::new(),
            partial: false,
            target_aware: true,
            report: None,
            cache: None,
            batch: BATCH_BYTES,
        }
    }

    /// The checkpoint.
    pub fn checkpoint(&self) -> &Checkpoint {
        &self.ckpt
    }

    /// Rename checkpoint tensors before matching: the part of a name the regular expression
    /// `pattern` matches is replaced by `to` (`$1` names a capture group) — a remap `rename`
    /// rule. Rules run in the order given, before any adapter.
    pub fn rename(self, pattern: &str, to: &str) -> Result<Self> {
        let rule = Rule::new(pattern, Op::Rename { to: to.into() }).map_err(Error::rules)?;
        let mut rules = RuleSet::new();
        rules.push(rule);
        Ok(self.rules(rules))
    }

    /// Append remap rules (built in Rust or read with `RuleSet::from_toml_file`).
    pub fn rules(mut self, rules: RuleSet) -> Self {
        self.rules.extend(rules);
        self.cache = None;
        self
    }

    /// Append a remap preset (`strip-prefix`, `lstm-gates`, `gru-gates`, `attention-qkv`,
    /// `burn`, `weight-norm`). The `burn` preset already produces Burn's names and layouts, so
    /// it turns the target-aware adapters off.
    pub fn preset(mut self, name: &str) -> Result<Self> {
        self.rules.preset(name).map_err(Error::rules)?;
        if name == "burn" {
            self.target_aware = false;
        }
        self.cache = None;
        Ok(self)
    }

    /// Turn the target-aware adapters off (tensors must then already carry Burn's names and
    /// layouts, e.g. through your rules) or back on. On by default.
    pub fn target_aware(mut self, on: bool) -> Self {
        self.target_aware = on;
        self
    }

    /// Load what fits even when some parameters are missing or mismatched or some tensors go
    /// unused (the report still lists them).
    pub fn allow_partial(mut self, partial: bool) -> Self {
        self.partial = partial;
        self
    }

    /// Read at most `bytes` of tensor data (or one tensor, if it is larger) before putting
    /// them into the module; 64 MiB by default. Each batch costs one pass
    /// over the module's parameters; a smaller batch lowers the peak memory of loading into a
    /// module whose parameters are already initialised (their old values are dropped a batch at
    /// a time), and `0` puts every tensor in as soon as it is read.
    pub fn batch_bytes(mut self, bytes: usize) -> Self {
        self.batch = bytes;
        self
    }

    /// Match the checkpoint against `module` without loading anything.
    pub fn plan<M: Module>(&self, module: &M) -> Result<Plan> {
        plan::plan(
            &self.ckpt,
            &self.rules,
            target::targets(module),
            self.target_aware,
        )
    }

    /// The parameters of `module`, as the adapters see them.
    pub fn targets<M: Module>(module: &M) -> Vec<Target> {
        target::targets(module)
    }

    /// The report of the last load through [`ModuleStore::apply_to`].
    pub fn last_report(&self) -> Option<&LoadReport> {
        self.report.as_ref()
    }

    /// Load into `module` in place; returns what was done.
    pub fn load_into<M: Module>(&self, module: &mut M) -> Result<LoadReport> {
        let targets = target::targets(module);
        let Plan { planned, report } =
            plan::plan(&self.ckpt, &self.rules, targets.clone(), self.target_aware)?;
        if !self.partial && !report.is_complete() {
            return Err(Error::Incomplete {
                path: self.ckpt.path().to_path_buf(),
                report: Box::new(report),
            });
        }
        let fail = |errors: Vec<String>| Error::Apply {
            path: self.ckpt.path().to_path_buf(),
            errors,
        };
        let wanted = plan::target_tensors(&targets);
        let ctx = remap::Context {
            modules: self.ckpt.modules(),
            target: Some(&wanted),
        };
        let (adapters, produced) = plan::adapter_rules(&planned)?;
        let (outs, by_rules) =
            remap::apply_with(&self.rules, self.ckpt.out_tensors(), &ctx).map_err(Error::rules)?;
        let (outs, by_adapters) = remap::apply(&adapters, outs).map_err(Error::rules)?;
        let outs: HashMap<String, torchport::OutTensor<'_>> =
            outs.into_iter().map(|o| (o.name.clone(), o)).collect();
        let mut release = Release::new(&by_rules, &by_adapters, &produced);

        let float = float_dtype(module);
        let mut batch = Vec::new();
        let mut bytes = 0usize;
        let mut errors = Vec::new();
        let mut flush = |batch: &mut Vec<PackTensor>, module: &mut M| {
            let result = module.apply(
                std::mem::take(batch),
                None,
                Some(Box::new(FloatCastAdapter::to(float))),
                false,
            );
            errors.extend(result.errors.iter().map(|e| e.to_string()));
        };
        for (p, name) in planned.iter().zip(&produced) {
            let path = p.target.path();
            let out = outs.get(name).ok_or_else(|| {
                fail(vec![format!("{path}: the rules produced no tensor {name}")])
            })?;
            // Put the batch in (dropping the values it replaces) before reading more.
            let size = out.numel().saturating_mul(produced_dtype(out.dtype).size());
            if !batch.is_empty() && bytes.saturating_add(size) > self.batch {
                flush(&mut batch, module);
                bytes = 0;
            }
            // The tensor's own dtype and shape: should they differ from the plan's,
            // burn-store's applier reports the mismatch instead of loading it.
            let data = out
                .data()
                .map_err(|e| e.to_string())
                .and_then(|b| {
                    let done = |part: &[u8]| self.ckpt.release_bytes(part);
                    tensor_data(out.dtype, out.shape.clone(), b, p.fused_transpose(), &done)
                })
                .map_err(|e| fail(vec![format!("{path}: {e}")]))?;
            release.done(&self.ckpt, name);
            bytes = bytes.saturating_add(size);
            batch.push(hand_over(data, path));
        }
        if !batch.is_empty() {
            flush(&mut batch, module);
        }
        if !errors.is_empty() {
            return Err(fail(errors));
        }
        Ok(report)
    }

    /// Load into `module` and give it back with the report.
    pub fn load<M: Module>(&self, mut module: M) -> Result<(M, LoadReport)> {
        let report = self.load_into(&mut module)?;
        Ok((module, report))
    }

    /// Every tensor after the rules, as a lazy burn-store tensor in the checkpoint's own
    /// layout (no adapter applied); each reads its data when asked.
    fn all_tensors(&mut self) -> Result<&BTreeMap<String, PackTensor>> {
        if self.cache.is_none() {
            let metas: Vec<TensorMeta> =
                self.ckpt.out_tensors().iter().map(TensorMeta::of).collect();
            let ctx = remap::Context {
                modules: self.ckpt.modules(),
                target: None,
            };
            let (outs, _) = remap::plan(&self.rules, &metas, &ctx).map_err(Error::rules)?;
            let mut map = BTreeMap::new();
            for m in outs {
                let (ckpt, rules, name) =
                    (Arc::clone(&self.ckpt), self.rules.clone(), m.name.clone());
                let shape = m.shape.clone();
                let t = bridge::deferred(
                    m.name.clone(),
                    produced_dtype(m.dtype),
                    m.shape.clone().into(),
                    None,
                    move || {
                        read_one(&ckpt, &rules, &name, &shape).map_err(PackError::ValidationError)
                    },
                );
                map.entry(m.name).or_insert(t);
            }
            self.cache = Some(map);
        }
        Ok(self.cache.get_or_insert_with(BTreeMap::new))
    }
}

/// Releases a checkpoint tensor's memory-mapped pages once every parameter it feeds has been
/// copied out of it (the pages stay in the OS page cache; see [`Checkpoint::release`]).
struct Release {
    /// For each tensor the load produces, the checkpoint tensors it is made from.
    sources: HashMap<String, Vec<String>>,
    /// For each checkpoint tensor, how many produced tensors still have to be read from it.
    pending: HashMap<String, usize>,
}

impl Release {
    /// `by_rules` maps checkpoint tensors to the tensors after the user's rules,
    /// `by_adapters` those to the produced ones, of which the load reads `produced`.
    fn new(by_rules: &remap::Plan, by_adapters: &remap::Plan, produced: &[String]) -> Self {
        let origin: HashMap<&str, &[String]> = by_rules
            .targets
            .iter()
            .map(|t| (t.name.as_str(), t.sources.as_slice()))
            .collect();
        let mut sources: HashMap<String, Vec<String>> = HashMap::new();
        for t in &by_adapters.targets {
            let from: Vec<String> = t
                .sources
                .iter()
                .flat_map(|s| origin.get(s.as_str()).copied().unwrap_or_default())
                .cloned()
                .collect();
            sources.entry(t.name.clone()).or_insert(from);
        }
        let mut pending: HashMap<String, usize> = HashMap::new();
        for name in produced {
            for s in sources.get(name).into_iter().flatten() {
                *pending.entry(s.clone()).or_default() += 1;
            }
        }
        Release { sources, pending }
    }

    /// `name` has been copied out: release the sources nothing else still reads.
    fn done(&mut self, ckpt: &Checkpoint, name: &str) {
        for s in self.sources.get(name).into_iter().flatten() {
            let Some(left) = self.pending.get_mut(s) else {
                continue;
            };
            *left = left.saturating_sub(1);
            if *left == 0 {
                if let Some(t) = ckpt.tensor(s) {
                    ckpt.release(t);
                }
            }
        }
    }
}

/// A burn-store tensor that hands `data` over when the applier asks for it. burn-store's
/// applier clones the tensors it is given before drawing their data; a resident tensor's
/// bytes would then be shared and Burn would copy them, while a deferred one gives its
/// buffer away (Burn's ndarray backend keeps the very `Vec` made from the memory map).
fn hand_over(data: burn::tensor::TensorData, path: String) -> PackTensor {
    let (dtype, shape) = (data.dtype(), data.shape().clone());
    let cell = std::sync::Mutex::new(Some(data));
    let name = path.clone();
    bridge::deferred(path, dtype, shape, None, move || {
        cell.lock()
            .ok()
            .and_then(|mut d| d.take())
            .ok_or_else(|| PackError::ValidationError(format!("{name} was already applied")))
    })
}

/// One tensor after `rules`, read on its own (the rules run over the names again; only this
/// tensor's data is read).
fn read_one(
    ckpt: &Checkpoint,
    rules: &RuleSet,
    name: &str,
    shape: &[usize],
) -> std::result::Result<burn::tensor::TensorData, String> {
    let ctx = remap::Context {
        modules: ckpt.modules(),
        target: None,
    };
    let (outs, plan) =
        remap::apply_with(rules, ckpt.out_tensors(), &ctx).map_err(|e| e.to_string())?;
    let t = outs
        .iter()
        .find(|o| o.name == name)
        .ok_or_else(|| format!("the rules no longer produce {name}"))?;
    let data = t.data().map_err(|e| e.to_string())?;
    let out = tensor_data(t.dtype, shape.to_vec(), data, false, &|b| {
        ckpt.release_bytes(b)
    });
    // Copied out: its sources' mapped pages are not needed any more.
    let sources = plan.targets.iter().filter(|p| p.name == name);
    for s in sources.flat_map(|p| &p.sources) {
        if let Some(info) = ckpt.tensor(s) {
            ckpt.release(info);
        }
    }
    out
}

/// The float dtype the module's device computes in (f32 on the default ndarray device).
fn float_dtype<M: Module>(module: &M) -> burn::tensor::DType {
    module
        .devices()
        .first()
        .map(|d| d.settings().float_dtype.into())
        .unwrap_or(burn::tensor::DType::F32)
}

impl ModuleStore for TorchportStore {
    type Error = Error;

    fn collect_from<M: ModuleSnapshot>(&mut self, _module: &M) -> Result<()> {
        Err(Error::ReadOnly)
    }

    fn apply_to<M: ModuleSnapshot>(&mut self, module: &mut M) -> Result<ApplyResult> {
        let report = self.load_into(module)?;
        let result = ApplyResult {
            applied: report.applied.iter().map(|a| a.target.clone()).collect(),
            skipped: Vec::new(),
            missing: report
                .missing
                .iter()
                .map(|m| (m.target.clone(), String::new()))
                .collect(),
            unused: report.unused.iter().map(|u| u.source.clone()).collect(),
            errors: report
                .mismatched
                .iter()
                .map(|m| ApplyError::AdapterError {
                    path: m.target.clone(),
                    message: format!("{} {}", m.source, m.reason),
                })
                .collect(),
        };
        self.report = Some(report);
        Ok(result)
    }

    fn get_tensor(&mut self, name: &str) -> Result<Option<&PackTensor>> {
        Ok(self.all_tensors()?.get(name))
    }

    fn get_all_tensors(&mut self) -> Result<&BTreeMap<String, PackTensor>> {
        self.all_tensors()
    }

    fn keys(&mut self) -> Result<Vec<String>> {
        Ok(self.all_tensors()?.keys().cloned().collect())
    }
}
