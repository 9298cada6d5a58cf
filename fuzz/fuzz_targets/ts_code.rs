//! The TorchScript code parser: one code record (`code/__torch__/….py`) as raw input.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torchport_fuzz::ts_code(data);
});
