//! TorchScript and torch.export fixtures, compared with what torch itself holds (written by
//! `tests/fixtures/gen/gen_archives.py` as `<file>.expected.json` + `.expected.bin`): format,
//! tensor names in state_dict order, dtypes, shapes, every byte, the tensors kept out of
//! state_dict (values), the TorchScript module tree and the `.pt2` graph's op counts.

mod common;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::PathBuf;

use common::fixtures::{check_tensors, check_values, expected_files, fixture_dir, Expected};
use torchport::{Checkpoint, Limits};

fn fixtures() -> PathBuf {
    fixture_dir("archives")
}

/// Compare one opened archive with torch's answer; returns the number of tensors checked.
fn check(ckpt: &Checkpoint, exp: &Expected, ctx: &str) -> usize {
    let checked = check_tensors(ckpt, exp, ctx, |t, _, data, tctx| {
        if t.is_contiguous() && !data.is_empty() {
            assert!(
                matches!(data, Cow::Borrowed(_)),
                "{tctx}: expected zero-copy"
            );
        }
    });
    // Tensors outside state_dict: listed as values, exactly those torch has.
    check_values(ckpt, exp, ctx, true);

    let want = &exp.json;
    match want.get("modules") {
        Some(modules) => {
            let want_modules: Vec<(String, String)> =
                serde_json::from_value(modules.clone()).unwrap();
            assert_eq!(ckpt.modules(), &want_modules[..], "{ctx}: module tree");
        }
        None => assert!(ckpt.modules().is_empty(), "{ctx}: no module tree"),
    }
    match want.get("graph_ops") {
        Some(ops) => {
            let want_ops: BTreeMap<String, usize> = serde_json::from_value(ops.clone()).unwrap();
            let ours: BTreeMap<String, usize> = ckpt.graph_ops().iter().cloned().collect();
            assert_eq!(
                ours.len(),
                ckpt.graph_ops().len(),
                "{ctx}: targets listed once"
            );
            assert_eq!(ours, want_ops, "{ctx}: graph op counts");
        }
        None => assert!(ckpt.graph_ops().is_empty(), "{ctx}: no graph"),
    }
    checked
}

#[test]
fn every_archive_matches_torch() {
    let files = expected_files(&fixtures());
    let mut tensors = 0;
    let mut formats = BTreeMap::new();
    for f in &files {
        let exp = Expected::from_json(f);
        let ckpt = exp.open();
        tensors += check(&ckpt, &exp, &exp.ctx());
        *formats.entry(ckpt.format().name()).or_insert(0) += 1;
    }
    println!(
        "checked {} archives ({formats:?}), {tensors} tensors",
        files.len()
    );
    assert_eq!(formats.get("torchscript"), Some(&3), "{formats:?}");
    assert_eq!(formats.get("pt2"), Some(&4), "{formats:?}");
    assert!(tensors >= 65, "only {tensors} tensors checked");
}

/// The same bytes read from memory give the same answer (owned, not mapped, storages).
#[test]
fn archives_read_from_memory() {
    for f in expected_files(&fixtures()) {
        let exp = Expected::from_json(&f);
        let bytes = std::fs::read(&exp.file).unwrap();
        let name = exp.ctx();
        let ckpt = torchport::open_bytes(&name, bytes, &Limits::default()).unwrap();
        check(&ckpt, &exp, &name);
    }
}

/// The scripted LSTM's weights are named as `nn.LSTM` names them, and its plain tensor
/// attribute is kept out of the tensors.
#[test]
fn scripted_lstm_names() {
    let ckpt = torchport::open(fixtures().join("scripted_lstm.pt")).unwrap();
    let w = ckpt.tensor("lstm.weight_ih_l0").expect("lstm.weight_ih_l0");
    assert_eq!(w.shape, [20, 4]);
    assert!(w.requires_grad);
    assert!(ckpt.tensor("lstm.weight_hh_l1").is_some());
    assert!(ckpt.tensor("offset").is_none());
    assert!(
        ckpt.tensor("proj.bias").is_none(),
        "bias=False is not in state_dict"
    );
    assert!(!ckpt.tensor("scale").unwrap().requires_grad);
}

/// Tensors that alias one raw record in a `.pt2` share its storage.
#[test]
fn pt2_records_are_storages() {
    let ckpt = torchport::open(fixtures().join("cnn.pt2")).unwrap();
    assert_eq!(ckpt.storage_count(), ckpt.tensors().len());
    let fc = ckpt.tensor("fc.weight").unwrap();
    assert!(fc.requires_grad);
    assert!(ckpt.storage(fc).unwrap().is_mapped());
}

/// A `.pt2`'s program is parsed once, at open: `take_program` hands over the typed IR
/// (once), whose nodes are those `graph_ops` counted. One the typed IR refuses (schema major
/// 99) still opens with its ops counted, and is not handed over.
#[test]
fn pt2_programs_are_parsed_once_at_open() {
    let mut programs = 0;
    for f in expected_files(&fixtures()) {
        let exp = Expected::from_json(&f);
        let mut ckpt = exp.open();
        let records: Vec<String> = ckpt.programs().map(|p| p.0.to_string()).collect();
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for r in &records {
            let ep = ckpt
                .take_program(r)
                .unwrap_or_else(|| panic!("{r}: parsed"));
            for n in &ep.graph_module.graph.nodes {
                *counts.entry(n.target.clone()).or_default() += 1;
            }
            assert!(ckpt.take_program(r).is_none(), "{r}: handed over twice");
            programs += 1;
        }
        let ops: BTreeMap<String, usize> = ckpt.graph_ops().iter().cloned().collect();
        assert_eq!(counts, ops, "{}", exp.ctx());
    }
    assert!(programs >= 4, "only {programs} programs");

    let bad = fixture_dir("export").join("bad_version.pt2");
    let mut ckpt = torchport::open(&bad).unwrap();
    assert!(!ckpt.graph_ops().is_empty());
    let record = ckpt.programs().next().unwrap().0.to_string();
    assert!(ckpt.take_program(&record).is_none());
}

/// `open_pt2_unparsed` reads a `.pt2` archive as `open` does (torch's tensors, every byte,
/// and its values) but leaves the programs to the caller: the same records with the same
/// bytes, none handed over and no ops counted; parsed by `pt2::parse_program`, their nodes
/// are those the parsed open counted. An archive whose program is damaged opens so, its
/// tensors listed, where `open` refuses it; the caller's parse then says why.
#[test]
fn pt2_programs_can_be_left_unparsed() {
    let mut programs = 0;
    for f in expected_files(&fixtures()) {
        let exp = Expected::from_json(&f);
        let parsed = exp.open();
        if parsed.format() != torchport::Format::Pt2 {
            continue;
        }
        let ctx = exp.ctx();
        let mut ckpt = torchport::open_pt2_unparsed(&exp.file, &Limits::default()).unwrap();
        check_tensors(&ckpt, &exp, &ctx, |_, _, _, _| {});
        check_values(&ckpt, &exp, &ctx, true);
        assert!(ckpt.graph_ops().is_empty(), "{ctx}: ops counted");
        let records: Vec<(String, Vec<u8>)> = ckpt
            .programs()
            .map(|(r, json)| (r.to_string(), json.to_vec()))
            .collect();
        let want: Vec<(&str, &[u8])> = parsed.programs().collect();
        let got: Vec<(&str, &[u8])> = records.iter().map(|(r, j)| (&r[..], &j[..])).collect();
        assert_eq!(got, want, "{ctx}: program records");
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for (r, json) in &records {
            assert!(ckpt.take_program(r).is_none(), "{ctx}: {r} handed over");
            let ep = torchport::pt2::parse_program(json).unwrap();
            for n in &ep.graph_module.graph.nodes {
                *counts.entry(n.target.clone()).or_default() += 1;
            }
            programs += 1;
        }
        let ops: BTreeMap<String, usize> = parsed.graph_ops().iter().cloned().collect();
        assert_eq!(counts, ops, "{ctx}");
    }
    assert!(programs >= 4, "only {programs} programs");

    let bad = fixture_dir("hostile_archives").join("pt2_corrupt_model.pt2");
    assert!(torchport::open(&bad).is_err());
    let ckpt = torchport::open_pt2_unparsed(&bad, &Limits::default()).unwrap();
    assert!(ckpt.tensor("fc.weight").is_some());
    let json = ckpt.programs().next().unwrap().1;
    let err = torchport::pt2::parse_program(json).unwrap_err().to_string();
    assert!(err.contains("key must be a string at line 1"), "{err}");
}

/// The archive's file format version is read from its `version` record: torch 1.4 wrote 1
/// (its integer `div` truncated), torch 1.8 5, torch 2.15 here 3 (nothing in the LSTM's code
/// needs more).
#[test]
fn torchscript_format_versions() {
    let old = fixture_dir("torchscript_old");
    for (path, want) in [
        (old.join("t14_old_ops.pt"), 1),
        (old.join("t18_steps.pt"), 5),
        (fixtures().join("scripted_lstm.pt"), 3),
    ] {
        let ckpt = torchport::open(&path).unwrap();
        let script = ckpt.script().expect("a TorchScript archive");
        assert_eq!(script.version, Some(want), "{}", path.display());
    }
}
