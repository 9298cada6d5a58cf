//! Every format, reached through content detection exactly as `torchport::open` does.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torchport_fuzz::run("open_bytes", data);
});
