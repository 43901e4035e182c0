//! The kernel side of the pipeline and the housekeeping of its maps that user space owns: which
//! NVIDIA fds the probes track (`NV_FDS`, the tracked-process map), managed mappings of exited
//! processes (`UVM_MAPS`), sweeping entry state of
//! threads that died inside a syscall, the per-event switch of the cuda family, and reading the
//! kernel's counters.
use std::{
    collections::{BTreeSet, HashMap},
    path::Path,
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, MapData, MapError};
use tracer_common::{
    CudaCount, CudaCountKey, DeviceRef, FdKey, PerEventKey, TracerConfig, UvmMapKey, family, map_names, nv::DriverAbi,
};

use super::{PerEventSelection, StartError};
use crate::{
    probe::Probes,
    source::{
        counters::{self},
        cuda_counts,
        ringbuf::{RingSource, SourceError},
        tracked::TrackedTgids,
    },
};
use tracer_core::{
    config::Config,
    decode,
    model::{counters::KernelCounters, probes::ProbeReport},
};

/// How often entry state of dead threads is swept.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// The loaded programs, the ring buffer, the kernel's tracked-process map (memory-mapped), and
/// which `NV_FDS` keys user space put there or saw opened, per process.
pub(super) struct KernelSide {
    pub(super) probes: Probes,
    pub(super) ring: RingSource,
    tracked: TrackedTgids,
    /// Kernel `NV_FDS` keys per process, so they can be removed when it exits.
    fds: HashMap<u32, BTreeSet<u32>>,
    /// Kernel `UVM_MAPS` addresses per process (managed mappings not unmapped yet), likewise.
    uvm_maps: HashMap<u32, BTreeSet<u64>>,
    last_sweep: Instant,
}

fn missing(name: &str) -> MapError {
    MapError::InvalidName { name: name.to_string() }
}

impl KernelSide {
    /// Load and attach the probe families the configuration asks for.
    pub(super) fn load(cfg: &Config, abi: &DriverAbi) -> Result<(KernelSide, ProbeReport), StartError> {
        let plans = decode::plan::capture_plans(abi);
        let sizes = decode::plan::alloc_param_sizes(abi);
        let mut probes = Probes::load(cfg, abi, &plans, &sizes)?;
        let ring = RingSource::new(&mut probes.ebpf)?;
        let tracked = TrackedTgids::map(&probes.ebpf, probes.tracked_entries).map_err(SourceError::Io)?;
        let report = probes.report.clone();
        let side = KernelSide {
            probes,
            ring,
            tracked,
            fds: HashMap::new(),
            uvm_maps: HashMap::new(),
            last_sweep: Instant::now(),
        };
        Ok((side, report))
    }

    /// Register an NVIDIA fd found outside the probes (the `/proc` scan) with the kernel.
    pub(super) fn track(&mut self, key: FdKey, dev: DeviceRef) -> Result<(), MapError> {
        {
            let m = self.probes.ebpf.map_mut(map_names::NV_FDS).ok_or_else(|| missing(map_names::NV_FDS))?;
            let mut h: BpfHashMap<&mut MapData, FdKey, DeviceRef> = BpfHashMap::try_from(m)?;
            h.insert(key, dev, 0)?;
        }
        self.tracked.set(key.tgid, true);
        self.fds.entry(key.tgid).or_default().insert(key.fd);
        Ok(())
    }

    /// Take the processes that lost a ledger record since the last call: (tgid, ktime of the first
    /// loss). Entries are removed as they are read.
    pub(super) fn take_lost_records(&mut self) -> Vec<(u32, u64)> {
        let Some(m) = self.probes.ebpf.map_mut(map_names::LOST_RECORDS) else { return Vec::new() };
        let Ok(mut h) = BpfHashMap::<&mut MapData, u32, u64>::try_from(m) else { return Vec::new() };
        let found: Vec<(u32, u64)> = h.iter().filter_map(Result::ok).collect();
        for (tgid, _) in &found {
            let _ = h.remove(tgid);
        }
        found
    }

    /// Clear `pid`'s byte in the tracked-process map: the kernel marks every forked child, threads
    /// included, and only processes should stay marked.
    pub(super) fn untrack(&mut self, pid: u32) {
        self.tracked.set(pid, false);
    }

    /// The probes put `fd` of `tgid` in `NV_FDS` (an open or a dup of an NVIDIA fd).
    pub(super) fn fd_opened(&mut self, tgid: u32, fd: u32) {
        self.fds.entry(tgid).or_default().insert(fd);
    }

    /// The probes removed `fd` of `tgid` from `NV_FDS` (a close).
    pub(super) fn fd_closed(&mut self, tgid: u32, fd: u32) {
        if let Some(s) = self.fds.get_mut(&tgid) {
            s.remove(&fd);
        }
    }

    /// The probes put a managed mapping of `tgid` at `addr` in `UVM_MAPS` (a UVM mmap).
    pub(super) fn uvm_mapped(&mut self, tgid: u32, addr: u64) {
        self.uvm_maps.entry(tgid).or_default().insert(addr);
    }

    /// The probes removed the mapping at `addr` (its munmap).
    pub(super) fn uvm_unmapped(&mut self, tgid: u32, addr: u64) {
        if let Some(s) = self.uvm_maps.get_mut(&tgid) {
            s.remove(&addr);
        }
    }

    /// Forget a process's fds and managed mappings in the kernel maps (exit closed and unmapped
    /// them without a syscall the probes see). Returns how many entries were removed.
    pub(super) fn forget_process(&mut self, tgid: u32) -> u64 {
        let (fds, maps) = (self.fds.remove(&tgid), self.uvm_maps.remove(&tgid));
        let mut removed = 0;
        if let Some(fds) = fds
            && let Some(m) = self.probes.ebpf.map_mut(map_names::NV_FDS)
            && let Ok(mut h) = BpfHashMap::<&mut MapData, FdKey, DeviceRef>::try_from(m)
        {
            removed += fds.into_iter().filter(|fd| h.remove(&FdKey { tgid, fd: *fd }).is_ok()).count() as u64;
        }
        if let Some(maps) = maps
            && let Some(m) = self.probes.ebpf.map_mut(map_names::UVM_MAPS)
            && let Ok(mut h) = BpfHashMap::<&mut MapData, UvmMapKey, u64>::try_from(m)
        {
            removed +=
                maps.into_iter().filter(|addr| h.remove(&UvmMapKey { tgid, _pad: 0, addr: *addr }).is_ok()).count()
                    as u64;
        }
        removed
    }

    /// Is a sweep of dead threads' entry state due?
    pub(super) fn sweep_due(&self) -> bool {
        self.last_sweep.elapsed() >= SWEEP_EVERY
    }

    /// Remove `INFLIGHT` entries (syscall entry state) of threads that no longer exist: a thread
    /// killed inside a traced syscall never reaches its exit. Returns how many were removed.
    pub(super) fn sweep_dead_threads(&mut self, proc_root: &Path) -> u64 {
        self.last_sweep = Instant::now();
        let ebpf = &mut self.probes.ebpf;
        sweep_dead::<tracer_common::Inflight>(ebpf, map_names::INFLIGHT, proc_root)
            + sweep_dead::<tracer_common::CudaAllocInflight>(ebpf, map_names::CUDA_INFLIGHT, proc_root)
            + sweep_dead::<tracer_common::CudaTimedInflight>(ebpf, map_names::CUDA_TIMED_INFLIGHT, proc_root)
    }

    /// Per-event mode for these selections, each until its deadline (`ktime_ns`, `u64::MAX`: no
    /// deadline); the map is replaced as a whole, and an empty list turns per-event mode off.
    pub(super) fn set_per_event(&mut self, selections: &[(PerEventSelection, u64)]) -> Result<(), MapError> {
        let ebpf = &mut self.probes.ebpf;
        {
            let m = ebpf.map_mut(map_names::CUDA_PER_EVENT).ok_or_else(|| missing(map_names::CUDA_PER_EVENT))?;
            let mut h: BpfHashMap<&mut MapData, PerEventKey, u64> = BpfHashMap::try_from(m)?;
            let keys: Vec<(PerEventKey, u64)> = selections.iter().map(|(s, until)| (s.key(), *until)).collect();
            let old: Vec<PerEventKey> =
                h.keys().filter_map(Result::ok).filter(|k| !keys.iter().any(|(n, _)| n == k)).collect();
            for k in old {
                h.remove(&k)?;
            }
            for (k, until) in keys {
                h.insert(k, until, 0)?;
            }
        }
        let m = ebpf.map_mut(map_names::CONFIG).ok_or_else(|| missing(map_names::CONFIG))?;
        let mut a: aya::maps::Array<&mut MapData, TracerConfig> = aya::maps::Array::try_from(m)?;
        let mut cfg = a.get(&0, 0)?;
        if selections.is_empty() {
            cfg.families &= !family::CUDA_PER_EVENT;
        } else {
            cfg.families |= family::CUDA_PER_EVENT;
        }
        a.set(0, cfg, 0)?;
        Ok(())
    }

    /// The per-probe counters (zero when they cannot be read).
    pub(super) fn counters(&self) -> KernelCounters {
        counters::read(&self.probes.ebpf).unwrap_or_default()
    }

    /// The in-kernel launch counts, per (cgroup, tgid, entry point).
    pub(super) fn cuda_counts(&self) -> Vec<(CudaCountKey, CudaCount)> {
        cuda_counts::read(&self.probes.ebpf)
    }

    /// Drop an exited process's rows of the in-kernel launch counts.
    pub(super) fn forget_cuda_counts(&mut self, tgid: u32) {
        cuda_counts::forget(&mut self.probes.ebpf, tgid);
    }
}

/// Remove the entries of a pid_tgid-keyed map whose thread no longer exists.
fn sweep_dead<V: aya::Pod>(ebpf: &mut aya::Ebpf, map: &str, proc_root: &Path) -> u64 {
    let Some(m) = ebpf.map_mut(map) else { return 0 };
    let Ok(mut h) = BpfHashMap::<&mut MapData, u64, V>::try_from(m) else { return 0 };
    let dead: Vec<u64> = h
        .keys()
        .filter_map(Result::ok)
        .filter(|k| {
            let (tgid, tid) = ((k >> 32) as u32, *k as u32);
            !proc_root.join(format!("{tgid}/task/{tid}")).exists()
        })
        .collect();
    dead.iter().filter(|k| h.remove(k).is_ok()).count() as u64
}
