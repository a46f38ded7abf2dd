//! Criterion benches: CQL outcome decode, CVT version pick, cacheline-version check.
#![allow(missing_docs)] // criterion_group! generates undocumented public functions
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use dmem_layout::cacheline;
use dmem_layout::cql::{
    ClientId, CqlEntry, CqlHeader, CqlLock, CqlTimestamp, EVAL_CAPACITY, LockMode,
};
use dmem_layout::cvt::{Cvt, CvtCell, CvtHeader};
use dmem_layout::lock_slot::{LockBucket, LockFingerprint};
use dmem_layout::pill::{CoordinatorId, FailedCoordinatorSet, PillLockWord};
use zerocopy::IntoBytes;

type H = CqlHeader<EVAL_CAPACITY>;

/// TPC-C record payload size (LOTUS/Motor).
const TPCC_RECORD: usize = 672;

fn cql(c: &mut Criterion) {
    // Headers as an FAA would return them: a mix of empty, shared and contended queues.
    let headers: Vec<H> = [(0, 0, 0), (3, 2, 0), (17, 5, 2), (40, 7, 7), (1000, 1, 1)]
        .iter()
        .map(|&(qhead, qsize, wcnt)| H::from_fields(qhead, qsize, wcnt, 0).unwrap())
        .collect();
    c.bench_function("cql/decode_acquire", |b| {
        b.iter(|| {
            for h in &headers {
                black_box(black_box(*h).decode_acquire(LockMode::Exclusive).ok());
            }
        })
    });

    // A writer releasing a queue of three readers then a writer: decode + plan over the
    // fetched lock (the whole release decision).
    let mut lock = CqlLock::<EVAL_CAPACITY>::INITIAL;
    let old = H::from_fields(8, 5, 2, 0).unwrap();
    for (k, mode) in [
        LockMode::Shared,
        LockMode::Shared,
        LockMode::Shared,
        LockMode::Exclusive,
    ]
    .into_iter()
    .enumerate()
    {
        let position = old.head_position().advance(k as u64 + 1);
        lock.queue_mut()[position.slot()] = CqlEntry::new(
            mode,
            ClientId::new(k as u32).unwrap(),
            position.version(),
            CqlTimestamp(0),
        );
    }
    *lock.header_mut() = old.after_faa(H::dequeue_exclusive_delta());
    c.bench_function("cql/decode_release_and_plan", |b| {
        b.iter(|| {
            let released = black_box(old).decode_release(LockMode::Exclusive).unwrap();
            black_box(released.successors.map(|s| s.plan(black_box(&lock))))
        })
    });
}

fn cvt(c: &mut Criterion) {
    let mut cvt4 = Cvt::<4>::new(CvtHeader::new(42, 1, TPCC_RECORD as u32));
    for (i, version) in [40u64, 10, 30, 20].into_iter().enumerate() {
        cvt4.cells_mut()[i] = CvtCell::new(1, 0x1000 * (i as u64 + 1), version);
    }
    c.bench_function("cvt/pick_version_at_4_cells", |b| {
        b.iter(|| black_box(black_box(&cvt4).pick_version_at(black_box(25))))
    });
    let bytes = cvt4.as_bytes().to_vec();
    c.bench_function("cvt/parse_check_pick_4_cells", |b| {
        b.iter(|| {
            let table = Cvt::<4>::parse(black_box(&bytes)).unwrap();
            black_box(table.is_consistent() && table.pick_version_at(25).visible.is_some())
        })
    });
    c.bench_function("cvt/cell_for_writer_4_cells", |b| {
        b.iter(|| black_box(black_box(&cvt4).cell_for_writer()))
    });
}

fn cacheline_versions(c: &mut Criterion) {
    let payload: Vec<u8> = (0..TPCC_RECORD).map(|i| i as u8).collect();
    let mut image = vec![0u8; cacheline::image_len(TPCC_RECORD)];
    cacheline::stamp(&payload, 7, &mut image).unwrap();
    c.bench_function("cacheline/check_versions_tpcc_672B", |b| {
        b.iter(|| black_box(cacheline::check_versions(black_box(&image))))
    });
    let mut out = vec![0u8; TPCC_RECORD];
    c.bench_function("cacheline/extract_consistent_tpcc_672B", |b| {
        b.iter(|| black_box(cacheline::extract_consistent(black_box(&image), &mut out)))
    });
    c.bench_function("cacheline/stamp_tpcc_672B", |b| {
        b.iter(|| black_box(cacheline::stamp(black_box(&payload), 8, &mut image)))
    });
}

fn cn_locks(c: &mut Criterion) {
    let mut bucket = LockBucket::EMPTY;
    for k in 1..=6u64 {
        let cas = bucket
            .plan_lock(LockFingerprint::new(k).unwrap(), LockMode::Shared)
            .unwrap();
        bucket.apply(cas);
    }
    let fp = LockFingerprint::new(5).unwrap();
    c.bench_function("lock_slot/plan_lock_shared_in_bucket", |b| {
        b.iter(|| black_box(black_box(&bucket).plan_lock(black_box(fp), LockMode::Shared)))
    });
    let mut failed = Box::new(FailedCoordinatorSet::EMPTY);
    failed.insert(CoordinatorId(3));
    let word = PillLockWord::locked_by(CoordinatorId(3));
    c.bench_function("pill/steal_check", |b| {
        b.iter(|| black_box(black_box(word).steal_cas(CoordinatorId(9), &failed)))
    });
}

criterion_group!(group, cql, cvt, cacheline_versions, cn_locks);
criterion_main!(group);
