//! The event queue: events in `(time, scheduling order)` order, cheaply.
//!
//! Almost every event of a simulated cluster is due within a few microseconds of the current
//! instant (a wire latency, a NIC service time, a response), so the queue is a timing wheel
//! of [`WHEEL`] one-nanosecond buckets covering `[base, base + WHEEL)`, where `base` is the
//! time of the last event taken out: every event in a bucket is due at the same instant, and
//! a bucket is a FIFO, so scheduling order within an instant is kept for free. A bucket is a
//! linked list of nodes in one slab with a free list (no allocation per bucket, and the few
//! nodes in use stay close together in memory); a bitmap with a small summary finds the
//! next non-empty bucket in a few instructions. Events due later than the wheel covers (transport timeouts,
//! long timers) or before `base` go to a binary heap; taking out compares the wheel's first
//! event with the heap's by `(time, sequence number)`, so the order is exactly that of one
//! heap ordered by `(time, sequence number)`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use dmem_verbs::Nanos;

/// Buckets of the wheel (one per nanosecond of the horizon): 16 µs, longer than a READ
/// waits at a saturated MN engine in a closed loop of lists of 16 (≈10 µs), so those
/// executions stay out of the heap.
const WHEEL: usize = 1 << 14;
/// Words of the bucket bitmap.
const WORDS: usize = WHEEL / 64;
/// Words of the summary bitmap (one bit per word of the bucket bitmap).
const SUMMARY_WORDS: usize = WORDS / 64;

struct Far<T> {
    time: Nanos,
    seq: u64,
    item: T,
}

impl<T> PartialEq for Far<T> {
    fn eq(&self, other: &Self) -> bool {
        (self.time, self.seq) == (other.time, other.seq)
    }
}
impl<T> Eq for Far<T> {}
impl<T> PartialOrd for Far<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Far<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.time, self.seq).cmp(&(other.time, other.seq))
    }
}

/// No node (end of a bucket's list, or of the free list).
const NIL: u32 = u32::MAX;

/// An item in the wheel: a node of its bucket's singly linked list, in a slab of nodes that
/// is reused (a freed node goes on the free list), so that scheduling allocates nothing once
/// the queue has grown to its working size, and the nodes in use stay few and close together.
struct Node<T> {
    seq: u64,
    /// The next node of the same bucket (or of the free list), or [`NIL`].
    next: u32,
    item: Option<T>,
}

/// First and last node of a bucket's list (both [`NIL`] when the bucket is empty).
#[derive(Clone, Copy)]
struct Bucket {
    head: u32,
    tail: u32,
}

const EMPTY: Bucket = Bucket {
    head: NIL,
    tail: NIL,
};

/// A priority queue of items by `(time, order of insertion)`.
pub(crate) struct EventQueue<T> {
    /// Every item in the wheel is due in `[base, base + WHEEL)`.
    base: Nanos,
    seq: u64,
    /// A fixed-size array, so that an index masked with `WHEEL - 1` needs no bounds check.
    buckets: Box<[Bucket; WHEEL]>,
    nodes: Vec<Node<T>>,
    /// Head of the list of free nodes.
    free: u32,
    occupied: [u64; WORDS],
    /// Bit `w` (of the concatenated words) is set when word `w` of `occupied` is not zero.
    summary: [u64; SUMMARY_WORDS],
    in_wheel: usize,
    /// Time of the wheel's first item, when known.
    wheel_next: Option<Nanos>,
    far: BinaryHeap<Reverse<Far<T>>>,
}

// The summary bitmap has one bit per word of the bucket bitmap.
const _: () = assert!(WORDS == SUMMARY_WORDS * 64 && SUMMARY_WORDS >= 1);

impl<T> EventQueue<T> {
    pub(crate) fn new() -> Self {
        Self {
            base: 0,
            seq: 0,
            buckets: vec![EMPTY; WHEEL]
                .into_boxed_slice()
                .try_into()
                .unwrap_or_else(|_| unreachable!("WHEEL buckets")),
            nodes: Vec::new(),
            free: NIL,
            occupied: [0; WORDS],
            summary: [0; SUMMARY_WORDS],
            in_wheel: 0,
            wheel_next: None,
            far: BinaryHeap::new(),
        }
    }

    /// Schedules `item` at `time`, after every item already scheduled at that time.
    /// Always inlined into its few callers (a post, the doorbell, the response): the call's
    /// register saves and argument moves cost about a fifth of the push.
    #[inline(always)]
    pub(crate) fn push(&mut self, time: Nanos, item: T) {
        self.seq += 1;
        let seq = self.seq;
        if time >= self.base && time - self.base < WHEEL as Nanos {
            let index = if self.free == NIL {
                let index = self.nodes.len();
                assert!(index < NIL as usize, "event queue node index overflow");
                self.nodes.push(Node {
                    seq,
                    next: NIL,
                    item: Some(item),
                });
                index as u32
            } else {
                let index = self.free;
                let slot = &mut self.nodes[index as usize];
                self.free = slot.next;
                slot.seq = seq;
                slot.next = NIL;
                // A free node holds no item: nothing to drop (and no drop call to make).
                let old = slot.item.replace(item);
                debug_assert!(old.is_none(), "a free node holds no item");
                std::mem::forget(old);
                index
            };
            let b = time as usize & (WHEEL - 1);
            let bucket = &mut self.buckets[b];
            if bucket.tail == NIL {
                bucket.head = index;
                self.occupied[b / 64] |= 1 << (b % 64);
                self.summary[b / 4096] |= 1 << (b / 64 % 64);
            } else {
                self.nodes[bucket.tail as usize].next = index;
            }
            bucket.tail = index;
            self.in_wheel += 1;
            if self.in_wheel == 1 {
                self.wheel_next = Some(time);
            } else if let Some(next) = self.wheel_next
                && time < next
            {
                self.wheel_next = Some(time);
            }
        } else {
            self.far.push(Reverse(Far { time, seq, item }));
        }
    }

    /// Time of the wheel's first item.
    #[inline]
    fn wheel_first(&mut self) -> Option<Nanos> {
        if self.in_wheel == 0 {
            return None;
        }
        if let Some(t) = self.wheel_next {
            return Some(t);
        }
        Some(self.scan_wheel())
    }

    /// Time of the wheel's first item, from the bitmaps, starting at `base` (the wheel is
    /// not empty).
    fn scan_wheel(&mut self) -> Nanos {
        let start = self.base as usize & (WHEEL - 1);
        let (w0, bit0) = (start / 64, start % 64);
        // In time order: the start word from `bit0` up, the other words in turn (found with
        // the summary), then the start word's bits below `bit0` (times that wrapped around
        // the wheel).
        let first = self.occupied[w0] & (!0u64 << bit0);
        let b = if first != 0 {
            w0 * 64 + first.trailing_zeros() as usize
        } else {
            // The first occupied word after `w0`, else the first from the wheel's start
            // (which may be `w0` itself: then only its bits below `bit0` are set).
            let w = self
                .first_occupied_word(w0 + 1)
                .or_else(|| self.first_occupied_word(0))
                .expect("a non-empty wheel has an occupied bucket");
            debug_assert!(w != w0 || self.occupied[w0] & ((1u64 << bit0).wrapping_sub(1)) != 0);
            w * 64 + self.occupied[w].trailing_zeros() as usize
        };
        let t = self.base + ((b.wrapping_sub(start)) & (WHEEL - 1)) as Nanos;
        self.wheel_next = Some(t);
        t
    }

    /// The first non-zero word of the bucket bitmap at index `from` or later, if any.
    #[inline]
    fn first_occupied_word(&self, from: usize) -> Option<usize> {
        let mut s = from / 64;
        let mut bits = self.summary.get(s)? & (!0u64 << (from % 64));
        loop {
            if bits != 0 {
                return Some(s * 64 + bits.trailing_zeros() as usize);
            }
            s += 1;
            bits = *self.summary.get(s)?;
        }
    }

    /// Time of the next item.
    #[inline]
    pub(crate) fn peek_time(&mut self) -> Option<Nanos> {
        let wheel = self.wheel_first();
        let far = self.far.peek().map(|Reverse(f)| f.time);
        match (wheel, far) {
            (Some(w), Some(f)) => Some(w.min(f)),
            (w, f) => w.or(f),
        }
    }

    /// Takes out the next item and its time.
    pub(crate) fn pop(&mut self) -> Option<(Nanos, T)> {
        let wheel = self.wheel_first();
        let from_wheel = match (wheel, self.far.peek()) {
            (None, None) => return None,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(w), Some(Reverse(f))) => {
                let b = w as usize & (WHEEL - 1);
                let seq = self.nodes[self.buckets[b].head as usize].seq;
                (w, seq) < (f.time, f.seq)
            }
        };
        let (time, item) = if from_wheel {
            let time = wheel.expect("wheel item");
            let b = time as usize & (WHEEL - 1);
            let bucket = &mut self.buckets[b];
            let index = bucket.head;
            let node = &mut self.nodes[index as usize];
            let item = node.item.take().expect("occupied bucket");
            bucket.head = node.next;
            node.next = self.free;
            self.free = index;
            self.in_wheel -= 1;
            if bucket.head == NIL {
                bucket.tail = NIL;
                let word = &mut self.occupied[b / 64];
                *word &= !(1 << (b % 64));
                if *word == 0 {
                    self.summary[b / 4096] &= !(1 << (b / 64 % 64));
                }
                self.wheel_next = None;
            }
            (time, item)
        } else {
            let Reverse(f) = self.far.pop().expect("far item");
            (f.time, f.item)
        };
        // Everything left is due at `time` or later (this was the minimum).
        if time > self.base {
            self.base = time;
        }
        Some((time, item))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wheel and heap together give exactly the order of one heap by (time, seq).
    #[test]
    fn same_order_as_a_heap() {
        let mut q = EventQueue::new();
        let mut reference = BinaryHeap::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut seq = 0u64;
        let mut now: Nanos = 0;
        for round in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let pushes = 1 + x % 3;
            for k in 0..pushes {
                let delay = match (x >> (8 * k)) % 8 {
                    0 => 0,
                    1..=4 => (x >> 20) % 3000,
                    5 => (x >> 20) % WHEEL as u64,
                    6 => WHEEL as u64 - 100 + (x >> 24) % 10_000,
                    _ => 1_000_000,
                };
                // Now and then an item in the past, which the heap must take.
                let time = if round % 997 == 0 {
                    now.saturating_sub(5)
                } else {
                    now + delay
                };
                seq += 1;
                q.push(time, seq);
                reference.push(Reverse((time, seq)));
            }
            for _ in 0..(x >> 40) % 4 {
                let got = q.pop();
                let want = reference.pop().map(|Reverse((t, s))| (t, s));
                assert_eq!(got, want);
                if let Some((t, _)) = got {
                    now = now.max(t);
                }
            }
        }
        while let Some(Reverse((t, s))) = reference.pop() {
            assert_eq!(q.peek_time(), Some(t));
            assert_eq!(q.pop(), Some((t, s)));
        }
        assert_eq!(q.pop(), None);
    }
}
