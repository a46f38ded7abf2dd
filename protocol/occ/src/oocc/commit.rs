//! Validate&Logging and Commit (Alg. 1 lines 11–25): the thin async shell. When to wait,
//! what to validate and what each commit WRITE carries is decided in [`super::logic`].

use std::rc::Rc;

use dmem_txn::{AbortReason, HistorySink, TxnError, TxnOutcome, Version, WriteEvent};
use dmem_verbs::{BatchResult, Clock, Nanos, Phase, PostList, RemoteAddr, Verbs, WrId};

use super::logic::{self, ReadOnlyCommit};
use super::{OoccTxn, bump, write_event};
use crate::recovery::RedoLogWriter;
use crate::store::emit;

impl<C: Verbs + Clock> OoccTxn<'_, C> {
    /// Appends an 8-byte READ of every read record's lock word to `list`.
    fn push_lock_reads(&self, list: &mut PostList) -> Result<Vec<WrId>, TxnError> {
        self.reads
            .iter()
            .map(|r| Ok(list.read(self.lock_addr(r.table, r.loc)?, 8)))
            .collect()
    }

    /// Whether the lock words READ as `ids` (one per read, in order) keep every read.
    fn reads_hold(&self, res: &BatchResult, ids: &[WrId], read_only: bool) -> bool {
        logic::validate_all(
            self.reads
                .iter()
                .zip(ids)
                .map(|(r, id)| (r.version, logic::word_of(res.bytes(*id)))),
            read_only,
        )
    }

    /// A validation round (Alg. 1 line 14): READs the read set's lock words; whether every
    /// read keeps. No read, no round.
    async fn validation_round(&self, read_only: bool) -> Result<bool, TxnError> {
        let mut list = PostList::new();
        let ids = self.push_lock_reads(&mut list)?;
        if list.is_empty() {
            return Ok(true);
        }
        self.co.ctx.mark_phase(Phase::Validate);
        let res = self.co.ctx.post(list).await?;
        Ok(self.reads_hold(&res, &ids, read_only))
    }

    /// Sleeps until `until` (local clock) if it is still ahead, counting the wait.
    async fn sleep_for_lease(&self, until: Nanos) {
        if let Some(wait) = logic::wait_for(until, self.co.ctx.now()) {
            bump(&self.co.stats.lease_wait_ns, wait);
            self.co.ctx.sleep_until(until).await;
        }
    }

    /// The coordinator's redo-log region.
    pub(super) fn log_addr(&self) -> RemoteAddr {
        let layout = self.co.dir.layout();
        self.co
            .dir
            .addr(layout.log_mn(self.co.id), layout.log_offset(self.co.id))
    }

    /// Validate&Logging for a transaction that writes nothing (Alg. 1 lines 12–16).
    pub(super) async fn commit_read_only(&mut self) -> Result<(), TxnError> {
        let stats = Rc::clone(&self.co.stats);
        let elapsed = self.co.ctx.now().saturating_sub(self.start);
        stats
            .ro_longest_ns
            .set(stats.ro_longest_ns.get().max(elapsed));
        let rv = self.co.leases.rv.get();
        match logic::read_only_commit(&self.co.cfg, elapsed, rv, self.intention_seen) {
            ReadOnlyCommit::InLease => bump(&stats.ro_one_round, 1),
            why => {
                if why == ReadOnlyCommit::Intention {
                    bump(&stats.ro_intention, 1);
                } else {
                    bump(&stats.ro_lease_expired, 1);
                }
                if !self.validation_round(true).await? {
                    return Err(TxnError::Aborted(AbortReason::ReadOnlyValidationFailed));
                }
            }
        }
        self.release_all(Phase::Release).await;
        bump(&stats.ro_committed, 1);
        self.done = true;
        self.trace.finish(
            &self.co.history,
            self.co.ctx.true_now(),
            TxnOutcome::Committed,
            Vec::new(),
        );
        Ok(())
    }

    /// [`OoccConfig::artifact_rw_rules`](super::OoccConfig::artifact_rw_rules): right after
    /// execution, the read set is validated by version only (an intention lock passes) if
    /// an intention lock was met or `rv` ran out, else not at all.
    async fn validate_as_the_artifact(&self) -> Result<(), TxnError> {
        let elapsed = self.co.ctx.now().saturating_sub(self.start);
        if !logic::artifact_validates(self.intention_seen, elapsed, self.co.leases.rv.get()) {
            return Ok(());
        }
        if self.validation_round(true).await? {
            Ok(())
        } else {
            Err(TxnError::Aborted(AbortReason::ValidationFailed))
        }
    }

    /// The redo log (§V) of the records written, and each one's new image (lock word
    /// last: free, next version).
    fn redo_log(&self) -> Result<(Vec<u8>, Vec<Vec<u8>>), TxnError> {
        let written: Vec<_> = self.writes.iter().filter(|w| w.new.is_some()).collect();
        let mut log = RedoLogWriter::new(self.co.id, self.trace.id.seq, written.len());
        let mut images = Vec::new();
        for w in &written {
            let vlen = self.co.dir.value_len(w.table)?;
            let new = w.new.as_ref().and_then(|n| n.as_deref());
            let image = emit(
                w.table,
                w.key,
                new,
                vlen,
                w.lock.released_next_version(),
                Some(self.trace.id),
            );
            log.push(w.loc, &image);
            images.push(image);
        }
        let log = log
            .finish()
            .ok_or(TxnError::Aborted(AbortReason::RedoLogLargerThanRegion))?;
        Ok((log, images))
    }

    /// The Validate&Logging round (Alg. 1 lines 17–21): the redo log, the write-lock
    /// upgrades and, if the lease will have run out, the read set's lock words; then a
    /// validation round if the lease ran out while it was in flight. Whether every read
    /// keeps.
    async fn validate_and_log(&mut self, log: Vec<u8>) -> Result<bool, TxnError> {
        let mut list = PostList::new();
        list.write_owned(self.log_addr(), log);
        for w in self.writes.iter().filter(|w| w.new.is_some()) {
            let word = w.lock.with_write_lock();
            list.write(
                self.lock_addr(w.table, w.loc)?,
                &word.to_raw().to_le_bytes(),
            );
        }
        // Validation is skipped while the lease holds when the round returns (checked
        // after it); with the implicit lease off it always goes in this round.
        let (now, rv) = (self.co.ctx.now(), self.co.leases.rv.get());
        let validate_now = logic::validate_in_log_round(&self.co.cfg, now, self.start, rv);
        let ids = if validate_now {
            self.push_lock_reads(&mut list)?
        } else {
            Vec::new()
        };
        self.logged = true;
        self.co.ctx.mark_phase(Phase::Log);
        let res = self.co.ctx.post(list).await?;
        let upgraded = self.co.ctx.now();
        let ok = self.reads_hold(&res, &ids, false);
        let (rv, has_reads) = (self.co.leases.rv.get(), !self.reads.is_empty());
        let cfg = &self.co.cfg;
        if ok
            && logic::validate_after_log_round(
                cfg,
                validate_now,
                upgraded,
                self.start,
                rv,
                has_reads,
            )
        {
            // The lease ran out while the round was in flight: validate now.
            return self.validation_round(false).await;
        }
        Ok(ok)
    }

    /// Records the decision to commit (before the first commit WRITE).
    fn record_decided(&mut self) {
        let writes: Vec<WriteEvent> = self
            .writes
            .iter()
            .filter(|w| w.new.is_some())
            .map(|w| {
                write_event(
                    w.table,
                    w.key,
                    Version(w.lock.released_next_version().version()),
                    &w.new,
                    w.present,
                )
            })
            .collect();
        self.done = true;
        self.trace.finish(
            &self.co.history,
            self.co.ctx.true_now(),
            TxnOutcome::Unknown,
            writes,
        );
    }

    /// Commit (Alg. 1 lines 22–25): one WRITE per record of value + version + free lock
    /// (lock last, §V), and the released intention locks of records locked but not
    /// written; without the one-op write-unlock the lock words a round later.
    async fn commit_round(&mut self, images: &[Vec<u8>]) -> Result<(), TxnError> {
        let dir = Rc::clone(&self.co.dir);
        let mut list = PostList::new();
        let mut unlock = PostList::new();
        let written = self.writes.iter().filter(|w| w.new.is_some());
        for (w, image) in written.zip(images) {
            let vlen = dir.value_len(w.table)?;
            let rewrite = logic::rewrites_header(&w.new, w.present);
            let s = logic::commit_slices(self.co.cfg.one_op_unlock, rewrite, image.len(), vlen);
            let at = w.loc.offset + s.record.start as u64;
            list.write(dir.addr(w.loc.mn, at), &image[s.record]);
            if let Some(lock) = s.unlock {
                unlock.write(self.lock_addr(w.table, w.loc)?, &image[lock]);
            }
            self.co
                .hints
                .borrow_mut()
                .insert(w.loc, w.lock.version() + 1);
        }
        for w in self.writes.iter().filter(|w| w.new.is_none()) {
            list.write(
                self.lock_addr(w.table, w.loc)?,
                &w.lock.released_same_version().to_raw().to_le_bytes(),
            );
        }
        self.co.ctx.mark_phase(Phase::Commit);
        self.co.ctx.post(list).await?;
        if !unlock.is_empty() {
            self.co.ctx.mark_phase(Phase::Unlock);
            self.co.ctx.post(unlock).await?;
        }
        Ok(())
    }

    /// Validate&Logging and Commit of a transaction that writes (Alg. 1 lines 17–25).
    pub(super) async fn commit_read_write(&mut self) -> Result<(), TxnError> {
        let (log, images) = self.redo_log()?;
        if self.co.cfg.artifact_rw_rules {
            self.validate_as_the_artifact().await?;
        }
        let ww = self.co.leases.ww.get();
        if let Some(at) = logic::upgrade_at(&self.co.cfg, self.lock_time, ww) {
            // Overlap the lease wait with everything before the upgrade round (§IV-B).
            self.sleep_for_lease(at).await;
        }
        if !self.validate_and_log(log).await? {
            // Locks were upgraded: release them (the log is ignored by recovery unless a
            // commit WRITE of it landed, see `recovery`).
            for w in &mut self.writes {
                if w.new.is_some() {
                    w.lock = w.lock.with_write_lock();
                }
            }
            return Err(TxnError::Aborted(AbortReason::ValidationFailed));
        }
        // Decided: record before the first commit WRITE.
        self.record_decided();
        if let Some(until) = logic::commit_at(&self.co.cfg, self.lock_time, ww) {
            self.sleep_for_lease(until).await;
        }
        self.commit_round(&images).await?;
        // Committed once every record is written. Resolved before the log is truncated,
        // never after: recovery settles an `Unknown` transaction whose coordinator left no
        // log as rolled back, so a CN killed between a landed truncation and its resolution
        // would leave versions that no transaction of the history installed.
        bump(&self.co.stats.rw_committed, 1);
        self.co
            .history
            .resolve(self.trace.id, TxnOutcome::Committed, self.co.ctx.true_now());
        // The log is dead now: truncate without waiting.
        let mut trunc = PostList::new();
        trunc.write(self.log_addr(), &[0u8; 16]);
        self.co.ctx.mark_phase(Phase::Truncate);
        let _ = self.co.ctx.post_detached(trunc).await;
        Ok(())
    }
}
