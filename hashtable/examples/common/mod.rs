//! What the Get examples share: the key stream and the measured Get loops (named `run_*`,
//! which `get_profile`'s callgrind toggle selects).

use dmem_hashtable::{Dlht, Guard, Options, Sizing, mix64};

/// The `i`-th key the examples insert (random, as in `dmem bench hashtable`).
pub(crate) fn key_of(i: u64) -> u64 {
    mix64(i ^ 0x5eed_5eed_5eed_5eed)
}

/// A table of `sizing` holding keys `key_of(0..n)`, key `key_of(i)` with value `i`.
pub(crate) fn filled(n: u64, sizing: Sizing) -> Dlht {
    let t = Dlht::with_options(Options {
        capacity: n as usize,
        sizing,
        ..Options::default()
    });
    for i in 0..n {
        t.insert(key_of(i), i);
    }
    t
}

/// Unbatched Gets of `keys`; the sum of the values found (so the loop is not optimised out).
#[inline(never)]
pub(crate) fn run_get_b1(g: &Guard<'_>, keys: &[u64]) -> u64 {
    let mut sink = 0u64;
    for &k in keys {
        sink = sink.wrapping_add(g.get(k).unwrap_or(0));
    }
    sink
}

/// Gets of `keys` in batches of 24 (a remainder shorter than a batch is skipped).
#[inline(never)]
pub(crate) fn run_get_b24(g: &Guard<'_>, keys: &[u64]) -> u64 {
    let mut sink = 0u64;
    let mut out = [None; 24];
    for ks in keys.chunks_exact(24) {
        g.get_batch(ks, &mut out);
        sink = sink.wrapping_add(out[23].unwrap_or(0));
    }
    sink
}
