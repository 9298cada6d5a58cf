//! Tensor constants reach the program through torchport's reader, in every `.pt2` layout:
//! tests/fixtures/archives/cnn*.pt2 (gen_archives.py) end with
//! `fc(x) + self.shift + torch.tensor([1.0, 2.0, 3.0])`, a non-persistent buffer
//! (`torch.full((3,), 0.25)`) and a lifted tensor constant, both in the program's constants.

use std::path::PathBuf;

use torchport_runtime::candle_core::{DType, Device, Tensor};
use torchport_runtime::{archive, Program};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/archives")
        .join(name)
}

fn rows(t: &Tensor) -> Vec<Vec<f32>> {
    t.to_dtype(DType::F32).unwrap().to_vec2().unwrap()
}

#[test]
fn constants_are_loaded_in_every_layout() {
    let x = Tensor::arange(0f32, 16f32, &Device::Cpu)
        .unwrap()
        .affine(0.2, -1.5)
        .unwrap()
        .reshape((1, 1, 4, 4))
        .unwrap();
    let mut outputs = Vec::new();
    for file in ["cnn.pt2", "cnn_pickled.pt2", "cnn_legacy.pt2", "cnn_v0.pt2"] {
        let path = fixture(file);
        let (ep, mut payloads) = archive::read(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(payloads.contains_key("shift"), "{file}");
        assert!(payloads.contains_key("lifted_tensor_0"), "{file}");
        let got = Program::load(&path)
            .unwrap()
            .run(std::slice::from_ref(&x))
            .unwrap();

        // The same program with both constants zeroed: the output drops by exactly their sum.
        for name in ["shift", "lifted_tensor_0"] {
            let zero = payloads[name].zeros_like().unwrap();
            payloads.insert(name.to_string(), zero);
        }
        let without = Program::from_parts(ep, payloads).unwrap();
        let base = without.run(std::slice::from_ref(&x)).unwrap();
        for (g, b) in rows(&got[0]).iter().zip(rows(&base[0])) {
            let d: Vec<f32> = g.iter().zip(&b).map(|(g, b)| g - b).collect();
            for (d, want) in d.iter().zip([1.25f32, 2.25, 3.25]) {
                assert!((d - want).abs() < 1e-5, "{file}: {d} vs {want}");
            }
        }
        outputs.push(rows(&got[0]));
    }
    assert!(outputs.iter().all(|o| o == &outputs[0]), "{outputs:?}");
}

#[test]
fn an_archive_holding_no_program_is_refused() {
    let path = fixture("traced_cnn.pt");
    let err = Program::load(&path).err().unwrap();
    assert_eq!(
        err.to_string(),
        format!(
            "{}: not a .pt2 archive (it is a torchscript file); expected one written by \
             torch.export.save",
            path.display()
        )
    );
}
