//! Where OOCC's records, redo logs and lease words live on the MNs.
//!
//! Every MN has the same layout:
//!
//! ```text
//! 0                     lease area: per coordinator one 64-byte line
//!                       (lease word, statistics words; §VII-A)
//! lease_area            redo-log area: one region per coordinator (Pandora §3.2.2 size)
//! lease_area + logs     records, OoccRecord layout (lock word at the highest address)
//! records_end           the insert directory: per growing table one array of 16-byte
//!                       entries (key + 1, record offset), then the insert counter (8 bytes)
//! ```
//!
//! A record lives on one MN (`mix64(table, key) % mns`; OOCC's evaluation does not
//! replicate, §VIII-A). Its slot is found through a [`Directory`]: every CN starts with the
//! address of every loaded record, as after scanning the index once (the `warm_cache`
//! FORD runs are compared with), and a key inserted by a transaction gets its slot there
//! once, so that all CNs agree on it. The directory is the sim's stand-in for an index; a
//! lookup costs no round trip (FORD's warm address cache costs none either). A zeroed slot
//! is an absent record with version 0 and a free lock.
//!
//! **Across processes** each CN process (and each core of one) has a directory of its own,
//! so a key a transaction inserts must get its slot where every process finds it: the
//! *insert directory* in MN memory ([`Directory::share_inserts`], set when a deployment
//! joins a cluster as a CN process). A key the loader did not place (one a transaction
//! inserts, or an absent key of a sparse table that a transaction reads) is looked up by linear probing from its hash in its table's entry array on its
//! MN ([`Directory::locate`]): an entry holding `key + 1` names the record's offset; the
//! first zero entry is claimed for it with a CAS, its record space taken from the MN's
//! insert counter with an FAA (bytes past where the loader stopped, which every process
//! knows from the deterministic load), and the offset CASed into the entry from 0. A
//! prober that finds the key with offset 0 (claimed, not yet filled) reads it again, and
//! after [`FILL_WAIT_NS`] fills it itself the same way (its claimer may have died between
//! the two CASes); whichever offset CAS lands first is the slot. The
//! simulator's and one process's CNs share one directory, which stays authoritative there:
//! their figures do not pay these round trips.

use std::cell::{OnceCell, RefCell};
use std::collections::HashMap;
use std::sync::Arc;

use dmem_deploy::{DeployError, DeploySpec};
use dmem_layout::mix::splitmix64 as mix64;
use dmem_layout::record::{DataItemHeader, ItemFlags, OoccLockWord, OoccRecordHeader};
use dmem_txn::{CoordinatorId, Key, TableId, TxnError, TxnId};
use dmem_verbs::{Clock, MemoryRegion, PostList, RemoteAddr, Verbs, VerbsError};

/// Bytes of one coordinator's redo-log region.
pub const LOG_REGION_BYTES: u64 = 32 * 1024;
/// Bytes of one coordinator's lease line.
pub const LEASE_LINE: u64 = 64;
/// Bytes of one insert-directory entry: `key + 1` (0: free), then the record's offset
/// (0: claimed, not yet written; [`NO_ROOM`]: claimed when the MN had no room left).
pub const INSERT_ENTRY: u64 = 16;
/// An insert-directory entry's offset when its claimer found no record space left.
pub const NO_ROOM: u64 = u64::MAX;
/// Entries one probe READs.
const PROBE_ENTRIES: u64 = 8;
/// How long a prober waits for a claimed entry's offset before it fills the entry itself
/// (its claimer is two round trips from filling it, or dead), ns.
pub const FILL_WAIT_NS: u64 = 2_000_000;

/// A record's place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Loc {
    /// MN index.
    pub mn: u16,
    /// Offset of the record in the MN's region.
    pub offset: u64,
}

/// The layout of every MN for a [`DeploySpec`].
#[derive(Debug, Clone)]
pub struct Layout {
    /// Value length per table.
    pub tables: HashMap<TableId, usize>,
    /// Coordinators with a lease line and a log region.
    pub coordinators: u16,
    /// MNs.
    pub mns: u16,
    /// Where records start.
    pub records_base: u64,
    /// Where record space ends (the insert directory follows).
    pub records_end: u64,
    /// Per table, the offset of its insert-directory entries and their number (the
    /// same on every MN).
    pub insert_dirs: HashMap<TableId, (u64, u64)>,
    /// Offset of the MN's insert counter (bytes of record space inserts took past the
    /// loader's end).
    pub insert_counter: u64,
    /// Bytes per MN.
    pub bytes_per_mn: u64,
}

impl Layout {
    /// The layout of `spec` on `mns` MNs.
    ///
    /// # Errors
    /// A spec without coordinators or MNs.
    pub fn new(spec: &DeploySpec, mns: u16) -> Result<Self, DeployError> {
        if mns == 0 {
            return Err(refused("no memory node".into()));
        }
        // Coordinator ids go up to `coordinators`; recovery and final coordinators use a
        // few ids past it.
        let coordinators = spec.coordinators.saturating_add(8);
        let records_base = u64::from(coordinators) * (LEASE_LINE + LOG_REGION_BYTES);
        let record_bytes = record_bytes(spec)?;
        // Placement by hash: a quarter more than an even share, plus a margin.
        let records_end = (record_bytes / u64::from(mns))
            .checked_mul(5)
            .and_then(|b| (b / 4 + (1 << 16)).checked_add(records_base))
            .ok_or_else(too_big)?;
        let (insert_dirs, insert_counter) = insert_dirs(spec, mns, records_end)?;
        let bytes_per_mn = insert_counter.checked_add(8).ok_or_else(too_big)?;
        Ok(Self {
            tables: spec.tables.iter().map(|t| (t.id, t.value_len)).collect(),
            coordinators,
            mns,
            records_base,
            records_end,
            insert_dirs,
            insert_counter,
            bytes_per_mn,
        })
    }

    /// Offset of coordinator `id`'s lease line.
    #[must_use]
    pub fn lease_offset(&self, id: u16) -> u64 {
        u64::from(id) * LEASE_LINE
    }

    /// Offset of coordinator `id`'s redo-log region (on MN `id % mns`).
    #[must_use]
    pub fn log_offset(&self, id: u16) -> u64 {
        u64::from(self.coordinators) * LEASE_LINE + u64::from(id) * LOG_REGION_BYTES
    }

    /// The MN holding coordinator `id`'s redo log.
    #[must_use]
    pub fn log_mn(&self, id: u16) -> u16 {
        id % self.mns
    }
}

/// Per table, the offset of its insert-directory entries and their number.
type InsertDirs = HashMap<TableId, (u64, u64)>;

/// The layout refused, for `reason`.
fn refused(reason: String) -> DeployError {
    DeployError::Protocol {
        protocol: "oocc".into(),
        reason,
    }
}

fn too_big() -> DeployError {
    refused("the records exceed 2^64 bytes per memory node: shorten the run".into())
}

/// Keys a transaction may look up that the loader did not place, in a table that does not
/// grow (TATP's sparse tables: the rest of the key space the workload declares, else 64).
/// On the simulator such a key takes a slot of the shared directory; across processes an
/// entry of the insert directory and its record space, so the room is there for both.
fn absent_keys(spec: &DeploySpec, t: &dmem_deploy::TableDemand) -> u64 {
    if t.grows {
        return 0;
    }
    spec.key_spaces
        .iter()
        .find(|(id, _)| *id == t.id)
        .map_or(64, |&(_, k)| k.saturating_sub(t.expected_records).max(64))
}

/// Bytes of record space over all MNs: every table's records, growing tables with room
/// for the inserts the run may make (`DeploySpec::insert_room`, sized from the run's
/// length by the harness, or the default room), and the absent keys of the others.
fn record_bytes(spec: &DeploySpec) -> Result<u64, DeployError> {
    let mut record_bytes = 0u64;
    for t in &spec.tables {
        let bytes = spec
            .records_with_room(t)
            .and_then(|r| r.checked_mul(OoccRecordHeader::record_len(t.value_len) as u64))
            .and_then(|b| record_bytes.checked_add(b));
        record_bytes = bytes.ok_or_else(|| {
            refused(format!(
                "the records of table {} with room for the run's inserts exceed 2^64 bytes: shorten the run",
                t.id.0
            ))
        })?;
    }
    for t in &spec.tables {
        record_bytes = absent_keys(spec, t)
            .checked_mul(OoccRecordHeader::record_len(t.value_len) as u64)
            .and_then(|b| record_bytes.checked_add(b))
            .ok_or_else(|| {
                refused(format!(
                    "the key space of table {} exceeds 2^64 bytes",
                    t.id.0
                ))
            })?;
    }
    Ok(record_bytes)
}

/// The insert directory after `records_end`: per table (in id order), twice a quarter
/// more than its even share of the keys the loader does not place (a growing table's
/// records with room, another's absent keys; linear probing stays short below half full),
/// plus 64. Returns each table's (offset, entries) and the insert counter's offset.
fn insert_dirs(
    spec: &DeploySpec,
    mns: u16,
    records_end: u64,
) -> Result<(InsertDirs, u64), DeployError> {
    let mut insert_dirs = HashMap::new();
    // Entries and the counter are CAS/FAA targets: 8-byte aligned.
    let mut at = records_end.checked_add(7).ok_or_else(too_big)? & !7;
    let mut tables: Vec<_> = spec.tables.iter().collect();
    tables.sort_by_key(|t| t.id.0);
    for t in tables {
        let keys = if t.grows {
            spec.records_with_room(t)
        } else {
            Some(absent_keys(spec, t))
        };
        let entries = keys
            .and_then(|r| (r / u64::from(mns)).checked_mul(5))
            .map(|r| r / 2 + 64)
            .ok_or_else(too_big)?;
        insert_dirs.insert(t.id, (at, entries));
        at = entries
            .checked_mul(INSERT_ENTRY)
            .and_then(|b| at.checked_add(b))
            .ok_or_else(too_big)?;
    }
    Ok((insert_dirs, at))
}

/// The slots a directory gave (a loader's placement) and where each MN's free record space
/// began then: read-only, so the directories of one CN process's cores share one
/// ([`Directory::placed`]) instead of each loading the records again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    slots: HashMap<(TableId, Key), Loc>,
    next: Vec<u64>,
}

/// The shared record directory (see the module docs).
#[derive(Debug)]
pub struct Directory {
    layout: Layout,
    regions: Vec<MemoryRegion>,
    /// Slots placed by another directory's loader, taken as given.
    base: Option<Arc<Placed>>,
    /// Slots this directory gave.
    slots: RefCell<HashMap<(TableId, Key), Loc>>,
    next: RefCell<Vec<u64>>,
    /// Where the loader's record space ended on each MN, once inserts go through the
    /// insert directory in MN memory ([`share_inserts`](Self::share_inserts)).
    load_end: OnceCell<Vec<u64>>,
}

impl Directory {
    /// An empty directory over `regions` (one per MN).
    #[must_use]
    pub fn new(layout: Layout, regions: Vec<MemoryRegion>) -> Self {
        let next = vec![layout.records_base; regions.len()];
        Self {
            layout,
            regions,
            base: None,
            slots: RefCell::new(HashMap::new()),
            next: RefCell::new(next),
            load_end: OnceCell::new(),
        }
    }

    /// A directory over `regions` whose records are where `placed` says (another
    /// directory's [`placement`](Self::placement) with the same layout and regions); later
    /// slots come after them.
    ///
    /// # Errors
    /// `placed` has another number of MNs than `regions`.
    pub fn placed(
        layout: Layout,
        regions: Vec<MemoryRegion>,
        placed: Arc<Placed>,
    ) -> Result<Self, String> {
        if placed.next.len() != regions.len() {
            return Err(format!(
                "a placement over {} MNs for a directory over {}",
                placed.next.len(),
                regions.len()
            ));
        }
        let next = placed.next.clone();
        Ok(Self {
            layout,
            regions,
            base: Some(placed),
            slots: RefCell::new(HashMap::new()),
            next: RefCell::new(next),
            load_end: OnceCell::new(),
        })
    }

    /// From now on a key the loader did not place gets its slot from the insert directory
    /// in MN memory ([`locate`](Self::locate); module docs): for a directory that is one of
    /// several over the same MNs (a CN process's, a core's). Call it once loading is over:
    /// inserts' record space starts where the loader's ended, which every process's
    /// deterministic load agrees on. A second call changes nothing.
    pub fn share_inserts(&self) {
        let _ = self.load_end.set(self.next.borrow().clone());
    }

    /// Whether inserts go through the insert directory in MN memory.
    #[must_use]
    pub fn shares_inserts(&self) -> bool {
        self.load_end.get().is_some()
    }

    /// The MN of `(table, key)`'s record.
    fn mn_of(&self, table: TableId, key: Key) -> u16 {
        (mix64(u64::from(table.0) << 48 ^ key.0) % u64::from(self.layout.mns)) as u16
    }

    /// The slot of `(table, key)` for a transaction: [`get`](Self::get) if this directory
    /// knows it, else from the insert directory in MN memory for a growing table once
    /// [`share_inserts`](Self::share_inserts) was called (a READ per 8 entries probed, a
    /// CAS, an FAA and a WRITE to claim one; remembered afterwards), else
    /// [`slot`](Self::slot).
    ///
    /// # Errors
    /// As [`slot`](Self::slot); a fabric error; an insert directory with no free entry
    /// left, or a key whose claimer found no record space.
    pub async fn locate<V: Verbs + Clock>(
        &self,
        ctx: &V,
        table: TableId,
        key: Key,
    ) -> Result<Loc, TxnError> {
        if let Some(loc) = self.get(table, key) {
            return Ok(loc);
        }
        let Some(load_end) = self.load_end.get() else {
            return self.slot(table, key);
        };
        let Some(&(base, entries)) = self.layout.insert_dirs.get(&table) else {
            return Err(TxnError::UnknownTable(table.0));
        };
        let loc = self.claim(ctx, table, key, base, entries, load_end).await?;
        self.slots.borrow_mut().insert((table, key), loc);
        Ok(loc)
    }

    /// Finds or claims `(table, key)`'s entry in its table's insert directory (`entries`
    /// entries at `base` on the key's MN): linear probing from the key's hash.
    async fn claim<V: Verbs + Clock>(
        &self,
        ctx: &V,
        table: TableId,
        key: Key,
        base: u64,
        entries: u64,
        load_end: &[u64],
    ) -> Result<Loc, TxnError> {
        let tag = key.0.checked_add(1).ok_or(TxnError::KeyState(key.0))?;
        let mn = self.mn_of(table, key);
        let start = (mix64(u64::from(table.0) << 48 ^ key.0) >> 16) % entries;
        let mut probed = 0;
        while probed < entries {
            let first = (start + probed) % entries;
            let n = PROBE_ENTRIES.min(entries - first);
            let mut list = PostList::new();
            let read = list.read(
                self.addr(mn, base + first * INSERT_ENTRY),
                (n * INSERT_ENTRY) as u32,
            );
            let seen = ctx.post(list).await?.take_bytes(read);
            for j in 0..n {
                let at = base + (first + j) * INSERT_ENTRY;
                let word = |w: usize| {
                    let from = (j * INSERT_ENTRY) as usize + 8 * w;
                    seen.get(from..from + 8)
                        .and_then(|b| b.try_into().ok())
                        .map_or(0, u64::from_le_bytes)
                };
                let len = OoccRecordHeader::record_len(self.value_len(table)?) as u64;
                let end = load_end[usize::from(mn)];
                match word(0) {
                    k if k == tag => {
                        return self.written_offset(ctx, mn, at, word(1), len, end).await;
                    }
                    0 => {}
                    _ => continue,
                }
                let mut list = PostList::new();
                let cas = list.cas(self.addr(mn, at), 0, tag);
                let old = ctx.post(list).await?.atomic(cas);
                if old == tag {
                    return self.written_offset(ctx, mn, at, 0, len, end).await;
                }
                if old != 0 {
                    continue;
                }
                return self.fill(ctx, mn, at, len, end).await;
            }
            probed += n;
        }
        Err(TxnError::OutOfRoom(
            "insert directory full (sized for a shorter run)",
        ))
    }

    /// Fills the entry at `at` on MN `mn` with record space of `len` bytes taken from the
    /// MN's insert counter (past `end`, the loader's end): an FAA, then a CAS of the
    /// offset from 0, so that of the claimer and a prober that found the entry unfilled
    /// for too long (its claimer may have died) exactly one decides; the other's space
    /// stays unused. Returns the slot the entry ends with.
    async fn fill<V: Verbs + Clock>(
        &self,
        ctx: &V,
        mn: u16,
        at: u64,
        len: u64,
        end: u64,
    ) -> Result<Loc, TxnError> {
        let mut list = PostList::new();
        let faa = list.faa(self.addr(mn, self.layout.insert_counter), len);
        let taken = ctx.post(list).await?.atomic(faa);
        let offset = end
            .checked_add(taken)
            .filter(|o| o.saturating_add(len) <= self.layout.records_end)
            .unwrap_or(NO_ROOM);
        let mut list = PostList::new();
        let cas = list.cas(self.addr(mn, at + 8), 0, offset);
        let old = ctx.post(list).await?.atomic(cas);
        located(mn, if old == 0 { offset } else { old })
    }

    /// The offset in the entry at `at` on MN `mn` (`seen` if already read non-zero), read
    /// until its claimer has filled it, or filled here ([`fill`](Self::fill)) once it
    /// stayed empty for [`FILL_WAIT_NS`]: a claimer that died between its two CASes must
    /// not leave the key without a slot for the rest of the run.
    async fn written_offset<V: Verbs + Clock>(
        &self,
        ctx: &V,
        mn: u16,
        at: u64,
        seen: u64,
        len: u64,
        end: u64,
    ) -> Result<Loc, TxnError> {
        let mut offset = seen;
        let since = ctx.now();
        while offset == 0 {
            if ctx.now().saturating_sub(since) > FILL_WAIT_NS {
                return self.fill(ctx, mn, at, len, end).await;
            }
            // The claimer's FAA and CAS are two round trips away.
            ctx.sleep(10_000).await;
            let mut list = PostList::new();
            let read = list.read(self.addr(mn, at + 8), 8);
            let bytes = ctx.post(list).await?.take_bytes(read);
            offset = bytes.try_into().map_or(0, u64::from_le_bytes);
        }
        located(mn, offset)
    }

    /// The slots given so far (those it was placed with included) and the free space.
    #[must_use]
    pub fn placement(&self) -> Placed {
        let mut slots = self
            .base
            .as_ref()
            .map_or_else(HashMap::new, |b| b.slots.clone());
        slots.extend(self.slots.borrow().iter().map(|(k, v)| (*k, *v)));
        Placed {
            slots,
            next: self.next.borrow().clone(),
        }
    }

    /// The layout.
    #[must_use]
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Value length of `table`.
    ///
    /// # Errors
    /// An unknown table.
    pub fn value_len(&self, table: TableId) -> Result<usize, TxnError> {
        self.layout
            .tables
            .get(&table)
            .copied()
            .ok_or(TxnError::UnknownTable(table.0))
    }

    /// The slot of `(table, key)`, given one on first use (from this directory's own
    /// record space: the loader's, or a transaction's where the directory is the only one).
    ///
    /// # Errors
    /// An unknown table, or an MN out of record space.
    pub fn slot(&self, table: TableId, key: Key) -> Result<Loc, TxnError> {
        if let Some(l) = self.get(table, key) {
            return Ok(l);
        }
        let len = OoccRecordHeader::record_len(self.value_len(table)?) as u64;
        let mn = (mix64(u64::from(table.0) << 48 ^ key.0) % u64::from(self.layout.mns)) as u16;
        let mut next = self.next.borrow_mut();
        let at = next[usize::from(mn)];
        if at + len > self.layout.records_end {
            // Not retryable: the run outgrew the insert room it was sized for.
            return Err(TxnError::OutOfRoom(
                "memory node out of record space (insert room sized for a shorter run)",
            ));
        }
        next[usize::from(mn)] = at + len;
        let loc = Loc { mn, offset: at };
        self.slots.borrow_mut().insert((table, key), loc);
        Ok(loc)
    }

    /// The slot of `(table, key)` if it has one.
    #[must_use]
    pub fn get(&self, table: TableId, key: Key) -> Option<Loc> {
        let own = self.slots.borrow().get(&(table, key)).copied();
        own.or_else(|| self.base.as_ref()?.slots.get(&(table, key)).copied())
    }

    /// The remote address of `offset` in MN `mn`.
    #[must_use]
    pub fn addr(&self, mn: u16, offset: u64) -> RemoteAddr {
        let r = self.regions[usize::from(mn)];
        RemoteAddr {
            node: r.node,
            rkey: r.rkey,
            offset,
        }
    }

    /// The node of MN `mn`.
    #[must_use]
    pub fn node(&self, mn: u16) -> dmem_verbs::NodeId {
        self.regions[usize::from(mn)].node
    }

    /// Every slot, for recovery and checks, in (table, key) order: the slots live in a
    /// `HashMap` whose iteration order changes from process to process (a random hash
    /// seed), and recovery posts its lock-word scan in this order, so an unsorted list
    /// made the simulated recovery time, and the run after it, differ between two runs.
    #[must_use]
    pub fn all(&self) -> Vec<((TableId, Key), Loc)> {
        sorted(self.placement().slots)
    }

    /// Every slot this directory knows and, once inserts are shared
    /// ([`share_inserts`](Self::share_inserts)), every filled entry of the insert
    /// directories in MN memory (what other processes inserted): what recovery scans.
    ///
    /// # Errors
    /// A fabric error.
    pub async fn all_in_memory<V: Verbs>(
        &self,
        ctx: &V,
    ) -> Result<Vec<((TableId, Key), Loc)>, VerbsError> {
        let mut all: HashMap<(TableId, Key), Loc> = self.placement().slots;
        if !self.shares_inserts() {
            return Ok(sorted(all));
        }
        const CHUNK: u64 = 4096;
        // In table order, for the same reason as the result's.
        let mut dirs: Vec<_> = self.layout.insert_dirs.iter().collect();
        dirs.sort_by_key(|(t, _)| t.0);
        for (&table, &(base, entries)) in dirs {
            for mn in 0..self.layout.mns {
                let mut first = 0;
                while first < entries {
                    let n = CHUNK.min(entries - first);
                    let mut list = PostList::new();
                    let read = list.read(
                        self.addr(mn, base + first * INSERT_ENTRY),
                        (n * INSERT_ENTRY) as u32,
                    );
                    let bytes = ctx.post(list).await?.take_bytes(read);
                    for e in bytes.chunks_exact(INSERT_ENTRY as usize) {
                        let word =
                            |w: usize| e[8 * w..8 * w + 8].try_into().map_or(0, u64::from_le_bytes);
                        let (tag, offset) = (word(0), word(1));
                        if tag != 0 && offset != 0 && offset != NO_ROOM {
                            all.insert((table, Key(tag - 1)), Loc { mn, offset });
                        }
                    }
                    first += n;
                }
            }
        }
        Ok(sorted(all))
    }

    /// The slot of `(table, key)`: [`get`](Self::get), or, once inserts are shared, its
    /// entry in the insert directory in MN memory as `read(mn, offset, len)` returns the
    /// bytes (the final check's synchronous reads); `None` for a key with neither.
    pub fn find(
        &self,
        table: TableId,
        key: Key,
        read: impl Fn(u16, u64, usize) -> Option<Vec<u8>>,
    ) -> Option<Loc> {
        if let Some(loc) = self.get(table, key) {
            return Some(loc);
        }
        let &(base, entries) = self.layout.insert_dirs.get(&table)?;
        if !self.shares_inserts() {
            return None;
        }
        let tag = key.0.checked_add(1)?;
        let mn = self.mn_of(table, key);
        let start = (mix64(u64::from(table.0) << 48 ^ key.0) >> 16) % entries;
        for probed in 0..entries {
            let at = base + (start + probed) % entries * INSERT_ENTRY;
            let e = read(mn, at, INSERT_ENTRY as usize)?;
            let word = |w: usize| {
                e.get(8 * w..8 * w + 8)
                    .and_then(|b| b.try_into().ok())
                    .map_or(0, u64::from_le_bytes)
            };
            match word(0) {
                0 => return None,
                k if k == tag => {
                    let offset = word(1);
                    return (offset != 0 && offset != NO_ROOM).then_some(Loc { mn, offset });
                }
                _ => {}
            }
        }
        None
    }
}

/// The slots of `map` in (table, key) order: a `HashMap`'s iteration order depends on its
/// per-process random seed, and what is posted from these lists must not.
fn sorted(map: HashMap<(TableId, Key), Loc>) -> Vec<((TableId, Key), Loc)> {
    let mut all: Vec<_> = map.into_iter().collect();
    all.sort_unstable_by_key(|((table, key), _)| (table.0, key.0));
    all
}

/// A claimed entry's offset as a slot, or the refusal its claimer wrote.
fn located(mn: u16, offset: u64) -> Result<Loc, TxnError> {
    if offset == NO_ROOM {
        return Err(TxnError::OutOfRoom(
            "memory node out of record space (insert room sized for a shorter run)",
        ));
    }
    Ok(Loc { mn, offset })
}

/// A record image as read: presence, value, lock word (see [`dmem_layout::record::OoccRecord`];
/// the header's value length is not trusted, the table's is used).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// Whether the record is present.
    pub present: bool,
    /// Its value.
    pub value: Vec<u8>,
    /// Its lock word.
    pub lock: OoccLockWord,
    /// The transaction that installed the value, from the record's writer word (`None`
    /// for a loaded record).
    pub writer: Option<TxnId>,
}

/// The writer word of `id` in the record ([`DataItemHeader::pack_writer`]'s encoding, which
/// the FORD family's records use too), 0 for none or an id that does not fit (a coordinator
/// id above `u16::MAX` or a sequence number above 48 bits, beyond any run).
#[must_use]
pub fn writer_word(id: Option<TxnId>) -> u64 {
    id.and_then(|id| {
        let coordinator = u16::try_from(id.coordinator.0).ok()?;
        DataItemHeader::pack_writer(coordinator, id.seq)
    })
    .unwrap_or(DataItemHeader::NO_WRITER)
}

/// The transaction a writer word names (see [`writer_word`]).
#[must_use]
pub fn writer_of(word: u64) -> Option<TxnId> {
    DataItemHeader::unpack_writer(word).map(|(coordinator, seq)| TxnId {
        coordinator: CoordinatorId(u32::from(coordinator)),
        seq,
    })
}

/// Parses a record image of a `value_len`-byte table.
#[must_use]
pub fn parse(bytes: &[u8], value_len: usize) -> Image {
    let flags = u16::from_le_bytes([bytes[14], bytes[15]]);
    let at = OoccRecordHeader::lock_offset(value_len);
    let lock = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0xFF; 8]));
    let w = OoccRecordHeader::WRITER_OFFSET;
    let writer = u64::from_le_bytes(bytes[w..w + 8].try_into().unwrap_or([0; 8]));
    Image {
        present: ItemFlags::from_raw(flags).is_ok_and(ItemFlags::is_valid),
        value: bytes[OoccRecordHeader::LEN..OoccRecordHeader::LEN + value_len].to_vec(),
        lock: OoccLockWord::from_raw(lock),
        writer: writer_of(writer),
    }
}

/// A whole record image: header (with `writer`, the installer), value (zeros when
/// absent), `lock`.
#[must_use]
pub fn emit(
    table: TableId,
    key: Key,
    value: Option<&[u8]>,
    value_len: usize,
    lock: OoccLockWord,
    writer: Option<TxnId>,
) -> Vec<u8> {
    let mut buf = vec![0u8; OoccRecordHeader::record_len(value_len)];
    buf[0..8].copy_from_slice(&key.0.to_le_bytes());
    buf[8..12].copy_from_slice(&table.0.to_le_bytes());
    buf[12..14].copy_from_slice(&(value_len as u16).to_le_bytes());
    let flags = if value.is_some() {
        ItemFlags::LOADED
    } else {
        ItemFlags::EMPTY
    };
    buf[14..16].copy_from_slice(&flags.to_raw().to_le_bytes());
    let w = OoccRecordHeader::WRITER_OFFSET;
    buf[w..w + 8].copy_from_slice(&writer_word(writer).to_le_bytes());
    if let Some(v) = value {
        buf[OoccRecordHeader::LEN..OoccRecordHeader::LEN + v.len()].copy_from_slice(v);
    }
    let at = OoccRecordHeader::lock_offset(value_len);
    buf[at..at + 8].copy_from_slice(&lock.to_raw().to_le_bytes());
    buf
}

#[cfg(test)]
mod tests {
    use dmem_deploy::TableDemand;
    use dmem_verbs::{NodeId, RKey};

    use super::*;

    /// One loaded table and one growing table of 100-byte values.
    fn spec(insert_room: Option<u64>) -> DeploySpec {
        let table = |id, grows| TableDemand {
            id: TableId(id),
            value_len: 100,
            expected_records: 1_000,
            grows,
        };
        let mut spec = DeploySpec::new(vec![table(0, false), table(1, true)], 4);
        if let Some(n) = insert_room {
            spec.insert_room = vec![(TableId(1), n), (TableId(0), 1 << 40)];
        }
        spec
    }

    fn directory(layout: Layout) -> Directory {
        let regions = (0..layout.mns)
            .map(|m| MemoryRegion {
                node: NodeId(m),
                rkey: RKey(1),
                len: layout.bytes_per_mn,
            })
            .collect();
        Directory::new(layout, regions)
    }

    #[test]
    fn a_growing_table_has_room_for_the_runs_inserts_only() {
        let record = OoccRecordHeader::record_len(100) as u64;
        // Record space (the insert directories after it grow with the room too).
        let default = Layout::new(&spec(None), 1).unwrap().records_end;
        let short = Layout::new(&spec(Some(10)), 1).unwrap().records_end;
        let long = Layout::new(&spec(Some(100_000)), 1).unwrap().records_end;
        // The default room is as many inserts again plus 4096; a short run needs far less,
        // a long one more. A table that does not grow ignores a room given for it.
        assert!(short < default, "{short} < {default}");
        assert!(long > default, "{long} > {default}");
        let grown = (100_000 - 10) * record;
        assert!(
            (grown..=grown * 5 / 4 + 1).contains(&(long - short)),
            "{}",
            long - short
        );
    }

    /// The insert directories' entries and the insert counter are CAS and FAA targets:
    /// 8-byte aligned whatever the record space before them comes to (TPC-C across
    /// processes once failed every CAS on a directory after a record area of 4 mod 8).
    #[test]
    fn insert_directories_are_8_byte_aligned() {
        for room in [1, 10, 333, 4_097] {
            for mns in 1..=3 {
                let layout = Layout::new(&spec(Some(room)), mns).unwrap();
                assert_eq!(layout.insert_counter % 8, 0);
                for (table, (base, _)) in &layout.insert_dirs {
                    assert_eq!(base % 8, 0, "table {table:?}, room {room}, {mns} MNs");
                    assert!(*base >= layout.records_end);
                }
            }
        }
    }

    #[test]
    fn a_run_past_its_room_is_refused_not_retried() {
        let dir = directory(Layout::new(&spec(Some(10)), 1).unwrap());
        let mut inserted = 0u64;
        let error = loop {
            match dir.slot(TableId(1), Key(1_000 + inserted)) {
                Ok(_) => inserted += 1,
                Err(e) => break e,
            }
            assert!(inserted < 100_000, "the room never ran out");
        };
        // Loaded keys are not placed here: the whole region is the growing table's.
        assert!(inserted >= 10, "{inserted}");
        assert!(matches!(error, TxnError::OutOfRoom(_)), "{error}");
        assert!(!error.is_retryable());
    }

    #[test]
    fn a_room_past_2_pow_64_bytes_is_a_typed_refusal() {
        let error = Layout::new(&spec(Some(u64::MAX / 2)), 1).unwrap_err();
        assert!(
            matches!(&error, DeployError::Protocol { reason, .. } if reason.contains("shorten the run")),
            "{error}"
        );
    }
}
