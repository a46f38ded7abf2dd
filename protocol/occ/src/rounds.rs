//! A read round of the two lock-based baselines (DrTM, DSLR 2PL), decided alike: which
//! records it must lock and in which mode, and what it returns once they are held. Plain
//! functions of the round and of what the transaction already holds; the protocols' shells
//! acquire what [`lock_targets`] lists and answer with [`answers`].

use dmem_txn::{AbortReason, Access, Key, ReadReq, RoundValues, TableId, TxnError, TxnKind};

/// A record a round must lock: `exclusive` for a write lock, else a shared one (DrTM: a
/// read lease).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LockTarget {
    pub(crate) table: TableId,
    pub(crate) key: Key,
    pub(crate) exclusive: bool,
}

/// What a round of a `kind` transaction must lock: each record it does not hold yet, once,
/// exclusively if any of its requests is for update (a read-only transaction locks nothing
/// exclusively). `held(table, key)` is `Some(exclusive)` for a record already held.
///
/// # Errors
/// `upgrade` when a record held shared is asked for update: neither protocol upgrades a
/// held lock (DrTM cannot turn a lease into a write lock; DSLR's queue has no upgrade).
pub(crate) fn lock_targets(
    reqs: &[ReadReq],
    kind: TxnKind,
    held: impl Fn(TableId, Key) -> Option<bool>,
    upgrade: AbortReason,
) -> Result<Vec<LockTarget>, TxnError> {
    let mut targets: Vec<LockTarget> = Vec::new();
    for r in reqs {
        let exclusive = r.access == Access::ForUpdate && kind == TxnKind::ReadWrite;
        match held(r.table, r.key) {
            Some(held_exclusive) if held_exclusive || !exclusive => {}
            Some(_) => return Err(TxnError::Aborted(upgrade)),
            None => match targets
                .iter_mut()
                .find(|t| t.table == r.table && t.key == r.key)
            {
                Some(t) => t.exclusive |= exclusive,
                None => targets.push(LockTarget {
                    table: r.table,
                    key: r.key,
                    exclusive,
                }),
            },
        }
    }
    Ok(targets)
}

/// A held record as a round answers from it.
pub(crate) struct HeldValue<'a> {
    /// Whether the record existed when locked.
    pub(crate) present: bool,
    /// Its value when locked.
    pub(crate) value: &'a [u8],
    /// What this transaction staged: `Some(None)` a delete, `Some(Some(v))` a new value.
    pub(crate) staged: &'a Option<Option<Vec<u8>>>,
}

/// The round's answers, one per request in order: the transaction's own staged write if
/// any, else the value read when the record was locked (`None` if absent).
///
/// # Errors
/// `missing` if a request's record is not held (the shell acquires every target first).
pub(crate) fn answers<'a>(
    reqs: &[ReadReq],
    held: impl Fn(TableId, Key) -> Option<HeldValue<'a>>,
    missing: AbortReason,
) -> Result<RoundValues, TxnError> {
    reqs.iter()
        .map(|r| {
            let h = held(r.table, r.key).ok_or(TxnError::Aborted(missing))?;
            Ok(match h.staged {
                Some(staged) => staged.clone(),
                None => h.present.then(|| h.value.to_vec()),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: TableId = TableId(1);

    fn read(key: u64) -> ReadReq {
        ReadReq::read(T, Key(key))
    }

    fn for_update(key: u64) -> ReadReq {
        ReadReq::for_update(T, Key(key))
    }

    const UPGRADE: AbortReason = AbortReason::LockUpgradeSharedToExclusive;

    #[test]
    fn each_record_is_locked_once_in_the_strongest_mode_asked() {
        let reqs = [read(1), for_update(2), for_update(1), read(2)];
        let targets = lock_targets(&reqs, TxnKind::ReadWrite, |_, _| None, UPGRADE).unwrap();
        let modes: Vec<_> = targets.iter().map(|t| (t.key.0, t.exclusive)).collect();
        assert_eq!(modes, [(1, true), (2, true)]);
    }

    #[test]
    fn a_read_only_transaction_locks_nothing_exclusively() {
        let targets =
            lock_targets(&[for_update(3)], TxnKind::ReadOnly, |_, _| None, UPGRADE).unwrap();
        assert!(!targets[0].exclusive);
    }

    #[test]
    fn held_records_are_not_locked_again_and_a_shared_one_is_not_upgraded() {
        let held = |_, k: Key| match k.0 {
            1 => Some(true),
            2 => Some(false),
            _ => None,
        };
        let targets = lock_targets(
            &[for_update(1), read(2), read(4)],
            TxnKind::ReadWrite,
            held,
            UPGRADE,
        )
        .unwrap();
        assert_eq!(targets.len(), 1);
        assert_eq!(targets[0].key, Key(4));
        assert_eq!(
            lock_targets(&[for_update(2)], TxnKind::ReadWrite, held, UPGRADE),
            Err(TxnError::Aborted(UPGRADE))
        );
    }

    #[test]
    fn answers_prefer_the_staged_write_and_refuse_an_unheld_record() {
        let new = Some(Some(b"new".to_vec()));
        let deleted = Some(None);
        let none = None;
        let held = |_, k: Key| match k.0 {
            1 => Some(HeldValue {
                present: true,
                value: b"old",
                staged: &new,
            }),
            2 => Some(HeldValue {
                present: true,
                value: b"old",
                staged: &deleted,
            }),
            3 => Some(HeldValue {
                present: false,
                value: b"",
                staged: &none,
            }),
            4 => Some(HeldValue {
                present: true,
                value: b"old",
                staged: &none,
            }),
            _ => None,
        };
        let got = answers(&[read(1), read(2), read(3), read(4)], held, UPGRADE).unwrap();
        assert_eq!(
            got,
            [Some(b"new".to_vec()), None, None, Some(b"old".to_vec())]
        );
        let missing = AbortReason::RecordNotLocked;
        assert_eq!(
            answers(&[read(5)], held, missing),
            Err(TxnError::Aborted(missing))
        );
    }
}
