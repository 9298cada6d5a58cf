//! # torchport
//!
//! Read every file PyTorch writes — safely, with no Python and no libtorch.
//!
//! Opening a file reads only its directory and pickles: nothing in the file is ever
//! executed (see [`torchport_pickle`]), every size and stride is checked, and tensor data
//! stays in the memory-mapped file until asked for, when a contiguous tensor is handed out
//! as a borrowed slice with no copy.
//!
//! [`remap`] adapts the tensors to a Rust model's names and layouts (rules, presets such as
//! `burn`, a dry-run plan, and a match report against a target; docs/RULES.md).
//!
//! ```no_run
//! let ckpt = torchport::open("model.pt")?;
//! println!("{} ({} tensors)", ckpt.format(), ckpt.tensors().len());
//! let w = ckpt.tensor("fc.weight").expect("fc.weight");
//! let bytes = ckpt.data(w)?; // little-endian, row-major
//! assert_eq!(bytes.len(), w.nbytes());
//! # Ok::<(), torchport::Error>(())
//! ```
#![deny(missing_docs)]

pub mod cast;
mod checkpoint;
pub mod convert;
pub mod diff;
mod dtype;
mod error;
mod format;
mod limits;
pub mod lora;
mod out;
pub mod pt2;
pub mod quant;
pub mod remap;
pub mod script;
pub mod select;
mod storage;
mod tensor;
mod value;
pub mod write;

pub mod security;

pub use checkpoint::{
    open, open_as, open_bytes, open_bytes_as, open_pt2_unparsed, open_with, Checkpoint,
};
pub use dtype::{DType, ALL_DTYPES};
pub use error::{Error, Remedy, Result};
pub use format::{detect, detect_file, Format};
pub use limits::Limits;
pub use out::OutTensor;
pub use storage::Storage;
pub use tensor::{contiguous_strides, ByteOrder, Quant, TensorData, TensorInfo};
pub use value::{NumpyArray, Value};

pub use torchport_pickle as pickle;

/// The README's Rust examples, compiled as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
