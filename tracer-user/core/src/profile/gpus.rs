//! NVML's readings of the GPUs a session's workload uses: each NVML pass as
//! `gputracer.v1.GpuSample`s (the same messages whether the profiler sampled NVML itself or the
//! agent streamed its own samples), which GPUs the workload used, and what the summary says of
//! them.
use std::collections::{BTreeMap, BTreeSet};

use gpu_tracer_proto::v1;
use serde::Serialize;

use super::Recording;
use crate::nvml::model::NvmlSample;

/// One NVML pass as the session records it (lost GPUs left out: they have no readings).
pub fn gpu_samples(sample: &NvmlSample) -> Vec<v1::GpuSample> {
    sample
        .devices
        .iter()
        .filter(|d| !d.lost)
        .map(|d| {
            // The newest utilization sample of each process in this pass.
            let mut util: BTreeMap<u32, (u64, u32, u32)> = BTreeMap::new();
            for u in &d.process_utilization {
                let e = util.entry(u.pid).or_insert((0, 0, 0));
                if u.timestamp_us >= e.0 {
                    *e = (u.timestamp_us, u.sm_pct, u.mem_pct);
                }
            }
            let mut processes: BTreeMap<u32, v1::GpuProcessSample> = BTreeMap::new();
            for p in &d.processes {
                let e =
                    processes.entry(p.pid).or_insert_with(|| v1::GpuProcessSample { pid: p.pid, ..Default::default() });
                if let Some(b) = p.used_bytes {
                    e.used_bytes = Some(e.used_bytes.unwrap_or(0) + b);
                }
            }
            for (pid, (_, sm, mem)) in util {
                let e = processes.entry(pid).or_insert_with(|| v1::GpuProcessSample { pid, ..Default::default() });
                e.sm_pct = Some(sm);
                e.memory_pct = Some(mem);
            }
            v1::GpuSample {
                ktime_ns: sample.taken_mono_ns,
                index: d.index,
                uuid: d.uuid.clone(),
                name: d.name.clone().unwrap_or_default(),
                gpu_pct: d.utilization.map(|u| u.gpu_pct),
                memory_pct: d.utilization.map(|u| u.memory_pct),
                power_mw: d.power_mw,
                memory_used_bytes: d.memory.map(|m| m.used),
                memory_total_bytes: d.memory.map(|m| m.total),
                sm_clock_mhz: d.clocks.sm_mhz,
                memory_clock_mhz: d.clocks.memory_mhz,
                processes: processes.into_values().collect(),
            }
        })
        .collect()
}

/// The GPUs (NVML index) the workload used in the window: those where NVML lists one of its
/// processes (memory or a utilization sample). `None` when NVML lists none of them anywhere
/// (per-process readings not supported, or the workload made no context): every GPU is shown then.
pub fn used_gpus(rec: &Recording) -> Option<BTreeSet<u32>> {
    let used: BTreeSet<u32> = rec
        .gpu_samples
        .iter()
        .filter(|g| g.processes.iter().any(|p| rec.processes.contains_key(&p.pid)))
        .map(|g| g.index)
        .collect();
    (!used.is_empty()).then_some(used)
}

/// The samples of the GPUs shown: those used (or every GPU, when that is not known), inside the
/// window.
pub fn shown(rec: &Recording) -> Vec<&v1::GpuSample> {
    let used = used_gpus(rec);
    rec.gpu_samples
        .iter()
        .filter(|g| used.as_ref().is_none_or(|u| u.contains(&g.index)))
        .filter(|g| g.ktime_ns >= rec.start_ktime_ns && g.ktime_ns <= rec.end_ktime_ns)
        .collect()
}

/// The workload's share of one sample: its processes' SM % (summed) and memory (summed), when
/// NVML gave them.
pub fn workload_share(rec: &Recording, g: &v1::GpuSample) -> (Option<u32>, Option<u64>) {
    let mine: Vec<&v1::GpuProcessSample> = g.processes.iter().filter(|p| rec.processes.contains_key(&p.pid)).collect();
    let sm = mine.iter().filter_map(|p| p.sm_pct).reduce(|a, b| a + b);
    let mem = mine.iter().filter_map(|p| p.used_bytes).reduce(|a, b| a + b);
    (sm, mem)
}

/// What the summary says of one GPU over the window.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuRow {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    /// NVML passes in the window.
    pub samples: u64,
    pub utilization_mean_pct: Option<f64>,
    pub utilization_peak_pct: Option<u32>,
    /// The workload's processes' SM % (NVML's per-process samples), mean over the passes that had one.
    pub workload_sm_mean_pct: Option<f64>,
    pub power_mean_w: Option<f64>,
    pub memory_used_peak_bytes: Option<u64>,
    /// The workload's memory as NVML lists it, at its peak.
    pub workload_memory_peak_bytes: Option<u64>,
    pub sm_clock_mean_mhz: Option<f64>,
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// One row per GPU shown, by index.
pub fn rows(rec: &Recording) -> Vec<GpuRow> {
    let mut by_gpu: BTreeMap<u32, Vec<&v1::GpuSample>> = BTreeMap::new();
    for g in shown(rec) {
        by_gpu.entry(g.index).or_default().push(g);
    }
    by_gpu
        .into_iter()
        .map(|(index, v)| {
            let f = |get: &dyn Fn(&v1::GpuSample) -> Option<f64>| v.iter().filter_map(|g| get(g)).collect::<Vec<f64>>();
            let shares: Vec<(Option<u32>, Option<u64>)> = v.iter().map(|g| workload_share(rec, g)).collect();
            GpuRow {
                index,
                uuid: v[0].uuid.clone(),
                name: v[0].name.clone(),
                samples: v.len() as u64,
                utilization_mean_pct: mean(&f(&|g| g.gpu_pct.map(f64::from))),
                utilization_peak_pct: v.iter().filter_map(|g| g.gpu_pct).max(),
                workload_sm_mean_pct: mean(&shares.iter().filter_map(|s| s.0.map(f64::from)).collect::<Vec<_>>()),
                power_mean_w: mean(&f(&|g| g.power_mw.map(|p| f64::from(p) / 1e3))),
                memory_used_peak_bytes: v.iter().filter_map(|g| g.memory_used_bytes).max(),
                workload_memory_peak_bytes: shares.iter().filter_map(|s| s.1).max(),
                sm_clock_mean_mhz: mean(&f(&|g| g.sm_clock_mhz.map(f64::from))),
            }
        })
        .collect()
}
