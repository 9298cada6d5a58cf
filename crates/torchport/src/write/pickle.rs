//! A small protocol-2 pickle emitter: just the opcodes the `.pt` writer needs (ints, str,
//! bool, tuples, globals with memoization, persistent ids, REDUCE, dict items). Opcode names
//! are `pickletools`'.

use std::collections::HashMap;

const PROTO: u8 = 0x80;
const STOP: u8 = b'.';
const MARK: u8 = b'(';
const GLOBAL: u8 = b'c';
const BINPUT: u8 = b'q';
const LONG_BINPUT: u8 = b'r';
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';
const BININT: u8 = b'J';
const BINFLOAT: u8 = b'G';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const LONG1: u8 = 0x8a;
const BINUNICODE: u8 = b'X';
const EMPTY_TUPLE: u8 = b')';
const TUPLE: u8 = b't';
const TUPLE1: u8 = 0x85;
const TUPLE2: u8 = 0x86;
const TUPLE3: u8 = 0x87;
const NEWFALSE: u8 = 0x89;
const BINPERSID: u8 = b'Q';
const REDUCE: u8 = b'R';
const SETITEMS: u8 = b'u';

/// Items per SETITEMS batch (as Python's pickler batches them).
pub(crate) const BATCH: usize = 1000;

/// A pickle being written.
pub(crate) struct Emitter {
    out: Vec<u8>,
    memo: HashMap<(String, String), u32>,
}

impl Emitter {
    /// Start a protocol-2 pickle.
    pub(crate) fn new() -> Emitter {
        Emitter {
            out: vec![PROTO, 2],
            memo: HashMap::new(),
        }
    }

    /// End the pickle and return its bytes.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        self.out.push(STOP);
        self.out
    }

    fn put(&mut self) -> u32 {
        let index = self.memo.len() as u32;
        match u8::try_from(index) {
            Ok(i) => self.out.extend_from_slice(&[BINPUT, i]),
            Err(_) => {
                self.out.push(LONG_BINPUT);
                self.out.extend_from_slice(&index.to_le_bytes());
            }
        }
        index
    }

    /// Push the global `module.name` (memoized: later uses are a BINGET).
    pub(crate) fn global(&mut self, module: &str, name: &str) {
        let key = (module.to_string(), name.to_string());
        if let Some(&i) = self.memo.get(&key) {
            match u8::try_from(i) {
                Ok(b) => self.out.extend_from_slice(&[BINGET, b]),
                Err(_) => {
                    self.out.push(LONG_BINGET);
                    self.out.extend_from_slice(&i.to_le_bytes());
                }
            }
            return;
        }
        self.out.push(GLOBAL);
        self.out.extend_from_slice(module.as_bytes());
        self.out.push(b'\n');
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(b'\n');
        let i = self.put();
        self.memo.insert(key, i);
    }

    /// Push a non-negative integer in the shortest encoding.
    pub(crate) fn int(&mut self, v: u64) {
        if let Ok(b) = u8::try_from(v) {
            self.out.extend_from_slice(&[BININT1, b]);
        } else if let Ok(w) = u16::try_from(v) {
            self.out.push(BININT2);
            self.out.extend_from_slice(&w.to_le_bytes());
        } else if v < 1 << 31 {
            self.out.push(BININT);
            self.out.extend_from_slice(&(v as u32).to_le_bytes());
        } else {
            // LONG1: little-endian two's complement, with a zero byte when the top bit is set.
            let mut bytes = v.to_le_bytes().to_vec();
            while bytes.len() > 1 && bytes[bytes.len() - 1] == 0 && bytes[bytes.len() - 2] < 0x80 {
                bytes.pop();
            }
            if bytes[bytes.len() - 1] >= 0x80 {
                bytes.push(0);
            }
            self.out.extend_from_slice(&[LONG1, bytes.len() as u8]);
            self.out.extend_from_slice(&bytes);
        }
    }

    /// Push a signed integer in the shortest encoding.
    pub(crate) fn int_signed(&mut self, v: i64) {
        if v >= 0 {
            self.int(v as u64);
        } else if let Ok(w) = i32::try_from(v) {
            self.out.push(BININT);
            self.out.extend_from_slice(&w.to_le_bytes());
        } else {
            // LONG1: eight bytes of two's complement are always enough for an i64.
            self.out.extend_from_slice(&[LONG1, 8]);
            self.out.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// Push a float (BINFLOAT: big-endian IEEE double).
    pub(crate) fn float(&mut self, v: f64) {
        self.out.push(BINFLOAT);
        self.out.extend_from_slice(&v.to_be_bytes());
    }

    /// Push a string.
    pub(crate) fn str(&mut self, s: &str) {
        self.out.push(BINUNICODE);
        self.out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.out.extend_from_slice(s.as_bytes());
    }

    /// Push `False`.
    pub(crate) fn false_(&mut self) {
        self.out.push(NEWFALSE);
    }

    /// Push a MARK (start of a tuple or of dict items).
    pub(crate) fn mark(&mut self) {
        self.out.push(MARK);
    }

    /// Build a tuple of everything since the last MARK.
    pub(crate) fn tuple_from_mark(&mut self) {
        self.out.push(TUPLE);
    }

    /// Push a tuple of non-negative integers.
    pub(crate) fn int_tuple(&mut self, values: &[usize]) {
        match values.len() {
            0 => self.out.push(EMPTY_TUPLE),
            n @ 1..=3 => {
                for &v in values {
                    self.int(v as u64);
                }
                self.out.push([TUPLE1, TUPLE2, TUPLE3][n - 1]);
            }
            _ => {
                self.mark();
                for &v in values {
                    self.int(v as u64);
                }
                self.tuple_from_mark();
            }
        }
    }

    /// Push an empty tuple.
    pub(crate) fn empty_tuple(&mut self) {
        self.out.push(EMPTY_TUPLE);
    }

    /// Replace the top of the stack by a persistent load of it.
    pub(crate) fn persistent_id(&mut self) {
        self.out.push(BINPERSID);
    }

    /// Call the callable below the top with the tuple on top.
    pub(crate) fn reduce(&mut self) {
        self.out.push(REDUCE);
    }

    /// Set the key/value pairs since the last MARK into the dict below it.
    pub(crate) fn setitems(&mut self) {
        self.out.push(SETITEMS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_and_globals() {
        let mut e = Emitter::new();
        e.mark();
        for v in [
            0u64,
            255,
            256,
            65535,
            65536,
            (1 << 31) - 1,
            1 << 31,
            u64::MAX,
        ] {
            e.int(v);
        }
        e.tuple_from_mark();
        e.global("collections", "OrderedDict");
        e.global("collections", "OrderedDict");
        e.int_signed(-5);
        e.int_signed(-(1 << 40));
        e.float(0.5);
        let p = e.finish();
        // pickle.dumps(-5, 2) = BININT fb ff ff ff; -(2**40) = LONG1 6 00.. 00 ff;
        // (we write LONG1 with 8 bytes, which Python reads as the same number);
        // pickle.dumps(0.5, 2) = BINFLOAT 3f e0 00 00 00 00 00 00.
        assert!(p.windows(5).any(|w| w == [BININT, 0xfb, 0xff, 0xff, 0xff]));
        assert!(p
            .windows(10)
            .any(|w| w == [LONG1, 8, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff]));
        assert!(p
            .windows(9)
            .any(|w| w == [BINFLOAT, 0x3f, 0xe0, 0, 0, 0, 0, 0, 0]));
        // The encodings CPython's pickle writes (pickle.dumps(v, protocol=2)).
        assert!(p.windows(2).any(|w| w == [BININT1, 255]));
        assert!(p.windows(3).any(|w| w == [BININT2, 0, 1]));
        assert!(p.windows(5).any(|w| w == [BININT, 0, 0, 1, 0]));
        // 2**31 -> LONG1 5 bytes 00 00 00 80 00; u64::MAX -> 9 bytes ff.. 00
        assert!(p.windows(7).any(|w| w == [LONG1, 5, 0, 0, 0, 0x80, 0]));
        assert!(p
            .windows(11)
            .any(|w| w == [LONG1, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0]));
        assert!(p.windows(2).any(|w| w == [BINGET, 0]));
    }
}
