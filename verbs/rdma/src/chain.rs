//! From a [`PostList`] to chains of work requests, one chain per destination queue pair and
//! one doorbell per chain (LOTUS §7.2, FORD's CAS+READ in one round trip): which work
//! requests are signaled (selective signaling, DecLock §6), which WRITEs travel inline,
//! where each READ's bytes and each atomic's old value land in the local staging buffer, and
//! which `wr_id` each carries so that completions find their post. Plain data: the device
//! code copies each [`ChainedWr`] into `ibv_wr_*` calls; the tests check chains without a
//! device.
//!
//! A chain is also checked against what the peer told at connection time (region bounds and
//! rkey) before anything is posted: on a reliable connection a remote access error moves the
//! queue pair to ERROR and flushes everything behind it, so catching the caller's mistake
//! locally keeps the connection up.

use std::collections::BTreeMap;

use dmem_verbs::{NodeId, Op, OpKind, PostList, RKey, RemoteAddr, VerbsError};

use crate::descriptor::RegionDescriptor;

/// Limits of the local queue pairs a chain must respect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainLimits {
    /// Largest WRITE payload sent inline (`max_inline_data` the QP was created with).
    pub max_inline: u32,
    /// Send-queue depth: a longer chain to one node is split into several doorbells, each
    /// ending with a signaled work request so that the queue drains.
    pub max_send_wr: u32,
}

impl Default for ChainLimits {
    fn default() -> Self {
        Self {
            max_inline: 64,
            max_send_wr: 128,
        }
    }
}

/// Where a work request's local bytes are, inside the post's staging buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalSlice {
    /// Offset in the staging buffer.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
}

/// What the device is asked to do for one work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainedOp {
    /// `ibv_wr_rdma_read`; the bytes land at `local`.
    Read {
        /// Destination in the staging buffer.
        local: LocalSlice,
    },
    /// `ibv_wr_rdma_write` with the payload copied into the work-queue entry.
    WriteInline {
        /// The payload.
        data: Vec<u8>,
    },
    /// `ibv_wr_rdma_write` gathering the payload from `local` (copied there first).
    Write {
        /// Source in the staging buffer.
        local: LocalSlice,
        /// The payload.
        data: Vec<u8>,
    },
    /// `ibv_wr_atomic_cmp_swp`; the old value lands at `local` (8 bytes, 8-aligned).
    Cas {
        /// Compared value.
        compare: u64,
        /// Stored value if equal.
        swap: u64,
        /// Destination of the old value.
        local: LocalSlice,
    },
    /// `ibv_wr_atomic_fetch_add`; the old value lands at `local`.
    Faa {
        /// Added value.
        add: u64,
        /// Destination of the old value.
        local: LocalSlice,
    },
}

/// One work request of a chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainedWr {
    /// Position in the post list (what errors name).
    pub index: usize,
    /// `wr_id`: see [`wr_id`].
    pub wr_id: u64,
    /// Remote virtual address (the region's base plus the offset).
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Whether it produces a completion.
    pub signaled: bool,
    /// What it does.
    pub op: ChainedOp,
}

impl ChainedWr {
    /// The kind of verb.
    #[must_use]
    pub const fn kind(&self) -> OpKind {
        match self.op {
            ChainedOp::Read { .. } => OpKind::Read,
            ChainedOp::Write { .. } | ChainedOp::WriteInline { .. } => OpKind::Write,
            ChainedOp::Cas { .. } => OpKind::Cas,
            ChainedOp::Faa { .. } => OpKind::Faa,
        }
    }

    /// Whether the payload is inline.
    #[must_use]
    pub const fn inline(&self) -> bool {
        matches!(self.op, ChainedOp::WriteInline { .. })
    }
}

/// Work requests for one queue pair behind one doorbell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// The destination node (whose queue pair).
    pub node: NodeId,
    /// The work requests in post-list order; the last is always signaled.
    pub wrs: Vec<ChainedWr>,
}

/// A post list turned into chains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainPlan {
    /// Chains in the order of each node's first work request in the list.
    pub chains: Vec<Chain>,
    /// Bytes of staging buffer the post needs (READ results, atomics' old values, WRITE
    /// payloads that are not inline).
    pub staging_len: usize,
    /// Completions the post waits for (signaled work requests).
    pub signaled: usize,
    /// Work requests in the list.
    pub len: usize,
}

/// Encodes the `wr_id` of work request `index` of post `seq`: the post in the high 32 bits,
/// the index in the low 32, so a completion names both.
#[must_use]
pub const fn wr_id(seq: u32, index: u32) -> u64 {
    ((seq as u64) << 32) | index as u64
}

/// Splits a `wr_id` into (post, index).
#[must_use]
pub const fn split_wr_id(wr_id: u64) -> (u32, u32) {
    ((wr_id >> 32) as u32, wr_id as u32)
}

/// The regions a context may address, learnt from the peers' descriptors.
#[derive(Debug, Clone, Default)]
pub struct RegionTable {
    regions: BTreeMap<(NodeId, RKey), RegionDescriptor>,
}

impl RegionTable {
    /// An empty table.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) `node`'s region.
    pub fn insert(&mut self, node: NodeId, region: RegionDescriptor) {
        self.regions.insert((node, region.rkey), region);
    }

    /// Makes `node`'s region known under `alias` too: addresses that carry `alias` (the
    /// rkey a deployment laid its store out with, before any NIC assigned one) resolve to
    /// `region`, and go to the NIC with `region`'s own rkey.
    pub fn insert_alias(&mut self, node: NodeId, alias: RKey, region: RegionDescriptor) {
        self.regions.insert((node, alias), region);
    }

    /// The region an rkey of `node` names.
    #[must_use]
    pub fn get(&self, node: NodeId, rkey: RKey) -> Option<RegionDescriptor> {
        self.regions.get(&(node, rkey)).copied()
    }

    /// Forgets every region of `node` (its connection is gone).
    pub fn remove_node(&mut self, node: NodeId) {
        self.regions.retain(|(n, _), _| *n != node);
    }

    /// Whether any region of `node` is known.
    #[must_use]
    pub fn knows(&self, node: NodeId) -> bool {
        self.regions.keys().any(|(n, _)| *n == node)
    }

    /// The remote virtual address of `len` bytes at `addr` and the NIC's rkey for them, if
    /// they lie in a known region.
    #[must_use]
    pub fn resolve(&self, addr: RemoteAddr, len: u64) -> Option<(u64, RKey)> {
        let region = self.regions.get(&(addr.node, addr.rkey))?;
        let end = addr.offset.checked_add(len)?;
        (end <= region.len).then(|| (region.addr + addr.offset, region.rkey))
    }
}

const fn align8(x: usize) -> usize {
    (x + 7) & !7
}

/// Builds the chains of `list` for post `seq`.
///
/// Checks what [`PostList::finish`] checks (non-empty, atomics 8-byte aligned) and fixes
/// signaling the same way (the last work request to each node, or all); then resolves every
/// address against `regions`, puts each WRITE of at most `limits.max_inline` bytes inline,
/// lays READ destinations and atomic results out in the staging buffer (atomics 8-aligned),
/// and splits a node's chain every `limits.max_send_wr` work requests, signaling the last of
/// each part.
///
/// # Errors
/// [`VerbsError::EmptyPostList`] / [`VerbsError::Misaligned`] as `finish`;
/// [`VerbsError::ConnectionLost`] for a node without a connection;
/// [`VerbsError::RemoteAccess`] for an unknown rkey or a range outside the region. Nothing
/// is posted then.
pub fn build_chains(
    list: PostList,
    regions: &RegionTable,
    limits: ChainLimits,
    seq: u32,
) -> Result<ChainPlan, VerbsError> {
    let wrs = list.finish()?;
    let len = wrs.len();
    let mut chains: Vec<Chain> = Vec::new();
    let mut staging = 0usize;
    for (index, wr) in wrs.into_iter().enumerate() {
        let addr = wr.op.addr();
        if !regions.knows(addr.node) {
            return Err(VerbsError::ConnectionLost { node: addr.node });
        }
        let (remote_addr, rkey) = regions
            .resolve(addr, wr.op.remote_len())
            .ok_or(VerbsError::RemoteAccess { index, addr })?;
        let mut take = |n: usize, align: bool| {
            if align {
                staging = align8(staging);
            }
            let slice = LocalSlice {
                offset: staging,
                len: n,
            };
            staging += n;
            slice
        };
        let op = match wr.op {
            Op::Read { len, .. } => ChainedOp::Read {
                local: take(len as usize, false),
            },
            Op::Write { data, .. } if data.len() <= limits.max_inline as usize => {
                ChainedOp::WriteInline { data }
            }
            Op::Write { data, .. } => ChainedOp::Write {
                local: take(data.len(), false),
                data,
            },
            Op::Cas { expect, swap, .. } => ChainedOp::Cas {
                compare: expect,
                swap,
                local: take(8, true),
            },
            Op::Faa { add, .. } => ChainedOp::Faa {
                add,
                local: take(8, true),
            },
        };
        let chained = ChainedWr {
            index,
            wr_id: wr_id(seq, index as u32),
            remote_addr,
            rkey: rkey.0,
            signaled: wr.signaled,
            op,
        };
        match chains.iter_mut().find(|c| c.node == addr.node) {
            Some(chain) => chain.wrs.push(chained),
            None => chains.push(Chain {
                node: addr.node,
                wrs: vec![chained],
            }),
        }
    }
    let depth = limits.max_send_wr.max(1) as usize;
    let mut split = Vec::with_capacity(chains.len());
    for chain in chains {
        let parts = chain.wrs.len().div_ceil(depth);
        let mut wrs = chain.wrs.into_iter();
        for _ in 0..parts {
            let mut part: Vec<ChainedWr> = wrs.by_ref().take(depth).collect();
            if let Some(last) = part.last_mut() {
                last.signaled = true;
            }
            split.push(Chain {
                node: chain.node,
                wrs: part,
            });
        }
    }
    let signaled = split
        .iter()
        .flat_map(|c| &c.wrs)
        .filter(|w| w.signaled)
        .count();
    Ok(ChainPlan {
        chains: split,
        staging_len: staging,
        signaled,
        len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmem_verbs::RKey;
    use quickcheck_macros::quickcheck;

    const BASE: [u64; 3] = [0x1000_0000, 0x2000_0000, 0x3000_0000];

    fn regions() -> RegionTable {
        let mut t = RegionTable::new();
        for (n, base) in BASE.iter().enumerate() {
            t.insert(
                NodeId(n as u16),
                RegionDescriptor {
                    addr: *base,
                    len: 1 << 17,
                    rkey: RKey(10 + n as u32),
                },
            );
        }
        t
    }

    fn at(node: u16, offset: u64) -> RemoteAddr {
        RemoteAddr {
            node: NodeId(node),
            rkey: RKey(10 + u32::from(node)),
            offset,
        }
    }

    #[test]
    fn an_aliased_rkey_reaches_the_region_with_the_nics_rkey() {
        let mut table = regions();
        let nic = table.get(NodeId(1), RKey(11)).unwrap();
        table.insert_alias(NodeId(1), RKey(0xd3e3_1001), nic);
        let mut list = PostList::new();
        list.read(
            RemoteAddr {
                node: NodeId(1),
                rkey: RKey(0xd3e3_1001),
                offset: 64,
            },
            8,
        );
        let plan = build_chains(list, &table, ChainLimits::default(), 1).unwrap();
        let wr = &plan.chains[0].wrs[0];
        assert_eq!((wr.remote_addr, wr.rkey), (BASE[1] + 64, 11));
        // An rkey nobody aliased is still refused before anything is posted.
        let mut list = PostList::new();
        list.read(
            RemoteAddr {
                node: NodeId(1),
                rkey: RKey(0xd3e3_1002),
                offset: 64,
            },
            8,
        );
        assert!(matches!(
            build_chains(list, &table, ChainLimits::default(), 2),
            Err(VerbsError::RemoteAccess { index: 0, .. })
        ));
    }

    #[test]
    fn ford_lock_and_read_is_one_chain_with_only_the_last_signaled() {
        let mut list = PostList::new();
        list.cas(at(0, 64), 0, 1);
        list.read(at(0, 128), 40);
        let plan = build_chains(list, &regions(), ChainLimits::default(), 7).unwrap();
        assert_eq!(plan.chains.len(), 1, "one doorbell");
        let wrs = &plan.chains[0].wrs;
        assert_eq!(
            wrs.iter().map(|w| w.signaled).collect::<Vec<_>>(),
            [false, true]
        );
        assert_eq!(wrs[0].remote_addr, BASE[0] + 64);
        assert_eq!(wrs[0].rkey, 10);
        assert_eq!(
            wrs[0].op,
            ChainedOp::Cas {
                compare: 0,
                swap: 1,
                local: LocalSlice { offset: 0, len: 8 }
            }
        );
        assert_eq!(
            wrs[1].op,
            ChainedOp::Read {
                local: LocalSlice { offset: 8, len: 40 }
            }
        );
        assert_eq!(split_wr_id(wrs[1].wr_id), (7, 1));
        assert_eq!((plan.signaled, plan.staging_len, plan.len), (1, 48, 2));
    }

    #[test]
    fn one_chain_per_node_in_first_use_order_each_ending_signaled() {
        let mut list = PostList::new();
        list.read(at(1, 0), 8);
        list.write(at(0, 0), &[1; 8]);
        list.faa(at(1, 8), 1);
        list.write(at(2, 0), &[2; 100]);
        list.read(at(0, 8), 8);
        let plan = build_chains(list, &regions(), ChainLimits::default(), 0).unwrap();
        let nodes: Vec<u16> = plan.chains.iter().map(|c| c.node.0).collect();
        assert_eq!(nodes, [1, 0, 2]);
        for chain in &plan.chains {
            assert!(chain.wrs.last().unwrap().signaled);
            assert!(chain.wrs[..chain.wrs.len() - 1].iter().all(|w| !w.signaled));
            assert!(
                chain.wrs.windows(2).all(|w| w[0].index < w[1].index),
                "list order kept"
            );
        }
        assert_eq!(plan.signaled, 3);
    }

    #[test]
    fn writes_go_inline_up_to_the_limit_and_gather_from_staging_above_it() {
        let mut list = PostList::new();
        list.write(at(0, 0), &[7; 64]);
        list.write(at(0, 64), &[8; 65]);
        list.write(at(0, 256), &[]);
        let plan = build_chains(list, &regions(), ChainLimits::default(), 0).unwrap();
        let wrs = &plan.chains[0].wrs;
        assert!(wrs[0].inline() && !wrs[1].inline() && wrs[2].inline());
        assert_eq!(
            wrs[1].op,
            ChainedOp::Write {
                local: LocalSlice { offset: 0, len: 65 },
                data: vec![8; 65]
            }
        );
        assert_eq!(wrs[0].op, ChainedOp::WriteInline { data: vec![7; 64] });
        let small = ChainLimits {
            max_inline: 0,
            ..ChainLimits::default()
        };
        let mut list = PostList::new();
        list.write(at(0, 0), &[7; 8]);
        let plan = build_chains(list, &regions(), small, 0).unwrap();
        assert!(
            !plan.chains[0].wrs[0].inline(),
            "inline off when the QP has no inline room"
        );
    }

    #[test]
    fn atomic_results_are_8_aligned_in_staging_and_misaligned_atomics_refused() {
        let mut list = PostList::new();
        list.read(at(0, 0), 3);
        list.cas(at(0, 8), 1, 2);
        list.read(at(0, 100), 5);
        list.faa(at(0, 16), 9);
        let plan = build_chains(list, &regions(), ChainLimits::default(), 0).unwrap();
        let offsets: Vec<usize> = plan.chains[0]
            .wrs
            .iter()
            .map(|w| match &w.op {
                ChainedOp::Read { local } | ChainedOp::Write { local, .. } => local.offset,
                ChainedOp::Cas { local, .. } | ChainedOp::Faa { local, .. } => local.offset,
                ChainedOp::WriteInline { .. } => usize::MAX,
            })
            .collect();
        assert_eq!(offsets, [0, 8, 16, 24]);
        let mut list = PostList::new();
        list.read(at(0, 0), 8);
        list.faa(at(0, 4), 1);
        assert_eq!(
            build_chains(list, &regions(), ChainLimits::default(), 0),
            Err(VerbsError::Misaligned {
                index: 1,
                addr: at(0, 4)
            })
        );
    }

    #[test]
    fn a_chain_longer_than_the_send_queue_is_split_with_a_signal_per_part() {
        let mut list = PostList::new();
        for i in 0..10 {
            list.read(at(0, i * 8), 8);
        }
        let limits = ChainLimits {
            max_send_wr: 4,
            ..ChainLimits::default()
        };
        let plan = build_chains(list, &regions(), limits, 0).unwrap();
        let sizes: Vec<usize> = plan.chains.iter().map(|c| c.wrs.len()).collect();
        assert_eq!(sizes, [4, 4, 2]);
        assert_eq!(plan.signaled, 3);
        assert!(plan.chains.iter().all(|c| c.wrs.last().unwrap().signaled));
    }

    #[test]
    fn bad_addresses_are_refused_before_posting() {
        let t = regions();
        let mut list = PostList::new();
        list.read(at(0, 0), 8);
        list.read(at(0, (1 << 17) - 4), 8);
        assert_eq!(
            build_chains(list, &t, ChainLimits::default(), 0),
            Err(VerbsError::RemoteAccess {
                index: 1,
                addr: at(0, (1 << 17) - 4)
            })
        );
        let mut list = PostList::new();
        let wrong_key = RemoteAddr {
            rkey: RKey(99),
            ..at(1, 0)
        };
        list.write(wrong_key, &[1]);
        assert!(matches!(
            build_chains(list, &t, ChainLimits::default(), 0),
            Err(VerbsError::RemoteAccess { index: 0, .. })
        ));
        let mut list = PostList::new();
        list.read(at(5, 0), 8);
        assert_eq!(
            build_chains(list, &t, ChainLimits::default(), 0),
            Err(VerbsError::ConnectionLost { node: NodeId(5) })
        );
        assert_eq!(
            build_chains(PostList::new(), &t, ChainLimits::default(), 0),
            Err(VerbsError::EmptyPostList)
        );
        let mut t = t;
        t.remove_node(NodeId(0));
        let mut list = PostList::new();
        list.read(at(0, 0), 8);
        assert_eq!(
            build_chains(list, &t, ChainLimits::default(), 0),
            Err(VerbsError::ConnectionLost { node: NodeId(0) })
        );
    }

    /// Any list of valid work requests: every work request appears in exactly one chain,
    /// each chain's last is signaled, staging slices do not overlap and atomics' are aligned.
    #[quickcheck]
    fn chains_partition_the_list(ops: Vec<(u8, u8, u16, u8)>, depth: u8, inline: u8) -> bool {
        if ops.is_empty() {
            return true;
        }
        let mut list = PostList::new();
        for &(kind, node, off, len) in &ops {
            let node = u16::from(node % 3);
            let off = u64::from(off) & !7;
            match kind % 4 {
                0 => list.read(at(node, off), u32::from(len)),
                1 => list.write(at(node, off), &vec![kind; usize::from(len)]),
                2 => list.cas(at(node, off), 1, 2),
                _ => list.faa(at(node, off), 1),
            };
        }
        let limits = ChainLimits {
            max_inline: u32::from(inline),
            max_send_wr: u32::from(depth % 16) + 1,
        };
        let plan = build_chains(list, &regions(), limits, 3).unwrap();
        let mut seen: Vec<usize> = plan
            .chains
            .iter()
            .flat_map(|c| c.wrs.iter().map(|w| w.index))
            .collect();
        seen.sort_unstable();
        let mut slices: Vec<LocalSlice> = Vec::new();
        for w in plan.chains.iter().flat_map(|c| &c.wrs) {
            match &w.op {
                ChainedOp::Cas { local, .. } | ChainedOp::Faa { local, .. } => {
                    if local.offset % 8 != 0 {
                        return false;
                    }
                    slices.push(*local);
                }
                ChainedOp::Read { local } | ChainedOp::Write { local, .. } => slices.push(*local),
                ChainedOp::WriteInline { .. } => {}
            }
        }
        // Zero-length READs and WRITEs occupy nothing.
        slices.retain(|s| s.len > 0);
        slices.sort_by_key(|s| s.offset);
        seen == (0..ops.len()).collect::<Vec<_>>()
            && plan
                .chains
                .iter()
                .all(|c| c.wrs.last().is_some_and(|w| w.signaled))
            && plan
                .chains
                .iter()
                .all(|c| c.wrs.len() <= limits.max_send_wr as usize)
            && slices
                .windows(2)
                .all(|s| s[0].offset + s[0].len <= s[1].offset)
            && slices
                .last()
                .is_none_or(|s| s.offset + s.len <= plan.staging_len)
    }
}
