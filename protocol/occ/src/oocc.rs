//! OOCC (Alg. 1): implicit read leases, delayed write locks, redo logs and the one-op
//! write-unlock, as plain decisions ([`logic`]: lock words, lease waits, what to validate
//! and what each commit WRITE carries, tested on their own) and a thin async shell
//! ([`OoccCoordinator`], [`OoccTxn`]; `execute` for Execute&Locking, `commit` for
//! Validate&Logging and Commit) whose rounds are OOCC's round trips.
//!
//! | phase (Alg. 1) | post list | round trips |
//! |---|---|---|
//! | Execute&Locking, per round | READ record (read set); CAS intention + READ record (write set) | 1 |
//! | Validate&Logging (RO, skipped when every record was free and `now − start ≤ rv`) | READ lock words | 0 or 1 |
//! | Validate&Logging (RW), started `upgrade_lead` before the lease ends | WRITE redo log + WRITE lock upgrades + READ lock words of the read set if the lease ran out | 1 |
//! | Commit (RW) | wait until intention lock + `ww`; one WRITE of value + version + free lock per record | 1 |
//!
//! The write-wait lease runs from the completion of the intention-lock CAS: a reader that
//! found a record free read it before that CAS landed, so the commit WRITE lands more than
//! a lease after its read. The upgrade to the write lock must land before the first commit
//! WRITE and at (or before) the read-set validation; it is posted about one round trip
//! before the lease ends, so a record is write-locked for about one round trip (§IV-B:
//! "the actual lock duration … reduced to a mere one RTT"), and readers that meet the
//! intention lock in the meantime validate instead of aborting.
//!
//! `rv` (read-validate lease) = lease − offset and `ww` (write-wait lease) = lease + offset
//! (§VII-B): a reader trusts its implicit lease for less than the lease and a writer waits
//! for more, so clocks whose rates differ by less than `offset / lease` cannot break it.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use dmem_layout::record::{OoccLockWord, OoccRecordHeader};
use dmem_txn::{
    AbortReason, Coordinator, Key, ReadReq, RoundValues, TableId, Transaction, TxnError, TxnKind,
    TxnOutcome, Version, WriteEvent, WriteKind,
};
use dmem_verbs::{Clock, Nanos, Phase, PostList, Verbs, VerbsError};

use crate::drift::DriftingCtx;
use crate::shell::Trace;
use crate::store::{Directory, Image, Loc};

mod commit;
mod execute;
pub mod logic;

pub use logic::{CasDecision, ReadDecision, decide_cas, decide_read, decide_validate};

/// OOCC's knobs (defaults: the artifact's lease 100 µs, offset 1 µs, every technique on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OoccConfig {
    /// Initial lease, ns.
    pub lease_ns: Nanos,
    /// Drift offset, ns: `rv = lease − offset`, `ww = lease + offset` (§VII-B).
    pub offset_ns: Nanos,
    /// Implicit read lease: read-only transactions skip validation inside `rv` (§IV-A).
    /// Off: every read set is validated with a round (plain OCC reads).
    pub implicit_lease: bool,
    /// Delayed write lock (§IV-B): intention lock in execution, upgraded in
    /// Validate&Logging. Off: the execution CAS takes the write lock at once, so readers
    /// of a record being written abort instead of validating.
    pub delayed_lock: bool,
    /// One-op write-unlock (§V): value + version + released lock in one WRITE. Off: the
    /// value WRITE and the unlocking WRITE are two round trips.
    pub one_op_unlock: bool,
    /// How long before the write-wait lease ends the writer starts Validate&Logging (the
    /// lock upgrade, the redo log, read-set validation), ns: about one round trip, so that
    /// records stay write-locked for about one round trip (§IV-B) while the lease wait
    /// overlaps everything before it.
    pub upgrade_lead_ns: Nanos,
    /// Planted bug for the litmus and checker tests: the writer does not wait for the
    /// write-wait lease before its commit WRITE.
    pub bug_skip_lease_wait: bool,
    /// The read-write rules of OOCC's public artifact instead of Alg. 1's, to measure what
    /// they buy (`oocc:artifact-rw`; not serializable, see the crate README): a read-write
    /// transaction that meets an intention lock reads on (Alg. 1 line 4 aborts it), and
    /// right after execution it validates its read set by version only (an intention lock
    /// passes) if it met one or ran past `rv`, else not at all; nothing is validated at
    /// the lease's end.
    pub artifact_rw_rules: bool,
}

impl Default for OoccConfig {
    fn default() -> Self {
        Self {
            lease_ns: 100_000,
            offset_ns: 1_000,
            implicit_lease: true,
            delayed_lock: true,
            one_op_unlock: true,
            upgrade_lead_ns: 3_000,
            bug_skip_lease_wait: false,
            artifact_rw_rules: false,
        }
    }
}

/// The two leases of one coordinator (§VII-A): read-validate ≤ write-wait at every instant.
#[derive(Debug)]
pub struct Leases {
    /// Read-validate lease, ns.
    pub rv: Cell<Nanos>,
    /// Write-wait lease, ns.
    pub ww: Cell<Nanos>,
}

impl Leases {
    /// `lease ∓ offset`.
    #[must_use]
    pub fn new(lease: Nanos, offset: Nanos) -> Rc<Self> {
        Rc::new(Self {
            rv: Cell::new(lease.saturating_sub(offset)),
            ww: Cell::new(lease + offset),
        })
    }
}

/// Counters of one deployment (summed over coordinators).
#[derive(Debug, Default)]
pub struct Stats {
    /// Committed read-only transactions (no write).
    pub ro_committed: Cell<u64>,
    /// Of those, committed in Execute&Locking's round(s) alone (validation skipped).
    pub ro_one_round: Cell<u64>,
    /// Of those, validated because the lease ran out.
    pub ro_lease_expired: Cell<u64>,
    /// Of those, validated because of an intention lock.
    pub ro_intention: Cell<u64>,
    /// Committed read-write transactions.
    pub rw_committed: Cell<u64>,
    /// Aborts.
    pub aborts: Cell<u64>,
    /// Total ns writers slept for the write-wait lease.
    pub lease_wait_ns: Cell<u64>,
    /// Longest execution (begin to commit decision, local clock) of a read-only
    /// transaction since the lease manager last looked.
    pub ro_longest_ns: Cell<u64>,
}

/// Adds `by` to a statistics counter.
pub(crate) fn bump(c: &Cell<u64>, by: u64) {
    c.set(c.get() + by);
}

/// The history's event for a record a committing transaction writes (OOCC, DrTM and DSLR
/// alike): `new` is `Some(None)` for a delete, and a write of a record that was absent is
/// an insert.
pub(crate) fn write_event(
    table: TableId,
    key: Key,
    version: Version,
    new: &Option<Option<Vec<u8>>>,
    present: bool,
) -> WriteEvent {
    WriteEvent {
        table,
        key,
        version,
        kind: match (new, present) {
            (Some(None), _) => WriteKind::Delete,
            (_, false) => WriteKind::Insert,
            _ => WriteKind::Update,
        },
    }
}

/// One OOCC coordinator.
pub struct OoccCoordinator<C> {
    ctx: DriftingCtx<C>,
    dir: Rc<Directory>,
    id: u16,
    seq: u64,
    cfg: OoccConfig,
    leases: Rc<Leases>,
    stats: Rc<Stats>,
    hints: Rc<RefCell<HashMap<Loc, u64>>>,
    history: dmem_deploy::Recorder,
}

impl<C: Verbs + Clock> OoccCoordinator<C> {
    /// A coordinator with id `id` on `ctx`; `hints` is its CN's version-hint cache.
    #[allow(clippy::too_many_arguments)]
    #[must_use]
    pub fn new(
        ctx: DriftingCtx<C>,
        dir: Rc<Directory>,
        id: u16,
        cfg: OoccConfig,
        leases: Rc<Leases>,
        stats: Rc<Stats>,
        hints: Rc<RefCell<HashMap<Loc, u64>>>,
        history: dmem_deploy::Recorder,
    ) -> Self {
        Self {
            ctx,
            dir,
            id,
            seq: 0,
            cfg,
            leases,
            stats,
            hints,
            history,
        }
    }

    /// The coordinator's leases (the lease manager adjusts them).
    #[must_use]
    pub fn leases(&self) -> Rc<Leases> {
        Rc::clone(&self.leases)
    }
}

impl<C: Verbs + Clock> Coordinator for OoccCoordinator<C> {
    type Txn<'a>
        = OoccTxn<'a, C>
    where
        C: 'a;

    async fn begin(&mut self, kind: TxnKind) -> Result<OoccTxn<'_, C>, TxnError> {
        let trace = Trace::start(&mut self.seq, self.id, self.ctx.true_now());
        Ok(OoccTxn {
            trace,
            start: self.ctx.now(),
            co: self,
            kind,
            reads: Vec::new(),
            writes: Vec::new(),
            intention_seen: false,
            logged: false,
            lock_time: 0,
            done: false,
        })
    }
}

#[derive(Debug, Clone)]
struct ReadEntry {
    table: TableId,
    key: Key,
    loc: Loc,
    version: u64,
    image: Image,
}

#[derive(Debug, Clone)]
struct WriteEntry {
    table: TableId,
    key: Key,
    loc: Loc,
    /// Our lock word as installed (intention, or write without the delayed lock).
    lock: OoccLockWord,
    present: bool,
    value: Vec<u8>,
    /// `None`: locked, not written; `Some(None)`: delete; `Some(Some(v))`: new value.
    new: Option<Option<Vec<u8>>>,
}

/// One running OOCC transaction.
pub struct OoccTxn<'a, C> {
    co: &'a mut OoccCoordinator<C>,
    trace: Trace,
    kind: TxnKind,
    start: Nanos,
    reads: Vec<ReadEntry>,
    writes: Vec<WriteEntry>,
    intention_seen: bool,
    /// Whether a redo log was written (an abort then truncates it).
    logged: bool,
    /// When the last intention-lock round completed (local clock): the write-wait lease
    /// runs from here (a reader that saw a record free read it before its CAS landed).
    lock_time: Nanos,
    done: bool,
}

impl<C: Verbs + Clock> OoccTxn<'_, C> {
    fn read_only(&self) -> bool {
        self.kind == TxnKind::ReadOnly
    }

    fn lock_addr(&self, table: TableId, loc: Loc) -> Result<dmem_verbs::RemoteAddr, TxnError> {
        let vlen = self.co.dir.value_len(table)?;
        Ok(self.co.dir.addr(
            loc.mn,
            loc.offset + OoccRecordHeader::lock_offset(vlen) as u64,
        ))
    }

    fn record_len(&self, table: TableId) -> Result<u32, TxnError> {
        Ok(OoccRecordHeader::record_len(self.co.dir.value_len(table)?) as u32)
    }

    fn set_hint(&self, loc: Loc, version: u64) {
        self.co.hints.borrow_mut().insert(loc, version);
    }

    /// Releases every lock this transaction holds (same version), without waiting;
    /// `phase` names the step for crash injection (`Verbs::mark_phase`).
    async fn release_all(&mut self, phase: Phase) {
        let mut list = PostList::new();
        if self.logged {
            list.write(self.log_addr(), &[0u8; 16]);
        }
        for w in &self.writes {
            if let Ok(addr) = self.lock_addr(w.table, w.loc) {
                list.write(addr, &w.lock.released_same_version().to_raw().to_le_bytes());
            }
        }
        if !list.is_empty() {
            self.co.ctx.mark_phase(phase);
            let _ = self.co.ctx.post_detached(list).await;
        }
    }

    async fn fail(&mut self, e: TxnError) -> TxnError {
        if !self.done {
            self.done = true;
            self.release_all(Phase::AbortRelease).await;
            bump(&self.co.stats.aborts, 1);
            self.trace.finish(
                &self.co.history,
                self.co.ctx.true_now(),
                TxnOutcome::Aborted,
                Vec::new(),
            );
        }
        e
    }

    async fn checked<T>(&mut self, r: Result<T, TxnError>) -> Result<T, TxnError> {
        match r {
            Ok(v) => Ok(v),
            Err(e) => Err(self.fail(e).await),
        }
    }

    async fn write_entry(&mut self, table: TableId, key: Key) -> Result<usize, TxnError> {
        if self.read_only() {
            return Err(TxnError::ReadOnly);
        }
        if let Some(i) = self
            .writes
            .iter()
            .position(|w| w.table == table && w.key == key)
        {
            return Ok(i);
        }
        let r = self.round(&[ReadReq::for_update(table, key)]).await;
        self.checked(r).await?;
        self.writes
            .iter()
            .position(|w| w.table == table && w.key == key)
            .ok_or(TxnError::Aborted(AbortReason::LockNotTaken))
    }

    fn check_len(&self, table: TableId, value: &[u8]) -> Result<(), TxnError> {
        let expected = self.co.dir.value_len(table)?;
        if value.len() != expected {
            return Err(TxnError::ValueSize {
                expected,
                got: value.len(),
            });
        }
        Ok(())
    }
}

impl<C: Verbs + Clock> Transaction for OoccTxn<'_, C> {
    async fn read_round(&mut self, reqs: &[ReadReq]) -> Result<RoundValues, TxnError> {
        if self.done {
            return Err(TxnError::Aborted(AbortReason::TransactionIsOver));
        }
        let r = self.round(reqs).await;
        self.checked(r).await
    }

    async fn write(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), TxnError> {
        self.check_len(table, value)?;
        let i = self.write_entry(table, key).await?;
        let w = &mut self.writes[i];
        let present = match &w.new {
            Some(n) => n.is_some(),
            None => w.present,
        };
        if !present {
            return Err(TxnError::KeyState(key.0));
        }
        w.new = Some(Some(value.to_vec()));
        Ok(())
    }

    async fn insert(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), TxnError> {
        self.check_len(table, value)?;
        let i = self.write_entry(table, key).await?;
        let w = &mut self.writes[i];
        let present = match &w.new {
            Some(n) => n.is_some(),
            None => w.present,
        };
        if present {
            return Err(TxnError::KeyState(key.0));
        }
        w.new = Some(Some(value.to_vec()));
        Ok(())
    }

    async fn delete(&mut self, table: TableId, key: Key) -> Result<(), TxnError> {
        let i = self.write_entry(table, key).await?;
        let w = &mut self.writes[i];
        let present = match &w.new {
            Some(n) => n.is_some(),
            None => w.present,
        };
        if !present {
            return Err(TxnError::KeyState(key.0));
        }
        w.new = Some(None);
        Ok(())
    }

    async fn commit(mut self) -> Result<(), TxnError> {
        if self.done {
            return Err(TxnError::Aborted(AbortReason::TransactionIsOver));
        }
        let r = if self.writes.iter().any(|w| w.new.is_some()) {
            self.commit_read_write().await
        } else {
            self.commit_read_only().await
        };
        match r {
            Ok(()) => Ok(()),
            Err(e) if self.done => Err(e),
            Err(e) => Err(self.fail(e).await),
        }
    }

    async fn abort(mut self) {
        let _ = self.fail(TxnError::Aborted(AbortReason::ByTheCaller)).await;
    }
}

/// A verbs failure as a transaction error.
#[must_use]
pub fn verbs_error(e: VerbsError) -> TxnError {
    TxnError::Verbs(e)
}
