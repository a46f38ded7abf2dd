//! Tests of the polling executor and the real-time clock.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use dmem_runtime::{Executor, RealClock, RunOutcome, monotonic_now, spawn, yield_now};
use dmem_shm::{ShmContext, ShmFabric, ShmMemoryNode};
use dmem_verbs::{Clock, Endpoint, NodeId, Port, RKey, Verbs, VerbsExt};

const MS: u64 = 1_000_000;

fn ep(node: u16, port: u16) -> Endpoint {
    Endpoint {
        node: NodeId(node),
        port: Port(port),
    }
}

#[test]
fn many_tasks_interleave_round_robin() {
    let ex = Executor::new();
    let log = Rc::new(RefCell::new(Vec::new()));
    for task in ['a', 'b', 'c'] {
        let log = Rc::clone(&log);
        ex.spawn(async move {
            for round in 0..3 {
                log.borrow_mut().push(format!("{task}{round}"));
                yield_now().await;
            }
        });
    }
    assert_eq!(ex.task_count(), 3);
    assert_eq!(ex.run(), RunOutcome::Finished);
    assert_eq!(
        log.borrow().join(" "),
        "a0 b0 c0 a1 b1 c1 a2 b2 c2",
        "each ready task is polled once per round, in order"
    );
    assert_eq!(ex.task_count(), 0);
}

#[test]
fn a_thousand_tasks_spawning_tasks() {
    let ex = Executor::new();
    let done = Rc::new(Cell::new(0u32));
    for _ in 0..100 {
        let done = Rc::clone(&done);
        ex.spawn(async move {
            for _ in 0..10 {
                let done = Rc::clone(&done);
                spawn(async move {
                    yield_now().await;
                    done.set(done.get() + 1);
                });
                yield_now().await;
            }
        });
    }
    assert_eq!(ex.run(), RunOutcome::Finished);
    assert_eq!(done.get(), 1000);
}

#[test]
fn timers_fire_in_deadline_order() {
    let ex = Executor::new();
    let clock = ex.clock();
    let start = clock.now();
    let log = Rc::new(RefCell::new(Vec::new()));
    // Spawned out of order; two share a deadline and fire in registration order.
    for (name, delay) in [
        ("d4", 8),
        ("d1", 2),
        ("d3", 6),
        ("d2a", 4),
        ("d2b", 4),
        ("d0", 0),
    ] {
        let log = Rc::clone(&log);
        ex.spawn(async move {
            let deadline = start + delay * MS;
            RealClock.sleep_until(deadline).await;
            let now = RealClock.now();
            assert!(now >= deadline, "{name} woke {} ns early", deadline - now);
            log.borrow_mut().push(name);
        });
    }
    let began = Instant::now();
    assert_eq!(ex.run(), RunOutcome::Finished);
    assert_eq!(*log.borrow(), ["d0", "d1", "d2a", "d2b", "d3", "d4"]);
    assert!(began.elapsed() >= Duration::from_millis(8));
}

#[test]
fn block_on_returns_the_value_and_runs_spawned_tasks() {
    let ex = Executor::new();
    let side = Rc::new(Cell::new(0));
    let value = ex.block_on({
        let side = Rc::clone(&side);
        async move {
            spawn(async move { side.set(7) });
            RealClock.sleep(MS).await;
            42
        }
    });
    assert_eq!(value, 42);
    assert_eq!(side.get(), 7);
}

#[test]
fn run_until_stops_at_the_deadline_and_resumes_later() {
    let ex = Executor::new();
    let woke = Rc::new(Cell::new(false));
    {
        let woke = Rc::clone(&woke);
        ex.spawn(async move {
            RealClock.sleep(300 * MS).await;
            woke.set(true);
        });
    }
    let began = Instant::now();
    assert_eq!(
        ex.run_for(Duration::from_millis(5)),
        RunOutcome::DeadlineReached
    );
    let first = began.elapsed();
    // No upper bound on the wall time: a loaded machine may deschedule this thread for
    // longer than the sleep. What matters is that run_for returned at its deadline with the
    // task still pending, not after the task's 300 ms sleep had been served.
    assert!(first >= Duration::from_millis(5), "{first:?}");
    assert!(!woke.get(), "run_for must not wait for the task to finish");
    assert_eq!(ex.task_count(), 1);
    assert_eq!(ex.run(), RunOutcome::Finished);
    assert!(woke.get());
}

#[test]
fn a_stop_handle_stops_a_run_from_another_thread() {
    let ex = Executor::new();
    ex.spawn(async {
        loop {
            RealClock.sleep(MS).await;
        }
    });
    let stop = ex.stop_handle();
    let stopper = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(10));
        stop.stop();
    });
    assert_eq!(ex.run(), RunOutcome::Stopped);
    stopper.join().unwrap();
    assert_eq!(ex.task_count(), 1);
}

/// A stand-in completion queue: futures enqueue a request, the poller completes it.
#[derive(Default)]
struct FakeCq {
    pending: RefCell<VecDeque<(Rc<Cell<bool>>, Waker)>>,
}

struct Completion {
    cq: Rc<FakeCq>,
    done: Option<Rc<Cell<bool>>>,
}

impl Future for Completion {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match &self.done {
            Some(done) if done.get() => Poll::Ready(()),
            Some(_) => Poll::Pending,
            None => {
                let done = Rc::new(Cell::new(false));
                self.cq
                    .pending
                    .borrow_mut()
                    .push_back((Rc::clone(&done), cx.waker().clone()));
                self.done = Some(done);
                Poll::Pending
            }
        }
    }
}

#[test]
fn pollers_complete_work_between_task_polls() {
    let ex = Executor::new();
    let cq = Rc::new(FakeCq::default());
    let calls = Rc::new(Cell::new(0usize));
    {
        let (cq, calls) = (Rc::clone(&cq), Rc::clone(&calls));
        ex.register_poller(move || {
            calls.set(calls.get() + 1);
            // One completion per call, like a CQ polled with a budget of one.
            match cq.pending.borrow_mut().pop_front() {
                Some((done, waker)) => {
                    done.set(true);
                    waker.wake();
                    1
                }
                None => 0,
            }
        });
    }
    let completed = Rc::new(Cell::new(0));
    for _ in 0..4 {
        let (cq, completed) = (Rc::clone(&cq), Rc::clone(&completed));
        ex.spawn(async move {
            for _ in 0..25 {
                Completion {
                    cq: Rc::clone(&cq),
                    done: None,
                }
                .await;
                completed.set(completed.get() + 1);
            }
        });
    }
    assert_eq!(ex.run(), RunOutcome::Finished);
    assert_eq!(completed.get(), 100);
    // Called between task polls: at least once per completion, plus idle rounds.
    assert!(calls.get() >= 100, "{}", calls.get());
}

fn linked(mn: &ShmMemoryNode, fabric: &ShmFabric, cn: u16, port: u16) -> ShmContext {
    let mut ctx = fabric.context(ep(cn, port)).unwrap();
    ctx.add_link(mn.link(NodeId(cn)).unwrap()).unwrap();
    ctx
}

#[test]
fn tasks_do_shm_verbs_and_sleep_under_the_executor() {
    let mn = ShmMemoryNode::create(NodeId(0), RKey(3), 4096).unwrap();
    let fabric = ShmFabric::new();
    let ctx = Rc::new(linked(&mn, &fabric, 1, 0));
    let lock = mn.region().at(0).unwrap();
    let data = mn.region().at(64).unwrap();
    let ex = Executor::new();
    // Four tasks share one context and take turns on a CAS lock, sleeping while holding it.
    for id in 1..=4u64 {
        let ctx = Rc::clone(&ctx);
        ex.spawn(async move {
            while ctx.cas(lock, 0, id).await.unwrap() != 0 {
                RealClock.sleep(100_000).await;
            }
            let old = ctx.read(data, 8).await.unwrap();
            RealClock.sleep(MS).await; // others spin on the lock meanwhile
            let v = u64::from_ne_bytes(old.try_into().unwrap()) + id;
            ctx.write(data, &v.to_ne_bytes()).await.unwrap();
            assert_eq!(ctx.cas(lock, id, 0).await.unwrap(), id);
        });
    }
    assert_eq!(ex.run(), RunOutcome::Finished);
    let total = ex.block_on(async { ctx.read(data, 8).await.unwrap() });
    assert_eq!(u64::from_ne_bytes(total.try_into().unwrap()), 1 + 2 + 3 + 4);
}

#[test]
fn a_message_from_another_thread_wakes_a_parked_executor() {
    let fabric = ShmFabric::new();
    let ctx = fabric.context(ep(1, 0)).unwrap();
    let sender_fabric = fabric.clone();
    let sender = std::thread::spawn(move || {
        let me = sender_fabric.context(ep(2, 0)).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let mut cx = Context::from_waker(Waker::noop());
        let send = std::pin::pin!(me.send(ep(1, 0), b"wake up"));
        assert!(matches!(send.poll(&mut cx), Poll::Ready(Ok(()))));
    });
    let ex = Executor::new();
    let began = Instant::now();
    let msg = ex.block_on(ctx.recv()).unwrap();
    assert_eq!(msg.payload, b"wake up");
    assert!(began.elapsed() >= Duration::from_millis(15));
    sender.join().unwrap();
}

#[test]
fn one_executor_per_thread_sharing_one_memory_node_counts_exactly() {
    const TASKS: u64 = 4;
    const ADDS: u64 = 2_000;
    let mn = ShmMemoryNode::create(NodeId(0), RKey(3), 4096).unwrap();
    let fabric = ShmFabric::new();
    let counter = mn.region().at(256).unwrap();
    let threads: Vec<_> = (1..=2u16)
        .map(|cn| {
            let (mn, fabric) = (mn.clone(), fabric.clone());
            std::thread::spawn(move || {
                let ex = Executor::new();
                for port in 0..TASKS as u16 {
                    let ctx = linked(&mn, &fabric, cn, port);
                    ex.spawn(async move {
                        for i in 0..ADDS {
                            ctx.faa(counter, 1).await.unwrap();
                            if i % 64 == 0 {
                                yield_now().await;
                            }
                        }
                    });
                }
                ex.run()
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), RunOutcome::Finished);
    }
    let ctx = linked(&mn, &fabric, 9, 0);
    let total = Executor::new().block_on(async { ctx.read(counter, 8).await.unwrap() });
    assert_eq!(
        u64::from_ne_bytes(total.try_into().unwrap()),
        2 * TASKS * ADDS
    );
}

#[test]
fn the_clock_is_monotonic_and_cpu_is_free() {
    let a = monotonic_now();
    RealClock.cpu(1_000_000_000);
    let b = RealClock.now();
    assert!(b >= a);
    assert!(b - a < 500 * MS, "cpu() must not sleep");
}

#[test]
#[should_panic(expected = "no running Executor")]
fn sleeping_without_an_executor_panics_clearly() {
    let mut sleep = std::pin::pin!(RealClock.sleep(10 * MS));
    let _ = sleep.as_mut().poll(&mut Context::from_waker(Waker::noop()));
}

#[test]
#[should_panic(expected = "already running")]
fn nested_executors_are_refused() {
    let outer = Executor::new();
    outer.block_on(async {
        Executor::new().block_on(async {});
    });
}
