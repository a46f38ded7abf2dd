//! A verbs context paired with a clock.

use std::future::Future;

use dmem_verbs::{BatchResult, Clock, Endpoint, Message, Nanos, PostList, Verbs, VerbsError};

use crate::RealClock;

/// A verbs context and a clock as one value, so that code generic over `V: Verbs + Clock`
/// (locks, protocols, benchmarks) runs on a real-time fabric: `Clocked::new(shm_context)`.
///
/// The simulator's contexts implement both traits themselves; real fabrics only move bytes,
/// and time comes from the executor's [`RealClock`].
#[derive(Debug)]
pub struct Clocked<V, C = RealClock> {
    verbs: V,
    clock: C,
}

impl<V> Clocked<V, RealClock> {
    /// Pairs `verbs` with the real-time clock of the current thread's executor.
    pub const fn new(verbs: V) -> Self {
        Self {
            verbs,
            clock: RealClock,
        }
    }
}

impl<V, C> Clocked<V, C> {
    /// Pairs `verbs` with `clock`.
    pub const fn with_clock(verbs: V, clock: C) -> Self {
        Self { verbs, clock }
    }

    /// The verbs context.
    pub fn verbs(&self) -> &V {
        &self.verbs
    }

    /// Takes the pair apart.
    pub fn into_inner(self) -> (V, C) {
        (self.verbs, self.clock)
    }
}

impl<V: Verbs, C> Verbs for Clocked<V, C> {
    fn local_endpoint(&self) -> Endpoint {
        self.verbs.local_endpoint()
    }

    fn post(&self, list: PostList) -> impl Future<Output = Result<BatchResult, VerbsError>> {
        self.verbs.post(list)
    }

    fn send(&self, to: Endpoint, payload: &[u8]) -> impl Future<Output = Result<(), VerbsError>> {
        self.verbs.send(to, payload)
    }

    fn recv(&self) -> impl Future<Output = Result<Message, VerbsError>> {
        self.verbs.recv()
    }

    fn try_recv(&self) -> Result<Option<Message>, VerbsError> {
        self.verbs.try_recv()
    }
}

impl<V, C: Clock> Clock for Clocked<V, C> {
    fn now(&self) -> Nanos {
        self.clock.now()
    }

    fn sleep_until(&self, deadline: Nanos) -> impl Future<Output = ()> {
        self.clock.sleep_until(deadline)
    }

    fn cpu(&self, ns: Nanos) {
        self.clock.cpu(ns);
    }
}
