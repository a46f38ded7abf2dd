//! A FORD/Pandora transaction's state as plain data, and every decision over it that needs
//! no fabric: what a round answers locally, which validation READs to post and how to
//! judge what they return, the log images (Pandora §3.1.4, FORD's undo logs), the commit
//! and release WRITEs, the abort path's truncation and unlocks. The async shell
//! ([`crate::txn`]) posts what these build and feeds back what came back.

use dmem_layout::log::{DataLogEntry, LogOp, LogRegionHeader, LogWriter};
use dmem_layout::pill::FailedCoordinatorSet;
use dmem_layout::record::{
    DataItem, DataItemHeader, DataVersion, ItemFlags, RemoteAddr as PackedAddr,
};
use dmem_txn::{
    AbortReason, Access, CoordinatorId, Key, ReadEvent, ReadReq, TableId, TxnError, TxnId, Version,
    WriteEvent, WriteKind,
};
use dmem_verbs::{PostList, RemoteAddr, WrId};

use crate::config::{FordBug, Protocol, ProtocolConfig};
use crate::logic::{self, LoggedTxn, LoggedWrite};
use crate::store::{BucketLoc, ItemLoc, Store, encode_item_by, parse_bucket};
use crate::wire;

/// What the state's decisions need to know about the coordinator running the transaction.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Env<'a> {
    pub(crate) store: &'a Store,
    pub(crate) cfg: &'a ProtocolConfig,
    pub(crate) coordinator: u16,
    pub(crate) epoch: u64,
    pub(crate) seq: u64,
}

pub(crate) struct ItemRead {
    pub(crate) lock: u64,
    pub(crate) version: DataVersion,
    pub(crate) valid: bool,
    pub(crate) value: Vec<u8>,
    /// The transaction that installed the version (`None`: loaded, or unknown).
    pub(crate) writer: Option<TxnId>,
}

pub(crate) fn parse_item(bytes: &[u8], table: TableId, key: Key) -> Result<ItemRead, TxnError> {
    let item =
        DataItem::new_checked(bytes).map_err(|_| TxnError::Aborted(AbortReason::MalformedItem))?;
    let h = item.header();
    let fresh = h.key() == 0 && h.table_id() == 0 && !h.flags().is_valid();
    if !fresh && (h.key() != key.0 || h.table_id() != table.0) {
        return Err(TxnError::Aborted(AbortReason::IndexPointsAtAnotherRecord));
    }
    Ok(ItemRead {
        lock: h.lock_word(),
        version: h.version(),
        valid: h.flags().is_valid() && !h.version().is_invisible(),
        value: item.value().to_vec(),
        writer: DataItemHeader::unpack_writer(h.writer()).map(|(c, seq)| TxnId {
            coordinator: CoordinatorId(u32::from(c)),
            seq,
        }),
    })
}

/// The current primary's address of `loc`.
pub(crate) fn primary_addr(store: &Store, loc: &ItemLoc) -> Result<RemoteAddr, TxnError> {
    let p = store
        .primary(loc.bucket.partition)
        .map_err(TxnError::from)?;
    Ok(store.addr(p, loc.offset))
}

#[derive(Debug, Clone)]
pub(crate) enum ReadTarget {
    Item { loc: ItemLoc, version: u64 },
    Absent { bucket: BucketLoc },
}

#[derive(Debug, Clone)]
pub(crate) struct ReadEntry {
    pub(crate) table: TableId,
    pub(crate) key: Key,
    pub(crate) target: ReadTarget,
    pub(crate) value: Option<Vec<u8>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockState {
    /// Blind write: the lock is taken at commit.
    Deferred,
    Held,
    /// The CAS failed: never held (complicit abort releases it anyway).
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Intent {
    /// Locked by read_for_update, not written (yet).
    LockOnly,
    Write(WriteKind),
}

#[derive(Debug, Clone)]
pub(crate) struct OldImage {
    pub(crate) version: DataVersion,
    pub(crate) valid: bool,
    pub(crate) value: Vec<u8>,
}

#[derive(Debug, Clone)]
pub(crate) struct WriteEntry {
    pub(crate) table: TableId,
    pub(crate) key: Key,
    pub(crate) loc: ItemLoc,
    pub(crate) lock: LockState,
    pub(crate) intent: Intent,
    pub(crate) old: Option<OldImage>,
    pub(crate) new_value: Vec<u8>,
}

/// A transaction's read set, write set, recorded reads and log bookkeeping.
#[derive(Debug, Default)]
pub(crate) struct TxnState {
    pub(crate) reads: Vec<ReadEntry>,
    pub(crate) writes: Vec<WriteEntry>,
    pub(crate) events: Vec<ReadEvent>,
    /// MN indices holding a valid log of this transaction.
    pub(crate) logged: Vec<u16>,
    /// Addresses in this transaction's lock log (traditional lock logging only).
    pub(crate) lock_log: Vec<PackedAddr>,
    /// Keys a round found absent, with their bucket and its first free slot then, for an
    /// insert that follows.
    pub(crate) absent: Vec<(TableId, Key, BucketLoc, Option<usize>)>,
}

impl TxnState {
    /// Remembers that a round found `(table, key)` absent in `bucket`.
    pub(crate) fn note_absent(
        &mut self,
        table: TableId,
        key: Key,
        bucket: BucketLoc,
        free: Option<usize>,
    ) {
        self.absent.retain(|a| (a.0, a.1) != (table, key));
        self.absent.push((table, key, bucket, free));
    }

    /// What a round saw of an absent key, once.
    pub(crate) fn take_absent(
        &mut self,
        table: TableId,
        key: Key,
    ) -> Option<(BucketLoc, Option<usize>)> {
        let i = self
            .absent
            .iter()
            .position(|a| (a.0, a.1) == (table, key))?;
        let (_, _, bucket, free) = self.absent.swap_remove(i);
        Some((bucket, free))
    }

    pub(crate) fn write_entry(&self, table: TableId, key: Key) -> Option<usize> {
        self.writes
            .iter()
            .position(|w| w.table == table && w.key == key)
    }
    pub(crate) fn current_value(&self, w: &WriteEntry) -> Option<Vec<u8>> {
        match w.intent {
            Intent::Write(WriteKind::Delete) => None,
            Intent::Write(_) => Some(w.new_value.clone()),
            Intent::LockOnly => w.old.as_ref().filter(|o| o.valid).map(|o| o.value.clone()),
        }
    }
    /// Records a read for the history: the version's counter and, when the item named it,
    /// the transaction that installed it.
    pub(crate) fn note_read(
        &mut self,
        table: TableId,
        key: Key,
        version: u64,
        writer: Option<TxnId>,
    ) {
        let event = ReadEvent::new(table, key, Version(version));
        self.events.push(match writer {
            Some(w) => event.written_by(w),
            None => event,
        });
    }
    pub(crate) fn push_lock_entry(
        &mut self,
        table: TableId,
        key: Key,
        loc: ItemLoc,
        item: &ItemRead,
    ) -> usize {
        let old = Some(OldImage {
            version: item.version,
            valid: item.valid,
            value: item.value.clone(),
        });
        if let Some(i) = self.write_entry(table, key) {
            self.writes[i].old = old;
            return i;
        }
        self.writes.push(WriteEntry {
            table,
            key,
            loc,
            lock: LockState::Failed,
            intent: Intent::LockOnly,
            old,
            new_value: Vec::new(),
        });
        self.writes.len() - 1
    }
    /// What the transaction's own sets answer for `r` without a verb (`None`: fetch it).
    pub(crate) fn local_answer(&self, r: &ReadReq) -> Option<Option<Vec<u8>>> {
        if let Some(i) = self.write_entry(r.table, r.key) {
            let w = &self.writes[i];
            match (w.lock, r.access) {
                (LockState::Held, _) => return Some(self.current_value(w)),
                (LockState::Deferred, Access::Read) => return Some(Some(w.new_value.clone())),
                // A blind write read for update is locked now; a failed lock is retried.
                (LockState::Deferred | LockState::Failed, _) => {
                    if r.access == Access::ForUpdate {
                        return None;
                    }
                }
            }
        }
        if r.access == Access::Read
            && let Some(e) = self
                .reads
                .iter()
                .find(|e| e.table == r.table && e.key == r.key)
        {
            return Some(e.value.clone());
        }
        None
    }
    /// The transaction's writes with their undo images, as its log holds them.
    pub(crate) fn local_log(&self, env: &Env<'_>) -> LoggedTxn {
        let writes = self
            .writes
            .iter()
            .filter_map(|w| {
                let Intent::Write(kind) = w.intent else {
                    return None;
                };
                let old = w.old.as_ref()?;
                Some(LoggedWrite {
                    op: match kind {
                        WriteKind::Insert => LogOp::Insert,
                        WriteKind::Delete => LogOp::Delete,
                        WriteKind::Update => LogOp::Update,
                    },
                    table: w.table.0,
                    key: w.key.0,
                    partition: w.loc.bucket.partition,
                    offset: w.loc.offset,
                    old_version: old.version.to_raw(),
                    old_value: old.value.clone(),
                })
            })
            .collect();
        LoggedTxn {
            coordinator: env.coordinator,
            txn: env.seq,
            writes,
        }
    }
    /// Builds the log images: `(mn, bytes)` per log copy. `early` logs every entry with an
    /// old image (the log-without-lock corner case); otherwise only written entries.
    pub(crate) fn log_images(
        &self,
        env: &Env<'_>,
        early: bool,
    ) -> Result<Vec<(u16, Vec<u8>)>, TxnError> {
        let skip_inserts = env.cfg.bug(FordBug::MissingInsertLog);
        let logged: Vec<&WriteEntry> = self
            .writes
            .iter()
            .filter(|w| w.old.is_some())
            .filter(|w| match w.intent {
                Intent::Write(WriteKind::Insert) => !skip_inserts,
                Intent::Write(_) => true,
                Intent::LockOnly => early,
            })
            .collect();
        let store = env.store;
        // With lock logging the lock log owns the region's tail.
        let undo_bytes = if env.cfg.lock_logging {
            wire::lock_log_offset(store.log_region_bytes())
                .ok_or(TxnError::Aborted(AbortReason::LogRegionTooSmallForLockLog))?
        } else {
            store.log_region_bytes()
        };
        let build = |entries: &[&WriteEntry]| -> Result<Vec<u8>, TxnError> {
            let mut buf = vec![0u8; undo_bytes];
            let mut writer = LogWriter::new(&mut buf, env.coordinator, env.epoch, env.seq)
                .map_err(|_| TxnError::Aborted(AbortReason::LogRegionTooSmall))?;
            for w in entries {
                let old = w
                    .old
                    .as_ref()
                    .map_or((DataVersion::from_raw(0), &[][..]), |o| {
                        (o.version, &o.value[..])
                    });
                let op = match w.intent {
                    Intent::Write(WriteKind::Insert) => LogOp::Insert,
                    Intent::Write(WriteKind::Delete) => LogOp::Delete,
                    _ => LogOp::Update,
                };
                let entry = DataLogEntry {
                    op,
                    table_id: w.table.0,
                    key: w.key.0,
                    addr: logic::pack_location(w.loc.bucket.partition, w.loc.offset),
                    version: old.0.to_raw(),
                };
                writer
                    .append_undo(&entry, old.1)
                    .map_err(|_| TxnError::Aborted(AbortReason::LogRegionFull))?;
            }
            let len = writer.finish().len();
            buf.truncate(len);
            Ok(buf)
        };
        match env.cfg.protocol {
            Protocol::Pandora => {
                let image = build(&logged)?;
                Ok(store
                    .pandora_log_mns(env.coordinator)
                    .into_iter()
                    .map(|mn| (mn, image.clone()))
                    .collect())
            }
            Protocol::Ford => {
                let mut out = Vec::new();
                for mn in 0..store.config().mns {
                    let here: Vec<&WriteEntry> = logged
                        .iter()
                        .copied()
                        .filter(|w| store.live_replicas(w.loc.bucket.partition).contains(&mn))
                        .collect();
                    if !here.is_empty() {
                        out.push((mn, build(&here)?));
                    }
                }
                Ok(out)
            }
        }
    }
    /// Adds one validation READ per read-set entry not covered by a held lock.
    pub(crate) fn validation_reads(
        &self,
        store: &Store,
        list: &mut PostList,
    ) -> Result<Vec<(usize, WrId)>, TxnError> {
        let mut ids = Vec::new();
        for (i, r) in self.reads.iter().enumerate() {
            if self
                .write_entry(r.table, r.key)
                .is_some_and(|w| self.writes[w].lock == LockState::Held)
            {
                if let ReadTarget::Item { .. } = r.target {
                    // Held lock: only the version must be unchanged; checked below too.
                } else {
                    continue;
                }
            }
            match &r.target {
                ReadTarget::Item { loc, .. } => {
                    let addr = primary_addr(store, loc)?;
                    ids.push((i, list.read(addr, DataItemHeader::VALIDATION_LEN as u32)));
                }
                ReadTarget::Absent { bucket } => {
                    let p = store.primary(bucket.partition).map_err(TxnError::from)?;
                    let addr = store.addr(p, bucket.offset);
                    ids.push((i, list.read(addr, bucket.read_len())));
                }
            }
        }
        Ok(ids)
    }
    pub(crate) fn validate_one(
        &self,
        cfg: &ProtocolConfig,
        ri: usize,
        bytes: &[u8],
        failed: &FailedCoordinatorSet,
    ) -> bool {
        let r = &self.reads[ri];
        match &r.target {
            ReadTarget::Item { version, .. } => {
                if bytes.len() < 16 {
                    return false;
                }
                let lock = u64::from_le_bytes(bytes[0..8].try_into().unwrap_or([0xFF; 8]));
                let ver = u64::from_le_bytes(bytes[8..16].try_into().unwrap_or([0xFF; 8]));
                let mine = self
                    .write_entry(r.table, r.key)
                    .is_some_and(|w| self.writes[w].lock == LockState::Held);
                if mine {
                    return ver == *version;
                }
                logic::validate_item(*version, lock, ver, failed, cfg)
            }
            ReadTarget::Absent { .. } => {
                let (used, _) = parse_bucket(bytes);
                !used.iter().any(|(_, k)| *k == r.key.0)
            }
        }
    }

    /// The commit WRITEs (Pandora §2.3 step 4; FORD `IssueCommitAll`): the new image of
    /// every written item from its version word on (the lock word stays held) to every live
    /// replica, primary included, and the versions they install, for the history.
    pub(crate) fn commit_list(
        &self,
        env: &Env<'_>,
    ) -> Result<(PostList, Vec<WriteEvent>), TxnError> {
        let store = env.store;
        // Coordinator ids are 16-bit and sequence numbers start at 1: they always pack.
        let writer = DataItemHeader::pack_writer(env.coordinator, env.seq)
            .unwrap_or(DataItemHeader::NO_WRITER);
        let mut installed = Vec::new();
        let mut list = PostList::new();
        for w in &self.writes {
            let Intent::Write(kind) = w.intent else {
                continue;
            };
            let Some(old) = &w.old else {
                return Err(TxnError::Aborted(AbortReason::WriteWithoutOldImage));
            };
            let version = logic::next_version(old.version);
            let (flags, value) = match kind {
                WriteKind::Update => (ItemFlags::LOADED, &w.new_value),
                WriteKind::Insert => (ItemFlags::LOADED.with_user_insert(true), &w.new_value),
                WriteKind::Delete => (ItemFlags::EMPTY, &old.value),
            };
            let item_len = store.table(w.table).map_err(TxnError::from)?.item_len;
            let image = encode_item_by(w.key.0, w.table.0, version, flags, value, item_len, writer);
            for mn in store.live_replicas(w.loc.bucket.partition) {
                let addr = store.addr(mn, w.loc.offset + DataItemHeader::VERSION_OFFSET as u64);
                list.write(addr, &image[DataItemHeader::VERSION_OFFSET..]);
            }
            installed.push(WriteEvent {
                table: w.table,
                key: w.key,
                version: Version(version.counter()),
                kind,
            });
        }
        Ok((list, installed))
    }

    /// The release WRITEs: 0 to the lock word of every held lock, at its primary.
    pub(crate) fn release_list(&self, store: &Store) -> Result<PostList, TxnError> {
        let mut list = PostList::new();
        for w in &self.writes {
            if w.lock == LockState::Held {
                list.write(primary_addr(store, &w.loc)?, &0u64.to_le_bytes());
            }
        }
        Ok(list)
    }

    /// Marks every held lock released (and its entry no longer written).
    pub(crate) fn mark_released(&mut self) {
        for w in &mut self.writes {
            if w.lock == LockState::Held {
                w.lock = LockState::Failed;
                w.intent = Intent::LockOnly;
            }
        }
    }

    /// The abort path's first step (Pandora §3.1.5 (3)): clear the log state byte on every
    /// live MN holding this transaction's log, so recovery never rolls it back or forward.
    /// Nothing under the lost-decision bug (FORD leaves the logs of aborted transactions).
    pub(crate) fn truncate_list(&self, env: &Env<'_>) -> PostList {
        let mut list = PostList::new();
        if env.cfg.bug(FordBug::LostDecision) {
            return list;
        }
        let base = env.store.log_offset(env.coordinator).unwrap_or(0);
        let view = env.store.view().borrow().clone();
        for &mn in self.logged.iter().filter(|&&mn| view.is_alive(mn)) {
            list.write(
                env.store
                    .addr(mn, base + LogRegionHeader::STATE_OFFSET as u64),
                &[0],
            );
        }
        list
    }

    /// The abort path's unlocks: every held lock (every lock of the write set under the
    /// complicit-abort bug). After an MN view change a lock is released with a CAS from
    /// this coordinator's word, since the new primary's word was never locked by it and
    /// must not be overwritten blindly (§3.2.5).
    pub(crate) fn abort_unlock_list(&self, env: &Env<'_>, view_changed: bool) -> PostList {
        let complicit = env.cfg.bug(FordBug::ComplicitAbort);
        let me = logic::my_lock(env.coordinator);
        let mut list = PostList::new();
        for w in &self.writes {
            let release = match w.lock {
                LockState::Held => true,
                // Complicit abort: FORD releases its whole write-set, held or not.
                LockState::Failed | LockState::Deferred => complicit,
            };
            if !release {
                continue;
            }
            let Ok(addr) = primary_addr(env.store, &w.loc) else {
                continue;
            };
            if view_changed {
                list.cas(addr, me, 0);
            } else {
                list.write(addr, &0u64.to_le_bytes());
            }
        }
        list
    }

    /// A write to a record the write set already covers (locked, or a blind write still to
    /// lock): restages it without a verb. `None`: the record is not covered (or its lock
    /// failed) and the shell must locate and lock it. `Some(Err(KeyState))`: the write
    /// contradicts the record's state as this transaction sees it (an update of an absent
    /// record, an insert of a present one).
    pub(crate) fn stage_on_entry(
        &mut self,
        table: TableId,
        key: Key,
        value: &[u8],
        kind: WriteKind,
    ) -> Option<Result<(), TxnError>> {
        let i = self.write_entry(table, key)?;
        let w = &mut self.writes[i];
        if w.lock == LockState::Failed {
            return None;
        }
        let present = match (&w.old, w.intent) {
            (_, Intent::Write(WriteKind::Insert | WriteKind::Update)) => true,
            (_, Intent::Write(WriteKind::Delete)) => false,
            (Some(o), Intent::LockOnly) => o.valid,
            (None, Intent::LockOnly) => true,
        };
        let new_kind = match (kind, present) {
            (WriteKind::Update, true) => match w.intent {
                Intent::Write(WriteKind::Insert) => WriteKind::Insert,
                _ => WriteKind::Update,
            },
            (WriteKind::Insert, false) => match w.intent {
                Intent::Write(WriteKind::Delete) => WriteKind::Update,
                _ => WriteKind::Insert,
            },
            (WriteKind::Delete, true) => WriteKind::Delete,
            _ => return Some(Err(TxnError::KeyState(key.0))),
        };
        w.intent = Intent::Write(new_kind);
        if kind != WriteKind::Delete {
            w.new_value = value.to_vec();
        }
        Some(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BugSet;
    use crate::store::{StoreConfig, TableSpec};
    use dmem_layout::pill::CoordinatorId as PillId;
    use dmem_verbs::{MemoryRegion, NodeId, Op, RKey};

    const T: TableId = TableId(1);

    fn store() -> Store {
        let regions = (0..3)
            .map(|i| MemoryRegion {
                node: NodeId(i),
                rkey: RKey(1),
                len: 1 << 22,
            })
            .collect();
        Store::new(
            StoreConfig::new(3)
                .table(TableSpec::sized_for(T, 8, 100, 3))
                .coordinators(4),
            regions,
        )
        .unwrap()
    }

    fn loc(s: &Store, key: u64) -> ItemLoc {
        s.item_at(s.bucket_of(T, Key(key)).unwrap(), 0).unwrap()
    }

    fn entry(s: &Store, key: u64, lock: LockState, intent: Intent) -> WriteEntry {
        WriteEntry {
            table: T,
            key: Key(key),
            loc: loc(s, key),
            lock,
            intent,
            old: Some(OldImage {
                version: DataVersion::from_raw(4),
                valid: true,
                value: vec![1; 8],
            }),
            new_value: vec![2; 8],
        }
    }

    fn env<'a>(s: &'a Store, cfg: &'a ProtocolConfig) -> Env<'a> {
        Env {
            store: s,
            cfg,
            coordinator: 2,
            epoch: 1,
            seq: 9,
        }
    }

    #[test]
    fn validation_reads_read_only_items_and_judges_lock_and_version() {
        let s = store();
        let mut st = TxnState::default();
        st.reads.push(ReadEntry {
            table: T,
            key: Key(1),
            target: ReadTarget::Item {
                loc: loc(&s, 1),
                version: 5,
            },
            value: Some(vec![0; 8]),
        });
        st.writes.push(entry(
            &s,
            2,
            LockState::Held,
            Intent::Write(WriteKind::Update),
        ));
        let mut list = PostList::new();
        let ids = st.validation_reads(&s, &mut list).unwrap();
        assert_eq!(ids.len(), 1, "only the read-only item is validated");
        let header = |lock: u64, version: u64| {
            let mut b = lock.to_le_bytes().to_vec();
            b.extend_from_slice(&version.to_le_bytes());
            b
        };
        let fixed = ProtocolConfig::ford_fixed();
        let none = FailedCoordinatorSet::EMPTY;
        assert!(st.validate_one(&fixed, 0, &header(0, 5), &none));
        assert!(
            !st.validate_one(&fixed, 0, &header(0, 6), &none),
            "version moved"
        );
        let live = logic::my_lock(3);
        assert!(
            !st.validate_one(&fixed, 0, &header(live, 5), &none),
            "locked"
        );
        let covert = ProtocolConfig::ford_with(BugSet::NONE.with(FordBug::CovertLocks));
        assert!(
            st.validate_one(&covert, 0, &header(live, 5), &none),
            "the covert-locks bug ignores the lock"
        );
        let mut failed = FailedCoordinatorSet::EMPTY;
        failed.insert(PillId(3));
        assert!(
            st.validate_one(&ProtocolConfig::pandora(), 0, &header(live, 5), &failed),
            "PILL ignores a stray lock"
        );
        assert!(
            !st.validate_one(&fixed, 0, &header(0, 5)[..8], &none),
            "short"
        );
    }

    #[test]
    fn commit_writes_every_live_replica_with_the_next_version() {
        let s = store();
        let mut st = TxnState::default();
        st.writes.push(entry(
            &s,
            1,
            LockState::Held,
            Intent::Write(WriteKind::Update),
        ));
        st.writes
            .push(entry(&s, 2, LockState::Held, Intent::LockOnly));
        let fixed = ProtocolConfig::ford_fixed();
        let (list, installed) = st.commit_list(&env(&s, &fixed)).unwrap();
        assert_eq!(installed.len(), 1, "a lock-only entry installs nothing");
        assert_eq!(installed[0].version, Version(5));
        let wrs = list.finish().unwrap();
        assert_eq!(wrs.len(), 3, "primary and two backups");
        s.view().borrow_mut().mark_failed(wrs[0].op.addr().node.0);
        let (list, _) = st.commit_list(&env(&s, &fixed)).unwrap();
        assert_eq!(list.len(), 2, "a failed MN is skipped");
        for w in list.finish().unwrap() {
            let Op::Write { addr, data } = &w.op else {
                panic!("not a WRITE");
            };
            assert_eq!(
                addr.offset,
                loc(&s, 1).offset + DataItemHeader::VERSION_OFFSET as u64
            );
            assert_eq!(
                data.len() + DataItemHeader::VERSION_OFFSET,
                DataItemHeader::item_len(8)
            );
        }
        let mut orphan = entry(&s, 3, LockState::Held, Intent::Write(WriteKind::Update));
        orphan.old = None;
        st.writes.push(orphan);
        assert!(
            st.commit_list(&env(&s, &fixed)).is_err(),
            "a write without an old image"
        );
    }

    #[test]
    fn abort_releases_held_locks_only_unless_complicit_and_truncates_unless_lost_decision() {
        let s = store();
        let mut st = TxnState::default();
        st.writes.push(entry(
            &s,
            1,
            LockState::Held,
            Intent::Write(WriteKind::Update),
        ));
        st.writes.push(entry(
            &s,
            2,
            LockState::Failed,
            Intent::Write(WriteKind::Update),
        ));
        st.logged = vec![0, 1];
        let fixed = ProtocolConfig::ford_fixed();
        assert_eq!(st.abort_unlock_list(&env(&s, &fixed), false).len(), 1);
        let complicit = ProtocolConfig::ford_with(BugSet::NONE.with(FordBug::ComplicitAbort));
        assert_eq!(st.abort_unlock_list(&env(&s, &complicit), false).len(), 2);
        let after_view_change = st
            .abort_unlock_list(&env(&s, &fixed), true)
            .finish()
            .unwrap();
        assert!(
            matches!(after_view_change[0].op, Op::Cas { expect, swap: 0, .. } if expect == logic::my_lock(2)),
            "after a view change the release is a CAS from this coordinator's word"
        );
        assert_eq!(st.truncate_list(&env(&s, &fixed)).len(), 2);
        let lost = ProtocolConfig::ford_with(BugSet::NONE.with(FordBug::LostDecision));
        assert!(st.truncate_list(&env(&s, &lost)).is_empty());
        st.mark_released();
        assert!(st.release_list(&s).unwrap().is_empty());
    }

    #[test]
    fn restaging_follows_the_record_state() {
        let s = store();
        let mut st = TxnState::default();
        assert!(
            st.stage_on_entry(T, Key(1), &[0; 8], WriteKind::Update)
                .is_none()
        );
        st.writes
            .push(entry(&s, 1, LockState::Held, Intent::LockOnly));
        assert_eq!(
            st.stage_on_entry(T, Key(1), &[0; 8], WriteKind::Insert),
            Some(Err(TxnError::KeyState(1))),
            "insert of a present record"
        );
        assert_eq!(
            st.stage_on_entry(T, Key(1), &[], WriteKind::Delete),
            Some(Ok(()))
        );
        assert_eq!(
            st.stage_on_entry(T, Key(1), &[0; 8], WriteKind::Update),
            Some(Err(TxnError::KeyState(1))),
            "update of a record this transaction deleted"
        );
        assert_eq!(
            st.stage_on_entry(T, Key(1), &[7; 8], WriteKind::Insert),
            Some(Ok(()))
        );
        assert_eq!(
            st.writes[0].intent,
            Intent::Write(WriteKind::Update),
            "delete + insert = update"
        );
        assert_eq!(st.current_value(&st.writes[0]), Some(vec![7; 8]));
    }
}
