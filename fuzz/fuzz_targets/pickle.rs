//! The pickle machine alone (`torchport_pickle::parse` and `parse_prefix`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torchport_fuzz::run("pickle", data);
});
