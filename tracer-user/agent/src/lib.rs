//! gpu-tracer's node agent: the kernel programs loaded and attached, the pipeline that turns their
//! records into the model (`tracer_core::model`), and the outputs served from it. Modules follow
//! the data (`docs/ARCHITECTURE.md` has the table, stage by stage):
//!
//! - [`probe`] (load, feature detection, attach; the driver and lifecycle families) and [`cuda`]
//!   (the libcuda uprobes: where they go, attaching them per library);
//! - [`source`] (ring buffers, counters, the `/proc` scan), [`proc`] (every `/proc` read),
//!   [`enrich`] (process facts, cgroup paths);
//! - [`nvml`] (the sampler), [`identity`] (the pod watcher), [`allocation`] (the kubelet's
//!   pod-resources socket);
//! - [`pipeline`] (the `Agent`: the stages, driven once per step and per snapshot), [`runner`]
//!   (the loop the long-running commands share);
//! - [`node`] (the node agent: the pipeline with everything `gpu-tracer agent` serves, as a
//!   library: `NodeAgent::start(cfg, options)`, then `run()`);
//! - [`export`] (Prometheus `/metrics` and the HTTP server, OTLP, the gRPC API server), [`profile`]
//!   (profiling sessions on these probes), [`doctor`] (what works on this node), [`memory`] (the
//!   allocator's limits).
//!
//! Decoding, the ledgers, attribution and the model are `tracer_core`'s.
pub mod allocation;
pub mod bpf;
pub mod cuda;
pub mod doctor;
pub mod enrich;
pub mod export;
pub mod identity;
pub mod memory;
pub mod node;
pub mod nvml;
pub mod pipeline;
pub mod probe;
pub mod proc;
pub mod profile;
pub mod runner;
pub mod source;
