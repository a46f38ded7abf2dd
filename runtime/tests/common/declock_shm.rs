//! DecLock (the `dmem-locks` protocol code, unchanged) on the shm fabric, one executor per
//! core: used by `tests/per_core.rs` (does it work on each executor) and
//! `benches/per_core.rs` (how fast on each).
//!
//! One MN holds `locks` DecLock CQL locks and one counter per lock. Each core runs
//! `clients_per_core` DecLock clients (each its own shm context and port; one CN node per
//! core); each client takes a random lock exclusively, READs its counter, yields, WRITEs
//! counter + 1 and releases, until it has done `ops` acquisitions or the deadline passed.
//! With mutual exclusion the counters add up to the acquisitions; a lost update shows.

#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use dmem_locks::declock::{self, DecLockClient, DecLockConfig};
use dmem_locks::{Directory, LockMode, NoFailures, RwLockClient};
use dmem_runtime::{Clocked, CoreClock, ExecutorKind, monotonic_now, run_per_core};
use dmem_shm::{ShmFabric, ShmMemoryNode};
use dmem_verbs::{Clock, Endpoint, NodeId, Port, RKey, RemoteAddr, VerbsExt};

/// Queue capacity of the CQL locks: at least the clients that may contend for one lock.
pub const CAP: usize = 16;
const STRIDE: u64 = 256;

/// What to run.
#[derive(Debug, Clone)]
pub struct Workload {
    /// CPUs, one executor each.
    pub cores: Vec<usize>,
    /// DecLock clients per core.
    pub clients_per_core: u32,
    /// Locks (and counters).
    pub locks: u32,
    /// Acquisitions per client at most.
    pub ops: u64,
    /// Stop taking locks after this long (ns of `CLOCK_MONOTONIC` from the start).
    pub duration_ns: u64,
}

/// What came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Acquisitions completed (all clients).
    pub acquisitions: u64,
    /// Sum of the counters in MN memory at the end.
    pub counters: u64,
    /// Wall-clock ns from the common start to the last client's last release.
    pub elapsed_ns: u64,
}

/// Resolves after one `Pending` (wakes itself): a yield on any executor.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Runs `w` on executors of `kind`.
pub fn run(kind: ExecutorKind, w: &Workload) -> Outcome {
    let clients = w.cores.len() as u32 * w.clients_per_core;
    assert!(
        clients as usize <= CAP,
        "at most {CAP} clients contend for one lock"
    );
    let counters_base = u64::from(w.locks) * STRIDE;
    let mn = ShmMemoryNode::create(NodeId(0), RKey(7), counters_base + u64::from(w.locks) * 64)
        .expect("shm MN");
    let region = mn.region();
    let fabric = ShmFabric::new();
    let lock_at = |i: u32| region.at(u64::from(i) * STRIDE).unwrap();
    let counter_at = |i: u32| region.at(counters_base + u64::from(i) * 64).unwrap();
    // Lay the locks out.
    {
        let mut setup = fabric
            .context(Endpoint {
                node: NodeId(100),
                port: Port(0),
            })
            .unwrap();
        setup.add_link(mn.link(NodeId(100)).unwrap()).unwrap();
        let initial = declock::layout::<CAP>().initial;
        assert!(initial.len() as u64 <= STRIDE);
        dmem_runtime::Executor::new().block_on(async {
            for i in 0..w.locks {
                setup.write(lock_at(i), &initial).await.unwrap();
            }
        });
    }
    let endpoint = |id: u32| Endpoint {
        node: NodeId(1 + (id / w.clients_per_core) as u16),
        port: Port(1 + (id % w.clients_per_core) as u16),
    };
    let directory = Directory::new((0..clients).map(endpoint).collect());
    let locks: Arc<Vec<RemoteAddr>> = Arc::new((0..w.locks).map(lock_at).collect());
    let counters: Arc<Vec<RemoteAddr>> = Arc::new((0..w.locks).map(counter_at).collect());
    let busy = Arc::new(AtomicUsize::new(clients as usize));
    let start = monotonic_now() + 20_000_000;
    let deadline = start + w.duration_ns;
    let mut jobs = Vec::new();
    for (core, &cpu) in w.cores.iter().enumerate() {
        let ids: Vec<u32> = (0..w.clients_per_core)
            .map(|c| core as u32 * w.clients_per_core + c)
            .collect();
        let mut contexts = Vec::new();
        for &id in &ids {
            let ep = endpoint(id);
            let mut ctx = fabric.context(ep).unwrap();
            ctx.add_link(mn.link(ep.node).unwrap()).unwrap();
            contexts.push((id, ctx));
        }
        let (directory, locks, counters, busy, ops) = (
            directory.clone(),
            Arc::clone(&locks),
            Arc::clone(&counters),
            Arc::clone(&busy),
            w.ops,
        );
        jobs.push((cpu, move |clock: CoreClock| async move {
            let done = Rc::new(std::cell::Cell::new(0u64));
            let last = Rc::new(std::cell::Cell::new(0u64));
            let mut tasks = Vec::new();
            for (id, ctx) in contexts {
                let mut client = DecLockClient::<_, CAP>::new(
                    Clocked::with_clock(ctx, clock),
                    id,
                    directory.clone(),
                    Rc::new(NoFailures),
                    DecLockConfig::default(),
                    u64::from(id) + 1,
                )
                .expect("client");
                let (locks, counters, busy, done, last) = (
                    Arc::clone(&locks),
                    Arc::clone(&counters),
                    Arc::clone(&busy),
                    Rc::clone(&done),
                    Rc::clone(&last),
                );
                tasks.push(async move {
                    clock.sleep_until(start).await;
                    let mut rng = u64::from(id) * 0x9e37_79b9 + 1;
                    let mut n = 0;
                    while n < ops && clock.now() < deadline {
                        let i = (next(&mut rng) % locks.len() as u64) as usize;
                        let held = client
                            .acquire(locks[i], LockMode::Exclusive)
                            .await
                            .expect("acquire");
                        let ctx = client.context();
                        let v = u64::from_le_bytes(
                            ctx.read(counters[i], 8).await.unwrap().try_into().unwrap(),
                        );
                        YieldOnce(false).await;
                        ctx.write(counters[i], &(v + 1).to_le_bytes())
                            .await
                            .unwrap();
                        client.release(held).await.expect("release");
                        n += 1;
                    }
                    done.set(done.get() + n);
                    last.set(last.get().max(clock.now()));
                    busy.fetch_sub(1, Ordering::SeqCst);
                    // Keep answering DecLock's control messages until every client is done.
                    while busy.load(Ordering::SeqCst) > 0 {
                        client
                            .idle_until(clock.now() + 200_000)
                            .await
                            .expect("idle");
                    }
                });
            }
            join_all(tasks).await;
            (done.get(), last.get())
        }));
    }
    let results = run_per_core(kind, jobs).expect("executors ran");
    let acquisitions = results.iter().map(|r| r.0).sum();
    let end = results.iter().map(|r| r.1).max().unwrap_or(start);
    let mut check = fabric
        .context(Endpoint {
            node: NodeId(101),
            port: Port(0),
        })
        .unwrap();
    check.add_link(mn.link(NodeId(101)).unwrap()).unwrap();
    let counters_sum = dmem_runtime::Executor::new().block_on(async {
        let mut sum = 0;
        for i in 0..w.locks {
            sum += u64::from_le_bytes(
                check
                    .read(counter_at(i), 8)
                    .await
                    .unwrap()
                    .try_into()
                    .unwrap(),
            );
        }
        sum
    });
    Outcome {
        acquisitions,
        counters: counters_sum,
        elapsed_ns: end.saturating_sub(start),
    }
}

/// Polls every future until all are done (no executor's own join: protocol-side code).
async fn join_all<F: Future<Output = ()>>(futures: Vec<F>) {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    std::future::poll_fn(move |cx| {
        futures.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if futures.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
}
