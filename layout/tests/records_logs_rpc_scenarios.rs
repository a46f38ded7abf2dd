//! Scenarios that combine records, logs and RPC frames through the public API only, the
//! way the protocol crates will: Pandora's log recovery (§3.2.2 step 3) over FORD data
//! items, OOCC replay from redo logs (§V), and a Dandelion Get batch (§4.2.1, §5) whose
//! responses carry the key's metadata word.

use dmem_layout::LayoutError;
use dmem_layout::kv_meta::KvMeta;
use dmem_layout::log::{DataLogEntry, LogOp, LogRecord, LogRegion, LogWriter};
use dmem_layout::record::{
    BucketLookup, DataItem, DataItemHeader, DataVersion, IndexBucket1, IndexSlot, ItemFlags,
    OoccLockState, OoccLockWord, OoccRecord, OoccRecordHeader, RemoteAddr,
};
use dmem_layout::rpc::{RpcFrame, RpcFrameBuilder, RpcPacketInfo};

const VALUE_LEN: usize = 8;
const ITEM_LEN: usize = DataItemHeader::item_len(VALUE_LEN);

/// A toy memory node: consecutive FORD data items of 8-byte values.
struct Mn {
    bytes: Vec<u8>,
}

impl Mn {
    fn with_items(n: u64) -> Self {
        let mut bytes = vec![0u8; ITEM_LEN * n as usize];
        for (key, chunk) in bytes.chunks_mut(ITEM_LEN).enumerate() {
            let header = DataItemHeader::new(
                key as u64,
                1,
                0,
                DataVersion::new(1).unwrap(),
                ItemFlags::LOADED,
            );
            DataItem::emit(chunk, header, &[key as u8; VALUE_LEN]).unwrap();
        }
        Self { bytes }
    }

    fn addr(key: u64) -> RemoteAddr {
        RemoteAddr::new(0, key * ITEM_LEN as u64).unwrap()
    }

    fn item(&mut self, addr: RemoteAddr) -> DataItem<&mut [u8]> {
        let at = addr.offset() as usize;
        DataItem::new_checked(&mut self.bytes[at..at + ITEM_LEN]).unwrap()
    }
}

/// A coordinator with PILL id 7 locks X and Y, logs both undo records in one WRITE, then
/// crashes after updating only X. Recovery finds that not every object was updated, so
/// it rolls back X from the undo log and unlocks both (Pandora §3.2.2 step 3).
#[test]
fn pandora_recovery_rolls_back_a_partial_commit() {
    let mut mn = Mn::with_items(4);
    let coordinator = 7u16;
    let lock = u64::from(coordinator) + 1;
    let (x, y) = (1u64, 2u64);

    let mut log = vec![0u8; 256];
    let mut w = LogWriter::new(&mut log, coordinator, 1, 99).unwrap();
    for key in [x, y] {
        let mut item = mn.item(Mn::addr(key));
        item.header_mut().set_lock_word(lock);
        let entry = DataLogEntry {
            op: LogOp::Update,
            table_id: 1,
            key,
            addr: Mn::addr(key),
            version: item.version().to_raw(),
        };
        let old = item.value().to_vec();
        w.append_undo(&entry, &old).unwrap();
    }
    let log_len = w.finish().len();

    // Commit applies X only, then the coordinator dies.
    {
        let mut item = mn.item(Mn::addr(x));
        item.value_mut().copy_from_slice(&[0xEE; VALUE_LEN]);
        let next = item.version().bumped();
        item.header_mut().set_version(next);
    }

    // Recovery coordinator: READ the log region, rebuild the write-set.
    let region = LogRegion::new_checked(&log[..log_len]).unwrap();
    assert!(region.is_valid());
    assert_eq!(region.header().coordinator_id(), coordinator);
    let undo: Vec<_> = region
        .records()
        .map(|r| match r {
            LogRecord::Undo(u) => (u.header.entry(), u.old_value.to_vec()),
            other => panic!("Pandora logs undo records, got {other:?}"),
        })
        .collect();
    let updated: Vec<bool> = undo
        .iter()
        .map(|(e, _)| mn.item(e.addr).version().to_raw() != e.version)
        .collect();
    assert_eq!(updated, [true, false]);
    let roll_forward = updated.iter().all(|&u| u);
    assert!(!roll_forward);
    for (entry, old) in &undo {
        let mut item = mn.item(entry.addr);
        if item.version().to_raw() != entry.version {
            item.value_mut().copy_from_slice(old);
            item.header_mut()
                .set_version(DataVersion::from_raw(entry.version));
        }
        assert_eq!(
            item.lock_word(),
            lock,
            "only the failed coordinator's locks are released"
        );
        item.header_mut().set_lock_word(0);
    }
    for key in [x, y] {
        let item = mn.item(Mn::addr(key));
        assert_eq!(
            (item.value(), item.version().counter()),
            (&[key as u8; VALUE_LEN][..], 1)
        );
        assert!(item.is_readable());
    }
    // §3.2.3: truncate before the stray-lock notification.
    let mut region = LogRegion::new_checked(&mut log[..log_len]).unwrap();
    region.truncate();
    assert!(!LogRegion::new_checked(&log[..log_len]).unwrap().is_valid());
}

/// A CN finds a record through the MN hash index (one bucket READ), reads it, and an
/// OOCC writer then replays its redo log into it with the one-op write-unlock.
#[test]
fn index_lookup_then_oocc_replay() {
    let value_len = 12;
    let mut mn = vec![0u8; 64 + OoccRecordHeader::record_len(value_len)];
    let record_addr = RemoteAddr::new(0, 64).unwrap();
    let mut bucket = IndexBucket1::new();
    bucket.slots_mut()[1] = IndexSlot::new(0xABC, record_addr);
    mn[..64].copy_from_slice(zerocopy::IntoBytes::as_bytes(&bucket));
    let header = OoccRecordHeader::new(0xABC, 2, 0, ItemFlags::LOADED);
    let locked = OoccLockWord::free(3)
        .unwrap()
        .with_intention_lock(5)
        .with_write_lock();
    OoccRecord::emit(&mut mn[64..], header, &[1; 12], locked).unwrap();

    let addr = match dmem_layout::record::lookup_in_bucket::<3>(&mn[..64], 0xABC).unwrap() {
        BucketLookup::Found { addr, .. } => addr,
        other => panic!("expected the key, got {other:?}"),
    };
    assert_eq!(addr, record_addr);

    // Redo log stored in Validate&Logging, replayed after a crash.
    let mut log = vec![0u8; 128];
    let mut w = LogWriter::new(&mut log, 5, 1, 1).unwrap();
    let entry = DataLogEntry {
        op: LogOp::Update,
        table_id: 2,
        key: 0xABC,
        addr,
        version: 4,
    };
    w.append_redo(&entry, &[9; 12]).unwrap();
    let len = w.finish().len();
    for record in LogRegion::new_checked(&log[..len]).unwrap().records() {
        let LogRecord::Redo(redo) = record else {
            panic!("OOCC logs redo records")
        };
        let at = redo.header.addr().offset() as usize;
        let mut local = mn[at..].to_vec();
        let mut rec = OoccRecord::new_checked(&mut local[..]).unwrap();
        let range = rec.prepare_commit(redo.new_value, 1).unwrap();
        assert_eq!(rec.lock_word().version(), redo.header.new_version());
        mn[at + range.start..at + range.end].copy_from_slice(&local[range.clone()]);
    }
    let rec = OoccRecord::new_checked(&mn[64..]).unwrap();
    assert_eq!(rec.lock_state(), OoccLockState::Free);
    assert_eq!(rec.value(), &[9; 12]);
}

/// Dandelion: a coordinator batches Gets for three keys to a remote primary; the response
/// batch carries each key's metadata word in front of its value; a `GetOne` refuses the
/// locked key.
#[test]
fn dandelion_get_batch_with_metadata() {
    let store = [
        (10u64, KvMeta::INSERTED.with_version(4).unwrap(), [1u8; 16]),
        (
            11,
            KvMeta::INSERTED.with_version(9).unwrap().with_locked(true),
            [2; 16],
        ),
        (12, KvMeta::INSERTED.with_deleted(true), [3; 16]),
    ];
    let mut req = [0u8; 188];
    let mut b = RpcFrameBuilder::new(
        &mut req,
        RpcPacketInfo {
            src_node: 1,
            flow: 0,
            response: false,
            epoch: 5,
        },
    )
    .unwrap();
    for (slot, (key, _, _)) in store.iter().enumerate() {
        b.push(1, slot as u32, &key.to_le_bytes()).unwrap();
    }
    let req_len = b.finish().len();

    let mut resp = [0u8; 512];
    let frame = RpcFrame::new_checked(&req[..req_len]).unwrap();
    assert_eq!(frame.epoch(), 5);
    let mut b = RpcFrameBuilder::new(
        &mut resp,
        RpcPacketInfo {
            src_node: 2,
            flow: 0,
            response: true,
            epoch: 5,
        },
    )
    .unwrap();
    for m in frame.messages() {
        let key = u64::from_le_bytes(m.payload().try_into().unwrap());
        let (_, meta, value) = store.iter().find(|(k, _, _)| *k == key).unwrap();
        b.push_with(2, m.req_slot(), 4 + 16, |out| {
            out[..4].copy_from_slice(zerocopy::IntoBytes::as_bytes(meta));
            out[4..].copy_from_slice(value);
        })
        .unwrap();
    }
    let resp_len = b.finish().len();
    let frame = RpcFrame::new_checked(&resp[..resp_len]).unwrap();
    let seen: Vec<(u32, u32, bool, bool)> = frame
        .messages()
        .map(|m| {
            let meta = <KvMeta as zerocopy::FromBytes>::read_from_bytes(&m.payload()[..4]).unwrap();
            (
                m.req_slot(),
                meta.version(),
                meta.get_one_allowed(),
                meta.is_deleted(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (0, 4, true, false),
            (1, 9, false, false),
            (2, 0, false, true)
        ]
    );

    // A frame cut in transit is refused, never half-processed.
    assert!(matches!(
        RpcFrame::new_checked(&resp[..resp_len - 1]),
        Err(LayoutError::TooShort { .. })
    ));
}
