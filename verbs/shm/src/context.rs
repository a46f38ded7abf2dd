//! CN execution contexts and the in-process message fabric.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use dmem_verbs::sync::lock_ignoring_poison;
use dmem_verbs::{BatchResult, Endpoint, Message, NodeId, PostList, Verbs, VerbsError};

use crate::node::complete_post;
use crate::{MnLink, ShmError};

/// Largest two-sided message payload, in bytes.
pub const MAX_MESSAGE: usize = 1 << 20;

/// The two-sided side of the shared-memory fabric: receive queues of the contexts of this
/// process, keyed by [`Endpoint`]. Cloning is cheap and shares the registry.
///
/// Messages between contexts of this process are queued directly. Messages to other
/// processes of the host travel over Unix sockets in a shared directory, one socket per node
/// (`node-<id>.sock`): a process that receives for node `n` calls
/// [`serve_messages`](Self::serve_messages); a process that only sends calls
/// [`set_message_dir`](Self::set_message_dir). Without either, an endpoint that no context of
/// this process receives on is unreachable ([`VerbsError::ConnectionLost`]).
#[derive(Debug, Clone, Default)]
pub struct ShmFabric {
    pub(crate) inner: Arc<FabricInner>,
}

#[derive(Debug, Default)]
pub(crate) struct FabricInner {
    mailboxes: Mutex<HashMap<Endpoint, Arc<Mailbox>>>,
    /// Where other processes' message sockets are, and the connections made to them.
    pub(crate) peers: Mutex<Option<crate::remote::Peers>>,
}

impl ShmFabric {
    /// An empty fabric.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// A context that receives on `endpoint`, with no link yet.
    ///
    /// # Errors
    /// [`ShmError::EndpointInUse`] if another live context of this fabric receives there.
    pub fn context(&self, endpoint: Endpoint) -> Result<ShmContext, ShmError> {
        let mailbox = Arc::new(Mailbox::default());
        {
            let mut boxes = lock_ignoring_poison(&self.inner.mailboxes);
            if boxes.contains_key(&endpoint) {
                return Err(ShmError::EndpointInUse(endpoint));
            }
            boxes.insert(endpoint, Arc::clone(&mailbox));
        }
        Ok(ShmContext {
            endpoint,
            fabric: self.clone(),
            mailbox,
            links: Vec::new(),
        })
    }

    /// Queues `message` for the context of this process that receives on `to` and wakes
    /// it; `false` if no live context receives there. For fabrics that carry messages
    /// between processes over other transports (the tcp fabric's reader threads).
    pub fn deliver(&self, to: Endpoint, message: Message) -> bool {
        self.mailbox(to).is_some_and(|m| m.deliver(message))
    }

    pub(crate) fn mailbox(&self, endpoint: Endpoint) -> Option<Arc<Mailbox>> {
        lock_ignoring_poison(&self.inner.mailboxes)
            .get(&endpoint)
            .cloned()
    }
}

/// A receive queue and the waker of the task waiting on it.
#[derive(Debug, Default)]
pub(crate) struct Mailbox {
    state: Mutex<MailboxState>,
}

#[derive(Debug, Default)]
struct MailboxState {
    queue: VecDeque<Message>,
    waiter: Option<Waker>,
    closed: bool,
}

impl Mailbox {
    /// Queues `message` and wakes the receiver; `false` if the queue is closed.
    pub(crate) fn deliver(&self, message: Message) -> bool {
        let waiter = {
            let mut state = lock_ignoring_poison(&self.state);
            if state.closed {
                return false;
            }
            state.queue.push_back(message);
            state.waiter.take()
        };
        if let Some(waker) = waiter {
            waker.wake();
        }
        true
    }

    fn close(&self) {
        let waiter = {
            let mut state = lock_ignoring_poison(&self.state);
            state.closed = true;
            state.waiter.take()
        };
        if let Some(waker) = waiter {
            waker.wake();
        }
    }
}

/// The future of [`ShmContext::recv`]: ready when a message is queued; otherwise it leaves
/// its waker with the queue, which the sender wakes.
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Recv<'a> {
    mailbox: &'a Mailbox,
}

impl Future for Recv<'_> {
    type Output = Result<Message, VerbsError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = lock_ignoring_poison(&self.mailbox.state);
        if let Some(message) = state.queue.pop_front() {
            return Poll::Ready(Ok(message));
        }
        if state.closed {
            return Poll::Ready(Err(VerbsError::Closed));
        }
        match &mut state.waiter {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

/// The verbs of one CN execution context (one thread's queue pairs) on the shared-memory
/// fabric: one-sided ops through its [`MnLink`]s, messages through its [`ShmFabric`].
///
/// Posts complete immediately: the future of [`Verbs::post`] executes the whole list on its
/// first poll and is ready then. Work requests execute in list order; the first refused one
/// ends the post with its error, and the ones after it are not executed (as a reliable
/// connection flushes its queue after an error).
#[derive(Debug)]
pub struct ShmContext {
    endpoint: Endpoint,
    fabric: ShmFabric,
    mailbox: Arc<Mailbox>,
    links: Vec<MnLink>,
}

impl ShmContext {
    /// Adds the link to one memory node.
    ///
    /// # Errors
    /// [`ShmError::DuplicateLink`] if the context already reaches that node.
    pub fn add_link(&mut self, link: MnLink) -> Result<(), ShmError> {
        let node = link.region.node;
        if self.link(node).is_some() {
            return Err(ShmError::DuplicateLink(node));
        }
        self.links.push(link);
        Ok(())
    }

    /// The link to `node`, if any.
    #[must_use]
    pub fn link(&self, node: NodeId) -> Option<&MnLink> {
        self.links.iter().find(|l| l.region.node == node)
    }

    /// Every link of this context.
    pub fn links(&self) -> impl Iterator<Item = &MnLink> {
        self.links.iter()
    }

    /// The fabric this context sends and receives on.
    #[must_use]
    pub fn fabric(&self) -> &ShmFabric {
        &self.fabric
    }

    /// Executes a post list synchronously (what the [`Verbs::post`] future does on its first
    /// poll).
    ///
    /// # Errors
    /// As [`Verbs::post`]: [`VerbsError::EmptyPostList`] or [`VerbsError::Misaligned`] with
    /// nothing executed; [`VerbsError::RemoteAccess`] for a bad rkey, an out-of-bounds range
    /// or revoked access; [`VerbsError::ConnectionLost`] for a node this context has no link
    /// to. Work requests before the failed one have landed.
    pub fn post_now(&self, list: PostList) -> Result<BatchResult, VerbsError> {
        let wrs = list.finish()?;
        let mut outcomes = Vec::with_capacity(wrs.len());
        let mut result = Ok(());
        // Links entered for this post (bit i: link i), left once at the end, so a batch pays
        // the revocation handshake once per memory node rather than once per work request.
        let mut entered = 0u64;
        for (index, wr) in wrs.iter().enumerate() {
            let addr = wr.op.addr();
            let Some(at) = self.links.iter().position(|l| l.region.node == addr.node) else {
                result = Err(VerbsError::ConnectionLost { node: addr.node });
                break;
            };
            let link = &self.links[at];
            let tracked = at < 64;
            if !(tracked && entered & (1 << at) != 0) {
                if !link.enter() {
                    result = Err(VerbsError::RemoteAccess { index, addr });
                    break;
                }
                if tracked {
                    entered |= 1 << at;
                }
            }
            let outcome = link.execute(index, &wr.op);
            if !tracked {
                link.leave();
            }
            match outcome {
                Ok(outcome) => outcomes.push(outcome),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        while entered != 0 {
            let at = entered.trailing_zeros() as usize;
            self.links[at].leave();
            entered &= entered - 1;
        }
        complete_post();
        result.map(|()| BatchResult::new(outcomes))
    }

    fn send_now(&self, to: Endpoint, payload: &[u8]) -> Result<(), VerbsError> {
        if payload.len() > MAX_MESSAGE {
            return Err(VerbsError::MessageTooLarge {
                len: payload.len(),
                max: MAX_MESSAGE,
            });
        }
        let lost = VerbsError::ConnectionLost { node: to.node };
        let message = Message {
            from: self.endpoint,
            payload: payload.to_vec(),
        };
        match self.fabric.mailbox(to) {
            Some(mailbox) if mailbox.deliver(message) => Ok(()),
            Some(_) => Err(lost),
            None => crate::remote::send(&self.fabric, self.endpoint, to, payload),
        }
    }

    /// A future for the next message (what [`Verbs::recv`] returns).
    pub fn recv_future(&self) -> Recv<'_> {
        Recv {
            mailbox: &self.mailbox,
        }
    }
}

impl Drop for ShmContext {
    fn drop(&mut self) {
        let mut boxes = lock_ignoring_poison(&self.fabric.inner.mailboxes);
        if boxes
            .get(&self.endpoint)
            .is_some_and(|m| Arc::ptr_eq(m, &self.mailbox))
        {
            boxes.remove(&self.endpoint);
        }
        drop(boxes);
        self.mailbox.close();
    }
}

impl Verbs for ShmContext {
    fn local_endpoint(&self) -> Endpoint {
        self.endpoint
    }

    async fn post(&self, list: PostList) -> Result<BatchResult, VerbsError> {
        self.post_now(list)
    }

    async fn send(&self, to: Endpoint, payload: &[u8]) -> Result<(), VerbsError> {
        self.send_now(to, payload)
    }

    fn recv(&self) -> impl Future<Output = Result<Message, VerbsError>> {
        self.recv_future()
    }

    fn try_recv(&self) -> Result<Option<Message>, VerbsError> {
        let mut state = lock_ignoring_poison(&self.mailbox.state);
        match state.queue.pop_front() {
            Some(message) => Ok(Some(message)),
            None if state.closed => Err(VerbsError::Closed),
            None => Ok(None),
        }
    }
}
