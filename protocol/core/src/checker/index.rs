//! History indexing: every installed version, the Unknown-outcome rule, the version order,
//! and where each read lands in it.

use alloc::vec::Vec;

use super::Checker;
use super::report::{Anomaly, Malformation};
use crate::history::TxnOutcome;
use crate::model::{Key, TableId, TxnId, Version, WriteKind};

/// How a transaction counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    Committed,
    Aborted,
    UnknownCommitted,
    UnknownAborted,
}

impl Status {
    pub(super) fn counts_committed(self) -> bool {
        matches!(self, Status::Committed | Status::UnknownCommitted)
    }
}

/// Record identity, ordered.
pub(super) type RecKey = (u32, u64);

/// One version some transaction (of any outcome) wrote.
#[derive(Debug, Clone, Copy)]
pub(super) struct Install {
    pub(super) rec: RecKey,
    pub(super) version: u64,
    pub(super) txn: u32,
    /// The transaction's last version of the record (not intermediate).
    pub(super) is_final: bool,
    /// Kind of the transaction's first write of the record (what it needed to find).
    pub(super) first_kind: WriteKind,
    /// Kind of its last write of the record (what it left).
    pub(super) last_kind: WriteKind,
}

impl Install {
    fn sort_key(&self) -> (RecKey, u64, u32) {
        (self.rec, self.version, self.txn)
    }
}

/// One committed version in the version order.
#[derive(Debug, Clone, Copy)]
pub(super) struct ChainEntry {
    pub(super) rec: RecKey,
    pub(super) version: u64,
    pub(super) txn: u32,
}

/// Where a read lands in the version order.
pub(super) enum ReadTarget {
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

impl Checker<'_> {
    /// End before begin, duplicate ids.
    pub(super) fn check_records(&mut self) {
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
    pub(super) fn index_installs(&mut self) {
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
    pub(super) fn resolve_unknown(&mut self) {
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
    pub(super) fn build_chain(&mut self) {
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

    pub(super) fn resolve_read(&self, reader: u32, rec: RecKey, version: u64) -> ReadTarget {
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
    pub(super) fn check_reads(&mut self, outside: &[(u32, u32)]) {
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
}
