//! [`BoxedMap`]: keys and values of any size, through one indirection.
//!
//! The slot's key word holds a 64-bit hash of the key, its value word a pointer to a boxed
//! `(key, value)` record. Lookups compare the hash in the bucket first and the full key behind
//! the pointer only on a hash match, so equal hashes of different keys are allowed (they take
//! two slots of the bin). Records that a delete or a replace unlinks are retired to the
//! table's epoch collector (see `reclaim`) and freed when no guard can still read them.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::borrow::Borrow;
use core::hash::{BuildHasher, Hash};
use core::marker::PhantomData;

use crate::hash::WordHasherBuilder;
use crate::raw::{Matcher, MemoryUsage, RawTable, WriteOp};
use crate::reclaim::Pin;
use crate::table::Options;

struct Record<K, V> {
    key: K,
    value: V,
}

/// Frees a record handed to the collector.
///
/// # Safety
/// `p` must come from `Box::<Record<K, V>>::into_raw` and be unreachable by any guard.
unsafe fn free_record<K, V>(p: *mut u8) {
    // SAFETY: by the contract.
    drop(unsafe { Box::from_raw(p.cast::<Record<K, V>>()) });
}

/// Accepts a slot whose record's key equals `q`.
struct KeyIs<'q, Q: ?Sized, K, V> {
    q: &'q Q,
    _record: PhantomData<fn() -> (K, V)>,
}

impl<Q, K, V> Matcher for KeyIs<'_, Q, K, V>
where
    Q: ?Sized + Eq,
    K: Borrow<Q>,
{
    #[inline]
    fn matches(&self, value: u64) -> bool {
        let rec = value as usize as *const Record<K, V>;
        // SAFETY: every value word of a BoxedMap's table is a pointer from `Box::into_raw` of
        // a `Record<K, V>`. A matcher runs while its caller is pinned, on a value read from a
        // slot that was valid at or after the pin (a slot is only read if the header loaded
        // after pinning marked it valid, and a valid slot's value word always holds a record
        // pointer); such a record is either live or retired after the pin, so not freed.
        unsafe { (*rec).key.borrow() == self.q }
    }
}

/// A concurrent map from any `K: Hash + Eq` to any `V`, on the same bins as [`crate::Dlht`],
/// with each entry boxed once. Reads return references that live as long as the
/// [`BoxedGuard`] they were read through.
///
/// # Panics
/// Inserting a twentieth distinct key whose 64-bit hash equals that of 19 keys already in the
/// map panics (a bin holds [`crate::BIN_SLOTS`] = 19 entries and no resize can split equal
/// hashes). With a good
/// hasher this does not happen by chance; use a keyed `BuildHasher` if keys are adversarial.
///
/// ```
/// use dmem_hashtable::BoxedMap;
/// let m: BoxedMap<String, Vec<u8>> = BoxedMap::new();
/// let g = m.pin();
/// assert!(g.insert("alpha".to_string(), vec![1, 2, 3]));
/// assert_eq!(g.get("alpha").map(|v| v.len()), Some(3));
/// assert_eq!(g.remove("alpha").map(|v| v[0]), Some(1));
/// assert!(g.get("alpha").is_none());
/// ```
pub struct BoxedMap<K, V, S = WordHasherBuilder> {
    raw: RawTable,
    hasher: S,
    _records: PhantomData<*const Record<K, V>>,
}

// SAFETY: the map owns its records; moving it moves them (K, V: Send). `S` moves with it.
unsafe impl<K: Send, V: Send, S: Send> Send for BoxedMap<K, V, S> {}
// SAFETY: shared access hands out `&K` / `&V` to several threads (needs Sync) and lets any
// thread insert records that another thread frees (needs Send).
unsafe impl<K: Send + Sync, V: Send + Sync, S: Sync> Sync for BoxedMap<K, V, S> {}

impl<K, V> BoxedMap<K, V> {
    /// An empty map.
    pub fn new() -> Self {
        Self::with_options_and_hasher(Options::default(), WordHasherBuilder::default())
    }

    /// A map sized for `capacity` entries.
    pub fn with_capacity(capacity: usize) -> Self {
        Self::with_options_and_hasher(
            Options {
                capacity,
                ..Options::default()
            },
            WordHasherBuilder::default(),
        )
    }
}

impl<K, V> Default for BoxedMap<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K, V, S> BoxedMap<K, V, S> {
    /// A map built from `options` hashing keys with `hasher`.
    pub fn with_options_and_hasher(options: Options, hasher: S) -> Self {
        BoxedMap {
            raw: RawTable::new(options.capacity, options.huge_pages, options.sizing),
            hasher,
            _records: PhantomData,
        }
    }

    /// Pins the calling thread; operations go through the guard.
    pub fn pin(&self) -> BoxedGuard<'_, K, V, S> {
        BoxedGuard {
            map: self,
            pin: self.raw.pin(),
        }
    }

    /// Entries in the map.
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Memory of the index (records are extra: `size_of::<(K, V)>()` each, boxed).
    pub fn memory_usage(&self) -> MemoryUsage {
        self.raw.memory_usage()
    }
}

impl<K, V, S> Drop for BoxedMap<K, V, S> {
    fn drop(&mut self) {
        let pin = self.raw.pin();
        let idx = self.raw.index(&pin);
        let mut buf = Vec::new();
        for b in 0..idx.nbins() {
            buf.clear();
            // SAFETY: `pin` protects `idx`.
            unsafe { idx.snapshot_bin(b, &mut buf) };
            for &(_, v) in &buf {
                // SAFETY: `&mut self`: nobody else can reach the map; each live record is in
                // exactly one slot; retired records are freed by the collector, not here.
                drop(unsafe { Box::from_raw(v as usize as *mut Record<K, V>) });
            }
        }
    }
}

/// A pinned view of a [`BoxedMap`]. References it returns stay valid until it drops, even if
/// another thread removes the entry meanwhile.
pub struct BoxedGuard<'m, K, V, S = WordHasherBuilder> {
    map: &'m BoxedMap<K, V, S>,
    pin: Pin<'m>,
}

impl<K, V, S> BoxedGuard<'_, K, V, S>
where
    K: Hash + Eq + Send,
    V: Send,
    S: BuildHasher,
{
    fn hash<Q: ?Sized + Hash>(&self, q: &Q) -> u64 {
        self.map.hasher.hash_one(q)
    }

    /// The value of `key`.
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        let h = self.hash(key);
        let raw = &self.map.raw;
        let m = KeyIs::<Q, K, V> {
            q: key,
            _record: PhantomData,
        };
        let v = raw.get_in(raw.index(&self.pin), h, crate::hash::mix64(h), &m)?;
        // SAFETY: a record read under `self.pin` is freed only after the pin drops, which the
        // returned borrow of `self` outlives not.
        Some(unsafe { &(*(v as usize as *const Record<K, V>)).value })
    }

    fn write<Q>(&self, key: &Q, op: WriteOp) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        let h = self.hash(key);
        let raw = &self.map.raw;
        let m = KeyIs::<Q, K, V> {
            q: key,
            _record: PhantomData,
        };
        raw.write(
            &self.pin,
            raw.index(&self.pin),
            h,
            crate::hash::mix64(h),
            op,
            &m,
        )
    }

    /// Retires an unlinked record and lends out its value until the guard drops.
    ///
    /// # Safety
    /// `v` must be a record pointer that the calling operation just unlinked from the table.
    unsafe fn retire_and_lend(&self, v: u64) -> &V {
        let rec = v as usize as *mut Record<K, V>;
        // SAFETY: unlinked by our own write, so unreachable for new readers, and retired once
        // (only the unlinking operation sees it as removed); `free_record` may run on any
        // thread because K and V are Send.
        unsafe { self.map.raw.retire(rec.cast(), free_record::<K, V>) };
        // SAFETY: retired while `self.pin` is alive, so freed only after the guard drops.
        unsafe { &(*rec).value }
    }

    /// Adds `key → value` if `key` is absent. Returns false (and drops the pair) if present.
    pub fn insert(&self, key: K, value: V) -> bool {
        let rec = Box::into_raw(Box::new(Record { key, value }));
        // Frees the record if the write unwinds (more than `BIN_SLOTS` keys of one hash: the
        // raw table's assertion fires before anything is published), so a panic leaks
        // nothing (found by Miri).
        let unpublished = Unpublished(rec);
        // SAFETY: `rec` is ours until published.
        let key_ref = unsafe { &(*rec).key };
        let h = self.hash(key_ref);
        let raw = &self.map.raw;
        let m = KeyIs::<K, K, V> {
            q: key_ref,
            _record: PhantomData,
        };
        let existing = raw.write(
            &self.pin,
            raw.index(&self.pin),
            h,
            crate::hash::mix64(h),
            WriteOp::Insert(rec as usize as u64),
            &m,
        );
        if existing.is_some() {
            // The insert did not publish `rec`: the guard frees it.
            drop(unpublished);
            false
        } else {
            // Published: the table owns it now.
            core::mem::forget(unpublished);
            true
        }
    }

    /// Inserts or replaces; returns the previous value (valid until the guard drops).
    pub fn upsert(&self, key: K, value: V) -> Option<&V> {
        let rec = Box::into_raw(Box::new(Record { key, value }));
        // SAFETY: `rec` is ours until published.
        let key_ref = unsafe { &(*rec).key };
        let h = self.hash(key_ref);
        let raw = &self.map.raw;
        let m = KeyIs::<K, K, V> {
            q: key_ref,
            _record: PhantomData,
        };
        let old = raw.write(
            &self.pin,
            raw.index(&self.pin),
            h,
            crate::hash::mix64(h),
            WriteOp::Upsert(rec as usize as u64),
            &m,
        )?;
        // SAFETY: the upsert replaced the record pointer `old` in its slot.
        Some(unsafe { self.retire_and_lend(old) })
    }

    /// Removes `key`; returns its value (valid until the guard drops).
    pub fn remove<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        let old = self.write(key, WriteOp::Delete)?;
        // SAFETY: the delete unlinked `old`.
        Some(unsafe { self.retire_and_lend(old) })
    }

    /// All entries (a weakly consistent snapshot, as [`crate::Dlht::iter`]).
    pub fn entries(&self) -> Vec<(&K, &V)> {
        let raw = &self.map.raw;
        let idx = raw.index(&self.pin);
        let mut buf = Vec::new();
        for b in 0..idx.nbins() {
            // SAFETY: `self.pin` protects `idx`.
            unsafe { idx.snapshot_bin(b, &mut buf) };
        }
        buf.into_iter()
            .map(|(_, v)| {
                let rec = v as usize as *const Record<K, V>;
                // SAFETY: read under `self.pin`; freed only after the guard drops.
                unsafe { (&(*rec).key, &(*rec).value) }
            })
            .collect()
    }
}

/// A record allocated for an insert and not (yet) published in the table: freed when dropped.
struct Unpublished<K, V>(*mut Record<K, V>);

impl<K, V> Drop for Unpublished<K, V> {
    fn drop(&mut self) {
        // SAFETY: the pointer comes from `Box::into_raw` in `insert`, which drops this guard
        // only while the record is unpublished (an existing key, or an unwind before the
        // write stored it) and forgets it once the table owns the record, so nobody else can
        // reach it and it is freed once.
        drop(unsafe { Box::from_raw(self.0) });
    }
}
