//! The `weight-norm` preset against PyTorch: folding `g` and `v` (both of torch's forms,
//! dims 0, 1, -2 and None; Conv1d, Linear, ConvTranspose1d) must give the `module.weight`
//! torch itself computed (tests/fixtures/gen/gen_weight_norm.py).

use std::path::PathBuf;

use torchport::remap::{self, Context, RuleSet};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/weight_norm")
        .join(name)
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Distance in units in the last place between two finite floats of the same sign.
fn ulps(a: f32, b: f32) -> u32 {
    (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
}

const CASES: [&str; 10] = [
    "conv1d_d0",
    "conv1d_d1",
    "conv1d_dnone",
    "conv1d_dm2",
    "linear_d0",
    "linear_d1",
    "linear_dnone",
    "convt1d_d0",
    "convt1d_d1",
    "convt1d_dnone",
];

#[test]
fn folds_both_forms_like_torch() {
    let expected = torchport::open(fixture("expected.safetensors")).unwrap();
    let mut worst = 0;
    let mut exact = 0;
    let mut total = 0;
    for form in ["hooks", "parametrizations"] {
        let ckpt = torchport::open(fixture(&format!("{form}.pt"))).unwrap();
        let mut rules = RuleSet::new();
        rules.preset("weight-norm").unwrap();
        let (outs, plan) =
            remap::apply_with(&rules, ckpt.out_tensors(), &Context::default()).unwrap();
        assert!(plan.undecided.is_empty(), "{:?}", plan.undecided);
        // Each case leaves exactly `weight` and `bias`.
        let mut names: Vec<&str> = outs.iter().map(|o| o.name.as_str()).collect();
        names.sort_unstable();
        let mut want: Vec<String> = CASES
            .iter()
            .flat_map(|c| [format!("{c}.bias"), format!("{c}.weight")])
            .collect();
        want.sort_unstable();
        assert_eq!(names, want, "{form}");
        for case in CASES {
            let name = format!("{case}.weight");
            let out = outs.iter().find(|o| o.name == name).unwrap();
            let torch = expected
                .tensor(&format!("{form}.{name}"))
                .unwrap_or_else(|| panic!("{form}.{name} in expected"));
            assert_eq!(out.shape, torch.shape, "{form} {name}");
            let got = f32s(&out.data().unwrap());
            let want = f32s(&expected.data(torch).unwrap());
            for (g, w) in got.iter().zip(&want) {
                let u = ulps(*g, *w);
                assert!(u <= 1, "{form} {name}: {g} vs torch {w} ({u} ulps)");
                worst = worst.max(u);
                exact += usize::from(u == 0);
                total += 1;
            }
        }
    }
    // torchport rounds once (float64 throughout); torch rounds the norm, the scale and the
    // product to float32, so most elements agree to the bit and none is more than 1 ulp off.
    println!("{exact} of {total} elements byte-exact, worst {worst} ulp");
    assert!(
        exact * 2 >= total,
        "only {exact} of {total} elements byte-exact"
    );
}

#[test]
fn a_magnitude_that_does_not_fit_is_left_undecided() {
    use torchport::remap::TensorMeta;
    use torchport::DType;
    let meta = |name: &str, shape: &[usize]| TensorMeta {
        name: name.into(),
        dtype: DType::F32,
        shape: shape.to_vec(),
    };
    // g varies along two dims: not a weight norm's magnitude.
    let metas = [
        meta("l.weight_g", &[6, 4, 1]),
        meta("l.weight_v", &[6, 4, 3]),
    ];
    let mut rules = RuleSet::new();
    rules.preset("weight-norm").unwrap();
    let (outs, plan) = remap::plan(&rules, &metas, &Context::default()).unwrap();
    assert_eq!(outs.len(), 2);
    assert_eq!(plan.undecided.len(), 1, "{:?}", plan.undecided);
    assert_eq!(plan.undecided[0].name, "l.weight_g");
}
