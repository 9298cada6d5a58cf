//! TorchScript archives (`torch.jit.save` of traced and scripted modules) run by the runtime's
//! TorchScript front end. Models are built by timm, torchvision and transformers themselves
//! or written with torch.nn and scripted (tests/fixtures/gen/gen_torchscript.py); each is run
//! on the inputs torch used and compared with torch's own outputs of the saved module: floats
//! within 1e-4 * max(1, max |ref|), integers and bools exactly.

use std::path::PathBuf;

use torchport_runtime::candle_core::Tensor;
use torchport_runtime::{Error, ScriptInput, ScriptProgram, Specialisation};

#[path = "common/compare.rs"]
mod compare;
use compare::{numbered, output_mismatches};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/torchscript")
}

fn load(model: &str) -> ScriptProgram {
    ScriptProgram::load(fixtures().join(format!("{model}.pt")))
        .unwrap_or_else(|e| panic!("{model}: {e}"))
}

/// Run `program` (fixture `model`) on `inputs` and compare with torch's outputs.
fn run_and_compare(program: &ScriptProgram, model: &str, inputs: &[Tensor], want: &[Tensor]) {
    let got = program
        .run(inputs)
        .unwrap_or_else(|e| panic!("{model}: {e}"));
    let failures = output_mismatches(model, &got, want, |_| 1e-4);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Run fixture `model` on `inputs` twice, the first run interpreted (and recorded), the
/// second by the graph recorded from it where there is one, and compare each with torch's
/// outputs; how the program runs these inputs after that.
fn check_with(model: &str, inputs: &[Tensor], want: &[Tensor]) -> Specialisation {
    let program = load(model);
    for _ in 0..2 {
        run_and_compare(&program, model, inputs, want);
    }
    let mut plans = program.specialisations();
    assert_eq!(plans.len(), 1, "{model}: one signature of inputs was run");
    plans.remove(0).1
}

fn fixture(model: &str, kind: &str) -> Vec<Tensor> {
    let v = numbered(&fixtures(), model, kind);
    assert!(!v.is_empty(), "{model}: {kind} fixtures missing");
    v
}

fn check(model: &str) -> Specialisation {
    check_with(model, &fixture(model, "input"), &fixture(model, "output"))
}

/// [`check`], the second run by a recorded graph.
fn check_graph(model: &str) {
    let how = check(model);
    assert!(
        matches!(how, Specialisation::Graph { .. }),
        "{model}: runs as {how:?}"
    );
}

#[test]
fn traced_timm_resnet18d() {
    check_graph("timm_resnet18d");
}

#[test]
fn traced_torchvision_mobilenet_v3_small() {
    check_graph("tv_mobilenet_v3_small");
}

#[test]
fn traced_timm_vit() {
    check_graph("timm_vit");
}

#[test]
fn traced_transformers_bert() {
    check_graph("hf_bert");
}

/// GPT-2's `Conv1D` traced as `torch.addmm(bias, x, weight)`, its weight `[in, out]`.
#[test]
fn traced_transformers_gpt2() {
    check_graph("hf_gpt2");
}

/// Mixtral's experts: tokens sorted by expert and counted (`histc`, `cumsum`), each
/// expert's rows multiplied by its weights in `torch._grouped_mm`.
#[test]
fn traced_transformers_mixtral() {
    check_graph("hf_mixtral");
}

/// `torch._grouped_mm` in its four layouts: rows by group (one group empty), columns by
/// group, the inner dim by group (one group empty, zeros), a batch without offsets.
#[test]
fn traced_grouped_products() {
    check_graph("traced_grouped_products");
}

/// Qwen3-Next's gated delta rule: each chunk's unit lower-triangular system solved by
/// `torch.linalg.solve_triangular`; its experts by `torch._grouped_mm`.
#[test]
fn traced_transformers_qwen3_next() {
    check_graph("hf_qwen3_next");
}

/// Pixtral's attention mask: `mask[:n, :n] = 0` with `n` all of the mask, traced as an
/// in-place fill of slices that return the whole tensor, which must update the mask.
#[test]
fn traced_transformers_pixtral() {
    check_graph("hf_pixtral");
}

/// Longformer's sliding-window chunks: `as_strided` with the strides torch held its input
/// in (a view of a transposed tensor), recorded by the trace as numbers. Interpreted both
/// times: the recording stops at an in-place fill of its int mask with a float.
#[test]
fn traced_transformers_longformer() {
    let how = check("hf_longformer");
    assert!(
        matches!(&how, Specialisation::Interpreted(why) if why.contains("masked_fill_")),
        "{how:?}"
    );
}

/// `as_strided` over views torch holds otherwise than row-major: transposed, permuted and
/// merged, sliced (an offset of its own), made contiguous, split, compared and converted.
#[test]
fn traced_strided_views() {
    check_graph("traced_strided_views");
}

/// `addmm` with factors (`beta` 0 ignoring a bias of NaNs, as torch does), `addmm` with a
/// bias broadcast to its outputs, a Linear: the weights stored packed, the rest done after
/// the packed product.
#[test]
fn scripted_products_with_packed_weights() {
    check_graph("scripted_products");
}

#[test]
fn scripted_loops_branch_lists_optional() {
    check("scripted_loops");
}

#[test]
fn scripted_helper_methods_and_functions() {
    check_graph("scripted_helpers");
}

#[test]
fn scripted_bidirectional_lstm_tagger() {
    check_graph("scripted_lstm");
}

/// The scripted model with its Optional input left out, and with inputs that take the other
/// side of its data-dependent branch (and run its while loop to its bound), all by the one
/// program after its first inputs. The code reads values of tensors computed from the inputs
/// (the branch, the loop's condition), so no graph is recorded: the other side's inputs are
/// of the first inputs' sizes, and a graph of the first run would compute the first side.
#[test]
fn scripted_loops_other_paths() {
    let model = "scripted_loops";
    let program = load(model);
    let (inputs, want) = (fixture(model, "input"), fixture(model, "output"));
    for _ in 0..2 {
        run_and_compare(&program, model, &inputs, &want);
    }
    for k in 0..2 {
        let v = format!("v{k}");
        let inputs = fixture(model, &format!("{v}.input"));
        let want = fixture(model, &format!("{v}.output"));
        for _ in 0..2 {
            run_and_compare(&program, model, &inputs, &want);
        }
    }
    let plans = program.specialisations();
    assert_eq!(plans.len(), 2, "{plans:?}");
    for (_, how) in plans {
        assert_interpreted(&how, "reads a value of a tensor computed from the inputs");
    }
}

/// `how` is [`Specialisation::Interpreted`] for a reason that says `why`.
fn assert_interpreted(how: &Specialisation, why: &str) {
    assert!(
        matches!(how, Specialisation::Interpreted(reason) if reason.contains(why)),
        "{how:?}"
    );
}

/// In-place updates of parts of a tensor written back into it (slices of slices, a row's
/// slice, a row, a named column updated twice), as torchvision's Swin builds its attention
/// mask, and seen by a row taken before them; interpreted, then by the recorded graph.
#[test]
fn scripted_in_place_updates_of_parts() {
    check_graph("scripted_view_writes");
}

/// A branch on a value computed from the input, and nothing else that depends on it: no
/// graph is recorded (it would hold the first inputs' side), so inputs of the same sizes on
/// the other side of the branch get the other side, by the same program.
#[test]
fn scripted_branch_on_a_value_is_not_recorded() {
    let model = "scripted_branch";
    let program = load(model);
    for inputs in ["input", "v0.input", "v1.input", "input"] {
        let want = fixture(model, &inputs.replace("input", "output"));
        for _ in 0..2 {
            run_and_compare(&program, model, &fixture(model, inputs), &want);
        }
    }
    let how = program.specialisations().remove(0).1;
    assert_interpreted(&how, "reads a value of a tensor computed from the inputs");
}

/// Sizes that depend on the inputs' values (a boolean mask's selection, and a tensor made
/// with the selection's size): the second run is the graph recorded from the first; inputs
/// of the same sizes that select another number of values fail the graph's check of its
/// sizes and are interpreted, and so is every later run of those sizes.
#[test]
fn scripted_mask_sizes_from_values() {
    let model = "scripted_mask";
    let program = load(model);
    let (a, want_a) = (fixture(model, "input"), fixture(model, "output"));
    let (b, want_b) = (fixture(model, "v0.input"), fixture(model, "v0.output"));
    assert_eq!(a[0].dims(), b[0].dims());
    assert_ne!(
        want_a[0].dims(),
        want_b[0].dims(),
        "the second inputs should select another number of values"
    );
    for _ in 0..2 {
        run_and_compare(&program, model, &a, &want_a);
    }
    let how = program.specialisations().remove(0).1;
    assert!(matches!(how, Specialisation::Graph { .. }), "{how:?}");
    for _ in 0..2 {
        run_and_compare(&program, model, &b, &want_b);
    }
    run_and_compare(&program, model, &a, &want_a);
    let how = program.specialisations().remove(0).1;
    assert_interpreted(&how, "the recorded run had");
}

/// The loop counter is an int output: exact, and it differs between the two paths.
#[test]
fn scripted_loops_int_output_is_exact() {
    let a = numbered(&fixtures(), "scripted_loops", "output")[1].clone();
    let b = numbered(&fixtures(), "scripted_loops", "v1.output")[1].clone();
    assert_ne!(
        a.to_vec0::<i64>().unwrap(),
        b.to_vec0::<i64>().unwrap(),
        "the fixtures should take different numbers of loop iterations"
    );
}

/// Load (and, if that succeeds, run) a hostile archive; the one error it must give.
fn hostile_error(name: &str) -> Error {
    let path = fixtures().join(format!("hostile/{name}.pt"));
    let x = numbered(&fixtures(), "scripted_helpers", "input");
    match ScriptProgram::load(&path) {
        Err(e) => e,
        Ok(p) => p.run(&x).expect_err(name),
    }
}

/// Each hostile archive gives one error naming the code record, the line and the construct.
#[test]
fn hostile_archives_give_one_clear_error() {
    let cases = [
        ("malformed", 2, "is never closed"),
        ("deep_nesting", 3, "nested deeper than"),
        ("long_chain", 3, "nested deeper than"),
        ("huge_literal", 3, "a number literal of 5001 characters"),
        ("recursion", 5, "calls nested deeper than 200 levels"),
        ("raises", 4, "the model raised ValueError: input rejected"),
        (
            "unknown_op",
            4,
            "operator aten::not_an_operator is not supported",
        ),
        // A part cut by `narrow` updated in place: not written back, refused.
        ("inplace_view", 4, "only slice and select are"),
        // A part of a tensor no variable holds: the update would be lost, refused.
        ("inplace_lost", 4, "no variable of this function holds"),
        (
            "unknown_library_op",
            3,
            "operator mylib::frobnicate is not supported",
        ),
        ("with_tensor", 3, "'with' on a Tensor"),
        (
            "isinstance_unknown",
            3,
            "isinstance() with the type Frobnicator is not supported",
        ),
        (
            "new_unknown_class",
            3,
            "__torch__.Nope.__new__ is not a function the archive's code defines",
        ),
        ("any_of_tensors", 3, "any() of a list holding a Tensor"),
        // `as_strided` where torch's layout of the input is not known, or has gaps.
        (
            "strided_unknown",
            4,
            "cannot tell how torch lays that input out",
        ),
        ("strided_gaps", 4, "with gaps or overlapping elements"),
    ];
    for (name, want_line, want) in cases {
        let e = hostile_error(name);
        let msg = e.to_string();
        eprintln!("{name}: {msg}");
        match e {
            Error::Script {
                record, line, what, ..
            } => {
                assert_eq!(record, "code/__torch__.py", "{name}: {msg}");
                assert_eq!(line, want_line, "{name}: {msg}");
                assert!(what.contains(want), "{name}: {msg}");
            }
            other => panic!("{name}: not a script error: {other}"),
        }
    }
}

mod common {
    pub mod ts_code_target;
}

/// The `ts_code` fuzz target's checks on every code record of the fixtures (they parse) and
/// on crafted hostile code (one error, inside the input).
#[test]
fn parser_target_on_fixture_code_and_hostile_code() {
    use common::ts_code_target::ts_code;
    let mut parsed = 0;
    for entry in std::fs::read_dir(fixtures()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("pt") {
            continue;
        }
        let ckpt = torchport::open(&path).unwrap();
        for (record, code) in &ckpt.script().unwrap().code {
            assert!(ts_code(code), "{}: {record} does not parse", path.display());
            parsed += 1;
        }
    }
    assert!(parsed >= 20, "only {parsed} code records");
    let hostile: [&[u8]; 9] = [
        // Found by the ts_code fuzz target: a comment on a last line without a newline put
        // the error one line past the end.
        b"class ReLU(Module):\n  __parameters__ = []\n  #####__buffers__ = []1\nclass ReLU(Module):\n  # ",
        b"def f(x):\n  return (((x\n",
        b"def f(x):\n\treturn x\n  return x\n",
        b"class A(Module):\n  def f(self):\n    x = \"abc\n",
        b"\xff\xfe\n",
        b"def f(x):\n  return x if\n",
        b"x = 0x\n",
        b"def f(x):\n  a = b = c = \n",
        b"def f(:\n  pass\n",
    ];
    for code in hostile {
        assert!(!ts_code(code), "{:?} parsed", String::from_utf8_lossy(code));
    }
    let deep = format!("def f(x):\n{}", {
        let mut s = String::new();
        for i in 0..150 {
            s.push_str(&" ".repeat(2 * (i + 1)));
            s.push_str("if x:\n");
        }
        s
    });
    assert!(!ts_code(deep.as_bytes()));
}

#[test]
fn traced_torchvision_lraspp_segmentation() {
    check_graph("tv_lraspp");
}

#[test]
fn scripted_torchvision_lraspp_segmentation() {
    check_graph("tv_lraspp_scripted");
}

#[test]
fn scripted_torchvision_mobilenet_v3() {
    check_graph("tv_mobilenet_v3_scripted");
}

#[test]
fn scripted_timm_resnet18d() {
    check_graph("timm_resnet18d_scripted");
}

/// Scripted timm code: an enum attribute (`Format.NCHW`, pickled as an enum member) and its
/// comparison with the enum class's member.
#[test]
fn scripted_timm_vit() {
    check_graph("timm_vit_scripted");
}

/// A Linear's weight that the code reads only as `torch.linear`'s weight is stored packed at
/// load for the gemm's microkernel, as a `.pt2` load stores it (the outputs above are those
/// runs'): transformers' BERT of 2 layers holds 13 Linears (6 a layer and the pooler's),
/// its GPT-2 of 2 layers 8 `Conv1D`s (`addmm`'s `[in, out]` weights), the products module 3,
/// timm's ViT of depth 2 holds 8 in its blocks, traced or scripted, and a head of 10
/// outputs, packed only where that is at least half a panel (AVX2's 16 rows, not AVX-512's
/// 64: the padding would more than double it); the LSTM tagger's Linear of 5 outputs is not.
#[test]
fn linear_weights_are_stored_packed() {
    let Some(packing) = torchport_runtime::ops::packed::Packing::detect() else {
        return; // no microkernel of the runtime's own on this CPU
    };
    let head = usize::from(2 * 10 >= packing.mr);
    for (model, linears) in [
        ("hf_bert", 13),
        ("hf_gpt2", 8),
        ("scripted_products", 3),
        ("timm_vit", 8 + head),
        ("timm_vit_scripted", 8 + head),
        ("scripted_lstm", 0),
    ] {
        let program = ScriptProgram::load(fixtures().join(format!("{model}.pt")))
            .unwrap_or_else(|e| panic!("{model}: {e}"));
        assert_eq!(program.packed_linear_weights(), linears, "{model}");
    }
}

/// One program run from several threads at once, and from inside a rayon pool: each run on
/// the evaluator's pool gives torch's outputs.
#[test]
fn runs_from_several_threads_and_from_a_pool() {
    let model = "hf_bert";
    let program = ScriptProgram::load(fixtures().join(format!("{model}.pt"))).unwrap();
    let inputs = numbered(&fixtures(), model, "input");
    let want = numbered(&fixtures(), model, "output");
    let run = || {
        let got = program.run(&inputs).unwrap();
        let failures = output_mismatches(model, &got, &want, |_| 1e-4);
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    };
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(run);
        }
    });
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    pool.install(run);
}

/// Several programs' first runs (which record) at once, from threads of their own: each run's
/// evaluator goes to the same pool, where a thread waiting for a kernel's parallel loop may
/// take up another program's whole run meanwhile. Each program still records its own graph
/// and gives torch's outputs, first run and second (once, the LSTM tagger's run was found
/// interpreted in a full test run: another run's end had taken its recorder away).
#[test]
fn first_runs_of_several_programs_at_once_each_record_their_own() {
    let models = ["scripted_lstm", "hf_bert", "timm_vit", "scripted_norms"];
    for _round in 0..12 {
        std::thread::scope(|s| {
            for model in models {
                s.spawn(move || check_graph(model));
            }
        });
    }
}

/// torchvision's Faster R-CNN, scripted: its `forward` takes a list of images of different
/// sizes (the fixture's `.npz`), resizes and batches them, and runs the RPN's proposals
/// through batched non-maximum suppression (`torchvision::nms`) and the box head's pooling
/// (`torchvision::roi_align`); its result is a tuple of the (empty) losses and a list of one
/// dict of boxes, labels and scores per image. Boxes and scores within 1e-4 of torch's
/// (relative to the boxes' size), labels exactly.
#[test]
fn scripted_torchvision_faster_rcnn_on_a_list_of_images() {
    let model = "tv_fasterrcnn";
    let path = fixtures().join(format!("{model}.input_0.npz"));
    let images: Vec<Tensor> = torchport_runtime::npy::read_arrays(&path)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(|(_, t)| t)
        .collect();
    assert_eq!(images.len(), 2);
    assert_ne!(
        images[0].dims(),
        images[1].dims(),
        "images of different sizes"
    );
    let program = load(model);
    let want = fixture(model, "output");
    // Twice: the second run is interpreted as well (a list input is never recorded).
    for _ in 0..2 {
        let got = program
            .run_inputs(&[ScriptInput::Tensors(images.clone())])
            .unwrap_or_else(|e| panic!("{model}: {e}"));
        let failures = output_mismatches(model, &got, &want, |_| 1e-4);
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
    assert!(program.specialisations().is_empty());
    // A tensor where the list belongs is refused by the model's own code, with its line.
    let err = program
        .run(&[images[0].clone()])
        .expect_err("a tensor for a list");
    assert!(matches!(err, Error::Script { .. }), "{err}");
}

/// A `with torch.no_grad():` block: TorchScript writes it as a `with` on an object of the
/// archive's `no_grad` class, entered and left by its own methods; both sides of the branch
/// inside it (the variant's inputs take the early return).
#[test]
fn scripted_with_block() {
    let model = "scripted_with";
    let program = load(model);
    for v in ["", "v0."] {
        let inputs = fixture(model, &format!("{v}input"));
        let want = fixture(model, &format!("{v}output"));
        run_and_compare(&program, model, &inputs, &want);
    }
}

/// torchvision's `roi_align` (aligned with an adaptive sampling grid; not aligned with a
/// fixed one; regions past the plane's edges, one of zero size) and `nms`, called directly.
#[test]
fn scripted_torchvision_detection_ops() {
    check("tv_ops");
}

/// `torch.norm` / `Tensor.norm` as TorchScript writes them (`aten::norm`: `p` 1, None, inf
/// and 3 with a float64 dtype; over one dim, two, or all; `F.normalize`), and the builtins
/// `any` / `all` of lists of bools and ints.
#[test]
fn scripted_norms_and_list_any_all() {
    check_graph("scripted_norms");
}

/// Convolutions with `padding="same"`, traced (`aten::_convolution_mode`): 1-, 2- and 3-d,
/// an even kernel and a dilated one, whose odd total padding goes one more at the end.
#[test]
fn traced_same_padding_convolutions() {
    check_graph("traced_same_convs");
}

/// `tile` with fewer repeat counts than dims, as many, and more (`aten::tile`, which timm's
/// SAM2 Hiera calls).
#[test]
fn scripted_tiles() {
    check_graph("scripted_tiles");
}

/// Numbers a scripted module returns (a size, a float, a bool) come back in their places as
/// 0-d int64, float64 and bool tensors, with torch's values, as a `.pt2` program's do.
#[test]
fn scripted_numbers_come_back_as_0d_tensors() {
    check("scripted_numbers");
    let p = ScriptProgram::load(fixtures().join("scripted_numbers.pt")).unwrap();
    let out = p.run(&fixture("scripted_numbers", "input")).unwrap();
    let kinds: Vec<_> = out[1..].iter().map(|t| (t.dtype(), t.rank())).collect();
    use torchport_runtime::candle_core::DType;
    assert_eq!(kinds, [(DType::I64, 0), (DType::F64, 0), (DType::U8, 0)]);
}

/// torchvision's Swin Transformer V2 (cosine attention through `F.normalize`), scripted.
#[test]
fn scripted_torchvision_swin_v2() {
    check_graph("tv_swin_v2_scripted");
}

/// timm's Swin Transformer, scripted: whether a block shifts its windows is `any` of a list.
#[test]
fn scripted_timm_swin() {
    check_graph("timm_swin_scripted");
}

/// timm's ConvMixer, traced: its depthwise convolutions pad `"same"`.
#[test]
fn traced_timm_convmixer() {
    check_graph("timm_convmixer");
}

/// Archives written by torch 1.4 (file format version 1) and 1.8 (version 5; tests/fixtures/
/// gen/gen_torchscript_old.py): convolutions by the `_convolution` schema of the day (no
/// `allow_tf32`), `F.adaptive_avg_pool2d` through `list_with_default`, torchvision 0.5's
/// ShuffleNetV2 and MobileNetV2 classes traced and scripted, an LSTM tagger; and operators
/// whose meaning changed since, which run as torch runs them today, through its upgraders:
/// `/`, `div` and `div_` of integer tensors truncate and `full` with an integer fill makes
/// floats (torch 1.4), `linspace` and `logspace` with `steps` None take 100 (torch 1.8, where
/// `full` of an integer is int64 already). Compared with those torch versions' own outputs
/// (torch 2.15 gives the same from these archives).
#[test]
fn archives_of_torch_1_4_and_1_8_run_as_torch_runs_them() {
    let dir = fixtures().join("../torchscript_old");
    for model in [
        "t14_old_ops",
        "t14_tiny_traced",
        "t14_tiny_scripted",
        "t14_lstm_scripted",
        "t14_tv_shufflenet_traced",
        "t14_tv_shufflenet_scripted",
        "t14_tv_mobilenet_v2_scripted",
        "t18_steps",
        "t18_tv_shufflenet_scripted",
    ] {
        let program = ScriptProgram::load(dir.join(format!("{model}.pt")))
            .unwrap_or_else(|e| panic!("{model}: {e}"));
        let inputs = numbered(&dir, model, "input");
        let want = numbered(&dir, model, "output");
        assert!(
            !inputs.is_empty() && !want.is_empty(),
            "{model}: fixtures missing"
        );
        for _ in 0..2 {
            run_and_compare(&program, model, &inputs, &want);
        }
    }
}

/// A TorchScript archive of torch 1.0 to 1.2 (model.json; its weights are read by
/// `torchport::open`) is refused by the runtime with one error saying so.
#[test]
fn archives_of_torch_1_0_to_1_2_are_refused_with_the_reason() {
    let path = fixtures().join("../torchscript_legacy/t12_traced.pt");
    let err = ScriptProgram::load(&path)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("torch 1.0 to 1.2") && err.contains("weights can be read"),
        "{err}"
    );
}
