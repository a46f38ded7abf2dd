//! A linearizability checker for concurrent histories of a `u64 → u64` map, in the
//! Wing–Gong style with Lowe's memoisation (the algorithm Porcupine implements).
//!
//! A history is a list of completed operations, each with the logical time it was invoked
//! and the logical time it returned (taken from one shared counter before the call and after
//! the return, so `a.ret < b.call` means `a` really finished before `b` started). Every
//! operation touches one key, and a map is the product of independent per-key registers, so
//! the history is checked key by key (P-compositionality): it is linearizable if and only if
//! every key's sub-history is.
//!
//! For one key the checker searches for a total order that respects real time (an operation
//! may be linearized only if no unlinearized operation returned before it was invoked) and in
//! which every output equals what the sequential map gives. A set of linearized operations
//! together with the state it leads to is explored once (memoised), so the search is fast
//! when few operations overlap, as in a stress test with a handful of threads.
//!
//! Shared by the integration tests (`tests/linearizability.rs`) and the planted-bug unit test
//! in `src/lincheck_tests.rs`, which includes this file by path.
#![allow(dead_code, unreachable_pub)]

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// An operation on one key with its recorded output. Every output is the value the key held
/// just before the operation took effect (`None`: absent), as the `Dlht` API returns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Read; the output is the value.
    Get,
    /// Add if absent; the output is the existing value (`None`: it inserted).
    Insert(u64),
    /// Replace if present.
    Put(u64),
    /// Insert or replace.
    Upsert(u64),
    /// Remove.
    Delete,
}

/// One completed operation of a history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// Which thread ran it (for reports only).
    pub thread: usize,
    pub key: u64,
    pub kind: Kind,
    pub out: Option<u64>,
    /// Logical time of the invocation.
    pub call: u64,
    /// Logical time of the return (`> call`).
    pub ret: u64,
}

/// The sequential specification: the state after `kind` applied to `state`, if `out` is what
/// the sequential map would have returned.
pub fn step(state: Option<u64>, kind: Kind, out: Option<u64>) -> Option<Option<u64>> {
    if out != state {
        return None;
    }
    Some(match kind {
        Kind::Get => state,
        Kind::Insert(v) => Some(state.unwrap_or(v)),
        Kind::Put(v) => state.map(|_| v),
        Kind::Upsert(v) => Some(v),
        Kind::Delete => None,
    })
}

/// A key whose sub-history has no linearization.
#[derive(Clone, Debug)]
pub struct Violation {
    pub key: u64,
    /// The longest prefix of operations (in linearization order) the search could place.
    pub longest_prefix: Vec<Event>,
    /// Operations that could not be placed after that prefix.
    pub stuck: Vec<Event>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "history of key {} is not linearizable", self.key)?;
        let tail = self.longest_prefix.len().saturating_sub(8);
        writeln!(
            f,
            "  longest linearizable prefix ({} operations), last ones:",
            self.longest_prefix.len()
        )?;
        for e in &self.longest_prefix[tail..] {
            writeln!(f, "    {e:?}")?;
        }
        writeln!(f, "  none of these can come next:")?;
        for e in &self.stuck {
            writeln!(f, "    {e:?}")?;
        }
        Ok(())
    }
}

/// Checks every key of `history`, starting from an empty map. Returns the first violation
/// found (keys are checked in increasing order, so the result is deterministic).
pub fn check(history: &[Event]) -> Result<(), Violation> {
    let mut per_key: HashMap<u64, Vec<Event>> = HashMap::new();
    for e in history {
        assert!(
            e.call < e.ret,
            "event returned before it was invoked: {e:?}"
        );
        per_key.entry(e.key).or_default().push(*e);
    }
    let mut keys: Vec<u64> = per_key.keys().copied().collect();
    keys.sort_unstable();
    for k in keys {
        check_key(k, per_key.remove(&k).unwrap_or_default(), None)?;
    }
    Ok(())
}

/// Checks the sub-history of one key that starts in state `init`.
pub fn check_key(key: u64, mut ops: Vec<Event>, init: Option<u64>) -> Result<(), Violation> {
    ops.sort_by_key(|e| e.call);
    let n = ops.len();
    let words = n.div_ceil(64);
    let mut done = vec![0u64; words];
    let is_done = |d: &[u64], i: usize| d[i / 64] >> (i % 64) & 1 == 1;
    // Lowe's memo: (set of linearized operations, state) pairs already explored.
    let mut seen: HashSet<(usize, Vec<u64>, Option<u64>)> = HashSet::new();
    // The linearization so far: (operation, state before it, highest operation linearized).
    let mut stack: Vec<(usize, Option<u64>, usize)> = Vec::new();
    let mut state = init;
    // Operations before `first` are all linearized.
    let mut first = 0;
    // Where to resume the search for the next candidate after a backtrack.
    let mut resume = 0;
    let mut best: Vec<usize> = Vec::new();
    let mut best_stuck: Vec<usize> = Vec::new();
    loop {
        while first < n && is_done(&done, first) {
            first += 1;
        }
        if first == n {
            return Ok(());
        }
        // Candidates: unlinearized operations invoked before every unlinearized one returned.
        // Operations are sorted by invocation, so the window ends at the first one invoked
        // after the earliest pending return.
        let mut min_ret = u64::MAX;
        let mut end = first;
        while end < n && ops[end].call < min_ret {
            if !is_done(&done, end) {
                min_ret = min_ret.min(ops[end].ret);
            }
            end += 1;
        }
        let mut advanced = false;
        for i in resume.max(first)..end {
            if is_done(&done, i) || ops[i].call >= min_ret {
                continue;
            }
            let Some(next) = step(state, ops[i].kind, ops[i].out) else {
                continue;
            };
            done[i / 64] |= 1 << (i % 64);
            // The linearized set, exactly: every operation below the first unlinearized one
            // is in it, none above the highest linearized one is, so only the words in
            // between are kept (a few, as few operations overlap), not the whole bitmap.
            let hi = i.max(stack.last().map_or(0, |&(_, _, h)| h));
            let mut f = first;
            while f < n && is_done(&done, f) {
                f += 1;
            }
            let lo = (f / 64).min(hi / 64);
            let key = (lo, done[lo..=hi / 64].to_vec(), next);
            if seen.insert(key) {
                stack.push((i, state, hi));
                state = next;
                resume = 0;
                advanced = true;
                break;
            }
            done[i / 64] &= !(1 << (i % 64));
        }
        if advanced {
            continue;
        }
        if stack.len() >= best.len() {
            best = stack.iter().map(|&(i, _, _)| i).collect();
            best_stuck = (first..end).filter(|&i| !is_done(&done, i)).collect();
        }
        let Some((i, before, _)) = stack.pop() else {
            return Err(Violation {
                key,
                longest_prefix: best.iter().map(|&i| ops[i]).collect(),
                stuck: best_stuck.iter().map(|&i| ops[i]).collect(),
            });
        };
        done[i / 64] &= !(1 << (i % 64));
        state = before;
        first = first.min(i);
        resume = i + 1;
    }
}

/// The shared logical clock of a recorded run.
#[derive(Default)]
pub struct Clock(AtomicU64);

impl Clock {
    /// A fresh timestamp (strictly increasing, totally ordered with every other thread's).
    pub fn now(&self) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst)
    }
}

/// Records one thread's events.
pub struct Recorder<'c> {
    clock: &'c Clock,
    thread: usize,
    pub events: Vec<Event>,
}

impl<'c> Recorder<'c> {
    pub fn new(clock: &'c Clock, thread: usize) -> Self {
        Recorder {
            clock,
            thread,
            events: Vec::new(),
        }
    }

    /// Runs `f` (one operation on `key`) between two timestamps and records it.
    pub fn op(&mut self, key: u64, kind: Kind, f: impl FnOnce() -> Option<u64>) -> Option<u64> {
        let call = self.clock.now();
        let out = f();
        let ret = self.clock.now();
        self.events.push(Event {
            thread: self.thread,
            key,
            kind,
            out,
            call,
            ret,
        });
        out
    }

    /// Runs `f` (a batch of operations) between two timestamps and records each request as
    /// an operation spanning the whole batch.
    pub fn batch(&mut self, f: impl FnOnce() -> Vec<(u64, Kind, Option<u64>)>) {
        let call = self.clock.now();
        let results = f();
        let ret = self.clock.now();
        for (key, kind, out) in results {
            self.events.push(Event {
                thread: self.thread,
                key,
                kind,
                out,
                call,
                ret,
            });
        }
    }
}

#[cfg(test)]
mod self_tests {
    use super::*;

    fn ev(thread: usize, key: u64, kind: Kind, out: Option<u64>, call: u64, ret: u64) -> Event {
        Event {
            thread,
            key,
            kind,
            out,
            call,
            ret,
        }
    }

    #[test]
    fn sequential_history_passes() {
        let h = [
            ev(0, 1, Kind::Insert(10), None, 0, 1),
            ev(0, 1, Kind::Get, Some(10), 2, 3),
            ev(0, 1, Kind::Put(20), Some(10), 4, 5),
            ev(0, 1, Kind::Delete, Some(20), 6, 7),
            ev(0, 1, Kind::Get, None, 8, 9),
        ];
        assert!(check(&h).is_ok());
    }

    #[test]
    fn overlapping_operations_may_take_effect_in_either_order() {
        // The Get overlaps the Put, so it may see either value.
        for seen in [Some(10), Some(20)] {
            let h = [
                ev(0, 1, Kind::Insert(10), None, 0, 1),
                ev(1, 1, Kind::Put(20), Some(10), 2, 5),
                ev(0, 1, Kind::Get, seen, 3, 4),
            ];
            assert!(check(&h).is_ok(), "{seen:?}");
        }
    }

    #[test]
    fn stale_read_after_a_completed_write_fails() {
        let h = [
            ev(0, 1, Kind::Insert(10), None, 0, 1),
            ev(1, 1, Kind::Put(20), Some(10), 2, 3),
            ev(0, 1, Kind::Get, Some(10), 4, 5),
        ];
        let v = check(&h).unwrap_err();
        assert_eq!(v.key, 1);
    }

    #[test]
    fn value_never_written_to_the_key_fails() {
        // The signature of a slot reused by another key: key 1 returns key 4's value.
        let h = [
            ev(0, 1, Kind::Insert(10), None, 0, 1),
            ev(1, 1, Kind::Get, Some(40), 2, 9),
            ev(0, 1, Kind::Delete, Some(10), 3, 4),
            ev(0, 4, Kind::Insert(40), None, 5, 6),
        ];
        assert_eq!(check(&h).unwrap_err().key, 1);
    }

    #[test]
    fn reads_may_not_go_back_in_time() {
        // Two sequential Gets by one reader, both overlapping one Put: new then old is wrong.
        let h = [
            ev(0, 1, Kind::Insert(10), None, 0, 1),
            ev(1, 1, Kind::Put(20), Some(10), 2, 9),
            ev(0, 1, Kind::Get, Some(20), 3, 4),
            ev(0, 1, Kind::Get, Some(10), 5, 6),
        ];
        assert!(check(&h).is_err());
        // Old then new is fine.
        let h = [
            ev(0, 1, Kind::Insert(10), None, 0, 1),
            ev(1, 1, Kind::Put(20), Some(10), 2, 9),
            ev(0, 1, Kind::Get, Some(10), 3, 4),
            ev(0, 1, Kind::Get, Some(20), 5, 6),
        ];
        assert!(check(&h).is_ok());
    }

    #[test]
    fn backtracking_finds_the_only_order() {
        // Two concurrent inserts of one key: exactly one wins, and the other sees the winner.
        let h = [
            ev(0, 1, Kind::Insert(10), Some(20), 0, 5),
            ev(1, 1, Kind::Insert(20), None, 1, 4),
            ev(2, 1, Kind::Get, Some(20), 2, 3),
        ];
        assert!(check(&h).is_ok());
        let h = [
            ev(0, 1, Kind::Insert(10), None, 0, 5),
            ev(1, 1, Kind::Insert(20), None, 1, 4),
        ];
        assert!(check(&h).is_err());
    }

    #[test]
    fn many_overlapping_operations_are_checked_quickly() {
        // 4 threads × 2000 Upserts of distinct values, each pair overlapping its neighbours,
        // with Gets that saw the value written just before: memoisation keeps this linear.
        let mut h = Vec::new();
        let mut t = 0;
        let mut last = None;
        for i in 0..2000u64 {
            h.push(ev((i % 4) as usize, 7, Kind::Upsert(i), last, t, t + 3));
            h.push(ev(4, 7, Kind::Get, Some(i), t + 4, t + 5));
            last = Some(i);
            t += 6;
        }
        assert!(check(&h).is_ok());
    }
}
