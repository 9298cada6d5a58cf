//! Owns the byte cursor over the input: fixed-size reads, length-prefixed payloads and text
//! lines, each checked against the bytes that remain before anything is copied.

use crate::error::ErrorKind;

/// A cursor over borrowed pickle bytes.
pub(crate) struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Reader { data, pos: 0 }
    }

    /// Current offset.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes left after the cursor.
    pub(crate) fn remaining(&self) -> usize {
        self.data.len().saturating_sub(self.pos)
    }

    /// The next byte, or `None` at the end of the input.
    pub(crate) fn next_byte(&mut self) -> Option<u8> {
        let b = *self.data.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    /// The next `n` bytes; [`ErrorKind::UnexpectedEof`] if fewer remain.
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], ErrorKind> {
        let end = self.pos.checked_add(n).ok_or(ErrorKind::UnexpectedEof)?;
        let slice = self
            .data
            .get(self.pos..end)
            .ok_or(ErrorKind::UnexpectedEof)?;
        self.pos = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], ErrorKind> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, ErrorKind> {
        self.next_byte().ok_or(ErrorKind::UnexpectedEof)
    }

    pub(crate) fn u16_le(&mut self) -> Result<u16, ErrorKind> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub(crate) fn u32_le(&mut self) -> Result<u32, ErrorKind> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(crate) fn i32_le(&mut self) -> Result<i32, ErrorKind> {
        Ok(i32::from_le_bytes(self.array()?))
    }

    pub(crate) fn u64_le(&mut self) -> Result<u64, ErrorKind> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub(crate) fn f64_be(&mut self) -> Result<f64, ErrorKind> {
        Ok(f64::from_be_bytes(self.array()?))
    }

    /// The bytes up to the next `\n` (not included; the cursor moves past it).
    /// [`ErrorKind::UnexpectedEof`] if there is no newline.
    pub(crate) fn line(&mut self) -> Result<&'a [u8], ErrorKind> {
        let rest = self.data.get(self.pos..).ok_or(ErrorKind::UnexpectedEof)?;
        let len = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or(ErrorKind::UnexpectedEof)?;
        let line = rest.get(..len).ok_or(ErrorKind::UnexpectedEof)?;
        self.pos += len + 1;
        Ok(line)
    }
}
