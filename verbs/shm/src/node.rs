//! Memory nodes and the links through which CN contexts reach them.

use std::sync::atomic::{Ordering, fence};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dmem_verbs::sync::lock_ignoring_poison;
use dmem_verbs::{MemoryRegion, NodeId, Op, RKey, VerbsError, WrOutcome};

use crate::mapping::{HugePages, MAX_LINKS, Mapping};
use crate::{ShmError, ops};

/// How long [`ShmMemoryNode::revoke`] waits for posts in flight to finish.
const REVOKE_WAIT: Duration = Duration::from_millis(100);

/// An MN's mapping registered with an RDMA device ([`ShmMemoryNode::register_rdma`]);
/// deregistered on drop, before the mapping it keeps alive.
#[cfg(feature = "rdma")]
#[derive(Debug)]
pub struct RdmaRegistration {
    region: dmem_rdma::device::ExternalRegion,
    _node: ShmMemoryNode,
}

#[cfg(feature = "rdma")]
impl RdmaRegistration {
    /// What CNs need to address the region through the NIC.
    #[must_use]
    pub fn descriptor(&self) -> dmem_rdma::RegionDescriptor {
        self.region.descriptor()
    }
}

/// A memory node: owns the shared mapping that holds one registered region.
///
/// Cloning is cheap and shares the node. CN contexts reach it through [`MnLink`]s made by
/// [`link`](Self::link) (same process) or by [`MnLink::connect`] to a
/// [`serve`](Self::serve)d socket (other processes).
#[derive(Debug, Clone)]
pub struct ShmMemoryNode {
    inner: Arc<NodeInner>,
}

#[derive(Debug)]
struct NodeInner {
    mapping: Arc<Mapping>,
    region: MemoryRegion,
    /// The CN of every link slot handed out, indexed by slot.
    slots: Mutex<Vec<NodeId>>,
}

impl ShmMemoryNode {
    /// Creates memory node `node` with one zeroed region of `len` bytes under `rkey`.
    ///
    /// The memory is a sealed memfd; huge pages are tried first (see
    /// [`huge_pages`](Self::huge_pages)).
    ///
    /// # Errors
    /// [`ShmError::Os`] if the memfd cannot be created, sized, sealed or mapped;
    /// [`ShmError::TooLarge`] if `len` does not fit in the address space.
    pub fn create(node: NodeId, rkey: RKey, len: u64) -> Result<Self, ShmError> {
        let mapping = Mapping::create(&format!("dmem-shm-mn{}", node.0), len)?;
        Ok(Self {
            inner: Arc::new(NodeInner {
                mapping: Arc::new(mapping),
                region: MemoryRegion { node, rkey, len },
                slots: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The registered region, as CNs address it.
    #[must_use]
    pub fn region(&self) -> MemoryRegion {
        self.inner.region
    }

    /// Which huge-page mechanism backs the memory.
    #[must_use]
    pub fn huge_pages(&self) -> HugePages {
        self.inner.mapping.huge_pages()
    }

    /// Registers the region with an RDMA device for remote READ, WRITE and atomics: the
    /// rdma fabric's MNs serve this mapping, so loads and final reads reach the same bytes
    /// out of band. The registration keeps this node (and so the mapping) alive. The NIC's
    /// writes bypass the write-stripe seqlocks, so a shm reader of this node may see them
    /// torn at any byte, as readers of an RDMA NIC's memory do.
    ///
    /// # Errors
    /// [`dmem_rdma::RdmaError`] when the device refuses the registration.
    #[cfg(feature = "rdma")]
    pub fn register_rdma(
        &self,
        device: &dmem_rdma::device::RdmaDevice,
    ) -> Result<RdmaRegistration, dmem_rdma::RdmaError> {
        let len = usize::try_from(self.inner.mapping.data_len()).map_err(|_| {
            dmem_rdma::RdmaError::Size("region larger than the address space".into())
        })?;
        // SAFETY: the data range is mapped for `len` bytes for as long as the mapping lives
        // (unmapped only in its `Drop`; the memfd is sealed against shrinking), and the
        // returned registration holds a clone of this node, so the mapping outlives the
        // registration (fields drop in order: the registration first).
        let region = unsafe { device.register_external(self.inner.mapping.data_ptr(), len)? };
        Ok(RdmaRegistration {
            region,
            _node: self.clone(),
        })
    }

    /// Bytes mapped in total (control lines plus the region, rounded to the page size).
    #[must_use]
    pub fn mapped_len(&self) -> usize {
        self.inner.mapping.len()
    }

    /// A link for a context of CN `cn` in this process.
    ///
    /// # Errors
    /// [`ShmError::NoFreeSlot`] after [`MAX_LINKS`] links.
    pub fn link(&self, cn: NodeId) -> Result<MnLink, ShmError> {
        let slot = self.alloc_slot(cn)?;
        Ok(MnLink::new(
            Arc::clone(&self.inner.mapping),
            self.inner.region,
            slot,
        ))
    }

    /// Hands out the next link slot and records that it belongs to `cn`.
    pub(crate) fn alloc_slot(&self, cn: NodeId) -> Result<u32, ShmError> {
        let mut slots = lock_ignoring_poison(&self.inner.slots);
        let slot = u32::try_from(slots.len())
            .ok()
            .filter(|&s| s < MAX_LINKS)
            .ok_or(ShmError::NoFreeSlot {
                node: self.inner.region.node,
                max: MAX_LINKS,
            })?;
        slots.push(cn);
        Ok(slot)
    }

    /// The mapping, to pass its memfd to another process.
    pub(crate) fn mapping(&self) -> &Mapping {
        &self.inner.mapping
    }

    /// Revokes the access of every link of CN `cn`, in this process and in others (Pandora
    /// §3.2.2, active-link termination). Returns how many links were revoked.
    ///
    /// Once this returns `Ok`, no post of `cn` is executing at this node and every later one
    /// completes with [`VerbsError::RemoteAccess`] without touching memory: each post raises
    /// its link's in-flight counter, then checks the revoked flag (both `SeqCst`), while this
    /// sets the flag and then waits for the counters to drop to zero, so either the post sees
    /// the flag or this sees the post.
    ///
    /// Links made for `cn` afterwards (a restarted CN) get fresh slots and are not revoked.
    ///
    /// # Errors
    /// [`ShmError::RevokeTimeout`] if a post was still in flight after 100 ms. The access is
    /// revoked all the same; only the in-flight post may still land (a CN process that died in
    /// the middle of a post leaves its counter raised forever, and lands nothing more).
    pub fn revoke(&self, cn: NodeId) -> Result<usize, ShmError> {
        let slots: Vec<u32> = {
            let slots = lock_ignoring_poison(&self.inner.slots);
            (0..)
                .zip(slots.iter())
                .filter(|&(_, &owner)| owner == cn)
                .map(|(slot, _)| slot)
                .collect()
        };
        let m = &self.inner.mapping;
        for &slot in &slots {
            m.slot_revoked(slot).store(1, Ordering::SeqCst);
        }
        let start = Instant::now();
        for &slot in &slots {
            while m.slot_in_flight(slot).load(Ordering::SeqCst) != 0 {
                if start.elapsed() > REVOKE_WAIT {
                    return Err(ShmError::RevokeTimeout {
                        cn,
                        waited_ms: REVOKE_WAIT.as_millis() as u64,
                    });
                }
                std::thread::yield_now();
            }
        }
        Ok(slots.len())
    }
}

/// One CN context's access to one memory node: the shared mapping, the region description
/// and the link slot whose revoked flag the node sets.
///
/// Made by [`ShmMemoryNode::link`] in the node's process or by [`MnLink::connect`] in another
/// process, and handed to [`ShmContext::add_link`](crate::ShmContext::add_link).
#[derive(Debug)]
pub struct MnLink {
    pub(crate) mapping: Arc<Mapping>,
    pub(crate) region: MemoryRegion,
    pub(crate) slot: u32,
}

impl MnLink {
    /// A link through `slot`, used by this process: records its process id in the slot.
    pub(crate) fn new(mapping: Arc<Mapping>, region: MemoryRegion, slot: u32) -> Self {
        mapping
            .slot_pid(slot)
            .store(u64::from(std::process::id()), Ordering::Release);
        Self {
            mapping,
            region,
            slot,
        }
    }

    /// The region this link reaches.
    #[must_use]
    pub fn region(&self) -> MemoryRegion {
        self.region
    }

    /// The memory node's slot for this link.
    #[must_use]
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// Whether the node has revoked this link.
    #[must_use]
    pub fn is_revoked(&self) -> bool {
        self.mapping.slot_revoked(self.slot).load(Ordering::SeqCst) != 0
    }

    /// Starts using the link for one post: raises the in-flight counter, then checks the
    /// revoked flag (both `SeqCst`, see [`ShmMemoryNode::revoke`]). Returns `false`, with the
    /// counter restored, if access is revoked. Every `true` must be paired with [`leave`].
    ///
    /// [`leave`]: Self::leave
    pub(crate) fn enter(&self) -> bool {
        let in_flight = self.mapping.slot_in_flight(self.slot);
        in_flight.fetch_add(1, Ordering::SeqCst);
        if self.mapping.slot_revoked(self.slot).load(Ordering::SeqCst) != 0 {
            in_flight.fetch_sub(1, Ordering::Release);
            return false;
        }
        true
    }

    /// Ends a post started with [`enter`](Self::enter). `Release`, so that a revoker that
    /// reads the lowered counter also sees everything the post did.
    pub(crate) fn leave(&self) {
        self.mapping
            .slot_in_flight(self.slot)
            .fetch_sub(1, Ordering::Release);
    }

    /// Executes work request `index` of a post list, between [`enter`](Self::enter) and
    /// [`leave`](Self::leave): checks rkey and bounds, then performs the op. A refused op
    /// touches nothing.
    pub(crate) fn execute(&self, index: usize, op: &Op) -> Result<WrOutcome, VerbsError> {
        let addr = op.addr();
        if addr.rkey != self.region.rkey || !self.region.contains(addr.offset, op.remote_len()) {
            return Err(VerbsError::RemoteAccess { index, addr });
        }
        let m = &self.mapping;
        Ok(match op {
            Op::Read { len, .. } => {
                WrOutcome::Bytes(ops::read(m, addr.offset, *len, ops::owner_of(self.slot)))
            }
            Op::Write { data, .. } => {
                ops::write(m, addr.offset, data, ops::owner_of(self.slot));
                WrOutcome::Written
            }
            Op::Cas { expect, swap, .. } => {
                WrOutcome::Atomic(ops::cas(m, addr.offset, *expect, *swap))
            }
            Op::Faa { add, .. } => WrOutcome::Atomic(ops::faa(m, addr.offset, *add)),
        })
    }
}

/// Ends a post: a `SeqCst` fence, so that everything the post did is ordered before whatever
/// this context posts next, with respect to every other context's posts (a completion means
/// the ops were executed, as on an RDMA responder).
pub(crate) fn complete_post() {
    fence(Ordering::SeqCst);
}
