//! A CN context of any fabric, for deployments chosen at run time.
//!
//! [`Verbs`] and [`Clock`] return `impl Future`, so they are not object-safe: a
//! `Box<dyn Verbs>` does not exist. A deployment that hands out coordinators for any fabric
//! therefore takes this enum, which implements both traits by static dispatch (one `match`
//! per call, the variant's own future awaited inside). Protocol crates stay generic over
//! `V: Verbs + Clock` and never name a backend; this crate names them once, here.

use std::future::Future;
use std::rc::Rc;

#[cfg(feature = "rdma")]
use dmem_rdma::device::RdmaContext;
use dmem_runtime::RealClock;
use dmem_shm::ShmContext;
use dmem_sim::SimContext;
use dmem_tcp::TcpContext;
use dmem_verbs::{
    BatchResult, Clock, Endpoint, Message, Nanos, NodeId, PostList, Verbs, VerbsError,
};

/// A CN execution context on the simulator, the shared-memory fabric, the tcp fabric or
/// (feature `rdma`) an RDMA NIC.
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
    /// An RDMA context: RC queue pairs on a NIC (real time).
    #[cfg(feature = "rdma")]
    Rdma(Rc<RdmaCn>),
}

/// A CN context on an RDMA NIC: one-sided verbs through its queue pairs to the MNs, and
/// two-sided messages either over those queue pairs or, across processes, over the
/// cluster's TCP control plane (queue pairs between CN contexts are not made yet, so a
/// protocol's CN-to-CN messages and the failure detector's travel TCP there).
#[cfg(feature = "rdma")]
#[derive(Debug)]
pub struct RdmaCn {
    verbs: RdmaContext,
    messages: Option<TcpContext>,
}

#[cfg(feature = "rdma")]
impl RdmaCn {
    /// Verbs and messages both through the NIC.
    #[must_use]
    pub fn new(verbs: RdmaContext) -> Self {
        Self {
            verbs,
            messages: None,
        }
    }

    /// Verbs through the NIC, messages through `messages` (a tcp context of the same
    /// endpoint).
    #[must_use]
    pub fn with_tcp_messages(verbs: RdmaContext, messages: TcpContext) -> Self {
        Self {
            verbs,
            messages: Some(messages),
        }
    }

    /// The context that posts one-sided verbs.
    #[must_use]
    pub fn verbs(&self) -> &RdmaContext {
        &self.verbs
    }
}

#[cfg(feature = "rdma")]
impl Verbs for RdmaCn {
    fn local_endpoint(&self) -> Endpoint {
        self.verbs.local_endpoint()
    }

    fn post(&self, list: PostList) -> impl Future<Output = Result<BatchResult, VerbsError>> {
        self.verbs.post(list)
    }

    fn post_detached(&self, list: PostList) -> impl Future<Output = Result<(), VerbsError>> {
        self.verbs.post_detached(list)
    }

    fn send(&self, to: Endpoint, payload: &[u8]) -> impl Future<Output = Result<(), VerbsError>> {
        // The returned future may borrow only `self`: it owns a copy of the payload.
        let payload = payload.to_vec();
        async move {
            match &self.messages {
                Some(tcp) => tcp.send(to, &payload).await,
                None => self.verbs.send(to, &payload).await,
            }
        }
    }

    async fn recv(&self) -> Result<Message, VerbsError> {
        match &self.messages {
            Some(tcp) => tcp.recv().await,
            None => self.verbs.recv().await,
        }
    }

    fn try_recv(&self) -> Result<Option<Message>, VerbsError> {
        match &self.messages {
            Some(tcp) => tcp.try_recv(),
            None => self.verbs.try_recv(),
        }
    }
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

    /// The fabric's name (`sim`, `shm`, `tcp`, `rdma`), for messages.
    #[must_use]
    pub fn fabric(&self) -> &'static str {
        match self {
            AnyContext::Sim(_) => "sim",
            AnyContext::Shm(_) => "shm",
            AnyContext::Tcp(_) => "tcp",
            #[cfg(feature = "rdma")]
            AnyContext::Rdma(_) => "rdma",
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

#[cfg(feature = "rdma")]
impl From<RdmaContext> for AnyContext {
    fn from(c: RdmaContext) -> Self {
        AnyContext::Rdma(Rc::new(RdmaCn::new(c)))
    }
}

#[cfg(feature = "rdma")]
impl From<RdmaCn> for AnyContext {
    fn from(c: RdmaCn) -> Self {
        AnyContext::Rdma(Rc::new(c))
    }
}

/// One future of four kinds, made eagerly (the variant's method runs when the trait method
/// is called, as it would without the enum) and awaited by the async block around it.
enum Four<A, B, C, D> {
    Sim(A),
    Shm(B),
    Tcp(C),
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    Rdma(D),
}

impl<T, A, B, C, D> Four<A, B, C, D>
where
    A: Future<Output = T>,
    B: Future<Output = T>,
    C: Future<Output = T>,
    D: Future<Output = T>,
{
    async fn run(self) -> T {
        match self {
            Four::Sim(f) => f.await,
            Four::Shm(f) => f.await,
            Four::Tcp(f) => f.await,
            Four::Rdma(f) => f.await,
        }
    }
}

/// Names the rdma variant's future type in a build without the rdma fabric (the identity).
#[cfg(not(feature = "rdma"))]
fn without_rdma<T, A, B, C>(
    f: Four<A, B, C, std::future::Pending<T>>,
) -> Four<A, B, C, std::future::Pending<T>> {
    f
}

/// Calls `$call` on the variant's context (every variant implements the same trait).
macro_rules! dispatch {
    ($self:expr, $c:ident => $call:expr) => {
        match $self {
            AnyContext::Sim($c) => $call,
            AnyContext::Shm($c) => $call,
            AnyContext::Tcp($c) => $call,
            #[cfg(feature = "rdma")]
            AnyContext::Rdma($c) => $call,
        }
    };
}

/// Makes `$call`'s future on the variant's context now; awaits it later. The real-time
/// variants' futures are boxed, so that the enum's future (and every protocol future that
/// holds one) is no larger than the simulator's: the simulator's hot path keeps its size,
/// and a real fabric pays one allocation per verb call next to a real memory access or a
/// network round trip.
macro_rules! dispatch_future {
    ($self:expr, $c:ident => $call:expr) => {{
        let future = match $self {
            AnyContext::Sim($c) => Four::Sim($call),
            AnyContext::Shm($c) => Four::Shm(Box::pin($call)),
            AnyContext::Tcp($c) => Four::Tcp(Box::pin($call)),
            #[cfg(feature = "rdma")]
            AnyContext::Rdma($c) => Four::Rdma(Box::pin($call)),
        };
        #[cfg(not(feature = "rdma"))]
        let future = without_rdma(future);
        future.run()
    }};
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
        let future = match self {
            AnyContext::Sim(c) => Four::Sim(c.sleep_until(deadline)),
            AnyContext::Shm(_) => Four::Shm(Box::pin(RealClock.sleep_until(deadline))),
            AnyContext::Tcp(_) => Four::Tcp(Box::pin(RealClock.sleep_until(deadline))),
            #[cfg(feature = "rdma")]
            AnyContext::Rdma(_) => Four::Rdma(Box::pin(RealClock.sleep_until(deadline))),
        };
        #[cfg(not(feature = "rdma"))]
        let future = without_rdma(future);
        future.run()
    }

    fn cpu(&self, ns: Nanos) {
        match self {
            AnyContext::Sim(c) => c.cpu(ns),
            _ => RealClock.cpu(ns),
        }
    }
}
