//! The simulation executor: tasks on simulated cores, driven in virtual time.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, RawWakerVTable, Wake, Waker};

use dmem_layout::mix::splitmix64;
use dmem_verbs::sync::lock_ignoring_poison;
use dmem_verbs::{
    BatchResult, Clock, Endpoint, MemoryRegion, Message, Nanos, NodeId, OpKind, Phase, PostList,
    Verbs, VerbsError,
};

use crate::stats::{NodeStats, Role, SimStats};
use crate::world::{BatchKey, Event, TaskKey, Waiter, World};
use crate::{ClusterConfig, SimError};

/// A core in the runnable queue: (start time, wake order of its next task, core, version).
type CoreEntry = (Nanos, u64, usize, u64);

/// Wakes a task by queueing its key; the executor drains the queue after every step.
///
/// A `Waker` must be `Send + Sync`, so the queue is an `Arc<Mutex<_>>` rather than an `Rc`:
/// the simulator is single-threaded, the lock is never contended and costs a few ns.
struct TaskWaker {
    key: TaskKey,
    queued: AtomicBool,
    wakes: Arc<WakeQueue>,
}

/// Keys of woken tasks, with a flag that lets the executor skip the lock when empty.
#[derive(Default)]
struct WakeQueue {
    any: AtomicBool,
    keys: Mutex<Vec<TaskKey>>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::Relaxed) {
            lock_ignoring_poison(&self.wakes.keys).push(self.key);
            self.wakes.any.store(true, Ordering::Release);
        }
    }
}

struct TaskSlot {
    future: Option<Pin<Box<dyn Future<Output = ()>>>>,
    core: usize,
    generation: u32,
    waker: Arc<TaskWaker>,
    /// The task's `Waker`, made once: a poll clones the `Rc` (no atomic operation) instead
    /// of making a `Waker` from the `Arc` each time.
    handle: Rc<Waker>,
}

/// The runnable tasks of one core, by (time woken, wake order): the core runs them one at a
/// time, each when the core is free. A task waits only in its own core's queue, so a busy
/// core with many waiting tasks costs O(log n) per task run, not a pass over all of them.
#[derive(Default)]
struct CoreQueue {
    tasks: SortedQueue<(Nanos, u64, TaskKey)>,
    /// Version of this core's live entry in `Shared::runnable`.
    version: u64,
}

/// A queue of unique entries (`(time, wake order, ...)`: the wake order makes them unique)
/// kept sorted, smallest first: the order a binary heap of them would pop. Entries are made
/// at the current time or a core's local time, so most insertions go at the back (one
/// compare) and every removal is at the front, cheaper than a heap's sifting; one that
/// does not belongs where a binary search puts it.
struct SortedQueue<T>(VecDeque<T>);

impl<T> Default for SortedQueue<T> {
    fn default() -> Self {
        Self(VecDeque::new())
    }
}

impl<T: Ord + Copy> SortedQueue<T> {
    /// Always inlined: a call cost as much as the usual push at the back.
    #[inline(always)]
    fn push(&mut self, entry: T) {
        match self.0.back() {
            Some(back) if *back > entry => {
                let i = self.0.partition_point(|e| *e < entry);
                self.0.insert(i, entry);
            }
            _ => self.0.push_back(entry),
        }
    }

    #[inline]
    fn peek(&self) -> Option<&T> {
        self.0.front()
    }

    #[inline]
    fn pop(&mut self) -> Option<T> {
        self.0.pop_front()
    }
}

/// The task being polled and its waker's identity (data and vtable pointers, what
/// `Waker::will_wake` compares): a post list checks its `Context`'s waker against it without
/// looking the task up.
#[derive(Clone, Copy)]
struct PolledTask {
    key: TaskKey,
    waker_data: *const (),
    waker_vtable: *const RawWakerVTable,
}

impl PolledTask {
    /// Whether `waker` is this task's own waker (as `Waker::will_wake` decides).
    #[inline]
    fn owns(&self, waker: &Waker) -> bool {
        waker.data() == self.waker_data && std::ptr::eq(waker.vtable(), self.waker_vtable)
    }
}

struct Shared {
    world: RefCell<World>,
    tasks: RefCell<slab::Slab<TaskSlot>>,
    /// Runnable tasks of each core.
    queues: RefCell<Vec<CoreQueue>>,
    /// Cores with a runnable task, by the time the core can start its next one (then that
    /// task's wake order). One live entry per core; superseded entries are skipped. Sorted
    /// like the cores' queues (it pops what a binary heap of the entries would).
    runnable: RefCell<SortedQueue<CoreEntry>>,
    ready_seq: Cell<u64>,
    wakes: Arc<WakeQueue>,
    woken_buffer: Cell<Vec<TaskKey>>,
    /// The task being polled, if any: a post list it waits for with its own waker records
    /// the task ([`Waiter::Task`]) instead of a clone of the waker.
    polling: Cell<Option<PolledTask>>,
    generation: Cell<u32>,
    contexts: Cell<u64>,
    seed: u64,
    mns: u16,
    cns: u16,
    threads_per_cn: u16,
}

/// A simulated cluster and the executor that runs its CN tasks.
///
/// Not `Send`: a simulation lives on one thread, which is what makes it deterministic.
pub struct Sim {
    shared: Rc<Shared>,
}

impl Sim {
    /// Builds the cluster: zeroed MN memory, idle NICs and cores, time 0.
    ///
    /// # Errors
    /// A [`SimError`] for an invalid configuration.
    pub fn new(config: ClusterConfig) -> Result<Self, SimError> {
        config.validate()?;
        Ok(Self {
            shared: Rc::new(Shared {
                world: RefCell::new(World::new(&config)),
                tasks: RefCell::new(slab::Slab::new()),
                queues: RefCell::new(
                    (0..usize::from(config.cns) * usize::from(config.threads_per_cn))
                        .map(|_| CoreQueue::default())
                        .collect(),
                ),
                runnable: RefCell::new(SortedQueue::default()),
                ready_seq: Cell::new(0),
                wakes: Arc::new(WakeQueue::default()),
                woken_buffer: Cell::new(Vec::new()),
                polling: Cell::new(None),
                generation: Cell::new(0),
                contexts: Cell::new(0),
                seed: config.seed,
                mns: config.mns,
                cns: config.cns,
                threads_per_cn: config.threads_per_cn,
            }),
        })
    }

    /// The `i`-th memory node.
    ///
    /// # Panics
    /// If the cluster has no such MN.
    #[must_use]
    pub fn mn(&self, i: u16) -> NodeId {
        assert!(i < self.shared.mns, "MN {i} does not exist");
        NodeId(i)
    }

    /// The `i`-th compute node.
    ///
    /// # Panics
    /// If the cluster has no such CN.
    #[must_use]
    pub fn cn(&self, i: u16) -> NodeId {
        assert!(i < self.shared.cns, "CN {i} does not exist");
        NodeId(self.shared.mns + i)
    }

    /// Number of MNs.
    #[must_use]
    pub fn mn_count(&self) -> u16 {
        self.shared.mns
    }

    /// Number of CNs.
    #[must_use]
    pub fn cn_count(&self) -> u16 {
        self.shared.cns
    }

    /// The NIC profile every node of the cluster shares.
    #[must_use]
    pub fn profile(&self) -> crate::NicProfile {
        self.shared.world.borrow().profile.clone()
    }

    /// Simulated cores (threads) per CN.
    #[must_use]
    pub fn threads_per_cn(&self) -> u16 {
        self.shared.threads_per_cn
    }

    /// The registered region of memory node `mn`.
    ///
    /// # Panics
    /// If `mn` is not an MN of this cluster.
    #[must_use]
    pub fn region(&self, mn: NodeId) -> MemoryRegion {
        let world = self.shared.world.borrow();
        assert!(
            usize::from(mn.0) < world.node_count() && world.is_memory(mn),
            "{mn} is not a memory node"
        );
        MemoryRegion {
            node: mn,
            rkey: world.rkey(mn),
            len: world.memory(mn).len() as u64,
        }
    }

    /// A new execution context on thread `thread` of compute node `cn`, with its own
    /// messaging endpoint. Tasks spawned with it run on that thread's core.
    ///
    /// # Errors
    /// [`SimError::NotComputeNode`] or [`SimError::NoSuchThread`].
    pub fn context(&self, cn: NodeId, thread: u16) -> Result<SimContext, SimError> {
        let s = &self.shared;
        if cn.0 < s.mns || cn.0 >= s.mns + s.cns {
            return Err(SimError::NotComputeNode(cn.0));
        }
        if thread >= s.threads_per_cn {
            return Err(SimError::NoSuchThread {
                thread,
                threads: s.threads_per_cn,
            });
        }
        let core = usize::from(cn.0 - s.mns) * usize::from(s.threads_per_cn) + usize::from(thread);
        let endpoint = s.world.borrow_mut().allocate_port(cn);
        let n = s.contexts.get() + 1;
        s.contexts.set(n);
        Ok(SimContext {
            shared: Rc::clone(s),
            core,
            endpoint,
            seed: splitmix64(s.seed ^ splitmix64(n)),
            posts: Rc::new(Cell::new(0)),
        })
    }

    /// Runs `future` as a task on the core of `ctx`, starting at the current time.
    pub fn spawn(&self, ctx: &SimContext, future: impl Future<Output = ()> + 'static) {
        spawn_on(&self.shared, ctx.core, Box::pin(future));
    }

    /// Runs until virtual time `deadline` (events and task starts after it stay pending) or
    /// until nothing is left to do, whichever comes first. Returns the time reached.
    pub fn run_until(&self, deadline: Nanos) -> Nanos {
        run(&self.shared, Some(deadline))
    }

    /// Runs for `duration` of virtual time from now.
    pub fn run_for(&self, duration: Nanos) -> Nanos {
        let deadline = self.now().saturating_add(duration);
        self.run_until(deadline)
    }

    /// Runs until no event and no runnable task is left. Returns the time reached.
    ///
    /// Tasks that wait forever (a receive loop, say) do not keep it running; periodic timers
    /// do, so prefer [`run_until`](Self::run_until) with them.
    pub fn run_until_idle(&self) -> Nanos {
        run(&self.shared, None)
    }

    /// Current virtual time.
    #[must_use]
    pub fn now(&self) -> Nanos {
        self.shared.world.borrow().now
    }

    /// Copies `len` bytes of MN memory at `offset` (outside virtual time: for loading and
    /// checking, not for protocols).
    ///
    /// # Panics
    /// If the range is outside the MN's memory.
    #[must_use]
    pub fn read_memory(&self, mn: NodeId, offset: u64, len: usize) -> Vec<u8> {
        let world = self.shared.world.borrow();
        let start = offset as usize;
        world.memory(mn)[start..start + len].to_vec()
    }

    /// Writes MN memory directly (outside virtual time: for loading a data set).
    ///
    /// # Panics
    /// If the range is outside the MN's memory.
    pub fn write_memory(&self, mn: NodeId, offset: u64, bytes: &[u8]) {
        let mut world = self.shared.world.borrow_mut();
        let start = offset as usize;
        world.memory_mut(mn)[start..start + bytes.len()].copy_from_slice(bytes);
    }

    /// Crashes `node` at virtual time `at`: a CN's tasks stop and nothing it has not posted
    /// lands; an MN stops answering (requests to it fail with `ConnectionLost` after the
    /// transport timeout).
    pub fn crash_at(&self, node: NodeId, at: Nanos) {
        self.shared
            .world
            .borrow_mut()
            .schedule(at, Event::Crash(node));
    }

    /// Turns recording of protocol phase marks ([`Verbs::mark_phase`]) on or off.
    pub fn record_phases(&self, on: bool) {
        self.shared.world.borrow_mut().record_phases = on;
    }

    /// The phase marks CN `node` recorded: for each, the index of the first work request of
    /// the phase (the count of work requests posted before it) and its name, in order.
    #[must_use]
    pub fn phase_marks(&self, node: NodeId) -> Vec<(u64, Phase)> {
        self.shared.world.borrow().phase_marks(node).to_vec()
    }

    /// Crashes CN `node` when it posts its `k`-th work request (counting from 0 since the
    /// start): work requests before it land, it and everything after do not — so a prefix
    /// of a post list may land.
    pub fn crash_at_work_request(&self, node: NodeId, k: u64) {
        self.shared.world.borrow_mut().set_crash_at_wr(node, k);
    }

    /// Revokes CN `cn`'s access at MN `mn`: its later one-sided ops there complete with a
    /// remote access error (Pandora §3.2.2, active-link termination).
    pub fn revoke(&self, mn: NodeId, cn: NodeId) {
        self.shared.world.borrow_mut().revoke(mn, cn);
    }

    /// Restores access revoked with [`revoke`](Self::revoke).
    pub fn restore(&self, mn: NodeId, cn: NodeId) {
        self.shared.world.borrow_mut().restore(mn, cn);
    }

    /// Restarts CN `node` after a crash (LOTUS §6 "the system immediately restarts it"):
    /// it is up again with nothing of its former state — its tasks were dropped at the
    /// crash, the messages queued at its old ports are discarded — and new contexts
    /// ([`context`](Self::context)) and tasks on it run. MN access revoked with
    /// [`revoke`](Self::revoke) stays revoked until [`restore`](Self::restore)d (the
    /// restarted CN re-establishes its connections). Process restart time is not modelled:
    /// the caller chooses when to call this. Returns false (and does nothing) if `node` is
    /// not a crashed CN, or crashed so recently that its tasks are not dropped yet (the
    /// executor drops them before it polls any other task).
    pub fn restart(&self, node: NodeId) -> bool {
        self.shared.world.borrow_mut().restart(node)
    }

    /// How many times `node` crashed, restarts or not ([`is_crashed`](Self::is_crashed) is
    /// false again once a CN restarted).
    #[must_use]
    pub fn crashes(&self, node: NodeId) -> u32 {
        self.shared.world.borrow().crashes(node)
    }

    /// Whether `node` has crashed.
    #[must_use]
    pub fn is_crashed(&self, node: NodeId) -> bool {
        self.shared.world.borrow().is_crashed(node)
    }

    /// Number of tasks not finished yet.
    #[must_use]
    pub fn live_tasks(&self) -> usize {
        self.shared.tasks.borrow().len()
    }

    /// A digest of every completed operation and delivered message (time, core, outcome):
    /// equal digests mean equal runs.
    #[must_use]
    pub fn digest(&self) -> u64 {
        self.shared.world.borrow().digest()
    }

    /// A snapshot of the statistics.
    #[must_use]
    pub fn stats(&self) -> SimStats {
        let world = self.shared.world.borrow();
        let nodes = (0..world.node_count())
            .map(|i| {
                let node = NodeId(i as u16);
                let cpu_busy_ns = world
                    .cores
                    .iter()
                    .filter(|c| c.node == node)
                    .map(|c| c.cpu_busy_ns)
                    .sum();
                NodeStats {
                    node,
                    role: if world.is_memory(node) {
                        Role::Memory
                    } else {
                        Role::Compute
                    },
                    nic: world.nic_stats(node).clone(),
                    cpu_busy_ns,
                }
            })
            .collect();
        SimStats {
            elapsed_ns: world.now,
            nodes,
            latency: OpKind::ALL
                .into_iter()
                .zip(world.latency.snapshot())
                .collect(),
            events: world.events_processed,
        }
    }
}

fn spawn_on(shared: &Rc<Shared>, core: usize, future: Pin<Box<dyn Future<Output = ()>>>) {
    let generation = shared.generation.get().wrapping_add(1);
    shared.generation.set(generation);
    let key = {
        let mut tasks = shared.tasks.borrow_mut();
        let entry = tasks.vacant_entry();
        let key = (entry.key(), generation);
        let waker = Arc::new(TaskWaker {
            key,
            queued: AtomicBool::new(true),
            wakes: Arc::clone(&shared.wakes),
        });
        let handle = Rc::new(Waker::from(Arc::clone(&waker)));
        entry.insert(TaskSlot {
            future: Some(future),
            core,
            generation,
            waker,
            handle,
        });
        key
    };
    let at = shared.world.borrow().time_on(core);
    push_ready(shared, key, core, at);
}

fn push_ready(shared: &Shared, key: TaskKey, core: usize, at: Nanos) {
    let seq = shared.ready_seq.get() + 1;
    shared.ready_seq.set(seq);
    let mut queues = shared.queues.borrow_mut();
    let q = &mut queues[core];
    let new_head = q
        .tasks
        .peek()
        .is_none_or(|head| (at, seq) < (head.0, head.1));
    q.tasks.push((at, seq, key));
    if new_head {
        // What `publish` does, with this task as the head and the queue already borrowed.
        q.version += 1;
        let start = at.max(shared.world.borrow().cores[core].busy_until);
        shared
            .runnable
            .borrow_mut()
            .push((start, seq, core, q.version));
    }
}

/// (Re)enters `core` in the runnable queue with its current head task and free time,
/// superseding its previous entry. Inlined: after a task run the core's queue is usually
/// empty, and then this only supersedes the entry.
#[inline]
fn publish(shared: &Shared, core: usize) {
    let mut queues = shared.queues.borrow_mut();
    let q = &mut queues[core];
    q.version += 1;
    if let Some(&(at, seq, _)) = q.tasks.peek() {
        let version = q.version;
        drop(queues);
        enter_runnable(shared, core, at, seq, version);
    }
}

/// [`publish`] with the world already borrowed.
fn republish(shared: &Shared, world: &World, core: usize) {
    let mut queues = shared.queues.borrow_mut();
    let q = &mut queues[core];
    q.version += 1;
    if let Some(&(at, seq, _)) = q.tasks.peek() {
        let start = at.max(world.cores[core].busy_until);
        shared
            .runnable
            .borrow_mut()
            .push((start, seq, core, q.version));
    }
}

/// Enters `core` in the runnable queue with its head task (readied at `at`, wake order
/// `seq`) and the queue's `version`, at the time the core can start that task.
#[inline(never)]
fn enter_runnable(shared: &Shared, core: usize, at: Nanos, seq: u64, version: u64) {
    let start = at.max(shared.world.borrow().cores[core].busy_until);
    shared
        .runnable
        .borrow_mut()
        .push((start, seq, core, version));
}

/// Readies the tasks woken since the last drain, at `at`. Its callers check first whether
/// anything was woken (most of the time nothing was), each with a borrow it holds anyway.
#[inline(never)]
fn drain_wakes(shared: &Shared, at: Nanos) {
    // Tasks woken by their lists' completions first, then the wakers' queue. Both are never
    // filled between two drains: completions wake during an event, at most one task per
    // event, and the event loop drains after every event that woke something; so the
    // order in which tasks become ready is the order of their wakes either way.
    drain_task_wakes(shared, at);
    // A load first: the swap is a locked instruction, and the queue is usually empty.
    if !shared.wakes.any.load(Ordering::Relaxed) || !shared.wakes.any.swap(false, Ordering::Acquire)
    {
        return;
    }
    // Swap with a buffer kept across calls so that waking allocates nothing.
    let mut woken = shared.woken_buffer.take();
    std::mem::swap(&mut woken, &mut *lock_ignoring_poison(&shared.wakes.keys));
    for &key in &woken {
        let core = match shared.tasks.borrow().get(key.0) {
            Some(slot) if slot.generation == key.1 => slot.core,
            _ => continue,
        };
        push_ready(shared, key, core, at);
    }
    woken.clear();
    shared.woken_buffer.set(woken);
}

/// Readies the tasks of [`World::task_wakes`], each unless it is queued already (what its
/// waker would have done).
fn drain_task_wakes(shared: &Shared, at: Nanos) {
    let mut woken = {
        let mut world = shared.world.borrow_mut();
        match world.task_wakes.len() {
            0 => return,
            // The usual case (a completion wakes one task, then the loop drains): no buffer
            // to swap out and back.
            1 => {
                let key = world.task_wakes.pop().expect("one wake");
                drop(world);
                ready_woken(shared, key, at);
                return;
            }
            _ => std::mem::take(&mut world.task_wakes),
        }
    };
    for &key in &woken {
        ready_woken(shared, key, at);
    }
    woken.clear();
    // Give the buffer back so that waking allocates nothing.
    shared.world.borrow_mut().task_wakes = woken;
}

/// Readies a task woken by its list's completion, unless it is gone or queued already.
#[inline]
fn ready_woken(shared: &Shared, key: TaskKey, at: Nanos) {
    let core = match shared.tasks.borrow().get(key.0) {
        Some(slot)
            if slot.generation == key.1 && !slot.waker.queued.swap(true, Ordering::Relaxed) =>
        {
            slot.core
        }
        _ => return,
    };
    push_ready(shared, key, core, at);
}

/// Whether the task woken alone (by its list's completion, key `key`, at `now`) is what the
/// run loop would do next: its core has no other task queued, and its start comes before
/// every event, before every other core's entry in the runnable queue and not after the deadline.
/// Then the loop would enter it in its core's queue and the runnable queue, find it first, take it
/// out and run it; this does what that leaves behind (a wake order and a queue version
/// used up) and returns its core and start, for the caller to run it at once. Otherwise it
/// changes nothing and returns `None`: the task takes the usual way.
#[inline]
fn run_at_once(
    shared: &Shared,
    world: &mut World,
    key: TaskKey,
    now: Nanos,
    deadline: Option<Nanos>,
) -> Option<(usize, Nanos)> {
    // The usual reason not to (another event at this instant) first: the task's start is
    // `now` or later, so an event at `now` comes before it. Nothing below schedules an
    // event, so this peek also serves the check against the task's start.
    let next_event = world.next_event_time();
    if next_event.is_some_and(|e| e <= now) {
        return None;
    }
    let tasks = shared.tasks.borrow();
    let slot = tasks.get(key.0)?;
    // Gone, or queued already (then the wake does nothing).
    if slot.generation != key.1
        || slot.waker.queued.load(Ordering::Relaxed)
        || slot.future.is_none()
    {
        return None;
    }
    let core = slot.core;
    let mut queues = shared.queues.borrow_mut();
    let q = &mut queues[core];
    if q.tasks.peek().is_some() {
        return None;
    }
    let seq = shared.ready_seq.get() + 1;
    let version = q.version + 1;
    let start = now.max(world.cores[core].busy_until);
    if deadline.is_some_and(|d| start > d) || next_event.is_some_and(|e| e <= start) {
        return None;
    }
    // Its runnable entry would be `(start, seq, core, version)`; it must come first (entries are
    // unique: a core's entries differ in version). A superseded entry ahead of it would be
    // skipped, but the usual way handles that.
    if shared
        .runnable
        .borrow()
        .peek()
        .is_some_and(|first| *first < (start, seq, core, version))
    {
        return None;
    }
    shared.ready_seq.set(seq);
    q.version = version;
    Some((core, start))
}

/// The next runnable task, its core and the time the core can start it, discarding finished
/// tasks and re-entering cores that became busy since they were entered.
/// `world` is the run loop's borrow of the world (for the cores' free times).
fn next_task(shared: &Shared, world: &World) -> Option<(Nanos, usize, TaskKey)> {
    loop {
        let (start, _, core, version) = *shared.runnable.borrow().peek()?;
        let head = {
            let queues = shared.queues.borrow();
            let q = &queues[core];
            if q.version != version {
                None
            } else {
                q.tasks.peek().map(|&(_, _, key)| key)
            }
        };
        let Some(key) = head else {
            shared.runnable.borrow_mut().pop();
            continue;
        };
        let alive = matches!(
            shared.tasks.borrow().get(key.0),
            Some(slot) if slot.generation == key.1 && slot.future.is_some()
        );
        if !alive {
            shared.runnable.borrow_mut().pop();
            shared.queues.borrow_mut()[core].tasks.pop();
            republish(shared, world, core);
            continue;
        }
        if world.cores[core].busy_until > start {
            shared.runnable.borrow_mut().pop();
            republish(shared, world, core);
            continue;
        }
        return Some((start, core, key));
    }
}

/// Drops the tasks of CNs that crashed.
fn reap_crashed(shared: &Shared) {
    if shared.world.borrow().newly_crashed.is_empty() {
        return;
    }
    let crashed = std::mem::take(&mut shared.world.borrow_mut().newly_crashed);
    let doomed: Vec<_> = {
        let world = shared.world.borrow();
        let mut tasks = shared.tasks.borrow_mut();
        let keys: Vec<usize> = tasks
            .iter()
            .filter(|(_, slot)| crashed.contains(&world.cores[slot.core].node))
            .map(|(k, _)| k)
            .collect();
        keys.into_iter().map(|k| tasks.remove(k)).collect()
    };
    // Dropped with no borrow held: a future's destructor may reach into the world.
    drop(doomed);
}

fn run(shared: &Rc<Shared>, deadline: Option<Nanos>) -> Nanos {
    loop {
        // One borrow of the world from here to the task run or the drain of the wakes,
        // instead of one per use.
        let mut world = shared.world.borrow_mut();
        if !world.newly_crashed.is_empty() {
            drop(world);
            reap_crashed(shared);
            continue;
        }
        let event_at = world.next_event_time();
        let task = next_task(shared, &world);
        let next = match (event_at, task) {
            (None, None) => break,
            (Some(e), None) => e,
            (None, Some((t, ..))) => t,
            (Some(e), Some((t, ..))) => e.min(t),
        };
        if deadline.is_some_and(|d| next > d) {
            world.now = world.now.max(deadline.unwrap_or(0));
            break;
        }
        let run_event = match (event_at, task) {
            (Some(e), Some((t, ..))) => e <= t,
            (Some(_), None) => true,
            _ => false,
        };
        if run_event {
            // Events up to the next task start (and the deadline) in one go, while they wake
            // no task and crash no node: until then the next task cannot change.
            let limit = task
                .map_or(Nanos::MAX, |(t, ..)| t)
                .min(deadline.unwrap_or(Nanos::MAX));
            let (now, quiet) = loop {
                world.step();
                if shared.wakes.any.load(Ordering::Relaxed)
                    || !world.task_wakes.is_empty()
                    || !world.newly_crashed.is_empty()
                {
                    break (world.now, false);
                }
                match world.next_event_time() {
                    Some(e) if e <= limit => {}
                    _ => break (world.now, true),
                }
            };
            if !quiet {
                // The usual wake (one completion woke its task) taken under this borrow.
                let single = if world.task_wakes.len() == 1 {
                    world.task_wakes.pop()
                } else {
                    None
                };
                if let Some(key) = single
                    && world.newly_crashed.is_empty()
                    && !shared.wakes.any.load(Ordering::Relaxed)
                    && let Some((core, start)) = run_at_once(shared, &mut world, key, now, deadline)
                {
                    drop(world);
                    poll_task(shared, key, start);
                    publish(shared, core);
                    continue;
                }
                drop(world);
                if let Some(key) = single {
                    ready_woken(shared, key, now);
                }
                drain_wakes(shared, now);
                continue;
            }
            // The burst ended before the next task's start with nothing woken or crashed:
            // the next pass would find that same task first (its start is not after the
            // deadline, or the burst's limit was the deadline) and run it. Run it now.
            if task.is_none_or(|(t, ..)| deadline.is_some_and(|d| t > d)) {
                continue;
            }
        }
        drop(world);
        if let Some((start, core, key)) = task {
            shared.runnable.borrow_mut().pop();
            shared.queues.borrow_mut()[core].tasks.pop();
            poll_task(shared, key, start);
            // The core's free time moved: enter it again with its next task.
            publish(shared, core);
        }
    }
    shared.world.borrow().now
}

fn poll_task(shared: &Rc<Shared>, key: TaskKey, start: Nanos) {
    let (mut future, core, waker) = {
        let mut tasks = shared.tasks.borrow_mut();
        let slot = &mut tasks[key.0];
        slot.waker.queued.store(false, Ordering::Relaxed);
        let future = slot.future.take().expect("runnable task has its future");
        (future, slot.core, Rc::clone(&slot.handle))
    };
    {
        let mut world = shared.world.borrow_mut();
        world.now = world.now.max(start);
        world.polling_core = Some(core);
        world.cores[core].local = start;
    }
    let mut cx = Context::from_waker(&waker);
    shared.polling.set(Some(PolledTask {
        key,
        waker_data: waker.data(),
        waker_vtable: waker.vtable(),
    }));
    let poll = future.as_mut().poll(&mut cx);
    shared.polling.set(None);
    // With the same borrow, whether the poll woke a task by a completion (none can be
    // added after it: completions happen in events).
    let (local, task_woken) = {
        let mut world = shared.world.borrow_mut();
        world.polling_core = None;
        let c = &mut world.cores[core];
        c.busy_until = c.local;
        (c.local, !world.task_wakes.is_empty())
    };
    match poll {
        Poll::Ready(()) => {
            let slot = shared.tasks.borrow_mut().remove(key.0);
            drop(slot);
            drop(future);
        }
        Poll::Pending => {
            if let Some(slot) = shared.tasks.borrow_mut().get_mut(key.0) {
                slot.future = Some(future);
            }
        }
    }
    if task_woken || shared.wakes.any.load(Ordering::Relaxed) {
        drain_wakes(shared, local);
    }
}

/// One execution context on a simulated CN core: its queue pairs to every node, its
/// messaging endpoint and its clock. Cheap to clone; clones share the endpoint.
#[derive(Clone)]
pub struct SimContext {
    shared: Rc<Shared>,
    core: usize,
    endpoint: Endpoint,
    seed: u64,
    /// Post lists issued through this context and its clones (round trips to MNs).
    posts: Rc<Cell<u64>>,
}

impl std::fmt::Debug for SimContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimContext")
            .field("core", &self.core)
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl SimContext {
    /// The compute node this context runs on.
    #[must_use]
    pub fn node(&self) -> NodeId {
        self.endpoint.node
    }

    /// A seed unique to this context and derived from the cluster's seed, for the
    /// context's own random choices (workload keys, backoff).
    #[must_use]
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The thread (core index within its CN) this context runs on.
    #[must_use]
    pub fn thread(&self) -> u16 {
        (self.core % usize::from(self.shared.threads_per_cn.max(1))) as u16
    }

    /// Post lists ([`Verbs::post`] calls) issued so far through this context and its clones
    /// (not through other contexts of the same thread): each is one round trip to the MNs,
    /// so a caller that snapshots it around a transaction counts the transaction's rounds.
    #[must_use]
    pub fn posts(&self) -> u64 {
        self.posts.get()
    }

    /// Spawns another task on this context's core.
    pub fn spawn(&self, future: impl Future<Output = ()> + 'static) {
        spawn_on(&self.shared, self.core, Box::pin(future));
    }

    #[inline]
    fn crashed(&self) -> bool {
        self.shared.world.borrow().is_crashed(self.endpoint.node)
    }

    fn take_message(&self) -> Option<Message> {
        let mut world = self.shared.world.borrow_mut();
        let msg = world.ports.get_mut(&self.endpoint)?.messages.pop_front()?;
        let cost = world.profile.msg_rx_cpu_ns;
        world.charge(self.core, cost);
        Some(msg)
    }
}

enum PostState {
    Unposted(PostList),
    Posted(BatchKey),
    Done,
}

/// Resolves when every work request of a post list has completed. Borrows its context
/// (no `Rc` count moves per post).
struct PostFuture<'a> {
    ctx: &'a SimContext,
    state: PostState,
}

impl Future for PostFuture<'_> {
    type Output = Result<BatchResult, VerbsError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let ctx = self.ctx;
        // One borrow of the world for the whole poll.
        let mut world = ctx.shared.world.borrow_mut();
        if world.is_crashed(ctx.endpoint.node) {
            return Poll::Ready(Err(VerbsError::LocalCrash));
        }
        // The state is matched in place: moving the list out (`mem::replace`) copied the
        // whole state on every poll, also when it only held a key.
        let key = match &mut self.state {
            PostState::Posted(key) => {
                let key = *key;
                if let Some((cqes, outcomes)) = world.take_if_done(key) {
                    let cost = cqes as u64 * world.profile.cqe_cpu_ns;
                    world.charge(ctx.core, cost);
                    self.state = PostState::Done;
                    return Poll::Ready(outcomes);
                }
                key
            }
            // A list just posted is never complete: its work requests are in flight, or (a
            // crash mid-list) some were never posted. Its slot takes its waiter at once.
            PostState::Unposted(_) => {
                let PostState::Unposted(list) = std::mem::replace(&mut self.state, PostState::Done)
                else {
                    unreachable!("matched above");
                };
                let wrs = match list.finish_inline() {
                    Ok(wrs) => wrs,
                    Err(e) => return Poll::Ready(Err(e)),
                };
                let key = world.post(ctx.core, wrs, waiter(ctx, cx));
                self.state = PostState::Posted(key);
                return Poll::Pending;
            }
            PostState::Done => panic!("PostFuture polled after completion"),
        };
        world.batch_mut(key).waiter = waiter(ctx, cx);
        Poll::Pending
    }
}

/// Who a post list polled with `cx` wakes: the task being polled, if `cx` holds its own
/// waker, or a clone of that waker.
#[inline]
fn waiter(ctx: &SimContext, cx: &Context<'_>) -> Waiter {
    let own_waker = ctx
        .shared
        .polling
        .get()
        .filter(|task| task.owns(cx.waker()));
    match own_waker {
        Some(task) => Waiter::Task(task.key),
        None => Waiter::Waker(cx.waker().clone()),
    }
}

/// Tasks still waiting when the simulation goes (a lock server's receive loop, a worker
/// waiting for work) hold contexts, and contexts hold the cluster: without this the cluster
/// and its memory would stay alive through that cycle. Dropping the simulation drops them.
impl Drop for Sim {
    fn drop(&mut self) {
        let tasks = std::mem::take(&mut *self.shared.tasks.borrow_mut());
        drop(tasks);
    }
}

impl Drop for PostFuture<'_> {
    /// Inlined into the caller's `.await` (one drop per post; a finished future is `Done`).
    #[inline]
    fn drop(&mut self) {
        if let PostState::Posted(key) = self.state
            && let Ok(mut world) = self.ctx.shared.world.try_borrow_mut()
        {
            world.abandon(key);
        }
    }
}

struct RecvFuture {
    ctx: SimContext,
}

impl Future for RecvFuture {
    type Output = Result<Message, VerbsError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.ctx.crashed() {
            return Poll::Ready(Err(VerbsError::LocalCrash));
        }
        if let Some(msg) = self.ctx.take_message() {
            return Poll::Ready(Ok(msg));
        }
        let mut world = self.ctx.shared.world.borrow_mut();
        match world.ports.get_mut(&self.ctx.endpoint) {
            Some(q) => {
                q.waker = Some(cx.waker().clone());
                Poll::Pending
            }
            None => Poll::Ready(Err(VerbsError::Closed)),
        }
    }
}

struct SleepFuture {
    ctx: SimContext,
    deadline: Nanos,
    armed: bool,
}

impl Future for SleepFuture {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut world = self.ctx.shared.world.borrow_mut();
        if world.time_on(self.ctx.core) >= self.deadline {
            return Poll::Ready(());
        }
        if !self.armed {
            world.schedule(self.deadline, Event::Timer(cx.waker().clone()));
            drop(world);
            self.armed = true;
        }
        Poll::Pending
    }
}

impl Verbs for SimContext {
    fn local_endpoint(&self) -> Endpoint {
        self.endpoint
    }

    fn post(&self, list: PostList) -> impl Future<Output = Result<BatchResult, VerbsError>> {
        self.posts.set(self.posts.get() + 1);
        PostFuture {
            ctx: self,
            state: PostState::Unposted(list),
        }
    }

    async fn post_detached(&self, list: PostList) -> Result<(), VerbsError> {
        if self.crashed() {
            return Err(VerbsError::LocalCrash);
        }
        let wrs = list.finish_inline()?;
        let mut world = self.shared.world.borrow_mut();
        // Posted like any list (same doorbells, same per-QP order), then abandoned: the work
        // requests execute, their completions wake nobody and cost no CQE poll.
        let key = world.post(self.core, wrs, Waiter::None);
        world.abandon(key);
        Ok(())
    }

    fn mark_phase(&self, phase: Phase) {
        self.shared
            .world
            .borrow_mut()
            .mark_phase(self.node(), phase);
    }

    fn send(&self, to: Endpoint, payload: &[u8]) -> impl Future<Output = Result<(), VerbsError>> {
        let payload = payload.to_vec();
        async move {
            if self.crashed() {
                return Err(VerbsError::LocalCrash);
            }
            let mut world = self.shared.world.borrow_mut();
            let max = world.profile.max_message_bytes as usize;
            if payload.len() > max {
                return Err(VerbsError::MessageTooLarge {
                    len: payload.len(),
                    max,
                });
            }
            world.send(self.core, self.endpoint, to, payload);
            Ok(())
        }
    }

    async fn send_batch(&self, messages: Vec<(Endpoint, Vec<u8>)>) -> Result<(), VerbsError> {
        if self.crashed() {
            return Err(VerbsError::LocalCrash);
        }
        let mut world = self.shared.world.borrow_mut();
        let max = world.profile.max_message_bytes as usize;
        if let Some((_, big)) = messages.iter().find(|(_, p)| p.len() > max) {
            return Err(VerbsError::MessageTooLarge {
                len: big.len(),
                max,
            });
        }
        world.send_batch(self.core, self.endpoint, messages);
        Ok(())
    }

    fn recv(&self) -> impl Future<Output = Result<Message, VerbsError>> {
        RecvFuture { ctx: self.clone() }
    }

    fn try_recv(&self) -> Result<Option<Message>, VerbsError> {
        if self.crashed() {
            return Err(VerbsError::LocalCrash);
        }
        Ok(self.take_message())
    }
}

impl Clock for SimContext {
    #[inline]
    fn now(&self) -> Nanos {
        self.shared.world.borrow().time_on(self.core)
    }

    fn sleep_until(&self, deadline: Nanos) -> impl Future<Output = ()> {
        SleepFuture {
            ctx: self.clone(),
            deadline,
            armed: false,
        }
    }

    fn cpu(&self, ns: Nanos) {
        self.shared.world.borrow_mut().charge(self.core, ns);
    }
}

#[cfg(test)]
mod tests {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    use super::*;

    /// The sorted queue pops in the order of a binary heap of the same entries, including
    /// entries readied out of time order (spawned at a core's local time, then woken at an
    /// earlier current time).
    #[test]
    fn sorted_queue_pops_like_a_heap() {
        let mut queue = SortedQueue::default();
        let mut heap = BinaryHeap::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut seq = 0u64;
        let mut now: Nanos = 0;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            for _ in 0..x % 3 {
                seq += 1;
                let at = if x & 0x300 == 0 {
                    now + (x >> 20) % 500
                } else {
                    now
                };
                let entry = (at, seq, ((x >> 32) as usize % 64, (x >> 40) as u32));
                queue.push(entry);
                heap.push(Reverse(entry));
            }
            for _ in 0..(x >> 50) % 3 {
                let got = queue.pop();
                assert_eq!(got, heap.pop().map(|Reverse(e)| e));
                assert_eq!(queue.peek(), heap.peek().map(|Reverse(e)| e));
                if let Some((at, ..)) = got {
                    now = now.max(at);
                }
            }
        }
        while let Some(Reverse(e)) = heap.pop() {
            assert_eq!(queue.pop(), Some(e));
        }
        assert_eq!(queue.pop(), None);
    }
}
