//! Sliding blocks: `im2col` (F.unfold: every kernel-sized block of a padded `[N, C, H, W]`
//! input as a column, any dtype, output rows in parallel) and `col2im` (F.fold: the columns
//! summed back into the image, in f32 or f64, the scatter half of a transposed convolution).

use candle_core::{DType, Device, Tensor};

use super::{f32_vec, float, result_numel, window_param, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs};

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    r.add("aten.im2col.default", im2col);
    r.add("aten.col2im.default", col2im);
}

/// An `int[2]` argument (one value is used for both dims).
fn pair(a: &Args, name: &str) -> OpResult<[usize; 2]> {
    match a.ints(name)?.as_slice() {
        [x] => Ok([window_param(*x, name)?; 2]),
        [h, w] => Ok([window_param(*h, name)?, window_param(*w, name)?]),
        v => op_bail!("{name} {v:?} must have 2 values"),
    }
}

/// Kernel, dilation, padding and stride of an unfold or fold (or a convolution's windows).
pub(super) struct Blocks {
    pub(super) k: [usize; 2],
    pub(super) d: [usize; 2],
    pub(super) p: [usize; 2],
    pub(super) s: [usize; 2],
}

impl Blocks {
    fn read(a: &Args) -> OpResult<Self> {
        let b = Blocks {
            k: pair(a, "kernel_size")?,
            d: pair(a, "dilation")?,
            p: pair(a, "padding")?,
            s: pair(a, "stride")?,
        };
        if b.k.contains(&0) || b.d.contains(&0) || b.s.contains(&0) {
            op_bail!("kernel_size, dilation and stride must be positive");
        }
        Ok(b)
    }

    /// The number of block positions along dim `i` of an image of `len`.
    pub(super) fn count(&self, i: usize, len: usize) -> OpResult<usize> {
        super::conv::out_len(len, self.k[i], self.p[i], self.s[i], self.d[i])
    }
}

/// `im2col(self, kernel_size, dilation, padding, stride)`: `[N, C, H, W]` (or `[C, H, W]`)
/// → `[N, C·kh·kw, L]`.
fn im2col(a: &Args) -> OpResult<Outputs> {
    let x = a.tensor("self")?;
    let unbatched = x.rank() == 3;
    let x = if unbatched { x.unsqueeze(0)? } else { x };
    if x.rank() != 4 {
        op_bail!(
            "im2col expects a 3-d or 4-d input, got shape {:?}",
            x.dims()
        );
    }
    let y = columns(&x, &Blocks::read(a)?)?;
    one(if unbatched { y.squeeze(0)? } else { y })
}

/// Every block of `x` `[N, C, H, W]` (zero-padded) as a column: `[N, C·kh·kw, L]`, L the
/// block positions row by row (any dtype). Each output row (one plane and kernel tap) is
/// read straight from the unpadded plane, rows in parallel; the positions a row's taps
/// fall in the padding stay zero.
pub(super) fn columns(x: &Tensor, b: &Blocks) -> OpResult<Tensor> {
    let (n, c, h, w) = x.dims4()?;
    let (bh, bw) = (b.count(0, h)?, b.count(1, w)?);
    let (kh, kw) = (b.k[0], b.k[1]);
    result_numel(&[n, c, kh, kw, bh, bw], "im2col")?;
    let x = x.contiguous()?;
    let size = [h, w, bh, bw];
    let out = match x.dtype() {
        DType::F32 => taps::<f32>(&x, b, size),
        DType::F64 => taps::<f64>(&x, b, size),
        DType::F16 => taps::<half::f16>(&x, b, size),
        DType::BF16 => taps::<half::bf16>(&x, b, size),
        DType::I64 => taps::<i64>(&x, b, size),
        DType::I32 => taps::<i32>(&x, b, size),
        DType::I16 => taps::<i16>(&x, b, size),
        DType::U32 => taps::<u32>(&x, b, size),
        DType::U8 => taps::<u8>(&x, b, size),
        other => op_bail!("im2col does not support {other:?} tensors"),
    };
    let Some(out) = out else {
        op_bail!("im2col reads a CPU tensor");
    };
    Ok(out.reshape((n, c * kh * kw, bh * bw))?)
}

/// [`columns`] of a contiguous `x` of dtype `T`, `[N, C, h, w]`, with `bh × bw` block
/// positions (`size`: `[h, w, bh, bw]`): `[N·C·kh·kw, bh·bw]`. `None` when `x` is not a CPU
/// tensor of `T`.
fn taps<T: candle_core::WithDType>(x: &Tensor, b: &Blocks, size: [usize; 4]) -> Option<Tensor> {
    use rayon::prelude::*;
    let [h, w, bh, bw] = size;
    let (kh, kw) = (b.k[0], b.k[1]);
    let planes = x.dims()[0] * x.dims()[1];
    let l = bh * bw;
    let mut out = vec![T::zero(); planes * kh * kw * l];
    if out.is_empty() {
        return Tensor::from_vec(out, (planes * kh * kw, l), &Device::Cpu).ok();
    }
    // Where tap `k` of position `pos` falls along a dim (stride `s`, dilation `d`, padding
    // `p`), if inside `0..len`.
    let at = |pos: usize, k: usize, s: usize, d: usize, p: usize, len: usize| {
        (pos * s + k * d).checked_sub(p).filter(|&i| i < len)
    };
    super::fused::with_storage::<T, _>(x, |xs, lay| {
        let xs = xs.get(lay.start_offset()..)?.get(..planes * h * w)?;
        out.par_chunks_mut(l)
            .with_min_len((4096 / l).max(1))
            .enumerate()
            .for_each(|(row, o)| {
                let (plane, tap) = (row / (kh * kw), row % (kh * kw));
                let (i, j) = (tap / kw, tap % kw);
                let src = &xs[plane * h * w..][..h * w];
                for (y, orow) in o.chunks_mut(bw).enumerate() {
                    let Some(r) = at(y, i, b.s[0], b.d[0], b.p[0], h) else {
                        continue;
                    };
                    let srow = &src[r * w..][..w];
                    for (xx, v) in orow.iter_mut().enumerate() {
                        if let Some(col) = at(xx, j, b.s[1], b.d[1], b.p[1], w) {
                            *v = srow[col];
                        }
                    }
                }
            });
        Some(())
    })??;
    Tensor::from_vec(out, (planes * kh * kw, l), &Device::Cpu).ok()
}

/// `col2im(self, output_size, kernel_size, dilation, padding, stride)`: `[N, C·kh·kw, L]`
/// (or unbatched) → `[N, C, H, W]`, overlapping blocks summed.
fn col2im(a: &Args) -> OpResult<Outputs> {
    let x = float(&a.tensor("self")?)?;
    let unbatched = x.rank() == 2;
    let x = if unbatched { x.unsqueeze(0)? } else { x };
    if x.rank() != 3 {
        op_bail!(
            "col2im expects a 2-d or 3-d input, got shape {:?}",
            x.dims()
        );
    }
    let b = Blocks::read(a)?;
    let out = a.ints("output_size")?;
    let [oh, ow] = match out.as_slice() {
        [h, w] => [
            window_param(*h, "output_size")?,
            window_param(*w, "output_size")?,
        ],
        v => op_bail!("output_size {v:?} must have 2 values"),
    };
    let (n, rows, l) = x.dims3()?;
    let kk = b.k[0] * b.k[1];
    let (bh, bw) = (b.count(0, oh)?, b.count(1, ow)?);
    if rows % kk != 0 || Some(l) != bh.checked_mul(bw) {
        op_bail!(
            "col2im input of shape {:?} does not match kernel {:?} and {bh}x{bw} blocks of output {oh}x{ow}",
            x.dims(),
            b.k
        );
    }
    let c = rows / kk;
    result_numel(&[n, c, oh, ow], "col2im")?;
    let geo = (n, c, b.k, [bh, bw], [oh, ow]);
    let x = x.contiguous()?;
    let y = if x.dtype() == DType::F64 {
        let v = x.flatten_all()?.to_vec1::<f64>()?;
        super::conv::col2im(&v, geo, b.s, b.p, b.d)?
    } else {
        super::conv::col2im(&f32_vec(&x)?, geo, b.s, b.p, b.d)?
    };
    one(if unbatched { y.squeeze(0)? } else { y })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Each column holds the zero-padded input's value at its block position and tap, for
    /// kernels, dilations, paddings and strides unequal across the two dims, blocks that
    /// reach into the padding on every side, many rows to a parallel task and one, and
    /// integer inputs as float ones.
    #[test]
    fn columns_read_the_padded_input() {
        let dev = Device::Cpu;
        for (shape, k, d, p, s) in [
            ([2, 3, 7, 9], [3, 2], [1, 2], [1, 2], [2, 1]),
            ([1, 5, 28, 28], [3, 3], [1, 1], [1, 1], [1, 1]),
            ([1, 2, 5, 4], [5, 4], [1, 1], [2, 0], [3, 1]),
            ([3, 1, 6, 6], [2, 2], [3, 2], [0, 3], [1, 2]),
        ] {
            let x = Tensor::randn(0f32, 1., shape.to_vec(), &dev).unwrap();
            let b = Blocks { k, d, p, s };
            let got = columns(&x, &b).unwrap();
            let padded = (x.pad_with_zeros(2, p[0], p[0]).unwrap())
                .pad_with_zeros(3, p[1], p[1])
                .unwrap();
            let padded = padded.flatten_to(1).unwrap().to_vec3::<f32>().unwrap();
            let (bh, bw) = (b.count(0, shape[2]).unwrap(), b.count(1, shape[3]).unwrap());
            let got3 = got.to_vec3::<f32>().unwrap();
            assert_eq!(got.dims(), [shape[0], shape[1] * k[0] * k[1], bh * bw]);
            for (ni, image) in got3.iter().enumerate() {
                for (row, values) in image.iter().enumerate() {
                    let (ch, i, j) = (row / (k[0] * k[1]), row / k[1] % k[0], row % k[1]);
                    for (at, &v) in values.iter().enumerate() {
                        let (y, xx) = (at / bw * s[0] + i * d[0], at % bw * s[1] + j * d[1]);
                        let want = padded[ni * shape[1] + ch][y][xx];
                        assert_eq!(v, want, "{shape:?} {k:?}: {ni} {row} {at}");
                    }
                }
            }
            let ints = x.affine(10.0, 0.0).unwrap().to_dtype(DType::I64).unwrap();
            let as_floats = columns(&ints, &b).unwrap().to_dtype(DType::F32).unwrap();
            let floats = columns(&ints.to_dtype(DType::F32).unwrap(), &b).unwrap();
            assert_eq!(
                as_floats.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                floats.flatten_all().unwrap().to_vec1::<f32>().unwrap()
            );
        }
    }

    /// A crafted fold output size is refused (its block count does not match the input)
    /// instead of allocated; a crafted stride is refused; a kernel larger than the input is
    /// an error.
    #[test]
    fn crafted_sizes_are_refused() {
        let cols = Tensor::zeros((1, 4, 1), DType::F32, &Device::Cpu).unwrap();
        let ints = |v: &[i64]| json!({ "as_ints": v });
        let args = |out: &[i64], k: &[i64], s: i64| {
            vec![
                ("self", json!({"as_tensor": {"name": "c"}})),
                ("output_size", ints(out)),
                ("kernel_size", ints(k)),
                ("dilation", ints(&[1, 1])),
                ("padding", ints(&[0, 0])),
                ("stride", ints(&[s, s])),
            ]
        };
        let run = |target: &str, a: &[(&str, serde_json::Value)]| {
            super::super::run_node(register, target, a, &[("c", cols.clone())])
                .unwrap_err()
                .0
        };
        let big = 1i64 << 40;
        let e = run(
            "aten.col2im.default",
            &args(&[1 << 30, 1 << 30], &[2, 2], 1),
        );
        assert!(e.contains("does not match kernel"), "{e}");
        let e = run("aten.col2im.default", &args(&[big, 2], &[2, 2], 1));
        assert!(e.contains("output_size 1099511627776 is too large"), "{e}");
        let e = run("aten.col2im.default", &args(&[2, 2], &[2, 2], big));
        assert!(e.contains("stride 1099511627776 is too large"), "{e}");
        let mut a = args(&[2, 2], &[5, 5], 1);
        a.remove(1);
        let e = run("aten.im2col.default", &a);
        assert!(e.contains("larger than the padded input"), "{e}");
    }
}
