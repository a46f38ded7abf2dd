//! DSLR two-phase locking (OOCC §II-A baseline; DSLR, SIGMOD'18): every record carries a
//! DSLR reader-writer ticket lock (the state machine of `dmem_locks::dslr`) at its highest
//! address; conflicting transactions queue on the ticket instead of aborting.
//!
//! * A round FAAs a ticket on each record (shared for reads, exclusive for writes) and
//!   READs the record in the same post list; a ticket granted at once makes that READ the
//!   record's value, otherwise the record (with its lock word) is READ again until the
//!   word grants the ticket. Tickets exhausted (DSLR §4.3) are undone and the transaction
//!   aborts; the holder whose ticket reached the threshold drains and resets the word on
//!   release, as `dmem_locks::dslr` does.
//! * Deadlocks (queues that wait on each other across records) are broken by a timeout:
//!   a transaction that waits longer than `deadlock_ns` releases what it holds and
//!   aborts, then waits for its outstanding tickets and releases each as it is granted
//!   (a ticket cannot leave the queue).
//! * Commit: no validation; a read-write transaction WRITEs its redo log, then the records
//!   and the lock releases in one post list (per-queue-pair order puts each release after
//!   its record's WRITE). Read-only transactions release their shared locks without
//!   waiting. The value carries an 8-byte version in front (for histories).
//!
//!
//! Crash recovery (DSLR §4.4's lease reset, with the redo log rolled forward by
//! [`crate::recovery`] as [`crate::recovery::RedoLog::DecidedVersioned`]):
//!
//! * *Atomicity*: the log is written after every lock is granted, so a whole log rolls
//!   forward onto the records that still show the logged old version.
//! * *Liveness*: a crashed coordinator's tickets, held or queued, are never released. A
//!   waiter that sees the word's `n_x`/`n_s` stand still for `reset_lease_ns` CASes the
//!   word to [`DslrWord::BARRIER`]; waiters of the old tickets see the barrier and give
//!   them up (their transactions abort), new tickets on it are invalid (undone, as for
//!   exhaustion), and a client that has seen the barrier stand for another reset lease
//!   CASes it to zero (the exhaustion reset). Waiters poll every `poll_ns`, far below the
//!   lease, so every live waiter sees the barrier before it goes.
//! * *No writer under a live holder*: a transaction counts its hold lease from just before
//!   its first grant (the post of the FAA, or of the last READ that did not grant) and
//!   aborts before its commit WRITEs once half the reset lease has passed, and gives its
//!   tickets up instead of releasing them once three quarters have passed. A reset comes a
//!   whole reset lease after a waiter saw the counters stop, so the holder's WRITEs and
//!   releases, and recovery's roll-forward of a holder that crashed (detection and a
//!   few round trips, well below the remaining half lease), land before it.

use std::rc::Rc;

use dmem_layout::record::{OoccLockWord, OoccRecordHeader};
use dmem_locks::LockMode;
use dmem_locks::dslr::DslrWord;
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

use logic::{Stall, Step, Ticket, View};

/// DSLR 2PL's knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DslrConfig {
    /// Poll period while a ticket waits, ns.
    pub poll_ns: Nanos,
    /// Waiting longer than this counts as a deadlock, ns.
    pub deadlock_ns: Nanos,
    /// Counters standing still this long mean a holder died: the word is reset (DSLR §4.4),
    /// ns. Holders commit within half of it; it must exceed the failure detector's timeout
    /// plus recovery's roll-forward by that half.
    pub reset_lease_ns: Nanos,
    /// Planted bug (`dslr:skip-roll-forward`): recovery truncates a crashed coordinator's
    /// redo log without rolling it forward, so a transaction whose log was written but
    /// whose record WRITEs had not all landed loses them. Kept so the litmus suite's
    /// power against a broken recovery stays tested.
    pub bug_skip_roll_forward: bool,
}

impl DslrConfig {
    /// The shortest reset lease under which recovery's roll-forward still lands before a
    /// live waiter resets a crashed holder's word, for a failure detector that takes up to
    /// `detection` ns (heartbeat period + timeout + poll) to suspect a crash: a quarter of
    /// the lease for detection, the rest for link termination and the roll-forward (module
    /// docs, *No writer under a live holder*).
    #[must_use]
    pub fn min_reset_lease(detection: Nanos) -> Nanos {
        detection.saturating_mul(4)
    }

    /// This configuration with its reset lease raised to
    /// [`min_reset_lease`](Self::min_reset_lease)`(detection)` where it is shorter.
    #[must_use]
    pub fn for_detection(self, detection: Nanos) -> Self {
        Self {
            reset_lease_ns: self.reset_lease_ns.max(Self::min_reset_lease(detection)),
            ..self
        }
    }
}

impl Default for DslrConfig {
    fn default() -> Self {
        Self {
            poll_ns: 2_000,
            deadlock_ns: 200_000,
            reset_lease_ns: 1_000_000,
            bug_skip_roll_forward: false,
        }
    }
}

/// One DSLR 2PL coordinator.
pub struct DslrCoordinator<C> {
    ctx: DriftingCtx<C>,
    dir: Rc<Directory>,
    id: u16,
    seq: u64,
    cfg: DslrConfig,
    stats: Rc<Stats>,
    history: dmem_deploy::Recorder,
}

impl<C: Verbs + Clock> DslrCoordinator<C> {
    /// A coordinator.
    #[must_use]
    pub fn new(
        ctx: DriftingCtx<C>,
        dir: Rc<Directory>,
        id: u16,
        cfg: DslrConfig,
        stats: Rc<Stats>,
        history: dmem_deploy::Recorder,
    ) -> Self {
        Self {
            ctx,
            dir,
            id,
            seq: 0,
            cfg,
            stats,
            history,
        }
    }
}

impl<C: Verbs + Clock> Coordinator for DslrCoordinator<C> {
    type Txn<'a>
        = DslrTxn<'a, C>
    where
        C: 'a;

    async fn begin(&mut self, kind: TxnKind) -> Result<DslrTxn<'_, C>, TxnError> {
        let trace = Trace::start(&mut self.seq, self.id, self.ctx.true_now());
        Ok(DslrTxn {
            trace,
            co: self,
            kind,
            held: Vec::new(),
            pending: Vec::new(),
            done: false,
            lease_start: None,
            barriers: Vec::new(),
        })
    }
}

#[derive(Debug, Clone)]
struct Held {
    table: TableId,
    key: Key,
    loc: Loc,
    mode: LockMode,
    ticket: DslrWord,
    version: u64,
    present: bool,
    value: Vec<u8>,
    new: Option<Option<Vec<u8>>>,
}

/// One running DSLR 2PL transaction.
pub struct DslrTxn<'a, C> {
    co: &'a mut DslrCoordinator<C>,
    trace: Trace,
    kind: TxnKind,
    held: Vec<Held>,
    /// Tickets taken but not granted: (lock address, mode, ticket).
    pending: Vec<(RemoteAddr, LockMode, DslrWord)>,
    done: bool,
    /// Just before the first grant (the hold lease counts from here).
    lease_start: Option<Nanos>,
    /// Words seen at the lease-reset barrier: cleared to zero once it has stood long enough.
    barriers: Vec<RemoteAddr>,
}

/// What one look at a waited-for word decided.
enum Look {
    Granted,
    Waiting,
    /// The ticket's word was reset: the ticket is gone.
    Reset,
}

/// A queued ticket: table, key, slot, mode, the ticket, its view of the word's counters.
type Waiter = (TableId, Key, Loc, LockMode, DslrWord, Stall);

fn word_of(image_lock: OoccLockWord) -> DslrWord {
    DslrWord::from_raw(image_lock.to_raw())
}

impl<C: Verbs + Clock> DslrTxn<'_, C> {
    fn lock_addr(&self, table: TableId, loc: Loc) -> Result<RemoteAddr, TxnError> {
        let phys = self.co.dir.value_len(table)?;
        Ok(self.co.dir.addr(
            loc.mn,
            loc.offset + OoccRecordHeader::lock_offset(phys) as u64,
        ))
    }

    fn record_len(&self, table: TableId) -> Result<u32, TxnError> {
        Ok(OoccRecordHeader::record_len(self.co.dir.value_len(table)?) as u32)
    }

    fn note_grant(&mut self, before: Nanos) {
        self.lease_start = logic::lease_start(self.lease_start, before);
    }

    /// Whether the hold lease leaves room for the commit WRITEs.
    fn may_commit(&self) -> bool {
        logic::may_commit(
            self.lease_start,
            self.co.ctx.now(),
            self.co.cfg.reset_lease_ns,
        )
    }

    /// Whether releasing the held tickets still lands before any reset of their words.
    fn may_release(&self) -> bool {
        logic::may_release(
            self.lease_start,
            self.co.ctx.now(),
            self.co.cfg.reset_lease_ns,
        )
    }

    /// CASes the word at `addr` from `seen` to `to`; whether it landed.
    async fn cas_word(&self, addr: RemoteAddr, seen: DslrWord, to: u64) -> bool {
        let mut l = PostList::new();
        let c = l.cas(addr, seen.raw(), to);
        matches!(self.co.ctx.post(l).await, Ok(r) if r.atomic(c) == seen.raw())
    }

    /// Judges `word`, just READ (at `now`) for `ticket` in `mode` at `addr`
    /// ([`logic::look`]): granted, still waiting, or reset (the barrier, or counters
    /// stalled for the reset lease and this client CASed the barrier in).
    async fn look(
        &mut self,
        addr: RemoteAddr,
        ticket: DslrWord,
        mode: LockMode,
        word: DslrWord,
        stall: &mut Stall,
        now: Nanos,
    ) -> Look {
        let reset_lease = self.co.cfg.reset_lease_ns;
        match logic::look(word, ticket, mode, stall, now, reset_lease) {
            View::Barrier => {
                self.barriers.push(addr);
                Look::Reset
            }
            View::Granted => Look::Granted,
            View::Waiting => Look::Waiting,
            View::Stalled => {
                if self.cas_word(addr, word, DslrWord::BARRIER.raw()).await {
                    self.barriers.push(addr);
                    Look::Reset
                } else {
                    Look::Waiting
                }
            }
        }
    }

    fn hold(
        &mut self,
        table: TableId,
        key: Key,
        loc: Loc,
        mode: LockMode,
        ticket: DslrWord,
        bytes: &[u8],
    ) -> Result<(), TxnError> {
        let image = parse(bytes, self.co.dir.value_len(table)?);
        let version = version_of(&image.value);
        self.trace.reads.push(ReadEvent {
            writer: image.writer,
            ..ReadEvent::new(table, key, Version(version))
        });
        self.held.push(Held {
            table,
            key,
            loc,
            mode,
            ticket,
            version,
            present: image.present,
            value: image.value[8..].to_vec(),
            new: None,
        });
        Ok(())
    }

    /// Takes a ticket on each target (FAA) and READs its record in the same post list;
    /// granted tickets are held at once. Returns when the list was posted and the queued
    /// tickets; invalid tickets are undone and the transaction aborts (DSLR §4.3).
    async fn take_tickets(
        &mut self,
        targets: Vec<(TableId, Key, LockMode)>,
    ) -> Result<(Nanos, Vec<Waiter>), TxnError> {
        let mut list = PostList::new();
        let mut ids = Vec::new();
        for &(table, key, mode) in &targets {
            let loc = self.co.dir.locate(&self.co.ctx, table, key).await?;
            let faa = list.faa(self.lock_addr(table, loc)?, DslrWord::acquire_delta(mode));
            let read = list.read(
                self.co.dir.addr(loc.mn, loc.offset),
                self.record_len(table)?,
            );
            ids.push((table, key, loc, mode, faa, read));
        }
        let posted = self.co.ctx.now();
        let res = self.co.ctx.post(list).await?;
        let landed = self.co.ctx.now();
        let mut waiting = Vec::new();
        let mut invalid = Vec::new();
        for (table, key, loc, mode, faa, read) in ids {
            let ticket = DslrWord::from_raw(res.atomic(faa));
            let addr = self.lock_addr(table, loc)?;
            match logic::ticket(ticket, mode) {
                Ticket::Invalid => {
                    if ticket.is_barrier() {
                        self.barriers.push(addr);
                    }
                    invalid.push((addr, mode));
                }
                Ticket::Granted => {
                    self.note_grant(posted);
                    self.hold(table, key, loc, mode, ticket, res.bytes(read))?;
                }
                Ticket::Queued => {
                    self.pending.push((addr, mode, ticket));
                    let stall = Stall::new(ticket, landed);
                    waiting.push((table, key, loc, mode, ticket, stall));
                }
            }
        }
        if !invalid.is_empty() {
            let mut undo = PostList::new();
            for (addr, mode) in invalid {
                undo.faa(addr, DslrWord::acquire_delta(mode).wrapping_neg());
            }
            let _ = self.co.ctx.post_detached(undo).await;
            return Err(TxnError::Aborted(AbortReason::DslrTicketsExhausted));
        }
        Ok((posted, waiting))
    }

    async fn acquire(&mut self, targets: Vec<LockTarget>) -> Result<(), TxnError> {
        if targets.is_empty() {
            return Ok(());
        }
        let targets = targets
            .into_iter()
            .map(|t| {
                let mode = if t.exclusive {
                    LockMode::Exclusive
                } else {
                    LockMode::Shared
                };
                (t.table, t.key, mode)
            })
            .collect();
        let (posted, mut waiting) = self.take_tickets(targets).await?;
        // Queue: READ the waiting records until their words grant the tickets.
        let deadline = self.co.ctx.now() + self.co.cfg.deadlock_ns;
        let mut before = posted;
        let mut reset = false;
        while !waiting.is_empty() {
            if reset {
                return Err(TxnError::Aborted(AbortReason::DslrLockResetByLease));
            }
            if self.co.ctx.now() > deadline {
                return Err(TxnError::Aborted(AbortReason::DslrWaitTimedOut));
            }
            self.co.ctx.sleep(self.co.cfg.poll_ns).await;
            let (still, was_reset, posted) = self.poll_waiting(waiting, before).await?;
            reset |= was_reset;
            before = posted;
            waiting = still;
        }
        if reset {
            return Err(TxnError::Aborted(AbortReason::DslrLockResetByLease));
        }
        Ok(())
    }

    /// One READ of every waiting record; holds the tickets granted (by a release that
    /// landed after `before`, the previous READ's post). Returns the tickets still waiting,
    /// whether one was reset, and when this READ was posted.
    async fn poll_waiting(
        &mut self,
        waiting: Vec<Waiter>,
        before: Nanos,
    ) -> Result<(Vec<Waiter>, bool, Nanos), TxnError> {
        let mut list = PostList::new();
        let mut ids = Vec::new();
        for &(table, _, loc, _, _, _) in &waiting {
            ids.push(list.read(
                self.co.dir.addr(loc.mn, loc.offset),
                self.record_len(table)?,
            ));
        }
        let posted = self.co.ctx.now();
        let res = self.co.ctx.post(list).await?;
        let landed = self.co.ctx.now();
        let mut still = Vec::new();
        let mut reset = false;
        for ((table, key, loc, mode, ticket, mut stall), id) in waiting.into_iter().zip(ids) {
            let image = parse(res.bytes(id), self.co.dir.value_len(table)?);
            let addr = self.lock_addr(table, loc)?;
            match self
                .look(addr, ticket, mode, word_of(image.lock), &mut stall, landed)
                .await
            {
                Look::Granted => {
                    self.pending.retain(|p| p.0 != addr || p.2 != ticket);
                    // The release that granted it landed after the previous READ.
                    self.note_grant(before);
                    self.hold(table, key, loc, mode, ticket, res.bytes(id))?;
                }
                Look::Reset => {
                    self.pending.retain(|p| p.0 != addr || p.2 != ticket);
                    reset = true;
                }
                Look::Waiting => still.push((table, key, loc, mode, ticket, stall)),
            }
        }
        Ok((still, reset, posted))
    }

    async fn read_lock_word(&self, addr: RemoteAddr) -> Option<DslrWord> {
        let mut l = PostList::new();
        let id = l.read(addr, 8);
        let res = self.co.ctx.post(l).await.ok()?;
        Some(DslrWord::from_raw(u64::from_le_bytes(
            res.bytes(id).try_into().ok()?,
        )))
    }

    /// Releases what is held (after `first`, posted in the same list; held tickets are
    /// given up instead once the hold lease is too old), then waits for the outstanding
    /// tickets and releases each once granted (or gives it up if its word is reset);
    /// resets exhausted words; clears lease-reset barriers that have stood long enough.
    /// A failed READ of a word ends it all.
    async fn release_all(&mut self, first: PostList) {
        let mut resets = self.release_held(first).await;
        if self.release_pending(&mut resets).await.is_none() {
            return;
        }
        if self.reset_exhausted(resets).await.is_none() {
            return;
        }
        let _ = self.clear_barriers().await;
    }

    /// Posts `first` with a release of every held ticket (unless the hold lease is too
    /// old); returns the tickets whose release makes this client reset their word.
    async fn release_held(&mut self, first: PostList) -> Vec<(RemoteAddr, DslrWord, LockMode)> {
        let mut list = first;
        let mut resets = Vec::new();
        if self.may_release() {
            for h in &self.held {
                if let Ok(addr) = self.lock_addr(h.table, h.loc) {
                    list.faa(addr, DslrWord::release_delta(h.mode));
                    if DslrWord::ticket_resets(h.ticket, h.mode) {
                        resets.push((addr, h.ticket, h.mode));
                    }
                }
            }
        }
        self.held.clear();
        if !list.is_empty() {
            let _ = self.co.ctx.post(list).await;
        }
        resets
    }

    /// Waits for every outstanding ticket and releases it once granted (a ticket cannot
    /// leave the queue), or gives it up if its word was reset.
    async fn release_pending(
        &mut self,
        resets: &mut Vec<(RemoteAddr, DslrWord, LockMode)>,
    ) -> Option<()> {
        let pending = std::mem::take(&mut self.pending);
        for (addr, mode, ticket) in pending {
            let mut stall = Stall::new(ticket, self.co.ctx.now());
            loop {
                let now = self.read_lock_word(addr).await?;
                let at = self.co.ctx.now();
                match self.look(addr, ticket, mode, now, &mut stall, at).await {
                    Look::Granted => {
                        let mut l = PostList::new();
                        l.faa(addr, DslrWord::release_delta(mode));
                        let _ = self.co.ctx.post(l).await;
                        if DslrWord::ticket_resets(ticket, mode) {
                            resets.push((addr, ticket, mode));
                        }
                        break;
                    }
                    Look::Reset => break,
                    Look::Waiting => {}
                }
                self.co.ctx.sleep(self.co.cfg.poll_ns).await;
            }
        }
        Some(())
    }

    /// The exhaustion reset (DSLR §4.3) of the words this client's tickets took to the
    /// threshold: CASed to zero once drained ([`logic::reset_step`]).
    async fn reset_exhausted(&self, resets: Vec<(RemoteAddr, DslrWord, LockMode)>) -> Option<()> {
        for (addr, ticket, mode) in resets {
            let target = logic::drain_target(ticket, mode);
            loop {
                let now = self.read_lock_word(addr).await?;
                match logic::reset_step(now, target) {
                    Step::Done => break,
                    Step::ClearIt if self.cas_word(addr, now, 0).await => break,
                    Step::ClearIt | Step::Wait => {}
                }
                self.co.ctx.sleep(self.co.cfg.poll_ns).await;
            }
        }
        Some(())
    }

    /// Clears the lease-reset barriers this client saw once each has stood for a reset
    /// lease ([`logic::barrier_step`]), counted from this client's own first look.
    async fn clear_barriers(&mut self) -> Option<()> {
        let mut unique = Vec::new();
        for a in std::mem::take(&mut self.barriers) {
            if !unique.contains(&a) {
                unique.push(a);
            }
        }
        for addr in unique {
            let since = self.co.ctx.now();
            loop {
                let now = self.read_lock_word(addr).await?;
                let elapsed = self.co.ctx.now().saturating_sub(since);
                match logic::barrier_step(now, elapsed, self.co.cfg.reset_lease_ns) {
                    Step::Done => break,
                    Step::ClearIt if self.cas_word(addr, now, 0).await => break,
                    Step::ClearIt | Step::Wait => {}
                }
                self.co.ctx.sleep(self.co.cfg.poll_ns).await;
            }
        }
        Some(())
    }

    async fn fail(&mut self, e: TxnError) -> TxnError {
        if !self.done {
            self.done = true;
            self.release_all(PostList::new()).await;
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
        let held = &self.held;
        let find = |table, key| held.iter().find(|h| h.table == table && h.key == key);
        let targets = rounds::lock_targets(
            reqs,
            self.kind,
            |table, key| find(table, key).map(|h| h.mode == LockMode::Exclusive),
            AbortReason::LockUpgradeSharedToExclusive,
        )?;
        self.acquire(targets).await?;
        let held = &self.held;
        rounds::answers(
            reqs,
            |table, key| {
                let h = held.iter().find(|h| h.table == table && h.key == key)?;
                Some(HeldValue {
                    present: h.present,
                    value: &h.value,
                    staged: &h.new,
                })
            },
            AbortReason::RecordNotLocked,
        )
    }

    async fn set(
        &mut self,
        table: TableId,
        key: Key,
        value: Option<&[u8]>,
        want_present: bool,
    ) -> Result<(), TxnError> {
        if self.kind == TxnKind::ReadOnly {
            return Err(TxnError::ReadOnly);
        }
        let vlen = self.co.dir.value_len(table)? - 8;
        if let Some(v) = value
            && v.len() != vlen
        {
            return Err(TxnError::ValueSize {
                expected: vlen,
                got: v.len(),
            });
        }
        if !self.held.iter().any(|h| h.table == table && h.key == key) {
            let r = self.round(&[ReadReq::for_update(table, key)]).await;
            if let Err(e) = r {
                return Err(self.fail(e).await);
            }
        }
        let Some(h) = self
            .held
            .iter_mut()
            .find(|h| h.table == table && h.key == key)
        else {
            return Err(self
                .fail(TxnError::Aborted(AbortReason::RecordNotLocked))
                .await);
        };
        if h.mode != LockMode::Exclusive {
            return Err(self
                .fail(TxnError::Aborted(AbortReason::LockUpgradeSharedToExclusive))
                .await);
        }
        let present = match &h.new {
            Some(n) => n.is_some(),
            None => h.present,
        };
        if present != want_present {
            return Err(TxnError::KeyState(key.0));
        }
        h.new = Some(value.map(<[u8]>::to_vec));
        Ok(())
    }

    /// A transaction that writes nothing (two-phase locking: the reads are consistent
    /// while the locks are held): commits, then releases its shared tickets.
    async fn commit_read_only(&mut self) -> Result<(), TxnError> {
        self.done = true;
        self.trace.finish(
            &self.co.history,
            self.co.ctx.true_now(),
            TxnOutcome::Committed,
            Vec::new(),
        );
        bump(&self.co.stats.ro_committed, 1);
        bump(&self.co.stats.ro_one_round, 1);
        let mut list = PostList::new();
        for h in &self.held {
            list.faa(
                self.lock_addr(h.table, h.loc)?,
                DslrWord::release_delta(h.mode),
            );
        }
        let resets = self
            .held
            .iter()
            .any(|h| DslrWord::ticket_resets(h.ticket, h.mode));
        if logic::releases_at_once(
            self.pending.is_empty(),
            self.barriers.is_empty(),
            self.may_release(),
            resets,
        ) {
            self.held.clear();
            if !list.is_empty() {
                let _ = self.co.ctx.post_detached(list).await;
            }
        } else {
            self.release_all(PostList::new()).await;
        }
        Ok(())
    }

    /// The redo log of `written` and each one's new image, header + value only (the lock
    /// word is not part of it).
    fn redo_log(&self, written: &[Held]) -> Result<(Vec<u8>, Vec<Vec<u8>>), TxnError> {
        let mut log = RedoLogWriter::new(self.co.id, self.trace.id.seq, written.len());
        let mut images = Vec::new();
        for h in written {
            let phys = self.co.dir.value_len(h.table)?;
            let free = OoccLockWord::from_raw(0);
            let mut image = commit_image(
                h.table,
                h.key,
                h.version + 1,
                &h.new,
                phys,
                free,
                self.trace.id,
            );
            let cut = image.len() - 8;
            image.truncate(cut);
            log.push(h.loc, &image);
            images.push(image);
        }
        let log = log
            .finish()
            .ok_or(TxnError::Aborted(AbortReason::RedoLogLargerThanRegion))?;
        Ok((log, images))
    }

    /// Commit: no validation; a read-write transaction WRITEs its redo log, then the
    /// records and the lock releases in one post list.
    async fn commit_inner(&mut self) -> Result<(), TxnError> {
        let written: Vec<Held> = self
            .held
            .iter()
            .filter(|h| h.new.is_some())
            .cloned()
            .collect();
        if written.is_empty() {
            return self.commit_read_only().await;
        }
        if !self.may_commit() {
            return Err(TxnError::Aborted(AbortReason::DslrHoldLeasePassed));
        }
        let (log, images) = self.redo_log(&written)?;
        let writes = written
            .iter()
            .map(|h| write_event(h.table, h.key, Version(h.version + 1), &h.new, h.present))
            .collect();
        self.done = true;
        self.trace.finish(
            &self.co.history,
            self.co.ctx.true_now(),
            TxnOutcome::Unknown,
            writes,
        );
        let dir = Rc::clone(&self.co.dir);
        let layout = dir.layout();
        let log_addr = dir.addr(layout.log_mn(self.co.id), layout.log_offset(self.co.id));
        let mut list = PostList::new();
        list.write_owned(log_addr, log);
        self.co.ctx.post(list).await?;
        // The records, each followed on its queue pair by every lock release.
        let mut list = PostList::new();
        for (h, image) in written.iter().zip(&images) {
            list.write(dir.addr(h.loc.mn, h.loc.offset), image);
        }
        self.release_all(list).await;
        // Resolved before the log is truncated, never after: recovery settles an `Unknown`
        // transaction whose coordinator left no log as rolled back, so a CN killed between
        // a landed truncation and its resolution would leave versions that no transaction
        // of the history installed.
        bump(&self.co.stats.rw_committed, 1);
        self.co
            .history
            .resolve(self.trace.id, TxnOutcome::Committed, self.co.ctx.true_now());
        // Truncated once the records landed (a crash before leaves a whole log behind,
        // which recovery rolls onto no record: every one shows a newer version).
        let mut trunc = PostList::new();
        trunc.write(log_addr, &[0u8; 16]);
        let _ = self.co.ctx.post_detached(trunc).await;
        Ok(())
    }
}

crate::shell::lock_based_transaction!(DslrTxn);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_raised_to_four_detection_times_and_never_lowered() {
        let paper = DslrConfig::default();
        // Between processes: 10 ms heartbeat + 250 ms timeout + the 2 µs poll.
        let slow = paper.for_detection(260_002_000);
        assert_eq!(slow.reset_lease_ns, 1_040_008_000);
        assert_eq!(
            (slow.poll_ns, slow.deadlock_ns),
            (paper.poll_ns, paper.deadlock_ns)
        );
        // The litmus detector (50 µs) fits the paper's 1 ms lease: unchanged.
        assert_eq!(paper.for_detection(50_000), paper);
        assert_eq!(paper.for_detection(250_000), paper);
        assert_eq!(paper.for_detection(250_001).reset_lease_ns, 1_000_004);
    }
}
