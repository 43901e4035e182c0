//! One GPU, one interval: memory, compute, energy and cost split into lines that add up exactly.
//! Pure functions of a [`GpuInput`]; the [`Attributor`](super::Attributor) adds history.
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{
    input::{ContainerKey, EnergySource, GpuInput},
    split::{split_exact, split_or},
};
use crate::config::{CostPolicy, UnusedCost};

/// 100 % in the compute lines' unit (millipercent: 0.001 %).
pub const FULL: u32 = 100_000;

/// How a GPU is shared, as far as the inputs show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SharingMode {
    Exclusive,
    TimeSlicing,
    Mps,
    Mig,
    Unknown,
}

impl SharingMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SharingMode::Exclusive => "exclusive",
            SharingMode::TimeSlicing => "time-slicing",
            SharingMode::Mps => "MPS",
            SharingMode::Mig => "MIG",
            SharingMode::Unknown => "unknown",
        }
    }
}

/// How the compute lines were split between containers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ComputeMethod {
    /// NVML per-process SM samples.
    ProcessSamples,
    /// The device's activity split by each container's kernel launches (no process samples, e.g.
    /// MIG or some MPS setups): launches are not equal in length, so this is an estimate. With no
    /// activity reading either (MIG instances: NVML has none), the shares are of the launches over
    /// the whole interval and idle time is unknown (`idle` 0, `device_activity_pct` `None`).
    LaunchCounts,
    /// Could not split: busy time is `unattributed` (or all idle when no process was on the GPU).
    None,
}

impl ComputeMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            ComputeMethod::ProcessSamples => "process samples",
            ComputeMethod::LaunchCounts => "launch counts",
            ComputeMethod::None => "none",
        }
    }
}

/// Where a container's memory figure came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemorySource {
    /// NVML per-process `usedGpuMemory` for every process.
    Nvml,
    /// The eBPF driver ledger (NVML gave no per-process figure).
    DriverLedger,
    /// Some processes from each.
    Mixed,
    /// Neither: counted as 0.
    None,
}

/// What the ledgers say about one container's memory on this GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerSplit {
    /// Device memory its RM allocations hold (driver ledger).
    pub driver_bytes: Option<u64>,
    /// Allocated through libcuda (`cuMemAlloc*`). With a caching allocator (PyTorch, vLLM) this is
    /// the framework's *reserved* pool, not the tensors in use: those are invisible to both ledgers.
    pub cuda_allocated_bytes: Option<u64>,
    /// Driver ledger minus CUDA allocations: contexts, runtime, driver-internal allocations.
    pub non_cuda_bytes: Option<u64>,
}

/// One container's lines on one GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerLine {
    pub container: ContainerKey,
    pub name: Option<String>,
    pub pids: Vec<u32>,
    pub memory_bytes: u64,
    pub memory_source: MemorySource,
    pub ledgers: LedgerSplit,
    /// SM share, millipercent of the interval.
    pub sm_millipct: u32,
    pub launches: u64,
    /// `None` when the GPU's energy is unknown.
    pub energy_mj: Option<u64>,
    /// `None` when no price is configured.
    pub cost_nano: Option<u64>,
}

/// Breakdown of the `unattributed` memory line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnattributedMemory {
    /// Processes in no container.
    pub host_processes: u64,
    pub mps_server: u64,
    /// Used, not reserved, and reported by no process: contexts, managed memory, other.
    pub other: u64,
}

/// Memory lines: Σ containers + `driver_reserved` + `unattributed` + `free` = `total`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryLines {
    pub total: u64,
    pub driver_reserved: u64,
    pub unattributed: u64,
    pub unattributed_detail: UnattributedMemory,
    pub free: u64,
    /// Processes reported more than the device's used memory (NVML races): every process figure
    /// was scaled down to fit, in proportion.
    pub scaled_down: bool,
    /// NVML's total / free / used / reserved did not agree (free is trusted, the rest clamped).
    pub inconsistent: bool,
}

/// Compute lines (millipercent): Σ containers + `unattributed` + `idle` = 100 000.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComputeLines {
    pub method: ComputeMethod,
    pub unattributed: u32,
    pub idle: u32,
    /// The device's own activity reading, when there is one (percent).
    pub device_activity_pct: Option<u32>,
    /// Process samples summed over 100 % and were scaled down.
    pub clamped: bool,
}

/// Energy lines (mJ): Σ containers + `unattributed` + `idle` = `delta_mj`. Split by the compute
/// lines; `idle` is the energy of the idle share of the interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnergyLines {
    pub delta_mj: u64,
    pub source: EnergySource,
    pub unattributed: u64,
    pub idle: u64,
}

/// What the cost split was based on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CostBasis {
    MemoryTime,
    ComputeTime,
    Blended,
    RequestBased,
    /// The policy's readings were missing: the whole price is `unattributed`.
    Nothing,
}

/// Cost lines (nano-currency): Σ containers + `idle` + `driver_reserved` + `unattributed` = `price`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CostLines {
    /// This GPU's price for the interval.
    pub price_nano: u64,
    pub policy: CostPolicy,
    /// What was actually used (the policy's basis, or a fallback when its readings were missing).
    pub basis: CostBasis,
    pub unused: UnusedCost,
    /// Free memory / idle time / capacity nobody requested.
    pub idle: u64,
    pub driver_reserved: u64,
    pub unattributed: u64,
}

/// One GPU (or MIG instance) for one interval.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuAttribution {
    pub uuid: String,
    pub parent_uuid: Option<String>,
    pub index: Option<u32>,
    pub name: Option<String>,
    pub minor: Option<u32>,
    pub mig_profile: Option<String>,
    pub sharing: SharingMode,
    /// Why that mode, in words.
    pub sharing_reason: String,
    /// NVML says the GPU is lost: its lines are unattributed, never guessed.
    #[serde(default)]
    pub lost: bool,
    /// Sorted by memory, largest first, then key.
    pub containers: Vec<ContainerLine>,
    /// `None` when NVML gave no memory reading.
    pub memory: Option<MemoryLines>,
    pub compute: ComputeLines,
    pub energy: Option<EnergyLines>,
    pub cost: Option<CostLines>,
}

/// The sharing mode of one GPU and the reason, from what the inputs show.
pub(crate) fn detect_sharing_mode(gpu: &GpuInput) -> (SharingMode, String) {
    if gpu.lost {
        return (SharingMode::Unknown, "GPU lost (NVML: GPU_IS_LOST); nothing attributed this interval".into());
    }
    if gpu.parent_uuid.is_some() || gpu.mig_profile.is_some() {
        let profile = gpu.mig_profile.as_deref().unwrap_or("unknown profile");
        let parent = gpu.parent_uuid.as_deref().map(short_uuid).unwrap_or_default();
        return (SharingMode::Mig, format!("MIG instance {profile} of {parent}"));
    }
    if let Some(p) = gpu.processes.iter().find(|p| p.is_mps_server) {
        return (SharingMode::Mps, format!("MPS server (pid {}) on this GPU", p.pid));
    }
    let containers: BTreeSet<ContainerKey> = gpu.processes.iter().filter_map(|p| p.container).collect();
    let host = gpu.processes.iter().filter(|p| p.container.is_none()).count();
    match (containers.len(), host) {
        (0, 0) => (SharingMode::Unknown, "no process on this GPU".into()),
        (0, h) => (SharingMode::Unknown, format!("only host processes ({h}), no container")),
        (1, 0) => (SharingMode::Exclusive, "one container has processes on it".into()),
        (1, h) => (SharingMode::TimeSlicing, format!("one container and {h} host process(es) share it")),
        (n, _) => (SharingMode::TimeSlicing, format!("{n} containers have processes on it, no MPS/MIG")),
    }
}

/// `GPU-1b2c3d4e` from a full UUID.
pub fn short_uuid(u: &str) -> String {
    let (prefix, rest) = u.split_once('-').unwrap_or(("", u));
    let head: String = rest.chars().take(8).collect();
    if prefix.is_empty() { head } else { format!("{prefix}-{head}") }
}

fn millipct(pct: f64) -> u64 {
    if pct.is_nan() || pct <= 0.0 { 0 } else { (pct.min(100.0) * 1000.0).round() as u64 }
}

/// Prices and policy for one GPU's cost split.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CostParams {
    pub price_nano: u64,
    pub policy: CostPolicy,
    /// Weight of memory-time in `Blended`, parts per million.
    pub blend_memory_ppm: u32,
    pub unused: UnusedCost,
}

/// Attribute one GPU for one interval. `names` supplies display names; `cost` is `None` when no
/// price is configured.
pub(crate) fn attribute_gpu(
    gpu: &GpuInput,
    names: &dyn Fn(ContainerKey) -> Option<String>,
    cost: Option<CostParams>,
) -> GpuAttribution {
    let (sharing, sharing_reason) = detect_sharing_mode(gpu);
    // Containers on this GPU: those with processes, and those with launches but no NVML process.
    let mut keys: BTreeSet<ContainerKey> = gpu.processes.iter().filter_map(|p| p.container).collect();
    keys.extend(gpu.launches.iter().filter(|(_, n)| **n > 0).map(|(k, _)| *k));
    let keys: Vec<ContainerKey> = keys.into_iter().collect();
    let idx: BTreeMap<ContainerKey, usize> = keys.iter().enumerate().map(|(i, k)| (*k, i)).collect();
    let mut lines: Vec<ContainerLine> = keys
        .iter()
        .map(|&k| ContainerLine {
            container: k,
            name: names(k),
            pids: Vec::new(),
            memory_bytes: 0,
            memory_source: MemorySource::None,
            ledgers: LedgerSplit::default(),
            sm_millipct: 0,
            launches: gpu.launches.get(&k).copied().unwrap_or(0),
            energy_mj: None,
            cost_nano: None,
        })
        .collect();
    for p in &gpu.processes {
        if let Some(i) = p.container.and_then(|k| idx.get(&k)) {
            lines[*i].pids.push(p.pid);
        }
    }
    let memory = memory_lines(gpu, &idx, &mut lines);
    let compute = compute_lines(gpu, &idx, &mut lines);
    let energy = gpu.energy.map(|e| {
        let mut w: Vec<u128> = lines.iter().map(|l| l.sm_millipct as u128).collect();
        w.extend([compute.unattributed as u128, compute.idle as u128]);
        let parts = split_or(e.delta_mj, &w, w.len() - 1);
        for (l, p) in lines.iter_mut().zip(&parts) {
            l.energy_mj = Some(*p);
        }
        let n = lines.len();
        EnergyLines { delta_mj: e.delta_mj, source: e.source, unattributed: parts[n], idle: parts[n + 1] }
    });
    let cost = cost.map(|c| cost_lines(gpu, &idx, &mut lines, memory.as_ref(), &compute, c));
    lines.sort_by(|a, b| b.memory_bytes.cmp(&a.memory_bytes).then(a.container.cmp(&b.container)));
    GpuAttribution {
        uuid: gpu.uuid.clone(),
        parent_uuid: gpu.parent_uuid.clone(),
        index: gpu.index,
        name: gpu.name.clone(),
        minor: gpu.minor,
        mig_profile: gpu.mig_profile.clone(),
        sharing,
        sharing_reason,
        lost: gpu.lost,
        containers: lines,
        memory,
        compute,
        energy,
        cost,
    }
}

fn memory_lines(
    gpu: &GpuInput,
    idx: &BTreeMap<ContainerKey, usize>,
    lines: &mut [ContainerLine],
) -> Option<MemoryLines> {
    // Ledger view, independent of NVML.
    for p in &gpu.processes {
        let Some(&i) = p.container.and_then(|k| idx.get(&k)) else { continue };
        let l = &mut lines[i].ledgers;
        if let Some(b) = p.driver_ledger_bytes {
            l.driver_bytes = Some(l.driver_bytes.unwrap_or(0).saturating_add(b));
        }
        if let Some(b) = p.cuda_ledger_bytes {
            l.cuda_allocated_bytes = Some(l.cuda_allocated_bytes.unwrap_or(0).saturating_add(b));
        }
    }
    for l in lines.iter_mut() {
        if let (Some(d), Some(c)) = (l.ledgers.driver_bytes, l.ledgers.cuda_allocated_bytes) {
            l.ledgers.non_cuda_bytes = Some(d.saturating_sub(c));
        }
    }
    let m = gpu.memory?;
    let total = m.total;
    // `free` anchors the split, so it works whether `used` includes `reserved` (v1) or not (v2).
    let free = m.free.min(total);
    let non_free = total - free;
    let reserved = m.reserved.min(non_free);
    let pool = non_free - reserved;
    let consistent =
        m.free.saturating_add(m.used) == total || m.free.saturating_add(m.used).saturating_add(m.reserved) == total;

    // Per process: NVML's figure, else the driver ledger's.
    #[derive(Clone, Copy, PartialEq)]
    enum Owner {
        Container(usize),
        Host,
        Mps,
    }
    let mut owners = Vec::with_capacity(gpu.processes.len());
    let mut bytes = Vec::with_capacity(gpu.processes.len());
    let mut sources: Vec<(bool, bool, bool)> = vec![(false, false, false); lines.len()];
    for p in &gpu.processes {
        let owner = if p.is_mps_server {
            Owner::Mps
        } else {
            match p.container.and_then(|k| idx.get(&k)) {
                Some(&i) => Owner::Container(i),
                None => Owner::Host,
            }
        };
        let (b, src) = match (p.nvml_used_bytes, p.driver_ledger_bytes) {
            (Some(b), _) => (b, 0),
            (None, Some(b)) => (b, 1),
            (None, None) => (0, 2),
        };
        if let Owner::Container(i) = owner {
            match src {
                0 => sources[i].0 = true,
                1 => sources[i].1 = true,
                _ => sources[i].2 = true,
            }
        }
        owners.push(owner);
        bytes.push(b);
    }
    let sum: u128 = bytes.iter().map(|&b| b as u128).sum();
    let scaled_down = sum > pool as u128;
    if scaled_down {
        let w: Vec<u128> = bytes.iter().map(|&b| b as u128).collect();
        bytes = split_or(pool, &w, 0);
    }
    let mut detail = UnattributedMemory::default();
    let mut attributed: u64 = 0;
    for (o, b) in owners.iter().zip(&bytes) {
        attributed += b;
        match o {
            Owner::Container(i) => lines[*i].memory_bytes += b,
            Owner::Host => detail.host_processes += b,
            Owner::Mps => detail.mps_server += b,
        }
    }
    detail.other = pool - attributed;
    for (l, s) in lines.iter_mut().zip(&sources) {
        l.memory_source = match s {
            (true, false, false) => MemorySource::Nvml,
            (false, true, false) => MemorySource::DriverLedger,
            (false, false, _) => MemorySource::None,
            _ => MemorySource::Mixed,
        };
    }
    Some(MemoryLines {
        total,
        driver_reserved: reserved,
        unattributed: detail.host_processes + detail.mps_server + detail.other,
        unattributed_detail: detail,
        free,
        scaled_down,
        inconsistent: !consistent,
    })
}

fn compute_lines(gpu: &GpuInput, idx: &BTreeMap<ContainerKey, usize>, lines: &mut [ContainerLine]) -> ComputeLines {
    let activity = gpu.sm_activity_pct.map(|a| a.min(100) * 1000);
    let sampled = gpu.processes.iter().any(|p| p.nvml_sm_pct.is_some());
    let n = lines.len();
    if sampled {
        // Weights: each container, then unattributed (host processes, MPS server).
        let mut w = vec![0u128; n + 1];
        for p in &gpu.processes {
            let v = p.nvml_sm_pct.map_or(0, millipct) as u128;
            match p.container.and_then(|k| idx.get(&k)).filter(|_| !p.is_mps_server) {
                Some(&i) => w[i] += v,
                None => w[n] += v,
            }
        }
        let sum: u128 = w.iter().sum();
        let clamped = sum > FULL as u128;
        let parts: Vec<u64> =
            if clamped { split_or(FULL as u64, &w, n) } else { w.iter().map(|&x| x as u64).collect() };
        let sampled_sum: u64 = parts.iter().sum();
        // Activity the device saw beyond what the samples explain is unattributed.
        let busy = activity.map_or(sampled_sum, |a| (a as u64).max(sampled_sum));
        for (l, p) in lines.iter_mut().zip(&parts) {
            l.sm_millipct = *p as u32;
        }
        return ComputeLines {
            method: ComputeMethod::ProcessSamples,
            unattributed: (parts[n] + busy - sampled_sum) as u32,
            idle: FULL - busy as u32,
            device_activity_pct: gpu.sm_activity_pct,
            clamped,
        };
    }
    let launches: Vec<u128> = lines.iter().map(|l| l.launches as u128).collect();
    match activity {
        Some(a) => {
            let (method, parts) = match split_exact(a as u64, &launches) {
                Some(p) => (ComputeMethod::LaunchCounts, p),
                None => (ComputeMethod::None, vec![0; n]),
            };
            let given: u64 = parts.iter().sum();
            for (l, p) in lines.iter_mut().zip(&parts) {
                l.sm_millipct = *p as u32;
            }
            ComputeLines {
                method,
                unattributed: a - given as u32,
                idle: FULL - a,
                device_activity_pct: gpu.sm_activity_pct,
                clamped: false,
            }
        }
        None => {
            // No activity reading (MIG): the launches' split of the whole interval; idle unknown.
            if let Some(parts) = split_exact(FULL as u64, &launches) {
                for (l, p) in lines.iter_mut().zip(&parts) {
                    l.sm_millipct = *p as u32;
                }
                return ComputeLines {
                    method: ComputeMethod::LaunchCounts,
                    unattributed: 0,
                    idle: 0,
                    device_activity_pct: None,
                    clamped: false,
                };
            }
            // No activity reading and no samples: nothing ran only if nothing was there (and a
            // lost GPU says nothing: its time is unattributed, not idle).
            let nothing_there = !gpu.lost && gpu.processes.is_empty() && launches.iter().all(|&x| x == 0);
            ComputeLines {
                method: ComputeMethod::None,
                unattributed: if nothing_there { 0 } else { FULL },
                idle: if nothing_there { FULL } else { 0 },
                device_activity_pct: None,
                clamped: false,
            }
        }
    }
}

/// Weights of [containers..., idle, driver_reserved, unattributed] under one basis.
fn basis_weights(
    basis: CostBasis,
    gpu: &GpuInput,
    idx: &BTreeMap<ContainerKey, usize>,
    lines: &[ContainerLine],
    memory: Option<&MemoryLines>,
    compute: &ComputeLines,
) -> Option<Vec<u128>> {
    let n = lines.len();
    let mut w = vec![0u128; n + 3];
    match basis {
        CostBasis::MemoryTime => {
            let m = memory.filter(|m| m.total > 0)?;
            for (i, l) in lines.iter().enumerate() {
                w[i] = l.memory_bytes as u128;
            }
            (w[n], w[n + 1], w[n + 2]) = (m.free as u128, m.driver_reserved as u128, m.unattributed as u128);
        }
        CostBasis::ComputeTime => {
            for (i, l) in lines.iter().enumerate() {
                w[i] = l.sm_millipct as u128;
            }
            (w[n], w[n + 2]) = (compute.idle as u128, compute.unattributed as u128);
        }
        CostBasis::RequestBased => {
            if gpu.requested_fraction.is_empty() {
                return None;
            }
            let mut sum = 0u128;
            for (k, f) in &gpu.requested_fraction {
                let ppm = if f.is_nan() || *f <= 0.0 { 0 } else { (f.min(1.0) * 1e6).round() as u128 };
                if let Some(&i) = idx.get(k) {
                    w[i] = ppm;
                }
                sum += ppm;
            }
            // Capacity nobody asked for is idle (requests of containers not on the GPU count too:
            // they hold the allocation even when they run nothing).
            w[n] = 1_000_000u128.saturating_sub(sum);
            w[n + 2] = 0;
            if w.iter().all(|&x| x == 0) {
                return None;
            }
        }
        CostBasis::Blended | CostBasis::Nothing => return None,
    }
    Some(w)
}

fn cost_lines(
    gpu: &GpuInput,
    idx: &BTreeMap<ContainerKey, usize>,
    lines: &mut [ContainerLine],
    memory: Option<&MemoryLines>,
    compute: &ComputeLines,
    c: CostParams,
) -> CostLines {
    let n = lines.len();
    let weights = |b| basis_weights(b, gpu, idx, lines, memory, compute);
    let spread = |mut w: Vec<u128>| {
        // Spreading the unused lines in proportion = giving them no weight, when anyone has some.
        if c.unused == UnusedCost::Spread && w[..n].iter().any(|&x| x > 0) {
            w[n..].iter_mut().for_each(|x| *x = 0);
        }
        w
    };
    let (basis, parts) = match c.policy {
        CostPolicy::Blended => {
            let (mw, cw) = (weights(CostBasis::MemoryTime), weights(CostBasis::ComputeTime));
            match (mw, cw) {
                (Some(mw), Some(cw)) => {
                    let p = c.blend_memory_ppm.min(1_000_000) as u128;
                    let halves = split_or(c.price_nano, &[p, 1_000_000 - p], 0);
                    let a = split_or(halves[0], &spread(mw), n + 2);
                    let b = split_or(halves[1], &spread(cw), n + 2);
                    (CostBasis::Blended, a.iter().zip(&b).map(|(x, y)| x + y).collect())
                }
                (Some(w), None) => (CostBasis::MemoryTime, split_or(c.price_nano, &spread(w), n + 2)),
                (None, Some(w)) => (CostBasis::ComputeTime, split_or(c.price_nano, &spread(w), n + 2)),
                (None, None) => (CostBasis::Nothing, nothing(c.price_nano, n)),
            }
        }
        policy => {
            let want = match policy {
                CostPolicy::ComputeTime => CostBasis::ComputeTime,
                CostPolicy::RequestBased => CostBasis::RequestBased,
                _ => CostBasis::MemoryTime,
            };
            // Missing readings fall back: requests → memory → compute → nothing.
            let order = [want, CostBasis::MemoryTime, CostBasis::ComputeTime];
            match order.iter().find_map(|b| weights(*b).map(|w| (*b, w))) {
                Some((b, w)) => (b, split_or(c.price_nano, &spread(w), n + 2)),
                None => (CostBasis::Nothing, nothing(c.price_nano, n)),
            }
        }
    };
    for (l, p) in lines.iter_mut().zip(&parts) {
        l.cost_nano = Some(*p);
    }
    CostLines {
        price_nano: c.price_nano,
        policy: c.policy,
        basis,
        unused: c.unused,
        idle: parts[n],
        driver_reserved: parts[n + 1],
        unattributed: parts[n + 2],
    }
}

fn nothing(price: u64, n: usize) -> Vec<u64> {
    let mut v = vec![0; n + 3];
    v[n + 2] = price;
    v
}
