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
use dmem_motor::mvcc::{self, BlockShape, Shapes, unpack_writer};
use dmem_store::Store;
use dmem_txn::{TableId, TxnId};
use dmem_verbs::{PostList, Verbs, VerbsError, WrId};
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

/// A READ of one logged cell and its image on one replica (step 2).
#[derive(Debug, Clone, Copy)]
struct Probe {
    /// The coordinator's index.
    i: usize,
    mn: u16,
    /// The cell's offset.
    at: u64,
    shape: BlockShape,
    cell: WrId,
    image: WrId,
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
    // 1. Every log region on every live MN.
    let (list, reads) = log_reads(store, coordinators);
    if reads.is_empty() {
        return Ok(decided);
    }
    let res = ctx.post(list).await?;
    let copies = reads.iter().map(|&(i, wr)| (i, res.bytes(wr)));
    let logs = newest_logs(coordinators.len(), copies);
    // 2. Every logged cell and its image on every live replica.
    let (list, probes) = probe_reads(store, shapes, &logs);
    if probes.is_empty() {
        return Ok(decided);
    }
    let res = ctx.post(list).await?;
    let mut ours: Vec<Vec<Found>> = vec![Vec::new(); coordinators.len()];
    for p in probes {
        let Some((writer, _)) = &logs[p.i] else {
            continue;
        };
        if let Some(cell) = ours_on(*writer, p.shape, res.bytes(p.cell), res.bytes(p.image)) {
            ours[p.i].push(Found {
                mn: p.mn,
                at: p.at,
                cell,
            });
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
        let (decision, writes) = decide(txn, found);
        for (mn, at, bytes) in writes {
            list.write(store.addr(mn, at), &bytes);
        }
        decided[i] = decision;
    }
    if !list.is_empty() {
        ctx.post(list).await?;
    }
    Ok(decided)
}

/// Step 1's READs: every log region of `coordinators` (by index) on every live MN (MN `m`
/// is alive iff it is among the live replicas of partition `m`).
fn log_reads(store: &Store, coordinators: &[u16]) -> (PostList, Vec<(usize, WrId)>) {
    let len = store.log_region_bytes() as u32;
    let live: Vec<u16> = (0..store.config().mns)
        .filter(|&m| store.live_replicas(m).contains(&m))
        .collect();
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
    (list, reads)
}

/// The newest whole log (highest transaction sequence number) of each of `n` coordinators
/// among the log `copies` read (coordinator index, bytes).
fn newest_logs<'a>(
    n: usize,
    copies: impl IntoIterator<Item = (usize, &'a [u8])>,
) -> Vec<Option<(u64, Vec<LogEntry>)>> {
    let mut logs: Vec<Option<(u64, Vec<LogEntry>)>> = vec![None; n];
    let seq = |w: u64| unpack_writer(w).map_or(0, |t| t.seq);
    for (i, bytes) in copies {
        if let Some((w, e)) = parse_log(bytes)
            && logs[i].as_ref().is_none_or(|(old, _)| seq(w) > seq(*old))
        {
            logs[i] = Some((w, e));
        }
    }
    logs
}

/// Step 2's READs: each logged cell (of a known table, within its shape) and its image on
/// every live replica of its record.
fn probe_reads(
    store: &Store,
    shapes: &Shapes,
    logs: &[Option<(u64, Vec<LogEntry>)>],
) -> (PostList, Vec<Probe>) {
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
                let at = e.offset + shape.cell_offset(cell) as u64;
                let c = list.read(store.addr(mn, at), 32);
                let image = list.read(
                    store.addr(mn, e.offset + shape.image_offset(cell) as u64),
                    shape.image_len() as u32,
                );
                probes.push(Probe {
                    i,
                    mn,
                    at,
                    shape,
                    cell: c,
                    image,
                });
            }
        }
    }
    (list, probes)
}

/// The cell read as `cell`, if it is `writer`'s: valid, read whole, and its image names
/// `writer` (a stale log names cells reused since).
fn ours_on(writer: u64, shape: BlockShape, cell: &[u8], image: &[u8]) -> Option<CvtCell> {
    let cell = <CvtCell as zerocopy::TryFromBytes>::try_read_from_bytes(cell).ok()?;
    if !cell.is_valid() || !cell.is_consistent() {
        return None;
    }
    mvcc::decode_image(shape, &cell, image)
        .is_some_and(|p| p.writer == writer)
        .then_some(cell)
}

/// The decision for `txn` from its cells `found` (module docs), and the WRITEs
/// `(mn, offset, bytes)` that carry it out: with one cell visible, the commit version
/// into every INVISIBLE one; with none, every INVISIBLE cell freed (keeping its CV).
fn decide(txn: TxnId, found: &[Found]) -> (Decided, Vec<(u16, u64, Vec<u8>)>) {
    let visible = found
        .iter()
        .map(|f| f.cell.commit_version())
        .find(|&v| v != INVISIBLE);
    let pending: Vec<&Found> = found
        .iter()
        .filter(|f| f.cell.commit_version() == INVISIBLE)
        .collect();
    let cells = pending.len();
    match visible {
        Some(version) => {
            let writes = pending
                .iter()
                .map(|f| {
                    let at = f.at + CvtCell::VERSION_OFFSET as u64;
                    (f.mn, at, version.to_le_bytes().to_vec())
                })
                .collect();
            let d = Decided::RolledForward {
                txn,
                version,
                cells,
            };
            (d, writes)
        }
        None => {
            let writes = pending
                .iter()
                .map(|f| {
                    let free = free_with_cv(f.cell.head_cv());
                    (f.mn, f.at, free.as_bytes().to_vec())
                })
                .collect();
            (Decided::RolledBack { txn, cells }, writes)
        }
    }
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

    fn writer(seq: u64) -> u64 {
        mvcc::pack_writer(TxnId {
            coordinator: dmem_txn::CoordinatorId(1),
            seq,
        })
    }

    #[test]
    fn the_newest_whole_log_of_each_coordinator_is_taken() {
        let e = [LogEntry {
            table: TableId(1),
            partition: 0,
            cell: 0,
            offset: 64,
        }];
        let (old, new) = (encode_log(writer(3), &e), encode_log(writer(5), &e));
        let mut torn = encode_log(writer(9), &e);
        let last = torn.len() - 1;
        torn[last] ^= 1;
        let copies = [
            (0, new.as_slice()),
            (0, old.as_slice()),
            (0, torn.as_slice()),
            (1, old.as_slice()),
        ];
        let logs = newest_logs(3, copies);
        assert_eq!(logs[0], Some((writer(5), e.to_vec())));
        assert_eq!(logs[1], Some((writer(3), e.to_vec())));
        assert_eq!(logs[2], None);
    }

    #[test]
    fn one_visible_cell_rolls_forward_none_rolls_back() {
        let txn = unpack_writer(writer(4)).unwrap();
        let found = |mn: u16, at: u64, version: u64| Found {
            mn,
            at,
            cell: CvtCell::new(3, 0x400, version),
        };
        let forward = [
            found(0, 128, INVISIBLE),
            found(1, 128, 77),
            found(2, 256, INVISIBLE),
        ];
        let (d, writes) = decide(txn, &forward);
        assert_eq!(
            d,
            Decided::RolledForward {
                txn,
                version: 77,
                cells: 2
            }
        );
        let at = |o: u64| o + CvtCell::VERSION_OFFSET as u64;
        assert_eq!(
            writes,
            vec![
                (0, at(128), 77u64.to_le_bytes().to_vec()),
                (2, at(256), 77u64.to_le_bytes().to_vec()),
            ]
        );
        let back = [found(0, 128, INVISIBLE), found(1, 128, INVISIBLE)];
        let (d, writes) = decide(txn, &back);
        assert_eq!(d, Decided::RolledBack { txn, cells: 2 });
        let free = free_with_cv(3);
        assert_eq!(writes.len(), 2);
        assert_eq!(writes[1], (1, 128, free.as_bytes().to_vec()));
        assert!(!free.is_valid());
    }

    #[test]
    fn a_free_or_torn_cell_is_nobodys() {
        let shape = BlockShape::new(2, 8);
        let image = vec![0u8; shape.image_len()];
        assert!(ours_on(writer(1), shape, CvtCell::FREE.as_bytes(), &image).is_none());
        assert!(ours_on(writer(1), shape, &[0xFF; 8], &image).is_none());
    }
}
