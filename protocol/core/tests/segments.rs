//! Whole histories checked in segments ([`SegmentedCheck`]): what is kept between segments is
//! bounded by the records written, not by the number of transactions, and anomalies late in
//! a long history — inside a segment or across a cut — are found.

use dmem_txn::{
    AnomalyKind, CheckOptions, CoordinatorId, CycleClass, History, Key, ReadEvent, SegmentedCheck,
    TableId, TxnId, TxnOutcome, TxnRecord, Version, WriteEvent, WriteKind, check,
};

fn id(seq: u64) -> TxnId {
    TxnId {
        coordinator: CoordinatorId(1),
        seq,
    }
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A serial (hence strictly serializable) history of `n` transactions over `keys` keys: each
/// reads two keys' latest versions (half of the reads name their writer) and writes one; every
/// tenth aborts after installing a version that the next committed writer of the key reuses
/// (FORD's counters after a roll-back). Transaction `i` runs in `[10 i, 10 i + 5]`.
fn serial(n: u64, keys: u64, seed: u64) -> Vec<TxnRecord> {
    let mut rng = seed;
    // Per key: latest committed version and its installer.
    let mut latest: Vec<(u64, Option<TxnId>)> = vec![(0, None); keys as usize];
    (0..n)
        .map(|i| {
            let me = id(i + 1);
            let reads = (0..2)
                .map(|_| {
                    let k = splitmix(&mut rng) % keys;
                    let (v, w) = latest[k as usize];
                    let r = ReadEvent::new(TableId(0), Key(k), Version(v));
                    match w {
                        Some(w) if splitmix(&mut rng).is_multiple_of(2) => r.written_by(w),
                        _ => r,
                    }
                })
                .collect();
            let k = splitmix(&mut rng) % keys;
            let v = latest[k as usize].0 + 1;
            let aborted = i % 10 == 9;
            if !aborted {
                latest[k as usize] = (v, Some(me));
            }
            TxnRecord {
                id: me,
                begin: 10 * i,
                end: 10 * i + 5,
                outcome: if aborted {
                    TxnOutcome::Aborted
                } else {
                    TxnOutcome::Committed
                },
                reads,
                writes: vec![WriteEvent {
                    table: TableId(0),
                    key: Key(k),
                    version: Version(v),
                    kind: WriteKind::Update,
                }],
            }
        })
        .collect()
}

/// Checks `txns` cut every `every` transactions (each cut is quiescent: the history is
/// serial in real time at the cuts).
fn segmented(txns: Vec<TxnRecord>, every: usize) -> SegmentedCheck {
    let mut check = SegmentedCheck::new(CheckOptions::default());
    let mut rest = txns.into_iter().peekable();
    while rest.peek().is_some() {
        let seg: Vec<TxnRecord> = rest.by_ref().take(every).collect();
        let _ = check.segment(seg);
    }
    check
}

#[test]
fn what_is_kept_between_segments_does_not_grow_with_the_history() {
    let keys = 64;
    let short = segmented(serial(2_000, keys, 7), 500);
    let long = segmented(serial(20_000, keys, 7), 500);
    for c in [&short, &long] {
        assert!(c.report().is_ok(), "{}", c.report());
        // At most one carried record per key, and one carried write per key.
        assert!(c.carried() as u64 <= keys, "{}", c.carried());
        assert!(c.carried_writes() as u64 <= keys);
        assert!(c.high_water().1 as u64 <= keys);
        assert_eq!(c.high_water().0, 500);
    }
    assert_eq!((short.checked(), long.checked()), (2_000, 20_000));
    assert_eq!((short.segments(), long.segments()), (4, 40));
    // Ten times the history, the same state kept between segments.
    assert_eq!(short.high_water(), long.high_water());
}

#[test]
fn one_segment_is_the_one_shot_check() {
    let mut txns = serial(3_000, 16, 3);
    // A stale read late in the history: transaction 2 900 reads key 0's loaded state.
    txns[2_900].reads[0] = ReadEvent::new(TableId(0), Key(0), Version::INITIAL);
    let one_shot = check(&History {
        txns: txns.clone(),
        ..History::new()
    });
    let c = segmented(txns, usize::MAX);
    assert_eq!(c.report(), one_shot);
    assert!(!one_shot.is_ok());
}

#[test]
fn valid_histories_pass_whatever_the_cuts() {
    for (seed, every) in [(1, 1), (2, 7), (3, 100), (4, 999)] {
        let c = segmented(serial(5_000, 32, seed), every);
        assert!(
            c.report().is_ok(),
            "seed {seed}, every {every}: {}",
            c.report()
        );
        assert_eq!(c.checked(), 5_000);
    }
}

/// The last write of a key in the history's first half: (transaction index, version).
fn early_write(txns: &[TxnRecord], before: usize) -> (usize, u64, u64) {
    (0..before)
        .rev()
        .find(|&i| txns[i].outcome == TxnOutcome::Committed)
        .map(|i| (i, txns[i].writes[0].key.0, txns[i].writes[0].version.0))
        .unwrap()
}

#[test]
fn a_stale_read_across_a_cut_late_in_the_history_is_found() {
    // 20 000 transactions in segments of 500: a read at transaction 19 000 of a key's loaded
    // state although a transaction of an earlier segment wrote the key (a lost committed
    // write).
    let mut txns = serial(20_000, 64, 11);
    let (w, key, _) = early_write(&txns, 18_990);
    let reader = 19_000;
    txns[reader].reads[0] = ReadEvent::new(TableId(0), Key(key), Version::INITIAL);
    // No one overwrote the key between the write and the read.
    assert!(
        txns[w + 1..reader]
            .iter()
            .all(|t| t.writes[0].key.0 != key || t.outcome != TxnOutcome::Committed),
        "pick a quieter key"
    );
    assert_ne!(w / 500, reader / 500, "the writer is in an earlier segment");
    let whole = check(&History {
        txns: txns.clone(),
        ..History::new()
    });
    assert!(whole.has(AnomalyKind::RealTime), "{whole}");
    // The writer is carried: the same real-time cycle, reader -rw-> writer -rt-> reader.
    let r = segmented(txns, 500).report();
    assert_eq!(r.total(), 1, "{r}");
    let cycle = r.anomalies[0].cycle().expect("a real-time cycle");
    assert_eq!(cycle.class, CycleClass::RealTime, "{r}");
    assert!(
        cycle.steps.iter().any(|s| s.from == id(w as u64 + 1)),
        "{r}"
    );
    assert!(
        cycle.steps.iter().any(|s| s.from == id(reader as u64 + 1)),
        "{r}"
    );
}

#[test]
fn a_read_of_an_overwritten_version_across_a_cut_is_reported() {
    // A read of a version that is no longer the latest at the cut: its installer is not
    // carried, so the read names a version nobody in the checked segment installed.
    let mut txns: Vec<TxnRecord> = Vec::new();
    let w = |seq: u64, v: u64| TxnRecord {
        id: id(seq),
        begin: 10 * seq,
        end: 10 * seq + 5,
        outcome: TxnOutcome::Committed,
        reads: vec![],
        writes: vec![WriteEvent {
            table: TableId(0),
            key: Key(1),
            version: Version(v),
            kind: WriteKind::Update,
        }],
    };
    txns.push(w(1, 1));
    txns.push(w(2, 2));
    let mut late = w(3, 3);
    late.reads = vec![ReadEvent::new(TableId(0), Key(1), Version(1))];
    txns.push(late);
    let c = segmented(txns, 2);
    let r = c.report();
    assert_eq!(r.total(), 1, "{r}");
    assert_eq!(r.anomalies[0].kind(), AnomalyKind::PhantomVersion, "{r}");
}

#[test]
fn a_lost_write_across_a_cut_is_found() {
    let mut txns = serial(4_000, 8, 5);
    // Transaction 3 990 installs a version number its key's latest committed write (in an
    // earlier segment) already installed.
    let (_, key, version) = early_write(&txns, 3_000);
    let last = txns[..3_990]
        .iter()
        .filter(|t| t.outcome == TxnOutcome::Committed && t.writes[0].key.0 == key)
        .map(|t| t.writes[0].version.0)
        .max()
        .unwrap();
    assert!(last >= version);
    txns[3_990].writes[0] = WriteEvent {
        table: TableId(0),
        key: Key(key),
        version: Version(last),
        kind: WriteKind::Update,
    };
    txns[3_990].outcome = TxnOutcome::Committed;
    let r = segmented(txns, 1_000).report();
    assert!(r.has(AnomalyKind::LostWrite), "{r}");
}

#[test]
fn write_skew_in_a_late_segment_is_found() {
    let mut txns = serial(10_000, 16, 9);
    // Two concurrent transactions at the very end: each reads both of keys 100 and 101
    // (loaded state) and writes one of them.
    let t = 10 * 10_000;
    let skew = |seq: u64, key: u64| TxnRecord {
        id: id(seq),
        begin: t,
        end: t + 5,
        outcome: TxnOutcome::Committed,
        reads: vec![
            ReadEvent::new(TableId(0), Key(100), Version::INITIAL),
            ReadEvent::new(TableId(0), Key(101), Version::INITIAL),
        ],
        writes: vec![WriteEvent {
            table: TableId(0),
            key: Key(key),
            version: Version(1),
            kind: WriteKind::Update,
        }],
    };
    txns.push(skew(20_001, 100));
    txns.push(skew(20_002, 101));
    let r = segmented(txns, 1_000).report();
    let cycle = r.anomalies[0].cycle().expect("a cycle");
    assert_eq!(cycle.class, CycleClass::G2, "{r}");
}
