//! Whole runs in bounded memory: the history checked in segments separated by quiescent
//! points, with only the *carried frontier* kept between them.
//!
//! # The carried frontier
//!
//! A runner cuts the history at a **quiescent point** (no transaction in flight): every
//! transaction recorded before the cut ended before every transaction recorded after it
//! began. At a cut, [`SegmentedCheck::segment`] checks the segment's transactions together
//! with the frontier carried from earlier segments, then keeps as the new frontier only:
//!
//! * per record, the installer of its **latest committed version** (the largest final
//!   version a recorded-committed transaction installed), as a *carried* record: its id, begin
//!   and end, outcome committed, no reads, and only the writes that installed such latest
//!   versions (one transaction carries all the records it was the last to write);
//! * every **Unknown** transaction (a crashed coordinator's) with its writes and no reads,
//!   until each of its versions is below its record's latest committed version.
//!
//! So between segments memory is bounded by the records written (one carried write per
//! record), not by the run's length; a segment itself costs what the checker costs per
//! transaction (see `protocol/core/README.md`, "Checking whole runs").
//!
//! # What is guaranteed
//!
//! Let `H` be the whole history and `S_1, S_2, …` its segments, each checked with the
//! frontier `F` carried into it (`F ∪ S_j`). Edges of `F ∪ S_j` are edges of `H` (a carried
//! record has a subset of its transaction's writes and no reads; a carried latest version is
//! the last committed one before the cut, so its successor in `F ∪ S_j`'s version order is its
//! successor in `H`'s), so:
//!
//! * **No false alarm**: if `H` has no anomaly, no segment reports one (the carried records
//!   are what a valid later read observes).
//! * **Nothing missed that crosses a cut**: a dependency of `H` from a later segment back to
//!   an earlier one is reported in some segment, because the earlier transaction ended before
//!   the later one began. A later read of a version that is not the latest committed one at
//!   the cut (a stale read, or a read of a rolled-back or intermediate version) reads a version
//!   nobody in `F ∪ S_j` installed — reported as a phantom version (or a read naming the wrong
//!   writer) instead of the real-time cycle, G1a or G1b the whole history would show — or a
//!   version a later transaction installed again below the carried one, a real-time cycle
//!   `later -ww-> … -ww-> carried -rt-> later`. A later install below or at the carried
//!   version is a real-time cycle or a lost write with the carried installer. So every
//!   anomalous `H` makes some segment report an anomaly, and cycles inside a segment are
//!   reported as the one-shot checker reports them; the *class* of an anomaly that spans a
//!   cut may differ from the one-shot verdict (a phantom version for a stale read), and
//!   cycles are always judged strictly (a cut orders segments in real time).
//! * **Transactions with an unknown outcome** are judged with the evidence of the segment
//!   they are in and the later ones that read a carried version of theirs; their own reads
//!   are judged in their segment only (a promotion by a later read does not re-judge them).
//!   Without crashes a run has none.
//!
//! A malformed carried record (end before begin) is reported again in each later segment it
//! is carried into, and a transaction id reused across segments is found only when the first
//! use is carried.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;

use super::{Anomaly, CheckOptions, CheckStats, Report, check_with};
use crate::history::{History, TxnOutcome, TxnRecord, WriteEvent};
use crate::model::Version;

/// A run's history checked segment by segment (see the module docs).
#[derive(Debug, Clone)]
pub struct SegmentedCheck {
    options: CheckOptions,
    carried: Vec<TxnRecord>,
    anomalies: Vec<Anomaly>,
    total: usize,
    checked: usize,
    in_doubt: usize,
    segments: usize,
    largest_segment: usize,
    largest_carried: usize,
    stats: CheckStats,
}

impl SegmentedCheck {
    /// Nothing checked yet.
    #[must_use]
    pub fn new(options: CheckOptions) -> Self {
        Self {
            options,
            carried: Vec::new(),
            anomalies: Vec::new(),
            total: 0,
            checked: 0,
            in_doubt: 0,
            segments: 0,
            largest_segment: 0,
            largest_carried: 0,
            stats: CheckStats::default(),
        }
    }

    /// Checks one segment: transactions that all began after every transaction of the earlier
    /// segments ended (the runner cut at a quiescent point). Returns the segment's report;
    /// only the new frontier is kept.
    ///
    /// # Panics
    ///
    /// If a segment and the carried frontier exceed 2^29 transactions.
    pub fn segment(&mut self, txns: Vec<TxnRecord>) -> Report {
        self.segments += 1;
        self.checked += txns.len();
        self.largest_segment = self.largest_segment.max(txns.len());
        self.in_doubt += txns
            .iter()
            .filter(|t| t.outcome == TxnOutcome::Unknown)
            .count();
        let mut all = core::mem::take(&mut self.carried);
        all.extend(txns);
        let history = History {
            txns: all,
            closed: false,
        };
        let report = if history.txns.is_empty() {
            Report {
                anomalies: Vec::new(),
                omitted: 0,
                stats: CheckStats::default(),
            }
        } else {
            check_with(&history, &self.options)
        };
        self.total += report.total();
        for a in &report.anomalies {
            if self.anomalies.len() < self.options.max_anomalies {
                self.anomalies.push(a.clone());
            }
        }
        add_stats(&mut self.stats, &report.stats);
        self.carried = carry(&history.txns);
        self.largest_carried = self.largest_carried.max(self.carried.len());
        report
    }

    /// The verdict over every segment so far: the first anomalies found (up to
    /// [`CheckOptions::max_anomalies`]), the rest counted; `stats` summed over the segments'
    /// checks (carried records counted in each segment they were carried into).
    #[must_use]
    pub fn report(&self) -> Report {
        Report {
            anomalies: self.anomalies.clone(),
            omitted: self.total - self.anomalies.len(),
            stats: self.stats,
        }
    }

    /// Recorded transactions checked (each once; carried records not counted again).
    #[must_use]
    pub fn checked(&self) -> usize {
        self.checked
    }

    /// Recorded transactions whose outcome was [`TxnOutcome::Unknown`].
    #[must_use]
    pub fn in_doubt(&self) -> usize {
        self.in_doubt
    }

    /// Segments checked.
    #[must_use]
    pub fn segments(&self) -> usize {
        self.segments
    }

    /// Records carried now (what is kept between segments).
    #[must_use]
    pub fn carried(&self) -> usize {
        self.carried.len()
    }

    /// Writes carried now (at most one per record, plus the Unknown transactions' writes).
    #[must_use]
    pub fn carried_writes(&self) -> usize {
        self.carried.iter().map(|t| t.writes.len()).sum()
    }

    /// The most transactions one segment had, and the most records carried at once: with
    /// the carried writes, what bounds the checker's memory.
    #[must_use]
    pub fn high_water(&self) -> (usize, usize) {
        (self.largest_segment, self.largest_carried)
    }
}

fn add_stats(sum: &mut CheckStats, s: &CheckStats) {
    sum.transactions += s.transactions;
    sum.committed += s.committed;
    sum.aborted += s.aborted;
    sum.unknown_committed += s.unknown_committed;
    sum.unknown_aborted += s.unknown_aborted;
    sum.reads += s.reads;
    sum.ww_edges += s.ww_edges;
    sum.wr_edges += s.wr_edges;
    sum.rw_edges += s.rw_edges;
    sum.rt_edges += s.rt_edges;
    sum.time_points += s.time_points;
}

/// The frontier of `txns` (carried records first, then a segment's): per record the
/// recorded-committed installer of its largest final version, and the Unknown transactions
/// with a version at or above it. See the module docs.
fn carry(txns: &[TxnRecord]) -> Vec<TxnRecord> {
    // Per record: (version, transaction index, the write).
    let mut latest: BTreeMap<(u32, u64), (u64, usize, WriteEvent)> = BTreeMap::new();
    for (i, t) in txns.iter().enumerate() {
        if t.outcome != TxnOutcome::Committed {
            continue;
        }
        for w in &t.writes {
            if w.version == Version::INITIAL {
                continue;
            }
            let rec = (w.table.0, w.key.0);
            let entry = latest.entry(rec).or_insert((w.version.0, i, *w));
            // Larger versions win; of equal ones, the first transaction's (a lost write is
            // reported once, in its segment), and within it the last write.
            if w.version.0 > entry.0 || (w.version.0 == entry.0 && entry.1 == i) {
                *entry = (w.version.0, i, *w);
            }
        }
    }
    let mut by_txn: BTreeMap<usize, Vec<WriteEvent>> = BTreeMap::new();
    for &(_, i, w) in latest.values() {
        by_txn.entry(i).or_default().push(w);
    }
    for (i, t) in txns.iter().enumerate() {
        if t.outcome != TxnOutcome::Unknown {
            continue;
        }
        let live = t.writes.iter().any(|w| {
            latest
                .get(&(w.table.0, w.key.0))
                .is_none_or(|&(v, _, _)| w.version.0 >= v)
        });
        if live {
            by_txn.insert(i, t.writes.clone());
        }
    }
    by_txn
        .into_iter()
        .map(|(i, mut writes)| {
            writes.shrink_to_fit();
            let t = &txns[i];
            TxnRecord {
                id: t.id,
                begin: t.begin,
                end: t.end,
                outcome: t.outcome,
                reads: Vec::new(),
                writes,
            }
        })
        .collect()
}
