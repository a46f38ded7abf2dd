//! What [`Workload::check`](crate::Workload::check) reports.

use core::fmt;

/// One consistency violation found in a final state.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// A record the workload never deletes is absent.
    Missing {
        /// Table name.
        table: &'static str,
        /// Its key.
        key: u64,
    },
    /// A record has the wrong size or contents that no transaction writes.
    Malformed {
        /// Table name.
        table: &'static str,
        /// Its key.
        key: u64,
        /// What is wrong.
        detail: String,
    },
    /// KVS/YCSB: the update counters of all records do not add up to the number of committed
    /// record updates (a lost or phantom update).
    KvUpdateCount {
        /// Committed record updates.
        expected: i64,
        /// Sum of the counters.
        found: i64,
    },
    /// SmallBank: total money ≠ initial total + committed deposits and withdrawals.
    SmallBankTotal {
        /// Initial total + sum of committed deltas, in cents.
        expected: i128,
        /// Sum of every savings and checking balance, in cents.
        found: i128,
    },
    /// SmallBank: a savings balance is negative (TransactSavings rolls back instead).
    SmallBankNegativeSavings {
        /// The account.
        account: u64,
        /// Its balance in cents.
        balance: i64,
    },
    /// TATP: a CALL_FORWARDING row whose SPECIAL_FACILITY row is absent (the foreign key of
    /// the TATP schema).
    TatpOrphanCallForwarding {
        /// Subscriber.
        s_id: u64,
        /// Special facility type.
        sf_type: u8,
        /// Start time.
        start_time: u8,
    },
    /// TPC-C consistency condition 1 (clause 3.3.2.1): `W_YTD = sum(D_YTD)`.
    TpccCondition1 {
        /// Warehouse.
        w_id: u32,
        /// W_YTD in cents.
        w_ytd: i64,
        /// Sum of its districts' D_YTD in cents.
        sum_d_ytd: i64,
    },
    /// TPC-C consistency condition 2 (clause 3.3.2.2):
    /// `D_NEXT_O_ID - 1 = max(O_ID) = max(NO_O_ID)` (the NEW-ORDER part only when the
    /// district has new orders).
    TpccCondition2 {
        /// Warehouse.
        w_id: u32,
        /// District.
        d_id: u32,
        /// D_NEXT_O_ID.
        next_o_id: u32,
        /// max(O_ID) of the district, if it has orders.
        max_o_id: Option<u32>,
        /// max(NO_O_ID) of the district, if it has new orders.
        max_no_o_id: Option<u32>,
    },
    /// TPC-C consistency condition 3 (clause 3.3.2.3):
    /// `max(NO_O_ID) - min(NO_O_ID) + 1 = number of NEW-ORDER rows` of the district.
    TpccCondition3 {
        /// Warehouse.
        w_id: u32,
        /// District.
        d_id: u32,
        /// min(NO_O_ID).
        min_no_o_id: u32,
        /// max(NO_O_ID).
        max_no_o_id: u32,
        /// NEW-ORDER rows.
        rows: u64,
    },
    /// TPC-C consistency condition 4 (clause 3.3.2.4):
    /// `sum(O_OL_CNT) = number of ORDER-LINE rows` of the district.
    TpccCondition4 {
        /// Warehouse.
        w_id: u32,
        /// District.
        d_id: u32,
        /// sum(O_OL_CNT).
        sum_ol_cnt: u64,
        /// ORDER-LINE rows.
        rows: u64,
    },
    /// TPC-C adaptation: the district's NEW_ORDER_HEAD is not its oldest undelivered order
    /// (min(NO_O_ID), or D_NEXT_O_ID when there is none).
    TpccNewOrderHead {
        /// Warehouse.
        w_id: u32,
        /// District.
        d_id: u32,
        /// The head's value.
        head: u32,
        /// What it should be.
        expected: u32,
    },
    /// TPC-C adaptation: CUSTOMER_LAST_ORDER names an order that is absent or belongs to
    /// another customer.
    TpccLastOrder {
        /// Warehouse.
        w_id: u32,
        /// District.
        d_id: u32,
        /// Customer.
        c_id: u32,
        /// The order id the index holds.
        o_id: u32,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
