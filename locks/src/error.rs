//! Why a lock operation failed.

use dmem_verbs::VerbsError;

/// A failed lock operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// A work request or message failed.
    #[error("lock verbs failed: {0}")]
    Verbs(#[from] VerbsError),
    /// The acquisition did not complete within the configured bound, even after the
    /// recovery the protocol has (DecLock §4.4 acquisition timeout and reset).
    #[error("lock acquisition timed out after {waited_ns} ns")]
    Timeout {
        /// Time spent, ns.
        waited_ns: u64,
    },
    /// The lock was being reset and stayed so for longer than the acquisition bound
    /// (DecLock §4.4: operations that meet a reset id are aborted).
    #[error("lock is being reset by {reset_id}")]
    Resetting {
        /// Reset id found in the header.
        reset_id: u64,
    },
    /// The lock's state contradicts this client's view (released in a mode it was not
    /// held in, a counter out of range): the lock must be reset.
    #[error("lock state is inconsistent: {0}")]
    Corrupt(&'static str),
    /// A lock word or queue entry names a client id the directory does not know.
    #[error("client id {0} is not in the lock directory")]
    UnknownClient(u32),
    /// This client already holds the lock it asked for (the protocols are not reentrant).
    #[error("client already holds this lock")]
    AlreadyHeld,
}
