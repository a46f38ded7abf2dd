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

use dmem_layout::bytes::{ByteReader, ByteSink, BytesError};
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

/// A coordinator's commit log (LOTUS §6), written to its log region before the data:
/// `writer u64 | count u32 | pad u32 | count × (table u32, partition u16, cell u16,
/// offset u64) | writer u64`, little-endian. The closing writer tells a whole log from a
/// torn one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitLog {
    /// The packed writer (transaction id) of the log, 0 for none.
    pub writer: u64,
    /// The new versions it names.
    pub entries: Vec<LogEntry>,
}

/// Why a log region holds no whole commit log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadLog {
    /// Writer 0 or no entries: no log was written.
    #[error("no commit log")]
    Empty,
    /// The region ends inside the log.
    #[error("commit log truncated")]
    Truncated,
    /// The closing writer does not match the opening one: the log was torn.
    #[error("torn commit log")]
    Torn,
}

impl CommitLog {
    /// The log's bytes.
    #[must_use]
    pub fn emit(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(log_len(self.entries.len()));
        b.put_u64(self.writer);
        b.put_u32(self.entries.len() as u32);
        b.put_zeros(4);
        for e in &self.entries {
            b.put_u32(e.table.0);
            b.put_u16(e.partition);
            b.put_u16(e.cell);
            b.put_u64(e.offset);
        }
        b.put_u64(self.writer);
        b
    }

    /// The whole log a log region starts with (the rest of the region is ignored).
    ///
    /// # Errors
    /// [`BadLog`] for an empty, truncated or torn log.
    pub fn parse(b: &[u8]) -> Result<Self, BadLog> {
        let mut r = ByteReader::new(b);
        let short = |_| BadLog::Truncated;
        let writer = r.u64().map_err(short)?;
        if writer == 0 {
            return Err(BadLog::Empty);
        }
        let n = r.u32().map_err(short)? as usize;
        if n == 0 {
            return Err(BadLog::Empty);
        }
        if log_len(n) > b.len() {
            return Err(BadLog::Truncated);
        }
        r.u32().map_err(short)?; // pad
        let entries = (0..n)
            .map(|_| {
                Ok(LogEntry {
                    table: TableId(r.u32()?),
                    partition: r.u16()?,
                    cell: r.u16()?,
                    offset: r.u64()?,
                })
            })
            .collect::<Result<Vec<_>, BytesError>>()
            .map_err(short)?;
        if r.u64().map_err(short)? != writer {
            return Err(BadLog::Torn);
        }
        Ok(Self { writer, entries })
    }
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
        if let Ok(log) = CommitLog::parse(bytes)
            && logs[i]
                .as_ref()
                .is_none_or(|(old, _)| seq(log.writer) > seq(*old))
        {
            logs[i] = Some((log.writer, log.entries));
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
        let log = CommitLog {
            writer: 0xABCD,
            entries: e.to_vec(),
        };
        let b = log.emit();
        assert_eq!(b.len(), log_len(2));
        assert_eq!(CommitLog::parse(&b), Ok(log.clone()));
        let mut region = vec![0u8; 256];
        region[..b.len()].copy_from_slice(&b);
        assert_eq!(CommitLog::parse(&region), Ok(log));
        // The trailer did not land: torn.
        region[b.len() - 1] ^= 1;
        assert_eq!(CommitLog::parse(&region), Err(BadLog::Torn));
        assert_eq!(CommitLog::parse(&[0u8; 64]), Err(BadLog::Empty));
        assert_eq!(CommitLog::parse(&b[..20]), Err(BadLog::Truncated));
        for n in 0..b.len() {
            assert!(CommitLog::parse(&b[..n]).is_err(), "cut at {n}");
        }
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
        let log = |seq: u64| {
            CommitLog {
                writer: writer(seq),
                entries: e.to_vec(),
            }
            .emit()
        };
        let (old, new) = (log(3), log(5));
        let mut torn = log(9);
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
