//! `MnMemory` out of band on a real fabric (an MN process's own mapping, a CN process's
//! regions alone), `AnyContext` over the shm fabric, and `Recorder`'s second sink.

use std::cell::RefCell;
use std::rc::Rc;

use dmem_deploy::{AnyContext, MnMemory, Recorder};
use dmem_runtime::Executor;
use dmem_shm::{ShmFabric, ShmMemoryNode};
use dmem_txn::{CoordinatorId, History, HistorySink, TxnId, TxnOutcome, TxnRecord};
use dmem_verbs::{Endpoint, NodeId, Port, RKey, Verbs, VerbsExt};

#[test]
fn mapped_memory_is_written_and_read_out_of_band_and_remote_memory_is_not() {
    let mns: Vec<ShmMemoryNode> = (0..2)
        .map(|i| ShmMemoryNode::create(NodeId(i), RKey(40 + u32::from(i)), 4096).unwrap())
        .collect();
    let regions: Vec<_> = mns.iter().map(ShmMemoryNode::region).collect();
    // MN 1's process: only its own memory is mapped.
    let own = MnMemory::mapped(regions.clone(), &[&mns[1]]).unwrap();
    own.write(NodeId(1), 64, b"record").unwrap();
    own.write(NodeId(0), 64, b"elsewhere").unwrap(); // not this process's: dropped
    assert_eq!(own.read(NodeId(1), 64, 6).as_deref(), Some(&b"record"[..]));
    assert_eq!(own.read(NodeId(0), 64, 9), None);
    assert!(own.write(NodeId(1), 4090, b"too long").is_err());
    // A CN process: the regions alone.
    let remote = MnMemory::remote(regions.clone());
    assert_eq!(remote.mn_count(), 2);
    assert_eq!(remote.regions(), regions);
    remote.write(NodeId(1), 0, b"x").unwrap();
    assert_eq!(remote.read(NodeId(1), 64, 6), None);
    // A CN's shm context as an `AnyContext` sees what the MN loaded, and MN 0 untouched.
    let fabric = ShmFabric::new();
    let cn = NodeId(7);
    let mut ctx = fabric
        .context(Endpoint {
            node: cn,
            port: Port(1),
        })
        .unwrap();
    for mn in &mns {
        ctx.add_link(mn.link(cn).unwrap()).unwrap();
    }
    let ctx = AnyContext::from(ctx);
    assert_eq!(ctx.fabric(), "shm");
    assert_eq!(ctx.node(), cn);
    assert!(ctx.as_sim().is_none());
    let (loaded, untouched) = Executor::new().block_on(async {
        (
            ctx.read(regions[1].at(64).unwrap(), 6).await.unwrap(),
            ctx.read(regions[0].at(64).unwrap(), 9).await.unwrap(),
        )
    });
    assert_eq!(loaded, b"record");
    assert_eq!(untouched, vec![0; 9]);
    assert_eq!(ctx.local_endpoint().port, Port(1));
}

/// Collects what it is told.
#[derive(Default)]
struct Seen(RefCell<Vec<(TxnId, Option<TxnOutcome>)>>);

impl HistorySink for Seen {
    fn record(&self, txn: TxnRecord) {
        self.0.borrow_mut().push((txn.id, None));
    }
    fn resolve(&self, id: TxnId, outcome: TxnOutcome, _: u64) {
        self.0.borrow_mut().push((id, Some(outcome)));
    }
}

#[test]
fn a_recorder_tells_its_second_sink_everything_at_once() {
    let history = Rc::new(RefCell::new(History::new()));
    let seen = Rc::new(Seen::default());
    let recorder = Recorder::with_tee(Rc::clone(&history), Rc::clone(&seen) as Rc<dyn HistorySink>);
    let id = TxnId {
        coordinator: CoordinatorId(3),
        seq: 1,
    };
    recorder.record(TxnRecord {
        id,
        begin: 10,
        end: 0,
        outcome: TxnOutcome::Unknown,
        reads: Vec::new(),
        writes: Vec::new(),
    });
    assert_eq!(seen.0.borrow().len(), 1);
    recorder.resolve(id, TxnOutcome::Committed, 20);
    assert_eq!(
        *seen.0.borrow(),
        vec![(id, None), (id, Some(TxnOutcome::Committed))]
    );
    assert_eq!(history.borrow().txns[0].outcome, TxnOutcome::Committed);
    assert_eq!(history.borrow().txns[0].end, 20);
    assert!(Rc::ptr_eq(recorder.history(), &history));
    // Streaming only: the sink hears everything, nothing is kept.
    let streaming = Recorder::streaming(Rc::clone(&seen) as Rc<dyn HistorySink>);
    streaming.resolve(id, TxnOutcome::Aborted, 30);
    assert_eq!(
        seen.0.borrow().last(),
        Some(&(id, Some(TxnOutcome::Aborted)))
    );
    assert!(streaming.history().borrow().txns.is_empty());
}
