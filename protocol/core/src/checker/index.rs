//! History indexing: every installed version, the Unknown-outcome rule, the version order,
//! and where each read lands in it.

use alloc::vec::Vec;

use super::Checker;
use super::report::{Anomaly, Malformation};
use crate::history::{ReadEvent, TxnOutcome};
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

/// Where a read lands: whose version it observed.
pub(super) enum ReadTarget {
    /// The reader's own version: no edge.
    Own,
    /// A committed final version installed by `writer` (`None` for the loaded state), followed
    /// in the version order by `chain[next]` if any.
    Chain {
        writer: Option<u32>,
        next: Option<usize>,
        /// Without a recorded writer: a transaction that counts as aborted installed the same
        /// number and the read could, by real time, have observed either (reported as
        /// [`Anomaly::AmbiguousRead`]; the edges are those of the committed version).
        ambiguous_with: Option<u32>,
    },
    /// An intermediate version of a committed transaction (G1b).
    Intermediate { writer: u32 },
    /// A version installed by a transaction that counts as aborted (G1a).
    Aborted { writer: u32 },
    /// A version nobody installed.
    Phantom,
    /// The recorded writer did not install this version of this record.
    WrongWriter { writer: TxnId },
}

impl ReadTarget {
    /// Whether the read is reported as an anomaly.
    pub(super) fn is_anomalous(&self) -> bool {
        !matches!(
            self,
            ReadTarget::Own
                | ReadTarget::Chain {
                    ambiguous_with: None,
                    ..
                }
        )
    }
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

    /// The install of `(rec, version)` by the transaction with id `writer`, if any.
    fn install_by(&self, rec: RecKey, version: u64, writer: TxnId) -> Option<&Install> {
        self.installs_of(rec, version)
            .iter()
            .find(|x| self.txns[x.txn as usize].id == writer)
    }

    /// Whether `reader` can have observed the version `x` installed, which does not count as
    /// committed, although transactions that count as committed installed the same number
    /// and ended at `reuse_end` at the latest.
    ///
    /// Real time: `x`'s installer installed it after it began, so the read cannot have ended
    /// before that; a version number is reused only after the version that first carried it
    /// was rolled back, so a read that began after the last committed reuser ended comes too
    /// late; and an aborted transaction rolled its versions back before its recorded end,
    /// so a read that began after that end comes too late as well (an Unknown transaction's
    /// versions are rolled back by recovery, at no recorded time).
    fn could_observe_rolled_back(&self, reader: u32, x: &Install, reuse_end: u64) -> bool {
        let (r, w) = (&self.txns[reader as usize], &self.txns[x.txn as usize]);
        w.begin <= r.end
            && r.begin <= reuse_end
            && (w.outcome != TxnOutcome::Aborted || r.begin <= w.end)
    }

    /// The Unknown-outcome rule: counted committed iff read by a transaction that counts as
    /// committed. A read with a recorded writer promotes exactly that writer. A read without
    /// one promotes every Unknown installer of the number, unless a recorded-committed
    /// transaction installed the same number and the read can have observed that one by real
    /// time (it did not end before that transaction began).
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
            let reader = &self.txns[t as usize];
            for r in &reader.reads {
                if r.version == Version::INITIAL {
                    continue;
                }
                let rec = (r.table.0, r.key.0);
                let promote: Vec<u32> = if let Some(w) = r.writer {
                    self.install_by(rec, r.version.0, w)
                        .filter(|x| {
                            x.txn != t && self.status[x.txn as usize] == Status::UnknownAborted
                        })
                        .map(|x| x.txn)
                        .into_iter()
                        .collect()
                } else {
                    let found = self.installs_of(rec, r.version.0);
                    if self.wrote(t, rec, r.version.0)
                        || found.iter().any(|x| {
                            let w = &self.txns[x.txn as usize];
                            w.outcome == TxnOutcome::Committed && w.begin <= reader.end
                        })
                    {
                        continue;
                    }
                    found
                        .iter()
                        .filter(|x| self.status[x.txn as usize] == Status::UnknownAborted)
                        .map(|x| x.txn)
                        .collect()
                };
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

    /// Whose version a read observed. With a recorded writer, exactly that transaction's;
    /// without one, the loaded state, the reader's own version, or by the version number:
    /// when both a transaction that counts as committed and one that does not installed the
    /// number, real time decides (see [`Checker::could_observe_rolled_back`]), and when it
    /// cannot, the read is credited to the committed installer and reported as ambiguous.
    pub(super) fn resolve_read(&self, reader: u32, r: &ReadEvent) -> ReadTarget {
        let (rec, version) = ((r.table.0, r.key.0), r.version.0);
        if let Some(writer) = r.writer {
            return self.resolve_attributed(reader, rec, version, writer);
        }
        if self.wrote(reader, rec, version) {
            return ReadTarget::Own;
        }
        if version == Version::INITIAL.0 {
            return ReadTarget::Chain {
                writer: None,
                next: self.next_in_chain(rec, version),
                ambiguous_with: None,
            };
        }
        let found = self.installs_of(rec, version);
        let counts = |x: &&Install| self.status[x.txn as usize].counts_committed();
        let Some(committed) = found.iter().find(counts) else {
            return match found.first() {
                Some(x) => ReadTarget::Aborted { writer: x.txn },
                None => ReadTarget::Phantom,
            };
        };
        let mut target = self.committed_target(rec, committed);
        if found.iter().all(|x| counts(&x)) {
            return target;
        }
        // A transaction that counts as aborted installed the same number: real time decides.
        let committed: Vec<&Install> = found.iter().filter(counts).collect();
        let t = &self.txns[reader as usize];
        let committed_possible = committed
            .iter()
            .any(|x| self.txns[x.txn as usize].begin <= t.end);
        let reuse_end = committed
            .iter()
            .map(|x| self.txns[x.txn as usize].end)
            .max()
            .unwrap_or(u64::MAX);
        let rolled_back = found
            .iter()
            .filter(|x| !counts(x))
            .find(|x| self.could_observe_rolled_back(reader, x, reuse_end));
        match (committed_possible, rolled_back) {
            (_, None) => target,
            (false, Some(x)) => ReadTarget::Aborted { writer: x.txn },
            (true, Some(x)) => {
                if let ReadTarget::Chain { ambiguous_with, .. } = &mut target {
                    *ambiguous_with = Some(x.txn);
                }
                target
            }
        }
    }

    /// A read attributed to `writer` by the protocol.
    fn resolve_attributed(
        &self,
        reader: u32,
        rec: RecKey,
        version: u64,
        writer: TxnId,
    ) -> ReadTarget {
        let Some(x) = self.install_by(rec, version, writer) else {
            return ReadTarget::WrongWriter { writer };
        };
        if x.txn == reader {
            ReadTarget::Own
        } else if !self.status[x.txn as usize].counts_committed() {
            ReadTarget::Aborted { writer: x.txn }
        } else {
            self.committed_target(rec, x)
        }
    }

    /// A read of the version `x` installed, by a transaction that counts as committed.
    fn committed_target(&self, rec: RecKey, x: &Install) -> ReadTarget {
        if x.is_final {
            ReadTarget::Chain {
                writer: Some(x.txn),
                next: self.next_in_chain(rec, x.version),
                ambiguous_with: None,
            }
        } else {
            ReadTarget::Intermediate { writer: x.txn }
        }
    }

    /// Position of the first committed version of `rec` after `version`.
    fn next_in_chain(&self, rec: RecKey, version: u64) -> Option<usize> {
        let p = self
            .chain
            .partition_point(|c| (c.rec, c.version) <= (rec, version));
        self.chain.get(p).filter(|c| c.rec == rec).map(|_| p)
    }

    /// G1a, G1b, phantom versions, ambiguous reads and reads naming the wrong writer, for
    /// the reads `(txn, read index)` that [`ReadTarget::is_anomalous`] flagged.
    pub(super) fn check_reads(&mut self, flagged: &[(u32, u32)]) {
        for &(i, j) in flagged {
            let t = &self.txns[i as usize];
            let r = &t.reads[j as usize];
            let (reader, table, key, version) = (t.id, r.table, r.key, r.version);
            let rec = (table.0, key.0);
            let anomaly = match self.resolve_read(i, r) {
                ReadTarget::Own
                | ReadTarget::Chain {
                    ambiguous_with: None,
                    ..
                } => continue,
                ReadTarget::Chain {
                    writer,
                    ambiguous_with: Some(other),
                    ..
                } => Anomaly::AmbiguousRead {
                    reader,
                    table,
                    key,
                    version,
                    committed: self.id(writer.expect("the loaded state is never ambiguous")),
                    other: self.id(other),
                    other_outcome: self.txns[other as usize].outcome,
                },
                ReadTarget::Intermediate { writer } => {
                    let final_version = self.txns[writer as usize]
                        .writes
                        .iter()
                        .filter(|w| (w.table.0, w.key.0) == rec)
                        .map(|w| w.version.0)
                        .max()
                        .unwrap_or(version.0);
                    Anomaly::IntermediateRead {
                        reader,
                        table,
                        key,
                        version,
                        writer: self.id(writer),
                        final_version: Version(final_version),
                    }
                }
                ReadTarget::Aborted { writer } => Anomaly::AbortedRead {
                    reader,
                    table,
                    key,
                    version,
                    writer: self.id(writer),
                    writer_outcome: self.txns[writer as usize].outcome,
                },
                ReadTarget::Phantom => Anomaly::PhantomVersion {
                    reader,
                    table,
                    key,
                    version,
                },
                ReadTarget::WrongWriter { writer } => Anomaly::Malformed {
                    txn: reader,
                    problem: Malformation::WrongWriter {
                        table,
                        key,
                        version,
                        writer,
                    },
                },
            };
            self.out.push(anomaly);
        }
    }
}
