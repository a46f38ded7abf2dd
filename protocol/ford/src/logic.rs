//! The protocol's decisions as plain functions over the bytes the verbs returned, so that a
//! test can drive every step without a fabric.

use dmem_layout::log::{LogOp, LogRecord, LogRegion};
use dmem_layout::pill::{CoordinatorId as PillId, FailedCoordinatorSet, LockHolder, PillLockWord};
use dmem_layout::record::{DataVersion, RemoteAddr as PackedAddr};

use crate::config::{FordBug, ProtocolConfig};

/// What a lock word means to a coordinator (Pandora §3.1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockView {
    /// Unlocked.
    Free,
    /// Held by a live coordinator (or, without PILL, by anyone): a reader aborts, a writer
    /// fails to lock.
    Held,
    /// Held by a failed coordinator and PILL is on: a reader ignores it, a writer steals it.
    Stray(u16),
}

/// Interprets a lock word. A word that is not a valid PILL word counts as held.
#[must_use]
pub fn lock_view(word: u64, failed: &FailedCoordinatorSet, cfg: &ProtocolConfig) -> LockView {
    match PillLockWord::from_raw(word).holder(failed) {
        Ok(LockHolder::Free) => LockView::Free,
        Ok(LockHolder::Stray(owner)) if cfg.pill() => LockView::Stray(owner.0),
        Ok(_) | Err(_) => LockView::Held,
    }
}

/// The lock word of coordinator `me`.
#[must_use]
pub const fn my_lock(me: u16) -> u64 {
    PillLockWord::locked_by(PillId(me)).raw()
}

/// Whether a read in execution may use an item whose lock word is `word` (FORD's execution
/// aborts on a locked object; PILL ignores stray locks).
#[must_use]
pub fn read_may_proceed(word: u64, failed: &FailedCoordinatorSet, cfg: &ProtocolConfig) -> bool {
    !matches!(lock_view(word, failed, cfg), LockView::Held)
}

/// Validation of one read-set item (Pandora §2.3 step 2, §5.1 "Covert locks"): the version
/// must be unchanged and, unless the covert-locks bug is on, the item must not be locked by
/// a live coordinator.
#[must_use]
pub fn validate_item(
    expected_version: u64,
    lock_word: u64,
    version: u64,
    failed: &FailedCoordinatorSet,
    cfg: &ProtocolConfig,
) -> bool {
    if version != expected_version {
        return false;
    }
    cfg.bug(FordBug::CovertLocks) || read_may_proceed(lock_word, failed, cfg)
}

/// What a failed acquire CAS tells the coordinator to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterCas {
    /// The lock is ours.
    Acquired,
    /// Steal it with a CAS from `observed` (PILL).
    Steal {
        /// The stray word to compare against.
        observed: u64,
    },
    /// Someone live holds it: abort.
    Conflict,
}

/// Decides after the lock CAS returned `old`.
#[must_use]
pub fn after_cas(old: u64, failed: &FailedCoordinatorSet, cfg: &ProtocolConfig) -> AfterCas {
    match lock_view(old, failed, cfg) {
        LockView::Free => AfterCas::Acquired,
        LockView::Stray(_) => AfterCas::Steal { observed: old },
        LockView::Held => AfterCas::Conflict,
    }
}

/// One undo record of a logged stray transaction, as recovery sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedWrite {
    /// Insert, update or delete.
    pub op: LogOp,
    /// Table id.
    pub table: u32,
    /// Key.
    pub key: u64,
    /// Partition of the record.
    pub partition: u16,
    /// Item offset on every replica.
    pub offset: u64,
    /// Raw version word before the transaction.
    pub old_version: u64,
    /// Value before the transaction.
    pub old_value: Vec<u8>,
}

/// The log of one transaction, merged from its copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedTxn {
    /// Coordinator that wrote it.
    pub coordinator: u16,
    /// Its transaction sequence number.
    pub txn: u64,
    /// Its undo records, one per object.
    pub writes: Vec<LoggedWrite>,
}

/// Parses one log copy; `None` if it is not a complete, valid log (zeroed, torn, truncated,
/// or of another coordinator).
#[must_use]
pub fn parse_log_copy(bytes: &[u8], coordinator: u16) -> Option<LoggedTxn> {
    let region = LogRegion::new_checked(bytes).ok()?;
    if !region.is_valid() || region.header().coordinator_id() != coordinator {
        return None;
    }
    let mut writes = Vec::new();
    for record in region.records() {
        if let LogRecord::Undo(undo) = record {
            let e = undo.header.entry();
            writes.push(LoggedWrite {
                op: e.op,
                table: e.table_id,
                key: e.key,
                partition: e.addr.node(),
                offset: e.addr.offset(),
                old_version: e.version,
                old_value: undo.old_value.to_vec(),
            });
        }
    }
    Some(LoggedTxn {
        coordinator,
        txn: region.header().txn_id(),
        writes,
    })
}

/// Merges the log copies of one coordinator into the transaction recovery must decide.
///
/// Pandora writes one identical log to f + 1 MNs, so any complete copy is the log. FORD
/// writes per-object logs to each object's replicas, so the log is the union of the copies
/// of the *latest* transaction; older copies belong to transactions that finished (a
/// coordinator runs one transaction at a time) and need nothing.
#[must_use]
pub fn merge_log_copies(copies: Vec<LoggedTxn>) -> Option<LoggedTxn> {
    let latest = copies.iter().map(|c| c.txn).max()?;
    let mut merged: Option<LoggedTxn> = None;
    for copy in copies.into_iter().filter(|c| c.txn == latest) {
        match &mut merged {
            None => merged = Some(copy),
            Some(m) => {
                for w in copy.writes {
                    if !m
                        .writes
                        .iter()
                        .any(|x| x.table == w.table && x.key == w.key)
                    {
                        m.writes.push(w);
                    }
                }
            }
        }
    }
    merged
}

/// Recovery's decision for one logged stray transaction (Pandora §3.2.2 step 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Every replica of every write is updated: a commit-ack may have been sent, an
    /// abort-ack cannot have been. Keep the writes, unlock.
    RollForward,
    /// Some replica is not updated: no commit-ack was sent. Restore the updated replicas
    /// from the undo log, unlock.
    RollBack,
}

/// Decides from the version word observed on each live replica of each logged write
/// (`observed[i]` lists the versions of `txn.writes[i]`): a replica is updated iff its
/// version differs from the logged old version.
#[must_use]
pub fn decide(txn: &LoggedTxn, observed: &[Vec<u64>]) -> Decision {
    let all_updated = txn
        .writes
        .iter()
        .zip(observed)
        .all(|(w, versions)| versions.iter().all(|&v| v != w.old_version));
    if all_updated && observed.len() == txn.writes.len() {
        Decision::RollForward
    } else {
        Decision::RollBack
    }
}

/// The flags an undo restores: an insert is undone to an absent (invalid) item, an update
/// or delete to a valid one.
#[must_use]
pub fn undo_flags(op: LogOp) -> dmem_layout::record::ItemFlags {
    match op {
        LogOp::Insert => dmem_layout::record::ItemFlags::EMPTY,
        LogOp::Update | LogOp::Delete => dmem_layout::record::ItemFlags::LOADED,
    }
}

/// Packs a record location into the log's address field (node = partition).
#[must_use]
pub fn pack_location(partition: u16, offset: u64) -> PackedAddr {
    PackedAddr::new(partition, offset).unwrap_or(PackedAddr::NULL)
}

/// The version a commit installs over `old`: counter + 1, visible.
#[must_use]
pub fn next_version(old: DataVersion) -> DataVersion {
    old.bumped().with_invisible(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BugSet;

    fn failed_with(id: u16) -> FailedCoordinatorSet {
        let mut f = FailedCoordinatorSet::EMPTY;
        f.insert(PillId(id));
        f
    }

    #[test]
    fn pill_steals_stray_and_ford_does_not() {
        let failed = failed_with(9);
        let stray = my_lock(9);
        let live = my_lock(4);
        let pandora = ProtocolConfig::pandora();
        let ford = ProtocolConfig::ford_fixed();
        assert_eq!(after_cas(0, &failed, &pandora), AfterCas::Acquired);
        assert_eq!(
            after_cas(stray, &failed, &pandora),
            AfterCas::Steal { observed: stray }
        );
        assert_eq!(after_cas(live, &failed, &pandora), AfterCas::Conflict);
        assert_eq!(after_cas(stray, &failed, &ford), AfterCas::Conflict);
        assert!(read_may_proceed(stray, &failed, &pandora));
        assert!(!read_may_proceed(stray, &failed, &ford));
        assert!(
            !read_may_proceed(1, &failed, &pandora),
            "undefined word = held"
        );
    }

    #[test]
    fn validation_checks_locks_unless_covert() {
        let none = FailedCoordinatorSet::EMPTY;
        let fixed = ProtocolConfig::ford_fixed();
        let covert = ProtocolConfig::ford_with(BugSet::NONE.with(FordBug::CovertLocks));
        assert!(validate_item(3, 0, 3, &none, &fixed));
        assert!(!validate_item(3, 0, 4, &none, &fixed));
        assert!(!validate_item(3, my_lock(1), 3, &none, &fixed));
        assert!(validate_item(3, my_lock(1), 3, &none, &covert));
        assert!(!validate_item(3, my_lock(1), 4, &none, &covert));
    }

    #[test]
    fn decision_needs_every_replica_of_every_write() {
        let w = |old| LoggedWrite {
            op: LogOp::Update,
            table: 1,
            key: 1,
            partition: 0,
            offset: 64,
            old_version: old,
            old_value: vec![],
        };
        let txn = LoggedTxn {
            coordinator: 1,
            txn: 1,
            writes: vec![w(3), w(5)],
        };
        assert_eq!(
            decide(&txn, &[vec![4, 4, 4], vec![6, 6, 6]]),
            Decision::RollForward
        );
        assert_eq!(
            decide(&txn, &[vec![4, 4, 4], vec![6, 5, 6]]),
            Decision::RollBack
        );
        assert_eq!(decide(&txn, &[vec![3, 3], vec![5]]), Decision::RollBack);
        assert_eq!(decide(&txn, &[vec![4]]), Decision::RollBack);
    }

    #[test]
    fn merge_keeps_only_the_latest_transaction() {
        let w = |key| LoggedWrite {
            op: LogOp::Update,
            table: 1,
            key,
            partition: 0,
            offset: 64 * key,
            old_version: 0,
            old_value: vec![],
        };
        let t = |txn, keys: &[u64]| LoggedTxn {
            coordinator: 2,
            txn,
            writes: keys.iter().map(|&k| w(k)).collect(),
        };
        let merged = merge_log_copies(vec![t(4, &[1, 2]), t(5, &[2, 3]), t(5, &[3, 7])]).unwrap();
        assert_eq!(merged.txn, 5);
        let keys: Vec<u64> = merged.writes.iter().map(|w| w.key).collect();
        assert_eq!(keys, vec![2, 3, 7]);
        assert!(merge_log_copies(vec![]).is_none());
    }
}
