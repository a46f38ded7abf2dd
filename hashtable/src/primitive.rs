//! The one place that names atomics, spinning and prefetching.
//!
//! Under `--cfg loom` the atomics come from `loom`, so the model tests check exactly the code
//! that ships (the crossbeam approach). Nothing else in the crate imports `core::sync::atomic`.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering, fence};

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering, fence};

/// Exponential backoff for the few places that wait (a bin locked by another writer, a bin in
/// transfer, the end of a migration). Readers never wait.
pub(crate) struct Backoff {
    #[cfg_attr(loom, allow(dead_code))]
    step: u32,
}

impl Backoff {
    pub(crate) const fn new() -> Self {
        Backoff { step: 0 }
    }

    /// Waits a little longer each call; after a few rounds gives the core away, which matters
    /// when the holder of a bin lock was preempted on a machine with few cores.
    pub(crate) fn snooze(&mut self) {
        #[cfg(loom)]
        {
            loom::thread::yield_now();
        }
        #[cfg(not(loom))]
        {
            if self.step < 6 {
                for _ in 0..(1u32 << self.step) {
                    core::hint::spin_loop();
                }
            } else {
                #[cfg(feature = "std")]
                std::thread::yield_now();
                #[cfg(not(feature = "std"))]
                for _ in 0..64 {
                    core::hint::spin_loop();
                }
            }
            self.step = self.step.saturating_add(1);
        }
    }
}

/// Asks the CPU to bring the cache line holding `p` into L1 without waiting for it.
///
/// On x86-64 this is `prefetcht0`; elsewhere it is a no-op (the batch API still works, its
/// requests just do not overlap their misses). A prefetch never faults, whatever the address.
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    {
        use core::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // SAFETY: SSE is part of the x86-64 baseline, so the instruction exists; a prefetch
        // is a hint that never faults and never reads memory architecturally.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>()) };
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom))))]
    {
        let _ = p;
    }
}

/// A value alone on its cache line, so per-thread counters do not false-share.
#[repr(align(64))]
#[derive(Default)]
pub(crate) struct Padded<T>(pub(crate) T);
