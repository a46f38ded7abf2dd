//! The shared mapping: a sealed memfd mapped read-write and shared, accessed only through
//! 8-byte atomics.
//!
//! ```text
//!  offset 0                64            128              CONTROL_LEN        DATA_OFFSET
//!  +-----------------------+-------------+--   ...   ------+------------------+-------------------+
//!  | header line           | slot 0      | slot 1 ...      | write stripes    | data (the region) |
//!  | magic, version,       | revoked, in | slot S-1        | STRIPES words:   | `len` bytes,      |
//!  | data offset, data len | flight, pid | one line each   | seq << 16 | owner| rounded to a page |
//!  +-----------------------+-------------+--   ...   ------+------------------+-------------------+
//! ```
//!
//! The header and the per-link slots live in the same file as the data so that a CN in
//! another process sees revocations without any message (see [`crate::ShmMemoryNode::revoke`]).
//! The write stripes make a READ a snapshot with respect to WRITEs (see [`crate::ops`]): data
//! line `l` (64 bytes) belongs to stripe `l % STRIPES`.

use std::fs;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{Advice, MapFlags, ProtFlags};

use crate::ShmError;

/// `"dmem-shm"` in ASCII, the first word of every mapping.
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"dmem-shm");
/// Layout version; a CN refuses a mapping of another version.
pub(crate) const LAYOUT_VERSION: u64 = 2;
/// One slot (and the header) per 64-byte line, so that CNs do not share lines.
pub(crate) const LINE: usize = 64;
/// Bytes before the data: the header line and the link slots.
pub(crate) const CONTROL_LEN: usize = 64 * 1024;
/// Link slots per memory node: how many CN contexts can ever be linked to it.
pub const MAX_LINKS: u32 = (CONTROL_LEN / LINE) as u32 - 1;
/// Write stripes: one 8-byte word each, shared by the data lines `STRIPES` apart (256 KiB).
pub(crate) const STRIPES: usize = 4096;
/// Byte offset of the data: after the control lines and the stripe words.
pub(crate) const DATA_OFFSET: usize = CONTROL_LEN + STRIPES * 8;
const PAGE: usize = 4096;
const HUGE_PAGE: usize = 2 * 1024 * 1024;

// Header words (byte offsets from the start of the mapping).
const H_MAGIC: usize = 0;
const H_VERSION: usize = 8;
const H_DATA_OFFSET: usize = 16;
const H_DATA_LEN: usize = 24;
// Slot words (byte offsets from the start of the slot's line).
const S_REVOKED: usize = 0;
const S_IN_FLIGHT: usize = 8;
const S_PID: usize = 16;

/// Which huge-page mechanism backs a mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HugePages {
    /// `memfd_create(MFD_HUGETLB)`: explicit huge pages from the hugetlb pool.
    Hugetlb,
    /// Regular shmem pages with `madvise(MADV_HUGEPAGE)` accepted. Whether the kernel then
    /// backs the mapping with transparent huge pages depends on its shmem policy
    /// ([`shmem_thp_policy`]).
    Madvised,
    /// Regular 4 KiB pages (`madvise` refused), or a regular-page mapping received from
    /// another process (which cannot tell whether the owner's `madvise` was accepted).
    None,
}

/// The kernel's transparent-huge-page policy for shmem (the bracketed word of
/// `/sys/kernel/mm/transparent_hugepage/shmem_enabled`), if readable. With `never` or
/// `deny`, [`HugePages::Madvised`] mappings still use 4 KiB pages.
#[must_use]
pub fn shmem_thp_policy() -> Option<String> {
    let text = fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled").ok()?;
    let start = text.find('[')?;
    let end = text[start..].find(']')? + start;
    Some(text[start + 1..end].to_owned())
}

const fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

/// A shared read-write mapping of a whole sealed memfd.
///
/// Invariants, relied on by every `unsafe` block of this crate:
/// - `ptr` is the start of a live `MAP_SHARED` mapping of `len` bytes, page aligned, that is
///   unmapped only in `Drop`;
/// - the file was sealed with `F_SEAL_SHRINK` before it was mapped (checked on both the
///   creating and the receiving side), so no process can truncate it and turn an access
///   into `SIGBUS`;
/// - every access to the mapping, in this process, is an 8-byte aligned [`AtomicU64`]
///   operation made through [`Mapping::word`]: no plain loads or stores, no references to
///   bytes, and no atomics of other sizes (racing mixed-size atomics are not allowed by
///   Rust's memory model).
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
    huge: HugePages,
    /// The header's data offset and length, copied once checked: another process can write
    /// the shared header, so it is never trusted again after the mapping is set up.
    data_offset: usize,
    data_len: u64,
}

// SAFETY: `Mapping` holds a raw pointer to memory that is shared by design. Moving it to
// another thread moves nothing but the pointer; the memory stays mapped until `Drop`.
unsafe impl Send for Mapping {}
// SAFETY: the only access path to the memory through `&Mapping` is `word`, which hands out
// `&AtomicU64`; atomics are `Sync`, and every access through them is a data-race-free atomic
// operation of one size (8 bytes), so sharing `&Mapping` between threads is fine.
unsafe impl Sync for Mapping {}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapping")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("huge", &self.huge)
            .finish()
    }
}

impl Mapping {
    /// Creates a memfd with a header and `data_len` zeroed data bytes, seals its size and maps
    /// it. Tries `MFD_HUGETLB` first, then regular pages with `MADV_HUGEPAGE`.
    pub(crate) fn create(name: &str, data_len: u64) -> Result<Self, ShmError> {
        let data_len_usize = usize::try_from(data_len)
            .ok()
            .filter(|l| l.checked_add(DATA_OFFSET + HUGE_PAGE).is_some())
            .ok_or(ShmError::TooLarge { len: data_len })?;
        let total = DATA_OFFSET + round_up(data_len_usize, PAGE);
        let mut mapping = match Self::create_with(name, round_up(total, HUGE_PAGE), true) {
            Ok(m) => m,
            Err(_) => Self::create_with(name, total, false)?,
        };
        mapping.word(H_MAGIC).store(MAGIC, Ordering::Relaxed);
        mapping
            .word(H_VERSION)
            .store(LAYOUT_VERSION, Ordering::Relaxed);
        mapping
            .word(H_DATA_OFFSET)
            .store(DATA_OFFSET as u64, Ordering::Relaxed);
        mapping.word(H_DATA_LEN).store(data_len, Ordering::Release);
        mapping.data_offset = DATA_OFFSET;
        mapping.data_len = data_len;
        Ok(mapping)
    }

    fn create_with(name: &str, size: usize, hugetlb: bool) -> Result<Self, ShmError> {
        let mut flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
        if hugetlb {
            flags |= MemfdFlags::HUGETLB;
        }
        let fd = rustix::fs::memfd_create(name, flags).map_err(ShmError::os("memfd_create"))?;
        rustix::fs::ftruncate(&fd, size as u64).map_err(ShmError::os("ftruncate"))?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(ShmError::os("fcntl(F_ADD_SEALS)"))?;
        let ptr = Self::map(&fd, size)?;
        let huge = if hugetlb {
            HugePages::Hugetlb
        } else {
            // SAFETY: `ptr..ptr + size` is the mapping just created; advice does not change
            // its contents or validity, only how the kernel backs it.
            match unsafe { rustix::mm::madvise(ptr.as_ptr().cast(), size, Advice::LinuxHugepage) } {
                Ok(()) => HugePages::Madvised,
                Err(_) => HugePages::None,
            }
        };
        Ok(Self {
            ptr,
            len: size,
            fd,
            huge,
            data_offset: 0,
            data_len: 0,
        })
    }

    /// Maps a memfd received from the memory node's process, after checking that its size is
    /// sealed and that it holds a dmem-shm header.
    pub(crate) fn from_received_fd(fd: OwnedFd, hugetlb: bool) -> Result<Self, ShmError> {
        let seals = rustix::fs::fcntl_get_seals(&fd).map_err(ShmError::os("fcntl(F_GET_SEALS)"))?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(ShmError::Handshake(
                "the received memfd is not sealed against shrinking".into(),
            ));
        }
        let stat = rustix::fs::fstat(&fd).map_err(ShmError::os("fstat"))?;
        let size = usize::try_from(stat.st_size)
            .ok()
            .filter(|&s| s >= DATA_OFFSET && s.is_multiple_of(PAGE))
            .ok_or_else(|| {
                ShmError::Handshake(format!(
                    "the received memfd has an unusable size of {} bytes",
                    stat.st_size
                ))
            })?;
        let ptr = Self::map(&fd, size)?;
        let mut mapping = Self {
            ptr,
            len: size,
            fd,
            huge: if hugetlb {
                HugePages::Hugetlb
            } else {
                HugePages::None
            },
            data_offset: 0,
            data_len: 0,
        };
        let data_offset = mapping.word(H_DATA_OFFSET).load(Ordering::Relaxed);
        let data_len = mapping.word(H_DATA_LEN).load(Ordering::Relaxed);
        if mapping.word(H_MAGIC).load(Ordering::Acquire) != MAGIC
            || mapping.word(H_VERSION).load(Ordering::Relaxed) != LAYOUT_VERSION
            || data_offset != DATA_OFFSET as u64
            || data_len > (size - DATA_OFFSET) as u64
        {
            return Err(ShmError::Handshake(
                "the received memfd does not hold a dmem-shm region of this layout version".into(),
            ));
        }
        mapping.data_offset = DATA_OFFSET;
        mapping.data_len = data_len;
        Ok(mapping)
    }

    fn map(fd: &OwnedFd, size: usize) -> Result<NonNull<u8>, ShmError> {
        // SAFETY: a null hint lets the kernel choose a fresh range, so no existing memory (and
        // no Rust reference) is affected. The result is owned by the `Mapping` built from it.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                size,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )
        }
        .map_err(ShmError::os("mmap"))?;
        NonNull::new(ptr.cast::<u8>()).ok_or(ShmError::Os {
            call: "mmap",
            source: std::io::Error::other("mmap returned null"),
        })
    }

    /// The 8-byte word at byte `offset` of the mapping.
    ///
    /// # Panics
    /// If `offset` is not 8-byte aligned or the word is not inside the mapping (callers
    /// check bounds first; a panic here is a bug in this crate).
    #[inline]
    pub(crate) fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(
            offset.is_multiple_of(8) && offset.checked_add(8).is_some_and(|end| end <= self.len),
            "word at {offset:#x} outside a mapping of {:#x} bytes",
            self.len
        );
        // SAFETY: (1) valid: `offset + 8 <= len`, and `ptr..ptr + len` stays mapped for as
        // long as `self` lives (unmapped only in `Drop`; the file cannot shrink because it is
        // sealed), which bounds the returned lifetime. (2) aligned: `ptr` is page aligned and
        // `offset` is a multiple of 8. (3) no data race: every access to this memory from this
        // process goes through `AtomicU64`s handed out here, never through plain loads,
        // stores, byte references or atomics of another size; other processes map it with
        // this same code. Accesses from other processes are outside Rust's abstract machine;
        // the hardware keeps same-address atomic accesses coherent across processes.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(offset).cast::<u64>()) }
    }

    /// The first byte of the data (the region): valid for [`data_len`](Self::data_len)
    /// bytes while `self` lives.
    #[cfg(feature = "rdma")]
    pub(crate) fn data_ptr(&self) -> std::ptr::NonNull<u8> {
        // SAFETY: `data_offset` was checked to lie inside the mapping when it was set up, so
        // the sum stays inside the same mapped object and is not null.
        unsafe { self.ptr.add(self.data_offset) }
    }

    /// Byte offset of the data (the region) inside the mapping.
    pub(crate) fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// Length of the region in bytes (as created, before page rounding).
    pub(crate) fn data_len(&self) -> u64 {
        self.data_len
    }

    /// The write-stripe word of the data line holding mapping offset `offset` (a data
    /// offset, at or after [`Mapping::data_offset`]).
    #[inline]
    pub(crate) fn stripe(&self, offset: usize) -> &AtomicU64 {
        let line = (offset - self.data_offset) / LINE;
        self.stripe_word(line % STRIPES)
    }

    /// Write-stripe word number `stripe` (`< STRIPES`).
    #[inline]
    pub(crate) fn stripe_word(&self, stripe: usize) -> &AtomicU64 {
        self.word(CONTROL_LEN + stripe * 8)
    }

    /// The revoked word of link slot `slot`.
    pub(crate) fn slot_revoked(&self, slot: u32) -> &AtomicU64 {
        self.word(Self::slot_line(slot) + S_REVOKED)
    }

    /// The in-flight counter of link slot `slot`.
    pub(crate) fn slot_in_flight(&self, slot: u32) -> &AtomicU64 {
        self.word(Self::slot_line(slot) + S_IN_FLIGHT)
    }

    /// The id of the process that uses link slot `slot` (0 until it records itself), so
    /// that a stripe held by a killed process can be taken back (see `crate::ops`).
    pub(crate) fn slot_pid(&self, slot: u32) -> &AtomicU64 {
        self.word(Self::slot_line(slot) + S_PID)
    }

    fn slot_line(slot: u32) -> usize {
        assert!(slot < MAX_LINKS, "link slot {slot} out of range");
        LINE * (1 + slot as usize)
    }

    /// The huge-page mechanism in use.
    pub(crate) fn huge_pages(&self) -> HugePages {
        self.huge
    }

    /// Length of the whole mapping in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The memfd, to pass to another process.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe the mapping created in `map`, and `&mut self` proves
        // no `&AtomicU64` from `word` is still alive (they borrow `self`). Nothing else in this
        // process points into it.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
