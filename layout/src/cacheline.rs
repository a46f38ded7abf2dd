//! Cacheline-versioned record images (LOTUS §7.1 "Cacheline Version Consistency", after
//! FaRM).
//!
//! A record that read-only transactions read without a lock is stored as an *image*: a
//! 1-byte cacheline version (CV) at its head and at every 64-byte boundary after it, with the
//! payload filling the other 63 bytes of each line.
//!
//! ```text
//!  byte 0      1 ........ 63 | 64     65 ....... 127 | 128    129 ...
//! +----+--------------------+----+--------------------+----+--------
//! | CV | payload[0..63]     | CV | payload[63..126]   | CV | payload[126..
//! +----+--------------------+----+--------------------+----+--------
//! ```
//!
//! The last line may be short: a payload of `n` bytes needs `ceil(n / 63)` lines (at least
//! one, so an empty payload still has its head CV) and its image is
//! [`image_len`]`(n) = n + lines` bytes, not rounded up to a whole line. A TPC-C record of
//! 672 bytes takes 11 lines and a 683-byte image.
//!
//! # Why this detects torn reads
//!
//! An RDMA WRITE lands at the responder one cache line at a time, in increasing address
//! order, and a line lands whole (the semantics every dmem fabric implements; see
//! ARCHITECTURE.md, "Fabrics"). A writer stamps every line of
//! the new image with the same CV, one more than the old one. A reader whose READ overlaps
//! the WRITE sees a prefix of new lines and a suffix of old ones, so it finds two different
//! CVs; [`check_versions`] reports that. Lines are counted from the start of the image,
//! so **an image must be placed at a 64-byte aligned address** in MN memory for its CVs to
//! sit on the responder's line boundaries; the allocator that places records guarantees
//! this. As in FaRM, a reader is fooled only if exactly a multiple of 256 writes complete
//! while one READ is in flight, which a lock-holding writer cannot do within one READ.
//!
//! The CVT cell that points at the image carries the same CV (see
//! [`crate::cvt::CvtCell::matches_record`]), so a reader also detects an image that is
//! consistent in itself but belongs to another version than the cell it came from.

use crate::{CACHE_LINE, LayoutError};

/// Payload bytes carried by one full line: the line minus its 1-byte CV (LOTUS §7.1).
pub const LINE_PAYLOAD: usize = CACHE_LINE - 1;

/// One cacheline version (CV): the 1-byte counter at the head of every line of a record
/// image and at both ends of a CVT cell (LOTUS §7.1). It wraps around on overflow.
pub type LineVersion = u8;

/// The CV a writer stamps after `current`: one more, wrapping from 255 to 0 (LOTUS §7.1:
/// "During updates, both the data and the corresponding cell's CVs are incremented").
#[inline]
pub const fn next_version(current: LineVersion) -> LineVersion {
    current.wrapping_add(1)
}

/// Number of cache lines (and so of CVs) in the image of a `payload_len`-byte payload:
/// `ceil(payload_len / 63)`, at least one.
#[inline]
pub const fn line_count(payload_len: usize) -> usize {
    if payload_len == 0 {
        1
    } else {
        payload_len.div_ceil(LINE_PAYLOAD)
    }
}

/// Length in bytes of the image of a `payload_len`-byte payload: the payload plus one CV
/// per line. `image_len(672) == 683` (a TPC-C record, 11 lines).
#[inline]
pub const fn image_len(payload_len: usize) -> usize {
    payload_len + line_count(payload_len)
}

/// Length of the payload an image of `image_len` bytes carries, or
/// [`LayoutError::InvalidField`] if no payload has an image of that length (an empty
/// image, or one whose last line holds only its CV, such as 65 bytes).
pub const fn payload_len(image_len: usize) -> Result<usize, LayoutError> {
    if image_len == 0 {
        return Err(LayoutError::TooShort { needed: 1, got: 0 });
    }
    let lines = image_len.div_ceil(CACHE_LINE);
    let payload = image_len - lines;
    // Only the head line may be a bare CV (empty payload); any other line must carry at
    // least one payload byte, which is exactly when the length maps back to itself.
    if self::image_len(payload) == image_len {
        Ok(payload)
    } else {
        Err(LayoutError::InvalidField {
            field: "cacheline image length",
        })
    }
}

/// Why a cacheline-versioned image could not be read as one consistent version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CachelineError {
    /// The image has a length no payload maps to, or the output buffer does not fit.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// The image was read while a writer was replacing it: line `line` carries CV `found`
    /// where the head line carries `head` (LOTUS §7.1; the reader aborts).
    #[error("torn image: line {line} has version {found}, head has {head}")]
    Torn {
        /// Index of the first line whose CV differs from the head's.
        line: usize,
        /// CV of line 0.
        head: LineVersion,
        /// CV found on `line`.
        found: LineVersion,
    },
}

/// Checks that `image` has a valid length and that every line carries the same CV, and
/// returns that CV. This is the reader's consistency test after a lock-free READ
/// (LOTUS §5.1 "Processing Read-Only Transactions", §7.1).
pub fn check_versions(image: &[u8]) -> Result<LineVersion, CachelineError> {
    payload_len(image.len())?;
    let mut lines = image.chunks(CACHE_LINE).enumerate();
    let head = match lines.next() {
        Some((_, line)) => line.first().copied(),
        None => None,
    };
    let Some(head) = head else {
        // Unreachable after the length check, but a parser never panics.
        return Err(LayoutError::TooShort { needed: 1, got: 0 }.into());
    };
    for (line, bytes) in lines {
        if let Some(&found) = bytes.first()
            && found != head
        {
            return Err(CachelineError::Torn { line, head, found });
        }
    }
    Ok(head)
}

/// Whether every line of `image` carries the same CV (and the length is valid).
#[inline]
pub fn is_consistent(image: &[u8]) -> bool {
    check_versions(image).is_ok()
}

/// Writes `payload` into `image` with every line stamped `version`; this is the byte image
/// a writer sends in one RDMA WRITE (LOTUS §7.1). `image` must be exactly
/// [`image_len`]`(payload.len())` bytes.
pub fn stamp(payload: &[u8], version: LineVersion, image: &mut [u8]) -> Result<(), LayoutError> {
    expect_image_len(payload.len(), image.len())?;
    let mut rest = payload;
    for line in image.chunks_mut(CACHE_LINE) {
        if let Some((cv, body)) = line.split_first_mut() {
            *cv = version;
            let (chunk, tail) = rest.split_at(body.len());
            body.copy_from_slice(chunk);
            rest = tail;
        }
    }
    Ok(())
}

/// Sets every CV of an image already holding its payload to `version`, for a writer that
/// updated the payload in place through [`payload_chunks_mut`].
pub fn restamp(image: &mut [u8], version: LineVersion) -> Result<(), LayoutError> {
    payload_len(image.len())?;
    for line in image.chunks_mut(CACHE_LINE) {
        if let Some(cv) = line.first_mut() {
            *cv = version;
        }
    }
    Ok(())
}

/// Copies the payload of `image` into `payload` (exactly [`payload_len`]`(image.len())`
/// bytes) and returns the head CV. It does not compare the line versions: call
/// [`check_versions`] (or use [`extract_consistent`]) to learn whether the copy is one
/// version.
pub fn extract(image: &[u8], payload: &mut [u8]) -> Result<LineVersion, LayoutError> {
    expect_image_len(payload.len(), image.len())?;
    let mut rest = payload;
    let mut head = None;
    for line in image.chunks(CACHE_LINE) {
        if let Some((&cv, body)) = line.split_first() {
            head.get_or_insert(cv);
            let (chunk, tail) = rest.split_at_mut(body.len());
            chunk.copy_from_slice(body);
            rest = tail;
        }
    }
    head.ok_or(LayoutError::TooShort { needed: 1, got: 0 })
}

/// Checks the line versions of `image` and, if they agree, copies its payload into
/// `payload` and returns the CV: the reader's whole path after a lock-free READ.
pub fn extract_consistent(image: &[u8], payload: &mut [u8]) -> Result<LineVersion, CachelineError> {
    let version = check_versions(image)?;
    extract(image, payload)?;
    Ok(version)
}

/// The payload pieces of an image, one per line, without copying (each is the line minus
/// its CV). Fails on an image length no payload maps to.
pub fn payload_chunks(image: &[u8]) -> Result<impl Iterator<Item = &[u8]>, LayoutError> {
    payload_len(image.len())?;
    Ok(image
        .chunks(CACHE_LINE)
        .map(|line| line.split_first().map_or(&[][..], |(_, body)| body)))
}

/// The payload pieces of an image, mutable, for a writer that updates fields in place and
/// then calls [`restamp`].
pub fn payload_chunks_mut(
    image: &mut [u8],
) -> Result<impl Iterator<Item = &mut [u8]>, LayoutError> {
    payload_len(image.len())?;
    Ok(image
        .chunks_mut(CACHE_LINE)
        .map(|line| line.split_first_mut().map_or(&mut [][..], |(_, body)| body)))
}

/// Offset in the image of payload byte `payload_offset`: the byte a writer targets to
/// update one field with a small RDMA WRITE.
#[inline]
pub const fn image_offset(payload_offset: usize) -> usize {
    payload_offset + payload_offset / LINE_PAYLOAD + 1
}

fn expect_image_len(payload_len: usize, got: usize) -> Result<(), LayoutError> {
    let needed = image_len(payload_len);
    if got < needed {
        Err(LayoutError::TooShort { needed, got })
    } else if got > needed {
        Err(LayoutError::TooLong { max: needed, got })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck_macros::quickcheck;

    /// TPC-C record size used by LOTUS and Motor (§8).
    const TPCC_RECORD: usize = 672;

    #[test]
    fn lengths_of_paper_sizes() {
        assert_eq!(image_len(0), 1);
        assert_eq!(image_len(1), 2);
        assert_eq!(image_len(63), 64);
        assert_eq!(image_len(64), 66);
        assert_eq!(image_len(40), 41); // KVS micro: 40-byte value
        assert_eq!(line_count(TPCC_RECORD), 11);
        assert_eq!(image_len(TPCC_RECORD), 683);
        assert_eq!(payload_len(683), Ok(TPCC_RECORD));
        assert_eq!(payload_len(64), Ok(63));
        assert_eq!(payload_len(1), Ok(0));
        assert!(payload_len(0).is_err());
        assert_eq!(
            payload_len(65),
            Err(LayoutError::InvalidField {
                field: "cacheline image length"
            })
        );
    }

    #[test]
    fn tpcc_record_round_trip_and_torn_write() {
        let payload: Vec<u8> = (0..TPCC_RECORD).map(|i| (i * 7) as u8).collect();
        let mut old = vec![0u8; image_len(TPCC_RECORD)];
        stamp(&payload, 4, &mut old).unwrap();
        assert_eq!(check_versions(&old), Ok(4));
        for line in 0..11 {
            assert_eq!(old[line * 64], 4);
        }

        // A writer replaces the image with version 5; the reader's READ saw the first three
        // lines new and the rest old (WRITE lands line by line in increasing addresses).
        let mut new = vec![0u8; old.len()];
        let payload2: Vec<u8> = payload.iter().map(|b| b ^ 0xff).collect();
        stamp(&payload2, next_version(4), &mut new).unwrap();
        let mut torn = old.clone();
        torn[..3 * 64].copy_from_slice(&new[..3 * 64]);
        assert_eq!(
            check_versions(&torn),
            Err(CachelineError::Torn {
                line: 3,
                head: 5,
                found: 4
            })
        );
        let mut out = vec![0u8; TPCC_RECORD];
        assert!(extract_consistent(&torn, &mut out).is_err());
        assert_eq!(extract_consistent(&new, &mut out), Ok(5));
        assert_eq!(out, payload2);
    }

    #[test]
    fn wrong_buffer_sizes_are_errors() {
        let mut image = [0u8; 10];
        assert_eq!(
            stamp(&[1, 2, 3], 0, &mut image),
            Err(LayoutError::TooLong { max: 4, got: 10 })
        );
        assert_eq!(
            stamp(&[0; 63], 0, &mut image),
            Err(LayoutError::TooShort {
                needed: 64,
                got: 10
            })
        );
        let mut out = [0u8; 2];
        assert!(extract(&image, &mut out).is_err());
        assert!(check_versions(&[0u8; 65]).is_err());
        assert!(check_versions(&[]).is_err());
    }

    #[test]
    fn version_wraps() {
        assert_eq!(next_version(255), 0);
        assert_eq!(next_version(0), 1);
    }

    #[test]
    fn in_place_update_through_chunks() {
        let payload = [9u8; 130];
        let mut image = vec![0u8; image_len(payload.len())];
        stamp(&payload, 1, &mut image).unwrap();
        // Update payload byte 100 in place and restamp.
        let off = image_offset(100);
        image[off] = 42;
        restamp(&mut image, 2).unwrap();
        let mut out = [0u8; 130];
        assert_eq!(extract_consistent(&image, &mut out), Ok(2));
        assert_eq!(out[100], 42);
        for chunk in payload_chunks_mut(&mut image).unwrap() {
            chunk.fill(3);
        }
        let total: usize = payload_chunks(&image).unwrap().map(<[u8]>::len).sum();
        assert_eq!(total, 130);
        extract(&image, &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 3));
    }

    #[quickcheck]
    fn stamp_extract_round_trip(payload: Vec<u8>, version: u8) -> bool {
        let mut image = vec![0u8; image_len(payload.len())];
        stamp(&payload, version, &mut image).unwrap();
        let mut out = vec![0u8; payload.len()];
        payload_len(image.len()) == Ok(payload.len())
            && extract_consistent(&image, &mut out) == Ok(version)
            && out == payload
    }

    #[quickcheck]
    fn image_offset_points_at_payload_byte(payload: Vec<u8>) -> bool {
        let mut image = vec![0u8; image_len(payload.len())];
        stamp(&payload, 7, &mut image).unwrap();
        payload
            .iter()
            .enumerate()
            .all(|(i, &b)| image[image_offset(i)] == b)
    }

    #[quickcheck]
    fn any_torn_prefix_is_detected(len: u16, cut: u16, version: u8) -> bool {
        let len = usize::from(len) % 2048;
        let image_len = image_len(len);
        let lines = line_count(len);
        let cut_line = usize::from(cut) % lines;
        let mut old = vec![0u8; image_len];
        let mut new = vec![0u8; image_len];
        let payload = vec![0xAB; len];
        stamp(&payload, version, &mut old).unwrap();
        stamp(&payload, next_version(version), &mut new).unwrap();
        // First `cut_line` lines from the new image, the rest old.
        let mut torn = old.clone();
        let split = (cut_line * CACHE_LINE).min(image_len);
        torn[..split].copy_from_slice(&new[..split]);
        is_consistent(&torn) == (cut_line == 0)
    }

    #[quickcheck]
    fn arbitrary_bytes_never_panic(bytes: Vec<u8>) -> bool {
        let _ = check_versions(&bytes);
        let mut out = vec![0u8; bytes.len()];
        let _ = extract(&bytes, &mut out);
        true
    }
}
