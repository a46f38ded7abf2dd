//! A FORD/Pandora transaction's state as plain data, and every decision over it that needs
//! no fabric: what a round answers locally, which validation READs to post and how to
//! judge what they return, the log images (Pandora §3.1.4, FORD's undo logs), the commit
//! and release WRITEs, the abort path's truncation and unlocks. The async shell
//! ([`crate::txn`]) posts what these build and feeds back what came back.
//!
//! FORD's six bug switches (Pandora Table 1, §5.1) are read here only (covert locks in
//! [`logic::validate_item`]): the shell asks which locks an abort releases, whether it
//! truncates, whether inserts are logged, whether undo records go out before the lock
//! CASes are judged, and where a commit puts its validation and logs ([`CommitSchedule`]).

use dmem_layout::log::{DataLogEntry, LogOp, LogRegionHeader, LogWriter};
use dmem_layout::pill::FailedCoordinatorSet;
use dmem_layout::record::{
    DataItem, DataItemHeader, DataVersion, ItemFlags, RemoteAddr as PackedAddr,
};
use dmem_txn::{
    AbortReason, Access, CoordinatorId, Key, ReadEvent, ReadReq, TableId, TxnError, TxnId, Version,
    WriteEvent, WriteKind,
};
use dmem_verbs::{Phase, PostList, RemoteAddr, WrId};

use crate::config::{FordBug, Protocol, ProtocolConfig};
use crate::logic::{self, LoggedTxn, LoggedWrite};
use crate::round::{Fetch, Located};
use crate::store::{BucketLoc, ItemLoc, Store, encode_item_by, parse_bucket};
use crate::wire;

/// What the state's decisions need to know about the coordinator running the transaction.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Env<'a> {
    pub(crate) store: &'a Store,
    pub(crate) cfg: &'a ProtocolConfig,
    pub(crate) coordinator: u16,
    pub(crate) epoch: u64,
    pub(crate) seq: u64,
}

// -- FORD's bug switches (Pandora Table 1, §5.1) as decisions: the shell asks these (and
// `logic::validate_item` for covert locks), never a switch itself. --

/// Whether an undo log holds inserts: Pandora §5.1 "Missing actions" (C2) fix. Off under
/// the missing-insert-log bug, so recovery cannot undo a half-applied insert.
pub(crate) fn logs_insert(cfg: &ProtocolConfig) -> bool {
    !cfg.bug(FordBug::MissingInsertLog)
}

/// Whether the undo records of the locks a batch just CASed go out before the coordinator
/// has looked at what the CASes returned: the log-without-lock corner case of Pandora
/// §5.1 (C2), a log for a lock that may never be held. The fixed protocol logs only in
/// its logging phase, after validation (lock-to-log order).
pub(crate) fn logs_before_lock_results(cfg: &ProtocolConfig) -> bool {
    cfg.bug(FordBug::LogWithoutLock)
}

/// Whether an abort clears its log's state byte (Pandora §3.1.5 (3)). FORD under the
/// lost-decision bug leaves the logs of aborted transactions for recovery to misread.
pub(crate) fn abort_truncates(cfg: &ProtocolConfig) -> bool {
    !cfg.bug(FordBug::LostDecision)
}

/// Whether an abort releases a write-set entry's lock in state `lock`: only one acquired
/// (Pandora §5.1 C1 fix), or under the complicit-abort bug every one of the write set,
/// including a lock another transaction holds.
pub(crate) fn abort_releases(cfg: &ProtocolConfig, lock: LockState) -> bool {
    match lock {
        LockState::Held => true,
        LockState::Failed | LockState::Deferred => cfg.bug(FordBug::ComplicitAbort),
    }
}

// -- FORD's public code's extra commit verbs (`ProtocolConfig::artifact`, not a bug): the
// shell asks these, never the switch itself. --

/// Whether each replica's commit WRITE of an item is preceded by an 8-byte WRITE of its
/// lock word (FORD's code: the "invisible" word of `IssueCommitAllSelectFlush`). dmem's
/// FORD writes the item only, whose image leaves the lock word as it is.
pub(crate) fn commit_writes_lock_words(cfg: &ProtocolConfig) -> bool {
    cfg.artifact
}

/// Whether the commit batch READs each backup of the last written record once (FORD's
/// code: the selective remote flush, `RFLUSH = 2`). dmem's MN memory needs no flush.
pub(crate) fn commit_flushes_backups(cfg: &ProtocolConfig) -> bool {
    cfg.artifact
}

/// Whether the release WRITEs the lock word of every backup as well as the primary's
/// (FORD's code: `CheckCommitAll` releases every replica it wrote). dmem's FORD locks and
/// releases the primary only.
pub(crate) fn release_writes_backups(cfg: &ProtocolConfig) -> bool {
    cfg.artifact
}

/// The flush READ's length: FORD's `RFlushReadSize`.
const FLUSH_READ_LEN: u32 = 1;

/// Where a commit puts its validation READs and undo-log WRITEs around the commit-time
/// lock batch of its blind writes (Pandora §2.3 steps 2 and 3, §3.1.4), FORD's bugs
/// applied (§5.1): the fixed protocol locks, then validates, then logs, each strictly
/// after the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CommitSchedule {
    /// The validation READs go in the lock batch, ahead of its CASes (relaxed locks:
    /// validation overlaps locking).
    pub(crate) validate_with_locks: bool,
    /// The validation READs go in a batch of their own once every lock is held (fixed).
    pub(crate) validate_after_locks: bool,
    /// The blind writes' undo records, with the images read in execution, go in the lock
    /// batch beside their CASes (log-without-lock).
    pub(crate) early_log_with_locks: bool,
    /// The undo logs go in the lock batch (relaxed locks and lost decision together).
    pub(crate) log_with_locks: bool,
    /// The undo logs go with the validation READs (lost decision: FORD's background
    /// logging, Pandora Fig. 2).
    pub(crate) log_with_validation: bool,
    /// A logging phase once validation succeeded (§3.1.4; none under lost decision).
    pub(crate) logging_phase: bool,
}

impl CommitSchedule {
    /// The schedule under `cfg` of a commit that is a `single_read` (FORD's `TxCommit`: a
    /// read-only transaction of one record is not validated) and has `deferred` locks.
    pub(crate) fn new(cfg: &ProtocolConfig, single_read: bool, deferred: bool) -> Self {
        let relaxed = cfg.bug(FordBug::RelaxedLocks);
        let lost = cfg.bug(FordBug::LostDecision);
        let validate_after_locks = !relaxed && !single_read;
        Self {
            validate_with_locks: relaxed && !single_read,
            validate_after_locks,
            early_log_with_locks: cfg.bug(FordBug::LogWithoutLock) && deferred,
            log_with_locks: relaxed && lost,
            log_with_validation: validate_after_locks && lost,
            logging_phase: !lost,
        }
    }

    /// The lock batch's phase: a batch that carries log WRITEs says so, since crash
    /// injection aims at the log writes of attempts that may still abort (§5.1, C2).
    pub(crate) fn lock_phase(&self) -> Phase {
        if self.early_log_with_locks || self.log_with_locks {
            Phase::CommitLockAndLog
        } else {
            Phase::CommitLock
        }
    }

    /// The validation batch's phase.
    pub(crate) fn validation_phase(&self) -> Phase {
        if self.log_with_validation {
            Phase::ValidateAndLog
        } else {
            Phase::Validate
        }
    }
}

/// What the lock batch of an insert does with the index slot it claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotAccess {
    /// Nothing (the record is known).
    None,
    /// READ it (a slot-fixed table: the lock on the slot's own record arbitrates).
    Read,
    /// CAS its address word from empty to this packed address (a pooled table).
    Claim(u64),
}

/// What the lock batch saw of the slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SlotSeen {
    /// The slot's 16 bytes ([`SlotAccess::Read`]).
    Bytes(Vec<u8>),
    /// The address word the CAS found ([`SlotAccess::Claim`]; 0: the CAS won).
    Address(u64),
}

/// Judges the index slot an insert of `key` locked its record with, the record as read
/// under the lock being `valid` or not: `Ok(true)` when the slot is still free and must be
/// WRITTEN to every replica, `Ok(false)` when it already names the record (a won slot CAS
/// is named on every replica by the lock step itself).
///
/// # Errors
/// Another insert holds the slot (a retry finds what it holds), the key is present, or
/// the lock batch did not look at the slot.
pub(crate) fn slot_verdict(
    seen: Option<&SlotSeen>,
    key: Key,
    valid: bool,
) -> Result<bool, TxnError> {
    let taken = TxnError::Aborted(AbortReason::IndexSlotTakenByConcurrentInsert);
    match seen {
        Some(SlotSeen::Address(old)) => {
            // 0: won, and the record is fresh, so the key is absent.
            if *old != 0 {
                return Err(taken);
            }
            if valid {
                return Err(TxnError::KeyState(key.0));
            }
            Ok(false)
        }
        Some(SlotSeen::Bytes(slot_bytes)) => {
            let slot_key = slot_bytes
                .get(0..8)
                .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
            let slot_used = slot_bytes
                .get(8..16)
                .is_some_and(|b| b.iter().any(|&x| x != 0));
            if slot_used && slot_key != key.0 {
                return Err(taken);
            }
            if valid {
                return Err(TxnError::KeyState(key.0));
            }
            // Claimed on every replica next; the item stays invalid (absent) until commit,
            // so readers that find the slot see the key as absent.
            Ok(!slot_used)
        }
        None => Err(TxnError::Aborted(AbortReason::IndexSlotNotSeen)),
    }
}

/// What a stealing CAS (PILL, Pandora §3.1.2) that expected `observed` and found `got`
/// means in execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterSteal {
    /// The lock is ours.
    Stolen,
    /// Released meanwhile: an ordinary acquire must win it; abort.
    ChangedHands,
    /// Another word: decide again on it.
    Again(u64),
}

pub(crate) fn after_steal(observed: u64, got: u64) -> AfterSteal {
    if got == observed {
        AfterSteal::Stolen
    } else if got == 0 {
        AfterSteal::ChangedHands
    } else {
        AfterSteal::Again(got)
    }
}

/// What an execution READ of a read-only item showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReadSeen {
    /// Usable: its value (`None`: absent), and whether a stray lock was ignored (PILL).
    Value { value: Option<Vec<u8>>, stray: bool },
    /// Locked by a live coordinator: abort (FORD's execution, Pandora §2.3 step 1).
    Locked,
}

pub(crate) struct ItemRead {
    pub(crate) lock: u64,
    pub(crate) version: DataVersion,
    pub(crate) valid: bool,
    pub(crate) value: Vec<u8>,
    /// The transaction that installed the version (`None`: loaded, or unknown).
    pub(crate) writer: Option<TxnId>,
}

pub(crate) fn parse_item(bytes: &[u8], table: TableId, key: Key) -> Result<ItemRead, TxnError> {
    let item =
        DataItem::new_checked(bytes).map_err(|_| TxnError::Aborted(AbortReason::MalformedItem))?;
    let h = item.header();
    let fresh = h.key() == 0 && h.table_id() == 0 && !h.flags().is_valid();
    if !fresh && (h.key() != key.0 || h.table_id() != table.0) {
        return Err(TxnError::Aborted(AbortReason::IndexPointsAtAnotherRecord));
    }
    Ok(ItemRead {
        lock: h.lock_word(),
        version: h.version(),
        valid: h.flags().is_valid() && !h.version().is_invisible(),
        value: item.value().to_vec(),
        writer: DataItemHeader::unpack_writer(h.writer()).map(|(c, seq)| TxnId {
            coordinator: CoordinatorId(u32::from(c)),
            seq,
        }),
    })
}

/// The current primary's address of `loc`.
pub(crate) fn primary_addr(store: &Store, loc: &ItemLoc) -> Result<RemoteAddr, TxnError> {
    let p = store
        .primary(loc.bucket.partition)
        .map_err(TxnError::from)?;
    Ok(store.addr(p, loc.offset))
}

/// One log image of `undo_bytes` holding the undo records of `entries` (old version and
/// value; an entry without an old image logs version 0 and no value).
fn undo_image(
    env: &Env<'_>,
    undo_bytes: usize,
    entries: &[&WriteEntry],
) -> Result<Vec<u8>, TxnError> {
    let mut buf = vec![0u8; undo_bytes];
    let mut writer = LogWriter::new(&mut buf, env.coordinator, env.epoch, env.seq)
        .map_err(|_| TxnError::Aborted(AbortReason::LogRegionTooSmall))?;
    for w in entries {
        let old = w
            .old
            .as_ref()
            .map_or((DataVersion::from_raw(0), &[][..]), |o| {
                (o.version, &o.value[..])
            });
        let op = match w.intent {
            Intent::Write(WriteKind::Insert) => LogOp::Insert,
            Intent::Write(WriteKind::Delete) => LogOp::Delete,
            _ => LogOp::Update,
        };
        let entry = DataLogEntry {
            op,
            table_id: w.table.0,
            key: w.key.0,
            addr: logic::pack_location(w.loc.bucket.partition, w.loc.offset),
            version: old.0.to_raw(),
        };
        writer
            .append_undo(&entry, old.1)
            .map_err(|_| TxnError::Aborted(AbortReason::LogRegionFull))?;
    }
    let len = writer.finish().len();
    buf.truncate(len);
    Ok(buf)
}

#[derive(Debug, Clone)]
pub(crate) enum ReadTarget {
    Item { loc: ItemLoc, version: u64 },
    Absent { bucket: BucketLoc },
}

#[derive(Debug, Clone)]
pub(crate) struct ReadEntry {
    pub(crate) table: TableId,
    pub(crate) key: Key,
    pub(crate) target: ReadTarget,
    pub(crate) value: Option<Vec<u8>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockState {
    /// Blind write: the lock is taken at commit.
    Deferred,
    Held,
    /// The CAS failed: never held (complicit abort releases it anyway).
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Intent {
    /// Locked by read_for_update, not written (yet).
    LockOnly,
    Write(WriteKind),
}

#[derive(Debug, Clone)]
pub(crate) struct OldImage {
    pub(crate) version: DataVersion,
    pub(crate) valid: bool,
    pub(crate) value: Vec<u8>,
}

#[derive(Debug, Clone)]
pub(crate) struct WriteEntry {
    pub(crate) table: TableId,
    pub(crate) key: Key,
    pub(crate) loc: ItemLoc,
    pub(crate) lock: LockState,
    pub(crate) intent: Intent,
    pub(crate) old: Option<OldImage>,
    pub(crate) new_value: Vec<u8>,
}

/// A transaction's read set, write set, recorded reads and log bookkeeping.
#[derive(Debug, Default)]
pub(crate) struct TxnState {
    pub(crate) reads: Vec<ReadEntry>,
    pub(crate) writes: Vec<WriteEntry>,
    pub(crate) events: Vec<ReadEvent>,
    /// MN indices holding a valid log of this transaction.
    pub(crate) logged: Vec<u16>,
    /// Addresses in this transaction's lock log (traditional lock logging only).
    pub(crate) lock_log: Vec<PackedAddr>,
    /// Keys a round found absent, with their bucket and its first free slot then, for an
    /// insert that follows.
    pub(crate) absent: Vec<(TableId, Key, BucketLoc, Option<usize>)>,
}

impl TxnState {
    /// Remembers that a round found `(table, key)` absent in `bucket`.
    pub(crate) fn note_absent(
        &mut self,
        table: TableId,
        key: Key,
        bucket: BucketLoc,
        free: Option<usize>,
    ) {
        self.absent.retain(|a| (a.0, a.1) != (table, key));
        self.absent.push((table, key, bucket, free));
    }

    /// What a round saw of an absent key, once.
    pub(crate) fn take_absent(
        &mut self,
        table: TableId,
        key: Key,
    ) -> Option<(BucketLoc, Option<usize>)> {
        let i = self
            .absent
            .iter()
            .position(|a| (a.0, a.1) == (table, key))?;
        let (_, _, bucket, free) = self.absent.swap_remove(i);
        Some((bucket, free))
    }

    pub(crate) fn write_entry(&self, table: TableId, key: Key) -> Option<usize> {
        self.writes
            .iter()
            .position(|w| w.table == table && w.key == key)
    }
    pub(crate) fn current_value(&self, w: &WriteEntry) -> Option<Vec<u8>> {
        match w.intent {
            Intent::Write(WriteKind::Delete) => None,
            Intent::Write(_) => Some(w.new_value.clone()),
            Intent::LockOnly => w.old.as_ref().filter(|o| o.valid).map(|o| o.value.clone()),
        }
    }
    /// Records a read for the history: the version's counter and, when the item named it,
    /// the transaction that installed it.
    pub(crate) fn note_read(
        &mut self,
        table: TableId,
        key: Key,
        version: u64,
        writer: Option<TxnId>,
    ) {
        let event = ReadEvent::new(table, key, Version(version));
        self.events.push(match writer {
            Some(w) => event.written_by(w),
            None => event,
        });
    }
    pub(crate) fn push_lock_entry(
        &mut self,
        table: TableId,
        key: Key,
        loc: ItemLoc,
        item: &ItemRead,
    ) -> usize {
        let old = Some(OldImage {
            version: item.version,
            valid: item.valid,
            value: item.value.clone(),
        });
        if let Some(i) = self.write_entry(table, key) {
            self.writes[i].old = old;
            return i;
        }
        self.writes.push(WriteEntry {
            table,
            key,
            loc,
            lock: LockState::Failed,
            intent: Intent::LockOnly,
            old,
            new_value: Vec::new(),
        });
        self.writes.len() - 1
    }
    /// Records the lock CAS of `(table, key)` at `loc` that returned `old`, its item READ
    /// in the same doorbell having returned `bytes`: the entry with its old image, held if
    /// the CAS found the lock free. Recorded before anything is judged, so that an abort
    /// releases every lock the batch took. Returns the entry's index.
    pub(crate) fn record_lock_attempt(
        &mut self,
        table: TableId,
        key: Key,
        loc: ItemLoc,
        old: u64,
        bytes: &[u8],
    ) -> Result<usize, TxnError> {
        let item = parse_item(bytes, table, key)?;
        let idx = self.push_lock_entry(table, key, loc, &item);
        if old == 0 {
            self.writes[idx].lock = LockState::Held;
        }
        Ok(idx)
    }

    /// Entry `idx` is locked, `item` as read under its lock.
    pub(crate) fn hold(&mut self, idx: usize, item: &ItemRead) {
        let w = &mut self.writes[idx];
        w.lock = LockState::Held;
        w.old = Some(OldImage {
            version: item.version,
            valid: item.valid,
            value: item.value.clone(),
        });
    }

    /// A blind write (Pandora §2.3: FORD locks it at commit).
    pub(crate) fn push_deferred(&mut self, table: TableId, key: Key, loc: ItemLoc, value: &[u8]) {
        self.writes.push(WriteEntry {
            table,
            key,
            loc,
            lock: LockState::Deferred,
            intent: Intent::Write(WriteKind::Update),
            old: None,
            new_value: value.to_vec(),
        });
    }

    /// Stages an insert (with `value`) or a delete on the entry of `(table, key)` just
    /// locked, the item read under the lock being `valid` or not.
    ///
    /// # Errors
    /// [`TxnError::KeyState`] for a delete of an absent record or an insert of a present
    /// one.
    pub(crate) fn stage_locked(
        &mut self,
        table: TableId,
        key: Key,
        kind: WriteKind,
        value: &[u8],
        valid: bool,
    ) -> Result<(), TxnError> {
        let present = kind != WriteKind::Insert;
        if valid != present {
            return Err(TxnError::KeyState(key.0));
        }
        let i = self.write_entry(table, key).unwrap_or(0);
        self.writes[i].intent = Intent::Write(kind);
        if kind == WriteKind::Insert {
            self.writes[i].new_value = value.to_vec();
        }
        Ok(())
    }

    /// Takes the round's fetches found absent from the index: each is remembered for an
    /// insert that follows and validated at commit by a READ of its bucket (read or for
    /// update: the insert that may follow locks a slot of its own). Returns the round's
    /// values so far, one per fetch (`None` until fetched).
    pub(crate) fn absorb_absent(&mut self, fetches: &[Fetch]) -> Vec<Option<Vec<u8>>> {
        for f in fetches {
            let Some(Located::Absent { bucket, free }) = f.located else {
                continue;
            };
            self.note_absent(f.table, f.key, bucket, free);
            if !self
                .reads
                .iter()
                .any(|e| e.table == f.table && e.key == f.key)
            {
                self.reads.push(ReadEntry {
                    table: f.table,
                    key: f.key,
                    target: ReadTarget::Absent { bucket },
                    value: None,
                });
                self.note_read(f.table, f.key, 0, None);
            }
        }
        vec![None; fetches.len()]
    }

    /// Takes an execution READ of read-only `(table, key)` at `loc` (Pandora §2.3 step 1,
    /// §3.1.2): a lock of a live coordinator aborts; otherwise (a stray lock ignored under
    /// PILL) the read joins the read set for validation.
    ///
    /// # Errors
    /// A malformed item, or one of another record.
    pub(crate) fn absorb_read(
        &mut self,
        (table, key, loc): (TableId, Key, ItemLoc),
        bytes: &[u8],
        failed: &FailedCoordinatorSet,
        cfg: &ProtocolConfig,
    ) -> Result<ReadSeen, TxnError> {
        let item = parse_item(bytes, table, key)?;
        if !logic::read_may_proceed(item.lock, failed, cfg) {
            return Ok(ReadSeen::Locked);
        }
        let value = item.valid.then_some(item.value);
        self.reads.push(ReadEntry {
            table,
            key,
            target: ReadTarget::Item {
                loc,
                version: item.version.to_raw(),
            },
            value: value.clone(),
        });
        self.note_read(table, key, item.version.counter(), item.writer);
        Ok(ReadSeen::Value {
            value,
            stray: item.lock != 0,
        })
    }

    /// The write-set entries whose lock is deferred to commit (blind writes).
    pub(crate) fn deferred(&self) -> Vec<usize> {
        (0..self.writes.len())
            .filter(|&i| self.writes[i].lock == LockState::Deferred)
            .collect()
    }

    /// FORD's `TxCommit`: a read-only transaction of one record commits without
    /// validation (its single READ is atomic: it aborted if the item was locked).
    pub(crate) fn single_read(&self) -> bool {
        self.writes.is_empty() && self.reads.len() == 1
    }

    /// Whether any entry is written (not only locked).
    pub(crate) fn has_writes(&self) -> bool {
        self.writes
            .iter()
            .any(|w| matches!(w.intent, Intent::Write(_)))
    }

    /// Under log-without-lock: the old images of the blind writes `deferred`, as their
    /// records were read in execution, for the undo records that go out beside their
    /// commit-time lock CASes (Pandora §5.1 "Logging without locking"). An entry never
    /// read keeps no image.
    pub(crate) fn old_images_from_reads(&mut self, deferred: &[usize]) {
        for &i in deferred {
            let (table, key) = (self.writes[i].table, self.writes[i].key);
            let seen = self.reads.iter().find_map(|r| match &r.target {
                ReadTarget::Item { version, .. } if r.table == table && r.key == key => {
                    Some(OldImage {
                        version: DataVersion::from_raw(*version),
                        valid: r.value.is_some(),
                        value: r.value.clone().unwrap_or_default(),
                    })
                }
                _ => None,
            });
            if seen.is_some() {
                self.writes[i].old = seen;
            }
        }
    }

    /// Takes the blind write `i` as locked at commit, `item` as read under its lock: its
    /// old image and the read the history records.
    ///
    /// # Errors
    /// [`TxnError::KeyState`] for an update of a record that is absent.
    pub(crate) fn settle_deferred(&mut self, i: usize, item: ItemRead) -> Result<(), TxnError> {
        let w = &mut self.writes[i];
        w.lock = LockState::Held;
        if !item.valid && w.intent == Intent::Write(WriteKind::Update) {
            return Err(TxnError::KeyState(w.key.0));
        }
        let (table, key) = (w.table, w.key);
        w.old = Some(OldImage {
            version: item.version,
            valid: item.valid,
            value: item.value,
        });
        self.note_read(table, key, item.version.counter(), item.writer);
        Ok(())
    }

    /// What the transaction's own sets answer for `r` without a verb (`None`: fetch it).
    pub(crate) fn local_answer(&self, r: &ReadReq) -> Option<Option<Vec<u8>>> {
        if let Some(i) = self.write_entry(r.table, r.key) {
            let w = &self.writes[i];
            match (w.lock, r.access) {
                (LockState::Held, _) => return Some(self.current_value(w)),
                (LockState::Deferred, Access::Read) => return Some(Some(w.new_value.clone())),
                // A blind write read for update is locked now; a failed lock is retried.
                (LockState::Deferred | LockState::Failed, _) => {
                    if r.access == Access::ForUpdate {
                        return None;
                    }
                }
            }
        }
        if r.access == Access::Read
            && let Some(e) = self
                .reads
                .iter()
                .find(|e| e.table == r.table && e.key == r.key)
        {
            return Some(e.value.clone());
        }
        None
    }
    /// The transaction's writes with their undo images, as its log holds them.
    pub(crate) fn local_log(&self, env: &Env<'_>) -> LoggedTxn {
        let writes = self
            .writes
            .iter()
            .filter_map(|w| {
                let Intent::Write(kind) = w.intent else {
                    return None;
                };
                let old = w.old.as_ref()?;
                Some(LoggedWrite {
                    op: match kind {
                        WriteKind::Insert => LogOp::Insert,
                        WriteKind::Delete => LogOp::Delete,
                        WriteKind::Update => LogOp::Update,
                    },
                    table: w.table.0,
                    key: w.key.0,
                    partition: w.loc.bucket.partition,
                    offset: w.loc.offset,
                    old_version: old.version.to_raw(),
                    old_value: old.value.clone(),
                })
            })
            .collect();
        LoggedTxn {
            coordinator: env.coordinator,
            txn: env.seq,
            writes,
        }
    }
    /// Which entries a log image holds (the missing-insert-log switch decides for inserts,
    /// [`logs_insert`]): `early` logs every entry with an old image (the log-without-lock
    /// corner case); otherwise only written entries.
    pub(crate) fn logged_entries(&self, cfg: &ProtocolConfig, early: bool) -> Vec<&WriteEntry> {
        self.writes
            .iter()
            .filter(|w| w.old.is_some())
            .filter(|w| match w.intent {
                Intent::Write(WriteKind::Insert) => logs_insert(cfg),
                Intent::Write(_) => true,
                Intent::LockOnly => early,
            })
            .collect()
    }

    /// Builds the log images: `(mn, bytes)` per log copy, of [`Self::logged_entries`].
    /// Pandora writes one log of the whole write set to its f + 1 log MNs (§3.1.4); FORD
    /// writes each MN the undo records of the objects it replicates.
    pub(crate) fn log_images(
        &self,
        env: &Env<'_>,
        early: bool,
    ) -> Result<Vec<(u16, Vec<u8>)>, TxnError> {
        let logged = self.logged_entries(env.cfg, early);
        let store = env.store;
        // With lock logging the lock log owns the region's tail.
        let undo_bytes = if env.cfg.lock_logging {
            wire::lock_log_offset(store.log_region_bytes())
                .ok_or(TxnError::Aborted(AbortReason::LogRegionTooSmallForLockLog))?
        } else {
            store.log_region_bytes()
        };
        match env.cfg.protocol {
            Protocol::Pandora => {
                let image = undo_image(env, undo_bytes, &logged)?;
                Ok(store
                    .pandora_log_mns(env.coordinator)
                    .into_iter()
                    .map(|mn| (mn, image.clone()))
                    .collect())
            }
            Protocol::Ford => {
                let mut out = Vec::new();
                for mn in 0..store.config().mns {
                    let here: Vec<&WriteEntry> = logged
                        .iter()
                        .copied()
                        .filter(|w| store.live_replicas(w.loc.bucket.partition).contains(&mn))
                        .collect();
                    if !here.is_empty() {
                        out.push((mn, undo_image(env, undo_bytes, &here)?));
                    }
                }
                Ok(out)
            }
        }
    }
    /// Adds one validation READ per read-set entry not covered by a held lock.
    pub(crate) fn validation_reads(
        &self,
        store: &Store,
        list: &mut PostList,
    ) -> Result<Vec<(usize, WrId)>, TxnError> {
        let mut ids = Vec::new();
        for (i, r) in self.reads.iter().enumerate() {
            if self
                .write_entry(r.table, r.key)
                .is_some_and(|w| self.writes[w].lock == LockState::Held)
            {
                if let ReadTarget::Item { .. } = r.target {
                    // Held lock: only the version must be unchanged; checked below too.
                } else {
                    continue;
                }
            }
            match &r.target {
                ReadTarget::Item { loc, .. } => {
                    let addr = primary_addr(store, loc)?;
                    ids.push((i, list.read(addr, DataItemHeader::VALIDATION_LEN as u32)));
                }
                ReadTarget::Absent { bucket } => {
                    let p = store.primary(bucket.partition).map_err(TxnError::from)?;
                    let addr = store.addr(p, bucket.offset);
                    ids.push((i, list.read(addr, bucket.read_len())));
                }
            }
        }
        Ok(ids)
    }
    pub(crate) fn validate_one(
        &self,
        cfg: &ProtocolConfig,
        ri: usize,
        bytes: &[u8],
        failed: &FailedCoordinatorSet,
    ) -> bool {
        let r = &self.reads[ri];
        match &r.target {
            ReadTarget::Item { version, .. } => {
                if bytes.len() < 16 {
                    return false;
                }
                let lock = u64::from_le_bytes(bytes[0..8].try_into().unwrap_or([0xFF; 8]));
                let ver = u64::from_le_bytes(bytes[8..16].try_into().unwrap_or([0xFF; 8]));
                let mine = self
                    .write_entry(r.table, r.key)
                    .is_some_and(|w| self.writes[w].lock == LockState::Held);
                if mine {
                    return ver == *version;
                }
                logic::validate_item(*version, lock, ver, failed, cfg)
            }
            ReadTarget::Absent { .. } => {
                let (used, _) = parse_bucket(bytes);
                !used.iter().any(|(_, k)| *k == r.key.0)
            }
        }
    }

    /// The commit WRITEs (Pandora §2.3 step 4; FORD `IssueCommitAll`): the new image of
    /// every written item from its version word on (the lock word stays held) to every live
    /// replica, primary included, and the versions they install, for the history.
    pub(crate) fn commit_list(
        &self,
        env: &Env<'_>,
    ) -> Result<(PostList, Vec<WriteEvent>), TxnError> {
        let store = env.store;
        // Coordinator ids are 16-bit and sequence numbers start at 1: they always pack.
        let writer = DataItemHeader::pack_writer(env.coordinator, env.seq)
            .unwrap_or(DataItemHeader::NO_WRITER);
        let mut installed = Vec::new();
        let mut list = PostList::new();
        let lock_words = commit_writes_lock_words(env.cfg);
        let me = logic::my_lock(env.coordinator);
        let last = self
            .writes
            .iter()
            .rposition(|w| matches!(w.intent, Intent::Write(_)));
        for (i, w) in self.writes.iter().enumerate() {
            let Intent::Write(kind) = w.intent else {
                continue;
            };
            let Some(old) = &w.old else {
                return Err(TxnError::Aborted(AbortReason::WriteWithoutOldImage));
            };
            let version = logic::next_version(old.version);
            let (flags, value) = match kind {
                WriteKind::Update => (ItemFlags::LOADED, &w.new_value),
                WriteKind::Insert => (ItemFlags::LOADED.with_user_insert(true), &w.new_value),
                WriteKind::Delete => (ItemFlags::EMPTY, &old.value),
            };
            let item_len = store.table(w.table).map_err(TxnError::from)?.item_len;
            let image = encode_item_by(w.key.0, w.table.0, version, flags, value, item_len, writer);
            let primary = store
                .primary(w.loc.bucket.partition)
                .map_err(TxnError::from)?;
            for mn in store.live_replicas(w.loc.bucket.partition) {
                if lock_words {
                    // The word each replica's lock already holds: held by this
                    // coordinator at the primary, free at a backup.
                    let word = if mn == primary { me } else { 0 };
                    list.write(store.addr(mn, w.loc.offset), &word.to_le_bytes());
                }
                let addr = store.addr(mn, w.loc.offset + DataItemHeader::VERSION_OFFSET as u64);
                list.write(addr, &image[DataItemHeader::VERSION_OFFSET..]);
            }
            if commit_flushes_backups(env.cfg) && last == Some(i) {
                for mn in store.live_replicas(w.loc.bucket.partition) {
                    if mn != primary {
                        list.read(store.addr(mn, w.loc.offset), FLUSH_READ_LEN);
                    }
                }
            }
            installed.push(WriteEvent {
                table: w.table,
                key: w.key,
                version: Version(version.counter()),
                kind,
            });
        }
        Ok((list, installed))
    }

    /// The release WRITEs: 0 to the lock word of every held lock, at its primary (and at
    /// every live backup of a written record when [`release_writes_backups`]).
    pub(crate) fn release_list(
        &self,
        store: &Store,
        cfg: &ProtocolConfig,
    ) -> Result<PostList, TxnError> {
        let mut list = PostList::new();
        for w in &self.writes {
            if w.lock == LockState::Held {
                let primary = primary_addr(store, &w.loc)?;
                list.write(primary, &0u64.to_le_bytes());
                if release_writes_backups(cfg) && matches!(w.intent, Intent::Write(_)) {
                    for mn in store.live_replicas(w.loc.bucket.partition) {
                        if mn != primary.node.0 {
                            list.write(store.addr(mn, w.loc.offset), &0u64.to_le_bytes());
                        }
                    }
                }
            }
        }
        Ok(list)
    }

    /// Marks every held lock released (and its entry no longer written).
    pub(crate) fn mark_released(&mut self) {
        for w in &mut self.writes {
            if w.lock == LockState::Held {
                w.lock = LockState::Failed;
                w.intent = Intent::LockOnly;
            }
        }
    }

    /// The abort path's first step (Pandora §3.1.5 (3)): clear the log state byte on every
    /// live MN holding this transaction's log, so recovery never rolls it back or forward.
    /// Nothing under the lost-decision bug (FORD leaves the logs of aborted transactions).
    pub(crate) fn truncate_list(&self, env: &Env<'_>) -> PostList {
        let mut list = PostList::new();
        if !abort_truncates(env.cfg) {
            return list;
        }
        let base = env.store.log_offset(env.coordinator).unwrap_or(0);
        let view = env.store.view().borrow().clone();
        for &mn in self.logged.iter().filter(|&&mn| view.is_alive(mn)) {
            list.write(
                env.store
                    .addr(mn, base + LogRegionHeader::STATE_OFFSET as u64),
                &[0],
            );
        }
        list
    }

    /// The abort path's unlocks: every held lock (every lock of the write set under the
    /// complicit-abort bug). After an MN view change a lock is released with a CAS from
    /// this coordinator's word, since the new primary's word was never locked by it and
    /// must not be overwritten blindly (§3.2.5).
    pub(crate) fn abort_unlock_list(&self, env: &Env<'_>, view_changed: bool) -> PostList {
        let me = logic::my_lock(env.coordinator);
        let mut list = PostList::new();
        for w in &self.writes {
            if !abort_releases(env.cfg, w.lock) {
                continue;
            }
            let Ok(addr) = primary_addr(env.store, &w.loc) else {
                continue;
            };
            if view_changed {
                list.cas(addr, me, 0);
            } else {
                list.write(addr, &0u64.to_le_bytes());
            }
        }
        list
    }

    /// A write to a record the write set already covers (locked, or a blind write still to
    /// lock): restages it without a verb. `None`: the record is not covered (or its lock
    /// failed) and the shell must locate and lock it. `Some(Err(KeyState))`: the write
    /// contradicts the record's state as this transaction sees it (an update of an absent
    /// record, an insert of a present one).
    pub(crate) fn stage_on_entry(
        &mut self,
        table: TableId,
        key: Key,
        value: &[u8],
        kind: WriteKind,
    ) -> Option<Result<(), TxnError>> {
        let i = self.write_entry(table, key)?;
        let w = &mut self.writes[i];
        if w.lock == LockState::Failed {
            return None;
        }
        let present = match (&w.old, w.intent) {
            (_, Intent::Write(WriteKind::Insert | WriteKind::Update)) => true,
            (_, Intent::Write(WriteKind::Delete)) => false,
            (Some(o), Intent::LockOnly) => o.valid,
            (None, Intent::LockOnly) => true,
        };
        let new_kind = match (kind, present) {
            (WriteKind::Update, true) => match w.intent {
                Intent::Write(WriteKind::Insert) => WriteKind::Insert,
                _ => WriteKind::Update,
            },
            (WriteKind::Insert, false) => match w.intent {
                Intent::Write(WriteKind::Delete) => WriteKind::Update,
                _ => WriteKind::Insert,
            },
            (WriteKind::Delete, true) => WriteKind::Delete,
            _ => return Some(Err(TxnError::KeyState(key.0))),
        };
        w.intent = Intent::Write(new_kind);
        if kind != WriteKind::Delete {
            w.new_value = value.to_vec();
        }
        Some(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BugSet;
    use crate::store::{StoreConfig, TableSpec};
    use dmem_layout::pill::CoordinatorId as PillId;
    use dmem_verbs::{MemoryRegion, NodeId, Op, RKey};

    const T: TableId = TableId(1);

    fn store() -> Store {
        let regions = (0..3)
            .map(|i| MemoryRegion {
                node: NodeId(i),
                rkey: RKey(1),
                len: 1 << 22,
            })
            .collect();
        Store::new(
            StoreConfig::new(3)
                .table(TableSpec::sized_for(T, 8, 100, 3))
                .coordinators(4),
            regions,
        )
        .unwrap()
    }

    fn loc(s: &Store, key: u64) -> ItemLoc {
        s.item_at(s.bucket_of(T, Key(key)).unwrap(), 0).unwrap()
    }

    fn entry(s: &Store, key: u64, lock: LockState, intent: Intent) -> WriteEntry {
        WriteEntry {
            table: T,
            key: Key(key),
            loc: loc(s, key),
            lock,
            intent,
            old: Some(OldImage {
                version: DataVersion::from_raw(4),
                valid: true,
                value: vec![1; 8],
            }),
            new_value: vec![2; 8],
        }
    }

    fn env<'a>(s: &'a Store, cfg: &'a ProtocolConfig) -> Env<'a> {
        Env {
            store: s,
            cfg,
            coordinator: 2,
            epoch: 1,
            seq: 9,
        }
    }

    #[test]
    fn validation_reads_read_only_items_and_judges_lock_and_version() {
        let s = store();
        let mut st = TxnState::default();
        st.reads.push(ReadEntry {
            table: T,
            key: Key(1),
            target: ReadTarget::Item {
                loc: loc(&s, 1),
                version: 5,
            },
            value: Some(vec![0; 8]),
        });
        st.writes.push(entry(
            &s,
            2,
            LockState::Held,
            Intent::Write(WriteKind::Update),
        ));
        let mut list = PostList::new();
        let ids = st.validation_reads(&s, &mut list).unwrap();
        assert_eq!(ids.len(), 1, "only the read-only item is validated");
        let header = |lock: u64, version: u64| {
            let mut b = lock.to_le_bytes().to_vec();
            b.extend_from_slice(&version.to_le_bytes());
            b
        };
        let fixed = ProtocolConfig::ford_fixed();
        let none = FailedCoordinatorSet::EMPTY;
        assert!(st.validate_one(&fixed, 0, &header(0, 5), &none));
        assert!(
            !st.validate_one(&fixed, 0, &header(0, 6), &none),
            "version moved"
        );
        let live = logic::my_lock(3);
        assert!(
            !st.validate_one(&fixed, 0, &header(live, 5), &none),
            "locked"
        );
        let covert = ProtocolConfig::ford_with(BugSet::NONE.with(FordBug::CovertLocks));
        assert!(
            st.validate_one(&covert, 0, &header(live, 5), &none),
            "the covert-locks bug ignores the lock"
        );
        let mut failed = FailedCoordinatorSet::EMPTY;
        failed.insert(PillId(3));
        assert!(
            st.validate_one(&ProtocolConfig::pandora(), 0, &header(live, 5), &failed),
            "PILL ignores a stray lock"
        );
        assert!(
            !st.validate_one(&fixed, 0, &header(0, 5)[..8], &none),
            "short"
        );
    }

    #[test]
    fn commit_writes_every_live_replica_with_the_next_version() {
        let s = store();
        let mut st = TxnState::default();
        st.writes.push(entry(
            &s,
            1,
            LockState::Held,
            Intent::Write(WriteKind::Update),
        ));
        st.writes
            .push(entry(&s, 2, LockState::Held, Intent::LockOnly));
        let fixed = ProtocolConfig::ford_fixed();
        let (list, installed) = st.commit_list(&env(&s, &fixed)).unwrap();
        assert_eq!(installed.len(), 1, "a lock-only entry installs nothing");
        assert_eq!(installed[0].version, Version(5));
        let wrs = list.finish().unwrap();
        assert_eq!(wrs.len(), 3, "primary and two backups");
        s.view().borrow_mut().mark_failed(wrs[0].op.addr().node.0);
        let (list, _) = st.commit_list(&env(&s, &fixed)).unwrap();
        assert_eq!(list.len(), 2, "a failed MN is skipped");
        for w in list.finish().unwrap() {
            let Op::Write { addr, data } = &w.op else {
                panic!("not a WRITE");
            };
            assert_eq!(
                addr.offset,
                loc(&s, 1).offset + DataItemHeader::VERSION_OFFSET as u64
            );
            assert_eq!(
                data.len() + DataItemHeader::VERSION_OFFSET,
                DataItemHeader::item_len(8)
            );
        }
        let mut orphan = entry(&s, 3, LockState::Held, Intent::Write(WriteKind::Update));
        orphan.old = None;
        st.writes.push(orphan);
        assert!(
            st.commit_list(&env(&s, &fixed)).is_err(),
            "a write without an old image"
        );
    }

    #[test]
    fn abort_releases_held_locks_only_unless_complicit_and_truncates_unless_lost_decision() {
        let s = store();
        let mut st = TxnState::default();
        st.writes.push(entry(
            &s,
            1,
            LockState::Held,
            Intent::Write(WriteKind::Update),
        ));
        st.writes.push(entry(
            &s,
            2,
            LockState::Failed,
            Intent::Write(WriteKind::Update),
        ));
        st.logged = vec![0, 1];
        let fixed = ProtocolConfig::ford_fixed();
        assert_eq!(st.abort_unlock_list(&env(&s, &fixed), false).len(), 1);
        let complicit = ProtocolConfig::ford_with(BugSet::NONE.with(FordBug::ComplicitAbort));
        assert_eq!(st.abort_unlock_list(&env(&s, &complicit), false).len(), 2);
        let after_view_change = st
            .abort_unlock_list(&env(&s, &fixed), true)
            .finish()
            .unwrap();
        assert!(
            matches!(after_view_change[0].op, Op::Cas { expect, swap: 0, .. } if expect == logic::my_lock(2)),
            "after a view change the release is a CAS from this coordinator's word"
        );
        assert_eq!(st.truncate_list(&env(&s, &fixed)).len(), 2);
        let lost = ProtocolConfig::ford_with(BugSet::NONE.with(FordBug::LostDecision));
        assert!(st.truncate_list(&env(&s, &lost)).is_empty());
        st.mark_released();
        assert!(
            st.release_list(&s, &ProtocolConfig::ford_fixed())
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn restaging_follows_the_record_state() {
        let s = store();
        let mut st = TxnState::default();
        assert!(
            st.stage_on_entry(T, Key(1), &[0; 8], WriteKind::Update)
                .is_none()
        );
        st.writes
            .push(entry(&s, 1, LockState::Held, Intent::LockOnly));
        assert_eq!(
            st.stage_on_entry(T, Key(1), &[0; 8], WriteKind::Insert),
            Some(Err(TxnError::KeyState(1))),
            "insert of a present record"
        );
        assert_eq!(
            st.stage_on_entry(T, Key(1), &[], WriteKind::Delete),
            Some(Ok(()))
        );
        assert_eq!(
            st.stage_on_entry(T, Key(1), &[0; 8], WriteKind::Update),
            Some(Err(TxnError::KeyState(1))),
            "update of a record this transaction deleted"
        );
        assert_eq!(
            st.stage_on_entry(T, Key(1), &[7; 8], WriteKind::Insert),
            Some(Ok(()))
        );
        assert_eq!(
            st.writes[0].intent,
            Intent::Write(WriteKind::Update),
            "delete + insert = update"
        );
        assert_eq!(st.current_value(&st.writes[0]), Some(vec![7; 8]));
    }

    /// An item of key `key` at version 4 with `lock` in its lock word, as a READ returns it.
    fn item_bytes(key: u64, lock: u64, valid: bool) -> Vec<u8> {
        let flags = if valid {
            ItemFlags::LOADED
        } else {
            ItemFlags::EMPTY
        };
        let version = DataVersion::from_raw(4);
        let item_len = DataItemHeader::item_len(8);
        let mut b = crate::store::encode_item(key, T.0, version, flags, &[3; 8], item_len);
        b[..8].copy_from_slice(&lock.to_le_bytes());
        b
    }

    #[test]
    fn a_round_step_by_step_locks_reads_and_notes_absent_keys() {
        let s = store();
        let mut st = TxnState::default();
        let cfg = ProtocolConfig::pandora();
        let none = FailedCoordinatorSet::EMPTY;
        // The lock CASes came back: key 1 won (0), key 2 found a lock.
        let won = st
            .record_lock_attempt(T, Key(1), loc(&s, 1), 0, &item_bytes(1, 0, true))
            .unwrap();
        let lost = st
            .record_lock_attempt(T, Key(2), loc(&s, 2), 77, &item_bytes(2, 77, true))
            .unwrap();
        assert_eq!(st.writes[won].lock, LockState::Held, "held before judging");
        assert_eq!(st.writes[lost].lock, LockState::Failed);
        assert!(
            st.record_lock_attempt(T, Key(3), loc(&s, 3), 0, &item_bytes(9, 0, true))
                .is_err(),
            "the item names another key"
        );
        // A steal: won, released meanwhile, or another word to decide on.
        assert_eq!(after_steal(77, 77), AfterSteal::Stolen);
        assert_eq!(after_steal(77, 0), AfterSteal::ChangedHands);
        assert_eq!(after_steal(77, 78), AfterSteal::Again(78));
        // Read-only items: a live lock aborts, a stray one is ignored under PILL.
        let live = logic::my_lock(3);
        let read = |st: &mut TxnState, key, lock, failed: &FailedCoordinatorSet| {
            let bytes = item_bytes(key, lock, true);
            st.absorb_read((T, Key(key), loc(&s, key)), &bytes, failed, &cfg)
                .unwrap()
        };
        assert_eq!(read(&mut st, 4, live, &none), ReadSeen::Locked);
        assert!(st.reads.is_empty(), "a locked read joins nothing");
        let mut failed = FailedCoordinatorSet::EMPTY;
        failed.insert(PillId(3));
        assert_eq!(
            read(&mut st, 4, live, &failed),
            ReadSeen::Value {
                value: Some(vec![3; 8]),
                stray: true
            }
        );
        assert_eq!(
            read(&mut st, 5, 0, &none),
            ReadSeen::Value {
                value: Some(vec![3; 8]),
                stray: false
            }
        );
        assert_eq!(st.reads.len(), 2);
        // An absent key: validated by its bucket, remembered once for an insert.
        let bucket = s.bucket_of(T, Key(6)).unwrap();
        let fetch = Fetch {
            table: T,
            key: Key(6),
            access: Access::ForUpdate,
            located: Some(Located::Absent {
                bucket,
                free: Some(2),
            }),
        };
        let values = st.absorb_absent(&[fetch.clone(), fetch]);
        assert_eq!(values, [None, None]);
        assert_eq!(st.reads.len(), 3, "read once");
        assert!(matches!(st.reads[2].target, ReadTarget::Absent { .. }));
        assert_eq!(st.take_absent(T, Key(6)), Some((bucket, Some(2))));
    }

    #[test]
    fn commit_time_locks_and_staged_writes_follow_the_record() {
        let s = store();
        let mut st = TxnState::default();
        st.push_deferred(T, Key(1), loc(&s, 1), &[5; 8]);
        st.push_deferred(T, Key(2), loc(&s, 2), &[5; 8]);
        assert_eq!(st.deferred(), [0, 1]);
        assert!(st.has_writes() && !st.single_read());
        let item = |key, valid| parse_item(&item_bytes(key, 0, valid), T, Key(key)).unwrap();
        st.settle_deferred(0, item(1, true)).unwrap();
        assert_eq!(st.writes[0].lock, LockState::Held);
        assert_eq!(st.writes[0].old.as_ref().unwrap().value, [3; 8]);
        assert_eq!(
            st.settle_deferred(1, item(2, false)),
            Err(TxnError::KeyState(2)),
            "a blind update of an absent record"
        );
        assert_eq!(
            st.writes[1].lock,
            LockState::Held,
            "held: the abort releases it"
        );
        assert_eq!(st.events.len(), 1, "the read of key 1 only");
        // Delete and insert of a record just locked.
        let idx = st
            .record_lock_attempt(T, Key(3), loc(&s, 3), 0, &item_bytes(3, 0, true))
            .unwrap();
        st.hold(idx, &item(3, true));
        assert_eq!(
            st.stage_locked(T, Key(3), WriteKind::Insert, &[1; 8], true),
            Err(TxnError::KeyState(3))
        );
        st.stage_locked(T, Key(3), WriteKind::Delete, &[], true)
            .unwrap();
        assert_eq!(st.writes[idx].intent, Intent::Write(WriteKind::Delete));
        assert_eq!(
            st.stage_locked(T, Key(3), WriteKind::Delete, &[], false),
            Err(TxnError::KeyState(3))
        );
        st.stage_locked(T, Key(3), WriteKind::Insert, &[1; 8], false)
            .unwrap();
        assert_eq!(st.writes[idx].new_value, [1; 8]);
    }

    #[test]
    fn an_insert_claims_a_free_slot_only() {
        let k = Key(5);
        let slot = |key: u64, addr: u64| {
            let mut b = key.to_le_bytes().to_vec();
            b.extend_from_slice(&addr.to_le_bytes());
            SlotSeen::Bytes(b)
        };
        let taken = Err(TxnError::Aborted(
            AbortReason::IndexSlotTakenByConcurrentInsert,
        ));
        assert_eq!(slot_verdict(Some(&slot(0, 0)), k, false), Ok(true), "free");
        assert_eq!(
            slot_verdict(Some(&slot(5, 64)), k, false),
            Ok(false),
            "names it already"
        );
        assert_eq!(slot_verdict(Some(&slot(6, 64)), k, false), taken);
        assert_eq!(
            slot_verdict(Some(&slot(0, 0)), k, true),
            Err(TxnError::KeyState(5)),
            "present"
        );
        assert_eq!(
            slot_verdict(Some(&SlotSeen::Address(0)), k, false),
            Ok(false)
        );
        assert_eq!(slot_verdict(Some(&SlotSeen::Address(64)), k, false), taken);
        assert_eq!(
            slot_verdict(None, k, false),
            Err(TxnError::Aborted(AbortReason::IndexSlotNotSeen))
        );
    }

    /// One test per FORD bug switch (Pandora Table 1, §5.1): the decisions under the bug
    /// differ from the fixed protocol's exactly where the bug says, and nowhere else.
    mod bug_switches {
        use super::*;

        fn with(bug: FordBug) -> ProtocolConfig {
            ProtocolConfig::ford_with(BugSet::NONE.with(bug))
        }

        /// Every bug-dependent decision of the pure modules, by name.
        fn decisions(cfg: &ProtocolConfig) -> Vec<(String, bool)> {
            let none = FailedCoordinatorSet::EMPTY;
            let mut d = vec![
                ("logs-insert".to_owned(), logs_insert(cfg)),
                ("log-before-cas".to_owned(), logs_before_lock_results(cfg)),
                ("abort-truncates".to_owned(), abort_truncates(cfg)),
                (
                    "release-held".to_owned(),
                    abort_releases(cfg, LockState::Held),
                ),
                (
                    "release-failed".to_owned(),
                    abort_releases(cfg, LockState::Failed),
                ),
                (
                    "release-deferred".to_owned(),
                    abort_releases(cfg, LockState::Deferred),
                ),
                (
                    "validate-locked".to_owned(),
                    logic::validate_item(5, logic::my_lock(3), 5, &none, cfg),
                ),
            ];
            for single_read in [false, true] {
                for deferred in [false, true] {
                    let s = CommitSchedule::new(cfg, single_read, deferred);
                    let at = |f: &str| format!("{f}/sr={single_read}/d={deferred}");
                    d.extend([
                        (at("validate-with-locks"), s.validate_with_locks),
                        (at("validate-after-locks"), s.validate_after_locks),
                        (at("early-log-with-locks"), s.early_log_with_locks),
                        (at("log-with-locks"), s.log_with_locks),
                        (at("log-with-validation"), s.log_with_validation),
                        (at("logging-phase"), s.logging_phase),
                    ]);
                }
            }
            d
        }

        /// The names of the decisions `bug` changes.
        fn changed_by(bug: FordBug) -> Vec<String> {
            let fixed = decisions(&ProtocolConfig::ford_fixed());
            decisions(&with(bug))
                .into_iter()
                .zip(fixed)
                .filter(|(b, f)| b.1 != f.1)
                .map(|(b, _)| b.0)
                .collect()
        }

        fn combos(fields: &[&str], pick: impl Fn(bool, bool) -> bool) -> Vec<String> {
            let mut out = Vec::new();
            for single_read in [false, true] {
                for deferred in [false, true] {
                    if pick(single_read, deferred) {
                        for f in fields {
                            out.push(format!("{f}/sr={single_read}/d={deferred}"));
                        }
                    }
                }
            }
            out.sort();
            out
        }

        fn sorted(mut v: Vec<String>) -> Vec<String> {
            v.sort();
            v
        }

        /// Three entries of `s`: key 1 locked and updated, key 2 whose CAS failed, key 3 a
        /// blind write still deferred.
        fn write_set(s: &Store) -> TxnState {
            let mut st = TxnState::default();
            st.writes.push(entry(
                s,
                1,
                LockState::Held,
                Intent::Write(WriteKind::Update),
            ));
            st.writes.push(entry(
                s,
                2,
                LockState::Failed,
                Intent::Write(WriteKind::Update),
            ));
            let mut blind = entry(s, 3, LockState::Deferred, Intent::Write(WriteKind::Update));
            blind.old = None;
            st.writes.push(blind);
            st
        }

        fn unlocked(st: &TxnState, s: &Store, cfg: &ProtocolConfig) -> Vec<u64> {
            st.abort_unlock_list(&env(s, cfg), false)
                .finish()
                .unwrap()
                .iter()
                .map(|w| w.op.addr().offset)
                .collect()
        }

        #[test]
        fn complicit_abort_releases_locks_never_acquired() {
            assert_eq!(
                changed_by(FordBug::ComplicitAbort),
                ["release-failed", "release-deferred"]
            );
            let s = store();
            let st = write_set(&s);
            let off = |k| loc(&s, k).offset;
            assert_eq!(
                unlocked(&st, &s, &ProtocolConfig::ford_fixed()),
                [off(1)],
                "fixed: only the lock acquired"
            );
            assert_eq!(
                unlocked(&st, &s, &with(FordBug::ComplicitAbort)),
                [off(1), off(2), off(3)],
                "complicit: the whole write set, a lock someone else holds included"
            );
        }

        #[test]
        fn missing_insert_log_leaves_inserts_out_of_the_undo_log() {
            assert_eq!(changed_by(FordBug::MissingInsertLog), ["logs-insert"]);
            let s = store();
            let mut st = TxnState::default();
            st.writes.push(entry(
                &s,
                1,
                LockState::Held,
                Intent::Write(WriteKind::Update),
            ));
            st.writes.push(entry(
                &s,
                2,
                LockState::Held,
                Intent::Write(WriteKind::Insert),
            ));
            let logged_keys = |cfg: &ProtocolConfig| -> Vec<u64> {
                let mut keys: Vec<u64> = st
                    .log_images(&env(&s, cfg), false)
                    .unwrap()
                    .iter()
                    .flat_map(|(_, image)| logic::parse_log_copy(image, 2).unwrap().writes)
                    .map(|w| w.key)
                    .collect();
                keys.sort_unstable();
                keys.dedup();
                keys
            };
            assert_eq!(logged_keys(&ProtocolConfig::ford_fixed()), [1, 2]);
            assert_eq!(
                logged_keys(&with(FordBug::MissingInsertLog)),
                [1],
                "the insert has no undo record"
            );
        }

        #[test]
        fn covert_locks_validation_ignores_a_live_lock_only() {
            assert_eq!(changed_by(FordBug::CovertLocks), ["validate-locked"]);
            let none = FailedCoordinatorSet::EMPTY;
            let fixed = ProtocolConfig::ford_fixed();
            let covert = with(FordBug::CovertLocks);
            let live = logic::my_lock(3);
            for (lock, version, fixed_ok, covert_ok) in [
                (0, 5, true, true),
                (live, 5, false, true),
                (0, 6, false, false),
                (live, 6, false, false),
            ] {
                assert_eq!(
                    logic::validate_item(5, lock, version, &none, &fixed),
                    fixed_ok
                );
                assert_eq!(
                    logic::validate_item(5, lock, version, &none, &covert),
                    covert_ok
                );
            }
        }

        #[test]
        fn relaxed_locks_validates_in_the_lock_batch() {
            assert_eq!(
                sorted(changed_by(FordBug::RelaxedLocks)),
                combos(&["validate-with-locks", "validate-after-locks"], |sr, _| {
                    !sr
                }),
                "validation moves into the lock batch, except for FORD's single read"
            );
            let s = CommitSchedule::new(&with(FordBug::RelaxedLocks), false, true);
            assert!(s.validate_with_locks && !s.validate_after_locks);
            assert_eq!(
                s.lock_phase(),
                Phase::CommitLock,
                "no log in the lock batch"
            );
            let f = CommitSchedule::new(&ProtocolConfig::ford_fixed(), false, true);
            assert!(!f.validate_with_locks && f.validate_after_locks);
        }

        #[test]
        fn lost_decision_logs_before_the_decision_and_never_truncates() {
            let mut expected = combos(&["logging-phase"], |_, _| true);
            expected.extend(combos(&["log-with-validation"], |sr, _| !sr));
            expected.push("abort-truncates".to_owned());
            assert_eq!(sorted(changed_by(FordBug::LostDecision)), sorted(expected));
            let lost = with(FordBug::LostDecision);
            let s = CommitSchedule::new(&lost, false, false);
            assert_eq!(s.validation_phase(), Phase::ValidateAndLog);
            assert!(!s.logging_phase);
            let fixed = CommitSchedule::new(&ProtocolConfig::ford_fixed(), false, false);
            assert_eq!(fixed.validation_phase(), Phase::Validate);
            // With relaxed locks too, the logs ride in the lock batch instead.
            let both = ProtocolConfig::ford_with(
                BugSet::NONE
                    .with(FordBug::LostDecision)
                    .with(FordBug::RelaxedLocks),
            );
            let s = CommitSchedule::new(&both, false, false);
            assert!(s.log_with_locks && !s.log_with_validation);
            assert_eq!(s.lock_phase(), Phase::CommitLockAndLog);
            let store = store();
            let mut st = write_set(&store);
            st.logged = vec![0, 1];
            assert!(st.truncate_list(&env(&store, &lost)).is_empty());
            assert_eq!(
                st.truncate_list(&env(&store, &ProtocolConfig::ford_fixed()))
                    .len(),
                2
            );
        }

        #[test]
        fn log_without_lock_logs_beside_the_lock_cas() {
            let mut expected = combos(&["early-log-with-locks"], |_, d| d);
            expected.push("log-before-cas".to_owned());
            assert_eq!(
                sorted(changed_by(FordBug::LogWithoutLock)),
                sorted(expected)
            );
            let lwl = with(FordBug::LogWithoutLock);
            assert_eq!(
                CommitSchedule::new(&lwl, false, true).lock_phase(),
                Phase::CommitLockAndLog
            );
            assert_eq!(
                CommitSchedule::new(&lwl, false, false).lock_phase(),
                Phase::CommitLock,
                "no blind write, nothing to log early"
            );
            // The blind write's undo record carries the image read in execution.
            let s = store();
            let mut st = write_set(&s);
            st.reads.push(ReadEntry {
                table: T,
                key: Key(3),
                target: ReadTarget::Item {
                    loc: loc(&s, 3),
                    version: 7,
                },
                value: Some(vec![9; 8]),
            });
            let mut never_read = entry(&s, 4, LockState::Deferred, Intent::LockOnly);
            never_read.old = None;
            st.writes.push(never_read);
            st.old_images_from_reads(&st.deferred());
            let old = st.writes[2].old.as_ref().unwrap();
            assert_eq!((old.version.to_raw(), &old.value[..]), (7, &[9u8; 8][..]));
            assert!(st.writes[3].old.is_none(), "never read: no image");
            let early: Vec<u64> = st
                .logged_entries(&lwl, true)
                .iter()
                .map(|w| w.key.0)
                .collect();
            assert_eq!(early, [1, 2, 3], "logged before its lock is known held");
        }
    }

    /// `ford:artifact` (not a bug): FORD's public code's commit verbs. It changes none of
    /// the bug-dependent decisions, and exactly the three commit-verb decisions.
    mod artifact_switch {
        use super::*;

        fn artifact() -> ProtocolConfig {
            ProtocolConfig::ford_fixed().with_artifact_verbs()
        }

        fn verb_decisions(cfg: &ProtocolConfig) -> [bool; 3] {
            [
                commit_writes_lock_words(cfg),
                commit_flushes_backups(cfg),
                release_writes_backups(cfg),
            ]
        }

        #[test]
        fn only_the_commit_verb_decisions_change() {
            let fixed = ProtocolConfig::ford_fixed();
            let art = artifact();
            assert_eq!(verb_decisions(&fixed), [false; 3]);
            assert_eq!(verb_decisions(&art), [true; 3]);
            for cfg in [
                ProtocolConfig::pandora(),
                ProtocolConfig::pandora_lock_logging(),
            ] {
                assert_eq!(verb_decisions(&cfg), [false; 3]);
            }
            for bug in FordBug::ALL {
                let cfg = ProtocolConfig::ford_with(BugSet::NONE.with(bug));
                assert_eq!(verb_decisions(&cfg), [false; 3], "{bug}");
            }
            let none = FailedCoordinatorSet::EMPTY;
            assert_eq!(logs_insert(&art), logs_insert(&fixed));
            assert_eq!(
                logs_before_lock_results(&art),
                logs_before_lock_results(&fixed)
            );
            assert_eq!(abort_truncates(&art), abort_truncates(&fixed));
            for lock in [LockState::Held, LockState::Failed, LockState::Deferred] {
                assert_eq!(abort_releases(&art, lock), abort_releases(&fixed, lock));
            }
            assert_eq!(
                logic::validate_item(5, logic::my_lock(3), 5, &none, &art),
                logic::validate_item(5, logic::my_lock(3), 5, &none, &fixed)
            );
            for single_read in [false, true] {
                for deferred in [false, true] {
                    assert_eq!(
                        CommitSchedule::new(&art, single_read, deferred),
                        CommitSchedule::new(&fixed, single_read, deferred),
                        "a one-record read-only txn is not validated, as FORD's code"
                    );
                }
            }
        }

        /// Two updated records and one lock-only entry, all held.
        fn written(s: &Store) -> TxnState {
            let mut st = TxnState::default();
            for key in [1, 2] {
                st.writes.push(entry(
                    s,
                    key,
                    LockState::Held,
                    Intent::Write(WriteKind::Update),
                ));
            }
            st.writes
                .push(entry(s, 3, LockState::Held, Intent::LockOnly));
            st
        }

        #[test]
        fn commit_writes_lock_words_and_flushes_the_last_records_backups() {
            let s = store();
            let st = written(&s);
            let fixed = ProtocolConfig::ford_fixed();
            let art = artifact();
            let lean = st
                .commit_list(&env(&s, &fixed))
                .unwrap()
                .0
                .finish()
                .unwrap();
            let (list, installed) = st.commit_list(&env(&s, &art)).unwrap();
            assert_eq!(installed.len(), 2);
            let wrs = list.finish().unwrap();
            assert_eq!(lean.len(), 2 * 3, "an item WRITE per replica");
            // Per record and replica a lock-word WRITE then the item; two flush READs.
            assert_eq!(wrs.len(), 2 * 3 * 2 + 2);
            let me = logic::my_lock(2);
            for rec in 0..2 {
                let l = loc(&s, rec as u64 + 1);
                let primary = s.primary(l.bucket.partition).unwrap();
                for r in 0..3 {
                    let (word, item) = (&wrs[rec * 6 + 2 * r], &wrs[rec * 6 + 2 * r + 1]);
                    let Op::Write { addr, data } = &word.op else {
                        panic!("not a WRITE");
                    };
                    assert_eq!(addr.offset, l.offset, "the lock word");
                    let want = if addr.node.0 == primary { me } else { 0 };
                    assert_eq!(data[..], want.to_le_bytes(), "the word the lock holds");
                    assert_eq!(item.op, lean[rec * 3 + r].op, "then dmem's item WRITE");
                }
            }
            let l2 = loc(&s, 2);
            let p2 = s.primary(l2.bucket.partition).unwrap();
            for w in &wrs[12..] {
                let Op::Read { addr, len } = &w.op else {
                    panic!("not a READ");
                };
                assert_eq!((addr.offset, *len), (l2.offset, 1));
                assert_ne!(addr.node.0, p2, "a backup of the last record");
            }
        }

        #[test]
        fn release_writes_every_replica_of_a_written_record() {
            let s = store();
            let st = written(&s);
            let lean = st
                .release_list(&s, &ProtocolConfig::ford_fixed())
                .unwrap()
                .finish()
                .unwrap();
            assert_eq!(lean.len(), 3, "the primary of each held lock");
            let wrs = st.release_list(&s, &artifact()).unwrap().finish().unwrap();
            assert_eq!(
                wrs.len(),
                3 + 2 * 2,
                "and both backups of each written record"
            );
            for w in &wrs {
                assert!(matches!(&w.op, Op::Write { data, .. } if data[..] == 0u64.to_le_bytes()));
            }
        }
    }
}
