//! loom models of the CN-local lock table (DecLock §5.1–5.2): threads of one CN acquire,
//! hand over and release one local lock through the real table and its spin mutex; the CQL
//! lock of the MN is modelled as granted at once (one CN), so `Releasing` is the short
//! window between [`LocalRelease::ReleaseCql`] and `finish_cql_release`. Every interleaving
//! keeps mutual exclusion inside the critical section, ends with the lock free, and the
//! hand-over paths are reached (counted across executions and asserted after the check).
//!
//! A waiting client waits the way `DecLockClient::wait_local` does: it polls
//! `poll_grant` with a waker and parks until a grant wakes it. Here [`block_on`] polls with
//! a waker that unparks through a `loom::sync::Notify`, so a grant that never comes, or a
//! lost wake-up, is a loom deadlock, and each wait is a bounded number of steps.
//!
//! Why not spin on `poll_grant`: the earlier models did, and loom stopped with "exceeded
//! maximum number of branches". The cause is the pairing of that busy-poll with the spin
//! mutex's test-and-test-and-set read: every poll takes and frees the shard mutex, writing
//! a fresh `true` then `false` to `locked`, and loom lets the other thread's relaxed read in
//! the inner `while locked.load(..)` loop return any store it has not seen yet, so it can
//! keep reading the poller's newest `true`, yield, let the poller run (no preemption is
//! spent on a yield) and repeat — an infinite execution within any preemption bound. Real
//! hardware makes the `false` visible, and the crate never busy-polls (it parks on a waker),
//! so this is not a livelock of the table; with the waker path there is a bounded number of
//! mutex sections per thread and every execution is finite.
//!
//! Bounds: preemption bound 3 for the two-thread model, 2 for the three-thread ones (3
//! takes about 50 s each on their own). Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p dmem-locks --test loom --release` (CI does, see
//! .ci/run): about 2 s once built.
#![cfg(loom)]
#![allow(missing_docs)]

use core::task::{Context, Poll, Waker};
use std::sync::atomic::AtomicUsize as StdAtomicUsize;
use std::task::Wake;

use dmem_layout::cql::CqlTimestamp;
use dmem_locks::LockMode;
use dmem_locks::local::{
    CqlHold, FairnessPolicy, LocalAcquire, LocalGrant, LocalLockTable, LocalRelease,
};
use loom::sync::Arc;
use loom::sync::Notify;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

const LOCK: u64 = 7;

/// Readers inside (low bits) and writers inside (bit 16).
const WRITER: usize = 1 << 16;

const X: LockMode = LockMode::Exclusive;
const S: LockMode = LockMode::Shared;

/// How the clients of one model got the lock, summed over all its executions.
#[derive(Default)]
struct Paths {
    /// Local grants that came with the CN's CQL hold (hand-over or reader sharing).
    with_cql: StdAtomicUsize,
    /// Local grants after the CQL release (the waiter reacquires it).
    acquire_cql: StdAtomicUsize,
    /// Readers that joined the CN's shared ownership without waiting.
    joined: StdAtomicUsize,
}

/// A waker that unparks the thread parked in [`block_on`].
struct Unpark(Notify);

impl Wake for Unpark {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.notify();
    }

    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.0.notify();
    }
}

/// Polls `poll` until it is ready, parking on a loom `Notify` between polls (an executor
/// with one task, as a CN client's coroutine waits for its waker).
fn block_on<T>(mut poll: impl FnMut(&mut Context<'_>) -> Poll<T>) -> T {
    let unpark = std::sync::Arc::new(Unpark(Notify::new()));
    let waker = Waker::from(std::sync::Arc::clone(&unpark));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = poll(&mut cx) {
            return v;
        }
        unpark.0.wait();
    }
}

/// Explores `f` with at most `preemptions` preemptions per execution; loom's default
/// branch limit (1,000) is plenty once waits park.
fn model<F: Fn() + Sync + Send + 'static>(preemptions: usize, f: F) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(preemptions);
    b.check(f);
}

/// One client: acquire (parking on the table's waker path while waiting), check exclusion,
/// release.
fn client(t: &LocalLockTable, inside: &AtomicUsize, paths: &Paths, id: u32, mode: LockMode) {
    let ts = CqlTimestamp(id as u16);
    let must_acquire_cql = match t.acquire(LOCK, id, mode, ts).unwrap() {
        LocalAcquire::Joined => {
            paths.joined.fetch_add(1, Ordering::Relaxed);
            false
        }
        LocalAcquire::AcquireCql => true,
        LocalAcquire::Wait { prefetch } => {
            if let Some(g) = prefetch {
                // The prefetch READ finds no remote waiter (one CN).
                t.set_remote_ts(LOCK, g, None);
            }
            let grant = block_on(
                |cx| match t.poll_grant(LOCK, id, Some(cx.waker())).unwrap() {
                    Some(g) => Poll::Ready(g),
                    None => Poll::Pending,
                },
            );
            let counter = match grant {
                LocalGrant::WithCql => &paths.with_cql,
                LocalGrant::AcquireCql => &paths.acquire_cql,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            grant == LocalGrant::AcquireCql
        }
    };
    if must_acquire_cql {
        t.cql_acquired(LOCK, mode, 0, None);
    }
    let add = if mode == X { WRITER } else { 1 };
    let before = inside.fetch_add(add, Ordering::SeqCst);
    match mode {
        X => assert_eq!(before, 0, "writer entered next to {before:#x}"),
        S => assert!(before < WRITER, "reader entered next to a writer"),
    }
    inside.fetch_sub(add, Ordering::SeqCst);
    if let LocalRelease::ReleaseCql { mode } = t.release(LOCK, id).unwrap() {
        t.finish_cql_release(LOCK, mode);
    }
}

/// Client 0 runs on the model's main thread, the others on spawned threads.
fn run(policy: FairnessPolicy, modes: &'static [LockMode], paths: &'static Paths) {
    let t = Arc::new(LocalLockTable::new(policy));
    let inside = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = modes
        .iter()
        .enumerate()
        .skip(1)
        .map(|(i, &mode)| {
            let (t, inside) = (Arc::clone(&t), Arc::clone(&inside));
            thread::spawn(move || client(&t, &inside, paths, i as u32, mode))
        })
        .collect();
    client(&t, &inside, paths, 0, modes[0]);
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(t.inspect(LOCK), (CqlHold::NotHeld, 0, 0), "lock left busy");
}

fn paths() -> &'static Paths {
    Box::leak(Box::default())
}

/// Two writers: the second waits while the first holds the lock, or while it is still
/// acquiring or already releasing the CQL lock, and gets it by local hand-over (with the
/// CQL hold) or after the CQL release.
#[test]
fn two_writers_hand_over_task_fair() {
    let p = paths();
    model(3, move || run(FairnessPolicy::TaskFair, &[X, X], p));
    assert!(p.with_cql.load(Ordering::Relaxed) > 0, "no local hand-over");
    assert!(
        p.acquire_cql.load(Ordering::Relaxed) > 0,
        "no reacquisition"
    );
}

/// A writer and two readers: readers wait behind the writer, the writer's release passes
/// ownership to the first reader (a CQL reacquisition: modes differ), which shares with the
/// other if it waits, while the second reader's acquisition races that hand-over (it may
/// wait, be shared in, or join).
#[test]
fn writer_and_two_readers_task_fair() {
    let p = paths();
    model(2, move || run(FairnessPolicy::TaskFair, &[X, S, S], p));
    assert!(
        p.with_cql.load(Ordering::Relaxed) > 0,
        "no reader shared in"
    );
    assert!(p.joined.load(Ordering::Relaxed) > 0, "no reader joined");
}

/// Phase-fair: a reader, a writer, a reader. A waiting writer keeps later readers out of
/// the shared hold; after the writer, waiting readers go first.
#[test]
fn reader_writer_reader_phase_fair() {
    let p = paths();
    model(2, move || run(FairnessPolicy::PhaseFair, &[S, X, S], p));
    assert!(
        p.with_cql.load(Ordering::Relaxed) > 0,
        "no local grant with the hold"
    );
    assert!(
        p.acquire_cql.load(Ordering::Relaxed) > 0,
        "no reacquisition"
    );
}

/// Three writers: the holder's release hands the lock (with the CQL hold) to the first
/// waiter while the third writer's acquisition races that hand-over.
#[test]
fn hand_over_races_a_new_writer_task_fair() {
    let p = paths();
    model(2, move || run(FairnessPolicy::TaskFair, &[X, X, X], p));
    assert!(p.with_cql.load(Ordering::Relaxed) > 0, "no local hand-over");
}

// ---- LOTUS CN lock table (LOTUS §4.1 Alg. 1, §6) ----

mod lotus_table {
    use super::model;
    use dmem_locks::LockMode;
    use dmem_locks::lotus::{Acquired, Holder, LotusLockTable, Refusal};
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicUsize, Ordering};
    use loom::thread;

    const X: LockMode = LockMode::Exclusive;
    const S: LockMode = LockMode::Shared;

    /// Two transactions on two cores write-lock the same key (one bucket, so their CASes
    /// meet on one slot) and a third reads a key of the same bucket: at most one writer
    /// is ever inside, and after every release the slots and state are empty.
    #[test]
    fn writers_exclude_and_slots_drain() {
        model(3, || {
            let t = Arc::new(LotusLockTable::new(1, 2));
            let inside = Arc::new(AtomicUsize::new(0));
            let handles: Vec<_> = (0..2u64)
                .map(|i| {
                    let (t, inside) = (Arc::clone(&t), Arc::clone(&inside));
                    thread::spawn(move || {
                        let me = Holder {
                            txn: i,
                            cn: i as u16,
                        };
                        if t.acquire(7, X, me) == Acquired::Granted {
                            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                            inside.fetch_sub(1, Ordering::SeqCst);
                            assert!(t.release(7, me));
                        }
                    })
                })
                .collect();
            let me = Holder { txn: 9, cn: 2 };
            if t.acquire(8, S, me).is_held() {
                assert!(t.release(8, me));
            }
            for h in handles {
                h.join().unwrap();
            }
            assert!(t.slots_free());
            assert_eq!(t.held(), 0);
        });
    }

    /// Two cores of one CN on one slot, through the slot's CPU CAS alone (the step of
    /// Alg. 1 every lock and unlock ends in; `slot_lock`/`slot_unlock`, no bucket mutex):
    /// the slot holds 125 readers; core A adds a reader, then a second one, which
    /// overflows unless core B released in between; core B takes a reader and releases
    /// it, then tries a write lock, which must be refused while any reader is in. Every
    /// interleaving ends with the counter exact (`2r` for `r` readers): a CAS replaced by a
    /// load and a store loses an update and fails here.
    #[test]
    fn one_slot_counts_readers_exactly_under_cas() {
        // 125 readers filled in first: about 1,100 atomic steps on one thread, above
        // loom's default branch limit.
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.max_branches = 20_000;
        b.check(|| {
            let t = Arc::new(LotusLockTable::new(1, 1));
            const KEY: u64 = 11;
            for _ in 0..125 {
                t.slot_lock(KEY, S).unwrap();
            }
            // A refusal is an overflow or a CAS that lost to the other core (`Conflict`:
            // the slot changed under it; LOTUS aborts rather than retries).
            let refused = |r: Result<(), Refusal>| {
                assert!(
                    matches!(r, Ok(()) | Err(Refusal::TooManyReaders | Refusal::Conflict)),
                    "{r:?}"
                );
                r.is_err()
            };
            let t2 = Arc::clone(&t);
            let b = thread::spawn(move || {
                if !refused(t2.slot_lock(KEY, S)) {
                    t2.slot_unlock(KEY, S);
                }
                // Readers are in (the 125 at least): a writer is refused, never granted.
                assert!(t2.slot_lock(KEY, X).is_err());
            });
            let first = t.slot_lock(KEY, S);
            let second = t.slot_lock(KEY, S);
            b.join().unwrap();
            let mine = u64::from(!refused(first)) + u64::from(!refused(second));
            // B's reader came and went: the counter is exactly A's readers and the 125.
            assert_eq!(t.slot_of(KEY) >> 56, 2 * (125 + mine));
            for _ in 0..125 + mine {
                t.slot_unlock(KEY, S);
            }
            assert!(t.slots_free());
        });
    }

    /// A writer and a reader on one slot through the CAS alone: never both in, and the
    /// slot ends free.
    #[test]
    fn one_slot_writer_and_reader_exclude_under_cas() {
        model(3, || {
            let t = Arc::new(LotusLockTable::new(1, 1));
            let inside = Arc::new(AtomicUsize::new(0));
            let (t2, inside2) = (Arc::clone(&t), Arc::clone(&inside));
            let w = thread::spawn(move || {
                if t2.slot_lock(3, X).is_ok() {
                    assert_eq!(inside2.fetch_add(2, Ordering::SeqCst), 0);
                    inside2.fetch_sub(2, Ordering::SeqCst);
                    t2.slot_unlock(3, X);
                }
            });
            if t.slot_lock(3, S).is_ok() {
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst) & 2, 0);
                inside.fetch_sub(1, Ordering::SeqCst);
                t.slot_unlock(3, S);
            }
            w.join().unwrap();
            assert!(t.slots_free());
        });
    }

    /// A retransmitted read-lock request served by two cores at once counts the reader
    /// once; one unlock (and its duplicate) frees the slot.
    #[test]
    fn duplicate_requests_are_idempotent() {
        model(3, || {
            let t = Arc::new(LotusLockTable::new(1, 1));
            let me = Holder { txn: 1, cn: 0 };
            let t2 = Arc::clone(&t);
            let dup = thread::spawn(move || t2.acquire(3, S, me));
            let a = t.acquire(3, S, me);
            let b = dup.join().unwrap();
            assert!(a.is_held() || b.is_held());
            assert!(
                matches!((a, b), (Acquired::Granted, _) | (_, Acquired::Granted)),
                "{a:?} {b:?}"
            );
            assert!(!matches!((a, b), (Acquired::Granted, Acquired::Granted)));
            assert!(t.slot_of(3) >> 56 == 2);
            let t2 = Arc::clone(&t);
            let dup = thread::spawn(move || t2.release(3, me));
            let r1 = t.release(3, me);
            let r2 = dup.join().unwrap();
            assert!(r1 ^ r2);
            assert!(t.slots_free());
        });
    }

    /// Recovery fences CN 1 and releases its locks while CN 1's last request is being
    /// served on another core: whatever the interleaving, CN 1 ends holding nothing and
    /// the slot is free, and a survivor's lock survives.
    #[test]
    fn recovery_races_a_failed_cns_request() {
        model(3, || {
            let t = Arc::new(LotusLockTable::new(1, 2));
            let survivor = Holder { txn: 5, cn: 0 };
            assert_eq!(t.acquire(4, S, survivor), Acquired::Granted);
            let failed = Holder { txn: 1, cn: 1 };
            let t2 = Arc::clone(&t);
            let late = thread::spawn(move || t2.acquire(4, S, failed));
            t.fence(1);
            t.release_cn(1);
            let r = late.join().unwrap();
            assert!(matches!(
                r,
                Acquired::Granted | Acquired::Refused(Refusal::Fenced)
            ));
            if r == Acquired::Granted {
                // Granted before the fence: the release above or this one frees it.
                t.release_cn(1);
            }
            assert_eq!(t.holders(4), vec![(survivor, S)]);
            assert_eq!(t.slot_of(4) >> 56, 2);
            assert!(t.release(4, survivor));
            assert!(t.slots_free());
        });
    }
}
