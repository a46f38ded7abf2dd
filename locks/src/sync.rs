//! The one place that names atomics, interior mutability and spinning (the crossbeam
//! approach): under `--cfg loom` they come from `loom`, so `tests/loom.rs` model-checks
//! exactly the CN-local lock table that ships. Nothing else in the crate imports
//! `core::sync::atomic` or `core::cell::UnsafeCell`.
//!
//! The local lock table (DecLock §5.1 Fig. 9, one `mtx` per local lock) needs a mutex
//! that works without `std` and on a real multi-threaded CN. Its critical sections are a
//! few comparisons and queue moves and never span an `.await`, so a test-and-test-and-set
//! spinlock fits: in the single-threaded simulator it is never contended.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[cfg(loom)]
use loom::cell::UnsafeCell;

/// `core::cell::UnsafeCell` with loom's closure API, so one mutex body serves both.
#[cfg(not(loom))]
#[derive(Debug)]
struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    const fn new(value: T) -> Self {
        Self(core::cell::UnsafeCell::new(value))
    }

    fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// Tells the CPU (or loom's scheduler) that this thread is spinning.
fn spin() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}

/// A spinning mutex whose data is only reached through [`SpinMutex::with`], so a guard
/// can never be held across an `.await`.
#[derive(Debug)]
pub(crate) struct SpinMutex<T> {
    locked: AtomicBool,
    data: UnsafeCell<T>,
}

// SAFETY: `with` hands out `&mut T` only while `locked` is held, which the Acquire CAS /
// Release store make exclusive across threads, so sharing the mutex only ever moves `T`
// between threads (hence `T: Send`), never shares it.
unsafe impl<T: Send> Sync for SpinMutex<T> {}
// SAFETY: owning the mutex is owning `T`.
unsafe impl<T: Send> Send for SpinMutex<T> {}

/// Unlocks on drop, so a panic inside the critical section does not leave it locked.
struct Unlock<'a>(&'a AtomicBool);

impl Drop for Unlock<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl<T> SpinMutex<T> {
    /// A mutex holding `value`.
    pub(crate) fn new(value: T) -> Self {
        Self {
            locked: AtomicBool::new(false),
            data: UnsafeCell::new(value),
        }
    }

    /// Runs `f` on the data with the mutex held.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        loop {
            if self
                .locked
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                break;
            }
            while self.locked.load(Ordering::Relaxed) {
                spin();
            }
        }
        let _unlock = Unlock(&self.locked);
        self.data.with_mut(|p| {
            // SAFETY: the CAS above set `locked` and only `_unlock` clears it, after `f`
            // returns; every other access goes through this function, so this is the only
            // reference to the data. `p` comes from the cell and is valid and aligned.
            f(unsafe { &mut *p })
        })
    }
}
