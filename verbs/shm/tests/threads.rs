//! Single-process, multi-thread tests of the shared-memory fabric.

mod util;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use dmem_shm::{HugePages, ShmContext, ShmError, ShmFabric, ShmMemoryNode};
use dmem_verbs::{
    Endpoint, NodeId, Port, PostList, RKey, RemoteAddr, Verbs, VerbsError, VerbsExt, WrOutcome,
};
use util::{block_on, now};

const MN: NodeId = NodeId(0);
const RKEY: RKey = RKey(0x5eed);

fn ep(node: u16, port: u16) -> Endpoint {
    Endpoint {
        node: NodeId(node),
        port: Port(port),
    }
}

fn setup(len: u64) -> (ShmMemoryNode, ShmFabric) {
    (
        ShmMemoryNode::create(MN, RKEY, len).unwrap(),
        ShmFabric::new(),
    )
}

/// A context of CN `cn` (port `port`) linked to `mn`.
fn cn(mn: &ShmMemoryNode, fabric: &ShmFabric, cn: u16, port: u16) -> ShmContext {
    let mut ctx = fabric.context(ep(cn, port)).unwrap();
    ctx.add_link(mn.link(NodeId(cn)).unwrap()).unwrap();
    ctx
}

fn at(mn: &ShmMemoryNode, offset: u64) -> RemoteAddr {
    mn.region().at(offset).unwrap()
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
fn region_is_zeroed_and_reports_its_pages() {
    let (mn, fabric) = setup(10_000);
    let c = cn(&mn, &fabric, 1, 0);
    assert_eq!(mn.region().len, 10_000);
    assert!(mn.mapped_len() >= 10_000);
    assert!(matches!(
        mn.huge_pages(),
        HugePages::Hugetlb | HugePages::Madvised | HugePages::None
    ));
    assert!(
        now(c.read(at(&mn, 0), 10_000))
            .unwrap()
            .iter()
            .all(|&b| b == 0)
    );
}

#[test]
fn unaligned_reads_and_writes_match_a_byte_model() {
    let (mn, fabric) = setup(512);
    let c = cn(&mn, &fabric, 1, 0);
    let mut model = vec![0u8; 512];
    let mut rng = Lcg(7);
    for round in 0..400u32 {
        let offset = rng.next() % 512;
        let len = rng.next() % (512 - offset + 1);
        let data: Vec<u8> = (0..len).map(|i| (round as u64 * 31 + i) as u8).collect();
        now(c.write(at(&mn, offset), &data)).unwrap();
        model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
        let r_off = rng.next() % 512;
        let r_len = (rng.next() % (512 - r_off + 1)) as u32;
        let got = now(c.read(at(&mn, r_off), r_len)).unwrap();
        assert_eq!(got, model[r_off as usize..r_off as usize + r_len as usize]);
    }
    assert_eq!(now(c.read(at(&mn, 0), 512)).unwrap(), model);
}

#[test]
fn cas_and_faa_return_the_old_value() {
    let (mn, fabric) = setup(4096);
    let c = cn(&mn, &fabric, 1, 0);
    let w = at(&mn, 64);
    assert_eq!(now(c.cas(w, 0, 10)).unwrap(), 0, "swap happens");
    assert_eq!(now(c.cas(w, 0, 20)).unwrap(), 10, "swap refused");
    assert_eq!(now(c.faa(w, 5)).unwrap(), 10);
    assert_eq!(now(c.faa(w, u64::MAX)).unwrap(), 15, "wrapping add of -1");
    assert_eq!(now(c.read(w, 8)).unwrap(), 14u64.to_ne_bytes());
    // Atomics and 8-byte WRITEs see the same word.
    now(c.write(w, &99u64.to_ne_bytes())).unwrap();
    assert_eq!(now(c.cas(w, 99, 1)).unwrap(), 99);
}

#[test]
fn a_post_list_returns_every_outcome_in_order() {
    let (mn, fabric) = setup(4096);
    let c = cn(&mn, &fabric, 1, 0);
    let mut list = PostList::new();
    let cas = list.cas(at(&mn, 0), 0, 7);
    let write = list.write(at(&mn, 8), b"abcdefgh");
    let read = list.read(at(&mn, 0), 16);
    let faa = list.faa(at(&mn, 0), 1);
    let result = now(c.post(list)).unwrap();
    assert_eq!(result.atomic(cas), 0);
    assert_eq!(result.outcome(write), &WrOutcome::Written);
    let mut expect = 7u64.to_ne_bytes().to_vec();
    expect.extend_from_slice(b"abcdefgh");
    assert_eq!(result.bytes(read), expect);
    assert_eq!(result.atomic(faa), 7);
}

#[test]
fn concurrent_faa_counts_exactly() {
    const THREADS: u64 = 4;
    const ADDS: u64 = 20_000;
    let (mn, fabric) = setup(4096);
    let counter = at(&mn, 128);
    let start = Arc::new(Barrier::new(THREADS as usize));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (mn, fabric, start) = (mn.clone(), fabric.clone(), Arc::clone(&start));
            thread::spawn(move || {
                let c = cn(&mn, &fabric, 1 + t as u16, 0);
                start.wait();
                let mut seen = Vec::with_capacity(ADDS as usize);
                for _ in 0..ADDS {
                    seen.push(now(c.faa(counter, 1)).unwrap());
                }
                seen
            })
        })
        .collect();
    let mut all: Vec<u64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let c = cn(&mn, &fabric, 9, 0);
    let total = u64::from_ne_bytes(now(c.read(counter, 8)).unwrap().try_into().unwrap());
    assert_eq!(total, THREADS * ADDS);
    // Every old value was returned exactly once.
    all.sort_unstable();
    assert!(all.iter().copied().eq(0..THREADS * ADDS));
}

#[test]
fn cas_lock_gives_mutual_exclusion() {
    const THREADS: u16 = 4;
    const ROUNDS: u64 = 2_000;
    let (mn, fabric) = setup(4096);
    let lock = at(&mn, 0);
    let inside = at(&mn, 64);
    let counter = at(&mn, 128);
    let handles: Vec<_> = (1..=THREADS)
        .map(|id| {
            let (mn, fabric) = (mn.clone(), fabric.clone());
            thread::spawn(move || {
                let c = cn(&mn, &fabric, id, 0);
                for _ in 0..ROUNDS {
                    while now(c.cas(lock, 0, u64::from(id))).unwrap() != 0 {
                        thread::yield_now();
                    }
                    assert_eq!(now(c.faa(inside, 1)).unwrap(), 0, "two holders at once");
                    // A read-modify-write made of a READ and a WRITE: only safe under the lock.
                    let v =
                        u64::from_ne_bytes(now(c.read(counter, 8)).unwrap().try_into().unwrap());
                    now(c.write(counter, &(v + 1).to_ne_bytes())).unwrap();
                    assert_eq!(now(c.faa(inside, u64::MAX)).unwrap(), 1);
                    assert_eq!(now(c.cas(lock, u64::from(id), 0)).unwrap(), u64::from(id));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let c = cn(&mn, &fabric, 99, 0);
    let v = u64::from_ne_bytes(now(c.read(counter, 8)).unwrap().try_into().unwrap());
    assert_eq!(v, u64::from(THREADS) * ROUNDS);
}

/// A WRITE of generation `g` stores `g` in every word, lowest address first; a concurrent READ
/// may be torn, but only as "prefix new, suffix old" at line granularity: word values never
/// increase with the address, and the eight words of a line are always of one WRITE.
#[test]
fn torn_reads_are_only_prefix_new_suffix_old_in_whole_lines() {
    const WORDS: usize = 512; // 4 KiB, 64 cache lines
    let (mn, fabric) = setup(8192);
    let base = at(&mn, 0);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (mn, fabric, stop) = (mn.clone(), fabric.clone(), Arc::clone(&stop));
        thread::spawn(move || {
            let c = cn(&mn, &fabric, 1, 0);
            let mut g = 0u64;
            while !stop.load(Ordering::Relaxed) {
                g += 1;
                let image: Vec<u8> = (0..WORDS).flat_map(|_| g.to_ne_bytes()).collect();
                now(c.write(base, &image)).unwrap();
            }
            g
        })
    };
    let c = cn(&mn, &fabric, 2, 0);
    let (mut reads, mut torn) = (0u64, 0u64);
    let deadline = Instant::now() + Duration::from_millis(400);
    while Instant::now() < deadline && reads < 200_000 {
        let bytes = now(c.read(base, (WORDS * 8) as u32)).unwrap();
        let words: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|w| u64::from_ne_bytes(w.try_into().unwrap()))
            .collect();
        for (i, pair) in words.windows(2).enumerate() {
            assert!(
                pair[0] >= pair[1],
                "word {} holds generation {} but the later word {} holds {}: a later word \
                 became visible before an earlier one",
                i,
                pair[0],
                i + 1,
                pair[1]
            );
        }
        for (l, line) in words.chunks_exact(8).enumerate() {
            assert!(
                line.iter().all(|&w| w == line[0]),
                "line {l} is torn inside: {line:?}"
            );
        }
        if words[0] != words[WORDS - 1] {
            torn += 1;
        }
        reads += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let generations = writer.join().unwrap();
    eprintln!("{reads} reads against {generations} writes, {torn} torn (all prefix-new)");
    assert!(generations > 0 && reads > 0);
}

/// FORD's commit against FORD's item READ, as a one-record litmus test. Item layout as a
/// FORD data item: lock word, version word, writer word, value words. The writer locks with
/// CAS, WRITEs version, writer and value from the version word up in one WRITE, then
/// releases the lock with a later WRITE; the reader READs the whole item and accepts it when
/// the lock word is free, as FORD's execution READ does. Every accepted image must be one
/// commit's: writer and value words belong to the version word. Before READs were snapshots
/// (words loaded one by one, highest first), a reader that lost the CPU between two loads
/// accepted a new version next to the previous writer and value (issue #17), and so did a
/// reader slower than the writer's whole commit on a long item.
#[test]
fn an_unlocked_item_read_is_one_commit_s_image() {
    // A long value makes the READ slow enough for whole commits to fit inside one.
    const VALUE_WORDS: usize = 4096;
    const ITEM_WORDS: usize = 3 + VALUE_WORDS;
    const MARK: u64 = 0xA5A5_0000_0000_0000;
    let (mn, fabric) = setup(65536);
    let (lock, version) = (at(&mn, 0), at(&mn, 8));
    // Version 0 (the loaded image) with writer 0 ^ MARK and value words 0.
    now(cn(&mn, &fabric, 9, 0).write(at(&mn, 16), &MARK.to_ne_bytes())).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (mn, fabric, stop) = (mn.clone(), fabric.clone(), Arc::clone(&stop));
        thread::spawn(move || {
            let c = cn(&mn, &fabric, 1, 0);
            let mut g = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if now(c.cas(lock, 0, 1)).unwrap() != 0 {
                    continue;
                }
                g += 1;
                let mut image = vec![g, g ^ MARK];
                image.extend(std::iter::repeat_n(g, VALUE_WORDS));
                let bytes: Vec<u8> = image.iter().flat_map(|w| w.to_ne_bytes()).collect();
                now(c.write(version, &bytes)).unwrap();
                now(c.write(lock, &0u64.to_ne_bytes())).unwrap();
                // Leave the item unlocked for a while, so that readers accept images.
                for _ in 0..2_000 {
                    std::hint::spin_loop();
                }
            }
            g
        })
    };
    let readers: Vec<_> = (0..2u16)
        .map(|r| {
            let (mn, fabric, stop) = (mn.clone(), fabric.clone(), Arc::clone(&stop));
            thread::spawn(move || {
                let c = cn(&mn, &fabric, 2 + r, 0);
                let (mut accepted, mut torn) = (0u64, Vec::new());
                // 600 ms, longer (up to 10 s) until 20 images were accepted: a loaded
                // machine can starve one thread.
                let start = Instant::now();
                while start.elapsed() < Duration::from_millis(600)
                    || (accepted < 20 && start.elapsed() < Duration::from_secs(10))
                {
                    let bytes = now(c.read(lock, (ITEM_WORDS * 8) as u32)).unwrap();
                    let w: Vec<u64> = bytes
                        .chunks_exact(8)
                        .map(|w| u64::from_ne_bytes(w.try_into().unwrap()))
                        .collect();
                    if w[0] != 0 {
                        continue;
                    }
                    accepted += 1;
                    let v = w[1];
                    if w[2] != v ^ MARK || w[3..].iter().any(|&x| x != v) {
                        torn.push((v, w[2] ^ MARK, w[3], w[ITEM_WORDS - 1]));
                    }
                }
                stop.store(true, Ordering::Relaxed);
                (accepted, torn)
            })
        })
        .collect();
    let results: Vec<_> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    stop.store(true, Ordering::Relaxed);
    let commits = writer.join().unwrap();
    let accepted: u64 = results.iter().map(|r| r.0).sum();
    let torn: Vec<_> = results.iter().flat_map(|r| r.1.iter().copied()).collect();
    eprintln!(
        "{accepted} unlocked images accepted against {commits} commits, {} torn ({} stalled ops)",
        torn.len(),
        dmem_shm::stalls()
    );
    assert!(commits > 0 && accepted > 0);
    assert!(
        torn.is_empty(),
        "{} of {accepted} accepted images were torn; first (version, writer's version, first \
         value word, last value word): {:?}",
        torn.len(),
        torn.first()
    );
}

#[test]
fn revoked_access_fails_and_touches_nothing() {
    let (mn, fabric) = setup(4096);
    let victim = cn(&mn, &fabric, 1, 0);
    let other_port = cn(&mn, &fabric, 1, 1);
    let survivor = cn(&mn, &fabric, 2, 0);
    let w = at(&mn, 64);
    now(victim.faa(w, 1)).unwrap();
    assert_eq!(mn.revoke(NodeId(1)).unwrap(), 2, "both contexts of CN 1");
    assert!(victim.link(MN).unwrap().is_revoked());
    for ctx in [&victim, &other_port] {
        let refused = VerbsError::RemoteAccess { index: 0, addr: w };
        assert_eq!(now(ctx.read(w, 8)), Err(refused.clone()));
        assert_eq!(now(ctx.write(w, &[0xff; 8])), Err(refused.clone()));
        assert_eq!(now(ctx.cas(w, 1, 5)), Err(refused.clone()));
        assert_eq!(now(ctx.faa(w, 5)), Err(refused));
    }
    assert_eq!(now(survivor.read(w, 8)).unwrap(), 1u64.to_ne_bytes());
    assert!(!survivor.link(MN).unwrap().is_revoked());
    // A restarted CN 1 links again with a fresh slot.
    let restarted = cn(&mn, &fabric, 1, 2);
    assert_eq!(now(restarted.faa(w, 1)).unwrap(), 1);
}

#[test]
fn revoke_waits_for_posts_in_flight_and_nothing_lands_after_it() {
    let (mn, fabric) = setup(4096);
    let w = at(&mn, 0);
    let started = Arc::new(Barrier::new(2));
    let victim = {
        let (mn, fabric, started) = (mn.clone(), fabric.clone(), Arc::clone(&started));
        thread::spawn(move || {
            let c = cn(&mn, &fabric, 1, 0);
            started.wait();
            let mut adds = 0u64;
            // Big batches, so that revocation often meets a post in flight.
            loop {
                let mut list = PostList::new();
                for _ in 0..64 {
                    list.faa(w, 1);
                }
                match now(c.post(list)) {
                    Ok(_) => adds += 64,
                    Err(VerbsError::RemoteAccess { .. }) => return adds,
                    Err(e) => panic!("{e}"),
                }
            }
        })
    };
    started.wait();
    thread::sleep(Duration::from_millis(20));
    mn.revoke(NodeId(1)).unwrap();
    let observer = cn(&mn, &fabric, 2, 0);
    let at_revoke = now(observer.read(w, 8)).unwrap();
    let adds = victim.join().unwrap();
    let after = now(observer.read(w, 8)).unwrap();
    assert_eq!(at_revoke, after, "an op landed after revoke returned");
    // Revocation is checked once per post and node: a post either ran whole (and revoke
    // waited for it) or was refused whole, so the counter holds exactly the completed adds.
    let total = u64::from_ne_bytes(after.try_into().unwrap());
    assert_eq!(total, adds);
}

#[test]
fn bad_accesses_complete_with_remote_access_and_touch_nothing() {
    let (mn, fabric) = setup(1000);
    let c = cn(&mn, &fabric, 1, 0);
    now(c.write(at(&mn, 984), &[7u8; 16])).unwrap();
    let end = at(&mn, 996);
    // Crossing the end of the region.
    let crossing = VerbsError::RemoteAccess {
        index: 0,
        addr: end,
    };
    assert_eq!(now(c.read(end, 8)), Err(crossing.clone()));
    assert_eq!(now(c.write(end, &[1u8; 8])), Err(crossing));
    // Past the end (the mapping is page-rounded, the region is not).
    let past = at(&mn, 992).add(8);
    assert!(matches!(
        now(c.cas(past, 0, 1)),
        Err(VerbsError::RemoteAccess { .. })
    ));
    assert!(matches!(
        now(c.faa(at(&mn, 0).add(u64::MAX - 7), 1)),
        Err(VerbsError::RemoteAccess { .. })
    ));
    // Wrong rkey.
    let wrong_key = RemoteAddr {
        rkey: RKey(RKEY.0 + 1),
        ..at(&mn, 0)
    };
    assert_eq!(
        now(c.read(wrong_key, 8)),
        Err(VerbsError::RemoteAccess {
            index: 0,
            addr: wrong_key
        })
    );
    assert_eq!(
        now(c.read(at(&mn, 984), 16)).unwrap(),
        [7u8; 16],
        "untouched"
    );
    // A node this context has no link to.
    let elsewhere = RemoteAddr {
        node: NodeId(5),
        ..at(&mn, 0)
    };
    assert_eq!(
        now(c.read(elsewhere, 8)),
        Err(VerbsError::ConnectionLost { node: NodeId(5) })
    );
    // Refused before posting.
    assert!(matches!(
        now(c.faa(at(&mn, 4), 1)),
        Err(VerbsError::Misaligned { .. })
    ));
    assert_eq!(now(c.post(PostList::new())), Err(VerbsError::EmptyPostList));
}

#[test]
fn a_failed_work_request_ends_the_post_after_its_predecessors_landed() {
    let (mn, fabric) = setup(4096);
    let c = cn(&mn, &fabric, 1, 0);
    let mut list = PostList::new();
    list.faa(at(&mn, 0), 1);
    let bad = at(&mn, 4095).add(1);
    list.write(bad, &[1]);
    list.faa(at(&mn, 8), 1);
    assert_eq!(
        now(c.post(list)),
        Err(VerbsError::RemoteAccess {
            index: 1,
            addr: bad
        })
    );
    let words = now(c.read(at(&mn, 0), 16)).unwrap();
    assert_eq!(words[..8], 1u64.to_ne_bytes(), "the first landed");
    assert_eq!(words[8..], 0u64.to_ne_bytes(), "the third did not run");
}

#[test]
fn messages_between_threads_wake_the_receiver() {
    let fabric = ShmFabric::new();
    let server = fabric.context(ep(1, 0)).unwrap();
    assert!(matches!(
        fabric.context(ep(1, 0)),
        Err(ShmError::EndpointInUse(_))
    ));
    assert_eq!(server.try_recv(), Ok(None));
    let client_fabric = fabric.clone();
    let client = thread::spawn(move || {
        let client = client_fabric.context(ep(2, 0)).unwrap();
        thread::sleep(Duration::from_millis(30));
        now(client.send(ep(1, 0), b"ping")).unwrap();
        let (reply, _) = block_on(client.recv());
        reply.unwrap()
    });
    // The receiver parks until the sender wakes it; a busy loop would poll thousands of times.
    let (msg, polls) = block_on(server.recv());
    let msg = msg.unwrap();
    assert_eq!((msg.from, msg.payload.as_slice()), (ep(2, 0), &b"ping"[..]));
    assert!(polls <= 3, "recv was polled {polls} times");
    now(server.send(msg.from, b"pong")).unwrap();
    let reply = client.join().unwrap();
    assert_eq!((reply.from, reply.payload), (ep(1, 0), b"pong".to_vec()));

    // The client's context is gone: its endpoint is unreachable.
    assert_eq!(
        now(server.send(ep(2, 0), b"?")),
        Err(VerbsError::ConnectionLost { node: NodeId(2) })
    );
    let huge = vec![0u8; dmem_shm::MAX_MESSAGE + 1];
    assert!(matches!(
        now(server.send(ep(1, 0), &huge)),
        Err(VerbsError::MessageTooLarge { .. })
    ));
    // Messages to oneself queue in order.
    now(server.send(ep(1, 0), b"a")).unwrap();
    now(server.send(ep(1, 0), b"b")).unwrap();
    assert_eq!(server.try_recv().unwrap().unwrap().payload, b"a");
    assert_eq!(now(server.recv()).unwrap().payload, b"b");
}

#[test]
fn a_context_links_to_each_node_once() {
    let (mn, fabric) = setup(4096);
    let mut c = cn(&mn, &fabric, 1, 0);
    assert!(matches!(
        c.add_link(mn.link(NodeId(1)).unwrap()),
        Err(ShmError::DuplicateLink(MN))
    ));
    let mn2 = ShmMemoryNode::create(NodeId(3), RKey(1), 64).unwrap();
    c.add_link(mn2.link(NodeId(1)).unwrap()).unwrap();
    let mut list = PostList::new();
    list.faa(mn2.region().at(0).unwrap(), 3);
    let read = list.read(at(&mn, 0), 8);
    let result = now(c.post(list)).unwrap();
    assert_eq!(result.bytes(read), [0u8; 8]);
    assert_eq!(
        now(c.read(mn2.region().at(0).unwrap(), 8)).unwrap(),
        3u64.to_ne_bytes()
    );
}

#[test]
fn serve_and_connect_within_one_process() {
    let (mn, fabric) = setup(4096);
    let dir = std::env::temp_dir().join(format!("dmem-shm-serve-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mn.sock");
    let server = mn.serve(&path).unwrap();
    assert_eq!(server.path(), path);
    let mut remote = fabric.context(ep(1, 0)).unwrap();
    remote
        .add_link(dmem_shm::MnLink::connect(&path, NodeId(1)).unwrap())
        .unwrap();
    let local = cn(&mn, &fabric, 2, 0);
    now(remote.write(at(&mn, 8), b"through the socket")).unwrap();
    assert_eq!(
        now(local.read(at(&mn, 8), 18)).unwrap(),
        b"through the socket"
    );
    // A peer that does not speak the handshake is refused without a descriptor, and the
    // server keeps serving.
    {
        use std::io::{Read, Write};
        let mut raw = std::os::unix::net::UnixStream::connect(&path).unwrap();
        raw.write_all(&[0xAB; 16]).unwrap();
        let mut reply = Vec::new();
        raw.read_to_end(&mut reply).unwrap();
        assert_eq!(reply.len(), 40);
        assert_eq!(reply[12..16], 2u32.to_le_bytes(), "status: bad hello");
    }
    assert!(dmem_shm::MnLink::connect(&path, NodeId(3)).is_ok());
    drop(server);
    assert!(!path.exists(), "the socket file is removed");
    assert_eq!(
        now(remote.faa(at(&mn, 0), 1)).unwrap(),
        0,
        "links outlive the server"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Two fabrics stand for two processes: messages between them go through Unix sockets.
#[test]
fn messages_between_fabrics_go_through_unix_sockets() {
    let dir = std::env::temp_dir().join(format!("dmem-shm-msg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (one, two) = (ShmFabric::new(), ShmFabric::new());
    let server_one = one.serve_messages(&dir, NodeId(1)).unwrap();
    let server_two = two.serve_messages(&dir, NodeId(2)).unwrap();
    assert_eq!(server_two.path(), dmem_shm::message_socket(&dir, NodeId(2)));
    let a = one.context(ep(1, 0)).unwrap();
    let b = two.context(ep(2, 3)).unwrap();

    let big = vec![0x5a; dmem_shm::MAX_MESSAGE];
    now(a.send(ep(2, 3), b"over the socket")).unwrap();
    now(a.send(ep(2, 9), b"to a port nobody receives on: dropped")).unwrap();
    now(a.send(ep(2, 3), &big)).unwrap();
    let (first, _) = block_on(b.recv());
    let first = first.unwrap();
    assert_eq!(
        (first.from, first.payload.as_slice()),
        (ep(1, 0), &b"over the socket"[..])
    );
    assert_eq!(block_on(b.recv()).0.unwrap().payload, big);
    now(b.send(first.from, b"and back")).unwrap();
    let (reply, _) = block_on(a.recv());
    assert_eq!(reply.unwrap().payload, b"and back");

    assert_eq!(
        now(a.send(ep(7, 0), b"?")),
        Err(VerbsError::ConnectionLost { node: NodeId(7) }),
        "no socket for node 7"
    );
    drop(server_two);
    assert!(!dmem_shm::message_socket(&dir, NodeId(2)).exists());
    assert_eq!(
        now(a.send(ep(2, 3), b"gone")),
        Err(VerbsError::ConnectionLost { node: NodeId(2) })
    );
    drop(server_one);
    std::fs::remove_dir_all(&dir).unwrap();
}
