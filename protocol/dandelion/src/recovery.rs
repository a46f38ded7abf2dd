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
//! **Messages.** Recovery runs over the networking layer like the transactions, on the
//! recovery flow ([`Flow::RECOVERY`]), as RPCs of the reliability layer (request numbers,
//! retransmission after a timeout, exactly-once execution), in the new epoch. The *leader*
//! (the lowest-numbered survivor) drives it from its first thread, in the rounds [`Phase`]
//! names, each a step that waits for every reply:
//!
//! 1. **Halt** ([`halt`]): the crashed servers are declared crashed, the epoch is bumped,
//!    every survivor is halted (its transactions send nothing until it resumes) and every
//!    request in flight is abandoned.
//! 2. **Gather**: a `GATHER` to every other survivor holding log entries of a transaction;
//!    the reply carries them ([`crate::wire::GatheredEntry`]).
//! 3. **Decide**: a `DECIDE` (decision and the writes a commit installs) to every survivor
//!    that holds an entry of the transaction or a live replica of a key it writes; the
//!    survivor applies it on receipt and acknowledges.
//! 4. **Resume**: once every decision is acknowledged, a `RESUME` to every survivor, which
//!    lets its transactions go on in the new epoch.
//!
//! The leader's own share goes through its local batch (no message). Every message is
//! charged by the networking layer (per message and per packet, `cost::MESSAGE_NS`, the
//! NIC model) and every entry read or key applied as a hashtable access; a lost one is
//! re-sent. The recovery time reported ([`RecoveryReport::duration`]) runs from the halt to
//! the last `RESUME` acknowledged.
//!
//! **What is still read in place.** The decisions ([`plan`]) are computed from the
//! survivors' stores and the live coordinators' decisions as they are at the halt — the
//! same entries the `GATHER`s carry, as a halted server's log changes only when a
//! `DECIDE` reaches it — and from the records' writers for Dnl-1's lost-unlock rule. A
//! live coordinator's committed transaction that left no entry at any survivor is sent to
//! the replicas that are behind its writes only (found by reading their records, standing
//! for asking the coordinators which of their commits still have unacknowledged
//! messages). A crash during recovery is not handled (the leader's steps would wait for
//! the new victim's replies; the litmus runner reports such a run as stuck).

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use dmem_txn::{HistorySink, Key, TableId, TxnId, TxnOutcome, TxnRecord, Version, WriteEvent};
use dmem_verbs::{Clock, Nanos, Verbs};

use crate::config::cost;
use crate::net::Flow;
use crate::store::LogEntry;
use crate::wire::{DecidedWrite, Request, Response};
use crate::worker::{Cluster, Step, Worker};

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
    /// The messages it sent.
    pub cost: RecoveryCost,
    /// From the halt to the last `RESUME` acknowledged, ns.
    pub duration: Nanos,
}

/// Recovery's messages: requests the leader sent to other survivors, by round, and their
/// replies (the leader's own share runs locally and is not counted). Retransmissions are
/// in the workers' counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryCost {
    /// `GATHER` requests.
    pub gather: u64,
    /// `DECIDE` requests.
    pub decide: u64,
    /// `RESUME` requests.
    pub resume: u64,
    /// Replies to them (one each: log entries or an acknowledgement).
    pub replies: u64,
    /// Log entries the gathers brought back, and keys the decisions applied, undid or
    /// unlocked, over all survivors (hashtable accesses).
    pub store_accesses: u64,
}

impl RecoveryCost {
    /// Every message sent over the network.
    #[must_use]
    pub fn messages(&self) -> u64 {
        self.gather + self.decide + self.resume + self.replies
    }
}

/// A recovery round (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Declare the crash, bump the epoch, halt the survivors.
    Halt,
    /// Collect the survivors' log entries.
    Gather,
    /// Send the decisions; survivors apply them.
    Decide,
    /// Let the survivors resume in the new epoch.
    Resume,
}

/// One transaction's decision ([`plan`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// The transaction.
    pub txn: TxnId,
    /// Commit (else abort).
    pub commit: bool,
    /// The writes a commit installs.
    pub writes: Vec<DecidedWrite>,
    /// Survivors holding log entries of it.
    pub holders: Vec<u16>,
    /// Survivors it must be decided at (holders, and live replicas of its writes that need
    /// them).
    pub appliers: Vec<u16>,
    /// Whether it is reported: a live coordinator's transaction that left no entry at any
    /// survivor finished long ago as far as anyone asked.
    pub reported: bool,
}

/// The requests of round `phase` for `plan`: `(server, request)`; the leader's own ones are
/// included (they run in its local batch).
#[must_use]
pub fn requests(
    phase: Phase,
    plan: &[Planned],
    survivors: &[u16],
    leader: u16,
    epoch: u64,
) -> Vec<(u16, Request)> {
    match phase {
        Phase::Halt => Vec::new(),
        Phase::Gather => plan
            .iter()
            .flat_map(|p| {
                p.holders
                    .iter()
                    .filter(|&&h| h != leader)
                    .map(move |&h| (h, Request::Gather { txn: p.txn, epoch }))
            })
            .collect(),
        Phase::Decide => plan
            .iter()
            .flat_map(|p| {
                p.appliers.iter().map(move |&s| {
                    (
                        s,
                        Request::Decide {
                            txn: p.txn,
                            epoch,
                            commit: p.commit,
                            writes: p.writes.clone(),
                        },
                    )
                })
            })
            .collect(),
        Phase::Resume => survivors
            .iter()
            .map(|&s| (s, Request::Resume { epoch }))
            .collect(),
    }
}

/// Round 1 ([`Phase::Halt`]): declares `crashed` crashed, bumps the epoch, halts every
/// survivor and abandons every request in flight (their steps fail). Returns the
/// survivors and the new epoch.
pub fn halt<V: Verbs + Clock>(
    cluster: &Cluster,
    workers: &[Rc<Worker<V>>],
    crashed: &[u16],
) -> (Vec<u16>, u64) {
    for &s in crashed {
        if let Some(c) = cluster.crashed.borrow_mut().get_mut(usize::from(s)) {
            *c = true;
        }
    }
    let survivors: Vec<u16> = (0..cluster.stores.len() as u16)
        .filter(|s| !cluster.is_crashed(*s))
        .collect();
    cluster.epoch.set(cluster.epoch.get() + 1);
    for &s in &survivors {
        cluster.set_halted(s, true);
    }
    for w in workers {
        if !cluster.is_crashed(w.server()) {
            w.interrupt();
        }
    }
    (survivors, cluster.epoch.get())
}

/// Recovers from the crash of `crashed` (module docs): halts, then the leader — the
/// lowest-numbered survivor, `workers`' first thread of it — gathers, decides and resumes
/// over the network. `workers` are every server thread (those of crashed servers are
/// skipped).
///
/// History bookkeeping: a crashed coordinator's transaction that recovery commits but that
/// its coordinator never recorded (Dnl-1 commits once every lock is granted, at the
/// replicas, before the coordinator hears of it) is recorded into `history` as
/// [`TxnOutcome::Unknown`] with the versions recovery installed, its reads unknown, ending
/// at the halt; the checker then judges its writes by what was observed.
pub async fn recover<V: Verbs + Clock>(
    cluster: &Cluster,
    workers: &[Rc<Worker<V>>],
    crashed: &[u16],
    history: &impl HistorySink,
) -> RecoveryReport {
    let (survivors, epoch) = halt(cluster, workers, crashed);
    let mut report = RecoveryReport {
        crashed: crashed.to_vec(),
        epoch,
        ..RecoveryReport::default()
    };
    let Some(leader) = survivors
        .first()
        .and_then(|&s| workers.iter().find(|w| w.server() == s))
    else {
        return report; // nobody left
    };
    let start = leader.ctx().now();
    let plan = plan(cluster, history, start);
    let me = leader.server();
    let remote = |reqs: &[(u16, Request)]| reqs.iter().filter(|(s, _)| *s != me).count() as u64;

    let gathers = requests(Phase::Gather, &plan, &survivors, me, epoch);
    report.cost.gather = remote(&gathers);
    // The leader reads its own entries too.
    let own: usize = plan
        .iter()
        .filter(|p| p.holders.contains(&me))
        .map(|p| {
            cluster.stores[usize::from(me)]
                .borrow()
                .gathered(p.txn)
                .len()
        })
        .sum();
    let mut entries = own as u64;
    if let Ok(replies) = round(leader, gathers, epoch).await {
        for r in replies {
            if let Response::Gathered { entries: e } = r {
                entries += e.len() as u64;
            }
        }
    }
    // Deciding reads every gathered entry once.
    leader.ctx().cpu(entries * cost::HASHTABLE_ALONE_NS);

    let decides = requests(Phase::Decide, &plan, &survivors, me, epoch);
    report.cost.decide = remote(&decides);
    let applied: u64 = decides
        .iter()
        .map(|(s, r)| match r {
            Request::Decide { txn, writes, .. } => {
                let logged = cluster.stores[usize::from(*s)]
                    .borrow()
                    .log
                    .get(txn)
                    .map_or(0, Vec::len);
                (logged + writes.len()) as u64
            }
            _ => 0,
        })
        .sum();
    let _ = round(leader, decides, epoch).await;

    let resumes = requests(Phase::Resume, &plan, &survivors, me, epoch);
    report.cost.resume = remote(&resumes);
    let _ = round(leader, resumes, epoch).await;

    report.cost.replies = report.cost.gather + report.cost.decide + report.cost.resume;
    report.cost.store_accesses = entries + applied;
    report.duration = leader.ctx().now().saturating_sub(start);
    for p in plan.into_iter().filter(|p| p.reported) {
        if p.commit {
            report.committed.push(p.txn);
        } else {
            report.aborted.push(p.txn);
        }
    }
    report
}

/// Sends one round's requests from `leader` on the recovery flow and waits for every reply.
async fn round<V: Verbs + Clock>(
    leader: &Worker<V>,
    reqs: Vec<(u16, Request)>,
    epoch: u64,
) -> Result<Vec<Response>, crate::worker::Interrupted> {
    let step = Step::new(reqs.len());
    for (i, (to, req)) in reqs.into_iter().enumerate() {
        leader
            .issue(to, Flow::RECOVERY, req, Some((Rc::clone(&step), i)), epoch)
            .await;
    }
    step.wait().await
}

/// The decisions (module docs), from the survivors' state at the halt; records the
/// history of crashed coordinators' transactions committed unseen (see [`recover`]).
#[must_use]
pub fn plan(cluster: &Cluster, history: &impl HistorySink, now: Nanos) -> Vec<Planned> {
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
    let mut plan = Vec::new();
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
        let mut writes: HashMap<(u32, u64), (u32, crate::wire::WriteOp)> = decision
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
        let mut writes: Vec<DecidedWrite> = writes
            .into_iter()
            .map(|((t, k), (v, w))| (t, k, v, w))
            .collect();
        writes.sort_by_key(|(t, k, ..)| (*t, *k)); // deterministic messages
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
        let mut holders: Vec<u16> = entries.iter().map(|(s, _)| *s).collect();
        holders.sort_unstable();
        holders.dedup();
        let reported = !(entries.is_empty() && live);
        let appliers: Vec<u16> = survivors
            .iter()
            .copied()
            .filter(|&s| {
                holders.contains(&s)
                    || (commit
                        && writes.iter().any(|(t, k, v, _)| {
                            cluster.replicas(*t, *k).contains(&s)
                                && (reported || behind(cluster, s, *t, *k, *v))
                        }))
            })
            .collect();
        if appliers.is_empty() && !reported {
            continue; // finished long ago: every live replica has its writes
        }
        plan.push(Planned {
            txn,
            commit,
            writes,
            holders,
            appliers,
            reported,
        });
    }
    plan
}

/// Whether replica `s` of `(table, key)` has not installed `version` yet (wrapping 29-bit
/// distance, as [`crate::ServerStore::decide`] applies).
fn behind(cluster: &Cluster, s: u16, table: u32, key: u64, version: u32) -> bool {
    use dmem_layout::kv_meta::KvMeta;
    let current = cluster.stores[usize::from(s)]
        .borrow()
        .meta(table, key)
        .version();
    let ahead = version.wrapping_sub(current) & KvMeta::MAX_VERSION;
    ahead != 0 && ahead < 1 << (KvMeta::VERSION_BITS - 1)
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
