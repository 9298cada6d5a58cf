//! Convolutions that run by Winograd's algorithm get their weight transformed once, at load
//! ([`crate::ops::conv::WINOGRAD_TARGET`]), instead of on every call.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;

use candle_core::Tensor;

use super::{dense_conv, readers_and_producers, run_conv_as};
use crate::ops::conv::{out_len, pair, runs_by_winograd, winograd_weight, WINOGRAD_TARGET};
use crate::schema::{Argument, Graph, Node};

/// Store the weight of each convolution the runtime runs by Winograd's algorithm
/// (`ops::conv::runs_by_winograd`: 3x3, stride and dilation 1, at least 14 x 14 output
/// pixels, not the direct kernel for few columns) transformed, in a new buffer, and run the
/// node as
/// [`WINOGRAD_TARGET`]: where it is a float32 2-d convolution with groups 1, the graph's
/// metadata gives its input and output static `[N, C, H, W]` sizes, its padding is given as
/// integers, nothing else reads the weight, and the weight is a `[co, ci, 3, 3]` float32
/// tensor of `weights`. Run after the batch norms are folded (the fold rescales the weight).
/// Returns how many.
///
/// The transform holds 16 values for each 9 of the weight: by their sizes, ResNet-18's
/// transformed 3x3 weights take 16.8 MB where they took 9.4.
pub fn transform_winograd_convs<S: BuildHasher>(
    graph: &mut Graph,
    weights: &mut HashMap<String, Tensor, S>,
) -> usize {
    let (readers, _) = readers_and_producers(graph);
    let convs: Vec<(usize, String, [usize; 4])> = graph
        .nodes
        .iter()
        .enumerate()
        .filter_map(|(i, node)| {
            let (w, shape) = winograd_weight_name(graph, node, &readers)?;
            Some((i, w.to_string(), shape))
        })
        .collect();
    let mut changed = 0;
    for (i, w, shape) in convs {
        let weight = weights.get(&w).filter(|t| t.dims() == shape);
        let Some(u) = weight.and_then(winograd_weight) else {
            continue;
        };
        weights.insert(w, u);
        run_conv_as(&mut graph.nodes[i], WINOGRAD_TARGET, &shape);
        changed += 1;
    }
    changed
}

/// The weights (by name in `graph`) of the convolutions [`transform_winograd_convs`] will
/// transform (if they have the sizes the metadata implies), so that the load can decode them
/// on their own.
pub fn winograd_conv_weights(graph: &Graph) -> HashSet<&str> {
    let (readers, _) = readers_and_producers(graph);
    graph
        .nodes
        .iter()
        .filter_map(|node| Some(winograd_weight_name(graph, node, &readers)?.0))
        .collect()
}

/// The weight (by name) of `node` if [`transform_winograd_convs`] transforms it, with the
/// `[co, ci, 3, 3]` sizes the graph's metadata implies for it (the weight's own must match).
fn winograd_weight_name<'g>(
    graph: &'g Graph,
    node: &'g Node,
    readers: &super::Counts,
) -> Option<(&'g str, [usize; 4])> {
    let (w, input, output) = dense_conv(graph, node)?;
    let weight = [output[1], input[1], 3, 3];
    let stride = ints(node, "stride", 1)?;
    let padding = ints(node, "padding", 0)?;
    let dilation = ints(node, "dilation", 1)?;
    // The output the metadata gives is a 3x3 kernel's (else the weight is of another size).
    let out = |d: usize| out_len(input[2 + d], 3, padding[d], stride[d], dilation[d]).ok();
    if [out(0)?, out(1)?] != [output[2], output[3]] {
        return None;
    }
    let applies = runs_by_winograd(input, weight, stride, padding, dilation);
    (applies && readers.get(w) == Some(&1)).then_some((w, weight))
}

/// A per-dim pair of integers of `node`, read as the kernels read it (`ops::conv::pair`: one
/// value for both dims), or `default` for both where the serializer left it out; `None` for
/// anything else (negative values, a string padding).
fn ints(node: &Node, name: &str, default: i64) -> Option<[usize; 2]> {
    let v = match super::input_arg(node, name) {
        None => vec![default],
        Some(Argument::AsInts(v)) => v.clone(),
        // An `int[]` written as a single int, as the kernels' `Args::ints` also takes it.
        Some(Argument::AsInt(i)) => vec![*i],
        Some(_) => return None,
    };
    pair(&v, name, false).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use serde_json::json;

    /// Only the 3x3 convolutions at stride 1 on a 16 x 16 plane whose weight nothing else
    /// reads are rewritten (one with its stride written as a list, one as a single int), their
    /// weights replaced by the transform; a strided one (a list, and a single int), one on
    /// 12 x 12 (144 pixels), one whose weight another node reads, a 1x1 one, a grouped one and
    /// one without static sizes are left as they are.
    #[test]
    fn only_convolutions_run_by_winograd_get_their_weight_transformed() {
        let conv = |x: &str, w: &str, y: &str, extra: &[serde_json::Value]| {
            let pad1 = json!({"name": "padding", "arg": {"as_ints": [1, 1]}});
            let args: Vec<_> = [pad1].into_iter().chain(extra.iter().cloned()).collect();
            crate::prepare::test_graph::conv(x, w, y, &args)
        };
        let stride2 = json!({"name": "stride", "arg": {"as_ints": [2, 2]}});
        let groups2 = json!({"name": "groups", "arg": {"as_int": 2}});
        let stride1_int = json!({"name": "stride", "arg": {"as_int": 1}});
        let stride2_int = json!({"name": "stride", "arg": {"as_int": 2}});
        let mut nodes = vec![
            conv("x", "w1", "y1", &[]),
            conv("x", "w2", "y2", &[stride2]),
            conv("x12", "w3", "y3", &[]),
            conv("x", "w4", "y4", &[]),
            conv("x", "w5", "y5", &[]),
            conv("x", "w6", "y6", &[groups2]),
            conv("x", "w7", "y7", &[]),
            conv("x", "w8", "y8", &[stride1_int]),
            conv("x", "w9", "y9", &[stride2_int]),
        ];
        nodes.push(json!({"target": "torch.ops.aten.neg.default", "inputs": [
            {"name": "self", "arg": {"as_tensor": {"name": "w4"}}}],
            "outputs": [{"as_tensor": {"name": "w4n"}}]}));
        let tensors: [(&str, &[i64], Option<usize>); 11] = [
            ("x", &[1, 16, 16, 16], None),
            ("x12", &[1, 16, 12, 12], None),
            ("y1", &[1, 8, 16, 16], None),
            ("y2", &[1, 8, 8, 8], None),
            ("y3", &[1, 8, 12, 12], None),
            ("y4", &[1, 8, 16, 16], None),
            ("y5", &[1, 8, 18, 18], None),
            ("y6", &[1, 8, 16, 16], None),
            ("y7", &[1, 8, 16, 16], Some(2)),
            ("y8", &[1, 8, 16, 16], None),
            ("y9", &[1, 8, 8, 8], None),
        ];
        let mut graph = crate::prepare::test_graph::graph(nodes, "y1", &tensors);
        let dev = Device::Cpu;
        let names = ["w1", "w2", "w3", "w4", "w5", "w6", "w7", "w8", "w9"];
        let mut weights: HashMap<String, Tensor> = names
            .iter()
            .map(|n| {
                let (ci, k) = match *n {
                    "w5" => (16, 1),
                    "w6" => (8, 3),
                    _ => (16, 3),
                };
                let w = Tensor::randn(0f32, 1., (8, ci, k, k), &dev).unwrap();
                (n.to_string(), w)
            })
            .collect();
        let (w1, w8) = (weights["w1"].clone(), weights["w8"].clone());
        assert_eq!(winograd_conv_weights(&graph), ["w1", "w8"].into());
        assert_eq!(transform_winograd_convs(&mut graph, &mut weights), 2);
        for (i, w, original) in [(0, "w1", &w1), (7, "w8", &w8)] {
            assert_eq!(graph.nodes[i].target, WINOGRAD_TARGET, "{w}");
            assert!(graph.nodes[i]
                .inputs
                .iter()
                .any(|a| a.name == "weight_shape"
                    && matches!(&a.arg, Argument::AsInts(s) if s == &[8, 16, 3, 3])));
            let want = winograd_weight(original).unwrap();
            let diff = crate::ops::max_abs_diff(&weights[w], &want);
            assert_eq!((weights[w].dims(), diff), (&[16 * 8 * 16][..], 0.0), "{w}");
        }
        let left = ["w2", "w3", "w4", "w5", "w6", "w7", "w9"];
        for (i, w) in [1, 2, 3, 4, 5, 6, 8].into_iter().zip(left) {
            assert_eq!(graph.nodes[i].target, "torch.ops.aten.convolution.default");
            assert_eq!(weights[w].rank(), 4, "{w}");
        }
    }
}
