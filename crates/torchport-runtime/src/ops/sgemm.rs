//! A checked f32 matrix product on slices, through the `gemm` crate candle's CPU matmul
//! calls (its microkernels, driven by `packed::unpacked_product` on CPUs with AVX-512 or
//! AVX2 + FMA, which allocates nothing per call; the crate's own product elsewhere and for
//! matrix-vector products), for kernels that need what candle's `matmul` does not offer:
//! accumulating into an output that already holds a bias, writing into a slice of a larger
//! buffer (one image of a batch, one head of an attention), a scale folded into the product,
//! and choosing over how many threads the product itself splits (none when the caller already
//! runs one product per thread).

use std::ops::Range;

use super::packed::{unpacked_product, Columns, Packing};

/// A read-only matrix view: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub struct Mat<'a> {
    /// The elements.
    pub data: &'a [f32],
    /// Row stride, in elements.
    pub rs: usize,
    /// Column stride, in elements.
    pub cs: usize,
}

impl<'a> Mat<'a> {
    /// A row-major matrix with `cols` columns.
    pub fn rows(data: &'a [f32], cols: usize) -> Self {
        Mat {
            data,
            rs: cols,
            cs: 1,
        }
    }

    /// Whether every element of an `r x c` view lies inside `data`.
    pub(crate) fn fits(&self, r: usize, c: usize) -> bool {
        if r == 0 || c == 0 {
            return true;
        }
        let last = (r - 1)
            .checked_mul(self.rs)
            .zip((c - 1).checked_mul(self.cs))
            .and_then(|(a, b)| a.checked_add(b));
        last.is_some_and(|l| l < self.data.len())
    }
}

/// `dst = (accumulate ? dst : 0) + scale * a @ b` for `a: [m, k]`, `b: [k, n]` and `dst` a
/// row-major `[m, n]` block with row stride `ldd`, split for `threads` of the rayon pool's
/// threads (as tiles of the output, one single-threaded product each, which scaled better
/// than the gemm's own split: `tiles`): 1 runs it on this thread, the pool's size over all
/// of them, fewer for a caller running several products side by side. Returns false (and
/// writes nothing) when a view does not fit its slice.
#[allow(clippy::too_many_arguments)]
pub fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    dst: &mut [f32],
    ldd: usize,
    accumulate: bool,
    scale: f32,
    threads: usize,
) -> bool {
    if !a.fits(m, k) || !b.fits(k, n) || !block_fits(dst, m, n, ldd) {
        return false;
    }
    if m == 0 || n == 0 {
        return true;
    }
    if k == 0 {
        if !accumulate {
            for row in dst.chunks_mut(ldd.max(1)).take(m) {
                row[..n].fill(0.0);
            }
        }
        return true;
    }
    // SAFETY: `dst` holds the whole [m, n] block at row stride `ldd` (checked above), and its
    // mutable borrow keeps it from aliasing `a` or `b` while the product runs.
    #[allow(unsafe_code)]
    unsafe {
        into(
            m,
            n,
            k,
            a,
            b,
            Shared(dst.as_mut_ptr()),
            ldd,
            accumulate,
            scale,
            threads,
            None,
        )
    }
}

/// Whether `dst` holds a row-major `[m, n]` block at row stride `ldd` (rows not overlapping).
pub(crate) fn block_fits(dst: &[f32], m: usize, n: usize, ldd: usize) -> bool {
    let d = Mat {
        data: dst,
        rs: ldd,
        cs: 1,
    };
    d.fits(m, n) && !(n > ldd && m > 1)
}

/// `scale * a @ b` for `a: [m, k]` and `b: [k, n]`, as a new row-major `[m, n]` buffer
/// written once by the product (a zeroed buffer would be written twice); threads as in
/// [`sgemm`]. `None` when a view does not fit its slice.
pub fn product(
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    scale: f32,
    threads: usize,
) -> Option<Vec<f32>> {
    let len = m.checked_mul(n)?;
    if !a.fits(m, k) || !b.fits(k, n) {
        return None;
    }
    if k == 0 || len == 0 {
        return Some(vec![0.0; len]);
    }
    if m == 1 || n == 1 {
        // The gemm's matrix-vector paths take their output as a slice: give them one that
        // holds values.
        let mut out = vec![0.0; len];
        return sgemm(m, n, k, a, b, &mut out, n, false, scale, threads).then_some(out);
    }
    // SAFETY: the block is new, so it aliases neither input; with k > 0 and `accumulate`
    // false, the product writes every element of the [m, n] block (gemm's `dst = beta * lhs
    // @ rhs` when told not to read dst, over tiles that cover the block; the first pass over
    // k writes, later passes add to what it wrote) and reads none before writing it.
    #[allow(unsafe_code)]
    unsafe {
        new_block(len, |out| {
            into(m, n, k, a, b, out, n, false, scale, threads, None)
        })
    }
}

/// What a product does with its output as it finishes it: `f(row, column, values)` for each
/// stretch of a row, `values` its elements from that column on, once every multiply-add into
/// them is done, while they are still in the cache (on the thread that computed them). A
/// convolution adds its bias and residual and applies its activation there, instead of in
/// passes over the whole output before and after the product.
pub(crate) type Finish<'a> = &'a (dyn Fn(usize, usize, &mut [f32]) + Sync);

/// `finish(r, cols.start, row)` for each row `r` of `rows`, `row` its columns `cols` of the
/// block `out` points to (row stride `ldd`).
///
/// # Safety
///
/// Those elements are written, and nothing else reads or writes them meanwhile.
#[allow(unsafe_code)]
pub(crate) unsafe fn finish_rows(
    finish: Finish,
    out: Shared,
    ldd: usize,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
) {
    for r in rows {
        // SAFETY: the caller's contract.
        let row =
            unsafe { std::slice::from_raw_parts_mut(out.0.add(r * ldd + cols.start), cols.len()) };
        finish(r, cols.start, row);
    }
}

/// `out = a @ b` for `a: [m, k]` and `b: [k, n]` into the `[m, n]` block `out` points to (row
/// stride `ldd`), split for `threads` threads as [`sgemm`] splits it, each finished stretch
/// handed to `finish`. Returns false (and writes nothing) when a view does not fit its slice
/// or `k` is 0.
///
/// # Safety
///
/// `out` points to an `[m, n]` block at row stride `ldd` (`>= n` when `m > 1`) that nothing
/// else reads or writes meanwhile; with `k > 0` every element is written before `finish` (or
/// anything) reads it.
#[allow(unsafe_code)]
pub(crate) unsafe fn into_finished(
    (m, n, k): (usize, usize, usize),
    a: Mat,
    b: Mat,
    out: Shared,
    ldd: usize,
    threads: usize,
    finish: Option<Finish>,
) -> bool {
    if !a.fits(m, k) || !b.fits(k, n) || k == 0 || isize::try_from(ldd).is_err() {
        return false;
    }
    if m == 0 || n == 0 {
        return true;
    }
    // SAFETY: the caller's contract, the views checked above.
    unsafe { into(m, n, k, a, b, out, ldd, false, 1.0, threads, finish) }
}

/// A new buffer of `len` values written by `fill` (given its start) where `fill` returns
/// true, `None` where it returns false: memory written once, not zeroed first.
///
/// # Safety
///
/// When `fill` returns true it has written all `len` values and read none before writing it.
#[allow(unsafe_code)]
pub(crate) unsafe fn new_block(len: usize, fill: impl FnOnce(Shared) -> bool) -> Option<Vec<f32>> {
    let mut out: Vec<f32> = Vec::with_capacity(len);
    if !fill(Shared(out.as_mut_ptr())) {
        return None;
    }
    // SAFETY: the capacity holds `len` values, all written (the caller's contract).
    unsafe { out.set_len(len) };
    Some(out)
}

/// `f(rows, cols)` for each tile of `m` rows and `n` columns cut into `row_bands` x
/// `col_bands` bands as equal as can be (empty tiles skipped), over the pool when there is
/// more than one.
pub(crate) fn for_each_tile(
    m: usize,
    n: usize,
    (row_bands, col_bands): (usize, usize),
    f: impl Fn(Range<usize>, Range<usize>) + Sync,
) {
    use rayon::prelude::*;
    let band = |len: usize, parts: usize, i: usize| {
        let size = len.div_ceil(parts.max(1));
        let start = (i * size).min(len);
        start..(start + size).min(len)
    };
    let run = |t: usize| {
        let rows = band(m, row_bands, t / col_bands.max(1));
        let cols = band(n, col_bands, t % col_bands.max(1));
        if !rows.is_empty() && !cols.is_empty() {
            f(rows, cols);
        }
    };
    match row_bands * col_bands {
        0 | 1 => run(0),
        tiles => (0..tiles).into_par_iter().for_each(run),
    }
}

/// The product behind [`sgemm`] and [`product`], into `dst`, over tiles for `threads`
/// threads (1: on this one).
///
/// # Safety
///
/// `a` and `b` fit their views (`Mat::fits`), `k > 0`, and `dst` points to an `[m, n]` block
/// at row stride `ldd >= n` (when `m > 1`) that nothing else reads or writes meanwhile.
#[allow(unsafe_code, clippy::too_many_arguments)]
unsafe fn into(
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    out: Shared,
    ldd: usize,
    accumulate: bool,
    scale: f32,
    threads: usize,
    finish: Option<Finish>,
) -> bool {
    // Over the pool: tiles of the output, one single-threaded product each (see
    // [`tiles`]); where no tiling fits, the gemm's own split.
    let (row_bands, col_bands) = if threads > 1 {
        tiles(m, n, k, threads)
    } else {
        (1, 1)
    };
    let par = if threads > 1 && row_bands * col_bands < 2 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // The strides are element counts within the slices checked above; isize::try_from keeps
    // them in range of the pointer arithmetic.
    let (Ok(ars), Ok(acs), Ok(brs), Ok(bcs), Ok(drs)) = (
        isize::try_from(a.rs),
        isize::try_from(a.cs),
        isize::try_from(b.rs),
        isize::try_from(b.cs),
        isize::try_from(ldd),
    ) else {
        return false;
    };
    // This CPU's microkernels for single-threaded products (see `unpacked_product`).
    let own = super::packed::Packing::detect();
    // Rows `rows` and columns `cols` of the product, with the given parallelism.
    let product = |out: Shared, rows: Range<usize>, cols: Range<usize>, par| {
        // Matrix-vector products (one row or column) stay the gemm's: it allocates nothing
        // for them.
        if let (Some(pk), gemm::Parallelism::None, true) =
            (&own, par, rows.len() > 1 && cols.len() > 1)
        {
            // SAFETY: as below: the views fit (sub-views of checked ones), k > 0, and the
            // tile of `out` is this call's alone.
            unsafe {
                own_tile(
                    pk,
                    (rows, cols, k),
                    a,
                    &b,
                    out,
                    ldd,
                    accumulate,
                    scale,
                    finish,
                )
            };
            return;
        }
        // SAFETY: every element the product reads, `a[i * rs + p * cs]` for i < m, p < k (and
        // likewise for b over k x n), lies inside its slice, and every element it writes,
        // `dst[i * ldd + j]` for i in `rows` (inside 0..m) and j in `cols` (inside 0..n),
        // lies inside the block `out` points to, which nothing else touches meanwhile (the
        // caller's contract). Concurrent calls are given disjoint tiles, so no element is
        // written by two of them. With `read_dst` false gemm never reads `dst`.
        unsafe {
            gemm::gemm(
                rows.len(),
                cols.len(),
                k,
                out.0.add(rows.start * ldd + cols.start),
                1,
                drs,
                accumulate,
                a.data.as_ptr().add(rows.start * a.rs),
                acs,
                ars,
                b.data.as_ptr().add(cols.start * b.cs),
                bcs,
                brs,
                if accumulate { 1.0 } else { 0.0 },
                scale,
                false,
                false,
                false,
                par,
            );
        }
        if let Some(f) = finish {
            // SAFETY: the block's rows `rows` hold columns `cols` (inside 0..n), which the
            // product above has written and nothing else touches.
            unsafe { finish_rows(f, out, ldd, rows, cols) };
        }
    };
    if row_bands * col_bands < 2 {
        product(out, 0..m, 0..n, par);
    } else {
        for_each_tile(m, n, (row_bands, col_bands), |rows, cols| {
            product(out, rows, cols, gemm::Parallelism::None)
        });
    }
    true
}

/// Rows `rows` and columns `cols` of `a @ b` (scaled, onto what `out` holds when
/// `accumulate`) into their tile of the block `out` points to, on this thread, through this
/// CPU's microkernels ([`unpacked_product`]), each finished stretch handed to `finish` with
/// its row and column in the whole product.
///
/// # Safety
///
/// `a` fits an `[m, k]` view and `b` holds `[k, n]` for some `m >= rows.end`, `n >=
/// cols.end`, `k > 0`, and the tile of `out` (row stride `ldd`) is this call's alone.
#[allow(unsafe_code, clippy::too_many_arguments)]
unsafe fn own_tile<C: Columns>(
    pk: &Packing,
    (rows, cols, k): (Range<usize>, Range<usize>, usize),
    a: Mat,
    b: &C,
    out: Shared,
    ldd: usize,
    accumulate: bool,
    scale: f32,
    finish: Option<Finish>,
) {
    let x = Mat {
        data: &a.data[rows.start * a.rs..],
        ..a
    };
    // The tile's rows and columns are the product's from its corner.
    let at = |r: usize, j: usize, row: &mut [f32]| {
        if let Some(f) = finish {
            f(rows.start + r, cols.start + j, row)
        }
    };
    let finish: Option<Finish> = finish.map(|_| &at as Finish);
    // SAFETY: the caller's contract, for the tile's sub-views.
    unsafe {
        unpacked_product(
            pk,
            (rows.len(), cols.len(), k),
            x,
            &b.skip(cols.start),
            Shared(out.0.add(rows.start * ldd + cols.start)),
            ldd,
            accumulate,
            scale,
            finish,
        );
    }
}

/// [`into_finished`] for a right operand written into the microkernel's panels as they are
/// packed ([`Columns`]), through this CPU's microkernels (`pk`), over the same tiles: a
/// convolution's columns, unfolded from its image panel by panel instead of into a matrix of
/// their own first. Returns false (and writes nothing) when `a` does not fit or `k` is 0.
///
/// # Safety
///
/// As [`into_finished`]'s, and `b` holds `[k, n]`.
#[allow(unsafe_code, clippy::too_many_arguments)]
pub(crate) unsafe fn into_finished_from<C: Columns>(
    pk: &Packing,
    (m, n, k): (usize, usize, usize),
    a: Mat,
    b: &C,
    out: Shared,
    ldd: usize,
    threads: usize,
    finish: Option<Finish>,
) -> bool {
    if !a.fits(m, k) || k == 0 || isize::try_from(ldd).is_err() {
        return false;
    }
    if m == 0 || n == 0 {
        return true;
    }
    let bands = if threads > 1 {
        tiles(m, n, k, threads)
    } else {
        (1, 1)
    };
    for_each_tile(m, n, bands, |rows, cols| {
        // SAFETY: the caller's contract; concurrent tiles are disjoint.
        unsafe { own_tile(pk, (rows, cols, k), a, b, out, ldd, false, 1.0, finish) }
    });
    true
}

/// How a product over `threads` threads splits its output into tiles, each a
/// single-threaded product: `(row bands, column bands)`, `(1, 1)` for no split. As many
/// tiles as fit (at most one per thread, each at least [`TILE_MIN`] rows and columns), and
/// of those the tiling whose tile has the least height + width, because each tile packs its
/// own rows of `a` and columns of `b`: splitting the output's longer side copies the smaller
/// operand. Products under [`TILE_MIN_WORK`] multiply-adds a tile are not split.
///
/// Measured at 2 threads (least of 5 rounds, 6 weights cycled; BENCHMARKS.md, issue 14),
/// speed-up over 1 thread, the gemm's own split / column bands / row bands: ResNet-50's
/// 3x3 conv on 7 x 7 (512 x 49 x 4608, m x n x k) 1.37 / 1.54 / 1.98; its 1x1 conv
/// 512 x 49 x 2048: 1.01 / 1.35 / 2.01; a 64-channel 3x3 conv on 56 x 56 (64 x 3136 x 576):
/// 1.01 / 1.90 / –; BERT-base's linears at batch 8 (1024 x 768 x 768): 1.68–1.84 / 1.86–1.93
/// / 1.89–1.98; batch 1 (128 x 3072 x 768): 1.95 / 1.98 / 1.57.
pub(crate) fn tiles(m: usize, n: usize, k: usize, threads: usize) -> (usize, usize) {
    let work = m.saturating_mul(n).saturating_mul(k);
    let mut best = (1, 1);
    let mut best_side = usize::MAX;
    for r in (1..=threads).take_while(|&r| r == 1 || m / r >= TILE_MIN) {
        for c in (1..=threads / r).take_while(|&c| c == 1 || n / c >= TILE_MIN) {
            let count = r * c;
            let side = m.div_ceil(r) + n.div_ceil(c);
            let better = count > best.0 * best.1 || (count == best.0 * best.1 && side < best_side);
            if count > 1 && work / count >= TILE_MIN_WORK && better {
                best = (r, c);
                best_side = side;
            }
        }
    }
    best
}

/// The fewest rows, and the fewest columns, an output tile gets.
const TILE_MIN: usize = 64;

/// The fewest multiply-adds an output tile gets (the gemm's own threshold for threads).
const TILE_MIN_WORK: usize = 48 * 48 * 256;

/// The output's base pointer, handed to the threads computing its tiles.
#[derive(Clone, Copy)]
pub(crate) struct Shared(pub(crate) *mut f32);
// SAFETY: each thread writes a disjoint tile of the output through it (see `into`), whose
// caller keeps the output to itself until they are done.
#[allow(unsafe_code)]
unsafe impl Send for Shared {}
#[allow(unsafe_code)]
unsafe impl Sync for Shared {}

impl Shared {
    /// The pointer: read through a method, a closure captures the whole `Shared` (which is
    /// `Sync`), not its field (which is not).
    pub(crate) fn ptr(self) -> *mut f32 {
        self.0
    }
}

/// `x @ y` in f64, row-major `[m, n]`, for `x: [m, k]` and `y: [k, n]` read through `x(i, p)`
/// and `y(p, j)`: the products' tests' reference (their values exact in f32, so that the
/// order of the sums does not matter).
#[cfg(test)]
pub(crate) fn direct_f64(
    (m, n, k): (usize, usize, usize),
    x: impl Fn(usize, usize) -> f32,
    y: impl Fn(usize, usize) -> f32,
) -> Vec<f64> {
    let mut out = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            let dot: f64 = (0..k)
                .map(|p| f64::from(x(i, p)) * f64::from(y(p, j)))
                .sum();
            out.push(dot);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a direct triple loop: transposed and strided operands, accumulation into a
    /// bias, a scale, a block inside a wider output; and views that do not fit are refused.
    #[test]
    fn sgemm_matches_direct_product() {
        product_matches_direct(5, 7, 9, 1);
    }

    /// The same split into tiles over the pool: column bands (101 + 100 columns), row bands
    /// (67 + 67 + 66 rows at 3 threads), and 2 x 2 tiles of uneven sizes.
    #[test]
    fn tiles_match_direct_product() {
        assert_eq!(tiles(130, 201, 48, 2), (1, 2));
        product_matches_direct(130, 201, 48, 2);
        assert_eq!(tiles(200, 131, 100, 3), (3, 1));
        product_matches_direct(200, 131, 100, 3);
        assert_eq!(tiles(131, 201, 100, 4), (2, 2));
        product_matches_direct(131, 201, 100, 4);
    }

    /// A product into a new buffer equals the same product into a zeroed one, over tiles
    /// (2 x 2 at 4 threads, transposed `b`) and not, with a scale, and with k = 0; views that
    /// do not fit are refused.
    #[test]
    fn new_products_match_products_into_zeros() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .expect("pool");
        pool.install(|| {
            for (m, n, k, parallel) in [
                (131, 201, 100, true),
                (7, 5, 3, true),
                (9, 4, 0, false),
                (1, 300, 70, true),
                (300, 1, 70, true),
            ] {
                let a: Vec<f32> = (0..m * k).map(|i| (i % 11) as f32 - 5.0).collect();
                let bt: Vec<f32> = (0..n * k).map(|i| (i % 5) as f32 * 0.5).collect();
                let b = Mat {
                    data: &bt,
                    rs: 1,
                    cs: k,
                };
                let mut want = vec![0f32; m * n];
                assert!(sgemm(
                    m,
                    n,
                    k,
                    Mat::rows(&a, k),
                    b,
                    &mut want,
                    n,
                    false,
                    0.5,
                    1
                ));
                let got = product(
                    m,
                    n,
                    k,
                    Mat::rows(&a, k),
                    b,
                    0.5,
                    if parallel {
                        rayon::current_num_threads()
                    } else {
                        1
                    },
                );
                assert_eq!(got, Some(want), "{m} x {n} x {k}");
            }
            let a = vec![1f32; 12];
            assert_eq!(
                product(
                    4,
                    4,
                    4,
                    Mat::rows(&a, 4),
                    Mat::rows(&a, 4),
                    1.0,
                    rayon::current_num_threads()
                ),
                None
            );
        });
    }

    /// The output's longer side is split; nothing is split below the size limits.
    #[test]
    fn tiles_split_the_longer_side() {
        // BERT-base's linear at batch 8 and batch 1, ResNet-50's last 3x3 conv (7 x 7),
        // a 64-channel conv on 56 x 56.
        assert_eq!(tiles(1024, 768, 768, 2), (2, 1));
        assert_eq!(tiles(128, 3072, 768, 2), (1, 2));
        assert_eq!(tiles(512, 49, 4608, 2), (2, 1));
        assert_eq!(tiles(64, 3136, 576, 2), (1, 2));
        assert_eq!(tiles(1024, 768, 768, 16), (4, 4));
        assert_eq!(tiles(1024, 768, 768, 1), (1, 1));
        // Too little work, or both sides too short for two tiles.
        assert_eq!(tiles(100, 100, 100, 2), (1, 1));
        assert_eq!(tiles(100, 100, 100_000, 2), (1, 1));
        // Work for 4 tiles of this shape but not for 8 or 16.
        assert_eq!(tiles(512, 512, 9, 16), (2, 2));
    }

    fn product_matches_direct(m: usize, n: usize, k: usize, threads: usize) {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool");
        pool.install(|| product_matches_direct_here(m, n, k));
    }

    fn product_matches_direct_here(m: usize, n: usize, k: usize) {
        let a: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 * 0.25 - 1.0).collect();
        // b stored transposed: b[p, j] = bt[j * k + p].
        let bt: Vec<f32> = (0..n * k).map(|i| (i % 7) as f32 * 0.5 - 1.5).collect();
        let ldd = n + 3;
        let mut dst = vec![2.0f32; m * ldd];
        let ok = sgemm(
            m,
            n,
            k,
            Mat::rows(&a, k),
            Mat {
                data: &bt,
                rs: 1,
                cs: k,
            },
            &mut dst,
            ldd,
            true,
            0.5,
            rayon::current_num_threads(),
        );
        assert!(ok);
        for i in 0..m {
            for j in 0..ldd {
                let want = if j < n {
                    2.0 + 0.5 * (0..k).map(|p| a[i * k + p] * bt[j * k + p]).sum::<f32>()
                } else {
                    2.0
                };
                assert!((dst[i * ldd + j] - want).abs() < 1e-4, "({i}, {j})");
            }
        }
        // Row-major b, not accumulating: what dst held before is overwritten.
        let b: Vec<f32> = (0..k * n).map(|i| bt[(i % n) * k + i / n]).collect();
        let mut dst = vec![7.0f32; m * n];
        assert!(sgemm(
            m,
            n,
            k,
            Mat::rows(&a, k),
            Mat::rows(&b, n),
            &mut dst,
            n,
            false,
            1.0,
            rayon::current_num_threads()
        ));
        for i in 0..m {
            for j in 0..n {
                let want = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum::<f32>();
                assert!((dst[i * n + j] - want).abs() < 1e-4, "({i}, {j})");
            }
        }
        let mut small = vec![0f32; m * n - 1];
        assert!(!sgemm(
            m,
            n,
            k,
            Mat::rows(&a, k),
            Mat::rows(&bt, n),
            &mut small,
            n,
            false,
            1.0,
            1
        ));
    }

    /// `into_finished` hands every element of the product to `finish` exactly once, after its
    /// last multiply-add, with its row and column: against a direct product in f64 (values
    /// exact in f32) plus the row and column `finish` adds, on one thread and on tiles over 2
    /// and 4 threads, through the microkernels' stretches (several blocks of k, several runs
    /// of panels) and the gemm crate's matrix-vector products (one row, one column), into a
    /// block inside a wider output whose other columns stay as they were.
    #[test]
    fn finished_products_hand_each_element_to_finish_once() {
        let cases = [
            (70, 300, 1100, 1),
            (131, 300, 700, 2),
            (200, 131, 100, 4),
            (1, 200, 300, 2),
            (150, 1, 90, 2),
        ];
        for (m, n, k, threads) in cases {
            let a: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 * 0.25 - 1.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| (i % 7) as f32 * 0.5 - 1.5).collect();
            let ldd = n + 3;
            let mut out = vec![-7.0f32; m * ldd];
            let finish = |r: usize, j: usize, row: &mut [f32]| {
                for (c, v) in row.iter_mut().enumerate() {
                    *v += (1000 * r + j + c) as f32;
                }
            };
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("pool");
            // SAFETY: `out` holds the [m, n] block at row stride n + 3, nothing else touches
            // it, and k > 0.
            #[allow(unsafe_code)]
            let ok = pool.install(|| unsafe {
                let dst = Shared(out.as_mut_ptr());
                let (a, b) = (Mat::rows(&a, k), Mat::rows(&b, n));
                into_finished((m, n, k), a, b, dst, ldd, threads, Some(&finish))
            });
            assert!(ok, "{m} x {n} x {k}");
            let dots = direct_f64((m, n, k), |i, p| a[i * k + p], |p, j| b[p * n + j]);
            for i in 0..m {
                for j in 0..ldd {
                    let want = if j < n {
                        (dots[i * n + j] + (1000 * i + j) as f64) as f32
                    } else {
                        -7.0
                    };
                    assert_eq!(out[i * ldd + j], want, "{m}x{n}x{k} at ({i}, {j})");
                }
            }
        }
    }
}
