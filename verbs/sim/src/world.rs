//! The simulated cluster's state and its discrete-event engine.
//!
//! Everything here runs on one thread, in virtual time. Events are ordered by
//! `(time, sequence number)`, so equal-time events run in the order they were scheduled and
//! a run is a pure function of the configuration and the seed.
//!
//! # The life of a one-sided work request
//!
//! ```text
//!  CN core          CN NIC egress        wire         MN NIC ingress -> engine            MN egress     wire    CN
//!  post: CPU ─► Doorbell ─► serialise ─► latency ─► Arrive ─► queue ─► Execute/WriteLine ─► serialise ─► latency ─► Complete
//!  wr+doorbell  (event)     (packet)                 (event)   per QP,   (event: memory      (response)            (event)
//!  cost                                                        engine    effect happens)
//! ```
//!
//! * READ and WRITE share the responder's READ/WRITE engine (`rw_mops`); CAS and FAA go to the
//!   atomic unit (`atomic_mops`) and are further serialised per 8-byte address
//!   (`same_address_atomic_mops`).
//! * A READ snapshots remote memory at one instant. A WRITE lands one 64-byte line at a time
//!   at the pace the payload crosses the wire, in increasing address order, so a READ served
//!   meanwhile can see a torn image at cache-line granularity (LOTUS §7.1, OOCC §V).
//! * Work requests of one queue pair (one CN core to one MN) execute in order: each starts
//!   after the previous one's memory effects are complete (RC semantics).
//!
//! Simplifications, stated so that a reader can judge the figures: the responder's response
//! is not queued at the requester's ingress link; a failed work request does not move its
//! queue pair to the error state (later work requests still execute).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::task::Waker;

use dmem_verbs::{
    BatchResult, Endpoint, Message, Nanos, NodeId, Op, OpKind, Phase, Port, RKey, ReadBytes,
    RemoteAddr, VerbsError, WorkRequests, WrId, WrOutcome,
};
use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use rustc_hash::FxHashMap;

use crate::queue::EventQueue;
use crate::stats::{LatencyRecorder, NicStats, kind_index};
use crate::{ClusterConfig, MessageFaults, NicProfile};

/// Key of an in-flight post list.
pub(crate) type BatchKey = usize;

/// A task of the executor: slab index and generation.
pub(crate) type TaskKey = (usize, u32);

/// Who waits for a post list to complete.
pub(crate) enum Waiter {
    /// Nobody (not polled yet, or abandoned).
    None,
    /// The executor task that posted it, polled directly by its own waker: completion puts
    /// its key on [`World::task_wakes`], with no `Waker` cloned, woken or dropped.
    Task(TaskKey),
    /// Any other waker (the list's future is polled inside a combinator with wakers of its
    /// own).
    Waker(Waker),
}

/// What a finished list returns: every outcome, or the error of the first failed work request.
pub(crate) type Outcomes = Result<BatchResult, VerbsError>;

/// Something that happens at an instant of virtual time.
pub(crate) enum Event {
    /// A timer expires.
    Timer(Waker),
    /// The requester NIC starts on a post list (CPU costs already paid).
    Doorbell(BatchKey),
    /// A request packet reaches the responder NIC.
    Arrive { batch: BatchKey, wr: u32 },
    /// The responder executes a READ or an atomic.
    Execute { batch: BatchKey, wr: u32 },
    /// Line `line` of a WRITE lands in responder memory.
    WriteLine { batch: BatchKey, wr: u32, line: u32 },
    /// A response (or an error) reaches the requester.
    Complete { batch: BatchKey, wr: u32 },
    /// A node crashes.
    Crash(NodeId),
    /// A two-sided message leaves the sender's NIC.
    SendDoorbell(Box<(Endpoint, Message)>),
    /// A two-sided message reaches the receiver's NIC.
    Deliver(Box<(Endpoint, Message)>),
    /// A two-sided message is handed to its receive queue.
    Enqueue(Box<(Endpoint, Message)>),
}

/// NIC queues of one node. Times are `f64` nanoseconds so that sub-nanosecond service times
/// (a 107 Mops engine serves an op every 9.3 ns) do not accumulate rounding error.
#[derive(Default)]
struct Nic {
    egress_free: f64,
    ingress_free: f64,
    /// When each READ/WRITE processing unit is next free.
    pu_free: Vec<f64>,
    atomic_free: f64,
    /// Per-address serialisation of atomics: when the word may next be touched.
    atomic_address_free: FxHashMap<u64, f64>,
    /// Per source core (= queue pair at this responder): when its last op's effects end.
    qp_done: Vec<f64>,
    stats: NicStats,
}

pub(crate) struct PortQueue {
    pub(crate) messages: VecDeque<Message>,
    pub(crate) waker: Option<Waker>,
}

struct Node {
    /// MN memory; empty for CNs.
    memory: Vec<u8>,
    rkey: RKey,
    is_memory: bool,
    nic: Nic,
    crashed: bool,
    /// Crashes so far (a restarted CN may crash again).
    crashes: u32,
    /// Crash when this many work requests have been posted (the k-th is not posted).
    crash_at_wr: Option<u64>,
    wrs_posted: u64,
    /// Phase marks (work-request index where the phase began, phase), when recorded.
    phase_marks: Vec<(u64, Phase)>,
    /// CNs whose access this MN revoked.
    revoked: BTreeSet<NodeId>,
    next_port: u16,
}

/// A simulated CN core: a thread that runs coroutines.
pub(crate) struct Core {
    pub(crate) node: NodeId,
    /// The core is busy (running a task or paying CPU costs) until then.
    pub(crate) busy_until: Nanos,
    /// Local time of the task being polled on this core.
    pub(crate) local: Nanos,
    pub(crate) cpu_busy_ns: u64,
}

/// An in-flight post list.
pub(crate) struct Batch {
    core: usize,
    node: NodeId,
    posted_at: Nanos,
    /// Inline for a list of one: posting a single op allocates nothing here.
    wrs: WorkRequests,
    /// How many work requests were actually posted (fewer if the node crashed mid-list).
    posted: usize,
    /// How many work requests are signaled (completion-queue entries to poll).
    signaled: usize,
    /// Outcome of each work request (`Written` until it completes), handed to the poster
    /// as it is (inline for a list of one).
    outcomes: BatchResult,
    /// Failed work requests, if any (boxed: rare, and a smaller `Batch` moves faster).
    failure: Option<Box<Failure>>,
    outstanding: usize,
    pub(crate) waiter: Waiter,
    /// The future that posted it was dropped: free the slot when the last response lands.
    pub(crate) abandoned: bool,
    /// The slot holds an in-flight list (false once it is freed for reuse).
    live: bool,
}

/// In-flight post lists by key: a slab whose freed slots are filled again field by field.
/// A `Batch` is ≈180 bytes; `slab::Slab` moves a whole one in at every post and out at every
/// completion (a copy each way), where a list of one READ needs a few fields written and
/// its outcomes taken. A freed slot keeps its last work requests until it is reused.
#[derive(Default)]
struct Batches {
    slots: Vec<Batch>,
    /// Free slots, the last freed on top (reused first, as `slab` does).
    free: Vec<BatchKey>,
}

impl Batches {
    /// Stores a new in-flight list with no outcome yet, no failure and `waiter`.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn insert(
        &mut self,
        core: usize,
        node: NodeId,
        posted_at: Nanos,
        wrs: WorkRequests,
        posted: usize,
        signaled: usize,
        waiter: Waiter,
    ) -> BatchKey {
        let outcomes = BatchResult::written(wrs.len());
        if let Some(key) = self.free.pop() {
            let b = &mut self.slots[key];
            b.core = core;
            b.node = node;
            b.posted_at = posted_at;
            b.wrs = wrs;
            b.posted = posted;
            b.signaled = signaled;
            b.outcomes = outcomes;
            debug_assert!(b.failure.is_none() && matches!(b.waiter, Waiter::None));
            b.waiter = waiter;
            b.outstanding = posted;
            b.abandoned = false;
            b.live = true;
            key
        } else {
            self.slots.push(Batch {
                core,
                node,
                posted_at,
                wrs,
                posted,
                signaled,
                outcomes,
                failure: None,
                outstanding: posted,
                waiter,
                abandoned: false,
                live: true,
            });
            self.slots.len() - 1
        }
    }

    #[inline]
    fn get_mut(&mut self, key: BatchKey) -> Option<&mut Batch> {
        self.slots.get_mut(key).filter(|b| b.live)
    }

    /// Frees slot `key`: its failure and waiter are dropped now, its work requests and
    /// outcomes when the slot is reused.
    #[inline]
    fn remove(&mut self, key: BatchKey) {
        self[key].clear();
        self.free.push(key);
    }
}

impl Batch {
    /// Marks the slot free, dropping its failure and waiter (see [`Batches::remove`]).
    #[inline]
    fn clear(&mut self) {
        self.live = false;
        if self.failure.is_some() {
            self.failure = None;
        }
        if !matches!(self.waiter, Waiter::None) {
            self.waiter = Waiter::None;
        }
    }
}

impl std::ops::Index<BatchKey> for Batches {
    type Output = Batch;

    #[inline]
    fn index(&self, key: BatchKey) -> &Batch {
        let b = &self.slots[key];
        // Keys come only from lists in flight (their events, their futures).
        debug_assert!(b.live, "batch {key} is not in flight");
        b
    }
}

impl std::ops::IndexMut<BatchKey> for Batches {
    #[inline]
    fn index_mut(&mut self, key: BatchKey) -> &mut Batch {
        let b = &mut self.slots[key];
        debug_assert!(b.live, "batch {key} is not in flight");
        b
    }
}

/// The failed work requests of a list.
struct Failure {
    /// The first failed work request (lowest index) and its error.
    first: (usize, VerbsError),
    /// Which work requests failed.
    failed: Vec<bool>,
}

/// The state of the whole simulated cluster.
pub(crate) struct World {
    pub(crate) profile: NicProfile,
    pub(crate) now: Nanos,
    /// Core whose task is being polled, if any.
    pub(crate) polling_core: Option<usize>,
    events: EventQueue<Event>,
    nodes: Vec<Node>,
    pub(crate) cores: Vec<Core>,
    batches: Batches,
    pub(crate) ports: HashMap<Endpoint, PortQueue>,
    rng: Xoshiro256PlusPlus,
    /// Precomputed cost-model figures.
    costs: Costs,
    /// Jitter of service and wire times (`NicProfile::jitter`) and its own random stream.
    jitter: Jitter,
    faults: MessageFaults,
    digest: u64,
    pub(crate) events_processed: u64,
    pub(crate) latency: LatencyRecorder,
    /// Nodes that crashed since the executor last looked (it drops their tasks).
    pub(crate) newly_crashed: Vec<NodeId>,
    /// Tasks woken by the completion of a list they wait for ([`Waiter::Task`]), in wake
    /// order; the executor drains them like the wakes of its wakers.
    pub(crate) task_wakes: Vec<TaskKey>,
    /// Whether [`mark_phase`](Self::mark_phase) records (off by default: benchmarks would
    /// grow a list per transaction).
    pub(crate) record_phases: bool,
}

/// Folds a word into the run digest. The mixing (rotate, xor, multiply by an odd constant,
/// as FxHash does) is spelled out here because the digest must be stable across toolchains
/// and platforms, which `std`'s hashers do not promise.
fn fold(digest: u64, word: u64) -> u64 {
    (digest.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95)
}

const DIGEST_SEED: u64 = 0xcbf2_9ce4_8422_2325;

/// Folds bytes into a digest as little-endian 8-byte words, the last one zero-padded.
fn digest_bytes(bytes: &[u8]) -> u64 {
    let words = bytes.chunks_exact(8);
    let tail = words.remainder();
    let mut h = words.fold(DIGEST_SEED, |h, word| {
        fold(h, u64::from_le_bytes(word.try_into().expect("8 bytes")))
    });
    if !tail.is_empty() {
        let mut word = [0u8; 8];
        word[..tail.len()].copy_from_slice(tail);
        h = fold(h, u64::from_le_bytes(word));
    }
    h
}

impl World {
    pub(crate) fn new(config: &ClusterConfig) -> Self {
        let total = usize::from(config.mns) + usize::from(config.cns);
        let mut nodes = Vec::with_capacity(total);
        for i in 0..total {
            let is_memory = i < usize::from(config.mns);
            nodes.push(Node {
                memory: if is_memory {
                    vec![0; config.mn_memory_bytes as usize]
                } else {
                    Vec::new()
                },
                // Distinct, non-trivial keys so that a key used at the wrong node is caught.
                rkey: RKey(0x5eed_0000 | i as u32),
                is_memory,
                nic: Nic {
                    pu_free: vec![0.0; config.profile.processing_units as usize],
                    qp_done: vec![
                        0.0;
                        usize::from(config.cns) * usize::from(config.threads_per_cn)
                    ],
                    ..Nic::default()
                },
                crashed: false,
                crashes: 0,
                crash_at_wr: None,
                wrs_posted: 0,
                phase_marks: Vec::new(),
                revoked: BTreeSet::new(),
                next_port: 1,
            });
        }
        let mut cores = Vec::new();
        for cn in 0..config.cns {
            for _ in 0..config.threads_per_cn {
                cores.push(Core {
                    node: NodeId(config.mns + cn),
                    busy_until: 0,
                    local: 0,
                    cpu_busy_ns: 0,
                });
            }
        }
        Self {
            profile: config.profile.clone(),
            now: 0,
            polling_core: None,
            events: EventQueue::new(),
            nodes,
            cores,
            batches: Batches::default(),
            ports: HashMap::new(),
            rng: Xoshiro256PlusPlus::seed_from_u64(config.seed),
            costs: Costs::new(&config.profile),
            jitter: Jitter {
                j: config.profile.jitter,
                // A stream of its own: turning jitter on moves no message-fault draw.
                rng: Xoshiro256PlusPlus::seed_from_u64(config.seed ^ 0x6a17_7e55_0f5e_ed00),
            },
            faults: config.message_faults,
            digest: DIGEST_SEED,
            events_processed: 0,
            latency: LatencyRecorder::new(),
            newly_crashed: Vec::new(),
            task_wakes: Vec::new(),
            record_phases: false,
        }
    }

    pub(crate) fn digest(&self) -> u64 {
        self.digest
    }

    pub(crate) fn schedule(&mut self, time: Nanos, event: Event) {
        self.events.push(time, event);
    }

    pub(crate) fn next_event_time(&mut self) -> Option<Nanos> {
        self.events.peek_time()
    }

    pub(crate) fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub(crate) fn is_memory(&self, node: NodeId) -> bool {
        self.nodes[usize::from(node.0)].is_memory
    }

    pub(crate) fn rkey(&self, node: NodeId) -> RKey {
        self.nodes[usize::from(node.0)].rkey
    }

    pub(crate) fn memory(&self, node: NodeId) -> &[u8] {
        &self.nodes[usize::from(node.0)].memory
    }

    pub(crate) fn memory_mut(&mut self, node: NodeId) -> &mut [u8] {
        &mut self.nodes[usize::from(node.0)].memory
    }

    #[inline]
    pub(crate) fn is_crashed(&self, node: NodeId) -> bool {
        self.nodes[usize::from(node.0)].crashed
    }

    pub(crate) fn crashes(&self, node: NodeId) -> u32 {
        self.nodes[usize::from(node.0)].crashes
    }

    pub(crate) fn nic_stats(&self, node: NodeId) -> &NicStats {
        &self.nodes[usize::from(node.0)].nic.stats
    }

    /// Records that `node` begins phase `phase` at its next work request, if phase
    /// recording is on.
    pub(crate) fn mark_phase(&mut self, node: NodeId, phase: Phase) {
        if self.record_phases {
            let n = &mut self.nodes[usize::from(node.0)];
            n.phase_marks.push((n.wrs_posted, phase));
        }
    }

    pub(crate) fn phase_marks(&self, node: NodeId) -> &[(u64, Phase)] {
        &self.nodes[usize::from(node.0)].phase_marks
    }

    pub(crate) fn set_crash_at_wr(&mut self, node: NodeId, k: u64) {
        self.nodes[usize::from(node.0)].crash_at_wr = Some(k);
    }

    pub(crate) fn revoke(&mut self, mn: NodeId, cn: NodeId) {
        self.nodes[usize::from(mn.0)].revoked.insert(cn);
    }

    pub(crate) fn restore(&mut self, mn: NodeId, cn: NodeId) {
        self.nodes[usize::from(mn.0)].revoked.remove(&cn);
    }

    pub(crate) fn allocate_port(&mut self, node: NodeId) -> Endpoint {
        let n = &mut self.nodes[usize::from(node.0)];
        let port = Port(n.next_port);
        n.next_port += 1;
        let endpoint = Endpoint { node, port };
        self.ports.insert(
            endpoint,
            PortQueue {
                messages: VecDeque::new(),
                waker: None,
            },
        );
        endpoint
    }

    /// Charges `ns` of CPU to the core being polled (or to `core`).
    pub(crate) fn charge(&mut self, core: usize, ns: Nanos) {
        let c = &mut self.cores[core];
        c.local += ns;
        c.cpu_busy_ns += ns;
    }

    /// The time as seen by code running on `core`.
    #[inline]
    pub(crate) fn time_on(&self, core: usize) -> Nanos {
        if self.polling_core == Some(core) {
            self.cores[core].local
        } else {
            self.now
        }
    }

    /// Brings a crashed CN back (see `Sim::restart`): not crashed, no planned crash, and
    /// the messages its old ports had queued are gone with its memory. False if `node` is
    /// not a crashed CN or its tasks have not been dropped yet.
    pub(crate) fn restart(&mut self, node: NodeId) -> bool {
        let Some(n) = self.nodes.get_mut(usize::from(node.0)) else {
            return false;
        };
        if n.is_memory || !n.crashed || self.newly_crashed.contains(&node) {
            return false;
        }
        n.crashed = false;
        n.crash_at_wr = None;
        for (at, q) in &mut self.ports {
            if at.node == node {
                q.messages.clear();
                q.waker = None;
            }
        }
        true
    }

    pub(crate) fn crash(&mut self, node: NodeId) {
        let n = &mut self.nodes[usize::from(node.0)];
        if !n.crashed {
            n.crashed = true;
            n.crashes += 1;
            self.newly_crashed.push(node);
        }
    }

    // ---------------------------------------------------------------- posting

    /// Posts a checked list from `core` for `waiter`: pays the CPU cost, applies a planned
    /// crash, and schedules the doorbell. Returns the batch key. Inlined into the post
    /// future, so that the work requests are moved into their slot once.
    #[inline]
    pub(crate) fn post(&mut self, core: usize, wrs: WorkRequests, waiter: Waiter) -> BatchKey {
        // The core and the slot are looked up once each (`charge` and `batch_mut` would
        // look them up again).
        let c = &mut self.cores[core];
        let node = c.node;
        let n = &mut self.nodes[usize::from(node.0)];
        let mut posted = wrs.len();
        if let Some(k) = n.crash_at_wr {
            let room = k.saturating_sub(n.wrs_posted) as usize;
            if room < posted {
                posted = room;
            }
        }
        n.wrs_posted += posted as u64;
        let crash_now = posted < wrs.len();
        // One doorbell per destination queue pair: distinct destinations, counted without
        // allocating (lists are short); a list of one needs no count.
        let (doorbells, signaled) = if wrs.len() == 1 {
            (posted as u64, usize::from(wrs[0].signaled))
        } else {
            let doorbells = (0..posted)
                .filter(|&i| {
                    let node = wrs[i].op.addr().node;
                    wrs[..i].iter().all(|w| w.op.addr().node != node)
                })
                .count() as u64;
            (doorbells, wrs.iter().filter(|w| w.signaled).count())
        };
        n.nic.stats.wrs_posted += posted as u64;
        n.nic.stats.doorbells += doorbells;
        let cost =
            posted as u64 * self.profile.wr_cpu_ns + doorbells * self.profile.doorbell_cpu_ns;
        // What `charge` does.
        c.local += cost;
        c.cpu_busy_ns += cost;
        let at = c.local;
        let key = self
            .batches
            .insert(core, node, at, wrs, posted, signaled, waiter);
        if posted > 0 {
            // The queue's own (inlined) push: `schedule` is a call, with the event in memory.
            self.events.push(at, Event::Doorbell(key));
        }
        if crash_now {
            self.crash(node);
        }
        key
    }

    /// If batch `key` is complete, removes it and returns its outcomes.
    pub(crate) fn take_if_done(&mut self, key: BatchKey) -> Option<(usize, Outcomes)> {
        // The slot through its field, so that it is freed below without a second lookup.
        let b = &mut self.batches.slots[key];
        debug_assert!(b.live, "batch {key} is not in flight");
        if b.outstanding > 0 || b.posted < b.wrs.len() {
            return None;
        }
        let cqes = b.signaled;
        let outcomes = match b.failure.take() {
            Some(failure) => Err(failure.first.1),
            // The slot's next list sets its own outcomes; an empty result costs nothing to
            // leave in its place.
            None => Ok(std::mem::take(&mut b.outcomes)),
        };
        // What `Batches::remove` does.
        b.clear();
        self.batches.free.push(key);
        Some((cqes, outcomes))
    }

    pub(crate) fn batch_mut(&mut self, key: BatchKey) -> &mut Batch {
        &mut self.batches[key]
    }

    /// The future of batch `key` was dropped.
    pub(crate) fn abandon(&mut self, key: BatchKey) {
        if let Some(b) = self.batches.get_mut(key) {
            if b.outstanding == 0 {
                self.batches.remove(key);
            } else {
                b.abandoned = true;
                b.waiter = Waiter::None;
            }
        }
    }

    // ---------------------------------------------------------------- messages

    pub(crate) fn send(&mut self, core: usize, from: Endpoint, to: Endpoint, payload: Vec<u8>) {
        let cost = self.profile.wr_cpu_ns + self.profile.doorbell_cpu_ns;
        self.charge(core, cost);
        let at = self.cores[core].local;
        self.schedule(
            at,
            Event::SendDoorbell(Box::new((to, Message { from, payload }))),
        );
    }

    /// Sends several messages with one doorbell: a work request each, one MMIO write for
    /// all (doorbell batching of a UD queue pair, as eRPC and FaSST do; eRPC NSDI'19 §4.1,
    /// FaSST OSDI'16 §3.3). The messages leave in order.
    pub(crate) fn send_batch(
        &mut self,
        core: usize,
        from: Endpoint,
        messages: Vec<(Endpoint, Vec<u8>)>,
    ) {
        if messages.is_empty() {
            return;
        }
        let cost = self.profile.wr_cpu_ns * messages.len() as u64 + self.profile.doorbell_cpu_ns;
        self.charge(core, cost);
        let at = self.cores[core].local;
        for (to, payload) in messages {
            self.schedule(
                at,
                Event::SendDoorbell(Box::new((to, Message { from, payload }))),
            );
        }
    }

    fn random_unit(&mut self) -> f64 {
        // 53 random bits as a float in [0, 1).
        (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    // ---------------------------------------------------------------- events

    /// Pops and handles the next event. Returns `false` when there is none.
    pub(crate) fn step(&mut self) -> bool {
        let Some((time, event)) = self.events.pop() else {
            return false;
        };
        self.now = self.now.max(time);
        self.events_processed += 1;
        match event {
            Event::Timer(waker) => waker.wake(),
            Event::Doorbell(batch) => self.on_doorbell(batch),
            Event::Arrive { batch, wr } => self.on_arrive(batch, wr as usize),
            Event::Execute { batch, wr } => self.on_execute(batch, wr as usize),
            Event::WriteLine { batch, wr, line } => {
                self.on_write_line(batch, wr as usize, line as usize)
            }
            Event::Complete { batch, wr } => self.on_complete(batch, wr as usize),
            Event::Crash(node) => self.crash(node),
            Event::SendDoorbell(m) => self.on_send_doorbell(m),
            Event::Deliver(m) => self.on_deliver(m),
            Event::Enqueue(m) => self.on_enqueue(*m),
        }
        true
    }

    fn request_bytes(op: &Op) -> u64 {
        match op {
            Op::Read { .. } => 0,
            Op::Write { data, .. } => data.len() as u64,
            Op::Cas { .. } => 16,
            Op::Faa { .. } => 8,
        }
    }

    fn on_doorbell(&mut self, key: BatchKey) {
        let now = self.now as f64;
        let profile = &self.profile;
        let costs = &self.costs;
        let b = &self.batches[key];
        let node = usize::from(b.node.0);
        let nic = &mut self.nodes[node].nic;
        let events = &mut self.events;
        let jitter = &mut self.jitter;
        for (i, wr) in b.wrs[..b.posted].iter().enumerate() {
            let bytes = Self::request_bytes(&wr.op);
            let fetch = match &wr.op {
                Op::Write { data, .. } if data.len() > profile.inline_threshold as usize => {
                    profile.payload_fetch_ns as f64
                }
                _ => 0.0,
            };
            let wire = costs.wire_ns(profile, bytes);
            let start = (now + fetch).max(nic.egress_free);
            nic.egress_free = start + wire;
            nic.stats.egress_busy_ns += wire;
            nic.stats.bytes_out += bytes + u64::from(profile.header_bytes);
            let arrive = nic.egress_free + jitter.scale(profile.one_way_latency_ns as f64);
            let wr = i as u32;
            events.push(ceil_ns(arrive), Event::Arrive { batch: key, wr });
        }
    }

    /// Sends the response of work request `wr` from responder `responder` at `at`,
    /// scheduling its completion at the requester.
    fn respond(&mut self, responder: usize, key: BatchKey, wr: usize, at: f64, bytes: u64) {
        let profile = &self.profile;
        let costs = &self.costs;
        let wire = costs.wire_ns(profile, bytes);
        let nic = &mut self.nodes[responder].nic;
        let start = at.max(nic.egress_free);
        nic.egress_free = start + wire;
        nic.stats.egress_busy_ns += wire;
        nic.stats.bytes_out += bytes + u64::from(profile.header_bytes);
        let arrive = nic.egress_free + self.jitter.scale(profile.one_way_latency_ns as f64);
        // The queue's own (inlined) push, as in `post`.
        self.events.push(
            ceil_ns(arrive),
            Event::Complete {
                batch: key,
                wr: wr as u32,
            },
        );
    }

    fn fail(&mut self, key: BatchKey, wr: usize, error: VerbsError, at: Nanos) {
        let b = &mut self.batches[key];
        match &mut b.failure {
            None => {
                let mut failed = vec![false; b.wrs.len()];
                failed[wr] = true;
                b.failure = Some(Box::new(Failure {
                    first: (wr, error),
                    failed,
                }));
            }
            Some(failure) => {
                if wr < failure.first.0 {
                    failure.first = (wr, error);
                }
                failure.failed[wr] = true;
            }
        }
        self.schedule(
            at,
            Event::Complete {
                batch: key,
                wr: wr as u32,
            },
        );
    }

    fn on_arrive(&mut self, key: BatchKey, wr: usize) {
        let b = &self.batches[key];
        let (source_core, source_node) = (b.core, b.node);
        let op = &b.wrs[wr].op;
        let (kind, addr, len, in_bytes) = (
            op.kind(),
            op.addr(),
            op.remote_len(),
            Self::request_bytes(op),
        );
        let profile = &self.profile;
        let costs = &self.costs;
        let dst = usize::from(addr.node.0);
        if dst >= self.nodes.len() || self.nodes[dst].crashed || !self.nodes[dst].is_memory {
            let at = self.now + profile.transport_timeout_ns;
            self.fail(key, wr, VerbsError::ConnectionLost { node: addr.node }, at);
            return;
        }
        let now = self.now as f64;
        let node = &mut self.nodes[dst];
        let wire = costs.wire_ns(profile, in_bytes);
        let ready = now.max(node.nic.ingress_free + wire);
        node.nic.ingress_free = ready;
        node.nic.stats.ingress_busy_ns += wire;
        node.nic.stats.bytes_in += in_bytes + u64::from(profile.header_bytes);

        let in_bounds = addr
            .offset
            .checked_add(len)
            .is_some_and(|end| end <= node.memory.len() as u64);
        if addr.rkey != node.rkey || !in_bounds || node.revoked.contains(&source_node) {
            // NAK: the responder answers at once, without touching memory.
            let at = ready + profile.one_way_latency_ns as f64;
            self.fail(
                key,
                wr,
                VerbsError::RemoteAccess { index: wr, addr },
                ceil_ns(at),
            );
            return;
        }

        let qp_ready = node.nic.qp_done[source_core];
        let earliest = ready.max(qp_ready);
        let events = &mut self.events;
        let now_ns = self.now;
        // One factor per op for all of its service times.
        let factor = self.jitter.factor();
        let mut inline = None;
        // When a READ or an atomic executes (a WRITE schedules its lines itself).
        let mut execute_at = None;
        match kind {
            OpKind::Read | OpKind::Write => {
                // The processing unit that frees first (lowest index on ties: deterministic).
                let (pu, free) = node.nic.pu_free.iter().copied().enumerate().fold(
                    (0, f64::INFINITY),
                    |best, (i, f)| if f < best.1 { (i, f) } else { best },
                );
                let start = earliest.max(free);
                let service = costs.pu_service * factor;
                node.nic.pu_free[pu] = start + service;
                if kind == OpKind::Write {
                    // The payload lands one line at a time, spread over the service time.
                    let lines = lines_touched(addr.offset, len);
                    let line_ns = service / lines as f64;
                    node.nic.qp_done[source_core] = start + (lines - 1) as f64 * line_ns;
                    for line in 0..lines {
                        let at = ceil_ns(start + line as f64 * line_ns);
                        if line == 0 && at == now_ns {
                            inline = Some(Inline::FirstLine);
                            continue;
                        }
                        events.push(
                            at,
                            Event::WriteLine {
                                batch: key,
                                wr: wr as u32,
                                line: line as u32,
                            },
                        );
                    }
                } else {
                    node.nic.qp_done[source_core] = start;
                    execute_at = Some(start);
                }
            }
            OpKind::Cas | OpKind::Faa => {
                // One hash lookup for reading and updating the word's free time.
                let address_free = node
                    .nic
                    .atomic_address_free
                    .entry(addr.offset)
                    .or_insert(0.0);
                let start = earliest.max(node.nic.atomic_free).max(*address_free);
                node.nic.atomic_free = start + costs.atomic_busy * factor;
                *address_free = start + costs.same_address_gap * factor;
                node.nic.qp_done[source_core] = start;
                if node.nic.atomic_address_free.len() > 1 << 16 {
                    // Entries in the past constrain nothing; drop them to bound memory.
                    node.nic.atomic_address_free.retain(|_, free| *free > now);
                }
                execute_at = Some(start);
            }
        }
        if let Some(start) = execute_at {
            let at = ceil_ns(start);
            if at == now_ns {
                inline = Some(Inline::Execute);
            } else {
                let wr = wr as u32;
                events.push(at, Event::Execute { batch: key, wr });
            }
        }
        // An op whose service starts now runs at once instead of through the event queue:
        // the same virtual instant, one event fewer (most ops on an idle NIC).
        match inline {
            // The MN was found up at this same instant (above) and `op` is still borrowed
            // from the list: no crash check and no lookup again.
            Some(Inline::Execute) => {
                if let Some(action) = Action::of(op) {
                    self.execute(key, wr, kind, addr, action);
                }
            }
            Some(Inline::FirstLine) => self.on_write_line(key, wr, 0),
            None => {}
        }
    }

    /// Counts an op as served when its memory effect happens, so that a backlog queued at
    /// the end of a run is not counted as work done.
    fn count_served(&mut self, responder: usize, kind: OpKind) {
        let service = if kind.is_atomic() {
            self.costs.atomic_busy
        } else {
            self.costs.rw_busy
        };
        let stats = &mut self.nodes[responder].nic.stats;
        stats.ops_served[kind_index(kind)] += 1;
        if kind.is_atomic() {
            stats.atomic_busy_ns += service;
        } else {
            stats.rw_busy_ns += service;
        }
    }

    /// Out of line: inlined into the event loop, it made a saturated MN's executions (lists
    /// of 16 READs) dearer.
    #[inline(never)]
    fn on_execute(&mut self, key: BatchKey, wr: usize) {
        let op = &self.batches[key].wrs[wr].op;
        let (kind, addr) = (op.kind(), op.addr());
        let action = Action::of(op).expect("WRITEs land through WriteLine events");
        let dst = usize::from(addr.node.0);
        if self.nodes[dst].crashed {
            let at = self.now + self.profile.transport_timeout_ns;
            self.fail(key, wr, VerbsError::ConnectionLost { node: addr.node }, at);
            return;
        }
        self.execute(key, wr, kind, addr, action);
    }

    /// The memory effect of READ or atomic `wr` of list `key` (`kind` at `addr`, an MN that
    /// is up), its outcome and its response.
    #[inline(always)]
    fn execute(
        &mut self,
        key: BatchKey,
        wr: usize,
        kind: OpKind,
        addr: RemoteAddr,
        action: Action,
    ) {
        let dst = usize::from(addr.node.0);
        let offset = addr.offset as usize;
        let memory = &mut self.nodes[dst].memory;
        let outcome = match action {
            Action::Read(len) => {
                WrOutcome::Bytes(ReadBytes::from_slice(&memory[offset..offset + len]))
            }
            Action::Cas(expect, swap) => {
                let word = &mut memory[offset..offset + 8];
                let old = u64::from_le_bytes(word.try_into().expect("8-byte word"));
                if old == expect {
                    word.copy_from_slice(&swap.to_le_bytes());
                }
                WrOutcome::Atomic(old)
            }
            Action::Faa(add) => {
                let word = &mut memory[offset..offset + 8];
                let old = u64::from_le_bytes(word.try_into().expect("8-byte word"));
                word.copy_from_slice(&old.wrapping_add(add).to_le_bytes());
                WrOutcome::Atomic(old)
            }
        };
        let bytes = match action {
            Action::Read(len) => len as u64,
            Action::Cas(..) | Action::Faa(_) => 8,
        };
        self.count_served(dst, kind);
        self.batches[key].outcomes.set(WrId(wr), outcome);
        let now = self.now as f64;
        self.respond(dst, key, wr, now, bytes);
    }

    fn on_write_line(&mut self, key: BatchKey, wr: usize, line: usize) {
        let (addr, last) = {
            let Op::Write { addr, data } = &self.batches[key].wrs[wr].op else {
                unreachable!("WriteLine for a non-WRITE");
            };
            let lines = lines_touched(addr.offset, data.len() as u64);
            (*addr, line + 1 == lines)
        };
        let dst = usize::from(addr.node.0);
        if self.nodes[dst].crashed {
            // The rest of the WRITE is lost with the node; report once, on the last line.
            if last {
                let at = self.now + self.profile.transport_timeout_ns;
                self.fail(key, wr, VerbsError::ConnectionLost { node: addr.node }, at);
            }
            return;
        }
        {
            let Op::Write { data, .. } = &self.batches[key].wrs[wr].op else {
                unreachable!("checked above");
            };
            let start = addr.offset as usize;
            let end = start + data.len();
            let line_start = (start & !63) + line * 64;
            let from = line_start.max(start);
            let to = (line_start + 64).min(end);
            self.nodes[dst].memory[from..to].copy_from_slice(&data[from - start..to - start]);
        }
        if last {
            self.count_served(dst, OpKind::Write);

            let now = self.now as f64;
            self.respond(dst, key, wr, now, 0);
        }
    }

    fn on_complete(&mut self, key: BatchKey, wr: usize) {
        let now = self.now;
        let b = &mut self.batches[key];
        b.outstanding -= 1;
        let node = usize::from(b.node.0);
        let kind = b.wrs[wr].op.kind();
        let latency = now.saturating_sub(b.posted_at).max(1);
        let failed = b.failure.as_ref().is_some_and(|f| f.failed[wr]);
        let outcome_word = match b.outcomes.outcome(WrId(wr)) {
            _ if failed => 2,
            WrOutcome::Atomic(v) => *v,
            WrOutcome::Bytes(bytes) => digest_bytes(bytes),
            WrOutcome::Written => 1,
        };
        let signaled = b.wrs[wr].signaled || failed;
        let done = b.outstanding == 0;
        let abandoned = b.abandoned;
        let waiter = if done {
            std::mem::replace(&mut b.waiter, Waiter::None)
        } else {
            Waiter::None
        };
        let core = b.core;
        if signaled {
            self.nodes[node].nic.stats.cqes += 1;
        }
        // Out-of-range values saturate at the histogram's bound (100 s); nothing is lost.
        self.latency.record(kind_index(kind), latency);
        for word in [
            now,
            core as u64,
            wr as u64,
            kind_index(kind) as u64,
            outcome_word,
        ] {
            self.digest = fold(self.digest, word);
        }
        if done {
            if abandoned {
                self.batches.remove(key);
            } else {
                match waiter {
                    Waiter::Task(task) => self.task_wakes.push(task),
                    Waiter::Waker(w) => w.wake(),
                    Waiter::None => {}
                }
            }
        }
    }

    fn on_send_doorbell(&mut self, message: Box<(Endpoint, Message)>) {
        let msg = &message.1;
        let from = usize::from(msg.from.node.0);
        let profile = &self.profile;
        let costs = &self.costs;
        let bytes = msg.payload.len() as u64;
        let fetch = if msg.payload.len() > profile.inline_threshold as usize {
            profile.payload_fetch_ns as f64
        } else {
            0.0
        };
        let wire = costs.wire_ns(profile, bytes);
        let nic = &mut self.nodes[from].nic;
        let start = (self.now as f64 + fetch).max(nic.egress_free);
        nic.egress_free = start + wire;
        nic.stats.egress_busy_ns += wire;
        nic.stats.bytes_out += bytes + u64::from(profile.header_bytes);
        nic.stats.messages_sent += 1;
        let mut arrive = nic.egress_free + self.jitter.scale(profile.one_way_latency_ns as f64);
        let faults = self.faults;
        if faults.loss > 0.0 && self.random_unit() < faults.loss {
            self.nodes[from].nic.stats.messages_dropped += 1;
            return;
        }
        if faults.delay > 0.0 && self.random_unit() < faults.delay {
            arrive += faults.delay_ns as f64;
        }
        let duplicate = faults.duplicate > 0.0 && self.random_unit() < faults.duplicate;
        if duplicate {
            self.schedule(ceil_ns(arrive), Event::Deliver(message.clone()));
        }
        self.schedule(ceil_ns(arrive), Event::Deliver(message));
    }

    fn on_deliver(&mut self, message: Box<(Endpoint, Message)>) {
        let (to, msg) = (message.0, &message.1);
        let dst = usize::from(to.node.0);
        if dst >= self.nodes.len() || self.nodes[dst].crashed || !self.ports.contains_key(&to) {
            if let Some(n) = self.nodes.get_mut(usize::from(msg.from.node.0)) {
                n.nic.stats.messages_dropped += 1;
            }
            return;
        }
        let profile = &self.profile;
        let costs = &self.costs;
        let wire = costs.wire_ns(profile, msg.payload.len() as u64);
        let nic = &mut self.nodes[dst].nic;
        let ready = (self.now as f64).max(nic.ingress_free + wire);
        nic.ingress_free = ready;
        nic.stats.ingress_busy_ns += wire;
        nic.stats.bytes_in += msg.payload.len() as u64 + u64::from(profile.header_bytes);
        let ready = ceil_ns(ready);
        if ready > self.now {
            self.schedule(ready, Event::Enqueue(message));
        } else {
            self.on_enqueue(*message);
        }
    }

    fn on_enqueue(&mut self, (to, msg): (Endpoint, Message)) {
        let dst = usize::from(to.node.0);
        if self.nodes[dst].crashed {
            return;
        }
        self.nodes[dst].nic.stats.messages_received += 1;
        self.digest = fold(self.digest, self.now);
        self.digest = fold(
            self.digest,
            u64::from(to.port.0) << 16 | u64::from(to.node.0),
        );
        if let Some(q) = self.ports.get_mut(&to) {
            q.messages.push_back(msg);
            if let Some(w) = q.waker.take() {
                w.wake();
            }
        }
    }
}

/// Wire times of small payloads, computed once by [`NicProfile::wire_ns`] itself (so the
/// figures are bit-identical to calling it), and the per-op service constants.
struct Costs {
    /// `wire_ns(payload)` for payloads of `0..WIRE_TABLE` bytes.
    wire: Box<[f64]>,
    /// What one served READ/WRITE adds to the engine's busy time.
    rw_busy: f64,
    /// What one served atomic adds to the atomic unit's busy time, and the time the atomic
    /// unit spends on it.
    atomic_busy: f64,
    /// Time one processing unit spends on a READ or WRITE (`NicProfile::pu_service_ns`).
    pu_service: f64,
    /// Gap between atomics on one word (`NicProfile::same_address_gap_ns`).
    same_address_gap: f64,
}

/// Payload sizes whose wire time [`Costs`] keeps (every READ request, atomic and small
/// WRITE or READ response).
const WIRE_TABLE: usize = 257;

impl Costs {
    fn new(profile: &NicProfile) -> Self {
        Self {
            wire: (0..WIRE_TABLE as u64).map(|b| profile.wire_ns(b)).collect(),
            rw_busy: profile.pu_service_ns() / f64::from(profile.processing_units),
            atomic_busy: profile.atomic_service_ns(),
            pu_service: profile.pu_service_ns(),
            same_address_gap: profile.same_address_gap_ns(),
        }
    }

    /// `profile.wire_ns(payload)`, from the table when it is small.
    #[inline]
    fn wire_ns(&self, profile: &NicProfile, payload: u64) -> f64 {
        match self.wire.get(payload as usize) {
            Some(&ns) => ns,
            None => profile.wire_ns(payload),
        }
    }
}

/// Multiplicative jitter of service and wire times ([`NicProfile::jitter`]).
struct Jitter {
    j: f64,
    rng: Xoshiro256PlusPlus,
}

impl Jitter {
    /// A factor uniform in `[1 - j, 1 + j]`; exactly 1 (and no draw) when jitter is off.
    #[inline]
    fn factor(&mut self) -> f64 {
        if self.j == 0.0 {
            return 1.0;
        }
        let unit = (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        1.0 - self.j + 2.0 * self.j * unit
    }

    /// `ns` times a fresh factor.
    #[inline]
    fn scale(&mut self, ns: f64) -> f64 {
        if self.j == 0.0 {
            ns
        } else {
            ns * self.factor()
        }
    }
}

/// Work an arriving op does at once because its service starts at the current instant.
#[derive(Clone, Copy)]
enum Inline {
    Execute,
    FirstLine,
}

/// What an executing READ or atomic does, copied out of its work request.
#[derive(Clone, Copy)]
enum Action {
    Read(usize),
    Cas(u64, u64),
    Faa(u64),
}

impl Action {
    /// The action of `op`, if it executes (a WRITE lands line by line instead).
    #[inline]
    fn of(op: &Op) -> Option<Self> {
        match *op {
            Op::Read { len, .. } => Some(Action::Read(len as usize)),
            Op::Cas { expect, swap, .. } => Some(Action::Cas(expect, swap)),
            Op::Faa { add, .. } => Some(Action::Faa(add)),
            Op::Write { .. } => None,
        }
    }
}

/// `x.ceil() as Nanos`, bit for bit, without `f64::ceil`: the x86-64 baseline has no
/// rounding instruction, so `ceil` is a call into a software routine (≈20 instructions,
/// three to five times per work request). Truncate, then add one if something was cut off;
/// NaN, negative and too-large inputs give what the saturating `as` cast of `ceil` gives.
///
/// Times below 2^63 ns (all of them in practice) take the signed conversions, one
/// instruction each way; `u64`'s saturating conversions cost a dozen.
#[inline]
fn ceil_ns(x: f64) -> Nanos {
    // 2^63 as an `f64` (exact).
    const SIGNED_LIMIT: f64 = 9_223_372_036_854_775_808.0;
    if (0.0..SIGNED_LIMIT).contains(&x) {
        // In range: truncation toward zero is the same in `i64` and `u64`, and every value
        // below 2^63 converts back to the same `f64` either way.
        let t = x as i64;
        return if (t as f64) < x {
            t as Nanos + 1
        } else {
            t as Nanos
        };
    }
    let t = x as Nanos;
    if (t as f64) < x {
        t.saturating_add(1)
    } else {
        t
    }
}

/// Number of 64-byte lines that `len` bytes at `offset` touch.
pub(crate) fn lines_touched(offset: u64, len: u64) -> usize {
    if len == 0 {
        return 1;
    }
    let first = offset / 64;
    let last = (offset + len - 1) / 64;
    (last - first + 1) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines() {
        assert_eq!(lines_touched(0, 64), 1);
        assert_eq!(lines_touched(0, 65), 2);
        assert_eq!(lines_touched(60, 8), 2);
        assert_eq!(lines_touched(0, 256), 4);
        assert_eq!(lines_touched(128, 0), 1);
    }

    #[test]
    fn digest_bytes_folds_zero_padded_words() {
        for len in [0usize, 1, 7, 8, 9, 64, 70] {
            let bytes: Vec<u8> = (0..len as u8).map(|b| b.wrapping_mul(37)).collect();
            let by_chunks = bytes.chunks(8).fold(DIGEST_SEED, |h, chunk| {
                let mut word = [0u8; 8];
                word[..chunk.len()].copy_from_slice(chunk);
                fold(h, u64::from_le_bytes(word))
            });
            assert_eq!(digest_bytes(&bytes), by_chunks, "{len} bytes");
        }
    }

    #[test]
    fn wire_table_matches_the_profile() {
        let profile = NicProfile::cx5();
        let costs = Costs::new(&profile);
        for payload in [0u64, 8, 16, 64, 256, 257, 5000] {
            assert_eq!(
                costs.wire_ns(&profile, payload).to_bits(),
                profile.wire_ns(payload).to_bits()
            );
        }
    }

    #[test]
    fn ceil_ns_is_ceil_then_cast() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut values = vec![
            0.0,
            -0.0,
            0.5,
            1.0,
            -0.5,
            -3.7,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MAX,
            f64::MIN_POSITIVE,
            9_007_199_254_740_993.0,
            // Around 2^63, where the fast path ends, and a fraction just below 2^52.
            f64::from_bits(2f64.powi(63).to_bits() - 1),
            2f64.powi(63),
            f64::from_bits(2f64.powi(63).to_bits() + 1),
            2f64.powi(51) + 0.5,
            18_446_744_073_709_551_615.0,
            1e30,
        ];
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Times as the simulator makes them: nanoseconds with a fraction, up to ~10^12.
            values.push((x % 1_000_000_000_000) as f64 / 7.0);
            values.push(f64::from_bits(x));
        }
        for v in values {
            assert_eq!(ceil_ns(v), v.ceil() as Nanos, "{v:e}");
        }
    }

    #[test]
    fn fold_is_order_sensitive() {
        assert_ne!(fold(fold(DIGEST_SEED, 1), 2), fold(fold(DIGEST_SEED, 2), 1));
    }
}
