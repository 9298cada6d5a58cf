//! Owns [`Limits`]: the resource bounds enforced while one pickle runs.

/// Resource limits for one parse. Each field documents its default.
///
/// Shared references never expand: a memo GET pushes the id of the node already in the
/// arena, so the arena grows at most linearly with the input and no limit on "expansion" is
/// needed at this layer. Walkers of the arena must still expect cycles and deep chains.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Most arena entries: nodes, plus ids copied out of an existing tuple or dict into a
    /// recorded call's args / kwargs (REDUCE, NEWOBJ, NEWOBJ_EX), which could otherwise
    /// multiply memory through the memo. Default 10_000_000.
    pub max_nodes: usize,
    /// Most memo entries. Default 1_000_000.
    pub max_memo: usize,
    /// Most stack items plus marks at any time. Default 100_000.
    pub max_stack_depth: usize,
    /// Most MARKs open at once, which bounds the nesting of MARK-built containers.
    /// Default 1_000.
    pub max_nesting: usize,
    /// Longest single str / bytes / bytearray / long payload, in bytes. Default 256 MiB.
    pub max_string_len: usize,
    /// Most str / bytes / bytearray / long payload bytes in one pickle. Default 1 GiB.
    pub max_total_bytes: usize,
    /// Refuse globals that could only mean code execution or system access (see
    /// [`is_dangerous_global`](crate::is_dangerous_global)). Default true.
    pub refuse_dangerous: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_nodes: 10_000_000,
            max_memo: 1_000_000,
            max_stack_depth: 100_000,
            max_nesting: 1_000,
            max_string_len: 256 << 20,
            max_total_bytes: 1 << 30,
            refuse_dangerous: true,
        }
    }
}
