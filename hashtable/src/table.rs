//! [`Dlht`]: the `u64 → u64` map with inline 8-byte values, its [`Guard`] and batch API.

use alloc::vec::Vec;

use crate::hash::mix64;
use crate::mem::PageKind;
use crate::primitive::prefetch;
use crate::raw::{AnyValue, Index, MemoryUsage, Primary, RawTable, Sizing, WriteOp};
use crate::reclaim::Pin;

/// Requests whose buckets are prefetched before any of them executes. Longer batches are
/// executed in windows of this many (DLHT and Dandelion see the benefit level off near 24).
pub const PREFETCH_WINDOW: usize = 32;
// `get_batch` keeps the deferred Gets of a window as bits of a `u32`.
const _: () = assert!(PREFETCH_WINDOW <= 32);

/// Construction options for [`Dlht`] and [`crate::BoxedMap`].
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Entries the table should hold without resizing.
    pub capacity: usize,
    /// Map big arrays on 2 MiB pages where the OS allows (`std` feature, Linux).
    pub huge_pages: bool,
    /// Entries per bin the table is sized for: compact (the default, about 31.5 B per entry)
    /// or fast (about 45.5 B per entry, fewer Gets that read a second line).
    pub sizing: Sizing,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            capacity: 0,
            huge_pages: true,
            sizing: Sizing::Compact,
        }
    }
}

/// The operation of a batched [`Request`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Read the value.
    Get,
    /// Add the key with this value if it is absent.
    Insert(u64),
    /// Replace the value if the key is present.
    Put(u64),
    /// Insert or replace.
    Upsert(u64),
    /// Remove the key.
    Delete,
}

/// One request of a batch: the key, the operation and, after execution, the result.
///
/// `result` is the value the key held when the operation took effect: for Get the value; for
/// Put, Upsert and Delete the old value (`None`: the key was absent); for Insert `None` when
/// it inserted and `Some(existing)` when the key was already there (nothing changed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// The key.
    pub key: u64,
    /// What to do.
    pub op: Op,
    /// Filled in by [`Guard::batch`].
    pub result: Option<u64>,
}

impl Request {
    /// A request with an empty result.
    pub const fn new(key: u64, op: Op) -> Self {
        Request {
            key,
            op,
            result: None,
        }
    }
}

/// A concurrent `u64 → u64` hashtable in the DLHT design (Dandelion §6): closed addressing
/// with 64-byte buckets and bounded cache-line chaining, lock-free Gets, per-bin seqlocked
/// writes, deletes that free their slot at once, a non-blocking resize, and a batch API that
/// prefetches every request's bucket before executing any.
///
/// Every key and value is allowed (validity is kept in bucket headers, not in sentinels).
///
/// ```
/// use dmem_hashtable::{Dlht, Op, Request};
/// let t = Dlht::with_capacity(1000);
/// assert_eq!(t.insert(7, 70), None);
/// assert_eq!(t.get(7), Some(70));
/// let g = t.pin();
/// let mut batch = [Request::new(7, Op::Get), Request::new(8, Op::Upsert(80))];
/// g.batch(&mut batch);
/// assert_eq!(batch[0].result, Some(70));
/// assert_eq!(g.get(8), Some(80));
/// ```
pub struct Dlht {
    raw: RawTable,
}

impl Default for Dlht {
    fn default() -> Self {
        Dlht::new()
    }
}

impl core::fmt::Debug for Dlht {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Dlht")
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl Dlht {
    /// An empty table (one bin; it grows by doubling).
    pub fn new() -> Self {
        Dlht::with_options(Options::default())
    }

    /// A table sized for `capacity` entries.
    pub fn with_capacity(capacity: usize) -> Self {
        Dlht::with_options(Options {
            capacity,
            ..Options::default()
        })
    }

    /// A table built from `options`.
    pub fn with_options(options: Options) -> Self {
        Dlht {
            raw: RawTable::new(options.capacity, options.huge_pages, options.sizing),
        }
    }

    /// The core (for the crate's own tests).
    #[cfg(test)]
    pub(crate) fn raw(&self) -> &RawTable {
        &self.raw
    }

    /// Pins the calling thread for a series of operations. Hold a guard for a batch or a few
    /// thousand operations, not forever: while it lives, indexes retired by a resize cannot be
    /// freed. At most 128 guards of one table can be alive at once; further `pin` calls wait
    /// for one to drop (so one thread must not hold more than that).
    #[inline]
    pub fn pin(&self) -> Guard<'_> {
        Guard {
            table: self,
            pin: self.raw.pin(),
        }
    }

    /// The value of `key`.
    pub fn get(&self, key: u64) -> Option<u64> {
        self.pin().get(key)
    }

    /// Adds `key → value` if `key` is absent; returns the existing value otherwise.
    pub fn insert(&self, key: u64, value: u64) -> Option<u64> {
        self.pin().insert(key, value)
    }

    /// Replaces the value of a present `key`; returns the old value (`None`: absent, nothing
    /// stored).
    pub fn put(&self, key: u64, value: u64) -> Option<u64> {
        self.pin().put(key, value)
    }

    /// Inserts or replaces; returns the old value.
    pub fn upsert(&self, key: u64, value: u64) -> Option<u64> {
        self.pin().upsert(key, value)
    }

    /// Removes `key`; returns its value. Its slot is free for reuse when this returns.
    pub fn delete(&self, key: u64) -> Option<u64> {
        self.pin().delete(key)
    }

    /// Executes a batch (see [`Guard::batch`]).
    pub fn batch(&self, requests: &mut [Request]) {
        self.pin().batch(requests);
    }

    /// Entries in the table (exact when no write is in flight).
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    /// Whether the table has no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Slots in the current index. The table doubles before all are used: when one bin's
    /// [`crate::BIN_SLOTS`] slots or an overflow pool run out.
    pub fn capacity(&self) -> usize {
        self.raw.capacity()
    }

    /// Memory held by the current index, and bytes per entry.
    pub fn memory_usage(&self) -> MemoryUsage {
        self.raw.memory_usage()
    }

    /// How the bin array was allocated.
    pub fn page_kind(&self) -> PageKind {
        self.memory_usage().pages
    }

    /// Grows (by doubling) until the table is sized for `len() + additional` entries.
    pub fn reserve(&self, additional: usize) {
        let want = crate::raw::bins_for(self.len().saturating_add(additional), self.raw.sizing());
        let pin = self.raw.pin();
        while self.raw.index(&pin).nbins() < want {
            self.raw.grow_now(&pin);
        }
    }

    /// Frees memory retired by resizes that no guard can see any more.
    pub fn collect(&self) {
        self.raw.collect();
    }

    /// A weakly consistent iterator over `(key, value)` pairs: every entry present for the
    /// whole iteration is yielded exactly once; entries inserted or deleted meanwhile may or
    /// may not be. Each bin is read as one consistent snapshot.
    pub fn iter(&self) -> Iter<'_> {
        let guard = self.pin();
        let index: *const Index = self.raw.index(&guard.pin);
        Iter {
            guard,
            index,
            bin: 0,
            buf: Vec::new(),
            pos: 0,
        }
    }
}

impl<'t> IntoIterator for &'t Dlht {
    type Item = (u64, u64);
    type IntoIter = Iter<'t>;
    fn into_iter(self) -> Iter<'t> {
        self.iter()
    }
}

/// A pinned view of a [`Dlht`]: the way to run many operations, and batches, cheaply.
pub struct Guard<'t> {
    table: &'t Dlht,
    pin: Pin<'t>,
}

impl Guard<'_> {
    #[inline(always)]
    fn index(&self) -> &Index {
        self.table.raw.index(&self.pin)
    }

    /// The value of `key`. Lock-free: never waits for a writer.
    #[inline]
    pub fn get(&self, key: u64) -> Option<u64> {
        self.table
            .raw
            .get_in(self.index(), key, mix64(key), &AnyValue)
    }

    #[inline]
    fn write(&self, key: u64, op: WriteOp) -> Option<u64> {
        self.table
            .raw
            .write(&self.pin, self.index(), key, mix64(key), op, &AnyValue)
    }

    /// Adds `key → value` if `key` is absent; returns the existing value otherwise.
    #[inline]
    pub fn insert(&self, key: u64, value: u64) -> Option<u64> {
        self.write(key, WriteOp::Insert(value))
    }

    /// Replaces the value of a present `key`; returns the old value.
    #[inline]
    pub fn put(&self, key: u64, value: u64) -> Option<u64> {
        self.write(key, WriteOp::Put(value))
    }

    /// Inserts or replaces; returns the old value.
    #[inline]
    pub fn upsert(&self, key: u64, value: u64) -> Option<u64> {
        self.write(key, WriteOp::Upsert(value))
    }

    /// Removes `key`; returns its value.
    #[inline]
    pub fn delete(&self, key: u64) -> Option<u64> {
        self.write(key, WriteOp::Delete)
    }

    /// Executes `requests` in order, filling in each `result`. First it issues a software
    /// prefetch for the bucket of every request (up to [`PREFETCH_WINDOW`] at a time), then
    /// executes them, so their memory latencies overlap (Dandelion §6, `BatchReqs`). A Get
    /// whose key may sit in a chained overflow line has that line prefetched too and is
    /// finished after the other Gets of the window (before any later write), so most
    /// requests wait for at most one overlapped miss.
    pub fn batch(&self, requests: &mut [Request]) {
        let raw = &self.table.raw;
        let mut hashes = [0u64; PREFETCH_WINDOW];
        // For a deferred Get, the header its probe read.
        let mut headers = [0u64; PREFETCH_WINDOW];
        for window in requests.chunks_mut(PREFETCH_WINDOW) {
            let idx = self.index();
            for (r, h) in window.iter().zip(hashes.iter_mut()) {
                *h = mix64(r.key);
                prefetch(idx.bin(*h));
            }
            // Gets whose key may sit in a chained line wait in `deferred` (one bit each; their
            // line is being prefetched) until the next write or the end of the window: Gets
            // commute with Gets, so the batch still executes as if in order.
            let mut deferred = 0u32;
            for i in 0..window.len() {
                let h = hashes[i];
                let r = &mut window[i];
                let key = r.key;
                let op = match r.op {
                    Op::Get => {
                        match raw.probe_primary(idx, idx.bin(h), key) {
                            Ok(v) => r.result = v,
                            Err(h1) => {
                                headers[i] = h1;
                                deferred |= 1 << i;
                            }
                        }
                        continue;
                    }
                    Op::Insert(v) => WriteOp::Insert(v),
                    Op::Put(v) => WriteOp::Put(v),
                    Op::Upsert(v) => WriteOp::Upsert(v),
                    Op::Delete => WriteOp::Delete,
                };
                self.finish_gets(idx, window, &hashes, &headers, deferred);
                deferred = 0;
                window[i].result = raw.write(&self.pin, idx, key, h, op, &AnyValue);
            }
            self.finish_gets(idx, window, &hashes, &headers, deferred);
        }
    }

    /// Completes the deferred Gets of a window: bit `i` of `deferred` set means request `i`
    /// waits, and `headers[i]` is the header its probe read.
    #[inline(always)]
    fn finish_gets(
        &self,
        idx: &Index,
        window: &mut [Request],
        hashes: &[u64],
        headers: &[u64],
        mut deferred: u32,
    ) {
        let raw = &self.table.raw;
        while deferred != 0 {
            let i = deferred.trailing_zeros() as usize;
            deferred &= deferred - 1;
            let r = &mut window[i];
            let h = hashes[i];
            r.result = match raw.finish_chained(idx, idx.bin(h), headers[i], r.key) {
                Some(v) => v,
                None => raw.get_in(idx, r.key, h, &AnyValue),
            };
        }
    }

    /// Batched Gets: `out[i]` becomes the value of `keys[i]` (prefetching as [`Guard::batch`]).
    ///
    /// # Panics
    /// If `out` is shorter than `keys`.
    pub fn get_batch(&self, keys: &[u64], out: &mut [Option<u64>]) {
        assert!(
            out.len() >= keys.len(),
            "get_batch: output shorter than keys"
        );
        if keys.len() <= PREFETCH_WINDOW {
            // One window, the usual call: without the chunk iterators' bookkeeping.
            return self.get_window(keys, out);
        }
        for (ks, os) in keys
            .chunks(PREFETCH_WINDOW)
            .zip(out.chunks_mut(PREFETCH_WINDOW))
        {
            self.get_window(ks, os);
        }
    }

    /// One window of `get_batch`: `keys.len() <= PREFETCH_WINDOW` and `out.len() >=
    /// keys.len()`.
    #[inline(always)]
    fn get_window(&self, keys: &[u64], out: &mut [Option<u64>]) {
        use core::mem::MaybeUninit;
        let raw = &self.table.raw;
        let idx = self.index();
        let n = keys.len().min(PREFETCH_WINDOW);
        // The bins of the window, found once: the second stage reads them without recomputing
        // the bin (the few Gets finished by `get_in` hash again). For a deferred Get, the
        // header its probe read. Left uninitialised: zeroing both arrays cost 33 instructions
        // a call (1.4 a Get at 24 keys), and every element read below was written first.
        let mut bins = [MaybeUninit::<*const Primary>::uninit(); PREFETCH_WINDOW];
        let mut headers = [MaybeUninit::<u64>::uninit(); PREFETCH_WINDOW];
        // Slices of one length `n`, so the indexed loops below need no bounds checks
        // (plain index loops compile to fewer instructions than a zip of four iterators).
        let (ks, bins, headers, os) =
            (&keys[..n], &mut bins[..n], &mut headers[..n], &mut out[..n]);
        for i in 0..n {
            let bin = idx.bin(mix64(ks[i]));
            bins[i].write(bin);
            prefetch(bin);
        }
        // The deferred Gets of the window, one bit each (the window has at most 32).
        let mut deferred = 0u32;
        for i in 0..n {
            // SAFETY: the loop above wrote `bins[i]` for every `i < n`, a pointer to a bin of
            // `idx`, which the guard's pin keeps alive.
            let bin = unsafe { &*bins[i].assume_init() };
            match raw.probe_primary(idx, bin, ks[i]) {
                Ok(v) => os[i] = v,
                Err(h1) => {
                    headers[i].write(h1);
                    deferred |= 1 << i;
                }
            }
        }
        while deferred != 0 {
            let i = deferred.trailing_zeros() as usize;
            deferred &= deferred - 1;
            // SAFETY: as above for `bins[i]`; bit `i` of `deferred` is set only together with
            // the write of `headers[i]`.
            let (bin, h1) = unsafe { (&*bins[i].assume_init(), headers[i].assume_init()) };
            os[i] = match raw.finish_chained(idx, bin, h1, ks[i]) {
                Some(v) => v,
                None => raw.get_in(idx, ks[i], mix64(ks[i]), &AnyValue),
            };
        }
    }

    /// Re-announces the current epoch, so memory retired since the pin can be freed.
    pub fn repin(&mut self) {
        self.pin.repin();
    }
}

/// Iterator over a [`Dlht`]'s entries; see [`Dlht::iter`].
pub struct Iter<'t> {
    guard: Guard<'t>,
    /// Protected by `guard` for as long as the iterator lives.
    index: *const Index,
    bin: usize,
    buf: Vec<(u64, u64)>,
    pos: usize,
}

impl Iterator for Iter<'_> {
    type Item = (u64, u64);

    fn next(&mut self) -> Option<(u64, u64)> {
        let _ = &self.guard;
        loop {
            if let Some(&e) = self.buf.get(self.pos) {
                self.pos += 1;
                return Some(e);
            }
            // SAFETY: `index` was the current index while `guard` was pinned; the guard lives
            // as long as `self`, so the index (and its successors) are not freed.
            let index = unsafe { &*self.index };
            if self.bin >= index.nbins() {
                return None;
            }
            self.buf.clear();
            self.pos = 0;
            // SAFETY: the guard's pin protects `index` and the chain after it.
            unsafe { index.snapshot_bin(self.bin, &mut self.buf) };
            self.bin += 1;
        }
    }
}
