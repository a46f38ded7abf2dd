//! Concurrent histories of the real table, checked for linearizability.
//!
//! Each round starts a table with one bin, so the rounds' Gets, Inserts, Puts, Upserts and
//! Deletes (single and batched) run concurrently with resizes. Every operation is recorded
//! with the logical times of its invocation and return, and the history is checked by the
//! Wing–Gong/Lowe checker in `tests/lincheck` key by key. Keys come from a small range so
//! that operations on one key overlap often; deletes free slots that later inserts reuse.
//! The checker itself is tested against hand-written histories and a planted bug (a Get that
//! skips the version re-check) in `src/lincheck_tests.rs`.
#![cfg(not(loom))]

mod lincheck;

use std::thread;

use dmem_hashtable::{Dlht, Op, Options, Request};
use lincheck::{Clock, Kind, Recorder, check};

const THREADS: usize = 4;
/// Operations per thread and round (a debug-build run of the file takes seconds on an idle
/// 2-core machine; the checker itself is linear here thanks to its memo).
const OPS_PER_THREAD: u64 = 8_000;
/// Operations of each reader and of the writer in the one-bin test.
const ONE_BIN_OPS: u64 = 12_000;
const ROUNDS: u64 = 4;

fn rng(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn kind_of(op: Op) -> Kind {
    match op {
        Op::Get => Kind::Get,
        Op::Insert(v) => Kind::Insert(v),
        Op::Put(v) => Kind::Put(v),
        Op::Upsert(v) => Kind::Upsert(v),
        Op::Delete => Kind::Delete,
    }
}

fn random_op(seed: &mut u64, value: u64) -> Op {
    match rng(seed) % 10 {
        0..=3 => Op::Get,
        4 | 5 => Op::Insert(value),
        6 => Op::Put(value),
        7 => Op::Upsert(value),
        _ => Op::Delete,
    }
}

/// One round: `THREADS` threads × `ops` operations on keys `0..keys`; returns the history.
fn round(round: u64, keys: u64, ops: u64) -> Vec<lincheck::Event> {
    let table = Dlht::with_options(Options {
        capacity: 0,
        huge_pages: false,
        ..Options::default()
    });
    let clock = Clock::default();
    let mut history = Vec::new();
    thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (table, clock) = (&table, &clock);
                s.spawn(move || {
                    let mut rec = Recorder::new(clock, t);
                    let mut seed = 0x9e37_79b9_7f4a_7c15 ^ (round << 8) ^ t as u64;
                    let mut i = 0;
                    while i < ops {
                        // Values are unique per operation, so a value read names its write.
                        let value = (t as u64) << 40 | round << 32 | i;
                        if rng(&mut seed).is_multiple_of(8) {
                            // A batch of up to 8 requests (batches execute in order, so the
                            // checker's treating them as concurrent is sound, only weaker).
                            let n = 1 + rng(&mut seed) % 8;
                            let mut reqs: Vec<Request> = (0..n)
                                .map(|j| {
                                    let key = rng(&mut seed) % keys;
                                    Request::new(key, random_op(&mut seed, value + (j << 20)))
                                })
                                .collect();
                            rec.batch(|| {
                                table.pin().batch(&mut reqs);
                                reqs.iter()
                                    .map(|r| (r.key, kind_of(r.op), r.result))
                                    .collect()
                            });
                            i += n;
                        } else {
                            let key = rng(&mut seed) % keys;
                            let op = random_op(&mut seed, value);
                            rec.op(key, kind_of(op), || match op {
                                Op::Get => table.get(key),
                                Op::Insert(v) => table.insert(key, v),
                                Op::Put(v) => table.put(key, v),
                                Op::Upsert(v) => table.upsert(key, v),
                                Op::Delete => table.delete(key),
                            });
                            i += 1;
                        }
                    }
                    rec.events
                })
            })
            .collect();
        for h in handles {
            history.extend(h.join().expect("worker panicked"));
        }
    });
    history
}

#[test]
fn concurrent_histories_with_resizes_are_linearizable() {
    for r in 0..ROUNDS {
        // Alternate a few hot keys (long overlapping chains per key) with more keys (more
        // bins, so the table keeps resizing during the round).
        let keys = if r.is_multiple_of(2) { 16 } else { 4096 };
        let history = round(r, keys, OPS_PER_THREAD);
        if let Err(v) = check(&history) {
            panic!("round {r} ({keys} keys): {v}");
        }
    }
}

#[test]
fn gets_racing_one_writer_on_one_bin_are_linearizable() {
    // Three readers and one writer that cycles delete/insert through the three primary slots
    // of a single bin: the slot-reuse race the version re-check exists for.
    let table = Dlht::with_options(Options {
        capacity: 0,
        huge_pages: false,
        ..Options::default()
    });
    let clock = Clock::default();
    let mut history = Vec::new();
    thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut rec = Recorder::new(&clock, 0);
            for k in 0..3 {
                rec.op(k, Kind::Insert(k), || table.insert(k, k));
            }
            for i in 3..ONE_BIN_OPS {
                let old = i - 3;
                rec.op(old % 6, Kind::Delete, || table.delete(old % 6));
                rec.op(i % 6, Kind::Insert(i), || table.insert(i % 6, i));
            }
            rec.events
        });
        let readers: Vec<_> = (1..4)
            .map(|t| {
                let (table, clock) = (&table, &clock);
                s.spawn(move || {
                    let mut rec = Recorder::new(clock, t);
                    let mut seed = 77 + t as u64;
                    for _ in 0..ONE_BIN_OPS {
                        let k = rng(&mut seed) % 6;
                        rec.op(k, Kind::Get, || table.get(k));
                    }
                    rec.events
                })
            })
            .collect();
        history.extend(writer.join().expect("writer"));
        for r in readers {
            history.extend(r.join().expect("reader"));
        }
    });
    check(&history).expect("linearizable");
}
