//! TorchScript archives (`torch.jit.save` of traced and scripted modules) run by the runtime's
//! TorchScript front end. Models are built by timm, torchvision and transformers themselves
//! or written with torch.nn and scripted (tests/fixtures/gen/gen_torchscript.py); each is run
//! on the inputs torch used and compared with torch's own outputs of the saved module: floats
//! within 1e-4 * max(1, max |ref|), integers and bools exactly.

use std::path::PathBuf;

use torchport_runtime::candle_core::Tensor;
use torchport_runtime::{Error, ScriptProgram};

#[path = "common/compare.rs"]
mod compare;
use compare::{numbered, output_mismatches};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/torchscript")
}

/// Run fixture `model` on `inputs` and compare with torch's outputs.
fn check_with(model: &str, inputs: &[Tensor], want: &[Tensor]) {
    let program = ScriptProgram::load(fixtures().join(format!("{model}.pt")))
        .unwrap_or_else(|e| panic!("{model}: {e}"));
    let got = program
        .run(inputs)
        .unwrap_or_else(|e| panic!("{model}: {e}"));
    let failures = output_mismatches(model, &got, want, |_| 1e-4);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn check(model: &str) {
    let inputs = numbered(&fixtures(), model, "input");
    let want = numbered(&fixtures(), model, "output");
    assert!(
        !inputs.is_empty() && !want.is_empty(),
        "{model}: fixtures missing"
    );
    check_with(model, &inputs, &want);
}

#[test]
fn traced_timm_resnet18d() {
    check("timm_resnet18d");
}

#[test]
fn traced_torchvision_mobilenet_v3_small() {
    check("tv_mobilenet_v3_small");
}

#[test]
fn traced_timm_vit() {
    check("timm_vit");
}

#[test]
fn traced_transformers_bert() {
    check("hf_bert");
}

/// GPT-2's `Conv1D` traced as `torch.addmm(bias, x, weight)`, its weight `[in, out]`.
#[test]
fn traced_transformers_gpt2() {
    check("hf_gpt2");
}

/// `addmm` with factors (`beta` 0 ignoring a bias of NaNs, as torch does), `addmm` with a
/// bias broadcast to its outputs, a Linear: the weights stored packed, the rest done after
/// the packed product.
#[test]
fn scripted_products_with_packed_weights() {
    check("scripted_products");
}

#[test]
fn scripted_loops_branch_lists_optional() {
    check("scripted_loops");
}

#[test]
fn scripted_helper_methods_and_functions() {
    check("scripted_helpers");
}

#[test]
fn scripted_bidirectional_lstm_tagger() {
    check("scripted_lstm");
}

/// The scripted model with its Optional input left out, and with inputs that take the other
/// side of its data-dependent branch (and run its while loop to its bound).
#[test]
fn scripted_loops_other_paths() {
    for k in 0..2 {
        let v = format!("v{k}");
        let inputs = numbered(&fixtures(), "scripted_loops", &format!("{v}.input"));
        let want = numbered(&fixtures(), "scripted_loops", &format!("{v}.output"));
        assert!(
            !inputs.is_empty() && !want.is_empty(),
            "{v}: fixtures missing"
        );
        check_with("scripted_loops", &inputs, &want);
    }
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
    check("tv_lraspp");
}

#[test]
fn scripted_torchvision_lraspp_segmentation() {
    check("tv_lraspp_scripted");
}

#[test]
fn scripted_torchvision_mobilenet_v3() {
    check("tv_mobilenet_v3_scripted");
}

#[test]
fn scripted_timm_resnet18d() {
    check("timm_resnet18d_scripted");
}

/// Scripted timm code: an enum attribute (`Format.NCHW`, pickled as an enum member) and its
/// comparison with the enum class's member.
#[test]
fn scripted_timm_vit() {
    check("timm_vit_scripted");
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
