//! torchvision's detection operators, as its CPU kernels compute them: `torchvision::nms`
//! (non-maximum suppression) and `torchvision::roi_align` (the pooling of Faster and Mask
//! R-CNN's box heads). Scripted detection models call them (`ops.torchvision.nms`), and so do
//! `.pt2` exports of code that uses `torchvision.ops`.

use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

use super::{Real, Registry};
use crate::error::OpResult;
use crate::op_bail;
use crate::value::{one, Args, Outputs};

/// Register the kernels of this family.
pub fn register(r: &mut Registry) {
    r.add("torchvision.nms.default", nms);
    r.add("torchvision.roi_align.default", roi_align);
}

/// The indices of the boxes `dets` (`[n, 4]`, `x1, y1, x2, y2`) kept by non-maximum
/// suppression, by decreasing `scores`: a box is dropped when its intersection over union
/// with a kept box of higher score exceeds `iou_threshold`. Boxes whose scores tie exactly
/// are taken lower index first (torchvision's kernel sorts them with torch's unstable sort,
/// so their order there may differ). int64.
fn nms(a: &Args) -> OpResult<Outputs> {
    let dets = a.tensor("dets")?;
    let scores = a.tensor("scores")?;
    let threshold = a.float("iou_threshold")?;
    if dets.rank() != 2 || dets.dims()[1] != 4 {
        op_bail!("nms: boxes must be [n, 4], got {:?}", dets.dims());
    }
    if scores.rank() != 1 || scores.dims()[0] != dets.dims()[0] {
        op_bail!(
            "nms: scores must be [n] for {} boxes, got {:?}",
            dets.dims()[0],
            scores.dims()
        );
    }
    if dets.dtype() != scores.dtype() || !matches!(dets.dtype(), DType::F32 | DType::F64) {
        op_bail!(
            "nms: boxes and scores must be of one float dtype, got {:?} and {:?}",
            dets.dtype(),
            scores.dtype()
        );
    }
    let keep = match dets.dtype() {
        DType::F64 => suppress(
            &dets.flatten_all()?.to_vec1::<f64>()?,
            &scores.to_vec1::<f64>()?,
            threshold,
        ),
        _ => suppress(
            &dets.flatten_all()?.to_vec1::<f32>()?,
            &scores.to_vec1::<f32>()?,
            threshold,
        ),
    };
    let n = keep.len();
    one(Tensor::from_vec(keep, n, &Device::Cpu)?)
}

fn max<T: Real>(a: T, b: T) -> T {
    if b > a {
        b
    } else {
        a
    }
}

fn min<T: Real>(a: T, b: T) -> T {
    if b < a {
        b
    } else {
        a
    }
}

/// The kept indices of `boxes` (`n * 4` values) by `scores`, computed in the boxes' own
/// dtype as torchvision's kernel computes, each overlap compared with the threshold as a
/// float64 (as there: 0.7 is not a float32).
fn suppress<T: Real>(boxes: &[T], scores: &[T], threshold: f64) -> Vec<i64> {
    let n = scores.len();
    let b = |i: usize, k: usize| boxes[i * 4 + k];
    let areas: Vec<T> = (0..n)
        .map(|i| (b(i, 2) - b(i, 0)) * (b(i, 3) - b(i, 1)))
        .collect();
    // Descending, NaN first (torch orders NaN above every number), ties by index.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&i, &j| super::sort::nan_last(&scores[j], &scores[i]));
    let zero = T::from_f64(0.0);
    let mut suppressed = vec![false; n];
    let mut keep = Vec::new();
    for (at, &i) in order.iter().enumerate() {
        if suppressed[i] {
            continue;
        }
        keep.push(i as i64);
        for &j in &order[at + 1..] {
            if suppressed[j] {
                continue;
            }
            let w = max(zero, min(b(i, 2), b(j, 2)) - max(b(i, 0), b(j, 0)));
            let h = max(zero, min(b(i, 3), b(j, 3)) - max(b(i, 1), b(j, 1)));
            let inter = w * h;
            if (inter / (areas[i] + areas[j] - inter)).to_f64() > threshold {
                suppressed[j] = true;
            }
        }
    }
    keep
}

/// For each region of interest (`rois`: `[k, 5]`, the image's index in the batch, then
/// `x1, y1, x2, y2` in input coordinates scaled by `spatial_scale`), its `pooled_height x
/// pooled_width` bins of every channel of `input` (`[n, c, h, w]`), each the mean of a grid
/// of bilinear samples (`sampling_ratio` a side, or as many as the bin spans in whole
/// pixels where it is not positive). `aligned` moves the regions by half a pixel.
/// `[k, c, pooled_height, pooled_width]`, float32.
fn roi_align(a: &Args) -> OpResult<Outputs> {
    let input = a.tensor("input")?;
    let rois = a.tensor("rois")?;
    let scale = a.float("spatial_scale")? as f32;
    let (ph, pw) = (a.int("pooled_height")?, a.int("pooled_width")?);
    let sampling = a.int("sampling_ratio")?;
    let aligned = a.bool_or("aligned", false)?;
    if input.rank() != 4 {
        op_bail!(
            "roi_align: input must be [n, c, h, w], got {:?}",
            input.dims()
        );
    }
    if rois.rank() != 2 || rois.dims()[1] != 5 {
        op_bail!("roi_align: rois must be [k, 5], got {:?}", rois.dims());
    }
    if input.dtype() != DType::F32 || rois.dtype() != DType::F32 {
        op_bail!(
            "roi_align: float32 input and rois only, got {:?} and {:?}",
            input.dtype(),
            rois.dtype()
        );
    }
    if ph <= 0 || pw <= 0 {
        op_bail!("roi_align: pooled size must be positive, got {ph} x {pw}");
    }
    let (n, c, h, w) = input.dims4()?;
    let (ph, pw) = (ph as usize, pw as usize);
    let k = rois.dims()[0];
    let total = super::result_numel(&[k, c, ph, pw], "roi_align")?;
    let x = input.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
    let r = rois.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
    let mut out = vec![0f32; total];
    let plane = ph * pw;
    if plane > 0 && c > 0 {
        let bad = out
            .par_chunks_mut(c * plane)
            .enumerate()
            .map(|(i, out)| {
                let roi = &r[i * 5..i * 5 + 5];
                let image = roi[0] as i64;
                if image < 0 || image as usize >= n {
                    return Some(roi[0]);
                }
                let region = Region::new(roi, scale, aligned, sampling, (ph, pw));
                let count = (region.grid.0 * region.grid.1).max(1) as f32;
                let images = &x[image as usize * c * h * w..(image as usize + 1) * c * h * w];
                // Each bin's samples serve every channel; one bin's at a time (a region's
                // grid is bounded, its bins' samples together need not be small).
                let mut samples = Vec::new();
                for bin in 0..plane {
                    region.bin_samples(bin, h, w, &mut samples);
                    for ch in 0..c {
                        let src = &images[ch * h * w..(ch + 1) * h * w];
                        let mut v = 0f32;
                        for s in &samples {
                            v += s.w[0] * src[s.at[0]]
                                + s.w[1] * src[s.at[1]]
                                + s.w[2] * src[s.at[2]]
                                + s.w[3] * src[s.at[3]];
                        }
                        out[ch * plane + bin] = v / count;
                    }
                }
                None
            })
            .find_any(|b| b.is_some())
            .flatten();
        if let Some(b) = bad {
            op_bail!("roi_align: a region names image {b} of a batch of {n}");
        }
    }
    one(Tensor::from_vec(out, (k, c, ph, pw), &Device::Cpu)?)
}

/// One region's bins in input coordinates.
struct Region {
    start: (f32, f32),
    bin: (f32, f32),
    grid: (usize, usize),
    pooled: (usize, usize),
}

/// A bilinear sample: four pixels and their weights.
#[derive(Clone, Copy, Default)]
struct Sample {
    at: [usize; 4],
    w: [f32; 4],
}

/// Most samples a side of one bin (where the sampling ratio is derived from a region's size;
/// a hostile region of 1e30 pixels must not ask for that many): a bin's samples take at most
/// 48 MiB.
const MAX_GRID: usize = 1 << 10;

impl Region {
    fn new(roi: &[f32], scale: f32, aligned: bool, sampling: i64, pooled: (usize, usize)) -> Self {
        let offset = if aligned { 0.5 } else { 0.0 };
        let (x1, y1) = (roi[1] * scale - offset, roi[2] * scale - offset);
        let (x2, y2) = (roi[3] * scale - offset, roi[4] * scale - offset);
        let (mut rw, mut rh) = (x2 - x1, y2 - y1);
        if !aligned {
            rw = rw.max(1.0);
            rh = rh.max(1.0);
        }
        let bin = (rh / pooled.0 as f32, rw / pooled.1 as f32);
        let side = |extent: f32, pooled: usize| -> usize {
            if sampling > 0 {
                (sampling as usize).min(MAX_GRID)
            } else {
                let g = (extent / pooled as f32).ceil();
                if g.is_nan() || g <= 0.0 {
                    0
                } else {
                    (g as usize).min(MAX_GRID)
                }
            }
        };
        Region {
            start: (y1, x1),
            bin,
            grid: (side(rh, pooled.0), side(rw, pooled.1)),
            pooled,
        }
    }

    /// The samples of bin `bin` (row-major) on an `h x w` plane, into `out`.
    fn bin_samples(&self, bin: usize, h: usize, w: usize, out: &mut Vec<Sample>) {
        let (gh, gw) = self.grid;
        let (py, px) = (bin / self.pooled.1, bin % self.pooled.1);
        out.clear();
        for iy in 0..gh {
            let y =
                self.start.0 + py as f32 * self.bin.0 + (iy as f32 + 0.5) * self.bin.0 / gh as f32;
            for ix in 0..gw {
                let x = self.start.1
                    + px as f32 * self.bin.1
                    + (ix as f32 + 0.5) * self.bin.1 / gw as f32;
                out.push(bilinear(y, x, h, w));
            }
        }
    }
}

/// The bilinear sample at `(y, x)`: zero outside the plane by more than a pixel (and for NaN),
/// clamped to its edge within one.
fn bilinear(y: f32, x: f32, h: usize, w: usize) -> Sample {
    let inside = y >= -1.0 && y <= h as f32 && x >= -1.0 && x <= w as f32;
    if !inside || h == 0 || w == 0 {
        return Sample::default();
    }
    let (y0, y1, ly) = axis(y, h);
    let (x0, x1, lx) = axis(x, w);
    let (hy, hx) = (1.0 - ly, 1.0 - lx);
    Sample {
        at: [y0 * w + x0, y0 * w + x1, y1 * w + x0, y1 * w + x1],
        w: [hy * hx, hy * lx, ly * hx, ly * lx],
    }
}

/// A coordinate within a pixel of an axis of `len` pixels: its two neighbouring pixels and
/// the weight of the second (a coordinate below 0 is 0; from the last pixel on, both are
/// the last pixel).
fn axis(v: f32, len: usize) -> (usize, usize, f32) {
    let v = v.max(0.0);
    let lo = v as usize;
    if lo >= len - 1 {
        (len - 1, len - 1, 0.0)
    } else {
        (lo, lo + 1, v - lo as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suppression_keeps_the_best_of_each_overlapping_group() {
        // Boxes 0 and 1 overlap by 81/100; 2 is apart; 3 has the top score and overlaps
        // nothing; the tie between 4 and 2 keeps the lower index first.
        let boxes = [
            0.0, 0.0, 10.0, 10.0, //
            1.0, 1.0, 10.0, 10.0, //
            20.0, 20.0, 30.0, 30.0, //
            50.0, 50.0, 60.0, 60.0, //
            100.0, 0.0, 110.0, 10.0f32,
        ];
        let scores = [0.5, 0.9, 0.3, 0.95, 0.3f32];
        assert_eq!(suppress(&boxes, &scores, 0.5), vec![3, 1, 2, 4]);
        // At a threshold above the overlap both stay.
        assert_eq!(suppress(&boxes, &scores, 0.85), vec![3, 1, 0, 2, 4]);
        // An overlap of 30/100 is 0.300000012 as a float32, above a threshold of 0.3 (a
        // float64, as torchvision compares): suppressed, where comparing in float32 kept it.
        let boxes = [0.0, 0.0, 10.0, 10.0, 0.0, 0.0, 10.0, 3.0f32];
        assert_eq!(suppress(&boxes, &[0.9, 0.8f32], 0.3), vec![0]);
    }

    /// `roi_align` on `rois` (`[k, 5]` values) over a `[1, 2, 4, 4]` input, pooled to `ph x pw`.
    fn align(rois: &[f32], ph: i64, pw: i64) -> OpResult<Outputs> {
        let x = Tensor::arange(0f32, 32.0, &Device::Cpu)
            .unwrap()
            .reshape((1, 2, 4, 4))
            .unwrap();
        let r = Tensor::from_vec(rois.to_vec(), (rois.len() / 5, 5), &Device::Cpu).unwrap();
        let args = [
            ("input", serde_json::json!({"as_tensor": {"name": "x"}})),
            ("rois", serde_json::json!({"as_tensor": {"name": "r"}})),
            ("spatial_scale", serde_json::json!({"as_float": 1.0})),
            ("pooled_height", serde_json::json!({"as_int": ph})),
            ("pooled_width", serde_json::json!({"as_int": pw})),
            ("sampling_ratio", serde_json::json!({"as_int": -1})),
            ("aligned", serde_json::json!({"as_bool": false})),
        ];
        super::super::run_node(
            register,
            "torchvision.roi_align.default",
            &args,
            &[("x", x), ("r", r)],
        )
    }

    #[test]
    fn hostile_regions_are_one_error_or_zeros() {
        let err = |r: OpResult<Outputs>| match r {
            Err(e) => e.0,
            Ok(_) => panic!("accepted"),
        };
        // An image index past the batch, or negative.
        assert!(err(align(&[1.0, 0.0, 0.0, 2.0, 2.0], 2, 2)).contains("image 1 of a batch of 1"));
        assert!(err(align(&[-1.0, 0.0, 0.0, 2.0, 2.0], 2, 2)).contains("image -1"));
        // A pooled size of nothing, or so large the output would not fit.
        assert!(err(align(&[0.0, 0.0, 0.0, 2.0, 2.0], 0, 2)).contains("positive"));
        assert!(err(align(&[0.0; 5], 1 << 20, 1 << 20)).contains("too large"));
        // A region of 1e30 pixels samples a bounded grid; NaN corners give zeros.
        let Ok(out) = align(&[0.0, 0.0, 0.0, 1e30, 1e30], 1, 1) else {
            panic!("a huge region");
        };
        assert!(matches!(&out[0], crate::value::Value::Tensor(t) if t.dims() == [1, 2, 1, 1]));
        let Ok(out) = align(&[0.0, f32::NAN, 0.0, 2.0, 2.0], 1, 1) else {
            panic!("a NaN region");
        };
        let crate::value::Value::Tensor(t) = &out[0] else {
            panic!("not a tensor");
        };
        let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(v.iter().all(|x| *x == 0.0), "{v:?}");
    }

    #[test]
    fn boxes_and_scores_of_other_shapes_are_refused() {
        let nms_of = |b: Tensor, s: Tensor| {
            let args = [
                ("dets", serde_json::json!({"as_tensor": {"name": "b"}})),
                ("scores", serde_json::json!({"as_tensor": {"name": "s"}})),
                ("iou_threshold", serde_json::json!({"as_float": 0.5})),
            ];
            super::super::run_node(
                register,
                "torchvision.nms.default",
                &args,
                &[("b", b), ("s", s)],
            )
        };
        let cpu = &Device::Cpu;
        let three = Tensor::zeros((2, 3), DType::F32, cpu).unwrap();
        let four = Tensor::zeros((2, 4), DType::F32, cpu).unwrap();
        let s2 = Tensor::zeros(2, DType::F32, cpu).unwrap();
        assert!(nms_of(three, s2.clone()).is_err());
        assert!(nms_of(four.clone(), Tensor::zeros(3, DType::F32, cpu).unwrap()).is_err());
        assert!(nms_of(four.clone(), s2.to_dtype(DType::F64).unwrap()).is_err());
        // No boxes: nothing kept.
        let none = nms_of(
            Tensor::zeros((0, 4), DType::F32, cpu).unwrap(),
            Tensor::zeros(0, DType::F32, cpu).unwrap(),
        );
        assert!(matches!(&none.unwrap()[0], crate::value::Value::Tensor(t) if t.dims() == [0]));
    }

    #[test]
    fn a_bilinear_sample_clamps_within_a_pixel_of_the_edge_and_is_zero_beyond() {
        let s = bilinear(-0.5, 3.5, 4, 4);
        assert_eq!(s.at, [3, 3, 7, 7]);
        assert_eq!(s.w, [1.0, 0.0, 0.0, 0.0]);
        let s = bilinear(-1.5, 1.0, 4, 4);
        assert_eq!(s.w, [0.0; 4]);
        let s = bilinear(f32::NAN, 1.0, 4, 4);
        assert_eq!(s.w, [0.0; 4]);
    }
}
