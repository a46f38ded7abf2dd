//! Recovery after server crashes (Dandelion §4.4).
//!
//! Operation halts, the survivors' state is gathered, every transaction any survivor holds
//! state for is decided, the decisions are applied, and the survivors resume in a new
//! epoch; crashed servers are not replaced and their replicas are not re-created (as the
//! paper).
//!
//! Decisions never contradict one reported to a client:
//!
//! * a transaction of a **live** coordinator commits iff the coordinator decided commit
//!   (it reports commit only after deciding, and abort only without deciding);
//! * a transaction of a **crashed** coordinator is decided from the survivors' logs. With a Replication step (Dnl-4, Dnl-2) the decision precedes Replication
//!   and commit is reported only after every replica applied it, so it commits iff some
//!   survivor holds a Replication entry. Without one (Dnl-1) commit is reported once every
//!   replica of every locked key granted its lock, and abort only after the unlocks are
//!   acknowledged, so it commits iff the survivors hold a lock entry at every live replica
//!   of as many distinct keys as its `LOCK`s announced — or if a committing `UNLOCK`
//!   already applied one of its writes at a live replica while another replica of that key
//!   still holds its entry (an unlock lost with its coordinator; found by the litmus suite
//!   once messages are lost).
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
//! 2. **Gather**: a `GATHER` to every other survivor; the reply ([`survivor_state`],
//!    [`GatheredTxn`]) carries, per transaction, the survivor's log entries of it (with the
//!    version each write installs there) and — if its coordinator is on that survivor and
//!    committing it — that coordinator's decision and writes; also such a transaction that
//!    left no entry at the survivor. A reply fits one packet: a survivor with more sends
//!    pages ([`page`]), and the leader asks again after the last transaction it got.
//! 3. **Query** ([`queries`], only when needed): a `QUERY` asks the survivor running a
//!    logged transaction's coordinator (the deployment's coordinator placement) what it
//!    decided, if the gather did not already say; and, for Dnl-1, for a transaction of a
//!    crashed coordinator that the logs do not show fully locked, asks the live replicas
//!    of its written keys that hold no entry of it whether their current version is its
//!    write (a committing `UNLOCK` applied it there and dropped the entry). Answered by
//!    [`answer`], a page at a time like the gather.
//! 4. **Decide**: [`plan`] — a pure function of the gathered replies and the answers —
//!    decides; a `DECIDE` (decision and the writes a commit installs) goes to
//!    every survivor that holds an entry of the transaction or, for a commit, a live
//!    replica of a key it writes; the survivor applies it on receipt (a write only where
//!    it is behind) and acknowledges.
//! 5. **Resume**: once every decision is acknowledged, a `RESUME` to every survivor, which
//!    lets its transactions go on in the new epoch (and forgets the commits this recovery
//!    decided, `Cluster::in_commit`).
//!
//! The leader's own share is read from its own store and coordinators, and its decisions
//! applied through its local batch (no message). Every message is charged by the
//! networking layer (per message and per packet, `cost::MESSAGE_NS`, the NIC model) and
//! every entry read or key applied as a hashtable access; a lost one is re-sent. The
//! recovery time reported ([`RecoveryReport::duration`]) runs from the halt to the last
//! `RESUME` acknowledged.
//!
//! **Deviation: one decider.** The paper has every survivor decide its own transactions
//! and the remote ones it logged. Here one leader decides all of them from the gathered
//! state: a transaction's entries are spread over several survivors (Dnl-1's rule needs
//! every replica's lock entries, Dnl-4's any replica's Replication entry), so a per-survivor
//! decider would need the same exchange per transaction, and one decider gives every
//! survivor the same decision without a second agreement round. It costs one gather
//! round trip and puts the deciding CPU on one thread.
//!
//! **What is still not from the messages.** The halt is one instant (the servers of a
//! deployment share one epoch counter, `Cluster::epoch`). The history instrumentation —
//! recording a crashed coordinator's transaction that recovery commits but that its
//! coordinator never recorded — reads the cluster's `decided` map to know what the
//! checker's history already holds; no decision depends on it. Where keys and coordinators
//! live ([`Rules`]) is deployment configuration every server knows. A crash during
//! recovery is not handled: the leader's round retransmits to the new victim until its
//! epoch moves on, which nothing does (the failure detector awaits this recovery); a round
//! that does fail stops the recovery with the survivors halted
//! ([`RecoveryReport::abandoned`]). Restarting from the gather would not be safe as it
//! stands — a `DECIDE` applied at one survivor drops the entries the decision rested on —
//! so survivors would have to keep their applied decisions until a recovery completes and
//! report them (crate README, "Not built").

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;

use dmem_txn::{HistorySink, Key, TableId, TxnId, TxnOutcome, TxnRecord, Version, WriteEvent};
use dmem_verbs::{Clock, Nanos, Verbs};

use crate::cluster::{Cluster, Placement};
use crate::config::cost;
use crate::net::Flow;
use crate::wire::{
    CoordinatorState, DecidedWrite, GatheredEntry, GatheredTxn, Request, Response, WriteOp,
};
use crate::worker::{Step, Worker};

pub use crate::survivor::{Query, answer, page, page_budget, survivor_state};

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
    /// A round failed (its epoch moved on: a crash during recovery) and recovery stopped
    /// there, the survivors still halted (module docs).
    pub abandoned: bool,
}

/// Recovery's messages: requests the leader sent to other survivors, by round, and their
/// replies (the leader's own share runs locally and is not counted). Retransmissions are
/// in the workers' counters; bytes of every message in the workers' packet counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryCost {
    /// `GATHER` requests (one per survivor and page).
    pub gather: u64,
    /// `QUERY` requests.
    pub query: u64,
    /// `DECIDE` requests.
    pub decide: u64,
    /// `RESUME` requests.
    pub resume: u64,
    /// Replies to them (one each).
    pub replies: u64,
    /// Payload bytes of the `GATHER` and `QUERY` replies the leader received (what
    /// deciding from the messages carries).
    pub gathered_bytes: u64,
    /// Transactions the gathers brought back (each of its log entries, at least one),
    /// decisions and keys queried, and keys the decisions applied,
    /// undid or unlocked, over all survivors (hashtable accesses).
    pub store_accesses: u64,
}

impl RecoveryCost {
    /// Every message sent over the network.
    #[must_use]
    pub fn messages(&self) -> u64 {
        self.gather + self.query + self.decide + self.resume + self.replies
    }
}

/// A recovery round (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Declare the crash, bump the epoch, halt the survivors.
    Halt,
    /// Collect the survivors' state.
    Gather,
    /// Ask the live coordinators for their decisions; Dnl-1: ask replicas whether a write
    /// already stands there.
    Query,
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
    /// Decided from the logs (its coordinator crashed).
    pub from_logs: bool,
    /// The writes a commit installs.
    pub writes: Vec<DecidedWrite>,
    /// Survivors holding log entries of it, with how many each.
    pub holders: Vec<(u16, usize)>,
    /// Survivors it must be decided at (holders, and for a commit the live replicas of its
    /// writes).
    pub appliers: Vec<u16>,
    /// Whether it is reported: a transaction that left no entry at any survivor is one its
    /// live coordinator is still committing, and that coordinator tells its client.
    pub reported: bool,
}

/// What the decision rules need besides the gathered replies: where keys and coordinators
/// live (deployment configuration, known to every server), which servers survived, and the
/// protocol's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    /// Key placement.
    pub placement: Placement,
    /// The survivors, ascending.
    pub survivors: Vec<u16>,
    /// The server of every coordinator.
    pub coordinators: BTreeMap<u32, u16>,
    /// The protocol has a Replication step (Dnl-4, Dnl-2; else Dnl-1).
    pub replicated: bool,
    /// Planted bug `abort-crashed`: every transaction decided from the logs aborts.
    pub abort_crashed: bool,
}

impl Rules {
    /// `cluster`'s, after the halt.
    #[must_use]
    pub fn of(cluster: &Cluster) -> Self {
        Self {
            placement: cluster.placement,
            survivors: (0..cluster.stores.len() as u16)
                .filter(|s| !cluster.is_crashed(*s))
                .collect(),
            coordinators: cluster
                .coordinator_server
                .borrow()
                .iter()
                .map(|(c, s)| (*c, *s))
                .collect(),
            replicated: cluster.config.commit.replicate.is_some(),
            abort_crashed: cluster.config.bugs.abort_crashed,
        }
    }

    /// The survivor running `txn`'s coordinator (`None`: it crashed).
    #[must_use]
    pub fn live_coordinator(&self, txn: TxnId) -> Option<u16> {
        self.coordinators
            .get(&txn.coordinator.0)
            .copied()
            .filter(|s| self.survivors.contains(s))
    }

    /// The live replicas of `(table, key)`.
    #[must_use]
    pub fn replicas(&self, table: u32, key: u64) -> Vec<u16> {
        self.placement
            .replicas(table, key)
            .filter(|s| self.survivors.contains(s))
            .collect()
    }
}

/// The leader's view after the gathers: per survivor, the transactions it reported.
pub type Gathered = BTreeMap<u16, Vec<GatheredTxn>>;

/// What the `QUERY`s brought back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answers {
    /// Per transaction asked, its live coordinator's decision: the writes if it committed,
    /// `None` if it did not.
    pub decisions: BTreeMap<TxnId, Option<Vec<DecidedWrite>>>,
    /// Per `(server, txn, table, key)` asked that said yes: the server's current version
    /// of the key is `txn`'s write.
    pub written: BTreeSet<(u16, TxnId, u32, u64)>,
}

/// The requests of round `phase` for `plan`: `(server, request)`; the leader's own ones are
/// included (they run in its local batch). [`Phase::Gather`] is the first page of every
/// survivor's state; [`Phase::Query`]'s depend on the gathered replies ([`query_requests`]).
#[must_use]
pub fn requests(
    phase: Phase,
    plan: &[Planned],
    survivors: &[u16],
    leader: u16,
    epoch: u64,
) -> Vec<(u16, Request)> {
    match phase {
        Phase::Halt | Phase::Query => Vec::new(),
        Phase::Gather => survivors
            .iter()
            .filter(|&&s| s != leader)
            .map(|&s| (s, Request::Gather { epoch, after: None }))
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

/// `QUERY` requests for `queries` (from [`queries`]) to servers other than `leader`,
/// each within `budget` bytes.
#[must_use]
pub fn query_requests(
    queries: &BTreeMap<u16, Query>,
    leader: u16,
    epoch: u64,
    budget: usize,
) -> Vec<(u16, Request)> {
    // The epoch, two counts and the reliability layer's mark take 16 bytes; half the rest
    // for transactions (12 bytes each), half for keys (24 bytes each).
    let room = budget.saturating_sub(16) / 2;
    let (per_txns, per_keys) = ((room / 12).max(1), (room / 24).max(1));
    let mut out = Vec::new();
    for (&s, (txns, keys)) in queries.iter().filter(|(s, _)| **s != leader) {
        let mut txns = txns.chunks(per_txns);
        let mut keys = keys.chunks(per_keys);
        loop {
            let (t, k) = (txns.next(), keys.next());
            if t.is_none() && k.is_none() {
                break;
            }
            out.push((
                s,
                Request::Query {
                    epoch,
                    txns: t.unwrap_or_default().to_vec(),
                    keys: k.unwrap_or_default().to_vec(),
                },
            ));
        }
    }
    out
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
/// lowest-numbered survivor, `workers`' first thread of it — gathers, queries, decides and
/// resumes over the network. `workers` are every server thread (those of crashed servers
/// are skipped).
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
    let lead = Lead {
        cluster,
        leader,
        survivors: &survivors,
        epoch,
        rules: Rules::of(cluster),
    };
    match lead.run(history, start, &mut report).await {
        Ok(()) => report,
        Err(Abandoned) => abandon(report, leader, start),
    }
}

/// A round of the leader's failed: the epoch moved on under this recovery.
struct Abandoned;

/// The leader's side of one recovery: who leads, whom it talks to, in which epoch.
struct Lead<'a, V> {
    cluster: &'a Cluster,
    leader: &'a Worker<V>,
    survivors: &'a [u16],
    epoch: u64,
    rules: Rules,
}

impl<V: Verbs + Clock> Lead<'_, V> {
    /// Gather, query, decide, resume; the report's costs and decisions filled in.
    async fn run(
        &self,
        history: &impl HistorySink,
        start: Nanos,
        report: &mut RecoveryReport,
    ) -> Result<(), Abandoned> {
        let gathered = self.gather(report).await?;
        let entries: u64 = gathered
            .values()
            .flatten()
            .map(|t| t.entries.len().max(1) as u64)
            .sum();
        // Deciding reads every gathered transaction once.
        self.leader.ctx().cpu(entries * cost::HASHTABLE_ALONE_NS);
        let (answers, asked) = self.query(&gathered, report).await?;
        report.cost.store_accesses = entries + asked;

        let plan = plan(&gathered, &answers, &self.rules);
        record_unseen_commits(self.cluster, history, &plan, start);
        let applied = self.decide_and_resume(&plan, report).await?;
        report.cost.replies =
            report.cost.gather + report.cost.query + report.cost.decide + report.cost.resume;
        report.cost.store_accesses += applied;
        report.duration = self.leader.ctx().now().saturating_sub(start);
        for p in plan.into_iter().filter(|p| p.reported) {
            if p.commit {
                report.committed.push(p.txn);
            } else {
                report.aborted.push(p.txn);
            }
        }
        Ok(())
    }

    /// The requests of `reqs` that leave the leader's server (its own are served locally).
    fn remote(&self, reqs: &[(u16, Request)]) -> u64 {
        let me = self.leader.server();
        reqs.iter().filter(|(s, _)| *s != me).count() as u64
    }

    /// Gather: the leader's own share read locally, the others' page by page.
    async fn gather(&self, report: &mut RecoveryReport) -> Result<Gathered, Abandoned> {
        let (cluster, me, epoch) = (self.cluster, self.leader.server(), self.epoch);
        let mut gathered = Gathered::new();
        gathered.insert(
            me,
            survivor_state(cluster, me, &cluster.stores[usize::from(me)].borrow()),
        );
        let mut gathers = requests(Phase::Gather, &[], self.survivors, me, epoch);
        while !gathers.is_empty() {
            report.cost.gather += self.remote(&gathers);
            let servers: Vec<u16> = gathers.iter().map(|(s, _)| *s).collect();
            let replies = round(self.leader, gathers, epoch)
                .await
                .map_err(|_| Abandoned)?;
            gathers = Vec::new();
            for (s, reply) in servers.into_iter().zip(replies) {
                let Response::Gathered { more, txns } = reply else {
                    return Err(Abandoned);
                };
                report.cost.gathered_bytes += Response::Gathered {
                    more,
                    txns: txns.clone(),
                }
                .emit()
                .len() as u64;
                let after = txns.last().map(|t| t.txn);
                gathered.entry(s).or_default().extend(txns);
                if more {
                    gathers.push((s, Request::Gather { epoch, after }));
                }
            }
        }
        Ok(gathered)
    }

    /// Queries the live coordinators the gather did not hear from, and (Dnl-1) the
    /// replicas. Returns the answers and how many transactions and keys were asked about.
    async fn query(
        &self,
        gathered: &Gathered,
        report: &mut RecoveryReport,
    ) -> Result<(Answers, u64), Abandoned> {
        let (cluster, me, epoch) = (self.cluster, self.leader.server(), self.epoch);
        let budget = page_budget(self.leader.packet_limit());
        let mut pending = queries(gathered, &self.rules);
        let mut answers = Answers::default();
        let mut asked = 0u64;
        if let Some(own) = pending.remove(&me) {
            asked += (own.0.len() + own.1.len()) as u64;
            let store = cluster.stores[usize::from(me)].borrow();
            let reply = answer(cluster, me, &store, &own, usize::MAX);
            absorb(&mut answers, me, &own, reply);
        }
        while !pending.is_empty() {
            let reqs = query_requests(&pending, me, epoch, budget);
            pending.clear();
            report.cost.query += self.remote(&reqs);
            let sent: Vec<(u16, Query)> = reqs
                .iter()
                .map(|(s, r)| match r {
                    Request::Query { txns, keys, .. } => (*s, (txns.clone(), keys.clone())),
                    _ => (*s, Query::default()),
                })
                .collect();
            let replies = round(self.leader, reqs, epoch)
                .await
                .map_err(|_| Abandoned)?;
            for ((s, q), reply) in sent.into_iter().zip(replies) {
                report.cost.gathered_bytes += reply.emit().len() as u64;
                let Response::Answered { decisions, .. } = &reply else {
                    return Err(Abandoned);
                };
                let got = decisions.len();
                asked += (got + q.1.len()) as u64;
                if got < q.0.len() {
                    let rest = &q.0[got..];
                    pending.entry(s).or_default().0.extend_from_slice(rest);
                }
                absorb(&mut answers, s, &q, reply);
            }
        }
        Ok((answers, asked))
    }

    /// Sends the decisions of `plan`, then resumes every survivor. Returns the store
    /// accesses the decisions cost at the survivors (undo entries plus writes).
    async fn decide_and_resume(
        &self,
        plan: &[Planned],
        report: &mut RecoveryReport,
    ) -> Result<u64, Abandoned> {
        let (me, epoch) = (self.leader.server(), self.epoch);
        let decides = requests(Phase::Decide, plan, self.survivors, me, epoch);
        report.cost.decide = self.remote(&decides);
        let logged: HashMap<(u16, TxnId), usize> = plan
            .iter()
            .flat_map(|p| p.holders.iter().map(move |&(s, n)| ((s, p.txn), n)))
            .collect();
        let applied: u64 = decides
            .iter()
            .map(|(s, r)| match r {
                Request::Decide { txn, writes, .. } => {
                    (logged.get(&(*s, *txn)).copied().unwrap_or(0) + writes.len()) as u64
                }
                _ => 0,
            })
            .sum();
        round(self.leader, decides, epoch)
            .await
            .map_err(|_| Abandoned)?;
        let resumes = requests(Phase::Resume, plan, self.survivors, me, epoch);
        report.cost.resume = self.remote(&resumes);
        round(self.leader, resumes, epoch)
            .await
            .map_err(|_| Abandoned)?;
        Ok(applied)
    }
}

/// A round failed: the epoch moved on under this recovery (module docs).
fn abandon<V: Verbs + Clock>(
    mut report: RecoveryReport,
    leader: &Worker<V>,
    start: Nanos,
) -> RecoveryReport {
    report.abandoned = true;
    report.duration = leader.ctx().now().saturating_sub(start);
    report
}

/// Adds a `QUERY`'s `reply` from `server` to `answers`.
fn absorb(answers: &mut Answers, server: u16, (txns, keys): &Query, reply: Response) {
    let Response::Answered { decisions, written } = reply else {
        return;
    };
    for (txn, d) in txns.iter().zip(decisions) {
        match d {
            CoordinatorState::Unknown => {}
            CoordinatorState::Undecided => {
                answers.decisions.insert(*txn, None);
            }
            CoordinatorState::Committed(w) => {
                answers.decisions.insert(*txn, Some(w));
            }
        }
    }
    for (&(txn, t, k), yes) in keys.iter().zip(written) {
        if yes {
            answers.written.insert((server, txn, t, k));
        }
    }
}

/// History instrumentation (see [`recover`]): a transaction committed from the logs whose
/// coordinator never recorded it. `Cluster::decided` stands for "the history already has
/// it" here; no decision reads it.
fn record_unseen_commits(
    cluster: &Cluster,
    history: &impl HistorySink,
    plan: &[Planned],
    now: Nanos,
) {
    let decided = cluster.decided.borrow();
    for p in plan
        .iter()
        .filter(|p| p.commit && p.from_logs && !decided.contains_key(&p.txn))
    {
        history.record(TxnRecord {
            id: p.txn,
            begin: 0,
            end: now,
            outcome: TxnOutcome::Unknown,
            reads: Vec::new(),
            writes: p
                .writes
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

/// One transaction as all the gathered replies show it.
#[derive(Debug, Default)]
struct TxnView {
    /// What a survivor's coordinator committing it said (`None`: none is): `Some(None)`
    /// undecided, `Some(Some(writes))` committed.
    coordinator: Option<Option<Vec<DecidedWrite>>>,
    /// Every survivor's entries of it.
    entries: Vec<(u16, GatheredEntry)>,
}

fn views(gathered: &Gathered, answers: &Answers) -> BTreeMap<TxnId, TxnView> {
    let mut out: BTreeMap<TxnId, TxnView> = BTreeMap::new();
    for (&s, txns) in gathered {
        for t in txns {
            let v = out.entry(t.txn).or_default();
            match &t.coordinator {
                CoordinatorState::Unknown => {}
                CoordinatorState::Undecided => {
                    v.coordinator.get_or_insert(None);
                }
                CoordinatorState::Committed(w) => v.coordinator = Some(Some(w.clone())),
            }
            v.entries.extend(t.entries.iter().map(|e| (s, e.clone())));
        }
    }
    for (txn, d) in &answers.decisions {
        if let Some(v) = out.get_mut(txn)
            && v.coordinator.is_none()
        {
            v.coordinator = Some(d.clone());
        }
    }
    out
}

/// What the `QUERY`s must ask, per survivor (module docs): the logged transactions whose
/// coordinator runs on it and that the gather did not report a decision for; and (Dnl-1)
/// for each crashed coordinator's transaction that the logs do not show fully locked,
/// every live replica of a key it writes that holds no entry of it for that key.
#[must_use]
pub fn queries(gathered: &Gathered, rules: &Rules) -> BTreeMap<u16, Query> {
    let mut out: BTreeMap<u16, Query> = BTreeMap::new();
    for (txn, v) in views(gathered, &Answers::default()) {
        if v.coordinator.is_some() || v.entries.is_empty() {
            continue;
        }
        if let Some(s) = rules.live_coordinator(txn) {
            out.entry(s).or_default().0.push(txn);
            continue;
        }
        if rules.replicated || rules.abort_crashed || fully_locked(rules, &v.entries) {
            continue;
        }
        let mut keys = BTreeSet::new();
        for (_, e) in v.entries.iter().filter(|(_, e)| e.write.is_some()) {
            for r in rules.replicas(e.table, e.key) {
                let has_entry = v
                    .entries
                    .iter()
                    .any(|(s, o)| *s == r && o.table == e.table && o.key == e.key);
                if !has_entry {
                    keys.insert((r, e.table, e.key));
                }
            }
        }
        for (r, t, k) in keys {
            out.entry(r).or_default().1.push((txn, t, k));
        }
    }
    out
}

/// The decisions (module docs) — a pure function of the survivors' gathered replies,
/// the answers to the queries ([`queries`]) and the rules.
#[must_use]
pub fn plan(gathered: &Gathered, answers: &Answers, rules: &Rules) -> Vec<Planned> {
    let mut plan = Vec::new();
    for (txn, view) in views(gathered, answers) {
        let from_logs = view.coordinator.is_none();
        let commit = match &view.coordinator {
            Some(decision) => decision.is_some(),
            None if rules.abort_crashed && rules.live_coordinator(txn).is_none() => false,
            None if rules.replicated => view.entries.iter().any(|(_, e)| e.applied),
            None => {
                fully_locked(rules, &view.entries)
                    || answers.written.iter().any(|(_, t, ..)| *t == txn)
            }
        };
        // The writes a commit installs: per key, the write and its version — the
        // coordinator's own, or else what the survivors logged.
        let mut writes: BTreeMap<(u32, u64), (u32, WriteOp)> = view
            .coordinator
            .clone()
            .flatten()
            .unwrap_or_default()
            .into_iter()
            .map(|(t, k, v, w)| ((t, k), (v, w)))
            .collect();
        if commit && from_logs {
            for (_, e) in &view.entries {
                if let Some(w) = &e.write
                    && e.version != 0
                {
                    writes
                        .entry((e.table, e.key))
                        .or_insert((e.version, w.clone()));
                }
            }
        }
        let writes: Vec<DecidedWrite> = writes
            .into_iter()
            .map(|((t, k), (v, w))| (t, k, v, w))
            .collect();
        let mut holders: BTreeMap<u16, usize> = BTreeMap::new();
        for (s, _) in &view.entries {
            *holders.entry(*s).or_default() += 1;
        }
        let appliers: Vec<u16> = rules
            .survivors
            .iter()
            .copied()
            .filter(|&s| {
                holders.contains_key(&s)
                    || (commit
                        && writes
                            .iter()
                            .any(|(t, k, ..)| rules.replicas(*t, *k).contains(&s)))
            })
            .collect();
        if appliers.is_empty() {
            continue; // an undecided commit that left nothing anywhere
        }
        plan.push(Planned {
            txn,
            commit,
            from_logs,
            writes,
            holders: holders.into_iter().collect(),
            appliers,
            reported: !view.entries.is_empty(),
        });
    }
    plan
}

/// Dnl-1's rule: every key the transaction announced is locked at each of its live replicas.
fn fully_locked(rules: &Rules, entries: &[(u16, GatheredEntry)]) -> bool {
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
            .all(|((t, k), holders)| rules.replicas(*t, *k).iter().all(|r| holders.contains(r)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmem_txn::{CoordinatorId, WriteKind};

    const T: u32 = 0;

    fn txn(coordinator: u32, seq: u64) -> TxnId {
        TxnId {
            coordinator: CoordinatorId(coordinator),
            seq,
        }
    }

    fn put(v: u8) -> WriteOp {
        WriteOp {
            kind: WriteKind::Update,
            value: vec![v; 8],
        }
    }

    /// 4 servers, R = 3, server 3 crashed; coordinator 10 on server 1, 30 on server 3.
    fn rules(replicated: bool) -> Rules {
        Rules {
            placement: Placement::new(4, 3),
            survivors: vec![0, 1, 2],
            coordinators: [(10, 1), (30, 3)].into_iter().collect(),
            replicated,
            abort_crashed: false,
        }
    }

    /// A key whose replicas are exactly the survivors 0, 1, 2.
    fn live_key(r: &Rules) -> u64 {
        (0..1000)
            .find(|&k| r.replicas(T, k) == vec![0, 1, 2])
            .expect("some key has primary 0")
    }

    fn entry(key: u64, locked: bool, applied: bool, version: u32, write: bool) -> GatheredEntry {
        GatheredEntry {
            table: T,
            key,
            locked,
            applied,
            lock_set: u16::from(locked),
            version,
            write: write.then(|| put(7)),
        }
    }

    fn logged(t: TxnId, entries: Vec<GatheredEntry>) -> GatheredTxn {
        GatheredTxn {
            txn: t,
            coordinator: CoordinatorState::Unknown,
            entries,
        }
    }

    #[test]
    fn dnl_1_lost_unlock_commits_only_with_the_replicas_answer() {
        let r = rules(false);
        let k = live_key(&r);
        let t = txn(30, 1); // crashed coordinator
        // Server 0 applied the committing UNLOCK and dropped its entry; 1 and 2 still hold
        // theirs (their unlocks were lost with the coordinator).
        let gathered: Gathered = [
            (0, Vec::new()),
            (1, vec![logged(t, vec![entry(k, true, false, 5, true)])]),
            (2, vec![logged(t, vec![entry(k, true, false, 5, true)])]),
        ]
        .into_iter()
        .collect();
        let q = queries(&gathered, &r);
        assert_eq!(q.len(), 1, "{q:?}");
        assert_eq!(q[&0], (Vec::new(), vec![(t, T, k)]));

        // Server 0 says no (its version is not t's): not fully locked, so abort.
        let planned = plan(&gathered, &Answers::default(), &r);
        assert_eq!(planned.len(), 1);
        assert!(!planned[0].commit && planned[0].from_logs);
        assert_eq!(planned[0].appliers, vec![1, 2]);

        // Server 0 says yes: commit, rolled forward to every live replica.
        let mut answers = Answers::default();
        answers.written.insert((0, t, T, k));
        let planned = plan(&gathered, &answers, &r);
        assert!(planned[0].commit && planned[0].reported);
        assert_eq!(planned[0].writes, vec![(T, k, 5, put(7))]);
        assert_eq!(planned[0].appliers, vec![0, 1, 2]);
        assert_eq!(planned[0].holders, vec![(1, 1), (2, 1)]);
    }

    #[test]
    fn dnl_1_fully_locked_commits_without_a_query() {
        let r = rules(false);
        let k = live_key(&r);
        let t = txn(30, 2);
        let gathered: Gathered = (0..3)
            .map(|s| (s, vec![logged(t, vec![entry(k, true, false, 9, true)])]))
            .collect();
        assert!(queries(&gathered, &r).is_empty());
        let planned = plan(&gathered, &Answers::default(), &r);
        assert!(planned[0].commit);
        assert_eq!(planned[0].writes, vec![(T, k, 9, put(7))]);
    }

    #[test]
    fn a_live_coordinator_is_asked_and_its_answer_wins() {
        let r = rules(false);
        let k = live_key(&r);
        let t = txn(10, 3); // coordinator on server 1, finished as far as the gather saw
        // Fully locked everywhere, which the logs alone would commit.
        let gathered: Gathered = (0..3)
            .map(|s| (s, vec![logged(t, vec![entry(k, true, false, 9, true)])]))
            .collect();
        let q = queries(&gathered, &r);
        assert_eq!(q.len(), 1);
        assert_eq!(q[&1], (vec![t], Vec::new()));
        // The coordinator had not decided commit (recovery interrupted it): abort.
        let mut answers = Answers::default();
        answers.decisions.insert(t, None);
        let planned = plan(&gathered, &answers, &r);
        assert!(!planned[0].commit && !planned[0].from_logs);
        // It had: commit with its own writes and versions.
        answers.decisions.insert(t, Some(vec![(T, k, 12, put(3))]));
        let planned = plan(&gathered, &answers, &r);
        assert!(planned[0].commit);
        assert_eq!(planned[0].writes, vec![(T, k, 12, put(3))]);
    }

    #[test]
    fn a_live_coordinators_commit_with_no_entry_anywhere_is_rolled_forward() {
        let r = rules(true);
        let k = live_key(&r);
        let t = txn(10, 4);
        let gathered: Gathered = [
            (0, Vec::new()),
            (
                1,
                vec![GatheredTxn {
                    txn: t,
                    coordinator: CoordinatorState::Committed(vec![(T, k, 4, put(1))]),
                    entries: Vec::new(),
                }],
            ),
            (2, Vec::new()),
        ]
        .into_iter()
        .collect();
        assert!(queries(&gathered, &r).is_empty());
        let planned = plan(&gathered, &Answers::default(), &r);
        assert_eq!(planned.len(), 1);
        let p = &planned[0];
        assert!(p.commit && !p.reported && !p.from_logs);
        assert_eq!(p.appliers, vec![0, 1, 2]);
        assert_eq!(p.writes, vec![(T, k, 4, put(1))]);
        // An undecided one that left nothing anywhere needs nothing.
        let mut undecided = gathered.clone();
        undecided.get_mut(&1).expect("server 1")[0].coordinator = CoordinatorState::Undecided;
        assert!(plan(&undecided, &Answers::default(), &r).is_empty());
    }

    #[test]
    fn replicated_variants_commit_iff_a_replication_entry_survives() {
        let r = rules(true);
        let k = live_key(&r);
        let t = txn(30, 5);
        let with = |applied: bool| -> Gathered {
            [(2, vec![logged(t, vec![entry(k, false, applied, 6, true)])])]
                .into_iter()
                .collect()
        };
        let yes = plan(&with(true), &Answers::default(), &r);
        assert!(yes[0].commit && yes[0].from_logs);
        assert_eq!(yes[0].appliers, vec![0, 1, 2]);
        let no = plan(&with(false), &Answers::default(), &r);
        assert!(!no[0].commit);
        assert_eq!(no[0].appliers, vec![2]);
        let bugged = Rules {
            abort_crashed: true,
            ..r
        };
        assert!(!plan(&with(true), &Answers::default(), &bugged)[0].commit);
    }

    #[test]
    fn pages_fit_the_budget_and_resume_after_the_last() {
        let k = 1;
        let all: Vec<GatheredTxn> = (0..10)
            .map(|i| logged(txn(1, i), vec![entry(k, true, false, 1, true)]))
            .collect();
        let len = all[0].encoded_len();
        let (first, more) = page(all.clone(), None, 3 * len);
        assert_eq!(first.len(), 3);
        assert!(more);
        let (second, more) = page(all.clone(), first.last().map(|t| t.txn), 100 * len);
        assert_eq!(second.len(), 7);
        assert!(!more);
        assert_eq!(second[0].txn, txn(1, 3));
        // One always fits, even past the budget.
        assert_eq!(page(all, None, 1).0.len(), 1);
    }

    #[test]
    fn queries_split_to_fit_and_skip_the_leader() {
        let queries: BTreeMap<u16, Query> = [
            (0, (vec![txn(1, 1)], Vec::new())),
            (
                2,
                (
                    (0..50).map(|i| txn(1, i)).collect(),
                    vec![(txn(1, 1), T, 3)],
                ),
            ),
        ]
        .into_iter()
        .collect();
        let reqs = query_requests(&queries, 0, 7, 256); // 10 transactions per request
        assert_eq!(reqs.len(), 5);
        assert!(reqs.iter().all(|(s, r)| *s == 2
            && matches!(r, Request::Query { epoch: 7, txns, .. } if txns.len() == 10)));
    }
}
