//! Where OOCC's records, redo logs and lease words live on the MNs.
//!
//! Every MN has the same layout:
//!
//! ```text
//! 0                     lease area: per coordinator one 64-byte line
//!                       (lease word, statistics words; §VII-A)
//! lease_area            redo-log area: one region per coordinator (Pandora §3.2.2 size)
//! lease_area + logs     records, OoccRecord layout (lock word at the highest address)
//! ```
//!
//! A record lives on one MN (`mix64(table, key) % mns`; OOCC's evaluation does not
//! replicate, §VIII-A). Its slot is found through a [`Directory`]: every CN starts with the
//! address of every loaded record, as after scanning the index once (the `warm_cache`
//! FORD runs are compared with), and a key inserted by a transaction gets its slot there
//! once, so that all CNs agree on it. The directory is the sim's stand-in for an index; a
//! lookup costs no round trip (FORD's warm address cache costs none either). A zeroed slot
//! is an absent record with version 0 and a free lock.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use dmem_deploy::{DeployError, DeploySpec};
use dmem_layout::record::{ItemFlags, OoccLockWord, OoccRecordHeader};
use dmem_store::mix64;
use dmem_txn::{Key, TableId};
use dmem_verbs::{MemoryRegion, RemoteAddr};

/// Bytes of one coordinator's redo-log region.
pub const LOG_REGION_BYTES: u64 = 32 * 1024;
/// Bytes of one coordinator's lease line.
pub const LEASE_LINE: u64 = 64;

/// A record's place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Loc {
    /// MN index.
    pub mn: u16,
    /// Offset of the record in the MN's region.
    pub offset: u64,
}

/// The layout of every MN for a [`DeploySpec`].
#[derive(Debug, Clone)]
pub struct Layout {
    /// Value length per table.
    pub tables: HashMap<TableId, usize>,
    /// Coordinators with a lease line and a log region.
    pub coordinators: u16,
    /// MNs.
    pub mns: u16,
    /// Where records start.
    pub records_base: u64,
    /// Bytes per MN.
    pub bytes_per_mn: u64,
}

impl Layout {
    /// The layout of `spec` on `mns` MNs.
    ///
    /// # Errors
    /// A spec without coordinators or MNs.
    pub fn new(spec: &DeploySpec, mns: u16) -> Result<Self, DeployError> {
        if mns == 0 {
            return Err(DeployError::Protocol {
                protocol: "oocc".into(),
                reason: "no memory node".into(),
            });
        }
        // Coordinator ids go up to `coordinators`; recovery and final coordinators use a
        // few ids past it.
        let coordinators = spec.coordinators.saturating_add(8);
        let records_base = u64::from(coordinators) * (LEASE_LINE + LOG_REGION_BYTES);
        // Growing tables have room for the inserts the run may make (`DeploySpec::insert_room`,
        // sized from the run's length by the harness), or the default room.
        let mut record_bytes = 0u64;
        for t in &spec.tables {
            let bytes = spec
                .records_with_room(t)
                .and_then(|r| r.checked_mul(OoccRecordHeader::record_len(t.value_len) as u64))
                .and_then(|b| record_bytes.checked_add(b));
            record_bytes = bytes.ok_or_else(|| DeployError::Protocol {
                protocol: "oocc".into(),
                reason: format!(
                    "the records of table {} with room for the run's inserts exceed 2^64 bytes: shorten the run",
                    t.id.0
                ),
            })?;
        }
        // Placement by hash: a quarter more than an even share, plus a margin.
        let bytes_per_mn = (record_bytes / u64::from(mns))
            .checked_mul(5)
            .and_then(|b| (b / 4 + (1 << 16)).checked_add(records_base))
            .ok_or_else(|| DeployError::Protocol {
                protocol: "oocc".into(),
                reason: "the records exceed 2^64 bytes per memory node: shorten the run".into(),
            })?;
        Ok(Self {
            tables: spec.tables.iter().map(|t| (t.id, t.value_len)).collect(),
            coordinators,
            mns,
            records_base,
            bytes_per_mn,
        })
    }

    /// Offset of coordinator `id`'s lease line.
    #[must_use]
    pub fn lease_offset(&self, id: u16) -> u64 {
        u64::from(id) * LEASE_LINE
    }

    /// Offset of coordinator `id`'s redo-log region (on MN `id % mns`).
    #[must_use]
    pub fn log_offset(&self, id: u16) -> u64 {
        u64::from(self.coordinators) * LEASE_LINE + u64::from(id) * LOG_REGION_BYTES
    }

    /// The MN holding coordinator `id`'s redo log.
    #[must_use]
    pub fn log_mn(&self, id: u16) -> u16 {
        id % self.mns
    }
}

/// The slots a directory gave (a loader's placement) and where each MN's free record space
/// began then: read-only, so the directories of one CN process's cores share one
/// ([`Directory::placed`]) instead of each loading the records again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    slots: HashMap<(TableId, Key), Loc>,
    next: Vec<u64>,
}

/// The shared record directory (see the module docs).
#[derive(Debug)]
pub struct Directory {
    layout: Layout,
    regions: Vec<MemoryRegion>,
    /// Slots placed by another directory's loader, taken as given.
    base: Option<Arc<Placed>>,
    /// Slots this directory gave.
    slots: RefCell<HashMap<(TableId, Key), Loc>>,
    next: RefCell<Vec<u64>>,
}

impl Directory {
    /// An empty directory over `regions` (one per MN).
    #[must_use]
    pub fn new(layout: Layout, regions: Vec<MemoryRegion>) -> Self {
        let next = vec![layout.records_base; regions.len()];
        Self {
            layout,
            regions,
            base: None,
            slots: RefCell::new(HashMap::new()),
            next: RefCell::new(next),
        }
    }

    /// A directory over `regions` whose records are where `placed` says (another
    /// directory's [`placement`](Self::placement) with the same layout and regions); later
    /// slots come after them.
    ///
    /// # Errors
    /// `placed` has another number of MNs than `regions`.
    pub fn placed(
        layout: Layout,
        regions: Vec<MemoryRegion>,
        placed: Arc<Placed>,
    ) -> Result<Self, String> {
        if placed.next.len() != regions.len() {
            return Err(format!(
                "a placement over {} MNs for a directory over {}",
                placed.next.len(),
                regions.len()
            ));
        }
        let next = placed.next.clone();
        Ok(Self {
            layout,
            regions,
            base: Some(placed),
            slots: RefCell::new(HashMap::new()),
            next: RefCell::new(next),
        })
    }

    /// The slots given so far (those it was placed with included) and the free space.
    #[must_use]
    pub fn placement(&self) -> Placed {
        let mut slots = self
            .base
            .as_ref()
            .map_or_else(HashMap::new, |b| b.slots.clone());
        slots.extend(self.slots.borrow().iter().map(|(k, v)| (*k, *v)));
        Placed {
            slots,
            next: self.next.borrow().clone(),
        }
    }

    /// The layout.
    #[must_use]
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Value length of `table`.
    ///
    /// # Errors
    /// An unknown table.
    pub fn value_len(&self, table: TableId) -> Result<usize, dmem_txn::TxnError> {
        self.layout
            .tables
            .get(&table)
            .copied()
            .ok_or(dmem_txn::TxnError::UnknownTable(table.0))
    }

    /// The slot of `(table, key)`, given one on first use.
    ///
    /// # Errors
    /// An unknown table, or an MN out of record space.
    pub fn slot(&self, table: TableId, key: Key) -> Result<Loc, dmem_txn::TxnError> {
        if let Some(l) = self.get(table, key) {
            return Ok(l);
        }
        let len = OoccRecordHeader::record_len(self.value_len(table)?) as u64;
        let mn = (mix64(u64::from(table.0) << 48 ^ key.0) % u64::from(self.layout.mns)) as u16;
        let mut next = self.next.borrow_mut();
        let at = next[usize::from(mn)];
        if at + len > self.layout.bytes_per_mn {
            // Not retryable: the run outgrew the insert room it was sized for.
            return Err(dmem_txn::TxnError::OutOfRoom(
                "memory node out of record space (insert room sized for a shorter run)",
            ));
        }
        next[usize::from(mn)] = at + len;
        let loc = Loc { mn, offset: at };
        self.slots.borrow_mut().insert((table, key), loc);
        Ok(loc)
    }

    /// The slot of `(table, key)` if it has one.
    #[must_use]
    pub fn get(&self, table: TableId, key: Key) -> Option<Loc> {
        let own = self.slots.borrow().get(&(table, key)).copied();
        own.or_else(|| self.base.as_ref()?.slots.get(&(table, key)).copied())
    }

    /// The remote address of `offset` in MN `mn`.
    #[must_use]
    pub fn addr(&self, mn: u16, offset: u64) -> RemoteAddr {
        let r = self.regions[usize::from(mn)];
        RemoteAddr {
            node: r.node,
            rkey: r.rkey,
            offset,
        }
    }

    /// The node of MN `mn`.
    #[must_use]
    pub fn node(&self, mn: u16) -> dmem_verbs::NodeId {
        self.regions[usize::from(mn)].node
    }

    /// Every slot, for recovery and checks.
    #[must_use]
    pub fn all(&self) -> Vec<((TableId, Key), Loc)> {
        self.placement().slots.into_iter().collect()
    }
}

/// A record image as read: presence, value, lock word (see [`dmem_layout::record::OoccRecord`];
/// the header's value length is not trusted, the table's is used).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// Whether the record is present.
    pub present: bool,
    /// Its value.
    pub value: Vec<u8>,
    /// Its lock word.
    pub lock: OoccLockWord,
}

/// Parses a record image of a `value_len`-byte table.
#[must_use]
pub fn parse(bytes: &[u8], value_len: usize) -> Image {
    let flags = u16::from_le_bytes([bytes[14], bytes[15]]);
    let at = OoccRecordHeader::lock_offset(value_len);
    let lock = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0xFF; 8]));
    Image {
        present: ItemFlags::from_raw(flags).is_ok_and(ItemFlags::is_valid),
        value: bytes[OoccRecordHeader::LEN..OoccRecordHeader::LEN + value_len].to_vec(),
        lock: OoccLockWord::from_raw(lock),
    }
}

/// A whole record image: header, value (zeros when absent), `lock`.
#[must_use]
pub fn emit(
    table: TableId,
    key: Key,
    value: Option<&[u8]>,
    value_len: usize,
    lock: OoccLockWord,
) -> Vec<u8> {
    let mut buf = vec![0u8; OoccRecordHeader::record_len(value_len)];
    buf[0..8].copy_from_slice(&key.0.to_le_bytes());
    buf[8..12].copy_from_slice(&table.0.to_le_bytes());
    buf[12..14].copy_from_slice(&(value_len as u16).to_le_bytes());
    let flags = if value.is_some() {
        ItemFlags::LOADED
    } else {
        ItemFlags::EMPTY
    };
    buf[14..16].copy_from_slice(&flags.to_raw().to_le_bytes());
    if let Some(v) = value {
        buf[OoccRecordHeader::LEN..OoccRecordHeader::LEN + v.len()].copy_from_slice(v);
    }
    let at = OoccRecordHeader::lock_offset(value_len);
    buf[at..at + 8].copy_from_slice(&lock.to_raw().to_le_bytes());
    buf
}

#[cfg(test)]
mod tests {
    use dmem_deploy::TableDemand;
    use dmem_verbs::{NodeId, RKey};

    use super::*;

    /// One loaded table and one growing table of 100-byte values.
    fn spec(insert_room: Option<u64>) -> DeploySpec {
        let table = |id, grows| TableDemand {
            id: TableId(id),
            value_len: 100,
            expected_records: 1_000,
            grows,
        };
        let mut spec = DeploySpec::new(vec![table(0, false), table(1, true)], 4);
        if let Some(n) = insert_room {
            spec.insert_room = vec![(TableId(1), n), (TableId(0), 1 << 40)];
        }
        spec
    }

    fn directory(layout: Layout) -> Directory {
        let regions = (0..layout.mns)
            .map(|m| MemoryRegion {
                node: NodeId(m),
                rkey: RKey(1),
                len: layout.bytes_per_mn,
            })
            .collect();
        Directory::new(layout, regions)
    }

    #[test]
    fn a_growing_table_has_room_for_the_runs_inserts_only() {
        let record = OoccRecordHeader::record_len(100) as u64;
        let default = Layout::new(&spec(None), 1).unwrap().bytes_per_mn;
        let short = Layout::new(&spec(Some(10)), 1).unwrap().bytes_per_mn;
        let long = Layout::new(&spec(Some(100_000)), 1).unwrap().bytes_per_mn;
        // The default room is as many inserts again plus 4096; a short run needs far less,
        // a long one more. A table that does not grow ignores a room given for it.
        assert!(short < default, "{short} < {default}");
        assert!(long > default, "{long} > {default}");
        let grown = (100_000 - 10) * record;
        assert!(
            (grown..=grown * 5 / 4 + 1).contains(&(long - short)),
            "{}",
            long - short
        );
    }

    #[test]
    fn a_run_past_its_room_is_refused_not_retried() {
        let dir = directory(Layout::new(&spec(Some(10)), 1).unwrap());
        let mut inserted = 0u64;
        let error = loop {
            match dir.slot(TableId(1), Key(1_000 + inserted)) {
                Ok(_) => inserted += 1,
                Err(e) => break e,
            }
            assert!(inserted < 100_000, "the room never ran out");
        };
        // Loaded keys are not placed here: the whole region is the growing table's.
        assert!(inserted >= 10, "{inserted}");
        assert!(matches!(error, dmem_txn::TxnError::OutOfRoom(_)), "{error}");
        assert!(!error.is_retryable());
    }

    #[test]
    fn a_room_past_2_pow_64_bytes_is_a_typed_refusal() {
        let error = Layout::new(&spec(Some(u64::MAX / 2)), 1).unwrap_err();
        assert!(
            matches!(&error, DeployError::Protocol { reason, .. } if reason.contains("shorten the run")),
            "{error}"
        );
    }
}
