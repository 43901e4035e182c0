//! Section 6: the attribution engine's cost per interval (`Attributor::update`) on a large node:
//! 8 GPUs × 100 containers, each with one process, with a full rightsizing history. No kernel,
//! no root: pure user-space arithmetic, timed per call.
use std::{collections::BTreeMap, fmt::Write, hint::black_box, time::Instant};

use tracer_client::attribution_table::render_attribution;
use tracer_core::{
    attribution::{
        AttributionInput, Attributor, ContainerInput, ContainerKey, GpuInput, GpuRequest, ProcessInput,
        input::{EnergyInput, EnergySource},
    },
    config::AttributionSettings,
    nvml::model::MemoryInfo,
};

use crate::sys;

pub const GPUS: u64 = 8;
pub const CONTAINERS_PER_GPU: u64 = 100;
/// The per-interval goal the issue sets.
const GOAL_US: f64 = 1_000.0;

/// What section 6 measured.
pub struct AttributionMeasured {
    pub updates: usize,
    /// Per `update`, µs: wall and thread CPU.
    pub wall_us: Vec<f64>,
    pub cpu_us: Vec<f64>,
    /// `render_attribution` of the last snapshot at 80 columns, µs (median of the runs).
    pub render_us: f64,
    pub render_lines: usize,
    pub snapshot_json_bytes: usize,
    /// VmRSS growth from before the attributor existed to after its history was full, kB.
    pub rss_growth_kb: u64,
    pub bill_adds_up: bool,
}

pub struct AttributionSection {
    pub result: Result<AttributionMeasured, String>,
}

impl AttributionSection {
    pub fn skipped(why: &str) -> Self {
        Self { result: Err(why.into()) }
    }
}

/// A node: `GPUS` H200s, each with `CONTAINERS_PER_GPU` containers of one process, one host
/// process; the numbers vary with `t` so every interval is different.
pub(crate) fn node(t: u64, start_unix_ns: u64, interval_ns: u64) -> AttributionInput {
    const GIB: u64 = 1 << 30;
    let mut containers = BTreeMap::new();
    let gpus = (0..GPUS)
        .map(|g| {
            let processes: Vec<ProcessInput> = (0..CONTAINERS_PER_GPU)
                .map(|i| {
                    let k = ContainerKey(10_000 + g * CONTAINERS_PER_GPU + i);
                    containers.entry(k).or_insert_with(|| ContainerInput {
                        name: Some(format!("ns-{g}/pod-{i}-7d9f8b6c5/main")),
                        request: Some(GpuRequest::Fraction { fraction: 1.0 / CONTAINERS_PER_GPU as f64 }),
                    });
                    let wobble = (t * 7 + i * 13 + g) % 17;
                    ProcessInput {
                        pid: (100_000 + g * 1_000 + i) as u32,
                        container: Some(k),
                        nvml_used_bytes: Some((i % 10 + 1) * GIB / 10 + wobble * (1 << 20)),
                        nvml_sm_pct: Some(((i + t) % 3) as f64 * 0.25),
                        driver_ledger_bytes: Some((i % 10 + 1) * GIB / 10),
                        cuda_ledger_bytes: Some((i % 10 + 1) * GIB / 12),
                        ..Default::default()
                    }
                })
                .chain([ProcessInput { pid: 50 + g as u32, nvml_used_bytes: Some(GIB / 4), ..Default::default() }])
                .collect();
            let used: u64 = processes.iter().filter_map(|p| p.nvml_used_bytes).sum::<u64>() + GIB;
            let total = 143_771u64 << 20;
            GpuInput {
                uuid: format!("GPU-{g:08x}-0000-0000-0000-000000000000"),
                index: Some(g as u32),
                name: Some("NVIDIA H200".into()),
                minor: Some(g as u32),
                share_of_gpu_ppm: 1_000_000,
                memory: Some(MemoryInfo { total, reserved: 512 << 20, used, free: total - used - (512 << 20) }),
                sm_activity_pct: Some(60 + (t % 30) as u32),
                energy: Some(EnergyInput { delta_mj: 450_000 + t % 1000, source: EnergySource::Counter }),
                launches: processes.iter().filter_map(|p| p.container).map(|k| (k, k.0 % 1000 + t % 5)).collect(),
                processes,
                ..Default::default()
            }
        })
        .collect();
    AttributionInput { start_unix_ns, interval_ns, gpus, containers }
}

const SEC: u64 = 1_000_000_000;

/// The settings every section-6/7 attributor uses: price set, default policy.
pub(crate) fn settings() -> AttributionSettings {
    AttributionSettings { price_per_node_hour: Some(8.0 * 3.49), ..Default::default() }
}

/// Fills the rightsizing history of `a`: one interval per history bucket over the whole window (the
/// history keeps one entry per bucket, so this is the state of an attributor fed for the full window).
/// Returns the next interval's start and the last snapshot.
pub(crate) fn fill_history(
    a: &mut Attributor,
    settings: &AttributionSettings,
) -> (u64, tracer_core::attribution::AttributionSnapshot) {
    let mut t0 = 1_700_000_000 * SEC;
    let mut last = None;
    let bucket_s = settings.rightsizing_window_s / tracer_core::attribution::attributor::HISTORY_BUCKETS as u64;
    for t in 0..tracer_core::attribution::attributor::HISTORY_BUCKETS as u64 {
        let input = node(t, t0, bucket_s * SEC);
        last = Some(black_box(a.update(&input)));
        t0 += bucket_s * SEC;
    }
    (t0, last.expect("HISTORY_BUCKETS > 0"))
}

fn measure(updates: usize) -> AttributionMeasured {
    let settings = settings();
    let rss0 = sys::status_kb("VmRSS").unwrap_or(0);
    let mut a = Attributor::new(&settings);
    let (t0, _) = fill_history(&mut a, &settings);
    let rss1 = sys::status_kb("VmRSS").unwrap_or(0);
    // A pool of different inputs built ahead; each timed call gets a copy made before the clock
    // starts, so only `update` is timed.
    let pool: Vec<AttributionInput> = (0..32u64).map(|t| node(t, 0, SEC)).collect();
    let mut wall_us = Vec::with_capacity(updates);
    let mut cpu_us = Vec::with_capacity(updates);
    let mut last = None;
    for t in 0..updates {
        let mut input = pool[t % pool.len()].clone();
        input.start_unix_ns = t0 + t as u64 * SEC;
        let (c0, w0) = (sys::thread_cpu_ns(), Instant::now());
        let snap = black_box(a.update(&input));
        wall_us.push(w0.elapsed().as_nanos() as f64 / 1e3);
        cpu_us.push((sys::thread_cpu_ns() - c0) as f64 / 1e3);
        // Dropping the previous snapshot is part of a real interval too, but not of `update`.
        last = Some(snap);
    }
    let snap = last.expect("at least one update");
    let b = snap.bill;
    let kept: u128 = snap.containers.iter().map(|c| c.cumulative_cost_nano as u128).sum();
    let bill_adds_up = kept + (b.idle + b.driver_reserved + b.unattributed + b.evicted) as u128 == b.total as u128;
    let mut render = Vec::new();
    let mut render_lines = 0;
    for _ in 0..20 {
        let w0 = Instant::now();
        let out = black_box(render_attribution(&snap, 80));
        render.push(w0.elapsed().as_nanos() as f64 / 1e3);
        render_lines = out.lines().count();
    }
    AttributionMeasured {
        updates,
        wall_us,
        cpu_us,
        render_us: sys::median(&render),
        render_lines,
        snapshot_json_bytes: serde_json_len(&snap),
        rss_growth_kb: rss1.saturating_sub(rss0),
        bill_adds_up,
    }
}

fn serde_json_len(s: &tracer_core::attribution::AttributionSnapshot) -> usize {
    serde_json::to_vec(s).map_or(0, |j| j.len())
}

pub fn section(quick: bool) -> AttributionSection {
    crate::progress(&format!("6: attribution, {GPUS} GPUs × {CONTAINERS_PER_GPU} containers"));
    AttributionSection { result: Ok(measure(if quick { 200 } else { 2_000 })) }
}

/// Nearest-rank percentile of `v` (`q` in 0..=100).
pub(crate) fn percentile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let rank = ((q / 100.0) * s.len() as f64).ceil().max(1.0) as usize;
    s[rank.min(s.len()) - 1]
}

impl AttributionSection {
    pub fn render(&self, s: &mut String) {
        let _ = writeln!(s, "## 6. Attribution engine per interval\n");
        let _ = writeln!(
            s,
            "**Method.** `tracer_core::attribution::Attributor::update` on a synthetic node of {GPUS} H200 GPUs × \
             {CONTAINERS_PER_GPU} containers (one process each with NVML memory and SM samples, both ledgers and launch \
             counts, a request; one host process per GPU), price per node-hour set, default policy (memory-time, unused \
             cost as lines). The rightsizing history is filled first (one interval per history bucket over the whole \
             window), then each timed `update` gets a fresh, pre-built input; wall and thread CPU time per call. \
             Run alone with `cargo xtask bench --only 6`. **Goal:** < {GOAL_US:.0} µs per interval.\n"
        );
        match &self.result {
            Err(e) => {
                let _ = writeln!(s, "not measured: {e}\n");
            }
            Ok(m) => {
                let _ = writeln!(s, "| per `update` | median | p99 | max | × goal (median) |");
                let _ = writeln!(s, "|---|---:|---:|---:|---:|");
                for (name, v) in [("wall µs", &m.wall_us), ("thread CPU µs", &m.cpu_us)] {
                    let med = sys::median(v);
                    let _ = writeln!(
                        s,
                        "| {name} | {med:.0} | {:.0} | {:.0} | {:.2} |",
                        percentile(v, 99.0),
                        sys::max(v),
                        med / GOAL_US
                    );
                }
                let _ = writeln!(
                    s,
                    "\n{} timed updates. The snapshot: {} GPU blocks, {} containers, {:.0} KiB as JSON; \
                     `render_attribution` at 80 columns: {:.0} µs, {} lines. Bill so far = Σ containers + lines: {}. \
                     RSS growth from before the attributor existed to after its history was full (its state, the \
                     last input and snapshot, and allocator slack: an upper bound of the state): {:.1} MiB.\n",
                    m.updates,
                    GPUS,
                    GPUS * CONTAINERS_PER_GPU,
                    m.snapshot_json_bytes as f64 / 1024.0,
                    m.render_us,
                    m.render_lines,
                    if m.bill_adds_up { "exact" } else { "**does not add up**" },
                    m.rss_growth_kb as f64 / 1024.0
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;
