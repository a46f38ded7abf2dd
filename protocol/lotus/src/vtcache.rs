//! The version table cache (LOTUS §4.4): per CN, the CVTs (here: the record's block
//! location and its meta) of records in the CN's lock range, so that a coordinator holding
//! a local lock on a record finds its versions without the CVT READ (and without the
//! bucket READ when the address was not cached either).
//!
//! Consistency (§4.4 "Zero Consistency Overhead"): a CVT changes only under a write lock.
//! A local writer updates the entry when it commits; a remote write-lock request
//! invalidates it when the lock is granted (Alg. 1 line 15, [`crate::locking::apply`]).
//! Only records locked through this CN's table are cached or read from the cache.
//!
//! LRU, hash-partitioned into sub-caches (Fig. 9), each behind its own mutex, so that a
//! CN process's cores, which share one cache as they share one lock table, contend on
//! different sub-caches (one cache per CN, not per core: a remote write-lock grant, served
//! on whichever core runs the lock server, must invalidate the entry every core reads). Default capacity 64K entries per CN (the default; the paper sizes it
//! at 4.5 MB).

use std::sync::Mutex;

use dmem_verbs::sync::lock_ignoring_poison;
use std::collections::{BTreeMap, HashMap};

use dmem_motor::mvcc::Meta;
use dmem_store::ItemLoc;

#[derive(Debug, Default)]
struct Sub {
    entries: HashMap<u64, (ItemLoc, Meta, u64, u16)>,
    order: BTreeMap<u64, u64>,
    tick: u64,
}

/// A CN's version table cache.
#[derive(Debug)]
pub struct VtCache {
    subs: Vec<Mutex<Sub>>,
    per_sub: usize,
}

impl VtCache {
    /// A cache of `capacity` entries in `subs` sub-caches (at least one of each).
    #[must_use]
    pub fn new(capacity: usize, subs: usize) -> Self {
        let subs = subs.max(1);
        Self {
            subs: (0..subs).map(|_| Mutex::new(Sub::default())).collect(),
            per_sub: capacity.div_ceil(subs).max(1),
        }
    }

    fn sub(&self, key: u64) -> &Mutex<Sub> {
        &self.subs[(crate::shard::mix64(key) % self.subs.len() as u64) as usize]
    }

    /// The cached location and meta of the record with lock key `key` (refreshes its LRU
    /// position).
    #[must_use]
    pub fn get(&self, key: u64) -> Option<(ItemLoc, Meta)> {
        let mut s = lock_ignoring_poison(self.sub(key));
        s.tick += 1;
        let tick = s.tick;
        let (loc, meta, old) = {
            let e = s.entries.get_mut(&key)?;
            let old = e.2;
            e.2 = tick;
            (e.0, e.1.clone(), old)
        };
        s.order.remove(&old);
        s.order.insert(tick, key);
        Some((loc, meta))
    }

    /// Caches (or replaces) the entry of `key` (in lock shard `shard`), evicting the least
    /// recently used one of its sub-cache when full.
    pub fn put(&self, key: u64, shard: u16, loc: ItemLoc, meta: Meta) {
        let mut s = lock_ignoring_poison(self.sub(key));
        s.tick += 1;
        let tick = s.tick;
        if let Some((_, _, old, _)) = s.entries.insert(key, (loc, meta, tick, shard)) {
            s.order.remove(&old);
        }
        s.order.insert(tick, key);
        while s.entries.len() > self.per_sub {
            let Some((_, victim)) = s.order.pop_first() else {
                break;
            };
            s.entries.remove(&victim);
        }
    }

    /// Drops the entry of `key` (a remote writer is about to change the CVT).
    pub fn invalidate(&self, key: u64) {
        let mut s = lock_ignoring_poison(self.sub(key));
        if let Some((_, _, old, _)) = s.entries.remove(&key) {
            s.order.remove(&old);
        }
    }

    /// Drops every entry of lock shard `shard` (§4.3: a CN handing a shard over, or taking
    /// one, clears its cached CVTs); returns how many.
    pub fn clear_shard(&self, shard: u16) -> usize {
        let mut n = 0;
        for sub in &self.subs {
            let mut s = lock_ignoring_poison(sub);
            let gone: Vec<(u64, u64)> = s
                .entries
                .iter()
                .filter(|(_, e)| e.3 == shard)
                .map(|(&k, e)| (k, e.2))
                .collect();
            for (k, tick) in gone {
                s.entries.remove(&k);
                s.order.remove(&tick);
                n += 1;
            }
        }
        n
    }

    /// Drops every entry (a restarted CN's cache starts empty, §6); returns how many.
    pub fn clear(&self) -> usize {
        self.subs
            .iter()
            .map(|sub| {
                let mut s = lock_ignoring_poison(sub);
                let n = s.entries.len();
                s.entries.clear();
                s.order.clear();
                n
            })
            .sum()
    }

    /// Entries cached.
    #[must_use]
    pub fn len(&self) -> usize {
        self.subs
            .iter()
            .map(|s| lock_ignoring_poison(s).entries.len())
            .sum()
    }

    /// Whether nothing is cached.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmem_store::BucketLoc;
    use dmem_txn::TableId;

    fn loc(o: u64) -> ItemLoc {
        ItemLoc {
            bucket: BucketLoc {
                table: TableId(0),
                partition: 0,
                bucket: 0,
                offset: 0,
                slots: 7,
            },
            slot: 0,
            offset: o,
        }
    }

    #[test]
    fn lru_evicts_the_least_recent_and_invalidates() {
        let c = VtCache::new(2, 1);
        c.put(1, 0, loc(1), Meta::empty(2));
        c.put(2, 0, loc(2), Meta::empty(2));
        assert!(c.get(1).is_some()); // 1 is now the most recent
        c.put(3, 0, loc(3), Meta::empty(2));
        assert!(c.get(2).is_none(), "2 was the least recent");
        assert_eq!(c.get(1).unwrap().0.offset, 1);
        c.invalidate(1);
        assert!(c.get(1).is_none());
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn clear_shard_drops_only_that_shard() {
        let c = VtCache::new(16, 4);
        for k in 0..8u64 {
            c.put(k, (k % 2) as u16, loc(k), Meta::empty(2));
        }
        assert_eq!(c.clear_shard(1), 4);
        assert_eq!(c.len(), 4);
        assert!((0..8u64).all(|k| c.get(k).is_some() == (k % 2 == 0)));
    }
}
