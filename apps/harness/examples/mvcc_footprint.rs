//! Where the MN bytes of Motor's and LOTUS's multi-version store go for a workload, per
//! table, computed before anything is allocated (`dmem-motor`'s README, "Hashed tables
//! pooled", quotes it for TPC-C small).
//!
//! `cargo run --release -p dmem-harness --example mvcc_footprint -- [workload] [scale]
//! [coordinators] [versions] [duration_ms]` (default `tpcc small 288`: 9 CNs × 4 threads ×
//! 8 coroutines; 3 MNs, 3 replicas; versions per record: as Motor's code per workload unless
//! given, e.g. 2 as LOTUS §8 runs both; with a duration, the insert shares are sized for a
//! `dmem bench` run of that many ms on the LOTUS testbed — cx3, 9 CNs × 4 threads — as the
//! bench sizes them, else by the tables).

use dmem_deploy::ClusterShape;
use dmem_harness::{Backoff, BenchConfig, MAX_ATTEMPTS, deploy_spec, run_spec};
use dmem_motor::cells_for_workload;
use dmem_motor::mvcc::{self, Shapes, VersionLayout};
use dmem_sim::NicProfile;
use dmem_workloads::{AnyWorkload, Scale, Workload};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "tpcc".to_owned());
    let scale = args.next().unwrap_or_else(|| "small".to_owned());
    let coordinators: u16 = args.next().map_or(Ok(288), |a| a.parse())?;
    let versions: Option<usize> = args.next().map(|a| a.parse()).transpose()?;
    let duration_ms: Option<u64> = args.next().map(|a| a.parse()).transpose()?;
    let workload = AnyWorkload::new(
        &name,
        Scale::from_name(&scale).ok_or(format!("unknown scale `{scale}`"))?,
    )?;
    let spec = match duration_ms {
        None => deploy_spec(&workload, coordinators),
        Some(ms) => {
            let cfg = BenchConfig {
                shape: ClusterShape {
                    mns: 3,
                    cns: 9,
                    threads: 4,
                    seed: 1,
                    profile: NicProfile::named("cx3")?,
                    min_mn_bytes: 1 << 20,
                    message_faults: dmem_sim::MessageFaults::default(),
                },
                coroutines: (coordinators / 36).max(1),
                duration: ms * 1_000_000,
                seed: 1,
                check: true,
                warm_cache: true,
                check_segment: None,
                max_attempts: MAX_ATTEMPTS,
                backoff: Backoff::None,
            };
            run_spec(&workload, &cfg)?
        }
    };
    let cells = versions.unwrap_or_else(|| cells_for_workload(Some(workload.name())));
    for layout in [VersionLayout::FullRecords, VersionLayout::Deltas] {
        let shapes = Shapes::uniform(&spec.tables, cells).with_layout(layout);
        // As `dmem-protocols` lays Motor's and LOTUS's stores out.
        let cfg = mvcc::store_config(3, &spec.tables, &shapes, 3, spec.index_slack, false)
            .coordinators(coordinators)
            .with_pools(&spec.tables, spec.direct_tables(), spec.index_slack, true)
            .with_insert_room(&spec.insert_room);
        let f = cfg.footprint(&spec.tables)?;
        println!(
            "{name} {scale}, {layout:?}, {cells} cells: {:.0} MB per MN, {:.0} MB touched before inserts",
            f.bytes_per_mn as f64 / 1e6,
            f.resident_before_inserts_per_mn() as f64 / 1e6
        );
        println!(
            "table | block B | pooled | index MB | loaded blocks MB | insert shares MB (per MN)"
        );
        for t in &f.tables {
            println!(
                "{} | {} | {} | {:.0} | {:.0} | {:.0}",
                t.id.0,
                t.item_len,
                t.pooled,
                t.index_bytes as f64 / 1e6,
                t.record_bytes as f64 / 1e6,
                t.insert_bytes as f64 / 1e6
            );
        }
    }
    let suffix = versions
        .map(|v| format!(":versions={v}"))
        .unwrap_or_default();
    for p in ["lotus", "motor"]
        .map(|p| format!("{p}{suffix}"))
        .into_iter()
        .chain(["ford".to_owned()])
    {
        let protocol = dmem_protocols::registry().get(&p)?;
        println!(
            "{p}: {:.0} MB per MN",
            protocol.mn_bytes_per_mn(&spec, 3)? as f64 / 1e6
        );
    }
    Ok(())
}
