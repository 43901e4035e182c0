//! A fake GPU's NVML view derived from the fake driver's own state: what the real driver and NVML
//! would report together. Per-process memory is what each process has allocated in the fake driver
//! (its live accounted video memory on that GPU); device `used` is that plus the driver's reserve.
//! What NVML knows that the driver does not — SM activity per process, power — comes from the
//! caller (each workload says how busy it keeps the GPU). The model integrates energy itself, so
//! the counter only ever grows.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Instant,
};

use fake_nvml::scenario::Device;
pub use fake_nvml::scenario::{MigInstance, Process, Scenario, UsedBytes, UtilizationSample};

use crate::DriverStats;

/// The UUID the model gives the fake GPU with minor `m` (stable, so tests can name it).
pub fn gpu_uuid(minor: u32) -> String {
    format!("GPU-{minor:08x}-f00d-4e57-8a11-0000000000{minor:02x}")
}

/// Per-process compute the caller declares: SM and memory-controller percent of the GPU it uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Busy {
    pub sm_pct: u32,
    pub mem_pct: u32,
}

/// One fake GPU as NVML sees it.
#[derive(Clone, Debug)]
pub struct ModelGpu {
    pub minor: u32,
    pub name: String,
    /// Bytes the driver keeps for itself (NVML memory info v2 `reserved`).
    pub reserved_bytes: u64,
    pub idle_power_mw: u32,
    /// Extra power per SM percent in use.
    pub mw_per_sm_pct: u32,
    energy_mj: u64,
}

/// The NVML double of a fake-driver node, installed in a directory (a copy of the fake library with
/// its scenario file beside it).
pub struct NvmlModel {
    dir: PathBuf,
    library: PathBuf,
    gpus: Vec<ModelGpu>,
    driver_version: String,
    last_tick: Instant,
    started: Instant,
    /// Extra processes that NVML lists but the driver does not (e.g. an MPS server), by minor.
    pub extra_processes: BTreeMap<u32, Vec<Process>>,
    /// GPUs (by minor) run under MPS: the driver's processes are MPS clients (listed by
    /// `nvmlDeviceGetMPSComputeRunningProcesses`), and `extra_processes` holds the server.
    pub mps_gpus: std::collections::BTreeSet<u32>,
    /// GPUs (by minor) in MIG mode: their processes are spread over these instances (by pid; a
    /// pid not listed goes to the first instance), and process utilization is not supported.
    pub mig: BTreeMap<u32, Vec<MigSpec>>,
}

/// One MIG instance of a model GPU.
#[derive(Clone, Debug)]
pub struct MigSpec {
    pub uuid: String,
    pub profile: String,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub total_bytes: u64,
    /// Processes placed on it.
    pub pids: Vec<u32>,
}

impl NvmlModel {
    /// Install the fake library in `dir` with one device per GPU of `stats`, idle.
    pub fn install(dir: &Path, stats: &DriverStats, reserved_bytes: u64) -> Result<NvmlModel, fake_nvml::HarnessError> {
        let gpus = stats
            .gpus
            .iter()
            .map(|g| ModelGpu {
                minor: g.minor,
                name: "NVIDIA H100 80GB HBM3 (fake)".into(),
                reserved_bytes,
                idle_power_mw: 70_000,
                mw_per_sm_pct: 5_000,
                energy_mj: 1_000_000,
            })
            .collect();
        let mut m = NvmlModel {
            dir: dir.to_path_buf(),
            library: dir.join(fake_nvml::harness::LIBRARY_NAME),
            gpus,
            driver_version: stats.driver_version.clone(),
            last_tick: Instant::now(),
            started: Instant::now(),
            extra_processes: BTreeMap::new(),
            mps_gpus: Default::default(),
            mig: BTreeMap::new(),
        };
        let scenario = m.scenario(stats, &BTreeMap::new(), 0);
        m.library = fake_nvml::install(dir, &scenario)?;
        Ok(m)
    }

    /// The installed `libnvidia-ml.so.1` (for `nvml.library` / `--nvml-library`).
    pub fn library(&self) -> &Path {
        &self.library
    }

    /// Rewrite the scenario from the driver's current state and the processes' declared activity.
    /// Call it periodically; energy grows by the power of the elapsed time.
    pub fn update(
        &mut self,
        stats: &DriverStats,
        busy: &BTreeMap<u32, Busy>,
    ) -> Result<Scenario, fake_nvml::HarnessError> {
        let elapsed_ms = self.last_tick.elapsed().as_millis() as u64;
        self.last_tick = Instant::now();
        let now_us = self.started.elapsed().as_micros() as u64 + 1;
        // Energy over the elapsed time at the power of the activity now.
        for g in &mut self.gpus {
            let sm = Self::device_sm(stats, g.minor, busy);
            let mw = g.idle_power_mw as u64 + g.mw_per_sm_pct as u64 * sm as u64;
            g.energy_mj += mw * elapsed_ms / 1000;
        }
        let s = self.scenario(stats, busy, now_us);
        fake_nvml::write_scenario(&self.dir, &s)?;
        Ok(s)
    }

    /// Live accounted video memory per (GPU minor, pid), from the driver's objects.
    pub fn memory_by_pid(stats: &DriverStats) -> BTreeMap<(u32, u32), u64> {
        let mut out = BTreeMap::new();
        let mut seen = std::collections::BTreeSet::new();
        for c in &stats.clients {
            for o in &c.objects {
                let (Some(gpu), Some(m)) = (o.gpu, o.memory.as_ref()) else { continue };
                // Duplicates share the allocation: count it once, for the first holder.
                if m.accounted && m.location == "vidmem" && seen.insert(m.id) {
                    *out.entry((gpu, c.pid)).or_insert(0) += m.bytes;
                }
            }
        }
        out
    }

    fn device_sm(stats: &DriverStats, minor: u32, busy: &BTreeMap<u32, Busy>) -> u32 {
        let pids: std::collections::BTreeSet<u32> =
            Self::memory_by_pid(stats).keys().filter(|(g, _)| *g == minor).map(|(_, p)| *p).collect();
        pids.iter().filter_map(|p| busy.get(p)).map(|b| b.sm_pct).sum::<u32>().min(100)
    }

    fn scenario(&self, stats: &DriverStats, busy: &BTreeMap<u32, Busy>, now_us: u64) -> Scenario {
        let mem = Self::memory_by_pid(stats);
        let mut s = Scenario::new(&self.driver_version).nvml_version(&format!("12.{}", self.driver_version));
        s = s.cuda_driver_version(12020);
        for (i, g) in self.gpus.iter().enumerate() {
            let cap = stats.gpus.iter().find(|x| x.minor == g.minor).map_or(0, |x| x.capacity_bytes);
            let used_driver = stats.gpus.iter().find(|x| x.minor == g.minor).map_or(0, |x| x.used_bytes);
            let mut procs: Vec<Process> = mem
                .iter()
                .filter(|((gpu, _), _)| *gpu == g.minor)
                .map(|((_, pid), b)| Process {
                    pid: *pid,
                    used_bytes: UsedBytes::Bytes(*b),
                    gpu_instance_id: None,
                    compute_instance_id: None,
                })
                .collect();
            let extra = self.extra_processes.get(&g.minor).cloned().unwrap_or_default();
            let extra_bytes: u64 =
                extra.iter().map(|p| if let UsedBytes::Bytes(b) = p.used_bytes { b } else { 0 }).sum();
            procs.extend(extra);
            let samples: Vec<UtilizationSample> = procs
                .iter()
                .filter_map(|p| busy.get(&p.pid).map(|b| (p.pid, b)))
                .filter(|(_, b)| b.sm_pct > 0 || b.mem_pct > 0)
                .map(|(pid, b)| UtilizationSample {
                    pid,
                    timestamp_us: now_us,
                    sm: b.sm_pct,
                    mem: b.mem_pct,
                    enc: 0,
                    dec: 0,
                })
                .collect();
            let sm = Self::device_sm(stats, g.minor, busy);
            let mem_util = samples.iter().map(|x| x.mem).sum::<u32>().min(100);
            let used = (g.reserved_bytes + used_driver + extra_bytes).min(cap.max(g.reserved_bytes));
            let total = cap.max(used);
            if let Some(instances) = self.mig.get(&g.minor) {
                // MIG: memory and processes per instance; no device utilization or process samples.
                let mut d = Device::new(&gpu_uuid(g.minor))
                    .name(&g.name)
                    .minor(g.minor)
                    .pci_bus_id(&format!("00000000:{:02X}:00.0", 0x10 + i))
                    .memory(total, g.reserved_bytes, used)
                    .power_mw(g.idle_power_mw)
                    .energy_mj(g.energy_mj)
                    .mig_mode(true, true);
                for (k, m) in instances.iter().enumerate() {
                    let unplaced = |pid: u32| !instances.iter().any(|x| x.pids.contains(&pid));
                    let mine: Vec<Process> = procs
                        .iter()
                        .filter(|p| m.pids.contains(&p.pid) || (k == 0 && unplaced(p.pid)))
                        .map(|p| Process {
                            gpu_instance_id: Some(m.gpu_instance_id),
                            compute_instance_id: Some(m.compute_instance_id),
                            ..*p
                        })
                        .collect();
                    let mused: u64 =
                        mine.iter().map(|p| if let UsedBytes::Bytes(b) = p.used_bytes { b } else { 0 }).sum();
                    let inst = MigInstance::new(&m.uuid, m.gpu_instance_id, m.compute_instance_id)
                        .name(&format!("{} MIG {}", g.name, m.profile))
                        .memory(m.total_bytes, 0, mused.min(m.total_bytes))
                        .compute_processes(mine);
                    d = d.mig_instance(inst);
                }
                s = s.device(d);
                continue;
            }
            let (compute, mps): (Vec<Process>, Vec<Process>) = if self.mps_gpus.contains(&g.minor) {
                let server: std::collections::BTreeSet<u32> =
                    self.extra_processes.get(&g.minor).into_iter().flatten().map(|p| p.pid).collect();
                procs.iter().copied().partition(|p| server.contains(&p.pid))
            } else {
                (procs.clone(), Vec::new())
            };
            let d = Device::new(&gpu_uuid(g.minor))
                .name(&g.name)
                .minor(g.minor)
                .pci_bus_id(&format!("00000000:{:02X}:00.0", 0x10 + i))
                .memory(total, g.reserved_bytes, used)
                .utilization(sm, mem_util)
                .power_mw(g.idle_power_mw + g.mw_per_sm_pct * sm)
                .energy_mj(g.energy_mj)
                .clocks(1980, 1980, 2619)
                .temperature_c(35 + sm / 4)
                .mig_mode(false, false)
                .compute_processes(compute)
                .process_utilization(samples);
            let d = if mps.is_empty() { d } else { d.mps_processes(mps) };
            s = s.device(d);
        }
        s
    }
}

/// A model kept current by a thread: every `every`, the driver's stats (read from its stats file)
/// and `busy()` rewrite the scenario, as a real NVML follows its GPU. Stops on drop.
pub struct Follower {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl NvmlModel {
    /// Hand the model to a thread that updates it from `stats_file` (the fake driver's
    /// `.fake-driver-stats`) and `busy()` every `every`.
    pub fn follow(
        mut self,
        stats_file: PathBuf,
        every: std::time::Duration,
        busy: impl Fn() -> BTreeMap<u32, Busy> + Send + 'static,
    ) -> Follower {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread_stop = stop.clone();
        let thread = std::thread::spawn(move || {
            while !thread_stop.load(Ordering::SeqCst) {
                // The driver may be gone at the very end (its stats unreadable): skip that round.
                let stats = std::fs::read_to_string(&stats_file)
                    .ok()
                    .and_then(|t| serde_json::from_str::<DriverStats>(&t).ok());
                if let Some(stats) = stats {
                    let _ = self.update(&stats, &busy());
                }
                std::thread::sleep(every);
            }
        });
        Follower { stop, thread: Some(thread) }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
