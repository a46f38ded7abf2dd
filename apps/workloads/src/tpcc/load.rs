//! The TPC-C loader (clause 4.3.3.1), streaming.
//!
//! Order: ITEM, then per warehouse its WAREHOUSE row, STOCK, and per district its DISTRICT
//! and NEW_ORDER_HEAD rows, the CUSTOMER_NAME_INDEX, each customer's CUSTOMER, HISTORY and
//! CUSTOMER_LAST_ORDER rows, and each order's ORDER, ORDER-LINE and NEW-ORDER rows. Every row
//! group draws from its own random stream keyed by its primary key, so no row depends on the
//! load order. Memory: one row group plus, per district, the customers' last-name numbers
//! and the order → customer permutation (3,000 entries each).

use std::sync::Arc;

use dmem_txn::{Key, TableId};
use rand::RngExt;
use rand::seq::SliceRandom;
use zerocopy::little_endian::{I64, U32, U64};

use super::*;
use crate::dist::{WorkloadRng, astring, nstring, nurand, rng_for};
use crate::record::put_str;

/// The logical time of loading (O_ENTRY_D, C_SINCE, H_DATE of loaded rows).
pub(super) const LOAD_TIME: u64 = 1;

type Row = (TableId, Key, Vec<u8>);

// Stream tags, so row groups of different tables never share a random stream.
const TAG_ITEM: u64 = 1 << 56;
const TAG_STOCK: u64 = 2 << 56;
const TAG_WAREHOUSE: u64 = 3 << 56;
const TAG_DISTRICT: u64 = 4 << 56;
const TAG_FIRST: u64 = 5 << 56;
const TAG_LAST: u64 = 6 << 56;
const TAG_CUSTOMER: u64 = 7 << 56;
const TAG_PERM: u64 = 8 << 56;
const TAG_ORDER: u64 = 9 << 56;

fn row(table: TableId, key: u64, value: Vec<u8>) -> Row {
    (table, Key(key), value)
}

/// `s` with "ORIGINAL" at a random position in 10 % of the rows (clauses 4.3.3.1 I_DATA,
/// S_DATA).
fn data_with_original(rng: &mut WorkloadRng, out: &mut [u8]) {
    let len = astring(rng, out, 26, 50);
    if rng.random_range(0..10) == 0 {
        let at = rng.random_range(0..=len - 8);
        out[at..at + 8].copy_from_slice(b"ORIGINAL");
    }
}

fn address(rng: &mut WorkloadRng, parts: [&mut [u8]; 3], state: &mut [u8; 2], zip: &mut [u8; 9]) {
    for p in parts {
        astring(rng, p, 10, 20);
    }
    for b in state.iter_mut() {
        *b = b'A' + rng.random_range(0..26u8);
    }
    nstring(rng, &mut zip[..4], 4, 4);
    zip[4..].copy_from_slice(b"11111");
}

/// Per-district loading context.
struct DistrictCtx {
    w: u32,
    d: u32,
    /// C_LAST number of customer `c` at `[c - 1]`.
    last: Vec<u32>,
    /// O_C_ID of order `o` at `[o - 1]` (a random permutation, clause 4.3.3.1).
    order_customer: Vec<u32>,
    /// The order of customer `c` at `[c - 1]`.
    customer_order: Vec<u32>,
}

impl Tpcc {
    fn first_name(&self, w: u32, d: u32, c: u32) -> [u8; 16] {
        let mut rng = rng_for(self.config.load_seed ^ TAG_FIRST, customer_key(w, d, c));
        let mut first = [0u8; 16];
        astring(&mut rng, &mut first, 8, 16);
        first
    }

    fn last_number(&self, w: u32, d: u32, c: u32) -> u32 {
        let names = self.config.last_names();
        if c <= names {
            c - 1
        } else {
            let mut rng = rng_for(self.config.load_seed ^ TAG_LAST, customer_key(w, d, c));
            nurand(
                &mut rng,
                255,
                self.nurand.c_last_load,
                0,
                u64::from(names) - 1,
            ) as u32
        }
    }

    fn district_ctx(&self, w: u32, d: u32) -> DistrictCtx {
        let n = self.config.customers;
        let last = (1..=n).map(|c| self.last_number(w, d, c)).collect();
        let mut order_customer: Vec<u32> = (1..=n).collect();
        order_customer.shuffle(&mut rng_for(
            self.config.load_seed ^ TAG_PERM,
            district_key(w, d),
        ));
        let mut customer_order = vec![0; n as usize];
        for (o, &c) in order_customer.iter().enumerate() {
            customer_order[c as usize - 1] = o as u32 + 1;
        }
        DistrictCtx {
            w,
            d,
            last,
            order_customer,
            customer_order,
        }
    }

    fn item_row(&self, i: u32) -> Row {
        let mut rng = rng_for(self.config.load_seed ^ TAG_ITEM, item_key(i));
        let mut item = ItemRecord {
            i_price: I64::new(rng.random_range(100..=10_000)),
            i_im_id: U32::new(rng.random_range(1..=10_000)),
            i_name: [0; 24],
            i_data: [0; 50],
            _pad: [0; 2],
        };
        astring(&mut rng, &mut item.i_name, 14, 24);
        data_with_original(&mut rng, &mut item.i_data);
        row(ITEM, item_key(i), item.encode())
    }

    fn warehouse_row(&self, w: u32) -> Row {
        let mut rng = rng_for(self.config.load_seed ^ TAG_WAREHOUSE, warehouse_key(w));
        let mut r = WarehouseRecord {
            // W_YTD = 300,000.00 with 10 districts of 30,000.00 each (condition 1 holds).
            w_ytd: I64::new(3_000_000 * i64::from(self.config.districts)),
            w_tax: U32::new(rng.random_range(0..=2000)),
            w_name: [0; 10],
            w_street_1: [0; 20],
            w_street_2: [0; 20],
            w_city: [0; 20],
            w_state: [0; 2],
            w_zip: [0; 9],
            _pad: [0; 3],
        };
        astring(&mut rng, &mut r.w_name, 6, 10);
        address(
            &mut rng,
            [&mut r.w_street_1, &mut r.w_street_2, &mut r.w_city],
            &mut r.w_state,
            &mut r.w_zip,
        );
        row(WAREHOUSE, warehouse_key(w), r.encode())
    }

    fn stock_row(&self, w: u32, i: u32) -> Row {
        let mut rng = rng_for(self.config.load_seed ^ TAG_STOCK, stock_key(w, i));
        let mut s = StockRecord {
            s_ytd: U64::new(0),
            s_quantity: U32::new(rng.random_range(10..=100)),
            s_order_cnt: U32::new(0),
            s_remote_cnt: U32::new(0),
            s_dist: [[0; 24]; 10],
            s_data: [0; 50],
            _pad: [0; 2],
        };
        for dist in &mut s.s_dist {
            astring(&mut rng, dist, 24, 24);
        }
        data_with_original(&mut rng, &mut s.s_data);
        row(STOCK, stock_key(w, i), s.encode())
    }

    fn district_rows(&self, w: u32, d: u32) -> Vec<Row> {
        let mut rng = rng_for(self.config.load_seed ^ TAG_DISTRICT, district_key(w, d));
        let mut r = DistrictRecord {
            d_ytd: I64::new(3_000_000),
            d_tax: U32::new(rng.random_range(0..=2000)),
            d_next_o_id: U32::new(self.config.customers + 1),
            d_name: [0; 10],
            d_street_1: [0; 20],
            d_street_2: [0; 20],
            d_city: [0; 20],
            d_state: [0; 2],
            d_zip: [0; 9],
            _pad: [0; 7],
        };
        astring(&mut rng, &mut r.d_name, 6, 10);
        address(
            &mut rng,
            [&mut r.d_street_1, &mut r.d_street_2, &mut r.d_city],
            &mut r.d_state,
            &mut r.d_zip,
        );
        let head = NewOrderHeadRecord {
            o_id: U32::new(self.first_new_order()),
            _pad: [0; 4],
        };
        vec![
            row(DISTRICT, district_key(w, d), r.encode()),
            row(NEW_ORDER_HEAD, district_key(w, d), head.encode()),
        ]
    }

    /// The first order id that is undelivered after loading.
    pub(super) fn first_new_order(&self) -> u32 {
        self.config.customers - self.config.initial_new_orders + 1
    }

    /// The name index of a district (clause 2.5.2.2's "position n/2 rounded up").
    fn name_index_rows(&self, ctx: &DistrictCtx) -> Vec<Row> {
        let mut by_name: Vec<(u32, [u8; 16], u32)> = (1..=self.config.customers)
            .map(|c| {
                (
                    ctx.last[c as usize - 1],
                    self.first_name(ctx.w, ctx.d, c),
                    c,
                )
            })
            .collect();
        by_name.sort_unstable();
        by_name
            .chunk_by(|a, b| a.0 == b.0)
            .map(|group| {
                let n = group.len();
                let pick = group[n.div_ceil(2) - 1].2;
                let r = CustomerNameIndexRecord {
                    c_id: U32::new(pick),
                    count: U32::new(n as u32),
                };
                row(
                    CUSTOMER_NAME_INDEX,
                    name_index_key(ctx.w, ctx.d, group[0].0),
                    r.encode(),
                )
            })
            .collect()
    }

    fn customer_rows(&self, ctx: &DistrictCtx, c: u32) -> Vec<Row> {
        let (w, d) = (ctx.w, ctx.d);
        let key = customer_key(w, d, c);
        let mut rng = rng_for(self.config.load_seed ^ TAG_CUSTOMER, key);
        let mut r = CustomerRecord {
            c_balance: I64::new(-1_000),
            c_ytd_payment: I64::new(1_000),
            c_credit_lim: I64::new(5_000_000),
            c_since: U64::new(LOAD_TIME),
            c_discount: U32::new(rng.random_range(0..=5000)),
            c_payment_cnt: U32::new(1),
            c_delivery_cnt: U32::new(0),
            c_first: self.first_name(w, d, c),
            c_middle: *b"OE",
            c_last: [0; 16],
            c_street_1: [0; 20],
            c_street_2: [0; 20],
            c_city: [0; 20],
            c_state: [0; 2],
            c_zip: [0; 9],
            c_phone: [0; 16],
            c_credit: if rng.random_range(0..10) == 0 {
                *b"BC"
            } else {
                *b"GC"
            },
            c_data: [0; 500],
            _pad: [0; 5],
        };
        put_str(&mut r.c_last, &last_name(ctx.last[c as usize - 1]));
        address(
            &mut rng,
            [&mut r.c_street_1, &mut r.c_street_2, &mut r.c_city],
            &mut r.c_state,
            &mut r.c_zip,
        );
        nstring(&mut rng, &mut r.c_phone, 16, 16);
        astring(&mut rng, &mut r.c_data, 300, 500);
        let mut h = HistoryRecord {
            h_date: U64::new(LOAD_TIME),
            h_amount: I64::new(1_000),
            h_c_id: U32::new(c),
            h_c_d_id: U32::new(d),
            h_c_w_id: U32::new(w),
            h_d_id: U32::new(d),
            h_w_id: U32::new(w),
            h_data: [0; 24],
            _pad: [0; 4],
        };
        astring(&mut rng, &mut h.h_data, 12, 24);
        let last = CustomerLastOrderRecord {
            o_id: U32::new(ctx.customer_order[c as usize - 1]),
            _pad: [0; 4],
        };
        vec![
            row(CUSTOMER, key, r.encode()),
            row(HISTORY, key, h.encode()),
            row(CUSTOMER_LAST_ORDER, key, last.encode()),
        ]
    }

    fn order_rows(&self, ctx: &DistrictCtx, o: u32) -> Vec<Row> {
        let (w, d) = (ctx.w, ctx.d);
        let key = order_key(w, d, o);
        let mut rng = rng_for(self.config.load_seed ^ TAG_ORDER, key);
        let delivered = o < self.first_new_order();
        let ol_cnt = rng.random_range(5..=MAX_ORDER_LINES);
        let order = OrderRecord {
            o_entry_d: U64::new(LOAD_TIME),
            o_c_id: U32::new(ctx.order_customer[o as usize - 1]),
            o_carrier_id: U32::new(if delivered {
                rng.random_range(1..=10)
            } else {
                0
            }),
            o_ol_cnt: U32::new(ol_cnt),
            o_all_local: U32::new(1),
        };
        let mut rows = Vec::with_capacity(ol_cnt as usize + 2);
        rows.push(row(ORDER, key, order.encode()));
        for ol in 1..=ol_cnt {
            let mut line = OrderLineRecord {
                ol_delivery_d: U64::new(if delivered { LOAD_TIME } else { 0 }),
                ol_amount: I64::new(if delivered {
                    0
                } else {
                    rng.random_range(1..=999_999)
                }),
                ol_i_id: U32::new(rng.random_range(1..=self.config.items)),
                ol_supply_w_id: U32::new(w),
                ol_quantity: U32::new(5),
                ol_dist_info: [0; 24],
                _pad: [0; 4],
            };
            astring(&mut rng, &mut line.ol_dist_info, 24, 24);
            rows.push(row(ORDER_LINE, order_line_key(w, d, o, ol), line.encode()));
        }
        if !delivered {
            let no = NewOrderRecord {
                no_o_id: U32::new(o),
                _pad: [0; 4],
            };
            rows.push(row(NEW_ORDER, key, no.encode()));
        }
        rows
    }

    /// The streaming loader.
    pub(super) fn rows(&self) -> impl Iterator<Item = Row> + Send + '_ {
        let c = &self.config;
        let items = (1..=c.items).map(move |i| vec![self.item_row(i)]);
        let warehouses = (1..=c.warehouses).flat_map(move |w| {
            let stock = (1..=c.items).map(move |i| vec![self.stock_row(w, i)]);
            let districts = (1..=c.districts).flat_map(move |d| {
                let ctx = Arc::new(self.district_ctx(w, d));
                let header = {
                    let ctx = Arc::clone(&ctx);
                    std::iter::once_with(move || {
                        let mut rows = self.district_rows(w, d);
                        rows.extend(self.name_index_rows(&ctx));
                        rows
                    })
                };
                let customers = {
                    let ctx = Arc::clone(&ctx);
                    (1..=c.customers).map(move |cust| self.customer_rows(&ctx, cust))
                };
                let orders = (1..=c.customers).map(move |o| self.order_rows(&ctx, o));
                header.chain(customers).chain(orders)
            });
            std::iter::once(vec![self.warehouse_row(w)])
                .chain(stock)
                .chain(districts)
        });
        items.chain(warehouses).flatten()
    }
}
