//! Why setting up the tcp fabric failed.

use dmem_verbs::NodeId;

use crate::wire::{RefuseReason, WireError};

/// A failure to serve, connect, hand-shake or listen.
///
/// Verbs failures at run time are [`dmem_verbs::VerbsError`]s; this type covers set-up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TcpError {
    /// A system call failed.
    #[error("{call} failed: {source}")]
    Io {
        /// What was being done (`bind`, `connect to 10.0.0.2:7000`, ...).
        call: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// io_uring cannot be set up here (kernel too old, `kernel.io_uring_disabled` set, or
    /// the locked-memory limit too low).
    #[error(
        "cannot set up io_uring for the memory node's serving loop: {0} (check /proc/sys/kernel/io_uring_disabled and `ulimit -l`)"
    )]
    Ring(std::io::Error),
    /// The memory node refused this CN.
    #[error("{node} refused the connection: {reason}")]
    Refused {
        /// The memory node.
        node: String,
        /// Why.
        reason: RefuseReason,
    },
    /// The peer sent something that is not the expected frame.
    #[error("handshake with {peer}: {source}")]
    Handshake {
        /// The peer's address.
        peer: String,
        /// What was wrong.
        #[source]
        source: WireError,
    },
    /// The memory node's region could not be created or linked.
    #[error("memory region: {0}")]
    Shm(#[from] dmem_shm::ShmError),
    /// The context already has a connection to this memory node.
    #[error("this context is already connected to {0}")]
    DuplicateLink(NodeId),
}

impl TcpError {
    /// Wraps an I/O error of `call`.
    pub(crate) fn io(call: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let call = call.into();
        move |source| Self::Io { call, source }
    }
}
