//! Protocol selection: FORD (fixed or with any of its six bugs) or Pandora.

use core::fmt;
use core::str::FromStr;

/// Which protocol a coordinator runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// FORD (Pandora §2.3): locks without stealing, undo logs on every replica of each
    /// written object. With no bug switched on, the C1/C2 fixes of Pandora §5.1 are applied
    /// (only acquired locks released, locks checked in validation, validation after all
    /// locks, inserts logged, logging phase after validation). Its recovery is Pandora's
    /// "Baseline" (§4.1): log recovery plus a scan of the whole store for stray locks.
    Ford,
    /// Pandora (§3): FORD's C1 with PILL lock stealing (§3.1.2), one log per coordinator on
    /// f + 1 MNs written in a logging phase after validation (§3.1.4), and the RDMA
    /// recovery protocol (§3.2).
    Pandora,
}

/// One of the six bugs Pandora's litmus tests found in FORD (Table 1, §5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FordBug {
    /// *Complicit abort* (Litmus 1, C1): "FORD releases every lock in its write-set when it
    /// decides to abort. Thus, it also releases some locks that were never actually acquired
    /// by the transaction during execution", including a lock another transaction holds.
    /// Fix: unlock only the locks acquired during execution.
    ComplicitAbort,
    /// *Missing actions / missing insert logs* (Litmus 1, C2, Baseline only): "logging is
    /// omitted for inserts", so recovery cannot undo a half-applied insert. Fix: add inserts
    /// to the undo logs.
    MissingInsertLog,
    /// *Covert locks* (Litmus 2, C1): "In its validation phase, FORD does not check if the
    /// read objects are locked", only their versions. Fix: read lock and version together
    /// and abort if the object is locked.
    CovertLocks,
    /// *Relaxed locks* (Litmus 2, C1): "validation starts before ensuring all locks have been
    /// grabbed", so execution (locking of deferred write-set objects) overlaps validation.
    /// Here: the commit-time lock CASes of blind writes are posted in the same doorbell
    /// batch as the validation READs. Fix: validate strictly after locking.
    RelaxedLocks,
    /// *Lost decision* (Litmus 3, C2): "FORD writes logs for transactions that may later
    /// abort", so recovery cannot tell an aborted logged transaction from one that updated
    /// its objects. Here: the undo logs are written in the same batch as the validation
    /// READs (FORD's background logging, Fig. 2) and an abort does not truncate them. Fix:
    /// a logging phase executed only if validation succeeds (§3.1.4), and an abort that
    /// truncates the log (§3.1.5).
    LostDecision,
    /// *Logging without locking* (Litmus 3, C2): "a corner case in FORD where a log is
    /// written before the lock is actually grabbed". Here: the undo record of a write-set
    /// object is posted together with (blind writes: in the same batch as) its lock CAS,
    /// before the CAS result is known, so a failed CAS leaves a log for a lock never held.
    /// Fix: the logging phase after validation (lock-to-log order).
    LogWithoutLock,
}

impl FordBug {
    /// All six bugs, in Table 1 order.
    pub const ALL: [FordBug; 6] = [
        FordBug::ComplicitAbort,
        FordBug::MissingInsertLog,
        FordBug::CovertLocks,
        FordBug::RelaxedLocks,
        FordBug::LostDecision,
        FordBug::LogWithoutLock,
    ];

    /// The switch name (`complicit-abort`, ...).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            FordBug::ComplicitAbort => "complicit-abort",
            FordBug::MissingInsertLog => "missing-insert-log",
            FordBug::CovertLocks => "covert-locks",
            FordBug::RelaxedLocks => "relaxed-locks",
            FordBug::LostDecision => "lost-decision",
            FordBug::LogWithoutLock => "log-without-lock",
        }
    }

    const fn bit(self) -> u8 {
        1 << self as u8
    }
}

impl fmt::Display for FordBug {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A bug name that is not one of the six.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown FORD bug `{0}` (expected complicit-abort, missing-insert-log, covert-locks, relaxed-locks, lost-decision or log-without-lock)"
)]
pub struct UnknownBug(pub String);

impl FromStr for FordBug {
    type Err = UnknownBug;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FordBug::ALL
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| UnknownBug(s.to_owned()))
    }
}

/// A set of [`FordBug`] switches; empty = fixed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct BugSet(u8);

impl BugSet {
    /// No bug: the fixed protocol.
    pub const NONE: BugSet = BugSet(0);

    /// The set with `bug` added.
    #[must_use]
    pub const fn with(self, bug: FordBug) -> Self {
        Self(self.0 | bug.bit())
    }

    /// Whether `bug` is switched on.
    #[must_use]
    pub const fn has(self, bug: FordBug) -> bool {
        self.0 & bug.bit() != 0
    }

    /// Every bug (FORD as published, per Pandora Table 1).
    #[must_use]
    pub fn all() -> Self {
        FordBug::ALL.into_iter().fold(Self::NONE, Self::with)
    }

    /// Whether no bug is on.
    #[must_use]
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Parses a comma-separated list of switch names (`""` = none, `all` = all six).
    ///
    /// # Errors
    /// [`UnknownBug`] for a name that is not a switch.
    pub fn parse(list: &str) -> Result<Self, UnknownBug> {
        let mut set = Self::NONE;
        for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if name == "all" {
                set = Self::all();
            } else {
                set = set.with(name.parse()?);
            }
        }
        Ok(set)
    }
}

/// What a coordinator runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProtocolConfig {
    /// FORD or Pandora.
    pub protocol: Protocol,
    /// FORD's bugs to reproduce.
    pub bugs: BugSet,
    /// The traditional "log before lock" scheme Pandora §6.1 and §6.2.1 contrast PILL with:
    /// before every lock CAS the coordinator WRITEs the lock's address to its log on its
    /// f + 1 log MNs and waits for the WRITE (one extra round trip per lock, or per batch of
    /// commit-time locks), and recovery releases the logged locks instead of scanning the
    /// store. Lock stealing (PILL) is off.
    pub lock_logging: bool,
    /// FORD's commit verbs as its public code posts them (`minghust/ford`, default flags;
    /// the facts are in the crate README, "Artifact's verbs"), where dmem's FORD posts
    /// fewer: an 8-byte lock-word WRITE ahead of each replica's item WRITE (the artifact's
    /// "invisible" word), one READ of each backup after the last record's WRITEs (its
    /// selective flush), and the release of the lock word on every backup as well as the
    /// primary. Not a bug: only more verbs (the lock words keep the values dmem's FORD gives
    /// them: dmem has no invisible bit). Registered as `ford:artifact`.
    pub artifact: bool,
}

impl ProtocolConfig {
    /// FORD with every fix applied.
    #[must_use]
    pub const fn ford_fixed() -> Self {
        Self {
            protocol: Protocol::Ford,
            bugs: BugSet::NONE,
            lock_logging: false,
            artifact: false,
        }
    }

    /// FORD with the given bugs.
    #[must_use]
    pub const fn ford_with(bugs: BugSet) -> Self {
        Self {
            protocol: Protocol::Ford,
            bugs,
            lock_logging: false,
            artifact: false,
        }
    }

    /// Pandora.
    #[must_use]
    pub const fn pandora() -> Self {
        Self {
            protocol: Protocol::Pandora,
            bugs: BugSet::NONE,
            lock_logging: false,
            artifact: false,
        }
    }

    /// Pandora's logging phase and recovery with traditional lock logging in place of PILL
    /// (Pandora §6.1 "Traditional Logging Scheme", §6.2.1): every lock acquisition is
    /// logged to the coordinator's f + 1 log MNs before its CAS; no lock stealing; recovery
    /// releases the logged locks of a failed coordinator after its log recovery.
    #[must_use]
    pub const fn pandora_lock_logging() -> Self {
        Self {
            protocol: Protocol::Pandora,
            bugs: BugSet::NONE,
            lock_logging: true,
            artifact: false,
        }
    }

    /// The same protocol posting FORD's public code's commit verbs ([`Self::artifact`]).
    #[must_use]
    pub const fn with_artifact_verbs(mut self) -> Self {
        self.artifact = true;
        self
    }

    /// Whether `bug` is on.
    #[must_use]
    pub const fn bug(&self, bug: FordBug) -> bool {
        self.bugs.has(bug)
    }

    /// Whether lock stealing and stray-lock-ignoring reads apply (PILL, Pandora §3.1.2).
    #[must_use]
    pub const fn pill(&self) -> bool {
        matches!(self.protocol, Protocol::Pandora) && !self.lock_logging
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sets_parse() {
        for bug in FordBug::ALL {
            assert_eq!(bug.name().parse::<FordBug>().unwrap(), bug);
        }
        let set = BugSet::parse("covert-locks, lost-decision").unwrap();
        assert!(set.has(FordBug::CovertLocks) && set.has(FordBug::LostDecision));
        assert!(!set.has(FordBug::ComplicitAbort));
        assert_eq!(BugSet::parse("all").unwrap(), BugSet::all());
        assert!(BugSet::parse("").unwrap().is_empty());
        assert!(BugSet::parse("torn-reads").is_err());
    }
}
