//! The one little-endian byte reader and writer every hand-written wire format of dmem uses.
//!
//! The record and log layouts of this crate are `#[repr(C)]` zerocopy types. Messages whose
//! shape varies (counts, optional fields, variable-length values) cannot be one struct, so
//! their codecs read and write field by field; this module is the only place those codecs
//! touch byte order, bounds and lengths. Every wire format above `dmem-layout` follows one
//! convention built on it:
//!
//! - `fn parse(bytes: &[u8]) -> Result<Self, TheirError>`: a [`ByteReader`] over the bytes,
//!   its [`BytesError`] mapped into the crate's own typed error, and
//!   [`ByteReader::finish`] at the end when the message must fill the input;
//! - `fn emit(&self) -> Vec<u8>` (or `-> [u8; N]` for a fixed-size message through a
//!   [`SliceWriter`]), or `fn emit_into(&self, out: &mut impl ByteSink)` where a caller
//!   appends the message to a buffer it owns.
//!
//! It is hand-written, a few dozen lines, because it must work in this crate's `no_std`
//! build without `alloc`, return a typed error instead of panicking on short input, and
//! name every byte order explicitly (always little endian, see the crate docs). The `bytes`
//! and `byteorder` crates would add a dependency to a `no_std` core for little gain: the
//! first panics on short reads (`Buf::get_u64_le`) and wants `alloc` for its buffers, the
//! second is `to_le_bytes`/`from_le_bytes`, which `core` already has.
//!
//! Reading never panics: every read checks the bytes left and says where the input ended
//! ([`BytesError::Truncated`]). A [`SliceWriter`] over a fixed buffer never writes past it:
//! a put that does not fit writes nothing, and [`SliceWriter::finish`] returns the first
//! overflow as [`BytesError::Full`]. With the `alloc` feature, `Vec<u8>` is a [`ByteSink`]
//! too, growing as needed, so the same emit code writes to either.
//!
//! # Example
//!
//! ```
//! use dmem_layout::bytes::{ByteReader, ByteSink, BytesError, SliceWriter};
//!
//! // A 12-byte message: kind u8 | pad u8 | node u16 | sequence u64.
//! fn emit_into(w: &mut impl ByteSink, node: u16, seq: u64) {
//!     w.put_u8(1);
//!     w.put_zeros(1);
//!     w.put_u16(node);
//!     w.put_u64(seq);
//! }
//!
//! let mut buf = [0u8; 12];
//! let mut w = SliceWriter::new(&mut buf);
//! emit_into(&mut w, 7, 99);
//! assert_eq!(w.finish(), Ok(12));
//!
//! let mut r = ByteReader::new(&buf);
//! assert_eq!(r.u8(), Ok(1));
//! assert_eq!(r.array::<1>(), Ok([0]));
//! assert_eq!(r.u16(), Ok(7));
//! assert_eq!(r.u64(), Ok(99));
//! assert_eq!(r.finish(), Ok(()));
//!
//! // A short input is an error that says where it ended, never a panic.
//! let mut r = ByteReader::new(&buf[..6]);
//! r.u32().unwrap();
//! assert_eq!(r.u64(), Err(BytesError::Truncated { at: 4, wanted: 8, left: 2 }));
//!
//! // The same emit code appends to a `Vec<u8>` (feature `alloc`, on with `std`).
//! let mut v = Vec::new();
//! emit_into(&mut v, 7, 99);
//! assert_eq!(v, buf);
//! ```

/// Why bytes could not be read or written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BytesError {
    /// The input ended inside a field.
    #[error("input ends at byte {at}: a field of {wanted} bytes has {left} left")]
    Truncated {
        /// Offset where the field starts.
        at: usize,
        /// Bytes the field needs.
        wanted: usize,
        /// Bytes the input had left.
        left: usize,
    },
    /// Bytes follow the end of the message.
    #[error("{extra} bytes follow the message that ends at byte {at}")]
    Trailing {
        /// Offset where the message ends.
        at: usize,
        /// Bytes after it.
        extra: usize,
    },
    /// A fixed output buffer has no room for a field.
    #[error("output full at byte {at}: a field of {wanted} bytes has room for {left}")]
    Full {
        /// Offset where the field would start.
        at: usize,
        /// Bytes the field needs.
        wanted: usize,
        /// Room left in the buffer.
        left: usize,
    },
}

impl BytesError {
    /// Bytes missing for the field that did not fit ([`Truncated`](Self::Truncated),
    /// [`Full`](Self::Full)); 0 for [`Trailing`](Self::Trailing).
    #[must_use]
    pub const fn missing(&self) -> usize {
        match *self {
            Self::Truncated { wanted, left, .. } | Self::Full { wanted, left, .. } => {
                wanted.saturating_sub(left)
            }
            Self::Trailing { .. } => 0,
        }
    }
}

/// A checked little-endian reader over borrowed bytes.
///
/// Every read either returns the next field and moves past it, or returns
/// [`BytesError::Truncated`] and moves nowhere.
#[derive(Debug, Clone)]
pub struct ByteReader<'a> {
    rest: &'a [u8],
    at: usize,
}

impl<'a> ByteReader<'a> {
    /// A reader at the start of `bytes`.
    #[must_use]
    pub const fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes, at: 0 }
    }

    /// Bytes read so far (the offset of the next field).
    #[must_use]
    pub const fn position(&self) -> usize {
        self.at
    }

    /// Bytes not read yet.
    #[must_use]
    pub const fn remaining(&self) -> usize {
        self.rest.len()
    }

    /// Whether every byte has been read.
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    const fn truncated(&self, wanted: usize) -> BytesError {
        BytesError::Truncated {
            at: self.at,
            wanted,
            left: self.rest.len(),
        }
    }

    /// The next `n` bytes.
    ///
    /// # Errors
    /// [`BytesError::Truncated`] if fewer are left.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], BytesError> {
        let (head, tail) = self.rest.split_at_checked(n).ok_or(self.truncated(n))?;
        self.rest = tail;
        self.at += n;
        Ok(head)
    }

    /// The next `N` bytes as an array.
    ///
    /// # Errors
    /// [`BytesError::Truncated`] if fewer are left.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], BytesError> {
        let (head, tail) = self
            .rest
            .split_first_chunk::<N>()
            .ok_or(self.truncated(N))?;
        self.rest = tail;
        self.at += N;
        Ok(*head)
    }

    /// The next byte.
    ///
    /// # Errors
    /// [`BytesError::Truncated`] at the end of the input.
    pub fn u8(&mut self) -> Result<u8, BytesError> {
        Ok(self.array::<1>()?[0])
    }

    /// The next little-endian `u16`.
    ///
    /// # Errors
    /// [`BytesError::Truncated`] if fewer than 2 bytes are left.
    pub fn u16(&mut self) -> Result<u16, BytesError> {
        self.array().map(u16::from_le_bytes)
    }

    /// The next little-endian `u32`.
    ///
    /// # Errors
    /// [`BytesError::Truncated`] if fewer than 4 bytes are left.
    pub fn u32(&mut self) -> Result<u32, BytesError> {
        self.array().map(u32::from_le_bytes)
    }

    /// The next little-endian `u64`.
    ///
    /// # Errors
    /// [`BytesError::Truncated`] if fewer than 8 bytes are left.
    pub fn u64(&mut self) -> Result<u64, BytesError> {
        self.array().map(u64::from_le_bytes)
    }

    /// The next little-endian two's-complement `i64`.
    ///
    /// # Errors
    /// [`BytesError::Truncated`] if fewer than 8 bytes are left.
    pub fn i64(&mut self) -> Result<i64, BytesError> {
        self.array().map(i64::from_le_bytes)
    }

    /// Every byte not read yet (the reader is then at the end).
    pub fn rest(&mut self) -> &'a [u8] {
        self.at += self.rest.len();
        core::mem::take(&mut self.rest)
    }

    /// Checks that the whole input was read.
    ///
    /// # Errors
    /// [`BytesError::Trailing`] if bytes are left.
    pub const fn finish(self) -> Result<(), BytesError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(BytesError::Trailing {
                at: self.at,
                extra: self.rest.len(),
            })
        }
    }
}

/// Where emit code writes: a [`SliceWriter`] over a fixed buffer, or (feature `alloc`) a
/// `Vec<u8>`. Every integer is written little-endian.
///
/// A put does not return an error so that the same emit code serves both sinks: a `Vec`
/// cannot overflow, and a [`SliceWriter`] records its first overflow for
/// [`SliceWriter::finish`].
pub trait ByteSink {
    /// Appends `bytes`.
    fn put_bytes(&mut self, bytes: &[u8]);

    /// Appends `n` zero bytes (padding, reserved fields).
    fn put_zeros(&mut self, n: usize) {
        const ZEROS: [u8; 16] = [0; 16];
        let mut left = n;
        while left > 0 {
            let k = left.min(ZEROS.len());
            self.put_bytes(&ZEROS[..k]);
            left -= k;
        }
    }

    /// Appends a byte.
    fn put_u8(&mut self, v: u8) {
        self.put_bytes(&[v]);
    }

    /// Appends a little-endian `u16`.
    fn put_u16(&mut self, v: u16) {
        self.put_bytes(&v.to_le_bytes());
    }

    /// Appends a little-endian `u32`.
    fn put_u32(&mut self, v: u32) {
        self.put_bytes(&v.to_le_bytes());
    }

    /// Appends a little-endian `u64`.
    fn put_u64(&mut self, v: u64) {
        self.put_bytes(&v.to_le_bytes());
    }

    /// Appends a little-endian two's-complement `i64`.
    fn put_i64(&mut self, v: i64) {
        self.put_bytes(&v.to_le_bytes());
    }
}

/// A checked writer into a fixed buffer.
///
/// A put that does not fit writes nothing (nor does any later put) and is remembered;
/// [`finish`](Self::finish) returns it. [`try_put_bytes`](Self::try_put_bytes) is the same
/// put with its error returned at once.
#[derive(Debug)]
pub struct SliceWriter<'a> {
    buf: &'a mut [u8],
    at: usize,
    overflow: Option<BytesError>,
}

impl<'a> SliceWriter<'a> {
    /// A writer at the start of `buf`.
    #[must_use]
    pub const fn new(buf: &'a mut [u8]) -> Self {
        Self {
            buf,
            at: 0,
            overflow: None,
        }
    }

    /// Bytes written so far.
    #[must_use]
    pub const fn position(&self) -> usize {
        self.at
    }

    /// Appends `bytes` if they fit.
    ///
    /// # Errors
    /// [`BytesError::Full`] if they do not (nothing is written), or if an earlier put did
    /// not fit.
    pub fn try_put_bytes(&mut self, bytes: &[u8]) -> Result<(), BytesError> {
        if let Some(e) = self.overflow {
            return Err(e);
        }
        let room = self.buf.len() - self.at;
        let Some(dst) = self.buf.get_mut(self.at..self.at + bytes.len()) else {
            let e = BytesError::Full {
                at: self.at,
                wanted: bytes.len(),
                left: room,
            };
            self.overflow = Some(e);
            return Err(e);
        };
        dst.copy_from_slice(bytes);
        self.at += bytes.len();
        Ok(())
    }

    /// The number of bytes written.
    ///
    /// # Errors
    /// [`BytesError::Full`]: the first put that did not fit.
    pub const fn finish(self) -> Result<usize, BytesError> {
        match self.overflow {
            Some(e) => Err(e),
            None => Ok(self.at),
        }
    }
}

impl ByteSink for SliceWriter<'_> {
    fn put_bytes(&mut self, bytes: &[u8]) {
        // The error is kept for `finish`.
        let _ = self.try_put_bytes(bytes);
    }
}

#[cfg(feature = "alloc")]
impl ByteSink for alloc::vec::Vec<u8> {
    fn put_bytes(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck_macros::quickcheck;

    /// One field of a test message.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Field {
        U8(u8),
        U16(u16),
        U32(u32),
        U64(u64),
        I64(i64),
    }

    fn field(tag: u8, v: u64) -> Field {
        match tag % 5 {
            0 => Field::U8(v as u8),
            1 => Field::U16(v as u16),
            2 => Field::U32(v as u32),
            3 => Field::U64(v),
            _ => Field::I64(v as i64),
        }
    }

    fn put(w: &mut impl ByteSink, f: Field) {
        match f {
            Field::U8(v) => w.put_u8(v),
            Field::U16(v) => w.put_u16(v),
            Field::U32(v) => w.put_u32(v),
            Field::U64(v) => w.put_u64(v),
            Field::I64(v) => w.put_i64(v),
        }
    }

    fn get(r: &mut ByteReader<'_>, like: Field) -> Result<Field, BytesError> {
        Ok(match like {
            Field::U8(_) => Field::U8(r.u8()?),
            Field::U16(_) => Field::U16(r.u16()?),
            Field::U32(_) => Field::U32(r.u32()?),
            Field::U64(_) => Field::U64(r.u64()?),
            Field::I64(_) => Field::I64(r.i64()?),
        })
    }

    #[quickcheck]
    fn fields_round_trip_through_both_sinks(fields: Vec<(u8, u64)>, tail: Vec<u8>) -> bool {
        let fields: Vec<Field> = fields.into_iter().map(|(t, v)| field(t, v)).collect();
        let mut v = Vec::new();
        for &f in &fields {
            put(&mut v, f);
        }
        v.put_bytes(&tail);
        let mut buf = vec![0u8; v.len()];
        let mut w = SliceWriter::new(&mut buf);
        for &f in &fields {
            put(&mut w, f);
        }
        w.put_bytes(&tail);
        if w.finish() != Ok(v.len()) || buf != v {
            return false;
        }
        let mut r = ByteReader::new(&v);
        let same = fields.iter().all(|&f| get(&mut r, f) == Ok(f));
        same && r.bytes(tail.len()) == Ok(&tail[..]) && r.finish() == Ok(())
    }

    #[quickcheck]
    fn any_truncation_is_an_error_never_a_panic(fields: Vec<(u8, u64)>, cut: usize) -> bool {
        let fields: Vec<Field> = fields.into_iter().map(|(t, v)| field(t, v)).collect();
        let mut v = Vec::new();
        for &f in &fields {
            put(&mut v, f);
        }
        if v.is_empty() {
            return true;
        }
        let cut = cut % v.len();
        let mut r = ByteReader::new(&v[..cut]);
        let read: Result<Vec<Field>, BytesError> = fields.iter().map(|&f| get(&mut r, f)).collect();
        matches!(read, Err(BytesError::Truncated { .. }))
    }

    #[test]
    fn little_endian_on_both_sides() {
        let mut v = Vec::new();
        v.put_u16(0x0102);
        v.put_u32(0x0304_0506);
        v.put_u64(0x0708_090a_0b0c_0d0e);
        v.put_i64(-2);
        v.put_zeros(3);
        assert_eq!(
            v,
            [
                2, 1, 6, 5, 4, 3, 0xe, 0xd, 0xc, 0xb, 0xa, 9, 8, 7, 0xfe, 0xff, 0xff, 0xff, 0xff,
                0xff, 0xff, 0xff, 0, 0, 0
            ]
        );
        let mut r = ByteReader::new(&v);
        assert_eq!(r.u16(), Ok(0x0102));
        assert_eq!(r.u32(), Ok(0x0304_0506));
        assert_eq!(r.u64(), Ok(0x0708_090a_0b0c_0d0e));
        assert_eq!(r.i64(), Ok(-2));
        assert_eq!(r.position(), 22);
        assert_eq!(r.remaining(), 3);
        assert_eq!(r.rest(), &[0, 0, 0]);
        assert!(r.is_empty());
        assert_eq!(r.finish(), Ok(()));
    }

    #[test]
    fn short_reads_and_trailing_bytes_are_typed_errors() {
        let b = [1u8, 2, 3];
        let mut r = ByteReader::new(&b);
        assert_eq!(
            r.u32(),
            Err(BytesError::Truncated {
                at: 0,
                wanted: 4,
                left: 3
            })
        );
        // A failed read moves nowhere.
        assert_eq!(r.u16(), Ok(0x0201));
        assert_eq!(
            r.bytes(2),
            Err(BytesError::Truncated {
                at: 2,
                wanted: 2,
                left: 1
            })
        );
        assert_eq!(
            r.clone().bytes(usize::MAX).unwrap_err().missing(),
            usize::MAX - 1
        );
        assert_eq!(
            r.clone().finish(),
            Err(BytesError::Trailing { at: 2, extra: 1 })
        );
        assert_eq!(r.array::<1>(), Ok([3]));
        assert_eq!(
            r.u8(),
            Err(BytesError::Truncated {
                at: 3,
                wanted: 1,
                left: 0
            })
        );
        assert_eq!(r.rest(), &[] as &[u8]);
    }

    #[test]
    fn a_slice_writer_never_writes_past_its_buffer() {
        let mut buf = [0xaau8; 6];
        let mut w = SliceWriter::new(&mut buf);
        w.put_u32(0x0403_0201);
        assert_eq!(w.position(), 4);
        assert_eq!(
            w.try_put_bytes(&[9; 3]),
            Err(BytesError::Full {
                at: 4,
                wanted: 3,
                left: 2
            })
        );
        // Later puts write nothing, even ones that would fit.
        w.put_u8(7);
        assert_eq!(
            w.finish(),
            Err(BytesError::Full {
                at: 4,
                wanted: 3,
                left: 2
            })
        );
        assert_eq!(buf, [1, 2, 3, 4, 0xaa, 0xaa]);
        let mut w = SliceWriter::new(&mut buf);
        w.put_zeros(6);
        assert_eq!(w.finish(), Ok(6));
        assert_eq!(buf, [0; 6]);
    }
}
