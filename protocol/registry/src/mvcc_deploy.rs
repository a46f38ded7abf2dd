//! What Motor and LOTUS share when deployed (`crate::motor`, `crate::lotus`,
//! `crate::lotus_process`): Motor's MVCC store laid out for a [`DeploySpec`] (versions per
//! record, pooled or in-slot blocks), its loader, the per-CN address caches and the
//! out-of-band reads ([`MvccDeploy`]), and the `versions=N` switch both accept.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

#[cfg(doc)]
use dmem_deploy::Protocol;
use dmem_deploy::{DeployError, DeploySpec, MnMemory, Placement, Recorder};
use dmem_motor::mvcc::{self, MvccLoader, Shapes, VersionLayout};
use dmem_motor::{cells_for_workload, read_final};
use dmem_store::{AddressCache, LoadIndex, Store};
use dmem_txn::{Key, TableId};
use dmem_verbs::NodeId;

/// The most versions per record `versions=N` accepts (LOTUS §8.5 explores 2–8).
pub(crate) const MAX_VERSIONS: usize = 8;

/// Parses the `N` of a `versions=N` switch (1 ..= [`MAX_VERSIONS`]).
pub(crate) fn parse_versions(protocol: &str, switch: &str, n: &str) -> Result<usize, String> {
    n.parse::<usize>()
        .ok()
        .filter(|n| (1..=MAX_VERSIONS).contains(n))
        .ok_or_else(|| {
            format!(
                "{protocol} switch `{switch}`: expected 1 to {MAX_VERSIONS} versions per record"
            )
        })
}

/// CN-side bytes per loaded record of a hashed table under Motor and LOTUS (the loader's
/// shared index entry, cache entries of inserted keys; LOTUS's lock tables and VT caches
/// are bounded per CN, not per record).
pub(crate) const MVCC_CN_BYTES_PER_HASHED_RECORD: u64 = 256;

/// How the blocks of sparse and hashed tables sit (`dmem-store`'s crate docs, "Sparse
/// tables", "Hashed tables pooled").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Records {
    /// Sparse and hashed tables' blocks in a pool per partition, each coordinator
    /// inserting from a share of its own; dense tables' blocks in their slots.
    Pooled,
    /// Every block in its index slot (one block per key of the key space): for LOTUS with
    /// CN restarts, whose restarted coordinators reuse their ids and so would need their
    /// share's cursor recovered (not done).
    InSlots,
}

/// The shapes (versions laid out as `versions`, `cells` per record or the workload's
/// default) and store configuration of `spec` on `mns` MNs, with `log_region_bytes` of log
/// per coordinator in MN memory (0: none, as Motor's op log lives on the CN).
pub(crate) fn layout(
    spec: &DeploySpec,
    mns: u16,
    log_region_bytes: u32,
    versions: VersionLayout,
    records: Records,
    cells: Option<usize>,
) -> (Shapes, dmem_store::StoreConfig) {
    let cells = cells.unwrap_or_else(|| cells_for_workload(spec.workload.as_deref()));
    let shapes = Shapes::uniform(&spec.tables, cells).with_layout(versions);
    let logs = if log_region_bytes == 0 {
        0
    } else {
        spec.coordinators
    };
    let cfg = mvcc::store_config_with_logs(
        mns,
        &spec.tables,
        &shapes,
        3,
        spec.index_slack,
        spec.exact_index,
        logs,
        log_region_bytes,
    )
    // Every coordinator gets an insert share of each pooled table (with no log region when
    // `log_region_bytes` is 0: the regions then take no bytes).
    .coordinators(spec.coordinators);
    let cfg = match records {
        // Sparse and hashed tables pooled as FORD's are (`dmem-store`), except hashed
        // tables in the litmus tests' exact layout.
        // Their insert shares hold what the run may insert, when the run sized that
        // (`DeploySpec::insert_room`) and it is less than the table-sized share.
        Records::Pooled => cfg
            .with_pools(
                &spec.tables,
                spec.direct_tables(),
                spec.index_slack,
                !spec.exact_index,
            )
            .with_insert_room(&spec.insert_room),
        Records::InSlots => cfg.with_direct_indexes(spec.direct_tables()),
    };
    (shapes, cfg)
}

/// Motor's MVCC store deployed on a cluster: what Motor and LOTUS share (the store, its
/// loader, the per-CN address caches, the out-of-band reads).
pub(crate) struct MvccDeploy {
    pub(crate) memory: MnMemory,
    pub(crate) store: Rc<Store>,
    pub(crate) shapes: Rc<Shapes>,
    loader: MvccLoader,
    /// The records as another deployment's loader placed them
    /// ([`Protocol::deploy_placed`]: the cores of a CN process share one dry load).
    placed: Option<Arc<LoadIndex>>,
    pub(crate) history: Recorder,
    /// Per CN: its address cache.
    caches: Vec<(NodeId, Rc<RefCell<AddressCache>>)>,
    /// Whether CNs start with a warm address cache (answered from the loader's shared
    /// [`dmem_store::LoadIndex`], not a copy per CN).
    warm: bool,
}

impl MvccDeploy {
    /// MN bytes for `spec` on `mns` MNs.
    pub(crate) fn mn_bytes(
        spec: &DeploySpec,
        mns: u16,
        log_region_bytes: u32,
        versions: VersionLayout,
        records: Records,
        cells: Option<usize>,
    ) -> Result<u64, DeployError> {
        Ok(
            layout(spec, mns, log_region_bytes, versions, records, cells)
                .1
                .bytes_per_mn()?,
        )
    }

    /// Lays the store out on `memory`.
    pub(crate) fn new(
        memory: MnMemory,
        spec: &DeploySpec,
        history: Recorder,
        log_region_bytes: u32,
        versions: VersionLayout,
        records: Records,
        cells: Option<usize>,
    ) -> Result<Self, DeployError> {
        let (shapes, cfg) = layout(
            spec,
            memory.mn_count(),
            log_region_bytes,
            versions,
            records,
            cells,
        );
        let store = Rc::new(Store::new(cfg, memory.regions())?);
        let shapes = Rc::new(shapes);
        Ok(Self {
            memory,
            loader: MvccLoader::new(Rc::clone(&store), Rc::clone(&shapes)),
            placed: None,
            store,
            shapes,
            history,
            caches: Vec::new(),
            warm: spec.warm_cache,
        })
    }

    /// The same, its records placed by another deployment's loader (`placed`, that
    /// deployment's [`placement`](Self::placement)): it loads nothing itself.
    pub(crate) fn with_placement(mut self, placed: Arc<LoadIndex>) -> Self {
        self.placed = Some(placed);
        self
    }

    /// Whether its records were placed by another deployment's loader.
    pub(crate) fn is_placed(&self) -> bool {
        self.placed.is_some()
    }

    /// The loader's index of the records loaded so far (or the placement it was given).
    pub(crate) fn placement(&self) -> Placement {
        match &self.placed {
            Some(placed) => Arc::clone(placed) as Placement,
            None => Arc::new(self.loader.loaded().borrow().clone()),
        }
    }

    /// The address cache of CN `cn` (made on first use, warm if the spec asked).
    pub(crate) fn cache_of(&mut self, cn: NodeId) -> Rc<RefCell<AddressCache>> {
        if let Some((_, c)) = self.caches.iter().find(|(n, _)| *n == cn) {
            return Rc::clone(c);
        }
        let cache = self.cache_maker()();
        self.caches.push((cn, Rc::clone(&cache)));
        cache
    }

    /// What makes a CN's address cache as the run's CNs start with it (warm if the spec
    /// asked): also for a CN restarted during the run, whose old cache died with it.
    pub(crate) fn cache_maker(&self) -> impl Fn() -> Rc<RefCell<AddressCache>> + 'static {
        let (store, warm) = (Rc::clone(&self.store), self.warm);
        let (placed, loaded) = (self.placed.clone(), self.loader.loaded());
        move || {
            let cache = Rc::new(RefCell::new(AddressCache::new()));
            if warm {
                let mut c = cache.borrow_mut();
                match &placed {
                    Some(placed) => c.warm_from_placed(Rc::clone(&store), Arc::clone(placed)),
                    None => c.warm_from(Rc::clone(&store), Rc::clone(&loaded)),
                }
            }
            cache
        }
    }

    pub(crate) fn load(
        &mut self,
        table: TableId,
        key: Key,
        value: &[u8],
    ) -> Result<(), DeployError> {
        let loader = &mut self.loader;
        self.memory
            .loading(|write| loader.load(table, key, value, write))?;
        Ok(())
    }

    /// [`load`](Self::load), refused (naming `protocol`) when another deployment's loader
    /// placed the records ([`with_placement`](Self::with_placement)).
    pub(crate) fn load_unless_placed(
        &mut self,
        protocol: &str,
        table: TableId,
        key: Key,
        value: &[u8],
    ) -> Result<(), DeployError> {
        if self.is_placed() {
            return Err(crate::common::load_on_placed(protocol));
        }
        self.load(table, key, value)
    }

    pub(crate) fn scan_cost(&self) -> Option<(u64, u64)> {
        let mns = u64::from(self.store.config().mns);
        Some(
            self.store
                .config()
                .tables
                .iter()
                .filter_map(|t| self.store.table(t.id).ok())
                .fold((0, 0), |(reads, bytes), l| {
                    let n = u64::from(l.spec.buckets_per_partition) * mns;
                    (
                        reads + n,
                        // Each bucket's slots: 7, or 15 in a wide bucket (TPC-C's
                        // hashed pooled tables).
                        bytes + n * (l.item_len * l.spec.bucket_slots()) as u64,
                    )
                }),
        )
    }

    pub(crate) fn read_final(&self, table: TableId, key: Key) -> Option<Vec<u8>> {
        read_final(
            &self.store,
            &self.shapes,
            table,
            key,
            // An MN this process does not map reads as zeros: an empty bucket, no record.
            |node, offset, len| {
                self.memory
                    .read(node, offset, len)
                    .unwrap_or_else(|| vec![0; len])
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmem_store::TableDemand;

    /// Hashed tables (no key space) keep their blocks in pools under `Records::Pooled`
    /// (`dmem-store`'s `with_hashed_pools`, as FORD's records), in their slots in the
    /// litmus tests' exact layout and for LOTUS with restarts (`Records::InSlots`); the
    /// pooled layout needs fewer bytes.
    #[test]
    fn hashed_tables_are_pooled_outside_the_exact_layout() {
        let demand = |id, records, grows| TableDemand {
            id: TableId(id),
            value_len: 56,
            expected_records: records,
            grows,
        };
        let mut spec = DeploySpec::new(vec![demand(1, 20_000, true), demand(2, 5_000, false)], 18);
        spec.workload = Some("tpcc".into());
        let pooled = |spec: &DeploySpec, records| {
            let (shapes, cfg) = layout(spec, 3, 0, VersionLayout::Deltas, records, None);
            assert_eq!(shapes.get(TableId(1)).unwrap().cells, 4);
            let flags: Vec<bool> = cfg.tables.iter().map(|t| t.pool.is_some()).collect();
            (flags, cfg.bytes_per_mn().unwrap())
        };
        let (flags, pooled_bytes) = pooled(&spec, Records::Pooled);
        assert_eq!(flags, [true, true]);
        let (flags, in_slots_bytes) = pooled(&spec, Records::InSlots);
        assert_eq!(flags, [false, false]);
        assert!(
            pooled_bytes < in_slots_bytes,
            "{pooled_bytes} vs {in_slots_bytes}"
        );
        spec.exact_index = true;
        assert_eq!(pooled(&spec, Records::Pooled).0, [false, false]);
    }
}
