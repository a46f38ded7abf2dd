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
//! * **Per-read anomalies**: **G1a** (a committed transaction read a version installed by an
//!   aborted one), **G1b** (it read another transaction's intermediate version), *phantom
//!   versions* (a version nobody in the history installed: corrupted, torn or invented) and
//!   *ambiguous reads* (see below).
//! * **Per-record anomalies**: a *lost write* (two committed transactions installed the same
//!   version number of a record: one of the two writes vanished without a version of its own),
//!   and a *write-kind mismatch* (an insert replacing a present record, or an update/delete
//!   replacing a tombstone: [`WriteKind`] says what a write needs to find).
//! * **Malformed records**: end before begin, a transaction id used twice, a write that claims
//!   to install [`Version::INITIAL`], a read whose recorded writer did not install the version
//!   it read.
//!
//! A stale read — a committed transaction reading a version that a transaction which *ended
//! before it began* had already overwritten, i.e. a committed write that later went missing —
//! surfaces as a real-time cycle `reader -rw-> overwriter -rt-> reader`.
//!
//! # Whose version a read observed
//!
//! Version numbers need not be unique: FORD's per-record counters give the next writer the
//! number of a version that was rolled back (an aborted writer's, or a crashed one's undone
//! by recovery). Aborted and Unknown transactions therefore record the versions they
//! physically installed, and a read may record its installer ([`ReadEvent::writer`]):
//!
//! * **With a recorded writer**, the read observed exactly that transaction's version: a G1a
//!   if it counts as aborted, a G1b if the version is intermediate, a `wr` edge otherwise. A
//!   writer that did not install that version of that record (or any writer for the loaded
//!   state) is a malformed record, and the read is not judged further.
//! * **Without one**, the read observed the loaded state, its own write, or the one installer
//!   of the number. When the number has installers that count as committed *and* ones that do
//!   not, real time decides. A committed installer `C` is possible unless the read ended
//!   before `C` began. A non-committed installer `A` is possible unless the read ended before
//!   `A` began, began after the last committed installer of the number ended (a number is
//!   reused only after the version that first carried it was rolled back), or — `A` being
//!   Aborted — began after `A` ended (an aborted transaction rolled back its versions before
//!   its recorded end; an Unknown one's are undone by recovery at no recorded time). Only `A`
//!   possible: a G1a naming `A`. Only `C` (or neither): the committed installer's version,
//!   as for a unique number. **Both: an [`AnomalyKind::AmbiguousRead`]** — the history cannot
//!   tell a valid read from a dirty one, so the checker does not let it pass silently; the
//!   graph credits `C` so cycles are still judged, and the fix is to record the writer.
//!
//! # Transactions with an unknown outcome
//!
//! A coordinator that crashed leaves [`TxnOutcome::Unknown`] transactions; recovery (Pandora
//! §3.2) rolls them forward or back. The rule: **an Unknown transaction counts as committed iff
//! a transaction that counts as committed read one of its versions** (transitively: an Unknown
//! counted committed makes its own reads count); otherwise it counts as aborted and its
//! versions are left out of the version order. A read with a recorded writer is evidence for
//! exactly that writer. A read without one is evidence for every Unknown installer of the
//! number, unless a transaction recorded as committed installed the same number and the read
//! did not end before it began: then it is attributed to that one as above. A later *blind*
//! overwrite does not count as evidence: a rolled-back write followed by an overwrite leaves
//! the same history as a surviving one. Once counted committed, all of an Unknown
//! transaction's writes must have survived: a partial roll-back shows up as a lost write (its
//! version number reused) or a cycle. An Unknown transaction gets no *outgoing* real-time
//! edges, because recovery may apply its writes after its recorded end; incoming ones (from
//! transactions that ended before it began) apply. Aborted transactions, and Unknown ones
//! counted aborted, are not in the graph and their reads are not judged (no opacity
//! requirement).
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
//!
//! # Code layout
//!
//! `report` holds the verdict (anomalies, their kinds and explanations), `index` the history
//! indexes (installed versions, the Unknown-outcome rule, the version order, where each read
//! lands), `graph` the dependency graph, its strongly connected components and the
//! shortest-cycle searches; this module ties them together. [`append`] is the list-append
//! checker (Elle's inference from observed values), which feeds the same graph.

pub mod append;
mod graph;
mod index;
mod report;
mod segments;

use alloc::vec::Vec;

use crate::history::{History, TxnRecord};
#[cfg(doc)]
use crate::history::{ReadEvent, TxnOutcome};
use crate::model::TxnId;
#[cfg(doc)]
use crate::model::{Version, WriteKind};

use graph::NODE_BITS;
use index::{ChainEntry, Install, Status};
pub use report::{
    Anomaly, AnomalyKind, CheckStats, Cycle, CycleClass, CycleStep, Dependency, Malformation,
    Report,
};
pub use segments::SegmentedCheck;

/// The isolation level a history is judged against.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Isolation {
    /// Serializability: no dependency cycle at all.
    #[default]
    Serializable,
    /// Snapshot isolation as Adya's PL-SI judges it from dependencies: G0, G1 and every
    /// cycle with at most one `rw` edge (G-single; with `strict`, a stale read) are
    /// anomalies, cycles with two or more `rw` edges (write skew) are allowed. The
    /// start-order conditions of PL-SI (G-SIa) need start timestamps, which histories do
    /// not record, and are not checked.
    Snapshot,
}

/// What the checker judges and how much it reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckOptions {
    /// Judge strict serializability (add real-time edges) instead of serializability.
    pub strict: bool,
    /// Serializability or snapshot isolation.
    pub isolation: Isolation,
    /// Keep at most this many anomalies; the rest are only counted
    /// ([`Report::omitted`]).
    pub max_anomalies: usize,
}

impl Default for CheckOptions {
    /// Strict serializability, at most 32 anomalies kept.
    fn default() -> Self {
        Self {
            strict: true,
            isolation: Isolation::Serializable,
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
}
