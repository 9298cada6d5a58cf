//! Shared test code. Here: crafting hostile inputs in Rust — a pickle writer (raw opcodes,
//! exactly what a hostile file would hold), a torch-zip / legacy / tar container writer, and
//! a zip patcher that makes an archive lie about its record sizes. In [`fixtures`]: comparing
//! a checkpoint with what the peer library loaded from a fixture; in [`sweep`]: the hostile
//! sweeps (crafted-file manifest, truncations, mutations); in [`targets`]: what each fuzz
//! target does.
#![allow(dead_code)]

pub mod fixtures;
pub mod sweep;
pub mod targets;

use std::io::{Cursor, Write};

use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

/// A pickle under construction, one opcode at a time.
#[derive(Clone, Default)]
pub struct P(pub Vec<u8>);

impl P {
    /// PROTO 2.
    pub fn new() -> P {
        P(vec![0x80, 0x02])
    }
    pub fn op(mut self, bytes: &[u8]) -> P {
        self.0.extend_from_slice(bytes);
        self
    }
    /// BINUNICODE.
    pub fn str(mut self, s: &str) -> P {
        self.0.push(b'X');
        self.0.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    /// BININT for i32 values, LONG1 otherwise.
    pub fn int(mut self, v: i128) -> P {
        if let Ok(small) = i32::try_from(v) {
            self.0.push(b'J');
            self.0.extend_from_slice(&small.to_le_bytes());
        } else {
            let mut bytes = v.to_le_bytes().to_vec();
            while bytes.len() > 1 {
                let last = bytes[bytes.len() - 1];
                let prev_sign = bytes[bytes.len() - 2] & 0x80;
                if (last == 0 && prev_sign == 0) || (last == 0xff && prev_sign != 0) {
                    bytes.pop();
                } else {
                    break;
                }
            }
            self.0.push(0x8a);
            self.0.push(bytes.len() as u8);
            self.0.extend_from_slice(&bytes);
        }
        self
    }
    /// GLOBAL.
    pub fn global(mut self, module: &str, name: &str) -> P {
        self.0.push(b'c');
        self.0
            .extend_from_slice(format!("{module}\n{name}\n").as_bytes());
        self
    }
    pub fn mark(self) -> P {
        self.op(b"(")
    }
    pub fn tuple(self) -> P {
        self.op(b"t")
    }
    pub fn reduce(self) -> P {
        self.op(b"R")
    }
    pub fn stop(self) -> Vec<u8> {
        self.op(b".").0
    }
    /// `(v0, v1, …)` of ints.
    pub fn ints(self, vs: &[i128]) -> P {
        let mut p = self.mark();
        for &v in vs {
            p = p.int(v);
        }
        p.tuple()
    }
    /// A zip-format storage persistent id: `('storage', torch.<class>, key, 'cpu', numel)`.
    pub fn zip_storage(self, class: &str, key: &str, numel: i128) -> P {
        self.mark()
            .str("storage")
            .global("torch", class)
            .str(key)
            .str("cpu")
            .int(numel)
            .tuple()
            .op(b"Q")
    }
    /// `torch._utils._rebuild_tensor_v2(<storage>, offset, size, stride, False, OrderedDict())`
    /// over a zip storage.
    pub fn tensor_v2(
        self,
        class: &str,
        key: &str,
        numel: i128,
        offset: i128,
        size: &[i128],
        stride: &[i128],
    ) -> P {
        self.global("torch._utils", "_rebuild_tensor_v2")
            .mark()
            .zip_storage(class, key, numel)
            .int(offset)
            .ints(size)
            .ints(stride)
            .op(b"\x89")
            .global("collections", "OrderedDict")
            .op(b")")
            .reduce()
            .tuple()
            .reduce()
    }
}

/// `{name: tensor}` where the tensor is `tensor_v2(...)`, as a whole pickle.
pub fn one_tensor_pickle(
    name: &str,
    class: &str,
    numel: i128,
    offset: i128,
    size: &[i128],
    stride: &[i128],
) -> Vec<u8> {
    P::new()
        .op(b"}")
        .str(name)
        .tensor_v2(class, "0", numel, offset, size, stride)
        .op(b"s")
        .stop()
}

/// A zip archive of `(name, bytes, deflated)` records.
pub fn zip(records: &[(&str, &[u8], bool)]) -> Vec<u8> {
    let mut w = ZipWriter::new(Cursor::new(Vec::new()));
    for (name, data, deflate) in records {
        let method = if *deflate {
            CompressionMethod::Deflated
        } else {
            CompressionMethod::Stored
        };
        let opts = SimpleFileOptions::default()
            .compression_method(method)
            .large_file(data.len() > u32::MAX as usize / 2);
        w.start_file(*name, opts).unwrap();
        w.write_all(data).unwrap();
    }
    w.finish().unwrap().into_inner()
}

/// A torch zip: `archive/data.pkl` plus `archive/data/<key>` storages, all stored.
pub fn torch_zip(pkl: &[u8], storages: &[(&str, &[u8])]) -> Vec<u8> {
    let names: Vec<String> = storages
        .iter()
        .map(|(k, _)| format!("archive/data/{k}"))
        .collect();
    let mut recs: Vec<(&str, &[u8], bool)> = vec![("archive/data.pkl", pkl, false)];
    for (n, (_, d)) in names.iter().zip(storages) {
        recs.push((n, d, false));
    }
    zip(&recs)
}

/// Rewrite the compressed and/or uncompressed size a zip declares for record `name`, in its
/// local header and its central directory entry: an archive that lies about its records.
pub fn patch_sizes(z: &mut [u8], name: &str, compressed: Option<u32>, uncompressed: Option<u32>) {
    let mut patched = 0;
    for i in 0..z.len().saturating_sub(46) {
        // (offset of the compressed size, of the name length, of the name)
        let (comp, name_len, name_at) = match &z[i..i + 4] {
            b"PK\x03\x04" => (18, 26, 30),
            b"PK\x01\x02" => (20, 28, 46),
            _ => continue,
        };
        let n = u16::from_le_bytes([z[i + name_len], z[i + name_len + 1]]) as usize;
        if z.get(i + name_at..i + name_at + n) != Some(name.as_bytes()) {
            continue;
        }
        if let Some(c) = compressed {
            z[i + comp..i + comp + 4].copy_from_slice(&c.to_le_bytes());
        }
        if let Some(u) = uncompressed {
            z[i + comp + 4..i + comp + 8].copy_from_slice(&u.to_le_bytes());
        }
        patched += 1;
    }
    assert_eq!(patched, 2, "record {name} patched in both headers");
}

/// 16 float32 values 0..16, little-endian: the storage most crafted files use.
pub fn floats16() -> Vec<u8> {
    (0..16).flat_map(|v| (v as f32).to_le_bytes()).collect()
}

/// A legacy torch.save stream: magic, version, sys_info, `main`, the key list, then each
/// storage as (int64 numel, bytes).
pub fn legacy(main: &[u8], keys: &[&str], storages: &[(i64, &[u8])]) -> Vec<u8> {
    let mut out = P::new().int(0x1950a86a20f9469cfc6c).stop();
    out.extend(P::new().int(1001).stop());
    out.extend(
        P::new()
            .op(b"}")
            .str("little_endian")
            .op(b"\x88")
            .op(b"s")
            .stop(),
    );
    out.extend_from_slice(main);
    let mut k = P::new().op(b"]").mark();
    for key in keys {
        k = k.str(key);
    }
    out.extend(k.op(b"e").stop());
    for (numel, data) in storages {
        out.extend_from_slice(&numel.to_le_bytes());
        out.extend_from_slice(data);
    }
    out
}

/// A legacy storage persistent id: `('storage', torch.<class>, root, 'cpu', numel, view)`,
/// `view` `None` or `(view_key, offset, size)`.
pub fn legacy_storage(
    p: P,
    class: &str,
    root: &str,
    numel: i128,
    view: Option<(&str, i128, i128)>,
) -> P {
    let p = p
        .mark()
        .str("storage")
        .global("torch", class)
        .str(root)
        .str("cpu")
        .int(numel);
    let p = match view {
        None => p.op(b"N"),
        Some((k, off, size)) => p.mark().str(k).int(off).int(size).tuple(),
    };
    p.tuple().op(b"Q")
}

/// A tar archive of regular members (ustar headers, 512-byte blocks).
pub fn tar(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in members {
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, *data).unwrap();
    }
    b.into_inner().unwrap()
}
