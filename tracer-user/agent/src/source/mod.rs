//! Stage 1: what comes out of the kernel — ring-buffer records, per-CPU counters — and the
//! `/proc` scan that seeds state for processes that opened the GPU before the agent started.
pub mod counters;
pub mod cuda_counts;
pub mod procscan;
pub(crate) mod ringbuf;
pub mod tracked;
