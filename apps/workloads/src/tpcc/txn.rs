//! TPC-C transactions: parameters (clauses 2.4.1, 2.5.1, 2.6.1, 2.7.1, 2.8.1), the
//! generator, and their execution over the hash-only schema.

use dmem_txn::{Access, Key, ReadReq, TableId, Transaction, TxnError, TxnKind};
use rand::RngExt;
use zerocopy::little_endian::{I64, U32, U64};

use super::*;
use crate::dist::{Mix, WorkloadRng, nurand, rng_for};
use crate::invariants::Violation;
use crate::record::{Round, get_str, put_str, rd, round, upd};
use crate::{Outcome, TableSpec, TxnGenerator, TxnInfo, Workload};

/// How a Payment or Order-Status names its customer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CustomerSelector {
    /// By C_ID (40 %).
    Id(u32),
    /// By C_LAST number 0–999 (60 %), resolved through CUSTOMER_NAME_INDEX.
    LastName(u32),
}

/// One order line of a New-Order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderItem {
    /// OL_I_ID (`items + 1`, an unused id, for the rolled-back 1 %).
    pub i_id: u32,
    /// OL_SUPPLY_W_ID.
    pub supply_w_id: u32,
    /// OL_QUANTITY (1–10).
    pub quantity: u32,
}

/// New-Order (clause 2.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewOrderParams {
    /// Home warehouse.
    pub w_id: u32,
    /// District.
    pub d_id: u32,
    /// Customer (NURand(1023, 1, 3000)).
    pub c_id: u32,
    /// 5–15 lines with distinct items.
    pub items: Vec<OrderItem>,
    /// O_ENTRY_D (logical time).
    pub entry_d: u64,
}

/// Payment (clause 2.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PaymentParams {
    /// Home warehouse.
    pub w_id: u32,
    /// District.
    pub d_id: u32,
    /// Customer's warehouse (remote in 15 %).
    pub c_w_id: u32,
    /// Customer's district.
    pub c_d_id: u32,
    /// The customer.
    pub customer: CustomerSelector,
    /// H_AMOUNT, cents (1.00–5,000.00).
    pub amount: i64,
    /// H_DATE (logical time).
    pub date: u64,
    /// The HISTORY key to insert ([`generated_history_key`]).
    pub history_key: u64,
}

/// Order-Status (clause 2.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderStatusParams {
    /// Warehouse.
    pub w_id: u32,
    /// District.
    pub d_id: u32,
    /// The customer.
    pub customer: CustomerSelector,
}

/// Delivery (clause 2.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryParams {
    /// Warehouse.
    pub w_id: u32,
    /// O_CARRIER_ID (1–10).
    pub carrier_id: u32,
    /// OL_DELIVERY_D (logical time).
    pub date: u64,
}

/// Stock-Level (clause 2.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StockLevelParams {
    /// Warehouse.
    pub w_id: u32,
    /// District.
    pub d_id: u32,
    /// Threshold (10–20).
    pub threshold: u32,
}

/// A generated TPC-C transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TpccTxn {
    /// New-Order.
    NewOrder(NewOrderParams),
    /// Payment.
    Payment(PaymentParams),
    /// Order-Status.
    OrderStatus(OrderStatusParams),
    /// Delivery.
    Delivery(DeliveryParams),
    /// Stock-Level.
    StockLevel(StockLevelParams),
}

impl TxnInfo for TpccTxn {
    fn first_record(&self) -> Option<(TableId, Key)> {
        let w = match self {
            TpccTxn::NewOrder(p) => p.w_id,
            TpccTxn::Payment(p) => p.w_id,
            TpccTxn::OrderStatus(p) => p.w_id,
            TpccTxn::Delivery(p) => p.w_id,
            TpccTxn::StockLevel(p) => p.w_id,
        };
        Some((super::WAREHOUSE, Key(super::warehouse_key(w))))
    }

    fn type_index(&self) -> usize {
        match self {
            TpccTxn::NewOrder(_) => 0,
            TpccTxn::Payment(_) => 1,
            TpccTxn::OrderStatus(_) => 2,
            TpccTxn::Delivery(_) => 3,
            TpccTxn::StockLevel(_) => 4,
        }
    }

    fn kind(&self) -> TxnKind {
        match self {
            TpccTxn::OrderStatus(_) | TpccTxn::StockLevel(_) => TxnKind::ReadOnly,
            _ => TxnKind::ReadWrite,
        }
    }
}

/// The per-coordinator generator of [`Tpcc`].
#[derive(Debug, Clone)]
pub struct TpccGenerator {
    rng: WorkloadRng,
    mix: Mix,
    config: TpccConfig,
    nurand: NuRandConstants,
    coordinator: u32,
    seq: u64,
}

impl TpccGenerator {
    fn other_warehouse(&mut self, w: u32) -> u32 {
        let n = self.config.warehouses;
        if n == 1 {
            return w;
        }
        let x = self.rng.random_range(1..n);
        if x >= w { x + 1 } else { x }
    }

    fn customer_id(&mut self) -> u32 {
        nurand(
            &mut self.rng,
            1023,
            self.nurand.c_id,
            1,
            u64::from(self.config.customers),
        ) as u32
    }

    fn customer(&mut self) -> CustomerSelector {
        if self.rng.random_range(0..100) < self.config.by_name_percent {
            let names = u64::from(self.config.last_names());
            CustomerSelector::LastName(nurand(
                &mut self.rng,
                255,
                self.nurand.c_last_run,
                0,
                names - 1,
            ) as u32)
        } else {
            CustomerSelector::Id(self.customer_id())
        }
    }

    fn new_order(&mut self, w_id: u32, d_id: u32) -> NewOrderParams {
        let c_id = self.customer_id();
        let n = self.rng.random_range(5..=MAX_ORDER_LINES) as usize;
        let n = n.min(self.config.items as usize);
        let rollback = self.rng.random_range(0..100) < self.config.rollback_percent;
        let mut items: Vec<OrderItem> = Vec::with_capacity(n);
        while items.len() < n {
            let i_id = nurand(
                &mut self.rng,
                8191,
                self.nurand.ol_i_id,
                1,
                u64::from(self.config.items),
            ) as u32;
            if items.iter().any(|it| it.i_id == i_id) {
                continue;
            }
            let remote = self.rng.random_range(0..100) < self.config.remote_line_percent;
            let supply_w_id = if remote {
                self.other_warehouse(w_id)
            } else {
                w_id
            };
            items.push(OrderItem {
                i_id,
                supply_w_id,
                quantity: self.rng.random_range(1..=10),
            });
        }
        if rollback {
            items.last_mut().expect("5+ lines").i_id = self.config.items + 1;
        }
        NewOrderParams {
            w_id,
            d_id,
            c_id,
            items,
            entry_d: self.seq,
        }
    }
}

impl TxnGenerator for TpccGenerator {
    type Txn = TpccTxn;

    fn next_txn(&mut self) -> TpccTxn {
        self.seq += 1;
        let ty = self.mix.pick(&mut self.rng);
        let w_id = self.rng.random_range(1..=self.config.warehouses);
        let d_id = self.rng.random_range(1..=self.config.districts);
        match ty {
            0 => TpccTxn::NewOrder(self.new_order(w_id, d_id)),
            1 => {
                let remote = self.config.warehouses > 1
                    && self.rng.random_range(0..100) < self.config.remote_payment_percent;
                let (c_w_id, c_d_id) = if remote {
                    let cw = self.other_warehouse(w_id);
                    (cw, self.rng.random_range(1..=self.config.districts))
                } else {
                    (w_id, d_id)
                };
                TpccTxn::Payment(PaymentParams {
                    w_id,
                    d_id,
                    c_w_id,
                    c_d_id,
                    customer: self.customer(),
                    amount: self.rng.random_range(100..=500_000),
                    date: self.seq,
                    history_key: generated_history_key(self.coordinator, self.seq),
                })
            }
            2 => TpccTxn::OrderStatus(OrderStatusParams {
                w_id,
                d_id,
                customer: self.customer(),
            }),
            3 => TpccTxn::Delivery(DeliveryParams {
                w_id,
                carrier_id: self.rng.random_range(1..=10),
                date: self.seq,
            }),
            _ => TpccTxn::StockLevel(StockLevelParams {
                w_id,
                d_id,
                threshold: self.rng.random_range(10..=20),
            }),
        }
    }
}

const DONE: Outcome = Outcome::Commit { delta: 0 };

async fn write<T: Transaction, R: crate::record::Record>(
    tx: &mut T,
    table: TableId,
    key: u64,
    r: &R,
) -> Result<(), TxnError> {
    tx.write(table, Key(key), &r.encode()).await
}

async fn insert<T: Transaction, R: crate::record::Record>(
    tx: &mut T,
    table: TableId,
    key: u64,
    r: &R,
) -> Result<(), TxnError> {
    tx.insert(table, Key(key), &r.encode()).await
}

/// The first round's request for a Payment's customer: the CUSTOMER row itself (with
/// `access`) when named by id, else its CUSTOMER_NAME_INDEX entry (read-only; names never
/// change), whose C_ID names the row for a later round.
fn customer_or_index(w: u32, d: u32, customer: CustomerSelector, access: Access) -> ReadReq {
    match customer {
        CustomerSelector::Id(c) => ReadReq {
            table: CUSTOMER,
            key: Key(customer_key(w, d, c)),
            access,
        },
        CustomerSelector::LastName(name) => rd(CUSTOMER_NAME_INDEX, name_index_key(w, d, name)),
    }
}

/// Takes the first round's value requested by [`customer_or_index`]: the customer's row
/// when it is named by id, else its C_ID from the name index.
fn customer_id(customer: CustomerSelector, values: &mut Round) -> Result<Resolved, TxnError> {
    Ok(match customer {
        CustomerSelector::Id(c_id) => Resolved::Row(c_id, Box::new(values.req()?)),
        CustomerSelector::LastName(_) => {
            Resolved::ByName(values.req::<CustomerNameIndexRecord>()?.c_id.get())
        }
    })
}

/// What the first round tells about a Payment's customer.
enum Resolved {
    /// Named by id: its C_ID and its row (read in the first round).
    Row(u32, Box<CustomerRecord>),
    /// Named by last name: its C_ID from the index; the row is read in the next round.
    ByName(u32),
}

impl Tpcc {
    /// Rounds: (1) WAREHOUSE, DISTRICT (for update), CUSTOMER, CUSTOMER_LAST_ORDER (for
    /// update); (2) every ITEM; (3) every STOCK (for update), only if no item id is unused.
    /// The inserted ORDER, NEW-ORDER and ORDER-LINE keys depend on D_NEXT_O_ID.
    async fn new_order<T: Transaction>(
        &self,
        p: &NewOrderParams,
        tx: &mut T,
    ) -> Result<Outcome, TxnError> {
        let (w, d) = (p.w_id, p.d_id);
        let last_key = customer_key(w, d, p.c_id);
        let mut first = round(
            tx,
            &[
                rd(WAREHOUSE, warehouse_key(w)),
                upd(DISTRICT, district_key(w, d)),
                rd(CUSTOMER, customer_key(w, d, p.c_id)),
                upd(CUSTOMER_LAST_ORDER, last_key),
            ],
        )
        .await?;
        let _warehouse: WarehouseRecord = first.req()?;
        let mut district: DistrictRecord = first.req()?;
        let _customer: CustomerRecord = first.req()?;
        let mut last: CustomerLastOrderRecord = first.req()?;

        let item_reqs: Vec<ReadReq> = p
            .items
            .iter()
            .map(|it| rd(ITEM, item_key(it.i_id)))
            .collect();
        let mut item_values = round(tx, &item_reqs).await?;
        let mut items: Vec<ItemRecord> = Vec::with_capacity(p.items.len());
        for _ in &p.items {
            let Some(item) = item_values.opt::<ItemRecord>()? else {
                return Ok(Outcome::Rollback("unused item id"));
            };
            items.push(item);
        }

        let stock_reqs: Vec<ReadReq> = p
            .items
            .iter()
            .map(|it| upd(STOCK, stock_key(it.supply_w_id, it.i_id)))
            .collect();
        let mut stock_values = round(tx, &stock_reqs).await?;
        let mut stocks: Vec<StockRecord> = Vec::with_capacity(p.items.len());
        for _ in &p.items {
            stocks.push(stock_values.req()?);
        }

        let o_id = district.d_next_o_id.get();
        district.d_next_o_id = U32::new(o_id + 1);
        write(tx, DISTRICT, district_key(w, d), &district).await?;
        let all_local = p.items.iter().all(|it| it.supply_w_id == w);
        let order = OrderRecord {
            o_entry_d: U64::new(p.entry_d),
            o_c_id: U32::new(p.c_id),
            o_carrier_id: U32::new(0),
            o_ol_cnt: U32::new(p.items.len() as u32),
            o_all_local: U32::new(u32::from(all_local)),
        };
        insert(tx, ORDER, order_key(w, d, o_id), &order).await?;
        let no = NewOrderRecord {
            no_o_id: U32::new(o_id),
            _pad: [0; 4],
        };
        insert(tx, NEW_ORDER, order_key(w, d, o_id), &no).await?;
        last.o_id = U32::new(o_id);
        write(tx, CUSTOMER_LAST_ORDER, last_key, &last).await?;

        for (n, ((it, item), mut stock)) in p.items.iter().zip(items).zip(stocks).enumerate() {
            let skey = stock_key(it.supply_w_id, it.i_id);
            let q = stock.s_quantity.get();
            let q = if q >= it.quantity + 10 {
                q - it.quantity
            } else {
                q - it.quantity + 91
            };
            stock.s_quantity = U32::new(q);
            stock.s_ytd = U64::new(stock.s_ytd.get() + u64::from(it.quantity));
            stock.s_order_cnt = U32::new(stock.s_order_cnt.get() + 1);
            if it.supply_w_id != w {
                stock.s_remote_cnt = U32::new(stock.s_remote_cnt.get() + 1);
            }
            write(tx, STOCK, skey, &stock).await?;
            let line = OrderLineRecord {
                ol_delivery_d: U64::new(0),
                ol_amount: I64::new(i64::from(it.quantity) * item.i_price.get()),
                ol_i_id: U32::new(it.i_id),
                ol_supply_w_id: U32::new(it.supply_w_id),
                ol_quantity: U32::new(it.quantity),
                ol_dist_info: stock.s_dist[(d as usize - 1) % 10],
                _pad: [0; 4],
            };
            let ol = n as u32 + 1;
            insert(tx, ORDER_LINE, order_line_key(w, d, o_id, ol), &line).await?;
        }
        Ok(DONE)
    }

    /// Rounds: (1) WAREHOUSE, DISTRICT and the customer by id (all for update), or the
    /// customer's name-index entry; (2) by last name only: the CUSTOMER row (for update).
    async fn payment<T: Transaction>(
        &self,
        p: &PaymentParams,
        tx: &mut T,
    ) -> Result<Outcome, TxnError> {
        let (w, d) = (p.w_id, p.d_id);
        let mut first = round(
            tx,
            &[
                upd(WAREHOUSE, warehouse_key(w)),
                upd(DISTRICT, district_key(w, d)),
                customer_or_index(p.c_w_id, p.c_d_id, p.customer, Access::ForUpdate),
            ],
        )
        .await?;
        let mut wh: WarehouseRecord = first.req()?;
        let mut di: DistrictRecord = first.req()?;
        let (c_id, mut c) = match customer_id(p.customer, &mut first)? {
            Resolved::Row(c_id, c) => (c_id, *c),
            Resolved::ByName(c_id) => {
                let ckey = customer_key(p.c_w_id, p.c_d_id, c_id);
                (c_id, round(tx, &[upd(CUSTOMER, ckey)]).await?.req()?)
            }
        };

        wh.w_ytd = I64::new(wh.w_ytd.get() + p.amount);
        write(tx, WAREHOUSE, warehouse_key(w), &wh).await?;
        di.d_ytd = I64::new(di.d_ytd.get() + p.amount);
        write(tx, DISTRICT, district_key(w, d), &di).await?;

        let ckey = customer_key(p.c_w_id, p.c_d_id, c_id);
        c.c_balance = I64::new(c.c_balance.get() - p.amount);
        c.c_ytd_payment = I64::new(c.c_ytd_payment.get() + p.amount);
        c.c_payment_cnt = U32::new(c.c_payment_cnt.get() + 1);
        if &c.c_credit == b"BC" {
            // Clause 2.5.2.2: prepend C_ID, C_D_ID, C_W_ID, D_ID, W_ID and H_AMOUNT to
            // C_DATA, keeping 500 characters.
            let mut data = format!(
                "{} {} {} {} {} {}.{:02} ",
                c_id,
                p.c_d_id,
                p.c_w_id,
                d,
                w,
                p.amount / 100,
                p.amount % 100
            )
            .into_bytes();
            data.extend_from_slice(get_str(&c.c_data));
            put_str(&mut c.c_data, &data);
        }
        write(tx, CUSTOMER, ckey, &c).await?;

        let mut h = HistoryRecord {
            h_date: U64::new(p.date),
            h_amount: I64::new(p.amount),
            h_c_id: U32::new(c_id),
            h_c_d_id: U32::new(p.c_d_id),
            h_c_w_id: U32::new(p.c_w_id),
            h_d_id: U32::new(d),
            h_w_id: U32::new(w),
            h_data: [0; 24],
            _pad: [0; 4],
        };
        let mut data = get_str(&wh.w_name).to_vec();
        data.extend_from_slice(b"    ");
        data.extend_from_slice(get_str(&di.d_name));
        put_str(&mut h.h_data, &data);
        insert(tx, HISTORY, p.history_key, &h).await?;
        Ok(DONE)
    }

    /// Rounds, all read-only: by last name first the name-index entry; then (1) CUSTOMER and
    /// CUSTOMER_LAST_ORDER; (2) the ORDER; (3) its O_OL_CNT ORDER-LINE rows.
    async fn order_status<T: Transaction>(
        &self,
        p: &OrderStatusParams,
        tx: &mut T,
    ) -> Result<Outcome, TxnError> {
        let (w, d) = (p.w_id, p.d_id);
        let customer_rows = |c_id| {
            [
                rd(CUSTOMER, customer_key(w, d, c_id)),
                rd(CUSTOMER_LAST_ORDER, customer_key(w, d, c_id)),
            ]
        };
        let mut values = match p.customer {
            CustomerSelector::Id(c_id) => round(tx, &customer_rows(c_id)).await?,
            CustomerSelector::LastName(name) => {
                let idx: CustomerNameIndexRecord =
                    round(tx, &[rd(CUSTOMER_NAME_INDEX, name_index_key(w, d, name))])
                        .await?
                        .req()?;
                round(tx, &customer_rows(idx.c_id.get())).await?
            }
        };
        let _c: CustomerRecord = values.req()?;
        let last: CustomerLastOrderRecord = values.req()?;
        let o_id = last.o_id.get();
        let order: OrderRecord = round(tx, &[rd(ORDER, order_key(w, d, o_id))])
            .await?
            .req()?;
        let line_reqs: Vec<ReadReq> = (1..=order.o_ol_cnt.get())
            .map(|ol| rd(ORDER_LINE, order_line_key(w, d, o_id, ol)))
            .collect();
        let mut lines = round(tx, &line_reqs).await?;
        for _ in &line_reqs {
            let _line: OrderLineRecord = lines.req()?;
        }
        Ok(DONE)
    }

    /// Rounds, each over every district of the warehouse: (1) NEW_ORDER_HEAD; (2) the
    /// NEW-ORDER row at the head; (3) the ORDER of each district with one; (4) its
    /// ORDER-LINE rows and its CUSTOMER. All for update.
    async fn delivery<T: Transaction>(
        &self,
        p: &DeliveryParams,
        tx: &mut T,
    ) -> Result<Outcome, TxnError> {
        let w = p.w_id;
        let districts: Vec<u32> = (1..=self.config.districts).collect();

        let head_reqs: Vec<ReadReq> = districts
            .iter()
            .map(|&d| upd(NEW_ORDER_HEAD, district_key(w, d)))
            .collect();
        let mut head_values = round(tx, &head_reqs).await?;
        let mut heads: Vec<NewOrderHeadRecord> = Vec::with_capacity(districts.len());
        for _ in &districts {
            heads.push(head_values.req()?);
        }

        let no_reqs: Vec<ReadReq> = districts
            .iter()
            .zip(&heads)
            .map(|(&d, head)| upd(NEW_ORDER, order_key(w, d, head.o_id.get())))
            .collect();
        let mut no_values = round(tx, &no_reqs).await?;
        // Districts with an outstanding order (the others are skipped, clause 2.7.4.2),
        // with their head.
        let mut delivered: Vec<(u32, NewOrderHeadRecord)> = Vec::new();
        for (&d, head) in districts.iter().zip(heads) {
            if no_values.present() {
                delivered.push((d, head));
            }
        }

        let order_reqs: Vec<ReadReq> = delivered
            .iter()
            .map(|(d, head)| upd(ORDER, order_key(w, *d, head.o_id.get())))
            .collect();
        let mut order_values = round(tx, &order_reqs).await?;
        let mut orders: Vec<OrderRecord> = Vec::with_capacity(delivered.len());
        for _ in &delivered {
            orders.push(order_values.req()?);
        }

        let mut last_reqs: Vec<ReadReq> = Vec::new();
        for ((d, head), order) in delivered.iter().zip(&orders) {
            let o_id = head.o_id.get();
            last_reqs.extend(
                (1..=order.o_ol_cnt.get())
                    .map(|ol| upd(ORDER_LINE, order_line_key(w, *d, o_id, ol))),
            );
            last_reqs.push(upd(CUSTOMER, customer_key(w, *d, order.o_c_id.get())));
        }
        let mut last_values = round(tx, &last_reqs).await?;

        for ((d, mut head), mut order) in delivered.into_iter().zip(orders) {
            let hkey = district_key(w, d);
            let o_id = head.o_id.get();
            let okey = order_key(w, d, o_id);
            tx.delete(NEW_ORDER, Key(okey)).await?;
            head.o_id = U32::new(o_id + 1);
            write(tx, NEW_ORDER_HEAD, hkey, &head).await?;
            order.o_carrier_id = U32::new(p.carrier_id);
            write(tx, ORDER, okey, &order).await?;
            let mut total = 0i64;
            for ol in 1..=order.o_ol_cnt.get() {
                let lkey = order_line_key(w, d, o_id, ol);
                let mut line: OrderLineRecord = last_values.req()?;
                total += line.ol_amount.get();
                line.ol_delivery_d = U64::new(p.date);
                write(tx, ORDER_LINE, lkey, &line).await?;
            }
            let ckey = customer_key(w, d, order.o_c_id.get());
            let mut c: CustomerRecord = last_values.req()?;
            c.c_balance = I64::new(c.c_balance.get() + total);
            c.c_delivery_cnt = U32::new(c.c_delivery_cnt.get() + 1);
            write(tx, CUSTOMER, ckey, &c).await?;
        }
        Ok(DONE)
    }

    /// Rounds, all read-only: (1) DISTRICT; (2) the 20 previous ORDER rows; (3) their
    /// ORDER-LINE rows; (4) the STOCK row of each distinct item.
    async fn stock_level<T: Transaction>(
        &self,
        p: &StockLevelParams,
        tx: &mut T,
    ) -> Result<Outcome, TxnError> {
        let (w, d) = (p.w_id, p.d_id);
        let district: DistrictRecord = round(tx, &[rd(DISTRICT, district_key(w, d))])
            .await?
            .req()?;
        let next = district.d_next_o_id.get();
        let o_ids: Vec<u32> = (next.saturating_sub(20).max(1)..next).collect();

        let order_reqs: Vec<ReadReq> = o_ids
            .iter()
            .map(|&o| rd(ORDER, order_key(w, d, o)))
            .collect();
        let mut order_values = round(tx, &order_reqs).await?;
        let mut line_reqs: Vec<ReadReq> = Vec::with_capacity(20 * MAX_ORDER_LINES as usize);
        for &o_id in &o_ids {
            let order: OrderRecord = order_values.req()?;
            line_reqs.extend(
                (1..=order.o_ol_cnt.get()).map(|ol| rd(ORDER_LINE, order_line_key(w, d, o_id, ol))),
            );
        }

        let mut line_values = round(tx, &line_reqs).await?;
        let mut items: Vec<u32> = Vec::with_capacity(line_reqs.len());
        for _ in &line_reqs {
            let line: OrderLineRecord = line_values.req()?;
            items.push(line.ol_i_id.get());
        }
        items.sort_unstable();
        items.dedup();

        let stock_reqs: Vec<ReadReq> = items.iter().map(|&i| rd(STOCK, stock_key(w, i))).collect();
        let mut stock_values = round(tx, &stock_reqs).await?;
        let mut low_stock = 0u32;
        for _ in &items {
            let s: StockRecord = stock_values.req()?;
            if s.s_quantity.get() < p.threshold {
                low_stock += 1;
            }
        }
        let _ = low_stock;
        Ok(DONE)
    }
}

impl Workload for Tpcc {
    /// The warehouse id, bits 48–62 of every key but ITEM's (LOTUS §4.2: TPC-C shards by
    /// warehouse); ITEM, read by every warehouse, has none.
    fn critical_field(&self, table: TableId) -> Option<dmem_txn::CriticalField> {
        (table != super::ITEM).then_some(dmem_txn::CriticalField {
            shift: 48,
            bits: 15,
        })
    }

    type Txn = TpccTxn;
    type Generator = TpccGenerator;

    fn name(&self) -> &'static str {
        "tpcc"
    }

    fn tables(&self) -> Vec<TableSpec> {
        let c = &self.config;
        let w = u64::from(c.warehouses);
        let districts = w * u64::from(c.districts);
        let customers = districts * u64::from(c.customers);
        let items = u64::from(c.items);
        // Order lines: 5–15 per order, 10 on average.
        let spec = [
            (WarehouseRecord::SIZE, w, false),
            (DistrictRecord::SIZE, districts, false),
            (CustomerRecord::SIZE, customers, false),
            (HistoryRecord::SIZE, customers, true),
            (
                NewOrderRecord::SIZE,
                districts * u64::from(c.initial_new_orders),
                true,
            ),
            (OrderRecord::SIZE, customers, true),
            (OrderLineRecord::SIZE, customers * 10, true),
            (ItemRecord::SIZE, items, false),
            (StockRecord::SIZE, w * items, false),
            (
                CustomerNameIndexRecord::SIZE,
                districts * u64::from(c.last_names()),
                false,
            ),
            (CustomerLastOrderRecord::SIZE, customers, false),
            (NewOrderHeadRecord::SIZE, districts, false),
        ];
        spec.iter()
            .enumerate()
            .map(|(i, &(value_size, expected_records, grows))| TableSpec {
                id: TableId(i as u32),
                name: TABLE_NAMES[i],
                value_size,
                expected_records,
                grows,
            })
            .collect()
    }

    /// New-Order inserts one NEW_ORDER and one ORDER row and up to
    /// [`MAX_ORDER_LINES`] ORDER_LINE rows; Payment one HISTORY row;
    /// nothing else inserts (Delivery deletes NEW_ORDER rows, whose slots stay taken).
    fn inserts_per_txn(&self, table: TableId) -> Option<f64> {
        let weights = self.config.weights;
        let total: u32 = weights.iter().sum();
        let share = |i: usize| f64::from(weights[i]) / f64::from(total.max(1));
        Some(match table {
            super::NEW_ORDER | super::ORDER => share(0),
            super::ORDER_LINE => share(0) * f64::from(super::MAX_ORDER_LINES),
            super::HISTORY => share(1),
            _ => 0.0,
        })
    }

    /// New-Order: DISTRICT, CUSTOMER_LAST_ORDER, one STOCK row per line, ORDER, NEW_ORDER
    /// and one ORDER_LINE row per line, with [`MAX_ORDER_LINES`]
    /// lines. Payment: WAREHOUSE, DISTRICT, CUSTOMER (or its name-index entry) and a HISTORY
    /// row. Delivery, per district: NEW_ORDER_HEAD, the NEW_ORDER row it deletes, ORDER, its
    /// ORDER_LINE rows (at most as many) and CUSTOMER. Types with no weight in the mix are
    /// left out; Order-Status and Stock-Level write nothing.
    fn write_sets(&self) -> Vec<Vec<(TableId, u32)>> {
        let lines = super::MAX_ORDER_LINES;
        let districts = self.config.districts;
        let sets = [
            vec![
                (super::DISTRICT, 1),
                (super::CUSTOMER_LAST_ORDER, 1),
                (super::STOCK, lines),
                (super::ORDER, 1),
                (super::NEW_ORDER, 1),
                (super::ORDER_LINE, lines),
            ],
            vec![
                (super::WAREHOUSE, 1),
                (super::DISTRICT, 1),
                (super::CUSTOMER, 1),
                (super::CUSTOMER_NAME_INDEX, 1),
                (super::HISTORY, 1),
            ],
            Vec::new(),
            vec![
                (super::NEW_ORDER_HEAD, districts),
                (super::NEW_ORDER, districts),
                (super::ORDER, districts),
                (super::ORDER_LINE, districts * lines),
                (super::CUSTOMER, districts),
            ],
            Vec::new(),
        ];
        sets.into_iter()
            .zip(self.config.weights)
            .filter(|(set, weight)| *weight > 0 && !set.is_empty())
            .map(|(set, _)| set)
            .collect()
    }

    fn txn_types(&self) -> &[crate::TxnType] {
        &self.types
    }

    fn loader(&self) -> Box<dyn Iterator<Item = (TableId, Key, Vec<u8>)> + Send + '_> {
        Box::new(self.rows())
    }

    fn generator(&self, coordinator: u32, seed: u64) -> TpccGenerator {
        TpccGenerator {
            rng: rng_for(seed, u64::from(coordinator)),
            mix: Mix::new(self.config.weights),
            config: self.config.clone(),
            nurand: self.nurand,
            coordinator,
            seq: 0,
        }
    }

    async fn run<T: Transaction>(&self, txn: &TpccTxn, tx: &mut T) -> Result<Outcome, TxnError> {
        match txn {
            TpccTxn::NewOrder(p) => self.new_order(p, tx).await,
            TpccTxn::Payment(p) => self.payment(p, tx).await,
            TpccTxn::OrderStatus(p) => self.order_status(p, tx).await,
            TpccTxn::Delivery(p) => self.delivery(p, tx).await,
            TpccTxn::StockLevel(p) => self.stock_level(p, tx).await,
        }
    }

    fn check<F>(&self, read: F, _committed_delta: i64) -> Vec<Violation>
    where
        F: Fn(TableId, Key) -> Option<Vec<u8>>,
    {
        self.check_state(&read)
    }
}
