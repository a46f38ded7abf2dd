//! The steps of a protocol that fault injection aims crashes at ([`Phase`]).

use core::fmt;

/// A step of a protocol, marked with [`Verbs::mark_phase`](crate::Verbs::mark_phase) right
/// before the step posts its work requests, so that fault injection can aim crashes at it
/// (the litmus suite does).
///
/// Prints ([`Display`](fmt::Display)) as the step's name (`log`, `commit-lock+log`, …),
/// which crash reports show. A step whose batch also carries log WRITEs says so in its
/// name (`+log`): crash injection aims at log writes of attempts that may still abort.
/// [`Debug`](fmt::Debug) prints the name quoted, as the reports' `{:?}` did when phases
/// were strings.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Phase {
    /// READs of execution (`execute`).
    Execute,
    /// Locating records in the index (`locate`).
    Locate,
    /// Taking locks (`lock`).
    Lock,
    /// Claiming an index slot for an insert (`claim-slot`).
    ClaimSlot,
    /// Taking over the lock of a failed holder (`steal`).
    Steal,
    /// Writing the log (`log`).
    Log,
    /// Writing the lock log (`lock-log`).
    LockLog,
    /// Taking the commit-time locks (`commit-lock`).
    CommitLock,
    /// Taking the commit-time locks, with log WRITEs in the same batch (`commit-lock+log`).
    CommitLockAndLog,
    /// Validating reads (`validate`).
    Validate,
    /// Validating reads, with log WRITEs in the same batch (`validate+log`).
    ValidateAndLog,
    /// Writing the new values (`commit`).
    Commit,
    /// Writing the new values, creating a record (`commit+insert`).
    CommitWithInsert,
    /// Releasing locks after commit (`release`).
    Release,
    /// Releasing locks a memory-node failure left behind (`release-lost-locks`).
    ReleaseLostLocks,
    /// Unlocking after commit (`unlock`).
    Unlock,
    /// Truncating the log after commit (`truncate`).
    Truncate,
    /// An abort truncating its log (`abort-truncate`).
    AbortTruncate,
    /// An abort releasing its locks (`abort-unlock`).
    AbortUnlock,
    /// An abort releasing its locks (`abort-release`).
    AbortRelease,
    /// Writing new versions not yet visible to readers (`write-invisible`).
    WriteInvisible,
    /// Making the written versions visible (`write-visible`).
    WriteVisible,
    /// Not a protocol step: a crash at a chosen instant, for protocols whose servers post
    /// no work requests to aim at (`time`).
    Time,
}

impl Phase {
    /// The step's name, as crash reports print it.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Execute => "execute",
            Self::Locate => "locate",
            Self::Lock => "lock",
            Self::ClaimSlot => "claim-slot",
            Self::Steal => "steal",
            Self::Log => "log",
            Self::LockLog => "lock-log",
            Self::CommitLock => "commit-lock",
            Self::CommitLockAndLog => "commit-lock+log",
            Self::Validate => "validate",
            Self::ValidateAndLog => "validate+log",
            Self::Commit => "commit",
            Self::CommitWithInsert => "commit+insert",
            Self::Release => "release",
            Self::ReleaseLostLocks => "release-lost-locks",
            Self::Unlock => "unlock",
            Self::Truncate => "truncate",
            Self::AbortTruncate => "abort-truncate",
            Self::AbortUnlock => "abort-unlock",
            Self::AbortRelease => "abort-release",
            Self::WriteInvisible => "write-invisible",
            Self::WriteVisible => "write-visible",
            Self::Time => "time",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}
