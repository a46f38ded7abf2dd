//! Log regions sized from the workload's largest write set (issue #12): each protocol's
//! computed region holds the log of TPC-C's largest transactions in its own format, and
//! workloads whose write sets fit 4 KiB keep exactly 4 KiB.

use dmem_deploy::{DeploySpec, TableDemand};
use dmem_ford::ProtocolConfig;
use dmem_ford::wire::lock_log_offset;
use dmem_layout::log::{DataLogEntry, LogOp, LogWriter};
use dmem_layout::record::RemoteAddr;
use dmem_lotus::recovery::{CommitLog, LogEntry};
use dmem_protocols::FordProtocol;
use dmem_protocols::lotus::commit_log_region_bytes;
use dmem_txn::TableId;
use dmem_workloads::tpcc::{self, Tpcc, TpccConfig};
use dmem_workloads::{AnyWorkload, Scale, WORKLOAD_NAMES, Workload};

/// `workload`'s tables and write sets as a [`DeploySpec`] (what the harness builds).
fn spec_of<W: Workload>(workload: &W) -> DeploySpec {
    let tables = workload
        .tables()
        .iter()
        .map(|t| TableDemand {
            id: t.id,
            value_len: t.value_size,
            expected_records: t.expected_records,
            grows: t.grows,
        })
        .collect();
    let mut spec = DeploySpec::new(tables, 8);
    spec.write_sets = workload.write_sets();
    spec
}

fn value_len(spec: &DeploySpec, table: TableId) -> usize {
    spec.tables
        .iter()
        .find(|t| t.id == table)
        .unwrap()
        .value_len
}

/// Whether FORD's undo log of `set` (every record with its table's value as old image) fits
/// the undo part of a region of `region` bytes (with the lock log at its tail).
fn ford_undo_log_fits(spec: &DeploySpec, set: &[(TableId, u32)], region: u32) -> bool {
    let undo_bytes = lock_log_offset(region as usize).unwrap();
    let mut buf = vec![0u8; undo_bytes];
    let mut writer = LogWriter::new(&mut buf, 3, 1, 1).unwrap();
    for &(table, records) in set {
        let old = vec![0xAB; value_len(spec, table)];
        for key in 0..u64::from(records) {
            let entry = DataLogEntry {
                op: LogOp::Update,
                table_id: table.0,
                key,
                addr: RemoteAddr::new(1, 64 * key).unwrap(),
                version: 7,
            };
            if writer.append_undo(&entry, &old).is_err() {
                return false;
            }
        }
    }
    true
}

fn tpcc() -> Tpcc {
    Tpcc::new(TpccConfig::preset(Scale::Ford))
}

fn new_order(spec: &DeploySpec) -> &[(TableId, u32)] {
    let set = &spec.write_sets[0];
    assert!(
        set.contains(&(tpcc::STOCK, tpcc::MAX_ORDER_LINES)),
        "{set:?}"
    );
    set
}

#[test]
fn ford_region_holds_tpcc_new_order_and_every_write_set() {
    let spec = spec_of(&tpcc());
    let ford = FordProtocol::new(
        "pandora-lock-logging",
        ProtocolConfig::pandora_lock_logging(),
    );
    let region = ford.store_config(&spec, 2).log_region_bytes;
    assert!(
        !ford_undo_log_fits(&spec, new_order(&spec), 4096),
        "a 15-line New-Order's undo log must not fit 4 KiB, or this test proves nothing"
    );
    assert!(ford_undo_log_fits(&spec, new_order(&spec), region));
    for set in &spec.write_sets {
        assert!(
            ford_undo_log_fits(&spec, set, region),
            "{set:?} in {region} B"
        );
    }
    // Sized, not padded: 8 bytes less would not hold the largest write set.
    assert!(
        spec.write_sets
            .iter()
            .any(|set| !ford_undo_log_fits(&spec, set, region - 8)),
        "{region} B is more than the largest write set needs"
    );
}

#[test]
fn lotus_region_holds_tpcc_commit_logs() {
    let spec = spec_of(&tpcc());
    let region = commit_log_region_bytes(&spec) as usize;
    for set in &spec.write_sets {
        let entries: Vec<LogEntry> = set
            .iter()
            .flat_map(|&(table, records)| {
                (0..u64::from(records)).map(move |offset| LogEntry {
                    table,
                    partition: 1,
                    cell: 2,
                    offset: 64 * offset,
                })
            })
            .collect();
        let log = CommitLog { writer: 9, entries };
        assert!(log.emit().len() <= region, "{set:?}");
    }
    // LOTUS logs 16 bytes per record written, so even Delivery's 190 fit the floor.
    assert_eq!(region, 4096);
    assert!(!new_order(&spec).is_empty());
}

#[test]
fn workloads_that_fit_keep_the_4_kib_floor() {
    let ford = FordProtocol::new("ford", ProtocolConfig::ford_fixed());
    for name in WORKLOAD_NAMES.iter().filter(|&&n| n != "tpcc") {
        let spec = spec_of(&AnyWorkload::new(name, Scale::Ford).unwrap());
        assert_eq!(ford.store_config(&spec, 2).log_region_bytes, 4096, "{name}");
        assert_eq!(commit_log_region_bytes(&spec), 4096, "{name}");
    }
    // A spec with no write sets (litmus, hand-built specs) keeps its own floor.
    let mut spec = spec_of(&tpcc());
    spec.write_sets.clear();
    spec.log_region_bytes = 1024;
    assert_eq!(ford.store_config(&spec, 2).log_region_bytes, 1024);
}
