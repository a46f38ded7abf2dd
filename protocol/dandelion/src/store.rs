//! One server's storage and its request handler (Dandelion §4.2, Table 3, §6).
//!
//! Every key the server replicates (as primary or backup) lives in a `dmem-hashtable`
//! [`Dlht`] per table, mapping the key to a record slot; a record is the Table 3 metadata
//! word ([`KvMeta`]), the value, and the transaction holding the protocol lock. A per-key
//! spin lock gives thread safety in the paper; here every access to a server's store is
//! made under one `RefCell` borrow by one simulated core at a time, which serialises them
//! as the spin lock would.
//!
//! [`ServerStore::handle`] is the request handler (`ReqHandler`, §5.1): a pure function of
//! the store and a request, tested directly.
//!
//! The log (§4.2.2 "Logging", §4.4): a `LOCK` that carries a write logs it (redo, applied at
//! unlock: Dnl-4's primary, Dnl-1's replicas); a `REPLICATE` applies the write and keeps the
//! previous value (undo). Recovery reads both.

use std::collections::HashMap;

use dmem_hashtable::Dlht;
use dmem_layout::kv_meta::KvMeta;
use dmem_txn::{TxnId, WriteKind};

use crate::wire::{Request, Response, Seen, WriteOp};

/// One record: metadata, value, lock holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Table 3 metadata.
    pub meta: KvMeta,
    /// The value (kept on delete: a tombstone).
    pub value: Vec<u8>,
    /// The transaction holding the protocol lock.
    pub holder: Option<TxnId>,
    /// The transaction that installed the current version (`None`: loaded), returned with
    /// every Get so that the history names the writer of what was read.
    pub writer: Option<TxnId>,
}

/// One log entry of a transaction at this server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// Table.
    pub table: u32,
    /// Key.
    pub key: u64,
    /// The write (redo).
    pub write: Option<WriteOp>,
    /// Set once Replication applied the write here: the previous metadata and value (undo)
    /// and the version installed.
    pub applied: Option<(KvMeta, Vec<u8>, u32)>,
    /// The writer of the version Replication replaced (undo).
    pub undo_writer: Option<TxnId>,
    /// Whether this entry holds the key's lock here (a Locking entry).
    pub locked: bool,
    /// Distinct keys its transaction locks (from the `LOCK`; 0 for a Replication entry).
    pub lock_set: u16,
}

/// A server's tables, records and log.
#[derive(Debug, Default)]
pub struct ServerStore {
    index: HashMap<u32, Dlht>,
    records: Vec<Record>,
    /// Per transaction with state here, its entries.
    pub log: HashMap<TxnId, Vec<LogEntry>>,
}

/// The metadata word reported for a key that has no record (never inserted): absent at
/// version 0, the loaded state.
pub const ABSENT: KvMeta = KvMeta::INSERTED.with_deleted(true);

impl ServerStore {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The record of `(table, key)`, if it has one.
    #[must_use]
    pub fn get(&self, table: u32, key: u64) -> Option<&Record> {
        let slot = self.index.get(&table)?.get(key)?;
        self.records.get(usize::try_from(slot).ok()?)
    }

    fn slot(&self, table: u32, key: u64) -> Option<usize> {
        let slot = self.index.get(&table)?.get(key)?;
        usize::try_from(slot).ok()
    }

    fn slot_or_create(&mut self, table: u32, key: u64) -> usize {
        if let Some(s) = self.slot(table, key) {
            return s;
        }
        let s = self.records.len();
        self.records.push(Record {
            meta: ABSENT,
            value: Vec::new(),
            holder: None,
            writer: None,
        });
        self.index.entry(table).or_default().insert(key, s as u64);
        s
    }

    /// Loads a record out of band (present, version 0).
    pub fn load(&mut self, table: u32, key: u64, value: &[u8]) {
        let s = self.slot_or_create(table, key);
        self.records[s] = Record {
            meta: KvMeta::INSERTED,
            value: value.to_vec(),
            holder: None,
            writer: None,
        };
    }

    /// The metadata of `(table, key)` ([`ABSENT`] without a record).
    #[must_use]
    pub fn meta(&self, table: u32, key: u64) -> KvMeta {
        self.get(table, key).map_or(ABSENT, |r| r.meta)
    }

    /// Applies a write installing `version` and returns the previous metadata and value.
    fn apply(
        &mut self,
        txn: TxnId,
        table: u32,
        key: u64,
        version: u32,
        write: &WriteOp,
    ) -> (KvMeta, Vec<u8>, Option<TxnId>) {
        let s = self.slot_or_create(table, key);
        let r = &mut self.records[s];
        let before = (r.meta, r.value.clone(), r.writer);
        r.writer = Some(txn);
        let deleted = write.kind == WriteKind::Delete;
        // 29-bit versions: `with_version` refuses only a wider one, which the coordinator
        // never computes (it bumps a 29-bit version with wrap-around).
        r.meta = r
            .meta
            .with_version(version & KvMeta::MAX_VERSION)
            .unwrap_or(r.meta)
            .with_deleted(deleted);
        if !deleted {
            r.value.clone_from(&write.value);
        }
        before
    }

    fn seen_matches(meta: KvMeta, seen: Seen) -> bool {
        meta.version() == seen.version && meta.is_deleted() != seen.present
    }

    /// Handles one request (`ReqHandler`, §5.1); `None` for a request without a response.
    pub fn handle(&mut self, req: &Request) -> Option<Response> {
        match req {
            Request::Get { table, key } => Some(self.handle_get(*table, *key)),
            Request::Lock {
                txn,
                table,
                key,
                read,
                write,
                lock_set,
            } => Some(self.handle_lock(*txn, (*table, *key), *read, write.as_ref(), *lock_set)),
            Request::Validate { table, key, read } => {
                let meta = self.meta(*table, *key);
                Some(Response::Ack {
                    ok: !meta.is_locked() && Self::seen_matches(meta, *read),
                })
            }
            Request::Replicate {
                txn,
                table,
                key,
                version,
                lower_readable,
                write,
            } => {
                self.replicate(*txn, (*table, *key), *version, *lower_readable, write);
                Some(Response::Ack { ok: true })
            }
            Request::Unlock {
                txn,
                table,
                key,
                commit,
                apply,
            } => {
                self.unlock(*txn, (*table, *key), *commit, apply.as_ref());
                Some(Response::Ack { ok: true })
            }
            Request::Raise {
                txn,
                table,
                key,
                version,
            } => {
                self.raise(*txn, (*table, *key), *version);
                // Acknowledged like every request: reliability retransmits it until then.
                Some(Response::Ack { ok: true })
            }
            // Recovery's requests need the cluster (placement, halt): the worker runs them
            // with [`gathered`](Self::gathered) and [`decide`](Self::decide).
            Request::Gather { .. }
            | Request::Decide { .. }
            | Request::Resume { .. }
            | Request::Query { .. } => None,
        }
    }

    /// A Get: the record's meta, last writer and value (none when deleted or absent).
    fn handle_get(&self, table: u32, key: u64) -> Response {
        let (meta, writer, value) = match self.get(table, key) {
            Some(r) if !r.meta.is_deleted() => (r.meta, r.writer, r.value.clone()),
            Some(r) => (r.meta, r.writer, Vec::new()),
            None => (ABSENT, None, Vec::new()),
        };
        Response::Get {
            meta: meta.to_raw(),
            writer,
            value,
        }
    }

    /// Locking (no-wait): granted when the record is unlocked, still as `read` saw it, and
    /// in the state a blind `write` needs; a grant is logged for recovery (§4.4).
    fn handle_lock(
        &mut self,
        txn: TxnId,
        (table, key): (u32, u64),
        read: Option<Seen>,
        write: Option<&WriteOp>,
        lock_set: u16,
    ) -> Response {
        let s = self.slot_or_create(table, key);
        let r = &mut self.records[s];
        let free = !r.meta.is_locked() && read.is_none_or(|seen| Self::seen_matches(r.meta, seen));
        // The write's precondition on presence (insert: absent; update, delete:
        // present) is checked against the value read in execution; a blind write
        // is checked here.
        let state_ok = match write {
            Some(w) if read.is_none() => match w.kind {
                WriteKind::Insert => r.meta.is_deleted(),
                WriteKind::Update | WriteKind::Delete => !r.meta.is_deleted(),
            },
            _ => true,
        };
        let granted = free && state_ok;
        let meta = r.meta;
        if granted {
            r.meta = r.meta.with_locked(true);
            r.holder = Some(txn);
            self.log.entry(txn).or_default().push(LogEntry {
                table,
                key,
                write: write.cloned(),
                applied: None,
                undo_writer: None,
                locked: true,
                lock_set,
            });
        }
        Response::Lock {
            granted,
            meta: meta.to_raw(),
        }
    }

    /// Replication with an undo log: applies `write`, lowers the readable flag at a backup
    /// when asked, and logs what it overwrote.
    fn replicate(
        &mut self,
        txn: TxnId,
        (table, key): (u32, u64),
        version: u32,
        lower_readable: bool,
        write: &WriteOp,
    ) {
        let (before_meta, before_value, before_writer) =
            self.apply(txn, table, key, version, write);
        if lower_readable {
            let s = self.slot_or_create(table, key);
            self.records[s].meta = self.records[s].meta.with_readable(false);
        }
        let entries = self.log.entry(txn).or_default();
        let applied = Some((before_meta, before_value, version));
        match entries
            .iter_mut()
            .find(|e| e.table == table && e.key == key)
        {
            Some(e) => {
                e.applied = applied;
                e.undo_writer = before_writer;
            }
            None => entries.push(LogEntry {
                table,
                key,
                write: Some(write.clone()),
                applied,
                undo_writer: before_writer,
                locked: false,
                lock_set: 0,
            }),
        }
    }

    /// Unlocking with the decision: a commit applies `apply` where Replication did not.
    fn unlock(
        &mut self,
        txn: TxnId,
        (table, key): (u32, u64),
        commit: bool,
        apply: Option<&(u32, WriteOp)>,
    ) {
        if commit && let Some((version, write)) = apply {
            self.apply(txn, table, key, *version, write);
        }
        if let Some(s) = self.slot(table, key)
            && self.records[s].holder == Some(txn)
        {
            let r = &mut self.records[s];
            r.meta = r.meta.with_locked(false);
            r.holder = None;
        }
        self.forget(txn, table, key);
    }

    /// Raises the readable flag `txn` lowered, unless a later writer lowered it again.
    fn raise(&mut self, txn: TxnId, (table, key): (u32, u64), version: u32) {
        if let Some(s) = self.slot(table, key) {
            let r = &mut self.records[s];
            if r.meta.version() == version {
                r.meta = r.meta.with_readable(true);
            }
        }
        self.forget(txn, table, key);
    }

    /// Drops `txn`'s log entry for `(table, key)`.
    fn forget(&mut self, txn: TxnId, table: u32, key: u64) {
        if let Some(entries) = self.log.get_mut(&txn) {
            entries.retain(|e| !(e.table == table && e.key == key));
            if entries.is_empty() {
                self.log.remove(&txn);
            }
        }
    }

    /// Recovery (§4.4): the version `txn` installs on `(table, key)` when it commits, if
    /// this replica knows it: the version Replication applied, or — the key still locked by
    /// `txn` — the current version + 1.
    #[must_use]
    pub fn version_of(&self, txn: TxnId, table: u32, key: u64) -> Option<u32> {
        let entry = self
            .log
            .get(&txn)?
            .iter()
            .find(|e| e.table == table && e.key == key)?;
        if let Some((_, _, v)) = entry.applied {
            return Some(v);
        }
        let r = self.get(table, key)?;
        (r.holder == Some(txn)).then(|| r.meta.bumped().version())
    }

    /// Recovery (§4.4): this server's log entries of `txn` as a `GATHER` response carries
    /// them, each with the version the write installs here if known ([`version_of`]).
    ///
    /// [`version_of`]: Self::version_of
    #[must_use]
    pub fn gathered(&self, txn: TxnId) -> Vec<crate::wire::GatheredEntry> {
        self.log.get(&txn).map_or_else(Vec::new, |entries| {
            entries
                .iter()
                .map(|e| crate::wire::GatheredEntry {
                    table: e.table,
                    key: e.key,
                    locked: e.locked,
                    applied: e.applied.is_some(),
                    lock_set: e.lock_set,
                    version: self.version_of(txn, e.table, e.key).unwrap_or(0),
                    write: e.write.clone(),
                })
                .collect()
        })
    }

    /// Recovery (Dnl-1's lost unlock, §4.4): whether the current version of `(table, key)`
    /// here was installed by `txn`.
    #[must_use]
    pub fn written_by(&self, txn: TxnId, table: u32, key: u64) -> bool {
        self.get(table, key).is_some_and(|r| r.writer == Some(txn))
    }

    /// Recovery: commits `txn` here — applies `writes` (key → version and write) where this
    /// replica does not hold that version yet, releases the locks, raises the readable
    /// flags — or aborts it (undoes what Replication applied, releases the locks).
    pub fn decide(
        &mut self,
        txn: TxnId,
        commit: bool,
        writes: &[(u32, u64, u32, WriteOp)],
        holds: impl Fn(u32, u64) -> bool,
    ) {
        let entries = self.log.remove(&txn).unwrap_or_default();
        if commit {
            for (table, key, version, write) in writes {
                if !holds(*table, *key) {
                    continue;
                }
                // Apply only where the replica is behind: a later writer's version (a
                // Dnl-4 backup is written without a lock) must not be overwritten. Versions
                // wrap at 29 bits, so "behind" is a wrapping distance.
                let current = self.meta(*table, *key).version();
                let ahead = version.wrapping_sub(current) & KvMeta::MAX_VERSION;
                if ahead != 0 && ahead < 1 << (KvMeta::VERSION_BITS - 1) {
                    self.apply(txn, *table, *key, *version, write);
                }
                if let Some(s) = self.slot(*table, *key) {
                    let r = &mut self.records[s];
                    r.meta = r.meta.with_readable(true);
                }
            }
        } else {
            for e in &entries {
                if let Some((meta, value, _)) = &e.applied {
                    let s = self.slot_or_create(e.table, e.key);
                    let r = &mut self.records[s];
                    r.meta = meta.with_locked(r.meta.is_locked());
                    r.value.clone_from(value);
                    r.writer = e.undo_writer;
                }
            }
        }
        for e in &entries {
            if let Some(s) = self.slot(e.table, e.key) {
                let r = &mut self.records[s];
                if r.holder == Some(txn) {
                    r.meta = r.meta.with_locked(false);
                    r.holder = None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmem_txn::CoordinatorId;

    fn t(seq: u64) -> TxnId {
        TxnId {
            coordinator: CoordinatorId(1),
            seq,
        }
    }

    fn upd(v: &[u8]) -> WriteOp {
        WriteOp {
            kind: WriteKind::Update,
            value: v.to_vec(),
        }
    }

    fn get(s: &mut ServerStore, key: u64) -> (KvMeta, Vec<u8>) {
        match s.handle(&Request::Get { table: 0, key }) {
            Some(Response::Get { meta, value, .. }) => (KvMeta::from_raw(meta), value),
            other => panic!("{other:?}"),
        }
    }

    fn lock(s: &mut ServerStore, txn: TxnId, key: u64, read: Option<Seen>) -> bool {
        matches!(
            s.handle(&Request::Lock {
                txn,
                table: 0,
                key,
                read,
                write: Some(upd(b"x")),
                lock_set: 1,
            }),
            Some(Response::Lock { granted: true, .. })
        )
    }

    #[test]
    fn no_wait_locking_checks_lock_and_version() {
        let mut s = ServerStore::new();
        s.load(0, 7, b"a");
        let seen = Seen {
            version: 0,
            present: true,
        };
        assert!(lock(&mut s, t(1), 7, Some(seen)));
        assert!(
            !lock(&mut s, t(2), 7, Some(seen)),
            "locked: no-wait refuses"
        );
        // Unlock with commit applies Dnl-4's primary write at version 1.
        s.handle(&Request::Unlock {
            txn: t(1),
            table: 0,
            key: 7,
            commit: true,
            apply: Some((1, upd(b"b"))),
        });
        let (meta, value) = get(&mut s, 7);
        assert_eq!(
            (meta.version(), meta.is_locked(), value),
            (1, false, b"b".to_vec())
        );
        assert!(!lock(&mut s, t(3), 7, Some(seen)), "stale version refused");
        assert!(s.log.is_empty());
    }

    #[test]
    fn validation_fails_on_locked_or_changed() {
        let mut s = ServerStore::new();
        s.load(0, 1, b"a");
        let seen = Seen {
            version: 0,
            present: true,
        };
        let ok = |s: &mut ServerStore| {
            matches!(
                s.handle(&Request::Validate {
                    table: 0,
                    key: 1,
                    read: seen
                }),
                Some(Response::Ack { ok: true })
            )
        };
        assert!(ok(&mut s));
        assert!(lock(&mut s, t(1), 1, None));
        assert!(!ok(&mut s));
        // An absent key validates as absent at version 0.
        assert!(matches!(
            s.handle(&Request::Validate {
                table: 0,
                key: 99,
                read: Seen {
                    version: 0,
                    present: false
                }
            }),
            Some(Response::Ack { ok: true })
        ));
    }

    #[test]
    fn replication_lowers_readable_and_undo_restores() {
        let mut s = ServerStore::new();
        s.load(0, 5, b"old");
        s.handle(&Request::Replicate {
            txn: t(1),
            table: 0,
            key: 5,
            version: 1,
            lower_readable: true,
            write: upd(b"new"),
        });
        let (meta, value) = get(&mut s, 5);
        assert!(!meta.is_readable() && !meta.get_one_allowed());
        assert_eq!((meta.version(), value), (1, b"new".to_vec()));
        // Recovery aborting it restores the old value and version.
        s.decide(t(1), false, &[], |_, _| true);
        let (meta, value) = get(&mut s, 5);
        assert_eq!((meta.version(), value), (0, b"old".to_vec()));
        // Raise after a commit.
        s.handle(&Request::Replicate {
            txn: t(2),
            table: 0,
            key: 5,
            version: 1,
            lower_readable: true,
            write: upd(b"n2"),
        });
        s.handle(&Request::Raise {
            txn: t(2),
            table: 0,
            key: 5,
            version: 1,
        });
        assert!(get(&mut s, 5).0.get_one_allowed());
        assert!(s.log.is_empty());
    }

    #[test]
    fn insert_and_delete_move_presence_and_version() {
        let mut s = ServerStore::new();
        let ins = WriteOp {
            kind: WriteKind::Insert,
            value: b"v".to_vec(),
        };
        assert!(matches!(
            s.handle(&Request::Lock {
                txn: t(1),
                table: 0,
                key: 3,
                read: None,
                write: Some(ins.clone()),
                lock_set: 1,
            }),
            Some(Response::Lock { granted: true, .. })
        ));
        s.handle(&Request::Unlock {
            txn: t(1),
            table: 0,
            key: 3,
            commit: true,
            apply: Some((1, ins)),
        });
        assert_eq!(get(&mut s, 3).1, b"v".to_vec());
        s.handle(&Request::Replicate {
            txn: t(2),
            table: 0,
            key: 3,
            version: 2,
            lower_readable: false,
            write: WriteOp {
                kind: WriteKind::Delete,
                value: Vec::new(),
            },
        });
        let (meta, value) = get(&mut s, 3);
        assert!(meta.is_deleted() && value.is_empty() && meta.version() == 2);
    }
}
