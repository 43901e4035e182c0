//! What would fit: a container's peak and p95 memory and SM share against the smallest MIG profile
//! or GPU fraction that holds them with headroom.
use serde::{Deserialize, Serialize};

use super::input::{GpuRequest, parse_profile};

/// One MIG profile: name, compute slices (of 7), nominal memory in GB (10^9 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigProfile {
    pub name: &'static str,
    pub slices: u32,
    pub memory_gb: u32,
}

const fn p(name: &'static str, slices: u32, memory_gb: u32) -> MigProfile {
    MigProfile { name, slices, memory_gb }
}

/// MIG profiles per GPU memory size (NVIDIA MIG user guide, "Supported MIG Profiles"), smallest
/// first. Keyed by the full GPU's nominal memory in GB.
pub(crate) const MIG_TABLES: &[(&str, u32, &[MigProfile])] = &[
    (
        "A100 40GB",
        40,
        &[
            p("1g.5gb", 1, 5),
            p("1g.10gb", 1, 10),
            p("2g.10gb", 2, 10),
            p("3g.20gb", 3, 20),
            p("4g.20gb", 4, 20),
            p("7g.40gb", 7, 40),
        ],
    ),
    (
        "A100/H100 80GB",
        80,
        &[
            p("1g.10gb", 1, 10),
            p("1g.20gb", 1, 20),
            p("2g.20gb", 2, 20),
            p("3g.40gb", 3, 40),
            p("4g.40gb", 4, 40),
            p("7g.80gb", 7, 80),
        ],
    ),
    (
        "H100 NVL 94GB",
        94,
        &[
            p("1g.12gb", 1, 12),
            p("1g.24gb", 1, 24),
            p("2g.24gb", 2, 24),
            p("3g.47gb", 3, 47),
            p("4g.47gb", 4, 47),
            p("7g.94gb", 7, 94),
        ],
    ),
    (
        "GH200 96GB",
        96,
        &[
            p("1g.12gb", 1, 12),
            p("1g.24gb", 1, 24),
            p("2g.24gb", 2, 24),
            p("3g.48gb", 3, 48),
            p("4g.48gb", 4, 48),
            p("7g.96gb", 7, 96),
        ],
    ),
    (
        "H200 141GB",
        141,
        &[
            p("1g.18gb", 1, 18),
            p("1g.35gb", 1, 35),
            p("2g.35gb", 2, 35),
            p("3g.71gb", 3, 71),
            p("4g.71gb", 4, 71),
            p("7g.141gb", 7, 141),
        ],
    ),
];

/// The MIG profile table for a GPU with `total_bytes` of memory: the table whose full size is
/// within 8 % of it (NVML's total is a little under the nominal size). `None`: not a MIG GPU we know.
pub(crate) fn mig_table_for(total_bytes: u64) -> Option<&'static [MigProfile]> {
    let gb = total_bytes as f64 / 1e9;
    MIG_TABLES
        .iter()
        .map(|(_, size, t)| ((gb - *size as f64).abs() / *size as f64, *t))
        .filter(|(d, _)| *d <= 0.08)
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, t)| t)
}

/// Usable bytes of a profile: nominal GB less 5 % (an estimate of what the instance reports).
pub(crate) fn profile_bytes(p: &MigProfile) -> u64 {
    p.memory_gb as u64 * 950_000_000
}

/// What would fit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Fit {
    /// The smallest MIG profile of this GPU type that holds the peak plus headroom.
    MigProfile { profile: String },
    /// A share of the GPU (time-slicing / fractional), percent, rounded up.
    Fraction { pct: u32 },
    /// Needs the whole GPU (or more).
    WholeGpu,
}

/// The rightsizing view of one container.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rightsizing {
    /// Seconds of history the statistics cover.
    pub covered_s: u64,
    pub samples: usize,
    pub peak_memory_bytes: u64,
    pub p95_memory_bytes: u64,
    pub peak_sm_millipct: u32,
    pub p95_sm_millipct: u32,
    /// Memory of the GPU it used most memory on.
    pub gpu_total_bytes: u64,
    pub request: Option<GpuRequest>,
    pub fit: Fit,
    /// The fit is smaller than what it asked for.
    pub over_requested: bool,
}

/// Nearest-rank p95 of `v` (reordered in place; linear time).
pub fn p95(v: &mut [u64]) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let rank = (v.len() * 95).div_ceil(100).max(1);
    *v.select_nth_unstable(rank - 1).1
}

/// The smallest thing that fits `peak_memory` and `peak_sm_millipct` with `headroom_pct` added.
pub fn fit(gpu_total_bytes: u64, peak_memory: u64, peak_sm_millipct: u32, headroom_pct: u32) -> Fit {
    let grow = |v: u128| v * (100 + headroom_pct as u128) / 100;
    let need_mem = grow(peak_memory as u128);
    let need_sm = grow(peak_sm_millipct as u128); // millipercent of the whole GPU
    if let Some(table) = mig_table_for(gpu_total_bytes) {
        // Compute of a profile: slices / 7 of the GPU.
        if let Some(p) = table
            .iter()
            .find(|p| profile_bytes(p) as u128 >= need_mem && p.slices as u128 * 100_000 >= need_sm * 7 && p.slices < 7)
        {
            return Fit::MigProfile { profile: p.name.to_string() };
        }
        return Fit::WholeGpu;
    }
    if gpu_total_bytes == 0 {
        return Fit::WholeGpu;
    }
    let mem_pct = (need_mem * 100).div_ceil(gpu_total_bytes as u128);
    let sm_pct = need_sm.div_ceil(1000);
    let pct = mem_pct.max(sm_pct).max(1);
    if pct >= 100 { Fit::WholeGpu } else { Fit::Fraction { pct: pct as u32 } }
}

/// Is `fit` smaller than `request`? Compares fractions of one GPU.
pub(crate) fn is_over_requested(request: &GpuRequest, fit: &Fit) -> bool {
    let fit_frac = match fit {
        Fit::MigProfile { profile } => parse_profile(profile).map_or(1.0, |(g, _)| g as f64 / 7.0),
        Fit::Fraction { pct } => *pct as f64 / 100.0,
        Fit::WholeGpu => 1.0,
    };
    let asked = match request {
        GpuRequest::WholeGpus { count } => *count as f64,
        GpuRequest::MigProfile { profile, count } => {
            parse_profile(profile).map_or(0.0, |(g, _)| g as f64 / 7.0) * *count as f64
        }
        GpuRequest::Fraction { fraction } if fraction.is_finite() => *fraction,
        GpuRequest::Fraction { .. } => 0.0,
    };
    fit_frac + 1e-9 < asked
}

#[cfg(test)]
mod tests;
