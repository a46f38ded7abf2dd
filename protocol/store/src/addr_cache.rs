//! The CN-side address cache (FORD's): `(table, key) → item location`, warm from the
//! loader's placement or filled by lookups.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use dmem_txn::{Key, TableId};

#[cfg(doc)]
use crate::Loader;
use crate::layout::ItemLoc;
use crate::loader::LoadIndex;
use crate::store::Store;

/// Where a warm [`AddressCache`] finds the loaded records.
#[derive(Debug, Clone)]
enum WarmIndex {
    /// A loader of this thread's, which may still load more.
    Loading(Rc<RefCell<LoadIndex>>),
    /// A finished load, shared read-only by the cores of a CN process.
    Placed(Arc<LoadIndex>),
}

/// The CN-side address cache: `(table, key) → item location`, filled by index lookups so
/// that a repeated access skips the bucket READ (FORD's address cache).
///
/// Locations never change (slots are never freed), so entries never go stale; the cache is
/// bounded only by the keys a CN touches.
#[derive(Debug, Default, Clone)]
pub struct AddressCache {
    map: HashMap<(TableId, Key), ItemLoc>,
    /// The loaded records every CN knows at start-up (a warm cache), shared by all CNs
    /// instead of copied into each map.
    warm: Option<(Rc<Store>, WarmIndex)>,
    hits: u64,
    misses: u64,
}

impl AddressCache {
    /// An empty cache.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Looks a key up, counting hits and misses.
    pub fn get(&mut self, table: TableId, key: Key) -> Option<ItemLoc> {
        let found = self.map.get(&(table, key)).copied().or_else(|| {
            let (store, loaded) = self.warm.as_ref()?;
            match loaded {
                WarmIndex::Loading(loaded) => loaded.borrow().loc(store, table, key),
                WarmIndex::Placed(placed) => placed.loc(store, table, key),
            }
        });
        if found.is_some() {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
        found
    }

    /// Remembers a location.
    pub fn put(&mut self, table: TableId, key: Key, loc: ItemLoc) {
        self.map.insert((table, key), loc);
    }

    /// Remembers many locations at once, e.g. the ones [`Loader::load`] returned: the warm
    /// cache of a CN that scanned the index at start-up, so that its first access to a
    /// loaded record skips the bucket READ. Counts neither hits nor misses.
    pub fn fill(&mut self, locs: impl IntoIterator<Item = (TableId, Key, ItemLoc)>) {
        self.map
            .extend(locs.into_iter().map(|(t, k, loc)| ((t, k), loc)));
    }

    /// Answers for every record `loaded` holds, now and later, as if [`fill`](Self::fill)
    /// had been given their locations, without a copy per CN: what a paper-scale warm cache
    /// needs (the locations of a direct-mapped table are computed from the key).
    pub fn warm_from(&mut self, store: Rc<Store>, loaded: Rc<RefCell<LoadIndex>>) {
        self.warm = Some((store, WarmIndex::Loading(loaded)));
    }

    /// [`warm_from`](Self::warm_from) a loader's finished index shared across threads (the
    /// one dry load of a CN process, which every core's deployment takes as its placement)
    /// instead of one that is still loading.
    pub fn warm_from_placed(&mut self, store: Rc<Store>, placed: Arc<LoadIndex>) {
        self.warm = Some((store, WarmIndex::Placed(placed)));
    }

    /// `(hits, misses)` so far.
    #[must_use]
    pub fn stats(&self) -> (u64, u64) {
        (self.hits, self.misses)
    }

    /// Number of cached locations.
    #[must_use]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the cache is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}
