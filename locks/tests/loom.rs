//! loom models of the CN-local lock table (DecLock §5.1–5.2): threads of one CN acquire,
//! hand over and release one local lock through the real table and its spin mutex; the CQL
//! lock of the MN is modelled as always granted at once (one CN). Every interleaving keeps
//! mutual exclusion and ends with the lock free.
//!
//! Status: the three models currently stop with loom's "exceeded maximum number of
//! branches" (the waits spin); they are `#[ignore]`d and not in CI until reworked.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p dmem-locks --test loom --release`
//! (CI does, see .ci/run).
#![cfg(loom)]
#![allow(missing_docs)]

use dmem_layout::cql::CqlTimestamp;
use dmem_locks::LockMode;
use dmem_locks::local::{
    CqlHold, FairnessPolicy, LocalAcquire, LocalGrant, LocalLockTable, LocalRelease,
};
use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

const LOCK: u64 = 7;

/// Readers inside (low bits) and writers inside (bit 16).
const WRITER: usize = 1 << 16;

fn model<F: Fn() + Sync + Send + 'static>(preemptions: usize, f: F) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(preemptions);
    // Waiting for a local grant spins (yielding), which loom counts as branches.
    b.max_branches = 50_000;
    b.check(f);
}

/// One client: acquire (waiting by spinning on `poll_grant`), check exclusion, release.
fn client(t: &LocalLockTable, inside: &AtomicUsize, id: u32, mode: LockMode) {
    let ts = CqlTimestamp(id as u16);
    let must_acquire_cql = match t.acquire(LOCK, id, mode, ts).unwrap() {
        LocalAcquire::Joined => false,
        LocalAcquire::AcquireCql => true,
        LocalAcquire::Wait { prefetch } => {
            if let Some(g) = prefetch {
                t.set_remote_ts(LOCK, g, None);
            }
            loop {
                if let Some(g) = t.poll_grant(LOCK, id, None).unwrap() {
                    break g == LocalGrant::AcquireCql;
                }
                thread::yield_now();
            }
        }
    };
    if must_acquire_cql {
        t.cql_acquired(LOCK, mode, 0, None);
    }
    let add = if mode == LockMode::Exclusive {
        WRITER
    } else {
        1
    };
    let before = inside.fetch_add(add, Ordering::SeqCst);
    match mode {
        LockMode::Exclusive => assert_eq!(before, 0, "writer entered next to {before:#x}"),
        LockMode::Shared => assert!(before < WRITER, "reader entered next to a writer"),
    }
    inside.fetch_sub(add, Ordering::SeqCst);
    if let LocalRelease::ReleaseCql { mode } = t.release(LOCK, id).unwrap() {
        t.finish_cql_release(LOCK, mode);
    }
}

fn run(policy: FairnessPolicy, modes: &'static [LockMode]) {
    let t = Arc::new(LocalLockTable::new(policy));
    let inside = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = modes
        .iter()
        .enumerate()
        .skip(1)
        .map(|(i, &mode)| {
            let (t, inside) = (Arc::clone(&t), Arc::clone(&inside));
            thread::spawn(move || client(&t, &inside, i as u32, mode))
        })
        .collect();
    client(&t, &inside, 0, modes[0]);
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(t.inspect(LOCK), (CqlHold::NotHeld, 0, 0), "lock left busy");
}

const X: LockMode = LockMode::Exclusive;
const S: LockMode = LockMode::Shared;

#[test]
#[ignore = "exceeds loom's branch limit (spinning waits); not yet a passing model, see locks/README.md"]
fn two_writers_hand_over_task_fair() {
    model(3, || run(FairnessPolicy::TaskFair, &[X, X]));
}

#[test]
#[ignore = "exceeds loom's branch limit (spinning waits); not yet a passing model, see locks/README.md"]
fn writer_and_two_readers_task_fair() {
    model(2, || run(FairnessPolicy::TaskFair, &[X, S, S]));
}

#[test]
#[ignore = "exceeds loom's branch limit (spinning waits); not yet a passing model, see locks/README.md"]
fn reader_writer_reader_phase_fair() {
    model(2, || run(FairnessPolicy::PhaseFair, &[S, X, S]));
}
