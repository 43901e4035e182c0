//! The kernel's `TRACKED_TGIDS` map (one byte per possible tgid), memory-mapped so user space can
//! mark the processes its `/proc` scan finds with single-byte stores, like the kernel does: a map
//! update through the syscall would rewrite a whole 4096-byte entry and could undo a concurrent
//! kernel store to a neighbouring tgid.
use std::os::fd::{AsFd, AsRawFd};

use aya::{Ebpf, maps::Map};
use tracer_common::{TRACKED_TGIDS_PER_ENTRY, map_names};

/// A shared mapping of `TRACKED_TGIDS`.
pub(crate) struct TrackedTgids {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every access is a single-byte volatile store/load.
unsafe impl Send for TrackedTgids {}

impl TrackedTgids {
    /// Map the loaded object's `TRACKED_TGIDS` (created with `entries` entries).
    pub fn map(ebpf: &Ebpf, entries: u32) -> std::io::Result<Self> {
        let Some(Map::Array(data)) = ebpf.map(map_names::TRACKED_TGIDS) else {
            return Err(std::io::Error::other("map TRACKED_TGIDS missing or not an array"));
        };
        let len = entries as usize * TRACKED_TGIDS_PER_ENTRY;
        // SAFETY: mapping a BPF_F_MMAPABLE array map of exactly `len` bytes, shared, read-write.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                data.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self { ptr: ptr.cast(), len })
    }

    /// Mark or unmark `tgid`. Tgids beyond the map are always treated as tracked by the kernel.
    pub fn set(&self, tgid: u32, on: bool) {
        if (tgid as usize) < self.len {
            // SAFETY: inside the mapping; a one-byte store like the kernel's.
            unsafe { std::ptr::write_volatile(self.ptr.add(tgid as usize), on as u8) };
        }
    }
}

impl Drop for TrackedTgids {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}
