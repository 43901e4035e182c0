//! The agent's configuration: one typed struct, every field defaulted, loaded from TOML and
//! overridden by command-line flags (flags > file > defaults). Unknown keys are warned about, not
//! fatal. Host paths are configurable so tests can point the agent at fixtures and doubles.
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Where the driver-family syscall probes attach. See `docs/ARCHITECTURE.md` for the costs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum AttachMode {
    /// Pick the cheapest mode this kernel offers.
    #[default]
    Auto,
    /// The driver's own ioctl entry points (kprobe/fentry on `nvidia_unlocked_ioctl`): costs other
    /// syscalls nothing. Needs kprobes or fentry and the nvidia module; detected, not yet implemented.
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

/// Which probe families to load. A family that fails to load or attach is reported; the others
/// keep running.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
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
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Config {
    /// Directory holding the NVIDIA device nodes (`nvidiactl`, `nvidia0`, `nvidia-uvm`...).
    /// Default `/dev`.
    pub dev_dir: PathBuf,
    /// procfs mount (host PID namespace). Default `/proc`.
    pub proc_root: PathBuf,
    /// cgroup v2 mount; found from `/proc/self/mountinfo` when unset.
    pub cgroup_root: Option<PathBuf>,
    /// Driver version (`535.261.03`) to choose struct layouts; read from `driver_version_file`
    /// when unset, else the built-in default.
    pub driver_version: Option<String>,
    /// File the driver version is read from. Default `/proc/driver/nvidia/version`.
    pub driver_version_file: PathBuf,
    pub attach_mode: AttachMode,
    pub families: Families,
    /// Ring buffer size in bytes (a power of two, multiple of the page size). Default 8 MiB.
    pub ring_buffer_bytes: u32,
    /// Wake user space every N records per CPU; between wake-ups it drains on a timer. Default 64.
    pub wakeup_every: u32,
    /// How often the ring buffer is drained even without a wake-up, in ms. Default 10.
    pub drain_interval_ms: u64,
    /// How often a snapshot is published, in ms. Default 1000.
    pub snapshot_interval_ms: u64,
    /// Most processes kept in the state tables. Default 16384.
    pub max_processes: usize,
    /// libcuda.so.1 copies to probe; empty: search the usual places (`cuda::attach::SEARCH_PATHS`).
    pub cuda_libraries: Vec<PathBuf>,
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
    pub otlp: crate::export::otlp::OtlpConfig,
}

/// Whether a source is used, and whether its absence is fatal.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum UnusedCost {
    /// Keep them as their own lines (default): the waste stays visible.
    #[default]
    Lines,
    /// Spread them over the containers in proportion to their share.
    Spread,
}

/// Attribution settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AttributionSettings {
    /// Price of one GPU for one hour (any currency). Unset: cost is not computed.
    pub price_per_gpu_hour: Option<f64>,
    /// Alternatively the node's price per hour, split evenly over its GPUs.
    pub price_per_node_hour: Option<f64>,
    pub cost_policy: CostPolicy,
    /// Weight of memory-time in the `blended` policy (0..=1).
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
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

/// The agent's gRPC API (`gputracer.v1.GpuTracer`, docs/api.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiSettings {
    /// `unix:///PATH` (mode 0660), `tcp://IP:PORT`, or `off`. Default
    /// `unix:///run/gpu-tracer/api.sock`.
    pub listen: String,
    /// PEM certificate chain and private key: TLS on a TCP listener (required off loopback).
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// File holding the bearer token every call must carry (`authorization: Bearer <token>`);
    /// surrounding whitespace is ignored. Default: no token (the socket's mode is the guard).
    pub token_file: Option<PathBuf>,
    /// Recent events kept for `Subscribe` replays (`since`, `number`). Default 10000.
    pub history: usize,
    /// Event kinds the history keeps while no subscriber is connected (names as in
    /// `events --json`; `["all"]` for every kind). Default: [`DEFAULT_HISTORY_KINDS`] — every kind
    /// but the high-rate ones (RM controls, map-memory, other and UVM-other ioctls, per-event
    /// launches), which are published only while someone subscribes.
    pub history_kinds: Vec<String>,
    /// Events a subscriber may fall behind before it loses the oldest (told by `LostEvents`).
    /// Default 16384.
    pub subscriber_buffer: usize,
    /// Subscribers served at once. Default 128.
    pub max_subscribers: usize,
}

impl Default for ApiSettings {
    fn default() -> Self {
        let hub = crate::export::api::hub::HubSettings::default();
        Self {
            listen: crate::export::api::listen::DEFAULT_LISTEN.into(),
            tls_cert: None,
            tls_key: None,
            token_file: None,
            history: hub.history,
            history_kinds: DEFAULT_HISTORY_KINDS.iter().map(|k| (*k).to_string()).collect(),
            subscriber_buffer: hub.subscriber_buffer,
            max_subscribers: hub.max_subscribers,
        }
    }
}

/// The default `api.history_kinds`.
pub const DEFAULT_HISTORY_KINDS: &[&str] = &[
    "violation",
    "process_exec",
    "process_exit",
    "process_fork",
    "cgroup_removed",
    "fd_opened",
    "fd_closed",
    "fd_duped",
    "rm_alloc",
    "rm_free",
    "vid_heap_alloc",
    "vid_heap_free",
    "alloc_memory",
    "rm_dup_object",
    "uvm_register_gpu",
    "uvm_map_external",
    "uvm_free",
    "managed_map",
    "managed_unmap",
    "malformed",
    "cuda_alloc",
    "cuda_free",
    "cuda_function",
    "cuda_launch_batch",
];

impl ApiSettings {
    /// `history_kinds` as `EventKind` numbers (`None`: every kind).
    pub fn history_kinds(&self) -> Result<Option<std::collections::BTreeSet<i32>>, ConfigError> {
        if self.history_kinds.iter().any(|k| k == "all") {
            return Ok(None);
        }
        self.history_kinds
            .iter()
            .map(|k| crate::export::api::filter::parse_kind(k))
            .collect::<Result<_, _>>()
            .map(Some)
            .map_err(|why| ConfigError::Invalid { key: "api.history_kinds", why })
    }

    /// Where to listen, or `None` for `off`.
    pub fn addr(&self) -> Result<Option<crate::export::api::listen::ApiAddr>, ConfigError> {
        if self.listen == "off" {
            return Ok(None);
        }
        self.listen.parse().map(Some).map_err(|why| ConfigError::Invalid { key: "api.listen", why })
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.addr()?;
        self.history_kinds()?;
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(ConfigError::Invalid {
                key: "api.tls_cert",
                why: "TLS needs both api.tls_cert and api.tls_key".into(),
            });
        }
        let bounded = |key, v: usize, max: usize| {
            if v > max {
                return Err(ConfigError::Invalid { key, why: format!("{v} is above the limit {max}") });
            }
            Ok(())
        };
        bounded("api.history", self.history, 1_000_000)?;
        bounded("api.max_subscribers", self.max_subscribers, 10_000)?;
        bounded("api.subscriber_buffer", self.subscriber_buffer, 1 << 20)?;
        if self.subscriber_buffer == 0 {
            return Err(ConfigError::Invalid { key: "api.subscriber_buffer", why: "must be at least 1".into() });
        }
        Ok(())
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            dev_dir: PathBuf::from("/dev"),
            proc_root: PathBuf::from("/proc"),
            cgroup_root: None,
            driver_version: None,
            driver_version_file: PathBuf::from("/proc/driver/nvidia/version"),
            attach_mode: AttachMode::Auto,
            families: Families::default(),
            ring_buffer_bytes: tracer_common::capacity::EVENTS_BYTES,
            wakeup_every: 64,
            drain_interval_ms: 10,
            snapshot_interval_ms: 1000,
            max_processes: 16384,
            cuda_libraries: Vec::new(),
            nvml: NvmlSettings::default(),
            attribution: AttributionSettings::default(),
            kubernetes: KubeSettings::default(),
            api: ApiSettings::default(),
            otlp: Default::default(),
        }
    }
}

/// Errors loading the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path} is not valid TOML for gpu-tracer: {source}")]
    Parse { path: PathBuf, source: toml::de::Error },
    #[error("invalid setting {key}: {why}")]
    Invalid { key: &'static str, why: String },
}

impl Config {
    /// Load a TOML file; unknown keys are returned as warnings.
    pub fn from_file(path: &Path) -> Result<(Config, Vec<String>), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
        Self::from_toml(&text).map_err(|source| ConfigError::Parse { path: path.into(), source })
    }

    /// Parse TOML text; unknown keys are returned as warnings.
    pub fn from_toml(text: &str) -> Result<(Config, Vec<String>), toml::de::Error> {
        let cfg: Config = toml::from_str(text)?;
        let mut warnings = Vec::new();
        if let Ok(toml::Value::Table(t)) = text.parse::<toml::Value>() {
            let known = toml::Value::try_from(Config::default()).ok();
            if let Some(toml::Value::Table(k)) = known {
                for key in t.keys() {
                    // Option fields that are None are not serialized; accept them explicitly.
                    let optional = matches!(key.as_str(), "cgroup_root" | "driver_version");
                    if !k.contains_key(key) && !optional {
                        warnings.push(format!("unknown config key `{key}` ignored"));
                    }
                }
            }
        }
        Ok((cfg, warnings))
    }

    /// Check settings that would fail later in a less clear way.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let rb = self.ring_buffer_bytes;
        if !rb.is_power_of_two() || rb < 4096 {
            return Err(ConfigError::Invalid {
                key: "ring_buffer_bytes",
                why: format!("{rb} is not a power of two of at least 4096"),
            });
        }
        let prefix = self.dev_prefix();
        if prefix.len() >= tracer_common::DEV_PREFIX_MAX {
            return Err(ConfigError::Invalid {
                key: "dev_dir",
                why: format!(
                    "{} is too long: the kernel matches at most {} bytes of `<dev_dir>/nvidia`",
                    self.dev_dir.display(),
                    tracer_common::DEV_PREFIX_MAX - 1
                ),
            });
        }
        if !self.dev_dir.is_absolute() {
            return Err(ConfigError::Invalid { key: "dev_dir", why: "must be an absolute path".into() });
        }
        self.api.validate()?;
        self.otlp
            .validate()
            .map_err(|e| ConfigError::Invalid { key: e.key, why: format!("{:?}: {}", e.value, e.why) })?;
        Ok(())
    }

    /// The path prefix the kernel matches opens against: `<dev_dir>/nvidia`.
    pub fn dev_prefix(&self) -> String {
        let d = self.dev_dir.to_string_lossy();
        format!("{}/nvidia", d.trim_end_matches('/'))
    }
}

/// Command-line overrides of a [`Config`] (flags > file > defaults): every field is "not given"
/// by default, and [`Overrides::apply`] changes only what was given. The binary flattens it into its
/// global flags, so the doc comments below are the `--help` text.
#[derive(Clone, Debug, Default, PartialEq, clap::Args)]
pub struct Overrides {
    /// Directory with the NVIDIA device nodes [default: /dev].
    #[arg(long, global = true)]
    pub dev_dir: Option<PathBuf>,
    /// procfs of the host PID namespace [default: /proc].
    #[arg(long, global = true)]
    pub proc_root: Option<PathBuf>,
    /// Where the driver probes attach [default: auto = the cheapest this kernel offers].
    #[arg(long, global = true, value_enum)]
    pub attach_mode: Option<AttachMode>,
    /// Driver version for struct layouts (default: read /proc/driver/nvidia/version).
    #[arg(long, global = true)]
    pub driver_version: Option<String>,
    /// Do not load the driver probe family (fds, ioctls, managed mmaps).
    #[arg(long, global = true)]
    pub no_driver: bool,
    /// Do not load the lifecycle probe family (exec/exit/fork, cgroup removal).
    #[arg(long, global = true)]
    pub no_lifecycle: bool,
    /// Do not load the cuda probe family (uprobes on libcuda.so.1).
    #[arg(long, global = true)]
    pub no_cuda: bool,
    /// A libcuda.so.1 to probe (repeat for several; default: search the usual paths).
    #[arg(long = "libcuda", global = true)]
    pub libcuda: Vec<PathBuf>,
    /// NVML use: auto (use it when there; say why not otherwise), required (exit when it cannot be
    /// used), off [default: auto].
    #[arg(long, global = true, value_enum)]
    pub nvml: Option<SourceMode>,
    /// The libnvidia-ml.so.1 to load [default: the dynamic loader's search].
    #[arg(long, global = true, value_name = "PATH")]
    pub nvml_library: Option<PathBuf>,
    /// No eBPF at all: per-container memory and SM share from NVML and /proc only (works without
    /// CAP_BPF; no launch counts, no allocation ledger, no events).
    #[arg(long, global = true)]
    pub nvml_only: bool,
    /// Price of one GPU-hour (any currency): turns on the cost split.
    #[arg(long, global = true, value_name = "PRICE")]
    pub price_per_gpu_hour: Option<f64>,
    /// Price of the node per hour, split evenly over its GPUs (instead of --price-per-gpu-hour).
    #[arg(long, global = true, value_name = "PRICE")]
    pub price_per_node_hour: Option<f64>,
    /// How cost is split between containers [default: memory-time].
    #[arg(long, global = true, value_enum)]
    pub cost_policy: Option<CostPolicy>,
    /// What happens to idle / reserved / unattributed cost: kept as lines, or spread over the
    /// containers [default: lines].
    #[arg(long, global = true, value_enum)]
    pub unused_cost: Option<UnusedCost>,
    /// Send metrics and events over OTLP to this collector, http://HOST:PORT (agent only). Off
    /// unless an endpoint is set here, in OTEL_EXPORTER_OTLP_ENDPOINT or in [otlp] endpoint; this
    /// flag wins over the environment, which wins over the file.
    #[arg(long, global = true, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// OTLP transport: grpc or http/protobuf [default: grpc]; wins over OTEL_EXPORTER_OTLP_PROTOCOL,
    /// which wins over [otlp] protocol.
    #[arg(long, global = true, value_enum)]
    pub otlp_protocol: Option<crate::export::otlp::OtlpProtocol>,
}

impl Overrides {
    /// Write every given override into `cfg`; what was not given keeps the file's (or the
    /// default) value. `nvml_only` turns every probe family off, whatever else says.
    pub fn apply(&self, cfg: &mut Config) {
        if let Some(d) = &self.dev_dir {
            cfg.dev_dir = d.clone();
        }
        if let Some(p) = &self.proc_root {
            cfg.proc_root = p.clone();
        }
        if let Some(m) = self.attach_mode {
            cfg.attach_mode = m;
        }
        if let Some(v) = &self.driver_version {
            cfg.driver_version = Some(v.clone());
        }
        if self.no_driver {
            cfg.families.driver = false;
        }
        if self.no_lifecycle {
            cfg.families.lifecycle = false;
        }
        if self.no_cuda {
            cfg.families.cuda = false;
        }
        if !self.libcuda.is_empty() {
            cfg.cuda_libraries = self.libcuda.clone();
        }
        if let Some(m) = self.nvml {
            cfg.nvml.mode = m;
        }
        if let Some(p) = &self.nvml_library {
            cfg.nvml.library = Some(p.clone());
        }
        if self.nvml_only {
            cfg.families = Families { driver: false, lifecycle: false, cuda: false };
        }
        if let Some(p) = self.price_per_gpu_hour {
            cfg.attribution.price_per_gpu_hour = Some(p);
        }
        if let Some(p) = self.price_per_node_hour {
            cfg.attribution.price_per_node_hour = Some(p);
        }
        if let Some(p) = self.cost_policy {
            cfg.attribution.cost_policy = p;
        }
        if let Some(u) = self.unused_cost {
            cfg.attribution.unused_cost = u;
        }
        // Kept apart from the file's values: the environment sits between the two (docs/otlp.md).
        if let Some(e) = &self.otlp_endpoint {
            cfg.otlp.flags.endpoint = Some(e.clone());
        }
        if let Some(p) = self.otlp_protocol {
            cfg.otlp.flags.protocol = Some(p);
        }
    }
}

#[cfg(test)]
mod tests;

/// The driver version in use and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedDriverVersion {
    pub version: tracer_common::nv::DriverVersion,
    pub source: String,
    /// True when read from configuration or the driver itself (not the built-in default).
    pub from_driver: bool,
}

impl ResolvedDriverVersion {
    pub fn version_string(&self) -> String {
        let v = self.version;
        format!("{}.{}.{:02}", v.major, v.minor, v.patch)
    }
}

/// Parse `535.261.03` (or the first such token in a `/proc/driver/nvidia/version` text).
pub fn parse_driver_version(text: &str) -> Option<tracer_common::nv::DriverVersion> {
    text.split_whitespace().find_map(|tok| {
        let parts: Vec<&str> = tok.split('.').collect();
        if parts.len() < 2 || parts.len() > 3 {
            return None;
        }
        let n: Vec<u32> = parts.iter().map(|p| p.parse().ok()).collect::<Option<_>>()?;
        if n[0] < 100 {
            return None; // not a driver branch number (e.g. a gcc version "12.2.0")
        }
        Some(tracer_common::nv::DriverVersion::new(n[0], n[1], n.get(2).copied().unwrap_or(0)))
    })
}

/// Driver version: configured > read from `driver_version_file` > built-in default.
pub fn resolve_driver_version(cfg: &Config) -> ResolvedDriverVersion {
    if let Some(v) = cfg.driver_version.as_deref().and_then(parse_driver_version) {
        return ResolvedDriverVersion { version: v, source: "configuration".into(), from_driver: true };
    }
    if let Ok(text) = std::fs::read_to_string(&cfg.driver_version_file) {
        // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Wed ..."
        if let Some(v) = text.lines().next().and_then(parse_driver_version) {
            return ResolvedDriverVersion {
                version: v,
                source: cfg.driver_version_file.display().to_string(),
                from_driver: true,
            };
        }
    }
    ResolvedDriverVersion {
        version: tracer_common::nv::DEFAULT_DRIVER_VERSION,
        source: format!("built-in default ({} not readable)", cfg.driver_version_file.display()),
        from_driver: false,
    }
}
