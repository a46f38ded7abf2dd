//! Recovery of a crashed CN's coordinators from OOCC's redo logs (§V, "Write-Unlock"
//! paragraph: replay when the redo log is stored, otherwise abort).
//!
//! With the one-op write-unlock a record becomes visible the moment its commit WRITE
//! lands, so once any record of a transaction is visible the whole transaction must
//! survive: an undo log cannot be used (rolling back would take away a value a reader may
//! have seen). The redo log, written in Validate&Logging, holds every new record image.
//! For a crashed coordinator recovery:
//!
//! 1. cuts the CN off every MN (no late WRITE lands after recovery);
//! 2. reads its redo log; if one of the logged records already shows the new version (its
//!    commit WRITE landed, so validation had passed and readers may have seen it), it
//!    **rolls forward**: writes the logged image to every logged record still locked by
//!    the coordinator at the logged version;
//! 3. otherwise the transaction made nothing visible and is **rolled back**: a log written
//!    in the same round as a validation that failed, or a commit that never started, is
//!    ignored;
//! 4. releases every lock the coordinator still holds (a scan of the records' lock words;
//!    the owner field names the coordinator), at the version it holds it at.
//!
//! [`recover_coordinator`] does this for one coordinator, so a CN's coordinators recovered
//! one by one (as `spawn_log_recovery` calls it) scan every record once each;
//! [`recover_coordinators`] recovers them together with a single scan.
//!
//! The failure detector is `dmem-deploy`'s (`spawn_log_recovery`): heartbeats and a
//! timeout by default, the simulator's crash state when a caller asks (`oocc:oracle`); a
//! suspected CN is cut off every MN before these steps run.

use std::rc::Rc;

use dmem_deploy::{Decision, RecoveredCoordinator};
use dmem_layout::bytes::{ByteReader, ByteSink};
use dmem_layout::record::{OoccLockState, OoccLockWord, OoccRecordHeader};
use dmem_verbs::{Clock, Nanos, PostList, Verbs, VerbsError};

use crate::store::{Directory, LOG_REGION_BYTES, Loc};

/// One logged record image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// MN index.
    pub mn: u16,
    /// Record offset.
    pub offset: u64,
    /// The whole new record image (lock word last: free, new version).
    pub image: Vec<u8>,
}

/// Builds a redo log in the format [`RedoLogImage::parse`] reads, for OOCC, DrTM and DSLR
/// alike: header (`coordinator << 48 | txn sequence number`), entry count, per entry MN,
/// offset, length and image, and the header again as a trailer, every word a little-endian
/// `u64`. A log WRITE lands in increasing address order, so a log whose trailer matches its
/// header landed whole.
#[derive(Debug)]
pub struct RedoLogWriter {
    bytes: Vec<u8>,
    header: u64,
}

impl RedoLogWriter {
    /// A log of `count` entries for transaction `seq` of `coordinator`.
    #[must_use]
    pub fn new(coordinator: u16, seq: u64, count: usize) -> Self {
        let header = (u64::from(coordinator) << 48) | (seq & 0xFFFF_FFFF_FFFF);
        Self::with_header(header, count)
    }

    fn with_header(header: u64, count: usize) -> Self {
        let mut bytes = Vec::with_capacity(32 + count * 64);
        bytes.put_u64(header);
        bytes.put_u64(count as u64);
        Self { bytes, header }
    }

    /// Appends the image a record at `loc` gets.
    pub fn push(&mut self, loc: Loc, image: &[u8]) {
        self.push_entry(loc.mn, loc.offset, image);
    }

    fn push_entry(&mut self, mn: u16, offset: u64, image: &[u8]) {
        self.bytes.put_u64(u64::from(mn));
        self.bytes.put_u64(offset);
        self.bytes.put_u64(image.len() as u64);
        self.bytes.put_bytes(image);
    }

    /// The log with its trailer, whatever its size.
    fn close(mut self) -> Vec<u8> {
        self.bytes.put_u64(self.header);
        self.bytes
    }

    /// The log with its trailer, or `None` when it does not fit a coordinator's log region
    /// ([`LOG_REGION_BYTES`]); the transaction must then abort.
    #[must_use]
    pub fn finish(self) -> Option<Vec<u8>> {
        let bytes = self.close();
        (bytes.len() as u64 <= LOG_REGION_BYTES).then_some(bytes)
    }
}

/// A whole redo log as recovery reads it back from a log region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedoLogImage {
    /// Its header word: coordinator << 48 | txn sequence number.
    pub header: u64,
    /// Its entries.
    pub entries: Vec<LogEntry>,
}

/// Why a log region holds no whole redo log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadRedoLog {
    /// Header 0, no entries or more than 4096: no log was written.
    #[error("no redo log")]
    Empty,
    /// The region ends inside the log.
    #[error("redo log truncated")]
    Truncated,
    /// An entry's MN index or image length is impossible.
    #[error("redo log entry malformed")]
    Entry,
    /// The trailer does not repeat the header: the log did not land whole.
    #[error("torn redo log")]
    Torn,
}

impl RedoLogImage {
    /// The log's bytes, as [`RedoLogWriter`] builds them (without its size check).
    #[must_use]
    pub fn emit(&self) -> Vec<u8> {
        let mut w = RedoLogWriter::with_header(self.header, self.entries.len());
        for e in &self.entries {
            w.push_entry(e.mn, e.offset, &e.image);
        }
        w.close()
    }

    /// The whole log a log region starts with (the rest of the region is ignored).
    ///
    /// # Errors
    /// [`BadRedoLog`] for an empty, malformed or not wholly landed log.
    pub fn parse(bytes: &[u8]) -> Result<Self, BadRedoLog> {
        let mut r = ByteReader::new(bytes);
        let short = |_| BadRedoLog::Truncated;
        let header = r.u64().map_err(short)?;
        let count = r.u64().map_err(short)?;
        if header == 0 || count == 0 || count > 4096 {
            return Err(BadRedoLog::Empty);
        }
        let mut entries = Vec::new();
        for _ in 0..count {
            let mn = u16::try_from(r.u64().map_err(short)?).map_err(|_| BadRedoLog::Entry)?;
            let offset = r.u64().map_err(short)?;
            let len = usize::try_from(r.u64().map_err(short)?).map_err(|_| BadRedoLog::Entry)?;
            let image = r.bytes(len).map_err(short)?.to_vec();
            if len < OoccRecordHeader::LEN + 8 {
                return Err(BadRedoLog::Entry);
            }
            entries.push(LogEntry { mn, offset, image });
        }
        // The trailer repeats the header: the whole log landed.
        if r.u64().map_err(short)? != header {
            return Err(BadRedoLog::Torn);
        }
        Ok(Self { header, entries })
    }
}

fn image_lock(image: &[u8]) -> OoccLockWord {
    let at = image.len() - 8;
    OoccLockWord::from_raw(u64::from_le_bytes(
        image[at..].try_into().unwrap_or([0xFF; 8]),
    ))
}

/// What a protocol's redo log means and how its records say who holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedoLog {
    /// OOCC: logged in the same round as validation; the decision is what landed; lock
    /// words name their owner.
    Validated,
    /// DrTM: logged only after deciding to commit, so a whole log rolls forward by itself;
    /// lock words name their owner.
    Decided,
    /// DSLR 2PL: logged after every lock is granted (a whole log rolls forward), but a
    /// DSLR word names no holder. A logged image is written only while the record's value
    /// still carries the logged old version (the 8-byte prefix): the coordinator's commit
    /// WRITE precedes its release on the same queue pair, so the old version proves it
    /// still holds the exclusive ticket. Its tickets are not released here: DSLR's lease
    /// reset clears them (`dslr2pl`), after this roll-forward.
    DecidedVersioned,
}

/// What a read log decides (steps 2–3 of the module docs) from the lock words its records
/// show now (`now`, one per entry): roll forward if the log is itself the decision
/// (`log_is_decision`) or a logged record no longer shows coordinator `id`'s lock at the
/// logged old version (its commit WRITE landed); then, per entry, whether to write its
/// image (only where the coordinator still holds the lock at the logged old version).
#[must_use]
pub fn decide_log(
    entries: &[LogEntry],
    now: &[OoccLockWord],
    id: u16,
    log_is_decision: bool,
) -> (Decision, Vec<bool>) {
    let logged_old =
        |e: &LogEntry| image_lock(&e.image).version().wrapping_sub(1) & OoccLockWord::MAX_VERSION;
    let held: Vec<bool> = entries
        .iter()
        .zip(now)
        .map(|(e, w)| held_by(*w, id) && w.version() == logged_old(e))
        .collect();
    let landed = log_is_decision
        || entries
            .iter()
            .zip(now)
            .zip(&held)
            .any(|((e, w), h)| !h && w.version() != logged_old(e));
    if landed {
        (Decision::RollForward, held)
    } else {
        (Decision::RollBack, vec![false; entries.len()])
    }
}

/// Whether lock word `w` is a lock (intention or write) of coordinator `id` (step 4).
#[must_use]
pub fn held_by(w: OoccLockWord, id: u16) -> bool {
    w.state().is_ok_and(|s| s != OoccLockState::Free) && w.owner() == id
}

/// Reads coordinator `id`'s whole redo-log region.
async fn read_log<C: Verbs>(ctx: &C, dir: &Directory, id: u16) -> Result<Vec<u8>, VerbsError> {
    let layout = dir.layout();
    let mut list = PostList::new();
    let log_id = list.read(
        dir.addr(layout.log_mn(id), layout.log_offset(id)),
        LOG_REGION_BYTES as u32,
    );
    Ok(ctx.post(list).await?.take_bytes(log_id))
}

/// Steps 2–3 for a parsed log: READs the logged records' lock words, rolls forward or
/// back ([`decide_log`]), truncates the log.
async fn settle_log<C: Verbs>(
    ctx: &C,
    dir: &Directory,
    id: u16,
    entries: &[LogEntry],
    log_is_decision: bool,
    out: &mut RecoveredCoordinator,
) -> Result<(), VerbsError> {
    let layout = dir.layout();
    // The current lock word of every logged record.
    let mut list = PostList::new();
    let ids: Vec<_> = entries
        .iter()
        .map(|e| list.read(dir.addr(e.mn, e.offset + e.image.len() as u64 - 8), 8))
        .collect();
    let res = ctx.post(list).await?;
    let now: Vec<OoccLockWord> = ids
        .iter()
        .map(|i| {
            OoccLockWord::from_raw(u64::from_le_bytes(
                res.bytes(*i).try_into().unwrap_or([0xFF; 8]),
            ))
        })
        .collect();
    let (decision, restore) = decide_log(entries, &now, id, log_is_decision);
    out.decision = Some(decision);
    if decision == Decision::RollForward {
        let mut list = PostList::new();
        for (e, _) in entries.iter().zip(&restore).filter(|(_, r)| **r) {
            list.write(dir.addr(e.mn, e.offset), &e.image);
            out.restored += 1;
        }
        if !list.is_empty() {
            ctx.post(list).await?;
        }
    }
    let mut trunc = PostList::new();
    trunc.write(
        dir.addr(layout.log_mn(id), layout.log_offset(id)),
        &[0u8; 16],
    );
    ctx.post(trunc).await?;
    Ok(())
}

/// Step 4: releases every lock the coordinators `owners` still hold, at the version each
/// holds it at, scanning the lock words of every record 64 at a time (one scan for all of
/// them). Returns how many per coordinator.
async fn release_locks<C: Verbs>(
    ctx: &C,
    dir: &Directory,
    owners: &[u16],
) -> Result<Vec<usize>, VerbsError> {
    let mut unlocked = vec![0; owners.len()];
    let slots = dir.all_in_memory(ctx).await?;
    for chunk in slots.chunks(64) {
        let mut list = PostList::new();
        let mut ids = Vec::new();
        for ((table, _), loc) in chunk {
            let Ok(vlen) = dir.value_len(*table) else {
                continue;
            };
            let at = loc.offset + OoccRecordHeader::lock_offset(vlen) as u64;
            ids.push((at, loc.mn, list.read(dir.addr(loc.mn, at), 8)));
        }
        let res = ctx.post(list).await?;
        let mut release = PostList::new();
        for (at, mn, rid) in ids {
            let w = OoccLockWord::from_raw(u64::from_le_bytes(
                res.bytes(rid).try_into().unwrap_or([0; 8]),
            ));
            if let Some(i) = owners.iter().position(|&id| held_by(w, id)) {
                release.write(
                    dir.addr(mn, at),
                    &w.released_same_version().to_raw().to_le_bytes(),
                );
                unlocked[i] += 1;
            }
        }
        if !release.is_empty() {
            ctx.post(release).await?;
        }
    }
    Ok(unlocked)
}

/// Recovers coordinator `id` (steps 2–4 of the module docs) through `ctx`, reading its
/// log as `kind` says.
///
/// # Errors
/// A verb failed.
pub async fn recover_coordinator<C: Verbs + Clock>(
    ctx: &C,
    dir: &Rc<Directory>,
    id: u16,
    kind: RedoLog,
) -> Result<RecoveredCoordinator, VerbsError> {
    if kind == RedoLog::DecidedVersioned {
        return recover_versioned(ctx, dir, id, true).await;
    }
    let mut out = recover_log(ctx, dir, id, kind).await?;
    out.unlocked = release_locks(ctx, dir, &[id]).await?[0];
    Ok(out)
}

/// Steps 2–3 for coordinator `id` ([`RedoLog::Validated`] or [`RedoLog::Decided`]).
async fn recover_log<C: Verbs>(
    ctx: &C,
    dir: &Directory,
    id: u16,
    kind: RedoLog,
) -> Result<RecoveredCoordinator, VerbsError> {
    let log = read_log(ctx, dir, id).await?;
    let mut out = RecoveredCoordinator {
        coordinator: id,
        txn: None,
        decision: None,
        restored: 0,
        unlocked: 0,
    };
    if let Ok(RedoLogImage { header, entries }) = RedoLogImage::parse(&log) {
        out.txn = Some(header & 0xFFFF_FFFF_FFFF);
        let log_is_decision = kind == RedoLog::Decided;
        settle_log(ctx, dir, id, &entries, log_is_decision, &mut out).await?;
    }
    Ok(out)
}

/// Recovers the coordinators `ids` of one crashed CN together: each one's log in the
/// order given, as [`recover_coordinator`] does, then a single scan of the lock words
/// that releases the locks of all of them (step 4). The result is the same as one
/// [`recover_coordinator`] per id (a record's lock has one owner, and a release keeps its
/// version, so no coordinator's log decision depends on another's released locks), but
/// the scan — one READ of every record's lock word, 64 per round trip — is paid once
/// instead of once per coordinator: on `dmem recover --protocol oocc --workload smallbank`
/// (200 000 records) one scan takes 17 ms of simulated time, and the CN's 32 coordinators
/// recovered one by one take 545 ms. Each result comes with the virtual time its
/// coordinator's recovery was over (after the shared scan, where there is one).
///
/// # Errors
/// A verb failed.
pub async fn recover_coordinators<C: Verbs + Clock>(
    ctx: &C,
    dir: &Rc<Directory>,
    ids: &[u16],
    kind: RedoLog,
) -> Result<Vec<(RecoveredCoordinator, Nanos)>, VerbsError> {
    if kind == RedoLog::DecidedVersioned {
        let mut out = Vec::with_capacity(ids.len());
        for &id in ids {
            let r = recover_versioned(ctx, dir, id, true).await?;
            out.push((r, ctx.now()));
        }
        return Ok(out);
    }
    let mut out = Vec::with_capacity(ids.len());
    for &id in ids {
        out.push(recover_log(ctx, dir, id, kind).await?);
    }
    let unlocked = release_locks(ctx, dir, ids).await?;
    let now = ctx.now();
    Ok(out
        .into_iter()
        .zip(unlocked)
        .map(|(mut r, u)| {
            r.unlocked = u;
            (r, now)
        })
        .collect())
}

fn prefix_version(bytes: &[u8]) -> Option<u64> {
    let at = OoccRecordHeader::LEN;
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

/// The planted bug `dslr:skip-roll-forward`: coordinator `id`'s [`RedoLog::DecidedVersioned`]
/// log is discarded instead of rolled forward (see
/// [`DslrConfig::bug_skip_roll_forward`](crate::dslr2pl::DslrConfig::bug_skip_roll_forward)).
///
/// # Errors
/// A verb failed.
pub async fn discard_versioned_log<C: Verbs + Clock>(
    ctx: &C,
    dir: &Rc<Directory>,
    id: u16,
) -> Result<RecoveredCoordinator, VerbsError> {
    recover_versioned(ctx, dir, id, false).await
}

/// [`RedoLog::DecidedVersioned`]: rolls a whole log forward onto the records that still
/// show the logged old version; releases nothing.
///
/// `roll_forward` false is the planted bug of
/// [`DslrConfig::bug_skip_roll_forward`](crate::dslr2pl::DslrConfig::bug_skip_roll_forward):
/// the log is read and truncated but no image is written.
async fn recover_versioned<C: Verbs + Clock>(
    ctx: &C,
    dir: &Rc<Directory>,
    id: u16,
    roll_forward: bool,
) -> Result<RecoveredCoordinator, VerbsError> {
    let layout = dir.layout();
    let log_addr = dir.addr(layout.log_mn(id), layout.log_offset(id));
    let mut list = PostList::new();
    let log_id = list.read(log_addr, LOG_REGION_BYTES as u32);
    let log = ctx.post(list).await?.take_bytes(log_id);
    let mut out = RecoveredCoordinator {
        coordinator: id,
        txn: None,
        decision: None,
        restored: 0,
        unlocked: 0,
    };
    let Ok(RedoLogImage { header, entries }) = RedoLogImage::parse(&log) else {
        return Ok(out);
    };
    out.txn = Some(header & 0xFFFF_FFFF_FFFF);
    out.decision = Some(Decision::RollForward);
    let mut list = PostList::new();
    let at = (OoccRecordHeader::LEN + 8) as u32;
    let ids: Vec<_> = entries
        .iter()
        .map(|e| list.read(dir.addr(e.mn, e.offset), at))
        .collect();
    let res = ctx.post(list).await?;
    let mut write = PostList::new();
    for (e, rid) in entries.iter().zip(ids) {
        let logged_new = prefix_version(&e.image);
        let now = prefix_version(res.bytes(rid));
        if let (Some(new), Some(now)) = (logged_new, now)
            && now.wrapping_add(1) == new
            && roll_forward
        {
            write.write(dir.addr(e.mn, e.offset), &e.image);
            out.restored += 1;
        }
    }
    if !write.is_empty() {
        ctx.post(write).await?;
    }
    let mut trunc = PostList::new();
    trunc.write(log_addr, &[0u8; 16]);
    ctx.post(trunc).await?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(len: usize, fill: u8) -> Vec<u8> {
        vec![fill; OoccRecordHeader::LEN + 8 + len]
    }

    #[test]
    fn a_written_log_parses_back() {
        let entries = [
            (
                Loc {
                    mn: 0,
                    offset: 4096,
                },
                image(8, 1),
            ),
            (
                Loc {
                    mn: 2,
                    offset: 1 << 40,
                },
                image(1000, 2),
            ),
        ];
        let mut w = RedoLogWriter::new(7, 0x1234_5678_9abc, entries.len());
        for (loc, img) in &entries {
            w.push(*loc, img);
        }
        let log = w.finish().expect("fits its region");
        let parsed = RedoLogImage::parse(&log).expect("whole log");
        assert_eq!(parsed.header, 7 << 48 | 0x1234_5678_9abc);
        assert_eq!(parsed.entries.len(), 2);
        for ((loc, img), e) in entries.iter().zip(&parsed.entries) {
            assert_eq!((e.mn, e.offset, &e.image), (loc.mn, loc.offset, img));
        }
        assert_eq!(parsed.emit(), log);
        for n in 0..log.len() {
            assert!(RedoLogImage::parse(&log[..n]).is_err(), "cut at {n}");
        }
    }

    #[test]
    fn a_log_that_did_not_land_whole_is_ignored() {
        let mut w = RedoLogWriter::new(1, 5, 1);
        w.push(Loc { mn: 1, offset: 64 }, &image(16, 3));
        let log = w.finish().expect("fits");
        // Every strict prefix, as a torn WRITE leaves it (the rest of the region zero): a
        // prefix that lacks only zero bytes is the whole log; any other is no log.
        for cut in 0..log.len() {
            let mut torn = log[..cut].to_vec();
            torn.resize(log.len() + 8, 0);
            if log[cut..].iter().all(|&b| b == 0) {
                assert_eq!(RedoLogImage::parse(&torn), RedoLogImage::parse(&log));
            } else {
                assert!(
                    RedoLogImage::parse(&torn).is_err(),
                    "prefix of {cut} bytes parsed"
                );
            }
        }
    }

    /// A logged image of a record at version `v` (its lock word: free, `v + 1`).
    fn logged(offset: u64, v: u64) -> LogEntry {
        let mut image = image(8, 0);
        let at = image.len() - 8;
        let lock = OoccLockWord::free(v).unwrap().released_next_version();
        image[at..].copy_from_slice(&lock.to_raw().to_le_bytes());
        LogEntry {
            mn: 0,
            offset,
            image,
        }
    }

    #[test]
    fn a_log_rolls_forward_once_one_commit_write_landed() {
        let entries = [logged(64, 5), logged(128, 9)];
        let mine = |v: u64| OoccLockWord::free(v).unwrap().with_intention_lock(3);
        // Every record still locked by coordinator 3 at the logged old version: the
        // validation may have failed, nothing is visible: roll back, write nothing.
        let held = [mine(5).with_write_lock(), mine(9)];
        assert_eq!(
            decide_log(&entries, &held, 3, false),
            (Decision::RollBack, vec![false, false])
        );
        // DrTM's log is the decision itself.
        assert_eq!(
            decide_log(&entries, &held, 3, true),
            (Decision::RollForward, vec![true, true])
        );
        // The first record's commit WRITE landed (free at the new version): roll the
        // other forward.
        let one_landed = [OoccLockWord::free(6).unwrap(), mine(9)];
        assert_eq!(
            decide_log(&entries, &one_landed, 3, false),
            (Decision::RollForward, vec![false, true])
        );
        // Another coordinator's lock at the logged version is no sign of a landed commit.
        let other = [
            mine(5),
            OoccLockWord::free(9).unwrap().with_intention_lock(4),
        ];
        assert_eq!(
            decide_log(&entries, &other, 3, false),
            (Decision::RollBack, vec![false, false])
        );
        assert!(held_by(mine(1), 3) && !held_by(mine(1), 4));
        assert!(!held_by(OoccLockWord::free(1).unwrap(), 0));
    }

    #[test]
    fn a_log_larger_than_its_region_is_refused() {
        let big = image(LOG_REGION_BYTES as usize, 0);
        let mut w = RedoLogWriter::new(1, 1, 1);
        w.push(Loc { mn: 0, offset: 0 }, &big);
        assert!(w.finish().is_none());
    }
}
