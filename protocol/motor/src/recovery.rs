//! Recovery of a crashed CN's Motor coordinators from their op logs ([`crate::oplog`]).
//!
//! The failure detector cut the CN off every MN first, so nothing of it lands later. Per
//! coordinator, from its [`OpLog`]:
//!
//! * **Idle**: nothing to do.
//! * **Locking** (the transaction had not decided to commit; nothing of it was written to
//!   a record): every logged lock is released with a CAS from the coordinator's lock value
//!   to 0 — Motor's code does exactly this — so a lock the coordinator already released and
//!   someone else took since is left alone.
//! * **Committing** (commit timestamp taken, validation passed; the transaction is decided
//!   and is **rolled forward**): per installed record, a CAS of the primary's lock from the
//!   coordinator's value to a recovery value tells whether the primary install landed. The
//!   commit's post list to the primary ends with the unlock, after every install WRITE to
//!   that MN on the same queue pair, so:
//!   - still held: some of the install may be missing anywhere; it is written again on
//!     every replica (the same bytes at the same offsets; nobody else wrote the record
//!     since, the lock was held) and the lock released;
//!   - released: the primary holds the version and others may have read it or written a
//!     newer one; a backup whose newest version is older than the logged one (its post list
//!     was lost) gets the image and the cell. A successor never writes the newest version's
//!     cell (it takes a free or the oldest one), so this cannot overwrite its install.
//!
//!   Then the remaining logged locks (records locked for update but not written) are
//!   released by CAS as above.
//!
//! Deviation (recorded in the crate README): on a backup repaired without the lock only
//! the image and cell are written, not a floor raised by the lost install's eviction; a
//! backup's floor matters only after a fail-over, which dmem's Motor does not do.

use dmem_store::Store;
use dmem_verbs::{Clock, PostList, Verbs, VerbsError};

use crate::mvcc::{LOCK_OFFSET, Meta, Shapes};
use crate::oplog::{Install, LockedRecord, OpLog, OpLogs};

/// The lock value recovery holds while it finishes a record (no coordinator uses it:
/// coordinators lock with `id + 1 ≤ 65536`).
pub const RECOVERY_LOCK: u64 = u64::MAX;

/// The lock value of coordinator `id`.
#[must_use]
pub fn lock_value(id: u16) -> u64 {
    u64::from(id) + 1
}

/// What recovery did for one coordinator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovered {
    /// The sequence number of the transaction found committing, which recovery rolled
    /// forward; `None` if none was (Motor never rolls back: nothing is written before the
    /// commit decision).
    pub rolled_forward: Option<u64>,
    /// Installs finished (records written again or backups repaired, or found complete).
    pub restored: usize,
    /// Locks it still held and recovery released.
    pub unlocked: usize,
}

/// Why recovery could not finish a coordinator.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecoveryError {
    /// A verb failed.
    #[error("{0}")]
    Verbs(#[from] VerbsError),
    /// The log names a record the store does not know.
    #[error("the op log names a record of table {0} the store does not lay out")]
    UnknownRecord(u32),
}

/// Finishes coordinator `id`'s transaction as its op log in `logs` says (see the module
/// docs) and clears the log. With `releases_only` (a planted bug, and what Motor's public
/// code does) a committing transaction's installs are not finished: its locks are only
/// released.
///
/// # Errors
/// [`RecoveryError`] if a verb fails or the log does not match the store.
pub async fn recover_coordinator<C: Verbs + Clock>(
    ctx: &C,
    store: &Store,
    shapes: &Shapes,
    logs: &OpLogs,
    id: u16,
    releases_only: bool,
) -> Result<Recovered, RecoveryError> {
    let mut out = Recovered::default();
    let (locked, installs) = match logs.get(id) {
        OpLog::Idle => return Ok(out),
        OpLog::Locking { locked, .. } => (locked, Vec::new()),
        OpLog::Committing {
            seq,
            locked,
            installs,
        } if !releases_only => {
            out.rolled_forward = Some(seq);
            (locked, installs)
        }
        OpLog::Committing { locked, .. } => (locked, Vec::new()),
    };
    for install in &installs {
        if finish_install(ctx, store, shapes, id, install).await? {
            out.unlocked += 1;
        }
        out.restored += 1;
    }
    let rest: Vec<LockedRecord> = locked
        .into_iter()
        .filter(|r| !installs.iter().any(|i| i.record == *r))
        .collect();
    out.unlocked += release(ctx, store, id, &rest).await?;
    logs.finished(id);
    Ok(out)
}

/// Releases `records` from coordinator `id` with one CAS each; returns how many it held.
async fn release<C: Verbs>(
    ctx: &C,
    store: &Store,
    id: u16,
    records: &[LockedRecord],
) -> Result<usize, RecoveryError> {
    if records.is_empty() {
        return Ok(0);
    }
    let mut list = PostList::new();
    let mut wrs = Vec::new();
    for r in records {
        let p = store
            .primary(r.partition)
            .map_err(|_| RecoveryError::UnknownRecord(r.table.0))?;
        wrs.push(list.cas(store.addr(p, r.block + LOCK_OFFSET), lock_value(id), 0));
    }
    let res = ctx.post(list).await?;
    Ok(wrs
        .into_iter()
        .filter(|&wr| res.atomic(wr) == lock_value(id))
        .count())
}

/// Finishes one install; returns whether the coordinator still held the record's lock.
async fn finish_install<C: Verbs>(
    ctx: &C,
    store: &Store,
    shapes: &Shapes,
    id: u16,
    install: &Install,
) -> Result<bool, RecoveryError> {
    let r = install.record;
    let unknown = |_| RecoveryError::UnknownRecord(r.table.0);
    let shape = shapes.get(r.table).map_err(unknown)?;
    let primary = store.primary(r.partition).map_err(unknown)?;
    let lock = store.addr(primary, r.block + LOCK_OFFSET);
    let mut list = PostList::new();
    let cas = list.cas(lock, lock_value(id), RECOVERY_LOCK);
    let held = ctx.post(list).await?.atomic(cas) == lock_value(id);
    let mut list = PostList::new();
    if held {
        for mn in store.live_replicas(r.partition) {
            let at = |o: u64| store.addr(mn, r.block + o);
            for (o, bytes) in &install.images {
                list.write(at(*o), bytes);
            }
            match &install.whole {
                Some((o, bytes)) => list.write(at(*o), bytes),
                None => list.write(at(install.cell.0), &install.cell.1),
            };
        }
        list.write(lock, &0u64.to_le_bytes());
        ctx.post(list).await?;
        return Ok(true);
    }
    // The primary has the version: repair backups whose post list was lost.
    let backups: Vec<u16> = store
        .live_replicas(r.partition)
        .into_iter()
        .filter(|&mn| mn != primary)
        .collect();
    let mut reads = Vec::new();
    for &mn in &backups {
        reads.push((
            mn,
            list.read(store.addr(mn, r.block), shape.meta_len() as u32),
        ));
    }
    if reads.is_empty() {
        return Ok(false);
    }
    let res = ctx.post(list).await?;
    let mut list = PostList::new();
    for (mn, wr) in reads {
        let newest = Meta::parse(res.bytes(wr), shape).map_or(0, |m| {
            m.cells
                .iter()
                .filter(|c| c.is_committed())
                .map(|c| c.commit_version())
                .max()
                .unwrap_or(0)
        });
        if newest < install.version {
            let at = |o: u64| store.addr(mn, r.block + o);
            for (o, bytes) in &install.images {
                list.write(at(*o), bytes);
            }
            list.write(at(install.cell.0), &install.cell.1);
        }
    }
    if !list.is_empty() {
        ctx.post(list).await?;
    }
    Ok(false)
}
