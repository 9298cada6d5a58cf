//! The in-place path of depthwise convolutions: 3x3 and 5x5 kernels read from the input
//! planes with AVX-512 masked loads.

use std::mem::MaybeUninit;

use super::{Path, PlaneGeometry};
use crate::ops::conv::Act;

/// One output plane of a depthwise convolution read from its input plane in place
/// ([`plane_avx512`]), on a CPU, kernel and stride [`Path::in_place_applies`] found able,
/// activated by `act`. Writes every value of `dst`. Relu and hardswish (and silu after a
/// 3x3 kernel) are applied to the sums in registers as they are stored; silu after a 5x5
/// kernel is a pass of its own over the plane (in the cache) afterwards: applied in
/// registers, its constants left those kernels short of registers (EfficientNet-B0's 144
/// channels 5x5 at stride 2 on 56 x 56, 1 thread: 0.29 -> 0.33 ms), where a pass of its own
/// had been a tenth of a 3x3 kernel's samples (relu; BENCHMARKS.md, issue 14).
pub(super) fn plane_in_place(
    dst: &mut [MaybeUninit<f32>],
    src: &[f32],
    ker: &[f32],
    bias: f32,
    act: Act,
    g: &PlaneGeometry,
) {
    let ([h, wd], [kh, kw], [oh, ow]) = ([g.h, g.wd], g.k, [g.oh, g.ow]);
    assert!(
        Path::in_place_applies(g.stride, g.k, g.dilation)
            && src.len() == h * wd
            && dst.len() == oh * ow
            && ker.len() == kh * kw,
        "depthwise in place: a kernel, stride or CPU it does not take"
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU has the features, the kernel is 3x3 or 5x5 at dilation 1 and equal
    // strides of 1 or 2, and the slices have the lengths the function requires (all
    // asserted); `plane_avx512` writes every value of `dst`, which may then be read.
    #[allow(unsafe_code)]
    unsafe {
        match (kh, g.stride[0]) {
            (3, 1) => plane_avx512::<3, 3, 1>(dst, src, ker, bias, act, g),
            (3, _) => plane_avx512::<3, 3, 2>(dst, src, ker, bias, act, g),
            (5, 1) => plane_avx512::<5, 5, 1>(dst, src, ker, bias, act, g),
            _ => plane_avx512::<5, 5, 2>(dst, src, ker, bias, act, g),
        }
        if !stored_activated(act, kh) {
            act.apply(crate::ops::fused::assume_written(dst));
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    panic!("depthwise in place: only on x86-64 with AVX-512");
}

/// Whether [`plane_avx512`] applies `act` to the sums as it stores them (relu and hardswish,
/// and silu after a `kh x kh` kernel of 3): else the caller applies it to the written plane.
fn stored_activated(act: Act, kh: usize) -> bool {
    match act {
        Act::Relu | Act::Hardswish => true,
        Act::Silu => kh == 3,
        Act::None => false,
    }
}

/// [`plane_in_place`] for a `KH x KW` kernel at stride `S` (1 or 2): the output in chunks of
/// 16 pixels of a row, four rows of a chunk (eight for 3x3 at stride 1) summed together in
/// registers, with the kernel's weights held in registers too (most of them). Each input
/// row those rows need is read once and added into every output row it reaches: at stride
/// 1 once per tap column, 16 contiguous values; at stride 2 once for all tap columns, 32
/// values and the few after them, split into even and odd columns, each tap column's 16
/// values the evens or odds moved along by a lane or two (two loads per tap column, as
/// before, took about 40% of the 3x3 kernel's time).
/// The reads are masked loads that leave out the values outside the row (the padding; rows
/// outside the plane are skipped): no padded copy is made, and each chunk is stored straight
/// into `dst` (masked where the row ends), activated first by `act` where
/// [`stored_activated`] says so (any other activation is left to the caller): every value
/// written once, none read, so its memory need not be initialised.
///
/// # Safety
/// AVX-512F and FMA; `g`'s kernel `KH x KW` (3x3 or 5x5), both strides `S` (1 or 2),
/// dilation 1; `src.len() == h * wd`, `dst.len() == oh * ow`,
/// `ker.len() == KH * KW` for `g`'s sizes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
#[allow(unsafe_code)]
unsafe fn plane_avx512<const KH: usize, const KW: usize, const S: usize>(
    dst: &mut [MaybeUninit<f32>],
    src: &[f32],
    ker: &[f32],
    bias: f32,
    act: Act,
    g: &PlaneGeometry,
) {
    use std::arch::x86_64::*;
    // Its spills (a few registers) on whole cache lines.
    crate::ops::tile::align_frame();
    const P: usize = 8;
    // Output rows summed together: eight for a 3x3 kernel at stride 1 (ten input rows read
    // for eight output rows, not six for four), else four (for a 5x5 kernel at stride 2,
    // eleven input rows, some of its 25 weights then read from the stack, where two output
    // rows had left it short of independent sums). Against four and two rows, with the
    // activations in registers, 1 thread, batch 1: torchvision's MobileNetV3-Large's 5x5
    // layer at stride 2 0.079 -> 0.059 ms; single convolutions exported alone (shaped as
    // those models' layers) 0.85-0.90x for 3x3 (144 channels on 56 x 56) and 0.88x for
    // 5x5 at stride 2 (144 and 72 channels, 56 -> 28). Both changes together took
    // EfficientNet-B0's and MobileNetV3's 3x3 layers 0.86-0.94x their time (BENCHMARKS.md,
    // issue 14). Six rows for a 5x5 kernel at stride 1 were not faster.
    let rows = if S == 1 && KH == 3 { P } else { 4 };
    assert!(S * (rows - 1) + KH <= 11);
    let activate = stored_activated(act, KH);
    let ([h, wd], [oh, ow], [ph, pw]) = ([g.h as isize, g.wd as isize], [g.oh, g.ow], g.pad);
    // Lanes `lo..hi` of a 16-lane mask (none if `hi <= lo`).
    let lanes = |lo: isize, hi: isize| -> __mmask16 {
        let (lo, hi) = (lo.clamp(0, 16), hi.clamp(0, 16));
        if hi <= lo {
            0
        } else {
            (((1u32 << hi) - 1) & !((1u32 << lo) - 1)) as u16
        }
    };
    let mut w = [[_mm512_setzero_ps(); KW]; KH];
    for (i, row) in w.iter_mut().enumerate() {
        for (j, w) in row.iter_mut().enumerate() {
            *w = _mm512_set1_ps(ker[i * KW + j]);
        }
    }
    let b = _mm512_set1_ps(bias);
    // The even and odd lanes of two registers (stride 2).
    let evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odds = _mm512_add_epi32(evens, _mm512_set1_epi32(1));
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr().cast::<f32>());
    for y in (0..oh).step_by(rows) {
        let n = rows.min(oh - y);
        for x0 in (0..ow).step_by(16) {
            // Per tap column: the first input column it reads, and the lanes of each of the
            // (at most two) loads that lie inside the row.
            let mut cols = [(0isize, 0 as __mmask16); KW];
            for (j, c) in cols.iter_mut().enumerate() {
                let c0 = (S * x0 + j) as isize - pw as isize;
                *c = (c0, lanes(-c0, wd - c0));
            }
            // Stride 2: the first column read, and the lanes inside the row of its three loads
            // (of the third, the first three lanes at most are used).
            let c2 = (S * x0) as isize - pw as isize;
            let m2 = [0, 16, 32].map(|at| lanes(-c2 - at, wd - c2 - at));
            let m2 = [m2[0], m2[1], m2[2] & 0b111];
            let mut acc = [b; P];
            // Input row `r` (of the rows `S * y - ph ..`) feeds output row `k` by the
            // kernel's row `i = r - S * k`. Written out per `r` (a literal), so that every
            // index of `acc` is a constant and the sums stay in registers.
            macro_rules! input_row {
                ($($r:literal)*) => {$({
                    let r: usize = $r;
                    let iy = (S * y + r) as isize - ph as isize;
                    if r < S * (n - 1) + KH && iy >= 0 && iy < h {
                        // Only lanes inside the row are read (a masked load touches no
                        // other), so the addresses may lie outside the plane.
                        let vs: [__m512; KW] = if S == 1 {
                            cols.map(|(c0, m)| {
                                _mm512_maskz_loadu_ps(m, s.wrapping_offset(iy * wd + c0))
                            })
                        } else {
                            let at = s.wrapping_offset(iy * wd + c2);
                            let [lo, hi, ex] = [0, 1, 2]
                                .map(|i| _mm512_maskz_loadu_ps(m2[i], at.wrapping_add(16 * i)));
                            let e = _mm512_permutex2var_ps(lo, evens, hi);
                            let o = _mm512_permutex2var_ps(lo, odds, hi);
                            // The columns after the 32: even ones, then odd ones.
                            let ee = _mm512_castps_si512(_mm512_permutexvar_ps(evens, ex));
                            let oe = _mm512_castps_si512(_mm512_permutexvar_ps(odds, ex));
                            let (e, o) = (_mm512_castps_si512(e), _mm512_castps_si512(o));
                            // Tap column `j` reads columns `c2 + j + 2 * lane`.
                            std::array::from_fn(|j| {
                                _mm512_castsi512_ps(match j {
                                    0 => e,
                                    1 => o,
                                    2 => _mm512_alignr_epi32::<1>(ee, e),
                                    3 => _mm512_alignr_epi32::<1>(oe, o),
                                    _ => _mm512_alignr_epi32::<2>(ee, e),
                                })
                            })
                        };
                        for (j, &v) in vs.iter().enumerate() {
                            for k in 0..rows {
                                if r >= S * k && r - S * k < KH {
                                    let i = r - S * k;
                                    acc[k] = _mm512_fmadd_ps(w[i][j], v, acc[k]);
                                }
                            }
                        }
                    }
                })*};
            }
            // Rows 0 .. S * (rows - 1) + KH (at most 11, asserted above).
            input_row!(0 1 2 3 4 5 6 7 8 9 10);
            let keep = lanes(0, (ow - x0) as isize);
            for (k, &a) in acc.iter().enumerate().take(n) {
                let a = match activate {
                    true => act.apply_m512(a),
                    false => a,
                };
                _mm512_mask_storeu_ps(d.add((y + k) * ow + x0), keep, a);
            }
        }
    }
}
