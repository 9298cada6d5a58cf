//! Convolutions with few columns, that is input channels (of a group) times kernel taps (a
//! 1x1 convolution's input channels, a network's first 3x3 convolution over 3 channels: 27,
//! RegNet's grouped 3x3 convolutions over 8 channels a group: 72), computed directly on x86-64 CPUs with AVX-512: each output row (an output channel's
//! plane) written once, its bias and residual added and its activation applied in
//! registers.
//!
//! Such a convolution is the product `w [co, k] @ cols [k, pixels]` per image, `cols` the
//! input itself for a 1x1 convolution at stride 1 without padding, else the input unfolded.
//! With few columns (MobileNet's and EfficientNet's expansions on large planes: 16 → 64
//! channels on 112 x 112) the gemm crate's copy of `cols` into panels and the passes over
//! the output before (its bias planes) and after (its activation) cost as much as the
//! multiply-adds: the output is larger than the cache, and each pass reads it back from
//! memory; a first convolution's columns, unfolded whole, were larger than the cache too.
//! Here the output is produced in blocks of [`PIXELS`] pixels by [`ROWS`] output channels,
//! summed in registers over the columns: read in place (a 1x1 convolution's input; a first
//! convolution's input rows split into the stride's phases, [`Phased`]) or unfolded a
//! stretch of output pixels at a time into the cache (BENCHMARKS.md, issue 14).

use candle_core::{DType, Tensor};

use super::{out_len, reads_in_place, Act, Params, Shape, Unfolded};
use crate::error::OpResult;
use crate::ops::fused::{with_f32, Spare};
use crate::ops::packed::Columns;
use crate::ops::sgemm::{new_block, Shared};

/// Output channels a block sums together (one register each per 16 pixels).
const ROWS: usize = 6;

/// Pixels a block sums together: four registers of 16.
const PIXELS: usize = 64;

/// The most columns (input channels times kernel taps) this path takes. Single
/// convolutions, least of 400 runs, old path (the gemm crate's) against this one, 1 thread:
/// 16 → 64 channels on 112 x 112 0.386 / 0.315 ms at batch 1, 3.95 / 3.19 at batch 8; 96 →
/// 24 on 56 x 56 at batch 8 1.26 / 1.12; 40 → 120 on 28 x 28 at batch 8 0.650 / 0.615. With
/// 120 or 240 input channels the gemm crate was as fast or faster (120 → 40 on 28 x 28 at
/// batch 1: 0.069 / 0.075 ms): their input no longer fits the L1 cache along a block
/// (BENCHMARKS.md, issue 14).
const MAX_COLUMNS: usize = 96;

/// The most columns of a network's first convolution, over at most [`FIRST_CHANNELS`] input
/// channels: ResNet's 7x7 over 3 channels has 147. Its input unfolded whole is larger than
/// the cache (7.4 MB for one 224 x 224 image); here it is read in phases ([`Phased`]), which
/// took ResNet's first convolution from 1.69 to 1.33 ms at batch 1 on 1 thread (median of 8
/// paired processes; unfolded a stretch at a time before).
/// Single convolutions, least of 100 runs, the gemm crate's path against this one: 3 → 64
/// channels, 7x7 at stride 2 on 224 x 224, batch 1, 1 thread 2.95 / 2.76 ms, batch 8 26.0 /
/// 24.3, 2 threads 1.59 / 1.41 and 14.1 / 12.0. With 16 input channels and 3x3 kernels (144
/// columns) the gemm crate (or Winograd's algorithm) was faster: 16 → 32 at stride 2 on 112
/// x 112, batch 1, 1 thread 0.41 / 0.47 ms (BENCHMARKS.md, issue 14).
const MAX_FIRST_COLUMNS: usize = 160;

/// Input channels of a network's first convolution (an image's, at most RGBA).
const FIRST_CHANNELS: usize = 4;

/// The most columns this path takes for `c` input channels.
fn max_columns(c: usize) -> usize {
    if c <= FIRST_CHANNELS {
        MAX_FIRST_COLUMNS
    } else {
        MAX_COLUMNS
    }
}

/// The fewest output pixels per image this path takes: on smaller planes the pixel blocks,
/// and so the pieces of work for the threads, are too few.
const MIN_PIXELS: usize = 256;

/// Column values (columns times pixels) of the stretch of output pixels along which each
/// group of [`ROWS`] output channels is computed in turn: 128 KiB, in the L2 cache, where
/// the channel groups one pixel block after another had the output's rows written as
/// scattered pieces (16 → 64 channels on 112 x 112 at batch 8, 1 thread: 5.68 ms, against
/// 3.83 along stretches).
const STRETCH_VALUES: usize = 1 << 15;

/// The fewest blocks in a stretch: with many columns (ResNet's first convolution, 147), a
/// stretch of [`STRETCH_VALUES`] would hold three. Six took that convolution from 2.75 to
/// 2.66 ms at batch 1 and from 23.6 to 22.2 at batch 8 (1 thread, least of 100 runs).
const MIN_STRETCH_BLOCKS: usize = 6;

/// How far ahead (values along a row of columns) the first group of rows of a stretch asks
/// for its input: four blocks. Without it, products with few output channels on planes
/// larger than the cache were up to 15% slower than the gemm crate's (32 → 16 channels on
/// 112 x 112 at batch 8, 1 thread: 1.87 against 1.55 ms; 1.74 with it, in the same run).
const PREFETCH: usize = 4 * PIXELS;

/// Pieces of work per thread the images' pixels are cut into (at least one per image), so
/// that threads that finish early find more.
const PIECES_PER_THREAD: usize = 4;

/// Whether [`narrow`] computes a convolution of `c` input channels by a `kernel` with these
/// parameters, `pixels` output pixels per image: at most [`MAX_COLUMNS`] columns per group
/// ([`MAX_FIRST_COLUMNS`] for a first convolution), at least [`MIN_PIXELS`] pixels, a CPU with
/// AVX-512 and FMA; a 1x1 kernel only at stride 1 without padding (read in place). A 1x1 kernel
/// at stride 2 was faster by the gemm crate (64 → 128 channels on 56 x 56, batch 1, 1 thread:
/// 0.148 against 0.183 ms unfolded here), where the first 3x3 and 4x4 convolutions over 3
/// channels were not (3 → 16 channels on 224 x 224 at stride 2, batch 1, 2 threads: 0.162
/// against 0.109 ms; batch 8, 1 thread: 2.17 against 1.96; 3 → 96 channels 4x4 at stride 4,
/// batch 8, 1 thread: 3.54 against 3.17).
pub(super) fn applies(c: usize, [kh, kw]: [usize; 2], pixels: usize, p: &Params) -> bool {
    p.groups >= 1
        && c.is_multiple_of(p.groups)
        && (kh * kw > 1 || reads_in_place([kh, kw], p))
        && (1..=max_columns(c)).contains(&(c / p.groups * kh * kw))
        && pixels >= MIN_PIXELS
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("fma")
}

/// The convolution of `x` (`[n, c, h, w]`) by `w` (`[co, c, kh, kw]`), both contiguous f32,
/// plus `bias` and `residual` (each optional), activated: [`narrow`] on the tensors'
/// values. `None` (left to the other paths) for a residual that is not f32 of the output's
/// shape.
pub(super) fn conv(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&[f32]>,
    residual: Option<&Tensor>,
    p: &Params,
) -> OpResult<Option<Tensor>> {
    let (n, c, h, wd) = x.dims4()?;
    let (co, _, kh, kw) = w.dims4()?;
    let oh = out_len(h, kh, p.padding[0], p.stride[0], p.dilation[0])?;
    let ow = out_len(wd, kw, p.padding[1], p.stride[1], p.dilation[1])?;
    let residual = match residual {
        Some(r) if r.dims() == [n, co, oh, ow] && r.dtype() == DType::F32 => Some(r.contiguous()?),
        Some(_) => return Ok(None),
        None => None,
    };
    let shape = Shape {
        input: [n, c, h, wd],
        kernel: [kh, kw],
        out: [oh, ow],
    };
    let out = with_f32(w, |w| {
        with_f32(x, |x| match &residual {
            Some(r) => with_f32(r, |r| narrow(x, w, &shape, p, bias, Some(r))),
            None => Some(narrow(x, w, &shape, p, bias, None)),
        })
    });
    match out.flatten().flatten() {
        Some(out) => Ok(Some(Tensor::from_vec(out, (n, co, oh, ow), x.device())?)),
        None => Ok(None),
    }
}

/// `act(w @ cols + bias + residual)` per image and group of channels (`p.groups`) for `x:
/// [n, c, h, w]` (a group's columns: its input channels themselves for a 1x1 kernel at stride
/// 1 without padding, its input rows in phases for a first convolution whose taps overlap
/// (at most [`FIRST_CHANNELS`] input channels, groups 1), else unfolded as `im2col` does), `w: [co, c
/// / groups * kh * kw]` (a group's output channels its rows), `bias: [co]` and `residual: [n,
/// co, oh, ow]` (each optional), as a new `[n, co, oh, ow]` buffer written once; pieces of the
/// images' output pixels (whole blocks; whole output rows in phases) over the pool's threads,
/// each piece's stretches (output rows) computed for every group in turn. The sum of an
/// output starts from its bias and adds the columns in order, then the residual. Panics
/// unless [`applies`] said so for these sizes and the slices have them.
fn narrow(
    x: &[f32],
    w: &[f32],
    shape: &Shape,
    p: &Params,
    bias: Option<&[f32]>,
    residual: Option<&[f32]>,
) -> Vec<f32> {
    use rayon::prelude::*;
    let ([n, c, h, wd], [kh, kw], [oh, ow]) = (shape.input, shape.kernel, shape.out);
    // Each group's input and output channels (all of them for groups 1); `k` columns each.
    let groups = p.groups.max(1);
    let cg = c / groups;
    let (k, pixels) = (cg * kh * kw, oh * ow);
    let co = w.len() / k.max(1);
    let og = co / groups;
    let len = n * co * pixels;
    assert!(
        applies(c, [kh, kw], pixels, p)
            && x.len() == n * c * h * wd
            && w.len() == co * k
            && og * groups == co
            && bias.is_none_or(|b| b.len() == co)
            && residual.is_none_or(|r| r.len() == len),
        "narrow conv: sizes or a CPU it does not take"
    );
    let in_place = reads_in_place([kh, kw], p);
    // A first convolution whose taps overlap (more taps than the stride's area, so that
    // unfolding copies each input value several times) reads its input directly, split into
    // its stride's phases ([`Phased`]). ConvNeXt's 4x4 at stride 4, whose unfolding copies
    // each value once, was 1.12x slower so (3 -> 96 channels on 224 x 224, batch 1, 1 thread).
    let overlap = kh * kw > p.stride[0] * p.stride[1];
    let direct = !in_place && groups == 1 && c <= FIRST_CHANNELS && overlap;
    // Pieces of an image's output, enough for every thread to have a few: whole output rows
    // (direct), else whole blocks of its pixels, dealt out evenly (piece `b` starts at block
    // `b * blocks / pieces`): pieces of one size, rounded up to whole blocks, had left 7 for
    // 2 threads on 56 x 56 (4 to one thread, 3 to the other).
    let threads = rayon::current_num_threads();
    let per_image = (PIECES_PER_THREAD * threads).div_ceil(n.max(1)).max(1);
    let blocks = pixels.div_ceil(PIXELS);
    let pieces = per_image.min(if direct { oh } else { blocks }).max(1);
    let piece_start = |b: usize| (b * blocks / pieces * PIXELS).min(pixels);
    // Stretches of a piece, whole blocks, whose columns stay in the L2 cache while each
    // group of output channels is computed along them.
    let stretch = (STRETCH_VALUES / k / PIXELS).max(MIN_STRETCH_BLOCKS) * PIXELS;
    let zeros = vec![0f32; co];
    let bias = bias.unwrap_or(&zeros);
    let act = p.act;
    let work = |out: Shared, task: usize| {
        let (img, b) = (task / pieces, task % pieces);
        let img_x = &x[img * c * h * wd..][..c * h * wd];
        let mut cols = Spare::take();
        let mut offsets = [0usize; MAX_FIRST_COLUMNS];
        let offsets = &mut offsets[..k];
        let end = piece_start(b + 1);
        for s0 in (piece_start(b)..end).step_by(stretch) {
            let s1 = (s0 + stretch).min(end);
            for g in 0..groups {
                // The group's input channels, weight rows, biases, and output planes.
                let x_g = &img_x[g * cg * h * wd..][..cg * h * wd];
                let (w_g, bias_g) = (&w[g * og * k..][..og * k], &bias[g * og..][..og]);
                let planes = (img * co + g * og) * pixels;
                // The stretch's columns: `k` rows of `s1 - s0` values, `step` apart.
                let (src, step): (&[f32], usize) = if in_place {
                    (&x_g[s0..], pixels)
                } else {
                    let run = s1 - s0;
                    // Every value is written by the unfolding (one panel `run` wide): the
                    // buffer only grows (not zeroed).
                    if cols.len() < k * run {
                        cols.resize(k * run, 0.0);
                    }
                    let unfolded = Unfolded::new(x_g, [cg, h, wd], [kh, kw], ow, p);
                    unfolded.pack(0..k, s0..s1, run, &mut cols[..k * run]);
                    (&cols[..k * run], run)
                };
                for (i, offset) in offsets.iter_mut().enumerate() {
                    *offset = i * step;
                }
                let blocks = (s0..s1).step_by(PIXELS).map(|q| Along {
                    from: q - s0,
                    at: q,
                    pixels: PIXELS.min(s1 - q),
                });
                let rows = Rows {
                    w: w_g,
                    bias: bias_g,
                    offsets,
                    plane: pixels,
                    act,
                };
                // SAFETY: `applies` found AVX-512 and FMA; column `i` of the stretch's pixel
                // `q - s0` is `src[i * step + q - s0]` (the group's planes from pixel `s0`,
                // or the unfolded stretch), `s1 - s0` values a column; the residual (if
                // any) holds the image's `co` planes; and this task alone writes the image's
                // pixels `s0..s1`, so nothing else touches them.
                #[allow(unsafe_code)]
                unsafe {
                    let res = residual.map(|r| r.as_ptr().add(planes));
                    rows.along(blocks, src.as_ptr(), res, out.0.add(planes));
                }
            }
        }
    };
    // A piece of whole output rows, read from its input rows split into phases.
    let work_direct = |out: Shared, task: usize| {
        let (img, b) = (task / pieces, task % pieces);
        let (r0, r1) = (b * oh / pieces, (b + 1) * oh / pieces);
        if r0 == r1 {
            return;
        }
        let img_x = &x[img * c * h * wd..][..c * h * wd];
        let phased = Phased::new([c, h, wd], [kh, kw], ow, p);
        let mut buf = Spare::take();
        phased.fill(img_x, r0..r1, &mut buf);
        let mut offsets = [0usize; MAX_FIRST_COLUMNS];
        let offsets = &mut offsets[..k];
        phased.offsets(r1 - r0, offsets);
        let planes = img * co * pixels;
        let rows = Rows {
            w,
            bias,
            offsets,
            plane: pixels,
            act,
        };
        // Each output row in turn: its input (a few KB) stays in the L1 cache while every
        // group of output channels is computed along it.
        for y in r0..r1 {
            let from = (y - r0) * phased.row_step();
            let blocks = (0..ow).step_by(PIXELS).map(|x0| Along {
                from: from + x0,
                at: y * ow + x0,
                pixels: PIXELS.min(ow - x0),
            });
            // SAFETY: `applies` found AVX-512 and FMA; `Phased::offsets` puts column `i` of
            // output pixel `(y, x0 + j)` at `buf[from + x0 + offsets[i] + j]`, inside the
            // buffer `fill` wrote for rows `r0..r1`, for every `j < ow - x0`; the residual
            // (if any) holds the image's `co` planes; and this task alone writes the image's
            // output rows `r0..r1`.
            #[allow(unsafe_code)]
            unsafe {
                let res = residual.map(|r| r.as_ptr().add(planes));
                rows.along(blocks, buf.as_ptr(), res, out.0.add(planes));
            }
        }
    };
    // SAFETY: the tasks cover every image's output pixels `0..pixels` (pieces from
    // `piece_start(b)` to `piece_start(b + 1)`, the last ending at `pixels`; direct, rows
    // `b * oh / pieces` to `(b + 1) * oh / pieces`) for every output channel (groups of
    // `ROWS`), and `block_avx512` writes each element of its block before anything reads it.
    #[allow(unsafe_code)]
    let out = unsafe {
        new_block(len, |out| {
            let tasks = (0..n * pieces).into_par_iter();
            match direct {
                true => tasks.for_each(|t| work_direct(out, t)),
                false => tasks.for_each(|t| work(out, t)),
            }
            true
        })
    };
    out.expect("the narrow conv writes every element")
}

/// One block of a stretch: its first pixel's columns `from` values past the stretch's
/// start, its first output pixel `at` in the output planes, `pixels` pixels (at most
/// [`PIXELS`]).
struct Along {
    from: usize,
    at: usize,
    pixels: usize,
}

/// A group's weight `w` (`[og, k]`), `bias` (`[og]`), its columns' offsets, the output
/// planes' size and the activation: what every block of a stretch shares.
struct Rows<'a> {
    w: &'a [f32],
    bias: &'a [f32],
    offsets: &'a [usize],
    plane: usize,
    act: Act,
}

impl Rows<'_> {
    /// Every group of [`ROWS`] output channels along `blocks` in turn, the blocks' columns
    /// read from `cols` (column `i` of a block at `cols + from + offsets[i]`).
    ///
    /// # Safety
    /// AVX-512F and FMA; for each block, `pixels` readable values at each of its columns;
    /// `res` (if any) and `dst` point to the group's output planes, whose blocks' elements
    /// nothing else reads or writes meanwhile.
    #[allow(unsafe_code)]
    unsafe fn along(
        &self,
        blocks: impl Iterator<Item = Along> + Clone,
        cols: *const f32,
        res: Option<*const f32>,
        dst: *mut f32,
    ) {
        let og = self.bias.len();
        for o in (0..og).step_by(ROWS) {
            let rows = ROWS.min(og - o);
            for b in blocks.clone() {
                let block = Block {
                    cols: cols.add(b.from),
                    offsets: self.offsets,
                    at: b.at,
                    pixels: b.pixels,
                    plane: self.plane,
                };
                // A last group of fewer rows is computed as 2 or 4: the 16 and 32
                // channels of a first convolution took 3 groups of 6 (18) and 6 (36).
                match rows {
                    1 | 2 => self.block::<2>(&block, res, [o, rows], dst),
                    3 | 4 => self.block::<4>(&block, res, [o, rows], dst),
                    _ => self.block::<ROWS>(&block, res, [o, rows], dst),
                }
            }
        }
    }

    /// [`block_avx512`] with as many registers of 16 pixels as the block needs.
    ///
    /// # Safety
    /// As [`block_avx512`]'s.
    #[allow(unsafe_code)]
    unsafe fn block<const R: usize>(
        &self,
        b: &Block,
        res: Option<*const f32>,
        at: [usize; 2],
        dst: *mut f32,
    ) {
        let (w, bias, act) = (self.w, self.bias, self.act);
        match b.pixels.div_ceil(16) {
            1 => block_avx512::<R, 1>(b, w, bias, res, act, at, dst),
            2 => block_avx512::<R, 2>(b, w, bias, res, act, at, dst),
            3 => block_avx512::<R, 3>(b, w, bias, res, act, at, dst),
            _ => block_avx512::<R, { PIXELS / 16 }>(b, w, bias, res, act, at, dst),
        }
    }
}

/// An image's input rows for a piece of a first convolution's output rows, each input
/// row split by column into the stride's phases (phase `r` holds columns `r`, `r + stride`,
/// `r + 2 * stride`, ...) with zeros for the padding: every column of the product (an input
/// channel and a tap) then reads an output row's pixels as consecutive values, in place.
/// Unfolding the columns instead (147 values a pixel for ResNet's 7x7 first convolution)
/// was a fifth of that convolution's time (BENCHMARKS.md, issue 14).
struct Phased {
    /// `[c, h, w]` of the input.
    input: [usize; 3],
    kernel: [usize; 2],
    /// The stride, padding and dilation.
    p: Params,
    /// Zeros before a phase row's first input column: `ceil(padding / stride)`, the
    /// furthest a tap reaches left of its output column, in phase columns.
    lead: usize,
    /// Values in a phase row: the output row's width plus the taps' reach either side.
    width: usize,
}

impl Phased {
    fn new(input: [usize; 3], kernel: [usize; 2], ow: usize, p: &Params) -> Phased {
        let (s, pad) = (p.stride[1].max(1), p.padding[1]);
        let lead = pad.div_ceil(s);
        // The last tap's phase column, relative to its output column (may be negative).
        let reach =
            (((kernel[1] - 1) * p.dilation[1]) as isize - pad as isize).div_euclid(s as isize);
        Phased {
            input,
            kernel,
            p: *p,
            lead,
            width: (ow as isize + reach + lead as isize).max(ow as isize) as usize,
        }
    }

    /// Input rows (each split into its phases) that `out_rows` output rows read.
    fn rows(&self, out_rows: usize) -> usize {
        self.p.stride[0] * (out_rows - 1) + (self.kernel[0] - 1) * self.p.dilation[0] + 1
    }

    /// Values between the starts of two consecutive output rows' columns.
    fn row_step(&self) -> usize {
        self.p.stride[0] * self.width
    }

    /// `buf` (resized) holds the rows that output rows `out` read of `x` (`[c, h, w]`):
    /// channel after channel, phase after phase, row after row, `width` values a row.
    fn fill(&self, x: &[f32], out: std::ops::Range<usize>, buf: &mut Vec<f32>) {
        let [c, h, w] = self.input;
        let s = self.p.stride[1];
        let rows = self.rows(out.len());
        buf.resize(c * s * rows * self.width, 0.0);
        // The input row of the first row here (negative in the top padding).
        let first = (self.p.stride[0] * out.start) as isize - self.p.padding[0] as isize;
        for (i, dst) in buf.chunks_exact_mut(self.width).enumerate() {
            let (ch, r, t) = (i / (s * rows), i / rows % s, i % rows);
            let y = first + t as isize;
            if !(0..h as isize).contains(&y) {
                dst.fill(0.0);
                continue;
            }
            let src = &x[(ch * h + y as usize) * w..][..w];
            // Phase column `j` holds input column `s * (j - lead) + r`.
            let from = self.lead;
            let to = match w > r {
                true => ((w - 1 - r) / s + 1 + self.lead).min(self.width),
                false => from,
            };
            let to = to.max(from);
            dst[..from].fill(0.0);
            if to > from {
                super::unfolded::strided_copy(&mut dst[from..to], &src[r..], s);
            }
            dst[to..].fill(0.0);
        }
    }

    /// `offsets[i]`: where column `i` (input channel, tap row, tap column, in the weight's
    /// order) of an output row's first pixel lies in a buffer [`Phased::fill`] wrote for
    /// `out_rows` output rows, from the first of them (output row `y` of the piece adds `y
    /// * row_step()`, column `x` adds `x`).
    fn offsets(&self, out_rows: usize, offsets: &mut [usize]) {
        let [kh, kw] = self.kernel;
        let s = self.p.stride[1] as isize;
        let rows = self.rows(out_rows);
        for (i, offset) in offsets.iter_mut().enumerate() {
            let (ch, ky, kx) = (i / (kh * kw), i / kw % kh, i % kw);
            let e = (kx * self.p.dilation[1]) as isize - self.p.padding[1] as isize;
            let (q, r) = (e.div_euclid(s), e.rem_euclid(s) as usize);
            let row = (ch * self.p.stride[1] + r) * rows + ky * self.p.dilation[0];
            *offset = row * self.width + (q + self.lead as isize) as usize;
        }
    }
}

/// Where [`block_avx512`] reads and writes: column `i` of the block's first pixel at `cols +
/// offsets[i]` (`k` columns), its other pixels after it, for `pixels` (at most [`PIXELS`])
/// output pixels from pixel `at` of output planes of `plane` pixels.
struct Block<'a> {
    cols: *const f32,
    offsets: &'a [usize],
    at: usize,
    pixels: usize,
    plane: usize,
}

/// Output channels `o..o + rows` (`rows <= R`, `R` at most [`ROWS`]) of one block of output
/// pixels (`V` registers of 16, at least `block.pixels`): `bias[o + r]` plus `w[o + r, i] *
/// cols[i][pixel]` for each column `i` in order, plus the residual's element (`res[(o + r) * plane + at + pixel]`), activated
/// ([`Act::apply_m512`]) and stored at `dst[(o + r) * plane + at + pixel]`. `R` rows are
/// summed (those past `rows` repeat the last one, and are not stored).
///
/// # Safety
/// AVX-512F and FMA; `block.offsets` holds `k = w.len() / bias.len()` offsets, and from
/// `block.cols` on, each holds at least `block.pixels` readable values; `16 * V >=
/// block.pixels`; `w` is `[co, k]` with `co = bias.len()`,
/// `1 <= rows <= R`, `o + rows <= co`, `block.at + block.pixels <= block.plane`; `res` (if
/// any) points to `co` planes of `block.plane` values, and `dst` to `co` planes that nothing
/// else reads or writes at the block's elements meanwhile.
#[target_feature(enable = "avx512f,fma")]
#[allow(unsafe_code)]
unsafe fn block_avx512<const R: usize, const V: usize>(
    block: &Block,
    w: &[f32],
    bias: &[f32],
    res: Option<*const f32>,
    act: Act,
    [o, rows]: [usize; 2],
    dst: *mut f32,
) {
    use std::arch::x86_64::*;
    let k = w.len() / bias.len();
    let mask = |i: usize| -> __mmask16 {
        let n = block.pixels.saturating_sub(16 * i).min(16);
        ((1u32 << n) - 1) as u16
    };
    let masks: [__mmask16; V] = std::array::from_fn(mask);
    // Rows past the last output channel repeat it: computed, never stored.
    let row = |r: usize| o + r.min(rows - 1);
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    for (r, a) in acc.iter_mut().enumerate() {
        *a = [_mm512_set1_ps(bias[row(r)]); V];
    }
    let wp = w.as_ptr();
    for (i, &offset) in block.offsets.iter().enumerate().take(k) {
        let at = block.cols.add(offset);
        // The first group of rows reads the stretch's columns from memory: ask for them ahead.
        if o == 0 {
            for v in 0..V {
                _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(PREFETCH + 16 * v).cast());
            }
        }
        let xs: [__m512; V] =
            std::array::from_fn(|v| _mm512_maskz_loadu_ps(masks[v], at.add(16 * v)));
        for (r, a) in acc.iter_mut().enumerate() {
            let wv = _mm512_set1_ps(*wp.add(row(r) * k + i));
            for (a, &xv) in a.iter_mut().zip(&xs) {
                *a = _mm512_fmadd_ps(wv, xv, *a);
            }
        }
    }
    for (r, a) in acc.iter().enumerate().take(rows) {
        let at = (o + r) * block.plane + block.at;
        for (v, &s) in a.iter().enumerate() {
            let s = match res {
                Some(res) => {
                    _mm512_add_ps(s, _mm512_maskz_loadu_ps(masks[v], res.add(at + 16 * v)))
                }
                None => s,
            };
            _mm512_mask_storeu_ps(dst.add(at + 16 * v), masks[v], act.apply_m512(s));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Groups 1 with these stride, padding, dilation and activation.
    fn params(stride: [usize; 2], padding: [usize; 2], dilation: [usize; 2], act: Act) -> Params {
        Params {
            stride,
            padding,
            dilation,
            groups: 1,
            act,
        }
    }

    /// Whether this CPU takes the path at all (AVX-512 and FMA).
    fn cpu_takes_it() -> bool {
        applies(
            16,
            [1, 1],
            MIN_PIXELS,
            &params([1, 1], [0, 0], [1, 1], Act::None),
        )
    }

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.0) - 1.0)
            .collect()
    }

    /// Against sums in f64 (then the same activation), for 1x1 convolutions read in place
    /// and kernels read unfolded (a first 3x3 convolution at stride 2, a 4x4 one at stride
    /// 4, a 2x2 one at stride 2, dilation and unequal padding): output channel counts that
    /// are not a multiple of a block's six (7, 13), planes that end inside a block, one and
    /// 96 columns, a batch, with and without bias and residual, each activation; and a first
    /// 7x7 convolution (147 columns) whose pieces hold more than one stretch. The pieces and
    /// stretches begin and end inside output rows. The first convolutions whose taps
    /// overlap (at most 4 input channels, read in phases; the 4x4 at stride 4 is unfolded)
    /// include stride 3 with padding 4 (a tap's column wholly in the padding), unequal
    /// strides and dilations, and output rows that end in blocks of one to four registers.
    #[test]
    fn narrow_matches_f64_sums() {
        // (input [n, c, h, w], co, [kernel, stride, padding, dilation], bias, residual, act)
        type Case = ([usize; 4], usize, [[usize; 2]; 4], bool, bool, Act);
        let one = [1, 1];
        #[rustfmt::skip]
        let cases: [Case; 13] = [
            ([2, 3, 15, 20], 7, [one, one, [0, 0], one], true, true, Act::Relu),
            ([1, 96, 1, 257], 13, [one, one, [0, 0], one], false, false, Act::Silu),
            ([3, 1, 16, 16], 6, [one, one, [0, 0], one], true, false, Act::Hardswish),
            ([1, 16, 56, 56], 64, [one, one, [0, 0], one], true, false, Act::None),
            ([1, 3, 45, 38], 16, [[3, 3], [2, 2], [1, 1], one], true, false, Act::Hardswish),
            ([2, 3, 64, 68], 20, [[4, 4], [4, 4], [0, 0], one], true, true, Act::None),
            ([1, 20, 40, 30], 9, [[2, 2], [2, 2], [0, 0], one], false, false, Act::Relu),
            ([1, 2, 30, 40], 5, [[3, 3], one, [2, 1], [2, 1]], true, false, Act::Silu),
            ([2, 5, 20, 37], 11, [[2, 3], [1, 2], [1, 0], one], false, true, Act::None),
            ([1, 3, 130, 130], 10, [[7, 7], [2, 2], [3, 3], one], true, true, Act::Relu),
            ([1, 4, 23, 50], 7, [[5, 3], [1, 3], [2, 4], one], true, false, Act::None),
            ([2, 1, 20, 150], 3, [[2, 5], [2, 2], [0, 3], [1, 2]], false, true, Act::Relu),
            ([1, 3, 40, 110], 2, [[3, 3], one, one, one], true, true, Act::Silu),
        ];
        if !cpu_takes_it() {
            return; // no AVX-512 here: the path is never taken
        }
        for (input, co, [kernel, stride, padding, dilation], with_bias, with_res, act) in cases {
            let [n, c, h, wd] = input;
            let [kh, kw] = kernel;
            let p = params(stride, padding, dilation, act);
            let oh = out_len(h, kh, padding[0], stride[0], dilation[0]).unwrap();
            let ow = out_len(wd, kw, padding[1], stride[1], dilation[1]).unwrap();
            assert!(applies(c, kernel, oh * ow, &p), "{input:?} {kernel:?}");
            let x = values(n * c * h * wd, 1);
            let w = values(co * c * kh * kw, 2);
            let bias = with_bias.then(|| values(co, 3));
            let res = with_res.then(|| values(n * co * oh * ow, 4));
            let shape = Shape {
                input,
                kernel,
                out: [oh, ow],
            };
            let got = narrow(&x, &w, &shape, &p, bias.as_deref(), res.as_deref());
            let mut want = vec![0f32; n * co * oh * ow];
            for (at, want) in want.iter_mut().enumerate() {
                let (img, o, y, xo) = (
                    at / (co * oh * ow),
                    at / (oh * ow) % co,
                    at / ow % oh,
                    at % ow,
                );
                let mut s = bias.as_ref().map_or(0.0, |b| b[o] as f64);
                for ci in 0..c {
                    for i in 0..kh {
                        for j in 0..kw {
                            let iy =
                                (y * stride[0] + i * dilation[0]) as isize - padding[0] as isize;
                            let ix =
                                (xo * stride[1] + j * dilation[1]) as isize - padding[1] as isize;
                            if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                continue;
                            }
                            let v = x[((img * c + ci) * h + iy as usize) * wd + ix as usize];
                            s += w[((o * c + ci) * kh + i) * kw + j] as f64 * v as f64;
                        }
                    }
                }
                s += res.as_ref().map_or(0.0, |r| r[at] as f64);
                *want = s as f32;
            }
            act.apply(&mut want);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                    "{input:?} co {co} kernel {kernel:?} stride {stride:?}: element {i}: {g} against {w}"
                );
            }
        }
    }

    /// The path takes convolutions with at most `MAX_COLUMNS` columns per group (at most
    /// `MAX_FIRST_COLUMNS` over at most `FIRST_CHANNELS` input channels) and at least
    /// `MIN_PIXELS` output pixels (1x1 ones only at stride 1 unpadded), and no other.
    #[test]
    fn narrow_applies_only_where_it_computes() {
        if !cpu_takes_it() {
            return; // no AVX-512 here
        }
        let p = params([1, 1], [0, 0], [1, 1], Act::None);
        assert!(applies(MAX_COLUMNS, [1, 1], MIN_PIXELS, &p));
        assert!(applies(3, [4, 8], MIN_PIXELS, &p));
        assert!(!applies(MAX_COLUMNS + 1, [1, 1], 4096, &p));
        assert!(!applies(11, [3, 3], 4096, &p));
        assert!(applies(FIRST_CHANNELS, [5, 8], 4096, &p));
        assert!(applies(3, [7, 7], 4096, &p));
        assert!(!applies(FIRST_CHANNELS, [7, 7], 4096, &p));
        assert!(!applies(FIRST_CHANNELS + 1, [5, 5], 4096, &p));
        assert!(!applies(16, [1, 1], MIN_PIXELS - 1, &p));
        assert!(!applies(0, [1, 1], 4096, &p));
        // Columns per group: RegNet's 8 channels a group by 3x3 (72), not 16 (144).
        let groups = |g| Params { groups: g, ..p };
        assert!(applies(16, [1, 1], 4096, &groups(2)));
        assert!(applies(48, [3, 3], 4096, &groups(6)));
        assert!(!applies(48, [3, 3], 4096, &groups(3)));
        assert!(!applies(16, [1, 1], 4096, &groups(3)));
        assert!(!applies(16, [1, 1], 4096, &groups(0)));
        let stride_2 = params([2, 2], [0, 0], [1, 1], Act::None);
        assert!(!applies(16, [1, 1], 4096, &stride_2));
        let padded = params([1, 1], [0, 1], [1, 1], Act::None);
        assert!(!applies(16, [1, 1], 4096, &padded));
    }

    /// Convolution nodes that take this path (through `conv`: a 1x1 one with bias, a
    /// residual and an activation; a first 3x3 one at stride 2) give candle's own conv2d plus
    /// the bias and residual, activated.
    #[test]
    fn conv_by_this_path_matches_candle() {
        let dev = Device::Cpu;
        // (input, co, kernel, stride, padding, residual)
        let cases = [
            ([2, 24, 20, 17], 30, 1, 1, 0, true),
            ([1, 3, 40, 36], 16, 3, 2, 1, false),
        ];
        if !cpu_takes_it() {
            return; // no AVX-512 here
        }
        for ([n, c, h, wd], co, k, s, pd, with_res) in cases {
            let p = params([s, s], [pd, pd], [1, 1], Act::Relu);
            let (oh, ow) = (
                out_len(h, k, pd, s, 1).unwrap(),
                out_len(wd, k, pd, s, 1).unwrap(),
            );
            assert!(applies(c, [k, k], oh * ow, &p), "{:?}", [n, c, h, wd]);
            let x = Tensor::randn(0f32, 1., (n, c, h, wd), &dev).unwrap();
            let w = Tensor::randn(0f32, 1., (co, c, k, k), &dev).unwrap();
            let b = Tensor::randn(0f32, 1., co, &dev).unwrap();
            let want = x
                .conv2d(&w, pd, s, 1, 1)
                .unwrap()
                .broadcast_add(&b.reshape((1, co, 1, 1)).unwrap())
                .unwrap();
            let r = with_res.then(|| Tensor::randn(0f32, 1., want.dims(), &dev).unwrap());
            let want = match &r {
                Some(r) => want.add(r).unwrap(),
                None => want,
            }
            .relu()
            .unwrap();
            let got = super::super::conv(&x, &w, Some(&b), r.as_ref(), &p).unwrap();
            let diff = crate::ops::max_abs_diff(&got, &want);
            assert!(diff < 1e-4, "{:?}: {diff}", x.dims());
        }
    }
}
