//! Epoch-based reclamation for what a concurrent reader may still be looking at: retired
//! bucket indexes after a resize, and the boxed records of [`crate::BoxedMap`].
//!
//! Why epochs: a Get must stay a handful of plain loads. Hazard pointers would add a store and
//! a full fence per record touched (and a batch of 24 touches 24); reference counts would add
//! a contended atomic write to every read. With epochs a reader announces itself once per
//! [`Pin`] (one store and one fence, amortised over a whole batch), reads freely, and writers
//! pay for reclamation. The cost is that one stalled, pinned reader delays freeing (memory,
//! never safety), which is acceptable for tables whose readers run short operations.
//!
//! The scheme: a global epoch `e`. A pinned participant publishes the epoch it saw. Garbage is
//! tagged with the epoch at retirement; the epoch advances from `e` to `e + 1` only when every
//! pinned participant has seen `e`; garbage tagged `r` is freed once the epoch reaches `r + 2`,
//! when no participant can still be pinned from before its retirement.
//! Participants are a fixed array of slots (no thread-locals, so this works in `no_std`);
//! a [`Pin`] claims a free slot for its lifetime.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::ptr;

use crate::primitive::{AtomicPtr, AtomicU64, AtomicUsize, Backoff, Ordering, Padded, fence};

/// Participant slots: how many pins can be alive at once. More pins wait for a free slot.
#[cfg(not(loom))]
pub(crate) const PARTICIPANTS: usize = 128;
#[cfg(loom)]
pub(crate) const PARTICIPANTS: usize = 3;

/// Slot word: bit 0 claimed, bit 1 pinned, bits 2.. the epoch seen when pinning.
const CLAIMED: u64 = 1;
const PINNED: u64 = 2;

/// Try to free garbage after this many pin drops of one slot (when there is garbage).
const COLLECT_EVERY: u64 = 64;

struct Retired {
    ptr: *mut u8,
    free: unsafe fn(*mut u8),
    epoch: u64,
    next: *mut Retired,
}

#[derive(Default)]
struct Participant {
    state: AtomicU64,
    /// Pins taken through this slot (only its holder writes it).
    pins: AtomicU64,
}

/// The reclamation domain of one table.
pub(crate) struct Collector {
    epoch: AtomicU64,
    slots: Box<[Padded<Participant>]>,
    garbage: AtomicPtr<Retired>,
    pending: AtomicUsize,
}

// SAFETY: the raw pointers in the garbage list are owned by the collector and handed between
// threads only through atomics; the `free` functions are required (by `retire`'s contract) to
// be callable from any thread.
unsafe impl Send for Collector {}
// SAFETY: as above; all shared state is atomic.
unsafe impl Sync for Collector {}

impl Collector {
    pub(crate) fn new() -> Self {
        let mut slots = Vec::with_capacity(PARTICIPANTS);
        slots.resize_with(PARTICIPANTS, Padded::default);
        Collector {
            epoch: AtomicU64::new(0),
            slots: slots.into_boxed_slice(),
            garbage: AtomicPtr::new(ptr::null_mut()),
            pending: AtomicUsize::new(0),
        }
    }

    /// Claims a participant slot, starting the search at `hint`, and pins it.
    pub(crate) fn pin(&self, hint: usize) -> Pin<'_> {
        let mut backoff = Backoff::new();
        let mut i = hint % PARTICIPANTS;
        let mut tried = 0;
        loop {
            let slot = &self.slots[i].0;
            if slot.state.load(Ordering::Relaxed) == 0 {
                let e = self.epoch.load(Ordering::Relaxed);
                let word = (e << 2) | CLAIMED | PINNED;
                if slot
                    .state
                    .compare_exchange(0, word, Ordering::SeqCst, Ordering::Relaxed)
                    .is_ok()
                {
                    // The announcement must be visible before any load of a shared pointer
                    // that this pin protects (store-load order needs a full fence).
                    fence(Ordering::SeqCst);
                    return Pin {
                        collector: self,
                        slot: i,
                    };
                }
            }
            i = (i + 1) % PARTICIPANTS;
            tried += 1;
            if tried % PARTICIPANTS == 0 {
                backoff.snooze();
            }
        }
    }

    /// Hands `ptr` to the collector, which calls `free(ptr)` once no pin that could have seen
    /// it is alive.
    ///
    /// # Safety
    /// `ptr` must already be unreachable for new readers (unlinked from every shared place),
    /// must be retired only once, and `free(ptr)` must be sound to call from any thread at any
    /// later time (or when the collector drops).
    pub(crate) unsafe fn retire(&self, ptr: *mut u8, free: unsafe fn(*mut u8)) {
        // The unlink happened before this fence; the epoch read after it is one a reader that
        // could still see `ptr` was pinned at or before.
        fence(Ordering::SeqCst);
        let epoch = self.epoch.load(Ordering::Relaxed);
        let node = Box::into_raw(Box::new(Retired {
            ptr,
            free,
            epoch,
            next: ptr::null_mut(),
        }));
        // SAFETY: `node` is ours until the push publishes it.
        unsafe { self.push_list(node, node) };
        self.pending.fetch_add(1, Ordering::Relaxed);
    }

    /// Pushes the list `first ..= last` (linked through `next`) onto the garbage stack.
    ///
    /// # Safety
    /// The nodes must be exclusively owned by the caller and `last` reachable from `first`.
    unsafe fn push_list(&self, first: *mut Retired, last: *mut Retired) {
        let mut head = self.garbage.load(Ordering::Relaxed);
        loop {
            // SAFETY: `last` is owned by the caller (not yet published).
            unsafe { (*last).next = head };
            match self.garbage.compare_exchange_weak(
                head,
                first,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(h) => head = h,
            }
        }
    }

    /// Advances the epoch if every pinned participant has seen the current one.
    fn try_advance(&self) -> u64 {
        fence(Ordering::SeqCst);
        let e = self.epoch.load(Ordering::Relaxed);
        for slot in self.slots.iter() {
            let s = slot.0.state.load(Ordering::Relaxed);
            if s & PINNED != 0 && (s >> 2) != e {
                return e;
            }
        }
        match self
            .epoch
            .compare_exchange(e, e + 1, Ordering::SeqCst, Ordering::Relaxed)
        {
            Ok(_) => e + 1,
            Err(now) => now,
        }
    }

    /// Frees every retired object old enough. Returns how many were freed.
    pub(crate) fn collect(&self) -> usize {
        if self.garbage.load(Ordering::Relaxed).is_null() {
            return 0;
        }
        let now = self.try_advance();
        let mut list = self.garbage.swap(ptr::null_mut(), Ordering::Acquire);
        let (mut keep_first, mut keep_last) = (ptr::null_mut::<Retired>(), ptr::null_mut());
        let mut freed = 0;
        while !list.is_null() {
            // SAFETY: the swap made the whole list ours; each node was created by `retire`.
            let node = unsafe { &mut *list };
            list = node.next;
            if node.epoch + 2 <= now {
                // SAFETY: the epoch moved two steps past the retirement, so every pin that was
                // alive when `ptr` was unlinked has ended; `retire`'s caller promised `free`
                // is sound then. The node itself came from `Box::into_raw`.
                unsafe {
                    (node.free)(node.ptr);
                    drop(Box::from_raw(node as *mut Retired));
                }
                freed += 1;
            } else {
                node.next = keep_first;
                if keep_first.is_null() {
                    keep_last = node as *mut Retired;
                }
                keep_first = node as *mut Retired;
            }
        }
        if !keep_first.is_null() {
            // SAFETY: the kept nodes are still exclusively ours, linked first ..= last.
            unsafe { self.push_list(keep_first, keep_last) };
        }
        if freed > 0 {
            self.pending.fetch_sub(freed, Ordering::Relaxed);
        }
        freed
    }

    /// Retired objects not yet freed.
    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let mut list = self.garbage.swap(ptr::null_mut(), Ordering::Acquire);
        while !list.is_null() {
            // SAFETY: `&mut self`: no pin is alive (pins borrow the collector), so everything
            // retired is unreachable; each node came from `Box::into_raw` in `retire`.
            unsafe {
                let node = Box::from_raw(list);
                list = node.next;
                (node.free)(node.ptr);
            }
        }
    }
}

/// Proof that the holder is pinned: objects it reads from the table stay allocated until the
/// pin drops. Not `Send`: it names a participant slot that its thread announced.
pub(crate) struct Pin<'c> {
    collector: &'c Collector,
    slot: usize,
}

impl Pin<'_> {
    /// The participant slot (also used to stripe counters between threads).
    #[inline(always)]
    pub(crate) fn slot(&self) -> usize {
        self.slot
    }

    /// Announces the current epoch again, letting garbage retired since the pin be freed.
    pub(crate) fn repin(&mut self) {
        let slot = &self.collector.slots[self.slot].0;
        let e = self.collector.epoch.load(Ordering::Relaxed);
        slot.state
            .store((e << 2) | CLAIMED | PINNED, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        let slot = &self.collector.slots[self.slot].0;
        // Count before releasing the slot: after the release another pin may own it.
        let pins = slot.pins.load(Ordering::Relaxed).wrapping_add(1);
        slot.pins.store(pins, Ordering::Relaxed);
        slot.state.store(0, Ordering::Release);
        if pins.is_multiple_of(COLLECT_EVERY) && self.collector.pending() != 0 {
            self.collector.collect();
        }
    }
}
