//! gpu-tracer user space, as a library with a thin binary (`src/bin/gpu-tracer.rs`).
//!
//! Modules follow the pipeline (`docs/ARCHITECTURE.md` has the table, stage by stage): `probe`
//! (load, feature detection, attach) → `source` (ring buffer, counters, `/proc` scan) → `decode`
//! (pure: bytes → events) → `state` (fd table, RM handle ledger → live memory) and `cuda` (the
//! libcuda ledger) → `enrich` (process facts, cgroup paths) → `identity` (cgroup path → container
//! and pod; the pod watcher) → `allocation` (which GPUs the kubelet gave each container) → `nvml`
//! (device and per-process readings) → `attribution` (per-GPU lines that add up) → `guardrails`
//! (GPU use outside the allocations) → `model` (the immutable snapshot exporters read) → `export`
//! (event stream, `top`, metrics, HTTP). `pipeline` holds the stages and drives them; `runner` is the
//! loop the long-running commands share; `clock` is the one clock; `proc` reads `/proc` (the procfs crate); `doctor` reports what works on
//! this node.
pub mod allocation;
pub mod attribution;
pub mod clock;
pub mod config;
pub mod cuda;
pub mod decode;
pub mod doctor;
pub mod enrich;
pub mod export;
#[cfg(any(test, feature = "encode"))]
pub mod fixtures;
pub mod format;
pub mod guardrails;
pub mod identity;
pub mod memory;
pub mod model;
pub mod nvml;
pub mod pipeline;
pub mod probe;
pub mod proc;
pub mod profile;
pub mod runner;
pub mod source;
pub mod state;
pub mod tls;
pub mod wire;
