//! The last few columns of an unpacked product ([`crate::ops::packed`]'s
//! `unpacked_product`) as dot products, on x86-64 CPUs with AVX-512.
//!
//! The microkernel puts a product's columns along its registers, 64 to a panel. Where the
//! columns leave a last panel of a few columns (a 14 x 14 plane's 196 pixels: three panels
//! and 4 columns), that panel's microkernels cost half a full one's for a sixteenth of its
//! work: single 1x1 convolutions of ResNet-50's 256 → 1024 and 1024 → 256 shapes on 14 x 14
//! (exported here alone) took 1.13–1.14x the time of the same ones on 12 x 16 (192 pixels,
//! three full panels) scaled by 196 / 192, and 1.04–1.05x with their last columns computed
//! here; inside torchvision's ResNet-50 those layers took 0.90–0.92 of their time before
//! (medians and least times, 1 thread; BENCHMARKS.md, issue 14). Here each of those columns
//! is copied out whole (its `k` values of a block in a row) and summed against each row of
//! `x` along `k`, four rows by
//! four columns at a time (every load feeds four multiply-adds, as in a full panel), right
//! after the microkernels have run those rows against the last run of panels (a step of
//! rows at a time, in the nearest cache, where the rows are more than run panel by panel);
//! the 16 sums of a block are then added across their lanes together.

use std::ops::Range;

use super::fused::Spare;
use super::packed::Columns;
use super::sgemm::Mat;
use super::tile::{transpose, SIDE as SIDE_TILE};

/// The most last columns computed here: half an AVX-512 register's lanes. A single 1x1
/// convolution of 256 → 1024 channels (exported here on planes chosen for it) with 4, 8, 12
/// and 16 columns after three panels (14 x 14, 10 x 20, 12 x 17 and 13 x 16 planes) took
/// 0.92, 0.94, 0.99 and 1.01 of the time through the microkernel (1 thread; BENCHMARKS.md,
/// issue 14).
pub(crate) const MAX_TAIL: usize = 8;

/// Rows of `x` and columns summed together: 16 sums in registers.
const SIDE: usize = 4;

/// The last columns of a product of `n` columns, in panels of `mr`, computed here (0 for
/// none): a last panel of 1 to [`MAX_TAIL`] columns after whole ones, on a CPU with
/// AVX-512F and FMA. The product's left operand must have contiguous rows as well.
pub(crate) fn tail_of(n: usize, mr: usize) -> usize {
    let tail = n % mr.max(1);
    #[cfg(target_arch = "x86_64")]
    let cpu = std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("fma");
    #[cfg(not(target_arch = "x86_64"))]
    let cpu = false;
    match n > mr && (1..=MAX_TAIL).contains(&tail) && cpu {
        true => tail,
        false => 0,
    }
}

/// Rows `rows` (a block of `k`) of columns `cols` of `b` (`[k, n]`) into `values`, resized:
/// each column's values in a row of its own, as [`sums`] reads them.
pub(crate) fn columns(
    b: &impl Columns,
    rows: Range<usize>,
    cols: Range<usize>,
    values: &mut Vec<f32>,
) {
    let (kb, t) = (rows.len(), cols.len());
    // Packed as one panel `t` wide (`kb` rows of `t`), then transposed a tile at a time.
    let mut panel = Spare::take();
    panel.resize(kb * t, 0.0);
    b.pack(rows, cols, t, &mut panel);
    values.resize(kb * t, 0.0);
    for p in (0..kb).step_by(SIDE_TILE) {
        let rows = SIDE_TILE.min(kb - p);
        transpose(&panel, p * t, t, rows, t, values, p, kb);
    }
}

/// `out = (accumulate ? out : 0) + scale * x @ values.T` for `x: [m, k]` (rows contiguous)
/// and the `t` columns `values` holds ([`columns`]: `[t, k]`), `out` an `[m, t]` block at row
/// stride `ldd`.
///
/// # Safety
///
/// [`tail_of`] gave `t` for the product and `x`'s rows are contiguous; `x` holds `m` rows
/// of `k` values at row stride `x.rs` from its start, `values` holds `t * k` values, `k > 0`,
/// and the block `out` points to is this call's alone.
#[allow(unsafe_code, clippy::too_many_arguments)]
pub(crate) unsafe fn sums(
    (m, t, k): (usize, usize, usize),
    x: Mat,
    values: &[f32],
    out: *mut f32,
    ldd: usize,
    accumulate: bool,
    scale: f32,
) {
    #[cfg(target_arch = "x86_64")]
    for i0 in (0..m).step_by(SIDE) {
        for j0 in (0..t).step_by(SIDE) {
            // SAFETY: the caller's contract (AVX-512F and FMA found by `tail_of`).
            unsafe { sums_avx512((m, t, k), (i0, j0), &x, values, out, ldd, accumulate, scale) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ((m, t, k), x, values, out, ldd, accumulate, scale);
}

/// The sums of rows `i0..i0 + 4` of `x` against columns `j0..j0 + 4` of the tail (`rows`:
/// `t` rows of `k`), as far as `m` and `t` reach, into `out` (the tail's column 0): 16
/// registers of products along `k`, 16 values at a time (the last ones masked), each then
/// summed across its lanes. A block past the last row or column reads the last one again
/// and stores nothing for it.
///
/// # Safety
///
/// AVX-512F and FMA; rows `i0..m` of `x` hold `k` values each at row stride `x.rs`, `rows`
/// holds `t * k` values, and `out` has rows `i0..m` of `t` values at row stride `ldd` that
/// nothing else touches meanwhile.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
#[allow(unsafe_code, clippy::too_many_arguments)]
unsafe fn sums_avx512(
    (m, t, k): (usize, usize, usize),
    (i0, j0): (usize, usize),
    x: &Mat,
    rows: &[f32],
    out: *mut f32,
    ldd: usize,
    accumulate: bool,
    scale: f32,
) {
    use std::arch::x86_64::*;
    let mut xs = [x.data.as_ptr(); SIDE];
    let mut bs = [rows.as_ptr(); SIDE];
    for s in 0..SIDE {
        xs[s] = x.data.as_ptr().add((i0 + s).min(m - 1) * x.rs);
        bs[s] = rows.as_ptr().add((j0 + s).min(t - 1) * k);
    }
    let mut acc = [[_mm512_setzero_ps(); SIDE]; SIDE];
    let whole = k / 16 * 16;
    let mut p = 0;
    while p < whole {
        let mut a = [_mm512_setzero_ps(); SIDE];
        for s in 0..SIDE {
            a[s] = _mm512_loadu_ps(xs[s].add(p));
        }
        for c in 0..SIDE {
            let v = _mm512_loadu_ps(bs[c].add(p));
            for r in 0..SIDE {
                acc[r][c] = _mm512_fmadd_ps(a[r], v, acc[r][c]);
            }
        }
        p += 16;
    }
    if whole < k {
        let mask: __mmask16 = (1u16 << (k - whole)) - 1;
        let mut a = [_mm512_setzero_ps(); SIDE];
        for s in 0..SIDE {
            a[s] = _mm512_maskz_loadu_ps(mask, xs[s].add(whole));
        }
        for c in 0..SIDE {
            let v = _mm512_maskz_loadu_ps(mask, bs[c].add(whole));
            for r in 0..SIDE {
                acc[r][c] = _mm512_fmadd_ps(a[r], v, acc[r][c]);
            }
        }
    }
    // The 16 sums across lanes at once: lane `4 * r + c` of `sums` holds `acc[r][c]`'s.
    let mut each = [[0f32; SIDE]; SIDE];
    _mm512_storeu_ps(each.as_mut_ptr().cast(), lane_sums(acc));
    for (r, row) in each.iter().enumerate().take(m.saturating_sub(i0).min(SIDE)) {
        let dst = out.add((i0 + r) * ldd + j0);
        for (c, &sum) in row.iter().enumerate().take((t - j0).min(SIDE)) {
            let v = scale * sum;
            *dst.add(c) = if accumulate { *dst.add(c) + v } else { v };
        }
    }
}

/// The sum of each register's 16 lanes, `acc[r][c]`'s in lane `4 * r + c`: halves added to
/// halves, two registers' at a time (15 additions and 30 permutations for the 16 sums,
/// where a sum of its own takes four of each).
///
/// # Safety
///
/// AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(unsafe_code)]
unsafe fn lane_sums(acc: [[std::arch::x86_64::__m512; SIDE]; SIDE]) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // Taken column by column (`acc[r][c]` the `4 * c + r`-th): the halvings below leave
    // the `i`-th register's sum in lane `4 * (i % 4) + i / 4`.
    let mut v = [_mm512_setzero_ps(); 16];
    for (i, slot) in v.iter_mut().enumerate() {
        *slot = acc[i % SIDE][i / SIDE];
    }
    // 128-bit quarters: the low two of a pair's registers added to their high two.
    let mut halves = [_mm512_setzero_ps(); 8];
    for (i, h) in halves.iter_mut().enumerate() {
        let (a, b) = (v[2 * i], v[2 * i + 1]);
        *h = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
        );
    }
    let mut quarters = [_mm512_setzero_ps(); 4];
    for (i, q) in quarters.iter_mut().enumerate() {
        let (a, b) = (halves[2 * i], halves[2 * i + 1]);
        *q = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
        );
    }
    // Within each 128-bit quarter: pairs of values, then single values.
    let mut pairs = [_mm512_setzero_ps(); 2];
    for (i, p) in pairs.iter_mut().enumerate() {
        let (a, b) = (quarters[2 * i], quarters[2 * i + 1]);
        *p = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    }
    let (a, b) = (_mm512_castps_pd(pairs[0]), _mm512_castps_pd(pairs[1]));
    _mm512_add_ps(
        _mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
        _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::packed::{unpacked_product, Packing};
    use crate::ops::sgemm::{direct_f64, Finish, Shared};

    /// Products whose last panel has at most [`MAX_TAIL`] columns (1, 4, 7 and 8 after one
    /// and two whole panels; and 16, none, and 5 columns in all, not computed here), through
    /// `unpacked_product` with `x`'s rows contiguous, so that the last columns come here:
    /// against a direct product in f64 (values exact in f32, so the order of the sums does
    /// not matter), rows not a multiple of four and `k` not of 16, more rows than run panel
    /// by panel and more than one block of `k`, written and added (onto 2.0, scaled by 0.5)
    /// into a block inside a wider output whose other columns stay as they were; `finish`
    /// (adding 1000) handed every element once.
    #[test]
    fn last_columns_match_direct_products() {
        let Some(pk) = Packing::detect() else {
            return;
        };
        if tail_of(pk.mr + 1, pk.mr) != 1 {
            return;
        }
        assert!(pk.block(1100) < 1100, "more than one block of k");
        for (m, k) in [(9, 37), (4, 16), (1, 300), (130, 1100)] {
            for n in [
                5,
                pk.mr + 1,
                pk.mr + 4,
                2 * pk.mr + 7,
                2 * pk.mr + 8,
                2 * pk.mr + 16,
                2 * pk.mr,
            ] {
                let xv: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.5 - 1.5).collect();
                let bv: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.5 - 1.0).collect();
                let dots = direct_f64((m, n, k), |i, p| xv[i * k + p], |p, j| bv[p * n + j]);
                for accumulate in [false, true] {
                    let ldd = n + 3;
                    let mut got = vec![2.0f32; m * ldd];
                    let scale = if accumulate { 0.5 } else { 1.0 };
                    let finish = |_: usize, _: usize, row: &mut [f32]| {
                        row.iter_mut().for_each(|v| *v += 1000.0);
                    };
                    // SAFETY: the views fit [m, k] and [k, n], k > 0, and `got` holds the
                    // [m, n] block at row stride n + 3.
                    #[allow(unsafe_code)]
                    unsafe {
                        let out = Shared(got.as_mut_ptr());
                        let (x, b) = (Mat::rows(&xv, k), Mat::rows(&bv, n));
                        let f: Finish = &finish;
                        unpacked_product(
                            &pk,
                            (m, n, k),
                            x,
                            &b,
                            out,
                            ldd,
                            accumulate,
                            scale,
                            Some(f),
                        );
                    }
                    for i in 0..m {
                        for j in 0..ldd {
                            let want = if j < n {
                                let before = if accumulate { 2.0 } else { 0.0 };
                                before + f64::from(scale) * dots[i * n + j] + 1000.0
                            } else {
                                2.0
                            };
                            let at = format!("{m}x{n}x{k} at ({i}, {j}), accumulate {accumulate}");
                            assert_eq!(got[i * ldd + j], want as f32, "{at}");
                        }
                    }
                }
            }
        }
    }
}
