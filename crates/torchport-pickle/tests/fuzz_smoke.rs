//! A small deterministic fuzz loop: 20k inputs (random opcode programs and mutated corpus
//! files) must each come back as Ok or Err, never a panic, and every Ok arena must be
//! internally consistent. The real fuzzer lives in the workspace's fuzz/ crate.

use std::fs;
use std::path::PathBuf;

use torchport_pickle::{opcodes, parse, Limits, Pickle};

/// xorshift64: deterministic, no dependencies.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

fn random_program(rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::new();
    if rng.below(2) == 0 {
        out.extend([opcodes::PROTO, rng.below(7) as u8]);
    }
    for _ in 0..rng.below(40) {
        out.push(opcodes::ALL[rng.below(opcodes::ALL.len())]);
        match rng.below(5) {
            0 => {}
            1 => (0..rng.below(9)).for_each(|_| out.push(rng.byte())),
            2 => {
                (0..rng.below(6)).for_each(|_| out.push(b"0123456789-L'\\ux"[rng.below(16)]));
                out.push(b'\n');
            }
            3 => {
                let n = rng.below(6);
                out.extend((n as u32).to_le_bytes());
                (0..n).for_each(|_| out.push(rng.byte()));
            }
            _ => out.push(rng.below(4) as u8),
        }
    }
    if rng.below(4) != 0 {
        out.push(opcodes::STOP);
    }
    out
}

fn mutate(rng: &mut Rng, base: &[u8]) -> Vec<u8> {
    let mut out = base.to_vec();
    for _ in 0..=rng.below(4) {
        let len = out.len();
        let i = rng.below(len);
        match rng.below(6) {
            0 if len > 0 => out[i] ^= 1 << rng.below(8),
            1 if len > 0 => out[i] = rng.byte(),
            2 if len > 0 => out[i] = opcodes::ALL[rng.below(opcodes::ALL.len())],
            3 => out.insert(i.min(len), rng.byte()),
            4 if len > 0 => {
                out.remove(i);
            }
            _ => {
                let start = rng.below(len);
                let end = (start + rng.below(16)).min(len);
                let piece = out[start..end].to_vec();
                let at = rng.below(len + 1);
                out.splice(at..at, piece);
            }
        }
    }
    if rng.below(8) == 0 {
        let keep = rng.below(out.len() + 1);
        out.truncate(keep);
    }
    out
}

/// Every id stored in the arena refers to a node of the arena.
fn check_arena(p: &Pickle) {
    if let Some(v) = p.first_dangling() {
        panic!("a node refers outside the arena: {v:?}");
    }
}

#[test]
fn random_inputs_never_panic() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("corpus");
    let mut seeds: Vec<Vec<u8>> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pkl"))
        .map(|p| fs::read(p).unwrap())
        .filter(|b| b.len() <= 2048)
        .collect();
    seeds.sort();
    assert!(seeds.len() > 100);

    let limits = Limits {
        max_nodes: 100_000,
        ..Limits::default()
    };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut oks, mut errs) = (0usize, 0usize);
    for i in 0..20_000 {
        let input = if i % 2 == 0 {
            random_program(&mut rng)
        } else {
            let k = rng.below(seeds.len());
            mutate(&mut rng, &seeds[k])
        };
        match parse(&input, &limits) {
            Ok(p) => {
                check_arena(&p);
                oks += 1;
            }
            Err(e) => {
                assert!(e.offset <= input.len() as u64, "{e} for {input:?}");
                assert!(!e.to_string().is_empty());
                errs += 1;
            }
        }
    }
    println!("{oks} parsed, {errs} refused");
    assert_eq!(oks + errs, 20_000);
    assert!(
        oks > 500 && errs > 5_000,
        "{oks} ok / {errs} err: the generator is not exercising both paths"
    );
}
