//! The running pipeline: probes → ring buffer → decode → state, with identity enrichment and the
//! kernel-map housekeeping that user space owns (seeding from `/proc`, forgetting exited processes).
//!
//! Everything runs on one task: a record is decoded and applied as soon as it is drained, so no
//! queue sits between the stages and none can drop. What can be lost is lost in the kernel, where it
//! is counted; [`Accounting`] checks `seen == received + dropped` for every probe.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    os::unix::fs::MetadataExt,
    path::PathBuf,
    time::Duration,
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use tracer_common::{DeviceRef, FdKey, map_names, nv::DriverAbi, record_as_bytes};

use crate::{
    clock::{self, WallClock},
    config::{Config, ResolvedDriverVersion, resolve_driver_version},
    decode::{self, Event},
    enrich::{self, CgroupResolver, ProcessInfo},
    model::{
        Accounting, AgentSnapshot, AllocationUse, EventContext, KubernetesStatus, LedgerCheck, NvmlStatus, NvmlView,
        PipelineStats,
    },
    probe::{ProbeError, ProbeReport, Probes},
    source::{
        counters::{self, KernelCounters},
        procscan,
        ringbuf::{RingSource, SourceError},
    },
    state::TracerState,
};

mod join;

/// Remove the entries of a pid_tgid-keyed map whose thread no longer exists.
fn sweep_dead<V: aya::Pod>(ebpf: &mut aya::Ebpf, map: &str, proc_root: &std::path::Path) -> u64 {
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

/// Errors starting the pipeline.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("NVML is required (nvml.mode = \"required\") but cannot be used: {0}")]
    Nvml(#[from] crate::nvml::sampler::NvmlOpenError),
    #[error("Kubernetes is required (kubernetes.mode = \"required\") but cannot be used: {0}")]
    Kube(#[from] crate::identity::KubeError),
    #[error("the kubelet pod-resources API is required (kubernetes.mode = \"required\") but cannot be used: {0}")]
    PodResources(#[from] crate::allocation::pod_resources::PodResourcesError),
}

/// The loaded programs, the ring buffer and the kernel's tracked-process map (memory-mapped).
struct KernelSide {
    probes: Probes,
    ring: RingSource,
    tracked: crate::source::tracked::TrackedTgids,
}

/// The NVML side of the agent.
struct NvmlSide {
    source: Option<crate::nvml::sampler::NvmlSource>,
    status: NvmlStatus,
    reason: Option<String>,
    /// The latest sample and the one before it (energy deltas, rates).
    last: Option<std::sync::Arc<crate::nvml::model::NvmlSample>>,
    prev: Option<std::sync::Arc<crate::nvml::model::NvmlSample>>,
}

impl NvmlSide {
    fn open(cfg: &Config) -> Result<NvmlSide, StartError> {
        use crate::nvml::sampler::{NvmlOpen, NvmlSource};
        let side = |source, status, reason| NvmlSide { source, status, reason, last: None, prev: None };
        Ok(match NvmlSource::open(&cfg.nvml)? {
            NvmlOpen::Ready(s) => side(Some(*s), NvmlStatus::Ready, None),
            NvmlOpen::Unavailable(e) => {
                tracing::warn!(reason = e.reason(), "NVML not used: {e}");
                side(None, NvmlStatus::Unavailable, Some(e.to_string()))
            }
            NvmlOpen::Off => side(None, NvmlStatus::Off, Some("nvml.mode = \"off\"".into())),
        })
    }

    /// Take a sample now (when NVML is in use).
    fn sample(&mut self) {
        if let Some(src) = self.source.as_mut() {
            let s = std::sync::Arc::new(src.sample());
            self.prev = self.last.replace(s);
        }
    }

    fn view(&self) -> NvmlView {
        let st = self.source.as_ref().map(|s| s.status());
        NvmlView {
            status: self.status,
            reason: self.reason.clone(),
            library: st.map(|s| s.library.display().to_string()),
            driver_version: st.and_then(|s| s.driver_version.clone()),
            nvml_version: st.and_then(|s| s.nvml_version.clone()),
            failed_readings: st.map(|s| s.failed_readings.clone()).unwrap_or_default(),
            samples: st.map_or(0, |s| s.samples),
            sample: self.last.clone(),
        }
    }
}

/// Kubernetes: the pod watcher and the kubelet pod-resources poller (both optional).
#[derive(Default)]
struct KubeSide {
    started: bool,
    status: KubernetesStatus,
    detail: String,
    watcher: Option<crate::identity::PodWatcher>,
    pods: Option<crate::identity::PodCache>,
    allocations: Option<crate::allocation::source::AllocationSource>,
}

/// The running agent.
pub struct Agent {
    cfg: Config,
    nvml: NvmlSide,
    kube: KubeSide,
    attributor: crate::attribution::Attributor,
    attribution: Option<std::sync::Arc<crate::attribution::AttributionSnapshot>>,
    /// Cumulative launches per cgroup at the previous attribution (for per-interval deltas).
    launches_at_last_sample: HashMap<u64, u64>,
    identities: BTreeMap<u64, std::sync::Arc<crate::identity::ContainerIdentity>>,
    guardrails: crate::guardrails::Guardrails,
    violations: Vec<crate::guardrails::Violation>,
    /// Violations not yet taken by `take_new_violations` (the event stream).
    new_violations: Vec<crate::guardrails::Violation>,
    /// `NVIDIA_VISIBLE_DEVICES` / `CUDA_VISIBLE_DEVICES` per (pid, start time), read once.
    visible_devices: HashMap<(u32, u64), crate::guardrails::VisibleDevices>,
    allocation_use: Vec<AllocationUse>,
    abi: DriverAbi,
    pub driver_version: ResolvedDriverVersion,
    /// The eBPF side; `None` in NVML-only mode (every probe family off).
    kernel: Option<KernelSide>,
    report: ProbeReport,
    state: TracerState,
    cgroups: CgroupResolver,
    procs: HashMap<u32, ProcessInfo>,
    /// Kernel `NV_FDS` keys per process, so they can be removed when it exits.
    kernel_fds: HashMap<u32, BTreeSet<u32>>,
    pub stats: PipelineStats,
    /// Stamps events with wall time.
    wall_clock: WallClock,
    last_sweep: std::time::Instant,
    cuda: crate::cuda::ledger::CudaLedger,
    /// libcuda inodes (dev, ino) probed, and processes whose mappings were checked for others.
    cuda_inodes: std::collections::HashSet<(u64, u64)>,
    cuda_checked: std::collections::HashSet<u32>,
    /// Reports of libcuda copies probed after start-up.
    pub cuda_late_libraries: Vec<crate::cuda::attach::LibraryReport>,
    /// Links of those copies, and the GPU processes seen mapping each (detached when all exit).
    late_links: HashMap<(u64, u64), (crate::cuda::attach::Links, std::collections::HashSet<u32>)>,
}

impl Agent {
    /// Load and attach the probes, then seed state from `/proc`.
    pub fn start(cfg: Config) -> Result<Agent, StartError> {
        cfg.validate()?;
        let driver_version = resolve_driver_version(&cfg);
        let abi = DriverAbi::for_version(driver_version.version);
        // NVML first: when it is required and missing, fail before loading anything.
        let nvml = NvmlSide::open(&cfg)?;
        let (kernel, report) = if cfg.families.any() {
            let plans = decode::plan::capture_plans(&abi);
            let sizes = decode::plan::alloc_param_sizes(&abi);
            let mut probes = Probes::load(&cfg, &abi, &plans, &sizes)?;
            let ring = RingSource::new(&mut probes.ebpf)?;
            let tracked = crate::source::tracked::TrackedTgids::map(&probes.ebpf, probes.tracked_entries)
                .map_err(SourceError::Io)?;
            let report = probes.report.clone();
            (Some(KernelSide { probes, ring, tracked }), report)
        } else {
            (None, ProbeReport::nvml_only())
        };
        let cgroup_root =
            cfg.cgroup_root.clone().or_else(|| procscan::cgroup2_mount(&cfg.proc_root.join("self/mountinfo")));
        let mut agent = Agent {
            nvml,
            kube: KubeSide::default(),
            attributor: crate::attribution::Attributor::new(&cfg.attribution),
            attribution: None,
            launches_at_last_sample: HashMap::new(),
            identities: BTreeMap::new(),
            guardrails: crate::guardrails::Guardrails::new(cfg.dev_dir.clone()),
            violations: Vec::new(),
            new_violations: Vec::new(),
            visible_devices: HashMap::new(),
            allocation_use: Vec::new(),
            state: TracerState::new(cfg.max_processes),
            cfg,
            abi,
            driver_version,
            kernel,
            report,
            cgroups: CgroupResolver::new(cgroup_root),
            procs: HashMap::new(),
            kernel_fds: HashMap::new(),
            stats: PipelineStats::default(),
            wall_clock: WallClock::new(),
            last_sweep: std::time::Instant::now(),
            cuda: Default::default(),
            cuda_inodes: Default::default(),
            cuda_checked: Default::default(),
            cuda_late_libraries: Vec::new(),
            late_links: HashMap::new(),
        };
        for lib in &agent.report.cuda_libraries {
            if let Ok(md) = std::fs::metadata(&lib.path) {
                agent.cuda_inodes.insert((md.dev(), md.ino()));
            }
        }
        agent.seed_from_proc(None, &mut |_, _| {});
        Ok(agent)
    }

    /// What loading and attaching did.
    pub fn report(&self) -> &ProbeReport {
        &self.report
    }

    /// Are eBPF probes loaded (false in NVML-only mode)?
    pub fn has_probes(&self) -> bool {
        self.kernel.is_some()
    }

    /// The configuration in use.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Scan `/proc` (all processes, or one) for NVIDIA fds, register them with the kernel and feed
    /// synthetic open events through the decoder.
    fn seed_from_proc(&mut self, only: Option<u32>, sink: &mut dyn FnMut(&Event, &EventContext)) {
        if self.kernel.is_none() {
            return;
        }
        let prefix = self.cfg.dev_prefix();
        let (found, unreadable) = match only {
            None => procscan::scan(&self.cfg.proc_root, &prefix, std::process::id()),
            Some(pid) => procscan::scan_one(&self.cfg.proc_root, &prefix, pid),
        };
        self.stats.scan_unreadable += unreadable;
        if found.is_empty() {
            return;
        }
        let now = clock::monotonic_ns();
        for s in &found {
            if let Err(e) = self.kernel_track(procscan::key(s), s.dev) {
                tracing::warn!(tgid = s.tgid, fd = s.fd, error = %e, "cannot register seeded fd with the kernel");
                self.stats.fd_map_errors += 1;
            }
            let cgroup_id = self.cgroup_id_of(s.tgid).unwrap_or(0);
            let rec = procscan::seeded_record(s, cgroup_id, now);
            self.stats.seeded_fds += 1;
            self.handle_bytes(record_as_bytes(&rec), false, sink);
        }
        tracing::info!(
            fds = found.len(),
            processes = procscan::per_process(&found).len(),
            "seeded NVIDIA fds from /proc"
        );
    }

    fn cgroup_id_of(&self, tgid: u32) -> Option<u64> {
        let rel = procscan::process_cgroup_path(&self.cfg.proc_root, tgid)?;
        let root = self.cgroups.root()?;
        let p: PathBuf = root.join(rel.trim_start_matches('/'));
        std::fs::metadata(p).ok().map(|m| m.ino())
    }

    fn kernel_track(&mut self, key: FdKey, dev: DeviceRef) -> Result<(), aya::maps::MapError> {
        let missing = || aya::maps::MapError::InvalidName { name: map_names::NV_FDS.into() };
        let k = self.kernel.as_mut().ok_or_else(missing)?;
        {
            let m = k.probes.ebpf.map_mut(map_names::NV_FDS).ok_or_else(missing)?;
            let mut h: BpfHashMap<&mut MapData, FdKey, DeviceRef> = BpfHashMap::try_from(m)?;
            h.insert(key, dev, 0)?;
        }
        k.tracked.set(key.tgid, true);
        self.kernel_fds.entry(key.tgid).or_default().insert(key.fd);
        Ok(())
    }

    /// Forget a process's fds in the kernel map (its files were closed by exit).
    fn kernel_forget(&mut self, tgid: u32) {
        let Some(fds) = self.kernel_fds.remove(&tgid) else { return };
        let Some(k) = self.kernel.as_mut() else { return };
        let Some(m) = k.probes.ebpf.map_mut(map_names::NV_FDS) else { return };
        let Ok(mut h) = BpfHashMap::<&mut MapData, FdKey, DeviceRef>::try_from(m) else { return };
        for fd in fds {
            if h.remove(&FdKey { tgid, fd }).is_ok() {
                self.stats.fd_map_cleanups += 1;
            }
        }
    }

    /// A GPU process may use its own libcuda (a container image's copy, another path or inode than
    /// the host's): the first time a process opens an NVIDIA device (libcuda is mapped by then),
    /// read its mappings and probe any libcuda inode not probed yet, through `/proc/PID/root`.
    /// Calls it made before this point are not seen.
    fn probe_mapped_libcuda(&mut self, tgid: u32) {
        if !self.cfg.families.cuda || !self.cuda_checked.insert(tgid) {
            return;
        }
        let maps = std::fs::read_to_string(self.cfg.proc_root.join(format!("{tgid}/maps"))).unwrap_or_default();
        let mut paths: Vec<String> = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .filter(|p| p.rsplit('/').next().is_some_and(|f| f.starts_with("libcuda.so")))
            .map(str::to_string)
            .collect();
        paths.dedup();
        for p in paths {
            let through_root = self.cfg.proc_root.join(format!("{tgid}/root")).join(p.trim_start_matches('/'));
            let Ok(md) = std::fs::metadata(&through_root) else { continue };
            let inode = (md.dev(), md.ino());
            if let Some((_, users)) = self.late_links.get_mut(&inode) {
                users.insert(tgid);
            }
            if !self.cuda_inodes.insert(inode) {
                continue;
            }
            let Some(k) = self.kernel.as_mut() else { return };
            match crate::cuda::attach::attach_library(&mut k.probes.ebpf, &through_root) {
                Ok((report, links)) => {
                    self.stats.cuda_libraries_found += 1;
                    tracing::info!(tgid, path = %through_root.display(), "probing a libcuda copy found in a process's mappings");
                    self.cuda_late_libraries.push(report);
                    self.late_links.insert(inode, (links, [tgid].into_iter().collect()));
                }
                Err(e) => {
                    self.stats.cuda_library_errors += 1;
                    tracing::warn!(tgid, path = %through_root.display(), error = %e, "cannot probe libcuda copy");
                }
            }
        }
    }

    /// `tgid` exited: detach the libcuda copies no known GPU process maps any more (a new process
    /// mapping one is found again when it opens a device).
    fn release_late_libraries(&mut self, tgid: u32) {
        let done: Vec<(u64, u64)> = self
            .late_links
            .iter_mut()
            .filter_map(|(inode, (_, users))| (users.remove(&tgid) && users.is_empty()).then_some(*inode))
            .collect();
        for inode in done {
            if let Some((links, _)) = self.late_links.remove(&inode) {
                if let Some(k) = self.kernel.as_mut() {
                    crate::cuda::attach::detach(&mut k.probes.ebpf, links);
                }
                self.cuda_inodes.remove(&inode);
                self.stats.cuda_libraries_detached += 1;
            }
        }
    }

    /// Wait for records (a wake-up or the drain interval), then process everything waiting.
    /// `sink` sees every event with its identity. Returns how many records were processed.
    pub async fn step(&mut self, sink: &mut dyn FnMut(&Event, &EventContext)) -> usize {
        let wait = Duration::from_millis(self.cfg.drain_interval_ms.max(1));
        match self.kernel.as_mut() {
            Some(k) => k.ring.wait(wait).await,
            None => tokio::time::sleep(wait).await,
        }
        if self.last_sweep.elapsed() >= Duration::from_secs(5) {
            self.sweep_inflight();
        }
        self.drain(sink)
    }

    /// Remove `INFLIGHT` entries (syscall entry state) of threads that no longer exist: a thread
    /// killed inside a traced syscall never reaches its exit. Returns how many were removed.
    pub fn sweep_inflight(&mut self) -> u64 {
        self.last_sweep = std::time::Instant::now();
        let proc_root = self.cfg.proc_root.clone();
        let Some(k) = self.kernel.as_mut() else { return 0 };
        let n = sweep_dead::<tracer_common::Inflight>(&mut k.probes.ebpf, map_names::INFLIGHT, &proc_root)
            + sweep_dead::<tracer_common::CudaAllocInflight>(&mut k.probes.ebpf, map_names::CUDA_INFLIGHT, &proc_root);
        self.stats.inflight_swept += n;
        n
    }

    /// Process everything waiting in the ring buffer now.
    pub fn drain(&mut self, sink: &mut dyn FnMut(&Event, &EventContext)) -> usize {
        let mut total = 0;
        loop {
            let mut batch: Vec<Vec<u8>> = Vec::new();
            let Some(k) = self.kernel.as_mut() else { return total };
            let n = k.ring.drain(4096, |b| batch.push(b.to_vec()));
            self.stats.received += n as u64;
            for b in &batch {
                self.handle_bytes(b, true, sink);
            }
            total += n;
            if n < 4096 {
                return total;
            }
        }
    }

    fn handle_bytes(&mut self, bytes: &[u8], _from_ring: bool, sink: &mut dyn FnMut(&Event, &EventContext)) {
        let ev = match decode::decode(bytes, &self.abi) {
            Ok(ev) => ev,
            Err(e) => {
                *self.stats.decode_errors.entry(e.reason()).or_insert(0) += 1;
                return;
            }
        };
        self.stats.decoded += 1;
        let h = *ev.header();
        let info = match self.procs.get(&h.tgid) {
            Some(i) => Some(i.clone()),
            None => {
                let i = enrich::process_info(&self.cfg.proc_root, h.tgid);
                if let Some(i) = &i {
                    self.procs.insert(h.tgid, i.clone());
                }
                i
            }
        };
        let start_time = info.as_ref().map(|i| i.start_time_ticks).unwrap_or(0);
        match &ev {
            Event::FdOpened { fd, .. } if *fd >= 0 => {
                self.kernel_fds.entry(h.tgid).or_default().insert(*fd as u32);
                self.probe_mapped_libcuda(h.tgid);
            }
            Event::FdDuped { new_fd, .. } if *new_fd >= 0 => {
                self.kernel_fds.entry(h.tgid).or_default().insert(*new_fd as u32);
            }
            Event::FdClosed { fd, .. } if *fd >= 0 => {
                if let Some(s) = self.kernel_fds.get_mut(&h.tgid) {
                    s.remove(&(*fd as u32));
                }
            }
            _ => {}
        }
        let mut released = self.state.apply(&ev, start_time);
        let mut kernel_name = None;
        match &ev {
            Event::CudaFunction { result, handle, source, name, .. } if *result == 0 => {
                self.cuda.function(h.tgid, *handle, *source, name)
            }
            Event::CudaLaunch { function, .. } => kernel_name = self.cuda.name_of(h.tgid, *function),
            Event::CudaAlloc { entry, result, ptr, bytes, .. } => {
                self.cuda.alloc(h.tgid, h.cgroup_id, *entry, *result, *ptr, *bytes)
            }
            Event::CudaFree { ptr, .. } => released = self.cuda.free(h.tgid, *ptr),
            _ => {}
        }
        let cgroup_path = self.cgroups.resolve(h.cgroup_id);
        if let Some(p) = &cgroup_path {
            self.state.set_cgroup_path(h.cgroup_id, p);
        }
        if let Some(i) = &info {
            self.state.set_comm(h.tgid, &i.comm);
        }
        let id = EventContext {
            wall_time_unix_ns: self.wall_clock.wall_ns(h.ktime_ns),
            process_start_time_ns: clock::ticks_to_ns(start_time),
            comm: info.map(|i| i.comm),
            cgroup_path,
            released_bytes: released,
            kernel_name,
            container: self.cached_identity(h.cgroup_id),
        };
        sink(&ev, &id);
        match &ev {
            Event::ProcessExit { .. } => {
                self.cuda_checked.remove(&h.tgid);
                self.release_late_libraries(h.tgid);
                self.kernel_forget(h.tgid);
                self.procs.remove(&h.tgid);
                // Fold the process's final launch counts into its cgroup, then drop its rows.
                self.refresh_cuda_counts();
                self.cuda.process_exit(h.tgid);
                if let Some(k) = self.kernel.as_mut() {
                    crate::source::cuda_counts::forget(&mut k.probes.ebpf, h.tgid);
                }
            }
            Event::ProcessFork { child_pid, .. } => {
                // A new process (not a thread) inherits the parent's NVIDIA fds: register them.
                let child = *child_pid;
                if enrich::tgid_of(&self.cfg.proc_root, child) == Some(child) {
                    self.seed_from_proc(Some(child), sink);
                }
            }
            Event::CgroupRemoved { cgroup_id, .. } => self.cgroups.forget(*cgroup_id),
            _ => {}
        }
    }

    /// Launch counts since the previous call, per (cgroup, tgid, entry point), read fresh from the
    /// kernel: the `events` command reports them as launch-batch events once per interval.
    pub fn launch_batches(&mut self) -> Vec<(tracer_common::CudaCountKey, u64)> {
        self.refresh_cuda_counts();
        self.cuda.take_launch_batches()
    }

    /// Read the in-kernel launch counts into the CUDA ledger.
    fn refresh_cuda_counts(&mut self) {
        if let Some(k) = &self.kernel {
            self.cuda.update_counts(crate::source::cuda_counts::read(&k.probes.ebpf));
        }
    }

    /// The context of an event of `tgid` in `cgroup_id` made now (for events user space makes), with
    /// its monotonic timestamp.
    pub fn context_now(&mut self, tgid: u32, cgroup_id: u64) -> (u64, EventContext) {
        let now = clock::monotonic_ns();
        let info = enrich::process_info(&self.cfg.proc_root, tgid);
        let id = EventContext {
            wall_time_unix_ns: self.wall_clock.wall_ns(now),
            process_start_time_ns: clock::ticks_to_ns(info.as_ref().map_or(0, |i| i.start_time_ticks)),
            comm: info.map(|i| i.comm),
            cgroup_path: self.cgroups.resolve(cgroup_id),
            released_bytes: None,
            kernel_name: None,
            container: self.cached_identity(cgroup_id),
        };
        (now, id)
    }

    /// A cgroup id from a numeric id or a path relative to the cgroup2 mount.
    pub fn cgroup_id(&self, path_or_id: &str) -> Option<u64> {
        if let Ok(id) = path_or_id.parse::<u64>() {
            return Some(id);
        }
        let root = self.cgroups.root()?;
        std::fs::metadata(root.join(path_or_id.trim_start_matches('/'))).ok().map(|m| m.ino())
    }

    /// Per-event mode: send every launch of these cgroups and processes one by one (with grid, block,
    /// shared memory, stream and the kernel name), on top of the in-kernel counts. Takes effect at
    /// once, without restarting anything; empty lists turn it off.
    pub fn set_per_event(&mut self, cgroups: &[u64], tgids: &[u32]) -> Result<(), aya::maps::MapError> {
        use tracer_common::{PER_EVENT_CGROUP, PER_EVENT_TGID, PerEventKey, family};
        let missing = |n: &str| aya::maps::MapError::InvalidName { name: n.to_string() };
        let k = self.kernel.as_mut().ok_or_else(|| missing(map_names::CUDA_PER_EVENT))?;
        {
            let m =
                k.probes.ebpf.map_mut(map_names::CUDA_PER_EVENT).ok_or_else(|| missing(map_names::CUDA_PER_EVENT))?;
            let mut h: BpfHashMap<&mut MapData, PerEventKey, u32> = BpfHashMap::try_from(m)?;
            let old: Vec<PerEventKey> = h.keys().filter_map(Result::ok).collect();
            for k in old {
                h.remove(&k)?;
            }
            for id in cgroups {
                h.insert(PerEventKey { kind: PER_EVENT_CGROUP, _pad: 0, id: *id }, 1, 0)?;
            }
            for t in tgids {
                h.insert(PerEventKey { kind: PER_EVENT_TGID, _pad: 0, id: *t as u64 }, 1, 0)?;
            }
        }
        let m = k.probes.ebpf.map_mut(map_names::CONFIG).ok_or_else(|| missing(map_names::CONFIG))?;
        let mut a: aya::maps::Array<&mut MapData, tracer_common::TracerConfig> = aya::maps::Array::try_from(m)?;
        let mut cfg = a.get(&0, 0)?;
        if cgroups.is_empty() && tgids.is_empty() {
            cfg.families &= !family::CUDA_PER_EVENT;
        } else {
            cfg.families |= family::CUDA_PER_EVENT;
        }
        a.set(0, cfg, 0)?;
        Ok(())
    }

    /// Read the kernel counters and check the accounting identity.
    pub fn accounting(&self) -> (KernelCounters, Accounting) {
        let kc = self.kernel.as_ref().and_then(|k| counters::read(&k.probes.ebpf).ok()).unwrap_or_default();
        let t = kc.total();
        let in_flight = t.emitted as i64 - self.stats.received as i64;
        let acc = Accounting {
            seen: t.seen,
            received: self.stats.received,
            aggregated: t.aggregated,
            dropped: t.dropped(),
            in_flight,
            exact: t.seen == self.stats.received + t.aggregated + t.dropped() && in_flight == 0,
        };
        (kc, acc)
    }

    /// Take an NVML sample (and attribute the interval since the previous one) now, whatever the
    /// snapshot interval says.
    pub fn sample_now(&mut self) {
        if self.nvml.source.is_none() {
            return;
        }
        self.nvml.sample();
        self.refresh_cuda_counts();
        let state = self.state.snapshot();
        let cgroups = &mut self.cgroups;
        let cuda = self.cuda.snapshot(&mut |id| cgroups.resolve(id));
        self.attribute(&state, &cuda);
    }

    /// Is an NVML sample due (none yet, or the snapshot interval has passed since the last)?
    fn nvml_due(&self) -> bool {
        let period = self.cfg.snapshot_interval_ms.max(1) * 1_000_000 * 9 / 10;
        self.nvml.source.is_some()
            && self.nvml.last.as_ref().is_none_or(|l| clock::monotonic_ns().saturating_sub(l.taken_mono_ns) >= period)
    }

    /// The immutable snapshot of this moment. NVML is sampled (and the interval attributed) when
    /// a snapshot interval has passed since the previous sample.
    pub fn snapshot(&mut self) -> AgentSnapshot {
        if self.nvml_due() {
            self.sample_now();
        }
        let (kernel, accounting) = self.accounting();
        self.refresh_cuda_counts();
        let cgroups = &mut self.cgroups;
        let cuda = self.cuda.snapshot(&mut |id| cgroups.resolve(id));
        let state = self.state.snapshot();
        let ledger_check = cuda
            .processes
            .iter()
            .filter_map(|c| {
                let d = state.processes.iter().find(|p| p.tgid == c.tgid)?;
                let (cu, dr) = (c.usage.device_bytes, d.usage.vidmem_bytes);
                Some(LedgerCheck {
                    tgid: c.tgid,
                    cgroup_id: c.cgroup_id,
                    cuda_device_bytes: cu,
                    driver_vidmem_bytes: dr,
                    driver_minus_cuda: dr as i64 - cu as i64,
                })
            })
            .collect();
        let containers = self.snapshot_identities(&state);
        AgentSnapshot {
            state,
            cuda,
            ledger_check,
            kernel,
            pipeline: self.stats.clone(),
            accounting,
            attach_mode: self.report.attach_mode,
            driver_version: self.driver_version.version_string(),
            nvml: self.nvml.view(),
            attribution: self.attribution.clone(),
            containers,
            allocation_use: self.allocation_use.clone(),
            violations: self.violations.clone(),
            violation_counts: self.guardrails.counts(),
            kubernetes: self.kube_view(),
        }
    }
}
