//! DrTM (lease-based shared locks, OOCC §II-A) on the same bank: strictly serializable.

mod common;

use common::*;
use dmem_occ::OoccProtocol;
use dmem_occ::drtm::DrtmConfig;

#[test]
fn drtm_bank_is_strictly_serializable() {
    for seed in 1..=2 {
        let p = OoccProtocol::drtm("drtm", DrtmConfig::default());
        let (history, audits, commits) = bank(&p, seed);
        assert!(
            audits > 50 && commits > 20,
            "{audits} audits, {commits} transfers"
        );
        verdict(&history.borrow()).unwrap();
    }
}

/// DSLR two-phase locking on the same bank: strictly serializable.
#[test]
fn dslr_bank_is_strictly_serializable() {
    for seed in 1..=2 {
        let p = OoccProtocol::dslr("dslr", dmem_occ::dslr2pl::DslrConfig::default());
        let (history, audits, commits) = bank(&p, seed);
        assert!(
            audits > 50 && commits > 20,
            "{audits} audits, {commits} transfers"
        );
        verdict(&history.borrow()).unwrap();
    }
}
