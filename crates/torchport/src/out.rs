//! `OutTensor`: a tensor on its way to a writer or a transformation — name, dtype, shape,
//! and its bytes (contiguous, little-endian) produced on demand, so writers can stream one
//! tensor at a time and transformations can be chained without reading anything early.

use std::borrow::Cow;
use std::fmt;

use crate::checkpoint::Checkpoint;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::storage::FileRange;
use crate::tensor::{Quant, TensorInfo};

type Producer<'a> = Box<dyn Fn() -> Result<Cow<'a, [u8]>> + 'a>;
type Release<'a> = Box<dyn Fn() + 'a>;

/// A tensor to be written or transformed; its data is produced when asked for.
pub struct OutTensor<'a> {
    /// Output name.
    pub name: String,
    /// Element type of the produced bytes.
    pub dtype: DType,
    /// Shape of the produced bytes (row-major).
    pub shape: Vec<usize>,
    data: Producer<'a>,
    release: Option<Release<'a>>,
    /// Where the produced bytes lie, unchanged, in an input file (see [`OutTensor::file_range`]).
    source: Option<FileRange>,
    /// Quantization parameters, for a quantized dtype whose bytes are its integer values.
    quant: Option<Quant>,
}

impl fmt::Debug for OutTensor<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutTensor")
            .field("name", &self.name)
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .finish_non_exhaustive()
    }
}

impl<'a> OutTensor<'a> {
    /// A tensor whose bytes come from `data` (contiguous, little-endian, row-major).
    pub fn new(
        name: impl Into<String>,
        dtype: DType,
        shape: Vec<usize>,
        data: impl Fn() -> Result<Cow<'a, [u8]>> + 'a,
    ) -> Self {
        OutTensor {
            name: name.into(),
            dtype,
            shape,
            data: Box::new(data),
            release: None,
            source: None,
            quant: None,
        }
    }

    /// Attach quantization parameters: the tensor's dtype is quantized (`qint8`, `quint8`,
    /// `qint32`) and its bytes are the integer values (torch's `int_repr()`). Writers need
    /// them to write a quantized tensor (see [`crate::quant`]).
    pub fn with_quant(mut self, quant: Option<Quant>) -> Self {
        self.quant = quant;
        self
    }

    /// The quantization parameters, for a quantized tensor that still has them (a
    /// transformation that rebuilds a tensor drops them).
    pub fn quant(&self) -> Option<&Quant> {
        self.quant.as_ref()
    }

    /// Record that the bytes `data` produces are exactly `range` of an input file, so a
    /// writer may copy them file to file instead of reading them.
    pub(crate) fn with_file_range(mut self, range: Option<FileRange>) -> Self {
        self.source = range;
        self
    }

    /// The range of an input file holding exactly this tensor's bytes, if known; `None`
    /// when its length no longer matches the dtype and shape (they were changed), so the
    /// writer falls back to [`OutTensor::data`] and its checks.
    pub(crate) fn file_range(&self) -> Option<&FileRange> {
        self.source.as_ref().filter(|r| r.len() == self.nbytes())
    }

    /// Attach a hook that [`OutTensor::release`] calls once the data has been written (for
    /// checkpoint tensors: drop the source pages from resident memory).
    pub fn with_release(mut self, release: impl Fn() + 'a) -> Self {
        self.release = Some(Box::new(release));
        self
    }

    /// Tell the source that this tensor's bytes are no longer needed (a hint; see
    /// [`Checkpoint::release`]). Writers call it after writing each tensor.
    pub fn release(&self) {
        if let Some(r) = &self.release {
            r();
        }
    }

    /// A tensor that produces exactly what `self` produces (same name, dtype, shape,
    /// parameters, release hook and file range), borrowing it.
    pub fn borrowed<'b>(&'b self) -> OutTensor<'b> {
        OutTensor::new(
            self.name.clone(),
            self.dtype,
            self.shape.clone(),
            move || self.data(),
        )
        .with_release(move || self.release())
        .with_file_range(self.source.clone())
        .with_quant(self.quant.clone())
    }

    /// A tensor of a checkpoint, read (zero-copy where possible) when asked for.
    pub fn from_checkpoint(ckpt: &'a Checkpoint, t: &'a TensorInfo) -> Self {
        OutTensor::new(t.name.clone(), t.dtype, t.shape.clone(), move || {
            ckpt.data(t)
        })
        .with_release(move || ckpt.release(t))
        .with_file_range(ckpt.file_range(t))
        .with_quant(t.quant.clone())
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Size of the data in bytes.
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }

    /// Produce the bytes; checks that their length matches dtype and shape.
    pub fn data(&self) -> Result<Cow<'a, [u8]>> {
        let d = (self.data)()?;
        if d.len() != self.nbytes() {
            return Err(Error::Tensor {
                path: Default::default(),
                tensor: self.name.clone(),
                what: format!(
                    "produced {} bytes, but {} {:?} needs {}",
                    d.len(),
                    self.dtype,
                    self.shape,
                    self.nbytes()
                ),
            });
        }
        Ok(d)
    }
}

impl Checkpoint {
    /// Every tensor with readable data, as [`OutTensor`]s in file order (meta and other
    /// data-less tensors are left out; see [`Checkpoint::tensors`] for all of them).
    pub fn out_tensors(&self) -> Vec<OutTensor<'_>> {
        self.tensors
            .iter()
            .filter(|t| matches!(t.data, crate::tensor::TensorData::Strided { .. }))
            .map(|t| OutTensor::from_checkpoint(self, t))
            .collect()
    }
}
