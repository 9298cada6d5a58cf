//! The remap rule language: TOML parsed, then applied to an LSTM+Linear checkpoint.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torchport_fuzz::run("rules", data);
});
