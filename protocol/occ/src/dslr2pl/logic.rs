//! DSLR 2PL's decisions (OOCC §II-A baseline; DSLR §4.3–§4.4) as plain synchronous
//! functions over the DSLR words the verbs returned and clock readings passed in: what a
//! ticket or a waited-for word means, when the hold lease still allows a commit or a
//! release, and each step of draining and resetting a word. The async shell in [`super`]
//! posts what they decide, in the same order.

use dmem_locks::LockMode;
use dmem_locks::dslr::DslrWord;
use dmem_verbs::Nanos;

/// What the FAA that took a ticket returned (the word before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ticket {
    /// Taken at or past the threshold, or on a lease-reset barrier: undo it and abort
    /// (DSLR §4.3).
    Invalid,
    /// Granted at once: the READ of the same post list is the record's value.
    Granted,
    /// Queued behind earlier tickets.
    Queued,
}

/// Classifies a ticket taken in `mode`.
#[must_use]
pub fn ticket(ticket: DslrWord, mode: LockMode) -> Ticket {
    if !ticket.ticket_is_valid() {
        Ticket::Invalid
    } else if ticket.grants(ticket, mode) {
        Ticket::Granted
    } else {
        Ticket::Queued
    }
}

/// A waited-for ticket's view of its word's counters: since when `n_x`/`n_s` stand still.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stall {
    /// `(n_x, n_s)` as last seen.
    pub seen: (u64, u64),
    /// When they were first seen so (local clock).
    pub since: Nanos,
}

impl Stall {
    /// Counters of `word`, seen at `now`.
    #[must_use]
    pub fn new(word: DslrWord, now: Nanos) -> Self {
        Self {
            seen: (word.n_x, word.n_s),
            since: now,
        }
    }
}

/// What one look at a waited-for word (READ at `now`) decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// The word is a lease-reset barrier: the ticket is gone.
    Barrier,
    /// The word grants the ticket.
    Granted,
    /// Still queued.
    Waiting,
    /// The counters stood still for the reset lease: a holder died (DSLR §4.4). CAS the
    /// word seen to the barrier; the ticket is gone if that lands, else keep waiting.
    Stalled,
}

/// Judges `word` for `ticket` in `mode`, updating `stall` when the counters moved.
#[must_use]
pub fn look(
    word: DslrWord,
    ticket: DslrWord,
    mode: LockMode,
    stall: &mut Stall,
    now: Nanos,
    reset_lease: Nanos,
) -> View {
    if word.is_barrier() {
        return View::Barrier;
    }
    if word.grants(ticket, mode) {
        return View::Granted;
    }
    if (word.n_x, word.n_s) != stall.seen {
        *stall = Stall::new(word, now);
        return View::Waiting;
    }
    if now.saturating_sub(stall.since) < reset_lease {
        return View::Waiting;
    }
    View::Stalled
}

/// The hold lease counts from just before the first grant (`lease_start`); a reset comes
/// a whole reset lease after a waiter saw the counters stop. Whether the commit WRITEs
/// may still start at `now`: within half the reset lease.
#[must_use]
pub fn may_commit(lease_start: Option<Nanos>, now: Nanos, reset_lease: Nanos) -> bool {
    lease_start.is_none_or(|s| now < s.saturating_add(reset_lease / 2))
}

/// Whether releasing the held tickets at `now` still lands before any reset of their
/// words: within three quarters of the reset lease (after that they are given up).
#[must_use]
pub fn may_release(lease_start: Option<Nanos>, now: Nanos, reset_lease: Nanos) -> bool {
    lease_start.is_none_or(|s| now < s.saturating_add(reset_lease / 4 * 3))
}

/// The hold lease's start after a grant whose ticket was taken (or last seen waiting)
/// at `before`: the earliest such time.
#[must_use]
pub fn lease_start(current: Option<Nanos>, before: Nanos) -> Option<Nanos> {
    Some(current.map_or(before, |s| s.min(before)))
}

/// Whether a read-only commit releases its shared tickets in one detached post: nothing
/// queued, no barrier to clear, the hold lease still young and no ticket that makes it
/// reset its word (else the full release path runs).
#[must_use]
pub fn releases_at_once(
    nothing_pending: bool,
    no_barriers: bool,
    may_release: bool,
    any_resets: bool,
) -> bool {
    nothing_pending && no_barriers && may_release && !any_resets
}

/// The counters a word is drained at after the valid tickets up to `ticket` (the one that
/// reached the threshold, in `mode`): `(max_x, max_s)`.
#[must_use]
pub fn drain_target(ticket: DslrWord, mode: LockMode) -> (u64, u64) {
    match mode {
        LockMode::Exclusive => (ticket.max_x + 1, ticket.max_s),
        LockMode::Shared => (ticket.max_x, ticket.max_s + 1),
    }
}

/// One step of a wait on a word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing left to do.
    Done,
    /// CAS the word seen to zero; done if that lands, else poll again.
    ClearIt,
    /// Poll again.
    Wait,
}

/// The exhaustion reset (DSLR §4.3) of a word to drain at `(x, s)`, seen as `word`: done
/// if it was reset by lease meanwhile (this epoch's tickets are gone), cleared once
/// drained.
#[must_use]
pub fn reset_step(word: DslrWord, (x, s): (u64, u64)) -> Step {
    if word.is_barrier() || word.max_x < x || word.max_s < s {
        Step::Done
    } else if word.drained(x, s) {
        Step::ClearIt
    } else {
        Step::Wait
    }
}

/// Clearing a lease-reset barrier this client saw, `elapsed` after its first look: every
/// waiter of the old tickets polls within `poll_ns` and sees the barrier before it goes,
/// so it is cleared once it has stood untouched for a reset lease.
#[must_use]
pub fn barrier_step(word: DslrWord, elapsed: Nanos, reset_lease: Nanos) -> Step {
    if !word.is_barrier() {
        Step::Done
    } else if word == DslrWord::BARRIER && elapsed >= reset_lease {
        Step::ClearIt
    } else {
        Step::Wait
    }
}

#[cfg(test)]
mod tests {
    use dmem_locks::dslr::THRESHOLD;

    use super::*;

    fn word(max_x: u64, max_s: u64, n_x: u64, n_s: u64) -> DslrWord {
        DslrWord {
            max_x,
            max_s,
            n_x,
            n_s,
        }
    }

    #[test]
    fn tickets_are_granted_queued_or_invalid() {
        use LockMode::*;
        assert_eq!(ticket(word(0, 0, 0, 0), Exclusive), Ticket::Granted);
        // Readers share, a writer waits for them.
        assert_eq!(ticket(word(0, 3, 0, 0), Shared), Ticket::Granted);
        assert_eq!(ticket(word(0, 3, 0, 1), Exclusive), Ticket::Queued);
        assert_eq!(ticket(word(2, 0, 1, 0), Shared), Ticket::Queued);
        assert_eq!(ticket(word(THRESHOLD, 0, 0, 0), Shared), Ticket::Invalid);
        assert_eq!(ticket(DslrWord::BARRIER, Shared), Ticket::Invalid);
    }

    #[test]
    fn a_waiter_resets_a_word_only_after_its_counters_stood_a_whole_lease() {
        let (mode, lease) = (LockMode::Exclusive, 1_000);
        let mine = word(1, 0, 0, 0);
        let mut stall = Stall::new(mine, 0);
        assert_eq!(
            look(mine, mine, mode, &mut stall, 500, lease),
            View::Waiting
        );
        // The counters moved: the stall restarts.
        let moved = word(2, 1, 0, 1);
        assert_eq!(
            look(moved, mine, mode, &mut stall, 900, lease),
            View::Waiting
        );
        assert_eq!(stall, Stall::new(moved, 900));
        assert_eq!(
            look(moved, mine, mode, &mut stall, 1_899, lease),
            View::Waiting
        );
        assert_eq!(
            look(moved, mine, mode, &mut stall, 1_900, lease),
            View::Stalled
        );
        let granted = word(2, 1, 1, 1);
        assert_eq!(
            look(granted, mine, mode, &mut stall, 2_000, lease),
            View::Granted
        );
        assert_eq!(
            look(DslrWord::BARRIER, mine, mode, &mut stall, 2_000, lease),
            View::Barrier
        );
    }

    #[test]
    fn the_hold_lease_bounds_commits_and_releases() {
        let lease = 1_000;
        assert!(may_commit(None, 1 << 40, lease));
        assert!(may_commit(Some(100), 599, lease));
        assert!(!may_commit(Some(100), 600, lease));
        assert!(may_release(Some(100), 849, lease));
        assert!(!may_release(Some(100), 850, lease));
        assert_eq!(lease_start(None, 7), Some(7));
        assert_eq!(lease_start(Some(5), 7), Some(5));
        assert_eq!(lease_start(Some(9), 7), Some(7));
        assert!(releases_at_once(true, true, true, false));
        assert!(!releases_at_once(true, true, true, true));
        assert!(!releases_at_once(false, true, true, false));
        assert!(!releases_at_once(true, true, false, false));
    }

    #[test]
    fn an_exhausted_word_is_cleared_once_drained_unless_reset_meanwhile() {
        let last = word(THRESHOLD - 1, 4, 0, 0);
        let target = drain_target(last, LockMode::Exclusive);
        assert_eq!(target, (THRESHOLD, 4));
        assert_eq!(
            drain_target(word(2, THRESHOLD - 1, 0, 0), LockMode::Shared),
            (2, THRESHOLD)
        );
        assert_eq!(
            reset_step(word(THRESHOLD, 4, THRESHOLD - 1, 4), target),
            Step::Wait
        );
        assert_eq!(
            reset_step(word(THRESHOLD, 4, THRESHOLD, 4), target),
            Step::ClearIt
        );
        // Invalid tickets still outstanding: not drained.
        assert_eq!(
            reset_step(word(THRESHOLD + 1, 4, THRESHOLD, 4), target),
            Step::Wait
        );
        // Reset meanwhile (by lease, or already to zero).
        assert_eq!(reset_step(word(0, 0, 0, 0), target), Step::Done);
        assert_eq!(reset_step(DslrWord::BARRIER, target), Step::Done);
    }

    #[test]
    fn a_barrier_is_cleared_after_standing_a_reset_lease() {
        let b = DslrWord::BARRIER;
        assert_eq!(barrier_step(word(0, 0, 0, 0), 0, 10), Step::Done);
        assert_eq!(barrier_step(b, 9, 10), Step::Wait);
        assert_eq!(barrier_step(b, 10, 10), Step::ClearIt);
        // Tickets taken on it are still to be undone: wait for them.
        let with_tickets = DslrWord {
            max_x: THRESHOLD + 1,
            ..b
        };
        assert_eq!(barrier_step(with_tickets, 50, 10), Step::Wait);
    }
}
