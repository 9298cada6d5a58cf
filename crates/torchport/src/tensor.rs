//! `TensorInfo`: what a checkpoint says about one tensor (name, dtype, shape, strides,
//! storage offset), the bounds check that keeps every view inside its storage, and the
//! gather that turns any strided view into contiguous little-endian bytes.

use std::borrow::Cow;

use crate::dtype::DType;

/// Byte order of the stored data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ByteOrder {
    /// Little-endian (what every current writer produces).
    Little,
    /// Big-endian (files written on big-endian machines); swapped on read.
    Big,
}

impl ByteOrder {
    /// `little` or `big`.
    pub fn name(self) -> &'static str {
        match self {
            ByteOrder::Little => "little",
            ByteOrder::Big => "big",
        }
    }
}

/// Quantization parameters of a quantized tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum Quant {
    /// `torch.per_tensor_affine`: `real = (q - zero_point) * scale`.
    PerTensor {
        /// Scale.
        scale: f64,
        /// Zero point.
        zero_point: i64,
    },
    /// `torch.per_channel_affine` (or `_float_qparams`): one scale and zero point per index
    /// along `axis`.
    PerChannel {
        /// Scales, one per channel.
        scales: Vec<f64>,
        /// Zero points, one per channel.
        zero_points: Vec<f64>,
        /// The channel dimension.
        axis: usize,
        /// True for `torch.per_channel_affine_float_qparams` (quantized embeddings): the
        /// zero points are floats; false for `torch.per_channel_affine` (integer zero points).
        float_qparams: bool,
    },
}

impl Quant {
    /// Torch's name of the quantization scheme (`per_tensor_affine`, `per_channel_affine`,
    /// `per_channel_affine_float_qparams`).
    pub fn scheme(&self) -> &'static str {
        match self {
            Quant::PerTensor { .. } => "per_tensor_affine",
            Quant::PerChannel {
                float_qparams: false,
                ..
            } => "per_channel_affine",
            Quant::PerChannel {
                float_qparams: true,
                ..
            } => "per_channel_affine_float_qparams",
        }
    }
}

/// Where a tensor's data lives.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    /// A strided view into storage number `storage` of the checkpoint.
    Strided {
        /// Index into the checkpoint's storages.
        storage: usize,
    },
    /// A tensor with no data (device `meta`).
    Meta,
    /// A tensor whose layout torchport does not read (sparse, nested, a wrapper subclass…).
    Unsupported {
        /// What it is, e.g. `a sparse_coo tensor`.
        what: String,
    },
}

/// Everything a checkpoint says about one tensor; reading its bytes is a separate step.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// The name: the key path, joined with `.` (see docs/CONTRACTS.md).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Sizes, outermost first.
    pub shape: Vec<usize>,
    /// Strides in elements, one per dimension.
    pub strides: Vec<usize>,
    /// Offset of element `[0, 0, …]` in the storage, in elements.
    pub offset: usize,
    /// Where the data lives.
    pub data: TensorData,
    /// Quantization parameters, for quantized dtypes.
    pub quant: Option<Quant>,
    /// Whether the tensor required grad when saved (parameters usually do).
    pub requires_grad: bool,
}

impl TensorInfo {
    /// Number of elements (the product of the shape; 1 for a 0-dim tensor). Readers only
    /// describe tensors whose size fits `usize`; a hand-built one that does not saturates.
    pub fn numel(&self) -> usize {
        self.shape.iter().fold(1usize, |n, &s| n.saturating_mul(s))
    }

    /// Size of the data in bytes once made contiguous (saturating, as [`Self::numel`]).
    pub fn nbytes(&self) -> usize {
        self.numel().saturating_mul(self.dtype.size())
    }

    /// True when the elements are laid out row-major with no gaps.
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1usize;
        for (&size, &stride) in self.shape.iter().zip(&self.strides).rev() {
            if size != 1 && stride != expected {
                return false;
            }
            expected = expected.saturating_mul(size);
        }
        true
    }
}

/// Contiguous row-major strides (in elements) for `shape`, as torch computes them: a
/// dimension of size 0 counts as 1, so `torch.empty(2, 0, 3).stride()` is `(3, 3, 1)`.
/// Saturates rather than overflowing; readers check the element count first.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1usize; shape.len()];
    let mut acc = 1usize;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(d.max(1));
    }
    strides
}

/// Check that a view lies inside a storage of `storage_bytes` bytes; returns the number of
/// bytes of data the view covers. Every product and sum is checked.
pub(crate) fn check_view(
    dtype: DType,
    shape: &[usize],
    strides: &[usize],
    offset: usize,
    storage_bytes: usize,
) -> Result<usize, String> {
    if shape.len() != strides.len() {
        return Err(format!(
            "has {} sizes but {} strides",
            shape.len(),
            strides.len()
        ));
    }
    let overflow = || format!("size {shape:?} with strides {strides:?} overflows");
    let numel = shape
        .iter()
        .try_fold(1usize, |acc, &s| acc.checked_mul(s))
        .ok_or_else(overflow)?;
    let nbytes = numel.checked_mul(dtype.size()).ok_or_else(overflow)?;
    if numel == 0 {
        return Ok(0);
    }
    let mut last = offset;
    for (&size, &stride) in shape.iter().zip(strides) {
        let span = (size - 1).checked_mul(stride).ok_or_else(overflow)?;
        last = last.checked_add(span).ok_or_else(overflow)?;
    }
    let end = last
        .checked_add(1)
        .and_then(|n| n.checked_mul(dtype.size()))
        .ok_or_else(overflow)?;
    if end > storage_bytes {
        return Err(format!(
            "view (offset {offset}, size {shape:?}, stride {strides:?}) reaches byte {end} \
             but its storage holds only {storage_bytes} bytes"
        ));
    }
    Ok(nbytes)
}

/// Contiguous little-endian bytes of a view that `check_view` accepted: borrowed when the
/// view is already contiguous little-endian, gathered otherwise.
pub(crate) fn view_bytes<'a>(
    info: &TensorInfo,
    storage: &'a [u8],
    order: ByteOrder,
) -> Cow<'a, [u8]> {
    let nbytes = info.nbytes();
    // An empty view's offset is never checked against its storage (it reads nothing), so
    // it is used only when there is something to read.
    let mut out: Cow<'a, [u8]> = if nbytes == 0 {
        Cow::Borrowed(&[])
    } else if info.is_contiguous() {
        let start = info.offset * info.dtype.size();
        Cow::Borrowed(&storage[start..start + nbytes])
    } else {
        Cow::Owned(gather(info, storage))
    };
    if order == ByteOrder::Big && info.dtype.swap_width() > 1 {
        swap_in_place(out.to_mut(), info.dtype.swap_width());
    }
    out
}

/// Copy a strided view into a new row-major buffer, a run of the innermost dimension at a
/// time when it is contiguous.
fn gather(info: &TensorInfo, storage: &[u8]) -> Vec<u8> {
    let esize = info.dtype.size();
    let ndim = info.shape.len();
    let mut out = Vec::with_capacity(info.nbytes());
    // The innermost dimension is copied as one run when its stride is 1.
    let (run_elems, outer) = match (info.shape.last(), info.strides.last()) {
        (Some(&n), Some(&1)) => (n, ndim - 1),
        _ => (1, ndim),
    };
    let run_bytes = run_elems * esize;
    let mut index = vec![0usize; outer];
    loop {
        let mut elem = info.offset;
        for (i, &ix) in index.iter().enumerate() {
            elem += ix * info.strides[i];
        }
        let b = elem * esize;
        out.extend_from_slice(&storage[b..b + run_bytes]);
        // Advance the odometer over the outer dimensions.
        let mut d = outer;
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            index[d] += 1;
            if index[d] < info.shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
}

/// Reverse the bytes of every `width`-byte word.
pub(crate) fn swap_in_place(bytes: &mut [u8], width: usize) {
    for chunk in bytes.chunks_exact_mut(width) {
        chunk.reverse();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(shape: &[usize], strides: &[usize], offset: usize) -> TensorInfo {
        TensorInfo {
            name: "t".into(),
            dtype: DType::I16,
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            offset,
            data: TensorData::Strided { storage: 0 },
            quant: None,
            requires_grad: false,
        }
    }

    #[test]
    fn strides_match_torch() {
        // Each expected value is `torch.empty(shape).stride()` (torch 2.15).
        assert_eq!(contiguous_strides(&[2, 3, 4]), [12, 4, 1]);
        assert_eq!(contiguous_strides(&[]), Vec::<usize>::new());
        assert_eq!(contiguous_strides(&[3]), [1]);
        assert_eq!(contiguous_strides(&[0]), [1]);
        assert_eq!(contiguous_strides(&[2, 0, 3]), [3, 3, 1]);
        assert_eq!(contiguous_strides(&[0, 3]), [3, 1]);
        assert_eq!(contiguous_strides(&[3, 0]), [1, 1]);
        assert_eq!(contiguous_strides(&[2, 3, 0]), [3, 1, 1]);
        assert_eq!(contiguous_strides(&[0, 0]), [1, 1]);
        assert_eq!(contiguous_strides(&[4, 0, 0, 2]), [2, 2, 2, 1]);
    }

    #[test]
    fn bounds() {
        assert_eq!(check_view(DType::F32, &[2, 3], &[3, 1], 0, 24), Ok(24));
        assert!(check_view(DType::F32, &[2, 3], &[3, 1], 1, 24).is_err());
        assert_eq!(check_view(DType::F32, &[0, 3], &[3, 1], 99, 0), Ok(0));
        assert!(check_view(DType::F32, &[1 << 62, 4], &[4, 1], 0, 24).is_err());
        assert!(check_view(DType::F32, &[2], &[usize::MAX], 0, 24).is_err());
        assert!(check_view(DType::F32, &[2], &[1, 1], 0, 24).is_err());
    }

    #[test]
    fn gather_transposed_and_expanded() {
        // storage: 0..6 as int16, viewed as the transpose of a 2x3 matrix.
        let storage: Vec<u8> = (0i16..6).flat_map(|v| v.to_le_bytes()).collect();
        let t = info(&[3, 2], &[1, 3], 0);
        let got: Vec<i16> = view_bytes(&t, &storage, ByteOrder::Little)
            .chunks(2)
            .map(|c| i16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(got, [0, 3, 1, 4, 2, 5]);
        let e = info(&[2, 3], &[0, 1], 1);
        let got: Vec<i16> = view_bytes(&e, &storage, ByteOrder::Little)
            .chunks(2)
            .map(|c| i16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(got, [1, 2, 3, 1, 2, 3]);
    }

    #[test]
    fn big_endian_swaps() {
        let storage = [0u8, 1, 0, 2];
        let t = info(&[2], &[1], 0);
        assert_eq!(&*view_bytes(&t, &storage, ByteOrder::Big), &[1, 0, 2, 0]);
    }
}
