//! Locking a `std` mutex that a panicking thread may have poisoned.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex` and returns its guard, also when a thread panicked while holding it.
///
/// For the mutexes of the fabrics, executors and lock tables (queues, maps, slot lists):
/// each of their critical sections leaves the value consistent, so a panic on one thread
/// must not turn every later lock on the others into a second panic.
pub fn lock_ignoring_poison<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
