//! The tcp fabric on loopback: every verb, ordering, atomics under concurrency, errors,
//! revocation, closed connections, malformed frames, messages.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use dmem_runtime::Executor;
use dmem_shm::ShmMemoryNode;
use dmem_tcp::wire::{self, FrameKind, RefuseReason};
use dmem_tcp::{TcpContext, TcpError, TcpFabric, TcpMemoryServer};
use dmem_verbs::{
    Endpoint, NodeId, Port, PostList, RKey, RemoteAddr, Verbs, VerbsError, VerbsExt, WrOutcome,
};

const RKEY: RKey = RKey(0x5eed);

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn server(node: u16, len: u64) -> TcpMemoryServer {
    let mn = ShmMemoryNode::create(NodeId(node), RKEY, len).unwrap();
    TcpMemoryServer::serve(mn, loopback()).unwrap()
}

fn context(cn: u16, port: u16, servers: &[&TcpMemoryServer]) -> TcpContext {
    let fabric = TcpFabric::new(NodeId(cn));
    let mut ctx = fabric.context(Port(port)).unwrap();
    for s in servers {
        ctx.connect(s.local_addr()).unwrap();
    }
    ctx
}

fn at(s: &TcpMemoryServer, offset: u64) -> RemoteAddr {
    s.region().at(offset).unwrap()
}

fn run<T>(f: impl Future<Output = T>) -> T {
    Executor::new().block_on(f)
}

/// A small deterministic generator, so that failures reproduce.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
}

#[test]
fn welcome_describes_the_region() {
    let s = server(3, 10_000);
    let ctx = context(10, 0, &[&s]);
    let region = ctx.region(NodeId(3)).unwrap();
    assert_eq!(region, s.region());
    assert_eq!(region.rkey, RKEY);
    assert_eq!(region.len, 10_000);
    assert_eq!(s.connections(), 1);
}

#[test]
fn unaligned_reads_and_writes_match_a_byte_model() {
    let s = server(0, 4096);
    let ctx = context(1, 0, &[&s]);
    let mut model = vec![0u8; 4096];
    let mut rng = Lcg(7);
    run(async {
        for round in 0..300 {
            let offset = rng.next() % 4000;
            let len = 1 + rng.next() % 90;
            if round % 2 == 0 {
                let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                ctx.write(at(&s, offset), &data).await.unwrap();
                model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
            } else {
                let got = ctx.read(at(&s, offset), len as u32).await.unwrap();
                assert_eq!(got, &model[offset as usize..(offset + len) as usize]);
            }
        }
        assert_eq!(ctx.read(at(&s, 0), 4096).await.unwrap(), model);
    });
}

#[test]
fn cas_and_faa_return_old_values() {
    let s = server(0, 4096);
    let ctx = context(1, 0, &[&s]);
    run(async {
        let w = at(&s, 128);
        assert_eq!(ctx.cas(w, 0, 5).await.unwrap(), 0);
        assert_eq!(
            ctx.cas(w, 0, 9).await.unwrap(),
            5,
            "failed CAS returns the value"
        );
        assert_eq!(ctx.read(w, 8).await.unwrap(), 5u64.to_ne_bytes());
        assert_eq!(ctx.faa(w, 10).await.unwrap(), 5);
        assert_eq!(ctx.faa(w, u64::MAX).await.unwrap(), 15, "FAA wraps");
        assert_eq!(ctx.read(w, 8).await.unwrap(), 14u64.to_ne_bytes());
    });
}

#[test]
fn one_list_executes_in_order_across_two_mns() {
    let (a, b) = (server(0, 4096), server(1, 4096));
    let ctx = context(2, 0, &[&a, &b]);
    run(async {
        let mut list = PostList::new();
        let w = list.write(at(&a, 0), &7u64.to_ne_bytes());
        let r1 = list.read(at(&a, 0), 8);
        let c = list.cas(at(&b, 8), 0, 3);
        let f = list.faa(at(&a, 0), 1);
        let r2 = list.read(at(&b, 8), 8);
        let r3 = list.read(at(&a, 0), 8);
        let mut done = ctx.post(list).await.unwrap();
        assert_eq!(done.len(), 6);
        assert_eq!(done.outcome(w), &WrOutcome::Written);
        assert_eq!(done.take_bytes(r1), 7u64.to_ne_bytes());
        assert_eq!(done.atomic(c), 0);
        assert_eq!(done.atomic(f), 7);
        assert_eq!(done.take_bytes(r2), 3u64.to_ne_bytes());
        assert_eq!(done.take_bytes(r3), 8u64.to_ne_bytes());
    });
}

#[test]
fn detached_posts_stay_in_order_with_later_posts() {
    let s = server(0, 1 << 16);
    let ctx = context(1, 0, &[&s]);
    run(async {
        for i in 0..200u64 {
            let mut list = PostList::new();
            list.write(at(&s, (i % 64) * 8), &i.to_ne_bytes());
            list.faa(at(&s, 4096), 1);
            ctx.post_detached(list).await.unwrap();
        }
        // A later post on the same connection lands after every detached one.
        assert_eq!(
            ctx.read(at(&s, 4096), 8).await.unwrap(),
            200u64.to_ne_bytes()
        );
        assert_eq!(
            ctx.read(at(&s, 63 * 8), 8).await.unwrap(),
            191u64.to_ne_bytes()
        );
    });
}

#[test]
fn concurrent_faa_from_many_connections_counts_exactly() {
    let s = server(0, 4096);
    let threads = 4;
    let per_thread = 2_000u64;
    let word = at(&s, 64);
    let barrier = Arc::new(Barrier::new(threads));
    let seen: Vec<Vec<u64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (s, barrier) = (&s, Arc::clone(&barrier));
                scope.spawn(move || {
                    let ctx = context(1 + t as u16, 0, &[s]);
                    barrier.wait();
                    run(async {
                        let mut olds = Vec::new();
                        for _ in 0..per_thread / 4 {
                            // Four FAAs per doorbell.
                            let mut list = PostList::new();
                            let ids: Vec<_> = (0..4).map(|_| list.faa(word, 1)).collect();
                            let done = ctx.post(list).await.unwrap();
                            olds.extend(ids.into_iter().map(|id| done.atomic(id)));
                        }
                        olds
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all: Vec<u64> = seen.into_iter().flatten().collect();
    all.sort_unstable();
    let total = per_thread * threads as u64;
    assert_eq!(all, (0..total).collect::<Vec<_>>(), "every old value once");
    let ctx = context(9, 0, &[&s]);
    assert_eq!(run(ctx.read(word, 8)).unwrap(), total.to_ne_bytes());
}

#[test]
fn cas_lock_gives_mutual_exclusion() {
    let s = server(0, 4096);
    let (lock, counter) = (at(&s, 0), at(&s, 64));
    let threads = 3;
    let rounds = 300u64;
    std::thread::scope(|scope| {
        for t in 0..threads {
            let s = &s;
            scope.spawn(move || {
                let ctx = context(1 + t, 0, &[s]);
                run(async {
                    for _ in 0..rounds {
                        while ctx.cas(lock, 0, u64::from(t) + 1).await.unwrap() != 0 {}
                        // A non-atomic read-modify-write: only correct under the lock.
                        let v = u64::from_ne_bytes(
                            ctx.read(counter, 8).await.unwrap().try_into().unwrap(),
                        );
                        ctx.write(counter, &(v + 1).to_ne_bytes()).await.unwrap();
                        assert_eq!(
                            ctx.cas(lock, u64::from(t) + 1, 0).await.unwrap(),
                            u64::from(t) + 1
                        );
                    }
                });
            });
        }
    });
    let ctx = context(9, 0, &[&s]);
    assert_eq!(
        run(ctx.read(counter, 8)).unwrap(),
        (rounds * u64::from(threads)).to_ne_bytes()
    );
}

/// A READ racing WRITEs of 8 equal words sees a prefix of new words and a suffix of old
/// ones, never a later word newer than an earlier one (WRITE in increasing address order).
#[test]
fn torn_reads_are_prefix_new_only() {
    let s = server(0, 4096);
    let block = at(&s, 256);
    std::thread::scope(|scope| {
        let s2 = &s;
        let writer = scope.spawn(move || {
            let ctx = context(1, 0, &[s2]);
            run(async {
                for v in 1..=3000u64 {
                    let data: Vec<u8> = (0..8).flat_map(|_| v.to_ne_bytes()).collect();
                    ctx.write(block, &data).await.unwrap();
                }
            });
        });
        let ctx = context(2, 0, &[&s]);
        run(async {
            while !writer.is_finished() {
                let bytes = ctx.read(block, 64).await.unwrap();
                let words: Vec<u64> = bytes
                    .chunks(8)
                    .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
                    .collect();
                assert!(
                    words.windows(2).all(|w| w[0] >= w[1]),
                    "a later word is newer than an earlier one: {words:?}"
                );
            }
        });
    });
}

#[test]
fn bad_addresses_fail_with_the_index_and_stop_the_list() {
    let s = server(0, 4096);
    let ctx = context(1, 0, &[&s]);
    run(async {
        // Out of bounds, in the middle of a list: the WRITE before it lands, the one after
        // it does not.
        let mut list = PostList::new();
        list.write(at(&s, 0), &[1; 8]);
        let oob = s.region().at(4090).unwrap();
        list.read(oob, 8);
        list.write(at(&s, 8), &[2; 8]);
        assert_eq!(
            ctx.post(list).await,
            Err(VerbsError::RemoteAccess {
                index: 1,
                addr: oob
            })
        );
        assert_eq!(
            ctx.read(at(&s, 0), 16).await.unwrap(),
            [[1u8; 8], [0; 8]].concat()
        );
        // A wrong rkey.
        let bad_key = RemoteAddr {
            rkey: RKey(1),
            ..at(&s, 0)
        };
        assert!(matches!(
            ctx.faa(bad_key, 1).await,
            Err(VerbsError::RemoteAccess { index: 0, .. })
        ));
        // Refused before anything is sent.
        assert_eq!(
            ctx.post(PostList::new()).await,
            Err(VerbsError::EmptyPostList)
        );
        assert!(matches!(
            ctx.cas(at(&s, 3), 0, 1).await,
            Err(VerbsError::Misaligned { index: 0, .. })
        ));
        let elsewhere = RemoteAddr {
            node: NodeId(7),
            ..at(&s, 0)
        };
        assert_eq!(
            ctx.read(elsewhere, 8).await,
            Err(VerbsError::ConnectionLost { node: NodeId(7) })
        );
        // A list whose completion would not fit in one frame.
        let mut big = PostList::new();
        big.read(at(&s, 0), 4096);
        for _ in 0..5000 {
            big.read(at(&s, 0), 8);
        }
        assert!(matches!(
            ctx.post(big).await,
            Err(VerbsError::MessageTooLarge { .. })
        ));
        // The connection is still usable after all of that.
        assert_eq!(ctx.faa(at(&s, 64), 1).await.unwrap(), 0);
    });
}

#[test]
fn a_stopped_server_is_a_lost_connection() {
    let s = server(0, 4096);
    let ctx = context(1, 0, &[&s]);
    let word = at(&s, 0);
    run(async { ctx.faa(word, 1).await.unwrap() });
    s.stop().unwrap();
    let result = run(ctx.faa(word, 1));
    assert_eq!(result, Err(VerbsError::ConnectionLost { node: NodeId(0) }));
    assert!(ctx.is_lost(NodeId(0)));
}

#[test]
fn revocation_drops_and_refuses_the_cn_only() {
    let s = server(0, 4096);
    let victim = context(1, 0, &[&s]);
    let other = context(2, 0, &[&s]);
    let word = at(&s, 0);
    run(async {
        victim.faa(word, 1).await.unwrap();
        other.faa(word, 1).await.unwrap();
    });
    assert_eq!(s.revoke(NodeId(1)).unwrap(), 1);
    let after = run(victim.faa(word, 100));
    assert!(
        matches!(
            after,
            Err(VerbsError::ConnectionLost { .. } | VerbsError::RemoteAccess { .. })
        ),
        "{after:?}"
    );
    // Nothing of the victim landed after the revocation; the other CN goes on.
    assert_eq!(run(other.faa(word, 1)).unwrap(), 2);
    // A new connection of the revoked CN is refused.
    let fabric = TcpFabric::new(NodeId(1));
    let mut again = fabric.context(Port(5)).unwrap();
    match again.connect(s.local_addr()) {
        Err(TcpError::Refused {
            reason: RefuseReason::Revoked,
            ..
        }) => {}
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_second_connection_to_the_same_mn_is_refused() {
    let s = server(0, 4096);
    let mut ctx = context(1, 0, &[&s]);
    assert!(matches!(
        ctx.connect(s.local_addr()),
        Err(TcpError::DuplicateLink(NodeId(0)))
    ));
}

#[test]
fn malformed_frames_are_refused_and_the_server_goes_on() {
    let s = server(0, 4096);
    let expect_refused = |bytes: &[u8]| {
        let mut raw = TcpStream::connect(s.local_addr()).unwrap();
        raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        raw.write_all(bytes).unwrap();
        let mut reply = Vec::new();
        raw.read_to_end(&mut reply).unwrap();
        let header: &[u8; wire::HEADER_LEN] = reply[..wire::HEADER_LEN].try_into().unwrap();
        let (kind, _) = wire::parse_header(header).unwrap();
        assert_eq!(kind, FrameKind::Refused);
        assert_eq!(
            wire::parse_refused(&reply[wire::HEADER_LEN..]).unwrap(),
            RefuseReason::Malformed
        );
    };
    // Not our protocol at all.
    expect_refused(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    // A post before the hello.
    let mut post = Vec::new();
    let op = dmem_verbs::Op::Read {
        addr: at(&s, 0),
        len: 8,
    };
    wire::put_post(&mut post, 0, false, [op].iter()).unwrap();
    expect_refused(&post);
    // A hello, then a post whose op code is garbage.
    let mut bad = Vec::new();
    wire::put_hello(&mut bad, NodeId(4));
    let start = bad.len();
    bad.extend_from_slice(&post);
    bad[start + wire::HEADER_LEN] = 0x7f;
    let mut raw = TcpStream::connect(s.local_addr()).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    raw.write_all(&bad).unwrap();
    let mut reply = Vec::new();
    raw.read_to_end(&mut reply).unwrap();
    let kinds: Vec<FrameKind> = {
        let mut kinds = Vec::new();
        let mut rest = &reply[..];
        while rest.len() >= wire::HEADER_LEN {
            let (kind, h) =
                wire::parse_header(rest[..wire::HEADER_LEN].try_into().unwrap()).unwrap();
            kinds.push(kind);
            rest = &rest[wire::HEADER_LEN + h.body_len.get() as usize..];
        }
        kinds
    };
    assert_eq!(kinds, [FrameKind::Welcome, FrameKind::Refused]);
    // A header that declares a body beyond the limit is refused before anything is read.
    let mut huge = post.clone();
    huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    expect_refused(&huge);
    // The server still serves well-behaved CNs.
    let ctx = context(1, 0, &[&s]);
    assert_eq!(run(ctx.faa(at(&s, 0), 1)).unwrap(), 0);
}

#[test]
fn large_reads_and_writes_cross_many_segments() {
    let s = server(0, 4 << 20);
    let ctx = context(1, 0, &[&s]);
    let data: Vec<u8> = (0..(3 << 20)).map(|i: u32| (i % 251) as u8).collect();
    run(async {
        ctx.write(at(&s, 17), &data).await.unwrap();
        assert_eq!(ctx.read(at(&s, 17), data.len() as u32).await.unwrap(), data);
    });
}

#[test]
fn messages_between_cns_and_within_one() {
    let fa = TcpFabric::new(NodeId(1));
    let fb = TcpFabric::new(NodeId(2));
    let la = fa.listen(loopback()).unwrap();
    let lb = fb.listen(loopback()).unwrap();
    fa.add_peer(NodeId(2), lb.local_addr());
    fb.add_peer(NodeId(1), la.local_addr());
    let a = fa.context(Port(1)).unwrap();
    let a2 = fa.context(Port(2)).unwrap();
    let b = fb.context(Port(1)).unwrap();
    let to_b = Endpoint {
        node: NodeId(2),
        port: Port(1),
    };
    run(async {
        a.send(to_b, b"ping").await.unwrap();
        let big = vec![9u8; dmem_shm::MAX_MESSAGE];
        a.send(to_b, &big).await.unwrap();
        let m = b.recv().await.unwrap();
        assert_eq!(
            (m.from, m.payload.as_slice()),
            (a.local_endpoint(), &b"ping"[..])
        );
        assert_eq!(b.recv().await.unwrap().payload, big);
        b.send(a.local_endpoint(), b"pong").await.unwrap();
        assert_eq!(a.recv().await.unwrap().payload, b"pong");
        // Within one process, no socket.
        a.send(a2.local_endpoint(), b"local").await.unwrap();
        assert_eq!(a2.try_recv().unwrap().unwrap().payload, b"local");
        // Errors: too large, a node nobody knows.
        assert!(matches!(
            a.send(to_b, &vec![0; dmem_shm::MAX_MESSAGE + 1]).await,
            Err(VerbsError::MessageTooLarge { .. })
        ));
        let nowhere = Endpoint {
            node: NodeId(9),
            port: Port(0),
        };
        assert_eq!(
            a.send(nowhere, b"x").await,
            Err(VerbsError::ConnectionLost { node: NodeId(9) })
        );
    });
    // A peer that went away is a lost connection (after the kernel noticed the reset).
    drop(b);
    drop(lb);
    let lost = (0..50).any(|_| {
        std::thread::sleep(Duration::from_millis(10));
        run(a.send(to_b, b"anyone?")).is_err()
    });
    assert!(lost, "sending to a closed peer never failed");
}
