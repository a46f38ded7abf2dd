//! The dmem workloads: what the papers run on their transaction systems, written once against
//! the [`dmem_txn::Transaction`] API so that every protocol runs the same code.
//!
//! | workload | module | source |
//! |---|---|---|
//! | KVS micro (ReadOne / UpdateOne, 8-byte keys, 40-byte values) | [`kv`] | LOTUS §8.1–§8.2, Pandora §6 |
//! | YCSB-style mixes (A, B, C, F, read-only, read-intensive) | [`kv`] | OOCC §VI (Q1, Q2, Q4, Q5) |
//! | SmallBank (2 tables, 6 transaction types) | [`smallbank`] | LOTUS §8.1, Dandelion §8, Pandora §6 |
//! | TATP (4 tables, 7 transaction types, 80 % read-only) | [`tatp`] | LOTUS §8.1, OOCC §VI, Dandelion §8 |
//! | TPC-C (9 tables + 3 index tables, 5 transactions) on a hash index | [`tpcc`] | LOTUS §8.1, OOCC Table IV, Pandora §6 |
//! | List append (bounded lists, unique elements), for the value-based checker | [`append`](mod@append) | Elle (VLDB 2020) |
//!
//! Every workload implements [`Workload`]:
//!
//! * its **schema** ([`Workload::tables`]): table ids, names, fixed value sizes, record counts;
//! * a **loader** ([`Workload::loader`]): a streaming iterator of the initial records
//!   `(TableId, Key, Vec<u8>)`, whose memory does not grow with the data set;
//! * a **generator** per coordinator ([`Workload::generator`]), seeded from a `u64` and
//!   deterministic on every platform (xoshiro256++), producing transactions as plain values;
//! * the **mix** as data ([`Workload::txn_types`]): name, read-only or not, weight;
//! * [`Workload::run`], which performs one transaction's reads and writes through any
//!   [`Transaction`] — the reads as rounds ([`Transaction::read_round`], one per dependent
//!   step; the README lists each type's rounds), then the writes; the caller begins, runs, then commits or aborts ([`execute`] does that,
//!   with retries of protocol aborts);
//! * [`Workload::check`], the benchmark's consistency conditions over a final state.
//!
//! [`AnyWorkload`] picks one of the six by name at run time, and [`reference`](mod@reference) holds a serial
//! in-memory store implementing [`Transaction`] for tests and as an oracle.
//!
//! Record layouts are `#[repr(C)]` zerocopy structs with little-endian fields and alignment 1
//! ([`record`]); key packings are documented per workload.
#![forbid(unsafe_code)]

pub mod any;
pub mod append;
pub mod dist;
pub mod invariants;
pub mod kv;
pub mod record;
pub mod reference;
pub mod smallbank;
pub mod tatp;
pub mod tpcc;

use core::fmt;
use core::future::Future;

use dmem_txn::{Coordinator, CriticalField, Key, TableId, Transaction, TxnError, TxnKind};

pub use any::{AnyGenerator, AnyWorkload, TxnSpec, UnknownWorkload, WORKLOAD_NAMES};
pub use invariants::Violation;
pub use reference::ReferenceStore;

/// One table of a workload's schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSpec {
    /// Its id (unique within the workload, dense from 0).
    pub id: TableId,
    /// Its name (the benchmark's table name).
    pub name: &'static str,
    /// The fixed size of every value in the table, in bytes.
    pub value_size: usize,
    /// Records after loading: exact, except for TATP's randomly sized fan-outs (1–4 access
    /// infos and special facilities, 0–3 call forwardings each), where it is the expectation.
    pub expected_records: u64,
    /// Whether transactions insert records into this table as they run, so that it grows
    /// (TPC-C ORDER, NEW-ORDER, ORDER-LINE, HISTORY), or insert and delete (TATP
    /// CALL_FORWARDING).
    pub grows: bool,
}

/// One transaction type of a workload's mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnType {
    /// The benchmark's name for it (used for per-type statistics).
    pub name: &'static str,
    /// Whether it is declared read-only.
    pub kind: TxnKind,
    /// Its weight in the mix; the share is `weight / sum of weights` (the standard mixes are
    /// given in percent, so the weights are percentages there).
    pub weight: u32,
}

/// The per-type percentages of a mix, in the order of the types.
#[must_use]
pub fn mix_percentages(types: &[TxnType]) -> Vec<f64> {
    let total: u64 = types.iter().map(|t| u64::from(t.weight)).sum();
    types
        .iter()
        .map(|t| {
            if total == 0 {
                0.0
            } else {
                100.0 * f64::from(t.weight) / total as f64
            }
        })
        .collect()
}

/// What a generated transaction says about itself.
pub trait TxnInfo {
    /// Its type, as an index into [`Workload::txn_types`].
    fn type_index(&self) -> usize;
    /// Whether it is read-only (it is begun with this kind).
    fn kind(&self) -> TxnKind;
    /// The first record it accesses, if known before it runs: where a router that places
    /// read-write transactions by the shard of their first record sends it (LOTUS §4.3).
    fn first_record(&self) -> Option<(TableId, Key)> {
        None
    }
}

/// A per-coordinator source of transactions.
pub trait TxnGenerator {
    /// The transactions it produces.
    type Txn;
    /// The next transaction.
    fn next_txn(&mut self) -> Self::Txn;
}

/// How [`Workload::run`] wants the transaction to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Commit it. `delta` is its change to the workload's conserved quantity, which the
    /// caller sums over committed transactions and hands to [`Workload::check`]: money added
    /// to the bank for SmallBank, record updates for KVS/YCSB, 0 elsewhere.
    Commit {
        /// Change to the conserved quantity.
        delta: i64,
    },
    /// Commit it, but the benchmark counts it as unsuccessful because a row it looked for is
    /// absent (TATP reports these separately; e.g. GET_ACCESS_DATA of a missing ai_type).
    CommitMissed(&'static str),
    /// The benchmark itself rolls it back (a "user abort": SmallBank insufficient funds, the
    /// 1 % of TPC-C New-Order with an unused item, a TATP insert of an existing row). Abort it
    /// and do not retry.
    Rollback(&'static str),
}

/// A benchmark workload. See the crate docs for what each method is for.
pub trait Workload {
    /// A generated transaction: type and parameters.
    type Txn: TxnInfo + Clone + fmt::Debug;
    /// The per-coordinator generator.
    type Generator: TxnGenerator<Txn = Self::Txn>;

    /// The workload's name (`kvs`, `ycsb`, `smallbank`, `tatp`, `tpcc`).
    fn name(&self) -> &'static str;

    /// Its tables.
    fn tables(&self) -> Vec<TableSpec>;

    /// Its transaction types with their mix weights; [`TxnInfo::type_index`] indexes this.
    fn txn_types(&self) -> &[TxnType];

    /// The initial records, streamed: memory stays proportional to one record (or one small
    /// group of records that are generated together, like a TATP subscriber's rows).
    /// Deterministic: the same workload value yields the same records in the same order.
    fn loader(&self) -> Box<dyn Iterator<Item = (TableId, Key, Vec<u8>)> + Send + '_>;

    /// A generator for one coordinator. `coordinator` must be unique among the coordinators
    /// of a run (TPC-C derives unique HISTORY keys from it); `seed` makes it deterministic.
    fn generator(&self, coordinator: u32, seed: u64) -> Self::Generator;

    /// Performs `txn`'s reads and writes in `tx`: the reads as rounds
    /// ([`Transaction::read_round`]), each holding every record whose key (and whether it is
    /// read at all) is known by then, then the writes. On `Ok`, the caller commits (or, for
    /// [`Outcome::Rollback`], aborts); on `Err`, the caller aborts and retries if
    /// [`TxnError::is_retryable`].
    fn run<T: Transaction>(
        &self,
        txn: &Self::Txn,
        tx: &mut T,
    ) -> impl Future<Output = Result<Outcome, TxnError>>;

    /// Checks the benchmark's consistency conditions over a final state read through `read`
    /// (no transaction may run meanwhile). `committed_delta` is the sum of
    /// [`Outcome::Commit`] deltas of the committed transactions. Returns every violation
    /// found (empty when consistent).
    fn check<F>(&self, read: F, committed_delta: i64) -> Vec<Violation>
    where
        F: Fn(TableId, Key) -> Option<Vec<u8>>;

    /// Where `table`'s critical field sits in its keys (LOTUS §4.2), if it has one.
    fn critical_field(&self, table: TableId) -> Option<CriticalField> {
        let _ = table;
        None
    }

    /// `Some(k)` when `table`'s keys all lie in `0..k` and fill a good part of it (dense
    /// integer keys): a store may then index it directly, one slot per key of the space, with
    /// no hashing slack (`dmem-store`'s direct-mapped tables). `None`: keys are sparse.
    fn key_space(&self, table: TableId) -> Option<u64> {
        let _ = table;
        None
    }

    /// Records a transaction inserts into `table` at most, on average over the mix: each
    /// type's largest insert count into it weighted by the type's share (0 for a table no
    /// transaction inserts into). A run's insert room is sized from it and the run's
    /// transaction bound (`dmem_harness::run_spec`). `None`: not known, the store's default
    /// room applies (as many inserts again as loaded records).
    fn inserts_per_txn(&self, table: TableId) -> Option<f64> {
        let _ = table;
        None
    }

    /// Per transaction type that writes, the records one transaction of it writes at most
    /// (locks for update, updates, inserts or deletes), as `(table, records)` pairs. A
    /// protocol that logs a transaction's write set sizes its per-coordinator log region
    /// from the largest of these in its own log format (`dmem_deploy::DeploySpec::
    /// write_sets`). Empty (the default): every write set fits the protocols' default
    /// region of 4 KiB, which SmallBank's, TATP's and KVS/YCSB's do.
    fn write_sets(&self) -> Vec<Vec<(TableId, u32)>> {
        Vec::new()
    }

    /// Bytes of values after loading (records × value size over all tables), the data a
    /// memory node holds without index, replicas or protocol metadata.
    fn value_bytes(&self) -> u64 {
        self.tables()
            .iter()
            .map(|t| t.expected_records * t.value_size as u64)
            .sum()
    }
}

/// Size presets. `Small` is the default and fits a 24 GiB machine with room; the paper
/// presets are the papers' sizes (this crate's README, "Sizes per preset"). DecLock's and
/// OOCC's code use FORD's sizes. Where a paper gives no size for a workload, its preset uses
/// `Small`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Scale {
    /// For unit tests and smoke runs: tiny tables (TPC-C with reduced cardinalities, which
    /// the TPC-C specification does not allow for a measured run).
    Tiny,
    #[default]
    /// The default: KVS/YCSB 1M keys, SmallBank 100k accounts (4k hot), TATP 100k
    /// subscribers, TPC-C 8 warehouses.
    Small,
    /// FORD's code (also Pandora, DecLock, OOCC): SmallBank 100k/4k hot, TATP 100k, TPC-C 8.
    Ford,
    /// Motor's code: SmallBank 10M/400k hot, TATP 2M, TPC-C 24.
    Motor,
    /// LOTUS §8.1: KVS 20M pairs, TATP 3M, SmallBank 20M, TPC-C 105.
    Lotus,
}

impl Scale {
    /// Every preset.
    pub const ALL: [Scale; 5] = [
        Scale::Tiny,
        Scale::Small,
        Scale::Ford,
        Scale::Motor,
        Scale::Lotus,
    ];

    /// Its name (`tiny`, `small`, `ford`, `motor`, `lotus`).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Scale::Tiny => "tiny",
            Scale::Small => "small",
            Scale::Ford => "ford",
            Scale::Motor => "motor",
            Scale::Lotus => "lotus",
        }
    }

    /// The preset with this name.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Scale> {
        Scale::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// How [`execute`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Executed {
    /// Committed after `attempts` tries.
    Committed {
        /// What `run` asked for ([`Outcome::Commit`] or [`Outcome::CommitMissed`]).
        outcome: Outcome,
        /// Tries, including the committed one.
        attempts: u32,
    },
    /// Rolled back by the benchmark's own rule ([`Outcome::Rollback`]); not retried.
    RolledBack {
        /// Why.
        reason: &'static str,
        /// Tries, including the rolled-back one.
        attempts: u32,
    },
    /// Gave up: a non-retryable error, or still aborting after `max_attempts` tries.
    Failed {
        /// The last error.
        error: TxnError,
        /// Tries made.
        attempts: u32,
    },
}

/// What the retry loop does between a failed attempt and the next try of the same
/// transaction (a backoff policy: `dmem-harness`'s `Backoff`).
pub trait Pause {
    /// Resolves when the next try may begin; `failed` tries of this transaction have
    /// failed so far (at least 1).
    fn before_retry(&mut self, failed: u32) -> impl core::future::Future<Output = ()>;
}

/// Retry at once: the next try begins as soon as the failed one has aborted.
#[derive(Debug, Clone, Copy, Default)]
pub struct RetryAtOnce;

impl Pause for RetryAtOnce {
    async fn before_retry(&mut self, _failed: u32) {}
}

/// Runs one transaction to its end: begin, [`Workload::run`], commit or abort, and retry
/// protocol aborts ([`TxnError::is_retryable`]) as new transactions up to `max_attempts`
/// tries in all (the benchmarks retry aborted transactions with the same parameters), at
/// once ([`RetryAtOnce`]).
pub async fn execute<W: Workload, C: Coordinator>(
    workload: &W,
    coordinator: &mut C,
    txn: &W::Txn,
    max_attempts: u32,
) -> Executed {
    execute_noting(
        workload,
        coordinator,
        txn,
        max_attempts,
        &mut RetryAtOnce,
        |_| {},
    )
    .await
}

/// [`execute`], waiting `pause` out before every retry and calling `on_error` with the
/// error of every attempt that failed (aborts by reason, for the benchmarks' statistics).
/// The one retry loop of the benchmarks.
pub async fn execute_noting<W: Workload, C: Coordinator>(
    workload: &W,
    coordinator: &mut C,
    txn: &W::Txn,
    max_attempts: u32,
    pause: &mut impl Pause,
    mut on_error: impl FnMut(&TxnError),
) -> Executed {
    let mut attempts = 0;
    loop {
        if attempts > 0 {
            pause.before_retry(attempts).await;
        }
        attempts += 1;
        let mut tx = match coordinator.begin(txn.kind()).await {
            Ok(tx) => tx,
            Err(error) => {
                on_error(&error);
                if error.is_retryable() && attempts < max_attempts {
                    continue;
                }
                return Executed::Failed { error, attempts };
            }
        };
        let error = match workload.run(txn, &mut tx).await {
            Ok(Outcome::Rollback(reason)) => {
                tx.abort().await;
                return Executed::RolledBack { reason, attempts };
            }
            Ok(outcome) => match tx.commit().await {
                Ok(()) => return Executed::Committed { outcome, attempts },
                Err(e) => e,
            },
            Err(e) => {
                tx.abort().await;
                e
            }
        };
        on_error(&error);
        if !error.is_retryable() || attempts >= max_attempts {
            return Executed::Failed { error, attempts };
        }
    }
}

#[cfg(test)]
mod retry_tests {
    use super::*;
    use crate::reference::block_on;

    /// A coordinator whose every transaction aborts as it begins.
    struct AlwaysAborts {
        begun: u32,
    }

    impl Coordinator for AlwaysAborts {
        type Txn<'a> = dmem_txn::BoxTransaction<'a>;

        async fn begin(&mut self, _kind: TxnKind) -> Result<Self::Txn<'_>, TxnError> {
            self.begun += 1;
            Err(TxnError::Aborted(dmem_txn::AbortReason::ByTheCaller))
        }
    }

    /// Notes the failed-try counts it is asked to wait after.
    #[derive(Default)]
    struct Noting(Vec<u32>);

    impl Pause for Noting {
        async fn before_retry(&mut self, failed: u32) {
            self.0.push(failed);
        }
    }

    #[test]
    fn the_pause_comes_between_tries_with_the_failed_count() {
        let workload = AnyWorkload::new("smallbank", Scale::Tiny).expect("known");
        let txn = workload.generator(0, 1).next_txn();
        let mut co = AlwaysAborts { begun: 0 };
        let mut pause = Noting::default();
        let mut errors = 0;
        let executed = block_on(execute_noting(
            &workload,
            &mut co,
            &txn,
            4,
            &mut pause,
            |_| errors += 1,
        ));
        assert!(matches!(executed, Executed::Failed { attempts: 4, .. }));
        assert_eq!((co.begun, errors), (4, 4));
        // No wait before the first try nor after the last.
        assert_eq!(pause.0, [1, 2, 3]);
    }
}
