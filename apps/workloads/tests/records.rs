//! Record encode/decode round trips (quickcheck): every byte image of a record's size
//! decodes and re-encodes to itself, and field values survive encode → decode.

use dmem_workloads::record::Record;
use dmem_workloads::smallbank::AccountRecord;
use dmem_workloads::tatp::{
    AccessInfoRecord, CallForwardingRecord, SpecialFacilityRecord, SubscriberRecord,
};
use dmem_workloads::tpcc::{
    CustomerLastOrderRecord, CustomerNameIndexRecord, CustomerRecord, DistrictRecord,
    HistoryRecord, ItemRecord, NewOrderHeadRecord, NewOrderRecord, OrderLineRecord, OrderRecord,
    StockRecord, WarehouseRecord,
};
use quickcheck_macros::quickcheck;
use zerocopy::little_endian::{I64, U32, U64};

fn bytes_round_trip<R: Record>(seed: &[u8]) -> bool {
    let image: Vec<u8> = (0..R::SIZE)
        .map(|i| seed.get(i % seed.len().max(1)).copied().unwrap_or(0) ^ i as u8)
        .collect();
    let r = R::decode(&image).expect("right size");
    r.encode() == image && R::decode(&image[1..]).is_err()
}

#[quickcheck]
fn every_record_type_round_trips_its_bytes(seed: Vec<u8>) -> bool {
    bytes_round_trip::<AccountRecord>(&seed)
        && bytes_round_trip::<SubscriberRecord>(&seed)
        && bytes_round_trip::<AccessInfoRecord>(&seed)
        && bytes_round_trip::<SpecialFacilityRecord>(&seed)
        && bytes_round_trip::<CallForwardingRecord>(&seed)
        && bytes_round_trip::<WarehouseRecord>(&seed)
        && bytes_round_trip::<DistrictRecord>(&seed)
        && bytes_round_trip::<CustomerRecord>(&seed)
        && bytes_round_trip::<HistoryRecord>(&seed)
        && bytes_round_trip::<NewOrderRecord>(&seed)
        && bytes_round_trip::<OrderRecord>(&seed)
        && bytes_round_trip::<OrderLineRecord>(&seed)
        && bytes_round_trip::<ItemRecord>(&seed)
        && bytes_round_trip::<StockRecord>(&seed)
        && bytes_round_trip::<CustomerNameIndexRecord>(&seed)
        && bytes_round_trip::<CustomerLastOrderRecord>(&seed)
        && bytes_round_trip::<NewOrderHeadRecord>(&seed)
}

#[quickcheck]
fn account_fields_round_trip(balance: i64, owner: u64) -> bool {
    let r = AccountRecord {
        balance: I64::new(balance),
        owner: U64::new(owner),
    };
    let bytes = r.encode();
    // Little-endian on the wire, whatever the host.
    bytes[..8] == balance.to_le_bytes()
        && bytes[8..] == owner.to_le_bytes()
        && AccountRecord::decode(&bytes) == Ok(r)
}

#[quickcheck]
fn order_line_fields_round_trip(delivery: u64, amount: i64, item: u32, qty: u32) -> bool {
    let r = OrderLineRecord {
        ol_delivery_d: U64::new(delivery),
        ol_amount: I64::new(amount),
        ol_i_id: U32::new(item),
        ol_supply_w_id: U32::new(item ^ qty),
        ol_quantity: U32::new(qty),
        ol_dist_info: [b'x'; 24],
        _pad: [0; 4],
    };
    OrderLineRecord::decode(&r.encode()) == Ok(r)
}

#[quickcheck]
fn subscriber_fields_round_trip(msc: u32, vlr: u32, bits: u16, byte2: Vec<u8>) -> bool {
    let mut r = SubscriberRecord {
        msc_location: U32::new(msc),
        vlr_location: U32::new(vlr),
        sub_nbr: dmem_workloads::tatp::sub_nbr(u64::from(msc)),
        bits: zerocopy::little_endian::U16::new(bits),
        hex: [0x5a; 5],
        byte2: [0; 10],
        _pad: [0; 7],
    };
    for (d, s) in r.byte2.iter_mut().zip(&byte2) {
        *d = *s;
    }
    SubscriberRecord::decode(&r.encode()) == Ok(r)
}
