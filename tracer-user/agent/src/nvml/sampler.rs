//! The NVML sampler: opens `libnvidia-ml.so.1` through nvml-wrapper as `NvmlSettings` says (not where
//! the NVIDIA driver is not loaded: [`NvmlOpenError::DriverAbsent`]), and turns one pass over every
//! GPU into an [`NvmlSample`].
//!
//! A reading NVML refuses is recorded in `missing` (NotSupported = the feature is absent, not an
//! error) and counted by reason; a lost GPU is marked `lost` and the pass goes on with the others;
//! process-utilization samples are asked for "newer than the last one seen" per device, so none is
//! returned twice.
use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use nvml_wrapper::enum_wrappers::device::{Clock, ComputeMode as NvComputeMode, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::{Device, Nvml};

use tracer_core::config::{Config, SourceMode};
use tracer_core::nvml::model::{
    Clocks, ComputeMode, DeviceSample, GpuProcess, MemoryInfo, MigInstance, Missing, NvmlSample, ProcessUtilization,
    Utilization,
};

/// The name the dynamic loader is asked for when `nvml.library` is not set.
pub(crate) const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

/// The symbol gpu-tracer's NVML double (tests/fake-nvml) exports. With `simulated_devices`, an
/// explicit `nvml.library` is initialised without the NVIDIA driver only when its dynamic symbol
/// table has this (read from the file, not loaded): NVIDIA's own library, named by mistake, would
/// create /dev/nvidiactl on a node without the driver (issue 45 item 6).
pub const DOUBLE_MARKER: &str = "GPU_TRACER_NVML_DOUBLE";

/// Whether the ELF file at `path` exports [`DOUBLE_MARKER`].
pub fn is_double(path: &Path) -> bool {
    use object::{Object as _, ObjectSymbol as _};
    let Ok(data) = std::fs::read(path) else { return false };
    let Ok(file) = object::File::parse(&*data) else { return false };
    file.dynamic_symbols().any(|s| s.name() == Ok(DOUBLE_MARKER))
}

/// Why NVML cannot be used on this node. Each message names the cause and the fix.
#[derive(Debug, thiserror::Error)]
pub enum NvmlOpenError {
    /// Not even tried: NVIDIA's `nvmlInit`, run as root without the kernel module, creates
    /// `/dev/nvidiactl` (c 195:255, mode 0666; measured with the 535 library; its strings also name
    /// `/usr/bin/nvidia-modprobe`, which loads the module).
    #[error(
        "NVML not initialised: the NVIDIA driver is not loaded ({} missing); initialising it would create \
         /dev/nvidiactl. Load the driver (`modprobe nvidia`; `nvidia-smi` must work), or set nvml.mode = \"off\" \
         to run without NVML",
        proc_dir.display()
    )]
    DriverAbsent {
        /// `<proc_root>/driver/nvidia`, which the loaded driver provides.
        proc_dir: PathBuf,
    },
    #[error(
        "cannot load the NVML library {library}: {detail}. Install the NVIDIA driver's user-space \
         library (Debian/Ubuntu package libnvidia-ml1, or the driver installer), set nvml.library to \
         its path, or set nvml.mode = \"off\" to run without NVML"
    )]
    LibraryNotFound {
        /// The library asked for.
        library: String,
        /// The loader's message.
        detail: String,
    },
    #[error(
        "NVML ({library}) says Driver Not Loaded: the NVIDIA kernel module is not loaded on this node. \
         Load it (`modprobe nvidia`; `nvidia-smi` must work), or set nvml.mode = \"off\" to run without NVML"
    )]
    DriverNotLoaded {
        /// The library loaded.
        library: String,
    },
    #[error(
        "{library} lacks an NVML entry point ({detail}): it is not NVML or is too old. Point nvml.library \
         at the driver's libnvidia-ml.so.1, or set nvml.mode = \"off\""
    )]
    SymbolMissing {
        /// The library loaded.
        library: String,
        /// Which symbol, as the loader says it.
        detail: String,
    },
    #[error(
        "NVML ({library}) refused initialisation: no permission to the NVIDIA devices. Run with access to \
         /dev/nvidiactl and /dev/nvidia*, or set nvml.mode = \"off\""
    )]
    NoPermission {
        /// The library loaded.
        library: String,
    },
    #[error(
        "NVML ({library}) failed to initialise: {source}. Check that `nvidia-smi` works on this node, or set \
         nvml.mode = \"off\""
    )]
    Init {
        /// The library loaded.
        library: String,
        /// NVML's error.
        #[source]
        source: NvmlError,
    },
}

impl NvmlOpenError {
    /// A short label for metrics and `doctor`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::LibraryNotFound { .. } => "library_not_found",
            Self::DriverAbsent { .. } | Self::DriverNotLoaded { .. } => "driver_not_loaded",
            Self::SymbolMissing { .. } => "symbol_missing",
            Self::NoPermission { .. } => "no_permission",
            Self::Init { .. } => "init_failed",
        }
    }
}

/// What opening NVML gave, so the caller can both use it and say why it is absent.
#[derive(Debug)]
pub enum NvmlOpen {
    /// NVML is usable (boxed: the loaded symbol table is large).
    Ready(Box<NvmlSource>),
    /// Mode `auto` and NVML cannot be used; the agent runs without it, and this says why.
    Unavailable(NvmlOpenError),
    /// Mode `off`.
    Off,
}

impl NvmlOpen {
    /// The source, when ready.
    pub fn into_source(self) -> Option<NvmlSource> {
        match self {
            Self::Ready(s) => Some(*s),
            _ => None,
        }
    }

    /// Why NVML is not used in `auto` mode.
    pub fn unavailable_reason(&self) -> Option<&NvmlOpenError> {
        match self {
            Self::Unavailable(e) => Some(e),
            _ => None,
        }
    }
}

/// What `doctor` and `top` show about NVML.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NvmlSourceStatus {
    /// The library actually loaded (resolved with dladdr when the loader searched for it).
    pub library: PathBuf,
    /// `nvmlSystemGetDriverVersion`, e.g. `550.54.15`.
    pub driver_version: Option<String>,
    /// `nvmlSystemGetNVMLVersion`.
    pub nvml_version: Option<String>,
    /// `nvmlSystemGetCudaDriverVersion`, e.g. 12040 for 12.4.
    pub cuda_driver_version: Option<i32>,
    /// Devices at the last pass (or at open, before the first).
    pub device_count: Option<u32>,
    /// Passes taken.
    pub samples: u64,
    /// Failed readings since open, by [`reason_label`] (includes `not_supported`: features absent).
    pub failed_readings: BTreeMap<&'static str, u64>,
}

/// An open NVML library and what the sampler remembers between passes.
pub struct NvmlSource {
    nvml: Nvml,
    status: NvmlSourceStatus,
    /// Newest process-utilization timestamp returned, per device UUID (or `index:N`).
    last_seen_us: HashMap<String, u64>,
    /// UUIDs seen, by index, so a GPU that falls off the bus keeps its identity in the sample.
    known_uuids: HashMap<u32, String>,
}

impl std::fmt::Debug for NvmlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlSource").field("status", &self.status).finish_non_exhaustive()
    }
}

impl NvmlSource {
    /// Opens NVML as `cfg.nvml` says: `off` -> [`NvmlOpen::Off`]; `auto` -> [`NvmlOpen::Unavailable`]
    /// with the reason when it cannot be used; `required` -> `Err` naming the cause and the fix.
    ///
    /// NVML is not initialised where the NVIDIA driver is not loaded (`<proc_root>/driver/nvidia`
    /// missing): NVIDIA's library would change the host ([`NvmlOpenError::DriverAbsent`]). The one
    /// exception is the test double: an explicit `nvml.library` that exports [`DOUBLE_MARKER`],
    /// with `simulated_devices` (the fake driver has no kernel module; the fake NVML is loaded
    /// that way). Any other library keeps the rule, simulated devices or not.
    pub fn open(cfg: &Config) -> Result<NvmlOpen, NvmlOpenError> {
        let settings = &cfg.nvml;
        if settings.mode == SourceMode::Off {
            return Ok(NvmlOpen::Off);
        }
        // A path that is not there loads nothing (the loader does not search for a name with a
        // slash): it is tried, so the error says the library is missing.
        let missing_path = |p: &Path| p.to_string_lossy().contains('/') && !p.exists();
        let double =
            cfg.simulated_devices && settings.library.as_deref().is_some_and(|p| missing_path(p) || is_double(p));
        let opened = match driver_absent(&cfg.proc_root) {
            Some(e) if !double => Err(e),
            _ => Self::open_library(settings.library.as_deref()),
        };
        match opened {
            Ok(source) => Ok(NvmlOpen::Ready(Box::new(source))),
            Err(e) if settings.mode == SourceMode::Auto => Ok(NvmlOpen::Unavailable(e)),
            Err(e) => Err(e),
        }
    }

    /// Loads and initialises `library` (default: the loader's search for `libnvidia-ml.so.1`).
    pub fn open_library(library: Option<&Path>) -> Result<NvmlSource, NvmlOpenError> {
        let shown =
            library.map_or_else(|| format!("{DEFAULT_LIBRARY} (dynamic loader search)"), |p| p.display().to_string());
        let mut builder = Nvml::builder();
        if let Some(path) = library {
            builder.lib_path(path.as_os_str());
        }
        let nvml = builder.init().map_err(|e| match e {
            NvmlError::LibloadingError(err) => {
                NvmlOpenError::LibraryNotFound { library: shown.clone(), detail: err.to_string() }
            }
            NvmlError::DriverNotLoaded => NvmlOpenError::DriverNotLoaded { library: shown.clone() },
            NvmlError::FailedToLoadSymbol(detail) => NvmlOpenError::SymbolMissing { library: shown.clone(), detail },
            NvmlError::NoPermission => NvmlOpenError::NoPermission { library: shown.clone() },
            source => NvmlOpenError::Init { library: shown.clone(), source },
        })?;
        let loaded =
            loaded_path(&nvml).or_else(|| library.map(Path::to_path_buf)).unwrap_or_else(|| DEFAULT_LIBRARY.into());
        let status = NvmlSourceStatus {
            library: loaded,
            driver_version: nvml.sys_driver_version().ok(),
            nvml_version: nvml.sys_nvml_version().ok(),
            cuda_driver_version: nvml.sys_cuda_driver_version().ok(),
            device_count: nvml.device_count().ok(),
            samples: 0,
            failed_readings: BTreeMap::new(),
        };
        Ok(NvmlSource { nvml, status, last_seen_us: HashMap::new(), known_uuids: HashMap::new() })
    }

    /// Library, versions, device count and failed readings so far.
    pub fn status(&self) -> &NvmlSourceStatus {
        &self.status
    }

    /// One pass over every device.
    pub fn sample(&mut self) -> NvmlSample {
        let started = Instant::now();
        let taken_unix_ns = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        // The pipeline's clock, so sample times compare with its own.
        let taken_mono_ns = tracer_core::clock::monotonic_ns();
        let Self { nvml, status, last_seen_us, known_uuids } = self;
        let mut failures = Failures { counts: &mut status.failed_readings };
        let mut missing = Vec::new();
        let mut devices = Vec::new();
        match nvml.device_count() {
            Ok(count) => {
                status.device_count = Some(count);
                for index in 0..count {
                    devices.push(sample_device(nvml, index, last_seen_us, known_uuids, &mut failures));
                }
            }
            Err(e) => failures.record(&mut missing, "device_count", &e),
        }
        status.samples += 1;
        NvmlSample {
            taken_unix_ns,
            taken_mono_ns,
            driver_version: status.driver_version.clone(),
            nvml_version: status.nvml_version.clone(),
            cuda_driver_version: status.cuda_driver_version,
            devices,
            missing,
            cost_ns: started.elapsed().as_nanos() as u64,
        }
    }
}

/// Why NVML must not be initialised: `<proc_root>/driver/nvidia`, which the loaded driver makes, is
/// missing. Only NotFound counts: another error (EACCES on a restricted procfs) proves nothing.
fn driver_absent(proc_root: &Path) -> Option<NvmlOpenError> {
    let proc_dir = proc_root.join("driver/nvidia");
    let missing = matches!(proc_dir.symlink_metadata(), Err(e) if e.kind() == std::io::ErrorKind::NotFound);
    missing.then_some(NvmlOpenError::DriverAbsent { proc_dir })
}

/// The path of the library nvml-wrapper loaded, from the address of one of its functions.
fn loaded_path(nvml: &Nvml) -> Option<PathBuf> {
    let init = nvml.lib().nvmlInit_v2.as_ref().ok()?;
    // SAFETY: Dl_info is plain C data (pointers and integers); all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the address; dli_fname points into the loader's own data.
    if unsafe { libc::dladdr(*init as *const c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr succeeded and dli_fname is not null: it points at the loader's NUL-terminated
    // copy of the object's path, which lives as long as the library stays loaded (nvml holds it).
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name.to_bytes())))
}

/// A short, stable label for an NVML error (counters, metric labels).
pub fn reason_label(e: &NvmlError) -> &'static str {
    match e {
        NvmlError::NotSupported => "not_supported",
        NvmlError::GpuLost => "gpu_lost",
        NvmlError::NoPermission => "no_permission",
        NvmlError::FailedToLoadSymbol(_) => "symbol_missing",
        NvmlError::Uninitialized => "uninitialized",
        NvmlError::InvalidArg => "invalid_argument",
        NvmlError::NotFound => "not_found",
        NvmlError::InsufficientSize(_) => "insufficient_size",
        NvmlError::DriverNotLoaded => "driver_not_loaded",
        NvmlError::ResetRequired => "reset_required",
        NvmlError::Timeout => "timeout",
        NvmlError::Unknown => "unknown",
        _ => "other",
    }
}

/// The error as `Missing::reason` text: the variant name, e.g. `NotSupported`, `GpuLost`,
/// `FailedToLoadSymbol(…)`.
fn reason_text(e: &NvmlError) -> String {
    match e {
        NvmlError::FailedToLoadSymbol(s) => format!("FailedToLoadSymbol({s})"),
        NvmlError::LibloadingError(err) => format!("LibloadingError({err})"),
        other => format!("{other:?}"),
    }
}

struct Failures<'a> {
    counts: &'a mut BTreeMap<&'static str, u64>,
}

impl Failures<'_> {
    fn record(&mut self, missing: &mut Vec<Missing>, what: &str, e: &NvmlError) {
        *self.counts.entry(reason_label(e)).or_default() += 1;
        missing.push(Missing { what: what.into(), reason: reason_text(e) });
    }
}

/// Reads one device's values in turn; after GpuLost the rest are skipped (the device is gone).
struct Reader<'f, 'a> {
    failures: &'f mut Failures<'a>,
    missing: Vec<Missing>,
    lost: bool,
}

impl Reader<'_, '_> {
    fn read<T>(&mut self, what: &str, r: impl FnOnce() -> Result<T, NvmlError>) -> Option<T> {
        if self.lost {
            return None;
        }
        match r() {
            Ok(v) => Some(v),
            Err(e) => {
                self.lost |= matches!(e, NvmlError::GpuLost);
                self.failures.record(&mut self.missing, what, &e);
                None
            }
        }
    }
}

fn sample_device(
    nvml: &Nvml,
    index: u32,
    last_seen_us: &mut HashMap<String, u64>,
    known_uuids: &mut HashMap<u32, String>,
    failures: &mut Failures,
) -> DeviceSample {
    let mut r = Reader { failures, missing: Vec::new(), lost: false };
    let mut s =
        DeviceSample { index, uuid: known_uuids.get(&index).cloned().unwrap_or_default(), ..Default::default() };
    let Some(device) = r.read("device", || nvml.device_by_index(index)) else {
        s.lost = r.lost;
        s.missing = r.missing;
        return s;
    };
    if let Some(uuid) = r.read("uuid", || device.uuid()) {
        known_uuids.insert(index, uuid.clone());
        s.uuid = uuid;
    }
    s.name = r.read("name", || device.name());
    s.minor = r.read("minor", || device.minor_number());
    s.pci_bus_id = r.read("pci_info", || device.pci_info()).map(|p| p.bus_id);
    s.memory = r.read("memory", || device.memory_info()).map(|m| MemoryInfo {
        total: m.total,
        reserved: m.reserved,
        free: m.free,
        used: m.used,
    });
    s.utilization = r
        .read("utilization", || device.utilization_rates())
        .map(|u| Utilization { gpu_pct: u.gpu, memory_pct: u.memory });
    s.power_mw = r.read("power", || device.power_usage());
    s.energy_mj = r.read("energy", || device.total_energy_consumption());
    s.clocks = Clocks {
        graphics_mhz: r.read("clock_graphics", || device.clock_info(Clock::Graphics)),
        sm_mhz: r.read("clock_sm", || device.clock_info(Clock::SM)),
        memory_mhz: r.read("clock_memory", || device.clock_info(Clock::Memory)),
    };
    s.temperature_c = r.read("temperature", || device.temperature(TemperatureSensor::Gpu));
    s.compute_mode = r.read("compute_mode", || device.compute_mode()).map(|m| match m {
        NvComputeMode::Default => ComputeMode::Default,
        NvComputeMode::ExclusiveThread => ComputeMode::ExclusiveThread,
        NvComputeMode::Prohibited => ComputeMode::Prohibited,
        NvComputeMode::ExclusiveProcess => ComputeMode::ExclusiveProcess,
    });
    s.mig_enabled = r.read("mig_mode", || device.mig_mode()).map(|m| m.current != 0);
    s.processes = read_processes(&mut r, &device);
    s.process_utilization = read_process_utilization(&mut r, &device, &s.uuid, index, last_seen_us);
    if s.mig_enabled == Some(true) {
        s.mig_instances = read_mig_instances(&mut r, nvml, &device);
    }
    s.lost = r.lost;
    s.missing = r.missing;
    s
}

/// Compute, graphics and MPS lists merged by PID (sorted), with a flag per list. A process listed
/// twice reports its whole usage in each list, so the largest known value is kept, not the sum.
fn read_processes(r: &mut Reader, device: &Device) -> Vec<GpuProcess> {
    let mut by_pid: BTreeMap<u32, GpuProcess> = BTreeMap::new();
    let mut merge = |list: Option<Vec<ProcessInfo>>, mark: fn(&mut GpuProcess)| {
        for p in list.into_iter().flatten() {
            let entry = by_pid.entry(p.pid).or_insert_with(|| GpuProcess {
                pid: p.pid,
                gpu_instance_id: p.gpu_instance_id,
                compute_instance_id: p.compute_instance_id,
                ..Default::default()
            });
            if let UsedGpuMemory::Used(bytes) = p.used_gpu_memory {
                entry.used_bytes = Some(entry.used_bytes.map_or(bytes, |b| b.max(bytes)));
            }
            mark(entry);
        }
    };
    merge(r.read("compute_processes", || device.running_compute_processes()), |p| p.compute = true);
    merge(r.read("graphics_processes", || device.running_graphics_processes()), |p| p.graphics = true);
    merge(r.read("mps_processes", || device.mps_running_compute_processes()), |p| p.mps = true);
    by_pid.into_values().collect()
}

/// Samples newer than the last one returned for this device; NotFound means none are new.
fn read_process_utilization(
    r: &mut Reader,
    device: &Device,
    uuid: &str,
    index: u32,
    last_seen_us: &mut HashMap<String, u64>,
) -> Vec<ProcessUtilization> {
    let key = if uuid.is_empty() { format!("index:{index}") } else { uuid.to_string() };
    let last = last_seen_us.get(&key).copied().unwrap_or(0);
    let samples = r
        .read("process_utilization", || match device.process_utilization_stats(last) {
            Err(NvmlError::NotFound) => Ok(Vec::new()),
            other => other,
        })
        .unwrap_or_default();
    // Filtered again: a sample at or before `last` was already returned.
    let out: Vec<ProcessUtilization> = samples
        .into_iter()
        .filter(|s| s.timestamp > last)
        .map(|s| ProcessUtilization {
            pid: s.pid,
            timestamp_us: s.timestamp,
            sm_pct: s.sm_util,
            mem_pct: s.mem_util,
            enc_pct: s.enc_util,
            dec_pct: s.dec_util,
        })
        .collect();
    if let Some(newest) = out.iter().map(|s| s.timestamp_us).max() {
        last_seen_us.insert(key, newest);
    }
    out
}

fn read_mig_instances(r: &mut Reader, nvml: &Nvml, device: &Device) -> Vec<MigInstance> {
    let Some(slots) = r.read("mig_device_count", || device.mig_device_count()) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for index in 0..slots {
        // NotFound: an empty slot.
        let mig = match r.read("mig_device", || match device.mig_device_by_index(index) {
            Err(NvmlError::NotFound) => Ok(None),
            other => other.map(Some),
        }) {
            Some(Some(mig)) => mig,
            Some(None) => continue,
            None if r.lost => break,
            None => continue,
        };
        let mut m = Reader { failures: &mut *r.failures, missing: Vec::new(), lost: false };
        let instance = MigInstance {
            index,
            uuid: m.read("uuid", || mig.uuid()).unwrap_or_default(),
            gpu_instance_id: m.read("gpu_instance_id", || instance_id(nvml, &mig, InstanceId::Gpu)),
            compute_instance_id: m.read("compute_instance_id", || instance_id(nvml, &mig, InstanceId::Compute)),
            name: m.read("name", || mig.name()),
            memory: m.read("memory", || mig.memory_info()).map(|v| MemoryInfo {
                total: v.total,
                reserved: v.reserved,
                free: v.free,
                used: v.used,
            }),
            processes: read_processes(&mut m, &mig),
            missing: Vec::new(),
        };
        let lost = m.lost;
        out.push(MigInstance { missing: m.missing, ..instance });
        if lost {
            r.lost = true;
            break;
        }
    }
    out
}

enum InstanceId {
    Gpu,
    Compute,
}

/// nvmlDeviceGetGpuInstanceId / nvmlDeviceGetComputeInstanceId, which nvml-wrapper does not wrap.
/// The symbol is taken from the loaded table (never the panicking raw method), so an old library
/// gives `FailedToLoadSymbol`.
fn instance_id(nvml: &Nvml, device: &Device, which: InstanceId) -> Result<u32, NvmlError> {
    let lib = nvml.lib();
    let sym = match which {
        InstanceId::Gpu => lib.nvmlDeviceGetGpuInstanceId.as_ref(),
        InstanceId::Compute => lib.nvmlDeviceGetComputeInstanceId.as_ref(),
    }
    .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let mut id = 0u32;
    // SAFETY: the handle comes from this library; the function writes one unsigned int.
    let rc = unsafe { sym(device.handle(), &mut id) };
    nvml_wrapper::error::nvml_try(rc).map(|()| id)
}

#[cfg(test)]
mod tests {
    /// Every reason this sampler names is one the snapshot's message knows (else it would be
    /// counted under `other` by clients).
    #[test]
    fn every_reason_label_is_known_to_the_snapshot_message() {
        use nvml_wrapper::error::NvmlError as E;
        let nvml = [
            E::NotSupported,
            E::GpuLost,
            E::NoPermission,
            E::FailedToLoadSymbol("x".into()),
            E::Uninitialized,
            E::InvalidArg,
            E::NotFound,
            E::InsufficientSize(None),
            E::DriverNotLoaded,
            E::ResetRequired,
            E::Timeout,
            E::Unknown,
            E::InUse,
        ];
        for e in &nvml {
            let name = super::reason_label(e);
            assert!(tracer_core::wire::snapshot::NVML_FAILURE_REASONS.contains(&name), "{name}");
        }
    }
}
