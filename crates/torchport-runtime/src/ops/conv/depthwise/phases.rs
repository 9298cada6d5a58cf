//! The phases path of depthwise convolutions: any kernel, stride and dilation, by the
//! padded input plane split into its stride phases.

use std::mem::MaybeUninit;

use crate::ops::conv::{strided_copy, Act, Params};
use crate::ops::fused::{self, Spare};

/// The geometry of one depthwise convolution's planes (read by every path), and the layout
/// [`depthwise_plane`] works in, the same for every plane.
///
/// The input plane, zero-padded to `[hp, wp]`, is split into `sy * sx` phase planes of
/// `[hq, wq] = [ceil(hp / sy), ceil(wp / sx)]`: phase `(ry, rx)` holds the padded elements
/// `(a * sy + ry, b * sx + rx)` at `(a, b)`. Output `(y, x)` reads, for tap `(i, j)`, the
/// padded element `(y * sy + i * dy, x * sx + j * dx)`; with `i * dy = qy * sy + ry` and
/// `j * dx = qx * sx + rx` that is element `(y + qy, x + qx)` of phase `(ry, rx)`. So, with
/// the output laid out at the phase width `wq`, each tap adds its weight times one
/// contiguous run of one phase plane (offset `qy * wq + qx`) to one contiguous run of the
/// output: a unit-stride multiply-add for any stride and dilation (stride 1 has a single
/// phase, the padded plane itself).
pub(super) struct PlaneGeometry {
    /// Input height and width.
    pub(super) h: usize,
    pub(super) wd: usize,
    /// Output height and width.
    pub(super) oh: usize,
    pub(super) ow: usize,
    pub(super) pad: [usize; 2],
    pub(super) stride: [usize; 2],
    /// Kernel height and width, and dilation.
    pub(super) k: [usize; 2],
    pub(super) dilation: [usize; 2],
    /// Phase-plane height and width.
    hq: usize,
    wq: usize,
    /// Phases that some tap reads, as `(ry, rx)`, in slot order.
    used: Vec<[usize; 2]>,
    /// Per tap (row-major like the kernel): the start of its run in the phase buffer.
    tap_start: Vec<usize>,
}

impl PlaneGeometry {
    /// Scratch for [`depthwise_plane`], zeros: the phase planes (with the zeros the runs
    /// are rounded up over) and the wide output rows. Only the elements that hold input are
    /// written per plane, the same ones for every plane, so the padding stays zero between
    /// planes of one geometry.
    pub(super) fn scratch(&self) -> (Spare, Spare) {
        let len = (self.oh - 1) * self.wq + self.ow;
        let run = len.next_multiple_of(TAP_BLOCK);
        let (mut phases, mut wide) = (Spare::take(), Spare::take());
        for (buf, n) in [
            (
                &mut phases,
                self.used.len() * self.hq * self.wq + (run - len),
            ),
            (&mut wide, run),
        ] {
            buf.clear();
            buf.resize(n, 0.0);
        }
        (phases, wide)
    }

    pub(super) fn new(
        [h, wd]: [usize; 2],
        [kh, kw]: [usize; 2],
        [oh, ow]: [usize; 2],
        p: &Params,
    ) -> Self {
        let [sy, sx] = p.stride.map(|s| s.max(1));
        let [dy, dx] = p.dilation;
        let (hp, wp) = (h + 2 * p.padding[0], wd + 2 * p.padding[1]);
        let (hq, wq) = (hp.div_ceil(sy), wp.div_ceil(sx));
        // For each phase `ry * sx + rx`, its slot in the phase buffer once a tap reads it.
        let mut slot = vec![None; sy * sx];
        let mut used = Vec::new();
        let mut tap_start = Vec::with_capacity(kh * kw);
        for i in 0..kh {
            for j in 0..kw {
                let (qy, ry) = ((i * dy) / sy, (i * dy) % sy);
                let (qx, rx) = ((j * dx) / sx, (j * dx) % sx);
                let s = *slot[ry * sx + rx].get_or_insert_with(|| {
                    used.push([ry, rx]);
                    used.len() - 1
                });
                tap_start.push(s * hq * wq + qy * wq + qx);
            }
        }
        PlaneGeometry {
            h,
            wd,
            oh,
            ow,
            pad: p.padding,
            stride: [sy, sx],
            k: [kh, kw],
            dilation: p.dilation,
            hq,
            wq,
            used,
            tap_start,
        }
    }
}

/// One depthwise plane (any stride, padding and dilation) as `kh * kw` long contiguous
/// multiply-adds over the phase planes of [`PlaneGeometry`], then the valid `ow` columns of
/// each `wq`-wide output row, with activation `act`, written into `dst`. `scratch` holds
/// the phase planes and the wide output rows, buffers reused across planes, from
/// [`PlaneGeometry::scratch`] (only the phases' elements that hold input are written here,
/// so their padding stays zero). The runs stay in bounds: a valid output `(y, x)` reads phase element
/// `(y + qy, x + qx)` with `x + qx < wq` and `y + qy < hq` (its padded coordinates are inside
/// the padded plane), so the run of a tap, `(oh - 1) * wq + ow` long from `qy * wq + qx`, ends
/// inside its phase; the columns `ow..wq` of a row are scratch that is never copied out. The
/// runs are computed rounded up to whole blocks of [`depthwise_taps`] (its AVX-512 path takes
/// whole blocks only), over as many zeros more at the end of `phases`: the outputs past the
/// last valid one are scratch too.
pub(super) fn depthwise_plane(
    dst: &mut [MaybeUninit<f32>],
    src: &[f32],
    ker: &[f32],
    bias: f32,
    act: Act,
    g: &PlaneGeometry,
    (phases, wide): (&mut [f32], &mut [f32]),
) {
    let ([sy, sx], [ph, pw]) = (g.stride, g.pad);
    let (hq, wq) = (g.hq, g.wq);
    for (s, &[ry, rx]) in g.used.iter().enumerate() {
        let phase = &mut phases[s * hq * wq..][..hq * wq];
        // Phase columns b whose padded column b * sx + rx is an input column (>= pw, < pw + wd).
        let b0 = pw.saturating_sub(rx).div_ceil(sx);
        let b1 = (pw + g.wd).saturating_sub(rx).div_ceil(sx).min(wq);
        if b1 <= b0 {
            continue;
        }
        let c0 = b0 * sx + rx - pw;
        for (a, prow) in phase.chunks_mut(wq).enumerate() {
            let r = a * sy + ry;
            if r < ph || r - ph >= g.h {
                continue;
            }
            let row = &src[(r - ph) * g.wd..][..g.wd];
            strided_copy(&mut prow[b0..b1], &row[c0..], sx);
        }
    }
    depthwise_taps(wide, phases, ker, &g.tap_start, bias);
    for (y, row) in dst.chunks_mut(g.ow).enumerate().take(g.oh) {
        let sums = &mut wide[y * wq..][..g.ow];
        act.apply(sums);
        fused::put(row, sums);
    }
}

/// `wide[i] = bias + Σ_t ker[t] * phases[starts[t] + i]`, the taps added in order (the
/// same sums as one pass over `wide` per tap), [`TAP_BLOCK`] outputs at a time summed over
/// every tap before the next block: one pass over the output instead of one per tap
/// (MobileNetV3-Large's 15 depthwise convolutions at batch 1, 1 thread: BENCHMARKS.md,
/// issue 14); whole blocks by [`taps_avx512`] where the CPU has AVX-512. Every
/// `starts[t] + wide.len()` must lie within `phases`.
pub(super) fn depthwise_taps(
    wide: &mut [f32],
    phases: &[f32],
    ker: &[f32],
    starts: &[usize],
    bias: f32,
) {
    #[cfg(target_arch = "x86_64")]
    let done = if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: only instructions the CPU was just found to support.
        #[allow(unsafe_code)]
        unsafe {
            taps_avx512(wide, phases, ker, starts, bias)
        }
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    // The rest (all of it without AVX-512).
    fused::simd(
        #[inline(always)]
        || {
            let mut at = done;
            for out in wide[done..].chunks_mut(TAP_BLOCK) {
                let n = out.len();
                let mut acc = [bias; TAP_BLOCK];
                for (&k, &s) in ker.iter().zip(starts) {
                    let src = &phases[s + at..s + at + n];
                    for (a, &v) in acc[..n].iter_mut().zip(src) {
                        *a += k * v;
                    }
                }
                out.copy_from_slice(&acc[..n]);
                at += n;
            }
        },
    )
}

/// The whole [`TAP_BLOCK`]s of [`depthwise_taps`] with the four sums of a block held in
/// AVX-512 registers explicitly (the compiler kept the portable loop's sums on the stack, a
/// store and a reload per tap); the same operations in the same order (a multiply, then an
/// add: no fused multiply-add), so the same bits. Returns how many outputs it wrote (a
/// multiple of [`TAP_BLOCK`]); panics, as the portable loop does, if a tap's run leaves
/// `phases`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn taps_avx512(
    wide: &mut [f32],
    phases: &[f32],
    ker: &[f32],
    starts: &[usize],
    bias: f32,
) -> usize {
    use std::arch::x86_64::*;
    let b = _mm512_set1_ps(bias);
    let mut at = 0;
    for out in wide.chunks_exact_mut(TAP_BLOCK) {
        let mut acc = [b; 4];
        for (&k, &s) in ker.iter().zip(starts) {
            let src = &phases[s + at..s + at + TAP_BLOCK];
            let kv = _mm512_set1_ps(k);
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: `src` holds TAP_BLOCK = 4 * 16 values, and this reads 16 of them
                // from `16 * j`, j < 4 (an unaligned load).
                #[allow(unsafe_code)]
                let v = unsafe { _mm512_loadu_ps(src.as_ptr().add(16 * j)) };
                *a = _mm512_add_ps(*a, _mm512_mul_ps(kv, v));
            }
        }
        for (j, a) in acc.iter().enumerate() {
            // SAFETY: `out` holds TAP_BLOCK = 4 * 16 values, and this writes 16 of them from
            // `16 * j`, j < 4 (an unaligned store).
            #[allow(unsafe_code)]
            unsafe {
                _mm512_storeu_ps(out.as_mut_ptr().add(16 * j), *a)
            };
        }
        at += TAP_BLOCK;
    }
    at
}

/// Outputs of [`depthwise_taps`] computed together: four AVX-512 registers' worth, so that
/// four independent sums hide the latency of each addition.
pub(super) const TAP_BLOCK: usize = 64;
