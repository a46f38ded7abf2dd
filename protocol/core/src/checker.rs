//! The history checker every protocol uses: serializability and strict serializability from
//! recorded versions.
//!
//! # Formalism
//!
//! The checker follows Adya's dependency-graph formalism (A. Adya, *Weak Consistency: A
//! Generalized Theory and Optimistic Implementations for Distributed Transactions*, MIT 1999;
//! Adya, Liskov, O'Neil, ICDE 2000), which Pandora §5 names as the reference for its litmus
//! tests ("Adya's Histories"): the litmus tests there are built to cover every dependency cycle
//! that serializability forbids, and this checker is the history-side judge of the same cycles.
//!
//! * **Version order.** Per record `(table, key)`, the committed versions are ordered by their
//!   [`Version`] number (the model promises numbers grow in install order); the loaded state
//!   [`Version::INITIAL`] comes first and has no installer. Only a transaction's *final*
//!   version of a record enters the order (Adya's installed versions); if a transaction wrote
//!   the record several times, the smaller numbers are its *intermediate* versions.
//! * **Edges** between committed transactions (a transaction never depends on itself):
//!   - `ww` (write dependency): installer of `v` → installer of the next version after `v`;
//!   - `wr` (read dependency): installer of `v` → every reader of `v`;
//!   - `rw` (anti-dependency): reader of `v` → installer of the next version after `v`;
//!   - `rt` (real-time order, only with [`CheckOptions::strict`]): `T1 → T2` when
//!     `T1.end < T2.begin`. Serializability forbids cycles of `ww`/`wr`/`rw` edges; strict
//!     serializability also forbids cycles that need an `rt` edge.
//! * **Cycles** are classified by the kinds of their edges, as Adya does: **G0** (only `ww`,
//!   a write cycle), **G1c** (`ww` and `wr`, circular information flow), **G-single** (exactly
//!   one `rw`: read skew, lost update), **G2** (two or more `rw`: write skew), and
//!   **real-time** cycles (need an `rt` edge: a stale read or a lost committed write under
//!   strict serializability).
//! * **Per-read anomalies**: **G1a** (a committed transaction read a version installed only by
//!   an aborted one), **G1b** (it read another transaction's intermediate version), and
//!   *phantom versions* (a version nobody in the history installed: corrupted, torn or
//!   invented).
//! * **Per-record anomalies**: a *lost write* (two committed transactions installed the same
//!   version number of a record: one of the two writes vanished without a version of its own),
//!   and a *write-kind mismatch* (an insert replacing a present record, or an update/delete
//!   replacing a tombstone: [`WriteKind`] says what a write needs to find).
//! * **Malformed records**: end before begin, a transaction id used twice, a write that claims
//!   to install [`Version::INITIAL`].
//!
//! A stale read — a committed transaction reading a version that a transaction which *ended
//! before it began* had already overwritten, i.e. a committed write that later went missing —
//! surfaces as a real-time cycle `reader -rw-> overwriter -rt-> reader`.
//!
//! # Transactions with an unknown outcome
//!
//! A coordinator that crashed leaves [`TxnOutcome::Unknown`] transactions; recovery (Pandora
//! §3.2) rolls them forward or back. The rule: **an Unknown transaction counts as committed iff
//! a transaction that counts as committed read one of its versions** (transitively: an Unknown
//! counted committed makes its own reads count); otherwise it counts as aborted and its
//! versions are left out of the version order. A version number also installed by a
//! transaction recorded as committed is attributed to that one (FORD-style per-record counters
//! reuse the number of a rolled-back write). A later *blind* overwrite does not count as
//! evidence: a rolled-back write followed by an overwrite leaves the same history as a
//! surviving one. Once counted committed, all of an Unknown transaction's writes must have
//! survived: a partial roll-back shows up as a lost write (its version number reused) or a
//! cycle. An Unknown transaction gets no *outgoing* real-time edges, because recovery may apply
//! its writes after its recorded end; incoming ones (from transactions that ended before it
//! began) apply. Aborted transactions, and Unknown ones counted aborted, are not in the graph
//! and their reads are not judged (no opacity requirement).
//!
//! # Intermediate reads (G1b)
//!
//! A history records each write with the version it installed, so a transaction that wrote a
//! record twice records two versions and the smaller is intermediate; G1b is detected when a
//! protocol records both. Protocols that buffer writes and install only the last one record one
//! version per record, and then there is no intermediate version to read.
//!
//! # Reporting and search
//!
//! Cycles are searched level by level in order of severity — `ww`; `ww`+`wr`; `ww`+`wr`+`rw`;
//! then everything with `rt` — by computing the strongly connected components (iterative
//! Tarjan, no recursion) of each level's graph. A component is reported at the first level it
//! appears with its transactions (a component with the same transactions as one reported at a
//! lower level adds no new information and is skipped). Every edge of the level's new kind
//! inside a component lies on a cycle; the checker runs breadth-first searches from the heads
//! of those edges back to their tails, inside the component, and reports the shortest cycle it
//! found. At the `rw` level it first looks for a cycle whose only `rw` edge is the starting one
//! (G-single) before accepting one with more (G2). Searches past the first per component stop
//! at a work budget of `64 × component size + 4096` edge visits, so in a huge component the
//! cycle is the shortest through the edges searched, not necessarily the global shortest (and a
//! G-single could then be reported as G2); in small components the search is exhaustive.
//!
//! # Real-time edges in linear space
//!
//! `T1.end < T2.begin` can hold for Θ(n²) pairs, so the checker does not add those edges.
//! It adds one auxiliary *time point* node per distinct end instant of a committed transaction,
//! chained in increasing time order (`P_i → P_{i+1}`), an edge `T → P(T.end)` for each
//! committed transaction and an edge `P_j → T` from the latest point `p_j < T.begin` to each
//! transaction in the graph. Correctness: a path `T1 → P_a → … → P_b → T2` exists iff
//! `T1.end = p_a ≤ p_b < T2.begin`, i.e. iff `T1.end < T2.begin` (⇐: take `a` = rank of
//! `T1.end`, `b` = the latest point before `T2.begin`; `p_a < T2.begin` gives `b ≥ a`). Points
//! have no other edges, so every cycle through them maps to a cycle of the original graph with
//! each point run replaced by one `rt` edge, and vice versa. Shortest-cycle searches are 0-1
//! breadth-first searches where edges leaving a point weigh 0, so a cycle's length is its
//! number of transactions.
//!
//! # Cost
//!
//! With `n` transactions, `r` reads and `w` writes: `O((n + r + w) log(n + r + w))` time for the
//! sorts and binary searches, `O(V + E)` per strongly-connected-component pass (at most five,
//! one when the history is valid), and for each *reported* cycle (at most
//! [`CheckOptions::max_anomalies`]) a constant number of searches within the work budget plus
//! at most two unbudgeted `O(V + E)` searches. `V ≤ 2n`, `E ≤ 2r + w + 3n`. Memory is linear:
//! about 32 bytes per write for the install index and another 24 for the version order, 8 per
//! edge, and about 40 per node.
//!
//! # Panics
//!
//! [`check`] panics if the history has more than 2^29 transactions (node ids are packed in 30
//! bits next to the edge kind).

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::fmt;

use dmem_verbs::Nanos;

use crate::history::{History, TxnOutcome, TxnRecord};
use crate::model::{Key, TableId, TxnId, Version, WriteKind};

/// What the checker judges and how much it reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckOptions {
    /// Judge strict serializability (add real-time edges) instead of serializability.
    pub strict: bool,
    /// Keep at most this many anomalies; the rest are only counted
    /// ([`Report::omitted`]).
    pub max_anomalies: usize,
}

impl Default for CheckOptions {
    /// Strict serializability, at most 32 anomalies kept.
    fn default() -> Self {
        Self {
            strict: true,
            max_anomalies: 32,
        }
    }
}

/// Checks a history for strict serializability with the default options.
#[must_use]
pub fn check(history: &History) -> Report {
    check_with(history, &CheckOptions::default())
}

/// Checks a history with the given options.
///
/// # Panics
///
/// If the history has more than 2^29 transactions.
#[must_use]
pub fn check_with(history: &History, options: &CheckOptions) -> Report {
    Checker::new(history, options).run()
}

// ---------------------------------------------------------------------------------------------
// Report types
// ---------------------------------------------------------------------------------------------

/// The checker's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The anomalies found, data anomalies first, then cycles by severity (at most
    /// [`CheckOptions::max_anomalies`]).
    pub anomalies: Vec<Anomaly>,
    /// Anomalies found but not kept.
    pub omitted: usize,
    /// What was checked.
    pub stats: CheckStats,
}

impl Report {
    /// No anomaly at all.
    #[must_use]
    pub fn is_ok(&self) -> bool {
        self.anomalies.is_empty() && self.omitted == 0
    }

    /// Number of anomalies found, kept or not.
    #[must_use]
    pub fn total(&self) -> usize {
        self.anomalies.len() + self.omitted
    }

    /// Whether a kept anomaly is of this kind.
    #[must_use]
    pub fn has(&self, kind: AnomalyKind) -> bool {
        self.anomalies.iter().any(|a| a.kind() == kind)
    }
}

/// Sizes of what the checker looked at.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckStats {
    /// Transactions in the history.
    pub transactions: usize,
    /// Recorded as committed.
    pub committed: usize,
    /// Recorded as aborted.
    pub aborted: usize,
    /// Recorded as Unknown and counted committed (a committed transaction read their writes).
    pub unknown_committed: usize,
    /// Recorded as Unknown and counted aborted.
    pub unknown_aborted: usize,
    /// Reads judged (reads of transactions that count as committed).
    pub reads: usize,
    /// Write-dependency edges (after removing duplicates).
    pub ww_edges: usize,
    /// Read-dependency edges.
    pub wr_edges: usize,
    /// Anti-dependency edges.
    pub rw_edges: usize,
    /// Real-time edges in the linear encoding (through time points).
    pub rt_edges: usize,
    /// Time points added for real-time order.
    pub time_points: usize,
}

/// The short name of an anomaly, for matching and counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AnomalyKind {
    /// A malformed transaction record.
    Malformed,
    /// Two committed installs of one version number.
    LostWrite,
    /// An insert over a present record, or an update/delete of a tombstone.
    WriteKindMismatch,
    /// Adya G1a: a read of an aborted transaction's version.
    G1a,
    /// Adya G1b: a read of another transaction's intermediate version.
    G1b,
    /// A read of a version nobody installed.
    PhantomVersion,
    /// Adya G0: a cycle of write dependencies.
    G0,
    /// Adya G1c: a cycle of write and read dependencies.
    G1c,
    /// Adya G-single: a cycle with exactly one anti-dependency.
    GSingle,
    /// Adya G2: a cycle with two or more anti-dependencies.
    G2,
    /// A cycle that needs real-time order (strict serializability violated).
    RealTime,
}

impl fmt::Display for AnomalyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AnomalyKind::Malformed => "malformed record",
            AnomalyKind::LostWrite => "lost write",
            AnomalyKind::WriteKindMismatch => "write-kind mismatch",
            AnomalyKind::G1a => "G1a aborted read",
            AnomalyKind::G1b => "G1b intermediate read",
            AnomalyKind::PhantomVersion => "phantom version",
            AnomalyKind::G0 => "G0 write cycle",
            AnomalyKind::G1c => "G1c circular information flow",
            AnomalyKind::GSingle => "G-single anti-dependency cycle",
            AnomalyKind::G2 => "G2 anti-dependency cycle",
            AnomalyKind::RealTime => "real-time cycle",
        })
    }
}

/// What is wrong with a malformed transaction record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformation {
    /// The transaction ended before it began.
    EndBeforeBegin {
        /// Recorded begin.
        begin: Nanos,
        /// Recorded end.
        end: Nanos,
    },
    /// Another transaction in the history has the same id.
    DuplicateId,
    /// A write claims to install the loaded state.
    WritesInitialVersion {
        /// Table written.
        table: TableId,
        /// Key written.
        key: Key,
    },
}

/// One edge of a dependency cycle and the evidence for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dependency {
    /// `ww`: `from` installed `overwritten` and `to` the next version `installed`.
    WriteWrite {
        /// Table.
        table: TableId,
        /// Key.
        key: Key,
        /// The version `from` installed.
        overwritten: Version,
        /// The next version, installed by `to`.
        installed: Version,
    },
    /// `wr`: `to` read `version`, which `from` installed.
    WriteRead {
        /// Table.
        table: TableId,
        /// Key.
        key: Key,
        /// The version read.
        version: Version,
    },
    /// `rw`: `from` read `read`, and `to` installed the next version `overwritten_by`.
    ReadWrite {
        /// Table.
        table: TableId,
        /// Key.
        key: Key,
        /// The version `from` read.
        read: Version,
        /// The next version, installed by `to`.
        overwritten_by: Version,
    },
    /// `rt`: `from` ended before `to` began.
    RealTime {
        /// When `from` ended.
        from_end: Nanos,
        /// When `to` began.
        to_begin: Nanos,
    },
}

impl Dependency {
    /// The edge label: `ww`, `wr`, `rw` or `rt`.
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Dependency::WriteWrite { .. } => "ww",
            Dependency::WriteRead { .. } => "wr",
            Dependency::ReadWrite { .. } => "rw",
            Dependency::RealTime { .. } => "rt",
        }
    }
}

/// One step of a cycle: `from` must precede `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CycleStep {
    /// The earlier transaction.
    pub from: TxnId,
    /// The later transaction.
    pub to: TxnId,
    /// Why.
    pub dependency: Dependency,
}

impl fmt::Display for CycleStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b) = (self.from, self.to);
        write!(f, "{a} -{}-> {b} (", self.dependency.label())?;
        match self.dependency {
            Dependency::WriteWrite {
                table,
                key,
                overwritten,
                installed,
            } => write!(
                f,
                "{a} installed v{} of {} and {b} the next version v{}",
                overwritten.0,
                Rec(table, key),
                installed.0
            )?,
            Dependency::WriteRead {
                table,
                key,
                version,
            } => write!(
                f,
                "{b} read v{} of {}, installed by {a}",
                version.0,
                Rec(table, key)
            )?,
            Dependency::ReadWrite {
                table,
                key,
                read,
                overwritten_by,
            } => write!(
                f,
                "{a} read v{} of {}, and {b} installed the next version v{}",
                read.0,
                Rec(table, key),
                overwritten_by.0
            )?,
            Dependency::RealTime { from_end, to_begin } => write!(
                f,
                "{a} ended at {from_end} ns, before {b} began at {to_begin} ns"
            )?,
        }
        f.write_str(")")
    }
}

/// The class of a dependency cycle (Adya's phenomena, plus real-time order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CycleClass {
    /// Only `ww` edges.
    G0,
    /// `ww` and `wr` edges, at least one `wr`.
    G1c,
    /// Exactly one `rw` edge, no `rt`.
    GSingle,
    /// Two or more `rw` edges, no `rt`.
    G2,
    /// At least one `rt` edge.
    RealTime,
}

impl CycleClass {
    fn of(steps: &[CycleStep]) -> CycleClass {
        let mut rw = 0;
        let mut wr = false;
        for s in steps {
            match s.dependency {
                Dependency::RealTime { .. } => return CycleClass::RealTime,
                Dependency::ReadWrite { .. } => rw += 1,
                Dependency::WriteRead { .. } => wr = true,
                Dependency::WriteWrite { .. } => {}
            }
        }
        match (rw, wr) {
            (0, false) => CycleClass::G0,
            (0, true) => CycleClass::G1c,
            (1, _) => CycleClass::GSingle,
            _ => CycleClass::G2,
        }
    }

    fn kind(self) -> AnomalyKind {
        match self {
            CycleClass::G0 => AnomalyKind::G0,
            CycleClass::G1c => AnomalyKind::G1c,
            CycleClass::GSingle => AnomalyKind::GSingle,
            CycleClass::G2 => AnomalyKind::G2,
            CycleClass::RealTime => AnomalyKind::RealTime,
        }
    }

    fn meaning(self) -> &'static str {
        match self {
            CycleClass::G0 => {
                "the transactions' writes interleave on these records and no serial order \
                 installs them (Adya G0, write cycle)"
            }
            CycleClass::G1c => {
                "each transaction saw or overwrote the next one's effects: information flowed \
                 in a circle (Adya G1c)"
            }
            CycleClass::GSingle => {
                "one transaction missed a write that the rest of the cycle depends on: read \
                 skew or a lost update (Adya G-single; forbidden even under snapshot isolation)"
            }
            CycleClass::G2 => {
                "each of several transactions missed another's write: write skew (Adya G2; \
                 not serializable)"
            }
            CycleClass::RealTime => {
                "the cycle needs real-time order: a transaction observed state older than that \
                 of a transaction which committed before it began, a stale read or a lost \
                 committed write (not strictly serializable)"
            }
        }
    }
}

/// A dependency cycle, shortest found in its strongly connected component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle {
    /// Its class.
    pub class: CycleClass,
    /// Its edges in order; the last step's `to` is the first step's `from`.
    pub steps: Vec<CycleStep>,
    /// Transactions in its strongly connected component (of the level's graph).
    pub component_size: usize,
}

/// One anomaly, with what a person needs to find it in the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Anomaly {
    /// A malformed record (the recording, not the protocol, is wrong).
    Malformed {
        /// The transaction.
        txn: TxnId,
        /// What is wrong.
        problem: Malformation,
    },
    /// Lost write: two committed transactions installed the same version of a record.
    LostWrite {
        /// Table.
        table: TableId,
        /// Key.
        key: Key,
        /// The version installed twice.
        version: Version,
        /// One installer (its write is the one the graph keeps).
        first: TxnId,
        /// The other installer.
        second: TxnId,
    },
    /// An insert over a present record, or an update or delete of a tombstone.
    WriteKindMismatch {
        /// The transaction whose write does not fit.
        txn: TxnId,
        /// Table.
        table: TableId,
        /// Key.
        key: Key,
        /// The version it installed.
        version: Version,
        /// Its (first) write kind on the record.
        kind: WriteKind,
        /// The version it replaced in the version order.
        previous: Version,
        /// Who installed that.
        previous_txn: TxnId,
        /// With what (last) write kind.
        previous_kind: WriteKind,
    },
    /// Adya G1a: a committed transaction read a version installed only by an aborted one.
    AbortedRead {
        /// The reader.
        reader: TxnId,
        /// Table.
        table: TableId,
        /// Key.
        key: Key,
        /// The version read.
        version: Version,
        /// Its installer.
        writer: TxnId,
        /// The installer's recorded outcome.
        writer_outcome: TxnOutcome,
    },
    /// Adya G1b: a committed transaction read a version that its installer overwrote itself.
    IntermediateRead {
        /// The reader.
        reader: TxnId,
        /// Table.
        table: TableId,
        /// Key.
        key: Key,
        /// The intermediate version read.
        version: Version,
        /// Its installer.
        writer: TxnId,
        /// The installer's final version of the record.
        final_version: Version,
    },
    /// A committed transaction read a version that no transaction installed.
    PhantomVersion {
        /// The reader.
        reader: TxnId,
        /// Table.
        table: TableId,
        /// Key.
        key: Key,
        /// The version read.
        version: Version,
    },
    /// A dependency cycle (G0, G1c, G-single, G2, or one that needs real-time order).
    Cycle(Cycle),
}

impl Anomaly {
    /// Its short name.
    #[must_use]
    pub fn kind(&self) -> AnomalyKind {
        match self {
            Anomaly::Malformed { .. } => AnomalyKind::Malformed,
            Anomaly::LostWrite { .. } => AnomalyKind::LostWrite,
            Anomaly::WriteKindMismatch { .. } => AnomalyKind::WriteKindMismatch,
            Anomaly::AbortedRead { .. } => AnomalyKind::G1a,
            Anomaly::IntermediateRead { .. } => AnomalyKind::G1b,
            Anomaly::PhantomVersion { .. } => AnomalyKind::PhantomVersion,
            Anomaly::Cycle(c) => c.class.kind(),
        }
    }

    /// The cycle, if this is one.
    #[must_use]
    pub fn cycle(&self) -> Option<&Cycle> {
        match self {
            Anomaly::Cycle(c) => Some(c),
            _ => None,
        }
    }
}

/// A record, printed as `(t<table>, k<key>)`.
struct Rec(TableId, Key);

impl fmt::Display for Rec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "(t{}, k{})", self.0.0, self.1.0)
    }
}

fn kind_name(kind: WriteKind) -> &'static str {
    match kind {
        WriteKind::Update => "an update",
        WriteKind::Insert => "an insert",
        WriteKind::Delete => "a delete",
    }
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.kind())?;
        match self {
            Anomaly::Malformed { txn, problem } => match problem {
                Malformation::EndBeforeBegin { begin, end } => write!(
                    f,
                    "{txn} ended at {end} ns, before it began at {begin} ns; it gets no \
                     real-time edges."
                ),
                Malformation::DuplicateId => write!(
                    f,
                    "{txn} appears more than once in the history; explanations naming it are \
                     ambiguous."
                ),
                Malformation::WritesInitialVersion { table, key } => write!(
                    f,
                    "{txn} records a write of {} installing v0, the loaded state; the write is \
                     ignored.",
                    Rec(*table, *key)
                ),
            },
            Anomaly::LostWrite {
                table,
                key,
                version,
                first,
                second,
            } => write!(
                f,
                "{first} and {second} both committed version v{} of {}; one of the two writes \
                 was overwritten without getting a version of its own, so it is lost (the \
                 checker keeps {first}'s).",
                version.0,
                Rec(*table, *key)
            ),
            Anomaly::WriteKindMismatch {
                txn,
                table,
                key,
                version,
                kind,
                previous,
                previous_txn,
                previous_kind,
            } => {
                let found = if *previous_kind == WriteKind::Delete {
                    "absent"
                } else {
                    "present"
                };
                write!(
                    f,
                    "{txn} installed v{} of {} with {}, but the version it replaced, v{} \
                     installed by {previous_txn} with {}, left the record {found}.",
                    version.0,
                    Rec(*table, *key),
                    kind_name(*kind),
                    previous.0,
                    kind_name(*previous_kind)
                )
            }
            Anomaly::AbortedRead {
                reader,
                table,
                key,
                version,
                writer,
                writer_outcome,
            } => {
                let outcome = match writer_outcome {
                    TxnOutcome::Aborted => "aborted",
                    TxnOutcome::Unknown => "has an unknown outcome and counts as aborted",
                    TxnOutcome::Committed => "committed",
                };
                write!(
                    f,
                    "{reader} committed after reading v{} of {}, a version installed only by \
                     {writer}, which {outcome}; a committed transaction must never observe an \
                     aborted write (Adya G1a).",
                    version.0,
                    Rec(*table, *key)
                )
            }
            Anomaly::IntermediateRead {
                reader,
                table,
                key,
                version,
                writer,
                final_version,
            } => write!(
                f,
                "{reader} read v{} of {}, which {writer} installed and then overwrote itself \
                 with v{} before committing; only final versions may be observed (Adya G1b).",
                version.0,
                Rec(*table, *key),
                final_version.0
            ),
            Anomaly::PhantomVersion {
                reader,
                table,
                key,
                version,
            } => write!(
                f,
                "{reader} read v{} of {}, which no transaction in the history installed (a \
                 corrupted, torn or invented version).",
                version.0,
                Rec(*table, *key)
            ),
            Anomaly::Cycle(c) => {
                write!(
                    f,
                    "a dependency cycle over {} transactions (shortest found in a strongly \
                     connected component of {}): ",
                    c.steps.len(),
                    c.component_size
                )?;
                for (i, s) in c.steps.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{s}")?;
                }
                write!(f, ". Meaning: {}.", c.class.meaning())
            }
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.stats;
        write!(
            f,
            "checked {} transactions ({} committed, {} aborted, {} unknown counted committed, \
             {} unknown counted aborted), {} reads, edges: {} ww, {} wr, {} rw, {} rt over {} \
             time points: ",
            s.transactions,
            s.committed,
            s.aborted,
            s.unknown_committed,
            s.unknown_aborted,
            s.reads,
            s.ww_edges,
            s.wr_edges,
            s.rw_edges,
            s.rt_edges,
            s.time_points
        )?;
        if self.is_ok() {
            return f.write_str("no anomaly");
        }
        let total = self.total();
        write!(
            f,
            "{total} {}",
            if total == 1 { "anomaly" } else { "anomalies" }
        )?;
        if self.omitted > 0 {
            write!(f, " ({} not kept)", self.omitted)?;
        }
        for (i, a) in self.anomalies.iter().enumerate() {
            write!(f, "\n{}. {a}", i + 1)?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Indexes
// ---------------------------------------------------------------------------------------------

/// How a transaction counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Committed,
    Aborted,
    UnknownCommitted,
    UnknownAborted,
}

impl Status {
    fn counts_committed(self) -> bool {
        matches!(self, Status::Committed | Status::UnknownCommitted)
    }
}

/// Record identity, ordered.
type RecKey = (u32, u64);

/// One version some transaction (of any outcome) wrote.
#[derive(Debug, Clone, Copy)]
struct Install {
    rec: RecKey,
    version: u64,
    txn: u32,
    /// The transaction's last version of the record (not intermediate).
    is_final: bool,
    /// Kind of the transaction's first write of the record (what it needed to find).
    first_kind: WriteKind,
    /// Kind of its last write of the record (what it left).
    last_kind: WriteKind,
}

impl Install {
    fn sort_key(&self) -> (RecKey, u64, u32) {
        (self.rec, self.version, self.txn)
    }
}

/// One committed version in the version order.
#[derive(Debug, Clone, Copy)]
struct ChainEntry {
    rec: RecKey,
    version: u64,
    txn: u32,
}

// Edge kinds, packed in bits 30..32 of an edge word.
const WW: u64 = 0;
const WR: u64 = 1;
const RW: u64 = 2;
const RT: u64 = 3;
const NODE_BITS: u32 = 30;
const NODE_MASK: u64 = (1 << NODE_BITS) - 1;
const NO_NODE: u32 = u32::MAX;

fn pack(src: u32, kind: u64, dst: u32) -> u64 {
    (u64::from(src) << 32) | (kind << NODE_BITS) | u64::from(dst)
}
fn edge_kind(e: u64) -> u64 {
    (e >> NODE_BITS) & 3
}
fn edge_dst(e: u64) -> u32 {
    (e & NODE_MASK) as u32
}
fn edge_src(e: u64) -> u32 {
    (e >> 32) as u32
}
fn bit(kind: u64) -> u8 {
    1 << kind
}
fn dep_kind(dep: &Dependency) -> u64 {
    match dep {
        Dependency::WriteWrite { .. } => WW,
        Dependency::WriteRead { .. } => WR,
        Dependency::ReadWrite { .. } => RW,
        Dependency::RealTime { .. } => RT,
    }
}

/// Compressed sparse rows from an edge list: a counting sort by source (linear, no
/// comparison sort of the whole list), then each node's few edges sorted (by kind, then
/// destination) and deduplicated. Returns the offsets and the edges.
fn compress(nodes: u32, raw: Vec<u64>) -> (Vec<usize>, Vec<u64>) {
    let mut offsets = alloc::vec![0usize; nodes as usize + 1];
    for &e in &raw {
        offsets[edge_src(e) as usize + 1] += 1;
    }
    for v in 0..nodes as usize {
        offsets[v + 1] += offsets[v];
    }
    let mut fill = offsets.clone();
    let mut edges = alloc::vec![0u64; raw.len()];
    for &e in &raw {
        let slot = &mut fill[edge_src(e) as usize];
        edges[*slot] = e;
        *slot += 1;
    }
    drop(raw);
    // Sort and deduplicate each row in place, compacting the array.
    let mut write = 0;
    let mut read_start = 0;
    for v in 0..nodes as usize {
        let read_end = offsets[v + 1];
        edges[read_start..read_end].sort_unstable();
        let new_start = write;
        for r in read_start..read_end {
            if write == new_start || edges[write - 1] != edges[r] {
                edges[write] = edges[r];
                write += 1;
            }
        }
        offsets[v] = new_start;
        read_start = read_end;
    }
    offsets[nodes as usize] = write;
    edges.truncate(write);
    (offsets, edges)
}

/// Anomalies kept up to the cap; the rest counted.
struct Collector {
    kept: Vec<Anomaly>,
    omitted: usize,
    max: usize,
}

impl Collector {
    fn room(&self) -> bool {
        self.kept.len() < self.max
    }
    fn push(&mut self, a: Anomaly) {
        if self.room() {
            self.kept.push(a);
        } else {
            self.omitted += 1;
        }
    }
}

/// Edges of the dependency graph in compressed sparse rows: `edges[offsets[v]..offsets[v+1]]`
/// are `v`'s outgoing edges, sorted by kind then destination.
struct Graph {
    /// Transaction nodes are `0..txn_nodes`; time points follow.
    txn_nodes: u32,
    nodes: u32,
    offsets: Vec<usize>,
    edges: Vec<u64>,
}

impl Graph {
    fn out(&self, v: u32) -> &[u64] {
        &self.edges[self.offsets[v as usize]..self.offsets[v as usize + 1]]
    }
    /// Weight of an edge leaving `v`: 1 from a transaction, 0 from a time point.
    fn weight(&self, v: u32) -> u32 {
        u32::from(v < self.txn_nodes)
    }
}

struct Checker<'h> {
    txns: &'h [TxnRecord],
    options: CheckOptions,
    status: Vec<Status>,
    /// Begin ≤ end.
    well_formed: Vec<bool>,
    installs: Vec<Install>,
    chain: Vec<ChainEntry>,
    out: Collector,
    stats: CheckStats,
}

/// Where a read lands in the version order.
enum ReadTarget {
    /// The reader's own version: no edge.
    Own,
    /// A committed version at `chain[pos]` (`None` for the loaded state), followed by
    /// `chain[next]` if any.
    Chain {
        pos: Option<usize>,
        next: Option<usize>,
    },
    /// Not a committed final version.
    Outside,
}

impl<'h> Checker<'h> {
    fn new(history: &'h History, options: &CheckOptions) -> Self {
        let txns = &history.txns[..];
        assert!(
            txns.len() < (1 << (NODE_BITS - 1)),
            "the checker handles at most 2^29 transactions"
        );
        Self {
            txns,
            options: *options,
            status: Vec::new(),
            well_formed: Vec::new(),
            installs: Vec::new(),
            chain: Vec::new(),
            out: Collector {
                kept: Vec::new(),
                omitted: 0,
                max: options.max_anomalies,
            },
            stats: CheckStats {
                transactions: txns.len(),
                ..CheckStats::default()
            },
        }
    }

    fn run(mut self) -> Report {
        self.check_records();
        self.index_installs();
        self.resolve_unknown();
        self.build_chain();
        let graph = self.build_graph();
        self.find_cycles(&graph);
        Report {
            anomalies: self.out.kept,
            omitted: self.out.omitted,
            stats: self.stats,
        }
    }

    fn id(&self, txn: u32) -> TxnId {
        self.txns[txn as usize].id
    }

    /// End before begin, duplicate ids.
    fn check_records(&mut self) {
        self.well_formed = self.txns.iter().map(|t| t.begin <= t.end).collect();
        for t in self.txns {
            if t.end < t.begin {
                self.out.push(Anomaly::Malformed {
                    txn: t.id,
                    problem: Malformation::EndBeforeBegin {
                        begin: t.begin,
                        end: t.end,
                    },
                });
            }
        }
        let mut ids: Vec<TxnId> = self.txns.iter().map(|t| t.id).collect();
        ids.sort_unstable();
        for w in ids.windows(2) {
            if w[0] == w[1] {
                self.out.push(Anomaly::Malformed {
                    txn: w[1],
                    problem: Malformation::DuplicateId,
                });
            }
        }
    }

    /// Every version any transaction wrote, sorted by record, version, transaction.
    fn index_installs(&mut self) {
        let mut local: Vec<(RecKey, u64, WriteKind)> = Vec::new();
        for (i, t) in self.txns.iter().enumerate() {
            local.clear();
            for w in &t.writes {
                if w.version == Version::INITIAL {
                    self.out.push(Anomaly::Malformed {
                        txn: t.id,
                        problem: Malformation::WritesInitialVersion {
                            table: w.table,
                            key: w.key,
                        },
                    });
                    continue;
                }
                local.push(((w.table.0, w.key.0), w.version.0, w.kind));
            }
            local.sort_unstable_by_key(|&(r, v, _)| (r, v));
            local.dedup_by_key(|&mut (r, v, _)| (r, v));
            let mut start = 0;
            while start < local.len() {
                let rec = local[start].0;
                let mut end = start + 1;
                while end < local.len() && local[end].0 == rec {
                    end += 1;
                }
                let first_kind = local[start].2;
                let last_kind = local[end - 1].2;
                for (j, &(rec, version, _)) in local[start..end].iter().enumerate() {
                    self.installs.push(Install {
                        rec,
                        version,
                        txn: i as u32,
                        is_final: start + j == end - 1,
                        first_kind,
                        last_kind,
                    });
                }
                start = end;
            }
        }
        self.installs.sort_unstable_by_key(Install::sort_key);
    }

    /// Installs of exactly `(rec, version)`.
    fn installs_of(&self, rec: RecKey, version: u64) -> &[Install] {
        let lo = self
            .installs
            .partition_point(|x| (x.rec, x.version) < (rec, version));
        let hi = lo + self.installs[lo..].partition_point(|x| (x.rec, x.version) == (rec, version));
        &self.installs[lo..hi]
    }

    /// The Unknown-outcome rule: counted committed iff read by a transaction that counts as
    /// committed, unless a recorded-committed transaction installed the same version number.
    fn resolve_unknown(&mut self) {
        self.status = self
            .txns
            .iter()
            .map(|t| match t.outcome {
                TxnOutcome::Committed => Status::Committed,
                TxnOutcome::Aborted => Status::Aborted,
                TxnOutcome::Unknown => Status::UnknownAborted,
            })
            .collect();
        let any_unknown = self.status.contains(&Status::UnknownAborted);
        let mut work: Vec<u32> = if any_unknown {
            (0..self.txns.len() as u32)
                .filter(|&i| self.status[i as usize] == Status::Committed)
                .collect()
        } else {
            Vec::new()
        };
        while let Some(t) = work.pop() {
            for r in &self.txns[t as usize].reads {
                if r.version == Version::INITIAL {
                    continue;
                }
                let found = self.installs_of((r.table.0, r.key.0), r.version.0);
                if self.wrote(t, (r.table.0, r.key.0), r.version.0)
                    || found
                        .iter()
                        .any(|x| self.txns[x.txn as usize].outcome == TxnOutcome::Committed)
                {
                    continue;
                }
                let promote: Vec<u32> = found
                    .iter()
                    .filter(|x| self.status[x.txn as usize] == Status::UnknownAborted)
                    .map(|x| x.txn)
                    .collect();
                for u in promote {
                    self.status[u as usize] = Status::UnknownCommitted;
                    work.push(u);
                }
            }
        }
        for (t, s) in self.txns.iter().zip(&self.status) {
            match s {
                Status::Committed => self.stats.committed += 1,
                Status::Aborted => self.stats.aborted += 1,
                Status::UnknownCommitted => self.stats.unknown_committed += 1,
                Status::UnknownAborted => self.stats.unknown_aborted += 1,
            }
            debug_assert!(matches!(
                (t.outcome, s),
                (TxnOutcome::Committed, Status::Committed)
                    | (TxnOutcome::Aborted, Status::Aborted)
                    | (TxnOutcome::Unknown, _)
            ));
        }
    }

    /// The version order: final versions of transactions that count as committed. Reports
    /// lost writes (a number installed twice) and write-kind mismatches between neighbours.
    fn build_chain(&mut self) {
        let mut prev: Option<Install> = None;
        // Smallest version above `prev` installed by an Unknown transaction counted aborted:
        // such a write may have been applied after all, so `prev` and the next committed
        // version are then not known to be adjacent and their kinds are not compared.
        let mut hidden: Option<u64> = None;
        for idx in 0..self.installs.len() {
            let x = self.installs[idx];
            if prev.is_some_and(|p| p.rec != x.rec) {
                prev = None;
                hidden = None;
            }
            let st = self.status[x.txn as usize];
            if !st.counts_committed() || !x.is_final {
                if st == Status::UnknownAborted
                    && hidden.is_none()
                    && prev.is_some_and(|p| p.version < x.version)
                {
                    hidden = Some(x.version);
                }
                continue;
            }
            if let Some(p) = prev {
                if p.version == x.version {
                    self.out.push(Anomaly::LostWrite {
                        table: TableId(x.rec.0),
                        key: Key(x.rec.1),
                        version: Version(x.version),
                        first: self.id(p.txn),
                        second: self.id(x.txn),
                    });
                    continue;
                }
                let leaves_present = p.last_kind != WriteKind::Delete;
                let needs_present = x.first_kind != WriteKind::Insert;
                if leaves_present != needs_present && hidden.is_none_or(|h| h >= x.version) {
                    self.out.push(Anomaly::WriteKindMismatch {
                        txn: self.id(x.txn),
                        table: TableId(x.rec.0),
                        key: Key(x.rec.1),
                        version: Version(x.version),
                        kind: x.first_kind,
                        previous: Version(p.version),
                        previous_txn: self.id(p.txn),
                        previous_kind: p.last_kind,
                    });
                }
            }
            self.chain.push(ChainEntry {
                rec: x.rec,
                version: x.version,
                txn: x.txn,
            });
            prev = Some(x);
            hidden = None;
        }
    }

    /// Whether `txn` itself wrote `version` of `rec`.
    fn wrote(&self, txn: u32, rec: RecKey, version: u64) -> bool {
        if version == Version::INITIAL.0 {
            return false;
        }
        let writes = &self.txns[txn as usize].writes;
        if writes.len() <= 32 {
            writes
                .iter()
                .any(|w| w.table.0 == rec.0 && w.key.0 == rec.1 && w.version.0 == version)
        } else {
            self.installs_of(rec, version).iter().any(|x| x.txn == txn)
        }
    }

    fn resolve_read(&self, reader: u32, rec: RecKey, version: u64) -> ReadTarget {
        if self.wrote(reader, rec, version) {
            return ReadTarget::Own;
        }
        let p = self
            .chain
            .partition_point(|c| (c.rec, c.version) < (rec, version));
        let at = |i: usize| self.chain.get(i).filter(|c| c.rec == rec);
        if version == Version::INITIAL.0 {
            return ReadTarget::Chain {
                pos: None,
                next: at(p).map(|_| p),
            };
        }
        match at(p) {
            Some(c) if c.version == version => ReadTarget::Chain {
                pos: Some(p),
                next: at(p + 1).map(|_| p + 1),
            },
            _ => ReadTarget::Outside,
        }
    }

    /// G1a, G1b and phantom versions, for the reads `(txn, read index)` that landed outside
    /// the version order.
    fn check_reads(&mut self, outside: &[(u32, u32)]) {
        for &(i, j) in outside {
            let t = &self.txns[i as usize];
            let r = &t.reads[j as usize];
            let rec = (r.table.0, r.key.0);
            let found = self.installs_of(rec, r.version.0);
            let anomaly = if let Some(x) = found
                .iter()
                .find(|x| self.status[x.txn as usize].counts_committed())
            {
                // Not in the chain although committed: an intermediate version.
                let final_version = self.txns[x.txn as usize]
                    .writes
                    .iter()
                    .filter(|w| (w.table.0, w.key.0) == rec)
                    .map(|w| w.version.0)
                    .max()
                    .unwrap_or(x.version);
                Anomaly::IntermediateRead {
                    reader: t.id,
                    table: r.table,
                    key: r.key,
                    version: r.version,
                    writer: self.id(x.txn),
                    final_version: Version(final_version),
                }
            } else if let Some(x) = found.first() {
                Anomaly::AbortedRead {
                    reader: t.id,
                    table: r.table,
                    key: r.key,
                    version: r.version,
                    writer: self.id(x.txn),
                    writer_outcome: self.txns[x.txn as usize].outcome,
                }
            } else {
                Anomaly::PhantomVersion {
                    reader: t.id,
                    table: r.table,
                    key: r.key,
                    version: r.version,
                }
            };
            self.out.push(anomaly);
        }
    }

    /// Every data edge that has transaction `t` at one end (its outgoing `ww` and `rw` edges,
    /// its incoming `wr` edges), with the evidence. Graph construction and explanations both
    /// use this, so an explanation always exists for a graph edge. Reads that land outside the version order go to `outside` (by index).
    fn for_each_dep(
        &self,
        t: u32,
        mut f: impl FnMut(u32, u32, Dependency),
        mut outside: impl FnMut(u32),
    ) {
        if !self.status[t as usize].counts_committed() {
            return;
        }
        let txn = &self.txns[t as usize];
        for w in &txn.writes {
            let rec = (w.table.0, w.key.0);
            let p = self
                .chain
                .partition_point(|c| (c.rec, c.version) < (rec, w.version.0));
            let Some(c) = self.chain.get(p) else { continue };
            if c.rec != rec || c.version != w.version.0 || c.txn != t {
                continue;
            }
            if let Some(n) = self.chain.get(p + 1).filter(|n| n.rec == rec) {
                f(
                    t,
                    n.txn,
                    Dependency::WriteWrite {
                        table: w.table,
                        key: w.key,
                        overwritten: w.version,
                        installed: Version(n.version),
                    },
                );
            }
        }
        for (j, r) in txn.reads.iter().enumerate() {
            let rec = (r.table.0, r.key.0);
            let (pos, next) = match self.resolve_read(t, rec, r.version.0) {
                ReadTarget::Chain { pos, next } => (pos, next),
                ReadTarget::Own => continue,
                ReadTarget::Outside => {
                    outside(j as u32);
                    continue;
                }
            };
            if let Some(p) = pos {
                let writer = self.chain[p].txn;
                if writer != t {
                    f(
                        writer,
                        t,
                        Dependency::WriteRead {
                            table: r.table,
                            key: r.key,
                            version: r.version,
                        },
                    );
                }
            }
            if let Some(n) = next {
                let n = self.chain[n];
                if n.txn != t {
                    f(
                        t,
                        n.txn,
                        Dependency::ReadWrite {
                            table: r.table,
                            key: r.key,
                            read: r.version,
                            overwritten_by: Version(n.version),
                        },
                    );
                }
            }
        }
    }

    fn build_graph(&mut self) -> Graph {
        let n = self.txns.len() as u32;
        let mut edges: Vec<u64> = Vec::new();
        let mut outside: Vec<(u32, u32)> = Vec::new();
        for t in 0..n {
            if !self.status[t as usize].counts_committed() {
                continue;
            }
            self.stats.reads += self.txns[t as usize].reads.len();
            self.for_each_dep(
                t,
                |src, dst, dep| edges.push(pack(src, dep_kind(&dep), dst)),
                |j| outside.push((t, j)),
            );
        }
        self.check_reads(&outside);
        drop(outside);
        let mut nodes = n;
        if self.options.strict {
            // Time points: distinct end instants of well-formed recorded-committed txns.
            let in_graph = |i: usize| self.status[i].counts_committed() && self.well_formed[i];
            let mut points: Vec<Nanos> = (0..n as usize)
                .filter(|&i| in_graph(i) && self.status[i] == Status::Committed)
                .map(|i| self.txns[i].end)
                .collect();
            points.sort_unstable();
            points.dedup();
            assert!(
                u64::from(n) + points.len() as u64 <= NODE_MASK,
                "too many transactions for the checker"
            );
            let point_node = |rank: usize| n + rank as u32;
            for rank in 1..points.len() {
                edges.push(pack(point_node(rank - 1), RT, point_node(rank)));
            }
            for i in 0..n as usize {
                if !in_graph(i) {
                    continue;
                }
                let t = &self.txns[i];
                if self.status[i] == Status::Committed {
                    let rank = points.partition_point(|&p| p < t.end);
                    edges.push(pack(i as u32, RT, point_node(rank)));
                }
                let before = points.partition_point(|&p| p < t.begin);
                if before > 0 {
                    edges.push(pack(point_node(before - 1), RT, i as u32));
                }
            }
            nodes += points.len() as u32;
            self.stats.time_points = points.len();
        }
        let (offsets, edges) = compress(nodes, edges);
        for &e in &edges {
            match edge_kind(e) {
                WW => self.stats.ww_edges += 1,
                WR => self.stats.wr_edges += 1,
                RW => self.stats.rw_edges += 1,
                _ => self.stats.rt_edges += 1,
            }
        }
        Graph {
            txn_nodes: n,
            nodes,
            offsets,
            edges,
        }
    }

    /// Cycles, level by level.
    fn find_cycles(&mut self, g: &Graph) {
        let all = bit(WW) | bit(WR) | bit(RW) | if self.options.strict { bit(RT) } else { 0 };
        let mut scc = Scc::new(g.nodes as usize);
        scc.run(g, all, None);
        // Only nodes in a cyclic component of the whole graph can be on a cycle at any level
        // (each level's graph is a subgraph), so the level passes visit only those.
        let mut active = alloc::vec![false; g.nodes as usize];
        let mut cyclic = false;
        for &e in &g.edges {
            let (a, b) = (edge_src(e) as usize, edge_dst(e) as usize);
            if scc.comp[a] == scc.comp[b] {
                active[a] = true;
                active[b] = true;
                cyclic = true;
            }
        }
        if !cyclic {
            return;
        }
        let mut levels = alloc::vec![
            (bit(WW), WW),
            (bit(WW) | bit(WR), WR),
            (bit(WW) | bit(WR) | bit(RW), RW),
        ];
        if self.options.strict {
            levels.push((all, RT));
        }
        let mut search = Search::new(g.nodes as usize);
        // Transactions per component at the previous level (none before the first).
        let mut prev: Option<(Vec<u32>, Vec<u32>)> = None;
        for (mask, new_kind) in levels {
            scc.run(g, mask, Some(&active));
            let sizes = scc.txn_counts(g);
            // Edges of the new kind inside a component, grouped by component.
            let mut cand: Vec<(u32, u32, u32)> = g
                .edges
                .iter()
                .filter(|&&e| {
                    edge_kind(e) == new_kind
                        && edge_src(e) < g.txn_nodes
                        && scc.comp[edge_src(e) as usize] != NO_NODE
                        && scc.comp[edge_src(e) as usize] == scc.comp[edge_dst(e) as usize]
                })
                .map(|&e| (scc.comp[edge_src(e) as usize], edge_src(e), edge_dst(e)))
                .collect();
            cand.sort_by_key(|c| c.0);
            let mut start = 0;
            while start < cand.len() {
                let comp = cand[start].0;
                let end = start + cand[start..].partition_point(|c| c.0 == comp);
                let group = &cand[start..end];
                start = end;
                let size = sizes[comp as usize];
                if let Some((pcomp, psizes)) = &prev {
                    let u = group[0].1;
                    if psizes[pcomp[u as usize] as usize] == size {
                        continue; // same transactions as a component already reported
                    }
                }
                if !self.out.room() {
                    self.out.omitted += 1;
                    continue;
                }
                let cycle = self.shortest_cycle(g, &mut search, &scc.comp, mask, new_kind, group);
                let steps = self.explain(g, &cycle);
                self.out.push(Anomaly::Cycle(Cycle {
                    class: CycleClass::of(&steps),
                    steps,
                    component_size: size as usize,
                }));
            }
            prev = Some((scc.comp.clone(), sizes));
        }
    }

    /// The shortest cycle through one of `group`'s edges `(comp, u, v)`, as a node list
    /// `[u, v, …]` with the kind of the edge leaving each node.
    fn shortest_cycle(
        &self,
        g: &Graph,
        search: &mut Search,
        comp: &[u32],
        mask: u8,
        new_kind: u64,
        group: &[(u32, u32, u32)],
    ) -> Vec<(u32, u64)> {
        let c = group[0].0;
        let comp_nodes = comp.iter().filter(|&&x| x == c).count();
        let mut best: Option<(u32, Vec<(u32, u64)>)> = None;
        // At the rw level, first look for G-single: a path back without further rw edges.
        let passes: &[u8] = if new_kind == RW {
            &[bit(WW) | bit(WR), 0]
        } else {
            &[0]
        };
        for &pass_mask in passes {
            let path_mask = if pass_mask == 0 { mask } else { pass_mask };
            let mut budget = 64 * comp_nodes + 4096;
            for (i, &(_, u, v)) in group.iter().enumerate() {
                let w0 = g.weight(u);
                let limit = best.as_ref().map_or(u32::MAX, |b| b.0);
                if w0 >= limit {
                    break;
                }
                // The first search of a pass always completes.
                let budget_ref = if i == 0 { None } else { Some(&mut budget) };
                match search.path(g, comp, c, path_mask, v, u, limit - w0, budget_ref) {
                    PathResult::Found(d, path) => {
                        let mut cycle = Vec::with_capacity(path.len() + 1);
                        cycle.push((u, new_kind));
                        cycle.extend(path);
                        best = Some((d + w0, cycle));
                        if d + w0 <= 2 {
                            break; // no self loops: 2 is the minimum
                        }
                    }
                    PathResult::None => {}
                    PathResult::OutOfBudget => break,
                }
            }
            if best.is_some() {
                break;
            }
        }
        best.expect("an edge inside a strongly connected component lies on a cycle")
            .1
    }

    /// Collapses time-point runs into `rt` steps and attaches the evidence to each edge.
    fn explain(&self, g: &Graph, cycle: &[(u32, u64)]) -> Vec<CycleStep> {
        let mut steps = Vec::new();
        let len = cycle.len();
        let mut i = 0;
        while i < len {
            let (a, kind) = cycle[i];
            debug_assert!(a < g.txn_nodes);
            let mut j = (i + 1) % len;
            let mut via_points = false;
            while cycle[j].0 >= g.txn_nodes {
                via_points = true;
                j = (j + 1) % len;
            }
            let b = cycle[j].0;
            let dependency = if via_points || kind == RT {
                Dependency::RealTime {
                    from_end: self.txns[a as usize].end,
                    to_begin: self.txns[b as usize].begin,
                }
            } else {
                let holder = if kind == WR { b } else { a };
                let mut found = None;
                self.for_each_dep(
                    holder,
                    |src, dst, dep| {
                        if found.is_none() && src == a && dst == b && dep_kind(&dep) == kind {
                            found = Some(dep);
                        }
                    },
                    |_| {},
                );
                found.expect("every graph edge has recorded evidence")
            };
            steps.push(CycleStep {
                from: self.id(a),
                to: self.id(b),
                dependency,
            });
            if j <= i {
                break;
            }
            i = j;
        }
        steps
    }
}

// ---------------------------------------------------------------------------------------------
// Strongly connected components (iterative Tarjan) and 0-1 breadth-first search
// ---------------------------------------------------------------------------------------------

struct Scc {
    comp: Vec<u32>,
    index: Vec<u32>,
    low: Vec<u32>,
    on_stack: Vec<bool>,
    stack: Vec<u32>,
    calls: Vec<(u32, usize)>,
    count: u32,
}

impl Scc {
    fn new(nodes: usize) -> Self {
        Self {
            comp: alloc::vec![0; nodes],
            index: alloc::vec![NO_NODE; nodes],
            low: alloc::vec![0; nodes],
            on_stack: alloc::vec![false; nodes],
            stack: Vec::new(),
            calls: Vec::new(),
            count: 0,
        }
    }

    /// Components of the subgraph with edge kinds in `mask`, restricted to the `active` nodes
    /// if given (the others get component `NO_NODE`).
    fn run(&mut self, g: &Graph, mask: u8, active: Option<&[bool]>) {
        self.index.fill(NO_NODE);
        self.on_stack.fill(false);
        self.comp.fill(NO_NODE);
        self.count = 0;
        let is_active = |v: u32| active.is_none_or(|a| a[v as usize]);
        let mut next_index = 0u32;
        for root in 0..g.nodes {
            if self.index[root as usize] != NO_NODE || !is_active(root) {
                continue;
            }
            self.visit(g, root, &mut next_index);
            while let Some((v, cursor)) = self.calls.pop() {
                if cursor < g.offsets[v as usize + 1] {
                    self.calls.push((v, cursor + 1));
                    let e = g.edges[cursor];
                    if mask & bit(edge_kind(e)) == 0 {
                        continue;
                    }
                    let w = edge_dst(e);
                    if !is_active(w) {
                        continue;
                    }
                    if self.index[w as usize] == NO_NODE {
                        self.visit(g, w, &mut next_index);
                    } else if self.on_stack[w as usize] {
                        self.low[v as usize] = self.low[v as usize].min(self.index[w as usize]);
                    }
                    continue;
                }
                // All of v's edges done: propagate its low link and close its component.
                if let Some(&(p, _)) = self.calls.last() {
                    self.low[p as usize] = self.low[p as usize].min(self.low[v as usize]);
                }
                if self.low[v as usize] == self.index[v as usize] {
                    loop {
                        let w = self.stack.pop().expect("v is on the stack");
                        self.on_stack[w as usize] = false;
                        self.comp[w as usize] = self.count;
                        if w == v {
                            break;
                        }
                    }
                    self.count += 1;
                }
            }
        }
    }

    fn visit(&mut self, g: &Graph, v: u32, next_index: &mut u32) {
        self.index[v as usize] = *next_index;
        self.low[v as usize] = *next_index;
        *next_index += 1;
        self.stack.push(v);
        self.on_stack[v as usize] = true;
        self.calls.push((v, g.offsets[v as usize]));
    }

    /// Transactions (not time points) per component.
    fn txn_counts(&self, g: &Graph) -> Vec<u32> {
        let mut sizes = alloc::vec![0u32; self.count as usize];
        for &c in &self.comp[..g.txn_nodes as usize] {
            if c != NO_NODE {
                sizes[c as usize] += 1;
            }
        }
        sizes
    }
}

enum PathResult {
    /// Weight and the path `[(from, kind), …]` from the source up to (not including) the
    /// target, each node with the kind of the edge leaving it on the path.
    Found(u32, Vec<(u32, u64)>),
    None,
    OutOfBudget,
}

/// Scratch space for 0-1 breadth-first searches, reset only where touched.
struct Search {
    dist: Vec<u32>,
    parent: Vec<u32>,
    parent_kind: Vec<u8>,
    touched: Vec<u32>,
    deque: VecDeque<(u32, u32)>,
}

impl Search {
    fn new(nodes: usize) -> Self {
        Self {
            dist: alloc::vec![u32::MAX; nodes],
            parent: alloc::vec![NO_NODE; nodes],
            parent_kind: alloc::vec![0; nodes],
            touched: Vec::new(),
            deque: VecDeque::new(),
        }
    }

    /// The lightest path from `from` to `to` inside component `c` using edges in `mask`,
    /// if lighter than `limit`.
    #[allow(clippy::too_many_arguments)]
    fn path(
        &mut self,
        g: &Graph,
        comp: &[u32],
        c: u32,
        mask: u8,
        from: u32,
        to: u32,
        limit: u32,
        mut budget: Option<&mut usize>,
    ) -> PathResult {
        for &v in &self.touched {
            self.dist[v as usize] = u32::MAX;
            self.parent[v as usize] = NO_NODE;
        }
        self.touched.clear();
        self.deque.clear();
        self.dist[from as usize] = 0;
        self.touched.push(from);
        self.deque.push_back((from, 0));
        let mut result = PathResult::None;
        while let Some((v, d)) = self.deque.pop_front() {
            if d > self.dist[v as usize] {
                continue;
            }
            if d >= limit {
                break;
            }
            if v == to {
                let mut path = Vec::new();
                let mut x = to;
                while x != from {
                    let p = self.parent[x as usize];
                    path.push((p, u64::from(self.parent_kind[x as usize])));
                    x = p;
                }
                path.reverse();
                result = PathResult::Found(d, path);
                break;
            }
            let out = g.out(v);
            if let Some(b) = budget.as_deref_mut() {
                if *b < out.len() {
                    result = PathResult::OutOfBudget;
                    break;
                }
                *b -= out.len();
            }
            let w8 = g.weight(v);
            for &e in out {
                if mask & bit(edge_kind(e)) == 0 {
                    continue;
                }
                let w = edge_dst(e);
                if comp[w as usize] != c {
                    continue;
                }
                let nd = d + w8;
                if nd < self.dist[w as usize] {
                    if self.dist[w as usize] == u32::MAX {
                        self.touched.push(w);
                    }
                    self.dist[w as usize] = nd;
                    self.parent[w as usize] = v;
                    self.parent_kind[w as usize] = edge_kind(e) as u8;
                    if w8 == 0 {
                        self.deque.push_front((w, nd));
                    } else {
                        self.deque.push_back((w, nd));
                    }
                }
            }
        }
        result
    }
}
