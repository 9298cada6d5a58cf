//! The runtime's program JSON (schema 8.x graph IR): parsed, given zero weights, and built
//! into a `torchport_runtime::Program` with every check it gets before running.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torchport_fuzz::pt2_program(data);
});
