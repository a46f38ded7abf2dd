//! One dmem crate picked into another program: the DLHT hashtable (`dmem-hashtable`) as a
//! plain concurrent `u64 → u64` map, with nothing of the CLI, the fabrics or the protocols.
//!
//! Two threads insert disjoint key ranges into a table that starts far too small (so it
//! resizes under them), then one thread reads every key back with batched Gets and mixes
//! Upserts, Deletes and Gets in one batch. Every result is checked against
//! `std::collections::HashMap`; any mismatch panics, so the process exits non-zero.

use std::collections::HashMap;
use std::thread;

use dmem_hashtable::{Dlht, Op, Request};

/// Keys each writer thread inserts.
const KEYS_PER_WRITER: u64 = 50_000;
/// Writer threads (disjoint key ranges).
const WRITERS: u64 = 2;
/// Keys per batched Get (the table prefetches a window of buckets, then reads them).
const BATCH: usize = 24;

/// The value stored for `key` (distinct from the key, so a swapped slot shows).
fn value_of(key: u64) -> u64 {
    key.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
}

fn main() {
    // Room for 1 000 entries: the 100 000 inserts below resize it many times while the
    // writers run (readers never wait for a resize; writers wait only for their bin's copy).
    let table = Dlht::with_capacity(1_000);

    thread::scope(|s| {
        for w in 0..WRITERS {
            let table = &table;
            s.spawn(move || {
                // One guard (epoch announcement) per thousand operations, not forever: a live
                // guard keeps indexes retired by a resize from being freed.
                for start in (w * KEYS_PER_WRITER..(w + 1) * KEYS_PER_WRITER).step_by(1_000) {
                    let guard = table.pin();
                    for key in start..start + 1_000 {
                        assert_eq!(guard.insert(key, value_of(key)), None, "key {key} twice");
                    }
                }
            });
        }
    });
    let total = WRITERS * KEYS_PER_WRITER;
    assert_eq!(table.len() as u64, total, "lost inserts");
    assert!(table.capacity() as u64 >= total, "the table did not grow");

    // Batched Gets over present keys and, past `total`, absent ones.
    let keys: Vec<u64> = (0..total + 1_000).collect();
    let mut out = [None; BATCH];
    let guard = table.pin();
    for chunk in keys.chunks(BATCH) {
        guard.get_batch(chunk, &mut out);
        for (&key, &got) in chunk.iter().zip(&out) {
            let want = (key < total).then(|| value_of(key));
            assert_eq!(got, want, "batched Get of key {key}");
        }
    }
    drop(guard);

    // A mixed batch, executed in order: its results match a HashMap doing the same.
    let mut model: HashMap<u64, u64> = (0..total).map(|k| (k, value_of(k))).collect();
    let mut batch = [
        Request::new(7, Op::Upsert(70)),
        Request::new(7, Op::Get),
        Request::new(8, Op::Delete),
        Request::new(8, Op::Get),
        Request::new(total + 5, Op::Insert(5)),
        Request::new(total + 5, Op::Put(6)),
        Request::new(total + 5, Op::Get),
    ];
    table.pin().batch(&mut batch);
    for r in &batch {
        let want = match r.op {
            Op::Get => model.get(&r.key).copied(),
            Op::Upsert(v) => model.insert(r.key, v),
            Op::Insert(v) => match model.get(&r.key) {
                Some(&old) => Some(old),
                None => model.insert(r.key, v),
            },
            Op::Put(v) => model.get_mut(&r.key).map(|slot| std::mem::replace(slot, v)),
            Op::Delete => model.remove(&r.key),
        };
        assert_eq!(r.result, want, "{r:?}");
    }
    assert_eq!(table.len(), model.len(), "length after the mixed batch");
    for (&key, &value) in &model {
        assert_eq!(table.get(key), Some(value), "final value of key {key}");
    }

    let usage = table.memory_usage();
    println!(
        "ok: {total} concurrent inserts across resizes, {} batched Gets, a mixed batch of {}; \
         {:.1} bytes per entry",
        keys.len(),
        batch.len(),
        usage.bytes_per_entry()
    );
}
