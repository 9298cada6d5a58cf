//! A sharded index (*.index.json) written beside real shards, opened by path.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torchport_fuzz::run("sharded", data);
});
