//! How the agent asks glibc's allocator to hold memory: a long-running agent should not keep the
//! high-water mark of every burst (a `/metrics` scrape builds an 8 MB string at 8 GPUs × 100
//! containers; an OTLP export ~7 MB of requests) for the rest of its life.
//!
//! - [`tune`] (once, at agent start): a fixed mmap threshold of 256 KiB. glibc's default threshold
//!   is dynamic: after a large mmapped block is freed it raises the threshold to that size, so the
//!   next scrape's 8 MB string comes from the heap and its pages stay in RSS after it is freed.
//!   Fixed, every block above 256 KiB is its own mapping, returned to the system on free. And at
//!   most 4 malloc arenas: glibc makes up to 8 per CPU, one per thread that allocates at the same
//!   time, and each keeps its own freed memory.
//!
//! Until issue 39 each OTLP export also ended with `malloc_trim(0)`: an export then allocated
//! two strings per attribute of every point, freed in the arenas. Its requests are now written
//! into a few reused buffers (`export::otlp::wire`) and the rest of its large blocks are mappings
//! of their own, so the trim held back under 2 MiB (within the noise of docs/benchmarks.md §9's
//! memory table) and cost the export ~10 ms of faulting its memory back in: it is gone.
//!
//! It does nothing off glibc (musl, other systems). Measured in docs/benchmarks.md §9.

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
