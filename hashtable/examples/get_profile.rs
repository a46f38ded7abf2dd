//! A fixed amount of Get work for instruction-level profiling (callgrind):
//! `valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*run_*' \
//!  target/release/examples/get_profile [keys] [gets] [compact|fast]`; instruction counts per Get are
//! `Ir(run_*) / gets`. Keys are random and present, as in `dmem bench hashtable`.

mod common;

use std::hint::black_box;

use common::{filled, key_of, run_get_b1, run_get_b24};
use dmem_hashtable::{Sizing, mix64};

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let gets: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(240_000);
    let sizing = match args.next().as_deref() {
        Some("fast") => Sizing::Fast,
        _ => Sizing::Compact,
    };
    let t = filled(n, sizing);
    let keys: Vec<u64> = (0..gets).map(|i| key_of(mix64(i) % n)).collect();
    let g = t.pin();
    black_box(run_get_b1(&g, &keys));
    black_box(run_get_b24(&g, &keys));
    let m = t.memory_usage();
    println!(
        "{n} keys, {sizing:?}: {} bins, singles {}/{}, wides {}/{}, {:.1} B/entry reserved",
        m.bins,
        m.singles_used,
        m.singles_reserved,
        m.wides_used,
        m.wides_reserved,
        m.bytes_per_entry()
    );
}
