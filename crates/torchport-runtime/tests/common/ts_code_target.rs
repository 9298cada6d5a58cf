//! What the `ts_code` fuzz target does with its input — shared by the fuzz crate
//! (`fuzz/src/lib.rs` includes this file) and `tests/torchscript.rs`: the input is one code
//! record of a TorchScript archive (`code/__torch__/….py`), parsed by the runtime's parser.
//! It must come back as a syntax tree or as one error whose line lies in the input, never a
//! panic, a stack overflow or an unbounded allocation.
#![allow(dead_code)]

use torchport_runtime::torchscript::parser;

/// Parse `code`; true when it parsed.
pub fn ts_code(code: &[u8]) -> bool {
    match parser::parse(code) {
        Ok(_) => true,
        Err(e) => {
            let lines = code.iter().filter(|&&b| b == b'\n').count() as u32 + 1;
            assert!(
                e.line >= 1 && e.line <= lines,
                "error line {} outside the input's {lines} lines: {}",
                e.line,
                e.what
            );
            assert!(!e.what.contains('\n'), "multi-line error: {}", e.what);
            false
        }
    }
}
