//! Node identities, remote addresses and registered regions.

use core::fmt;

/// A node of the cluster (CN or MN). Dense, starting at 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub u16);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {}", self.0)
    }
}

/// A remote key: names a registered memory region at its node, as an ibverbs `rkey` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RKey(pub u32);

/// The address of a byte in a registered region of a remote node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RemoteAddr {
    /// The node that holds the memory.
    pub node: NodeId,
    /// The region's remote key.
    pub rkey: RKey,
    /// Byte offset inside the region.
    pub offset: u64,
}

impl RemoteAddr {
    /// The address `bytes` further on in the same region.
    #[must_use]
    #[inline]
    pub const fn add(self, bytes: u64) -> Self {
        Self {
            offset: self.offset + bytes,
            ..self
        }
    }
}

impl fmt::Display for RemoteAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{:#x}+{:#x}", self.node, self.rkey.0, self.offset)
    }
}

/// A memory region registered at a node: what a CN needs to address it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemoryRegion {
    /// The node that holds the memory.
    pub node: NodeId,
    /// The region's remote key.
    pub rkey: RKey,
    /// Length of the region in bytes.
    pub len: u64,
}

impl MemoryRegion {
    /// The address of byte `offset`, or `None` if it lies outside the region.
    ///
    /// Responders check bounds too (an out-of-bounds work request completes with a remote
    /// access error); this lets a caller catch its own mistakes before posting.
    #[must_use]
    #[inline]
    pub const fn at(&self, offset: u64) -> Option<RemoteAddr> {
        if offset < self.len {
            Some(RemoteAddr {
                node: self.node,
                rkey: self.rkey,
                offset,
            })
        } else {
            None
        }
    }

    /// Whether `len` bytes starting at `offset` lie inside the region.
    #[must_use]
    #[inline]
    pub const fn contains(&self, offset: u64, len: u64) -> bool {
        match offset.checked_add(len) {
            Some(end) => end <= self.len,
            None => false,
        }
    }
}

/// A receive queue of a node: with [`NodeId`] it names where a two-sided message goes.
///
/// A CN gives each of its threads a port; an MN's control plane listens on port 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Port(pub u16);

/// Where a two-sided message is delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    /// The receiving node.
    pub node: NodeId,
    /// The receive queue at that node.
    pub port: Port,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} port {}", self.node, self.port.0)
    }
}
