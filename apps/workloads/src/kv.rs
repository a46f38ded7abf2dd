//! The key-value workloads: LOTUS's KVS micro-benchmark and YCSB-style mixes.
//!
//! One table of `records` keys `0..records` with values of `value_size` bytes.
//!
//! * **KVS** (LOTUS §8.1–§8.2, Pandora §6): 8-byte keys, 40-byte values; `ReadOne` reads one
//!   record (read-only), `UpdateOne` reads it for update and writes it; the read-write share
//!   is a parameter (LOTUS sweeps it); keys uniform or Zipf (θ = 0.99 by default).
//! * **YCSB** (OOCC §VI): the core mixes as ratios of `Read` to `Update` transactions —
//!   A 50/50, B 95/5, C 100/0, F 50/50 (read-modify-write, which here is what Update does),
//!   OOCC's read-only and read-intensive (90/10) — with `ops_per_txn` keys per transaction
//!   (distinct), scrambled Zipf keys (θ = 0.99), 8-byte values (OOCC's record size).
//!   YCSB D (read-latest with inserts) and E (scans) are not offered: D needs a global
//!   insert counter the generators do not share, E needs range scans a hash index lacks.
//!
//! # Value layout
//!
//! ```text
//! 0        8                                   value_size
//! +--------+-----------------------------------+
//! | count  | fill(key, count)                  |
//! +--------+-----------------------------------+
//! ```
//!
//! `count` (u64 LE) is how many committed updates the record has seen; `fill` is a
//! deterministic function of the key and the count. An update installs `count + 1` and the
//! matching fill, so the check finds torn values, values written under the wrong key and,
//! summing the counts, lost updates: the sum must equal the committed updates.

use dmem_txn::{Key, ReadReq, TableId, Transaction, TxnError, TxnKind};

use crate::dist::{KeyChooser, KeyDistribution, Mix, WorkloadRng, mix64, rng_for};
use crate::invariants::Violation;
use crate::record::{rd, round, upd};
use crate::{Outcome, Scale, TableSpec, TxnGenerator, TxnInfo, TxnType, Workload};

/// The single table.
pub const TABLE: TableId = TableId(0);
const TABLE_NAME: &str = "kv";

/// Which flavour: it sets the names and the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvFlavor {
    /// LOTUS's KVS (`ReadOne` / `UpdateOne`).
    Kvs,
    /// YCSB-style (`Read` / `Update`).
    Ycsb,
    /// FaSST's and Dandelion's O(G,P) micro-benchmarks (Dandelion §7): G Gets and P Puts
    /// to distinct uniformly chosen keys per transaction (`ops_per_txn` = G,
    /// `puts_per_txn` = P); a Put is a blind write.
    Micro,
}

/// The standard YCSB mixes (and OOCC's two).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum YcsbMix {
    /// Workload A: 50 % read, 50 % update.
    A,
    /// Workload B: 95 % read, 5 % update.
    B,
    /// Workload C: read only.
    C,
    /// Workload F: 50 % read, 50 % read-modify-write.
    F,
    /// OOCC "Read-only": every transaction read-only.
    ReadOnly,
    /// OOCC "Read-intensive": 90 % read-only transactions.
    ReadIntensive,
    /// OOCC §III-C / §VIII-C, transactions with an unknown read (and write) set: 95 %
    /// read-only; each transaction reads two keys, then two keys derived from the values it
    /// read (a second round), and an update writes the derived ones.
    UnknownReadSet,
}

impl YcsbMix {
    /// Percentage of update (read-write) transactions.
    #[must_use]
    pub const fn update_percent(self) -> u32 {
        match self {
            YcsbMix::A | YcsbMix::F => 50,
            YcsbMix::B | YcsbMix::UnknownReadSet => 5,
            YcsbMix::C | YcsbMix::ReadOnly => 0,
            YcsbMix::ReadIntensive => 10,
        }
    }
}

/// Parameters of a key-value workload.
#[derive(Debug, Clone, PartialEq)]
pub struct KvConfig {
    /// KVS or YCSB.
    pub flavor: KvFlavor,
    /// Number of keys (`0..records`).
    pub records: u64,
    /// Value size in bytes (≥ 8).
    pub value_size: usize,
    /// Key distribution.
    pub distribution: KeyDistribution,
    /// Spread Zipf's hot keys over the key space (see [`KeyChooser`]).
    pub scramble: bool,
    /// Percentage of read-write transactions (0–100).
    pub update_percent: u32,
    /// Keys per transaction (distinct; ≥ 1, ≤ `records`); the Gets of [`KvFlavor::Micro`]
    /// (which may be 0 if it has Puts).
    pub ops_per_txn: u32,
    /// Blind Puts per transaction of [`KvFlavor::Micro`] (0 for the other flavours), to
    /// keys distinct from its Gets. A Put writes the key's loaded value again (count 0), so
    /// the counts' invariant still holds while every value's fill is checked.
    pub puts_per_txn: u32,
    /// Unknown read sets (OOCC §III-C): after reading its `ops_per_txn` keys a transaction
    /// reads as many keys derived from their values (read-only, or for update in an update
    /// transaction, which then writes those), so its second round depends on its first.
    pub dependent: bool,
}

impl KvConfig {
    /// LOTUS's KVS at a preset: 40-byte values, Zipf θ = 0.99, unscrambled, one key per
    /// transaction, 50 % UpdateOne. Keys: tiny 10k, small/ford/motor 1M, lotus 20M.
    #[must_use]
    pub fn kvs(scale: Scale) -> Self {
        Self {
            flavor: KvFlavor::Kvs,
            records: records_at(scale),
            value_size: 40,
            distribution: KeyDistribution::Zipf { theta: 0.99 },
            scramble: false,
            update_percent: 50,
            ops_per_txn: 1,
            puts_per_txn: 0,
            dependent: false,
        }
    }

    /// A YCSB mix at a preset: 8-byte values, scrambled Zipf θ = 0.99, one key per
    /// transaction ([`YcsbMix::UnknownReadSet`]: two, then two derived). Keys as for
    /// [`KvConfig::kvs`].
    #[must_use]
    pub fn ycsb(scale: Scale, mix: YcsbMix) -> Self {
        let unknown = mix == YcsbMix::UnknownReadSet;
        Self {
            flavor: KvFlavor::Ycsb,
            records: records_at(scale),
            value_size: 8,
            distribution: KeyDistribution::Zipf { theta: 0.99 },
            scramble: true,
            update_percent: mix.update_percent(),
            ops_per_txn: if unknown { 2 } else { 1 },
            puts_per_txn: 0,
            dependent: unknown,
        }
    }

    /// O(`gets`, `puts`) as in Dandelion §7: 16-byte values, uniform keys (keys as for
    /// [`KvConfig::kvs`]).
    #[must_use]
    pub fn micro(scale: Scale, gets: u32, puts: u32) -> Self {
        Self {
            flavor: KvFlavor::Micro,
            records: records_at(scale),
            value_size: 16,
            distribution: KeyDistribution::Uniform,
            scramble: false,
            update_percent: if puts > 0 { 100 } else { 0 },
            ops_per_txn: gets,
            puts_per_txn: puts,
            dependent: false,
        }
    }
}

fn records_at(scale: Scale) -> u64 {
    match scale {
        Scale::Tiny => 10_000,
        Scale::Small | Scale::Ford | Scale::Motor => 1_000_000,
        Scale::Lotus => 20_000_000,
    }
}

/// A generated key-value transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvTxn {
    /// Read these keys (read-only), in one round.
    Read {
        /// Distinct keys.
        keys: Vec<u64>,
    },
    /// Read every key for update in one round, then write each back with its count + 1.
    Update {
        /// Distinct keys.
        keys: Vec<u64>,
    },
    /// O(G,P): read `gets` in one round, then blind-write `puts`.
    Micro {
        /// Keys read.
        gets: Vec<u64>,
        /// Keys written without reading, distinct from `gets`.
        puts: Vec<u64>,
    },
}

impl TxnInfo for KvTxn {
    fn first_record(&self) -> Option<(TableId, Key)> {
        match self {
            KvTxn::Read { keys } | KvTxn::Update { keys } => keys.first().map(|&k| (TABLE, Key(k))),
            KvTxn::Micro { gets, puts } => gets.first().or(puts.first()).map(|&k| (TABLE, Key(k))),
        }
    }

    fn type_index(&self) -> usize {
        match self {
            KvTxn::Read { .. } => 0,
            KvTxn::Update { .. } => 1,
            KvTxn::Micro { puts, .. } => usize::from(!puts.is_empty()),
        }
    }

    fn kind(&self) -> TxnKind {
        match self {
            KvTxn::Read { .. } => TxnKind::ReadOnly,
            KvTxn::Update { .. } => TxnKind::ReadWrite,
            KvTxn::Micro { puts, .. } if puts.is_empty() => TxnKind::ReadOnly,
            KvTxn::Micro { .. } => TxnKind::ReadWrite,
        }
    }
}

/// The KVS / YCSB workload.
#[derive(Debug, Clone)]
pub struct KvWorkload {
    config: KvConfig,
    types: [TxnType; 2],
}

impl KvWorkload {
    /// A workload with this configuration.
    ///
    /// # Panics
    /// If `value_size < 8`, `records == 0`, `update_percent > 100`, `ops_per_txn == 0` or
    /// `ops_per_txn > records`.
    #[must_use]
    pub fn new(config: KvConfig) -> Self {
        assert!(config.value_size >= 8, "values hold an 8-byte counter");
        assert!(config.records > 0 && config.update_percent <= 100);
        let keys = config.ops_per_txn + config.puts_per_txn;
        assert!(keys >= 1 && u64::from(keys) <= config.records);
        assert!(config.ops_per_txn >= 1 || config.flavor == KvFlavor::Micro);
        let (read, update) = match config.flavor {
            KvFlavor::Kvs => ("ReadOne", "UpdateOne"),
            KvFlavor::Ycsb => ("Read", "Update"),
            KvFlavor::Micro => ("Gets", "GetsPuts"),
        };
        let types = [
            TxnType {
                name: read,
                kind: TxnKind::ReadOnly,
                weight: 100 - config.update_percent,
            },
            TxnType {
                name: update,
                kind: TxnKind::ReadWrite,
                weight: config.update_percent,
            },
        ];
        Self { config, types }
    }

    /// Its configuration.
    #[must_use]
    pub const fn config(&self) -> &KvConfig {
        &self.config
    }

    /// The value of `key` after `count` committed updates.
    #[must_use]
    pub fn value(&self, key: u64, count: u64) -> Vec<u8> {
        let mut v = vec![0u8; self.config.value_size];
        v[..8].copy_from_slice(&count.to_le_bytes());
        fill(key, count, &mut v[8..]);
        v
    }
}

impl KvWorkload {
    /// O(G,P): one round of Gets (each value checked), then blind Puts of the loaded value.
    /// The keys a transaction with an unknown read set reads second: one per first-round
    /// key, from that key and the count it read (so they change as records are updated),
    /// distinct from each other and from the first round's.
    fn derived_keys(&self, keys: &[u64], counts: &[u64]) -> Vec<u64> {
        let mut out: Vec<u64> = Vec::with_capacity(keys.len());
        for (&k, &count) in keys.iter().zip(counts) {
            let mut salt = 0u64;
            loop {
                let d = mix64(k ^ count.rotate_left(17) ^ salt.wrapping_mul(0x9e37_79b9))
                    % self.config.records;
                if !keys.contains(&d) && !out.contains(&d) {
                    out.push(d);
                    break;
                }
                salt += 1;
            }
        }
        out
    }

    /// The second round of a transaction with an unknown read set (OOCC §III-C): read the
    /// keys derived from the first round's values, for update in an update transaction,
    /// which then writes them.
    async fn run_dependent<T: Transaction>(
        &self,
        keys: &[u64],
        counts: &[u64],
        update: bool,
        tx: &mut T,
    ) -> Result<Outcome, TxnError> {
        let derived = self.derived_keys(keys, counts);
        let reqs: Vec<ReadReq> = derived
            .iter()
            .map(|&k| if update { upd(TABLE, k) } else { rd(TABLE, k) })
            .collect();
        let mut values = round(tx, &reqs).await?;
        let mut next = Vec::with_capacity(derived.len());
        for _ in &derived {
            let (k, value) = values.raw();
            let value = value.ok_or(TxnError::KeyState(k))?;
            if value.len() != self.config.value_size {
                return Err(TxnError::ValueSize {
                    expected: self.config.value_size,
                    got: value.len(),
                });
            }
            next.push(u64::from_le_bytes(value[..8].try_into().expect("8 bytes")));
        }
        if update {
            for (&k, count) in derived.iter().zip(next) {
                tx.write(TABLE, Key(k), &self.value(k, count + 1)).await?;
            }
        }
        Ok(Outcome::Commit {
            delta: if update { derived.len() as i64 } else { 0 },
        })
    }

    async fn run_micro<T: Transaction>(
        &self,
        gets: &[u64],
        puts: &[u64],
        tx: &mut T,
    ) -> Result<Outcome, TxnError> {
        if !gets.is_empty() {
            let reqs: Vec<ReadReq> = gets.iter().map(|&k| rd(TABLE, k)).collect();
            let mut values = round(tx, &reqs).await?;
            for _ in gets {
                let (k, value) = values.raw();
                let value = value.ok_or(TxnError::KeyState(k))?;
                if value.len() != self.config.value_size {
                    return Err(TxnError::ValueSize {
                        expected: self.config.value_size,
                        got: value.len(),
                    });
                }
            }
        }
        for &k in puts {
            tx.write(TABLE, Key(k), &self.value(k, 0)).await?;
        }
        Ok(Outcome::Commit { delta: 0 })
    }
}

fn fill(key: u64, count: u64, out: &mut [u8]) {
    for (j, chunk) in out.chunks_mut(8).enumerate() {
        let word = mix64(key ^ mix64(count ^ mix64(j as u64))).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
}

/// Decodes a value's count, checking size and fill.
fn decode(key: u64, value: &[u8], size: usize) -> Result<u64, String> {
    if value.len() != size {
        return Err(format!("{} bytes, expected {size}", value.len()));
    }
    let count = u64::from_le_bytes(value[..8].try_into().expect("8 bytes"));
    let mut expect = vec![0u8; size - 8];
    fill(key, count, &mut expect);
    if expect != value[8..] {
        return Err(format!("fill does not match key {key} and count {count}"));
    }
    Ok(count)
}

/// The per-coordinator generator of [`KvWorkload`].
#[derive(Debug, Clone)]
pub struct KvGenerator {
    rng: WorkloadRng,
    keys: KeyChooser,
    mix: Mix,
    ops: usize,
    /// Blind Puts per transaction for O(G,P) (`None`: KVS / YCSB).
    puts: Option<usize>,
}

impl TxnGenerator for KvGenerator {
    type Txn = KvTxn;

    fn next_txn(&mut self) -> KvTxn {
        let ty = self.mix.pick(&mut self.rng);
        let total = self.ops + self.puts.unwrap_or(0);
        let mut keys = Vec::with_capacity(total);
        while keys.len() < total {
            let k = self.keys.next_key(&mut self.rng);
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        if self.puts.is_some() {
            let puts = keys.split_off(self.ops);
            KvTxn::Micro { gets: keys, puts }
        } else if ty == 0 {
            KvTxn::Read { keys }
        } else {
            KvTxn::Update { keys }
        }
    }
}

impl Workload for KvWorkload {
    type Txn = KvTxn;
    type Generator = KvGenerator;

    fn name(&self) -> &'static str {
        match self.config.flavor {
            KvFlavor::Kvs => "kvs",
            KvFlavor::Ycsb => "ycsb",
            KvFlavor::Micro => "micro",
        }
    }

    /// Keys are `0..records`.
    fn key_space(&self, _table: TableId) -> Option<u64> {
        Some(self.config.records)
    }

    fn tables(&self) -> Vec<TableSpec> {
        vec![TableSpec {
            id: TABLE,
            name: TABLE_NAME,
            value_size: self.config.value_size,
            expected_records: self.config.records,
            grows: false,
        }]
    }

    fn txn_types(&self) -> &[TxnType] {
        &self.types
    }

    fn loader(&self) -> Box<dyn Iterator<Item = (TableId, Key, Vec<u8>)> + Send + '_> {
        Box::new((0..self.config.records).map(|k| (TABLE, Key(k), self.value(k, 0))))
    }

    fn generator(&self, coordinator: u32, seed: u64) -> KvGenerator {
        KvGenerator {
            rng: rng_for(seed, u64::from(coordinator)),
            keys: KeyChooser::new(
                self.config.records,
                self.config.distribution,
                self.config.scramble,
            ),
            mix: Mix::new(self.types.iter().map(|t| t.weight)),
            ops: self.config.ops_per_txn as usize,
            puts: (self.config.flavor == KvFlavor::Micro)
                .then_some(self.config.puts_per_txn as usize),
        }
    }

    async fn run<T: Transaction>(&self, txn: &KvTxn, tx: &mut T) -> Result<Outcome, TxnError> {
        let size = self.config.value_size;
        let (keys, update) = match txn {
            KvTxn::Read { keys } => (keys, false),
            KvTxn::Update { keys } => (keys, true),
            KvTxn::Micro { gets, puts } => return self.run_micro(gets, puts, tx).await,
        };
        // One round: every key, read-only or for update; then the writes.
        // With unknown read sets the first round only reads: what is written follows from it.
        let first_update = update && !self.config.dependent;
        let reqs: Vec<ReadReq> = keys
            .iter()
            .map(|&k| {
                if first_update {
                    upd(TABLE, k)
                } else {
                    rd(TABLE, k)
                }
            })
            .collect();
        let mut values = round(tx, &reqs).await?;
        let mut counts = Vec::with_capacity(keys.len());
        for _ in keys {
            let (k, value) = values.raw();
            let value = value.ok_or(TxnError::KeyState(k))?;
            if value.len() != size {
                return Err(TxnError::ValueSize {
                    expected: size,
                    got: value.len(),
                });
            }
            counts.push(u64::from_le_bytes(value[..8].try_into().expect("8 bytes")));
        }
        if self.config.dependent {
            return self.run_dependent(keys, &counts, update, tx).await;
        }
        if update {
            for (&k, count) in keys.iter().zip(counts) {
                tx.write(TABLE, Key(k), &self.value(k, count + 1)).await?;
            }
        }
        Ok(Outcome::Commit {
            delta: if update { keys.len() as i64 } else { 0 },
        })
    }

    fn check<F>(&self, read: F, committed_delta: i64) -> Vec<Violation>
    where
        F: Fn(TableId, Key) -> Option<Vec<u8>>,
    {
        let mut violations = Vec::new();
        let mut sum: i64 = 0;
        for k in 0..self.config.records {
            match read(TABLE, Key(k)) {
                None => violations.push(Violation::Missing {
                    table: TABLE_NAME,
                    key: k,
                }),
                Some(v) => match decode(k, &v, self.config.value_size) {
                    Ok(count) => sum = sum.wrapping_add(count as i64),
                    Err(detail) => violations.push(Violation::Malformed {
                        table: TABLE_NAME,
                        key: k,
                        detail,
                    }),
                },
            }
        }
        if sum != committed_delta {
            violations.push(Violation::KvUpdateCount {
                expected: committed_delta,
                found: sum,
            });
        }
        violations
    }
}
