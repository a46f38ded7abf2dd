//! The records of the lock-based baselines (DrTM, DSLR 2PL): the OOCC record whose value
//! carries an 8-byte version in front (their lock words hold no version; the histories
//! need one). Plain functions over bytes, shared by both protocols' commits.

use dmem_layout::record::OoccLockWord;
use dmem_txn::{Key, TableId, TxnId};

use crate::store::emit;

/// The version in front of a record value (0 if the value is shorter than one).
#[must_use]
pub(crate) fn version_of(value: &[u8]) -> u64 {
    u64::from_le_bytes(
        value
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .unwrap_or([0; 8]),
    )
}

/// The image a commit by `writer` gives a record of a `phys`-byte table (version
/// included): version `next` in front of the new value, or of zeros for a delete (`new` is
/// `Some(None)`), whose flags are cleared (absent); `lock` as its lock word.
#[must_use]
pub(crate) fn commit_image(
    table: TableId,
    key: Key,
    next: u64,
    new: &Option<Option<Vec<u8>>>,
    phys: usize,
    lock: OoccLockWord,
    writer: TxnId,
) -> Vec<u8> {
    let mut v = vec![0u8; phys];
    v[..8].copy_from_slice(&next.to_le_bytes());
    if let Some(Some(value)) = new {
        v[8..].copy_from_slice(value);
    }
    let mut image = emit(table, key, Some(&v), phys, lock, Some(writer));
    if new.as_ref().is_some_and(Option::is_none) {
        image[14..16].copy_from_slice(&0u16.to_le_bytes());
    }
    image
}

#[cfg(test)]
mod tests {
    use dmem_layout::record::OoccRecordHeader;

    use super::*;
    use crate::store::parse;

    const WRITER: TxnId = TxnId {
        coordinator: dmem_txn::CoordinatorId(3),
        seq: 11,
    };

    #[test]
    fn an_update_carries_the_next_version_in_front_of_its_value() {
        let image = commit_image(
            TableId(2),
            Key(9),
            8,
            &Some(Some(vec![7; 16])),
            24,
            OoccLockWord::from_raw(5),
            WRITER,
        );
        assert_eq!(image.len(), OoccRecordHeader::record_len(24));
        let parsed = parse(&image, 24);
        assert!(parsed.present);
        assert_eq!(version_of(&parsed.value), 8);
        assert_eq!(&parsed.value[8..], &[7; 16]);
        assert_eq!(parsed.lock.to_raw(), 5);
        assert_eq!(
            parsed.writer,
            Some(WRITER),
            "the installer travels with the value"
        );
    }

    #[test]
    fn a_delete_keeps_the_version_and_clears_the_flags() {
        let image = commit_image(
            TableId(2),
            Key(9),
            3,
            &Some(None),
            24,
            OoccLockWord::from_raw(0),
            WRITER,
        );
        let parsed = parse(&image, 24);
        assert!(!parsed.present);
        assert_eq!(version_of(&parsed.value), 3);
        assert!(parsed.value[8..].iter().all(|&b| b == 0));
        assert_eq!(version_of(&[1, 2]), 0);
    }
}
