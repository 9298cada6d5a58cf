//! The program of a `torch.export.save` archive (`.pt2`), as one typed IR: [`ExportedProgram`]
//! and its graph, nodes, arguments, signature and tensor metadata ([`program`]), and torch's
//! `ScalarType` numbers ([`scalar_type`]). The core reads archives into it; runtimes consume
//! it and never parse the JSON themselves.
//!
//! ```
//! let json = br#"{"schema_version": {"major": 8, "minor": 3},
//!   "graph_module": {"graph": {"inputs": [], "outputs": [], "nodes": []},
//!                    "signature": {"input_specs": [], "output_specs": []}}}"#;
//! let ep = torchport::pt2::parse_program(json)?;
//! assert!(ep.graph_module.graph.nodes.is_empty());
//! # Ok::<(), torchport::pt2::ProgramError>(())
//! ```

pub mod program;
pub mod scalar_type;

pub use program::*;
pub use scalar_type::ScalarType;

use serde::Deserialize;

/// Why a program record could not be read as an [`ExportedProgram`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProgramError {
    /// The record is not JSON, or does not follow the schema (the message names the field).
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    /// The record has no `schema_version`.
    #[error("the program has no schema_version")]
    NoVersion,
    /// The record was written with a schema major version other than [`SUPPORTED_MAJOR`].
    #[error("schema version {major}.{minor} is not supported (this runtime reads {SUPPORTED_MAJOR}.x, written by torch 2.5 to 2.15)")]
    UnsupportedVersion {
        /// The record's major version.
        major: i64,
        /// The record's minor version.
        minor: i64,
    },
}

/// Parse `models/<name>.json` (or a v0 archive's `serialized_exported_program.json`),
/// refusing a program from an unknown schema major version by name rather than with a field
/// error. The record is parsed once when it reads (a program is up to megabytes of JSON, read
/// on every load); only when it does not is it read again for its version alone, so that the
/// error says which of the two is wrong.
pub fn parse_program(json: &[u8]) -> Result<ExportedProgram, ProgramError> {
    #[derive(Deserialize)]
    struct VersionOnly {
        schema_version: Option<SchemaVersion>,
    }
    match serde_json::from_slice::<ExportedProgram>(json) {
        Ok(ep) => {
            check_version(ep.schema_version)?;
            Ok(ep)
        }
        Err(e) => {
            let v: VersionOnly = serde_json::from_slice(json)?;
            check_version(v.schema_version.ok_or(ProgramError::NoVersion)?)?;
            Err(e.into())
        }
    }
}

/// Refuse a schema major version other than [`SUPPORTED_MAJOR`].
pub fn check_version(v: SchemaVersion) -> Result<(), ProgramError> {
    if v.major != SUPPORTED_MAJOR {
        return Err(ProgramError::UnsupportedVersion {
            major: v.major,
            minor: v.minor,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_test_per_error() {
        let e = parse_program(b"{").unwrap_err();
        assert!(matches!(e, ProgramError::Json(_)), "{e}");
        let e = parse_program(b"{}").unwrap_err();
        assert!(matches!(e, ProgramError::NoVersion), "{e}");
        let e = parse_program(br#"{"schema_version": {"major": 99, "minor": 1}}"#).unwrap_err();
        assert!(
            matches!(
                e,
                ProgramError::UnsupportedVersion {
                    major: 99,
                    minor: 1
                }
            ),
            "{e}"
        );
        assert!(e
            .to_string()
            .starts_with("schema version 99.1 is not supported"));
        // A program that reads in full is still refused for its version.
        let whole = |major: i64| {
            format!(
                r#"{{"schema_version": {{"major": {major}, "minor": 3}},
                "graph_module": {{"graph": {{"inputs": [], "outputs": [], "nodes": []}},
                "signature": {{"input_specs": [], "output_specs": []}}}}}}"#
            )
        };
        assert!(parse_program(whole(SUPPORTED_MAJOR).as_bytes()).is_ok());
        let e = parse_program(whole(99).as_bytes()).unwrap_err();
        assert!(
            matches!(
                e,
                ProgramError::UnsupportedVersion {
                    major: 99,
                    minor: 3
                }
            ),
            "{e}"
        );
    }
}
