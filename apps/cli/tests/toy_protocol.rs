//! A protocol registered by a test runs through `dmem bench` and the litmus suite with no
//! CLI change: a serial reference store (one global lock, an in-memory map with per-record
//! versions, every transaction recorded for the checker).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use dmem_deploy::{
    AnyContext, DeployError, DeploySpec, Deployment, MnMemory, Protocol, Recorder, RecoveryEvent,
    RecoveryTiming, Registry, SimRecovery,
};
use dmem_sim::Sim;
use dmem_txn::{
    AbortReason, BoxCoordinator, Coordinator, CoordinatorId, History, HistorySink, Key, ReadEvent,
    TableId, Transaction, TxnError, TxnId, TxnKind, TxnOutcome, TxnRecord, Version, WriteEvent,
    WriteKind,
};
use dmem_verbs::{Clock, Nanos};

/// Virtual time every operation takes (the closed loop must see time advance).
const OP_NS: Nanos = 500;

/// `(table, key)` → current value (`None`: deleted) and the version of that state.
type Map = HashMap<(TableId, Key), (Option<Vec<u8>>, u64)>;

struct State {
    map: RefCell<Map>,
    locked: Cell<bool>,
    history: Rc<RefCell<History>>,
    /// Every commit fails validation (a protocol that never commits).
    refuse_commits: bool,
    /// From this virtual time on, one read of an updated record is recorded as having
    /// observed the version before the latest (a stale read; the data stays right, so only
    /// the checker can tell): a bug that shows up late in a run.
    stale_read_after: Option<Nanos>,
    /// Whether that read happened already.
    lost: Cell<bool>,
}

/// The toy protocol: serial execution under one global lock (`serial`), the same refusing
/// every commit (`serial-refusing`), or recording one stale read after 80 ms of virtual
/// time (`serial-late-bug`).
struct Serial {
    refuse_commits: bool,
    stale_read_after: Option<Nanos>,
}

/// When `serial-late-bug` records its stale read: after the 50 ms that `dmem bench` used to check.
const LATE_BUG_NS: Nanos = 80_000_000;

impl Protocol for Serial {
    fn name(&self) -> String {
        if self.refuse_commits {
            "serial-refusing".to_owned()
        } else if self.stale_read_after.is_some() {
            "serial-late-bug".to_owned()
        } else {
            "serial".to_owned()
        }
    }
    fn mn_bytes_per_mn(&self, _: &DeploySpec, _: u16) -> Result<u64, DeployError> {
        Ok(0)
    }
    fn deploy_on(
        &self,
        _: MnMemory,
        _: &DeploySpec,
        history: Recorder,
    ) -> Result<Box<dyn Deployment>, DeployError> {
        Ok(Box::new(SerialDeployment(Rc::new(State {
            map: RefCell::new(HashMap::new()),
            locked: Cell::new(false),
            history: Rc::clone(history.history()),
            refuse_commits: self.refuse_commits,
            stale_read_after: self.stale_read_after,
            lost: Cell::new(false),
        }))))
    }
}

struct SerialDeployment(Rc<State>);

impl Deployment for SerialDeployment {
    fn load(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), DeployError> {
        self.0
            .map
            .borrow_mut()
            .insert((table, key), (Some(value.to_vec()), 0));
        Ok(())
    }
    fn coordinator(&mut self, ctx: AnyContext, id: u16) -> Result<BoxCoordinator, DeployError> {
        Ok(Box::new(SerialCoordinator {
            ctx,
            state: Rc::clone(&self.0),
            id,
            seq: 0,
        }))
    }
    fn read_final(&self, table: TableId, key: Key) -> Option<Vec<u8>> {
        self.0
            .map
            .borrow()
            .get(&(table, key))
            .and_then(|(v, _)| v.clone())
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn sim_recovery(&mut self) -> Option<&mut dyn SimRecovery> {
        Some(self)
    }
}

impl SimRecovery for SerialDeployment {
    fn start_recovery(
        &mut self,
        _: &Rc<Sim>,
        _: u16,
        _: RecoveryTiming,
    ) -> Result<(), DeployError> {
        // Nothing can fail: the map is not on the fabric.
        Ok(())
    }
    fn recovery_events(&self) -> Vec<RecoveryEvent> {
        Vec::new()
    }
    fn recovery_error(&self) -> Option<String> {
        None
    }
}

struct SerialCoordinator {
    ctx: AnyContext,
    state: Rc<State>,
    id: u16,
    seq: u64,
}

impl Coordinator for SerialCoordinator {
    type Txn<'a> = SerialTxn<'a>;

    async fn begin(&mut self, kind: TxnKind) -> Result<SerialTxn<'_>, TxnError> {
        while self.state.locked.get() {
            self.ctx.sleep(OP_NS).await;
        }
        self.state.locked.set(true);
        self.seq += 1;
        Ok(SerialTxn {
            id: TxnId {
                coordinator: CoordinatorId(u32::from(self.id)),
                seq: self.seq,
            },
            begin: self.ctx.now(),
            kind,
            co: self,
            reads: Vec::new(),
            writes: Vec::new(),
            done: false,
        })
    }
}

struct SerialTxn<'a> {
    co: &'a mut SerialCoordinator,
    id: TxnId,
    begin: Nanos,
    kind: TxnKind,
    reads: Vec<ReadEvent>,
    /// Buffered writes: key, new state, kind.
    writes: Vec<(TableId, Key, Option<Vec<u8>>, WriteKind)>,
    done: bool,
}

impl SerialTxn<'_> {
    /// The transaction's view of a record: its own last write, else the map.
    fn current(&self, table: TableId, key: Key) -> (Option<Vec<u8>>, u64) {
        if let Some((_, _, v, _)) = self
            .writes
            .iter()
            .rev()
            .find(|w| w.0 == table && w.1 == key)
        {
            return (v.clone(), 0);
        }
        self.co
            .state
            .map
            .borrow()
            .get(&(table, key))
            .cloned()
            .unwrap_or((None, 0))
    }

    async fn get(&mut self, table: TableId, key: Key) -> Result<Option<Vec<u8>>, TxnError> {
        self.co.ctx.sleep(OP_NS).await;
        let own = self.writes.iter().any(|w| w.0 == table && w.1 == key);
        let (value, version) = self.current(table, key);
        if !own {
            let state = &self.co.state;
            let stale = version > 0
                && !state.lost.get()
                && state
                    .stale_read_after
                    .is_some_and(|t| self.co.ctx.now() >= t);
            // The planted bug: the read is recorded as having observed the version before.
            let observed = if stale {
                state.lost.set(true);
                version - 1
            } else {
                version
            };
            self.reads
                .push(ReadEvent::new(table, key, Version(observed)));
        }
        Ok(value)
    }

    async fn put(
        &mut self,
        table: TableId,
        key: Key,
        value: Option<Vec<u8>>,
        kind: WriteKind,
    ) -> Result<(), TxnError> {
        self.co.ctx.sleep(OP_NS).await;
        if self.kind == TxnKind::ReadOnly {
            return Err(TxnError::ReadOnly);
        }
        let present = self.current(table, key).0.is_some();
        if present != (kind != WriteKind::Insert) {
            return Err(TxnError::KeyState(key.0));
        }
        self.writes.push((table, key, value, kind));
        Ok(())
    }

    fn end(&mut self, outcome: TxnOutcome, writes: Vec<WriteEvent>) {
        self.done = true;
        self.co.state.history.record(TxnRecord {
            id: self.id,
            begin: self.begin,
            end: self.co.ctx.now(),
            outcome,
            reads: std::mem::take(&mut self.reads),
            writes,
        });
        self.co.state.locked.set(false);
    }
}

impl Drop for SerialTxn<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.end(TxnOutcome::Aborted, Vec::new());
        }
    }
}

impl Transaction for SerialTxn<'_> {
    async fn read(&mut self, table: TableId, key: Key) -> Result<Option<Vec<u8>>, TxnError> {
        self.get(table, key).await
    }
    async fn read_for_update(
        &mut self,
        table: TableId,
        key: Key,
    ) -> Result<Option<Vec<u8>>, TxnError> {
        self.get(table, key).await
    }
    async fn write(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), TxnError> {
        self.put(table, key, Some(value.to_vec()), WriteKind::Update)
            .await
    }
    async fn insert(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), TxnError> {
        self.put(table, key, Some(value.to_vec()), WriteKind::Insert)
            .await
    }
    async fn delete(&mut self, table: TableId, key: Key) -> Result<(), TxnError> {
        self.put(table, key, None, WriteKind::Delete).await
    }
    async fn commit(mut self) -> Result<(), TxnError> {
        self.co.ctx.sleep(OP_NS).await;
        if self.co.state.refuse_commits {
            self.end(TxnOutcome::Aborted, Vec::new());
            return Err(TxnError::Aborted(AbortReason::ValidationFailed));
        }
        let mut installed = Vec::new();
        {
            let mut map = self.co.state.map.borrow_mut();
            for (table, key, value, kind) in std::mem::take(&mut self.writes) {
                let entry = map.entry((table, key)).or_insert((None, 0));
                entry.1 += 1;
                entry.0 = value;
                // A later write of the same key in this transaction replaces this event.
                installed.retain(|w: &WriteEvent| !(w.table == table && w.key == key));
                installed.push(WriteEvent {
                    table,
                    key,
                    version: Version(entry.1),
                    kind,
                });
            }
        }
        self.end(TxnOutcome::Committed, installed);
        Ok(())
    }
    async fn abort(mut self) {
        self.end(TxnOutcome::Aborted, Vec::new());
    }
}

fn registry() -> Registry {
    let mut r = dmem_protocols::registry();
    r.register(Serial {
        refuse_commits: false,
        stale_read_after: None,
    })
    .unwrap();
    r.register(Serial {
        refuse_commits: true,
        stale_read_after: None,
    })
    .unwrap();
    r.register(Serial {
        refuse_commits: false,
        stale_read_after: Some(LATE_BUG_NS),
    })
    .unwrap();
    r
}

#[test]
fn a_registered_toy_protocol_runs_through_dmem_bench() {
    let rows = dmem_cli::bench(
        &[
            "--workload",
            "smallbank",
            "--scale",
            "tiny",
            "--protocol",
            "serial,pandora",
            "--cns",
            "2",
            "--threads",
            "2",
            "--coroutines",
            "2",
            "--duration-ms",
            "1",
            "--json",
        ],
        &registry(),
    )
    .unwrap();
    assert_eq!(rows.len(), 2);
    let serial = &rows[0];
    assert_eq!(serial.protocol, "serial");
    assert_eq!(serial.checker, "ok");
    assert_eq!(serial.invariants, "ok");
    assert!(serial.committed > 20, "{serial:?}");
    // Nothing goes over the fabric: zero round trips, unlike pandora.
    assert_eq!(serial.rtts_per_txn.as_ref().unwrap()["all"], 0.0);
    assert!(rows[1].rtts_per_txn.as_ref().unwrap()["all"] >= 2.0);
}

/// The whole run is checked: a stale read 80 ms into a 110 ms run (after the 50 ms window
/// `dmem bench` used to check) is found, across segments of 20 ms, and every transaction of
/// the run is counted as checked.
#[test]
fn a_bug_late_in_a_long_run_is_found() {
    let csv = std::env::temp_dir().join(format!("dmem-late-bug-{}.csv", std::process::id()));
    let csv_arg = csv.to_str().unwrap().to_owned();
    let run = |protocol: &str| {
        dmem_cli::bench(
            &[
                "--workload",
                "smallbank",
                "--scale",
                "tiny",
                "--protocol",
                protocol,
                "--cns",
                "1",
                "--threads",
                "1",
                "--coroutines",
                "2",
                "--duration-ms",
                "100",
                "--check-segment-ms",
                "20",
                "--csv",
                &csv_arg,
            ],
            &registry(),
        )
    };
    let clean = run("serial").unwrap();
    assert_eq!(clean[0].checker, "ok", "{:?}", clean[0]);
    // Every transaction of the run (about 2.5 µs each, 110 ms), not a window's.
    assert!(clean[0].checked_txns > 20_000, "{:?}", clean[0]);
    let e = run("serial-late-bug").unwrap_err();
    assert!(format!("{e:#}").contains("serial-late-bug"), "{e:#}");
    // The checker failed, not the invariants (the data stayed right).
    let mut reader = csv::Reader::from_path(&csv).unwrap();
    let header = reader.headers().unwrap().clone();
    let row = reader.records().next().unwrap().unwrap();
    let _ = std::fs::remove_file(&csv);
    let cell = |name: &str| &row[header.iter().position(|h| h == name).unwrap()];
    assert_eq!(cell("protocol"), "serial-late-bug");
    assert!(cell("checker").contains("anomalies, first:"), "{row:?}");
    assert_eq!(cell("invariants"), "ok", "{row:?}");
}

#[test]
fn a_registered_toy_protocol_passes_the_litmus_suite() {
    let report = dmem_cli::litmus(
        &[
            "--protocol",
            "serial",
            "--seeds",
            "10",
            "--crash-prob",
            "0.5",
            "--json",
        ],
        &registry(),
    )
    .unwrap();
    assert_eq!(report.protocol, "serial");
    assert_eq!(report.runs, 50);
    assert_eq!(report.violations, 0, "{:?}", report.first_failure);
    assert!(report.per_litmus.iter().all(|s| s.committed > 0));
}

#[test]
fn unknown_protocols_list_the_registered_ones() {
    let chain = format!(
        "{:#}",
        dmem_cli::bench(&["--protocol", "dandelion"], &registry()).unwrap_err()
    );
    assert!(chain.contains("unknown protocol `dandelion`"), "{chain}");
    assert!(
        chain.contains("pandora") && chain.contains("serial"),
        "{chain}"
    );
}

#[test]
fn a_protocol_that_commits_nothing_gets_no_verdict() {
    // Its checker and invariants would pass an empty history: the run is an error instead.
    let e = dmem_cli::bench(
        &[
            "--workload",
            "smallbank",
            "--scale",
            "tiny",
            "--protocol",
            "serial-refusing",
            "--duration-ms",
            "1",
        ],
        &registry(),
    )
    .unwrap_err();
    let line = format!("{e:#}");
    assert!(
        line.contains("protocol `serial-refusing` committed no transaction")
            && line.contains("raise --duration-ms"),
        "{line}"
    );
}
