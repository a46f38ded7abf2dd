//! DLHT Gets against the `limit` loop (random independent loads, one per random cache line,
//! as `dmem bench hashtable --table limit` runs it), timed on a loaded machine.
//!
//! `target/release/examples/get_minbench [keys] [compact|fast] [rounds]`
//!
//! One thread. Each round times every variant over 96 000 random present keys each (a
//! different chunk of the key stream each time), one after another, so the variants see
//! the same load: DLHT batch 1 and 24, `limit` batch 1 and 24, and a bare bucket read (see
//! `Bare`) at batch 1 and 24, which bounds what any Get that compares the keys of one
//! DLHT-like line could reach here. A round that lost the core to another process is
//! slower, never faster, than the machine allows, so the fastest round of each variant
//! estimates the unloaded time, and its ratio to the fastest `limit` round the unloaded
//! ratio. Medians are printed too; when the two disagree much, the machine was too busy.

mod common;

use std::hint::black_box;
use std::time::Instant;

use common::{filled, key_of, run_get_b1, run_get_b24};
use dmem_hashtable::{Dlht, Sizing, WordArray, mix64};

const CHUNK: usize = 96_000;
/// Keys in the stream (128 MiB): chunks come back only every 40 rounds, so a variant never
/// finds the lines of a chunk that an earlier variant left in the cache.
const STREAM: usize = 1 << 24;

#[inline(always)]
fn line_of(key: u64, lines: usize) -> usize {
    ((u128::from(mix64(key)) * lines as u128) >> 64) as usize
}

#[inline(never)]
fn limit_b1(words: &[u64], keys: &[u64]) -> u64 {
    let lines = words.len() / 8;
    let mut sink = 0u64;
    for &k in keys {
        sink = sink.wrapping_add(words[line_of(k, lines) * 8]);
    }
    sink
}

#[inline(never)]
fn limit_b24(words: &[u64], keys: &[u64]) -> u64 {
    let lines = words.len() / 8;
    let mut sink = 0u64;
    let mut idx = [0usize; 24];
    for ks in keys.chunks_exact(24) {
        for (slot, &k) in idx.iter_mut().zip(ks) {
            *slot = line_of(k, lines) * 8;
            prefetch(&words[*slot]);
        }
        for &w in &idx {
            sink = sink.wrapping_add(words[w]);
        }
    }
    sink
}

/// How much of DLHT's Get protocol a bare bucket read does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Bare {
    /// Hash, line, compare the three keys without branches, load the matching value.
    Plain,
    /// And load the header before and compare it after (the seqlock re-check).
    Seqlock,
    /// And mask the key matches with the header's valid bits (bits 35..38, as DLHT's).
    SeqlockValid,
}

/// A bare bucket lookup over an array laid out like DLHT's primary lines (word 0 a header,
/// words 2, 4, 6 keys, words 3, 5, 7 values), doing `B` of DLHT's Get protocol. No index
/// indirection and no chained lines: not a table (keys that found no slot are simply
/// absent), the cost of the bucket read alone, for comparison with `limit` and DLHT.
#[inline(always)]
fn bucket_get<const B: u8>(words: &[u64], line: usize, k: u64) -> u64 {
    let seqlock = B != Bare::Plain as u8;
    let w: &[u64; 8] = words[line * 8..line * 8 + 8].try_into().unwrap();
    let h1 = if seqlock {
        // SAFETY: `w[0]` is a valid, aligned `u64`; volatile keeps the two header loads.
        unsafe { std::ptr::read_volatile(&w[0]) }
    } else {
        0
    };
    let mut m = u64::from(w[2] == k) | u64::from(w[4] == k) << 1 | u64::from(w[6] == k) << 2;
    if B == Bare::SeqlockValid as u8 {
        m &= h1 >> 35;
    }
    let v = if m != 0 {
        w[3 + 2 * (m.trailing_zeros() as usize & 3)]
    } else {
        0
    };
    // SAFETY: as above.
    if seqlock && h1 != unsafe { std::ptr::read_volatile(&w[0]) } {
        return u64::MAX;
    }
    v
}

#[inline(never)]
fn bucket_b1<const B: u8>(words: &[u64], keys: &[u64]) -> u64 {
    let lines = words.len() / 8;
    let mut sink = 0u64;
    for &k in keys {
        sink = sink.wrapping_add(bucket_get::<B>(words, line_of(k, lines), k));
    }
    sink
}

#[inline(never)]
fn bucket_b24<const B: u8>(words: &[u64], keys: &[u64]) -> u64 {
    let lines = words.len() / 8;
    let mut sink = 0u64;
    let mut idx = [0usize; 24];
    let mut out = [0u64; 24];
    for ks in keys.chunks_exact(24) {
        for (slot, &k) in idx.iter_mut().zip(ks) {
            *slot = line_of(k, lines);
            prefetch(&words[*slot * 8]);
        }
        for i in 0..24 {
            out[i] = bucket_get::<B>(words, idx[i], ks[i]);
        }
        sink = sink.wrapping_add(black_box(&out)[23]);
    }
    sink
}

#[inline(always)]
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

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000_000);
    let sizing = match args.next().as_deref() {
        Some("fast") => Sizing::Fast,
        _ => Sizing::Compact,
    };
    let rounds: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(40);
    let t = filled(n, sizing);
    // As the CLI's `limit`: an array as large as the default (compact) sizing's bins.
    let compact_bins = Dlht::with_capacity(n as usize).memory_usage().bins;
    let mut words = WordArray::new(compact_bins * 8, true);
    for (i, w) in words.as_mut_slice().iter_mut().enumerate() {
        *w = i as u64;
    }
    let words = words.as_slice();
    // The bare buckets: every key in the first free key word of its line (0 = free), its
    // valid bit set in the header word.
    let mut buckets = WordArray::new(compact_bins * 8, true);
    {
        let b = buckets.as_mut_slice();
        let lines = b.len() / 8;
        for i in 0..n {
            let k = key_of(i);
            let l = line_of(k, lines) * 8;
            if let Some(s) = [2, 4, 6].into_iter().find(|&s| b[l + s] == 0) {
                b[l + s] = k;
                b[l + s + 1] = i;
                b[l] |= 1 << (35 + (s - 2) / 2);
            }
        }
    }
    let buckets = buckets.as_slice();
    let stream: Vec<u64> = (0..STREAM as u64).map(|i| key_of(mix64(i) % n)).collect();
    let g = t.pin();
    let names = [
        "dlht b1",
        "dlht b24",
        "limit b1",
        "limit b24",
        "bucket b1",
        "bucket b24",
        "bucket+seqlock b1",
        "bucket+seqlock b24",
        "bucket+seqlock+valid b1",
        "bucket+seqlock+valid b24",
    ];
    let mut ns = vec![Vec::with_capacity(rounds); names.len()];
    let chunks = STREAM / CHUNK;
    for r in 0..rounds {
        for (v, times) in ns.iter_mut().enumerate() {
            let start = (r * names.len() + v) % chunks * CHUNK;
            let keys = &stream[start..start + CHUNK];
            let t0 = Instant::now();
            black_box(match v {
                0 => run_get_b1(&g, keys),
                1 => run_get_b24(&g, keys),
                2 => limit_b1(words, keys),
                3 => limit_b24(words, keys),
                4 => bucket_b1::<{ Bare::Plain as u8 }>(buckets, keys),
                5 => bucket_b24::<{ Bare::Plain as u8 }>(buckets, keys),
                6 => bucket_b1::<{ Bare::Seqlock as u8 }>(buckets, keys),
                7 => bucket_b24::<{ Bare::Seqlock as u8 }>(buckets, keys),
                8 => bucket_b1::<{ Bare::SeqlockValid as u8 }>(buckets, keys),
                _ => bucket_b24::<{ Bare::SeqlockValid as u8 }>(buckets, keys),
            });
            times.push(t0.elapsed().as_secs_f64() * 1e9 / CHUNK as f64);
        }
    }
    let stat = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[0], v[v.len() / 2])
    };
    let s: Vec<(f64, f64)> = ns.iter_mut().map(stat).collect();
    println!("{n} keys, {sizing:?}, {rounds} rounds of {CHUNK} Gets; ns per Get: fastest, median");
    for (name, (min, med)) in names.iter().zip(&s) {
        println!("{name:>24}: {min:6.2} {med:6.2}");
    }
    for (name, v) in [
        ("bucket", 4),
        ("bucket+seqlock", 6),
        ("bucket+seqlock+valid", 8),
    ] {
        println!(
            "{name} / limit (fastest rounds): batch 1 {:.0} %, batch 24 {:.0} %",
            100.0 * s[2].0 / s[v].0,
            100.0 * s[3].0 / s[v + 1].0,
        );
    }
    println!(
        "dlht / limit (fastest rounds): batch 1 {:.0} %, batch 24 {:.0} %; (medians) {:.0} %, {:.0} %",
        100.0 * s[2].0 / s[0].0,
        100.0 * s[3].0 / s[1].0,
        100.0 * s[2].1 / s[0].1,
        100.0 * s[3].1 / s[1].1,
    );
}
