//! DecLock's cooperative queue-notify lock (CQL), client level (DecLock §4).
//!
//! The lock in MN memory is a [`CqlLock`]: an 8-byte header that only FAA changes (plus
//! one CAS to start a reset) and a circular queue of 8-byte entries, contiguous so one
//! READ fetches both. The header decisions come from `dmem_layout::cql`; this module adds
//! the wire shell:
//!
//! * **Acquire** (§4.2 Fig. 7 lines 1–5): one FAA enqueues the client. A holder is done
//!   (workflow ➀, one MN op). A waiter WRITEs its entry (mode, client id, the position's
//!   version, a timestamp) and waits for a [`LockMsgRepr::CqlGrant`] (➁, two MN ops).
//! * **Release** (lines 6–19): the dequeuing FAA and a READ of the whole lock go out in
//!   one post list (the READ is "piggybacked", same queue pair, so it sees the FAA).
//!   [`Successors::plan`] says whom to notify: nobody (➂), the successor writer (➃), or
//!   every adjacent waiting reader behind a releasing writer (➄).
//! * **Obsolete entries** (§4.3): an entry not yet written, or a shared holder's entry,
//!   makes the plan ask for a refetch; the client READs the lock again, backing off.
//! * **Reset** (§4.4): on an acquisition timeout, an entry overwrite, an exhausted
//!   version, or a queue overflow, the client (1) CASes its id into the header's reset id
//!   (giving up if another reset is under way), (2) broadcasts a
//!   [`LockMsgRepr::ResetSignal`] carrying the lock's next reset counter to every client
//!   and waits for all [`LockMsgRepr::ResetAck`]s (not for clients on nodes the
//!   [`FailureDetector`] reports failed), (3) WRITEs the initial queue, then the zero
//!   header. A client holding the lock answers after releasing it; a waiter answers and
//!   aborts its wait, then retries. Notifications carry the sender's reset counter and a
//!   receiver drops those older than its own (expired notifications).
//!
//! Messages are only handled while a client is inside a lock call. A client that stops
//! taking locks must keep calling [`DecLockClient::serve_control_until`] while others may
//! still reset locks, or a reset waits for its answer (the paper's clients are always
//! polling; §4.4 step 2 waits for every surviving client).
//!
//! Deviations, each for a reason written at the place:
//! * the reset id is the client id + 1 rather than the CN id, because a client-level
//!   queue has several clients per CN and ids must tell the resetter apart (§4.4);
//! * a release that keeps refetching for longer than
//!   [`DecLockConfig::refetch_timeout_ns`] resets the lock itself instead of leaving it to
//!   the waiter's acquisition timeout (the waiter's entry was lost to a slot collision
//!   or the waiter failed between its FAA and its WRITE; `dmem-layout` documents how a
//!   collision happens with no more clients than the capacity);
//! * a reset answers for locks held by the answering client only after their release, as
//!   the paper says; a client that holds lock A and waits for a reset of lock B, while
//!   another client holding B waits for a reset of A, would deadlock. The benchmark
//!   holds one lock at a time; transaction protocols should release before resetting.

use alloc::collections::BTreeMap;
use alloc::rc::Rc;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::future::poll_fn;
use core::task::Poll;

use dmem_layout::cql::{
    AcquireRole, ClientId, CqlEntry, CqlError, CqlHeader, CqlLock, CqlTimestamp, EntryFreshness,
    NotifyPlan, QueuePosition, Successors,
};
use dmem_verbs::{Clock, Endpoint, Nanos, NodeId, PostList, RemoteAddr, Verbs, VerbsExt};
use zerocopy::IntoBytes;

use crate::local::{LocalAcquire, LocalGrant, LocalLockTable, LocalRelease};
use crate::msg::LockMsgRepr;
use crate::util::{Either, Rng, recv_before, select};
use crate::{
    Directory, FailureDetector, HeldLock, LockError, LockLayout, LockMode, LockStats, RwLockClient,
    lock_id,
};

/// Settings of a [`DecLockClient`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecLockConfig {
    /// How long a waiter waits for its notification before it resets the lock (§4.4
    /// "CN failure").
    pub acquire_timeout_ns: Nanos,
    /// How long a release keeps refetching obsolete entries before it resets the lock.
    pub refetch_timeout_ns: Nanos,
    /// An acquisition gives up with [`LockError::Timeout`] after this long in total
    /// (several timeouts and resets).
    pub give_up_ns: Nanos,
    /// How often a resetter re-asks the failure detector while it waits for answers.
    pub failure_poll_ns: Nanos,
}

impl Default for DecLockConfig {
    fn default() -> Self {
        Self {
            acquire_timeout_ns: 20_000_000,
            refetch_timeout_ns: 500_000,
            give_up_ns: 2_000_000_000,
            failure_poll_ns: 50_000,
        }
    }
}

/// Layout of a CQL lock of capacity `C`: [`CqlLock::INITIAL`].
#[must_use]
pub fn layout<const C: usize>() -> LockLayout {
    LockLayout {
        bytes: CqlLock::<C>::SIZE as u64,
        initial: CqlLock::<C>::INITIAL.as_bytes().to_vec(),
    }
}

/// What one waiting step ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WaitOutcome {
    /// The notification for this wait arrived.
    Granted,
    /// A reset of this lock began: the wait is aborted (§4.4 step 2).
    Aborted,
    /// The acquisition timeout passed.
    TimedOut,
}

/// What a waiting client does with a message (pure: the shell sends and records).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handling {
    /// The notification this client waits for.
    Granted,
    /// A reset of the awaited lock: answer, abort the wait.
    AckAndAbort,
    /// A reset of another lock this client does not hold: answer now.
    Ack,
    /// A reset of a lock this client holds: answer after releasing it.
    Defer,
    /// An answer to this client's own reset.
    ResetAck,
    /// Expired, duplicate or unrelated: drop.
    Drop,
}

/// The per-client view a message is judged against.
#[derive(Debug, Clone, Copy)]
pub struct WaitView<'a> {
    /// Lock and queue position index awaited, if waiting.
    pub waiting: Option<(u64, u64)>,
    /// Lock ids held.
    pub held: &'a [u64],
    /// Local reset counter of the message's lock.
    pub reset_count: u32,
    /// Lock and reset counter of this client's own reset in progress.
    pub resetting: Option<(u64, u32)>,
}

/// Classifies a received message (DecLock §4.2, §4.4 "Handling expired notifications").
#[must_use]
pub fn classify(msg: &LockMsgRepr, view: WaitView<'_>) -> Handling {
    match *msg {
        LockMsgRepr::CqlGrant {
            lock,
            position,
            reset_count,
            ..
        } => {
            if reset_count >= view.reset_count && view.waiting == Some((lock, position)) {
                Handling::Granted
            } else {
                Handling::Drop
            }
        }
        LockMsgRepr::ResetSignal {
            lock, reset_count, ..
        } => {
            if view.held.contains(&lock) {
                Handling::Defer
            } else if reset_count > view.reset_count && view.waiting.map(|w| w.0) == Some(lock) {
                Handling::AckAndAbort
            } else {
                // Not involved, or a signal already seen (a duplicate): answer, harmless.
                // A duplicate must not abort a wait begun after that reset: the aborted
                // waiter's entry would stay in the queue.
                Handling::Ack
            }
        }
        LockMsgRepr::ResetAck {
            lock, reset_count, ..
        } => {
            if view.resetting == Some((lock, reset_count)) {
                Handling::ResetAck
            } else {
                Handling::Drop
            }
        }
        LockMsgRepr::McsSuccessor { .. } | LockMsgRepr::McsGrant { .. } => Handling::Drop,
    }
}

/// One DecLock client with a client-level CQL queue of capacity `C` (a power of two; at
/// least the number of clients that may contend for one lock, or overflows force
/// resets).
pub struct DecLockClient<V, const C: usize> {
    ctx: V,
    id: u32,
    directory: Directory,
    failures: Rc<dyn FailureDetector>,
    config: DecLockConfig,
    stats: LockStats,
    rng: Rng,
    /// Local reset counter per lock id (§4.4 "Handling expired notifications").
    reset_counts: BTreeMap<u64, u32>,
    /// Lock ids this client holds.
    held: Vec<u64>,
    /// Reset answers owed once the named lock is released: (lock, resetter, count).
    deferred: Vec<(u64, Endpoint, u32)>,
    /// The lock and reset counter of this client's reset in progress, and who still owes
    /// an answer.
    resetting: Option<(u64, u32)>,
    awaiting_acks: Vec<(u32, Endpoint)>,
    /// Time origin of acquisition timestamps without a local table (§5.3: with one, the
    /// table keeps the CN's synchronised origin).
    epoch: Nanos,
    /// Hierarchical locking (§5): the CN's local lock table, shared by its clients.
    local: Option<Arc<LocalLockTable>>,
    /// This client's CN.
    node: NodeId,
    /// The earliest remote timestamp carried by the last notification (§5.3).
    granted_remote_ts: Option<CqlTimestamp>,
}

impl<V, const C: usize> core::fmt::Debug for DecLockClient<V, C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DecLockClient")
            .field("id", &self.id)
            .field("capacity", &C)
            .field("held", &self.held)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<V: Verbs + Clock, const C: usize> DecLockClient<V, C> {
    /// A client with id `id`; `directory` lists every client's endpoint (entry `id` must
    /// be this context's).
    ///
    /// # Errors
    /// [`LockError::UnknownClient`] if `id` does not fit a queue entry or the reset id, or
    /// is not in the directory.
    pub fn new(
        ctx: V,
        id: u32,
        directory: Directory,
        failures: Rc<dyn FailureDetector>,
        config: DecLockConfig,
        seed: u64,
    ) -> Result<Self, LockError> {
        let fits_reset_id = u64::from(id) + 1 < (1u64 << CqlHeader::<C>::RESET_ID_BITS);
        if ClientId::new(id).is_err() || !fits_reset_id || directory.endpoint(id).is_none() {
            return Err(LockError::UnknownClient(id));
        }
        Ok(Self {
            id,
            directory,
            failures,
            config,
            stats: LockStats::default(),
            rng: Rng::new(seed),
            reset_counts: BTreeMap::new(),
            held: Vec::new(),
            deferred: Vec::new(),
            resetting: None,
            awaiting_acks: Vec::new(),
            epoch: 0,
            node: ctx.local_endpoint().node,
            local: None,
            granted_remote_ts: None,
            ctx,
        })
    }

    /// A client of hierarchical DecLock (§5): `table` is its CN's local lock table, shared
    /// by every client of that CN (and only by them); its policy makes the lock task-fair
    /// or phase-fair. The CQL queue then holds CNs, so `C` need only reach the number of
    /// CNs. Otherwise as [`Self::new`].
    ///
    /// # Errors
    /// As [`Self::new`].
    pub fn hierarchical(
        ctx: V,
        id: u32,
        directory: Directory,
        failures: Rc<dyn FailureDetector>,
        config: DecLockConfig,
        seed: u64,
        table: Arc<LocalLockTable>,
    ) -> Result<Self, LockError> {
        let mut c = Self::new(ctx, id, directory, failures, config, seed)?;
        c.local = Some(table);
        Ok(c)
    }

    /// Synchronises the CN's clock origin through the MN counter at `counter` (§5.3
    /// "Synchronized time"): FAA it by one; the CN that brings it to `cns` WRITEs it back
    /// to 0; every CN READs it every `poll_ns` until it is 0 and takes that instant as the
    /// origin of its 16-bit microsecond timestamps. One client per CN calls this, at the
    /// same period on every CN (the paper: once a second); the counter starts at 0.
    ///
    /// # Errors
    /// A verbs failure.
    pub async fn synchronize_clock(
        &mut self,
        counter: RemoteAddr,
        cns: u64,
        poll_ns: Nanos,
    ) -> Result<Nanos, LockError> {
        let old = self.ctx.faa(counter, 1).await?;
        if old + 1 >= cns {
            self.ctx.write(counter, &0u64.to_le_bytes()).await?;
        }
        loop {
            let bytes = self.ctx.read(counter, 8).await?;
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[..8]);
            if u64::from_le_bytes(word) == 0 {
                break;
            }
            self.ctx.sleep(poll_ns).await;
        }
        let epoch = self.ctx.now();
        match &self.local {
            Some(table) => table.set_epoch(epoch),
            None => self.epoch = epoch,
        }
        Ok(epoch)
    }

    /// Waits (answering control messages) until the CN's clock origin is set by the
    /// client that runs [`Self::synchronize_clock`]; polls every `poll_ns`.
    ///
    /// # Errors
    /// A verbs failure.
    pub async fn wait_for_clock(&mut self, poll_ns: Nanos) -> Result<(), LockError> {
        while self.local.as_ref().is_some_and(|t| t.epoch().is_none()) {
            let until = self.ctx.now() + poll_ns;
            self.serve_control_until(until).await?;
        }
        Ok(())
    }

    /// The verbs context.
    pub fn context(&self) -> &V {
        &self.ctx
    }

    /// This client's id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The local reset counter of the lock at `lock`.
    pub fn reset_count(&self, lock: RemoteAddr) -> u32 {
        self.count_of(lock_id(lock))
    }

    fn count_of(&self, lock: u64) -> u32 {
        match &self.local {
            Some(table) => table.reset_count(lock),
            None => self.reset_counts.get(&lock).copied().unwrap_or(0),
        }
    }

    fn raise_count(&mut self, lock: u64, count: u32) {
        match &self.local {
            Some(table) => table.raise_reset_count(lock, count),
            None => {
                let c = self.reset_counts.entry(lock).or_insert(0);
                *c = (*c).max(count);
            }
        }
    }

    async fn send(&mut self, to: Endpoint, msg: LockMsgRepr) -> Result<(), LockError> {
        self.ctx.send(to, msg.emit().as_bytes()).await?;
        self.stats.messages_sent += 1;
        Ok(())
    }

    /// Handles one message; returns what it was.
    async fn handle(
        &mut self,
        from: Endpoint,
        payload: &[u8],
        waiting: Option<(u64, u64)>,
    ) -> Result<Handling, LockError> {
        let Ok(msg) = LockMsgRepr::parse(payload) else {
            self.stats.stale_messages += 1;
            return Ok(Handling::Drop);
        };
        let lock = match msg {
            LockMsgRepr::CqlGrant { lock, .. }
            | LockMsgRepr::ResetSignal { lock, .. }
            | LockMsgRepr::ResetAck { lock, .. }
            | LockMsgRepr::McsSuccessor { lock, .. }
            | LockMsgRepr::McsGrant { lock, .. } => lock,
        };
        let view = WaitView {
            waiting,
            held: &self.held,
            reset_count: self.count_of(lock),
            resetting: self.resetting,
        };
        let mut handling = classify(&msg, view);
        if let (Some(table), LockMsgRepr::ResetSignal { reset_count, .. }) = (&self.local, msg) {
            // §4.4 with §5: a client handed the CN's CQL hold but not yet awake to it
            // holds the lock and answers after its release. Raising the CN's counter in
            // the same critical section stops the stale hold from being shared or handed
            // on from now on.
            if table.note_reset(lock, self.id, reset_count) && handling != Handling::Defer {
                handling = Handling::Defer;
            }
        }
        match (handling, msg) {
            (
                Handling::Granted,
                LockMsgRepr::CqlGrant {
                    reset_count,
                    remote_ts,
                    ..
                },
            ) => {
                self.raise_count(lock, reset_count);
                self.granted_remote_ts = remote_ts;
            }
            (
                Handling::Ack | Handling::AckAndAbort,
                LockMsgRepr::ResetSignal { reset_count, .. },
            ) => {
                self.raise_count(lock, reset_count);
                let ack = LockMsgRepr::ResetAck {
                    lock,
                    client: self.id,
                    reset_count,
                };
                self.send(from, ack).await?;
            }
            (Handling::Defer, LockMsgRepr::ResetSignal { reset_count, .. }) => {
                self.raise_count(lock, reset_count);
                self.deferred.push((lock, from, reset_count));
            }
            (Handling::ResetAck, LockMsgRepr::ResetAck { client, .. }) => {
                self.awaiting_acks.retain(|&(c, _)| c != client);
            }
            _ => self.stats.stale_messages += 1,
        }
        Ok(handling)
    }

    /// Handles every message that has already arrived, without waiting.
    ///
    /// # Errors
    /// A verbs failure.
    pub async fn serve_control(&mut self) -> Result<(), LockError> {
        while let Some(m) = self.ctx.try_recv()? {
            self.handle(m.from, &m.payload, None).await?;
        }
        Ok(())
    }

    /// Answers reset signals until `deadline` (for a client that takes no more locks while
    /// others may still reset; see the module docs).
    ///
    /// # Errors
    /// A verbs failure.
    pub async fn serve_control_until(&mut self, deadline: Nanos) -> Result<(), LockError> {
        while let Some(m) = recv_before(&self.ctx, deadline).await? {
            self.handle(m.from, &m.payload, None).await?;
        }
        Ok(())
    }

    /// Waits for the notification of position `position` of `lock` (§4.2 line 5).
    async fn wait_grant(
        &mut self,
        lock: u64,
        position: u64,
        deadline: Nanos,
    ) -> Result<WaitOutcome, LockError> {
        self.granted_remote_ts = None;
        loop {
            let Some(m) = recv_before(&self.ctx, deadline).await? else {
                return Ok(WaitOutcome::TimedOut);
            };
            match self
                .handle(m.from, &m.payload, Some((lock, position)))
                .await?
            {
                Handling::Granted => return Ok(WaitOutcome::Granted),
                Handling::AckAndAbort => return Ok(WaitOutcome::Aborted),
                _ => {}
            }
        }
    }

    async fn flush_deferred(&mut self, lock: u64) -> Result<(), LockError> {
        let mut i = 0;
        while i < self.deferred.len() {
            if self.deferred[i].0 == lock {
                let (lock, to, reset_count) = self.deferred.swap_remove(i);
                let ack = LockMsgRepr::ResetAck {
                    lock,
                    client: self.id,
                    reset_count,
                };
                self.send(to, ack).await?;
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    async fn read_lock(&mut self, addr: RemoteAddr) -> Result<CqlLock<C>, LockError> {
        let bytes = self.ctx.read(addr, CqlLock::<C>::SIZE as u32).await?;
        CqlLock::<C>::parse(&bytes)
            .copied()
            .map_err(|_| LockError::Corrupt("short READ of a CQL lock"))
    }

    /// Resets the lock at `addr` (DecLock §4.4). Returns whether this client carried the
    /// reset out (`false`: another reset was under way, whose signal will come).
    async fn reset(&mut self, addr: RemoteAddr) -> Result<bool, LockError> {
        let lock = lock_id(addr);
        let my_reset_id = u64::from(self.id) + 1;
        // Step 1: set the reset id with a CAS; give up if another reset is under way.
        let mut seen = self.read_lock(addr).await?.header();
        loop {
            if seen.reset_id() != 0 {
                return Ok(false);
            }
            let swap = seen
                .with_reset_id(my_reset_id)
                .map_err(|_| LockError::UnknownClient(self.id))?;
            let old = self.ctx.cas(addr, seen.raw(), swap.raw()).await?;
            if old == seen.raw() {
                break;
            }
            seen = CqlHeader::from_raw(old);
        }
        // Step 2: broadcast the signal with the next reset counter; collect answers.
        let count = self.count_of(lock).wrapping_add(1);
        self.raise_count(lock, count);
        self.resetting = Some((lock, count));
        self.awaiting_acks.clear();
        let targets: Vec<(u32, Endpoint)> = self
            .directory
            .iter()
            .filter(|&(c, e)| c != self.id && !self.failures.is_failed(e.node))
            .collect();
        for &(_, to) in &targets {
            let signal = LockMsgRepr::ResetSignal {
                lock,
                resetter: self.id,
                reset_count: count,
            };
            self.send(to, signal).await?;
        }
        self.awaiting_acks = targets;
        while !self.awaiting_acks.is_empty() {
            let slice = self.ctx.now() + self.config.failure_poll_ns;
            if let Some(m) = recv_before(&self.ctx, slice).await? {
                self.handle(m.from, &m.payload, None).await?;
            }
            let failures = Rc::clone(&self.failures);
            self.awaiting_acks
                .retain(|&(_, e)| !failures.is_failed(e.node));
        }
        self.resetting = None;
        // Step 3: reinitialise the queue, then the header (which clears the reset id).
        let initial = CqlLock::<C>::INITIAL;
        let queue_addr = addr.add(CqlLock::<C>::QUEUE_OFFSET as u64);
        self.ctx
            .write(queue_addr, initial.queue().as_bytes())
            .await?;
        self.ctx
            .write(addr, &CqlHeader::<C>::INITIAL.raw().to_le_bytes())
            .await?;
        self.stats.resets += 1;
        Ok(true)
    }

    fn timestamp(&self) -> CqlTimestamp {
        let epoch = match &self.local {
            Some(table) => table.epoch().unwrap_or(0),
            None => self.epoch,
        };
        CqlTimestamp::from_micros(self.ctx.now().saturating_sub(epoch) / 1000)
    }

    async fn acquire_inner(
        &mut self,
        addr: RemoteAddr,
        mode: LockMode,
    ) -> Result<HeldLock, LockError> {
        let lock = lock_id(addr);
        if self.held.contains(&lock) {
            return Err(LockError::AlreadyHeld);
        }
        if let Some(table) = self.local.clone() {
            self.acquire_hierarchical(&table, addr, mode).await?;
        } else {
            let ts = self.timestamp();
            self.acquire_cql(addr, mode, ts).await?;
        }
        self.held.push(lock);
        self.stats.acquisitions += 1;
        Ok(HeldLock::new(addr, mode))
    }

    /// DecLock §5.2 Fig. 10 lines 1–18: the local lock first; the CQL lock only when the
    /// CN does not hold it.
    async fn acquire_hierarchical(
        &mut self,
        table: &Arc<LocalLockTable>,
        addr: RemoteAddr,
        mode: LockMode,
    ) -> Result<(), LockError> {
        let lock = lock_id(addr);
        self.serve_control().await?;
        let ts = self.timestamp();
        let must_acquire_cql = match table.acquire(lock, self.id, mode, ts)? {
            LocalAcquire::Joined => false,
            LocalAcquire::AcquireCql => true,
            LocalAcquire::Wait { prefetch } => {
                if let Some(generation) = prefetch {
                    let earliest = self.prefetch_remote_ts(addr).await;
                    table.set_remote_ts(
                        lock,
                        generation,
                        earliest.as_ref().ok().copied().flatten(),
                    );
                    earliest?;
                }
                self.wait_local(table, lock).await? == LocalGrant::AcquireCql
            }
        };
        if !must_acquire_cql {
            self.stats.local_grants += 1;
            return Ok(());
        }
        match self.acquire_cql(addr, mode, ts).await {
            Ok((count, remote_ts)) => {
                table.cql_acquired(lock, mode, count, remote_ts);
                Ok(())
            }
            Err(e) => {
                table.abandon_cql(lock, self.id);
                Err(e)
            }
        }
    }

    /// Waits for a local grant while answering messages (Fig. 10 line 10).
    async fn wait_local(
        &mut self,
        table: &Arc<LocalLockTable>,
        lock: u64,
    ) -> Result<LocalGrant, LockError> {
        loop {
            let id = self.id;
            let grant = poll_fn(|cx| match table.poll_grant(lock, id, Some(cx.waker())) {
                Ok(Some(g)) => Poll::Ready(Ok(g)),
                Ok(None) => Poll::Pending,
                Err(e) => Poll::Ready(Err(e)),
            });
            match select(grant, self.ctx.recv()).await {
                Either::Left(g) => return g,
                Either::Right(m) => {
                    let m = m?;
                    self.handle(m.from, &m.payload, None).await?;
                }
            }
        }
    }

    /// §5.3 "Prefetched remote timestamp": READs the CQL lock and returns the earliest
    /// timestamp among current entries of other CNs.
    async fn prefetch_remote_ts(
        &mut self,
        addr: RemoteAddr,
    ) -> Result<Option<CqlTimestamp>, LockError> {
        let image = self.read_lock(addr).await?;
        self.stats.acquire_mn_ops += 1;
        self.stats.prefetches += 1;
        let header = image.header();
        let head = header.head_position();
        let positions = (0..header.qsize()).map(|k| head.advance(k));
        Ok(self.earliest_remote(&image, positions))
    }

    /// The earliest timestamp among the current entries at `positions` whose client is
    /// on another CN (§5.3).
    fn earliest_remote(
        &self,
        image: &CqlLock<C>,
        positions: impl Iterator<Item = QueuePosition<C>>,
    ) -> Option<CqlTimestamp> {
        let mut earliest: Option<CqlTimestamp> = None;
        for position in positions {
            let entry = image.queue()[position.slot()];
            if entry.freshness(position.version()) != EntryFreshness::Current {
                continue;
            }
            let remote = self
                .directory
                .endpoint(entry.client().get())
                .is_some_and(|e| e.node != self.node);
            let ts = entry.timestamp();
            if remote && earliest.is_none_or(|e| ts.is_earlier_than(e)) {
                earliest = Some(ts);
            }
        }
        earliest
    }

    /// DecLock §4.2 Fig. 7 lines 1–5 with resets (§4.4): returns the reset counter seen
    /// before the successful FAA and the earliest remote timestamp a notification carried.
    async fn acquire_cql(
        &mut self,
        addr: RemoteAddr,
        mode: LockMode,
        ts: CqlTimestamp,
    ) -> Result<(u32, Option<CqlTimestamp>), LockError> {
        let lock = lock_id(addr);
        let start = self.ctx.now();
        let mut pause = 0u32;
        loop {
            self.serve_control().await?;
            if self.ctx.now().saturating_sub(start) > self.config.give_up_ns {
                return Err(LockError::Timeout {
                    waited_ns: self.ctx.now() - start,
                });
            }
            let count = self.count_of(lock);
            let old = CqlHeader::<C>::from_raw(
                self.ctx
                    .faa(addr, CqlHeader::<C>::enqueue_delta(mode))
                    .await?,
            );
            self.stats.acquire_mn_ops += 1;
            let acquired = match old.decode_acquire(mode) {
                Ok(a) => a,
                Err(CqlError::Resetting { .. }) | Err(CqlError::NotHeld) => {
                    // §4.4: the operation is aborted; retry once the reset is done. Wait
                    // while answering signals, up to about a message round trip.
                    self.stats.aborts += 1;
                    self.stats.retries += 1;
                    let d = (2_000u64 << pause.min(4)) + self.rng.below(1_000);
                    pause = pause.saturating_add(1);
                    let until = self.ctx.now() + d;
                    self.serve_control_until(until).await?;
                    continue;
                }
            };
            if acquired.role == AcquireRole::Holder {
                return Ok((count, None));
            }
            if acquired.overflowed {
                // More contenders than entries: the entry would overwrite a live one. The
                // FAA cannot be undone (dmem-layout), so reset at once (§4.4).
                self.stats.timeouts += 1;
                self.reset(addr).await?;
                continue;
            }
            let id = ClientId::new(self.id).map_err(|_| LockError::UnknownClient(self.id))?;
            let entry: CqlEntry = acquired.entry(id, ts);
            let entry_addr = addr.add(acquired.position.entry_offset() as u64);
            self.ctx
                .write(entry_addr, &entry.raw().to_le_bytes())
                .await?;
            self.stats.acquire_mn_ops += 1;
            let deadline = self.ctx.now() + self.config.acquire_timeout_ns;
            match self
                .wait_grant(lock, acquired.position.index(), deadline)
                .await?
            {
                WaitOutcome::Granted => return Ok((count, self.granted_remote_ts.take())),
                WaitOutcome::Aborted => {
                    self.stats.aborts += 1;
                    self.stats.retries += 1;
                }
                WaitOutcome::TimedOut => {
                    self.stats.timeouts += 1;
                    self.stats.retries += 1;
                    self.reset(addr).await?;
                }
            }
        }
    }

    async fn notify(
        &mut self,
        lock: u64,
        client: ClientId,
        position: QueuePosition<C>,
        mode: LockMode,
        remote_ts: Option<CqlTimestamp>,
    ) -> Result<(), LockError> {
        let to = self
            .directory
            .endpoint(client.get())
            .ok_or(LockError::UnknownClient(client.get()))?;
        let grant = LockMsgRepr::CqlGrant {
            lock,
            position: position.index(),
            mode,
            reset_count: self.count_of(lock),
            remote_ts,
        };
        self.send(to, grant).await
    }

    async fn release_inner(&mut self, held: HeldLock) -> Result<(), LockError> {
        let addr = held.addr;
        let lock = lock_id(addr);
        let Some(i) = self.held.iter().position(|&l| l == lock) else {
            return Err(LockError::Corrupt("release of a DecLock lock not held"));
        };
        self.held.swap_remove(i);
        let result = match self.local.clone() {
            // §5.2 Fig. 10 lines 19–33.
            Some(table) => match table.release(lock, self.id) {
                Ok(LocalRelease::Done) => Ok(()),
                Ok(LocalRelease::ReleaseCql { mode }) => {
                    let r = self.release_cql(addr, mode).await;
                    table.finish_cql_release(lock, mode);
                    r
                }
                Err(e) => Err(e),
            },
            None => self.release_cql(addr, held.mode).await,
        };
        self.serve_control().await?;
        self.flush_deferred(lock).await?;
        result
    }

    /// DecLock §4.2 Fig. 7 lines 6–19 (with §4.3 refetches and §4.4 resets); with §5 the
    /// notification carries the earliest timestamp among the waiters left behind.
    async fn release_cql(&mut self, addr: RemoteAddr, mode: LockMode) -> Result<(), LockError> {
        let lock = lock_id(addr);
        let mut list = PostList::with_capacity(2);
        let faa = list.faa(addr, CqlHeader::<C>::dequeue_delta(mode));
        let read = list.read(addr, CqlLock::<C>::SIZE as u32);
        let mut result = self.ctx.post(list).await?;
        self.stats.release_mn_ops += 2;
        self.stats.releases += 1;
        let old = CqlHeader::<C>::from_raw(result.atomic(faa));
        let bytes = result.take_bytes(read);
        let mut image = *CqlLock::<C>::parse(&bytes)
            .map_err(|_| LockError::Corrupt("short READ of a CQL lock"))?;
        let released = match old.decode_release(mode) {
            Ok(r) => r,
            // §4.4: an aborted release can be ignored; the caller answers the reset.
            Err(CqlError::Resetting { .. }) => return Ok(()),
            Err(CqlError::NotHeld) => {
                self.reset(addr).await?;
                return Err(LockError::Corrupt("CQL header shows no such holder"));
            }
        };
        if let Some(successors) = released.successors {
            let deadline = self.ctx.now() + self.config.refetch_timeout_ns;
            let mut refetch = 0u32;
            loop {
                match successors.plan(&image) {
                    NotifyPlan::Nobody => break,
                    NotifyPlan::Writer { position, client } => {
                        let behind = self.earliest_behind(&image, &successors, 1);
                        self.notify(lock, client, position, LockMode::Exclusive, behind)
                            .await?;
                        break;
                    }
                    NotifyPlan::Readers { first, count } => {
                        let behind = self.earliest_behind(&image, &successors, count);
                        for k in 0..count {
                            let position = first.advance(k);
                            let entry = image.queue()[position.slot()];
                            self.notify(lock, entry.client(), position, LockMode::Shared, behind)
                                .await?;
                        }
                        break;
                    }
                    NotifyPlan::Refetch { .. } => {
                        if self.ctx.now() >= deadline {
                            self.reset(addr).await?;
                            break;
                        }
                        let d = 500u64 << refetch.min(5);
                        refetch = refetch.saturating_add(1);
                        self.ctx.sleep(d).await;
                        image = self.read_lock(addr).await?;
                        self.stats.release_mn_ops += 1;
                        self.stats.refetches += 1;
                    }
                    NotifyPlan::Reset(_) => {
                        self.reset(addr).await?;
                        break;
                    }
                }
            }
        } else if released.version_exhausted {
            // §4.4 "Version overflow": the next position has the reserved version.
            self.reset(addr).await?;
        }
        Ok(())
    }

    /// §5.3: the earliest timestamp among the queued entries after the first `notified`
    /// successors (embedded in the notification, so the new holder's CN knows whether a
    /// remote waiter precedes its local ones without fetching the queue). Only with a
    /// local table; a client-level queue has no use for it.
    fn earliest_behind(
        &self,
        image: &CqlLock<C>,
        successors: &Successors<C>,
        notified: u64,
    ) -> Option<CqlTimestamp> {
        self.local.as_ref()?;
        let mut earliest: Option<CqlTimestamp> = None;
        for position in successors.positions().skip(notified as usize) {
            let entry = image.queue()[position.slot()];
            if entry.freshness(position.version()) != EntryFreshness::Current {
                continue;
            }
            let ts = entry.timestamp();
            if earliest.is_none_or(|e| ts.is_earlier_than(e)) {
                earliest = Some(ts);
            }
        }
        earliest
    }
}

impl<V: Verbs + Clock, const C: usize> RwLockClient for DecLockClient<V, C> {
    async fn acquire(&mut self, lock: RemoteAddr, mode: LockMode) -> Result<HeldLock, LockError> {
        self.acquire_inner(lock, mode).await
    }

    async fn release(&mut self, held: HeldLock) -> Result<(), LockError> {
        self.release_inner(held).await
    }

    async fn idle_until(&mut self, deadline: Nanos) -> Result<(), LockError> {
        self.serve_control_until(deadline).await
    }

    fn stats(&self) -> &LockStats {
        &self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(waiting: Option<(u64, u64)>, held: &[u64], count: u32) -> WaitView<'_> {
        WaitView {
            waiting,
            held,
            reset_count: count,
            resetting: None,
        }
    }

    #[test]
    fn grants_match_lock_position_and_reset_count() {
        let g = |lock, position, reset_count| LockMsgRepr::CqlGrant {
            lock,
            position,
            mode: LockMode::Exclusive,
            reset_count,
            remote_ts: None,
        };
        assert_eq!(
            classify(&g(1, 9, 2), view(Some((1, 9)), &[], 2)),
            Handling::Granted
        );
        assert_eq!(
            classify(&g(1, 9, 1), view(Some((1, 9)), &[], 2)),
            Handling::Drop,
            "expired notification from before a reset"
        );
        assert_eq!(
            classify(&g(1, 8, 2), view(Some((1, 9)), &[], 2)),
            Handling::Drop,
            "another position"
        );
        assert_eq!(
            classify(&g(2, 9, 2), view(Some((1, 9)), &[], 2)),
            Handling::Drop
        );
        assert_eq!(classify(&g(1, 9, 2), view(None, &[], 2)), Handling::Drop);
    }

    #[test]
    fn reset_signals_abort_defer_or_ack() {
        let s = |lock, reset_count| LockMsgRepr::ResetSignal {
            lock,
            resetter: 4,
            reset_count,
        };
        assert_eq!(
            classify(&s(1, 1), view(Some((1, 3)), &[], 0)),
            Handling::AckAndAbort
        );
        assert_eq!(
            classify(&s(1, 1), view(Some((2, 3)), &[1], 0)),
            Handling::Defer
        );
        assert_eq!(classify(&s(5, 1), view(None, &[1], 0)), Handling::Ack);
        assert_eq!(
            classify(&s(1, 1), view(Some((1, 3)), &[], 1)),
            Handling::Ack,
            "a duplicate signal does not abort a later wait"
        );
        let ack = LockMsgRepr::ResetAck {
            lock: 1,
            client: 3,
            reset_count: 2,
        };
        let mut v = view(None, &[], 2);
        assert_eq!(classify(&ack, v), Handling::Drop);
        v.resetting = Some((1, 2));
        assert_eq!(classify(&ack, v), Handling::ResetAck);
    }
}
