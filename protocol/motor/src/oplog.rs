//! Motor's operation log: what each coordinator has locked and, once it commits, what it
//! installs — kept where a CN crash does not lose it.
//!
//! Motor relies on UPS-backed DRAM for fault tolerance (LOTUS §5.2 "ACID Guarantees", §6
//! and §8.3 say so of Motor: it needs "specialized hardware (e.g., UPS-backed DRAM)"); its
//! public code keeps, per coordinator, a table of locked keys (MN, offset, transaction id)
//! in CN memory from which a surviving thread releases a crashed coordinator's locks. dmem models that
//! memory as an [`OpLogs`] owned by the deployment: a coordinator writes its entry with CPU
//! stores (no verb, no virtual-time cost, like a DRAM write), and the entry survives the
//! simulated crash of its CN, as battery-backed DRAM would.
//!
//! Motor's code only releases locks. dmem also logs the commit's installs (the images and
//! cells a commit WRITEs, known once the commit timestamp is taken and validation passed),
//! so that a CN crash in the middle of a commit's post lists — some records installed, some
//! not — is finished by recovery instead of leaving a partial transaction visible (see
//! [`crate::recovery`]). Old versions stay in the CVT, so no undo image is needed (the
//! multi-version store is its own undo log, LOTUS §5.2 "ACID Guarantees").

use std::cell::RefCell;
use std::collections::HashMap;

use dmem_txn::TableId;

/// A record whose lock (on its primary) a coordinator holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockedRecord {
    /// Its table.
    pub table: TableId,
    /// Its partition (the primary and backups follow from it).
    pub partition: u16,
    /// Offset of its block, the same on every replica.
    pub block: u64,
}

/// What a commit installs in one record: the same bytes on every replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Install {
    /// The record (locked by the committing coordinator).
    pub record: LockedRecord,
    /// The commit timestamp the new cell carries.
    pub version: u64,
    /// Offsets in the block and bytes of the new image (full records), or of the full value
    /// and the delta (Motor's layout): [`crate::mvcc::install_images`].
    pub images: Vec<(u64, Vec<u8>)>,
    /// Offset in the block and bytes of the new cell.
    pub cell: (u64, Vec<u8>),
    /// Offset and bytes of the floor and whole CVT, when the commit evicted or collected
    /// cells (written instead of the cell alone).
    pub whole: Option<(u64, Vec<u8>)>,
}

/// One coordinator's log entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum OpLog {
    /// No transaction holds anything.
    #[default]
    Idle,
    /// Transaction `seq` is executing and holds `locked`.
    Locking {
        /// Its sequence number.
        seq: u64,
        /// The locks it holds.
        locked: Vec<LockedRecord>,
    },
    /// Transaction `seq` decided to commit (timestamp taken, validation passed): it holds
    /// `locked` and installs `installs` (a subset of `locked`).
    Committing {
        /// Its sequence number.
        seq: u64,
        /// The locks it holds.
        locked: Vec<LockedRecord>,
        /// What it installs.
        installs: Vec<Install>,
    },
}

/// The op logs of every coordinator of a deployment, by coordinator id.
#[derive(Debug, Default)]
pub struct OpLogs(RefCell<HashMap<u16, OpLog>>);

impl OpLogs {
    /// Empty logs.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Coordinator `id` begins transaction `seq`, holding nothing.
    pub fn begin(&self, id: u16, seq: u64) {
        self.0.borrow_mut().insert(
            id,
            OpLog::Locking {
                seq,
                locked: Vec::new(),
            },
        );
    }

    /// Coordinator `id` now holds `record`'s lock.
    pub fn locked(&self, id: u16, record: LockedRecord) {
        if let Some(OpLog::Locking { locked, .. }) = self.0.borrow_mut().get_mut(&id)
            && !locked.contains(&record)
        {
            locked.push(record);
        }
    }

    /// Coordinator `id` commits with `installs`.
    pub fn committing(&self, id: u16, installs: Vec<Install>) {
        let mut logs = self.0.borrow_mut();
        if let Some(OpLog::Locking { seq, locked }) = logs.get(&id).cloned() {
            logs.insert(
                id,
                OpLog::Committing {
                    seq,
                    locked,
                    installs,
                },
            );
        }
    }

    /// Coordinator `id` released everything (its transaction finished).
    pub fn finished(&self, id: u16) {
        self.0.borrow_mut().insert(id, OpLog::Idle);
    }

    /// Coordinator `id`'s entry.
    #[must_use]
    pub fn get(&self, id: u16) -> OpLog {
        self.0.borrow().get(&id).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(block: u64) -> LockedRecord {
        LockedRecord {
            table: TableId(1),
            partition: 0,
            block,
        }
    }

    #[test]
    fn a_transaction_moves_from_locking_to_committing_to_idle() {
        let logs = OpLogs::new();
        assert_eq!(logs.get(3), OpLog::Idle);
        logs.begin(3, 7);
        logs.locked(3, rec(64));
        logs.locked(3, rec(64));
        logs.locked(3, rec(128));
        assert_eq!(
            logs.get(3),
            OpLog::Locking {
                seq: 7,
                locked: vec![rec(64), rec(128)]
            }
        );
        let install = Install {
            record: rec(64),
            version: 99,
            images: vec![(256, vec![1; 8])],
            cell: (48, vec![2; 32]),
            whole: None,
        };
        logs.committing(3, vec![install.clone()]);
        let OpLog::Committing {
            seq,
            locked,
            installs,
        } = logs.get(3)
        else {
            panic!("not committing: {:?}", logs.get(3));
        };
        assert_eq!((seq, locked.len(), installs), (7, 2, vec![install]));
        logs.finished(3);
        assert_eq!(logs.get(3), OpLog::Idle);
        // Another coordinator's entry is its own.
        assert_eq!(logs.get(4), OpLog::Idle);
    }

    #[test]
    fn a_lock_taken_after_committing_is_not_logged_as_locking() {
        let logs = OpLogs::new();
        logs.begin(1, 1);
        logs.committing(1, Vec::new());
        logs.locked(1, rec(64));
        assert!(matches!(logs.get(1), OpLog::Committing { locked, .. } if locked.is_empty()));
    }
}
