//! The agent's configuration: one typed struct, every field defaulted, loaded from TOML and
//! overridden by command-line flags (flags > file > defaults). Host paths are configurable so tests
//! can point the agent at fixtures and doubles.
//!
//! A setting that cannot be what was meant is an error at start, naming the key, the reason and the
//! fix — never a silent default: an unknown key at any depth (`nvml.mod`: a typo that would leave
//! NVML on `auto`), a value out of range ([`Config::validate`]), a host path that is not there
//! ([`Config::check_host_paths`]). (STYLE.md suggests warning about unknown keys; issue 13 showed
//! what a warning in a DaemonSet's log is worth: nobody reads it and the node runs misconfigured.)
pub mod api;
mod driver;
mod error;
mod flags;
pub mod otlp;
pub mod schema;
mod token;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub(crate) use self::driver::parse_driver_version;
pub use self::token::{TokenFileError, read_token_file};
pub use self::{
    api::ApiSettings,
    driver::{ResolvedDriverVersion, resolve_driver_version},
    error::ConfigError,
    flags::{Overrides, parse_seconds},
};

/// Where the driver-family syscall probes attach. See `docs/ARCHITECTURE.md` for the costs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum AttachMode {
    /// Pick the cheapest mode this kernel offers.
    #[default]
    Auto,
    /// Probes on the NVIDIA driver's own entry points (`nvidia_unlocked_ioctl`, open, release, and
    /// nvidia-uvm's): costs other syscalls nothing. fentry/fexit where the modules have BTF,
    /// kprobes otherwise (`driver_entry_probes`). Needs the nvidia module's entry points in
    /// kallsyms and kernel BTF; `auto` takes it where they are (`probe::driver_entry`).
    DriverEntry,
    /// `tp_btf/sys_enter` + `sys_exit`, filtering by syscall number first.
    BtfTracepoint,
    /// `raw_tracepoint/sys_enter` + `sys_exit`, filtering by syscall number first.
    RawTracepoint,
    /// `syscalls:sys_{enter,exit}_<name>` for each traced syscall: only those syscalls pay, but each
    /// pays the syscall tracepoint slow path.
    SyscallTracepoint,
}

impl AttachMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AttachMode::Auto => "auto",
            AttachMode::DriverEntry => "driver-entry",
            AttachMode::BtfTracepoint => "btf-tracepoint",
            AttachMode::RawTracepoint => "raw-tracepoint",
            AttachMode::SyscallTracepoint => "syscall-tracepoint",
        }
    }
}

/// How the cuda family's uprobes are attached to each libcuda copy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum CudaAttach {
    /// Multi-uprobe links where the kernel has them (Linux 6.6+), else one perf event per probe.
    #[default]
    Auto,
    /// Multi-uprobe links only (`BPF_TRACE_UPROBE_MULTI`): CAP_BPF + CAP_PERFMON; one RCU grace
    /// period to detach a library. A kernel without them fails the family.
    UprobeMulti,
    /// One perf event per probe (the only way before Linux 6.6): needs CAP_SYS_ADMIN, and each
    /// probe waits for a grace period of its own when detached.
    PerfEvent,
}

/// Which programs the cuda family's entry probes run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum CudaEntryPrograms {
    /// One program per kind of entry point, the entry point's id as the attach cookie, where the
    /// kernel has `bpf_get_attach_cookie` (Linux 5.15+); else one program per entry point.
    #[default]
    Auto,
    /// One program per entry point, its id a constant, attached as perf events without cookies:
    /// what kernels before 5.15 get; here to compare the two forms on one kernel.
    PerEntry,
}

impl CudaEntryPrograms {
    pub fn as_str(self) -> &'static str {
        match self {
            CudaEntryPrograms::Auto => "auto",
            CudaEntryPrograms::PerEntry => "per-entry",
        }
    }
}

/// How the lifecycle family's four programs (exec, exit, fork, cgroup removal) attach.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum LifecycleAttach {
    /// `tp-btf` where the kernel's BTF has every field they read, else `tracepoint`; also
    /// `tracepoint` when the tp_btf programs fail to load or attach (the reason is reported).
    #[default]
    Auto,
    /// BTF-typed tracepoints through BPF links: no perf event, so kernels with
    /// `perf_event_paranoid` ≥ 3 (Debian, Ubuntu) allow them with CAP_BPF + CAP_PERFMON.
    TpBtf,
    /// Classic tracepoints (one perf event each, ids from tracefs): works without BTF; needs
    /// CAP_SYS_ADMIN where `perf_event_paranoid` ≥ 3.
    Tracepoint,
}

/// Which mechanism carries driver-entry mode's programs on the NVIDIA driver's functions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum DriverEntryProbes {
    /// `fentry` where the NVIDIA modules have BTF and the agent may open it (CAP_SYS_ADMIN), else
    /// `kprobe`; the reason is reported.
    #[default]
    Auto,
    /// fentry/fexit (BPF trampolines, `bpf()` links): the cheaper one. Needs the modules' BTF
    /// (`/sys/kernel/btf/nvidia`) and CAP_SYS_ADMIN to open it.
    Fentry,
    /// kprobe/kretprobe: any module, BTF or not; a perf event each, so refused without
    /// CAP_SYS_ADMIN where `perf_event_paranoid` ≥ 3.
    Kprobe,
}

impl DriverEntryProbes {
    pub fn as_str(self) -> &'static str {
        match self {
            DriverEntryProbes::Auto => "auto",
            DriverEntryProbes::Fentry => "fentry",
            DriverEntryProbes::Kprobe => "kprobe",
        }
    }
}

impl LifecycleAttach {
    pub fn as_str(self) -> &'static str {
        match self {
            LifecycleAttach::Auto => "auto",
            LifecycleAttach::TpBtf => "tp-btf",
            LifecycleAttach::Tracepoint => "tracepoint",
        }
    }
}

impl CudaAttach {
    pub fn as_str(self) -> &'static str {
        match self {
            CudaAttach::Auto => "auto",
            CudaAttach::UprobeMulti => "uprobe-multi",
            CudaAttach::PerfEvent => "perf-event",
        }
    }
}

/// Which probe families to load. A family that fails to load or attach is reported; the others
/// keep running.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Families {
    /// exec/exit/fork of GPU processes, cgroup removal.
    pub lifecycle: bool,
    /// NVIDIA device fds, driver ioctls, UVM managed mmaps.
    pub driver: bool,
    /// uprobes on libcuda.so.1: kernel launches (counted in the kernel), allocations and frees.
    pub cuda: bool,
}

impl Families {
    /// Is any family enabled? With none, no eBPF is loaded at all (NVML-only mode).
    pub fn any(&self) -> bool {
        self.lifecycle || self.driver || self.cuda
    }
}

impl Default for Families {
    fn default() -> Self {
        Self { lifecycle: true, driver: true, cuda: true }
    }
}

/// The whole configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Directory holding the NVIDIA device nodes (`nvidiactl`, `nvidia0`, `nvidia-uvm`...).
    /// Default `/dev`.
    #[schemars(regex(pattern = r"^/"))]
    pub dev_dir: PathBuf,
    /// Also accept the files found in `dev_dir` at start (by device and inode) as NVIDIA devices,
    /// although they are not the driver's character devices (major 195 / `nvidia-uvm`'s): for the
    /// fake driver and `sim` only. Off by default: a path alone is never enough, so a file called
    /// `nvidiactl` in someone's own mount namespace is not traced. With an explicit `nvml.library`
    /// it also lets NVML be initialised without the driver loaded (the fake NVML).
    pub simulated_devices: bool,
    /// procfs mount (host PID namespace). Default `/proc`.
    pub proc_root: PathBuf,
    /// cgroup v2 mount; found from `/proc/self/mountinfo` when unset.
    pub cgroup_root: Option<PathBuf>,
    /// Driver version (`535.261.03`) to choose struct layouts; read from `driver_version_file`
    /// when unset, else the built-in default.
    #[schemars(regex(pattern = r"^[1-9][0-9]{2,}\.[0-9]+(\.[0-9]+)?$"))]
    pub driver_version: Option<String>,
    /// File the driver version is read from. Default `/proc/driver/nvidia/version`.
    pub driver_version_file: PathBuf,
    pub attach_mode: AttachMode,
    pub families: Families,
    /// Size of each of the two ring buffers in bytes (the ledger ring, for records the memory
    /// ledger is built from, and the bulk ring, for count-only records): a power of two from the
    /// page size (4 KiB) to [`MAX_RING_BUFFER_BYTES`] (256 MiB). Default 8 MiB each.
    #[schemars(schema_with = "schema::ring_buffer_bytes")]
    pub ring_buffer_bytes: u32,
    /// Every N records per CPU the kernel checks whether a ring holds a quarter of
    /// `ring_buffer_bytes` unread, and only then wakes user space, which otherwise drains every
    /// `drain_interval_ms`. 0 or 1: wake at every record (lowest latency, highest cost). Default 64.
    pub wakeup_every: u32,
    /// Kernel-side diagnostics (aya-log) in the agent's log: an ioctl copy that faulted, a UVM
    /// command or RM_ALLOC class no capture plan matched, as it happens. Default off; SIGUSR1
    /// toggles it while the agent runs.
    pub kernel_log: bool,
    /// How often the ring buffer is drained even without a wake-up, in ms (1..=60000). Default 10.
    #[schemars(range(min = 1, max = 60_000))]
    pub drain_interval_ms: u64,
    /// How often a snapshot is published, in ms (1..=86400000). Default 1000.
    #[schemars(range(min = 1, max = 86_400_000))]
    pub snapshot_interval_ms: u64,
    /// Most processes kept in the state tables (1..=[`MAX_PROCESSES`]). Default 16384.
    #[schemars(range(min = 1, max = MAX_PROCESSES))]
    pub max_processes: usize,
    /// libcuda.so.1 copies to probe; empty: search the usual places (`cuda::attach::SEARCH_PATHS`).
    pub cuda_libraries: Vec<PathBuf>,
    /// How the cuda family's uprobes are attached. Default `auto`.
    pub cuda_attach: CudaAttach,
    /// Which programs the cuda family's entry probes run. Default `auto`.
    pub cuda_entry_programs: CudaEntryPrograms,
    /// Also probe libcuda's synchronisation, event, copy and memset entry points (an entry and a
    /// return uprobe each, which every call of every process pays): counted per entry point, and
    /// timed one by one in per-event mode. `profile` and `events --per-event-*` switch it on.
    /// Default false.
    pub cuda_timed_calls: bool,
    /// How the lifecycle family's programs are attached. Default `auto`.
    pub lifecycle_attach: LifecycleAttach,
    /// Driver-entry mode's mechanism (fentry or kprobe). Default `auto`.
    pub driver_entry_probes: DriverEntryProbes,
    /// Time each NVIDIA ioctl from entry to exit (`duration_ns` of its events and of `profile`'s
    /// calls). It costs an entry program's work per ioctl: in the btf and raw tracepoint modes the
    /// clock and a slot store at `sys_enter` (the exit program reads everything else from the
    /// registers), in driver-entry mode on fentry/fexit an fentry on the driver's ioctl. Off, those
    /// entries return at once and `duration_ns` is 0 (docs/benchmarks.md and docs/kernels.md
    /// measure the difference). The syscall-tracepoint mode and kprobes always time ioctls: their
    /// entry programs keep the call's state anyway. `profile` and `events` switch it on. Default
    /// false. (Was `driver_entry_durations`, still accepted.)
    #[serde(alias = "driver_entry_durations")]
    pub ioctl_durations: bool,
    /// NVML sampling (device and per-process readings).
    pub nvml: NvmlSettings,
    /// How each GPU's memory, compute, energy and cost are split between containers.
    pub attribution: AttributionSettings,
    /// Kubernetes identity (pods, GPU allocations).
    pub kubernetes: KubeSettings,
    /// The agent's gRPC API (events, snapshot, status).
    pub api: ApiSettings,
    /// OTLP export of metrics and events (`[otlp]`; off unless an endpoint is set; the `OTEL_*`
    /// environment variables and `--otlp-*` flags override it, see docs/otlp.md).
    pub otlp: otlp::OtlpConfig,
    /// What the Prometheus metrics (/metrics) carry (`[metrics]`).
    pub metrics: MetricsSettings,
}

/// What the exported metrics carry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSettings {
    /// When container series carry the `cgroup` label (the cgroup v2 path).
    pub cgroup_label: CgroupLabel,
    /// PEM certificate chain and private key: the agent's HTTP endpoints (/metrics, /healthz,
    /// /readyz) over TLS. Both or neither.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// File holding the bearer token a scrape of /metrics must carry (`Authorization: Bearer
    /// <token>`; surrounding whitespace ignored). /healthz and /readyz stay open (the kubelet's
    /// probes; they name no workload).
    pub token_file: Option<PathBuf>,
}

impl MetricsSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(ConfigError::Invalid {
                key: "metrics.tls_cert",
                why: "TLS needs both metrics.tls_cert and metrics.tls_key".into(),
            });
        }
        Ok(())
    }
}

/// When container series carry the `cgroup` label.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum CgroupLabel {
    /// Only on series whose pod is not known (host processes, containers outside Kubernetes,
    /// a pod not listed yet): a pod's series are named by `namespace`/`pod`/`container` alone, so
    /// a container restart (a new cgroup path with a new container id) continues the same series.
    #[default]
    Auto,
    /// On every container series (one series per cgroup: new series on every container restart).
    Always,
}

/// Whether a source is used, and whether its absence is fatal.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum SourceMode {
    /// Use it when it is there; keep running and say what is missing when it is not.
    #[default]
    Auto,
    /// Exit with a message naming the cause when it cannot be used.
    Required,
    /// Do not use it.
    Off,
}

/// NVML settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct NvmlSettings {
    pub mode: SourceMode,
    /// `libnvidia-ml.so.1` to load; default: the dynamic loader's search (`libnvidia-ml.so.1`).
    pub library: Option<PathBuf>,
}

impl Default for NvmlSettings {
    fn default() -> Self {
        Self { mode: SourceMode::Auto, library: None }
    }
}

/// How the cost of an interval is split between containers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum CostPolicy {
    /// By memory held × time (default): the memory a pod holds is what others cannot use.
    #[default]
    MemoryTime,
    /// By SM share × time.
    ComputeTime,
    /// `blend_memory_weight` × memory-time + the rest × compute-time.
    Blended,
    /// By what each pod was allocated (whole GPUs, MIG slices, time-slicing replicas).
    RequestBased,
}

/// What happens to the parts of the bill no container used (idle, driver-reserved, unattributed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum UnusedCost {
    /// Keep them as their own lines (default): the waste stays visible.
    #[default]
    Lines,
    /// Spread them over the containers in proportion to their share.
    Spread,
}

/// Attribution settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AttributionSettings {
    /// Price of one GPU for one hour (any currency; finite, at least 0). Unset: cost is not computed.
    #[schemars(range(min = 0.0))]
    pub price_per_gpu_hour: Option<f64>,
    /// Alternatively the node's price per hour, split evenly over its GPUs.
    #[schemars(range(min = 0.0))]
    pub price_per_node_hour: Option<f64>,
    pub cost_policy: CostPolicy,
    /// Weight of memory-time in the `blended` policy (0..=1; anything else is an error).
    #[schemars(range(min = 0.0, max = 1.0))]
    pub blend_memory_weight: f64,
    pub unused_cost: UnusedCost,
    /// A container holding GPU memory that launched nothing for this long is an idle reservation.
    pub idle_reservation_after_s: u64,
    /// Window of the rightsizing statistics (peak, p95).
    pub rightsizing_window_s: u64,
    /// Headroom added to the peak before choosing what would fit, percent.
    pub rightsizing_headroom_pct: u32,
}

impl Default for AttributionSettings {
    fn default() -> Self {
        Self {
            price_per_gpu_hour: None,
            price_per_node_hour: None,
            cost_policy: CostPolicy::MemoryTime,
            blend_memory_weight: 0.5,
            unused_cost: UnusedCost::Lines,
            idle_reservation_after_s: 600,
            rightsizing_window_s: 3600,
            rightsizing_headroom_pct: 20,
        }
    }
}

/// Kubernetes settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct KubeSettings {
    pub mode: SourceMode,
    /// This node's name (the pod watch is restricted to it); default `$NODE_NAME`, else the hostname.
    pub node_name: Option<String>,
    /// kubeconfig to use; default: in-cluster config, else `$KUBECONFIG` / `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// Pod labels copied into attribution keys (never all labels: cardinality).
    pub label_allow_list: Vec<String>,
    /// The kubelet pod-resources socket.
    pub pod_resources_socket: PathBuf,
    /// Resource names that are GPUs in pod-resources answers.
    pub gpu_resource_names: Vec<String>,
}

impl Default for KubeSettings {
    fn default() -> Self {
        Self {
            mode: SourceMode::Auto,
            node_name: None,
            kubeconfig: None,
            label_allow_list: vec!["team".into(), "app.kubernetes.io/name".into()],
            pod_resources_socket: PathBuf::from("/var/lib/kubelet/pod-resources/kubelet.sock"),
            gpu_resource_names: vec!["nvidia.com/gpu".into()],
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            dev_dir: PathBuf::from("/dev"),
            simulated_devices: false,
            proc_root: PathBuf::from("/proc"),
            cgroup_root: None,
            driver_version: None,
            driver_version_file: PathBuf::from("/proc/driver/nvidia/version"),
            attach_mode: AttachMode::Auto,
            families: Families::default(),
            ring_buffer_bytes: tracer_common::capacity::EVENTS_BYTES,
            wakeup_every: 64,
            kernel_log: false,
            drain_interval_ms: 10,
            snapshot_interval_ms: 1000,
            max_processes: 16384,
            cuda_libraries: Vec::new(),
            cuda_attach: CudaAttach::Auto,
            cuda_entry_programs: CudaEntryPrograms::Auto,
            cuda_timed_calls: false,
            lifecycle_attach: LifecycleAttach::Auto,
            driver_entry_probes: DriverEntryProbes::Auto,
            ioctl_durations: false,
            nvml: NvmlSettings::default(),
            attribution: AttributionSettings::default(),
            kubernetes: KubeSettings::default(),
            api: ApiSettings::default(),
            otlp: Default::default(),
            metrics: MetricsSettings::default(),
        }
    }
}

/// The largest `ring_buffer_bytes`. The ring buffer is kernel memory locked for the agent's
/// lifetime, and user space maps its data pages twice (so a record that wraps reads as one): a
/// 2 GiB ring costs over 4 GiB of RSS. 256 MiB is 32 times the default, far more than a burst
/// needs when the drain runs every few milliseconds.
pub(crate) const MAX_RING_BUFFER_BYTES: u32 = 256 << 20;
/// The largest `max_processes`: the kernel's `PID_MAX_LIMIT` (2^22) on 64-bit, so no node can
/// have more processes to track.
pub(crate) const MAX_PROCESSES: usize = 1 << 22;

impl Config {
    /// Load a TOML file. Errors name the file, the key (a dotted path) and the line. The second
    /// value is a list of warnings (none today: every problem is an error; kept for deprecations).
    pub fn from_file(path: &Path) -> Result<(Config, Vec<String>), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
        Self::from_toml(&text).map_err(|e| ConfigError::InFile { path: path.into(), error: Box::new(e) })
    }

    /// Parse TOML text. An unknown key at any depth is an error naming its dotted path
    /// (`nvml.mod`), with the near miss it was probably meant to be; so is a value of the wrong
    /// type. Values are range-checked by [`Config::validate`], not here.
    pub fn from_toml(text: &str) -> Result<(Config, Vec<String>), ConfigError> {
        let cfg: Config = serde_path_to_error::deserialize(toml::Deserializer::new(text))
            .map_err(|e| ConfigError::from_toml(text, e))?;
        Ok((cfg, Vec::new()))
    }

    /// Check the values, without looking at the host: each out-of-range or unparsable value is an
    /// error naming the key, the reason and what to write instead. [`Config::check_host_paths`]
    /// checks the paths.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, why: String| Err(ConfigError::Invalid { key, why });
        let rb = self.ring_buffer_bytes;
        let min_rb = page_size().max(4096);
        if !rb.is_power_of_two() || rb < min_rb || rb > MAX_RING_BUFFER_BYTES {
            return invalid(
                "ring_buffer_bytes",
                format!(
                    "{rb} is not a power of two between {min_rb} (the page size) and {MAX_RING_BUFFER_BYTES} \
                     (256 MiB: the ring is locked kernel memory, mapped twice in user space); the default is {}",
                    tracer_common::capacity::EVENTS_BYTES
                ),
            );
        }
        if self.max_processes == 0 || self.max_processes > MAX_PROCESSES {
            return invalid(
                "max_processes",
                format!(
                    "{} is outside 1..={MAX_PROCESSES} (the kernel's PID limit: no node has more processes); \
                     the default is 16384",
                    self.max_processes
                ),
            );
        }
        if !(1..=60_000).contains(&self.drain_interval_ms) {
            return invalid(
                "drain_interval_ms",
                format!(
                    "{} is outside 1..=60000 ms: 0 would spin, and a ring buffer not drained for a minute loses \
                     events; the default is 10",
                    self.drain_interval_ms
                ),
            );
        }
        if !(1..=86_400_000).contains(&self.snapshot_interval_ms) {
            return invalid(
                "snapshot_interval_ms",
                format!("{} is outside 1..=86400000 ms (a day); the default is 1000", self.snapshot_interval_ms),
            );
        }
        let a = &self.attribution;
        for (key, price) in [
            ("attribution.price_per_gpu_hour", a.price_per_gpu_hour),
            ("attribution.price_per_node_hour", a.price_per_node_hour),
        ] {
            if let Some(p) = price
                && let Err(why) = check_price(p)
            {
                return invalid(key, why);
            }
        }
        let w = a.blend_memory_weight;
        if !(0.0..=1.0).contains(&w) {
            return invalid(
                "attribution.blend_memory_weight",
                format!("{w} is not a weight between 0 and 1 (the share of memory-time in the blended policy)"),
            );
        }
        if let Some(v) = &self.driver_version
            && (v.split_whitespace().count() != 1 || parse_driver_version(v).is_none())
        {
            return invalid(
                "driver_version",
                format!(
                    "{v:?} is not a driver version; write it as the driver prints it, e.g. \"535.261.03\", or leave \
                     it unset to read {}",
                    self.driver_version_file.display()
                ),
            );
        }
        let prefix = self.dev_prefix();
        if prefix.len() >= tracer_common::DEV_PREFIX_MAX {
            return invalid(
                "dev_dir",
                format!(
                    "{} is too long: the kernel matches at most {} bytes of `<dev_dir>/nvidia`",
                    self.dev_dir.display(),
                    tracer_common::DEV_PREFIX_MAX - 1
                ),
            );
        }
        if !self.dev_dir.is_absolute() {
            return invalid("dev_dir", "must be an absolute path".into());
        }
        self.api.validate()?;
        self.metrics.validate()?;
        self.otlp
            .validate()
            .map_err(|e| ConfigError::Invalid { key: e.key, why: format!("{:?}: {}", e.value, e.why) })?;
        Ok(())
    }

    /// Check the host paths the agent reads: `dev_dir` is a directory (on a node whose driver is
    /// not loaded yet `/dev` still is), `proc_root` is a procfs, `cgroup_root` (when set) a
    /// directory, and each `cuda_libraries` file (when the cuda family is on) an ELF file. Commands
    /// that load no probes here (`--connect`, `api`) skip this; `doctor` reports it.
    pub fn check_host_paths(&self) -> Result<(), ConfigError> {
        let invalid = |key, why: String| Err(ConfigError::Invalid { key, why });
        let dev = &self.dev_dir;
        if !dev.is_dir() {
            let what = if dev.exists() { "is not a directory" } else { "does not exist" };
            return invalid(
                "dev_dir",
                format!(
                    "{} {what}; point dev_dir (--dev-dir) at the directory that holds nvidiactl (the host's /dev)",
                    dev.display()
                ),
            );
        }
        let proc = &self.proc_root;
        if !proc.is_dir() {
            let what = if proc.exists() { "is not a directory" } else { "does not exist" };
            return invalid(
                "proc_root",
                format!("{} {what}; point proc_root (--proc-root) at the host's procfs (/proc)", proc.display()),
            );
        }
        if !proc.join("self").exists() && !proc.join("1").exists() {
            return invalid(
                "proc_root",
                format!(
                    "{} is not a procfs mount (it has neither `self` nor `1`); point proc_root (--proc-root) at the \
                     host's procfs (/proc, or its mount in the pod with hostPID)",
                    proc.display()
                ),
            );
        }
        if let Some(cg) = &self.cgroup_root
            && !cg.is_dir()
        {
            let what = if cg.exists() { "is not a directory" } else { "does not exist" };
            return invalid(
                "cgroup_root",
                format!(
                    "{} {what}; set it to the cgroup v2 mount (e.g. /sys/fs/cgroup), or leave it unset to find it in \
                     {}/self/mountinfo",
                    cg.display(),
                    proc.display()
                ),
            );
        }
        if self.families.cuda {
            // A library that is not there is the cuda family's "nothing to probe" (a node without
            // the driver's user-space libraries still runs; the chart names one path for every
            // node); a file that is there but is not a shared object is a mistake.
            for lib in self.cuda_libraries.iter().filter(|l| l.exists()) {
                if let Err(why) = check_elf(lib) {
                    return invalid(
                        "cuda_libraries",
                        format!(
                            "{}: {why}; give the path of libcuda.so.1 (--libcuda), leave cuda_libraries empty to \
                             search the usual places, or turn the cuda family off (--no-cuda)",
                            lib.display()
                        ),
                    );
                }
            }
        }
        Ok(())
    }

    /// The path prefix the kernel matches opens against: `<dev_dir>/nvidia`.
    pub fn dev_prefix(&self) -> String {
        let d = self.dev_dir.to_string_lossy();
        format!("{}/nvidia", d.trim_end_matches('/'))
    }
}

/// The kernel's page size (a ring buffer is a whole number of pages).
fn page_size() -> u32 {
    // SAFETY: sysconf reads a constant of the system.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u32::try_from(n).unwrap_or(4096)
}

/// A price is a finite amount, not negative.
fn check_price(p: f64) -> Result<(), String> {
    if !p.is_finite() || p < 0.0 {
        return Err(format!("{p} is not a price: write a finite amount of at least 0 (e.g. 2.5), or leave it unset"));
    }
    Ok(())
}

/// Is `path` an ELF file? (A library to put uprobes on: a missing file, a directory or a linker
/// script named `.so` would only show up later as a cuda family that failed.)
fn check_elf(path: &Path) -> Result<(), String> {
    use std::io::Read;
    let mut magic = [0u8; 4];
    let mut f = std::fs::File::open(path).map_err(|e| format!("cannot open it ({e})"))?;
    if !f.metadata().map_err(|e| format!("cannot examine it ({e})"))?.is_file() {
        return Err("is not a regular file".into());
    }
    match f.read_exact(&mut magic) {
        Ok(()) if magic == *b"\x7fELF" => Ok(()),
        Ok(()) | Err(_) => Err("is not an ELF file (no \\x7fELF magic)".into()),
    }
}

#[cfg(test)]
mod tests;
