//! The real-time [`Clock`](dmem_verbs::Clock): sleeps served by the executor's timers.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use dmem_verbs::{Clock, Nanos};

use crate::executor::{Executor, TimerKey, with_current};
use crate::time::monotonic_now;

/// The real-time [`Clock`]: [`now`](Clock::now) is [`monotonic_now`],
/// [`sleep_until`](Clock::sleep_until) is a timer of the executor running on the current
/// thread — the [`Executor`](crate::Executor), or (feature `glommio`) the glommio executor
/// of a [`run_per_core`](crate::run_per_core) job — so no thread ever sleeps inside a
/// future, and [`cpu`](Clock::cpu) does nothing, because real work already costs real time.
///
/// Code that names `RealClock` (the fabrics' contexts, through `dmem-deploy`'s
/// `AnyContext`) therefore runs unchanged on either executor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RealClock;

impl Executor {
    /// The clock whose sleeps this executor's timers serve.
    #[must_use]
    pub fn clock(&self) -> RealClock {
        RealClock
    }
}

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
    /// The returned future panics when polled before `deadline` on a thread where neither
    /// an [`Executor`](crate::Executor) nor a glommio executor of
    /// [`run_per_core`](crate::run_per_core) is running: nothing else would wake it.
    fn sleep_until(&self, deadline: Nanos) -> impl Future<Output = ()> {
        Sleep::until(deadline)
    }

    /// Does nothing: on real hardware the modelled work is the real work, already paid for.
    fn cpu(&self, _ns: Nanos) {}
}

/// A future that resolves at a [`monotonic_now`] deadline, driven by the current thread's
/// [`Executor`](crate::Executor) timers, or by a glommio timer on a thread that a
/// [`run_per_core`](crate::run_per_core) glommio job runs on.
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Sleep {
    deadline: Nanos,
    timer: Option<TimerKey>,
    /// The glommio timer, when the thread runs glommio rather than an `Executor`.
    #[cfg(feature = "glommio")]
    glommio: Option<glommio::timer::Timer>,
}

impl Sleep {
    /// Resolves at `deadline` ([`monotonic_now`] nanoseconds) or later.
    pub const fn until(deadline: Nanos) -> Self {
        Self {
            deadline,
            timer: None,
            #[cfg(feature = "glommio")]
            glommio: None,
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
        });
        #[cfg(feature = "glommio")]
        if key.is_none() && crate::per_core::on_glommio() {
            let left = std::time::Duration::from_nanos(deadline - monotonic_now().min(deadline));
            let timer = self
                .glommio
                .get_or_insert_with(|| glommio::timer::Timer::new(left));
            // Glommio's timer is on `Instant`; the deadline is `CLOCK_MONOTONIC`, the same
            // clock, so it fires at the deadline (re-checked above on the next poll).
            return Pin::new(timer).poll(cx).map(|_| ());
        }
        let key = key.expect(
            "dmem_runtime::Sleep polled on a thread with no running Executor or glommio executor",
        );
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
