//! DecLock's cooperative queue-notify lock (CQL): the 8-byte FAA-only header, the 8-byte
//! queue entries, and the pure decisions a client takes from the values it reads
//! (DecLock §4.1 Fig. 5, §4.2 Figs. 6–7, §4.3, §4.4, §5.1 Fig. 9, §5.3).
//!
//! # Layout
//!
//! A CQL lock is a header followed by a circular queue of `CAPACITY` entries, contiguous so
//! that one READ fetches both ([`CqlLock`], `8 + 8 * CAPACITY` bytes).
//!
//! The header is one little-endian `u64` that clients only ever change with RDMA FAA
//! (plus one CAS to start a reset). With `c = log2(CAPACITY)` and `N = c + 1`:
//!
//! ```text
//!  63                                                                               0
//! +----------------------------+------------+------------+--------------------------+
//! | qhead: c + 16 bits         | qsize: N   | wcnt: N    | reset id: K bits         |
//! |  (16-bit traversal count   |            |            |  K = 64 - (c+16) - 2N    |
//! |   above a c-bit slot)      |            |            |                          |
//! +----------------------------+------------+------------+--------------------------+
//! ```
//!
//! * `qhead` sits in the most significant bits, so it is the only field that may overflow:
//!   its carry leaves the word and corrupts nothing (§4.1, "Field choice and order").
//!   Its low `c` bits are the slot of the queue head; the `M = 16` bits above count the
//!   traversals of the circular queue and are the version a waiter writes into its entry
//!   (§4.3), which is why `M` equals the paper's 16-bit entry version.
//! * `qsize` and `wcnt` have `N = c + 1` bits: one more than the capacity needs, so a
//!   queue that temporarily holds more than `CAPACITY` clients (up to `2 * CAPACITY - 1`)
//!   does not carry into `qhead` (§4.1, "Field size").
//! * The reset id fills the least significant bits: zero normally, the resetting CN's id
//!   (non-zero) while a reset is in progress (§4.4). For the evaluation's capacity 8 it
//!   has 37 bits; `CAPACITY` may be at most 2^15 so that at least one bit is left.
//!
//! Deviation: the public DecLock code orders these fields differently (reset flag at the
//! bottom, a 24-bit head, a reset counter on top); dmem follows Fig. 5 of the paper.
//!
//! A queue entry ([`CqlEntry`], §5.1 Fig. 9) is one little-endian `u64`:
//!
//! ```text
//!  63   62                         32 31               16 15                0
//! +----+-----------------------------+-------------------+------------------+
//! |mode| client id (31 bits)         | timestamp (16 b)  | version (16 b)   |
//! +----+-----------------------------+-------------------+------------------+
//! ```
//!
//! Entries start as all ones, so their version is the reserved initial value `0xFFFF`.
//!
//! # Operations
//!
//! | step | FAA delta | decision from the returned (old) header |
//! |---|---|---|
//! | acquire shared | [`CqlHeader::enqueue_shared_delta`] | [`CqlHeader::decode_acquire`] |
//! | acquire exclusive | [`CqlHeader::enqueue_exclusive_delta`] | [`CqlHeader::decode_acquire`] |
//! | release shared | [`CqlHeader::dequeue_shared_delta`] | [`CqlHeader::decode_release`], then [`Successors::plan`] on the fetched queue |
//! | release exclusive | [`CqlHeader::dequeue_exclusive_delta`] | same |
//!
//! A release subtracts by adding the two's complement: since the fields it decrements are
//! at least one whenever the caller really holds the lock, no borrow crosses a field
//! boundary and only `qhead`'s carry may leave the word.

use core::mem::{align_of, size_of};

use static_assertions::const_assert_eq;
use zerocopy::little_endian::U64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::LayoutError;

/// Acquisition mode of a reader-writer lock (DecLock `mode`; LOTUS read/write locks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockMode {
    /// Shared (read) mode: any number of shared holders at once.
    Shared,
    /// Exclusive (write) mode: one holder, no shared holders.
    Exclusive,
}

impl LockMode {
    /// `EX(mode)` of DecLock Fig. 7: 1 for exclusive, 0 for shared.
    #[inline]
    pub const fn is_exclusive(self) -> bool {
        matches!(self, LockMode::Exclusive)
    }
}

/// Number of bits of a queue entry's version and of the traversal count in `qhead`
/// (DecLock §6.1 evaluates 16-bit versions).
pub const VERSION_BITS: u32 = 16;

/// The version every queue entry holds before it is first written, and the value whose
/// appearance as a computed version forces a reset (DecLock §4.3, §4.4 "Version overflow").
pub const INITIAL_VERSION: u16 = u16::MAX;

/// Why a CQL operation cannot go on as the header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CqlError {
    /// The header carries a non-zero reset id: the lock is being reset (DecLock §4.4).
    /// An acquisition is aborted and retried after the reset; a release can be ignored.
    #[error("lock is being reset by {reset_id}")]
    Resetting {
        /// The reset id found in the header (the resetting CN).
        reset_id: u64,
    },
    /// A release found no entry (or no writer) to remove: the caller did not hold the lock
    /// as it claims, and the header is now wrong; the lock must be reset.
    #[error("release of a lock not held in this mode")]
    NotHeld,
}

/// The 64-bit CQL lock header for a queue of `CAPACITY` entries (DecLock §4.1 Fig. 5);
/// see the module docs for the bit layout. `CAPACITY` must be a power of two between 2
/// and 2^15; other values fail to compile where the header is used.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct CqlHeader<const CAPACITY: usize> {
    word: U64,
}

const_assert_eq!(size_of::<CqlHeader<8>>(), 8);
const_assert_eq!(align_of::<CqlHeader<8>>(), 1);

impl<const CAPACITY: usize> CqlHeader<CAPACITY> {
    /// `log2(CAPACITY)`: the bits of `qhead` that select a slot.
    pub const CAPACITY_BITS: u32 = CAPACITY.trailing_zeros();
    /// `N`: bits of `qsize` and of `wcnt`, one more than the capacity needs.
    pub const COUNT_BITS: u32 = Self::CAPACITY_BITS + 1;
    /// Bits of `qhead`: the slot bits plus the `M = 16` traversal (version) bits.
    pub const QHEAD_BITS: u32 = Self::CAPACITY_BITS + VERSION_BITS;
    /// `K`: bits of the reset id, everything below `wcnt`.
    pub const RESET_ID_BITS: u32 = 64u32.saturating_sub(Self::QHEAD_BITS + 2 * Self::COUNT_BITS);

    const GEOMETRY: () = {
        assert!(
            CAPACITY.is_power_of_two() && CAPACITY >= 2,
            "CQL capacity must be a power of two >= 2"
        );
        assert!(
            Self::QHEAD_BITS + 2 * Self::COUNT_BITS < 64,
            "CQL capacity too large: no bit left for the reset id"
        );
    };

    const WCNT_SHIFT: u32 = Self::RESET_ID_BITS;
    const QSIZE_SHIFT: u32 = Self::WCNT_SHIFT + Self::COUNT_BITS;
    const QHEAD_SHIFT: u32 = Self::QSIZE_SHIFT + Self::COUNT_BITS;
    const COUNT_MASK: u64 = (1 << Self::COUNT_BITS) - 1;
    const QHEAD_MASK: u64 = (1 << Self::QHEAD_BITS) - 1;
    const RESET_ID_MASK: u64 = (1 << Self::RESET_ID_BITS) - 1;

    const ONE_WCNT: u64 = 1 << Self::WCNT_SHIFT;
    const ONE_QSIZE: u64 = 1 << Self::QSIZE_SHIFT;
    const ONE_QHEAD: u64 = 1 << Self::QHEAD_SHIFT;

    /// Largest value `qsize` and `wcnt` can hold: `2 * CAPACITY - 1`.
    pub const MAX_COUNT: u64 = Self::COUNT_MASK;

    /// The header of a free lock: empty queue at head 0, no reset (all zero).
    pub const INITIAL: Self = {
        let () = Self::GEOMETRY;
        Self { word: U64::ZERO }
    };

    /// The header whose native value is `raw` (what an FAA or CAS returned).
    #[inline]
    pub const fn from_raw(raw: u64) -> Self {
        let () = Self::GEOMETRY;
        Self {
            word: U64::new(raw),
        }
    }

    /// The header's native value: the compare/swap operand of a CAS, the base of an FAA.
    #[inline]
    pub const fn raw(self) -> u64 {
        self.word.get()
    }

    /// A header with the given fields, or [`LayoutError::DoesNotFit`] naming the first
    /// field that does not fit its bits.
    pub const fn from_fields(
        qhead: u64,
        qsize: u64,
        wcnt: u64,
        reset_id: u64,
    ) -> Result<Self, LayoutError> {
        let () = Self::GEOMETRY;
        if qhead > Self::QHEAD_MASK {
            return Err(LayoutError::DoesNotFit {
                field: "cql qhead",
                value: qhead,
                max: Self::QHEAD_MASK,
            });
        }
        if qsize > Self::COUNT_MASK {
            return Err(LayoutError::DoesNotFit {
                field: "cql qsize",
                value: qsize,
                max: Self::COUNT_MASK,
            });
        }
        if wcnt > Self::COUNT_MASK {
            return Err(LayoutError::DoesNotFit {
                field: "cql wcnt",
                value: wcnt,
                max: Self::COUNT_MASK,
            });
        }
        if reset_id > Self::RESET_ID_MASK {
            return Err(LayoutError::DoesNotFit {
                field: "cql reset id",
                value: reset_id,
                max: Self::RESET_ID_MASK,
            });
        }
        Ok(Self::from_raw(
            (qhead << Self::QHEAD_SHIFT)
                | (qsize << Self::QSIZE_SHIFT)
                | (wcnt << Self::WCNT_SHIFT)
                | reset_id,
        ))
    }

    /// Index of the queue head: slot in the low `c` bits, traversal count above.
    #[inline]
    pub const fn qhead(self) -> u64 {
        (self.raw() >> Self::QHEAD_SHIFT) & Self::QHEAD_MASK
    }

    /// Number of clients in the queue (holders and waiters).
    #[inline]
    pub const fn qsize(self) -> u64 {
        (self.raw() >> Self::QSIZE_SHIFT) & Self::COUNT_MASK
    }

    /// Number of exclusive clients in the queue (holding or waiting).
    #[inline]
    pub const fn wcnt(self) -> u64 {
        (self.raw() >> Self::WCNT_SHIFT) & Self::COUNT_MASK
    }

    /// The reset id: zero unless a reset is in progress (DecLock §4.4).
    #[inline]
    pub const fn reset_id(self) -> u64 {
        self.raw() & Self::RESET_ID_MASK
    }

    /// This header with its reset id replaced: the swap value of reset step 1 (a CAS from
    /// the header just read). Fails if `reset_id` does not fit [`Self::RESET_ID_BITS`].
    pub const fn with_reset_id(self, reset_id: u64) -> Result<Self, LayoutError> {
        if reset_id > Self::RESET_ID_MASK {
            return Err(LayoutError::DoesNotFit {
                field: "cql reset id",
                value: reset_id,
                max: Self::RESET_ID_MASK,
            });
        }
        Ok(Self::from_raw(
            (self.raw() & !Self::RESET_ID_MASK) | reset_id,
        ))
    }

    /// The header after the MN's NIC added `delta` to it (FAA wraps modulo 2^64).
    #[inline]
    pub const fn after_faa(self, delta: u64) -> Self {
        Self::from_raw(self.raw().wrapping_add(delta))
    }

    /// FAA delta of a shared acquisition: `qsize += 1` (DecLock Fig. 7 line 1).
    #[inline]
    pub const fn enqueue_shared_delta() -> u64 {
        let () = Self::GEOMETRY;
        Self::ONE_QSIZE
    }

    /// FAA delta of an exclusive acquisition: `qsize += 1, wcnt += 1` (Fig. 7 line 1).
    #[inline]
    pub const fn enqueue_exclusive_delta() -> u64 {
        let () = Self::GEOMETRY;
        Self::ONE_QSIZE + Self::ONE_WCNT
    }

    /// FAA delta of a shared release: `qhead += 1, qsize -= 1` (Fig. 7 line 6).
    #[inline]
    pub const fn dequeue_shared_delta() -> u64 {
        let () = Self::GEOMETRY;
        Self::ONE_QHEAD.wrapping_sub(Self::ONE_QSIZE)
    }

    /// FAA delta of an exclusive release: `qhead += 1, qsize -= 1, wcnt -= 1` (Fig. 7
    /// line 6).
    #[inline]
    pub const fn dequeue_exclusive_delta() -> u64 {
        Self::dequeue_shared_delta().wrapping_sub(Self::ONE_WCNT)
    }

    /// FAA delta that acquires in `mode`.
    #[inline]
    pub const fn enqueue_delta(mode: LockMode) -> u64 {
        match mode {
            LockMode::Shared => Self::enqueue_shared_delta(),
            LockMode::Exclusive => Self::enqueue_exclusive_delta(),
        }
    }

    /// FAA delta that releases a lock held in `mode`.
    #[inline]
    pub const fn dequeue_delta(mode: LockMode) -> u64 {
        match mode {
            LockMode::Shared => Self::dequeue_shared_delta(),
            LockMode::Exclusive => Self::dequeue_exclusive_delta(),
        }
    }

    /// Position of the queue head.
    #[inline]
    pub const fn head_position(self) -> QueuePosition<CAPACITY> {
        QueuePosition::new(self.qhead())
    }

    /// Position one past the last client: where the next acquirer's entry goes.
    #[inline]
    pub const fn tail_position(self) -> QueuePosition<CAPACITY> {
        QueuePosition::new(self.qhead().wrapping_add(self.qsize()))
    }

    /// Whether the queue holds more clients than it has entries (only possible when more
    /// clients than `CAPACITY` contend; DecLock §4.4 "Queue entry overwrite").
    #[inline]
    pub const fn is_overflowing(self) -> bool {
        self.qsize() > CAPACITY as u64
    }

    /// Decodes the header an acquiring FAA returned (the value *before* the caller's
    /// delta) into the caller's outcome (DecLock §4.2, Fig. 7 lines 1–5).
    ///
    /// The caller waits iff it asks for exclusive mode and the queue was not empty, or a
    /// writer was in the queue; otherwise it holds the lock at once (workflow ➀). A
    /// waiter (➁) writes [`Acquired::entry`] at its position's slot and waits for the
    /// notification of a client ahead of it.
    pub const fn decode_acquire(self, mode: LockMode) -> Result<Acquired<CAPACITY>, CqlError> {
        if self.reset_id() != 0 {
            return Err(CqlError::Resetting {
                reset_id: self.reset_id(),
            });
        }
        let waits = (mode.is_exclusive() && self.qsize() > 0) || self.wcnt() > 0;
        Ok(Acquired {
            mode,
            position: self.tail_position(),
            role: if waits {
                AcquireRole::Waiter
            } else {
                AcquireRole::Holder
            },
            overflowed: self.qsize() >= CAPACITY as u64,
        })
    }

    /// Decodes the header a releasing FAA returned (the value before the caller's delta)
    /// (DecLock §4.2, Fig. 7 lines 6–19).
    ///
    /// If the caller was the last client (`qsize` was 1) nobody is waiting (➂).
    /// Otherwise the caller reads the queue (piggybacked on the FAA) and passes it to
    /// [`Successors::plan`] to learn whom to notify.
    pub const fn decode_release(self, mode: LockMode) -> Result<Released<CAPACITY>, CqlError> {
        if self.reset_id() != 0 {
            return Err(CqlError::Resetting {
                reset_id: self.reset_id(),
            });
        }
        if self.qsize() == 0 || (mode.is_exclusive() && self.wcnt() == 0) {
            return Err(CqlError::NotHeld);
        }
        let remaining = self.qsize() - 1;
        let writers = if mode.is_exclusive() {
            self.wcnt() - 1
        } else {
            self.wcnt()
        };
        let successors = if remaining == 0 {
            None
        } else {
            Some(Successors {
                released: mode,
                first: QueuePosition::new(self.qhead().wrapping_add(1)),
                len: remaining,
                writers,
            })
        };
        Ok(Released {
            successors,
            version_exhausted: self.tail_position().is_version_exhausted(),
        })
    }
}

/// Index of one client in the CQL queue, in `qhead` space: the slot in the low
/// `log2(CAPACITY)` bits and the traversal count (the entry version) above
/// (DecLock §4.1, §4.3). Arithmetic wraps modulo `2^(log2(CAPACITY) + 16)`, as `qhead` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QueuePosition<const CAPACITY: usize> {
    index: u64,
}

impl<const CAPACITY: usize> QueuePosition<CAPACITY> {
    /// The position with index `index` (reduced modulo the `qhead` range).
    #[inline]
    pub const fn new(index: u64) -> Self {
        Self {
            index: index & CqlHeader::<CAPACITY>::QHEAD_MASK,
        }
    }

    /// The index in `qhead` space.
    #[inline]
    pub const fn index(self) -> u64 {
        self.index
    }

    /// Queue slot of this position: `index mod CAPACITY`.
    #[inline]
    pub const fn slot(self) -> usize {
        // The mask keeps the value below CAPACITY, which is a usize.
        (self.index & (CAPACITY as u64 - 1)) as usize
    }

    /// Entry version of this position: the number of traversals of the circular queue,
    /// `index / CAPACITY`, 16 bits (DecLock §4.3).
    #[inline]
    pub const fn version(self) -> u16 {
        // QHEAD_BITS = CAPACITY_BITS + 16, so the shifted index fits 16 bits.
        (self.index >> CqlHeader::<CAPACITY>::CAPACITY_BITS) as u16
    }

    /// Whether this position's version is the reserved initial version: an entry written
    /// here could not be told from a never-written one, so the lock must be reset before
    /// the queue reaches it (DecLock §4.4 "Version overflow").
    #[inline]
    pub const fn is_version_exhausted(self) -> bool {
        self.version() == INITIAL_VERSION
    }

    /// The position `n` places later.
    #[inline]
    pub const fn advance(self, n: u64) -> Self {
        Self::new(self.index.wrapping_add(n))
    }

    /// The next position.
    #[inline]
    pub const fn next(self) -> Self {
        self.advance(1)
    }

    /// The previous position: the client whose release notifies a waiter here (or the
    /// writer ahead of a run of readers).
    #[inline]
    pub const fn prev(self) -> Self {
        Self::new(self.index.wrapping_sub(1))
    }

    /// Whether `header`'s `qhead` has moved past this position: the client here has
    /// released (or its successor in a shared run has). Wrap-aware: positions up to half
    /// the `qhead` range behind the head count as passed.
    #[inline]
    pub const fn is_dequeued_in(self, header: CqlHeader<CAPACITY>) -> bool {
        let behind = header.qhead().wrapping_sub(self.index) & CqlHeader::<CAPACITY>::QHEAD_MASK;
        behind != 0 && behind <= CqlHeader::<CAPACITY>::QHEAD_MASK / 2
    }

    /// Byte offset of this position's entry from the start of the [`CqlLock`].
    #[inline]
    pub const fn entry_offset(self) -> usize {
        CqlLock::<CAPACITY>::QUEUE_OFFSET + self.slot() * size_of::<CqlEntry>()
    }
}

/// Whether an acquirer holds the lock right away or waits for a notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireRole {
    /// Workflow ➀: the caller holds the lock; it writes no entry.
    Holder,
    /// Workflow ➁: the caller writes its entry and waits to be notified.
    Waiter,
}

/// Outcome of an acquiring FAA, decoded by [`CqlHeader::decode_acquire`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquired<const CAPACITY: usize> {
    /// Mode the caller asked for.
    pub mode: LockMode,
    /// The caller's place in the queue (where its entry goes).
    pub position: QueuePosition<CAPACITY>,
    /// Holder now, or waiter.
    pub role: AcquireRole,
    /// The queue already had `CAPACITY` clients: the caller's entry shares its slot with a
    /// client still in the queue. The extra `qsize` bit keeps the header intact, but an
    /// overwritten entry will be found by a releaser and the lock reset (DecLock §4.4).
    /// The FAA cannot be undone by a second FAA: a client that enqueued behind the caller
    /// in between would be left beyond `qhead + qsize`. A deployment sizes `CAPACITY` to
    /// the number of contenders (one per CN with hierarchical locking, §5) so this stays
    /// false; a caller that sees it may start a reset at once instead of waiting.
    pub overflowed: bool,
}

impl<const CAPACITY: usize> Acquired<CAPACITY> {
    /// The predecessor's position (the client ahead of the caller in the queue).
    #[inline]
    pub const fn predecessor(&self) -> QueuePosition<CAPACITY> {
        self.position.prev()
    }

    /// The entry a waiter writes at [`Self::position`] (Fig. 7 lines 3–4), stamped with
    /// the position's version.
    #[inline]
    pub const fn entry(&self, client: ClientId, timestamp: CqlTimestamp) -> CqlEntry {
        CqlEntry::new(self.mode, client, self.position.version(), timestamp)
    }
}

/// Outcome of a releasing FAA, decoded by [`CqlHeader::decode_release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released<const CAPACITY: usize> {
    /// `None` if the queue is empty after the release (workflow ➂, nobody to notify);
    /// otherwise the clients behind the caller, to examine in the fetched queue.
    pub successors: Option<Successors<CAPACITY>>,
    /// The next position to be handed out has the reserved version: the lock must be
    /// reset before anyone enqueues there (DecLock §4.4, Appendix A "Reset occasions").
    pub version_exhausted: bool,
}

/// The clients left in the queue after a release, as seen in the releasing FAA's result:
/// positions `first .. first + len`, `writers` of them exclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Successors<const CAPACITY: usize> {
    /// Mode the caller released.
    pub released: LockMode,
    /// Position right behind the caller (the successor).
    pub first: QueuePosition<CAPACITY>,
    /// Number of clients left (at least one).
    pub len: u64,
    /// Number of writers among them (`wcnt` after the release).
    pub writers: u64,
}

/// Why a release found that the lock must be reset (DecLock §4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetReason {
    /// The entry at this position carries a later version than the position's: it was
    /// overwritten by a client one traversal ahead (queue overflow).
    Overwritten {
        /// Index of the overwritten entry's position.
        index: u64,
    },
    /// A position in the queue has the reserved version `0xFFFF`.
    VersionExhausted,
    /// The queue holds more valid writer entries than `wcnt` says, or fewer with none
    /// left to wait for: the header and queue disagree.
    Inconsistent,
}

/// Whom a releasing client notifies, decided from the fetched queue by
/// [`Successors::plan`] (DecLock §4.2 workflows ➂–➄, §4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotifyPlan<const CAPACITY: usize> {
    /// Nobody: the successor is a reader that already holds the lock (workflow ➂ for a
    /// reader releasing behind other readers).
    Nobody,
    /// Notify the waiting writer at `position` (workflow ➃).
    Writer {
        /// Its position.
        position: QueuePosition<CAPACITY>,
        /// Its client id, read from its entry.
        client: ClientId,
    },
    /// A writer released: notify the `count` adjacent waiting readers from `first` on;
    /// they share the lock (workflow ➄). Their client ids are in their entries.
    Readers {
        /// Position of the first reader.
        first: QueuePosition<CAPACITY>,
        /// Number of readers to notify.
        count: u64,
    },
    /// An entry the decision depends on is obsolete (not yet written by its waiter): read
    /// the lock again and plan again (DecLock §4.3 "Read-write conflicts"). `position` is
    /// the first such entry; for a reader's release it may be a shared holder's entry,
    /// which stays obsolete, while the entry really awaited is a writer's further on.
    Refetch {
        /// Position to refetch.
        position: QueuePosition<CAPACITY>,
    },
    /// The lock state is broken: reset the lock.
    Reset(ResetReason),
}

/// How an entry read from the queue relates to the position it was read for (DecLock §4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryFreshness {
    /// The entry was written for this position.
    Current,
    /// The entry is from an earlier traversal or was never written.
    Obsolete,
    /// The entry is from a later traversal: the waiter of this position was overwritten.
    Overwritten,
}

impl<const CAPACITY: usize> Successors<CAPACITY> {
    /// The positions of the remaining clients, in queue order.
    pub fn positions(&self) -> impl Iterator<Item = QueuePosition<CAPACITY>> {
        let first = self.first;
        (0..self.len).map(move |i| first.advance(i))
    }

    /// Decides whom to notify, given the lock (header and queue, one READ) read after the
    /// releasing FAA: piggybacked on it on the same queue pair, or refetched later
    /// (DecLock Fig. 7 lines 7–19, §4.3 "Shared holders").
    ///
    /// * A writer released: the successor is waiting. If its entry is a writer's, notify
    ///   it (➃); if a reader's, notify it and every adjacent reader behind it (➄). An
    ///   entry not written yet is refetched.
    /// * A reader released: shared holders never write their entries, so the writers are
    ///   found first: once the number of valid writer entries equals `wcnt`, every other
    ///   entry is a reader. Then the successor is notified only if it is a writer;
    ///   otherwise it is a reader that already holds the lock.
    ///
    /// Addition to the paper, for a reader's release only: if the fetched header shows
    /// that `qhead` has already moved past the successor, the plan is
    /// [`NotifyPlan::Nobody`]. A reader only ever notifies a waiting writer, and `qhead`
    /// cannot pass a waiting writer (everyone behind it waits, and only the clients
    /// ahead of it release), so the successor is not a writer waiting for this reader.
    /// Without this a reader that keeps refetching while the other shared holder
    /// notifies the writer could later find the successor's slot reused by the next
    /// traversal and ask for a needless reset. The shortcut does not hold for a writer's
    /// release: after it, `wcnt` may be zero, new readers are granted at once, and their
    /// releases move `qhead` past readers still waiting for this writer's notification.
    pub fn plan(&self, lock: &CqlLock<CAPACITY>) -> NotifyPlan<CAPACITY> {
        if self.released == LockMode::Shared && self.first.is_dequeued_in(lock.header()) {
            return NotifyPlan::Nobody;
        }
        if self.positions().any(QueuePosition::is_version_exhausted) {
            return NotifyPlan::Reset(ResetReason::VersionExhausted);
        }
        let queue = lock.queue();
        let read = |position: QueuePosition<CAPACITY>| -> (CqlEntry, EntryFreshness) {
            let entry = queue
                .get(position.slot())
                .copied()
                .unwrap_or(CqlEntry::INITIAL);
            (entry, entry.freshness(position.version()))
        };
        match self.released {
            LockMode::Exclusive => self.plan_after_writer(read),
            LockMode::Shared => self.plan_after_reader(read),
        }
    }

    /// A writer released (➃, ➄): the successor's entry decides, and a reader's brings
    /// every adjacent reader behind it.
    fn plan_after_writer(
        &self,
        read: impl Fn(QueuePosition<CAPACITY>) -> (CqlEntry, EntryFreshness),
    ) -> NotifyPlan<CAPACITY> {
        let mut count = 0;
        for position in self.positions() {
            let (entry, freshness) = read(position);
            match freshness {
                EntryFreshness::Overwritten => {
                    return NotifyPlan::Reset(ResetReason::Overwritten {
                        index: position.index(),
                    });
                }
                EntryFreshness::Obsolete => return NotifyPlan::Refetch { position },
                EntryFreshness::Current if entry.mode() == LockMode::Exclusive => {
                    if count == 0 {
                        return NotifyPlan::Writer {
                            position,
                            client: entry.client(),
                        };
                    }
                    break;
                }
                EntryFreshness::Current => count += 1,
            }
        }
        NotifyPlan::Readers {
            first: self.first,
            count,
        }
    }

    /// A reader released: count the valid writer entries against `wcnt` first; the
    /// successor is notified only if it is a writer.
    fn plan_after_reader(
        &self,
        read: impl Fn(QueuePosition<CAPACITY>) -> (CqlEntry, EntryFreshness),
    ) -> NotifyPlan<CAPACITY> {
        let mut writers = 0;
        let mut first_obsolete = None;
        for position in self.positions() {
            let (entry, freshness) = read(position);
            match freshness {
                EntryFreshness::Overwritten => {
                    return NotifyPlan::Reset(ResetReason::Overwritten {
                        index: position.index(),
                    });
                }
                EntryFreshness::Obsolete => {
                    first_obsolete.get_or_insert(position);
                }
                EntryFreshness::Current if entry.mode() == LockMode::Exclusive => writers += 1,
                EntryFreshness::Current => {}
            }
        }
        if writers > self.writers {
            return NotifyPlan::Reset(ResetReason::Inconsistent);
        }
        if writers < self.writers {
            return match first_obsolete {
                Some(position) => NotifyPlan::Refetch { position },
                None => NotifyPlan::Reset(ResetReason::Inconsistent),
            };
        }
        let (entry, freshness) = read(self.first);
        if freshness == EntryFreshness::Current && entry.mode() == LockMode::Exclusive {
            NotifyPlan::Writer {
                position: self.first,
                client: entry.client(),
            }
        } else {
            NotifyPlan::Nobody
        }
    }
}

/// Identity of a CQL client (DecLock `cid`): 31 bits, e.g. the CN id above a per-CN
/// client (coroutine) number. The public DecLock code splits it into machine and thread
/// ids; dmem leaves the split to the lock crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(u32);

impl ClientId {
    /// Largest client id an entry holds.
    pub const MAX: u32 = (1 << 31) - 1;

    /// A client id, or [`LayoutError::DoesNotFit`] above [`Self::MAX`].
    pub const fn new(id: u32) -> Result<Self, LayoutError> {
        if id > Self::MAX {
            Err(LayoutError::DoesNotFit {
                field: "cql client id",
                value: id as u64,
                max: Self::MAX as u64,
            })
        } else {
            Ok(Self(id))
        }
    }

    /// The id.
    #[inline]
    pub const fn get(self) -> u32 {
        self.0
    }
}

/// Acquisition timestamp: microseconds since the last clock synchronisation, modulo 2^16
/// (DecLock §5.3 "Timestamp encoding").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CqlTimestamp(pub u16);

impl CqlTimestamp {
    /// The timestamp of `micros` microseconds since synchronisation (wraps every 65.5 ms).
    #[inline]
    pub const fn from_micros(micros: u64) -> Self {
        Self(micros as u16)
    }

    /// Whether `self` was taken before `other`, aware of wrap-around (DecLock §5.3): if the
    /// two differ by more than half the range (about 32 ms), the *larger* value is the
    /// earlier one, since the smaller has wrapped; otherwise the smaller is earlier. Equal
    /// timestamps are not earlier than each other; for distinct ones exactly one is earlier.
    pub const fn is_earlier_than(self, other: Self) -> bool {
        let (a, b) = (self.0, other.0);
        if a == b {
            return false;
        }
        let distance = a.abs_diff(b);
        if distance > u16::MAX / 2 {
            a > b
        } else {
            a < b
        }
    }
}

/// One 8-byte entry of the CQL queue (DecLock §5.1 Fig. 9): mode, client id, version and
/// acquisition timestamp, packed as in the module docs. Every bit pattern is an entry;
/// whether it is current for a position is decided by [`CqlEntry::freshness`].
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct CqlEntry {
    word: U64,
}

const_assert_eq!(size_of::<CqlEntry>(), 8);
const_assert_eq!(align_of::<CqlEntry>(), 1);

impl CqlEntry {
    const TIMESTAMP_SHIFT: u32 = 16;
    const CLIENT_SHIFT: u32 = 32;
    const MODE_SHIFT: u32 = 63;

    /// The initial entry: all ones, version [`INITIAL_VERSION`] (DecLock §4.3).
    pub const INITIAL: Self = Self {
        word: U64::MAX_VALUE,
    };

    /// An entry for a client waiting in `mode` at a position of version `version`.
    pub const fn new(
        mode: LockMode,
        client: ClientId,
        version: u16,
        timestamp: CqlTimestamp,
    ) -> Self {
        let mode_bit = if mode.is_exclusive() { 1u64 } else { 0 };
        Self::from_raw(
            (mode_bit << Self::MODE_SHIFT)
                | ((client.get() as u64) << Self::CLIENT_SHIFT)
                | ((timestamp.0 as u64) << Self::TIMESTAMP_SHIFT)
                | version as u64,
        )
    }

    /// The entry whose native value is `raw`.
    #[inline]
    pub const fn from_raw(raw: u64) -> Self {
        Self {
            word: U64::new(raw),
        }
    }

    /// The entry's native value.
    #[inline]
    pub const fn raw(self) -> u64 {
        self.word.get()
    }

    /// The waiter's mode.
    #[inline]
    pub const fn mode(self) -> LockMode {
        if self.raw() >> Self::MODE_SHIFT == 1 {
            LockMode::Exclusive
        } else {
            LockMode::Shared
        }
    }

    /// The waiter's client id.
    #[inline]
    pub const fn client(self) -> ClientId {
        ClientId(((self.raw() >> Self::CLIENT_SHIFT) as u32) & ClientId::MAX)
    }

    /// The version (traversal count) the waiter wrote.
    #[inline]
    pub const fn version(self) -> u16 {
        self.raw() as u16
    }

    /// The waiter's acquisition timestamp.
    #[inline]
    pub const fn timestamp(self) -> CqlTimestamp {
        CqlTimestamp((self.raw() >> Self::TIMESTAMP_SHIFT) as u16)
    }

    /// How this entry, read at a position of version `expected`, relates to it (DecLock
    /// §4.3, §4.4): the same version is current; the initial version or an earlier one is
    /// obsolete; a later one means the entry was overwritten.
    #[inline]
    pub const fn freshness(self, expected: u16) -> EntryFreshness {
        let version = self.version();
        if version == expected && version != INITIAL_VERSION {
            EntryFreshness::Current
        } else if version == INITIAL_VERSION || version < expected {
            EntryFreshness::Obsolete
        } else {
            EntryFreshness::Overwritten
        }
    }
}

/// A whole CQL lock in MN memory (DecLock §5.1 Fig. 9): the header and the circular
/// queue, `8 + 8 * CAPACITY` bytes, contiguous so one READ fetches both. Alignment is 1;
/// the lock must be placed 8-byte aligned in MN memory because RDMA atomics need it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct CqlLock<const CAPACITY: usize> {
    header: CqlHeader<CAPACITY>,
    queue: [CqlEntry; CAPACITY],
}

const_assert_eq!(size_of::<CqlLock<8>>(), 72);
const_assert_eq!(align_of::<CqlLock<8>>(), 1);

impl<const CAPACITY: usize> CqlLock<CAPACITY> {
    /// Size of the lock in bytes.
    pub const SIZE: usize = size_of::<Self>();
    /// Offset of the header (the FAA/CAS target).
    pub const HEADER_OFFSET: usize = 0;
    /// Offset of the first queue entry.
    pub const QUEUE_OFFSET: usize = size_of::<CqlHeader<CAPACITY>>();

    /// A free lock: zero header, every entry all ones. Also what reset step 3 writes
    /// (queue first, then header; DecLock §4.4).
    pub const INITIAL: Self = Self {
        header: CqlHeader::INITIAL,
        queue: [CqlEntry::INITIAL; CAPACITY],
    };

    /// Parses a lock read from MN memory; `bytes` must be exactly [`Self::SIZE`] long.
    pub fn parse(bytes: &[u8]) -> Result<&Self, LayoutError> {
        Self::ref_from_bytes(bytes).map_err(|_| {
            if bytes.len() < Self::SIZE {
                LayoutError::TooShort {
                    needed: Self::SIZE,
                    got: bytes.len(),
                }
            } else {
                LayoutError::TooLong {
                    max: Self::SIZE,
                    got: bytes.len(),
                }
            }
        })
    }

    /// The header.
    #[inline]
    pub fn header(&self) -> CqlHeader<CAPACITY> {
        self.header
    }

    /// The queue entries.
    #[inline]
    pub fn queue(&self) -> &[CqlEntry; CAPACITY] {
        &self.queue
    }

    /// The header, mutable (for an in-memory MN image in tests and simulation).
    #[inline]
    pub fn header_mut(&mut self) -> &mut CqlHeader<CAPACITY> {
        &mut self.header
    }

    /// The queue entries, mutable.
    #[inline]
    pub fn queue_mut(&mut self) -> &mut [CqlEntry; CAPACITY] {
        &mut self.queue
    }
}

/// The capacity DecLock's evaluation uses (one entry per CN, 8 CNs; §6.1).
pub const EVAL_CAPACITY: usize = 8;

/// The header after the NIC applied the FAAs `deltas` in order, starting from `start`
/// (each addition wraps modulo 2^64, as RDMA FAA does).
pub fn apply_faas<const CAPACITY: usize>(
    start: CqlHeader<CAPACITY>,
    deltas: impl IntoIterator<Item = u64>,
) -> CqlHeader<CAPACITY> {
    deltas.into_iter().fold(start, CqlHeader::after_faa)
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck::{Arbitrary, Gen};
    use quickcheck_macros::quickcheck;

    type H = CqlHeader<EVAL_CAPACITY>;
    type Lock = CqlLock<EVAL_CAPACITY>;
    const S: LockMode = LockMode::Shared;
    const X: LockMode = LockMode::Exclusive;

    fn cid(id: u32) -> ClientId {
        ClientId::new(id).unwrap()
    }

    #[test]
    fn geometry_for_capacity_8() {
        assert_eq!(H::CAPACITY_BITS, 3);
        assert_eq!(H::COUNT_BITS, 4);
        assert_eq!(H::QHEAD_BITS, 19);
        assert_eq!(H::RESET_ID_BITS, 37);
        assert_eq!(H::MAX_COUNT, 15);
        assert_eq!(Lock::SIZE, 72);
        assert_eq!(CqlHeader::<1024>::RESET_ID_BITS, 16);
        assert_eq!(CqlHeader::<32768>::RESET_ID_BITS, 1);
        let h = H::from_fields(5, 3, 1, 0).unwrap();
        assert_eq!(h.raw(), (5 << 45) | (3 << 41) | (1 << 37));
        assert_eq!(h.head_position().slot(), 5);
        assert_eq!(h.tail_position().index(), 8);
        assert_eq!(h.tail_position().slot(), 0);
        assert_eq!(h.tail_position().version(), 1);
        assert_eq!(h.tail_position().entry_offset(), 8);
    }

    #[test]
    fn from_fields_refuses_what_does_not_fit() {
        assert_eq!(
            H::from_fields(1 << 19, 0, 0, 0),
            Err(LayoutError::DoesNotFit {
                field: "cql qhead",
                value: 1 << 19,
                max: (1 << 19) - 1
            })
        );
        assert!(H::from_fields(0, 16, 0, 0).is_err());
        assert!(H::from_fields(0, 0, 16, 0).is_err());
        assert!(H::from_fields(0, 0, 0, 1 << 37).is_err());
        assert!(H::INITIAL.with_reset_id(1 << 37).is_err());
        assert!(ClientId::new(1 << 31).is_err());
    }

    #[test]
    fn deltas_change_only_their_fields() {
        let h = H::from_fields(7, 2, 1, 0).unwrap();
        let f = |h: H| (h.qhead(), h.qsize(), h.wcnt(), h.reset_id());
        assert_eq!(f(h.after_faa(H::enqueue_shared_delta())), (7, 3, 1, 0));
        assert_eq!(f(h.after_faa(H::enqueue_exclusive_delta())), (7, 3, 2, 0));
        assert_eq!(f(h.after_faa(H::dequeue_shared_delta())), (8, 1, 1, 0));
        assert_eq!(f(h.after_faa(H::dequeue_exclusive_delta())), (8, 1, 0, 0));
        // A reset id is carried through unchanged by every FAA.
        let r = h.with_reset_id(42).unwrap();
        assert_eq!(f(r.after_faa(H::dequeue_exclusive_delta())), (8, 1, 0, 42));
    }

    #[test]
    fn qhead_overflow_never_corrupts_qsize_or_wcnt() {
        let top = (1u64 << H::QHEAD_BITS) - 1;
        let h = H::from_fields(top, 3, 2, 9).unwrap();
        // Releasing at the last qhead value wraps qhead to 0; the carry leaves the word.
        let after = h.after_faa(H::dequeue_exclusive_delta());
        assert_eq!(
            (after.qhead(), after.qsize(), after.wcnt(), after.reset_id()),
            (0, 2, 1, 9)
        );
        let after = h.after_faa(H::dequeue_shared_delta());
        assert_eq!(
            (after.qhead(), after.qsize(), after.wcnt(), after.reset_id()),
            (0, 2, 2, 9)
        );
        // The wrapped head position is consistent with the position arithmetic.
        assert_eq!(after.head_position(), h.head_position().next());
        assert_eq!(after.head_position().index(), 0);
    }

    #[test]
    fn extra_count_bit_absorbs_temporary_overflow() {
        // Full queue: 8 clients, all writers, head somewhere in the middle.
        let full = H::from_fields(12345, 8, 8, 0).unwrap();
        let mut h = full;
        for extra in 1..=7 {
            let acq = h.decode_acquire(X).unwrap();
            assert!(acq.overflowed);
            assert_eq!(acq.role, AcquireRole::Waiter);
            // The overflowing entry aliases the slot of the client CAPACITY places ahead.
            assert_eq!(
                acq.position.slot(),
                full.head_position().advance(extra - 1).slot()
            );
            assert_eq!(
                acq.position.version(),
                full.head_position().advance(extra - 1).version() + 1
            );
            h = h.after_faa(H::enqueue_exclusive_delta());
            assert_eq!(
                (h.qhead(), h.qsize(), h.wcnt()),
                (12345, 8 + extra, 8 + extra)
            );
            assert!(h.is_overflowing());
        }
        assert_eq!(h.qsize(), H::MAX_COUNT);
        // Releases bring it back without ever touching qhead beyond +1 each.
        for i in 1..=7 {
            h = h.after_faa(H::dequeue_exclusive_delta());
            assert_eq!(
                (h.qhead(), h.qsize(), h.wcnt()),
                (12345 + i, 15 - i, 15 - i)
            );
        }
        assert!(!h.is_overflowing());
    }

    #[test]
    fn undoing_an_overflowing_faa_would_leave_a_hole() {
        // Why the decoder reports overflow instead of offering an undo FAA: X enqueues into
        // a full queue, two holders release, Y enqueues (not full any more), X undoes.
        let mut h = H::from_fields(0, 8, 0, 0).unwrap();
        let x = h.decode_acquire(S).unwrap();
        assert!(x.overflowed);
        h = h.after_faa(H::enqueue_shared_delta());
        h = h
            .after_faa(H::dequeue_shared_delta())
            .after_faa(H::dequeue_shared_delta());
        let y = h.decode_acquire(S).unwrap();
        assert!(!y.overflowed);
        h = h.after_faa(H::enqueue_shared_delta());
        h = h.after_faa(H::enqueue_shared_delta().wrapping_neg()); // X's "undo"
        // Y now sits outside qhead .. qhead + qsize.
        assert_eq!(y.position.index(), h.qhead() + h.qsize());
    }

    #[test]
    fn version_overflow_is_detectable() {
        // The last traversal before the version reaches the reserved 0xFFFF.
        let last_good = (u64::from(INITIAL_VERSION) << H::CAPACITY_BITS) - 1;
        let h = H::from_fields(last_good - 1, 1, 1, 0).unwrap();
        let rel = h.decode_release(X).unwrap();
        assert!(!rel.version_exhausted);
        let h = H::from_fields(last_good, 1, 1, 0).unwrap();
        let rel = h.decode_release(X).unwrap();
        assert!(rel.version_exhausted, "next position has version 0xFFFF");
        assert!(h.tail_position().is_version_exhausted());
        // An acquirer landing there sees it too.
        let acq = h.decode_acquire(X).unwrap();
        assert!(acq.position.is_version_exhausted());
        // An entry written with version 0xFFFF cannot be told from a fresh one.
        let e = acq.entry(cid(1), CqlTimestamp(0));
        assert_eq!(
            e.freshness(acq.position.version()),
            EntryFreshness::Obsolete
        );
        // And a planner that meets such a position asks for a reset instead of refetching.
        let h = H::from_fields(last_good, 2, 2, 0).unwrap();
        let succ = h.decode_release(X).unwrap().successors.unwrap();
        let mut lock = Lock::INITIAL;
        *lock.header_mut() = h.after_faa(H::dequeue_exclusive_delta());
        assert_eq!(
            succ.plan(&lock),
            NotifyPlan::Reset(ResetReason::VersionExhausted)
        );
    }

    #[test]
    fn reset_id_aborts_operations() {
        let h = H::from_fields(3, 2, 1, 0)
            .unwrap()
            .with_reset_id(5)
            .unwrap();
        assert_eq!(
            h.decode_acquire(S),
            Err(CqlError::Resetting { reset_id: 5 })
        );
        assert_eq!(
            h.decode_release(X),
            Err(CqlError::Resetting { reset_id: 5 })
        );
        assert_eq!(H::INITIAL.decode_release(S), Err(CqlError::NotHeld));
        assert_eq!(
            H::from_fields(0, 1, 0, 0).unwrap().decode_release(X),
            Err(CqlError::NotHeld)
        );
    }

    #[test]
    fn entry_fields_and_freshness() {
        let e = CqlEntry::new(X, cid(ClientId::MAX), 7, CqlTimestamp(0xBEEF));
        assert_eq!(
            (e.mode(), e.client().get(), e.version(), e.timestamp()),
            (X, ClientId::MAX, 7, CqlTimestamp(0xBEEF))
        );
        assert_eq!(e.freshness(7), EntryFreshness::Current);
        assert_eq!(e.freshness(8), EntryFreshness::Obsolete);
        assert_eq!(e.freshness(6), EntryFreshness::Overwritten);
        let i = CqlEntry::INITIAL;
        assert_eq!(i.version(), INITIAL_VERSION);
        assert_eq!(i.freshness(0), EntryFreshness::Obsolete);
        assert_eq!(i.freshness(INITIAL_VERSION), EntryFreshness::Obsolete);
    }

    #[test]
    fn timestamps_compare_across_wrap() {
        let t = CqlTimestamp;
        assert!(t(10).is_earlier_than(t(20)));
        assert!(!t(20).is_earlier_than(t(10)));
        // 65530 was taken just before the counter wrapped to 5.
        assert!(t(65530).is_earlier_than(t(5)));
        assert!(!t(5).is_earlier_than(t(65530)));
        assert!(!t(7).is_earlier_than(t(7)));
        // At exactly half the range plus one half, the larger is earlier (paper's rule).
        assert!(t(32768).is_earlier_than(t(0)));
        assert!(t(0).is_earlier_than(t(32767)));
    }

    #[test]
    fn parse_lock() {
        let mut lock = Lock::INITIAL;
        lock.queue_mut()[3] = CqlEntry::new(S, cid(9), 0, CqlTimestamp(1));
        *lock.header_mut() = H::from_fields(2, 2, 1, 0).unwrap();
        let bytes = lock.as_bytes();
        assert_eq!(Lock::parse(bytes), Ok(&lock));
        assert_eq!(
            Lock::parse(&bytes[..71]),
            Err(LayoutError::TooShort {
                needed: 72,
                got: 71
            })
        );
        assert_eq!(
            Lock::parse(&[0; 73]),
            Err(LayoutError::TooLong { max: 72, got: 73 })
        );
        assert_eq!(&bytes[..8], &lock.header().raw().to_le_bytes());
        assert_eq!(Lock::HEADER_OFFSET, 0);
        assert_eq!(Lock::QUEUE_OFFSET, 8);
    }

    /// A tiny in-memory MN holding one lock: FAA on the header, WRITE of one entry.
    struct Mn {
        lock: Lock,
    }

    impl Mn {
        fn faa(&mut self, delta: u64) -> H {
            let old = self.lock.header();
            *self.lock.header_mut() = old.after_faa(delta);
            old
        }

        fn acquire(&mut self, mode: LockMode, client: u32, ts: u16) -> Acquired<EVAL_CAPACITY> {
            let acq = self
                .faa(H::enqueue_delta(mode))
                .decode_acquire(mode)
                .unwrap();
            if acq.role == AcquireRole::Waiter {
                self.lock.queue_mut()[acq.position.slot()] =
                    acq.entry(cid(client), CqlTimestamp(ts));
            }
            acq
        }

        fn release(&mut self, mode: LockMode) -> Option<NotifyPlan<EVAL_CAPACITY>> {
            let rel = self
                .faa(H::dequeue_delta(mode))
                .decode_release(mode)
                .unwrap();
            assert!(!rel.version_exhausted);
            rel.successors.map(|s| s.plan(&self.lock))
        }
    }

    #[test]
    fn declock_walkthrough_readers_and_writers() {
        // DecLock §4.2 Figs. 6–7: R1, R2 share; W3 waits; R4, R5 wait behind W3; W6 waits.
        let mut mn = Mn {
            lock: Lock::INITIAL,
        };
        let r1 = mn.acquire(S, 1, 100);
        let r2 = mn.acquire(S, 2, 101);
        assert_eq!(
            (r1.role, r2.role),
            (AcquireRole::Holder, AcquireRole::Holder)
        ); // ➀
        let w3 = mn.acquire(X, 3, 102);
        assert_eq!(w3.role, AcquireRole::Waiter); // ➁: queue not empty
        assert_eq!(w3.position.index(), 2);
        assert_eq!(w3.predecessor().index(), 1);
        let r4 = mn.acquire(S, 4, 103);
        let r5 = mn.acquire(S, 5, 104);
        assert_eq!(
            (r4.role, r5.role),
            (AcquireRole::Waiter, AcquireRole::Waiter)
        ); // writer queued
        let w6 = mn.acquire(X, 6, 105);
        assert_eq!(w6.role, AcquireRole::Waiter);
        let h = mn.lock.header();
        assert_eq!((h.qhead(), h.qsize(), h.wcnt()), (0, 6, 2));

        // R2 releases first: its successor (position 1) is R1, a shared holder whose entry
        // was never written; both writers are found, so nobody is notified (➂).
        assert_eq!(mn.release(S), Some(NotifyPlan::Nobody));
        // R1 releases: the successor is W3, a writer (➃).
        assert_eq!(
            mn.release(S),
            Some(NotifyPlan::Writer {
                position: w3.position,
                client: cid(3)
            })
        );
        // W3 releases: the successor is a reader; R4 and R5 share the lock (➄).
        let plan = mn.release(X);
        assert_eq!(
            plan,
            Some(NotifyPlan::Readers {
                first: r4.position,
                count: 2
            })
        );
        let clients: Vec<u32> = (0..2)
            .map(|i| {
                mn.lock.queue()[r4.position.advance(i).slot()]
                    .client()
                    .get()
            })
            .collect();
        assert_eq!(clients, [4, 5]);
        // A new reader arriving now waits: W6 is queued (task-fair, no overtaking).
        let r7 = mn.acquire(S, 7, 106);
        assert_eq!(r7.role, AcquireRole::Waiter);
        // R5 releases before R4: the successor (position 4) is a reader holding: nobody.
        assert_eq!(mn.release(S), Some(NotifyPlan::Nobody));
        // R4 releases: W6 is next.
        assert_eq!(
            mn.release(S),
            Some(NotifyPlan::Writer {
                position: w6.position,
                client: cid(6)
            })
        );
        // W6 releases: R7 is notified alone.
        assert_eq!(
            mn.release(X),
            Some(NotifyPlan::Readers {
                first: r7.position,
                count: 1
            })
        );
        // R7 releases: queue empty (➂).
        assert_eq!(mn.release(S), None);
        let h = mn.lock.header();
        assert_eq!((h.qhead(), h.qsize(), h.wcnt()), (7, 0, 0));
        // Next traversal: an exclusive acquirer on the empty queue holds at once.
        assert_eq!(mn.acquire(X, 8, 107).role, AcquireRole::Holder);
    }

    #[test]
    fn unwritten_entries_are_refetched() {
        // §4.3 Fig. 8 (left): W1 holds, W2 has enqueued but not yet written its entry.
        let mut mn = Mn {
            lock: Lock::INITIAL,
        };
        mn.acquire(X, 1, 0);
        let w2 = mn
            .faa(H::enqueue_exclusive_delta())
            .decode_acquire(X)
            .unwrap();
        assert_eq!(w2.role, AcquireRole::Waiter);
        let rel = mn
            .faa(H::dequeue_exclusive_delta())
            .decode_release(X)
            .unwrap();
        let succ = rel.successors.unwrap();
        assert_eq!(
            succ.plan(&mn.lock),
            NotifyPlan::Refetch {
                position: w2.position
            }
        );
        // The WRITE lands; the refetch finds it.
        mn.lock.queue_mut()[w2.position.slot()] = w2.entry(cid(2), CqlTimestamp(0));
        assert_eq!(
            succ.plan(&mn.lock),
            NotifyPlan::Writer {
                position: w2.position,
                client: cid(2)
            }
        );

        // §4.3 Fig. 8 (right) for a reader: R holds, W waits unwritten: the reader must
        // find every writer before deciding.
        let mut mn = Mn {
            lock: Lock::INITIAL,
        };
        mn.acquire(S, 1, 0);
        let w = mn
            .faa(H::enqueue_exclusive_delta())
            .decode_acquire(X)
            .unwrap();
        let succ = mn
            .faa(H::dequeue_shared_delta())
            .decode_release(S)
            .unwrap()
            .successors
            .unwrap();
        assert_eq!(
            succ.plan(&mn.lock),
            NotifyPlan::Refetch {
                position: w.position
            }
        );
    }

    #[test]
    fn stale_reader_refetch_after_queue_moved_on() {
        // R1 and R2 share; W3 enqueued but has not written its entry yet.
        let mut mn = Mn {
            lock: Lock::INITIAL,
        };
        mn.acquire(S, 1, 0);
        mn.acquire(S, 2, 0);
        let w3 = mn
            .faa(H::enqueue_exclusive_delta())
            .decode_acquire(X)
            .unwrap();
        // R2 releases first and must refetch until W3's entry is there.
        let r2 = mn.faa(H::dequeue_shared_delta()).decode_release(S).unwrap();
        let r2 = r2.successors.unwrap();
        // (the hint is the first obsolete entry: R1's, a shared holder's; the reader
        // rereads the whole lock anyway)
        assert!(matches!(r2.plan(&mn.lock), NotifyPlan::Refetch { .. }));
        // W3 writes; R1 releases and notifies W3; W3 releases; the queue then cycles
        // through more than a whole traversal of exclusive clients, reusing R2's slots.
        mn.lock.queue_mut()[w3.position.slot()] = w3.entry(cid(3), CqlTimestamp(0));
        assert!(matches!(mn.release(S), Some(NotifyPlan::Writer { .. })));
        assert_eq!(mn.release(X), None);
        for c in 10..20 {
            let head = mn.lock.header().head_position();
            mn.acquire(X, c, 0);
            mn.lock.queue_mut()[head.slot()] =
                CqlEntry::new(X, cid(c), head.version(), CqlTimestamp(0));
            mn.release(X);
        }
        // R2's refetch now sees that its successor has long been dequeued: nothing to do
        // (not an "overwritten" reset).
        assert!(r2.first.is_dequeued_in(mn.lock.header()));
        assert_eq!(r2.plan(&mn.lock), NotifyPlan::Nobody);
    }

    #[test]
    fn writer_refetch_survives_readers_passing_qhead() {
        // W holds; R1 enqueues behind it but is slow to write its entry.
        let mut mn = Mn {
            lock: Lock::INITIAL,
        };
        mn.acquire(X, 1, 0);
        let r1 = mn.faa(H::enqueue_shared_delta()).decode_acquire(S).unwrap();
        assert_eq!(r1.role, AcquireRole::Waiter);
        let w = mn
            .faa(H::dequeue_exclusive_delta())
            .decode_release(X)
            .unwrap();
        let w = w.successors.unwrap();
        assert_eq!(
            w.plan(&mn.lock),
            NotifyPlan::Refetch {
                position: r1.position
            }
        );
        // wcnt is 0 now: R5 is granted at once and releases, moving qhead past R1.
        assert_eq!(mn.acquire(S, 5, 0).role, AcquireRole::Holder);
        assert_eq!(mn.release(S), Some(NotifyPlan::Nobody));
        assert!(r1.position.is_dequeued_in(mn.lock.header()));
        // R1's entry lands; the writer must still notify it.
        mn.lock.queue_mut()[r1.position.slot()] = r1.entry(cid(1), CqlTimestamp(0));
        assert_eq!(
            w.plan(&mn.lock),
            NotifyPlan::Readers {
                first: r1.position,
                count: 1
            }
        );
    }

    #[test]
    fn overwritten_entry_demands_reset() {
        let mut mn = Mn {
            lock: Lock::INITIAL,
        };
        mn.acquire(X, 1, 0);
        let w2 = mn.acquire(X, 2, 0);
        // Another client one traversal ahead wrote the same slot.
        let ahead = w2.position.advance(EVAL_CAPACITY as u64);
        mn.lock.queue_mut()[w2.position.slot()] =
            CqlEntry::new(X, cid(9), ahead.version(), CqlTimestamp(0));
        assert_eq!(
            mn.release(X),
            Some(NotifyPlan::Reset(ResetReason::Overwritten {
                index: w2.position.index()
            }))
        );
    }

    #[quickcheck]
    fn header_fields_round_trip(qhead: u64, qsize: u8, wcnt: u8, reset_id: u64) -> bool {
        let (qhead, qsize, wcnt) = (
            qhead % (1 << 19),
            u64::from(qsize % 16),
            u64::from(wcnt % 16),
        );
        let reset_id = reset_id % (1 << 37);
        let h = H::from_fields(qhead, qsize, wcnt, reset_id).unwrap();
        let back = H::read_from_bytes(h.as_bytes()).unwrap();
        back == h
            && (h.qhead(), h.qsize(), h.wcnt(), h.reset_id()) == (qhead, qsize, wcnt, reset_id)
    }

    #[quickcheck]
    fn raw_header_round_trip(raw: u64) -> bool {
        let h = H::from_raw(raw);
        H::from_fields(h.qhead(), h.qsize(), h.wcnt(), h.reset_id()) == Ok(h)
    }

    #[quickcheck]
    fn entry_round_trip(exclusive: bool, client: u32, version: u16, ts: u16) -> bool {
        let mode = if exclusive { X } else { S };
        let client = cid(client & ClientId::MAX);
        let e = CqlEntry::new(mode, client, version, CqlTimestamp(ts));
        let back = CqlEntry::read_from_bytes(e.as_bytes()).unwrap();
        back == e
            && (e.mode(), e.client(), e.version(), e.timestamp())
                == (mode, client, version, CqlTimestamp(ts))
            && CqlEntry::from_raw(e.raw()) == e
    }

    #[quickcheck]
    fn timestamp_order_is_antisymmetric(a: u16, b: u16) -> bool {
        let (a, b) = (CqlTimestamp(a), CqlTimestamp(b));
        if a == b {
            !a.is_earlier_than(b)
        } else {
            a.is_earlier_than(b) != b.is_earlier_than(a)
        }
    }

    /// A random sequence of lock operations on one header, each legal for the model: an
    /// acquire adds a client of some mode, a release removes a client of the mode it held.
    #[derive(Debug, Clone)]
    struct Ops(Vec<(bool, bool, u8)>);

    impl Arbitrary for Ops {
        fn arbitrary(g: &mut Gen) -> Self {
            let len = usize::arbitrary(g) % 200;
            Ops((0..len)
                .map(|_| (bool::arbitrary(g), bool::arbitrary(g), u8::arbitrary(g)))
                .collect())
        }
    }

    #[quickcheck]
    fn header_invariants_under_random_faas(ops: Ops, start_head: u32, reset_id: u16) -> bool {
        // Start near the top of qhead so wrap-around is exercised often.
        let start = u64::from(start_head) % (1 << H::QHEAD_BITS);
        let reset_id = u64::from(reset_id);
        let mut h = H::from_fields(start, 0, 0, reset_id).unwrap();
        let (mut readers, mut writers, mut releases) = (0u64, 0u64, 0u64);
        for (acquire, exclusive, _) in ops.0 {
            let size = readers + writers;
            if acquire && size < H::MAX_COUNT {
                let mode = if exclusive { X } else { S };
                let old = h;
                h = h.after_faa(H::enqueue_delta(mode));
                if reset_id == 0 {
                    let acq = old.decode_acquire(mode).unwrap();
                    let waits = (exclusive && size > 0) || writers > 0;
                    if (acq.role == AcquireRole::Waiter) != waits
                        || acq.position.index() != (start + releases + size) % (1 << H::QHEAD_BITS)
                        || acq.overflowed != (size >= EVAL_CAPACITY as u64)
                    {
                        return false;
                    }
                }
                if exclusive {
                    writers += 1
                } else {
                    readers += 1
                }
            } else if size > 0 {
                let mode = if writers > 0 && (exclusive || readers == 0) {
                    X
                } else {
                    S
                };
                let old = h;
                h = h.after_faa(H::dequeue_delta(mode));
                if reset_id == 0 {
                    let rel = old.decode_release(mode).unwrap();
                    if rel.successors.map(|s| s.len) != (size > 1).then_some(size - 1) {
                        return false;
                    }
                }
                if mode == X {
                    writers -= 1
                } else {
                    readers -= 1
                }
                releases += 1;
            }
            let expected_head = (start + releases) % (1 << H::QHEAD_BITS);
            if (h.qhead(), h.qsize(), h.wcnt(), h.reset_id())
                != (expected_head, readers + writers, writers, reset_id)
            {
                return false;
            }
        }
        true
    }
}
