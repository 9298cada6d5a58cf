//! The .npy reader: magic forced at byte 0.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torchport_fuzz::run("npy", data);
});
