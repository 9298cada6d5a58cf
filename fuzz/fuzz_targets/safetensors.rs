//! The safetensors reader: header length fitted to the input, format forced.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torchport_fuzz::run("safetensors", data);
});
