//! Storages pickled as whole `torch.save` files nested in the pickle
//! (`torch.storage._load_from_bytes`, as plain `pickle.dumps` writes a tensor): each bytes
//! object is read once, by the container readers in `format/torch/nested.rs`, with the nodes of
//! its pickles counted against the outer pickle's `max_nodes`, and the storage it holds is
//! added to the resolver's storages for the outer tensor to view.

use std::collections::HashMap;

use super::*;
use crate::format::torch::nested as file;

/// What the walk has read of nested `torch.save` files.
#[derive(Default)]
pub(super) struct Nested {
    /// The storage index and dtype read from each bytes node (a shared one is read once).
    read: HashMap<NodeId, (usize, DType)>,
    /// Pickle nodes of the nested files read so far.
    nodes: usize,
}

impl<'a> Walker<'a> {
    /// The storage a `torch.storage._load_from_bytes(b)` call stands for: its index among
    /// the resolver's storages, and its dtype.
    pub(super) fn nested_storage(&mut self, obj: &Object, name: &str) -> Result<(usize, DType)> {
        let path = self.path;
        let bad = |what: String| {
            Error::tensor(
                path,
                name,
                format!(
                    "its storage is a torch.save file nested in the pickle \
                     (torch.storage._load_from_bytes) that cannot be read: {what}"
                ),
            )
        };
        let node = file::bytes_node(self.p, obj).map_err(bad)?;
        if let Some(&read) = self.nested.read.get(&node) {
            return Ok(read);
        }
        let bytes = file::decode(self.p, node).map_err(bad)?;
        // The nested pickles are part of this one: they get the nodes its limit leaves.
        let mut limits = self.limits.clone();
        let used = self.p.len().saturating_add(self.nested.nodes);
        limits.pickle.max_nodes = limits.pickle.max_nodes.saturating_sub(used);
        let (storage, dtype, nodes) =
            file::read_storage(path, bytes, &limits).map_err(|e| bad(e.detail()))?;
        self.nested.nodes = self.nested.nodes.saturating_add(nodes);
        let index = self.r.add_storage(storage);
        self.nested.read.insert(node, (index, dtype));
        Ok((index, dtype))
    }
}
