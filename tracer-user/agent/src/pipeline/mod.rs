//! The running pipeline. [`Agent`] holds the stages, each in its own file:
//!
//! ```text
//! kernel.rs        probes, ring buffer, tracked fds  ──► ingest.rs: decode → track fds → apply
//!                  (+ sweeping, per-event switch)         (state, CUDA ledger) → enrich → emit
//! late_libcuda.rs  a process's own libcuda, probed        → after (exit cleanup, fork seeding)
//!                  when it first opens a device                    │
//! nvml.rs          NVML sampler ─────────────────┐                 ▼
//! kubernetes.rs    pod watcher, pod-resources ───┼──► join.rs: ledgers + NVML + identity →
//! identities.rs    cgroup → container/pod ───────┘    attribution and guardrails, once per sample
//!                                                                  │
//!                                        snapshot() ──► model::AgentSnapshot (once per tick)
//! ```
//!
//! Everything runs on one task: a record is decoded and applied as soon as it is drained, so no
//! queue sits between the stages and none can drop. What can be lost is lost in the kernel, where it
//! is counted; [`Accounting`] checks `seen == received + aggregated + dropped` for every probe.
use std::{collections::BTreeSet, time::Duration};

use tracer_common::nv::DriverAbi;

use crate::{enrich::Enricher, identity::kube::PodCache, probe::ProbeError, source::ringbuf::SourceError};
use tracer_core::{
    clock::{self, WallClock},
    config::{Config, ResolvedDriverVersion, resolve_driver_version},
    cuda::ledger::CudaLedger,
    identity::ContainerIdentity,
    model::{
        Accounting, AgentSnapshot, EventContext, LedgerCheck, PipelineStats,
        counters::KernelCounters,
        probes::{LibraryReport, ProbeReport},
    },
    state::TracerState,
};

mod identities;
mod ingest;
mod join;
mod kernel;
mod kubernetes;
mod late_libcuda;
mod nvml;
mod reconcile;

pub(crate) use ingest::EventSink;

/// How many records are taken out of the ring buffer per batch.
const DRAIN_BATCH: usize = 4096;

/// Errors starting the pipeline.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] tracer_core::config::ConfigError),
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("NVML is required (nvml.mode = \"required\") but cannot be used: {0}")]
    Nvml(#[from] crate::nvml::sampler::NvmlOpenError),
    #[error("Kubernetes is required (kubernetes.mode = \"required\") but cannot be used: {0}")]
    Kube(#[from] crate::identity::kube::KubeError),
    #[error("the kubelet pod-resources API is required (kubernetes.mode = \"required\") but cannot be used: {0}")]
    PodResources(#[from] crate::allocation::pod_resources::PodResourcesError),
}

/// The running agent: the pipeline's stages, in the order data flows through them.
pub struct Agent {
    cfg: Config,
    /// The driver version whose struct layouts decoding uses.
    pub driver_version: ResolvedDriverVersion,
    abi: DriverAbi,
    report: ProbeReport,
    /// Source: the eBPF side; `None` in NVML-only mode (every probe family off).
    kernel: Option<kernel::KernelSide>,
    late_libcuda: late_libcuda::LateLibcuda,
    /// State: the driver ledger (processes, fds, RM handles → live memory).
    state: TracerState,
    /// State: the CUDA ledger (launch counts, cuMemAlloc/cuMemFree, kernel names).
    cuda: CudaLedger,
    /// Enrich: process facts and cgroup paths.
    enrich: Enricher,
    identities: identities::Identities,
    nvml: nvml::NvmlSide,
    kube: kubernetes::KubeSide,
    join: join::Join,
    /// Counters of the user-space stages.
    pub stats: PipelineStats,
    /// Stamps events with wall time.
    wall_clock: WallClock,
}

impl Agent {
    /// Load and attach the probes, then seed state from `/proc`.
    pub fn start(cfg: Config) -> Result<Agent, StartError> {
        cfg.validate()?;
        let driver_version = resolve_driver_version(&cfg);
        let abi = DriverAbi::for_version(driver_version.version);
        // NVML first: when it is required and missing, fail before loading anything.
        let nvml = nvml::NvmlSide::open(&cfg)?;
        let (kernel, report) = if cfg.families.any() {
            let (k, report) = kernel::KernelSide::load(&cfg, &abi)?;
            (Some(k), report)
        } else {
            (None, crate::probe::nvml_only_report())
        };
        let late_libcuda = late_libcuda::LateLibcuda::new(
            report.cuda_libraries.iter().map(|l| std::path::Path::new(&l.path)),
            cfg.cuda_timed_calls,
        );
        let mut agent = Agent {
            driver_version,
            abi,
            report,
            kernel,
            late_libcuda,
            state: TracerState::new(cfg.max_processes),
            cuda: CudaLedger::default(),
            enrich: Enricher::new(cfg.proc_root.clone(), cfg.cgroup_root.clone()),
            identities: Default::default(),
            nvml,
            kube: Default::default(),
            join: join::Join::new(&cfg),
            stats: PipelineStats::default(),
            wall_clock: WallClock::new(),
            cfg,
        };
        agent.seed_from_proc(None, &mut |_, _| {});
        Ok(agent)
    }

    /// Start the Kubernetes side (call once, inside the tokio runtime): the pod watcher for this
    /// node and the kubelet pod-resources poller. In `auto` mode whatever is missing is reported
    /// (`kubernetes` in the snapshot, `doctor`) and the agent goes on; in `required` mode it fails.
    pub async fn start_kubernetes(&mut self) -> Result<(), StartError> {
        self.kube.start(&self.cfg.kubernetes).await
    }

    /// Log how loading and attaching went: the attach mode and why, the driver version, and each
    /// probe family that failed (the others keep running).
    pub fn log_report(&self) {
        let r = self.report();
        tracing::info!(mode = %r.attach_mode, reason = %r.attach_reason, driver = %self.driver_version.version_string(), "probes loaded");
        for (name, st) in [("driver", &r.driver), ("lifecycle", &r.lifecycle), ("cuda", &r.cuda)] {
            if let Some(error) = st.error() {
                tracing::warn!(family = name, %error, "probe family failed; the others keep running");
            }
        }
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

    /// Reports of the libcuda copies probed after start-up (found in GPU processes' mappings).
    pub fn cuda_late_libraries(&self) -> &[LibraryReport] {
        &self.late_libcuda.reports
    }

    /// The pod cache, when the watcher runs (tests wait on it).
    pub fn pod_cache(&self) -> Option<&PodCache> {
        self.kube.pods.as_ref()
    }

    /// Read the kubelet's allocations now (instead of waiting for the next poll).
    pub async fn refresh_allocations(&self) {
        self.kube.refresh_allocations().await
    }

    /// Wait for records (a wake-up or the drain interval), then process everything waiting.
    /// `sink` sees every event with its context. Returns how many records were processed.
    pub async fn step(&mut self, sink: &mut EventSink<'_>) -> usize {
        let wait = Duration::from_millis(self.cfg.drain_interval_ms.max(1));
        match self.kernel.as_mut() {
            Some(k) => k.ring.wait(wait).await,
            None => tokio::time::sleep(wait).await,
        }
        if self.kernel.as_ref().is_some_and(|k| k.sweep_due()) {
            self.sweep_inflight();
            self.refresh_device_majors();
            self.reconcile_processes(sink);
        }
        self.drain(sink)
    }

    /// Process everything waiting in the ring buffer now (and log the kernel's diagnostics).
    pub fn drain(&mut self, sink: &mut EventSink<'_>) -> usize {
        if let Some(l) = self.kernel.as_mut().and_then(|k| k.probes.kernel_log.as_mut()) {
            l.flush();
        }
        let mut total = 0;
        loop {
            let mut batch: Vec<Vec<u8>> = Vec::new();
            let Some(k) = self.kernel.as_mut() else { return total };
            let n = k.ring.drain(DRAIN_BATCH, |b| batch.push(b.to_vec()));
            self.stats.received += n as u64;
            for b in &batch {
                self.ingest(b, sink);
            }
            total += n;
            if n < DRAIN_BATCH {
                return total;
            }
        }
    }

    /// Remove `INFLIGHT` entries (syscall entry state) of threads that no longer exist: a thread
    /// killed inside a traced syscall never reaches its exit. Returns how many were removed.
    pub fn sweep_inflight(&mut self) -> u64 {
        let Some(k) = self.kernel.as_mut() else { return 0 };
        let n = k.sweep_dead_threads(&self.cfg.proc_root);
        self.stats.inflight_swept += n;
        n
    }

    /// Give the kernel's device check the NVIDIA majors `/proc/devices` lists now (`nvidia-uvm` is
    /// often loaded after the agent started).
    pub(crate) fn refresh_device_majors(&mut self) {
        let Some(k) = self.kernel.as_mut() else { return };
        if let Err(e) = k.probes.refresh_majors(&self.cfg.proc_root) {
            tracing::warn!(error = %e, "cannot update the device check's majors");
        }
        if let Err(e) = k.probes.attach_late_uvm() {
            tracing::warn!(error = %e, "nvidia-uvm is loaded but its driver-entry probes did not attach");
        }
    }

    /// What each tracked process of `tgids` or of the `cgroups` holds now, from the driver and
    /// CUDA ledgers: the level a profile's memory counters start at.
    pub fn held_memory(&self, tgids: &[u32], cgroups: &[u64]) -> Vec<gpu_tracer_proto::v1::HeldMemory> {
        // A process may be in one ledger only (CUDA calls before any driver call was traced).
        let procs: BTreeSet<u32> = (self.state.process_list().into_iter().map(|(k, cg)| (k.tgid, cg)))
            .chain(self.cuda.live_processes())
            .filter(|(tgid, cg)| tgids.contains(tgid) || cgroups.contains(cg))
            .map(|(tgid, _)| tgid)
            .collect();
        procs
            .into_iter()
            .map(|pid| gpu_tracer_proto::v1::HeldMemory {
                pid,
                driver_bytes: self.state.process_driver_bytes(pid).unwrap_or(0),
                cuda_bytes: self.cuda.live_bytes(pid),
            })
            .collect()
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
            self.cuda.update_counts(k.cuda_counts());
        }
    }

    /// The context of an event of `tgid` in `cgroup_id` made now (for events user space makes),
    /// with its monotonic timestamp.
    pub(crate) fn context_now(&mut self, tgid: u32, cgroup_id: u64) -> (u64, EventContext) {
        let now = clock::monotonic_ns();
        let process = self.enrich.process_now(tgid);
        let ctx = EventContext {
            wall_time_unix_ns: self.wall_clock.wall_ns(now),
            process_start_time_ns: clock::ticks_to_ns(process.as_ref().map_or(0, |p| p.start_time_ticks)),
            comm: process.map(|p| p.comm),
            cgroup_path: self.enrich.cgroups.resolve(cgroup_id),
            released_bytes: None,
            kernel_name: None,
            container: self.identities.cached(cgroup_id, &mut self.enrich.cgroups, &self.kube),
        };
        (now, ctx)
    }

    /// A cgroup id from a numeric id or a path relative to the cgroup2 mount.
    pub fn cgroup_id(&self, path_or_id: &str) -> Option<u64> {
        self.enrich.cgroup_id(path_or_id)
    }

    /// Probe the libcuda copies `tgid` maps that are not probed yet (a process that started
    /// before the tracer, with its own copy); as when a process opens an NVIDIA device.
    pub(crate) fn probe_libcuda_of(&mut self, tgid: u32) {
        let Some(k) = self.kernel.as_mut() else { return };
        if self.cfg.families.cuda {
            self.late_libcuda.process_opened_device(
                &mut k.probes.ebpf,
                &k.probes.cuda_backend,
                &self.cfg.proc_root,
                tgid,
                &mut self.stats,
            );
        }
    }

    /// The cgroup id of process `tgid` (from `/proc/PID/cgroup`), if it exists.
    pub(crate) fn cgroup_id_of_process(&self, tgid: u32) -> Option<u64> {
        self.enrich.cgroup_id_of(tgid)
    }

    /// The cgroup2 mount the agent reads, when one was found.
    pub fn cgroup_root(&self) -> Option<std::path::PathBuf> {
        self.enrich.cgroups.root().map(std::path::Path::to_path_buf)
    }

    /// The procfs the agent reads.
    pub fn proc_root(&self) -> &std::path::Path {
        &self.cfg.proc_root
    }

    /// Where Kubernetes identity stands, in words (for messages).
    pub fn kubernetes_status(&self) -> String {
        let v = self.kube.view();
        format!("{:?}: {}", v.status, v.detail)
    }

    /// Who cgroup `id` is, resolved now (cheap: a path parse and cache lookups).
    pub fn identity_of(&mut self, id: u64) -> std::sync::Arc<ContainerIdentity> {
        self.identities.resolve(id, &mut self.enrich.cgroups, &self.kube)
    }

    /// The cgroup of container `namespace/pod/container`, among those resolved.
    pub(crate) fn cgroup_of_container(&self, namespace: &str, pod: &str, container: &str) -> Option<u64> {
        self.identities.cgroup_of_container(namespace, pod, container)
    }

    /// Violations raised since the last call (the event stream writes them).
    pub fn take_new_violations(&mut self) -> Vec<tracer_core::guardrails::Violation> {
        std::mem::take(&mut self.join.new_violations)
    }

    /// Per-event mode: send every launch of these cgroups and processes one by one (with grid, block,
    /// shared memory, stream and the kernel name), on top of the in-kernel counts. Takes effect at
    /// once, without restarting anything; empty lists turn it off.
    pub fn set_per_event(&mut self, cgroups: &[u64], tgids: &[u32]) -> Result<(), aya::maps::MapError> {
        self.set_per_event_until(&PerEventSelection::all(cgroups, tgids, u64::MAX))
    }

    /// [`Agent::set_per_event`] for at most `window`: the kernel programs stop sending launches one
    /// by one when it has passed, even if nothing here ever switches the selection off (a profiler
    /// killed mid-session, an agent that lost its client).
    pub fn set_per_event_for(
        &mut self,
        cgroups: &[u64],
        tgids: &[u32],
        window: Duration,
    ) -> Result<(), aya::maps::MapError> {
        self.set_per_event_until(&PerEventSelection::all(cgroups, tgids, deadline_after(window)))
    }

    /// Per-event mode for exactly these selections, each until its deadline (`ktime_ns` on
    /// CLOCK_MONOTONIC, `u64::MAX`: none); the previous selections are replaced, an empty list
    /// turns per-event mode off.
    pub(crate) fn set_per_event_until(
        &mut self,
        selections: &[(PerEventSelection, u64)],
    ) -> Result<(), aya::maps::MapError> {
        let missing = || aya::maps::MapError::InvalidName { name: tracer_common::map_names::CUDA_PER_EVENT.into() };
        self.kernel.as_mut().ok_or_else(missing)?.set_per_event(selections)
    }

    /// Switch the kernel-side diagnostics on or off (`kernel_log`); returns the new state. Without
    /// probes (NVML only) there is nothing to switch.
    pub fn set_kernel_log(&mut self, on: bool) -> Result<bool, ProbeError> {
        let Some(k) = self.kernel.as_mut() else { return Ok(false) };
        k.probes.set_diagnostics(on)?;
        Ok(on)
    }

    /// Toggle the kernel-side diagnostics (SIGUSR1); logs what it did.
    pub(crate) fn toggle_kernel_log(&mut self) {
        let Some(on) = self.kernel.as_ref().map(|k| !k.probes.diagnostics()) else {
            tracing::warn!("SIGUSR1: no probes loaded, no kernel-side diagnostics to switch");
            return;
        };
        match self.set_kernel_log(on) {
            Ok(true) => tracing::info!("SIGUSR1: kernel-side diagnostics on (SIGUSR1 again turns them off)"),
            Ok(false) => tracing::info!("SIGUSR1: kernel-side diagnostics off"),
            Err(e) => tracing::warn!(error = %e, "SIGUSR1: could not switch the kernel-side diagnostics"),
        }
    }

    /// Kernel-side diagnostic lines read so far and the last few (oldest first).
    pub fn kernel_log(&self) -> (u64, Vec<String>) {
        self.kernel
            .as_ref()
            .and_then(|k| k.probes.kernel_log.as_ref())
            .map_or((0, Vec::new()), |l| (l.lines(), l.recent()))
    }

    /// Read the kernel counters and check the accounting identity.
    pub fn accounting(&self) -> (KernelCounters, Accounting) {
        let kc = self.kernel.as_ref().map(|k| k.counters()).unwrap_or_default();
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

    /// The latest NVML sample, if NVML is in use and sampled once.
    pub fn nvml_sample(&self) -> Option<std::sync::Arc<tracer_core::nvml::model::NvmlSample>> {
        self.nvml.last.clone()
    }

    /// Take an NVML sample (and attribute the interval since the previous one) now, whatever the
    /// snapshot interval says.
    pub fn sample_now(&mut self) {
        if !self.nvml.in_use() {
            return;
        }
        self.refresh_cuda_counts();
        let state = self.state.snapshot();
        let cuda = self.cuda.snapshot(&mut |id| self.enrich.cgroups.resolve(id));
        self.nvml.sample();
        self.attribute(&state, &cuda);
    }

    /// Mark the ledgers of processes whose records the kernel could not deliver (a full ring
    /// buffer, a full entry or fd map) inexact from the first loss on.
    fn note_lost_records(&mut self) {
        let Some(k) = self.kernel.as_mut() else { return };
        for (tgid, ktime) in k.take_lost_records() {
            let unix_ns = self.wall_clock.wall_ns(ktime);
            if !self.state.mark_records_lost(tgid, unix_ns) {
                self.stats.lost_records_untracked += 1;
            }
        }
    }

    /// The cgroup resolver's counters into the pipeline's.
    fn note_cgroup_lookups(&mut self) {
        let l = self.enrich.cgroups.lookups;
        self.stats.cgroup_paths_by_id = l.by_id;
        self.stats.cgroup_paths_by_walk = l.by_walk;
        self.stats.cgroup_paths_unresolved = l.unresolved;
        self.stats.cgroup_walks = l.walks;
    }

    /// The immutable snapshot of this moment, built once: the ledgers are read once, and when a
    /// snapshot interval has passed since the previous NVML sample, NVML is sampled and the
    /// interval attributed from those same readings.
    pub fn snapshot(&mut self) -> AgentSnapshot {
        self.note_lost_records();
        let (kernel, accounting) = self.accounting();
        self.refresh_cuda_counts();
        let mut state = self.state.snapshot();
        let cuda = self.cuda.snapshot(&mut |id| self.enrich.cgroups.resolve(id));
        if self.nvml.due(self.cfg.snapshot_interval_ms) {
            self.nvml.sample();
            self.attribute(&state, &cuda);
        }
        // Rows of processes from before the agent: NVML's figure beside the ledger's (which
        // cannot know what they allocated before).
        if let Some(sample) = &self.nvml.last {
            state.add_nvml_memory(|pid, minor| sample.process_used_bytes(pid, minor));
        }
        let ledger_check = ledger_check(&state, &cuda);
        let mut ids: BTreeSet<u64> = state.cgroups.iter().map(|c| c.cgroup_id).collect();
        if let Some(a) = &self.join.attribution {
            ids.extend(a.containers.iter().map(|c| c.container.0));
        }
        let containers = self.identities.refresh(ids, &mut self.enrich.cgroups, &self.kube);
        // A cgroup row gets its path from the record that created it; when that lookup found none
        // (the cgroup was new and, without lookups by id, no walk was due), it takes the one found since.
        for row in state.cgroups.iter_mut().filter(|r| r.path.is_none()) {
            if let Some(p) = containers.get(&row.cgroup_id).and_then(|c| c.cgroup_path.as_deref()) {
                self.state.set_cgroup_path(row.cgroup_id, p);
                row.path = Some(p.to_owned());
            }
        }
        self.note_cgroup_lookups();
        AgentSnapshot {
            state,
            cuda,
            ledger_check,
            kernel,
            pipeline: self.stats.clone(),
            accounting,
            attach_mode: self.report.attach_mode,
            probe_families: tracer_core::model::ProbeFamilyState::of_report(&self.report),
            driver_version: self.driver_version.version_string(),
            nvml: self.nvml.view(),
            attribution: self.join.attribution.clone(),
            containers,
            allocation_use: self.join.allocation_use.clone(),
            violations: self.join.violations.clone(),
            violation_counts: self.join.violation_counts(),
            kubernetes: self.kube.view(),
            otlp: None,
            api: None,
            http: None,
        }
    }
}

/// The CUDA ledger beside the driver ledger, for every process both know.
fn ledger_check(
    state: &tracer_core::state::Snapshot,
    cuda: &tracer_core::cuda::ledger::CudaSnapshot,
) -> Vec<LedgerCheck> {
    cuda.processes
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
        .collect()
}

/// What per-event mode is switched on for: a cgroup (every process in it) or one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PerEventSelection {
    Cgroup(u64),
    Process(u32),
}

impl PerEventSelection {
    /// The kernel map's key.
    pub fn key(&self) -> tracer_common::PerEventKey {
        match *self {
            PerEventSelection::Cgroup(id) => {
                tracer_common::PerEventKey { kind: tracer_common::PER_EVENT_CGROUP, _pad: 0, id }
            }
            PerEventSelection::Process(tgid) => {
                tracer_common::PerEventKey { kind: tracer_common::PER_EVENT_TGID, _pad: 0, id: tgid.into() }
            }
        }
    }

    /// Every cgroup and process given, each until `until`.
    pub fn all(cgroups: &[u64], tgids: &[u32], until: u64) -> Vec<(PerEventSelection, u64)> {
        let cg = cgroups.iter().map(|c| (PerEventSelection::Cgroup(*c), until));
        cg.chain(tgids.iter().map(|t| (PerEventSelection::Process(*t), until))).collect()
    }
}

/// The `ktime_ns` deadline `window` from now (below `u64::MAX`, which means none).
pub(crate) fn deadline_after(window: Duration) -> u64 {
    let w = window.as_nanos().min(u64::MAX as u128 - 1) as u64;
    clock::monotonic_ns().saturating_add(w).min(u64::MAX - 1)
}
