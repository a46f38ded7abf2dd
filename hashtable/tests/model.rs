//! Random operation sequences against `std::collections::HashMap` (the model).
#![cfg(not(loom))]

use std::collections::HashMap;

use dmem_hashtable::{BoxedMap, Dlht, Op, Options, Request, Sizing};
use quickcheck::{Arbitrary, Gen};
use quickcheck_macros::quickcheck;

#[derive(Clone, Debug)]
enum Action {
    Get(u64),
    Insert(u64, u64),
    Put(u64, u64),
    Upsert(u64, u64),
    Delete(u64),
    Batch(Vec<(u64, u8, u64)>),
    Iterate,
}

/// Keys from a small range so that operations meet, plus some arbitrary ones.
fn key(g: &mut Gen) -> u64 {
    if bool::arbitrary(g) {
        u64::arbitrary(g) % 64
    } else {
        u64::arbitrary(g)
    }
}

impl Arbitrary for Action {
    fn arbitrary(g: &mut Gen) -> Self {
        match u8::arbitrary(g) % 13 {
            0 | 1 => Action::Get(key(g)),
            2..=4 => Action::Insert(key(g), u64::arbitrary(g)),
            5 => Action::Put(key(g), u64::arbitrary(g)),
            6 | 7 => Action::Upsert(key(g), u64::arbitrary(g)),
            8 | 9 => Action::Delete(key(g)),
            10 | 11 => {
                let n = usize::arbitrary(g) % 40;
                Action::Batch(
                    (0..n)
                        .map(|_| (key(g), u8::arbitrary(g), u64::arbitrary(g)))
                        .collect(),
                )
            }
            _ => Action::Iterate,
        }
    }
}

fn model_op(m: &mut HashMap<u64, u64>, key: u64, op: Op) -> Option<u64> {
    match op {
        Op::Get => m.get(&key).copied(),
        Op::Insert(v) => match m.get(&key) {
            Some(&old) => Some(old),
            None => {
                m.insert(key, v);
                None
            }
        },
        Op::Put(v) => m.get_mut(&key).map(|slot| std::mem::replace(slot, v)),
        Op::Upsert(v) => m.insert(key, v),
        Op::Delete => m.remove(&key),
    }
}

fn to_op(kind: u8, v: u64) -> Op {
    match kind % 5 {
        0 => Op::Get,
        1 => Op::Insert(v),
        2 => Op::Put(v),
        3 => Op::Upsert(v),
        _ => Op::Delete,
    }
}

fn check(actions: Vec<Action>, options: Options) -> bool {
    let t = Dlht::with_options(options);
    let mut m = HashMap::new();
    for a in actions {
        match a {
            Action::Get(k) => assert_eq!(t.get(k), m.get(&k).copied(), "get {k}"),
            Action::Insert(k, v) => assert_eq!(t.insert(k, v), model_op(&mut m, k, Op::Insert(v))),
            Action::Put(k, v) => assert_eq!(t.put(k, v), model_op(&mut m, k, Op::Put(v))),
            Action::Upsert(k, v) => assert_eq!(t.upsert(k, v), model_op(&mut m, k, Op::Upsert(v))),
            Action::Delete(k) => assert_eq!(t.delete(k), model_op(&mut m, k, Op::Delete)),
            Action::Batch(reqs) => {
                let mut batch: Vec<Request> = reqs
                    .iter()
                    .map(|&(k, kind, v)| Request::new(k, to_op(kind, v)))
                    .collect();
                t.batch(&mut batch);
                for r in &batch {
                    assert_eq!(r.result, model_op(&mut m, r.key, r.op), "batched {r:?}");
                }
            }
            Action::Iterate => {
                let mut seen: Vec<(u64, u64)> = t.iter().collect();
                seen.sort_unstable();
                let mut want: Vec<(u64, u64)> = m.iter().map(|(&k, &v)| (k, v)).collect();
                want.sort_unstable();
                assert_eq!(seen, want);
            }
        }
        assert_eq!(t.len(), m.len());
    }
    let mut seen: Vec<(u64, u64)> = t.iter().collect();
    seen.sort_unstable();
    let mut want: Vec<(u64, u64)> = m.into_iter().collect();
    want.sort_unstable();
    seen == want
}

#[quickcheck]
fn matches_hashmap_from_one_bin(actions: Vec<Action>) -> bool {
    // Starts with a single bin, so sequences exercise chaining and many resizes.
    check(
        actions,
        Options {
            capacity: 0,
            huge_pages: false,
            ..Options::default()
        },
    )
}

#[quickcheck]
fn matches_hashmap_presized(actions: Vec<Action>) -> bool {
    check(
        actions,
        Options {
            capacity: 4096,
            huge_pages: true,
            ..Options::default()
        },
    )
}

#[quickcheck]
fn matches_hashmap_fast_sizing_from_one_bin(actions: Vec<Action>) -> bool {
    check(
        actions,
        Options {
            capacity: 0,
            huge_pages: false,
            sizing: Sizing::Fast,
        },
    )
}

#[quickcheck]
fn boxed_map_matches_hashmap(ops: Vec<(u8, u16, u32)>) -> bool {
    // String keys and heap values exercise the indirection and record reclamation.
    let t: BoxedMap<String, Vec<u32>> = BoxedMap::new();
    let mut m: HashMap<String, Vec<u32>> = HashMap::new();
    let g = t.pin();
    for (kind, k, v) in ops {
        let key = format!("key-{}", k % 50);
        match kind % 4 {
            0 => assert_eq!(g.get(&key), m.get(&key)),
            1 => {
                let inserted = g.insert(key.clone(), vec![v]);
                assert_eq!(inserted, !m.contains_key(&key));
                m.entry(key).or_insert(vec![v]);
            }
            2 => assert_eq!(
                g.upsert(key.clone(), vec![v, v]).cloned(),
                m.insert(key, vec![v, v])
            ),
            _ => assert_eq!(g.remove(&key).cloned(), m.remove(&key)),
        }
        assert_eq!(t.len(), m.len());
    }
    let mut seen: Vec<(String, Vec<u32>)> = g
        .entries()
        .into_iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    seen.sort();
    let mut want: Vec<(String, Vec<u32>)> = m.into_iter().collect();
    want.sort();
    seen == want
}

#[test]
fn grows_from_one_bin_to_a_hundred_thousand_keys() {
    let t = Dlht::new();
    // Miri interprets every access: 500 keys still cross several resizes from one bin.
    let n = if cfg!(miri) { 500u64 } else { 100_000u64 };
    for k in 0..n {
        assert_eq!(t.insert(k, k * 3), None);
    }
    assert_eq!(t.len(), n as usize);
    for k in 0..n {
        assert_eq!(t.get(k), Some(k * 3), "key {k}");
    }
    assert!(t.capacity() >= n as usize);
    for k in (0..n).step_by(2) {
        assert_eq!(t.delete(k), Some(k * 3));
    }
    assert_eq!(t.len(), n as usize / 2);
    assert_eq!(t.iter().count(), n as usize / 2);
    let mem = t.memory_usage();
    assert!(mem.reserved_bytes >= mem.bins * 64);
    assert!(mem.bytes_per_entry() > 0.0);
}

#[test]
fn colliding_hashes_in_boxed_map_are_told_apart_by_key() {
    use std::hash::{BuildHasher, Hasher};
    /// Every key hashes to the same value.
    #[derive(Clone, Copy, Default)]
    struct Constant;
    struct ConstHasher;
    impl Hasher for ConstHasher {
        fn write(&mut self, _: &[u8]) {}
        fn finish(&self) -> u64 {
            42
        }
    }
    impl BuildHasher for Constant {
        type Hasher = ConstHasher;
        fn build_hasher(&self) -> ConstHasher {
            ConstHasher
        }
    }
    let m: BoxedMap<u32, u32, Constant> =
        BoxedMap::with_options_and_hasher(Options::default(), Constant);
    let g = m.pin();
    // 18 keys of one hash fit one bin (19 slots); more force resizes that cannot split them.
    let full = dmem_hashtable::BIN_SLOTS as u32;
    for k in 0..full - 1 {
        assert!(g.insert(k, k + 100));
    }
    for k in 0..full - 1 {
        assert_eq!(g.get(&k), Some(&(k + 100)));
    }
    assert_eq!(g.remove(&3), Some(&103));
    assert_eq!(g.get(&3), None);
    assert_eq!(m.len(), full as usize - 2);
    assert!(g.insert(3, 3));
    assert!(g.insert(full - 1, 0));
    // One more key of the same hash cannot be stored: a clear panic, not endless growth.
    let one_more = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| g.insert(full, 0)));
    assert!(one_more.is_err());
}

#[test]
fn reserve_and_any_key_value() {
    let t = Dlht::new();
    t.reserve(10_000);
    assert!(t.capacity() >= 10_000);
    // No sentinel keys or values.
    for k in [0, u64::MAX, 1 << 63] {
        assert_eq!(t.insert(k, u64::MAX - k), None);
        assert_eq!(t.get(k), Some(u64::MAX - k));
    }
    assert_eq!(t.insert(0, 5), Some(u64::MAX));
}

/// `get_batch` of every length around the window size (one window, several, a partial last
/// one), half the keys present, against plain Gets — at both sizings, so chained and
/// deferred Gets are in every window.
#[test]
fn get_batch_of_every_length_matches_get() {
    for sizing in [Sizing::Compact, Sizing::Fast] {
        let t = Dlht::with_options(Options {
            capacity: 4096,
            sizing,
            huge_pages: false,
        });
        for k in (0..8192u64).step_by(2) {
            t.insert(k.wrapping_mul(0x9e37_79b9_7f4a_7c15), k);
        }
        let g = t.pin();
        for len in [0usize, 1, 2, 23, 24, 31, 32, 33, 63, 64, 65, 100] {
            let keys: Vec<u64> = (0..len as u64)
                .map(|i| (i * 37 + len as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .collect();
            // A longer output: the entries past `keys.len()` must stay untouched.
            let mut out = vec![Some(u64::MAX); len + 3];
            g.get_batch(&keys, &mut out);
            for (i, &k) in keys.iter().enumerate() {
                assert_eq!(out[i], g.get(k), "{sizing:?}, length {len}, request {i}");
            }
            assert!(out[len..].iter().all(|o| *o == Some(u64::MAX)));
        }
    }
}
