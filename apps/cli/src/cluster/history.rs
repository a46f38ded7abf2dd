//! A CN's history on its stdout: every record and resolution streamed as one JSON line
//! ([`StdoutHistory`]), so that `dmem cluster` rebuilds the history of a CN killed mid-run
//! up to its last record ([`history_from_lines`]).

use std::cell::Cell;
use std::rc::Rc;

use dmem_txn::{History, HistorySink, TxnId, TxnOutcome, TxnRecord};
use serde::{Deserialize, Serialize};

/// One line of a CN's history stream on stdout.
#[derive(Debug, Serialize, Deserialize)]
enum HistoryLine {
    /// A transaction recorded (before its first commit write).
    Record(TxnRecord),
    /// Its outcome and end, later.
    Resolve(TxnId, TxnOutcome, dmem_verbs::Nanos),
}

#[derive(Debug, Serialize, Deserialize)]
struct HistoryLineWrap {
    history: HistoryLine,
}

/// A history sink that writes every record and resolution to stdout as one JSON line at
/// once, so that the history of a CN killed mid-run survives it up to its last record
/// (a transaction is recorded before its first commit write, as `Unknown`). Switched off
/// for the final state's read-only transactions, which are not part of the run.
#[derive(Debug, Clone, Default)]
pub(crate) struct StdoutHistory {
    off: Rc<Cell<bool>>,
}

impl StdoutHistory {
    /// The switch that turns this sink (and its clones) off when set.
    pub(crate) fn off_switch(&self) -> Rc<Cell<bool>> {
        Rc::clone(&self.off)
    }

    fn emit(line: HistoryLine) {
        use std::io::Write as _;
        if let Ok(text) = serde_json::to_string(&HistoryLineWrap { history: line }) {
            let mut out = std::io::stdout().lock();
            // A closed stdout (the parent died) loses the history, not the run.
            let _ = writeln!(out, "{text}");
            let _ = out.flush();
        }
    }
}

impl HistorySink for StdoutHistory {
    fn record(&self, txn: TxnRecord) {
        if !self.off.get() {
            Self::emit(HistoryLine::Record(txn));
        }
    }

    fn resolve(&self, id: TxnId, outcome: TxnOutcome, end: dmem_verbs::Nanos) {
        if !self.off.get() {
            Self::emit(HistoryLine::Resolve(id, outcome, end));
        }
    }
}

/// Rebuilds a CN's history from its stdout lines (other lines are skipped).
pub(crate) fn history_from_lines(lines: &[String]) -> History {
    let mut history = History::new();
    for line in lines {
        match serde_json::from_str::<HistoryLineWrap>(line).map(|w| w.history) {
            Ok(HistoryLine::Record(txn)) => history.push(txn),
            Ok(HistoryLine::Resolve(id, outcome, end)) => {
                if let Some(t) = history.txns.iter_mut().rev().find(|t| t.id == id) {
                    t.outcome = outcome;
                    t.end = end;
                }
            }
            Err(_) => {}
        }
    }
    history
}
