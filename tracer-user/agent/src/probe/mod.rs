//! Loading and attaching the kernel programs: feature detection, attach-mode choice, per-family
//! attach with independent failure, and the initial map contents (config, capture plans).
use crate::probe::attach::UVM_MODULE;
use crate::probe::attach::attach_driver;
use crate::probe::attach::attach_lifecycle;
use crate::probe::attach::probe_kind;
use crate::probe::attach::program;
use crate::probe::attach::untimed;
use crate::probe::attach::uvm_plan;
use std::path::Path;

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{Array, HashMap as BpfHashMap, MapData},
    programs::{BtfTracePoint, KProbe, RawTracePoint, TracePoint},
};
use tracer_common::{
    CaptureKey, CapturePlan, ClassSize, DeviceCheck, PlanSlot, SimDeviceKey, TracerConfig, map_names, nv::DriverAbi,
    prog_names, sysno,
};

use tracer_core::{
    config::{AttachMode, Config, DriverEntryProbes, LifecycleAttach},
    model::probes::{DeviceCheckReport, FamilyStatus, KernelFeatures, ProbeMode, ProbeReport},
};

mod attach;
pub mod devcheck;
pub mod driver_entry;
pub mod kernel_log;
pub(crate) mod lifecycle_layout;
pub mod module_btf;
pub mod trampoline;

/// The compiled kernel programs, embedded at build time.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer-ebpf"));

/// What this kernel offers (read from `/sys` and `/proc`), once at start-up.
pub(crate) fn detect_features() -> KernelFeatures {
    let release = crate::proc::kernel_release();
    let kprobes = Path::new("/sys/bus/event_source/devices/kprobe/type").exists();
    // fentry needs no kprobes: the entry points are looked for either way.
    let (driver_entry, driver_entry_detail) = match driver_entry::detect() {
        Ok(e) if kprobes => {
            let d = e.detail.clone();
            (Some(e), d)
        }
        Ok(e) => {
            let d = format!("{}; this kernel has no kprobes (only fentry, where the module has BTF)", e.detail);
            (Some(e), d)
        }
        Err(e) if kprobes => (None, e),
        Err(e) => (None, format!("{e}; this kernel has no kprobes (CONFIG_KPROBES, or no kprobe PMU)")),
    };
    KernelFeatures {
        driver_entry,
        driver_entry_detail,
        release,
        btf: Path::new("/sys/kernel/btf/vmlinux").exists(),
        tracefs: Path::new("/sys/kernel/tracing/events").exists(),
        kprobes,
        nvidia_module: Path::new("/sys/module/nvidia").exists(),
        syscall_tracepoints: Path::new("/sys/kernel/tracing/events/syscalls/sys_enter_ioctl").exists(),
    }
}

/// The attach mode to use, and why: under `auto`, driver-entry where the node offers it (kprobes,
/// the nvidia module's entry points, the kernel BTF the programs read the device minor with), then
/// btf-tracepoint, then raw-tracepoint.
pub(crate) fn choose_mode(requested: AttachMode, f: &KernelFeatures) -> (AttachMode, String) {
    match requested {
        AttachMode::Auto => {
            if f.driver_entry.is_some() && f.btf {
                return (
                    AttachMode::DriverEntry,
                    format!(
                        "probes on the NVIDIA driver's own entry points (fentry where its modules have BTF, else kprobes): {}",
                        f.driver_entry_detail
                    ),
                );
            }
            let driver_entry_note = if f.driver_entry.is_some() {
                "driver-entry needs kernel BTF (the device minor is read at its offset); ".to_string()
            } else {
                format!("driver-entry unavailable: {}; ", f.driver_entry_detail)
            };
            let (mode, why) = syscall_mode(f);
            (mode, format!("{driver_entry_note}{why}"))
        }
        m => (m, "set by configuration".to_string()),
    }
}

/// The syscall-tracepoint mode `auto` takes when driver-entry is not there: btf-tracepoint with
/// kernel BTF, raw-tracepoint without; and why.
fn syscall_mode(f: &KernelFeatures) -> (AttachMode, &'static str) {
    if f.btf {
        (AttachMode::BtfTracepoint, "BTF present: tp_btf sys_enter/sys_exit")
    } else {
        (AttachMode::RawTracepoint, "no BTF: raw_tracepoint sys_enter/sys_exit")
    }
}

/// The report of an agent that loads no eBPF (every family off: NVML-only mode) on this kernel.
/// `TRACKED_TGIDS` entries for this machine's `pid_max` (tgids are < pid_max; the source maps the
/// array with the size the loaded map has).
pub fn tracked_tgids_entries() -> u32 {
    let pid_max = crate::proc::pid_max().unwrap_or(4_194_304);
    pid_max.div_ceil(tracer_common::TRACKED_TGIDS_PER_ENTRY as u64).clamp(1, 1 << 20) as u32
}

pub fn nvml_only_report() -> ProbeReport {
    ProbeReport::nvml_only(detect_features())
}

/// Errors that stop the agent from tracing at all.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// `hint`: [`load_hint`]'s, for this kernel and this process's limits and capabilities.
    #[error("loading the eBPF object failed: {source}\n  hint: {hint}")]
    Load {
        #[source]
        source: Box<aya::EbpfError>,
        hint: String,
    },
    #[error("eBPF map {0} missing from the object (build mismatch)")]
    MissingMap(&'static str),
    #[error("writing eBPF map {map}: {source}")]
    Map { map: &'static str, source: aya::maps::MapError },
    #[error(
        "the capture tables for this driver do not fit the kernel's direct-mapped arrays: {0} (a bug: please report it with the driver version)"
    )]
    PlanTable(String),
    #[error("every probe family failed or is disabled: driver: {driver}; lifecycle: {lifecycle}; cuda: {cuda}")]
    NothingAttached { driver: String, lifecycle: String, cuda: String },
}

impl ProbeError {
    /// A short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            ProbeError::Load { .. } => "load",
            ProbeError::MissingMap(_) => "missing_map",
            ProbeError::Map { .. } => "map",
            ProbeError::NothingAttached { .. } => "nothing_attached",
            ProbeError::PlanTable(_) => "plan_table",
        }
    }
}

/// This process's `RLIMIT_MEMLOCK` soft limit in bytes (`None`: unlimited or unreadable).
fn memlock_limit() -> Option<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct passed.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 || lim.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    Some(lim.rlim_cur)
}

/// What to do when the object does not load: on a kernel that charges map memory to
/// RLIMIT_MEMLOCK (before 5.11), a refusal (`denied`: EPERM/EACCES) under a finite limit without
/// CAP_SYS_RESOURCE (aya raises the limit when it can) is that limit, not a missing CAP_BPF;
/// otherwise the capabilities BPF needs.
pub(crate) fn load_hint(denied: bool, kernel: &str, memlock: Option<u64>, caps: u64, rings: u64) -> String {
    const CAP_SYS_RESOURCE: u64 = 1 << 24;
    let old = crate::proc::kernel_before(kernel, 5, 11);
    match memlock {
        Some(limit) if denied && old && caps & CAP_SYS_RESOURCE == 0 => format!(
            "kernel {kernel} charges BPF map memory to RLIMIT_MEMLOCK (kernels before 5.11 do), which is {} here, \
             and without CAP_SYS_RESOURCE the agent cannot raise it; its maps need more than {} (the two ring \
             buffers alone, ring_buffer_bytes each). Fix: add CAP_SYS_RESOURCE (Helm: memlockCapability=true), or \
             start the agent with a memlock limit of unlimited (`ulimit -l unlimited`, the container runtime's \
             memlock ulimit)",
            tracer_core::format::human_bytes(limit),
            tracer_core::format::human_bytes(rings)
        ),
        _ => "the agent needs CAP_BPF and CAP_PERFMON (or root); `gpu-tracer doctor` says which is missing".into(),
    }
}

/// The loaded programs and maps. Dropping it detaches everything.
pub struct Probes {
    pub ebpf: Ebpf,
    pub report: ProbeReport,
    /// The kernel's device rule, for the `/proc` scan (and refreshed majors).
    pub accepted: devcheck::Accepted,
    /// Entries `TRACKED_TGIDS` was created with (from `pid_max`).
    pub tracked_entries: u32,
    /// The cuda family's uprobe links on the libraries found at start, detached all at once when
    /// this drops (see [`crate::cuda::attach::detach`]).
    cuda_links: crate::cuda::attach::Links,
    /// How libcuda copies are attached (also the ones found later, in processes' mappings).
    pub cuda_backend: crate::cuda::attach::Backend,
    /// The kernel-side diagnostics' reader (`None`: the object's log map could not be taken).
    pub kernel_log: Option<kernel_log::KernelLog>,
    /// Driver-entry mode's fentry/fexit links (empty with kprobes or another mode).
    trampolines: trampoline::Links,
    /// `Config::ioctl_durations`, for `nvidia-uvm`'s probes when it loads late.
    ioctl_durations: bool,
}

impl Probes {
    /// Detach the cuda family's uprobes on the libraries found at start, concurrently (what the
    /// drop does first); returns how many links were detached. Idempotent.
    pub fn detach_cuda(&mut self) -> usize {
        crate::cuda::attach::detach(&mut self.ebpf, std::mem::take(&mut self.cuda_links))
    }

    /// The same, one link after the other, as dropping the programs does: the benchmark's baseline
    /// for [`Probes::detach_cuda`].
    pub fn detach_cuda_one_by_one(&mut self) -> usize {
        let links = crate::cuda::attach::take_links(&mut self.ebpf, std::mem::take(&mut self.cuda_links));
        let n = links.len();
        links.into_iter().for_each(drop);
        n
    }

    /// How many cuda uprobe links are attached on the libraries found at start.
    pub fn cuda_link_count(&self) -> usize {
        self.cuda_links.len()
    }
}

impl Drop for Probes {
    fn drop(&mut self) {
        // The other programs' links and every fd go with `ebpf`, after this.
        self.detach_cuda();
    }
}

/// Kernel config for the programs (the device check off; [`Probes::load`] turns it on).
pub fn tracer_config(cfg: &Config) -> TracerConfig {
    let prefix = cfg.dev_prefix();
    let mut tc = TracerConfig {
        agent_tgid: std::process::id(),
        dev_prefix_len: prefix.len() as u32,
        wakeup_every: cfg.wakeup_every,
        // A quarter of a ring waiting: wake the consumer before it can fill, never for less.
        wakeup_bytes: cfg.ring_buffer_bytes / 4,
        ioctl_durations: cfg.ioctl_durations.into(),
        families: 0,
        diagnostics: cfg.kernel_log.into(),
        // Random per start (std's hasher keys are): driver-entry mode's file ids reveal no address.
        file_salt: {
            use std::hash::{BuildHasher, Hasher};
            std::collections::hash_map::RandomState::new().build_hasher().finish()
        },
        ..Default::default()
    };
    tc.dev_prefix[..prefix.len()].copy_from_slice(prefix.as_bytes());
    tc
}

/// The device check for `cfg`: offsets from the kernel's BTF, majors from `/proc/devices`, and the
/// simulated files when asked for; with the description for `doctor` and the report.
pub fn device_check(cfg: &Config) -> (DeviceCheck, devcheck::Accepted, Vec<SimDeviceKey>, DeviceCheckReport) {
    let majors = devcheck::read_majors(&cfg.proc_root);
    let simulated = if cfg.simulated_devices { devcheck::simulated_files(&cfg.dev_dir) } else { Vec::new() };
    let (check, mut words) = match devcheck::offsets_from_btf(Path::new(devcheck::VMLINUX_BTF)) {
        Ok(mut c) => {
            devcheck::set_majors(&mut c, &majors);
            (c, format!("opened files must be character devices with an NVIDIA major {majors:?}"))
        }
        Err(e) => {
            tracing::warn!(
                error = %e,
                "no device check: files under {} are taken as NVIDIA devices by name alone, so any user \
                 who can create such a file in their own mount namespace can feed the tracer",
                cfg.dev_dir.display()
            );
            (DeviceCheck::default(), format!("OFF, the path alone decides ({e})"))
        }
    };
    if cfg.simulated_devices {
        words.push_str(&format!(
            ", or one of the {} simulated device files in {} (simulated_devices)",
            simulated.len(),
            cfg.dev_dir.display()
        ));
    }
    let report =
        DeviceCheckReport { enabled: check.enabled != 0, simulated_files: simulated.len() as u32, detail: words };
    let accepted =
        devcheck::Accepted { enabled: check.enabled != 0, majors, simulated: simulated.iter().copied().collect() };
    (check, accepted, simulated, report)
}

impl Probes {
    /// Load the object, fill the maps, and attach the enabled families in the chosen mode.
    pub fn load(
        cfg: &Config,
        abi: &DriverAbi,
        plans: &[(CaptureKey, CapturePlan)],
        alloc_sizes: &[(u32, u32)],
    ) -> Result<Probes, ProbeError> {
        let features = detect_features();
        let (mode, attach_reason) = choose_mode(cfg.attach_mode, &features);
        let tracked_entries = tracked_tgids_entries();
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(map_names::EVENTS, cfg.ring_buffer_bytes)
            .map_max_entries(map_names::BULK_EVENTS, cfg.ring_buffer_bytes)
            .map_max_entries(map_names::TRACKED_TGIDS, tracked_entries)
            .load(EBPF_OBJECT)
            .map_err(|source| {
                let denied = crate::bpf::error_with_causes("", &source).1;
                let hint = load_hint(
                    denied,
                    &crate::proc::kernel_release(),
                    memlock_limit(),
                    crate::proc::status(Path::new("/proc"), "self").map_or(0, |s| s.capeff),
                    2 * cfg.ring_buffer_bytes as u64,
                );
                ProbeError::Load { source: Box::new(source), hint }
            })?;

        let (check, accepted, simulated, device_check) = device_check(cfg);
        let layout =
            lifecycle_layout::detect(Path::new("/sys/kernel/tracing/events"), Path::new(devcheck::VMLINUX_BTF));
        let kernel_config = TracerConfig { device_check: check, lifecycle: layout.layout, ..tracer_config(cfg) };
        {
            let m = ebpf.map_mut(map_names::CONFIG).ok_or(ProbeError::MissingMap(map_names::CONFIG))?;
            let mut a: Array<&mut MapData, TracerConfig> =
                Array::try_from(m).map_err(|source| ProbeError::Map { map: map_names::CONFIG, source })?;
            a.set(0, kernel_config, 0).map_err(|source| ProbeError::Map { map: map_names::CONFIG, source })?;
        }
        {
            let m = ebpf.map_mut(map_names::SIM_DEVICES).ok_or(ProbeError::MissingMap(map_names::SIM_DEVICES))?;
            let mut h: BpfHashMap<&mut MapData, SimDeviceKey, u8> =
                BpfHashMap::try_from(m).map_err(|source| ProbeError::Map { map: map_names::SIM_DEVICES, source })?;
            for k in &simulated {
                h.insert(k, 1, 0).map_err(|source| ProbeError::Map { map: map_names::SIM_DEVICES, source })?;
            }
        }
        {
            let slots = tracer_core::decode::plan::plan_slots(plans).map_err(ProbeError::PlanTable)?;
            let m = ebpf.map_mut(map_names::CAPTURE_PLANS).ok_or(ProbeError::MissingMap(map_names::CAPTURE_PLANS))?;
            let mut a: Array<&mut MapData, PlanSlot> =
                Array::try_from(m).map_err(|source| ProbeError::Map { map: map_names::CAPTURE_PLANS, source })?;
            for (slot, entry) in slots {
                a.set(slot, entry, 0).map_err(|source| ProbeError::Map { map: map_names::CAPTURE_PLANS, source })?;
            }
        }
        {
            let slots = tracer_core::decode::plan::class_slots(alloc_sizes).map_err(ProbeError::PlanTable)?;
            let m = ebpf
                .map_mut(map_names::ALLOC_PARAM_SIZES)
                .ok_or(ProbeError::MissingMap(map_names::ALLOC_PARAM_SIZES))?;
            let mut a: Array<&mut MapData, ClassSize> =
                Array::try_from(m).map_err(|source| ProbeError::Map { map: map_names::ALLOC_PARAM_SIZES, source })?;
            for (slot, entry) in slots {
                a.set(slot, entry, 0)
                    .map_err(|source| ProbeError::Map { map: map_names::ALLOC_PARAM_SIZES, source })?;
            }
        }

        let (mut mode, mut attach_reason) = (mode, attach_reason);
        let mut trampolines = trampoline::Links::default();
        let entry_probes = (cfg.driver_entry_probes, cfg.ioctl_durations);
        let driver = if cfg.families.driver {
            match attach_driver(&mut ebpf, mode, &features, &check, entry_probes, &mut trampolines) {
                Ok(p) => FamilyStatus::Attached { programs: p },
                // `auto` chose driver-entry and it did not attach: the next mode, and why.
                Err(e) if mode == AttachMode::DriverEntry && cfg.attach_mode == AttachMode::Auto => {
                    let (next, why) = syscall_mode(&features);
                    tracing::warn!(error = %e, fallback = next.as_str(), "driver-entry mode did not attach");
                    mode = next;
                    attach_reason = format!("driver-entry did not attach ({e}); {why}");
                    match attach_driver(&mut ebpf, mode, &features, &check, entry_probes, &mut trampolines) {
                        Ok(p) => FamilyStatus::Attached { programs: p },
                        Err(e) => FamilyStatus::Failed { error: e },
                    }
                }
                Err(e) => FamilyStatus::Failed { error: e },
            }
        } else {
            FamilyStatus::Disabled
        };
        let lifecycle = if cfg.families.lifecycle {
            match attach_lifecycle(&mut ebpf, cfg.lifecycle_attach, &layout) {
                Ok(p) => FamilyStatus::Attached { programs: p },
                Err(e) => FamilyStatus::Failed { error: e },
            }
        } else {
            FamilyStatus::Disabled
        };
        let mut cuda_libraries = Vec::new();
        let mut cuda_links = crate::cuda::attach::Links::default();
        let mut cuda_backend = crate::cuda::attach::Backend::perf("the cuda family is off");
        let cuda = if cfg.families.cuda {
            let libs = crate::cuda::attach::library_candidates(&cfg.cuda_libraries);
            match crate::cuda::attach::Backend::new(cfg.cuda_attach, cfg.cuda_entry_programs, &mut ebpf, EBPF_OBJECT) {
                Err(e) => FamilyStatus::Failed { error: e },
                Ok(backend) => {
                    cuda_backend = backend;
                    match crate::cuda::attach::attach_all(&mut ebpf, &cuda_backend, &libs, cfg.cuda_timed_calls) {
                        Ok((reports, links)) => {
                            cuda_links = links;
                            let programs = reports.iter().map(library_summary).collect();
                            cuda_libraries = reports;
                            FamilyStatus::Attached { programs }
                        }
                        Err(e) => e.family_status(),
                    }
                }
            }
        } else {
            FamilyStatus::Disabled
        };
        let report = ProbeReport {
            features,
            attach_mode: ProbeMode::Attached(mode),
            attach_reason,
            driver_abi: format!("{}.{}.{:02}", abi.version.major, abi.version.minor, abi.version.patch),
            driver,
            lifecycle,
            cuda,
            cuda_libraries,
            device_check,
        };
        if !matches!(report.driver, FamilyStatus::Attached { .. })
            && !matches!(report.lifecycle, FamilyStatus::Attached { .. })
            && !matches!(report.cuda, FamilyStatus::Attached { .. })
        {
            let s = |f: &FamilyStatus| match f {
                FamilyStatus::Failed { error } | FamilyStatus::NothingToProbe { error } => error.clone(),
                FamilyStatus::Disabled => "disabled".into(),
                FamilyStatus::Attached { .. } => "attached".into(),
            };
            return Err(ProbeError::NothingAttached {
                driver: s(&report.driver),
                lifecycle: s(&report.lifecycle),
                cuda: s(&report.cuda),
            });
        }
        let kernel_log = match kernel_log::KernelLog::take(&mut ebpf) {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!(error = %e, "kernel-side diagnostics unavailable (kernel_log has no effect)");
                None
            }
        };
        Ok(Probes {
            ebpf,
            report,
            accepted,
            tracked_entries,
            cuda_links,
            cuda_backend,
            kernel_log,
            trampolines,
            ioctl_durations: cfg.ioctl_durations,
        })
    }

    /// Re-read `/proc/devices` and give the kernel any NVIDIA major that appeared since start
    /// (`nvidia-uvm` is often loaded on demand, after the agent). Returns whether it changed.
    pub(crate) fn refresh_majors(&mut self, proc_root: &Path) -> Result<bool, ProbeError> {
        if !self.accepted.enabled {
            return Ok(false);
        }
        let majors = devcheck::read_majors(proc_root);
        if majors == self.accepted.majors {
            return Ok(false);
        }
        let m = self.ebpf.map_mut(map_names::CONFIG).ok_or(ProbeError::MissingMap(map_names::CONFIG))?;
        let mut a: Array<&mut MapData, TracerConfig> =
            Array::try_from(m).map_err(|source| ProbeError::Map { map: map_names::CONFIG, source })?;
        // Read-modify-write: the per-event switch lives in the same value.
        let mut kc = a.get(&0, 0).map_err(|source| ProbeError::Map { map: map_names::CONFIG, source })?;
        devcheck::set_majors(&mut kc.device_check, &majors);
        a.set(0, kc, 0).map_err(|source| ProbeError::Map { map: map_names::CONFIG, source })?;
        tracing::info!(?majors, "NVIDIA device majors changed");
        self.accepted.majors = majors;
        Ok(true)
    }

    /// Driver-entry mode with `nvidia-uvm` not loaded at start (it is often loaded on demand, by
    /// the first CUDA process): once the module is there, attach its probes too. Returns whether
    /// they were attached now; an attach error is returned (and tried again next time).
    pub(crate) fn attach_late_uvm(&mut self) -> Result<bool, String> {
        let waiting = self.report.attach_mode == ProbeMode::Attached(AttachMode::DriverEntry)
            && matches!(self.report.driver, FamilyStatus::Attached { .. })
            && self.report.features.driver_entry.as_ref().is_some_and(|e| e.uvm.is_none());
        if !waiting || !Path::new("/sys/module/nvidia_uvm").exists() {
            return Ok(false);
        }
        let points = driver_entry::detect()?;
        let Some(u) = points.uvm else { return Ok(false) };
        if !self.trampolines.is_empty() {
            // fentry on nvidia.ko: the same on nvidia-uvm if its BTF allows, else kprobes there.
            let plan = untimed(&uvm_plan(&u, points.uvm_managed), self.ioctl_durations);
            match trampoline::attach(EBPF_OBJECT, &self.ebpf, UVM_MODULE, &plan, &mut self.trampolines) {
                Ok(attached) => {
                    if let FamilyStatus::Attached { programs } = &mut self.report.driver {
                        programs
                            .extend(attached.into_iter().map(|a| format!("{a} (nvidia-uvm loaded after the agent)")));
                    }
                    if let Some(e) = &mut self.report.features.driver_entry {
                        e.uvm = Some(u);
                        e.uvm_managed = points.uvm_managed;
                    }
                    tracing::info!(ioctl = u.ioctl, "nvidia-uvm appeared: its fentry/fexit programs are attached");
                    return Ok(true);
                }
                Err(e) => tracing::warn!(error = %e, "nvidia-uvm appeared: fentry/fexit failed there, kprobes instead"),
            }
        }
        for (prog, func) in uvm_plan(&u, points.uvm_managed) {
            let p: &mut KProbe = program(&mut self.ebpf, prog)?;
            if p.fd().is_err() {
                p.load().map_err(|e| format!("loading {prog}: {e:#}"))?;
            }
            let kind = probe_kind(p);
            // A kprobe is a perf event of the kprobe PMU: refused without CAP_SYS_ADMIN where
            // perf_event_paranoid is 3 or more on Debian/Ubuntu kernels; the error says so.
            p.attach(func, 0).map_err(|e| tracepoint_error(&format!("attaching {kind}/{func}"), &e))?;
            if let FamilyStatus::Attached { programs } = &mut self.report.driver {
                programs.push(format!("{kind}/{func} (nvidia-uvm loaded after the agent)"));
            }
        }
        if let Some(e) = &mut self.report.features.driver_entry {
            e.uvm = Some(u);
            e.uvm_managed = points.uvm_managed;
        }
        tracing::info!(ioctl = u.ioctl, "nvidia-uvm appeared: its driver-entry probes are attached");
        Ok(true)
    }

    /// Switch the kernel-side diagnostics ([`kernel_log`]) on or off, at once, without reloading.
    pub(crate) fn set_diagnostics(&mut self, on: bool) -> Result<(), ProbeError> {
        let m = self.ebpf.map_mut(map_names::CONFIG).ok_or(ProbeError::MissingMap(map_names::CONFIG))?;
        let mut a: Array<&mut MapData, TracerConfig> =
            Array::try_from(m).map_err(|source| ProbeError::Map { map: map_names::CONFIG, source })?;
        let mut kc = a.get(&0, 0).map_err(|source| ProbeError::Map { map: map_names::CONFIG, source })?;
        kc.diagnostics = on.into();
        a.set(0, kc, 0).map_err(|source| ProbeError::Map { map: map_names::CONFIG, source })
    }

    /// Whether the kernel-side diagnostics are on now.
    pub fn diagnostics(&self) -> bool {
        self.ebpf
            .map(map_names::CONFIG)
            .and_then(|m| Array::<&MapData, TracerConfig>::try_from(m).ok())
            .and_then(|a| a.get(&0, 0).ok())
            .is_some_and(|kc| kc.diagnostics != 0)
    }
}

/// One library in the cuda family's status: `uprobe-multi:PATH (N entry points)`, or for perf
/// events `uprobe:PATH (N entry points; perf events: WHY)`.
pub(crate) fn library_summary(r: &tracer_core::model::probes::LibraryReport) -> String {
    match r.method {
        tracer_core::model::probes::Method::UprobeMulti => {
            format!("uprobe-multi:{} ({} entry points)", r.path, r.attached())
        }
        tracer_core::model::probes::Method::PerfEvent => {
            format!("uprobe:{} ({} entry points; perf events: {})", r.path, r.attached(), r.method_detail)
        }
        tracer_core::model::probes::Method::Tracefs => {
            format!("uprobe:{} ({} entry points; tracefs: {})", r.path, r.attached(), r.method_detail)
        }
    }
}

/// `what` failed with `e`: the message with its causes, and when the kernel refused the
/// tracepoint's perf event, why that happens with CAP_PERFMON held and the fix.
pub(crate) fn tracepoint_error(what: &str, e: &(dyn std::error::Error + 'static)) -> String {
    let (mut msg, denied) = crate::bpf::error_with_causes(what, e);
    if denied {
        let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").unwrap_or_default();
        msg.push_str(&format!(
            " (kernel.perf_event_paranoid is {}: Debian's and Ubuntu's kernels refuse perf events without \
             CAP_SYS_ADMIN at 3 and above, CAP_PERFMON notwithstanding; fix: `sysctl kernel.perf_event_paranoid=2` \
             on the node, or add SYS_ADMIN)",
            paranoid.trim()
        ));
    }
    msg
}

#[cfg(test)]
mod tests;
