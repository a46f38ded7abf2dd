//! Motor's decisions as plain functions of what a READ returned: which version a
//! transaction sees, whether it must abort, which cells a commit writes. The async shell
//! ([`crate::txn`]) only posts and calls these.

use dmem_layout::cacheline::next_version;
use dmem_layout::cvt::CvtCell;

use dmem_txn::{AbortReason, TxnError, TxnKind, WriteKind};

use dmem_store::{BucketLoc, Store, index_slot_bytes, slot_offset};
use dmem_verbs::PostList;

use crate::mvcc::{BlockShape, Meta};

/// Isolation level (Motor runs both).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isolation {
    /// Serializability: read-only records of a read-write transaction are validated at
    /// commit (strict serializability with [`crate::ts::SyncedClock`]).
    Serializable,
    /// Snapshot isolation: no validation of read-only records.
    Snapshot,
}

/// What a snapshot at start timestamp `s` finds in a record's cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pick {
    /// The cell of the largest committed version below `s`.
    pub visible: Option<usize>,
    /// A committed version at or after `s` exists (the record changed since `s`).
    pub newer: bool,
}

/// The version a snapshot at `s` reads (Motor: the largest version below the start
/// timestamp; timestamps are unique, so "below" and "at most" agree).
#[must_use]
pub fn pick(cells: &[CvtCell], s: u64) -> Pick {
    let mut p = Pick {
        visible: None,
        newer: false,
    };
    let mut best = 0;
    for (i, c) in cells.iter().enumerate() {
        if !c.is_committed() {
            continue;
        }
        let v = c.commit_version();
        if v >= s {
            p.newer = true;
        } else if p.visible.is_none() || v > best {
            best = v;
            p.visible = Some(i);
        }
    }
    p
}

/// How a read of one record's meta at snapshot `s` goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaOutcome {
    /// READ the image of this cell next.
    Image(usize),
    /// The record has no version at `s` (never inserted, or inserted later).
    Absent,
    /// Read the meta again (a read-only record locked by a writer, or a torn cell).
    Retry,
    /// Abort the transaction.
    Abort(AbortReason),
}

/// Decides after the meta READ of a record at snapshot `s`.
///
/// * A read-only record that is locked is read again: its writer may hold a commit
///   timestamp below `s` it has not installed yet.
/// * A locked (for-update) record with a committed version at or after `s` aborts the
///   transaction (Motor SR and SI: the first committer wins), unless `skip_newer_abort`
///   (a planted bug for the litmus suite).
/// * A snapshot whose version was evicted (only newer versions left, `floor` set) aborts.
#[must_use]
pub fn after_meta(meta: &Meta, s: u64, for_update: bool, skip_newer_abort: bool) -> MetaOutcome {
    if !meta.is_consistent() {
        return if for_update {
            MetaOutcome::Abort(AbortReason::TornVersionTableUnderLock)
        } else {
            MetaOutcome::Retry
        };
    }
    if !for_update && meta.lock != 0 {
        return MetaOutcome::Retry;
    }
    let p = pick(&meta.cells, s);
    if for_update && p.newer && !skip_newer_abort {
        return MetaOutcome::Abort(AbortReason::NewerThanStartTimestamp);
    }
    match p.visible {
        Some(i) => MetaOutcome::Image(i),
        None if meta.floor != 0 => MetaOutcome::Abort(AbortReason::SnapshotVersionCollected),
        None => MetaOutcome::Absent,
    }
}

/// Serializable validation of a read-only record at commit: valid iff it is not locked and
/// no version committed at or after `s` (a writer that locks it later takes a larger commit
/// timestamp than ours).
#[must_use]
pub fn still_valid(meta: &Meta, s: u64) -> bool {
    meta.is_consistent() && meta.lock == 0 && !pick(&meta.cells, s).newer
}

/// What a commit writes into one record's meta.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitPlan {
    /// The cell (and image) the new version goes to.
    pub cell: usize,
    /// The new cells.
    pub cells: Vec<CvtCell>,
    /// The new floor.
    pub floor: u64,
    /// Whether more than the one cell changed (an eviction or collected cells): the writer
    /// WRITEs floor + whole CVT instead of one cell.
    pub whole: bool,
}

/// Plans the install of version `c` whose image lives at `block + image_offset(cell)`:
/// cells committed before `horizon` (other than the newest) are cleared first (LOTUS §7.1
/// GC), then the new version takes a free cell, else overwrites the oldest (raising the
/// floor to the evicted version).
#[must_use]
pub fn plan_commit(meta: &Meta, shape: BlockShape, block: u64, c: u64, horizon: u64) -> CommitPlan {
    let mut cells = meta.cells.clone();
    let mut floor = meta.floor;
    let mut whole = false;
    let newest = cells
        .iter()
        .enumerate()
        .filter(|(_, x)| x.is_committed())
        .max_by_key(|(_, x)| x.commit_version())
        .map(|(i, _)| i);
    for (i, cell) in cells.iter_mut().enumerate() {
        if Some(i) != newest && cell.is_committed() && cell.commit_version() < horizon {
            floor = raise_floor(floor, cell.commit_version());
            // Keep the CVs so the next writer of this cell still steps them.
            *cell = free_with_cv(cell.head_cv());
            whole = true;
        }
    }
    let target = match cells.iter().position(|x| !x.is_valid()) {
        Some(i) => i,
        None => {
            let (i, oldest) = cells
                .iter()
                .enumerate()
                .min_by_key(|(_, x)| x.commit_version())
                .map(|(i, x)| (i, *x))
                .unwrap_or((0, CvtCell::FREE));
            floor = raise_floor(floor, oldest.commit_version());
            whole = true;
            i
        }
    };
    let old = cells[target];
    let addr = block + shape.image_offset(target) as u64;
    cells[target] = CvtCell::new(next_version(old.head_cv()), addr, c);
    CommitPlan {
        cell: target,
        cells,
        floor,
        whole,
    }
}

/// The floor after version `v` was evicted or collected. A floor of 0 means "nothing
/// evicted", and loaded records carry version 0, so collecting a loaded version raises the
/// floor to 1: a reader whose snapshot needed it then aborts ([`after_meta`]) instead of
/// taking the record as absent. (Found on the tcp fabric, where timestamps are real clock
/// readings and the loaded version is older than the GC horizon from the first commit on.)
fn raise_floor(floor: u64, v: u64) -> u64 {
    floor.max(v).max(1)
}

/// A free cell that keeps CV `cv` (layout of `dmem_layout::cvt`: head CV at byte 0, tail CV
/// at byte 31), so that the next version installed there gets `cv + 1` and a reader that
/// saw the collected version can never take the new image for it.
#[must_use]
pub fn free_with_cv(cv: u8) -> CvtCell {
    use zerocopy::TryFromBytes;
    let mut b = [0u8; 32];
    b[0] = cv;
    b[31] = cv;
    CvtCell::try_read_from_bytes(&b[..]).unwrap_or(CvtCell::FREE)
}

/// A write a transaction has staged on a record it holds (Motor and LOTUS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StagedOp {
    /// Install this value; the kind the history records (an insert over an absent record,
    /// else an update).
    Put(Vec<u8>, WriteKind),
    /// Install a tombstone.
    Delete,
}

impl StagedOp {
    /// What the op installs (`None`: a tombstone) and the kind the history records.
    #[must_use]
    pub fn as_write(&self) -> (Option<&[u8]>, WriteKind) {
        match self {
            Self::Put(v, k) => (Some(v.as_slice()), *k),
            Self::Delete => (None, WriteKind::Delete),
        }
    }
}

/// The op a record holds after a transaction stages `kind` (with `value`) on it, given the
/// op already staged (`prev`), whether the record is present as the transaction sees it
/// (`present`: its last staged op, else the version it read) and whether it existed when
/// read (`existed`). `None` when the writes cancel out (an insert then a delete of a
/// record that did not exist); `Err(())` when `kind` does not fit (an update or delete of
/// an absent record, an insert over a present one).
///
/// # Errors
/// `()` when `kind` does not fit the record's state.
#[allow(clippy::result_unit_err)]
pub fn stage_op(
    prev: Option<&StagedOp>,
    kind: WriteKind,
    value: &[u8],
    present: bool,
    existed: bool,
) -> Result<Option<StagedOp>, ()> {
    match (kind, present) {
        (WriteKind::Update, true) => Ok(Some(StagedOp::Put(
            value.to_vec(),
            match prev {
                Some(StagedOp::Put(_, k)) => *k,
                _ => WriteKind::Update,
            },
        ))),
        (WriteKind::Insert, false) => Ok(Some(StagedOp::Put(
            value.to_vec(),
            if existed {
                WriteKind::Update
            } else {
                WriteKind::Insert
            },
        ))),
        (WriteKind::Delete, true) => Ok(existed.then_some(StagedOp::Delete)),
        _ => Err(()),
    }
}

/// The value a write-set entry holds for its transaction: its staged op's, else the one
/// read under the lock (`current`).
#[must_use]
pub fn staged_value(op: Option<&StagedOp>, current: Option<&[u8]>) -> Option<Vec<u8>> {
    match op {
        None => current.map(<[u8]>::to_vec),
        Some(StagedOp::Put(v, _)) => Some(v.clone()),
        Some(StagedOp::Delete) => None,
    }
}

/// Stages `kind` (with `value`) on a write-set entry whose op is `op` and whose value read
/// under the lock is `current` ([`stage_op`] on the entry's state).
///
/// # Errors
/// [`TxnError::KeyState`] with `key` when `kind` does not fit the record's state.
pub fn restage(
    op: &mut Option<StagedOp>,
    current: Option<&[u8]>,
    kind: WriteKind,
    value: &[u8],
    key: u64,
) -> Result<(), TxnError> {
    let present = staged_value(op.as_ref(), current).is_some();
    *op = stage_op(op.as_ref(), kind, value, present, current.is_some())
        .map_err(|()| TxnError::KeyState(key))?;
    Ok(())
}

/// What a write must pass before it is staged: not in a read-only transaction, and (not a
/// delete) a value of the table's length (`value_len`, asked only then).
///
/// # Errors
/// [`TxnError::ReadOnly`], [`TxnError::ValueSize`], or `value_len`'s error.
pub fn check_write(
    txn: TxnKind,
    kind: WriteKind,
    value: &[u8],
    value_len: impl FnOnce() -> Result<usize, TxnError>,
) -> Result<(), TxnError> {
    if txn == TxnKind::ReadOnly {
        return Err(TxnError::ReadOnly);
    }
    let expected = value_len()?;
    if kind != WriteKind::Delete && value.len() != expected {
        return Err(TxnError::ValueSize {
            expected,
            got: value.len(),
        });
    }
    Ok(())
}

/// Adds to `list` the WRITEs that claim the free index slot `slot` of `bucket` for `key`,
/// whose block is at `block` (Motor's and LOTUS's inserts): the slot's key and packed block
/// address, on every live replica of the bucket.
///
/// # Errors
/// [`TxnError::Aborted`] when `block` is beyond what a packed address holds.
pub fn claim_slot(
    store: &Store,
    list: &mut PostList,
    bucket: BucketLoc,
    slot: usize,
    block: u64,
    key: u64,
) -> Result<(), TxnError> {
    let packed = dmem_layout::record::RemoteAddr::new(bucket.partition, block)
        .map_err(|_| TxnError::Aborted(AbortReason::OffsetBeyondPackedAddresses))?;
    let bytes = index_slot_bytes(key, packed);
    for mn in store.live_replicas(bucket.partition) {
        list.write(store.addr(mn, bucket.offset + slot_offset(slot)), &bytes);
    }
    Ok(())
}

/// What the READ of a record's CVT (chained after its lock CAS when read for update) shows
/// in a round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CvtRead {
    /// The lock CAS found the lock taken: abort (another writer holds the record).
    Locked,
    /// The CVT does not parse. If this transaction's CAS took the lock, the record joins
    /// the write set anyway so that the abort releases it.
    Unreadable,
    /// The CVT as read, to judge with [`after_meta`].
    Meta(Meta),
}

/// Judges a round's CVT READ: `cas` is what the lock CAS returned (`None`: no CAS, a
/// read-only record or the unsafe no-CAS mode), `bytes` the meta as read.
#[must_use]
pub fn after_cvt_read(cas: Option<u64>, bytes: &[u8], shape: BlockShape) -> CvtRead {
    if cas.is_some_and(|old| old != 0) {
        return CvtRead::Locked;
    }
    Meta::parse(bytes, shape).map_or(CvtRead::Unreadable, CvtRead::Meta)
}

/// What a round does with a version image it READ: `Ok(Some(_))` to use it, `Ok(None)` to
/// read the record again (a read-only record whose image was torn or overwritten since its
/// meta was read), `Err` to abort (a record read for update cannot change under its lock,
/// so a torn image there is an error; without the lock CAS it is plain bad luck).
///
/// # Errors
/// [`AbortReason::TornImageUnderLock`] or [`AbortReason::TornImage`].
pub fn after_image<P>(
    payload: Option<P>,
    for_update: bool,
    locked: bool,
) -> Result<Option<P>, AbortReason> {
    match payload {
        Some(p) => Ok(Some(p)),
        None if for_update && locked => Err(AbortReason::TornImageUnderLock),
        None if for_update => Err(AbortReason::TornImage),
        None => Ok(None),
    }
}

/// Whether a round may read its pending records once more after `rereads` repeated passes:
/// a read-only record found locked is read again (its writer may hold a commit timestamp
/// below `S`), but not forever.
///
/// # Errors
/// [`AbortReason::RecordStayedLocked`] past `max`.
pub fn may_reread(rereads: u32, max: u32) -> Result<(), AbortReason> {
    if rereads > max {
        Err(AbortReason::RecordStayedLocked)
    } else {
        Ok(())
    }
}

/// What a for-update access to a key absent from the index does (an insert claims a slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbsentKey {
    /// Claim the bucket's free slot (lock its block, write the slot).
    Claim,
    /// Read it as absent (validated at commit like any read).
    ReadAbsent,
    /// Abort: a slot of the bucket is half claimed, possibly by an insert of this key
    /// between its slot CAS and its slot WRITE; a retry finds the key or a settled bucket.
    HalfClaimed,
}

/// Decides for a key absent from the index: only a for-update access that `can_insert`
/// (a block is available: always in the slot-fixed layout, in a pooled table while the
/// coordinator's insert share has room) claims, and not while a slot is `being_claimed`
/// (asked only then).
pub fn absent_key(
    for_update: bool,
    can_insert: bool,
    being_claimed: impl FnOnce() -> Result<bool, TxnError>,
) -> Result<AbsentKey, TxnError> {
    if !(for_update && can_insert) {
        return Ok(AbsentKey::ReadAbsent);
    }
    Ok(if being_claimed()? {
        AbsentKey::HalfClaimed
    } else {
        AbsentKey::Claim
    })
}

/// Whether an insert's lock batch CASes the index slot's address word (empty -> its
/// block) instead of READing the slot: in a pooled table each insert locks a block of its
/// own, so only the slot can arbitrate; in a slot-fixed one the block's lock CAS does. The
/// unsafe no-CAS mode takes no CAS at all.
#[must_use]
pub const fn claims_slot_by_cas(pooled: bool, unsafe_no_cas: bool) -> bool {
    pooled && !unsafe_no_cas
}

/// What an insert's lock batch saw of the index slot: the slot CAS's old word (`cas`), or
/// the slot's 16 bytes (`read`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotSeen<'a> {
    /// The address word the slot CAS found (0: won).
    Cas(u64),
    /// The slot as READ.
    Read(&'a [u8]),
    /// Neither (a batch that did not look at the slot).
    Unseen,
}

/// Judges the slot an insert of `key` claims: `Ok(true)` if it already names a record
/// (this key's: nothing to write), `Ok(false)` if the insert must WRITE it to every
/// replica ([`claim_slot`]).
///
/// # Errors
/// Another insert holds the slot (a retry finds what it names), or it was not seen.
pub fn slot_used(seen: SlotSeen<'_>, key: u64) -> Result<bool, AbortReason> {
    match seen {
        // A won CAS set only the primary's address word: the slot is still written.
        SlotSeen::Cas(0) => Ok(false),
        SlotSeen::Cas(_) => Err(AbortReason::IndexSlotTakenByConcurrentInsert),
        SlotSeen::Read(sb) => {
            let slot_key = u64::from_le_bytes(sb[..8].try_into().unwrap_or([0; 8]));
            let used = sb[8..16].iter().any(|&b| b != 0);
            if used && slot_key != key {
                return Err(AbortReason::IndexSlotTakenByConcurrentInsert);
            }
            Ok(used)
        }
        SlotSeen::Unseen => Err(AbortReason::IndexSlotNotSeen),
    }
}

/// The MNs a commit WRITEs a record's unlock to (Motor's `commit.cc`, `WriteReplica`): the
/// primary last, and with Motor's delta layout (a record the commit installs) every other
/// live replica first, as Motor puts the unlock into every replica's doorbell (a backup's
/// lock word is never taken, so it only costs a WRITE). LOTUS's full records (LOTUS §4.4)
/// unlock the primary alone.
#[must_use]
pub fn unlock_mns(deltas: bool, installs: bool, primary: u16, live: &[u16]) -> Vec<u16> {
    let mut mns: Vec<u16> = if deltas && installs {
        live.iter().copied().filter(|&mn| mn != primary).collect()
    } else {
        Vec::new()
    };
    mns.push(primary);
    mns
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(cells: &[(u64, u8)], lock: u64) -> Meta {
        Meta {
            lock,
            floor: 0,
            key: 1,
            cells: cells
                .iter()
                .map(|&(v, cv)| {
                    if v == u64::MAX - 1 {
                        CvtCell::FREE
                    } else {
                        CvtCell::new(cv, 0x1000, v)
                    }
                })
                .collect(),
        }
    }
    const FREE: (u64, u8) = (u64::MAX - 1, 0);

    #[test]
    fn snapshot_reads_and_aborts() {
        let m = meta(&[(10, 1), (20, 1), FREE], 0);
        assert_eq!(after_meta(&m, 15, false, false), MetaOutcome::Image(0));
        assert_eq!(after_meta(&m, 25, false, false), MetaOutcome::Image(1));
        assert_eq!(after_meta(&m, 5, false, false), MetaOutcome::Absent);
        // for update: a version at or after the start timestamp aborts (SR and SI)...
        assert!(matches!(
            after_meta(&m, 15, true, false),
            MetaOutcome::Abort(_)
        ));
        // ...unless the planted bug skips the check.
        assert_eq!(after_meta(&m, 15, true, true), MetaOutcome::Image(0));
        assert_eq!(after_meta(&m, 25, true, false), MetaOutcome::Image(1));
        // a locked record is read again by a snapshot reader
        let locked = meta(&[(10, 1)], 7);
        assert_eq!(after_meta(&locked, 15, false, false), MetaOutcome::Retry);
        assert!(!still_valid(&locked, 15));
        assert!(still_valid(&meta(&[(10, 1)], 0), 15));
        assert!(!still_valid(&meta(&[(10, 1), (16, 1)], 0), 15));
        // an evicted snapshot aborts instead of reading as absent
        let mut ev = meta(&[(30, 1), (40, 1)], 0);
        ev.floor = 20;
        assert!(matches!(
            after_meta(&ev, 25, false, false),
            MetaOutcome::Abort(_)
        ));
    }

    #[test]
    fn commit_takes_free_then_oldest_and_collects() {
        let shape = BlockShape::new(3, 8);
        let m = meta(&[(10, 1), FREE, (20, 4)], 0);
        let p = plan_commit(&m, shape, 0x4000, 30, 0);
        assert_eq!((p.cell, p.whole, p.floor), (1, false, 0));
        assert_eq!(p.cells[1].commit_version(), 30);
        assert_eq!(p.cells[1].head_cv(), 1);
        assert_eq!(p.cells[1].address(), 0x4000 + shape.image_offset(1) as u64);
        let full = meta(&[(10, 1), (5, 9), (20, 4)], 0);
        let p = plan_commit(&full, shape, 0, 30, 0);
        assert_eq!((p.cell, p.whole, p.floor), (1, true, 5));
        assert_eq!(p.cells[1].head_cv(), 10);
        // GC: versions below the horizon other than the newest are cleared first.
        let p = plan_commit(&full, shape, 0, 30, 15);
        assert!(p.whole);
        assert_eq!(p.floor, 10);
        assert_eq!(p.cell, 0);
        assert!(!p.cells[1].is_valid());
        assert_eq!(p.cells[1].head_cv(), 9, "a collected cell keeps its CV");
        assert_eq!(p.cells[2].commit_version(), 20);
        // Collecting or evicting a loaded version (commit 0) still raises the floor, so a
        // snapshot that needed it aborts rather than reading the record as absent.
        let loaded = meta(&[(0, 1), (40, 2)], 0);
        let p = plan_commit(&loaded, BlockShape::new(2, 8), 0, 50, 45);
        assert_eq!((p.cell, p.floor), (0, 1));
        let mut after = loaded.clone();
        after.cells = p.cells;
        after.floor = p.floor;
        assert!(matches!(
            after_meta(&after, 30, false, false),
            MetaOutcome::Abort(_)
        ));
        let p = plan_commit(&loaded, BlockShape::new(2, 8), 0, 50, 0);
        assert_eq!((p.cell, p.floor), (0, 1), "evicting version 0");
    }

    #[test]
    fn staging_follows_the_record_state() {
        use super::{StagedOp, stage_op};
        let v = [7u8; 4];
        // Update of a present record keeps an earlier insert's kind.
        assert_eq!(
            stage_op(None, WriteKind::Update, &v, true, true),
            Ok(Some(StagedOp::Put(v.to_vec(), WriteKind::Update)))
        );
        let ins = StagedOp::Put(v.to_vec(), WriteKind::Insert);
        assert_eq!(
            stage_op(Some(&ins), WriteKind::Update, &v, true, false),
            Ok(Some(ins.clone()))
        );
        // Insert over an absent record: an insert, or an update of a record deleted here.
        assert_eq!(
            stage_op(None, WriteKind::Insert, &v, false, false),
            Ok(Some(ins))
        );
        assert_eq!(
            stage_op(Some(&StagedOp::Delete), WriteKind::Insert, &v, false, true),
            Ok(Some(StagedOp::Put(v.to_vec(), WriteKind::Update)))
        );
        // Delete: a tombstone if the record existed, nothing if inserted here.
        assert_eq!(
            stage_op(None, WriteKind::Delete, &[], true, true),
            Ok(Some(StagedOp::Delete))
        );
        assert_eq!(
            stage_op(None, WriteKind::Delete, &[], true, false),
            Ok(None)
        );
        // What does not fit the state.
        assert_eq!(stage_op(None, WriteKind::Update, &v, false, false), Err(()));
        assert_eq!(stage_op(None, WriteKind::Insert, &v, true, true), Err(()));
        assert_eq!(stage_op(None, WriteKind::Delete, &[], false, true), Err(()));
    }

    #[test]
    fn cvt_read_judges_lock_then_parse() {
        let shape = BlockShape::new(2, 8);
        let mut bytes = vec![0u8; shape.meta_len()];
        assert_eq!(after_cvt_read(Some(7), &bytes, shape), CvtRead::Locked);
        assert_eq!(
            after_cvt_read(None, &bytes[..4], shape),
            CvtRead::Unreadable,
            "short"
        );
        let m = Meta::parse(&bytes, shape).expect("a zeroed meta parses");
        assert_eq!(
            after_cvt_read(Some(0), &bytes, shape),
            CvtRead::Meta(m.clone())
        );
        assert_eq!(after_cvt_read(None, &bytes, shape), CvtRead::Meta(m));
        bytes.truncate(shape.meta_len() - 1);
        assert_eq!(
            after_cvt_read(Some(0), &bytes, shape),
            CvtRead::Unreadable,
            "won the lock, but the CVT is cut"
        );
    }

    #[test]
    fn a_torn_image_is_reread_only_without_update() {
        assert_eq!(after_image(Some(3), true, true), Ok(Some(3)));
        assert_eq!(after_image::<u8>(None, false, true), Ok(None));
        assert_eq!(
            after_image::<u8>(None, true, true),
            Err(AbortReason::TornImageUnderLock)
        );
        assert_eq!(
            after_image::<u8>(None, true, false),
            Err(AbortReason::TornImage)
        );
        assert_eq!(may_reread(32, 32), Ok(()));
        assert_eq!(may_reread(33, 32), Err(AbortReason::RecordStayedLocked));
    }

    #[test]
    fn an_absent_key_is_claimed_only_for_update_with_room() {
        let never = || -> Result<bool, TxnError> { panic!("asked without need") };
        assert_eq!(absent_key(false, false, never), Ok(AbsentKey::ReadAbsent));
        assert_eq!(absent_key(true, false, never), Ok(AbsentKey::ReadAbsent));
        assert_eq!(absent_key(true, true, || Ok(false)), Ok(AbsentKey::Claim));
        assert_eq!(
            absent_key(true, true, || Ok(true)),
            Ok(AbsentKey::HalfClaimed)
        );
        assert_eq!(
            absent_key(true, true, || Err(TxnError::KeyState(1))),
            Err(TxnError::KeyState(1))
        );
        assert!(claims_slot_by_cas(true, false));
        assert!(!claims_slot_by_cas(false, false));
        assert!(!claims_slot_by_cas(true, true));
    }

    #[test]
    fn the_claimed_slot_is_judged_by_its_cas_or_its_bytes() {
        assert_eq!(slot_used(SlotSeen::Cas(0), 5), Ok(false));
        assert_eq!(
            slot_used(SlotSeen::Cas(0x40), 5),
            Err(AbortReason::IndexSlotTakenByConcurrentInsert)
        );
        let slot = |key: u64, addr: u64| {
            let mut b = key.to_le_bytes().to_vec();
            b.extend_from_slice(&addr.to_le_bytes());
            b
        };
        assert_eq!(slot_used(SlotSeen::Read(&slot(0, 0)), 5), Ok(false), "free");
        assert_eq!(
            slot_used(SlotSeen::Read(&slot(5, 0x40)), 5),
            Ok(true),
            "this key's"
        );
        assert_eq!(
            slot_used(SlotSeen::Read(&slot(6, 0x40)), 5),
            Err(AbortReason::IndexSlotTakenByConcurrentInsert)
        );
        assert_eq!(
            slot_used(SlotSeen::Unseen, 5),
            Err(AbortReason::IndexSlotNotSeen)
        );
    }

    #[test]
    fn unlocks_go_to_every_replica_only_for_an_install_with_deltas() {
        let live = [0, 1, 2];
        assert_eq!(unlock_mns(true, true, 1, &live), [0, 2, 1], "primary last");
        assert_eq!(unlock_mns(true, false, 1, &live), [1]);
        assert_eq!(unlock_mns(false, true, 1, &live), [1]);
        assert_eq!(unlock_mns(true, true, 1, &[1]), [1]);
    }
}
