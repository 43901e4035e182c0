//! NVML: whether it is in use, and the latest sample's per-GPU summary.
use crate::{
    model::{NvmlStatus, NvmlView},
    nvml::model::{DeviceSample, MemoryInfo, MigInstance, Missing, NvmlSample, Utilization},
};

use super::codec::{Counts, Each, Enum, Opt, Shared, wire_enum, wire_message};

/// The names the agent's `nvml::sampler::reason_label` gives (`NvmlView::failed_readings`); the
/// agent's tests check it holds every one.
pub const NVML_FAILURE_REASONS: &[&str] = &[
    "not_supported",
    "gpu_lost",
    "no_permission",
    "symbol_missing",
    "uninitialized",
    "invalid_argument",
    "not_found",
    "insufficient_size",
    "driver_not_loaded",
    "reset_required",
    "timeout",
    "unknown",
    "other",
];

wire_enum!(NvmlStatus => NvmlStatus [NotStarted, Ready, Unavailable, Off]);

wire_message! {
    NvmlView => NvmlView {
        status: Enum,
        reason,
        library,
        driver_version,
        nvml_version,
        failed_readings: Counts(NVML_FAILURE_REASONS),
        samples,
        sample: Shared,
    }
}

wire_message! {
    NvmlSample => NvmlSample {
        taken_unix_ns,
        driver_version,
        nvml_version,
        cuda_driver_version,
        devices => gpus: Each,
        cost_ns,
        missing: Each,
        // Not carried: `taken_mono_ns`, a clock of the agent's host.
        ..
    }
}

wire_message! {
    DeviceSample => NvmlGpu {
        index,
        uuid,
        name,
        minor,
        pci_bus_id,
        memory: Opt,
        utilization: Opt,
        power_mw,
        energy_mj,
        temperature_c,
        mig_enabled,
        mig_instances => mig_devices: Each,
        lost,
        missing: Each,
        // Not carried: clocks, compute mode, the process lists and samples.
        ..
    }
}

wire_message! {
    MigInstance => NvmlMigDevice {
        index,
        uuid,
        gpu_instance_id,
        compute_instance_id,
        name,
        memory: Opt,
        // Not carried: the instance's process list.
        ..
    }
}

wire_message! {
    MemoryInfo => DeviceMemory {
        total => total_bytes,
        reserved => reserved_bytes,
        free => free_bytes,
        used => used_bytes,
    }
}

wire_message! {
    Utilization => GpuUtilization {
        gpu_pct,
        memory_pct,
    }
}

wire_message! {
    Missing => MissingReading {
        what,
        reason,
    }
}
