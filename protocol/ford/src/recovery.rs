//! Pandora's recovery protocol (§3.2): failure detection, active-link termination, log
//! recovery, log truncation and stray-lock notification, plus FORD's ("Baseline", §4.1)
//! stop-the-world scan for stray locks.
//!
//! Every step is idempotent (§3.2.3): log recovery of a coordinator whose log was already
//! truncated finds nothing; a roll-back rewrites the same undo image; the unlock is a CAS
//! that only releases a lock the failed coordinator still holds. So the recovery manager
//! can simply run it again after a failure of its own.

use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;

use dmem_layout::log::LogRegionHeader;
use dmem_layout::pill::{CoordinatorId as PillId, FailedCoordinatorSet, PillLockWord};
use dmem_layout::record::{DataItemHeader, DataVersion, RemoteAddr as PackedAddr};
use dmem_txn::TableId;
use dmem_txn::detector::HeartbeatDetector;
use dmem_verbs::{
    BatchResult, Clock, Endpoint, Nanos, NodeId, PostList, Verbs, VerbsError, VerbsExt, WrId,
};

use crate::config::Protocol;
use crate::logic::{self, Decision, LoggedTxn};
use crate::store::{BUCKET_SLOTS, Store, StoreError, encode_item};
use crate::wire::{self, ControlMsg};

/// Why recovery could not finish (it may be re-run: every step is idempotent).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecoveryError {
    /// The fabric failed.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// The store has no such table, partition or log region.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A live CN left an MN-failure notification unanswered although it was re-sent
    /// ([`RecoveryManager::resend_control`]).
    #[error(
        "CN node {cn} did not acknowledge the view change of epoch {epoch} within {:?} (the notification was re-sent every {:?})",
        core::time::Duration::from_nanos(*waited),
        core::time::Duration::from_nanos(*resend)
    )]
    NoAnswer {
        /// The silent CN.
        cn: u16,
        /// The view epoch it was told about.
        epoch: u64,
        /// How long the detector waited, ns.
        waited: Nanos,
        /// How often it re-sent, ns.
        resend: Nanos,
    },
}

/// What log recovery did for one failed coordinator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoordinatorRecovery {
    /// The coordinator.
    pub coordinator: u16,
    /// Its logged stray transaction (sequence number), if it had one.
    pub txn: Option<u64>,
    /// The decision taken for it.
    pub decision: Option<Decision>,
    /// Replicas restored from undo records.
    pub restored: usize,
    /// Locks released.
    pub unlocked: usize,
}

/// Log recovery of one failed coordinator (Pandora §3.2.2 step 3) and log truncation
/// (§3.2.3). The caller must have terminated the coordinator's links first (step 2).
///
/// Pandora reads the f + 1 copies of the coordinator's log; FORD reads the coordinator's
/// region on every MN (its undo records live with the objects' replicas).
///
/// # Errors
/// [`RecoveryError`] if an MN does not answer; re-run it.
pub async fn recover_coordinator<V: Verbs>(
    ctx: &V,
    store: &Store,
    protocol: Protocol,
    coordinator: u16,
) -> Result<CoordinatorRecovery, RecoveryError> {
    let base = store.log_offset(coordinator)?;
    let log_mns = log_mns(store, protocol, coordinator);
    let mut report = CoordinatorRecovery {
        coordinator,
        txn: None,
        decision: None,
        restored: 0,
        unlocked: 0,
    };
    if log_mns.is_empty() {
        return Ok(report);
    }
    // f + 1 READs fetch every copy of the log.
    let mut list = PostList::new();
    let ids: Vec<_> = log_mns
        .iter()
        .map(|&mn| list.read(store.addr(mn, base), store.log_region_bytes() as u32))
        .collect();
    let mut res = ctx.post(list).await?;
    let raw: Vec<Vec<u8>> = ids.into_iter().map(|id| res.take_bytes(id)).collect();
    let copies: Vec<LoggedTxn> = raw
        .iter()
        .filter_map(|bytes| logic::parse_log_copy(bytes, coordinator))
        .collect();
    let had_log = !copies.is_empty();
    if let Some(txn) = logic::merge_log_copies(copies) {
        report.txn = Some(txn.txn);
        apply_recovery(ctx, store, coordinator, &txn, &mut report).await?;
    }
    // Traditional lock logging (§6.1): release the logged locks. After log recovery every
    // lock still naming the coordinator belongs to a NotLogged-Stray-Tx, so releasing it is
    // what Cor4 allows; the CAS releases nothing else.
    let lock_log_at = wire::lock_log_offset(store.log_region_bytes());
    let logged_locks = logged_locks(&raw, lock_log_at, coordinator);
    if !logged_locks.is_empty() {
        let (list, cas) = release_list(store, coordinator, &logged_locks)?;
        let res = ctx.post(list).await?;
        let mine = PillLockWord::locked_by(PillId(coordinator)).raw();
        report.unlocked += cas.iter().filter(|&&id| res.atomic(id) == mine).count();
    }
    if had_log || !logged_locks.is_empty() {
        // Truncate every copy before stray-lock notification (§3.2.3).
        let lock_log = lock_log_at.filter(|_| !logged_locks.is_empty());
        ctx.post(truncate_list(store, base, &log_mns, lock_log))
            .await?;
    }
    Ok(report)
}

/// The MNs holding a coordinator's log: Pandora's f + 1 log MNs (§3.1.4), or every live
/// MN for FORD (its undo records live with the objects' replicas).
fn log_mns(store: &Store, protocol: Protocol, coordinator: u16) -> Vec<u16> {
    match protocol {
        Protocol::Pandora => store.pandora_log_mns(coordinator),
        Protocol::Ford => {
            let view = store.view().borrow().clone();
            (0..store.config().mns)
                .filter(|&m| view.is_alive(m))
                .collect()
        }
    }
}

/// The distinct lock addresses the lock logs of `raw` (the log regions as read, the lock
/// log at `lock_log_at`) name for `coordinator`, sorted.
fn logged_locks(raw: &[Vec<u8>], lock_log_at: Option<usize>, coordinator: u16) -> Vec<PackedAddr> {
    let mut locks: Vec<_> = lock_log_at
        .map(|at| {
            raw.iter()
                .flat_map(|bytes| {
                    wire::LockLog::addrs_of(bytes.get(at..).unwrap_or(&[]), coordinator)
                })
                .collect()
        })
        .unwrap_or_default();
    locks.sort_unstable_by_key(|a| a.to_raw());
    locks.dedup();
    locks
}

/// The CASes (the coordinator's word to 0) releasing `locks` at their primaries, and
/// their work requests: only a lock the coordinator still holds is released.
fn release_list(
    store: &Store,
    coordinator: u16,
    locks: &[PackedAddr],
) -> Result<(PostList, Vec<WrId>), RecoveryError> {
    let mine = PillLockWord::locked_by(PillId(coordinator)).raw();
    let mut list = PostList::new();
    let mut cas = Vec::new();
    for a in locks {
        let p = store.primary(a.node())?;
        cas.push(list.cas(store.addr(p, a.offset()), mine, 0));
    }
    Ok((list, cas))
}

/// Log truncation (§3.2.3): the state byte of every copy of the log cleared, and with
/// `lock_log` (its offset, when locks were logged) the lock log's header too.
fn truncate_list(store: &Store, base: u64, log_mns: &[u16], lock_log: Option<usize>) -> PostList {
    let mut list = PostList::new();
    for &mn in log_mns {
        list.write(
            store.addr(mn, base + LogRegionHeader::STATE_OFFSET as u64),
            &[0],
        );
        if let Some(at) = lock_log {
            list.write(store.addr(mn, base + at as u64), &[0; 8]);
        }
    }
    list
}

/// Recovery of one logged stray transaction (Pandora §3.2.2 step 3): READ the version of
/// every live replica of each logged write, decide ([`logic::decide`]), restore the
/// updated replicas on a roll-back, and release what the coordinator still holds.
pub(crate) async fn apply_recovery<V: Verbs>(
    ctx: &V,
    store: &Store,
    coordinator: u16,
    txn: &LoggedTxn,
    report: &mut CoordinatorRecovery,
) -> Result<(), RecoveryError> {
    // One READ of lock + version per live replica of each logged write.
    let (list, ids) = version_reads(store, txn);
    let observed: Vec<Vec<(u16, u64)>> = if list.is_empty() {
        Vec::new()
    } else {
        let res = ctx.post(list).await?;
        observed_versions(&ids, &res)
    };
    let versions: Vec<Vec<u64>> = observed
        .iter()
        .map(|per| per.iter().map(|&(_, v)| v).collect())
        .collect();
    let decision = logic::decide(txn, &versions);
    report.decision = Some(decision);
    if decision == Decision::RollBack {
        let (list, restored) = rollback_list(store, txn, &observed);
        report.restored += restored;
        if !list.is_empty() {
            ctx.post(list).await?;
        }
    }
    // Unlock: only what the failed coordinator still holds.
    let mine = PillLockWord::locked_by(PillId(coordinator)).raw();
    let mut list = PostList::new();
    let mut cas = Vec::new();
    for w in &txn.writes {
        let p = store.primary(w.partition)?;
        cas.push(list.cas(store.addr(p, w.offset), mine, 0));
    }
    if !list.is_empty() {
        let res = ctx.post(list).await?;
        report.unlocked += cas.iter().filter(|&&id| res.atomic(id) == mine).count();
    }
    Ok(())
}

/// The READs of lock + version of every live replica of each logged write, and per write
/// the replicas' MN and work request.
fn version_reads(store: &Store, txn: &LoggedTxn) -> (PostList, Vec<Vec<(u16, WrId)>>) {
    let mut list = PostList::new();
    let ids = txn
        .writes
        .iter()
        .map(|w| {
            store
                .live_replicas(w.partition)
                .iter()
                .map(|&mn| {
                    let addr = store.addr(mn, w.offset);
                    (mn, list.read(addr, DataItemHeader::VALIDATION_LEN as u32))
                })
                .collect()
        })
        .collect();
    (list, ids)
}

/// The version word each READ of [`version_reads`] returned (`u64::MAX` if short).
fn observed_versions(ids: &[Vec<(u16, WrId)>], res: &BatchResult) -> Vec<Vec<(u16, u64)>> {
    ids.iter()
        .map(|per| {
            per.iter()
                .map(|&(mn, id)| {
                    let v = res
                        .bytes(id)
                        .get(8..16)
                        .and_then(|s| s.try_into().ok())
                        .map_or(u64::MAX, u64::from_le_bytes);
                    (mn, v)
                })
                .collect()
        })
        .collect()
}

/// A roll-back's WRITEs: the undo image of each logged write to every replica `observed`
/// updated (its version differs from the logged old one), and how many replicas that is.
fn rollback_list(
    store: &Store,
    txn: &LoggedTxn,
    observed: &[Vec<(u16, u64)>],
) -> (PostList, usize) {
    let mut list = PostList::new();
    let mut restored = 0;
    for (w, per) in txn.writes.iter().zip(observed) {
        let Ok(layout) = store.table(TableId(w.table)) else {
            continue;
        };
        // The undo log keeps the old version and value, not its installer: the restored
        // item names no writer, and the history checker attributes reads of it by
        // version number and real time.
        let image = encode_item(
            w.key,
            w.table,
            DataVersion::from_raw(w.old_version),
            logic::undo_flags(w.op),
            &w.old_value,
            layout.item_len,
        );
        for &(mn, v) in per {
            if v != w.old_version {
                list.write(
                    store.addr(mn, w.offset + DataItemHeader::VERSION_OFFSET as u64),
                    &image[DataItemHeader::VERSION_OFFSET..],
                );
                restored += 1;
            }
        }
    }
    (list, restored)
}

/// FORD's recovery of stray locks (Pandora §3.1.1, §6.1 "Baseline"): READ every item of
/// every partition at its primary and release the locks of failed coordinators with a CAS.
/// Without PILL a lock cannot be told stray from live, so the real FORD must stop every
/// transaction while this runs; dmem's lock word names its owner, so the scan is correct
/// while others run, but it is as slow as FORD's (it reads the whole store).
///
/// # Errors
/// [`RecoveryError`] if an MN does not answer.
pub async fn scan_stray_locks<V: Verbs>(
    ctx: &V,
    store: &Store,
    failed: &FailedCoordinatorSet,
) -> Result<usize, RecoveryError> {
    let mut released = 0;
    for spec in &store.config().tables {
        let layout = *store.table(spec.id)?;
        for partition in 0..store.config().mns {
            let p = store.primary(partition)?;
            // Every record of the partition, in READs of seven (a bucket's worth): the
            // records follow the buckets in one run, in the slots' layout and a pool's alike.
            let (first, records) = store.record_area(spec.id, partition)?;
            for chunk in (0..records).step_by(BUCKET_SLOTS) {
                let n = (records - chunk).min(BUCKET_SLOTS as u64) as usize;
                let offset = first + chunk * layout.item_len as u64;
                let len = (layout.item_len * n) as u32;
                let bytes = ctx.read(store.addr(p, offset), len).await?;
                let mut list = PostList::new();
                for record in 0..n {
                    let at = record * layout.item_len;
                    let word = bytes
                        .get(at..at + 8)
                        .and_then(|s| s.try_into().ok())
                        .map_or(0, u64::from_le_bytes);
                    if let Ok(Some(op)) = PillLockWord::from_raw(word).recycle_cas(failed) {
                        list.cas(store.addr(p, offset + at as u64), op.compare, op.swap);
                        released += 1;
                    }
                }
                if !list.is_empty() {
                    ctx.post(list).await?;
                }
            }
        }
    }
    Ok(released)
}

/// Cuts a failed CN off every MN (Pandora §3.2.2 step 2, active-link termination), so a
/// falsely suspected CN cannot corrupt memory while it is recovered (Cor1). The paper sends
/// a link-termination RPC to the MN's management core; the simulator revokes directly.
pub trait LinkTerminator {
    /// Revokes `cn`'s access at `mn`; resolves once no later access from `cn` can land.
    fn terminate(&self, mn: NodeId, cn: NodeId) -> impl Future<Output = Result<(), VerbsError>>;
}

/// A CN as the failure detector knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The CN.
    pub cn: NodeId,
    /// The coordinator ids it runs.
    pub coordinators: Vec<u16>,
    /// Where it receives stray-lock notifications.
    pub listener: Endpoint,
}

/// The heartbeat failure detector (Pandora §3.2.2 step 1): `dmem-txn`'s
/// [`HeartbeatDetector`] over the members, which suspects a CN when no heartbeat arrived
/// for `timeout`.
#[derive(Debug, Clone)]
pub struct FailureDetector {
    heartbeats: HeartbeatDetector,
    members: Vec<Member>,
}

impl FailureDetector {
    /// Watches `members`, counting every one as heard from at `now`.
    #[must_use]
    pub fn new(timeout: Nanos, members: Vec<Member>, now: Nanos) -> Self {
        Self {
            heartbeats: HeartbeatDetector::watching(timeout, members.iter().map(|m| m.cn), now),
            members,
        }
    }

    /// Watches `members` except `me`, the CN the detector runs on: it is alive by
    /// construction, but a loaded host can starve its own heartbeat task past the timeout,
    /// and a detector that suspected its own CN would cut its own links. `me` stays a
    /// member (it is notified like the others).
    #[must_use]
    pub fn on_cn(me: NodeId, timeout: Nanos, members: Vec<Member>, now: Nanos) -> Self {
        Self {
            heartbeats: HeartbeatDetector::watching(
                timeout,
                members.iter().map(|m| m.cn).filter(|&cn| cn != me),
                now,
            ),
            members,
        }
    }

    /// `member` (a restarted CN's new incarnation: new coordinator ids, a new listener)
    /// joins at `now`, replacing the CN's former entry.
    pub fn join(&mut self, member: Member, now: Nanos) {
        self.heartbeats.rejoin(member.cn, now);
        self.members.retain(|m| m.cn != member.cn);
        self.members.push(member);
    }

    /// A heartbeat from `cn` arrived at `now`.
    pub fn heartbeat(&mut self, cn: NodeId, now: Nanos) {
        self.heartbeats.heartbeat(cn, now);
    }

    /// The members newly suspected at `now` (each reported once).
    pub fn suspects(&mut self, now: Nanos) -> Vec<Member> {
        let new = self.heartbeats.suspects(now);
        self.members
            .iter()
            .filter(|m| new.contains(&m.cn))
            .cloned()
            .collect()
    }

    /// Members not suspected.
    #[must_use]
    pub fn live(&self) -> Vec<Member> {
        self.members
            .iter()
            .filter(|m| !self.heartbeats.is_suspected(m.cn))
            .cloned()
            .collect()
    }
}

/// One recovered CN failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryEvent {
    /// The failed CN.
    pub cn: NodeId,
    /// When the detector suspected it.
    pub detected_at: Nanos,
    /// When its links were terminated at every MN.
    pub terminated_at: Nanos,
    /// When log recovery (and truncation) of all its coordinators finished: every
    /// Logged-Stray-Tx is decided. FORD's stray-lock scan runs after this.
    pub logs_recovered_at: Nanos,
    /// When the stray-lock notification went out.
    pub notified_at: Nanos,
    /// Log recovery of each of its coordinators.
    pub coordinators: Vec<CoordinatorRecovery>,
    /// Stray locks the FORD scan released (0 under Pandora).
    pub scanned_locks: usize,
}

/// One MN failure handled by the detector (Pandora §3.2.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MnFailureEvent {
    /// The failed MN (index).
    pub mn: u16,
    /// The view epoch its notification carried.
    pub epoch: u64,
    /// When the detector confirmed it (its probe got `ConnectionLost`).
    pub detected_at: Nanos,
    /// When every live CN had been sent the notification.
    pub notified_at: Nanos,
    /// When every live CN had acknowledged (its in-flight transactions decided) and the
    /// resume went out; `None` while waiting.
    pub resumed_at: Option<Nanos>,
}

/// The failure detector and recovery coordinator (Pandora §3.2.2, Fig. 3) on one context;
/// with [`watch_mns`](Self::watch_mns) also the MN-failure detector and notifier of §3.2.5
/// (see [`crate::mnfail`]).
#[derive(Debug)]
pub struct RecoveryManager<V, T> {
    ctx: V,
    store: Rc<Store>,
    protocol: Protocol,
    terminator: T,
    detector: FailureDetector,
    failed: FailedCoordinatorSet,
    events: Rc<RefCell<Vec<RecoveryEvent>>>,
    mn_probe: Option<Nanos>,
    next_probe: Nanos,
    mn_epoch: u64,
    mn_suspected: bool,
    awaiting: Option<(u64, Vec<NodeId>)>,
    /// When the current view change was first sent, and when it was last re-sent.
    awaiting_since: (Nanos, Nanos),
    /// CNs that acknowledged an epoch already resumed (their resume was lost): each is
    /// sent the resume again.
    resume_again: Vec<NodeId>,
    /// The last epoch resumed.
    resumed_epoch: u64,
    /// Re-send period and answer timeout of control messages
    /// ([`Self::resend_control`]); `None`: sent once.
    resend: Option<(Nanos, Nanos)>,
    mn_events: Rc<RefCell<Vec<MnFailureEvent>>>,
}

impl<V: Verbs + Clock, T: LinkTerminator> RecoveryManager<V, T> {
    /// A manager watching `members` with heartbeat timeout `timeout`.
    pub fn new(
        ctx: V,
        store: Rc<Store>,
        protocol: Protocol,
        terminator: T,
        members: Vec<Member>,
        timeout: Nanos,
    ) -> Self {
        let now = ctx.now();
        let me = ctx.local_endpoint().node;
        Self {
            ctx,
            store,
            protocol,
            terminator,
            detector: FailureDetector::on_cn(me, timeout, members, now),
            failed: FailedCoordinatorSet::EMPTY,
            events: Rc::new(RefCell::new(Vec::new())),
            mn_probe: None,
            next_probe: now,
            mn_epoch: 0,
            mn_suspected: false,
            awaiting: None,
            awaiting_since: (now, now),
            resume_again: Vec::new(),
            resumed_epoch: 0,
            resend: None,
            mn_events: Rc::new(RefCell::new(Vec::new())),
        }
    }

    /// Re-sends control messages that want an answer, for fabrics that may lose them or
    /// peers that may be slow: an MN-failure notification goes again every `period` to each
    /// live CN that has not acknowledged it, and a CN that acknowledges an epoch already
    /// resumed (its resume was lost) is sent the resume again. A live CN that has not
    /// acknowledged after `timeout` fails [`maybe_resume`](Self::maybe_resume) with
    /// [`RecoveryError::NoAnswer`]. CNs should run their listener with the same period
    /// ([`cn_listener_resending`](crate::mnfail::cn_listener_resending)). Off by default (the
    /// simulator loses no message unless told to).
    #[must_use]
    pub fn resend_control(mut self, period: Nanos, timeout: Nanos) -> Self {
        self.resend = Some((period.max(1), timeout));
        self
    }

    /// Sends `payload` to a CN's listener; a CN that cannot be reached any more is left to
    /// the heartbeat detector (its recovery removes it from the live members), so its
    /// `ConnectionLost` is not an error of the sender's step.
    async fn notify(&self, to: Endpoint, payload: &[u8]) -> Result<(), RecoveryError> {
        match self.ctx.send(to, payload).await {
            Err(VerbsError::ConnectionLost { node }) if node == to.node => Ok(()),
            r => Ok(r?),
        }
    }

    /// Turns on MN-failure handling (Pandora §3.2.5): [`run`](Self::run) probes every live
    /// MN with an 8-byte READ every `probe_period` (and at once when a CN reports one),
    /// notifies every live CN of a failure, waits for their acknowledgements and resumes
    /// them. `store` should be the detector's own [`fork`](Store::fork_view): its view is
    /// the authoritative one. CNs must run [`cn_listener`](crate::mnfail::cn_listener).
    #[must_use]
    pub fn watch_mns(mut self, probe_period: Nanos) -> Self {
        self.mn_probe = Some(probe_period.max(1));
        self
    }

    /// The MN failures handled so far (shared, like [`events`](Self::events)).
    #[must_use]
    pub fn mn_events(&self) -> Rc<RefCell<Vec<MnFailureEvent>>> {
        Rc::clone(&self.mn_events)
    }

    /// The recovered failures so far (shared, so a test can watch it while `run` runs).
    #[must_use]
    pub fn events(&self) -> Rc<RefCell<Vec<RecoveryEvent>>> {
        Rc::clone(&self.events)
    }

    /// Receives heartbeats and recovers suspected CNs until `until`, polling every `poll`.
    ///
    /// # Errors
    /// [`RecoveryError`] if a recovery step failed (the manager can be run again).
    pub async fn run(&mut self, until: Nanos, poll: Nanos) -> Result<(), RecoveryError> {
        while self.ctx.now() < until {
            let suspects = self.detect()?;
            self.check_mns().await?;
            for member in suspects {
                self.recover_member(member).await?;
            }
            self.maybe_resume().await?;
            self.ctx.sleep(poll).await;
        }
        Ok(())
    }

    /// One MN-watching step (a no-op unless [`watch_mns`](Self::watch_mns)): probes the
    /// live MNs when the probe period elapsed or a CN reported one, and handles every MN
    /// found dead.
    ///
    /// # Errors
    /// [`RecoveryError`] if a notification cannot be sent.
    pub async fn check_mns(&mut self) -> Result<(), RecoveryError> {
        let Some(period) = self.mn_probe else {
            return Ok(());
        };
        let now = self.ctx.now();
        if !self.mn_suspected && now < self.next_probe {
            return Ok(());
        }
        self.mn_suspected = false;
        self.next_probe = now + period;
        while let Some(mn) = self.probe_mns().await {
            self.fail_mn(mn).await?;
        }
        Ok(())
    }

    /// READs 8 bytes of every live MN in one batch; an MN whose READ fails with
    /// `ConnectionLost` is dead (the first one the batch reports).
    async fn probe_mns(&self) -> Option<u16> {
        let view = self.store.view().borrow().clone();
        let mut list = PostList::new();
        for mn in (0..self.store.config().mns).filter(|&m| view.is_alive(m)) {
            list.read(self.store.addr(mn, 0), 8);
        }
        if list.is_empty() {
            return None;
        }
        match self.ctx.post(list).await {
            Err(VerbsError::ConnectionLost { node }) => self.store.mn_index(node),
            _ => None,
        }
    }

    /// Handles a failed MN (§3.2.5 steps 1–2): drops it from the detector's view and sends
    /// the new failed-MN bitmask with a new epoch to every live CN; the resume waits for
    /// their acknowledgements.
    async fn fail_mn(&mut self, mn: u16) -> Result<(), RecoveryError> {
        let detected_at = self.ctx.now();
        if !self.store.view().borrow().is_alive(mn) {
            return Ok(());
        }
        self.store.view().borrow_mut().mark_failed(mn);
        self.mn_epoch += 1;
        let mask = self.store.view().borrow().failed_mask();
        let payload = ControlMsg::MnFailed {
            epoch: self.mn_epoch,
            mask,
        }
        .emit();
        for live in self.detector.live() {
            self.notify(live.listener, &payload).await?;
        }
        self.awaiting = Some((self.mn_epoch, Vec::new()));
        self.awaiting_since = (detected_at, self.ctx.now());
        self.mn_events.borrow_mut().push(MnFailureEvent {
            mn,
            epoch: self.mn_epoch,
            detected_at,
            notified_at: self.ctx.now(),
            resumed_at: None,
        });
        Ok(())
    }

    /// Resumes every live CN once each has acknowledged the latest MN view (§3.2.5 step 3);
    /// the step [`run`](Self::run) takes each poll after recovering, for a caller that runs
    /// its own loop (as [`detect`](Self::detect) and [`check_mns`](Self::check_mns)).
    ///
    /// # Errors
    /// [`RecoveryError`] if a resume message cannot be sent.
    pub async fn maybe_resume(&mut self) -> Result<(), RecoveryError> {
        for cn in std::mem::take(&mut self.resume_again) {
            if let Some(m) = self.detector.live().into_iter().find(|m| m.cn == cn) {
                let payload = ControlMsg::MnResume {
                    epoch: self.resumed_epoch,
                }
                .emit();
                self.notify(m.listener, &payload).await?;
            }
        }
        let Some((epoch, acked)) = &self.awaiting else {
            return Ok(());
        };
        let epoch = *epoch;
        let live = self.detector.live();
        let silent: Vec<Member> = live
            .iter()
            .filter(|m| !acked.contains(&m.cn))
            .cloned()
            .collect();
        if let Some(first) = silent.first() {
            let Some((period, timeout)) = self.resend else {
                return Ok(());
            };
            let now = self.ctx.now();
            let (since, last_sent) = self.awaiting_since;
            if now.saturating_sub(since) > timeout {
                return Err(RecoveryError::NoAnswer {
                    cn: first.cn.0,
                    epoch,
                    waited: now.saturating_sub(since),
                    resend: period,
                });
            }
            if now.saturating_sub(last_sent) >= period {
                let mask = self.store.view().borrow().failed_mask();
                let payload = ControlMsg::MnFailed { epoch, mask }.emit();
                for m in &silent {
                    self.notify(m.listener, &payload).await?;
                }
                self.awaiting_since.1 = now;
            }
            return Ok(());
        }
        let payload = ControlMsg::MnResume { epoch }.emit();
        for m in &live {
            self.notify(m.listener, &payload).await?;
        }
        self.awaiting = None;
        self.resumed_epoch = epoch;
        let now = self.ctx.now();
        for ev in self.mn_events.borrow_mut().iter_mut() {
            if ev.resumed_at.is_none() && ev.epoch <= epoch {
                ev.resumed_at = Some(now);
            }
        }
        Ok(())
    }

    /// [`recover`](Self::recover), re-run after handling an MN that failed under it (CN
    /// and MN failures together: "we execute both protocols independently", §3.2.5).
    ///
    /// # Errors
    /// [`RecoveryError`]; every step may be re-run.
    pub async fn recover_member(&mut self, member: Member) -> Result<(), RecoveryError> {
        let mut attempts = usize::from(self.store.config().mns) + 1;
        loop {
            match self.recover(member.clone()).await {
                Err(RecoveryError::Verbs(VerbsError::ConnectionLost { node }))
                    if self.mn_probe.is_some() && attempts > 0 =>
                {
                    let Some(mn) = self.store.mn_index(node) else {
                        return Err(VerbsError::ConnectionLost { node }.into());
                    };
                    self.fail_mn(mn).await?;
                    attempts -= 1;
                }
                r => return r,
            }
        }
    }

    /// One detector step (what [`run`](Self::run) does each poll before recovering):
    /// receives the pending heartbeats and returns the members newly suspected now, so a
    /// caller can act between detection and [`recover`](Self::recover) (e.g. stop the
    /// world for FORD's scan).
    ///
    /// # Errors
    /// [`RecoveryError`] if receiving fails.
    pub fn detect(&mut self) -> Result<Vec<Member>, RecoveryError> {
        while let Some(msg) = self.ctx.try_recv()? {
            match ControlMsg::parse(&msg.payload) {
                Ok(ControlMsg::Heartbeat) => {
                    self.detector.heartbeat(msg.from.node, self.ctx.now());
                }
                Ok(ControlMsg::MnSuspect { .. }) => self.mn_suspected = true,
                Ok(ControlMsg::MnAck { epoch: e }) => match self.awaiting.as_mut() {
                    Some((epoch, acked)) if e == *epoch && !acked.contains(&msg.from.node) => {
                        acked.push(msg.from.node);
                    }
                    // An acknowledgement of an epoch already resumed: that CN's resume
                    // was lost (it re-sends while paused).
                    _ if self.resend.is_some()
                        && e <= self.resumed_epoch
                        && !self.resume_again.contains(&msg.from.node) =>
                    {
                        self.resume_again.push(msg.from.node);
                    }
                    _ => {}
                },
                // Anything else (or garbage) is not for the detector.
                _ => {}
            }
        }
        Ok(self.detector.suspects(self.ctx.now()))
    }

    /// A restarted CN's new incarnation joins (Pandora §6.3 "the failed coordinators are
    /// brought back"): its coordinators have new ids (§3.1.2: the FD hands out a fresh
    /// coordinator-id to every coordinator it spawns, so the old ids stay in the failed-ids
    /// and their stray locks stay stealable), and it is watched and notified from now on.
    ///
    /// The new incarnation is sent every failed id at once (the failed-ids of its initial
    /// configuration, re-sent here so that a failure recovered between its start and its
    /// joining is not missed).
    ///
    /// # Errors
    /// [`RecoveryError`] if sending fails.
    pub async fn join(&mut self, member: Member) -> Result<(), RecoveryError> {
        let failed: Vec<u16> = self.failed.iter().map(|c| c.0).collect();
        let listener = member.listener;
        self.detector.join(member, self.ctx.now());
        if !failed.is_empty() {
            let payload = ControlMsg::FailedCoordinators(failed).emit();
            self.notify(listener, &payload).await?;
        }
        Ok(())
    }

    /// The coordinators known to have failed (the failed-ids the FD hands a new coordinator
    /// with its configuration, §3.1.2 "Failed-ids").
    #[must_use]
    pub fn failed(&self) -> &FailedCoordinatorSet {
        &self.failed
    }

    /// Recovers one failed CN: terminate, recover logs, truncate, (FORD) scan, notify.
    ///
    /// # Errors
    /// [`RecoveryError`]; every step may be re-run.
    pub async fn recover(&mut self, member: Member) -> Result<(), RecoveryError> {
        let detected_at = self.ctx.now();
        // (2) Active-link termination at every MN before touching its state (Cor1).
        // (An MN the view dropped has no links to terminate; the simulator's terminator is
        // instantaneous, a process's would wait for the dead MN's answer.)
        for mn in 0..self.store.config().mns {
            if !self.store.view().borrow().is_alive(mn) {
                continue;
            }
            self.terminator
                .terminate(self.store.mn_node(mn), member.cn)
                .await?;
        }
        let terminated_at = self.ctx.now();
        // (3) Log recovery, with truncation (§3.2.3).
        let mut coordinators = Vec::new();
        for &c in &member.coordinators {
            coordinators.push(recover_coordinator(&self.ctx, &self.store, self.protocol, c).await?);
        }
        let logs_recovered_at = self.ctx.now();
        for &c in &member.coordinators {
            self.failed.insert(PillId(c));
        }
        let scanned_locks = if self.protocol == Protocol::Ford {
            scan_stray_locks(&self.ctx, &self.store, &self.failed).await?
        } else {
            0
        };
        // (4) Stray-lock notification, strictly after log recovery (Cor4).
        let payload = ControlMsg::FailedCoordinators(member.coordinators.clone()).emit();
        for live in self.detector.live() {
            self.notify(live.listener, &payload).await?;
        }
        self.events.borrow_mut().push(RecoveryEvent {
            cn: member.cn,
            detected_at,
            terminated_at,
            logs_recovered_at,
            notified_at: self.ctx.now(),
            coordinators,
            scanned_locks,
        });
        Ok(())
    }
}

/// Sends a heartbeat to the failure detector every `period` until `until`.
///
/// # Errors
/// [`VerbsError`] if sending fails.
pub async fn heartbeat_loop<V: Verbs + Clock>(
    ctx: &V,
    detector: Endpoint,
    period: Nanos,
    until: Nanos,
) -> Result<(), VerbsError> {
    let heartbeat = ControlMsg::Heartbeat.emit();
    while ctx.now() < until {
        ctx.send(detector, &heartbeat).await?;
        ctx.sleep(period).await;
    }
    Ok(())
}

/// Receives stray-lock notifications for a CN and adds the failed ids to its set, polling
/// every `poll` until `until`.
///
/// # Errors
/// [`VerbsError`] if receiving fails.
pub async fn membership_listener<V: Verbs + Clock>(
    ctx: &V,
    failed: Rc<RefCell<FailedCoordinatorSet>>,
    poll: Nanos,
    until: Nanos,
) -> Result<(), VerbsError> {
    while ctx.now() < until {
        while let Some(msg) = ctx.try_recv()? {
            apply_notification(&msg.payload, &mut failed.borrow_mut());
        }
        ctx.sleep(poll).await;
    }
    Ok(())
}

/// Applies one stray-lock notification payload to a failed-id set; returns how many ids
/// it added. Other messages (and payloads that are not control messages) are ignored.
pub fn apply_notification(payload: &[u8], failed: &mut FailedCoordinatorSet) -> usize {
    ControlMsg::parse(payload).map_or(0, |m| m.apply_failed_ids(failed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmem_verbs::Port;

    fn member(cn: u16, ids: &[u16]) -> Member {
        Member {
            cn: NodeId(cn),
            coordinators: ids.to_vec(),
            listener: Endpoint {
                node: NodeId(cn),
                port: Port(0),
            },
        }
    }

    fn store() -> Store {
        use crate::store::{StoreConfig, TableSpec};
        use dmem_verbs::{MemoryRegion, RKey};
        let regions = (0..3)
            .map(|i| MemoryRegion {
                node: NodeId(i),
                rkey: RKey(1),
                len: 1 << 22,
            })
            .collect();
        let cfg = StoreConfig::new(3)
            .table(TableSpec::sized_for(TableId(1), 8, 100, 3))
            .coordinators(4);
        Store::new(cfg, regions).unwrap()
    }

    #[test]
    fn roll_back_restores_exactly_the_updated_replicas() {
        use dmem_layout::log::LogOp;
        use dmem_verbs::Op;
        let s = store();
        let w = |key, offset| logic::LoggedWrite {
            op: LogOp::Update,
            table: 1,
            key,
            partition: 0,
            offset,
            old_version: 4,
            old_value: vec![1; 8],
        };
        let txn = LoggedTxn {
            coordinator: 2,
            txn: 9,
            writes: vec![w(1, 4096), w(2, 8192)],
        };
        // Write 1 reached MNs 0 and 2, write 2 none: a roll-back.
        let observed = vec![vec![(0, 5), (1, 4), (2, 5)], vec![(0, 4), (1, 4), (2, 4)]];
        let versions: Vec<Vec<u64>> = observed
            .iter()
            .map(|per| per.iter().map(|&(_, v)| v).collect())
            .collect();
        assert_eq!(logic::decide(&txn, &versions), Decision::RollBack);
        let (list, restored) = rollback_list(&s, &txn, &observed);
        assert_eq!(restored, 2);
        let targets: Vec<(u16, u64)> = list
            .finish()
            .unwrap()
            .iter()
            .map(|wr| match &wr.op {
                Op::Write { addr, .. } => (addr.node.0, addr.offset),
                op => panic!("not a WRITE: {op:?}"),
            })
            .collect();
        let at = |mn: u16| {
            let a = s.addr(mn, 4096 + DataItemHeader::VERSION_OFFSET as u64);
            (a.node.0, a.offset)
        };
        assert_eq!(targets, [at(0), at(2)]);
    }

    #[test]
    fn logged_locks_are_deduplicated_and_truncated_with_the_log() {
        let s = store();
        let base = s.log_offset(2).unwrap();
        let at = wire::lock_log_offset(s.log_region_bytes()).unwrap();
        let locks = [logic::pack_location(1, 64), logic::pack_location(0, 128)];
        let mut region = vec![0u8; s.log_region_bytes()];
        let image = wire::LockLog {
            coordinator: 2,
            addrs: locks.to_vec(),
        }
        .emit();
        region[at..at + image.len()].copy_from_slice(&image);
        let raw = vec![region.clone(), region];
        let found = logged_locks(&raw, Some(at), 2);
        assert_eq!(found.len(), 2, "two copies, two distinct locks");
        assert!(found[0].to_raw() < found[1].to_raw(), "sorted");
        assert!(
            logged_locks(&raw, Some(at), 3).is_empty(),
            "another coordinator's"
        );
        assert!(logged_locks(&raw, None, 2).is_empty(), "no lock log");
        assert_eq!(truncate_list(&s, base, &[0, 1], None).len(), 2);
        assert_eq!(truncate_list(&s, base, &[0, 1], Some(at)).len(), 4);
        let (list, cas) = release_list(&s, 2, &found).unwrap();
        assert_eq!((list.len(), cas.len()), (2, 2));
    }

    #[test]
    fn detector_suspects_once_after_timeout() {
        let mut fd = FailureDetector::new(1000, vec![member(3, &[1]), member(4, &[2])], 0);
        fd.heartbeat(NodeId(3), 900);
        assert!(fd.suspects(1000).is_empty());
        let s = fd.suspects(1500);
        assert_eq!(s, vec![member(4, &[2])]);
        assert!(fd.suspects(1600).is_empty(), "reported once");
        assert_eq!(fd.live(), vec![member(3, &[1])]);
        assert_eq!(fd.suspects(2000), vec![member(3, &[1])]);
    }

    #[test]
    fn detector_never_suspects_its_own_cn() {
        let members = vec![member(3, &[1]), member(4, &[2])];
        let mut fd = FailureDetector::on_cn(NodeId(3), 1000, members.clone(), 0);
        // Nobody heartbeats: only the other CN is suspected; both stay members.
        assert_eq!(fd.suspects(5000), vec![member(4, &[2])]);
        assert!(fd.suspects(9000).is_empty());
        assert_eq!(fd.live(), vec![member(3, &[1])]);
        let mut all = FailureDetector::new(1000, members, 0);
        assert_eq!(all.suspects(5000).len(), 2, "new() watches every member");
    }

    #[test]
    fn notification_round_trip() {
        let mut set = FailedCoordinatorSet::EMPTY;
        let payload = ControlMsg::FailedCoordinators(vec![7, 300]).emit();
        assert_eq!(apply_notification(&payload, &mut set), 2);
        assert!(set.contains(PillId(7)) && set.contains(PillId(300)));
        assert_eq!(apply_notification(&payload, &mut set), 0, "idempotent");
        assert_eq!(
            apply_notification(&ControlMsg::Heartbeat.emit(), &mut set),
            0
        );
        assert_eq!(
            apply_notification(b"F\x07\x00", &mut set),
            0,
            "old tag format"
        );
    }
}
