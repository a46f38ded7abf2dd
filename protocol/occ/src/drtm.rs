//! DrTM's lease-based shared locks (OOCC §II-A; DrTM, SOSP'15 §4.3) on one-sided verbs.
//!
//! The record is the OOCC record (lock word at the highest address); the value carries an
//! 8-byte version in front (for histories), and the lock word is
//!
//! ```text
//!  63        48  47  46  45                                    0
//! +------------+---+---+---------------------------------------+
//! | owner (16) | W | W |  lease end, ns of the readers' clocks  |
//! +------------+---+---+---------------------------------------+
//! ```
//!
//! (both lock bits set when write-locked, so OOCC's recovery releases DrTM's locks too).
//!
//! * A read CASes the lease end to `now + lease` and READs the record in the same post
//!   list. A CAS that loses to a valid lease shares it (the READ behind it is good while
//!   that lease lasts); an expired or nearly expired one is CASed again; a write lock
//!   aborts.
//! * A write CASes the free word to the write-locked word, after its lease ended: a lease
//!   still running is waited out (lease 400 µs, as in DrTM and OOCC §VIII-A) by a
//!   transaction that holds no write lock yet; one that holds some aborts instead, so that
//!   readers renewing the lease cannot keep its locks held.
//! * Commit: every read's lease must still hold (`now + delta < lease end`), else abort;
//!   read-write transactions then WRITE the redo log, WRITE the records, WRITE the unlocks
//!   (three round trips, DrTM's commit order). Lease ends are absolute times of different
//!   clocks: `delta` covers the clock offsets (§VII-B).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use dmem_layout::record::{OoccLockState, OoccLockWord, OoccRecordHeader};
use dmem_txn::{
    AbortReason, Coordinator, HistorySink, Key, ReadEvent, ReadReq, RoundValues, TableId,
    Transaction, TxnError, TxnKind, TxnOutcome, Version,
};
use dmem_verbs::{Clock, Nanos, PostList, RemoteAddr, Verbs};

use crate::drift::DriftingCtx;
use crate::oocc::{Stats, bump, write_event};
use crate::recovery::RedoLogWriter;
use crate::rounds::{self, HeldValue, LockTarget};
use crate::shell::Trace;
use crate::store::{Directory, Loc, parse};
use crate::versioned::{commit_image, version_of};

pub mod logic;

use logic::{LeaseWait, Settled};

/// DrTM's knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrtmConfig {
    /// Read lease, ns (DrTM: 400 µs).
    pub lease_ns: Nanos,
    /// Clock uncertainty, ns: a lease counts until `end − delta` for readers and from
    /// `end + delta` for writers.
    pub delta_ns: Nanos,
    /// A shared lease is reused only if it has at least this much left, ns.
    pub min_left_ns: Nanos,
}

impl Default for DrtmConfig {
    fn default() -> Self {
        Self {
            lease_ns: 400_000,
            delta_ns: 2_000,
            min_left_ns: 50_000,
        }
    }
}

/// One DrTM coordinator.
pub struct DrtmCoordinator<C> {
    ctx: DriftingCtx<C>,
    dir: Rc<Directory>,
    id: u16,
    seq: u64,
    cfg: DrtmConfig,
    stats: Rc<Stats>,
    hints: Rc<RefCell<HashMap<Loc, u64>>>,
    history: dmem_deploy::Recorder,
}

impl<C: Verbs + Clock> DrtmCoordinator<C> {
    /// A coordinator (see [`crate::oocc::OoccCoordinator::new`]).
    #[allow(clippy::too_many_arguments)]
    #[must_use]
    pub fn new(
        ctx: DriftingCtx<C>,
        dir: Rc<Directory>,
        id: u16,
        cfg: DrtmConfig,
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
            stats,
            hints,
            history,
        }
    }
}

impl<C: Verbs + Clock> Coordinator for DrtmCoordinator<C> {
    type Txn<'a>
        = DrtmTxn<'a, C>
    where
        C: 'a;

    async fn begin(&mut self, kind: TxnKind) -> Result<DrtmTxn<'_, C>, TxnError> {
        let trace = Trace::start(&mut self.seq, self.id, self.ctx.true_now());
        Ok(DrtmTxn {
            trace,
            co: self,
            kind,
            entries: Vec::new(),
            done: false,
        })
    }
}

/// A record a round still has to CAS: table, key, whether for a write lock, slot, and
/// the word the CAS expects.
#[derive(Debug, Clone, Copy)]
struct Todo {
    table: TableId,
    key: Key,
    exclusive: bool,
    loc: Loc,
    expected: u64,
}

#[derive(Debug, Clone)]
struct Entry {
    table: TableId,
    key: Key,
    loc: Loc,
    /// Write-locked by us (the word we installed), or read under a lease ending here.
    lock: Option<u64>,
    lease_end: Nanos,
    version: u64,
    present: bool,
    value: Vec<u8>,
    new: Option<Option<Vec<u8>>>,
}

/// One running DrTM transaction.
pub struct DrtmTxn<'a, C> {
    co: &'a mut DrtmCoordinator<C>,
    trace: Trace,
    kind: TxnKind,
    entries: Vec<Entry>,
    done: bool,
}

impl<C: Verbs + Clock> DrtmTxn<'_, C> {
    fn vlen(&self, table: TableId) -> Result<usize, TxnError> {
        Ok(self.co.dir.value_len(table)? - 8)
    }

    fn lock_addr(&self, table: TableId, loc: Loc) -> Result<RemoteAddr, TxnError> {
        let phys = self.co.dir.value_len(table)?;
        Ok(self.co.dir.addr(
            loc.mn,
            loc.offset + OoccRecordHeader::lock_offset(phys) as u64,
        ))
    }

    /// Locks or leases `targets` (table, key, exclusive), one CAS + READ per record per
    /// round, until every one is settled.
    async fn acquire(&mut self, targets: Vec<LockTarget>) -> Result<(), TxnError> {
        let mut todo: Vec<Todo> = Vec::new();
        for LockTarget {
            table,
            key,
            exclusive,
        } in targets
        {
            let loc = self.co.dir.locate(&self.co.ctx, table, key).await?;
            let expected = self.co.hints.borrow().get(&loc).copied().unwrap_or(0);
            todo.push(Todo {
                table,
                key,
                exclusive,
                loc,
                expected,
            });
        }
        for _ in 0..64 {
            if todo.is_empty() {
                return Ok(());
            }
            self.wait_out_leases(&todo).await?;
            todo = self.cas_round(todo).await?;
        }
        Err(TxnError::Aborted(AbortReason::LeaseKeptChanging))
    }

    /// A write lock may only replace an expired lease: waits out the ones the write
    /// targets expect, or aborts ([`logic::lease_wait`]).
    async fn wait_out_leases(&self, todo: &[Todo]) -> Result<(), TxnError> {
        let now = self.co.ctx.now();
        let words = todo.iter().filter(|t| t.exclusive).map(|t| t.expected);
        let holds_locks = self.entries.iter().any(|e| e.lock.is_some());
        match logic::lease_wait(words, now, &self.co.cfg, holds_locks) {
            LeaseWait::Go => Ok(()),
            LeaseWait::Abort(reason) => Err(TxnError::Aborted(reason)),
            LeaseWait::Until(expires) => {
                bump(&self.co.stats.lease_wait_ns, expires - now);
                self.co.ctx.sleep_until(expires).await;
                Ok(())
            }
        }
    }

    /// One round of `todo`: a CAS + READ per record, each settled by
    /// [`logic::settle_cas`]. Returns the records to CAS again.
    async fn cas_round(&mut self, todo: Vec<Todo>) -> Result<Vec<Todo>, TxnError> {
        let cfg = self.co.cfg;
        let now = self.co.ctx.now();
        let mut list = PostList::new();
        let mut ids = Vec::new();
        for t in &todo {
            let swap = logic::swap_word(t.exclusive, self.co.id, t.expected, now, cfg.lease_ns);
            let cas = list.cas(self.lock_addr(t.table, t.loc)?, t.expected, swap);
            let phys = self.co.dir.value_len(t.table)?;
            let read = list.read(
                self.co.dir.addr(t.loc.mn, t.loc.offset),
                OoccRecordHeader::record_len(phys) as u32,
            );
            ids.push((cas, read, swap));
        }
        let res = self.co.ctx.post(list).await?;
        let now = self.co.ctx.now();
        let mut next = Vec::new();
        let mut failure = None;
        for (t, (cas, read, swap)) in todo.into_iter().zip(ids) {
            let r = res.atomic(cas);
            self.co.hints.borrow_mut().insert(t.loc, logic::hint_of(r));
            let got = match logic::settle_cas(r, t.expected, swap, t.exclusive, now, &cfg) {
                Settled::WriteLocked => {
                    // Settle the rest of the round first: its locks must be released.
                    failure = Some(TxnError::Aborted(AbortReason::RecordWriteLocked));
                    None
                }
                Settled::Locked => Some((0, Some(swap))),
                Settled::Leased(end) => {
                    self.co.hints.borrow_mut().insert(t.loc, swap);
                    Some((end, None))
                }
                Settled::Shared(end) => Some((end, None)),
                Settled::Retry => {
                    next.push(Todo { expected: r, ..t });
                    None
                }
            };
            if let Some((lease_end, lock)) = got {
                self.take_entry(t, lease_end, lock, res.bytes(read));
            }
        }
        failure.map_or(Ok(next), Err)
    }

    /// Takes a settled record (its READ `bytes`) into the transaction.
    fn take_entry(&mut self, t: Todo, lease_end: Nanos, lock: Option<u64>, bytes: &[u8]) {
        let image = parse(bytes, self.co.dir.value_len(t.table).unwrap_or(8));
        let version = version_of(&image.value);
        self.trace.reads.push(ReadEvent {
            writer: image.writer,
            ..ReadEvent::new(t.table, t.key, Version(version))
        });
        self.entries.push(Entry {
            table: t.table,
            key: t.key,
            loc: t.loc,
            lock,
            lease_end,
            version,
            present: image.present,
            value: image.value[8..].to_vec(),
            new: None,
        });
    }

    async fn release_all(&mut self) {
        let mut list = PostList::new();
        for e in &self.entries {
            if let (Some(w), Ok(addr)) = (e.lock, self.lock_addr(e.table, e.loc)) {
                list.write(addr, &logic::released(w).to_le_bytes());
            }
        }
        if !list.is_empty() {
            let _ = self.co.ctx.post_detached(list).await;
        }
    }

    async fn fail(&mut self, e: TxnError) -> TxnError {
        if !self.done {
            self.done = true;
            self.release_all().await;
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

    async fn round(&mut self, reqs: &[ReadReq]) -> Result<RoundValues, TxnError> {
        for r in reqs {
            self.co.dir.value_len(r.table)?;
        }
        let entries = &self.entries;
        let find = |table, key| entries.iter().find(|e| e.table == table && e.key == key);
        let targets = rounds::lock_targets(
            reqs,
            self.kind,
            |table, key| find(table, key).map(|e| e.lock.is_some()),
            AbortReason::LockUpgradeOfLeasedRecord,
        )?;
        self.acquire(targets).await?;
        let entries = &self.entries;
        rounds::answers(
            reqs,
            |table, key| {
                let e = entries.iter().find(|e| e.table == table && e.key == key)?;
                Some(HeldValue {
                    present: e.present,
                    value: &e.value,
                    staged: &e.new,
                })
            },
            AbortReason::RecordNotAcquired,
        )
    }

    async fn entry_for_write(&mut self, table: TableId, key: Key) -> Result<usize, TxnError> {
        if self.kind == TxnKind::ReadOnly {
            return Err(TxnError::ReadOnly);
        }
        if self
            .entries
            .iter()
            .all(|e| e.table != table || e.key != key)
        {
            let r = self.round(&[ReadReq::for_update(table, key)]).await;
            if let Err(e) = r {
                return Err(self.fail(e).await);
            }
        }
        let i = self
            .entries
            .iter()
            .position(|e| e.table == table && e.key == key)
            .ok_or(TxnError::Aborted(AbortReason::RecordNotAcquired))?;
        if self.entries[i].lock.is_none() {
            return Err(self
                .fail(TxnError::Aborted(AbortReason::LockUpgradeOfLeasedRecord))
                .await);
        }
        Ok(i)
    }

    async fn set(
        &mut self,
        table: TableId,
        key: Key,
        value: Option<&[u8]>,
        want_present: bool,
    ) -> Result<(), TxnError> {
        if let Some(v) = value
            && v.len() != self.vlen(table)?
        {
            return Err(TxnError::ValueSize {
                expected: self.vlen(table)?,
                got: v.len(),
            });
        }
        let i = self.entry_for_write(table, key).await?;
        let e = &mut self.entries[i];
        let present = match &e.new {
            Some(n) => n.is_some(),
            None => e.present,
        };
        if present != want_present {
            return Err(TxnError::KeyState(key.0));
        }
        e.new = Some(value.map(<[u8]>::to_vec));
        Ok(())
    }

    /// A transaction that writes nothing: its leases held until now, so it commits.
    async fn commit_read_only(&mut self) {
        self.release_all().await;
        bump(&self.co.stats.ro_committed, 1);
        bump(&self.co.stats.ro_one_round, 1);
        self.done = true;
        self.trace.finish(
            &self.co.history,
            self.co.ctx.true_now(),
            TxnOutcome::Committed,
            Vec::new(),
        );
    }

    /// The redo log (the OOCC format, so that OOCC's recovery serves DrTM too) and each
    /// written record's new image (its lock word released, the lease end after it).
    fn redo_log(&self, written: &[Entry]) -> Result<(Vec<u8>, Vec<Vec<u8>>), TxnError> {
        let mut log = RedoLogWriter::new(self.co.id, self.trace.id.seq, written.len());
        let mut images = Vec::new();
        for e in written {
            let phys = self.co.dir.value_len(e.table)?;
            let lock = e.lock.unwrap_or(0);
            let released = OoccLockWord::from_raw((logic::released(lock) + 1) & logic::END);
            let image = commit_image(
                e.table,
                e.key,
                e.version + 1,
                &e.new,
                phys,
                released,
                self.trace.id,
            );
            log.push(e.loc, &image);
            images.push(image);
        }
        let log = log
            .finish()
            .ok_or(TxnError::Aborted(AbortReason::RedoLogLargerThanRegion))?;
        Ok((log, images))
    }

    /// Records the decision to commit `written`.
    fn record_decided(&mut self, written: &[Entry]) {
        let writes = written
            .iter()
            .map(|e| write_event(e.table, e.key, Version(e.version + 1), &e.new, e.present))
            .collect();
        self.done = true;
        self.trace.finish(
            &self.co.history,
            self.co.ctx.true_now(),
            TxnOutcome::Unknown,
            writes,
        );
    }

    /// The records (header + value), then the unlocks: two round trips.
    async fn write_and_unlock(
        &self,
        written: &[Entry],
        images: &[Vec<u8>],
    ) -> Result<(), TxnError> {
        let dir = &self.co.dir;
        let mut list = PostList::new();
        let mut unlock = PostList::new();
        for (e, image) in written.iter().zip(images) {
            let at = image.len() - 8;
            list.write(dir.addr(e.loc.mn, e.loc.offset), &image[..at]);
            unlock.write(self.lock_addr(e.table, e.loc)?, &image[at..]);
        }
        for e in self.entries.iter().filter(|e| e.new.is_none()) {
            if let Some(w) = e.lock {
                unlock.write(
                    self.lock_addr(e.table, e.loc)?,
                    &logic::released(w).to_le_bytes(),
                );
            }
        }
        self.co.ctx.post(list).await?;
        self.co.ctx.post(unlock).await?;
        Ok(())
    }

    /// Commit: every read's lease must still hold, else abort; a read-write transaction
    /// then WRITEs the redo log, the records, the unlocks (DrTM's commit order).
    async fn commit_inner(&mut self) -> Result<(), TxnError> {
        let now = self.co.ctx.now();
        let leases = self
            .entries
            .iter()
            .filter(|e| e.lock.is_none())
            .map(|e| e.lease_end);
        if !logic::leases_hold(leases, now, self.co.cfg.delta_ns) {
            return Err(TxnError::Aborted(AbortReason::ReadLeaseExpired));
        }
        let written: Vec<Entry> = self
            .entries
            .iter()
            .filter(|e| e.new.is_some())
            .cloned()
            .collect();
        if written.is_empty() {
            self.commit_read_only().await;
            return Ok(());
        }
        let (log, images) = self.redo_log(&written)?;
        let layout = self.co.dir.layout();
        let log_addr = self
            .co
            .dir
            .addr(layout.log_mn(self.co.id), layout.log_offset(self.co.id));
        self.record_decided(&written);
        // Decided: recorded before the log, whose landing makes recovery roll forward.
        let mut list = PostList::new();
        list.write_owned(log_addr, log);
        self.co.ctx.post(list).await?;
        self.write_and_unlock(&written, &images).await?;
        // Resolved before the log is truncated, never after: recovery settles an `Unknown`
        // transaction whose coordinator left no log as aborted, so a CN killed between a
        // landed truncation and its resolution would leave versions that no transaction of
        // the history installed.
        bump(&self.co.stats.rw_committed, 1);
        self.co
            .history
            .resolve(self.trace.id, TxnOutcome::Committed, self.co.ctx.true_now());
        let mut trunc = PostList::new();
        trunc.write(log_addr, &[0u8; 16]);
        let _ = self.co.ctx.post_detached(trunc).await;
        Ok(())
    }
}

crate::shell::lock_based_transaction!(DrtmTxn);

/// Whether a raw DrTM lock word is write-locked (for tests).
#[must_use]
pub fn is_write_locked(word: u64) -> bool {
    OoccLockWord::from_raw(word).state() == Ok(OoccLockState::Write)
}
