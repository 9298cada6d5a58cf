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

use serde::de::DeserializeOwned;
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
    match from_json::<ExportedProgram>(json) {
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

/// Parse JSON `bytes` into `T`, as `serde_json::from_slice` does. Text that is valid UTF-8 as
/// a whole (every record torch writes) is checked once and parsed as a `str`: `from_slice`
/// checks each string it keeps on its own (a program's keys and names are short strings), and
/// MobileNetV3-Large's program parsed in a quarter less time as a `str` (BENCHMARKS.md,
/// issue 14). Other text is parsed by `from_slice`, which accepts invalid UTF-8 inside the
/// strings it skips and names the place of any it keeps.
pub(crate) fn from_json<T: DeserializeOwned>(bytes: &[u8]) -> serde_json::Result<T> {
    match std::str::from_utf8(bytes) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(bytes),
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

    #[test]
    fn text_that_is_not_utf8_is_parsed_as_bytes() {
        // One node, with a metadata string (skipped) and a target (kept).
        let program = |meta: &[u8], target: &[u8]| {
            let mut v = br#"{"schema_version": {"major": 8, "minor": 3},
                "graph_module": {"graph": {"inputs": [], "outputs": [], "nodes": [
                {"target": ""#
                .to_vec();
            v.extend_from_slice(target);
            v.extend_from_slice(
                br#"", "inputs": [], "outputs": [], "metadata": {"stack_trace": ""#,
            );
            v.extend_from_slice(meta);
            v.extend_from_slice(
                br#""}}]}, "signature": {"input_specs": [], "output_specs": []}}}"#,
            );
            v
        };
        let ep = parse_program(&program(b"caf\\u00e9", b"aten.relu")).unwrap();
        assert_eq!(ep.graph_module.graph.nodes[0].target, "aten.relu");
        // Invalid UTF-8 where the parse skips it: read, as `serde_json::from_slice` reads it.
        let ep = parse_program(&program(b"caf\xe9", b"aten.relu")).unwrap();
        assert_eq!(ep.graph_module.graph.nodes[0].target, "aten.relu");
        let ep = parse_program(&program(b"caf\xff\xfe", b"aten.relu")).unwrap();
        assert_eq!(ep.graph_module.graph.nodes[0].target, "aten.relu");
        // Where it keeps it: refused, with the place named.
        let e = parse_program(&program(b"ok", b"aten.\xffrelu")).unwrap_err();
        assert!(matches!(e, ProgramError::Json(_)), "{e}");
        assert!(e.to_string().contains("line 3"), "{e}");
    }

    #[test]
    fn common_names_are_shared_and_others_kept() {
        use std::borrow::Cow;
        let node = |name: &str| {
            format!(
                r#"{{"target": "aten.relu.default", "outputs": [],
                "inputs": [{{"name": "{name}", "arg": {{"as_int": 1}}, "kind": 1}}]}}"#
            )
        };
        let weight: Node = serde_json::from_str(&node("weight")).unwrap();
        assert!(matches!(weight.inputs[0].name, Cow::Borrowed("weight")));
        // Escaped, the same name: shared too.
        let escaped: Node = serde_json::from_str(&node("w\\u0065ight")).unwrap();
        assert!(matches!(escaped.inputs[0].name, Cow::Borrowed("weight")));
        let other: Node = serde_json::from_str(&node("an_argument_of_tomorrow")).unwrap();
        assert!(matches!(other.inputs[0].name, Cow::Owned(_)));
        assert_eq!(other.inputs[0].name, "an_argument_of_tomorrow");
        let meta: TensorMeta = serde_json::from_str(
            r#"{"dtype": 7, "sizes": [], "strides": [], "storage_offset": {"as_int": 0},
            "layout": 7, "device": {"type": "cpu", "index": null}}"#,
        )
        .unwrap();
        assert!(matches!(meta.device.kind, Cow::Borrowed("cpu")));
    }
}
