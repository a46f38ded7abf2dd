//! Big zeroed arrays for the bucket index, on 2 MiB pages where the OS gives them.
//!
//! A memory-resident table is limited by TLB misses as much as by cache misses: with 4 KiB
//! pages a random access over gigabytes costs a page walk on top of the line fill
//! (the `limit` row of `dmem bench hashtable` shows it next to every table). With the `std` feature on Linux,
//! arrays of at least [`HUGE_PAGE`] bytes are mapped with `mmap`, aligned to 2 MiB and
//! advised with `madvise(MADV_HUGEPAGE)`; the kernel then backs them with transparent huge
//! pages when its policy (`/sys/kernel/mm/transparent_hugepage/enabled`) allows.

#[cfg(not(loom))]
use alloc::alloc::{Layout, alloc_zeroed, dealloc, handle_alloc_error};
use core::ptr::NonNull;

/// The size of an x86-64 huge page: 2 MiB.
pub const HUGE_PAGE: usize = 2 << 20;

/// Overflow pools smaller than this are mapped with 4 KiB pages (see `Region::new_pool`).
#[cfg(all(feature = "std", target_os = "linux", not(loom)))]
pub(crate) const POOL_HUGE_MIN: usize = 16 * HUGE_PAGE;

/// How the memory of an array was obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageKind {
    /// The global allocator (small arrays, `no_std`, or huge pages not requested).
    Heap,
    /// An anonymous mapping with 4 KiB pages (huge pages requested but refused by `madvise`).
    Small,
    /// An anonymous mapping advised with `MADV_HUGEPAGE`; whether the kernel really used huge
    /// pages shows in `AnonHugePages` of `/proc/self/smaps_rollup`.
    HugeAdvised,
}

impl PageKind {
    /// A short name for reports: `heap`, `4k-mmap` or `thp-advised`.
    pub fn name(self) -> &'static str {
        match self {
            PageKind::Heap => "heap",
            PageKind::Small => "4k-mmap",
            PageKind::HugeAdvised => "thp-advised",
        }
    }
}

/// Types whose all-zero bit pattern is a valid value (buckets made of atomics).
///
/// # Safety
/// An all-zero byte pattern must be a valid, initialised value of the type, equal to
/// `Default::default()` (which is what the loom build constructs instead).
pub(crate) unsafe trait Zeroable: Default {}

/// An owned array of `len` zero-initialised `T`, 64-byte aligned.
pub(crate) struct Region<T> {
    ptr: NonNull<T>,
    len: usize,
    kind: PageKind,
    /// Bytes actually reserved (a mapping is rounded up to whole huge pages).
    reserved: usize,
}

// SAFETY: a Region owns its elements like a `Box<[T]>`; sending it sends the `T`s.
unsafe impl<T: Send> Send for Region<T> {}
// SAFETY: shared access only hands out `&T`, as `&Box<[T]>` does.
unsafe impl<T: Sync> Sync for Region<T> {}

impl<T: Zeroable> Region<T> {
    /// A zeroed array of `len >= 1` elements; on huge pages when `huge` and large enough.
    #[cfg(not(loom))]
    pub(crate) fn new(len: usize, huge: bool) -> Self {
        assert!(len > 0 && size_of::<T>() > 0, "Region of zero bytes");
        let bytes = len
            .checked_mul(size_of::<T>())
            .expect("hashtable size overflows usize");
        #[cfg(all(feature = "std", target_os = "linux"))]
        if huge
            && bytes >= HUGE_PAGE
            && let Some(r) = Self::mapped(len, bytes, true)
        {
            return r;
        }
        let _ = huge;
        let layout = Layout::from_size_align(bytes, 64.max(align_of::<T>()))
            .expect("hashtable size overflows a Layout");
        // SAFETY: `layout` has a non-zero size (len > 0 and T is not zero-sized).
        let raw = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw.cast::<T>()) else {
            handle_alloc_error(layout)
        };
        Region {
            ptr,
            len,
            kind: PageKind::Heap,
            reserved: bytes,
        }
    }

    /// A zeroed overflow pool of `len >= 1` elements. Only a prefix of a pool is ever used
    /// (buckets are handed out in order), and the kernel backs a huge-page mapping 2 MiB at a
    /// time: a pool smaller than [`POOL_HUGE_MIN`] bytes would be mostly one partly used huge
    /// page (2 B per key of a 1M-key table), so it is mapped with 4 KiB pages instead, where
    /// pages nobody touched stay virtual as well. Larger pools get huge pages as `new` does.
    #[cfg(not(loom))]
    pub(crate) fn new_pool(len: usize, huge: bool) -> Self {
        #[cfg(all(feature = "std", target_os = "linux"))]
        {
            let bytes = len
                .checked_mul(size_of::<T>())
                .expect("hashtable size overflows usize");
            if huge
                && bytes >= HUGE_PAGE
                && let Some(r) = Self::mapped(len, bytes, bytes >= POOL_HUGE_MIN)
            {
                return r;
            }
        }
        Self::new(len, huge)
    }

    /// Under loom, as `new`.
    #[cfg(loom)]
    pub(crate) fn new_pool(len: usize, huge: bool) -> Self {
        Self::new(len, huge)
    }

    /// Under loom the atomics carry model state and must be constructed, not zeroed.
    #[cfg(loom)]
    pub(crate) fn new(len: usize, _huge: bool) -> Self {
        assert!(len > 0, "Region of zero elements");
        let mut v = alloc::vec::Vec::with_capacity(len);
        v.resize_with(len, T::default);
        let boxed = v.into_boxed_slice();
        let ptr = NonNull::new(alloc::boxed::Box::into_raw(boxed).cast::<T>())
            .expect("Box pointers are non-null");
        Region {
            ptr,
            len,
            kind: PageKind::Heap,
            reserved: len * size_of::<T>(),
        }
    }

    /// An anonymous mapping aligned to 2 MiB, advised for transparent huge pages if `advise`.
    #[cfg(all(feature = "std", target_os = "linux", not(loom)))]
    fn mapped(len: usize, bytes: usize, advise: bool) -> Option<Self> {
        let size = bytes.checked_next_multiple_of(HUGE_PAGE)?;
        let map_len = size.checked_add(HUGE_PAGE)?;
        // SAFETY: an anonymous private mapping at an address the kernel chooses touches no
        // existing memory; the result is checked against MAP_FAILED below.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        let base = p as usize;
        let start = base.next_multiple_of(HUGE_PAGE);
        let head = start - base;
        let tail = map_len - head - size;
        // SAFETY: [base, start) and [start + size, base + map_len) lie inside the mapping we
        // just created and nothing refers to them; unmapping them keeps [start, start + size).
        unsafe {
            if head > 0 {
                libc::munmap(p, head);
            }
            if tail > 0 {
                libc::munmap((start + size) as *mut libc::c_void, tail);
            }
        }
        // SAFETY: [start, start + size) is our mapping; MADV_HUGEPAGE only changes how the
        // kernel backs it, never its contents (fresh anonymous memory reads as zero).
        let advised = advise
            && unsafe { libc::madvise(start as *mut libc::c_void, size, libc::MADV_HUGEPAGE) } == 0;
        Some(Region {
            ptr: NonNull::new(start as *mut T)?,
            len,
            kind: if advised {
                PageKind::HugeAdvised
            } else {
                PageKind::Small
            },
            reserved: size,
        })
    }
}

impl<T> Region<T> {
    /// The elements.
    #[inline(always)]
    pub(crate) fn as_slice(&self) -> &[T] {
        // SAFETY: `ptr` points to `len` initialised `T`s (zeroed, valid by `Zeroable`, or
        // constructed under loom) that live as long as `self`.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The number of elements.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// How the memory was obtained.
    pub(crate) fn kind(&self) -> PageKind {
        self.kind
    }

    /// Bytes reserved for the array, including rounding to whole huge pages.
    pub(crate) fn reserved_bytes(&self) -> usize {
        self.reserved
    }
}

impl<T> Drop for Region<T> {
    fn drop(&mut self) {
        // The element types hold only atomics of plain integers: nothing to drop per element.
        #[cfg(loom)]
        {
            // SAFETY: under loom the memory came from `Box<[T]>::into_raw` with this length.
            drop(unsafe {
                alloc::boxed::Box::from_raw(core::ptr::slice_from_raw_parts_mut(
                    self.ptr.as_ptr(),
                    self.len,
                ))
            });
        }
        #[cfg(not(loom))]
        match self.kind {
            PageKind::Heap => {
                let layout = Layout::from_size_align(self.reserved, 64.max(align_of::<T>()))
                    .expect("layout");
                // SAFETY: allocated in `new` with exactly this layout.
                unsafe { dealloc(self.ptr.as_ptr().cast(), layout) }
            }
            PageKind::Small | PageKind::HugeAdvised => {
                #[cfg(all(feature = "std", target_os = "linux"))]
                // SAFETY: [ptr, ptr + reserved) is the mapping `mapped` kept; nothing refers
                // to it any more because `self` is being dropped.
                unsafe {
                    libc::munmap(self.ptr.as_ptr().cast(), self.reserved);
                }
            }
        }
    }
}

/// A zeroed array of `u64` on the same kind of pages as the table: the operand of the
/// "physical limit" measurement (random independent loads with prefetch batching).
#[cfg(not(loom))]
pub struct WordArray {
    region: Region<u64>,
}

// SAFETY: zero bytes are the integer 0, equal to `u64::default()`.
#[cfg(not(loom))]
unsafe impl Zeroable for u64 {}

#[cfg(not(loom))]
impl WordArray {
    /// `len >= 1` zeroed words, on huge pages when `huge` (and the `std` feature on Linux).
    pub fn new(len: usize, huge: bool) -> Self {
        WordArray {
            region: Region::new(len, huge),
        }
    }

    /// The words.
    pub fn as_slice(&self) -> &[u64] {
        self.region.as_slice()
    }

    /// The words, writable (to fill the array before measuring).
    pub fn as_mut_slice(&mut self) -> &mut [u64] {
        // SAFETY: `&mut self` gives exclusive access to the `len` initialised words.
        unsafe { core::slice::from_raw_parts_mut(self.region.ptr.as_ptr(), self.region.len) }
    }

    /// How the memory was obtained.
    pub fn page_kind(&self) -> PageKind {
        self.region.kind()
    }
}

/// The kernel's transparent-huge-page policy (the bracketed word of
/// `/sys/kernel/mm/transparent_hugepage/enabled`: `always`, `madvise` or `never`).
#[cfg(all(feature = "std", target_os = "linux"))]
pub fn thp_policy() -> Option<String> {
    let s = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    let start = s.find('[')? + 1;
    let end = s[start..].find(']')? + start;
    Some(s[start..end].to_owned())
}

/// Bytes of this process's anonymous memory backed by huge pages right now
/// (`AnonHugePages` of `/proc/self/smaps_rollup`).
#[cfg(all(feature = "std", target_os = "linux"))]
pub fn anon_huge_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
    let line = s.lines().find(|l| l.starts_with("AnonHugePages:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
