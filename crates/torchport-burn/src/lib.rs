//! # torchport-burn
//!
//! Load any checkpoint torchport reads — `torch.save` files, and every other format the
//! `torchport` crate opens — straight into a Burn [`Module`](burn::module::Module), with an
//! exact account of anything that did not fit.
//!
//! ```no_run
//! use burn::nn::{Linear, LinearConfig, Lstm, LstmConfig};
//!
//! #[derive(burn::module::Module, Debug)]
//! struct Model {
//!     lstm: Lstm,
//!     linear: Linear,
//! }
//!
//! let device = Default::default();
//! let model = Model {
//!     lstm: LstmConfig::new(10, 20, true).init(&device),
//!     linear: LinearConfig::new(20, 30).init(&device),
//! };
//! // torch.save(model.state_dict(), "model.pt") on the PyTorch side:
//! let model = torchport_burn::load("model.pt", model)?;
//! # Ok::<(), torchport_burn::Error>(())
//! ```
//!
//! The adapter for each tensor is chosen by the Burn module it lands in (see [`adapt`]):
//! `Linear` weights are transposed, `Embedding`'s are not, PyTorch's packed LSTM/GRU gates are
//! split into Burn's per-gate `Linear`s for every layer and direction, a fused attention
//! `in_proj` is split into query/key/value, norm `weight`/`bias` become `gamma`/`beta`.
//! Renames you give ([`TorchportStore::rename`]) apply first.
//!
//! Loading is strict by default: if any parameter is missing or mismatched, or any tensor is
//! left unused, nothing is loaded and the error lists all of it (with the closest names and a
//! rename that would fix it). [`TorchportStore::allow_partial`] loads what fits and returns the
//! same [`LoadReport`].
//!
//! Built on burn-store: [`TorchportStore`] is a `burn_store::ModuleStore`, applies through
//! `ModuleSnapshot::apply` with deferred tensors (each read from the memory-mapped file when
//! applied, split and transposed in the same copy), and casts with burn-store's
//! `FloatCastAdapter` to the module's float dtype.
//!
//! Memory: loading holds the model plus at most one batch of new tensors
//! ([`TorchportStore::batch_bytes`], 64 MiB by default), never a second copy of the checkpoint.
//! The file's mapped pages are released stretch by stretch as they are copied, and Burn's
//! modules initialise their parameters lazily, so a module built with its configs' `init` and
//! loaded right away never allocates its random weights at all (docs/PORTING.md, "Loading a
//! model larger than half your RAM").
#![deny(missing_docs)]

mod activations;
pub mod adapt;
mod data;
mod error;
mod plan;
mod report;
mod store;
mod target;

pub use activations::Activations;
pub use error::{Error, Result};
pub use plan::Plan;
pub use report::{Applied, LoadReport, Mismatched, Missing, Unused};
pub use store::TorchportStore;
pub use target::{Kind, Target};

/// Load the checkpoint at `path` into `module`, strictly: every parameter filled, every
/// tensor used, or an error listing everything that did not fit (and nothing loaded).
pub fn load<M: burn::module::Module>(path: impl AsRef<std::path::Path>, module: M) -> Result<M> {
    TorchportStore::open(path)?.load(module).map(|(m, _)| m)
}
