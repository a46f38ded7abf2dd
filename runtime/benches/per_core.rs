//! The polling executor against glommio on the same DecLock-on-shm workload
//! (`tests/common/declock_shm.rs`): acquisitions per second, each executor kind run in
//! turn, three times.
//!
//! `cargo bench -p dmem-runtime --features glommio --bench per_core [-- MS [LOCKS]]` (MS =
//! measured wall-clock per run, default 1000; LOCKS default 4: fewer means more waiting). Without the feature only the polling executor runs.

#[path = "../tests/common/declock_shm.rs"]
mod declock_shm;

use declock_shm::{Workload, run};
use dmem_runtime::ExecutorKind;

fn main() {
    // `cargo bench` passes `--bench`; the numbers are the duration and the lock count.
    let numbers: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let ms = numbers.first().copied().unwrap_or(1000);
    let locks = numbers
        .get(1)
        .map_or(4, |&l| u32::try_from(l.clamp(1, 4096)).unwrap_or(4));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let w = Workload {
        cores: (0..2).map(|i| i % cpus).collect(),
        clients_per_core: 4,
        locks,
        ops: u64::MAX,
        duration_ns: ms * 1_000_000,
    };
    let kinds = [
        ExecutorKind::Polling,
        #[cfg(feature = "glommio")]
        ExecutorKind::Glommio,
    ];
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "DecLock on shm: {} cores x {} clients, {} locks, exclusive, {ms} ms per run; load average before: {}",
        w.cores.len(),
        w.clients_per_core,
        w.locks,
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut rates: Vec<(ExecutorKind, Vec<f64>)> = kinds.iter().map(|&k| (k, Vec::new())).collect();
    for round in 0..3 {
        for (kind, r) in &mut rates {
            let o = run(*kind, &w);
            assert_eq!(o.counters, o.acquisitions, "mutual exclusion");
            let rate = o.acquisitions as f64 / (o.elapsed_ns.max(1) as f64 / 1e9);
            println!(
                "run {round} {:<8} {:>10.0} acquisitions/s",
                kind.name(),
                rate
            );
            r.push(rate);
        }
    }
    for (kind, mut r) in rates {
        r.sort_by(f64::total_cmp);
        println!(
            "median {:<8} {:>10.0} acquisitions/s",
            kind.name(),
            r[r.len() / 2]
        );
    }
}
