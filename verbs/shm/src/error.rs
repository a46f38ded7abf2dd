//! Why setting up the shared-memory fabric failed.

use dmem_verbs::{Endpoint, NodeId};

/// A failure to create, share, map or link a memory node, or to register an endpoint.
///
/// Verbs failures at run time are [`dmem_verbs::VerbsError`]s; this type covers setup.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShmError {
    /// A system call failed.
    #[error("{call} failed: {source}")]
    Os {
        /// The call (`memfd_create`, `mmap`, `connect`, ...).
        call: &'static str,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The requested region does not fit in this host's address space.
    #[error("a region of {len} bytes does not fit in this host's address space")]
    TooLarge {
        /// Requested length in bytes.
        len: u64,
    },
    /// The Unix-socket handshake with a memory node failed, or what it sent is unusable.
    #[error("handshake with the memory node failed: {0}")]
    Handshake(String),
    /// Another context of this fabric already receives on this endpoint.
    #[error("{0} already has a receive queue in this fabric")]
    EndpointInUse(Endpoint),
    /// The memory node has handed out all its link slots.
    #[error("{node} has no free link slot (it serves at most {max} links in its lifetime)")]
    NoFreeSlot {
        /// The memory node.
        node: NodeId,
        /// Its number of slots.
        max: u32,
    },
    /// The context already has a link to this memory node.
    #[error("this context already has a link to {0}")]
    DuplicateLink(NodeId),
    /// Access was revoked, but a post of the CN was still executing when the wait ended
    /// (a CN process that died in the middle of a post leaves its counter raised).
    #[error(
        "revoked the access of {cn}, but one of its posts was still in flight after {waited_ms} ms"
    )]
    RevokeTimeout {
        /// The CN whose access was revoked.
        cn: NodeId,
        /// How long `revoke` waited.
        waited_ms: u64,
    },
}

impl ShmError {
    /// Wraps an OS error of `call`.
    pub(crate) fn os<E: Into<std::io::Error>>(call: &'static str) -> impl FnOnce(E) -> Self {
        move |e| Self::Os {
            call,
            source: e.into(),
        }
    }
}
