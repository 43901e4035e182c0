//! What the attribution engine reads for one interval, as plain data, and the adapter that builds it
//! from two NVML samples plus what the tracer knows about each PID.
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::nvml::model::{DeviceSample, GpuProcess, MemoryInfo, NvmlSample};

/// A container, by its cgroup id (identity and labels are attached by later stages).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ContainerKey(pub u64);

/// What a container asked for (filled by the Kubernetes stage; optional everywhere).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum GpuRequest {
    /// `nvidia.com/gpu: N` on a GPU that is not shared.
    WholeGpus { count: u32 },
    /// A MIG profile, e.g. `nvidia.com/mig-3g.71gb: 1`.
    MigProfile { profile: String, count: u32 },
    /// A share of a GPU: time-slicing replicas (1 of N) or a fractional request, 0..=1.
    Fraction { fraction: f64 },
}

/// Per-container facts that are not per GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ContainerInput {
    /// A name for people (`namespace/pod/container`), when known.
    pub name: Option<String>,
    /// What it asked for.
    pub request: Option<GpuRequest>,
}

/// How a GPU's energy delta was obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EnergySource {
    /// Difference of the total-energy counter between two samples.
    Counter,
    /// The counter went backwards (driver reloaded): the new reading is the energy since the reset.
    CounterReset,
    /// No counter: mean power of the two samples × the interval (an estimate).
    PowerTimesInterval,
    /// A MIG instance: the parent GPU's energy × this instance's share of the GPU (an estimate:
    /// NVML has no per-instance power).
    ParentShare,
}

/// Energy used by a GPU over the interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnergyInput {
    pub delta_mj: u64,
    pub source: EnergySource,
}

/// One process on one GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessInput {
    /// Host PID.
    pub pid: u32,
    /// Its container; `None`: a host process (no container).
    pub container: Option<ContainerKey>,
    /// The MPS server (`nvidia-cuda-mps-server`): its memory and time belong to no single client.
    pub is_mps_server: bool,
    /// NVML `usedGpuMemory`.
    pub nvml_used_bytes: Option<u64>,
    /// NVML SM utilization, percent, averaged over the interval's process samples.
    pub nvml_sm_pct: Option<f64>,
    /// Device memory in the eBPF driver ledger (RM vidmem allocations of this PID on this GPU).
    pub driver_ledger_bytes: Option<u64>,
    /// Device memory allocated through libcuda (`cuMemAlloc*`) by this PID on this GPU.
    pub cuda_ledger_bytes: Option<u64>,
}

/// One physical GPU, one MIG instance, or the unpartitioned slices of a MIG-enabled GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuInput {
    /// `GPU-…` or `MIG-…` UUID (for unpartitioned slices: the parent's UUID).
    pub uuid: String,
    /// The physical GPU's UUID, for MIG instances.
    pub parent_uuid: Option<String>,
    /// NVML index of the physical GPU.
    pub index: Option<u32>,
    pub name: Option<String>,
    /// `/dev/nvidia<minor>` of the physical GPU.
    pub minor: Option<u32>,
    /// MIG profile, e.g. `3g.71gb` (`unpartitioned` for slices with no instance).
    pub mig_profile: Option<String>,
    /// Fraction of the physical GPU this input stands for, parts per million (1_000_000 for a whole
    /// GPU; slices / 7 for a MIG instance). Splits the GPU's price.
    pub share_of_gpu_ppm: u32,
    pub memory: Option<MemoryInfo>,
    /// Device activity (time at least one kernel ran), percent.
    pub sm_activity_pct: Option<u32>,
    pub energy: Option<EnergyInput>,
    pub processes: Vec<ProcessInput>,
    /// Kernel launches per container in the interval (eBPF counts), for containers on this GPU.
    pub launches: BTreeMap<ContainerKey, u64>,
    /// Requested fraction of this GPU per container (0..=1), for the request-based cost policy.
    pub requested_fraction: BTreeMap<ContainerKey, f64>,
    /// NVML says the GPU is lost (fell off the bus): nothing it would report is known, and nothing
    /// is made up for it (no energy estimate, no idle time: the interval is unattributed).
    #[serde(default)]
    pub lost: bool,
}

/// One interval's input.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AttributionInput {
    /// Start of the interval, ns since the epoch.
    pub start_unix_ns: u64,
    /// Length of the interval, ns.
    pub interval_ns: u64,
    pub gpus: Vec<GpuInput>,
    /// Names and requests of the containers seen.
    pub containers: BTreeMap<ContainerKey, ContainerInput>,
}

/// Who owns a PID, as the caller knows it (cgroup → container; comm → MPS server).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessOwner {
    /// `None`: the PID is in no container (the root cgroup or a host service).
    pub container: Option<ContainerKey>,
    /// A name for people, when known.
    pub display_name: Option<String>,
    /// The PID is `nvidia-cuda-mps-server`.
    pub is_mps_server: bool,
}

/// The two ledgers' bytes of one PID on one GPU (both optional: the family may be off).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessLedgers {
    pub driver_bytes: Option<u64>,
    pub cuda_bytes: Option<u64>,
}

const PPM: u32 = 1_000_000;

/// `3g.71gb` from `NVIDIA H200 MIG 3g.71gb` (the last word shaped like `<n>g.<m>gb`).
pub fn mig_profile_of(name: &str) -> Option<String> {
    name.split_whitespace().rev().find(|w| parse_profile(w).is_some()).map(str::to_string)
}

/// `(slices, nominal GB)` of a profile name such as `1g.18gb`, `1g.10gb+me` or `1c.3g.40gb`.
pub(crate) fn parse_profile(profile: &str) -> Option<(u32, u32)> {
    let p = profile.split('+').next()?;
    let p = p.rsplit_once("c.").map_or(p, |(_, rest)| rest);
    let (g, m) = p.split_once("g.")?;
    let m = m.strip_suffix("gb")?;
    let (g, m) = (g.parse::<u32>().ok()?, m.parse::<u32>().ok()?);
    (1..=8).contains(&g).then_some((g, m))
}

fn missing(d: &DeviceSample, what: &str) -> bool {
    d.missing.iter().any(|m| m.what == what)
}

/// Energy of `d` over the interval, from its counter (or power × time without one).
fn energy_of(d: &DeviceSample, prev: Option<&DeviceSample>, interval_ns: u64) -> Option<EnergyInput> {
    let prev = prev?;
    if let (Some(now), Some(before)) = (d.energy_mj, prev.energy_mj) {
        return Some(if now >= before {
            EnergyInput { delta_mj: now - before, source: EnergySource::Counter }
        } else {
            EnergyInput { delta_mj: now, source: EnergySource::CounterReset }
        });
    }
    let power = match (d.power_mw, prev.power_mw) {
        (Some(a), Some(b)) => (a as u64 + b as u64) / 2,
        (Some(a), None) | (None, Some(a)) => a as u64,
        (None, None) => return None,
    };
    // mW × ns / 1e9 = mJ.
    let mj = (power as u128 * interval_ns as u128 / 1_000_000_000).min(u64::MAX as u128) as u64;
    Some(EnergyInput { delta_mj: mj, source: EnergySource::PowerTimesInterval })
}

/// Mean SM % per PID of the device's process samples; `None` when NVML cannot sample processes.
fn sm_by_pid(d: &DeviceSample) -> Option<BTreeMap<u32, f64>> {
    if missing(d, "process_utilization") {
        return None;
    }
    let mut acc: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for s in &d.process_utilization {
        let e = acc.entry(s.pid).or_default();
        e.0 += s.sm_pct.min(100) as u64;
        e.1 += 1;
    }
    Some(acc.into_iter().map(|(pid, (sum, n))| (pid, sum as f64 / n as f64)).collect())
}

/// A `GpuInput`'s processes, owners and ledgers applied; notes each container seen.
fn processes_of(
    procs: &[GpuProcess],
    sm: Option<&BTreeMap<u32, f64>>,
    minor: Option<u32>,
    owner_of: &impl Fn(u32) -> Option<ProcessOwner>,
    ledger_of: &impl Fn(u32, Option<u32>) -> ProcessLedgers,
    containers: &mut BTreeMap<ContainerKey, ContainerInput>,
) -> Vec<ProcessInput> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(procs.len());
    for p in procs {
        if !seen.insert(p.pid) {
            continue;
        }
        let owner = owner_of(p.pid).unwrap_or_default();
        if let Some(k) = owner.container {
            let c = containers.entry(k).or_default();
            if c.name.is_none() {
                c.name = owner.display_name.clone();
            }
        }
        let l = ledger_of(p.pid, minor);
        out.push(ProcessInput {
            pid: p.pid,
            container: owner.container,
            is_mps_server: owner.is_mps_server,
            nvml_used_bytes: p.used_bytes,
            // A PID NVML lists but did not sample was idle over the interval.
            nvml_sm_pct: sm.map(|m| m.get(&p.pid).copied().unwrap_or(0.0)),
            driver_ledger_bytes: l.driver_bytes,
            cuda_ledger_bytes: l.cuda_bytes,
        });
    }
    out
}

fn launches_for(procs: &[ProcessInput], launches: &BTreeMap<ContainerKey, u64>) -> BTreeMap<ContainerKey, u64> {
    procs.iter().filter_map(|p| p.container).filter_map(|k| launches.get(&k).map(|&n| (k, n))).collect()
}

/// Build one interval's input from the NVML sample at its end (`sample`) and the one at its start
/// (`prev`; `None` for the first sample: zero-length interval, no energy).
///
/// `owner_of` maps a host PID to its container; `ledger_of(pid, minor)` gives the eBPF ledgers'
/// bytes of that PID on that GPU; `launches` are the kernel launches per container in the interval.
/// A container on several GPUs has its launches counted on each (the counts are per container).
/// MIG instances become their own `GpuInput`s (memory of their own; the parent's energy split by
/// slices); slices with no instance become an `unpartitioned` input, so the GPU's price is whole.
pub fn input_from_sample(
    sample: &NvmlSample,
    prev: Option<&NvmlSample>,
    owner_of: impl Fn(u32) -> Option<ProcessOwner>,
    ledger_of: impl Fn(u32, Option<u32>) -> ProcessLedgers,
    launches: &BTreeMap<ContainerKey, u64>,
) -> AttributionInput {
    let (start, interval) = match prev {
        Some(p) => (p.taken_unix_ns, sample.taken_mono_ns.saturating_sub(p.taken_mono_ns)),
        None => (sample.taken_unix_ns, 0),
    };
    let mut containers = BTreeMap::new();
    let mut gpus = Vec::new();
    for d in &sample.devices {
        let pd = prev.and_then(|p| p.devices.iter().find(|x| x.uuid == d.uuid));
        // A lost GPU reports nothing: no estimate from the previous sample's power either.
        let energy = if d.lost { None } else { energy_of(d, pd, interval) };
        let base = GpuInput {
            uuid: d.uuid.clone(),
            index: Some(d.index),
            name: d.name.clone(),
            minor: d.minor,
            share_of_gpu_ppm: PPM,
            lost: d.lost,
            ..Default::default()
        };
        if d.mig_enabled != Some(true) || d.mig_instances.is_empty() {
            let sm = sm_by_pid(d);
            let processes = processes_of(&d.processes, sm.as_ref(), d.minor, &owner_of, &ledger_of, &mut containers);
            gpus.push(GpuInput {
                memory: d.memory,
                sm_activity_pct: d.utilization.map(|u| u.gpu_pct),
                energy,
                launches: launches_for(&processes, launches),
                processes,
                ..base
            });
            continue;
        }
        // MIG: each instance its own input. NVML has neither per-instance utilization nor process
        // samples, so compute falls back to launch counts (with no activity: method `none`).
        let parent_total = d.memory.map(|m| m.total).unwrap_or(0);
        let mut shares: Vec<u32> = d
            .mig_instances
            .iter()
            .map(|m| {
                let profile = m.name.as_deref().and_then(mig_profile_of);
                match (profile.as_deref().and_then(parse_profile), m.memory) {
                    (Some((g, _)), _) => PPM / 7 * g.min(7),
                    (None, Some(mem)) if parent_total > 0 => {
                        (mem.total.min(parent_total) as u128 * PPM as u128 / parent_total as u128) as u32
                    }
                    _ => 0,
                }
            })
            .collect();
        // Never more than the whole GPU, whatever the names say.
        let sum: u64 = shares.iter().map(|&s| s as u64).sum();
        if sum > PPM as u64 {
            let w: Vec<u128> = shares.iter().map(|&s| s as u128).collect();
            shares = crate::attribution::split::split_or(PPM as u64, &w, 0).into_iter().map(|x| x as u32).collect();
        }
        let sum: u32 = shares.iter().sum();
        let energy_w: Vec<u128> = shares.iter().map(|&s| s as u128).chain([(PPM - sum) as u128]).collect();
        let energy_parts = energy.map(|e| crate::attribution::split::split_or(e.delta_mj, &energy_w, 0));
        for (i, m) in d.mig_instances.iter().enumerate() {
            let processes = processes_of(&m.processes, None, d.minor, &owner_of, &ledger_of, &mut containers);
            gpus.push(GpuInput {
                uuid: m.uuid.clone(),
                parent_uuid: Some(d.uuid.clone()),
                name: m.name.clone().or_else(|| d.name.clone()),
                mig_profile: m.name.as_deref().and_then(mig_profile_of),
                share_of_gpu_ppm: shares[i],
                memory: m.memory,
                energy: energy_parts
                    .as_ref()
                    .map(|p| EnergyInput { delta_mj: p[i], source: EnergySource::ParentShare }),
                launches: launches_for(&processes, launches),
                processes,
                ..base.clone()
            });
        }
        if sum < PPM {
            gpus.push(GpuInput {
                parent_uuid: Some(d.uuid.clone()),
                mig_profile: Some("unpartitioned".into()),
                share_of_gpu_ppm: PPM - sum,
                energy: energy_parts
                    .as_ref()
                    .map(|p| EnergyInput { delta_mj: p[shares.len()], source: EnergySource::ParentShare }),
                ..base
            });
        }
    }
    AttributionInput { start_unix_ns: start, interval_ns: interval, gpus, containers }
}
