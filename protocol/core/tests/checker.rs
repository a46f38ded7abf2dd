//! The history checker on hand-made histories (one per anomaly, and valid ones), on histories
//! produced by a serial model executor (quickcheck), and on a 200k-transaction history.

use std::collections::BTreeMap;

use dmem_txn::checker::{Dependency, Malformation};
use dmem_txn::{
    Anomaly, AnomalyKind, CheckOptions, CoordinatorId, CycleClass, History, Isolation, Key,
    ReadEvent, Report, TableId, TxnId, TxnOutcome, TxnRecord, Version, WriteEvent, WriteKind,
    check, check_with,
};
use quickcheck::TestResult;
use quickcheck_macros::quickcheck;

use TxnOutcome::{Aborted, Committed, Unknown};
use WriteKind::{Delete, Insert, Update};

fn id(seq: u64) -> TxnId {
    TxnId {
        coordinator: CoordinatorId(1),
        seq,
    }
}

/// A transaction: `reads` as `(key, version)` and `writes` as `(key, version, kind)`, all in
/// table 0.
fn txn(
    seq: u64,
    span: (u64, u64),
    outcome: TxnOutcome,
    reads: &[(u64, u64)],
    writes: &[(u64, u64, WriteKind)],
) -> TxnRecord {
    TxnRecord {
        id: id(seq),
        begin: span.0,
        end: span.1,
        outcome,
        reads: reads
            .iter()
            .map(|&(k, v)| ReadEvent::new(TableId(0), Key(k), Version(v)))
            .collect(),
        writes: writes
            .iter()
            .map(|&(k, v, kind)| WriteEvent {
                table: TableId(0),
                key: Key(k),
                version: Version(v),
                kind,
            })
            .collect(),
    }
}

fn history(txns: Vec<TxnRecord>) -> History {
    History {
        txns,
        ..History::new()
    }
}

fn assert_ok(h: &History) -> Report {
    let r = check(h);
    assert!(r.is_ok(), "expected a valid history, got: {r}");
    r
}

/// The only anomaly is one of `kind`.
fn only(h: &History, kind: AnomalyKind) -> Anomaly {
    let r = check(h);
    assert_eq!(r.total(), 1, "expected exactly one {kind}, got: {r}");
    assert_eq!(r.anomalies[0].kind(), kind, "got: {r}");
    r.anomalies[0].clone()
}

fn cycle_labels(a: &Anomaly) -> Vec<&'static str> {
    a.cycle()
        .expect("a cycle")
        .steps
        .iter()
        .map(|s| s.dependency.label())
        .collect()
}

/// The steps form a closed walk.
fn assert_closed(a: &Anomaly) {
    let c = a.cycle().expect("a cycle");
    for (i, s) in c.steps.iter().enumerate() {
        let next = &c.steps[(i + 1) % c.steps.len()];
        assert_eq!(s.to, next.from, "steps do not chain: {a}");
    }
}

// ---------------------------------------------------------------------------------------------
// Valid histories
// ---------------------------------------------------------------------------------------------

#[test]
fn empty_history_is_ok() {
    let r = assert_ok(&History::new());
    assert_eq!(r.stats.transactions, 0);
}

#[test]
fn serial_history_is_ok_and_counts_edges() {
    let h = history(vec![
        txn(
            1,
            (0, 10),
            Committed,
            &[(1, 0)],
            &[(1, 1, Update), (2, 1, Update)],
        ),
        txn(2, (20, 30), Committed, &[(1, 1)], &[(1, 2, Update)]),
        txn(3, (40, 50), Committed, &[(1, 2), (2, 1)], &[]),
    ]);
    let r = assert_ok(&h);
    assert_eq!(r.stats.committed, 3);
    assert_eq!(r.stats.reads, 4);
    assert_eq!(r.stats.ww_edges, 1); // T1 -> T2 on key 1
    assert_eq!(r.stats.wr_edges, 3); // T1 -> T2, T2 -> T3, T1 -> T3
    assert_eq!(r.stats.rw_edges, 0); // T1 read v0 and overwrote it itself
    assert_eq!(r.stats.time_points, 3);
    assert!(r.to_string().contains("no anomaly"));
}

#[test]
fn concurrent_non_conflicting_is_ok() {
    let h = history(vec![
        txn(1, (0, 100), Committed, &[(1, 0)], &[(1, 1, Update)]),
        txn(2, (10, 90), Committed, &[(2, 0)], &[(2, 1, Update)]),
        txn(3, (20, 80), Committed, &[(3, 0)], &[(3, 1, Update)]),
    ]);
    assert_ok(&h);
}

#[test]
fn read_only_snapshot_concurrent_with_writer_is_ok() {
    // R reads the old x and y while W replaces both: R serializes before W.
    let h = history(vec![
        txn(
            1,
            (0, 10),
            Committed,
            &[],
            &[(1, 1, Update), (2, 1, Update)],
        ),
        txn(
            2,
            (20, 60),
            Committed,
            &[],
            &[(1, 2, Update), (2, 2, Update)],
        ),
        txn(3, (30, 50), Committed, &[(1, 1), (2, 1)], &[]),
        txn(4, (70, 80), Committed, &[(1, 2), (2, 2)], &[]),
    ]);
    let r = assert_ok(&h);
    assert_eq!(r.stats.rw_edges, 1); // two reads, one edge R -> W
    assert_eq!(r.stats.wr_edges, 2); // T1 -> R, W -> T4
}

#[test]
fn inserts_and_deletes_are_ok() {
    let h = history(vec![
        txn(1, (0, 10), Committed, &[(5, 0)], &[(5, 1, Insert)]),
        txn(2, (20, 30), Committed, &[(5, 1)], &[(5, 2, Delete)]),
        // Reads the tombstone, then re-inserts.
        txn(3, (40, 50), Committed, &[(5, 2)], &[(5, 3, Insert)]),
        txn(4, (60, 70), Committed, &[(5, 3)], &[(5, 4, Update)]),
        txn(5, (80, 90), Committed, &[(5, 4)], &[]),
    ]);
    assert_ok(&h);
}

#[test]
fn reading_own_writes_is_ok() {
    let h = history(vec![txn(
        1,
        (0, 10),
        Committed,
        &[(1, 0), (1, 1), (1, 2)],
        &[(1, 1, Update), (1, 2, Update)],
    )]);
    assert_ok(&h);
}

#[test]
fn unknown_outcome_observed_counts_committed() {
    // The coordinator of T1 crashed; recovery rolled it forward and T2 saw its write.
    let h = history(vec![
        txn(1, (0, 10), Unknown, &[], &[(1, 1, Update)]),
        txn(2, (20, 30), Committed, &[(1, 1)], &[]),
    ]);
    let r = assert_ok(&h);
    assert_eq!(r.stats.unknown_committed, 1);
    assert_eq!(r.stats.wr_edges, 1);
}

#[test]
fn unknown_outcome_unobserved_counts_aborted_and_its_number_may_be_reused() {
    // T1 crashed and was rolled back; FORD-style counters give T2 the same version number.
    let h = history(vec![
        txn(1, (0, 10), Unknown, &[], &[(1, 1, Update)]),
        txn(2, (20, 30), Committed, &[(1, 0)], &[(1, 1, Update)]),
        txn(3, (40, 50), Committed, &[(1, 1)], &[]),
    ]);
    let r = assert_ok(&h);
    assert_eq!(r.stats.unknown_aborted, 1);
    assert_eq!(r.stats.unknown_committed, 0);
}

#[test]
fn unknown_counted_committed_transitively() {
    // U2 read U1's write; T3 read U2's write: both count committed.
    let h = history(vec![
        txn(1, (0, 10), Unknown, &[], &[(1, 1, Update)]),
        txn(2, (20, 30), Unknown, &[(1, 1)], &[(2, 1, Update)]),
        txn(3, (40, 50), Committed, &[(2, 1)], &[]),
    ]);
    let r = assert_ok(&h);
    assert_eq!(r.stats.unknown_committed, 2);
}

#[test]
fn aborted_version_number_reused_by_committed_write_is_ok() {
    let h = history(vec![
        txn(1, (0, 10), Aborted, &[], &[(1, 1, Update)]),
        txn(2, (20, 30), Committed, &[], &[(1, 1, Update)]),
        txn(3, (40, 50), Committed, &[(1, 1)], &[]),
    ]);
    assert_ok(&h);
}

#[test]
fn unknown_unobserved_insert_hides_the_write_kind_order() {
    // T2 deleted k; U3 re-inserted it (unobserved, so counted aborted); T4 updated it. The
    // update after a delete is explained by U3 having been applied: no mismatch reported.
    let h = history(vec![
        txn(1, (0, 10), Committed, &[], &[(1, 1, Update)]),
        txn(2, (20, 30), Committed, &[], &[(1, 2, Delete)]),
        txn(3, (40, 50), Unknown, &[], &[(1, 3, Insert)]),
        txn(4, (60, 70), Committed, &[], &[(1, 4, Update)]),
    ]);
    assert_ok(&h);
}

#[test]
fn serializable_but_not_strict_passes_without_real_time() {
    // A stale read: fine for serializability, not for strict serializability.
    let h = history(vec![
        txn(1, (0, 10), Committed, &[], &[(1, 1, Update)]),
        txn(2, (20, 30), Committed, &[(1, 0)], &[]),
    ]);
    let r = check_with(
        &h,
        &CheckOptions {
            strict: false,
            max_anomalies: 8,
            ..CheckOptions::default()
        },
    );
    assert!(r.is_ok(), "{r}");
    assert_eq!(r.stats.rt_edges, 0);
    assert!(!check(&h).is_ok());
}

// ---------------------------------------------------------------------------------------------
// Per-read and per-record anomalies
// ---------------------------------------------------------------------------------------------

#[test]
fn g1a_aborted_read() {
    let h = history(vec![
        txn(1, (0, 10), Aborted, &[], &[(7, 3, Update)]),
        txn(2, (5, 20), Committed, &[(7, 3)], &[]),
    ]);
    let a = only(&h, AnomalyKind::G1a);
    assert_eq!(
        a,
        Anomaly::AbortedRead {
            reader: id(2),
            table: TableId(0),
            key: Key(7),
            version: Version(3),
            writer: id(1),
            writer_outcome: Aborted,
        }
    );
    let text = a.to_string();
    assert!(text.contains("T1.2") && text.contains("T1.1") && text.contains("(t0, k7)"));
    assert!(text.contains("v3") && text.contains("aborted"), "{text}");
}

#[test]
fn reads_of_an_unknown_counted_committed_are_judged() {
    // U read an aborted write; T3 observed U's own write, so U counts committed and its read
    // is a G1a.
    let h = history(vec![
        txn(1, (0, 10), Aborted, &[], &[(7, 3, Update)]),
        txn(2, (5, 20), Unknown, &[(7, 3)], &[(8, 1, Update)]),
        txn(3, (30, 40), Committed, &[(8, 1)], &[]),
    ]);
    let a = only(&h, AnomalyKind::G1a);
    assert!(matches!(a, Anomaly::AbortedRead { reader, .. } if reader == id(2)));
    // Unobserved, U counts aborted and its read is not judged.
    let h = history(vec![
        txn(1, (0, 10), Aborted, &[], &[(7, 3, Update)]),
        txn(2, (5, 20), Unknown, &[(7, 3)], &[(8, 1, Update)]),
    ]);
    assert_ok(&h);
}

#[test]
fn aborted_reader_of_aborted_write_is_not_judged() {
    let h = history(vec![
        txn(1, (0, 10), Aborted, &[], &[(7, 3, Update)]),
        txn(2, (5, 20), Aborted, &[(7, 3)], &[]),
    ]);
    assert_ok(&h);
}

#[test]
fn g1b_intermediate_read() {
    let h = history(vec![
        txn(
            1,
            (0, 30),
            Committed,
            &[],
            &[(4, 1, Update), (4, 2, Update)],
        ),
        txn(2, (10, 40), Committed, &[(4, 1)], &[]),
    ]);
    let a = only(&h, AnomalyKind::G1b);
    assert_eq!(
        a,
        Anomaly::IntermediateRead {
            reader: id(2),
            table: TableId(0),
            key: Key(4),
            version: Version(1),
            writer: id(1),
            final_version: Version(2),
        }
    );
    assert!(a.to_string().contains("overwrote itself with v2"));
}

#[test]
fn phantom_version() {
    let h = history(vec![
        txn(1, (0, 10), Committed, &[], &[(1, 1, Update)]),
        txn(2, (20, 30), Committed, &[(1, 9)], &[]),
    ]);
    let a = only(&h, AnomalyKind::PhantomVersion);
    assert!(matches!(
        a,
        Anomaly::PhantomVersion { reader, version: Version(9), .. } if reader == id(2)
    ));
}

#[test]
fn dirty_read_of_unknown_that_was_rolled_back_is_a_lost_write() {
    // Pandora §5.1 "Lost Decision": T1's outcome is unknown; T2 observed its x, so it counts
    // committed, but its y was rolled back and T3 reused y's version number.
    let h = history(vec![
        txn(1, (0, 10), Unknown, &[], &[(1, 1, Update), (2, 1, Update)]),
        txn(2, (20, 30), Committed, &[(1, 1)], &[]),
        txn(3, (40, 50), Committed, &[(2, 0)], &[(2, 1, Update)]),
    ]);
    let r = check(&h);
    assert!(r.has(AnomalyKind::LostWrite), "{r}");
    assert_eq!(r.stats.unknown_committed, 1);
}

#[test]
fn lost_write_two_committed_installs_of_one_version() {
    let h = history(vec![
        txn(1, (0, 10), Committed, &[(3, 0)], &[(3, 1, Update)]),
        txn(2, (5, 15), Committed, &[], &[(3, 1, Update)]),
    ]);
    let a = only(&h, AnomalyKind::LostWrite);
    assert_eq!(
        a,
        Anomaly::LostWrite {
            table: TableId(0),
            key: Key(3),
            version: Version(1),
            first: id(1),
            second: id(2),
        }
    );
    assert!(
        a.to_string()
            .contains("both committed version v1 of (t0, k3)")
    );
}

#[test]
fn write_kind_mismatch_insert_over_present_and_update_of_tombstone() {
    let h = history(vec![
        txn(1, (0, 10), Committed, &[], &[(1, 1, Insert)]),
        txn(2, (20, 30), Committed, &[], &[(1, 2, Insert)]),
        txn(3, (40, 50), Committed, &[], &[(2, 1, Delete)]),
        txn(4, (60, 70), Committed, &[], &[(2, 2, Update)]),
    ]);
    let r = check(&h);
    assert_eq!(r.total(), 2, "{r}");
    assert!(
        r.anomalies
            .iter()
            .all(|a| a.kind() == AnomalyKind::WriteKindMismatch)
    );
    assert!(
        r.anomalies[0]
            .to_string()
            .contains("left the record present")
    );
    assert!(
        r.anomalies[1]
            .to_string()
            .contains("left the record absent")
    );
}

#[test]
fn malformed_records() {
    let h = history(vec![
        txn(1, (50, 10), Committed, &[], &[]),
        txn(2, (0, 5), Committed, &[], &[(1, 0, Update)]),
        txn(2, (6, 9), Committed, &[], &[]),
    ]);
    let r = check(&h);
    assert_eq!(r.total(), 3, "{r}");
    assert!(
        r.anomalies
            .iter()
            .all(|a| a.kind() == AnomalyKind::Malformed)
    );
    assert!(r.anomalies.contains(&Anomaly::Malformed {
        txn: id(1),
        problem: Malformation::EndBeforeBegin { begin: 50, end: 10 },
    }));
    assert!(r.anomalies.contains(&Anomaly::Malformed {
        txn: id(2),
        problem: Malformation::DuplicateId,
    }));
}

// ---------------------------------------------------------------------------------------------
// Cycles
// ---------------------------------------------------------------------------------------------

#[test]
fn g0_write_cycle() {
    // Pandora litmus 1 gone wrong: T1 wins x, T2 wins y.
    let h = history(vec![
        txn(
            1,
            (0, 10),
            Committed,
            &[],
            &[(1, 1, Update), (2, 2, Update)],
        ),
        txn(
            2,
            (0, 10),
            Committed,
            &[],
            &[(1, 2, Update), (2, 1, Update)],
        ),
    ]);
    let a = only(&h, AnomalyKind::G0);
    assert_eq!(cycle_labels(&a), ["ww", "ww"]);
    assert_closed(&a);
    assert_eq!(a.cycle().unwrap().class, CycleClass::G0);
    let text = a.to_string();
    assert!(
        text.contains("G0") && text.contains("T1.1 -ww-> T1.2"),
        "{text}"
    );
}

#[test]
fn g1c_circular_information_flow() {
    let h = history(vec![
        txn(1, (0, 10), Committed, &[(2, 1)], &[(1, 1, Update)]),
        txn(2, (0, 10), Committed, &[(1, 1)], &[(2, 1, Update)]),
    ]);
    let a = only(&h, AnomalyKind::G1c);
    assert_eq!(cycle_labels(&a), ["wr", "wr"]);
    assert_closed(&a);
}

#[test]
fn g_single_lost_update() {
    // Both read x at v0 and increment it.
    let h = history(vec![
        txn(1, (0, 10), Committed, &[(1, 0)], &[(1, 1, Update)]),
        txn(2, (0, 10), Committed, &[(1, 0)], &[(1, 2, Update)]),
    ]);
    let a = only(&h, AnomalyKind::GSingle);
    let mut labels = cycle_labels(&a);
    labels.sort_unstable();
    assert_eq!(labels, ["rw", "ww"]);
    assert_closed(&a);
}

#[test]
fn g_single_read_skew() {
    // R reads x before W and y after W.
    let h = history(vec![
        txn(1, (0, 20), Committed, &[(1, 0), (2, 1)], &[]),
        txn(
            2,
            (5, 10),
            Committed,
            &[],
            &[(1, 1, Update), (2, 1, Update)],
        ),
    ]);
    let a = only(&h, AnomalyKind::GSingle);
    assert_closed(&a);
    let c = a.cycle().unwrap();
    assert!(c.steps.iter().any(|s| matches!(
        s.dependency,
        Dependency::ReadWrite {
            key: Key(1),
            read: Version(0),
            overwritten_by: Version(1),
            ..
        }
    )));
    assert!(c.steps.iter().any(|s| matches!(
        s.dependency,
        Dependency::WriteRead {
            key: Key(2),
            version: Version(1),
            ..
        }
    )));
    let text = a.to_string();
    assert!(text.contains("T1.1 read v0 of (t0, k1), and T1.2 installed the next version v1"));
    assert!(
        text.contains("T1.1 read v1 of (t0, k2), installed by T1.2"),
        "{text}"
    );
}

#[test]
fn g2_write_skew() {
    // Pandora litmus 2 gone wrong (covert locks): each reads both, writes one.
    let h = history(vec![
        txn(1, (0, 10), Committed, &[(1, 0), (2, 0)], &[(1, 1, Update)]),
        txn(2, (0, 10), Committed, &[(1, 0), (2, 0)], &[(2, 1, Update)]),
    ]);
    let a = only(&h, AnomalyKind::G2);
    assert_eq!(cycle_labels(&a), ["rw", "rw"]);
    assert_closed(&a);
}

#[test]
fn g_single_preferred_over_g2_in_one_component() {
    // T1 -rw-> T2 -wr-> T1 (G-single) and T1 -rw-> T3 -rw-> T1 (G2) share T1: one component
    // at the rw level, reported as the G-single.
    let h = history(vec![
        txn(
            1,
            (0, 10),
            Committed,
            &[(1, 0), (2, 1), (3, 0)],
            &[(4, 1, Update)],
        ),
        txn(
            2,
            (0, 10),
            Committed,
            &[],
            &[(1, 1, Update), (2, 1, Update)],
        ),
        txn(3, (0, 10), Committed, &[(4, 0)], &[(3, 1, Update)]),
    ]);
    let a = only(&h, AnomalyKind::GSingle);
    assert_eq!(a.cycle().unwrap().component_size, 3);
}

#[test]
fn real_time_stale_read() {
    // W committed x=v1 and ended before R began; R still read v0.
    let h = history(vec![
        txn(1, (0, 10), Committed, &[], &[(1, 1, Update)]),
        txn(2, (20, 30), Committed, &[(1, 0)], &[]),
    ]);
    let a = only(&h, AnomalyKind::RealTime);
    let mut labels = cycle_labels(&a);
    labels.sort_unstable();
    assert_eq!(labels, ["rt", "rw"]);
    assert_closed(&a);
    let text = a.to_string();
    assert!(
        text.contains("T1.1 ended at 10 ns, before T1.2 began at 20 ns"),
        "{text}"
    );
    assert!(text.contains("not strictly serializable"));
}

#[test]
fn overlapping_intervals_give_no_real_time_edge() {
    // Same as the stale read, but R began before W ended (equal instants are not ordered).
    let h = history(vec![
        txn(1, (0, 10), Committed, &[], &[(1, 1, Update)]),
        txn(2, (10, 30), Committed, &[(1, 0)], &[]),
    ]);
    assert_ok(&h);
}

#[test]
fn real_time_through_an_unknown_writer_and_a_later_reader() {
    // U's write is seen by C (so U counts committed) but D, which began after C ended, still
    // reads the old version: D -rw-> U -wr-> C -rt-> D.
    let h = history(vec![
        txn(1, (0, 10), Unknown, &[], &[(1, 1, Update)]),
        txn(2, (20, 30), Committed, &[(1, 1)], &[]),
        txn(3, (40, 50), Committed, &[(1, 0)], &[]),
    ]);
    let a = only(&h, AnomalyKind::RealTime);
    assert_eq!(a.cycle().unwrap().steps.len(), 3);
    assert_closed(&a);
}

#[test]
fn unknown_writer_gets_no_outgoing_real_time_edge() {
    // Recovery may roll U forward after its recorded end, so R reading v0 later is allowed.
    let h = history(vec![
        txn(1, (0, 10), Unknown, &[], &[(1, 1, Update)]),
        txn(2, (20, 30), Committed, &[(1, 0)], &[]),
        txn(3, (40, 50), Committed, &[(1, 1)], &[]),
    ]);
    assert_ok(&h);
}

#[test]
fn real_time_cycle_through_many_time_points_is_one_step() {
    // Many unrelated transactions between W's end and R's begin create a long chain of time
    // points; the report still shows a two-transaction cycle.
    let mut txns = vec![
        txn(1, (0, 10), Committed, &[], &[(1, 1, Update)]),
        txn(2, (1000, 1010), Committed, &[(1, 0)], &[]),
    ];
    for i in 0..50 {
        txns.push(txn(
            100 + i,
            (20 + 10 * i, 25 + 10 * i),
            Committed,
            &[],
            &[(1000 + i, 1, Update)],
        ));
    }
    let a = only(&history(txns), AnomalyKind::RealTime);
    let c = a.cycle().unwrap();
    assert_eq!(c.steps.len(), 2, "{a}");
    assert!(c.component_size > 2);
}

#[test]
fn shortest_cycle_is_reported() {
    // A G0 ring T1 -> T2 -> ... -> T6 -> T1 plus a shortcut T2 -> T1: one component, and the
    // two-transaction cycle is the one reported.
    let n = 6;
    let mut writes: Vec<Vec<(u64, u64, WriteKind)>> = vec![Vec::new(); n];
    for i in 0..n {
        writes[i].push((i as u64, 1, Update));
        writes[(i + 1) % n].push((i as u64, 2, Update));
    }
    writes[1].push((100, 1, Update));
    writes[0].push((100, 2, Update));
    let txns = (0..n)
        .map(|i| txn(i as u64 + 1, (0, 10), Committed, &[], &writes[i]))
        .collect();
    let a = only(&history(txns), AnomalyKind::G0);
    let c = a.cycle().unwrap();
    assert_eq!(c.steps.len(), 2, "{a}");
    assert_eq!(c.component_size, n);
}

#[test]
fn one_report_per_component_at_its_most_severe_level() {
    // A G0 pair that also has wr and rw edges between the same transactions: reported once.
    let h = history(vec![
        txn(
            1,
            (0, 10),
            Committed,
            &[(3, 1)],
            &[(1, 1, Update), (2, 2, Update)],
        ),
        txn(
            2,
            (0, 10),
            Committed,
            &[(4, 0)],
            &[
                (1, 2, Update),
                (2, 1, Update),
                (3, 1, Update),
                (4, 1, Update),
            ],
        ),
    ]);
    only(&h, AnomalyKind::G0);
}

#[test]
fn anomalies_are_bounded_and_the_rest_counted() {
    let mut txns = Vec::new();
    for i in 0..50u64 {
        let (x, y) = (2 * i, 2 * i + 1);
        txns.push(txn(
            2 * i,
            (0, 10),
            Committed,
            &[],
            &[(x, 1, Update), (y, 2, Update)],
        ));
        txns.push(txn(
            2 * i + 1,
            (0, 10),
            Committed,
            &[],
            &[(x, 2, Update), (y, 1, Update)],
        ));
    }
    let r = check_with(
        &history(txns),
        &CheckOptions {
            strict: true,
            max_anomalies: 10,
            ..CheckOptions::default()
        },
    );
    assert_eq!(r.anomalies.len(), 10);
    assert_eq!(r.omitted, 40);
    assert_eq!(r.total(), 50);
    assert!(r.anomalies.iter().all(|a| a.kind() == AnomalyKind::G0));
    assert!(r.to_string().contains("50 anomalies (40 not kept)"));

    let r = check_with(
        &history(vec![
            txn(
                1,
                (0, 10),
                Committed,
                &[],
                &[(1, 1, Update), (2, 2, Update)],
            ),
            txn(
                2,
                (0, 10),
                Committed,
                &[],
                &[(1, 2, Update), (2, 1, Update)],
            ),
        ]),
        &CheckOptions {
            strict: true,
            max_anomalies: 0,
            ..CheckOptions::default()
        },
    );
    assert!(!r.is_ok());
    assert_eq!((r.anomalies.len(), r.omitted), (0, 1));
}

#[test]
fn report_display_lists_every_anomaly() {
    let h = history(vec![
        txn(1, (0, 10), Aborted, &[], &[(7, 3, Update)]),
        txn(2, (5, 20), Committed, &[(7, 3)], &[]),
        txn(3, (0, 10), Committed, &[(1, 0), (2, 0)], &[(1, 1, Update)]),
        txn(4, (0, 10), Committed, &[(1, 0), (2, 0)], &[(2, 1, Update)]),
    ]);
    let r = check(&h);
    let text = r.to_string();
    assert!(text.contains("2 anomalies"), "{text}");
    assert!(text.contains("\n1. G1a aborted read"), "{text}");
    assert!(text.contains("\n2. G2 anti-dependency cycle"), "{text}");
}

// ---------------------------------------------------------------------------------------------
// Recorded writers and reused version numbers
// ---------------------------------------------------------------------------------------------

/// `t` with its `read`-th read attributed to transaction `writer`.
fn read_from(mut t: TxnRecord, read: usize, writer: u64) -> TxnRecord {
    t.reads[read] = t.reads[read].written_by(id(writer));
    t
}

#[test]
fn dirty_read_of_a_version_number_later_reused_is_g1a_with_writer() {
    // FORD: T1 installs x@1 and aborts (its version is rolled back); T2 read T1's x@1 and
    // committed; T3 later installs x@1 again from the rolled-back counter.
    let h = history(vec![
        txn(1, (0, 10), Aborted, &[], &[(1, 1, Update)]),
        read_from(txn(2, (5, 40), Committed, &[(1, 1)], &[]), 0, 1),
        txn(3, (50, 60), Committed, &[(1, 0)], &[(1, 1, Update)]),
    ]);
    let a = only(&h, AnomalyKind::G1a);
    assert_eq!(
        a,
        Anomaly::AbortedRead {
            reader: id(2),
            table: TableId(0),
            key: Key(1),
            version: Version(1),
            writer: id(1),
            writer_outcome: Aborted,
        }
    );
    // Also when the committed reuse overlaps the read: the recorded writer decides.
    let h = history(vec![
        txn(1, (0, 10), Aborted, &[], &[(1, 1, Update)]),
        read_from(txn(2, (5, 40), Committed, &[(1, 1)], &[]), 0, 1),
        txn(3, (20, 30), Committed, &[(1, 0)], &[(1, 1, Update)]),
    ]);
    let r = check(&h);
    assert!(r.has(AnomalyKind::G1a), "{r}");
    assert!(!r.has(AnomalyKind::AmbiguousRead), "{r}");
}

#[test]
fn dirty_read_of_a_reused_number_without_writer_is_g1a_by_real_time() {
    // No writer recorded, but T2 ended before T3 began: it cannot have observed T3's x@1,
    // only the aborted T1's.
    let h = history(vec![
        txn(1, (0, 10), Aborted, &[], &[(1, 1, Update)]),
        txn(2, (5, 40), Committed, &[(1, 1)], &[]),
        txn(3, (50, 60), Committed, &[(1, 0)], &[(1, 1, Update)]),
    ]);
    let a = only(&h, AnomalyKind::G1a);
    assert!(
        matches!(a, Anomaly::AbortedRead { reader, writer, .. } if reader == id(2) && writer == id(1)),
        "{a}"
    );
}

#[test]
fn read_of_the_committed_reuse_with_writer_is_ok() {
    let h = history(vec![
        txn(1, (0, 10), Aborted, &[], &[(1, 1, Update)]),
        txn(3, (20, 30), Committed, &[(1, 0)], &[(1, 1, Update)]),
        read_from(txn(2, (25, 40), Committed, &[(1, 1)], &[]), 0, 3),
    ]);
    let r = assert_ok(&h);
    assert_eq!(r.stats.wr_edges, 1);
    // The same read attributed to the aborted installer is a G1a.
    let mut dirty = h.clone();
    dirty.txns[2] = read_from(dirty.txns[2].clone(), 0, 1);
    only(&dirty, AnomalyKind::G1a);
}

#[test]
fn reused_number_readable_from_both_installers_is_reported_ambiguous() {
    // T2 overlaps both the aborted T1 and the committed T3, and records no writer.
    let h = history(vec![
        txn(1, (0, 10), Aborted, &[], &[(1, 1, Update)]),
        txn(2, (5, 40), Committed, &[(1, 1)], &[]),
        txn(3, (8, 30), Committed, &[(1, 0)], &[(1, 1, Update)]),
    ]);
    let a = only(&h, AnomalyKind::AmbiguousRead);
    assert_eq!(
        a,
        Anomaly::AmbiguousRead {
            reader: id(2),
            table: TableId(0),
            key: Key(1),
            version: Version(1),
            committed: id(3),
            other: id(1),
            other_outcome: Aborted,
        }
    );
    let text = a.to_string();
    assert!(text.contains("T1.1") && text.contains("T1.3") && text.contains("written_by"));
    // The graph still credits the committed installer.
    assert_eq!(check(&h).stats.wr_edges, 1);
    // A read that began after the aborted installer ended (its version was rolled back by
    // then) is not ambiguous.
    let h = history(vec![
        txn(1, (0, 10), Aborted, &[], &[(1, 1, Update)]),
        txn(2, (12, 40), Committed, &[(1, 1)], &[]),
        txn(3, (8, 30), Committed, &[(1, 0)], &[(1, 1, Update)]),
    ]);
    assert_ok(&h);
}

#[test]
fn writer_that_did_not_install_the_version_is_malformed() {
    let h = history(vec![
        txn(
            1,
            (0, 10),
            Committed,
            &[],
            &[(1, 1, Update), (2, 1, Update)],
        ),
        // Names T1 for x@2 (T1 installed x@1), T9 (not in the history) for y@1, and T1 for
        // the loaded state of z.
        read_from(
            read_from(
                read_from(
                    txn(2, (20, 30), Committed, &[(1, 2), (2, 1), (3, 0)], &[]),
                    0,
                    1,
                ),
                1,
                9,
            ),
            2,
            1,
        ),
    ]);
    let r = check(&h);
    assert_eq!(r.total(), 3, "{r}");
    let wrong: Vec<(Key, TxnId)> = r
        .anomalies
        .iter()
        .map(|a| match a {
            Anomaly::Malformed {
                txn,
                problem: Malformation::WrongWriter { key, writer, .. },
            } if *txn == id(2) => (*key, *writer),
            other => panic!("unexpected {other}"),
        })
        .collect();
    assert_eq!(
        wrong,
        vec![(Key(1), id(1)), (Key(2), id(9)), (Key(3), id(1))]
    );
    assert!(
        r.anomalies[0]
            .to_string()
            .contains("installed no such version")
    );
}

#[test]
fn recorded_writer_decides_the_fate_of_an_unknown_transaction() {
    // U1 crashed after installing x@1; T3 (committed) installed x@1 too. Without a writer
    // T2's read is credited to T3 and U1 counts aborted.
    let base = vec![
        txn(1, (0, 10), Unknown, &[], &[(1, 1, Update)]),
        txn(3, (5, 15), Committed, &[(1, 0)], &[(1, 1, Update)]),
        txn(2, (20, 30), Committed, &[(1, 1)], &[]),
    ];
    let r = assert_ok(&history(base.clone()));
    assert_eq!(r.stats.unknown_aborted, 1);
    // T2 observed U1's x@1: U1 was rolled forward, so T3's install of the same number lost a
    // write.
    let mut h = history(base);
    h.txns[2] = read_from(h.txns[2].clone(), 0, 1);
    let r = check(&h);
    assert_eq!(r.stats.unknown_committed, 1, "{r}");
    assert!(r.has(AnomalyKind::LostWrite), "{r}");
}

#[test]
fn recorded_writers_for_own_and_intermediate_versions() {
    // Own write with writer = self is fine; another transaction's intermediate version named
    // by its writer is a G1b.
    let h = history(vec![
        read_from(
            txn(
                1,
                (0, 30),
                Committed,
                &[(4, 1)],
                &[(4, 1, Update), (4, 2, Update)],
            ),
            0,
            1,
        ),
        read_from(txn(2, (10, 40), Committed, &[(4, 1)], &[]), 0, 1),
    ]);
    only(&h, AnomalyKind::G1b);
}

// ---------------------------------------------------------------------------------------------
// Serial model executor
// ---------------------------------------------------------------------------------------------

/// One transaction of a plan: operations `(is_write, key byte)`, fate byte, begin gap,
/// duration.
type PlanTxn = (Vec<(bool, u8)>, u8, u8, u8);

/// Where a read of the generated history landed, for tampering.
struct ReadSite {
    txn: usize,
    read: usize,
    table: u32,
    key: u64,
    /// Position of the observed version in the record's applied-version list.
    position: usize,
}

struct Generated {
    history: History,
    /// Per record, the versions applied in order, with the index of their installer
    /// (`usize::MAX` for the loaded state).
    applied: BTreeMap<(u32, u64), Vec<(u64, usize)>>,
    sites: Vec<ReadSite>,
}

/// How the serial model numbers versions and what its reads record.
#[derive(Clone, Copy)]
struct Mode {
    /// FORD-style per-record counters: a write installs the current version + 1, so the
    /// number of an aborted or rolled-back write is reused by the next writer. Otherwise every
    /// write attempt draws a fresh number per record (as a commit-timestamp scheme does).
    reuse_numbers: bool,
    /// Reads record the installer of the version they observed.
    writers: bool,
}

/// Runs `plan` serially against a model store with fresh version numbers and no writers.
fn run_serial(plan: &[PlanTxn]) -> Generated {
    run_serial_with(
        plan,
        Mode {
            reuse_numbers: false,
            writers: false,
        },
    )
}

/// Runs `plan` serially against a model store. Records: 2 tables × 4 keys; even keys start
/// present, odd ones absent. Committed and "Unknown but applied" transactions apply their
/// writes at commit, aborted and "Unknown, rolled back" ones do not (but record the versions
/// they would have installed). Begin instants are non-decreasing in execution order, so
/// real-time order never contradicts it.
fn run_serial_with(plan: &[PlanTxn], mode: Mode) -> Generated {
    #[derive(Clone, Copy)]
    struct Rec {
        version: u64,
        present: bool,
        next: u64,
        /// Index of the installer of `version` (`usize::MAX` for the loaded state).
        installer: usize,
    }
    let txn_id = |i: usize| TxnId {
        coordinator: CoordinatorId(i as u32 % 4),
        seq: i as u64,
    };
    let mut store: BTreeMap<(u32, u64), Rec> = BTreeMap::new();
    let mut applied: BTreeMap<(u32, u64), Vec<(u64, usize)>> = BTreeMap::new();
    for t in 0..2u32 {
        for k in 0..4u64 {
            store.insert(
                (t, k),
                Rec {
                    version: 0,
                    present: k % 2 == 0,
                    next: 1,
                    installer: usize::MAX,
                },
            );
            applied.insert((t, k), vec![(0, usize::MAX)]);
        }
    }
    let mut history = History::new();
    let mut sites = Vec::new();
    let mut now = 0u64;
    for (i, (ops, fate, gap, dur)) in plan.iter().enumerate() {
        now += u64::from(*gap % 16);
        let begin = now;
        let end = begin + u64::from(*dur % 40);
        let (outcome, apply) = match fate % 8 {
            0 => (Aborted, false),
            1 => (Unknown, true),
            2 => (Unknown, false),
            _ => (Committed, true),
        };
        // Writes buffered until commit: record -> (version, present after).
        let mut buffered: BTreeMap<(u32, u64), (u64, bool)> = BTreeMap::new();
        let mut reads = Vec::new();
        let mut writes = Vec::new();
        for &(is_write, b) in ops.iter().take(6) {
            let rec = (u32::from(b & 1), u64::from((b >> 1) & 3));
            let cur = store[&rec];
            let (version, present) = buffered
                .get(&rec)
                .copied()
                .unwrap_or((cur.version, cur.present));
            if is_write {
                let kind = if !present {
                    Insert
                } else if b & 0x80 != 0 {
                    Delete
                } else {
                    Update
                };
                let r = store.get_mut(&rec).unwrap();
                let v = if mode.reuse_numbers {
                    version + 1
                } else {
                    r.next += 1;
                    r.next - 1
                };
                buffered.insert(rec, (v, kind != Delete));
                writes.push(WriteEvent {
                    table: TableId(rec.0),
                    key: Key(rec.1),
                    version: Version(v),
                    kind,
                });
            } else {
                if !buffered.contains_key(&rec) {
                    let position = applied[&rec].len() - 1;
                    sites.push(ReadSite {
                        txn: i,
                        read: reads.len(),
                        table: rec.0,
                        key: rec.1,
                        position,
                    });
                }
                let mut read = ReadEvent::new(TableId(rec.0), Key(rec.1), Version(version));
                let installer = if buffered.contains_key(&rec) {
                    i
                } else {
                    cur.installer
                };
                if mode.writers && installer != usize::MAX {
                    read = read.written_by(txn_id(installer));
                }
                reads.push(read);
            }
        }
        if apply {
            for (rec, (v, present)) in buffered {
                let r = store.get_mut(&rec).unwrap();
                r.version = v;
                r.present = present;
                r.installer = i;
                applied.get_mut(&rec).unwrap().push((v, i));
            }
        }
        history.push(TxnRecord {
            id: txn_id(i),
            begin,
            end,
            outcome,
            reads,
            writes,
        });
    }
    Generated {
        history,
        applied,
        sites,
    }
}

#[quickcheck]
fn serial_executions_pass(plan: Vec<PlanTxn>) -> bool {
    let mut g = run_serial(&plan);
    let r = check(&g.history);
    if !r.is_ok() {
        eprintln!("{r}");
        return false;
    }
    // The verdict does not depend on the order the history lists transactions in.
    g.history.txns.reverse();
    let reversed = check(&g.history);
    reversed.is_ok() && reversed.stats == r.stats
}

#[quickcheck]
fn serial_executions_recording_writers_pass(plan: Vec<PlanTxn>) -> bool {
    [false, true].into_iter().all(|reuse_numbers| {
        let g = run_serial_with(
            &plan,
            Mode {
                reuse_numbers,
                writers: true,
            },
        );
        let r = check(&g.history);
        if !r.is_ok() {
            eprintln!("reuse_numbers={reuse_numbers}: {r}");
        }
        r.is_ok()
    })
}

/// With FORD-style counters, makes one committed read whose version number an aborted
/// transaction also installed name that aborted transaction as its writer: a dirty read the
/// version number alone cannot show. It must be reported as G1a.
#[quickcheck]
fn dirty_read_of_a_reused_version_number_is_g1a(plan: Vec<PlanTxn>) -> TestResult {
    let mut g = run_serial_with(
        &plan,
        Mode {
            reuse_numbers: true,
            writers: true,
        },
    );
    let txns = &g.history.txns;
    let planted = g.sites.iter().find_map(|site| {
        let read = txns[site.txn].reads[site.read];
        if txns[site.txn].outcome != Committed || read.version == Version::INITIAL {
            return None;
        }
        let aborted = txns.iter().find(|t| {
            t.outcome == Aborted
                && t.writes
                    .iter()
                    .any(|w| (w.table, w.key, w.version) == (read.table, read.key, read.version))
        })?;
        Some((site.txn, site.read, aborted.id))
    });
    let Some((t, j, aborted)) = planted else {
        return TestResult::discard();
    };
    let reader = g.history.txns[t].id;
    let read = &mut g.history.txns[t].reads[j];
    *read = read.written_by(aborted);
    let r = check(&g.history);
    TestResult::from_bool(r.anomalies.iter().any(|a| {
        matches!(a, Anomaly::AbortedRead { reader: x, writer, .. } if *x == reader && *writer == aborted)
    }))
}

/// Tampers with one committed read so that it observes a version that had been overwritten
/// by a committed transaction which ended before the reader began; returns the reader.
fn tamper(g: &mut Generated) -> Option<TxnId> {
    for site in &g.sites {
        let reader = &g.history.txns[site.txn];
        if reader.outcome != Committed {
            continue;
        }
        let versions = &g.applied[&(site.table, site.key)];
        // An older version whose successor's installer committed and ended before the reader
        // began.
        let stale = (0..site.position).rev().find(|&m| {
            let (_, installer) = versions[m + 1];
            let w = &g.history.txns[installer];
            w.outcome == Committed && w.end < reader.begin
        });
        if let Some(m) = stale {
            let old = versions[m].0;
            g.history.txns[site.txn].reads[site.read].version = Version(old);
            return Some(g.history.txns[site.txn].id);
        }
    }
    None
}

#[quickcheck]
fn stale_read_in_a_serial_execution_fails(plan: Vec<PlanTxn>) -> TestResult {
    let mut g = run_serial(&plan);
    if tamper(&mut g).is_none() {
        return TestResult::discard();
    }
    let r = check(&g.history);
    TestResult::from_bool(!r.is_ok())
}

/// A large serial history: `n` committed transactions, each reading two of 1024 records and
/// writing one, with real-time intervals overlapping their neighbours'.
fn large_serial(n: usize) -> Generated {
    let mut plan = Vec::with_capacity(n);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..n {
        let r = next();
        let ops = vec![
            (false, r as u8 & 0x7f),
            (false, (r >> 8) as u8 & 0x7f),
            (true, (r >> 16) as u8 & 0x7f),
        ];
        plan.push((ops, 3, 4, (r >> 24) as u8));
    }
    run_serial(&plan)
}

#[test]
fn large_serial_history_passes_and_one_stale_read_is_found() {
    let mut g = large_serial(200_000);
    let start = std::time::Instant::now();
    let r = check(&g.history);
    eprintln!("checked 200k transactions in {:?}: {r}", start.elapsed());
    assert!(r.is_ok(), "{r}");
    assert_eq!(r.stats.committed, 200_000);
    assert!(r.stats.rw_edges > 0 && r.stats.wr_edges > 0 && r.stats.ww_edges > 0);

    // One stale read near the end. It may also close a serializability cycle with the
    // reader's other dependencies, but always a real-time one, and every cycle is short and
    // passes through the reader.
    g.sites.reverse();
    let reader = tamper(&mut g).expect("a stale read to plant");
    let r = check(&g.history);
    assert!(r.has(AnomalyKind::RealTime), "{r}");
    assert!(r.total() <= 2, "{r}");
    for a in &r.anomalies {
        let c = a.cycle().expect("only cycles");
        assert!(c.steps.len() <= 3, "{r}");
        assert!(c.steps.iter().any(|s| s.from == reader), "{r}");
    }
}

// ---------------------------------------------------------------------------------------------
// Snapshot isolation
// ---------------------------------------------------------------------------------------------

fn snapshot(strict: bool) -> CheckOptions {
    CheckOptions {
        strict,
        isolation: Isolation::Snapshot,
        ..CheckOptions::default()
    }
}

/// Write skew (Fig. 5(b)'s (1,1) outcome): T1 reads x, y and writes y; T2 reads x, y and
/// writes x, concurrently. Two `rw` edges: G2 under serializability, allowed under SI.
#[test]
fn write_skew_is_g2_under_serializability_and_allowed_under_snapshot_isolation() {
    let h = history(vec![
        txn(1, (0, 10), Committed, &[(1, 0), (2, 0)], &[(2, 1, Update)]),
        txn(2, (0, 10), Committed, &[(1, 0), (2, 0)], &[(1, 1, Update)]),
    ]);
    let a = only(&h, AnomalyKind::G2);
    assert_eq!(cycle_labels(&a), ["rw", "rw"]);
    for strict in [false, true] {
        let r = check_with(&h, &snapshot(strict));
        assert!(r.is_ok(), "SI (strict {strict}) allows write skew: {r}");
    }
}

/// A lost update (G-single: one `rw` edge) is an anomaly under SI too.
#[test]
fn lost_update_is_an_anomaly_under_snapshot_isolation() {
    let h = history(vec![
        txn(1, (0, 10), Committed, &[(1, 0)], &[(1, 1, Update)]),
        txn(2, (0, 10), Committed, &[(1, 0)], &[(1, 2, Update)]),
    ]);
    for strict in [false, true] {
        let r = check_with(&h, &snapshot(strict));
        assert_eq!(r.total(), 1, "strict {strict}: {r}");
        assert_eq!(r.anomalies[0].kind(), AnomalyKind::GSingle, "{r}");
    }
}

/// A stale read — reading a version that a transaction which ended before the reader began
/// had overwritten — is one `rw` and one `rt` edge: an anomaly under strict SI, allowed
/// without real time.
#[test]
fn stale_read_is_an_anomaly_under_strict_snapshot_isolation_only() {
    let h = history(vec![
        txn(1, (0, 10), Committed, &[], &[(1, 1, Update)]),
        txn(2, (20, 30), Committed, &[(1, 0)], &[]),
    ]);
    assert!(check_with(&h, &snapshot(false)).is_ok());
    let r = check_with(&h, &snapshot(true));
    assert_eq!(r.total(), 1, "{r}");
    assert_eq!(r.anomalies[0].kind(), AnomalyKind::RealTime, "{r}");
}

/// Write skew followed in real time by a reader closes cycles with `rt` edges as well; they
/// still hold two `rw` edges and SI allows them, while G1c in the same history is found.
#[test]
fn snapshot_isolation_still_reports_g1c_beside_allowed_write_skew() {
    let h = history(vec![
        txn(1, (0, 10), Committed, &[(1, 0), (2, 0)], &[(2, 1, Update)]),
        txn(2, (0, 10), Committed, &[(1, 0), (2, 0)], &[(1, 1, Update)]),
        txn(3, (20, 30), Committed, &[(1, 1), (2, 1)], &[]),
        // Circular information flow between T4 and T5.
        txn(4, (40, 50), Committed, &[(4, 1)], &[(3, 1, Update)]),
        txn(5, (40, 50), Committed, &[(3, 1)], &[(4, 1, Update)]),
    ]);
    let r = check_with(&h, &snapshot(true));
    assert_eq!(r.total(), 1, "{r}");
    assert_eq!(r.anomalies[0].kind(), AnomalyKind::G1c, "{r}");
}
