//! `torchport::cast::cast` against torch's own `.to(dtype)`: tests/fixtures/cast/casts.safetensors
//! (written by tests/fixtures/gen/gen_cast.py) holds inputs of float32, float64, float16,
//! bfloat16, int32 and int64 aimed at the rounding corners, and what torch made of them for
//! every float target (and a few integer ones). Every element must come back bit for bit,
//! except NaNs, which only need to stay NaN (torch's vectorised and scalar kernels give NaNs
//! different payloads).

use torchport::cast::{cast, to_f64};
use torchport::DType;

fn fixture() -> torchport::Checkpoint {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/cast/casts.safetensors");
    torchport::open(&path).expect("cast fixture")
}

/// Cast `in.<input>` to `to` and compare with torch's `<name>`; returns the element count.
fn check(ckpt: &torchport::Checkpoint, input: &str, name: &str) -> usize {
    let src = ckpt.tensor(&format!("in.{input}")).expect("input tensor");
    let want = ckpt.tensor(name).expect("torch's result");
    let (from, to) = (src.dtype, want.dtype);
    let got = cast(&ckpt.data(src).unwrap(), from, to)
        .unwrap_or_else(|e| panic!("{name}: cast failed: {e}"));
    let want_bytes = ckpt.data(want).unwrap();
    assert_eq!(got.len(), want_bytes.len(), "{name}: length");
    let w = to.size();
    let input = ckpt.data(src).unwrap();
    let mut nans = 0;
    for (i, (g, t)) in got.chunks(w).zip(want_bytes.chunks(w)).enumerate() {
        if g == t {
            continue;
        }
        let (vg, vt) = (to_f64(to, g).unwrap()[0], to_f64(to, t).unwrap()[0]);
        let x = to_f64(from, &input[i * from.size()..(i + 1) * from.size()]).unwrap()[0];
        assert!(
            vg.is_nan() && vt.is_nan(),
            "{name} element {i}: {x:e} ({from}) gave {vg:e} {g:02x?}, torch {vt:e} {t:02x?}"
        );
        nans += 1;
    }
    assert!(nans < got.len() / w / 4, "{name}: {nans} NaNs");
    got.len() / w
}

#[test]
fn float_casts_match_torch() {
    let ckpt = fixture();
    let floats = ["float32", "float64", "float16", "bfloat16"];
    let mut checked = 0;
    let mut elements = 0;
    for a in floats {
        for b in floats.into_iter().filter(|&b| b != a) {
            elements += check(&ckpt, a, &format!("{a}->{b}"));
            checked += 1;
        }
    }
    assert_eq!(checked, 12);
    assert!(elements > 9000, "{elements}");
}

#[test]
fn integer_casts_match_torch() {
    let ckpt = fixture();
    for b in ["float32", "float64", "float16", "bfloat16"] {
        check(&ckpt, "int32", &format!("int32->{b}"));
        check(&ckpt, "int64", &format!("int64->{b}"));
    }
    assert!(check(&ckpt, "float32_int", "float32_int->int32") > 500);
    assert!(check(&ckpt, "float32_i8", "float32_i8->int8") > 100);
    assert!(check(&ckpt, "float32", "float32->bool") > 700);
}

#[test]
fn float32_to_bfloat16_rounds_from_every_bit() {
    // 0x00AA8002: the bits below the tie are in float32's lowest three mantissa bits, which a
    // route through half's f64 conversion dropped (it rounded down to 0x00AA). torch: 0x00AB.
    let ckpt = fixture();
    let input = ckpt.data_by_name("in.float32").unwrap();
    let want = ckpt.data_by_name("float32->bfloat16").unwrap();
    let i = input
        .chunks(4)
        .position(|c| c == 0x00AA_8002u32.to_le_bytes())
        .expect("the corner is in the fixture");
    assert_eq!(&want[2 * i..2 * i + 2], &0x00ABu16.to_le_bytes());
    let got = cast(&input[4 * i..4 * i + 4], DType::F32, DType::BF16).unwrap();
    assert_eq!(got, 0x00ABu16.to_le_bytes());
}
