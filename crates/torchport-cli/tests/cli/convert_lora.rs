//! `torchport convert BASE OUT --lora ADAPTER` through the real binary: transformers' tiny
//! Llama with a PEFT adapter (tests/fixtures/lora/llama) gives exactly the weights PEFT's
//! `merge_and_unload()` gave; a folder that is not an adapter is one error, exit 2.

use crate::util::{root, torchport};

#[test]
fn lora_merge_writes_what_peft_merged() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("merged.safetensors");
    let o = torchport(&[
        "convert",
        "tests/fixtures/lora/llama/base.bin",
        out.to_str().unwrap(),
        "--lora",
        "tests/fixtures/lora/llama/adapter",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let want = torchport::open(root().join("tests/fixtures/lora/llama/merged.bin")).unwrap();
    let got = torchport::open(&out).unwrap();
    assert_eq!(got.tensors().len(), want.tensors().len());
    for w in want.tensors() {
        let g = got.tensor(&w.name).unwrap();
        assert!(got.data(g).unwrap() == want.data(w).unwrap(), "{}", w.name);
    }
}

#[test]
fn not_an_adapter_is_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("merged.safetensors");
    let o = torchport(&[
        "convert",
        "tests/fixtures/lora/llama/base.bin",
        out.to_str().unwrap(),
        "--lora",
        "tests/fixtures/lora/llama",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("neither adapter_model.safetensors"), "{err}");
    assert!(!out.exists());
}
