//! Dandelion on a small simulated cluster: every commit variant keeps a bank's money and
//! passes the history checker; batching packs messages into fewer packets; GetOne skips
//! the commit phase.

use std::cell::RefCell;
use std::rc::Rc;

use dmem_dandelion::{
    Cluster, DnlConfig, DnlCoordinator, RecoveryCost, Worker, WorkerStats, retransmission_timeout,
};
use dmem_sim::{ClusterConfig, MessageFaults, Sim, SimContext};
use dmem_txn::{Coordinator, History, Key, ReadReq, TableId, Transaction, TxnKind, check};
use dmem_verbs::{Clock, Verbs};

const ACCOUNTS: u64 = 40;
const START: u64 = 100;

struct Run {
    sim: Rc<Sim>,
    cluster: Rc<Cluster>,
    workers: Vec<Rc<Worker<SimContext>>>,
    history: Rc<RefCell<History>>,
}

fn deploy(config: DnlConfig, servers: u16, threads: u16, seed: u64) -> Run {
    deploy_with_faults(config, servers, threads, seed, MessageFaults::default())
}

fn deploy_with_faults(
    config: DnlConfig,
    servers: u16,
    threads: u16,
    seed: u64,
    faults: MessageFaults,
) -> Run {
    let sim = Rc::new(
        Sim::new(
            ClusterConfig::new("cx5")
                .unwrap()
                .mns(1)
                .cns(servers)
                .threads_per_cn(threads)
                .seed(seed)
                .message_faults(faults),
        )
        .unwrap(),
    );
    let ctxs: Vec<Vec<SimContext>> = (0..servers)
        .map(|s| {
            (0..threads)
                .map(|t| sim.context(sim.cn(s), t).unwrap())
                .collect()
        })
        .collect();
    let endpoints = ctxs
        .iter()
        .map(|ts| ts.iter().map(Verbs::local_endpoint).collect())
        .collect();
    let cluster = Rc::new(Cluster::new(endpoints, config));
    let mut workers = Vec::new();
    for (s, ts) in ctxs.into_iter().enumerate() {
        for (t, ctx) in ts.into_iter().enumerate() {
            let rto = retransmission_timeout(sim.profile().one_way_latency_ns);
            let w = Worker::new(ctx.clone(), s as u16, t, Rc::clone(&cluster), 4096, rto);
            sim.spawn(&ctx, Rc::clone(&w).run());
            workers.push(w);
        }
    }
    for k in 0..ACCOUNTS {
        cluster.load(0, k, &START.to_le_bytes());
    }
    Run {
        sim,
        cluster,
        workers,
        history: Rc::new(RefCell::new(History::new())),
    }
}

fn value(v: &Option<Vec<u8>>) -> u64 {
    u64::from_le_bytes(v.as_deref().unwrap().try_into().unwrap())
}

/// Every worker thread runs `per_thread` coordinators, each doing `txns` transfers (and a
/// read-only audit of two accounts every third transaction).
fn bank(run: &Run, per_thread: u16, txns: u32) -> Rc<RefCell<(u64, u64)>> {
    let tally = Rc::new(RefCell::new((0u64, 0u64)));
    let mut id = 0u16;
    for w in &run.workers {
        for _ in 0..per_thread {
            let mut c = DnlCoordinator::new(Rc::clone(w), id, Rc::clone(&run.history));
            let tally = Rc::clone(&tally);
            let clock = w.ctx().clone();
            let mut x = u64::from(id) * 7919 + 1;
            run.sim.spawn(w.ctx(), async move {
                for n in 0..txns {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let (a, b) = ((x >> 33) % ACCOUNTS, (x >> 45) % ACCOUNTS);
                    if a == b {
                        continue;
                    }
                    clock.sleep((x >> 20) % 500).await;
                    if n % 3 == 0 {
                        let mut t = c.begin(TxnKind::ReadOnly).await.unwrap();
                        let Ok(r) = t
                            .read_round(&[
                                ReadReq::read(TableId(0), Key(a)),
                                ReadReq::read(TableId(0), Key(b)),
                            ])
                            .await
                        else {
                            t.abort().await;
                            continue;
                        };
                        assert!(r.iter().all(Option::is_some));
                        let _ = t.commit().await;
                        continue;
                    }
                    let mut t = c.begin(TxnKind::ReadWrite).await.unwrap();
                    let Ok(r) = t
                        .read_round(&[
                            ReadReq::for_update(TableId(0), Key(a)),
                            ReadReq::for_update(TableId(0), Key(b)),
                        ])
                        .await
                    else {
                        t.abort().await;
                        continue;
                    };
                    let (va, vb) = (value(&r[0]), value(&r[1]));
                    if va == 0 {
                        t.abort().await;
                        continue;
                    }
                    t.write(TableId(0), Key(a), &(va - 1).to_le_bytes())
                        .await
                        .unwrap();
                    t.write(TableId(0), Key(b), &(vb + 1).to_le_bytes())
                        .await
                        .unwrap();
                    let ok = t.commit().await.is_ok();
                    let mut tl = tally.borrow_mut();
                    if ok {
                        tl.0 += 1;
                    } else {
                        tl.1 += 1;
                    }
                }
            });
            id += 1;
        }
    }
    run.sim.run_until_idle();
    tally
}

fn total(run: &Run) -> u64 {
    (0..ACCOUNTS)
        .map(|k| value(&run.cluster.read_final(0, k)))
        .sum()
}

fn replicas_agree(run: &Run) {
    for k in 0..ACCOUNTS {
        let rs: Vec<_> = run.cluster.replicas(0, k);
        let first = run.cluster.stores[usize::from(rs[0])]
            .borrow()
            .get(0, k)
            .cloned()
            .unwrap();
        assert!(!first.meta.is_locked(), "key {k} left locked");
        for r in &rs[1..] {
            let other = run.cluster.stores[usize::from(*r)]
                .borrow()
                .get(0, k)
                .cloned()
                .unwrap();
            assert_eq!(other.value, first.value, "key {k}: replicas disagree");
            assert_eq!(other.meta.version(), first.meta.version(), "key {k}");
        }
    }
}

fn stats(run: &Run) -> WorkerStats {
    run.workers
        .iter()
        .map(|w| w.stats())
        .fold(WorkerStats::default(), |a, s| WorkerStats {
            iterations: a.iterations + s.iterations,
            packets: a.packets + s.packets,
            messages: a.messages + s.messages,
            bytes: a.bytes + s.bytes,
            local_requests: a.local_requests + s.local_requests,
            retransmissions: a.retransmissions + s.retransmissions,
            stale_responses: a.stale_responses + s.stale_responses,
            replayed: a.replayed + s.replayed,
            duplicates_dropped: a.duplicates_dropped + s.duplicates_dropped,
        })
}

#[test]
fn every_variant_conserves_money_and_is_serializable() {
    for (name, config) in [
        ("dnl-4", DnlConfig::dnl_4()),
        ("dnl-2", DnlConfig::dnl_2()),
        ("dnl-1", DnlConfig::dnl_1()),
        ("fasst", DnlConfig::fasst()),
    ] {
        let run = deploy(config, 4, 2, 3);
        let tally = bank(&run, 4, 30);
        let (committed, aborted) = *tally.borrow();
        assert!(
            committed > 100,
            "{name}: {committed} committed, {aborted} aborted"
        );
        assert_eq!(
            total(&run),
            ACCOUNTS * START,
            "{name}: money created or lost"
        );
        replicas_agree(&run);
        let history = run.history.borrow();
        let report = check(&history);
        assert!(report.is_ok(), "{name}: {:?}", report.anomalies.first());
        assert!(run.sim.now() > 0);
    }
}

/// 2 % of messages lost, 2 % duplicated, 20 % delayed by 4 µs (reordered).
fn lossy() -> MessageFaults {
    MessageFaults {
        loss: 0.02,
        duplicate: 0.02,
        delay: 0.2,
        delay_ns: 4_000,
    }
}

/// What is wrong with a finished bank run (empty: nothing).
fn violations(run: &Run) -> Vec<String> {
    let mut found = Vec::new();
    let money: u64 = (0..ACCOUNTS)
        .map(|k| {
            run.cluster
                .read_final(0, k)
                .map_or(0, |v| u64::from_le_bytes(v.try_into().unwrap()))
        })
        .sum();
    if money != ACCOUNTS * START {
        found.push(format!("money {money}"));
    }
    for k in 0..ACCOUNTS {
        let rs = run.cluster.replicas(0, k);
        let recs: Vec<_> = rs
            .iter()
            .map(|r| {
                run.cluster.stores[usize::from(*r)]
                    .borrow()
                    .get(0, k)
                    .cloned()
            })
            .collect();
        if recs.iter().flatten().any(|r| r.meta.is_locked()) {
            found.push(format!("key {k} left locked"));
        }
        if recs.windows(2).any(|w| {
            w[0].as_ref().map(|r| (&r.value, r.meta.version()))
                != w[1].as_ref().map(|r| (&r.value, r.meta.version()))
        }) {
            found.push(format!("key {k}: replicas disagree"));
        }
    }
    let report = check(&run.history.borrow());
    if !report.is_ok() {
        found.push(format!("checker: {:?}", report.anomalies.first()));
    }
    found
}

/// eRPC-style reliability (`reliable.rs`): with messages lost, duplicated and reordered,
/// every variant still commits, conserves money, leaves nothing locked and passes the
/// checker; requests were retransmitted, cached responses replayed, stale ones ignored.
#[test]
fn every_variant_survives_message_loss_and_duplication() {
    for (name, config) in [
        ("dnl-4", DnlConfig::dnl_4()),
        ("dnl-2", DnlConfig::dnl_2()),
        ("dnl-1", DnlConfig::dnl_1()),
        ("fasst", DnlConfig::fasst()),
    ] {
        for seed in 0..3 {
            let run = deploy_with_faults(config, 4, 2, seed, lossy());
            let tally = bank(&run, 4, 30);
            let (committed, aborted) = *tally.borrow();
            assert!(
                committed > 100,
                "{name} seed {seed}: {committed} committed, {aborted} aborted"
            );
            let found = violations(&run);
            assert!(found.is_empty(), "{name} seed {seed}: {found:?}");
            let s = stats(&run);
            assert!(
                s.retransmissions > 0 && s.replayed > 0 && s.stale_responses > 0,
                "{name} seed {seed}: {s:?}"
            );
        }
    }
}

/// Without faults nothing is retransmitted (the timeout is above every round trip here).
#[test]
fn the_fault_free_path_does_not_retransmit() {
    let run = deploy(DnlConfig::dnl_4(), 4, 2, 9);
    bank(&run, 4, 30);
    let s = stats(&run);
    assert_eq!(
        (s.retransmissions, s.replayed, s.stale_responses),
        (0, 0, 0),
        "{s:?}"
    );
}

/// Planted bug `no_dedup`: servers execute retransmitted and duplicated requests again
/// (a Lock whose grant was lost is refused the second time and its lock leaks, an Unlock
/// that applies a write is applied again). The same lossy runs now go wrong.
#[test]
fn planted_no_dedup_is_found() {
    let mut found = Vec::new();
    for (name, config) in [("dnl-4", DnlConfig::dnl_4()), ("dnl-1", DnlConfig::dnl_1())] {
        let config = DnlConfig {
            bugs: dmem_dandelion::Bugs {
                no_dedup: true,
                ..dmem_dandelion::Bugs::default()
            },
            ..config
        };
        for seed in 0..3 {
            let run = deploy_with_faults(config, 4, 2, seed, lossy());
            bank(&run, 4, 30);
            found.extend(
                violations(&run)
                    .into_iter()
                    .map(|v| format!("{name}/{seed}: {v}")),
            );
        }
    }
    assert!(!found.is_empty(), "no_dedup went unnoticed");
}

#[test]
fn batching_packs_messages_into_fewer_packets() {
    let batched = deploy(DnlConfig::dnl_4(), 3, 1, 5);
    bank(&batched, 8, 20);
    let unbatched = deploy(
        DnlConfig {
            network_batching: false,
            ..DnlConfig::dnl_4()
        },
        3,
        1,
        5,
    );
    bank(&unbatched, 8, 20);
    let (b, u) = (stats(&batched), stats(&unbatched));
    assert_eq!(
        u.packets, u.messages,
        "one message per packet without batching"
    );
    let per_packet = b.messages as f64 / b.packets as f64;
    assert!(per_packet > 1.5, "batched: {b:?}");
    assert!(b.local_requests > 0);
}

#[test]
fn a_single_key_read_commits_as_get_one() {
    let run = deploy(DnlConfig::dnl_4(), 3, 1, 1);
    let w = Rc::clone(&run.workers[0]);
    let history = Rc::clone(&run.history);
    let got = Rc::new(RefCell::new(None));
    let out = Rc::clone(&got);
    run.sim.spawn(w.ctx(), {
        let w = Rc::clone(&w);
        async move {
            let mut c = DnlCoordinator::new(w, 0, history);
            let mut t = c.begin(TxnKind::ReadOnly).await.unwrap();
            let v = t.read(TableId(0), Key(3)).await.unwrap();
            t.commit().await.unwrap();
            *out.borrow_mut() = Some((value(&v), c.stats()));
        }
    });
    run.sim.run_until_idle();
    let (v, stats) = got.borrow().unwrap();
    assert_eq!(v, START);
    assert_eq!((stats.committed, stats.get_ones), (1, 1));
}

/// GetOne at backups: a writer on a backup B1 of key K replicates to its own (local) copy
/// first and to the other backup B2 a network hop later. Readers on B1 and B2 run
/// single-key reads of K back to back. With the readable flag, B1's replicated copy is not
/// readable until the writer committed, so no reader sees the new value and then the old
/// one; with the planted bug (`skip_readable`) the checker finds that real-time anomaly.
fn get_one_race(bugs: dmem_dandelion::Bugs) -> dmem_txn::Report {
    let config = DnlConfig {
        bugs,
        ..DnlConfig::dnl_4()
    };
    let run = deploy(config, 3, 1, 9);
    let p = run.cluster.placement;
    // A key whose backups are servers 1 and 2 (primary 0).
    let key = (0..ACCOUNTS).find(|&k| p.primary(0, k) == 0).unwrap();
    let replicas: Vec<u16> = p.replicas(0, key).collect();
    let (b1, b2) = (replicas[1], replicas[2]);
    let worker = |s: u16| Rc::clone(&run.workers[usize::from(s)]);
    let writer = worker(b1);
    let mut c = DnlCoordinator::new(Rc::clone(&writer), 0, Rc::clone(&run.history));
    let until = 400_000;
    let clock = writer.ctx().clone();
    run.sim.spawn(writer.ctx(), async move {
        while clock.now() < until {
            let mut t = c.begin(TxnKind::ReadWrite).await.unwrap();
            let Ok(v) = t.read_for_update(TableId(0), Key(key)).await else {
                continue;
            };
            let n = value(&v) + 1;
            t.write(TableId(0), Key(key), &n.to_le_bytes())
                .await
                .unwrap();
            let _ = t.commit().await;
            clock.sleep(3_000).await;
        }
    });
    for (id, s) in [(1u16, b1), (2, b2), (3, b2)] {
        let w = worker(s);
        let mut c = DnlCoordinator::new(Rc::clone(&w), id, Rc::clone(&run.history));
        let clock = w.ctx().clone();
        run.sim.spawn(w.ctx(), async move {
            while clock.now() < until {
                let mut t = c.begin(TxnKind::ReadOnly).await.unwrap();
                if t.read(TableId(0), Key(key)).await.is_ok() {
                    let _ = t.commit().await;
                }
                clock.sleep(50).await;
            }
        });
    }
    run.sim.run_until_idle();
    let history = run.history.borrow();
    check(&history)
}

#[test]
fn the_readable_flag_guards_get_one_and_its_planted_bug_is_found() {
    let fixed = get_one_race(dmem_dandelion::Bugs::default());
    assert!(fixed.is_ok(), "{:?}", fixed.anomalies.first());
    let buggy = get_one_race(dmem_dandelion::Bugs {
        skip_readable: true,
        ..dmem_dandelion::Bugs::default()
    });
    assert!(
        !buggy.is_ok(),
        "the checker missed reads of a write before its commit"
    );
}

/// Recovery (§4.4): a server crashes in the middle of the bank; survivors detect it after
/// a while, decide every logged transaction, bump the epoch and go on. Money is conserved
/// at the acting primaries, live replicas agree, nothing stays locked, and the history
/// (with the crashed server's in-doubt transactions) passes the checker.
fn crash_run(config: DnlConfig, seed: u64) -> (u64, usize, RecoveryCost, u64) {
    let run = deploy(config, 4, 2, seed);
    let victim = (seed % 4) as u16;
    let at = 20_000 + (seed * 7_919) % 60_000;
    run.sim.crash_at(run.sim.cn(victim), at);
    let detector = run.sim.context(run.sim.cn((victim + 1) % 4), 0).unwrap();
    let (cluster, workers) = (Rc::clone(&run.cluster), run.workers.clone());
    let history = Rc::clone(&run.history);
    let sim = Rc::clone(&run.sim);
    let clock = detector.clone();
    let recovered = Rc::new(RefCell::new((0usize, RecoveryCost::default(), 0u64)));
    let done = Rc::clone(&recovered);
    run.sim.spawn(&detector, async move {
        while !sim.is_crashed(sim.cn(victim)) {
            clock.sleep(1_000).await;
        }
        clock.sleep(5_000).await; // a heartbeat timeout
        let report = dmem_dandelion::recover(&cluster, &workers, &[victim], &history).await;
        *done.borrow_mut() = (
            report.committed.len() + report.aborted.len(),
            report.cost,
            report.duration,
        );
    });
    bank(&run, 4, 40);
    assert!(run.cluster.is_crashed(victim));
    assert_eq!(
        total(&run),
        ACCOUNTS * START,
        "seed {seed}: money created or lost"
    );
    replicas_agree(&run);
    let report = check(&run.history.borrow());
    assert!(
        report.is_ok(),
        "seed {seed}: {:?}",
        report.anomalies.first()
    );
    let committed = run.history.borrow().committed() as u64;
    let (n, cost, duration) = recovered.borrow().clone();
    (committed, n, cost, duration)
}

#[test]
fn every_variant_recovers_from_a_server_crash() {
    for (name, config) in [
        ("dnl-4", DnlConfig::dnl_4()),
        ("dnl-2", DnlConfig::dnl_2()),
        ("dnl-1", DnlConfig::dnl_1()),
        ("fasst", DnlConfig::fasst()),
    ] {
        let (mut decided, mut messages, mut duration, mut accesses) = (0, 0, 0, 0);
        let (mut bytes, mut queries) = (0, 0);
        for seed in 0..12 {
            let (committed, n, cost, took) = crash_run(config, seed);
            messages += cost.messages();
            duration += took;
            accesses += cost.store_accesses;
            bytes += cost.gathered_bytes;
            queries += cost.query;
            // Every other survivor's state is gathered: at least a page each.
            assert!(cost.gather >= 2 && cost.gathered_bytes > 0, "{cost:?}");
            // Resume alone is the leader telling the 2 other survivors, each replying.
            assert_eq!(cost.resume, 2, "{cost:?}");
            assert_eq!(
                cost.replies,
                cost.gather + cost.query + cost.decide + cost.resume,
                "{cost:?}"
            );
            // Messages take time: at least the resume round trip (2 × 900 ns one way).
            assert!(took >= 1_800, "{name} seed {seed}: recovery took {took} ns");
            assert!(
                committed > 50,
                "{name} seed {seed}: only {committed} committed"
            );
            decided += n;
        }
        assert!(
            decided > 0,
            "{name}: recovery never found a transaction to decide"
        );
        assert!(messages > 12 * 4 && accesses > 0);
        // Recovery's messages and time, 4 servers (one crashes), 2 threads x 4 coroutines
        // each, mean over the 12 seeds: `cargo test -p dmem-dandelion --test cluster
        // every_variant_recovers -- --nocapture` (README, "Recovery's cost").
        println!(
            "recovery cost {name}: {:.1} transactions decided, {:.1} messages ({:.1} queries), {:.0} B gathered, {:.1} store accesses, {:.2} µs from halt to resume",
            decided as f64 / 12.0,
            messages as f64 / 12.0,
            queries as f64 / 12.0,
            bytes as f64 / 12.0,
            accesses as f64 / 12.0,
            duration as f64 / 12.0 / 1e3
        );
    }
}

/// Dnl-1 recovery: a crashed coordinator's transaction locked every replica of a key, its
/// committing `UNLOCK` reached one replica (applied there, log entry forgotten) and was lost
/// to the others. Recovery must commit it at the others (the litmus suite found replicas
/// left disagreeing once messages were lost).
#[test]
fn dnl_1_recovery_commits_a_transaction_whose_unlock_reached_one_replica() {
    use dmem_dandelion::wire::{Request, WriteOp};
    use dmem_txn::{CoordinatorId, TxnId, WriteKind};
    let run = deploy(DnlConfig::dnl_1(), 4, 1, 1);
    let key = 3;
    let replicas = run.cluster.replicas(0, key);
    let spare = (0..4u16).find(|s| !replicas.contains(s)).unwrap();
    // Coordinator 999 is on no live server: recovery decides from the logs.
    let txn = TxnId {
        coordinator: CoordinatorId(999),
        seq: 1,
    };
    let write = WriteOp {
        kind: WriteKind::Update,
        value: 7u64.to_le_bytes().to_vec(),
    };
    for r in &replicas {
        let granted = run.cluster.stores[usize::from(*r)]
            .borrow_mut()
            .handle(&Request::Lock {
                txn,
                table: 0,
                key,
                read: None,
                write: Some(write.clone()),
                lock_set: 1,
            });
        assert!(matches!(
            granted,
            Some(dmem_dandelion::wire::Response::Lock { granted: true, .. })
        ));
    }
    run.cluster.stores[usize::from(replicas[0])]
        .borrow_mut()
        .handle(&Request::Unlock {
            txn,
            table: 0,
            key,
            commit: true,
            apply: Some((1, write.clone())),
        });
    let out = Rc::new(RefCell::new(None));
    let (cluster, workers, history) = (
        Rc::clone(&run.cluster),
        run.workers.clone(),
        Rc::clone(&run.history),
    );
    let done = Rc::clone(&out);
    let ctx = run.sim.context(run.sim.cn(spare), 0).unwrap();
    run.sim.spawn(&ctx, async move {
        let r = dmem_dandelion::recover(&cluster, &workers, &[spare], &history).await;
        *done.borrow_mut() = Some(r);
    });
    run.sim.run_for(1_000_000);
    let report = out.borrow_mut().take().expect("recovery finished");
    assert_eq!(report.committed, vec![txn]);
    // The decision travelled to the replicas other than the leader, and came back acked.
    assert!(report.cost.decide >= 1 && report.cost.replies >= report.cost.decide);
    // The leader learnt that the unlock had applied from a QUERY's answer, unless it is that
    // replica itself.
    let leader = (0..4u16).find(|s| *s != spare).unwrap();
    if replicas[0] != leader {
        assert!(report.cost.query >= 1, "{:?}", report.cost);
    }
    for r in &replicas {
        let store = run.cluster.stores[usize::from(*r)].borrow();
        let rec = store.get(0, key).unwrap();
        assert_eq!(
            (rec.value.as_slice(), rec.meta.version()),
            (&7u64.to_le_bytes()[..], 1)
        );
        assert!(!rec.meta.is_locked());
    }
}
