//! What loading and attaching the probes did, as plain data: the kernel's features, the attach
//! mode, how each probe family fared, where the cuda family's uprobes went on each libcuda copy
//! ([`ProbeReport`]); and each family's state as `/readyz`, `/metrics` and `top --json` show it
//! ([`ProbeFamilyState`]). The agent's `probe` and `cuda::attach` make them; `doctor`, the API and
//! the snapshot read them.
use serde::Serialize;

use crate::config::AttachMode;

/// One probe family (`driver`, `lifecycle`, `cuda`) and how it fared.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProbeFamilyState {
    /// `driver`, `lifecycle` or `cuda`.
    pub family: &'static str,
    pub status: FamilyStatus,
}

impl ProbeFamilyState {
    /// The three families of a probe report, in the order `doctor` lists them.
    pub fn of_report(r: &ProbeReport) -> Vec<Self> {
        [("driver", &r.driver), ("lifecycle", &r.lifecycle), ("cuda", &r.cuda)]
            .into_iter()
            .map(|(family, status)| ProbeFamilyState { family, status: status.clone() })
            .collect()
    }

    /// `attached`, `disabled` (by configuration), `failed`, or `nothing_to_probe` (the cuda family
    /// on a node without libcuda: not a fault of the probes).
    pub fn state(&self) -> &'static str {
        match self.status {
            FamilyStatus::Attached { .. } => "attached",
            FamilyStatus::Disabled => "disabled",
            FamilyStatus::Failed { .. } => "failed",
            FamilyStatus::NothingToProbe { .. } => "nothing_to_probe",
        }
    }

    /// Why a family that was switched on failed to attach; `None` when attached, switched off, or
    /// with nothing to probe. Such a failure makes `/readyz` answer 503.
    pub fn failure(&self) -> Option<&str> {
        match &self.status {
            FamilyStatus::Failed { error } => Some(error),
            _ => None,
        }
    }
}

/// What the kernel offers, read once at start-up.
#[derive(Clone, Debug, Default, Serialize)]
pub struct KernelFeatures {
    pub release: String,
    /// `/sys/kernel/btf/vmlinux` exists (needed by the btf-tracepoint mode).
    pub btf: bool,
    /// tracefs is mounted at `/sys/kernel/tracing` (needed for tracepoint ids).
    pub tracefs: bool,
    /// kprobes are built in (`/sys/bus/event_source/devices/kprobe`).
    pub kprobes: bool,
    /// The nvidia kernel module is loaded (`/sys/module/nvidia`).
    pub nvidia_module: bool,
    /// The `syscalls:*` per-syscall tracepoints exist.
    pub syscall_tracepoints: bool,
    /// Driver-entry mode's attach points on this node (kprobes present, the nvidia module loaded
    /// and its entry points found in kallsyms), or `None`.
    pub driver_entry: Option<EntryPoints>,
    /// How the entry points were chosen, or why driver-entry mode is unavailable.
    pub driver_entry_detail: String,
}

/// What driver-entry mode attaches to on this node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EntryPoints {
    /// `/sys/module/nvidia/version`, when the module says.
    pub driver_version: Option<String>,
    pub nvidia: Functions,
    /// `None` while `nvidia-uvm` is not loaded (it is often loaded on demand, with the first CUDA
    /// process): then UVM calls are not seen in this mode.
    pub uvm: Option<Functions>,
    /// Whether `nvidia-uvm` has its managed-memory entry points (`uvm_mmap_entry`,
    /// `uvm_vm_close_managed_entry`): managed mappings are seen.
    pub uvm_managed: bool,
    /// How the names were chosen, for `doctor`.
    pub detail: String,
}

/// One driver's three probed functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Functions {
    pub open: &'static str,
    pub release: &'static str,
    pub ioctl: &'static str,
}

/// How one probe family fared.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum FamilyStatus {
    Attached {
        programs: Vec<String>,
    },
    Disabled,
    Failed {
        error: String,
    },
    /// The family found nothing on this node to attach to (the cuda family without a libcuda):
    /// not a fault of the probes, and the other families still account for memory. Serialized
    /// like [`FamilyStatus::Failed`] (`"state": "failed"`, with the same `error`).
    #[serde(rename = "failed")]
    NothingToProbe {
        error: String,
    },
}

impl FamilyStatus {
    /// Why the family is not attached, when it was meant to be (failed, or nothing to probe).
    pub fn error(&self) -> Option<&str> {
        match self {
            FamilyStatus::Failed { error } | FamilyStatus::NothingToProbe { error } => Some(error),
            FamilyStatus::Attached { .. } | FamilyStatus::Disabled => None,
        }
    }
}

/// Where the driver probes attached, or that no eBPF was loaded at all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProbeMode {
    /// Probes loaded; the driver family uses this mechanism.
    Attached(AttachMode),
    /// Every probe family is off: numbers come from NVML and `/proc` only.
    #[default]
    NvmlOnly,
}

impl ProbeMode {
    /// The name shown by `doctor`, `top`, `/readyz` and the `build_info` metric.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeMode::Attached(m) => m.as_str(),
            ProbeMode::NvmlOnly => "none (nvml-only)",
        }
    }
}

impl std::fmt::Display for ProbeMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ProbeMode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// What loading and attaching did; shown by `doctor` and logged by every command.
#[derive(Clone, Debug, Serialize)]
pub struct ProbeReport {
    pub features: KernelFeatures,
    pub attach_mode: ProbeMode,
    pub attach_reason: String,
    pub driver_abi: String,
    pub driver: FamilyStatus,
    pub lifecycle: FamilyStatus,
    pub cuda: FamilyStatus,
    /// Per libcuda copy: which entry points are probed, and where.
    pub cuda_libraries: Vec<LibraryReport>,
    /// How opened files are recognised as NVIDIA devices (`devcheck`).
    pub device_check: DeviceCheckReport,
}

/// How opened files are recognised as NVIDIA devices.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DeviceCheckReport {
    /// False without kernel BTF: the path alone decides.
    pub enabled: bool,
    /// Files accepted as simulated devices (`simulated_devices`).
    pub simulated_files: u32,
    pub detail: String,
}

impl ProbeReport {
    /// The report of an agent that loads no eBPF (every family off: NVML-only mode), on a kernel
    /// with `features`.
    pub fn nvml_only(features: KernelFeatures) -> Self {
        ProbeReport {
            features,
            attach_mode: ProbeMode::NvmlOnly,
            attach_reason: "every probe family is disabled: numbers come from NVML and /proc only".into(),
            driver_abi: String::new(),
            driver: FamilyStatus::Disabled,
            lifecycle: FamilyStatus::Disabled,
            cuda: FamilyStatus::Disabled,
            cuda_libraries: Vec::new(),
            device_check: DeviceCheckReport { detail: "no probes".into(), ..Default::default() },
        }
    }
}

/// How one entry point fared.
#[derive(Clone, Debug, Serialize)]
pub struct EntryReport {
    pub symbol: &'static str,
    /// `attached`, `missing` (the library lacks it) or `failed`.
    pub status: &'static str,
    pub detail: String,
}

/// How one library fared.
#[derive(Clone, Debug, Serialize)]
pub struct LibraryReport {
    pub path: String,
    pub inode: u64,
    /// How its uprobes are attached.
    pub method: Method,
    /// Why not with multi links (the kernel refused them, or the configuration); empty with them.
    pub method_detail: String,
    /// Uprobes placed on it (entry and return probes), and the kernel links holding them.
    pub uprobes: usize,
    pub links: usize,
    pub entries: Vec<EntryReport>,
}

impl LibraryReport {
    pub fn attached(&self) -> usize {
        self.entries.iter().filter(|e| e.status == "attached").count()
    }
}

/// How a library's uprobes are attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// One `uprobe_multi` link per program ([`multi`]): CAP_BPF + CAP_PERFMON, detached under one
    /// RCU grace period.
    UprobeMulti,
    /// One perf event per probe (aya's `UProbe::attach`): needs CAP_SYS_ADMIN; each detaches
    /// with a grace period of its own.
    PerfEvent,
    /// One perf event per probe on a trace event made through tracefs (`uprobe_events`), where the
    /// kernel refused the uprobe PMU ([`tracefs`]): CAP_PERFMON and write access to tracefs.
    Tracefs,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::UprobeMulti => "uprobe-multi",
            Method::PerfEvent => "perf-event",
            Method::Tracefs => "tracefs",
        }
    }
}
