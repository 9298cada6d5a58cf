//! The `torchport` command's integration tests, in one test binary (one link, one place for
//! the shared helpers in `util.rs`); one module per command or concern.

mod util;

mod convert_diff;
mod convert_lora;
mod convert_numpy;
mod convert_quantized;
mod convert_remap;
mod faults;
mod inspect;
mod inspect_archives;
mod inspect_formats;
mod match_cmd;
mod run;
mod run_torchscript;
mod security;
