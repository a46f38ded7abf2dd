//! OOCC's decisions (Alg. 1) as plain synchronous functions: lock words, clock readings and
//! the words a round returned go in, decisions and plans come out. No verbs, no executor,
//! no clock reads (times are passed in), so each step is tested without a fabric; the
//! async shell in [`super`] posts what these functions plan, in the same order.

use core::ops::Range;

use dmem_layout::record::{OoccLockState, OoccLockWord, OoccRecordHeader};
use dmem_txn::AbortReason;
use dmem_verbs::Nanos;

use super::OoccConfig;

/// What a read of a record decides (Alg. 1 line 4, line 13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadDecision {
    /// Free: covered by the implicit lease.
    Leased,
    /// Intention-locked, read-only transaction: read, validate later.
    Validate,
    /// Write-locked (or intention-locked and the transaction writes): abort.
    Abort,
}

/// Alg. 1 lines 4–5 and 13.
#[must_use]
pub fn decide_read(lock: OoccLockWord, read_only: bool) -> ReadDecision {
    match lock.state() {
        Ok(OoccLockState::Free) => ReadDecision::Leased,
        Ok(OoccLockState::Intention) if read_only => ReadDecision::Validate,
        _ => ReadDecision::Abort,
    }
}

/// What an intention CAS's returned word decides (Alg. 1 lines 8–10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CasDecision {
    /// Locked at the expected version.
    Locked,
    /// Free at another version than the CN's hint: retry the CAS with this word.
    Retry(OoccLockWord),
    /// Held by another transaction: abort.
    Abort,
}

/// Alg. 1 lines 9–10, with the version hint dmem's lock word needs (the intention CAS
/// compares the whole free word, version included).
#[must_use]
pub fn decide_cas(expected: OoccLockWord, returned: u64) -> CasDecision {
    let returned = OoccLockWord::from_raw(returned);
    if returned == expected {
        CasDecision::Locked
    } else if returned.state() == Ok(OoccLockState::Free) {
        CasDecision::Retry(returned)
    } else {
        CasDecision::Abort
    }
}

/// Whether a validation READ of a lock word keeps a read (Alg. 1 lines 14–16): same
/// version and not write-locked; a transaction that writes also refuses an intention lock
/// (two writers that each read what the other locks must not both commit).
#[must_use]
pub fn decide_validate(read_version: u64, now: OoccLockWord, read_only: bool) -> bool {
    now.version() == read_version
        && match now.state() {
            Ok(OoccLockState::Free) => true,
            Ok(OoccLockState::Intention) => read_only,
            _ => false,
        }
}

/// A lock word as a validation READ returned it (8 bytes, little endian); anything else
/// reads as all ones, a word no validation accepts.
#[must_use]
pub fn word_of(bytes: &[u8]) -> OoccLockWord {
    OoccLockWord::from_raw(u64::from_le_bytes(bytes.try_into().unwrap_or([0xFF; 8])))
}

/// Whether every read keeps (Alg. 1 lines 14–16): `(version read, lock word now)` pairs.
#[must_use]
pub fn validate_all(
    checks: impl IntoIterator<Item = (u64, OoccLockWord)>,
    read_only: bool,
) -> bool {
    checks
        .into_iter()
        .all(|(version, now)| decide_validate(version, now, read_only))
}

/// The free word an intention CAS compares against (the version hint lives in the CAS's
/// compare value): the version this transaction read, else the CN's hint for the record.
#[must_use]
pub fn expected_word(read_version: Option<u64>, hint: u64) -> OoccLockWord {
    read_version.map_or(
        OoccLockWord::from_raw(hint & OoccLockWord::MAX_VERSION),
        OoccLockWord::from_raw,
    )
}

/// The word coordinator `owner` CASes over `free`: the intention lock (§IV-B), or the write
/// lock at once without the delayed write lock.
#[must_use]
pub fn lock_word_for(free: OoccLockWord, owner: u16, delayed_lock: bool) -> OoccLockWord {
    let intention = free.with_intention_lock(owner);
    if delayed_lock {
        intention
    } else {
        intention.with_write_lock()
    }
}

/// One intention CAS of a lock round, as it came back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CasReply {
    /// The word the CAS compared against.
    pub expected: OoccLockWord,
    /// The word it returned.
    pub returned: u64,
    /// Whether the transaction read the record earlier (at the expected version).
    pub read_before: bool,
}

/// What one lock round decided, per CAS and as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockRound {
    /// Per CAS, in post order.
    pub decisions: Vec<CasDecision>,
    /// The abort the round ends in (the last CAS that called for one names it); every
    /// lock taken in the round must then be released.
    pub failure: Option<AbortReason>,
}

/// Judges a round of intention CASes (Alg. 1 lines 8–10): a CAS that met a free word at
/// another version is retried, unless the transaction read the record (it changed since,
/// so it would fail validation anyway); a CAS that met a lock aborts.
#[must_use]
pub fn judge_lock_round(replies: &[CasReply]) -> LockRound {
    let mut failure = None;
    let decisions = replies
        .iter()
        .map(|r| {
            let d = decide_cas(r.expected, r.returned);
            match d {
                CasDecision::Retry(_) if r.read_before => {
                    failure = Some(AbortReason::RecordChangedSinceRead);
                }
                CasDecision::Abort => failure = Some(AbortReason::RecordLockedByAnother),
                _ => {}
            }
            d
        })
        .collect();
    LockRound { decisions, failure }
}

/// How a read-only transaction commits (Alg. 1 lines 12–16), and the counter it bumps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadOnlyCommit {
    /// Inside `rv` and no intention lock met: committed without a validation round.
    InLease,
    /// The read-validate lease ran out: validate the lock words.
    LeaseExpired,
    /// An intention lock was met: validate the lock words.
    Intention,
}

/// §IV-A: a read-only transaction that met no intention lock and finished within `rv`
/// (`elapsed` since its start on its own clock) needs no validation.
#[must_use]
pub fn read_only_commit(
    cfg: &OoccConfig,
    elapsed: Nanos,
    rv: Nanos,
    intention_seen: bool,
) -> ReadOnlyCommit {
    let in_lease = cfg.implicit_lease && elapsed <= rv;
    if in_lease && !intention_seen {
        ReadOnlyCommit::InLease
    } else if intention_seen {
        ReadOnlyCommit::Intention
    } else {
        ReadOnlyCommit::LeaseExpired
    }
}

/// [`OoccConfig::artifact_rw_rules`]: the read set is validated right after execution if
/// an intention lock was met or `rv` ran out.
#[must_use]
pub fn artifact_validates(intention_seen: bool, elapsed: Nanos, rv: Nanos) -> bool {
    intention_seen || elapsed > rv
}

/// How long to sleep from `now` until `until` (local clock), if at all.
#[must_use]
pub fn wait_for(until: Nanos, now: Nanos) -> Option<Nanos> {
    (until > now).then(|| until - now)
}

/// Whether the writer waits out the write-wait lease before its commit WRITE (§IV-A).
/// Without the implicit lease every read set is validated and nobody relies on a writer's
/// wait: plain OCC commits at once.
#[must_use]
pub fn waits_for_lease(cfg: &OoccConfig) -> bool {
    cfg.implicit_lease && !cfg.bug_skip_lease_wait
}

/// When the upgrade round may start (§IV-B): `upgrade_lead` before the write-wait lease,
/// counted from the intention CAS's completion (`lock_time`), ends; `None` when the
/// writer does not overlap a lease wait with Validate&Logging.
#[must_use]
pub fn upgrade_at(cfg: &OoccConfig, lock_time: Nanos, ww: Nanos) -> Option<Nanos> {
    (cfg.delayed_lock && waits_for_lease(cfg))
        .then(|| (lock_time + ww).saturating_sub(cfg.upgrade_lead_ns))
}

/// When the commit WRITE may land (§IV-A, §VII-B): a write-wait lease after the intention
/// CAS completed; `None` when the writer does not wait.
#[must_use]
pub fn commit_at(cfg: &OoccConfig, lock_time: Nanos, ww: Nanos) -> Option<Nanos> {
    waits_for_lease(cfg).then_some(lock_time + ww)
}

/// Whether the read set's lock words go in the Validate&Logging round (posted at `now`,
/// transaction started at `start`): when the lease will have run out by the time the round
/// returns (about `upgrade_lead` later), or always without the implicit lease; never under
/// the artifact's rules (validated right after execution instead).
#[must_use]
pub fn validate_in_log_round(cfg: &OoccConfig, now: Nanos, start: Nanos, rv: Nanos) -> bool {
    !cfg.artifact_rw_rules
        && (!cfg.implicit_lease || (now + cfg.upgrade_lead_ns).saturating_sub(start) > rv)
}

/// Whether a validation round follows the Validate&Logging round that returned at
/// `upgraded`: the lease ran out while the round was in flight and it carried no
/// validation.
#[must_use]
pub fn validate_after_log_round(
    cfg: &OoccConfig,
    validated: bool,
    upgraded: Nanos,
    start: Nanos,
    rv: Nanos,
    has_reads: bool,
) -> bool {
    !validated && !cfg.artifact_rw_rules && upgraded.saturating_sub(start) > rv && has_reads
}

/// What the commit round WRITEs of one record's new image (§V).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitSlices {
    /// The image bytes WRITTEN at the record's offset + `record.start`.
    pub record: Range<usize>,
    /// Without the one-op write-unlock, the image's lock word, WRITTEN a round later.
    pub unlock: Option<Range<usize>>,
}

/// The commit WRITEs of a record whose new image is `image_len` bytes (`value_len`-byte
/// table): writer + value + version + free lock in one WRITE with the one-op write-unlock
/// (lock last, §V), else the writer and value and the lock word apart. The rest of the
/// header is rewritten only for a delete or an insert (`rewrite_header`); an update leaves
/// it as it is.
#[must_use]
pub fn commit_slices(
    one_op_unlock: bool,
    rewrite_header: bool,
    image_len: usize,
    value_len: usize,
) -> CommitSlices {
    let from = if rewrite_header {
        0
    } else {
        OoccRecordHeader::WRITER_OFFSET
    };
    let lock = OoccRecordHeader::lock_offset(value_len);
    if one_op_unlock {
        CommitSlices {
            record: from..image_len,
            unlock: None,
        }
    } else {
        CommitSlices {
            record: from..lock,
            unlock: Some(lock..image_len),
        }
    }
}

/// Whether a commit rewrites the record header: a delete (`new` is `Some(None)`) or a
/// record that was absent.
#[must_use]
pub fn rewrites_header(new: &Option<Option<Vec<u8>>>, present: bool) -> bool {
    new.as_ref().is_some_and(Option::is_none) || !present
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free(v: u64) -> OoccLockWord {
        OoccLockWord::free(v).unwrap()
    }

    #[test]
    fn reads_take_the_lease_validate_or_abort_by_lock_state() {
        let f = free(7);
        let i = f.with_intention_lock(3);
        let w = i.with_write_lock();
        assert_eq!(decide_read(f, false), ReadDecision::Leased);
        assert_eq!(decide_read(i, true), ReadDecision::Validate);
        assert_eq!(decide_read(i, false), ReadDecision::Abort);
        assert_eq!(decide_read(w, true), ReadDecision::Abort);
        // An undefined word (write bit without intention) is never read.
        assert_eq!(
            decide_read(OoccLockWord::from_raw(1 << 47), true),
            ReadDecision::Abort
        );
    }

    #[test]
    fn validation_needs_the_same_version_and_no_write_lock() {
        let f = free(9);
        assert!(decide_validate(9, f, false));
        assert!(!decide_validate(8, f, true));
        assert!(decide_validate(9, f.with_intention_lock(1), true));
        assert!(!decide_validate(9, f.with_intention_lock(1), false));
        assert!(!decide_validate(
            9,
            f.with_intention_lock(1).with_write_lock(),
            true
        ));
        // A short or missing reply reads as all ones: never valid.
        assert_eq!(word_of(&[1, 2, 3]).to_raw(), u64::MAX);
        assert!(!validate_all([(9, f), (1, word_of(&[]))], true));
        assert!(validate_all([(9, f), (2, free(2))], false));
        assert!(validate_all([], false));
    }

    #[test]
    fn the_cas_expects_the_version_read_else_the_hint() {
        assert_eq!(expected_word(Some(5), 77), free(5));
        // The hint keeps only the version bits.
        assert_eq!(expected_word(None, (1 << 46) | 12), free(12));
        let f = free(4);
        assert_eq!(lock_word_for(f, 6, true), f.with_intention_lock(6));
        assert_eq!(lock_word_for(f, 6, false).state(), Ok(OoccLockState::Write));
    }

    #[test]
    fn a_lock_round_locks_retries_stale_hints_and_aborts_on_locks() {
        let e = free(3);
        let reply = |returned: u64, read_before| CasReply {
            expected: e,
            returned,
            read_before,
        };
        let round = judge_lock_round(&[reply(e.to_raw(), false), reply(free(4).to_raw(), false)]);
        assert_eq!(
            round.decisions,
            vec![CasDecision::Locked, CasDecision::Retry(free(4))]
        );
        assert_eq!(round.failure, None);
        // A record read at another version changed since: abort, do not retry.
        let round = judge_lock_round(&[reply(free(4).to_raw(), true)]);
        assert_eq!(round.failure, Some(AbortReason::RecordChangedSinceRead));
        // Another's intention lock aborts; the last failure names the abort.
        let held = e.with_intention_lock(2).to_raw();
        let round = judge_lock_round(&[
            reply(held, false),
            reply(e.to_raw(), false),
            reply(free(4).to_raw(), true),
        ]);
        assert_eq!(round.decisions[0], CasDecision::Abort);
        assert_eq!(round.decisions[1], CasDecision::Locked);
        assert_eq!(round.failure, Some(AbortReason::RecordChangedSinceRead));
        let round = judge_lock_round(&[reply(free(4).to_raw(), true), reply(held, false)]);
        assert_eq!(round.failure, Some(AbortReason::RecordLockedByAnother));
    }

    #[test]
    fn a_read_only_commit_skips_validation_only_inside_rv_without_intention() {
        let cfg = OoccConfig::default();
        use ReadOnlyCommit::*;
        assert_eq!(read_only_commit(&cfg, 99_000, 99_000, false), InLease);
        assert_eq!(read_only_commit(&cfg, 99_001, 99_000, false), LeaseExpired);
        assert_eq!(read_only_commit(&cfg, 10, 99_000, true), Intention);
        assert_eq!(read_only_commit(&cfg, 99_001, 99_000, true), Intention);
        let plain = OoccConfig {
            implicit_lease: false,
            ..cfg
        };
        assert_eq!(read_only_commit(&plain, 0, 99_000, false), LeaseExpired);
        assert!(!artifact_validates(false, 99_000, 99_000));
        assert!(artifact_validates(false, 99_001, 99_000));
        assert!(artifact_validates(true, 0, 99_000));
    }

    #[test]
    fn the_writer_upgrades_a_lead_before_the_lease_ends_and_commits_after_it() {
        let cfg = OoccConfig::default();
        // Intention CAS completed at 1 000, ww = 101 000, lead 3 000.
        assert_eq!(upgrade_at(&cfg, 1_000, 101_000), Some(99_000));
        assert_eq!(commit_at(&cfg, 1_000, 101_000), Some(102_000));
        assert_eq!(wait_for(99_000, 50_000), Some(49_000));
        assert_eq!(wait_for(99_000, 99_000), None);
        assert_eq!(wait_for(99_000, 120_000), None);
        // Without the delayed lock nothing overlaps the wait, but the commit still waits.
        let eager = OoccConfig {
            delayed_lock: false,
            ..cfg
        };
        assert_eq!(upgrade_at(&eager, 1_000, 101_000), None);
        assert_eq!(commit_at(&eager, 1_000, 101_000), Some(102_000));
        // The planted bug and plain OCC never wait.
        for cfg in [
            OoccConfig {
                bug_skip_lease_wait: true,
                ..cfg
            },
            OoccConfig {
                implicit_lease: false,
                ..cfg
            },
        ] {
            assert_eq!(upgrade_at(&cfg, 1_000, 101_000), None);
            assert_eq!(commit_at(&cfg, 1_000, 101_000), None);
        }
        // A lease shorter than the lead upgrades at once.
        assert_eq!(upgrade_at(&cfg, 0, 2_000), Some(0));
    }

    #[test]
    fn the_read_set_is_validated_with_the_log_only_when_the_lease_runs_out() {
        let cfg = OoccConfig::default();
        let rv = 99_000;
        // Posted at 90 000 + lead 3 000 since a start at 0: inside the lease.
        assert!(!validate_in_log_round(&cfg, 90_000, 0, rv));
        assert!(validate_in_log_round(&cfg, 96_001, 0, rv));
        assert!(!validate_in_log_round(&cfg, 96_001, 1, rv));
        let plain = OoccConfig {
            implicit_lease: false,
            ..cfg
        };
        assert!(validate_in_log_round(&plain, 0, 0, rv));
        let artifact = OoccConfig {
            artifact_rw_rules: true,
            ..plain
        };
        assert!(!validate_in_log_round(&artifact, 200_000, 0, rv));
        // The round came back past rv without validating: a validation round follows.
        assert!(validate_after_log_round(&cfg, false, 99_001, 0, rv, true));
        assert!(!validate_after_log_round(&cfg, true, 99_001, 0, rv, true));
        assert!(!validate_after_log_round(&cfg, false, 99_000, 0, rv, true));
        assert!(!validate_after_log_round(&cfg, false, 99_001, 0, rv, false));
        assert!(!validate_after_log_round(
            &artifact, false, 99_001, 0, rv, true
        ));
    }

    #[test]
    fn the_commit_write_carries_the_lock_with_the_one_op_unlock() {
        let vlen = 40;
        let len = OoccRecordHeader::record_len(vlen);
        let lock = OoccRecordHeader::lock_offset(vlen);
        let h = OoccRecordHeader::WRITER_OFFSET;
        assert_eq!(
            commit_slices(true, false, len, vlen),
            CommitSlices {
                record: h..len,
                unlock: None
            }
        );
        assert_eq!(commit_slices(true, true, len, vlen).record, 0..len);
        assert_eq!(
            commit_slices(false, false, len, vlen),
            CommitSlices {
                record: h..lock,
                unlock: Some(lock..len)
            }
        );
        assert_eq!(lock + 8, len);
        assert!(rewrites_header(&Some(None), true));
        assert!(rewrites_header(&Some(Some(vec![1])), false));
        assert!(!rewrites_header(&Some(Some(vec![1])), true));
        assert!(!rewrites_header(&None, true));
    }
}
