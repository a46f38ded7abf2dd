//! Real time: `CLOCK_MONOTONIC`, shared by every process of a host.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use dmem_verbs::{Clock, Nanos};
use rustix::time::{ClockId, clock_gettime};

use crate::executor::{TimerKey, with_current};

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

/// The real-time [`Clock`]: [`now`](Clock::now) is [`monotonic_now`],
/// [`sleep_until`](Clock::sleep_until) is a timer of the [`Executor`](crate::Executor) running
/// on the current thread (no thread ever sleeps inside a future), and [`cpu`](Clock::cpu) does
/// nothing, because real work already costs real time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RealClock;

impl RealClock {
    /// The clock.
    #[must_use]
    pub const fn new() -> Self {
        Self
    }
}

impl Clock for RealClock {
    fn now(&self) -> Nanos {
        monotonic_now()
    }

    /// # Panics
    /// The returned future panics when polled before `deadline` on a thread where no
    /// [`Executor`](crate::Executor) is running: nothing else would wake it.
    fn sleep_until(&self, deadline: Nanos) -> impl Future<Output = ()> {
        Sleep::until(deadline)
    }

    /// Does nothing: on real hardware the modelled work is the real work, already paid for.
    fn cpu(&self, _ns: Nanos) {}
}

/// A future that resolves at a [`monotonic_now`] deadline, driven by the current thread's
/// [`Executor`](crate::Executor) timers.
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Sleep {
    deadline: Nanos,
    timer: Option<TimerKey>,
}

impl Sleep {
    /// Resolves at `deadline` ([`monotonic_now`] nanoseconds) or later.
    pub const fn until(deadline: Nanos) -> Self {
        Self {
            deadline,
            timer: None,
        }
    }

    /// The deadline.
    #[must_use]
    pub const fn deadline(&self) -> Nanos {
        self.deadline
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if monotonic_now() >= self.deadline {
            if let Some(key) = self.timer.take() {
                with_current(|ex| ex.cancel_timer(key));
            }
            return Poll::Ready(());
        }
        let deadline = self.deadline;
        let timer = self.timer;
        let key = with_current(|ex| match timer {
            Some(key) => ex.update_timer(key, deadline, cx.waker()),
            None => ex.add_timer(deadline, cx.waker().clone()),
        })
        .expect("dmem_runtime::Sleep polled on a thread with no running Executor");
        self.timer = Some(key);
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(key) = self.timer.take() {
            with_current(|ex| ex.cancel_timer(key));
        }
    }
}
