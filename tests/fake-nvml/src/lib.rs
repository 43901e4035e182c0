//! A fake `libnvidia-ml.so.1` for tests without a GPU.
//!
//! As a cdylib it exports the NVML functions the agent's sampler reads ([`IMPLEMENTED`]), answering
//! from a JSON [`Scenario`] beside the `.so` (or at `$FAKE_NVML_SCENARIO`), re-read when the file
//! changes; every other symbol nvml-wrapper-sys resolves returns NOT_SUPPORTED. As an rlib it gives
//! tests the scenario types and [`install`] / [`write_scenario`]. See docs/test-doubles.md.
pub mod abi;
mod ffi;
pub mod harness;
pub mod scenario;

pub use harness::{HarnessError, install, write_scenario};
pub use scenario::{
    Clocks, ComputeMode, Device, Memory, MigInstance, MigMode, Process, Scenario, ScenarioError, UsedBytes,
    UtilizationSample,
};

/// The functions with real behaviour; `errors` in a scenario may name these (or `*`).
pub const IMPLEMENTED: &[&str] = &[
    "nvmlInit_v2",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    "nvmlDeviceIsMigDeviceHandle",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetProcessUtilization",
];
