//! Simulator speed: simulated one-sided operations per real second on one core.
//!
//! 4 CNs x 4 cores x 4 coroutines post lists of 64-byte READs (1 or 16 per doorbell), single
//! CAS or lists of 8 WRITEs of 8 bytes (cx5) for 200 µs of virtual time; criterion reports
//! real time per run, and the throughput line gives simulated work requests per real second.
//! `read64_batch16_saturated` is `dmem perf`'s READ x16 row (1 MN, 8 CNs x 4 cores x 8
//! coroutines): the MN's READ engine is saturated and its READs wait ≈10 µs to execute, so
//! it measures the event queue with many events far ahead.
#![allow(missing_docs)] // criterion_group! generates undocumented public functions

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use dmem_sim::{ClusterConfig, Sim};
use dmem_verbs::{Clock, OpKind, PostList, Verbs};

/// The cluster's shape: MNs, CNs, cores per CN, coroutines per core.
#[derive(Clone, Copy)]
struct Shape {
    mns: u16,
    cns: u16,
    threads: u16,
    coroutines: u64,
}

const SMALL: Shape = Shape {
    mns: 2,
    cns: 4,
    threads: 4,
    coroutines: 4,
};

fn workload(kind: OpKind, batch: u64, shape: Shape) -> (Sim, u64) {
    let sim = Sim::new(
        ClusterConfig::new("cx5")
            .unwrap()
            .mns(shape.mns)
            .cns(shape.cns)
            .threads_per_cn(shape.threads)
            .mn_memory_bytes(1 << 20),
    )
    .unwrap();
    for cn in 0..shape.cns {
        for thread in 0..shape.threads {
            let ctx = sim.context(sim.cn(cn), thread).unwrap();
            for k in 0..shape.coroutines {
                let c = ctx.clone();
                let region = sim.region(sim.mn((k % u64::from(shape.mns)) as u16));
                let client = (u64::from(cn) * u64::from(shape.threads) + u64::from(thread))
                    * shape.coroutines
                    + k;
                let base = client * 64 * batch;
                sim.spawn(&ctx, async move {
                    let mut round = 0;
                    while c.now() < 200_000 {
                        let mut list = PostList::new();
                        for i in 0..batch {
                            let addr = region.at(base + i * 64).unwrap();
                            match kind {
                                OpKind::Read => drop(list.read(addr, 64)),
                                OpKind::Write => drop(list.write(addr, &[7; 8])),
                                OpKind::Cas => drop(list.cas(addr, round, round + 1)),
                                OpKind::Faa => drop(list.faa(addr, 1)),
                            }
                        }
                        c.post(list).await.unwrap();
                        round += 1;
                    }
                });
            }
        }
    }
    sim.run_until_idle();
    let ops = sim.stats().total_ops();
    (sim, ops)
}

fn simulator_speed(c: &mut Criterion) {
    let mut group = c.benchmark_group("simulator");
    group.sample_size(10);
    let saturated = Shape {
        mns: 1,
        cns: 8,
        threads: 4,
        coroutines: 8,
    };
    for (name, kind, batch, shape) in [
        ("read64_single", OpKind::Read, 1u64, SMALL),
        ("read64_batch16", OpKind::Read, 16, SMALL),
        ("cas_single", OpKind::Cas, 1, SMALL),
        ("write8_batch8", OpKind::Write, 8, SMALL),
        ("read64_batch16_saturated", OpKind::Read, 16, saturated),
    ] {
        let (_, ops) = workload(kind, batch, shape);
        group.throughput(Throughput::Elements(ops));
        group.bench_function(name, |b| b.iter(|| workload(kind, batch, shape).1));
    }
    group.finish();
}

criterion_group!(benches, simulator_speed);
criterion_main!(benches);
