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
    AbortReason, Coordinator, CoordinatorId, HistorySink, Key, ReadEvent, ReadReq, RoundValues,
    TableId, Transaction, TxnError, TxnId, TxnKind, TxnOutcome, TxnRecord, Version,
};
use dmem_verbs::{Clock, Nanos, PostList, RemoteAddr, Verbs};

use crate::drift::DriftingCtx;
use crate::oocc::{Stats, bump, write_event};
use crate::recovery::RedoLogWriter;
use crate::store::{Directory, Loc, emit, parse};

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

const LOCKED: u64 = (1 << 46) | (1 << 47);
const END: u64 = (1 << 46) - 1;

/// How far ahead of a reader's clock a lease can end: a lease is set at most `lease_ns`
/// ahead by a clock at most `delta_ns` off (the drift model's offsets included), so a second
/// is far beyond any real one and far below the 2^46 ns (19.5 hours) a lease word holds.
const LEASE_HORIZON_NS: Nanos = 1_000_000_000;

/// The clock time a lease word's `END` bits stand for, read at `now`.
///
/// A lease word keeps the low 46 bits of a time. A clock that has run longer than 2^46 ns
/// (a real CN's monotonic clock on a host up for more than 19.5 hours) wraps them, and
/// comparing the raw bits against `now` then took every fresh lease for expired: DrTM
/// aborted almost every transaction with "read lease expired". The bits are taken in the
/// period that puts them at most [`LEASE_HORIZON_NS`] ahead of `now`; anything further is
/// from the previous period (an old lease, or a fresh word's 0). Below 2^46 ns (every
/// simulated run) this is the raw bits unless they lie more than a second ahead.
fn lease_time(word: u64, now: Nanos) -> Nanos {
    let period = END + 1;
    let limit = now.saturating_add(LEASE_HORIZON_NS);
    let t = (now & !END) | (word & END);
    if t > limit {
        t.saturating_sub(period)
    } else if t.saturating_add(period) <= limit {
        t + period
    } else {
        t
    }
}

fn locked(w: u64) -> bool {
    w & LOCKED != 0
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
        self.seq += 1;
        let id = TxnId {
            coordinator: CoordinatorId(u32::from(self.id)),
            seq: self.seq,
        };
        Ok(DrtmTxn {
            begin_true: self.ctx.true_now(),
            co: self,
            id,
            kind,
            entries: Vec::new(),
            events: Vec::new(),
            done: false,
        })
    }
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
    id: TxnId,
    kind: TxnKind,
    begin_true: Nanos,
    entries: Vec<Entry>,
    events: Vec<ReadEvent>,
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
    async fn acquire(&mut self, targets: Vec<(TableId, Key, bool)>) -> Result<(), TxnError> {
        let mut todo: Vec<(TableId, Key, bool, Loc, u64)> = Vec::new();
        for (table, key, exclusive) in targets {
            let loc = self.co.dir.locate(&self.co.ctx, table, key).await?;
            let hint = self.co.hints.borrow().get(&loc).copied().unwrap_or(0);
            todo.push((table, key, exclusive, loc, hint));
        }
        let cfg = self.co.cfg;
        for _ in 0..64 {
            if todo.is_empty() {
                return Ok(());
            }
            // A write lock may only replace an expired lease: wait out the ones expected.
            let now = self.co.ctx.now();
            let expires = todo
                .iter()
                .filter(|t| t.2)
                .map(|t| lease_time(t.4, now) + cfg.delta_ns)
                .max()
                .unwrap_or(0);
            if expires > now {
                // Waiting while holding write locks would let readers that keep renewing
                // the lease starve this writer with its locks held (and every reader of
                // those): a writer waits only while it holds nothing, else it aborts.
                if self.entries.iter().any(|e| e.lock.is_some()) {
                    return Err(TxnError::Aborted(AbortReason::LeaseRunningWhileLocking));
                }
                if expires - now > 2 * cfg.lease_ns {
                    return Err(TxnError::Aborted(AbortReason::LeaseTooLongToWaitOut));
                }
                bump(&self.co.stats.lease_wait_ns, expires - now);
                self.co.ctx.sleep_until(expires).await;
            }
            let now = self.co.ctx.now();
            let mut list = PostList::new();
            let mut ids = Vec::new();
            for &(table, _, exclusive, loc, expected) in &todo {
                let swap = if exclusive {
                    (u64::from(self.co.id) << 48) | LOCKED | (expected & END)
                } else {
                    (now + cfg.lease_ns) & END
                };
                let cas = list.cas(self.lock_addr(table, loc)?, expected, swap);
                let phys = self.co.dir.value_len(table)?;
                let read = list.read(
                    self.co.dir.addr(loc.mn, loc.offset),
                    OoccRecordHeader::record_len(phys) as u32,
                );
                ids.push((cas, read, swap));
            }
            let res = self.co.ctx.post(list).await?;
            let now = self.co.ctx.now();
            let mut next = Vec::new();
            let mut failure = None;
            for ((table, key, exclusive, loc, expected), (cas, read, swap)) in
                todo.into_iter().zip(ids)
            {
                let r = res.atomic(cas);
                self.co
                    .hints
                    .borrow_mut()
                    .insert(loc, if locked(r) { 0 } else { r });
                let settle = |lease_end: Nanos, lock: Option<u64>| {
                    (
                        lease_end,
                        lock,
                        parse(res.bytes(read), self.co.dir.value_len(table).unwrap_or(8)),
                    )
                };
                let got = if locked(r) {
                    // Settle the rest of the round first: its locks must be released.
                    failure = Some(TxnError::Aborted(AbortReason::RecordWriteLocked));
                    None
                } else if r == expected {
                    if exclusive {
                        Some(settle(0, Some(swap)))
                    } else {
                        self.co.hints.borrow_mut().insert(loc, swap);
                        Some(settle(lease_time(swap, now), None))
                    }
                } else if exclusive {
                    // Free at another word: CAS again once its lease ran out (the next
                    // round waits for it, or aborts if this round locked something).
                    next.push((table, key, exclusive, loc, r));
                    None
                } else if lease_time(r, now) > now + cfg.delta_ns + cfg.min_left_ns {
                    // A valid lease: share it.
                    Some(settle(lease_time(r, now), None))
                } else {
                    next.push((table, key, exclusive, loc, r));
                    None
                };
                if let Some((lease_end, lock, image)) = got {
                    let version = u64::from_le_bytes(image.value[..8].try_into().unwrap_or([0; 8]));
                    self.events
                        .push(ReadEvent::new(table, key, Version(version)));
                    self.entries.push(Entry {
                        table,
                        key,
                        loc,
                        lock,
                        lease_end,
                        version,
                        present: image.present,
                        value: image.value[8..].to_vec(),
                        new: None,
                    });
                }
            }
            if let Some(e) = failure {
                return Err(e);
            }
            todo = next;
        }
        Err(TxnError::Aborted(AbortReason::LeaseKeptChanging))
    }

    async fn release_all(&mut self) {
        let mut list = PostList::new();
        for e in &self.entries {
            if let (Some(w), Ok(addr)) = (e.lock, self.lock_addr(e.table, e.loc)) {
                list.write(addr, &(w & END).to_le_bytes());
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
            self.co.history.record(TxnRecord {
                id: self.id,
                begin: self.begin_true,
                end: self.co.ctx.true_now(),
                outcome: TxnOutcome::Aborted,
                reads: std::mem::take(&mut self.events),
                writes: Vec::new(),
            });
        }
        e
    }

    async fn round(&mut self, reqs: &[ReadReq]) -> Result<RoundValues, TxnError> {
        let mut targets = Vec::new();
        for r in reqs {
            self.co.dir.value_len(r.table)?;
            let exclusive =
                r.access == dmem_txn::Access::ForUpdate && self.kind == TxnKind::ReadWrite;
            match self
                .entries
                .iter()
                .position(|e| e.table == r.table && e.key == r.key)
            {
                Some(i) if self.entries[i].lock.is_some() || !exclusive => {}
                Some(_) => return Err(TxnError::Aborted(AbortReason::LockUpgradeOfLeasedRecord)),
                None => {
                    if !targets.iter().any(|(t, k, _)| *t == r.table && *k == r.key) {
                        targets.push((r.table, r.key, exclusive));
                    }
                }
            }
        }
        self.acquire(targets).await?;
        reqs.iter()
            .map(|r| {
                let e = self
                    .entries
                    .iter()
                    .find(|e| e.table == r.table && e.key == r.key)
                    .ok_or(TxnError::Aborted(AbortReason::RecordNotAcquired))?;
                Ok(match &e.new {
                    Some(n) => n.clone(),
                    None => e.present.then(|| e.value.clone()),
                })
            })
            .collect()
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

    async fn commit_inner(&mut self) -> Result<(), TxnError> {
        let now = self.co.ctx.now();
        let delta = self.co.cfg.delta_ns;
        if self
            .entries
            .iter()
            .any(|e| e.lock.is_none() && now + delta >= e.lease_end)
        {
            return Err(TxnError::Aborted(AbortReason::ReadLeaseExpired));
        }
        let dir = Rc::clone(&self.co.dir);
        let written: Vec<Entry> = self
            .entries
            .iter()
            .filter(|e| e.new.is_some())
            .cloned()
            .collect();
        if written.is_empty() {
            self.release_all().await;
            bump(&self.co.stats.ro_committed, 1);
            bump(&self.co.stats.ro_one_round, 1);
            self.done = true;
            self.co.history.record(TxnRecord {
                id: self.id,
                begin: self.begin_true,
                end: self.co.ctx.true_now(),
                outcome: TxnOutcome::Committed,
                reads: std::mem::take(&mut self.events),
                writes: Vec::new(),
            });
            return Ok(());
        }
        // Redo log (the OOCC format, so that OOCC's recovery serves DrTM too).
        let layout = dir.layout();
        let mut log = RedoLogWriter::new(self.co.id, self.id.seq, written.len());
        let mut images = Vec::new();
        for e in &written {
            let phys = dir.value_len(e.table)?;
            let new = e.new.as_ref().and_then(|n| n.as_deref()).map(|v| {
                let mut p = (e.version + 1).to_le_bytes().to_vec();
                p.extend_from_slice(v);
                p
            });
            let lock = e.lock.unwrap_or(0);
            let released = OoccLockWord::from_raw(((lock & END) + 1) & END);
            let mut image = match new {
                Some(v) => emit(e.table, e.key, Some(&v), phys, released),
                None => {
                    // A delete keeps the version in front of a zeroed value.
                    let mut v = vec![0u8; phys];
                    v[..8].copy_from_slice(&(e.version + 1).to_le_bytes());
                    emit(e.table, e.key, Some(&v), phys, released)
                }
            };
            if e.new.as_ref().is_some_and(Option::is_none) {
                image[14..16].copy_from_slice(&0u16.to_le_bytes());
            }
            log.push(e.loc, &image);
            images.push(image);
        }
        let log = log
            .finish()
            .ok_or(TxnError::Aborted(AbortReason::RedoLogLargerThanRegion))?;
        let log_addr = dir.addr(layout.log_mn(self.co.id), layout.log_offset(self.co.id));
        let writes = written
            .iter()
            .map(|e| write_event(e.table, e.key, Version(e.version + 1), &e.new, e.present))
            .collect();
        self.done = true;
        self.co.history.record(TxnRecord {
            id: self.id,
            begin: self.begin_true,
            end: self.co.ctx.true_now(),
            outcome: TxnOutcome::Unknown,
            reads: std::mem::take(&mut self.events),
            writes,
        });
        // Decided: recorded before the log, whose landing makes recovery roll forward.
        let mut list = PostList::new();
        list.write_owned(log_addr, log);
        self.co.ctx.post(list).await?;
        // Records (header + value), then the unlocks.
        let mut list = PostList::new();
        let mut unlock = PostList::new();
        for (e, image) in written.iter().zip(&images) {
            let at = image.len() - 8;
            list.write(dir.addr(e.loc.mn, e.loc.offset), &image[..at]);
            unlock.write(self.lock_addr(e.table, e.loc)?, &image[at..]);
        }
        for e in self.entries.iter().filter(|e| e.new.is_none()) {
            if let Some(w) = e.lock {
                unlock.write(self.lock_addr(e.table, e.loc)?, &(w & END).to_le_bytes());
            }
        }
        self.co.ctx.post(list).await?;
        self.co.ctx.post(unlock).await?;
        // Resolved before the log is truncated, never after: recovery settles an `Unknown`
        // transaction whose coordinator left no log as aborted, so a CN killed between a
        // landed truncation and its resolution would leave versions that no transaction of
        // the history installed.
        bump(&self.co.stats.rw_committed, 1);
        self.co
            .history
            .resolve(self.id, TxnOutcome::Committed, self.co.ctx.true_now());
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

#[cfg(test)]
mod lease_time_tests {
    use super::{END, LEASE_HORIZON_NS, lease_time};

    const PERIOD: u64 = END + 1;
    const LEASE: u64 = 400_000;

    #[test]
    fn below_one_period_the_bits_are_the_time() {
        for now in [0, 1, 5_000, 123_456_789, END - 2 * LEASE_HORIZON_NS] {
            assert_eq!(lease_time(0, now), 0);
            assert_eq!(lease_time(now + LEASE, now), now + LEASE);
            assert_eq!(
                lease_time(now.saturating_sub(LEASE), now),
                now.saturating_sub(LEASE)
            );
        }
    }

    #[test]
    fn a_clock_past_2_pow_46_reads_fresh_leases_as_fresh() {
        // A host up for 20 hours (the bug: every fresh lease compared as expired).
        for now in [
            PERIOD + 5,
            3 * PERIOD + 1_000,
            2 * PERIOD - 100,
            2 * PERIOD - LEASE / 2,
        ] {
            let stored = (now + LEASE) & END;
            assert_eq!(lease_time(stored, now), now + LEASE, "now {now}");
            let shared = (now + LEASE / 2) & END;
            assert_eq!(lease_time(shared, now), now + LEASE / 2, "now {now}");
            let old = (now - LEASE) & END;
            assert_eq!(lease_time(old, now), now - LEASE, "now {now}");
        }
    }

    #[test]
    fn a_fresh_or_ancient_word_is_expired() {
        for now in [
            PERIOD + 5,
            PERIOD + PERIOD / 2,
            2 * PERIOD - 2 * LEASE_HORIZON_NS,
        ] {
            assert!(lease_time(0, now) <= now, "now {now}");
            // A lease of 15 hours ago.
            let ancient = now - 15 * 3_600_000_000_000;
            assert!(lease_time(ancient & END, now) <= now, "now {now}");
        }
    }
}
