//! Linear weights packed once, at load, in the layout the gemm's microkernel reads, and the
//! product that reads them so.
//!
//! For `y = x @ w.T` (`w: [n, k]`, torch's Linear weight) the `gemm` crate copies `w` into
//! panels of `mr` rows (`mr` = 64 with AVX-512) by blocks of `kc` columns on every call, then
//! runs its microkernel over the panels; with the weight already stored so, [`sgemm_packed`] runs the
//! same microkernels (the crate's own, `gemm_f32::microkernel`) over the same cache blocks
//! (`gemm_common::cache::kernel_params`) and copies nothing. The copy was 4.6% of a
//! 1024 x 768 x 768 product's samples and 14% of a 128 x 768 x 768 one's (`perf`, one thread;
//! BENCHMARKS.md, issue 14).
//!
//! The layout ([`Packing`]): the `kc`-column blocks of `w` one after another; in each, the
//! panels of `mr` rows (`n` rounded up to `mr`, the extra rows zero); in a panel, column after
//! column, each the panel's `mr` values. `Program::load` writes it straight from the
//! archive's bytes for the weights read only as the weight of a product (a Linear's `[n, k]`
//! weight, or the `[k, n]` right operand of `addmm` / `mm` / `matmul`: [`Source`]), and
//! rewrites those nodes to [`TARGET`], whose kernel reads the packed values with
//! [`product_packed`]. The weights of convolutions on small planes (`ops/conv/small.rs`)
//! are decoded packed the same way, each row scaled for its batch norm's fold as it is
//! packed (`Program::from_parts`, whose weights come decoded, packs them at build).

use std::mem::MaybeUninit;

use candle_core::Tensor;
use gemm_common::microkernel::MicroKernelFn;

use super::fused::Spare;
use super::sgemm::{block_fits, finish_rows, for_each_tile, new_block, tiles, Finish, Mat, Shared};
use super::stream::streamed;
use super::tile::{Lanes, SIDE};
use super::Registry;
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs};

/// The node target of a Linear whose weight is packed: arguments `input`, `weight` (the
/// packed values, 1-d), optional `bias`, and the ints `out_features` (`n`) and
/// `in_features` (`k`); the block width is the packing's for `k` ([`Packing::block`]).
pub const TARGET: &str = "torchport.linear_packed.default";

/// The argument under which a packed Linear node may carry its output's sizes (ints), where
/// they are not the input's leading dims and `out_features`: the view of the output that
/// `prepare::fuse_linear_epilogues` looked through. The same elements and the same last dim.
pub const OUTPUT_SHAPE_ARG: &str = "torchport_output_shape";

/// Register the kernel.
pub fn register(r: &mut Registry) {
    r.add(TARGET, linear_packed);
}

/// The microkernels of this CPU and the panel shape they read.
#[derive(Clone, Copy)]
pub struct Packing {
    /// Weight rows per panel: the microkernel's column of outputs.
    pub mr: usize,
    /// Rows of `x` per microkernel call.
    nr: usize,
    /// f32 lanes per register.
    lanes: usize,
    /// The microkernel for `(registers - 1, rows of x - 1)`.
    kernel: fn(usize, usize) -> MicroKernelFn<f32>,
}

impl Packing {
    /// The packing for this CPU's microkernels (the ones the gemm crate itself would pick):
    /// the first of [`Packing::available`]; `None` where there is none (Linears then keep
    /// the transposed layout).
    pub fn detect() -> Option<Packing> {
        static DETECTED: std::sync::OnceLock<Option<Packing>> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| Packing::available().first().copied())
    }

    /// Every packing this CPU can run, widest registers first: AVX-512 (64-row panels), AVX2
    /// with FMA (16-row panels).
    pub fn available() -> Vec<Packing> {
        #[allow(unused_mut)]
        let mut all = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            use gemm_f32::microkernel as uk;
            if std::arch::is_x86_feature_detected!("avx512f") {
                all.push(Packing {
                    mr: uk::avx512f::f32::MR_DIV_N * 16,
                    nr: uk::avx512f::f32::NR,
                    lanes: 16,
                    kernel: |v, c| uk::avx512f::f32::UKR[v][c],
                });
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                all.push(Packing {
                    mr: uk::fma::f32::MR_DIV_N * 8,
                    nr: uk::fma::f32::NR,
                    lanes: 8,
                    kernel: |v, c| uk::fma::f32::UKR[v][c],
                });
            }
        }
        all
    }

    /// The columns per block for an inner dimension `k`: the gemm's own choice (it depends on
    /// `k` and the caches only).
    pub fn block(&self, k: usize) -> usize {
        gemm_common::cache::kernel_params(self.mr, self.nr, k, self.mr, self.nr, 4)
            .kc
            .clamp(1, k.max(1))
    }

    /// The panels per run of a product with `n` weight rows (panels' rows), `m` rows of `x`
    /// and inner dimension `k`: as many as the gemm's own L2 blocking (`mc`) holds.
    fn run(&self, n: usize, m: usize, k: usize) -> usize {
        let mc = gemm_common::cache::kernel_params(n, m, k, self.mr, self.nr, 4).mc;
        (mc / self.mr).max(1)
    }

    /// The time of [`unpacked_product`] for `n` columns of an unpacked right operand against
    /// the same rows, in units of a twelfth of a full panel's when a register holds a quarter
    /// of a panel (AVX-512): a full panel 3 registers' worth, a last partial one of `r`
    /// registers one register's worth plus 2/3 of one per register, and a last one of a few
    /// columns after whole ones, computed by dot products ([`super::dots`]), a unit per 4
    /// columns. The partial panel's cost was measured on Winograd's products of 196 columns
    /// (three panels and one register of 4 columns) in a single convolution of ResNet's
    /// 64-channel 3x3 shape on 56 x 56: its microkernels took half as long as a full panel's
    /// (`perf`, 1 thread). The dot products' unit: with it ResNet's 56 x 56 Winograd layers
    /// take blocks of 7 tile rows rather than 9, 0.97 of the time on that single convolution,
    /// level on torchvision's ResNet-18 and ResNet-50 (1.00 and 1.01; BENCHMARKS.md, issue 14).
    pub(crate) fn columns_cost(&self, n: usize) -> usize {
        let regs = self.mr / self.lanes;
        let (whole, tail) = (n / self.mr * 3 * regs, n % self.mr);
        match (tail, super::dots::tail_of(n, self.mr)) {
            (0, _) => whole,
            (_, dots) if dots > 0 => whole + dots.div_ceil(4),
            (t, _) => whole + regs + 2 * t.div_ceil(self.lanes),
        }
    }

    /// The packed length of an `[n, k]` weight, `None` on overflow.
    pub fn len(&self, n: usize, k: usize) -> Option<usize> {
        n.checked_next_multiple_of(self.mr)?.checked_mul(k)
    }

    /// Pack the weight held as little-endian f32 `bytes`, laid out as `source` says, into
    /// `dst` (`self.len(n, k)` values), in blocks of [`Packing::block`] columns, panels in
    /// parallel. With `scale` (`[Source::Rows]` only: a convolution's weight and its batch
    /// norm's scale), row `i` is multiplied by `scale[i]` as
    /// [`crate::prepare::fold_batch_norms`] multiplies it, while its panel is in cache.
    /// Returns false (and writes nothing) when `bytes`, `dst` or `scale` is too short, or a
    /// scale comes with [`Source::Columns`].
    pub fn pack_le_into(
        &self,
        bytes: &[u8],
        source: Source,
        n: usize,
        k: usize,
        dst: &mut [f32],
        scale: Option<&[f64]>,
    ) -> bool {
        let dst = super::fused::as_uninit(dst);
        self.pack_into(Values::Le(bytes), source, n, k, dst, scale)
    }

    /// [`Packing::pack_le_into`] into memory not yet written (a load's new buffer), exactly
    /// `self.len(n, k)` values: true when it wrote every one of them, false (having written
    /// none) where `pack_le_into` is false or `dst` has another length.
    pub(crate) fn pack_le_into_uninit(
        &self,
        bytes: &[u8],
        source: Source,
        n: usize,
        k: usize,
        dst: &mut [MaybeUninit<f32>],
        scale: Option<&[f64]>,
    ) -> bool {
        self.len(n, k) == Some(dst.len())
            && self.pack_into(Values::Le(bytes), source, n, k, dst, scale)
    }

    /// [`Packing::pack_le_into`] from a row-major `[n, k]` matrix of f32 values (a weight
    /// already decoded), unscaled.
    pub fn pack_f32_into(&self, src: &[f32], n: usize, k: usize, dst: &mut [f32]) -> bool {
        let dst = super::fused::as_uninit(dst);
        self.pack_into(Values::F32(src), Source::Rows, n, k, dst, None)
    }

    /// [`Packing::pack_le_into`] from either kind of [`Values`]; when true, every one of the
    /// first `self.len(n, k)` values of `dst` was written.
    fn pack_into(
        &self,
        src: Values,
        source: Source,
        n: usize,
        k: usize,
        dst: &mut [MaybeUninit<f32>],
        scale: Option<&[f64]>,
    ) -> bool {
        use rayon::prelude::*;
        let mr = self.mr;
        let (Some(need), Some(len)) = (n.checked_mul(k), self.len(n, k)) else {
            return false;
        };
        let scale_fits = match (scale, source) {
            (None, _) => true,
            (Some(s), Source::Rows) => s.len() >= n,
            (Some(_), Source::Columns) => false,
        };
        if src.len() < need || dst.len() < len || !scale_fits {
            return false;
        }
        let src = src.as_f32();
        let (n_pad, kc) = (n.next_multiple_of(mr), self.block(k));
        let mut rest = &mut dst[..len];
        let mut p0 = 0;
        while p0 < k {
            let kb = kc.min(k - p0);
            let (block, tail) = std::mem::take(&mut rest).split_at_mut(n_pad * kb);
            rest = tail;
            match source {
                // Each panel on its own. f32 values in memory by tiles of 16 x 16 (`tile`),
                // 16 rows at a time along the block: 16 streams of reads, which the CPU's
                // prefetchers follow (a whole panel's 64 rows 16 columns at a time, the
                // reads waited on memory). Else 16 columns at a time: one cache line of each
                // of the panel's rows, written into 16 of the panel's columns.
                Source::Rows => block
                    .par_chunks_mut(mr * kb)
                    .enumerate()
                    .for_each(|(q, panel)| {
                        let rows = mr.min(n - (q * mr).min(n));
                        let first = (q * mr) * k + p0;
                        let scale = scale.map(|s| &s[q * mr..q * mr + rows]);
                        match src {
                            // Past the caches: nothing reads the panel before the first run.
                            // The padding rows' zeros and the fold's scaling are written by
                            // the tiles themselves: one pass over the panel.
                            Values::F32(v) => streamed(|s| {
                                for r0 in (0..mr).step_by(SIDE) {
                                    let rn = rows.saturating_sub(r0).min(SIDE);
                                    let lanes = Lanes {
                                        wide: SIDE.min(mr - r0),
                                        scale: scale.map(|s| &s[r0.min(rows)..r0.min(rows) + rn]),
                                    };
                                    for c0 in (0..kb).step_by(SIDE) {
                                        let (at, cn) = (first + r0 * k + c0, SIDE.min(kb - c0));
                                        let to = c0 * mr + r0;
                                        s.transpose_into(
                                            (v, at, k),
                                            rn,
                                            cn,
                                            (panel, to, mr),
                                            lanes,
                                        );
                                    }
                                }
                            }),
                            // Bytes read one at a time (unaligned), the padding rows zeroed,
                            // then scaled.
                            Values::Le(_) => {
                                for r in 0..mr {
                                    let column = panel.iter_mut().skip(r).step_by(mr).take(kb);
                                    if r < rows {
                                        src.copy(first + r * k, kb, column);
                                    } else {
                                        column.for_each(|d| {
                                            d.write(0.0);
                                        });
                                    }
                                }
                                if let Some(scale) = scale {
                                    // SAFETY: every value of the panel was written above.
                                    #[allow(unsafe_code)]
                                    let panel = unsafe { super::fused::assume_written(panel) };
                                    for col in panel.chunks_exact_mut(mr) {
                                        for (v, &s) in col.iter_mut().zip(scale) {
                                            *v = crate::prepare::bn_scaled(*v, s);
                                        }
                                    }
                                }
                            }
                        }
                    }),
                // A panel's column is a stretch of one row of the `[k, n]` source: 16 panels
                // at a time, so that each row is read in stretches of 16 panels' width (4 KiB
                // with AVX-512) rather than one, each from another page.
                Source::Columns => {
                    let group = 16;
                    let panels = block.par_chunks_mut(mr * kb * group).enumerate();
                    panels.for_each(|(g, panels)| {
                        streamed(|s| {
                            for c in 0..kb {
                                for (i, panel) in panels.chunks_exact_mut(mr * kb).enumerate() {
                                    let i0 = (g * group + i) * mr;
                                    let rows = mr.min(n - i0.min(n));
                                    let column = &mut panel[c * mr..(c + 1) * mr];
                                    let (vals, pad) = column.split_at_mut(rows);
                                    match src {
                                        // Past the caches, as the rows' tiles above.
                                        Values::F32(v) => {
                                            let at = (p0 + c) * n + i0;
                                            s.copy_into(&v[at..at + rows], vals)
                                        }
                                        _ => src.copy((p0 + c) * n + i0, rows, vals.iter_mut()),
                                    }
                                    pad.fill(MaybeUninit::new(0.0));
                                }
                            }
                        })
                    })
                }
            }
            p0 += kb;
        }
        true
    }
}

/// The values a weight is packed from: little-endian f32 bytes (the archive's) or f32.
#[derive(Clone, Copy)]
enum Values<'a> {
    Le(&'a [u8]),
    F32(&'a [f32]),
}

impl<'a> Values<'a> {
    /// The same values as f32 where the bytes are those of f32 values in memory (a
    /// little-endian CPU, 4-byte aligned), so that they can be read a vector at a time.
    fn as_f32(self) -> Values<'a> {
        match self {
            Values::Le(b) if cfg!(target_endian = "little") => {
                // SAFETY: every bit pattern is a valid f32, and `align_to` gives a middle
                // part whose alignment suits f32; on a little-endian CPU the bytes of
                // each are its little-endian encoding.
                #[allow(unsafe_code)]
                let (head, values, _) = unsafe { b.align_to::<f32>() };
                if head.is_empty() {
                    Values::F32(values)
                } else {
                    self
                }
            }
            other => other,
        }
    }

    /// How many values.
    fn len(&self) -> usize {
        match self {
            Values::Le(b) => b.len() / 4,
            Values::F32(v) => v.len(),
        }
    }

    /// Values `at..at + count` into `dst`, in order.
    fn copy<'d>(
        &self,
        at: usize,
        count: usize,
        dst: impl Iterator<Item = &'d mut MaybeUninit<f32>>,
    ) {
        match self {
            Values::Le(b) => {
                let src = b[at * 4..(at + count) * 4].chunks_exact(4);
                let le = |c: &[u8]| f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                dst.zip(src).for_each(|(d, c)| {
                    d.write(le(c));
                });
            }
            Values::F32(v) => dst.zip(&v[at..at + count]).for_each(|(d, &v)| {
                d.write(v);
            }),
        }
    }
}

/// How a weight to be packed is laid out in the archive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// `[n, k]`: torch's Linear weight, read as `x @ w.T`; or `[n, ...]`, a convolution's
    /// weight, read as the `[n, k]` matrix it is (`k` the product of the other sizes).
    Rows,
    /// `[k, n]`: the right operand of `x @ w` as it is (GPT-2's `Conv1D` weight, read by
    /// `addmm(bias, x, w)`).
    Columns,
}

impl Source {
    /// `(n, k)`: output and input features of a weight of this layout and shape.
    pub fn features(self, shape: &[usize]) -> Option<(usize, usize)> {
        match (self, shape) {
            (Source::Rows, &[n, k]) | (Source::Columns, &[k, n]) => Some((n, k)),
            (Source::Rows, &[n, ref rest @ ..]) if rest.len() >= 2 => {
                Some((n, rest.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?))
            }
            _ => None,
        }
    }
}

/// A packed `[n, k]` weight: its values, shape and the packing it was packed for (which
/// gives its block width, [`Packing::block`]).
#[derive(Clone, Copy)]
pub struct Packed<'a> {
    /// The panel shape and microkernels.
    pub packing: Packing,
    /// The values, in [`Packing`]'s layout.
    pub data: &'a [f32],
    /// Output features (rows of the weight).
    pub n: usize,
    /// Input features (columns of the weight).
    pub k: usize,
}

/// `dst = (accumulate ? dst : 0) + scale * x @ w.T` for `x: [m, k]` (any strides) and `dst` a
/// row-major `[m, n]` block with row stride `ldd`, split into output tiles for `threads` of
/// the pool's threads (as [`super::sgemm::sgemm`]). Returns false (and writes nothing) when a
/// view does not fit its slice, the packed length does not match, or `k` is 0.
#[allow(clippy::too_many_arguments)]
pub fn sgemm_packed(
    m: usize,
    x: Mat,
    w: Packed,
    dst: &mut [f32],
    ldd: usize,
    accumulate: bool,
    scale: f32,
    threads: usize,
) -> bool {
    let fits = block_fits(dst, m, w.n, ldd);
    let job = Job {
        x,
        w,
        out: Shared(dst.as_mut_ptr()),
        ldd,
        accumulate,
        scale,
        origin: (0, 0),
        finish: None,
    };
    // SAFETY: `dst` holds the [m, n] block (checked here, the rest by `into`) and its mutable
    // borrow keeps anything else from touching it meanwhile.
    #[allow(unsafe_code)]
    let ok = fits && unsafe { into(m, job, threads) };
    ok
}

/// `scale * x @ w.T` for `x: [m, k]` as a new row-major `[m, n]` buffer, written once by the
/// product; threads as in [`sgemm_packed`]. `None` where it returns false.
pub fn product_packed(m: usize, x: Mat, w: Packed, scale: f32, threads: usize) -> Option<Vec<f32>> {
    let len = m.checked_mul(w.n)?;
    // SAFETY: the block is new, so nothing else touches it; when `into` returns true with
    // `accumulate` false, k > 0, so the first block of columns wrote every element of every
    // tile, the tiles cover the block, and none was read before it was written.
    #[allow(unsafe_code)]
    unsafe {
        new_block(len, |out| {
            let job = Job {
                x,
                w,
                out,
                ldd: w.n,
                accumulate: false,
                scale,
                origin: (0, 0),
                finish: None,
            };
            into(m, job, threads)
        })
    }
}

/// `x @ w.T` for `x: [m, k]` (any strides) in one band of the weight's output features per
/// thread (`threads`, at most one per sliver: a register of features), each band's `[m,
/// cols]` block written (row-major, row stride `cols.len()`) into a scratch buffer of the
/// thread computing it and handed to `done(cols, block)` there, while it is in that
/// thread's cache: for a caller that lays the product out anew (a convolution on a small
/// plane writes each output channel's plane from it). The bands are whole slivers, as even
/// as they allow, and every feature is in exactly one. False (nothing handed on) where
/// [`sgemm_packed`] says.
///
/// Narrower bands, several per thread, so that each band's block is still in the first-level
/// cache when it is handed on, made MobileNetV3's 160 → 960 convolutions on 7 x 7 slower on
/// 1 thread (bands of 128 features: 0.175–0.177 → 0.181–0.183 ms) and no faster on 2
/// (BENCHMARKS.md, issue 14).
pub fn product_bands(
    m: usize,
    x: Mat,
    w: Packed,
    threads: usize,
    done: &(dyn Fn(std::ops::Range<usize>, &[f32]) + Sync),
) -> bool {
    use rayon::prelude::*;
    let (pk, n) = (w.packing, w.n);
    if !operands_fit(m, x, w) || m.checked_mul(n).is_none() {
        return false;
    }
    if m == 0 || n == 0 {
        return true;
    }
    let slivers = n.div_ceil(pk.lanes);
    let bands = threads.clamp(1, slivers);
    let band = |b: usize| {
        let (s0, s1) = (b * slivers / bands, (b + 1) * slivers / bands);
        let cols = s0 * pk.lanes..(s1 * pk.lanes).min(n);
        let mut block = Spare::take();
        block.resize(m * cols.len(), 0.0);
        let job = Job {
            x,
            w,
            out: Shared(block.as_mut_ptr()),
            ldd: cols.len(),
            accumulate: false,
            scale: 1.0,
            origin: (0, cols.start),
            finish: None,
        };
        // SAFETY: the views fit (checked above), the band's columns start at a sliver's
        // start, and `block`, this call's own, holds its `[m, cols]` block (from row 0 and
        // column `cols.start` on) at row stride `cols.len()`. With `accumulate` false and
        // k > 0 the first block of columns writes every element.
        #[allow(unsafe_code)]
        unsafe {
            tile(&job, 0..m, cols.clone())
        };
        done(cols, &block);
    };
    match bands {
        1 => band(0),
        _ => (0..bands).into_par_iter().for_each(band),
    }
    true
}

/// One product's operands: `out = (accumulate ? out : 0) + scale * x @ w.T`, `out` an
/// `[m, n]` block at row stride `ldd`, or the part of it from row and column `origin` on
/// (a band's own buffer: [`product_bands`]). With `finish` (origin (0, 0) only), each row's
/// stretch of a tile is handed to it once the last block of `k` has been added.
#[derive(Clone, Copy)]
struct Job<'a> {
    x: Mat<'a>,
    w: Packed<'a>,
    out: Shared,
    ldd: usize,
    accumulate: bool,
    scale: f32,
    origin: (usize, usize),
    finish: Option<Finish<'a>>,
}

/// Products of fewer rows than this are split over the threads by their weight's size
/// ([`FEW_ROWS_SPLIT`]) where their multiply-adds are too few.
const FEW_ROWS: usize = 8;

/// The fewest weight values (256 KiB) a product of fewer than [`FEW_ROWS`] rows is split
/// over the threads for. MobileNetV3-Large's 16 squeeze-and-excitation convolutions at batch
/// 1 on 2 threads, of which this splits the eight of 672 and 960 channels (weights of 112,896
/// and 230,400 values; those of 480 channels hold 57,600), their per-node profile's sum:
/// 0.223–0.249 ms each on one thread, 0.144–0.147 split (BENCHMARKS.md, issue 14).
const FEW_ROWS_SPLIT: usize = 1 << 16;

/// The product behind [`sgemm_packed`] and [`product_packed`], split for `threads` threads
/// (1: on this one); false (nothing written) where [`sgemm_packed`] says.
///
/// # Safety
///
/// `job.out` points to an `[m, n]` block at row stride `job.ldd` (`>= n` when `m > 1`:
/// [`block_fits`]) that nothing else reads or writes meanwhile.
#[allow(unsafe_code)]
unsafe fn into(m: usize, job: Job, threads: usize) -> bool {
    let Job { x, w, ldd, .. } = job;
    let pk = w.packing;
    let (n, k) = (w.n, w.k);
    if !operands_fit(m, x, w) || isize::try_from(ldd).is_err() {
        return false;
    }
    if m == 0 || n == 0 {
        return true;
    }
    let slivers = n.div_ceil(pk.lanes);
    let (row_bands, col_bands) = bands(m, n, k, slivers, threads);
    // Rows of x against bands of the weight's rows.
    for_each_tile(m, slivers, (row_bands, col_bands), |rows, s| {
        let cols = s.start * pk.lanes..(s.end * pk.lanes).min(n);
        // SAFETY: the views fit (checked above and by the caller), the tiles are disjoint,
        // and the caller keeps the block to this call.
        unsafe { tile(&job, rows, cols) }
    });
    true
}

/// The (row bands, sliver bands) of an `[m, k] @ [k, n]` product on `threads` threads:
/// split where the unpacked product would be split (`tiles`), over slivers of the weight's
/// panels, one register of rows each (see [`split`]). A product of fewer than [`FEW_ROWS`]
/// rows (a squeeze-and-excitation's convolutions at batch 1) reads its whole weight for
/// little arithmetic: it is split where the weight is large, though its multiply-adds are
/// too few for `tiles`.
fn bands(m: usize, n: usize, k: usize, slivers: usize, threads: usize) -> (usize, usize) {
    let weight_bound = m < FEW_ROWS && n.saturating_mul(k) >= FEW_ROWS_SPLIT;
    match threads > 1 {
        true if weight_bound || tiles(m, n, k, threads) != (1, 1) => split(m, slivers, threads),
        _ => (1, 1),
    }
}

/// Whether `x` (`[m, k]`) and the packed `w` (`[n, k]`, its packed length) are operands a
/// product can take: `k > 0`, the views inside their slices, strides the microkernel's
/// pointer offsets hold.
fn operands_fit(m: usize, x: Mat, w: Packed) -> bool {
    w.k > 0
        && w.packing.len(w.n, w.k) == Some(w.data.len())
        && x.fits(m, w.k)
        && isize::try_from(x.rs).is_ok()
        && isize::try_from(x.cs).is_ok()
}

/// The (row bands, sliver bands) an `[m, n]` product of `slivers` slivers of weight rows (a
/// register's worth each, 16 with AVX-512; four to a panel) is split into over `threads`: the
/// split whose largest tile (slivers times rows) is smallest, row bands of at least 64 rows;
/// of equal ones, the one with the most sliver bands. Bands of the weight's rows let each
/// thread read only its own part of the weight, where row bands each read all of it
/// (BERT-base at batch 8 on 2 threads: the Linears took 1,055-1,157 ms this way, 1,162-1,273
/// in row bands, 1,139-1,299 unpacked; BENCHMARKS.md, issue 14); rows are split too where
/// that evens the tiles out (one sliver on 4 threads). Slivers rather than whole panels, so
/// that a band may end inside a panel: MobileNetV3's 160-channel convolutions on 7 x 7 have
/// three panels, which two threads had shared 2 to 1, and ResNet's 512-channel ones eight,
/// which left half of 16 threads idle.
fn split(m: usize, slivers: usize, threads: usize) -> (usize, usize) {
    let max_rows = (m / 64).max(1);
    let mut best = (1, 1);
    let mut best_tile = usize::MAX;
    for cols in (1..=threads.min(slivers)).rev() {
        let rows = (threads / cols).min(max_rows);
        let tile = slivers.div_ceil(cols) * m.div_ceil(rows);
        if tile < best_tile {
            (best, best_tile) = ((rows, cols), tile);
        }
    }
    best
}

/// Rows `rows` of `x` against the weight's rows `cols` (output columns; the first at a
/// sliver's start), on this thread: for each block of `kc` columns, for each run of panels
/// that fits the L2 cache, for each `nr` rows of `x`, the microkernel on each panel's part
/// (the gemm crate's loop order).
///
/// # Safety
///
/// `job.x` and `job.out` (row stride `job.ldd`) fit `[m, k]` and `[m, n]` views, `job.w`
/// holds its packed length, `rows` and `cols` lie inside, and nothing else touches the tile
/// meanwhile.
#[allow(unsafe_code)]
unsafe fn tile(job: &Job, rows: std::ops::Range<usize>, cols: std::ops::Range<usize>) {
    let Job {
        x,
        w,
        out,
        ldd,
        accumulate,
        scale,
        origin,
        finish,
    } = *job;
    let pk = w.packing;
    let (n, k, mr) = (w.n, w.k, pk.mr);
    let n_pad = n.next_multiple_of(mr);
    let run = pk.run(n, rows.len(), k);
    let kc = pk.block(k);
    let mut p0 = 0;
    while p0 < k {
        let kb = kc.min(k - p0);
        // The first block writes (or adds to what the caller left), the rest add.
        let status = if p0 == 0 && !accumulate { 0 } else { 1 };
        let block = w.data.as_ptr().add(p0 * n_pad);
        let finish = finish.filter(|_| p0 + kb == k);
        let mut c0 = cols.start;
        while c0 < cols.end {
            // To the end of the run of panels that starts with c0's.
            let c1 = ((c0 / mr + run) * mr).min(cols.end);
            let panels = Panels {
                data: block.add(c0 / mr * mr * kb),
                cols: c0..c1,
                kb,
                tail: None,
            };
            kernels(
                &pk,
                x,
                rows.clone(),
                p0,
                &panels,
                (out, origin),
                ldd,
                status,
                scale,
                finish,
            );
            c0 = c1;
        }
        p0 += kb;
    }
}

/// Consecutive packed panels of one block of `kb` columns, each `mr` rows by `kb` columns,
/// column after column, `data` the first one's start: output columns `cols` of them (the
/// first in `data`'s panel, at a sliver's start; panels start at multiples of `mr`).
struct Panels<'t> {
    data: *const f32,
    cols: std::ops::Range<usize>,
    kb: usize,
    /// Columns just past `cols` computed by dot products ([`super::dots`]) for the same rows
    /// and block of `k`, with their values (a row of `kb` each).
    tail: Option<(std::ops::Range<usize>, &'t [f32])>,
}

/// The microkernel over rows `rows` of `x` (columns `p0..p0 + panels.kb`) against each of
/// `panels`, into `out` (row stride `ldd`; its first element the product's row and column
/// `origin`): `status` 0 writes, 1 adds to what `out` holds. For each `nr` rows of `x` in
/// turn, each panel; or, with at most [`PANEL_FIRST_ROWS`] rows, for each panel in turn,
/// all the rows; then the same rows against `panels.tail`'s columns, if any, by dot
/// products. With `finish` (origin (0, 0) only), each of those rows' stretch of `out`
/// (columns `panels.cols` and the tail's) is handed to it once its microkernels are done,
/// still in cache.
///
/// # Safety
///
/// `x` fits the rows and columns read (its rows contiguous where there is a tail),
/// `panels.data` holds the panels' values, and `out` holds rows `rows` by columns
/// `panels.cols` and the tail's at row stride `ldd` (both from `origin` on), which nothing
/// else touches meanwhile.
#[allow(unsafe_code, clippy::too_many_arguments)]
unsafe fn kernels(
    pk: &Packing,
    x: Mat,
    rows: std::ops::Range<usize>,
    p0: usize,
    panels: &Panels,
    (out, origin): (Shared, (usize, usize)),
    ldd: usize,
    status: u8,
    scale: f32,
    finish: Option<Finish>,
) {
    debug_assert!(finish.is_none() || origin == (0, 0));
    if rows.is_empty() {
        return;
    }
    let (mr, nr, kb) = (pk.mr, pk.nr, panels.kb);
    let first = panels.cols.start / mr;
    // The microkernel on rows j..j + nj (nj at most nr) against the rest of i0's panel (its
    // rows i0 % mr.., whole registers of them); the panel's columns it covered.
    let call = |(j, nj): (usize, usize), i0: usize| -> usize {
        let mi = ((i0 / mr + 1) * mr).min(panels.cols.end) - i0;
        let at = (i0 / mr - first) * mr * kb + i0 % mr;
        let kernel = (pk.kernel)(mi.div_ceil(pk.lanes) - 1, nj - 1);
        // SAFETY: the caller's contract: rows j..j + nj of x and of out, the panel's values.
        unsafe {
            kernel(
                mi,
                nj,
                kb,
                out.0.add((j - origin.0) * ldd + (i0 - origin.1)),
                panels.data.add(at),
                x.data.as_ptr().add(j * x.rs + p0 * x.cs),
                ldd as isize,
                1,
                mr as isize,
                x.cs as isize,
                x.rs as isize,
                1.0,
                scale,
                status,
                false,
                false,
                false,
                std::ptr::null(),
            )
        };
        mi
    };
    // The tail's columns (if any) for rows `rows`, by dot products.
    let tail = |rows: std::ops::Range<usize>| {
        if let Some((cols, values)) = &panels.tail {
            let x = Mat {
                data: &x.data[rows.start * x.rs + p0..],
                ..x
            };
            let at = (rows.start - origin.0) * ldd + cols.start - origin.1;
            let dims = (rows.len(), cols.len(), kb);
            // SAFETY: the caller's contract: rows `rows` of x (contiguous: `unpacked_product`)
            // from column p0, the tail's values for this block of k, and its columns of out.
            unsafe { super::dots::sums(dims, x, values, out.0.add(at), ldd, status != 0, scale) };
        }
    };
    // The columns written for a row: the panels' and the tail's after them.
    let done = panels.cols.start..panels.tail.as_ref().map_or(panels.cols.end, |t| t.0.end);
    if rows.len() <= PANEL_FIRST_ROWS {
        let mut i0 = panels.cols.start;
        while i0 < panels.cols.end {
            let mut mi = 0;
            for step in even_steps(rows.clone(), nr) {
                mi = call(step, i0);
            }
            i0 += mi;
        }
        tail(rows.clone());
        if let Some(f) = finish {
            // SAFETY: rows `rows` of `out` hold columns `done` (the caller's contract),
            // which the microkernels and dot products above have written and nothing else
            // touches.
            unsafe { finish_rows(f, out, ldd, rows, done) };
        }
        return;
    }
    for (j, nj) in even_steps(rows.clone(), nr) {
        let mut i0 = panels.cols.start;
        while i0 < panels.cols.end {
            i0 += call((j, nj), i0);
        }
        // While these rows of x are in the nearest cache.
        tail(j..j + nj);
        if let Some(f) = finish {
            // SAFETY: rows `j..j + nj` of `out` hold columns `done` (the caller's
            // contract), which the microkernels and dot products above have just written
            // and nothing else touches.
            unsafe { finish_rows(f, out, ldd, j..j + nj, done.clone()) };
        }
    }
}

/// `rows` as consecutive `(start, len)` steps of at most `nr` rows, as few as can be and as
/// even as they allow (49 rows by 6: four of 6, five of 5). A last step of one row (after
/// eight of 6) ran its microkernel at a fraction of the others' rate: four sums, each
/// waiting on its own last multiply-add, for four registers of loads a step (4.4% of a
/// 512-channel 3x3 convolution on 7 x 7, one pixel in 49; BENCHMARKS.md, issue 14).
fn even_steps(rows: std::ops::Range<usize>, nr: usize) -> impl Iterator<Item = (usize, usize)> {
    let len = rows.len();
    let steps = len.div_ceil(nr.max(1));
    let (size, longer) = match steps {
        0 => (0, 0),
        _ => (len / steps, len % steps),
    };
    (0..steps).scan(rows.start, move |at, s| {
        let n = size + usize::from(s < longer);
        let step = (*at, n);
        *at += n;
        Some(step)
    })
}

/// The most rows of `x` for which [`kernels`] runs each panel against all of them before the
/// next panel, rather than each `nr` rows against every panel: the panel is then read from
/// the cache nearest the core while the rows pass. ResNet's 3x3 convolution of 512 channels
/// on 7 x 7 (49 rows against a 4608 x 512 weight that comes from L3), 1 thread, the loop
/// alone with its weights cycled: 2.41 -> 2.24 ms; a 128-row Linear 3072 x 768: 4.63 -> 4.54
/// ms; 197 rows: level (BENCHMARKS.md, issue 14).
const PANEL_FIRST_ROWS: usize = 128;

/// The right operand `b` (`[k, n]`) of an [`unpacked_product`], as what writes its values
/// into the microkernel's panels: a matrix ([`Mat`]), or an image's columns unfolded as they
/// are packed (`conv`'s, which never writes the whole unfolded matrix).
pub(crate) trait Columns: Sync {
    /// Rows `rows` of columns `cols` (`cols.start` the first of a panel) into `panels`:
    /// consecutive panels of `mr` columns by `rows.len()` rows, row after row, each row the
    /// panel's `mr` values. What lies past `cols.end` in the last panel is not written.
    fn pack(
        &self,
        rows: std::ops::Range<usize>,
        cols: std::ops::Range<usize>,
        mr: usize,
        panels: &mut [f32],
    );

    /// The same operand from column `cols` on.
    fn skip(&self, cols: usize) -> Self
    where
        Self: Sized;
}

/// `fill(r, span, dst)` for each panel of [`Columns::pack`]'s layout and each row `r` of
/// `rows`: `span` the panel's columns (of `cols`, at most `mr`), `dst` its row's part for
/// them.
pub(crate) fn panel_rows(
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    mr: usize,
    panels: &mut [f32],
    mut fill: impl FnMut(usize, std::ops::Range<usize>, &mut [f32]),
) {
    let kb = rows.len();
    for (panel, i0) in panels
        .chunks_exact_mut(mr * kb)
        .zip(cols.clone().step_by(mr))
    {
        let span = i0..(i0 + mr).min(cols.end);
        for (r, dst) in rows.clone().zip(panel.chunks_exact_mut(mr)) {
            fill(r, span.clone(), &mut dst[..span.len()]);
        }
    }
}

impl Columns for Mat<'_> {
    fn pack(
        &self,
        rows: std::ops::Range<usize>,
        cols: std::ops::Range<usize>,
        mr: usize,
        panels: &mut [f32],
    ) {
        panel_rows(rows, cols, mr, panels, |r, span, dst| {
            let at = r * self.rs + span.start * self.cs;
            if self.cs == 1 {
                dst.copy_from_slice(&self.data[at..at + dst.len()]);
            } else {
                for (j, v) in dst.iter_mut().enumerate() {
                    *v = self.data[at + j * self.cs];
                }
            }
        });
    }

    fn skip(&self, cols: usize) -> Self {
        Mat {
            data: &self.data[cols * self.cs..],
            ..*self
        }
    }
}

/// `out = (accumulate ? out : 0) + scale * x @ b` for `x: [m, k]` and an unpacked
/// `b: [k, n]` (a matrix of any strides, or what [`Columns`] writes), on this thread, through
/// the same microkernels as a packed weight: `b` is packed a run of panels at a time (the
/// columns that fit the L2 cache, one block of `kc` rows) into a buffer this thread keeps,
/// and the rows of `x` run against each run. A last panel of a few columns after whole ones
/// (a 14 x 14 plane's 196 columns: three panels and 4) is computed by dot products instead
/// ([`super::dots`], where `x`'s rows are contiguous), with the last run. With `finish`,
/// each row's stretch of a run is handed to it after the last block of `k` has been added
/// (row and first column relative to `out`). Nothing is allocated after a thread's first
/// product of a size: the gemm crate's own product allocates its packing buffers on every
/// call, from one heap under one lock with [`crate::retain_freed_memory`]. On a 16-core
/// machine the products of ResNet-18's Winograd blocks at batch 1 (16 calls a block) took 5x
/// as long on 16 threads as on 8, each with half the work; those allocations, 16 threads at
/// once, are the suspect (BENCHMARKS.md,
/// issue 14).
///
/// # Safety
///
/// `x` and `b` fit `[m, k]` and `[k, n]` views, `k > 0`, and `out` points to an `[m, n]`
/// block at row stride `ldd` (`>= n` when `m > 1`) that nothing else touches meanwhile.
#[allow(unsafe_code, clippy::too_many_arguments)]
pub(crate) unsafe fn unpacked_product(
    pk: &Packing,
    (m, n, k): (usize, usize, usize),
    x: Mat,
    b: &impl Columns,
    out: Shared,
    ldd: usize,
    accumulate: bool,
    scale: f32,
    finish: Option<Finish>,
) {
    thread_local! {
        static PACKED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let (mr, lanes) = (pk.mr, pk.lanes);
    let (kc, run) = (pk.block(k), pk.run(n, m, k));
    // Taken for the product and given back after it (a product inside this one would find
    // none and use its own).
    let mut spare = PACKED.with_borrow_mut(std::mem::take);
    // The panels start on a cache line (64 bytes), as the gemm's own packing buffers do:
    // the microkernel reads a panel a register (64 bytes with AVX-512) at a time.
    let need = run.min(n.div_ceil(mr)) * mr * kc + 16;
    if spare.len() < need {
        spare.resize(need, 0.0);
    }
    let start = spare.as_ptr().align_offset(64).min(16);
    let buf = &mut spare[start..];
    // A last panel of a few columns after whole ones: its columns by dot products instead
    // (`dots`), row by row with the last run's panels.
    let spill = match x.cs {
        1 => super::dots::tail_of(n, mr),
        _ => 0,
    };
    let in_panels = n - spill;
    let mut values = (spill > 0).then(Spare::take);
    let mut p0 = 0;
    while p0 < k {
        let kb = kc.min(k - p0);
        let status = if p0 == 0 && !accumulate { 0 } else { 1 };
        if let Some(values) = values.as_deref_mut() {
            super::dots::columns(b, p0..p0 + kb, in_panels..n, values);
        }
        let mut j0 = 0;
        while j0 < in_panels {
            let j1 = (j0 + run * mr).min(in_panels);
            let whole = (j1 - j0) / mr;
            let run_buf = &mut buf[..(j1 - j0).div_ceil(mr) * mr * kb];
            b.pack(p0..p0 + kb, j0..j1, mr, run_buf);
            // The rows up to the microkernel's register width are read: zeros past the last
            // column in the last panel.
            let tail = (j1 - j0) % mr;
            if tail > 0 {
                let read = tail.next_multiple_of(lanes).min(mr);
                for col in run_buf[whole * mr * kb..].chunks_exact_mut(mr) {
                    col[tail..read].fill(0.0);
                }
            }
            let panels = Panels {
                data: buf.as_ptr(),
                cols: j0..j1,
                kb,
                tail: values
                    .as_deref()
                    .filter(|_| j1 == in_panels)
                    .map(|v| (in_panels..n, &v[..])),
            };
            let last = p0 + kb == k;
            let finish = finish.filter(|_| last);
            let out = (out, (0, 0));
            kernels(pk, x, 0..m, p0, &panels, out, ldd, status, scale, finish);
            j0 = j1;
        }
        p0 += kb;
    }
    PACKED.with_borrow_mut(|b| *b = spare);
}

/// `torchport.linear_packed`: `input @ weight.T + bias` with the weight packed, and the
/// chain of elementwise steps the node may carry as its epilogue
/// ([`super::pointwise::Epilogue`]) applied to each stretch of the output as the product
/// finishes it, while it is in cache.
fn linear_packed(a: &Args) -> OpResult<Outputs> {
    use super::fused::{repeated_rows, with_f32};
    use std::sync::atomic::{AtomicBool, Ordering};
    let x = super::float(&a.tensor("input")?)?;
    let w = a.tensor("weight")?;
    let dim = |name: &str| -> OpResult<usize> {
        usize::try_from(a.int(name)?).map_err(|_| crate::error::OpError(format!("{name} < 0")))
    };
    let (n, k) = (dim("out_features")?, dim("in_features")?);
    let bias = a
        .opt_tensor("bias")?
        .map(|b| super::float(&b))
        .transpose()?;
    if x.rank() == 0 || x.dims()[x.rank() - 1] != k {
        op_bail!(
            "input of shape {:?} for a Linear of {k} input features",
            x.dims()
        );
    }
    if let Some(b) = &bias {
        if b.dims() != [n] {
            op_bail!("bias of shape {:?} for {n} output features", b.dims());
        }
    }
    let rows: usize = x.dims()[..x.rank() - 1].iter().product();
    let mut shape = x.dims()[..x.rank() - 1].to_vec();
    shape.push(n);
    let Some(len) = rows.checked_mul(n) else {
        op_bail!("a Linear output of shape {shape:?} is too large");
    };
    if a.get(OUTPUT_SHAPE_ARG).is_some() {
        let sizes = a.ints(OUTPUT_SHAPE_ARG)?;
        let dims: Option<Vec<usize>> = sizes.iter().map(|&d| usize::try_from(d).ok()).collect();
        let fits = dims.as_ref().is_some_and(|d| {
            d.last() == Some(&n) && d.iter().try_fold(1usize, |a, &b| a.checked_mul(b)) == Some(len)
        });
        match dims {
            Some(d) if fits => shape = d,
            _ => op_bail!("output sizes {sizes:?} for a Linear output of shape {shape:?}"),
        }
    }
    let epilogue = super::pointwise::Epilogue::of(a, &shape)?;
    let bias = bias.map(|b| b.to_vec1::<f32>()).transpose()?;
    let x = super::strided::contiguous_f32(&x).unwrap_or(x);
    let Some(packing) = Packing::detect() else {
        op_bail!("this CPU has no microkernel for packed Linear weights");
    };
    // The product, each finished stretch handed to `finish`; `None` where the operands do
    // not fit.
    let product = |finish: Option<Finish>| -> Option<Vec<f32>> {
        if k == 0 {
            // No input features: the bias, or zeros.
            let mut out = match &bias {
                Some(b) => repeated_rows(rows, b),
                None => vec![0.0; len],
            };
            if let (Some(f), true) = (finish, n > 0) {
                out.chunks_mut(n)
                    .enumerate()
                    .for_each(|(r, row)| f(r, 0, row));
            }
            return Some(out);
        }
        with_f32(&w, |wd| {
            let w = Packed {
                packing,
                data: wd,
                n,
                k,
            };
            with_f32(&x, |xs| {
                let job = |out: Shared, accumulate| Job {
                    x: Mat::rows(xs, k),
                    w,
                    out,
                    ldd: n,
                    accumulate,
                    scale: 1.0,
                    origin: (0, 0),
                    finish,
                };
                let threads = rayon::current_num_threads();
                match &bias {
                    // Onto the bias rows (each written once: no zeroing first).
                    Some(b) => {
                        let mut out = repeated_rows(rows, b);
                        let fits = block_fits(&out, rows, n, n);
                        let job = job(Shared(out.as_mut_ptr()), true);
                        // SAFETY: `out` holds the [rows, n] block (checked by `block_fits`)
                        // and is this call's alone.
                        #[allow(unsafe_code)]
                        let ok = fits && unsafe { into(rows, job, threads) };
                        ok.then_some(out)
                    }
                    // SAFETY: the block is new; when `into` returns true with `accumulate`
                    // false, k > 0, so the first block of columns wrote every element
                    // before anything (`finish` included) read it.
                    #[allow(unsafe_code)]
                    None => unsafe { new_block(len, |out| into(rows, job(out, false), threads)) },
                }
            })
            .flatten()
        })
        .flatten()
    };
    let out = match &epilogue {
        None => product(None),
        Some(e) => {
            let outside = AtomicBool::new(false);
            let out = e.with(|apply| {
                let finish = |r: usize, c: usize, row: &mut [f32]| {
                    if !apply(r, c, row) {
                        outside.store(true, Ordering::Relaxed);
                    }
                };
                product(Some(&finish))
            });
            if outside.load(Ordering::Relaxed) {
                op_bail!("an epilogue operand's view reaches outside its storage");
            }
            out.flatten()
        }
    };
    let Some(out) = out else {
        op_bail!(
            "packed Linear weight of {} values does not hold [{n}, {k}], or an operand is not \
             a float32 CPU tensor",
            w.elem_count()
        );
    };
    one(Tensor::from_vec(out, shape, x.device())?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::sgemm::direct_f64;
    use candle_core::DType;

    /// `w` (`[n, k]`, row-major) packed from its little-endian bytes; and the same values
    /// packed from their transpose (`[k, n]`, [`Source::Columns`]), from bytes not aligned
    /// as f32 (one value at a time) and from f32 values must come out the same.
    fn pack(pk: &Packing, w: &[f32], n: usize, k: usize) -> (Vec<f32>, usize) {
        let le = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|v| v.to_le_bytes()).collect() };
        let bytes = le(w);
        let kc = pk.block(k);
        let mut out = vec![f32::NAN; pk.len(n, k).unwrap()];
        assert!(pk.pack_le_into(&bytes, Source::Rows, n, k, &mut out, None));
        let wt: Vec<f32> = (0..k * n).map(|i| w[(i % n) * k + i / n]).collect();
        let mut from_t = vec![f32::NAN; out.len()];
        assert!(pk.pack_le_into(&le(&wt), Source::Columns, n, k, &mut from_t, None));
        let differ = from_t
            .iter()
            .zip(&out)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        assert_eq!(
            differ, None,
            "{n} x {k} packed from [k, n]: first difference"
        );
        // Bytes not aligned as f32 (read one value at a time) and f32 values (by tiles)
        // give the same panels.
        let mut shifted = vec![0u8; bytes.len() + 1];
        shifted[1..].copy_from_slice(&bytes);
        let mut unaligned = vec![f32::NAN; out.len()];
        assert!(pk.pack_le_into(&shifted[1..], Source::Rows, n, k, &mut unaligned, None));
        let mut from_f32 = vec![f32::NAN; out.len()];
        assert!(pk.pack_f32_into(w, n, k, &mut from_f32));
        for (what, other) in [("unaligned bytes", &unaligned), ("f32", &from_f32)] {
            let same = other
                .iter()
                .zip(&out)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{n} x {k} packed from {what}");
        }
        // Scaled for a batch norm's fold (rows only), from f32 values (the tiles scale) and
        // from unaligned bytes (scaled after): as the rows scaled first, then packed.
        let scale: Vec<f64> = (0..n).map(|i| 0.3 + i as f64 / 7.0).collect();
        let scaled: Vec<f32> = w
            .iter()
            .enumerate()
            .map(|(i, &v)| crate::prepare::bn_scaled(v, scale[i / k]))
            .collect();
        let mut want = vec![f32::NAN; out.len()];
        assert!(pk.pack_le_into(&le(&scaled), Source::Rows, n, k, &mut want, None));
        for (what, b) in [("f32", &bytes[..]), ("unaligned bytes", &shifted[1..])] {
            let mut got = vec![f32::NAN; out.len()];
            assert!(pk.pack_le_into(b, Source::Rows, n, k, &mut got, Some(&scale)));
            let differ = got
                .iter()
                .zip(&want)
                .position(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(differ, None, "{n} x {k} packed scaled from {what}");
        }
        for source in [Source::Rows, Source::Columns] {
            if !bytes.is_empty() {
                assert!(!pk.pack_le_into(&bytes[4..], source, n, k, &mut out, None));
                assert!(!pk.pack_le_into(&bytes, source, n, k, &mut out[1..], None));
                assert!(!pk.pack_le_into(&bytes, source, usize::MAX, k.max(2), &mut out, None));
            }
        }
        (out, kc)
    }

    /// The split over threads: bands of slivers (16 weight rows each with AVX-512) where
    /// that is as even as anything else, rows split too where it evens the tiles out.
    #[test]
    fn products_split_into_even_tiles() {
        // BERT-base's 768-wide Linears (48 slivers) at batch 8 and 1, its 3,072-wide ones
        // (192), on 2 and 16 threads.
        assert_eq!(split(1024, 48, 2), (1, 2));
        assert_eq!(split(1024, 48, 16), (1, 16));
        assert_eq!(split(128, 48, 16), (1, 16));
        assert_eq!(split(1024, 192, 16), (1, 16));
        // MobileNetV3's 160 channels on 7 x 7 (10 slivers) on 2 threads, ResNet's 512 on 16.
        assert_eq!(split(49, 10, 2), (1, 2));
        assert_eq!(split(49, 32, 16), (1, 16));
        // 12 slivers on 16 threads: 12 bands (of one sliver each), too few rows to split.
        assert_eq!(split(128, 12, 16), (1, 12));
        // One sliver: rows only, at least 64 each.
        assert_eq!(split(256, 1, 4), (4, 1));
        assert_eq!(split(100, 1, 4), (1, 1));
        assert_eq!(split(1024, 12, 1), (1, 1));
        // Products of a few rows split by the weight's size: MobileNetV3's 240 -> 960
        // squeeze-and-excitation convolution at batch 1 (60 slivers) and at batch 4, on 2
        // threads; its 120 -> 480 one (57,600 weights) and any product on 1 thread stay
        // whole. A 150 -> 480 weight (72,000) is split for 7 rows, not for 8 (split by their
        // multiply-adds, too few here).
        assert_eq!(bands(1, 960, 240, 60, 2), (1, 2));
        assert_eq!(bands(4, 960, 240, 60, 2), (1, 2));
        assert_eq!(bands(1, 480, 120, 30, 2), (1, 1));
        assert_eq!(bands(1, 960, 240, 60, 1), (1, 1));
        assert_eq!(bands(7, 480, 150, 30, 2), (1, 2));
        assert_eq!(bands(8, 480, 150, 30, 2), (1, 1));
        // A large product splits as before.
        assert_eq!(bands(1024, 768, 768, 48, 2), (1, 2));
    }

    /// The microkernel's steps over rows cover them in order, each row once, in as few
    /// steps as `nr` allows, their lengths at most one apart.
    #[test]
    fn row_steps_are_few_and_even() {
        let steps = |r: std::ops::Range<usize>, nr| even_steps(r, nr).collect::<Vec<_>>();
        assert_eq!(
            steps(0..49, 6),
            [
                (0, 6),
                (6, 6),
                (12, 6),
                (18, 6),
                (24, 5),
                (29, 5),
                (34, 5),
                (39, 5),
                (44, 5)
            ]
        );
        assert_eq!(steps(10..22, 6), [(10, 6), (16, 6)]);
        assert_eq!(steps(3..4, 6), [(3, 1)]);
        assert!(steps(5..5, 6).is_empty());
        for nr in 1..9 {
            for len in 0..100 {
                let s = steps(7..7 + len, nr);
                assert_eq!(s.len(), len.div_ceil(nr), "{len} by {nr}");
                let mut at = 7;
                for &(j, n) in &s {
                    assert_eq!(j, at, "{len} by {nr}");
                    assert!(n >= 1 && n <= nr && n + 1 >= s[0].1, "{len} by {nr}: {s:?}");
                    at += n;
                }
                assert_eq!(at, 7 + len, "{len} by {nr}");
            }
        }
    }

    /// Against a direct product in f64 (the values are multiples of 1/8 small enough that
    /// every sum is exact in f32): panels cut short (`n` not a multiple of the panel), more
    /// than one block of columns (`k` over the block width), rows of `x` not a multiple of the
    /// microkernel's, accumulation onto a bias with a scale into a wider output, a strided
    /// `x`, and tiles over 1 to 16 threads (whole panels per thread, and rows split too where
    /// that evens the tiles out). And the same bits as the unpacked product. With
    /// every packing the CPU has (AVX-512 and AVX2 here). `product_bands` hands on one band
    /// per thread (at most one per sliver), whole slivers, which together hold each column
    /// once, with the same values.
    #[test]
    fn packed_products_match_direct_products() {
        let all = Packing::available();
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            all.len(),
            usize::from(std::arch::is_x86_feature_detected!("avx512f"))
                + usize::from(
                    std::arch::is_x86_feature_detected!("avx2")
                        && std::arch::is_x86_feature_detected!("fma")
                )
        );
        for (pk, (m, n, k, threads)) in all.iter().flat_map(|pk| {
            [
                (13, 130, 1100, 1),
                (200, 131, 100, 2),
                (131, 300, 700, 4),
                (200, 70, 300, 4),
                (300, 700, 64, 16),
                (1, 70, 33, 3),
                (67, 1, 5, 2),
                (3, 300, 300, 2),
            ]
            .map(|c| (pk, c))
        }) {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("pool");
            // x stored transposed (x[j, p] at p * m + j) to exercise the strides.
            let xt: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 * 0.25 - 1.0).collect();
            let x = Mat {
                data: &xt,
                rs: 1,
                cs: m,
            };
            let w: Vec<f32> = (0..n * k).map(|i| (i % 7) as f32 * 0.5 - 1.5).collect();
            let (packed, kc) = pack(pk, &w, n, k);
            assert!(packed.iter().all(|v| !v.is_nan()), "every value written");
            if k == 1100 {
                assert!(kc < k, "more than one block of columns");
            }
            let wp = Packed {
                packing: *pk,
                data: &packed,
                n,
                k,
            };
            let ldd = n + 3;
            let mut got = vec![2.0f32; m * ldd];
            let ok = pool.install(|| {
                sgemm_packed(
                    m,
                    x,
                    wp,
                    &mut got,
                    ldd,
                    true,
                    0.5,
                    rayon::current_num_threads(),
                )
            });
            assert!(ok, "{m} x {n} x {k}");
            let fresh = pool
                .install(|| product_packed(m, x, wp, 1.0, rayon::current_num_threads()))
                .unwrap();
            let mut unpacked = vec![0f32; m * n];
            let wt = Mat {
                data: &w,
                rs: 1,
                cs: k,
            };
            assert!(super::super::sgemm::sgemm(
                m,
                n,
                k,
                x,
                wt,
                &mut unpacked,
                n,
                false,
                1.0,
                1
            ));
            let dots = direct_f64((m, n, k), |j, p| xt[p * m + j], |p, i| w[i * k + p]);
            for j in 0..m {
                for i in 0..ldd {
                    let dot = dots[j * n + i.min(n - 1)];
                    let want = if i < n { 2.0 + 0.5 * dot } else { 2.0 };
                    assert_eq!(got[j * ldd + i], want as f32, "{m}x{n}x{k} at ({j}, {i})");
                    if i < n {
                        assert_eq!(fresh[j * n + i], dot as f32, "{m}x{n}x{k} at ({j}, {i})");
                    }
                }
            }
            if m > 64 && n > 64 {
                assert_eq!(fresh, unpacked, "the unpacked gemm's bits, {m}x{n}x{k}");
            }
            let bands = std::sync::Mutex::new(Vec::new());
            let done = |cols: std::ops::Range<usize>, block: &[f32]| {
                bands.lock().unwrap().push((cols, block.to_vec()));
            };
            assert!(pool.install(|| product_bands(m, x, wp, threads, &done)));
            let mut bands = bands.into_inner().unwrap();
            bands.sort_by_key(|(cols, _)| cols.start);
            assert_eq!(
                bands.len(),
                threads.clamp(1, n.div_ceil(pk.lanes)),
                "{m}x{n}"
            );
            let mut next = 0;
            for (cols, block) in &bands {
                assert!(cols.start == next && cols.start % pk.lanes == 0, "{cols:?}");
                assert_eq!(block.len(), m * cols.len());
                for (j, row) in block.chunks_exact(cols.len()).enumerate() {
                    for (&got, i) in row.iter().zip(cols.clone()) {
                        assert_eq!(got, dots[j * n + i] as f32, "{m}x{n}x{k} at ({j}, {i})");
                    }
                }
                next = cols.end;
            }
            assert_eq!(next, n, "{m}x{n}x{k}: every column");
        }
    }

    /// `unpacked_product` against a direct product in f64 (values exact in f32, so the order
    /// of the sums does not matter), with every packing the CPU has: `b` row-major and stored
    /// transposed, more than one block of `k` and more than one run of panels (`n` past what
    /// one run holds, the last panel partial), a strided `x`, writing and adding (onto 2.0,
    /// scaled by 0.5) into a block inside a wider output whose other columns stay as they
    /// were; twice on the same thread (its buffer reused, larger then smaller).
    #[test]
    fn unpacked_products_match_direct_products() {
        for pk in Packing::available() {
            for (m, k) in [(9, 1100), (5, 40)] {
                // A run holds at most 8 panels (the gemm's `mc` is at most 8 `mr`).
                let n = if k > 100 { 16 * pk.mr + 7 } else { 3 };
                assert!(k < 100 || pk.block(k) < k, "more than one block of k");
                assert!(k < 100 || n > pk.run(n, m, k) * pk.mr, "more than one run");
                // x stored transposed (x[i, p] at p * m + i).
                let xt: Vec<f32> = (0..m * k).map(|i| (i % 9) as f32 * 0.5 - 2.0).collect();
                let x = Mat {
                    data: &xt,
                    rs: 1,
                    cs: m,
                };
                let bv: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.5 - 1.0).collect();
                for (transposed, accumulate) in [(false, false), (true, true)] {
                    // b[p, j] at p * n + j, or at j * k + p (the same values, transposed).
                    let bt: Vec<f32>;
                    let b = if transposed {
                        bt = (0..k * n).map(|i| bv[(i % k) * n + i / k]).collect();
                        Mat {
                            data: &bt,
                            rs: 1,
                            cs: k,
                        }
                    } else {
                        Mat::rows(&bv, n)
                    };
                    let ldd = n + 3;
                    let mut got = vec![2.0f32; m * ldd];
                    let scale = if accumulate { 0.5 } else { 1.0 };
                    // SAFETY: the views fit [m, k] and [k, n], k > 0, and `got` holds the
                    // [m, n] block at row stride n + 3.
                    #[allow(unsafe_code)]
                    unsafe {
                        let out = Shared(got.as_mut_ptr());
                        unpacked_product(&pk, (m, n, k), x, &b, out, ldd, accumulate, scale, None);
                    }
                    let dots = direct_f64((m, n, k), |i, p| xt[p * m + i], |p, j| bv[p * n + j]);
                    for i in 0..m {
                        for j in 0..ldd {
                            let want = if j < n {
                                let before = if accumulate { 2.0 } else { 0.0 };
                                before + f64::from(scale) * dots[i * n + j]
                            } else {
                                2.0
                            };
                            let at = format!("{m}x{n}x{k} at ({i}, {j})");
                            assert_eq!(got[i * ldd + j], want as f32, "{at}");
                        }
                    }
                }
            }
        }
    }

    /// A packed weight of the wrong length, an `x` that does not fit its slice, an output
    /// too short: refused, nothing written; `product_bands` refuses the first two too,
    /// handing nothing on.
    #[test]
    fn packed_products_refuse_views_that_do_not_fit() {
        let Some(pk) = Packing::detect() else {
            return;
        };
        let (m, n, k) = (4, 5, 6);
        let w = vec![1f32; n * k];
        let (packed, _) = pack(&pk, &w, n, k);
        let x = vec![1f32; m * k];
        let wp = Packed {
            packing: pk,
            data: &packed,
            n,
            k,
        };
        let short = Packed {
            data: &packed[1..],
            ..wp
        };
        let mut out = vec![7f32; m * n];
        let product = |x: &[f32], w: Packed, out: &mut [f32], ldd: usize| {
            sgemm_packed(m, Mat::rows(x, k), w, out, ldd, false, 1.0, 1)
        };
        assert!(!product(&x, short, &mut out, n));
        assert!(!product(&x[1..], wp, &mut out, n));
        assert!(!product(&x, wp, &mut out[1..], n));
        // Rows that would overlap (a row stride under n), though inside the slice.
        assert!(!product(&x, wp, &mut out, n - 1));
        assert!(out.iter().all(|&v| v == 7.0));
        assert!(product(&x, wp, &mut out, n));
        assert!(out.iter().all(|&v| v == k as f32));
        let handed = std::sync::atomic::AtomicUsize::new(0);
        let count = |_: std::ops::Range<usize>, _: &[f32]| {
            handed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        };
        assert!(!product_bands(m, Mat::rows(&x, k), short, 1, &count));
        assert!(!product_bands(m, Mat::rows(&x[1..], k), wp, 1, &count));
        assert_eq!(handed.into_inner(), 0);
    }

    /// The op: a 3-d input against a packed weight, with and without a bias, equals
    /// candle's `x @ w.T + b`; with no input features it gives the bias (or zeros); a bias or
    /// an input of the wrong size is an error.
    #[test]
    fn the_op_computes_a_linear() {
        use candle_core::Device;
        use serde_json::json;
        let Some(pk) = Packing::detect() else {
            return;
        };
        let run = |x: &Tensor, w: &Tensor, b: Option<&Tensor>| {
            let (n, k) = w.dims2().unwrap();
            let v: Vec<f32> = w.flatten_all().unwrap().to_vec1().unwrap();
            let (packed, _) = pack(&pk, &v, n, k);
            let packed = Tensor::from_vec(packed.clone(), packed.len(), &Device::Cpu).unwrap();
            let mut args = vec![
                ("input", json!({"as_tensor": {"name": "x"}})),
                ("weight", json!({"as_tensor": {"name": "w"}})),
                ("out_features", json!({ "as_int": n })),
                ("in_features", json!({ "as_int": k })),
            ];
            let mut tensors = vec![("x", x.clone()), ("w", packed)];
            if let Some(b) = b {
                args.push(("bias", json!({"as_tensor": {"name": "b"}})));
                tensors.push(("b", b.clone()));
            }
            super::super::run_node(register, TARGET, &args, &tensors).map(|mut o| {
                match o.remove(0) {
                    crate::value::Value::Tensor(t) => t,
                    _ => panic!("not a tensor"),
                }
            })
        };
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 1.0, (2, 70, 96), &dev).unwrap();
        let w = Tensor::randn(0f32, 1.0, (130, 96), &dev).unwrap();
        let b = Tensor::randn(0f32, 1.0, 130, &dev).unwrap();
        let want = x.broadcast_matmul(&w.t().unwrap()).unwrap();
        let got = run(&x, &w, None).unwrap();
        assert_eq!(got.dims(), [2, 70, 130]);
        assert!(super::super::max_abs_diff(&got, &want) < 1e-4);
        let got = run(&x, &w, Some(&b)).unwrap();
        let want = want.broadcast_add(&b).unwrap();
        assert!(super::super::max_abs_diff(&got, &want) < 1e-4);
        // No input features.
        let x0 = Tensor::zeros((3, 0), DType::F32, &dev).unwrap();
        let w0 = Tensor::zeros((5, 0), DType::F32, &dev).unwrap();
        let b5 = Tensor::arange(0f32, 5.0, &dev).unwrap();
        let got = run(&x0, &w0, Some(&b5)).unwrap();
        let rows: Vec<Vec<f32>> = got.to_vec2().unwrap();
        assert_eq!(rows, vec![vec![0.0, 1.0, 2.0, 3.0, 4.0]; 3]);
        let got = run(&x0, &w0, None).unwrap();
        assert_eq!(got.to_vec2::<f32>().unwrap(), vec![vec![0.0; 5]; 3]);
        // Wrong sizes.
        assert!(run(&x, &w, Some(&b5)).is_err());
        let x95 = x.narrow(2, 0, 95).unwrap();
        assert!(run(&x95, &w, None).is_err());
    }

    /// A Linear with an epilogue gives the bits of the same Linear followed by the chain
    /// node: a gelu, an add of a residual read through a transposed view, a mul by a row
    /// that broadcasts, a scalar step; with and without a bias, on an inner dimension over
    /// one block of columns (each stretch must be finished after the last block only), rows
    /// over several tiles and threads, and few enough rows for each panel to run against all
    /// of them before the next (finished at the run's end). Operands that do not broadcast, or
    /// are not float32,
    /// and steps that do not parse are errors.
    #[test]
    fn an_epilogue_is_the_chain_after_the_product() {
        use candle_core::Device;
        use serde_json::{json, Value as Json};
        let Some(pk) = Packing::detect() else {
            return;
        };
        let dev = Device::Cpu;
        let (n, k) = (150, 2 * pk.block(4096) + 37);
        let x = Tensor::randn(0f32, 0.05, (3, 50, k), &dev).unwrap();
        let w = Tensor::randn(0f32, 1.0, (n, k), &dev).unwrap();
        let b = Tensor::randn(0f32, 1.0, n, &dev).unwrap();
        // [3, 50, n], strided along the rows.
        let res = Tensor::randn(0f32, 1.0, (n, 3, 50), &dev).unwrap();
        let res = res.permute((1, 2, 0)).unwrap();
        let row = Tensor::randn(0f32, 1.0, n, &dev).unwrap();
        let v: Vec<f32> = w.flatten_all().unwrap().to_vec1().unwrap();
        let (packed, kc) = pack(&pk, &v, n, k);
        assert!(k > kc, "one block of columns only");
        let packed = Tensor::from_vec(packed.clone(), packed.len(), &dev).unwrap();
        // The last step reads the product again: tensor 3 of the chain node, 0 of the
        // epilogue (the values before the steps).
        let steps = json!([
            ["gelu", -2, 0.0],
            ["add", 1, 0.0],
            ["mul", 2, 0.0],
            ["sub", -1, 0.5],
            ["mul", 0, 0.0]
        ]);
        let column = |i: usize| -> Vec<Json> {
            steps
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s[i].clone())
                .collect()
        };
        let chain_operands: Vec<Json> = column(1)
            .iter()
            .map(|k| if *k == json!(0) { json!(3) } else { k.clone() })
            .collect();
        let linear_of = |x: &Tensor, bias: bool, epilogue: Option<(&Tensor, &Tensor)>| {
            let mut args = vec![
                ("input", json!({"as_tensor": {"name": "x"}})),
                ("weight", json!({"as_tensor": {"name": "w"}})),
                ("out_features", json!({ "as_int": n })),
                ("in_features", json!({ "as_int": k })),
            ];
            let mut tensors = vec![("x", x.clone()), ("w", packed.clone())];
            if bias {
                args.push(("bias", json!({"as_tensor": {"name": "b"}})));
                tensors.push(("b", b.clone()));
            }
            if let Some((r, c)) = epilogue {
                let [ts, ops, operands, scalars] = super::super::pointwise::EPILOGUE_ARGS;
                let list = json!([{"name": "r"}, {"name": "c"}]);
                args.push((ts, json!({ "as_tensors": list })));
                args.push((ops, json!({ "as_strings": column(0) })));
                args.push((operands, json!({ "as_ints": column(1) })));
                args.push((scalars, json!({ "as_floats": column(2) })));
                tensors.extend([("r", r.clone()), ("c", c.clone())]);
            }
            let out = super::super::run_node(register, TARGET, &args, &tensors)?;
            match out.into_iter().next() {
                Some(crate::value::Value::Tensor(t)) => OpResult::Ok(t),
                _ => panic!("not a tensor"),
            }
        };
        let linear =
            |bias: bool, epilogue: Option<(&Tensor, &Tensor)>| linear_of(&x, bias, epilogue);
        let chain = |y: &Tensor, res: &Tensor| {
            let list = json!([{"name": "y"}, {"name": "r"}, {"name": "c"}, {"name": "y"}]);
            let args = [
                ("tensors", json!({ "as_tensors": list })),
                ("ops", json!({ "as_strings": column(0) })),
                ("operands", json!({ "as_ints": chain_operands })),
                ("scalars", json!({ "as_floats": column(2) })),
            ];
            let env = [("y", y.clone()), ("r", res.clone()), ("c", row.clone())];
            let register = super::super::pointwise::register;
            let out =
                super::super::run_node(register, super::super::pointwise::TARGET, &args, &env);
            match out.unwrap().into_iter().next() {
                Some(crate::value::Value::Tensor(t)) => t,
                _ => panic!("not a tensor"),
            }
        };
        let bits = |t: &Tensor| -> Vec<u32> {
            let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
            v.iter().map(|v| v.to_bits()).collect()
        };
        // 150 rows (each 6 against every panel, then the next 6) and 40 (each panel against
        // all of them: `PANEL_FIRST_ROWS`).
        let few = Tensor::randn(0f32, 0.05, (2, 20, k), &dev).unwrap();
        let few_res = Tensor::randn(0f32, 1.0, (2, 20, n), &dev).unwrap();
        const { assert!(150 > PANEL_FIRST_ROWS && 40 <= PANEL_FIRST_ROWS) };
        for (x, res) in [(&x, &res), (&few, &few_res)] {
            for bias in [false, true] {
                let want = chain(&linear_of(x, bias, None).unwrap(), res);
                let got = linear_of(x, bias, Some((res, &row))).unwrap();
                assert_eq!(got.dims(), want.dims());
                assert!(bits(&got) == bits(&want), "bias {bias}, {:?}", x.dims());
            }
        }
        let wide = Tensor::randn(0f32, 1.0, n + 1, &dev).unwrap();
        assert!(linear(true, Some((&res, &wide))).is_err());
        // The output's sizes given (a view looked through): the same values in that shape;
        // sizes of other elements or another last dim are refused.
        let plain = bits(&linear(true, None).unwrap());
        let shapes = [
            (vec![150, n], true),
            (vec![2, 75, n], true),
            (vec![3, 50, n + 1], false),
            (vec![3, 51, n], false),
        ];
        for (sizes, ok) in shapes {
            let args = [
                ("input", json!({"as_tensor": {"name": "x"}})),
                ("weight", json!({"as_tensor": {"name": "w"}})),
                ("bias", json!({"as_tensor": {"name": "b"}})),
                ("out_features", json!({ "as_int": n })),
                ("in_features", json!({ "as_int": k })),
                (OUTPUT_SHAPE_ARG, json!({ "as_ints": sizes })),
            ];
            let tensors = [("x", x.clone()), ("w", packed.clone()), ("b", b.clone())];
            match super::super::run_node(register, TARGET, &args, &tensors) {
                Ok(out) => match out.into_iter().next() {
                    Some(crate::value::Value::Tensor(t)) if ok => {
                        assert_eq!(t.dims(), &sizes[..]);
                        assert!(bits(&t) == plain);
                    }
                    _ => panic!("{sizes:?} accepted"),
                },
                Err(_) => assert!(!ok, "{sizes:?} refused"),
            }
        }
        let ints = Tensor::ones(n, DType::I64, &dev).unwrap();
        assert!(linear(true, Some((&res, &ints))).is_err());
    }
}
