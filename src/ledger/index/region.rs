//! The memory the id index's table lives in: one anonymous mapping sized for the table at its
//! largest, of which the table uses a prefix that doubles as the index grows. Pages nobody has
//! touched cost nothing, so the process holds what the table uses now; the next size's pages
//! are made resident on a thread of its own before the table grows into them (on this project's
//! virtual machine, faulting in a fresh page cost more than writing it: 3.4 GiB took 10 s).

use std::thread::JoinHandle;

/// An anonymous, private mapping of `len` bytes, page-aligned (as `O_DIRECT` reads of the index
/// file into it want), backed by transparent huge pages where Linux allows.
pub(super) struct Region {
    ptr: *mut u8,
    len: usize,
    /// Making a range resident in the background; joined before the range is used or the
    /// mapping goes.
    populating: Option<JoinHandle<()>>,
}

// SAFETY: the mapping is owned by this value alone; access goes through `&self`/`&mut self`.
unsafe impl Send for Region {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for Region {}

impl Region {
    /// Maps `len` bytes (nothing resident yet). Panics if the address space cannot be had: the
    /// mapping reserves no memory (`MAP_NORESERVE`), so only an exhausted address space fails.
    pub(super) fn map(len: usize) -> Region {
        let len = len.max(1);
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing; no
        // existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert!(
            ptr != libc::MAP_FAILED,
            "mapping {len} bytes for the id index failed: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: the range is the mapping just made; MADV_HUGEPAGE changes how the kernel backs
        // it, never its contents. An error (transparent huge pages disabled) is harmless.
        unsafe {
            libc::madvise(ptr, len, libc::MADV_HUGEPAGE);
        }
        Region {
            ptr: ptr.cast(),
            len,
            populating: None,
        }
    }

    /// The first `len` bytes.
    pub(super) fn bytes(&self, len: usize) -> &[u8] {
        assert!(len <= self.len);
        // SAFETY: within the mapping, which lives as long as `self`; zero-filled until written.
        unsafe { std::slice::from_raw_parts(self.ptr, len) }
    }

    /// The first `len` bytes, to write.
    pub(super) fn bytes_mut(&mut self, len: usize) -> &mut [u8] {
        assert!(len <= self.len);
        // SAFETY: as in `bytes`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, len) }
    }

    /// Makes `[from, to)` resident now.
    pub(super) fn populate(&mut self, from: usize, to: usize) {
        self.wait_for_populating();
        populate(self.ptr as usize, from, to.min(self.len));
    }

    /// Starts making `[from, to)` resident on a thread of its own; the caller keeps using the
    /// memory before `from`. [`Region::populate`] and [`Region::wait_for_populating`] wait for it.
    pub(super) fn populate_in_background(&mut self, from: usize, to: usize) {
        if self.populating.is_some() {
            return;
        }
        let (base, to) = (self.ptr as usize, to.min(self.len));
        let spawned = std::thread::Builder::new()
            .name("index-populate".into())
            .spawn(move || populate(base, from, to));
        match spawned {
            Ok(handle) => self.populating = Some(handle),
            // Done when the table grows instead.
            Err(e) => {
                tracing::debug!(error = %e, "Could not start a thread to prepare the id index's next size.")
            }
        }
    }

    /// Waits for a background [`Region::populate_in_background`], if any.
    pub(super) fn wait_for_populating(&mut self) {
        if let Some(handle) = self.populating.take() {
            let _ = handle.join();
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.wait_for_populating();
        // SAFETY: the mapping made in `map`, unmapped once; no reference to it outlives `self`.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

/// Faults in the pages of `[from, to)` of the mapping at `base` (the page holding `from` aside: it
/// may be in use), one write each that leaves the byte as it is.
///
/// Not `MADV_POPULATE_WRITE`: the kernel holds the process's memory map lock through that call
/// (about 3 ms per huge page in a VM, where the host backs each page as it is first touched), and
/// every `mmap` and `munmap` of the process waits behind it: RocksDB creating a column family
/// while the next size was made resident waited about half a second. A page fault takes only its
/// own mapping's lock.
fn populate(base: usize, from: usize, to: usize) {
    const PAGE: usize = 4096;
    for at in (from.next_multiple_of(PAGE)..to).step_by(PAGE) {
        // SAFETY: the byte lies in the mapping at `base`, which outlives this call (its owner
        // joins the thread running it before unmapping), and nothing else accesses it meanwhile:
        // the range is past the memory in use, or the caller waits for this call.
        let byte = unsafe { std::sync::atomic::AtomicU8::from_ptr((base + at) as *mut u8) };
        byte.fetch_or(0, std::sync::atomic::Ordering::Relaxed);
    }
}
