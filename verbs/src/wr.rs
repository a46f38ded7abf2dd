//! Work requests, post lists and their outcomes.

use alloc::vec::Vec;

use smallvec::SmallVec;

use crate::{Endpoint, RemoteAddr, VerbsError};

/// What a one-sided work request does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Read `len` bytes at `addr` into a local buffer.
    Read {
        /// Source address.
        addr: RemoteAddr,
        /// Bytes to read.
        len: u32,
    },
    /// Write `data` at `addr`. Small payloads go inline in the work-queue entry (the
    /// backend decides by its inline threshold).
    Write {
        /// Destination address.
        addr: RemoteAddr,
        /// Bytes to write.
        data: Vec<u8>,
    },
    /// Compare the 8-byte word at `addr` with `expect`; if equal, store `swap`. Returns the
    /// old value.
    Cas {
        /// Address of the word (8-byte aligned).
        addr: RemoteAddr,
        /// Value the word must hold for the swap to happen.
        expect: u64,
        /// Value stored if it does.
        swap: u64,
    },
    /// Add `add` (wrapping) to the 8-byte word at `addr`. Returns the old value.
    Faa {
        /// Address of the word (8-byte aligned).
        addr: RemoteAddr,
        /// Amount added.
        add: u64,
    },
}

/// The kind of an [`Op`], for statistics and cost models.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OpKind {
    /// RDMA READ.
    Read,
    /// RDMA WRITE.
    Write,
    /// RDMA compare-and-swap.
    Cas,
    /// RDMA fetch-and-add.
    Faa,
}

impl OpKind {
    /// Every kind, in a fixed order (for tables).
    pub const ALL: [OpKind; 4] = [OpKind::Read, OpKind::Write, OpKind::Cas, OpKind::Faa];

    /// Whether the responder executes it in its atomic unit.
    #[must_use]
    #[inline]
    pub const fn is_atomic(self) -> bool {
        matches!(self, OpKind::Cas | OpKind::Faa)
    }

    /// Lower-case name (`read`, `write`, `cas`, `faa`).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            OpKind::Read => "read",
            OpKind::Write => "write",
            OpKind::Cas => "cas",
            OpKind::Faa => "faa",
        }
    }
}

impl Op {
    /// The kind of this op.
    #[must_use]
    #[inline]
    pub const fn kind(&self) -> OpKind {
        match self {
            Op::Read { .. } => OpKind::Read,
            Op::Write { .. } => OpKind::Write,
            Op::Cas { .. } => OpKind::Cas,
            Op::Faa { .. } => OpKind::Faa,
        }
    }

    /// The remote address it targets.
    #[must_use]
    #[inline]
    pub const fn addr(&self) -> RemoteAddr {
        match self {
            Op::Read { addr, .. }
            | Op::Write { addr, .. }
            | Op::Cas { addr, .. }
            | Op::Faa { addr, .. } => *addr,
        }
    }

    /// Bytes of remote memory it touches.
    #[must_use]
    #[inline]
    pub fn remote_len(&self) -> u64 {
        match self {
            Op::Read { len, .. } => u64::from(*len),
            Op::Write { data, .. } => data.len() as u64,
            Op::Cas { .. } | Op::Faa { .. } => 8,
        }
    }
}

/// One work request of a [`PostList`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkRequest {
    /// What it does.
    pub op: Op,
    /// Whether it produces a completion-queue entry. Errors always do.
    pub signaled: bool,
}

/// Names a work request inside the [`PostList`] that created it, and its outcome in the
/// [`BatchResult`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WrId(pub usize);

/// Work requests posted together: one doorbell per destination queue pair.
///
/// By default only the last work request to each destination node is signaled (selective
/// signaling); [`signal`](PostList::signal) and
/// [`signal_all`](PostList::signal_all) change that.
///
/// A list of one work request (most posts: a single READ, WRITE or atomic) is stored inline
/// and allocates nothing; longer lists live on the heap as a `Vec` would.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PostList {
    wrs: SmallVec<[WorkRequest; 1]>,
    signal_all: bool,
}

/// The checked work requests of a [`PostList`] ([`PostList::finish_inline`]), stored inline
/// when there is one, so that a backend can post a single work request without allocating.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkRequests(SmallVec<[WorkRequest; 1]>);

impl WorkRequests {
    /// The work requests as a `Vec` (allocates when there is only one).
    #[must_use]
    #[inline]
    pub fn into_vec(self) -> Vec<WorkRequest> {
        self.0.into_vec()
    }
}

impl core::ops::Deref for WorkRequests {
    type Target = [WorkRequest];

    #[inline]
    fn deref(&self) -> &[WorkRequest] {
        &self.0
    }
}

impl PostList {
    /// An empty list.
    #[must_use]
    #[inline]
    pub const fn new() -> Self {
        Self {
            wrs: SmallVec::new_const(),
            signal_all: false,
        }
    }

    /// An empty list with room for `n` work requests.
    #[must_use]
    #[inline]
    pub fn with_capacity(n: usize) -> Self {
        Self {
            // Room for one is inline already (and `SmallVec::with_capacity` costs a call).
            wrs: if n <= 1 {
                SmallVec::new_const()
            } else {
                SmallVec::with_capacity(n)
            },
            signal_all: false,
        }
    }

    #[inline]
    fn push(&mut self, op: Op) -> WrId {
        self.wrs.push(WorkRequest {
            op,
            signaled: false,
        });
        WrId(self.wrs.len() - 1)
    }

    /// Appends a READ of `len` bytes at `addr`.
    #[inline]
    pub fn read(&mut self, addr: RemoteAddr, len: u32) -> WrId {
        self.push(Op::Read { addr, len })
    }

    /// Appends a WRITE of `data` at `addr`.
    #[inline]
    pub fn write(&mut self, addr: RemoteAddr, data: &[u8]) -> WrId {
        self.push(Op::Write {
            addr,
            data: data.to_vec(),
        })
    }

    /// Appends a WRITE that takes ownership of `data` (no copy).
    #[inline]
    pub fn write_owned(&mut self, addr: RemoteAddr, data: Vec<u8>) -> WrId {
        self.push(Op::Write { addr, data })
    }

    /// Appends a compare-and-swap.
    #[inline]
    pub fn cas(&mut self, addr: RemoteAddr, expect: u64, swap: u64) -> WrId {
        self.push(Op::Cas { addr, expect, swap })
    }

    /// Appends a fetch-and-add.
    #[inline]
    pub fn faa(&mut self, addr: RemoteAddr, add: u64) -> WrId {
        self.push(Op::Faa { addr, add })
    }

    /// Marks work request `id` signaled.
    pub fn signal(&mut self, id: WrId) {
        if let Some(wr) = self.wrs.get_mut(id.0) {
            wr.signaled = true;
        }
    }

    /// Signals every work request (no selective signaling).
    pub fn signal_all(&mut self) {
        self.signal_all = true;
    }

    /// Number of work requests.
    #[must_use]
    #[inline]
    pub fn len(&self) -> usize {
        self.wrs.len()
    }

    /// Whether the list is empty.
    #[must_use]
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.wrs.is_empty()
    }

    /// Checks the list and fixes its signaling, as every backend does before posting:
    /// refuses an empty list and misaligned atomics, and signals the last work request to
    /// each destination node (plus all of them under [`signal_all`](PostList::signal_all)).
    ///
    /// # Errors
    /// [`VerbsError::EmptyPostList`] or [`VerbsError::Misaligned`]; nothing is posted then.
    pub fn finish(self) -> Result<Vec<WorkRequest>, VerbsError> {
        self.finish_inline().map(WorkRequests::into_vec)
    }

    /// [`finish`](PostList::finish) without moving the work requests to a `Vec`: a list of
    /// one stays inline (for backends that post from it directly).
    ///
    /// # Errors
    /// As [`finish`](PostList::finish).
    #[inline]
    pub fn finish_inline(mut self) -> Result<WorkRequests, VerbsError> {
        // A list of one (most posts): its work request is the last to its node, so signaled.
        // Inlined into the backend's post, where the list is moved once instead of into a
        // call and out again.
        if let [wr] = &mut self.wrs[..] {
            let addr = wr.op.addr();
            if wr.op.kind().is_atomic() && addr.offset % 8 != 0 {
                return Err(VerbsError::Misaligned { index: 0, addr });
            }
            wr.signaled = true;
            return Ok(WorkRequests(self.wrs));
        }
        self.finish_many()
    }

    /// [`finish_inline`](PostList::finish_inline) of a list of any other length.
    fn finish_many(mut self) -> Result<WorkRequests, VerbsError> {
        let signal_all = self.signal_all;
        // One slice for the checks: indexing the inline vector itself branches on every access.
        let wrs: &mut [WorkRequest] = &mut self.wrs;
        if wrs.is_empty() {
            return Err(VerbsError::EmptyPostList);
        }
        for (index, wr) in wrs.iter().enumerate() {
            if wr.op.kind().is_atomic() && wr.op.addr().offset % 8 != 0 {
                return Err(VerbsError::Misaligned {
                    index,
                    addr: wr.op.addr(),
                });
            }
        }
        for i in 0..wrs.len() {
            let (head, later) = wrs.split_at_mut(i + 1);
            let wr = &mut head[i];
            let node = wr.op.addr().node;
            if signal_all || later.iter().all(|w| w.op.addr().node != node) {
                wr.signaled = true;
            }
        }
        Ok(WorkRequests(self.wrs))
    }
}

/// READ results up to this many bytes are stored inline in their [`ReadBytes`] (a cache
/// line: most single READs of a key-value item, a lock word or a slot).
pub const READ_INLINE_BYTES: usize = 64;

/// The bytes a READ fetched: inline up to [`READ_INLINE_BYTES`], on the heap beyond, so that
/// a small READ's result costs no allocation. Dereferences to `[u8]`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ReadBytes(SmallVec<[u8; READ_INLINE_BYTES]>);

impl ReadBytes {
    /// A copy of `bytes` (no allocation up to [`READ_INLINE_BYTES`]).
    #[must_use]
    #[inline]
    pub fn from_slice(bytes: &[u8]) -> Self {
        // A whole line (the usual READ) is copied as a fixed-size array, without the call
        // to `memcpy` that a copy of unknown length makes.
        if let Ok(line) = <[u8; READ_INLINE_BYTES]>::try_from(bytes) {
            return Self(SmallVec::from_buf(line));
        }
        Self(SmallVec::from_slice(bytes))
    }

    /// `len` zero bytes, to be filled in place (no allocation up to [`READ_INLINE_BYTES`]).
    #[must_use]
    #[inline]
    pub fn zeroed(len: usize) -> Self {
        Self(SmallVec::from_elem(0, len))
    }

    /// The bytes as a `Vec` (allocates when they are inline).
    #[must_use]
    #[inline]
    pub fn into_vec(self) -> Vec<u8> {
        self.0.into_vec()
    }

    /// Whether the bytes are stored inline (no heap allocation).
    #[must_use]
    #[inline]
    pub fn is_inline(&self) -> bool {
        !self.0.spilled()
    }
}

impl From<Vec<u8>> for ReadBytes {
    /// Takes the vector's buffer, or copies its bytes inline when its capacity is small.
    #[inline]
    fn from(bytes: Vec<u8>) -> Self {
        Self(SmallVec::from_vec(bytes))
    }
}

impl From<&[u8]> for ReadBytes {
    #[inline]
    fn from(bytes: &[u8]) -> Self {
        Self::from_slice(bytes)
    }
}

impl core::ops::Deref for ReadBytes {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl core::ops::DerefMut for ReadBytes {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

impl AsRef<[u8]> for ReadBytes {
    #[inline]
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl core::fmt::Debug for ReadBytes {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Debug::fmt(&*self.0, f)
    }
}

/// What one work request returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WrOutcome {
    /// The bytes a READ fetched.
    Bytes(ReadBytes),
    /// The old value an atomic returned.
    Atomic(u64),
    /// A WRITE completed.
    Written,
}

/// The outcomes of a posted [`PostList`], indexed by [`WrId`]. The outcome of a list of one
/// is stored inline (no allocation). The default is empty (for a backend to move a result
/// out of its slot cheaply).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchResult {
    outcomes: SmallVec<[WrOutcome; 1]>,
}

impl BatchResult {
    /// Wraps the outcomes, in post-list order (for backends).
    #[must_use]
    #[inline]
    pub fn new(outcomes: Vec<WrOutcome>) -> Self {
        Self {
            outcomes: SmallVec::from_vec(outcomes),
        }
    }

    /// `n` outcomes, all [`WrOutcome::Written`], for a backend to [`set`](BatchResult::set)
    /// as the work requests complete (inline when `n` is 1).
    #[must_use]
    #[inline]
    pub fn written(n: usize) -> Self {
        let outcomes = if n == 1 {
            SmallVec::from_buf([WrOutcome::Written])
        } else {
            let mut outcomes = SmallVec::with_capacity(n);
            outcomes.resize_with(n, || WrOutcome::Written);
            outcomes
        };
        Self { outcomes }
    }

    /// Sets the outcome of work request `id` (for backends).
    ///
    /// # Panics
    /// If `id` is out of range.
    #[inline]
    pub fn set(&mut self, id: WrId, outcome: WrOutcome) {
        self.outcomes[id.0] = outcome;
    }

    /// The outcome of work request `id`.
    ///
    /// # Panics
    /// If `id` did not come from the list this result belongs to.
    #[must_use]
    #[inline]
    pub fn outcome(&self, id: WrId) -> &WrOutcome {
        &self.outcomes[id.0]
    }

    /// The bytes READ `id` fetched.
    ///
    /// # Panics
    /// If `id` is not a READ of this list.
    #[must_use]
    #[inline]
    pub fn bytes(&self, id: WrId) -> &[u8] {
        match &self.outcomes[id.0] {
            WrOutcome::Bytes(b) => b,
            other => panic!("work request {} is not a READ: {other:?}", id.0),
        }
    }

    /// Takes the bytes READ `id` fetched, leaving an empty buffer. Bytes stored inline
    /// (up to [`READ_INLINE_BYTES`]) are copied into a new `Vec`; to parse them in place,
    /// [`bytes`](BatchResult::bytes) borrows them.
    ///
    /// # Panics
    /// If `id` is not a READ of this list.
    #[must_use]
    #[inline]
    pub fn take_bytes(&mut self, id: WrId) -> Vec<u8> {
        match &mut self.outcomes[id.0] {
            WrOutcome::Bytes(b) => core::mem::take(b).into_vec(),
            other => panic!("work request {} is not a READ: {other:?}", id.0),
        }
    }

    /// The old value atomic `id` returned.
    ///
    /// # Panics
    /// If `id` is not a CAS or FAA of this list.
    #[must_use]
    #[inline]
    pub fn atomic(&self, id: WrId) -> u64 {
        match &self.outcomes[id.0] {
            WrOutcome::Atomic(v) => *v,
            other => panic!("work request {} is not an atomic: {other:?}", id.0),
        }
    }

    /// Number of outcomes.
    #[must_use]
    #[inline]
    pub fn len(&self) -> usize {
        self.outcomes.len()
    }

    /// Whether there are none.
    #[must_use]
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.outcomes.is_empty()
    }
}

/// A two-sided message as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Who sent it.
    pub from: Endpoint,
    /// Its payload.
    pub payload: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NodeId, RKey};

    fn at(node: u16, offset: u64) -> RemoteAddr {
        RemoteAddr {
            node: NodeId(node),
            rkey: RKey(1),
            offset,
        }
    }

    #[test]
    fn last_wr_per_destination_is_signaled() {
        let mut list = PostList::new();
        list.cas(at(0, 0), 0, 1);
        list.read(at(0, 64), 64);
        list.read(at(1, 0), 8);
        list.write(at(0, 128), &[1, 2, 3]);
        let wrs = list.finish().unwrap();
        let signaled: Vec<bool> = wrs.iter().map(|w| w.signaled).collect();
        assert_eq!(signaled, [false, false, true, true]);
    }

    #[test]
    fn signal_all_and_explicit_signal() {
        let mut list = PostList::new();
        let first = list.read(at(0, 0), 8);
        list.read(at(0, 8), 8);
        list.signal(first);
        assert!(list.clone().finish().unwrap().iter().all(|w| w.signaled));
        list.read(at(0, 16), 8);
        let wrs = list.clone().finish().unwrap();
        assert_eq!(wrs.iter().filter(|w| w.signaled).count(), 2);
        list.signal_all();
        assert!(list.finish().unwrap().iter().all(|w| w.signaled));
    }

    #[test]
    fn inline_and_vec_forms_agree() {
        let mut one = PostList::new();
        one.read(at(0, 0), 8);
        let inline = one.clone().finish_inline().unwrap();
        assert_eq!(&*inline, &one.clone().finish().unwrap()[..]);
        assert!(inline[0].signaled);
        let mut many = PostList::with_capacity(3);
        for i in 0..3 {
            many.read(at(0, 8 * i), 8);
        }
        assert_eq!(
            many.clone().finish_inline().unwrap().into_vec(),
            many.finish().unwrap()
        );
        let mut result = BatchResult::written(2);
        result.set(WrId(1), WrOutcome::Atomic(5));
        assert_eq!(
            result,
            BatchResult::new(vec![WrOutcome::Written, WrOutcome::Atomic(5)])
        );
        assert_eq!(result.atomic(WrId(1)), 5);
    }

    #[test]
    fn read_bytes_inline_up_to_a_line_and_on_the_heap_beyond() {
        for len in [0usize, 8, READ_INLINE_BYTES, READ_INLINE_BYTES + 1, 4096] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let read = ReadBytes::from_slice(&bytes);
            assert_eq!(&*read, &bytes[..]);
            assert_eq!(read.is_inline(), len <= READ_INLINE_BYTES, "{len} bytes");
            assert_eq!(ReadBytes::from(bytes.clone()), read);
            assert_eq!(format!("{read:?}"), format!("{bytes:?}"));
            let mut zeroed = ReadBytes::zeroed(len);
            zeroed.copy_from_slice(&bytes);
            assert_eq!(zeroed, read);
            let mut result = BatchResult::written(2);
            result.set(WrId(1), WrOutcome::Bytes(read.clone()));
            assert_eq!(result.bytes(WrId(1)), &bytes[..]);
            assert_eq!(result.take_bytes(WrId(1)), bytes);
            assert!(result.bytes(WrId(1)).is_empty());
            assert_eq!(read.into_vec(), bytes);
        }
    }

    #[test]
    fn single_misaligned_atomic_is_refused() {
        let mut list = PostList::new();
        list.cas(at(0, 4), 0, 1);
        assert_eq!(
            list.finish_inline(),
            Err(VerbsError::Misaligned {
                index: 0,
                addr: at(0, 4)
            })
        );
        let mut list = PostList::new();
        list.read(at(0, 4), 8);
        assert!(list.finish_inline().unwrap()[0].signaled);
    }

    #[test]
    fn misaligned_atomic_and_empty_list_are_refused() {
        assert_eq!(PostList::new().finish(), Err(VerbsError::EmptyPostList));
        let mut list = PostList::new();
        list.read(at(0, 3), 8);
        list.faa(at(0, 12), 1);
        assert_eq!(
            list.finish(),
            Err(VerbsError::Misaligned {
                index: 1,
                addr: at(0, 12)
            })
        );
    }

    #[test]
    fn region_bounds() {
        let mr = crate::MemoryRegion {
            node: NodeId(2),
            rkey: RKey(7),
            len: 4096,
        };
        assert_eq!(mr.at(4095).unwrap().offset, 4095);
        assert!(mr.at(4096).is_none());
        assert!(mr.contains(4088, 8));
        assert!(!mr.contains(4089, 8));
        assert!(!mr.contains(u64::MAX, 2));
    }
}
