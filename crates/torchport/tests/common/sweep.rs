//! The hostile-input checks every reader's tests run: a manifest of crafted files, each with
//! the one-line error it must get ([`check_cases`]); every truncation of a real fixture
//! ([`truncations`]); and deterministic byte mutations of them ([`mutations`]). A damaged file
//! either fails cleanly or reads back exactly what the intact file holds — never a panic,
//! never different numbers.

use std::path::Path;
use std::time::Instant;

use torchport::{Checkpoint, Limits};

use super::fixtures::fixture_dir;

/// A crafted file and the words its error must contain.
pub type Case = (&'static str, &'static [&'static str]);

/// The crafted files of `tests/fixtures/<sub>/`: its `manifest.json` lists exactly the files
/// of `cases`, and every file of the folder but the manifest and `helpers` (files the cases
/// refer to) is in it. Opening each case fails with one line that names the file and holds
/// each of its words.
pub fn check_cases(sub: &str, cases: &[Case], helpers: &[&str]) {
    let folder = fixture_dir(sub);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(folder.join("manifest.json")).unwrap()).unwrap();
    let listed = manifest.as_object().unwrap();
    assert_eq!(listed.len(), cases.len(), "every file of {sub} has a case");
    for e in std::fs::read_dir(&folder).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if p.is_file() && name != "manifest.json" && !helpers.contains(&name.as_str()) {
            assert!(listed.contains_key(&name), "{name} is not in the manifest");
        }
    }
    for (file, words) in cases {
        assert!(listed.contains_key(*file), "{file} is not in the manifest");
        let start = Instant::now();
        let err = torchport::open(folder.join(file))
            .expect_err(file)
            .to_string();
        println!("{file}: {:?}: {err}", start.elapsed());
        assert!(
            err.contains(file),
            "{file}: the error names the file: {err}"
        );
        for w in *words {
            assert!(err.contains(w), "{file}: expected {w:?} in: {err}");
        }
        assert!(!err.contains('\n'), "{file}: one line: {err}");
    }
}

/// All tensor data of a checkpoint (`None` where a tensor cannot be read), for comparing a
/// damaged file with the intact one.
pub fn contents(c: &Checkpoint) -> Vec<(String, Option<Vec<u8>>)> {
    c.tensors()
        .iter()
        .map(|t| (t.name.clone(), c.data(t).ok().map(|d| d.into_owned())))
        .collect()
}

/// Open `bytes` as the file `label`. A sharded index (`*.index.json`) is opened by path,
/// written into a temporary copy of its folder: read from memory it would have no folder to
/// find its shards in. Anything else is read from memory.
pub fn open_as(label: &str, bytes: Vec<u8>) -> torchport::Result<Checkpoint> {
    if !label.ends_with(".index.json") {
        return torchport::open_bytes(label, bytes, &Limits::default());
    }
    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let p = e.unwrap().path();
            let dest = to.join(p.file_name().unwrap());
            if p.is_dir() {
                copy_dir(&p, &dest);
            } else {
                std::fs::copy(&p, &dest).unwrap();
            }
        }
    }
    let label = Path::new(label);
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(label.parent().unwrap(), tmp.path());
    let path = tmp.path().join(label.file_name().unwrap());
    std::fs::write(&path, bytes).unwrap();
    torchport::open(&path)
}

/// Files named `names` in `tests/fixtures/<sub>/`, each labelled with its name, for
/// [`truncations`] and [`mutations`].
pub fn read(sub: &str, names: &[&str]) -> Vec<(String, Vec<u8>)> {
    let folder = fixture_dir(sub);
    names
        .iter()
        .map(|n| (n.to_string(), std::fs::read(folder.join(n)).unwrap()))
        .collect()
}

/// Prefixes of each `(label, bytes)` file, opened as `label` ([`open_as`]): every one, or
/// with `about` given every `len / about`-th. Each is an error or (only where the cut
/// removed nothing the format needs) exactly the intact file's tensors. Returns (cuts
/// tried, cuts that still opened), over all files.
pub fn truncations(files: &[(String, Vec<u8>)], about: Option<usize>) -> (usize, usize) {
    let (mut checked, mut opened) = (0, 0);
    for (label, full) in files {
        let intact = contents(&open_as(label, full.clone()).unwrap());
        let step = about.map_or(1, |n| (full.len() / n).max(1));
        for cut in (0..full.len()).step_by(step) {
            if let Ok(c) = open_as(label, full[..cut].to_vec()) {
                assert_eq!(
                    contents(&c),
                    intact,
                    "{label} cut at {cut} read different data"
                );
                opened += 1;
            }
            checked += 1;
        }
    }
    (checked, opened)
}

/// A deterministic xorshift64 generator, so every run mutates the same bytes.
pub struct Rng(pub u64);

impl Rng {
    /// The next number.
    pub fn draw(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// `count` copies of each `(label, bytes)` file, each copy with 1 to 4 bytes replaced (by an
/// [`Rng`] seeded with `seed`, one sequence through all files), opened as `label`
/// ([`open_as`]); of each that opens every tensor is read. Nothing may panic (a mutated file that
/// opens may hold other numbers: its bytes changed). Returns (copies tried, copies that
/// still opened).
pub fn mutations(files: &[(String, Vec<u8>)], count: usize, seed: u64) -> (usize, usize) {
    let mut rng = Rng(seed);
    let (mut tried, mut opened) = (0, 0);
    for (label, full) in files {
        for _ in 0..count {
            let mut m = full.clone();
            for _ in 0..(rng.draw() % 4 + 1) {
                let at = (rng.draw() as usize) % m.len();
                m[at] = rng.draw() as u8;
            }
            if let Ok(c) = open_as(label, m) {
                opened += 1;
                let _ = contents(&c);
            }
            tried += 1;
        }
    }
    (tried, opened)
}
