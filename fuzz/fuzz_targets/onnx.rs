//! The ONNX initializer reader (hand-written protobuf decoding), format forced.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torchport_fuzz::run("onnx", data);
});
