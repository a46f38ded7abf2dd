//! Criterion benches: RPC frame building and iteration.
//!
//! Dandelion §5.3 batches up to 100 small messages per packet; the benches build a frame of
//! N messages with 16-byte payloads (a Get response with a 16-byte value) into a reused
//! buffer, and check + iterate such a frame (the receive path: `RpcFrame::new_checked`
//! walks every message header once, `messages()` walks them again).
#![allow(missing_docs)] // criterion_group! generates undocumented public functions
use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use dmem_layout::rpc::{RpcFrame, RpcFrameBuilder, RpcPacketInfo};

const INFO: RpcPacketInfo = RpcPacketInfo {
    src_node: 1,
    flow: 0,
    response: true,
    epoch: 7,
};
const PAYLOAD: [u8; 16] = [0x5A; 16];
const SIZES: [u16; 4] = [1, 8, 32, 100];

fn build(buf: &mut [u8], n: u16) -> usize {
    let mut b = RpcFrameBuilder::new(buf, INFO).expect("buffer holds a header");
    for slot in 0..n {
        b.push(2, u32::from(slot), black_box(&PAYLOAD))
            .expect("4 KiB holds 100 messages");
    }
    b.finish().len()
}

fn benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("rpc_frame/build");
    for n in SIZES {
        group.throughput(Throughput::Elements(n.into()));
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |bench, &n| {
            let mut buf = vec![0u8; 4096];
            bench.iter(|| build(black_box(&mut buf), n));
        });
    }
    group.finish();

    let mut group = c.benchmark_group("rpc_frame/check_and_iterate");
    for n in SIZES {
        let mut buf = vec![0u8; 4096];
        let len = build(&mut buf, n);
        let frame_bytes = buf[..len].to_vec();
        group.throughput(Throughput::Elements(n.into()));
        group.bench_with_input(
            BenchmarkId::from_parameter(n),
            &frame_bytes,
            |bench, bytes| {
                bench.iter(|| {
                    let frame = RpcFrame::new_checked(black_box(&bytes[..])).expect("valid frame");
                    let mut sum = 0u64;
                    for m in frame.messages() {
                        sum += u64::from(m.req_slot()) + u64::from(m.payload()[0]);
                    }
                    sum
                });
            },
        );
    }
    group.finish();
}

criterion_group!(group, benches);
criterion_main!(group);
