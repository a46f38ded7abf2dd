//! Lock-rebuild-free recovery (LOTUS §6): the commit log, and deciding a failed
//! coordinator's last transaction from it.
//!
//! # Commit log
//!
//! Written in commit step (1) to the coordinator's log region on every MN, **before** the
//! new images and INVISIBLE cells in the same post list, so that on every MN (every queue
//! pair executes in order) any INVISIBLE cell that landed was preceded by the whole log:
//!
//! ```text
//! writer u64 (packed transaction id) | n u32 | pad u32
//! n × (table u32, partition u16, cell u16, block offset u64)
//! writer u64 (trailer: the log landed whole; a WRITE lands line by line, in address order)
//! ```
//!
//! # Deciding
//!
//! For a failed coordinator, recovery reads its log region on every live MN, takes the
//! newest whole log, and looks at every logged cell on every replica whose image names the
//! logged transaction as its writer (older logs name cells reused since): if one of them is
//! visible (has a commit version), the transaction reached commit step (3) and is **rolled
//! forward** (the same version written into its cells still INVISIBLE); otherwise it never
//! became visible and is **rolled back** (its INVISIBLE cells freed, keeping their CVs).
//! Only afterwards do the survivors release the failed CN's locks (the caller's job): a lock
//! released earlier lets a survivor read around an INVISIBLE version that recovery then
//! makes visible — the planted bug `early-unlock` does exactly that.

use dmem_layout::cvt::{CvtCell, INVISIBLE};
use dmem_motor::logic::free_with_cv;
use dmem_motor::mvcc::{self, Shapes, unpack_writer};
use dmem_store::Store;
use dmem_txn::{TableId, TxnId};
use dmem_verbs::{PostList, Verbs, VerbsError};
use zerocopy::IntoBytes;

/// One logged new version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogEntry {
    /// Its table.
    pub table: TableId,
    /// The partition of its record.
    pub partition: u16,
    /// The cell written.
    pub cell: u16,
    /// The record's block offset.
    pub offset: u64,
}

/// Bytes of a log apart from its entries: writer and count before them, writer after.
pub const LOG_FIXED_BYTES: usize = 16 + 8;

/// Bytes of one log entry, whatever the record's value length (the log names new records,
/// it does not copy them).
pub const LOG_ENTRY_BYTES: usize = 16;

/// Bytes of a log with `n` entries.
#[must_use]
pub const fn log_len(n: usize) -> usize {
    LOG_FIXED_BYTES + LOG_ENTRY_BYTES * n
}

/// The encoding of a commit log.
#[must_use]
pub fn encode_log(writer: u64, entries: &[LogEntry]) -> Vec<u8> {
    let mut b = Vec::with_capacity(log_len(entries.len()));
    b.extend_from_slice(&writer.to_le_bytes());
    b.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    b.extend_from_slice(&[0; 4]);
    for e in entries {
        b.extend_from_slice(&e.table.0.to_le_bytes());
        b.extend_from_slice(&e.partition.to_le_bytes());
        b.extend_from_slice(&e.cell.to_le_bytes());
        b.extend_from_slice(&e.offset.to_le_bytes());
    }
    b.extend_from_slice(&writer.to_le_bytes());
    b
}

/// Parses a log region: the writer and entries of a whole log, `None` for an empty, torn
/// or malformed one.
#[must_use]
pub fn parse_log(b: &[u8]) -> Option<(u64, Vec<LogEntry>)> {
    let u64_at =
        |o: usize| -> Option<u64> { Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?)) };
    let writer = u64_at(0)?;
    if writer == 0 {
        return None;
    }
    let n = u32::from_le_bytes(b.get(8..12)?.try_into().ok()?) as usize;
    if n == 0 || log_len(n) > b.len() {
        return None;
    }
    if u64_at(16 + 16 * n)? != writer {
        return None;
    }
    let mut entries = Vec::with_capacity(n);
    for i in 0..n {
        let o = 16 + 16 * i;
        entries.push(LogEntry {
            table: TableId(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?)),
            partition: u16::from_le_bytes(b.get(o + 4..o + 6)?.try_into().ok()?),
            cell: u16::from_le_bytes(b.get(o + 6..o + 8)?.try_into().ok()?),
            offset: u64_at(o + 8)?,
        });
    }
    Some((writer, entries))
}

/// What recovery decided for one coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decided {
    /// No whole log with a cell of its transaction: nothing to do.
    Nothing,
    /// Its transaction's versions were made visible at this commit version.
    RolledForward {
        /// The transaction.
        txn: TxnId,
        /// Its commit version.
        version: u64,
        /// Cells written.
        cells: usize,
    },
    /// Its transaction's INVISIBLE versions were freed.
    RolledBack {
        /// The transaction.
        txn: TxnId,
        /// Cells freed.
        cells: usize,
    },
}

/// A logged cell as found on one replica.
#[derive(Debug, Clone, Copy)]
struct Found {
    mn: u16,
    at: u64,
    cell: CvtCell,
}

/// Decides coordinator `coordinator`'s last logged transaction (module docs) through `ctx`.
///
/// # Errors
/// A failed READ or WRITE.
pub async fn recover_coordinator<V: Verbs>(
    ctx: &V,
    store: &Store,
    shapes: &Shapes,
    coordinator: u16,
) -> Result<Decided, VerbsError> {
    Ok(recover_coordinators(ctx, store, shapes, &[coordinator])
        .await?
        .first()
        .copied()
        .unwrap_or(Decided::Nothing))
}

/// Decides the last logged transaction of every coordinator of `coordinators` (module
/// docs) in three round trips whatever their number: one post list READs every log region
/// on every live MN, one READs every logged cell and image, one writes every decision.
/// Returns the decisions in the order of `coordinators`.
///
/// # Errors
/// A failed READ or WRITE.
pub async fn recover_coordinators<V: Verbs>(
    ctx: &V,
    store: &Store,
    shapes: &Shapes,
    coordinators: &[u16],
) -> Result<Vec<Decided>, VerbsError> {
    let mut decided = vec![Decided::Nothing; coordinators.len()];
    let len = store.log_region_bytes() as u32;
    // MN `m` is alive iff it is among the live replicas of partition `m`.
    let live: Vec<u16> = (0..store.config().mns)
        .filter(|&m| store.live_replicas(m).contains(&m))
        .collect();
    // 1. Every log region on every live MN.
    let mut list = PostList::new();
    let mut reads = Vec::new();
    for (i, &id) in coordinators.iter().enumerate() {
        let Ok(at) = store.log_offset(id) else {
            continue;
        };
        for &m in &live {
            reads.push((i, list.read(store.addr(m, at), len)));
        }
    }
    if reads.is_empty() {
        return Ok(decided);
    }
    let res = ctx.post(list).await?;
    let mut logs: Vec<Option<(u64, Vec<LogEntry>)>> = vec![None; coordinators.len()];
    for (i, wr) in reads {
        if let Some((w, e)) = parse_log(res.bytes(wr)) {
            let seq = |w: u64| unpack_writer(w).map_or(0, |t| t.seq);
            if logs[i].as_ref().is_none_or(|(old, _)| seq(w) > seq(*old)) {
                logs[i] = Some((w, e));
            }
        }
    }
    // 2. Every logged cell and its image on every live replica.
    let mut list = PostList::new();
    let mut probes = Vec::new();
    for (i, log) in logs.iter().enumerate() {
        let Some((_, entries)) = log else { continue };
        for e in entries {
            let Ok(shape) = shapes.get(e.table) else {
                continue;
            };
            let cell = usize::from(e.cell);
            if cell >= shape.cells {
                continue;
            }
            for mn in store.live_replicas(e.partition) {
                let cell_at = e.offset + shape.cell_offset(cell) as u64;
                let c = list.read(store.addr(mn, cell_at), 32);
                let img = list.read(
                    store.addr(mn, e.offset + shape.image_offset(cell) as u64),
                    shape.image_len() as u32,
                );
                probes.push((i, mn, cell_at, shape, c, img));
            }
        }
    }
    if probes.is_empty() {
        return Ok(decided);
    }
    let res = ctx.post(list).await?;
    let mut ours: Vec<Vec<Found>> = vec![Vec::new(); coordinators.len()];
    for (i, mn, at, shape, c, img) in probes {
        let Some((writer, _)) = &logs[i] else {
            continue;
        };
        let Ok(cell) = <CvtCell as zerocopy::TryFromBytes>::try_read_from_bytes(res.bytes(c))
        else {
            continue;
        };
        if !cell.is_valid() || !cell.is_consistent() {
            continue;
        }
        // The image must be this transaction's: a stale log names cells reused since.
        if mvcc::decode_image(shape, &cell, res.bytes(img)).is_some_and(|p| p.writer == *writer) {
            ours[i].push(Found { mn, at, cell });
        }
    }
    // 3. Every decision.
    let mut list = PostList::new();
    for (i, found) in ours.iter().enumerate() {
        let Some(txn) = logs[i].as_ref().and_then(|(w, _)| unpack_writer(*w)) else {
            continue;
        };
        if found.is_empty() {
            continue;
        }
        let visible = found
            .iter()
            .map(|f| f.cell.commit_version())
            .find(|&v| v != INVISIBLE);
        let pending: Vec<&Found> = found
            .iter()
            .filter(|f| f.cell.commit_version() == INVISIBLE)
            .collect();
        decided[i] = match visible {
            Some(version) => {
                for f in &pending {
                    list.write(
                        store.addr(f.mn, f.at + CvtCell::VERSION_OFFSET as u64),
                        &version.to_le_bytes(),
                    );
                }
                Decided::RolledForward {
                    txn,
                    version,
                    cells: pending.len(),
                }
            }
            None => {
                for f in &pending {
                    let free = free_with_cv(f.cell.head_cv());
                    list.write(store.addr(f.mn, f.at), free.as_bytes());
                }
                Decided::RolledBack {
                    txn,
                    cells: pending.len(),
                }
            }
        };
    }
    if !list.is_empty() {
        ctx.post(list).await?;
    }
    Ok(decided)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_round_trip_and_torn_logs() {
        let e = [
            LogEntry {
                table: TableId(3),
                partition: 2,
                cell: 1,
                offset: 0x1_0000,
            },
            LogEntry {
                table: TableId(0),
                partition: 0,
                cell: 0,
                offset: 64,
            },
        ];
        let b = encode_log(0xABCD, &e);
        assert_eq!(b.len(), log_len(2));
        let mut region = vec![0u8; 256];
        region[..b.len()].copy_from_slice(&b);
        assert_eq!(parse_log(&region), Some((0xABCD, e.to_vec())));
        // The trailer did not land: torn.
        region[b.len() - 1] ^= 1;
        assert_eq!(parse_log(&region), None);
        assert_eq!(parse_log(&[0u8; 64]), None);
        assert_eq!(parse_log(&b[..20]), None);
    }
}
