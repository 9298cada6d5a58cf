//! The torch.export .pt2 reader (archive layout, the program JSON, weight configs), format forced.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torchport_fuzz::run("pt2", data);
});
