//! Tests of the store as a whole (layout, loader, index, cache).

use std::rc::Rc;
use std::sync::Arc;

use dmem_layout::record::{DataItem, DataItemHeader, RemoteAddr as PackedAddr};
use dmem_txn::{Key, TableId};
use dmem_verbs::{MemoryRegion, NodeId, RKey};

use super::*;

/// One region of `len` bytes on each of MNs `0..n` (also `hashed_pool`'s tests).
pub(crate) fn regions(n: u16, len: u64) -> Vec<MemoryRegion> {
    (0..n)
        .map(|i| MemoryRegion {
            node: NodeId(i),
            rkey: RKey(u32::from(i) + 1),
            len,
        })
        .collect()
}

fn store() -> Store {
    let cfg = StoreConfig::new(3)
        .table(TableSpec::sized_for(TableId(1), 16, 100, 3))
        .table(TableSpec::sized_for(TableId(2), 100, 50, 3))
        .coordinators(8);
    Store::new(cfg, regions(3, 1 << 20)).unwrap()
}

#[test]
fn replicas_are_distinct_and_primary_first() {
    let s = store();
    for p in 0..3 {
        let r = s.replicas(p);
        assert_eq!(r.len(), 3);
        assert_eq!(r[0], p);
        let mut d = r.clone();
        d.sort_unstable();
        d.dedup();
        assert_eq!(d.len(), 3);
    }
    s.view().borrow_mut().mark_failed(1);
    assert_eq!(s.primary(1).unwrap(), 2);
    assert_eq!(s.live_replicas(0), vec![0, 2]);
}

#[test]
fn areas_do_not_overlap_and_items_are_aligned() {
    let s = store();
    let t1 = *s.table(TableId(1)).unwrap();
    let t2 = *s.table(TableId(2)).unwrap();
    assert!(t1.base + t1.partition_bytes * 3 <= t2.base);
    assert!(t2.base + t2.partition_bytes * 3 <= s.log_offset(0).unwrap());
    assert_eq!(
        s.log_offset(7).unwrap() + 4096,
        s.bytes_per_mn(),
        "the last log region ends the layout"
    );
    assert!(s.log_offset(8).is_err());
    for key in 0..200 {
        let b = s.bucket_of(TableId(2), Key(key)).unwrap();
        for slot in 0..BUCKET_SLOTS {
            let loc = s.item_at(b, slot).unwrap();
            assert_eq!(loc.offset % 8, 0);
            assert!(loc.offset >= t2.base && loc.offset < t2.base + 3 * t2.partition_bytes);
        }
    }
}

#[test]
fn loader_writes_every_replica_and_refuses_duplicates() {
    let s = store();
    let mut mem = vec![vec![0u8; 1 << 20]; 3];
    let mut loader = Loader::new(&s);
    let mut write = |n: NodeId, off: u64, b: &[u8]| {
        let off = off as usize;
        mem[usize::from(n.0)][off..off + b.len()].copy_from_slice(b);
    };
    let loc = loader
        .load(TableId(1), Key(42), &[7; 16], &mut write)
        .unwrap();
    assert_eq!(
        loader.load(TableId(1), Key(42), &[7; 16], &mut write),
        Err(StoreError::DuplicateKey { table: 1, key: 42 })
    );
    assert!(matches!(
        loader.load(TableId(1), Key(43), &[7; 3], &mut write),
        Err(StoreError::ValueSize { .. })
    ));
    for mn in s.replicas(loc.bucket.partition) {
        let m = &mem[usize::from(mn)];
        let off = loc.offset as usize;
        let item = DataItem::new_checked(&m[off..off + DataItemHeader::item_len(16)]).unwrap();
        assert_eq!((item.key(), item.value()), (42, &[7u8; 16][..]));
        assert!(item.is_readable());
        let b = loc.bucket.offset as usize;
        let (used, free) = parse_bucket(&m[b..b + BUCKET_LEN]);
        assert_eq!(used, vec![(0, 42)]);
        assert_eq!(free, Some(1));
    }
}

#[test]
fn sizing_matches_the_layout_and_grows_with_slack() {
    let demand = [
        TableDemand {
            id: TableId(1),
            value_len: 16,
            expected_records: 1000,
            grows: false,
        },
        TableDemand {
            id: TableId(2),
            value_len: 40,
            expected_records: 100,
            grows: true,
        },
    ];
    let cfg = StoreConfig::for_tables(3, &demand, 8, 1024, 2);
    let bytes = cfg.bytes_per_mn().unwrap();
    let laid = Store::new(cfg.clone(), regions(3, bytes)).unwrap();
    assert_eq!(laid.bytes_per_mn(), bytes);
    assert!(matches!(
        Store::new(cfg, regions(3, bytes - 1)),
        Err(StoreError::TooLarge { .. })
    ));
    let bigger = StoreConfig::for_tables(3, &demand, 8, 1024, 4);
    assert!(bigger.bytes_per_mn().unwrap() > bytes);
    assert_eq!(demand[1].index_records(), 100 * 2 + 4096);
    let dup = StoreConfig::new(3)
        .table(TableSpec::sized_for(TableId(1), 8, 10, 3))
        .table(TableSpec::sized_for(TableId(1), 8, 10, 3));
    assert_eq!(dup.bytes_per_mn(), Err(StoreError::DuplicateTable(1)));
}

#[test]
fn fill_warms_the_cache_from_loaded_locations() {
    let s = store();
    let mut loader = Loader::new(&s);
    let mut locs = Vec::new();
    for k in 0..20 {
        let loc = loader
            .load(TableId(1), Key(k), &[1; 16], |_, _, _| {})
            .unwrap();
        locs.push((TableId(1), Key(k), loc));
    }
    let mut c = AddressCache::new();
    c.fill(locs.iter().copied());
    assert_eq!(c.len(), 20);
    assert_eq!(c.stats(), (0, 0));
    assert_eq!(c.get(TableId(1), Key(7)), Some(locs[7].2));
    assert_eq!(c.get(TableId(1), Key(20)), None);
}

fn direct_store(key_space: u64) -> Store {
    let demand = [TableDemand {
        id: TableId(1),
        value_len: 16,
        expected_records: key_space,
        grows: false,
    }];
    let cfg =
        StoreConfig::for_tables(3, &demand, 2, 1024, 2).with_direct_index(TableId(1), key_space);
    let bytes = cfg.bytes_per_mn().unwrap();
    Store::new(cfg, regions(3, bytes)).unwrap()
}

#[test]
fn direct_index_holds_every_key_of_its_space_in_its_own_slot() {
    let key_space = 1000;
    let s = direct_store(key_space);
    let t = *s.table(TableId(1)).unwrap();
    // One record slot per key (rounded up to whole buckets), not per slack.
    assert_eq!(u64::from(t.spec.buckets_per_partition), 334_u64.div_ceil(7));
    let mut loader = Loader::new(&s);
    let mut seen = std::collections::HashSet::new();
    for k in (0..key_space).rev() {
        let loc = loader
            .load(TableId(1), Key(k), &[1; 16], |_, _, _| {})
            .unwrap();
        assert_eq!(Some(loc.slot), s.direct_slot(TableId(1), Key(k)).unwrap());
        assert!(
            seen.insert(loc.offset),
            "two keys share record {}",
            loc.offset
        );
    }
    assert_eq!(
        loader.load(TableId(1), Key(5), &[1; 16], |_, _, _| {}),
        Err(StoreError::DuplicateKey { table: 1, key: 5 })
    );
    assert_eq!(
        loader.load(TableId(1), Key(key_space), &[1; 16], |_, _, _| {}),
        Err(StoreError::KeyOutOfRange {
            table: 1,
            key: key_space,
            key_space
        })
    );
    assert_eq!(loader.loaded().borrow().len(), key_space);
}

#[test]
fn warm_cache_answers_loaded_keys_only() {
    let s = Rc::new(direct_store(100));
    let mut loader = Loader::shared(Rc::clone(&s));
    let mut cache = AddressCache::new();
    cache.warm_from(Rc::clone(&s), loader.loaded());
    let loc = loader
        .load(TableId(1), Key(42), &[1; 16], |_, _, _| {})
        .unwrap();
    assert_eq!(cache.get(TableId(1), Key(42)), Some(loc));
    assert_eq!(cache.get(TableId(1), Key(43)), None);
    assert_eq!(cache.stats(), (1, 1));
    // Hashed tables answer from the slot each key took.
    let h = store();
    let mut loader = Loader::new(&h);
    let locs: Vec<_> = (0..30)
        .map(|k| {
            loader
                .load(TableId(2), Key(k), &[0; 100], |_, _, _| {})
                .unwrap()
        })
        .collect();
    for (k, loc) in locs.iter().enumerate() {
        assert_eq!(
            loader.loaded().borrow().loc(&h, TableId(2), Key(k as u64)),
            Some(*loc)
        );
    }
    assert_eq!(loader.loaded().borrow().loc(&h, TableId(2), Key(30)), None);
    // A finished load shared across threads answers the same, on another thread's store.
    let placed = Arc::new(loader.loaded().borrow().clone());
    let answers = std::thread::spawn(move || {
        let h = Rc::new(store());
        let mut cache = AddressCache::new();
        cache.warm_from_placed(Rc::clone(&h), placed);
        (0..31)
            .map(|k| cache.get(TableId(2), Key(k)))
            .collect::<Vec<_>>()
    })
    .join()
    .unwrap();
    assert_eq!(
        answers[..30],
        locs.iter().copied().map(Some).collect::<Vec<_>>()
    );
    assert_eq!(answers[30], None);
}

/// A sparse table: 1,000 records in a key space of 16,000, growing, on 3 MNs with 4
/// coordinators.
fn pooled_store() -> (Store, TableDemand) {
    let demand = TableDemand {
        id: TableId(1),
        value_len: 16,
        expected_records: 1000,
        grows: true,
    };
    let cfg = StoreConfig::for_tables(3, &[demand], 4, 1024, 2)
        .with_sparse_indexes(&[demand], &[(TableId(1), 16_000)]);
    let bytes = cfg.bytes_per_mn().unwrap();
    (Store::new(cfg, regions(3, bytes)).unwrap(), demand)
}

#[test]
fn sparse_tables_pool_their_records_and_dense_ones_do_not() {
    let (s, demand) = pooled_store();
    let t = *s.table(TableId(1)).unwrap();
    let pool = t
        .spec
        .pool
        .expect("a table filling 6 % of its key space is pooled");
    // Room for the records (+1/16 + 64 per partition) and as many inserts again.
    assert_eq!(pool.loaded, (1000 + 1000 / 16_u64).div_ceil(3) + 64);
    assert_eq!(
        pool.per_coordinator,
        (1000 + 4096_u64).div_ceil(3).div_ceil(4)
    );
    assert_eq!(
        t.records_per_partition,
        pool.loaded + 4 * pool.per_coordinator
    );
    let direct = StoreConfig::for_tables(3, &[demand], 4, 1024, 2)
        .with_direct_index(TableId(1), 16_000)
        .bytes_per_mn()
        .unwrap();
    assert!(
        s.bytes_per_mn() < direct,
        "{} >= {direct}",
        s.bytes_per_mn()
    );
    // A dense table keeps its records in the slots.
    let dense = StoreConfig::for_tables(3, &[demand], 4, 1024, 2)
        .with_sparse_indexes(&[demand], &[(TableId(1), 1000)]);
    assert_eq!(dense.tables[0].pool, None);
    assert_eq!(dense.tables[0].direct_keys, Some(1000));
}

#[test]
fn pooled_records_are_found_through_their_slots() {
    let (s, _) = pooled_store();
    let bytes = s.bytes_per_mn() as usize;
    let mut mem = vec![vec![0u8; bytes]; 3];
    let mut loader = Loader::new(&s);
    let mut seen = std::collections::HashSet::new();
    for k in (0..16_000).step_by(16) {
        let loc = loader
            .load(TableId(1), Key(k), &[3; 16], |n, off, b| {
                let off = off as usize;
                mem[usize::from(n.0)][off..off + b.len()].copy_from_slice(b);
            })
            .unwrap();
        assert!(
            seen.insert(loc.offset),
            "two keys share record {}",
            loc.offset
        );
        assert_eq!(s.item_at(loc.bucket, loc.slot), Err(StoreError::Pooled(1)));
        for mn in s.replicas(loc.bucket.partition) {
            let m = &mem[usize::from(mn)];
            let b = loc.bucket.offset as usize;
            let bucket = &m[b..b + BUCKET_LEN];
            let (used, _) = parse_bucket(bucket);
            let slot = used.iter().find(|(_, key)| *key == k).unwrap().0;
            assert_eq!(s.item_in_bucket(loc.bucket, slot, bucket), Ok(loc));
            let off = loc.offset as usize;
            let item = DataItem::new_checked(&m[off..off + DataItemHeader::item_len(16)]);
            assert_eq!(item.unwrap().key(), k);
        }
        assert_eq!(
            loader.loaded().borrow().loc(&s, TableId(1), Key(k)),
            Some(loc)
        );
    }
    assert_eq!(loader.loaded().borrow().loc(&s, TableId(1), Key(1)), None);
    assert_eq!(
        loader.load(TableId(1), Key(16), &[3; 16], |_, _, _| {}),
        Err(StoreError::DuplicateKey { table: 1, key: 16 })
    );
    // A slot naming anything but a record of its partition's pool is refused.
    let loc = loader
        .loaded()
        .borrow()
        .loc(&s, TableId(1), Key(0))
        .unwrap();
    let other = (loc.bucket.partition + 1) % 3;
    for raw in [
        PackedAddr::new(other, loc.offset).unwrap(),
        PackedAddr::new(loc.bucket.partition, loc.offset + 8).unwrap(),
        PackedAddr::new(loc.bucket.partition, loc.bucket.offset).unwrap(),
        PackedAddr::NULL,
    ] {
        let slot = index_slot_bytes(0, raw);
        assert!(matches!(
            s.item_in_slot(loc.bucket, 0, &slot),
            Err(StoreError::BadSlotAddress { .. })
        ));
    }
}

#[test]
fn loader_and_coordinators_take_disjoint_parts_of_a_pool() {
    let (s, _) = pooled_store();
    let pool = s.table(TableId(1)).unwrap().spec.pool.unwrap();
    let mut loader = Loader::new(&s);
    let mut loaded = std::collections::HashSet::new();
    let mut k = 0;
    // Fill partition 0's loader share, then one more key of it is refused.
    let mut in_p0 = 0;
    let refused = loop {
        let b = s.bucket_of(TableId(1), Key(k)).unwrap();
        if b.partition == 0 {
            match loader.load(TableId(1), Key(k), &[0; 16], |_, _, _| {}) {
                Ok(loc) => {
                    loaded.insert(loc.offset);
                    in_p0 += 1;
                }
                Err(e) => break e,
            }
        }
        k += 1;
    };
    assert_eq!(in_p0, pool.loaded);
    assert!(matches!(
        refused,
        StoreError::PoolExhausted { partition: 0, .. }
    ));
    let bucket = s.bucket_of(TableId(1), Key(k)).unwrap();
    let mut pools = [InsertPool::new(), InsertPool::new()];
    let mut inserted = std::collections::HashSet::new();
    for n in 0..pool.per_coordinator {
        for (c, p) in pools.iter_mut().enumerate() {
            let c = c as u16;
            let loc = p.next(&s, c, bucket, 3).unwrap();
            assert_eq!(p.next(&s, c, bucket, 3).unwrap(), loc, "not claimed yet");
            assert_eq!(s.insert_item(bucket, 3, c, n), Ok(loc));
            p.claimed(&s, bucket);
            assert!(!loaded.contains(&loc.offset));
            assert!(
                inserted.insert(loc.offset),
                "record {} taken twice",
                loc.offset
            );
            assert_eq!(
                s.item_in_slot(
                    bucket,
                    3,
                    &index_slot_bytes(k, PackedAddr::new(0, loc.offset).unwrap())
                ),
                Ok(loc)
            );
        }
    }
    assert!(matches!(
        pools[0].next(&s, 0, bucket, 3),
        Err(StoreError::PoolExhausted { .. })
    ));
    assert_eq!(
        s.insert_item(bucket, 3, 4, 0),
        Err(StoreError::NoLogRegion(4))
    );
    let (first, records) = s.record_area(TableId(1), 0).unwrap();
    for off in loaded.iter().chain(&inserted) {
        assert!(
            *off >= first && *off < first + records * s.table(TableId(1)).unwrap().item_len as u64
        );
    }
}

/// TATP at LOTUS's size (3M subscribers, 64 coordinators, 3 MNs; the demands and key
/// spaces `dmem-workloads` declares): pooling its three sparse tables shrinks the
/// regions by 32 % (the README's figures print with `--nocapture`).
#[test]
fn tatp_at_lotus_size_is_smaller_pooled() {
    let p = 3_000_000_u64;
    let ids = p + 1;
    let table = |id, value_len, records, grows| TableDemand {
        id: TableId(id),
        value_len,
        expected_records: records,
        grows,
    };
    let demands = [
        table(0, 48, p, false),
        table(1, 16, p * 5 / 2, false),
        table(2, 8, p * 5 / 2, false),
        table(3, 16, p * 15 / 4, true),
    ];
    let spaces = [
        (TableId(0), ids),
        (TableId(1), ids << 2),
        (TableId(2), ids << 2),
        (TableId(3), ids << 4),
    ];
    let base = StoreConfig::for_tables(3, &demands, 64, 4096, 2);
    let direct = base.clone().with_direct_indexes(&spaces);
    let pooled = base.with_sparse_indexes(&demands, &spaces);
    let (d, s) = (
        direct.bytes_per_mn().unwrap(),
        pooled.bytes_per_mn().unwrap(),
    );
    println!("bytes per MN: direct {d}, pooled {s}");
    // Resident: the index and the loaded records, on every replica.
    let touched: u64 = demands
        .iter()
        .zip(&spaces)
        .map(|(t, &(_, k))| {
            k.div_ceil(3).div_ceil(7) * 3 * BUCKET_LEN as u64
                + t.expected_records * DataItemHeader::item_len(t.value_len) as u64
        })
        .sum();
    println!("index + records per replica: {touched}");
    assert!(s * 10 < d * 7, "{s} vs {d}");
    assert!(touched < s);
}

#[test]
fn cache_counts_hits() {
    let s = store();
    let mut c = AddressCache::new();
    assert!(c.get(TableId(1), Key(1)).is_none());
    let loc = s
        .item_at(s.bucket_of(TableId(1), Key(1)).unwrap(), 0)
        .unwrap();
    c.put(TableId(1), Key(1), loc);
    assert_eq!(c.get(TableId(1), Key(1)), Some(loc));
    assert_eq!(c.stats(), (1, 1));
}
