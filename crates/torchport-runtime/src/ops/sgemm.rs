//! A checked f32 matrix product on slices, straight to the `gemm` crate candle's CPU matmul
//! calls, for kernels that need what candle's `matmul` does not offer: accumulating into an
//! output that already holds a bias, writing into a slice of a larger buffer (one image of a
//! batch, one head of an attention), a scale folded into the product, and choosing whether the
//! product itself splits across threads (not when the caller already runs one product per
//! thread).

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
    fn fits(&self, r: usize, c: usize) -> bool {
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
/// row-major `[m, n]` block with row stride `ldd`. `parallel` lets the product use the rayon
/// pool's threads (a product of at most 512 rows as one band of output columns per thread,
/// which scaled better than the gemm's own split on such products). Returns false (and writes nothing) when a view does not fit its slice.
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
    parallel: bool,
) -> bool {
    let d = Mat {
        data: dst,
        rs: ldd,
        cs: 1,
    };
    if !a.fits(m, k) || !b.fits(k, n) || !d.fits(m, n) || (n > ldd && m > 1) {
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
    let threads = rayon::current_num_threads();
    // A short product over the pool: one band of output columns per thread (see
    // [`COLUMN_BAND_MAX_ROWS`]); otherwise the gemm's own split, or none.
    let bands = if parallel && m <= COLUMN_BAND_MAX_ROWS {
        threads.min(n / COLUMN_BAND_MIN)
    } else {
        1
    };
    let par = if parallel && threads > 1 && bands < 2 {
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
    // Columns j0..j0 + width of the product, with the given parallelism.
    let product = |out: Shared, j0: usize, width: usize, par: gemm::Parallelism| {
        // SAFETY: every element the product reads, `a[i * rs + p * cs]` for i < m, p < k (and
        // likewise for b over k x n, of which this reads columns j0..j0 + width < n), lies
        // inside its slice, and every element it writes, `dst[i * ldd + j]` for i < m and j0 <=
        // j < j0 + width <= n, lies inside `dst`, which is borrowed mutably and so aliases
        // neither input (checked by `fits` above). Concurrent calls are given disjoint column
        // ranges, so no element is written by two of them. With `read_dst` false gemm never
        // reads `dst`.
        #[allow(unsafe_code)]
        unsafe {
            gemm::gemm(
                m,
                width,
                k,
                out.0.add(j0),
                1,
                drs,
                accumulate,
                a.data.as_ptr(),
                acs,
                ars,
                b.data.as_ptr().add(j0 * b.cs),
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
    };
    let out = Shared(dst.as_mut_ptr());
    if bands < 2 {
        product(out, 0, n, par);
    } else {
        use rayon::prelude::*;
        let width = n.div_ceil(bands);
        (0..bands).into_par_iter().for_each(|i| {
            let j0 = i * width;
            if j0 < n {
                product(out, j0, width.min(n - j0), gemm::Parallelism::None);
            }
        });
    }
    true
}

/// Products of at most this many rows, run over the pool, split their output columns into
/// one band per thread, each band a single-threaded product, instead of leaving the split to
/// the gemm. Measured at 2 threads (least of 5 rounds, 8 weights cycled; BENCHMARKS.md,
/// issue 14), speed-up over 1 thread, the gemm's split against bands: a 64-channel 3x3 conv
/// on 56 x 56 (64 x 576 x 3136) 1.01x against 1.90x; batch-1 transformer linears (128 x 768
/// x 768, 128 x 2048 x 768, 197 x 1536 x 384) 1.43–1.83x against 1.76–2.07x. With 1,576
/// rows (ViT-S at batch 8) the gemm's own split was as good or better (1.96x against 1.66x
/// on 1576 x 384 x 1152).
const COLUMN_BAND_MAX_ROWS: usize = 512;

/// The fewest output columns a band gets.
const COLUMN_BAND_MIN: usize = 64;

/// The output's base pointer, handed to the threads computing its column bands.
#[derive(Clone, Copy)]
struct Shared(*mut f32);
// SAFETY: each thread writes a disjoint set of the output's elements through it (see
// `sgemm`), while `sgemm` holds the output's only mutable borrow until they are done.
#[allow(unsafe_code)]
unsafe impl Send for Shared {}
#[allow(unsafe_code)]
unsafe impl Sync for Shared {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a direct triple loop: transposed and strided operands, accumulation into a
    /// bias, a scale, a block inside a wider output; and views that do not fit are refused.
    #[test]
    fn sgemm_matches_direct_product() {
        product_matches_direct(5, 7, 9, 1);
    }

    /// The same with the output's columns in bands, one per thread: 200 columns in 3 bands
    /// (67, 67, 66 wide), and 64 columns at 3 threads (one band: the gemm's own split).
    #[test]
    fn column_bands_match_direct_product() {
        product_matches_direct(6, 200, 11, 3);
        product_matches_direct(6, 64, 11, 3);
        product_matches_direct(COLUMN_BAND_MAX_ROWS + 1, 130, 3, 2);
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
            true,
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
            true
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
            false
        ));
    }
}
