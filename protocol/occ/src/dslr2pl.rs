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
//! Crash recovery is not built: a DSLR word does not say who holds it (DSLR resets words
//! by leases, §4.4 of its paper), so `dslr` runs the litmus tests without crashes.

use std::rc::Rc;

use dmem_layout::record::{OoccLockWord, OoccRecordHeader};
use dmem_locks::LockMode;
use dmem_locks::dslr::DslrWord;
use dmem_txn::{
    Access, Coordinator, CoordinatorId, HistorySink, Key, ReadEvent, ReadReq, RoundValues, TableId,
    Transaction, TxnError, TxnId, TxnKind, TxnOutcome, TxnRecord, Version, WriteEvent, WriteKind,
};
use dmem_verbs::{Clock, Nanos, PostList, RemoteAddr, Verbs};

use crate::drift::DriftingCtx;
use crate::oocc::{Stats, bump};
use crate::store::{Directory, Loc, emit, parse};

/// DSLR 2PL's knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DslrConfig {
    /// Poll period while a ticket waits, ns.
    pub poll_ns: Nanos,
    /// Waiting longer than this counts as a deadlock, ns.
    pub deadlock_ns: Nanos,
}

impl Default for DslrConfig {
    fn default() -> Self {
        Self {
            poll_ns: 2_000,
            deadlock_ns: 200_000,
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
        self.seq += 1;
        let id = TxnId {
            coordinator: CoordinatorId(u32::from(self.id)),
            seq: self.seq,
        };
        Ok(DslrTxn {
            begin_true: self.ctx.true_now(),
            co: self,
            id,
            kind,
            held: Vec::new(),
            pending: Vec::new(),
            events: Vec::new(),
            done: false,
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
    id: TxnId,
    kind: TxnKind,
    begin_true: Nanos,
    held: Vec<Held>,
    /// Tickets taken but not granted: (lock address, mode, ticket).
    pending: Vec<(RemoteAddr, LockMode, DslrWord)>,
    events: Vec<ReadEvent>,
    done: bool,
}

fn aborted(why: &'static str) -> TxnError {
    TxnError::Aborted(why)
}

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
        let version = u64::from_le_bytes(image.value[..8].try_into().unwrap_or([0; 8]));
        self.events
            .push(ReadEvent::new(table, key, Version(version)));
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

    async fn acquire(&mut self, targets: Vec<(TableId, Key, LockMode)>) -> Result<(), TxnError> {
        if targets.is_empty() {
            return Ok(());
        }
        let mut list = PostList::new();
        let mut ids = Vec::new();
        for &(table, key, mode) in &targets {
            let loc = self.co.dir.slot(table, key)?;
            let faa = list.faa(self.lock_addr(table, loc)?, DslrWord::acquire_delta(mode));
            let read = list.read(
                self.co.dir.addr(loc.mn, loc.offset),
                self.record_len(table)?,
            );
            ids.push((table, key, loc, mode, faa, read));
        }
        let res = self.co.ctx.post(list).await?;
        let mut waiting = Vec::new();
        let mut invalid = Vec::new();
        for (table, key, loc, mode, faa, read) in ids {
            let ticket = DslrWord::from_raw(res.atomic(faa));
            let addr = self.lock_addr(table, loc)?;
            if !ticket.ticket_is_valid() {
                invalid.push((addr, mode));
            } else if ticket.grants(ticket, mode) {
                self.hold(table, key, loc, mode, ticket, res.bytes(read))?;
            } else {
                self.pending.push((addr, mode, ticket));
                waiting.push((table, key, loc, mode, ticket));
            }
        }
        if !invalid.is_empty() {
            let mut undo = PostList::new();
            for (addr, mode) in invalid {
                undo.faa(addr, DslrWord::acquire_delta(mode).wrapping_neg());
            }
            let _ = self.co.ctx.post_detached(undo).await;
            return Err(aborted("DSLR tickets exhausted until the word resets"));
        }
        // Queue: READ the waiting records until their words grant the tickets.
        let deadline = self.co.ctx.now() + self.co.cfg.deadlock_ns;
        while !waiting.is_empty() {
            if self.co.ctx.now() > deadline {
                return Err(aborted("DSLR wait timed out (deadlock)"));
            }
            self.co.ctx.sleep(self.co.cfg.poll_ns).await;
            let mut list = PostList::new();
            let mut ids = Vec::new();
            for &(table, _, loc, _, _) in &waiting {
                ids.push(list.read(
                    self.co.dir.addr(loc.mn, loc.offset),
                    self.record_len(table)?,
                ));
            }
            let res = self.co.ctx.post(list).await?;
            let mut still = Vec::new();
            for ((table, key, loc, mode, ticket), id) in waiting.into_iter().zip(ids) {
                let image = parse(res.bytes(id), self.co.dir.value_len(table)?);
                if word_of(image.lock).grants(ticket, mode) {
                    let addr = self.lock_addr(table, loc)?;
                    self.pending.retain(|p| p.0 != addr || p.2 != ticket);
                    self.hold(table, key, loc, mode, ticket, res.bytes(id))?;
                } else {
                    still.push((table, key, loc, mode, ticket));
                }
            }
            waiting = still;
        }
        Ok(())
    }

    /// Releases what is held (after `first`, posted in the same list), then waits for
    /// the outstanding tickets and releases each once granted; resets exhausted words.
    async fn release_all(&mut self, first: PostList) {
        let mut list = first;
        let mut resets = Vec::new();
        for h in &self.held {
            if let Ok(addr) = self.lock_addr(h.table, h.loc) {
                list.faa(addr, DslrWord::release_delta(h.mode));
                if DslrWord::ticket_resets(h.ticket, h.mode) {
                    resets.push((addr, h.ticket, h.mode));
                }
            }
        }
        self.held.clear();
        if !list.is_empty() {
            let _ = self.co.ctx.post(list).await;
        }
        let pending = std::mem::take(&mut self.pending);
        for (addr, mode, ticket) in pending {
            loop {
                let mut l = PostList::new();
                let id = l.read(addr, 8);
                let Ok(res) = self.co.ctx.post(l).await else {
                    return;
                };
                let now = DslrWord::from_raw(u64::from_le_bytes(
                    res.bytes(id).try_into().unwrap_or([0; 8]),
                ));
                if now.grants(ticket, mode) {
                    let mut l = PostList::new();
                    l.faa(addr, DslrWord::release_delta(mode));
                    let _ = self.co.ctx.post(l).await;
                    if DslrWord::ticket_resets(ticket, mode) {
                        resets.push((addr, ticket, mode));
                    }
                    break;
                }
                self.co.ctx.sleep(self.co.cfg.poll_ns).await;
            }
        }
        for (addr, ticket, mode) in resets {
            let (x, s) = match mode {
                LockMode::Exclusive => (ticket.max_x + 1, ticket.max_s),
                LockMode::Shared => (ticket.max_x, ticket.max_s + 1),
            };
            loop {
                let mut l = PostList::new();
                let id = l.read(addr, 8);
                let Ok(res) = self.co.ctx.post(l).await else {
                    return;
                };
                let now = DslrWord::from_raw(u64::from_le_bytes(
                    res.bytes(id).try_into().unwrap_or([0; 8]),
                ));
                if now.drained(x, s) {
                    let mut l = PostList::new();
                    let c = l.cas(addr, now.raw(), 0);
                    if let Ok(r) = self.co.ctx.post(l).await
                        && r.atomic(c) == now.raw()
                    {
                        break;
                    }
                }
                self.co.ctx.sleep(self.co.cfg.poll_ns).await;
            }
        }
    }

    async fn fail(&mut self, e: TxnError) -> TxnError {
        if !self.done {
            self.done = true;
            self.release_all(PostList::new()).await;
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
        let mut targets: Vec<(TableId, Key, LockMode)> = Vec::new();
        for r in reqs {
            self.co.dir.value_len(r.table)?;
            let mode = if r.access == Access::ForUpdate && self.kind == TxnKind::ReadWrite {
                LockMode::Exclusive
            } else {
                LockMode::Shared
            };
            match self
                .held
                .iter()
                .find(|h| h.table == r.table && h.key == r.key)
            {
                Some(h) if h.mode == LockMode::Exclusive || mode == LockMode::Shared => {}
                Some(_) => return Err(aborted("lock upgrade (shared to exclusive)")),
                None => {
                    if let Some(t) = targets.iter_mut().find(|t| t.0 == r.table && t.1 == r.key) {
                        if mode == LockMode::Exclusive {
                            t.2 = mode;
                        }
                    } else {
                        targets.push((r.table, r.key, mode));
                    }
                }
            }
        }
        self.acquire(targets).await?;
        reqs.iter()
            .map(|r| {
                let h = self
                    .held
                    .iter()
                    .find(|h| h.table == r.table && h.key == r.key)
                    .ok_or(aborted("record not locked"))?;
                Ok(match &h.new {
                    Some(n) => n.clone(),
                    None => h.present.then(|| h.value.clone()),
                })
            })
            .collect()
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
            return Err(self.fail(aborted("record not locked")).await);
        };
        if h.mode != LockMode::Exclusive {
            return Err(self
                .fail(aborted("lock upgrade (shared to exclusive)"))
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

    async fn commit_inner(&mut self) -> Result<(), TxnError> {
        let dir = Rc::clone(&self.co.dir);
        let written: Vec<Held> = self
            .held
            .iter()
            .filter(|h| h.new.is_some())
            .cloned()
            .collect();
        if written.is_empty() {
            // Two-phase locking: the reads are consistent while the locks are held.
            self.done = true;
            self.co.history.record(TxnRecord {
                id: self.id,
                begin: self.begin_true,
                end: self.co.ctx.true_now(),
                outcome: TxnOutcome::Committed,
                reads: std::mem::take(&mut self.events),
                writes: Vec::new(),
            });
            bump(&self.co.stats.ro_committed, 1);
            bump(&self.co.stats.ro_one_round, 1);
            let mut list = PostList::new();
            for h in &self.held {
                list.faa(
                    self.lock_addr(h.table, h.loc)?,
                    DslrWord::release_delta(h.mode),
                );
            }
            if self.pending.is_empty()
                && !self
                    .held
                    .iter()
                    .any(|h| DslrWord::ticket_resets(h.ticket, h.mode))
            {
                self.held.clear();
                if !list.is_empty() {
                    let _ = self.co.ctx.post_detached(list).await;
                }
            } else {
                self.held.clear();
                self.release_all(list).await;
            }
            return Ok(());
        }
        let layout = dir.layout();
        let header = (u64::from(self.co.id) << 48) | (self.id.seq & 0xFFFF_FFFF_FFFF);
        let mut log = Vec::new();
        log.extend_from_slice(&header.to_le_bytes());
        log.extend_from_slice(&(written.len() as u64).to_le_bytes());
        let mut images = Vec::new();
        for h in &written {
            let phys = dir.value_len(h.table)?;
            let mut v = vec![0u8; phys];
            v[..8].copy_from_slice(&(h.version + 1).to_le_bytes());
            if let Some(Some(new)) = &h.new {
                v[8..].copy_from_slice(new);
            }
            let mut image = emit(h.table, h.key, Some(&v), phys, OoccLockWord::from_raw(0));
            if h.new.as_ref().is_some_and(Option::is_none) {
                image[14..16].copy_from_slice(&0u16.to_le_bytes());
            }
            // The lock word is not part of the image: WRITE header + value only.
            let cut = image.len() - 8;
            image.truncate(cut);
            log.extend_from_slice(&u64::from(h.loc.mn).to_le_bytes());
            log.extend_from_slice(&h.loc.offset.to_le_bytes());
            log.extend_from_slice(&(image.len() as u64).to_le_bytes());
            log.extend_from_slice(&image);
            images.push(image);
        }
        log.extend_from_slice(&header.to_le_bytes());
        if log.len() as u64 > crate::store::LOG_REGION_BYTES {
            return Err(aborted("redo log larger than its region"));
        }
        let writes = written
            .iter()
            .map(|h| WriteEvent {
                table: h.table,
                key: h.key,
                version: Version(h.version + 1),
                kind: match (&h.new, h.present) {
                    (Some(None), _) => WriteKind::Delete,
                    (_, false) => WriteKind::Insert,
                    _ => WriteKind::Update,
                },
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
        let log_addr = dir.addr(layout.log_mn(self.co.id), layout.log_offset(self.co.id));
        let mut list = PostList::new();
        list.write_owned(log_addr, log);
        self.co.ctx.post(list).await?;
        // The records, each followed on its queue pair by every lock release.
        let mut list = PostList::new();
        for (h, image) in written.iter().zip(&images) {
            list.write(dir.addr(h.loc.mn, h.loc.offset), image);
        }
        list.write(log_addr, &[0u8; 16]);
        self.release_all(list).await;
        bump(&self.co.stats.rw_committed, 1);
        self.co
            .history
            .resolve(self.id, TxnOutcome::Committed, self.co.ctx.true_now());
        Ok(())
    }
}

crate::shell::lock_based_transaction!(DslrTxn);
