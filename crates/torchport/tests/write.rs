//! The writers, checked by reading their output back: `.pt` with torchport's own reader,
//! safetensors with the reference `safetensors` crate, `.npz` with the zip crate and the
//! `.npy` header. Every tensor of every torch.save fixture must come back with the name,
//! dtype, shape and bytes torch itself loaded (`<fixture>.expected.json` / `.bin`, written by
//! tests/fixtures/gen/gen_torch_save.py). Also: atomicity (a tensor failing midway leaves no
//! file, not even a temporary one, and keeps an existing destination), refusing to overwrite
//! an input (also through a hard link), and the errors for tensors a format cannot hold.
//! Python-side checks of the same outputs (torch.load, safetensors, numpy):
//! tests/fixtures/gen/check_writers.py.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use torchport::write::{write, OutputFormat, WriteOptions};
use torchport::{DType, Error, OutTensor, Remedy};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/torch_save")
}

/// name -> (dtype, shape, bytes) of every tensor with data, as torch loaded the fixture.
type Expected = Vec<(String, String, Vec<usize>, Vec<u8>)>;

fn expected(pt: &Path) -> Expected {
    let j: Json =
        serde_json::from_slice(&std::fs::read(format!("{}.expected.json", pt.display())).unwrap())
            .unwrap();
    let bin = std::fs::read(format!("{}.expected.bin", pt.display())).unwrap();
    j["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t.get("meta").is_none() && t.get("sparse").is_none())
        .map(|t| {
            let off = t["offset"].as_u64().unwrap() as usize;
            let n = t["nbytes"].as_u64().unwrap() as usize;
            (
                t["name"].as_str().unwrap().to_string(),
                t["dtype"].as_str().unwrap().to_string(),
                serde_json::from_value(t["shape"].clone()).unwrap(),
                bin[off..off + n].to_vec(),
            )
        })
        .collect()
}

fn fixture_files() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(fixtures())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pt"))
        .collect();
    v.sort();
    assert!(
        v.len() >= 15,
        "expected the torch_save fixtures, found {}",
        v.len()
    );
    v
}

/// Write every tensor of `pt` the format can hold; returns what should come back.
fn write_fixture(pt: &Path, format: OutputFormat, out: &Path) -> Expected {
    let ckpt = torchport::open(pt).unwrap();
    let tensors: Vec<OutTensor<'_>> = ckpt
        .out_tensors()
        .into_iter()
        .filter(|t| format.check_dtype(t.dtype).is_ok())
        .collect();
    let opts = WriteOptions {
        metadata: torchport::write::metadata_from_values(ckpt.values()),
        inputs: vec![pt.to_path_buf()],
        ..WriteOptions::default()
    };
    let w = write(out, format, &tensors, opts).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(w.tensors, tensors.len());
    assert_eq!(w.file_bytes, std::fs::metadata(out).unwrap().len());
    let mut exp = expected(pt);
    exp.retain(|(_, dt, _, _)| format.check_dtype(DType::from_name(dt).unwrap()).is_ok());
    assert_eq!(exp.len(), tensors.len(), "{}", pt.display());
    exp
}

#[test]
fn torch_zip_round_trip_every_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for pt in fixture_files() {
        let out = dir.path().join("out.pt");
        let exp = write_fixture(&pt, OutputFormat::TorchZip, &out);
        let back = torchport::open(&out).unwrap();
        assert_eq!(back.format(), torchport::Format::TorchZip);
        let names: Vec<&str> = back.tensors().iter().map(|t| t.name.as_str()).collect();
        let want: Vec<&str> = exp.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(names, want, "{}: names in order", pt.display());
        for ((name, dtype, shape, bytes), t) in exp.iter().zip(back.tensors()) {
            assert_eq!(t.dtype.name(), dtype, "{name}");
            assert_eq!(&t.shape, shape, "{name}");
            assert!(t.is_contiguous(), "{name}");
            assert_eq!(
                &*back.data(t).unwrap(),
                &bytes[..],
                "{}: {name}",
                pt.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 120, "only {checked} tensors checked");
}

#[test]
fn safetensors_round_trip_every_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for pt in fixture_files() {
        let out = dir.path().join("out.safetensors");
        let exp = write_fixture(&pt, OutputFormat::Safetensors, &out);
        let file = std::fs::read(&out).unwrap();
        let st = safetensors::SafeTensors::deserialize(&file)
            .unwrap_or_else(|e| panic!("{}: {e:?}", pt.display()));
        assert_eq!(st.len(), exp.len());
        let header_len = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
        assert_eq!(header_len % 8, 0);
        for (name, dtype, shape, bytes) in &exp {
            let v = st.tensor(name).unwrap();
            let want = torchport::write::safetensors_dtype(DType::from_name(dtype).unwrap());
            assert_eq!(Some(format!("{:?}", v.dtype()).as_str()), want, "{name}");
            assert_eq!(v.shape(), &shape[..], "{name}");
            assert_eq!(v.data(), &bytes[..], "{}: {name}", pt.display());
            // Aligned to the element size within the file (zero-copy friendly).
            let at = v.data().as_ptr() as usize - file.as_ptr() as usize;
            assert_eq!(at % DType::from_name(dtype).unwrap().size(), 0, "{name}");
            checked += 1;
        }
    }
    assert!(checked >= 120, "only {checked} tensors checked");
}

#[test]
fn safetensors_metadata_holds_the_values() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ckpt.safetensors");
    write_fixture(
        &fixtures().join("training_ckpt.pt"),
        OutputFormat::Safetensors,
        &out,
    );
    let file = std::fs::read(&out).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&file).unwrap();
    let m = meta.metadata().clone().unwrap();
    // Values of training_ckpt.pt.expected.json, as Python's str() writes them.
    assert_eq!(m["epoch"], "3");
    assert_eq!(m["step"], "1200");
    assert_eq!(m["best_acc"], "0.875");
    assert_eq!(m["name"], "run-1");
    assert_eq!(m["np_scalar"], "0.5");
    assert_eq!(m["flags.0"], "True");
    assert_eq!(m["optimizer.param_groups.0.eps"], "1e-08");
    assert!(!m.contains_key("flags.1"), "None is left out");
    assert!(!m.contains_key("args"), "objects are left out");
}

/// Parse an `.npy` entry: (descr, shape text, data).
fn parse_npy(bytes: &[u8]) -> (String, String, Vec<u8>) {
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
    let n = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    assert_eq!((10 + n) % 64, 0, "data 64-byte aligned");
    let header = std::str::from_utf8(&bytes[10..10 + n]).unwrap();
    assert!(header.ends_with('\n'));
    let field = |key: &str| {
        let start = header.find(key).unwrap() + key.len();
        let rest = &header[start..];
        let end = if key.contains("shape") {
            rest.find(')').unwrap() + 1
        } else {
            rest.find('\'').unwrap()
        };
        rest[..end].to_string()
    };
    assert!(header.contains("'fortran_order': False"));
    (
        field("'descr': '"),
        field("'shape': "),
        bytes[10 + n..].to_vec(),
    )
}

#[test]
fn npz_round_trip_every_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for pt in fixture_files() {
        let out = dir.path().join("out.npz");
        let exp = write_fixture(&pt, OutputFormat::Npz, &out);
        let mut zip = zip::ZipArchive::new(std::fs::File::open(&out).unwrap()).unwrap();
        let names: Vec<String> = zip.file_names().map(|n| n.unwrap().into_owned()).collect();
        let mut entries: HashMap<String, Vec<u8>> = HashMap::new();
        for n in &names {
            let mut f = zip.by_name(n).unwrap();
            assert_eq!(f.compression(), zip::CompressionMethod::Stored);
            let mut v = Vec::new();
            f.read_to_end(&mut v).unwrap();
            entries.insert(n.clone(), v);
        }
        assert_eq!(entries.len(), exp.len());
        for (name, dtype, shape, bytes) in &exp {
            let (descr, shape_text, data) = parse_npy(&entries[&format!("{name}.npy")]);
            let dt = DType::from_name(dtype).unwrap();
            assert_eq!(
                Some(descr.as_str()),
                torchport::write::npy_descr(dt),
                "{name}"
            );
            let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
            let want_shape = match shape.len() {
                0 => "()".to_string(),
                1 => format!("({},)", shape[0]),
                _ => format!("({})", dims.join(", ")),
            };
            assert_eq!(shape_text, want_shape, "{name}");
            assert_eq!(&data, bytes, "{}: {name}", pt.display());
            checked += 1;
        }
    }
    assert!(checked >= 120, "only {checked} tensors checked");
}

/// Three tensors; the second fails to produce its data.
fn failing_tensors() -> Vec<OutTensor<'static>> {
    let ok =
        |name: &str| OutTensor::new(name, DType::F32, vec![4], || Ok(Cow::Owned(vec![0u8; 16])));
    vec![
        ok("a"),
        OutTensor::new("b", DType::F32, vec![1 << 20], || {
            Err(Error::Unsupported {
                path: "src.pt".into(),
                tensor: "b".into(),
                what: "a tensor that fails on purpose".into(),
            })
        }),
        ok("c"),
    ]
}

#[test]
fn a_failing_tensor_leaves_no_file() {
    for format in OutputFormat::ALL {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join(format!("out.{}", format.extension()));
        let err = write(&out, format, &failing_tensors(), WriteOptions::default()).unwrap_err();
        assert!(err.to_string().contains("fails on purpose"), "{err}");
        assert!(!out.exists(), "{format}: partial output left");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "{format}: temporary file left: {left:?}");

        // An existing destination survives a failed write untouched.
        std::fs::write(&out, b"previous").unwrap();
        write(&out, format, &failing_tensors(), WriteOptions::default()).unwrap_err();
        assert_eq!(std::fs::read(&out).unwrap(), b"previous");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}

#[test]
fn never_overwrites_an_input() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.pt");
    std::fs::copy(fixtures().join("proto2.pt"), &input).unwrap();
    let before = std::fs::read(&input).unwrap();
    let ckpt = torchport::open(&input).unwrap();
    let tensors = ckpt.out_tensors();
    let link = dir.path().join("link.pt");
    std::fs::hard_link(&input, &link).unwrap();
    for dest in [input.clone(), dir.path().join("sub/../in.pt"), link.clone()] {
        if dest.to_string_lossy().contains("sub") {
            std::fs::create_dir_all(dir.path().join("sub")).unwrap();
        }
        let opts = WriteOptions {
            inputs: vec![input.clone()],
            ..WriteOptions::default()
        };
        let err = write(&dest, OutputFormat::TorchZip, &tensors, opts)
            .unwrap_err()
            .to_string();
        assert!(err.contains("refusing to overwrite an input"), "{err}");
    }
    assert_eq!(std::fs::read(&input).unwrap(), before);
}

#[test]
fn formats_refuse_what_they_cannot_hold() {
    let dir = tempfile::tempdir().unwrap();
    let t = |name: &str, dtype: DType| {
        OutTensor::new(name, dtype, vec![2], move || {
            Ok(Cow::Owned(vec![0u8; 2 * dtype.size()]))
        })
    };
    let cases = [
        (
            OutputFormat::Npz,
            DType::BF16,
            "numpy has no bfloat16",
            "cast it to a floating-point type the format holds (e.g. float32) or leave it out",
        ),
        (
            OutputFormat::Npz,
            DType::F8E4M3Fn,
            "numpy has no float8_e4m3fn",
            "cast it to a floating-point type the format holds (e.g. float32) or leave it out",
        ),
        (
            OutputFormat::Safetensors,
            DType::C128,
            "safetensors has no complex128",
            "; leave it out",
        ),
        (
            OutputFormat::Safetensors,
            DType::QInt8,
            "is qint8 but has no scale and zero point",
            "leave it out",
        ),
        (
            OutputFormat::TorchZip,
            DType::QUInt8,
            "is quint8 but has no scale and zero point",
            "dequantize it",
        ),
    ];
    for (format, dtype, why, hint) in cases {
        let out = dir.path().join(format!("x.{}", format.extension()));
        let tensors = [t("ok", DType::F32), t("layer.bad", dtype)];
        let err = write(&out, format, &tensors, WriteOptions::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("tensor layer.bad"), "{err}");
        assert!(err.contains(why) && err.contains(hint), "{err}");
        assert!(!out.exists());
    }
    let dup = [t("w", DType::F32), t("w", DType::F16)];
    let err = write(
        dir.path().join("d.safetensors"),
        OutputFormat::Safetensors,
        &dup,
        WriteOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(&err, Error::Unwritable { tensor, remedy: Remedy::LeaveOut, .. } if tensor == "w"),
        "{err:?}"
    );
    let err = err.to_string();
    assert!(err.contains("two tensors are named \"w\""), "{err}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn empty_and_scalar_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = [
        OutTensor::new("empty", DType::F32, vec![0, 3], || {
            Ok(Cow::Borrowed(&[][..]))
        }),
        OutTensor::new("scalar", DType::I64, vec![], || {
            Ok(Cow::Owned(7i64.to_le_bytes().to_vec()))
        }),
    ];
    let pt = dir.path().join("e.pt");
    write(
        &pt,
        OutputFormat::TorchZip,
        &tensors,
        WriteOptions::default(),
    )
    .unwrap();
    let back = torchport::open(&pt).unwrap();
    assert_eq!(back.tensors()[0].shape, [0, 3]);
    assert_eq!(back.tensors()[1].shape, Vec::<usize>::new());
    assert_eq!(&*back.data_by_name("scalar").unwrap(), &7i64.to_le_bytes());
    let st = dir.path().join("e.safetensors");
    write(
        &st,
        OutputFormat::Safetensors,
        &tensors,
        WriteOptions::default(),
    )
    .unwrap();
    let file = std::fs::read(&st).unwrap();
    let s = safetensors::SafeTensors::deserialize(&file).unwrap();
    assert_eq!(s.tensor("empty").unwrap().shape(), &[0, 3]);
    assert_eq!(s.tensor("scalar").unwrap().data(), &7i64.to_le_bytes());
}

#[test]
fn progress_reports_every_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = torchport::open(fixtures().join("proto2.pt")).unwrap();
    let tensors = ckpt.out_tensors();
    let mut seen = Vec::new();
    let mut tick = |name: &str, n: u64| seen.push((name.to_string(), n));
    let opts = WriteOptions {
        progress: Some(&mut tick),
        ..WriteOptions::default()
    };
    let w = write(dir.path().join("p.npz"), OutputFormat::Npz, &tensors, opts).unwrap();
    assert_eq!(seen.len(), tensors.len());
    assert_eq!(seen.iter().map(|s| s.1).sum::<u64>(), w.data_bytes);
    assert_eq!(seen[0].0, tensors[0].name);
}

#[test]
fn same_input_same_bytes() {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    for format in OutputFormat::ALL {
        let name = format!("m.{}", format.extension());
        let (a, b) = (d1.path().join(&name), d2.path().join(&name));
        write_fixture(&fixtures().join("training_ckpt.pt"), format, &a);
        write_fixture(&fixtures().join("training_ckpt.pt"), format, &b);
        assert_eq!(
            std::fs::read(&a).unwrap(),
            std::fs::read(&b).unwrap(),
            "{format}"
        );
    }
}

/// Tensors of 64 KiB and more whose bytes lie unchanged in a memory-mapped input are copied
/// file to file (`copy_file_range` on Linux) instead of through memory: the file must be the
/// same bytes as one written from memory, and an input cut short after it was opened must
/// give an error (and no output), never a short file.
#[test]
fn large_tensors_are_copied_file_to_file() {
    let dir = tempfile::tempdir().unwrap();
    let big: Vec<u8> = (0..300_000u32)
        .flat_map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes())
        .collect();
    let mid: Vec<u8> = (0..80_000u32).map(|i| (i % 251) as u8).collect();
    let small: Vec<u8> = [7i64, -1, 1 << 40]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let tensors = vec![
        OutTensor::new("big", DType::F32, vec![300, 1000], || {
            Ok(Cow::Borrowed(&big[..]))
        }),
        OutTensor::new("small", DType::I64, vec![3], || {
            Ok(Cow::Borrowed(&small[..]))
        }),
        OutTensor::new("mid", DType::F16, vec![200, 200], || {
            Ok(Cow::Borrowed(&mid[..]))
        }),
    ];
    let from_memory = dir.path().join("mem.safetensors");
    write(
        &from_memory,
        OutputFormat::Safetensors,
        &tensors,
        WriteOptions::default(),
    )
    .unwrap();
    let want = std::fs::read(&from_memory).unwrap();
    for format in [OutputFormat::TorchZip, OutputFormat::Safetensors] {
        let input = dir.path().join(format!("in.{}", format.extension()));
        write(&input, format, &tensors, WriteOptions::default()).unwrap();
        let ckpt = torchport::open(&input).unwrap();
        let opts = || WriteOptions {
            inputs: vec![input.clone()],
            ..WriteOptions::default()
        };
        let copied = dir.path().join("copied.safetensors");
        write(
            &copied,
            OutputFormat::Safetensors,
            &ckpt.out_tensors(),
            opts(),
        )
        .unwrap();
        assert_eq!(std::fs::read(&copied).unwrap(), want, "from {format}");

        // Cut the input inside `mid`, the last tensor in both layouts (nothing reads the
        // cut-off part of the map, which would fault).
        let len = std::fs::metadata(&input).unwrap().len();
        let tail = if format == OutputFormat::TorchZip {
            40_000
        } else {
            30_000
        };
        std::fs::OpenOptions::new()
            .write(true)
            .open(&input)
            .unwrap()
            .set_len(len - tail)
            .unwrap();
        let cut = dir.path().join("cut.safetensors");
        let err = write(&cut, OutputFormat::Safetensors, &ckpt.out_tensors(), opts())
            .unwrap_err()
            .to_string();
        assert!(err.contains("mid"), "{err}");
        assert!(err.contains("ended after"), "{err}");
        assert!(!cut.exists());
    }
}
