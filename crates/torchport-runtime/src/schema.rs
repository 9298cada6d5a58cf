//! The serialized `ExportedProgram`: the graph IR the runtime runs. It is owned by the core
//! ([`torchport::pt2`]) and re-exported here so that code naming `torchport_runtime::schema::*`
//! keeps compiling.

pub use torchport::pt2::program::*;
pub use torchport::pt2::{check_version, parse_program, ProgramError};
