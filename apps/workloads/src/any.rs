//! One of the workloads, chosen by name at run time.

use core::fmt;

use dmem_txn::{Key, TableId, Transaction, TxnError, TxnKind};

use crate::append::{AppendConfig, ListAppend, ListGenerator, ListTxn};
use crate::invariants::Violation;
use crate::kv::{KvConfig, KvGenerator, KvTxn, KvWorkload, YcsbMix};
use crate::smallbank::{SmallBank, SmallBankConfig, SmallBankGenerator, SmallBankTxn};
use crate::tatp::{Tatp, TatpConfig, TatpGenerator, TatpTxn};
use crate::tpcc::{Tpcc, TpccConfig, TpccGenerator, TpccTxn};
use crate::{Outcome, Scale, TableSpec, TxnGenerator, TxnInfo, TxnType, Workload};

/// The names [`AnyWorkload::new`] accepts.
pub const WORKLOAD_NAMES: [&str; 6] = ["kvs", "ycsb", "smallbank", "tatp", "tpcc", "append"];

/// A name that is not in [`WORKLOAD_NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown workload {0:?} (known: kvs, ycsb, smallbank, tatp, tpcc, append)")]
pub struct UnknownWorkload(pub String);

/// One of the workloads.
#[derive(Debug, Clone)]
pub enum AnyWorkload {
    /// KVS or YCSB.
    Kv(KvWorkload),
    /// SmallBank.
    SmallBank(SmallBank),
    /// TATP.
    Tatp(Tatp),
    /// TPC-C.
    Tpcc(Tpcc),
    /// List append (Elle's), for the value-based checker.
    Append(ListAppend),
}

impl AnyWorkload {
    /// The list-append workload's side log, if this is it.
    #[must_use]
    pub fn append_log(&self) -> Option<&crate::append::AppendLog> {
        match self {
            AnyWorkload::Append(w) => Some(w.log()),
            _ => None,
        }
    }

    /// The workload `name` at preset `scale` with its default parameters (YCSB: the
    /// read-intensive mix).
    ///
    /// # Errors
    /// An unknown name.
    pub fn new(name: &str, scale: Scale) -> Result<Self, UnknownWorkload> {
        Ok(match name {
            "kvs" => AnyWorkload::Kv(KvWorkload::new(KvConfig::kvs(scale))),
            "ycsb" => AnyWorkload::Kv(KvWorkload::new(KvConfig::ycsb(
                scale,
                YcsbMix::ReadIntensive,
            ))),
            "smallbank" => AnyWorkload::SmallBank(SmallBank::new(SmallBankConfig::preset(scale))),
            "tatp" => AnyWorkload::Tatp(Tatp::new(TatpConfig::preset(scale))),
            "tpcc" => AnyWorkload::Tpcc(Tpcc::new(TpccConfig::preset(scale))),
            "append" => AnyWorkload::Append(ListAppend::new(AppendConfig::preset(scale))),
            _ => return Err(UnknownWorkload(name.to_owned())),
        })
    }
}

/// A transaction of any workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnSpec {
    /// KVS / YCSB.
    Kv(KvTxn),
    /// SmallBank.
    SmallBank(SmallBankTxn),
    /// TATP.
    Tatp(TatpTxn),
    /// TPC-C.
    Tpcc(TpccTxn),
    /// List append.
    Append(ListTxn),
}

impl TxnInfo for TxnSpec {
    fn first_record(&self) -> Option<(TableId, Key)> {
        match self {
            TxnSpec::Kv(t) => t.first_record(),
            TxnSpec::SmallBank(t) => t.first_record(),
            TxnSpec::Tatp(t) => t.first_record(),
            TxnSpec::Tpcc(t) => t.first_record(),
            TxnSpec::Append(t) => t.first_record(),
        }
    }

    fn type_index(&self) -> usize {
        match self {
            TxnSpec::Kv(t) => t.type_index(),
            TxnSpec::SmallBank(t) => t.type_index(),
            TxnSpec::Tatp(t) => t.type_index(),
            TxnSpec::Tpcc(t) => t.type_index(),
            TxnSpec::Append(t) => t.type_index(),
        }
    }

    fn kind(&self) -> TxnKind {
        match self {
            TxnSpec::Kv(t) => t.kind(),
            TxnSpec::SmallBank(t) => t.kind(),
            TxnSpec::Tatp(t) => t.kind(),
            TxnSpec::Tpcc(t) => t.kind(),
            TxnSpec::Append(t) => t.kind(),
        }
    }
}

/// The generator of an [`AnyWorkload`].
#[derive(Debug, Clone)]
pub enum AnyGenerator {
    /// KVS / YCSB.
    Kv(KvGenerator),
    /// SmallBank.
    SmallBank(SmallBankGenerator),
    /// TATP.
    Tatp(TatpGenerator),
    /// TPC-C.
    Tpcc(TpccGenerator),
    /// List append.
    Append(ListGenerator),
}

impl TxnGenerator for AnyGenerator {
    type Txn = TxnSpec;

    fn next_txn(&mut self) -> TxnSpec {
        match self {
            AnyGenerator::Kv(g) => TxnSpec::Kv(g.next_txn()),
            AnyGenerator::SmallBank(g) => TxnSpec::SmallBank(g.next_txn()),
            AnyGenerator::Tatp(g) => TxnSpec::Tatp(g.next_txn()),
            AnyGenerator::Tpcc(g) => TxnSpec::Tpcc(g.next_txn()),
            AnyGenerator::Append(g) => TxnSpec::Append(g.next_txn()),
        }
    }
}

fn mismatch(w: &AnyWorkload, t: &TxnSpec) -> ! {
    panic!(
        "a {:?} transaction run on the {} workload",
        t,
        Workload::name(w)
    )
}

impl Workload for AnyWorkload {
    type Txn = TxnSpec;
    type Generator = AnyGenerator;

    fn critical_field(&self, table: TableId) -> Option<dmem_txn::CriticalField> {
        match self {
            AnyWorkload::Kv(w) => w.critical_field(table),
            AnyWorkload::SmallBank(w) => w.critical_field(table),
            AnyWorkload::Tatp(w) => w.critical_field(table),
            AnyWorkload::Tpcc(w) => w.critical_field(table),
            AnyWorkload::Append(w) => w.critical_field(table),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            AnyWorkload::Kv(w) => w.name(),
            AnyWorkload::SmallBank(w) => w.name(),
            AnyWorkload::Tatp(w) => w.name(),
            AnyWorkload::Tpcc(w) => w.name(),
            AnyWorkload::Append(w) => w.name(),
        }
    }

    fn key_space(&self, table: TableId) -> Option<u64> {
        match self {
            AnyWorkload::Kv(w) => w.key_space(table),
            AnyWorkload::SmallBank(w) => w.key_space(table),
            AnyWorkload::Tatp(w) => w.key_space(table),
            AnyWorkload::Tpcc(w) => w.key_space(table),
            AnyWorkload::Append(w) => w.key_space(table),
        }
    }

    fn inserts_per_txn(&self, table: TableId) -> Option<f64> {
        match self {
            AnyWorkload::Kv(w) => w.inserts_per_txn(table),
            AnyWorkload::SmallBank(w) => w.inserts_per_txn(table),
            AnyWorkload::Tatp(w) => w.inserts_per_txn(table),
            AnyWorkload::Tpcc(w) => w.inserts_per_txn(table),
            AnyWorkload::Append(w) => w.inserts_per_txn(table),
        }
    }

    fn write_sets(&self) -> Vec<Vec<(TableId, u32)>> {
        match self {
            AnyWorkload::Kv(w) => w.write_sets(),
            AnyWorkload::SmallBank(w) => w.write_sets(),
            AnyWorkload::Tatp(w) => w.write_sets(),
            AnyWorkload::Tpcc(w) => w.write_sets(),
            AnyWorkload::Append(w) => w.write_sets(),
        }
    }

    fn tables(&self) -> Vec<TableSpec> {
        match self {
            AnyWorkload::Kv(w) => w.tables(),
            AnyWorkload::SmallBank(w) => w.tables(),
            AnyWorkload::Tatp(w) => w.tables(),
            AnyWorkload::Tpcc(w) => w.tables(),
            AnyWorkload::Append(w) => w.tables(),
        }
    }

    fn txn_types(&self) -> &[TxnType] {
        match self {
            AnyWorkload::Kv(w) => w.txn_types(),
            AnyWorkload::SmallBank(w) => w.txn_types(),
            AnyWorkload::Tatp(w) => w.txn_types(),
            AnyWorkload::Tpcc(w) => w.txn_types(),
            AnyWorkload::Append(w) => w.txn_types(),
        }
    }

    fn loader(&self) -> Box<dyn Iterator<Item = (TableId, Key, Vec<u8>)> + Send + '_> {
        match self {
            AnyWorkload::Kv(w) => w.loader(),
            AnyWorkload::SmallBank(w) => w.loader(),
            AnyWorkload::Tatp(w) => w.loader(),
            AnyWorkload::Tpcc(w) => w.loader(),
            AnyWorkload::Append(w) => w.loader(),
        }
    }

    fn generator(&self, coordinator: u32, seed: u64) -> AnyGenerator {
        match self {
            AnyWorkload::Kv(w) => AnyGenerator::Kv(w.generator(coordinator, seed)),
            AnyWorkload::SmallBank(w) => AnyGenerator::SmallBank(w.generator(coordinator, seed)),
            AnyWorkload::Tatp(w) => AnyGenerator::Tatp(w.generator(coordinator, seed)),
            AnyWorkload::Tpcc(w) => AnyGenerator::Tpcc(w.generator(coordinator, seed)),
            AnyWorkload::Append(w) => AnyGenerator::Append(w.generator(coordinator, seed)),
        }
    }

    /// # Panics
    /// If `txn` belongs to another workload.
    async fn run<T: Transaction>(&self, txn: &TxnSpec, tx: &mut T) -> Result<Outcome, TxnError> {
        match (self, txn) {
            (AnyWorkload::Kv(w), TxnSpec::Kv(t)) => w.run(t, tx).await,
            (AnyWorkload::SmallBank(w), TxnSpec::SmallBank(t)) => w.run(t, tx).await,
            (AnyWorkload::Tatp(w), TxnSpec::Tatp(t)) => w.run(t, tx).await,
            (AnyWorkload::Tpcc(w), TxnSpec::Tpcc(t)) => w.run(t, tx).await,
            (AnyWorkload::Append(w), TxnSpec::Append(t)) => w.run(t, tx).await,
            _ => mismatch(self, txn),
        }
    }

    fn check<F>(&self, read: F, committed_delta: i64) -> Vec<Violation>
    where
        F: Fn(TableId, Key) -> Option<Vec<u8>>,
    {
        match self {
            AnyWorkload::Kv(w) => w.check(read, committed_delta),
            AnyWorkload::SmallBank(w) => w.check(read, committed_delta),
            AnyWorkload::Tatp(w) => w.check(read, committed_delta),
            AnyWorkload::Tpcc(w) => w.check(read, committed_delta),
            AnyWorkload::Append(w) => w.check(read, committed_delta),
        }
    }
}

impl fmt::Display for AnyWorkload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(Workload::name(self))
    }
}
