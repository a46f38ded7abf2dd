//! Recovery after server crashes (Dandelion §4.4).
//!
//! Operation halts, the survivors decide every transaction they hold state for, apply the
//! decisions, bump the epoch and resume; crashed servers are not replaced and their replicas
//! are not re-created (as the paper). [`recover`] runs at one instant of virtual time over
//! the survivors' stores, which is the halt: nothing interleaves with it.
//!
//! Decisions never contradict one reported to a client:
//!
//! * a transaction of a **live** coordinator commits iff the coordinator decided commit
//!   (it reports commit only after deciding, and abort only without deciding);
//! * a transaction of a **crashed** coordinator is decided from the survivors' logs. With a
//!   Replication step (Dnl-4, Dnl-2) the decision precedes Replication and commit is reported
//!   only after every replica applied it, so it commits iff some survivor holds a
//!   Replication entry. Without one (Dnl-1) commit is reported once every replica of every
//!   locked key granted its lock, and abort only after the unlocks are acknowledged, so it
//!   commits iff the survivors hold a lock entry at every live replica of as many distinct
//!   keys as its `LOCK`s announced — or if a committing `UNLOCK` already applied one of its
//!   writes at a live replica while another replica of that key still holds its entry (an
//!   unlock lost with its coordinator; found by the litmus suite once messages are lost).
//!
//! A committed transaction's writes are applied at every live replica that does not hold
//! them yet (a replica whose message was lost in the crash), its locks released and the
//! readable flags raised; an aborted one's applied writes are undone and its locks released.
//!
//! **Cost.** The decisions are computed here at one instant, but what the survivors would
//! exchange and compute to reach them is counted and charged ([`RecoveryCost`]), by this
//! message pattern on the recovery flow: each transaction is decided by its coordinator's
//! server if that survivor lives, else by the lowest-numbered survivor holding an entry of
//! it; every other survivor holding entries of it sends them in one message (*gather*);
//! the decider sends the decision in one message to every other survivor that holds an
//! entry of it or a live replica of a key it writes (*decide*), which acknowledges it
//! (*ack*); finally every survivor tells every other one it is done, and all resume in
//! the new epoch (*resume*). CPU per survivor: [`cost::MESSAGE_NS`] per message it sends or
//! receives, [`cost::HASHTABLE_ALONE_NS`] per log entry it reads and per key it applies,
//! undoes or unlocks (one hashtable access each). The survivor's first thread is charged
//! (`Clock::cpu`), so its transactions resume that much later.

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use dmem_txn::{HistorySink, Key, TableId, TxnId, TxnOutcome, TxnRecord, Version, WriteEvent};
use dmem_verbs::{Clock, Nanos, Verbs};

use crate::config::cost;
use crate::store::LogEntry;
use crate::wire::WriteOp;
use crate::worker::{Cluster, Worker};

/// What one recovery did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The epoch operation resumed in.
    pub epoch: u64,
    /// Servers declared crashed by this recovery.
    pub crashed: Vec<u16>,
    /// Transactions decided commit / abort.
    pub committed: Vec<TxnId>,
    /// See [`committed`](Self::committed).
    pub aborted: Vec<TxnId>,
    /// What deciding and applying cost the survivors.
    pub cost: RecoveryCost,
}

/// Recovery's own cost (see the module docs for the message pattern it counts).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryCost {
    /// Messages survivors sent each other, by kind: gather, decide, ack, resume.
    pub gather: u64,
    /// See [`gather`](Self::gather).
    pub decide: u64,
    /// See [`gather`](Self::gather).
    pub ack: u64,
    /// See [`gather`](Self::gather).
    pub resume: u64,
    /// Log entries read and keys applied, undone or unlocked, over all survivors.
    pub store_accesses: u64,
    /// Simulated CPU charged to each survivor, ns: `(server, ns)`.
    pub cpu_ns: Vec<(u16, Nanos)>,
}

impl RecoveryCost {
    /// Every message counted.
    #[must_use]
    pub fn messages(&self) -> u64 {
        self.gather + self.decide + self.ack + self.resume
    }

    /// CPU charged over all survivors, ns.
    #[must_use]
    pub fn cpu_total_ns(&self) -> Nanos {
        self.cpu_ns.iter().map(|(_, ns)| ns).sum()
    }
}

/// Declares `crashed` servers crashed and recovers at virtual time `now` (see the module
/// docs); `workers` are every server thread (those of crashed servers are skipped).
///
/// History bookkeeping: a crashed coordinator's transaction that recovery commits but that
/// its coordinator never recorded (Dnl-1 commits once every lock is granted, at the
/// replicas, before the coordinator hears of it) is recorded into `history` as
/// [`TxnOutcome::Unknown`] with the versions recovery installed, its reads unknown, ending
/// now; the checker then judges its writes by what was observed.
pub fn recover<V: Verbs + Clock>(
    cluster: &Cluster,
    workers: &[Rc<Worker<V>>],
    crashed: &[u16],
    history: &impl HistorySink,
    now: Nanos,
) -> RecoveryReport {
    for &s in crashed {
        if let Some(c) = cluster.crashed.borrow_mut().get_mut(usize::from(s)) {
            *c = true;
        }
    }
    let survivors: Vec<u16> = (0..cluster.stores.len() as u16)
        .filter(|s| !cluster.is_crashed(*s))
        .collect();
    // Every survivor's log entries, per transaction (ordered: a deterministic run).
    let mut logs: BTreeMap<TxnId, Vec<(u16, LogEntry)>> = BTreeMap::new();
    for &s in &survivors {
        for (txn, entries) in &cluster.stores[usize::from(s)].borrow().log {
            for e in entries {
                logs.entry(*txn).or_default().push((s, e.clone()));
            }
        }
    }
    let mut report = RecoveryReport {
        crashed: crashed.to_vec(),
        ..RecoveryReport::default()
    };
    let coordinator_live = |txn: &TxnId| {
        cluster
            .coordinator_server
            .borrow()
            .get(&txn.coordinator.0)
            .is_some_and(|s| !cluster.is_crashed(*s))
    };
    // A live coordinator's committed transaction may have left no entry at any survivor
    // (its primary crashed before Replication reached a backup): decide those too.
    for txn in cluster.decided.borrow().keys() {
        if coordinator_live(txn) {
            logs.entry(*txn).or_default();
        }
    }
    let replicated = cluster.config.commit.replicate.is_some();
    // Per survivor: messages sent or received, store accesses.
    let mut msgs: BTreeMap<u16, u64> = survivors.iter().map(|s| (*s, 0)).collect();
    let mut accesses: BTreeMap<u16, u64> = msgs.clone();
    for (s, _) in logs.values().flatten() {
        *accesses.entry(*s).or_default() += 1; // read while deciding
    }
    for (txn, entries) in logs {
        let live = coordinator_live(&txn);
        let decision = if live {
            cluster.decided.borrow().get(&txn).cloned()
        } else {
            None
        };
        let commit = if live {
            decision.is_some()
        } else if cluster.config.bugs.abort_crashed {
            false
        } else if replicated {
            entries.iter().any(|(_, e)| e.applied.is_some())
        } else {
            fully_locked(cluster, &entries) || unlocked_with_commit(cluster, txn, &entries)
        };
        // The writes a commit installs: per key, the write and its version — the live
        // coordinator's own, or else what the survivors logged.
        let mut writes: HashMap<(u32, u64), (u32, WriteOp)> = decision
            .unwrap_or_default()
            .into_iter()
            .map(|(t, k, v, w)| ((t, k), (v, w)))
            .collect();
        if commit && !live {
            for (s, e) in &entries {
                let Some(w) = &e.write else { continue };
                let version = cluster.stores[usize::from(*s)]
                    .borrow()
                    .version_of(txn, e.table, e.key);
                if let Some(v) = version {
                    writes.entry((e.table, e.key)).or_insert((v, w.clone()));
                }
            }
        }
        let writes: Vec<(u32, u64, u32, WriteOp)> = writes
            .into_iter()
            .map(|((t, k), (v, w))| (t, k, v, w))
            .collect();
        if commit && !live && !cluster.decided.borrow().contains_key(&txn) {
            history.record(TxnRecord {
                id: txn,
                begin: 0,
                end: now,
                outcome: TxnOutcome::Unknown,
                reads: Vec::new(),
                writes: writes
                    .iter()
                    .map(|(t, k, v, w)| WriteEvent {
                        table: TableId(*t),
                        key: Key(*k),
                        version: Version(u64::from(*v)),
                        kind: w.kind,
                    })
                    .collect(),
            });
        }
        // The messages deciding it takes (module docs).
        let coordinator = cluster
            .coordinator_server
            .borrow()
            .get(&txn.coordinator.0)
            .copied();
        let holders: Vec<u16> = {
            let mut h: Vec<u16> = entries.iter().map(|(s, _)| *s).collect();
            h.sort_unstable();
            h.dedup();
            h
        };
        let decider = match coordinator {
            Some(c) if live => Some(c),
            _ => holders.first().copied(),
        };
        // A live coordinator's transaction that no survivor logged finished long ago (the
        // coordinator knows; the rare one whose every entry was at the crashed server is
        // decided too but not counted).
        let counted = !(entries.is_empty() && live);
        for &s in &survivors {
            let holds_entry = holders.contains(&s);
            let applies = holds_entry
                || (commit
                    && writes
                        .iter()
                        .any(|(t, k, _, _)| cluster.replicas(*t, *k).contains(&s)));
            if counted
                && let Some(d) = decider
                && s != d
            {
                if holds_entry {
                    report.cost.gather += 1;
                    *msgs.entry(s).or_default() += 1;
                    *msgs.entry(d).or_default() += 1;
                }
                if applies {
                    report.cost.decide += 1;
                    report.cost.ack += 1;
                    *msgs.entry(s).or_default() += 2;
                    *msgs.entry(d).or_default() += 2;
                }
            }
            if counted && applies {
                let keys = entries.iter().filter(|(h, _)| *h == s).count()
                    + writes
                        .iter()
                        .filter(|(t, k, _, _)| cluster.replicas(*t, *k).contains(&s))
                        .count();
                *accesses.entry(s).or_default() += keys as u64;
            }
            cluster.stores[usize::from(s)]
                .borrow_mut()
                .decide(txn, commit, &writes, |t, k| {
                    cluster.replicas(t, k).contains(&s)
                });
        }
        if entries.is_empty() && live {
            // Finished long ago: nothing to report.
        } else if commit {
            report.committed.push(txn);
        } else {
            report.aborted.push(txn);
        }
    }
    // Resume: every survivor tells every other one it is done.
    let n = survivors.len() as u64;
    report.cost.resume = n * n.saturating_sub(1);
    for m in msgs.values_mut() {
        *m += 2 * n.saturating_sub(1);
    }
    report.cost.store_accesses = accesses.values().sum();
    for &s in &survivors {
        let ns = msgs[&s] * cost::MESSAGE_NS + accesses[&s] * cost::HASHTABLE_ALONE_NS;
        report.cost.cpu_ns.push((s, ns));
        if let Some(w) = workers.iter().find(|w| w.server() == s) {
            w.ctx().cpu(ns);
        }
    }
    cluster.epoch.set(cluster.epoch.get() + 1);
    report.epoch = cluster.epoch.get();
    for w in workers {
        if !cluster.is_crashed(w.server()) {
            w.interrupt();
        }
    }
    report
}

/// Dnl-1: an `UNLOCK` with the commit decision already applied the transaction's write at
/// some live replica of a key it still holds a log entry for (the record names it as its
/// writer), while another replica of that key lost or never got its unlock (the
/// coordinator crashed before retransmitting it). The key is still locked there, so no
/// later writer can have overwritten the evidence. Such a transaction committed; without
/// this rule [`fully_locked`] would see the forgotten entries as missing locks and abort it
/// at the replicas that lag, leaving them disagreeing with the one that applied it.
fn unlocked_with_commit(cluster: &Cluster, txn: TxnId, entries: &[(u16, LogEntry)]) -> bool {
    entries
        .iter()
        .filter(|(_, e)| e.write.is_some())
        .any(|(_, e)| {
            cluster.replicas(e.table, e.key).iter().any(|r| {
                cluster.stores[usize::from(*r)]
                    .borrow()
                    .get(e.table, e.key)
                    .is_some_and(|rec| rec.writer == Some(txn))
            })
        })
}

/// Dnl-1's rule: every key the transaction announced is locked at each of its live replicas.
fn fully_locked(cluster: &Cluster, entries: &[(u16, LogEntry)]) -> bool {
    let Some(announced) = entries.iter().map(|(_, e)| e.lock_set).max() else {
        return false;
    };
    let mut keys: BTreeMap<(u32, u64), Vec<u16>> = BTreeMap::new();
    for (s, e) in entries.iter().filter(|(_, e)| e.locked) {
        keys.entry((e.table, e.key)).or_default().push(*s);
    }
    keys.len() == usize::from(announced)
        && keys
            .iter()
            .all(|((t, k), holders)| cluster.replicas(*t, *k).iter().all(|r| holders.contains(r)))
}
