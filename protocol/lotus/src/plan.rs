//! LOTUS's decisions, sans I/O: which locks a round asks for and of which CN (§4.1, §4.3),
//! what a lock reply means (§4.1, §6), what a read does after its CVT (§5.1 steps 2–3,
//! §5.2), which index slot an insert claims (§4.1), and what a commit writes where
//! (§5.1 commit, §6's log). Plain synchronous functions and state machines over values:
//! no verbs, no clock, no executor, so a test feeds replies and asserts each decision.
//! The async shell ([`crate::txn`]) builds a plan, posts it, feeds the results back and
//! acts on the decision.

use dmem_layout::cvt::{CvtCell, INVISIBLE};
use dmem_locks::LockMode;
use dmem_locks::lotus::Acquired;
use dmem_motor::Isolation;
use dmem_motor::exec::{self, WriteEntry};
use dmem_motor::logic::{self, CommitPlan, MetaOutcome};
use dmem_motor::mvcc::{BlockShape, Meta, Shapes};
use dmem_store::{ItemLoc, Store};
use dmem_txn::{
    AbortReason, Access, Key, TableId, TxnError, TxnKind, Version, WriteEvent, WriteKind,
};
use dmem_verbs::{PostList, RemoteAddr};

use crate::locking::{LockFor, stronger};
use crate::recovery::LogEntry;
use crate::shard::{ShardMap, Sharding, record_lock_key};
use crate::wire::{LockEntry, Status};

// ---------------------------------------------------------------------------------------
// Locks (§4.1 lock RPCs, §4.3 routing, §5.1 step 1, §5.2)
// ---------------------------------------------------------------------------------------

/// A lock a transaction asks for: its key, its shard, its mode and what it is for (which a
/// refusal is counted under, [`LockFor`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockWant {
    /// The lock key (a record's or an index bucket's, [`crate::shard`]).
    pub key: u64,
    /// Its shard.
    pub shard: u16,
    /// Shared or exclusive.
    pub mode: LockMode,
    /// What it is for.
    pub what: LockFor,
}

/// A lock a transaction holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldLock {
    /// The lock key.
    pub key: u64,
    /// Its shard.
    pub shard: u16,
    /// The CN whose table holds it.
    pub owner: u16,
    /// Shared or exclusive.
    pub mode: LockMode,
    /// The record's lock word, once an idealised RDMA lock FAA'd it (0 → 1).
    pub word: Option<RemoteAddr>,
    /// The shard's generation when the lock was asked for: a hand-over that aborts the
    /// shard's holders bumps it (§4.3), and the lock is no longer valid.
    pub generation: u32,
}

/// The lock a record needs in a transaction of `kind` under `isolation`, if any (§5.1
/// step 1, §5.2: SI reads take none, read-only transactions none at all).
#[must_use]
pub fn lock_mode(kind: TxnKind, access: Access, isolation: Isolation) -> Option<LockMode> {
    match (kind, access, isolation) {
        (TxnKind::ReadOnly, _, _) => None,
        (_, Access::ForUpdate, _) => Some(LockMode::Exclusive),
        (_, Access::Read, Isolation::Serializable) => Some(LockMode::Shared),
        (_, Access::Read, Isolation::Snapshot) => None,
    }
}

/// Whether `held` covers a lock of `key` in `mode` (an exclusive lock covers a shared one).
#[must_use]
pub fn holds(held: &[HeldLock], key: u64, mode: LockMode) -> bool {
    held.iter()
        .any(|h| h.key == key && (h.mode == LockMode::Exclusive || mode == LockMode::Shared))
}

/// Whether `key` is held on CN `cn`'s table (a local lock: its CVT may be cached, §4.4).
#[must_use]
pub fn held_on(held: &[HeldLock], key: u64, cn: u16) -> bool {
    held.iter().any(|h| h.key == key && h.owner == cn)
}

/// Whether every lock of `held` is still valid under `map`: no hand-over aborted its
/// shard's holders since it was asked for (§4.3).
#[must_use]
pub fn locks_valid(held: &[HeldLock], map: &ShardMap) -> bool {
    held.iter().all(|h| map.generation(h.shard) == h.generation)
}

/// The locks of `wanted` still to take: those `held` does not cover, one per key in the
/// stronger of the modes asked, in the order first asked.
#[must_use]
pub fn locks_to_take(wanted: &[LockWant], held: &[HeldLock]) -> Vec<LockWant> {
    let mut todo: Vec<LockWant> = Vec::new();
    for &w in wanted {
        if holds(held, w.key, w.mode) {
            continue;
        }
        match todo.iter_mut().find(|t| t.key == w.key) {
            Some(t) => t.mode = stronger(t.mode, w.mode),
            None => todo.push(w),
        }
    }
    todo
}

/// The locks a round's `fetches` need (record locks, §5.1 step 1), marking those fetches
/// locked.
pub fn round_locks(
    fetches: &mut [Fetch],
    kind: TxnKind,
    isolation: Isolation,
    sharding: &Sharding,
) -> Vec<LockWant> {
    let mut wanted = Vec::new();
    for f in fetches {
        if let Some(mode) = lock_mode(kind, f.access, isolation) {
            wanted.push(LockWant {
                key: record_lock_key(f.table, f.key),
                shard: sharding.shard_of(f.table, f.key),
                mode,
                what: LockFor::Table(f.table.0),
            });
            f.locked = true;
        }
    }
    wanted
}

/// Where a lock taken on this CN's table went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalStep {
    /// Held (granted, or held already).
    Held(HeldLock),
    /// Refused: count it under this kind; the attempt fails and takes no more local locks.
    Refused(LockFor),
}

/// What a lock reply (§4.1) means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyStep {
    /// A reply to no request of this attempt (a late one of an earlier request): ignore.
    Stale,
    /// Every lock of the request is held.
    Granted(Vec<HeldLock>),
    /// Refused (all or nothing): count it under this kind; the attempt fails.
    Refused(LockFor),
    /// The CN no longer owns the shards: ask again under the new map (§4.3).
    NotOwner,
}

/// How a lock attempt ended once every reply came (or the wait ended).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptEnd {
    /// Some CN did not answer in time: its locks may be held there, so the transaction
    /// holds these (unlocks are idempotent) and aborts.
    TimedOut(Vec<HeldLock>),
    /// A lock was refused: abort.
    Refused,
    /// Done, but for these locks, whose shards moved: ask again (none: all held).
    Reroute(Vec<LockWant>),
}

/// One attempt at taking locks under the shard map of its start (§4.1, §4.3): the locks
/// grouped per owning CN (one message each), then fed the local outcomes and the replies.
#[derive(Debug, Clone)]
pub struct LockAttempt {
    todo: Vec<LockWant>,
    groups: Vec<(u16, Vec<LockEntry>)>,
    /// The shard generation of each lock key when grouped.
    gens: Vec<(u64, u32)>,
    /// Requests sent and not answered: request number, owner, entries.
    pending: Vec<(u64, u16, Vec<LockEntry>)>,
    rerouted: Vec<LockWant>,
    refused: bool,
}

impl LockAttempt {
    /// Groups `todo` by owner under `map`, in order of first appearance.
    #[must_use]
    pub fn new(todo: Vec<LockWant>, map: &ShardMap) -> Self {
        let mut groups: Vec<(u16, Vec<LockEntry>)> = Vec::new();
        let mut gens = Vec::new();
        for w in &todo {
            let owner = map.owner(w.shard);
            gens.push((w.key, map.generation(w.shard)));
            let e = LockEntry {
                key: w.key,
                shard: w.shard,
                mode: w.mode,
            };
            match groups.iter_mut().find(|g| g.0 == owner) {
                Some(g) => g.1.push(e),
                None => groups.push((owner, vec![e])),
            }
        }
        Self {
            todo,
            groups,
            gens,
            pending: Vec::new(),
            rerouted: Vec::new(),
            refused: false,
        }
    }

    /// The CNs asked, in order.
    pub fn owners(&self) -> impl Iterator<Item = u16> + '_ {
        self.groups.iter().map(|g| g.0)
    }

    /// The requests for other CNs than `me`, in order (one message each).
    #[must_use]
    pub fn remote(&self, me: u16) -> Vec<(u16, Vec<LockEntry>)> {
        self.groups.iter().filter(|g| g.0 != me).cloned().collect()
    }

    /// The locks on `me`'s own table.
    #[must_use]
    pub fn local(&self, me: u16) -> Vec<LockEntry> {
        self.groups
            .iter()
            .find(|g| g.0 == me)
            .map(|g| g.1.clone())
            .unwrap_or_default()
    }

    /// Request `req` with `entries` went to `owner`.
    pub fn sent(&mut self, req: u64, owner: u16, entries: Vec<LockEntry>) {
        self.pending.push((req, owner, entries));
    }

    /// What `key` is for.
    fn what_of(&self, key: u64) -> LockFor {
        self.todo
            .iter()
            .find(|t| t.key == key)
            .map_or(LockFor::Mixed, |t| t.what)
    }

    fn generation_of(&self, key: u64) -> u32 {
        self.gens.iter().find(|g| g.0 == key).map_or(0, |g| g.1)
    }

    fn held(&self, e: &LockEntry, owner: u16) -> HeldLock {
        HeldLock {
            key: e.key,
            shard: e.shard,
            owner,
            mode: e.mode,
            word: None,
            generation: self.generation_of(e.key),
        }
    }

    fn reroute(&mut self, e: &LockEntry) {
        let w = LockWant {
            key: e.key,
            shard: e.shard,
            mode: e.mode,
            what: self.what_of(e.key),
        };
        self.rerouted.push(w);
    }

    /// A local lock whose shard this CN no longer serves (moved since the map was read):
    /// ask again.
    pub fn not_served_here(&mut self, e: &LockEntry) {
        self.reroute(e);
    }

    /// The table of `me` answered `got` to `e`.
    pub fn acquired_here(&mut self, e: &LockEntry, me: u16, got: Acquired) -> LocalStep {
        match got {
            Acquired::Granted | Acquired::AlreadyHeld => LocalStep::Held(self.held(e, me)),
            Acquired::Refused(_) => {
                self.refused = true;
                LocalStep::Refused(self.what_of(e.key))
            }
        }
    }

    /// Whether a reply is still awaited.
    #[must_use]
    pub fn waiting(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The reply `status` to request `req`.
    pub fn on_reply(&mut self, req: u64, status: Status) -> ReplyStep {
        let Some(i) = self.pending.iter().position(|p| p.0 == req) else {
            return ReplyStep::Stale;
        };
        let (_, owner, entries) = self.pending.swap_remove(i);
        match status {
            Status::Granted => {
                ReplyStep::Granted(entries.iter().map(|e| self.held(e, owner)).collect())
            }
            Status::Refused => {
                self.refused = true;
                // The reply does not say which lock was refused: one kind of lock is
                // counted under it, several as mixed.
                let mut kinds = entries.iter().map(|e| self.what_of(e.key));
                let first = kinds.next().unwrap_or(LockFor::Mixed);
                let what = if kinds.all(|k| k == first) {
                    first
                } else {
                    LockFor::Mixed
                };
                ReplyStep::Refused(what)
            }
            Status::NotOwner => {
                for e in &entries {
                    self.reroute(e);
                }
                ReplyStep::NotOwner
            }
        }
    }

    /// The end of the attempt, once no more replies are awaited or the wait ended.
    #[must_use]
    pub fn finish(self) -> AttemptEnd {
        if !self.pending.is_empty() {
            let held = self
                .pending
                .iter()
                .flat_map(|(_, owner, entries)| entries.iter().map(|e| self.held(e, *owner)))
                .collect();
            return AttemptEnd::TimedOut(held);
        }
        if self.refused {
            return AttemptEnd::Refused;
        }
        AttemptEnd::Reroute(self.rerouted)
    }
}

/// The release of `held` (§5.1 step 4): the locks on `me`'s table, in order, and one unlock
/// message's entries per other CN, in order of first appearance.
#[must_use]
pub fn unlock_plan(held: Vec<HeldLock>, me: u16) -> (Vec<HeldLock>, Vec<(u16, Vec<LockEntry>)>) {
    let mut local = Vec::new();
    let mut groups: Vec<(u16, Vec<LockEntry>)> = Vec::new();
    for h in held {
        if h.owner == me {
            local.push(h);
            continue;
        }
        let e = LockEntry {
            key: h.key,
            shard: h.shard,
            mode: h.mode,
        };
        match groups.iter_mut().find(|g| g.0 == h.owner) {
            Some(g) => g.1.push(e),
            None => groups.push((h.owner, vec![e])),
        }
    }
    (local, groups)
}

// ---------------------------------------------------------------------------------------
// Reads (§5.1 steps 2–3, §4.1 inserts, §4.4)
// ---------------------------------------------------------------------------------------

/// One record a round fetches.
#[derive(Debug, Clone)]
pub struct Fetch {
    /// Its table.
    pub table: TableId,
    /// Its key.
    pub key: Key,
    /// Read or for update.
    pub access: Access,
    /// Whether this transaction holds a lock on it (read or write).
    pub locked: bool,
    /// Whether that lock is on this CN's table (its CVT may be cached, §4.4).
    pub local: bool,
    /// Its block, once known.
    pub loc: Option<ItemLoc>,
    /// Its value once read (`Some(None)`: absent).
    pub done: Option<Option<Vec<u8>>>,
}

/// What a read does after its record's CVT `meta` at `start`: a record being committed
/// (INVISIBLE, its commit timestamp may fall below `start`) is read again unless locked;
/// under our lock no writer is between its INVISIBLE and visible WRITEs (recovery decides a
/// failed one's before its locks go), so a locked read picks among committed versions and
/// aborts on a newer one (§5.1 step 3); an unlocked one reads the snapshot.
#[must_use]
pub fn after_meta(meta: &Meta, start: u64, locked: bool) -> MetaOutcome {
    let committing = meta
        .cells
        .iter()
        .any(|c| c.is_valid() && c.commit_version() == INVISIBLE);
    if committing && !locked {
        MetaOutcome::Retry
    } else {
        logic::after_meta(meta, start, locked, false)
    }
}

/// After a pass that left some records unread, the `rereads`-th: read again, or abort once
/// more than `max` were needed.
///
/// # Errors
/// [`AbortReason::VersionStayedUncommittedOrTorn`] past `max`.
pub fn reread(rereads: u32, max: u32) -> Result<(), AbortReason> {
    if rereads > max {
        Err(AbortReason::VersionStayedUncommittedOrTorn)
    } else {
        Ok(())
    }
}

/// The slot an insert of `key` takes in a bucket whose used slots are `used` (§4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotChoice {
    /// The key is there already (inserted meanwhile, or never absent).
    Present(usize),
    /// This free slot, claimed now.
    Free(usize),
    /// No free slot: abort.
    Full,
}

/// Picks `key`'s slot in the bucket at `bucket` with `slots` slots, `used` as read and
/// `taken` the `(bucket, slot)`s this round claimed already (two inserts into one bucket).
#[must_use]
pub fn choose_slot(
    used: &[(usize, u64)],
    key: u64,
    bucket: u64,
    slots: usize,
    taken: &[(u64, usize)],
) -> SlotChoice {
    if let Some(&(slot, _)) = used.iter().find(|(_, k)| *k == key) {
        return SlotChoice::Present(slot);
    }
    (0..slots)
        .find(|s| !used.iter().any(|(u, _)| u == s) && !taken.contains(&(bucket, *s)))
        .map_or(SlotChoice::Full, SlotChoice::Free)
}

// ---------------------------------------------------------------------------------------
// Commit (§5.1 commit steps 1–4, §6)
// ---------------------------------------------------------------------------------------

/// The CNs whose locks `held` holds, sorted, each once.
#[must_use]
pub fn lock_owners(held: &[HeldLock]) -> Vec<u16> {
    let mut o: Vec<u16> = held.iter().map(|h| h.owner).collect();
    o.sort_unstable();
    o.dedup();
    o
}

/// Whether a transaction with locks of `owners` may enter its commit phase: §6, one holding
/// a failed CN's lock aborts unless already committing; §4.3, a hand-over that aborted a
/// shard's holders took their locks away (`valid` false).
///
/// # Errors
/// The abort.
pub fn may_commit(
    owners: &[u16],
    is_failed: impl Fn(u16) -> bool,
    valid: impl FnOnce() -> bool,
) -> Result<(), AbortReason> {
    if owners.iter().any(|&o| is_failed(o)) {
        return Err(AbortReason::LockOwnerFailedBeforeCommit);
    }
    if !valid() {
        return Err(AbortReason::LockShardWasHandedOver);
    }
    Ok(())
}

/// One new version a commit installs.
#[derive(Debug, Clone, Copy)]
pub struct Installed {
    /// Its table.
    pub table: TableId,
    /// Its key.
    pub key: Key,
    /// Its block.
    pub loc: ItemLoc,
    /// The block's shape.
    pub shape: BlockShape,
    /// The cell it goes to.
    pub cell: usize,
    /// What the history records.
    pub kind: WriteKind,
}

/// What commit step (1) writes: every image and INVISIBLE cell (`data`), the versions
/// installed, their log entries and their CVT plans (in the order of the write set).
#[derive(Debug, Clone, Default)]
pub struct WritePlan {
    /// `(address, bytes)` of every WRITE of an image or cell, on every replica.
    pub data: Vec<(RemoteAddr, Vec<u8>)>,
    /// The new versions.
    pub installed: Vec<Installed>,
    /// Their log entries (§6).
    pub logged: Vec<LogEntry>,
    /// Their CVTs after the commit.
    pub plans: Vec<CommitPlan>,
}

/// Plans commit step (1) for `writes` (full records, §4.4: the image, then the cell with
/// version INVISIBLE), collecting versions older than `horizon` (§7.1).
///
/// # Errors
/// A table without a shape.
pub fn plan_writes(
    store: &Store,
    shapes: &Shapes,
    writes: &[WriteEntry<()>],
    horizon: u64,
    writer: u64,
) -> Result<WritePlan, TxnError> {
    let mut p = WritePlan::default();
    for w in writes {
        if w.op.is_none() {
            continue;
        }
        let shape = shapes.get(w.table).map_err(TxnError::from)?;
        let Some(new) = w.new_version(shape, INVISIBLE, horizon, writer) else {
            continue;
        };
        exec::install_writes(store, w.loc, shape, &new, |addr, bytes| {
            p.data.push((addr, bytes.to_vec()));
        });
        let (plan, kind) = (new.plan, new.kind);
        p.logged.push(LogEntry {
            table: w.table,
            partition: w.loc.bucket.partition,
            cell: plan.cell as u16,
            offset: w.loc.offset,
        });
        p.installed.push(Installed {
            table: w.table,
            key: w.key,
            loc: w.loc,
            shape,
            cell: plan.cell,
            kind,
        });
        p.plans.push(plan);
    }
    Ok(p)
}

/// Commit step (1)'s post list: the `log` first to coordinator `coordinator`'s log region
/// on every live MN, so that an INVISIBLE cell never lands without it (`crate::recovery`),
/// then `data`.
///
/// # Errors
/// No log region for `coordinator`, or a log larger than it.
pub fn log_and_data(
    store: &Store,
    coordinator: u16,
    log: &[u8],
    data: Vec<(RemoteAddr, Vec<u8>)>,
) -> Result<PostList, AbortReason> {
    let mut list = PostList::new();
    let at = store
        .log_offset(coordinator)
        .map_err(|_| AbortReason::NoLogRegion)?;
    if log.len() > store.log_region_bytes() {
        return Err(AbortReason::CommitLogLargerThanLogRegion);
    }
    for mn in 0..store.config().mns {
        if store.live_replicas(mn).contains(&mn) {
            list.write(store.addr(mn, at), log);
        }
    }
    for (addr, bytes) in data {
        list.write_owned(addr, bytes);
    }
    Ok(list)
}

/// The history's write events of `installed` at commit version `c`.
#[must_use]
pub fn write_events(installed: &[Installed], c: u64) -> Vec<WriteEvent> {
    installed
        .iter()
        .map(|i| WriteEvent {
            table: i.table,
            key: i.key,
            version: Version(c),
            kind: i.kind,
        })
        .collect()
}

/// Commit step (3)'s post list: commit version `c` into every new cell on every replica.
#[must_use]
pub fn make_visible(store: &Store, installed: &[Installed], c: u64) -> PostList {
    let mut list = PostList::new();
    for i in installed {
        let o = i.shape.cell_offset(i.cell) + CvtCell::VERSION_OFFSET;
        for mn in store.live_replicas(i.loc.bucket.partition) {
            list.write(store.addr(mn, i.loc.offset + o as u64), &c.to_le_bytes());
        }
    }
    list
}

/// A CVT to keep in the version table cache: lock key, shard, block, meta.
pub type CachedCvt = (u64, u16, ItemLoc, Meta);

/// The CVTs a local writer keeps cached after committing at `c` (§4.4): those of the
/// records whose locks `held` holds on `me`'s table.
#[must_use]
pub fn cvts_to_cache(
    installed: &[Installed],
    plans: Vec<CommitPlan>,
    held: &[HeldLock],
    me: u16,
    sharding: &Sharding,
    c: u64,
) -> Vec<CachedCvt> {
    let mut out = Vec::new();
    for (i, plan) in installed.iter().zip(plans) {
        let lock = record_lock_key(i.table, i.key);
        if !held_on(held, lock, me) {
            continue;
        }
        let mut cells = plan.cells;
        cells[i.cell] = cells[i.cell].with_commit_version(c);
        let meta = Meta {
            lock: 0,
            floor: plan.floor,
            key: i.key.0,
            cells,
        };
        out.push((lock, sharding.shard_of(i.table, i.key), i.loc, meta));
    }
    out
}

#[cfg(test)]
mod tests {
    use dmem_locks::lotus::Refusal;
    use dmem_motor::logic::StagedOp;
    use dmem_motor::mvcc::{footprint, store_config_with_logs};
    use dmem_store::TableDemand;
    use dmem_verbs::{MemoryRegion, NodeId, RKey};

    use super::*;
    use crate::recovery::CommitLog;

    fn want(key: u64, shard: u16, mode: LockMode) -> LockWant {
        LockWant {
            key,
            shard,
            mode,
            what: LockFor::Table(key as u32),
        }
    }

    fn held(key: u64, owner: u16, mode: LockMode) -> HeldLock {
        HeldLock {
            key,
            shard: owner,
            owner,
            mode,
            word: None,
            generation: 0,
        }
    }

    #[test]
    fn locks_follow_kind_access_and_isolation() {
        let (sr, si) = (Isolation::Serializable, Isolation::Snapshot);
        let rw = TxnKind::ReadWrite;
        assert_eq!(lock_mode(TxnKind::ReadOnly, Access::Read, sr), None);
        assert_eq!(lock_mode(TxnKind::ReadOnly, Access::ForUpdate, sr), None);
        assert_eq!(
            lock_mode(rw, Access::ForUpdate, si),
            Some(LockMode::Exclusive)
        );
        assert_eq!(lock_mode(rw, Access::Read, sr), Some(LockMode::Shared));
        assert_eq!(lock_mode(rw, Access::Read, si), None);
    }

    #[test]
    fn locks_to_take_skip_what_is_held_and_merge_per_key() {
        let (s, x) = (LockMode::Shared, LockMode::Exclusive);
        let have = [held(2, 0, s), held(3, 0, x)];
        let wanted = [want(1, 1, s), want(2, 2, x), want(1, 1, x), want(3, 3, s)];
        // 1: asked twice, the stronger mode wins, in its first place; 2: held shared, an
        // exclusive lock is still to take; 3: covered by the exclusive lock held.
        assert_eq!(
            locks_to_take(&wanted, &have),
            vec![want(1, 1, x), want(2, 2, x)]
        );
        assert!(holds(&have, 3, s) && holds(&have, 2, s) && !holds(&have, 2, x));
    }

    #[test]
    fn a_round_locks_its_records_by_table_and_marks_them() {
        let sharding = Sharding::new(Vec::new());
        let fetch = |key: u64, access| Fetch {
            table: TableId(4),
            key: Key(key),
            access,
            locked: false,
            local: false,
            loc: None,
            done: None,
        };
        let mut fetches = vec![fetch(1, Access::Read), fetch(2, Access::ForUpdate)];
        let wanted = round_locks(
            &mut fetches,
            TxnKind::ReadWrite,
            Isolation::Snapshot,
            &sharding,
        );
        assert_eq!(wanted.len(), 1);
        assert_eq!(wanted[0].key, record_lock_key(TableId(4), Key(2)));
        assert_eq!(wanted[0].mode, LockMode::Exclusive);
        assert_eq!(wanted[0].what, LockFor::Table(4));
        assert_eq!(wanted[0].shard, sharding.shard_of(TableId(4), Key(2)));
        assert!(!fetches[0].locked && fetches[1].locked);
    }

    /// Shards 1, 4 on CN 1, shard 2 on CN 2, shard 3 on CN 0 (`ShardMap::new(3)`); this
    /// coordinator is on CN 0.
    fn attempt(map: &ShardMap) -> LockAttempt {
        let x = LockMode::Exclusive;
        LockAttempt::new(
            vec![
                want(10, 1, x),
                want(20, 2, x),
                want(30, 3, x),
                want(40, 4, x),
            ],
            map,
        )
    }

    #[test]
    fn an_attempt_sends_one_request_per_owner_and_reroutes_moved_shards() {
        let mut map = ShardMap::new(3);
        map.abort_holders(4);
        let mut a = attempt(&map);
        assert_eq!(a.owners().collect::<Vec<_>>(), vec![1, 2, 0]);
        let remote = a.remote(0);
        let keys = |es: &[LockEntry]| es.iter().map(|e| e.key).collect::<Vec<_>>();
        assert_eq!(remote.len(), 2);
        assert_eq!((remote[0].0, keys(&remote[0].1)), (1, vec![10, 40]));
        assert_eq!((remote[1].0, keys(&remote[1].1)), (2, vec![20]));
        assert_eq!(keys(&a.local(0)), vec![30]);
        a.sent(7, 1, remote[0].1.clone());
        a.sent(8, 2, remote[1].1.clone());
        let e = a.local(0)[0];
        let LocalStep::Held(h) = a.acquired_here(&e, 0, Acquired::Granted) else {
            panic!("a granted local lock is held");
        };
        assert_eq!((h.key, h.owner, h.generation), (30, 0, 0));
        assert!(a.waiting());
        assert_eq!(a.on_reply(99, Status::Granted), ReplyStep::Stale);
        assert_eq!(a.on_reply(8, Status::NotOwner), ReplyStep::NotOwner);
        let ReplyStep::Granted(got) = a.on_reply(7, Status::Granted) else {
            panic!("granted");
        };
        let got: Vec<_> = got.iter().map(|h| (h.key, h.owner, h.generation)).collect();
        // Shard 4's holders were aborted once before the attempt: generation 1.
        assert_eq!(got, vec![(10, 1, 0), (40, 1, 1)]);
        // A second reply to the same request is late.
        assert_eq!(a.on_reply(7, Status::Refused), ReplyStep::Stale);
        assert!(!a.waiting());
        assert_eq!(
            a.finish(),
            AttemptEnd::Reroute(vec![want(20, 2, LockMode::Exclusive)])
        );
    }

    #[test]
    fn a_refusal_fails_the_attempt_and_is_counted_by_kind() {
        let map = ShardMap::new(3);
        let mut a = attempt(&map);
        for (owner, entries) in a.remote(0) {
            a.sent(u64::from(owner), owner, entries);
        }
        // Keys 10 and 40 are for different tables: a refusal of both is mixed.
        assert_eq!(
            a.on_reply(1, Status::Refused),
            ReplyStep::Refused(LockFor::Mixed)
        );
        assert_eq!(
            a.on_reply(2, Status::Refused),
            ReplyStep::Refused(LockFor::Table(20))
        );
        assert_eq!(a.finish(), AttemptEnd::Refused);

        let mut a = attempt(&map);
        let e = a.local(0)[0];
        assert_eq!(
            a.acquired_here(&e, 0, Acquired::Refused(Refusal::Conflict)),
            LocalStep::Refused(LockFor::Table(30))
        );
        assert_eq!(a.finish(), AttemptEnd::Refused);
    }

    #[test]
    fn unanswered_requests_time_out_holding_what_they_asked() {
        let map = ShardMap::new(3);
        let mut a = attempt(&map);
        for (owner, entries) in a.remote(0) {
            a.sent(u64::from(owner), owner, entries);
        }
        assert_eq!(
            a.on_reply(2, Status::Refused),
            ReplyStep::Refused(LockFor::Table(20))
        );
        // A timeout wins over the refusal: the locks asked of CN 1 may be held there.
        let AttemptEnd::TimedOut(asked) = a.finish() else {
            panic!("timed out");
        };
        let asked: Vec<_> = asked.iter().map(|h| (h.key, h.owner)).collect();
        assert_eq!(asked, vec![(10, 1), (40, 1)]);
    }

    #[test]
    fn a_local_shard_that_moved_is_asked_again_and_handovers_invalidate_locks() {
        let mut map = ShardMap::new(3);
        let mut a = attempt(&map);
        let e = a.local(0)[0];
        a.not_served_here(&e);
        assert_eq!(
            a.finish(),
            AttemptEnd::Reroute(vec![want(30, 3, LockMode::Exclusive)])
        );
        let have = [held(1, 1, LockMode::Shared)];
        assert!(locks_valid(&have, &map));
        map.abort_holders(1);
        assert!(!locks_valid(&have, &map));
    }

    #[test]
    fn unlocks_release_local_locks_and_group_the_rest_per_cn() {
        let s = LockMode::Shared;
        let all = vec![held(1, 2, s), held(2, 0, s), held(3, 1, s), held(4, 2, s)];
        let (here, groups) = unlock_plan(all, 0);
        assert_eq!(here.iter().map(|h| h.key).collect::<Vec<_>>(), vec![2]);
        let groups: Vec<_> = groups
            .iter()
            .map(|(o, es)| (*o, es.iter().map(|e| e.key).collect::<Vec<_>>()))
            .collect();
        assert_eq!(groups, vec![(2, vec![1, 4]), (1, vec![3])]);
    }

    #[test]
    fn an_unlocked_read_waits_out_a_version_being_committed() {
        let meta = |second: u64| Meta {
            lock: 0,
            floor: 0,
            key: 7,
            cells: vec![CvtCell::new(1, 0x100, 5), CvtCell::new(1, 0x200, second)],
        };
        let committing = meta(INVISIBLE);
        assert_eq!(after_meta(&committing, 10, false), MetaOutcome::Retry);
        // Under a lock the committed versions decide, as Motor's logic does.
        let locked = after_meta(&committing, 10, true);
        assert_ne!(locked, MetaOutcome::Retry);
        assert_eq!(locked, logic::after_meta(&committing, 10, true, false));
        assert_eq!(after_meta(&meta(8), 10, false), MetaOutcome::Image(1));
        assert_eq!(reread(3, 3), Ok(()));
        assert_eq!(
            reread(4, 3),
            Err(AbortReason::VersionStayedUncommittedOrTorn)
        );
    }

    #[test]
    fn an_insert_finds_its_key_or_the_first_slot_free_in_this_round() {
        let used = [(0, 11), (2, 12)];
        assert_eq!(choose_slot(&used, 12, 64, 4, &[]), SlotChoice::Present(2));
        assert_eq!(choose_slot(&used, 13, 64, 4, &[]), SlotChoice::Free(1));
        // Slot 1 claimed by this round's other insert into the same bucket; another
        // bucket's claims do not count.
        assert_eq!(
            choose_slot(&used, 13, 64, 4, &[(64, 1)]),
            SlotChoice::Free(3)
        );
        assert_eq!(
            choose_slot(&used, 13, 64, 4, &[(128, 1)]),
            SlotChoice::Free(1)
        );
        assert_eq!(
            choose_slot(&used, 13, 64, 4, &[(64, 1), (64, 3)]),
            SlotChoice::Full
        );
    }

    #[test]
    fn commit_aborts_on_a_failed_owner_before_a_handover() {
        let have = [
            held(1, 2, LockMode::Shared),
            held(2, 0, LockMode::Shared),
            held(3, 2, LockMode::Shared),
        ];
        let owners = lock_owners(&have);
        assert_eq!(owners, vec![0, 2]);
        assert_eq!(may_commit(&owners, |_| false, || true), Ok(()));
        assert_eq!(
            may_commit(&owners, |o| o == 2, || false),
            Err(AbortReason::LockOwnerFailedBeforeCommit)
        );
        assert_eq!(
            may_commit(&owners, |o| o == 1, || false),
            Err(AbortReason::LockShardWasHandedOver)
        );
    }

    /// One table of 8-byte values on 3 MNs, 2 replicas, log regions of 256 bytes for 2
    /// coordinators.
    fn store() -> (Store, Shapes) {
        let tables = [TableDemand {
            id: TableId(1),
            value_len: 8,
            expected_records: 16,
            grows: false,
        }];
        let shapes = Shapes::uniform(&tables, 2);
        let cfg = store_config_with_logs(3, &tables, &shapes, 2, 2, false, 2, 256);
        let bytes = footprint(&cfg, &tables).unwrap().bytes_per_mn;
        let regions = (0..3)
            .map(|i| MemoryRegion {
                node: NodeId(i),
                rkey: RKey(1),
                len: bytes,
            })
            .collect();
        (Store::new(cfg, regions).unwrap(), shapes)
    }

    #[test]
    fn a_commit_logs_first_then_installs_and_makes_visible_on_every_replica() {
        let (store, shapes) = store();
        let (table, key) = (TableId(1), Key(5));
        let shape = shapes.get(table).unwrap();
        let bucket = store.bucket_of(table, key).unwrap();
        let loc = store.item_at(bucket, 0).unwrap();
        let mut put = WriteEntry::new(table, key, loc, Meta::empty(shape.cells), ());
        put.op = Some(StagedOp::Put(vec![9; 8], WriteKind::Insert));
        let read_only = WriteEntry::new(table, Key(6), loc, Meta::empty(shape.cells), ());
        let w = plan_writes(&store, &shapes, &[read_only, put], 0, 77).unwrap();
        assert_eq!(w.installed.len(), 1);
        assert_eq!((w.installed[0].key, w.installed[0].cell), (key, 0));
        assert_eq!(w.logged[0].offset, loc.offset);
        let replicas = store.live_replicas(loc.bucket.partition);
        assert_eq!(replicas.len(), 2);
        // Image and cell (or whole meta) on each replica.
        assert!(w.data.len() >= 2 * replicas.len());
        let log = CommitLog {
            writer: 77,
            entries: w.logged.clone(),
        };
        let bytes = log.emit();
        assert_eq!(CommitLog::parse(&bytes), Ok(log));
        let log = bytes;
        let n = w.data.len();
        let list = log_and_data(&store, 1, &log, w.data.clone()).unwrap();
        // The log first, once per live MN, then the data.
        assert_eq!(list.len(), 3 + n);
        assert_eq!(
            log_and_data(&store, 2, &log, Vec::new()).err(),
            Some(AbortReason::NoLogRegion)
        );
        let huge = vec![0; 257];
        assert_eq!(
            log_and_data(&store, 0, &huge, Vec::new()).err(),
            Some(AbortReason::CommitLogLargerThanLogRegion)
        );
        assert_eq!(make_visible(&store, &w.installed, 42).len(), 2);
        let events = write_events(&w.installed, 42);
        assert_eq!(events[0].version, Version(42));
        assert_eq!(events[0].kind, WriteKind::Insert);
        // §4.4: only a record locked on this CN keeps its CVT cached, now visible.
        let sharding = Sharding::new(Vec::new());
        let lock = record_lock_key(table, key);
        let remote = [held(lock, 1, LockMode::Exclusive)];
        assert!(cvts_to_cache(&w.installed, w.plans.clone(), &remote, 0, &sharding, 42).is_empty());
        let local = [held(lock, 0, LockMode::Exclusive)];
        let kept = cvts_to_cache(&w.installed, w.plans, &local, 0, &sharding, 42);
        assert_eq!(kept.len(), 1);
        assert_eq!((kept[0].0, kept[0].2), (lock, loc));
        assert_eq!(kept[0].3.key, 5);
        assert_eq!(kept[0].3.cells[0].commit_version(), 42);
    }
}
