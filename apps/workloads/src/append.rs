//! List append (Elle's workload, Kingsbury & Alvaro VLDB 2020): transactions read lists and
//! append unique elements to them, so that the values they observe alone reveal the order
//! of every key's writes ([`dmem_txn::check_append`]).
//!
//! One table of `keys` records, each a bounded list, loaded empty. Keys are drawn uniformly
//! from a small set (tiny: 512, other presets: 1024) so that transactions conflict often.
//!
//! * `ListRead` (read-only, 25 %): reads 1–4 distinct keys in one round.
//! * `ListAppend` (read-write, 75 %): 1–4 distinct keys in one round, each read (read-only) or
//!   appended to with even odds; an append reads the list for update and writes it back with
//!   one more element. A list already full makes the transaction roll itself back
//!   ([`LIST_FULL`]): a list is never truncated.
//!
//! # Elements
//!
//! Element `seq << 16 | coordinator`, with `seq` counting the coordinator's append attempts
//! from 1: unique in a run (every attempt, retries included, appends fresh elements), never
//! 0, and it names the coordinator that appended it.
//!
//! # Record layout
//!
//! ```text
//! 0       4       8                                   8 + 8·CAPACITY = 1024
//! +-------+-------+-----------------------------------+
//! | len   | magic | element[0] … element[len-1], 0 …  |
//! +-------+-------+-----------------------------------+
//! ```
//!
//! `len` (u32 LE) ≤ [`CAPACITY`] = 127, `magic` (u32 LE) [`MAGIC`], then `len` elements
//! (u64 LE, oldest first, none 0) and zeros. [`ListValue::parse`] checks all of it: a
//! malformed record is an error, never a panic.
//!
//! # The bound
//!
//! 127 elements per key (a 1 KiB record): a 5 ms tiny run commits up to ~19k transactions
//! (DSLR), about 27k appends over 512 keys, 53 a key on average, so lists rarely fill and
//! the runs of every protocol roll nothing back. An append to a full list rolls its
//! transaction back (reason [`LIST_FULL`], counted as a roll-back): a list is never
//! truncated, so the order the checker infers is never cut, and a full key stays readable.
//! Longer runs want more keys (`dmem bench --mix keys=N`); the roll-back count says when.
//!
//! # Recording
//!
//! What each attempt observed (the lists it read, the lists it wrote) is recorded by the
//! runner around the protocol's transaction (`dmem-harness`) into this workload's
//! [`AppendLog`], decoded here ([`micro_ops`]); the protocol's own history plays no part.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use dmem_layout::bytes::{ByteReader, ByteSink};
use dmem_txn::{AppendTxn, Key, MicroOp, TableId, Transaction, TxnError, TxnKind};

use crate::dist::{KeyChooser, KeyDistribution, Mix, WorkloadRng, rng_for};
use crate::invariants::Violation;
use crate::record::{rd, round, upd};
use crate::{Outcome, Scale, TableSpec, TxnGenerator, TxnInfo, TxnType, Workload};

/// The single table.
pub const TABLE: TableId = TableId(0);
const TABLE_NAME: &str = "lists";
/// Elements a record holds at most.
pub const CAPACITY: usize = 127;
/// The record's value size.
pub const VALUE_SIZE: usize = 8 + 8 * CAPACITY;
/// The record's tag ("LIST", little endian).
pub const MAGIC: u32 = u32::from_le_bytes(*b"LIST");
/// The roll-back reason of an append to a full list.
pub const LIST_FULL: &str = "list full";
/// The roll-back reason of a malformed record read.
pub const MALFORMED: &str = "malformed list record";

/// Why a record is not a list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListError {
    /// Wrong size.
    #[error("{0} bytes instead of {VALUE_SIZE}")]
    Size(usize),
    /// Wrong tag.
    #[error("tag {0:#010x} instead of {MAGIC:#010x}")]
    Magic(u32),
    /// A length beyond the capacity.
    #[error("length {0} beyond the capacity {CAPACITY}")]
    Length(u32),
    /// Element 0 (never appended) inside the list.
    #[error("element 0 at position {0}")]
    Zero(usize),
    /// A non-zero byte after the list.
    #[error("non-zero byte {0} after the list")]
    Tail(usize),
    /// The record is absent (lists are loaded and never deleted).
    #[error("absent")]
    Absent,
}

/// A list record's value (the record layout in the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListValue {
    /// The elements, oldest first.
    pub elements: Vec<u64>,
}

impl ListValue {
    /// Parses a record (checked: see the module docs).
    ///
    /// # Errors
    /// A [`ListError`] saying what is wrong.
    pub fn parse(bytes: &[u8]) -> Result<Self, ListError> {
        if bytes.len() != VALUE_SIZE {
            return Err(ListError::Size(bytes.len()));
        }
        let mut r = ByteReader::new(bytes);
        let size = |_| ListError::Size(bytes.len());
        let len = r.u32().map_err(size)?;
        let magic = r.u32().map_err(size)?;
        if magic != MAGIC {
            return Err(ListError::Magic(magic));
        }
        if len as usize > CAPACITY {
            return Err(ListError::Length(len));
        }
        let len = len as usize;
        let mut elements = Vec::with_capacity(len);
        for i in 0..len {
            let e = r.u64().map_err(size)?;
            if e == 0 {
                return Err(ListError::Zero(i));
            }
            elements.push(e);
        }
        match r.rest().iter().position(|&b| b != 0) {
            Some(p) => Err(ListError::Tail(8 + 8 * len + p)),
            None => Ok(Self { elements }),
        }
    }

    /// The record's bytes.
    ///
    /// # Panics
    /// If it holds more than [`CAPACITY`] elements.
    #[must_use]
    pub fn emit(&self) -> Vec<u8> {
        assert!(
            self.elements.len() <= CAPACITY,
            "a list beyond the capacity"
        );
        let mut v = Vec::with_capacity(VALUE_SIZE);
        v.put_u32(self.elements.len() as u32);
        v.put_u32(MAGIC);
        for &e in &self.elements {
            v.put_u64(e);
        }
        v.put_zeros(VALUE_SIZE - v.len());
        v
    }
}

/// One access an attempt made, as the runner saw it through the transaction API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// A read (read-only or for update) and the value it returned.
    Read {
        /// Key.
        key: u64,
        /// Value (`None`: absent).
        value: Option<Vec<u8>>,
    },
    /// A write and the value written.
    Write {
        /// Key.
        key: u64,
        /// Value.
        value: Vec<u8>,
    },
}

/// An attempt's accesses as micro-ops: a read is `Read(key, list)`, a write of a list is
/// `Append(key, its last element)`.
///
/// # Errors
/// The first malformed record, with its key.
pub fn micro_ops(observed: &[Observed]) -> Result<Vec<MicroOp>, (u64, ListError)> {
    observed
        .iter()
        .map(|o| match o {
            Observed::Read { key, value } => read_op(*key, value.as_deref()),
            Observed::Write { key, value } => write_op(*key, value),
        })
        .collect()
}

/// A read of `key` that returned `value`, as a micro-op.
///
/// # Errors
/// A malformed or absent record, with its key.
pub fn read_op(key: u64, value: Option<&[u8]>) -> Result<MicroOp, (u64, ListError)> {
    let bytes = value.ok_or((key, ListError::Absent))?;
    let list = ListValue::parse(bytes).map_err(|e| (key, e))?.elements;
    Ok(MicroOp::Read { key, list })
}

/// A write of `value` to `key`, as a micro-op: the append of its last element.
///
/// # Errors
/// A malformed record or an empty list, with its key.
pub fn write_op(key: u64, value: &[u8]) -> Result<MicroOp, (u64, ListError)> {
    let list = ListValue::parse(value).map_err(|e| (key, e))?.elements;
    let element = *list.last().ok_or((key, ListError::Length(0)))?;
    Ok(MicroOp::Append { key, element })
}

#[derive(Debug, Default)]
struct LogInner {
    txns: Vec<AppendTxn>,
    malformed: Vec<String>,
    closed: bool,
    /// Append attempts per coordinator (the elements' `seq`).
    seqs: BTreeMap<u32, u64>,
}

/// What the attempts of a run observed: the side log the append checker reads. Clones
/// share it.
#[derive(Debug, Clone, Default)]
pub struct AppendLog(Arc<Mutex<LogInner>>);

impl AppendLog {
    fn inner(&self) -> std::sync::MutexGuard<'_, LogInner> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records one attempt; a malformed record it observed is kept as text instead.
    pub fn record(&self, txn: AppendTxn, observed: &[Observed]) {
        self.record_ops(txn, micro_ops(observed));
    }

    /// Records one attempt whose accesses are already micro-ops (`txn.ops` is replaced),
    /// or the first malformed record it observed.
    pub fn record_ops(&self, mut txn: AppendTxn, ops: Result<Vec<MicroOp>, (u64, ListError)>) {
        let mut inner = self.inner();
        if inner.closed {
            return;
        }
        match ops {
            Ok(ops) => {
                txn.ops = ops;
                inner.txns.push(txn);
            }
            Err((key, e)) => {
                let line = format!(
                    "{} read or wrote a malformed list at key {key}: {e}",
                    txn.id
                );
                inner.malformed.push(line);
            }
        }
    }

    /// Stops recording (the run's checked window ended).
    pub fn close(&self) {
        self.inner().closed = true;
    }

    /// Whether it stopped recording.
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.inner().closed
    }

    /// Calls `f` with the attempts recorded so far and the malformed observations.
    pub fn with<R>(&self, f: impl FnOnce(&[AppendTxn], &[String]) -> R) -> R {
        let inner = self.inner();
        f(&inner.txns, &inner.malformed)
    }

    fn next_element(&self, coordinator: u32) -> u64 {
        let mut inner = self.inner();
        let seq = inner.seqs.entry(coordinator).or_insert(0);
        *seq += 1;
        (*seq << 16) | u64::from(coordinator)
    }
}

/// Parameters of the list-append workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendConfig {
    /// Keys (`0..keys`).
    pub keys: u64,
    /// Micro-ops per transaction at most (1..=this, distinct keys).
    pub max_ops: u32,
    /// Percentage of read-only transactions.
    pub read_only_percent: u32,
}

impl AppendConfig {
    /// The preset: tiny 512 keys, others 1024; up to 4 micro-ops; 25 % read-only.
    #[must_use]
    pub fn preset(scale: Scale) -> Self {
        Self {
            keys: if scale == Scale::Tiny { 512 } else { 1024 },
            max_ops: 4,
            read_only_percent: 25,
        }
    }
}

/// What a micro-op of a generated transaction does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read the key's list.
    Read,
    /// Append a fresh element to it.
    Append,
}

/// A generated list-append transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListTxn {
    /// The generating coordinator (its appends' elements carry it).
    pub coordinator: u32,
    /// Distinct keys and what to do with each.
    pub ops: Vec<(u64, Access)>,
}

impl TxnInfo for ListTxn {
    fn type_index(&self) -> usize {
        usize::from(self.kind() == TxnKind::ReadWrite)
    }
    fn kind(&self) -> TxnKind {
        if self.ops.iter().any(|(_, a)| *a == Access::Append) {
            TxnKind::ReadWrite
        } else {
            TxnKind::ReadOnly
        }
    }
    fn first_record(&self) -> Option<(TableId, Key)> {
        self.ops.first().map(|&(k, _)| (TABLE, Key(k)))
    }
}

/// The per-coordinator generator.
#[derive(Debug, Clone)]
pub struct ListGenerator {
    coordinator: u32,
    rng: WorkloadRng,
    keys: KeyChooser,
    mix: Mix,
    max_ops: u32,
}

impl TxnGenerator for ListGenerator {
    type Txn = ListTxn;

    fn next_txn(&mut self) -> ListTxn {
        use rand::RngExt as _;
        let read_only = self.mix.pick(&mut self.rng) == 0;
        let n = self.rng.random_range(1..=self.max_ops) as usize;
        let mut ops: Vec<(u64, Access)> = Vec::with_capacity(n);
        while ops.len() < n {
            let k = self.keys.next_key(&mut self.rng);
            if ops.iter().any(|&(x, _)| x == k) {
                continue;
            }
            let append = !read_only && self.rng.random_bool(0.5);
            ops.push((k, if append { Access::Append } else { Access::Read }));
        }
        if !read_only && ops.iter().all(|(_, a)| *a == Access::Read) {
            ops[0].1 = Access::Append;
        }
        ListTxn {
            coordinator: self.coordinator,
            ops,
        }
    }
}

/// The list-append workload.
#[derive(Debug, Clone)]
pub struct ListAppend {
    config: AppendConfig,
    types: [TxnType; 2],
    log: AppendLog,
}

impl ListAppend {
    /// A workload with this configuration and a fresh log.
    ///
    /// # Panics
    /// If `keys` is 0 or smaller than `max_ops`, `max_ops` is 0, or the percentage is
    /// beyond 100.
    #[must_use]
    pub fn new(config: AppendConfig) -> Self {
        assert!(config.max_ops >= 1 && u64::from(config.max_ops) <= config.keys);
        assert!(config.read_only_percent <= 100);
        let types = [
            TxnType {
                name: "ListRead",
                kind: TxnKind::ReadOnly,
                weight: config.read_only_percent,
            },
            TxnType {
                name: "ListAppend",
                kind: TxnKind::ReadWrite,
                weight: 100 - config.read_only_percent,
            },
        ];
        Self {
            config,
            types,
            log: AppendLog::default(),
        }
    }

    /// Its side log (shared by its clones).
    #[must_use]
    pub fn log(&self) -> &AppendLog {
        &self.log
    }

    /// The final state as one committed read of every key, by transaction `id` at `at`
    /// (after every recorded attempt ended), for the checker; a malformed record is
    /// reported in the log.
    pub fn final_reads(
        &self,
        read: impl Fn(TableId, Key) -> Option<Vec<u8>>,
        id: dmem_txn::TxnId,
        at: u64,
    ) -> AppendTxn {
        let observed: Vec<Observed> = (0..self.config.keys)
            .map(|k| Observed::Read {
                key: k,
                value: read(TABLE, Key(k)),
            })
            .collect();
        let txn = AppendTxn {
            id,
            begin: at,
            end: at,
            outcome: dmem_txn::TxnOutcome::Committed,
            ops: Vec::new(),
        };
        self.log.record(txn.clone(), &observed);
        txn
    }
}

impl Workload for ListAppend {
    type Txn = ListTxn;
    type Generator = ListGenerator;

    fn name(&self) -> &'static str {
        "append"
    }

    fn tables(&self) -> Vec<TableSpec> {
        vec![TableSpec {
            id: TABLE,
            name: TABLE_NAME,
            value_size: VALUE_SIZE,
            expected_records: self.config.keys,
            grows: false,
        }]
    }

    fn txn_types(&self) -> &[TxnType] {
        &self.types
    }

    fn loader(&self) -> Box<dyn Iterator<Item = (TableId, Key, Vec<u8>)> + Send + '_> {
        Box::new((0..self.config.keys).map(|k| (TABLE, Key(k), ListValue::default().emit())))
    }

    fn generator(&self, coordinator: u32, seed: u64) -> ListGenerator {
        ListGenerator {
            coordinator,
            rng: rng_for(seed, u64::from(coordinator)),
            keys: KeyChooser::new(self.config.keys, KeyDistribution::Uniform, false),
            mix: Mix::new(self.types.iter().map(|t| t.weight)),
            max_ops: self.config.max_ops,
        }
    }

    /// One round reading every key (for update where it appends), then a write per append.
    async fn run<T: Transaction>(&self, txn: &ListTxn, tx: &mut T) -> Result<Outcome, TxnError> {
        let reqs: Vec<_> = txn
            .ops
            .iter()
            .map(|&(k, a)| match a {
                Access::Read => rd(TABLE, k),
                Access::Append => upd(TABLE, k),
            })
            .collect();
        let mut values = round(tx, &reqs).await?;
        let mut appends = Vec::new();
        for &(k, a) in &txn.ops {
            let (_, value) = values.raw();
            let Some(Ok(ListValue { elements: list })) = value.map(|v| ListValue::parse(&v)) else {
                return Ok(Outcome::Rollback(MALFORMED));
            };
            if a == Access::Append {
                if list.len() >= CAPACITY {
                    return Ok(Outcome::Rollback(LIST_FULL));
                }
                appends.push((k, list));
            }
        }
        let delta = appends.len() as i64;
        for (k, mut list) in appends {
            list.push(self.log.next_element(txn.coordinator));
            tx.write(TABLE, Key(k), &ListValue { elements: list }.emit())
                .await?;
        }
        Ok(Outcome::Commit { delta })
    }

    /// Every list parses, the lists hold as many elements as transactions committed
    /// appends, and every list a committed attempt read (in the log) is a prefix of its
    /// key's final list.
    fn check<F>(&self, read: F, committed_delta: i64) -> Vec<Violation>
    where
        F: Fn(TableId, Key) -> Option<Vec<u8>>,
    {
        let mut out = Vec::new();
        let mut finals = BTreeMap::new();
        let mut total = 0i64;
        for k in 0..self.config.keys {
            let parsed = read(TABLE, Key(k))
                .ok_or(ListError::Absent)
                .and_then(|v| ListValue::parse(&v).map(|l| l.elements));
            match parsed {
                Ok(list) => {
                    total += list.len() as i64;
                    finals.insert(k, list);
                }
                Err(e) => out.push(Violation::Malformed {
                    table: TABLE_NAME,
                    key: k,
                    detail: e.to_string(),
                }),
            }
        }
        if total != committed_delta && out.is_empty() {
            out.push(Violation::Malformed {
                table: TABLE_NAME,
                key: 0,
                detail: format!(
                    "the lists hold {total} elements, committed transactions appended \
                     {committed_delta}"
                ),
            });
        }
        self.log
            .with(|txns, _| prefixes_of_finals(txns, &finals, &mut out));
        out
    }

    fn key_space(&self, table: TableId) -> Option<u64> {
        (table == TABLE).then_some(self.config.keys)
    }
}

/// Every list a committed attempt read is a prefix of its key's final list.
fn prefixes_of_finals(
    txns: &[AppendTxn],
    finals: &BTreeMap<u64, Vec<u64>>,
    out: &mut Vec<Violation>,
) {
    for t in txns
        .iter()
        .filter(|t| t.outcome == dmem_txn::TxnOutcome::Committed)
    {
        for op in &t.ops {
            let MicroOp::Read { key, list } = op else {
                continue;
            };
            if finals.get(key).is_some_and(|f| !f.starts_with(list)) {
                out.push(Violation::Malformed {
                    table: TABLE_NAME,
                    key: *key,
                    detail: format!(
                        "{} read {list:?}, not a prefix of the final list {:?}",
                        t.id, finals[key]
                    ),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes of a record holding `elements`.
    fn emit_list(elements: &[u64]) -> Vec<u8> {
        ListValue {
            elements: elements.to_vec(),
        }
        .emit()
    }

    #[test]
    fn lists_round_trip_and_malformed_records_are_errors() {
        let l = [5u64, 7, 1 << 40];
        assert_eq!(
            ListValue::parse(&emit_list(&l)).map(|v| v.elements),
            Ok(l.to_vec())
        );
        assert_eq!(ListValue::parse(&emit_list(&[])), Ok(ListValue::default()));
        let full: Vec<u64> = (1..=CAPACITY as u64).collect();
        assert_eq!(
            ListValue::parse(&emit_list(&full)).map(|v| v.elements),
            Ok(full)
        );
        assert_eq!(ListValue::parse(&[0; 8]), Err(ListError::Size(8)));
        let whole = emit_list(&l);
        for n in 0..whole.len() {
            assert_eq!(ListValue::parse(&whole[..n]), Err(ListError::Size(n)));
        }
        let mut v = emit_list(&l);
        v[4] ^= 1;
        assert!(matches!(ListValue::parse(&v), Err(ListError::Magic(_))));
        let mut v = emit_list(&l);
        v[0] = 128;
        assert_eq!(ListValue::parse(&v), Err(ListError::Length(128)));
        let mut v = emit_list(&l);
        v[0] = 4;
        assert_eq!(ListValue::parse(&v), Err(ListError::Zero(3)));
        let mut v = emit_list(&l);
        v[VALUE_SIZE - 1] = 1;
        assert_eq!(ListValue::parse(&v), Err(ListError::Tail(VALUE_SIZE - 1)));
    }

    #[test]
    fn elements_are_unique_and_name_their_coordinator() {
        let w = ListAppend::new(AppendConfig::preset(Scale::Tiny));
        let a = w.log().next_element(3);
        let b = w.clone().log().next_element(3);
        let c = w.log().next_element(4);
        assert_eq!((a, b, c), ((1 << 16) | 3, (2 << 16) | 3, (1 << 16) | 4));
    }

    #[test]
    fn observed_values_become_micro_ops() {
        let ops = micro_ops(&[
            Observed::Read {
                key: 1,
                value: Some(emit_list(&[4, 9])),
            },
            Observed::Write {
                key: 1,
                value: emit_list(&[4, 9, 11]),
            },
        ]);
        assert_eq!(
            ops,
            Ok(vec![
                MicroOp::Read {
                    key: 1,
                    list: vec![4, 9]
                },
                MicroOp::Append {
                    key: 1,
                    element: 11
                }
            ])
        );
        let absent = micro_ops(&[Observed::Read {
            key: 2,
            value: None,
        }]);
        assert_eq!(absent, Err((2, ListError::Absent)));
    }
}
