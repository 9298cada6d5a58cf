//! The TorchScript archive reader (data.pkl, constants.pkl, the code/ listing), format forced.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torchport_fuzz::run("torchscript", data);
});
