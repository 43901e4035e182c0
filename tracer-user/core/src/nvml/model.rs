//! What one NVML sample says, as plain data: the sampler (`nvml::sampler`) fills it, the attribution
//! engine (`attribution`) and the exporters read it. Every reading NVML may refuse is an `Option`,
//! and why it is missing is kept in `missing`, so "not supported on this GPU" is never shown as 0.
use serde::{Deserialize, Serialize};

/// A reading that is not there, and why (the NVML error as text, e.g. `NotSupported`, `GpuLost`,
/// `FailedToLoadSymbol(nvmlDeviceGetTotalEnergyConsumption)`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Missing {
    /// The reading, e.g. `energy`, `process_utilization`, `memory`.
    pub what: String,
    pub reason: String,
}

/// Device memory from `nvmlDeviceGetMemoryInfo_v2`: `used` includes `reserved`, and
/// `total = free + used`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryInfo {
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// Device-level utilization (`nvmlDeviceGetUtilizationRates`), percent of the last sample period.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Utilization {
    /// Time at least one kernel was running.
    pub gpu_pct: u32,
    /// Time device memory was read or written.
    pub memory_pct: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Clocks {
    pub graphics_mhz: Option<u32>,
    pub sm_mhz: Option<u32>,
    pub memory_mhz: Option<u32>,
}

/// `nvmlComputeMode_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ComputeMode {
    Default,
    ExclusiveThread,
    Prohibited,
    ExclusiveProcess,
}

/// A process NVML lists on a device (compute, graphics and MPS lists merged, one entry per PID).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcess {
    /// Host PID (NVML is not PID-namespace aware).
    pub pid: u32,
    /// `usedGpuMemory`; `None` when NVML says NVML_VALUE_NOT_AVAILABLE.
    pub used_bytes: Option<u64>,
    /// Which lists it appeared in.
    pub compute: bool,
    pub graphics: bool,
    pub mps: bool,
    /// MIG ids (`None` off MIG).
    pub gpu_instance_id: Option<u32>,
    pub compute_instance_id: Option<u32>,
}

/// One `nvmlDeviceGetProcessUtilization` sample (only samples newer than the previous call's are
/// kept, so none is counted twice).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessUtilization {
    pub pid: u32,
    /// NVML's timestamp, microseconds.
    pub timestamp_us: u64,
    pub sm_pct: u32,
    pub mem_pct: u32,
    pub enc_pct: u32,
    pub dec_pct: u32,
}

/// A MIG device (GPU instance + compute instance) of a MIG-enabled GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigInstance {
    /// Index under the parent (`nvmlDeviceGetMigDeviceHandleByIndex`).
    pub index: u32,
    /// `MIG-…` UUID.
    pub uuid: String,
    pub gpu_instance_id: Option<u32>,
    pub compute_instance_id: Option<u32>,
    /// Its name, e.g. `NVIDIA H200 MIG 1g.18gb`, when NVML gives one.
    pub name: Option<String>,
    pub memory: Option<MemoryInfo>,
    pub processes: Vec<GpuProcess>,
    pub missing: Vec<Missing>,
}

/// One physical GPU at one sample.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSample {
    /// NVML index.
    pub index: u32,
    pub uuid: String,
    pub name: Option<String>,
    /// `/dev/nvidia<minor>`.
    pub minor: Option<u32>,
    pub pci_bus_id: Option<String>,
    pub memory: Option<MemoryInfo>,
    pub utilization: Option<Utilization>,
    pub power_mw: Option<u32>,
    /// Total energy since the driver loaded, millijoules.
    pub energy_mj: Option<u64>,
    pub clocks: Clocks,
    pub temperature_c: Option<u32>,
    pub compute_mode: Option<ComputeMode>,
    /// MIG mode (current); `None` when NVML cannot tell (not supported).
    pub mig_enabled: Option<bool>,
    pub mig_instances: Vec<MigInstance>,
    /// Processes on the whole device (off MIG), deduplicated by PID.
    pub processes: Vec<GpuProcess>,
    /// Samples newer than the previous sample's.
    pub process_utilization: Vec<ProcessUtilization>,
    /// NVML said the GPU is lost (fell off the bus); the other readings are then absent.
    pub lost: bool,
    pub missing: Vec<Missing>,
}

/// One pass over every device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmlSample {
    /// Wall clock when the pass started, ns since the epoch.
    pub taken_unix_ns: u64,
    /// Monotonic clock when the pass started (for rates), ns.
    pub taken_mono_ns: u64,
    pub driver_version: Option<String>,
    pub nvml_version: Option<String>,
    pub cuda_driver_version: Option<i32>,
    pub devices: Vec<DeviceSample>,
    /// Library-level readings that failed (e.g. the device count).
    pub missing: Vec<Missing>,
    /// How long the pass took, ns (the NVML sampling cost per interval).
    pub cost_ns: u64,
}

impl NvmlSample {
    /// NVML's memory of process `pid` (a host PID) on the GPU with `minor` (`None`: summed over
    /// every GPU); `None` when no device lists the process with a figure. A process is counted
    /// once per device (the device's list first, then its MIG instances').
    pub fn process_used_bytes(&self, pid: u32, minor: Option<u32>) -> Option<u64> {
        let mut total = None;
        for d in self.devices.iter().filter(|d| minor.is_none() || d.minor == minor) {
            // The device's list, or on MIG its instances' lists.
            let listed = d.processes.iter().chain(d.mig_instances.iter().flat_map(|m| m.processes.iter()));
            if let Some(b) = listed.filter(|p| p.pid == pid).find_map(|p| p.used_bytes) {
                total = Some(total.unwrap_or(0) + b);
            }
        }
        total
    }
}
