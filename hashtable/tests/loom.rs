//! loom models of the races that matter, on tables of one bin (so everything collides).
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p dmem-hashtable --test loom --release`
//! (CI does, see .ci/run). Each model sets its own preemption bound so the run stays near a
//! minute: 3 for the one-bucket races (bound 2 misses a seqlock bug injected on purpose,
//! bound 3 finds it), 2 for the resize.
#![cfg(loom)]

use dmem_hashtable::{Dlht, Options};
use loom::sync::Arc;
use loom::thread;

/// Explores `f` with at most `preemptions` preemptions per execution.
fn model<F: Fn() + Sync + Send + 'static>(preemptions: usize, f: F) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(preemptions);
    b.check(f);
}

fn one_bin() -> Dlht {
    Dlht::with_options(Options {
        capacity: 0,
        huge_pages: false,
        ..Options::default()
    })
}

/// A Get racing a Put and then a Delete of the same key sees 10, then possibly 20, then
/// possibly nothing — never anything else, and never goes back.
#[test]
fn get_vs_put_then_delete_on_one_bucket() {
    model(3, || {
        let t = Arc::new(one_bin());
        assert_eq!(t.insert(1, 10), None);
        let w = {
            let t = Arc::clone(&t);
            thread::spawn(move || {
                assert_eq!(t.put(1, 20), Some(10));
                assert_eq!(t.delete(1), Some(20));
            })
        };
        let first = t.get(1);
        let second = t.get(1);
        assert!(matches!(first, Some(10) | Some(20) | None), "{first:?}");
        match first {
            Some(10) => assert!(matches!(second, Some(10) | Some(20) | None)),
            Some(20) => assert!(matches!(second, Some(20) | None)),
            _ => assert_eq!(second, None),
        }
        w.join().unwrap();
        assert_eq!(t.get(1), None);
        assert_eq!(t.len(), 0);
    });
}

/// A Get of key 1 racing "delete 1, insert 4" (which reuses 1's slot) never returns 4's value.
#[test]
fn get_vs_delete_and_slot_reuse() {
    model(3, || {
        let t = Arc::new(one_bin());
        for k in 1..=3 {
            assert_eq!(t.insert(k, k * 10), None);
        }
        let w = {
            let t = Arc::clone(&t);
            thread::spawn(move || {
                assert_eq!(t.delete(1), Some(10));
                assert_eq!(t.insert(4, 40), None);
            })
        };
        let got = t.get(1);
        assert!(matches!(got, Some(10) | None), "{got:?}");
        let got4 = t.get(4);
        assert!(matches!(got4, Some(40) | None), "{got4:?}");
        w.join().unwrap();
        assert_eq!(t.get(4), Some(40));
        assert_eq!(t.len(), 3);
    });
}

/// Gets racing a resize (migration of the only bin and the swing of the index) always find
/// the keys; an insert racing the resize is not lost.
#[test]
fn get_and_insert_racing_a_resize() {
    model(2, || {
        let t = Arc::new(one_bin());
        assert_eq!(t.insert(1, 10), None);
        assert_eq!(t.insert(2, 20), None);
        let w = {
            let t = Arc::clone(&t);
            thread::spawn(move || t.reserve(4))
        };
        assert_eq!(t.get(1), Some(10));
        assert_eq!(t.insert(3, 30), None);
        assert_eq!(t.get(2), Some(20));
        w.join().unwrap();
        assert_eq!(t.get(3), Some(30));
        assert_eq!(t.len(), 3);
        assert_eq!(t.iter().count(), 3);
    });
}

/// A batched Get of key 4, which sits in the single-link line (so the batch finishes it in
/// its second stage, from the header its first stage read), racing "delete 4, insert 5"
/// (which reuses 4's slot) never returns 5's value; key 1 in the same batch is found.
#[test]
fn batched_get_of_a_chained_key_vs_slot_reuse() {
    model(3, || {
        let t = Arc::new(one_bin());
        for k in 1..=4 {
            assert_eq!(t.insert(k, k * 10), None);
        }
        let w = {
            let t = Arc::clone(&t);
            thread::spawn(move || {
                assert_eq!(t.delete(4), Some(40));
                assert_eq!(t.insert(5, 50), None);
            })
        };
        let mut out = [None; 2];
        t.pin().get_batch(&[4, 1], &mut out);
        assert!(matches!(out[0], Some(40) | None), "{:?}", out[0]);
        assert_eq!(out[1], Some(10));
        w.join().unwrap();
        assert_eq!(t.get(4), None);
        assert_eq!(t.get(5), Some(50));
        assert_eq!(t.len(), 4);
    });
}
