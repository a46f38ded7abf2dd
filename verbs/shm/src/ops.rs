//! One-sided operations as atomics on a [`Mapping`].
//!
//! All four take a byte offset inside the region and assume the caller checked bounds and
//! access rights. Every access is an aligned 8-byte atomic (see [`Mapping`]'s invariants).
//!
//! - **WRITE** lands one 64-byte line at a time, in increasing address order, and **a line
//!   lands whole**: for each line it touches, it takes the line's write stripe (a seqlock
//!   word, `seq << 16 | owner`, shared by the lines 256 KiB apart) with a CAS from free to
//!   its link's owner id, stores the line's words in increasing address order with
//!   `Release`, and releases the stripe with a CAS to `seq + 1` and free. A byte range that
//!   covers only part of a word (the unaligned edges) is merged into that word with a
//!   compare-exchange loop, so bytes outside the range are never overwritten with stale
//!   values and no narrower atomic ever races with the 8-byte ones.
//! - **READ** is a snapshot with respect to WRITEs: it loads the stripe words of all its
//!   lines (`Acquire`), then its data words (highest first, `Acquire`), then, after an
//!   `Acquire` fence, the stripe words again; it returns if every stripe was free and
//!   unchanged, and tries again otherwise. So the bytes it returns were all in memory at one
//!   instant between its two stripe loads, as with the simulator's READ (which snapshots
//!   memory at one instant). A READ that saw one word of a WRITE that took its stripe after
//!   the first stripe load sees that CAS in its second load: the WRITE's store is `Release`
//!   and sequenced after the CAS. After [`OPTIMISTIC_ATTEMPTS`] changed snapshots (writers
//!   keep landing in its lines) a READ takes all its stripes like a WRITE, in increasing
//!   stripe order, loads, and hands them back unchanged, so it cannot starve. A READ racing
//!   a multi-line WRITE sees a prefix of its lines.
//! - **CAS** and **FAA** are `SeqCst` read-modify-writes of one word and take no stripe: a
//!   READ's snapshot holds their words as of some instant during the READ. `AcqRel` would
//!   suffice for a lock handed over through one word, but protocols also reason across words
//!   (Pandora checks the failed-id bitset after CASing a PILL lock word; DecLock FAAs the
//!   queue header and then reads queue entries). `SeqCst` puts every atomic into one total
//!   order, like a responder that serialises its atomics, and costs nothing extra on x86,
//!   where every locked instruction is already a full barrier.
//!
//! **Stripes held by a stalled or dead holder.** A WRITE holds a stripe for a few stores, but
//! the CN thread executing it can lose the CPU or die there. An op that meets a held stripe
//! spins, then yields. A stripe held by a link the MN revoked is taken back at once (its
//! owner is dead or cut off, and revocation's contract is that none of its posts land).
//! After [`STALL_LIMIT`] it checks whether the holder's process (its id is recorded in the
//! link slot) still exists, and takes the stripe back if not: a CN killed in mid-line cannot
//! stop the others. A live holder is waited for up to one second; past that the op goes
//! ahead without that stripe's guarantee and counts it in [`stalls`].

use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

use dmem_verbs::ReadBytes;

use crate::mapping::{LINE, Mapping, STRIPES};

/// The word-aligned span of `[start, start + len)`, `len > 0`: first and last word offsets.
fn span(start: usize, len: usize) -> (usize, usize) {
    (start & !7, (start + len - 1) & !7)
}

/// The part of word `w` inside `[start, end)`: (`lo`, `hi`) absolute offsets.
fn overlap(w: usize, start: usize, end: usize) -> (usize, usize) {
    (w.max(start), (w + 8).min(end))
}

/// Waiting this long on a held stripe makes an op check whether its holder's process is alive.
pub const STALL_LIMIT: Duration = Duration::from_millis(20);

/// Ops that went ahead without a stripe (this process, since it started).
static STALLS: AtomicU64 = AtomicU64::new(0);

/// How many READs and WRITEs of this process met a stripe held by a live holder for a
/// second and went ahead without its guarantee (snapshot, or a line landing whole).
pub fn stalls() -> u64 {
    STALLS.load(Ordering::Relaxed)
}

const OWNER_BITS: u32 = 16;
const OWNER_MASK: u64 = (1 << OWNER_BITS) - 1;

/// The stripe owner id of link slot `slot`: never 0 (0 is a free stripe).
pub(crate) fn owner_of(slot: u32) -> u64 {
    u64::from(slot) + 1
}

/// A stripe word with nobody holding it, one generation after `word`.
fn next_free(word: u64) -> u64 {
    ((word >> OWNER_BITS).wrapping_add(1)) << OWNER_BITS
}

/// After this long on one holder that is still alive, an op gives up the stripe's guarantee.
const HARD_STALL_LIMIT: Duration = Duration::from_secs(1);

/// Paces a wait on a held stripe: spins first, then yields. After [`STALL_LIMIT`] it asks
/// whether the holder's process still exists and takes the stripe back if not; after
/// [`HARD_STALL_LIMIT`] on a live holder it gives up.
struct Backoff {
    spins: u32,
    since: Option<Instant>,
}

impl Backoff {
    fn new() -> Self {
        Self {
            spins: 0,
            since: None,
        }
    }

    /// One wait on `stripe`, seen held as `word`: `true` to look again, `false` to go ahead
    /// without the stripe (counted in [`stalls`]).
    fn wait(&mut self, m: &Mapping, stripe: &AtomicU64, word: u64) -> bool {
        self.spins += 1;
        if self.spins < 64 {
            std::hint::spin_loop();
            return true;
        }
        std::thread::yield_now();
        let waited = self.since.get_or_insert_with(Instant::now).elapsed();
        if waited < STALL_LIMIT {
            return true;
        }
        if !holder_alive(m, word) {
            let _ =
                stripe.compare_exchange(word, next_free(word), Ordering::AcqRel, Ordering::Relaxed);
            self.since = None;
            return true;
        }
        if waited < HARD_STALL_LIMIT {
            return true;
        }
        STALLS.fetch_add(1, Ordering::Relaxed);
        false
    }
}

/// The link slot of a held stripe word, if its owner id names one.
fn holder_slot(word: u64) -> Option<u32> {
    u32::try_from((word & OWNER_MASK).checked_sub(1)?)
        .ok()
        .filter(|&slot| slot < crate::MAX_LINKS)
}

/// Whether the process that holds `word`'s stripe may still run: its recorded process id
/// exists (`kill(pid, 0)` does not answer "no such process"). Unknown holders count as alive.
fn holder_alive(m: &Mapping, word: u64) -> bool {
    let Some(slot) = holder_slot(word) else {
        return true;
    };
    let pid = m.slot_pid(slot).load(Ordering::Acquire);
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return true;
    };
    !matches!(
        rustix::process::test_kill_process(pid),
        Err(rustix::io::Errno::SRCH)
    )
}

/// Takes back `stripe`, seen as `word` (held), if its owner's link was revoked. Returns
/// whether it was (the caller looks again either way).
fn reclaim_if_revoked(m: &Mapping, stripe: &AtomicU64, word: u64) -> bool {
    let revoked =
        holder_slot(word).is_some_and(|slot| m.slot_revoked(slot).load(Ordering::SeqCst) != 0);
    if revoked {
        let _ = stripe.compare_exchange(word, next_free(word), Ordering::AcqRel, Ordering::Relaxed);
    }
    revoked
}

/// The first data line of `[start, start + len)` and the number of lines, `len > 0`.
fn lines(start: usize, len: usize) -> (usize, usize) {
    let first = start & !(LINE - 1);
    let last = (start + len - 1) & !(LINE - 1);
    (first, (last - first) / LINE + 1)
}

/// Optimistic attempts of a READ before it takes its stripes like a WRITE.
const OPTIMISTIC_ATTEMPTS: u32 = 8;

/// READs `len` bytes at region offset `offset` for the link whose owner id is `owner`: a
/// snapshot with respect to WRITEs.
pub(crate) fn read(m: &Mapping, offset: u64, len: u32, owner: u64) -> ReadBytes {
    let len = len as usize;
    // Inline up to a cache line: a small READ allocates nothing.
    let mut out = ReadBytes::zeroed(len);
    if len == 0 {
        return out;
    }
    let start = m.data_offset() + offset as usize;
    let (first_line, count) = lines(start, len);
    let stripe = |i: usize| m.stripe(first_line + i * LINE);
    // The stripe words seen first: on the stack for READs of up to 16 lines (1 KiB).
    let mut inline = [0u64; 16];
    let mut heap = Vec::new();
    let before: &mut [u64] = if count <= inline.len() {
        &mut inline[..count]
    } else {
        heap.resize(count, 0);
        &mut heap
    };
    for _ in 0..OPTIMISTIC_ATTEMPTS {
        let mut held = false;
        for (i, seen) in before.iter_mut().enumerate() {
            *seen = stripe(i).load(Ordering::Acquire);
            if *seen & OWNER_MASK != 0 {
                held = true;
                let _ = reclaim_if_revoked(m, stripe(i), *seen);
                break;
            }
        }
        if !held {
            load_words(m, start, &mut out);
            fence(Ordering::Acquire);
            if before
                .iter()
                .enumerate()
                .all(|(i, &seen)| stripe(i).load(Ordering::Relaxed) == seen)
            {
                return out;
            }
        }
        std::hint::spin_loop();
    }
    // Writers kept changing the lines: hold every stripe of the READ, in increasing stripe
    // order (a WRITE holds one stripe at a time and never waits while holding one, so this
    // cannot deadlock), load, and hand the stripes back unchanged (no data changed).
    let mut stripes: Vec<usize> = (0..count)
        .map(|i| ((first_line + i * LINE - m.data_offset()) / LINE) % STRIPES)
        .collect();
    stripes.sort_unstable();
    stripes.dedup();
    let held: Vec<(usize, Option<u64>)> = stripes
        .into_iter()
        .map(|s| (s, take_stripe(m, m.stripe_word(s), owner)))
        .collect();
    load_words(m, start, &mut out);
    for (s, word) in held {
        if let Some(word) = word {
            let _ = m.stripe_word(s).compare_exchange(
                word,
                word & !OWNER_MASK,
                Ordering::Release,
                Ordering::Relaxed,
            );
        }
    }
    out
}

/// Loads the words of `[start, start + out.len())` into `out`, highest word first.
fn load_words(m: &Mapping, start: usize, out: &mut [u8]) {
    let end = start + out.len();
    let (first, last) = span(start, out.len());
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
}

/// WRITEs `data` at region offset `offset` for the link whose owner id is `owner`
/// ([`owner_of`]): line by line, lowest first, each under its stripe.
pub(crate) fn write(m: &Mapping, offset: u64, data: &[u8], owner: u64) {
    if data.is_empty() {
        return;
    }
    let start = m.data_offset() + offset as usize;
    let end = start + data.len();
    let (first_line, count) = lines(start, data.len());
    for i in 0..count {
        let line = first_line + i * LINE;
        let (lo, hi) = (line.max(start), (line + LINE).min(end));
        let stripe = m.stripe(line);
        let held = take_stripe(m, stripe, owner);
        store_words(m, lo, &data[lo - start..hi - start]);
        if let Some(word) = held {
            // A failed CAS means the stripe was taken back from this link (revoked): leave
            // it to whoever holds it now.
            let _ = stripe.compare_exchange(
                word,
                next_free(word),
                Ordering::Release,
                Ordering::Relaxed,
            );
        }
    }
}

/// Takes `stripe` for `owner`; returns the word it holds it as, or `None` after a stall.
fn take_stripe(m: &Mapping, stripe: &AtomicU64, owner: u64) -> Option<u64> {
    let mut backoff = Backoff::new();
    loop {
        let word = stripe.load(Ordering::Relaxed);
        if word & OWNER_MASK == 0 {
            let mine = word | owner;
            // `Acquire`: the stores below stay after the CAS; the fence makes a READ that
            // sees one of them also see the CAS (it pairs with the READ's `Acquire` fence).
            if stripe
                .compare_exchange_weak(word, mine, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                fence(Ordering::Release);
                return Some(mine);
            }
            continue;
        }
        if reclaim_if_revoked(m, stripe, word) || backoff.wait(m, stripe, word) {
            continue;
        }
        return None;
    }
}

/// Stores `data` at mapping offset `start`, all inside one line, lowest word first.
fn store_words(m: &Mapping, start: usize, data: &[u8]) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A process id that no longer exists: a child that has exited and been reaped.
    fn dead_pid() -> u64 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        u64::from(pid)
    }

    /// A stripe left held by a killed process is taken back after [`STALL_LIMIT`]; one held
    /// by a revoked link at once. Both ops then complete with their guarantee (no stall).
    #[test]
    fn stripes_of_dead_or_revoked_holders_are_taken_back() {
        let m = Mapping::create("dmem-shm-ops-test", 4096).unwrap();
        let line0 = m.data_offset();
        let (dead_slot, revoked_slot, me) = (3, 4, owner_of(1));
        m.slot_pid(dead_slot).store(dead_pid(), Ordering::Relaxed);
        m.stripe(line0)
            .store((5 << OWNER_BITS) | owner_of(dead_slot), Ordering::Relaxed);
        let started = Instant::now();
        write(&m, 0, &7u64.to_le_bytes(), me);
        assert!(started.elapsed() >= STALL_LIMIT);
        assert_eq!(&read(&m, 0, 8, me)[..], 7u64.to_le_bytes());
        // Taken back (seq 6), then the WRITE's own generation (seq 7).
        assert_eq!(m.stripe(line0).load(Ordering::Relaxed), 7 << OWNER_BITS);

        m.slot_pid(revoked_slot)
            .store(u64::from(std::process::id()), Ordering::Relaxed);
        m.slot_revoked(revoked_slot).store(1, Ordering::Relaxed);
        m.stripe(line0).store(
            (9 << OWNER_BITS) | owner_of(revoked_slot),
            Ordering::Relaxed,
        );
        let started = Instant::now();
        assert_eq!(&read(&m, 0, 8, me)[..], 7u64.to_le_bytes());
        assert!(started.elapsed() < STALL_LIMIT);
        assert_eq!(m.stripe(line0).load(Ordering::Relaxed), 10 << OWNER_BITS);
        assert_eq!(stalls(), 0);
    }
}
