//! TPC-C (TPC Benchmark C, Standard Specification 5.11) on a hash index only, as FORD and
//! Motor run it (LOTUS §8.1, OOCC Table IV, Pandora §6).
//!
//! # Tables and key packing
//!
//! Keys pack the ids into a `u64`, most significant first:
//!
//! ```text
//! 63        48 47     40 39                          8 7        0
//! +-----------+---------+-----------------------------+----------+
//! |   w_id    |  d_id   |  c_id / o_id / i_id / name  |  ol_num  |
//! +-----------+---------+-----------------------------+----------+
//! ```
//!
//! | id | table | key | value |
//! |---|---|---|---|
//! | 0 | WAREHOUSE | `w` | [`WarehouseRecord`] 96 B |
//! | 1 | DISTRICT | `w, d` | [`DistrictRecord`] 104 B |
//! | 2 | CUSTOMER | `w, d, c` | [`CustomerRecord`] 672 B |
//! | 3 | HISTORY | loaded: `w, d, c`; inserted: bit 63 set, coordinator in bits 62–40, sequence in 39–0 | [`HistoryRecord`] 64 B |
//! | 4 | NEW_ORDER | `w, d, o` | [`NewOrderRecord`] 8 B |
//! | 5 | ORDER | `w, d, o` | [`OrderRecord`] 24 B |
//! | 6 | ORDER_LINE | `w, d, o, ol` | [`OrderLineRecord`] 56 B |
//! | 7 | ITEM | `i` (w = 0) | [`ItemRecord`] 88 B |
//! | 8 | STOCK | `w, i` | [`StockRecord`] 312 B |
//! | 9 | CUSTOMER_NAME_INDEX | `w, d, name number` | [`CustomerNameIndexRecord`] 8 B |
//! | 10 | CUSTOMER_LAST_ORDER | `w, d, c` | [`CustomerLastOrderRecord`] 8 B |
//! | 11 | NEW_ORDER_HEAD | `w, d` | [`NewOrderHeadRecord`] 8 B |
//!
//! Warehouses are limited to `2^15 − 1` so that bit 63 tells generated HISTORY keys apart.
//! Money is integer cents; tax and discount rates are in units of 1/10,000.
//!
//! # The hash-only adaptation
//!
//! Tables 0–8 are the nine TPC-C tables with the specification's columns. A hash index has
//! no range scans and no secondary indexes, so:
//!
//! 1. **Customer by last name** (Payment and Order-Status, 60 %): the specification selects
//!    the customers of a district with a given C_LAST sorted by C_FIRST and takes the one at
//!    position ⌈n/2⌉. C_LAST and C_FIRST never change, so the loader computes that customer
//!    once per (district, last name) and stores it in **CUSTOMER_NAME_INDEX**; the
//!    transaction reads the index row, then the customer. Read-only after loading.
//! 2. **Order-Status**'s "most recent order of the customer" (max O_ID with O_C_ID = c) is
//!    **CUSTOMER_LAST_ORDER**, a per-customer row that New-Order writes in the transaction
//!    that inserts the order (the index on ORDER(w, d, c, o) a SQL system maintains). A
//!    separate table rather than a CUSTOMER column, so New-Order does not write the 672-byte
//!    customer row and conflict with Payment on it, which the specification's New-Order
//!    does not do. Order-Status then reads the order and its lines 1..O_OL_CNT by key.
//! 3. **Delivery**'s "oldest undelivered order" (min NO_O_ID of a district) is
//!    **NEW_ORDER_HEAD**, a per-district counter that Delivery reads, advances and writes
//!    with the NEW-ORDER row it deletes; a separate table rather than a DISTRICT column, so
//!    Delivery does not conflict with New-Order and Payment on the district row. New orders
//!    get consecutive ids and Delivery takes the oldest, so the undelivered orders of a
//!    district are exactly `[head, D_NEXT_O_ID)`; a missing NEW-ORDER row at `head` means
//!    none is outstanding and the district is skipped (clause 2.7.4.2).
//! 4. **Stock-Level** reads D_NEXT_O_ID, then the orders `D_NEXT_O_ID − 20 ..` by key (each
//!    ORDER row for its O_OL_CNT), their lines by key, and the STOCK row of each distinct
//!    item (the specification joins ORDER-LINE and STOCK over that id range).
//! 5. Order-line ids within a New-Order are **distinct items** (redrawn on a repeat), so a
//!    transaction never reads-for-update the same STOCK row twice.
//!
//! Everything else follows the specification: the 1 % of New-Orders whose last item id is
//! unused roll back (clause 2.4.1.4), 1 % of order lines come from a remote warehouse, 15 %
//! of Payments pay through a remote warehouse, 60 % select the customer by last name, C_DATA
//! is rewritten for bad-credit customers, NURand with run-time constants obeying clause
//! 2.1.6.1, and the loader follows clause 4.3.3.1. Generators draw the warehouse uniformly
//! per transaction (as FORD's and Motor's drivers do) rather than binding a terminal to one
//! warehouse and district; Stock-Level draws its district. Timestamps (O_ENTRY_D,
//! OL_DELIVERY_D, H_DATE) are logical: a per-generator counter.
//!
//! # Mix
//!
//! New-Order 45, Payment 43, Order-Status 4, Delivery 4, Stock-Level 4 (clause 5.2.3's
//! minimums, 92 % read-write as LOTUS §8.1 says); OOCC's 45/40/4/4/4 is [`OOCC_MIX`].
//!
//! # Invariants
//!
//! [`Workload::check`](crate::Workload::check) evaluates consistency conditions 1–4 (clause 3.3.2) exactly: ids are
//! dense, so it enumerates each district's orders `1..D_NEXT_O_ID` (and probes a few ids
//! above) and order lines `1..=15` by key. It also checks the adaptation's own tables:
//! NEW_ORDER_HEAD = min(NO_O_ID) (or D_NEXT_O_ID), and CUSTOMER_LAST_ORDER names an order
//! of that customer.

mod check;
mod load;
mod txn;

use dmem_txn::TableId;
use static_assertions::const_assert_eq;
use zerocopy::little_endian::{I64, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::dist::NuRandConstants;
use crate::record::Record;
use crate::{Scale, TxnType};

pub use txn::{
    CustomerSelector, DeliveryParams, NewOrderParams, OrderItem, OrderStatusParams, PaymentParams,
    StockLevelParams, TpccGenerator, TpccTxn,
};

/// WAREHOUSE.
pub const WAREHOUSE: TableId = TableId(0);
/// DISTRICT.
pub const DISTRICT: TableId = TableId(1);
/// CUSTOMER.
pub const CUSTOMER: TableId = TableId(2);
/// HISTORY.
pub const HISTORY: TableId = TableId(3);
/// NEW-ORDER.
pub const NEW_ORDER: TableId = TableId(4);
/// ORDER.
pub const ORDER: TableId = TableId(5);
/// ORDER-LINE.
pub const ORDER_LINE: TableId = TableId(6);
/// ITEM.
pub const ITEM: TableId = TableId(7);
/// STOCK.
pub const STOCK: TableId = TableId(8);
/// Adaptation: (district, C_LAST) → the customer the specification's by-name lookup picks.
pub const CUSTOMER_NAME_INDEX: TableId = TableId(9);
/// Adaptation: customer → id of its most recent order.
pub const CUSTOMER_LAST_ORDER: TableId = TableId(10);
/// Adaptation: district → its oldest undelivered order id.
pub const NEW_ORDER_HEAD: TableId = TableId(11);

/// Table names by id.
pub const TABLE_NAMES: [&str; 12] = [
    "WAREHOUSE",
    "DISTRICT",
    "CUSTOMER",
    "HISTORY",
    "NEW_ORDER",
    "ORDER",
    "ORDER_LINE",
    "ITEM",
    "STOCK",
    "CUSTOMER_NAME_INDEX",
    "CUSTOMER_LAST_ORDER",
    "NEW_ORDER_HEAD",
];

/// The highest order-line number (clause 2.4.1.3: 5 to 15 lines).
pub const MAX_ORDER_LINES: u32 = 15;

/// WAREHOUSE key.
#[must_use]
pub const fn warehouse_key(w: u32) -> u64 {
    (w as u64) << 48
}

/// DISTRICT (and NEW_ORDER_HEAD) key.
#[must_use]
pub const fn district_key(w: u32, d: u32) -> u64 {
    warehouse_key(w) | (d as u64) << 40
}

/// CUSTOMER, CUSTOMER_LAST_ORDER and loaded HISTORY key.
#[must_use]
pub const fn customer_key(w: u32, d: u32, c: u32) -> u64 {
    district_key(w, d) | (c as u64) << 8
}

/// ORDER and NEW_ORDER key.
#[must_use]
pub const fn order_key(w: u32, d: u32, o: u32) -> u64 {
    district_key(w, d) | (o as u64) << 8
}

/// ORDER_LINE key.
#[must_use]
pub const fn order_line_key(w: u32, d: u32, o: u32, ol: u32) -> u64 {
    order_key(w, d, o) | ol as u64
}

/// ITEM key.
#[must_use]
pub const fn item_key(i: u32) -> u64 {
    (i as u64) << 8
}

/// STOCK key.
#[must_use]
pub const fn stock_key(w: u32, i: u32) -> u64 {
    warehouse_key(w) | (i as u64) << 8
}

/// CUSTOMER_NAME_INDEX key (`name` is the C_LAST number 0–999).
#[must_use]
pub const fn name_index_key(w: u32, d: u32, name: u32) -> u64 {
    district_key(w, d) | (name as u64) << 8
}

/// The key of a HISTORY row inserted by Payment: bit 63, then the coordinator (23 bits) and
/// its sequence number (40 bits).
#[must_use]
pub const fn generated_history_key(coordinator: u32, seq: u64) -> u64 {
    1 << 63 | ((coordinator as u64) & ((1 << 23) - 1)) << 40 | (seq & ((1 << 40) - 1))
}

macro_rules! record {
    ($(#[$m:meta])* $name:ident, $size:expr, { $($(#[$fm:meta])* $f:ident : $t:ty),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
        #[repr(C)]
        pub struct $name { $($(#[$fm])* pub $f: $t),* }
        const_assert_eq!(size_of::<$name>(), $size);
        impl Record for $name {}
    };
}

record!(
    /// A WAREHOUSE row.
    WarehouseRecord, 96, {
    /// W_YTD, cents.
    w_ytd: I64,
    /// W_TAX, 1/10,000.
    w_tax: U32,
    /// W_NAME.
    w_name: [u8; 10],
    /// W_STREET_1.
    w_street_1: [u8; 20],
    /// W_STREET_2.
    w_street_2: [u8; 20],
    /// W_CITY.
    w_city: [u8; 20],
    /// W_STATE.
    w_state: [u8; 2],
    /// W_ZIP.
    w_zip: [u8; 9],
    /// Padding.
    _pad: [u8; 3],
});

record!(
    /// A DISTRICT row.
    DistrictRecord, 104, {
    /// D_YTD, cents.
    d_ytd: I64,
    /// D_TAX, 1/10,000.
    d_tax: U32,
    /// D_NEXT_O_ID.
    d_next_o_id: U32,
    /// D_NAME.
    d_name: [u8; 10],
    /// D_STREET_1.
    d_street_1: [u8; 20],
    /// D_STREET_2.
    d_street_2: [u8; 20],
    /// D_CITY.
    d_city: [u8; 20],
    /// D_STATE.
    d_state: [u8; 2],
    /// D_ZIP.
    d_zip: [u8; 9],
    /// Padding.
    _pad: [u8; 7],
});

record!(
    /// A CUSTOMER row (672 bytes, the size LOTUS and FORD quote).
    CustomerRecord, 672, {
    /// C_BALANCE, cents.
    c_balance: I64,
    /// C_YTD_PAYMENT, cents.
    c_ytd_payment: I64,
    /// C_CREDIT_LIM, cents.
    c_credit_lim: I64,
    /// C_SINCE (logical time).
    c_since: U64,
    /// C_DISCOUNT, 1/10,000.
    c_discount: U32,
    /// C_PAYMENT_CNT.
    c_payment_cnt: U32,
    /// C_DELIVERY_CNT.
    c_delivery_cnt: U32,
    /// C_FIRST.
    c_first: [u8; 16],
    /// C_MIDDLE.
    c_middle: [u8; 2],
    /// C_LAST.
    c_last: [u8; 16],
    /// C_STREET_1.
    c_street_1: [u8; 20],
    /// C_STREET_2.
    c_street_2: [u8; 20],
    /// C_CITY.
    c_city: [u8; 20],
    /// C_STATE.
    c_state: [u8; 2],
    /// C_ZIP.
    c_zip: [u8; 9],
    /// C_PHONE.
    c_phone: [u8; 16],
    /// C_CREDIT ("GC" or "BC").
    c_credit: [u8; 2],
    /// C_DATA.
    c_data: [u8; 500],
    /// Padding.
    _pad: [u8; 5],
});

record!(
    /// A HISTORY row.
    HistoryRecord, 64, {
    /// H_DATE (logical time).
    h_date: U64,
    /// H_AMOUNT, cents.
    h_amount: I64,
    /// H_C_ID.
    h_c_id: U32,
    /// H_C_D_ID.
    h_c_d_id: U32,
    /// H_C_W_ID.
    h_c_w_id: U32,
    /// H_D_ID.
    h_d_id: U32,
    /// H_W_ID.
    h_w_id: U32,
    /// H_DATA.
    h_data: [u8; 24],
    /// Padding.
    _pad: [u8; 4],
});

record!(
    /// A NEW-ORDER row.
    NewOrderRecord, 8, {
    /// NO_O_ID (also in the key).
    no_o_id: U32,
    /// Padding.
    _pad: [u8; 4],
});

record!(
    /// An ORDER row.
    OrderRecord, 24, {
    /// O_ENTRY_D (logical time).
    o_entry_d: U64,
    /// O_C_ID.
    o_c_id: U32,
    /// O_CARRIER_ID (0 = null).
    o_carrier_id: U32,
    /// O_OL_CNT.
    o_ol_cnt: U32,
    /// O_ALL_LOCAL.
    o_all_local: U32,
});

record!(
    /// An ORDER-LINE row.
    OrderLineRecord, 56, {
    /// OL_DELIVERY_D (logical time, 0 = null).
    ol_delivery_d: U64,
    /// OL_AMOUNT, cents.
    ol_amount: I64,
    /// OL_I_ID.
    ol_i_id: U32,
    /// OL_SUPPLY_W_ID.
    ol_supply_w_id: U32,
    /// OL_QUANTITY.
    ol_quantity: U32,
    /// OL_DIST_INFO.
    ol_dist_info: [u8; 24],
    /// Padding.
    _pad: [u8; 4],
});

record!(
    /// An ITEM row.
    ItemRecord, 88, {
    /// I_PRICE, cents.
    i_price: I64,
    /// I_IM_ID.
    i_im_id: U32,
    /// I_NAME.
    i_name: [u8; 24],
    /// I_DATA.
    i_data: [u8; 50],
    /// Padding.
    _pad: [u8; 2],
});

record!(
    /// A STOCK row.
    StockRecord, 312, {
    /// S_YTD.
    s_ytd: U64,
    /// S_QUANTITY.
    s_quantity: U32,
    /// S_ORDER_CNT.
    s_order_cnt: U32,
    /// S_REMOTE_CNT.
    s_remote_cnt: U32,
    /// S_DIST_01 … S_DIST_10.
    s_dist: [[u8; 24]; 10],
    /// S_DATA.
    s_data: [u8; 50],
    /// Padding.
    _pad: [u8; 2],
});

record!(
    /// A CUSTOMER_NAME_INDEX row (adaptation 1).
    CustomerNameIndexRecord, 8, {
    /// The customer at position ⌈n/2⌉ by C_FIRST among the district's customers with this
    /// C_LAST.
    c_id: U32,
    /// n, the number of such customers.
    count: U32,
});

record!(
    /// A CUSTOMER_LAST_ORDER row (adaptation 2).
    CustomerLastOrderRecord, 8, {
    /// The customer's most recent O_ID.
    o_id: U32,
    /// Padding.
    _pad: [u8; 4],
});

record!(
    /// A NEW_ORDER_HEAD row (adaptation 3).
    NewOrderHeadRecord, 8, {
    /// The district's oldest undelivered O_ID (D_NEXT_O_ID when none).
    o_id: U32,
    /// Padding.
    _pad: [u8; 4],
});

/// The type names, in `type_index` order.
pub const TYPE_NAMES: [&str; 5] = [
    "NewOrder",
    "Payment",
    "OrderStatus",
    "Delivery",
    "StockLevel",
];

/// The standard mix (clause 5.2.3), percent.
pub const STANDARD_MIX: [u32; 5] = [45, 43, 4, 4, 4];

/// OOCC's mix (Table IV), as weights.
pub const OOCC_MIX: [u32; 5] = [45, 40, 4, 4, 4];

/// Parameters. The cardinalities other than `warehouses` are the specification's (clause
/// 4.3.3.1) except in [`TpccConfig::tiny`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpccConfig {
    /// Warehouses (1 to 32,767).
    pub warehouses: u32,
    /// Districts per warehouse (10).
    pub districts: u32,
    /// Customers per district (3,000); also the initial orders per district.
    pub customers: u32,
    /// Items (100,000).
    pub items: u32,
    /// Undelivered orders per district after loading (900).
    pub initial_new_orders: u32,
    /// Mix weights in [`TYPE_NAMES`] order.
    pub weights: [u32; 5],
    /// Percentage of New-Orders that roll back on an unused item (1).
    pub rollback_percent: u32,
    /// Percentage of order lines supplied by a remote warehouse (1).
    pub remote_line_percent: u32,
    /// Percentage of Payments through a remote warehouse (15).
    pub remote_payment_percent: u32,
    /// Percentage of Payments and Order-Status selecting the customer by last name (60).
    pub by_name_percent: u32,
    /// Seed of the population and of the NURand constants.
    pub load_seed: u64,
}

impl TpccConfig {
    /// The specification's cardinalities with `warehouses` warehouses.
    #[must_use]
    pub fn with_warehouses(warehouses: u32) -> Self {
        Self {
            warehouses,
            districts: 10,
            customers: 3_000,
            items: 100_000,
            initial_new_orders: 900,
            weights: STANDARD_MIX,
            rollback_percent: 1,
            remote_line_percent: 1,
            remote_payment_percent: 15,
            by_name_percent: 60,
            load_seed: 0x7bcc,
        }
    }

    /// Reduced cardinalities for tests (2 warehouses, 10 districts of 60 customers, 1,000
    /// items, 18 undelivered orders per district). Not a valid TPC-C database.
    #[must_use]
    pub fn tiny() -> Self {
        Self {
            warehouses: 2,
            customers: 60,
            items: 1_000,
            initial_new_orders: 18,
            ..Self::with_warehouses(2)
        }
    }

    /// A preset: tiny as [`TpccConfig::tiny`], small and ford 8 warehouses, motor 24, lotus
    /// 105.
    #[must_use]
    pub fn preset(scale: Scale) -> Self {
        match scale {
            Scale::Tiny => Self::tiny(),
            Scale::Small | Scale::Ford => Self::with_warehouses(8),
            Scale::Motor => Self::with_warehouses(24),
            Scale::Lotus => Self::with_warehouses(105),
        }
    }

    /// The number of distinct last names (1,000, fewer with fewer customers).
    #[must_use]
    pub fn last_names(&self) -> u32 {
        self.customers.min(1000)
    }
}

/// The TPC-C workload.
#[derive(Debug, Clone)]
pub struct Tpcc {
    config: TpccConfig,
    types: [TxnType; 5],
    nurand: NuRandConstants,
}

impl Tpcc {
    /// A workload with this configuration.
    ///
    /// # Panics
    /// On cardinalities the key packing or the loader cannot hold: warehouses outside
    /// `1..2^15`, districts outside `1..=255`, no customers, no items,
    /// `initial_new_orders > customers`.
    #[must_use]
    pub fn new(config: TpccConfig) -> Self {
        assert!(config.warehouses >= 1 && config.warehouses < 1 << 15);
        assert!(config.districts >= 1 && config.districts <= 255);
        assert!(config.customers >= 1 && config.items >= 1);
        assert!(config.initial_new_orders <= config.customers);
        let types = core::array::from_fn(|i| TxnType {
            name: TYPE_NAMES[i],
            kind: if matches!(i, 2 | 4) {
                dmem_txn::TxnKind::ReadOnly
            } else {
                dmem_txn::TxnKind::ReadWrite
            },
            weight: config.weights[i],
        });
        let nurand = NuRandConstants::new(config.load_seed);
        Self {
            config,
            types,
            nurand,
        }
    }

    /// Its configuration.
    #[must_use]
    pub const fn config(&self) -> &TpccConfig {
        &self.config
    }

    /// The NURand constants of this run.
    #[must_use]
    pub const fn nurand(&self) -> NuRandConstants {
        self.nurand
    }
}

/// The syllables of C_LAST (clause 4.3.2.3).
const SYLLABLES: [&[u8]; 10] = [
    b"BAR", b"OUGHT", b"ABLE", b"PRI", b"PRES", b"ESE", b"ANTI", b"CALLY", b"ATION", b"EING",
];

/// C_LAST for a number 0–999: the syllables of its three digits (clause 4.3.2.3).
#[must_use]
pub fn last_name(number: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(15);
    for digit in [number / 100, (number / 10) % 10, number % 10] {
        out.extend_from_slice(SYLLABLES[digit as usize]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_names_follow_the_syllables() {
        assert_eq!(last_name(0), b"BARBARBAR");
        assert_eq!(last_name(371), b"PRICALLYOUGHT");
        assert_eq!(last_name(999), b"EINGEINGEING");
    }

    #[test]
    fn keys_do_not_collide_across_fields() {
        assert_ne!(order_line_key(1, 2, 3, 4), order_key(1, 2, 3));
        assert_ne!(stock_key(1, 5), warehouse_key(1));
        assert_eq!(order_line_key(1, 2, 3, 4) >> 48, 1);
        assert!(generated_history_key(7, 9) >> 63 == 1);
        assert!(customer_key((1 << 15) - 1, 255, u32::MAX) >> 63 == 0);
    }
}
