//! The bytes of the MN-side formats every protocol on this store shares: index buckets
//! and their 16-byte slots, and FORD's record image ([`DataItem`]).

use dmem_layout::record::{
    DataItem, DataItemHeader, DataVersion, IndexBucket, IndexSlot, ItemFlags,
    RemoteAddr as PackedAddr,
};

#[cfg(doc)]
use crate::BucketLoc;

/// Slots per index bucket (a two-cache-line [`IndexBucket`]).
pub const BUCKET_SLOTS: usize = 7;
/// The index bucket type.
pub type Bucket = IndexBucket<BUCKET_SLOTS>;
/// Bytes of one index bucket.
pub const BUCKET_LEN: usize = Bucket::LEN;
/// Slots of the wide bucket of a hashed pooled table (module `hashed_pool`, "Wide buckets"):
/// the bytes of two 7-slot buckets, one READ, one header.
pub const WIDE_BUCKET_SLOTS: usize = 15;
/// The wide index bucket type of hashed pooled tables.
pub type WideBucket = IndexBucket<WIDE_BUCKET_SLOTS>;
/// Bytes of one wide index bucket.
pub const WIDE_BUCKET_LEN: usize = WideBucket::LEN;

/// Byte offset of slot `slot` inside a bucket (the same in a 7-slot and a wide bucket:
/// a 16-byte header, then 16-byte slots).
#[must_use]
pub fn slot_offset(slot: usize) -> u64 {
    WideBucket::slot_offset(slot).map_or(0, |o| o as u64)
}

/// The 16 bytes of an index slot mapping `key` to `addr`.
#[must_use]
pub fn index_slot_bytes(key: u64, addr: PackedAddr) -> [u8; 16] {
    let slot = IndexSlot::new(key, addr);
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&slot.key().to_le_bytes());
    out[8..].copy_from_slice(&slot.addr().to_raw().to_le_bytes());
    out
}

/// The image of an unlocked item, `item_len` bytes, with no recorded installer (loaded
/// records).
#[must_use]
pub fn encode_item(
    key: u64,
    table: u32,
    version: DataVersion,
    flags: ItemFlags,
    value: &[u8],
    item_len: usize,
) -> Vec<u8> {
    encode_item_by(
        key,
        table,
        version,
        flags,
        value,
        item_len,
        DataItemHeader::NO_WRITER,
    )
}

/// The image of an unlocked item whose version was installed by `writer` (a packed
/// transaction id, [`DataItemHeader::pack_writer`]), so that readers can tell the history
/// checker which transaction wrote what they saw.
#[must_use]
pub fn encode_item_by(
    key: u64,
    table: u32,
    version: DataVersion,
    flags: ItemFlags,
    value: &[u8],
    item_len: usize,
    writer: u64,
) -> Vec<u8> {
    let mut buf = vec![0u8; item_len];
    let header = DataItemHeader::new(
        key,
        table,
        u16::try_from(value.len()).unwrap_or(u16::MAX),
        version,
        flags,
    )
    .with_writer(writer);
    // The buffer is item_len(value.len()) bytes and values are at most u16::MAX (checked by
    // the table spec), so emit cannot fail; on a failure the buffer stays zero (free, absent).
    let _ = DataItem::emit(&mut buf[..], header, value);
    buf
}

/// The slots of one bucket READ ([`BucketLoc::read_len`] bytes: a 7-slot bucket, or a
/// wide one of a hashed pooled table): `(slot, key)` of every used slot, in order, and the
/// first free slot. Bytes of any other length hold no slot and no free slot (a lookup finds
/// nothing, an insert finds no room).
#[must_use]
pub fn parse_bucket(bytes: &[u8]) -> (Vec<(usize, u64)>, Option<usize>) {
    fn used_and_free(
        slots: &[IndexSlot],
        free: Option<usize>,
    ) -> (Vec<(usize, u64)>, Option<usize>) {
        let used = slots
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_empty())
            .map(|(i, s)| (i, s.key()))
            .collect();
        (used, free)
    }
    match bytes.len() {
        BUCKET_LEN => Bucket::parse(bytes).map(|b| used_and_free(b.slots(), b.free_slot())),
        WIDE_BUCKET_LEN => {
            WideBucket::parse(bytes).map(|b| used_and_free(b.slots(), b.free_slot()))
        }
        _ => return (Vec::new(), None),
    }
    .unwrap_or((Vec::new(), None))
}
