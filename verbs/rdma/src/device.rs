//! The device-dependent part: an RDMA device, registered memory, and [`RdmaContext`], which
//! implements [`dmem_verbs::Verbs`] with one RC queue pair per peer node.
//!
//! Everything here goes through `sideway` (extended verbs: `ibv_wr_*` work requests; classic
//! `ibv_poll_cq` completions, see [`RdmaDevice::context`]) on `rdma-mummy-sys`, which loads libibverbs when the first
//! verb is called, so a binary built with this module starts on a host without libibverbs
//! and [`RdmaDevice::open`] reports that no device was found.
//!
//! Run on Linux soft-RoCE (`rdma_rxe`) with Debian 12's rdma-core 44 (`ci/rxe-vm.sh`); not
//! yet on an RNIC. The pure parts it is built from ([`crate::chain`], [`crate::qp`],
//! [`crate::completion`], [`crate::descriptor`], [`crate::msg`]) are unit-tested.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::{Future, poll_fn};
use std::io::{Read, Write};
use std::ptr::NonNull;
use std::sync::Arc;
use std::task::{Poll, Waker};

use dmem_verbs::{
    BatchResult, Endpoint, Message, NodeId, PostList, RemoteAddr, Verbs, VerbsError, WrOutcome,
};
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::{BasicCompletionQueue, GenericCompletionQueue};
use sideway::ibverbs::device::{DeviceInfo, DeviceList, GetDeviceListErrorKind};
use sideway::ibverbs::device_context::{DeviceContext, Mtu};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    ExtendedQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairState,
    SendOperationFlags, SetInlineData, SetScatterGatherEntry, WorkRequestFlags,
};

use crate::RdmaError;
use crate::chain::{ChainLimits, ChainedOp, RegionTable, build_chains, split_wr_id, wr_id};
use crate::completion::{CompletionTable, PostOutcome, WC_REM_ACCESS_ERR, WC_SUCCESS};
use crate::descriptor::{PathMtu, QpEndpoint, RdmaDescriptor, RegionDescriptor, exchange};
use crate::msg;
use crate::qp::{AddressVector, QpAttr, QpConfig, QpMachine, QpState};

/// `EOPNOTSUPP` on Linux.
const EOPNOTSUPP: i32 = 95;
/// `ENOSYS` on Linux.
const ENOSYS: i32 = 38;

/// Receive buffers posted per queue pair for two-sided messages.
pub const RECV_DEPTH: usize = 64;
/// Bytes of one staging slot: a post whose READ results, atomic results and non-inline
/// WRITE payloads fit uses a slot of the context's pre-registered arena; a larger one
/// registers a buffer of its own for its lifetime.
pub const STAGING_SLOT: usize = 64 << 10;
/// Staging slots per context.
pub const STAGING_SLOTS: usize = 64;

/// Memory from the allocator, page-aligned and zeroed, registered with a protection domain.
struct PinnedBuffer {
    ptr: NonNull<u8>,
    layout: Layout,
    /// `None` only inside `drop`, after deregistration.
    mr: Option<Arc<MemoryRegion>>,
}

impl PinnedBuffer {
    fn new(pd: &Arc<ProtectionDomain>, len: usize, access: AccessFlags) -> Result<Self, RdmaError> {
        let layout = Layout::from_size_align(len.max(1), 4096)
            .map_err(|e| RdmaError::Size(format!("buffer of {len} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| {
            RdmaError::Size(format!("could not allocate {len} bytes to register"))
        })?;
        // SAFETY: `ptr` is valid for `layout.size()` bytes until `drop` deallocates it, which
        // happens after the memory region (and so the NIC's access) is deregistered: `mr` is
        // dropped first in `Drop`.
        let mr = unsafe { pd.reg_mr(ptr.as_ptr() as usize, layout.size(), access) };
        match mr {
            Ok(mr) => Ok(Self {
                ptr,
                layout,
                mr: Some(mr),
            }),
            Err(e) => {
                // SAFETY: allocated above with this layout and not registered.
                unsafe { dealloc(ptr.as_ptr(), layout) };
                Err(RdmaError::Ibverbs {
                    call: "ibv_reg_mr",
                    detail: e.to_string(),
                })
            }
        }
    }

    fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    fn mr(&self) -> &MemoryRegion {
        self.mr.as_ref().expect("registered until dropped")
    }

    fn lkey(&self) -> u32 {
        self.mr().lkey()
    }

    /// Copies bytes out. The NIC writes into the buffer only between a post and its
    /// completion; callers read after the completion.
    fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        assert!(offset + len <= self.layout.size());
        let mut out = vec![0u8; len];
        // SAFETY: in bounds (asserted); no DMA targets these bytes now (see above); `out` does
        // not overlap the buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), out.as_mut_ptr(), len)
        };
        out
    }

    fn write(&self, offset: usize, data: &[u8]) {
        assert!(offset + data.len() <= self.layout.size());
        // SAFETY: in bounds (asserted); the bytes are not posted yet, so no DMA reads them.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len());
        }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // Deregister first (the Arc is never cloned out of this buffer), then free.
        drop(self.mr.take());
        // SAFETY: the NIC's access ended with the deregistration above; the allocation came
        // from `alloc_zeroed(self.layout)` and is freed once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// An RDMA device opened for dmem: its protection domain and the port it uses.
pub struct RdmaDevice {
    ctx: Arc<DeviceContext>,
    pd: Arc<ProtectionDomain>,
    name: String,
    port: u8,
    lid: u16,
    gid: [u8; 16],
    gid_index: u8,
    mtu: PathMtu,
    max_rd_atomic: u8,
}

impl std::fmt::Debug for RdmaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaDevice")
            .field("name", &self.name)
            .field("port", &self.port)
            .field("lid", &self.lid)
            .finish_non_exhaustive()
    }
}

impl RdmaDevice {
    /// Opens `name` (e.g. `mlx5_0`), or the first device when `None`, on port 1.
    ///
    /// # Errors
    /// [`RdmaError::NoDevice`] when libibverbs is missing, lists no device, or has none of
    /// that name; [`RdmaError::Ibverbs`] when opening or querying it fails.
    pub fn open(name: Option<&str>) -> Result<Self, RdmaError> {
        Self::open_with_gid(name, None)
    }

    /// As [`open`](Self::open), with the GID table entry to address peers from: `None`
    /// takes the first non-zero GID of the port. On RoCE the entry picks the RoCE version
    /// and the address family (on ConnectX under RoCE v2 with IPv4, usually index 3;
    /// `show_gids` lists them), and both ends of a queue pair must use the same kind.
    ///
    /// # Errors
    /// As [`open`](Self::open); [`RdmaError::NoDevice`] when the port has no such GID.
    pub fn open_with_gid(name: Option<&str>, gid_index: Option<u8>) -> Result<Self, RdmaError> {
        let list = DeviceList::new().map_err(|e| {
            #[allow(unreachable_patterns)] // the kind is non_exhaustive
            let errno = match &e.0 {
                GetDeviceListErrorKind::Ibverbs(io) => io.raw_os_error(),
                _ => None,
            };
            RdmaError::NoDevice(match errno {
                // rdma-mummy-sys answers EOPNOTSUPP when it could not load libibverbs.
                Some(EOPNOTSUPP) => {
                    "libibverbs.so.1 could not be loaded: install rdma-core's libibverbs1 and a provider (ibverbs-providers) on a host with an RNIC".to_owned()
                }
                Some(ENOSYS) => {
                    "libibverbs found no kernel RDMA support (no ib_uverbs): this host has no RNIC, rdma_rxe or siw".to_owned()
                }
                _ => format!("ibv_get_device_list failed: {}", e.0),
            })
        })?;
        let device = match name {
            None => list.iter().next(),
            Some(n) => list.iter().find(|d| d.name() == n),
        }
        .ok_or_else(|| {
            RdmaError::NoDevice(match name {
                None => "libibverbs lists no devices: no RNIC, and no rdma_rxe/siw link".to_owned(),
                Some(n) => format!("no device named {n}"),
            })
        })?;
        let dev_name = device.name();
        let ibv = |call: &'static str| {
            move |e: &dyn std::fmt::Display| RdmaError::Ibverbs {
                call,
                detail: e.to_string(),
            }
        };
        let ctx = device.open().map_err(|e| ibv("ibv_open_device")(&e))?;
        let pd = ctx.alloc_pd().map_err(|e| ibv("ibv_alloc_pd")(&e))?;
        let port = 1u8;
        let port_attr = ctx
            .query_port(port)
            .map_err(|e| ibv("ibv_query_port")(&e))?;
        let dev_attr = ctx
            .query_device()
            .map_err(|e| ibv("ibv_query_device")(&e))?;
        // RoCE needs a GID; IB works with the LID. Take the first non-link-local GID if any.
        let entries = ctx.query_gid_table().unwrap_or_default();
        let usable = |g: &&sideway::ibverbs::address::GidEntry| {
            g.port_num() == u32::from(port) && !g.gid().is_zero()
        };
        let (gid_index, gid) = match gid_index {
            None => entries
                .iter()
                .find(usable)
                .map_or((0, [0; 16]), |g| (g.gid_index() as u8, g.gid().raw)),
            Some(wanted) => entries
                .iter()
                .filter(usable)
                .find(|g| g.gid_index() == u32::from(wanted))
                .map(|g| (wanted, g.gid().raw))
                .ok_or_else(|| {
                    RdmaError::NoDevice(format!(
                        "{dev_name} port {port} has no GID at index {wanted} (`ibv_devinfo -v` lists the table)"
                    ))
                })?,
        };
        let mtu = PathMtu::from_ibv(port_attr.active_mtu() as u8).unwrap_or(PathMtu::Mtu1024);
        Ok(Self {
            ctx,
            pd,
            name: dev_name,
            port,
            lid: port_attr.lid(),
            gid,
            gid_index,
            mtu,
            max_rd_atomic: dev_attr.max_qp_rd_atom().clamp(1, 16) as u8,
        })
    }

    /// The device's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Registers `len` zeroed bytes for remote READ, WRITE and atomics: an MN's memory.
    ///
    /// # Errors
    /// [`RdmaError::Size`] or [`RdmaError::Ibverbs`].
    pub fn register(&self, len: usize) -> Result<RegisteredRegion, RdmaError> {
        let buffer = PinnedBuffer::new(
            &self.pd,
            len,
            AccessFlags::LocalWrite
                | AccessFlags::RemoteRead
                | AccessFlags::RemoteWrite
                | AccessFlags::RemoteAtomic,
        )?;
        Ok(RegisteredRegion { buffer, len })
    }

    /// Registers memory this process already holds (an MN's shared mapping, so that the
    /// same bytes are loaded and read out of band through it) for remote READ, WRITE and
    /// atomics.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes for as long as the returned
    /// region (and every queue pair that was told its descriptor) lives: the NIC reads and
    /// writes those bytes without the CPU.
    ///
    /// # Errors
    /// [`RdmaError::Ibverbs`] when `ibv_reg_mr` refuses the range.
    pub unsafe fn register_external(
        &self,
        ptr: NonNull<u8>,
        len: usize,
    ) -> Result<ExternalRegion, RdmaError> {
        // SAFETY: the caller keeps the range valid while the registration lives (above);
        // the registration is dropped with the returned region.
        let mr = unsafe {
            self.pd.reg_mr(
                ptr.as_ptr() as usize,
                len,
                AccessFlags::LocalWrite
                    | AccessFlags::RemoteRead
                    | AccessFlags::RemoteWrite
                    | AccessFlags::RemoteAtomic,
            )
        }
        .map_err(|e| RdmaError::Ibverbs {
            call: "ibv_reg_mr",
            detail: e.to_string(),
        })?;
        Ok(ExternalRegion {
            addr: ptr.as_ptr() as u64,
            len: len as u64,
            mr,
        })
    }

    /// A verbs context for `endpoint` with its own completion queues and staging arena.
    ///
    /// The completion queues are classic ones (`ibv_create_cq`, drained with `ibv_poll_cq`),
    /// not extended ones (`ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll`): the soft-RoCE
    /// (`rxe`) provider of rdma-core before release 55 advances its consumer index both when
    /// `ibv_next_poll` finds the queue empty and again in `ibv_end_poll`, so an extended
    /// poller re-reads stale completions forever (fixed upstream in rdma-core 55 and 61).
    /// Debian 12 and Ubuntu 22.04/24.04 ship older releases; `ibv_poll_cq` is correct on
    /// every provider and costs nothing dmem uses (no completion timestamps).
    ///
    /// # Errors
    /// [`RdmaError::Ibverbs`] when a completion queue or the arena cannot be created.
    pub fn context(
        &self,
        endpoint: Endpoint,
        limits: ChainLimits,
    ) -> Result<RdmaContext, RdmaError> {
        let cq = |what: &'static str| -> Result<Arc<BasicCompletionQueue>, RdmaError> {
            let mut b = self.ctx.create_cq_builder();
            b.setup_cqe(4096);
            b.build().map_err(|e| RdmaError::Ibverbs {
                call: what,
                detail: e.to_string(),
            })
        };
        let send_cq = cq("ibv_create_cq (send)")?;
        let recv_cq = cq("ibv_create_cq (recv)")?;
        let arena = PinnedBuffer::new(
            &self.pd,
            STAGING_SLOT * STAGING_SLOTS,
            AccessFlags::LocalWrite,
        )?;
        Ok(RdmaContext {
            endpoint,
            pd: Arc::clone(&self.pd),
            config: QpConfig {
                port: self.port,
                sgid_index: self.gid_index,
                local_mtu: self.mtu,
                max_rd_atomic: self.max_rd_atomic,
                ..QpConfig::default()
            },
            lid: self.lid,
            gid: self.gid,
            limits,
            send_cq,
            recv_cq,
            links: RefCell::new(HashMap::new()),
            regions: RefCell::new(RegionTable::new()),
            peer_regions: RefCell::new(HashMap::new()),
            table: RefCell::new(CompletionTable::new()),
            posts: RefCell::new(HashMap::new()),
            abandoned: RefCell::new(HashSet::new()),
            in_flight: RefCell::new(InFlight::default()),
            arena,
            free_slots: RefCell::new((0..STAGING_SLOTS).collect()),
            quarantined: RefCell::new(Vec::new()),
            inbox: RefCell::new(VecDeque::new()),
            recv_waker: RefCell::new(None),
            psn_seed: Cell::new(
                u32::from(endpoint.node.0) << 8 | u32::from(endpoint.port.0 & 0xff),
            ),
        })
    }
}

/// An MN's registered memory.
pub struct RegisteredRegion {
    buffer: PinnedBuffer,
    len: usize,
}

impl RegisteredRegion {
    /// What peers need to address it.
    #[must_use]
    pub fn descriptor(&self) -> RegionDescriptor {
        RegionDescriptor {
            addr: self.buffer.addr(),
            len: self.len as u64,
            rkey: dmem_verbs::RKey(self.buffer.mr().rkey()),
        }
    }

    /// Copies `data` in at `offset` (laying out the store before any CN connects).
    ///
    /// # Panics
    /// If the range lies outside the region.
    pub fn fill(&self, offset: usize, data: &[u8]) {
        self.buffer.write(offset, data);
    }

    /// Copies `len` bytes out at `offset`.
    ///
    /// # Panics
    /// If the range lies outside the region.
    #[must_use]
    pub fn snapshot(&self, offset: usize, len: usize) -> Vec<u8> {
        self.buffer.read(offset, len)
    }
}

/// Memory registered by [`RdmaDevice::register_external`]; deregistered on drop.
pub struct ExternalRegion {
    addr: u64,
    len: u64,
    mr: Arc<MemoryRegion>,
}

impl ExternalRegion {
    /// What peers need to address it.
    #[must_use]
    pub fn descriptor(&self) -> RegionDescriptor {
        RegionDescriptor {
            addr: self.addr,
            len: self.len,
            rkey: dmem_verbs::RKey(self.mr.rkey()),
        }
    }
}

impl std::fmt::Debug for ExternalRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExternalRegion")
            .field("len", &self.len)
            .field("rkey", &self.mr.rkey())
            .finish_non_exhaustive()
    }
}

struct Link {
    qp: ExtendedQueuePair,
    machine: QpMachine,
    local: QpEndpoint,
    recv: PinnedBuffer,
    /// Work requests posted and not yet retired by a signaled completion.
    outstanding: usize,
}

enum Staging {
    Slot(usize),
    Own(PinnedBuffer),
}

struct PostState {
    staging: Option<Staging>,
    /// Per post-list index: the target (for errors).
    addrs: Vec<RemoteAddr>,
}

/// What a context knows about the chains it has in flight, independent of whether their
/// post is still awaited (a post that failed early returns while its other chains run on).
#[derive(Default)]
struct InFlight {
    /// Signaled `wr_id` ending a chain -> (node, work requests it retires).
    retires: HashMap<u64, (NodeId, usize)>,
    /// Post -> (node of each work request by index, chains not yet retired).
    nodes: HashMap<u32, (Vec<NodeId>, usize)>,
}

impl InFlight {
    fn retire(&mut self, wr_id: u64) -> Option<(NodeId, usize)> {
        let r = self.retires.remove(&wr_id)?;
        let seq = split_wr_id(wr_id).0;
        if let Some(entry) = self.nodes.get_mut(&seq) {
            entry.1 = entry.1.saturating_sub(1);
            if entry.1 == 0 {
                self.nodes.remove(&seq);
            }
        }
        Some(r)
    }

    /// Forgets the chains to `node` (its queue pair broke).
    fn drop_node(&mut self, node: NodeId) {
        let gone: Vec<u64> = self
            .retires
            .iter()
            .filter(|(_, (n, _))| *n == node)
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.retire(id);
        }
    }
}

/// One CN (or MN) thread's verbs: an RC queue pair per connected peer, one send and one
/// receive completion queue, a staging arena. Not `Sync`: one per core, as every dmem
/// executor is thread-per-core.
pub struct RdmaContext {
    endpoint: Endpoint,
    pd: Arc<ProtectionDomain>,
    config: QpConfig,
    lid: u16,
    gid: [u8; 16],
    limits: ChainLimits,
    send_cq: Arc<BasicCompletionQueue>,
    recv_cq: Arc<BasicCompletionQueue>,
    links: RefCell<HashMap<NodeId, Link>>,
    regions: RefCell<RegionTable>,
    /// The region each connected MN announced (for [`RdmaContext::alias_region`]).
    peer_regions: RefCell<HashMap<NodeId, RegionDescriptor>>,
    table: RefCell<CompletionTable>,
    posts: RefCell<HashMap<u32, PostState>>,
    abandoned: RefCell<HashSet<u32>>,
    in_flight: RefCell<InFlight>,
    arena: PinnedBuffer,
    free_slots: RefCell<Vec<usize>>,
    quarantined: RefCell<Vec<Staging>>,
    inbox: RefCell<VecDeque<Message>>,
    recv_waker: RefCell<Option<Waker>>,
    psn_seed: Cell<u32>,
}

impl std::fmt::Debug for RdmaContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaContext")
            .field("endpoint", &self.endpoint)
            .field("links", &self.links.borrow().len())
            .finish_non_exhaustive()
    }
}

fn to_sideway_state(s: QpState) -> QueuePairState {
    match s {
        QpState::Reset => QueuePairState::Reset,
        QpState::Init => QueuePairState::Init,
        QpState::ReadyToReceive => QueuePairState::ReadyToReceive,
        QpState::ReadyToSend => QueuePairState::ReadyToSend,
        QpState::Error => QueuePairState::Error,
    }
}

fn to_sideway_mtu(m: PathMtu) -> Mtu {
    match m {
        PathMtu::Mtu256 => Mtu::Mtu256,
        PathMtu::Mtu512 => Mtu::Mtu512,
        PathMtu::Mtu1024 => Mtu::Mtu1024,
        PathMtu::Mtu2048 => Mtu::Mtu2048,
        PathMtu::Mtu4096 => Mtu::Mtu4096,
    }
}

fn to_access_flags(bits: crate::qp::Access) -> AccessFlags {
    use crate::qp::Access;
    let mut f = AccessFlags::none();
    for (bit, flag) in [
        (Access::LOCAL_WRITE, AccessFlags::LocalWrite),
        (Access::REMOTE_WRITE, AccessFlags::RemoteWrite),
        (Access::REMOTE_READ, AccessFlags::RemoteRead),
        (Access::REMOTE_ATOMIC, AccessFlags::RemoteAtomic),
    ] {
        if bits.contains(bit) {
            f |= flag;
        }
    }
    f
}

/// The sideway attribute set of one planned transition.
fn to_sideway_attr(attrs: &[QpAttr]) -> QueuePairAttribute {
    let mut a = QueuePairAttribute::new();
    for attr in attrs {
        match *attr {
            QpAttr::State(s) => {
                a.setup_state(to_sideway_state(s));
            }
            QpAttr::PkeyIndex(p) => {
                a.setup_pkey_index(p);
            }
            QpAttr::Port(p) => {
                a.setup_port(p);
            }
            QpAttr::AccessFlags(bits) => {
                a.setup_access_flags(to_access_flags(bits));
            }
            QpAttr::PathMtu(m) => {
                a.setup_path_mtu(to_sideway_mtu(m));
            }
            QpAttr::DestQpNum(n) => {
                a.setup_dest_qp_num(n);
            }
            QpAttr::RqPsn(p) => {
                a.setup_rq_psn(p);
            }
            QpAttr::MaxDestRdAtomic(n) => {
                a.setup_max_dest_read_atomic(n);
            }
            QpAttr::MinRnrTimer(t) => {
                a.setup_min_rnr_timer(t);
            }
            QpAttr::Av(av) => {
                let mut ah = AddressHandleAttribute::new();
                match av {
                    AddressVector::Lid { dest_lid, port } => {
                        ah.setup_dest_lid(dest_lid).setup_port(port);
                    }
                    AddressVector::Grh {
                        dest_gid,
                        sgid_index,
                        hop_limit,
                        port,
                    } => {
                        ah.setup_port(port)
                            .setup_grh_src_gid_index(sgid_index)
                            .setup_grh_dest_gid(&Gid { raw: dest_gid })
                            .setup_grh_hop_limit(hop_limit);
                    }
                }
                a.setup_address_vector(&ah);
            }
            QpAttr::SqPsn(p) => {
                a.setup_sq_psn(p);
            }
            QpAttr::Timeout(t) => {
                a.setup_timeout(t);
            }
            QpAttr::RetryCnt(n) => {
                a.setup_retry_cnt(n);
            }
            QpAttr::RnrRetry(n) => {
                a.setup_rnr_retry(n);
            }
            QpAttr::MaxRdAtomic(n) => {
                a.setup_max_read_atomic(n);
            }
        }
    }
    a
}

/// Receive wr_ids: the peer node in the high 32 bits, the buffer slot in the low.
fn recv_wr_id(node: NodeId, slot: usize) -> u64 {
    (u64::from(node.0) << 32) | slot as u64
}

impl RdmaContext {
    /// Creates the queue pair to `peer` (RESET) and returns this end's descriptor, with
    /// `region` when this node exposes memory (an MN) and `None` otherwise. Send it to the
    /// peer, then call [`connect`](Self::connect) with the peer's.
    ///
    /// # Errors
    /// [`RdmaError::Ibverbs`] when the queue pair or its receive buffers cannot be created.
    pub fn prepare(
        &self,
        peer: NodeId,
        region: Option<RegionDescriptor>,
    ) -> Result<RdmaDescriptor, RdmaError> {
        let mut b = self.pd.create_qp_builder();
        b.setup_max_send_wr(self.limits.max_send_wr)
            .setup_max_recv_wr(RECV_DEPTH as u32)
            .setup_max_send_sge(1)
            .setup_max_recv_sge(1)
            .setup_max_inline_data(self.limits.max_inline)
            .setup_send_cq(GenericCompletionQueue::from(Arc::clone(&self.send_cq)))
            .setup_recv_cq(GenericCompletionQueue::from(Arc::clone(&self.recv_cq)))
            .setup_send_ops_flags(
                SendOperationFlags::Read
                    | SendOperationFlags::Write
                    | SendOperationFlags::Send
                    | SendOperationFlags::AtomicCompareAndSwap
                    | SendOperationFlags::AtomicFetchAndAdd,
            );
        let qp = b.build_ex().map_err(|e| RdmaError::Ibverbs {
            call: "ibv_create_qp_ex",
            detail: e.to_string(),
        })?;
        // Start PSNs differ per QP (as perftest's random PSN does) so that a stale packet of
        // an earlier connection is not taken for a new one.
        let psn = self
            .psn_seed
            .get()
            .wrapping_mul(2_654_435_761)
            .wrapping_add(qp.qp_number())
            & crate::descriptor::MAX_24_BIT;
        self.psn_seed.set(self.psn_seed.get().wrapping_add(1));
        let local = QpEndpoint {
            qp_num: qp.qp_number(),
            psn,
            lid: self.lid,
            gid: self.gid,
            mtu: self.config.local_mtu,
        };
        let recv = PinnedBuffer::new(
            &self.pd,
            RECV_DEPTH * msg::RECV_BUFFER,
            AccessFlags::LocalWrite,
        )?;
        self.links.borrow_mut().insert(
            peer,
            Link {
                qp,
                machine: QpMachine::new(self.config)?,
                local,
                recv,
                outstanding: 0,
            },
        );
        Ok(RdmaDescriptor {
            node: self.endpoint.node,
            region,
            qp: local,
        })
    }

    /// Connects the queue pair prepared for `peer.node`: RESET → INIT, posts the receive
    /// buffers, INIT → RTR → RTS, and learns the peer's region.
    ///
    /// # Errors
    /// [`RdmaError::QpState`] when no queue pair was prepared for that node or a transition
    /// is refused; [`RdmaError::Ibverbs`] when the device refuses one.
    pub fn connect(&self, peer: &RdmaDescriptor) -> Result<(), RdmaError> {
        let mut links = self.links.borrow_mut();
        let link = links
            .get_mut(&peer.node)
            .ok_or_else(|| RdmaError::Ibverbs {
                call: "connect",
                detail: format!("no queue pair prepared for {}", peer.node),
            })?;
        let plan = link.machine.connect_plan(&peer.qp, link.local.psn)?;
        for (step, t) in plan.iter().enumerate() {
            link.qp
                .modify(&to_sideway_attr(&t.attrs))
                .map_err(|e| RdmaError::Ibverbs {
                    call: "ibv_modify_qp",
                    detail: format!("{:?} -> {:?}: {e}", t.from, t.to),
                })?;
            link.machine.applied(t)?;
            if step == 0 {
                Self::post_receives(peer.node, link, 0..RECV_DEPTH)?;
            }
        }
        if let Some(region) = peer.region {
            self.regions.borrow_mut().insert(peer.node, region);
            self.peer_regions.borrow_mut().insert(peer.node, region);
        } else {
            // A peer without memory is still reachable for messages.
            self.regions.borrow_mut().insert(
                peer.node,
                RegionDescriptor {
                    addr: 0,
                    len: 0,
                    rkey: dmem_verbs::RKey(0),
                },
            );
        }
        Ok(())
    }

    /// [`prepare`](Self::prepare), exchange descriptors over `stream` (the control plane's
    /// connection to that peer), [`connect`](Self::connect). Returns the peer's descriptor.
    ///
    /// # Errors
    /// As the three steps.
    pub fn connect_over<S: Read + Write>(
        &self,
        stream: &mut S,
        peer: NodeId,
        region: Option<RegionDescriptor>,
    ) -> Result<RdmaDescriptor, RdmaError> {
        let local = self.prepare(peer, region)?;
        let remote = exchange(stream, &local)?;
        if remote.node != peer {
            return Err(RdmaError::Ibverbs {
                call: "connect",
                detail: format!("expected {peer}, the peer says it is {}", remote.node),
            });
        }
        self.connect(&remote)?;
        Ok(remote)
    }

    /// Lets addresses of `node` that carry `alias` reach the region `node` announced when
    /// it connected (see [`RegionTable::insert_alias`]): a deployment lays its store out
    /// with rkeys of its own before any NIC assigns one. Returns whether `node`'s region
    /// is known.
    pub fn alias_region(&self, node: NodeId, alias: dmem_verbs::RKey) -> bool {
        let mut regions = self.regions.borrow_mut();
        let Some(region) = self.peer_regions.borrow().get(&node).copied() else {
            return false;
        };
        regions.insert_alias(node, alias, region);
        true
    }

    /// The passive end of [`connect_over`](Self::connect_over): reads the peer's
    /// descriptor first (an MN learns which CN connects from it), then prepares, answers
    /// with this end's descriptor and connects. Returns the peer's descriptor.
    ///
    /// # Errors
    /// As [`connect_over`](Self::connect_over).
    pub fn accept_over<S: Read + Write>(
        &self,
        stream: &mut S,
        region: Option<RegionDescriptor>,
    ) -> Result<RdmaDescriptor, RdmaError> {
        let mut buf = [0u8; crate::descriptor::DESCRIPTOR_LEN];
        stream
            .read_exact(&mut buf)
            .map_err(crate::descriptor::ExchangeError::from)?;
        let remote = RdmaDescriptor::parse(&buf).map_err(crate::descriptor::ExchangeError::from)?;
        let local = self.prepare(remote.node, region)?;
        stream
            .write_all(&local.emit())
            .and_then(|()| stream.flush())
            .map_err(crate::descriptor::ExchangeError::from)?;
        self.connect(&remote)?;
        Ok(remote)
    }

    /// Moves the queue pair to `peer` to the error state: the peer's verbs on it fail from
    /// now on (its requests go unanswered until its transport retries run out), as an MN
    /// revokes a crashed CN's access (Pandora §3.2.4). Returns whether such a queue pair
    /// existed.
    ///
    /// # Errors
    /// [`RdmaError::Ibverbs`] when the device refuses the transition.
    pub fn revoke(&self, peer: NodeId) -> Result<bool, RdmaError> {
        let mut links = self.links.borrow_mut();
        let Some(link) = links.get_mut(&peer) else {
            return Ok(false);
        };
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Error);
        link.qp.modify(&attr).map_err(|e| RdmaError::Ibverbs {
            call: "ibv_modify_qp",
            detail: format!("-> ERROR: {e}"),
        })?;
        link.machine.failed();
        Ok(true)
    }

    fn post_receives(
        peer: NodeId,
        link: &mut Link,
        slots: impl Iterator<Item = usize>,
    ) -> Result<(), RdmaError> {
        let (base, lkey) = (link.recv.addr(), link.recv.lkey());
        let mut guard = link.qp.start_post_recv();
        for slot in slots {
            let handle = guard.construct_wr(recv_wr_id(peer, slot));
            // SAFETY: the slot lies inside `link.recv`, which lives as long as the QP (both
            // in `Link`; the QP is destroyed first, field order).
            unsafe {
                handle.setup_sge(
                    lkey,
                    base + (slot * msg::RECV_BUFFER) as u64,
                    msg::RECV_BUFFER as u32,
                );
            }
        }
        guard.post().map_err(|e| RdmaError::Ibverbs {
            call: "ibv_post_recv",
            detail: e.to_string(),
        })
    }

    /// Drains both completion queues: finishes posts, retires send-queue entries, delivers
    /// messages. Returns the completions seen. Usable as a poller of the polling executor
    /// (`Executor::register_poller`); every waiting future also calls it.
    pub fn poll_completions(&self) -> usize {
        let mut done: Vec<(u64, u32)> = Vec::new();
        if let Ok(poller) = self.send_cq.start_poll() {
            done.extend(poller.map(|wc| (wc.wr_id(), wc.status())));
        }
        for &(id, status) in &done {
            self.on_send_completion(id, status);
        }
        let mut received: Vec<(u64, u32, u32)> = Vec::new();
        if let Ok(poller) = self.recv_cq.start_poll() {
            received.extend(poller.map(|wc| (wc.wr_id(), wc.status(), wc.byte_len())));
        }
        for &(id, status, len) in &received {
            self.on_receive(id, status, len as usize);
        }
        done.len() + received.len()
    }

    fn on_send_completion(&self, id: u64, status: u32) {
        let (seq, index) = split_wr_id(id);
        if status != WC_SUCCESS {
            let node = self
                .in_flight
                .borrow()
                .nodes
                .get(&seq)
                .and_then(|(nodes, _)| nodes.get(index as usize).copied());
            if let Some(node) = node {
                self.break_link(node);
            }
        }
        let retired = self.in_flight.borrow_mut().retire(id);
        if let Some((node, n)) = retired
            && let Some(link) = self.links.borrow_mut().get_mut(&node)
        {
            link.outstanding = link.outstanding.saturating_sub(n);
        }
        let finished = self.table.borrow_mut().complete(id, status);
        if finished && self.abandoned.borrow_mut().remove(&seq) {
            // Nobody waits: free the staging now the NIC is done with it.
            let outcome = self.table.borrow_mut().poll(seq, Waker::noop());
            if let Some(p) = self.posts.borrow_mut().remove(&seq) {
                match outcome {
                    Some(PostOutcome::Done) => self.release(p.staging),
                    _ => self.quarantine(p.staging),
                }
            }
        }
    }

    /// An error completion moved the queue pair to `node` to ERROR: forget its region so that
    /// later posts fail at once with `ConnectionLost`, and let nothing wait on it.
    /// The peers whose queue pair broke (an error completion): nothing posted to them
    /// lands any more.
    pub fn lost_peers(&self) -> impl Iterator<Item = NodeId> {
        let lost: Vec<NodeId> = self
            .links
            .borrow()
            .iter()
            .filter(|(_, link)| link.machine.state() == QpState::Error)
            .map(|(node, _)| *node)
            .collect();
        lost.into_iter()
    }

    fn break_link(&self, node: NodeId) {
        if let Some(link) = self.links.borrow_mut().get_mut(&node) {
            link.machine.failed();
            link.outstanding = 0;
        }
        self.in_flight.borrow_mut().drop_node(node);
        self.regions.borrow_mut().remove_node(node);
    }

    fn on_receive(&self, id: u64, status: u32, len: usize) {
        let node = NodeId((id >> 32) as u16);
        let slot = id as u32 as usize;
        if status != WC_SUCCESS {
            self.break_link(node);
            return;
        }
        let mut links = self.links.borrow_mut();
        let Some(link) = links.get_mut(&node) else {
            return;
        };
        let bytes = link
            .recv
            .read(slot * msg::RECV_BUFFER, len.min(msg::RECV_BUFFER));
        if let Ok(msg::Frame {
            from,
            to_port,
            payload,
        }) = msg::Frame::parse(&bytes)
            && to_port == self.endpoint.port
        {
            self.inbox.borrow_mut().push_back(Message {
                from,
                payload: payload.to_vec(),
            });
            if let Some(w) = self.recv_waker.borrow_mut().take() {
                w.wake();
            }
        }
        // Frames for another port or malformed frames are dropped (loss is the protocol's
        // business, as on the other fabrics); the buffer goes back either way.
        if Self::post_receives(node, link, std::iter::once(slot)).is_err() {
            drop(links);
            self.break_link(node);
        }
    }

    /// Keeps the staging of a failed post out of use for the context's lifetime: chains of
    /// that post on other queue pairs may still be landing in it.
    fn quarantine(&self, staging: Option<Staging>) {
        if let Some(s) = staging {
            self.quarantined.borrow_mut().push(s);
        }
    }

    fn release(&self, staging: Option<Staging>) {
        if let Some(Staging::Slot(s)) = staging {
            self.free_slots.borrow_mut().push(s);
        }
    }

    fn staging_for(&self, len: usize) -> Result<Staging, VerbsError> {
        if len <= STAGING_SLOT
            && let Some(s) = self.free_slots.borrow_mut().pop()
        {
            return Ok(Staging::Slot(s));
        }
        PinnedBuffer::new(&self.pd, len, AccessFlags::LocalWrite)
            .map(Staging::Own)
            .map_err(|_| VerbsError::LocalCrash)
    }

    fn staging_buffer<'a>(&'a self, s: &'a Staging) -> (&'a PinnedBuffer, usize) {
        match s {
            Staging::Slot(i) => (&self.arena, i * STAGING_SLOT),
            Staging::Own(b) => (b, 0),
        }
    }

    /// Waits until the queue pair to `node` has room for `n` more work requests (a chain
    /// larger than the queue waits for an empty one; it was split to fit).
    async fn room(&self, node: NodeId, n: usize) {
        poll_fn(|cx| {
            self.poll_completions();
            // A missing link passes here and fails in `post_chain` with ConnectionLost.
            let ok = self.links.borrow().get(&node).is_none_or(|l| {
                l.outstanding == 0 || l.outstanding + n <= self.limits.max_send_wr as usize
            });
            if ok {
                Poll::Ready(())
            } else {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        })
        .await;
    }

    /// Posts one chain of post `seq` behind one doorbell (`ibv_wr_start` ... `ibv_wr_complete`).
    fn post_chain(&self, seq: u32, chain: &crate::chain::Chain) -> Result<(), VerbsError> {
        let posts = self.posts.borrow();
        let staging = posts
            .get(&seq)
            .and_then(|p| p.staging.as_ref())
            .ok_or(VerbsError::LocalCrash)?;
        let (buf, base) = self.staging_buffer(staging);
        let mut links = self.links.borrow_mut();
        let link = links
            .get_mut(&chain.node)
            .filter(|l| l.machine.state() == QpState::ReadyToSend)
            .ok_or(VerbsError::ConnectionLost { node: chain.node })?;
        let mut guard = link.qp.start_post_send();
        for w in &chain.wrs {
            let mut flags = WorkRequestFlags::none();
            if w.signaled {
                flags |= WorkRequestFlags::Signaled;
            }
            if w.inline() {
                flags |= WorkRequestFlags::Inline;
            }
            let h = guard.construct_wr(w.wr_id, flags);
            let sge = |local: &crate::chain::LocalSlice| {
                (
                    buf.lkey(),
                    buf.addr() + (base + local.offset) as u64,
                    local.len as u32,
                )
            };
            match &w.op {
                ChainedOp::Read { local } => {
                    let (lkey, addr, len) = sge(local);
                    let h = h.setup_read(w.rkey, w.remote_addr);
                    // SAFETY: the slice lies in the staging buffer, which stays
                    // registered and alive until the post completes (kept in `posts`).
                    unsafe { h.setup_sge(lkey, addr, len) };
                }
                ChainedOp::WriteInline { data } => {
                    h.setup_write(w.rkey, w.remote_addr).setup_inline_data(data);
                }
                ChainedOp::Write { local, data } => {
                    buf.write(base + local.offset, data);
                    let (lkey, addr, len) = sge(local);
                    let h = h.setup_write(w.rkey, w.remote_addr);
                    // SAFETY: as for READ.
                    unsafe { h.setup_sge(lkey, addr, len) };
                }
                ChainedOp::Cas {
                    compare,
                    swap,
                    local,
                } => {
                    let (lkey, addr, len) = sge(local);
                    let h = h.setup_atomic_compare_swap(w.rkey, w.remote_addr, *compare, *swap);
                    // SAFETY: as for READ; the slice is 8 bytes, 8-aligned.
                    unsafe { h.setup_sge(lkey, addr, len) };
                }
                ChainedOp::Faa { add, local } => {
                    let (lkey, addr, len) = sge(local);
                    let h = h.setup_atomic_fetch_add(w.rkey, w.remote_addr, *add);
                    // SAFETY: as for READ.
                    unsafe { h.setup_sge(lkey, addr, len) };
                }
            }
        }
        // One doorbell for the whole chain (`ibv_wr_complete`).
        guard
            .post()
            .map_err(|_| VerbsError::ConnectionLost { node: chain.node })?;
        link.outstanding += chain.wrs.len();
        drop(posts);
        if let Some(last) = chain.wrs.last() {
            let mut f = self.in_flight.borrow_mut();
            f.retires.insert(last.wr_id, (chain.node, chain.wrs.len()));
            if let Some(entry) = f.nodes.get_mut(&seq) {
                entry.1 += 1;
            }
        }
        Ok(())
    }

    async fn post_inner(&self, list: PostList) -> Result<BatchResult, VerbsError> {
        let seq = self.table.borrow_mut().reserve();
        // Dropped before completion (the caller gave up on the future): see `AbandonGuard`.
        let mut guard = AbandonGuard {
            ctx: self,
            seq,
            armed: true,
            unposted_signaled: 0,
        };
        let built = build_chains(list, &self.regions.borrow(), self.limits, seq);
        let plan = match built {
            Ok(plan) => plan,
            Err(e) => {
                self.table.borrow_mut().cancel(seq);
                return Err(e);
            }
        };
        let staging = match self.staging_for(plan.staging_len) {
            Ok(s) => s,
            Err(e) => {
                self.table.borrow_mut().cancel(seq);
                return Err(e);
            }
        };
        let mut addrs = vec![
            RemoteAddr {
                node: NodeId(0),
                rkey: dmem_verbs::RKey(0),
                offset: 0
            };
            plan.len
        ];
        for chain in &plan.chains {
            for w in &chain.wrs {
                addrs[w.index] = RemoteAddr {
                    node: chain.node,
                    rkey: dmem_verbs::RKey(w.rkey),
                    offset: 0,
                };
            }
        }
        // Registered before the first doorbell: completions of early chains are counted and
        // retire their send-queue entries while later chains wait for room.
        self.table.borrow_mut().expect(seq, plan.signaled);
        self.in_flight
            .borrow_mut()
            .nodes
            .insert(seq, (addrs.iter().map(|a| a.node).collect(), 0));
        self.posts.borrow_mut().insert(
            seq,
            PostState {
                staging: Some(staging),
                addrs,
            },
        );
        guard.unposted_signaled = plan.signaled;
        for chain in &plan.chains {
            self.room(chain.node, chain.wrs.len()).await;
            // On an error the armed guard settles the post (see `AbandonGuard`).
            self.post_chain(seq, chain)?;
            guard.unposted_signaled -= chain.wrs.iter().filter(|w| w.signaled).count();
        }
        let outcome = poll_fn(|cx| {
            self.poll_completions();
            match self.table.borrow_mut().poll(seq, cx.waker()) {
                Some(o) => Poll::Ready(o),
                None => {
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
            }
        })
        .await;
        guard.armed = false;
        let state = self.posts.borrow_mut().remove(&seq);
        let Some(mut state) = state else {
            return Err(VerbsError::LocalCrash);
        };
        match outcome {
            PostOutcome::Done => {
                let staging = state.staging.take();
                let mut outcomes = vec![WrOutcome::Written; plan.len];
                if let Some(s) = &staging {
                    let (buf, base) = self.staging_buffer(s);
                    for w in plan.chains.iter().flat_map(|c| &c.wrs) {
                        outcomes[w.index] = match &w.op {
                            ChainedOp::Read { local } => {
                                WrOutcome::Bytes(buf.read(base + local.offset, local.len).into())
                            }
                            ChainedOp::Cas { local, .. } | ChainedOp::Faa { local, .. } => {
                                let b = buf.read(base + local.offset, 8);
                                WrOutcome::Atomic(u64::from_ne_bytes(
                                    b.try_into().unwrap_or([0; 8]),
                                ))
                            }
                            ChainedOp::Write { .. } | ChainedOp::WriteInline { .. } => {
                                WrOutcome::Written
                            }
                        };
                    }
                }
                self.release(staging);
                Ok(BatchResult::new(outcomes))
            }
            PostOutcome::Failed { index, status } => {
                self.quarantine(state.staging.take());
                let addr = state.addrs[index as usize];
                Err(if status == WC_REM_ACCESS_ERR {
                    VerbsError::RemoteAccess {
                        index: index as usize,
                        addr,
                    }
                } else {
                    VerbsError::ConnectionLost { node: addr.node }
                })
            }
        }
    }
}

/// Settles a post whose future is dropped (or returns an error) before its outcome was
/// taken. Its signaled work requests that were never posted are no longer awaited; if
/// nothing of it is in flight any more it is forgotten and its staging freed at once,
/// otherwise it is marked abandoned and its staging is freed when the NIC is done with it.
struct AbandonGuard<'a> {
    ctx: &'a RdmaContext,
    seq: u32,
    armed: bool,
    /// Signaled work requests of the post not handed to the NIC yet.
    unposted_signaled: usize,
}

impl Drop for AbandonGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let ctx = self.ctx;
        {
            // A post none of whose chains reached the NIC has nothing to retire.
            let mut f = ctx.in_flight.borrow_mut();
            if f.nodes
                .get(&self.seq)
                .is_some_and(|(_, chains)| *chains == 0)
            {
                f.nodes.remove(&self.seq);
            }
        }
        if !ctx.posts.borrow().contains_key(&self.seq) {
            ctx.table.borrow_mut().cancel(self.seq);
            return;
        }
        ctx.table
            .borrow_mut()
            .reduce(self.seq, self.unposted_signaled);
        let outcome = ctx.table.borrow_mut().poll(self.seq, Waker::noop());
        match outcome {
            Some(o) => {
                if let Some(mut p) = ctx.posts.borrow_mut().remove(&self.seq) {
                    match o {
                        PostOutcome::Done => ctx.release(p.staging.take()),
                        PostOutcome::Failed { .. } => ctx.quarantine(p.staging.take()),
                    }
                }
            }
            None => {
                ctx.abandoned.borrow_mut().insert(self.seq);
            }
        }
    }
}

impl Verbs for RdmaContext {
    fn local_endpoint(&self) -> Endpoint {
        self.endpoint
    }

    fn post(&self, list: PostList) -> impl Future<Output = Result<BatchResult, VerbsError>> {
        self.post_inner(list)
    }

    async fn send(&self, to: Endpoint, payload: &[u8]) -> Result<(), VerbsError> {
        let frame = msg::Frame {
            from: self.endpoint,
            to_port: to.port,
            payload,
        }
        .emit()
        .ok_or(VerbsError::MessageTooLarge {
            len: payload.len(),
            max: msg::MAX_PAYLOAD,
        })?;
        let seq = self.table.borrow_mut().register(1);
        let mut guard = AbandonGuard {
            ctx: self,
            seq,
            armed: true,
            unposted_signaled: 0,
        };
        let staging = self.staging_for(frame.len())?;
        let posted = (|| -> Result<(), VerbsError> {
            let (buf, base) = self.staging_buffer(&staging);
            let mut links = self.links.borrow_mut();
            let link = links
                .get_mut(&to.node)
                .filter(|l| l.machine.state() == QpState::ReadyToSend)
                .ok_or(VerbsError::ConnectionLost { node: to.node })?;
            let inline = frame.len() <= self.limits.max_inline as usize;
            let mut flags = WorkRequestFlags::Signaled;
            if inline {
                flags |= WorkRequestFlags::Inline;
            }
            let mut post = link.qp.start_post_send();
            let h = post.construct_wr(wr_id(seq, 0), flags).setup_send();
            if inline {
                h.setup_inline_data(&frame);
            } else {
                buf.write(base, &frame);
                // SAFETY: the frame lies in the staging buffer, kept until the completion.
                unsafe { h.setup_sge(buf.lkey(), buf.addr() + base as u64, frame.len() as u32) };
            }
            post.post()
                .map_err(|_| VerbsError::ConnectionLost { node: to.node })?;
            link.outstanding += 1;
            let mut f = self.in_flight.borrow_mut();
            f.retires.insert(wr_id(seq, 0), (to.node, 1));
            f.nodes.insert(seq, (vec![to.node], 1));
            Ok(())
        })();
        if let Err(e) = posted {
            self.release(Some(staging));
            return Err(e);
        }
        self.posts.borrow_mut().insert(
            seq,
            PostState {
                staging: Some(staging),
                addrs: vec![RemoteAddr {
                    node: to.node,
                    rkey: dmem_verbs::RKey(0),
                    offset: 0,
                }],
            },
        );
        let outcome = poll_fn(|cx| {
            self.poll_completions();
            match self.table.borrow_mut().poll(seq, cx.waker()) {
                Some(o) => Poll::Ready(o),
                None => {
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
            }
        })
        .await;
        guard.armed = false;
        if let Some(mut p) = self.posts.borrow_mut().remove(&seq) {
            match outcome {
                PostOutcome::Done => self.release(p.staging.take()),
                PostOutcome::Failed { .. } => self.quarantine(p.staging.take()),
            }
        }
        match outcome {
            PostOutcome::Done => Ok(()),
            PostOutcome::Failed { .. } => Err(VerbsError::ConnectionLost { node: to.node }),
        }
    }

    async fn recv(&self) -> Result<Message, VerbsError> {
        poll_fn(|cx| {
            self.poll_completions();
            if let Some(m) = self.inbox.borrow_mut().pop_front() {
                return Poll::Ready(Ok(m));
            }
            *self.recv_waker.borrow_mut() = Some(cx.waker().clone());
            // Completions arrive without an interrupt (no completion channel): poll again.
            cx.waker().wake_by_ref();
            Poll::Pending
        })
        .await
    }

    fn try_recv(&self) -> Result<Option<Message>, VerbsError> {
        self.poll_completions();
        Ok(self.inbox.borrow_mut().pop_front())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The planned transitions reach sideway's attribute struct value by value (what
    /// `ibv_modify_qp` will be given), without a device.
    #[test]
    fn planned_transitions_map_onto_sideway_attributes() {
        let config = QpConfig {
            port: 2,
            pkey_index: 3,
            max_rd_atomic: 8,
            ..QpConfig::default()
        };
        let peer = QpEndpoint {
            qp_num: 0x1234,
            psn: 0x55,
            lid: 4,
            gid: [0; 16],
            mtu: PathMtu::Mtu2048,
        };
        let [init, rtr, rts] = QpMachine::new(config)
            .unwrap()
            .connect_plan(&peer, 0x66)
            .unwrap();
        let a = to_sideway_attr(&init.attrs);
        assert_eq!(a.state(), QueuePairState::Init);
        assert_eq!((a.port(), a.pkey_index()), (2, 3));
        assert_eq!(
            a.access_flags(),
            AccessFlags::LocalWrite
                | AccessFlags::RemoteWrite
                | AccessFlags::RemoteRead
                | AccessFlags::RemoteAtomic
        );
        let a = to_sideway_attr(&rtr.attrs);
        assert_eq!(a.state(), QueuePairState::ReadyToReceive);
        assert_eq!((a.dest_qp_num(), a.rq_psn()), (0x1234, 0x55));
        assert_eq!(a.path_mtu(), Mtu::Mtu2048);
        assert_eq!((a.max_dest_read_atomic(), a.min_rnr_timer()), (8, 12));
        let a = to_sideway_attr(&rts.attrs);
        assert_eq!(a.state(), QueuePairState::ReadyToSend);
        assert_eq!(a.sq_psn(), 0x66);
        assert_eq!(
            (
                a.timeout(),
                a.retry_cnt(),
                a.rnr_retry(),
                a.max_read_atomic()
            ),
            (14, 7, 7, 8)
        );
    }

    #[test]
    fn chains_in_flight_retire_by_their_last_wr_and_go_with_a_broken_link() {
        let mut f = InFlight::default();
        f.nodes
            .insert(7, (vec![NodeId(1), NodeId(1), NodeId(2)], 2));
        f.retires.insert(wr_id(7, 1), (NodeId(1), 2));
        f.retires.insert(wr_id(7, 2), (NodeId(2), 1));
        assert_eq!(f.retire(wr_id(7, 0)), None, "unsignaled: retires nothing");
        assert_eq!(f.retire(wr_id(7, 1)), Some((NodeId(1), 2)));
        assert!(f.nodes.contains_key(&7), "node 2's chain still runs");
        f.drop_node(NodeId(2));
        assert!(f.retires.is_empty() && f.nodes.is_empty());
    }

    #[test]
    fn receive_wr_ids_name_the_peer_and_the_slot() {
        let id = recv_wr_id(NodeId(0xbeef), 63);
        assert_eq!(((id >> 32) as u16, id as u32 as usize), (0xbeef, 63));
    }
}
