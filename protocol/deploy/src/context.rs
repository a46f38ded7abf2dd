//! A CN context of any fabric, for deployments chosen at run time.
//!
//! [`Verbs`] and [`Clock`] return `impl Future`, so they are not object-safe: a
//! `Box<dyn Verbs>` does not exist. A deployment that hands out coordinators for any fabric
//! therefore takes this enum, which implements both traits by static dispatch (one `match`
//! per call, the variant's own future awaited inside). Protocol crates stay generic over
//! `V: Verbs + Clock` and never name a backend; this crate names them once, here.

use std::future::Future;
use std::rc::Rc;

use dmem_runtime::RealClock;
use dmem_shm::ShmContext;
use dmem_sim::SimContext;
use dmem_tcp::TcpContext;
use dmem_verbs::{
    BatchResult, Clock, Endpoint, Message, Nanos, NodeId, PostList, Verbs, VerbsError,
};

/// A CN execution context on the simulator, the shared-memory fabric or the tcp fabric.
///
/// Cloning is cheap (the real-time contexts are shared behind an [`Rc`]; a clone posts on
/// the same queue pairs, as a clone of a [`SimContext`] does). Real-time variants take
/// their time from the executor's [`RealClock`].
#[derive(Debug, Clone)]
pub enum AnyContext {
    /// A context of the simulated cluster (virtual time).
    Sim(SimContext),
    /// A shared-memory context (real time).
    Shm(Rc<ShmContext>),
    /// A tcp context (real time).
    Tcp(Rc<TcpContext>),
}

impl AnyContext {
    /// The node this context belongs to.
    #[must_use]
    pub fn node(&self) -> NodeId {
        self.local_endpoint().node
    }

    /// The simulator's context, if this is one (for deployments that run tasks on the
    /// simulated cluster, such as LOTUS's lock tables or Dandelion's servers).
    #[must_use]
    pub fn as_sim(&self) -> Option<&SimContext> {
        match self {
            AnyContext::Sim(c) => Some(c),
            _ => None,
        }
    }

    /// The fabric's name (`sim`, `shm`, `tcp`), for messages.
    #[must_use]
    pub fn fabric(&self) -> &'static str {
        match self {
            AnyContext::Sim(_) => "sim",
            AnyContext::Shm(_) => "shm",
            AnyContext::Tcp(_) => "tcp",
        }
    }
}

impl From<SimContext> for AnyContext {
    fn from(c: SimContext) -> Self {
        AnyContext::Sim(c)
    }
}

impl From<ShmContext> for AnyContext {
    fn from(c: ShmContext) -> Self {
        AnyContext::Shm(Rc::new(c))
    }
}

impl From<TcpContext> for AnyContext {
    fn from(c: TcpContext) -> Self {
        AnyContext::Tcp(Rc::new(c))
    }
}

/// One future of three kinds, made eagerly (the variant's method runs when the trait
/// method is called, as it would without the enum) and awaited by the async block around it.
enum Three<A, B, C> {
    Sim(A),
    Shm(B),
    Tcp(C),
}

impl<T, A, B, C> Three<A, B, C>
where
    A: Future<Output = T>,
    B: Future<Output = T>,
    C: Future<Output = T>,
{
    async fn run(self) -> T {
        match self {
            Three::Sim(f) => f.await,
            Three::Shm(f) => f.await,
            Three::Tcp(f) => f.await,
        }
    }
}

/// Calls `$call` on the variant's context (every variant implements the same trait).
macro_rules! dispatch {
    ($self:expr, $c:ident => $call:expr) => {
        match $self {
            AnyContext::Sim($c) => $call,
            AnyContext::Shm($c) => $call,
            AnyContext::Tcp($c) => $call,
        }
    };
}

/// Makes `$call`'s future on the variant's context now; awaits it later. The real-time
/// variants' futures are boxed, so that the enum's future (and every protocol future that
/// holds one) is no larger than the simulator's: the simulator's hot path keeps its size,
/// and a real fabric pays one allocation per verb call next to a real memory access or a
/// network round trip.
macro_rules! dispatch_future {
    ($self:expr, $c:ident => $call:expr) => {
        match $self {
            AnyContext::Sim($c) => Three::Sim($call),
            AnyContext::Shm($c) => Three::Shm(Box::pin($call)),
            AnyContext::Tcp($c) => Three::Tcp(Box::pin($call)),
        }
        .run()
    };
}

impl Verbs for AnyContext {
    fn local_endpoint(&self) -> Endpoint {
        dispatch!(self, c => c.local_endpoint())
    }

    fn post(&self, list: PostList) -> impl Future<Output = Result<BatchResult, VerbsError>> {
        dispatch_future!(self, c => c.post(list))
    }

    fn post_detached(&self, list: PostList) -> impl Future<Output = Result<(), VerbsError>> {
        dispatch_future!(self, c => c.post_detached(list))
    }

    fn mark_phase(&self, phase: dmem_verbs::Phase) {
        dispatch!(self, c => c.mark_phase(phase));
    }

    fn send(&self, to: Endpoint, payload: &[u8]) -> impl Future<Output = Result<(), VerbsError>> {
        dispatch_future!(self, c => c.send(to, payload))
    }

    fn send_batch(
        &self,
        messages: Vec<(Endpoint, Vec<u8>)>,
    ) -> impl Future<Output = Result<(), VerbsError>> {
        dispatch_future!(self, c => c.send_batch(messages))
    }

    fn recv(&self) -> impl Future<Output = Result<Message, VerbsError>> {
        dispatch_future!(self, c => c.recv())
    }

    fn try_recv(&self) -> Result<Option<Message>, VerbsError> {
        dispatch!(self, c => c.try_recv())
    }
}

impl Clock for AnyContext {
    fn now(&self) -> Nanos {
        match self {
            AnyContext::Sim(c) => c.now(),
            _ => RealClock.now(),
        }
    }

    fn sleep_until(&self, deadline: Nanos) -> impl Future<Output = ()> {
        match self {
            AnyContext::Sim(c) => Three::Sim(c.sleep_until(deadline)),
            AnyContext::Shm(_) => Three::Shm(Box::pin(RealClock.sleep_until(deadline))),
            AnyContext::Tcp(_) => Three::Tcp(Box::pin(RealClock.sleep_until(deadline))),
        }
        .run()
    }

    fn cpu(&self, ns: Nanos) {
        match self {
            AnyContext::Sim(c) => c.cpu(ns),
            _ => RealClock.cpu(ns),
        }
    }
}
