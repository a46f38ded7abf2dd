//! Time as protocols see it: leases, timeouts, and the CPU cost model.

use core::future::Future;

/// Nanoseconds since the cluster started (virtual in the simulator, real elsewhere).
pub type Nanos = u64;

/// The clock of one execution context.
///
/// Protocols use it for leases and timeouts (OOCC §IV, DecLock §4.4, Pandora §3.2) and to
/// declare the CPU work their logic models ([`cpu`](Clock::cpu)).
pub trait Clock {
    /// The current time.
    fn now(&self) -> Nanos;

    /// Resolves at `deadline` or later.
    fn sleep_until(&self, deadline: Nanos) -> impl Future<Output = ()>;

    /// Resolves `duration` from now or later.
    fn sleep(&self, duration: Nanos) -> impl Future<Output = ()> {
        self.sleep_until(self.now().saturating_add(duration))
    }

    /// Accounts for `ns` of CPU work that the caller models rather than performs (protocol
    /// logic, a critical section). The simulator advances this context's core by `ns`; a
    /// real-time backend does nothing, because real work already costs real time.
    fn cpu(&self, ns: Nanos);
}
