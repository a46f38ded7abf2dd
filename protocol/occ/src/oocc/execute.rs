//! Execute&Locking (Alg. 1 lines 1–10): the thin async shell of an execution round. The
//! read set is READ, the write set intention-locked with CAS + READ in the same post list;
//! what the replies mean is decided in [`super::logic`].

use dmem_layout::record::OoccLockWord;
use dmem_txn::{
    AbortReason, Access, Key, ReadEvent, ReadReq, RoundValues, TableId, TxnError, Version,
};
use dmem_verbs::{BatchResult, Clock, Phase, PostList, Verbs, WrId};

use super::logic::{self, CasDecision, CasReply, ReadDecision};
use super::{OoccTxn, ReadEntry, WriteEntry};
use crate::store::{Image, Loc, parse};

/// Where a request's value comes from once the round is back.
pub(super) enum Pending {
    /// Already known to the transaction.
    Local(Option<Vec<u8>>),
    /// A READ of the round (`idx`: its image among the round's READs).
    Read { idx: usize, loc: Loc, id: WrId },
    /// The CAS + READ of lock target `idx`.
    Lock { idx: usize },
}

/// A record to lock: table, key, slot.
type Target = (TableId, Key, Loc);
/// A locked record: the word installed and the image read under it.
type Locked = (OoccLockWord, Image);

/// A settled lock round: the targets to retry with the word each found, and the abort the
/// round ends in.
type Settled = (Vec<(usize, OoccLockWord)>, Option<AbortReason>);

/// One intention CAS + READ in a post list.
struct Attempt {
    /// Index of its target.
    i: usize,
    expected: OoccLockWord,
    cas: WrId,
    read: WrId,
    swap: OoccLockWord,
}

/// Takes the round's READs (in request order) as raw images.
fn take_reads(res: &BatchResult, pending: &mut [Pending], images: &mut Vec<Image>) {
    for p in pending.iter_mut() {
        if let Pending::Read { idx, id, .. } = p {
            *idx = images.len();
            images.push(Image {
                present: false,
                value: res.bytes(*id).to_vec(),
                lock: OoccLockWord::from_raw(0),
                writer: None,
            });
        }
    }
}

impl<C: Verbs + Clock> OoccTxn<'_, C> {
    /// The free word to CAS the record at `loc` from: the version read, else the hint.
    fn expected_lock(&self, loc: Loc) -> OoccLockWord {
        let read = self.reads.iter().find(|r| r.loc == loc).map(|r| r.version);
        let hint = self.co.hints.borrow().get(&loc).copied().unwrap_or(0);
        logic::expected_word(read, hint)
    }

    /// Appends target `i`'s intention CAS from `expected` and its READ to `list`.
    fn push_lock_attempt(
        &self,
        list: &mut PostList,
        i: usize,
        (table, _, loc): Target,
        expected: OoccLockWord,
    ) -> Result<Attempt, TxnError> {
        let swap = logic::lock_word_for(expected, self.co.id, self.co.cfg.delayed_lock);
        let cas = list.cas(
            self.lock_addr(table, loc)?,
            expected.to_raw(),
            swap.to_raw(),
        );
        let read = list.read(
            self.co.dir.addr(loc.mn, loc.offset),
            self.record_len(table)?,
        );
        Ok(Attempt {
            i,
            expected,
            cas,
            read,
            swap,
        })
    }

    /// Applies a lock round's verdicts ([`logic::judge_lock_round`]): a locked target's
    /// image goes to `out`, a stale hint is refreshed. Returns the targets to retry with
    /// the word each found, and the abort the round ends in.
    fn settle_lock_round(
        &mut self,
        targets: &[Target],
        attempts: &[Attempt],
        res: &BatchResult,
        out: &mut [Option<Locked>],
    ) -> Result<Settled, TxnError> {
        let replies: Vec<CasReply> = attempts
            .iter()
            .map(|a| CasReply {
                expected: a.expected,
                returned: res.atomic(a.cas),
                read_before: self.reads.iter().any(|r| r.loc == targets[a.i].2),
            })
            .collect();
        let round = logic::judge_lock_round(&replies);
        let mut retries = Vec::new();
        for (a, decision) in attempts.iter().zip(round.decisions) {
            let (table, _, loc) = targets[a.i];
            match decision {
                CasDecision::Locked => {
                    let image = parse(res.bytes(a.read), self.co.dir.value_len(table)?);
                    out[a.i] = Some((a.swap, image));
                }
                CasDecision::Retry(word) => {
                    self.set_hint(loc, word.version());
                    retries.push((a.i, word));
                }
                CasDecision::Abort => {}
            }
        }
        Ok((retries, round.failure))
    }

    /// Locks the records of `targets` (table, key, loc) with CAS + READ, retrying a CAS
    /// whose hint was stale. Returns, per target, the image read under the lock.
    pub(super) async fn lock_all(&mut self, targets: &[Target]) -> Result<Vec<Locked>, TxnError> {
        let mut out: Vec<Option<Locked>> = vec![None; targets.len()];
        // A record already read: lock at the version read.
        let mut expected: Vec<OoccLockWord> =
            targets.iter().map(|t| self.expected_lock(t.2)).collect();
        for _ in 0..4 {
            let todo: Vec<usize> = (0..targets.len()).filter(|i| out[*i].is_none()).collect();
            if todo.is_empty() {
                break;
            }
            let mut list = PostList::new();
            let mut attempts = Vec::new();
            for &i in &todo {
                attempts.push(self.push_lock_attempt(&mut list, i, targets[i], expected[i])?);
            }
            self.co.ctx.mark_phase(Phase::Lock);
            let res = self.co.ctx.post(list).await?;
            self.lock_time = self.co.ctx.now();
            let (retries, failure) = self.settle_lock_round(targets, &attempts, &res, &mut out)?;
            for (i, word) in retries {
                expected[i] = word;
            }
            if let Some(reason) = failure {
                // Keep what this call locked so that the abort releases it.
                self.adopt_locks(targets, &out);
                return Err(TxnError::Aborted(reason));
            }
        }
        if out.iter().any(Option::is_none) {
            self.adopt_locks(targets, &out);
            return Err(TxnError::Aborted(
                AbortReason::IntentionLockVersionKeptChanging,
            ));
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// The value of `r` if the transaction already has it: written (or locked) by it, or
    /// read and not wanted for update.
    fn local_value(&self, r: &ReadReq, for_update: bool) -> Option<Option<Vec<u8>>> {
        if let Some(w) = self
            .writes
            .iter()
            .find(|w| w.table == r.table && w.key == r.key)
        {
            return Some(match &w.new {
                Some(n) => n.clone(),
                None => w.present.then(|| w.value.clone()),
            });
        }
        if for_update {
            return None;
        }
        let e = self
            .reads
            .iter()
            .find(|e| e.table == r.table && e.key == r.key)?;
        Some(e.image.present.then(|| e.image.value.clone()))
    }

    /// Plans an execution round: per request where its value comes from, the READs of
    /// the read set in `list`, and the records to lock.
    async fn plan_round(
        &mut self,
        reqs: &[ReadReq],
    ) -> Result<(Vec<Pending>, PostList, Vec<Target>), TxnError> {
        let mut pending = Vec::with_capacity(reqs.len());
        let mut list = PostList::new();
        let mut to_lock: Vec<Target> = Vec::new();
        for r in reqs {
            self.co.dir.value_len(r.table)?;
            let for_update = r.access == Access::ForUpdate && !self.read_only();
            if let Some(v) = self.local_value(r, for_update) {
                pending.push(Pending::Local(v));
                continue;
            }
            let loc = self.co.dir.locate(&self.co.ctx, r.table, r.key).await?;
            if for_update {
                let same = |(t, k, _): &Target| *t == r.table && *k == r.key;
                let idx = to_lock.iter().position(same).unwrap_or_else(|| {
                    to_lock.push((r.table, r.key, loc));
                    to_lock.len() - 1
                });
                pending.push(Pending::Lock { idx });
            } else {
                let id = list.read(
                    self.co.dir.addr(loc.mn, loc.offset),
                    self.record_len(r.table)?,
                );
                pending.push(Pending::Read { idx: 0, loc, id });
            }
        }
        Ok((pending, list, to_lock))
    }

    /// An execution round (Alg. 1 lines 1–10): one post list with the READs of the read
    /// set, then the CAS + READ pairs of the write set.
    pub(super) async fn round(&mut self, reqs: &[ReadReq]) -> Result<RoundValues, TxnError> {
        let (mut pending, list, to_lock) = self.plan_round(reqs).await?;
        let mut images: Vec<Image> = Vec::new();
        let locked = if to_lock.is_empty() {
            if !list.is_empty() {
                self.co.ctx.mark_phase(Phase::Execute);
                let res = self.co.ctx.post(list).await?;
                take_reads(&res, &mut pending, &mut images);
            }
            Vec::new()
        } else {
            // Reads and locks in one post list: the first lock attempt carries the reads.
            self.lock_with_reads(&to_lock, list, &mut pending, &mut images)
                .await?
        };
        let mut values = Vec::with_capacity(reqs.len());
        for (r, p) in reqs.iter().zip(pending) {
            values.push(match p {
                Pending::Local(v) => v,
                Pending::Read { idx, loc, .. } => {
                    self.absorb_read(r, loc, &images[idx], &locked, &to_lock)?
                }
                Pending::Lock { idx } => self.absorb_lock(r, idx, &locked, &to_lock),
            });
        }
        Ok(values)
    }

    /// Takes a READ of the round into the read set (Alg. 1 lines 4–5, 13), or aborts.
    fn absorb_read(
        &mut self,
        r: &ReadReq,
        loc: Loc,
        raw: &Image,
        locked: &[Locked],
        to_lock: &[Target],
    ) -> Result<Option<Vec<u8>>, TxnError> {
        let image = parse(&raw.value, self.co.dir.value_len(r.table)?);
        let version = image.lock.version();
        self.set_hint(loc, version);
        let as_reader = self.read_only() || self.co.cfg.artifact_rw_rules;
        match logic::decide_read(image.lock, as_reader) {
            ReadDecision::Leased => {}
            ReadDecision::Validate => self.intention_seen = true,
            ReadDecision::Abort => {
                // The CASes of this round's post list took their locks too: keep them so
                // that the abort releases them (they leaked before, and a TPC-C New-Order
                // that met a Payment's intention lock on WAREHOUSE left DISTRICT locked
                // for the run).
                let all: Vec<_> = locked.iter().cloned().map(Some).collect();
                self.adopt_locks(to_lock, &all);
                return Err(TxnError::Aborted(AbortReason::RecordLocked));
            }
        }
        self.trace.reads.push(ReadEvent {
            writer: image.writer,
            ..ReadEvent::new(r.table, r.key, Version(version))
        });
        let value = image.present.then(|| image.value.clone());
        self.reads.push(ReadEntry {
            table: r.table,
            key: r.key,
            loc,
            version,
            image,
        });
        Ok(value)
    }

    /// Takes lock target `idx` of the round into the write set (once per record).
    fn absorb_lock(
        &mut self,
        r: &ReadReq,
        idx: usize,
        locked: &[Locked],
        to_lock: &[Target],
    ) -> Option<Vec<u8>> {
        let (word, image) = &locked[idx];
        let value = image.present.then(|| image.value.clone());
        if !self
            .writes
            .iter()
            .any(|w| w.table == r.table && w.key == r.key)
        {
            let (table, key, loc) = to_lock[idx];
            self.trace.reads.push(ReadEvent {
                writer: image.writer,
                ..ReadEvent::new(table, key, Version(word.version()))
            });
            self.reads.retain(|e| e.loc != loc);
            self.writes.push(WriteEntry {
                table,
                key,
                loc,
                lock: *word,
                present: image.present,
                value: image.value.clone(),
                new: None,
            });
        }
        value
    }

    /// The execution round with locks: the READs in `list` go out with the first CAS +
    /// READ attempt; stale-hint retries take further rounds.
    async fn lock_with_reads(
        &mut self,
        to_lock: &[Target],
        mut list: PostList,
        pending: &mut [Pending],
        images: &mut Vec<Image>,
    ) -> Result<Vec<Locked>, TxnError> {
        let mut attempts = Vec::new();
        for (i, &target) in to_lock.iter().enumerate() {
            let expected = self.expected_lock(target.2);
            attempts.push(self.push_lock_attempt(&mut list, i, target, expected)?);
        }
        self.co.ctx.mark_phase(Phase::Lock);
        let res = self.co.ctx.post(list).await?;
        self.lock_time = self.co.ctx.now();
        take_reads(&res, pending, images);
        let mut out: Vec<Option<Locked>> = vec![None; to_lock.len()];
        let (retries, failure) = self.settle_lock_round(to_lock, &attempts, &res, &mut out)?;
        if let Some(reason) = failure {
            // Keep what we did lock so that the abort releases it.
            self.adopt_locks(to_lock, &out);
            return Err(TxnError::Aborted(reason));
        }
        if !retries.is_empty() {
            let retry = retries.into_iter().map(|(i, _)| i).collect();
            self.retry_locks(to_lock, retry, &mut out).await?;
        }
        Ok(out
            .into_iter()
            .map(|o| o.expect("every target locked"))
            .collect())
    }

    /// Locks the targets `retry` of `to_lock` whose CAS met a stale hint ([`lock_all`]),
    /// holding the others as write entries meanwhile so that an abort releases them.
    ///
    /// [`lock_all`]: Self::lock_all
    async fn retry_locks(
        &mut self,
        to_lock: &[Target],
        retry: Vec<usize>,
        out: &mut [Option<Locked>],
    ) -> Result<(), TxnError> {
        let targets: Vec<_> = retry.iter().map(|i| to_lock[*i]).collect();
        self.adopt_locks(to_lock, out);
        let got = self.lock_all(&targets).await?;
        // Un-adopt: the caller adds write entries in request order.
        let adopted: Vec<Loc> = to_lock
            .iter()
            .zip(out.iter())
            .filter(|(_, o)| o.is_some())
            .map(|(t, _)| t.2)
            .collect();
        self.writes.retain(|w| !adopted.contains(&w.loc));
        for (i, g) in retry.into_iter().zip(got) {
            out[i] = Some(g);
        }
        Ok(())
    }

    /// Records locks taken so far as write entries (so that an abort releases them).
    pub(super) fn adopt_locks(&mut self, to_lock: &[Target], out: &[Option<Locked>]) {
        for ((table, key, loc), o) in to_lock.iter().zip(out) {
            if let Some((word, image)) = o
                && !self.writes.iter().any(|w| w.loc == *loc)
            {
                self.writes.push(WriteEntry {
                    table: *table,
                    key: *key,
                    loc: *loc,
                    lock: *word,
                    present: image.present,
                    value: image.value.clone(),
                    new: None,
                });
            }
        }
    }
}
