//! MN failures (Pandora §3.2.5) in the simulator: an MN crashes while CNs run transfers;
//! the detector confirms it, notifies every CN, the CNs pause, decide their in-flight
//! transactions on the live replicas, acknowledge, and resume under the new primaries.

mod common;

use std::cell::RefCell;
use std::rc::Rc;

use common::{Bank, SimTerminator, check_serializable, transfer, worker_with_stats};
use dmem_ford::cores::CoreRelay;
use dmem_ford::logic::Decision;
use dmem_ford::mnfail::{
    ListenerTiming, cn_listener_resending, cn_listener_with_cores, core_follower,
};
use dmem_ford::recovery::heartbeat_loop;
use dmem_ford::wire::ControlMsg;
use dmem_ford::{
    CnShared, CoordinatorStats, FordCoordinator, Member, MnFailureEvent, Protocol, ProtocolConfig,
    RecoveryError, RecoveryEvent, RecoveryManager, Store,
};
use dmem_sim::SimContext;
use dmem_txn::TxnError;
use dmem_verbs::{BatchResult, Clock, Endpoint, Message, Nanos, PostList, Verbs, VerbsError};

const DEADLINE: u64 = 12_000_000;
const HEARTBEAT: u64 = 10_000;
const CN_TIMEOUT: u64 = 50_000;
const MN_PROBE: u64 = 100_000;
const POLL: u64 = 2_000;

/// One CN's listener and heartbeats, with its own view of the MNs.
fn start_cn(
    bank: &Bank,
    cn: u16,
    detector: Endpoint,
    deadline: u64,
) -> (Rc<Store>, CnShared, Endpoint) {
    start_cn_resending(bank, cn, detector, None, deadline)
}

/// [`start_cn`] whose listener re-sends its acknowledgement every `resend` while paused.
fn start_cn_resending(
    bank: &Bank,
    cn: u16,
    detector: Endpoint,
    resend: Option<u64>,
    deadline: u64,
) -> (Rc<Store>, CnShared, Endpoint) {
    let store = Rc::new(bank.store.fork_view());
    let shared = CnShared::new();
    shared.mn.borrow_mut().detector = Some(detector);
    shared.mn.borrow_mut().poll = POLL;
    let listener = bank.sim.context(bank.sim.cn(cn), 0).unwrap();
    let l = listener.clone();
    let (st, sh) = (Rc::clone(&store), shared.clone());
    bank.sim.spawn(&listener, async move {
        let _ = cn_listener_resending(&l, st, sh, detector, POLL, resend, deadline).await;
    });
    let hb = bank.sim.context(bank.sim.cn(cn), 1).unwrap();
    let h = hb.clone();
    bank.sim.spawn(&hb, async move {
        let _ = heartbeat_loop(&h, detector, HEARTBEAT, deadline).await;
    });
    (store, shared, listener.local_endpoint())
}

/// One CN split like a CN process on `cores` cores: each core (sim thread `core`) with its
/// own view of the MNs and its own [`CnShared`]; the listener on core 0 forwards to the
/// others' [`core_follower`]s (`dmem_ford::cores`), and heartbeats on the last core.
fn start_cn_on_cores(
    bank: &Bank,
    cn: u16,
    detector: Endpoint,
    cores: usize,
    deadline: u64,
) -> (Vec<(Rc<Store>, CnShared)>, Endpoint) {
    let relay = std::sync::Arc::new(CoreRelay::new(cores));
    let state: Vec<_> = (0..cores)
        .map(|_| (Rc::new(bank.store.fork_view()), CnShared::new()))
        .collect();
    let on = |core: usize| {
        let thread = u16::try_from(core).unwrap();
        bank.sim.context(bank.sim.cn(cn), thread).unwrap()
    };
    let listener = on(0);
    let (l, r) = (listener.clone(), std::sync::Arc::clone(&relay));
    let (st, sh) = (Rc::clone(&state[0].0), state[0].1.clone());
    let timing = ListenerTiming {
        poll: POLL,
        resend: None,
        until: deadline,
    };
    bank.sim.spawn(&listener, async move {
        let _ = cn_listener_with_cores(&l, st, sh, &r, detector, timing).await;
    });
    for (core, (store, shared)) in state.iter().enumerate().skip(1) {
        let ctx = on(core);
        let follower = relay.follower(core).unwrap();
        let task = core_follower(
            ctx.clone(),
            Rc::clone(store),
            shared.clone(),
            follower,
            detector,
            POLL,
            deadline,
        );
        bank.sim.spawn(&ctx, task);
    }
    let hb = on(cores - 1);
    let h = hb.clone();
    bank.sim.spawn(&hb, async move {
        let _ = heartbeat_loop(&h, detector, HEARTBEAT, deadline).await;
    });
    (state, listener.local_endpoint())
}

type Events = (
    Rc<RefCell<Vec<MnFailureEvent>>>,
    Rc<RefCell<Vec<RecoveryEvent>>>,
    Rc<Store>,
);

fn start_detector(
    bank: &Bank,
    fd_ctx: SimContext,
    protocol: Protocol,
    members: Vec<Member>,
    deadline: u64,
) -> Events {
    let store = Rc::new(bank.store.fork_view());
    let mut manager = RecoveryManager::new(
        fd_ctx.clone(),
        Rc::clone(&store),
        protocol,
        SimTerminator(Rc::clone(&bank.sim)),
        members,
        CN_TIMEOUT,
    )
    .watch_mns(MN_PROBE);
    let events = (manager.mn_events(), manager.events(), store);
    bank.sim.spawn(&fd_ctx, async move {
        manager.run(deadline, 5_000).await.unwrap();
    });
    events
}

struct Run {
    stats: Vec<CoordinatorStats>,
    mn_events: Vec<MnFailureEvent>,
}

/// CN 0 and CN 1 run 4 coordinators each (25 transfers/audits apiece), two per sim thread;
/// CN 2 runs the detector; MN `mn` crashes at `crash_at` (never if `None`). With `cores`
/// 2, each thread of a CN is a core of its own ([`start_cn_on_cores`]), and every core's
/// view must have dropped the MN at the end.
fn bank_with_mn_crash(
    seed: u64,
    cfg: ProtocolConfig,
    protocol: Protocol,
    mn: u16,
    crash_at: Option<u64>,
    cores: usize,
) -> Run {
    let bank = Bank::new(seed, 3, 2, 10);
    let fd_ctx = bank.sim.context(bank.sim.cn(2), 0).unwrap();
    let detector = fd_ctx.local_endpoint();
    let done = Rc::new(RefCell::new(0));
    let stats = Rc::new(RefCell::new(Vec::new()));
    let mut members = Vec::new();
    let mut id = 0;
    let mut views = Vec::new();
    for cn in 0..2 {
        let (state, listener) = if cores == 1 {
            let (store, shared, listener) = start_cn(&bank, cn, detector, DEADLINE);
            (vec![(store, shared)], listener)
        } else {
            start_cn_on_cores(&bank, cn, detector, cores, DEADLINE)
        };
        views.extend(state.iter().map(|(store, _)| Rc::clone(store)));
        let mut ids = Vec::new();
        for thread in 0..2 {
            let (store, shared) = &state[usize::from(thread) % state.len()];
            for _ in 0..2 {
                let ctx = bank.sim.context(bank.sim.cn(cn), thread).unwrap();
                let co = FordCoordinator::new(
                    ctx.clone(),
                    Rc::clone(store),
                    cfg,
                    id,
                    shared.clone(),
                    Rc::clone(&bank.history),
                )
                .unwrap();
                ids.push(id);
                id += 1;
                bank.sim.spawn(
                    &ctx,
                    worker_with_stats(co, bank.accounts, 25, Rc::clone(&done), Rc::clone(&stats)),
                );
            }
        }
        members.push(Member {
            cn: bank.sim.cn(cn),
            coordinators: ids,
            listener,
        });
    }
    let (mn_events, cn_events, fd_store) =
        start_detector(&bank, fd_ctx, protocol, members, DEADLINE);
    if let Some(at) = crash_at {
        bank.sim.crash_at(bank.sim.mn(mn), at);
    }
    bank.sim.run_until(DEADLINE + 1_000_000);

    let what = format!("seed {seed}, MN {mn} at {crash_at:?}");
    assert_eq!(*done.borrow(), 8, "{what}: every coordinator finished");
    assert!(cn_events.borrow().is_empty(), "{what}: no CN was suspected");
    let mn_events = mn_events.borrow().clone();
    if crash_at.is_some() {
        assert_eq!(
            mn_events.len(),
            1,
            "{what}: the MN failure was handled once"
        );
        let ev = &mn_events[0];
        assert_eq!(ev.mn, mn);
        assert!(ev.resumed_at.is_some(), "{what}: the CNs were resumed");
        assert!(!fd_store.view().borrow().is_alive(mn));
        for (core, view) in views.iter().enumerate() {
            assert!(
                !view.view().borrow().is_alive(mn),
                "{what}: core {core}'s view still has the MN"
            );
        }
    }
    // Live replicas agree, money is conserved, no lock of a live coordinator is left.
    bank.check_invariant_on(&fd_store, &[]);
    check_serializable(&bank.history.borrow());
    let stats = stats.borrow().clone();
    Run { stats, mn_events }
}

fn total(stats: &[CoordinatorStats], f: impl Fn(&CoordinatorStats) -> u64) -> u64 {
    stats.iter().map(f).sum()
}

#[test]
fn pandora_survives_an_mn_crash_mid_run() {
    let end = {
        let quiet = bank_with_mn_crash(1, ProtocolConfig::pandora(), Protocol::Pandora, 0, None, 1);
        assert!(quiet.mn_events.is_empty());
        total(&quiet.stats, |s| s.committed)
    };
    assert!(end >= 200);
    let mut stopped = 0;
    for (seed, mn, at) in [
        (1, 0, 150_000),
        (2, 1, 300_000),
        (3, 2, 450_000),
        (4, 0, 700_000),
        (5, 1, 90_000),
        (6, 2, 220_000),
    ] {
        let run = bank_with_mn_crash(
            seed,
            ProtocolConfig::pandora(),
            Protocol::Pandora,
            mn,
            Some(at),
            1,
        );
        stopped += total(&run.stats, |s| {
            s.mn_aborted + s.mn_rolled_forward + s.mn_rolled_back
        });
        let ev = &run.mn_events[0];
        assert!(ev.detected_at >= at && ev.resumed_at.unwrap() >= ev.notified_at);
    }
    assert!(stopped > 0, "some crash stopped an in-flight transaction");
}

#[test]
fn ford_with_an_mn_crash_is_safe() {
    for (seed, mn, at) in [(11, 0, 200_000), (12, 1, 400_000), (13, 2, 120_000)] {
        bank_with_mn_crash(
            seed,
            ProtocolConfig::ford_fixed(),
            Protocol::Ford,
            mn,
            Some(at),
            1,
        );
    }
}

/// Each CN split across two cores (a CN process with `threads = 2`): only core 0 listens,
/// and forwards to core 1. Every coordinator finishes, the failure is handled once and the
/// CNs are resumed (so both cores of each CN acknowledged), every core's view dropped the
/// MN, money is conserved and the history is serializable, for crashes early and late.
#[test]
fn pandora_with_two_cores_per_cn_survives_an_mn_crash() {
    let mut stopped = 0;
    for (seed, mn, at) in [
        (21, 0, 150_000),
        (22, 1, 300_000),
        (23, 2, 90_000),
        (24, 0, 450_000),
    ] {
        let run = bank_with_mn_crash(
            seed,
            ProtocolConfig::pandora(),
            Protocol::Pandora,
            mn,
            Some(at),
            2,
        );
        stopped += total(&run.stats, |s| {
            s.mn_aborted + s.mn_rolled_forward + s.mn_rolled_back
        });
    }
    assert!(stopped > 0, "some crash stopped an in-flight transaction");
}

/// Pandora's coordinator 0 on `ctx`, recording into the bank's history.
fn pandora_coordinator_0(
    bank: &Bank,
    ctx: &SimContext,
    store: Rc<Store>,
    shared: CnShared,
) -> FordCoordinator<SimContext, Rc<RefCell<dmem_txn::History>>> {
    FordCoordinator::new(
        ctx.clone(),
        store,
        ProtocolConfig::pandora(),
        0,
        shared,
        Rc::clone(&bank.history),
    )
    .unwrap()
}

/// One transfer of 10 from account 0 to account 1 by coordinator 0 on CN 0 (CN 1 runs the
/// detector); MN `mn` crashes at `mn_at`, CN 0 optionally at its `cn_wr`-th work request.
/// Returns the transfer's result (None if CN 0 crashed first), its counters, the end time,
/// and the detector's CN-recovery decisions.
struct Single {
    result: Option<Result<(), TxnError>>,
    stats: CoordinatorStats,
    end: u64,
    /// Log recovery's decisions for the crashed coordinator, with the replicas it restored.
    decisions: Vec<(Decision, usize)>,
}

fn single_transfer(seed: u64, mn: u16, mn_at: Option<u64>, cn_wr: Option<u64>) -> Single {
    let deadline = 4_000_000;
    let bank = Bank::new(seed, 2, 2, 4);
    let fd_ctx = bank.sim.context(bank.sim.cn(1), 0).unwrap();
    let detector = fd_ctx.local_endpoint();
    let (store, shared, listener) = start_cn(&bank, 0, detector, deadline);
    let members = vec![Member {
        cn: bank.sim.cn(0),
        coordinators: vec![0],
        listener,
    }];
    let (_, cn_events, fd_store) =
        start_detector(&bank, fd_ctx, Protocol::Pandora, members, deadline);
    let ctx = bank.sim.context(bank.sim.cn(0), 0).unwrap();
    let mut co = pandora_coordinator_0(&bank, &ctx, Rc::clone(&store), shared);
    let out = Rc::new(RefCell::new(None));
    let o = Rc::clone(&out);
    bank.sim.spawn(&ctx, async move {
        // Start after the listener turned MN handling on and a heartbeat went out.
        co.context().sleep(20_000).await;
        let r = transfer(&mut co, 0, 1, 10).await;
        *o.borrow_mut() = Some((r, co.stats(), co.context().now()));
    });
    if let Some(at) = mn_at {
        bank.sim.crash_at(bank.sim.mn(mn), at);
    }
    if let Some(k) = cn_wr {
        bank.sim.crash_at_work_request(bank.sim.cn(0), k);
    }
    bank.sim.run_until(deadline + 1_000_000);

    let crashed = bank.sim.is_crashed(bank.sim.cn(0));
    let failed: &[u16] = if crashed { &[0] } else { &[] };
    bank.check_invariant_on(&fd_store, failed);
    check_serializable(&bank.history.borrow());
    // All or nothing on the live replicas, and consistent with what the client was told.
    let (a, b) = (bank.locs[&0], bank.locs[&1]);
    let bal = |k: u64, loc: dmem_ford::store::ItemLoc| -> Vec<u64> {
        fd_store
            .live_replicas(loc.bucket.partition)
            .into_iter()
            .map(|m| bank.item(k, m).0)
            .collect()
    };
    let (ba, bb) = (bal(0, a), bal(1, b));
    let applied = ba.iter().all(|&v| v == 90) && bb.iter().all(|&v| v == 110);
    let untouched = ba.iter().all(|&v| v == 100) && bb.iter().all(|&v| v == 100);
    let what = format!("seed {seed}, MN {mn} at {mn_at:?}, CN at WR {cn_wr:?}: {ba:?} {bb:?}");
    assert!(applied || untouched, "{what}: not all-or-nothing");
    let got = out.borrow_mut().take();
    let (result, stats, end) = match got {
        Some((r, s, e)) => (Some(r), s, e),
        None => {
            assert!(crashed, "{what}: the transfer never finished");
            (None, CoordinatorStats::default(), 0)
        }
    };
    match &result {
        Some(Ok(())) => assert!(applied, "{what}: acknowledged but not applied"),
        Some(Err(e)) => {
            assert!(e.is_retryable(), "{what}: {e}");
            assert!(untouched, "{what}: aborted but applied");
        }
        None => {}
    }
    let decisions = cn_events
        .borrow()
        .iter()
        .flat_map(|e| {
            e.coordinators
                .iter()
                .filter_map(|c| c.decision.map(|d| (d, c.restored)))
        })
        .collect();
    Single {
        result,
        stats,
        end,
        decisions,
    }
}

#[test]
fn mn_crash_during_a_commit_is_decided_all_or_nothing() {
    let quiet = single_transfer(21, 0, None, None);
    assert!(matches!(quiet.result, Some(Ok(()))));
    let end = quiet.end;
    let (mut forward, mut aborted, mut ok) = (0, 0, 0);
    for mn in 0..3 {
        for step in 0..40 {
            let at = 20_000 + (end - 20_000) * step / 40;
            let s = single_transfer(21, mn, Some(at), None);
            forward += s.stats.mn_rolled_forward;
            aborted += s.stats.mn_aborted + s.stats.mn_rolled_back;
            ok += u64::from(matches!(s.result, Some(Ok(()))));
        }
    }
    assert!(forward > 0, "an MN crash hit a commit's replica writes");
    assert!(
        aborted > 0,
        "an MN crash stopped a transaction before its commit"
    );
    assert!(ok > 0);
}

#[test]
fn cn_and_mn_crash_together_are_recovered_on_live_replicas() {
    let (mut fwd, mut back, mut restored) = (0, 0, 0);
    let quiet = single_transfer(31, 0, None, None);
    let end = quiet.end;
    for mn in 0..3 {
        for step in [1, 3, 5] {
            let at = 20_000 + (end - 20_000) * step / 6;
            for k in 0..24 {
                let s = single_transfer(31, mn, Some(at), Some(k));
                for (d, r) in s.decisions {
                    match d {
                        Decision::RollForward => fwd += 1,
                        Decision::RollBack => back += 1,
                    }
                    restored += r;
                }
            }
        }
    }
    assert!(
        fwd > 0 && back > 0,
        "both decisions reached ({fwd} / {back})"
    );
    assert!(
        restored > 0,
        "some roll-back restored live replicas from the log"
    );
}

/// A detector context that loses the first resume it sends (a control message lost on the
/// way, as a real network may).
#[derive(Clone)]
struct LosesFirstResume {
    inner: SimContext,
    lost: Rc<RefCell<usize>>,
}

impl Verbs for LosesFirstResume {
    fn local_endpoint(&self) -> Endpoint {
        self.inner.local_endpoint()
    }
    async fn post(&self, list: PostList) -> Result<BatchResult, VerbsError> {
        self.inner.post(list).await
    }
    async fn send(&self, to: Endpoint, payload: &[u8]) -> Result<(), VerbsError> {
        if *self.lost.borrow() == 0
            && matches!(ControlMsg::parse(payload), Ok(ControlMsg::MnResume { .. }))
        {
            *self.lost.borrow_mut() += 1;
            return Ok(());
        }
        self.inner.send(to, payload).await
    }
    async fn recv(&self) -> Result<Message, VerbsError> {
        self.inner.recv().await
    }
    fn try_recv(&self) -> Result<Option<Message>, VerbsError> {
        self.inner.try_recv()
    }
}

impl Clock for LosesFirstResume {
    fn now(&self) -> Nanos {
        self.inner.now()
    }
    async fn sleep_until(&self, deadline: Nanos) {
        self.inner.sleep_until(deadline).await;
    }
    fn cpu(&self, ns: Nanos) {
        self.inner.cpu(ns);
    }
}

/// What [`lost_resume`] saw.
struct LostResume {
    /// The transfer's result, if it finished.
    result: Option<Result<(), TxnError>>,
    /// Resumes the detector's context lost.
    lost: usize,
    /// The detector's MN-failure events.
    mn_events: Vec<MnFailureEvent>,
    /// How the detector's run ended.
    detector: Option<Result<(), RecoveryError>>,
}

/// One transfer on CN 0 while MN 1 crashes; the detector (CN 1) loses its first resume.
/// With `resend`, the detector and the listener re-send control messages that want an
/// answer; `listener` says whether CN 0 runs its listener at all.
fn lost_resume(resend: Option<u64>, listener: bool) -> LostResume {
    let deadline = 4_000_000;
    let bank = Bank::new(21, 2, 2, 4);
    let fd_ctx = bank.sim.context(bank.sim.cn(1), 0).unwrap();
    let detector = fd_ctx.local_endpoint();
    let (store, shared, listener_at) = if listener {
        start_cn_resending(&bank, 0, detector, resend, deadline)
    } else {
        // Heartbeats only: the CN is alive but never answers a view change.
        let (store, shared, at) = start_cn_resending(&bank, 0, detector, resend, 0);
        let hb = bank.sim.context(bank.sim.cn(0), 1).unwrap();
        let h = hb.clone();
        bank.sim.spawn(&hb, async move {
            let _ = heartbeat_loop(&h, detector, HEARTBEAT, deadline).await;
        });
        (store, shared, at)
    };
    let members = vec![Member {
        cn: bank.sim.cn(0),
        coordinators: vec![0],
        listener: listener_at,
    }];
    let lost = Rc::new(RefCell::new(0));
    let ctx = LosesFirstResume {
        inner: fd_ctx.clone(),
        lost: Rc::clone(&lost),
    };
    let mut manager = RecoveryManager::new(
        ctx,
        Rc::new(bank.store.fork_view()),
        Protocol::Pandora,
        SimTerminator(Rc::clone(&bank.sim)),
        members,
        CN_TIMEOUT,
    )
    .watch_mns(MN_PROBE);
    if let Some(period) = resend {
        manager = manager.resend_control(period, 1_000_000);
    }
    let mn_events = manager.mn_events();
    let ended = Rc::new(RefCell::new(None));
    let e = Rc::clone(&ended);
    bank.sim.spawn(&fd_ctx, async move {
        *e.borrow_mut() = Some(manager.run(deadline, 5_000).await);
    });
    let co_ctx = bank.sim.context(bank.sim.cn(0), 0).unwrap();
    let mut co = pandora_coordinator_0(&bank, &co_ctx, store, shared);
    let out = Rc::new(RefCell::new(None));
    let o = Rc::clone(&out);
    bank.sim.spawn(&co_ctx, async move {
        co.context().sleep(20_000).await;
        // The first transfer meets the crash (and the pause); the second starts after it.
        let first = transfer(&mut co, 0, 1, 10).await;
        co.context().sleep(200_000).await;
        let second = transfer(&mut co, 0, 1, 10).await;
        *o.borrow_mut() = Some(first.and(second));
    });
    bank.sim.crash_at(bank.sim.mn(1), 30_000);
    bank.sim.run_until(deadline + 1_000_000);
    let lost = *lost.borrow();
    let result = out.borrow_mut().take();
    let detector = ended.borrow_mut().take();
    LostResume {
        result,
        lost,
        mn_events: mn_events.borrow().clone(),
        detector,
    }
}

/// A lost resume leaves a CN paused for good when control messages are sent once; with
/// re-sends the CN re-sends its acknowledgement, the detector answers it with the resume
/// again, and the CN's transactions go on.
#[test]
fn a_lost_resume_is_sent_again_when_control_messages_are_re_sent() {
    let once = lost_resume(None, true);
    assert_eq!(once.lost, 1, "the first resume was lost");
    assert!(
        once.result.is_none(),
        "paused for good, yet the transfers finished"
    );
    let again = lost_resume(Some(20_000), true);
    assert_eq!(again.lost, 1);
    assert!(again.result.is_some(), "the CN stayed paused");
    assert_eq!(again.mn_events.len(), 1);
    assert!(again.mn_events[0].resumed_at.is_some());
    assert!(matches!(again.detector, Some(Ok(()))));
}

/// A live CN that never acknowledges a view change (its listener does not run) ends the
/// detector's run with one clear error once the answer timeout passed.
#[test]
fn a_cn_that_never_answers_a_view_change_is_reported() {
    let silent = lost_resume(Some(20_000), false);
    let Some(Err(e)) = silent.detector else {
        panic!("the detector did not report the silent CN");
    };
    assert!(matches!(e, RecoveryError::NoAnswer { epoch: 1, .. }), "{e}");
    let line = e.to_string();
    assert!(
        line.contains("did not acknowledge the view change of epoch 1 within")
            && line.contains("re-sent every 20µs"),
        "{line}"
    );
}

/// A CN on two cores acknowledges an MN view only once both cores can: core 1 keeps a
/// transaction of the old view open until `release`, so the acknowledgement that core 0's
/// listener sends comes after it (core 0 alone could have acknowledged at once), and both
/// cores' views dropped the MN.
#[test]
fn a_cn_on_two_cores_acknowledges_a_view_once_every_core_can() {
    let (deadline, notify, release) = (2_000_000, 50_000, 500_000);
    let bank = Bank::new(31, 2, 2, 4);
    let fd = bank.sim.context(bank.sim.cn(1), 0).unwrap();
    let detector = fd.local_endpoint();
    let (state, listener) = start_cn_on_cores(&bank, 0, detector, 2, deadline);
    let ctx = bank.sim.context(bank.sim.cn(0), 1).unwrap();
    let mut co = FordCoordinator::new(
        ctx.clone(),
        Rc::clone(&state[1].0),
        ProtocolConfig::pandora(),
        0,
        state[1].1.clone(),
        Rc::clone(&bank.history),
    )
    .unwrap();
    bank.sim.spawn(&ctx.clone(), async move {
        let old_view = co.begin_txn(dmem_txn::TxnKind::ReadWrite);
        ctx.sleep(release).await;
        drop(old_view);
    });
    let acked = Rc::new(RefCell::new(None));
    let (a, f) = (Rc::clone(&acked), fd.clone());
    bank.sim.spawn(&fd, async move {
        f.sleep(notify).await;
        let failed = ControlMsg::MnFailed {
            epoch: 1,
            mask: 1 << 1,
        };
        f.send(listener, &failed.emit()).await.unwrap();
        while f.now() < deadline {
            while let Some(msg) = f.try_recv().unwrap() {
                let ack = ControlMsg::parse(&msg.payload) == Ok(ControlMsg::MnAck { epoch: 1 });
                if ack && a.borrow().is_none() {
                    *a.borrow_mut() = Some(f.now());
                }
            }
            f.sleep(POLL).await;
        }
    });
    bank.sim.run_until(deadline + 1_000_000);
    let at = acked.borrow().expect("the CN acknowledged the view");
    assert!(
        at >= release,
        "acknowledged at {at} ns, while core 1 ran an old-view transaction until {release} ns"
    );
    for (core, (store, shared)) in state.iter().enumerate() {
        assert!(!store.view().borrow().is_alive(1), "core {core} kept MN 1");
        assert_eq!(shared.mn.borrow().epoch(), 1, "core {core}");
    }
}
