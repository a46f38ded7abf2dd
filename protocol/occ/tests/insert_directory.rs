//! The insert directory in MN memory (`dmem-occ`'s `store` module docs): two directories
//! over the same MN — two CN processes' — agree on the slot of every key one of them
//! gives one, never give two keys one slot, and a key's slot is found from the other
//! directory, by recovery's scan and by the final check's synchronous probe.

use std::collections::HashSet;
use std::rc::Rc;

use dmem_deploy::{AnyContext, DeploySpec, MnMemory, TableDemand};
use dmem_occ::store::{Directory, FILL_WAIT_NS, INSERT_ENTRY, Layout};
use dmem_runtime::Executor;
use dmem_shm::{ShmFabric, ShmMemoryNode};
use dmem_txn::{Key, TableId, TxnError};
use dmem_verbs::{Endpoint, NodeId, Port, RKey};

const T: TableId = TableId(3);

/// One growing table of 24-byte values, nothing loaded, with room for `inserts` if given.
fn growing_table(inserts: Option<u64>) -> DeploySpec {
    let mut spec = DeploySpec::new(
        vec![TableDemand {
            id: T,
            value_len: 24,
            expected_records: 0,
            grows: true,
        }],
        4,
    );
    if let Some(n) = inserts {
        spec.insert_room = vec![(T, n)];
    }
    spec
}

/// A context of CN node `node` (one process's) linked to `mn`.
fn cn_context(fabric: &ShmFabric, mn: &ShmMemoryNode, node: u16) -> AnyContext {
    let mut c = fabric
        .context(Endpoint {
            node: NodeId(node),
            port: Port(0),
        })
        .unwrap();
    c.add_link(mn.link(NodeId(node)).unwrap()).unwrap();
    AnyContext::Shm(Rc::new(c))
}

#[test]
fn two_processes_directories_agree_through_mn_memory() {
    // A growing table with room for 200 inserts (264 with the margin): 264 × 5/2 + 64 = 724
    // entries, so 200 keys meet collisions and probe past them.
    let layout = Layout::new(&growing_table(Some(200)), 1).unwrap();
    let (_, entries) = layout.insert_dirs[&T];
    assert_eq!(entries, 724);
    let mn = ShmMemoryNode::create(NodeId(0), RKey(1), layout.bytes_per_mn).unwrap();
    let fabric = ShmFabric::new();
    let context = |node: u16| cn_context(&fabric, &mn, node);
    let (a_ctx, b_ctx) = (context(1), context(2));
    let a = Directory::new(layout.clone(), vec![mn.region()]);
    let b = Directory::new(layout.clone(), vec![mn.region()]);
    a.share_inserts();
    b.share_inserts();
    Executor::new().block_on(async {
        let mut slots = HashSet::new();
        for k in 0..200u64 {
            // Alternate which process inserts; the other finds the same slot.
            let (first, second) = if k % 2 == 0 {
                ((&a, &a_ctx), (&b, &b_ctx))
            } else {
                ((&b, &b_ctx), (&a, &a_ctx))
            };
            let loc = first.0.locate(first.1, T, Key(k)).await.unwrap();
            assert!(
                slots.insert(loc),
                "key {k} got a slot another key has: {loc:?}"
            );
            assert!(loc.offset >= layout.records_base && loc.offset < layout.records_end);
            assert_eq!(second.0.locate(second.1, T, Key(k)).await.unwrap(), loc);
        }
        // Recovery's scan sees every key either inserted, at its slot.
        let scanned = a.all_in_memory(&a_ctx).await.unwrap();
        assert_eq!(scanned.len(), 200);
        for ((table, key), loc) in scanned {
            assert_eq!(table, T);
            assert_eq!(b.locate(&b_ctx, T, key).await.unwrap(), loc);
        }
        // The final check's synchronous probe (here through the mapping) agrees, and a key
        // never inserted has no slot.
        let memory = MnMemory::mapped(vec![mn.region()], &[&mn]).unwrap();
        let read = |_: u16, offset: u64, len: usize| memory.read(NodeId(0), offset, len);
        let c = Directory::new(layout.clone(), vec![mn.region()]);
        c.share_inserts();
        assert_eq!(c.find(T, Key(7), read), a.get(T, Key(7)));
        assert_eq!(c.find(T, Key(10_000), read), None);
        // The directory fills: the rest of the entries, then a refusal that is not retried.
        let mut more = 0;
        let error = loop {
            match a.locate(&a_ctx, T, Key(1_000 + more)).await {
                Ok(_) => more += 1,
                Err(e) => break e,
            }
            assert!(more <= entries, "more keys than entries");
        };
        assert!(matches!(error, TxnError::OutOfRoom(_)), "{error}");
        assert!(!error.is_retryable());
    });
}

/// A claimer that died between claiming an entry (its key CASed in) and filling it (the
/// offset CASed in) does not leave the key without a slot: a prober fills the entry after
/// `FILL_WAIT_NS`, and every directory then agrees on that slot.
#[test]
fn an_entry_whose_claimer_died_is_filled_by_the_next_prober() {
    let layout = Layout::new(&growing_table(None), 1).unwrap();
    let (base, entries) = layout.insert_dirs[&T];
    let mn = ShmMemoryNode::create(NodeId(0), RKey(1), layout.bytes_per_mn).unwrap();
    let memory = MnMemory::mapped(vec![mn.region()], &[&mn]).unwrap();
    // Key 5 claimed in every entry (wherever its probe starts), no offset: a dead claimer.
    for e in 0..entries {
        memory
            .write(NodeId(0), base + e * INSERT_ENTRY, &6u64.to_le_bytes())
            .unwrap();
    }
    let fabric = ShmFabric::new();
    let context = |node: u16| cn_context(&fabric, &mn, node);
    let (b_ctx, c_ctx) = (context(2), context(3));
    let b = Directory::new(layout.clone(), vec![mn.region()]);
    let c = Directory::new(layout.clone(), vec![mn.region()]);
    b.share_inserts();
    c.share_inserts();
    Executor::new().block_on(async {
        let before = dmem_verbs::Clock::now(&b_ctx);
        let loc = b.locate(&b_ctx, T, Key(5)).await.unwrap();
        assert!(dmem_verbs::Clock::now(&b_ctx) - before >= FILL_WAIT_NS);
        assert!(loc.offset >= layout.records_base && loc.offset < layout.records_end);
        assert_eq!(c.locate(&c_ctx, T, Key(5)).await.unwrap(), loc);
    });
}
