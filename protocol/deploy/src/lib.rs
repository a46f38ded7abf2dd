//! How any transaction protocol is deployed, once, on the simulated cluster or on a real
//! fabric.
//!
//! `dmem bench`, `dmem recover`, the litmus suite and the tests all need the same steps:
//! size the MNs for a data set, build the cluster, lay the protocol's store out, load records
//! out of band, make coordinators on CN contexts, run the protocol's failure detection and
//! recovery as simulated tasks, make a coordinator that knows which coordinators failed, and
//! read the final state for the workload's invariants. This crate names those steps:
//!
//! * [`DeploySpec`]: what the run needs (tables, coordinators, log region size), neutral to
//!   any workload crate — a harness converts a workload's schema into it.
//! * [`Protocol`]: a factory registered by name; [`Deployment`]: one protocol on one cluster.
//!   Coordinators come back as [`BoxCoordinator`]s, so generic workload code runs any
//!   protocol chosen at run time.
//! * [`ClusterShape`] and [`deploy_loaded`]: the cluster builder and the size–load–retry loop
//!   (the index has no overflow buckets, so a full bucket doubles the index slack).
//! * [`SimLinkTerminator`]: active-link termination in the simulator (Pandora §3.2.2 step 2).
//! * [`HeartbeatDetector`] (from `dmem-txn`): the heartbeat failure detector as a
//!   fabric-free state machine, shared by the simulator's and the processes' recovery (and
//!   Pandora's in `dmem-ford`).
//! * [`spawn_log_recovery`] and [`settle_history`]: crash recovery from logs in the simulator
//!   for protocols without a detector of their own (OOCC, DrTM, DSLR, Motor), behind
//!   heartbeats ([`Detection::Heartbeat`], the default) or, where a caller asks, an oracle
//!   ([`Detection::Oracle`], [`spawn_crash_watch`]), and the history bookkeeping every
//!   recovery shares.
//! * [`Registry`]: protocols by name, plus parameterised families (`ford:BUG+BUG`).
//! * [`SimRecovery`] and [`ProcessDeployment`]: what a protocol adds to its [`Deployment`]
//!   when it recovers crashed CNs on the simulator, and when it runs as CN processes.
//! * [`process`]: recovery across the processes of a real cluster — the CN tasks
//!   ([`ProcessDeployment::process_tasks`]), the detector's [`process::ProcessRecovery`]
//!   ([`ProcessDeployment::process_recovery`]) and link termination through MN processes.
//!
//! A deployment is fabric-neutral: [`Protocol::deploy_on`] lays the store out on an
//! [`MnMemory`] (the simulator's MNs, or the regions of real MNs with the bytes of those
//! this process maps), and [`Deployment::coordinator`] takes an [`AnyContext`] (a CN context
//! of the simulator, the shm fabric or the tcp fabric, dispatched statically because the
//! verbs traits are not object-safe). An MN process deploys on its own memory and loads its
//! share of the records; a CN process deploys on the regions alone and makes coordinators;
//! both derive the same layout from the same [`DeploySpec`].
#![forbid(unsafe_code)]

mod cluster;
mod context;
mod deployment;
mod memory;
mod oracle;
pub mod process;
mod registry;
mod sim_recovery;

use std::any::Any;

use std::cell::RefCell;
use std::rc::Rc;

pub use cluster::{ClusterShape, Deployed, SimLinkTerminator, deploy_loaded, load_growing_slack};
pub use context::AnyContext;
#[cfg(feature = "rdma")]
pub use context::RdmaCn;
pub use deployment::{
    Deployment, ProcessDeployment, Router, SimRecovery, require_processes, require_sim_recovery,
};
pub use dmem_store::TableDemand;
pub use dmem_txn::detector::HeartbeatDetector;
pub use memory::{MnMemory, Recorder};
pub use oracle::{settle_history, spawn_crash_watch};
pub use registry::{Family, Registry};
pub use sim_recovery::{
    Detection, OnRecovered, RecoveryState, restart_crashed_cn, restore_links,
    spawn_heartbeat_watch, spawn_log_recovery,
};

/// Where a deployment sends coordinators it starts during a run
/// ([`SimRecovery::run_late_coordinators`]): context, coordinator id (a restarted CN's
/// coordinator keeps its id under LOTUS §6 and takes a new one under Pandora §3.1.2),
/// coordinator.
pub type LateCoordinators = Rc<dyn Fn(dmem_sim::SimContext, u16, BoxCoordinator)>;

use dmem_sim::{Sim, SimError};
use dmem_store::StoreError;
use dmem_txn::{BoxCoordinator, CriticalField, History, Isolation, TableId};
use dmem_verbs::{Endpoint, Nanos, NodeId};

/// Why a deployment could not be built or driven.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeployError {
    /// The simulated cluster could not be built or a context made.
    #[error("simulator: {0}")]
    Sim(#[from] SimError),
    /// The protocol's store could not be laid out or loaded.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// A real fabric refused an out-of-band access or a link.
    #[error("fabric: {0}")]
    Fabric(String),
    /// The protocol cannot be deployed on this fabric (it runs tasks only the simulator
    /// hosts, such as LOTUS's lock tables or Dandelion's servers).
    #[error("protocol `{protocol}` runs on the simulator only: {reason}")]
    SimOnly {
        /// The protocol.
        protocol: String,
        /// What it needs from the simulator.
        reason: String,
    },
    /// A crash was asked for under a protocol without simulated recovery
    /// ([`Deployment::sim_recovery`] is `None`).
    #[error("protocol `{0}` does not detect and recover crashed CNs on the simulator")]
    NoSimRecovery(String),
    /// A protocol name nobody registered.
    #[error("unknown protocol `{name}`: known protocols are {}", known.join(", "))]
    UnknownProtocol {
        /// The name asked for.
        name: String,
        /// Every registered name and family.
        known: Vec<String>,
    },
    /// A family recognised the name but not its parameters (`ford:no-such-bug`).
    #[error("protocol `{name}`: {reason}")]
    BadParameters {
        /// The name asked for.
        name: String,
        /// Why the family refused it.
        reason: String,
    },
    /// The same name registered twice.
    #[error("protocol `{0}` registered twice")]
    Duplicate(String),
    /// A protocol-specific failure (no room for a coordinator id, a recovery step failed).
    #[error("{protocol}: {reason}")]
    Protocol {
        /// The protocol.
        protocol: String,
        /// What failed.
        reason: String,
    },
}

impl DeployError {
    /// Whether loading failed only because an index bucket filled up (or a hashed table's
    /// loader share of its record pool, which grows with the slack), so that a layout with
    /// more index slack would load (see [`deploy_loaded`]).
    #[must_use]
    pub fn is_index_full(&self) -> bool {
        matches!(self, DeployError::Store(e) if e.more_slack_may_load())
    }
}

/// What a run needs from a protocol's store, independent of any workload crate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeploySpec {
    /// The tables.
    pub tables: Vec<TableDemand>,
    /// Coordinator ids the run uses (`0..coordinators`, each may need a log region).
    pub coordinators: u16,
    /// Bytes of each coordinator's log region at least (Pandora §3.2.2 uses 32 KB; 4 KiB
    /// holds the write sets of every workload but TPC-C). A protocol that logs sizes its
    /// regions with [`log_region_for`](Self::log_region_for), which grows this floor to
    /// what the largest of [`write_sets`](Self::write_sets) needs in its log format.
    pub log_region_bytes: u32,
    /// Per transaction type that writes, the records one transaction of it writes at most
    /// (locks for update, updates, inserts or deletes), as `(table, records)` pairs: the
    /// protocol-neutral description of the workload's largest write sets. Empty unless a
    /// harness knows the workload; then the floor
    /// [`log_region_bytes`](Self::log_region_bytes) applies alone.
    pub write_sets: Vec<Vec<(TableId, u32)>>,
    /// Index room as a multiple of each table's records (doubled by [`deploy_loaded`] when
    /// a bucket fills).
    pub index_slack: u64,
    /// Whether the index is sized for exactly the expected records (times the slack), with
    /// no margin and no growth room: for small fixed key sets such as the litmus tests,
    /// whose seeded runs should not change when the default margins do.
    pub exact_index: bool,
    /// Whether every CN starts with a warm address cache (it scanned the index at start-up),
    /// so that its first access to a loaded record skips the index lookup.
    pub warm_cache: bool,
    /// The workload's name (`smallbank`, `tatp`, `tpcc`, `kvs`, …) when a harness knows it,
    /// for protocols whose configuration follows the workload (Motor's versions per record,
    /// LOTUS §8); `None` lets the protocol use its default.
    pub workload: Option<String>,
    /// Per table, where its critical field sits in its keys (LOTUS §4.2 shards by it);
    /// tables not listed have none. Empty unless a harness knows the workload.
    pub critical_fields: Vec<(TableId, CriticalField)>,
    /// Tables whose keys are dense in `0..k`, with their `k`: a store indexes them directly
    /// (one slot per key, never full; `dmem_store::StoreConfig::with_direct_index`) unless
    /// [`exact_index`](Self::exact_index) is set. Empty unless a harness knows the workload.
    pub key_spaces: Vec<(TableId, u64)>,
    /// Per growing table, the records the run may insert into it at most, sized from the
    /// run (its transaction bound times the workload's inserts per transaction; see
    /// `dmem_harness::run_spec`). A growing table not listed gets the default room
    /// ([`TableDemand::index_records`]: as many inserts again as loaded records, plus 4096).
    pub insert_room: Vec<(TableId, u64)>,
}

impl DeploySpec {
    /// `tables` for `coordinators` coordinators: 4 KiB logs, slack 2, cold caches.
    #[must_use]
    pub fn new(tables: Vec<TableDemand>, coordinators: u16) -> Self {
        Self {
            tables,
            coordinators,
            log_region_bytes: 4096,
            write_sets: Vec::new(),
            index_slack: 2,
            exact_index: false,
            warm_cache: false,
            workload: None,
            critical_fields: Vec::new(),
            key_spaces: Vec::new(),
            insert_room: Vec::new(),
        }
    }

    /// Records `table` must have room for: the loaded ones plus the run's
    /// [`insert_room`](Self::insert_room) and a margin of 64 when the run sized it, else
    /// [`TableDemand::index_records`]. `None` past 2^64.
    #[must_use]
    pub fn records_with_room(&self, table: &TableDemand) -> Option<u64> {
        match self.insert_room.iter().find(|(t, _)| *t == table.id) {
            Some(&(_, inserts)) if table.grows => {
                table.expected_records.checked_add(inserts)?.checked_add(64)
            }
            _ => Some(table.index_records()),
        }
    }

    /// Bytes of each coordinator's log region for a protocol whose log of a write set takes
    /// `fixed` bytes plus `per_record(value_len)` per record written (`value_len` the bytes
    /// of the record's table's values; 0 for a table not in [`tables`](Self::tables)):
    /// the floor [`log_region_bytes`](Self::log_region_bytes), or the log of the largest of
    /// [`write_sets`](Self::write_sets) rounded up to 8 bytes if larger. Saturates at
    /// `u32::MAX`, which the store's size check then refuses. A run whose workload fits
    /// the floor keeps exactly the floor, so its layout does not move.
    #[must_use]
    pub fn log_region_for(&self, fixed: u64, per_record: impl Fn(usize) -> u64) -> u32 {
        let value_len = |table: TableId| {
            self.tables
                .iter()
                .find(|t| t.id == table)
                .map_or(0, |t| t.value_len)
        };
        let need = self
            .write_sets
            .iter()
            .map(|set| {
                set.iter().fold(fixed, |sum, &(table, records)| {
                    sum.saturating_add(
                        u64::from(records).saturating_mul(per_record(value_len(table))),
                    )
                })
            })
            .max()
            .unwrap_or(0);
        let need = u32::try_from(need.saturating_add(7) & !7).unwrap_or(u32::MAX);
        self.log_region_bytes.max(need)
    }

    /// The tables a store lays out direct-mapped: [`key_spaces`](Self::key_spaces), or none
    /// with [`exact_index`](Self::exact_index) (whose seeded runs keep the hashed layout).
    #[must_use]
    pub fn direct_tables(&self) -> &[(TableId, u64)] {
        if self.exact_index {
            &[]
        } else {
            &self.key_spaces
        }
    }
}

/// Timing of a protocol's failure detector (virtual ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryTiming {
    /// Heartbeat period of each worker CN.
    pub heartbeat: Nanos,
    /// Silence after which the detector suspects a CN.
    pub timeout: Nanos,
    /// Polling period of the detector and of the notification listeners.
    pub poll: Nanos,
    /// When every background task stops.
    pub until: Nanos,
}

/// How recovery decided a crashed coordinator's in-flight transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Decision {
    /// Its writes were kept (every replica updated, or a commit point reached).
    RollForward,
    /// Its writes were undone.
    RollBack,
}

/// What recovery did for one coordinator of a failed CN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveredCoordinator {
    /// The coordinator id.
    pub coordinator: u16,
    /// The sequence number of the transaction it found in flight, if any.
    pub txn: Option<u64>,
    /// What it decided for that transaction.
    pub decision: Option<Decision>,
    /// Replicas restored (rolled back) or completed (rolled forward).
    pub restored: usize,
    /// Locks released.
    pub unlocked: usize,
}

/// One recovered CN failure, in a protocol-neutral form (for `dmem recover` and litmus).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryEvent {
    /// The failed CN.
    pub cn: NodeId,
    /// When the detector suspected it.
    pub detected_at: Nanos,
    /// When it was cut off every MN.
    pub terminated_at: Nanos,
    /// When its coordinators' in-flight transactions were decided.
    pub logs_recovered_at: Nanos,
    /// When recovery was over (survivors notified; a scan finished).
    pub finished_at: Nanos,
    /// Per coordinator of the CN.
    pub coordinators: Vec<RecoveredCoordinator>,
    /// Stray locks a store scan released (FORD's baseline; 0 elsewhere).
    pub scanned_locks: usize,
}

/// A loader's placement of the records (which slot or address each took, what is free),
/// as one protocol's [`Deployment::placement`] hands it out: read-only once loading is
/// done, so one CN process's cores share one ([`Protocol::deploy_placed`]) instead of each
/// running the loader. The protocol downcasts it to its own type.
pub type Placement = std::sync::Arc<dyn Any + Send + Sync>;

/// A protocol: a factory of [`Deployment`]s, registered by name in a [`Registry`].
///
/// `Send + Sync` so that one protocol value serves runs on several OS threads (each run has
/// its own single-threaded simulation and deployment).
pub trait Protocol: Send + Sync {
    /// The name it is registered and reported under (`pandora`, `ford:covert-locks`).
    fn name(&self) -> String;

    /// The isolation level it promises, which the history checker and the litmus
    /// assertions judge it by (serializable unless said otherwise; strict in both cases).
    fn isolation(&self) -> Isolation {
        Isolation::Serializable
    }

    /// The registry name of this protocol with its crashed CNs restarted `after_us` µs after
    /// their failure is detected (`dmem recover --restart-after-us`), or `None` for a
    /// protocol that does not restart CNs (the default). The protocol names its own
    /// switch, so a command needs no list of which protocols restart.
    fn restarting_name(&self, after_us: u64) -> Option<String> {
        let _ = after_us;
        None
    }

    /// Whether the protocol is symmetric: every node is a server, both coordinator and
    /// storage, holding its data in its own memory (Dandelion). Its deployment runs on the
    /// cluster's CNs only — a command sizes it with `--servers N` as N CNs — and leaves the
    /// simulator's MNs idle. `false` by default: CNs reach data on MNs.
    fn symmetric(&self) -> bool {
        false
    }

    /// Whether the protocol claims to tolerate lost two-sided messages (its RPCs time out
    /// or are re-sent), so that fault injection may lose some (the litmus suite does).
    /// `false` by default: no claim.
    fn tolerates_message_loss(&self) -> bool {
        false
    }

    /// Whether the protocol claims to tolerate duplicated two-sided messages (a request
    /// delivered twice runs once, a duplicated response is ignored), so that fault
    /// injection may duplicate some (the litmus suite does). `false` by default: no claim.
    fn tolerates_message_duplication(&self) -> bool {
        false
    }

    /// Bytes of CN-side memory per loaded record of a table without dense keys (address
    /// caches, slot maps, load buffers), for sizing a run before it starts. `None` (the
    /// default): the command's own conservative bound.
    fn cn_bytes_per_hashed_record(&self) -> Option<u64> {
        None
    }

    /// Bytes every MN needs for `spec` on `mns` MNs, before the cluster is built.
    ///
    /// # Errors
    /// [`DeployError`] if `spec` cannot be laid out.
    fn mn_bytes_per_mn(&self, spec: &DeploySpec, mns: u16) -> Result<u64, DeployError>;

    /// Lays the protocol's store out on `memory` (zeroed); transactions record into
    /// `history`. Every process of a real cluster calls it with the same `spec` and
    /// regions and so derives the same layout: an MN process then loads its share of the
    /// records, a CN process makes coordinators on its contexts.
    ///
    /// # Errors
    /// [`DeployError`] if the store does not fit, or [`DeployError::SimOnly`] for a
    /// protocol that needs the simulator and `memory` is not its.
    fn deploy_on(
        &self,
        memory: MnMemory,
        spec: &DeploySpec,
        history: Recorder,
    ) -> Result<Box<dyn Deployment>, DeployError>;

    /// [`deploy_on`](Self::deploy_on) with the records already placed: `placement` is what
    /// the loader of another deployment of this protocol, with the same `spec` and regions,
    /// decided ([`Deployment::placement`]), taken as loaded instead of running the loader
    /// again (a CN process's cores share its one dry load). `None` (the default) for a
    /// protocol that cannot take a placement: the caller loads as usual.
    ///
    /// # Errors
    /// As [`deploy_on`](Self::deploy_on), or [`DeployError::Protocol`] if `placement` is
    /// not this protocol's.
    fn deploy_placed(
        &self,
        memory: MnMemory,
        spec: &DeploySpec,
        history: Recorder,
        placement: &Placement,
    ) -> Option<Result<Box<dyn Deployment>, DeployError>> {
        let _ = (memory, spec, history, placement);
        None
    }

    /// Deploys a symmetric protocol ([`symmetric`](Self::symmetric)) on servers of a real
    /// fabric in this process: `servers[s][t]` is the context of server `s`'s thread `t`
    /// (every server has the same threads), and `spawn` runs a server thread's background
    /// task (its message loop) on the executor of that context. The servers hold their
    /// records in this process's memory; coordinators are then made with
    /// [`Deployment::coordinator`] on those contexts. Recovery needs the simulator.
    ///
    /// # Errors
    /// [`DeployError::Protocol`] for a protocol that is not symmetric (the default): it is
    /// laid out on MN memory with [`deploy_on`](Self::deploy_on).
    fn deploy_servers(
        &self,
        servers: Vec<Vec<AnyContext>>,
        spawn: &dyn Fn(&AnyContext, process::LocalTask),
        history: Recorder,
    ) -> Result<Box<dyn Deployment>, DeployError> {
        let _ = (servers, spawn, history);
        Err(DeployError::Protocol {
            protocol: self.name(),
            reason: "not a symmetric protocol: it is laid out on MN memory (deploy_on)".to_owned(),
        })
    }

    /// Deploys server `me` alone of a symmetric protocol ([`symmetric`](Self::symmetric))
    /// in this process, one process per server of a real cluster: `servers[s][t]` is the
    /// message endpoint of server `s`'s thread `t` (the same list in every process),
    /// `contexts[t]` this process's context of its thread `t` (whose endpoint is
    /// `servers[me][t]`). The deployment holds and loads only the records `me` is a replica
    /// of (placement is a function of the key, so every process agrees), reaches the other
    /// servers through two-sided messages, and hands its message loops to the caller from
    /// [`ProcessDeployment::process_tasks`]; coordinators are made on this process's contexts.
    ///
    /// # Errors
    /// [`DeployError::Protocol`] for a protocol that is not symmetric (the default) or
    /// contexts that do not match `servers[me]`.
    fn deploy_server(
        &self,
        me: u16,
        servers: Vec<Vec<Endpoint>>,
        contexts: Vec<AnyContext>,
        history: Recorder,
    ) -> Result<Box<dyn Deployment>, DeployError> {
        let _ = (me, servers, contexts, history);
        Err(DeployError::Protocol {
            protocol: self.name(),
            reason: "not a symmetric protocol: it is laid out on MN memory (deploy_on)".to_owned(),
        })
    }

    /// The fewest servers a symmetric protocol runs on with every record at its full
    /// replication (Dandelion: R, a primary and R − 1 backups on distinct servers); 1 by
    /// default.
    fn servers_needed(&self) -> u16 {
        1
    }

    /// Lays the protocol's store out on `sim`'s MNs (zeroed); transactions record into
    /// `history` ([`deploy_on`](Self::deploy_on) on the simulator's memory).
    ///
    /// # Errors
    /// [`DeployError`] if the store does not fit.
    fn deploy(
        &self,
        sim: &Rc<Sim>,
        spec: &DeploySpec,
        history: Rc<RefCell<History>>,
    ) -> Result<Box<dyn Deployment>, DeployError> {
        self.deploy_on(MnMemory::sim(sim), spec, Recorder::new(history))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> DeploySpec {
        let table = |id, value_len| TableDemand {
            id: TableId(id),
            value_len,
            expected_records: 10,
            grows: false,
        };
        DeploySpec::new(vec![table(0, 100), table(1, 8)], 4)
    }

    #[test]
    fn log_region_is_the_floor_or_the_largest_write_set_rounded_to_8() {
        let mut s = spec();
        // No write sets: the floor.
        assert_eq!(s.log_region_for(32, |len| len as u64 + 32), 4096);
        // Fits the floor: the floor, exactly.
        s.write_sets = vec![vec![(TableId(0), 2)], vec![(TableId(1), 3)]];
        assert_eq!(s.log_region_for(32, |len| len as u64 + 32), 4096);
        // 40 records of table 0: 32 + 40 × 132 = 5312; with a fixed 33, rounded up to 5320.
        s.write_sets.push(vec![(TableId(0), 40), (TableId(1), 0)]);
        assert_eq!(s.log_region_for(32, |len| len as u64 + 32), 5312);
        assert_eq!(s.log_region_for(33, |len| len as u64 + 32), 5320);
        // A table not in the spec counts as empty values.
        s.write_sets = vec![vec![(TableId(9), 200)]];
        assert_eq!(s.log_region_for(0, |len| len as u64 + 32), 6400);
        // Past u32: saturates, for the store's size check to refuse.
        s.write_sets = vec![vec![(TableId(0), u32::MAX)]];
        assert_eq!(s.log_region_for(0, |_| u64::MAX), u32::MAX);
    }
}
