//! One executor per core: the CN runs each core's coordinators (or lock clients) on an
//! executor of its own, on a thread of its own, and the same async protocol code runs on
//! either kind.
//!
//! | kind | when | clock |
//! |---|---|---|
//! | [`ExecutorKind::Glommio`] (feature `glommio`) | io_uring available: glommio 0.9, one `LocalExecutor` pinned to each listed CPU | [`GlommioClock`]: glommio timers |
//! | [`ExecutorKind::Polling`] | always: the fallback where io_uring is disabled (`/proc/sys/kernel/io_uring_disabled`), the memlock limit is below glommio's 512 KiB, or the crate is built without the feature | [`RealClock`]: the polling executor's timers |
//!
//! [`ExecutorKind::detect`] picks glommio when it can start an executor here and says why
//! not otherwise. Jobs get a [`CoreClock`] for whichever kind runs them, so they are written
//! once against [`Clock`].

use std::future::Future;

use dmem_verbs::{Clock, Nanos};

use crate::{Executor, RealClock};

/// Which executor runs each core's tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExecutorKind {
    /// dmem's polling executor ([`Executor`]) on a plain thread per core.
    Polling,
    /// A glommio `LocalExecutor` pinned to each core (io_uring underneath).
    #[cfg(feature = "glommio")]
    Glommio,
}

impl ExecutorKind {
    /// Glommio if this build has it and an executor starts on this machine, else the
    /// polling executor; the string says why glommio was not chosen.
    #[must_use]
    pub fn detect() -> (Self, Option<String>) {
        #[cfg(feature = "glommio")]
        {
            match glommio_probe() {
                Ok(()) => (Self::Glommio, None),
                Err(why) => (Self::Polling, Some(why)),
            }
        }
        #[cfg(not(feature = "glommio"))]
        {
            (
                Self::Polling,
                Some("built without the `glommio` feature".to_owned()),
            )
        }
    }

    /// Lower-case name (`polling`, `glommio`).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Polling => "polling",
            #[cfg(feature = "glommio")]
            Self::Glommio => "glommio",
        }
    }
}

/// What a configuration asks for (`auto`, `polling`, `glommio`), resolved against this
/// build and machine by [`resolve`](Self::resolve).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ExecutorChoice {
    /// Glommio where [`ExecutorKind::detect`] can start it, else the polling executor.
    #[default]
    Auto,
    /// The polling executor.
    Polling,
    /// Glommio, or an error saying why it cannot run here.
    Glommio,
}

impl ExecutorChoice {
    /// Every name [`from_name`](Self::from_name) takes.
    pub const NAMES: [&'static str; 3] = ["auto", "polling", "glommio"];

    /// Parses `auto`, `polling` or `glommio`.
    ///
    /// # Errors
    /// One line naming the accepted values.
    pub fn from_name(name: &str) -> Result<Self, String> {
        match name {
            "auto" => Ok(Self::Auto),
            "polling" => Ok(Self::Polling),
            "glommio" => Ok(Self::Glommio),
            other => Err(format!(
                "executor `{other}` is not `auto`, `polling` or `glommio`"
            )),
        }
    }

    /// The executor kind this choice runs on here, and why glommio was not chosen when it
    /// was not.
    ///
    /// # Errors
    /// [`ExecutorChoice::Glommio`] in a build without the `glommio` feature or on a machine
    /// where it does not start (io_uring disabled, memlock limit too low): what to change.
    pub fn resolve(self) -> Result<(ExecutorKind, Option<String>), String> {
        match self {
            Self::Auto => Ok(ExecutorKind::detect()),
            Self::Polling => Ok((ExecutorKind::Polling, Some("asked for".to_owned()))),
            Self::Glommio => match ExecutorKind::detect() {
                (ExecutorKind::Polling, Some(why)) => Err(format!(
                    "executor `glommio` cannot run here ({why}); build dmem with `--features glommio` on a machine with io_uring, or ask for `auto` or `polling`"
                )),
                detected => Ok(detected),
            },
        }
    }
}

/// The clock of the executor a job runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoreClock {
    /// Timers of the polling executor.
    Polling(RealClock),
    /// Timers of glommio.
    #[cfg(feature = "glommio")]
    Glommio(GlommioClock),
}

impl Clock for CoreClock {
    fn now(&self) -> Nanos {
        crate::monotonic_now()
    }

    fn sleep_until(&self, deadline: Nanos) -> impl Future<Output = ()> {
        let clock = *self;
        async move {
            match clock {
                CoreClock::Polling(c) => c.sleep_until(deadline).await,
                #[cfg(feature = "glommio")]
                CoreClock::Glommio(c) => c.sleep_until(deadline).await,
            }
        }
    }

    fn cpu(&self, _ns: Nanos) {}
}

/// Why per-core executors could not run.
#[derive(Debug, thiserror::Error)]
pub enum PerCoreError {
    /// An executor could not start on its core.
    #[error("executor for CPU {cpu} did not start: {why}")]
    Start {
        /// The CPU.
        cpu: usize,
        /// What the executor said.
        why: String,
    },
    /// A job panicked.
    #[error("the job on CPU {cpu} panicked")]
    Panicked {
        /// The CPU.
        cpu: usize,
    },
}

/// Runs each job on an executor of `kind` on its own thread, pinned to the job's CPU under
/// glommio (the polling executor's threads are not pinned), and returns the jobs' results
/// in order. A job is a `Send` closure that builds its (possibly `!Send`) future on the
/// executor's thread from the [`CoreClock`] it is given.
///
/// # Errors
/// [`PerCoreError`] if an executor does not start or a job panics.
pub fn run_per_core<T, J, Fut>(
    kind: ExecutorKind,
    jobs: Vec<(usize, J)>,
) -> Result<Vec<T>, PerCoreError>
where
    T: Send + 'static,
    J: FnOnce(CoreClock) -> Fut + Send + 'static,
    Fut: Future<Output = T> + 'static,
{
    match kind {
        ExecutorKind::Polling => {
            let handles: Vec<_> = jobs
                .into_iter()
                .map(|(cpu, job)| {
                    let h = std::thread::Builder::new()
                        .name(format!("dmem-core-{cpu}"))
                        .spawn(move || {
                            Executor::new().block_on(job(CoreClock::Polling(RealClock)))
                        });
                    (cpu, h)
                })
                .collect();
            handles
                .into_iter()
                .map(|(cpu, h)| {
                    h.map_err(|e| PerCoreError::Start {
                        cpu,
                        why: e.to_string(),
                    })?
                    .join()
                    .map_err(|_| PerCoreError::Panicked { cpu })
                })
                .collect()
        }
        #[cfg(feature = "glommio")]
        ExecutorKind::Glommio => glommio_run(jobs),
    }
}

#[cfg(feature = "glommio")]
std::thread_local! {
    /// Set on the threads of [`glommio_run`]'s executors, so that [`RealClock`]'s sleeps
    /// use glommio's timers there.
    static ON_GLOMMIO: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread runs a glommio executor of [`glommio_run`].
#[cfg(feature = "glommio")]
pub(crate) fn on_glommio() -> bool {
    ON_GLOMMIO.with(std::cell::Cell::get)
}

#[cfg(feature = "glommio")]
pub use glommio_impl::{GlommioClock, IO_MEMORY, SPIN_BEFORE_PARK, glommio_probe, glommio_run};

#[cfg(feature = "glommio")]
mod glommio_impl {
    use std::future::Future;
    use std::time::Duration;

    use dmem_verbs::{Clock, Nanos};
    use glommio::{LocalExecutorBuilder, Placement};

    use super::{CoreClock, PerCoreError};
    use crate::monotonic_now;

    /// Bytes of io_uring buffer memory each glommio executor registers (its default, 10 MiB,
    /// is more than a default `ulimit -l` of 8 MiB allows for even one executor; dmem's
    /// executors do no file I/O, so little is needed, and glommio's minimum is 64 KiB).
    pub const IO_MEMORY: usize = 256 << 10;

    /// How long an idle glommio executor keeps polling before it parks in `io_uring_enter`.
    /// A CN core is dedicated to its coordinators (as a core polling an RDMA completion
    /// queue is), and parking is what made glommio slow here: DecLock on shm ran 27.6 k
    /// acquisitions/s without spinning and 126 k with 100 µs (the README's figure).
    pub const SPIN_BEFORE_PARK: Duration = Duration::from_micros(100);

    /// [`Clock`] on glommio: `now` is `CLOCK_MONOTONIC` (as [`crate::RealClock`], so
    /// processes agree), sleeps are glommio timers of the executor on this thread.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct GlommioClock;

    impl Clock for GlommioClock {
        fn now(&self) -> Nanos {
            monotonic_now()
        }

        async fn sleep_until(&self, deadline: Nanos) {
            let now = monotonic_now();
            if deadline > now {
                glommio::timer::sleep(Duration::from_nanos(deadline - now)).await;
            }
        }

        fn cpu(&self, _ns: Nanos) {}
    }

    fn builder(placement: Placement, name: &str) -> LocalExecutorBuilder {
        LocalExecutorBuilder::new(placement)
            .name(name)
            .io_memory(IO_MEMORY)
            .spin_before_park(SPIN_BEFORE_PARK)
    }

    /// Starts one glommio executor, lets it sleep 1 ms on a timer (io_uring), and stops it.
    ///
    /// # Errors
    /// What glommio said, e.g. the memlock limit or io_uring being disabled.
    pub fn glommio_probe() -> Result<(), String> {
        let handle = builder(Placement::Unbound, "dmem-glommio-probe")
            .spawn(|| async {
                glommio::timer::sleep(Duration::from_millis(1)).await;
            })
            .map_err(|e| e.to_string())?;
        handle.join().map_err(|e| e.to_string())
    }

    /// [`super::run_per_core`] for glommio: one `LocalExecutor` pinned to each job's CPU.
    ///
    /// # Errors
    /// As [`super::run_per_core`].
    pub fn glommio_run<T, J, Fut>(jobs: Vec<(usize, J)>) -> Result<Vec<T>, PerCoreError>
    where
        T: Send + 'static,
        J: FnOnce(CoreClock) -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
    {
        let mut handles = Vec::with_capacity(jobs.len());
        for (cpu, job) in jobs {
            let h = builder(Placement::Fixed(cpu), &format!("dmem-core-{cpu}"))
                .spawn(move || {
                    super::ON_GLOMMIO.with(|on| on.set(true));
                    job(CoreClock::Glommio(GlommioClock))
                })
                .map_err(|e| PerCoreError::Start {
                    cpu,
                    why: e.to_string(),
                })?;
            handles.push((cpu, h));
        }
        handles
            .into_iter()
            .map(|(cpu, h)| {
                h.join().map_err(|e| match e {
                    glommio::GlommioError::ExecutorError(_) => PerCoreError::Panicked { cpu },
                    other => PerCoreError::Start {
                        cpu,
                        why: other.to_string(),
                    },
                })
            })
            .collect()
    }
}
