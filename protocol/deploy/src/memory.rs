//! The MN memory a deployment is laid out on, and where its transactions record.
//!
//! A deployment needs three things from MN memory: the regions CNs address (every process
//! of a cluster derives the same layout from them), out-of-band writes to load records, and
//! out-of-band reads for the final state. On the simulator one value does all three; on a
//! real fabric an MN process holds its own memory (it loads its share of the records, the
//! writes to other MNs are dropped) and a CN process holds none (it only addresses the
//! regions and never loads).

use std::cell::RefCell;
use std::fmt;
use std::rc::Rc;

use dmem_shm::{ShmContext, ShmFabric, ShmMemoryNode};
use dmem_sim::Sim;
use dmem_txn::{History, HistorySink, TxnId, TxnOutcome, TxnRecord};
use dmem_verbs::{Endpoint, MemoryRegion, Nanos, NodeId, Port, PostList};

use crate::DeployError;

/// MN memory of a deployment: the simulator's, or the regions of real MNs with the bytes of
/// those this process maps.
#[derive(Clone)]
pub struct MnMemory {
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    Sim(Rc<Sim>),
    Regions {
        regions: Vec<MemoryRegion>,
        /// A local shared-memory link to each MN this process maps (its own memory, or
        /// every MN in a single-process test), for out-of-band loads and reads.
        local: Rc<Vec<(NodeId, ShmContext)>>,
    },
}

impl fmt::Debug for MnMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Sim(_) => f.write_str("MnMemory::Sim"),
            Kind::Regions { regions, local } => f
                .debug_struct("MnMemory::Regions")
                .field("regions", regions)
                .field("local", &local.iter().map(|(n, _)| *n).collect::<Vec<_>>())
                .finish(),
        }
    }
}

impl MnMemory {
    /// The simulated cluster's MNs.
    #[must_use]
    pub fn sim(sim: &Rc<Sim>) -> Self {
        Self {
            kind: Kind::Sim(Rc::clone(sim)),
        }
    }

    /// The regions of real MNs (index `i` is MN `i`), none of them mapped here: a CN
    /// process, or a dry run that only lays the store out. Loads write nothing.
    #[must_use]
    pub fn remote(regions: Vec<MemoryRegion>) -> Self {
        Self {
            kind: Kind::Regions {
                regions,
                local: Rc::new(Vec::new()),
            },
        }
    }

    /// The regions of real MNs, with `mapped` (a subset of them, in this process) reachable
    /// out of band: an MN process loads its share of the records into its own memory.
    ///
    /// # Errors
    /// [`DeployError::Fabric`] if a local link cannot be made.
    pub fn mapped(
        regions: Vec<MemoryRegion>,
        mapped: &[&ShmMemoryNode],
    ) -> Result<Self, DeployError> {
        let fabric = ShmFabric::new();
        let mut local = Vec::new();
        for (i, mn) in mapped.iter().enumerate() {
            let node = mn.region().node;
            // A node id no CN or MN uses: the loader's own.
            let me = NodeId(u16::MAX - i as u16);
            let fabric_err = |e: dmem_shm::ShmError| DeployError::Fabric(e.to_string());
            let mut ctx = fabric
                .context(Endpoint {
                    node: me,
                    port: Port(0),
                })
                .map_err(fabric_err)?;
            ctx.add_link(mn.link(me).map_err(fabric_err)?)
                .map_err(fabric_err)?;
            local.push((node, ctx));
        }
        Ok(Self {
            kind: Kind::Regions {
                regions,
                local: Rc::new(local),
            },
        })
    }

    /// The simulator, if this is its memory (for deployments that run simulated tasks).
    #[must_use]
    pub fn as_sim(&self) -> Option<&Rc<Sim>> {
        match &self.kind {
            Kind::Sim(sim) => Some(sim),
            Kind::Regions { .. } => None,
        }
    }

    /// How many MNs.
    #[must_use]
    pub fn mn_count(&self) -> u16 {
        match &self.kind {
            Kind::Sim(sim) => sim.mn_count(),
            Kind::Regions { regions, .. } => regions.len() as u16,
        }
    }

    /// Every MN's region, MN 0 first.
    #[must_use]
    pub fn regions(&self) -> Vec<MemoryRegion> {
        match &self.kind {
            Kind::Sim(sim) => (0..sim.mn_count()).map(|i| sim.region(sim.mn(i))).collect(),
            Kind::Regions { regions, .. } => regions.clone(),
        }
    }

    fn local(&self, node: NodeId) -> Option<(&ShmContext, MemoryRegion)> {
        let Kind::Regions { regions, local } = &self.kind else {
            return None;
        };
        let ctx = local.iter().find(|(n, _)| *n == node).map(|(_, c)| c)?;
        let region = regions.iter().find(|r| r.node == node)?;
        Some((ctx, *region))
    }

    /// Writes `bytes` at `offset` of MN `node` out of band; nothing if this process does
    /// not map that MN.
    ///
    /// # Errors
    /// [`DeployError::Fabric`] if the bytes fall outside the region or the write fails.
    pub fn write(&self, node: NodeId, offset: u64, bytes: &[u8]) -> Result<(), DeployError> {
        if let Kind::Sim(sim) = &self.kind {
            sim.write_memory(node, offset, bytes);
            return Ok(());
        }
        let Some((ctx, region)) = self.local(node) else {
            return Ok(());
        };
        let at = region
            .at(offset)
            .filter(|_| offset + bytes.len() as u64 <= region.len)
            .ok_or_else(|| {
                DeployError::Fabric(format!(
                    "{} bytes at {offset} fall outside MN {}'s {} bytes",
                    bytes.len(),
                    node.0,
                    region.len
                ))
            })?;
        let mut list = PostList::new();
        list.write(at, bytes);
        ctx.post_now(list)
            .map(drop)
            .map_err(|e| DeployError::Fabric(e.to_string()))
    }

    /// Reads `len` bytes at `offset` of MN `node` out of band; `None` if this process does
    /// not map that MN or the read fails.
    #[must_use]
    pub fn read(&self, node: NodeId, offset: u64, len: usize) -> Option<Vec<u8>> {
        if let Kind::Sim(sim) = &self.kind {
            return Some(sim.read_memory(node, offset, len));
        }
        let (ctx, region) = self.local(node)?;
        let mut list = PostList::new();
        let id = list.read(region.at(offset)?, u32::try_from(len).ok()?);
        let mut result = ctx.post_now(list).ok()?;
        Some(result.take_bytes(id))
    }

    /// Loads with `load`, which hands every out-of-band write to its callback (the store
    /// loaders' shape), and returns the first write that failed.
    ///
    /// # Errors
    /// The error of `load`, or of the first failed write.
    pub fn loading<T, E>(
        &self,
        load: impl FnOnce(&mut dyn FnMut(NodeId, u64, &[u8])) -> Result<T, E>,
    ) -> Result<T, DeployError>
    where
        DeployError: From<E>,
    {
        let mut failed = None;
        let value = load(&mut |node, offset, bytes| {
            if failed.is_none()
                && let Err(e) = self.write(node, offset, bytes)
            {
                failed = Some(e);
            }
        })?;
        match failed {
            Some(e) => Err(e),
            None => Ok(value),
        }
    }
}

/// Where a deployment's transactions record: its history, and optionally a second sink that
/// sees every record and resolution as it happens (a CN process streams its history to its
/// parent this way, so that the records of a process killed mid-run survive it).
#[derive(Clone)]
pub struct Recorder {
    history: Rc<RefCell<History>>,
    /// Whether records are kept in `history` (not for a process that only streams them).
    keep: bool,
    tee: Option<Rc<dyn HistorySink>>,
}

impl fmt::Debug for Recorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recorder")
            .field("tee", &self.tee.is_some())
            .finish_non_exhaustive()
    }
}

impl Recorder {
    /// Records into `history`.
    #[must_use]
    pub fn new(history: Rc<RefCell<History>>) -> Self {
        Self {
            history,
            keep: true,
            tee: None,
        }
    }

    /// Records into `history` and into `tee`.
    #[must_use]
    pub fn with_tee(history: Rc<RefCell<History>>, tee: Rc<dyn HistorySink>) -> Self {
        Self {
            history,
            keep: true,
            tee: Some(tee),
        }
    }

    /// Records into `sink` only and keeps nothing (a CN process that streams its history
    /// out, for runs of any length); [`history`](Self::history) stays empty.
    #[must_use]
    pub fn streaming(sink: Rc<dyn HistorySink>) -> Self {
        Self {
            history: Rc::default(),
            keep: false,
            tee: Some(sink),
        }
    }

    /// The history.
    #[must_use]
    pub fn history(&self) -> &Rc<RefCell<History>> {
        &self.history
    }
}

impl HistorySink for Recorder {
    fn record(&self, txn: TxnRecord) {
        match (&self.tee, self.keep) {
            (Some(tee), true) => {
                tee.record(txn.clone());
                self.history.record(txn);
            }
            (Some(tee), false) => tee.record(txn),
            (None, _) => self.history.record(txn),
        }
    }

    fn resolve(&self, id: TxnId, outcome: TxnOutcome, end: Nanos) {
        if let Some(tee) = &self.tee {
            tee.resolve(id, outcome, end);
        }
        if self.keep {
            self.history.resolve(id, outcome, end);
        }
    }
}
