//! `TorchportStore`: burn-store's [`ModuleStore`] over any checkpoint torchport reads.
//!
//! Loading plans first (no data is read), fails as a whole in strict mode, then hands
//! burn-store's [`ModuleSnapshot::apply`] one deferred tensor per parameter, each of which reads
//! its bytes from the memory-mapped file only when the applier reaches it, with the block
//! split and transpose done in the same copy. burn-store's [`FloatCastAdapter`] then casts
//! float tensors to the module's float dtype.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use burn::module::Module;
use burn_store::burn_pack::{Error as PackError, Tensor as PackTensor};
use burn_store::{
    bridge, ApplyError, ApplyResult, FloatCastAdapter, KeyRemapper, ModuleSnapshot, ModuleStore,
};
use torchport::{Checkpoint, TensorData as Layout};

use crate::adapt::Recipe;
use crate::data::{produce, produced_dtype};
use crate::error::{Error, Result};
use crate::plan::{self, Plan, Planned};
use crate::report::LoadReport;
use crate::target::{self, Kind, Target};

/// Loads any checkpoint torchport reads into any Burn [`Module`]; also a burn-store
/// [`ModuleStore`], so `model.load_from(&mut store)` works too.
///
/// Strict by default: unless every parameter is filled and every tensor used, nothing is
/// loaded and the error lists all of it. [`allow_partial`](Self::allow_partial) loads what fits.
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
    remapper: KeyRemapper,
    partial: bool,
    report: Option<LoadReport>,
    cache: Option<BTreeMap<String, PackTensor>>,
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
            remapper: KeyRemapper::new(),
            partial: false,
            report: None,
            cache: None,
        }
    }

    /// The checkpoint.
    pub fn checkpoint(&self) -> &Checkpoint {
        &self.ckpt
    }

    /// Rename checkpoint tensors before matching: every match of the regular expression
    /// `pattern` is replaced by `to` (`$1` names a capture group). Renames apply in the order
    /// given, before any adapter.
    pub fn rename(mut self, pattern: &str, to: &str) -> Result<Self> {
        self.remapper = self
            .remapper
            .add_pattern(pattern, to)
            .map_err(|e| Error::Pattern {
                pattern: pattern.to_string(),
                message: e.to_string(),
            })?;
        self.cache = None;
        Ok(self)
    }

    /// Use burn-store's [`KeyRemapper`] for renames (replaces earlier renames).
    pub fn with_key_remapper(mut self, remapper: KeyRemapper) -> Self {
        self.remapper = remapper;
        self.cache = None;
        self
    }

    /// Load what fits even when some parameters are missing or mismatched or some tensors go
    /// unused (the report still lists them).
    pub fn allow_partial(mut self, partial: bool) -> Self {
        self.partial = partial;
        self
    }

    /// Match the checkpoint against `module` without loading anything.
    pub fn plan<M: Module>(&self, module: &M) -> Plan {
        plan::plan(&self.ckpt, &self.remapper, target::targets(module))
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
        let Plan { planned, report } = self.plan(module);
        if !self.partial && !report.is_complete() {
            return Err(Error::Incomplete {
                path: self.ckpt.path().to_path_buf(),
                report: Box::new(report),
            });
        }
        let float = float_dtype(module);
        let tensors: Vec<PackTensor> = planned.into_iter().map(|p| self.deferred(p)).collect();
        let result = module.apply(
            tensors,
            None,
            Some(Box::new(FloatCastAdapter::to(float))),
            false,
        );
        if !result.errors.is_empty() {
            return Err(Error::Apply {
                path: self.ckpt.path().to_path_buf(),
                errors: result.errors.iter().map(|e| e.to_string()).collect(),
            });
        }
        Ok(report)
    }

    /// Load into `module` and give it back with the report.
    pub fn load<M: Module>(&self, mut module: M) -> Result<(M, LoadReport)> {
        let report = self.load_into(&mut module)?;
        Ok((module, report))
    }

    /// A burn-store tensor that produces this parameter's data when asked.
    fn deferred(&self, p: Planned) -> PackTensor {
        let info = &self.ckpt.tensors()[p.tensor];
        let dtype = produced_dtype(info.dtype);
        let ckpt = Arc::clone(&self.ckpt);
        let name = p.target.path();
        let shape = p.target.shape.clone();
        bridge::deferred(name, dtype, shape.into(), None, move || {
            produce(&ckpt, &p).map_err(PackError::ValidationError)
        })
    }

    /// Every checkpoint tensor as a lazy burn-store tensor, under its renamed name and in
    /// PyTorch layout (no adapter applied).
    fn all_tensors(&mut self) -> &BTreeMap<String, PackTensor> {
        let ckpt = Arc::clone(&self.ckpt);
        let remapper = &self.remapper;
        self.cache.get_or_insert_with(|| {
            let mut map = BTreeMap::new();
            for (i, info) in ckpt.tensors().iter().enumerate() {
                if !matches!(info.data, Layout::Strided { .. }) {
                    continue;
                }
                let name = plan::rename(remapper, &info.name);
                let p = Planned {
                    target: Target {
                        segments: vec![name.clone()],
                        types: vec![String::new()],
                        shape: info.shape.clone(),
                        kind: Kind::Float,
                    },
                    recipe: Recipe {
                        source: name.clone(),
                        part: None,
                        transpose: false,
                        note: String::new(),
                    },
                    tensor: i,
                };
                let c = Arc::clone(&ckpt);
                let t = bridge::deferred(
                    name.clone(),
                    produced_dtype(info.dtype),
                    info.shape.clone().into(),
                    None,
                    move || produce(&c, &p).map_err(PackError::ValidationError),
                );
                map.entry(name).or_insert(t);
            }
            map
        })
    }
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
        Ok(self.all_tensors().get(name))
    }

    fn get_all_tensors(&mut self) -> Result<&BTreeMap<String, PackTensor>> {
        Ok(self.all_tensors())
    }

    fn keys(&mut self) -> Result<Vec<String>> {
        Ok(self.all_tensors().keys().cloned().collect())
    }
}
