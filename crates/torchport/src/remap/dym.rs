//! "Did you mean": the closest names on the other side of a match report, by edit distance,
//! within a budget of compared pairs so huge mismatches stay quick.

use super::report::{MatchReport, Unmatched};

/// Edit distance (over bytes) of `a` and `b`, if at most `max`; `rows` is scratch space.
/// Only the band of cells within `max` of the diagonal is computed.
pub(crate) fn distance(
    a: &[u8],
    b: &[u8],
    max: usize,
    rows: &mut (Vec<usize>, Vec<usize>),
) -> Option<usize> {
    const FAR: usize = usize::MAX / 2;
    let (n, m) = (a.len(), b.len());
    if n.abs_diff(m) > max {
        return None;
    }
    let (prev, cur) = rows;
    prev.clear();
    prev.resize(m + 1, FAR);
    for (j, p) in prev.iter_mut().enumerate().take(max.min(m) + 1) {
        *p = j;
    }
    cur.clear();
    cur.resize(m + 1, FAR);
    for i in 1..=n {
        let lo = if i > max { i - max } else { 1 };
        let hi = (i + max).min(m);
        cur[lo - 1] = if lo == 1 { i } else { FAR };
        let mut best = cur[lo - 1];
        for j in lo..=hi {
            let sub = prev[j - 1] + usize::from(a[i - 1] != b[j - 1]);
            cur[j] = sub.min(prev[j] + 1).min(cur[j - 1] + 1);
            best = best.min(cur[j]);
        }
        if hi < m {
            cur[hi + 1] = FAR;
        }
        if best > max {
            return None;
        }
        std::mem::swap(prev, cur);
    }
    Some(prev[m]).filter(|&d| d <= max)
}

/// Edit (Levenshtein) distance of two names, over bytes: the fewest one-byte insertions,
/// deletions and substitutions that turn `a` into `b`. The one measure behind every "did
/// you mean" in torchport and its burn and candle front ends.
///
/// ```
/// assert_eq!(torchport::remap::edit_distance("kitten", "sitting"), 3);
/// ```
pub fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    // The distance never exceeds the longer length, so this band is the whole table.
    let max = a.len().max(b.len());
    distance(a, b, max, &mut (Vec::new(), Vec::new())).unwrap_or(max)
}

/// At most this many name pairs are compared for "did you mean" (large models with
/// thousands of unmatched names would otherwise take long); missing names come first.
const PAIR_BUDGET: usize = 100_000;

/// Fill in "did you mean": for each missing name the closest unused names and the other
/// way round (each pair compared once; a pair counts when the edit distance is at most a
/// third of the shorter name, and at least 2).
pub(super) fn did_you_mean(r: &mut MatchReport) {
    let mut budget = PAIR_BUDGET;
    let mut rows = (Vec::new(), Vec::new());
    let mut for_missing: Vec<Vec<(usize, usize)>> = vec![Vec::new(); r.missing.len()];
    let mut for_unused: Vec<Vec<(usize, usize)>> = vec![Vec::new(); r.unused.len()];
    'all: for (mi, m) in r.missing.iter().enumerate() {
        for (ui, u) in r.unused.iter().enumerate() {
            if budget == 0 {
                break 'all;
            }
            budget -= 1;
            let (a, b) = (m.name.as_bytes(), u.name.as_bytes());
            let max = (a.len().min(b.len()) / 3).max(2);
            if let Some(d) = distance(a, b, max, &mut rows) {
                for_missing[mi].push((d, ui));
                for_unused[ui].push((d, mi));
            }
        }
    }
    let names = |found: &mut Vec<(usize, usize)>, other: &[Unmatched]| -> Vec<String> {
        found.sort();
        found
            .iter()
            .take(3)
            .map(|&(_, i)| other[i].name.clone())
            .collect()
    };
    let unused_dym: Vec<Vec<String>> = for_unused
        .iter_mut()
        .map(|f| names(f, &r.missing))
        .collect();
    let missing_dym: Vec<Vec<String>> = for_missing
        .iter_mut()
        .map(|f| names(f, &r.unused))
        .collect();
    for (m, d) in r.missing.iter_mut().zip(missing_dym) {
        m.did_you_mean = d;
    }
    for (u, d) in r.unused.iter_mut().zip(unused_dym) {
        u.did_you_mean = d;
    }
}

#[cfg(test)]
mod tests {
    use super::{distance, edit_distance};

    fn plain(a: &[u8], b: &[u8]) -> usize {
        let mut prev: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.iter().enumerate() {
            let mut cur = vec![i + 1; b.len() + 1];
            for (j, cb) in b.iter().enumerate() {
                cur[j + 1] = (prev[j] + usize::from(ca != cb))
                    .min(prev[j + 1] + 1)
                    .min(cur[j] + 1);
            }
            prev = cur;
        }
        prev[b.len()]
    }

    #[test]
    fn banded_distance_equals_the_full_table() {
        let words = [
            "",
            "a",
            "ab",
            "fc.weight",
            "fc.bias",
            "fc.weights",
            "model.fc.weight",
            "lstm.weight_ih_l0",
            "lstm.weight_hh_l0",
            "bn.gamma",
            "bn.weight",
            "kitten",
            "sitting",
            "abcdef",
            "fedcba",
        ];
        let mut rows = (Vec::new(), Vec::new());
        for a in words {
            for b in words {
                let d = plain(a.as_bytes(), b.as_bytes());
                assert_eq!(edit_distance(a, b), d, "{a:?} {b:?}");
                for max in 0..8 {
                    let got = distance(a.as_bytes(), b.as_bytes(), max, &mut rows);
                    assert_eq!(got, (d <= max).then_some(d), "{a:?} {b:?} max {max}");
                }
            }
        }
    }
}
