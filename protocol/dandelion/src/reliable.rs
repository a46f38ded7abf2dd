//! eRPC-style reliability for the networking layer (Dandelion §5 runs over eRPC, which
//! retransmits lost packets; eRPC NSDI'19 §5.2), free of any fabric.
//!
//! A *session* is one worker thread (the requester) and one destination server. Every
//! request gets the session's next **request number**, carried in the message's slot
//! field, and the requester's *acknowledged-below* mark: every request of the session
//! numbered below it has been answered (or abandoned by recovery, see below), so the
//! responder may forget them. The wire form of a request message is
//! `acked_below: u32 LE ++ request bytes` ([`ACK_PREFIX`] bytes more than before).
//!
//! * [`Requester`] keeps every unanswered request with a retransmission deadline; [`Requester::due`]
//!   hands back the ones whose deadline passed, to be re-inserted into packets. It
//!   retransmits **per message**, not per packet: a lost packet's messages were sent
//!   together and time out together, so they are re-sent in one iteration and batch again,
//!   while a packet of which only some requests were answered (responses of one request
//!   packet may travel in several response packets, and a response packet mixes responses
//!   to several request packets) re-sends only the missing ones. A response whose request
//!   is not outstanding (a duplicate, or one that arrives after a retransmission was
//!   already answered) is stale and ignored.
//! * [`Responder`] executes each request number of a session **once**: a request it has
//!   executed gets the cached response again (the first response was lost, or the request
//!   was duplicated); one below the acknowledged-below mark is dropped (its requester has
//!   its answer). Responses are cached until the requester acknowledges them.
//!
//! Epochs (§4.4): on recovery the requester abandons every outstanding request
//! ([`Requester::reset`]) — the steps waiting for them are interrupted — and never
//! retransmits them in the new epoch, whose packets the servers accept; packets of the old
//! epoch still in the network are dropped by the receivers' epoch check. So a
//! retransmission can never carry a request of a transaction recovery already decided into
//! the new epoch. Request numbers keep increasing across epochs (never reused), so an old
//! response can never be taken for a new request.
//!
//! Request numbers are `u32` per session and are not reused; a session would need 2³²
//! requests to wrap, far beyond any run here (a wrap would need eRPC's slot scheme).
//!
//! **Timeout.** eRPC retransmits after a fixed 5 ms, about a thousand fabric round trips,
//! which no queueing delay reaches. dmem's floor is much shorter (the caller's minimum,
//! [`crate::config::retransmission_timeout`]: 90 µs on cx5), so that the litmus suite's
//! 2 ms runs recover from a lost message; but a loaded round trip can exceed it (FaSST at
//! 64 contexts per thread: a p50 of hundreds of µs), and a fixed short timeout then
//! re-sends requests that were never lost, each re-send adding load. So each session
//! estimates its round trip as TCP does (RFC 6298: smoothed RTT and its variation, from
//! requests answered without a re-send — Karn's rule) and times a request out after
//! `max(minimum, SRTT + 4 × RTTVAR)`; every expiry doubles the session's timeout until the
//! next sample (RFC 6298 §5.5: without it a round trip longer than the timeout would have
//! every request re-sent and never give a sample). Capped at [`MAX_RTO_FACTOR`] times the
//! minimum (≈ eRPC's 5 ms on cx5).

use std::collections::{BTreeMap, HashMap};

use dmem_layout::bytes::{ByteReader, ByteSink};
use dmem_verbs::{Endpoint, Nanos};

use crate::net::{Flow, Msg};

/// Bytes a request message carries for reliability: the acknowledged-below mark.
pub const ACK_PREFIX: usize = 4;

/// The longest timeout, in units of the minimum one: 64 × 90 µs ≈ 5.8 ms on cx5, about
/// eRPC's fixed 5 ms (module docs).
pub const MAX_RTO_FACTOR: Nanos = 64;

/// A session's round-trip estimate (RFC 6298 §2, in integer nanoseconds: gains 1/8 and
/// 1/4, K = 4).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct RttEstimate {
    /// Smoothed round trip, `None` before the first sample.
    srtt: Option<Nanos>,
    rttvar: Nanos,
}

impl RttEstimate {
    fn sample(&mut self, rtt: Nanos) {
        match self.srtt {
            None => {
                self.srtt = Some(rtt);
                self.rttvar = rtt / 2;
            }
            Some(srtt) => {
                self.rttvar = (3 * self.rttvar + srtt.abs_diff(rtt)) / 4;
                self.srtt = Some((7 * srtt + rtt) / 8);
            }
        }
    }

    /// The timeout: `max(min, SRTT + 4 × RTTVAR)`, at most [`MAX_RTO_FACTOR`] × `min`.
    fn rto(&self, min: Nanos) -> Nanos {
        let estimate = self
            .srtt
            .map_or(0, |srtt| srtt.saturating_add(self.rttvar.saturating_mul(4)));
        estimate.clamp(min, min.saturating_mul(MAX_RTO_FACTOR))
    }
}

/// Splits a received request payload into its acknowledged-below mark and the request.
#[must_use]
pub fn split_request(payload: &[u8]) -> Option<(u32, &[u8])> {
    let mut r = ByteReader::new(payload);
    let mark = r.u32().ok()?;
    Some((mark, r.rest()))
}

#[derive(Debug)]
struct Outstanding<T> {
    flow: Flow,
    msg_type: u16,
    request: Vec<u8>,
    /// When it was first sent (a round-trip sample when it is answered without a re-send).
    sent_at: Nanos,
    /// It was re-sent (its answer gives no sample).
    resent: bool,
    deadline: Nanos,
    reply: T,
}

#[derive(Debug)]
struct Session<T> {
    next: u32,
    outstanding: BTreeMap<u32, Outstanding<T>>,
    rtt: RttEstimate,
    /// Timeouts since the last sample: the timeout is doubled this many times (at most 6).
    backoff: u32,
}

impl<T> Default for Session<T> {
    fn default() -> Self {
        Self {
            next: 0,
            outstanding: BTreeMap::new(),
            rtt: RttEstimate::default(),
            backoff: 0,
        }
    }
}

impl<T> Session<T> {
    /// The timeout of a request sent now: the estimate, doubled per expiry since the last
    /// sample, at most [`MAX_RTO_FACTOR`] × `min`.
    fn timeout(&self, min: Nanos) -> Nanos {
        self.rtt
            .rto(min)
            .saturating_mul(1 << self.backoff)
            .min(min.saturating_mul(MAX_RTO_FACTOR))
    }

    fn acked_below(&self) -> u32 {
        self.outstanding.keys().next().copied().unwrap_or(self.next)
    }

    fn message(&self, reqno: u32, o: &Outstanding<T>) -> Msg {
        let mut payload = Vec::with_capacity(ACK_PREFIX + o.request.len());
        payload.put_u32(self.acked_below());
        payload.put_bytes(&o.request);
        Msg {
            msg_type: o.msg_type,
            slot: reqno,
            payload,
        }
    }
}

/// Counters of a [`Requester`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RequesterStats {
    /// Requests sent again after their timeout.
    pub retransmissions: u64,
    /// Responses ignored: their request was not outstanding (duplicates, late answers).
    pub stale_responses: u64,
}

/// The requester's side of every session of one worker thread (see the module docs). `T`
/// is what a response is delivered to.
#[derive(Debug)]
pub struct Requester<T> {
    /// The shortest timeout (module docs, "Timeout").
    min_rto: Nanos,
    sessions: HashMap<u16, Session<T>>,
    stats: RequesterStats,
}

impl<T> Requester<T> {
    /// A requester that retransmits a request unanswered for at least `min_rto` ns (longer
    /// when its session's round trips are longer, and doubling with each re-send).
    #[must_use]
    pub fn new(min_rto: Nanos) -> Self {
        Self {
            min_rto: min_rto.max(1),
            sessions: HashMap::new(),
            stats: RequesterStats::default(),
        }
    }

    /// The timeout of a request sent to `dest` now (module docs, "Timeout").
    #[must_use]
    pub fn rto(&self, dest: u16) -> Nanos {
        self.sessions
            .get(&dest)
            .map_or(self.min_rto, |s| s.timeout(self.min_rto))
    }

    /// Its counters.
    #[must_use]
    pub fn stats(&self) -> RequesterStats {
        self.stats
    }

    /// Registers a request to server `dest` sent at `now`, its response to go to `reply`;
    /// returns the message to insert into a packet (slot = its request number). If the
    /// packet refuses it, [`cancel`](Self::cancel) takes it back.
    pub fn request(
        &mut self,
        dest: u16,
        flow: Flow,
        msg_type: u16,
        request: Vec<u8>,
        reply: T,
        now: Nanos,
    ) -> Msg {
        let session = self.sessions.entry(dest).or_default();
        let reqno = session.next;
        session.next = session.next.wrapping_add(1);
        let o = Outstanding {
            flow,
            msg_type,
            request,
            sent_at: now,
            resent: false,
            deadline: now.saturating_add(session.timeout(self.min_rto)),
            reply,
        };
        session.outstanding.insert(reqno, o);
        // Built once it is outstanding: the mark must not pass the request itself.
        session.message(reqno, &session.outstanding[&reqno])
    }

    /// Takes back the request [`request`](Self::request) just registered (nothing was
    /// registered since): its number is reused, as it was never sent.
    pub fn cancel(&mut self, dest: u16, reqno: u32) -> Option<T> {
        let session = self.sessions.get_mut(&dest)?;
        let o = session.outstanding.remove(&reqno)?;
        if session.next == reqno.wrapping_add(1) {
            session.next = reqno;
        }
        Some(o.reply)
    }

    /// A response from server `src` to request `reqno`, received at `now`: the reply target
    /// if the request was outstanding (it no longer is), `None` for a stale response. A
    /// request answered without a re-send gives its session a round-trip sample (one that
    /// was re-sent does not: which send was answered is unknown, Karn's rule).
    pub fn on_response(&mut self, src: u16, reqno: u32, now: Nanos) -> Option<T> {
        let Some(session) = self.sessions.get_mut(&src) else {
            self.stats.stale_responses += 1;
            return None;
        };
        let Some(o) = session.outstanding.remove(&reqno) else {
            self.stats.stale_responses += 1;
            return None;
        };
        if !o.resent {
            session.rtt.sample(now.saturating_sub(o.sent_at));
            session.backoff = 0;
        }
        Some(o.reply)
    }

    /// Every request unanswered past its deadline at `now`, as `(destination, flow,
    /// message)` to insert again. A session with any doubles its timeout (once per call),
    /// and its re-sent requests are due again after that timeout.
    pub fn due(&mut self, now: Nanos) -> Vec<(u16, Flow, Msg)> {
        let mut out = Vec::new();
        let mut dests: Vec<u16> = self.sessions.keys().copied().collect();
        dests.sort_unstable(); // a deterministic order for a deterministic simulation
        for dest in dests {
            let session = self.sessions.get_mut(&dest).expect("listed");
            let due: Vec<u32> = session
                .outstanding
                .iter()
                .filter(|(_, o)| o.deadline <= now)
                .map(|(n, _)| *n)
                .collect();
            if !due.is_empty() {
                session.backoff = (session.backoff + 1).min(6);
            }
            let timeout = session.timeout(self.min_rto);
            for reqno in due {
                let o = session.outstanding.get_mut(&reqno).expect("listed");
                o.resent = true;
                o.deadline = now.saturating_add(timeout);
                let flow = o.flow;
                let o = &session.outstanding[&reqno];
                out.push((dest, flow, session.message(reqno, o)));
                self.stats.retransmissions += 1;
            }
        }
        out
    }

    /// Gives up on request `reqno` to `dest` (a server declared crashed): it is no longer
    /// outstanding; its number is not reused.
    pub fn abandon(&mut self, dest: u16, reqno: u32) -> Option<T> {
        let session = self.sessions.get_mut(&dest)?;
        session.outstanding.remove(&reqno).map(|o| o.reply)
    }

    /// A due request that the packets refused: due again at `now` (the next iteration).
    pub fn retry_at(&mut self, dest: u16, reqno: u32, now: Nanos) {
        if let Some(o) = self
            .sessions
            .get_mut(&dest)
            .and_then(|s| s.outstanding.get_mut(&reqno))
        {
            o.deadline = now;
        }
    }

    /// The earliest retransmission deadline.
    #[must_use]
    pub fn next_deadline(&self) -> Option<Nanos> {
        self.sessions
            .values()
            .flat_map(|s| s.outstanding.values().map(|o| o.deadline))
            .min()
    }

    /// Requests outstanding.
    #[must_use]
    pub fn outstanding(&self) -> usize {
        self.sessions.values().map(|s| s.outstanding.len()).sum()
    }

    /// Recovery bumped the epoch: abandons every outstanding request (never retransmitted)
    /// and returns their reply targets. Request numbers are not reused.
    pub fn reset(&mut self) -> Vec<T> {
        self.sessions
            .values_mut()
            .flat_map(|s| std::mem::take(&mut s.outstanding).into_values())
            .map(|o| o.reply)
            .collect()
    }
}

/// What the responder does with a received request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    /// Execute it (first time this request number arrived).
    Execute,
    /// Already executed: send this cached response again.
    Replay(Msg),
    /// Drop it: already answered and acknowledged, or its execution is in this very batch.
    Drop,
}

#[derive(Debug, Default)]
struct Served {
    /// Every request numbered below it was answered and the requester knows it.
    below: u32,
    /// Executed requests at or above `below`: their response (`None` while executing).
    done: BTreeMap<u32, Option<Msg>>,
}

/// Counters of a [`Responder`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ResponderStats {
    /// Requests that arrived again after their execution and got the cached response.
    pub replayed: u64,
    /// Requests dropped as acknowledged duplicates.
    pub dropped: u64,
}

/// The server's side of every session that reaches one worker thread: exactly-once
/// execution per request number (see the module docs).
#[derive(Debug, Default)]
pub struct Responder {
    sessions: HashMap<Endpoint, Served>,
    /// Planted bug: execute every arriving request again (no duplicate suppression).
    no_dedup: bool,
    stats: ResponderStats,
}

impl Responder {
    /// A responder; `no_dedup` plants the bug that re-executes duplicates.
    #[must_use]
    pub fn new(no_dedup: bool) -> Self {
        Self {
            no_dedup,
            ..Self::default()
        }
    }

    /// Its counters.
    #[must_use]
    pub fn stats(&self) -> ResponderStats {
        self.stats
    }

    /// Responses cached (executed requests not yet acknowledged).
    #[must_use]
    pub fn cached(&self) -> usize {
        self.sessions.values().map(|s| s.done.len()).sum()
    }

    /// Request `reqno` from `from`, whose requester had every request below `acked_below`
    /// answered: execute, replay or drop. [`Admit::Execute`] must be followed by
    /// [`executed`](Self::executed) with its response.
    pub fn admit(&mut self, from: Endpoint, reqno: u32, acked_below: u32) -> Admit {
        let s = self.sessions.entry(from).or_default();
        if acked_below > s.below {
            s.below = acked_below;
            s.done = s.done.split_off(&acked_below);
        }
        if self.no_dedup {
            return Admit::Execute;
        }
        if reqno < s.below {
            self.stats.dropped += 1;
            return Admit::Drop;
        }
        match s.done.get(&reqno) {
            None => {
                s.done.insert(reqno, None);
                Admit::Execute
            }
            Some(Some(resp)) => {
                self.stats.replayed += 1;
                Admit::Replay(resp.clone())
            }
            Some(None) => {
                self.stats.dropped += 1;
                Admit::Drop
            }
        }
    }

    /// The response of an admitted request, cached until acknowledged.
    pub fn executed(&mut self, from: Endpoint, reqno: u32, response: &Msg) {
        if let Some(s) = self.sessions.get_mut(&from)
            && reqno >= s.below
        {
            s.done.insert(reqno, Some(response.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmem_verbs::{NodeId, Port};

    const RTO: Nanos = 100;

    fn client() -> Endpoint {
        Endpoint {
            node: NodeId(1),
            port: Port(0),
        }
    }

    /// What a server does with one request message: admit, execute (count executions),
    /// answer.
    struct Server {
        r: Responder,
        executions: HashMap<u32, u32>,
    }

    impl Server {
        fn new(no_dedup: bool) -> Self {
            Self {
                r: Responder::new(no_dedup),
                executions: HashMap::new(),
            }
        }

        fn receive(&mut self, m: &Msg) -> Option<Msg> {
            let (acked, body) = split_request(&m.payload).unwrap();
            match self.r.admit(client(), m.slot, acked) {
                Admit::Execute => {
                    *self.executions.entry(m.slot).or_default() += 1;
                    let resp = Msg {
                        msg_type: m.msg_type,
                        slot: m.slot,
                        payload: body.to_vec(),
                    };
                    self.r.executed(client(), m.slot, &resp);
                    Some(resp)
                }
                Admit::Replay(resp) => Some(resp),
                Admit::Drop => None,
            }
        }
    }

    fn send(req: &mut Requester<&'static str>, body: u8, reply: &'static str, now: Nanos) -> Msg {
        req.request(2, Flow::COMMIT, 7, vec![body], reply, now)
    }

    #[test]
    fn slow_round_trips_lengthen_the_timeout_so_nothing_is_re_sent_spuriously() {
        let mut req = Requester::new(RTO);
        assert_eq!(req.rto(2), RTO, "no sample yet: the minimum");
        // Every answer takes 10 minimum timeouts (a loaded server). The first requests are
        // re-sent while the timeout backs off; once one is answered without a re-send, the
        // estimate covers the round trip and nothing is re-sent any more.
        let mut now = 0;
        let mut resent_per_request = Vec::new();
        for i in 0..10 {
            let m = send(&mut req, i, "x", now);
            let before = req.stats().retransmissions;
            for t in now + 1..=now + 10 * RTO {
                let _ = req.due(t);
            }
            now += 10 * RTO;
            assert_eq!(req.on_response(2, m.slot, now), Some("x"));
            resent_per_request.push(req.stats().retransmissions - before);
        }
        assert_eq!(resent_per_request, [3, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
        let rto = req.rto(2);
        assert!((10 * RTO..=MAX_RTO_FACTOR * RTO).contains(&rto), "{rto}");
        // Another destination has its own estimate.
        assert_eq!(req.rto(3), RTO);
    }

    #[test]
    fn fast_round_trips_keep_the_minimum_and_the_cap_holds() {
        let mut req = Requester::new(RTO);
        for i in 0..20 {
            let m = send(&mut req, i, "x", 1_000 * u64::from(i));
            assert_eq!(
                req.on_response(2, m.slot, 1_000 * u64::from(i) + 3),
                Some("x")
            );
        }
        assert_eq!(req.rto(2), RTO, "a 3 ns round trip: the floor");
        let mut req = Requester::new(RTO);
        for i in 0..20 {
            let m = send(&mut req, i, "x", 0);
            assert_eq!(req.on_response(2, m.slot, 1_000 * RTO), Some("x"));
        }
        assert_eq!(req.rto(2), MAX_RTO_FACTOR * RTO, "capped");
    }

    #[test]
    fn each_expiry_doubles_the_timeout_up_to_the_cap() {
        let mut req = Requester::new(RTO);
        let _lost = send(&mut req, 1, "a", 0);
        let mut at = RTO;
        let mut gaps = Vec::new();
        for _ in 0..9 {
            assert_eq!(req.due(at).len(), 1);
            let next = req.next_deadline().unwrap();
            assert!(req.due(next - 1).is_empty());
            gaps.push((next - at) / RTO);
            at = next;
        }
        assert_eq!(gaps, [2, 4, 8, 16, 32, 64, 64, 64, 64]);
    }

    #[test]
    fn lost_request_is_retransmitted_after_the_timeout() {
        let mut req = Requester::new(RTO);
        let mut srv = Server::new(false);
        let _lost = send(&mut req, 1, "a", 0);
        assert!(req.due(RTO - 1).is_empty());
        assert_eq!(req.next_deadline(), Some(RTO));
        let again = req.due(RTO);
        assert_eq!(again.len(), 1);
        assert_eq!((again[0].0, again[0].1), (2, Flow::COMMIT));
        let resp = srv.receive(&again[0].2).unwrap();
        assert_eq!(req.on_response(2, resp.slot, 0), Some("a"));
        assert_eq!(srv.executions[&0], 1);
        assert_eq!(req.outstanding(), 0);
        assert_eq!(req.stats().retransmissions, 1);
    }

    #[test]
    fn lost_response_is_replayed_not_re_executed() {
        let mut req = Requester::new(RTO);
        let mut srv = Server::new(false);
        let m = send(&mut req, 1, "a", 0);
        let _lost_response = srv.receive(&m).unwrap();
        let again = req.due(RTO).pop().unwrap().2;
        let replay = srv.receive(&again).unwrap();
        assert_eq!(srv.executions[&0], 1, "executed once");
        assert_eq!(replay.payload, vec![1]);
        assert_eq!(req.on_response(2, replay.slot, 0), Some("a"));
        assert_eq!(srv.r.stats().replayed, 1);
    }

    #[test]
    fn duplicate_request_and_duplicate_response() {
        let mut req = Requester::new(RTO);
        let mut srv = Server::new(false);
        let m = send(&mut req, 1, "a", 0);
        let r1 = srv.receive(&m).unwrap();
        let r2 = srv.receive(&m).unwrap(); // the network duplicated the request
        assert_eq!(srv.executions[&0], 1);
        assert_eq!(req.on_response(2, r1.slot, 0), Some("a"));
        assert_eq!(req.on_response(2, r2.slot, 0), None, "stale");
        assert_eq!(req.on_response(2, r1.slot, 0), None, "duplicated response");
        assert_eq!(req.stats().stale_responses, 2);
        assert!(
            req.due(10 * RTO).is_empty(),
            "answered: never retransmitted"
        );
    }

    #[test]
    fn reordering_and_acknowledgement_forget_answered_requests() {
        let mut req = Requester::new(RTO);
        let mut srv = Server::new(false);
        let a = send(&mut req, 1, "a", 0);
        let b = send(&mut req, 2, "b", 0);
        // b overtakes a; both answered out of order.
        let rb = srv.receive(&b).unwrap();
        let ra = srv.receive(&a).unwrap();
        assert_eq!(req.on_response(2, rb.slot, 0), Some("b"));
        assert_eq!(srv.r.cached(), 2);
        // a is still unanswered at the requester: the next request acknowledges nothing.
        let c = send(&mut req, 3, "c", 0);
        assert_eq!(split_request(&c.payload).unwrap().0, 0);
        assert_eq!(req.on_response(2, ra.slot, 0), Some("a"));
        let d = send(&mut req, 4, "d", 0);
        assert_eq!(split_request(&d.payload).unwrap().0, 2, "c is outstanding");
        let _ = srv.receive(&d).unwrap();
        assert_eq!(srv.r.cached(), 1, "a and b forgotten: d cached");
        // A late duplicate of a (below the mark) is dropped, not executed again.
        assert_eq!(srv.receive(&a), None);
        assert_eq!(srv.executions[&0], 1);
        // c arrives late, after d: executed once.
        let rc = srv.receive(&c).unwrap();
        assert_eq!(req.on_response(2, rc.slot, 0), Some("c"));
        assert_eq!(srv.executions.values().sum::<u32>(), 4);
    }

    #[test]
    fn a_refused_request_is_taken_back_and_its_number_reused() {
        let mut req = Requester::new(RTO);
        let m = send(&mut req, 1, "a", 0);
        assert_eq!(req.cancel(2, m.slot), Some("a"));
        assert_eq!(send(&mut req, 2, "b", 0).slot, m.slot);
        // A due request the packets refused is due again at once.
        let due = req.due(RTO);
        req.retry_at(due[0].0, due[0].2.slot, RTO);
        assert_eq!(req.due(RTO).len(), 1);
        // One given up on (its server crashed) is never sent again.
        assert_eq!(req.abandon(2, m.slot), Some("b"));
        assert!(req.due(10 * RTO).is_empty());
    }

    #[test]
    fn an_epoch_change_abandons_outstanding_requests_for_good() {
        let mut req = Requester::new(RTO);
        let mut srv = Server::new(false);
        let old = send(&mut req, 1, "old", 0);
        let answered = srv.receive(&old).unwrap(); // its response is still in flight
        assert_eq!(req.reset(), vec!["old"]);
        assert!(req.due(10 * RTO).is_empty(), "never retransmitted");
        assert_eq!(req.next_deadline(), None);
        assert_eq!(
            req.on_response(2, answered.slot, 0),
            None,
            "the old answer is stale"
        );
        // New requests get new numbers, acknowledging everything before the epoch.
        let new = send(&mut req, 2, "new", 10 * RTO);
        assert_eq!(new.slot, 1);
        assert_eq!(split_request(&new.payload).unwrap().0, 1);
        let _ = srv.receive(&new).unwrap();
        assert_eq!(
            srv.receive(&old),
            None,
            "an old request is never executed again"
        );
        assert_eq!(srv.executions[&0], 1);
    }

    #[test]
    fn planted_no_dedup_executes_duplicates_again() {
        let mut req = Requester::new(RTO);
        let mut srv = Server::new(true);
        let m = send(&mut req, 1, "a", 0);
        let _ = srv.receive(&m);
        let _ = srv.receive(&m);
        assert_eq!(srv.executions[&0], 2);
    }

    #[test]
    fn truncated_request_payloads_are_refused() {
        assert_eq!(split_request(&[1, 2, 3]), None);
        assert_eq!(split_request(&[1, 0, 0, 0, 9]), Some((1, &[9u8][..])));
    }
}
