//! Recovering a crashed CN's coordinators together (`recovery::recover_coordinators`: one
//! lock-word scan for all of them) leaves MN memory exactly as recovering them one by one
//! (`recover_coordinator`: one scan each) does, and decides the same.

use std::rc::Rc;

use dmem_deploy::{AnyContext, Decision, DeploySpec, MnMemory, TableDemand};
use dmem_layout::record::{OoccLockState, OoccLockWord, OoccRecordHeader};
use dmem_occ::recovery::{RedoLog, RedoLogWriter, recover_coordinator, recover_coordinators};
use dmem_occ::store::{Directory, Layout, emit};
use dmem_runtime::Executor;
use dmem_shm::{ShmFabric, ShmMemoryNode};
use dmem_txn::{Key, TableId};
use dmem_verbs::{Endpoint, NodeId, Port, RKey};

const T: TableId = TableId(1);
const VLEN: usize = 24;
const KEYS: u64 = 100;

fn layout() -> Layout {
    let spec = DeploySpec::new(
        vec![TableDemand {
            id: T,
            value_len: VLEN,
            expected_records: KEYS,
            grows: false,
        }],
        4,
    );
    Layout::new(&spec, 1).unwrap()
}

fn free(v: u64) -> OoccLockWord {
    OoccLockWord::free(v).unwrap()
}

/// The lock word key `k` starts with: coordinator 1 intention-locks keys 0 mod 5,
/// coordinator 2 write-locks keys 1 mod 5, coordinator 3 (alive) intention-locks keys
/// 2 mod 5; key 0's commit WRITE of coordinator 1 landed (free at version 4).
fn initial_lock(k: u64) -> OoccLockWord {
    match (k, k % 5) {
        (0, _) => free(4),
        (_, 0) => free(3).with_intention_lock(1),
        (_, 1) => free(3).with_intention_lock(2).with_write_lock(),
        (_, 2) => free(3).with_intention_lock(3),
        _ => free(3),
    }
}

/// One MN loaded with the records and the redo logs of coordinators 1 (keys 0 and 5,
/// key 0's WRITE landed: rolls forward) and 2 (key 1, nothing landed: rolls back).
fn loaded(fabric: &ShmFabric, node: u16) -> (ShmMemoryNode, MnMemory, Rc<Directory>, AnyContext) {
    let layout = layout();
    let mn = ShmMemoryNode::create(NodeId(0), RKey(1), layout.bytes_per_mn).unwrap();
    let memory = MnMemory::mapped(vec![mn.region()], &[&mn]).unwrap();
    let dir = Rc::new(Directory::new(layout.clone(), vec![mn.region()]));
    let new_value = |k: u64| vec![k as u8 + 100; VLEN];
    for k in 0..KEYS {
        let loc = dir.slot(T, Key(k)).unwrap();
        let value = if k == 0 {
            new_value(0)
        } else {
            vec![k as u8; VLEN]
        };
        let image = emit(T, Key(k), Some(&value), VLEN, initial_lock(k), None);
        memory.write(NodeId(0), loc.offset, &image).unwrap();
    }
    for (id, keys) in [(1u16, vec![0u64, 5]), (2, vec![1])] {
        let mut log = RedoLogWriter::new(id, 40 + u64::from(id), keys.len());
        for &k in &keys {
            let image = emit(T, Key(k), Some(&new_value(k)), VLEN, free(4), None);
            log.push(dir.get(T, Key(k)).unwrap(), &image);
        }
        let at = layout.log_offset(id);
        memory.write(NodeId(0), at, &log.finish().unwrap()).unwrap();
    }
    let mut c = fabric
        .context(Endpoint {
            node: NodeId(node),
            port: Port(0),
        })
        .unwrap();
    c.add_link(mn.link(NodeId(node)).unwrap()).unwrap();
    (mn, memory, dir, AnyContext::Shm(Rc::new(c)))
}

fn lock_of(memory: &MnMemory, dir: &Directory, k: u64) -> OoccLockWord {
    let loc = dir.get(T, Key(k)).unwrap();
    let at = loc.offset + OoccRecordHeader::lock_offset(VLEN) as u64;
    let bytes = memory.read(NodeId(0), at, 8).unwrap();
    OoccLockWord::from_raw(u64::from_le_bytes(bytes.try_into().unwrap()))
}

#[test]
fn one_scan_for_all_coordinators_recovers_as_one_scan_each() {
    let fabric = ShmFabric::new();
    let (_a_mn, a_mem, a_dir, a_ctx) = loaded(&fabric, 1);
    let (_b_mn, b_mem, b_dir, b_ctx) = loaded(&fabric, 2);
    let (together, one_by_one) = Executor::new().block_on(async {
        let together = recover_coordinators(&a_ctx, &a_dir, &[1, 2], RedoLog::Validated)
            .await
            .unwrap();
        // Every coordinator is settled once the shared lock scan is over.
        assert!(together.iter().all(|(_, at)| *at == together[0].1));
        let together: Vec<_> = together.into_iter().map(|(r, _)| r).collect();
        let mut one_by_one = Vec::new();
        for id in [1, 2] {
            let r = recover_coordinator(&b_ctx, &b_dir, id, RedoLog::Validated).await;
            one_by_one.push(r.unwrap());
        }
        (together, one_by_one)
    });
    assert_eq!(together, one_by_one);
    let bytes = layout().bytes_per_mn as usize;
    assert!(a_mem.read(NodeId(0), 0, bytes) == b_mem.read(NodeId(0), 0, bytes));
    // Coordinator 1 rolled key 5 forward (key 0 had landed) and released keys 10, 15, …,
    // 95; coordinator 2 rolled back and released keys 1, 6, …, 96.
    assert_eq!(together[0].decision, Some(Decision::RollForward));
    assert_eq!((together[0].restored, together[0].unlocked), (1, 18));
    assert_eq!(together[1].decision, Some(Decision::RollBack));
    assert_eq!((together[1].restored, together[1].unlocked), (0, 20));
    assert_eq!(lock_of(&a_mem, &a_dir, 5), free(4));
    assert_eq!(lock_of(&a_mem, &a_dir, 1), free(3));
    for k in 0..KEYS {
        let w = lock_of(&a_mem, &a_dir, k);
        let mine = w.state() != Ok(OoccLockState::Free) && (w.owner() == 1 || w.owner() == 2);
        assert!(
            !mine,
            "key {k} still locked by a recovered coordinator: {w:?}"
        );
        if k % 5 == 2 {
            assert_eq!(w, initial_lock(k), "a live coordinator's lock was released");
        }
    }
}
