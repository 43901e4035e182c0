//! gpu-tracer's core: the configuration, the pure pipeline stages and the model they build, with
//! no kernel, no async runtime and no network (`docs/ARCHITECTURE.md` has the crate graph).
//!
//! - [`config`]: the one typed configuration, loaded from TOML and checked (with `[otlp]` and
//!   `[api]`).
//! - [`decode`]: records from the kernel → typed events (pure, fuzzed); [`state`]: the driver's
//!   ledger (fds, RM handles → live bytes); [`cuda::ledger`]: the CUDA-level ledger and counts.
//! - [`identity`]: cgroup path → container and pod (pure), and the pod a lookup answers;
//!   [`allocation`]: which GPUs the kubelet gave each container (the pod-resources answer, parsed).
//! - [`nvml::model`]: one NVML sample as plain data; [`attribution`]: per-GPU lines that add up;
//!   [`guardrails`]: GPU use outside the allocations; [`cost`]: the bill per group and the `Bill`
//!   events.
//! - [`model`]: the immutable snapshot every output reads (`AgentSnapshot`), the probe report, the
//!   counters; [`profile`]: a profiling session's recording (`Recorder` → `Recording`).
//! - [`wire`]: the model as `gputracer.v1` messages and back.
//! - [`filter`]: the event filters of `Subscribe`, the OTLP export and the config.
//! - [`clock`], [`format`], [`tls`]: the one clock, sizes and times for people, the HTTPS
//!   clients' rustls configuration; [`stop`]: SIGINT/SIGTERM as a flag that is never lost, and a
//!   bounded time to stop (std and libc, no runtime); [`fixtures`] (feature `encode`): one of every event, for tests.
pub mod allocation;
pub mod attribution;
pub mod clock;
pub mod config;
pub mod cost;
pub mod cuda;
pub mod decode;
pub mod filter;
#[cfg(any(test, feature = "encode"))]
pub mod fixtures;
pub mod format;
pub mod guardrails;
pub mod identity;
pub mod model;
pub mod nvml;
pub mod oom;
pub mod profile;
pub mod state;
pub mod stop;
pub mod tls;
pub mod wire;
