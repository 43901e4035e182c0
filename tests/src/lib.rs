//! Test doubles for gpu-tracer and the support library of its root integration tests.
//!
//! * [`abuse`]: many hostile client connections at once, and the agent's RSS and fds meanwhile.
//! * [`fake_driver`]: a fake NVIDIA kernel driver served over FUSE (`fake-nvidia-driver`), which
//!   answers the frontend ioctls like the real driver and keeps inspectable per-mount state.
//! * [`workload`]: `nv-workload`, a program that issues a CUDA application's ioctl sequences one
//!   phase per stdin command, and (`--libcuda`) its driver-API calls.
//! * [`fake_libcuda`]: where the fake `libcuda.so.1` builds are ([`fake_libcuda()`]), one per
//!   prologue variant.
//! * [`harness`] (re-exported here): RAII guards — [`FakeDriver`], [`PodCgroup`], [`Workload`],
//!   [`ChildGuard`] — and [`require_root`], so privileged tests fail (never skip) where they cannot
//!   run and leave the machine clean when they fail; [`AgentProcess`], a `gpu-tracer` child whose
//!   log, readiness and stop it owns, and [`gpu_tracer`], where that binary is.
//! * [`kube_api`]: [`kube_api::FakeApiServer`], an in-process Kubernetes API server (pods:
//!   list, watch, get) for the real `kube` client and reflector, and [`kube_api::FakePod`].
//! * [`pod_resources`]: the kubelet pod-resources gRPC service on a Unix socket
//!   ([`FakePodResources`]), answering what a test sets.
//! * [`http`]: a small HTTP client (`GET`, form `POST`) for the agent's endpoints and Prometheus'
//!   API.
//! * [`tracer`]: the tracer in-process ([`Tracer`]) with helpers that wait for it to catch up.

pub mod abuse;
pub mod fake_driver;
pub mod fake_libcuda;
pub mod harness;
pub mod http;
pub mod kube_api;
pub mod le;
pub mod nvml_model;
pub mod pod_resources;
pub mod tracer;
pub mod workload;

pub use fake_driver::DriverStats;
pub use fake_libcuda::fake_libcuda;
pub use harness::{
    AgentProcess, Answer, ChildGuard, FakeDriver, FakeDriverBuilder, HarnessError, PodCgroup, Qos, Result, Runtime,
    Workload, WorkloadBuilder, auto_cuda_method, cgroup2_mount, eventually, gpu_tracer, gpu_tracer_binary,
    kernel_at_least, locate_binary, require_root, scaled, spawn_sim, time_scale,
};
pub use pod_resources::{FakePodResources, PodResourcesCalls};
pub use tracer::{Tracer, assert_accounting, cg_usage, config_for};

/// The Python of the venv `cargo xtask setup` fills with the pinned PyPI packages the tests
/// decode and drive with (`GPU_TRACER_DEPLOY_VENV`, default `/opt/gpu-tracer/deploy-venv`;
/// xtask/src/setup/mod.rs lists them), or a failure naming the fix: the tests that need it fail,
/// never skip, without it.
pub fn venv_python() -> std::path::PathBuf {
    let venv = std::env::var_os("GPU_TRACER_DEPLOY_VENV")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from("/opt/gpu-tracer/deploy-venv"));
    let py = venv.join("bin/python");
    assert!(
        py.exists(),
        "{} not found: run `cargo xtask setup` (it makes the venv and installs its packages)",
        py.display()
    );
    py
}

/// A program of Debian's `prometheus` package (`prometheus`, `promtool`) on `PATH`, or a failure
/// naming what installs it: the tests that need it fail, never skip, without it.
pub fn prometheus_tool(name: &str) -> std::path::PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("{name} is not installed: Debian's `prometheus` package has it (`cargo xtask setup` installs it)")
        })
}
