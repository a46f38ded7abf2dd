//! One-sided operations as atomics on a [`Mapping`].
//!
//! All four take a byte offset inside the region and assume the caller checked bounds and
//! access rights. Every access is an aligned 8-byte atomic (see [`Mapping`]'s invariants):
//!
//! - **WRITE** stores words in *increasing* address order with `Release`. A byte range that
//!   covers only part of a word (the unaligned edges) is merged into that word with a
//!   compare-exchange loop, so bytes outside the range are never overwritten with stale
//!   values and no narrower atomic ever races with the 8-byte ones.
//! - **READ** loads words in *decreasing* address order with `Acquire`. If the READ sees a
//!   WRITE's new value in some word, the `Release`/`Acquire` pair makes every earlier word of
//!   that WRITE visible to the loads that follow, and those are exactly the lower addresses.
//!   So a READ racing a WRITE sees "prefix new, suffix old" at 8-byte granularity (hence at
//!   cache-line granularity), never a later word new while an earlier one is old: the
//!   property OOCC's one-op write-unlock (lock word at the highest address) and LOTUS's
//!   cacheline versions rely on.
//! - **CAS** and **FAA** are `SeqCst` read-modify-writes. `AcqRel` would suffice for a lock
//!   handed over through one word, but protocols also reason across words (Pandora checks
//!   the failed-id bitset after CASing a PILL lock word; DecLock FAAs the queue header and
//!   then reads queue entries). `SeqCst` puts every atomic into one total order, like a
//!   responder that serialises its atomics, and costs nothing extra on x86, where every
//!   locked instruction is already a full barrier.

use std::sync::atomic::Ordering;

use crate::mapping::Mapping;

/// The word-aligned span of `[start, start + len)`, `len > 0`: first and last word offsets.
fn span(start: usize, len: usize) -> (usize, usize) {
    (start & !7, (start + len - 1) & !7)
}

/// The part of word `w` inside `[start, end)`: (`lo`, `hi`) absolute offsets.
fn overlap(w: usize, start: usize, end: usize) -> (usize, usize) {
    (w.max(start), (w + 8).min(end))
}

/// READs `len` bytes at region offset `offset`, highest word first.
pub(crate) fn read(m: &Mapping, offset: u64, len: u32) -> Vec<u8> {
    let len = len as usize;
    let mut out = vec![0u8; len];
    if len == 0 {
        return out;
    }
    let start = m.data_offset() + offset as usize;
    let end = start + len;
    let (first, last) = span(start, len);
    let mut w = last;
    loop {
        let bytes = m.word(w).load(Ordering::Acquire).to_ne_bytes();
        let (lo, hi) = overlap(w, start, end);
        out[lo - start..hi - start].copy_from_slice(&bytes[lo - w..hi - w]);
        if w == first {
            break;
        }
        w -= 8;
    }
    out
}

/// WRITEs `data` at region offset `offset`, lowest word first.
pub(crate) fn write(m: &Mapping, offset: u64, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    let start = m.data_offset() + offset as usize;
    let end = start + data.len();
    let (first, last) = span(start, data.len());
    let mut w = first;
    loop {
        let (lo, hi) = overlap(w, start, end);
        let part = &data[lo - start..hi - start];
        let word = m.word(w);
        if hi - lo == 8 {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(part);
            word.store(u64::from_ne_bytes(bytes), Ordering::Release);
        } else {
            let mut current = word.load(Ordering::Relaxed);
            loop {
                let mut bytes = current.to_ne_bytes();
                bytes[lo - w..hi - w].copy_from_slice(part);
                match word.compare_exchange_weak(
                    current,
                    u64::from_ne_bytes(bytes),
                    Ordering::Release,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break,
                    Err(seen) => current = seen,
                }
            }
        }
        if w == last {
            break;
        }
        w += 8;
    }
}

/// Compare-and-swap of the aligned word at region offset `offset`; returns the old value.
pub(crate) fn cas(m: &Mapping, offset: u64, expect: u64, swap: u64) -> u64 {
    let word = m.word(m.data_offset() + offset as usize);
    match word.compare_exchange(expect, swap, Ordering::SeqCst, Ordering::SeqCst) {
        Ok(old) | Err(old) => old,
    }
}

/// Fetch-and-add (wrapping) on the aligned word at region offset `offset`; returns the old
/// value.
pub(crate) fn faa(m: &Mapping, offset: u64, add: u64) -> u64 {
    m.word(m.data_offset() + offset as usize)
        .fetch_add(add, Ordering::SeqCst)
}
