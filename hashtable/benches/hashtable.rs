//! Criterion micro-benchmarks: random-key Gets on a memory-resident table (1M and 10M keys,
//! 8-byte keys and values), DLHT unbatched and batched vs hashbrown, next to the machine's
//! limit (random independent loads, prefetched in batches, over an array as large as the
//! DLHT bins). The full matrix (threads, Puts, mixes, dashmap/papaya/std) is
//! `dmem bench hashtable`.

// criterion's macros generate undocumented functions.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use dmem_hashtable::{Dlht, Options, WordArray, mix64};

/// Keys per measured iteration.
const SLICE: usize = 1 << 16;
/// Keys in the whole stream: iterations walk through it slice by slice, so the buckets
/// touched (4M random ones) are far larger than the last-level cache and the workload stays
/// memory-resident.
const STREAM: usize = 1 << 22;

/// The next slice of the stream (cycling).
fn next_slice<'a>(keys: &'a [u64], pos: &mut usize) -> &'a [u64] {
    let s = &keys[*pos..*pos + SLICE];
    *pos = (*pos + SLICE) % STREAM;
    s
}

fn key_of(i: u64) -> u64 {
    mix64(i ^ 0x5eed)
}

fn stream(n: usize) -> Vec<u64> {
    let mut s = 1u64;
    (0..STREAM)
        .map(|_| {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            key_of(((u128::from(mix64(s)) * n as u128) >> 64) as u64)
        })
        .collect()
}

fn prefetch(p: &u64) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is in the x86-64 baseline; a prefetch is a hint and never faults.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (p as *const u64).cast::<i8>(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

fn gets(c: &mut Criterion) {
    for n in [1_000_000usize, 10_000_000] {
        let keys = stream(n);
        let mut group = c.benchmark_group(format!("get_{}M", n / 1_000_000));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));

        let t = Dlht::with_options(Options {
            capacity: n,
            huge_pages: true,
            ..Options::default()
        });
        for i in 0..n as u64 {
            t.insert(key_of(i), i);
        }
        for batch in [1usize, 8, 24] {
            group.throughput(Throughput::Elements(SLICE as u64));
            group.bench_with_input(BenchmarkId::new("dlht", batch), &batch, |b, &batch| {
                let g = t.pin();
                let mut out = vec![None; batch];
                let mut pos = 0;
                b.iter(|| {
                    let keys = next_slice(&keys, &mut pos);
                    let mut sum = 0u64;
                    if batch == 1 {
                        for &k in keys {
                            sum = sum.wrapping_add(g.get(k).unwrap_or(0));
                        }
                    } else {
                        for ks in keys.chunks_exact(batch) {
                            g.get_batch(ks, &mut out);
                            sum = sum.wrapping_add(out[0].unwrap_or(0));
                        }
                    }
                    black_box(sum)
                })
            });
        }
        let bins = t.memory_usage().bins;
        drop(t);

        let mut m = hashbrown::HashMap::with_capacity(n);
        for i in 0..n as u64 {
            m.insert(key_of(i), i);
        }
        group.bench_function(BenchmarkId::new("hashbrown", 1), |b| {
            let mut pos = 0;
            b.iter(|| {
                let mut sum = 0u64;
                for k in next_slice(&keys, &mut pos) {
                    sum = sum.wrapping_add(*m.get(k).unwrap_or(&0));
                }
                black_box(sum)
            })
        });
        drop(m);

        let mut arr = WordArray::new(bins * 8, true);
        for (i, w) in arr.as_mut_slice().iter_mut().enumerate() {
            *w = i as u64;
        }
        let words = arr.as_slice();
        for batch in [1usize, 24] {
            group.bench_with_input(BenchmarkId::new("limit", batch), &batch, |b, &batch| {
                let mut idx = [0usize; 24];
                let mut pos = 0;
                b.iter(|| {
                    let mut sum = 0u64;
                    for ks in next_slice(&keys, &mut pos).chunks_exact(batch) {
                        for (k, slot) in ks.iter().zip(idx.iter_mut()) {
                            let line = ((u128::from(mix64(*k)) * bins as u128) >> 64) as usize;
                            *slot = line * 8;
                            if batch > 1 {
                                prefetch(&words[line * 8]);
                            }
                        }
                        for &w in &idx[..batch] {
                            sum = sum.wrapping_add(words[w]);
                        }
                    }
                    black_box(sum)
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, gets);
criterion_main!(benches);
