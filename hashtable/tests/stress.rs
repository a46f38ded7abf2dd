//! Multi-threaded stress with a checker, on a table that starts with one bin (so resizes run
//! concurrently with everything else).
//!
//! Each key goes through: absent → insert returned → delete started → delete returned, and
//! is never re-inserted. Readers check, around every Get:
//! * no lost insert: a key whose insert had returned, and whose delete had not started, is
//!   found, with a value that belongs to it;
//! * no resurrection: a key whose delete had returned is not found;
//! * no torn slot: any value found belongs to the key (values carry their key).
#![cfg(not(loom))]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::thread;

use dmem_hashtable::{Dlht, Op, Options, Request};

const THREADS: u64 = if cfg!(miri) { 2 } else { 4 };
/// Under Miri (every access interpreted) enough keys for a few resizes.
const KEYS_PER_THREAD: u64 = if cfg!(miri) { 100 } else { 60_000 };
const ABSENT: u8 = 0;
const INSERTED: u8 = 1;
const DELETING: u8 = 2;
const DELETED: u8 = 3;

fn value_of(key: u64, generation: u64) -> u64 {
    (key << 16) | (generation & 0xffff)
}

fn rng(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

struct Shared {
    table: Dlht,
    state: Vec<AtomicU8>,
    done: AtomicBool,
}

impl Shared {
    fn check(&self, key: u64, got: Option<u64>, before: u8, after: u8) {
        if let Some(v) = got {
            assert_eq!(v >> 16, key, "value {v:#x} does not belong to key {key}");
            assert_ne!(before, DELETED, "key {key} found after its delete returned");
        } else if before >= INSERTED && after == INSERTED {
            panic!("key {key} lost: inserted before the Get, not being deleted");
        }
    }

    fn read(&self, key: u64) {
        let s = &self.state[key as usize];
        let before = s.load(Ordering::SeqCst);
        let got = self.table.get(key);
        let after = s.load(Ordering::SeqCst);
        self.check(key, got, before, after);
    }
}

#[test]
fn concurrent_inserts_puts_deletes_and_gets_with_resizes() {
    let total = THREADS * KEYS_PER_THREAD;
    let shared = Arc::new(Shared {
        table: Dlht::with_options(Options {
            capacity: 0,
            huge_pages: false,
            ..Options::default()
        }),
        state: (0..total).map(|_| AtomicU8::new(ABSENT)).collect(),
        done: AtomicBool::new(false),
    });

    let writers: Vec<_> = (0..THREADS)
        .map(|t| {
            let sh = Arc::clone(&shared);
            thread::spawn(move || {
                let base = t * KEYS_PER_THREAD;
                let mut seed = 0x9e37_79b9 + t;
                for i in 0..KEYS_PER_THREAD {
                    let k = base + i;
                    // Alternate single inserts and batched inserts.
                    if i % 2 == 0 {
                        assert_eq!(sh.table.insert(k, value_of(k, 0)), None);
                    } else {
                        let mut b = [Request::new(k, Op::Insert(value_of(k, 0)))];
                        sh.table.batch(&mut b);
                        assert_eq!(b[0].result, None);
                    }
                    sh.state[k as usize].store(INSERTED, Ordering::SeqCst);
                    // Our own insert is visible at once.
                    assert_eq!(sh.table.get(k).map(|v| v >> 16), Some(k));
                    // Update an earlier key of ours in place.
                    let j = base + rng(&mut seed) % (i + 1);
                    if sh.state[j as usize].load(Ordering::SeqCst) == INSERTED {
                        assert!(sh.table.put(j, value_of(j, i)).is_some());
                    }
                    // Delete every third key some time after inserting it.
                    if i >= 64 && (i - 64) % 3 == 0 {
                        let d = base + i - 64;
                        sh.state[d as usize].store(DELETING, Ordering::SeqCst);
                        assert_eq!(sh.table.delete(d).map(|v| v >> 16), Some(d));
                        sh.state[d as usize].store(DELETED, Ordering::SeqCst);
                        assert_eq!(sh.table.get(d), None);
                    }
                    // Read a random key of any thread.
                    sh.read(rng(&mut seed) % total);
                }
            })
        })
        .collect();

    // A pure reader using batched Gets.
    let reader = {
        let sh = Arc::clone(&shared);
        thread::spawn(move || {
            let mut seed = 12345u64;
            let mut keys = [0u64; 24];
            let mut out = [None; 24];
            let mut before = [0u8; 24];
            while !sh.done.load(Ordering::SeqCst) {
                for (k, b) in keys.iter_mut().zip(before.iter_mut()) {
                    *k = rng(&mut seed) % total;
                    *b = sh.state[*k as usize].load(Ordering::SeqCst);
                }
                sh.table.pin().get_batch(&keys, &mut out);
                for i in 0..keys.len() {
                    let after = sh.state[keys[i] as usize].load(Ordering::SeqCst);
                    sh.check(keys[i], out[i], before[i], after);
                }
            }
        })
    };

    for w in writers {
        w.join().expect("writer panicked");
    }
    shared.done.store(true, Ordering::SeqCst);
    reader.join().expect("reader panicked");

    // Final state: exactly the keys not deleted, each with a value of its own.
    let t = &shared.table;
    let mut live = 0;
    for k in 0..total {
        let st = shared.state[k as usize].load(Ordering::SeqCst);
        let got = t.get(k);
        match st {
            DELETED => assert_eq!(got, None, "deleted key {k} present"),
            INSERTED => {
                assert_eq!(got.map(|v| v >> 16), Some(k), "key {k} lost");
                live += 1;
            }
            other => panic!("key {k} in state {other} after the run"),
        }
    }
    assert_eq!(t.len(), live);
    assert_eq!(t.iter().count(), live);
}
