//! How the agent asks glibc's allocator to hold memory: a long-running agent should not keep the
//! high-water mark of every burst (a `/metrics` scrape builds an 8 MB string at 8 GPUs × 100
//! containers; an OTLP export a few MB) for the rest of its life.
//!
//! - [`tune`] (once, at agent start): a fixed mmap threshold of 256 KiB. glibc's default threshold
//!   is dynamic: after a large mmapped block is freed it raises the threshold to that size, so the
//!   next scrape's 8 MB string comes from the heap and its pages stay in RSS after it is freed.
//!   Fixed, every block above 256 KiB is its own mapping, returned to the system on free. And at
//!   most 4 malloc arenas: glibc makes up to 8 per CPU, one per thread that allocates at the same
//!   time, and each keeps its own freed memory.
//! - [`release_free`] (after each OTLP export): hand the free pages of every arena back.
//!
//! Both do nothing off glibc (musl, other systems). Measured in docs/benchmarks.md §9.

/// Set the allocator's limits for a long-running agent (see the module documentation).
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's parameters; called before the agent's threads
    // start allocating concurrently.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024);
        libc::mallopt(libc::M_ARENA_MAX, 4);
    }
}

/// Return the free pages of the allocator's arenas to the system (a few hundred µs).
pub(crate) fn release_free() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free pages of the allocator's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}
