//! Fixed-size record values: zerocopy structs with little-endian fields.
//!
//! Every record type is `#[repr(C)]` over `zerocopy::little_endian` integers and byte
//! arrays, so it has alignment 1, no padding, and a size pinned by `static_assertions` next
//! to its definition. Sizes are rounded up to a multiple of 8 with an explicit `_pad` field
//! (the convention of `dmem-layout`'s records). Every bit pattern is a valid value
//! (`FromBytes`), so decoding can fail only on a wrong length.

use dmem_txn::{Key, ReadReq, TableId, Transaction, TxnError};
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

/// The values of one round ([`round`]), taken one by one in request order and decoded:
/// [`req`](Self::req) for a record the benchmark guarantees to exist, [`opt`](Self::opt) for
/// one that may be absent.
#[derive(Debug)]
pub(crate) struct Round {
    keys: std::vec::IntoIter<Key>,
    values: std::vec::IntoIter<Option<Vec<u8>>>,
}

impl Round {
    /// The next request's key and raw value (`None`: absent).
    ///
    /// # Panics
    /// If every value of the round has been taken (a workload bug).
    pub(crate) fn raw(&mut self) -> (u64, Option<Vec<u8>>) {
        let key = self.keys.next().expect("more values taken than requested");
        let value = self.values.next().expect("one value per request");
        (key.0, value)
    }

    /// The next value, decoded; `None` if the record is absent.
    pub(crate) fn opt<R: Record>(&mut self) -> Result<Option<R>, TxnError> {
        self.raw().1.map(|v| R::decode(&v)).transpose()
    }

    /// The next value, decoded, of a record the benchmark guarantees to exist; its absence is
    /// [`TxnError::KeyState`] (a broken store or protocol, not a benchmark outcome).
    pub(crate) fn req<R: Record>(&mut self) -> Result<R, TxnError> {
        let (key, value) = self.raw();
        R::decode(&value.ok_or(TxnError::KeyState(key))?)
    }

    /// Whether the next record is present (its value is not decoded).
    pub(crate) fn present(&mut self) -> bool {
        self.raw().1.is_some()
    }
}

/// Executes one round ([`Transaction::read_round`]): every request together, the values
/// back in request order. An empty round issues nothing (it is no round trip).
///
/// # Panics
/// If the protocol returns a different number of values than requested (it broke the
/// `read_round` contract).
pub(crate) async fn round<T: Transaction>(tx: &mut T, reqs: &[ReadReq]) -> Result<Round, TxnError> {
    let values = if reqs.is_empty() {
        Vec::new()
    } else {
        tx.read_round(reqs).await?
    };
    assert_eq!(
        values.len(),
        reqs.len(),
        "read_round returned {} values for {} requests",
        values.len(),
        reqs.len()
    );
    Ok(Round {
        keys: reqs.iter().map(|r| r.key).collect::<Vec<_>>().into_iter(),
        values: values.into_iter(),
    })
}

/// A read-only request for `(table, key)`.
pub(crate) const fn rd(table: TableId, key: u64) -> ReadReq {
    ReadReq::read(table, Key(key))
}

/// A for-update request for `(table, key)` (also for a key the transaction inserts or
/// deletes).
pub(crate) const fn upd(table: TableId, key: u64) -> ReadReq {
    ReadReq::for_update(table, Key(key))
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
