//! SmallBank (Alomari et al., ICDE 2008; the H-Store benchmark LOTUS §8.1, Pandora §6 and
//! Dandelion §8 run): a bank with a savings and a checking account per customer.
//!
//! # Tables
//!
//! | id | table | key | value (16 B) |
//! |---|---|---|---|
//! | 0 | SAVINGS | account id (`0..accounts`) | [`AccountRecord`] |
//! | 1 | CHECKING | account id | [`AccountRecord`] |
//!
//! The ACCOUNTS table of the original schema (customer name → id) is left out, as FORD,
//! Motor and LOTUS do: transactions carry account ids. Balances are integer cents. Initial
//! balances are uniform in [10,000.00, 50,000.00] per account and table.
//!
//! # Transactions and mix (the H-Store default)
//!
//! | type | % | kind | effect | total money |
//! |---|---|---|---|---|
//! | Amalgamate(a, b) | 15 | RW | move a's savings + checking into b's checking | unchanged |
//! | Balance(a) | 15 | RO | read a's savings and checking | unchanged |
//! | DepositChecking(a, v) | 15 | RW | checking += v (v < 0 rolls back) | **+ v** |
//! | SendPayment(a, b, v) | 25 | RW | a's checking −= v, b's += v; rolls back if a's checking < v | unchanged |
//! | TransactSavings(a, v) | 15 | RW | savings += v; rolls back if that goes negative | **+ v** |
//! | WriteCheck(a, v) | 15 | RW | checking −= v, or v + 1 (a penalty) if savings + checking < v | **− v or −(v + 1)** |
//!
//! 85 % read-write (LOTUS §8.1). Amounts are the H-Store driver's: 1.30 (deposit), 20.20
//! (transact savings), 5.00 (write check, send payment).
//!
//! Accounts are drawn as FORD's code does: with probability `hot_percent` uniformly from the
//! `hot_accounts` first ids, else uniformly from the others; two-account types draw distinct
//! accounts.
//!
//! # Invariants
//!
//! Three types change the bank's total. [`Workload::run`] returns each transaction's change
//! as [`Outcome::Commit`]'s `delta`; the caller sums it over *committed* transactions, and
//! [`Workload::check`] verifies `Σ balances = initial total + Σ deltas` (conservation under
//! Amalgamate and SendPayment, exact accounting of the rest). It also checks every record is
//! present, carries its own account id, and that no savings balance is negative.

use dmem_txn::{CriticalField, Key, ReadReq, TableId, Transaction, TxnError, TxnKind};
use rand::RngExt;
use static_assertions::const_assert_eq;
use zerocopy::little_endian::{I64, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::dist::{Mix, WorkloadRng, mix64, rng_for};
use crate::invariants::Violation;
use crate::record::{Record, peek, rd, round, upd};
use crate::{Outcome, Scale, TableSpec, TxnGenerator, TxnInfo, TxnType, Workload};

/// SAVINGS.
pub const SAVINGS: TableId = TableId(0);
/// CHECKING.
pub const CHECKING: TableId = TableId(1);

/// A savings or checking balance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct AccountRecord {
    /// Balance in cents.
    pub balance: I64,
    /// The account id (the key), to detect values written under the wrong key.
    pub owner: U64,
}
const_assert_eq!(size_of::<AccountRecord>(), 16);
impl Record for AccountRecord {}

/// Lowest initial balance, in cents.
pub const MIN_BALANCE: i64 = 1_000_000; // 10,000.00
/// Highest initial balance, in cents.
pub const MAX_BALANCE: i64 = 5_000_000; // 50,000.00

/// Parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmallBankConfig {
    /// Accounts (`0..accounts`).
    pub accounts: u64,
    /// Hot accounts (the first ids).
    pub hot_accounts: u64,
    /// Percentage of account draws that go to the hot set.
    pub hot_percent: u32,
    /// Mix weights in [`TYPE_NAMES`] order.
    pub weights: [u32; 6],
    /// DepositChecking amount, cents.
    pub deposit_checking_amount: i64,
    /// TransactSavings amount, cents.
    pub transact_savings_amount: i64,
    /// WriteCheck amount, cents.
    pub write_check_amount: i64,
    /// SendPayment amount, cents.
    pub send_payment_amount: i64,
    /// Seed of the initial balances.
    pub load_seed: u64,
}

/// The type names, in `type_index` order.
pub const TYPE_NAMES: [&str; 6] = [
    "Amalgamate",
    "Balance",
    "DepositChecking",
    "SendPayment",
    "TransactSavings",
    "WriteCheck",
];

/// The H-Store mix, percent.
pub const STANDARD_MIX: [u32; 6] = [15, 15, 15, 25, 15, 15];

impl SmallBankConfig {
    /// A preset: tiny 1,000/40 hot, small and ford 100k/4k, motor 10M/400k, lotus 20M/800k
    /// (LOTUS gives no hot set; it keeps FORD's and Motor's 4 %). 90 % of draws go to the hot
    /// set (FORD).
    #[must_use]
    pub fn preset(scale: Scale) -> Self {
        let (accounts, hot_accounts) = match scale {
            Scale::Tiny => (1_000, 40),
            Scale::Small | Scale::Ford => (100_000, 4_000),
            Scale::Motor => (10_000_000, 400_000),
            Scale::Lotus => (20_000_000, 800_000),
        };
        Self {
            accounts,
            hot_accounts,
            hot_percent: 90,
            weights: STANDARD_MIX,
            deposit_checking_amount: 130,
            transact_savings_amount: 2020,
            write_check_amount: 500,
            send_payment_amount: 500,
            load_seed: 0x5ba1_1ba4,
        }
    }
}

/// A generated SmallBank transaction (amounts in cents).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmallBankTxn {
    /// Move all of `from`'s money into `to`'s checking.
    Amalgamate {
        /// Emptied account.
        from: u64,
        /// Receiving account.
        to: u64,
    },
    /// Read both balances.
    Balance {
        /// The account.
        account: u64,
    },
    /// Add `amount` to checking.
    DepositChecking {
        /// The account.
        account: u64,
        /// Amount.
        amount: i64,
    },
    /// Move `amount` between checking accounts.
    SendPayment {
        /// Payer.
        from: u64,
        /// Payee.
        to: u64,
        /// Amount.
        amount: i64,
    },
    /// Add `amount` to savings.
    TransactSavings {
        /// The account.
        account: u64,
        /// Amount (may be negative).
        amount: i64,
    },
    /// Cash a check of `amount` against checking.
    WriteCheck {
        /// The account.
        account: u64,
        /// Amount.
        amount: i64,
    },
}

impl TxnInfo for SmallBankTxn {
    fn first_record(&self) -> Option<(TableId, Key)> {
        Some(match *self {
            SmallBankTxn::Amalgamate { from, .. } => (SAVINGS, Key(from)),
            SmallBankTxn::Balance { account }
            | SmallBankTxn::TransactSavings { account, .. }
            | SmallBankTxn::WriteCheck { account, .. } => (SAVINGS, Key(account)),
            SmallBankTxn::DepositChecking { account, .. } => (CHECKING, Key(account)),
            SmallBankTxn::SendPayment { from, .. } => (CHECKING, Key(from)),
        })
    }

    fn type_index(&self) -> usize {
        match self {
            SmallBankTxn::Amalgamate { .. } => 0,
            SmallBankTxn::Balance { .. } => 1,
            SmallBankTxn::DepositChecking { .. } => 2,
            SmallBankTxn::SendPayment { .. } => 3,
            SmallBankTxn::TransactSavings { .. } => 4,
            SmallBankTxn::WriteCheck { .. } => 5,
        }
    }

    fn kind(&self) -> TxnKind {
        match self {
            SmallBankTxn::Balance { .. } => TxnKind::ReadOnly,
            _ => TxnKind::ReadWrite,
        }
    }
}

/// The SmallBank workload.
#[derive(Debug, Clone)]
pub struct SmallBank {
    config: SmallBankConfig,
    types: [TxnType; 6],
}

impl SmallBank {
    /// A workload with this configuration.
    ///
    /// # Panics
    /// If there are fewer than 2 accounts, `hot_accounts` is 0 or above `accounts`, or
    /// `hot_percent > 100`.
    #[must_use]
    pub fn new(config: SmallBankConfig) -> Self {
        assert!(
            config.accounts >= 2,
            "two-account transactions need 2 accounts"
        );
        assert!(config.hot_accounts >= 1 && config.hot_accounts <= config.accounts);
        assert!(config.hot_percent <= 100);
        let types = core::array::from_fn(|i| TxnType {
            name: TYPE_NAMES[i],
            kind: if i == 1 {
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
    pub const fn config(&self) -> &SmallBankConfig {
        &self.config
    }

    /// The initial balance of `account` in `table`, cents.
    #[must_use]
    pub fn initial_balance(&self, table: TableId, account: u64) -> i64 {
        let h = mix64(self.config.load_seed ^ mix64(account.wrapping_mul(2) + u64::from(table.0)));
        MIN_BALANCE + (h % (MAX_BALANCE - MIN_BALANCE + 1) as u64) as i64
    }

    /// The money in the bank after loading, cents.
    #[must_use]
    pub fn initial_total(&self) -> i128 {
        (0..self.config.accounts)
            .map(|a| {
                i128::from(self.initial_balance(SAVINGS, a))
                    + i128::from(self.initial_balance(CHECKING, a))
            })
            .sum()
    }
}

fn account(balance: i64, owner: u64) -> Vec<u8> {
    AccountRecord {
        balance: I64::new(balance),
        owner: U64::new(owner),
    }
    .encode()
}

/// The per-coordinator generator of [`SmallBank`].
#[derive(Debug, Clone)]
pub struct SmallBankGenerator {
    rng: WorkloadRng,
    mix: Mix,
    config: SmallBankConfig,
}

impl SmallBankGenerator {
    fn account(&mut self) -> u64 {
        let c = &self.config;
        let hot = self.rng.random_range(0..100u32) < c.hot_percent || c.hot_accounts == c.accounts;
        if hot {
            self.rng.random_range(0..c.hot_accounts)
        } else {
            self.rng.random_range(c.hot_accounts..c.accounts)
        }
    }

    fn two_accounts(&mut self) -> (u64, u64) {
        let a = self.account();
        loop {
            let b = self.account();
            if b != a {
                return (a, b);
            }
        }
    }
}

impl TxnGenerator for SmallBankGenerator {
    type Txn = SmallBankTxn;

    fn next_txn(&mut self) -> SmallBankTxn {
        match self.mix.pick(&mut self.rng) {
            0 => {
                let (from, to) = self.two_accounts();
                SmallBankTxn::Amalgamate { from, to }
            }
            1 => SmallBankTxn::Balance {
                account: self.account(),
            },
            2 => SmallBankTxn::DepositChecking {
                account: self.account(),
                amount: self.config.deposit_checking_amount,
            },
            3 => {
                let (from, to) = self.two_accounts();
                SmallBankTxn::SendPayment {
                    from,
                    to,
                    amount: self.config.send_payment_amount,
                }
            }
            4 => SmallBankTxn::TransactSavings {
                account: self.account(),
                amount: self.config.transact_savings_amount,
            },
            _ => SmallBankTxn::WriteCheck {
                account: self.account(),
                amount: self.config.write_check_amount,
            },
        }
    }
}

/// One round of SmallBank balance reads; the balances come back in request order.
async fn balances<T: Transaction, const N: usize>(
    tx: &mut T,
    reqs: [ReadReq; N],
) -> Result<[i64; N], TxnError> {
    let mut values = round(tx, &reqs).await?;
    let mut out = [0; N];
    for b in &mut out {
        *b = values.req::<AccountRecord>()?.balance.get();
    }
    Ok(out)
}

async fn set<T: Transaction>(
    tx: &mut T,
    table: TableId,
    acct: u64,
    bal: i64,
) -> Result<(), TxnError> {
    tx.write(table, Key(acct), &account(bal, acct)).await
}

impl Workload for SmallBank {
    /// Both tables are keyed by the account (LOTUS §4.2).
    fn critical_field(&self, _table: TableId) -> Option<CriticalField> {
        Some(CriticalField::WHOLE_KEY)
    }

    /// Accounts are `0..accounts` in both tables.
    fn key_space(&self, _table: TableId) -> Option<u64> {
        Some(self.config.accounts)
    }

    type Txn = SmallBankTxn;
    type Generator = SmallBankGenerator;

    fn name(&self) -> &'static str {
        "smallbank"
    }

    fn tables(&self) -> Vec<TableSpec> {
        [(SAVINGS, "SAVINGS"), (CHECKING, "CHECKING")]
            .into_iter()
            .map(|(id, name)| TableSpec {
                id,
                name,
                value_size: AccountRecord::SIZE,
                expected_records: self.config.accounts,
                grows: false,
            })
            .collect()
    }

    fn txn_types(&self) -> &[TxnType] {
        &self.types
    }

    fn loader(&self) -> Box<dyn Iterator<Item = (TableId, Key, Vec<u8>)> + Send + '_> {
        Box::new((0..self.config.accounts).flat_map(move |a| {
            [SAVINGS, CHECKING].map(|t| (t, Key(a), account(self.initial_balance(t, a), a)))
        }))
    }

    fn generator(&self, coordinator: u32, seed: u64) -> SmallBankGenerator {
        SmallBankGenerator {
            rng: rng_for(seed, u64::from(coordinator)),
            mix: Mix::new(self.config.weights),
            config: self.config.clone(),
        }
    }

    async fn run<T: Transaction>(
        &self,
        txn: &SmallBankTxn,
        tx: &mut T,
    ) -> Result<Outcome, TxnError> {
        let delta = match *txn {
            SmallBankTxn::Amalgamate { from, to } => {
                let [sav, chk, to_chk] = balances(
                    tx,
                    [upd(SAVINGS, from), upd(CHECKING, from), upd(CHECKING, to)],
                )
                .await?;
                set(tx, SAVINGS, from, 0).await?;
                set(tx, CHECKING, from, 0).await?;
                set(tx, CHECKING, to, to_chk + sav + chk).await?;
                0
            }
            SmallBankTxn::Balance { account } => {
                balances(tx, [rd(SAVINGS, account), rd(CHECKING, account)]).await?;
                0
            }
            SmallBankTxn::DepositChecking { account, amount } => {
                if amount < 0 {
                    return Ok(Outcome::Rollback("negative deposit"));
                }
                let [chk] = balances(tx, [upd(CHECKING, account)]).await?;
                set(tx, CHECKING, account, chk + amount).await?;
                amount
            }
            SmallBankTxn::SendPayment { from, to, amount } => {
                let [from_chk, to_chk] =
                    balances(tx, [upd(CHECKING, from), upd(CHECKING, to)]).await?;
                if from_chk < amount {
                    return Ok(Outcome::Rollback("insufficient funds"));
                }
                set(tx, CHECKING, from, from_chk - amount).await?;
                set(tx, CHECKING, to, to_chk + amount).await?;
                0
            }
            SmallBankTxn::TransactSavings { account, amount } => {
                let [sav] = balances(tx, [upd(SAVINGS, account)]).await?;
                if sav + amount < 0 {
                    return Ok(Outcome::Rollback("negative savings"));
                }
                set(tx, SAVINGS, account, sav + amount).await?;
                amount
            }
            SmallBankTxn::WriteCheck { account, amount } => {
                let [sav, chk] =
                    balances(tx, [rd(SAVINGS, account), upd(CHECKING, account)]).await?;
                let debit = if sav + chk < amount {
                    amount + 1
                } else {
                    amount
                };
                set(tx, CHECKING, account, chk - debit).await?;
                -debit
            }
        };
        Ok(Outcome::Commit { delta })
    }

    fn check<F>(&self, read: F, committed_delta: i64) -> Vec<Violation>
    where
        F: Fn(TableId, Key) -> Option<Vec<u8>>,
    {
        let mut violations = Vec::new();
        let mut total: i128 = 0;
        for a in 0..self.config.accounts {
            for (table, name) in [(SAVINGS, "SAVINGS"), (CHECKING, "CHECKING")] {
                match peek::<AccountRecord>(&read, table, a) {
                    None => violations.push(Violation::Missing {
                        table: name,
                        key: a,
                    }),
                    Some(Err(len)) => violations.push(Violation::Malformed {
                        table: name,
                        key: a,
                        detail: format!("{len} bytes"),
                    }),
                    Some(Ok(r)) => {
                        if r.owner.get() != a {
                            violations.push(Violation::Malformed {
                                table: name,
                                key: a,
                                detail: format!("owner {}", r.owner.get()),
                            });
                        }
                        let b = r.balance.get();
                        if table == SAVINGS && b < 0 {
                            violations.push(Violation::SmallBankNegativeSavings {
                                account: a,
                                balance: b,
                            });
                        }
                        total += i128::from(b);
                    }
                }
            }
        }
        let expected = self.initial_total() + i128::from(committed_delta);
        if total != expected {
            violations.push(Violation::SmallBankTotal {
                expected,
                found: total,
            });
        }
        violations
    }
}
