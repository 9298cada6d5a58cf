//! Convolutions on small output planes rewritten to read their weight packed
//! ([`crate::ops::conv::small`]).

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;

use candle_core::{Tensor, TensorId};

use super::{dense_conv, input_tensor, readers_and_producers, run_conv_as};
use crate::ops::conv::small::{pack_weight, MAX_PIXELS, TARGET};
use crate::schema::{Argument, Graph, Node};

/// The weight (by name in `graph`) of `node` if it is a float32 2-d convolution (groups 1)
/// that [`pack_small_convs`] runs packed: the graph's metadata gives its input and output
/// static `[N, C, H, W]` sizes, its output plane has at most [`MAX_PIXELS`] pixels (any, with
/// `any_plane`), and nothing else reads the weight (`readers`, as
/// [`readers_and_producers`] counts them). Padding given as a string (`conv2d.padding`) is
/// left alone.
pub(crate) fn packed_weight<'g>(
    graph: &'g Graph,
    node: &'g Node,
    readers: &super::Counts,
    any_plane: bool,
) -> Option<&'g str> {
    let (w, _, out) = dense_conv(graph, node)?;
    let small = out[2].saturating_mul(out[3]) <= MAX_PIXELS;
    ((small || any_plane) && readers.get(w) == Some(&1)).then_some(w)
}

/// The weights (by name in `graph`) of the convolutions [`pack_small_convs`] will run
/// packed, so that the load can decode them packed.
pub fn small_conv_weights(graph: &Graph) -> HashSet<&str> {
    let (readers, _) = readers_and_producers(graph);
    graph
        .nodes
        .iter()
        .filter_map(|node| packed_weight(graph, node, &readers, false))
        .collect()
}

/// Store the weight of each float32 2-d convolution (groups 1) whose output plane has at
/// most [`MAX_PIXELS`] pixels packed for the microkernel, in a new buffer, and run the node
/// as [`TARGET`]: where the graph's metadata gives its input and output static `[N, C, H,
/// W]` sizes and nothing else reads the weight (padding given as a string,
/// `conv2d.padding`, is left alone), the weight is a 4-d float32 tensor of `weights`, and
/// this CPU has a microkernel. `decoded`: weights the load already decoded packed, by
/// tensor, with their `[co, ci, kh, kw]`: their convolutions are rewritten whatever their
/// plane, and a weight of them that some other node reads is an error. Run after the batch
/// norms are folded (the fold rescales the weight it packs). Returns how many.
pub fn pack_small_convs<S: BuildHasher, D: BuildHasher>(
    graph: &mut Graph,
    weights: &mut HashMap<String, Tensor, S>,
    decoded: &HashMap<TensorId, Vec<usize>, D>,
) -> Result<usize, String> {
    let (readers, _) = readers_and_producers(graph);
    // (node, its weight, the weight's [co, ci, kh, kw] where the load packed it).
    let convs: Vec<(usize, String, Option<Vec<usize>>)> = graph
        .nodes
        .iter()
        .enumerate()
        .filter_map(|(i, node)| {
            let packed_at_load =
                input_tensor(node, "weight").and_then(|w| decoded.get(&weights.get(w)?.id()));
            let w = packed_weight(graph, node, &readers, packed_at_load.is_some())?;
            Some((i, w.to_string(), packed_at_load.cloned()))
        })
        .collect();
    let mut changed = 0;
    for (i, w, packed_at_load) in convs {
        let shape = match packed_at_load {
            Some(shape) => shape,
            None => {
                let weight = weights.get(&w).filter(|t| t.rank() == 4);
                let Some((dims, packed)) =
                    weight.and_then(|t| Some((t.dims().to_vec(), pack_weight(t)?)))
                else {
                    continue;
                };
                weights.insert(w, packed);
                dims
            }
        };
        run_conv_as(&mut graph.nodes[i], TARGET, &shape);
        changed += 1;
    }
    // A weight decoded packed is read by its packed convolution alone.
    for node in &graph.nodes {
        for a in &node.inputs {
            let Argument::AsTensor(t) = &a.arg else {
                continue;
            };
            let packed = weights
                .get(&t.name)
                .is_some_and(|w| decoded.contains_key(&w.id()));
            if packed && (node.target != TARGET || a.name != "weight") {
                return Err(format!(
                    "the weight '{}' was decoded packed, but {} reads it as '{}'",
                    t.name, node.target, a.name
                ));
            }
        }
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use serde_json::json;

    /// Only the convolution on a 7 x 7 plane whose weight nothing else reads, with groups 1,
    /// is rewritten; one on 8 x 9 (72 pixels), one whose weight another node reads, a
    /// grouped one and one without static sizes are left as they are.
    #[test]
    fn only_small_dense_convolutions_with_their_own_weight_are_packed() {
        if crate::ops::packed::Packing::detect().is_none() {
            return;
        }
        use crate::prepare::test_graph::conv;
        let groups2 = json!({"name": "groups", "arg": {"as_int": 2}});
        let mut nodes = vec![
            conv("x", "w1", "y1", &[]),
            conv("x", "w2", "y2", &[]),
            conv("x", "w3", "y3", &[]),
            conv("x", "w4", "y4", &[groups2]),
            conv("x", "w5", "y5", &[]),
        ];
        nodes.push(json!({"target": "torch.ops.aten.add.Tensor", "inputs": [
            {"name": "self", "arg": {"as_tensor": {"name": "w3"}}},
            {"name": "other", "arg": {"as_tensor": {"name": "w3"}}}],
            "outputs": [{"as_tensor": {"name": "w3x2"}}]}));
        let tensors: [(&str, &[i64], Option<usize>); 6] = [
            ("x", &[1, 4, 9, 9], None),
            ("y1", &[1, 8, 7, 7], None),
            ("y2", &[1, 8, 8, 9], None),
            ("y3", &[1, 8, 7, 7], None),
            ("y4", &[1, 8, 7, 7], None),
            ("y5", &[1, 8, 7, 7], Some(2)),
        ];
        let mut graph = crate::prepare::test_graph::graph(nodes, "y1", &tensors);
        let dev = Device::Cpu;
        let mut weights: HashMap<String, Tensor> = ["w1", "w2", "w3", "w4", "w5"]
            .iter()
            .map(|n| {
                let w = Tensor::randn(0f32, 1., (8, 4, 3, 3), &dev).unwrap();
                (n.to_string(), w)
            })
            .collect();
        let packed = pack_small_convs(&mut graph, &mut weights, &HashMap::new());
        assert_eq!(packed, Ok(1));
        assert_eq!(graph.nodes[0].target, TARGET);
        assert!(graph.nodes[0]
            .inputs
            .iter()
            .any(|a| a.name == "weight_shape"
                && matches!(&a.arg, Argument::AsInts(s) if s == &[8, 4, 3, 3])));
        assert_eq!(weights["w1"].rank(), 1);
        for (i, w) in ["w2", "w3", "w4", "w5"].iter().enumerate() {
            assert_eq!(
                graph.nodes[i + 1].target,
                "torch.ops.aten.convolution.default"
            );
            assert_eq!(weights[*w].dims(), [8, 4, 3, 3]);
        }
    }

    /// A weight the load decoded packed runs packed whatever its plane; one that another
    /// node also reads is an error, not a 1-d tensor handed to a kernel expecting 4-d.
    #[test]
    fn weights_decoded_packed_are_read_packed_only() {
        if crate::ops::packed::Packing::detect().is_none() {
            return;
        }
        let graph = |extra: bool| -> Graph {
            let mut nodes = vec![
                json!({"target": "torch.ops.aten.conv2d.default", "inputs": [
                {"name": "input", "arg": {"as_tensor": {"name": "x"}}},
                {"name": "weight", "arg": {"as_tensor": {"name": "w"}}}],
                "outputs": [{"as_tensor": {"name": "y"}}]}),
            ];
            if extra {
                nodes.push(json!({"target": "torch.ops.aten.neg.default", "inputs": [
                    {"name": "self", "arg": {"as_tensor": {"name": "w"}}}],
                    "outputs": [{"as_tensor": {"name": "z"}}]}));
            }
            // A 16 x 16 output plane: packed only because the load decoded it so.
            let tensors: [(&str, &[i64], Option<usize>); 2] =
                [("x", &[1, 4, 16, 16], None), ("y", &[1, 8, 16, 16], None)];
            crate::prepare::test_graph::graph(nodes, "y", &tensors)
        };
        let w = Tensor::zeros(8 * 64, candle_core::DType::F32, &Device::Cpu).unwrap();
        let decoded: HashMap<_, _> = [(w.id(), vec![8, 4, 1, 1])].into();
        let mut weights: HashMap<String, Tensor> = [("w".to_string(), w)].into();
        let mut g = graph(false);
        assert_eq!(pack_small_convs(&mut g, &mut weights, &decoded), Ok(1));
        assert_eq!(g.nodes[0].target, TARGET);
        let shape = g.nodes[0].inputs.iter().find(|a| a.name == "weight_shape");
        assert!(matches!(&shape.unwrap().arg, Argument::AsInts(s) if s == &[8, 4, 1, 1]));
        let err = pack_small_convs(&mut graph(true), &mut weights, &decoded).unwrap_err();
        assert!(err.contains("'w' was decoded packed"), "{err}");
    }
}
