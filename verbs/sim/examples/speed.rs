//! One run of the simulator-speed workload, for profilers (`valgrind --tool=callgrind`):
//! `cargo run --release -p dmem-sim --example speed -- read 1 200`
//! (op `read`, `write`, `cas` or `faa`; work requests per list; µs of virtual time).
//! Prints the work requests simulated, the real time and their ratio.

use dmem_sim::{ClusterConfig, Sim};
use dmem_verbs::{Clock, OpKind, PostList, Verbs};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let kind = match args.get(1).map_or("read", String::as_str) {
        "read" => OpKind::Read,
        "write" => OpKind::Write,
        "cas" => OpKind::Cas,
        "faa" => OpKind::Faa,
        other => {
            eprintln!("speed: unknown op {other} (read, write, cas, faa)");
            std::process::exit(1);
        }
    };
    let batch: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
    let micros: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(200);
    let start = std::time::Instant::now();
    let sim = Sim::new(
        ClusterConfig::new("cx5")
            .expect("cx5 is a built-in profile")
            .mns(2)
            .cns(4)
            .threads_per_cn(4)
            .mn_memory_bytes(1 << 20),
    )
    .expect("a valid cluster");
    let end = micros * 1000;
    for cn in 0..4 {
        for thread in 0..4 {
            let ctx = sim.context(sim.cn(cn), thread).expect("a CN thread");
            for k in 0..4u64 {
                let c = ctx.clone();
                let region = sim.region(sim.mn((k % 2) as u16));
                let base = (u64::from(cn) * 16 + u64::from(thread) * 4 + k) * 64 * batch;
                sim.spawn(&ctx, async move {
                    let mut round = 0;
                    while c.now() < end {
                        let mut list = PostList::with_capacity(batch as usize);
                        for i in 0..batch {
                            let addr = region.at(base + i * 64).expect("in the region");
                            match kind {
                                OpKind::Read => drop(list.read(addr, 64)),
                                OpKind::Write => drop(list.write(addr, &[7; 8])),
                                OpKind::Cas => drop(list.cas(addr, round, round + 1)),
                                OpKind::Faa => drop(list.faa(addr, 1)),
                            }
                        }
                        c.post(list).await.expect("no faults in this run");
                        round += 1;
                    }
                });
            }
        }
    }
    sim.run_until_idle();
    let real = start.elapsed().as_secs_f64();
    let ops = sim.stats().total_ops();
    println!(
        "{ops} work requests in {real:.3} s real: {:.2} M/s, digest {}",
        ops as f64 / real / 1e6,
        sim.digest()
    );
}
