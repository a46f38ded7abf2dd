//! CN restart (LOTUS §6, "Lock table recovery" and the last paragraph of "Compute Node
//! Failure"): a failed CN comes back with an **empty** lock table and serves lock requests
//! again only after it has broadcast that every transaction associated with its old
//! incarnation has finished.
//!
//! Two things must both have happened before the broadcast, in either order:
//!
//! * the survivors' recovery of the CN is over (its coordinators' transactions decided
//!   from their commit logs, its locks released from their lock states, survivors'
//!   transactions committing with its locks finished), and
//! * the CN is up again with an empty table.
//!
//! The paper notes that recovery "typically complete\[s\] much earlier" than the restart, so
//! that no extra waiting is needed; the [`Restart`] machine waits if it does not. Until the
//! broadcast the CN's shards stay assigned to it and are not served (requests for them are
//! refused, the requesting transaction aborts and is retried), as in the paper, where the
//! failed CN's shards are not handed to anyone else.
//!
//! [`Restart`] is the state machine; the async shell is in `dmem-protocols` (`lotus.rs`,
//! on the simulator's `Sim::restart`).

/// Where a CN is in its failure and restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Up and serving its shards.
    Serving,
    /// Crashed (declared failed): recovery by the survivors is under way, the CN is down.
    Down,
    /// Recovery is over, the CN is still down.
    Recovered,
    /// The CN is up again with an empty table, recovery is still under way: it refuses
    /// every lock request.
    Rejoining,
}

/// What the shell does after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing yet.
    Wait,
    /// Broadcast "the old transactions are finished" and serve from the empty table.
    Broadcast,
}

/// An event of a CN's failure and restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The membership service declared the CN failed.
    Failed,
    /// The survivors finished recovering it (§6 steps 1 and 2).
    Recovered,
    /// The CN is up again with an empty lock table.
    Restarted,
}

/// One CN's restart state machine (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restart {
    phase: Phase,
    /// Planted bug: broadcast as soon as the CN is up, without waiting for recovery.
    serve_early: bool,
    /// Incarnations so far (0 for the first).
    incarnation: u32,
}

impl Restart {
    /// A CN up and serving; `serve_early` plants the bug of serving before recovery ends.
    #[must_use]
    pub fn new(serve_early: bool) -> Self {
        Self {
            phase: Phase::Serving,
            serve_early,
            incarnation: 0,
        }
    }

    /// Its phase.
    #[must_use]
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Its incarnation: how many times it restarted and broadcast.
    #[must_use]
    pub fn incarnation(&self) -> u32 {
        self.incarnation
    }

    /// Whether it serves lock requests now.
    #[must_use]
    pub fn serves(&self) -> bool {
        self.phase == Phase::Serving
    }

    /// Applies `event`; an event that does not apply in the current phase (a second
    /// failure report, a restart of a CN that is up) changes nothing.
    pub fn step(&mut self, event: Event) -> Action {
        let next = match (self.phase, event) {
            (Phase::Serving, Event::Failed) => Phase::Down,
            (Phase::Down, Event::Recovered) => Phase::Recovered,
            (Phase::Down, Event::Restarted) if self.serve_early => Phase::Serving,
            (Phase::Down, Event::Restarted) => Phase::Rejoining,
            (Phase::Recovered, Event::Restarted) | (Phase::Rejoining, Event::Recovered) => {
                Phase::Serving
            }
            (p, _) => p,
        };
        let broadcast = next == Phase::Serving && self.phase != Phase::Serving;
        self.phase = next;
        if broadcast {
            self.incarnation += 1;
            Action::Broadcast
        } else {
            Action::Wait
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_then_restart_broadcasts_at_the_restart() {
        let mut r = Restart::new(false);
        assert!(r.serves());
        assert_eq!(
            r.step(Event::Restarted),
            Action::Wait,
            "not failed: no restart"
        );
        assert!(r.serves());
        assert_eq!(r.step(Event::Failed), Action::Wait);
        assert_eq!(r.phase(), Phase::Down);
        assert!(!r.serves());
        assert_eq!(r.step(Event::Failed), Action::Wait, "reported twice");
        assert_eq!(r.step(Event::Recovered), Action::Wait);
        assert_eq!(r.phase(), Phase::Recovered);
        assert!(!r.serves(), "still down");
        assert_eq!(r.step(Event::Restarted), Action::Broadcast);
        assert!(r.serves());
        assert_eq!(r.incarnation(), 1);
    }

    #[test]
    fn restart_before_recovery_refuses_until_recovery_ends() {
        let mut r = Restart::new(false);
        r.step(Event::Failed);
        assert_eq!(r.step(Event::Restarted), Action::Wait);
        assert_eq!(r.phase(), Phase::Rejoining);
        assert!(!r.serves(), "up but old transactions unfinished: refuse");
        assert_eq!(r.step(Event::Restarted), Action::Wait);
        assert!(!r.serves());
        assert_eq!(r.step(Event::Recovered), Action::Broadcast);
        assert!(r.serves());
        // A second failure and restart: a new incarnation.
        r.step(Event::Failed);
        r.step(Event::Recovered);
        assert_eq!(r.step(Event::Restarted), Action::Broadcast);
        assert_eq!(r.incarnation(), 2);
    }

    #[test]
    fn incarnations_number_their_transactions_apart() {
        use crate::txn::incarnation_seq_base;
        use dmem_motor::mvcc::{pack_writer, unpack_writer};
        use dmem_txn::{CoordinatorId, TxnId};
        // The first transaction of each incarnation is above every transaction of the
        // earlier ones, and survives the writer packing (40 bits of sequence number).
        for i in 0..255u32 {
            let last_of_this = incarnation_seq_base(i) + u64::from(u32::MAX);
            let first_of_next = incarnation_seq_base(i + 1) + 1;
            assert!(first_of_next > last_of_this, "incarnation {i}");
            let id = TxnId {
                coordinator: CoordinatorId(7),
                seq: first_of_next,
            };
            assert_eq!(unpack_writer(pack_writer(id)), Some(id));
        }
    }

    #[test]
    fn planted_bug_serves_before_recovery_ends() {
        let mut r = Restart::new(true);
        r.step(Event::Failed);
        assert_eq!(r.step(Event::Restarted), Action::Broadcast);
        assert!(r.serves(), "the bug: serving while recovery still runs");
        assert_eq!(r.step(Event::Recovered), Action::Wait);
    }
}
