//! TPC-C consistency conditions 1–4 (clause 3.3.2) over a hash-only final state, plus the
//! adaptation's own tables.
//!
//! Order ids are dense (`1..D_NEXT_O_ID`) and order lines are numbered `1..=15`, so every
//! row the conditions quantify over is found by key: the check enumerates each district's
//! order ids up to `D_NEXT_O_ID + PROBE_ABOVE` (finding stray rows just above the counter)
//! and every order-line number of each.

use dmem_txn::{Key, TableId};

use super::*;
use crate::invariants::Violation;
use crate::record::peek;

/// Order ids probed above `D_NEXT_O_ID - 1` for rows that should not exist.
const PROBE_ABOVE: u32 = 8;

fn decode<R: Record>(
    read: &impl Fn(TableId, Key) -> Option<Vec<u8>>,
    table: TableId,
    key: u64,
    out: &mut Vec<Violation>,
) -> Option<R> {
    let name = TABLE_NAMES[table.0 as usize];
    match peek::<R>(read, table, key) {
        None => None,
        Some(Ok(r)) => Some(r),
        Some(Err(len)) => {
            out.push(Violation::Malformed {
                table: name,
                key,
                detail: format!("{len} bytes"),
            });
            None
        }
    }
}

fn require<R: Record>(
    read: &impl Fn(TableId, Key) -> Option<Vec<u8>>,
    table: TableId,
    key: u64,
    out: &mut Vec<Violation>,
) -> Option<R> {
    let present = read(table, Key(key)).is_some();
    let r = decode(read, table, key, out);
    if !present {
        out.push(Violation::Missing {
            table: TABLE_NAMES[table.0 as usize],
            key,
        });
    }
    r
}

impl Tpcc {
    pub(super) fn check_state(
        &self,
        read: &impl Fn(TableId, Key) -> Option<Vec<u8>>,
    ) -> Vec<Violation> {
        let mut out = Vec::new();
        for w in 1..=self.config.warehouses {
            let warehouse: Option<WarehouseRecord> =
                require(read, WAREHOUSE, warehouse_key(w), &mut out);
            let mut sum_d_ytd = 0i64;
            let mut districts_ok = true;
            for d in 1..=self.config.districts {
                match require::<DistrictRecord>(read, DISTRICT, district_key(w, d), &mut out) {
                    Some(district) => {
                        sum_d_ytd += district.d_ytd.get();
                        self.check_district(read, w, d, &district, &mut out);
                    }
                    None => districts_ok = false,
                }
            }
            if let Some(wh) = warehouse
                && districts_ok
                && wh.w_ytd.get() != sum_d_ytd
            {
                out.push(Violation::TpccCondition1 {
                    w_id: w,
                    w_ytd: wh.w_ytd.get(),
                    sum_d_ytd,
                });
            }
        }
        out
    }

    fn check_district(
        &self,
        read: &impl Fn(TableId, Key) -> Option<Vec<u8>>,
        w: u32,
        d: u32,
        district: &DistrictRecord,
        out: &mut Vec<Violation>,
    ) {
        let next = district.d_next_o_id.get();
        let mut max_o = None;
        let (mut min_no, mut max_no, mut no_rows) = (None, None, 0u64);
        let (mut sum_ol_cnt, mut ol_rows) = (0u64, 0u64);
        for o in 1..next.saturating_add(PROBE_ABOVE) {
            let okey = order_key(w, d, o);
            if let Some(order) = decode::<OrderRecord>(read, ORDER, okey, out) {
                max_o = Some(o);
                sum_ol_cnt += u64::from(order.o_ol_cnt.get());
            }
            if decode::<NewOrderRecord>(read, NEW_ORDER, okey, out).is_some() {
                min_no.get_or_insert(o);
                max_no = Some(o);
                no_rows += 1;
            }
            for ol in 1..=MAX_ORDER_LINES + 1 {
                if read(ORDER_LINE, Key(order_line_key(w, d, o, ol))).is_some() {
                    ol_rows += 1;
                }
            }
        }
        // Condition 2.
        let expect = next.checked_sub(1).filter(|&o| o > 0);
        if max_o != expect || (no_rows > 0 && max_no != expect) {
            out.push(Violation::TpccCondition2 {
                w_id: w,
                d_id: d,
                next_o_id: next,
                max_o_id: max_o,
                max_no_o_id: max_no,
            });
        }
        // Condition 3.
        if let (Some(lo), Some(hi)) = (min_no, max_no)
            && u64::from(hi - lo) + 1 != no_rows
        {
            out.push(Violation::TpccCondition3 {
                w_id: w,
                d_id: d,
                min_no_o_id: lo,
                max_no_o_id: hi,
                rows: no_rows,
            });
        }
        // Condition 4.
        if sum_ol_cnt != ol_rows {
            out.push(Violation::TpccCondition4 {
                w_id: w,
                d_id: d,
                sum_ol_cnt,
                rows: ol_rows,
            });
        }
        // Adaptation 3: the head is the oldest undelivered order.
        if let Some(head) =
            require::<NewOrderHeadRecord>(read, NEW_ORDER_HEAD, district_key(w, d), out)
        {
            let expected = min_no.unwrap_or(next);
            if head.o_id.get() != expected {
                out.push(Violation::TpccNewOrderHead {
                    w_id: w,
                    d_id: d,
                    head: head.o_id.get(),
                    expected,
                });
            }
        }
        // Adaptation 2: each customer's last order is one of its orders.
        for c in 1..=self.config.customers {
            let key = customer_key(w, d, c);
            let Some(last) =
                require::<CustomerLastOrderRecord>(read, CUSTOMER_LAST_ORDER, key, out)
            else {
                continue;
            };
            let o_id = last.o_id.get();
            let owner = decode::<OrderRecord>(read, ORDER, order_key(w, d, o_id), out)
                .map(|o| o.o_c_id.get());
            if owner != Some(c) {
                out.push(Violation::TpccLastOrder {
                    w_id: w,
                    d_id: d,
                    c_id: c,
                    o_id,
                });
            }
        }
    }
}
