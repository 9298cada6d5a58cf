//! The CI subset of the real-model zoo: models built by transformers, torchvision and timm
//! themselves (small configurations, random weights; tests/fixtures/gen/gen_zoo.py), each
//! exported plain and after run_decompositions(), run here on the inputs PyTorch used and
//! compared with PyTorch's own outputs: floats within 1e-4 * max(1, max |ref|), integers and
//! bools exactly. The full zoo (larger models, not committed) is benches/zoo.py.

use std::path::PathBuf;

use torchport_runtime::Program;

#[path = "common/compare.rs"]
mod compare;
use compare::{numbered, output_mismatches};

/// Every model gen_zoo.py writes; the test fails if one is missing.
const MODELS: [&str; 21] = [
    "hf_bert_mask",
    "hf_llama_mask",
    "hf_t5_encoder_mask",
    "tv_mobilenet_v3_small",
    "timm_resnet18d",
    "timm_convnext",
    "timm_vit",
    // Its plain export fills slices of a zero tensor in place (the shifted-window mask).
    "tv_swin",
    // Exported with dynamic batch and sequence (2 x 12), run at 3 x 9.
    "hf_bert_dyn",
    // Linear attention in an `autocast(enabled=False)` block (`wrap_with_autocast`, plain).
    "timm_efficientvit",
    // Relative-position buckets computed on int64 tensors (sign, abs, log).
    "hf_deberta_v2",
    // A weight-normed positional convolution (`_weight_norm`, plain).
    "hf_wav2vec2",
    // Attention on rank-5 query, key and value (mask units).
    "timm_hiera",
    // Mixture of experts: routing by histc, experts through transformers' grouped product.
    "hf_mixtral",
    // Padded query rows that attend to nothing (zeros, not NaN).
    "hf_modernbert",
    // Conv1D layers: `addmm(bias, x, weight)` with the weight stored `[in, out]`.
    "hf_gpt2",
    // Weight-standardized convolutions: a batch norm over each weight, every call.
    "timm_nf_resnet",
    // Video: 3-d patch embedding with depth padding and stride, depthwise 3-d pooling.
    "tv_mvit_tiny",
    // Video: 3-d convolutions with batch norms, relus and a residual add folded in at load.
    "tv_video_resnet_stem",
    // Gated relative position bias broadcast over the heads (`broadcast_to`, plain).
    "hf_wavlm",
    // Patch positions one-hot encoded (`one_hot`, plain).
    "timm_gemma4_vit",
];

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/zoo")
}

#[test]
fn zoo_models_match_pytorch() {
    let mut ran = 0;
    let mut failures = Vec::new();
    for model in MODELS {
        let inputs = numbered(&fixtures(), model, "input");
        let want = numbered(&fixtures(), model, "output");
        assert!(
            !inputs.is_empty() && !want.is_empty(),
            "{model}: fixtures missing"
        );
        for flavour in ["plain", "decomp"] {
            let name = format!("{model}.{flavour}");
            eprintln!("{name}");
            let result =
                Program::load(fixtures().join(format!("{name}.pt2"))).and_then(|p| p.run(&inputs));
            let got = match result {
                Ok(got) => got,
                Err(e) => {
                    failures.push(format!("{name}: {e}"));
                    continue;
                }
            };
            ran += 1;
            failures.extend(output_mismatches(&name, &got, &want, |_| 1e-4));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    assert_eq!(ran, 2 * MODELS.len(), "programs run");
}

/// The programs above reach what they are there for: torchvision Swin's plain export updates
/// views of a tensor read later (which the runtime writes back into it), the dynamic BERT's
/// decomposed export computes sizes with SymInt arithmetic, DeBERTa takes the sign of
/// integer tensors, wav2vec2 calls `_weight_norm`, EfficientViT wraps ops in autocast, and
/// Mixtral routes tokens with histc to transformers' grouped product.
/// The residual adds of ResNet-18d's basic blocks (then relu) and of MobileNetV3's inverted
/// residuals (no activation after) are folded into the convolution before them at load, in
/// both flavours; `zoo_models_match_pytorch` checks the outputs of these same programs.
#[test]
fn residual_adds_are_folded_into_their_convolutions() {
    use torchport_runtime::ops::conv::FUSED_RESIDUAL_ARG;
    use torchport_runtime::schema::{Argument, Graph};
    // Adds of two tensors (the decomposed hardswish's `x + 3` is not one).
    let adds = |g: &Graph| {
        let add = |t: &str| t.ends_with("aten.add.Tensor") || t.ends_with("aten.add_.Tensor");
        let of_tensor = |n: &&torchport_runtime::schema::Node| {
            n.inputs
                .iter()
                .any(|a| a.name == "other" && matches!(a.arg, Argument::AsTensor(_)))
        };
        g.nodes
            .iter()
            .filter(|n| add(&n.target))
            .filter(of_tensor)
            .count()
    };
    // (model, its residual adds: ResNet-18's 8 blocks; MobileNetV3-Small's 7 blocks with
    // a skip connection)
    for (model, blocks) in [("timm_resnet18d", 8), ("tv_mobilenet_v3_small", 7)] {
        for flavour in ["plain", "decomp"] {
            let path = fixtures().join(format!("{model}.{flavour}.pt2"));
            let raw = torchport_runtime::archive::read_program(&path).unwrap();
            assert_eq!(adds(&raw.graph_module.graph), blocks, "{model} {flavour}");
            let program = Program::load(&path).unwrap();
            let g = &program.exported_program().graph_module.graph;
            let fused = g
                .nodes
                .iter()
                .filter(|n| n.inputs.iter().any(|a| a.name == FUSED_RESIDUAL_ARG))
                .count();
            assert_eq!((adds(g), fused), (0, blocks), "{model} {flavour}");
        }
    }
}

/// timm's ResNet-18d exported decomposed writes its max pool as `max_pool2d_with_indices`,
/// whose indices nothing reads; after the load it runs as the pool without indices (the
/// vectorised kernel). `zoo_models_match_pytorch` checks this program's outputs.
#[test]
fn unread_pool_indices_are_dropped_at_load() {
    let count = |ops: &[torchport_runtime::OpUse], op: &str| {
        ops.iter().find(|o| o.op == op).map_or(0, |o| o.count)
    };
    let with = "aten.max_pool2d_with_indices.default";
    let without = "aten.max_pool2d.default";
    let path = fixtures().join("timm_resnet18d.decomp.pt2");
    let exported = Program::ops_of(&path).unwrap();
    let pools = count(&exported, with);
    assert!(pools > 0, "no max_pool2d_with_indices as exported");
    let ops = Program::load(&path).unwrap().ops();
    assert_eq!(count(&ops, with), 0, "pools with indices left");
    assert_eq!(count(&ops, without), pools, "pools without indices");
}

/// Chains of elementwise ops fused into one pass compute exactly what the ops compute one by
/// one: every zoo program, with and without `prepare::fuse_pointwise_chains` (through a
/// registry of this crate's kernels, so that no other fusion applies to either), gives the
/// same bits on PyTorch's inputs. Llama's RMSNorm (`x * rsqrt(...)`, the float32 cast,
/// `* weight`) and `silu(gate) * up` are among the chains fused, in both flavours.
#[test]
fn pointwise_chains_compute_what_their_ops_compute() {
    use torchport_runtime::ops::Registry;
    let registry = Registry::with_all_ops();
    let mut fused_models = Vec::new();
    for model in MODELS {
        let inputs = numbered(&fixtures(), model, "input");
        for flavour in ["plain", "decomp"] {
            let path = fixtures().join(format!("{model}.{flavour}.pt2"));
            let (ep, payloads) = torchport_runtime::archive::read(&path).unwrap();
            let mut fused = ep.clone();
            if torchport_runtime::prepare::fuse_pointwise_chains(&mut fused.graph_module.graph) == 0
            {
                continue;
            }
            fused_models.push(format!("{model}.{flavour}"));
            let run = |ep| {
                Program::from_parts_with_registry(ep, payloads.clone(), &registry)
                    .unwrap()
                    .run(&inputs)
                    .unwrap()
            };
            let (got, want) = (run(fused), run(ep));
            assert_eq!(got.len(), want.len());
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                let bits = |t: &candle_core::Tensor| -> Vec<u32> {
                    let t = t.flatten_all().unwrap().to_dtype(candle_core::DType::F32);
                    let v = t.unwrap().to_vec1::<f32>().unwrap();
                    v.iter().map(|x| x.to_bits()).collect()
                };
                assert!(bits(a) == bits(b), "{model}.{flavour} output {i}");
            }
        }
    }
    for want in ["hf_llama_mask.plain", "hf_llama_mask.decomp"] {
        assert!(fused_models.iter().any(|m| m == want), "{fused_models:?}");
    }
    eprintln!(
        "fused chains in {} programs: {fused_models:?}",
        fused_models.len()
    );
}

#[test]
fn zoo_fixtures_exercise_what_they_are_there_for() {
    let ops = |name: &str| -> Vec<String> {
        Program::ops_of(fixtures().join(name))
            .unwrap()
            .into_iter()
            .map(|u| u.op)
            .collect()
    };
    assert!(ops("tv_swin.plain.pt2").contains(&"aten.fill_.Scalar".to_string()));
    assert!(ops("hf_bert_dyn.decomp.pt2").contains(&"_operator.mul".to_string()));
    assert!(ops("hf_deberta_v2.plain.pt2").contains(&"aten.sign.default".to_string()));
    assert!(ops("hf_wav2vec2.plain.pt2").contains(&"aten._weight_norm.default".to_string()));
    assert!(ops("hf_wavlm.plain.pt2").contains(&"aten.broadcast_to.default".to_string()));
    assert!(ops("timm_gemma4_vit.plain.pt2").contains(&"aten.one_hot.default".to_string()));
    let moe = ops("hf_mixtral.plain.pt2");
    for op in [
        "transformers.grouped_mm_fallback.default",
        "aten.histc.default",
    ] {
        assert!(moe.contains(&op.to_string()), "{op}: {moe:?}");
    }
    // The wrapper is inlined: its subgraph's ops are listed, the wrapper is not.
    let raw =
        torchport_runtime::archive::read_program(&fixtures().join("timm_efficientvit.plain.pt2"))
            .unwrap();
    let wrappers = raw
        .graph_module
        .graph
        .nodes
        .iter()
        .filter(|n| n.target.ends_with("higher_order.wrap_with_autocast"))
        .count();
    assert!(wrappers > 0);
    assert!(!ops("timm_efficientvit.plain.pt2")
        .iter()
        .any(|o| o.contains("wrap_with_autocast")));
}

/// What a program computes from its weights alone is computed at load: timm's NF-ResNet
/// standardizes each convolution's weight with a batch norm over the weight (and scales it
/// by a gain), both flavours; torchvision's Swin gathers its relative position biases from a
/// table with a constant index (and its plain export builds the shifted-window mask from
/// zeros); DeBERTa-v2 projects its relative-position embeddings by Linears. After the load no
/// such node is left, and the standardized weights are weights like any other: the
/// NF-ResNet's convolutions then run packed or by Winograd.
/// `zoo_models_match_pytorch` checks the outputs of these same programs.
#[test]
fn nodes_computed_from_weights_alone_are_computed_at_load() {
    let count = |ops: &[torchport_runtime::OpUse], op: &str| {
        ops.iter()
            .filter(|o| o.op.contains(op))
            .map(|o| o.count)
            .sum::<usize>()
    };
    for flavour in ["plain", "decomp"] {
        let path = fixtures().join(format!("timm_nf_resnet.{flavour}.pt2"));
        let exported = Program::ops_of(&path).unwrap();
        assert!(
            count(&exported, "batch_norm") >= 10,
            "{flavour}: {exported:?}"
        );
        let ops = Program::load(&path).unwrap().ops();
        assert_eq!(count(&ops, "batch_norm"), 0, "{flavour}: {ops:?}");
        if torchport_runtime::ops::packed::Packing::detect().is_some() {
            let packed = count(&ops, "torchport.conv2d_");
            assert!(packed >= 10, "{flavour}: {ops:?}");
        }
    }
    for flavour in ["plain", "decomp"] {
        let path = fixtures().join(format!("tv_swin.{flavour}.pt2"));
        let exported = Program::ops_of(&path).unwrap();
        let ops = Program::load(&path).unwrap().ops();
        for op in ["aten.index.Tensor", "aten.zeros", "aten.fill_"] {
            let left = count(&ops, op);
            assert!(
                left == 0,
                "{flavour}: {op} left {left} of {}",
                count(&exported, op)
            );
        }
        assert!(
            count(&exported, "aten.index.Tensor") >= 3,
            "{flavour}: {exported:?}"
        );
    }
    // DeBERTa-v2 projects its relative-position embeddings (a weight, layer-normed) with
    // Linears of their own: those four are computed at load, which needs their weights left
    // unpacked; the other twelve run packed.
    if torchport_runtime::ops::packed::Packing::detect().is_some() {
        for flavour in ["plain", "decomp"] {
            let path = fixtures().join(format!("hf_deberta_v2.{flavour}.pt2"));
            let ops = Program::load(&path).unwrap().ops();
            let packed = count(&ops, "torchport.linear_packed");
            let others = count(&ops, "aten.linear") + count(&ops, "aten.addmm");
            assert_eq!((packed, others), (12, 0), "{flavour}: {ops:?}");
        }
    }
}

/// Where the CPU has the gemm's microkernels, the Linears of a plain export, the same after
/// `run_decompositions()` (`addmm(b, x, permute(w))`, `mm(x, permute(w))`) and GPT-2's
/// `Conv1D` (`addmm(b, x, w)`, `w` stored `[in, out]`) run with their weights packed at load
/// (so `zoo_models_match_pytorch` checks that path against torch's outputs), except the
/// Linears of a single row (ViT's head on its one class token at batch 1), which read their
/// weights as stored: only those are left as `aten.linear`, and no `aten.addmm`.
#[test]
fn linears_run_with_packed_weights() {
    if torchport_runtime::ops::packed::Packing::detect().is_none() {
        return;
    }
    for (model, single_rows) in [
        ("hf_bert_mask", 0),
        ("hf_llama_mask", 0),
        ("timm_vit", 1),
        ("hf_gpt2", 0),
    ] {
        for flavour in ["plain", "decomp"] {
            let name = format!("{model}.{flavour}.pt2");
            let p = torchport_runtime::Program::load(fixtures().join(&name)).unwrap();
            let ops = p.ops();
            let count = |op: &str| ops.iter().find(|o| o.op == op).map_or(0, |o| o.count);
            let all: Vec<_> = ops.iter().map(|o| (&o.op, o.count)).collect();
            assert!(
                count("torchport.linear_packed.default") >= 4,
                "{name}: {all:?}"
            );
            assert_eq!(count("aten.linear.default"), single_rows, "{name}: {all:?}");
            assert_eq!(count("aten.addmm.default"), 0, "{name}: {all:?}");
        }
    }
}

/// The elementwise work right after the packed Linears of transformers' own exports is done
/// by the Linears (`prepare::fuse_linear_epilogues`; so `zoo_models_match_pytorch` checks
/// that path against torch's outputs): no gelu is left in BERT's and ViT's MLPs, the
/// inference dropouts are dropped, BERT's residual adds after its attention and MLP outputs
/// go (its other adds are the embeddings' and the mask's), Llama's `silu(gate) * up` chains
/// are done by Linears, and so are GPT-2's residual adds, through the view after each
/// `Conv1D` product.
#[test]
fn linear_epilogues_fold_the_elementwise_work_after_linears() {
    if torchport_runtime::ops::packed::Packing::detect().is_none() {
        return;
    }
    for model in ["hf_bert_mask", "timm_vit", "hf_llama_mask", "hf_gpt2"] {
        let name = format!("{model}.plain.pt2");
        let exported = torchport_runtime::Program::ops_of(fixtures().join(&name)).unwrap();
        let p = torchport_runtime::Program::load(fixtures().join(&name)).unwrap();
        let ops = p.ops();
        let count = |ops: &[torchport_runtime::OpUse], op: &str| {
            ops.iter().find(|o| o.op == op).map_or(0, |o| o.count)
        };
        let all: Vec<_> = ops.iter().map(|o| (&o.op, o.count)).collect();
        assert_eq!(count(&ops, "aten.gelu.default"), 0, "{name}: {all:?}");
        assert_eq!(count(&ops, "aten.dropout.default"), 0, "{name}: {all:?}");
        let (adds, chains) = (
            count(&ops, "aten.add.Tensor"),
            count(&ops, "torchport.pointwise.default"),
        );
        let linears = count(&ops, "torchport.linear_packed.default");
        match model {
            "hf_bert_mask" => {
                let layers = count(&exported, "aten.gelu.default");
                assert!(layers > 0 && adds + 2 * layers <= count(&exported, "aten.add.Tensor"));
            }
            // At least one chain a layer (a layer has 7 Linears), the MLP's
            // `silu(gate) * up`, is done by a Linear (a residual add's chain may be too).
            "hf_llama_mask" => {
                let (mut ep, _) =
                    torchport_runtime::archive::read(&fixtures().join(&name)).unwrap();
                let g = &mut ep.graph_module.graph;
                let before = torchport_runtime::prepare::fuse_pointwise_chains(g);
                assert!(
                    linears >= 7 && chains + linears / 7 <= before,
                    "{name}: {all:?}"
                );
            }
            // GPT-2's `Conv1D` products are viewed back to `[batch, seq, n]` before their
            // residual adds: looked through, so only the embeddings' add is left.
            "hf_gpt2" => assert_eq!(adds, 1, "{name}: {all:?}"),
            _ => {}
        }
    }
}

/// The convolutions (groups 1) of timm's ResNet-18d and torchvision's MobileNetV3-Small
/// whose output planes have at most `small::MAX_PIXELS` pixels run with their weights packed
/// at load, in both flavours: the last stages' convolutions, and MobileNet's
/// squeeze-and-excitation convolutions on one pixel (so `zoo_models_match_pytorch` checks
/// that path against torch's outputs); none of the others does.
#[test]
fn convolutions_on_small_planes_run_with_packed_weights() {
    use torchport_runtime::ops::conv::small::{MAX_PIXELS, TARGET};
    use torchport_runtime::schema::{Argument, Graph};
    if torchport_runtime::ops::packed::Packing::detect().is_none() {
        return;
    }
    // The dense convolutions on small planes, and all convolutions, as the export has them.
    let convs = |g: &Graph| {
        let conv =
            |t: &str| t.ends_with("aten.conv2d.default") || t.ends_with("aten.convolution.default");
        let dense = |n: &torchport_runtime::schema::Node| {
            !n.inputs
                .iter()
                .any(|a| a.name == "groups" && !matches!(a.arg, Argument::AsInt(1)))
        };
        let small = |n: &torchport_runtime::schema::Node| {
            let [Argument::AsTensor(y)] = n.outputs.as_slice() else {
                return false;
            };
            let s = g.tensor_values[&y.name].static_sizes().unwrap();
            s[2] * s[3] <= MAX_PIXELS as i64
        };
        let all: Vec<_> = g.nodes.iter().filter(|n| conv(&n.target)).collect();
        let packed = all.iter().filter(|n| dense(n) && small(n)).count();
        (packed, all.len())
    };
    for model in ["timm_resnet18d", "tv_mobilenet_v3_small"] {
        for flavour in ["plain", "decomp"] {
            let path = fixtures().join(format!("{model}.{flavour}.pt2"));
            let raw = torchport_runtime::archive::read_program(&path).unwrap();
            let (small, all) = convs(&raw.graph_module.graph);
            assert!(
                small > 0 && small < all,
                "{model} {flavour}: {small} of {all}"
            );
            let ops = Program::load(&path).unwrap().ops();
            let count = |op: &str| ops.iter().find(|o| o.op == op).map_or(0, |o| o.count);
            assert_eq!(count(TARGET), small, "{model} {flavour}");
        }
    }
}

/// `profile_nodes` on timm's ResNet-18d as torch exported it: the outputs are `run`'s, bit
/// for bit; every node the load left is timed once, in order (as many as `ops()` counts, per
/// operator too, and `profile` counts the same per operator); each node's
/// shape is its first output's (the last node's is the program's output, the convolutions'
/// are 4-d over the batch).
#[test]
fn node_profiles_time_every_node_once() {
    let path = fixtures().join("timm_resnet18d.plain.pt2");
    let program = Program::load(&path).unwrap();
    let inputs = numbered(&fixtures(), "timm_resnet18d", "input");
    let want = program.run(&inputs).unwrap();
    let (got, nodes) = program.profile_nodes(&inputs).unwrap();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        let bits = |t: &candle_core::Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(bits(g), bits(w));
    }
    let ops = program.ops();
    assert_eq!(nodes.len(), ops.iter().map(|o| o.count).sum::<usize>());
    for o in &ops {
        let n = nodes.iter().filter(|n| n.op == o.op).count();
        assert_eq!(n, o.count, "{}", o.op);
    }
    let names: std::collections::HashSet<_> = nodes.iter().map(|n| &n.node).collect();
    assert_eq!(names.len(), nodes.len(), "node names repeat");
    assert_eq!(nodes.last().unwrap().shape, want[0].dims());
    let batch = inputs[0].dims()[0];
    let convs: Vec<_> = nodes.iter().filter(|n| n.op.contains("conv2d")).collect();
    assert!(convs.len() > 10, "{} convolutions", convs.len());
    for c in convs {
        assert!(
            c.shape.len() == 4 && c.shape[0] == batch,
            "{}: {:?}",
            c.node,
            c.shape
        );
    }
    let (_, per_op) = program.profile(&inputs).unwrap();
    for o in &per_op {
        let n = nodes.iter().filter(|n| n.op == o.op).count();
        assert_eq!(n, o.count, "{}", o.op);
    }
}

/// The video ResNet parts' three batch norms fold into their `conv3d`s at load, and their
/// relus and residual add join those convolutions, in both programs (the outputs against
/// torch's are checked above).
#[test]
fn video_norms_fold_into_3d_convolutions() {
    for (flavour, norm) in [
        ("plain", "aten.batch_norm.default"),
        (
            "decomp",
            "aten._native_batch_norm_legit_no_training.default",
        ),
    ] {
        let path = fixtures().join(format!("tv_video_resnet_stem.{flavour}.pt2"));
        let count = |ops: &[torchport_runtime::OpUse], prefix: &str| -> usize {
            ops.iter()
                .filter(|o| o.op.starts_with(prefix))
                .map(|o| o.count)
                .sum()
        };
        let before = Program::ops_of(&path).unwrap();
        let after = Program::load(&path).unwrap().ops();
        assert_eq!(count(&before, norm), 4, "{flavour}: norms as exported");
        assert_eq!(
            count(&after, norm),
            0,
            "{flavour}: norms left after folding"
        );
        assert!(
            count(&before, "aten.relu") > 0,
            "{flavour}: relus as exported"
        );
        assert_eq!(count(&after, "aten.relu"), 0, "{flavour}: relus left");
        assert_eq!(
            count(&after, "aten.add"),
            0,
            "{flavour}: residual adds left"
        );
    }
}
