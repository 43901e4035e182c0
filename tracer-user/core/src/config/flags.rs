//! The command-line side of the configuration: [`Overrides`] (flags > file > defaults) and the
//! parsers of flag values.
use std::path::PathBuf;

use super::*;

/// A command-line duration in seconds (`--duration`, `--since`): a finite number of at least 0.
/// NaN or `inf` would mean "never stop" by accident; leave the flag out for that.
pub fn parse_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("`{s}` is not a number of seconds (e.g. 30 or 0.5)"))?;
    if v.is_nan() || v.is_infinite() {
        return Err(format!("`{s}` is not a number of seconds; leave the flag out to run until stopped"));
    }
    if v < 0.0 {
        return Err(format!("`{s}` is negative; give a number of seconds of at least 0"));
    }
    if std::time::Duration::try_from_secs_f64(v).is_err() {
        return Err(format!("`{s}` seconds is too long; leave the flag out to run until stopped"));
    }
    Ok(v)
}

/// A command-line price (`--price-per-gpu-hour`, `--price-per-node-hour`): finite, at least 0.
pub(crate) fn parse_price(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("`{s}` is not a price (e.g. 2.5)"))?;
    check_price(v)?;
    Ok(v)
}

/// Command-line overrides of a [`Config`] (flags > file > defaults): every field is "not given"
/// by default, and [`Overrides::apply`] changes only what was given. The binary flattens it into its
/// global flags, so the doc comments below are the `--help` text.
#[derive(Clone, Debug, Default, PartialEq, clap::Args)]
pub struct Overrides {
    /// Directory with the NVIDIA device nodes [default: /dev].
    #[arg(long, global = true)]
    pub dev_dir: Option<PathBuf>,
    /// Also trust the files in --dev-dir at start as devices although they are not NVIDIA
    /// character devices (the fake driver, `sim`); never on a real node.
    #[arg(long, global = true)]
    pub simulated_devices: bool,
    /// procfs of the host PID namespace [default: /proc].
    #[arg(long, global = true)]
    pub proc_root: Option<PathBuf>,
    /// Kernel-side diagnostics in the log (a copy that faulted, a capture plan that did not
    /// match, as it happens); SIGUSR1 toggles them while running [config: kernel_log].
    #[arg(long, global = true)]
    pub kernel_log: bool,
    /// Where the driver probes attach [default: auto = the cheapest this kernel offers].
    #[arg(long, global = true, value_enum)]
    pub attach_mode: Option<AttachMode>,
    /// How libcuda's uprobes attach [default: auto = multi-uprobe links where the kernel has them].
    #[arg(long, global = true, value_enum)]
    pub cuda_attach: Option<CudaAttach>,
    /// The cuda family's entry programs [default: auto = shared ones with attach cookies where the
    /// kernel has them (5.15+), one per entry point otherwise].
    #[arg(long, global = true, value_enum)]
    pub cuda_entry_programs: Option<CudaEntryPrograms>,
    /// How the lifecycle programs attach [default: auto = tp_btf where the kernel's BTF allows].
    #[arg(long, global = true, value_enum)]
    pub lifecycle_attach: Option<LifecycleAttach>,
    /// Driver-entry mode's probes [default: auto = fentry where the NVIDIA modules have BTF].
    #[arg(long, global = true, value_enum)]
    pub driver_entry_probes: Option<DriverEntryProbes>,
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
    /// A libcuda.so.1 to probe (repeat for several; default: search the usual paths). A file given
    /// that is not an ELF shared object is an error at start; a path that does not exist is not
    /// (one setting serves every node): the cuda family fails, naming it (log, /readyz, doctor).
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
    #[arg(long, global = true, value_name = "PRICE", value_parser = parse_price)]
    pub price_per_gpu_hour: Option<f64>,
    /// Price of the node per hour, split evenly over its GPUs (instead of --price-per-gpu-hour).
    #[arg(long, global = true, value_name = "PRICE", value_parser = parse_price)]
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
    pub otlp_protocol: Option<otlp::OtlpProtocol>,
}

impl Overrides {
    /// Write every given override into `cfg`; what was not given keeps the file's (or the
    /// default) value. `nvml_only` turns every probe family off, whatever else says.
    pub fn apply(&self, cfg: &mut Config) {
        if let Some(d) = &self.dev_dir {
            cfg.dev_dir = d.clone();
        }
        if self.simulated_devices {
            cfg.simulated_devices = true;
        }
        if let Some(p) = &self.proc_root {
            cfg.proc_root = p.clone();
        }
        if self.kernel_log {
            cfg.kernel_log = true;
        }
        if let Some(m) = self.attach_mode {
            cfg.attach_mode = m;
        }
        if let Some(m) = self.cuda_attach {
            cfg.cuda_attach = m;
        }
        if let Some(m) = self.cuda_entry_programs {
            cfg.cuda_entry_programs = m;
        }
        if let Some(m) = self.lifecycle_attach {
            cfg.lifecycle_attach = m;
        }
        if let Some(m) = self.driver_entry_probes {
            cfg.driver_entry_probes = m;
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
