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

/// Where a thread that finds the mutex taken waits for it to be freed.
///
/// On a CPU it spins on a plain read (test-and-test-and-set). Under loom a spinning wait
/// cannot be bounded: loom may let a spinning thread's relaxed read return a `true` it has
/// not seen yet, and with two threads waiting it may run them in turn after each yield
/// (a yield costs no preemption) while the holder never runs, so every model with a
/// contended mutex "exceeds the maximum number of branches". Under loom the waiter
/// therefore parks on a loom condition variable until an unlock notifies it. Taking the
/// mutex is still the same `Acquire` CAS of `locked` and freeing it the same `Release`
/// store, so the model checks them; only the wait between tries changes (a `Relaxed`
/// CAS is still caught: the executions in which the CAS succeeds without parking race on
/// the data, and `tests/loom.rs` then fails with a causality violation).
#[cfg(not(loom))]
#[derive(Debug)]
struct Parking;

#[cfg(not(loom))]
impl Parking {
    const fn new() -> Self {
        Self
    }

    fn wait_while_locked(&self, locked: &AtomicBool) {
        while locked.load(Ordering::Relaxed) {
            core::hint::spin_loop();
        }
    }

    fn unlocked(&self) {}
}

#[cfg(loom)]
#[derive(Debug)]
struct Parking {
    mutex: loom::sync::Mutex<()>,
    freed: loom::sync::Condvar,
}

#[cfg(loom)]
impl Parking {
    fn new() -> Self {
        Self {
            mutex: loom::sync::Mutex::new(()),
            freed: loom::sync::Condvar::new(),
        }
    }

    /// Parks until `locked` reads `false`. `locked` is read with `parking.mutex` held and
    /// [`Parking::unlocked`] notifies with it held after the `Release` store, so the
    /// notification cannot fall between the read and the wait.
    fn wait_while_locked(&self, locked: &AtomicBool) {
        let mut guard = self.mutex.lock().expect("parking mutex");
        while locked.load(Ordering::Relaxed) {
            guard = self.freed.wait(guard).expect("parking mutex");
        }
    }

    fn unlocked(&self) {
        let _guard = self.mutex.lock().expect("parking mutex");
        self.freed.notify_all();
    }
}

/// A spinning mutex whose data is only reached through [`SpinMutex::with`], so a guard
/// can never be held across an `.await`.
#[derive(Debug)]
pub(crate) struct SpinMutex<T> {
    locked: AtomicBool,
    parking: Parking,
    data: UnsafeCell<T>,
}

// SAFETY: `with` hands out `&mut T` only while `locked` is held, which the Acquire CAS /
// Release store make exclusive across threads, so sharing the mutex only ever moves `T`
// between threads (hence `T: Send`), never shares it.
unsafe impl<T: Send> Sync for SpinMutex<T> {}
// SAFETY: owning the mutex is owning `T`.
unsafe impl<T: Send> Send for SpinMutex<T> {}

/// Unlocks on drop, so a panic inside the critical section does not leave it locked.
struct Unlock<'a>(&'a AtomicBool, &'a Parking);

impl Drop for Unlock<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
        self.1.unlocked();
    }
}

impl<T> SpinMutex<T> {
    /// A mutex holding `value`.
    pub(crate) fn new(value: T) -> Self {
        Self {
            locked: AtomicBool::new(false),
            parking: Parking::new(),
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
            self.parking.wait_while_locked(&self.locked);
        }
        let _unlock = Unlock(&self.locked, &self.parking);
        self.data.with_mut(|p| {
            // SAFETY: the CAS above set `locked` and only `_unlock` clears it, after `f`
            // returns; every other access goes through this function, so this is the only
            // reference to the data. `p` comes from the cell and is valid and aligned.
            f(unsafe { &mut *p })
        })
    }
}
