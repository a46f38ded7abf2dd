//! Prints records and value bytes of every workload at every preset (the README's table).
//!
//! `cargo run -p dmem-workloads --example sizes`

use dmem_workloads::{AnyWorkload, Scale, WORKLOAD_NAMES, Workload};

fn main() {
    println!("| workload | preset | records | values (MiB) |");
    println!("|---|---|---:|---:|");
    for name in WORKLOAD_NAMES {
        for scale in Scale::ALL {
            let w = AnyWorkload::new(name, scale).expect("known workload");
            let records: u64 = w.tables().iter().map(|t| t.expected_records).sum();
            println!(
                "| {name} | {} | {records} | {:.1} |",
                scale.name(),
                w.value_bytes() as f64 / (1 << 20) as f64
            );
        }
    }
}
