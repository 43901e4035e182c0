//! What the fake library reports: a JSON file (`fake-nvml.json` beside the `.so`, or
//! `$FAKE_NVML_SCENARIO`), parsed with `deny_unknown_fields` so a typo is an error, not a silent
//! NOT_SUPPORTED. A missing optional section makes the matching NVML call return NOT_SUPPORTED, as on a
//! GPU without that feature. Tests build these structs with the builder methods instead of JSON text.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::abi;

/// The whole fake machine: library-level values and the GPUs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// `nvmlSystemGetDriverVersion`, e.g. `550.54.15`.
    pub driver_version: String,
    /// `nvmlSystemGetNVMLVersion`, e.g. `12.550.54.15`; absent -> NOT_SUPPORTED.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvml_version: Option<String>,
    /// `nvmlSystemGetCudaDriverVersion(_v2)`, e.g. 12040; absent -> NOT_SUPPORTED.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_driver_version: Option<i32>,
    /// When set, `nvmlInit_v2`/`nvmlInitWithFlags` return this code (e.g. 9 = DRIVER_NOT_LOADED).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_error: Option<u32>,
    /// Library-level function name (or `*` for all of them) -> forced return code.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub errors: BTreeMap<String, u32>,
    /// The GPUs, in NVML index order.
    #[serde(default)]
    pub devices: Vec<Device>,
}

/// One physical GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Device {
    /// `GPU-…` UUID (required).
    pub uuid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Marketing name (`nvmlDeviceGetName`).
    pub name: Option<String>,
    /// `/dev/nvidia<minor>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<u32>,
    /// `DDDDDDDD:BB:DD.F`, e.g. `00000000:3B:00.0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Device memory (`nvmlDeviceGetMemoryInfo(_v2)`).
    pub memory: Option<Memory>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Device utilization (`nvmlDeviceGetUtilizationRates`).
    pub utilization: Option<Utilization>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Power draw, milliwatts (`nvmlDeviceGetPowerUsage`).
    pub power_mw: Option<u32>,
    /// Energy counter (mJ) when the fake first loaded a scenario.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub energy_mj: Option<u64>,
    /// When set, the energy counter grows by this many mJ per second (= mW) from the moment this
    /// library instance first loaded a scenario, so a counter read twice has grown. Needs `energy_mj`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub energy_rate_mw: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Current clocks (`nvmlDeviceGetClockInfo`).
    pub clocks: Option<Clocks>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// GPU core temperature, °C (`nvmlDeviceGetTemperature`).
    pub temperature_c: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Compute mode (`nvmlDeviceGetComputeMode`).
    pub compute_mode: Option<ComputeMode>,
    /// Absent -> the GPU does not support MIG (every MIG call returns NOT_SUPPORTED).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_mode: Option<MigMode>,
    /// `nvmlDeviceGetMaxMigDeviceCount`; default 7 (or the number of instances, if more).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_mig_devices: Option<u32>,
    /// MIG devices, at indexes 0.. in this order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_instances: Vec<MigInstance>,
    /// `nvmlDeviceGetComputeRunningProcesses_v3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_processes: Option<Vec<Process>>,
    /// `nvmlDeviceGetGraphicsRunningProcesses_v3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graphics_processes: Option<Vec<Process>>,
    /// `nvmlDeviceGetMPSComputeRunningProcesses_v3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_processes: Option<Vec<Process>>,
    /// `nvmlDeviceGetProcessUtilization` returns the samples newer than the caller's last-seen
    /// timestamp, NOT_FOUND when there are none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_utilization: Option<Vec<UtilizationSample>>,
    /// NVML function name (or `*` for every call on this device) -> forced return code, e.g.
    /// `{"*": 15}` = GPU_IS_LOST.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub errors: BTreeMap<String, u32>,
}

/// Device memory as NVML reports it: `used` includes `reserved`; `free = total - used`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Memory {
    /// Total bytes.
    pub total: u64,
    /// Bytes the driver reserves (part of `used`).
    pub reserved: u64,
    /// Bytes in use, reserved included.
    pub used: u64,
}

/// `nvmlUtilization_t`, percent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Utilization {
    /// Percent of time a kernel was running.
    pub gpu: u32,
    /// Percent of time device memory was read or written.
    pub memory: u32,
}

/// `nvmlDeviceGetClockInfo`; an absent clock returns NOT_SUPPORTED.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Clocks {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Graphics clock.
    pub graphics_mhz: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// SM clock.
    pub sm_mhz: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Memory clock.
    pub memory_mhz: Option<u32>,
}

/// `nvmlComputeMode_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ComputeMode {
    /// Many contexts per device.
    Default,
    /// One context, one thread (removed by NVIDIA).
    ExclusiveThread,
    /// No contexts.
    Prohibited,
    /// One context, usable from many threads.
    ExclusiveProcess,
}

/// `nvmlDeviceGetMigMode`'s (current, pending).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigMode {
    /// MIG mode now.
    pub current: bool,
    /// MIG mode after the next GPU reset.
    pub pending: bool,
}

/// A MIG device (GPU instance + compute instance).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigInstance {
    /// `MIG-…` UUID.
    pub uuid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Marketing name (`nvmlDeviceGetName`).
    pub name: Option<String>,
    /// GPU instance id.
    pub gpu_instance_id: u32,
    /// Compute instance id.
    pub compute_instance_id: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Device memory (`nvmlDeviceGetMemoryInfo(_v2)`).
    pub memory: Option<Memory>,
    /// Processes without their own ids get this instance's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_processes: Option<Vec<Process>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// `nvmlDeviceGetGraphicsRunningProcesses_v3` on this handle.
    pub graphics_processes: Option<Vec<Process>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// `nvmlDeviceGetMPSComputeRunningProcesses_v3` on this handle.
    pub mps_processes: Option<Vec<Process>>,
    /// Forced return codes on this MIG handle (the parent's apply too).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub errors: BTreeMap<String, u32>,
}

/// One entry of a running-processes list (`nvmlProcessInfo_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Process {
    /// Host PID.
    pub pid: u32,
    /// Bytes, or `"unavailable"` (NVML_VALUE_NOT_AVAILABLE).
    pub used_bytes: UsedBytes,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// GPU instance id.
    pub gpu_instance_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Compute instance id.
    pub compute_instance_id: Option<u32>,
}

/// `usedGpuMemory`: a number of bytes, or `"unavailable"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum UsedBytes {
    /// A number of bytes.
    Bytes(u64),
    /// NVML_VALUE_NOT_AVAILABLE.
    Unavailable(Unavailable),
}

/// The string `"unavailable"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Unavailable {
    #[serde(rename = "unavailable")]
    /// NVML_VALUE_NOT_AVAILABLE.
    Unavailable,
}

/// One `nvmlProcessUtilizationSample_t`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UtilizationSample {
    /// Host PID.
    pub pid: u32,
    /// NVML timestamp, microseconds.
    pub timestamp_us: u64,
    /// SM utilization, percent.
    pub sm: u32,
    /// Memory-controller utilization, percent.
    pub mem: u32,
    /// Encoder utilization, percent.
    pub enc: u32,
    /// Decoder utilization, percent.
    pub dec: u32,
}

/// Why a scenario cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("fake-nvml scenario is not valid JSON for the scenario format: {0}; see docs/test-doubles.md")]
    /// Not JSON of this format (unknown field, wrong type).
    Parse(#[from] serde_json::Error),
    #[error("fake-nvml scenario: {what}; fix the scenario")]
    /// Parsed, but inconsistent.
    Invalid {
        /// What is wrong, and where.
        what: String,
    },
}

impl Scenario {
    /// A machine with this driver version and no GPUs.
    pub fn new(driver_version: &str) -> Self {
        Self {
            driver_version: driver_version.into(),
            nvml_version: None,
            cuda_driver_version: None,
            init_error: None,
            errors: BTreeMap::new(),
            devices: Vec::new(),
        }
    }
    /// Sets `nvml_version` (see the field).
    pub fn nvml_version(mut self, v: &str) -> Self {
        self.nvml_version = Some(v.into());
        self
    }
    /// Sets `cuda_driver_version` (see the field).
    pub fn cuda_driver_version(mut self, v: i32) -> Self {
        self.cuda_driver_version = Some(v);
        self
    }
    /// `nvmlInit*` returns `code` (e.g. [`abi::DRIVER_NOT_LOADED`]).
    pub fn init_error(mut self, code: u32) -> Self {
        self.init_error = Some(code);
        self
    }
    /// Adds a GPU (the next NVML index).
    pub fn device(mut self, d: Device) -> Self {
        self.devices.push(d);
        self
    }

    /// Parses and checks a scenario.
    pub fn from_json(text: &str) -> Result<Self, ScenarioError> {
        let s: Scenario = serde_json::from_str(text)?;
        s.validate()?;
        Ok(s)
    }

    /// The scenario as pretty JSON (what [`crate::harness::write_scenario`] writes).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Checks what serde cannot: known function names in `errors`, consistent memory, parsable PCI ids.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        let bad = |what: String| Err(ScenarioError::Invalid { what });
        check_errors("errors", &self.errors)?;
        if self.devices.len() > abi::MAX_DEVICES {
            return bad(format!("{} devices, the fake supports {}", self.devices.len(), abi::MAX_DEVICES));
        }
        for (i, d) in self.devices.iter().enumerate() {
            let at = format!("devices[{i}]");
            if d.uuid.is_empty() {
                return bad(format!("{at}.uuid is empty"));
            }
            check_errors(&format!("{at}.errors"), &d.errors)?;
            check_memory(&format!("{at}.memory"), d.memory)?;
            if let Some(bus) = &d.pci_bus_id
                && parse_bus_id(bus).is_none()
            {
                return bad(format!("{at}.pci_bus_id {bus:?} is not DDDDDDDD:BB:DD.F"));
            }
            if d.energy_rate_mw.is_some() && d.energy_mj.is_none() {
                return bad(format!("{at}.energy_rate_mw needs energy_mj"));
            }
            if d.mig_instances.len() > abi::MAX_MIG {
                return bad(format!(
                    "{at} has {} MIG instances, the fake supports {}",
                    d.mig_instances.len(),
                    abi::MAX_MIG
                ));
            }
            if !d.mig_instances.is_empty() && d.mig_mode.is_none() {
                return bad(format!("{at}.mig_instances needs mig_mode"));
            }
            for (j, m) in d.mig_instances.iter().enumerate() {
                check_errors(&format!("{at}.mig_instances[{j}].errors"), &m.errors)?;
                check_memory(&format!("{at}.mig_instances[{j}].memory"), m.memory)?;
            }
        }
        Ok(())
    }
}

fn check_errors(at: &str, errors: &BTreeMap<String, u32>) -> Result<(), ScenarioError> {
    for name in errors.keys() {
        if name != "*" && !crate::IMPLEMENTED.contains(&name.as_str()) {
            return Err(ScenarioError::Invalid {
                what: format!(
                    "{at}: {name:?} is not a function the fake implements (see fake_nvml::IMPLEMENTED) or \"*\""
                ),
            });
        }
    }
    Ok(())
}

fn check_memory(at: &str, m: Option<Memory>) -> Result<(), ScenarioError> {
    match m {
        Some(m) if m.used > m.total || m.reserved > m.used => Err(ScenarioError::Invalid {
            what: format!("{at}: need reserved <= used <= total (used includes reserved), got {m:?}"),
        }),
        _ => Ok(()),
    }
}

/// `DDDDDDDD:BB:DD.F` -> (domain, bus, device).
pub(crate) fn parse_bus_id(s: &str) -> Option<(u32, u32, u32)> {
    let (domain, rest) = s.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    function.parse::<u32>().ok()?;
    Some((
        u32::from_str_radix(domain, 16).ok()?,
        u32::from_str_radix(bus, 16).ok()?,
        u32::from_str_radix(device, 16).ok()?,
    ))
}

impl Device {
    /// A GPU with only a UUID; every optional reading returns NOT_SUPPORTED until set.
    pub fn new(uuid: &str) -> Self {
        Self { uuid: uuid.into(), ..Self::default() }
    }
    /// Sets `name` (see the field).
    pub fn name(mut self, v: &str) -> Self {
        self.name = Some(v.into());
        self
    }
    /// Sets `minor` (see the field).
    pub fn minor(mut self, v: u32) -> Self {
        self.minor = Some(v);
        self
    }
    /// Sets `pci_bus_id` (see the field).
    pub fn pci_bus_id(mut self, v: &str) -> Self {
        self.pci_bus_id = Some(v.into());
        self
    }
    /// `used` includes `reserved`.
    pub fn memory(mut self, total: u64, reserved: u64, used: u64) -> Self {
        self.memory = Some(Memory { total, reserved, used });
        self
    }
    /// Sets `utilization` (see the field).
    pub fn utilization(mut self, gpu: u32, memory: u32) -> Self {
        self.utilization = Some(Utilization { gpu, memory });
        self
    }
    /// Sets `power_mw` (see the field).
    pub fn power_mw(mut self, v: u32) -> Self {
        self.power_mw = Some(v);
        self
    }
    /// Sets `energy_mj` (see the field).
    pub fn energy_mj(mut self, v: u64) -> Self {
        self.energy_mj = Some(v);
        self
    }
    /// The energy counter grows by `mw` mJ per second (see the field).
    pub fn energy_rate_mw(mut self, mw: u64) -> Self {
        self.energy_rate_mw = Some(mw);
        self
    }
    /// Sets `clocks` (see the field).
    pub fn clocks(mut self, graphics_mhz: u32, sm_mhz: u32, memory_mhz: u32) -> Self {
        self.clocks =
            Some(Clocks { graphics_mhz: Some(graphics_mhz), sm_mhz: Some(sm_mhz), memory_mhz: Some(memory_mhz) });
        self
    }
    /// Sets `temperature_c` (see the field).
    pub fn temperature_c(mut self, v: u32) -> Self {
        self.temperature_c = Some(v);
        self
    }
    /// Sets `compute_mode` (see the field).
    pub fn compute_mode(mut self, v: ComputeMode) -> Self {
        self.compute_mode = Some(v);
        self
    }
    /// Sets `mig_mode` (see the field).
    pub fn mig_mode(mut self, current: bool, pending: bool) -> Self {
        self.mig_mode = Some(MigMode { current, pending });
        self
    }
    /// Adds a MIG device (next index); sets MIG mode on if it was unset.
    pub fn mig_instance(mut self, m: MigInstance) -> Self {
        self.mig_mode.get_or_insert(MigMode { current: true, pending: true });
        self.mig_instances.push(m);
        self
    }
    /// Sets `compute_processes` (see the field).
    pub fn compute_processes(mut self, v: Vec<Process>) -> Self {
        self.compute_processes = Some(v);
        self
    }
    /// Sets `graphics_processes` (see the field).
    pub fn graphics_processes(mut self, v: Vec<Process>) -> Self {
        self.graphics_processes = Some(v);
        self
    }
    /// Sets `mps_processes` (see the field).
    pub fn mps_processes(mut self, v: Vec<Process>) -> Self {
        self.mps_processes = Some(v);
        self
    }
    /// Sets `process_utilization` (see the field).
    pub fn process_utilization(mut self, v: Vec<UtilizationSample>) -> Self {
        self.process_utilization = Some(v);
        self
    }
    /// Forces `function` (or `*`) to return `code` on this device.
    pub fn error(mut self, function: &str, code: u32) -> Self {
        self.errors.insert(function.into(), code);
        self
    }
}

impl MigInstance {
    /// A new entry with these values.
    pub fn new(uuid: &str, gpu_instance_id: u32, compute_instance_id: u32) -> Self {
        Self { uuid: uuid.into(), gpu_instance_id, compute_instance_id, ..Self::default() }
    }
    /// Sets `name` (see the field).
    pub fn name(mut self, v: &str) -> Self {
        self.name = Some(v.into());
        self
    }
    /// Sets `memory` (see the field).
    pub fn memory(mut self, total: u64, reserved: u64, used: u64) -> Self {
        self.memory = Some(Memory { total, reserved, used });
        self
    }
    /// Sets `compute_processes` (see the field).
    pub fn compute_processes(mut self, v: Vec<Process>) -> Self {
        self.compute_processes = Some(v);
        self
    }
    /// Sets `graphics_processes` (see the field).
    pub fn graphics_processes(mut self, v: Vec<Process>) -> Self {
        self.graphics_processes = Some(v);
        self
    }
    /// Forces `function` (or `*`) to return `code` on this handle.
    pub fn error(mut self, function: &str, code: u32) -> Self {
        self.errors.insert(function.into(), code);
        self
    }
}

impl Process {
    /// A process using `bytes` of device memory.
    pub fn new(pid: u32, bytes: u64) -> Self {
        Self { pid, used_bytes: UsedBytes::Bytes(bytes), gpu_instance_id: None, compute_instance_id: None }
    }
    /// A process whose memory NVML cannot tell (NVML_VALUE_NOT_AVAILABLE).
    pub fn unavailable(pid: u32) -> Self {
        Self {
            pid,
            used_bytes: UsedBytes::Unavailable(Unavailable::Unavailable),
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }
}

impl UtilizationSample {
    /// A new entry with these values.
    pub fn new(pid: u32, timestamp_us: u64, sm: u32, mem: u32, enc: u32, dec: u32) -> Self {
        Self { pid, timestamp_us, sm, mem, enc, dec }
    }
}
