//! Motor's operation log: what each coordinator has locked and, once it commits, what it
//! installs — kept where a CN crash does not lose it.
//!
//! Motor relies on UPS-backed DRAM for fault tolerance (LOTUS §5.2 "ACID Guarantees", §6
//! and §8.3 say so of Motor: it needs "specialized hardware (e.g., UPS-backed DRAM)"); its
//! public code keeps, per coordinator, a table of locked keys (MN, offset, transaction id)
//! in CN memory from which a surviving thread releases a crashed coordinator's locks. dmem models that
//! memory as an [`OpLogs`] owned by the deployment: a coordinator writes its entry with CPU
//! stores (no verb, no virtual-time cost, like a DRAM write), and the entry survives the
//! simulated crash of its CN, as battery-backed DRAM would.
//!
//! Motor's code only releases locks. dmem also logs the commit's installs (the images and
//! cells a commit WRITEs, known once the commit timestamp is taken and validation passed),
//! so that a CN crash in the middle of a commit's post lists — some records installed, some
//! not — is finished by recovery instead of leaving a partial transaction visible (see
//! [`crate::recovery`]). Old versions stay in the CVT, so no undo image is needed (the
//! multi-version store is its own undo log, LOTUS §5.2 "ACID Guarantees").

use std::cell::RefCell;
use std::collections::HashMap;

use dmem_layout::bytes::{ByteReader, ByteSink, BytesError};
use dmem_txn::TableId;

/// A record whose lock (on its primary) a coordinator holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockedRecord {
    /// Its table.
    pub table: TableId,
    /// Its partition (the primary and backups follow from it).
    pub partition: u16,
    /// Offset of its block, the same on every replica.
    pub block: u64,
}

/// What a commit installs in one record: the same bytes on every replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Install {
    /// The record (locked by the committing coordinator).
    pub record: LockedRecord,
    /// The commit timestamp the new cell carries.
    pub version: u64,
    /// Offsets in the block and bytes of the new image (full records), or of the full value
    /// and the delta (Motor's layout): [`crate::mvcc::install_images`].
    pub images: Vec<(u64, Vec<u8>)>,
    /// Offset in the block and bytes of the new cell.
    pub cell: (u64, Vec<u8>),
    /// Offset and bytes of the floor and whole CVT, when the commit evicted or collected
    /// cells (written instead of the cell alone).
    pub whole: Option<(u64, Vec<u8>)>,
}

/// One coordinator's log entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum OpLog {
    /// No transaction holds anything.
    #[default]
    Idle,
    /// Transaction `seq` is executing and holds `locked`.
    Locking {
        /// Its sequence number.
        seq: u64,
        /// The locks it holds.
        locked: Vec<LockedRecord>,
    },
    /// Transaction `seq` decided to commit (timestamp taken, validation passed): it holds
    /// `locked` and installs `installs` (a subset of `locked`).
    Committing {
        /// Its sequence number.
        seq: u64,
        /// The locks it holds.
        locked: Vec<LockedRecord>,
        /// What it installs.
        installs: Vec<Install>,
    },
}

/// Why bytes are not an encoded [`OpLog`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpLogDecodeError {
    /// The bytes end inside a field.
    #[error("op log truncated at byte {0}")]
    Truncated(usize),
    /// An unknown entry kind or flag.
    #[error("op log byte {at}: unknown tag {tag}")]
    BadTag {
        /// Where.
        at: usize,
        /// What.
        tag: u8,
    },
    /// Bytes left after the entry.
    #[error("op log has {0} bytes after its entry")]
    Trailing(usize),
}

impl From<BytesError> for OpLogDecodeError {
    fn from(e: BytesError) -> Self {
        match e {
            BytesError::Truncated { at, .. } | BytesError::Full { at, .. } => {
                OpLogDecodeError::Truncated(at)
            }
            BytesError::Trailing { extra, .. } => OpLogDecodeError::Trailing(extra),
        }
    }
}

fn put_chunk(w: &mut impl ByteSink, (offset, b): &(u64, Vec<u8>)) {
    w.put_u64(*offset);
    w.put_u32(b.len() as u32);
    w.put_bytes(b);
}

fn put_record(w: &mut impl ByteSink, r: &LockedRecord) {
    w.put_u32(r.table.0);
    w.put_u16(r.partition);
    w.put_u64(r.block);
}

fn put_records(w: &mut impl ByteSink, records: &[LockedRecord]) {
    w.put_u32(records.len() as u32);
    records.iter().for_each(|r| put_record(w, r));
}

/// A count of items of at least `min_len` bytes each, checked against the bytes left
/// before anything is allocated.
fn count(r: &mut ByteReader<'_>, min_len: usize) -> Result<usize, OpLogDecodeError> {
    let at = r.position();
    let n = r.u32()? as usize;
    if n.saturating_mul(min_len) > r.remaining() {
        return Err(OpLogDecodeError::Truncated(at));
    }
    Ok(n)
}

fn chunk(r: &mut ByteReader<'_>) -> Result<(u64, Vec<u8>), OpLogDecodeError> {
    let offset = r.u64()?;
    let n = count(r, 1)?;
    Ok((offset, r.bytes(n)?.to_vec()))
}

fn record(r: &mut ByteReader<'_>) -> Result<LockedRecord, OpLogDecodeError> {
    Ok(LockedRecord {
        table: TableId(r.u32()?),
        partition: r.u16()?,
        block: r.u64()?,
    })
}

fn records(r: &mut ByteReader<'_>) -> Result<Vec<LockedRecord>, OpLogDecodeError> {
    let n = count(r, RECORD_LEN)?;
    (0..n).map(|_| record(r)).collect()
}

/// Bytes of an encoded [`LockedRecord`].
const RECORD_LEN: usize = 4 + 2 + 8;

impl OpLog {
    /// The entry as bytes (little endian), for logs kept outside this process's memory
    /// (a real cluster's CN processes: see `dmem-deploy`'s `process` module).
    #[must_use]
    pub fn emit(&self) -> Vec<u8> {
        let mut w = Vec::new();
        match self {
            OpLog::Idle => w.put_u8(0),
            OpLog::Locking { seq, locked } => {
                w.put_u8(1);
                w.put_u64(*seq);
                put_records(&mut w, locked);
            }
            OpLog::Committing {
                seq,
                locked,
                installs,
            } => {
                w.put_u8(2);
                w.put_u64(*seq);
                put_records(&mut w, locked);
                w.put_u32(installs.len() as u32);
                for i in installs {
                    put_record(&mut w, &i.record);
                    w.put_u64(i.version);
                    w.put_u32(i.images.len() as u32);
                    i.images.iter().for_each(|c| put_chunk(&mut w, c));
                    put_chunk(&mut w, &i.cell);
                    match &i.whole {
                        None => w.put_u8(0),
                        Some(c) => {
                            w.put_u8(1);
                            put_chunk(&mut w, c);
                        }
                    }
                }
            }
        }
        w
    }

    /// Parses [`emit`](Self::emit)'s bytes.
    ///
    /// # Errors
    /// [`OpLogDecodeError`] for bytes that are not exactly one entry.
    pub fn parse(bytes: &[u8]) -> Result<Self, OpLogDecodeError> {
        let mut r = ByteReader::new(bytes);
        let log = match r.u8()? {
            0 => OpLog::Idle,
            1 => OpLog::Locking {
                seq: r.u64()?,
                locked: records(&mut r)?,
            },
            2 => {
                let seq = r.u64()?;
                let locked = records(&mut r)?;
                // An install is at least a record, a version, a count, a cell and a flag.
                let n = count(&mut r, RECORD_LEN + 8 + 4 + 12 + 1)?;
                let mut installs = Vec::with_capacity(n);
                for _ in 0..n {
                    let record = record(&mut r)?;
                    let version = r.u64()?;
                    let images = count(&mut r, 12)?;
                    let images = (0..images)
                        .map(|_| chunk(&mut r))
                        .collect::<Result<_, _>>()?;
                    let cell = chunk(&mut r)?;
                    let at = r.position();
                    let whole = match r.u8()? {
                        0 => None,
                        1 => Some(chunk(&mut r)?),
                        tag => return Err(OpLogDecodeError::BadTag { at, tag }),
                    };
                    installs.push(Install {
                        record,
                        version,
                        images,
                        cell,
                        whole,
                    });
                }
                OpLog::Committing {
                    seq,
                    locked,
                    installs,
                }
            }
            tag => return Err(OpLogDecodeError::BadTag { at: 0, tag }),
        };
        r.finish()?;
        Ok(log)
    }
}

/// Where a coordinator's op log entry is also kept, written through at every change: memory
/// that outlives the coordinator's process (a real cluster's CN process; the simulator's
/// deployment keeps the [`OpLogs`] themselves past a crash and needs none).
pub trait OpLogMirror {
    /// Coordinator `id`'s entry is now `log`; returns once it is kept.
    fn store(&self, id: u16, log: &OpLog);
}

/// The op logs of every coordinator of a deployment, by coordinator id.
#[derive(Default)]
pub struct OpLogs {
    logs: RefCell<HashMap<u16, OpLog>>,
    mirror: RefCell<Option<Box<dyn OpLogMirror>>>,
}

impl core::fmt::Debug for OpLogs {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("OpLogs")
            .field("logs", &self.logs)
            .field("mirrored", &self.mirror.borrow().is_some())
            .finish()
    }
}

impl OpLogs {
    /// Empty logs.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Writes every later change of a coordinator's entry through to `mirror` too.
    pub fn set_mirror(&self, mirror: Box<dyn OpLogMirror>) {
        *self.mirror.borrow_mut() = Some(mirror);
    }

    /// Sets coordinator `id`'s entry (one read back from a mirror, for recovery).
    pub fn restore(&self, id: u16, log: OpLog) {
        self.logs.borrow_mut().insert(id, log);
    }

    fn set(&self, id: u16, log: OpLog) {
        if let Some(m) = &*self.mirror.borrow() {
            m.store(id, &log);
        }
        self.logs.borrow_mut().insert(id, log);
    }

    /// Coordinator `id` begins transaction `seq`, holding nothing.
    pub fn begin(&self, id: u16, seq: u64) {
        self.set(
            id,
            OpLog::Locking {
                seq,
                locked: Vec::new(),
            },
        );
    }

    /// Coordinator `id` now holds `record`'s lock.
    pub fn locked(&self, id: u16, record: LockedRecord) {
        let log = match self.logs.borrow().get(&id) {
            Some(OpLog::Locking { seq, locked }) if !locked.contains(&record) => {
                let mut locked = locked.clone();
                locked.push(record);
                OpLog::Locking { seq: *seq, locked }
            }
            _ => return,
        };
        self.set(id, log);
    }

    /// Coordinator `id` commits with `installs`.
    pub fn committing(&self, id: u16, installs: Vec<Install>) {
        let log = match self.logs.borrow().get(&id) {
            Some(OpLog::Locking { seq, locked }) => OpLog::Committing {
                seq: *seq,
                locked: locked.clone(),
                installs,
            },
            _ => return,
        };
        self.set(id, log);
    }

    /// Coordinator `id` released everything (its transaction finished).
    pub fn finished(&self, id: u16) {
        self.set(id, OpLog::Idle);
    }

    /// Coordinator `id`'s entry.
    #[must_use]
    pub fn get(&self, id: u16) -> OpLog {
        self.logs.borrow().get(&id).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    fn rec(block: u64) -> LockedRecord {
        LockedRecord {
            table: TableId(1),
            partition: 0,
            block,
        }
    }

    #[test]
    fn a_transaction_moves_from_locking_to_committing_to_idle() {
        let logs = OpLogs::new();
        assert_eq!(logs.get(3), OpLog::Idle);
        logs.begin(3, 7);
        logs.locked(3, rec(64));
        logs.locked(3, rec(64));
        logs.locked(3, rec(128));
        assert_eq!(
            logs.get(3),
            OpLog::Locking {
                seq: 7,
                locked: vec![rec(64), rec(128)]
            }
        );
        let install = Install {
            record: rec(64),
            version: 99,
            images: vec![(256, vec![1; 8])],
            cell: (48, vec![2; 32]),
            whole: None,
        };
        logs.committing(3, vec![install.clone()]);
        let OpLog::Committing {
            seq,
            locked,
            installs,
        } = logs.get(3)
        else {
            panic!("not committing: {:?}", logs.get(3));
        };
        assert_eq!((seq, locked.len(), installs), (7, 2, vec![install]));
        logs.finished(3);
        assert_eq!(logs.get(3), OpLog::Idle);
        // Another coordinator's entry is its own.
        assert_eq!(logs.get(4), OpLog::Idle);
    }

    fn committing_log() -> OpLog {
        OpLog::Committing {
            seq: 9,
            locked: vec![rec(64), rec(128)],
            installs: vec![
                Install {
                    record: rec(64),
                    version: 99,
                    images: vec![(256, vec![1; 8]), (300, vec![3; 5])],
                    cell: (48, vec![2; 32]),
                    whole: None,
                },
                Install {
                    record: rec(128),
                    version: 99,
                    images: Vec::new(),
                    cell: (0, Vec::new()),
                    whole: Some((16, vec![4; 40])),
                },
            ],
        }
    }

    #[test]
    fn entries_round_trip_and_every_truncation_is_an_error() {
        let logs = [
            OpLog::Idle,
            OpLog::Locking {
                seq: 7,
                locked: vec![rec(64)],
            },
            committing_log(),
        ];
        for log in logs {
            let bytes = log.emit();
            assert_eq!(OpLog::parse(&bytes), Ok(log.clone()));
            for n in 0..bytes.len() {
                assert!(OpLog::parse(&bytes[..n]).is_err(), "{n} of {}", bytes.len());
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert_eq!(OpLog::parse(&longer), Err(OpLogDecodeError::Trailing(1)));
        }
        assert!(matches!(
            OpLog::parse(&[7]),
            Err(OpLogDecodeError::BadTag { at: 0, tag: 7 })
        ));
        // A count far beyond the bytes is refused before anything is allocated.
        let mut huge = vec![1];
        huge.extend_from_slice(&5u64.to_le_bytes());
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            OpLog::parse(&huge),
            Err(OpLogDecodeError::Truncated(_))
        ));
    }

    #[test]
    fn a_mirror_sees_every_change() {
        #[derive(Default)]
        struct Seen(Rc<RefCell<Vec<(u16, OpLog)>>>);
        impl OpLogMirror for Seen {
            fn store(&self, id: u16, log: &OpLog) {
                self.0.borrow_mut().push((id, log.clone()));
            }
        }
        let seen = Rc::new(RefCell::new(Vec::new()));
        let logs = OpLogs::new();
        logs.set_mirror(Box::new(Seen(Rc::clone(&seen))));
        logs.begin(2, 1);
        logs.locked(2, rec(64));
        logs.locked(2, rec(64));
        logs.finished(2);
        let kinds: Vec<OpLog> = seen.borrow().iter().map(|(_, l)| l.clone()).collect();
        assert_eq!(kinds.len(), 3, "{kinds:?}");
        assert_eq!(kinds[2], OpLog::Idle);
        assert!(seen.borrow().iter().all(|(id, _)| *id == 2));
    }

    #[test]
    fn a_lock_taken_after_committing_is_not_logged_as_locking() {
        let logs = OpLogs::new();
        logs.begin(1, 1);
        logs.committing(1, Vec::new());
        logs.locked(1, rec(64));
        assert!(matches!(logs.get(1), OpLog::Committing { locked, .. } if locked.is_empty()));
    }
}
