//! DrTM's decisions (OOCC §II-A baseline; DrTM §4.3) as plain synchronous functions: lease
//! words and clock readings in, the next step out. No verbs, no clock reads (times are
//! passed in); the async shell in [`super`] posts what they decide, in the same order.

use dmem_txn::AbortReason;
use dmem_verbs::Nanos;

use super::DrtmConfig;

bitflags::bitflags! {
    /// The lock bits of a lock word in the OOCC record format (bits 46 and 47, between the
    /// 46-bit version or lease end and the 16-bit owner; see
    /// [`OoccLockWord`](dmem_layout::record::OoccLockWord)). DrTM sets both when it
    /// write-locks, so that OOCC's recovery, which releases intention and write locks
    /// alike, releases DrTM's locks too.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct LockBits: u64 {
        /// OOCC's intention lock (`I`).
        const INTENTION = 1 << 46;
        /// OOCC's write lock (`W`).
        const WRITE = 1 << 47;
        /// DrTM's write lock: both bits.
        const LOCKED = Self::INTENTION.bits() | Self::WRITE.bits();
    }
}

/// The bits of a DrTM lock word that hold a lease end (or, in a write-locked word, the
/// lease end it replaced).
pub const END: u64 = LockBits::INTENTION.bits() - 1;
/// Where the owner of a write-locked word starts.
const OWNER_SHIFT: u32 = 48;

/// How far ahead of a reader's clock a lease can end: a lease is set at most `lease_ns`
/// ahead by a clock at most `delta_ns` off (the drift model's offsets included), so a second
/// is far beyond any real one and far below the 2^46 ns (19.5 hours) a lease word holds.
pub const LEASE_HORIZON_NS: Nanos = 1_000_000_000;

/// The clock time a lease word's `END` bits stand for, read at `now`.
///
/// A lease word keeps the low 46 bits of a time. A clock that has run longer than 2^46 ns
/// (a real CN's monotonic clock on a host up for more than 19.5 hours) wraps them, and
/// comparing the raw bits against `now` then took every fresh lease for expired: DrTM
/// aborted almost every transaction with "read lease expired". The bits are taken in the
/// period that puts them at most [`LEASE_HORIZON_NS`] ahead of `now`; anything further is
/// from the previous period (an old lease, or a fresh word's 0). Below 2^46 ns (every
/// simulated run) this is the raw bits unless they lie more than a second ahead.
#[must_use]
pub fn lease_time(word: u64, now: Nanos) -> Nanos {
    let period = END + 1;
    let limit = now.saturating_add(LEASE_HORIZON_NS);
    let t = (now & !END) | (word & END);
    if t > limit {
        t.saturating_sub(period)
    } else if t.saturating_add(period) <= limit {
        t + period
    } else {
        t
    }
}

/// Whether a raw DrTM word is write-locked (either lock bit set).
#[must_use]
pub fn locked(word: u64) -> bool {
    LockBits::from_bits_truncate(word).intersects(LockBits::LOCKED)
}

/// The word a CAS from `expected` installs: coordinator `owner`'s write lock (keeping the
/// lease end it replaces), or a read lease ending `lease` after `now`.
#[must_use]
pub fn swap_word(exclusive: bool, owner: u16, expected: u64, now: Nanos, lease: Nanos) -> u64 {
    if exclusive {
        (u64::from(owner) << OWNER_SHIFT) | LockBits::LOCKED.bits() | (expected & END)
    } else {
        (now + lease) & END
    }
}

/// The free word that releases a write lock `word` (same lease end, no owner).
#[must_use]
pub fn released(word: u64) -> u64 {
    word & END
}

/// The version hint a CAS's returned word leaves for the record (none for a locked one).
#[must_use]
pub fn hint_of(returned: u64) -> u64 {
    if locked(returned) { 0 } else { returned }
}

/// What to do before a CAS round, whose write locks may only replace expired leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseWait {
    /// No lease to wait out.
    Go,
    /// Sleep until this local time.
    Until(Nanos),
    /// Abort.
    Abort(AbortReason),
}

/// The wait before a round that write-locks records whose words were `words` (the
/// expected words of the exclusive targets), at `now`: until the latest lease plus the
/// clock uncertainty ends. Waiting while holding write locks would let readers that keep
/// renewing the lease starve this writer with its locks held (and every reader of
/// those): a writer waits only while it holds nothing (`holds_locks`), else it aborts; a
/// lease longer than two leases is not waited out either.
#[must_use]
pub fn lease_wait(
    words: impl IntoIterator<Item = u64>,
    now: Nanos,
    cfg: &DrtmConfig,
    holds_locks: bool,
) -> LeaseWait {
    let expires = words
        .into_iter()
        .map(|w| lease_time(w, now) + cfg.delta_ns)
        .max()
        .unwrap_or(0);
    if expires <= now {
        LeaseWait::Go
    } else if holds_locks {
        LeaseWait::Abort(AbortReason::LeaseRunningWhileLocking)
    } else if expires - now > 2 * cfg.lease_ns {
        LeaseWait::Abort(AbortReason::LeaseTooLongToWaitOut)
    } else {
        LeaseWait::Until(expires)
    }
}

/// What a CAS of a round settled for its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Write-locked by another: the transaction aborts once the round is settled.
    WriteLocked,
    /// Write-locked by us.
    Locked,
    /// Our read lease is installed, ending at this time; the word is the hint.
    Leased(Nanos),
    /// Another's valid lease is shared, ending at this time.
    Shared(Nanos),
    /// CAS again from the returned word (after its lease ran out, for a write).
    Retry,
}

/// Judges a CAS from `expected` that returned `returned` (read back at `now`): a CAS that
/// loses to a valid lease shares it (the READ behind it is good while that lease lasts);
/// an expired or nearly expired one is CASed again; a write lock aborts.
#[must_use]
pub fn settle_cas(
    returned: u64,
    expected: u64,
    swap: u64,
    exclusive: bool,
    now: Nanos,
    cfg: &DrtmConfig,
) -> Settled {
    if locked(returned) {
        Settled::WriteLocked
    } else if returned == expected {
        if exclusive {
            Settled::Locked
        } else {
            Settled::Leased(lease_time(swap, now))
        }
    } else if exclusive {
        // Free at another word: CAS again once its lease ran out (the next round waits
        // for it, or aborts if this round locked something).
        Settled::Retry
    } else if lease_time(returned, now) > now + cfg.delta_ns + cfg.min_left_ns {
        Settled::Shared(lease_time(returned, now))
    } else {
        Settled::Retry
    }
}

/// Whether every read lease still holds at commit (`now + delta < lease end`, §VII-B).
#[must_use]
pub fn leases_hold(lease_ends: impl IntoIterator<Item = Nanos>, now: Nanos, delta: Nanos) -> bool {
    lease_ends.into_iter().all(|end| now + delta < end)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PERIOD: u64 = END + 1;
    const LEASE: u64 = 400_000;

    #[test]
    fn the_lock_bits_are_oocc_s() {
        use dmem_layout::record::{OoccLockState, OoccLockWord};
        let free = OoccLockWord::free(5).unwrap();
        let intention = free.with_intention_lock(3);
        assert_eq!(
            intention.to_raw() & LockBits::all().bits(),
            LockBits::INTENTION.bits()
        );
        assert_eq!(
            intention.with_write_lock().to_raw() & LockBits::all().bits(),
            LockBits::LOCKED.bits()
        );
        let drtm = swap_word(true, 3, 12_345, 0, LEASE);
        assert_eq!(
            OoccLockWord::from_raw(drtm).state(),
            Ok(OoccLockState::Write)
        );
        assert_eq!(OoccLockWord::from_raw(drtm).owner(), 3);
        assert_eq!(released(drtm), 12_345);
        assert!(locked(drtm) && !locked(released(drtm)));
        assert!(locked(LockBits::INTENTION.bits()));
        assert_eq!(hint_of(drtm), 0);
        assert_eq!(hint_of(777), 777);
    }

    #[test]
    fn below_one_period_the_bits_are_the_time() {
        for now in [0, 1, 5_000, 123_456_789, END - 2 * LEASE_HORIZON_NS] {
            assert_eq!(lease_time(0, now), 0);
            assert_eq!(lease_time(now + LEASE, now), now + LEASE);
            assert_eq!(
                lease_time(now.saturating_sub(LEASE), now),
                now.saturating_sub(LEASE)
            );
        }
    }

    #[test]
    fn a_clock_past_2_pow_46_reads_fresh_leases_as_fresh() {
        // A host up for 20 hours (the bug: every fresh lease compared as expired).
        for now in [
            PERIOD + 5,
            3 * PERIOD + 1_000,
            2 * PERIOD - 100,
            2 * PERIOD - LEASE / 2,
        ] {
            let stored = (now + LEASE) & END;
            assert_eq!(lease_time(stored, now), now + LEASE, "now {now}");
            let shared = (now + LEASE / 2) & END;
            assert_eq!(lease_time(shared, now), now + LEASE / 2, "now {now}");
            let old = (now - LEASE) & END;
            assert_eq!(lease_time(old, now), now - LEASE, "now {now}");
        }
    }

    #[test]
    fn a_fresh_or_ancient_word_is_expired() {
        for now in [
            PERIOD + 5,
            PERIOD + PERIOD / 2,
            2 * PERIOD - 2 * LEASE_HORIZON_NS,
        ] {
            assert!(lease_time(0, now) <= now, "now {now}");
            // A lease of 15 hours ago.
            let ancient = now - 15 * 3_600_000_000_000;
            assert!(lease_time(ancient & END, now) <= now, "now {now}");
        }
    }

    #[test]
    fn a_writer_waits_out_leases_only_while_it_holds_nothing() {
        let cfg = DrtmConfig::default();
        let now = 1_000_000;
        assert_eq!(lease_wait([], now, &cfg, false), LeaseWait::Go);
        // Expired (with the uncertainty) or free words: go at once.
        assert_eq!(lease_wait([0, now - 2_000], now, &cfg, true), LeaseWait::Go);
        // The latest lease decides, plus delta.
        let wait = lease_wait([now + 10, now + 300_000], now, &cfg, false);
        assert_eq!(wait, LeaseWait::Until(now + 302_000));
        assert_eq!(
            lease_wait([now + 10], now, &cfg, true),
            LeaseWait::Abort(AbortReason::LeaseRunningWhileLocking)
        );
        assert_eq!(
            lease_wait([now + 800_000], now, &cfg, false),
            LeaseWait::Abort(AbortReason::LeaseTooLongToWaitOut)
        );
    }

    #[test]
    fn a_cas_locks_leases_shares_or_retries() {
        let cfg = DrtmConfig::default();
        let now = 1_000_000;
        let mine = swap_word(false, 1, 0, now, cfg.lease_ns);
        assert_eq!(mine, now + LEASE);
        assert_eq!(
            settle_cas(0, 0, mine, false, now, &cfg),
            Settled::Leased(now + LEASE)
        );
        let lock = swap_word(true, 1, 0, now, cfg.lease_ns);
        assert_eq!(settle_cas(0, 0, lock, true, now, &cfg), Settled::Locked);
        assert_eq!(
            settle_cas(lock, 0, mine, false, now, &cfg),
            Settled::WriteLocked
        );
        // Another's lease with plenty left is shared; nearly expired, CASed again.
        let theirs = now + 100_000;
        assert_eq!(
            settle_cas(theirs, 0, mine, false, now, &cfg),
            Settled::Shared(theirs)
        );
        let short = now + cfg.delta_ns + cfg.min_left_ns;
        assert_eq!(settle_cas(short, 0, mine, false, now, &cfg), Settled::Retry);
        // A writer that found another word retries from it.
        assert_eq!(settle_cas(theirs, 0, lock, true, now, &cfg), Settled::Retry);
    }

    #[test]
    fn commit_needs_every_lease_to_outlast_the_uncertainty() {
        assert!(leases_hold([], 10, 2));
        assert!(leases_hold([13, 100], 10, 2));
        assert!(!leases_hold([100, 12], 10, 2));
    }
}
