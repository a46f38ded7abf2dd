//! Why a protocol aborted a transaction ([`AbortReason`]).
//!
//! The benchmarks count failed attempts per reason and print each reason's [`Display`]
//! text, so a variant's text is part of the output: it stays exactly as it was when the
//! reasons were strings. Reasons with the same text are one variant (e.g. [`LockRefused`]
//! in LOTUS and Dandelion); different texts stay different variants, even for close
//! meanings, so that the counts and their labels do not change.
//!
//! [`Display`]: core::fmt::Display
//! [`LockRefused`]: AbortReason::LockRefused

use core::fmt;

/// Why the protocol aborted a transaction: the payload of
/// [`TxnError::Aborted`](crate::TxnError::Aborted). Prints as the text the benchmarks
/// count aborts under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum AbortReason {
    // --- Locks held by others, lost or refused ---
    /// A record to lock is locked (Motor, OOCC).
    RecordLocked,
    /// A record to lock is locked by another transaction (OOCC).
    RecordLockedByAnother,
    /// A record stayed locked through the re-reads (Motor).
    RecordStayedLocked,
    /// A record is write-locked (DrTM).
    RecordWriteLocked,
    /// The write lock of a record is held by another transaction (FORD).
    WriteLockHeld,
    /// A read found its item locked (FORD).
    ReadLockedItem,
    /// A lock this transaction held is now another's (FORD).
    LockChangedHands,
    /// A lock the transaction should hold is not taken (OOCC).
    LockNotTaken,
    /// A record the transaction should have locked is not locked (DSLR 2PL).
    RecordNotLocked,
    /// A record's lock or lease could not be acquired (DrTM).
    RecordNotAcquired,
    /// The lock owner refused the lock (LOTUS, Dandelion).
    LockRefused,
    /// A lock request got no answer in time (LOTUS).
    LockRequestTimedOut,
    /// A record read under a shared lock is written: no upgrade (DSLR 2PL).
    LockUpgradeSharedToExclusive,
    /// A record read under a lease is written: no upgrade (DrTM).
    LockUpgradeOfLeasedRecord,
    /// An intention lock's version changed on every read (OOCC).
    IntentionLockVersionKeptChanging,

    // --- LOTUS lock owners and shards ---
    /// The CN owning a lock failed (LOTUS).
    LockOwnerFailed,
    /// A CN owning one of the transaction's locks failed before it committed (LOTUS).
    LockOwnerFailedBeforeCommit,
    /// The shard of a lock is being handed over to another CN (LOTUS).
    LockShardBeingHandedOver,
    /// The shard of a lock taken was handed over meanwhile (LOTUS).
    LockShardWasHandedOver,
    /// The shard map changed on every read (LOTUS).
    ShardMapKeptChanging,
    /// A CN has no lock server (LOTUS).
    NoLockServer,
    /// The idealised RDMA lock cannot reach the owner's lock table (LOTUS, simulator only).
    OwnerLockTableNotAtHand,

    // --- Leases (DrTM, DSLR) ---
    /// A read lease ran out before commit (DrTM).
    ReadLeaseExpired,
    /// A record's lease changed on every read (DrTM).
    LeaseKeptChanging,
    /// A record to lock is under a lease while the transaction holds locks (DrTM).
    LeaseRunningWhileLocking,
    /// A lease lasts too long to wait for (DrTM).
    LeaseTooLongToWaitOut,
    /// The DSLR hold lease passed before commit.
    DslrHoldLeasePassed,
    /// A DSLR lock word was reset by the lease: a holder died.
    DslrLockResetByLease,
    /// DSLR's tickets ran out until the lock word resets.
    DslrTicketsExhausted,
    /// A DSLR wait timed out (deadlock).
    DslrWaitTimedOut,

    // --- Validation and versions ---
    /// Commit-time validation failed (FORD, OOCC).
    ValidationFailed,
    /// Read validation failed (Dandelion).
    ReadValidationFailed,
    /// Read-only validation failed (OOCC).
    ReadOnlyValidationFailed,
    /// A read-only record changed (Motor, SR validation).
    ReadOnlyRecordChanged,
    /// A record changed since the transaction read it (OOCC).
    RecordChangedSinceRead,
    /// Validation could not see the reads it validates (FORD).
    ValidationLostItsReads,
    /// A record locked for update has a version newer than the start timestamp (Motor).
    NewerThanStartTimestamp,
    /// The version a snapshot needs was collected (Motor).
    SnapshotVersionCollected,
    /// A version stayed uncommitted or torn (LOTUS).
    VersionStayedUncommittedOrTorn,
    /// A record image was torn (Motor).
    TornImage,
    /// A record image read under the lock was torn (Motor, LOTUS).
    TornImageUnderLock,
    /// A version table read under the lock was torn (Motor).
    TornVersionTableUnderLock,
    /// A version table could not be read (Motor, LOTUS).
    UnreadableVersionTable,
    /// An item's bytes do not parse (FORD).
    MalformedItem,
    /// A write has no old image to log (FORD).
    WriteWithoutOldImage,

    // --- The index and the record pool ---
    /// The index bucket of a key is full (store, Motor, LOTUS).
    IndexBucketFull,
    /// No index slot is free for an insert (FORD).
    NoFreeIndexSlot,
    /// A concurrent insert took the index slot (FORD, Motor).
    IndexSlotTakenByConcurrentInsert,
    /// Another insert is claiming the index slot (Motor).
    IndexSlotBeingClaimed,
    /// An index slot is left half claimed (Motor).
    IndexSlotHalfClaimed,
    /// The index slot was not read before it is used (FORD, Motor).
    IndexSlotNotSeen,
    /// The index points at another record than the one read (FORD).
    IndexPointsAtAnotherRecord,
    /// This CN's share of the record pool is used up (store, Motor).
    RecordPoolShareUsedUp,
    /// A block offset does not fit a packed address (Motor).
    OffsetBeyondPackedAddresses,
    /// The store cannot serve the request (store).
    StoreUnavailable,

    // --- Logs ---
    /// The log region is full (FORD).
    LogRegionFull,
    /// The log region is too small for the log (FORD).
    LogRegionTooSmall,
    /// The log region is too small for a lock log (FORD).
    LogRegionTooSmallForLockLog,
    /// The lock log is full (FORD).
    LockLogFull,
    /// The commit log is larger than the log region (LOTUS).
    CommitLogLargerThanLogRegion,
    /// The redo log is larger than its region (OOCC, DrTM, DSLR 2PL).
    RedoLogLargerThanRegion,
    /// The CN has no log region (LOTUS).
    NoLogRegion,

    // --- Failures and recovery ---
    /// A memory node failed (FORD).
    MemoryNodeFailed,
    /// The view of the memory nodes changed during the transaction (FORD).
    MemoryNodeViewChanged,
    /// The decision after a memory-node failure was interrupted (FORD).
    MemoryNodeFailureDecisionInterrupted,
    /// Rolled back after a memory-node failure (FORD).
    RolledBackAfterMemoryNodeFailure,
    /// Recovery interrupted the transaction (Dandelion).
    InterruptedByRecovery,
    /// A Get response did not parse (Dandelion).
    MalformedGetResponse,

    // --- The caller ---
    /// The caller aborted the transaction.
    ByTheCaller,
    /// The transaction already ended.
    TransactionIsOver,
}

impl AbortReason {
    /// The reason's text: what the benchmarks count and print aborts under.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::RecordLocked => "record locked",
            Self::RecordLockedByAnother => "record locked by another transaction",
            Self::RecordStayedLocked => "record stayed locked",
            Self::RecordWriteLocked => "record write-locked",
            Self::WriteLockHeld => "write lock held",
            Self::ReadLockedItem => "read a locked item",
            Self::LockChangedHands => "lock changed hands",
            Self::LockNotTaken => "lock not taken",
            Self::RecordNotLocked => "record not locked",
            Self::RecordNotAcquired => "record not acquired",
            Self::LockRefused => "lock refused",
            Self::LockRequestTimedOut => "lock request timed out",
            Self::LockUpgradeSharedToExclusive => "lock upgrade (shared to exclusive)",
            Self::LockUpgradeOfLeasedRecord => "lock upgrade (a read-leased record written)",
            Self::IntentionLockVersionKeptChanging => "intention lock: version kept changing",
            Self::LockOwnerFailed => "lock owner failed",
            Self::LockOwnerFailedBeforeCommit => "a lock owner failed before commit",
            Self::LockShardBeingHandedOver => "lock shard being handed over",
            Self::LockShardWasHandedOver => "a lock's shard was handed over",
            Self::ShardMapKeptChanging => "shard map kept changing",
            Self::NoLockServer => "no lock server for a CN",
            Self::OwnerLockTableNotAtHand => {
                "idealised RDMA lock: the owner's table is not at hand"
            }
            Self::ReadLeaseExpired => "read lease expired",
            Self::LeaseKeptChanging => "lease kept changing",
            Self::LeaseRunningWhileLocking => "lease running on a record to lock, locks held",
            Self::LeaseTooLongToWaitOut => "lease too long to wait out",
            Self::DslrHoldLeasePassed => "DSLR hold lease passed before commit",
            Self::DslrLockResetByLease => "DSLR lock reset by lease (a holder died)",
            Self::DslrTicketsExhausted => "DSLR tickets exhausted until the word resets",
            Self::DslrWaitTimedOut => "DSLR wait timed out (deadlock)",
            Self::ValidationFailed => "validation failed",
            Self::ReadValidationFailed => "read validation failed",
            Self::ReadOnlyValidationFailed => "read-only validation failed",
            Self::ReadOnlyRecordChanged => "read-only record changed (SR validation)",
            Self::RecordChangedSinceRead => "record changed since it was read",
            Self::ValidationLostItsReads => "validation lost its reads",
            Self::NewerThanStartTimestamp => "newer version than the start timestamp",
            Self::SnapshotVersionCollected => "snapshot version collected",
            Self::VersionStayedUncommittedOrTorn => "version stayed uncommitted or torn",
            Self::TornImage => "torn image",
            Self::TornImageUnderLock => "torn image under the lock",
            Self::TornVersionTableUnderLock => "torn version table under the lock",
            Self::UnreadableVersionTable => "unreadable version table",
            Self::MalformedItem => "malformed item",
            Self::WriteWithoutOldImage => "write without an old image",
            Self::IndexBucketFull => "index bucket full",
            Self::NoFreeIndexSlot => "no free index slot",
            Self::IndexSlotTakenByConcurrentInsert => "index slot taken by a concurrent insert",
            Self::IndexSlotBeingClaimed => "index slot being claimed",
            Self::IndexSlotHalfClaimed => "index slot half claimed",
            Self::IndexSlotNotSeen => "index slot not seen",
            Self::IndexPointsAtAnotherRecord => "index points at another record",
            Self::RecordPoolShareUsedUp => "record pool share used up",
            Self::OffsetBeyondPackedAddresses => "offset beyond packed addresses",
            Self::StoreUnavailable => "store unavailable",
            Self::LogRegionFull => "log region full",
            Self::LogRegionTooSmall => "log region too small",
            Self::LogRegionTooSmallForLockLog => "log region too small for a lock log",
            Self::LockLogFull => "lock log full",
            Self::CommitLogLargerThanLogRegion => "commit log larger than the log region",
            Self::RedoLogLargerThanRegion => "redo log larger than its region",
            Self::NoLogRegion => "no log region",
            Self::MemoryNodeFailed => "memory node failed",
            Self::MemoryNodeViewChanged => "memory-node view changed",
            Self::MemoryNodeFailureDecisionInterrupted => "MN-failure decision interrupted",
            Self::RolledBackAfterMemoryNodeFailure => "rolled back after a memory-node failure",
            Self::InterruptedByRecovery => "interrupted by recovery",
            Self::MalformedGetResponse => "malformed Get response",
            Self::ByTheCaller => "aborted by the caller",
            Self::TransactionIsOver => "transaction is over",
        }
    }
}

impl fmt::Display for AbortReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
