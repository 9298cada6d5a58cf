//! The torch.save zip reader, reached through `open_bytes` with the format's leading bytes forced.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torchport_fuzz::run("torch_zip", data);
});
