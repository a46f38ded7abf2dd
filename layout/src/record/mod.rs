//! One-sided records: the FORD/Pandora data item, the OOCC record and the memory-node (MN)
//! hash-index bucket.
//!
//! A coordinator on a compute node (CN) reaches these images only through one-sided RDMA
//! verbs, so each is laid out for the verbs that touch it:
//!
//! * [`DataItem`] (FORD as Pandora §2.3 describes it, with PILL's lock word from §3.1.2): the
//!   lock word and the version come first, so **one READ** of [`DataItemHeader::item_len`]
//!   bytes returns lock + version + value, and validation (Pandora §2.3 step 2) is one READ of
//!   the first [`DataItemHeader::VALIDATION_LEN`] bytes.
//! * [`OoccRecord`] (OOCC §IV–§V): the lock word sits at the **highest address**, so one RDMA
//!   WRITE of value + lock word installs the value and releases the lock ("one-op write
//!   unlock"), because a WRITE lands in increasing address order.
//! * [`IndexBucket`] (the MN hash index a CN reads in one READ): whole cache lines of
//!   16-byte `key → record address` slots behind a 16-byte header with the overflow pointer.
//!
//! # Value size: a run-time length over a byte view, not a const generic
//!
//! The value size of an item is a property of its table (TATP, SmallBank and TPC-C tables
//! each have their own), and dmem chooses the workload at run time (FORD and Motor fix the
//! workload at compile time, which makes switching workloads a rebuild). So the value length is
//! a header field and the record types are views over a byte buffer
//! ([`DataItem<T: AsRef<[u8]>>`](DataItem), [`OoccRecord<T>`](OoccRecord)) in smoltcp's wire
//! style: one compiled code path serves every table, and the fixed part of each record is a
//! `#[repr(C)]` zerocopy header whose size is pinned by `static_assertions`.
//!
//! # Alignment
//!
//! Every header here has alignment 1 (its integers are `zerocopy::little_endian` types), so a
//! view can be laid over any receive buffer. The 8-byte words that RDMA atomics touch (the
//! data-item lock, the OOCC lock word, the bucket insert lock) sit at offsets that are
//! multiples of 8 from the start of their record, and every record length is rounded up to a
//! multiple of 8 ([`DataItemHeader::item_len`], [`OoccRecordHeader::record_len`]); placing
//! records at 8-byte aligned MN addresses is the allocator's job.
//!
//! # The contract of the views
//!
//! `new_checked` validates length and every field with undefined bit patterns and returns a
//! [`LayoutError`], never panicking. **Once `new_checked` has accepted a buffer, no accessor
//! of the view panics.** `new_unchecked` is for bytes this node wrote itself; an accessor on
//! an unchecked view over a buffer that is too short panics, as in smoltcp.
//!
//! # Modules
//!
//! One module per paper's record, all re-exported here: `data_item` (FORD/Pandora data item,
//! its version word and flags), `oocc` (OOCC record and lock word), `bucket` (the MN hash
//! index bucket, FORD's hash buckets), `addr` (the packed remote address they all use).

mod addr;
mod bucket;
mod data_item;
mod oocc;

pub use addr::RemoteAddr;
pub use bucket::{
    BucketLookup, IndexBucket, IndexBucket1, IndexBucket4, IndexBucketHeader, IndexSlot,
    lookup_in_bucket,
};
pub use data_item::{DataItem, DataItemHeader, DataVersion, ItemFlags};
pub use oocc::{OoccLockState, OoccLockWord, OoccRecord, OoccRecordHeader};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::LayoutError;

/// Rounds `n` up to the next multiple of 8 (record strides keep 8-byte words aligned).
pub(crate) const fn pad8(n: usize) -> usize {
    (n + 7) & !7
}

/// Returns `TooShort` unless `got >= needed`.
pub(crate) const fn need(needed: usize, got: usize) -> Result<(), LayoutError> {
    if got < needed {
        Err(LayoutError::TooShort { needed, got })
    } else {
        Ok(())
    }
}

/// Overlays the fixed-size header `H` on the front of `buf`.
///
/// Views call this only after `new_checked` proved `buf` long enough; an unchecked view over
/// a short buffer reaches the panic, which is the documented `new_unchecked` contract.
pub(crate) fn header_of<H: FromBytes + KnownLayout + Immutable>(buf: &[u8]) -> &H {
    match H::ref_from_prefix(buf) {
        Ok((header, _)) => header,
        Err(_) => {
            panic!("layout view built with new_unchecked over a buffer shorter than its header")
        }
    }
}

/// Mutable counterpart of [`header_of`], with the same contract.
pub(crate) fn header_of_mut<H: FromBytes + IntoBytes + KnownLayout>(buf: &mut [u8]) -> &mut H {
    match H::mut_from_prefix(buf) {
        Ok((header, _)) => header,
        Err(_) => {
            panic!("layout view built with new_unchecked over a buffer shorter than its header")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck::TestResult;
    use quickcheck_macros::quickcheck;

    #[quickcheck]
    fn qc_any_bytes_parse_or_error(bytes: Vec<u8>) -> TestResult {
        // Checked constructors never panic, and accepted views never panic either.
        if let Ok(item) = DataItem::new_checked(&bytes[..]) {
            let _ = (
                item.value().len(),
                item.is_readable(),
                item.version(),
                item.writer(),
            );
        }
        if let Ok(rec) = OoccRecord::new_checked(&bytes[..]) {
            let _ = (rec.value().len(), rec.lock_state());
        }
        let _ = lookup_in_bucket::<3>(&bytes, 0);
        TestResult::passed()
    }
}
