//! A list-append checker in the style of Elle (Kingsbury & Alvaro, *Elle: Inferring
//! Isolation Anomalies from Experimental Observations*, VLDB 2020): dependencies inferred from
//! the **values** transactions observed, never from versions or writers a protocol reports.
//!
//! # Input
//!
//! Per transaction ([`AppendTxn`]) its id, begin and end instants, outcome and its micro-ops
//! in program order: [`MicroOp::Append`]`(key, element)` and [`MicroOp::Read`]`(key, list)`.
//! Elements are unique per key (the workload derives each from a run-wide counter), so an
//! element names the one transaction that appended it.
//!
//! # Inference
//!
//! * **Version order.** Per key, the longest list read by a transaction that counts as
//!   committed is the total order of its elements; every other such list must be a prefix of
//!   it, else an *incompatible order* (the read is then left out of the graph). A list with
//!   an element twice is a *duplicate element*; if the longest list has one, the key gets no
//!   order. The list of length `n` is the key's version `n` (the empty list the loaded state).
//! * **Edges** (between transactions that count as committed): `ww` from the appender of the
//!   element at position `i` to the appender of the one at `i + 1` (a transaction's last
//!   append to a key is its installed version, earlier ones intermediate, as in Adya); `wr`
//!   from the appender of a read list's last element to the reader; `rw` from a reader to the
//!   appender of the element right after its list; `rt` from `T1` to `T2` when `T1` ended
//!   before `T2` began (with [`CheckOptions::strict`]).
//! * **Per read**: *G1a* (an element of an aborted transaction anywhere in a committed read),
//!   *G1b* (a list ending in an element that is not its appender's last append to the key),
//!   *garbage read* (an element no transaction appended), *internal* (a transaction's own
//!   earlier appends to the key are not the tail of its later read of it).
//! * **Per append**: *duplicate append* (two appends of one element to one key) and, with
//!   `strict`, *lost append*: a committed append whose element no read ever showed although
//!   a committed read of the key began after the appender ended.
//! * **Unknown outcome**: a transaction counts as committed iff a transaction that counts as
//!   committed read one of its elements (transitively), else as aborted. One counted
//!   committed gets no outgoing real-time edges (recovery may apply its appends late).
//!
//! # Cycle search
//!
//! The inferred order is handed to the version checker's graph ([`super::check_with`]) as a
//! history whose versions are list lengths and whose writers are the appenders named by the
//! elements: its strongly connected components and shortest-cycle searches find G0, G1c,
//! G-single, G2 and real-time cycles under serializability or snapshot isolation
//! ([`Isolation`](super::Isolation)); each cycle is translated back into elements.
//! Nothing the protocol recorded enters: the history is built from the micro-ops only.

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::vec::Vec;
use core::fmt;

use dmem_verbs::Nanos;

use super::report::{Anomaly, CheckStats, CycleClass, Dependency};
use super::{CheckOptions, check_with};
use crate::history::{History, ReadEvent, TxnOutcome, TxnRecord, WriteEvent};
use crate::model::{Key, TableId, TxnId, Version, WriteKind};

/// One micro-operation of a list-append transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MicroOp {
    /// Appended `element` to `key`'s list.
    Append {
        /// The key.
        key: u64,
        /// The element, unique per key.
        element: u64,
    },
    /// Read `key`'s list.
    Read {
        /// The key.
        key: u64,
        /// The list observed, oldest element first.
        list: Vec<u64>,
    },
}

/// One transaction of a list-append history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendTxn {
    /// Its id.
    pub id: TxnId,
    /// When it began (before its first operation, before the protocol's begin).
    pub begin: Nanos,
    /// When it ended (after commit or abort returned).
    pub end: Nanos,
    /// How it ended.
    pub outcome: TxnOutcome,
    /// Its micro-ops in program order.
    pub ops: Vec<MicroOp>,
}

/// One edge of a cycle, in elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendEdge {
    /// `from` appended `before` and `to` the next element `after` of `key`.
    WriteWrite {
        /// The key.
        key: u64,
        /// `from`'s element.
        before: u64,
        /// `to`'s element, next in the order.
        after: u64,
    },
    /// `to` read a list of `key` ending in `from`'s `element`.
    WriteRead {
        /// The key.
        key: u64,
        /// The last element read.
        element: u64,
    },
    /// `from` read `key`'s list up to `last` (`None`: empty) and `to` appended the next
    /// element `missed`.
    ReadWrite {
        /// The key.
        key: u64,
        /// The last element `from` read.
        last: Option<u64>,
        /// `to`'s element, right after it.
        missed: u64,
    },
    /// `from` ended before `to` began.
    RealTime {
        /// `from`'s end.
        from_end: Nanos,
        /// `to`'s begin.
        to_begin: Nanos,
    },
}

/// One step of a cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendStep {
    /// Source.
    pub from: TxnId,
    /// Destination.
    pub to: TxnId,
    /// The edge and its evidence.
    pub edge: AppendEdge,
}

/// The short name of a list-append anomaly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AppendKind {
    /// A malformed transaction record (end before begin, id used twice).
    Malformed,
    /// One element appended twice to a key.
    DuplicateAppend,
    /// A list holding an element twice.
    DuplicateElement,
    /// A list that is not a prefix of the key's longest list.
    IncompatibleOrder,
    /// An element nobody appended.
    GarbageRead,
    /// A transaction's own appends missing from its later read.
    Internal,
    /// Adya G1a.
    G1a,
    /// Adya G1b.
    G1b,
    /// A committed append that a later read did not see and no read ever saw.
    LostAppend,
    /// Adya G0.
    G0,
    /// Adya G1c.
    G1c,
    /// Adya G-single.
    GSingle,
    /// Adya G2.
    G2,
    /// A cycle through real-time order.
    RealTime,
}

impl fmt::Display for AppendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AppendKind::Malformed => "malformed record",
            AppendKind::DuplicateAppend => "duplicate append",
            AppendKind::DuplicateElement => "duplicate element",
            AppendKind::IncompatibleOrder => "incompatible order",
            AppendKind::GarbageRead => "garbage read",
            AppendKind::Internal => "internal inconsistency",
            AppendKind::G1a => "G1a aborted read",
            AppendKind::G1b => "G1b intermediate read",
            AppendKind::LostAppend => "lost append",
            AppendKind::G0 => "G0 write cycle",
            AppendKind::G1c => "G1c circular information flow",
            AppendKind::GSingle => "G-single anti-dependency cycle",
            AppendKind::G2 => "G2 anti-dependency cycle",
            AppendKind::RealTime => "real-time cycle",
        })
    }
}

/// One anomaly of a list-append history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppendAnomaly {
    /// A malformed record, as the version checker reports it.
    Malformed(Anomaly),
    /// `element` appended to `key` by `first` and again by `second`.
    DuplicateAppend {
        /// Key.
        key: u64,
        /// Element.
        element: u64,
        /// First appender.
        first: TxnId,
        /// Second appender.
        second: TxnId,
    },
    /// `reader` read a list of `key` holding `element` twice.
    DuplicateElement {
        /// Key.
        key: u64,
        /// Reader.
        reader: TxnId,
        /// The repeated element.
        element: u64,
    },
    /// `reader`'s list of `key` is not a prefix of `longest_reader`'s (the longest).
    IncompatibleOrder {
        /// Key.
        key: u64,
        /// Reader.
        reader: TxnId,
        /// What it read.
        read: Vec<u64>,
        /// The reader of the longest list.
        longest_reader: TxnId,
        /// The longest list.
        longest: Vec<u64>,
    },
    /// `reader` read `element` of `key`, which nobody appended.
    GarbageRead {
        /// Key.
        key: u64,
        /// Reader.
        reader: TxnId,
        /// Element.
        element: u64,
    },
    /// `txn` appended `own` to `key` and then read `read`, which does not end in them.
    Internal {
        /// Key.
        key: u64,
        /// The transaction.
        txn: TxnId,
        /// Its appends to the key before the read.
        own: Vec<u64>,
        /// What it read.
        read: Vec<u64>,
    },
    /// G1a: committed `reader` read `writer`'s `element` of `key`; `writer` aborted.
    AbortedRead {
        /// Key.
        key: u64,
        /// Reader.
        reader: TxnId,
        /// Element.
        element: u64,
        /// Its appender.
        writer: TxnId,
        /// The appender's recorded outcome.
        writer_outcome: TxnOutcome,
    },
    /// G1b: `reader` read a list ending in `element`, which `writer` followed with its own
    /// `final_element` of `key`.
    IntermediateRead {
        /// Key.
        key: u64,
        /// Reader.
        reader: TxnId,
        /// The intermediate element.
        element: u64,
        /// Its appender.
        writer: TxnId,
        /// The appender's last element of the key.
        final_element: u64,
    },
    /// `appender` committed `element` to `key`, no read ever showed it, and `reader` read
    /// the key after `appender` ended.
    LostAppend {
        /// Key.
        key: u64,
        /// Element.
        element: u64,
        /// Its appender.
        appender: TxnId,
        /// A reader that began after the appender ended.
        reader: TxnId,
    },
    /// A dependency cycle.
    Cycle {
        /// G0, G1c, G-single, G2 or real-time.
        kind: AppendKind,
        /// Its steps; the last step's `to` is the first's `from`.
        steps: Vec<AppendStep>,
    },
}

impl AppendAnomaly {
    /// Its short name.
    #[must_use]
    pub fn kind(&self) -> AppendKind {
        match self {
            AppendAnomaly::Malformed(_) => AppendKind::Malformed,
            AppendAnomaly::DuplicateAppend { .. } => AppendKind::DuplicateAppend,
            AppendAnomaly::DuplicateElement { .. } => AppendKind::DuplicateElement,
            AppendAnomaly::IncompatibleOrder { .. } => AppendKind::IncompatibleOrder,
            AppendAnomaly::GarbageRead { .. } => AppendKind::GarbageRead,
            AppendAnomaly::Internal { .. } => AppendKind::Internal,
            AppendAnomaly::AbortedRead { .. } => AppendKind::G1a,
            AppendAnomaly::IntermediateRead { .. } => AppendKind::G1b,
            AppendAnomaly::LostAppend { .. } => AppendKind::LostAppend,
            AppendAnomaly::Cycle { kind, .. } => *kind,
        }
    }
}

/// What the append checker looked at.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AppendStats {
    /// Transactions in the history.
    pub transactions: usize,
    /// Keys with an inferred order.
    pub keys: usize,
    /// Reads by transactions that count as committed.
    pub reads: usize,
    /// Of those, reads that entered the graph.
    pub clean_reads: usize,
    /// Appends that got a position in their key's order.
    pub placed_appends: usize,
    /// The graph the cycle search ran on.
    pub graph: CheckStats,
}

/// The append checker's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendReport {
    /// Anomalies kept (at most [`CheckOptions::max_anomalies`] of the value anomalies, and
    /// as many cycles).
    pub anomalies: Vec<AppendAnomaly>,
    /// Anomalies found and not kept.
    pub omitted: usize,
    /// Sizes.
    pub stats: AppendStats,
}

impl AppendReport {
    /// No anomaly.
    #[must_use]
    pub fn is_ok(&self) -> bool {
        self.anomalies.is_empty() && self.omitted == 0
    }
    /// Anomalies found, kept or not.
    #[must_use]
    pub fn total(&self) -> usize {
        self.anomalies.len() + self.omitted
    }
    /// Whether a kept anomaly is of this kind.
    #[must_use]
    pub fn has(&self, kind: AppendKind) -> bool {
        self.anomalies.iter().any(|a| a.kind() == kind)
    }
}

/// Checks a list-append history (see the module docs).
///
/// # Panics
/// If the history has more than 2^29 transactions.
#[must_use]
pub fn check_append(txns: &[AppendTxn], options: &CheckOptions) -> AppendReport {
    let mut values: Vec<AppendAnomaly> = Vec::new();
    let ix = Inference::new(txns, options.strict, &mut values);
    let report = check_with(&ix.history(), options);
    let mut stats = ix.stats;
    stats.graph = report.stats;
    let cycles = report.anomalies.into_iter().map(|a| match a {
        Anomaly::Cycle(c) => AppendAnomaly::Cycle {
            kind: class_kind(c.class),
            steps: c.steps.iter().map(|s| ix.step(s)).collect(),
        },
        other => AppendAnomaly::Malformed(other),
    });
    let mut anomalies = Vec::new();
    let mut omitted = report.omitted;
    for a in values.into_iter().chain(cycles) {
        if anomalies.len() < options.max_anomalies {
            anomalies.push(a);
        } else {
            omitted += 1;
        }
    }
    AppendReport {
        anomalies,
        omitted,
        stats,
    }
}

fn class_kind(c: CycleClass) -> AppendKind {
    match c {
        CycleClass::G0 => AppendKind::G0,
        CycleClass::G1c => AppendKind::G1c,
        CycleClass::GSingle => AppendKind::GSingle,
        CycleClass::G2 => AppendKind::G2,
        CycleClass::RealTime => AppendKind::RealTime,
    }
}

/// The table every key of the synthesized history lives in.
const TABLE: TableId = TableId(0);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Committed,
    Aborted,
    UnknownCommitted,
    UnknownAborted,
}

impl St {
    fn counts(self) -> bool {
        matches!(self, St::Committed | St::UnknownCommitted)
    }
}

/// What the values say: appenders, statuses, per-key orders, which reads are clean.
struct Inference<'a> {
    txns: &'a [AppendTxn],
    strict: bool,
    /// (key, element) → appending transaction (the first, if appended twice).
    appender: BTreeMap<(u64, u64), u32>,
    /// (txn, key) → its last element appended to the key.
    last_append: BTreeMap<(u32, u64), u64>,
    status: Vec<St>,
    /// Key → its inferred order.
    order: BTreeMap<u64, Vec<u64>>,
    /// (key, element) → 1-based position in the order.
    pos: BTreeMap<(u64, u64), u64>,
    /// (txn, op index) of reads that enter the graph.
    clean: BTreeSet<(u32, u32)>,
    stats: AppendStats,
}

impl<'a> Inference<'a> {
    fn new(txns: &'a [AppendTxn], strict: bool, out: &mut Vec<AppendAnomaly>) -> Self {
        let mut ix = Inference {
            txns,
            strict,
            appender: BTreeMap::new(),
            last_append: BTreeMap::new(),
            status: Vec::new(),
            order: BTreeMap::new(),
            pos: BTreeMap::new(),
            clean: BTreeSet::new(),
            stats: AppendStats {
                transactions: txns.len(),
                ..AppendStats::default()
            },
        };
        ix.index_appends(out);
        ix.resolve_status();
        let incompatible = ix.infer_orders(out);
        ix.judge_reads(&incompatible, out);
        ix.lost_appends(&incompatible, out);
        ix.stats.placed_appends = ix
            .pos
            .keys()
            .filter(|k| ix.appender.contains_key(k))
            .count();
        ix
    }

    fn reads(&self, t: u32) -> impl Iterator<Item = (u32, u64, &'a [u64])> + 'a {
        self.txns[t as usize]
            .ops
            .iter()
            .enumerate()
            .filter_map(|(j, op)| match op {
                MicroOp::Read { key, list } => Some((j as u32, *key, &list[..])),
                MicroOp::Append { .. } => None,
            })
    }

    fn id(&self, t: u32) -> TxnId {
        self.txns[t as usize].id
    }

    fn index_appends(&mut self, out: &mut Vec<AppendAnomaly>) {
        for (t, txn) in self.txns.iter().enumerate() {
            for op in &txn.ops {
                let MicroOp::Append { key, element } = *op else {
                    continue;
                };
                if let Some(&first) = self.appender.get(&(key, element)) {
                    out.push(AppendAnomaly::DuplicateAppend {
                        key,
                        element,
                        first: self.txns[first as usize].id,
                        second: txn.id,
                    });
                    continue;
                }
                self.appender.insert((key, element), t as u32);
                self.last_append.insert((t as u32, key), element);
            }
        }
    }

    /// Committed and aborted as recorded; an Unknown one counts as committed iff a
    /// transaction that counts as committed read one of its elements (transitively).
    fn resolve_status(&mut self) {
        self.status = self
            .txns
            .iter()
            .map(|t| match t.outcome {
                TxnOutcome::Committed => St::Committed,
                TxnOutcome::Aborted => St::Aborted,
                TxnOutcome::Unknown => St::UnknownAborted,
            })
            .collect();
        if !self.status.contains(&St::UnknownAborted) {
            return;
        }
        let mut work: Vec<u32> = (0..self.txns.len() as u32)
            .filter(|&t| self.status[t as usize] == St::Committed)
            .collect();
        while let Some(t) = work.pop() {
            for (_, key, list) in self.reads(t) {
                for &e in list {
                    if let Some(&w) = self.appender.get(&(key, e))
                        && self.status[w as usize] == St::UnknownAborted
                    {
                        self.status[w as usize] = St::UnknownCommitted;
                        work.push(w);
                    }
                }
            }
        }
    }

    /// Per key, the longest committed list is the order; the others must be its prefixes.
    /// Returns the reads that are not.
    fn infer_orders(&mut self, out: &mut Vec<AppendAnomaly>) -> BTreeSet<(u32, u32)> {
        // Key → (reader, op index, list) of the longest list so far.
        let mut longest: BTreeMap<u64, (u32, &'a [u64])> = BTreeMap::new();
        for t in 0..self.txns.len() as u32 {
            if !self.status[t as usize].counts() {
                continue;
            }
            for (_, key, list) in self.reads(t) {
                self.stats.reads += 1;
                let entry = longest.entry(key).or_insert((t, list));
                if list.len() > entry.1.len() {
                    *entry = (t, list);
                }
            }
        }
        let mut incompatible = BTreeSet::new();
        for t in 0..self.txns.len() as u32 {
            if !self.status[t as usize].counts() {
                continue;
            }
            for (j, key, list) in self.reads(t) {
                let (lt, l) = longest[&key];
                // A prefix of a list without duplicates has none: only the longest lists
                // and the reads that are not their prefixes are searched.
                let prefix = l.starts_with(list);
                if (!prefix || core::ptr::eq(l, list))
                    && let Some(e) = first_duplicate(list)
                {
                    out.push(AppendAnomaly::DuplicateElement {
                        key,
                        reader: self.id(t),
                        element: e,
                    });
                }
                if !prefix {
                    incompatible.insert((t, j));
                    out.push(AppendAnomaly::IncompatibleOrder {
                        key,
                        reader: self.id(t),
                        read: list.to_vec(),
                        longest_reader: self.id(lt),
                        longest: l.to_vec(),
                    });
                }
            }
        }
        for (key, (_, l)) in longest {
            if first_duplicate(l).is_some() {
                continue;
            }
            for (i, &e) in l.iter().enumerate() {
                self.pos.insert((key, e), i as u64 + 1);
            }
            self.order.insert(key, l.to_vec());
        }
        self.stats.keys = self.order.len();
        incompatible
    }
}

/// The first element that occurs twice in `list`.
fn first_duplicate(list: &[u64]) -> Option<u64> {
    let mut seen = BTreeSet::new();
    list.iter().copied().find(|&e| !seen.insert(e))
}

impl Inference<'_> {
    /// G1a, G1b, garbage and internal reads; the others (compatible, on an ordered key)
    /// are clean and enter the graph. A compatible read is a prefix of its key's order, so
    /// its elements are judged once per key: only the order's bad positions are visited.
    fn judge_reads(&mut self, incompatible: &BTreeSet<(u32, u32)>, out: &mut Vec<AppendAnomaly>) {
        let mut garbage_seen = BTreeSet::new();
        let bad: BTreeMap<u64, Vec<usize>> = self
            .order
            .iter()
            .map(|(&k, o)| {
                let positions = (0..o.len())
                    .filter(|&i| {
                        self.appender
                            .get(&(k, o[i]))
                            .is_none_or(|&w| !self.status[w as usize].counts())
                    })
                    .collect();
                (k, positions)
            })
            .collect();
        for t in 0..self.txns.len() as u32 {
            if !self.status[t as usize].counts() {
                continue;
            }
            for (j, key, list) in self.reads(t) {
                let ordered = !incompatible.contains(&(t, j)) && self.order.contains_key(&key);
                let mut clean = ordered;
                let mut judge = |e: u64| self.judge_element(t, key, e, &mut garbage_seen, out);
                if ordered {
                    for &i in bad[&key].iter().take_while(|&&i| i < list.len()) {
                        clean &= judge(list[i]);
                    }
                } else {
                    for &e in list {
                        judge(e);
                    }
                }
                clean &= self.intermediate_ok(t, key, list, out);
                clean &= self.internal_ok(t, j, key, list, out);
                if clean {
                    self.clean.insert((t, j));
                    self.stats.clean_reads += 1;
                }
            }
        }
    }

    /// A garbage element (reported once per key and element) or an aborted one (G1a);
    /// whether the element is fine.
    fn judge_element(
        &self,
        t: u32,
        key: u64,
        e: u64,
        garbage_seen: &mut BTreeSet<(u64, u64)>,
        out: &mut Vec<AppendAnomaly>,
    ) -> bool {
        match self.appender.get(&(key, e)) {
            None => {
                if garbage_seen.insert((key, e)) {
                    out.push(AppendAnomaly::GarbageRead {
                        key,
                        reader: self.id(t),
                        element: e,
                    });
                }
                false
            }
            Some(&w) if !self.status[w as usize].counts() => {
                out.push(AppendAnomaly::AbortedRead {
                    key,
                    reader: self.id(t),
                    element: e,
                    writer: self.id(w),
                    writer_outcome: self.txns[w as usize].outcome,
                });
                false
            }
            Some(_) => true,
        }
    }

    /// G1b: the list ends in an element its appender (another transaction) followed with
    /// another append to the key.
    fn intermediate_ok(
        &self,
        t: u32,
        key: u64,
        list: &[u64],
        out: &mut Vec<AppendAnomaly>,
    ) -> bool {
        let Some(&e) = list.last() else { return true };
        let Some(&w) = self.appender.get(&(key, e)) else {
            return true;
        };
        let last = self.last_append[&(w, key)];
        if w == t || last == e {
            return true;
        }
        out.push(AppendAnomaly::IntermediateRead {
            key,
            reader: self.id(t),
            element: e,
            writer: self.id(w),
            final_element: last,
        });
        false
    }

    /// The transaction's own appends to the key before this read are the list's tail.
    fn internal_ok(
        &self,
        t: u32,
        j: u32,
        key: u64,
        list: &[u64],
        out: &mut Vec<AppendAnomaly>,
    ) -> bool {
        let own: Vec<u64> = self.txns[t as usize].ops[..j as usize]
            .iter()
            .filter_map(|op| match *op {
                MicroOp::Append { key: k, element } if k == key => Some(element),
                _ => None,
            })
            .collect();
        if list.ends_with(&own) {
            return true;
        }
        out.push(AppendAnomaly::Internal {
            key,
            txn: self.id(t),
            own,
            read: list.to_vec(),
        });
        false
    }

    /// With real time: a committed append no read showed, although a committed read of the
    /// key began after the appender ended.
    fn lost_appends(&self, incompatible: &BTreeSet<(u32, u32)>, out: &mut Vec<AppendAnomaly>) {
        if !self.strict {
            return;
        }
        // Key → the committed read of it that began last.
        let mut latest: BTreeMap<u64, (Nanos, u32)> = BTreeMap::new();
        // What a read showed outside its key's order (the order's elements are in `pos`).
        let mut seen: BTreeSet<(u64, u64)> = BTreeSet::new();
        for t in 0..self.txns.len() as u32 {
            if self.status[t as usize] != St::Committed {
                continue;
            }
            let begin = self.txns[t as usize].begin;
            for (j, key, list) in self.reads(t) {
                if incompatible.contains(&(t, j)) {
                    seen.extend(list.iter().map(|&e| (key, e)));
                }
                let e = latest.entry(key).or_insert((begin, t));
                if begin > e.0 {
                    *e = (begin, t);
                }
            }
        }
        for (&(key, element), &w) in &self.appender {
            if self.status[w as usize] != St::Committed
                || self.pos.contains_key(&(key, element))
                || seen.contains(&(key, element))
            {
                continue;
            }
            if !self.order.contains_key(&key) {
                continue; // its reads disagree: reported already
            }
            if let Some(&(begin, r)) = latest.get(&key)
                && begin > self.txns[w as usize].end
            {
                out.push(AppendAnomaly::LostAppend {
                    key,
                    element,
                    appender: self.id(w),
                    reader: self.id(r),
                });
            }
        }
    }

    /// The history the cycle search runs on: transactions that count as committed, each
    /// placed append as a write of version = its position, each clean read as a read of
    /// version = its length, attributed to the appender of its last element.
    fn history(&self) -> History {
        let mut h = History::new();
        for (t, txn) in self.txns.iter().enumerate() {
            let st = self.status[t];
            if !st.counts() {
                continue;
            }
            let mut writes = Vec::new();
            let mut reads = Vec::new();
            for (j, op) in txn.ops.iter().enumerate() {
                match op {
                    MicroOp::Append { key, element } => {
                        if let Some(&p) = self.pos.get(&(*key, *element)) {
                            writes.push(WriteEvent {
                                table: TABLE,
                                key: Key(*key),
                                version: Version(p),
                                kind: WriteKind::Update,
                            });
                        }
                    }
                    MicroOp::Read { key, list } => {
                        if !self.clean.contains(&(t as u32, j as u32)) {
                            continue;
                        }
                        let mut r = ReadEvent::new(TABLE, Key(*key), Version(list.len() as u64));
                        if let Some(&e) = list.last() {
                            let w = self.appender[&(*key, e)];
                            if w != t as u32 {
                                r = r.written_by(self.txns[w as usize].id);
                            }
                        }
                        reads.push(r);
                    }
                }
            }
            h.push(TxnRecord {
                id: txn.id,
                begin: txn.begin,
                // Counted committed from the evidence: no outgoing real-time edges.
                end: if st == St::UnknownCommitted {
                    Nanos::MAX
                } else {
                    txn.end
                },
                outcome: TxnOutcome::Committed,
                reads,
                writes,
            });
        }
        h
    }

    fn element(&self, key: u64, version: Version) -> u64 {
        self.order[&key][version.0 as usize - 1]
    }

    /// A cycle step of the version checker, in elements.
    fn step(&self, s: &super::report::CycleStep) -> AppendStep {
        let edge = match s.dependency {
            Dependency::WriteWrite {
                key,
                overwritten,
                installed,
                ..
            } => AppendEdge::WriteWrite {
                key: key.0,
                before: self.element(key.0, overwritten),
                after: self.element(key.0, installed),
            },
            Dependency::WriteRead { key, version, .. } => AppendEdge::WriteRead {
                key: key.0,
                element: self.element(key.0, version),
            },
            Dependency::ReadWrite {
                key,
                read,
                overwritten_by,
                ..
            } => AppendEdge::ReadWrite {
                key: key.0,
                last: (read != Version::INITIAL).then(|| self.element(key.0, read)),
                missed: self.element(key.0, overwritten_by),
            },
            Dependency::RealTime { from_end, to_begin } => {
                AppendEdge::RealTime { from_end, to_begin }
            }
        };
        AppendStep {
            from: s.from,
            to: s.to,
            edge,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Explanations
// ---------------------------------------------------------------------------------------------

/// A list, printed `[a, b, c]`, shortened to its last 6 elements.
struct List<'a>(&'a [u64]);

impl fmt::Display for List<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let skip = self.0.len().saturating_sub(6);
        f.write_str("[")?;
        if skip > 0 {
            write!(f, "…{skip} more, ")?;
        }
        for (i, e) in self.0[skip..].iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{e}")?;
        }
        f.write_str("]")
    }
}

impl fmt::Display for AppendStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b) = (self.from, self.to);
        match self.edge {
            AppendEdge::WriteWrite { key, before, after } => write!(
                f,
                "{a} -ww-> {b} (k{key}: {b} appended {after} right after {a}'s {before})"
            ),
            AppendEdge::WriteRead { key, element } => write!(
                f,
                "{a} -wr-> {b} (k{key}: {b} read a list ending in {a}'s {element})"
            ),
            AppendEdge::ReadWrite { key, last, missed } => {
                write!(f, "{a} -rw-> {b} (k{key}: {a} read ")?;
                match last {
                    Some(l) => write!(f, "up to {l}")?,
                    None => f.write_str("the empty list")?,
                }
                write!(f, ", {b} appended the next element {missed})")
            }
            AppendEdge::RealTime { from_end, to_begin } => write!(
                f,
                "{a} -rt-> {b} ({a} ended at {from_end} ns, before {b} began at {to_begin} ns)"
            ),
        }
    }
}

impl fmt::Display for AppendAnomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.kind())?;
        match self {
            AppendAnomaly::Malformed(a) => write!(f, "{a}"),
            AppendAnomaly::DuplicateAppend {
                key,
                element,
                first,
                second,
            } => write!(f, "{first} and {second} both appended {element} to k{key}"),
            AppendAnomaly::DuplicateElement {
                key,
                reader,
                element,
            } => write!(f, "{reader} read a list of k{key} holding {element} twice"),
            AppendAnomaly::IncompatibleOrder {
                key,
                reader,
                read,
                longest_reader,
                longest,
            } => write!(
                f,
                "{reader} read k{key} = {}, not a prefix of {longest_reader}'s {} \
                 (an element vanished or moved: a lost update or a torn write)",
                List(read),
                List(longest)
            ),
            AppendAnomaly::GarbageRead {
                key,
                reader,
                element,
            } => write!(
                f,
                "{reader} read {element} in k{key}, which nobody appended"
            ),
            AppendAnomaly::Internal {
                key,
                txn,
                own,
                read,
            } => write!(
                f,
                "{txn} appended {} to k{key} and then read {}, which does not end in them",
                List(own),
                List(read)
            ),
            AppendAnomaly::AbortedRead {
                key,
                reader,
                element,
                writer,
                writer_outcome,
            } => write!(
                f,
                "{reader} committed after reading {element} in k{key}, appended by {writer} \
                 ({writer_outcome:?})"
            ),
            AppendAnomaly::IntermediateRead {
                key,
                reader,
                element,
                writer,
                final_element,
            } => write!(
                f,
                "{reader} read k{key} ending in {writer}'s {element}, which {writer} followed \
                 with its own {final_element}"
            ),
            AppendAnomaly::LostAppend {
                key,
                element,
                appender,
                reader,
            } => write!(
                f,
                "{appender} committed {element} to k{key}, no read ever showed it, and \
                 {reader} read k{key} after {appender} ended"
            ),
            AppendAnomaly::Cycle { steps, .. } => {
                write!(f, "{} transactions: ", steps.len())?;
                for (i, s) in steps.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{s}")?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for AppendReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.stats;
        write!(
            f,
            "checked {} transactions, {} keys ordered, {} reads ({} clean), {} appends \
             placed, edges: {} ww, {} wr, {} rw, {} rt: ",
            s.transactions,
            s.keys,
            s.reads,
            s.clean_reads,
            s.placed_appends,
            s.graph.ww_edges,
            s.graph.wr_edges,
            s.graph.rw_edges,
            s.graph.rt_edges
        )?;
        if self.is_ok() {
            return f.write_str("no anomaly");
        }
        write!(f, "{} anomalies", self.total())?;
        for (i, a) in self.anomalies.iter().enumerate() {
            write!(f, "\n{}. {a}", i + 1)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::Isolation;
    use crate::model::CoordinatorId;
    use alloc::vec;

    fn ap(key: u64, element: u64) -> MicroOp {
        MicroOp::Append { key, element }
    }
    fn rd(key: u64, list: &[u64]) -> MicroOp {
        MicroOp::Read {
            key,
            list: list.to_vec(),
        }
    }
    fn t(seq: u64, begin: Nanos, end: Nanos, ops: Vec<MicroOp>) -> AppendTxn {
        AppendTxn {
            id: TxnId {
                coordinator: CoordinatorId(0),
                seq,
            },
            begin,
            end,
            outcome: TxnOutcome::Committed,
            ops,
        }
    }
    fn with(mut x: AppendTxn, outcome: TxnOutcome) -> AppendTxn {
        x.outcome = outcome;
        x
    }
    fn check(txns: &[AppendTxn]) -> AppendReport {
        check_append(txns, &CheckOptions::default())
    }
    fn only(r: &AppendReport, kind: AppendKind) {
        assert!(
            r.has(kind) && r.anomalies.iter().all(|a| a.kind() == kind),
            "expected only {kind}, got {r}"
        );
    }

    #[test]
    fn a_serial_history_passes_with_its_edges() {
        let h = [
            t(1, 0, 10, vec![ap(1, 1), ap(2, 1)]),
            t(2, 20, 30, vec![rd(1, &[1]), ap(1, 2)]),
            t(3, 40, 50, vec![rd(1, &[1, 2]), rd(2, &[1])]),
            // Concurrent with T3 and reading the older list: fine without real time.
            t(4, 5, 45, vec![rd(2, &[])]),
        ];
        let r = check(&h);
        assert!(r.is_ok(), "{r}");
        assert_eq!(r.stats.keys, 2);
        assert_eq!(r.stats.graph.ww_edges, 1);
        assert!(r.stats.graph.wr_edges >= 2 && r.stats.graph.rw_edges >= 1);
    }

    #[test]
    fn g0_write_cycle() {
        let h = [
            t(1, 0, 10, vec![ap(1, 1), ap(2, 1)]),
            t(2, 0, 10, vec![ap(1, 2), ap(2, 2)]),
            t(3, 20, 30, vec![rd(1, &[1, 2]), rd(2, &[2, 1])]),
        ];
        let r = check(&h);
        only(&r, AppendKind::G0);
        let AppendAnomaly::Cycle { steps, .. } = &r.anomalies[0] else {
            panic!()
        };
        assert_eq!(steps.len(), 2);
        assert!(
            steps
                .iter()
                .all(|s| matches!(s.edge, AppendEdge::WriteWrite { .. }))
        );
    }

    #[test]
    fn g1a_aborted_read_anywhere_in_the_list() {
        let h = [
            with(t(1, 0, 10, vec![ap(1, 1)]), TxnOutcome::Aborted),
            t(2, 0, 10, vec![ap(1, 2)]),
            t(3, 20, 30, vec![rd(1, &[1, 2])]),
        ];
        only(&check(&h), AppendKind::G1a);
    }

    #[test]
    fn g1b_intermediate_read() {
        let h = [
            t(1, 0, 10, vec![ap(1, 1), ap(1, 2)]),
            t(2, 0, 10, vec![rd(1, &[1])]),
            t(3, 20, 30, vec![rd(1, &[1, 2])]),
        ];
        only(&check(&h), AppendKind::G1b);
    }

    #[test]
    fn g1c_circular_information_flow() {
        let h = [
            t(1, 0, 10, vec![ap(1, 1), rd(2, &[2])]),
            t(2, 0, 10, vec![ap(2, 2), rd(1, &[1])]),
        ];
        only(&check(&h), AppendKind::G1c);
    }

    #[test]
    fn g_single_read_skew_even_under_snapshot_isolation() {
        let h = [
            t(1, 0, 10, vec![ap(1, 1), ap(2, 2)]),
            t(2, 0, 10, vec![rd(1, &[]), rd(2, &[2])]),
            t(3, 20, 30, vec![rd(1, &[1])]),
        ];
        only(&check(&h), AppendKind::GSingle);
        let si = CheckOptions {
            isolation: Isolation::Snapshot,
            ..CheckOptions::default()
        };
        assert!(check_append(&h, &si).has(AppendKind::GSingle));
    }

    #[test]
    fn g2_write_skew_is_allowed_under_snapshot_isolation() {
        let h = [
            t(1, 0, 10, vec![rd(1, &[]), ap(2, 2)]),
            t(2, 0, 10, vec![rd(2, &[]), ap(1, 1)]),
            t(3, 20, 30, vec![rd(1, &[1]), rd(2, &[2])]),
        ];
        only(&check(&h), AppendKind::G2);
        let si = CheckOptions {
            isolation: Isolation::Snapshot,
            ..CheckOptions::default()
        };
        let r = check_append(&h, &si);
        assert!(r.is_ok(), "{r}");
    }

    #[test]
    fn a_stale_read_is_a_real_time_cycle_only_when_strict() {
        let h = [
            t(1, 0, 10, vec![ap(1, 1)]),
            t(2, 20, 30, vec![rd(1, &[])]),
            t(3, 40, 50, vec![rd(1, &[1])]),
        ];
        only(&check(&h), AppendKind::RealTime);
        let plain = CheckOptions {
            strict: false,
            ..CheckOptions::default()
        };
        assert!(check_append(&h, &plain).is_ok());
    }

    #[test]
    fn duplicate_elements_and_incompatible_orders() {
        let dup = [
            t(1, 0, 10, vec![ap(1, 1)]),
            t(2, 20, 30, vec![rd(1, &[1, 1])]),
        ];
        only(&check(&dup), AppendKind::DuplicateElement);
        let forked = [
            t(1, 0, 10, vec![ap(1, 1)]),
            t(2, 0, 10, vec![ap(1, 2)]),
            t(3, 0, 10, vec![ap(1, 3)]),
            t(4, 20, 30, vec![rd(1, &[1, 2])]),
            t(5, 20, 30, vec![rd(1, &[1, 3])]),
        ];
        only(&check(&forked), AppendKind::IncompatibleOrder);
        let twice = [t(1, 0, 10, vec![ap(1, 1)]), t(2, 0, 10, vec![ap(1, 1)])];
        only(&check(&twice), AppendKind::DuplicateAppend);
    }

    #[test]
    fn garbage_reads_and_lost_appends() {
        let garbage = [t(1, 0, 10, vec![rd(1, &[99])])];
        only(&check(&garbage), AppendKind::GarbageRead);
        let lost = [t(1, 0, 10, vec![ap(1, 5)]), t(2, 20, 30, vec![rd(1, &[])])];
        only(&check(&lost), AppendKind::LostAppend);
        // A read concurrent with the append may miss it.
        let concurrent = [t(1, 0, 10, vec![ap(1, 5)]), t(2, 5, 30, vec![rd(1, &[])])];
        assert!(check(&concurrent).is_ok());
    }

    #[test]
    fn own_appends_must_be_the_tail_of_a_later_read() {
        let h = [t(1, 0, 10, vec![ap(1, 1), rd(1, &[])])];
        only(&check(&h), AppendKind::Internal);
        let ok = [t(1, 0, 10, vec![ap(1, 1), rd(1, &[1])])];
        assert!(check(&ok).is_ok());
    }

    #[test]
    fn unknown_outcomes_count_only_when_observed() {
        // T1's append was observed: counted committed, its own read judged (G1c with T2).
        let h = [
            with(
                t(1, 0, 10, vec![ap(1, 1), rd(2, &[2])]),
                TxnOutcome::Unknown,
            ),
            t(2, 0, 10, vec![ap(2, 2), rd(1, &[1])]),
        ];
        only(&check(&h), AppendKind::G1c);
        // Never observed: ignored, neither lost nor read.
        let unseen = [
            with(t(1, 0, 10, vec![ap(1, 1)]), TxnOutcome::Unknown),
            t(2, 20, 30, vec![rd(1, &[])]),
        ];
        assert!(check(&unseen).is_ok());
        // Counted committed: no outgoing real-time edge (recovery may apply it late).
        let late = [
            with(t(1, 0, 10, vec![ap(1, 1)]), TxnOutcome::Unknown),
            t(2, 20, 30, vec![rd(1, &[])]),
            t(3, 40, 50, vec![rd(1, &[1])]),
        ];
        assert!(check(&late).is_ok(), "{}", check(&late));
    }

    #[test]
    fn the_report_names_elements() {
        let h = [
            t(1, 0, 10, vec![ap(1, 1), ap(2, 2)]),
            t(2, 0, 10, vec![rd(1, &[]), rd(2, &[2])]),
            t(3, 20, 30, vec![rd(1, &[1])]),
        ];
        let text = alloc::format!("{}", check(&h));
        assert!(text.contains("read the empty list"), "{text}");
        assert!(text.contains("read a list ending in T0.1's 2"), "{text}");
    }
}
