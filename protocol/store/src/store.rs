//! The laid-out store ([`Store`]): a layout over the MN regions, the replicas and the
//! current primary of every partition, and the log regions.
//!
//! # Placement (Pandora §2.1, §3.2.5)
//!
//! A record's *partition* is `hash(table, key) % mns`; its primary is MN `partition` and its
//! `f` backups are the next `f` MNs, wrapping around (a static ring, which is what
//! consistent hashing degenerates to with a fixed MN set). When an MN fails, the first live
//! replica becomes the primary (§3.2.5); every CN computes the same answer from the same
//! [`MnView`].

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use dmem_layout::log::LogRegionHeader;
use dmem_txn::TableId;
use dmem_verbs::{MemoryRegion, NodeId, RemoteAddr};

use crate::error::StoreError;
use crate::layout::{Layout, TableLayout};
use crate::sizing::StoreConfig;

/// Which MNs are alive, as every CN sees it (Pandora §3.2.5: all CNs are notified of an MN
/// failure and recompute primaries deterministically).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MnView {
    failed: u64,
}

impl MnView {
    /// Every MN alive.
    #[must_use]
    pub const fn all_alive() -> Self {
        Self { failed: 0 }
    }

    /// Marks MN index `mn` failed.
    pub fn mark_failed(&mut self, mn: u16) {
        if mn < 64 {
            self.failed |= 1 << mn;
        }
    }

    /// Whether MN index `mn` is alive.
    #[must_use]
    pub const fn is_alive(&self, mn: u16) -> bool {
        mn >= 64 || self.failed & (1 << mn) == 0
    }

    /// The failed MNs as a bitmask (bit `i` = MN index `i`), what an MN-failure
    /// notification carries.
    #[must_use]
    pub const fn failed_mask(&self) -> u64 {
        self.failed
    }

    /// Adds the failed MNs of `mask` (idempotent and commutative, so every CN that applied
    /// the same notifications has the same view, whatever their order).
    pub fn merge_failed(&mut self, mask: u64) {
        self.failed |= mask;
    }
}

/// The computed layout of a store plus the MN regions it lives in.
///
/// Shared (behind an `Rc`) by every coordinator, the loader and the recovery coordinator.
#[derive(Debug, Clone)]
pub struct Store {
    /// Also read by the lookups of module `index`.
    pub(crate) config: StoreConfig,
    tables: HashMap<TableId, TableLayout>,
    regions: Vec<MemoryRegion>,
    log_base: u64,
    bytes_per_mn: u64,
    view: Rc<RefCell<MnView>>,
}

impl Store {
    /// Lays `config` out over `regions` (one per MN, in MN order).
    ///
    /// # Errors
    /// A [`StoreError`] if the schema is inconsistent or does not fit a region.
    pub fn new(config: StoreConfig, regions: Vec<MemoryRegion>) -> Result<Self, StoreError> {
        if regions.len() != usize::from(config.mns) {
            return Err(StoreError::Regions {
                got: regions.len(),
                mns: config.mns,
            });
        }
        let Layout {
            tables,
            log_base,
            bytes_per_mn,
        } = Layout::compute(&config)?;
        for region in &regions {
            if region.len < bytes_per_mn {
                return Err(StoreError::TooLarge {
                    needed: bytes_per_mn,
                    have: region.len,
                    node: region.node,
                });
            }
        }
        Ok(Self {
            config,
            tables,
            regions,
            log_base,
            bytes_per_mn,
            view: Rc::new(RefCell::new(MnView::all_alive())),
        })
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// Bytes of every MN region the layout uses.
    #[must_use]
    pub fn bytes_per_mn(&self) -> u64 {
        self.bytes_per_mn
    }

    /// The layout of `table`.
    ///
    /// # Errors
    /// [`StoreError::UnknownTable`].
    pub fn table(&self, table: TableId) -> Result<&TableLayout, StoreError> {
        self.tables
            .get(&table)
            .ok_or(StoreError::UnknownTable(table.0))
    }

    /// The MN node of MN index `mn`.
    #[must_use]
    pub fn mn_node(&self, mn: u16) -> NodeId {
        self.regions[usize::from(mn)].node
    }

    /// The MN index of node `node`, if it is one of the store's MNs.
    #[must_use]
    pub fn mn_index(&self, node: NodeId) -> Option<u16> {
        self.regions
            .iter()
            .position(|r| r.node == node)
            .and_then(|i| u16::try_from(i).ok())
    }

    /// The address of `offset` on MN index `mn`.
    #[must_use]
    pub fn addr(&self, mn: u16, offset: u64) -> RemoteAddr {
        let region = &self.regions[usize::from(mn)];
        RemoteAddr {
            node: region.node,
            rkey: region.rkey,
            offset,
        }
    }

    /// The shared view of live MNs (Pandora §3.2.5).
    #[must_use]
    pub fn view(&self) -> &Rc<RefCell<MnView>> {
        &self.view
    }

    /// The same layout with a view of its own, starting as a copy of this one. Each CN (and
    /// the failure detector) holds its own fork, so that it changes its view only when *it*
    /// learns of an MN failure (Pandora §3.2.5); a plain `clone` shares the view.
    #[must_use]
    pub fn fork_view(&self) -> Self {
        let view = self.view.borrow().clone();
        Self {
            view: Rc::new(RefCell::new(view)),
            ..self.clone()
        }
    }

    /// Every replica of `partition` (MN indices, primary first, failed MNs included).
    #[must_use]
    pub fn replicas(&self, partition: u16) -> Vec<u16> {
        (0..self.config.replicas)
            .map(|i| (partition + i) % self.config.mns)
            .collect()
    }

    /// The live replicas of `partition`, primary first (Pandora §3.2.5: the first live
    /// replica is the new primary).
    #[must_use]
    pub fn live_replicas(&self, partition: u16) -> Vec<u16> {
        let view = self.view.borrow();
        self.replicas(partition)
            .into_iter()
            .filter(|&m| view.is_alive(m))
            .collect()
    }

    /// The current primary of `partition`.
    ///
    /// # Errors
    /// [`StoreError::PartitionLost`] if every replica failed.
    pub fn primary(&self, partition: u16) -> Result<u16, StoreError> {
        self.live_replicas(partition)
            .first()
            .copied()
            .ok_or(StoreError::PartitionLost(partition))
    }

    /// Offset of coordinator `coordinator`'s log region (the same on every MN).
    ///
    /// # Errors
    /// [`StoreError::NoLogRegion`].
    pub fn log_offset(&self, coordinator: u16) -> Result<u64, StoreError> {
        if coordinator >= self.config.coordinators {
            return Err(StoreError::NoLogRegion(coordinator));
        }
        Ok(self.log_base + u64::from(coordinator) * u64::from(self.config.log_region_bytes))
    }

    /// Bytes of one log region.
    #[must_use]
    pub fn log_region_bytes(&self) -> usize {
        self.config.log_region_bytes as usize
    }

    /// The `f + 1` MNs that hold `coordinator`'s Pandora log (§3.1.4): consecutive MNs
    /// starting at `coordinator % mns`, live ones only.
    #[must_use]
    pub fn pandora_log_mns(&self, coordinator: u16) -> Vec<u16> {
        let start = coordinator % self.config.mns;
        let view = self.view.borrow();
        (0..self.config.replicas)
            .map(|i| (start + i) % self.config.mns)
            .filter(|&m| view.is_alive(m))
            .collect()
    }

    /// Bytes of a log header (the first READ of a log region can stop there).
    #[must_use]
    pub const fn log_header_len() -> usize {
        LogRegionHeader::LEN
    }
}
