//! Real time: `CLOCK_MONOTONIC`, shared by every process of a host (the leaf both the
//! executor's timers and [`RealClock`](crate::RealClock) read).

use dmem_verbs::Nanos;
use rustix::time::{ClockId, clock_gettime};

/// Nanoseconds of `CLOCK_MONOTONIC`: time since an epoch fixed at boot, the same for every
/// process of the host (unlike [`std::time::Instant`], whose value is opaque), so CN and MN
/// processes compare leases and timestamps directly.
#[must_use]
pub fn monotonic_now() -> Nanos {
    let t = clock_gettime(ClockId::Monotonic);
    // Monotonic time is never negative; u64 nanoseconds last 584 years of uptime.
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}
