//! PyTorch's own formats, which all hold pickles interpreted the same way: the `torch.save`
//! zip archive (`zip.rs`), the legacy stream (`legacy.rs`), the tar archive (`tar.rs`), the
//! TorchScript archive (`torchscript.rs`, and torch 1.0 to 1.2's `torchscript_legacy.rs`), `torch.save` files nested in a pickle's bytes
//! (`nested.rs`), and the interpretation of their pickles (`interpret/`). These files may call
//! each other: a nested file is read by the same readers as the file around it.

pub(crate) mod interpret;
pub(crate) mod legacy;
pub(crate) mod nested;
pub(crate) mod tar;
pub(crate) mod torchscript;
pub(crate) mod torchscript_legacy;
pub(crate) mod zip;
