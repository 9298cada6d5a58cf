//! Writing a load's weights past the caches.
//!
//! A load writes each weight once and reads none of them back before the first run, so the
//! lines it writes need not be fetched into the caches first (a plain store reads each line
//! before writing it) nor evict what the load is reading. Non-temporal stores write whole
//! lines straight to memory: with them, BERT-base's and the Llama-style model's loads into
//! reused memory took 18–22% less time, GPT-2's 7–9%, MobileNetV3-Large's 5% on 1 thread
//! (BENCHMARKS.md, issue 14). They write the packed panels, the plain copies and GPT-2's
//! columns; not the batch norms' scaled copies (measured level). The plain copy is also how
//! `archive::tensor_from_bytes` decodes float32 values, so the arrays `npy.rs` reads (a
//! run's inputs) are written past the caches too, and their first reader reads them from
//! memory. Such stores are weakly ordered, so [`streamed`] fences them before handing the
//! values on.

use std::marker::PhantomData;
use std::mem::MaybeUninit;

use super::tile::{transpose_tile, Lanes, Strided, StridedMut};

/// Writes values with non-temporal stores where the CPU and the alignment allow (plain
/// stores elsewhere). Only [`streamed`] makes one, and it cannot leave its thread (a raw
/// pointer's marker makes it neither `Send` nor `Sync`), so every store it makes is fenced
/// on the thread that made it.
pub(crate) struct Streamer(PhantomData<*const ()>);

/// Run `f` with a [`Streamer`], then fence its stores (`sfence`), so that the values it
/// wrote are seen by any thread that later synchronises with this one, as plain stores are.
pub(crate) fn streamed<R>(f: impl FnOnce(&Streamer) -> R) -> R {
    let out = f(&Streamer(PhantomData));
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` only orders this thread's earlier stores before its later ones (SSE,
    // which every x86-64 CPU has).
    #[allow(unsafe_code)]
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    out
}

impl Streamer {
    /// [`super::tile::transpose_into`] (its source and destination each given as values,
    /// first index, row stride), each destination row written as `lanes` says (wider than
    /// the tile, with zeros; scaled), each whole 16-value row written to a 64-byte aligned
    /// address by a non-temporal store (AVX-512).
    pub(super) fn transpose_into(
        &self,
        src: Strided,
        rows: usize,
        cols: usize,
        dst: StridedMut,
        lanes: Lanes,
    ) {
        transpose_tile::<true>(src, rows, cols, dst, lanes);
    }

    /// The values of `src` into `dst` (`src.len()` of them, at most `dst.len()`), as
    /// [`Streamer::copy_le_into`] writes them.
    pub(crate) fn copy_into(&self, src: &[f32], dst: &mut [MaybeUninit<f32>]) {
        #[cfg(target_endian = "little")]
        {
            // SAFETY: the f32 values' bytes, read as the bytes they are (f32 has no padding
            // and every byte of an initialised value is initialised); in memory they are
            // little-endian, as `copy_le_into` reads them.
            #[allow(unsafe_code)]
            let bytes =
                unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), src.len() * 4) };
            self.copy_le_into(bytes, dst)
        }
        #[cfg(not(target_endian = "little"))]
        for (d, &v) in dst.iter_mut().zip(src) {
            d.write(v);
        }
    }

    /// The little-endian f32 values of `bytes` into `dst` (`bytes.len() / 4` of them, at
    /// most `dst.len()`), the 64-byte aligned lines of `dst` by non-temporal stores
    /// (AVX-512), the values before and after them by plain ones. Writes every value of
    /// `dst[..bytes.len() / 4]`.
    pub(crate) fn copy_le_into(&self, bytes: &[u8], dst: &mut [MaybeUninit<f32>]) {
        let n = (bytes.len() / 4).min(dst.len());
        let (bytes, dst) = (&bytes[..n * 4], &mut dst[..n]);
        let plain = |b: &[u8], d: &mut [MaybeUninit<f32>]| {
            for (o, c) in d.iter_mut().zip(b.chunks_exact(4)) {
                o.write(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
            }
        };
        #[cfg(all(target_arch = "x86_64", target_endian = "little"))]
        if std::arch::is_x86_feature_detected!("avx512f") {
            let ((b0, b1, b2), (d0, d1, d2), lines) = lines_of(bytes, dst);
            plain(b0, d0);
            plain(b2, d2);
            // SAFETY: AVX-512F was just found; `d1` holds `lines` whole lines from a 64-byte
            // aligned address and `b1` as many bytes; each load reads 64 bytes of `b1` and
            // each store writes one line of `d1`. `streamed` fences the stores.
            #[allow(unsafe_code)]
            unsafe {
                stream_lines(b1.as_ptr(), d1.as_mut_ptr().cast::<f32>(), lines)
            };
            return;
        }
        plain(bytes, dst);
    }
}

/// The values of `dst` (and their bytes in `bytes`, 4 each) cut where `dst`'s whole 64-byte
/// lines begin and end: before them, the lines, after them; and how many lines.
#[allow(clippy::type_complexity)]
fn lines_of<'b, 'd>(
    bytes: &'b [u8],
    dst: &'d mut [MaybeUninit<f32>],
) -> (
    (&'b [u8], &'b [u8], &'b [u8]),
    (
        &'d mut [MaybeUninit<f32>],
        &'d mut [MaybeUninit<f32>],
        &'d mut [MaybeUninit<f32>],
    ),
    usize,
) {
    let n = dst.len().min(bytes.len() / 4);
    let head = ((dst.as_ptr() as usize).wrapping_neg() % 64 / 4).min(n);
    let lines = (n - head) / 16;
    let (d0, rest) = dst[..n].split_at_mut(head);
    let (d1, d2) = rest.split_at_mut(lines * 16);
    let (b0, rest) = bytes[..n * 4].split_at(head * 4);
    let (b1, b2) = rest.split_at(lines * 64);
    ((b0, b1, b2), (d0, d1, d2), lines)
}

/// `lines` lines of 16 f32 from `src` (any alignment, little-endian bytes) to `dst`
/// (64-byte aligned) by non-temporal stores.
///
/// # Safety
/// AVX-512F; `src` holds `64 * lines` readable bytes and `dst` `16 * lines` writable f32,
/// not overlapping; the caller fences the stores before the values are read.
#[cfg(all(target_arch = "x86_64", target_endian = "little"))]
#[target_feature(enable = "avx512f")]
#[allow(unsafe_code)]
unsafe fn stream_lines(src: *const u8, dst: *mut f32, lines: usize) {
    use std::arch::x86_64::*;
    for i in 0..lines {
        let v = _mm512_loadu_ps(src.add(i * 64).cast::<f32>());
        _mm512_stream_ps(dst.add(i * 16), v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer whose `at`-th value lies `lead` values past a 64-byte boundary.
    fn aligned(len: usize, lead: usize) -> (Vec<MaybeUninit<f32>>, usize) {
        let buf = vec![MaybeUninit::new(f32::NAN); len + 32];
        let at = (buf.as_ptr() as usize).wrapping_neg() % 64 / 4 + lead;
        (buf, at)
    }

    fn values(buf: &[MaybeUninit<f32>]) -> Vec<u32> {
        // SAFETY: every value of these test buffers was initialised.
        #[allow(unsafe_code)]
        buf.iter()
            .map(|v| unsafe { v.assume_init() }.to_bits())
            .collect()
    }

    #[test]
    fn streamed_copies_write_the_values_and_nothing_else() {
        let src: Vec<f32> = (0..90).map(|i| i as f32 * 0.5 - 7.0).collect();
        let le: Vec<u8> = src.iter().flat_map(|v| v.to_le_bytes()).collect();
        for n in [0, 1, 15, 16, 17, 31, 32, 33, 48, 70] {
            for lead in [0, 1, 5, 15] {
                for skew in [0, 1, 3] {
                    let bytes = &[vec![0u8; skew], le[..n * 4].to_vec()].concat()[skew..];
                    // The values at `at..at + n`, NaN around them.
                    let check = |got: &[MaybeUninit<f32>], at: usize, what: &str| {
                        let mut want = vec![f32::NAN.to_bits(); got.len()];
                        for (w, v) in want[at..at + n].iter_mut().zip(&src) {
                            *w = v.to_bits();
                        }
                        assert_eq!(values(got), want, "{what}: {n} values, {lead} past a line");
                    };
                    let (mut got, at) = aligned(n, lead);
                    streamed(|s| s.copy_le_into(bytes, &mut got[at..at + n]));
                    check(&got, at, "bytes");
                    let (mut got, at) = aligned(n, lead);
                    streamed(|s| s.copy_into(&src[..n], &mut got[at..at + n]));
                    check(&got, at, "f32");
                }
            }
        }
    }

    #[test]
    fn streamed_tiles_match_plain_ones() {
        let src: Vec<f32> = (0..40 * 40).map(|i| i as f32 - 100.0).collect();
        for (rows, cols) in [(16, 16), (16, 5), (3, 16), (7, 9), (1, 1)] {
            for stride in [16, 64, 17] {
                for lead in [0, 16, 3] {
                    let len = lead + (cols - 1) * stride + rows + 16;
                    // Each buffer from its own 64-byte boundary.
                    let (mut plain, pa) = aligned(len, 0);
                    let (mut got, ga) = aligned(len, 0);
                    let (plain, got) = (&mut plain[pa..pa + len], &mut got[ga..ga + len]);
                    super::super::tile::transpose_into(
                        &src, 41, 40, rows, cols, plain, lead, stride,
                    );
                    let lanes = Lanes::plain(rows);
                    streamed(|s| {
                        s.transpose_into((&src, 41, 40), rows, cols, (got, lead, stride), lanes)
                    });
                    assert_eq!(
                        values(got),
                        values(plain),
                        "{rows} x {cols}, stride {stride}"
                    );
                }
            }
        }
    }
}
