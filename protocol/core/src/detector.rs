//! The heartbeat failure detector as a state machine, fabric-free and protocol-neutral: the
//! caller feeds it the heartbeats it received and asks it, at any instant, which CNs it now
//! suspects. Written once for every detector of dmem: `dmem-deploy`'s simulated recovery
//! (`spawn_heartbeat_watch`) and its recovery across processes (`process::LogRecovery`),
//! used by protocols without a detector of their own (OOCC, DrTM, DSLR, Motor), and
//! Pandora's recovery manager in `dmem-ford` (Pandora §3.2.2 step 1).
//!
//! A suspicion is not a proof of death: a CN that is merely slow, or whose heartbeats are
//! delayed past the timeout, is suspected too. Every caller therefore cuts a suspected CN
//! off every MN (active-link termination) before it touches the CN's state, so a false
//! suspicion costs the CN's availability, never safety.

use alloc::vec::Vec;

use dmem_verbs::{Nanos, NodeId};

/// Suspects a watched CN once no heartbeat from it arrived for longer than `timeout`.
/// Each CN is suspected at most once; heartbeats of a suspected CN are ignored (it has
/// been, or is being, cut off).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatDetector {
    timeout: Nanos,
    /// Each watched CN and when it was last heard from, in the order it was watched.
    last: Vec<(NodeId, Nanos)>,
    /// CNs suspected so far, in the order they were.
    suspected: Vec<NodeId>,
}

impl HeartbeatDetector {
    /// A detector with silence limit `timeout`, watching nobody yet.
    #[must_use]
    pub fn new(timeout: Nanos) -> Self {
        Self {
            timeout,
            last: Vec::new(),
            suspected: Vec::new(),
        }
    }

    /// A detector watching `cns`, each counted as heard from at `now`.
    #[must_use]
    pub fn watching(timeout: Nanos, cns: impl IntoIterator<Item = NodeId>, now: Nanos) -> Self {
        let mut d = Self::new(timeout);
        for cn in cns {
            d.watch(cn, now);
        }
        d
    }

    /// The silence after which a CN is suspected.
    #[must_use]
    pub fn timeout(&self) -> Nanos {
        self.timeout
    }

    /// Starts watching `cn`, counted as heard from at `now`; a no-op for a CN already watched.
    pub fn watch(&mut self, cn: NodeId, now: Nanos) {
        if !self.watches(cn) {
            self.last.push((cn, now));
        }
    }

    /// `cn` came back after a crash (a restarted CN, Pandora §6.3, LOTUS §6): watched again
    /// as heard from at `now` and no longer suspected, so a later crash of the new
    /// incarnation is suspected again.
    pub fn rejoin(&mut self, cn: NodeId, now: Nanos) {
        self.suspected.retain(|&c| c != cn);
        match self.last.iter_mut().find(|(c, _)| *c == cn) {
            Some((_, t)) => *t = now,
            None => self.last.push((cn, now)),
        }
    }

    /// A heartbeat (or any message counted as one) from `cn` arrived at `now`. Returns
    /// whether it counted: `cn` is watched and not suspected.
    pub fn heartbeat(&mut self, cn: NodeId, now: Nanos) -> bool {
        if self.suspected.contains(&cn) {
            return false;
        }
        match self.last.iter_mut().find(|(c, _)| *c == cn) {
            Some((_, t)) => {
                *t = (*t).max(now);
                true
            }
            None => false,
        }
    }

    /// The CNs newly suspected at `now` (silent for more than the timeout), each reported
    /// once, in the order they were watched.
    pub fn suspects(&mut self, now: Nanos) -> Vec<NodeId> {
        let new: Vec<NodeId> = self
            .last
            .iter()
            .filter(|&&(cn, t)| {
                now.saturating_sub(t) > self.timeout && !self.suspected.contains(&cn)
            })
            .map(|&(cn, _)| cn)
            .collect();
        self.suspected.extend(&new);
        new
    }

    /// Whether `cn` is watched (suspected or not).
    #[must_use]
    pub fn watches(&self, cn: NodeId) -> bool {
        self.last.iter().any(|&(c, _)| c == cn)
    }

    /// Whether `cn` was suspected.
    #[must_use]
    pub fn is_suspected(&self, cn: NodeId) -> bool {
        self.suspected.contains(&cn)
    }

    /// The watched CNs not suspected, in the order they were watched.
    pub fn live(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.last
            .iter()
            .map(|&(cn, _)| cn)
            .filter(|cn| !self.suspected.contains(cn))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: NodeId = NodeId(3);
    const B: NodeId = NodeId(4);

    #[test]
    fn suspects_a_silent_cn_once_after_the_timeout() {
        let mut d = HeartbeatDetector::watching(100, [A, B], 0);
        // Silence of exactly the timeout is not yet suspicious.
        assert!(d.heartbeat(A, 60));
        assert_eq!(d.suspects(100), Vec::<NodeId>::new());
        // B has been silent since 0: suspected after 100; A heard at 60 is not.
        assert_eq!(d.suspects(101), vec![B]);
        assert!(d.is_suspected(B) && !d.is_suspected(A));
        // Reported once.
        assert_eq!(d.suspects(150), Vec::<NodeId>::new());
        // A late heartbeat of a suspected CN does not revive it.
        assert!(!d.heartbeat(B, 155));
        assert!(d.is_suspected(B));
        assert_eq!(d.live().collect::<Vec<_>>(), vec![A]);
        // A heartbeat that arrives out of order never moves the time back.
        assert!(d.heartbeat(A, 150));
        assert!(d.heartbeat(A, 120));
        assert_eq!(d.suspects(250), Vec::<NodeId>::new());
        assert_eq!(d.suspects(251), vec![A]);
        assert_eq!(d.live().count(), 0);
    }

    #[test]
    fn unknown_cns_are_ignored_until_watched() {
        let mut d = HeartbeatDetector::new(10);
        assert!(!d.heartbeat(A, 0), "A is not watched");
        assert_eq!(d.suspects(1_000), Vec::<NodeId>::new());
        d.watch(A, 1_000);
        // Watching again does not reset A's time.
        d.watch(A, 1_005);
        assert_eq!(d.suspects(1_010), Vec::<NodeId>::new());
        assert_eq!(d.suspects(1_011), vec![A]);
        assert_eq!(d.timeout(), 10);
    }
}
