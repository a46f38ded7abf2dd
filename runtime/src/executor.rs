//! The per-core polling executor.
//!
//! One thread runs many `!Send` tasks round-robin. Between two task polls it calls every
//! registered completion-queue poller (an RDMA backend's CQ drain; the shm fabric needs
//! none), and at each round it fires expired timers. When nothing is ready, no poller made
//! progress and no poller is registered, the thread parks until the next timer or a wake.
//!
//! Wakers are `Arc`s implementing [`std::task::Wake`], hence `Send + Sync`: a task may be
//! woken from any thread (a message sent by a context on another core, say). Waking pushes
//! the task's id onto a mutex-protected ready queue and unparks the executor's thread; a
//! per-task flag keeps a task from being queued twice.

use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::Duration;

use dmem_verbs::Nanos;
use dmem_verbs::sync::lock_ignoring_poison;

use crate::time::monotonic_now;

/// The id the `block_on` future is woken with.
const MAIN: u64 = u64::MAX;

thread_local! {
    /// The executor running on this thread, while it runs.
    static CURRENT: RefCell<Option<Rc<Shared>>> = const { RefCell::new(None) };
}

/// Calls `f` with the executor running on this thread, if any.
pub(crate) fn with_current<R>(f: impl FnOnce(&Shared) -> R) -> Option<R> {
    let current = CURRENT.with(|c| c.borrow().clone());
    current.map(|shared| f(&shared))
}

/// Names a spawned task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaskId(u64);

/// Why [`Executor::run`] or [`Executor::run_until`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunOutcome {
    /// Every spawned task finished.
    Finished,
    /// The deadline passed; unfinished tasks stay in the executor and run on the next call.
    DeadlineReached,
    /// [`StopHandle::stop`] was called; unfinished tasks stay in the executor.
    Stopped,
}

/// Names a timer of an executor (unique in the process, so a stale key is harmless).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct TimerKey(u64);

static NEXT_TIMER: AtomicU64 = AtomicU64::new(0);

/// The ready queue, shared with every waker.
#[derive(Debug)]
struct ReadyQueue {
    ids: Mutex<VecDeque<u64>>,
    thread: Thread,
}

impl ReadyQueue {
    fn push(&self, id: u64) {
        lock_ignoring_poison(&self.ids).push_back(id);
        self.thread.unpark();
    }

    fn pop(&self) -> Option<u64> {
        lock_ignoring_poison(&self.ids).pop_front()
    }

    fn len(&self) -> usize {
        lock_ignoring_poison(&self.ids).len()
    }
}

/// The waker of one task.
#[derive(Debug)]
struct TaskWaker {
    id: u64,
    /// Set while the id sits in the ready queue.
    queued: AtomicBool,
    queue: Arc<ReadyQueue>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.queue.push(self.id);
        }
    }
}

struct Task {
    future: Pin<Box<dyn Future<Output = ()>>>,
    handle: Arc<TaskWaker>,
    waker: Waker,
}

/// Timers: a heap of deadlines and the wakers of the live ones.
#[derive(Default)]
struct Timers {
    heap: BinaryHeap<Reverse<(Nanos, TimerKey)>>,
    wakers: HashMap<TimerKey, Waker>,
}

impl Timers {
    /// The earliest live deadline, dropping cancelled entries on the way.
    fn next_deadline(&mut self) -> Option<Nanos> {
        while let Some(Reverse((deadline, key))) = self.heap.peek() {
            if self.wakers.contains_key(key) {
                return Some(*deadline);
            }
            self.heap.pop();
        }
        None
    }

    /// Removes the timers due at `now`, earliest first (ties in registration order).
    fn expired(&mut self, now: Nanos) -> Vec<Waker> {
        let mut due = Vec::new();
        while let Some(&Reverse((deadline, key))) = self.heap.peek() {
            if deadline > now {
                break;
            }
            self.heap.pop();
            if let Some(waker) = self.wakers.remove(&key) {
                due.push(waker);
            }
        }
        due
    }
}

type Poller = Box<dyn FnMut() -> usize>;

/// The state of one executor, reachable from its tasks through [`CURRENT`].
pub(crate) struct Shared {
    /// Task slots; a task is taken out while it is polled.
    tasks: RefCell<Vec<Option<Task>>>,
    /// Generation of each slot, so a stale wake of a reused slot is ignored.
    generations: RefCell<Vec<u32>>,
    free: RefCell<Vec<usize>>,
    live: Cell<usize>,
    ready: Arc<ReadyQueue>,
    timers: RefCell<Timers>,
    pollers: RefCell<Vec<Poller>>,
    stop: Arc<AtomicBool>,
}

impl Shared {
    fn spawn(&self, future: Pin<Box<dyn Future<Output = ()>>>) -> TaskId {
        let index = match self.free.borrow_mut().pop() {
            Some(index) => index,
            None => {
                self.tasks.borrow_mut().push(None);
                self.generations.borrow_mut().push(0);
                self.tasks.borrow().len() - 1
            }
        };
        let generation = self.generations.borrow()[index];
        let id = (u64::from(generation) << 32) | index as u64;
        let handle = Arc::new(TaskWaker {
            id,
            queued: AtomicBool::new(false),
            queue: Arc::clone(&self.ready),
        });
        let waker = Waker::from(Arc::clone(&handle));
        self.tasks.borrow_mut()[index] = Some(Task {
            future,
            handle: Arc::clone(&handle),
            waker,
        });
        self.live.set(self.live.get() + 1);
        handle.wake_by_ref();
        TaskId(id)
    }

    /// Polls task `id` once if it is still alive; returns whether it was polled.
    fn poll_task(&self, id: u64) -> bool {
        let index = (id & u64::from(u32::MAX)) as usize;
        let generation = (id >> 32) as u32;
        if self.generations.borrow().get(index) != Some(&generation) {
            return false;
        }
        let Some(mut task) = self.tasks.borrow_mut()[index].take() else {
            return false;
        };
        task.handle.queued.store(false, Ordering::Release);
        let mut cx = Context::from_waker(&task.waker);
        match task.future.as_mut().poll(&mut cx) {
            Poll::Pending => self.tasks.borrow_mut()[index] = Some(task),
            Poll::Ready(()) => {
                {
                    let mut generations = self.generations.borrow_mut();
                    generations[index] = generations[index].wrapping_add(1);
                }
                self.free.borrow_mut().push(index);
                self.live.set(self.live.get() - 1);
                // Dropped after the slot is released: its destructor may spawn or cancel.
                drop(task);
            }
        }
        true
    }

    fn run_pollers(&self) -> usize {
        let mut pollers = std::mem::take(&mut *self.pollers.borrow_mut());
        if pollers.is_empty() {
            return 0;
        }
        let work = pollers.iter_mut().map(|p| p()).sum();
        // Keep pollers registered while these ran.
        let mut slot = self.pollers.borrow_mut();
        pollers.append(&mut slot);
        *slot = pollers;
        work
    }

    fn fire_timers(&self) -> usize {
        let due = self.timers.borrow_mut().expired(monotonic_now());
        let n = due.len();
        for waker in due {
            waker.wake();
        }
        n
    }

    pub(crate) fn add_timer(&self, deadline: Nanos, waker: Waker) -> TimerKey {
        let key = TimerKey(NEXT_TIMER.fetch_add(1, Ordering::Relaxed));
        let mut timers = self.timers.borrow_mut();
        timers.heap.push(Reverse((deadline, key)));
        timers.wakers.insert(key, waker);
        key
    }

    /// Re-arms timer `key` with `waker`; if it is unknown here (it fired, or was made by
    /// another executor), arms a new one for `deadline`.
    pub(crate) fn update_timer(&self, key: TimerKey, deadline: Nanos, waker: &Waker) -> TimerKey {
        if let Some(current) = self.timers.borrow_mut().wakers.get_mut(&key) {
            if !current.will_wake(waker) {
                current.clone_from(waker);
            }
            return key;
        }
        self.add_timer(deadline, waker.clone())
    }

    pub(crate) fn cancel_timer(&self, key: TimerKey) {
        self.timers.borrow_mut().wakers.remove(&key);
    }
}

/// Sets [`CURRENT`] for the duration of a run.
struct Enter;

impl Enter {
    fn new(shared: &Rc<Shared>) -> Self {
        CURRENT.with(|c| {
            let mut c = c.borrow_mut();
            assert!(
                c.is_none(),
                "an Executor is already running on this thread (nested block_on/run)"
            );
            *c = Some(Rc::clone(shared));
        });
        Self
    }
}

impl Drop for Enter {
    fn drop(&mut self) {
        CURRENT.with(|c| c.borrow_mut().take());
    }
}

/// Stops a running [`Executor`] from any thread; it returns [`RunOutcome::Stopped`].
#[derive(Debug, Clone)]
pub struct StopHandle {
    flag: Arc<AtomicBool>,
    thread: Thread,
}

impl StopHandle {
    /// Makes the executor's current (or next) [`run`](Executor::run) or
    /// [`run_until`](Executor::run_until) return after the task it is polling.
    pub fn stop(&self) {
        self.flag.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// A single-thread executor of `!Send` tasks with completion-queue pollers and timers
/// (the `runtime/` layer's per-core polling executor).
///
/// Create one per core thread. Protocol code written against `dmem_verbs::Verbs` and
/// [`Clock`](dmem_verbs::Clock) runs on it unchanged; [`RealClock`](crate::RealClock)'s sleeps use its timers.
///
/// ```
/// use dmem_runtime::{Executor, RealClock};
/// use dmem_verbs::Clock;
/// use std::{cell::RefCell, rc::Rc};
///
/// let ex = Executor::new();
/// let log = Rc::new(RefCell::new(Vec::new()));
/// for (name, delay) in [("slow", 2_000_000), ("fast", 1_000_000)] {
///     let log = Rc::clone(&log);
///     ex.spawn(async move {
///         RealClock.sleep(delay).await;
///         log.borrow_mut().push(name);
///     });
/// }
/// ex.run();
/// assert_eq!(*log.borrow(), ["fast", "slow"]);
/// ```
pub struct Executor {
    shared: Rc<Shared>,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("tasks", &self.shared.live.get())
            .field("pollers", &self.shared.pollers.borrow().len())
            .finish_non_exhaustive()
    }
}

impl Default for Executor {
    fn default() -> Self {
        Self::new()
    }
}

enum Exit<T> {
    Main(T),
    Run(RunOutcome),
}

impl Executor {
    /// An executor bound to the calling thread (the one that will run it).
    #[must_use]
    pub fn new() -> Self {
        Self {
            shared: Rc::new(Shared {
                tasks: RefCell::new(Vec::new()),
                generations: RefCell::new(Vec::new()),
                free: RefCell::new(Vec::new()),
                live: Cell::new(0),
                ready: Arc::new(ReadyQueue {
                    ids: Mutex::new(VecDeque::new()),
                    thread: std::thread::current(),
                }),
                timers: RefCell::new(Timers::default()),
                pollers: RefCell::new(Vec::new()),
                stop: Arc::new(AtomicBool::new(false)),
            }),
        }
    }

    /// Adds a task; it first runs at the next [`block_on`](Self::block_on), [`run`](Self::run)
    /// or [`run_until`](Self::run_until). Tasks may spawn more with [`spawn`](crate::spawn).
    pub fn spawn(&self, future: impl Future<Output = ()> + 'static) -> TaskId {
        self.shared.spawn(Box::pin(future))
    }

    /// Registers a completion-queue poller, called between every two task polls; it returns
    /// how many completions it handled (0 when idle). While any poller is registered the
    /// executor never parks: it keeps polling, yielding the CPU when a round found no work.
    pub fn register_poller(&self, poller: impl FnMut() -> usize + 'static) {
        self.shared.pollers.borrow_mut().push(Box::new(poller));
    }

    /// Number of spawned tasks that have not finished.
    #[must_use]
    pub fn task_count(&self) -> usize {
        self.shared.live.get()
    }

    /// A handle that stops [`run`](Self::run)/[`run_until`](Self::run_until) from anywhere.
    #[must_use]
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle {
            flag: Arc::clone(&self.shared.stop),
            thread: self.shared.ready.thread.clone(),
        }
    }

    /// Runs `future` to completion, running spawned tasks alongside it; unfinished spawned
    /// tasks stay in the executor. [`StopHandle::stop`] does not interrupt it.
    ///
    /// # Panics
    /// If an executor is already running on this thread.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        let mut future = std::pin::pin!(future);
        match self.run_loop(Some(future.as_mut()), None, false) {
            Exit::Main(value) => value,
            Exit::Run(outcome) => unreachable!("block_on left its loop with {outcome:?}"),
        }
    }

    /// Runs until every spawned task has finished, or until stopped.
    ///
    /// # Panics
    /// If an executor is already running on this thread.
    pub fn run(&self) -> RunOutcome {
        self.run_plain(None)
    }

    /// Runs until every spawned task has finished, until `deadline` ([`monotonic_now`]
    /// nanoseconds), or until stopped, whichever comes first.
    ///
    /// # Panics
    /// If an executor is already running on this thread.
    pub fn run_until(&self, deadline: Nanos) -> RunOutcome {
        self.run_plain(Some(deadline))
    }

    /// [`run_until`](Self::run_until) `duration` from now.
    pub fn run_for(&self, duration: Duration) -> RunOutcome {
        let ns = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        self.run_until(monotonic_now().saturating_add(ns))
    }

    fn run_plain(&self, deadline: Option<Nanos>) -> RunOutcome {
        match self.run_loop(None::<Pin<&mut std::future::Pending<()>>>, deadline, true) {
            Exit::Run(outcome) => outcome,
            Exit::Main(()) => unreachable!("no main future"),
        }
    }

    fn run_loop<F: Future>(
        &self,
        mut main: Option<Pin<&mut F>>,
        deadline: Option<Nanos>,
        stoppable: bool,
    ) -> Exit<F::Output> {
        let shared = &self.shared;
        let _enter = Enter::new(shared);
        let main_handle = Arc::new(TaskWaker {
            id: MAIN,
            queued: AtomicBool::new(false),
            queue: Arc::clone(&shared.ready),
        });
        let main_waker = Waker::from(Arc::clone(&main_handle));
        if main.is_some() {
            main_handle.wake_by_ref();
        }
        loop {
            if stoppable && shared.stop.swap(false, Ordering::AcqRel) {
                return Exit::Run(RunOutcome::Stopped);
            }
            if deadline.is_some_and(|d| monotonic_now() >= d) {
                return Exit::Run(RunOutcome::DeadlineReached);
            }
            let mut work = shared.fire_timers() + shared.run_pollers();
            // One round: every task ready at its start, each polled once, pollers between.
            for _ in 0..shared.ready.len() {
                let Some(id) = shared.ready.pop() else { break };
                if id == MAIN {
                    main_handle.queued.store(false, Ordering::Release);
                    if let Some(future) = main.as_mut() {
                        let mut cx = Context::from_waker(&main_waker);
                        if let Poll::Ready(value) = future.as_mut().poll(&mut cx) {
                            return Exit::Main(value);
                        }
                    }
                } else if !shared.poll_task(id) {
                    continue;
                }
                work += 1 + shared.run_pollers();
                if stoppable && shared.stop.load(Ordering::Acquire) {
                    break;
                }
            }
            if work > 0 || shared.ready.len() > 0 {
                continue;
            }
            if main.is_none() && shared.live.get() == 0 {
                return Exit::Run(RunOutcome::Finished);
            }
            if !shared.pollers.borrow().is_empty() {
                std::thread::yield_now();
                continue;
            }
            let next_timer = shared.timers.borrow_mut().next_deadline();
            let wake_at = match (next_timer, deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            match wake_at {
                Some(at) => {
                    let now = monotonic_now();
                    if at > now {
                        std::thread::park_timeout(Duration::from_nanos(at - now));
                    }
                }
                None => std::thread::park(),
            }
        }
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        // Drop the tasks while this executor is current, so their timers are cancelled here
        // rather than in whichever executor happens to run on this thread.
        let running = CURRENT.with(|c| c.borrow().is_some());
        let tasks = std::mem::take(&mut *self.shared.tasks.borrow_mut());
        if running {
            drop(tasks);
        } else {
            let _enter = Enter::new(&self.shared);
            drop(tasks);
        }
    }
}

/// Spawns a task on the executor running on this thread.
///
/// # Panics
/// If no [`Executor`] is running on this thread.
pub fn spawn(future: impl Future<Output = ()> + 'static) -> TaskId {
    let future: Pin<Box<dyn Future<Output = ()>>> = Box::pin(future);
    with_current(move |shared| shared.spawn(future))
        .expect("dmem_runtime::spawn called on a thread with no running Executor")
}

/// Yields once: the task goes to the back of the ready queue, letting every other ready
/// task run first.
pub fn yield_now() -> YieldNow {
    YieldNow { yielded: false }
}

/// The future of [`yield_now`].
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct YieldNow {
    yielded: bool,
}

impl Future for YieldNow {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            return Poll::Ready(());
        }
        self.yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
