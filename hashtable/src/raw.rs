//! The non-generic core (compiled once, as hashbrown does): bins of 64-byte buckets holding
//! 8-byte keys and 8-byte values, bounded cache-line chaining, per-bin seqlock versions,
//! and the cooperative, non-blocking resize. DLHT (HPDC '24) as summarised in Dandelion §6.
//!
//! # Bucket layout
//!
//! ```text
//!  primary bucket (one per bin, 64 bytes, 64-byte aligned)            header word (u64)
//! +--------+--------+----------------+----------------+----------------+  bits  0..32 version
//! | header |  link  | slot 0         | slot 1         | slot 2         |  bit  32     lock (writers)
//! |  8 B   |  8 B   | key 8B | val 8B| key 8B | val 8B| key 8B | val 8B|  bits 33..35 state: Normal,
//! +--------+--------+----------------+----------------+----------------+               InTransfer, Done
//!              |                                                          bits 35..54 valid bit of
//!              |  low 32 bits: 1 + index into the single-link pool                    slots 0..19
//!              |  high 32 bits: 1 + index into the wide-link pool (0 = none)
//!              v
//!  single-link bucket (64 B): slots 3..7      wide-link bucket (192 B, three lines): slots 7..19
//! +-------+-------+-------+-------+         +-------+-------+-- ... --+-------+
//! | s3    | s4    | s5    | s6    |         | s7    | s8    |         | s18   |
//! +-------+-------+-------+-------+         +-------+-------+-- ... --+-------+
//! ```
//!
//! A bin holds at most 19 entries: 3 inline, 4 in one chained cache line, 12 in a chained
//! bucket of three lines. All validity lives in the header, so a Get for a key of the primary
//! bucket (or a miss in a bin without overflow) reads exactly one cache line. When a bin is
//! full, or the overflow pools are used up, the table doubles.
//!
//! The default sizing is 2.6 entries per bin (see `Sizing` and `bins_for`): 24.6 B of bins per entry, and
//! about 6.8 B of chained buckets, so about 31.5 B per entry in all (Poisson occupancy). The
//! 12-slot wide bucket is what allows this load: with 15 slots per bin, a 100M-key table at
//! 2.6 per bin would expect 0.7 full bins (each a doubling of the whole table); with 19 it
//! expects about 10^-4.
//!
//! # Concurrency
//!
//! * Get is lock-free and never writes: load the header (acquire), compare the keys of the
//!   valid slots, read the value, load the header again; equal versions mean the slots read
//!   were not reused meanwhile. A reader retries only after a writer completed an operation.
//! * Writers serialise per bin on the header's lock bit (a compare-and-swap). An insert fills
//!   a free slot while it is invisible, then publishes it with one release store of the
//!   header (valid bit set, version bumped, unlocked). A delete clears the valid bit with one
//!   such store, so the slot is free at once. A put on an existing key stores the new value in
//!   place (an atomic 8-byte store), without a version bump.
//! * Resize: a writer that finds its bin full allocates an index twice as large and links it
//!   as `next`. Writers then migrate chunks of bins: lock the bin, mark it InTransfer (readers
//!   still read it, its slots no longer change), copy its entries into bins `2b` and `2b + 1`
//!   of the new index, mark it Done (version bumped). Readers and writers that meet a Done bin
//!   continue in `next`. Requests are served throughout; when every bin is Done the table
//!   swings `current` to the new index and retires the old one through the epoch collector.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::ptr;

use crate::hash::{bin_of, mix64};
use crate::mem::{PageKind, Region, Zeroable};
use crate::primitive::{
    AtomicPtr, AtomicU64, AtomicUsize, Backoff, Ordering, Padded, fence, prefetch,
};
use crate::reclaim::{Collector, Pin};

/// Slots in the primary bucket.
pub(crate) const PRIMARY_SLOTS: usize = 3;
/// Slots in a single-link overflow bucket.
pub(crate) const SINGLE_SLOTS: usize = 4;
/// Slots in a wide-link overflow bucket (three cache lines).
pub(crate) const WIDE_SLOTS: usize = 12;
/// The most entries a bin holds.
pub(crate) const BIN_SLOTS: usize = PRIMARY_SLOTS + SINGLE_SLOTS + WIDE_SLOTS;

/// How densely a table is sized for its capacity: the average entries per bin it is built
/// (and `reserve`d) for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Sizing {
    /// 2.6 entries per bin: about 31.5 B per 16-byte entry (24.6 B of bins, the rest chained
    /// buckets). About 18 % of the entries sit in a chained line, so a Get of one of them reads
    /// a second line.
    #[default]
    Compact,
    /// 1.5 entries per bin: about 45.5 B per entry, and only about 6 % of the entries in a
    /// chained line: Gets read about 1.07 lines instead of about 1.2.
    Fast,
}

impl Sizing {
    /// Entries per bin as a fraction (numerator, denominator).
    const fn load(self) -> (usize, usize) {
        match self {
            Sizing::Compact => (13, 5),
            Sizing::Fast => (3, 2),
        }
    }
}

/// Bins migrated per claimed chunk during a resize.
#[cfg(not(loom))]
const MIGRATE_CHUNK: usize = 256;
#[cfg(loom)]
const MIGRATE_CHUNK: usize = 1;

const VERSION_MASK: u64 = 0xffff_ffff;
const LOCK: u64 = 1 << 32;
const STATE_MASK: u64 = 0b11 << 33;
const IN_TRANSFER: u64 = 1 << 33;
const DONE: u64 = 2 << 33;
const VALID_SHIFT: u32 = 35;
const VALID_MASK: u64 = ((1 << BIN_SLOTS) - 1) << VALID_SHIFT;
const SINGLE_SLOT_BITS: u64 = 0b1111 << PRIMARY_SLOTS;
const WIDE_SLOT_BITS: u64 = ((1 << WIDE_SLOTS) - 1) << (PRIMARY_SLOTS + SINGLE_SLOTS);

/// The valid bits of header `h`. They are the top field: the bits above them are never set
/// (every header is composed of the fields above), so a shift suffices.
#[inline(always)]
fn valid_bits(h: u64) -> u64 {
    debug_assert_eq!(h & !(VALID_MASK | STATE_MASK | LOCK | VERSION_MASK), 0);
    h >> VALID_SHIFT
}

#[inline(always)]
fn bit(s: usize) -> u64 {
    1 << (VALID_SHIFT + s as u32)
}

/// `h` with its version incremented (wrapping within the version field).
#[inline(always)]
fn bumped(h: u64) -> u64 {
    (h & !VERSION_MASK) | (h.wrapping_add(1) & VERSION_MASK)
}

#[inline(always)]
fn same_version(a: u64, b: u64) -> bool {
    (a ^ b) & VERSION_MASK == 0
}

/// One entry: an 8-byte key (or key hash) and an 8-byte value (or pointer).
#[derive(Default)]
#[repr(C)]
pub(crate) struct Slot {
    key: AtomicU64,
    value: AtomicU64,
}

/// The bin's first cache line: header, link metadata and three slots.
#[derive(Default)]
#[repr(C, align(64))]
pub(crate) struct Primary {
    header: AtomicU64,
    link: AtomicU64,
    slots: [Slot; PRIMARY_SLOTS],
}

/// A chained overflow cache line with four slots.
#[derive(Default)]
#[repr(C, align(64))]
pub(crate) struct Single {
    slots: [Slot; SINGLE_SLOTS],
}

/// A chained overflow bucket of three cache lines with twelve slots.
#[derive(Default)]
#[repr(C, align(64))]
pub(crate) struct Wide {
    slots: [Slot; WIDE_SLOTS],
}

// SAFETY: these are arrays of `AtomicU64`, for which zero bytes are the value 0, the same as
// `Default` (under loom `Region` constructs them with `Default` instead).
unsafe impl Zeroable for Primary {}
// SAFETY: as for `Primary`.
unsafe impl Zeroable for Single {}
// SAFETY: as for `Primary`.
unsafe impl Zeroable for Wide {}

#[cfg(not(loom))]
const _: () = {
    assert!(size_of::<Primary>() == 64);
    assert!(size_of::<Single>() == 64);
    assert!(size_of::<Wide>() == 192);
    // version, lock, state and one valid bit per slot fit the header word.
    assert!(VALID_SHIFT as usize + BIN_SLOTS <= 64);
    assert!(size_of::<Slot>() == 16);
};

/// Decides whether a slot whose key word matched really holds the looked-for entry (the
/// typed maps store a key hash in the key word and compare the full key behind the pointer).
///
/// The two items with defaults exist for the planted-bug test of the linearizability checker
/// (`src/lincheck_tests.rs`); every real matcher keeps them, and they compile away.
pub(crate) trait Matcher {
    /// Whether a Get re-checks the bin version after reading. Always true outside the
    /// planted-bug test, which turns it off to show that the checker catches the result.
    const RECHECK: bool = true;

    fn matches(&self, value: u64) -> bool;

    /// Called by a Get after a slot's key word matched and before its value is loaded: the
    /// test pauses the reader here while another thread reuses the slot.
    #[inline(always)]
    fn key_matched(&self) {}
}

/// The `u64` fast path: the key word is the key.
pub(crate) struct AnyValue;

impl Matcher for AnyValue {
    #[inline(always)]
    fn matches(&self, _value: u64) -> bool {
        true
    }
}

/// A write request, applied under the bin lock.
#[derive(Clone, Copy, Debug)]
pub(crate) enum WriteOp {
    Insert(u64),
    Put(u64),
    Upsert(u64),
    Delete,
}

enum Locked {
    Held(u64),
    Moved,
    InTransfer,
}

struct NeedGrow;

/// Single-link pool size for `nbins` bins: 3/8 of the bins. At 2.6 entries per bin 26 % of
/// the bins hold more than 3 entries (Poisson); the pool is only reserved, and pages nobody
/// linked stay virtual.
fn single_cap(nbins: usize) -> usize {
    (nbins / 8 * 3).max(1)
}

/// Wide-link pool size for `nbins` bins: 1/32 of them (0.5 % hold more than 7 entries at
/// 2.6 per bin).
fn wide_cap(nbins: usize) -> usize {
    (nbins / 32).max(1)
}

/// Bins for an initial capacity of `capacity` entries at `sizing` (by default 2.6 entries per
/// bin on average, where about 82 % of entries sit in the primary line: Poisson occupancy).
pub(crate) fn bins_for(capacity: usize, sizing: Sizing) -> usize {
    let (num, den) = sizing.load();
    capacity.saturating_mul(den).div_ceil(num).max(1)
}

/// `nbins` rounded up to whole 2 MiB pages when the bins will be mapped on huge pages (see
/// `Region::new`). The kernel backs the last, partly used huge page in full anyway (1.4 B
/// per key at 1M keys), so the extra bins cost no memory, and they lower the load a little,
/// which links fewer overflow buckets. Doubling keeps the count a whole number of pages.
fn whole_huge_pages(nbins: usize, huge: bool) -> usize {
    #[cfg(all(feature = "std", target_os = "linux", not(loom)))]
    {
        let per_page = crate::mem::HUGE_PAGE / size_of::<Primary>();
        if huge && nbins >= per_page {
            return nbins.div_ceil(per_page).saturating_mul(per_page);
        }
    }
    let _ = huge;
    nbins
}

/// One generation of the table: bins, overflow pools, and the resize state.
pub(crate) struct Index {
    bins: Region<Primary>,
    singles: Region<Single>,
    wides: Region<Wide>,
    singles_used: AtomicUsize,
    wides_used: AtomicUsize,
    /// The index this one migrates into; null when no resize is under way.
    next: AtomicPtr<Index>,
    /// Next bin to claim for migration.
    claim: AtomicUsize,
    /// Bins migrated so far.
    migrated: AtomicUsize,
}

impl Index {
    fn new(nbins: usize, singles: usize, wides: usize, huge: bool) -> Self {
        Index {
            bins: Region::new(nbins, huge),
            singles: Region::new_pool(singles, huge),
            wides: Region::new_pool(wides, huge),
            singles_used: AtomicUsize::new(0),
            wides_used: AtomicUsize::new(0),
            next: AtomicPtr::new(ptr::null_mut()),
            claim: AtomicUsize::new(0),
            migrated: AtomicUsize::new(0),
        }
    }

    #[inline(always)]
    pub(crate) fn nbins(&self) -> usize {
        self.bins.len()
    }

    /// The primary bucket of hash `h`.
    #[inline(always)]
    pub(crate) fn bin(&self, h: u64) -> &Primary {
        let b = bin_of(h, self.bins.len());
        // SAFETY: `bin_of(h, n) < n` for every `h` (it is `h * n / 2^64` rounded down).
        unsafe { self.bins.as_slice().get_unchecked(b) }
    }

    /// The index this one is migrating into.
    ///
    /// # Safety
    /// A bin of `self` must have been seen in state Done (or `next` otherwise known to be
    /// set), and the caller must hold the pin through which it reached `self`: `next` is
    /// retired only after `self`, so it outlives that pin as `self` does.
    #[inline]
    unsafe fn next_unchecked(&self) -> &Index {
        let p = self.next.load(Ordering::Acquire);
        debug_assert!(!p.is_null(), "a Done bin implies a next index");
        // SAFETY: by the contract, `next` is set and lives as long as `self` is reachable.
        unsafe { &*p }
    }

    /// Slot `s` of `bin`, given the bin's link word. `None` if the overflow bucket that
    /// would hold it is not linked.
    #[inline]
    fn slot<'a>(&'a self, bin: &'a Primary, link: u64, s: usize) -> Option<&'a Slot> {
        if s < PRIMARY_SLOTS {
            bin.slots.get(s)
        } else if s < PRIMARY_SLOTS + SINGLE_SLOTS {
            let i = (link & 0xffff_ffff) as usize;
            let b = self.singles.as_slice().get(i.checked_sub(1)?)?;
            b.slots.get(s - PRIMARY_SLOTS)
        } else {
            let i = (link >> 32) as usize;
            let b = self.wides.as_slice().get(i.checked_sub(1)?)?;
            b.slots.get(s - PRIMARY_SLOTS - SINGLE_SLOTS)
        }
    }

    /// Finds the valid slot (per `header`) holding `key` whose value `m` accepts.
    #[inline(always)]
    fn find<M: Matcher>(
        &self,
        bin: &Primary,
        header: u64,
        key: u64,
        m: &M,
    ) -> Option<(usize, u64)> {
        let valid = valid_bits(header);
        let mut hits = primary_hits(bin, valid, key);
        while hits != 0 {
            let s = hits.trailing_zeros() as usize;
            hits &= hits - 1;
            m.key_matched();
            let v = bin.slots[s].value.load(Ordering::Acquire);
            if m.matches(v) {
                return Some((s, v));
            }
        }
        if valid >> PRIMARY_SLOTS == 0 {
            return None;
        }
        self.find_overflow_slot(bin, valid, key, m)
    }

    #[inline(never)]
    fn find_overflow_slot<M: Matcher>(
        &self,
        bin: &Primary,
        valid: u64,
        key: u64,
        m: &M,
    ) -> Option<(usize, u64)> {
        self.find_overflow(bin, valid, key, m)
    }

    /// The value of the valid slot holding `key`, for Gets. Returns `Option<u64>`, which
    /// travels in registers: a Get of a key in the primary line runs without a call and
    /// without stack traffic, so more Gets fit the out-of-order window.
    #[inline(always)]
    fn find_value<M: Matcher>(&self, bin: &Primary, header: u64, key: u64, m: &M) -> Option<u64> {
        let valid = valid_bits(header);
        let mut hits = primary_hits(bin, valid, key);
        while hits != 0 {
            let s = hits.trailing_zeros() as usize;
            hits &= hits - 1;
            m.key_matched();
            let v = bin.slots[s].value.load(Ordering::Acquire);
            if m.matches(v) {
                return Some(v);
            }
        }
        if valid >> PRIMARY_SLOTS == 0 {
            return None;
        }
        self.find_overflow_value(bin, valid, key, m)
    }

    /// The chained part of `find_value`: the single-link line is matched without branches,
    /// as the primary line is (most chained entries sit there: 26 % of the bins link one at
    /// 2.6 entries per bin, 0.5 % a wide bucket); the wide bucket is scanned slot by slot,
    /// out of line. Inlined: an unbatched Get of a key in the single line (18 % of them at
    /// the default sizing) then pays no call, no register saves and no stack traffic.
    #[inline(always)]
    fn find_overflow_value<M: Matcher>(
        &self,
        bin: &Primary,
        valid: u64,
        key: u64,
        m: &M,
    ) -> Option<u64> {
        let link = bin.link.load(Ordering::Relaxed);
        if let Some((single, mut hits)) = self.single_hits(link, valid, key) {
            while hits != 0 {
                let s = hits.trailing_zeros() as usize;
                hits &= hits - 1;
                m.key_matched();
                let v = single.slots[s].value.load(Ordering::Acquire);
                if m.matches(v) {
                    return Some(v);
                }
            }
        }
        if valid & WIDE_SLOT_BITS == 0 {
            return None;
        }
        self.find_wide_value(bin, valid & WIDE_SLOT_BITS, key, m)
    }

    /// The wide bucket's part of `find_value` (0.5 % of the bins link one).
    #[inline(never)]
    fn find_wide_value<M: Matcher>(
        &self,
        bin: &Primary,
        valid: u64,
        key: u64,
        m: &M,
    ) -> Option<u64> {
        self.find_overflow(bin, valid, key, m).map(|(_, v)| v)
    }

    /// The single-link bucket named by `link`, if the bin (valid bits `valid`) has valid
    /// slots in it, and those of its valid slots whose key word is `key`, as a bit mask.
    /// Matched without branches on the keys, as the primary line is.
    #[inline(always)]
    fn single_hits(&self, link: u64, valid: u64, key: u64) -> Option<(&Single, u64)> {
        let single_valid = (valid & SINGLE_SLOT_BITS) >> PRIMARY_SLOTS;
        if single_valid == 0 {
            return None;
        }
        let single = (link & 0xffff_ffff)
            .checked_sub(1)
            .and_then(|i| self.singles.as_slice().get(i as usize))?;
        let hits = single
            .slots
            .iter()
            .enumerate()
            .fold(0u64, |acc, (i, slot)| {
                acc | (u64::from(slot.key.load(Ordering::Relaxed) == key) << i)
            })
            & single_valid;
        Some((single, hits))
    }

    /// Prefetches the chained lines of `bin` that hold valid slots (per `valid`), for the
    /// second stage of a batched Get.
    #[inline(always)]
    fn prefetch_chained(&self, bin: &Primary, valid: u64) {
        let link = bin.link.load(Ordering::Relaxed);
        if valid & SINGLE_SLOT_BITS != 0
            && let Some(b) = (link & 0xffff_ffff)
                .checked_sub(1)
                .and_then(|i| self.singles.as_slice().get(i as usize))
        {
            prefetch(b);
        }
        if valid & WIDE_SLOT_BITS != 0
            && let Some(b) = (link >> 32)
                .checked_sub(1)
                .and_then(|i| self.wides.as_slice().get(i as usize))
        {
            // The lines of the wide bucket that hold valid slots (four slots a line).
            let lines = valid >> (PRIMARY_SLOTS + SINGLE_SLOTS);
            for (l, line) in b.slots.chunks(4).enumerate() {
                if lines >> (4 * l) & 0xf != 0 {
                    prefetch(line.as_ptr());
                }
            }
        }
    }

    #[inline(always)]
    fn find_overflow<M: Matcher>(
        &self,
        bin: &Primary,
        valid: u64,
        key: u64,
        m: &M,
    ) -> Option<(usize, u64)> {
        let link = bin.link.load(Ordering::Relaxed);
        let mut rest = valid & !((1 << PRIMARY_SLOTS) - 1);
        while rest != 0 {
            let s = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            if let Some(slot) = self.slot(bin, link, s)
                && slot.key.load(Ordering::Relaxed) == key
            {
                m.key_matched();
                let v = slot.value.load(Ordering::Acquire);
                if m.matches(v) {
                    return Some((s, v));
                }
            }
        }
        None
    }

    fn alloc_from(used: &AtomicUsize, cap: usize) -> Option<usize> {
        let mut n = used.load(Ordering::Relaxed);
        loop {
            if n >= cap {
                return None;
            }
            match used.compare_exchange_weak(n, n + 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(n),
                Err(now) => n = now,
            }
        }
    }

    /// A free slot of the locked `bin` (header `hl`), linking an overflow bucket if allowed.
    /// The caller holds the bin lock, so the link word is ours to change.
    fn claim_free_slot(&self, bin: &Primary, hl: u64, may_allocate: bool) -> Option<usize> {
        let free = !valid_bits(hl) & ((1 << BIN_SLOTS) - 1);
        let primary = free & ((1 << PRIMARY_SLOTS) - 1);
        if primary != 0 {
            return Some(primary.trailing_zeros() as usize);
        }
        let mut link = bin.link.load(Ordering::Relaxed);
        let single = free & SINGLE_SLOT_BITS;
        if single != 0 {
            if link & 0xffff_ffff != 0 {
                return Some(single.trailing_zeros() as usize);
            }
            if may_allocate
                && let Some(i) = Self::alloc_from(&self.singles_used, self.singles.len())
            {
                link |= i as u64 + 1;
                // Published to readers by the release store of the header that sets the
                // first valid bit in the new bucket.
                bin.link.store(link, Ordering::Relaxed);
                return Some(PRIMARY_SLOTS);
            }
        }
        let wide = free & WIDE_SLOT_BITS;
        if wide != 0 {
            if link >> 32 != 0 {
                return Some(wide.trailing_zeros() as usize);
            }
            if may_allocate && let Some(i) = Self::alloc_from(&self.wides_used, self.wides.len()) {
                link |= (i as u64 + 1) << 32;
                bin.link.store(link, Ordering::Relaxed);
                return Some(PRIMARY_SLOTS + SINGLE_SLOTS);
            }
        }
        None
    }

    /// Copies the entries of a consistent snapshot of bin `b` into `out`, following Done
    /// bins into the next index (bin `b` lives on in bins `2b` and `2b + 1` there).
    ///
    /// # Safety
    /// The caller holds the pin through which it reached `self`.
    pub(crate) unsafe fn snapshot_bin(&self, b: usize, out: &mut Vec<(u64, u64)>) {
        let bin = &self.bins.as_slice()[b];
        loop {
            let h1 = bin.header.load(Ordering::Acquire);
            if h1 & STATE_MASK == DONE {
                // SAFETY: the bin is Done, and the caller's pin protects the chain.
                let next = unsafe { self.next_unchecked() };
                // SAFETY: same pin.
                unsafe {
                    next.snapshot_bin(2 * b, out);
                    next.snapshot_bin(2 * b + 1, out);
                }
                return;
            }
            let start = out.len();
            let link = bin.link.load(Ordering::Relaxed);
            let mut valid = valid_bits(h1);
            while valid != 0 {
                let s = valid.trailing_zeros() as usize;
                valid &= valid - 1;
                if let Some(slot) = self.slot(bin, link, s) {
                    out.push((
                        slot.key.load(Ordering::Relaxed),
                        slot.value.load(Ordering::Acquire),
                    ));
                }
            }
            fence(Ordering::Acquire);
            if same_version(h1, bin.header.load(Ordering::Relaxed)) {
                return;
            }
            out.truncate(start);
        }
    }
}

/// The valid primary slots whose key word is `key`, as a bit mask.
///
/// Computed without branches on the loaded keys (as hashbrown matches a control group): a
/// data-dependent "which slot" branch mispredicts about half the time, and each misprediction
/// throws away the loads that the out-of-order core had already started for the following
/// requests, which is most of an unbatched Get's memory-level parallelism.
#[inline(always)]
fn primary_hits(bin: &Primary, valid: u64, key: u64) -> u64 {
    let k0 = bin.slots[0].key.load(Ordering::Relaxed);
    let k1 = bin.slots[1].key.load(Ordering::Relaxed);
    let k2 = bin.slots[2].key.load(Ordering::Relaxed);
    (u64::from(k0 == key) | (u64::from(k1 == key) << 1) | (u64::from(k2 == key) << 2)) & valid
}

/// Locks a bin for writing, unless it moved to the next index or is being moved.
#[inline]
fn lock(bin: &Primary) -> Locked {
    let mut backoff = Backoff::new();
    loop {
        let h = bin.header.load(Ordering::Acquire);
        match h & STATE_MASK {
            DONE => return Locked::Moved,
            IN_TRANSFER => return Locked::InTransfer,
            _ => {}
        }
        if h & LOCK == 0
            && bin
                .header
                .compare_exchange_weak(h, h | LOCK, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            // Slot writes that follow must not become visible before the lock: a reader whose
            // slot loads see them then sees (at least) this header in its second load. Every
            // earlier version change was made by a previous holder and is ordered before the
            // lock by the acquire above.
            fence(Ordering::Release);
            return Locked::Held(h | LOCK);
        }
        backoff.snooze();
    }
}

/// Memory held by the current index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryUsage {
    /// Bins (primary buckets, 64 bytes each).
    pub bins: usize,
    /// Single-link overflow buckets linked into bins / reserved in the pool.
    pub singles_used: usize,
    /// Single-link overflow buckets reserved in the pool.
    pub singles_reserved: usize,
    /// Wide-link overflow buckets linked into bins.
    pub wides_used: usize,
    /// Wide-link overflow buckets reserved in the pool.
    pub wides_reserved: usize,
    /// Bytes reserved for bins and both pools (rounded to whole huge pages where mapped).
    pub reserved_bytes: usize,
    /// Entries in the table when measured.
    pub entries: usize,
    /// How the bin array was allocated.
    pub pages: PageKind,
}

impl MemoryUsage {
    /// Reserved bytes per entry (`reserved_bytes / entries`; 0 for an empty table).
    pub fn bytes_per_entry(&self) -> f64 {
        if self.entries == 0 {
            0.0
        } else {
            self.reserved_bytes as f64 / self.entries as f64
        }
    }
}

/// Stripes of the length counter (threads add to different cache lines).
#[cfg(not(loom))]
const STRIPES: usize = 8;
#[cfg(loom)]
const STRIPES: usize = 1;

/// The table core over 8-byte keys and 8-byte values.
pub(crate) struct RawTable {
    current: AtomicPtr<Index>,
    collector: Collector,
    counts: Box<[Padded<AtomicU64>]>,
    huge: bool,
    sizing: Sizing,
}

/// Frees an `Index` handed to the collector.
///
/// # Safety
/// `p` must come from `Box::<Index>::into_raw` and be unreachable by any pin.
unsafe fn free_index(p: *mut u8) {
    // SAFETY: by the contract.
    drop(unsafe { Box::from_raw(p.cast::<Index>()) });
}

impl RawTable {
    pub(crate) fn new(capacity: usize, huge: bool, sizing: Sizing) -> Self {
        let nbins = whole_huge_pages(bins_for(capacity, sizing), huge);
        let index = Box::new(Index::new(nbins, single_cap(nbins), wide_cap(nbins), huge));
        let mut counts = Vec::with_capacity(STRIPES);
        counts.resize_with(STRIPES, Padded::default);
        RawTable {
            current: AtomicPtr::new(Box::into_raw(index)),
            collector: Collector::new(),
            counts: counts.into_boxed_slice(),
            huge,
            sizing,
        }
    }

    /// Pins the calling thread (see `reclaim`). The participant search starts at a slot
    /// derived from the stack address, so threads (whose stacks lie far apart) rarely meet.
    #[inline]
    pub(crate) fn pin(&self) -> Pin<'_> {
        // Under loom the exploration must be deterministic: always start at slot 0.
        #[cfg(loom)]
        let hint = 0;
        #[cfg(not(loom))]
        let hint = {
            let marker = 0u8;
            mix64(ptr::addr_of!(marker) as usize as u64 >> 16) as usize
        };
        self.collector.pin(hint)
    }

    /// The current index, protected by `pin`.
    #[inline(always)]
    pub(crate) fn index<'p>(&'p self, _pin: &'p Pin<'_>) -> &'p Index {
        // SAFETY: `current` is never null; an index is retired only after it stopped being
        // current, and freed only when every pin older than that has ended, so it lives at
        // least as long as `_pin`.
        unsafe { &*self.current.load(Ordering::Acquire) }
    }

    fn count(&self, pin: &Pin<'_>, delta: i64) {
        self.counts[pin.slot() % STRIPES]
            .0
            .fetch_add(delta as u64, Ordering::Relaxed);
    }

    /// Entries (exact when no write is in flight).
    pub(crate) fn len(&self) -> usize {
        let sum = self
            .counts
            .iter()
            .fold(0u64, |a, c| a.wrapping_add(c.0.load(Ordering::Relaxed)));
        (sum as i64).max(0) as usize
    }

    /// Looks `key` (hash `h = mix64(key)`) up, starting at `idx`.
    ///
    /// The state of the bin is looked at only when nothing valid matched: a Done bin has no
    /// valid bits (`migrate_bin` clears them), so a hit is never in a Done bin, and a Get of
    /// a key in the primary line spends no instruction on the resize.
    #[inline(always)]
    pub(crate) fn get_in<M: Matcher>(&self, start: &Index, key: u64, h: u64, m: &M) -> Option<u64> {
        let mut idx = start;
        loop {
            let bin = idx.bin(h);
            let h1 = bin.header.load(Ordering::Acquire);
            let found = idx.find_value(bin, h1, key, m);
            if found.is_none() && valid_bits(h1) == 0 {
                if h1 & STATE_MASK == DONE {
                    // SAFETY: the bin is Done; `start` was reached through a live pin (the
                    // caller's `&Index` comes from `index(pin)`), which protects the chain.
                    idx = unsafe { idx.next_unchecked() };
                    continue;
                }
                // An empty bin: the header alone is the snapshot, no slot was read.
                return None;
            }
            if !M::RECHECK {
                return found;
            }
            fence(Ordering::Acquire);
            let h2 = bin.header.load(Ordering::Relaxed);
            if same_version(h1, h2) {
                return found;
            }
        }
    }

    /// The first stage of a batched Get: looks only at the (prefetched) primary line.
    /// `Ok(result)` when that line decides the Get. Otherwise `Err(h1)`, the header it
    /// read: if the key may sit in a chained overflow line, that line is prefetched, and the
    /// caller finishes the request with [`RawTable::finish_chained`] (then `get_in`) after
    /// the other requests of the batch, by when the line has arrived. Also `Err` when the
    /// bin moved (Done) or changed while it was read.
    #[inline(always)]
    pub(crate) fn probe_primary(
        &self,
        idx: &Index,
        bin: &Primary,
        key: u64,
    ) -> Result<Option<u64>, u64> {
        let h1 = bin.header.load(Ordering::Acquire);
        let valid = valid_bits(h1);
        let hits = primary_hits(bin, valid, key);
        if hits == 0 {
            if valid >> PRIMARY_SLOTS != 0 {
                idx.prefetch_chained(bin, valid);
                return Err(h1);
            }
            // Empty (the header alone is the snapshot), or Done (valid bits cleared): the
            // second stage follows the resize.
            return if h1 & STATE_MASK == DONE {
                Err(h1)
            } else {
                Ok(None)
            };
        }
        let v = bin.slots[hits.trailing_zeros() as usize]
            .value
            .load(Ordering::Acquire);
        fence(Ordering::Acquire);
        if same_version(h1, bin.header.load(Ordering::Relaxed)) {
            Ok(Some(v))
        } else {
            Err(h1)
        }
    }

    /// The second stage of a batched Get whose `probe_primary` returned `Err(h1)`: matches
    /// the (prefetched) single-link line against the snapshot `h1`, without hashing again or
    /// re-reading the primary slots. The probe found no valid primary slot holding the key at
    /// version `h1`; this reads the chained line and re-checks that the version is still
    /// `h1`, so the primary slots, the link word and the chained slots were all read within
    /// one version, exactly as `get_in` reads them. `None` when that does not decide the Get
    /// (the bin changed, moved, or has a wide bucket and the key is not in the single line):
    /// the caller then runs `get_in`.
    #[inline(always)]
    pub(crate) fn finish_chained(
        &self,
        idx: &Index,
        bin: &Primary,
        h1: u64,
        key: u64,
    ) -> Option<Option<u64>> {
        let valid = valid_bits(h1);
        // A Done bin has no valid bits; a probe that failed its re-check may have any: both
        // are decided by `get_in` (the re-check below fails for the latter anyway).
        if valid >> PRIMARY_SLOTS == 0 {
            return None;
        }
        let link = bin.link.load(Ordering::Relaxed);
        let mut found = None;
        if let Some((single, hits)) = idx.single_hits(link, valid, key)
            && hits != 0
        {
            found = Some(
                single.slots[hits.trailing_zeros() as usize]
                    .value
                    .load(Ordering::Acquire),
            );
        }
        if found.is_none() && valid & WIDE_SLOT_BITS != 0 {
            return None;
        }
        fence(Ordering::Acquire);
        if same_version(h1, bin.header.load(Ordering::Relaxed)) {
            Some(found)
        } else {
            None
        }
    }

    /// Applies `op` to `key` (hash `h`), starting at `start`. Returns the value the key had
    /// when the operation took effect (for Insert: the existing value if it did not insert).
    pub(crate) fn write<M: Matcher>(
        &self,
        pin: &Pin<'_>,
        start: &Index,
        key: u64,
        h: u64,
        op: WriteOp,
        m: &M,
    ) -> Option<u64> {
        let mut idx = start;
        let mut backoff = Backoff::new();
        loop {
            if !idx.next.load(Ordering::Relaxed).is_null() {
                self.help_migrate(pin, idx);
            }
            let bin = idx.bin(h);
            let hl = match lock(bin) {
                Locked::Held(hl) => hl,
                Locked::Moved => {
                    // SAFETY: the bin is Done and `pin` protects the chain from `start`.
                    idx = unsafe { idx.next_unchecked() };
                    continue;
                }
                Locked::InTransfer => {
                    backoff.snooze();
                    continue;
                }
            };
            match self.apply_locked(pin, idx, bin, hl, key, op, m) {
                Ok(r) => return r,
                Err(NeedGrow) => {
                    self.grow(pin, idx);
                    idx = self.index(pin);
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn apply_locked<M: Matcher>(
        &self,
        pin: &Pin<'_>,
        idx: &Index,
        bin: &Primary,
        hl: u64,
        key: u64,
        op: WriteOp,
        m: &M,
    ) -> Result<Option<u64>, NeedGrow> {
        let unlock = || bin.header.store(hl & !LOCK, Ordering::Release);
        match (idx.find(bin, hl, key, m), op) {
            (Some((_, old)), WriteOp::Insert(_)) => {
                unlock();
                Ok(Some(old))
            }
            (Some((s, old)), WriteOp::Put(v) | WriteOp::Upsert(v)) => {
                let link = bin.link.load(Ordering::Relaxed);
                if let Some(slot) = idx.slot(bin, link, s) {
                    slot.value.store(v, Ordering::Release);
                }
                unlock();
                Ok(Some(old))
            }
            (Some((s, old)), WriteOp::Delete) => {
                bin.header
                    .store(bumped(hl & !bit(s)) & !LOCK, Ordering::Release);
                self.count(pin, -1);
                Ok(Some(old))
            }
            (None, WriteOp::Put(_) | WriteOp::Delete) => {
                unlock();
                Ok(None)
            }
            (None, WriteOp::Insert(v) | WriteOp::Upsert(v)) => {
                // Overflow buckets of an index still being filled by a migration are reserved
                // for the migration (which then cannot run out of them).
                let may_allocate = ptr::eq(self.current.load(Ordering::Acquire), idx);
                let Some(s) = idx.claim_free_slot(bin, hl, may_allocate) else {
                    let full = valid_bits(hl) == (1 << BIN_SLOTS) - 1;
                    let all_same = full && {
                        let link = bin.link.load(Ordering::Relaxed);
                        (0..BIN_SLOTS).all(|s| {
                            idx.slot(bin, link, s)
                                .is_some_and(|sl| sl.key.load(Ordering::Relaxed) == key)
                        })
                    };
                    unlock();
                    // Doubling cannot split entries with one key word (only the typed maps,
                    // which store hashes, can have several): fail loudly instead of growing
                    // until memory runs out.
                    assert!(
                        !all_same,
                        "more than {BIN_SLOTS} distinct keys share one 64-bit hash"
                    );
                    return Err(NeedGrow);
                };
                let link = bin.link.load(Ordering::Relaxed);
                if let Some(slot) = idx.slot(bin, link, s) {
                    slot.key.store(key, Ordering::Relaxed);
                    slot.value.store(v, Ordering::Relaxed);
                }
                bin.header
                    .store(bumped(hl | bit(s)) & !LOCK, Ordering::Release);
                self.count(pin, 1);
                Ok(None)
            }
        }
    }

    /// Starts a resize of `full` (if it is current and none is under way) and helps finish
    /// the migration that is under way.
    #[cold]
    fn grow(&self, pin: &Pin<'_>, full: &Index) {
        let cur = self.index(pin);
        if ptr::eq(cur, full) && cur.next.load(Ordering::Acquire).is_null() {
            let n = cur.nbins();
            let fresh = Box::into_raw(Box::new(Index::new(
                n * 2,
                single_cap(n * 2).max(2 * cur.singles.len()),
                wide_cap(n * 2).max(2 * cur.wides.len()),
                self.huge,
            )));
            if cur
                .next
                .compare_exchange(ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                // SAFETY: `fresh` lost the race and was never published.
                drop(unsafe { Box::from_raw(fresh) });
            }
        }
        self.finish_migration(pin, cur);
    }

    /// The sizing the table was built with.
    pub(crate) fn sizing(&self) -> Sizing {
        self.sizing
    }

    /// Doubles the table now (used by `reserve` and the resize models).
    pub(crate) fn grow_now(&self, pin: &Pin<'_>) {
        let cur = self.index(pin);
        self.grow(pin, cur);
    }

    /// Migrates chunks of `old` until none is left to claim, then waits for the chunks other
    /// threads claimed and for `current` to move on.
    fn finish_migration(&self, pin: &Pin<'_>, old: &Index) {
        while self.help_migrate(pin, old) {}
        let mut backoff = Backoff::new();
        while !old.next.load(Ordering::Acquire).is_null()
            && ptr::eq(self.current.load(Ordering::Acquire), old)
        {
            backoff.snooze();
        }
    }

    /// Migrates one chunk of `old` into its next index. Returns false when there is no
    /// resize or no chunk left to claim.
    fn help_migrate(&self, _pin: &Pin<'_>, old: &Index) -> bool {
        let next = old.next.load(Ordering::Acquire);
        if next.is_null() {
            return false;
        }
        // SAFETY: `next` is published and is retired only after `old`, which `_pin` protects.
        let new = unsafe { &*next };
        let n = old.nbins();
        let start = old.claim.fetch_add(MIGRATE_CHUNK, Ordering::Relaxed);
        if start >= n {
            return false;
        }
        let end = (start + MIGRATE_CHUNK).min(n);
        for b in start..end {
            migrate_bin(old, new, b);
        }
        let done = old.migrated.fetch_add(end - start, Ordering::AcqRel) + (end - start);
        if done == n {
            let old_ptr = old as *const Index as *mut Index;
            // Free through the pointer the swing read out of `current` (it carries the
            // provenance of `Box::into_raw`), not through `old_ptr`, which comes from a
            // shared reference and may not be used to free (Miri's Stacked Borrows).
            if let Ok(retired) =
                self.current
                    .compare_exchange(old_ptr, next, Ordering::AcqRel, Ordering::Acquire)
            {
                // SAFETY: `old` is no longer current, so new pins cannot reach it (older
                // indexes that point to it were retired before it); it was created by
                // `Box::into_raw` and is retired exactly once, by the thread whose swing won.
                unsafe { self.collector.retire(retired.cast(), free_index) };
                self.collector.collect();
            }
        }
        true
    }

    /// Bins, pools and their use in the current index.
    pub(crate) fn memory_usage(&self) -> MemoryUsage {
        let pin = self.pin();
        let idx = self.index(&pin);
        MemoryUsage {
            bins: idx.nbins(),
            singles_used: idx.singles_used.load(Ordering::Relaxed),
            singles_reserved: idx.singles.len(),
            wides_used: idx.wides_used.load(Ordering::Relaxed),
            wides_reserved: idx.wides.len(),
            reserved_bytes: idx.bins.reserved_bytes()
                + idx.singles.reserved_bytes()
                + idx.wides.reserved_bytes(),
            entries: self.len(),
            pages: idx.bins.kind(),
        }
    }

    /// Slots in the current index (bins × 3 plus the overflow pools).
    pub(crate) fn capacity(&self) -> usize {
        let pin = self.pin();
        let idx = self.index(&pin);
        idx.nbins() * PRIMARY_SLOTS
            + idx.singles.len() * SINGLE_SLOTS
            + idx.wides.len() * WIDE_SLOTS
    }

    /// Frees retired indexes and records that no pin can see any more.
    pub(crate) fn collect(&self) {
        self.collector.collect();
    }

    /// Retires a pointer stored as a value (the boxed maps).
    ///
    /// # Safety
    /// As `Collector::retire`.
    pub(crate) unsafe fn retire(&self, ptr: *mut u8, free: unsafe fn(*mut u8)) {
        // SAFETY: forwarded contract.
        unsafe { self.collector.retire(ptr, free) }
    }
}

/// Moves bin `b` of `old` into bins `2b` and `2b + 1` of `new`. The caller claimed `b`.
fn migrate_bin(old: &Index, new: &Index, b: usize) {
    let bin = &old.bins.as_slice()[b];
    let hl = match lock(bin) {
        Locked::Held(hl) => hl,
        Locked::Moved | Locked::InTransfer => {
            unreachable!("bin {b} is claimed by one migrator only")
        }
    };
    // Still locked: writers see InTransfer and wait; readers go on reading the unchanged slots.
    bin.header.store(hl | IN_TRANSFER, Ordering::Release);
    let link = bin.link.load(Ordering::Relaxed);
    let mut valid = valid_bits(hl);
    while valid != 0 {
        let s = valid.trailing_zeros() as usize;
        valid &= valid - 1;
        if let Some(slot) = old.slot(bin, link, s) {
            insert_migrated(
                new,
                slot.key.load(Ordering::Relaxed),
                slot.value.load(Ordering::Relaxed),
            );
        }
    }
    // Done clears the valid bits: a reader that loads this header finds no entry here and
    // only then looks at the state (see `get_in`).
    bin.header.store(
        (bumped(hl) & !LOCK & !STATE_MASK & !VALID_MASK) | DONE,
        Ordering::Release,
    );
}

/// Inserts a migrated entry into the index being filled.
fn insert_migrated(new: &Index, key: u64, value: u64) {
    let bin = new.bin(mix64(key));
    let Locked::Held(hl) = lock(bin) else {
        unreachable!("an index being filled does not migrate itself")
    };
    // A child bin receives a subset of one parent bin (at most BIN_SLOTS entries), and its pools
    // are twice the parent's, reserved for migration while it is being filled.
    let s = new
        .claim_free_slot(bin, hl, true)
        .expect("a child bin has room for its parent's entries");
    let link = bin.link.load(Ordering::Relaxed);
    if let Some(slot) = new.slot(bin, link, s) {
        slot.key.store(key, Ordering::Relaxed);
        slot.value.store(value, Ordering::Relaxed);
    }
    bin.header
        .store(bumped(hl | bit(s)) & !LOCK, Ordering::Release);
}

impl Drop for RawTable {
    fn drop(&mut self) {
        let cur = self.current.load(Ordering::Relaxed);
        // SAFETY: `&mut self`: no pin is alive; `current` came from `Box::into_raw` and so
        // does an unfinished `next` (a migration interrupted by a panic).
        unsafe {
            let next = (*cur).next.load(Ordering::Relaxed);
            if !next.is_null() {
                drop(Box::from_raw(next));
            }
            drop(Box::from_raw(cur));
        }
    }
}

/// A resize stopped half way (some chunks migrated, the rest not), checked by hand: the
/// state every Get, batch and write can meet while other threads migrate.
#[cfg(all(test, not(loom)))]
mod half_migrated {
    use alloc::vec::Vec;

    use super::*;
    use crate::{Dlht, Options, mix64};

    fn key(i: u64) -> u64 {
        mix64(i ^ 0x00dd_ba11)
    }

    #[test]
    fn done_bins_have_no_valid_bits_and_every_key_is_found() {
        let n = 20_000u64;
        let t = Dlht::with_options(Options {
            capacity: n as usize,
            huge_pages: false,
            ..Options::default()
        });
        for i in 0..n {
            t.insert(key(i), i);
        }
        let raw = t.raw();
        let pin = raw.pin();
        let old = raw.index(&pin);
        let nbins = old.nbins();
        assert!(
            nbins > 2 * MIGRATE_CHUNK,
            "the test needs unmigrated bins left"
        );
        // Link the next index as `grow` does, then migrate one chunk only.
        let fresh = Box::into_raw(Box::new(Index::new(
            nbins * 2,
            2 * old.singles.len(),
            2 * old.wides.len(),
            false,
        )));
        old.next.store(fresh, Ordering::Release);
        assert!(raw.help_migrate(&pin, old));
        let headers: Vec<u64> = old
            .bins
            .as_slice()
            .iter()
            .map(|b| b.header.load(Ordering::Relaxed))
            .collect();
        let done = headers.iter().filter(|h| *h & STATE_MASK == DONE).count();
        assert_eq!(done, MIGRATE_CHUNK);
        for h in &headers {
            if h & STATE_MASK == DONE {
                assert_eq!(valid_bits(*h), 0, "a Done bin keeps no valid bits");
            }
        }
        // Gets, batched Gets, and misses, on both sides of the migration front.
        let g = t.pin();
        let keys: Vec<u64> = (0..n).map(key).collect();
        let mut out = vec![None; keys.len()];
        g.get_batch(&keys, &mut out);
        for (i, &k) in keys.iter().enumerate() {
            assert_eq!(g.get(k), Some(i as u64), "key {i}");
            assert_eq!(out[i], Some(i as u64), "batched key {i}");
            assert_eq!(g.get(key(n + i as u64)), None);
        }
        // Writes that meet a Done bin go to the next index, and Gets follow them.
        let moved: Vec<u64> = (0..n)
            .filter(|&i| {
                let b = bin_of(mix64(key(i)), nbins);
                headers[b] & STATE_MASK == DONE
            })
            .collect();
        assert!(!moved.is_empty());
        for &i in &moved {
            assert_eq!(g.put(key(i), i + 1), Some(i));
            assert_eq!(g.get(key(i)), Some(i + 1));
        }
        // Finishing the migration keeps everything.
        drop(g);
        drop(pin);
        t.reserve(0);
        let pin = raw.pin();
        raw.finish_migration(&pin, raw.index(&pin));
        drop(pin);
        for i in 0..n {
            let want = if moved.contains(&i) { i + 1 } else { i };
            assert_eq!(t.get(key(i)), Some(want));
        }
        assert_eq!(t.len(), n as usize);
    }
}

/// The two stages of a batched Get (`probe_primary`, then `finish_chained` for a key that
/// may sit in a chained line), with writes placed between them by hand: the second stage
/// decides only if the bin's version is still the one the first stage read.
#[cfg(all(test, not(loom)))]
mod batched_stages {
    use alloc::vec::Vec;

    use super::*;
    use crate::{Dlht, Options};

    /// A table and `n` keys that all fall into bin 0.
    fn one_bin_keys(n: usize) -> (Dlht, Vec<u64>) {
        let t = Dlht::with_options(Options {
            capacity: 64,
            huge_pages: false,
            ..Options::default()
        });
        let nbins = {
            let pin = t.raw().pin();
            t.raw().index(&pin).nbins()
        };
        let keys = (1..)
            .filter(|&k: &u64| bin_of(mix64(k), nbins) == 0)
            .take(n)
            .collect();
        (t, keys)
    }

    /// Runs the first stage for `key`; returns the header it deferred with.
    fn probe(t: &Dlht, key: u64) -> Result<Option<u64>, u64> {
        let raw = t.raw();
        let pin = raw.pin();
        let idx = raw.index(&pin);
        raw.probe_primary(idx, idx.bin(mix64(key)), key)
    }

    fn finish(t: &Dlht, h1: u64, key: u64) -> Option<Option<u64>> {
        let raw = t.raw();
        let pin = raw.pin();
        let idx = raw.index(&pin);
        raw.finish_chained(idx, idx.bin(mix64(key)), h1, key)
    }

    #[test]
    fn a_key_in_the_single_line_is_finished_from_the_probe_header() {
        let (t, k) = one_bin_keys(6);
        for (i, &key) in k[..4].iter().enumerate() {
            assert_eq!(t.insert(key, i as u64), None);
        }
        // Three keys fill the primary line: those are decided by the probe.
        for (i, &key) in k[..3].iter().enumerate() {
            assert_eq!(probe(&t, key), Ok(Some(i as u64)));
        }
        // The fourth sits in the single line, and so might an absent key of the bin.
        let h1 = probe(&t, k[3]).expect_err("deferred");
        assert_eq!(finish(&t, h1, k[3]), Some(Some(3)));
        let h1_absent = probe(&t, k[5]).expect_err("deferred");
        assert_eq!(finish(&t, h1_absent, k[5]), Some(None));
        // A Put changes the value without a version bump: still decided, with the new value.
        let h1 = probe(&t, k[3]).expect_err("deferred");
        assert_eq!(t.put(k[3], 33), Some(3));
        assert_eq!(finish(&t, h1, k[3]), Some(Some(33)));
        // A delete and an insert reusing the slot between the stages: the version moved, so
        // the second stage does not decide (the caller runs `get_in`, which sees the new state).
        let h1 = probe(&t, k[3]).expect_err("deferred");
        assert_eq!(t.delete(k[3]), Some(33));
        assert_eq!(t.insert(k[4], 4), None);
        assert_eq!(finish(&t, h1, k[3]), None);
        assert_eq!(t.get(k[3]), None);
        assert_eq!(t.get(k[4]), Some(4));
        // A write to a primary slot moves the version too.
        let h1 = probe(&t, k[4]).expect_err("deferred");
        assert_eq!(t.delete(k[0]), Some(0));
        assert_eq!(finish(&t, h1, k[4]), None);
        let h1 = probe(&t, k[4]).expect_err("deferred");
        assert_eq!(finish(&t, h1, k[4]), Some(Some(4)));
    }

    #[test]
    fn keys_in_the_wide_bucket_and_moved_bins_are_left_to_get_in() {
        let (t, k) = one_bin_keys(9);
        for (i, &key) in k[..8].iter().enumerate() {
            assert_eq!(t.insert(key, i as u64), None);
        }
        // k[7] is in the wide bucket (3 primary + 4 single slots are taken).
        let h1 = probe(&t, k[7]).expect_err("deferred");
        assert_eq!(finish(&t, h1, k[7]), None);
        let mut out = [None; 9];
        t.pin().get_batch(&k, &mut out);
        let want: Vec<Option<u64>> = (0..9).map(|i| (i < 8).then_some(i)).collect();
        assert_eq!(out.to_vec(), want);
        // After the table doubled, a header read from the old index's Done bin has no valid
        // bits: the second stage leaves it to `get_in`, which follows the resize.
        let raw = t.raw();
        let pin = raw.pin();
        let old = raw.index(&pin);
        let bin = old.bin(mix64(k[7]));
        t.reserve(4 * old.nbins() * BIN_SLOTS);
        let h1 = bin.header.load(Ordering::Acquire);
        assert_eq!(h1 & STATE_MASK, DONE);
        assert_eq!(raw.probe_primary(old, bin, k[7]), Err(h1));
        assert_eq!(raw.finish_chained(old, bin, h1, k[7]), None);
        assert_eq!(raw.get_in(old, k[7], mix64(k[7]), &AnyValue), Some(7));
    }
}
