//! The .npz reader (a zip of .npy records), format forced.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torchport_fuzz::run("npz", data);
});
