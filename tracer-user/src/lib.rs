//! gpu-tracer user space, as a library with a thin binary (`src/bin/gpu-tracer.rs`).
//!
//! Modules follow the pipeline: `probe` (load, feature detection, attach) → `source` (ring buffer,
//! counters, `/proc` seeding) → `decode` (pure: bytes → events) → `state` (fd table, RM handle
//! ledger → live memory) → `aggregate` (immutable snapshot) → `export` (events stream, `top`).
pub mod config;
pub mod decode;
pub mod probe;
pub mod state;
