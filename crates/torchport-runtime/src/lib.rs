//! Run `torch.export` programs (`.pt2` archives written by `torch.export.save`) in pure Rust,
//! on candle's CPU backend, with no Python and no libtorch.
//!
//! ```no_run
//! use torchport_runtime::Program;
//! let program = Program::load("model.pt2")?;
//! let x = candle_core::Tensor::zeros((1, 3, 224, 224), candle_core::DType::F32, &candle_core::Device::Cpu)?;
//! let outputs = program.run(&[x])?;
//! println!("{:?}", outputs[0].dims());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Inputs and outputs are `candle_core::Tensor`s (see [`Program::run`] for the dtype rules).
//! Layers: [`archive`] (the `.pt2` read by torchport: program JSON, weights, constants),
//! [`schema`] (the graph IR: the core's [`torchport::pt2`] types, re-exported), [`ops`] (the op
//! registry, one file per op family), [`Program`] (weights + interpreter). Before running,
//! every node is checked and the complete list of unsupported operators is reported.

mod allocator;
pub mod archive;
pub mod dtype;
mod dynamic_dims;
pub mod error;
mod fast;
pub mod npy;
pub mod ops;
pub mod prepare;
pub mod program;
pub mod schema;
mod subgraphs;
mod threads;
pub mod torchscript;
pub mod value;
mod views;

pub use allocator::retain_freed_memory;
pub use error::{Error, Result};
pub use ops::Registry;
pub use program::{InputInfo, NodeTime, OpTime, OpUse, Program};
pub use threads::{candle_pool_without_workers, pin_pool_threads};
pub use torchscript::{ScriptInput, ScriptProgram, Specialisation};

/// Re-export of the candle crate the runtime computes with.
pub use candle_core;
