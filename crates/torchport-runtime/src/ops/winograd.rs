//! 3x3, stride-1 convolutions by Winograd's minimal filtering F(2x2, 3x3): each 2x2 block
//! of output pixels (a tile) is computed from the 4x4 input patch under it as 16
//! elementwise products in a transformed space, instead of 36 multiply-adds per output
//! pixel. Summed over input channels, the 16 products become 16 matrix products
//! `U[i] (c_out x c_in) @ V[i] (c_in x tiles)`, so the arithmetic drops by 2.25x; the
//! transforms that move into and out of that space use only additions and halvings.
//!
//! With `d` a 4x4 input patch, `g` a 3x3 kernel and `m` the 4x4 products,
//! `V = Bᵀ d B`, `U = G g Gᵀ`, and the 2x2 output is `Aᵀ m A`, where
//! `Bᵀ = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]`,
//! `G = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2], [0, 0, 1]]` and
//! `Aᵀ = [[1, 1, 1, 0], [0, 1, -1, -1]]` (Lavin and Gray, "Fast Algorithms for
//! Convolutional Neural Networks", 2015).
//!
//! An image is processed a block of tile rows at a time, so that its transformed input
//! (`[c_in][16][tiles]`) and products (`[16][c_out][tiles]`) stay in cache. When it is the
//! only image per thread, its blocks run in parallel, or, where that would have each thread
//! read the whole transformed weight for a few tiles, each block's steps do (see
//! `conv_image`).

use rayon::prelude::*;

use std::mem::MaybeUninit;

use super::conv::Act;
use super::fused::put;
use super::packed::Packing;
use super::sgemm::{sgemm, Mat};

/// Bytes of transformed input (or products) one block of tile rows may take for each thread
/// that works on it.
const BLOCK_BYTES: usize = 1 << 20;

/// The shape of one 3x3, stride-1, dilation-1 convolution of one image.
#[derive(Clone, Copy, Debug)]
pub(super) struct Geometry {
    /// Input channels, height and width.
    pub c: usize,
    pub h: usize,
    pub w: usize,
    /// Output channels.
    pub co: usize,
    /// Zero padding above/below and left/right.
    pub pad: [usize; 2],
}

impl Geometry {
    /// Output height and width (`None` when the padded input is smaller than the kernel).
    pub fn out(&self) -> Option<[usize; 2]> {
        let oh = (self.h + 2 * self.pad[0]).checked_sub(2)?;
        let ow = (self.w + 2 * self.pad[1]).checked_sub(2)?;
        Some([oh, ow])
    }

    /// Tile rows and columns (2x2 output pixels each; the last may overhang the output).
    fn tiles(&self) -> [usize; 2] {
        let [oh, ow] = self.out().unwrap_or([0, 0]);
        [oh.div_ceil(2), ow.div_ceil(2)]
    }
}

/// The transformed weights `U[16][c_out][c_in]` of a `[c_out, c_in, 3, 3]` weight, blocks
/// of [`WEIGHT_CHANNELS_PER_TASK`] output channels on the pool's threads, each value written
/// once. Done once at load where the graph gives the convolution's sizes
/// (`prepare::transform_winograd_convs`), else on every call: on one thread it took 0.16–0.20
/// ms for 128 x 128 channels (ResNet-18's whole batch-1 convolution on 28 x 28: about 2.1 ms)
/// and 0.57–0.81 ms for 256 x 256; on 2 threads 0.155 → 0.076 and 0.80 → 0.28 ms with this
/// split (least of 50 calls; BENCHMARKS.md, issue 14). Panics if `w` holds fewer than
/// `co * c * 9` values.
pub(crate) fn weights(w: &[f32], co: usize, c: usize) -> Vec<f32> {
    weights_into(w, co, c, Vec::new())
}

/// [`weights`] written into `u`'s spare capacity (`u` is emptied first; it grows if it
/// lacks room).
pub(crate) fn weights_into(w: &[f32], co: usize, c: usize, mut u: Vec<f32>) -> Vec<f32> {
    let len = 16 * co * c;
    assert!(
        w.len() >= co * c * 9,
        "winograd weights: {} values for {co} x {c} x 3 x 3",
        w.len()
    );
    u.clear();
    u.reserve(len);
    if c == 0 || co == 0 {
        return u;
    }
    // Each task's rows of each U[i]: output channels b * per .. (b + 1) * per.
    let per = WEIGHT_CHANNELS_PER_TASK;
    let mut tasks: Vec<Vec<&mut [MaybeUninit<f32>]>> = (0..co.div_ceil(per))
        .map(|_| Vec::with_capacity(16))
        .collect();
    for ui in u.spare_capacity_mut()[..len].chunks_exact_mut(co * c) {
        for (task, rows) in tasks.iter_mut().zip(ui.chunks_mut(per * c)) {
            task.push(rows);
        }
    }
    // Per output channel, vectorised over input channels: the taps as 9 planes of c, then
    // G g (4 x 3 planes), then (G g) Gᵀ (4 x 4 planes), each copied into its row of U[i].
    // Each thread's buffers, kept from call to call (`WEIGHT_SCRATCH`: taken for a task and
    // given back after it).
    tasks.into_par_iter().enumerate().for_each(|(b, mut rows)| {
        let mut scratch = WEIGHT_SCRATCH.with_borrow_mut(std::mem::take);
        for (buf, len) in scratch.iter_mut().zip([9 * c, 12 * c, 4 * c]) {
            if buf.len() < len {
                buf.resize(len, 0.0);
            }
        }
        let [taps, gg, ggt] = &mut scratch;
        super::fused::simd(
            #[inline(always)]
            || {
                let first = b * per;
                for (l, wo) in w.chunks_exact(c * 9).skip(first).take(per).enumerate() {
                    for (ic, k) in wo.chunks_exact(9).enumerate() {
                        for (t, &x) in k.iter().enumerate() {
                            taps[t * c + ic] = x;
                        }
                    }
                    let tap = |t: usize| &taps[t * c..][..c];
                    for j in 0..3 {
                        let out = pieces_mut(gg, c, [j, 3 + j, 6 + j, 9 + j].map(|i| i * c));
                        transform_g([tap(j), tap(3 + j), tap(6 + j)], out);
                    }
                    for r in 0..4 {
                        let g = |j: usize| &gg[(r * 3 + j) * c..][..c];
                        let out = pieces_mut(ggt, c, [0, c, 2 * c, 3 * c]);
                        transform_g([g(0), g(1), g(2)], out);
                        for (s, ui) in rows[4 * r..4 * r + 4].iter_mut().enumerate() {
                            put(&mut ui[l * c..][..c], &ggt[s * c..][..c]);
                        }
                    }
                }
            },
        );
        WEIGHT_SCRATCH.with_borrow_mut(|spare| *spare = scratch);
    });
    // SAFETY: the tasks' rows cover every U[i] whole (blocks of `per` output channels), and
    // each task wrote every row of each of its output channels.
    #[allow(unsafe_code)]
    unsafe {
        u.set_len(len)
    };
    u
}

/// Output channels per task of [`weights`].
const WEIGHT_CHANNELS_PER_TASK: usize = 8;

/// Four disjoint `n`-long pieces of `buf`, starting at `starts` (increasing, each at least
/// `n` past the one before).
fn pieces_mut(buf: &mut [f32], n: usize, starts: [usize; 4]) -> [&mut [f32]; 4] {
    let (p0, rest) = buf[starts[0]..].split_at_mut(n);
    let (p1, rest) = rest[starts[1] - starts[0] - n..].split_at_mut(n);
    let (p2, rest) = rest[starts[2] - starts[1] - n..].split_at_mut(n);
    let p3 = &mut rest[starts[3] - starts[2] - n..][..n];
    [p0, p1, p2, p3]
}

/// The block buffers a thread reuses across blocks and calls: the block's transformed input
/// and its products. Each thread keeps its own (`BLOCK`) rather than allocating them per call
/// from the allocator's one heap (see `packed::unpacked_product`).
#[derive(Default)]
struct Scratch {
    vin: Vec<f32>,
    prod: Vec<f32>,
}

thread_local! {
    static BLOCK: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
    /// The input and output transforms' intermediate rows (borrowed for one channel's
    /// transform, which runs nothing on the pool).
    static ROWS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// [`weights`]' buffers: a filter's taps as 9 planes, G g, (G g) Gᵀ.
    static WEIGHT_SCRATCH: std::cell::RefCell<[Vec<f32>; 3]> = std::cell::RefCell::default();
}

/// `f` on this thread's [`ROWS`], at least `len` values.
fn with_rows<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    ROWS.with_borrow_mut(|rows| {
        if rows.len() < len {
            rows.resize(len, 0.0);
        }
        f(&mut rows[..len])
    })
}

/// Convolve one image `[c, h, w]` with transformed weights `u` (from [`weights`]) into
/// `dst` (`[c_out, oh, ow]`), adding `bias` (and, with `accumulate`, onto what `dst` holds)
/// and applying `act`. With `threads` > 1 the work is split over the rayon pool one of two
/// ways: by blocks of tile rows, each block's transforms and products on one thread (at least
/// one block per thread); or, where every such block would read the whole transformed weight
/// again for few tiles ([`by_planes`]), block by block with each of a block's three steps
/// split: input channels, then the 16 products (and bands of output channels), then output
/// channels. Returns false when a buffer is too small for the geometry (a caller's error),
/// having written part of `dst`.
#[allow(clippy::too_many_arguments)]
pub(super) fn conv_image(
    img: &[f32],
    u: &[f32],
    g: &Geometry,
    bias: Option<&[f32]>,
    act: Act,
    dst: &mut [f32],
    accumulate: bool,
    threads: usize,
) -> bool {
    let step = Step {
        img,
        u,
        g,
        bias,
        act,
        accumulate,
    };
    step.image(dst, plan(g, threads), threads)
}

/// How [`conv_image`] splits an image over `threads` threads: `(tile rows per block, whether
/// each block's steps are split over the threads ([`by_planes`]) rather than each block run
/// on one)`.
fn plan(g: &Geometry, threads: usize) -> (usize, bool) {
    let [th, tw] = g.tiles();
    // Tile rows per block: as many as keep a block's transformed input and products within
    // `BLOCK_BYTES` for each thread that works on it.
    let cache_rows = |threads: usize| {
        (threads * BLOCK_BYTES / (64 * g.c.max(g.co).max(1) * tw.max(1))).clamp(1, th.max(1))
    };
    let even = th.div_ceil(th.div_ceil(cache_rows(1)).max(threads.min(th)).max(1));
    let rows = match threads {
        1 => fuller_panels(th, tw, cache_rows(1)).unwrap_or(even),
        _ => even,
    };
    let rounds = th.div_ceil(rows.max(1)).div_ceil(threads.max(1));
    if threads > 1 && by_planes(g, th * tw, rounds, threads) {
        (cache_rows(threads), true)
    } else {
        (rows.max(1), false)
    }
}

/// On one thread, the tile rows per block, at most `most`, for which the blocks' products
/// cost the microkernel least ([`Packing::columns_cost`] of each block's tiles), the larger
/// on a tie: each product's last panel of a block's tiles is partly empty, and a last panel
/// of a few tiles cost half a full one. For ResNet's 56 x 56 layers (28 tile rows of 28,
/// at most 9 rows a block by the cache), blocks of 7 (three panels and 4 tiles, those 4 by
/// dot products: `ops/dots.rs`); before those, blocks of 9 (three panels and 60 tiles, the
/// last block 28), which took a single convolution of that shape 0.90x the time of the
/// even split then; torchvision's ResNet-18 at batch 1 on 1 thread read 0.907 of the session's
/// first build with them, where the build with the even split read 0.936. `None` where this
/// CPU has no microkernel of its own.
fn fuller_panels(th: usize, tw: usize, most: usize) -> Option<usize> {
    let pk = Packing::detect()?;
    let cost = |rows: usize| {
        let block = |r: usize| pk.columns_cost(r * tw);
        th / rows * block(rows) + block(th % rows)
    };
    (1..=most.min(th)).rev().min_by_key(|&rows| cost(rows))
}

/// Whether [`conv_image`] splits each block's steps over the threads rather than giving each
/// thread blocks of tile rows: where the transformed weight (`16 c_out c_in` values), which
/// every block reads whole, read once per thread for each of the `rounds` blocks it runs,
/// outweighs the weight read once between them plus the transformed input and products
/// (`16 (c_in + c_out)` values a tile) passing between threads (written by one, read by
/// another). For ResNet's 14 x 14 convolutions of 256 channels on 2 threads, the split by
/// tile rows gave 4 rows to one thread and 3 to the other, each reading all 4 MB of the
/// transformed weight: 1.10-1.16 ms each inside ResNet-50 at batch 1, 0.88-0.92 split by
/// planes (1 thread: 1.68-1.77; least of 5 runs, 2 cores; BENCHMARKS.md, issue 14).
fn by_planes(g: &Geometry, tiles: usize, rounds: usize, threads: usize) -> bool {
    let weights = g.co.saturating_mul(g.c);
    let rereads = weights.saturating_mul(rounds).saturating_mul(threads);
    let passed = (g.c + g.co).saturating_mul(tiles).saturating_mul(2);
    rereads > weights.saturating_add(passed)
}

/// What every block of one [`conv_image`] call shares.
struct Step<'a> {
    img: &'a [f32],
    u: &'a [f32],
    g: &'a Geometry,
    bias: Option<&'a [f32]>,
    act: Act,
    accumulate: bool,
}

impl Step<'_> {
    /// [`conv_image`] into `dst` over `threads` threads by the plan `(rows, split)`
    /// ([`plan`]).
    fn image(&self, dst: &mut [f32], (rows, split): (usize, bool), threads: usize) -> bool {
        let g = self.g;
        let Some([oh, ow]) = g.out() else {
            return false;
        };
        let [th, tw] = g.tiles();
        if self.img.len() < g.c * g.h * g.w
            || dst.len() < g.co * oh * ow
            || self.u.len() < 16 * g.co * g.c
            || rows == 0
        {
            return false;
        }
        if th == 0 || tw == 0 || g.co == 0 {
            return true;
        }
        // Each block's part of the output: output rows 2 * r0 .. 2 * r1 of every plane.
        let mut parts: Vec<Vec<&mut [f32]>> = (0..th.div_ceil(rows))
            .map(|_| Vec::with_capacity(g.co))
            .collect();
        for plane in dst[..g.co * oh * ow].chunks_mut(oh * ow) {
            for (part, band) in parts.iter_mut().zip(plane.chunks_mut(2 * rows * ow)) {
                part.push(band);
            }
        }
        // This thread's block buffers, taken for the block and given back after it (a block
        // inside this one would find none and use its own).
        let run = |(b, part): (usize, Vec<&mut [f32]>), threads: usize| {
            let mut s = BLOCK.with_borrow_mut(std::mem::take);
            let r = [b * rows, ((b + 1) * rows).min(th)];
            let ok = self.block(&mut s, r, part, threads);
            BLOCK.with_borrow_mut(|spare| *spare = s);
            ok
        };
        if split {
            parts.into_iter().enumerate().all(|part| run(part, threads))
        } else if threads > 1 {
            parts.into_par_iter().enumerate().all(|part| run(part, 1))
        } else {
            parts.into_iter().enumerate().all(|part| run(part, 1))
        }
    }

    /// Tile rows `r0..r1` into `bands` (each output channel's rows `2 * r0 .. 2 * r1`): the
    /// input transform (`[c_in][16][tiles]`), the 16 products (`[16][c_out][tiles]`) and the
    /// output transform, each step over the pool's threads when `threads` > 1 (one loop
    /// after another), else on this thread.
    fn block(
        &self,
        s: &mut Scratch,
        [r0, r1]: [usize; 2],
        bands: Vec<&mut [f32]>,
        threads: usize,
    ) -> bool {
        let g = self.g;
        let [oh, ow] = g.out().unwrap_or([0, 0]);
        let [_, tw] = g.tiles();
        let tb = (r1 - r0) * tw;
        // The buffers keep the size of the largest block so far; this block uses their start.
        for (buf, len) in [(&mut s.vin, g.c * 16 * tb), (&mut s.prod, g.co * 16 * tb)] {
            if buf.len() < len {
                buf.resize(len, 0.0);
            }
        }
        let (vin, prod) = (&mut s.vin[..g.c * 16 * tb], &mut s.prod[..g.co * 16 * tb]);
        // One piece per loop on one thread; pieces as small as rayon likes over the pool.
        let least = if threads > 1 { 1 } else { usize::MAX };
        let in_len = input_scratch(r1 - r0, tw);
        vin.par_chunks_exact_mut(16 * tb)
            .with_min_len(least)
            .enumerate()
            .for_each(|(ci, vc)| {
                let plane = &self.img[ci * g.h * g.w..][..g.h * g.w];
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512.
                    #[allow(unsafe_code)]
                    unsafe {
                        return input_tiles_avx512(plane, g, [r0, r1], vc);
                    }
                }
                with_rows(in_len, |tmp| input_tiles(plane, g, [r0, r1], vc, tmp));
            });
        // Bands of output channels, enough for two products a thread (at least 16 rows
        // each), each product U[i] rows o0.. @ V[i] into its rows of P[i].
        let per = g.co.div_ceil((2 * threads).div_ceil(16)).max(16.min(g.co));
        let vin = &*vin;
        let ok = prod
            .par_chunks_mut(g.co * tb)
            .with_min_len(least)
            .enumerate()
            .flat_map(|(i, pi)| {
                pi.par_chunks_mut(per * tb)
                    .with_min_len(least)
                    .enumerate()
                    .map(move |(b, d)| (i, b * per, d))
            })
            .all(|(i, o0, d)| {
                let co = d.len() / tb;
                let v = Mat {
                    data: &vin[i * tb..],
                    rs: 16 * tb,
                    cs: 1,
                };
                let w = Mat::rows(&self.u[(i * g.co + o0) * g.c..], g.c);
                sgemm(co, tb, g.c, w, v, d, tb, false, 1.0, 1)
            });
        if !ok {
            return false;
        }
        let prod = &*prod;
        bands
            .into_par_iter()
            .with_min_len(least)
            .enumerate()
            .for_each(|(oc, band)| {
                let b = self.bias.map_or(0.0, |b| b.get(oc).copied().unwrap_or(0.0));
                let mc = (&prod[oc * tb..], g.co * tb);
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512.
                    #[allow(unsafe_code)]
                    unsafe {
                        output_tiles_avx512(mc, [oh, ow], tw, [r0, r1], b, (band, self.accumulate));
                    }
                    self.act.apply(band);
                    return;
                }
                let out = (band, self.accumulate);
                with_rows(12 * tb, |tmp| {
                    output_tiles(mc, [oh, ow], tw, [r0, r1], b, self.act, out, tmp)
                });
            });
        true
    }
}

/// Transform the input tiles of tile rows `r0..r1` of one channel plane `[h, w]` into `vc`
/// (`[16][tiles]`, the tiles of those rows in row-major order). `tmp` holds at least
/// [`input_scratch`] values.
///
/// Every step runs over all the rows' tiles at once, so that its loops are long enough to
/// vectorise (one tile row of a 28 x 28 plane is 14 tiles, less than one AVX-512 register):
/// the input rows under the tile rows, each split once into its even and odd columns; then
/// the row combinations of each tile row's four input rows; then the column combinations,
/// over the rows laid end to end (`tw + 1` columns each, the extra one a tile past the
/// row's last); then the tiles copied into `vc` without those extra ones.
fn input_tiles(plane: &[f32], g: &Geometry, [r0, r1]: [usize; 2], vc: &mut [f32], tmp: &mut [f32]) {
    let [_, tw] = g.tiles();
    let rows = r1 - r0;
    let tb = rows * tw;
    // `n` columns per split row: padded column pairs (2 * tw + 2 padded columns).
    let n = tw + 1;
    let len = rows * n;
    let (split, rest) = tmp.split_at_mut(4 * (rows + 1) * n);
    let (q, cols) = rest.split_at_mut(8 * len);
    let cols = &mut cols[..16 * len];
    super::fused::simd(
        #[inline(always)]
        || {
            // The 2 * rows + 2 input rows under the tile rows, split into even columns `e`
            // and odd columns `o`, each laid out by row parity: `[parity][row / 2][n]`, so
            // that row a of every tile row (input row 2 * r + a) is one stretch of `len`.
            let (e, o) = split.split_at_mut(2 * (rows + 1) * n);
            for i in 0..2 * rows + 2 {
                let at = ((i % 2) * (rows + 1) + i / 2) * n;
                let (ea, oa) = (&mut e[at..at + n], &mut o[at..at + n]);
                let y = (2 * r0 + i) as isize - g.pad[0] as isize;
                if y < 0 || y >= g.h as isize {
                    ea.fill(0.0);
                    oa.fill(0.0);
                } else {
                    split_row(&plane[y as usize * g.w..][..g.w], g.pad[1], ea, oa);
                }
            }
            // Row combinations Bᵀ d over all tile rows: d0 = rows 2r (even parity, from
            // 0), d1 = rows 2r + 1, d2 = rows 2r + 2 (even parity, from 1), d3 = rows
            // 2r + 3; for the even and the odd columns alike, into `q` (`[e / o][4][len]`).
            let (qe, qo) = q.split_at_mut(4 * len);
            for (d, q) in [(&*e, qe), (&*o, qo)] {
                let (d0, d1) = d.split_at((rows + 1) * n);
                let d = [&d0[..len], &d1[..len], &d0[n..], &d1[n..]];
                transform_b(d, pieces_mut(q, len, [0, len, 2 * len, 3 * len]));
            }
            // Column combinations, the same Bᵀ on each tile's four columns (even and odd
            // column pairs tx and tx + 1), into the 16 planes of `cols`, `len` each.
            let (qe, qo) = q.split_at(4 * len);
            for a in 0..4 {
                let (qe, qo) = (&qe[a * len..][..len], &qo[a * len..][..len]);
                let starts = [0, 1, 2, 3].map(|s| (4 * a + s) * len);
                let p = pieces_mut(cols, len - 1, starts);
                transform_b([qe, qo, &qe[1..], &qo[1..]], p);
            }
            // Into `vc`, each row's `tw` tiles (the extra one left behind).
            for (plane, src) in vc.chunks_exact_mut(tb).zip(cols.chunks_exact(len)) {
                for (d, s) in plane.chunks_exact_mut(tw).zip(src.chunks_exact(n)) {
                    d.copy_from_slice(&s[..tw]);
                }
            }
        },
    );
}

/// [`input_tiles`] in one pass, 16 tiles of a tile row at a time in registers: each of the
/// tiles' four input rows loaded as two pairs of registers (columns `2x - pad ..` and two
/// further on, zero outside the plane), split into the tiles' even and odd columns by one
/// permutation each (the tiles' columns 0 and 1, then 2 and 3); the row combinations, then
/// the column combinations, in the same order of operations as [`input_tiles`], so the same
/// values; each of the 16 results stored at its plane of `vc` (`[16][tiles]`). Where the
/// general one makes four passes over scratch rows and a copy, this reads the plane once
/// and writes `vc` once: a single convolution of ResNet's 64-channel 3x3 shape on 56 x 56
/// (`conv_bench.py`'s `s1_64`), 0.92 of the time (1 thread, ten paired rounds);
/// torchvision's ResNet-18 at batch 1, 0.96-0.98 (1 thread) and 0.955 (2) (BENCHMARKS.md,
/// issue 14).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(unsafe_code)]
fn input_tiles_avx512(plane: &[f32], g: &Geometry, [r0, r1]: [usize; 2], vc: &mut [f32]) {
    use std::arch::x86_64::*;
    let [_, tw] = g.tiles();
    let tb = (r1 - r0) * tw;
    assert!(
        plane.len() >= g.h * g.w && vc.len() >= 16 * tb,
        "winograd input tiles: buffers too small"
    );
    let pad = g.pad[1] as isize;
    // Lanes of a permutation: the even elements of a pair of registers, then the odd ones.
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    // (Loops rather than `array::from_fn`, which is compiled without AVX-512 and so calls
    // its closure instead of inlining it.)
    let zero = _mm512_setzero_ps();
    for ty in r0..r1 {
        // The tile row's four input rows (None: padding).
        let mut rows: [Option<&[f32]>; 4] = [None; 4];
        for (a, row) in rows.iter_mut().enumerate() {
            let y = (2 * ty + a).checked_sub(g.pad[0]).filter(|&y| y < g.h);
            *row = y.map(|y| &plane[y * g.w..][..g.w]);
        }
        let mut x0 = 0;
        while x0 < tw {
            let n = (tw - x0).min(16);
            let at = 2 * x0 as isize - pad;
            // d[a][b]: column b of the 16 tiles' input row a (zero for a padding row).
            let mut d = [[zero; 4]; 4];
            for (da, row) in d.iter_mut().zip(rows) {
                if let Some(row) = row {
                    let (p0, p1) = (load_row(row, at), load_row(row, at + 16));
                    let (q0, q1) = (load_row(row, at + 2), load_row(row, at + 18));
                    *da = [
                        _mm512_permutex2var_ps(p0, even, p1),
                        _mm512_permutex2var_ps(p0, odd, p1),
                        _mm512_permutex2var_ps(q0, even, q1),
                        _mm512_permutex2var_ps(q0, odd, q1),
                    ];
                }
            }
            // Bᵀ d: q[b][a] = combination a of the rows, in column b.
            let mut q = [[zero; 4]; 4];
            for (b, qb) in q.iter_mut().enumerate() {
                let [d0, d1, d2, d3] = [d[0][b], d[1][b], d[2][b], d[3][b]];
                *qb = [
                    _mm512_sub_ps(d0, d2),
                    _mm512_add_ps(d1, d2),
                    _mm512_sub_ps(d2, d1),
                    _mm512_sub_ps(d1, d3),
                ];
            }
            let mask = ((1u32 << n) - 1) as __mmask16;
            let t = (ty - r0) * tw + x0;
            for a in 0..4 {
                let [c0, c1, c2, c3] = [q[0][a], q[1][a], q[2][a], q[3][a]];
                let v = [
                    _mm512_sub_ps(c0, c2),
                    _mm512_add_ps(c1, c2),
                    _mm512_sub_ps(c2, c1),
                    _mm512_sub_ps(c1, c3),
                ];
                for (b, v) in v.into_iter().enumerate() {
                    let plane = &mut vc[(4 * a + b) * tb + t..][..n];
                    // SAFETY: the mask's `n` lanes are `plane`.
                    unsafe { _mm512_mask_storeu_ps(plane.as_mut_ptr(), mask, v) };
                }
            }
            x0 += n;
        }
    }
}

/// The scratch values [`input_tiles`] needs for `rows` tile rows of `tw` tiles.
fn input_scratch(rows: usize, tw: usize) -> usize {
    (28 * rows + 4) * (tw + 1)
}

/// Split one input row, padded by `pad` zeros on the left (and as many as needed on the
/// right), into its even and odd padded columns: `e[j]` is padded column `2j`, input column
/// `2j - pad`.
#[inline(always)]
fn split_row(src: &[f32], pad: usize, e: &mut [f32], o: &mut [f32]) {
    let get = |x: usize| {
        x.checked_sub(pad)
            .and_then(|i| src.get(i))
            .copied()
            .unwrap_or(0.0)
    };
    // Pairs j whose two input columns 2j - pad, 2j + 1 - pad both lie inside the row.
    let ja = pad.div_ceil(2);
    let jb = ((src.len() + pad) / 2).clamp(ja, e.len());
    for j in (0..ja).chain(jb..e.len()) {
        e[j] = get(2 * j);
        o[j] = get(2 * j + 1);
    }
    let s0 = 2 * ja - pad;
    for ((e, o), pair) in e[ja..jb]
        .iter_mut()
        .zip(&mut o[ja..jb])
        .zip(src.get(s0..).unwrap_or_default().chunks_exact(2))
    {
        *e = pair[0];
        *o = pair[1];
    }
}

/// Turn one output channel's products `mc` (16 planes of its tiles for tile rows `r0..r1`,
/// `stride` apart) into its output rows `2 * r0 .. 2 * r1` (clipped to `oh`), `band` (added
/// onto what it holds with `accumulate`), adding `bias` and applying `act`. `tmp` holds at
/// least 12 values per tile.
#[allow(clippy::too_many_arguments)]
fn output_tiles(
    (mc, stride): (&[f32], usize),
    [oh, ow]: [usize; 2],
    tw: usize,
    [r0, r1]: [usize; 2],
    bias: f32,
    act: Act,
    (band, accumulate): (&mut [f32], bool),
    tmp: &mut [f32],
) {
    let tb = (r1 - r0) * tw;
    // Aᵀ m A is elementwise across tiles, so each step runs over all the block's tiles at
    // once: first the row combinations per column b, `s[b] = m0b + m1b + m2b` and
    // `t[b] = m1b - m2b - m3b`; then the same on s and t, whose results are the output's even
    // and odd columns of its even (from s) and odd (from t) rows.
    let (st, eo) = tmp[..12 * tb].split_at_mut(8 * tb);
    super::fused::simd(
        #[inline(always)]
        || {
            let m = |i: usize| &mc[i * stride..][..tb];
            let (s, t) = st.split_at_mut(4 * tb);
            for (b, (sb, tv)) in s
                .chunks_exact_mut(tb)
                .zip(t.chunks_exact_mut(tb))
                .enumerate()
            {
                transform_a([m(b), m(4 + b), m(8 + b), m(12 + b)], [sb, tv], 0.0);
            }
            for (r, pair) in [&*s, &*t].into_iter().zip(eo.chunks_exact_mut(2 * tb)) {
                let (even, odd) = pair.split_at_mut(tb);
                let c = [&r[..tb], &r[tb..2 * tb], &r[2 * tb..3 * tb], &r[3 * tb..]];
                transform_a(c, [even, odd], bias);
            }
            for ty in r0..r1 {
                let at = (ty - r0) * tw;
                for (dy, pair) in eo.chunks_exact(2 * tb).enumerate() {
                    if 2 * ty + dy >= oh {
                        break;
                    }
                    let (even, odd) = (&pair[at..at + tw], &pair[tb + at..tb + at + tw]);
                    let row = &mut band[(2 * (ty - r0) + dy) * ow..][..ow];
                    let mut pairs = row.chunks_exact_mut(2);
                    if accumulate {
                        for ((px, &a), &b) in (&mut pairs).zip(even).zip(odd) {
                            px[0] += a;
                            px[1] += b;
                        }
                    } else {
                        for ((px, &a), &b) in (&mut pairs).zip(even).zip(odd) {
                            px[0] = a;
                            px[1] = b;
                        }
                    }
                    if let [last] = pairs.into_remainder() {
                        *last = even[tw - 1] + if accumulate { *last } else { 0.0 };
                    }
                }
            }
        },
    );
    act.apply(band);
}

/// Columns `at .. at + 16` of `row` in a register, zero outside the row.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
#[allow(unsafe_code)]
fn load_row(row: &[f32], at: isize) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let (lo, hi) = (at.max(0), (at + 16).min(row.len() as isize));
    if lo >= hi {
        return _mm512_setzero_ps();
    }
    let mask = (((1u32 << (hi - lo)) - 1) << (lo - at)) as __mmask16;
    // SAFETY: the mask's lanes are columns lo..hi of the row, inside it; the others are not
    // read (a masked load does not touch them), so the pointer to column `at` may lie
    // outside the row.
    unsafe { _mm512_maskz_loadu_ps(mask, row.as_ptr().wrapping_offset(at)) }
}

/// [`output_tiles`] but for the activation, in one pass, 16 tiles of a tile row at a time in
/// registers: the 16 products' values of those tiles loaded, the row combinations, then the
/// column combinations, in the same order of operations as [`output_tiles`], so the same
/// values; the even and odd columns of each output row interleaved by a permutation and
/// written once (added onto `band` with `accumulate`). With the input transform's one
/// pass, a single convolution of ResNet's 64-channel 3x3 shape on 56 x 56 (`conv_bench.py`'s
/// `s1_64`) took 0.906 of the four-pass transforms' time (0.935 with the input's alone),
/// torchvision's ResNet-18 at batch 1 0.932 (0.951; 1 thread, ten paired rounds each;
/// BENCHMARKS.md, issue 14). Applying the activation in registers before the store
/// ([`Act::apply_m512`]) instead of the caller's pass over the band was level on `s1_64`
/// and no faster on ResNet-18 (1.00-1.16 of the time, 1 thread).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(unsafe_code)]
fn output_tiles_avx512(
    (mc, stride): (&[f32], usize),
    [oh, ow]: [usize; 2],
    tw: usize,
    [r0, r1]: [usize; 2],
    bias: f32,
    (band, accumulate): (&mut [f32], bool),
) {
    use std::arch::x86_64::*;
    let tb = (r1 - r0) * tw;
    let rows = (2 * r1).min(oh) - 2 * r0;
    assert!(
        mc.len() >= 15 * stride + tb && band.len() >= rows * ow && ow.div_ceil(2) <= tw,
        "winograd output tiles: buffers too small"
    );
    // Lanes of a permutation: the first (then the last) eight of two registers, alternately.
    let low = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    let high = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    let (zero, bias) = (_mm512_setzero_ps(), _mm512_set1_ps(bias));
    // `Aᵀ` on four registers, plus `b`, as `transform_a` computes it. (Closures and loops
    // rather than `array::from_fn`, as in `input_tiles_avx512`.)
    let a_t = |[m0, m1, m2, m3]: [__m512; 4], b: __m512| {
        [
            _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(m0, m1), m2), b),
            _mm512_add_ps(_mm512_sub_ps(_mm512_sub_ps(m1, m2), m3), b),
        ]
    };
    for ty in r0..r1 {
        let mut x0 = 0;
        while x0 < tw {
            let n = (tw - x0).min(16);
            let t = (ty - r0) * tw + x0;
            let mask = ((1u32 << n) - 1) as __mmask16;
            // Tiles t..t + n of each product.
            let mut m = [zero; 16];
            for (i, mi) in m.iter_mut().enumerate() {
                // SAFETY: the mask's `n` lanes are tiles t..t + n of product i, inside `mc`
                // (asserted).
                *mi = unsafe { _mm512_maskz_loadu_ps(mask, mc.as_ptr().add(i * stride + t)) };
            }
            // The row combinations of each column b, s[b] and t[b], by output row: s, then t.
            let mut by_row = [[zero; 4]; 2];
            for b in 0..4 {
                let [s, t] = a_t([m[b], m[4 + b], m[8 + b], m[12 + b]], zero);
                (by_row[0][b], by_row[1][b]) = (s, t);
            }
            // Output pixels 2 x0 ..: as many as the row has left, at most 32.
            let cols = (ow - 2 * x0).min(2 * n);
            for (dy, c) in by_row.into_iter().enumerate() {
                let y = 2 * ty + dy;
                if y >= oh {
                    break;
                }
                let [even, odd] = a_t(c, bias);
                let row = &mut band[(y - 2 * r0) * ow + 2 * x0..][..cols];
                let halves = [
                    _mm512_permutex2var_ps(even, low, odd),
                    _mm512_permutex2var_ps(even, high, odd),
                ];
                for (h, v) in halves.into_iter().enumerate() {
                    let lanes = cols.saturating_sub(16 * h).min(16);
                    if lanes == 0 {
                        break;
                    }
                    let mask = ((1u32 << lanes) - 1) as __mmask16;
                    // SAFETY: the mask's lanes are pixels 16 h .. 16 h + lanes of `row`.
                    unsafe {
                        let at = row.as_mut_ptr().add(16 * h);
                        let v = if accumulate {
                            _mm512_add_ps(_mm512_maskz_loadu_ps(mask, at), v)
                        } else {
                            v
                        };
                        _mm512_mask_storeu_ps(at, mask, v);
                    }
                }
            }
            x0 += n;
        }
    }
}

/// `Bᵀ` on four rows (or columns) of equal length: `q0 = d0 - d2`, `q1 = d1 + d2`,
/// `q2 = d2 - d1`, `q3 = d1 - d3`, over the length of `q0`. Its own function, so that
/// the compiler knows the outputs do not alias and vectorises the loop.
#[inline(always)]
fn transform_b([d0, d1, d2, d3]: [&[f32]; 4], [q0, q1, q2, q3]: [&mut [f32]; 4]) {
    let n = q0.len();
    let (d0, d1, d2, d3) = (&d0[..n], &d1[..n], &d2[..n], &d3[..n]);
    let (q1, q2, q3) = (&mut q1[..n], &mut q2[..n], &mut q3[..n]);
    for x in 0..n {
        q0[x] = d0[x] - d2[x];
        q1[x] = d1[x] + d2[x];
        q2[x] = d2[x] - d1[x];
        q3[x] = d1[x] - d3[x];
    }
}

/// `Aᵀ` on four rows (or columns) of equal length, plus `bias`: `s = m0 + m1 + m2 + bias`,
/// `t = m1 - m2 - m3 + bias`, over the length of `s` (see [`transform_b`]).
#[inline(always)]
fn transform_a([m0, m1, m2, m3]: [&[f32]; 4], [s, t]: [&mut [f32]; 2], bias: f32) {
    let n = s.len();
    let (m0, m1, m2, m3) = (&m0[..n], &m1[..n], &m2[..n], &m3[..n]);
    let t = &mut t[..n];
    for x in 0..n {
        s[x] = m0[x] + m1[x] + m2[x] + bias;
        t[x] = m1[x] - m2[x] - m3[x] + bias;
    }
}

/// `G` on three rows (or columns) of equal length: `o0 = a`, `o1 = (a + b + d) / 2`,
/// `o2 = (a - b + d) / 2`, `o3 = d`, over the length of `o0` (see [`transform_b`]).
#[inline(always)]
fn transform_g([a, b, d]: [&[f32]; 3], [o0, o1, o2, o3]: [&mut [f32]; 4]) {
    let n = o0.len();
    let (a, b, d) = (&a[..n], &b[..n], &d[..n]);
    let (o1, o2, o3) = (&mut o1[..n], &mut o2[..n], &mut o3[..n]);
    for x in 0..n {
        o0[x] = a[x];
        o1[x] = 0.5 * (a[x] + b[x] + d[x]);
        o2[x] = 0.5 * (a[x] - b[x] + d[x]);
        o3[x] = d[x];
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::*;

    /// Values random in sign and magnitude (within ±4), from `seed` (xorshift).
    fn random(mut seed: u64) -> impl FnMut() -> f32 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
        }
    }

    /// The values' bits, to compare them exactly.
    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// The AVX-512 input transform writes the same values as the general one, bit for bit:
    /// paddings of 0 to 3 (wider than the kernel, different per dim), odd and even sizes,
    /// planes narrower than a register of tiles and wider than two, every block of tile
    /// rows of several sizes. Inputs are random in sign and magnitude.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn wide_input_tiles_match_input_tiles() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        let mut next = random(0x2545_f491_4f6c_dd1du64);
        for (h, w, pad) in [
            (1, 1, [1, 1]),
            (5, 7, [0, 0]),
            (6, 9, [2, 1]),
            (9, 33, [1, 3]),
            (7, 64, [1, 1]),
            (12, 75, [3, 0]),
        ] {
            let g = Geometry {
                c: 1,
                h,
                w,
                co: 1,
                pad,
            };
            let plane: Vec<f32> = (0..h * w).map(|_| next()).collect();
            let [th, tw] = g.tiles();
            for rows in 1..=th {
                for r0 in (0..th).step_by(rows) {
                    let r = [r0, (r0 + rows).min(th)];
                    let tb = (r[1] - r[0]) * tw;
                    let mut want = vec![f32::NAN; 16 * tb];
                    let mut tmp = vec![0.0; input_scratch(r[1] - r[0], tw)];
                    input_tiles(&plane, &g, r, &mut want, &mut tmp);
                    let mut got = vec![f32::NAN; 16 * tb];
                    // SAFETY: the CPU has AVX-512 (checked above).
                    #[allow(unsafe_code)]
                    unsafe {
                        input_tiles_avx512(&plane, &g, r, &mut got)
                    };
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{h} x {w}, pad {pad:?}, rows {r:?}"
                    );
                }
            }
        }
    }

    /// The AVX-512 output transform writes the same values as the general one, bit for bit,
    /// written and added onto what the output holds: odd and even output sizes (tiles
    /// overhanging the output's last row and column), planes narrower than a register of
    /// tiles and wider than two, every block of tile rows of several sizes.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn wide_output_tiles_match_output_tiles() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        let mut next = random(0x9e37_79b9_7f4a_7c15u64);
        for (oh, ow) in [(1usize, 1usize), (2, 5), (5, 8), (6, 33), (9, 64), (4, 75)] {
            let (th, tw) = (oh.div_ceil(2), ow.div_ceil(2));
            for rows in 1..=th {
                for r0 in (0..th).step_by(rows) {
                    let r = [r0, (r0 + rows).min(th)];
                    let tb = (r[1] - r[0]) * tw;
                    // 16 products' planes, 3 values apart from one another.
                    let stride = tb + 3;
                    let mc: Vec<f32> = (0..16 * stride).map(|_| next()).collect();
                    let len = ((2 * r[1]).min(oh) - 2 * r[0]) * ow;
                    let start: Vec<f32> = (0..len).map(|_| next()).collect();
                    for accumulate in [false, true] {
                        let mut want = start.clone();
                        let mut tmp = vec![0.0; 12 * tb];
                        let out = (&mut want[..], accumulate);
                        output_tiles(
                            (&mc, stride),
                            [oh, ow],
                            tw,
                            r,
                            0.5,
                            Act::None,
                            out,
                            &mut tmp,
                        );
                        let mut got = start.clone();
                        // SAFETY: the CPU has AVX-512 (checked above).
                        #[allow(unsafe_code)]
                        unsafe {
                            let out = (&mut got[..], accumulate);
                            output_tiles_avx512((&mc, stride), [oh, ow], tw, r, 0.5, out)
                        };
                        assert_eq!(bits(&got), bits(&want), "{oh} x {ow}, rows {r:?}");
                    }
                }
            }
        }
    }

    /// Blocks of tile rows chosen on one thread for the microkernel's panels (AVX-512's, 64
    /// columns of 16-lane registers): ResNet's 56 x 56 layers (28 tile rows of 28) in blocks
    /// of 7 rows (196 tiles: three panels and 4 tiles by dot products), 148 twelfths of a
    /// panel against 152 for blocks of 9 (252 tiles, the last block 28); without the dot
    /// products, blocks of 9 (152 against 168); with at most 5 rows by the cache, blocks of
    /// 4 (154); 7 x 7 tiles in one block.
    #[test]
    fn blocks_fill_the_microkernels_panels() {
        let Some(pk) = Packing::detect().filter(|pk| pk.mr == 64) else {
            return;
        };
        let costs = [0, 64, 196, 252].map(|n| pk.columns_cost(n));
        // Three panels and 4 columns (by dot products where the CPU has them), or 60.
        let dots = crate::ops::dots::tail_of(196, pk.mr) == 4;
        assert_eq!(costs, [0, 12, if dots { 37 } else { 42 }, 48]);
        assert_eq!(fuller_panels(28, 28, 9), Some(if dots { 7 } else { 9 }));
        assert_eq!(fuller_panels(28, 28, 5), Some(4));
        assert_eq!(fuller_panels(7, 7, 9), Some(7));
    }

    /// Against candle's direct conv2d (plus bias and activation): paddings from 0 to wider
    /// than the kernel and different per dim, odd and even sizes (tiles overhanging the
    /// output), a 1-row output, several blocks (by cache size and by thread count) run in
    /// parallel.
    #[test]
    fn winograd_matches_candle_conv2d() {
        let dev = Device::Cpu;
        // (c_in, c_out, h, w, [pad_h, pad_w], threads, bias, activation)
        type Case = (usize, usize, usize, usize, [usize; 2], usize, bool, Act);
        let cases: [Case; 10] = [
            (3, 5, 9, 11, [1, 1], 1, true, Act::None),
            (4, 6, 6, 6, [0, 0], 1, false, Act::Relu),
            (2, 3, 7, 4, [2, 1], 3, true, Act::Hardswish),
            (1, 2, 1, 8, [1, 0], 2, true, Act::None),
            (5, 4, 3, 3, [2, 2], 2, false, Act::Silu),
            // 1 tile row per block from the cache budget: 5 blocks. The weights transformed
            // in blocks of 8 output channels, the last of 2.
            (70, 66, 9, 300, [1, 1], 1, true, Act::Relu),
            // 2 blocks from the cache budget, the second shorter.
            (8, 8, 50, 200, [1, 1], 1, true, Act::Relu),
            (70, 66, 9, 300, [1, 1], 2, true, Act::None),
            // Split by planes on 2 threads ([`plan`]); on 16, two bands of output channels
            // (the last one shorter).
            (64, 64, 6, 6, [1, 1], 2, true, Act::Relu),
            (64, 40, 6, 5, [1, 2], 16, false, Act::None),
        ];
        for (c, co, h, w, pad, threads, with_bias, act) in cases {
            let x = Tensor::randn(0f32, 1., (1, c, h, w), &dev).unwrap();
            let k = Tensor::randn(0f32, 1., (co, c, 3, 3), &dev).unwrap();
            let b = Tensor::randn(0f32, 1., co, &dev).unwrap();
            let g = Geometry { c, h, w, co, pad };
            let [oh, ow] = g.out().unwrap();
            let u = weights(&k.flatten_all().unwrap().to_vec1().unwrap(), co, c);
            let bias: Option<Vec<f32>> = with_bias.then(|| b.to_vec1().unwrap());
            let img: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
            let mut sum = x
                .pad_with_zeros(2, pad[0], pad[0])
                .unwrap()
                .pad_with_zeros(3, pad[1], pad[1])
                .unwrap()
                .conv2d(&k, 0, 1, 1, 1)
                .unwrap();
            if with_bias {
                sum = sum
                    .broadcast_add(&b.reshape((1, co, 1, 1)).unwrap())
                    .unwrap();
            }
            // Written over `dst`, and added onto a residual it holds (before the activation).
            let residual = Tensor::randn(0f32, 1., sum.shape(), &dev).unwrap();
            for accumulate in [false, true] {
                let (got, want) = if accumulate {
                    let r: Vec<f32> = residual.flatten_all().unwrap().to_vec1().unwrap();
                    (r, (&sum + &residual).unwrap())
                } else {
                    (vec![f32::NAN; co * oh * ow], sum.clone())
                };
                let want = act.apply_to(&want).unwrap();
                // The plan `conv_image` makes, and blocks of 1 and 2 tile rows each way.
                let plans = [None, Some((1, true)), Some((2, true)), Some((2, false))];
                for plan in plans {
                    let mut got = got.clone();
                    let b = bias.as_deref();
                    let done = match plan {
                        None => conv_image(&img, &u, &g, b, act, &mut got, accumulate, threads),
                        Some((rows, split)) => {
                            let step = Step {
                                img: &img,
                                u: &u,
                                g: &g,
                                bias: b,
                                act,
                                accumulate,
                            };
                            step.image(&mut got, (rows, split), threads)
                        }
                    };
                    assert!(done);
                    let got = Tensor::from_vec(got, (1, co, oh, ow), &dev).unwrap();
                    let (diff, scale) = crate::ops::diff_and_scale(&got, &want);
                    assert!(
                        diff <= 1e-5 * scale.max(1.0),
                        "c {c} co {co} {h}x{w} pad {pad:?} threads {threads} accumulate \
                         {accumulate} plan {plan:?}: {diff} (scale {scale})"
                    );
                }
            }
        }
    }

    /// Split by planes where the tile rows would leave each thread few tiles for a whole
    /// transformed weight (ResNet's 14 x 14 convolutions of 256 channels on 2 threads); by
    /// tile rows where each thread's blocks have many tiles, and always on one thread.
    #[test]
    fn planes_are_split_where_blocks_would_reread_the_weight() {
        let g = |c: usize, hw: usize| Geometry {
            c,
            h: hw,
            w: hw,
            co: c,
            pad: [1, 1],
        };
        // (channels, size, threads, split)
        let cases = [
            (256, 14, 2, true),
            (256, 14, 1, false),
            (128, 28, 2, false),
            (64, 56, 2, false),
            (128, 28, 16, true),
            (64, 56, 16, false),
            (512, 7, 2, true),
        ];
        for (c, hw, threads, split) in cases {
            let (rows, got) = plan(&g(c, hw), threads);
            assert_eq!(got, split, "{c} channels, {hw} x {hw}, {threads} threads");
            assert!(rows >= 1 && rows <= hw.div_ceil(2));
        }
    }

    /// Buffers too small for the geometry are refused, not read or written past.
    #[test]
    fn short_buffers_are_refused() {
        let g = Geometry {
            c: 2,
            h: 4,
            w: 4,
            co: 3,
            pad: [1, 1],
        };
        let u = vec![0f32; 16 * 3 * 2];
        let img = vec![0f32; 2 * 16];
        let mut dst = vec![0f32; 3 * 16];
        let run = |img: &[f32], u: &[f32], dst: &mut [f32]| {
            conv_image(img, u, &g, None, Act::None, dst, false, 1)
        };
        assert!(run(&img, &u, &mut dst));
        assert!(!run(&img[1..], &u, &mut dst));
        assert!(!run(&img, &u[1..], &mut dst));
        assert!(!run(&img, &u, &mut dst[1..]));
    }
}
