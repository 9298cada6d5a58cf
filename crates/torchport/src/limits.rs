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
    /// Most bytes of text copied out of a pickle into tensor names, value names and string
    /// values, counting a shared reference each time it is reached (a long string or key
    /// reached through many references, or deep nesting of long keys, would otherwise
    /// multiply memory). Default 4 × the pickle's size (16 bytes a node plus its strings),
    /// but at least this value: 1 MiB.
    pub max_copied_bytes: usize,
    /// Most tensors in one file. Default 10,000,000.
    pub max_tensors: usize,
    /// Most dimensions of one tensor. Default 64.
    pub max_ndim: usize,
    /// Most bytes decompressed from the deflated zip entries of one file, in total (torch
    /// writes stored entries, used in place; only re-zipped archives are deflated).
    /// Default 16 GiB.
    pub max_decompressed: u64,
    /// Longest `__parameters__` / `__buffers__` declaration line read from a TorchScript
    /// archive's code, in bytes. Default 1 MiB (tens of thousands of names).
    pub max_code_line: usize,
    /// Largest data [`Checkpoint::data`](crate::Checkpoint::data) produces for one tensor
    /// whose view is larger than its storage — possible only when elements overlap (stride
    /// 0 from `expand`, or overlapping strides), so a tiny file could otherwise describe a
    /// terabyte tensor. Views that do not overlap are never limited. Default 256 MiB.
    pub max_expanded_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            pickle: torchport_pickle::Limits::default(),
            max_depth: 512,
            max_visits: 100_000,
            max_copied_bytes: 1 << 20,
            max_tensors: 10_000_000,
            max_ndim: 64,
            max_decompressed: 16 << 30,
            max_code_line: 1 << 20,
            max_expanded_bytes: 256 << 20,
        }
    }
}
