//! The rdma fabric on a real verbs stack: one MN served over TCP by [`RdmaMemoryServer`]
//! and CN contexts connected to it with [`connect_memory`], in one process, through the
//! first RDMA device (soft-RoCE in CI).
//!
//! These tests need an RDMA device, so they are `#[ignore]`d in a plain `cargo test`; CI
//! runs them inside the soft-RoCE VM, where they must pass:
//!
//! ```sh
//! ci/rxe-vm.sh 'target/debug/deps/rxe-* --ignored --test-threads 1'
//! ```
#![cfg(feature = "device")]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use dmem_rdma::ChainLimits;
use dmem_rdma::device::{RdmaContext, RdmaDevice};
use dmem_rdma::server::{RdmaMemoryServer, connect_memory};
use dmem_verbs::{
    Endpoint, NodeId, Port, PostList, RemoteAddr, Verbs, VerbsError, VerbsExt, WrOutcome,
};

const MN: NodeId = NodeId(0);
const REGION: usize = 1 << 20;

/// Drives `f` to completion by polling it: rdma futures poll their completion queue each
/// time they are polled (no interrupts), so a busy loop is the whole executor.
fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(out) = f.as_mut().poll(&mut cx) {
            return out;
        }
        std::hint::spin_loop();
    }
}

struct Mn {
    device: Arc<RdmaDevice>,
    server: RdmaMemoryServer,
    region: dmem_rdma::device::RegisteredRegion,
}

fn mn() -> Mn {
    let device = Arc::new(RdmaDevice::open(None).expect("an RDMA device (run in ci/rxe-vm.sh)"));
    let region = device.register(REGION).expect("register the MN region");
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = RdmaMemoryServer::serve(Arc::clone(&device), MN, region.descriptor(), any)
        .expect("serve the region");
    Mn {
        device,
        server,
        region,
    }
}

fn cn(mn: &Mn, node: u16) -> (RdmaContext, RemoteAddr) {
    let ctx = mn
        .device
        .context(
            Endpoint {
                node: NodeId(node),
                port: Port(1),
            },
            ChainLimits::default(),
        )
        .expect("a CN context");
    let desc = connect_memory(&ctx, MN, mn.server.local_addr()).expect("connect to the MN");
    let rkey = desc.region.expect("the MN sends its region").rkey;
    (
        ctx,
        RemoteAddr {
            node: MN,
            rkey,
            offset: 0,
        },
    )
}

fn at(base: RemoteAddr, offset: u64) -> RemoteAddr {
    RemoteAddr { offset, ..base }
}

#[test]
#[ignore = "needs an RDMA device: run inside ci/rxe-vm.sh"]
fn write_read_cas_faa_have_their_semantics() {
    let mn = mn();
    let (ctx, base) = cn(&mn, 1);
    block_on(async {
        // A WRITE of several cache lines reads back whole, and lands in the MN's memory.
        let data: Vec<u8> = (0..300u32).map(|i| (i * 7 % 251) as u8).collect();
        ctx.write(at(base, 4096), &data).await.unwrap();
        assert_eq!(ctx.read(at(base, 4096), 300).await.unwrap(), data);
        assert_eq!(mn.region.snapshot(4096, 300), data);
        // CAS: succeeds on the expected value, fails (returning the current one) otherwise.
        assert_eq!(ctx.cas(at(base, 64), 0, 41).await.unwrap(), 0);
        assert_eq!(ctx.cas(at(base, 64), 0, 99).await.unwrap(), 41);
        assert_eq!(ctx.cas(at(base, 64), 41, 42).await.unwrap(), 41);
        // FAA returns the value before the add.
        assert_eq!(ctx.faa(at(base, 128), 5).await.unwrap(), 0);
        assert_eq!(ctx.faa(at(base, 128), 7).await.unwrap(), 5);
        let word = ctx.read(at(base, 128), 8).await.unwrap();
        assert_eq!(u64::from_ne_bytes(word.try_into().unwrap()), 12);
        assert_eq!(
            u64::from_ne_bytes(mn.region.snapshot(64, 8).try_into().unwrap()),
            42
        );
    });
}

#[test]
#[ignore = "needs an RDMA device: run inside ci/rxe-vm.sh"]
fn one_post_list_mixes_verbs_in_order() {
    let mn = mn();
    let (ctx, base) = cn(&mn, 1);
    block_on(async {
        // FORD's execution round: CAS a lock and READ the record behind it, one doorbell;
        // then a batch of 16 WRITEs and 16 READs of what they wrote (RC executes in order).
        let mut list = PostList::new();
        let lock = list.cas(at(base, 0), 0, 7);
        let record = list.read(at(base, 8), 56);
        let mut result = ctx.post(list).await.unwrap();
        assert_eq!(result.atomic(lock), 0);
        assert_eq!(result.take_bytes(record), vec![0; 56]);

        let mut list = PostList::new();
        for i in 0..16u64 {
            list.write(at(base, 8192 + i * 64), &[i as u8 + 1; 64]);
        }
        let reads: Vec<_> = (0..16u64)
            .map(|i| list.read(at(base, 8192 + i * 64), 64))
            .collect();
        let result = ctx.post(list).await.unwrap();
        for (i, id) in reads.into_iter().enumerate() {
            assert_eq!(result.bytes(id), &[i as u8 + 1; 64][..]);
        }
        assert!(matches!(
            result.outcome(dmem_verbs::WrId(0)),
            WrOutcome::Written
        ));
    });
}

#[test]
#[ignore = "needs an RDMA device: run inside ci/rxe-vm.sh"]
fn concurrent_faa_from_two_contexts_loses_no_increment() {
    let mn = mn();
    let (a, base) = cn(&mn, 1);
    let (b, _) = cn(&mn, 2);
    block_on(async {
        let word = at(base, 256);
        for _ in 0..200 {
            let (x, y) = futures_join(a.faa(word, 1), b.faa(word, 1)).await;
            x.unwrap();
            y.unwrap();
        }
    });
    assert_eq!(
        u64::from_ne_bytes(mn.region.snapshot(256, 8).try_into().unwrap()),
        400
    );
}

#[test]
#[ignore = "needs an RDMA device: run inside ci/rxe-vm.sh"]
fn out_of_bounds_is_refused_before_posting() {
    let mn = mn();
    let (ctx, base) = cn(&mn, 1);
    block_on(async {
        let err = ctx.read(at(base, REGION as u64), 8).await.unwrap_err();
        assert!(matches!(err, VerbsError::RemoteAccess { .. }), "{err:?}");
        // The context still works: the check happened before anything reached the NIC.
        ctx.write(at(base, 0), &[1; 8]).await.unwrap();
        assert_eq!(ctx.read(at(base, 0), 8).await.unwrap(), vec![1; 8]);
    });
}

#[test]
#[ignore = "needs an RDMA device: run inside ci/rxe-vm.sh"]
fn revoked_cn_loses_access() {
    let mn = mn();
    let (ctx, base) = cn(&mn, 1);
    let (other, _) = cn(&mn, 2);
    block_on(ctx.write(at(base, 0), &[1; 8])).unwrap();
    assert_eq!(mn.server.revoke(NodeId(1)).unwrap(), 1);
    assert_eq!(mn.server.revoke(NodeId(9)).unwrap(), 0);
    eprintln!("revoked");
    let started = std::time::Instant::now();
    let err = block_on(ctx.write(at(base, 0), &[2; 8])).unwrap_err();
    eprintln!(
        "revoked CN's WRITE failed after {:?}: {err}",
        started.elapsed()
    );
    assert!(
        matches!(err, VerbsError::ConnectionLost { node } if node == MN),
        "{err:?}"
    );
    // Another CN keeps its access.
    assert_eq!(block_on(other.read(at(base, 0), 8)).unwrap(), vec![1; 8]);
}

/// Polls two futures until both are done (no executor crate in this test).
async fn futures_join<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    let mut a = std::pin::pin!(a);
    let mut b = std::pin::pin!(b);
    let (mut ra, mut rb) = (None, None);
    std::future::poll_fn(|cx| {
        if ra.is_none()
            && let Poll::Ready(v) = a.as_mut().poll(cx)
        {
            ra = Some(v);
        }
        if rb.is_none()
            && let Poll::Ready(v) = b.as_mut().poll(cx)
        {
            rb = Some(v);
        }
        if ra.is_some() && rb.is_some() {
            Poll::Ready((ra.take().unwrap(), rb.take().unwrap()))
        } else {
            Poll::Pending
        }
    })
    .await
}
