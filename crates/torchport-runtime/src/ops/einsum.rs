//! `einsum(equation, tensors)`: operands contracted pairwise, left to right, each pair as one
//! batched matrix product (batch letters, the left operand's own, the letters summed, the
//! right operand's own); letters only one operand has and nothing later needs are summed
//! first. Ellipses, implicit outputs (`"ij,jk"`) and spaces are accepted; a letter repeated
//! within one operand (a diagonal) is refused.

use candle_core::{DType, Tensor};

use super::strided::contiguous;
use super::{float, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs};

/// Register the kernel.
pub fn register(r: &mut Registry) {
    r.add("aten.einsum.default", einsum);
}

/// A tensor with one letter per dim.
struct Term {
    t: Tensor,
    letters: Vec<char>,
}

fn einsum(a: &Args) -> OpResult<Outputs> {
    let eq: String = a
        .str_or("equation", "")?
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let tensors = a.tensors("tensors")?;
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (eq.clone(), None),
    };
    let specs: Vec<&str> = lhs.split(',').collect();
    if specs.len() != tensors.len() || tensors.is_empty() {
        op_bail!(
            "einsum '{eq}' names {} operands, {} given",
            specs.len(),
            tensors.len()
        );
    }
    // Ellipsis dims get letters of their own, aligned from the right as torch broadcasts.
    let ell_rank = specs
        .iter()
        .zip(&tensors)
        .filter(|(s, _)| s.contains("..."))
        .map(|(s, t)| (t.rank() + 3).saturating_sub(s.chars().count()))
        .max()
        .unwrap_or(0);
    let ell: Vec<char> = (0..ell_rank)
        .map(|i| char::from_u32(0x100 + i as u32).unwrap_or('?'))
        .collect();
    let mut terms = Vec::new();
    for (spec, t) in specs.iter().zip(&tensors) {
        let letters = expand(spec, t.rank(), &ell)?;
        if letters.len() != t.rank() {
            op_bail!(
                "einsum operand '{spec}' has {} dims, the tensor {}",
                letters.len(),
                t.rank()
            );
        }
        let mut seen = letters.clone();
        seen.sort_unstable();
        if seen.windows(2).any(|w| w[0] == w[1]) {
            op_bail!("einsum '{eq}': a letter repeated within one operand is not supported");
        }
        terms.push(Term {
            t: float(t)?,
            letters,
        });
    }
    let out: Vec<char> = match rhs {
        Some(r) => expand(&r, ell.len() + r.replace("...", "").chars().count(), &ell)?,
        None => {
            // Implicit output: ellipsis dims, then the letters used once, in order.
            let mut once: Vec<char> = specs
                .iter()
                .flat_map(|s| s.chars())
                .filter(|c| c.is_alphabetic())
                .collect();
            once.sort_unstable();
            let counts = |c: char| once.iter().filter(|&&x| x == c).count();
            let mut v = ell.clone();
            let mut singles: Vec<char> = once.iter().copied().filter(|&c| counts(c) == 1).collect();
            singles.dedup();
            v.extend(singles);
            v
        }
    };
    // Contract left to right; each step keeps the letters the output or a later operand needs.
    let mut acc = terms.remove(0);
    while !terms.is_empty() {
        let right = terms.remove(0);
        let mut needed = out.clone();
        needed.extend(terms.iter().flat_map(|t| t.letters.iter().copied()));
        acc = contract(acc, right, &needed)?;
    }
    let acc = sum_unneeded(acc, &out)?;
    // In the output's order (a letter no operand kept is an error).
    let perm: Vec<usize> = out
        .iter()
        .map(|c| acc.letters.iter().position(|l| l == c))
        .collect::<Option<_>>()
        .ok_or_else(|| {
            crate::error::OpError(format!("einsum '{eq}': an output letter is in no operand"))
        })?;
    one(contiguous(&acc.t.permute(perm)?)?)
}

/// The letters of one operand spec, its ellipsis expanded to the last `rank - named` of `ell`.
fn expand(spec: &str, rank: usize, ell: &[char]) -> OpResult<Vec<char>> {
    let named = spec.replace("...", "");
    if named.chars().any(|c| !c.is_ascii_alphabetic()) {
        op_bail!("einsum subscript '{spec}' has characters other than letters and '...'");
    }
    Ok(match spec.split_once("...") {
        None => named.chars().collect(),
        Some((before, after)) => {
            let n = rank.saturating_sub(named.chars().count()).min(ell.len());
            let mut v: Vec<char> = before.chars().collect();
            v.extend(&ell[ell.len() - n..]);
            v.extend(after.chars());
            v
        }
    })
}

/// Sum out the letters of `t` that `keep` does not hold.
fn sum_unneeded(mut t: Term, keep: &[char]) -> OpResult<Term> {
    for i in (0..t.letters.len()).rev() {
        if !keep.contains(&t.letters[i]) {
            t.t = t.t.sum(i)?;
            t.letters.remove(i);
        }
    }
    Ok(t)
}

/// Contract two terms into one holding the letters `needed` (later operands and output) has.
fn contract(l: Term, r: Term, needed: &[char]) -> OpResult<Term> {
    let both = |c: &char| l.letters.contains(c) && r.letters.contains(c);
    let keep_l: Vec<char> = l
        .letters
        .iter()
        .copied()
        .filter(|c| both(c) || needed.contains(c))
        .collect();
    let keep_r: Vec<char> = r
        .letters
        .iter()
        .copied()
        .filter(|c| both(c) || needed.contains(c))
        .collect();
    let l = sum_unneeded(l, &keep_l)?;
    let r = sum_unneeded(r, &keep_r)?;
    let batch: Vec<char> = l
        .letters
        .iter()
        .copied()
        .filter(|c| r.letters.contains(c) && needed.contains(c))
        .collect();
    let summed: Vec<char> = l
        .letters
        .iter()
        .copied()
        .filter(|c| r.letters.contains(c) && !needed.contains(c))
        .collect();
    let left: Vec<char> = l
        .letters
        .iter()
        .copied()
        .filter(|c| !r.letters.contains(c))
        .collect();
    let right: Vec<char> = r
        .letters
        .iter()
        .copied()
        .filter(|c| !l.letters.contains(c))
        .collect();
    let size = |t: &Term, c: char| {
        t.letters
            .iter()
            .position(|&x| x == c)
            .map(|i| t.t.dims()[i])
    };
    // A letter shared by both with size 1 on one side broadcasts, as torch does.
    let dim = |c: char| size(&l, c).unwrap_or(1).max(size(&r, c).unwrap_or(1));
    let arrange = |t: &Term, order: Vec<char>| -> OpResult<Tensor> {
        let perm: Vec<usize> = order
            .iter()
            .filter_map(|c| t.letters.iter().position(|x| x == c))
            .collect();
        let shape: Vec<usize> = order
            .iter()
            .map(|&c| if t.letters.contains(&c) { dim(c) } else { 1 })
            .collect();
        Ok(contiguous(&t.t.permute(perm)?.broadcast_as(shape)?)?)
    };
    // Each operand as a view of its batch letters' dims, then its two other groups of
    // letters as one dim each where each group has at most one letter: the runtime's
    // batched product reads such views in place (a transposed key, say), with no copy.
    let view = |t: &Term, rows: &[char], cols: &[char]| -> OpResult<Option<Tensor>> {
        if rows.len() > 1 || cols.len() > 1 || t.t.dtype() != DType::F32 {
            return Ok(None);
        }
        let order = [&batch[..], rows, cols].concat();
        let perm: Vec<usize> = (order.iter())
            .filter_map(|c| t.letters.iter().position(|x| x == c))
            .collect();
        let shape: Vec<usize> = order.iter().map(|&c| dim(c)).collect();
        let mut v = t.t.permute(perm)?.broadcast_as(shape)?;
        if rows.is_empty() {
            v = v.unsqueeze(batch.len())?;
        }
        if cols.is_empty() {
            v = v.unsqueeze(v.rank())?;
        }
        Ok(Some(v))
    };
    let views = (view(&l, &left, &summed)?, view(&r, &summed, &right)?);
    let direct = match views {
        (Some(lv), Some(rv)) => super::linalg::batched_f32(&lv, &rv),
        _ => None,
    };
    let y = match direct {
        Some(y) => y,
        None => {
            let prod = |cs: &[char]| cs.iter().map(|&c| dim(c)).product::<usize>();
            let (nb, nl, ns, nr) = (prod(&batch), prod(&left), prod(&summed), prod(&right));
            let lm = arrange(&l, [batch.clone(), left.clone(), summed.clone()].concat())?
                .reshape((nb, nl, ns))?;
            let rm = arrange(&r, [batch.clone(), summed.clone(), right.clone()].concat())?
                .reshape((nb, ns, nr))?;
            match super::linalg::batched_f32(&lm, &rm) {
                Some(y) => y,
                None => lm.matmul(&rm)?,
            }
        }
    };
    let letters = [batch, left, right].concat();
    let shape: Vec<usize> = letters.iter().map(|&c| dim(c)).collect();
    Ok(Term {
        t: y.reshape(shape)?,
        letters,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn einsum_of(eq: &str, ts: &[&Tensor]) -> Tensor {
        let names: Vec<String> = (0..ts.len()).map(|i| format!("t{i}")).collect();
        let list: Vec<serde_json::Value> = names.iter().map(|n| json!({ "name": n })).collect();
        let args = [
            ("equation", json!({ "as_string": eq })),
            ("tensors", json!({ "as_tensors": list })),
        ];
        let env: Vec<(&str, Tensor)> = (names.iter().map(String::as_str))
            .zip(ts.iter().map(|&t| t.clone()))
            .collect();
        let out = super::super::run_node(register, "aten.einsum.default", &args, &env).unwrap();
        match out.into_iter().next() {
            Some(crate::value::Value::Tensor(t)) => t,
            _ => panic!("einsum gives one tensor"),
        }
    }

    fn assert_close(got: &Tensor, want: &Tensor, what: &str) {
        assert_eq!(got.dims(), want.dims(), "{what}");
        let diff = super::super::max_abs_diff(got, want);
        assert!(diff < 1e-5, "{what}: {diff}");
    }

    /// Products whose operands the batched product reads in place (a transposed key, a
    /// batch letter broadcast from size 1, a vector on either side, one matrix), and one
    /// that needs copies (two letters summed), equal candle's matmul of the same operands
    /// arranged by hand.
    #[test]
    fn products_equal_candles_matmul() {
        let dev = candle_core::Device::Cpu;
        let t = |s: &[usize]| Tensor::randn(0f32, 1., s.to_vec(), &dev).unwrap();
        let (q, k) = (t(&[2, 3, 7, 5]), t(&[2, 3, 6, 5]));
        let want = q
            .matmul(&k.transpose(2, 3).unwrap().contiguous().unwrap())
            .unwrap();
        assert_close(&einsum_of("bhpd,bhqd->bhpq", &[&q, &k]), &want, "q k^T");
        let want = want.transpose(2, 3).unwrap().contiguous().unwrap();
        assert_close(&einsum_of("bhpd,bhqd->bhqp", &[&q, &k]), &want, "(q k^T)^T");
        let k1 = t(&[1, 3, 6, 5]);
        let kb = k1.broadcast_as((2, 3, 6, 5)).unwrap().contiguous().unwrap();
        let want = q
            .matmul(&kb.transpose(2, 3).unwrap().contiguous().unwrap())
            .unwrap();
        assert_close(
            &einsum_of("bhpd,bhqd->bhpq", &[&q, &k1]),
            &want,
            "broadcast",
        );
        let (a, v) = (t(&[4, 7]), t(&[7]));
        let want = a
            .matmul(&v.unsqueeze(1).unwrap())
            .unwrap()
            .squeeze(1)
            .unwrap();
        assert_close(&einsum_of("ij,j->i", &[&a, &v]), &want, "vector");
        let (u, m) = (t(&[3, 7]), t(&[3, 7, 4]));
        let want = u
            .unsqueeze(1)
            .unwrap()
            .matmul(&m)
            .unwrap()
            .squeeze(1)
            .unwrap();
        assert_close(&einsum_of("bj,bjk->bk", &[&u, &m]), &want, "batched vector");
        let b = t(&[5, 7]);
        let want = a.matmul(&b.t().unwrap().contiguous().unwrap()).unwrap();
        assert_close(&einsum_of("ik,jk->ij", &[&a, &b]), &want, "one matrix");
        let (x, y) = (t(&[3, 4, 5]), t(&[4, 5, 6]));
        let want = x
            .reshape((3, 20))
            .unwrap()
            .matmul(&y.reshape((20, 6)).unwrap())
            .unwrap();
        assert_close(&einsum_of("iab,abj->ij", &[&x, &y]), &want, "two summed");
        // The same, each operand's letters in another order (arranged by a permute).
        let (xp, yp) = (x.permute((1, 2, 0)).unwrap(), y.permute((2, 0, 1)).unwrap());
        let (xp, yp) = (xp.contiguous().unwrap(), yp.contiguous().unwrap());
        let got = einsum_of("abi,jab->ij", &[&xp, &yp]);
        assert_close(&got, &want, "two summed, permuted");
    }
}
