//! Resource limits for reading one file. Every limit has a documented default and can be
//! raised (or lowered) through the API; exceeding one is a clear error, never a crash.

/// Resource limits applied while reading a file.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Limits for each pickle the file contains (node count, memo, nesting, string sizes).
    pub pickle: torchport_pickle::Limits,
    /// Most nested containers followed when naming tensors. Default 512.
    pub max_depth: usize,
    /// Most pickle nodes visited when naming tensors, counting every visit through a shared
    /// reference (a memo bomb expands exponentially). Default 4 × the pickle's node count,
    /// but at least this value: 100,000.
    pub max_visits: usize,
    /// Most tensors in one file. Default 10,000,000.
    pub max_tensors: usize,
    /// Most dimensions of one tensor. Default 64.
    pub max_ndim: usize,
    /// Largest record decompressed from a deflated zip entry, in bytes. Default 16 GiB.
    pub max_decompressed: u64,
    /// Longest `__parameters__` / `__buffers__` declaration line read from a TorchScript
    /// archive's code, in bytes. Default 1 MiB (tens of thousands of names).
    pub max_code_line: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            pickle: torchport_pickle::Limits::default(),
            max_depth: 512,
            max_visits: 100_000,
            max_tensors: 10_000_000,
            max_ndim: 64,
            max_decompressed: 16 << 30,
            max_code_line: 1 << 20,
        }
    }
}
