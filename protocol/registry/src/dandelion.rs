//! Dandelion (Dnl-4, Dnl-2, Dnl-1) and FaSST as symmetric [`Protocol`]s: every server is
//! both coordinator and storage.
//!
//! On the simulated cluster ([`Protocol::deploy_on`] the simulator's memory) every CN is a
//! server and the MNs stay idle; on a real fabric in one process
//! ([`Protocol::deploy_servers`], e.g. `dmem_harness::servers` over shm) the caller hands
//! over every server thread's context and a way to spawn on its executor; in a process per
//! server ([`Protocol::deploy_server`], `dmem server`) the caller hands over every server's
//! endpoints and its own threads' contexts, the deployment loads only the records that
//! server is a replica of and hands its message loops out from
//! [`ProcessDeployment::process_tasks`]. Either way every
//! server thread gets a `RunIteration` loop task ([`dmem_dandelion::Worker::run`], the same
//! async code, generic over the context); records are loaded into the stores of their R
//! replicas; a coordinator made on a server thread's context runs on that thread's worker.
//!
//! Recovery (Dandelion §4.4, [`dmem_dandelion::recover`]) runs as a simulated task on the
//! recovery CN: it notices a crashed server (from the simulator's crash state, then waits the
//! heartbeat timeout), declares it crashed and halts the survivors; the lowest-numbered
//! survivor then gathers the logs, sends every decision and lets the survivors resume,
//! with RPCs over the same networking layer as the transactions. On a real fabric
//! [`SimRecovery::start_recovery`] is refused ([`DeployError::SimOnly`]): there is no crash
//! injection or failure detector for real servers yet.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use dmem_dandelion::recovery::RecoveryReport;
use dmem_dandelion::{Cluster, DnlConfig, DnlCoordinator, Worker, recover, retransmission_timeout};
use dmem_deploy::process::{self, LocalTask};
use dmem_deploy::{
    AnyContext, Decision, DeployError, DeploySpec, Deployment, MnMemory, ProcessDeployment,
    Protocol, Recorder, RecoveredCoordinator, RecoveryEvent, RecoveryTiming, SimRecovery,
};
use dmem_sim::{NicProfile, Sim, SimContext};
use dmem_txn::{BoxCoordinator, History, Key, TableId};
use dmem_verbs::{Clock, Endpoint, Nanos, NodeId, Verbs};

/// A Dandelion configuration under a registered name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DandelionProtocol {
    name: String,
    config: DnlConfig,
}

impl DandelionProtocol {
    /// `config` registered as `name`.
    #[must_use]
    pub fn new(name: &str, config: DnlConfig) -> Self {
        Self {
            name: name.to_owned(),
            config,
        }
    }

    /// Its configuration.
    #[must_use]
    pub fn config(&self) -> DnlConfig {
        self.config
    }

    /// A variant by flags after `dnl:` — `4`, `2` or `1` first (the commit protocol), then
    /// any of `no-net-batch`, `no-ht-batch`, `no-local-reads`, `no-get-one`, `batch=N`,
    /// `r=N`, and the planted bugs `skip-readable`, `abort-crashed`, `no-dedup`, joined by `+`.
    ///
    /// # Errors
    /// A line naming the unknown flag.
    pub fn parse_flags(params: &str) -> Result<DnlConfig, String> {
        let mut flags = params.split('+');
        let mut config = match flags.next() {
            Some("4") => DnlConfig::dnl_4(),
            Some("2") => DnlConfig::dnl_2(),
            Some("1") => DnlConfig::dnl_1(),
            Some("fasst") => DnlConfig::fasst(),
            other => {
                return Err(format!(
                    "`{}`: the first parameter is the protocol, 4, 2, 1 or fasst",
                    other.unwrap_or("")
                ));
            }
        };
        for flag in flags {
            match flag {
                "no-net-batch" => config.network_batching = false,
                "net-batch" => config.network_batching = true,
                "no-ht-batch" => config.hashtable_batching = false,
                "ht-batch" => config.hashtable_batching = true,
                "no-local-reads" => config.local_reads = false,
                "local-reads" => config.local_reads = true,
                "no-get-one" => config.get_one = false,
                "skip-readable" => config.bugs.skip_readable = true,
                "abort-crashed" => config.bugs.abort_crashed = true,
                "no-dedup" => config.bugs.no_dedup = true,
                other => {
                    let (key, value) = other.split_once('=').ok_or_else(|| unknown(other))?;
                    let n: u16 = value
                        .parse()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| format!("`{other}`: expected a positive number"))?;
                    match key {
                        "batch" => config.max_batch = n,
                        "r" => config.replication = n,
                        _ => return Err(unknown(other)),
                    }
                }
            }
        }
        Ok(config)
    }
}

fn unknown(flag: &str) -> String {
    format!(
        "unknown flag `{flag}`: use no-net-batch, no-ht-batch, no-local-reads, no-get-one, batch=N, r=N, skip-readable, abort-crashed or no-dedup"
    )
}

impl Protocol for DandelionProtocol {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn symmetric(&self) -> bool {
        true
    }

    /// Requests are retransmitted after a timeout and executed once per request number
    /// (`dmem_dandelion::reliable`, eRPC-style).
    fn tolerates_message_loss(&self) -> bool {
        true
    }

    /// Duplicated requests replay their cached response; duplicated responses are stale.
    fn tolerates_message_duplication(&self) -> bool {
        true
    }

    fn mn_bytes_per_mn(&self, _: &DeploySpec, _: u16) -> Result<u64, DeployError> {
        // Nothing lives on MNs: servers hold their data in their own memory.
        Ok(0)
    }

    fn deploy_on(
        &self,
        memory: MnMemory,
        _spec: &DeploySpec,
        history: Recorder,
    ) -> Result<Box<dyn Deployment>, DeployError> {
        let sim = memory.as_sim().ok_or_else(|| DeployError::SimOnly {
            protocol: self.name.clone(),
            reason: "on MN memory of a real fabric; its servers hold their own records: \
                     deploy them with `deploy_servers` on the servers' contexts"
                .to_owned(),
        })?;
        let (servers, threads) = (sim.cn_count(), sim.threads_per_cn());
        let mut contexts = Vec::new();
        for s in 0..servers {
            let mut per_thread = Vec::new();
            for t in 0..threads {
                per_thread.push(sim.context(sim.cn(s), t)?);
            }
            contexts.push(per_thread);
        }
        // A packet is at most one two-sided message (the profile's MTU-sized limit).
        let packet_limit = max_packet(&sim.profile());
        let rto = retransmission_timeout(sim.profile().one_way_latency_ns);
        let spawn = |ctx: &SimContext, task: LocalTask| sim.spawn(ctx, task);
        Ok(Box::new(self.servers(
            contexts,
            &spawn,
            packet_limit,
            rto,
            history,
            true,
        )))
    }

    /// On a real fabric in this process (see [`Protocol::deploy_servers`]): packets of at
    /// most [`REAL_PACKET_BYTES`], requests retransmitted after [`REAL_RTO_NS`]; no recovery.
    fn deploy_servers(
        &self,
        servers: Vec<Vec<AnyContext>>,
        spawn: &dyn Fn(&AnyContext, LocalTask),
        history: Recorder,
    ) -> Result<Box<dyn Deployment>, DeployError> {
        let threads = servers.first().map_or(0, Vec::len);
        if threads == 0 || servers.iter().any(|t| t.len() != threads) {
            return Err(DeployError::Protocol {
                protocol: self.name.clone(),
                reason: "every server needs the same number (at least one) of thread contexts"
                    .to_owned(),
            });
        }
        Ok(Box::new(self.servers(
            servers,
            spawn,
            REAL_PACKET_BYTES,
            REAL_RTO_NS,
            history,
            false,
        )))
    }

    /// Server `me` alone, in a process of its own (see [`Protocol::deploy_server`]): the
    /// same workers and wire as [`deploy_servers`](Protocol::deploy_servers) (packets of at
    /// most [`REAL_PACKET_BYTES`], requests re-sent after [`REAL_RTO_NS`]), a store holding
    /// only the records `me` is a replica of, and the message loops handed out by
    /// [`ProcessDeployment::process_tasks`]; no recovery.
    fn deploy_server(
        &self,
        me: u16,
        servers: Vec<Vec<Endpoint>>,
        contexts: Vec<AnyContext>,
        history: Recorder,
    ) -> Result<Box<dyn Deployment>, DeployError> {
        let refuse = |reason: String| DeployError::Protocol {
            protocol: self.name.clone(),
            reason,
        };
        let mine = servers
            .get(usize::from(me))
            .ok_or_else(|| refuse(format!("server {me} of {} servers", servers.len())))?;
        if contexts.is_empty() || servers.iter().any(|t| t.len() != contexts.len()) {
            return Err(refuse(
                "every server needs the same number (at least one) of thread endpoints".to_owned(),
            ));
        }
        if let Some((t, c)) = contexts
            .iter()
            .enumerate()
            .find(|(t, c)| c.local_endpoint() != mine[*t])
        {
            return Err(refuse(format!(
                "thread {t}'s context is at {:?}, not at server {me}'s endpoint {:?}",
                c.local_endpoint(),
                mine[t]
            )));
        }
        let history_rc = Rc::clone(history.history());
        let cluster = Rc::new(Cluster::new(servers, self.config));
        let mut workers = vec![Vec::new(); cluster.endpoints.len()];
        workers[usize::from(me)] = contexts
            .into_iter()
            .enumerate()
            .map(|(t, ctx)| {
                Worker::new(
                    ctx,
                    me,
                    t,
                    Rc::clone(&cluster),
                    REAL_PACKET_BYTES,
                    REAL_RTO_NS,
                )
            })
            .collect();
        Ok(Box::new(DandelionDeployment {
            name: self.name.clone(),
            on_sim: false,
            only: Some(me),
            loops_handed_out: Cell::new(false),
            loaded: Cell::new(0),
            cluster,
            workers,
            history: history_rc,
            recorder: history,
            paused: Rc::new(Cell::new(false)),
            events: Rc::new(RefCell::new(Vec::new())),
            recovery_cost: Rc::new(Cell::new((0, 0))),
        }))
    }

    /// R: every replica of a record on a distinct server.
    fn servers_needed(&self) -> u16 {
        self.config.replication
    }
}

/// Largest packet on a real fabric: 4 KiB, the cx5 profile's MTU, so that a packet batches
/// as many messages as on the simulator (the shm fabric itself carries up to 1 MiB).
pub const REAL_PACKET_BYTES: usize = 4096;

/// Retransmission timeout on a real fabric: 100 ms. Nothing is lost between servers in one
/// process (shm queues, tcp), so the timer only has to outlast a round trip, and on a shared
/// host a round trip can include the executor thread losing its core: at load average 10–16
/// on the 2-core development VM the thread waited 8–32 ms at a time, and with eRPC's own 5 ms
/// (`kRpcRTOUs`, eRPC NSDI'19 §5.2.2) 400–2,800 requests per 2 s run were re-sent (their
/// copies then dropped as duplicates), which costs CPU that the figures are about. The
/// simulator's 50 unloaded round trips (90 µs) would re-send nearly everything.
pub const REAL_RTO_NS: Nanos = 100_000_000;

impl DandelionProtocol {
    /// The servers on `contexts[server][thread]`: one worker and its `RunIteration` loop
    /// task per thread; `on_sim`: the contexts are the simulator's (servers are its CNs,
    /// recovery can run).
    fn servers<V: Verbs + Clock + Clone + 'static>(
        &self,
        contexts: Vec<Vec<V>>,
        spawn: &dyn Fn(&V, LocalTask),
        packet_limit: usize,
        rto: Nanos,
        history: Recorder,
        on_sim: bool,
    ) -> DandelionDeployment<V> {
        let recorder = history;
        let history = Rc::clone(recorder.history());
        let endpoints = contexts
            .iter()
            .map(|ts| ts.iter().map(Verbs::local_endpoint).collect())
            .collect();
        let cluster = Rc::new(Cluster::new(endpoints, self.config));
        let mut workers = Vec::new();
        for (s, ts) in contexts.into_iter().enumerate() {
            let mut per_thread = Vec::new();
            for (t, ctx) in ts.into_iter().enumerate() {
                let w = Worker::new(
                    ctx.clone(),
                    s as u16,
                    t,
                    Rc::clone(&cluster),
                    packet_limit,
                    rto,
                );
                spawn(&ctx, Box::pin(Rc::clone(&w).run()));
                per_thread.push(w);
            }
            workers.push(per_thread);
        }
        DandelionDeployment {
            name: self.name.clone(),
            on_sim,
            only: None,
            loops_handed_out: Cell::new(false),
            loaded: Cell::new(0),
            cluster,
            workers,
            history,
            recorder,
            paused: Rc::new(Cell::new(false)),
            events: Rc::new(RefCell::new(Vec::new())),
            recovery_cost: Rc::new(Cell::new((0, 0))),
        }
    }
}

/// The largest packet: one MTU-sized message.
fn max_packet(profile: &NicProfile) -> usize {
    profile.mtu.min(profile.max_message_bytes) as usize
}

/// Dandelion on one cluster: the simulated one (`V` = [`SimContext`]) or servers of a real
/// fabric in this process (`V` = [`AnyContext`]).
struct DandelionDeployment<V> {
    name: String,
    /// Whether the servers are the simulator's CNs (else servers of a real fabric).
    on_sim: bool,
    /// The one server this process runs ([`Protocol::deploy_server`]); `None`: every
    /// server is in this process.
    only: Option<u16>,
    /// Whether [`ProcessDeployment::process_tasks`] handed out the message loops of `only`.
    loops_handed_out: Cell<bool>,
    /// Record replicas loaded into this process's stores.
    loaded: Cell<u64>,
    cluster: Rc<Cluster>,
    /// Per server, its workers (empty for a server of another process).
    workers: Vec<Vec<Rc<Worker<V>>>>,
    /// What recovery settles (the simulator's).
    history: Rc<RefCell<History>>,
    /// Where coordinators record (into `history`, and streamed out by a server process).
    recorder: Recorder,
    paused: Rc<Cell<bool>>,
    events: Rc<RefCell<Vec<RecoveryEvent>>>,
    /// Recovery's messages and time from halt to resume (ns), over every recovery so far.
    recovery_cost: Rc<Cell<(u64, u64)>>,
}

impl<V: Verbs + Clock + Clone + 'static> DandelionDeployment<V> {
    /// The server thread a coordinator on `ctx` runs on: the server on `ctx`'s node, and
    /// the thread whose context `ctx` is (the simulator's thread of `ctx`; on a real fabric
    /// the worker with `ctx`'s endpoint, else port modulo threads).
    fn worker_of(&self, ctx: &AnyContext) -> Option<&Rc<Worker<V>>> {
        let me = ctx.local_endpoint();
        let server = self
            .cluster
            .endpoints
            .iter()
            .position(|ts| ts.first().is_some_and(|e| e.node == me.node))?;
        let threads = &self.workers[server];
        if threads.is_empty() {
            // A server of another process.
            return None;
        }
        let thread = match ctx.as_sim() {
            Some(sim) => usize::from(sim.thread()),
            None => self.cluster.endpoints[server]
                .iter()
                .position(|e| *e == me)
                .unwrap_or(usize::from(me.port.0) % threads.len()),
        };
        threads.get(thread)
    }

    fn make(&self, ctx: &AnyContext, id: u16) -> Result<BoxCoordinator, DeployError> {
        let worker = self.worker_of(ctx).ok_or_else(|| DeployError::Protocol {
            protocol: self.name.clone(),
            reason: format!("no server thread for {ctx:?}"),
        })?;
        Ok(Box::new(DnlCoordinator::new(
            Rc::clone(worker),
            id,
            self.recorder.clone(),
        )))
    }
}

impl<V: Verbs + Clock + Clone + 'static> Deployment for DandelionDeployment<V> {
    /// At every replica in this process: all of them, or the records server `only` holds.
    fn load(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), DeployError> {
        match self.only {
            None => {
                self.cluster.load(table.0, key.0, value);
                let replicas = self.cluster.placement.replicas(table.0, key.0).count();
                self.loaded.set(self.loaded.get() + replicas as u64);
            }
            Some(me) => {
                if self.cluster.placement.holds(me, table.0, key.0) {
                    self.cluster.stores[usize::from(me)]
                        .borrow_mut()
                        .load(table.0, key.0, value);
                    self.loaded.set(self.loaded.get() + 1);
                }
            }
        }
        Ok(())
    }

    fn coordinator(&mut self, ctx: AnyContext, id: u16) -> Result<BoxCoordinator, DeployError> {
        if ctx.as_sim().is_some() != self.on_sim {
            return Err(DeployError::Protocol {
                protocol: self.name.clone(),
                reason: format!(
                    "a coordinator on a {} context for servers on another fabric",
                    ctx.fabric()
                ),
            });
        }
        self.make(&ctx, id)
    }

    fn read_final(&self, table: TableId, key: Key) -> Option<Vec<u8>> {
        self.cluster.read_final(table.0, key.0)
    }

    fn counter(&self, name: &str) -> Option<u64> {
        let sum = |f: fn(dmem_dandelion::WorkerStats) -> u64| {
            self.workers
                .iter()
                .flatten()
                .map(|w| f(w.stats()))
                .sum::<u64>()
        };
        match name {
            "packets" => Some(sum(|s| s.packets)),
            "messages" => Some(sum(|s| s.messages)),
            "packet_bytes" => Some(sum(|s| s.bytes)),
            "local_requests" => Some(sum(|s| s.local_requests)),
            "retransmissions" => Some(sum(|s| s.retransmissions)),
            "stale_responses" => Some(sum(|s| s.stale_responses)),
            "replayed_responses" => Some(sum(|s| s.replayed)),
            "duplicates_dropped" => Some(sum(|s| s.duplicates_dropped)),
            "recovery_messages" => Some(self.recovery_cost.get().0),
            "recovery_ns" => Some(self.recovery_cost.get().1),
            "records_loaded" => Some(self.loaded.get()),
            _ => None,
        }
    }

    /// What a server process reports: the record replicas it loaded, and its threads'
    /// packets and messages.
    fn counters(&self) -> Vec<(String, u64)> {
        [
            "records_loaded",
            "packets",
            "messages",
            "local_requests",
            "retransmissions",
            "duplicates_dropped",
        ]
        .iter()
        .filter_map(|&name| Some((name.to_owned(), self.counter(name)?)))
        .collect()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn sim_recovery(&mut self) -> Option<&mut dyn SimRecovery> {
        // The detector reads the simulator's crash state and the survivors share one
        // epoch counter in this process; a real fabric has neither crash injection nor a
        // failure detector for Dandelion's servers yet.
        if self.on_sim { Some(self) } else { None }
    }

    fn processes(&mut self) -> Option<&mut dyn ProcessDeployment> {
        Some(self)
    }
}

impl<V: Verbs + Clock + Clone + 'static> SimRecovery for DandelionDeployment<V> {
    fn start_recovery(
        &mut self,
        sim: &Rc<Sim>,
        recovery_cn: u16,
        timing: RecoveryTiming,
    ) -> Result<(), DeployError> {
        let ctx = sim.context(sim.cn(recovery_cn), 0)?;
        let (sim, cluster) = (Rc::clone(sim), Rc::clone(&self.cluster));
        let workers: Vec<_> = self.workers.iter().flatten().cloned().collect();
        let (events, history) = (Rc::clone(&self.events), Rc::clone(&self.history));
        let recovery_cost = Rc::clone(&self.recovery_cost);
        let clock = ctx.clone();
        sim.clone().spawn(&ctx, async move {
            // The detector polls until `timing.until` and after that for as long as a
            // live server thread waits for an answer; then it waits for the next
            // retransmission (what a crashed server looks like to its peers) without a
            // timer, so an idle cluster goes idle and a server that crashes late (a run's
            // last transactions retrying past `until`) is still declared crashed instead
            // of its peers re-sending to it forever.
            let waiting = || {
                workers
                    .iter()
                    .any(|w| !cluster.is_crashed(w.server()) && w.outstanding() > 0)
            };
            loop {
                let crashed: Vec<u16> = (0..sim.cn_count())
                    .filter(|&s| sim.is_crashed(sim.cn(s)) && !cluster.is_crashed(s))
                    .collect();
                if crashed.is_empty() {
                    if clock.now() < timing.until || waiting() {
                        clock.sleep(timing.poll).await;
                    } else {
                        cluster.next_retransmission().await;
                    }
                    continue;
                }
                let detected_at = clock.now();
                clock.sleep(timing.timeout).await;
                let now = clock.now();
                let report = recover(&cluster, &workers, &crashed, &history).await;
                let finished = now + report.duration;
                let (n, ns) = recovery_cost.get();
                recovery_cost.set((n + report.cost.messages(), ns + report.duration));
                let servers = cluster.coordinator_server.borrow().clone();
                let event = |s: u16| RecoveryEvent {
                    cn: sim.cn(s),
                    detected_at,
                    terminated_at: now,
                    logs_recovered_at: finished,
                    finished_at: finished,
                    coordinators: recovered_coordinators(&report, &servers, s),
                    scanned_locks: 0,
                };
                events
                    .borrow_mut()
                    .extend(crashed.iter().map(|&s| event(s)));
            }
        });
        Ok(())
    }

    fn recovery_events(&self) -> Vec<RecoveryEvent> {
        self.events.borrow().clone()
    }

    fn recovery_error(&self) -> Option<String> {
        None
    }

    fn paused(&self) -> Rc<Cell<bool>> {
        Rc::clone(&self.paused)
    }
}

impl<V: Verbs + Clock + Clone + 'static> ProcessDeployment for DandelionDeployment<V> {
    /// A server process ([`Protocol::deploy_server`]): heartbeats to the detector, and
    /// its threads' message loops (once; they end when their fabric fails).
    fn process_tasks(
        &mut self,
        me: NodeId,
        ctxs: process::CnContexts,
        plan: &process::ProcessPlan,
    ) -> Result<Vec<LocalTask>, DeployError> {
        let _ = me;
        let mut tasks: Vec<LocalTask> = vec![process::alive_task(
            ctxs.heartbeat,
            plan.detector,
            plan.heartbeat,
        )];
        if let Some(server) = self.only
            && !self.loops_handed_out.replace(true)
        {
            for w in &self.workers[usize::from(server)] {
                tasks.push(Box::pin(Rc::clone(w).run()));
            }
        }
        Ok(tasks)
    }
}

/// The coordinators of server `server` whose transactions `report` decided (committed:
/// rolled forward; aborted: rolled back), by the server each coordinator runs on.
fn recovered_coordinators(
    report: &RecoveryReport,
    servers: &HashMap<u32, u16>,
    server: u16,
) -> Vec<RecoveredCoordinator> {
    let committed = report.committed.iter().map(|t| (t, Decision::RollForward));
    let aborted = report.aborted.iter().map(|t| (t, Decision::RollBack));
    committed
        .chain(aborted)
        .filter(|(t, _)| servers.get(&t.coordinator.0) == Some(&server))
        .map(|(t, d)| RecoveredCoordinator {
            coordinator: t.coordinator.0 as u16,
            txn: Some(t.seq),
            decision: Some(d),
            restored: 0,
            unlocked: 0,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmem_deploy::ClusterShape;
    use dmem_txn::{Coordinator, Transaction, TxnKind};

    #[test]
    fn flags_parse_and_bad_ones_are_named() {
        let c = DandelionProtocol::parse_flags("4+no-net-batch+batch=8+r=2").unwrap();
        assert!(!c.network_batching && c.max_batch == 8 && c.replication == 2);
        assert_eq!(
            DandelionProtocol::parse_flags("fasst").unwrap(),
            DnlConfig::fasst()
        );
        let err = DandelionProtocol::parse_flags("4+bogus").unwrap_err();
        assert!(err.contains("bogus"), "{err}");
        assert!(DandelionProtocol::parse_flags("3").is_err());
        assert!(DandelionProtocol::parse_flags("4+batch=0").is_err());
    }

    #[test]
    fn the_registry_deploys_symmetric_servers() {
        let p = crate::registry().get("dnl-4").unwrap();
        assert!(p.symmetric());
        let shape = ClusterShape {
            mns: 3,
            cns: 2,
            threads: 2,
            seed: 1,
            profile: NicProfile::cx5(),
            min_mn_bytes: 1 << 20,
            message_faults: dmem_sim::MessageFaults::default(),
        }
        .symmetric(4);
        assert_eq!((shape.cns, shape.mns), (4, 1));
        let sim = shape.build(0).unwrap();
        let history = Rc::new(RefCell::new(History::new()));
        let spec = DeploySpec::new(Vec::new(), 1);
        let mut dep = p.deploy(&sim, &spec, Rc::clone(&history)).unwrap();
        dep.load(TableId(0), Key(5), &7u64.to_le_bytes()).unwrap();
        let ctx = sim.context(sim.cn(3), 1).unwrap();
        let mut c = dep.coordinator(ctx.clone().into(), 0).unwrap();
        sim.spawn(&ctx, async move {
            let mut t = c.begin(TxnKind::ReadWrite).await.unwrap();
            let v = t.read_for_update(TableId(0), Key(5)).await.unwrap();
            assert_eq!(v, Some(7u64.to_le_bytes().to_vec()));
            t.write(TableId(0), Key(5), &8u64.to_le_bytes())
                .await
                .unwrap();
            t.commit().await.unwrap();
        });
        sim.run_until_idle();
        assert_eq!(
            dep.read_final(TableId(0), Key(5)),
            Some(8u64.to_le_bytes().to_vec())
        );
        assert_eq!(history.borrow().committed(), 1);
        assert!(dep.counter("packets").is_some_and(|n| n > 0));
    }
}
