//! The commit skeleton's decisions (Dandelion §4.2, Fig. 3, Table 4) without any I/O: which
//! requests each step sends to which replica, and what the replies decide. `txn.rs` is the
//! async shell that sends them ([`crate::txn::DnlTxn`]); a test drives a [`CommitPlan`]
//! step by step with made-up replies.
//!
//! Every step asks a [`ReplicaView`] where a key's replicas are *at that step*: recovery may
//! declare a server crashed between two steps of one commit, and a later step then visits
//! the surviving replicas only.

use std::collections::HashMap;

use dmem_layout::kv_meta::KvMeta;
use dmem_txn::{Key, TableId, TxnId, Version, WriteEvent};

use crate::cluster::Cluster;
use crate::config::{CommitSpec, Replicas, Visit};
use crate::wire::{DecidedWrite, Request, Response, Seen, WriteOp};

/// One entry of the transaction cache (§3: one per key the transaction touched).
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) table: u32,
    pub(crate) key: u64,
    /// What execution read (`None`: written blind).
    pub(crate) seen: Option<Seen>,
    /// The key was unlocked and readable when read (GetOne may return it).
    pub(crate) get_one_ok: bool,
    /// The value read (`None`: absent).
    pub(crate) value: Option<Vec<u8>>,
    /// The write buffered for commit.
    pub(crate) write: Option<WriteOp>,
}

/// One request of a commit step: the server it goes to and the request.
pub(crate) type Out = (u16, Request);

/// An entry (by index) at one of its replicas.
pub(crate) type At = (usize, u16);

/// Where a key's replicas are as the cluster sees them now (crashed servers left out).
pub(crate) trait ReplicaView {
    /// Primary first, then the backups.
    fn replicas(&self, table: u32, key: u64) -> Vec<u16>;
    /// The acting primary.
    fn primary(&self, table: u32, key: u64) -> u16;
}

impl ReplicaView for Cluster {
    fn replicas(&self, table: u32, key: u64) -> Vec<u16> {
        Cluster::replicas(self, table, key)
    }
    fn primary(&self, table: u32, key: u64) -> u16 {
        Cluster::primary(self, table, key)
    }
}

/// `which` of the entry's replicas (Table 4's "P", "B", "P & B").
fn replicas_of(view: &dyn ReplicaView, e: &Entry, which: Replicas) -> Vec<u16> {
    let all = view.replicas(e.table, e.key);
    let split = all.len().min(1);
    match which {
        Replicas::Primary => all[..split].to_vec(),
        Replicas::Backups => all[split..].to_vec(),
        Replicas::All => all,
    }
}

/// What Locking's replies decided.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Locked {
    /// The locks granted, to be released by Unlocking (or by the abort).
    pub(crate) at: Vec<At>,
    /// Per entry, the version its primary held when locked (a blind write's base).
    pub(crate) base: HashMap<usize, u32>,
    /// Every lock was granted (no-wait: anything else aborts).
    pub(crate) all: bool,
}

/// What Replication sends and where it lowered the readable flag.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Replication {
    pub(crate) outs: Vec<Out>,
    /// Replicas that received the write (Unlocking does not apply it again there).
    pub(crate) replicated: Vec<At>,
    /// Backups whose readable flag went down (a `RAISE` brings it back up).
    pub(crate) lowered: Vec<At>,
}

/// One transaction's commit under one [`CommitSpec`]: the decisions of Fig. 3's steps.
#[derive(Debug)]
pub(crate) struct CommitPlan<'e> {
    txn: TxnId,
    spec: CommitSpec,
    entries: &'e [Entry],
    /// Entries with a buffered write (the write-set W).
    writes: Vec<usize>,
    /// Entries read and not written (R \ W).
    read_only: Vec<usize>,
}

impl<'e> CommitPlan<'e> {
    /// The plan of `txn` committing `entries` as `spec` says.
    pub(crate) fn new(txn: TxnId, spec: CommitSpec, entries: &'e [Entry]) -> Self {
        let writes = (0..entries.len())
            .filter(|&i| entries[i].write.is_some())
            .collect();
        let read_only = (0..entries.len())
            .filter(|&i| entries[i].write.is_none() && entries[i].seen.is_some())
            .collect();
        Self {
            txn,
            spec,
            entries,
            writes,
            read_only,
        }
    }

    /// The commit phase it follows.
    pub(crate) fn spec(&self) -> CommitSpec {
        self.spec
    }

    /// Step 1, Locking: the replicas to lock (none when the spec elides Locking).
    pub(crate) fn lock_targets(&self, view: &dyn ReplicaView) -> Vec<At> {
        let Some(Visit { reads, replicas }) = self.spec.lock else {
            return Vec::new();
        };
        let keys = self.writes.iter().chain(if reads {
            self.read_only.iter()
        } else {
            [].iter()
        });
        keys.flat_map(|&i| {
            replicas_of(view, &self.entries[i], replicas)
                .into_iter()
                .map(move |to| (i, to))
        })
        .collect()
    }

    /// The lock requests to `targets`, each carrying the size of the lock set.
    pub(crate) fn lock_requests(&self, targets: &[At]) -> Vec<Out> {
        let reads = self.spec.lock.is_some_and(|v| v.reads);
        let keys = self.writes.len() + if reads { self.read_only.len() } else { 0 };
        let lock_set = u16::try_from(keys).unwrap_or(u16::MAX);
        targets
            .iter()
            .map(|&(i, to)| {
                let e = &self.entries[i];
                let req = Request::Lock {
                    txn: self.txn,
                    table: e.table,
                    key: e.key,
                    read: e.seen,
                    write: e.write.clone(),
                    lock_set,
                };
                (to, req)
            })
            .collect()
    }

    /// What Locking's `replies` (in the order of `targets`; fewer when recovery
    /// interrupted the step) decide.
    pub(crate) fn on_lock_replies(
        &self,
        view: &dyn ReplicaView,
        targets: &[At],
        replies: &[Response],
    ) -> Locked {
        let mut locked = Locked {
            all: replies.len() == targets.len(),
            ..Locked::default()
        };
        for (&(i, to), r) in targets.iter().zip(replies) {
            match r {
                Response::Lock {
                    granted: true,
                    meta,
                } => {
                    locked.at.push((i, to));
                    let e = &self.entries[i];
                    if to == view.primary(e.table, e.key) {
                        locked.base.insert(i, KvMeta::from_raw(*meta).version());
                    }
                }
                _ => locked.all = false,
            }
        }
        locked
    }

    /// Whether step 2 validates the reads: the spec validates and Locking did not already
    /// cover them.
    pub(crate) fn validates(&self) -> bool {
        self.spec.validate && !self.spec.lock.is_some_and(|v| v.reads)
    }

    /// The reads step 2 validates.
    pub(crate) fn reads_to_validate(&self) -> &[usize] {
        &self.read_only
    }

    /// The version each write installs: one past what execution read, or past the
    /// primary's version when locked for a blind write.
    pub(crate) fn versions(&self, base: &HashMap<usize, u32>) -> HashMap<usize, u32> {
        self.writes
            .iter()
            .map(|&i| {
                let from = self.entries[i]
                    .seen
                    .map(|s| s.version)
                    .or_else(|| base.get(&i).copied())
                    .unwrap_or(0);
                let v = KvMeta::INSERTED
                    .with_version(from)
                    .map_or(0, |m| m.bumped().version());
                (i, v)
            })
            .collect()
    }

    /// The history's write events of the decided commit, in write-set order.
    pub(crate) fn write_events(&self, versions: &HashMap<usize, u32>) -> Vec<WriteEvent> {
        self.writes
            .iter()
            .map(|&i| {
                let e = &self.entries[i];
                WriteEvent {
                    table: TableId(e.table),
                    key: Key(e.key),
                    version: Version(u64::from(versions[&i])),
                    kind: write_of(e).kind,
                }
            })
            .collect()
    }

    /// The coordinator's decision as recovery asks for it (§4.4).
    pub(crate) fn decision(&self, versions: &HashMap<usize, u32>) -> Vec<DecidedWrite> {
        self.writes
            .iter()
            .map(|&i| {
                let e = &self.entries[i];
                (e.table, e.key, versions[&i], write_of(e).clone())
            })
            .collect()
    }

    /// Step 3, Replication with undo logs: backups lower the readable flag unless
    /// `skip_readable` (a planted bug) says not to.
    pub(crate) fn replication(
        &self,
        view: &dyn ReplicaView,
        versions: &HashMap<usize, u32>,
        skip_readable: bool,
    ) -> Replication {
        let mut r = Replication::default();
        let Some(Visit { replicas, .. }) = self.spec.replicate else {
            return r;
        };
        for &i in &self.writes {
            let e = &self.entries[i];
            let primary = view.primary(e.table, e.key);
            for to in replicas_of(view, e, replicas) {
                let lower = to != primary && !skip_readable;
                r.replicated.push((i, to));
                if lower {
                    r.lowered.push((i, to));
                }
                let req = Request::Replicate {
                    txn: self.txn,
                    table: e.table,
                    key: e.key,
                    version: versions[&i],
                    lower_readable: lower,
                    write: write_of(e).clone(),
                };
                r.outs.push((to, req));
            }
        }
        r
    }

    /// Step 4, Unlocking with the commit decision; a locked replica that was not
    /// replicated to applies the write here.
    pub(crate) fn commit_unlocks(
        &self,
        locked: &[At],
        replicated: &[At],
        versions: &HashMap<usize, u32>,
    ) -> Vec<Out> {
        locked
            .iter()
            .map(|&(i, to)| {
                let e = &self.entries[i];
                let apply = match (&e.write, replicated.contains(&(i, to))) {
                    (Some(w), false) => Some((versions[&i], w.clone())),
                    _ => None,
                };
                (to, unlock(self.txn, e, true, apply))
            })
            .collect()
    }

    /// The `RAISE`s that bring the lowered readable flags back up.
    pub(crate) fn raises(&self, lowered: &[At], versions: &HashMap<usize, u32>) -> Vec<Out> {
        lowered
            .iter()
            .map(|&(i, to)| {
                let e = &self.entries[i];
                let req = Request::Raise {
                    txn: self.txn,
                    table: e.table,
                    key: e.key,
                    version: versions[&i],
                };
                (to, req)
            })
            .collect()
    }
}

/// The unlocks of an aborting transaction: every lock it holds, released without a write.
pub(crate) fn abort_unlocks(txn: TxnId, entries: &[Entry], locked: &[At]) -> Vec<Out> {
    locked
        .iter()
        .map(|&(i, to)| (to, unlock(txn, &entries[i], false, None)))
        .collect()
}

/// Read Validation of `reads` at their primaries (entries never read are skipped).
pub(crate) fn validation_requests(
    view: &dyn ReplicaView,
    entries: &[Entry],
    reads: &[usize],
) -> Vec<Out> {
    reads
        .iter()
        .filter_map(|&i| {
            let e = &entries[i];
            let read = e.seen?;
            let req = Request::Validate {
                table: e.table,
                key: e.key,
                read,
            };
            Some((view.primary(e.table, e.key), req))
        })
        .collect()
}

/// Whether every validation reply says the read still holds.
pub(crate) fn validated(replies: &[Response]) -> bool {
    replies
        .iter()
        .all(|r| matches!(r, Response::Ack { ok: true }))
}

fn unlock(txn: TxnId, e: &Entry, commit: bool, apply: Option<(u32, WriteOp)>) -> Request {
    Request::Unlock {
        txn,
        table: e.table,
        key: e.key,
        commit,
        apply,
    }
}

fn write_of(e: &Entry) -> &WriteOp {
    e.write
        .as_ref()
        .expect("an entry of the write-set has a write")
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use dmem_txn::{CoordinatorId, WriteKind};

    use super::*;
    use crate::cluster::Placement;

    /// Three servers, two replicas per key, some of them crashed.
    struct View {
        placement: Placement,
        crashed: RefCell<Vec<u16>>,
    }

    impl View {
        fn new() -> Self {
            Self {
                placement: Placement::new(3, 2),
                crashed: RefCell::new(Vec::new()),
            }
        }
    }

    impl ReplicaView for View {
        fn replicas(&self, table: u32, key: u64) -> Vec<u16> {
            let crashed = self.crashed.borrow();
            self.placement
                .replicas(table, key)
                .filter(|s| !crashed.contains(s))
                .collect()
        }
        fn primary(&self, table: u32, key: u64) -> u16 {
            self.replicas(table, key)[0]
        }
    }

    const TXN: TxnId = TxnId {
        coordinator: CoordinatorId(4),
        seq: 9,
    };

    fn entry(key: u64, seen: Option<u32>, write: Option<WriteKind>) -> Entry {
        Entry {
            table: 1,
            key,
            seen: seen.map(|version| Seen {
                version,
                present: true,
            }),
            get_one_ok: false,
            value: None,
            write: write.map(|kind| WriteOp {
                kind,
                value: vec![7; 4],
            }),
        }
    }

    /// Key 1 read and written, key 2 only read, key 3 written blind.
    fn entries() -> Vec<Entry> {
        vec![
            entry(1, Some(5), Some(WriteKind::Update)),
            entry(2, Some(8), None),
            entry(3, None, Some(WriteKind::Update)),
        ]
    }

    fn granted(version: u32) -> Response {
        Response::Lock {
            granted: true,
            meta: KvMeta::INSERTED.with_version(version).unwrap().to_raw(),
        }
    }

    #[test]
    fn dnl_4_locks_write_primaries_validates_reads_replicates_to_backups() {
        let (view, entries) = (View::new(), entries());
        let plan = CommitPlan::new(TXN, CommitSpec::DNL_4, &entries);
        let targets = plan.lock_targets(&view);
        // The write-set's primaries only: keys 1 and 3.
        let primary = |k| view.primary(1, k);
        assert_eq!(targets, vec![(0, primary(1)), (2, primary(3))]);
        let reqs = plan.lock_requests(&targets);
        assert!(
            reqs.iter()
                .all(|(_, r)| matches!(r, Request::Lock { lock_set: 2, txn, .. } if *txn == TXN))
        );
        let locked = plan.on_lock_replies(&view, &targets, &[granted(5), granted(11)]);
        assert!(locked.all);
        assert_eq!(locked.at, targets);
        // Key 2 is read, not locked: it is validated at its primary.
        assert!(plan.validates());
        assert_eq!(plan.reads_to_validate(), &[1]);
        let v = validation_requests(&view, &entries, plan.reads_to_validate());
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].0, primary(2));
        // Versions: one past what was read (5 → 6), one past the locked base (11 → 12).
        let versions = plan.versions(&locked.base);
        assert_eq!((versions[&0], versions[&2]), (6, 12));
        let events = plan.write_events(&versions);
        assert_eq!(events.len(), 2);
        assert_eq!(events[1].version, Version(12));
        // Replication goes to the backups and lowers their readable flag.
        let r = plan.replication(&view, &versions, false);
        assert_eq!(r.outs.len(), 2);
        assert_eq!(r.lowered, r.replicated);
        assert!(
            r.replicated
                .iter()
                .all(|&(i, to)| to != primary(entries[i].key))
        );
        // Unlocking applies the write at the primaries (Replication reached the backups).
        let unlocks = plan.commit_unlocks(&locked.at, &r.replicated, &versions);
        assert!(unlocks.iter().all(|(_, u)| matches!(
            u,
            Request::Unlock {
                commit: true,
                apply: Some(_),
                ..
            }
        )));
        assert_eq!(plan.raises(&r.lowered, &versions).len(), 2);
    }

    #[test]
    fn a_refused_or_missing_lock_aborts_and_keeps_what_was_granted() {
        let (view, entries) = (View::new(), entries());
        let plan = CommitPlan::new(TXN, CommitSpec::DNL_4, &entries);
        let targets = plan.lock_targets(&view);
        let refused = Response::Lock {
            granted: false,
            meta: 0,
        };
        let locked = plan.on_lock_replies(&view, &targets, &[granted(5), refused]);
        assert!(!locked.all);
        assert_eq!(locked.at, vec![targets[0]]);
        // Interrupted by recovery after one reply: not all granted either.
        let locked = plan.on_lock_replies(&view, &targets, &[granted(5)]);
        assert!(!locked.all);
        let unlocks = abort_unlocks(TXN, &entries, &locked.at);
        assert!(matches!(
            unlocks[..],
            [(
                _,
                Request::Unlock {
                    commit: false,
                    apply: None,
                    ..
                }
            )]
        ));
    }

    #[test]
    fn a_later_step_visits_only_the_replicas_alive_at_that_step() {
        let (view, entries) = (View::new(), entries());
        let plan = CommitPlan::new(TXN, CommitSpec::DNL_4, &entries);
        let versions = plan.versions(&HashMap::new());
        let before = plan.replication(&view, &versions, false);
        // The backup of key 1 crashes between Locking and Replication.
        let backup = view.replicas(1, 1)[1];
        view.crashed.borrow_mut().push(backup);
        let after = plan.replication(&view, &versions, false);
        assert!(before.replicated.contains(&(0, backup)));
        assert!(after.outs.iter().all(|(to, _)| *to != backup));
        assert!(after.outs.len() < before.outs.len());
    }

    #[test]
    fn the_skip_readable_bug_lowers_no_flag() {
        let (view, entries) = (View::new(), entries());
        let plan = CommitPlan::new(TXN, CommitSpec::DNL_4, &entries);
        let versions = plan.versions(&HashMap::new());
        let r = plan.replication(&view, &versions, true);
        assert!(!r.replicated.is_empty() && r.lowered.is_empty());
        assert!(plan.raises(&r.lowered, &versions).is_empty());
        assert!(r.outs.iter().all(|(_, q)| matches!(
            q,
            Request::Replicate {
                lower_readable: false,
                ..
            }
        )));
    }

    #[test]
    fn locking_reads_too_skips_validation_and_counts_them_in_the_lock_set() {
        let (view, entries) = (View::new(), entries());
        let spec = CommitSpec {
            lock: Some(Visit {
                reads: true,
                replicas: Replicas::All,
            }),
            ..CommitSpec::DNL_4
        };
        let plan = CommitPlan::new(TXN, spec, &entries);
        assert!(!plan.validates());
        let targets = plan.lock_targets(&view);
        // Three keys, two replicas each.
        assert_eq!(targets.len(), 6);
        assert!(
            plan.lock_requests(&targets)
                .iter()
                .all(|(_, r)| matches!(r, Request::Lock { lock_set: 3, .. }))
        );
        // A locked replica that Replication did not reach applies the write at Unlocking.
        let versions = plan.versions(&HashMap::new());
        let unlocks = plan.commit_unlocks(&targets, &[], &versions);
        let applying = unlocks
            .iter()
            .filter(|(_, u)| matches!(u, Request::Unlock { apply: Some(_), .. }))
            .count();
        assert_eq!(applying, 4, "keys 1 and 3 at both replicas");
    }
}
