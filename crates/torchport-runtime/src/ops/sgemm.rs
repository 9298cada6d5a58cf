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
/// pool's threads. Returns false (and writes nothing) when a view does not fit its slice.
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
    let par = if parallel && threads > 1 {
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
    // SAFETY: every element the product reads, `a[i * rs + p * cs]` for i < m, p < k (and
    // likewise for b over k x n), lies inside its slice, and every element it writes,
    // `dst[i * ldd + j]` for i < m, j < n, lies inside `dst`, which is borrowed mutably and so
    // aliases neither input (checked by `fits` above). With `read_dst` false gemm never reads
    // `dst`.
    #[allow(unsafe_code)]
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            drs,
            accumulate,
            a.data.as_ptr(),
            acs,
            ars,
            b.data.as_ptr(),
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
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a direct triple loop: transposed and strided operands, accumulation into a
    /// bias, a scale, a block inside a wider output; and views that do not fit are refused.
    #[test]
    fn sgemm_matches_direct_product() {
        let (m, n, k) = (5, 7, 9);
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
