//! The few ONNX protobuf messages the reader decodes, as hand-written `prost` structs holding
//! only the fields it uses (field numbers from `onnx/onnx.proto`; prost skips every other
//! field), and the cheap structural check behind [`looks_like`].
//!
//! Messages that the reader wants to locate in the file (each initializer, and `raw_data`)
//! are decoded as `bytes::Bytes`: decoding from a `Bytes` over the memory map makes them
//! zero-copy slices of it, whose file offsets the reader recovers.

use bytes::Bytes;

/// `onnx.ModelProto`: only the graph.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct ModelProto {
    /// Field 7: the main graph.
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
}

/// `onnx.GraphProto`: only its initializers, kept as undecoded message bytes.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct GraphProto {
    /// Field 5: `repeated TensorProto initializer`.
    #[prost(bytes = "bytes", repeated, tag = "5")]
    pub initializer: Vec<Bytes>,
    /// Field 15: `repeated SparseTensorProto sparse_initializer`.
    #[prost(bytes = "bytes", repeated, tag = "15")]
    pub sparse_initializer: Vec<Bytes>,
}

/// `onnx.TensorProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct TensorProto {
    /// Field 1: sizes, outermost first.
    #[prost(int64, repeated, tag = "1")]
    pub dims: Vec<i64>,
    /// Field 2: `TensorProto.DataType`.
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    /// Field 3: set when this is one segment of a larger tensor.
    #[prost(message, optional, tag = "3")]
    pub segment: Option<Segment>,
    /// Field 4: FLOAT and COMPLEX64 values.
    #[prost(float, repeated, tag = "4")]
    pub float_data: Vec<f32>,
    /// Field 5: INT32, and the bit patterns of the narrower integer, bool, float16, bfloat16
    /// and float8 types, one per entry.
    #[prost(int32, repeated, tag = "5")]
    pub int32_data: Vec<i32>,
    /// Field 7: INT64 values.
    #[prost(int64, repeated, tag = "7")]
    pub int64_data: Vec<i64>,
    /// Field 8: the name (bytes, so that invalid UTF-8 gets the reader's own message).
    #[prost(bytes = "bytes", tag = "8")]
    pub name: Bytes,
    /// Field 9: the elements as packed little-endian bytes.
    #[prost(bytes = "bytes", tag = "9")]
    pub raw_data: Bytes,
    /// Field 10: DOUBLE and COMPLEX128 values.
    #[prost(double, repeated, tag = "10")]
    pub double_data: Vec<f64>,
    /// Field 11: UINT32 and UINT64 values.
    #[prost(uint64, repeated, tag = "11")]
    pub uint64_data: Vec<u64>,
    /// Field 13: `location`, `offset`, `length`, … when the data is external.
    #[prost(message, repeated, tag = "13")]
    pub external_data: Vec<StringStringEntryProto>,
    /// Field 14: 0 DEFAULT, 1 EXTERNAL.
    #[prost(int32, tag = "14")]
    pub data_location: i32,
}

/// `onnx.TensorProto.Segment`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct Segment {
    /// Field 1: first element.
    #[prost(int64, tag = "1")]
    pub begin: i64,
    /// Field 2: one past the last element.
    #[prost(int64, tag = "2")]
    pub end: i64,
}

/// `onnx.StringStringEntryProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct StringStringEntryProto {
    /// Field 1.
    #[prost(string, tag = "1")]
    pub key: String,
    /// Field 2.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `onnx.SparseTensorProto`: enough to list it (its values' name and type, its dims).
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct SparseTensorProto {
    /// Field 1: the non-zero values (named after the sparse tensor).
    #[prost(message, optional, tag = "1")]
    pub values: Option<TensorProto>,
    /// Field 3: the dense shape.
    #[prost(int64, repeated, tag = "3")]
    pub dims: Vec<i64>,
}

/// Most top-level fields [`looks_like`] walks.
const DETECT_FIELDS: usize = 16;

/// Wire types `looks_like` accepts (`ModelProto` uses no fixed-width fields).
const VARINT: u8 = 0;
const LEN: u8 = 2;

/// The wire type each `ModelProto` field number is written with (`None`: not a field).
fn model_field_wire_type(field: u64) -> Option<u8> {
    match field {
        1 | 5 => Some(VARINT), // ir_version, model_version
        2 | 3 | 4 | 6 | 7 | 8 | 14 | 20 | 25 | 26 => Some(LEN), // strings and messages
        _ => None,
    }
}

/// The wire type of each `GraphProto` field number.
fn graph_field_wire_type(field: u64) -> Option<u8> {
    match field {
        1 | 2 | 5 | 10 | 11 | 12 | 13 | 14 | 15 | 16 => Some(LEN),
        _ => None,
    }
}

/// Read a varint at `*pos` (at most 10 bytes, no overflow past 64 bits).
pub(super) fn varint(bytes: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for i in 0..10 {
        let b = *bytes.get(*pos)?;
        *pos += 1;
        if i == 9 && b > 1 {
            return None;
        }
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// The cheap structural check `detect` uses (ONNX files have no magic number):
///
/// 1. the file starts with `ModelProto` field 1 (`ir_version`, tag byte `0x08`) holding a
///    value in 1..=100, or with field 7 (`graph`, tag byte `0x3a`) whose first inner tag is a
///    `GraphProto` field;
/// 2. walking at most 16 top-level fields, every tag is a `ModelProto` field written with the
///    wire type the schema gives it, and every varint is well formed. A length-delimited
///    field is skipped without being read; one that runs past the end of the file ends the
///    walk (a truncated model is still recognized, so that the reader can say what is
///    missing).
///
/// Nothing is allocated and at most a few hundred bytes are read. The other formats cannot
/// pass: zip (`PK`), pickle (`0x80`), npy (`0x93`), JSON (`{`) and tar headers (a file name)
/// fail rule 1, and a safetensors header length starting with `0x08` is followed by zero
/// bytes or `{`, which are never valid tags.
pub(crate) fn looks_like(bytes: &[u8]) -> bool {
    let mut pos = 0;
    match bytes.first() {
        Some(0x08) => {
            pos = 1;
            match varint(bytes, &mut pos) {
                Some(1..=100) => {}
                _ => return false,
            }
        }
        Some(0x3a) => {}
        _ => return false,
    }
    for _ in 0..DETECT_FIELDS {
        if pos == bytes.len() {
            return true;
        }
        let Some(tag) = varint(bytes, &mut pos) else {
            return false;
        };
        let (field, wire) = (tag >> 3, (tag & 7) as u8);
        if model_field_wire_type(field) != Some(wire) {
            return false;
        }
        match wire {
            VARINT => {
                if varint(bytes, &mut pos).is_none() {
                    return false;
                }
            }
            _ => {
                let Some(len) = varint(bytes, &mut pos) else {
                    return false;
                };
                if field == 7 && len > 0 && !graph_starts_well(bytes.get(pos..).unwrap_or(&[])) {
                    return false;
                }
                match usize::try_from(len).ok().and_then(|l| pos.checked_add(l)) {
                    Some(end) if end <= bytes.len() => pos = end,
                    // Runs past the end: a truncated model (the reader reports it).
                    _ => return true,
                }
            }
        }
    }
    true
}

/// True when `graph` (the bytes after a `graph` field's length) starts with a `GraphProto`
/// tag, or is cut before one.
fn graph_starts_well(graph: &[u8]) -> bool {
    let mut pos = 0;
    match varint(graph, &mut pos) {
        Some(tag) => graph_field_wire_type(tag >> 3) == Some((tag & 7) as u8),
        None => graph.len() < 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints() {
        let mut p = 0;
        assert_eq!(varint(&[0x96, 0x01], &mut p), Some(150));
        assert_eq!(p, 2);
        let max = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(varint(&max, &mut 0), Some(u64::MAX));
        let over = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        assert_eq!(varint(&over, &mut 0), None);
        assert_eq!(varint(&[0xff; 11], &mut 0), None);
        assert_eq!(varint(&[0x80], &mut 0), None);
    }

    #[test]
    fn detection() {
        // ir_version 8, producer_name "x", graph { name "g" }.
        let model = [0x08, 0x08, 0x12, 0x01, b'x', 0x3a, 0x03, 0x12, 0x01, b'g'];
        assert!(looks_like(&model));
        // Cut inside the graph: still ONNX (the reader says it is truncated).
        assert!(looks_like(&model[..8]));
        assert!(looks_like(&model[..2]));
        // ir_version 0 or absurd.
        assert!(!looks_like(&[0x08, 0x00]));
        assert!(!looks_like(&[0x08, 0xe8, 0x07]));
        // A bad tag after ir_version.
        assert!(!looks_like(&[0x08, 0x08, 0x00]));
        assert!(!looks_like(&[0x08, 0x08, 0x7b]));
        // graph whose content is not a GraphProto.
        assert!(!looks_like(&[0x3a, 0x02, 0x08, 0x01]));
        // A safetensors header length of 0x108 bytes.
        assert!(!looks_like(b"\x08\x01\x00\x00\x00\x00\x00\x00{\"a\":1}"));
        assert!(!looks_like(b"PK\x03\x04"));
        assert!(!looks_like(b"\x80\x02}q\x00."));
        assert!(!looks_like(b"\x93NUMPY"));
        assert!(!looks_like(b""));
    }
}
