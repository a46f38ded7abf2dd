//! Cost of one post + poll on the shared-memory fabric: READ 64 B, WRITE 64 B, WRITE 8 B
//! (a lock release), CAS, and 16 READs posted as one list versus 16 single posts.
#![allow(missing_docs)] // criterion_group! generates undocumented public functions

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use criterion::{Criterion, criterion_group, criterion_main};
use dmem_shm::{ShmFabric, ShmMemoryNode};
use dmem_verbs::{Endpoint, NodeId, Port, PostList, RKey, Verbs};

/// Polls once: shm posts complete on their first poll.
fn poll_once<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!("shm posts complete on their first poll"),
    }
}

fn shm_verbs(c: &mut Criterion) {
    let mn = ShmMemoryNode::create(NodeId(0), RKey(1), 1 << 20).unwrap();
    eprintln!("huge pages: {:?}", mn.huge_pages());
    let fabric = ShmFabric::new();
    let mut ctx = fabric
        .context(Endpoint {
            node: NodeId(1),
            port: Port(0),
        })
        .unwrap();
    ctx.add_link(mn.link(NodeId(1)).unwrap()).unwrap();
    let region = mn.region();
    let addr = |offset: u64| region.at(offset).unwrap();

    let mut group = c.benchmark_group("shm_post_poll");
    group.bench_function("read_64B", |b| {
        b.iter(|| {
            let mut list = PostList::new();
            list.read(addr(4096), 64);
            black_box(poll_once(ctx.post(list)).unwrap())
        });
    });
    group.bench_function("write_64B", |b| {
        let data = [7u8; 64];
        b.iter(|| {
            let mut list = PostList::new();
            list.write(addr(4096 + 128), &data);
            black_box(poll_once(ctx.post(list)).unwrap())
        });
    });
    group.bench_function("write_8B", |b| {
        b.iter(|| {
            let mut list = PostList::new();
            list.write(addr(4096 + 192), &0u64.to_le_bytes());
            black_box(poll_once(ctx.post(list)).unwrap())
        });
    });
    group.bench_function("cas", |b| {
        let mut v = 0u64;
        b.iter(|| {
            let mut list = PostList::new();
            list.cas(addr(8192), v, v + 1);
            v += 1;
            black_box(poll_once(ctx.post(list)).unwrap())
        });
    });
    group.bench_function("read_64B_x16_one_list", |b| {
        b.iter(|| {
            let mut list = PostList::with_capacity(16);
            for i in 0..16 {
                list.read(addr(i * 64), 64);
            }
            black_box(poll_once(ctx.post(list)).unwrap())
        });
    });
    group.bench_function("read_64B_x16_single_posts", |b| {
        b.iter(|| {
            for i in 0..16 {
                let mut list = PostList::new();
                list.read(addr(i * 64), 64);
                black_box(poll_once(ctx.post(list)).unwrap());
            }
        });
    });
    group.finish();
}

criterion_group!(benches, shm_verbs);
criterion_main!(benches);
