//! The protocol's messages (Dandelion §4.2) as bytes inside an RPC frame's message.
//!
//! Each message of a `dmem_layout::rpc` frame has a type, a request slot and a payload;
//! this module encodes the payloads of the protocol's requests and responses (little
//! endian, packed) and parses received ones with checked parsing: a truncated, oversized or
//! undefined payload is a [`WireError`], never a panic.
//!
//! | type | request payload | response payload |
//! |---|---|---|
//! | `GET` | table u32, key u64 | meta u32, writer (u8 + txn), value |
//! | `LOCK` | txn, table, key, read u32+u8, write, lock set u16 | granted u8, meta u32 |
//! | `VALIDATE` | table, key, read u32+u8 | ok u8 |
//! | `REPLICATE` | txn, table, key, version u32, lower u8, write | ok u8 |
//! | `UNLOCK` | txn, table, key, commit u8, apply u8, version u32, write | ok u8 |
//! | `RAISE` | txn, table, key, version u32 | ok u8 |
//! | `GATHER` (recovery) | epoch u64, after u8 + txn | more u8, txns u16, each txn, coordinator u8 (+ writes u16, each table, key, version u32, write), entries u16, each table, key, flags u8, lock set u16, version u32, write |
//! | `DECIDE` (recovery) | txn, epoch u64, commit u8, writes u16, each table, key, version u32, write | ok u8 |
//! | `RESUME` (recovery) | epoch u64 | ok u8 |
//! | `QUERY` (recovery) | epoch u64, txns u16, each txn, keys u16, each txn, table, key | decisions u16, each coordinator u8 (+ writes), written u16, each u8 |
//!
//! On the network a request payload is preceded by the reliability layer's 4-byte
//! acknowledged-below mark and its slot is the session's request number (`reliable.rs`).
//!
//! `txn` is the coordinator (u32) and sequence number (u64); `write` is a kind byte and the
//! value. A `LOCK` carries the write so that the replica logs it (Locking step, §4.2.2).

use dmem_layout::bytes::{ByteReader, ByteSink, BytesError};
use dmem_txn::{CoordinatorId, TxnId, WriteKind};

/// Message types (the `msg_type` of a frame message).
pub mod msg {
    /// Execution-phase read.
    pub const GET: u16 = 1;
    /// Locking step.
    pub const LOCK: u16 = 2;
    /// Read Validation step.
    pub const VALIDATE: u16 = 3;
    /// Replication step.
    pub const REPLICATE: u16 = 4;
    /// Unlocking step.
    pub const UNLOCK: u16 = 5;
    /// Raises the readable flag of a backup once its writer committed (piggybacked, §4.2.2).
    pub const RAISE: u16 = 6;
    /// Recovery (§4.4): the decider asks a survivor for its log entries and its
    /// coordinators' commits in flight, a page at a time.
    pub const GATHER: u16 = 7;
    /// Recovery: a transaction's decision and the writes a commit installs, to apply.
    pub const DECIDE: u16 = 8;
    /// Recovery: every decision is applied; resume in the new epoch.
    pub const RESUME: u16 = 9;
    /// Recovery: what this server's coordinators decided for some transactions, and
    /// (Dnl-1) whether a transaction's write is the current version of some keys here.
    pub const QUERY: u16 = 10;
}

/// Why a payload could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The payload ended early.
    #[error("payload truncated: needed {needed} more bytes")]
    Truncated {
        /// Bytes missing.
        needed: usize,
    },
    /// Bytes left after the message.
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
    /// A field with an undefined value.
    #[error("undefined value in field `{0}`")]
    Invalid(&'static str),
    /// An unknown message type.
    #[error("unknown message type {0}")]
    UnknownType(u16),
}

impl From<BytesError> for WireError {
    fn from(e: BytesError) -> Self {
        match e {
            BytesError::Trailing { extra, .. } => WireError::Trailing(extra),
            BytesError::Truncated { .. } | BytesError::Full { .. } => WireError::Truncated {
                needed: e.missing(),
            },
        }
    }
}

/// What a transaction observed of a key when it read it: its version and whether it was
/// present (a deleted or never-inserted key is absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// The 29-bit version.
    pub version: u32,
    /// Present (not deleted, inserted).
    pub present: bool,
}

/// A write carried by a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteOp {
    /// Update, insert or delete.
    pub kind: WriteKind,
    /// The new value (empty for a delete).
    pub value: Vec<u8>,
}

/// A survivor's log entry of one transaction as `GATHER` returns it (recovery, §4.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatheredEntry {
    /// Table.
    pub table: u32,
    /// Key.
    pub key: u64,
    /// The entry holds the key's lock at this survivor.
    pub locked: bool,
    /// Replication applied the write here.
    pub applied: bool,
    /// Distinct keys the transaction locks (from its `LOCK`).
    pub lock_set: u16,
    /// The version the write installs here (0: unknown).
    pub version: u32,
    /// The logged write (redo).
    pub write: Option<WriteOp>,
}

/// A write of a decided transaction: table, key, the version it installs, the write.
pub type DecidedWrite = (u32, u64, u32, WriteOp);

/// What a survivor's own coordinator says of a transaction it reports (recovery, §4.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoordinatorState {
    /// The transaction is not in its commit phase at a coordinator of this survivor: it
    /// finished, or its coordinator is elsewhere. Recovery decides it from the logs.
    Unknown,
    /// Its coordinator here is in the commit phase and has not decided commit.
    Undecided,
    /// Its coordinator here decided commit, with the writes (and versions) it installs.
    Committed(Vec<DecidedWrite>),
}

/// One transaction as a survivor's `GATHER` reply carries it: its log entries there and
/// what its coordinator says, if that coordinator is on this survivor and still committing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatheredTxn {
    /// The transaction.
    pub txn: TxnId,
    /// Its coordinator's state, if the coordinator is here and in its commit phase.
    pub coordinator: CoordinatorState,
    /// This survivor's log entries of it (none: a commit in flight that left nothing here).
    pub entries: Vec<GatheredEntry>,
}

impl GatheredTxn {
    /// Its size inside a `GATHER` reply, bytes.
    #[must_use]
    pub fn encoded_len(&self) -> usize {
        let mut w = Vec::new();
        put_gathered_txn(&mut w, self);
        w.len()
    }
}

/// A request message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Execution-phase Get (§4.2.1).
    Get {
        /// Table.
        table: u32,
        /// Key.
        key: u64,
    },
    /// Locking (§4.2.2 step 1): lock, check the version read, log the write.
    Lock {
        /// The transaction.
        txn: TxnId,
        /// Table.
        table: u32,
        /// Key.
        key: u64,
        /// What the transaction read, if it read the key.
        read: Option<Seen>,
        /// The write to log, if the access is not a Get.
        write: Option<WriteOp>,
        /// Distinct keys the transaction locks (logged: recovery of a Dnl-1 transaction
        /// commits it only if it finds every one of them locked, §4.4).
        lock_set: u16,
    },
    /// Read Validation (§4.2.2 step 2) at the primary.
    Validate {
        /// Table.
        table: u32,
        /// Key.
        key: u64,
        /// What the transaction read.
        read: Seen,
    },
    /// Replication (§4.2.2 step 3): apply the write, keep the undo entry.
    Replicate {
        /// The transaction.
        txn: TxnId,
        /// Table.
        table: u32,
        /// Key.
        key: u64,
        /// Version the write installs.
        version: u32,
        /// Lower the readable flag (a backup, §4.2.2).
        lower_readable: bool,
        /// The write.
        write: WriteOp,
    },
    /// Unlocking (§4.2.2 step 4), with the decision.
    Unlock {
        /// The transaction.
        txn: TxnId,
        /// Table.
        table: u32,
        /// Key.
        key: u64,
        /// Commit (else abort).
        commit: bool,
        /// The write to apply here with the version it installs (replicas that were not
        /// replicated to: Dnl-4's primary, every Dnl-1 replica).
        apply: Option<(u32, WriteOp)>,
    },
    /// Raise the readable flag of a backup whose writer committed (§4.2.2).
    Raise {
        /// The writer.
        txn: TxnId,
        /// Table.
        table: u32,
        /// Key.
        key: u64,
        /// The version it installed.
        version: u32,
    },
    /// Recovery: send your log entries and your coordinators' commits in flight, one
    /// page of transactions (in [`TxnId`] order) after `after` (§4.4).
    Gather {
        /// The epoch recovery resumes in.
        epoch: u64,
        /// The last transaction of the previous page (`None`: the first page).
        after: Option<TxnId>,
    },
    /// Recovery: apply the decision of `txn` (commit: install `writes` where this server
    /// holds a replica and does not have them yet; abort: undo), release its locks.
    Decide {
        /// The transaction.
        txn: TxnId,
        /// The epoch recovery resumes in.
        epoch: u64,
        /// Commit (else abort).
        commit: bool,
        /// The writes a commit installs.
        writes: Vec<DecidedWrite>,
    },
    /// Recovery: every decision is applied everywhere; transactions resume.
    Resume {
        /// The epoch they resume in.
        epoch: u64,
    },
    /// Recovery: for each of `txns` (whose coordinators run here), what its coordinator
    /// decided; and (Dnl-1's lost unlock) for each `(txn, table, key)`, whether this
    /// replica's current version of the key was installed by `txn`.
    Query {
        /// The epoch recovery resumes in.
        epoch: u64,
        /// Transactions asked about.
        txns: Vec<TxnId>,
        /// The writes asked about.
        keys: Vec<(TxnId, u32, u64)>,
    },
}

/// A response message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// The value of a Get with its metadata word (`KvMeta` raw).
    Get {
        /// Raw `KvMeta`.
        meta: u32,
        /// The transaction that installed this version (`None`: loaded). History
        /// instrumentation for the checker, not part of the paper's message: 1 or 13 bytes.
        writer: Option<TxnId>,
        /// Value bytes (empty if absent).
        value: Vec<u8>,
    },
    /// Lock granted or not, with the key's metadata when asked.
    Lock {
        /// Granted.
        granted: bool,
        /// Raw `KvMeta` at the replica.
        meta: u32,
    },
    /// Validation, replication or unlock: done / passed.
    Ack {
        /// Passed (validation) or done.
        ok: bool,
    },
    /// A page of a survivor's recovery state (`GATHER`).
    Gathered {
        /// More transactions follow this page (ask again after its last one).
        more: bool,
        /// The transactions, in [`TxnId`] order.
        txns: Vec<GatheredTxn>,
    },
    /// The answers to a `QUERY`, in order.
    Answered {
        /// Per transaction asked, its coordinator's decision ([`CoordinatorState::Undecided`]:
        /// not committed; [`CoordinatorState::Unknown`]: its coordinator is not here). May
        /// be fewer than asked (a reply fits one packet): ask again for the rest.
        decisions: Vec<CoordinatorState>,
        /// Per key asked: its current version was written by that transaction.
        written: Vec<bool>,
    },
}

impl Request {
    /// Its message type.
    #[must_use]
    pub fn msg_type(&self) -> u16 {
        match self {
            Request::Get { .. } => msg::GET,
            Request::Lock { .. } => msg::LOCK,
            Request::Validate { .. } => msg::VALIDATE,
            Request::Replicate { .. } => msg::REPLICATE,
            Request::Unlock { .. } => msg::UNLOCK,
            Request::Raise { .. } => msg::RAISE,
            Request::Gather { .. } => msg::GATHER,
            Request::Decide { .. } => msg::DECIDE,
            Request::Resume { .. } => msg::RESUME,
            Request::Query { .. } => msg::QUERY,
        }
    }

    /// Its payload bytes.
    #[must_use]
    pub fn emit(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(32);
        match self {
            Request::Get { table, key } => put_tk(&mut w, *table, *key),
            Request::Lock {
                txn,
                table,
                key,
                read,
                write,
                lock_set,
            } => {
                put_txn(&mut w, *txn);
                put_tk(&mut w, *table, *key);
                put_seen(&mut w, *read);
                put_write(&mut w, write.as_ref());
                w.put_u16(*lock_set);
            }
            Request::Validate { table, key, read } => {
                put_tk(&mut w, *table, *key);
                put_seen(&mut w, Some(*read));
            }
            Request::Replicate {
                txn,
                table,
                key,
                version,
                lower_readable,
                write,
            } => {
                put_txn(&mut w, *txn);
                put_tk(&mut w, *table, *key);
                w.put_u32(*version);
                w.put_u8(u8::from(*lower_readable));
                put_write(&mut w, Some(write));
            }
            Request::Unlock {
                txn,
                table,
                key,
                commit,
                apply,
            } => {
                put_txn(&mut w, *txn);
                put_tk(&mut w, *table, *key);
                w.put_u8(u8::from(*commit));
                match apply {
                    Some((version, write)) => {
                        w.put_u8(1);
                        w.put_u32(*version);
                        put_write(&mut w, Some(write));
                    }
                    None => w.put_u8(0),
                }
            }
            Request::Raise {
                txn,
                table,
                key,
                version,
            } => {
                put_txn(&mut w, *txn);
                put_tk(&mut w, *table, *key);
                w.put_u32(*version);
            }
            Request::Gather { .. }
            | Request::Decide { .. }
            | Request::Resume { .. }
            | Request::Query { .. } => self.emit_recovery(&mut w),
        }
        w
    }

    /// Parses the payload of a message of type `msg_type`.
    ///
    /// # Errors
    /// [`WireError`] on anything a sender of this module does not emit.
    pub fn parse(msg_type: u16, payload: &[u8]) -> Result<Self, WireError> {
        let mut r = ByteReader::new(payload);
        let req = match msg_type {
            msg::GET => {
                let (table, key) = r.tk()?;
                Request::Get { table, key }
            }
            msg::LOCK => {
                let txn = r.txn()?;
                let (table, key) = r.tk()?;
                let read = r.seen()?;
                let write = r.write()?;
                let lock_set = r.u16()?;
                Request::Lock {
                    txn,
                    table,
                    key,
                    read,
                    write,
                    lock_set,
                }
            }
            msg::VALIDATE => {
                let (table, key) = r.tk()?;
                let read = r.seen()?.ok_or(WireError::Invalid("read"))?;
                Request::Validate { table, key, read }
            }
            msg::REPLICATE => {
                let txn = r.txn()?;
                let (table, key) = r.tk()?;
                let version = r.u32()?;
                let lower_readable = r.flag("lower_readable")?;
                let write = r.write()?.ok_or(WireError::Invalid("write"))?;
                Request::Replicate {
                    txn,
                    table,
                    key,
                    version,
                    lower_readable,
                    write,
                }
            }
            msg::UNLOCK => {
                let txn = r.txn()?;
                let (table, key) = r.tk()?;
                let commit = r.flag("commit")?;
                let apply = if r.flag("apply")? {
                    let version = r.u32()?;
                    let write = r.write()?.ok_or(WireError::Invalid("write"))?;
                    Some((version, write))
                } else {
                    None
                };
                Request::Unlock {
                    txn,
                    table,
                    key,
                    commit,
                    apply,
                }
            }
            msg::RAISE => {
                let txn = r.txn()?;
                let (table, key) = r.tk()?;
                let version = r.u32()?;
                Request::Raise {
                    txn,
                    table,
                    key,
                    version,
                }
            }
            msg::GATHER | msg::DECIDE | msg::RESUME | msg::QUERY => {
                Self::parse_recovery(msg_type, &mut r)?
            }
            other => return Err(WireError::UnknownType(other)),
        };
        r.finish()?;
        Ok(req)
    }

    /// The payload of one of recovery's requests (§4.4).
    fn emit_recovery(&self, w: &mut impl ByteSink) {
        match self {
            Request::Gather { epoch, after } => {
                w.put_u64(*epoch);
                match after {
                    Some(t) => {
                        w.put_u8(1);
                        put_txn(w, *t);
                    }
                    None => w.put_u8(0),
                }
            }
            Request::Decide {
                txn,
                epoch,
                commit,
                writes,
            } => {
                put_txn(w, *txn);
                w.put_u64(*epoch);
                w.put_u8(u8::from(*commit));
                put_writes(w, writes);
            }
            Request::Resume { epoch } => w.put_u64(*epoch),
            Request::Query { epoch, txns, keys } => {
                w.put_u64(*epoch);
                put_len(w, txns.len());
                for t in txns {
                    put_txn(w, *t);
                }
                put_len(w, keys.len());
                for (txn, table, key) in keys {
                    put_txn(w, *txn);
                    put_tk(w, *table, *key);
                }
            }
            // The commit phase's requests: `emit` writes them.
            Request::Get { .. }
            | Request::Lock { .. }
            | Request::Validate { .. }
            | Request::Replicate { .. }
            | Request::Unlock { .. }
            | Request::Raise { .. } => {}
        }
    }

    /// Parses one of recovery's requests (§4.4), leaving the end check to `parse`.
    fn parse_recovery(msg_type: u16, r: &mut ByteReader<'_>) -> Result<Self, WireError> {
        Ok(match msg_type {
            msg::GATHER => {
                let epoch = r.u64()?;
                let after = if r.flag("after")? {
                    Some(r.txn()?)
                } else {
                    None
                };
                Request::Gather { epoch, after }
            }
            msg::DECIDE => {
                let txn = r.txn()?;
                let epoch = r.u64()?;
                let commit = r.flag("commit")?;
                let writes = r.writes()?;
                Request::Decide {
                    txn,
                    epoch,
                    commit,
                    writes,
                }
            }
            msg::RESUME => Request::Resume { epoch: r.u64()? },
            msg::QUERY => {
                let epoch = r.u64()?;
                let n = r.u16()?;
                let mut txns = Vec::with_capacity(usize::from(n).min(r.remaining() / 12));
                for _ in 0..n {
                    txns.push(r.txn()?);
                }
                let n = r.u16()?;
                // Each key takes 24 bytes: no allocation beyond what was sent.
                let mut keys = Vec::with_capacity(usize::from(n).min(r.remaining() / 24));
                for _ in 0..n {
                    let txn = r.txn()?;
                    let (table, key) = r.tk()?;
                    keys.push((txn, table, key));
                }
                Request::Query { epoch, txns, keys }
            }
            other => return Err(WireError::UnknownType(other)),
        })
    }
}

impl Response {
    /// Its payload bytes (the message type is the request's).
    #[must_use]
    pub fn emit(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(8);
        match self {
            Response::Get {
                meta,
                writer,
                value,
            } => {
                w.put_u32(*meta);
                match writer {
                    Some(t) => {
                        w.put_u8(1);
                        put_txn(&mut w, *t);
                    }
                    None => w.put_u8(0),
                }
                w.put_bytes(value);
            }
            Response::Lock { granted, meta } => {
                w.put_u8(u8::from(*granted));
                w.put_u32(*meta);
            }
            Response::Ack { ok } => w.put_u8(u8::from(*ok)),
            Response::Gathered { more, txns } => {
                w.put_u8(u8::from(*more));
                put_len(&mut w, txns.len());
                for t in txns {
                    put_gathered_txn(&mut w, t);
                }
            }
            Response::Answered { decisions, written } => {
                put_len(&mut w, decisions.len());
                for d in decisions {
                    put_coordinator(&mut w, d);
                }
                put_len(&mut w, written.len());
                for b in written {
                    w.put_u8(u8::from(*b));
                }
            }
        }
        w
    }

    /// Parses the response to a request of type `msg_type`.
    ///
    /// # Errors
    /// [`WireError`] on anything [`Response::emit`] does not emit.
    pub fn parse(msg_type: u16, payload: &[u8]) -> Result<Self, WireError> {
        let mut r = ByteReader::new(payload);
        let resp = match msg_type {
            msg::GET => {
                let meta = r.u32()?;
                let writer = if r.flag("writer")? {
                    Some(r.txn()?)
                } else {
                    None
                };
                let value = r.rest().to_vec();
                Response::Get {
                    meta,
                    writer,
                    value,
                }
            }
            msg::LOCK => {
                let granted = r.flag("granted")?;
                let meta = r.u32()?;
                Response::Lock { granted, meta }
            }
            msg::VALIDATE
            | msg::REPLICATE
            | msg::UNLOCK
            | msg::RAISE
            | msg::DECIDE
            | msg::RESUME => Response::Ack { ok: r.flag("ok")? },
            msg::GATHER => {
                let more = r.flag("more")?;
                let n = r.u16()?;
                // Each transaction takes at least 15 bytes.
                let mut txns = Vec::with_capacity(usize::from(n).min(r.remaining() / 15));
                for _ in 0..n {
                    txns.push(r.gathered_txn()?);
                }
                Response::Gathered { more, txns }
            }
            msg::QUERY => {
                let n = r.u16()?;
                let mut decisions = Vec::with_capacity(usize::from(n).min(r.remaining()));
                for _ in 0..n {
                    decisions.push(r.coordinator()?);
                }
                let n = r.u16()?;
                let mut written = Vec::with_capacity(usize::from(n).min(r.remaining()));
                for _ in 0..n {
                    written.push(r.flag("written")?);
                }
                Response::Answered { decisions, written }
            }
            other => return Err(WireError::UnknownType(other)),
        };
        r.finish()?;
        Ok(resp)
    }
}

fn put_len(w: &mut impl ByteSink, n: usize) {
    let n = u16::try_from(n).expect("a recovery message lists < 64 Ki items");
    w.put_u16(n);
}

fn put_writes(w: &mut impl ByteSink, writes: &[DecidedWrite]) {
    put_len(w, writes.len());
    for (table, key, version, write) in writes {
        put_tk(w, *table, *key);
        w.put_u32(*version);
        put_write(w, Some(write));
    }
}

fn put_coordinator(w: &mut impl ByteSink, c: &CoordinatorState) {
    match c {
        CoordinatorState::Unknown => w.put_u8(0),
        CoordinatorState::Undecided => w.put_u8(1),
        CoordinatorState::Committed(writes) => {
            w.put_u8(2);
            put_writes(w, writes);
        }
    }
}

/// Its size in a `QUERY` reply, bytes.
#[must_use]
pub fn coordinator_len(c: &CoordinatorState) -> usize {
    let mut w = Vec::new();
    put_coordinator(&mut w, c);
    w.len()
}

fn put_gathered_txn(w: &mut impl ByteSink, t: &GatheredTxn) {
    put_txn(w, t.txn);
    put_coordinator(w, &t.coordinator);
    put_len(w, t.entries.len());
    for e in &t.entries {
        put_tk(w, e.table, e.key);
        w.put_u8(u8::from(e.locked) | (u8::from(e.applied) << 1));
        w.put_u16(e.lock_set);
        w.put_u32(e.version);
        put_write(w, e.write.as_ref());
    }
}

fn put_tk(w: &mut impl ByteSink, table: u32, key: u64) {
    w.put_u32(table);
    w.put_u64(key);
}

fn put_txn(w: &mut impl ByteSink, txn: TxnId) {
    w.put_u32(txn.coordinator.0);
    w.put_u64(txn.seq);
}

fn put_seen(w: &mut impl ByteSink, seen: Option<Seen>) {
    match seen {
        Some(s) => {
            w.put_u32(s.version);
            w.put_u8(1 | (u8::from(s.present) << 1));
        }
        None => {
            w.put_u32(0);
            w.put_u8(0);
        }
    }
}

fn put_write(w: &mut impl ByteSink, write: Option<&WriteOp>) {
    match write {
        None => w.put_u8(0),
        Some(op) => {
            w.put_u8(match op.kind {
                WriteKind::Update => 1,
                WriteKind::Insert => 2,
                WriteKind::Delete => 3,
            });
            let len = u16::try_from(op.value.len()).expect("values are at most 64 KiB");
            w.put_u16(len);
            w.put_bytes(&op.value);
        }
    }
}

/// The protocol's compound fields, read with [`ByteReader`]'s checked primitives.
trait ReadFields {
    fn flag(&mut self, field: &'static str) -> Result<bool, WireError>;
    fn tk(&mut self) -> Result<(u32, u64), WireError>;
    fn txn(&mut self) -> Result<TxnId, WireError>;
    fn seen(&mut self) -> Result<Option<Seen>, WireError>;
    fn write(&mut self) -> Result<Option<WriteOp>, WireError>;
    fn writes(&mut self) -> Result<Vec<DecidedWrite>, WireError>;
    fn coordinator(&mut self) -> Result<CoordinatorState, WireError>;
    fn gathered_txn(&mut self) -> Result<GatheredTxn, WireError>;
}

impl ReadFields for ByteReader<'_> {
    fn flag(&mut self, field: &'static str) -> Result<bool, WireError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(WireError::Invalid(field)),
        }
    }
    fn tk(&mut self) -> Result<(u32, u64), WireError> {
        Ok((self.u32()?, self.u64()?))
    }
    fn txn(&mut self) -> Result<TxnId, WireError> {
        let coordinator = CoordinatorId(self.u32()?);
        let seq = self.u64()?;
        Ok(TxnId { coordinator, seq })
    }
    fn seen(&mut self) -> Result<Option<Seen>, WireError> {
        let version = self.u32()?;
        match self.u8()? {
            0 if version == 0 => Ok(None),
            f @ (1 | 3) => Ok(Some(Seen {
                version,
                present: f == 3,
            })),
            _ => Err(WireError::Invalid("read")),
        }
    }
    fn write(&mut self) -> Result<Option<WriteOp>, WireError> {
        let kind = match self.u8()? {
            0 => return Ok(None),
            1 => WriteKind::Update,
            2 => WriteKind::Insert,
            3 => WriteKind::Delete,
            _ => return Err(WireError::Invalid("write kind")),
        };
        let len = usize::from(self.u16()?);
        let value = self.bytes(len)?.to_vec();
        Ok(Some(WriteOp { kind, value }))
    }
    fn writes(&mut self) -> Result<Vec<DecidedWrite>, WireError> {
        let n = self.u16()?;
        // Each write takes at least 19 bytes: no allocation beyond what was sent.
        let mut writes = Vec::with_capacity(usize::from(n).min(self.remaining() / 19));
        for _ in 0..n {
            let (table, key) = self.tk()?;
            let version = self.u32()?;
            let write = self.write()?.ok_or(WireError::Invalid("write"))?;
            writes.push((table, key, version, write));
        }
        Ok(writes)
    }
    fn coordinator(&mut self) -> Result<CoordinatorState, WireError> {
        Ok(match self.u8()? {
            0 => CoordinatorState::Unknown,
            1 => CoordinatorState::Undecided,
            2 => CoordinatorState::Committed(self.writes()?),
            _ => return Err(WireError::Invalid("coordinator state")),
        })
    }
    fn gathered_txn(&mut self) -> Result<GatheredTxn, WireError> {
        let txn = self.txn()?;
        let coordinator = self.coordinator()?;
        let n = self.u16()?;
        // Each entry takes at least 20 bytes.
        let mut entries = Vec::with_capacity(usize::from(n).min(self.remaining() / 20));
        for _ in 0..n {
            let (table, key) = self.tk()?;
            let flags = self.u8()?;
            if flags > 3 {
                return Err(WireError::Invalid("entry flags"));
            }
            entries.push(GatheredEntry {
                table,
                key,
                locked: flags & 1 != 0,
                applied: flags & 2 != 0,
                lock_set: self.u16()?,
                version: self.u32()?,
                write: self.write()?,
            });
        }
        Ok(GatheredTxn {
            txn,
            coordinator,
            entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck_macros::quickcheck;

    fn txn(c: u32, s: u64) -> TxnId {
        TxnId {
            coordinator: CoordinatorId(c),
            seq: s,
        }
    }

    fn kind(k: u8) -> WriteKind {
        match k % 3 {
            0 => WriteKind::Update,
            1 => WriteKind::Insert,
            _ => WriteKind::Delete,
        }
    }

    #[quickcheck]
    fn requests_round_trip(
        (c, s): (u32, u64),
        t: u32,
        k: u64,
        v: u32,
        b: bool,
        wk: u8,
        value: Vec<u8>,
    ) {
        let write = WriteOp {
            kind: kind(wk),
            value,
        };
        let reqs = [
            Request::Get { table: t, key: k },
            Request::Lock {
                txn: txn(c, s),
                table: t,
                key: k,
                read: b.then_some(Seen {
                    version: v,
                    present: !b,
                }),
                write: (!b).then(|| write.clone()),
                lock_set: v as u16,
            },
            Request::Validate {
                table: t,
                key: k,
                read: Seen {
                    version: v,
                    present: b,
                },
            },
            Request::Replicate {
                txn: txn(c, s),
                table: t,
                key: k,
                version: v,
                lower_readable: b,
                write: write.clone(),
            },
            Request::Unlock {
                txn: txn(c, s),
                table: t,
                key: k,
                commit: b,
                apply: b.then(|| (v, write.clone())),
            },
            Request::Raise {
                txn: txn(c, s),
                table: t,
                key: k,
                version: v,
            },
            Request::Gather {
                epoch: k,
                after: b.then(|| txn(c, s)),
            },
            Request::Query {
                epoch: k,
                txns: vec![txn(c, s), txn(!c, s)],
                keys: vec![(txn(c, s), t, k), (txn(c ^ 1, !s), t, !k)],
            },
            Request::Decide {
                txn: txn(c, s),
                epoch: k,
                commit: b,
                writes: vec![(t, k, v, write.clone()), (t ^ 1, !k, v, write.clone())],
            },
            Request::Resume { epoch: k },
        ];
        for r in reqs {
            let bytes = r.emit();
            for n in 0..bytes.len() {
                assert!(
                    matches!(
                        Request::parse(r.msg_type(), &bytes[..n]),
                        Err(WireError::Truncated { .. })
                    ),
                    "{r:?} cut at {n}"
                );
            }
            assert_eq!(Request::parse(r.msg_type(), &bytes), Ok(r));
        }
    }

    #[quickcheck]
    fn responses_round_trip(meta: u32, b: bool, value: Vec<u8>) {
        let gathered = vec![
            GatheredEntry {
                table: meta,
                key: u64::from(meta) << 3,
                locked: b,
                applied: !b,
                lock_set: meta as u16,
                version: meta >> 3,
                write: b.then(|| WriteOp {
                    kind: WriteKind::Insert,
                    value: value.clone(),
                }),
            };
            2
        ];
        for (ty, r) in [
            (
                msg::GET,
                Response::Get {
                    meta,
                    writer: b.then(|| txn(meta, u64::from(meta))),
                    value: value.clone(),
                },
            ),
            (msg::LOCK, Response::Lock { granted: b, meta }),
            (msg::UNLOCK, Response::Ack { ok: b }),
            (msg::DECIDE, Response::Ack { ok: b }),
            (
                msg::QUERY,
                Response::Answered {
                    decisions: vec![
                        CoordinatorState::Unknown,
                        CoordinatorState::Committed(vec![(
                            meta,
                            1,
                            2,
                            WriteOp {
                                kind: WriteKind::Delete,
                                value: Vec::new(),
                            },
                        )]),
                        CoordinatorState::Undecided,
                    ],
                    written: vec![b, !b, b],
                },
            ),
            (
                msg::GATHER,
                Response::Gathered {
                    more: b,
                    txns: vec![
                        GatheredTxn {
                            txn: txn(meta, 1),
                            coordinator: CoordinatorState::Unknown,
                            entries: Vec::new(),
                        },
                        GatheredTxn {
                            txn: txn(meta, 2),
                            coordinator: CoordinatorState::Undecided,
                            entries: gathered.clone(),
                        },
                        GatheredTxn {
                            txn: txn(!meta, 3),
                            coordinator: CoordinatorState::Committed(vec![(
                                meta,
                                u64::from(meta),
                                meta >> 3,
                                WriteOp {
                                    kind: WriteKind::Update,
                                    value: value.clone(),
                                },
                            )]),
                            entries: gathered.clone(),
                        },
                    ],
                },
            ),
        ] {
            assert_eq!(Response::parse(ty, &r.emit()), Ok(r));
        }
    }

    #[quickcheck]
    fn garbage_never_panics(ty: u16, bytes: Vec<u8>) {
        let _ = Request::parse(ty % 12, &bytes);
        let _ = Response::parse(ty % 12, &bytes);
    }

    #[test]
    fn bad_payloads_are_typed_errors() {
        let get = Request::Get { table: 1, key: 2 }.emit();
        assert_eq!(
            Request::parse(msg::GET, &get[..5]),
            Err(WireError::Truncated { needed: 7 })
        );
        let mut long = get.clone();
        long.push(0);
        assert_eq!(Request::parse(msg::GET, &long), Err(WireError::Trailing(1)));
        assert_eq!(Request::parse(99, &get), Err(WireError::UnknownType(99)));
        assert_eq!(
            Response::parse(msg::UNLOCK, &[2]),
            Err(WireError::Invalid("ok"))
        );
    }
}
