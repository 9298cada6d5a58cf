//! Opening a `.pt2` archive for the runtime, through torchport's reader (`torchport::open`,
//! refusing any other format): its one serialized program (`Checkpoint::programs`, parsed into
//! the core's IR), the parameters and persistent buffers (`Checkpoint::tensors`) and the tensor
//! constants (`Checkpoint::constants`: lifted tensors, non-persistent buffers), converted to the
//! runtime's tensors for `Program::from_parts` (each copied once out of the memory map, in
//! parallel, releasing the map's pages as it goes). The conversion of contiguous little-endian
//! bytes to a runtime tensor ([`tensor_from_bytes`]) is also what `npy.rs` reads arrays with.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use torchport::{Checkpoint, Format, TensorData, TensorInfo};

use crate::error::{Error, Result};
use crate::fast::{HashMap as FastMap, HashSet as FastSet};
use crate::ops::packed::{Packing, Source};
use crate::schema::{self, ExportedProgram};

/// The program of the `.pt2` archive at `path`, and its weights and constants by state_dict
/// or constant name.
pub fn read(path: &Path) -> Result<(ExportedProgram, HashMap<String, Tensor>)> {
    let (ckpt, ep) = open(path)?;
    let none = FastSet::default();
    let (payloads, _, _) = decode(&ckpt, &none, &FastMap::default(), &none, |_| {
        FastMap::default()
    })?;
    Ok((ep, payloads.into_iter().collect()))
}

/// The opened archive and its program; the weights are decoded later by [`decode`], once
/// the caller knows the layout each should have.
pub(crate) fn open(path: &Path) -> Result<(Checkpoint, ExportedProgram)> {
    let ckpt = open_pt2(path)?;
    let ep = program(path, &ckpt)?;
    Ok((ckpt, ep))
}

/// Archives whose tensors hold at most this many bytes keep their pages mapped until the
/// archive is closed at the end of the read (one unmap), instead of releasing each tensor's
/// pages once it is copied: a release per tensor is a system call and, with several threads,
/// a TLB flush on each CPU the load runs on. Without them, MobileNetV3-Large's loads into
/// reused memory took 16–21% less time and EfficientNet-B0's 9–14%, their peak resident
/// memory 40 → 55 MB (BENCHMARKS.md, issue 14); keeping the pages raises the peak by no
/// more than this. ResNet-18's (48 MB) were level, so larger archives release as before.
const RELEASE_ABOVE: u64 = 32 << 20;

/// Maps the pages of a small archive's tensors into the process ahead of [`decode`]
/// (`Checkpoint::populate`), for a thread that has nothing else to do while the load plans:
/// the decode then reads them without faulting each in (EfficientNet-B0's decode phase
/// 2.82 → 2.59 ms and MobileNetV3-Large's 2.53 → 2.34, 2 threads; BENCHMARKS.md, issue 14).
/// Only where they hold at most [`RELEASE_ABOVE`] bytes, whose pages the decode keeps until
/// the end anyway: a larger archive's are released tensor by tensor, and mapping them all
/// first would raise the load's peak memory by the archive's size.
pub(crate) fn populate(ckpt: &Checkpoint) {
    if !releases_pages(ckpt) {
        // A hint: where the kernel refuses it, the decode faults the pages in as before.
        let _ = ckpt.populate();
    }
}

/// Whether [`decode`] releases each tensor's pages of `ckpt` once copied: where its tensors
/// and constants hold more than [`RELEASE_ABOVE`] bytes.
pub(crate) fn releases_pages(ckpt: &Checkpoint) -> bool {
    let infos = ckpt.tensors().iter().chain(ckpt.constants());
    let bytes = infos.map(|t| t.nbytes() as u64);
    bytes.fold(0u64, u64::saturating_add) > RELEASE_ABOVE
}

/// Every weight and constant of `ckpt` by state_dict or constant name, decoded in parallel,
/// each copied once out of the memory-mapped archive, whose pages are then released (so that
/// the load does not hold the archive and the decoded weights in memory at once) where its
/// tensors hold more than [`RELEASE_ABOVE`] bytes.
///
/// The float32 tensors share one buffer ([`crate::allocator::weight_space`]: each value
/// written once, by its tensor's decoding, or zero where it pads between two), each a view of
/// its own 64-byte-aligned stretch: one allocation advised as huge pages as a whole, where
/// one allocation per tensor left every tensor under 2 MiB (and the ends of larger ones) in
/// small pages, each faulted in and cleared on its own (BENCHMARKS.md, issue 14). A 2-d one
/// named in `transposed` is stored there as its contiguous transpose and handed back as the
/// transpose (`.t()`) of that: the same logical values, laid out as a matmul reading it
/// transposed wants them (see [`crate::prepare`]). Any other tensor (another dtype, or a
/// float32 view that overlaps itself, larger than its storage) is decoded on its own,
/// row-major; the build lays out such a weight for the matmul itself. A 2-d one named in
/// `packed` is stored as the microkernel's panels ([`crate::ops::packed::Packing`], on a CPU
/// that has them) and handed back as those values, 1-d.
///
/// The vectors (tensors of rank 0 or 1: biases, a norm's statistics) are decoded first;
/// `scales` is then shown the values of each float32 one by name and says which other
/// tensors to multiply, per slice along their first dimension, as they are written (a batch
/// norm's scale folded into the conv weight before it in the pass that decodes the weight,
/// instead of a pass of its own at build). While it decides, on one thread of the pool, the
/// tensors it cannot multiply are decoded on the others; then the rest, in one parallel
/// pass. Only a tensor of rank 2 or more decoded into the shared buffer (or on its own), not
/// transposed, and not packed unless a convolution's weight, is multiplied.
/// Returns the tensors, the names of those so multiplied, and those packed ([`DecodedWeights`]).
pub(crate) fn decode(
    ckpt: &Checkpoint,
    transposed: &FastSet<String>,
    packed: &FastMap<String, Source>,
    separate: &FastSet<String>,
    scales: impl FnOnce(&FastMap<&str, &[f32]>) -> FastMap<String, Vec<f64>> + Send,
) -> Result<DecodedWeights> {
    use rayon::prelude::*;
    let infos: Vec<&TensorInfo> = ckpt.tensors().iter().chain(ckpt.constants()).collect();
    let release = releases_pages(ckpt);
    let packing = crate::ops::packed::Packing::detect();
    // The tensors decoded packed: 2-d, named in `packed`, with a slot of the shared buffer.
    let packs: Vec<Option<(Packing, Source)>> = infos
        .iter()
        .map(|t| {
            let source = packed
                .get(&t.name)
                .filter(|s| s.features(&t.shape).is_some());
            Some((packing?, *source?))
        })
        .collect();
    let mut slots = shared_slots(ckpt, &infos, &packs, separate);
    // Packed only where the tensor has a slot of the shared buffer.
    let packs: Vec<Option<(Packing, Source)>> = packs
        .into_iter()
        .zip(&slots)
        .map(|(pack, slot)| pack.filter(|_| slot.is_some()))
        .collect();
    let total = slots.iter().flatten().map(|r| r.end).max().unwrap_or(0);
    let len = total + ALIGN;
    // Written once: each slot by its tensor's fill, the padding between them zeroed here
    // (no zeroing pass over the whole buffer first).
    let mut shared = crate::allocator::weight_space(len);
    let buf = &mut shared.spare_capacity_mut()[..len];
    // The slots are aligned from the buffer's start; shift them so that their addresses are.
    let lead = (buf.as_ptr() as usize).wrapping_neg() % 64 / 4;
    for r in slots.iter_mut().flatten() {
        *r = r.start + lead..r.end + lead;
    }
    let mut parts = split_at_slots(buf, &slots, |gap| gap.fill(MaybeUninit::new(0.0)));
    let mut own: Vec<Option<Tensor>> = vec![None; infos.len()];
    // Which pass decodes each tensor: the vectors; the tensors `scales` cannot multiply,
    // while it decides; those it can.
    let group: Vec<Group> = infos
        .iter()
        .zip(&slots)
        .zip(&packs)
        .map(|((t, slot), pack)| {
            // Only a tensor of rank 2 or more in the shared buffer (or decoded separately),
            // not transposed, and not packed unless a convolution's weight (its rows are its
            // output channels), is multiplied.
            let packed_conv = matches!(pack, Some((_, Source::Rows))) && t.shape.len() >= 3;
            match t.shape.len() {
                0 | 1 => Group::Vector,
                _ if (slot.is_some() || separate.contains(&t.name))
                    && (pack.is_none() || packed_conv)
                    && !transposed.contains(&t.name) =>
                {
                    Group::Scalable
                }
                _ => Group::Unscaled,
            }
        })
        .collect();
    // Decode one group, in parallel, each tensor into its slot or as its own tensor,
    // multiplied where `scales` says.
    let mut pass =
        |which: Group, parts: &mut [Option<&mut [Uninit]>], scales: &FastMap<String, Vec<f64>>| {
            infos
                .par_iter()
                .zip(parts.par_iter_mut())
                .zip(own.par_iter_mut())
                .zip(packs.par_iter())
                .zip(group.par_iter())
                .filter(|(_, g)| **g == which)
                .try_for_each(|((((t, part), own), pack), _)| {
                    let fill = match (scales.get(&t.name), pack) {
                        (scale, Some((pk, source))) => {
                            Fill::Packed(*pk, *source, scale.map(Vec::as_slice))
                        }
                        (Some(scale), _) => Fill::Scaled(scale),
                        _ if transposed.contains(&t.name) => Fill::Transposed,
                        _ => Fill::Plain,
                    };
                    match (part, fill) {
                        (Some(dst), fill) => fill_f32(ckpt, t, fill, dst)?,
                        // A float32 tensor decoded on its own (`separate`), scaled for its
                        // fold or as stored, into memory advised as the shared buffer is.
                        (None, fill @ (Fill::Scaled(_) | Fill::Plain))
                            if matches!(fill, Fill::Scaled(_))
                                || (t.dtype.name() == "float32" && t.quant.is_none()) =>
                        {
                            // SAFETY: `fill_f32` wrote every value when it returns `Ok`.
                            #[allow(unsafe_code)]
                            let v = unsafe {
                                crate::allocator::weight_written(t.numel(), |v| {
                                    fill_f32(ckpt, t, fill, v)
                                })?
                            };
                            let x = Tensor::from_vec(v, t.shape.as_slice(), &Device::Cpu);
                            *own = Some(x.map_err(|e| Error::Weight {
                                name: t.name.clone(),
                                what: crate::error::candle_message(&e),
                            })?);
                        }
                        (None, _) => *own = Some(tensor(ckpt, t)?),
                    }
                    if release {
                        ckpt.release(t);
                    }
                    Ok(())
                })
        };
    // The vectors' slots, taken out of `parts` so that their values can be read while the
    // other slots are written.
    let mut vectors: Vec<Option<&mut [Uninit]>> = parts
        .iter_mut()
        .zip(&group)
        .map(|(p, g)| p.take_if(|_| *g == Group::Vector))
        .collect();
    let none = FastMap::default();
    pass(Group::Vector, &mut vectors, &none)?;
    let first: FastMap<&str, &[f32]> = infos
        .iter()
        .zip(vectors.iter_mut())
        .filter_map(|(t, p)| {
            // SAFETY: the pass above wrote every vector's slot (`fill_f32`, which returned
            // `Ok` for each).
            #[allow(unsafe_code)]
            let values = unsafe { crate::ops::fused::assume_written(p.as_deref_mut()?) };
            Some((t.name.as_str(), &*values))
        })
        .collect();
    // `scales` runs on one thread; the tensors it cannot multiply (a network's Linear
    // weights, nearly half of MobileNetV3-Large's bytes) are decoded on the others meanwhile.
    let (mut scales, unscaled) = rayon::join(
        || scales(&first),
        || pass(Group::Unscaled, &mut parts, &none),
    );
    unscaled?;
    drop(first);
    let scalable: FastSet<&str> = infos
        .iter()
        .zip(&group)
        .filter(|(_, g)| **g == Group::Scalable)
        .map(|(t, _)| t.name.as_str())
        .collect();
    scales.retain(|name, _| scalable.contains(name.as_str()));
    pass(Group::Scalable, &mut parts, &scales)?;
    drop((parts, vectors));
    // SAFETY: the three passes returned `Ok`, so every slot was written (`fill_f32`), and
    // `split_at_slots` zeroed what lies between them: all `len` values.
    #[allow(unsafe_code)]
    unsafe {
        shared.set_len(len)
    };
    let shared = Tensor::from_vec(shared, len, &Device::Cpu)
        .map_err(|e| Error::Program(crate::error::candle_message(&e)))?;
    let was_packed: FastMap<String, (Source, (usize, usize))> = infos
        .iter()
        .zip(&packs)
        .filter_map(|(t, pack)| {
            let (_, source) = (*pack)?;
            Some((t.name.clone(), (source, source.features(&t.shape)?)))
        })
        .collect();
    let mut tensors = FastMap::with_capacity_and_hasher(infos.len(), Default::default());
    for ((t, slot), x) in infos.iter().zip(slots).zip(own) {
        let x =
            match (x, slot) {
                (Some(x), _) => x,
                (None, Some(r)) if was_packed.contains_key(&t.name) => shared
                    .narrow(0, r.start, r.len())
                    .map_err(|e| Error::Weight {
                        name: t.name.clone(),
                        what: crate::error::candle_message(&e),
                    })?,
                (None, Some(r)) => view(&shared, r, &t.shape, transposed.contains(&t.name))
                    .map_err(|e| Error::Weight {
                        name: t.name.clone(),
                        what: crate::error::candle_message(&e),
                    })?,
                (None, None) => unreachable!("a tensor without a slot is decoded on its own"),
            };
        tensors.insert(t.name.clone(), x);
    }
    Ok((tensors, scales.into_keys().collect(), was_packed))
}

/// The three passes of [`decode`], in order: vectors (rank 0 or 1), tensors that
/// `scales` cannot multiply, tensors it can.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Group {
    Vector,
    Unscaled,
    Scalable,
}

/// What [`decode`] returns: the tensors by name, the names of those multiplied for a fold,
/// and those packed, with the layout they were stored in and their `(n, k)` as stored.
pub(crate) type DecodedWeights = (
    FastMap<String, Tensor>,
    FastSet<String>,
    FastMap<String, (Source, (usize, usize))>,
);

/// The alignment of each tensor in the shared buffer of [`decode`], in f32 values (64 bytes:
/// a cache line, an AVX-512 register).
const ALIGN: usize = 64 / 4;

/// Where each tensor's values lie in the buffer the float32 tensors share, in values: a
/// stretch starting on a 64-byte boundary for each float32 tensor that views its storage
/// without overlap (its values fit inside the storage, so the buffer holds no more than the
/// values the tensors would each be decoded into, and up to 60 bytes of padding each), `None`
/// for any other tensor; a tensor with a packing in `packs` gets its packed length. The vectors (rank 0 or 1, decoded first by [`decode`]) come first,
/// together: decoded across the buffer, they would fault in and clear its pages long before
/// the large tensors are written there, out of cache by then.
fn shared_slots(
    ckpt: &Checkpoint,
    infos: &[&TensorInfo],
    packs: &[Option<(Packing, Source)>],
    separate: &FastSet<String>,
) -> Vec<Option<Range<usize>>> {
    let fits = |t: &TensorInfo| {
        !separate.contains(&t.name)
            && t.dtype.name() == "float32"
            && t.quant.is_none()
            && matches!(t.data, TensorData::Strided { .. })
            && ckpt.storage(t).is_some_and(|s| {
                t.shape
                    .iter()
                    .try_fold(4usize, |a, &d| a.checked_mul(d))
                    .is_some_and(|bytes| bytes <= s.len())
            })
    };
    let mut slots = vec![None; infos.len()];
    let mut next = 0usize;
    for vectors in [true, false] {
        for ((slot, t), pack) in slots.iter_mut().zip(infos).zip(packs) {
            if (t.shape.len() <= 1) == vectors && fits(t) {
                let len = match pack {
                    Some((pk, source)) => source.features(&t.shape).and_then(|(n, k)| pk.len(n, k)),
                    None => Some(t.numel()),
                };
                let Some(len) = len else { continue };
                let start = next.next_multiple_of(ALIGN);
                next = start + len;
                *slot = Some(start..next);
            }
        }
    }
    slots
}

/// `buf` cut at `slots` (disjoint, in any order) into one mutable part per slot; `gap` is
/// handed each stretch no slot covers, the end of `buf` after the last slot too.
fn split_at_slots<'a, T>(
    mut buf: &'a mut [T],
    slots: &[Option<Range<usize>>],
    mut gap: impl FnMut(&mut [T]),
) -> Vec<Option<&'a mut [T]>> {
    let mut order: Vec<usize> = (0..slots.len()).filter(|&i| slots[i].is_some()).collect();
    // By start, an empty slot before a slot starting where it does.
    order.sort_by_key(|&i| slots[i].as_ref().map(|r| (r.start, r.end)));
    let mut parts: Vec<Option<&'a mut [T]>> = (0..slots.len()).map(|_| None).collect();
    let mut at = 0;
    for i in order {
        let Some(r) = &slots[i] else { continue };
        let (before, rest) = std::mem::take(&mut buf).split_at_mut(r.start - at);
        gap(before);
        let (part, rest) = rest.split_at_mut(r.len());
        buf = rest;
        at = r.end;
        parts[i] = Some(part);
    }
    gap(buf);
    parts
}

/// A value of a buffer being written (see [`decode`]).
type Uninit = MaybeUninit<f32>;

/// How [`fill_f32`] writes a tensor's values into its slot.
#[derive(Clone, Copy)]
enum Fill<'a> {
    /// As stored, row-major.
    Plain,
    /// A 2-d tensor as its contiguous transpose (see [`decode`]).
    Transposed,
    /// Each slice along the first dimension multiplied by its entry (in f64, rounded to
    /// f32: [`crate::prepare::bn_scaled`], as the build's fold of a batch norm computes it),
    /// as it is written.
    Scaled(&'a [f64]),
    /// A tensor laid out as the [`Source`] says (a convolution's weight as its `[co, k]`
    /// rows), as the microkernel's panels ([`Packing`]); each row multiplied by its scale
    /// as [`Fill::Scaled`] does, if given.
    Packed(Packing, Source, Option<&'a [f64]>),
}

/// Decode the float32 tensor `t` into `dst` (its slot of the shared buffer, or a buffer of
/// its own) as `fill` says. Returns `Ok` only with every value of `dst` written.
fn fill_f32(ckpt: &Checkpoint, t: &TensorInfo, fill: Fill, dst: &mut [Uninit]) -> Result<()> {
    let bytes = ckpt.data(t).map_err(|e| Error::Weight {
        name: t.name.clone(),
        what: e.to_string(),
    })?;
    let scales_fit = match fill {
        Fill::Scaled(scale) | Fill::Packed(_, _, Some(scale)) => {
            t.shape.first() == Some(&scale.len())
        }
        _ => true,
    };
    let packed = match &fill {
        Fill::Packed(pk, source, _) => Some(
            source
                .features(&t.shape)
                .filter(|&(n, k)| pk.len(n, k) == Some(dst.len())),
        ),
        _ => None,
    };
    let values = match packed {
        Some(Some((n, k))) => n * k,
        Some(None) => usize::MAX,
        None => dst.len(),
    };
    if Some(bytes.len()) != values.checked_mul(4) || !scales_fit {
        return Err(Error::Weight {
            name: t.name.clone(),
            what: format!(
                "{} bytes do not hold a float32 tensor of shape {:?}{}",
                bytes.len(),
                t.shape,
                if scales_fit {
                    ""
                } else {
                    " with a scale per first index"
                }
            ),
        });
    }
    match (fill, &t.shape[..]) {
        (Fill::Transposed, &[n, k]) => crate::prepare::transpose_le_f32_into(&bytes, n, k, dst),
        (Fill::Packed(pk, source, scale), _) => {
            let (n, k) = packed.flatten().unwrap_or_default();
            if !pk.pack_le_into_uninit(&bytes, source, n, k, dst, scale) {
                return Err(Error::Weight {
                    name: t.name.clone(),
                    what: format!("could not pack a float32 tensor of shape {:?}", t.shape),
                });
            }
        }
        (Fill::Scaled(scale), _) => le_f32s_scaled_into(&bytes, scale, dst),
        _ => le_f32s_into(&bytes, dst),
    }
    Ok(())
}

/// Little-endian f32 bytes into `dst`, each of the `scale.len()` equal slices multiplied by
/// its scale, in one pass over each slice while it is in cache (a second pass over it, even
/// in cache, was ~5% of ResNet-18's load samples), in wide registers where the CPU has them.
/// Every value of `dst` is written: past the slices the scales cover (none where the
/// caller checked the sizes), zeros.
fn le_f32s_scaled_into(bytes: &[u8], scale: &[f64], dst: &mut [Uninit]) {
    use rayon::prelude::*;
    let per = dst.len() / scale.len().max(1);
    let covered = (per * scale.len()).min(bytes.len() / 4);
    let (dst, rest) = dst.split_at_mut(covered - covered % per.max(1));
    rest.fill(MaybeUninit::new(0.0));
    if per == 0 {
        return;
    }
    // Slices of a depthwise conv weight hold 9 or 25 values: hand a thread many at a time.
    dst.par_chunks_mut(per)
        .zip(bytes.par_chunks(per * 4))
        .zip(scale.par_iter())
        .with_min_len(((1 << 14) / per).max(1))
        .for_each(|((d, b), &s)| {
            crate::ops::fused::simd(
                #[inline(always)]
                || {
                    for (o, c) in d.iter_mut().zip(b.chunks_exact(4)) {
                        let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                        o.write(crate::prepare::bn_scaled(v, s));
                    }
                },
            )
        });
}

/// The tensor of shape `shape` held in `r` of `shared`; stored transposed (`[k, n]`, handed
/// back as its `.t()`) when `transpose` and 2-d, as [`fill_f32`] wrote it with
/// [`Fill::Transposed`].
fn view(
    shared: &Tensor,
    r: Range<usize>,
    shape: &[usize],
    transpose: bool,
) -> candle_core::Result<Tensor> {
    let part = shared.narrow(0, r.start, r.len())?;
    match shape {
        &[n, k] if transpose => part.reshape((k, n))?.t(),
        _ => part.reshape(shape),
    }
}

/// The program of the `.pt2` archive at `path`, without decoding its weights or constants.
pub fn read_program(path: &Path) -> Result<ExportedProgram> {
    program(path, &open_pt2(path)?)
}

/// Open `path` with torchport's reader, refusing anything but a `.pt2` archive. Its program
/// is left unparsed (`torchport::open_pt2_unparsed`), for [`program`] to parse: a caller
/// with threads to spare maps the archive's pages in meanwhile ([`populate`]).
pub(crate) fn open_pt2(path: &Path) -> Result<Checkpoint> {
    // Read as a .pt2 archive without detecting the format first (detection parses a zip's
    // directory once more than the read does).
    let refused = match torchport::open_pt2_unparsed(path, &torchport::Limits::default()) {
        Ok(ckpt) => return Ok(ckpt),
        Err(e) => e,
    };
    // Refused. Where the file is a .pt2 archive by its content, that is the reader's error;
    // else read it as what it is, for the error that says so (or that format's reader's own
    // on a damaged file), as a load that detected the format first would have.
    if torchport::detect_file(path).is_ok_and(|f| f == Format::Pt2) {
        return Err(Error::Read(refused));
    }
    let ckpt = torchport::open(path).map_err(Error::Read)?;
    if ckpt.format() != Format::Pt2 {
        return Err(Error::Archive {
            path: path.to_path_buf(),
            what: format!(
                "not a .pt2 archive (it is a {} file); expected one written by torch.export.save",
                ckpt.format().name()
            ),
        });
    }
    Ok(ckpt)
}

/// The one program of an archive [`open_pt2`] opened, parsed into the core's IR.
pub(crate) fn program(path: &Path, ckpt: &Checkpoint) -> Result<ExportedProgram> {
    let programs: Vec<(&str, &[u8])> = ckpt.programs().collect();
    let [(record, json)] = programs[..] else {
        let records: Vec<&str> = programs.iter().map(|p| p.0).collect();
        return Err(Error::Archive {
            path: path.to_path_buf(),
            what: format!(
                "the archive holds {} programs ({}); the runtime runs archives holding one",
                programs.len(),
                records.join(", ")
            ),
        });
    };
    schema::parse_program(json).map_err(|e| Error::Schema {
        path: path.to_path_buf(),
        record: record.to_string(),
        what: e.to_string(),
    })
}

/// One tensor of the checkpoint as a runtime tensor of its own (not in [`decode`]'s shared
/// buffer), laid out row-major.
fn tensor(ckpt: &Checkpoint, t: &TensorInfo) -> Result<Tensor> {
    let werr = |what: String| Error::Weight {
        name: t.name.clone(),
        what,
    };
    let bytes = ckpt.data(t).map_err(|e| werr(e.to_string()))?;
    tensor_from_bytes(&bytes, t.dtype.name(), &t.shape).map_err(werr)
}

/// A runtime tensor from contiguous little-endian bytes of torch dtype `name`
/// (floats become f32, ints i64, bool u8).
pub fn tensor_from_bytes(
    bytes: &[u8],
    name: &str,
    shape: &[usize],
) -> std::result::Result<Tensor, String> {
    let dev = Device::Cpu;
    let unsupported = || format!("dtype {name} is not supported");
    let size = match name {
        "bool" | "uint8" | "int8" => 1,
        "int16" | "float16" | "bfloat16" => 2,
        "int32" | "float32" => 4,
        "int64" | "float64" => 8,
        _ => return Err(unsupported()),
    };
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .and_then(|n| n.checked_mul(size));
    if n != Some(bytes.len()) {
        return Err(format!(
            "{} bytes do not hold a {name} tensor of shape {shape:?}",
            bytes.len()
        ));
    }
    let e = |e: candle_core::Error| crate::error::candle_message(&e);
    let raw = |d: DType| Tensor::from_raw_buffer(bytes, d, shape, &dev).map_err(e);
    Ok(match name {
        "float32" => Tensor::from_vec(le_f32s(bytes), shape, &dev).map_err(e)?,
        "float16" => raw(DType::F16)?.to_dtype(DType::F32).map_err(e)?,
        "bfloat16" => raw(DType::BF16)?.to_dtype(DType::F32).map_err(e)?,
        "float64" => raw(DType::F64)?,
        "int64" => raw(DType::I64)?,
        "int32" => raw(DType::I32)?.to_dtype(DType::I64).map_err(e)?,
        "int16" => raw(DType::I16)?.to_dtype(DType::I64).map_err(e)?,
        "int8" => {
            let v: Vec<i64> = bytes.iter().map(|&b| i64::from(b as i8)).collect();
            Tensor::from_vec(v, shape, &dev).map_err(e)?
        }
        "uint8" => raw(DType::U8)?.to_dtype(DType::I64).map_err(e)?,
        "bool" => {
            let v: Vec<u8> = bytes.iter().map(|&b| u8::from(b != 0)).collect();
            Tensor::from_vec(v, shape, &dev).map_err(e)?
        }
        _ => return Err(unsupported()),
    })
}

/// Little-endian f32 bytes as f32 values, converted in parallel in 1 MiB stretches: one pass
/// over the bytes into a new buffer, each value written once
/// ([`crate::allocator::weight_written`]).
fn le_f32s(bytes: &[u8]) -> Vec<f32> {
    // SAFETY: `le_f32s_into` writes every value of `out`.
    #[allow(unsafe_code)]
    unsafe {
        crate::allocator::weight_filled(bytes.len() / 4, |out| le_f32s_into(bytes, out))
    }
}

/// [`le_f32s`] into `out` (`bytes.len() / 4` values, each written; any more are zeroed).
fn le_f32s_into(bytes: &[u8], out: &mut [Uninit]) {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 18;
    let (out, rest) = out.split_at_mut((bytes.len() / 4).min(out.len()));
    rest.fill(MaybeUninit::new(0.0));
    out.par_chunks_mut(CHUNK)
        .zip(bytes.par_chunks(CHUNK * 4))
        .for_each(|(d, s)| crate::ops::stream::streamed(|st| st.copy_le_into(s, d)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_cut_the_buffer_into_their_own_parts() {
        let mut buf: Vec<f32> = (0..40).map(|v| v as f32).collect();
        let slots = vec![
            Some(16..30),
            None,
            Some(3..7),
            Some(16..16),
            None,
            Some(32..33),
        ];
        let mut gaps = Vec::new();
        let parts = split_at_slots(&mut buf, &slots, |g| gaps.push(g.to_vec()));
        let got: Vec<Option<Vec<f32>>> = parts.into_iter().map(|p| p.map(|p| p.to_vec())).collect();
        let want: Vec<Option<Vec<f32>>> = slots
            .iter()
            .map(|s| s.clone().map(|r| r.map(|v| v as f32).collect()))
            .collect();
        assert_eq!(got, want);
        // What no slot covers, in order (the empty slot's place gives an empty gap).
        let span = |r: std::ops::Range<usize>| r.map(|v| v as f32).collect::<Vec<f32>>();
        let want = [span(0..3), span(7..16), vec![], span(30..32), span(33..40)];
        assert_eq!(gaps, want);
    }

    /// The shared buffer holds each float32 tensor's values as the archive stores them (read
    /// here straight from its bytes), transposed in memory where asked, each a view of the one
    /// buffer on a 64-byte boundary, the vectors before the rest; the other tensors are
    /// decoded on their own. On a
    /// transformers BERT written by torch.export (float32 weights and int64 buffers).
    #[test]
    fn the_shared_buffer_holds_each_tensor_as_decoded_alone() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/zoo/hf_bert_mask.plain.pt2");
        let (ckpt, _) = open(&path).unwrap();
        let infos: Vec<&TensorInfo> = ckpt.tensors().iter().chain(ckpt.constants()).collect();
        // Every 2-d float32 tensor decoded transposed, as Linear weights are.
        let transposed: FastSet<String> = infos
            .iter()
            .filter(|t| t.shape.len() == 2 && t.dtype.name() == "float32")
            .map(|t| t.name.clone())
            .collect();
        assert!(transposed.len() > 4);
        let none = FastSet::default();
        let (decoded, _, _) = decode(&ckpt, &transposed, &FastMap::default(), &none, |_| {
            FastMap::default()
        })
        .unwrap();
        assert_eq!(decoded.len(), infos.len());
        let mut storages = std::collections::HashSet::new();
        let mut others = 0;
        // Where the vectors' values end and the other tensors' begin, in the buffer.
        let (mut vectors_end, mut rest_start) = (0, usize::MAX);
        for t in &infos {
            let got = &decoded[&t.name];
            assert_eq!(got.dims(), t.shape.as_slice(), "{}", t.name);
            if got.dtype() != DType::F32 {
                others += 1;
                let flat = |x: &Tensor| x.flatten_all().unwrap().to_vec1::<i64>().unwrap();
                assert_eq!(flat(got), flat(&tensor(&ckpt, t).unwrap()), "{}", t.name);
                continue;
            }
            let bytes = ckpt.data(t).unwrap();
            let want = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]).to_bits());
            let got_values = got.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert!(
                got_values.iter().map(|v| v.to_bits()).eq(want),
                "{}",
                t.name
            );
            if transposed.contains(&t.name) {
                assert_eq!(
                    got.stride(),
                    [1, t.shape[0]],
                    "{} stored transposed",
                    t.name
                );
            } else {
                assert!(got.is_contiguous(), "{}", t.name);
            }
            crate::ops::fused::with_storage::<f32, _>(got, |all, layout| {
                storages.insert(all.as_ptr() as usize);
                let first = all[layout.start_offset()..].as_ptr() as usize;
                assert_eq!(first % 64, 0, "{} starts at {first:#x}", t.name);
                if t.shape.len() <= 1 {
                    vectors_end = vectors_end.max(layout.start_offset() + t.numel());
                } else {
                    rest_start = rest_start.min(layout.start_offset());
                }
            })
            .unwrap();
        }
        assert_eq!(storages.len(), 1, "the float32 tensors share one buffer");
        assert!(
            vectors_end > 0 && vectors_end <= rest_start,
            "the vectors come first"
        );
        assert!(others > 0, "the fixture also holds tensors of other dtypes");
    }
}
