//! OOCC (Alg. 1): implicit read leases, delayed write locks, redo logs and the one-op
//! write-unlock, as plain decisions (the `decide_*` functions, tested on their own) and a
//! thin async shell ([`OoccCoordinator`], [`OoccTxn`]) whose rounds are OOCC's round trips.
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

use dmem_layout::record::{OoccLockState, OoccLockWord, OoccRecordHeader};
use dmem_txn::{
    AbortReason, Access, Coordinator, CoordinatorId, HistorySink, Key, ReadEvent, ReadReq,
    RoundValues, TableId, Transaction, TxnError, TxnId, TxnKind, TxnOutcome, TxnRecord, Version,
    WriteEvent, WriteKind,
};
use dmem_verbs::{Clock, Nanos, Phase, PostList, Verbs, VerbsError, WrId};

use crate::drift::DriftingCtx;
use crate::recovery::RedoLogWriter;
use crate::store::{Directory, Image, Loc, emit, parse};

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

/// What a read of a record decides (Alg. 1 line 4, line 13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadDecision {
    /// Free: covered by the implicit lease.
    Leased,
    /// Intention-locked, read-only transaction: read, validate later.
    Validate,
    /// Write-locked (or intention-locked and the transaction writes): abort.
    Abort,
}

/// Alg. 1 lines 4–5 and 13.
#[must_use]
pub fn decide_read(lock: OoccLockWord, read_only: bool) -> ReadDecision {
    match lock.state() {
        Ok(OoccLockState::Free) => ReadDecision::Leased,
        Ok(OoccLockState::Intention) if read_only => ReadDecision::Validate,
        _ => ReadDecision::Abort,
    }
}

/// What an intention CAS's returned word decides (Alg. 1 lines 8–10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CasDecision {
    /// Locked at the expected version.
    Locked,
    /// Free at another version than the CN's hint: retry the CAS with this word.
    Retry(OoccLockWord),
    /// Held by another transaction: abort.
    Abort,
}

/// Alg. 1 lines 9–10, with the version hint dmem's lock word needs (the intention CAS
/// compares the whole free word, version included).
#[must_use]
pub fn decide_cas(expected: OoccLockWord, returned: u64) -> CasDecision {
    let returned = OoccLockWord::from_raw(returned);
    if returned == expected {
        CasDecision::Locked
    } else if returned.state() == Ok(OoccLockState::Free) {
        CasDecision::Retry(returned)
    } else {
        CasDecision::Abort
    }
}

/// Whether a validation READ of a lock word keeps a read (Alg. 1 lines 14–16): same
/// version and not write-locked; a transaction that writes also refuses an intention lock
/// (two writers that each read what the other locks must not both commit).
#[must_use]
pub fn decide_validate(read_version: u64, now: OoccLockWord, read_only: bool) -> bool {
    now.version() == read_version
        && match now.state() {
            Ok(OoccLockState::Free) => true,
            Ok(OoccLockState::Intention) => read_only,
            _ => false,
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
        self.seq += 1;
        let id = TxnId {
            coordinator: CoordinatorId(u32::from(self.id)),
            seq: self.seq,
        };
        Ok(OoccTxn {
            begin_true: self.ctx.true_now(),
            start: self.ctx.now(),
            co: self,
            id,
            kind,
            reads: Vec::new(),
            writes: Vec::new(),
            events: Vec::new(),
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
    id: TxnId,
    kind: TxnKind,
    begin_true: Nanos,
    start: Nanos,
    reads: Vec<ReadEntry>,
    writes: Vec<WriteEntry>,
    events: Vec<ReadEvent>,
    intention_seen: bool,
    /// Whether a redo log was written (an abort then truncates it).
    logged: bool,
    /// When the last intention-lock round completed (local clock): the write-wait lease
    /// runs from here (a reader that saw a record free read it before its CAS landed).
    lock_time: Nanos,
    done: bool,
}

enum Pending {
    Local(Option<Vec<u8>>),
    Read { idx: usize, loc: Loc, id: WrId },
    Lock { idx: usize },
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

    fn hint(&self, loc: Loc) -> OoccLockWord {
        let v = self.co.hints.borrow().get(&loc).copied().unwrap_or(0);
        OoccLockWord::from_raw(v & OoccLockWord::MAX_VERSION)
    }

    fn set_hint(&self, loc: Loc, version: u64) {
        self.co.hints.borrow_mut().insert(loc, version);
    }

    fn lock_word_for(&self, free: OoccLockWord) -> OoccLockWord {
        let intention = free.with_intention_lock(self.co.id);
        if self.co.cfg.delayed_lock {
            intention
        } else {
            intention.with_write_lock()
        }
    }

    /// Locks the records of `targets` (table, key, loc) with CAS + READ, retrying a CAS
    /// whose hint was stale. Returns, per target, the image read under the lock.
    async fn lock_all(
        &mut self,
        targets: &[(TableId, Key, Loc)],
    ) -> Result<Vec<(OoccLockWord, Image)>, TxnError> {
        let mut out: Vec<Option<(OoccLockWord, Image)>> = vec![None; targets.len()];
        let mut expected: Vec<OoccLockWord> = targets
            .iter()
            .map(|(_, _, loc)| {
                // A record already read: lock at the version read.
                self.reads
                    .iter()
                    .find(|r| r.loc == *loc)
                    .map_or_else(|| self.hint(*loc), |r| OoccLockWord::from_raw(r.version))
            })
            .collect();
        for _ in 0..4 {
            let todo: Vec<usize> = (0..targets.len()).filter(|i| out[*i].is_none()).collect();
            if todo.is_empty() {
                break;
            }
            let mut list = PostList::new();
            let mut ids = Vec::new();
            for &i in &todo {
                let (table, _, loc) = targets[i];
                let swap = self.lock_word_for(expected[i]);
                let cas = list.cas(
                    self.lock_addr(table, loc)?,
                    expected[i].to_raw(),
                    swap.to_raw(),
                );
                let read = list.read(
                    self.co.dir.addr(loc.mn, loc.offset),
                    self.record_len(table)?,
                );
                ids.push((i, cas, read, swap));
            }
            self.co.ctx.mark_phase(Phase::Lock);
            let res = self.co.ctx.post(list).await?;
            self.lock_time = self.co.ctx.now();
            let mut failure = None;
            for (i, cas, read, swap) in ids {
                let (table, _, loc) = targets[i];
                match decide_cas(expected[i], res.atomic(cas)) {
                    CasDecision::Locked => {
                        let image = parse(res.bytes(read), self.co.dir.value_len(table)?);
                        out[i] = Some((swap, image));
                    }
                    CasDecision::Retry(word) => {
                        self.set_hint(loc, word.version());
                        if self.reads.iter().any(|r| r.loc == loc) {
                            // Read at another version: it changed since, so it would fail
                            // validation anyway.
                            failure = Some(TxnError::Aborted(AbortReason::RecordChangedSinceRead));
                        }
                        expected[i] = word;
                    }
                    CasDecision::Abort => {
                        failure = Some(TxnError::Aborted(AbortReason::RecordLockedByAnother));
                    }
                }
            }
            if let Some(e) = failure {
                // Keep what this call locked so that the abort releases it.
                self.adopt_locks(targets, &out);
                return Err(e);
            }
        }
        if out.iter().any(Option::is_none) {
            self.adopt_locks(targets, &out);
            return Err(TxnError::Aborted(
                AbortReason::IntentionLockVersionKeptChanging,
            ));
        }
        Ok(out.into_iter().flatten().collect())
    }

    async fn round(&mut self, reqs: &[ReadReq]) -> Result<RoundValues, TxnError> {
        let mut pending = Vec::with_capacity(reqs.len());
        let mut list = PostList::new();
        let mut to_lock: Vec<(TableId, Key, Loc)> = Vec::new();
        for r in reqs {
            self.co.dir.value_len(r.table)?;
            if let Some(w) = self
                .writes
                .iter()
                .find(|w| w.table == r.table && w.key == r.key)
            {
                let v = match &w.new {
                    Some(n) => n.clone(),
                    None => w.present.then(|| w.value.clone()),
                };
                pending.push(Pending::Local(v));
                continue;
            }
            let for_update = r.access == Access::ForUpdate && !self.read_only();
            if !for_update
                && let Some(e) = self
                    .reads
                    .iter()
                    .find(|e| e.table == r.table && e.key == r.key)
            {
                pending.push(Pending::Local(
                    e.image.present.then(|| e.image.value.clone()),
                ));
                continue;
            }
            let loc = self.co.dir.locate(&self.co.ctx, r.table, r.key).await?;
            if for_update {
                if !to_lock.iter().any(|(t, k, _)| *t == r.table && *k == r.key) {
                    to_lock.push((r.table, r.key, loc));
                }
                let idx = to_lock
                    .iter()
                    .position(|(t, k, _)| *t == r.table && *k == r.key)
                    .unwrap_or(0);
                pending.push(Pending::Lock { idx });
            } else {
                let id = list.read(
                    self.co.dir.addr(loc.mn, loc.offset),
                    self.record_len(r.table)?,
                );
                pending.push(Pending::Read { idx: 0, loc, id });
            }
        }
        // One round: the READs of the read set, then the CAS + READ pairs of the write set
        // (lock_all posts its first attempt together with the reads when there are both).
        let mut images: Vec<Image> = Vec::new();
        let mut read_idx = 0;
        let locked = if to_lock.is_empty() {
            if !list.is_empty() {
                self.co.ctx.mark_phase(Phase::Execute);
                let res = self.co.ctx.post(list).await?;
                for p in &mut pending {
                    if let Pending::Read { idx, id, .. } = p {
                        *idx = read_idx;
                        read_idx += 1;
                        images.push(Image {
                            present: false,
                            value: res.bytes(*id).to_vec(),
                            lock: OoccLockWord::from_raw(0),
                        });
                    }
                }
            }
            Vec::new()
        } else {
            // Reads and locks in one post list: lock_all's first attempt carries the reads.
            self.lock_with_reads(&to_lock, list, &mut pending, &mut images)
                .await?
        };
        // Parse the reads against their tables.
        let mut values = Vec::with_capacity(reqs.len());
        for (r, p) in reqs.iter().zip(pending) {
            match p {
                Pending::Local(v) => values.push(v),
                Pending::Read { idx, loc, .. } => {
                    let image = parse(&images[idx].value, self.co.dir.value_len(r.table)?);
                    let version = image.lock.version();
                    self.set_hint(loc, version);
                    let as_reader = self.read_only() || self.co.cfg.artifact_rw_rules;
                    match decide_read(image.lock, as_reader) {
                        ReadDecision::Leased => {}
                        ReadDecision::Validate => self.intention_seen = true,
                        ReadDecision::Abort => {
                            // The CASes of this round's post list took their locks too:
                            // keep them so that the abort releases them (they leaked
                            // before, and a TPC-C New-Order that met a Payment's intention
                            // lock on WAREHOUSE left DISTRICT locked for the run).
                            let all: Vec<_> = locked.iter().cloned().map(Some).collect();
                            self.adopt_locks(&to_lock, &all);
                            return Err(TxnError::Aborted(AbortReason::RecordLocked));
                        }
                    }
                    self.events
                        .push(ReadEvent::new(r.table, r.key, Version(version)));
                    values.push(image.present.then(|| image.value.clone()));
                    self.reads.push(ReadEntry {
                        table: r.table,
                        key: r.key,
                        loc,
                        version,
                        image,
                    });
                }
                Pending::Lock { idx, .. } => {
                    let (word, image) = &locked[idx];
                    values.push(image.present.then(|| image.value.clone()));
                    if !self
                        .writes
                        .iter()
                        .any(|w| w.table == r.table && w.key == r.key)
                    {
                        let (table, key, loc) = to_lock[idx];
                        self.events
                            .push(ReadEvent::new(table, key, Version(word.version())));
                        self.reads.retain(|e| e.loc != loc);
                        self.writes.push(WriteEntry {
                            table,
                            key,
                            loc,
                            lock: *word,
                            present: image.present,
                            value: image.value.clone(),
                            new: None,
                        });
                    }
                }
            }
        }
        Ok(values)
    }

    /// The execution round with locks: the READs in `list` go out with the first CAS +
    /// READ attempt; stale-hint retries take further rounds.
    async fn lock_with_reads(
        &mut self,
        to_lock: &[(TableId, Key, Loc)],
        list: PostList,
        pending: &mut [Pending],
        images: &mut Vec<Image>,
    ) -> Result<Vec<(OoccLockWord, Image)>, TxnError> {
        let mut list = list;
        let mut out: Vec<Option<(OoccLockWord, Image)>> = vec![None; to_lock.len()];
        let mut ids = Vec::new();
        for (i, (table, _, loc)) in to_lock.iter().enumerate() {
            let expected = self
                .reads
                .iter()
                .find(|r| r.loc == *loc)
                .map_or_else(|| self.hint(*loc), |r| OoccLockWord::from_raw(r.version));
            let swap = self.lock_word_for(expected);
            let cas = list.cas(
                self.lock_addr(*table, *loc)?,
                expected.to_raw(),
                swap.to_raw(),
            );
            let read = list.read(
                self.co.dir.addr(loc.mn, loc.offset),
                self.record_len(*table)?,
            );
            ids.push((i, expected, cas, read, swap));
        }
        self.co.ctx.mark_phase(Phase::Lock);
        let res = self.co.ctx.post(list).await?;
        self.lock_time = self.co.ctx.now();
        let mut read_idx = 0;
        for p in pending.iter_mut() {
            if let Pending::Read { idx, id, .. } = p {
                *idx = read_idx;
                read_idx += 1;
                images.push(Image {
                    present: false,
                    value: res.bytes(*id).to_vec(),
                    lock: OoccLockWord::from_raw(0),
                });
            }
        }
        let mut retry = Vec::new();
        let mut failure = None;
        for (i, expected, cas, read, swap) in ids {
            let (table, _, loc) = to_lock[i];
            match decide_cas(expected, res.atomic(cas)) {
                CasDecision::Locked => {
                    out[i] = Some((swap, parse(res.bytes(read), self.co.dir.value_len(table)?)));
                }
                CasDecision::Retry(word) => {
                    self.set_hint(loc, word.version());
                    if self.reads.iter().any(|r| r.loc == loc) {
                        failure = Some(TxnError::Aborted(AbortReason::RecordChangedSinceRead));
                    }
                    retry.push(i);
                }
                CasDecision::Abort => {
                    failure = Some(TxnError::Aborted(AbortReason::RecordLockedByAnother))
                }
            }
        }
        if let Some(e) = failure {
            // Keep what we did lock so that the abort releases it.
            self.adopt_locks(to_lock, &out);
            return Err(e);
        }
        if !retry.is_empty() {
            let targets: Vec<_> = retry.iter().map(|i| to_lock[*i]).collect();
            self.adopt_locks(to_lock, &out);
            let got = self.lock_all(&targets).await;
            // Un-adopt: the caller adds write entries in request order.
            let adopted: Vec<Loc> = to_lock
                .iter()
                .zip(&out)
                .filter(|(_, o)| o.is_some())
                .map(|(t, _)| t.2)
                .collect();
            match got {
                Ok(got) => {
                    self.writes.retain(|w| !adopted.contains(&w.loc));
                    for (i, g) in retry.into_iter().zip(got) {
                        out[i] = Some(g);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out
            .into_iter()
            .map(|o| o.expect("every target locked"))
            .collect())
    }

    /// Records locks taken so far as write entries (so that an abort releases them).
    fn adopt_locks(
        &mut self,
        to_lock: &[(TableId, Key, Loc)],
        out: &[Option<(OoccLockWord, Image)>],
    ) {
        for ((table, key, loc), o) in to_lock.iter().zip(out) {
            if let Some((word, image)) = o
                && !self.writes.iter().any(|w| w.loc == *loc)
            {
                self.writes.push(WriteEntry {
                    table: *table,
                    key: *key,
                    loc: *loc,
                    lock: *word,
                    present: image.present,
                    value: image.value.clone(),
                    new: None,
                });
            }
        }
    }

    /// Releases every lock this transaction holds (same version), without waiting;
    /// `phase` names the step for crash injection (`Verbs::mark_phase`).
    async fn release_all(&mut self, phase: Phase) {
        let mut list = PostList::new();
        if self.logged {
            let layout = self.co.dir.layout();
            list.write(
                self.co
                    .dir
                    .addr(layout.log_mn(self.co.id), layout.log_offset(self.co.id)),
                &[0u8; 16],
            );
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

    /// Validate&Logging for a transaction that writes nothing (Alg. 1 lines 12–16).
    async fn commit_read_only(&mut self) -> Result<(), TxnError> {
        let stats = Rc::clone(&self.co.stats);
        let elapsed = self.co.ctx.now().saturating_sub(self.start);
        stats
            .ro_longest_ns
            .set(stats.ro_longest_ns.get().max(elapsed));
        let in_lease = self.co.cfg.implicit_lease && elapsed <= self.co.leases.rv.get();
        if in_lease && !self.intention_seen {
            bump(&stats.ro_one_round, 1);
        } else {
            if self.intention_seen {
                bump(&stats.ro_intention, 1);
            } else {
                bump(&stats.ro_lease_expired, 1);
            }
            let mut list = PostList::new();
            let mut ids = Vec::new();
            for r in &self.reads {
                ids.push(list.read(self.lock_addr(r.table, r.loc)?, 8));
            }
            if !list.is_empty() {
                self.co.ctx.mark_phase(Phase::Validate);
                let res = self.co.ctx.post(list).await?;
                for (r, id) in self.reads.iter().zip(ids) {
                    let word = u64::from_le_bytes(res.bytes(id).try_into().unwrap_or([0xFF; 8]));
                    if !decide_validate(r.version, OoccLockWord::from_raw(word), true) {
                        return Err(TxnError::Aborted(AbortReason::ReadOnlyValidationFailed));
                    }
                }
            }
        }
        self.release_all(Phase::Release).await;
        bump(&stats.ro_committed, 1);
        self.done = true;
        self.co.history.record(TxnRecord {
            id: self.id,
            begin: self.begin_true,
            end: self.co.ctx.true_now(),
            outcome: TxnOutcome::Committed,
            reads: std::mem::take(&mut self.events),
            writes: Vec::new(),
        });
        Ok(())
    }

    /// [`OoccConfig::artifact_rw_rules`]: right after execution, the read set is validated
    /// by version only (an intention lock passes) if an intention lock was met or `rv` ran
    /// out, else not at all.
    async fn validate_as_the_artifact(&self) -> Result<(), TxnError> {
        let elapsed = self.co.ctx.now().saturating_sub(self.start);
        if !self.intention_seen && elapsed <= self.co.leases.rv.get() {
            return Ok(());
        }
        let mut list = PostList::new();
        let mut ids = Vec::new();
        for r in &self.reads {
            ids.push(list.read(self.lock_addr(r.table, r.loc)?, 8));
        }
        if list.is_empty() {
            return Ok(());
        }
        self.co.ctx.mark_phase(Phase::Validate);
        let res = self.co.ctx.post(list).await?;
        for (r, id) in self.reads.iter().zip(ids) {
            let word = u64::from_le_bytes(res.bytes(id).try_into().unwrap_or([0xFF; 8]));
            if !decide_validate(r.version, OoccLockWord::from_raw(word), true) {
                return Err(TxnError::Aborted(AbortReason::ValidationFailed));
            }
        }
        Ok(())
    }

    /// Validate&Logging and Commit of a transaction that writes (Alg. 1 lines 17–25).
    async fn commit_read_write(&mut self) -> Result<(), TxnError> {
        let dir = Rc::clone(&self.co.dir);
        let layout = dir.layout();
        let written: Vec<&WriteEntry> = self.writes.iter().filter(|w| w.new.is_some()).collect();
        let mut log = RedoLogWriter::new(self.co.id, self.id.seq, written.len());
        let mut images = Vec::new();
        for w in &written {
            let vlen = dir.value_len(w.table)?;
            let new = w.new.as_ref().and_then(|n| n.as_deref());
            let image = emit(w.table, w.key, new, vlen, w.lock.released_next_version());
            log.push(w.loc, &image);
            images.push(image);
        }
        let log = log
            .finish()
            .ok_or(TxnError::Aborted(AbortReason::RedoLogLargerThanRegion))?;
        if self.co.cfg.artifact_rw_rules {
            self.validate_as_the_artifact().await?;
        }
        let ww = self.co.leases.ww.get();
        // Without the implicit lease every read set is validated and nobody relies on a
        // writer's wait: plain OCC commits at once.
        let wait = self.co.cfg.implicit_lease && !self.co.cfg.bug_skip_lease_wait;
        if self.co.cfg.delayed_lock && wait {
            // Overlap the lease wait with everything before the upgrade round (§IV-B).
            let at = (self.lock_time + ww).saturating_sub(self.co.cfg.upgrade_lead_ns);
            let now = self.co.ctx.now();
            if at > now {
                bump(&self.co.stats.lease_wait_ns, at - now);
                self.co.ctx.sleep_until(at).await;
            }
        }
        let log_mn = layout.log_mn(self.co.id);
        let log_addr = dir.addr(log_mn, layout.log_offset(self.co.id));
        let mut list = PostList::new();
        list.write_owned(log_addr, log);
        for w in &written {
            let word = w.lock.with_write_lock();
            list.write(
                self.lock_addr(w.table, w.loc)?,
                &word.to_raw().to_le_bytes(),
            );
        }
        // Validation is skipped while the lease holds when the round returns (checked
        // after it); with the implicit lease off it always goes in this round.
        let validate_now = !self.co.cfg.artifact_rw_rules
            && (!self.co.cfg.implicit_lease
                || (self.co.ctx.now() + self.co.cfg.upgrade_lead_ns).saturating_sub(self.start)
                    > self.co.leases.rv.get());
        let mut ids = Vec::new();
        if validate_now {
            for r in &self.reads {
                ids.push(list.read(self.lock_addr(r.table, r.loc)?, 8));
            }
        }
        self.logged = true;
        self.co.ctx.mark_phase(Phase::Log);
        let res = self.co.ctx.post(list).await?;
        let upgraded = self.co.ctx.now();
        let mut ok = true;
        for (r, id) in self.reads.iter().zip(&ids) {
            let word = u64::from_le_bytes(res.bytes(*id).try_into().unwrap_or([0xFF; 8]));
            ok &= decide_validate(r.version, OoccLockWord::from_raw(word), false);
        }
        if ok
            && !validate_now
            && !self.co.cfg.artifact_rw_rules
            && upgraded.saturating_sub(self.start) > self.co.leases.rv.get()
            && !self.reads.is_empty()
        {
            // The lease ran out while the round was in flight: validate now.
            let mut list = PostList::new();
            let mut ids = Vec::new();
            for r in &self.reads {
                ids.push(list.read(self.lock_addr(r.table, r.loc)?, 8));
            }
            self.co.ctx.mark_phase(Phase::Validate);
            let res = self.co.ctx.post(list).await?;
            for (r, id) in self.reads.iter().zip(ids) {
                let word = u64::from_le_bytes(res.bytes(id).try_into().unwrap_or([0xFF; 8]));
                ok &= decide_validate(r.version, OoccLockWord::from_raw(word), false);
            }
        }
        if !ok {
            // Locks were upgraded: release them (the log is ignored by recovery unless a
            // commit WRITE of it landed, see `recovery`).
            for w in &mut self.writes {
                if w.new.is_some() {
                    w.lock = w.lock.with_write_lock();
                }
            }
            return Err(TxnError::Aborted(AbortReason::ValidationFailed));
        }
        // Decided: record before the first commit WRITE.
        let writes: Vec<WriteEvent> = written
            .iter()
            .map(|w| {
                write_event(
                    w.table,
                    w.key,
                    Version(w.lock.released_next_version().version()),
                    &w.new,
                    w.present,
                )
            })
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
        if wait {
            let until = self.lock_time + ww;
            let now = self.co.ctx.now();
            if until > now {
                bump(&self.co.stats.lease_wait_ns, until - now);
                self.co.ctx.sleep_until(until).await;
            }
        }
        // Commit: one WRITE per record of value + version + free lock (lock last), and
        // the released intention locks of records locked but not written.
        let mut list = PostList::new();
        let mut unlock = PostList::new();
        for (w, image) in written.iter().zip(&images) {
            let vlen = dir.value_len(w.table)?;
            let rewrite_header = w.new.as_ref().is_some_and(Option::is_none) || !w.present;
            let from = if rewrite_header {
                0
            } else {
                OoccRecordHeader::LEN
            };
            let to = if self.co.cfg.one_op_unlock {
                image.len()
            } else {
                OoccRecordHeader::lock_offset(vlen)
            };
            list.write(
                dir.addr(w.loc.mn, w.loc.offset + from as u64),
                &image[from..to],
            );
            if !self.co.cfg.one_op_unlock {
                unlock.write(
                    self.lock_addr(w.table, w.loc)?,
                    &image[OoccRecordHeader::lock_offset(vlen)..],
                );
            }
            self.co
                .hints
                .borrow_mut()
                .insert(w.loc, w.lock.version() + 1);
        }
        for w in self.writes.iter().filter(|w| w.new.is_none()) {
            list.write(
                self.lock_addr(w.table, w.loc)?,
                &w.lock.released_same_version().to_raw().to_le_bytes(),
            );
        }
        self.co.ctx.mark_phase(Phase::Commit);
        self.co.ctx.post(list).await?;
        if !unlock.is_empty() {
            self.co.ctx.mark_phase(Phase::Unlock);
            self.co.ctx.post(unlock).await?;
        }
        // Committed once every record is written. Resolved before the log is truncated,
        // never after: recovery settles an `Unknown` transaction whose coordinator left no
        // log as rolled back, so a CN killed between a landed truncation and its resolution
        // would leave versions that no transaction of the history installed.
        bump(&self.co.stats.rw_committed, 1);
        self.co
            .history
            .resolve(self.id, TxnOutcome::Committed, self.co.ctx.true_now());
        // The log is dead now: truncate without waiting.
        let mut trunc = PostList::new();
        trunc.write(log_addr, &[0u8; 16]);
        self.co.ctx.mark_phase(Phase::Truncate);
        let _ = self.co.ctx.post_detached(trunc).await;
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
