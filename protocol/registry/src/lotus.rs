//! LOTUS (SR and SI) as a [`Protocol`] on the simulated cluster: Motor's MVCC store
//! (shared with [`crate::motor`] through `MvccDeploy`) plus a commit-log region per
//! coordinator, one lock table per CN, one lock server per CN thread, the shard map and
//! the hybrid router (LOTUS §4.3) the bench harness places transactions with.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use dmem_deploy::{
    DeployError, DeploySpec, Deployment, Protocol, RecoveryEvent, RecoveryTiming, Router,
};
use dmem_lotus::{CnLocks, LockCluster, LotusConfig, LotusCoordinator, ShardMap, Sharding, serve};
use dmem_motor::SyncedClock;
use dmem_sim::{Sim, SimContext};
use dmem_txn::{BoxCoordinator, History, Key, TableId, TxnKind};

use crate::motor::MvccDeploy;

/// LOTUS under a registered name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LotusProtocol {
    name: String,
    /// Protocol switches.
    pub config: LotusConfig,
    /// Bytes of lock slots per CN (LOTUS §8.1: 32 MB).
    pub lock_table_bytes: usize,
    /// CPU a CN core spends per lock or unlock, ns (modelled, see the crate README).
    pub lock_cpu_ns: u64,
    /// Ablation (§8.3): shard every record by hash instead of its critical field.
    pub random_sharding: bool,
    /// Ablation (§8.3): no hybrid routing; transactions run where they were generated.
    pub no_routing: bool,
}

impl LotusProtocol {
    /// `config` registered as `name` with the paper's table size.
    #[must_use]
    pub fn new(name: &str, config: LotusConfig) -> Self {
        Self {
            name: name.to_owned(),
            config,
            lock_table_bytes: 32 << 20,
            lock_cpu_ns: 60,
            random_sharding: false,
            no_routing: false,
        }
    }

    /// `lotus:FLAG[+FLAG]`: `si`, `no-sharding`, `no-routing` (the §8.3 ablation).
    ///
    /// # Errors
    /// The unknown flag.
    pub fn with_flags(params: &str) -> Result<Self, String> {
        let mut p = Self::new(&format!("lotus:{params}"), LotusConfig::sr());
        for f in params.split(['+', ',']).filter(|f| !f.is_empty()) {
            match f {
                "si" => p.config = LotusConfig::si(),
                "no-sharding" => p.random_sharding = true,
                "no-routing" => p.no_routing = true,
                other => {
                    return Err(format!(
                        "unknown lotus switch `{other}` (known: si, no-sharding, no-routing)"
                    ));
                }
            }
        }
        Ok(p)
    }
}

impl Protocol for LotusProtocol {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn mn_bytes_per_mn(&self, spec: &DeploySpec, mns: u16) -> Result<u64, DeployError> {
        MvccDeploy::mn_bytes(spec, mns, spec.log_region_bytes)
    }

    fn deploy(
        &self,
        sim: &Rc<Sim>,
        spec: &DeploySpec,
        history: Rc<RefCell<History>>,
    ) -> Result<Box<dyn Deployment>, DeployError> {
        let base = MvccDeploy::new(sim, spec, history, spec.log_region_bytes)?;
        let cns = sim.cn_count();
        let threads = sim.threads_per_cn();
        let mut sharding = Sharding::new(spec.critical_fields.clone());
        sharding.random = self.random_sharding;
        let map = Rc::new(RefCell::new(ShardMap::new(cns)));
        let locks: Vec<Rc<CnLocks>> = (0..cns)
            .map(|c| Rc::new(CnLocks::new(c, self.lock_table_bytes)))
            .collect();
        let mut servers = Vec::new();
        let mut contexts = Vec::new();
        for c in 0..cns {
            let mut row = Vec::new();
            for t in 0..threads {
                let ctx = sim.context(sim.cn(c), t)?;
                row.push(dmem_verbs::Verbs::local_endpoint(&ctx));
                contexts.push((c, ctx));
            }
            servers.push(row);
        }
        let cluster = Rc::new(LockCluster {
            cns: locks,
            servers,
            map: Rc::clone(&map),
            sharding: sharding.clone(),
            lock_cpu_ns: self.lock_cpu_ns,
        });
        for (c, ctx) in contexts {
            let task = serve(
                ctx.clone(),
                Rc::clone(&cluster),
                Rc::clone(&cluster.cns[usize::from(c)]),
            );
            sim.spawn(&ctx, task);
        }
        let router: Option<Rc<dyn Router>> = (!self.no_routing).then(|| {
            Rc::new(LotusRouter {
                map: Rc::clone(&map),
                sharding,
            }) as Rc<dyn Router>
        });
        Ok(Box::new(LotusDeployment {
            config: self.config,
            base,
            cluster,
            router,
            paused: Rc::new(Cell::new(false)),
        }))
    }
}

/// Hybrid routing (LOTUS §4.3) over the deployment's shard map.
struct LotusRouter {
    map: Rc<RefCell<ShardMap>>,
    sharding: Sharding,
}

impl Router for LotusRouter {
    fn route(&self, kind: TxnKind, first: Option<(TableId, Key)>, random: u64) -> Option<u16> {
        self.map.borrow().route(&self.sharding, kind, first, random)
    }
}

/// LOTUS on one simulated cluster.
struct LotusDeployment {
    config: LotusConfig,
    base: MvccDeploy,
    cluster: Rc<LockCluster>,
    router: Option<Rc<dyn Router>>,
    paused: Rc<Cell<bool>>,
}

impl Deployment for LotusDeployment {
    fn load(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), DeployError> {
        self.base.load(table, key, value)
    }

    fn coordinator(&mut self, ctx: SimContext, id: u16) -> Result<BoxCoordinator, DeployError> {
        let cache = self.base.cache_of(ctx.node());
        let ts = SyncedClock::new(ctx.clone(), ctx.node(), id, self.config.epsilon);
        let cn = ctx.node().0 - self.base.sim.mn_count();
        let thread = ctx.thread();
        Ok(Box::new(LotusCoordinator::new(
            ctx,
            cn,
            thread,
            Rc::clone(&self.cluster),
            Rc::clone(&self.base.store),
            Rc::clone(&self.base.shapes),
            self.config,
            id,
            cache,
            Rc::clone(&self.base.history),
            ts,
        )))
    }

    fn start_recovery(
        &mut self,
        _sim: &Rc<Sim>,
        _recovery_cn: u16,
        _timing: RecoveryTiming,
    ) -> Result<(), DeployError> {
        Ok(())
    }

    fn final_coordinator(
        &mut self,
        ctx: SimContext,
        id: u16,
    ) -> Result<BoxCoordinator, DeployError> {
        self.coordinator(ctx, id)
    }

    fn recovery_events(&self) -> Vec<RecoveryEvent> {
        Vec::new()
    }

    fn recovery_error(&self) -> Option<String> {
        None
    }

    fn paused(&self) -> Rc<Cell<bool>> {
        Rc::clone(&self.paused)
    }

    fn scan_cost(&self) -> Option<(u64, u64)> {
        self.base.scan_cost()
    }

    fn read_final(&self, table: TableId, key: Key) -> Option<Vec<u8>> {
        self.base.read_final(table, key)
    }

    fn counter(&self, name: &str) -> Option<u64> {
        let sum = |f: fn((u64, u64, u64)) -> u64| {
            self.cluster.cns.iter().map(|c| f(c.served.get())).sum()
        };
        match name {
            "lock_messages_served" => Some(sum(|s| s.0)),
            "lock_requests_granted" => Some(sum(|s| s.1)),
            "lock_requests_refused" => Some(sum(|s| s.2)),
            _ => None,
        }
    }

    fn router(&self) -> Option<Rc<dyn Router>> {
        self.router.clone()
    }
}
