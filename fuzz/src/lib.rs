//! The fuzz targets' shared code. What each target does with its input lives in
//! `crates/torchport/tests/common/targets.rs`, included here unchanged, so that the
//! regression test (`crates/torchport/tests/regressions.rs`) runs a committed crashing input
//! through exactly the code path its target found it on.
//!
//! A target is one file in `fuzz_targets/` calling [`run`] with its own name, plus a
//! `[[bin]]` entry in `Cargo.toml`. A target name without an entry in `run` reaches its
//! format through content detection (`open_bytes`); add an entry to force the format's
//! leading bytes.

#[path = "../../crates/torchport/tests/common/targets.rs"]
mod targets;

/// The runtime's target (`pt2_program`), shared with `crates/torchport-runtime/tests/regressions.rs`.
#[path = "../../crates/torchport-runtime/tests/common/program_target.rs"]
mod program_target;

pub use program_target::pt2_program;

/// The TorchScript code parser's target (`ts_code`), shared with
/// `crates/torchport-runtime/tests/torchscript.rs`.
#[path = "../../crates/torchport-runtime/tests/common/ts_code_target.rs"]
mod ts_code_target;

pub use ts_code_target::ts_code;
pub use targets::*;
