//! Lock RPC messages between CNs (LOTUS §4.1): every lock request of one transaction's
//! round for one CN in one message, and the reply. Little-endian, parsed with checks
//! (a message comes from the network).
//!
//! ```text
//! request  kind u8 (1 lock, 2 unlock, 4 shard hand-over, 5 release a failed CN's locks,
//!          6 a restarted CN rejoins) | mode-free pad u8 | cn u16 | pad u32 | req u64 | txn u64
//!          | n u16 | n × (lock key u64, shard u16, mode u8 (0 shared, 1 exclusive))
//! reply    kind u8 (3) | status u8 | pad 6 | req u64
//! ```

use dmem_layout::bytes::{ByteReader, ByteSink, BytesError, SliceWriter};
use dmem_locks::LockMode;

/// Bytes of a request before its entries.
pub const REQUEST_HEADER: usize = 26;
/// Bytes of one entry.
pub const ENTRY: usize = 11;
/// Bytes of a reply.
pub const REPLY: usize = 16;

/// One lock of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockEntry {
    /// Lock key ([`crate::shard::record_lock_key`] or a bucket's).
    pub key: u64,
    /// Its shard.
    pub shard: u16,
    /// Mode.
    pub mode: LockMode,
}

/// What a request asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// Acquire every entry (all or nothing).
    Lock,
    /// Release every entry (asynchronous: no reply).
    Unlock,
    /// Resharding (§4.3): the sender hands the receiver the shards of the entries (their
    /// keys and modes unused); the receiver serves them from now on and replies.
    Handover,
    /// Recovery (§6): CN `cn` failed; fence it and release its locks, then reply.
    Release,
    /// Restart (§6): CN `cn` restarted and its old transactions are finished; unfence it,
    /// then reply.
    Rejoin,
}

/// A lock request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Lock or unlock.
    pub kind: RequestKind,
    /// The requesting transaction's CN.
    pub cn: u16,
    /// Request id (echoed in the reply).
    pub req: u64,
    /// Transaction id.
    pub txn: u64,
    /// The locks.
    pub entries: Vec<LockEntry>,
}

/// The answer to a lock request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Every lock granted.
    Granted,
    /// A lock was refused (conflict, full bucket, overflow): none is held.
    Refused,
    /// The CN does not own a shard of the request: retry with a fresh shard map.
    NotOwner,
}

/// A reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    /// The request it answers.
    pub req: u64,
    /// The outcome.
    pub status: Status,
}

/// Why a message could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Shorter than its header says.
    #[error("lock message truncated: {0} bytes")]
    Truncated(usize),
    /// A field with an undefined value.
    #[error("lock message field {0} out of range")]
    Field(&'static str),
}

impl From<BytesError> for WireError {
    /// A short field means the message is shorter than its header says.
    fn from(e: BytesError) -> Self {
        match e {
            BytesError::Truncated { at, left, .. } => WireError::Truncated(at + left),
            BytesError::Trailing { at, extra } => WireError::Truncated(at + extra),
            BytesError::Full { at, .. } => WireError::Truncated(at),
        }
    }
}

impl RequestKind {
    const fn code(self) -> u8 {
        match self {
            RequestKind::Lock => 1,
            RequestKind::Unlock => 2,
            RequestKind::Handover => 4,
            RequestKind::Release => 5,
            RequestKind::Rejoin => 6,
        }
    }

    const fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => RequestKind::Lock,
            2 => RequestKind::Unlock,
            4 => RequestKind::Handover,
            5 => RequestKind::Release,
            6 => RequestKind::Rejoin,
            _ => return None,
        })
    }
}

impl Request {
    /// Bytes of the encoding.
    #[must_use]
    pub fn len(&self) -> usize {
        REQUEST_HEADER + ENTRY * self.entries.len()
    }

    /// Whether it has no entries.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The encoding.
    #[must_use]
    pub fn emit(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.len());
        b.put_u8(self.kind.code());
        b.put_zeros(1);
        b.put_u16(self.cn);
        b.put_zeros(4);
        b.put_u64(self.req);
        b.put_u64(self.txn);
        b.put_u16(self.entries.len() as u16);
        for e in &self.entries {
            b.put_u64(e.key);
            b.put_u16(e.shard);
            b.put_u8(u8::from(e.mode == LockMode::Exclusive));
        }
        b
    }

    /// Parses a request.
    ///
    /// # Errors
    /// [`WireError`].
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < REQUEST_HEADER {
            return Err(WireError::Truncated(b.len()));
        }
        let mut r = ByteReader::new(b);
        let kind = RequestKind::from_code(r.u8()?).ok_or(WireError::Field("kind"))?;
        r.u8()?; // pad
        let cn = r.u16()?;
        r.u32()?; // pad
        let req = r.u64()?;
        let txn = r.u64()?;
        let n = usize::from(r.u16()?);
        if b.len() != REQUEST_HEADER + n * ENTRY {
            return Err(WireError::Truncated(b.len()));
        }
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            entries.push(LockEntry {
                key: r.u64()?,
                shard: r.u16()?,
                mode: match r.u8()? {
                    0 => LockMode::Shared,
                    1 => LockMode::Exclusive,
                    _ => return Err(WireError::Field("mode")),
                },
            });
        }
        r.finish()?;
        Ok(Self {
            kind,
            cn,
            req,
            txn,
            entries,
        })
    }
}

impl Reply {
    /// The encoding.
    #[must_use]
    pub fn emit(&self) -> [u8; REPLY] {
        let mut b = [0u8; REPLY];
        let mut w = SliceWriter::new(&mut b);
        w.put_u8(3);
        w.put_u8(match self.status {
            Status::Granted => 0,
            Status::Refused => 1,
            Status::NotOwner => 2,
        });
        w.put_zeros(6);
        w.put_u64(self.req);
        debug_assert_eq!(w.finish(), Ok(REPLY));
        b
    }

    /// Parses a reply.
    ///
    /// # Errors
    /// [`WireError`].
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        if b.len() != REPLY {
            return Err(WireError::Truncated(b.len()));
        }
        let mut r = ByteReader::new(b);
        if r.u8()? != 3 {
            return Err(WireError::Field("kind"));
        }
        let status = match r.u8()? {
            0 => Status::Granted,
            1 => Status::Refused,
            2 => Status::NotOwner,
            _ => return Err(WireError::Field("status")),
        };
        r.array::<6>()?; // pad
        let req = r.u64()?;
        r.finish()?;
        Ok(Self { req, status })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck_macros::quickcheck;

    #[quickcheck]
    fn request_round_trip(
        cn: u16,
        req: u64,
        txn: u64,
        keys: Vec<(u64, u16, bool)>,
        kind: u8,
    ) -> bool {
        let r = Request {
            kind: match kind % 5 {
                0 => RequestKind::Lock,
                1 => RequestKind::Unlock,
                2 => RequestKind::Release,
                3 => RequestKind::Rejoin,
                _ => RequestKind::Handover,
            },
            cn,
            req,
            txn,
            entries: keys
                .into_iter()
                .take(300)
                .map(|(key, shard, x)| LockEntry {
                    key,
                    shard,
                    mode: if x {
                        LockMode::Exclusive
                    } else {
                        LockMode::Shared
                    },
                })
                .collect(),
        };
        let b = r.emit();
        b.len() == r.len()
            && (0..b.len()).all(|n| Request::parse(&b[..n]) == Err(WireError::Truncated(n)))
            && Request::parse(&b) == Ok(r)
    }

    #[quickcheck]
    fn parsing_never_panics(bytes: Vec<u8>) -> bool {
        let _ = Request::parse(&bytes);
        let _ = Reply::parse(&bytes);
        true
    }

    #[test]
    fn reply_round_trip_and_bad_input() {
        for status in [Status::Granted, Status::Refused, Status::NotOwner] {
            let r = Reply { req: 77, status };
            assert_eq!(Reply::parse(&r.emit()), Ok(r));
        }
        let mut b = Reply {
            req: 1,
            status: Status::Granted,
        }
        .emit();
        b[1] = 9;
        assert_eq!(Reply::parse(&b), Err(WireError::Field("status")));
        assert_eq!(Request::parse(&[1; 5]), Err(WireError::Truncated(5)));
        assert_eq!(Reply::parse(&b[..15]), Err(WireError::Truncated(15)));
    }
}
