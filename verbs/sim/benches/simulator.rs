//! Simulator speed: simulated one-sided operations per real second on one core.
//!
//! 4 CNs x 4 cores x 4 coroutines post single READs of 64 B (cx5) or lists of 8 WRITEs for
//! 200 µs of virtual time; criterion reports real time per run, and the throughput line
//! gives simulated work requests per real second.
#![allow(missing_docs)] // criterion_group! generates undocumented public functions

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use dmem_sim::{ClusterConfig, Sim};
use dmem_verbs::{Clock, PostList, Verbs};

fn workload(batch: u64) -> (Sim, u64) {
    let sim = Sim::new(
        ClusterConfig::new("cx5")
            .unwrap()
            .mns(2)
            .cns(4)
            .threads_per_cn(4)
            .mn_memory_bytes(1 << 20),
    )
    .unwrap();
    for cn in 0..4 {
        for thread in 0..4 {
            let ctx = sim.context(sim.cn(cn), thread).unwrap();
            for k in 0..4u64 {
                let c = ctx.clone();
                let region = sim.region(sim.mn((k % 2) as u16));
                let base = (u64::from(cn) * 16 + u64::from(thread) * 4 + k) * 64 * batch;
                sim.spawn(&ctx, async move {
                    while c.now() < 200_000 {
                        let mut list = PostList::new();
                        for i in 0..batch {
                            let addr = region.at(base + i * 64).unwrap();
                            if batch == 1 {
                                list.read(addr, 64);
                            } else {
                                list.write(addr, &[7; 8]);
                            }
                        }
                        c.post(list).await.unwrap();
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
    for batch in [1u64, 8] {
        let (_, ops) = workload(batch);
        group.throughput(Throughput::Elements(ops));
        let name = if batch == 1 {
            "read64_single"
        } else {
            "write8_batch8"
        };
        group.bench_function(name, |b| b.iter(|| workload(batch).1));
    }
    group.finish();
}

criterion_group!(benches, simulator_speed);
criterion_main!(benches);
