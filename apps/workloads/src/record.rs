//! Fixed-size record values: zerocopy structs with little-endian fields.
//!
//! Every record type is `#[repr(C)]` over `zerocopy::little_endian` integers and byte
//! arrays, so it has alignment 1, no padding, and a size pinned by `static_assertions` next
//! to its definition. Sizes are rounded up to a multiple of 8 with an explicit `_pad` field
//! (the convention of `dmem-layout`'s records). Every bit pattern is a valid value
//! (`FromBytes`), so decoding can fail only on a wrong length.

use dmem_txn::{Key, TableId, Transaction, TxnError};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// A record value type: encode to and decode from its table's fixed-size bytes.
pub trait Record: FromBytes + IntoBytes + KnownLayout + Immutable + Sized {
    /// The value size of its table.
    const SIZE: usize = size_of::<Self>();

    /// Decodes a value; [`TxnError::ValueSize`] if `bytes` has the wrong length.
    fn decode(bytes: &[u8]) -> Result<Self, TxnError> {
        Self::read_from_bytes(bytes).map_err(|_| TxnError::ValueSize {
            expected: Self::SIZE,
            got: bytes.len(),
        })
    }

    /// Encodes the value.
    fn encode(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
}

/// Reads and decodes a record that may be absent.
pub(crate) async fn read_opt<R: Record, T: Transaction>(
    tx: &mut T,
    table: TableId,
    key: u64,
    for_update: bool,
) -> Result<Option<R>, TxnError> {
    let value = if for_update {
        tx.read_for_update(table, Key(key)).await?
    } else {
        tx.read(table, Key(key)).await?
    };
    value.map(|v| R::decode(&v)).transpose()
}

/// Reads and decodes a record the benchmark guarantees to exist; its absence is
/// [`TxnError::KeyState`] (a broken store or protocol, not a benchmark outcome).
pub(crate) async fn read_req<R: Record, T: Transaction>(
    tx: &mut T,
    table: TableId,
    key: u64,
    for_update: bool,
) -> Result<R, TxnError> {
    read_opt(tx, table, key, for_update)
        .await?
        .ok_or(TxnError::KeyState(key))
}

/// Decodes a record from a state reader, for invariant checks.
pub(crate) fn peek<R: Record>(
    read: &impl Fn(TableId, Key) -> Option<Vec<u8>>,
    table: TableId,
    key: u64,
) -> Option<Result<R, usize>> {
    read(table, Key(key)).map(|v| R::decode(&v).map_err(|_| v.len()))
}

/// Copies `s` into a fixed-size, zero-padded string field (truncating).
pub(crate) fn put_str(out: &mut [u8], s: &[u8]) {
    let n = s.len().min(out.len());
    out[..n].copy_from_slice(&s[..n]);
    out[n..].fill(0);
}

/// The bytes of a zero-padded string field up to its first zero.
pub(crate) fn get_str(field: &[u8]) -> &[u8] {
    let n = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    &field[..n]
}
