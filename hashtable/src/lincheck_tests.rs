//! The linearizability checker (`tests/lincheck`) against a planted bug: a Get that skips
//! the version re-check. The race is forced deterministically: the reader is paused after it
//! matched key 1's key word and before it loads the value, while another thread deletes key 1
//! and inserts key 4 into the freed slot. The buggy Get then returns key 4's value for key 1,
//! which the checker must reject; the real Get notices the changed version, retries, and
//! returns a linearizable result.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::vec::Vec;

use crate::hash::mix64;
use crate::raw::Matcher;
use crate::{Dlht, Options};

#[path = "../tests/lincheck/mod.rs"]
mod lincheck;

use lincheck::{Clock, Event, Kind, Recorder, check};

/// A matcher that pauses the first time a key word matches; `RECHECK = false` plants the bug.
struct PauseOnce<const RECHECK: bool> {
    armed: AtomicBool,
    barrier: Arc<Barrier>,
}

impl<const R: bool> Matcher for PauseOnce<R> {
    const RECHECK: bool = R;

    fn matches(&self, _value: u64) -> bool {
        true
    }

    fn key_matched(&self) {
        if self.armed.swap(false, Ordering::Relaxed) {
            self.barrier.wait(); // let the writer run
            self.barrier.wait(); // until it has deleted 1 and inserted 4
        }
    }
}

/// Runs the forced race and returns the recorded history and what the Get of key 1 returned.
fn forced_race<const RECHECK: bool>() -> (Vec<Event>, Option<u64>) {
    let table = Arc::new(Dlht::with_options(Options {
        capacity: 0,
        huge_pages: false,
        ..Options::default()
    }));
    let clock = Arc::new(Clock::default());
    let barrier = Arc::new(Barrier::new(2));
    let mut main = Recorder::new(&clock, 0);
    // One bin: keys 1, 2, 3 fill the primary slots 0, 1, 2.
    for k in 1..=3 {
        main.op(k, Kind::Insert(k * 10), || table.insert(k, k * 10));
    }
    let writer = {
        let (table, clock, barrier) = (table.clone(), clock.clone(), barrier.clone());
        thread::spawn(move || {
            let mut rec = Recorder::new(&clock, 1);
            barrier.wait();
            rec.op(1, Kind::Delete, || table.delete(1));
            // The first free slot is key 1's old slot 0.
            rec.op(4, Kind::Insert(40), || table.insert(4, 40));
            barrier.wait();
            rec.events
        })
    };
    let matcher = PauseOnce::<RECHECK> {
        armed: AtomicBool::new(true),
        barrier,
    };
    let got = main.op(1, Kind::Get, || {
        let raw = table.raw();
        let pin = raw.pin();
        raw.get_in(raw.index(&pin), 1, mix64(1), &matcher)
    });
    let mut history = main.events;
    history.extend(writer.join().expect("writer"));
    (history, got)
}

#[test]
fn checker_catches_a_get_that_skips_the_version_recheck() {
    let (history, got) = forced_race::<false>();
    assert_eq!(
        got,
        Some(40),
        "the planted bug returns key 4's value for key 1"
    );
    let violation = check(&history).expect_err("the checker must reject this history");
    assert_eq!(violation.key, 1);
    std::println!("{violation}");
}

#[test]
fn checker_passes_the_real_get_in_the_same_race() {
    let (history, got) = forced_race::<true>();
    assert_eq!(got, None, "the real Get retries after the delete");
    check(&history).expect("the real table's history is linearizable");
}
