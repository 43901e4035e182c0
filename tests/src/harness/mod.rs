//! RAII guards and helpers for root integration tests, so that a failed test leaves the machine
//! clean: [`FakeDriver`] (a FUSE mount, or the kernel-module double's server), [`PodCgroup`] (a cgroup v2 directory named like a
//! Kubernetes pod's), [`Workload`] (an `nv-workload` child driven line by line), [`AgentProcess`]
//! (a `gpu-tracer` child: its log, its readiness, its stop) and [`ChildGuard`] (any child,
//! stopped on drop).

mod agent;
mod cgroup;
mod driver;
pub mod kmod;
mod workload;

use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

pub use agent::{AgentProcess, ChildGuard, DEFAULT_PATIENCE, STOP_GRACE, gpu_tracer, gpu_tracer_binary};
pub use cgroup::{PodCgroup, Qos, Runtime, cgroup2_mount};
pub use driver::{FakeDriver, FakeDriverBuilder, cleanup_stale_mounts};
pub use workload::{Answer, Workload, WorkloadBuilder};

/// What can go wrong while setting up or driving the doubles.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// A system call or file operation failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    /// Something did not happen in time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { what: String, after: Duration },
    /// A child process ended before it should have.
    #[error("{what} exited early ({status})")]
    Exited { what: String, status: ExitStatus },
    /// A double answered something unexpected (e.g. the workload said `err ...`).
    #[error("{0}")]
    Protocol(String),
    /// A test binary could not be found.
    #[error("binary {name} not found (looked in {searched:?}); {}", build_hint(name))]
    BinaryNotFound { name: String, searched: Vec<PathBuf> },
    /// A `gpu-tracer` child ([`AgentProcess`]) did not log what a test waited for: what went
    /// wrong, and its log.
    #[error("{what}; its log:\n{}", agent::show_log(log))]
    Agent { what: String, log: Vec<String> },
    /// The kernel-module double could not be loaded (the message names the cause and the fix).
    #[error("{0}")]
    KernelModule(String),
}

impl HarnessError {
    /// A short, stable reason (for logs and assertions).
    pub fn reason(&self) -> &'static str {
        match self {
            HarnessError::Io { .. } => "io",
            HarnessError::Timeout { .. } => "timeout",
            HarnessError::Exited { .. } => "exited",
            HarnessError::Protocol(_) => "protocol",
            HarnessError::BinaryNotFound { .. } => "binary_not_found",
            HarnessError::KernelModule(_) => "kernel_module",
            HarnessError::Agent { .. } => "agent",
        }
    }

    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Self {
        HarnessError::Io { what: what.into(), source }
    }
}

/// Result of the harness helpers.
pub type Result<T> = std::result::Result<T, HarnessError>;

/// Panic unless this process can run the privileged tests: root, `/dev/fuse`, a cgroup v2 mount.
///
/// Privileged tests call this first. They must **fail**, not skip, where the machine cannot run
/// them, so CI never reports a green run that tested nothing.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let mut missing = Vec::new();
    if euid != 0 {
        missing.push(format!("root (euid is {euid})"));
    }
    if !Path::new("/dev/fuse").exists() {
        missing.push("/dev/fuse (FUSE support)".to_string());
    }
    if cgroup2_mount().is_none() {
        missing.push("a cgroup2 mount in /proc/self/mountinfo".to_string());
    }
    assert!(
        missing.is_empty(),
        "this test needs {}; run the privileged tests as root (e.g. `sudo -E cargo test -p gpu-tracer-tests`). \
         It fails instead of skipping on purpose.",
        missing.join(", ")
    );
}

/// Whether the running kernel is `major.minor` or newer (`/proc/sys/kernel/osrelease`); what a
/// test expects where kernels differ (multi-uprobe links: 6.6).
pub fn kernel_at_least(major: u32, minor: u32) -> bool {
    tracer_agent::proc::kernel_at_least(&tracer_agent::proc::kernel_release(), major, minor)
}

/// How `cuda_attach = "auto"` attaches on the running kernel: multi-uprobe links from 6.6.
pub fn auto_cuda_method() -> tracer_core::model::probes::Method {
    if kernel_at_least(6, 6) {
        tracer_core::model::probes::Method::UprobeMulti
    } else {
        tracer_core::model::probes::Method::PerfEvent
    }
}

/// What builds the binary `name`.
fn build_hint(name: &str) -> &'static str {
    if name == "gpu-tracer" {
        "build it first (`cargo build --release -p gpu-tracer`, or run `cargo xtask test`)"
    } else {
        "`cargo build -p gpu-tracer-tests` builds it"
    }
}

/// Start a simulated GPU node (`gpu-tracer-sim --agent ADDR --node NODE --tracer <gpu-tracer>`
/// plus `args`), its stdout and stderr into `log`: the child, stopped on drop (60 s to clean up
/// its workloads, cgroups and fake driver). The caller waits for what it needs (the log, `/metrics`).
pub fn spawn_sim<S: AsRef<std::ffi::OsStr>>(node: &str, addr: &str, log: &Path, args: &[S]) -> ChildGuard {
    let sim = locate_binary("gpu-tracer-sim").expect("gpu-tracer-sim (cargo build --release -p gpu-tracer-tests)");
    let out = std::fs::File::create(log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    let child = std::process::Command::new(&sim)
        .args(["--agent", addr, "--node", node])
        .args(args)
        .arg("--tracer")
        .arg(gpu_tracer())
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone().expect("the log file"))
        .stderr(out)
        .spawn()
        .expect("starting gpu-tracer-sim");
    ChildGuard::new(child).named(format!("gpu-tracer-sim {node}")).grace(Duration::from_secs(60))
}

/// Find a binary of this package: `$GPU_TRACER_TEST_BIN_DIR/<name>`, else next to the running
/// executable or one directory up (test executables live in `target/<profile>/deps/`). Integration
/// tests of this package can pass `env!("CARGO_BIN_EXE_<name>")` to the builders instead.
pub fn locate_binary(name: &str) -> Result<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("GPU_TRACER_TEST_BIN_DIR") {
        dirs.push(PathBuf::from(d));
    }
    if let Ok(exe) = std::env::current_exe()
        && let Some(d) = exe.parent()
    {
        dirs.push(d.to_path_buf());
        dirs.extend(d.parent().map(Path::to_path_buf));
    }
    dirs.iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or(HarnessError::BinaryNotFound { name: name.into(), searched: dirs })
}

/// How much slower than this machine the tests' clock should assume the host to be: the
/// integer in `GPU_TRACER_TEST_TIME_SCALE` (at least 1; `cargo xtask kernel-matrix` sets it for a
/// guest under QEMU's TCG, where everything runs several times slower). Only waits scale — what is
/// counted never does.
pub fn time_scale() -> u32 {
    std::env::var("GPU_TRACER_TEST_TIME_SCALE").ok().and_then(|v| v.parse().ok()).unwrap_or(1).max(1)
}

/// `d` stretched by [`time_scale`].
pub fn scaled(d: Duration) -> Duration {
    d * time_scale()
}

/// Poll `f` every 25 ms until it returns `Some`, for up to `timeout` (stretched by [`time_scale`]).
pub fn eventually<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Result<T> {
    let timeout = scaled(timeout);
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if start.elapsed() >= timeout {
            return Err(HarnessError::Timeout { what: what.into(), after: timeout });
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// A fresh, empty directory under the system temp dir, named after `prefix`.
pub(crate) fn fresh_temp_dir(prefix: &str) -> Result<PathBuf> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!(
        "{prefix}.{}.{}.{nanos:x}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir(&dir).map_err(|e| HarnessError::io(format!("mkdir {}", dir.display()), e))?;
    Ok(dir)
}

/// `n` random bytes from the kernel.
pub(crate) fn random_bytes(n: usize) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; n];
    let mut filled = 0;
    while filled < n {
        // SAFETY: the destination is the unfilled tail of `buf`.
        let r = unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), n - filled, 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(HarnessError::io("getrandom", e));
            }
            continue;
        }
        filled += r as usize;
    }
    Ok(buf)
}

/// Send `sig` to `pid`, ignoring "no such process".
pub(crate) fn signal(pid: u32, sig: i32) {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}
