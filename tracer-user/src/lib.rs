//! gpu-tracer user space, as a library with a thin binary (`src/bin/gpu-tracer.rs`).
//!
//! Modules follow the pipeline: `probe` (load, feature detection, attach) → `source` (ring buffer,
//! counters, `/proc` seeding) → `decode` (pure: bytes → events) → `state` (fd table, RM handle
//! ledger → live memory) → `enrich` (cgroup paths, process identity) → `export` (event stream,
//! `top`). `pipeline` wires the stages together; `doctor` reports what works on this node.
//! `allocation` reads which GPUs the kubelet gave each container; `guardrails` flags GPU use
//! outside those allocations.
pub mod allocation;
pub mod config;
pub mod cuda;
pub mod decode;
pub mod doctor;
pub mod enrich;
pub mod export;
pub mod guardrails;
pub mod nvml;
pub mod pipeline;
pub mod probe;
pub mod source;
pub mod state;
