//! A server thread: its network endpoint, its `RunIteration` loop and the requests its
//! transactions wait for (Dandelion §4.1, §5.1).
//!
//! Every server runs one [`Worker`] per thread. Transactions (the client coroutines of that
//! thread) hand it requests with [`Worker::issue`]; requests to the worker's own server are
//! queued for a local hashtable batch, the others are inserted into the networking layer's
//! packets for the same thread of the destination server. The worker's loop
//! ([`Worker::run`]) runs an iteration whenever a transaction issued something or a packet
//! arrived: it executes the local batch, sends every buffered packet, receives every packet
//! that arrived, runs their requests as one batch (`ReqHandler`) and answers them in one
//! packet of responses per source, and delivers responses (`RespHandler`) to the waiting
//! transactions. Because the loop task is woken behind the coroutines that are already
//! runnable, an iteration batches whatever they issued in the meantime and never waits to
//! fill a quota (opportunistic batching, §2).

use std::cell::{Cell, RefCell};
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::rc::Rc;
use std::task::{Poll, Waker};

use dmem_verbs::{Clock, Message, Nanos, Verbs, VerbsError};

use crate::config::cost;
use crate::net::{Flow, Msg, Net, parse};
use crate::reliable::{Admit, Requester, Responder, split_request};
use crate::wire::{Request, Response};

pub use crate::cluster::{Cluster, Placement};

/// CPU of `n` hashtable accesses beyond the one a request is charged anyway.
fn extra_accesses(n: usize) -> Nanos {
    n.saturating_sub(1) as Nanos * cost::HASHTABLE_ALONE_NS
}

/// Responses a transaction step waits for.
#[derive(Debug, Default)]
pub struct Step {
    replies: RefCell<Vec<Option<Response>>>,
    remaining: Cell<usize>,
    waker: RefCell<Option<Waker>>,
    interrupted: Cell<bool>,
}

/// A step whose responses will never come: recovery bumped the epoch (§4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interrupted;

impl Step {
    /// A step of `n` requests.
    #[must_use]
    pub fn new(n: usize) -> Rc<Self> {
        Rc::new(Self {
            replies: RefCell::new(vec![None; n]),
            remaining: Cell::new(n),
            waker: RefCell::new(None),
            interrupted: Cell::new(false),
        })
    }

    /// Fails the step (recovery).
    pub fn interrupt(&self) {
        self.interrupted.set(true);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    fn deliver(&self, index: usize, resp: Response) {
        let mut replies = self.replies.borrow_mut();
        if let Some(slot) = replies.get_mut(index)
            && slot.is_none()
        {
            *slot = Some(resp);
            self.remaining.set(self.remaining.get() - 1);
            if self.remaining.get() == 0
                && let Some(w) = self.waker.borrow_mut().take()
            {
                w.wake();
            }
        }
    }

    /// Resolves with every response, in request order, once all have arrived, or with
    /// [`Interrupted`] if recovery ran meanwhile.
    pub fn wait(
        self: &Rc<Self>,
    ) -> impl Future<Output = Result<Vec<Response>, Interrupted>> + use<> {
        let step = Rc::clone(self);
        poll_fn(move |cx| {
            if step.interrupted.get() {
                Poll::Ready(Err(Interrupted))
            } else if step.remaining.get() == 0 {
                Poll::Ready(Ok(step
                    .replies
                    .borrow_mut()
                    .iter_mut()
                    .map(|r| r.take().expect("every reply arrived"))
                    .collect()))
            } else {
                *step.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
    }
}

type ReplyTo = (Rc<Step>, usize);

/// Counters of one worker.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WorkerStats {
    /// Iterations that did something.
    pub iterations: u64,
    /// Packets sent (requests and responses).
    pub packets: u64,
    /// Messages sent in them.
    pub messages: u64,
    /// Bytes of those packets (frames, without transport headers).
    pub bytes: u64,
    /// Local hashtable requests.
    pub local_requests: u64,
    /// Requests sent again after their retransmission timeout.
    pub retransmissions: u64,
    /// Responses ignored as stale (duplicates, answers to retransmitted requests).
    pub stale_responses: u64,
    /// Requests that arrived again after execution and got the cached response.
    pub replayed: u64,
    /// Duplicate requests dropped (already answered and acknowledged, or in the same batch).
    pub duplicates_dropped: u64,
}

/// One server thread (see the module docs).
pub struct Worker<V> {
    ctx: V,
    server: u16,
    thread: usize,
    cluster: Rc<Cluster>,
    net: RefCell<Net>,
    local: RefCell<Vec<(Request, Option<ReplyTo>)>>,
    /// The requester side of this thread's sessions (one per destination server).
    requester: RefCell<Requester<Option<ReplyTo>>>,
    /// Exactly-once execution of the requests that reach this thread.
    responder: RefCell<Responder>,
    notified: Cell<bool>,
    loop_waker: RefCell<Option<Waker>>,
    iteration_waiters: RefCell<Vec<Waker>>,
    iterations: Cell<u64>,
    local_requests: Cell<u64>,
}

impl<V> core::fmt::Debug for Worker<V> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Worker")
            .field("server", &self.server)
            .field("thread", &self.thread)
            .finish_non_exhaustive()
    }
}

/// Request packets buffered per destination and flow before `TryInsert` says no.
const MAX_BUFFERED_PACKETS: usize = 16;

impl<V: Verbs + Clock> Worker<V> {
    /// The worker of `server`'s thread `thread`, on `ctx` (whose endpoint is
    /// `cluster.endpoints[server][thread]`); `packet_limit` is the fabric's largest message,
    /// `rto` the retransmission timeout of its requests (see
    /// [`config::retransmission_timeout`](crate::config::retransmission_timeout)).
    #[must_use]
    pub fn new(
        ctx: V,
        server: u16,
        thread: usize,
        cluster: Rc<Cluster>,
        packet_limit: usize,
        rto: Nanos,
    ) -> Rc<Self> {
        let no_dedup = cluster.config.bugs.no_dedup;
        let net = Net::new(
            server,
            cluster.epoch.get(),
            cluster.config.batch_limit(),
            packet_limit,
            MAX_BUFFERED_PACKETS,
        );
        Rc::new(Self {
            ctx,
            server,
            thread,
            cluster,
            net: RefCell::new(net),
            local: RefCell::new(Vec::new()),
            requester: RefCell::new(Requester::new(rto)),
            responder: RefCell::new(Responder::new(no_dedup)),
            notified: Cell::new(false),
            loop_waker: RefCell::new(None),
            iteration_waiters: RefCell::new(Vec::new()),
            iterations: Cell::new(0),
            local_requests: Cell::new(0),
        })
    }

    /// The server this worker belongs to.
    #[must_use]
    pub fn server(&self) -> u16 {
        self.server
    }

    /// The shared cluster state.
    #[must_use]
    pub fn cluster(&self) -> &Rc<Cluster> {
        &self.cluster
    }

    /// The largest packet its networking layer builds, bytes.
    #[must_use]
    pub fn packet_limit(&self) -> usize {
        self.net.borrow().packet_limit()
    }

    /// Its fabric context (for the clock).
    #[must_use]
    pub fn ctx(&self) -> &V {
        &self.ctx
    }

    /// Its counters.
    #[must_use]
    pub fn stats(&self) -> WorkerStats {
        let (packets, messages, bytes) = self.net.borrow().sent();
        let requester = self.requester.borrow().stats();
        let responder = self.responder.borrow().stats();
        WorkerStats {
            iterations: self.iterations.get(),
            packets,
            messages,
            bytes,
            local_requests: self.local_requests.get(),
            retransmissions: requester.retransmissions,
            stale_responses: requester.stale_responses,
            replayed: responder.replayed,
            duplicates_dropped: responder.dropped,
        }
    }

    /// Requests of this thread sent and not yet answered (retransmitted until they are,
    /// or until recovery abandons them).
    #[must_use]
    pub fn outstanding(&self) -> usize {
        self.requester.borrow().outstanding()
    }

    /// Recovery (§4.4): drops every buffered packet and queued request and fails every step
    /// waiting for a response (they were sent in the old epoch); their requests are
    /// abandoned, never retransmitted in the new epoch.
    pub fn interrupt(&self) {
        let mut net = self.net.borrow_mut();
        let _ = net.take_packets();
        net.set_epoch(self.cluster.epoch.get());
        drop(net);
        for (_, reply) in self.local.borrow_mut().drain(..) {
            if let Some((step, _)) = reply {
                step.interrupt();
            }
        }
        let abandoned = self.requester.borrow_mut().reset();
        for (step, _) in abandoned.into_iter().flatten() {
            step.interrupt();
        }
    }

    fn notify(&self) {
        self.notified.set(true);
        if let Some(w) = self.loop_waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// Sends `req`, made in `epoch`, to server `to` in `flow`; its response goes to `reply`
    /// (`None`: nobody waits for it, but it is still answered, and retransmitted until it
    /// is). Waits for an iteration and retries while the destination's packets are full
    /// (`TryInsert` said no). If recovery bumped the epoch meanwhile, the request is not
    /// sent and its step fails: it would act in the new epoch for a transaction that
    /// recovery already decided (§4.4).
    pub async fn issue(
        &self,
        to: u16,
        flow: Flow,
        req: Request,
        reply: Option<ReplyTo>,
        epoch: u64,
    ) {
        // A server recovery declared crashed never answers: fail the step instead of
        // retransmitting forever (a Dnl-1 abort unlocks every replica it locked, the
        // crashed one included; recovery already released that transaction's locks).
        if self.cluster.epoch.get() != epoch || self.cluster.is_crashed(to) {
            if let Some((step, _)) = reply {
                step.interrupt();
            }
            return;
        }
        // A halted server sends only recovery's messages (§4.4); a transaction's request
        // waits for the resume and is then dropped with its step if the epoch moved on.
        if flow != Flow::RECOVERY && self.cluster.is_halted(self.server) {
            self.cluster.resumed(self.server).await;
            if self.cluster.epoch.get() != epoch || self.cluster.is_crashed(to) {
                if let Some((step, _)) = reply {
                    step.interrupt();
                }
                return;
            }
        }
        if to == self.server {
            self.local.borrow_mut().push((req, reply));
            self.notify();
            return;
        }
        let payload = req.emit();
        let msg_type = req.msg_type();
        let dest = self.cluster.endpoints[usize::from(to)][self.thread];
        loop {
            let msg = self.requester.borrow_mut().request(
                to,
                flow,
                msg_type,
                payload.clone(),
                reply.clone(),
                self.ctx.now(),
            );
            let reqno = msg.slot;
            if self.net.borrow_mut().try_insert(dest, flow, msg) {
                self.ctx.cpu(cost::MESSAGE_NS);
                self.notify();
                return;
            }
            self.requester.borrow_mut().cancel(to, reqno);
            self.notify();
            self.next_iteration().await;
            if self.cluster.epoch.get() != epoch {
                if let Some((step, _)) = reply {
                    step.interrupt();
                }
                return;
            }
        }
    }

    /// Re-inserts every request whose retransmission timeout passed (eRPC-style
    /// reliability, [`crate::reliable`]); one the packets refuse is due again next time.
    fn retransmit(&self) -> bool {
        let now = self.ctx.now();
        let due = self.requester.borrow_mut().due(now);
        let did = !due.is_empty();
        if did {
            self.cluster.retransmitted();
        }
        let mut net = self.net.borrow_mut();
        for (to, flow, msg) in due {
            let dest = self.cluster.endpoints[usize::from(to)][self.thread];
            let reqno = msg.slot;
            if self.cluster.is_crashed(to) {
                if let Some(Some((step, _))) = self.requester.borrow_mut().abandon(to, reqno) {
                    step.interrupt();
                }
            } else if net.try_insert(dest, flow, msg) {
                self.ctx.cpu(cost::MESSAGE_NS);
            } else {
                self.requester.borrow_mut().retry_at(to, reqno, now);
            }
        }
        did
    }

    /// Resolves after the next iteration of the loop.
    fn next_iteration(&self) -> impl Future<Output = ()> + '_ {
        let target = self.iterations.get() + 1;
        poll_fn(move |cx| {
            if self.iterations.get() >= target {
                Poll::Ready(())
            } else {
                self.iteration_waiters.borrow_mut().push(cx.waker().clone());
                Poll::Pending
            }
        })
    }

    fn hashtable_cost(&self, batch: usize) -> u64 {
        let each = if self.cluster.config.hashtable_batching && batch > 1 {
            cost::HASHTABLE_BATCHED_NS
        } else {
            cost::HASHTABLE_ALONE_NS
        };
        each * batch as u64
    }

    /// Executes a batch of requests against this server's store (`ReqHandler`), charging
    /// the hashtable's CPU.
    fn execute(&self, reqs: &[Request]) -> Vec<Option<Response>> {
        self.ctx.cpu(self.hashtable_cost(reqs.len()));
        let me = self.server;
        let mut store = self.cluster.stores[usize::from(me)].borrow_mut();
        reqs.iter()
            .map(|r| match r {
                // Recovery (§4.4): one hashtable access per request is charged above; a
                // gathered entry or an applied write beyond the first costs one more each.
                Request::Gather { after, .. } => {
                    let all = crate::survivor::survivor_state(&self.cluster, me, &store);
                    let (txns, more) = crate::survivor::page(
                        all,
                        *after,
                        crate::survivor::page_budget(self.net.borrow().packet_limit()),
                    );
                    let entries: usize = txns.iter().map(|t| t.entries.len().max(1)).sum();
                    self.ctx.cpu(extra_accesses(entries));
                    Some(Response::Gathered { more, txns })
                }
                Request::Query { txns, keys, .. } => {
                    let budget = crate::survivor::page_budget(self.net.borrow().packet_limit());
                    let query = (txns.clone(), keys.clone());
                    let reply = crate::survivor::answer(&self.cluster, me, &store, &query, budget);
                    self.ctx.cpu(extra_accesses(txns.len() + keys.len()));
                    Some(reply)
                }
                Request::Decide {
                    txn,
                    commit,
                    writes,
                    ..
                } => {
                    let logged = store.log.get(txn).map_or(0, Vec::len);
                    self.ctx.cpu(extra_accesses(logged + writes.len()));
                    store.decide(*txn, *commit, writes, |t, k| {
                        self.cluster.replicas(t, k).contains(&me)
                    });
                    Some(Response::Ack { ok: true })
                }
                Request::Resume { epoch } => {
                    // Commits a recovery interrupted are decided now (module docs of
                    // `recovery`).
                    self.cluster.in_commit[usize::from(me)]
                        .borrow_mut()
                        .retain(|_, began| *began >= *epoch);
                    self.cluster.set_halted(me, false);
                    Some(Response::Ack { ok: true })
                }
                r => store.handle(r),
            })
            .collect()
    }

    /// One `RunIteration` (§4.1 steps 1 and 3, §5.1), starting with `first` if the loop
    /// received it while waiting. Returns whether it did anything.
    ///
    /// # Errors
    /// The fabric's error (this server crashed).
    pub async fn run_iteration(&self, first: Option<Message>) -> Result<bool, VerbsError> {
        let mut did = false;
        // 1. The local hashtable batch.
        let local = std::mem::take(&mut *self.local.borrow_mut());
        if !local.is_empty() {
            did = true;
            self.local_requests
                .set(self.local_requests.get() + local.len() as u64);
            let (reqs, replies): (Vec<_>, Vec<_>) = local.into_iter().unzip();
            for (resp, reply) in self.execute(&reqs).into_iter().zip(replies) {
                if let (Some(resp), Some((step, i))) = (resp, reply) {
                    step.deliver(i, resp);
                }
            }
        }
        // 2. Poll and dispatch: requests run as one batch per packet, their responses join
        // the packets buffered for their sources.
        let mut next = first;
        loop {
            let msg = match next.take() {
                Some(m) => m,
                None => match self.ctx.try_recv()? {
                    Some(m) => m,
                    None => break,
                },
            };
            did = true;
            self.dispatch(msg);
        }
        // Requests unanswered past their timeout join this iteration's packets.
        did |= self.retransmit();
        // 3. Send every buffered packet (requests of the coroutines and the responses just
        // made) with one doorbell. The paper sends before polling; over consecutive
        // iterations the order is the same, and one doorbell per iteration instead of two.
        did |= self.flush().await?;
        if did {
            self.iterations.set(self.iterations.get() + 1);
            for w in self.iteration_waiters.borrow_mut().drain(..) {
                w.wake();
            }
        }
        Ok(did)
    }

    async fn flush(&self) -> Result<bool, VerbsError> {
        let packets = {
            let mut net = self.net.borrow_mut();
            net.set_epoch(self.cluster.epoch.get());
            let max = net.packet_limit();
            // Sizes are checked on insert, so a frame always builds; were it not to, the
            // packet could not be sent and is reported as too large.
            net.take_packets()
                .map_err(|_| VerbsError::MessageTooLarge { len: max + 1, max })?
        };
        if packets.is_empty() {
            return Ok(false);
        }
        self.ctx.send_batch(packets).await?;
        Ok(true)
    }

    fn dispatch(&self, msg: Message) {
        let Ok(packet) = parse(&msg.payload) else {
            return; // a malformed packet is dropped
        };
        if packet.epoch != self.cluster.epoch.get() {
            return; // a packet of another epoch (§4.4)
        }
        self.ctx
            .cpu(cost::MESSAGE_NS * packet.messages.len() as u64);
        if packet.response {
            for m in packet.messages {
                // A stale response (duplicate, or its request already answered) is ignored.
                let reply = self.requester.borrow_mut().on_response(
                    packet.src_node,
                    m.slot,
                    self.ctx.now(),
                );
                let Some(Some((step, i))) = reply else {
                    continue;
                };
                if let Ok(resp) = Response::parse(m.msg_type, &m.payload) {
                    step.deliver(i, resp);
                }
            }
            return;
        }
        // Requests: each request number of a session runs once; one that ran before gets
        // its cached response again; the rest run as one batch.
        let mut reqs = Vec::with_capacity(packet.messages.len());
        let mut slots = Vec::with_capacity(packet.messages.len());
        let mut replays = Vec::new();
        {
            let mut responder = self.responder.borrow_mut();
            for m in &packet.messages {
                let Some((acked_below, body)) = split_request(&m.payload) else {
                    continue;
                };
                let Ok(r) = Request::parse(m.msg_type, body) else {
                    continue;
                };
                match responder.admit(msg.from, m.slot, acked_below) {
                    Admit::Execute => {
                        slots.push((m.msg_type, m.slot));
                        reqs.push(r);
                    }
                    Admit::Replay(resp) => replays.push(resp),
                    Admit::Drop => {}
                }
            }
        }
        let responses = self.execute(&reqs);
        let mut net = self.net.borrow_mut();
        let mut responder = self.responder.borrow_mut();
        for (resp, (msg_type, slot)) in responses.into_iter().zip(slots) {
            // Every request is answered (the answer is the requester's acknowledgement).
            let resp = resp.unwrap_or(Response::Ack { ok: true });
            let out = Msg {
                msg_type,
                slot,
                payload: resp.emit(),
            };
            responder.executed(msg.from, slot, &out);
            self.ctx.cpu(cost::MESSAGE_NS);
            net.insert_response(msg.from, packet.flow, out);
        }
        for out in replays {
            self.ctx.cpu(cost::MESSAGE_NS);
            net.insert_response(msg.from, packet.flow, out);
        }
    }

    /// The loop: runs iterations until the fabric fails (this server crashed).
    pub async fn run(self: Rc<Self>) {
        let mut first = None;
        loop {
            match self.run_iteration(first.take()).await {
                Ok(true) => continue,
                Ok(false) => {}
                Err(_) => return,
            }
            // Wait for a transaction's request, a packet or the next retransmission timeout.
            let deadline = self.requester.borrow().next_deadline();
            let mut timer = pin!(async {
                match deadline {
                    Some(d) => self.ctx.sleep_until(d).await,
                    None => std::future::pending::<()>().await,
                }
            });
            let mut recv = pin!(self.ctx.recv());
            let got = poll_fn(|cx| {
                if self.notified.replace(false) {
                    return Poll::Ready(Ok(None));
                }
                *self.loop_waker.borrow_mut() = Some(cx.waker().clone());
                if timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Ok(None));
                }
                match recv.as_mut().poll(cx) {
                    Poll::Ready(Ok(m)) => Poll::Ready(Ok(Some(m))),
                    Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                    Poll::Pending => Poll::Pending,
                }
            })
            .await;
            match got {
                Ok(m) => first = m,
                Err(_) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_spreads_replicas_over_distinct_servers() {
        let p = Placement::new(5, 3);
        let mut primaries = [0u32; 5];
        for key in 0..10_000u64 {
            let r: Vec<u16> = p.replicas(0, key).collect();
            assert_eq!(r.len(), 3);
            assert!(r[0] != r[1] && r[1] != r[2] && r[0] != r[2]);
            assert!(r.iter().all(|s| p.holds(*s, 0, key)));
            assert_eq!((0..5).filter(|s| p.holds(*s, 0, key)).count(), 3);
            primaries[usize::from(r[0])] += 1;
        }
        assert!(
            primaries.iter().all(|&n| (1_700..2_300).contains(&n)),
            "{primaries:?}"
        );
        assert_eq!(Placement::new(2, 3).replicas(1, 1).count(), 2);
    }
}
