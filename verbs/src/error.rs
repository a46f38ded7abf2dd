//! Why a work request or message failed.

use crate::{NodeId, RemoteAddr};

/// A verbs failure. Every variant names where it happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// The responder refused the access: the region's key is wrong, the range is out of
    /// bounds, or this CN's access was revoked (Pandora §3.2.2, active-link termination).
    #[error(
        "work request {index}: remote access error at {addr} (revoked access, bad rkey or out of bounds)"
    )]
    RemoteAccess {
        /// Position of the failed work request in its post list.
        index: usize,
        /// The address it targeted.
        addr: RemoteAddr,
    },
    /// The remote node does not answer (it crashed or the link is down).
    #[error("{node} does not answer (crashed or unreachable)")]
    ConnectionLost {
        /// The node that did not answer.
        node: NodeId,
    },
    /// This node crashed: nothing it posts lands any more. A task that sees this stops.
    #[error("the local node crashed")]
    LocalCrash,
    /// An atomic targeted an address that is not 8-byte aligned. Nothing was posted.
    #[error("work request {index}: atomic at {addr} is not 8-byte aligned; nothing was posted")]
    Misaligned {
        /// Position of the work request in its post list.
        index: usize,
        /// The address it targeted.
        addr: RemoteAddr,
    },
    /// The post list holds no work request. Nothing was posted.
    #[error("empty post list; nothing was posted")]
    EmptyPostList,
    /// A message payload exceeds what the fabric carries in one message.
    #[error("message of {len} bytes exceeds the fabric's limit of {max}; nothing was sent")]
    MessageTooLarge {
        /// Payload length offered.
        len: usize,
        /// Largest payload the fabric carries.
        max: usize,
    },
    /// The receive queue was closed (its node shut down).
    #[error("receive queue closed")]
    Closed,
}
