//! Motor's memory on a large SmallBank: the MN bytes the CVT store needs (computed before
//! anything is allocated) next to the process's peak RSS after loading and a short run.
//!
//! `cargo run --release -p dmem-harness --example motor_footprint -- [accounts] [protocol]`
//! (default 1,000,000 accounts, i.e. 2,000,000 records (savings + checking), on `motor`).

use dmem_deploy::ClusterShape;
use dmem_harness::{BenchConfig, deploy_spec, run_bench};
use dmem_sim::NicProfile;
use dmem_workloads::{
    AnyWorkload, Scale, Workload, smallbank::SmallBank, smallbank::SmallBankConfig,
};

fn status(field: &str) -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .map(|l| l[field.len()..].trim().to_owned())
        })
        .unwrap_or_else(|| "n/a".to_owned())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let accounts: u64 = args.next().map_or(Ok(1_000_000), |a| a.parse())?;
    let protocol = args.next().unwrap_or_else(|| "motor".to_owned());
    let mut cfg = SmallBankConfig::preset(Scale::Small);
    cfg.accounts = accounts;
    cfg.hot_accounts = accounts / 25;
    let workload = AnyWorkload::SmallBank(SmallBank::new(cfg));
    let shape = ClusterShape {
        mns: 3,
        cns: 2,
        threads: 4,
        seed: 1,
        profile: NicProfile::cx5(),
        min_mn_bytes: 0,
        message_faults: dmem_sim::MessageFaults::default(),
    };
    let bench = BenchConfig {
        shape: shape.clone(),
        coroutines: 8,
        duration: 1_000_000,
        seed: 1,
        check: false,
        warm_cache: true,
        check_segment: None,
        max_attempts: dmem_harness::MAX_ATTEMPTS,
        backoff: dmem_harness::Backoff::None,
    };
    let p = dmem_protocols::registry().get(&protocol)?;
    let spec = deploy_spec(&workload, bench.coordinators()?);
    let per_mn = p.mn_bytes_per_mn(&spec, shape.mns)?;
    let records: u64 = workload.tables().iter().map(|t| t.expected_records).sum();
    println!("{protocol}: smallbank {accounts} accounts = {records} records, 3 MNs, 3 replicas");
    println!(
        "store needs {per_mn} B per MN, {} B on 3 MNs ({:.1} MiB), before allocating",
        per_mn * 3,
        (per_mn * 3) as f64 / (1 << 20) as f64
    );
    println!("RSS before the run: {}", status("VmRSS:"));
    let r = run_bench(&*p, &workload, &bench, |_| {})?;
    println!(
        "ran 1 ms: {:.3} Mtps, invariants {}; RSS {} (peak {})",
        r.mtps,
        r.invariants,
        status("VmRSS:"),
        status("VmHWM:")
    );
    Ok(())
}
