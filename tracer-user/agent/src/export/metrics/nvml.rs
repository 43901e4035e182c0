//! NVML's device readings (the dcgm-exporter device metrics with the same meaning), MIG instance
//! memory, and whether NVML is in use.
use std::{collections::BTreeMap, fmt};

use super::{GpuIdLabels, LabelSet, MetricEncoder, Scrape, Unit, counter, counter_family, gauge, gauge_family, joules};

/// Labels of `gpu_tracer_gpu_info`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct GpuInfoLabels {
    gpu: GpuIdLabels,
    /// NVML index (dcgm-exporter's `gpu` label).
    index: String,
    model: String,
    pci_bus_id: String,
}

impl LabelSet for GpuInfoLabels {
    fn visit(&self, label: &mut dyn FnMut(&str, &str) -> fmt::Result) -> fmt::Result {
        self.gpu.visit(label)?;
        label("index", &self.index)?;
        label("model", &self.model)?;
        label("pci_bus_id", &self.pci_bus_id)
    }
}

/// NVML's device readings (dcgm-exporter's device metrics with the same meaning) and whether
/// NVML is in use.
pub fn nvml_devices(s: &Scrape<'_>, e: &mut dyn MetricEncoder) -> fmt::Result {
    let n = &s.snapshot.nvml;
    gauge(
        e,
        "nvml_up",
        "1 when NVML is loaded and sampled, else 0 (off or unavailable).",
        None,
        u64::from(n.status == tracer_core::model::NvmlStatus::Ready),
    )?;
    counter(e, "nvml_samples", "NVML samples taken.", None, n.samples)?;
    counter_family(
        e,
        "nvml_failed_readings",
        "NVML readings refused, by reason (not_supported: the GPU lacks the feature).",
        None,
        n.failed_readings.iter().map(|(k, v)| ([("reason", *k)], *v)),
    )?;
    let Some(sample) = n.sample.as_deref() else {
        return Ok(());
    };
    let devices = &sample.devices;
    let id = |d: &tracer_core::nvml::model::DeviceSample| GpuIdLabels::new(&d.uuid, d.minor, None);
    gauge_family(
        e,
        "gpu_info",
        "Each GPU NVML sees: UUID, /dev/nvidiaN, NVML index, model and PCI bus id; value 1.",
        None,
        devices.iter().map(|d| {
            let l = GpuInfoLabels {
                gpu: id(d),
                index: d.index.to_string(),
                model: d.name.clone().unwrap_or_default(),
                pci_bus_id: d.pci_bus_id.clone().unwrap_or_default(),
            };
            (l, 1u64)
        }),
    )?;
    gauge_family(
        e,
        "gpu_lost",
        "1 when NVML says the GPU fell off the bus (its other readings are then absent).",
        None,
        devices.iter().map(|d| (id(d), u64::from(d.lost))),
    )?;
    let each = |f: &dyn Fn(&tracer_core::nvml::model::DeviceSample) -> Option<f64>| -> Vec<(GpuIdLabels, f64)> {
        devices.iter().filter_map(|d| Some((id(d), f(d)?))).collect()
    };
    gauge_family(
        e,
        "gpu_power",
        "Power draw (DCGM_FI_DEV_POWER_USAGE).",
        Some(Unit::Watts),
        each(&|d| Some(d.power_mw? as f64 / 1e3)),
    )?;
    counter_family(
        e,
        "gpu_energy",
        "Energy used since the driver loaded (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, which is in mJ).",
        Some(Unit::Joules),
        each(&|d| Some(joules(d.energy_mj?))),
    )?;
    gauge_family(
        e,
        "gpu_temperature",
        "GPU temperature (DCGM_FI_DEV_GPU_TEMP).",
        Some(Unit::Celsius),
        each(&|d| Some(d.temperature_c? as f64)),
    )?;
    gauge_family(
        e,
        "gpu_utilization",
        "Time at least one kernel ran, 0..1 (DCGM_FI_DEV_GPU_UTIL, which is in percent).",
        Some(Unit::Ratio),
        each(&|d| Some(d.utilization?.gpu_pct as f64 / 100.0)),
    )?;
    gauge_family(
        e,
        "gpu_memory_utilization",
        "Time device memory was read or written, 0..1 (DCGM_FI_DEV_MEM_COPY_UTIL, in percent).",
        Some(Unit::Ratio),
        each(&|d| Some(d.utilization?.memory_pct as f64 / 100.0)),
    )?;
    let hz = Some(Unit::Hertz);
    gauge_family(
        e,
        "gpu_sm_clock",
        "SM clock (DCGM_FI_DEV_SM_CLOCK, which is in MHz).",
        hz,
        each(&|d| Some(d.clocks.sm_mhz? as f64 * 1e6)),
    )?;
    gauge_family(
        e,
        "gpu_memory_clock",
        "Memory clock (DCGM_FI_DEV_MEM_CLOCK, which is in MHz).",
        hz,
        each(&|d| Some(d.clocks.memory_mhz? as f64 * 1e6)),
    )?;
    // Memory of GPUs and of MIG instances (the instance's own memory, under its MIG UUID).
    let mut mem: BTreeMap<GpuIdLabels, tracer_core::nvml::model::MemoryInfo> = BTreeMap::new();
    for d in devices {
        if let Some(m) = d.memory {
            mem.insert(id(d), m);
        }
        for m in &d.mig_instances {
            if let Some(mi) = m.memory {
                let profile = m.name.as_deref().and_then(tracer_core::attribution::input::mig_profile_of);
                mem.insert(GpuIdLabels::new(&m.uuid, d.minor, Some(profile.as_deref().unwrap_or("unknown"))), mi);
            }
        }
    }
    let bytes = Some(Unit::Bytes);
    let m = |e: &mut dyn MetricEncoder, name, help, f: fn(&tracer_core::nvml::model::MemoryInfo) -> u64| {
        gauge_family(e, name, help, bytes, mem.iter().map(|(l, m)| (l, f(m))))
    };
    m(
        e,
        "gpu_memory_used",
        "Device memory in use, not counting driver-reserved (DCGM_FI_DEV_FB_USED, in MiB).",
        |m| m.used.saturating_sub(m.reserved),
    )?;
    m(e, "gpu_memory_reserved", "Device memory the driver reserves (DCGM_FI_DEV_FB_RESERVED, in MiB).", |m| {
        m.reserved
    })?;
    m(e, "gpu_memory_free", "Free device memory (DCGM_FI_DEV_FB_FREE, in MiB).", |m| m.free)?;
    m(e, "gpu_memory_total", "Device memory: used + reserved + free (DCGM_FI_DEV_FB_TOTAL, in MiB).", |m| m.total)
}
