//! A deterministic, discrete-event simulation of a disaggregated-memory cluster.
//!
//! Memory nodes (MNs) hold real bytes; compute nodes (CNs) run async tasks on simulated
//! cores; one-sided work requests really read, write, compare-and-swap and fetch-and-add MN
//! memory, at the virtual instants a NIC cost model ([`NicProfile`]) gives them. The same
//! seed and configuration produce the same run, down to the [`Sim::digest`] of every completed
//! operation, so a failing protocol run can be replayed exactly.
//!
//! ```
//! use dmem_sim::{ClusterConfig, Sim};
//! use dmem_verbs::{Clock, VerbsExt};
//!
//! let sim = Sim::new(ClusterConfig::new("cx3").unwrap().mns(1).cns(1)).unwrap();
//! let word = sim.region(sim.mn(0)).at(64).unwrap();
//! let ctx = sim.context(sim.cn(0), 0).unwrap();
//! sim.spawn(&ctx, {
//!     let ctx = ctx.clone();
//!     async move {
//!         assert_eq!(ctx.faa(word, 5).await.unwrap(), 0);
//!         assert_eq!(ctx.cas(word, 5, 9).await.unwrap(), 5);
//!         assert!(ctx.now() > 0);
//!     }
//! });
//! sim.run_until_idle();
//! assert_eq!(sim.read_memory(sim.mn(0), 64, 8), 9u64.to_le_bytes());
//! ```
//!
//! # What a simulated core is
//!
//! A CN has `threads_per_cn` cores; each runs any number of tasks (the papers' coroutines),
//! one at a time. A task runs at its core's local time, and every cost it incurs (posting a
//! work request, ringing a doorbell, polling a completion, handling a message, or an explicit
//! [`Clock::cpu`](dmem_verbs::Clock::cpu)) advances that local time; the core is busy until
//! the task yields. So CPU is a resource tasks contend for, as on a real CN.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod executor;
mod profile;
mod queue;
mod stats;
mod world;

pub use executor::{Sim, SimContext};
pub use profile::{NicProfile, ProfileError};
pub use stats::{NicStats, NodeStats, Role, SimStats};

use dmem_verbs::Nanos;

/// Probabilities with which the network mistreats a two-sided message.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MessageFaults {
    /// Probability that a message is lost.
    pub loss: f64,
    /// Probability that a message is delivered twice.
    pub duplicate: f64,
    /// Probability that a message is delayed by [`delay_ns`](Self::delay_ns).
    pub delay: f64,
    /// Extra delay of a delayed message, ns.
    pub delay_ns: Nanos,
}

/// The shape of a simulated cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// NIC cost model shared by every node.
    pub profile: NicProfile,
    /// Number of memory nodes (node ids `0..mns`).
    pub mns: u16,
    /// Number of compute nodes (node ids `mns..mns + cns`).
    pub cns: u16,
    /// Simulated cores per CN.
    pub threads_per_cn: u16,
    /// Bytes of registered memory per MN (one region each).
    pub mn_memory_bytes: u64,
    /// Seed of every random choice the simulator makes.
    pub seed: u64,
    /// Message faults to inject.
    pub message_faults: MessageFaults,
}

/// Why a cluster could not be built or addressed.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The NIC profile is unknown or invalid.
    #[error(transparent)]
    Profile(#[from] ProfileError),
    /// A count that must be positive is zero.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// More nodes than node ids.
    #[error("{mns} MNs + {cns} CNs exceed the {max} node ids")]
    TooManyNodes {
        /// MNs asked for.
        mns: u16,
        /// CNs asked for.
        cns: u16,
        /// Largest node count.
        max: u32,
    },
    /// The MN memory size does not fit this machine's address space.
    #[error("MN memory of {0} bytes does not fit in this process")]
    MemoryTooLarge(u64),
    /// A node id that is not a CN of this cluster.
    #[error("node {0} is not a compute node of this cluster")]
    NotComputeNode(u16),
    /// A node id that is not an MN of this cluster.
    #[error("node {0} is not a memory node of this cluster")]
    NotMemoryNode(u16),
    /// A thread index beyond `threads_per_cn`.
    #[error("thread {thread} does not exist (each CN has {threads} threads)")]
    NoSuchThread {
        /// Thread asked for.
        thread: u16,
        /// Threads per CN.
        threads: u16,
    },
}

impl ClusterConfig {
    /// One MN and one CN with one thread, 1 MiB per MN, seed 0, under the named profile.
    ///
    /// # Errors
    /// [`SimError::Profile`] for an unknown profile name.
    pub fn new(profile: &str) -> Result<Self, SimError> {
        Ok(Self::with_profile(NicProfile::named(profile)?))
    }

    /// As [`new`](Self::new) with an explicit profile.
    #[must_use]
    pub fn with_profile(profile: NicProfile) -> Self {
        Self {
            profile,
            mns: 1,
            cns: 1,
            threads_per_cn: 1,
            mn_memory_bytes: 1 << 20,
            seed: 0,
            message_faults: MessageFaults::default(),
        }
    }

    /// Sets the number of MNs.
    #[must_use]
    pub fn mns(mut self, n: u16) -> Self {
        self.mns = n;
        self
    }

    /// Sets the number of CNs.
    #[must_use]
    pub fn cns(mut self, n: u16) -> Self {
        self.cns = n;
        self
    }

    /// Sets the cores per CN.
    #[must_use]
    pub fn threads_per_cn(mut self, n: u16) -> Self {
        self.threads_per_cn = n;
        self
    }

    /// Sets the registered memory per MN.
    #[must_use]
    pub fn mn_memory_bytes(mut self, bytes: u64) -> Self {
        self.mn_memory_bytes = bytes;
        self
    }

    /// Sets the seed.
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Sets the message faults.
    #[must_use]
    pub fn message_faults(mut self, faults: MessageFaults) -> Self {
        self.message_faults = faults;
        self
    }

    /// Checks the configuration.
    ///
    /// # Errors
    /// The first problem found, as a [`SimError`].
    pub fn validate(&self) -> Result<(), SimError> {
        self.profile.validate()?;
        if self.mns == 0 {
            return Err(SimError::Zero("the number of MNs"));
        }
        if self.cns == 0 {
            return Err(SimError::Zero("the number of CNs"));
        }
        if self.threads_per_cn == 0 {
            return Err(SimError::Zero("threads per CN"));
        }
        if self.mn_memory_bytes == 0 {
            return Err(SimError::Zero("MN memory"));
        }
        let max = u32::from(u16::MAX);
        if u32::from(self.mns) + u32::from(self.cns) > max {
            return Err(SimError::TooManyNodes {
                mns: self.mns,
                cns: self.cns,
                max,
            });
        }
        if usize::try_from(self.mn_memory_bytes).is_err() {
            return Err(SimError::MemoryTooLarge(self.mn_memory_bytes));
        }
        Ok(())
    }
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
