//! TATP, the Telecom Application Transaction Processing benchmark (TATP Benchmark
//! Description 1.0; LOTUS §8.1, OOCC §VI, Dandelion §8): a mobile operator's home location
//! register.
//!
//! # Tables and key packing
//!
//! | id | table | key | value |
//! |---|---|---|---|
//! | 0 | SUBSCRIBER | `s_id` | [`SubscriberRecord`], 48 B |
//! | 1 | ACCESS_INFO | `s_id << 2 \| (ai_type − 1)` | [`AccessInfoRecord`], 16 B |
//! | 2 | SPECIAL_FACILITY | `s_id << 2 \| (sf_type − 1)` | [`SpecialFacilityRecord`], 8 B |
//! | 3 | CALL_FORWARDING | `s_id << 4 \| (sf_type − 1) << 2 \| start_time / 8` | [`CallForwardingRecord`], 16 B |
//!
//! `s_id` is in `1..=subscribers`; types are 1–4; `start_time` ∈ {0, 8, 16}.
//!
//! # Population (the specification's rules)
//!
//! Per subscriber: `sub_nbr` = `s_id` as 15 zero-padded digits; random bits, hex digits,
//! bytes and locations; 1–4 ACCESS_INFO rows of distinct random types; 1–4
//! SPECIAL_FACILITY rows of distinct random types (`is_active` 1 with probability 85 %);
//! 0–3 CALL_FORWARDING rows per special facility with distinct start times and
//! `end_time = start_time + rnd(1, 8)`.
//!
//! # Transactions and mix
//!
//! | type | % | kind | accesses |
//! |---|---|---|---|
//! | GET_SUBSCRIBER_DATA | 35 | RO | read SUBSCRIBER |
//! | GET_NEW_DESTINATION | 10 | RO | read SPECIAL_FACILITY (active?) and the CALL_FORWARDING rows with `start_time ≤ t` |
//! | GET_ACCESS_DATA | 35 | RO | read ACCESS_INFO |
//! | UPDATE_SUBSCRIBER_DATA | 2 | RW | write SUBSCRIBER.bit_1 and SPECIAL_FACILITY.data_a |
//! | UPDATE_LOCATION | 14 | RW | write SUBSCRIBER.vlr_location |
//! | INSERT_CALL_FORWARDING | 2 | RW | read SPECIAL_FACILITY, insert CALL_FORWARDING |
//! | DELETE_CALL_FORWARDING | 2 | RW | delete CALL_FORWARDING |
//!
//! 80 % read-only. Subscriber ids are non-uniform: [`tatp_subscriber_id`]
//! (`A` = 65535 / 1048575 / 2097151 by population). Rows that are looked for and absent make
//! a transaction *unsuccessful* (the specification's expected success rates are below
//! 100 %): [`Outcome::CommitMissed`]; an INSERT_CALL_FORWARDING whose row exists, or whose
//! special facility does not, rolls back ([`Outcome::Rollback`]), as its SQL insert fails.
//!
//! # Hash-index adaptations
//!
//! * UPDATE_LOCATION and INSERT/DELETE_CALL_FORWARDING look the subscriber up by `sub_nbr`;
//!   `sub_nbr` is by definition `s_id` in 15 digits, so the lookup is that function and the
//!   generated transaction carries `s_id` (as FORD and Motor do).
//! * GET_NEW_DESTINATION's range predicate on `start_time` reads the (at most 3) rows with
//!   `start_time ∈ {0, 8, 16}, start_time ≤ t` by key.
//! * INSERT_CALL_FORWARDING reads only the SPECIAL_FACILITY row of its `sf_type` (the
//!   foreign key it needs), not all of the subscriber's.
//!
//! # Invariants
//!
//! TATP defines no consistency conditions; [`Workload::check`] verifies the schema's
//! integrity: every subscriber present with its `sub_nbr`, and every CALL_FORWARDING row's
//! SPECIAL_FACILITY row present (its foreign key; special facilities are never deleted).

use dmem_txn::{CriticalField, Key, ReadReq, TableId, Transaction, TxnError, TxnKind};
use rand::RngExt;
use static_assertions::const_assert_eq;
use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::dist::{Mix, WorkloadRng, nstring, rng_for, tatp_subscriber_id, upper};
use crate::invariants::Violation;
use crate::record::{Record, peek, rd, round, upd};
use crate::{Outcome, Scale, TableSpec, TxnGenerator, TxnInfo, TxnType, Workload};

/// SUBSCRIBER.
pub const SUBSCRIBER: TableId = TableId(0);
/// ACCESS_INFO.
pub const ACCESS_INFO: TableId = TableId(1);
/// SPECIAL_FACILITY.
pub const SPECIAL_FACILITY: TableId = TableId(2);
/// CALL_FORWARDING.
pub const CALL_FORWARDING: TableId = TableId(3);

/// The start times a call forwarding may have.
pub const START_TIMES: [u8; 3] = [0, 8, 16];

/// ACCESS_INFO key.
#[must_use]
pub const fn ai_key(s_id: u64, ai_type: u8) -> u64 {
    s_id << 2 | (ai_type as u64 - 1)
}

/// SPECIAL_FACILITY key.
#[must_use]
pub const fn sf_key(s_id: u64, sf_type: u8) -> u64 {
    s_id << 2 | (sf_type as u64 - 1)
}

/// CALL_FORWARDING key.
#[must_use]
pub const fn cf_key(s_id: u64, sf_type: u8, start_time: u8) -> u64 {
    s_id << 4 | (sf_type as u64 - 1) << 2 | (start_time / 8) as u64
}

/// A SUBSCRIBER row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct SubscriberRecord {
    /// msc_location.
    pub msc_location: U32,
    /// vlr_location.
    pub vlr_location: U32,
    /// sub_nbr: 15 ASCII digits and a zero.
    pub sub_nbr: [u8; 16],
    /// bit_1 … bit_10 in bits 0–9.
    pub bits: U16,
    /// hex_1 … hex_10, two 4-bit digits per byte (hex_1 in the low nibble of byte 0).
    pub hex: [u8; 5],
    /// byte2_1 … byte2_10.
    pub byte2: [u8; 10],
    /// Padding to 48 bytes.
    pub _pad: [u8; 7],
}
const_assert_eq!(size_of::<SubscriberRecord>(), 48);
impl Record for SubscriberRecord {}

/// An ACCESS_INFO row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct AccessInfoRecord {
    /// data1.
    pub data1: u8,
    /// data2.
    pub data2: u8,
    /// data3: 3 upper-case letters.
    pub data3: [u8; 3],
    /// data4: 5 upper-case letters.
    pub data4: [u8; 5],
    /// Padding to 16 bytes.
    pub _pad: [u8; 6],
}
const_assert_eq!(size_of::<AccessInfoRecord>(), 16);
impl Record for AccessInfoRecord {}

/// A SPECIAL_FACILITY row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct SpecialFacilityRecord {
    /// is_active (0 or 1).
    pub is_active: u8,
    /// error_cntrl.
    pub error_cntrl: u8,
    /// data_a.
    pub data_a: u8,
    /// data_b: 5 upper-case letters.
    pub data_b: [u8; 5],
}
const_assert_eq!(size_of::<SpecialFacilityRecord>(), 8);
impl Record for SpecialFacilityRecord {}

/// A CALL_FORWARDING row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct CallForwardingRecord {
    /// end_time (1–24).
    pub end_time: u8,
    /// numberx: 15 digits.
    pub numberx: [u8; 15],
}
const_assert_eq!(size_of::<CallForwardingRecord>(), 16);
impl Record for CallForwardingRecord {}

/// The type names, in `type_index` order.
pub const TYPE_NAMES: [&str; 7] = [
    "GetSubscriberData",
    "GetNewDestination",
    "GetAccessData",
    "UpdateSubscriberData",
    "UpdateLocation",
    "InsertCallForwarding",
    "DeleteCallForwarding",
];

/// The specification's mix, percent.
pub const STANDARD_MIX: [u32; 7] = [35, 10, 35, 2, 14, 2, 2];

/// Parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TatpConfig {
    /// Subscribers (`1..=subscribers`).
    pub subscribers: u64,
    /// Mix weights in [`TYPE_NAMES`] order.
    pub weights: [u32; 7],
    /// Seed of the population.
    pub load_seed: u64,
}

impl TatpConfig {
    /// A preset: tiny 1,000, small and ford 100k, motor 2M, lotus 3M subscribers.
    #[must_use]
    pub fn preset(scale: Scale) -> Self {
        let subscribers = match scale {
            Scale::Tiny => 1_000,
            Scale::Small | Scale::Ford => 100_000,
            Scale::Motor => 2_000_000,
            Scale::Lotus => 3_000_000,
        };
        Self {
            subscribers,
            weights: STANDARD_MIX,
            load_seed: 0x7a79,
        }
    }
}

/// A generated TATP transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TatpTxn {
    /// GET_SUBSCRIBER_DATA.
    GetSubscriberData {
        /// Subscriber.
        s_id: u64,
    },
    /// GET_NEW_DESTINATION.
    GetNewDestination {
        /// Subscriber.
        s_id: u64,
        /// 1–4.
        sf_type: u8,
        /// 0, 8 or 16.
        start_time: u8,
        /// 1–24.
        end_time: u8,
    },
    /// GET_ACCESS_DATA.
    GetAccessData {
        /// Subscriber.
        s_id: u64,
        /// 1–4.
        ai_type: u8,
    },
    /// UPDATE_SUBSCRIBER_DATA.
    UpdateSubscriberData {
        /// Subscriber.
        s_id: u64,
        /// New bit_1.
        bit_1: bool,
        /// 1–4.
        sf_type: u8,
        /// New data_a.
        data_a: u8,
    },
    /// UPDATE_LOCATION.
    UpdateLocation {
        /// Subscriber (looked up from `sub_nbr`).
        s_id: u64,
        /// New vlr_location.
        vlr_location: u32,
    },
    /// INSERT_CALL_FORWARDING.
    InsertCallForwarding {
        /// Subscriber (looked up from `sub_nbr`).
        s_id: u64,
        /// 1–4.
        sf_type: u8,
        /// 0, 8 or 16.
        start_time: u8,
        /// 1–24.
        end_time: u8,
        /// 15 digits.
        numberx: [u8; 15],
    },
    /// DELETE_CALL_FORWARDING.
    DeleteCallForwarding {
        /// Subscriber (looked up from `sub_nbr`).
        s_id: u64,
        /// 1–4.
        sf_type: u8,
        /// 0, 8 or 16.
        start_time: u8,
    },
}

impl TxnInfo for TatpTxn {
    fn first_record(&self) -> Option<(TableId, Key)> {
        let s_id = match *self {
            TatpTxn::GetSubscriberData { s_id }
            | TatpTxn::GetNewDestination { s_id, .. }
            | TatpTxn::GetAccessData { s_id, .. }
            | TatpTxn::UpdateSubscriberData { s_id, .. }
            | TatpTxn::UpdateLocation { s_id, .. }
            | TatpTxn::InsertCallForwarding { s_id, .. }
            | TatpTxn::DeleteCallForwarding { s_id, .. } => s_id,
        };
        Some((SUBSCRIBER, Key(s_id)))
    }

    fn type_index(&self) -> usize {
        match self {
            TatpTxn::GetSubscriberData { .. } => 0,
            TatpTxn::GetNewDestination { .. } => 1,
            TatpTxn::GetAccessData { .. } => 2,
            TatpTxn::UpdateSubscriberData { .. } => 3,
            TatpTxn::UpdateLocation { .. } => 4,
            TatpTxn::InsertCallForwarding { .. } => 5,
            TatpTxn::DeleteCallForwarding { .. } => 6,
        }
    }

    fn kind(&self) -> TxnKind {
        if self.type_index() < 3 {
            TxnKind::ReadOnly
        } else {
            TxnKind::ReadWrite
        }
    }
}

/// The TATP workload.
#[derive(Debug, Clone)]
pub struct Tatp {
    config: TatpConfig,
    types: [TxnType; 7],
}

/// `k` distinct values from `1..=4`, as a bit set (bit `t - 1` for type `t`).
fn distinct_types(rng: &mut WorkloadRng, k: usize) -> u8 {
    let mut set = 0u8;
    while (set.count_ones() as usize) < k {
        set |= 1 << rng.random_range(0..4);
    }
    set
}

impl Tatp {
    /// A workload with this configuration.
    ///
    /// # Panics
    /// If there are no subscribers or more than 2^59 (keys pack `s_id << 4`).
    #[must_use]
    pub fn new(config: TatpConfig) -> Self {
        assert!(config.subscribers >= 1 && config.subscribers < 1 << 59);
        let types = core::array::from_fn(|i| TxnType {
            name: TYPE_NAMES[i],
            kind: if i < 3 {
                TxnKind::ReadOnly
            } else {
                TxnKind::ReadWrite
            },
            weight: config.weights[i],
        });
        Self { config, types }
    }

    /// Its configuration.
    #[must_use]
    pub const fn config(&self) -> &TatpConfig {
        &self.config
    }

    /// The rows of one subscriber, in table order.
    fn subscriber_rows(&self, s_id: u64, out: &mut Vec<(TableId, Key, Vec<u8>)>) {
        let mut rng = rng_for(self.config.load_seed, s_id);
        let mut sub = SubscriberRecord {
            msc_location: U32::new(rng.random_range(1..=u32::MAX)),
            vlr_location: U32::new(rng.random_range(1..=u32::MAX)),
            sub_nbr: sub_nbr(s_id),
            bits: U16::new(rng.random_range(0..1 << 10)),
            hex: [0; 5],
            byte2: [0; 10],
            _pad: [0; 7],
        };
        rng.fill(&mut sub.hex[..]);
        rng.fill(&mut sub.byte2[..]);
        out.push((SUBSCRIBER, Key(s_id), sub.encode()));

        let n_ai = rng.random_range(1..=4);
        let ai_types = distinct_types(&mut rng, n_ai);
        for t in 1..=4u8 {
            if ai_types & (1 << (t - 1)) != 0 {
                let mut ai = AccessInfoRecord {
                    data1: rng.random(),
                    data2: rng.random(),
                    data3: [0; 3],
                    data4: [0; 5],
                    _pad: [0; 6],
                };
                upper(&mut rng, &mut ai.data3);
                upper(&mut rng, &mut ai.data4);
                out.push((ACCESS_INFO, Key(ai_key(s_id, t)), ai.encode()));
            }
        }

        let n_sf = rng.random_range(1..=4);
        let sf_types = distinct_types(&mut rng, n_sf);
        for t in 1..=4u8 {
            if sf_types & (1 << (t - 1)) == 0 {
                continue;
            }
            let mut sf = SpecialFacilityRecord {
                is_active: u8::from(rng.random_range(0..100) < 85),
                error_cntrl: rng.random(),
                data_a: rng.random(),
                data_b: [0; 5],
            };
            upper(&mut rng, &mut sf.data_b);
            out.push((SPECIAL_FACILITY, Key(sf_key(s_id, t)), sf.encode()));
            let n_cf = rng.random_range(0..=3usize);
            let mut starts = 0u8;
            while (starts.count_ones() as usize) < n_cf {
                starts |= 1 << rng.random_range(0..3);
            }
            for (i, &start) in START_TIMES.iter().enumerate() {
                if starts & (1 << i) != 0 {
                    let mut cf = CallForwardingRecord {
                        end_time: start + rng.random_range(1..=8),
                        numberx: [0; 15],
                    };
                    nstring(&mut rng, &mut cf.numberx, 15, 15);
                    out.push((CALL_FORWARDING, Key(cf_key(s_id, t, start)), cf.encode()));
                }
            }
        }
    }
}

/// `s_id` as 15 zero-padded digits (the specification's `sub_nbr`).
#[must_use]
pub fn sub_nbr(s_id: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    let mut v = s_id;
    for i in (0..15).rev() {
        out[i] = b'0' + (v % 10) as u8;
        v /= 10;
    }
    out
}

/// The streaming loader: one subscriber's rows at a time.
struct TatpLoader<'a> {
    tatp: &'a Tatp,
    next_s_id: u64,
    buffer: Vec<(TableId, Key, Vec<u8>)>,
}

impl Iterator for TatpLoader<'_> {
    type Item = (TableId, Key, Vec<u8>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.buffer.is_empty() {
            if self.next_s_id > self.tatp.config.subscribers {
                return None;
            }
            self.tatp.subscriber_rows(self.next_s_id, &mut self.buffer);
            self.buffer.reverse();
            self.next_s_id += 1;
        }
        self.buffer.pop()
    }
}

/// The per-coordinator generator of [`Tatp`].
#[derive(Debug, Clone)]
pub struct TatpGenerator {
    rng: WorkloadRng,
    mix: Mix,
    subscribers: u64,
}

impl TxnGenerator for TatpGenerator {
    type Txn = TatpTxn;

    fn next_txn(&mut self) -> TatpTxn {
        let ty = self.mix.pick(&mut self.rng);
        let rng = &mut self.rng;
        let s_id = tatp_subscriber_id(rng, self.subscribers);
        let start = |rng: &mut WorkloadRng| START_TIMES[rng.random_range(0..3)];
        match ty {
            0 => TatpTxn::GetSubscriberData { s_id },
            1 => TatpTxn::GetNewDestination {
                s_id,
                sf_type: rng.random_range(1..=4),
                start_time: start(rng),
                end_time: rng.random_range(1..=24),
            },
            2 => TatpTxn::GetAccessData {
                s_id,
                ai_type: rng.random_range(1..=4),
            },
            3 => TatpTxn::UpdateSubscriberData {
                s_id,
                bit_1: rng.random(),
                sf_type: rng.random_range(1..=4),
                data_a: rng.random(),
            },
            4 => TatpTxn::UpdateLocation {
                s_id,
                vlr_location: rng.random_range(1..=u32::MAX),
            },
            5 => {
                let sf_type = rng.random_range(1..=4);
                let start_time = start(rng);
                let end_time = rng.random_range(1..=24);
                let mut numberx = [0u8; 15];
                nstring(rng, &mut numberx, 15, 15);
                TatpTxn::InsertCallForwarding {
                    s_id,
                    sf_type,
                    start_time,
                    end_time,
                    numberx,
                }
            }
            _ => TatpTxn::DeleteCallForwarding {
                s_id,
                sf_type: rng.random_range(1..=4),
                start_time: start(rng),
            },
        }
    }
}

impl Workload for Tatp {
    /// Every table is keyed by the subscriber id, shifted past the row's own fields
    /// (LOTUS §4.2: TATP shards by subscriber).
    fn critical_field(&self, table: TableId) -> Option<CriticalField> {
        let shift = match table {
            SUBSCRIBER => 0,
            ACCESS_INFO | SPECIAL_FACILITY => 2,
            CALL_FORWARDING => 4,
            _ => return None,
        };
        Some(CriticalField {
            shift,
            bits: 64 - shift,
        })
    }

    type Txn = TatpTxn;
    type Generator = TatpGenerator;

    fn name(&self) -> &'static str {
        "tatp"
    }

    /// Every table is keyed by `s_id` in `1..=subscribers` packed with at most four more
    /// bits ([`ai_key`], [`sf_key`], [`cf_key`]): SUBSCRIBER fills its space, ACCESS_INFO and
    /// SPECIAL_FACILITY 62 %, CALL_FORWARDING 23 % (fewer slots than a hashed index with
    /// room for its inserts).
    fn key_space(&self, table: TableId) -> Option<u64> {
        let ids = self.config.subscribers + 1;
        match table {
            SUBSCRIBER => Some(ids),
            ACCESS_INFO | SPECIAL_FACILITY => Some(ids << 2),
            CALL_FORWARDING => Some(ids << 4),
            _ => None,
        }
    }

    fn tables(&self) -> Vec<TableSpec> {
        let p = self.config.subscribers;
        // Expectations: 2.5 access infos and 2.5 special facilities per subscriber, 1.5 call
        // forwardings per special facility.
        vec![
            TableSpec {
                id: SUBSCRIBER,
                name: "SUBSCRIBER",
                value_size: SubscriberRecord::SIZE,
                expected_records: p,
                grows: false,
            },
            TableSpec {
                id: ACCESS_INFO,
                name: "ACCESS_INFO",
                value_size: AccessInfoRecord::SIZE,
                expected_records: p * 5 / 2,
                grows: false,
            },
            TableSpec {
                id: SPECIAL_FACILITY,
                name: "SPECIAL_FACILITY",
                value_size: SpecialFacilityRecord::SIZE,
                expected_records: p * 5 / 2,
                grows: false,
            },
            TableSpec {
                id: CALL_FORWARDING,
                name: "CALL_FORWARDING",
                value_size: CallForwardingRecord::SIZE,
                expected_records: p * 15 / 4,
                grows: true,
            },
        ]
    }

    fn txn_types(&self) -> &[TxnType] {
        &self.types
    }

    fn loader(&self) -> Box<dyn Iterator<Item = (TableId, Key, Vec<u8>)> + Send + '_> {
        Box::new(TatpLoader {
            tatp: self,
            next_s_id: 1,
            buffer: Vec::with_capacity(21),
        })
    }

    fn generator(&self, coordinator: u32, seed: u64) -> TatpGenerator {
        TatpGenerator {
            rng: rng_for(seed, u64::from(coordinator)),
            mix: Mix::new(self.config.weights),
            subscribers: self.config.subscribers,
        }
    }

    async fn run<T: Transaction>(&self, txn: &TatpTxn, tx: &mut T) -> Result<Outcome, TxnError> {
        const DONE: Outcome = Outcome::Commit { delta: 0 };
        match *txn {
            TatpTxn::GetSubscriberData { s_id } => {
                round(tx, &[rd(SUBSCRIBER, s_id)])
                    .await?
                    .req::<SubscriberRecord>()?;
                Ok(DONE)
            }
            TatpTxn::GetNewDestination {
                s_id,
                sf_type,
                start_time,
                end_time,
            } => {
                // Round 1: the special facility; round 2, only if it is active: the call
                // forwardings with start_time <= t.
                let sf: Option<SpecialFacilityRecord> =
                    round(tx, &[rd(SPECIAL_FACILITY, sf_key(s_id, sf_type))])
                        .await?
                        .opt()?;
                if sf.is_none_or(|sf| sf.is_active != 1) {
                    return Ok(Outcome::CommitMissed("no active special facility"));
                }
                let reqs: Vec<ReadReq> = START_TIMES
                    .iter()
                    .filter(|&&st| st <= start_time)
                    .map(|&st| rd(CALL_FORWARDING, cf_key(s_id, sf_type, st)))
                    .collect();
                let mut cfs = round(tx, &reqs).await?;
                let mut found = false;
                for _ in &reqs {
                    let cf: Option<CallForwardingRecord> = cfs.opt()?;
                    found |= cf.is_some_and(|cf| end_time < cf.end_time);
                }
                Ok(if found {
                    DONE
                } else {
                    Outcome::CommitMissed("no call forwarding")
                })
            }
            TatpTxn::GetAccessData { s_id, ai_type } => {
                let ai: Option<AccessInfoRecord> =
                    round(tx, &[rd(ACCESS_INFO, ai_key(s_id, ai_type))])
                        .await?
                        .opt()?;
                Ok(if ai.is_some() {
                    DONE
                } else {
                    Outcome::CommitMissed("no access info")
                })
            }
            TatpTxn::UpdateSubscriberData {
                s_id,
                bit_1,
                sf_type,
                data_a,
            } => {
                let key = sf_key(s_id, sf_type);
                let mut values =
                    round(tx, &[upd(SUBSCRIBER, s_id), upd(SPECIAL_FACILITY, key)]).await?;
                let mut sub: SubscriberRecord = values.req()?;
                let sf: Option<SpecialFacilityRecord> = values.opt()?;
                sub.bits = U16::new((sub.bits.get() & !1) | u16::from(bit_1));
                tx.write(SUBSCRIBER, Key(s_id), &sub.encode()).await?;
                match sf {
                    None => Ok(Outcome::CommitMissed("no special facility")),
                    Some(mut sf) => {
                        sf.data_a = data_a;
                        tx.write(SPECIAL_FACILITY, Key(key), &sf.encode()).await?;
                        Ok(DONE)
                    }
                }
            }
            TatpTxn::UpdateLocation { s_id, vlr_location } => {
                let mut sub: SubscriberRecord = round(tx, &[upd(SUBSCRIBER, s_id)]).await?.req()?;
                sub.vlr_location = U32::new(vlr_location);
                tx.write(SUBSCRIBER, Key(s_id), &sub.encode()).await?;
                Ok(DONE)
            }
            TatpTxn::InsertCallForwarding {
                s_id,
                sf_type,
                start_time,
                end_time,
                numberx,
            } => {
                // Round 1: the special facility (the foreign key); round 2, only if it is
                // present: the call forwarding to insert, for update.
                let sf: Option<SpecialFacilityRecord> =
                    round(tx, &[rd(SPECIAL_FACILITY, sf_key(s_id, sf_type))])
                        .await?
                        .opt()?;
                if sf.is_none() {
                    return Ok(Outcome::Rollback("no special facility"));
                }
                let key = cf_key(s_id, sf_type, start_time);
                if round(tx, &[upd(CALL_FORWARDING, key)]).await?.present() {
                    return Ok(Outcome::Rollback("call forwarding exists"));
                }
                let cf = CallForwardingRecord { end_time, numberx };
                tx.insert(CALL_FORWARDING, Key(key), &cf.encode()).await?;
                Ok(DONE)
            }
            TatpTxn::DeleteCallForwarding {
                s_id,
                sf_type,
                start_time,
            } => {
                let key = cf_key(s_id, sf_type, start_time);
                if !round(tx, &[upd(CALL_FORWARDING, key)]).await?.present() {
                    return Ok(Outcome::CommitMissed("no call forwarding"));
                }
                tx.delete(CALL_FORWARDING, Key(key)).await?;
                Ok(DONE)
            }
        }
    }

    fn check<F>(&self, read: F, _committed_delta: i64) -> Vec<Violation>
    where
        F: Fn(TableId, Key) -> Option<Vec<u8>>,
    {
        let mut violations = Vec::new();
        for s_id in 1..=self.config.subscribers {
            match peek::<SubscriberRecord>(&read, SUBSCRIBER, s_id) {
                None => violations.push(Violation::Missing {
                    table: "SUBSCRIBER",
                    key: s_id,
                }),
                Some(Err(len)) => violations.push(Violation::Malformed {
                    table: "SUBSCRIBER",
                    key: s_id,
                    detail: format!("{len} bytes"),
                }),
                Some(Ok(sub)) if sub.sub_nbr != sub_nbr(s_id) => {
                    violations.push(Violation::Malformed {
                        table: "SUBSCRIBER",
                        key: s_id,
                        detail: "sub_nbr is not the subscriber's".into(),
                    });
                }
                Some(Ok(_)) => {}
            }
            for sf_type in 1..=4u8 {
                let sf_present = read(SPECIAL_FACILITY, Key(sf_key(s_id, sf_type))).is_some();
                for start_time in START_TIMES {
                    let key = cf_key(s_id, sf_type, start_time);
                    match peek::<CallForwardingRecord>(&read, CALL_FORWARDING, key) {
                        None => {}
                        Some(Err(len)) => violations.push(Violation::Malformed {
                            table: "CALL_FORWARDING",
                            key,
                            detail: format!("{len} bytes"),
                        }),
                        Some(Ok(_)) if !sf_present => {
                            violations.push(Violation::TatpOrphanCallForwarding {
                                s_id,
                                sf_type,
                                start_time,
                            });
                        }
                        Some(Ok(_)) => {}
                    }
                }
            }
        }
        violations
    }
}
