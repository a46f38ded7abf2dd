//! The execution pieces Motor's transaction and LOTUS's share (LOTUS §4: its transaction
//! is Motor's MVCC execution with CN-side locks in front): the read and write sets (local
//! answers, staging, the reads noted for the history and the history record), the bucket
//! READs that locate records, the READs and decoding of the versions chosen, and a commit's
//! new version of a record with its WRITEs to every replica. What differs stays in each
//! protocol's `txn`: Motor's lock CAS and validation, LOTUS's CN-side locks, its `INVISIBLE`
//! commit and version table cache.
//!
//! The sets are generic over what each protocol keeps beside a record: Motor notes where a
//! read-only record was found (for its SR validation) and whether it holds the block's
//! lock word; LOTUS keeps its locks on the CNs and needs neither.

use std::cell::RefCell;

use dmem_store::{AddressCache, BucketLoc, ItemLoc, Store, parse_bucket};
use dmem_txn::{
    AbortReason, Access, Key, ReadEvent, ReadReq, TableId, TxnError, TxnId, TxnOutcome, TxnRecord,
    Version, WriteEvent, WriteKind,
};
use dmem_verbs::{Nanos, PostList, RemoteAddr, Verbs, WrId};

use crate::logic::{self, CommitPlan, StagedOp};
use crate::mvcc::{self, BlockShape, CELL_LEN, FLOOR_OFFSET, Meta, Payload, unpack_writer};

/// A record read without update: its value as read and what the protocol keeps with it.
#[derive(Debug, Clone)]
pub struct ReadEntry<X> {
    /// Its table.
    pub table: TableId,
    /// Its key.
    pub key: Key,
    /// The value read (`None`: absent).
    pub value: Option<Vec<u8>>,
    /// The protocol's own (Motor: where it was found, for validation).
    pub at: X,
}

/// A record read for update: where it is, its meta as read, its current value and the op
/// the transaction staged on it.
#[derive(Debug, Clone)]
pub struct WriteEntry<X> {
    /// Its table.
    pub table: TableId,
    /// Its key.
    pub key: Key,
    /// Its block.
    pub loc: ItemLoc,
    /// Its meta (CVT) as read.
    pub meta: Meta,
    /// The value read (`None`: absent, or not read yet).
    pub current: Option<Vec<u8>>,
    /// The installer of `current` (0: loaded, or absent).
    pub current_writer: u64,
    /// The op staged on it.
    pub op: Option<StagedOp>,
    /// The protocol's own (Motor: whether it holds the block's lock word).
    pub lock: X,
}

impl<X> WriteEntry<X> {
    /// A record just read for update, nothing read of its value or staged yet.
    #[must_use]
    pub fn new(table: TableId, key: Key, loc: ItemLoc, meta: Meta, lock: X) -> Self {
        Self {
            table,
            key,
            loc,
            meta,
            current: None,
            current_writer: 0,
            op: None,
            lock,
        }
    }

    /// What installing the staged op as version `version` (by the packed `writer`) takes,
    /// cells committed before `horizon` collected ([`logic::plan_commit`]); `None` without
    /// a staged op. A block whose meta names another key (left by an inserter that
    /// crashed, or never used) gets its floor and whole CVT written.
    #[must_use]
    pub fn new_version(
        &self,
        shape: BlockShape,
        version: u64,
        horizon: u64,
        writer: u64,
    ) -> Option<NewVersion> {
        let op = self.op.as_ref()?;
        let mut plan = logic::plan_commit(&self.meta, shape, self.loc.offset, version, horizon);
        plan.whole |= self.meta.key != self.key.0;
        let cell = plan.cells[plan.cell];
        let (value, kind) = op.as_write();
        let images = mvcc::install_images(
            shape,
            plan.cell,
            cell.head_cv(),
            version,
            writer,
            value,
            self.current_writer,
            self.current.as_deref(),
        );
        let meta_tail =
            mvcc::encode_meta_tail(self.key.0, self.table, shape, plan.floor, &plan.cells);
        Some(NewVersion {
            plan,
            images,
            meta_tail,
            kind,
        })
    }

    /// The value the transaction sees: its staged op's, else the one read.
    #[must_use]
    pub fn value(&self) -> Option<Vec<u8>> {
        logic::staged_value(self.op.as_ref(), self.current.as_deref())
    }
}

/// A new version of a record a commit installs ([`WriteEntry::new_version`]).
#[derive(Debug, Clone)]
pub struct NewVersion {
    /// Where it goes and the CVT after it.
    pub plan: CommitPlan,
    /// What it WRITEs into the block besides the CVT ([`mvcc::install_images`]).
    pub images: Vec<(u64, Vec<u8>)>,
    /// The encoded meta from [`FLOOR_OFFSET`] on.
    pub meta_tail: Vec<u8>,
    /// The kind the history records.
    pub kind: WriteKind,
}

/// A transaction's read set, write set and the reads it notes for the history.
#[derive(Debug, Clone)]
pub struct ExecSets<R, W> {
    /// Records read without update.
    pub reads: Vec<ReadEntry<R>>,
    /// Records read for update.
    pub writes: Vec<WriteEntry<W>>,
    /// The reads the history records.
    pub events: Vec<ReadEvent>,
}

impl<R, W> Default for ExecSets<R, W> {
    fn default() -> Self {
        Self {
            reads: Vec::new(),
            writes: Vec::new(),
            events: Vec::new(),
        }
    }
}

impl<R: Clone, W> ExecSets<R, W> {
    /// The write entry of `(table, key)`.
    #[must_use]
    pub fn write_entry(&self, table: TableId, key: Key) -> Option<usize> {
        self.writes
            .iter()
            .position(|w| w.table == table && w.key == key)
    }

    /// The answer to `r` without a verb: a record read for update answers any access, a
    /// record read without update answers a read.
    #[must_use]
    pub fn local(&self, r: &ReadReq) -> Option<Option<Vec<u8>>> {
        if let Some(i) = self.write_entry(r.table, r.key) {
            return Some(self.writes[i].value());
        }
        if r.access == Access::Read {
            return self
                .reads
                .iter()
                .find(|e| e.table == r.table && e.key == r.key)
                .map(|e| e.value.clone());
        }
        None
    }

    /// Notes a read of `version` of `(table, key)`, installed by the packed `writer` (0:
    /// loaded, or absent).
    pub fn note(&mut self, table: TableId, key: Key, version: u64, writer: u64) {
        let mut ev = ReadEvent::new(table, key, Version(version));
        if let Some(w) = unpack_writer(writer) {
            ev = ev.written_by(w);
        }
        self.events.push(ev);
    }

    /// The history's record of the transaction `id` (`begin` to `end`, `outcome`,
    /// installing `writes`), with the reads noted so far (taken: noted once).
    #[must_use]
    pub fn take_record(
        &mut self,
        id: TxnId,
        begin: Nanos,
        end: Nanos,
        outcome: TxnOutcome,
        writes: Vec<WriteEvent>,
    ) -> TxnRecord {
        TxnRecord {
            id,
            begin,
            end,
            outcome,
            reads: std::mem::take(&mut self.events),
            writes,
        }
    }

    /// Stages `kind` (with `value`) on `(table, key)`, which the transaction read for
    /// update before.
    ///
    /// # Errors
    /// No write entry (the key was read as absent with no block to claim: a pooled table
    /// without insert room): [`TxnError::KeyState`] for an update or delete, as on any
    /// absent key, an abort for an insert; `kind` does not fit the record's state
    /// ([`logic::restage`]).
    pub fn stage(
        &mut self,
        table: TableId,
        key: Key,
        value: &[u8],
        kind: WriteKind,
    ) -> Result<(), TxnError> {
        let Some(i) = self.write_entry(table, key) else {
            return Err(if kind == WriteKind::Insert {
                TxnError::Aborted(AbortReason::RecordPoolShareUsedUp)
            } else {
                TxnError::KeyState(key.0)
            });
        };
        let w = &mut self.writes[i];
        logic::restage(&mut w.op, w.current.as_deref(), kind, value, key.0)
    }

    /// `(table, key)` was found absent (no version visible, or not in the index): noted,
    /// and kept in the read set with `at` if given (not for a record read for update, whose
    /// write entry keeps it).
    pub fn read_absent(&mut self, table: TableId, key: Key, at: Option<R>) {
        if let Some(at) = at {
            self.reads.push(ReadEntry {
                table,
                key,
                value: None,
                at,
            });
        }
        self.note(table, key, 0, 0);
    }

    /// Version `version` of `(table, key)` was read (`value`, installed by `writer`):
    /// noted, and kept as the current value of its write entry if it was read for update,
    /// else in the read set (with `at`).
    #[allow(clippy::too_many_arguments)]
    pub fn read_version(
        &mut self,
        table: TableId,
        key: Key,
        access: Access,
        at: R,
        version: u64,
        writer: u64,
        value: Option<&[u8]>,
    ) {
        self.note(table, key, version, writer);
        if access == Access::ForUpdate {
            if let Some(i) = self.write_entry(table, key) {
                self.writes[i].current = value.map(<[u8]>::to_vec);
                self.writes[i].current_writer = writer;
            }
        } else {
            self.reads.push(ReadEntry {
                table,
                key,
                value: value.map(<[u8]>::to_vec),
                at,
            });
        }
    }
}

/// The address of `offset` in the block at `loc` on its partition's primary.
///
/// # Errors
/// A partition the store does not know.
pub fn primary_addr(store: &Store, loc: &ItemLoc, offset: u64) -> Result<RemoteAddr, TxnError> {
    let p = store
        .primary(loc.bucket.partition)
        .map_err(TxnError::from)?;
    Ok(store.addr(p, loc.offset + offset))
}

/// What a bucket READ says of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// In the index: its block (now in the address cache).
    Found(ItemLoc),
    /// Not in the index: the bucket's first free slot and its used `(slot, key)`s.
    Absent {
        /// The first free slot.
        free: Option<usize>,
        /// The used slots and their keys.
        used: Vec<(usize, u64)>,
    },
}

/// Locates the records `wanted` (`(n, table, key)`, `n` the caller's own index): one
/// bucket READ each at its primary, every MN at once in one post list (none when `wanted`
/// is empty). A key found is put into `cache`. The answers keep `wanted`'s order.
///
/// # Errors
/// A table or partition the store does not know; the verbs' failure.
pub async fn locate<V: Verbs>(
    ctx: &V,
    store: &Store,
    cache: &RefCell<AddressCache>,
    wanted: &[(usize, TableId, Key)],
) -> Result<Vec<(usize, BucketLoc, Lookup)>, TxnError> {
    let mut list = PostList::new();
    let mut reads = Vec::new();
    for &(n, table, key) in wanted {
        let bucket = store.bucket_of(table, key).map_err(TxnError::from)?;
        let p = store.primary(bucket.partition).map_err(TxnError::from)?;
        let wr = list.read(store.addr(p, bucket.offset), bucket.read_len());
        reads.push((n, table, key, bucket, wr));
    }
    if reads.is_empty() {
        return Ok(Vec::new());
    }
    let res = ctx.post(list).await?;
    let mut out = Vec::with_capacity(reads.len());
    for (n, table, key, bucket, wr) in reads {
        let (used, free) = parse_bucket(res.bytes(wr));
        let lookup = match used.iter().find(|(_, k)| *k == key.0) {
            Some(&(slot, _)) => {
                let loc = store
                    .item_in_bucket(bucket, slot, res.bytes(wr))
                    .map_err(TxnError::from)?;
                cache.borrow_mut().put(table, key, loc);
                Lookup::Found(loc)
            }
            None => Lookup::Absent { free, used },
        };
        out.push((n, bucket, lookup));
    }
    Ok(out)
}

/// A version a round reads: the caller's index, the record's block, its shape, its meta as
/// read and the cell of the version chosen ([`logic::after_meta`]).
pub type VersionPick = (usize, ItemLoc, BlockShape, Meta, usize);

/// Reads the versions `picks` from their primaries in one post list (its READs from
/// [`mvcc::version_reads`]: the image with full records; the value and the newer deltas
/// with Motor's deltas) and decodes them: per pick, in order, its index, block, commit
/// version and content (`None`: torn, or overwritten since its meta was read).
///
/// # Errors
/// A partition the store does not know; the verbs' failure.
pub async fn read_versions<V: Verbs>(
    ctx: &V,
    store: &Store,
    picks: Vec<VersionPick>,
) -> Result<Vec<(usize, ItemLoc, u64, Option<Payload>)>, TxnError> {
    let mut list = PostList::new();
    let mut ids = Vec::with_capacity(picks.len());
    for (n, loc, shape, meta, i) in picks {
        let p = store
            .primary(loc.bucket.partition)
            .map_err(TxnError::from)?;
        let wrs: Vec<WrId> = mvcc::version_reads(shape, &meta, loc.offset, i)
            .into_iter()
            .map(|(at, len)| list.read(store.addr(p, at), len as u32))
            .collect();
        ids.push((n, loc, shape, meta, i, wrs));
    }
    let res = ctx.post(list).await?;
    Ok(ids
        .into_iter()
        .map(|(n, loc, shape, meta, i, wrs)| {
            let parts: Vec<&[u8]> = wrs.iter().map(|&wr| res.bytes(wr)).collect();
            let version = meta.cells[i].commit_version();
            (
                n,
                loc,
                version,
                mvcc::decode_version(shape, &meta, i, &parts),
            )
        })
        .collect())
}

/// The WRITEs that install the new version `new` of the record at `loc` on every live
/// replica, in order: per replica, its images, then its new cell (or, when the plan says
/// `whole`, the floor and the whole CVT).
pub fn install_writes(
    store: &Store,
    loc: ItemLoc,
    shape: BlockShape,
    new: &NewVersion,
    mut write: impl FnMut(RemoteAddr, &[u8]),
) {
    let (plan, meta_tail) = (&new.plan, &new.meta_tail);
    for mn in store.live_replicas(loc.bucket.partition) {
        let at = |o: u64| store.addr(mn, loc.offset + o);
        for (o, bytes) in &new.images {
            write(at(*o), bytes);
        }
        if plan.whole {
            write(at(FLOOR_OFFSET), meta_tail);
        } else {
            let o = shape.cell_offset(plan.cell);
            let from = o - FLOOR_OFFSET as usize;
            write(at(o as u64), &meta_tail[from..from + CELL_LEN]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmem_txn::{CoordinatorId, TxnId};

    use crate::mvcc::pack_writer;

    fn loc() -> ItemLoc {
        ItemLoc {
            bucket: BucketLoc {
                table: TableId(0),
                partition: 0,
                bucket: 0,
                offset: 0,
                slots: 7,
            },
            slot: 0,
            offset: 4096,
        }
    }

    #[test]
    fn reads_and_writes_answer_locally() {
        let (t, a, b) = (TableId(1), Key(1), Key(2));
        let mut sets: ExecSets<u8, ()> = ExecSets::default();
        sets.writes
            .push(WriteEntry::new(t, a, loc(), Meta::empty(2), ()));
        let writer = pack_writer(TxnId {
            coordinator: CoordinatorId(3),
            seq: 7,
        });
        sets.read_version(t, a, Access::ForUpdate, 9, 5, writer, Some(b"old"));
        sets.read_version(t, b, Access::Read, 9, 4, 0, Some(b"ro"));
        assert_eq!(sets.writes[0].current.as_deref(), Some(&b"old"[..]));
        assert_eq!(sets.writes[0].current_writer, writer);
        assert_eq!(sets.reads.len(), 1);
        assert_eq!(sets.reads[0].at, 9);
        assert_eq!(sets.events.len(), 2);
        assert_eq!(sets.local(&ReadReq::read(t, b)), Some(Some(b"ro".to_vec())));
        // A record read without update does not answer a for-update access.
        assert_eq!(sets.local(&ReadReq::for_update(t, b)), None);
        sets.stage(t, a, b"new", WriteKind::Update).unwrap();
        assert_eq!(
            sets.local(&ReadReq::read(t, a)),
            Some(Some(b"new".to_vec()))
        );
        sets.stage(t, a, &[], WriteKind::Delete).unwrap();
        assert_eq!(sets.local(&ReadReq::read(t, a)), Some(None));
    }

    #[test]
    fn absent_reads_and_missing_write_entries() {
        let (t, k) = (TableId(1), Key(5));
        let mut sets: ExecSets<(), ()> = ExecSets::default();
        sets.read_absent(t, k, None);
        assert!(sets.reads.is_empty());
        sets.read_absent(t, k, Some(()));
        assert_eq!(sets.local(&ReadReq::read(t, k)), Some(None));
        assert_eq!(sets.events.len(), 2);
        assert!(matches!(
            sets.stage(t, k, b"v", WriteKind::Update),
            Err(TxnError::KeyState(5))
        ));
        assert!(matches!(
            sets.stage(t, k, b"v", WriteKind::Insert),
            Err(TxnError::Aborted(_))
        ));
    }
}
