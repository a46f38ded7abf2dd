//! The checker's verdict: anomalies, their kinds and their explanations.

use alloc::vec::Vec;
use core::fmt;

use dmem_verbs::Nanos;

use crate::history::TxnOutcome;
use crate::model::{Key, TableId, TxnId, Version, WriteKind};

/// The checker's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The anomalies found, data anomalies first, then cycles by severity (at most
    /// [`CheckOptions::max_anomalies`](super::CheckOptions::max_anomalies)).
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
    /// A read without a recorded writer of a version number that both a committed and an
    /// aborted (or Unknown counted aborted) transaction installed, when real time allows
    /// either: possibly a G1a the history cannot tell from a valid read.
    AmbiguousRead,
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
            AnomalyKind::AmbiguousRead => "ambiguous read",
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
    /// A read names as the installer of the version it observed a transaction that did not
    /// install that version of that record (or the loaded state, which has no installer).
    WrongWriter {
        /// Table read.
        table: TableId,
        /// Key read.
        key: Key,
        /// Version read.
        version: Version,
        /// The writer the read names.
        writer: TxnId,
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
    pub(super) fn of(steps: &[CycleStep]) -> CycleClass {
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
    /// Adya G1a: a committed transaction read a version installed by an aborted one (the
    /// recorded writer of the read, or by version number and real time).
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
    /// A committed transaction read, without a recorded writer, a version number that a
    /// committed and an aborted (or Unknown counted aborted) transaction both installed, and
    /// real time does not tell which one it observed. The dependency graph credits the
    /// committed installer; the read is a G1a if it observed the other.
    AmbiguousRead {
        /// The reader.
        reader: TxnId,
        /// Table.
        table: TableId,
        /// Key.
        key: Key,
        /// The version read.
        version: Version,
        /// The committed installer (the graph's choice).
        committed: TxnId,
        /// The installer that counts as aborted.
        other: TxnId,
        /// Its recorded outcome.
        other_outcome: TxnOutcome,
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
            Anomaly::AmbiguousRead { .. } => AnomalyKind::AmbiguousRead,
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
            Anomaly::Malformed { txn, problem } => fmt_malformed(f, *txn, problem),
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
            Anomaly::AbortedRead { .. }
            | Anomaly::IntermediateRead { .. }
            | Anomaly::PhantomVersion { .. }
            | Anomaly::AmbiguousRead { .. } => self.fmt_bad_read(f),
            Anomaly::Cycle(c) => fmt_cycle(f, c),
        }
    }
}

impl Anomaly {
    /// The explanation of a read of a version no committed transaction left behind.
    fn fmt_bad_read(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
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
                    "{reader} committed after reading v{} of {}, a version installed by \
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
            Anomaly::AmbiguousRead {
                reader,
                table,
                key,
                version,
                committed,
                other,
                other_outcome,
            } => {
                let outcome = match other_outcome {
                    TxnOutcome::Aborted => "aborted",
                    TxnOutcome::Unknown => "has an unknown outcome and counts as aborted",
                    TxnOutcome::Committed => "committed",
                };
                write!(
                    f,
                    "{reader} read v{} of {} without a recorded writer; both {committed} \
                     (committed) and {other} (which {outcome}) installed that version number, \
                     and real time allows either, so the read may be a G1a aborted read. The \
                     graph credits {committed}; record the writer (ReadEvent::written_by) to \
                     decide.",
                    version.0,
                    Rec(*table, *key)
                )
            }
            // The others explain themselves in `Display::fmt`.
            _ => Ok(()),
        }
    }
}

/// The explanation of a malformed record of `txn`.
fn fmt_malformed(f: &mut fmt::Formatter<'_>, txn: TxnId, problem: &Malformation) -> fmt::Result {
    match problem {
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
        Malformation::WrongWriter {
            table,
            key,
            version,
            writer,
        } => write!(
            f,
            "{txn} read v{} of {} and records {writer} as its installer, but {writer} \
             installed no such version of that record; the read is not judged.",
            version.0,
            Rec(*table, *key)
        ),
    }
}

/// A dependency cycle, step by step, and what its class means.
fn fmt_cycle(f: &mut fmt::Formatter<'_>, c: &Cycle) -> fmt::Result {
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
